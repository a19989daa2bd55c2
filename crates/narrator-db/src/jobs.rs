//! Jobs: creation with all their segments in one transaction, the state machine
//! (`queued → running → assembling → done`, or `failed` / `cancelled`), and status reads
//! for `narrator status` and `narrator jobs`.
//!
//! Each state change is one conditional `UPDATE`, so concurrent callers cannot both win;
//! it reports whether it changed anything, and an unknown job is an error.

use chrono::{DateTime, Utc};
use narrator_core::{ChapterPlan, JobPlan, PauseAfter, TraceContext};
use serde::Serialize;
use sqlx::postgres::PgRow;
use sqlx::types::Json;
use sqlx::{PgExecutor, PgPool, Row};
use uuid::Uuid;

use crate::error::{DbError, int4, unsigned};
use crate::stored_job::JobSettings;

/// Where a job is in its life (the fleet's and `narrator serve`'s embedded jobs').
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum JobState {
    /// Submitted; no segment recorded yet.
    Queued,
    /// At least one segment recorded.
    Running,
    /// Every segment recorded; one assembler builds the outputs.
    Assembling,
    /// Outputs published.
    Done,
    /// Ended with an error (see `failure_kind`, `failure_reason`).
    Failed,
    /// Cancelled by the user.
    Cancelled,
}

impl JobState {
    /// The word stored in `jobs.state`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Queued => "queued",
            Self::Running => "running",
            Self::Assembling => "assembling",
            Self::Done => "done",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
        }
    }

    /// The states' words, for errors.
    pub const NAMES: &'static str = "queued, running, assembling, done, failed, cancelled";

    /// A state by its word.
    pub fn parse(s: &str) -> Result<Self, DbError> {
        Ok(match s {
            "queued" => Self::Queued,
            "running" => Self::Running,
            "assembling" => Self::Assembling,
            "done" => Self::Done,
            "failed" => Self::Failed,
            "cancelled" => Self::Cancelled,
            other => {
                return Err(DbError::Corrupt {
                    column: "jobs.state",
                    value: other.to_owned(),
                });
            }
        })
    }

    /// Whether the job has ended (done, failed or cancelled).
    pub fn is_final(self) -> bool {
        matches!(self, Self::Done | Self::Failed | Self::Cancelled)
    }
}

pub(crate) fn pause_str(p: PauseAfter) -> &'static str {
    match p {
        PauseAfter::Sentence => "sentence",
        PauseAfter::Paragraph => "paragraph",
        PauseAfter::Chapter => "chapter",
        PauseAfter::None => "none",
    }
}

pub(crate) fn parse_pause(s: &str) -> Result<PauseAfter, DbError> {
    Ok(match s {
        "sentence" => PauseAfter::Sentence,
        "paragraph" => PauseAfter::Paragraph,
        "chapter" => PauseAfter::Chapter,
        "none" => PauseAfter::None,
        other => {
            return Err(DbError::Corrupt {
                column: "segments.pause_after",
                value: other.to_owned(),
            });
        }
    })
}

/// Records a submission with the default [`JobSettings`] and no trace, as
/// [`create_job_with`].
pub async fn create_job(
    pool: &PgPool,
    plan: &JobPlan,
    format: &str,
    priority: i32,
) -> Result<Uuid, DbError> {
    create_job_with(pool, plan, format, priority, &JobSettings::default(), None).await
}

/// Records a submission: the job row, with its settings and the trace it was submitted
/// in, and every segment (unpublished, pending) in one transaction, the segments in one
/// bulk `INSERT … SELECT FROM UNNEST(…)`. A submitter that dies at any point leaves either
/// nothing or the whole job as it asked (the reconciler publishes it with its settings).
/// Returns the new job id (a fresh one per submission, even for the same book).
pub async fn create_job_with(
    pool: &PgPool,
    plan: &JobPlan,
    format: &str,
    priority: i32,
    settings: &JobSettings,
    trace: Option<&TraceContext>,
) -> Result<Uuid, DbError> {
    let request = JobRequestRecord::default();
    match create_requested_job(pool, plan, (format, priority), settings, trace, &request).await? {
        Created::New(id) | Created::Existing(id) => Ok(id),
    }
}

