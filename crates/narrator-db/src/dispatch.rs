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
    /// Its jobs of the normal lane queued or running.
    pub active_jobs: u64,
    /// Its jobs of the high lane (priority above 0) queued or running.
    pub active_high: u64,
    /// The prefetch of every live worker serving it, summed.
    pub fleet_prefetch: u64,
}

impl FleetShare {
    /// Segments one of the voice's normal-lane jobs keeps published: the voice's queue
    /// depth (twice the fleet's prefetch) shared by the lane's running
    /// jobs, at least [`MIN_DISPATCH_WINDOW`].
    pub fn window(&self) -> u32 {
        self.lane_window(self.active_jobs)
    }

    /// The same for a job of the high lane: the whole depth shared by the high lane's
    /// jobs alone, so a priority book is not diluted by the backlog (workers take the
    /// high lane first; its window must cover every worker's next batches).
    pub fn high_window(&self) -> u32 {
        self.lane_window(self.active_high)
    }

    fn lane_window(&self, jobs: u64) -> u32 {
        let depth = DEPTH_PER_PREFETCH.saturating_mul(self.fleet_prefetch);
        let share = depth.div_ceil(jobs.max(1));
        u32::try_from(share)
            .unwrap_or(u32::MAX)
            .max(MIN_DISPATCH_WINDOW)
    }
}

