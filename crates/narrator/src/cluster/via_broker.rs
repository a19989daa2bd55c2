//! `narrator submit --via-broker`: the CLI as a producer (docs/PRODUCERS.md). Each book
//! is one request on `narrator.intake` ([`narrator_worker::request::Requester`]); a
//! worker plans and records it and replies. Needs the broker, and S3 for a book sent by
//! `source` (an EPUB, or a text over [`TEXT_IN_MESSAGE`]); no voices, no database. This
//! file maps `submit`'s flags onto the request and prints the replies.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, bail};
use narrator_worker::intake::{JobRequest, Priority, Reply, SpeakerRef, TextFormat};
use narrator_worker::request::Requester;

use crate::cli::SubmitArgs;
use crate::cluster;

/// Texts up to this size travel in the message; larger ones through S3.
const TEXT_IN_MESSAGE: u64 = 4 << 20;

/// Flags a request does not carry: each refused with what to do instead.
fn refuse_unsupported(args: &SubmitArgs) -> anyhow::Result<()> {
    let v = &args.voice;
    let t = &args.text;
    let b = &args.book;
    let unsupported = [
        ("--noise-scale", v.noise_scale.is_some()),
        ("--length-scale", v.length_scale.is_some()),
        ("--noise-w", v.noise_w.is_some()),
        ("--sentence-pause-ms", t.sentence_pause_ms != 250),
        ("--paragraph-pause-ms", t.paragraph_pause_ms != 600),
        ("--chapter-pause-ms", t.chapter_pause_ms != 1500),
        ("--cover", b.cover.is_some()),
        ("--date", b.date.is_some()),
        ("--publisher", b.publisher.is_some()),
    ];
    if let Some((flag, _)) = unsupported.iter().find(|(_, set)| *set) {
        bail!(
            "{flag} is not part of a request (docs/schema/job-request.v1.json); submit \
             without --via-broker to use it, or put it in the book (EPUB metadata, Markdown \
             front matter)"
        );
    }
    Ok(())
}

/// The request's fields from the flags, without the book.
fn request_of(args: &SubmitArgs) -> anyhow::Result<JobRequest> {
    let metadata = match &args.metadata {
        Some(text) => match serde_json::from_str(text) {
            Ok(serde_json::Value::Object(m)) => Some(m),
            _ => bail!("--metadata must be a JSON object, e.g. '{{\"isbn\": \"978-0\"}}'"),
        },
        None => None,
    };
    let mut lexicon = String::new();
    for file in &args.text.lexicon {
        let text = std::fs::read_to_string(file)
            .with_context(|| format!("cannot read lexicon {}", file.display()))?;
        lexicon.push_str(&text);
        lexicon.push('\n');
    }
    let epub3 = matches!(args.output.format.as_str(), "epub3" | "epub");
    Ok(JobRequest {
        version: narrator_worker::intake::REQUEST_VERSION,
        title: args.book.title.clone(),
        author: args.book.author.clone(),
        language: args.book.language.clone(),
        voice: Some(args.voice.name.clone()),
        speaker: args.voice.speaker.clone().map(SpeakerRef::Name),
        speed: args.voice.speed,
        format: Some(args.output.format.clone()),
        chapter_files: args.output.chapter_files,
        subtitles: args.output.subtitles.clone(),
        epub_overlay: epub3.then(|| args.output.epub_overlay.as_str().to_string()),
        priority: if args.priority > 0 {
            Priority::High
        } else {
            Priority::Normal
        },
        lexicon: (!lexicon.is_empty()).then_some(lexicon),
        metadata,
        ..JobRequest::default()
    })
}

/// The book into `request`: its text, or (an EPUB, a large text) uploaded to the
/// bucket under `incoming/KEY/` and named by `source`.
async fn put_book(
    args: &SubmitArgs,
    book: &Path,
    key: &str,
    request: &mut JobRequest,
) -> anyhow::Result<()> {
    let size = std::fs::metadata(book)
        .with_context(|| format!("cannot read {}", book.display()))?
        .len();
    let max = args.text.max_input_mb << 20;
    if size > max {
        bail!(
            "{} is {size} bytes, over --max-input-mb {}; split it, or raise the limit here and on the workers (--intake-max-mb)",
            book.display(),
            args.text.max_input_mb
        );
    }
    let ext = book
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase)
        .unwrap_or_default();
    // The book's own lexicon (BOOK.lexicon) goes first, as `submit` applies it.
    let beside = book.with_extension("lexicon");
    if beside.is_file() {
        let own = std::fs::read_to_string(&beside)
            .with_context(|| format!("cannot read lexicon {}", beside.display()))?;
        request.lexicon = Some(own + "\n" + request.lexicon.as_deref().unwrap_or_default());
    }
    if ext != "epub" && size <= TEXT_IN_MESSAGE {
        request.text = Some(
            std::fs::read_to_string(book)
                .with_context(|| format!("{} is not UTF-8 text", book.display()))?,
        );
        request.text_format = match ext.as_str() {
            "txt" | "text" => TextFormat::Txt,
            _ => TextFormat::Md,
        };
        return Ok(());
    }
    let store = cluster::store(&args.services)
        .await
        .context("a book sent by source goes through S3 (an EPUB, or a text over 4 MiB)")?;
    let name = book
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("book.txt");
    // The intake reads .txt, .md and .epub by the key's extension.
    let name = if ext == "text" {
        format!("{name}.txt")
    } else {
        name.to_string()
    };
    let object = format!("incoming/{key}/{name}");
    store
        .put_file(&object, book)
        .await
        .with_context(|| format!("uploading {} to S3", book.display()))?;
    request.source = Some(format!("s3://{}/{object}", store.bucket()));
    Ok(())
}

/// `narrator submit --via-broker`.
pub(crate) async fn submit(args: SubmitArgs) -> anyhow::Result<()> {
    refuse_unsupported(&args)?;
    let books = super::submit::expand(&args.inputs)?;
    if books.len() > 1 && (args.request_key.is_some() || args.book.title.is_some()) {
        bail!(
            "--request-key and --title name one book, and {} were given; submit them one by one",
            books.len()
        );
    }
    let template = request_of(&args)?;
    let conn = cluster::broker(&args.services, "narrator-submit").await?;
    let mut requester = Requester::new(&conn).await?;
    let wait = Duration::from_secs(args.reply_timeout);
    let mut refused = 0;
    for book in &books {
        let key = args
            .request_key
            .clone()
            .unwrap_or_else(|| narrator_db::Uuid::new_v4().to_string());
        let mut request = template.clone();
        put_book(&args, book, &key, &mut request).await?;
        let reply = requester.request(&request, &key, wait).await?;
        let shown = book.display();
        match reply {
            Reply::Accepted {
                job_id,
                state,
                segments,
                duplicate,
                ..
            } => {
                if args.json {
                    let v = serde_json::json!({
                        "job_id": job_id, "source": shown.to_string(), "state": state,
                        "segments": segments, "duplicate": duplicate, "request_key": key,
                    });
                    println!("{v}");
                } else {
                    let again = if duplicate {
                        ", made before by this request"
                    } else {
                        ""
                    };
                    println!("{job_id}  {shown}  ({segments} segments, request {key}{again})");
                }
            }
            Reply::Refused { error, .. } => {
                refused += 1;
                eprintln!("error: {shown}: {} ({})", error.message, error.code);
            }
        }
    }
    let _ = conn.close(200, "done".into()).await;
    if refused > 0 {
        bail!("{refused} of {} books were refused (above)", books.len());
    }
    Ok(())
}
