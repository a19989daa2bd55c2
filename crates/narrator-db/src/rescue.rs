//! The stuck-job watchdog's search for lost segments: per voice, what the database says
//! is out in the broker against what live workers hold ([`voice_outstanding`]), and the
//! rescue that publishes the lost ones again or gives up on them
//! ([`rescue_lost_segments`]).

use std::collections::BTreeMap;
use std::time::Duration;

use narrator_core::Segment;
use sqlx::{PgConnection, PgExecutor, PgPool, Row};
use uuid::Uuid;

use crate::error::{DbError, unsigned};
use crate::secs;
use crate::segments::segment_row;

/// One voice's accounting for the watchdog: what the database says is out in the
/// broker, and what live workers say they hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VoiceOutstanding {
    /// The voice.
    pub voice: String,
    /// Its published segments not finished yet, of queued and running jobs: each should
    /// be a message somewhere (a lane, a retry tier, or held by a worker).
    pub outstanding: u64,
    /// Deliveries of it that live workers hold unacknowledged, as their last heartbeats
    /// said (a worker past its own staleness is not counted: what it held comes back).
    pub held: u64,
    /// Of `held`, by lane (normal, high). A worker that does not say counts all it
    /// holds in both lanes (the rescue then judges fewer segments lost, never more).
    pub held_by_lane: [u64; 2],
    /// The longest heartbeat interval among those workers: how stale `held` may be.
    pub slowest_heartbeat: Duration,
}

/// [`VoiceOutstanding`] of each of `voices`. `stale` judges rows of workers that did not
/// record their own staleness.
pub async fn voice_outstanding(
    exec: impl PgExecutor<'_>,
    voices: &[String],
    stale: Duration,
) -> Result<Vec<VoiceOutstanding>, DbError> {
    // Outstanding: the pending, published segments of the voice's unfinished jobs, from
    // their counters alone, so the look costs the same for any book and any backlog.
    // Workers write `stale_after_s` as 6 heartbeats.
    let rows: Vec<(String, i64, i64, i64, i64, f64)> = sqlx::query_as(
        "SELECT v.voice, \
           (SELECT coalesce(sum(j.segments_total - j.segments_done - j.segments_failed \
                - j.segments_unpublished), 0)::bigint \
             FROM jobs j WHERE j.voice = v.voice AND j.state IN ('queued', 'running')), \
           coalesce(h.held, 0)::bigint, coalesce(h.normal, 0)::bigint, \
           coalesce(h.high, 0)::bigint, coalesce(h.stale, 0) / 6 \
         FROM unnest($1::text[]) AS v(voice) \
         LEFT JOIN LATERAL ( \
           SELECT sum((p->>'held')::bigint) AS held, \
             sum(coalesce((p->'held_lanes'->>0)::bigint, (p->>'held')::bigint)) AS normal, \
             sum(coalesce((p->'held_lanes'->>1)::bigint, (p->>'held')::bigint)) AS high, \
             max(coalesce(w.stale_after_s, $2)) AS stale \
           FROM workers w CROSS JOIN LATERAL jsonb_array_elements( \
             CASE WHEN jsonb_typeof(w.plan) = 'array' THEN w.plan ELSE '[]' END) p \
           WHERE p->>'voice' = v.voice AND jsonb_typeof(p->'held') = 'number' \
             AND w.last_seen > now() - make_interval(secs => coalesce(w.stale_after_s, $2)) \
         ) h ON true",
    )
    .bind(voices)
    .bind(secs(stale))
    .fetch_all(exec)
    .await?;
    rows.into_iter()
        .map(|(voice, outstanding, held, normal, high, beat)| {
            Ok(VoiceOutstanding {
                voice,
                outstanding: unsigned("outstanding", outstanding)?,
                held: unsigned("held", held)?,
                held_by_lane: [unsigned("held", normal)?, unsigned("held", high)?],
                slowest_heartbeat: Duration::try_from_secs_f64(beat).unwrap_or_default(),
            })
        })
        .collect()
}

/// Segments of one job the watchdog judged lost: to be published again.
#[derive(Debug, Clone, PartialEq)]
pub struct Rescue {
    /// The job.
    pub job: Uuid,
    /// Its voice (the queue to publish to).
    pub voice: String,
    /// Its priority (the lane).
    pub priority: i32,
    /// The segments to publish again, in index order.
    pub segments: Vec<Segment>,
    /// Segments given up on because they were lost `max_rescues` times already.
    pub given_up: u32,
}

