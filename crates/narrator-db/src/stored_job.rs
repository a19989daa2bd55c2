//! A job as the workers read it back: the settings the producer chose ([`JobSettings`]),
//! the plan rebuilt from the rows for the assembler ([`load_job`], [`StoredJob`]), where
//! its segments are published ([`job_route`]) and the trace it belongs to ([`job_trace`]).

use narrator_core::{ChapterPlan, JobPlan};
use serde::{Deserialize, Serialize};
use sqlx::types::Json;
use sqlx::{PgExecutor, PgPool, Row};
use uuid::Uuid;

use crate::error::DbError;
use crate::jobs::JobState;
use crate::segments::segment_row;

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
    /// The scales the job's identity was hashed with (`submit --speed`, `--noise-scale`,
    /// `--noise-w` over the voice's defaults): every worker synthesizes its segments with
    /// exactly these, whatever its own flags. `None` (a job recorded before they were):
    /// the workers' own scales at `speed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scales: Option<narrator_core::Scales>,
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
            scales: None,
            epub3: None,
        }
    }
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
