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
use narrator_audio::{AudioFormat, Pauses};
use narrator_core::Manifest;
use narrator_pipeline::{
    AssembleOptions, AudioIdentity, Event, JournalStateStore, LocalAudioStore, RunOptions, Stages,
    assemble, encode_as_stored, encodes_early, finish_early, plan_job, synthesize_job,
};
use narrator_text::{Document, InputFormat, Lexicon, LoadOptions};
use serde::{Deserialize, Serialize};

use crate::cli::{BookArgs, EngineArgs, RunArgs, SynthArgs, TextArgs};
use crate::engine;
use crate::paths::Paths;
use crate::progress::Progress;

#[derive(Debug, Serialize, Deserialize)]
struct JobState {
    job_id: String,
    segments: usize,
    wall_seconds: f64,
}

/// Input limits, and the voice's language: it picks the normalization rules and the
/// scripts kept.
pub(crate) fn load_options(t: &TextArgs, voice: &narrator_engine::Voice) -> LoadOptions {
    let language = voice.info().language;
    LoadOptions {
        max_bytes: t.max_input_mb.saturating_mul(1024 * 1024),
        language: if language.is_empty() {
            voice.family.espeak_voice().to_owned()
        } else {
            language
        },
        ..LoadOptions::default()
    }
}

pub(crate) fn pauses(t: &TextArgs) -> Pauses {
    Pauses {
        sentence_ms: t.sentence_pause_ms,
        paragraph_ms: t.paragraph_pause_ms,
        chapter_ms: t.chapter_pause_ms,
    }
}

pub(crate) fn identity_digest(voice: &narrator_engine::Voice) -> String {
    voice
        .family
        .identity()
        .bytes()
        .fold(0xcbf29ce484222325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x100000001b3)
        })
        .to_string()
}

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