/// What a producer's request adds to its job: its name (the AMQP `message_id` or its
/// `idempotency_key`) and the producer's metadata.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct JobRequestRecord {
    /// The request's name: the same name makes one job.
    pub key: Option<String>,
    /// The producer's JSON object, kept with the job.
    pub metadata: Option<serde_json::Value>,
    /// Whose job it is (`narrator serve`'s tenants; none from the intake or `submit`).
    pub tenant: Option<String>,
}

/// What [`create_requested_job`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Created {
    /// A new job.
    New(Uuid),
    /// The job the same request (its key) made before: nothing was recorded.
    Existing(Uuid),
}

/// [`create_job_with`] for a producer's request: when the request has a key and a job
/// already has it, nothing is recorded and that job is returned
/// ([`Created::Existing`]); two deliveries of one request at once make one job (the
/// second insert waits on the key's unique index for the first to commit).
pub async fn create_requested_job(
    pool: &PgPool,
    plan: &JobPlan,
    (format, priority): (&str, i32),
    settings: &JobSettings,
    trace: Option<&TraceContext>,
    request: &JobRequestRecord,
) -> Result<Created, DbError> {
    let id = Uuid::new_v4();
    let n = plan.segments.len();
    let total = i32::try_from(n).map_err(|_| DbError::OutOfRange {
        what: "segment count",
        value: n as u64,
    })?;
    let SegmentColumns {
        idx,
        chapter,
        text,
        pause,
        speaker,
    } = SegmentColumns::of(plan)?;
    let mut tx = pool.begin().await?;
    let inserted: Option<Uuid> = sqlx::query_scalar(
        "INSERT INTO jobs (id, content_id, title, source, voice, format, priority, \
         segments_total, chapters, warnings, metadata, cover, cover_type, lexicon, settings, \
         traceparent, tracestate, request_key, request_metadata, tenant) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, \
           $18, $19, $20) \
         ON CONFLICT (request_key) WHERE request_key IS NOT NULL DO NOTHING RETURNING id",
    )
    .bind(id)
    .bind(&plan.job_id)
    .bind(&plan.title)
    .bind(&plan.source)
    .bind(&plan.voice)
    .bind(format)
    .bind(priority)
    .bind(total)
    .bind(Json(&plan.chapters))
    .bind(Json(&plan.warnings))
    .bind(Json(&plan.meta))
    .bind(plan.meta.cover.as_ref().map(|c| c.data.as_slice()))
    .bind(plan.meta.cover.as_ref().map(|c| c.mime.as_str()))
    .bind(plan.lexicon.as_deref())
    .bind(Json(settings))
    .bind(trace.map(|t| t.traceparent.as_str()))
    .bind(trace.and_then(|t| t.tracestate.as_deref()))
    .bind(request.key.as_deref())
    .bind(request.metadata.as_ref().map(Json))
    .bind(request.tenant.as_deref())
    .fetch_optional(&mut *tx)
    .await
    .map_err(|e| DbError::on_job(id, e))?;
    if inserted.is_none() {
        // The key is taken: the job its first delivery made.
        tx.rollback().await?;
        let existing: Uuid = sqlx::query_scalar("SELECT id FROM jobs WHERE request_key = $1")
            .bind(request.key.as_deref())
            .fetch_one(pool)
            .await?;
        return Ok(Created::Existing(existing));
    }
    sqlx::query(
        "INSERT INTO segments (job_id, idx, chapter, text, pause_after, speaker) \
         SELECT $1, u.idx, u.chapter, u.text, u.pause_after, u.speaker \
         FROM UNNEST($2::int4[], $3::int4[], $4::text[], $5::text[], $6::int4[]) \
              AS u(idx, chapter, text, pause_after, speaker)",
    )
    .bind(id)
    .bind(&idx)
    .bind(&chapter)
    .bind(&text)
    .bind(&pause)
    .bind(&speaker)
    .execute(&mut *tx)
    .await
    .map_err(|e| DbError::on_job(id, e))?;
    if !plan.meta.resources.is_empty() {
        let files = &plan.meta.resources;
        let paths: Vec<&str> = files.iter().map(|f| f.path.as_str()).collect();
        let mimes: Vec<&str> = files.iter().map(|f| f.mime.as_str()).collect();
        let data: Vec<&[u8]> = files.iter().map(|f| f.data.as_slice()).collect();
        sqlx::query(
            "INSERT INTO job_resources (job_id, path, mime, data) \
             SELECT $1, u.path, u.mime, u.data \
             FROM UNNEST($2::text[], $3::text[], $4::bytea[]) AS u(path, mime, data)",
        )
        .bind(id)
        .bind(&paths)
        .bind(&mimes)
        .bind(&data)
        .execute(&mut *tx)
        .await
        .map_err(|e| DbError::on_job(id, e))?;
    }
    tx.commit().await?;
    refresh_segment_statistics(pool, n).await;
    Ok(Created::New(id))
}

