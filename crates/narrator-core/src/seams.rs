//! The boundaries the distributed mode swaps. Each has an embedded implementation (local
//! folder, journal file) and, later, a networked one (S3, Postgres). They are async traits
//! used through generics.

use std::future::Future;
use std::path::Path;

use crate::{PackedAt, SegmentAudio, SegmentRecord};

/// A failure at a seam, with a stable kind word (metric label, `failure_kind`).
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct SeamError {
    /// Stable word, e.g. `store_io`.
    pub kind: &'static str,
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
        message: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Self {
            kind,
            message: message.into(),
            source: Some(Box::new(source)),
        }
    }

    /// An error without a cause.
    pub fn msg(kind: &'static str, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
            source: None,
        }
    }
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
    fn get_pack(
        &self,
        job: &str,
        key: &str,
    ) -> impl Future<Output = Result<Vec<u8>, SeamError>> + Send {
        let _ = job;
        std::future::ready(Err(SeamError::msg(
            "store_io",
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
    /// Records several finished segments of one job (after their audio is stored); the
    /// default records each in turn. A database does it in one statement.
    fn record_segments(
        &self,
        job: &str,
        records: &[SegmentRecord],
    ) -> impl Future<Output = Result<(), SeamError>> + Send {
        async move {
            for r in records {
                self.record_segment(job, r).await?;
            }
            Ok(())
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
    /// Delivery attempt, from 1.
    pub attempt: u32,
    /// When the producer enqueued it (Unix milliseconds), if the queue knows; queue-wait
    /// figures count from here.
    pub enqueued_at_ms: Option<u64>,
    /// Acknowledgement handle.
    pub ticket: T,
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
    /// The segment failed with an error of `kind` (a stable word such as `store_io`) and
    /// a readable `reason`; the queue decides between a later retry and giving up (a
    /// networked queue dead-letters it with the reason). The default requeues it.
    fn fail(
        &self,
        ticket: Self::Ticket,
        kind: &str,
        reason: &str,
    ) -> impl Future<Output = Result<(), SeamError>> + Send {
        let _ = (kind, reason);
        self.requeue(ticket)
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
