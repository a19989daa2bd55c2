//! Embedded jobs: books the server makes itself, in its data folder, with the engine it
//! loaded, through the same library path as `narrator run`
//! ([`narrator_pipeline::embedded::make_book`]: the same outputs, the same resume) and
//! read and checked as the fleet's intake reads a request
//! ([`narrator_worker::intake::plan_request`]).
//!
//! `DATA/jobs/ID/`: `job.json` (the job as the API shows it, rewritten atomically on every
//! change of state), `request.json` (the request without its text), `book.EXT` (the
//! text or the uploaded file), `out/` (the book's folder, and its work folder while it is
//! made). On start every job left queued or running is queued again, oldest first; a
//! running one resumes from the segments its work folder kept.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use axum::http::StatusCode;
use chrono::{DateTime, Utc};
use narrator_engine::Voice;
use narrator_pipeline::Event;
use narrator_pipeline::embedded::{BookEngine, BookJob, Stopped, make_book, worker_name};
use narrator_pipeline::synth::Synthesizer;
use narrator_text::InputFormat;
use narrator_worker::intake::{BookBytes, JobRequest, RequestError, plan_request};
use serde::{Deserialize, Serialize};
use tokio::sync::{broadcast, mpsc, watch};
use uuid::Uuid;

pub use narrator_db::JobState;

use crate::ApiError;

/// The states of a job, as the API words them.
#[derive(utoipa::ToSchema)]
#[schema(as = JobState)]
#[allow(dead_code, non_camel_case_types)]
pub(crate) enum JobStateDoc {
    queued,
    running,
    assembling,
    done,
    failed,
    cancelled,
}

/// Why a job failed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct JobFailure {
    pub code: String,
    pub message: String,
}

/// One file of a finished job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct JobOutput {
    /// What it is: `book`, `chapter`, `subtitles`, `timings`, `epub`, `manifest`.
    pub kind: String,
    /// Its name in `GET /v1/jobs/{id}/outputs/{name}` (the book's and the manifest's are
    /// also reachable as `book` and `manifest`).
    pub name: String,
    /// Its path on this server.
    pub url: String,
    /// Duration, for audio.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seconds: Option<f64>,
    /// The chapter's title, for a chapter file.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
}

/// A job, as `GET /v1/jobs/{id}` shows it and `job.json` keeps it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Job {
    pub id: Uuid,
    #[schema(value_type = JobStateDoc)]
    pub state: JobState,
    /// Whose job it is (the token's tenant; `local` without tokens).
    pub tenant: String,
    pub title: String,
    pub voice: String,
    /// The audio format's extension.
    pub format: String,
    /// Where the book came from: `upload:NAME` or `text`.
    pub source: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<serde_json::Map<String, serde_json::Value>>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    /// Segments in the book, and how many are made.
    pub segments: usize,
    pub segments_done: usize,
    /// Segments the latest run found made by an earlier one (a restart's, or before a
    /// cancel and retry) and did not make again.
    #[serde(default)]
    pub segments_resumed: usize,
    /// Audio made so far (the book's length once done).
    pub audio_seconds: f64,
    /// Wall time spent on it, all runs together (once done).
    pub wall_seconds: f64,
    /// `wall_seconds / audio_seconds`, once done.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rtf: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<JobFailure>,
    /// Its files, once done.
    pub outputs: Vec<JobOutput>,
    /// Warnings about the input.
    #[serde(default)]
    pub warnings: Vec<String>,
}

/// What the server runs jobs with.
pub struct JobEngine {
    /// The voice loaded (a job must ask for it, or for none).
    pub voice: Voice,
    /// Where voices are looked up.
    pub voices_dir: PathBuf,
    pub synth: Arc<Synthesizer>,
    /// Batches kept in flight for one job.
    pub in_flight: usize,
    /// The largest book accepted, in bytes.
    pub max_input_bytes: u64,
}

/// A book handed in: a request and its book's bytes (`text` already taken out of it).
pub struct Submission {
    pub request: JobRequest,
    pub book: Vec<u8>,
    pub format: InputFormat,
    /// `upload:NAME` or `text`.
    pub source: String,
    /// The title when neither the book nor the request has one.
    pub fallback_title: String,
}

