//! Recording into Postgres; publishing the job's next segments into its window; telling
//! the assembler when a job's last segment is in.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use narrator_core::{RetryClass, SeamError, SegmentRecord, StateStore};
use narrator_db::{DbError, PgPool, Uuid};
use tokio::sync::mpsc;

use crate::dispatcher::Dispatcher;

/// The worker's [`StateStore`].
pub struct ClusterState {
    pool: PgPool,
    complete: mpsc::UnboundedSender<Uuid>,
    done: Arc<AtomicU64>,
    /// Publishes a job's next segments after each recording of it.
    dispatcher: Arc<Dispatcher>,
    /// The voice whose segments this records.
    voice: String,
}

impl ClusterState {
    /// Records `voice`'s segments into `pool`, sends finished jobs to `complete`, counts
    /// into `done`, has `dispatcher` publish what each recording leaves room for.
    pub fn new(
        pool: PgPool,
        complete: mpsc::UnboundedSender<Uuid>,
        done: Arc<AtomicU64>,
        (dispatcher, voice): (Arc<Dispatcher>, String),
    ) -> Self {
        Self {
            pool,
            complete,
            done,
            dispatcher,
            voice,
        }
    }
}

fn seam(e: DbError) -> SeamError {
    SeamError::new(e.kind(), e.retry_class(), e.to_string(), e)
}

fn job_id(job: &str) -> Result<Uuid, SeamError> {
    Uuid::parse_str(job)
        .map_err(|e| SeamError::new("input", RetryClass::Permanent, e.to_string(), e))
}

impl StateStore for ClusterState {
    async fn record_segment(&self, job: &str, record: &SegmentRecord) -> Result<(), SeamError> {
        self.record_segments(job, std::slice::from_ref(record))
            .await
            .map(drop)
    }

    async fn record_segments(
        &self,
        job: &str,
        records: &[SegmentRecord],
    ) -> Result<Vec<u32>, SeamError> {
        let id = job_id(job)?;
        let outcome = narrator_db::record_segments(&self.pool, id, records)
            .await
            .map_err(seam)?;
        self.done.fetch_add(outcome.newly_done, Ordering::Relaxed);
        if outcome.job_complete {
            let _ = self.complete.send(id);
        } else if let Some(&last) = outcome.recorded.last() {
            self.dispatcher.nudge(id, &self.voice, last);
        }
        Ok(outcome.recorded)
    }

    async fn finished_segments(&self, job: &str) -> Result<Vec<SegmentRecord>, SeamError> {
        narrator_db::finished_segments(&self.pool, job_id(job)?)
            .await
            .map_err(seam)
    }
}
