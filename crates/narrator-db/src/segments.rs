//! Segments: recording finished ones exactly once, failed ones, reading the finished
//! records back, and the outbox (which segments the broker has confirmed).
//!
//! [`record_segment`] is one statement: a data-modifying CTE updates the segment only if
//! it is not done yet and, only when it did, adds it to the job's counters. Under
//! concurrent redelivery the second caller waits on the segment's row lock, re-checks
//! `state <> 'done'` against the committed row, and changes nothing.

use std::time::Duration;

use narrator_core::{Segment, SegmentRecord};
use sqlx::postgres::PgRow;
use sqlx::{PgExecutor, PgPool, Row};
use uuid::Uuid;

use crate::error::{DbError, int4, int8, unsigned};
use crate::secs;

/// What recording a segment did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordOutcome {
    /// This call marked the segment done (`false`: it already was; nothing changed).
    pub newly_done: bool,
    /// Every segment of the job is done. Also `true` for a redelivered last segment, so a
    /// worker that died between recording and assembling is replaced; [`crate::claim_assembly`]
    /// decides who assembles.
    pub job_complete: bool,
}

/// Records a finished segment's figures. Idempotent: a second record of the same segment
/// changes nothing and returns `newly_done: false`. The first record of a job moves it
/// from `queued` to `running`.
pub async fn record_segment(
    pool: &PgPool,
    job: Uuid,
    r: &SegmentRecord,
) -> Result<RecordOutcome, DbError> {
    let row = sqlx::query(
        "WITH seg AS ( \
           UPDATE segments SET state = 'done', samples = $3, sample_rate = $4, \
             audio_seconds = $5, inference_seconds = $6, queue_wait_seconds = $7, \
             batch_size = $8, attempts = $9, worker = $10, phoneme_ids = $11, \
             done_at = now(), failure_kind = NULL, failure_reason = NULL \
           WHERE job_id = $1 AND idx = $2 AND state <> 'done' \
           RETURNING audio_seconds, inference_seconds) \
         UPDATE jobs j SET segments_done = j.segments_done + 1, \
           audio_seconds = j.audio_seconds + seg.audio_seconds, \
           speech_seconds = j.speech_seconds + seg.audio_seconds, \
           state = CASE WHEN j.state = 'queued' THEN 'running' ELSE j.state END, \
           started_at = coalesce(j.started_at, now() - make_interval(secs => seg.inference_seconds)) \
         FROM seg WHERE j.id = $1 \
         RETURNING j.segments_done = j.segments_total AS complete",
    )
    .bind(job)
    .bind(int4("segment index", r.index)?)
    .bind(int8("samples", r.samples)?)
    .bind(int4("sample rate", r.sample_rate)?)
    .bind(r.audio_seconds)
    .bind(r.inference_seconds)
    .bind(r.queue_wait_seconds)
    .bind(int4("batch size", r.batch_size)?)
    .bind(int4("attempts", r.attempts)?)
    .bind(&r.worker)
    .bind(int4("phoneme ids", r.phoneme_ids)?)
    .fetch_optional(pool)
    .await
    .map_err(|e| DbError::on_job(job, e))?;
    if let Some(row) = row {
        return Ok(RecordOutcome {
            newly_done: true,
            job_complete: row.try_get("complete")?,
        });
    }
    // Nothing changed: already done, or no such segment.
    let row = sqlx::query(
        "SELECT j.segments_done = j.segments_total AS complete FROM segments s \
         JOIN jobs j ON j.id = s.job_id WHERE s.job_id = $1 AND s.idx = $2",
    )
    .bind(job)
    .bind(int4("segment index", r.index)?)
    .fetch_optional(pool)
    .await?
    .ok_or(DbError::SegmentNotFound {
        job,
        index: r.index,
    })?;
    Ok(RecordOutcome {
        newly_done: false,
        job_complete: row.try_get("complete")?,
    })
}

