//! `narrator run` and `narrator synth`: the embedded mode, with resume.
//!
//! Work folder `OUT/.narrator/`: `job.json` (job id and wall time spent so far),
//! `segments/`, `journal.jsonl`. A run whose job id matches resumes; a different book or
//! voice starts over. `manifest.json` is removed before work starts and written last.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use anyhow::{Context, bail};
use narrator_audio::AudioFormat;
use narrator_core::{Manifest, SegmentRecord};
use narrator_pipeline::book::{
    Identity, ReadBook, file_stem, lexicon_for, load_options, output_format, plan_book, read_book,
    subtitle_formats,
};
use narrator_pipeline::resume::{self, Previous};
use narrator_pipeline::{
    AssembleOptions, EarlyBook, Event, JournalStateStore, LocalAudioStore, RunOptions, Stages,
    assemble, encode_as_stored, encodes_early, finish_early, synthesize_job,
};
use narrator_text::{Document, InputFormat, Lexicon};

use crate::cli::{EngineArgs, OutputArgs, RunArgs, SynthArgs, TextArgs};
use crate::engine;
use crate::paths::Paths;
use crate::progress::Progress;

/// Makes sure `dir` exists and can be written, with one clear error if not.
fn writable_dir(dir: &Path) -> anyhow::Result<()> {
    if dir.exists() && !dir.is_dir() {
        bail!(
            "--out {} is a file, not a folder: choose a folder path",
            dir.display()
        );
    }
    std::fs::create_dir_all(dir).with_context(|| {
        format!(
            "cannot create output folder {} (choose a writable --out)",
            dir.display()
        )
    })?;
    let probe = dir.join(".narrator-write-test");
    std::fs::write(&probe, b"").with_context(|| {
        format!(
            "output folder {} is not writable (choose a writable --out)",
            dir.display()
        )
    })?;
    let _ = std::fs::remove_file(probe);
    Ok(())
}

struct Outcome {
    manifest: Manifest,
    resumed: usize,
    /// The plan the voice ran with (none when the outputs were already complete).
    plan: Option<narrator_hardware::Plan>,
}

/// One audiobook to make.
struct Request<'a> {
    doc: &'a Document,
    /// The lexicon applied to `doc` (for the plan's record).
    lexicon: &'a Lexicon,
    source: &'a str,
    fallback_title: &'a str,
    out: &'a Path,
    format: AudioFormat,
    /// One file per chapter too.
    chapter_files: bool,
    /// A read-along EPUB 3 too, with overlays this fine.
    epub3: Option<narrator_pipeline::epub3::Overlay>,
    /// Subtitle files to write.
    subtitles: &'a [narrator_pipeline::SubtitleFormat],
    show_progress: bool,
    keep_work: bool,
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
    task: Option<std::thread::JoinHandle<Result<EarlyBook, narrator_pipeline::PipelineError>>>,
}

impl EarlyEncoder {
    /// Starts it when `wanted` (else one that takes nothing and returns nothing).
    fn start(
        wanted: bool,
        plan: &narrator_core::JobPlan,
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

/// What a run does with each event: the progress display, each stored segment handed to
/// the early encoder, and the elapsed time kept on disk now and then (every 5 s), so a
/// resumed job's figures include it.
fn run_events(
    progress: Arc<Progress>,
    stored_to: StoredTx,
    work: &Path,
    plan: &narrator_core::JobPlan,
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
        if let Event::SegmentDone { record } = &e
            && let Ok(tx) = stored_to.lock()
            && let Some(tx) = tx.as_ref()
        {
            let _ = tx.send(record.clone());
        }
        progress.event(&e);
    })
}

