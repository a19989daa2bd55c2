//! The boundaries the distributed mode swaps. Each has an embedded implementation (local
//! folder, journal file) and, later, a networked one (S3, Postgres). They are async traits
//! used through generics.

use std::future::Future;
use std::path::Path;

use crate::{PackedAt, SegmentAudio, SegmentRecord};

/// How a failure should be retried. Every error type of the seams declares its class, so
/// the broker's decision follows the type, never a string match on a kind word.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RetryClass {
    /// The segment's own try failed and may work later (an engine hiccup, a lost race):
    /// retry with backoff, counted against the segment's attempts.
    Transient,
    /// Will never work for this segment (text that cannot be spoken, a bad record):
    /// give up at once, with the reason.
    Permanent,
    /// The message itself cannot be read: give up at once.
    Malformed,
    /// A service the worker depends on (database, object store, broker) is away or
    /// timing out. Not the segment's fault: retry after a pause without charging it an
    /// attempt, and tell the operator about the outage.
    Infrastructure,
}

impl RetryClass {
    /// A stable word (logs, metric labels).
    pub fn as_str(self) -> &'static str {
        match self {
            RetryClass::Transient => "transient",
            RetryClass::Permanent => "permanent",
            RetryClass::Malformed => "malformed",
            RetryClass::Infrastructure => "infrastructure",
        }
    }
}

/// A failure at a seam: a stable kind word (metric label, `failure_kind`) and the retry
/// class its type declared.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct SeamError {
    /// Stable word, e.g. `store_io`.
    pub kind: &'static str,
    /// How to retry it.
    pub class: RetryClass,
    /// One line: what failed and what to do.
    pub message: String,
    /// The cause.
    #[source]
    pub source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

impl SeamError {
    /// An error with a cause.
    pub fn new(
        kind: &'static str,
        class: RetryClass,
        message: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Self {
            kind,
            class,
            message: message.into(),
            source: Some(Box::new(source)),
        }
    }

    /// An error without a cause.
    pub fn msg(kind: &'static str, class: RetryClass, message: impl Into<String>) -> Self {
        Self {
            kind,
            class,
            message: message.into(),
            source: None,
        }
    }
}

/// One failed segment as the queue needs it to decide: the kind word, the retry class
/// and one readable line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// Stable word (`failure_kind`).
    pub kind: &'static str,
    /// How to retry it.
    pub class: RetryClass,
    /// What went wrong, one line.
    pub reason: String,
}

/// Where segment audio and finished outputs are kept.
pub trait AudioStore: Send + Sync {
    /// Stores a segment's audio under a deterministic key; storing it twice is harmless.
    fn put_segment(
        &self,
        job: &str,
        index: u32,
        audio: &SegmentAudio,
    ) -> impl Future<Output = Result<(), SeamError>> + Send;
    /// Reads a segment's audio back.
    fn get_segment(
        &self,
        job: &str,
        index: u32,
    ) -> impl Future<Output = Result<SegmentAudio, SeamError>> + Send;
    /// Whether a segment's audio is stored completely.
    fn has_segment(
        &self,
        job: &str,
        index: u32,
    ) -> impl Future<Output = Result<bool, SeamError>> + Send;
    /// Publishes a finished output file (chapter, book, manifest) under `name`.
    fn put_output(
        &self,
        job: &str,
        name: &str,
        file: &Path,
    ) -> impl Future<Output = Result<(), SeamError>> + Send;
    /// Stores the audio of several segments of one job; returns, per item and in order,
    /// where it went: `None` under its own key ([`AudioStore::get_segment`]), or a place in
    /// a pack ([`AudioStore::get_pack`]). A networked store writes one object for all of
    /// them, saving a request per segment. The default stores each under its own key.
    fn put_segments(
        &self,
        job: &str,
        items: &[(u32, &SegmentAudio)],
    ) -> impl Future<Output = Result<Vec<Option<PackedAt>>, SeamError>> + Send {
        async move {
            for (index, audio) in items {
                self.put_segment(job, *index, audio).await?;
            }
            Ok(vec![None; items.len()])
        }
    }
    /// The whole pack stored under `key` by [`AudioStore::put_segments`]; a segment's
    /// bytes are `[offset, offset + len)` of it, one complete WAV. The default: a store
    /// that never packs has none.
    /// Deletes stored objects that no record points at (a duplicate's copy that lost
    /// the race to be recorded). The default: a store whose keys are deterministic has
    /// nothing extra to delete.
    fn discard(
        &self,
        job: &str,
        keys: &[String],
    ) -> impl Future<Output = Result<(), SeamError>> + Send {
        let _ = (job, keys);
        std::future::ready(Ok(()))
    }
    fn get_pack(
        &self,
        job: &str,
        key: &str,
    ) -> impl Future<Output = Result<Vec<u8>, SeamError>> + Send {
        let _ = job;
        std::future::ready(Err(SeamError::msg(
            "store_io",
            RetryClass::Permanent,
            format!("pack {key:?} asked of a store that does not write packs"),
        )))
    }
}

