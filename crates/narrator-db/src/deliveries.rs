//! What a worker checks and marks about the segments the broker delivers to it: whether
//! each is still worth synthesizing ([`check_segment`], [`check_segments`]), the same
//! check for the worker's guard, which also notices engine crashes and returned
//! deliveries and refuses forged messages ([`check_deliveries`]), the marks that let the
//! next delivery tell a crash ([`mark_in_engine`]), and which jobs of a batch ended
//! meanwhile ([`abandoned_jobs`]).

use std::time::Duration;

use sqlx::postgres::PgRow;
use sqlx::types::Json;
use sqlx::{PgExecutor, PgPool, Row};
use uuid::Uuid;

use crate::error::{DbError, int4, unsigned};
use crate::jobs::JobState;
use crate::secs;

/// What a worker must know about a delivered segment before it spends time on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SegmentCheck {
    /// Synthesize it.
    Work,
    /// Already recorded done (a redelivery): acknowledge without work.
    AlreadyDone,
    /// Its job was cancelled, failed or finished: drop it.
    JobEnded(JobState),
    /// No such job or segment (deleted, or another database): drop it.
    Unknown,
    /// The message's text or speaker is not the segment's in the database: forged or
    /// corrupted on the way. Dead-letter it; never synthesize it.
    Mismatch,
}

/// One delivery's check: [`check_segments`] for one.
pub async fn check_segment(
    exec: impl PgExecutor<'_>,
    job: Uuid,
    index: u32,
) -> Result<SegmentCheck, DbError> {
    // The query returns one row per delivery asked about (LEFT JOINs).
    let checks = check_segments(exec, &[(job, index)]).await?;
    Ok(checks.into_iter().next().unwrap_or(SegmentCheck::Unknown))
}

/// One query for a group of deliveries: each one's job state and segment state, in the
/// order given (a worker checks everything the broker has handed it at once, so the
/// check costs one round trip per group, not per segment).
pub async fn check_segments(
    exec: impl PgExecutor<'_>,
    deliveries: &[(Uuid, u32)],
) -> Result<Vec<SegmentCheck>, DbError> {
    if deliveries.is_empty() {
        return Ok(Vec::new());
    }
    let jobs: Vec<Uuid> = deliveries.iter().map(|d| d.0).collect();
    let idx = deliveries
        .iter()
        .map(|d| int4("segment index", d.1))
        .collect::<Result<Vec<i32>, DbError>>()?;
    let rows = sqlx::query(
        "SELECT i.n, j.state AS job_state, s.state AS seg_state \
         FROM unnest($1::uuid[], $2::int4[]) WITH ORDINALITY AS i(job_id, idx, n) \
         LEFT JOIN segments s ON s.job_id = i.job_id AND s.idx = i.idx \
         LEFT JOIN jobs j ON j.id = s.job_id ORDER BY i.n",
    )
    .bind(&jobs)
    .bind(&idx)
    .fetch_all(exec)
    .await?;
    rows.iter()
        .map(|row| {
            let seg: Option<String> = row.try_get("seg_state")?;
            let job: Option<String> = row.try_get("job_state")?;
            let (Some(seg), Some(job)) = (seg, job) else {
                return Ok(SegmentCheck::Unknown);
            };
            let job_state = JobState::parse(&job)?;
            Ok(if seg == "done" {
                SegmentCheck::AlreadyDone
            } else if job_state.is_final() {
                SegmentCheck::JobEnded(job_state)
            } else {
                SegmentCheck::Work
            })
        })
        .collect()
}

/// A delivery as the worker's guard checks it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliveryKey {
    /// The job.
    pub job: Uuid,
    /// The segment index.
    pub index: u32,
    /// The broker delivered it again after a consumer went away holding it (its
    /// `x-delivery-count` is above 0).
    pub returned: bool,
    /// The text and speaker the message carries, compared with the segment's row (a
    /// message can be published by anyone who reaches the broker); `None`: not compared.
    pub content: Option<(String, u32)>,
}

/// What the guard learns about a delivery beyond [`SegmentCheck`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DeliveryHistory {
    /// The check.
    pub check: SegmentCheck,
    /// How often a worker process died while this segment was in its engine (counting
    /// the death this check noticed).
    pub engine_crashes: u32,
    /// How often a dying process returned it to the queue (counting this delivery).
    pub returns: u32,
    /// The speaking rate its job was submitted with (`submit --speed`), if any: the
    /// rate is the job's, read here rather than trusted from the message.
    pub speed: Option<f32>,
    /// The scales its job's identity was hashed with, as the job recorded them
    /// ([`crate::JobSettings::scales`]); `None` for jobs recorded without them.
    pub scales: Option<narrator_core::Scales>,
    /// Its job wants word timings (subtitles or an EPUB with word overlays in its
    /// settings).
    pub timed: bool,
}