/// What the watchdog knows when it looks for a voice's lost segments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LossLook {
    /// Per lane (normal, high): the messages the broker has ready in the lane's queue
    /// plus the deliveries of the lane live workers hold. In a lane's queue messages go
    /// out first in, first out, so these are the lane's most recently published
    /// segments; the older ones out were delivered (and are in an engine, waiting in a
    /// retry tier, or lost).
    pub accounted: [u64; 2],
    /// Messages of the voice no one accounts for, confirmed on two looks: at most this
    /// many segments are judged lost.
    pub missing: u32,
    /// Segments published more recently than this are not judged (the lease).
    pub min_age: Duration,
    /// A segment that entered an engine since its last publish, this recently, may be
    /// waiting in a retry tier (a failed attempt): not judged lost.
    pub retry_quiet: Duration,
    /// Rows of workers that did not record their own staleness count as gone after this.
    pub stale: Duration,
}

/// The stuck-job watchdog's rescue, aimed at the loss: of `voice`'s segments out
/// (published, pending, of queued or running jobs), the lane's newest
/// `look.accounted[lane]` are the messages that are ready or held. One of the others is
/// lost (a message the broker dropped, or dead-lettered without a record) when the
/// lane's front passed it (a segment of the lane published after it was delivered:
/// recorded, or in an engine; or nothing of the lane is accounted for at all), it was
/// published at least `look.min_age` ago, is in no live worker's engine and was not
/// attempted within `look.retry_quiet`; oldest first, never-delivered ones before
/// attempted ones, at most `look.missing`. A loss newer than messages still ready
/// waits until those are delivered. Each is published again with one more rescue, except
/// those already rescued `max_rescues` times, which are recorded failed (`lost`).
/// A book waiting behind a backlog has its segments ready in the queue: it is never
/// charged. Concurrent watchdogs rescue a segment once (the update re-checks its age).
///
/// It reads the pending segments of the voice's unfinished jobs: a cost paid once per
/// confirmed loss, not per tick.
pub async fn rescue_lost_segments(
    pool: &PgPool,
    voice: &str,
    look: LossLook,
    max_rescues: u32,
) -> Result<Vec<Rescue>, DbError> {
    if look.missing == 0 {
        return Ok(Vec::new());
    }
    let mut tx = pool.begin().await?;
    let lost = find_lost(&mut tx, voice, &look).await?;
    let mut by_job = rescue_or_give_up(&mut tx, lost, look.min_age, max_rescues).await?;
    let ids: Vec<Uuid> = by_job.keys().copied().collect();
    // The jobs' own record of rescues (status shows them), and their lanes.
    let routes: Vec<(Uuid, String, i32)> = sqlx::query_as(
        "UPDATE jobs SET rescued_at = now(), rescues = rescues + 1 WHERE id = ANY($1) \
         RETURNING id, voice, priority",
    )
    .bind(&ids)
    .fetch_all(&mut *tx)
    .await?;
    tx.commit().await?;
    let mut out = Vec::with_capacity(routes.len());
    for (job, voice, priority) in routes {
        let (mut segments, given_up) = by_job.remove(&job).unwrap_or_default();
        segments.sort_by_key(|s| s.index);
        out.push(Rescue {
            job,
            voice,
            priority,
            segments,
            given_up,
        });
    }
    out.sort_by_key(|r| r.job);
    Ok(out)
}