/// A plan's segments as the columns of one bulk insert.
struct SegmentColumns<'a> {
    idx: Vec<i32>,
    chapter: Vec<i32>,
    text: Vec<&'a str>,
    pause: Vec<&'static str>,
    speaker: Vec<i32>,
}

impl<'a> SegmentColumns<'a> {
    fn of(plan: &'a JobPlan) -> Result<Self, DbError> {
        let n = plan.segments.len();
        let mut c = Self {
            idx: Vec::with_capacity(n),
            chapter: Vec::with_capacity(n),
            text: Vec::with_capacity(n),
            pause: Vec::with_capacity(n),
            speaker: Vec::with_capacity(n),
        };
        for s in &plan.segments {
            c.idx.push(int4("segment index", s.index)?);
            c.chapter.push(int4("chapter", s.chapter)?);
            c.text.push(s.text.as_str());
            c.pause.push(pause_str(s.pause_after));
            c.speaker.push(int4("speaker", s.speaker)?);
        }
        Ok(c)
    }
}

/// The job a request's key made, if any.
pub async fn job_by_request_key(
    exec: impl sqlx::PgExecutor<'_>,
    key: &str,
) -> Result<Option<Uuid>, DbError> {
    Ok(
        sqlx::query_scalar("SELECT id FROM jobs WHERE request_key = $1")
            .bind(key)
            .fetch_optional(exec)
            .await?,
    )
}

/// Gives the planner statistics of `segments` when it has none (a fresh database: until
/// autovacuum's first analyze, a minute or more later) or when the `added` segments of a
/// new job are more than the table held at its last analyze (it at least doubled). Without
/// them it guesses that a job has a couple of segments and, on a small table, scans it.
/// The batch statements do not depend on this (they probe the primary key per element);
/// it keeps the other plans sane on a fresh database. At most once per doubling of the
/// table; a failure (no right to analyze) only leaves it to autovacuum.
async fn refresh_segment_statistics(pool: &PgPool, added: usize) {
    let stale: Result<bool, sqlx::Error> = sqlx::query_scalar(
        "SELECT reltuples < 0 OR reltuples < $1 FROM pg_class WHERE oid = 'segments'::regclass",
    )
    .bind(added as f64)
    .fetch_one(pool)
    .await;
    if let Ok(true) = stale
        && let Err(e) = sqlx::query("ANALYZE segments").execute(pool).await
    {
        tracing::debug!(error = %e, "cannot analyze segments; autovacuum will");
    }
}

/// Runs a conditional state change written as
/// `WITH upd AS (UPDATE jobs … WHERE id = $1 AND … RETURNING 1) SELECT changed, known`.
fn changed(row: PgRow, job: Uuid) -> Result<bool, DbError> {
    let known: bool = row.try_get("known")?;
    if !known {
        return Err(DbError::JobNotFound(job));
    }
    Ok(row.try_get("changed")?)
}

const CHANGED: &str = "SELECT EXISTS (SELECT 1 FROM upd) AS changed, \
                       EXISTS (SELECT 1 FROM jobs WHERE id = $1) AS known";

/// Moves a job from `running` with every segment done to `assembling`. Exactly one of any
/// number of concurrent callers gets `true`; that one builds the outputs.
pub async fn claim_assembly(exec: impl PgExecutor<'_>, job: Uuid) -> Result<bool, DbError> {
    let sql = format!(
        "WITH upd AS (UPDATE jobs SET state = 'assembling' WHERE id = $1 AND state = 'running' \
         AND segments_done = segments_total RETURNING 1) {CHANGED}"
    );
    let row = sqlx::query(&sql).bind(job).fetch_one(exec).await?;
    changed(row, job)
}

/// Marks an assembling job done; `book_seconds` (the whole book, pauses included) becomes
/// its `audio_seconds`, as in `manifest.json`. `false` if the job was not assembling.
pub async fn finish_job(
    exec: impl PgExecutor<'_>,
    job: Uuid,
    book_seconds: f64,
) -> Result<bool, DbError> {
    let sql = format!(
        "WITH upd AS (UPDATE jobs SET state = 'done', finished_at = now(), audio_seconds = $2 \
         WHERE id = $1 AND state = 'assembling' RETURNING 1) {CHANGED}"
    );
    let row = sqlx::query(&sql)
        .bind(job)
        .bind(book_seconds)
        .fetch_one(exec)
        .await?;
    changed(row, job)
}

