//! `narrator submit`: the inputs expanded, every book read and planned
//! ([`narrator_pipeline::book`]), then each recorded and its first window published with
//! confirms ([`narrator_worker::Submitter`]; the outbox: segments not marked published
//! are republished by a worker's reconciler). This file keeps the flags and the output.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use narrator_core::JobPlan;
use narrator_db::JobSettings;
use narrator_pipeline::book::{Identity, ReadBook, ReadOptions, file_stem, plan_book, read_book};
use narrator_worker::{Submission, Submitter};
use tracing::info_span;

use crate::cli::SubmitArgs;
use crate::cluster;
use crate::paths::Paths;

const BOOK_EXTENSIONS: [&str; 5] = ["txt", "md", "markdown", "epub", "text"];

/// The books named by the arguments: files as given, folders searched recursively for
/// book files (sorted, so a folder's jobs are submitted in a stable order).
pub(super) fn expand(inputs: &[PathBuf]) -> anyhow::Result<Vec<PathBuf>> {
    let mut books = Vec::new();
    for input in inputs {
        if input.is_dir() {
            let mut found = Vec::new();
            walk(input, &mut found)?;
            if found.is_empty() {
                bail!(
                    "folder {} holds no books (.txt, .md, .epub)",
                    input.display()
                );
            }
            found.sort();
            books.extend(found);
        } else {
            books.push(input.clone());
        }
    }
    Ok(books)
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> anyhow::Result<()> {
    let entries =
        std::fs::read_dir(dir).with_context(|| format!("cannot read folder {}", dir.display()))?;
    for entry in entries {
        let path = entry
            .with_context(|| format!("cannot read folder {}", dir.display()))?
            .path();
        let hidden = path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with('.'));
        if hidden {
            continue;
        }
        if path.is_dir() {
            walk(&path, out)?;
        } else if path
            .extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| BOOK_EXTENSIONS.contains(&e.to_ascii_lowercase().as_str()))
        {
            out.push(path);
        }
    }
    Ok(())
}

/// `narrator submit`: every input read and planned before anything is recorded or
/// enqueued; then each book recorded and its first window published
/// ([`narrator_worker::Submitter`]).
pub(crate) async fn submit(paths: &Paths, args: SubmitArgs) -> anyhow::Result<()> {
    let outputs = args.output.outputs()?;
    let voice = narrator_engine::Voice::find(&paths.voices, &args.voice.name)?;
    // The scales and speaker are part of the job's identity, and recorded with it: every
    // worker synthesizes its segments with exactly them.
    let identity = Identity::of(&voice, &args.voice.scales(), args.voice.speaker.as_deref())?;
    let books = expand(&args.inputs)?;
    if args.book.title.is_some() && books.len() > 1 {
        bail!(
            "--title names one book, and {} were given; submit them one by one, or put each \
             title in its file (EPUB metadata, Markdown front matter `title:`)",
            books.len()
        );
    }
    // A read-along EPUB shows an EPUB input as it looked.
    let read = args.text.read_options(&args.book, outputs.epub3.is_some());
    let plans = books
        .iter()
        .map(|book| plan_one(book, &voice, &identity, &read))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let settings = JobSettings {
        sentence_pause_ms: args.text.sentence_pause_ms,
        paragraph_pause_ms: args.text.paragraph_pause_ms,
        chapter_pause_ms: args.text.chapter_pause_ms,
        chapter_files: outputs.chapter_files,
        subtitles: outputs
            .subtitles
            .iter()
            .map(|f| f.extension().to_string())
            .collect(),
        speed: args.voice.speed,
        epub3: outputs.epub3.map(|o| o.as_str().to_string()),
        // Every worker synthesizes the segments with exactly the scales the job id names.
        scales: Some(identity.scales),
    };
    let pool = cluster::database(&args.services).await?;
    let conn = cluster::broker(&args.services, "narrator-submit").await?;
    let submitter = Submitter::new(pool.clone(), &conn).await?;
    submitter.declare_voice(&conn, &voice.name).await?;
    let voice_served = warn_unless_served(&pool, &voice.name).await?;
    let format = outputs.format.extension();
    let mut unpublished = 0;
    for (n, (plan, span)) in plans.iter().enumerate() {
        // The settings and the trace go in with the job (one transaction): a submitter
        // that dies right after leaves no job without them.
        let trace = narrator_telemetry::propagate::context_of(span);
        let submission = Submission {
            plan,
            format,
            priority: args.priority,
            settings: &settings,
            trace: trace.as_ref(),
            coming: (plans.len() - 1 - n) as u64,
        };
        let job = submitter.record(&submission, span).await?;
        if std::env::var_os("NARRATOR_TEST_CRASH_AFTER_COMMIT").is_some() {
            // Fault injection for the outbox test: die like a killed producer would,
            // between the commit and the publish.
            std::process::abort();
        }
        let published = submitter.publish_first_window(&submission, job, span).await;
        if let Err(e) = &published {
            unpublished += 1;
            eprintln!(
                "warning: {}: job {job} is recorded but its first segments are not enqueued ({}); a worker's reconciler enqueues them",
                plan.source,
                e.to_string().replace('\n', " ")
            );
        }
        if args.json {
            let mut v = serde_json::json!({
                "job_id": job,
                "source": plan.source,
                "title": plan.title,
                "voice": plan.voice,
                "format": format,
                "chapters": plan.chapters.len(),
                "segments": plan.segments.len(),
                "published": published.is_ok(),
                "voice_served": voice_served,
            });
            // With traces on: the book's trace id, to find it in the tracing backend.
            if let Some(id) = trace.as_ref().and_then(|t| t.traceparent.split('-').nth(1)) {
                v["trace_id"] = id.into();
            }
            println!("{v}");
        } else {
            println!(
                "{job}  {}  ({} chapters, {} segments)",
                plan.source,
                plan.chapters.len(),
                plan.segments.len()
            );
        }
    }
    if unpublished > 0 {
        eprintln!(
            "warning: {unpublished} of {} books are recorded but not fully enqueued; nothing is lost: workers enqueue them (`narrator worker --reconcile-after`, default 30 s)",
            plans.len()
        );
    }
    let _ = conn.close(200, "done".into()).await;
    Ok(())
}