/// [`check_segments`] for a worker process `instance`, noticing crashes: a segment whose
/// `engine_by` names another process that is gone (its worker row is not fresher than
/// that worker's own `stale_after`, or `stale` for rows that do not say, with that
/// instance) or that returned this delivery (the consumer went away
/// while the segment was in its engine) was in the engine of a process that died: its
/// `engine_crashes` goes up by one and `engine_by` is cleared. A delivery marked
/// `returned` counts one more return. One query, plus one update when anything changed.
pub async fn check_deliveries(
    pool: &PgPool,
    deliveries: &[DeliveryKey],
    instance: Uuid,
    stale: Duration,
) -> Result<Vec<DeliveryHistory>, DbError> {
    if deliveries.is_empty() {
        return Ok(Vec::new());
    }
    let rows = read_deliveries(pool, deliveries, instance, stale).await?;
    let mut out = Vec::with_capacity(rows.len());
    let (mut crashed_keys, mut returned_keys) = (Vec::new(), Vec::new());
    for (row, d) in rows.iter().zip(deliveries) {
        out.push(delivery_history(
            row,
            d,
            &mut crashed_keys,
            &mut returned_keys,
        )?);
    }
    if !crashed_keys.is_empty() || !returned_keys.is_empty() {
        count_crashes_and_returns(pool, crashed_keys, returned_keys).await?;
    }
    Ok(out)
}

/// [`check_deliveries`]' query: one row per delivery, in the order given, with its job's
/// and segment's states, whether its content differs from the row, its counts so far,
/// whether it was in the engine of a process that died, and its job's speed and timings.
async fn read_deliveries(
    pool: &PgPool,
    deliveries: &[DeliveryKey],
    instance: Uuid,
    stale: Duration,
) -> Result<Vec<PgRow>, DbError> {
    let jobs: Vec<Uuid> = deliveries.iter().map(|d| d.job).collect();
    let idx = deliveries
        .iter()
        .map(|d| int4("segment index", d.index))
        .collect::<Result<Vec<i32>, DbError>>()?;
    let returned: Vec<bool> = deliveries.iter().map(|d| d.returned).collect();
    let texts: Vec<Option<&str>> = deliveries
        .iter()
        .map(|d| d.content.as_ref().map(|c| c.0.as_str()))
        .collect();
    let speakers: Vec<Option<i64>> = deliveries
        .iter()
        .map(|d| d.content.as_ref().map(|c| i64::from(c.1)))
        .collect();
    Ok(sqlx::query(
        "SELECT i.n, j.state AS job_state, s.state AS seg_state, \
           (i.text IS NOT NULL AND (s.text IS DISTINCT FROM i.text \
              OR s.speaker::int8 IS DISTINCT FROM i.speaker)) AS differs, \
           coalesce(s.engine_crashes, 0) AS crashes, coalesce(s.returns, 0) AS returns, \
           (s.engine_by IS NOT NULL AND s.engine_by <> $4 AND (i.returned OR NOT EXISTS ( \
              SELECT 1 FROM workers w WHERE w.instance = s.engine_by \
                AND w.last_seen > now() - make_interval(secs => coalesce(w.stale_after_s, $5))))) AS crashed, \
           i.returned, (j.settings->>'speed')::float4 AS speed, j.settings->'scales' AS scales, \
           coalesce(j.settings ? 'subtitles' OR j.settings->>'epub3' = 'word', false) AS timed \
         FROM unnest($1::uuid[], $2::int4[], $3::bool[], $6::text[], $7::int8[]) \
           WITH ORDINALITY AS i(job_id, idx, returned, text, speaker, n) \
         LEFT JOIN segments s ON s.job_id = i.job_id AND s.idx = i.idx \
         LEFT JOIN jobs j ON j.id = s.job_id ORDER BY i.n",
    )
    .bind(&jobs)
    .bind(&idx)
    .bind(&returned)
    .bind(instance)
    .bind(secs(stale))
    .bind(&texts)
    .bind(&speakers)
    .fetch_all(pool)
    .await?)
}