/// Synthesizes and assembles `req.doc` into `req.out`, resuming from `out/.narrator`.
async fn produce(
    paths: &Paths,
    eargs: &EngineArgs,
    targs: &TextArgs,
    req: Request<'_>,
) -> anyhow::Result<Outcome> {
    let Request {
        doc,
        lexicon,
        source,
        fallback_title,
        out,
        format,
        chapter_files,
        epub3,
        subtitles,
        show_progress,
        keep_work,
    } = req;
    let voice = engine::find_voice(paths, eargs)?;
    let identity = Identity::of(
        &voice,
        &eargs.voice.scales(),
        eargs.voice.speaker.as_deref(),
    )?;
    let mut plan = plan_book(doc, source, fallback_title, &identity, lexicon)?;
    // Words are timed only for outputs that use them (espeak-ng's word pass costs):
    // subtitles and word overlays; sentence overlays need only the layout.
    let timed = !subtitles.is_empty() || epub3 == Some(narrator_pipeline::epub3::Overlay::Words);
    for s in &mut plan.segments {
        s.timed = timed;
    }

    let work = out.join(".narrator");
    let want = resume::Outputs {
        format,
        chapter_files,
        subtitles: subtitles.len(),
        epub_overlay: epub3.map(|o| o.as_str()),
    };
    // A fresh job's book is encoded while it is synthesized (every segment reports itself
    // stored); a resumed one's after, from what is stored.
    let (wall_before, fresh) = match resume::prepare(out, &plan, &want)? {
        Previous::Finished(manifest) => {
            return Ok(Outcome {
                resumed: plan.segments.len(),
                manifest: *manifest,
                plan: None,
            });
        }
        Previous::Resume { wall_seconds } => (wall_seconds, false),
        Previous::Fresh => (0.0, true),
    };
    let save_state = |wall: f64| {
        resume::JobState {
            job_id: plan.job_id.clone(),
            segments: plan.segments.len(),
            wall_seconds: wall,
        }
        .save(&work)
    };

    let store = Arc::new(LocalAudioStore::new(
        work.join("segments"),
        out.to_path_buf(),
    )?);
    if timed {
        // Segments an earlier run made without words are made again, timed.
        JournalStateStore::forget_untimed(&work.join("journal.jsonl"))?;
    }
    let state = Arc::new(JournalStateStore::open(work.join("journal.jsonl"))?);

    let started = Instant::now();
    let planning = match eargs.calibrate.as_deref() {
        Some(p) => p.parse()?,
        None => engine::Planning::CachedOnly,
    };
    let loaded = engine::load(
        paths,
        &engine::options(eargs),
        voice,
        planning,
        &Default::default(),
    )?;
    let used_plan = loaded.plan.clone();
    let synth = Arc::new(loaded.synth);
    let progress = Arc::new(Progress::new(show_progress, started));
    progress.layout(&used_plan);
    let aopts = AssembleOptions {
        format,
        sample_rate: synth.sample_rate(),
        chapter_files,
        pauses: targs.pauses(),
        staging: work.join("staging"),
        subtitles: subtitles.to_vec(),
        epub3,
    };
    let early = EarlyEncoder::start(fresh && encodes_early(format), &plan, &store, &aopts)?;
    let on_event = run_events(
        progress.clone(),
        early.sender(),
        &work,
        &plan,
        wall_before,
        started,
    );
    let opts = RunOptions::embedded(worker_name(), loaded.in_flight);
    let stages = Stages {
        synth,
        store: store.clone(),
        state,
        on_event,
    };
    let synthesized = synthesize_job(&plan, &stages, &opts).await;
    // No more segments will come: an early encoder still waiting for one gives up.
    early.close();
    let records = synthesized?;
    let resumed = progress.resumed();
    progress.assembling();
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
    progress.finish();
    if !keep_work {
        let _ = std::fs::remove_dir_all(&work);
    }
    Ok(Outcome {
        manifest,
        resumed,
        plan: Some(used_plan),
    })
}

