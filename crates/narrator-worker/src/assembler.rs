//! Assembly: exactly one worker builds a finished job's outputs (chapters, whole book,
//! `manifest.json`) into S3 and marks it done. A claim names the claimer's process
//! instance, so a dead assembler's job is taken over even when its worker id comes back
//! in a new process. A transient failure (the database or the store away, a full temp
//! disk) puts the job back to be assembled again after a backoff; only a permanent cause
//! ends it `failed`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use narrator_audio::{AudioFormat, Pauses};
use narrator_core::{JobPlan, Manifest, RetryClass, SegmentRecord};
use narrator_db::{Output, PgPool, Uuid};
use narrator_pipeline::{AssembleOptions, PipelineError, assemble};
use narrator_s3::S3AudioStore;
use tokio::sync::{mpsc, watch};
use tracing::Instrument;

/// Transient assembly failures tolerated before the job fails (outages of a service do
/// not count: they are retried until the service is back).
pub const MAX_TRANSIENT_ASSEMBLIES: u32 = 8;

/// What the assembler works with.
pub struct Assembler {
    /// The database.
    pub pool: PgPool,
    /// The bucket.
    pub store: S3AudioStore,
    /// This worker's id.
    pub worker: String,
    /// This process's instance.
    pub instance: Uuid,
    /// A claim whose claimer's row is older than this is taken over.
    pub stale: Duration,
    /// Keep segment audio and packs once the outputs are stored.
    pub keep_intermediates: bool,
    /// A cancelled job's objects are deleted once it was cancelled this long ago (work
    /// in flight on it is over by then): the worker's lease.
    pub release_after: Duration,
    /// Reports an assembly past its budget.
    pub wedge: Arc<crate::liveness::Wedge>,
    /// The budget's floor ([`crate::liveness::assembly_budget`]).
    pub wedged_after: Duration,
    /// The output rate of each voice this worker serves, as its loaded voice says: a job
    /// with no segment recorded is made at its voice's.
    pub rates: std::collections::HashMap<String, u32>,
}

/// Cancelled jobs whose objects one sweep deletes at most.
const RELEASES_PER_SWEEP: i64 = 8;

/// Why an assembly did not finish, with how to retry it.
#[derive(Debug)]
pub struct AssemblyFailure {
    /// How to retry it.
    pub class: RetryClass,
    /// One line.
    pub message: String,
}

impl AssemblyFailure {
    fn new(class: RetryClass, e: impl std::fmt::Display) -> Self {
        Self {
            class,
            message: e.to_string().replace('\n', " "),
        }
    }
}

fn db(e: narrator_db::DbError) -> AssemblyFailure {
    AssemblyFailure::new(e.retry_class(), e)
}

