//! The events outbox (docs/PRODUCERS.md): a trigger writes a row to `job_events` in the
//! transaction that changes a job's state (migration 20261215000100), and workers
//! publish the rows ([`claim_events`], then [`mark_events_published`] in the same
//! transaction, after the broker confirmed them). Nothing here builds the message: the
//! worker does, from [`PendingEvent`].

use sqlx::types::Json;
use sqlx::{PgConnection, Row};
use uuid::Uuid;

use crate::assembly::Output;
use crate::error::DbError;

/// An event to publish, with the job as it is now.
#[derive(Debug, Clone, PartialEq)]
pub struct PendingEvent {
    /// The event's own id (consumers dedupe by it).
    pub id: Uuid,
    /// `queued`, `progress`, `done`, `failed`, `cancelled` or `retried`.
    pub kind: String,
    /// The state the event is about.
    pub state: String,
    /// When the change was committed (the trigger's clock).
    pub at: chrono::DateTime<chrono::Utc>,
    pub job: Uuid,
    /// `None` when the job has been deleted since (pruned): the event is dropped.
    pub details: Option<EventJob>,
}

/// What an event says of its job.
#[derive(Debug, Clone, PartialEq)]
pub struct EventJob {
    pub title: String,
    pub voice: String,
    pub request_key: Option<String>,
    pub request_metadata: Option<serde_json::Value>,
    pub segments_total: i32,
    pub segments_done: i32,
    pub segments_failed: i64,
    pub audio_seconds: f64,
    pub rtf: Option<f64>,
    pub latency_seconds: Option<f64>,
    pub failure_kind: Option<String>,
    pub failure_reason: Option<String>,
    pub outputs: Vec<Output>,
}

/// Up to `limit` unpublished events, oldest first, locked for this transaction (other
/// publishers skip them): publish them, then [`mark_events_published`], then commit.
pub async fn claim_events(
    conn: &mut PgConnection,
    limit: u32,
) -> Result<Vec<PendingEvent>, DbError> {
    let rows = sqlx::query(
        "SELECT e.id, e.kind, e.state, e.created_at, e.job_id, v.id IS NOT NULL AS present, \
           v.title, v.voice, j.request_key, j.request_metadata, v.segments_total, \
           v.segments_done, v.segments_failed, v.audio_seconds, v.rtf, v.latency_seconds, \
           v.failure_kind, v.failure_reason, j.outputs \
         FROM job_events e \
         LEFT JOIN job_status v ON v.id = e.job_id \
         LEFT JOIN jobs j ON j.id = e.job_id \
         WHERE e.published_at IS NULL \
         ORDER BY e.created_at LIMIT $1 FOR UPDATE OF e SKIP LOCKED",
    )
    .bind(i64::from(limit))
    .fetch_all(&mut *conn)
    .await?;
    rows.iter()
        .map(|r| {
            let present: bool = r.try_get("present")?;
            let details = if present {
                let metadata: Option<Json<serde_json::Value>> = r.try_get("request_metadata")?;
                let Json(outputs): Json<Vec<Output>> = r.try_get("outputs")?;
                Some(EventJob {
                    title: r.try_get("title")?,
                    voice: r.try_get("voice")?,
                    request_key: r.try_get("request_key")?,
                    request_metadata: metadata.map(|Json(m)| m),
                    segments_total: r.try_get("segments_total")?,
                    segments_done: r.try_get("segments_done")?,
                    segments_failed: r.try_get("segments_failed")?,
                    audio_seconds: r.try_get("audio_seconds")?,
                    rtf: r.try_get("rtf")?,
                    latency_seconds: r.try_get("latency_seconds")?,
                    failure_kind: r.try_get("failure_kind")?,
                    failure_reason: r.try_get("failure_reason")?,
                    outputs,
                })
            } else {
                None
            };
            Ok(PendingEvent {
                id: r.try_get("id")?,
                kind: r.try_get("kind")?,
                state: r.try_get("state")?,
                at: r.try_get("created_at")?,
                job: r.try_get("job_id")?,
                details,
            })
        })
        .collect()
}

/// Marks events published (in the transaction that claimed them).
pub async fn mark_events_published(conn: &mut PgConnection, ids: &[Uuid]) -> Result<(), DbError> {
    sqlx::query("UPDATE job_events SET published_at = clock_timestamp() WHERE id = ANY($1)")
        .bind(ids)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// Deletes events published more than `older_than` ago; returns how many.
pub async fn prune_published_events(
    exec: impl sqlx::PgExecutor<'_>,
    older_than: std::time::Duration,
) -> Result<u64, DbError> {
    Ok(sqlx::query(
        "DELETE FROM job_events WHERE published_at IS NOT NULL \
           AND published_at < now() - make_interval(secs => $1)",
    )
    .bind(older_than.as_secs_f64())
    .execute(exec)
    .await?
    .rows_affected())
}

/// Writes a `progress` event to the outbox for each running job whose finished segments
/// moved since its last one, and not more often than `every` per job; returns how many.
/// Run by every publisher: the update that notes the count takes each job once (rows a
/// recording is updating are skipped until the next look).
pub async fn note_progress(
    exec: impl sqlx::PgExecutor<'_>,
    every: std::time::Duration,
) -> Result<u64, DbError> {
    Ok(sqlx::query(
        "WITH due AS ( \
           SELECT id FROM jobs \
           WHERE state = 'running' AND segments_done > progress_noted_done \
             AND (progress_noted_at IS NULL \
                  OR progress_noted_at < clock_timestamp() - make_interval(secs => $1)) \
           FOR UPDATE SKIP LOCKED), \
         noted AS ( \
           UPDATE jobs j SET progress_noted_done = j.segments_done, \
             progress_noted_at = clock_timestamp() \
           FROM due WHERE j.id = due.id RETURNING j.id, j.state) \
         INSERT INTO job_events (id, job_id, kind, state) \
         SELECT gen_random_uuid(), id, 'progress', state FROM noted",
    )
    .bind(every.as_secs_f64())
    .execute(exec)
    .await?
    .rows_affected())
}
