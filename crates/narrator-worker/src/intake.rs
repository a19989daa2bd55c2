//! The producers' way in (docs/PRODUCERS.md): a book requested with one message on
//! `narrator.intake`, in any language's AMQP client. Every worker that takes intake
//! consumes it with `--intake-prefetch` consumers, each on channels of its own and one
//! request at a time ([`Intake::serve`]); for each request it reads and plans the book
//! through the same library path as `narrator submit` ([`narrator_pipeline::book`]),
//! records the job ([`narrator_db::create_requested_job`]: the request's key makes one
//! job however often it is delivered), publishes its first window, answers the request's
//! `reply_to` and only then acknowledges. A request that cannot make a job is answered
//! with an error, dead-lettered to `narrator.intake.dead` with its reason in a header, and
//! acknowledged: never retried in a loop. A request that meets an outage (the database
//! away) is tried again in place, the message held, until it goes through or the worker
//! stops (then it goes back to the queue).

use std::path::PathBuf;
use std::time::Duration;

use futures_util::StreamExt;
use lapin::message::Delivery as AmqpDelivery;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicNackOptions, BasicQosOptions};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Connection};
use narrator_broker::{
    INTAKE_CODE_HEADER, INTAKE_DEAD_EXCHANGE, INTAKE_QUEUE, INTAKE_REASON_HEADER, Publisher,
};
use narrator_core::RetryClass;
use narrator_db::{Created, JobRequestRecord, JobSettings, PgPool, Uuid};
use narrator_engine::{ScaleOverrides, Voice};
use narrator_pipeline::book::{
    Identity, MetaOverrides, ReadBook, ReadOptions, output_format, plan_book, read_book_bytes,
    subtitle_formats,
};
use narrator_pipeline::embedded::BookOutputs;
use narrator_s3::S3AudioStore;
use narrator_text::InputFormat;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::{Submission, Submitter, WorkerError};

/// The request schema's version this worker reads (docs/schema/job-request.v1.json).
pub const REQUEST_VERSION: u32 = 1;
/// The largest producer metadata kept with a job, serialized.
pub const MAX_METADATA_BYTES: usize = 16 * 1024;

/// How a worker serves the intake.
#[derive(Debug, Clone)]
pub struct IntakeConfig {
    /// Where the installed voices are (a request names one).
    pub voices_dir: PathBuf,
    /// The largest book accepted, in bytes (as `submit --max-input-mb`).
    pub max_input_bytes: u64,
    /// Requests served at once: this many consumers of the intake, each with channels
    /// of its own, each handling one request at a time.
    pub prefetch: u16,
    /// Fault injection for tests: the process aborts right after a request's job is
    /// recorded, before its reply and acknowledgement (a worker killed mid-intake).
    pub abort_after_record: bool,
}

/// One request: the body of a message on `narrator.intake` (docs/schema/job-request.v1.json).
/// Serialized by [`crate::request::Requester`] (`narrator submit --via-broker`), absent
/// fields left out.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct JobRequest {
    pub version: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    #[serde(default)]
    pub text_format: TextFormat,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub author: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub language: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub voice: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub speaker: Option<SpeakerRef>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub speed: Option<f32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub format: Option<String>,
    #[serde(default)]
    pub chapter_files: bool,
    #[serde(default)]
    pub subtitles: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub epub_overlay: Option<String>,
    #[serde(default)]
    pub priority: Priority,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lexicon: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metadata: Option<serde_json::Map<String, serde_json::Value>>,
}

/// How a request's `text` is read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TextFormat {
    #[default]
    Md,
    Txt,
}

/// A speaker by name or id.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(untagged)]
pub enum SpeakerRef {
    Id(u32),
    Name(String),
}

/// A request's lane.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Priority {
    #[default]
    Normal,
    High,
}

/// The default voice of a request that names none (as `narrator submit`'s).
pub const DEFAULT_VOICE: &str = "en_US-joe-medium";