pub(crate) fn worker_name() -> String {
    let host = std::fs::read_to_string("/etc/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "local".into());
    format!("{host}:{}", std::process::id())
}

/// What `--format`, `--chapter-files`, `--subtitles` and `--epub-overlay` ask for.
pub(crate) struct Outputs {
    pub(crate) format: AudioFormat,
    pub(crate) chapter_files: bool,
    /// A read-along EPUB 3, with overlays this fine.
    pub(crate) epub3: Option<narrator_pipeline::epub3::Overlay>,
    pub(crate) subtitles: Vec<narrator_pipeline::SubtitleFormat>,
}

impl OutputArgs {
    /// The outputs asked for, one clear error for a bad combination.
    pub(crate) fn outputs(&self) -> anyhow::Result<Outputs> {
        let (format, chapter_files, epub3) = output_format(&self.format, self.chapter_files)?;
        Ok(Outputs {
            format,
            chapter_files,
            epub3: epub3.then_some(self.epub_overlay),
            subtitles: subtitle_formats(&self.subtitles)?,
        })
    }
}

/// `narrator run`.
pub(crate) async fn run(paths: &Paths, args: RunArgs) -> anyhow::Result<()> {
    let Outputs {
        format,
        chapter_files,
        epub3,
        subtitles,
    } = args.output.outputs()?;
    // The voice first: its language decides how the text is read.
    let voice = engine::find_voice(paths, &args.engine)?;
    // A read-along EPUB shows an EPUB input as it looked.
    let read = args.text.read_options(&args.meta, epub3.is_some());
    let ReadBook { doc, lexicon } = read_book(&args.book, &voice, &read)?;
    writable_dir(&args.out)?;
    for w in &doc.warnings {
        eprintln!("warning: {w}");
    }
    let source = args.book.display().to_string();
    let show = !args.json && std::io::IsTerminal::is_terminal(&std::io::stderr());
    let req = Request {
        doc: &doc,
        lexicon: &lexicon,
        source: &source,
        fallback_title: &file_stem(&args.book),
        out: &args.out,
        format,
        chapter_files,
        epub3,
        subtitles: &subtitles,
        show_progress: show,
        keep_work: args.keep_work,
    };
    let outcome = produce(paths, &args.engine, &args.text, req).await?;
    print_summary(&outcome, &args.out, args.json)
}

fn print_summary(o: &Outcome, out: &Path, json: bool) -> anyhow::Result<()> {
    let m = &o.manifest;
    if json {
        let v = serde_json::json!({
            "job_id": m.job_id,
            "out": out,
            "manifest": out.join("manifest.json"),
            "book": m.book,
            "chapters": m.chapters.len(),
            "segments": m.segments.len(),
            "resumed_segments": o.resumed,
            "voice": m.voice,
            "format": m.format,
            "audio_seconds": m.audio_seconds,
            "speech_seconds": m.speech_seconds,
            "wall_seconds": m.wall_seconds,
            "rtf": m.rtf,
            "x_realtime": if m.rtf > 0.0 { 1.0 / m.rtf } else { 0.0 },
            "warnings": m.warnings,
            "plan": o.plan.as_ref().map(|p| serde_json::json!({
                "device": p.device,
                "sessions": p.sessions,
                "intra_threads": p.intra_threads,
                "max_batch_requests": p.max_batch_requests,
                "max_batch_tokens": p.max_batch_tokens,
                "source": p.source,
                "reason": p.reason,
                "graph": p.graph,
            })),
        });
        println!("{v}");
    } else {
        println!(
            "{} chapters, {} segments, {} of audio in {:.1} s (RTF {:.3}, {:.1}x realtime){}",
            m.chapters.len(),
            m.segments.len(),
            crate::progress::hms(m.audio_seconds),
            m.wall_seconds,
            m.rtf,
            if m.rtf > 0.0 { 1.0 / m.rtf } else { 0.0 },
            if o.resumed > 0 {
                format!(", {} segments resumed", o.resumed)
            } else {
                String::new()
            }
        );
        if let Some(p) = &o.plan {
            println!("layout: {}", p.layout_line());
        }
        println!("book: {}", out.join(&m.book.file).display());
        println!("manifest: {}", out.join("manifest.json").display());
    }
    Ok(())
}

/// `narrator synth`.
pub(crate) async fn synth(paths: &Paths, args: SynthArgs) -> anyhow::Result<()> {
    let ext = args
        .output
        .extension()
        .and_then(|e| e.to_str())
        .unwrap_or("")
        .to_ascii_lowercase();
    let format: AudioFormat = ext.parse().map_err(|_| {
        anyhow::anyhow!(
            "cannot tell the format of -o {}: end it in .wav, .opus, .mp3 or .m4b",
            args.output.display()
        )
    })?;
    let voice = engine::find_voice(paths, &args.engine)?;
    let opts = load_options(
        &voice,
        args.text.max_input_mb.saturating_mul(1024 * 1024),
        false,
    );
    let (mut doc, source) = if args.input == Path::new("-") {
        let mut buf = Vec::new();
        std::io::Read::read_to_end(&mut std::io::stdin(), &mut buf)
            .context("reading standard input")?;
        let text = String::from_utf8(buf).map_err(|e| {
            anyhow::anyhow!(
                "standard input is not valid UTF-8 (at byte {}): convert it with iconv",
                e.utf8_error().valid_up_to()
            )
        })?;
        (
            narrator_text::parse_document(&text, InputFormat::Text, &opts)?,
            "-".to_string(),
        )
    } else {
        (
            narrator_text::load_document(&args.input, &opts)?,
            args.input.display().to_string(),
        )
    };
    let book = (args.input != Path::new("-")).then_some(args.input.as_path());
    let lexicon = lexicon_for(book, &args.text.lexicon)?;
    doc.apply_lexicon(&lexicon, &opts)?;
    for w in &doc.warnings {
        eprintln!("warning: {w}");
    }
    let parent = args
        .output
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf);
    writable_dir(&parent)?;
    let work = tempfile::Builder::new()
        .prefix(".narrator-synth-")
        .tempdir_in(&parent)
        .with_context(|| format!("creating a work folder in {}", parent.display()))?;
    let req = Request {
        doc: &doc,
        lexicon: &lexicon,
        source: &source,
        fallback_title: "speech",
        out: work.path(),
        format,
        chapter_files: false,
        epub3: None,
        subtitles: &[],
        show_progress: false,
        keep_work: false,
    };
    let outcome = produce(paths, &args.engine, &args.text, req).await?;
    let book = work.path().join(&outcome.manifest.book.file);
    std::fs::rename(&book, &args.output)
        .with_context(|| format!("writing {}", args.output.display()))?;
    eprintln!(
        "{}: {:.1} s of audio in {:.1} s",
        args.output.display(),
        outcome.manifest.audio_seconds,
        outcome.manifest.wall_seconds
    );
    Ok(())
}