/// What `GET /v1/jobs` filters by.
#[derive(Debug, Default, Clone)]
pub struct ListFilter {
    pub state: Option<JobState>,
    pub voice: Option<String>,
    /// At most this many (1 to 100).
    pub limit: usize,
    /// The id of the last job of the previous page.
    pub after: Option<Uuid>,
}

/// The jobs of this server.
pub struct Jobs {
    dir: PathBuf,
    engine: JobEngine,
    jobs: Mutex<HashMap<Uuid, Job>>,
    /// Every change of every job.
    changes: broadcast::Sender<Job>,
    queue: mpsc::UnboundedSender<Uuid>,
    /// The stop signals of the jobs being made.
    running: Mutex<HashMap<Uuid, watch::Sender<bool>>>,
    /// Set when the server stops: a stopped job goes back to the queue, not to cancelled.
    closing: watch::Sender<bool>,
}

/// `job.json`, `request.json` and the book.
const JOB_FILE: &str = "job.json";
const REQUEST_FILE: &str = "request.json";

impl Jobs {
    /// Opens the jobs kept in `data/jobs` (queuing again those left queued or running) and
    /// starts `runners` jobs' runners.
    pub fn open(data: &Path, engine: JobEngine, runners: usize) -> anyhow::Result<Arc<Self>> {
        let dir = data.join("jobs");
        std::fs::create_dir_all(&dir).map_err(|e| {
            anyhow::anyhow!(
                "cannot create {}: {e}; choose a writable --data folder",
                dir.display()
            )
        })?;
        let mut jobs = HashMap::new();
        for entry in std::fs::read_dir(&dir)? {
            let path = entry?.path().join(JOB_FILE);
            let Ok(bytes) = std::fs::read(&path) else {
                continue;
            };
            match serde_json::from_slice::<Job>(&bytes) {
                Ok(job) => {
                    jobs.insert(job.id, job);
                }
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "a job file that does not read is left alone")
                }
            }
        }
        let mut waiting: Vec<&mut Job> =
            jobs.values_mut().filter(|j| !j.state.is_final()).collect();
        waiting.sort_by_key(|j| j.created_at);
        let (queue, rx) = mpsc::unbounded_channel();
        for job in waiting {
            job.state = JobState::Queued;
            let _ = queue.send(job.id);
        }
        let jobs = Arc::new(Jobs {
            dir,
            engine,
            jobs: Mutex::new(jobs),
            changes: broadcast::channel(256).0,
            queue,
            running: Mutex::new(HashMap::new()),
            closing: watch::channel(false).0,
        });
        let rx = Arc::new(tokio::sync::Mutex::new(rx));
        for _ in 0..runners.max(1) {
            let (jobs, rx) = (jobs.clone(), rx.clone());
            tokio::spawn(async move {
                loop {
                    let Some(id) = rx.lock().await.recv().await else {
                        return;
                    };
                    if *jobs.closing.borrow() {
                        return;
                    }
                    jobs.run(id).await;
                }
            });
        }
        Ok(jobs)
    }

    /// Whether a file can be made in the jobs' folder now.
    pub fn check_writable(&self) -> std::io::Result<()> {
        let probe = self.dir.join(".ready");
        std::fs::write(&probe, b"")?;
        std::fs::remove_file(probe)
    }

    /// The voice jobs are read with.
    pub fn voice(&self) -> &Voice {
        &self.engine.voice
    }

    fn folder(&self, id: Uuid) -> PathBuf {
        self.dir.join(id.to_string())
    }

    /// Checks, plans and records a book; it is queued. A request with an idempotency key
    /// this tenant used before answers that job (and `false`: not created).
    pub async fn submit(&self, tenant: &str, mut s: Submission) -> Result<(Job, bool), ApiError> {
        if let Some(key) = &s.request.idempotency_key
            && let Some(job) = self.with_jobs(|jobs| {
                jobs.values()
                    .find(|j| j.tenant == tenant && j.idempotency_key.as_ref() == Some(key))
                    .cloned()
            })
        {
            return Ok((job, false));
        }
        let voice = self.engine.voice.name.clone();
        match &s.request.voice {
            Some(v) if *v != voice => {
                return Err(ApiError::bad(
                    "unknown_voice",
                    format!(
                        "voice {v:?} is not loaded by this server; ask for {voice:?} (GET /v1/voices)"
                    ),
                ));
            }
            _ => s.request.voice = Some(voice.clone()),
        }
        // Read and planned now, so a bad book is refused here and not failed later.
        let (request, book) = (s.request.clone(), s.book.clone());
        let book = BookBytes {
            bytes: book,
            format: s.format,
            source: s.source.clone(),
            fallback_title: s.fallback_title.clone(),
        };
        let (voices_dir, max) = (self.engine.voices_dir.clone(), self.engine.max_input_bytes);
        let planned =
            tokio::task::spawn_blocking(move || plan_request(&request, book, &voices_dir, max))
                .await
                .map_err(|e| {
                    ApiError::with(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "internal",
                        format!("planning the book failed: {e}"),
                    )
                })?
                .map_err(refused)?;
        let now = Utc::now();
        let job = Job {
            id: Uuid::new_v4(),
            state: JobState::Queued,
            tenant: tenant.to_string(),
            title: planned.plan.title.clone(),
            voice,
            format: planned.format.clone(),
            source: s.source.clone(),
            idempotency_key: s.request.idempotency_key.clone(),
            metadata: s.request.metadata.clone(),
            created_at: now,
            updated_at: now,
            segments: planned.plan.segments.len(),
            segments_done: 0,
            segments_resumed: 0,
            audio_seconds: 0.0,
            wall_seconds: 0.0,
            rtf: None,
            error: None,
            outputs: Vec::new(),
            warnings: Vec::new(),
        };
        let folder = self.folder(job.id);
        let stored = (|| -> anyhow::Result<()> {
            std::fs::create_dir_all(&folder)?;
            std::fs::write(folder.join(book_file(s.format)), &s.book)?;
            write_atomically(
                &folder.join(REQUEST_FILE),
                &serde_json::to_vec_pretty(&s.request)?,
            )?;
            write_atomically(&folder.join(JOB_FILE), &serde_json::to_vec_pretty(&job)?)?;
            Ok(())
        })();
        if let Err(e) = stored {
            let _ = std::fs::remove_dir_all(&folder);
            return Err(ApiError::with(
                StatusCode::INSUFFICIENT_STORAGE,
                "storage_full",
                format!(
                    "cannot store the job in {}: {e:#}; free space in the server's --data folder",
                    self.dir.display()
                ),
            ));
        }
        self.with_jobs(|jobs| jobs.insert(job.id, job.clone()));
        let _ = self.changes.send(job.clone());
        let _ = self.queue.send(job.id);
        Ok((job, true))
    }

    fn with_jobs<T>(&self, f: impl FnOnce(&mut HashMap<Uuid, Job>) -> T) -> T {
        let mut jobs = self.jobs.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut jobs)
    }

    /// Changes a job and tells its watchers; `keep` writes `job.json` too.
    fn update(&self, id: Uuid, keep: bool, f: impl FnOnce(&mut Job)) -> Option<Job> {
        let job = self.with_jobs(|jobs| {
            let job = jobs.get_mut(&id)?;
            f(job);
            job.updated_at = Utc::now();
            Some(job.clone())
        })?;
        if keep {
            let path = self.folder(id).join(JOB_FILE);
            let kept = serde_json::to_vec_pretty(&job)
                .map_err(anyhow::Error::from)
                .and_then(|b| write_atomically(&path, &b));
            if let Err(e) = kept {
                tracing::warn!(job = %id, error = %e, "could not keep the job's state");
            }
        }
        let _ = self.changes.send(job.clone());
        Some(job)
    }

    /// A tenant's job (another tenant's is not found).
    pub fn get(&self, tenant: &str, id: Uuid) -> Result<Job, ApiError> {
        self.with_jobs(|jobs| jobs.get(&id).filter(|j| j.tenant == tenant).cloned())
            .ok_or_else(|| not_found(id))
    }

    /// A tenant's jobs, newest first, and the cursor of the next page.
    pub fn list(&self, tenant: &str, f: &ListFilter) -> (Vec<Job>, Option<Uuid>) {
        let mut all: Vec<Job> = self.with_jobs(|jobs| {
            jobs.values()
                .filter(|j| j.tenant == tenant)
                .filter(|j| f.state.is_none_or(|s| j.state == s))
                .filter(|j| f.voice.as_ref().is_none_or(|v| &j.voice == v))
                .cloned()
                .collect()
        });
        all.sort_by(|a, b| b.created_at.cmp(&a.created_at).then(b.id.cmp(&a.id)));
        let start = match f.after {
            Some(after) => all
                .iter()
                .position(|j| j.id == after)
                .map_or(all.len(), |i| i + 1),
            None => 0,
        };
        let page: Vec<Job> = all.into_iter().skip(start).take(f.limit + 1).collect();
        if page.len() > f.limit {
            let page = page[..f.limit].to_vec();
            let next = page.last().map(|j| j.id);
            (page, next)
        } else {
            (page, None)
        }
    }

    /// Every change of every job, from now on.
    pub fn watch(&self) -> broadcast::Receiver<Job> {
        self.changes.subscribe()
    }

    /// Cancels a job: a queued one at once, one being made once its batches in flight
    /// are stored (its segments kept for a retry).
    pub fn cancel(&self, tenant: &str, id: Uuid) -> Result<Job, ApiError> {
        let job = self.get(tenant, id)?;
        match job.state {
            JobState::Queued => Ok(self
                .update(id, true, |j| j.state = JobState::Cancelled)
                .unwrap_or(job)),
            JobState::Running | JobState::Assembling => {
                if let Some(stop) = self
                    .running
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .get(&id)
                {
                    let _ = stop.send(true);
                }
                Ok(job)
            }
            JobState::Cancelled => Ok(job),
            JobState::Done | JobState::Failed => Err(ApiError::with(
                StatusCode::CONFLICT,
                "job_finished",
                format!(
                    "job {id} is {} already; nothing to cancel",
                    job.state.as_str()
                ),
            )),
        }
    }

    /// Queues a failed or cancelled job again (what it made is kept and resumed).
    pub fn retry(&self, tenant: &str, id: Uuid) -> Result<Job, ApiError> {
        let job = self.get(tenant, id)?;
        if !matches!(job.state, JobState::Failed | JobState::Cancelled) {
            return Err(ApiError::with(
                StatusCode::CONFLICT,
                "job_not_retryable",
                format!(
                    "job {id} is {}; only a failed or cancelled job is retried",
                    job.state.as_str()
                ),
            ));
        }
        let job = self
            .update(id, true, |j| {
                j.state = JobState::Queued;
                j.error = None;
            })
            .unwrap_or(job);
        let _ = self.queue.send(id);
        Ok(job)
    }

    /// Removes a finished, failed or cancelled job and its files.
    pub fn delete(&self, tenant: &str, id: Uuid) -> Result<(), ApiError> {
        let job = self.get(tenant, id)?;
        if !job.state.is_final() {
            return Err(ApiError::with(
                StatusCode::CONFLICT,
                "job_active",
                format!(
                    "job {id} is {}; cancel it first, then delete it",
                    job.state.as_str()
                ),
            ));
        }
        self.with_jobs(|jobs| jobs.remove(&id));
        std::fs::remove_dir_all(self.folder(id)).map_err(|e| {
            ApiError::with(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                format!("removing job {id}'s files: {e}"),
            )
        })
    }

    /// The file of a done job's output `name` (`book`, `manifest`, or a file name its
    /// outputs list).
    pub fn output(&self, tenant: &str, id: Uuid, name: &str) -> Result<PathBuf, ApiError> {
        let job = self.get(tenant, id)?;
        if job.state != JobState::Done {
            return Err(not_done(id, job.state));
        }
        let file = match name {
            "manifest" => Some("manifest.json"),
            "book" => job
                .outputs
                .iter()
                .find(|o| o.kind == "book")
                .map(|o| o.name.as_str()),
            _ => job
                .outputs
                .iter()
                .find(|o| o.name == name)
                .map(|o| o.name.as_str()),
        }
        .ok_or_else(|| no_such_output(id, name))?;
        Ok(self.folder(id).join("out").join(file))
    }

    /// Stops taking jobs; the jobs being made stop once their batches in flight are
    /// stored, and are queued again when the server starts.
    pub async fn close(&self) {
        let _ = self.closing.send(true);
        let stops: Vec<_> = self
            .running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect();
        for s in &stops {
            let _ = s.send(true);
        }
        // The runners end their jobs as queued; wait for them (bounded: the batches in
        // flight are seconds).
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
        while !self
            .running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_empty()
            && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }

    /// Makes one queued job.
    async fn run(self: &Arc<Self>, id: Uuid) {
        let Some(job) = self.with_jobs(|jobs| jobs.get(&id).cloned()) else {
            return; // deleted
        };
        if job.state != JobState::Queued {
            return; // cancelled while queued
        }
        let (stop_tx, stop_rx) = watch::channel(false);
        self.running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, stop_tx);
        let outcome = self.make(id, stop_rx).await;
        let closing = *self.closing.borrow();
        self.update(id, true, |j| match outcome {
            Ok(made) => {
                let m = &made.manifest;
                j.state = JobState::Done;
                j.segments_done = j.segments;
                j.audio_seconds = m.audio_seconds;
                j.wall_seconds = m.wall_seconds;
                j.rtf = Some(m.rtf);
                j.outputs = outputs_of(id, m);
                j.warnings = m.warnings.clone();
            }
            Err(e) if e.downcast_ref::<Stopped>().is_some() => {
                j.state = if closing {
                    JobState::Queued
                } else {
                    JobState::Cancelled
                };
            }
            Err(e) => {
                tracing::warn!(job = %id, error = format!("{e:#}"), "job failed");
                j.state = JobState::Failed;
                j.error = Some(JobFailure {
                    code: "failed".into(),
                    message: format!("{e:#}").replace('\n', " "),
                });
            }
        });
        self.running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&id);
    }

    /// Reads, plans and makes job `id`'s book in its folder.
    async fn make(
        self: &Arc<Self>,
        id: Uuid,
        stop: watch::Receiver<bool>,
    ) -> anyhow::Result<narrator_pipeline::embedded::MadeBook> {
        let folder = self.folder(id);
        let request: JobRequest =
            serde_json::from_slice(&std::fs::read(folder.join(REQUEST_FILE))?)?;
        let job = self.get_any(id)?;
        let format = [InputFormat::Epub, InputFormat::Markdown, InputFormat::Text]
            .into_iter()
            .find(|f| folder.join(book_file(*f)).exists())
            .ok_or_else(|| anyhow::anyhow!("the job's book is gone from {}", folder.display()))?;
        let book = BookBytes {
            bytes: std::fs::read(folder.join(book_file(format)))?,
            format,
            source: job.source.clone(),
            fallback_title: job.title.clone(),
        };
        let (voices_dir, max) = (self.engine.voices_dir.clone(), self.engine.max_input_bytes);
        let planned = tokio::task::spawn_blocking(move || {
            plan_request(&request, book, &voices_dir, max).map_err(|e| anyhow::anyhow!(e.message))
        })
        .await??;
        let settings = &planned.settings;
        let pauses = narrator_audio::Pauses {
            sentence_ms: settings.sentence_pause_ms,
            paragraph_ms: settings.paragraph_pause_ms,
            chapter_ms: settings.chapter_pause_ms,
        };
        self.update(id, true, |j| {
            j.state = JobState::Running;
            j.segments = planned.plan.segments.len();
        });
        let book = BookJob {
            plan: planned.plan,
            out: folder.join("out"),
            outputs: planned.outputs,
            pauses,
            keep_work: false,
            worker: worker_name(),
            stop: Some(stop),
        };
        let engine = || {
            Ok(BookEngine {
                synth: self.engine.synth.clone(),
                in_flight: self.engine.in_flight,
                plan: None,
            })
        };
        let jobs = Arc::downgrade(self);
        let observe = Arc::new(move |e: &Event| {
            let Some(jobs) = jobs.upgrade() else { return };
            match e {
                Event::Started {
                    total,
                    done,
                    done_audio_seconds,
                } => {
                    jobs.update(id, false, |j| {
                        j.segments = *total;
                        j.segments_done = *done;
                        j.segments_resumed = *done;
                        // (+ 0.0: an empty sum is -0.0)
                        j.audio_seconds = *done_audio_seconds + 0.0;
                    });
                }
                Event::SegmentDone { record } => {
                    jobs.update(id, false, |j| {
                        j.segments_done += 1;
                        j.audio_seconds += record.audio_seconds;
                    });
                }
                Event::Assembling => {
                    jobs.update(id, true, |j| j.state = JobState::Assembling);
                }
                Event::Warning(w) => {
                    let w = w.clone();
                    jobs.update(id, false, |j| j.warnings.push(w));
                }
            }
        });
        make_book(book, engine, observe).await
    }

    fn get_any(&self, id: Uuid) -> anyhow::Result<Job> {
        self.with_jobs(|jobs| jobs.get(&id).cloned())
            .ok_or_else(|| anyhow::anyhow!("job {id} was deleted"))
    }
}

