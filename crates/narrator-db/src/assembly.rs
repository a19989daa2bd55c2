//! Assembly by the workers: claiming a finished job for one process
//! ([`claim_assembly_for`]), taking over the assemblies of processes that died
//! ([`take_over_assemblies`]), putting an assembly that failed for the moment back to
//! wait ([`postpone_assembly`], [`assembly_attempts`]), and finishing a job with its
//! published outputs ([`finish_with_outputs`], read back by [`job_outputs`]).

use std::time::Duration;

use serde::{Deserialize, Serialize};
use sqlx::types::Json;
use sqlx::{PgExecutor, Row};
use uuid::Uuid;

use crate::error::{DbError, unsigned};
use crate::secs;

/// Moves a finished `running` job to `assembling` for `worker`'s process `instance`
/// (exactly one caller wins). A job whose last assembly failed transiently waits for its
/// retry time.
pub async fn claim_assembly_for(
    exec: impl PgExecutor<'_>,
    job: Uuid,
    worker: &str,
    instance: Uuid,
) -> Result<bool, DbError> {
    let n = sqlx::query(
        "UPDATE jobs SET state = 'assembling', assembler = $2, assembler_instance = $3, \
           assembly_started_at = now() \
         WHERE id = $1 AND state = 'running' AND segments_done = segments_total \
           AND (assembly_retry_at IS NULL OR assembly_retry_at <= now())",
    )
    .bind(job)
    .bind(worker)
    .bind(instance)
    .execute(exec)
    .await?
    .rows_affected();
    Ok(n > 0)
}

/// Jobs `worker` (process `instance`) takes over: finished but never claimed (the
/// recording worker died between its record and its claim, or the last assembly failed
/// transiently and its retry time has come), or assembling by a process that is gone:
/// its worker row is older than that worker's own `stale_after` (`stale`, the caller's,
/// for rows that do not say), or names another instance (the worker was
/// restarted under the same id, so the claimer is dead even though the id is alive).
/// One statement; each job goes to one caller.
pub async fn take_over_assemblies(
    exec: impl PgExecutor<'_>,
    worker: &str,
    instance: Uuid,
    stale: Duration,
) -> Result<Vec<Uuid>, DbError> {
    let rows = sqlx::query(
        "UPDATE jobs j SET state = 'assembling', assembler = $1, assembler_instance = $3, \
           assembly_started_at = now() \
         WHERE j.id IN ( \
           SELECT id FROM jobs WHERE \
             (state = 'running' AND segments_done = segments_total \
              AND (assembly_retry_at IS NULL OR assembly_retry_at <= now())) \
             OR (state = 'assembling' AND NOT EXISTS ( \
                   SELECT 1 FROM workers w WHERE w.id = jobs.assembler \
                     AND w.last_seen > now() - make_interval(secs => coalesce(w.stale_after_s, $2)) \
                     AND (jobs.assembler_instance IS NULL OR w.instance IS NULL \
                          OR w.instance = jobs.assembler_instance)) \
                 AND (assembly_started_at < now() - make_interval(secs => coalesce( \
                        (SELECT w.stale_after_s FROM workers w WHERE w.id = jobs.assembler), $2)) \
                      OR EXISTS (SELECT 1 FROM workers w WHERE w.id = jobs.assembler \
                                 AND w.instance IS DISTINCT FROM jobs.assembler_instance))) \
           FOR UPDATE SKIP LOCKED) \
         RETURNING j.id",
    )
    .bind(worker)
    .bind(secs(stale))
    .bind(instance)
    .fetch_all(exec)
    .await?;
    rows.iter()
        .map(|r| r.try_get("id").map_err(DbError::from))
        .collect()
}

/// Puts a job whose assembly failed for the moment (the database or the store away, a
/// full temp disk, a transient error) back to wait: `running` with every segment done,
/// unclaimed, retried by a worker's sweep after `after`. `charged`: the failure counts
/// as one of the job's assembly attempts (a transient error of the job's own; an outage
/// or a wedged worker is not the job's, and does not). `false` if it was no longer
/// assembling.
pub async fn postpone_assembly(
    exec: impl PgExecutor<'_>,
    job: Uuid,
    error: &str,
    after: Duration,
    charged: bool,
) -> Result<bool, DbError> {
    let n = sqlx::query(
        "UPDATE jobs SET state = 'running', assembler = NULL, assembler_instance = NULL, \
           assembly_started_at = NULL, assembly_attempts = assembly_attempts + $4::int, \
           assembly_error = $2, assembly_retry_at = now() + make_interval(secs => $3) \
         WHERE id = $1 AND state = 'assembling'",
    )
    .bind(job)
    .bind(error)
    .bind(secs(after))
    .bind(i32::from(charged))
    .execute(exec)
    .await?
    .rows_affected();
    Ok(n > 0)
}

/// Assembly tries of a job that ended in a transient failure so far.
pub async fn assembly_attempts(exec: impl PgExecutor<'_>, job: Uuid) -> Result<u32, DbError> {
    let n: i32 = sqlx::query_scalar("SELECT assembly_attempts FROM jobs WHERE id = $1")
        .bind(job)
        .fetch_optional(exec)
        .await?
        .ok_or(DbError::JobNotFound(job))?;
    unsigned("assembly_attempts", i64::from(n))
}

/// One published output of a job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Output {
    /// Object key in the bucket.
    pub key: String,
    /// `book`, `chapter` or `manifest`.
    pub kind: String,
    /// File name.
    pub name: String,
    /// Duration (0 for the manifest).
    pub seconds: f64,
    /// Size in bytes.
    pub bytes: u64,
}

/// Marks an assembling job done with its outputs; `book_seconds` becomes its
/// `audio_seconds`. `false` if it was not assembling (cancelled meanwhile, or done by
/// another assembler).
pub async fn finish_with_outputs(
    exec: impl PgExecutor<'_>,
    job: Uuid,
    book_seconds: f64,
    outputs: &[Output],
) -> Result<bool, DbError> {
    let n = sqlx::query(
        "UPDATE jobs SET state = 'done', finished_at = now(), audio_seconds = $2, outputs = $3 \
         WHERE id = $1 AND state = 'assembling'",
    )
    .bind(job)
    .bind(book_seconds)
    .bind(Json(outputs))
    .execute(exec)
    .await?
    .rows_affected();
    Ok(n > 0)
}

/// A job's published outputs (empty until it is done).
pub async fn job_outputs(exec: impl PgExecutor<'_>, job: Uuid) -> Result<Vec<Output>, DbError> {
    let row = sqlx::query("SELECT outputs FROM jobs WHERE id = $1")
        .bind(job)
        .fetch_optional(exec)
        .await?
        .ok_or(DbError::JobNotFound(job))?;
    let Json(outputs): Json<Vec<Output>> = row.try_get("outputs")?;
    Ok(outputs)
}

/// Of `jobs`, the one of highest priority (the oldest among equals); `None` when none
/// exists.
pub async fn highest_priority(
    exec: impl PgExecutor<'_>,
    jobs: &[Uuid],
) -> Result<Option<Uuid>, DbError> {
    Ok(sqlx::query_scalar(
        "SELECT id FROM jobs WHERE id = ANY($1) ORDER BY priority DESC, created_at, id LIMIT 1",
    )
    .bind(jobs)
    .fetch_optional(exec)
    .await?)
}