/// Ends a job that has not ended with an error; `kind` is an error's stable word.
/// `false` if it had already ended.
pub async fn fail_job(
    exec: impl PgExecutor<'_>,
    job: Uuid,
    kind: &str,
    reason: &str,
) -> Result<bool, DbError> {
    let sql = format!(
        "WITH upd AS (UPDATE jobs SET state = 'failed', finished_at = now(), failure_kind = $2, \
         failure_reason = $3 WHERE id = $1 AND state IN ('queued', 'running', 'assembling') \
         RETURNING 1) {CHANGED}"
    );
    let row = sqlx::query(&sql)
        .bind(job)
        .bind(kind)
        .bind(reason)
        .fetch_one(exec)
        .await?;
    changed(row, job)
}

/// Cancels a job that has not ended; workers skip its remaining segments. `false` if it
/// had already ended.
pub async fn cancel_job(exec: impl PgExecutor<'_>, job: Uuid) -> Result<bool, DbError> {
    let sql = format!(
        "WITH upd AS (UPDATE jobs SET state = 'cancelled', finished_at = now() \
         WHERE id = $1 AND state IN ('queued', 'running', 'assembling') RETURNING 1) {CHANGED}"
    );
    let row = sqlx::query(&sql).bind(job).fetch_one(exec).await?;
    changed(row, job)
}

/// One row of the `job_status` view, with the request's name and metadata from `jobs`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct JobSummary {
    /// Job id.
    pub job_id: Uuid,
    /// The plan's content digest.
    pub content_id: String,
    /// Book title.
    pub title: String,
    /// Input as given.
    pub source: String,
    /// Voice.
    pub voice: String,
    /// Output format.
    pub format: String,
    /// Priority.
    pub priority: i32,
    /// State.
    pub state: JobState,
    /// Segments in the job.
    pub segments_total: u32,
    /// Segments recorded done.
    pub segments_done: u32,
    /// Segments recorded failed.
    pub segments_failed: u64,
    /// Audio made so far (the whole book's once done).
    pub audio_seconds: f64,
    /// Speech made so far, pauses excluded.
    pub speech_seconds: f64,
    /// Processing wall time so far; `None` before the first segment.
    pub wall_seconds: Option<f64>,
    /// `wall_seconds / audio_seconds`; `None` while there is no audio.
    pub rtf: Option<f64>,
    /// Submit → end; `None` until the job ends.
    pub latency_seconds: Option<f64>,
    /// Error word if failed.
    pub failure_kind: Option<String>,
    /// Readable reason if failed.
    pub failure_reason: Option<String>,
    /// Submitted.
    pub created_at: DateTime<Utc>,
    /// First segment's synthesis began.
    pub started_at: Option<DateTime<Utc>>,
    /// Ended.
    pub finished_at: Option<DateTime<Utc>>,
    /// The name of the producer's request that made the job (its AMQP `message_id` or
    /// `idempotency_key`; docs/PRODUCERS.md), if one did.
    pub request_key: Option<String>,
    /// The producer's metadata kept with the job.
    pub request_metadata: Option<serde_json::Value>,
    /// Its tenant (`narrator serve`'s), if it has one.
    pub tenant: Option<String>,
}

/// A chapter's progress.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChapterProgress {
    /// Chapter index, from 0.
    pub index: u32,
    /// Title.
    pub title: String,
    /// Its segments.
    pub segments_total: u32,
    /// Its segments recorded done.
    pub segments_done: u32,
    /// Audio of its done segments.
    pub audio_seconds: f64,
}

/// What `narrator status` shows: the summary, chapters and warnings.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct JobStatus {
    /// The `job_status` row.
    #[serde(flatten)]
    pub summary: JobSummary,
    /// Per-chapter progress, in order.
    pub chapters: Vec<ChapterProgress>,
    /// Warnings from reading the input.
    pub warnings: Vec<String>,
    /// For a job that has not ended: what it is waiting on, when anything but its turn
    /// (no worker alive, no progress, a rescue, a postponed or orphaned assembly).
    pub waiting: Option<String>,
}

/// Seconds after which a worker row counts as gone (6 default heartbeats).
const WORKER_GONE_S: f64 = 30.0;

