//! One book made in one folder, with resume: what `narrator run` and `narrator synth` do,
//! and what `narrator serve` does for each embedded job.
//!
//! Work folder `OUT/.narrator/`: `job.json` (job id and wall time spent so far),
//! `segments/`, `journal.jsonl`. A book whose job id matches the folder's resumes; a
//! different book or voice starts over ([`resume::prepare`]). `manifest.json` is removed
//! before work starts and written last, so a folder with a manifest holds a whole book.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Instant;

use anyhow::Context;
use narrator_audio::AudioFormat;
use narrator_core::{JobPlan, Manifest, SegmentRecord};

use crate::resume::{self, Previous};
use crate::synth::Synthesizer;
use crate::{
    AssembleOptions, EarlyBook, Event, JournalStateStore, LocalAudioStore, RunOptions, Stages,
    SubtitleFormat, assemble, encode_as_stored, encodes_early, finish_early, synthesize_job,
};

/// The files a book is made into.
#[derive(Debug, Clone)]
pub struct BookOutputs {
    pub format: AudioFormat,
    /// One file per chapter too.
    pub chapter_files: bool,
    /// A read-along EPUB 3 too, with overlays this fine.
    pub epub3: Option<crate::epub3::Overlay>,
    /// Subtitle files to write.
    pub subtitles: Vec<SubtitleFormat>,
}

impl BookOutputs {
    /// Whether segments must be timed word by word (espeak-ng's word pass costs): for
    /// subtitles and word overlays; sentence overlays need only the layout.
    pub fn timed(&self) -> bool {
        !self.subtitles.is_empty() || self.epub3 == Some(crate::epub3::Overlay::Words)
    }
}

/// One book to make.
pub struct BookJob {
    /// The planned book (its segments' `timed` are set here from the outputs).
    pub plan: JobPlan,
    /// The folder the book is made in (and resumed from).
    pub out: PathBuf,
    pub outputs: BookOutputs,
    /// Silences between sentences, paragraphs and chapters.
    pub pauses: narrator_audio::Pauses,
    /// Keep `OUT/.narrator` once the book is made.
    pub keep_work: bool,
    /// Name recorded with every segment.
    pub worker: String,
    /// Turns `true` to stop: the batches in flight finish and are kept (a later run
    /// resumes from them), and [`make_book`] returns [`Stopped`].
    pub stop: Option<tokio::sync::watch::Receiver<bool>>,
}

/// The engine a book is synthesized with, asked for only when there is something to
/// synthesize.
pub struct BookEngine {
    pub synth: Arc<Synthesizer>,
    /// Batches kept in flight ([`crate::load::Loaded::in_flight`]).
    pub in_flight: usize,
    /// The plan it runs with, when one was made for it (for the caller's record).
    pub plan: Option<narrator_hardware::Plan>,
}

/// A made book.
#[derive(Debug)]
pub struct MadeBook {
    pub manifest: Manifest,
    /// Segments an earlier run had made.
    pub resumed: usize,
    /// The engine's plan (`None` when the book was already finished, or the engine had none).
    pub plan: Option<narrator_hardware::Plan>,
}

/// The book was stopped before it was finished (its work folder is kept for a resume).
#[derive(Debug, thiserror::Error)]
#[error("stopped before the book was finished ({done} of {total} segments made)")]
pub struct Stopped {
    pub done: usize,
    pub total: usize,
}

/// Where stored segments go to be encoded during synthesis.
type StoredTx = Arc<std::sync::Mutex<Option<tokio::sync::mpsc::UnboundedSender<SegmentRecord>>>>;

/// A fresh job's book encoded while it is synthesized, on a thread of its own (the
/// encoders' work is synchronous) at a lower priority: where inference keeps every core
/// busy it takes the cycles the sessions leave (waits between runs, the last segments
/// running alone), and what it has not encoded when synthesis ends it encodes then, on
/// the freed cores.
struct EarlyEncoder {
    tx: StoredTx,
    task: Option<std::thread::JoinHandle<Result<EarlyBook, crate::PipelineError>>>,
}