/// The outputs a manifest lists, as the API names them.
fn outputs_of(id: Uuid, m: &narrator_core::Manifest) -> Vec<JobOutput> {
    let entry = |kind: &str, name: &str, seconds: Option<f64>, title: Option<&str>| JobOutput {
        kind: kind.into(),
        name: name.into(),
        url: format!("/v1/jobs/{id}/outputs/{name}"),
        seconds,
        title: title.map(str::to_string),
    };
    let mut out = vec![entry(
        "book",
        &m.book.file,
        Some(m.book.seconds),
        Some(&m.book.title),
    )];
    for s in &m.book.subtitles {
        out.push(entry("subtitles", s, None, None));
    }
    if let Some(t) = &m.book.timings {
        out.push(entry("timings", t, None, None));
    }
    if let Some(e) = &m.book.epub {
        out.push(entry("epub", e, None, None));
    }
    for c in &m.chapters {
        if let Some(f) = &c.file {
            out.push(entry("chapter", f, Some(c.seconds), Some(&c.title)));
        }
        for s in &c.subtitles {
            out.push(entry("subtitles", s, None, None));
        }
    }
    out.push(entry("manifest", "manifest.json", None, None));
    out
}

fn book_file(format: InputFormat) -> &'static str {
    match format {
        InputFormat::Epub => "book.epub",
        InputFormat::Markdown => "book.md",
        InputFormat::Text => "book.txt",
    }
}

