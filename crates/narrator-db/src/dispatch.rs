//! Fair share between books: a job's segments are not all published at submission. Each
//! job keeps a *window* of segments published (ready in its voice's queue or held by a
//! worker); as they are recorded, the worker that recorded them publishes as many more of
//! the same job. The queue then holds every running book's next segments side by side,
//! so books submitted together advance together instead of one after the other, and a
//! book submitted behind a backlog starts within one turn of the queue.
//!
//! The window shares a queue depth between the voice's running jobs: twice what the
//! live workers serving the voice may hold ([`FleetShare::window`]), so a book alone
//! keeps the whole fleet busy, and many books each get a slice of at least
//! [`MIN_DISPATCH_WINDOW`].
//!
//! A claim is one transaction: [`claim_dispatch`] takes the job's claim lock (claims of
//! one job run one after the other, so a window holds however many workers top it up)
//! and locks its next unpublished segments (`FOR UPDATE SKIP LOCKED`), the
//! caller publishes them with confirms and marks them published
//! ([`crate::mark_published`]) before it commits. A claimer that dies before it commits
//! leaves them unpublished for the next claim; one that dies after publishing and before
//! committing makes the next claim publish them twice, which recording absorbs (a
//! redelivery of a done segment is acknowledged without work).

use std::time::Duration;

use narrator_core::{Segment, TraceContext};
use sqlx::{PgConnection, PgExecutor, Row};
use uuid::Uuid;

use crate::error::unsigned;
use crate::{DbError, secs};

/// The smallest window: the segments of one job kept published however many jobs share
/// the voice (a turn of the queue is this many segments of each running book).
pub const MIN_DISPATCH_WINDOW: u32 = 64;

/// Queue depth aimed at per voice, in multiples of what its live workers may hold: as
/// much again ready in the queue as the workers hold, which refills every worker's
/// prefetch once while the recordings' top-ups (milliseconds each) catch up.
const DEPTH_PER_PREFETCH: u64 = 2;

/// A voice's running jobs and what its live workers may hold: what windows are cut from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FleetShare {
    /// The voice.
    pub voice: String,
    /// Its jobs queued or running.
    pub active_jobs: u64,
    /// The prefetch of every live worker serving it, summed.
    pub fleet_prefetch: u64,
}

impl FleetShare {
    /// Segments one of the voice's jobs keeps published: the voice's queue depth
    /// ([`DEPTH_PER_PREFETCH`] × the fleet's prefetch) shared by its running jobs, at
    /// least [`MIN_DISPATCH_WINDOW`].
    pub fn window(&self) -> u32 {
        let depth = DEPTH_PER_PREFETCH.saturating_mul(self.fleet_prefetch);
        let share = depth.div_ceil(self.active_jobs.max(1));
        u32::try_from(share)
            .unwrap_or(u32::MAX)
            .max(MIN_DISPATCH_WINDOW)
    }
}

/// [`FleetShare`] of each of `voices`; workers seen within `seen_within` count.
pub async fn fleet_shares(
    exec: impl PgExecutor<'_>,
    voices: &[String],
    seen_within: Duration,
) -> Result<Vec<FleetShare>, DbError> {
    // Unfinished jobs through their partial index; workers' plans as their heartbeats
    // wrote them (one entry per voice served, with its prefetch).
    let rows: Vec<(String, i64, i64)> = sqlx::query_as(
        "SELECT v.voice, \
           (SELECT count(*) FROM jobs j \
             WHERE j.voice = v.voice AND j.state IN ('queued', 'running')), \
           (SELECT coalesce(sum((p->>'prefetch')::bigint), 0)::bigint \
             FROM workers w CROSS JOIN LATERAL jsonb_array_elements( \
               CASE WHEN jsonb_typeof(w.plan) = 'array' THEN w.plan ELSE '[]' END) p \
             WHERE p->>'voice' = v.voice AND jsonb_typeof(p->'prefetch') = 'number' \
               AND w.last_seen >= now() - make_interval(secs => $2)) \
         FROM unnest($1::text[]) AS v(voice)",
    )
    .bind(voices)
    .bind(secs(seen_within))
    .fetch_all(exec)
    .await?;
    rows.into_iter()
        .map(|(voice, active, prefetch)| {
            Ok(FleetShare {
                voice,
                active_jobs: unsigned("active jobs", active)?,
                fleet_prefetch: unsigned("prefetch", prefetch)?,
            })
        })
        .collect()
}

/// Segments claimed for publishing, with what publishing them needs.
#[derive(Debug, Clone, PartialEq)]
pub struct Claimed {
    /// The job's voice (its queue).
    pub voice: String,
    /// The job's priority (its lane).
    pub priority: i32,
    /// The job's trace, if it was submitted with tracing on.
    pub trace: Option<TraceContext>,
    /// The segments, in index order; empty when the window is full.
    pub segments: Vec<Segment>,
}

/// What a claim may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClaimLimits {
    /// The job's window: the segments it keeps published.
    pub window: u32,
    /// The segment index the claim starts from.
    pub from: u32,
    /// Nothing is claimed while the window has room for fewer than this (unless that is
    /// all the job has left unpublished): workers top up in runs, so the queue holds each
    /// book's segments in runs and a batch spans a few books, not one segment of each.
    pub at_least: u32,
}

impl ClaimLimits {
    /// Whatever fits `window`, from the job's first segment.
    pub fn fill(window: u32) -> Self {
        Self {
            window,
            from: 0,
            at_least: 1,
        }
    }