/// Why a request made no job: its code (docs/schema/job-reply.v1.json) and one line that
/// says what was wrong and what to do. Permanent (`class`): answered and dead-lettered;
/// infrastructure: tried again.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestError {
    pub code: &'static str,
    pub message: String,
    pub class: RetryClass,
}

impl RequestError {
    fn bad(code: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into().replace('\n', " "),
            class: RetryClass::Permanent,
        }
    }

    /// A failure of the database or broker: an outage is tried again (`unavailable`,
    /// never replied); anything permanent is replied as `internal`.
    fn from_worker(e: WorkerError) -> Self {
        let permanent = e.retry_class() == RetryClass::Permanent;
        Self {
            code: if permanent { "internal" } else { "unavailable" },
            message: e.to_string().replace('\n', " "),
            class: if permanent {
                RetryClass::Permanent
            } else {
                RetryClass::Infrastructure
            },
        }
    }
}

/// The answer to a request, as sent to its `reply_to`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Reply {
    Accepted {
        version: u32,
        job_id: Uuid,
        state: String,
        segments: u32,
        duplicate: bool,
        idempotency_key: Option<String>,
    },
    Refused {
        version: u32,
        error: ReplyError,
    },
}

/// A refused request's error, as replied.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReplyError {
    pub code: String,
    pub message: String,
}

impl From<&RequestError> for Reply {
    fn from(e: &RequestError) -> Self {
        Reply::Refused {
            version: REQUEST_VERSION,
            error: ReplyError {
                code: e.code.to_string(),
                message: e.message.clone(),
            },
        }
    }
}

/// Parses and checks a request's body; `message_id` (the AMQP property) names it when
/// the body has no `idempotency_key`.
pub fn parse_request(body: &[u8]) -> Result<JobRequest, RequestError> {
    let value: serde_json::Value = serde_json::from_slice(body).map_err(|e| {
        RequestError::bad(
            "not_json",
            format!("the message body is not JSON ({e}); send a JSON object as in docs/schema/job-request.v1.json"),
        )
    })?;
    let request: JobRequest = serde_json::from_value(value).map_err(|e| {
        RequestError::bad(
            "invalid_request",
            format!("the request does not follow docs/schema/job-request.v1.json: {e}"),
        )
    })?;
    check(&request)?;
    Ok(request)
}

/// What the schema says beyond the fields' types.
fn check(r: &JobRequest) -> Result<(), RequestError> {
    let bad = |m: String| Err(RequestError::bad("invalid_request", m));
    if r.version != REQUEST_VERSION {
        return bad(format!(
            "version {} is not one this worker reads; send \"version\": {REQUEST_VERSION}",
            r.version
        ));
    }
    match (&r.text, &r.source) {
        (Some(_), Some(_)) => {
            return bad("the request has both text and source; send exactly one".into());
        }
        (None, None) => {
            return bad("the request has neither text nor source; send the book as text, or source: \"s3://bucket/key\"".into());
        }
        (Some(t), None) if t.trim().is_empty() => {
            return bad("text is empty; send the book's text".into());
        }
        _ => {}
    }
    if let Some(source) = &r.source {
        let (_, key) = s3_location(source)?;
        book_format(key)?;
    }
    if let Some(key) = &r.idempotency_key
        && (key.is_empty() || key.len() > 200)
    {
        return bad("idempotency_key must be 1 to 200 characters".into());
    }
    if let Some(m) = &r.metadata {
        let n = serde_json::to_string(m).map_or(usize::MAX, |s| s.len());
        if n > MAX_METADATA_BYTES {
            return bad(format!(
                "metadata is {n} bytes serialized, over the {MAX_METADATA_BYTES} allowed; keep large data elsewhere and send a reference"
            ));
        }
    }
    if let Some(speed) = r.speed
        && !(0.5..=2.0).contains(&speed)
    {
        return bad(format!("speed {speed} is outside 0.5 to 2.0"));
    }
    Ok(())
}