/// Records that a segment failed for good (dead-lettered); a segment already done stays
/// done. Returns whether it changed.
pub async fn fail_segment(
    exec: impl PgExecutor<'_>,
    job: Uuid,
    index: u32,
    attempts: u32,
    kind: &str,
    reason: &str,
) -> Result<bool, DbError> {
    let n = sqlx::query(
        "UPDATE segments SET state = 'failed', attempts = $3, failure_kind = $4, \
         failure_reason = $5 WHERE job_id = $1 AND idx = $2 AND state <> 'done'",
    )
    .bind(job)
    .bind(int4("segment index", index)?)
    .bind(int4("attempts", attempts)?)
    .bind(kind)
    .bind(reason)
    .execute(exec)
    .await
    .map_err(|e| DbError::on_job(job, e))?
    .rows_affected();
    Ok(n > 0)
}

fn record(row: &PgRow) -> Result<SegmentRecord, DbError> {
    let u32_of = |col: &'static str| -> Result<u32, DbError> {
        unsigned(col, i64::from(row.try_get::<i32, _>(col)?))
    };
    Ok(SegmentRecord {
        index: u32_of("idx")?,
        samples: unsigned("samples", row.try_get("samples")?)?,
        sample_rate: u32_of("sample_rate")?,
        audio_seconds: row.try_get("audio_seconds")?,
        inference_seconds: row.try_get("inference_seconds")?,
        queue_wait_seconds: row.try_get("queue_wait_seconds")?,
        batch_size: u32_of("batch_size")?,
        attempts: u32_of("attempts")?,
        worker: row.try_get("worker")?,
        phoneme_ids: u32_of("phoneme_ids")?,
    })
}

/// The job's finished segments' records, by index.
pub async fn finished_segments(
    exec: impl PgExecutor<'_>,
    job: Uuid,
) -> Result<Vec<SegmentRecord>, DbError> {
    sqlx::query(
        "SELECT idx, samples, sample_rate, audio_seconds, inference_seconds, \
         queue_wait_seconds, batch_size, attempts, worker, phoneme_ids \
         FROM segments WHERE job_id = $1 AND state = 'done' ORDER BY idx",
    )
    .bind(job)
    .fetch_all(exec)
    .await?
    .iter()
    .map(record)
    .collect()
}

/// Marks segments as confirmed by the broker; returns how many were unpublished before.
pub async fn mark_published(
    exec: impl PgExecutor<'_>,
    job: Uuid,
    indices: &[u32],
) -> Result<u64, DbError> {
    let idx = indices
        .iter()
        .map(|&i| int4("segment index", i))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(sqlx::query(
        "UPDATE segments SET published_at = now() \
         WHERE job_id = $1 AND idx = ANY($2) AND published_at IS NULL",
    )
    .bind(job)
    .bind(&idx)
    .execute(exec)
    .await?
    .rows_affected())
}

/// For the outbox reconciler: pending segments never confirmed published, of jobs still
/// queued or running that were submitted more than `older_than` ago (leaving the producer
/// time to publish them itself), oldest job first, at most `limit`.
pub async fn unpublished(
    exec: impl PgExecutor<'_>,
    older_than: Duration,
    limit: u32,
) -> Result<Vec<(Uuid, Segment)>, DbError> {
    sqlx::query(
        "SELECT s.job_id, s.idx, s.chapter, s.text, s.pause_after \
         FROM segments s JOIN jobs j ON j.id = s.job_id \
         WHERE s.published_at IS NULL AND s.state = 'pending' \
           AND j.state IN ('queued', 'running') \
           AND j.created_at <= now() - make_interval(secs => $1) \
         ORDER BY j.created_at, s.job_id, s.idx LIMIT $2",
    )
    .bind(secs(older_than))
    .bind(i64::from(limit))
    .fetch_all(exec)
    .await?
    .iter()
    .map(|row| Ok((row.try_get("job_id")?, crate::cluster::segment_row(row)?)))
    .collect()
}