/// Synthesizes and assembles `req.doc` into `req.out`, resuming from `out/.narrator`.
async fn produce(
    paths: &Paths,
    eargs: &EngineArgs,
    targs: &TextArgs,
    req: Request<'_>,
) -> anyhow::Result<Outcome> {
    let Request {
        doc,
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
    let scales = engine::scales(eargs, &voice);
    let digest = identity_digest(&voice);
    let speaker = match &eargs.speaker {
        Some(s) => voice.family.speaker_id(&voice.name, s)?,
        None => 0,
    };
    let mut plan = plan_job(
        doc,
        source,
        fallback_title,
        &AudioIdentity {
            voice: &voice.name,
            voice_digest: &digest,
            scales,
            speaker,
        },
    );
    // Words are timed only for outputs that use them (espeak-ng's word pass costs):
    // subtitles and word overlays; sentence overlays need only the layout.
    let timed = !subtitles.is_empty() || epub3 == Some(narrator_pipeline::epub3::Overlay::Words);
    for s in &mut plan.segments {
        s.timed = timed;
    }
    if plan.segments.is_empty() {
        bail!("{source} has nothing speakable after cleaning; check that it holds readable text");
    }

    let work = out.join(".narrator");
    let state_path = work.join("job.json");
    let previous: Option<JobState> = std::fs::read(&state_path)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok());
    let manifest_path = out.join("manifest.json");
    // A manifest from an earlier job must not be mistaken for this one's, and a complete
    // one of this job must not survive a rebuild half-done.
    if let Ok(bytes) = std::fs::read(&manifest_path) {
        if let Ok(m) = serde_json::from_slice::<Manifest>(&bytes)
            && m.job_id == plan.job_id
            && m.format == format.extension()
            && same_tags(&m, &plan)
            && m.chapters
                .iter()
                .all(|c| c.file.is_some() == (chapter_files && format.supports_chapter_files()))
            && m.book.subtitles.len() == subtitles.len()
            && m.book.subtitles.iter().all(|f| out.join(f).is_file())
            && m.book.epub_overlay.as_deref() == epub3.map(|o| o.as_str())
            && m.book.epub.iter().all(|f| out.join(f).is_file())
            && out.join(&m.book.file).is_file()
            && m.chapters
                .iter()
                .flat_map(|c| &c.file)
                .all(|f| out.join(f).is_file())
        {
            return Ok(Outcome {
                resumed: plan.segments.len(),
                manifest: m,
                plan: None,
            });
        }
        // The outputs it lists belong to another job or format: remove them with it.
        if let Ok(m) = serde_json::from_slice::<Manifest>(&bytes) {
            for f in m
                .chapters
                .iter()
                .flat_map(|c| &c.file)
                .chain([&m.book.file])
            {
                if !f.contains('/') {
                    let _ = std::fs::remove_file(out.join(f));
                }
            }
        }
        std::fs::remove_file(&manifest_path)
            .with_context(|| format!("removing stale {}", manifest_path.display()))?;
    }
    let mut wall_before = 0.0;
    // A fresh job's book is encoded while it is synthesized (every segment reports itself
    // stored); a resumed one's after, from what is stored.
    let fresh = !matches!(&previous, Some(p) if p.job_id == plan.job_id);
    match previous {
        Some(p) if p.job_id == plan.job_id => wall_before = p.wall_seconds,
        Some(_) => {
            std::fs::remove_dir_all(&work)
                .with_context(|| format!("clearing {} of another job", work.display()))?;
        }
        None => {}
    }
    std::fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;
    let save_state = |wall: f64| -> anyhow::Result<()> {
        let s = JobState {
            job_id: plan.job_id.clone(),
            segments: plan.segments.len(),
            wall_seconds: wall,
        };
        let tmp = work.join("job.json.tmp");
        std::fs::write(&tmp, serde_json::to_vec(&s)?)?;
        std::fs::rename(&tmp, &state_path)?;
        Ok(())
    };
    save_state(wall_before)?;

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
    let loaded = engine::load(paths, eargs, voice, planning)?;
    let used_plan = loaded.plan.clone();
    let synth = Arc::new(loaded.synth);
    let progress = Arc::new(Progress::new(show_progress, started));
    progress.layout(&used_plan);
    let aopts = AssembleOptions {
        format,
        chapter_files,
        pauses: pauses(targs),
        staging: work.join("staging"),
        subtitles: subtitles.to_vec(),
        epub3,
    };
    let (early_tx, early) = if fresh && encodes_early(format) {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let (plan, store, aopts) = (plan.clone(), store.clone(), aopts.clone());
        let rt = tokio::runtime::Handle::current();
        // A thread of its own (the encoders' work is synchronous) at a lower priority: where
        // inference keeps every core busy it takes the cycles the sessions leave (waits
        // between runs, the last segments running alone), and what it has not encoded when
        // synthesis ends it encodes then, on the freed cores.
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
        (Arc::new(std::sync::Mutex::new(Some(tx))), Some(task))
    } else {
        (Arc::new(std::sync::Mutex::new(None)), None)
    };
    let stored_to = early_tx.clone();
    let p = progress.clone();
    let saved_at = Arc::new(AtomicU64::new(0));
    let work_for_events = work.clone();
    let job_id = plan.job_id.clone();
    let n_segments = plan.segments.len();
    let on_event: Arc<dyn Fn(Event) + Send + Sync> = Arc::new(move |e| {
        // Keep the elapsed time on disk now and then, so a resumed job's figures include it.
        let now = started.elapsed().as_secs();
        if now >= saved_at.load(Ordering::Relaxed) + 5 {
            saved_at.store(now, Ordering::Relaxed);
            let s = JobState {
                job_id: job_id.clone(),
                segments: n_segments,
                wall_seconds: wall_before + started.elapsed().as_secs_f64(),
            };
            if let Ok(b) = serde_json::to_vec(&s) {
                let tmp = work_for_events.join("job.json.tmp");
                if std::fs::write(&tmp, b).is_ok() {
                    let _ = std::fs::rename(&tmp, work_for_events.join("job.json"));
                }
            }
        }
        if let Event::SegmentDone { record } = &e
            && let Ok(tx) = stored_to.lock()
            && let Some(tx) = tx.as_ref()
        {
            let _ = tx.send(record.clone());
        }
        p.event(&e);
    });
    let opts = RunOptions::embedded(worker_name(), loaded.in_flight);
    let stages = Stages {
        synth,
        store: store.clone(),
        state,
        on_event,
    };
    let synthesized = synthesize_job(&plan, &stages, &opts).await;
    // No more segments will come: an early encoder still waiting for one gives up.
    if let Ok(mut tx) = early_tx.lock() {
        tx.take();
    }
    let records = synthesized?;
    let resumed = progress.resumed();
    progress.assembling();
    let early = match early {
        Some(task) => match tokio::task::block_in_place(|| {
            let synthesized_at = Instant::now();
            let joined = task.join();
            tracing::debug!(
                tail_s = synthesized_at.elapsed().as_secs_f64(),
                "the encoder caught up with synthesis"
            );
            joined
        }) {
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
        },
        None => None,
    };
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

pub(crate) fn file_stem(p: &Path) -> String {
    p.file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("book")
        .to_string()
}

/// The lexicon for `book`: `BOOK_STEM.lexicon` beside it when there is one (the book's
/// own), then every `--lexicon` file in order. A line that cannot be used is an error.
pub(crate) fn lexicon_for(book: Option<&Path>, args: &TextArgs) -> anyhow::Result<Lexicon> {
    let mut lexicon = Lexicon::default();
    if let Some(own) = book
        .map(|b| b.with_extension("lexicon"))
        .filter(|p| p.is_file())
    {
        lexicon = Lexicon::load(&own)?;
        tracing::info!(file = %own.display(), entries = lexicon.len(), "the book's lexicon");
    }
    for file in &args.lexicon {
        lexicon = lexicon.then(Lexicon::load(file)?);
    }
    Ok(lexicon)
}

/// Whether a finished book's files carry the tags this plan would give them (a new
/// `--author` or cover rebuilds the files from the kept segments).
fn same_tags(m: &Manifest, plan: &narrator_core::JobPlan) -> bool {
    let without_cover = narrator_core::BookMeta {
        cover: None,
        resources: Vec::new(),
        ..plan.meta.clone()
    };
    let cover = plan
        .meta
        .cover
        .as_ref()
        .map(|c| (c.mime.as_str(), c.data.len() as u64));
    m.book.title == plan.title
        && m.book.meta == without_cover
        && m.book.cover.as_ref().map(|c| (c.mime.as_str(), c.bytes)) == cover
}

/// Puts the flags' metadata over what the input says.
pub(crate) fn apply_book_args(
    doc: &mut narrator_text::Document,
    args: &BookArgs,
    book: &Path,
) -> anyhow::Result<()> {
    let clean = |s: &Option<String>| {
        s.as_deref()
            .map(|v| v.split_whitespace().collect::<Vec<_>>().join(" "))
            .filter(|v| !v.is_empty())
    };
    if let Some(title) = clean(&args.title) {
        doc.title = Some(title);
    }
    let cover = match &args.cover {
        Some(path) => Some(narrator_text::load_cover(path, book)?),
        None => None,
    };
    let flags = narrator_core::BookMeta {
        author: clean(&args.author),
        language: clean(&args.language),
        date: clean(&args.date),
        publisher: clean(&args.publisher),
        cover,
        ..Default::default()
    };
    doc.meta = std::mem::take(&mut doc.meta).overridden_by(flags);
    Ok(())
}

/// `--chapter-files` with a format that keeps its chapters in one file is refused.
pub(crate) fn check_chapter_files(format: AudioFormat, chapter_files: bool) -> anyhow::Result<()> {
    if chapter_files && !format.supports_chapter_files() {
        bail!(
            "--chapter-files: {format} keeps its chapters inside its one file; drop the flag, or \
             use --format opus, mp3 or wav for one file per chapter"
        );
    }
    Ok(())
}

/// What `--format` names: an audio format, or `epub3` (a read-along EPUB 3, whose audio
/// is MP3, one file per chapter: the book's MP3 and chapter files come with it). Returns
/// the audio format, whether there are chapter files, and whether an EPUB is wanted.
/// (`--epub-overlay` says how fine its overlays are.)
pub(crate) fn output_format(
    name: &str,
    chapter_files: bool,
) -> anyhow::Result<(AudioFormat, bool, bool)> {
    let word = name.trim().trim_start_matches('.').to_ascii_lowercase();
    if word == "epub3" || word == "epub" {
        return Ok((AudioFormat::Mp3, true, true));
    }
    let format: AudioFormat = name.parse().map_err(|_| {
        anyhow::anyhow!(
            "unknown format {name:?}; choose one of: wav, opus, mp3, m4b, epub3 (a read-along \
             EPUB 3 with MP3 audio)"
        )
    })?;
    check_chapter_files(format, chapter_files)?;
    Ok((format, chapter_files, false))
}

/// The formats `--subtitles` names.
pub(crate) fn subtitle_formats(
    names: &[String],
) -> anyhow::Result<Vec<narrator_pipeline::SubtitleFormat>> {
    let mut formats = Vec::new();
    for name in names {
        let format = name.parse()?;
        if !formats.contains(&format) {
            formats.push(format);
        }
    }
    Ok(formats)
}

/// `narrator run`.
pub(crate) async fn run(paths: &Paths, args: RunArgs) -> anyhow::Result<()> {
    let (format, chapter_files, epub3) = output_format(&args.format, args.chapter_files)?;
    let epub3 = epub3.then_some(args.epub_overlay);
    let subtitles = subtitle_formats(&args.subtitles)?;
    // The voice first: its language decides how the text is read.
    let voice = engine::find_voice(paths, &args.engine)?;
    let opts = LoadOptions {
        // A read-along EPUB shows an EPUB input as it looked.
        keep_looks: epub3.is_some(),
        ..load_options(&args.text, &voice)
    };
    let mut doc = narrator_text::load_document(&args.book, &opts)?;
    apply_book_args(&mut doc, &args.meta, &args.book)?;
    doc.apply_lexicon(&lexicon_for(Some(&args.book), &args.text)?, &opts)?;
    writable_dir(&args.out)?;
    for w in &doc.warnings {
        eprintln!("warning: {w}");
    }
    let source = args.book.display().to_string();
    let show = !args.json && std::io::IsTerminal::is_terminal(&std::io::stderr());
    let req = Request {
        doc: &doc,
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
    let opts = load_options(&args.text, &engine::find_voice(paths, &args.engine)?);
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
    doc.apply_lexicon(&lexicon_for(book, &args.text)?, &opts)?;
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