/// Where job state and per-segment figures are recorded.
pub trait StateStore: Send + Sync {
    /// Records a finished segment (after its audio is stored); recording twice is harmless.
    fn record_segment(
        &self,
        job: &str,
        record: &SegmentRecord,
    ) -> impl Future<Output = Result<(), SeamError>> + Send;
    /// Records several finished segments of one job (after their audio is stored) and
    /// returns the indices this call recorded: a segment another copy recorded first
    /// keeps that copy's record, and the caller's audio for it is not pointed at (nor is
    /// any of it when the store records nothing into a job that has ended). The
    /// default records each in turn and claims them all. A database does it in one
    /// statement.
    fn record_segments(
        &self,
        job: &str,
        records: &[SegmentRecord],
    ) -> impl Future<Output = Result<Vec<u32>, SeamError>> + Send {
        async move {
            for r in records {
                self.record_segment(job, r).await?;
            }
            Ok(records.iter().map(|r| r.index).collect())
        }
    }
    /// The segments recorded as finished, one record per index.
    fn finished_segments(
        &self,
        job: &str,
    ) -> impl Future<Output = Result<Vec<SegmentRecord>, SeamError>> + Send;
}

/// A segment handed to a worker, with what it needs to acknowledge it.
#[derive(Debug)]
pub struct Delivery<T> {
    /// The job it belongs to.
    pub job_id: String,
    /// The segment.
    pub segment: crate::Segment,
    /// The scales its job's identity was hashed with, where the job recorded them (a
    /// worker reads them from the job's row, never from a message): the segment is
    /// synthesized with exactly these, whatever the synthesizer was loaded with. `None`
    /// (an embedded run, whose synthesizer was loaded with its identity's scales; a job
    /// recorded without them): the synthesizer's own, at the segment's `speed`.
    pub scales: Option<crate::Scales>,
    /// Delivery attempt, from 1.
    pub attempt: u32,
    /// When the producer enqueued it (Unix milliseconds), if the queue knows; queue-wait
    /// figures count from here.
    pub enqueued_at_ms: Option<u64>,
    /// Its priority lane: 0 normal; higher lanes go to the device first.
    pub lane: u8,
    /// Run it in a batch of its own: it was in the engine when a worker process died.
    pub alone: bool,
    /// The trace its work belongs to (the job's, carried in the message headers), when
    /// the producer traced it.
    pub trace: Option<TraceContext>,
    /// Acknowledgement handle.
    pub ticket: T,
}

/// W3C trace context (<https://www.w3.org/TR/trace-context/>): the `traceparent` and
/// `tracestate` headers that tie work done elsewhere to the trace that started it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceContext {
    /// `version-traceid-parentid-flags`.
    pub traceparent: String,
    /// Vendor state, if any.
    pub tracestate: Option<String>,
}

/// Where segments come from. Delivery is at least once: a segment is delivered again
/// unless it is acknowledged, so workers ack only after its audio is stored and its
/// figures recorded.
pub trait SegmentQueue: Send + Sync {
    /// Handle that acknowledges one delivery.
    type Ticket: Send + 'static;
    /// The next segment; `None` once the queue is closed and everything is acknowledged.
    fn next(
        &self,
    ) -> impl Future<Output = Result<Option<Delivery<Self::Ticket>>, SeamError>> + Send;
    /// The segment is done: never deliver it again.
    fn ack(&self, ticket: Self::Ticket) -> impl Future<Output = Result<(), SeamError>> + Send;
    /// The segment was not done: deliver it again (attempt + 1).
    fn requeue(&self, ticket: Self::Ticket) -> impl Future<Output = Result<(), SeamError>> + Send;
    /// The segments of `batch` (job, index) are about to go to the engine: a queue that
    /// tells crashes apart records it. The default does nothing.
    fn before_engine(
        &self,
        batch: &[(String, u32)],
    ) -> impl Future<Output = Result<(), SeamError>> + Send {
        let _ = batch;
        std::future::ready(Ok(()))
    }
    /// The engine is done with the segments of `batch` (whatever the outcome): they are
    /// no longer at risk of a crash of the engine. The default does nothing.
    fn after_engine(
        &self,
        batch: &[(String, u32)],
    ) -> impl Future<Output = Result<(), SeamError>> + Send {
        let _ = batch;
        std::future::ready(Ok(()))
    }
    /// The segment failed (its kind word, retry class and reason); the queue decides
    /// between a later retry and giving up (a networked queue dead-letters it with the
    /// reason). The default requeues it.
    fn fail(
        &self,
        ticket: Self::Ticket,
        failure: &Failure,
    ) -> impl Future<Output = Result<(), SeamError>> + Send {
        let _ = failure;
        self.requeue(ticket)
    }
    /// Whether deliveries of a lane above the lowest are out with this queue's consumer
    /// (handed out, not acknowledged): more of that lane follow as they are acknowledged,
    /// so the runner holds the lowest lane back meanwhile. The default: none (an
    /// in-process queue has one lane).
    fn holds_higher_lane(&self) -> bool {
        false
    }
    /// Of `jobs`, those whose segments need no more work (cancelled or ended): the runner
    /// asks just before a batch goes to the device and acknowledges their segments
    /// unsynthesized. The default: none (an in-process queue has no cancellation).
    fn abandoned_jobs(
        &self,
        jobs: Vec<String>,
    ) -> impl Future<Output = Result<Vec<String>, SeamError>> + Send {
        let _ = jobs;
        std::future::ready(Ok(Vec::new()))
    }
}