    /// A worker's top-up after recording segments up to index `recorded`: in runs of
    /// half the window, at most 64.
    pub fn after_recording(window: u32, recorded: u32) -> Self {
        Self {
            window,
            from: recorded,
            at_least: (window / 2).clamp(1, 64),
        }
    }
}

/// Locks the next unpublished segments of `job` from index `limits.from` on that fit its
/// window (the window less the segments published and not finished). Another claim of
/// the same job in progress is waited for (its transaction's end), so the room read
/// counts what it published. `None` when the job is not queued or running. Call it in a
/// transaction, publish what it returns, mark it published, then commit (a transaction
/// that claims one job and then another must take them in one order everywhere).
///
/// `from` lets a caller that knows where the published part of the book ends start
/// there: the outbox index keeps an entry for every segment published since the last
/// vacuum, and a scan from index 0 steps over all of them (the work would grow with the
/// book). A segment below `from` left unpublished (a claim rolled back) is found by a
/// claim from 0, which the reconciler makes.
pub async fn claim_dispatch(
    conn: &mut PgConnection,
    job: Uuid,
    limits: ClaimLimits,
) -> Result<Option<Claimed>, DbError> {
    // One claim of a job at a time: the room is read after the lock, so it counts what
    // the claim before this one published (committed by then). Without it, concurrent
    // claims each read the same room and take that many different segments: a window
    // held workers × room. An advisory lock rather than the job's row, which recordings
    // update: they never wait for a claim's publishing. Released with the transaction.
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(dispatch_lock_key(job))
        .execute(&mut *conn)
        .await?;
    let Some(row) = sqlx::query(
        "SELECT voice, priority, traceparent, tracestate, segments_unpublished::bigint AS left, \
           greatest($2 - (segments_total - segments_done - segments_failed \
             - segments_unpublished), 0)::bigint AS room \
         FROM jobs WHERE id = $1 AND state IN ('queued', 'running')",
    )
    .bind(job)
    .bind(i64::from(limits.window))
    .fetch_optional(&mut *conn)
    .await?
    else {
        return Ok(None);
    };
    let left: i64 = row.try_get("left")?;
    let mut room: i64 = row.try_get("room")?;
    if room < i64::from(limits.at_least).min(left) {
        room = 0;
    }
    let from = limits.from;
    let traceparent: Option<String> = row.try_get("traceparent")?;
    let trace = traceparent.map(|traceparent| TraceContext {
        traceparent,
        tracestate: row.try_get("tracestate").ok().flatten(),
    });
    let segments = if room > 0 {
        // The outbox's partial index, in index order: reads only what it takes. It is on
        // `idx + 0` (migration 20261213000000) so the primary key cannot serve this.
        sqlx::query(
            "SELECT idx, chapter, text, pause_after, speaker FROM segments \
             WHERE job_id = $1 AND idx + 0 >= $3 AND published_at IS NULL \
               AND state = 'pending' \
             ORDER BY idx + 0 LIMIT $2 FOR UPDATE SKIP LOCKED",
        )
        .bind(job)
        .bind(room)
        .bind(crate::error::int4("segment index", from)?)
        .fetch_all(&mut *conn)
        .await?
        .iter()
        .map(crate::cluster::segment_row)
        .collect::<Result<Vec<_>, _>>()?
    } else {
        Vec::new()
    };
    Ok(Some(Claimed {
        voice: row.try_get("voice")?,
        priority: row.try_get("priority")?,
        trace,
        segments,
    }))
}

/// The advisory lock key of `job`'s claims: its id's first 64 bits (a collision of two
/// jobs only serializes their claims).
fn dispatch_lock_key(job: Uuid) -> i64 {
    let b = job.as_u64_pair().0;
    i64::from_ne_bytes(b.to_ne_bytes())
}

/// Jobs of `voices` queued or running with segments still unpublished, submitted at
/// least `older_than` ago (leaving their producer time to publish their first window),
/// oldest first, at most `limit`: what the reconciler tops up to their windows.
pub async fn dispatch_candidates(
    exec: impl PgExecutor<'_>,
    voices: &[String],
    older_than: Duration,
    limit: u32,
) -> Result<Vec<(Uuid, String)>, DbError> {
    Ok(sqlx::query_as(
        "SELECT id, voice FROM jobs \
         WHERE state IN ('queued', 'running') AND segments_unpublished > 0 \
           AND voice = ANY($1) AND created_at <= now() - make_interval(secs => $2) \
         ORDER BY created_at LIMIT $3",
    )
    .bind(voices)
    .bind(secs(older_than))
    .bind(i64::from(limit))
    .fetch_all(exec)
    .await?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn share(active_jobs: u64, fleet_prefetch: u64) -> FleetShare {
        FleetShare {
            voice: "v".into(),
            active_jobs,
            fleet_prefetch,
        }
    }

    #[test]
    fn one_book_gets_the_whole_depth_and_many_share_it_down_to_the_floor() {
        // 4 workers holding 129 each: a book alone may have 2 × 516 published.
        assert_eq!(share(1, 516).window(), 1032);
        assert_eq!(share(4, 516).window(), 258);
        // 50 books: 21 each would be under the floor.
        assert_eq!(share(50, 516).window(), MIN_DISPATCH_WINDOW);
        // No live worker yet, or no job counted yet.
        assert_eq!(share(3, 0).window(), MIN_DISPATCH_WINDOW);
        assert_eq!(share(0, 100).window(), 200);
        assert_eq!(share(1, u64::MAX).window(), u32::MAX);
    }
}