/// Builds one job's outputs (the caller holds its assembly claim) and marks it done;
/// then deletes its intermediates unless asked to keep them.
pub async fn assemble_job(a: &Assembler, job: Uuid) -> Result<(), AssemblyFailure> {
    let (pool, store) = (&a.pool, &a.store);
    let started = Instant::now();
    let stored = narrator_db::load_job(pool, job).await.map_err(db)?;
    let records = narrator_db::finished_segments(pool, job)
        .await
        .map_err(db)?;
    let loaded = started.elapsed();
    if records.len() != stored.plan.segments.len() {
        return Err(AssemblyFailure::new(
            RetryClass::Permanent,
            format!(
                "job {job} has {} of {} segments recorded",
                records.len(),
                stored.plan.segments.len()
            ),
        ));
    }
    let wall_before = narrator_db::job_status(pool, job)
        .await
        .map_err(db)?
        .and_then(|s| s.summary.wall_seconds)
        .unwrap_or(0.0);
    let staging = tempfile::Builder::new()
        .prefix("narrator-assemble-")
        .tempdir()
        .map_err(|e| {
            AssemblyFailure::new(
                RetryClass::Infrastructure,
                format!("creating a staging folder for assembly: {e}"),
            )
        })?;
    let opts = assembly_options(a, job, &stored, &records, staging.path())?;
    let segments = records.len();
    let audio_seconds: f64 = records.iter().map(|r| r.audio_seconds).sum();
    let budget = crate::liveness::assembly_budget(audio_seconds, a.wedged_after);
    let built = assemble_in_background(stored.plan, records, store, opts, wall_before);
    let manifest = match tokio::time::timeout(budget, built).await {
        Ok(built) => built
            .map_err(|e| AssemblyFailure::new(e.retry_class(), format!("assembly failed: {e}")))?,
        Err(_) => {
            let reason = format!(
                "the assembly of job {job} ({audio_seconds:.0} s of audio) has run past its \
                 budget of {:.0} s; the encoder or the store is wedged",
                budget.as_secs_f64()
            );
            a.wedge.report("assembly", reason.clone());
            // Put back for another worker (settled as an outage: postponed, uncharged).
            return Err(AssemblyFailure::new(RetryClass::Infrastructure, reason));
        }
    };
    let job_text = job.to_string();
    let outputs = outputs_of(&manifest, store, &job_text, staging.path());
    let built = started.elapsed();
    let finished = narrator_db::finish_with_outputs(pool, job, manifest.audio_seconds, &outputs)
        .await
        .map_err(db)?;
    if !finished {
        release_unfinished(a, job).await?;
    }
    tracing::info!(
        %job,
        segments,
        load_s = loaded.as_secs_f64(),
        build_s = (built - loaded).as_secs_f64(),
        record_s = (started.elapsed() - built).as_secs_f64(),
        "assembled"
    );
    if finished && !a.keep_intermediates {
        // The outputs are stored and recorded: segment audio and packs (also those of
        // duplicates and of workers that died before recording) are no longer needed.
        match store.delete_intermediates(&job_text).await {
            Ok(n) => tracing::info!(%job, objects = n, "intermediates deleted"),
            Err(e) => tracing::warn!(%job, error = %e, "cannot delete the job's intermediates"),
        }
    }
    Ok(())
}

/// The assembly's options from what the job recorded: its format, chapter files, pauses,
/// subtitles and read-along EPUB, at the voice's rate. A setting that does not parse is
/// permanent.
fn assembly_options(
    a: &Assembler,
    job: Uuid,
    stored: &narrator_db::StoredJob,
    records: &[SegmentRecord],
    staging: &std::path::Path,
) -> Result<AssembleOptions, AssemblyFailure> {
    let format: AudioFormat = stored
        .format
        .parse()
        .map_err(|e| AssemblyFailure::new(RetryClass::Permanent, e))?;
    // The voice's rate: what its segments were recorded at (the audio there is), else,
    // none being recorded, the loaded voice's where this worker serves it.
    let sample_rate = records
        .first()
        .map(|r| r.sample_rate)
        .or_else(|| a.rates.get(&stored.plan.voice).copied())
        .ok_or_else(|| {
            AssemblyFailure::new(
                RetryClass::Permanent,
                format!(
                    "job {job} has no segment recorded and its voice {} is not served here: its rate is unknown",
                    stored.plan.voice
                ),
            )
        })?;
    Ok(AssembleOptions {
        format,
        sample_rate,
        chapter_files: stored.settings.chapter_files,
        pauses: Pauses {
            sentence_ms: stored.settings.sentence_pause_ms,
            paragraph_ms: stored.settings.paragraph_pause_ms,
            chapter_ms: stored.settings.chapter_pause_ms,
        },
        staging: staging.to_path_buf(),
        subtitles: stored
            .settings
            .subtitles
            .iter()
            .map(|f| f.parse())
            .collect::<Result<_, _>>()
            .map_err(|e| AssemblyFailure::new(RetryClass::Permanent, e))?,
        epub3: stored
            .settings
            .epub3
            .as_deref()
            .map(str::parse)
            .transpose()
            .map_err(|e| AssemblyFailure::new(RetryClass::Permanent, e))?,
    })
}

