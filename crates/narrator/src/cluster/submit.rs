//! `narrator submit`: validate every input, then per book record the job (one
//! transaction) and publish its segments with confirms (the outbox: segments not marked
//! published are republished by a worker's reconciler).

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use narrator_broker::Publisher;
use narrator_core::JobPlan;
use narrator_db::JobSettings;
use narrator_pipeline::{AudioIdentity, plan_job};
use tracing::{Instrument, info_span};

use crate::cli::SubmitArgs;
use crate::cluster;
use crate::paths::Paths;
use crate::run::{apply_book_args, file_stem, identity_digest, lexicon_for, load_options};

const BOOK_EXTENSIONS: [&str; 5] = ["txt", "md", "markdown", "epub", "text"];

/// The books named by the arguments: files as given, folders searched recursively for
/// book files (sorted, so a folder's jobs are submitted in a stable order).
fn expand(inputs: &[PathBuf]) -> anyhow::Result<Vec<PathBuf>> {
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

/// `narrator submit`.
pub(crate) async fn submit(paths: &Paths, args: SubmitArgs) -> anyhow::Result<()> {
    let (format, chapter_files, epub3) =
        crate::run::output_format(&args.format, args.chapter_files)?;
    let subtitles = crate::run::subtitle_formats(&args.subtitles)?;
    let voice = narrator_engine::Voice::find(&paths.voices, &args.voice)?;
    let digest = identity_digest(&voice);
    let mut d = voice.family.default_scales();
    if let Some(speed) = args.speed {
        // The rate is part of the job's identity, as in `run`.
        d.length /= speed;
    }
    let opts = narrator_text::LoadOptions {
        // A read-along EPUB shows an EPUB input as it looked.
        keep_looks: epub3,
        ..load_options(&args.text, &voice)
    };
    let speaker = match &args.speaker {
        Some(s) => voice.family.speaker_id(&voice.name, s)?,
        None => 0,
    };
    // Every input is read and planned before anything is recorded or enqueued. Each book
    // is its own trace (a root span), which its segments and its assembly join.
    let mut plans: Vec<(JobPlan, tracing::Span)> = Vec::new();
    let books = expand(&args.inputs)?;
    if args.book.title.is_some() && books.len() > 1 {
        bail!(
            "--title names one book, and {} were given; submit them one by one, or put each \
             title in its file (EPUB metadata, Markdown front matter `title:`)",
            books.len()
        );
    }
    for book in books {
        let span = info_span!(parent: None, "submit", otel.name = %format!("submit {}", file_stem(&book)),
            narrator.source = %book.display(), narrator.voice = %voice.name, narrator.job_id = tracing::field::Empty);
        let _entered = span.enter();
        let mut doc = info_span!("read", narrator.source = %book.display())
            .in_scope(|| narrator_text::load_document(&book, &opts))?;
        apply_book_args(&mut doc, &args.book, &book)?;
        let lexicon = lexicon_for(Some(&book), &args.text)?;
        doc.apply_lexicon(&lexicon, &opts)?;
        for w in &doc.warnings {
            eprintln!("warning: {}: {w}", book.display());
        }
        let source = book.display().to_string();
        let mut plan = info_span!("plan").in_scope(|| {
            plan_job(
                &doc,
                &source,
                &file_stem(&book),
                &AudioIdentity {
                    voice: &voice.name,
                    voice_digest: &digest,
                    scales: d,
                    speaker,
                },
            )
        });
        plan.lexicon = (!lexicon.is_empty()).then(|| lexicon.source().to_owned());
        if plan.segments.is_empty() {
            bail!(
                "{source} has nothing speakable after cleaning; check that it holds readable text"
            );
        }
        drop(_entered);
        plans.push((plan, span));
    }
    let settings = JobSettings {
        sentence_pause_ms: args.text.sentence_pause_ms,
        paragraph_pause_ms: args.text.paragraph_pause_ms,
        chapter_pause_ms: args.text.chapter_pause_ms,
        chapter_files,
        subtitles: subtitles
            .iter()
            .map(|f| f.extension().to_string())
            .collect(),
        speed: args.speed,
        epub3: epub3.then(|| args.epub_overlay.as_str().to_string()),
    };
    let pool = cluster::database(&args.services).await?;
    let conn = cluster::broker(&args.services, "narrator-submit").await?;
    let channel = conn
        .create_channel()
        .await
        .context("opening a RabbitMQ channel")?;
    narrator_broker::declare(&channel, &voice.name).await?;
    let publisher = Publisher::new(&conn).await?;
    let cluster_id = narrator_db::cluster_id(&pool).await?.to_string();
    let served = voices_served(&pool).await?;
    let voice_served = served.contains(&voice.name);
    if !voice_served {
        eprintln!(
            "warning: no worker seen in the last {} s serves voice {}: the jobs wait in its queue until one does \
             (`narrator worker --voices {}`); voices served now: {}",
            FLEET_SEEN_WITHIN.as_secs(),
            voice.name,
            voice.name,
            if served.is_empty() {
                "none".to_string()
            } else {
                served.join(", ")
            }
        );
    }
    let mut unpublished = 0;
    for (n, (plan, span)) in plans.iter().enumerate() {
        let record = info_span!(parent: span, "record", otel.name = "INSERT jobs",
            db.system.name = "postgresql", db.operation.name = "INSERT", db.collection.name = "jobs");
        // The settings and the trace go in with the job (one transaction): a submitter
        // that dies right after leaves no job without them.
        let trace = narrator_telemetry::propagate::context_of(span);
        let job = narrator_db::create_job_with(
            &pool,
            plan,
            format.extension(),
            args.priority,
            &settings,
            trace.as_ref(),
        )
        .instrument(record)
        .await?;
        span.record("narrator.job_id", tracing::field::display(job));
        if std::env::var_os("NARRATOR_TEST_CRASH_AFTER_COMMIT").is_some() {
            // Fault injection for the outbox test: die like a killed producer would.
            std::process::abort();
        }
        // Only the job's first window is published (fair share: the rest follows as its
        // segments are recorded). A broker that drops or refuses a publish does not lose
        // the book: it is recorded, and a worker's reconciler enqueues what was not
        // confirmed. The other books go on.
        let queue =
            narrator_broker::lane_queue(&voice.name, narrator_broker::lane_of(args.priority));
        let publish = info_span!(parent: span, "publish", otel.name = %format!("publish {queue}"),
            otel.kind = "producer", messaging.system = "rabbitmq", messaging.operation.type = "publish",
            messaging.destination.name = %queue, messaging.batch.message_count = plan.segments.len());
        let published = async {
            // The books of this submission still to come count as running already: the
            // first of a folder does not take the whole queue before the others arrive.
            let coming = (plans.len() - 1 - n) as u64;
            let limits =
                narrator_worker::first_window(&pool, &voice.name, args.priority, coming).await?;
            narrator_worker::dispatch(&pool, &publisher, &cluster_id, job, limits).await?;
            anyhow::Ok(())
        }
        .instrument(publish)
        .await;
        if let Err(e) = &published {
            unpublished += 1;
            eprintln!(
                "warning: {}: job {job} is recorded but its first segments are not enqueued ({}); a worker's reconciler enqueues them",
                plan.source,
                e.to_string().replace('\n', " ")
            );
        }
        if args.json {
            let v = serde_json::json!({
                "job_id": job,
                "source": plan.source,
                "title": plan.title,
                "voice": plan.voice,
                "format": format.extension(),
                "chapters": plan.chapters.len(),
                "segments": plan.segments.len(),
                "published": published.is_ok(),
                "voice_served": voice_served,
            });
            // With traces on: the book's trace id, to find it in the tracing backend.
            let mut v = v;
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

/// Workers seen this recently count as the fleet.
const FLEET_SEEN_WITHIN: std::time::Duration = std::time::Duration::from_secs(60);

/// The voices the fleet's workers serve now (their status rows' plans), sorted.
async fn voices_served(pool: &narrator_db::PgPool) -> anyhow::Result<Vec<String>> {
    Ok(narrator_db::served_voices(pool, FLEET_SEEN_WITHIN).await?)
}