/// The bucket and key of a `source` (`s3://bucket/key`).
fn s3_location(source: &str) -> Result<(&str, &str), RequestError> {
    source
        .strip_prefix("s3://")
        .and_then(|rest| rest.split_once('/'))
        .filter(|(bucket, key)| !bucket.is_empty() && !key.is_empty())
        .ok_or_else(|| {
            RequestError::bad(
                "invalid_request",
                format!("source {source:?} is not an S3 location; send \"s3://bucket/key\""),
            )
        })
}

/// How a source's book is read, by its key's extension (`.txt`, `.md`, `.markdown`,
/// `.epub`).
fn book_format(key: &str) -> Result<InputFormat, RequestError> {
    InputFormat::from_path(std::path::Path::new(key)).ok_or_else(|| {
        RequestError::bad(
            "source_unreadable",
            format!("{key:?} is not a book this fleet reads; name a .txt, .md or .epub object"),
        )
    })
}

/// A request's book as read: its bytes, how to parse them, and where it came from (the
/// job's source).
pub struct BookBytes {
    pub bytes: Vec<u8>,
    pub format: InputFormat,
    pub source: String,
    /// The title when the book has none (as `submit` takes the file's name).
    pub fallback_title: String,
}

/// A request's outputs, as `submit --format/--chapter-files/--subtitles/--epub-overlay`
/// reads them.
pub fn request_outputs(r: &JobRequest) -> Result<BookOutputs, RequestError> {
    let bad = |e: anyhow::Error| RequestError::bad("invalid_request", format!("{e:#}"));
    let (format, chapter_files, epub3) =
        output_format(r.format.as_deref().unwrap_or("opus"), r.chapter_files).map_err(bad)?;
    let subtitles = subtitle_formats(&r.subtitles).map_err(bad)?;
    let overlay = match epub3 {
        true => Some(
            r.epub_overlay
                .as_deref()
                .unwrap_or("sentence")
                .parse()
                .map_err(|e: narrator_pipeline::epub3::UnknownOverlay| {
                    RequestError::bad("invalid_request", e.to_string())
                })?,
        ),
        false => None,
    };
    Ok(BookOutputs {
        format,
        chapter_files,
        subtitles,
        epub3: overlay,
    })
}

/// A request read and planned: what is recorded.
pub struct Planned {
    pub plan: narrator_core::JobPlan,
    pub settings: JobSettings,
    pub outputs: BookOutputs,
    /// The audio format's extension.
    pub format: String,
    pub priority: i32,
}

/// Reads and plans a request's book for its voice (blocking: the text is parsed and
/// segmented), in memory, with every bound a book file of `submit` has: the voice is
/// looked up in `voices_dir`, the book refused over `max_input_bytes`.
pub fn plan_request(
    r: &JobRequest,
    book: BookBytes,
    voices_dir: &std::path::Path,
    max_input_bytes: u64,
) -> Result<Planned, RequestError> {
    let voice_name = r.voice.as_deref().unwrap_or(DEFAULT_VOICE);
    let voice = Voice::find(voices_dir, voice_name).map_err(|e| {
        RequestError::bad(
            "unknown_voice",
            format!("{e}; name a voice the workers have installed (`narrator voices`)"),
        )
    })?;
    let scales = ScaleOverrides {
        speed: r.speed,
        ..ScaleOverrides::default()
    };
    let speaker = r.speaker.as_ref().map(|s| match s {
        SpeakerRef::Id(n) => n.to_string(),
        SpeakerRef::Name(n) => n.clone(),
    });
    let identity = Identity::of(&voice, &scales, speaker.as_deref())
        .map_err(|e| RequestError::bad("invalid_request", format!("{e:#}")))?;
    let outputs = request_outputs(r)?;
    let read = ReadOptions {
        max_input_bytes,
        keep_looks: outputs.epub3.is_some(),
        lexicons: Vec::new(),
        meta: MetaOverrides {
            title: r.title.clone(),
            author: r.author.clone(),
            language: r.language.clone(),
            ..MetaOverrides::default()
        },
    };
    let ReadBook { doc, lexicon } = read_book_bytes(
        &book.bytes,
        book.format,
        &book.source,
        r.lexicon.as_deref(),
        &voice,
        &read,
    )
    .map_err(|e| RequestError::bad("unreadable_book", format!("{e:#}")))?;
    let plan = plan_book(
        &doc,
        &book.source,
        &book.fallback_title,
        &identity,
        &lexicon,
    )
    .map_err(|e| RequestError::bad("unreadable_book", format!("{e:#}")))?;
    let settings = JobSettings {
        sentence_pause_ms: 250,
        paragraph_pause_ms: 600,
        chapter_pause_ms: 1500,
        chapter_files: outputs.chapter_files,
        subtitles: outputs
            .subtitles
            .iter()
            .map(|f| f.extension().to_string())
            .collect(),
        speed: r.speed,
        epub3: outputs.epub3.map(|o| o.as_str().to_string()),
        scales: Some(identity.scales),
    };
    Ok(Planned {
        plan,
        settings,
        format: outputs.format.extension().to_string(),
        outputs,
        priority: i32::from(r.priority == Priority::High),
    })
}