/// [`FleetShare`] of each of `voices`; live workers count, each judged by its own
/// staleness (`workers.stale_after_s`: 6 of its heartbeats), rows without one by
/// `seen_within`.
pub async fn fleet_shares(
    exec: impl PgExecutor<'_>,
    voices: &[String],
    seen_within: Duration,
) -> Result<Vec<FleetShare>, DbError> {
    // Unfinished jobs through their partial index, both lanes in one pass (every row
    // version the index still points at is read: a second pass would double it);
    // workers' plans as their heartbeats wrote them (one entry per voice served, with
    // its prefetch).
    let rows: Vec<(String, i64, i64, i64)> = sqlx::query_as(
        "SELECT v.voice, coalesce(n.normal, 0), coalesce(n.high, 0), \
           (SELECT coalesce(sum((p->>'prefetch')::bigint), 0)::bigint \
             FROM workers w CROSS JOIN LATERAL jsonb_array_elements( \
               CASE WHEN jsonb_typeof(w.plan) = 'array' THEN w.plan ELSE '[]' END) p \
             WHERE p->>'voice' = v.voice AND jsonb_typeof(p->'prefetch') = 'number' \
               AND w.last_seen >= now() - make_interval(secs => \
                 coalesce(w.stale_after_s, $2))) \
         FROM unnest($1::text[]) AS v(voice) \
         LEFT JOIN ( \
           SELECT j.voice, count(*) FILTER (WHERE j.priority <= 0) AS normal, \
             count(*) FILTER (WHERE j.priority > 0) AS high \
           FROM jobs j WHERE j.state IN ('queued', 'running') AND j.voice = ANY($1) \
           GROUP BY j.voice \
         ) n ON n.voice = v.voice",
    )
    .bind(voices)
    .bind(secs(seen_within))
    .fetch_all(exec)
    .await?;
    rows.into_iter()
        .map(|(voice, active, high, prefetch)| {
            Ok(FleetShare {
                voice,
                active_jobs: unsigned("active jobs", active)?,
                active_high: unsigned("active jobs", high)?,
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
    /// The job's window: the segments it keeps published (a job of the normal lane).
    pub window: u32,
    /// The window of a job of the high lane ([`FleetShare::high_window`]); the claim
    /// takes the one of the job's lane.
    pub high_window: u32,
    /// The segment index the claim starts from; `None`: where the job's claims have
    /// reached (its dispatch front, see [`claim_dispatch`]).
    pub from: Option<u32>,
    /// Nothing is claimed while the window has room for fewer than this (unless that is
    /// all the job has left unpublished): workers top up in runs, so the queue holds each
    /// book's segments in runs and a batch spans a few books, not one segment of each.
    pub at_least: u32,
    /// When another claim of the job is running: `false` waits for it (in Postgres,
    /// holding a connection), `true` returns [`DbError::ClaimBusy`] at once. Workers'
    /// top-ups after recordings skip: several workers recording one book would otherwise
    /// queue on its claim, each holding a connection and a transaction (1,278 waits over
    /// 20 ms in a 50-book run), and the caller retries without holding either.
    pub skip_when_busy: bool,
}

impl ClaimLimits {
    /// Whatever fits `window`, from the job's first segment.
    pub fn fill(window: u32) -> Self {
        Self {
            window,
            high_window: window,
            from: Some(0),
            at_least: 1,
            skip_when_busy: false,
        }
    }

    /// The reconciler's top-up: from the job's dispatch front (every segment below it is
    /// published or finished, see [`claim_dispatch`]), in runs as
    /// [`Self::after_recording`]'s. It reads what it takes, however much of the book is
    /// published.
    pub fn resume(window: u32) -> Self {
        Self {
            from: None,
            skip_when_busy: false,
            ..Self::after_recording(window, 0)
        }
    }

    /// A worker's top-up after recording segments up to index `recorded`: in runs of
    /// half the window, at most 64.
    pub fn after_recording(window: u32, recorded: u32) -> Self {
        Self {
            window,
            high_window: window,
            from: Some(recorded),
            at_least: (window / 2).clamp(1, 64),
            skip_when_busy: true,
        }
    }
}

impl ClaimLimits {
    /// The same limits with `high` as the high lane's window.
    pub fn with_high_window(self, high: u32) -> Self {
        Self {
            high_window: high,
            ..self
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
/// book). The job's *dispatch front* (`job_dispatch.dispatch_from`, 0 without a row)
/// keeps where its claims have reached: a claim that starts at or below it moves it to
/// its last segment + 1 (everything from its start up to there was taken, or was
/// published already), and a claim without `from` ([`ClaimLimits::resume`], the
/// reconciler's) starts there. It is written in the claim's transaction, so a claim
/// rolled back (its segments left unpublished) takes its move of the front back with it:
/// no unpublished segment is left below the front. What puts segments back to work
/// (`retry_job`) sets it back to 0. Should a segment below the front still be unpublished
/// (a row another transaction held locked when the claim skipped it), a resume claim
/// comes up short of what the job has left and its room, and sets the front back to 0:
/// the next one starts from the book's first segment. The front has its own table so
/// that the claim, which holds its rows until the segments are published, never makes
/// a recording of the job wait (recordings update the job's row).
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
    if limits.skip_when_busy {
        let locked: bool = sqlx::query_scalar("SELECT pg_try_advisory_xact_lock($1)")
            .bind(dispatch_lock_key(job))
            .fetch_one(&mut *conn)
            .await?;
        if !locked {
            return Err(DbError::ClaimBusy(job));
        }
    } else {
        sqlx::query("SELECT pg_advisory_xact_lock($1)")
            .bind(dispatch_lock_key(job))
            .execute(&mut *conn)
            .await?;
    }
    let Some(row) = sqlx::query(
        "SELECT voice, priority, traceparent, tracestate, segments_unpublished::bigint AS left, \
           coalesce((SELECT d.dispatch_from FROM job_dispatch d WHERE d.job_id = jobs.id), 0) \
             AS front, \
           greatest(CASE WHEN priority > 0 THEN $3 ELSE $2 END \
             - (segments_total - segments_done - segments_failed - segments_unpublished), \
             0)::bigint AS room \
         FROM jobs WHERE id = $1 AND state IN ('queued', 'running')",
    )
    .bind(job)
    .bind(i64::from(limits.window))
    .bind(i64::from(limits.high_window))
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
    let front = u32::try_from(row.try_get::<i32, _>("front")?).unwrap_or(0);
    let from = limits.from.unwrap_or(front);
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
        .map(crate::segments::segment_row)
        .collect::<Result<Vec<_>, _>>()?
    } else {
        Vec::new()
    };
    let taken = i64::try_from(segments.len()).unwrap_or(i64::MAX);
    let moved = match segments.last() {
        Some(last) if from <= front => Some(last.index.saturating_add(1)),
        // Short of what it had room for and the job has left: some lie below the front.
        _ if limits.from.is_none() && front > 0 && room > 0 && taken < room.min(left) => Some(0),
        _ => None,
    };
    if let Some(to) = moved.filter(|&to| to != front) {
        sqlx::query(
            "INSERT INTO job_dispatch (job_id, dispatch_from) VALUES ($1, $2) \
             ON CONFLICT (job_id) DO UPDATE SET dispatch_from = EXCLUDED.dispatch_from",
        )
        .bind(job)
        .bind(crate::error::int4("segment index", to)?)
        .execute(&mut *conn)
        .await?;
    }
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

/// Jobs of `voices` queued or running with segments still unpublished and room in their
/// window for a run, submitted at least `older_than` ago (leaving their producer time to
/// publish their first window), oldest first, at most `limit`: what the reconciler tops
/// up to their windows. Each voice comes with its windows (normal lane, high lane); the
/// room and the run are those a [`ClaimLimits::resume`] claim would judge, so a job whose
/// claim would take nothing is not returned (the reconciler's tick then costs nothing per
/// job whose window is full, however many run).
pub async fn dispatch_candidates(
    exec: impl PgExecutor<'_>,
    voices: &[(String, [u32; 2])],
    older_than: Duration,
    limit: u32,
) -> Result<Vec<(Uuid, String)>, DbError> {
    let mut names = Vec::with_capacity(voices.len());
    let mut windows = [
        Vec::with_capacity(voices.len()),
        Vec::with_capacity(voices.len()),
    ];
    let mut runs = Vec::with_capacity(voices.len());
    for (voice, [normal, high]) in voices {
        let limits = ClaimLimits::resume(*normal).with_high_window(*high);
        names.push(voice.clone());
        windows[0].push(i64::from(limits.window));
        windows[1].push(i64::from(limits.high_window));
        runs.push(i64::from(limits.at_least));
    }
    // Unfinished jobs through their partial index; the room as claim_dispatch reads it.
    Ok(sqlx::query_as(
        "SELECT j.id, j.voice \
         FROM unnest($1::text[], $2::int8[], $3::int8[], $4::int8[]) AS v(voice, normal, high, run) \
         JOIN jobs j ON j.voice = v.voice \
         WHERE j.state IN ('queued', 'running') AND j.segments_unpublished > 0 \
           AND j.created_at <= now() - make_interval(secs => $5) \
           AND CASE WHEN j.priority > 0 THEN v.high ELSE v.normal END \
             - (j.segments_total - j.segments_done - j.segments_failed - j.segments_unpublished) \
             >= least(v.run, j.segments_unpublished) \
         ORDER BY j.created_at, j.id LIMIT $6",
    )
    .bind(&names)
    .bind(&windows[0])
    .bind(&windows[1])
    .bind(&runs)
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
            active_high: 0,
            fleet_prefetch,
        }
    }

    #[test]
    fn a_priority_book_shares_the_depth_only_with_other_priority_books() {
        // 4 workers holding 64 each, 20 backlog books, one priority book: the backlog
        // books get the floor, the priority book the whole depth (every worker's next
        // batches, twice over), not the floor of 64 that 4 × 32 would outrun.
        let s = FleetShare {
            active_high: 1,
            ..share(20, 256)
        };
        assert_eq!(s.window(), MIN_DISPATCH_WINDOW);
        assert_eq!(s.high_window(), 512);
        let two = FleetShare {
            active_high: 2,
            ..share(20, 256)
        };
        assert_eq!(two.high_window(), 256);
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
