//! What the distributed worker and the `retry` command need beyond the basic state
//! machine: per-delivery checks, assembly claims that survive a dead assembler, the
//! plan rebuilt from the rows, outputs, and putting a failed job back to work.

use std::time::Duration;

use narrator_core::{ChapterPlan, JobPlan, Segment};
use serde::{Deserialize, Serialize};
use sqlx::postgres::PgRow;
use sqlx::types::Json;
use sqlx::{PgExecutor, PgPool, Row};
use uuid::Uuid;

use crate::error::{DbError, int4, unsigned};
use crate::jobs::{JobState, parse_pause};
use crate::secs;

/// A segment from a row with `idx, chapter, text, pause_after, speaker`.
pub(crate) fn segment_row(r: &PgRow) -> Result<Segment, DbError> {
    let pause: String = r.try_get("pause_after")?;
    Ok(Segment {
        index: unsigned("idx", i64::from(r.try_get::<i32, _>("idx")?))?,
        chapter: unsigned("chapter", i64::from(r.try_get::<i32, _>("chapter")?))?,
        text: r.try_get("text")?,
        pause_after: parse_pause(&pause)?,
        speaker: unsigned("speaker", i64::from(r.try_get::<i32, _>("speaker")?))?,
        speed: None,
        timed: false,
    })
}

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
    let rows = sqlx::query(
        "SELECT i.n, j.state AS job_state, s.state AS seg_state, \
           (i.text IS NOT NULL AND (s.text IS DISTINCT FROM i.text \
              OR s.speaker::int8 IS DISTINCT FROM i.speaker)) AS differs, \
           coalesce(s.engine_crashes, 0) AS crashes, coalesce(s.returns, 0) AS returns, \
           (s.engine_by IS NOT NULL AND s.engine_by <> $4 AND (i.returned OR NOT EXISTS ( \
              SELECT 1 FROM workers w WHERE w.instance = s.engine_by \
                AND w.last_seen > now() - make_interval(secs => coalesce(w.stale_after_s, $5))))) AS crashed, \
           i.returned, (j.settings->>'speed')::float4 AS speed, \
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
    .await?;
    let mut out = Vec::with_capacity(rows.len());
    let (mut crashed_keys, mut returned_keys) = (Vec::new(), Vec::new());
    for (row, d) in rows.iter().zip(deliveries) {
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
        out.push(DeliveryHistory {
            check,
            engine_crashes: crashes,
            returns,
            speed: row.try_get("speed")?,
            timed: row.try_get("timed")?,
        });
    }
    if !crashed_keys.is_empty() || !returned_keys.is_empty() {
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
    }
    Ok(out)
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

/// Settings the producer chose that the assembler applies.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobSettings {
    /// Silence after a sentence, ms.
    pub sentence_pause_ms: u32,
    /// Silence after a paragraph, ms.
    pub paragraph_pause_ms: u32,
    /// Silence between chapters in the book file, ms.
    pub chapter_pause_ms: u32,
    /// Also one file per chapter (`--chapter-files`).
    #[serde(default)]
    pub chapter_files: bool,
    /// Subtitle formats to write (`--subtitles`: `srt`, `vtt`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub subtitles: Vec<String>,
    /// Speaking rate (`--speed`, 0.5 to 2.0) every worker runs its segments at; `None`:
    /// the workers' own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub speed: Option<f32>,
    /// Also a read-along EPUB 3 (`--format epub3`; the format is then `mp3` with chapter
    /// files, the EPUB's audio), with overlays by `sentence` or `word`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epub3: Option<String>,
}

impl Default for JobSettings {
    fn default() -> Self {
        Self {
            sentence_pause_ms: 250,
            paragraph_pause_ms: 600,
            chapter_pause_ms: 1500,
            chapter_files: false,
            subtitles: Vec::new(),
            speed: None,
            epub3: None,
        }
    }
}

/// The cluster id `narrator migrate` made for this database; every segment message
/// carries it, so a worker can tell a message of another cluster from its own.
pub async fn cluster_id(exec: impl PgExecutor<'_>) -> Result<Uuid, DbError> {
    sqlx::query_scalar("SELECT id FROM cluster")
        .fetch_optional(exec)
        .await?
        .ok_or(DbError::Corrupt {
            column: "cluster.id",
            value: "no row (run `narrator migrate`)".into(),
        })
}

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

