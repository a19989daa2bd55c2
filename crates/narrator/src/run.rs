//! `narrator run` and `narrator synth`: the embedded mode, with resume
//! ([`narrator_pipeline::embedded`] makes the book; this reads the flags and the book,
//! shows the progress and prints the summary).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, bail};
use narrator_audio::AudioFormat;
use narrator_pipeline::book::{
    Identity, ReadBook, file_stem, lexicon_for, load_options, output_format, plan_book, read_book,
    subtitle_formats,
};
use narrator_pipeline::embedded::{
    BookEngine, BookJob, BookOutputs, MadeBook, make_book, worker_name,
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

/// One audiobook to make.
struct Request<'a> {
    doc: &'a Document,
    /// The lexicon applied to `doc` (for the plan's record).
    lexicon: &'a Lexicon,
    source: &'a str,
    fallback_title: &'a str,
    out: &'a Path,
    outputs: BookOutputs,
    show_progress: bool,
    keep_work: bool,
}

/// Synthesizes and assembles `req.doc` into `req.out`, resuming from `out/.narrator`
/// ([`narrator_pipeline::embedded::make_book`]); the engine is loaded only when something
/// is left to synthesize.
async fn produce(
    paths: &Paths,
    eargs: &EngineArgs,
    targs: &TextArgs,
    req: Request<'_>,
) -> anyhow::Result<MadeBook> {
    let voice = engine::find_voice(paths, eargs)?;
    let identity = Identity::of(
        &voice,
        &eargs.voice.scales(),
        eargs.voice.speaker.as_deref(),
    )?;
    let plan = plan_book(
        req.doc,
        req.source,
        req.fallback_title,
        &identity,
        req.lexicon,
    )?;
    let progress = Arc::new(Progress::new(req.show_progress, Instant::now()));
    let job = BookJob {
        plan,
        out: req.out.to_path_buf(),
        outputs: req.outputs,
        pauses: targs.pauses(),
        keep_work: req.keep_work,
        worker: worker_name(),
        stop: None,
    };
    let load = || {
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
        progress.layout(&loaded.plan);
        Ok(BookEngine {
            synth: Arc::new(loaded.synth),
            in_flight: loaded.in_flight,
            plan: Some(loaded.plan),
        })
    };
    let observer = progress.clone();
    let made = make_book(job, load, Arc::new(move |e| observer.event(e))).await;
    progress.finish();
    made
}

impl OutputArgs {
    /// The outputs `--format`, `--chapter-files`, `--subtitles` and `--epub-overlay` ask
    /// for, one clear error for a bad combination.
    pub(crate) fn outputs(&self) -> anyhow::Result<BookOutputs> {
        let (format, chapter_files, epub3) = output_format(&self.format, self.chapter_files)?;
        Ok(BookOutputs {
            format,
            chapter_files,
            epub3: epub3.then_some(self.epub_overlay),
            subtitles: subtitle_formats(&self.subtitles)?,
        })
    }
}

/// `narrator run`.
pub(crate) async fn run(paths: &Paths, args: RunArgs) -> anyhow::Result<()> {
    let outputs = args.output.outputs()?;
    // The voice first: its language decides how the text is read.
    let voice = engine::find_voice(paths, &args.engine)?;
    // A read-along EPUB shows an EPUB input as it looked.
    let read = args.text.read_options(&args.meta, outputs.epub3.is_some());
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
        outputs,
        show_progress: show,
        keep_work: args.keep_work,
    };
    let outcome = produce(paths, &args.engine, &args.text, req).await?;
    print_summary(&outcome, &args.out, args.json)
}

fn print_summary(o: &MadeBook, out: &Path, json: bool) -> anyhow::Result<()> {
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
        outputs: BookOutputs {
            format,
            chapter_files: false,
            epub3: None,
            subtitles: Vec::new(),
        },
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