impl EarlyEncoder {
    /// Starts it when `wanted` (else one that takes nothing and returns nothing).
    fn start(
        wanted: bool,
        plan: &JobPlan,
        store: &Arc<LocalAudioStore>,
        aopts: &AssembleOptions,
    ) -> anyhow::Result<Self> {
        if !wanted {
            return Ok(EarlyEncoder {
                tx: Arc::new(std::sync::Mutex::new(None)),
                task: None,
            });
        }
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let (plan, store, aopts) = (plan.clone(), store.clone(), aopts.clone());
        let rt = tokio::runtime::Handle::current();
        let task = std::thread::Builder::new()
            .name("early-encoder".into())
            .spawn(move || {
                if let Err(e) = narrator_hardware::threads::lower_current_thread_priority() {
                    // Only speed is at stake.
                    tracing::debug!(error = %e, "could not lower the encoder thread's priority");
                }
                rt.block_on(encode_as_stored(&plan, rx, &store, &aopts))
            })
            .context("starting the encoder thread")?;
        Ok(EarlyEncoder {
            tx: Arc::new(std::sync::Mutex::new(Some(tx))),
            task: Some(task),
        })
    }

    /// Where the run's events hand it each stored segment.
    fn sender(&self) -> StoredTx {
        self.tx.clone()
    }

    /// No more segments will come: an encoder still waiting for one gives up.
    fn close(&self) {
        if let Ok(mut tx) = self.tx.lock() {
            tx.take();
        }
    }

    /// The book it encoded, or `None` (not started, failed or panicked: the book is then
    /// assembled from the stored segments).
    fn finish(self) -> Option<EarlyBook> {
        let task = self.task?;
        let joined = tokio::task::block_in_place(|| {
            let synthesized_at = Instant::now();
            let joined = task.join();
            tracing::debug!(
                tail_s = synthesized_at.elapsed().as_secs_f64(),
                "the encoder caught up with synthesis"
            );
            joined
        });
        match joined {
            Ok(Ok(book)) => Some(book),
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "encoding during synthesis failed; assembling from the stored segments");
                None
            }
            Err(_) => {
                tracing::warn!(
                    "the encoder during synthesis panicked; assembling from the stored segments"
                );
                None
            }
        }
    }
}

/// What a run does with each event: the caller's observer, each stored segment handed to
/// the early encoder, the resumed count kept, and the elapsed time kept on disk now and
/// then (every 5 s), so a resumed job's figures include it.
fn run_events(
    observe: Arc<dyn Fn(&Event) + Send + Sync>,
    stored_to: StoredTx,
    resumed: Arc<AtomicUsize>,
    work: &Path,
    plan: &JobPlan,
    wall_before: f64,
    started: Instant,
) -> Arc<dyn Fn(Event) + Send + Sync> {
    let saved_at = AtomicU64::new(0);
    let work = work.to_path_buf();
    let (job_id, n_segments) = (plan.job_id.clone(), plan.segments.len());
    Arc::new(move |e| {
        let now = started.elapsed().as_secs();
        if now >= saved_at.load(Ordering::Relaxed) + 5 {
            saved_at.store(now, Ordering::Relaxed);
            let s = resume::JobState {
                job_id: job_id.clone(),
                segments: n_segments,
                wall_seconds: wall_before + started.elapsed().as_secs_f64(),
            };
            // Only the figures are at stake: the next save or the end writes it again.
            let _ = s.save(&work);
        }
        match &e {
            Event::Started { done, .. } => resumed.store(*done, Ordering::Relaxed),
            Event::SegmentDone { record } => {
                if let Ok(tx) = stored_to.lock()
                    && let Some(tx) = tx.as_ref()
                {
                    let _ = tx.send(record.clone());
                }
            }
            Event::Warning(_) | Event::Assembling => {}
        }
        observe(&e);
    })
}