/// The outputs `manifest` names, as the job records them: the book, its chapters, the
/// subtitles, timings and EPUB, and the manifest, with their sizes in `staging`.
fn outputs_of(
    manifest: &Manifest,
    store: &S3AudioStore,
    job_text: &str,
    staging: &std::path::Path,
) -> Vec<Output> {
    let size = |name: &str| {
        std::fs::metadata(staging.join(name))
            .map(|m| m.len())
            .unwrap_or(0)
    };
    let mut outputs = vec![Output {
        key: store.output_key(job_text, &manifest.book.file),
        kind: "book".into(),
        name: manifest.book.file.clone(),
        seconds: manifest.book.seconds,
        bytes: size(&manifest.book.file),
    }];
    outputs.extend(manifest.chapters.iter().filter_map(|c| {
        let file = c.file.as_ref()?;
        Some(Output {
            key: store.output_key(job_text, file),
            kind: "chapter".into(),
            name: file.clone(),
            seconds: c.seconds,
            bytes: size(file),
        })
    }));
    let subtitles = (manifest.book.subtitles.iter().map(|f| (f, "subtitles")))
        .chain(manifest.book.timings.iter().map(|f| (f, "timings")))
        .chain(manifest.book.epub.iter().map(|f| (f, "epub")));
    let chapter_subtitles = manifest
        .chapters
        .iter()
        .flat_map(|c| c.subtitles.iter().map(|f| (f, "chapter subtitles")));
    outputs.extend(
        subtitles
            .chain(chapter_subtitles)
            .map(|(file, kind)| Output {
                key: store.output_key(job_text, file),
                kind: kind.into(),
                name: file.clone(),
                seconds: 0.0,
                bytes: size(file),
            }),
    );
    outputs.push(Output {
        key: store.output_key(job_text, "manifest.json"),
        kind: "manifest".into(),
        name: "manifest.json".into(),
        seconds: 0.0,
        bytes: size("manifest.json"),
    });
    outputs
}

/// After a finish that did not take: cancelled while it was assembled, what it stored is
/// nobody's (the sweep that releases cancelled jobs may already have run); taken over and
/// finished by another worker, the same keys are that worker's outputs, left alone.
async fn release_unfinished(a: &Assembler, job: Uuid) -> Result<(), AssemblyFailure> {
    let state = narrator_db::job_state(&a.pool, job).await.map_err(db)?;
    if state == Some(narrator_db::JobState::Cancelled) {
        match a.store.delete_job(&job.to_string()).await {
            Ok(n) => {
                tracing::info!(%job, objects = n, "assembled after a cancel; its objects are deleted")
            }
            Err(e) => {
                tracing::warn!(%job, error = %e, "cannot delete a cancelled job's objects; a sweep will")
            }
        }
    } else {
        tracing::warn!(%job, ?state, "assembled, but the job was no longer assembling");
    }
    Ok(())
}

/// Reads, encodes and uploads the outputs on a thread of its own at a lower priority
/// (the encoders' work is synchronous): where this worker's sessions keep every core busy
/// with other jobs' segments, encoding takes the cycles they leave instead of slowing them.
/// Reads and uploads still run on the runtime's threads.
async fn assemble_in_background(
    plan: JobPlan,
    records: Vec<SegmentRecord>,
    store: &S3AudioStore,
    opts: AssembleOptions,
    wall_before: f64,
) -> Result<Manifest, PipelineError> {
    let rt = tokio::runtime::Handle::current();
    let store = Arc::new(store.clone());
    let (tx, rx) = tokio::sync::oneshot::channel();
    let span = tracing::Span::current();
    let spawned = std::thread::Builder::new()
        .name("assembler".into())
        .spawn(move || {
            if let Err(e) = narrator_hardware::threads::lower_current_thread_priority() {
                tracing::debug!(error = %e, "could not lower the assembler thread's priority");
            }
            let built =
                rt.block_on(assemble(&plan, &records, &store, &opts, wall_before).instrument(span));
            // The receiver is gone only when the worker stopped waiting (shutdown).
            let _ = tx.send(built);
        });
    if let Err(e) = spawned {
        return Err(PipelineError::Task(format!(
            "cannot start the assembler thread: {e}"
        )));
    }
    rx.await.unwrap_or_else(|_| {
        Err(PipelineError::Task(
            "the assembler thread ended without a result (it panicked)".into(),
        ))
    })
}

