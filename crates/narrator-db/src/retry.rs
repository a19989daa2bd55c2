//! Failed jobs: putting one back to work (`narrator retry`, [`retry_job`]), and ending a
//! job `failed` once its segments are all settled with some failed
//! ([`fail_settled_jobs`]).

use narrator_core::Segment;
use sqlx::{PgExecutor, PgPool, Row};
use uuid::Uuid;

use crate::error::DbError;
use crate::jobs::JobState;
use crate::segments::segment_row;

/// Why a job cannot be retried.
#[derive(Debug, Clone, PartialEq)]
pub enum RetryOutcome {
    /// Put back to work; these segments must be published again.
    Retried(Vec<Segment>),
    /// Only failed jobs can be retried; it is in this state.
    NotFailed(JobState),
    /// `narrator jobs prune` has claimed it ([`crate::claim_prune`]): its audio may be
    /// deleted already, so it cannot be retried (it is about to leave the database).
    Pruning,
}

/// Puts a failed job back to work: its failed segments become pending and unpublished
/// with a whole new budget, whatever failed them (attempts, engine crashes, returns and
/// rescues back to 0; the job's rescues too), the job `running` (or `queued` if nothing
/// was done). The caller
/// dispatches them ([`crate::claim_dispatch`], a window at a time); should it die first,
/// the reconciler does. A job whose segments are all done goes back to `running`, and a
/// worker's sweep assembles it. A job claimed for pruning is refused
/// ([`RetryOutcome::Pruning`]); the row lock orders a retry and a claim, so a job is
/// either retried before the prune claims it (and the prune leaves it) or not at all.
pub async fn retry_job(pool: &PgPool, job: Uuid) -> Result<RetryOutcome, DbError> {
    let mut tx = pool.begin().await?;
    let row = sqlx::query(
        "SELECT state, pruning_at IS NOT NULL AS pruning FROM jobs WHERE id = $1 FOR UPDATE",
    )
    .bind(job)
    .fetch_optional(&mut *tx)
    .await?
    .ok_or(DbError::JobNotFound(job))?;
    if row.try_get::<bool, _>("pruning")? {
        return Ok(RetryOutcome::Pruning);
    }
    let state = JobState::parse(&row.try_get::<String, _>("state")?)?;
    if state != JobState::Failed {
        return Ok(RetryOutcome::NotFailed(state));
    }
    let rows = sqlx::query(
        "UPDATE segments SET state = 'pending', attempts = 0, published_at = NULL, \
         failure_kind = NULL, failure_reason = NULL, engine_crashes = 0, returns = 0, \
         rescues = 0, engine_by = NULL \
         WHERE job_id = $1 AND state <> 'done' \
         RETURNING idx, chapter, text, pause_after, speaker",
    )
    .bind(job)
    .fetch_all(&mut *tx)
    .await?;
    // The failed segments are unpublished again, below where the claims had reached:
    // the dispatch front goes back to the first segment (no row: 0).
    sqlx::query("DELETE FROM job_dispatch WHERE job_id = $1")
        .bind(job)
        .execute(&mut *tx)
        .await?;
    sqlx::query(
        "UPDATE jobs SET state = CASE WHEN segments_done > 0 THEN 'running' ELSE 'queued' END, \
         finished_at = NULL, failure_kind = NULL, failure_reason = NULL, assembler = NULL, \
         assembler_instance = NULL, assembly_started_at = NULL, assembly_attempts = 0, \
         assembly_retry_at = NULL, assembly_error = NULL, rescued_at = NULL, rescues = 0, \
         progress_at = now() WHERE id = $1",
    )
    .bind(job)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    let mut segments = rows
        .iter()
        .map(segment_row)
        .collect::<Result<Vec<_>, DbError>>()?;
    segments.sort_by_key(|s| s.index);
    Ok(RetryOutcome::Retried(segments))
}

/// Ends every unfinished job whose segments are all settled (done or failed) with at
/// least one failed: `failed`, with a reason naming how many and the first. A failed
/// segment does not stop its job's other segments; the job fails once they are done,
/// so `narrator retry` only has the failed ones left to do. Returns the jobs it ended.
pub async fn fail_settled_jobs(exec: impl PgExecutor<'_>) -> Result<Vec<Uuid>, DbError> {
    // The counters on the job row find the settled jobs among the unfinished ones
    // (jobs_unfinished_idx); the first failed segment comes from segments_failed_idx.
    let rows = sqlx::query(
        "UPDATE jobs j SET state = 'failed', finished_at = now(), failure_kind = 'segment_failed', \
           failure_reason = ( \
             SELECT format('%s of %s segments failed (first: segment %s: %s); fix the cause, \
                            then run `narrator retry %s`', \
                           j.segments_failed, j.segments_total, s.idx, s.failure_reason, j.id) \
             FROM segments s WHERE s.job_id = j.id AND s.state = 'failed' ORDER BY s.idx LIMIT 1) \
         WHERE j.state IN ('queued', 'running') AND j.segments_failed > 0 \
           AND j.segments_done + j.segments_failed = j.segments_total \
         RETURNING j.id",
    )
    .fetch_all(exec)
    .await?;
    rows.iter()
        .map(|r| r.try_get("id").map_err(DbError::from))
        .collect()
}