/// [`rescue_lost_segments`]' search: the keys (job, index) of `voice`'s segments judged
/// lost, oldest first, never-delivered ones before attempted ones, at most `look.missing`.
async fn find_lost(
    conn: &mut PgConnection,
    voice: &str,
    look: &LossLook,
) -> Result<Vec<(Uuid, i32)>, DbError> {
    let accounted = [
        i64::try_from(look.accounted[0]).unwrap_or(i64::MAX),
        i64::try_from(look.accounted[1]).unwrap_or(i64::MAX),
    ];
    Ok(sqlx::query_as(
        "WITH out AS ( \
           SELECT s.job_id, s.idx, s.published_at, s.engine_at, s.engine_by, \
             (j.priority > 0)::int AS lane, \
             row_number() OVER (PARTITION BY j.priority > 0 \
               ORDER BY s.published_at DESC, s.idx DESC, s.job_id) AS newer \
           FROM jobs j JOIN segments s ON s.job_id = j.id \
           WHERE j.voice = $1 AND j.state IN ('queued', 'running') \
             AND s.state = 'pending' AND s.published_at IS NOT NULL), \
         front AS ( \
           SELECT DISTINCT ON (j.priority > 0) (j.priority > 0)::int AS lane, \
             s.published_at AS at, s.idx AS at_idx \
           FROM jobs j JOIN segments s ON s.job_id = j.id \
           WHERE j.voice = $1 AND j.state IN ('queued', 'running') \
             AND (s.state = 'done' OR s.engine_at >= s.published_at) \
           ORDER BY j.priority > 0, s.published_at DESC, s.idx DESC) \
         SELECT o.job_id, o.idx FROM out o LEFT JOIN front f ON f.lane = o.lane \
         WHERE o.newer > ($2::int8[])[o.lane + 1] \
           AND (($2::int8[])[o.lane + 1] = 0 OR (o.published_at, o.idx) < (f.at, f.at_idx)) \
           AND o.published_at < now() - make_interval(secs => $3) \
           AND NOT (o.engine_at IS NOT NULL AND o.engine_at >= o.published_at \
             AND o.engine_at > now() - make_interval(secs => $4)) \
           AND NOT EXISTS (SELECT 1 FROM workers w WHERE w.instance = o.engine_by \
             AND w.last_seen > now() - make_interval(secs => coalesce(w.stale_after_s, $5))) \
         ORDER BY (o.engine_at IS NOT NULL AND o.engine_at >= o.published_at), \
           o.published_at, o.job_id, o.idx \
         LIMIT $6",
    )
    .bind(voice)
    .bind(&accounted[..])
    .bind(secs(look.min_age))
    .bind(secs(look.retry_quiet))
    .bind(secs(look.stale))
    .bind(i64::from(look.missing))
    .fetch_all(conn)
    .await?)
}

/// Publishes each of `lost` again with one more rescue (its age checked again against
/// `min_age`), or gives up on those rescued `max_rescues` times already; by job: the
/// segments to publish again, and how many were given up on.
async fn rescue_or_give_up(
    conn: &mut PgConnection,
    lost: Vec<(Uuid, i32)>,
    min_age: Duration,
    max_rescues: u32,
) -> Result<BTreeMap<Uuid, (Vec<Segment>, u32)>, DbError> {
    let max_rescues = i32::try_from(max_rescues).unwrap_or(i32::MAX);
    let (jobs, idx): (Vec<Uuid>, Vec<i32>) = lost.into_iter().unzip();
    // One statement: each is published again with one more rescue, or, lost
    // `max_rescues` times already, given up (a message that kills every worker it
    // reaches, dead-lettered by the broker without a record). The age is checked again
    // under the row's lock: a watchdog that rescued it meanwhile made it young.
    let rows = sqlx::query(
        "UPDATE segments s SET \
           state = CASE WHEN s.rescues >= $4 THEN 'failed' ELSE s.state END, \
           failure_kind = CASE WHEN s.rescues >= $4 THEN 'lost' ELSE s.failure_kind END, \
           failure_reason = CASE WHEN s.rescues >= $4 THEN format('lost %s times \
             (dead-lettered by the broker or never delivered; workers may have died on it \
             each time)', s.rescues) ELSE s.failure_reason END, \
           engine_by = CASE WHEN s.rescues >= $4 THEN NULL ELSE s.engine_by END, \
           rescues = s.rescues + (s.rescues < $4)::int, \
           published_at = CASE WHEN s.rescues >= $4 THEN s.published_at \
             ELSE statement_timestamp() END \
         FROM unnest($1::uuid[], $2::int4[]) AS k(job_id, idx) \
         WHERE s.job_id = k.job_id AND s.idx = k.idx AND s.state = 'pending' \
           AND s.published_at < now() - make_interval(secs => $3) \
         RETURNING s.job_id, s.state = 'failed' AS given_up, \
           s.idx, s.chapter, s.text, s.pause_after, s.speaker",
    )
    .bind(&jobs)
    .bind(&idx)
    .bind(secs(min_age))
    .bind(max_rescues)
    .fetch_all(conn)
    .await?;
    let mut by_job: BTreeMap<Uuid, (Vec<Segment>, u32)> = BTreeMap::new();
    for r in &rows {
        let entry = by_job.entry(r.try_get("job_id")?).or_default();
        if r.try_get("given_up")? {
            entry.1 += 1;
        } else {
            entry.0.push(segment_row(r)?);
        }
    }
    Ok(by_job)
}