/// What happens to a job whose assembly failed: failed for good, or postponed. This
/// process holds the claim, so nobody else would take the job over while it lives: when
/// the database is away too, it keeps trying (with backoff) until it is back or the
/// worker stops (then the claim goes stale and another worker takes it).
async fn settle_failure(
    a: &Assembler,
    job: Uuid,
    failure: AssemblyFailure,
    stop: &mut watch::Receiver<bool>,
) {
    let mut tries = 0;
    loop {
        match try_settle(a, job, &failure).await {
            Ok(()) => return,
            Err(e) => {
                tries += 1;
                if tries == 1 {
                    tracing::warn!(%job, error = %e, "cannot record the assembly's failure; trying until the database is back");
                }
                tokio::select! {
                    _ = stop.wait_for(|v| *v) => return,
                    _ = tokio::time::sleep(crate::backoff(tries)) => {}
                }
            }
        }
    }
}

async fn try_settle(
    a: &Assembler,
    job: Uuid,
    failure: &AssemblyFailure,
) -> Result<(), narrator_db::DbError> {
    let pool = &a.pool;
    let attempts = narrator_db::assembly_attempts(pool, job).await? + 1;
    let give_up = match failure.class {
        RetryClass::Permanent | RetryClass::Malformed => true,
        RetryClass::Transient => attempts >= MAX_TRANSIENT_ASSEMBLIES,
        RetryClass::Infrastructure => false,
    };
    if give_up {
        let reason = format!(
            "{}; run `narrator retry {job}` to assemble again",
            failure.message
        );
        tracing::warn!(%job, %reason, "assembly failed for good");
        narrator_db::fail_job(pool, job, "assembly", &reason).await?;
        return Ok(());
    }
    let after = crate::backoff(attempts);
    tracing::warn!(%job, attempt = attempts, retry_in_s = after.as_secs_f64(), class = failure.class.as_str(),
        error = %failure.message, "assembly failed for now; it will be tried again");
    // An outage (or a wedged worker's assembly put back) is not the job's fault: not
    // charged, so only transient errors of its own count towards giving up.
    let charged = failure.class == RetryClass::Transient;
    narrator_db::postpone_assembly(pool, job, &failure.message, after, charged).await?;
    Ok(())
}

/// Deletes the objects of jobs cancelled more than `release_after` ago (segments, packs
/// and any outputs), and records it; a failure is tried again at a later sweep. Workers
/// that sweep at once may both delete: deleting what is gone is not an error.
async fn release_cancelled(a: &Assembler) {
    let jobs = match narrator_db::cancelled_unreleased(&a.pool, a.release_after, RELEASES_PER_SWEEP)
        .await
    {
        Ok(jobs) => jobs,
        Err(e) => {
            tracing::debug!(error = %e, "cannot list cancelled jobs to release");
            return;
        }
    };
    for job in jobs {
        let released = async {
            let n = a
                .store
                .delete_job(&job.to_string())
                .await
                .map_err(|e| e.to_string())?;
            narrator_db::storage_released(&a.pool, job)
                .await
                .map_err(|e| e.to_string())?;
            Ok::<_, String>(n)
        };
        match released.await {
            Ok(n) => tracing::info!(%job, objects = n, "cancelled job's objects deleted"),
            Err(e) => {
                tracing::warn!(%job, error = %e, "cannot delete a cancelled job's objects yet")
            }
        }
    }
}

