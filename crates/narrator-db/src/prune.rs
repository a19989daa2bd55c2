//! Pruning finished jobs (`narrator jobs prune`): their rows (the job, its segments and
//! resources) leave the database, so that what the database holds, and what its periodic
//! work reads, does not grow with every book ever made.
//!
//! Also the release of a cancelled job's objects in the store, which a worker's sweep
//! does once the work in flight on it is over ([`cancelled_unreleased`], then
//! [`storage_released`]); its rows stay until it is pruned.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::{PgExecutor, Row};
use uuid::Uuid;

use crate::error::{DbError, unsigned};
use crate::jobs::JobState;
use crate::secs;

/// A job old enough to prune.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PrunableJob {
    /// The job.
    pub job_id: Uuid,
    /// How it ended: done, failed or cancelled.
    pub state: JobState,
    /// Its segments (rows deleted with it).
    pub segments_total: u32,
    /// When it ended.
    pub finished_at: DateTime<Utc>,
    /// Its title.
    pub title: String,
}

/// Jobs that ended (done, failed or cancelled) more than `older_than` ago, oldest first,
/// at most `limit` (the ended jobs are found through `finished_at`, not by reading every
/// job).
pub async fn prunable_jobs(
    exec: impl PgExecutor<'_>,
    older_than: Duration,
    limit: u32,
) -> Result<Vec<PrunableJob>, DbError> {
    sqlx::query(
        "SELECT id, state, segments_total, finished_at, title FROM jobs \
         WHERE finished_at < now() - make_interval(secs => $1) \
           AND state IN ('done', 'failed', 'cancelled') \
         ORDER BY finished_at, id LIMIT $2",
    )
    .bind(secs(older_than))
    .bind(i64::from(limit))
    .fetch_all(exec)
    .await?
    .iter()
    .map(|row| {
        Ok(PrunableJob {
            job_id: row.try_get("id")?,
            state: JobState::parse(&row.try_get::<String, _>("state")?)?,
            segments_total: unsigned(
                "segments_total",
                row.try_get::<i32, _>("segments_total")?.into(),
            )?,
            finished_at: row.try_get("finished_at")?,
            title: row.try_get("title")?,
        })
    })
    .collect()
}

/// Claims an ended job for pruning, before its objects are deleted: marks it
/// (`pruning_at`) in the statement that checks it has ended, so [`crate::retry_job`], which
/// locks the same row, either ran first (the job is running again: `false`, prune nothing
/// of it) or refuses it from now on ([`crate::RetryOutcome::Pruning`]). Claiming a claimed
/// job again is `true` (a prune that died after its claim is finished by the next).
/// `false`: no such job, or it has not ended.
pub async fn claim_prune(exec: impl PgExecutor<'_>, job: Uuid) -> Result<bool, DbError> {
    let n = sqlx::query(
        "UPDATE jobs SET pruning_at = coalesce(pruning_at, now()) \
         WHERE id = $1 AND state IN ('done', 'failed', 'cancelled')",
    )
    .bind(job)
    .execute(exec)
    .await?
    .rows_affected();
    Ok(n > 0)
}

/// Deletes the rows (its segments and resources go with it) of an ended job claimed with
/// [`claim_prune`], whose objects are deleted. `false`: no such job, or it has not ended or
/// was not claimed: nothing deleted.
pub async fn delete_ended_job(exec: impl PgExecutor<'_>, job: Uuid) -> Result<bool, DbError> {
    let n = sqlx::query(
        "DELETE FROM jobs WHERE id = $1 AND state IN ('done', 'failed', 'cancelled') \
         AND pruning_at IS NOT NULL",
    )
    .bind(job)
    .execute(exec)
    .await?
    .rows_affected();
    Ok(n > 0)
}

/// Cancelled jobs whose objects are still in the store, cancelled more than `grace`
/// ago (work in flight on them when they were cancelled is over), oldest first, at most
/// `limit`. Delete their objects, then [`storage_released`].
pub async fn cancelled_unreleased(
    exec: impl PgExecutor<'_>,
    grace: Duration,
    limit: i64,
) -> Result<Vec<Uuid>, DbError> {
    Ok(sqlx::query_scalar(
        "SELECT id FROM jobs WHERE state = 'cancelled' AND storage_released_at IS NULL \
           AND finished_at < now() - make_interval(secs => $1) \
         ORDER BY finished_at LIMIT $2",
    )
    .bind(secs(grace))
    .bind(limit)
    .fetch_all(exec)
    .await?)
}

/// Records that a cancelled job's objects were deleted.
pub async fn storage_released(exec: impl PgExecutor<'_>, job: Uuid) -> Result<(), DbError> {
    sqlx::query("UPDATE jobs SET storage_released_at = now() WHERE id = $1")
        .bind(job)
        .execute(exec)
        .await?;
    Ok(())
}