/// A book over the fleet's bound.
fn too_large(bytes: u64, max: u64) -> RequestError {
    RequestError::bad(
        "too_large",
        format!(
            "the book is {bytes} bytes, over the {max} this fleet accepts; split it, or ask the operator to raise --max-input-mb"
        ),
    )
}

fn infra(message: String) -> RequestError {
    RequestError {
        code: "unavailable",
        message,
        class: RetryClass::Infrastructure,
    }
}

/// A worker's intake: reads requests, records their jobs, answers them.
pub struct Intake {
    pool: PgPool,
    submitter: Submitter,
    publisher: Publisher,
    /// Reads books requested by `source` (its client, on the source's bucket).
    store: S3AudioStore,
    config: IntakeConfig,
}

impl Intake {
    /// An intake recording into `pool`, publishing on `conn` and reading sources with
    /// `store`'s client.
    pub async fn new(
        pool: PgPool,
        conn: &Connection,
        store: S3AudioStore,
        config: IntakeConfig,
    ) -> Result<Self, WorkerError> {
        Ok(Self {
            submitter: Submitter::new(pool.clone(), conn).await?,
            publisher: Publisher::new(conn).await?,
            pool,
            store,
            config,
        })
    }

    /// The request's book: its text, or the object its `source` names (at most
    /// `max_input_bytes`). An object that is missing or refused is the request's fault;
    /// the store being away is an outage (tried again).
    /// The text is taken out of `r` (not copied: it may be megabytes).
    async fn book_of(&self, r: &mut JobRequest, name: &str) -> Result<BookBytes, RequestError> {
        let max = self.config.max_input_bytes;
        let Some(source) = &r.source else {
            let text = r.text.take().unwrap_or_default();
            if text.len() as u64 > max {
                return Err(too_large(text.len() as u64, max));
            }
            let format = match r.text_format {
                TextFormat::Md => InputFormat::Markdown,
                TextFormat::Txt => InputFormat::Text,
            };
            return Ok(BookBytes {
                bytes: text.into_bytes(),
                format,
                source: format!("amqp:{INTAKE_QUEUE}/{name}"),
                fallback_title: "book".to_string(),
            });
        };
        let (bucket, key) = s3_location(source)?;
        let format = book_format(key)?;
        let store = self.store.for_bucket(bucket);
        let unreadable = |e: narrator_s3::S3Error| match e.retry_class() {
            RetryClass::Infrastructure => infra(format!("reading {source}: {e}")),
            _ => RequestError::bad(
                "source_unreadable",
                format!(
                    "cannot read {source}: {e}; check that the object exists and that the fleet's S3 credentials may read it"
                ),
            ),
        };
        let size = store.head(key).await.map_err(unreadable)?.ok_or_else(|| {
            RequestError::bad(
                "source_unreadable",
                format!(
                    "{source} does not exist; upload the book first, or check the bucket and key"
                ),
            )
        })?;
        if size > max {
            return Err(too_large(size, max));
        }
        let bytes = store.get_bytes(key).await.map_err(unreadable)?;
        if bytes.len() as u64 > max {
            return Err(too_large(bytes.len() as u64, max));
        }
        Ok(BookBytes {
            bytes,
            format,
            source: source.clone(),
            fallback_title: narrator_pipeline::book::file_stem(std::path::Path::new(key)),
        })
    }