/// Takes the job of highest priority (then the oldest) out of `told` (not empty); told
/// order when the database cannot say.
async fn next_by_priority(pool: &narrator_db::PgPool, told: &mut Vec<Uuid>) -> Uuid {
    if told.len() > 1
        && let Ok(Some(first)) = narrator_db::highest_priority(pool, told).await
        && let Some(i) = told.iter().position(|j| *j == first)
    {
        return told.remove(i);
    }
    told.remove(0)
}

/// Assembles every job it is told about (if it wins the claim) and, every few seconds,
/// the jobs it takes over: unclaimed finished jobs, postponed ones whose time has come,
/// and claims of processes that are gone.
pub(crate) async fn assembler(
    a: Assembler,
    mut complete: mpsc::UnboundedReceiver<Uuid>,
    mut stop: watch::Receiver<bool>,
) {
    let mut sweep = tokio::time::interval(a.stale.min(Duration::from_secs(5)));
    // Jobs told of and not yet assembled: the highest priority goes first, so a priority
    // book finished behind a backlog of small ones is not assembled after all of them.
    let mut told: Vec<Uuid> = Vec::new();
    loop {
        enum Wake {
            Stop,
            Job(Uuid),
            Sweep,
        }
        while let Ok(job) = complete.try_recv() {
            told.push(job);
        }
        let wake = if told.is_empty() {
            tokio::select! {
                biased;
                _ = stop.wait_for(|v| *v) => Wake::Stop,
                Some(job) = complete.recv() => Wake::Job(job),
                _ = sweep.tick() => Wake::Sweep,
            }
        } else if *stop.borrow() {
            Wake::Stop
        } else {
            Wake::Job(next_by_priority(&a.pool, &mut told).await)
        };
        let jobs = match wake {
            Wake::Stop => return,
            Wake::Job(job) => {
                match narrator_db::claim_assembly_for(&a.pool, job, &a.worker, a.instance).await {
                    Ok(true) => vec![job],
                    Ok(false) => vec![],
                    Err(e) => {
                        tracing::warn!(%job, error = %e, "cannot claim assembly; a sweep will");
                        vec![]
                    }
                }
            }
            Wake::Sweep => {
                if let Err(e) = narrator_db::fail_settled_jobs(&a.pool).await {
                    tracing::debug!(error = %e, "cannot end jobs with failed segments");
                }
                release_cancelled(&a).await;
                narrator_db::take_over_assemblies(&a.pool, &a.worker, a.instance, a.stale)
                    .await
                    .unwrap_or_else(|e| {
                        tracing::debug!(error = %e, "assembly sweep failed");
                        vec![]
                    })
            }
        };
        for job in jobs {
            // The assembly joins the trace its job's `submit` started.
            let span = tracing::info_span!(parent: None, "assemble", narrator.job_id = %job,
                narrator.worker = %a.worker, otel.status_code = tracing::field::Empty);
            if let Ok(Some(trace)) = narrator_db::job_trace(&a.pool, job).await {
                narrator_telemetry::propagate::set_parent(&span, &trace);
            }
            span.in_scope(|| tracing::info!(%job, "assembling"));
            let started = std::time::Instant::now();
            let outcome = match assemble_job(&a, job).instrument(span.clone()).await {
                Ok(()) => "done",
                Err(failure) => {
                    span.record("otel.status_code", "ERROR");
                    let outcome = if failure.class == RetryClass::Permanent {
                        "failed"
                    } else {
                        "postponed"
                    };
                    settle_failure(&a, job, failure, &mut stop)
                        .instrument(span)
                        .await;
                    outcome
                }
            };
            metrics::histogram!(narrator_telemetry::metrics::ASSEMBLY_SECONDS, "outcome" => outcome)
                .record(started.elapsed().as_secs_f64());
        }
    }
}