/// Reads and plans one book, in a trace of its own (a root span, which its segments and
/// its assembly join); its warnings printed.
fn plan_one(
    book: &Path,
    voice: &narrator_engine::Voice,
    identity: &Identity,
    read: &ReadOptions,
) -> anyhow::Result<(JobPlan, tracing::Span)> {
    let span = info_span!(parent: None, "submit", otel.name = %format!("submit {}", file_stem(book)),
        narrator.source = %book.display(), narrator.voice = %voice.name, narrator.job_id = tracing::field::Empty);
    let _entered = span.enter();
    let ReadBook { doc, lexicon } = info_span!("read", narrator.source = %book.display())
        .in_scope(|| read_book(book, voice, read))?;
    for w in &doc.warnings {
        eprintln!("warning: {}: {w}", book.display());
    }
    let source = book.display().to_string();
    let plan = info_span!("plan")
        .in_scope(|| plan_book(&doc, &source, &file_stem(book), identity, &lexicon))?;
    drop(_entered);
    Ok((plan, span))
}

/// Warns when no worker seen lately serves `voice` (the jobs wait in its queue); whether
/// one does.
async fn warn_unless_served(pool: &narrator_db::PgPool, voice: &str) -> anyhow::Result<bool> {
    let served = voices_served(pool).await?;
    let voice_served = served.iter().any(|v| v == voice);
    if !voice_served {
        eprintln!(
            "warning: no worker seen in the last {} s serves voice {voice}: the jobs wait in its queue until one does \
             (`narrator worker --voices {voice}`); voices served now: {}",
            FLEET_SEEN_WITHIN.as_secs(),
            if served.is_empty() {
                "none".to_string()
            } else {
                served.join(", ")
            }
        );
    }
    Ok(voice_served)
}

/// Workers seen this recently count as the fleet.
const FLEET_SEEN_WITHIN: std::time::Duration = std::time::Duration::from_secs(60);

/// The voices the fleet's workers serve now (their status rows' plans), sorted.
async fn voices_served(pool: &narrator_db::PgPool) -> anyhow::Result<Vec<String>> {
    Ok(narrator_db::served_voices(pool, FLEET_SEEN_WITHIN).await?)
}