/// What an unfinished job waits on, from its row's bookkeeping.
fn waiting(row: &PgRow, state: JobState) -> Result<Option<String>, DbError> {
    let live_workers: i64 = row.try_get("live_workers")?;
    let idle: f64 = row.try_get("idle_seconds")?;
    let rescues: i32 = row.try_get("rescues")?;
    let retry_at: Option<DateTime<Utc>> = row.try_get("assembly_retry_at")?;
    let attempts: i32 = row.try_get("assembly_attempts")?;
    let error: Option<String> = row.try_get("assembly_error")?;
    let assembler: Option<String> = row.try_get("assembler")?;
    let assembler_alive: Option<bool> = row.try_get("assembler_alive")?;
    let done: i32 = row.try_get("segments_done")?;
    let total: i32 = row.try_get("segments_total")?;
    Ok(match state {
        JobState::Queued | JobState::Running | JobState::Assembling if live_workers == 0 => {
            Some(format!(
                "no worker has been seen for {WORKER_GONE_S:.0} s: start one (`narrator worker`) with this database"
            ))
        }
        JobState::Running if done == total => match retry_at {
            Some(at) => Some(format!(
                "assembly failed for now ({}: {}); next try at {}",
                if attempts == 0 {
                    "an outage, not counted as a try".to_string()
                } else {
                    format!("try {attempts}")
                },
                error.unwrap_or_default(),
                at.format("%H:%M:%S UTC")
            )),
            None => Some("every segment is done; waiting for a worker to assemble it".into()),
        },
        JobState::Queued | JobState::Running if rescues > 0 => Some(format!(
            "no progress for {idle:.0} s; its missing segments were published again {rescues} time(s)"
        )),
        JobState::Queued | JobState::Running if idle >= 60.0 => Some(format!(
            "no segment finished for {idle:.0} s: behind other jobs in the queue, or a service is down \
             (see `narrator workers`); after the workers' lease its missing segments are published again"
        )),
        JobState::Assembling if assembler_alive != Some(true) => Some(format!(
            "its assembler {} is gone; another worker takes the assembly over",
            assembler.unwrap_or_default()
        )),
        _ => None,
    })
}

fn summary(row: &PgRow) -> Result<JobSummary, DbError> {
    let state: String = row.try_get("state")?;
    Ok(JobSummary {
        job_id: row.try_get("id")?,
        content_id: row.try_get("content_id")?,
        title: row.try_get("title")?,
        source: row.try_get("source")?,
        voice: row.try_get("voice")?,
        format: row.try_get("format")?,
        priority: row.try_get("priority")?,
        state: JobState::parse(&state)?,
        segments_total: unsigned(
            "segments_total",
            row.try_get::<i32, _>("segments_total")?.into(),
        )?,
        segments_done: unsigned(
            "segments_done",
            row.try_get::<i32, _>("segments_done")?.into(),
        )?,
        segments_failed: unsigned("segments_failed", row.try_get("segments_failed")?)?,
        audio_seconds: row.try_get("audio_seconds")?,
        speech_seconds: row.try_get("speech_seconds")?,
        wall_seconds: row.try_get("wall_seconds")?,
        rtf: row.try_get("rtf")?,
        latency_seconds: row.try_get("latency_seconds")?,
        failure_kind: row.try_get("failure_kind")?,
        failure_reason: row.try_get("failure_reason")?,
        created_at: row.try_get("created_at")?,
        started_at: row.try_get("started_at")?,
        finished_at: row.try_get("finished_at")?,
        request_key: row.try_get("request_key")?,
        request_metadata: row
            .try_get::<Option<Json<serde_json::Value>>, _>("request_metadata")?
            .map(|Json(v)| v),
        tenant: row.try_get("tenant")?,
    })
}

/// Just the job's state (one indexed row): for waiting on a job without the cost of
/// [`job_status`]'s per-chapter progress. `None`: no such job.
pub async fn job_state(exec: impl PgExecutor<'_>, job: Uuid) -> Result<Option<JobState>, DbError> {
    let state: Option<String> = sqlx::query_scalar("SELECT state FROM jobs WHERE id = $1")
        .bind(job)
        .fetch_optional(exec)
        .await?;
    state.as_deref().map(JobState::parse).transpose()
}