/// A job as the assembler needs it: the plan rebuilt from the rows (its `job_id` is the
/// job's UUID, which names its audio in the store), the format and the settings.
#[derive(Debug, Clone)]
pub struct StoredJob {
    /// The plan.
    pub plan: JobPlan,
    /// Output format word.
    pub format: String,
    /// Pauses.
    pub settings: JobSettings,
    /// Current state.
    pub state: JobState,
}

/// A job's voice and priority: where its segments are published (the voice's queue of
/// the priority's lane).
pub async fn job_route(exec: impl PgExecutor<'_>, job: Uuid) -> Result<(String, i32), DbError> {
    sqlx::query_as("SELECT voice, priority FROM jobs WHERE id = $1")
        .bind(job)
        .fetch_optional(exec)
        .await?
        .ok_or(DbError::JobNotFound(job))
}

/// The trace `job` belongs to, if it was submitted with tracing on.
pub async fn job_trace(
    exec: impl PgExecutor<'_>,
    job: Uuid,
) -> Result<Option<narrator_core::TraceContext>, DbError> {
    let row: Option<(Option<String>, Option<String>)> =
        sqlx::query_as("SELECT traceparent, tracestate FROM jobs WHERE id = $1")
            .bind(job)
            .fetch_optional(exec)
            .await?;
    Ok(row.and_then(|(traceparent, tracestate)| {
        Some(narrator_core::TraceContext {
            traceparent: traceparent?,
            tracestate,
        })
    }))
}