/// Synthesizes and assembles `job.plan` into `job.out`, resuming from `out/.narrator`;
/// `engine` is called only when something is left to synthesize. `observe` sees every
/// event of the run.
pub async fn make_book(
    job: BookJob,
    engine: impl FnOnce() -> anyhow::Result<BookEngine>,
    observe: Arc<dyn Fn(&Event) + Send + Sync>,
) -> anyhow::Result<MadeBook> {
    let BookJob {
        mut plan,
        out,
        outputs,
        pauses,
        keep_work,
        worker,
        stop,
    } = job;
    let timed = outputs.timed();
    for s in &mut plan.segments {
        s.timed = timed;
    }
    let work = out.join(".narrator");
    let want = resume::Outputs {
        format: outputs.format,
        chapter_files: outputs.chapter_files,
        subtitles: outputs.subtitles.len(),
        epub_overlay: outputs.epub3.map(|o| o.as_str()),
    };
    // A fresh job's book is encoded while it is synthesized (every segment reports itself
    // stored); a resumed one's after, from what is stored.
    let (wall_before, fresh) = match resume::prepare(&out, &plan, &want)? {
        Previous::Finished(manifest) => {
            return Ok(MadeBook {
                resumed: plan.segments.len(),
                manifest: *manifest,
                plan: None,
            });
        }
        Previous::Resume { wall_seconds } => (wall_seconds, false),
        Previous::Fresh => (0.0, true),
    };
    let store = Arc::new(LocalAudioStore::new(work.join("segments"), out.clone())?);
    if timed {
        // Segments an earlier run made without words are made again, timed.
        JournalStateStore::forget_untimed(&work.join("journal.jsonl"))?;
    }
    let state = Arc::new(JournalStateStore::open(work.join("journal.jsonl"))?);

    let started = Instant::now();
    let BookEngine {
        synth,
        in_flight,
        plan: used_plan,
    } = engine()?;
    let aopts = AssembleOptions {
        format: outputs.format,
        sample_rate: synth.sample_rate(),
        chapter_files: outputs.chapter_files,
        pauses,
        staging: work.join("staging"),
        subtitles: outputs.subtitles,
        epub3: outputs.epub3,
    };
    let early = EarlyEncoder::start(
        fresh && encodes_early(outputs.format),
        &plan,
        &store,
        &aopts,
    )?;
    let resumed = Arc::new(AtomicUsize::new(0));
    let on_event = run_events(
        observe,
        early.sender(),
        resumed.clone(),
        &work,
        &plan,
        wall_before,
        started,
    );
    let mut opts = RunOptions::embedded(worker, in_flight);
    opts.stop = stop.clone();
    let stages = Stages {
        synth,
        store: store.clone(),
        state,
        on_event: on_event.clone(),
    };
    let synthesized = synthesize_job(&plan, &stages, &opts).await;
    // No more segments will come: an early encoder still waiting for one gives up.
    early.close();
    let save_state = |wall: f64| {
        resume::JobState {
            job_id: plan.job_id.clone(),
            segments: plan.segments.len(),
            wall_seconds: wall,
        }
        .save(&work)
    };
    let records = match synthesized {
        Ok(records) => records,
        Err(e) => {
            drop(early.finish());
            save_state(wall_before + started.elapsed().as_secs_f64())?;
            let stopped = stop.as_ref().is_some_and(|s| *s.borrow());
            return Err(match e {
                // What was made stays for a resume.
                crate::PipelineError::Incomplete { done, total } if stopped => {
                    Stopped { done, total }.into()
                }
                e => e.into(),
            });
        }
    };
    on_event(Event::Assembling);
    let early = early.finish();
    let wall = wall_before + started.elapsed().as_secs_f64();
    save_state(wall)?;
    let manifest = tokio::task::block_in_place(|| {
        tokio::runtime::Handle::current().block_on(async {
            match early {
                Some(book) => {
                    let (m, how) =
                        finish_early(book, &plan, &records, &store, &aopts, wall).await?;
                    tracing::debug!(?how, "book encoded during synthesis");
                    Ok(m)
                }
                None => assemble(&plan, &records, &store, &aopts, wall).await,
            }
        })
    })?;
    if !keep_work {
        let _ = std::fs::remove_dir_all(&work);
    }
    Ok(MadeBook {
        manifest,
        resumed: resumed.load(Ordering::Relaxed),
        plan: used_plan,
    })
}

/// This process's name in segment records: `HOST:PID`.
pub fn worker_name() -> String {
    let host = std::fs::read_to_string("/etc/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "local".into());
    format!("{host}:{}", std::process::id())
}