/// 404: no such output.
pub(crate) fn no_such_output(id: Uuid, name: &str) -> ApiError {
    ApiError::with(
        StatusCode::NOT_FOUND,
        "no_such_output",
        format!("job {id} has no output {name:?}; its outputs are listed in GET /v1/jobs/{id}"),
    )
}

/// 409: the outputs of a job not done.
pub(crate) fn not_done(id: Uuid, state: JobState) -> ApiError {
    ApiError::with(
        StatusCode::CONFLICT,
        "job_not_done",
        format!(
            "job {id} is {}; its outputs come once it is done (GET /v1/jobs/{id}/events tells when)",
            state.as_str()
        ),
    )
}

/// 404: no such job (or another tenant's).
pub(crate) fn not_found(id: Uuid) -> ApiError {
    ApiError::with(
        StatusCode::NOT_FOUND,
        "job_not_found",
        format!("no job {id} here; list yours with GET /v1/jobs"),
    )
}

/// A request the intake's checks refuse, with the status its code calls for.
pub fn refused(e: RequestError) -> ApiError {
    let status = match e.code {
        "too_large" => StatusCode::PAYLOAD_TOO_LARGE,
        "unreadable_book" => StatusCode::UNPROCESSABLE_ENTITY,
        "internal" => StatusCode::INTERNAL_SERVER_ERROR,
        "unavailable" => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::BAD_REQUEST,
    };
    ApiError::with(status, e.code, e.message)
}

/// Writes `bytes` to `path` through a temporary file beside it, so a reader never sees
/// half of it.
fn write_atomically(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}