/// Loads a job's plan, format and settings.
pub async fn load_job(pool: &PgPool, job: Uuid) -> Result<StoredJob, DbError> {
    let row = sqlx::query(
        "SELECT title, source, voice, format, state, chapters, warnings, settings, metadata, \
         cover, cover_type, lexicon FROM jobs WHERE id = $1",
    )
    .bind(job)
    .fetch_optional(pool)
    .await?
    .ok_or(DbError::JobNotFound(job))?;
    let Json(chapters): Json<Vec<ChapterPlan>> = row.try_get("chapters")?;
    let Json(warnings): Json<Vec<String>> = row.try_get("warnings")?;
    let Json(settings): Json<serde_json::Value> = row.try_get("settings")?;
    let settings = serde_json::from_value(settings).unwrap_or_default();
    let Json(mut meta): Json<narrator_core::BookMeta> = row.try_get("metadata")?;
    let cover: Option<Vec<u8>> = row.try_get("cover")?;
    let cover_type: Option<String> = row.try_get("cover_type")?;
    meta.cover = cover
        .zip(cover_type)
        .map(|(data, mime)| narrator_core::Cover {
            mime,
            data: std::sync::Arc::new(data),
        });
    meta.resources = sqlx::query_as::<_, (String, String, Vec<u8>)>(
        "SELECT path, mime, data FROM job_resources WHERE job_id = $1 ORDER BY path",
    )
    .bind(job)
    .fetch_all(pool)
    .await?
    .into_iter()
    .map(|(path, mime, data)| narrator_core::SourceFile {
        path,
        mime,
        data: std::sync::Arc::new(data),
    })
    .collect();
    let segments = sqlx::query(
        "SELECT idx, chapter, text, pause_after, speaker FROM segments WHERE job_id = $1 \
         ORDER BY idx",
    )
    .bind(job)
    .fetch_all(pool)
    .await?
    .iter()
    .map(segment_row)
    .collect::<Result<Vec<_>, DbError>>()?;
    Ok(StoredJob {
        plan: JobPlan {
            job_id: job.to_string(),
            title: row.try_get("title")?,
            source: row.try_get("source")?,
            voice: row.try_get("voice")?,
            chapters,
            segments,
            warnings,
            meta,
            lexicon: row.try_get("lexicon")?,
        },
        format: row.try_get("format")?,
        settings,
        state: JobState::parse(&row.try_get::<String, _>("state")?)?,
    })
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

/// Assembly tries of a job that ended in a transient failure so far.
pub async fn assembly_attempts(exec: impl PgExecutor<'_>, job: Uuid) -> Result<u32, DbError> {
    let n: i32 = sqlx::query_scalar("SELECT assembly_attempts FROM jobs WHERE id = $1")
        .bind(job)
        .fetch_optional(exec)
        .await?
        .ok_or(DbError::JobNotFound(job))?;
    unsigned("assembly_attempts", i64::from(n))
}

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
    let accounted = [
        i64::try_from(look.accounted[0]).unwrap_or(i64::MAX),
        i64::try_from(look.accounted[1]).unwrap_or(i64::MAX),
    ];
    let mut tx = pool.begin().await?;
    let lost: Vec<(Uuid, i32)> = sqlx::query_as(
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
    .fetch_all(&mut *tx)
    .await?;
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
    .bind(secs(look.min_age))
    .bind(max_rescues)
    .fetch_all(&mut *tx)
    .await?;
    let mut by_job: std::collections::BTreeMap<Uuid, (Vec<Segment>, u32)> = Default::default();
    for r in &rows {
        let entry = by_job.entry(r.try_get("job_id")?).or_default();
        if r.try_get("given_up")? {
            entry.1 += 1;
        } else {
            entry.0.push(segment_row(r)?);
        }
    }
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

/// Cluster-wide job figures of one voice, for the workers' gauges.
#[derive(Debug, Clone, PartialEq)]
pub struct VoiceGauges {
    /// The voice.
    pub voice: String,
    /// Jobs by state, every state (0 included): the unfinished states (queued, running,
    /// assembling) count every such job; the finished ones (done, failed, cancelled) only
    /// the jobs finished within [`GAUGE_FINISHED_WITHIN`], so that the gauge never reads
    /// every job the database has kept.
    pub by_state: Vec<(String, i64)>,
    /// Age of the oldest unfinished job (queued, running, assembling), seconds; 0 when none.
    pub oldest_unfinished_seconds: f64,
    /// Unfinished jobs without progress for longer than the lease.
    pub stalled: i64,
}

impl VoiceGauges {
    /// A voice's figures with no job in any state: what a voice that drops out of
    /// [`voice_gauges`] reads (a state that emptied reads 0, not its last count).
    pub fn empty(voice: String) -> Self {
        const STATES: [JobState; 6] = [
            JobState::Queued,
            JobState::Running,
            JobState::Assembling,
            JobState::Done,
            JobState::Failed,
            JobState::Cancelled,
        ];
        Self {
            voice,
            by_state: STATES.iter().map(|s| (s.as_str().to_string(), 0)).collect(),
            oldest_unfinished_seconds: 0.0,
            stalled: 0,
        }
    }
}

/// How far back [`voice_gauges`] counts finished jobs (by `finished_at`).
pub const GAUGE_FINISHED_WITHIN: std::time::Duration = std::time::Duration::from_secs(3600);

/// Jobs by voice and state (finished ones: those of the last
/// [`GAUGE_FINISHED_WITHIN`]), the oldest unfinished job's age and the jobs without
/// progress for `lease`. One statement that reads the unfinished jobs through their
/// partial index (`jobs_unfinished_idx`) and the recently finished ones through theirs
/// (`jobs_finished_at_idx`): its work does not grow with the finished jobs kept. A voice
/// with neither is not returned (the caller zeroes what it reported of it before).
pub async fn voice_gauges(
    exec: impl PgExecutor<'_>,
    lease: std::time::Duration,
) -> Result<Vec<VoiceGauges>, DbError> {
    let rows: Vec<(String, String, i64, Option<f64>, i64)> = sqlx::query_as(
        "SELECT voice, state, count(*), \
         max(extract(epoch FROM now() - created_at)::float8) \
           FILTER (WHERE state IN ('queued', 'running', 'assembling')), \
         count(*) FILTER (WHERE state IN ('queued', 'running') \
           AND coalesce(progress_at, created_at) < now() - make_interval(secs => $1)) \
         FROM ( \
           SELECT voice, state, created_at, progress_at FROM jobs \
             WHERE state IN ('queued', 'running', 'assembling') \
           UNION ALL \
           SELECT voice, state, created_at, progress_at FROM jobs \
             WHERE state IN ('done', 'failed', 'cancelled') \
               AND finished_at >= now() - make_interval(secs => $2) \
         ) j GROUP BY voice, state ORDER BY voice, state",
    )
    .bind(lease.as_secs_f64())
    .bind(GAUGE_FINISHED_WITHIN.as_secs_f64())
    .fetch_all(exec)
    .await?;
    let mut out: Vec<VoiceGauges> = Vec::new();
    for (voice, state, n, oldest, stalled) in rows {
        if out.last().is_none_or(|g| g.voice != voice) {
            // Every state, so a state that emptied reads 0 rather than its last count.
            out.push(VoiceGauges::empty(voice));
        }
        if let Some(g) = out.last_mut() {
            match g.by_state.iter_mut().find(|(s, _)| *s == state) {
                Some(slot) => slot.1 = n,
                None => g.by_state.push((state, n)),
            }
            g.oldest_unfinished_seconds = g.oldest_unfinished_seconds.max(oldest.unwrap_or(0.0));
            g.stalled += stalled;
        }
    }
    Ok(out)
}