    /// One request: its job (new, or the one its key made before) or why it made none.
    pub async fn accept(
        &self,
        body: &[u8],
        message_id: Option<&str>,
    ) -> Result<Reply, RequestError> {
        self.accept_for(parse_request(body)?, message_id, None)
            .await
    }

    /// A parsed request made a job of `tenant`'s (`narrator serve`'s fleet gateway): its
    /// key is the tenant's own (`TENANT:KEY` in the fleet), so tenants never meet each
    /// other's jobs through a key.
    pub async fn accept_for(
        &self,
        mut request: JobRequest,
        message_id: Option<&str>,
        tenant: Option<&str>,
    ) -> Result<Reply, RequestError> {
        let key = request
            .idempotency_key
            .clone()
            .or_else(|| message_id.filter(|m| !m.is_empty()).map(str::to_string))
            .map(|k| match tenant {
                Some(t) => format!("{t}:{k}"),
                None => k,
            });
        if let Some(k) = &key
            && let Some(job) = narrator_db::job_by_request_key(&self.pool, k)
                .await
                .map_err(|e| RequestError::from_worker(e.into()))?
        {
            return self.accepted(job, true, key).await;
        }
        let name = key.clone().unwrap_or_else(|| Uuid::new_v4().to_string());
        let book = self.book_of(&mut request, &name).await?;
        let config = self.config.clone();
        let planned = {
            let request = request.clone();
            tokio::task::spawn_blocking(move || {
                plan_request(&request, book, &config.voices_dir, config.max_input_bytes)
            })
            .await
            .map_err(|e| infra(format!("planning the request: {e}")))??
        };
        let record = JobRequestRecord {
            key: key.clone(),
            metadata: request.metadata.clone().map(serde_json::Value::Object),
            tenant: tenant.map(str::to_string),
        };
        let created = narrator_db::create_requested_job(
            &self.pool,
            &planned.plan,
            (&planned.format, planned.priority),
            &planned.settings,
            None,
            &record,
        )
        .await
        .map_err(|e| RequestError::from_worker(e.into()))?;
        let job = match created {
            Created::Existing(job) => return self.accepted(job, true, key).await,
            Created::New(job) => job,
        };
        if self.config.abort_after_record {
            eprintln!("aborting after recording job {job} (NARRATOR_TEST_INTAKE_ABORT)");
            std::process::abort();
        }
        let submission = Submission {
            plan: &planned.plan,
            format: &planned.format,
            priority: planned.priority,
            settings: &planned.settings,
            trace: None,
            coming: 0,
        };
        if let Err(e) = self
            .submitter
            .publish_first_window(&submission, job, &tracing::Span::none())
            .await
        {
            // Recorded: a worker's reconciler enqueues what was not published.
            tracing::warn!(%job, error = %e, "a requested job is recorded but its first segments are not enqueued; the reconciler will");
        }
        self.accepted(job, false, key).await
    }

    async fn accepted(
        &self,
        job: Uuid,
        duplicate: bool,
        key: Option<String>,
    ) -> Result<Reply, RequestError> {
        let status = narrator_db::job_status(&self.pool, job)
            .await
            .map_err(|e| RequestError::from_worker(e.into()))?
            .ok_or_else(|| infra(format!("job {job} was recorded but cannot be read back")))?;
        Ok(Reply::Accepted {
            version: REQUEST_VERSION,
            job_id: job,
            state: status.summary.state.as_str().to_string(),
            segments: status.summary.segments_total,
            duplicate,
            idempotency_key: key,
        })
    }