/// One row of [`read_deliveries`] as the guard's [`DeliveryHistory`]; a delivery to work
/// on that crashed or returned adds its key to `crashed_keys` or `returned_keys` and
/// counts that one more time.
fn delivery_history(
    row: &PgRow,
    d: &DeliveryKey,
    crashed_keys: &mut Vec<(Uuid, i32)>,
    returned_keys: &mut Vec<(Uuid, i32)>,
) -> Result<DeliveryHistory, DbError> {
    let seg: Option<String> = row.try_get("seg_state")?;
    let job: Option<String> = row.try_get("job_state")?;
    let crashed = row.try_get::<Option<bool>, _>("crashed")?.unwrap_or(false);
    let differs = row.try_get::<Option<bool>, _>("differs")?.unwrap_or(false);
    let mut crashes: u32 = unsigned(
        "engine_crashes",
        i64::from(row.try_get::<i32, _>("crashes")?),
    )?;
    let mut returns: u32 = unsigned("returns", i64::from(row.try_get::<i32, _>("returns")?))?;
    let check = match (seg, job) {
        (Some(seg), Some(job)) => {
            let job_state = JobState::parse(&job)?;
            if differs {
                SegmentCheck::Mismatch
            } else if seg == "done" {
                SegmentCheck::AlreadyDone
            } else if job_state.is_final() {
                SegmentCheck::JobEnded(job_state)
            } else {
                SegmentCheck::Work
            }
        }
        _ => SegmentCheck::Unknown,
    };
    if check == SegmentCheck::Work {
        if crashed {
            crashes += 1;
            crashed_keys.push((d.job, int4("segment index", d.index)?));
        }
        if d.returned {
            returns += 1;
            returned_keys.push((d.job, int4("segment index", d.index)?));
        }
    }
    Ok(DeliveryHistory {
        check,
        engine_crashes: crashes,
        returns,
        speed: row.try_get("speed")?,
        scales: row
            .try_get::<Option<Json<narrator_core::Scales>>, _>("scales")?
            .map(|Json(s)| s),
        timed: row.try_get("timed")?,
    })
}

/// Counts one more engine crash (and clears `engine_by`) for each of `crashed_keys` and
/// one more return for each of `returned_keys`: one statement.
async fn count_crashes_and_returns(
    pool: &PgPool,
    crashed_keys: Vec<(Uuid, i32)>,
    returned_keys: Vec<(Uuid, i32)>,
) -> Result<(), DbError> {
    let (cj, ci): (Vec<Uuid>, Vec<i32>) = crashed_keys.into_iter().unzip();
    let (rj, ri): (Vec<Uuid>, Vec<i32>) = returned_keys.into_iter().unzip();
    sqlx::query(
        "WITH c AS (UPDATE segments s SET engine_crashes = s.engine_crashes + 1, engine_by = NULL \
           FROM unnest($1::uuid[], $2::int4[]) AS k(job_id, idx) \
           WHERE s.job_id = k.job_id AND s.idx = k.idx AND s.engine_by IS NOT NULL RETURNING 1) \
         UPDATE segments s SET returns = s.returns + 1 \
           FROM unnest($3::uuid[], $4::int4[]) AS k(job_id, idx) \
           WHERE s.job_id = k.job_id AND s.idx = k.idx",
    )
    .bind(&cj)
    .bind(&ci)
    .bind(&rj)
    .bind(&ri)
    .execute(pool)
    .await?;
    Ok(())
}

// The statements that read or update segments from arrays of keys join them on the
// primary key (job_id, idx) and nothing else: the planner probes the key per element.
// A separate `job_id = ANY(..)` would offer it a path that reads whole jobs, which it
// takes when its statistics do not know the jobs (new jobs never are).

/// Marks segments as being in `instance`'s engine (`in_engine` true, just before their
/// batch runs: should the process die, the next delivery of each tells a crash, see
/// [`check_deliveries`]) or clears the marks `instance` set (`false`, their batch left the
/// engine).
pub async fn mark_in_engine(
    exec: impl PgExecutor<'_>,
    instance: Uuid,
    segments: &[(Uuid, u32)],
    in_engine: bool,
) -> Result<(), DbError> {
    let jobs: Vec<Uuid> = segments.iter().map(|s| s.0).collect();
    let idx = segments
        .iter()
        .map(|s| int4("segment index", s.1))
        .collect::<Result<Vec<i32>, DbError>>()?;
    sqlx::query(
        "UPDATE segments s SET engine_by = CASE WHEN $4 THEN $3 END, \
           engine_at = CASE WHEN $4 THEN now() ELSE s.engine_at END \
         FROM unnest($1::uuid[], $2::int4[]) AS k(job_id, idx) \
         WHERE s.job_id = k.job_id AND s.idx = k.idx AND ($4 OR s.engine_by = $3)",
    )
    .bind(&jobs)
    .bind(&idx)
    .bind(instance)
    .bind(in_engine)
    .execute(exec)
    .await?;
    Ok(())
}

/// Of `jobs`, those that need no more segment work: cancelled, failed or done (one
/// query; the worker asks just before a batch reaches the device).
pub async fn abandoned_jobs(
    exec: impl PgExecutor<'_>,
    jobs: &[Uuid],
) -> Result<Vec<Uuid>, DbError> {
    if jobs.is_empty() {
        return Ok(Vec::new());
    }
    let rows = sqlx::query(
        "SELECT id FROM jobs WHERE id = ANY($1) AND state IN ('cancelled', 'failed', 'done')",
    )
    .bind(jobs)
    .fetch_all(exec)
    .await?;
    rows.iter()
        .map(|r| r.try_get::<Uuid, _>("id").map_err(DbError::from))
        .collect()
}