/// A job's status with per-chapter progress; `None` if there is no such job. One row
/// read: the progress is kept on the job's row, so a poll costs the same for any book.
pub async fn job_status(
    exec: impl PgExecutor<'_>,
    job: Uuid,
) -> Result<Option<JobStatus>, DbError> {
    let row = sqlx::query(
        "SELECT v.*, j.chapters, j.warnings, j.chapter_done, j.chapter_audio, j.rescues, \
           j.assembly_retry_at, j.assembly_attempts, j.assembly_error, j.assembler, \
           j.request_key, j.request_metadata, j.tenant, \
           EXTRACT(EPOCH FROM now() - greatest(j.created_at, j.progress_at, j.rescued_at))::float8 \
             AS idle_seconds, \
           (SELECT count(*) FROM workers w \
            WHERE w.last_seen > now() - make_interval(secs => $2)) AS live_workers, \
           (SELECT w.last_seen > now() - make_interval(secs => $2) \
                   AND w.instance IS NOT DISTINCT FROM j.assembler_instance \
            FROM workers w WHERE w.id = j.assembler) AS assembler_alive \
         FROM job_status v JOIN jobs j ON j.id = v.id WHERE v.id = $1",
    )
    .bind(job)
    .bind(WORKER_GONE_S)
    .fetch_optional(exec)
    .await?;
    let Some(row) = row else { return Ok(None) };
    let Json(plans): Json<Vec<ChapterPlan>> = row.try_get("chapters")?;
    let Json(warnings): Json<Vec<String>> = row.try_get("warnings")?;
    // Kept on the job's row by record_segments; shorter than the chapter list until the
    // later chapters have progress.
    let done: Vec<i32> = row.try_get("chapter_done")?;
    let audio: Vec<f64> = row.try_get("chapter_audio")?;
    let chapters = plans
        .into_iter()
        .enumerate()
        .map(|(i, c)| {
            Ok(ChapterProgress {
                index: u32::try_from(i).unwrap_or(u32::MAX),
                title: c.title,
                segments_total: c.segment_count,
                segments_done: unsigned("chapter_done", done.get(i).copied().unwrap_or(0).into())?,
                audio_seconds: audio.get(i).copied().unwrap_or(0.0),
            })
        })
        .collect::<Result<Vec<_>, DbError>>()?;
    let summary = summary(&row)?;
    let waiting = waiting(&row, summary.state)?;
    Ok(Some(JobStatus {
        summary,
        chapters,
        warnings,
        waiting,
    }))
}

/// The most recent jobs, newest first.
pub async fn list_jobs(exec: impl PgExecutor<'_>, limit: u32) -> Result<Vec<JobSummary>, DbError> {
    sqlx::query(
        "SELECT v.*, j.request_key, j.request_metadata, j.tenant \
         FROM job_status v JOIN jobs j ON j.id = v.id \
         ORDER BY v.created_at DESC, v.id LIMIT $1",
    )
    .bind(i64::from(limit))
    .fetch_all(exec)
    .await?
    .iter()
    .map(summary)
    .collect()
}

/// Which jobs [`list_tenant_jobs`] returns.
#[derive(Debug, Clone, Default)]
pub struct TenantJobs<'a> {
    pub tenant: &'a str,
    pub state: Option<JobState>,
    pub voice: Option<&'a str>,
    /// Only jobs after this one in the order (newest first): the last of the page before.
    pub after: Option<Uuid>,
    pub limit: u32,
}

/// A tenant's jobs, newest first (`narrator serve`'s fleet gateway).
pub async fn list_tenant_jobs(
    exec: impl PgExecutor<'_>,
    q: &TenantJobs<'_>,
) -> Result<Vec<JobSummary>, DbError> {
    sqlx::query(
        "SELECT v.*, j.request_key, j.request_metadata, j.tenant \
         FROM jobs j JOIN job_status v ON v.id = j.id \
         WHERE j.tenant = $1 \
           AND ($2::text IS NULL OR j.state = $2) \
           AND ($3::text IS NULL OR j.voice = $3) \
           AND ($4::uuid IS NULL OR (j.created_at, j.id) < \
                (SELECT created_at, id FROM jobs WHERE id = $4)) \
         ORDER BY j.created_at DESC, j.id DESC LIMIT $5",
    )
    .bind(q.tenant)
    .bind(q.state.map(JobState::as_str))
    .bind(q.voice)
    .bind(q.after)
    .bind(i64::from(q.limit))
    .fetch_all(exec)
    .await?
    .iter()
    .map(summary)
    .collect()
}
