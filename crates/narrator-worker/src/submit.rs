//! Submitting a planned book to the fleet: one path for every producer (`narrator
//! submit`, and the RabbitMQ intake and HTTP server to come). The job is recorded with
//! its settings and trace in one transaction ([`narrator_db::create_job_with`]), then its
//! first window is published with confirms (fair share: the rest follows as its segments
//! are recorded). A broker that drops or refuses that publish does not lose the book: it
//! is recorded, and a worker's reconciler enqueues what was not confirmed, so
//! [`Submitted::published`] says how the publish went and is not an error of the
//! submission. Reading and planning the book come first, in
//! [`narrator_pipeline::book`]: nothing is recorded for a book that cannot be read.

use lapin::Connection;
use narrator_broker::Publisher;
use narrator_core::{JobPlan, TraceContext};
use narrator_db::{JobSettings, PgPool, Uuid};
use tracing::{Instrument, Span, info_span};

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use narrator_db::FleetShare;

use crate::{WorkerError, dispatch};

/// How long a voice's fleet share, once read, sizes the first windows of the jobs that
/// follow (each counted in it): a flood of requests reads it once a second, not once per
/// book, whose count of active jobs grows with the flood.
const SHARE_FRESH: Duration = Duration::from_secs(1);

/// One book to submit.
#[derive(Debug, Clone, Copy)]
pub struct Submission<'a> {
    pub plan: &'a JobPlan,
    /// The output format's extension (`opus`, `mp3`, `m4b`, `wav`).
    pub format: &'a str,
    /// Above 0: the voice's high lane.
    pub priority: i32,
    pub settings: &'a JobSettings,
    /// The book's trace (its root span's context), recorded with the job.
    pub trace: Option<&'a TraceContext>,
    /// Books of the same submission still to come: they count as running already, so
    /// the first of a folder does not take the whole queue before the others arrive.
    pub coming: u64,
}

/// A recorded book.
#[derive(Debug)]
pub struct Submitted {
    pub job: Uuid,
    /// Whether its first window was published; when not, a worker's reconciler enqueues
    /// it (nothing is lost).
    pub published: Result<usize, WorkerError>,
}

/// A voice's fleet share as read, when, and how many jobs this submitter made since.
type ShareRead = (Option<FleetShare>, Instant, u64);

/// Records and enqueues books on one database pool and broker connection.
pub struct Submitter {
    pool: PgPool,
    publisher: Publisher,
    cluster_id: String,
    /// Per voice: its fleet share as last read.
    shares: Mutex<HashMap<String, ShareRead>>,
}

impl Submitter {
    /// A submitter publishing on `conn` (a channel of its own, with confirms).
    pub async fn new(pool: PgPool, conn: &Connection) -> Result<Self, WorkerError> {
        let publisher = Publisher::new(conn).await?;
        let cluster_id = narrator_db::cluster_id(&pool).await?.to_string();
        Ok(Submitter {
            pool,
            publisher,
            cluster_id,
            shares: Mutex::new(HashMap::new()),
        })
    }

    /// Declares `voice`'s queues (idempotent), so a book submitted before any worker
    /// serves the voice waits in them.
    pub async fn declare_voice(&self, conn: &Connection, voice: &str) -> Result<(), WorkerError> {
        let channel = crate::open_channel(conn).await?;
        narrator_broker::declare(&channel, voice).await?;
        let _ = channel.close(200, "declared".into()).await;
        Ok(())
    }

    /// Records the book and publishes its first window, under `span` (the book's root
    /// span: the record and publish spans join its trace).
    pub async fn submit(&self, s: &Submission<'_>, span: &Span) -> Result<Submitted, WorkerError> {
        let job = self.record(s, span).await?;
        let published = self.publish_first_window(s, job, span).await;
        Ok(Submitted { job, published })
    }

    /// Step 1: the job, its segments, settings and trace, in one transaction (a producer
    /// that dies right after leaves a whole job, which a worker's reconciler enqueues).
    pub async fn record(&self, s: &Submission<'_>, span: &Span) -> Result<Uuid, WorkerError> {
        let record = info_span!(parent: span, "record", otel.name = "INSERT jobs",
            db.system.name = "postgresql", db.operation.name = "INSERT", db.collection.name = "jobs");
        let job = narrator_db::create_job_with(
            &self.pool, s.plan, s.format, s.priority, s.settings, s.trace,
        )
        .instrument(record)
        .await?;
        span.record("narrator.job_id", tracing::field::display(job));
        Ok(job)
    }

    /// Step 2: the job's first window published with confirms; the segments published.
    pub async fn publish_first_window(
        &self,
        s: &Submission<'_>,
        job: Uuid,
        span: &Span,
    ) -> Result<usize, WorkerError> {
        let voice = &s.plan.voice;
        let queue = narrator_broker::lane_queue(voice, narrator_broker::lane_of(s.priority));
        let publish = info_span!(parent: span, "publish", otel.name = %format!("publish {queue}"),
            otel.kind = "producer", messaging.system = "rabbitmq", messaging.operation.type = "publish",
            messaging.destination.name = %queue, messaging.batch.message_count = s.plan.segments.len());
        async {
            let limits = self.first_window(voice, s.priority, s.coming).await?;
            dispatch(&self.pool, &self.publisher, &self.cluster_id, job, limits).await
        }
        .instrument(publish)
        .await
    }

    /// A new job's first window ([`crate::window_of`]), from the voice's fleet share
    /// read at most [`SHARE_FRESH`] ago, with the jobs made since counted as running.
    async fn first_window(
        &self,
        voice: &str,
        priority: i32,
        coming: u64,
    ) -> Result<narrator_db::ClaimLimits, WorkerError> {
        let cached = {
            let mut shares = self.shares.lock().unwrap_or_else(|p| p.into_inner());
            shares
                .get_mut(voice)
                .filter(|(_, at, _)| at.elapsed() < SHARE_FRESH)
                .map(|(share, _, since)| {
                    *since += 1;
                    (share.clone(), *since - 1)
                })
        };
        let (share, since) = match cached {
            Some(c) => c,
            None => {
                let share = crate::fleet_share(&self.pool, voice).await?;
                let mut shares = self.shares.lock().unwrap_or_else(|p| p.into_inner());
                shares.insert(voice.to_string(), (share.clone(), Instant::now(), 1));
                (share, 0)
            }
        };
        Ok(crate::window_of(share.as_ref(), priority, coming + since))
    }
}

/// Puts a failed job back to work ([`narrator_db::retry_job`]) and enqueues the first
/// window of its segments to redo on `conn` (the rest follow as its segments are
/// recorded; should this die first, a worker's reconciler enqueues them). Returns the
/// outcome and how many were enqueued now.
pub async fn retry_job(
    pool: &PgPool,
    conn: &Connection,
    job: Uuid,
) -> Result<(narrator_db::RetryOutcome, usize), WorkerError> {
    let outcome = narrator_db::retry_job(pool, job).await?;
    let narrator_db::RetryOutcome::Retried(segments) = &outcome else {
        return Ok((outcome, 0));
    };
    if segments.is_empty() {
        return Ok((outcome, 0));
    }
    let (voice, priority) = narrator_db::job_route(pool, job).await?;
    let channel = crate::open_channel(conn).await?;
    narrator_broker::declare(&channel, &voice).await?;
    let publisher = Publisher::new(conn).await?;
    let cluster_id = narrator_db::cluster_id(pool).await?.to_string();
    let limits = crate::first_window(pool, &voice, priority, 0).await?;
    let enqueued = crate::dispatch(pool, &publisher, &cluster_id, job, limits).await?;
    Ok((outcome, enqueued))
}