    /// Serves `INTAKE_QUEUE` on `channel` until `stop`, one request at a time
    /// ([`Self::handle`]; prefetch 1). A worker runs `prefetch` of these, each
    /// an [`Intake`] with channels of its own (the requests of one are never published on
    /// another's channel).
    pub async fn serve(
        &self,
        channel: Channel,
        mut stop: watch::Receiver<bool>,
    ) -> Result<(), WorkerError> {
        channel
            .basic_qos(1, BasicQosOptions::default())
            .await
            .map_err(|e| narrator_broker::BrokerError::amqp("basic.qos", e))?;
        let mut consumer = channel
            .basic_consume(
                INTAKE_QUEUE.into(),
                "".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(|e| {
                narrator_broker::BrokerError::amqp(format!("basic.consume {INTAKE_QUEUE}"), e)
            })?;
        loop {
            let delivery = tokio::select! {
                _ = stop.wait_for(|s| *s) => return Ok(()),
                d = consumer.next() => d,
            };
            match delivery {
                Some(Ok(d)) => self.handle(d, stop.clone()).await?,
                Some(Err(e)) => {
                    return Err(narrator_broker::BrokerError::amqp("intake delivery", e).into());
                }
                None => return Ok(()),
            }
        }
    }

    /// One delivery: accepted (answered, then acknowledged), refused (answered,
    /// dead-lettered with its reason, acknowledged), or, while the database or broker is
    /// away, tried again every few seconds, the message held; a stop meanwhile puts it
    /// back in the queue.
    async fn handle(
        &self,
        d: AmqpDelivery,
        mut stop: watch::Receiver<bool>,
    ) -> Result<(), WorkerError> {
        let message_id = d
            .properties
            .message_id()
            .as_ref()
            .map(|m| m.as_str().to_string());
        let mut pause = Duration::from_secs(1);
        let outcome = loop {
            match self.accept(&d.data, message_id.as_deref()).await {
                Err(e) if e.class != RetryClass::Permanent => {
                    tracing::warn!(error = %e.message, "a request met an outage; trying it again");
                    let stopping = tokio::select! {
                        r = stop.wait_for(|s| *s) => r.is_ok(),
                        _ = tokio::time::sleep(crate::jittered(pause)) => false,
                    };
                    if stopping {
                        let opts = BasicNackOptions {
                            requeue: true,
                            multiple: false,
                        };
                        let _ = d.acker.nack(opts).await;
                        return Ok(());
                    }
                    pause = (pause * 2).min(Duration::from_secs(30));
                }
                other => break other,
            }
        };
        let reply = match &outcome {
            Ok(reply) => {
                if let Reply::Accepted {
                    job_id, duplicate, ..
                } = reply
                {
                    tracing::info!(job = %job_id, duplicate, "request accepted");
                }
                reply.clone()
            }
            Err(e) => {
                tracing::warn!(code = e.code, reason = %e.message, "request refused; dead-lettered");
                self.dead_letter(&d, e).await?;
                Reply::from(e)
            }
        };
        self.answer(&d, &reply).await;
        d.acker
            .ack(BasicAckOptions::default())
            .await
            .map_err(|e| narrator_broker::BrokerError::amqp("basic.ack", e))?;
        Ok(())
    }

    /// The request to `narrator.intake.dead`, its reason and code in headers.
    async fn dead_letter(&self, d: &AmqpDelivery, e: &RequestError) -> Result<(), WorkerError> {
        let mut headers = d.properties.headers().clone().unwrap_or_default();
        headers.insert(
            INTAKE_REASON_HEADER.into(),
            AMQPValue::LongString(LongString::from(e.message.as_str())),
        );
        headers.insert(
            INTAKE_CODE_HEADER.into(),
            AMQPValue::LongString(LongString::from(e.code)),
        );
        let props = d.properties.clone().with_headers(headers);
        self.publisher
            .publish_raw(INTAKE_DEAD_EXCHANGE, INTAKE_QUEUE, &d.data, props)
            .await?;
        Ok(())
    }

    /// The reply, when the request asked for one: to its `reply_to`, with its
    /// `correlation_id`. A requester gone meanwhile only loses its answer (logged).
    async fn answer(&self, d: &AmqpDelivery, reply: &Reply) {
        let Some(to) = d
            .properties
            .reply_to()
            .as_ref()
            .map(|r| r.as_str().to_string())
        else {
            return;
        };
        let body = match serde_json::to_vec(reply) {
            Ok(b) => b,
            Err(e) => {
                tracing::warn!(error = %e, "cannot encode a reply");
                return;
            }
        };
        let mut props =
            BasicProperties::default().with_content_type(ShortString::from("application/json"));
        if let Some(c) = d.properties.correlation_id() {
            props = props.with_correlation_id(c.clone());
        }
        // Not mandatory: a reply to a requester gone meanwhile is dropped by the broker,
        // not returned.
        if let Err(e) = self.publisher.publish_optional("", &to, &body, props).await {
            tracing::warn!(reply_to = %to, error = %e, "cannot send a reply (the requester may be gone)");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn code(body: &str) -> &'static str {
        parse_request(body.as_bytes())
            .map(|_| "ok")
            .unwrap_or_else(|e| e.code)
    }

    #[test]
    fn requests_are_checked_against_the_schema() {
        assert_eq!(code(r#"{"version": 1, "text": "Hello."}"#), "ok");
        assert_eq!(code("not json"), "not_json");
        assert_eq!(code(r#"{"version": 1}"#), "invalid_request");
        assert_eq!(
            code(r#"{"version": 1, "text": "a", "source": "s3://b/k.txt"}"#),
            "invalid_request"
        );
        assert_eq!(code(r#"{"version": 2, "text": "a"}"#), "invalid_request");
        assert_eq!(
            code(r#"{"version": 1, "text": "a", "colour": "red"}"#),
            "invalid_request"
        );
        assert_eq!(
            code(r#"{"version": 1, "text": "a", "speed": 3}"#),
            "invalid_request"
        );
        assert_eq!(
            code(r#"{"version": 1, "text": "a", "priority": "urgent"}"#),
            "invalid_request"
        );
        assert_eq!(code(r#"{"version": 1, "text": "   "}"#), "invalid_request");
        let big = format!(
            r#"{{"version": 1, "text": "a", "metadata": {{"x": "{}"}}}}"#,
            "y".repeat(17000)
        );
        assert_eq!(code(&big), "invalid_request");
        assert_eq!(code(r#"{"version": 1, "source": "s3://b/k.epub"}"#), "ok");
        assert_eq!(
            code(r#"{"version": 1, "source": "s3://b/"}"#),
            "invalid_request"
        );
        assert_eq!(
            code(r#"{"version": 1, "source": "https://b/k.md"}"#),
            "invalid_request"
        );
        assert_eq!(
            code(r#"{"version": 1, "source": "s3://b/k.pdf"}"#),
            "source_unreadable"
        );
        let e = parse_request(br#"{"version": 1}"#).expect_err("refused");
        assert!(
            e.message.contains("neither text nor source"),
            "{}",
            e.message
        );
        assert_eq!(e.class, RetryClass::Permanent);
    }

    #[test]
    fn replies_serialize_as_the_schema_says() {
        let ok = Reply::Accepted {
            version: 1,
            job_id: Uuid::nil(),
            state: "queued".into(),
            segments: 3,
            duplicate: false,
            idempotency_key: Some("k".into()),
        };
        let v = serde_json::to_value(&ok).expect("json");
        assert_eq!(v["job_id"], "00000000-0000-0000-0000-000000000000");
        assert_eq!(v["duplicate"], false);
        let refused = Reply::from(&RequestError::bad("not_json", "x"));
        let v = serde_json::to_value(&refused).expect("json");
        assert_eq!(v["error"]["code"], "not_json");
        assert_eq!(v["version"], 1);
    }
}
