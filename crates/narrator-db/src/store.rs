//! [`PgStateStore`]: the pipeline's [`StateStore`] seam on Postgres, so the generic runner
//! records figures into the `segments` table exactly as it appends to the embedded
//! journal.
//!
//! The trait names a job by text. A worker serving many jobs uses [`PgStateStore::new`]:
//! the text must be the job's UUID (what the queue's messages carry). A store made with
//! [`PgStateStore::for_job`] is bound to one submission and also accepts that
//! submission's content id (`JobPlan.job_id`, which the runner's resume path passes);
//! any other job is an error, never a silent write elsewhere.

use narrator_core::{SeamError, SegmentRecord, StateStore};
use sqlx::{PgPool, Row};
use uuid::Uuid;

use crate::error::DbError;

/// Job state and per-segment figures in Postgres.
#[derive(Debug, Clone)]
pub struct PgStateStore {
    pool: PgPool,
    job: Option<Bound>,
}

#[derive(Debug, Clone)]
struct Bound {
    id: Uuid,
    content_id: String,
}

impl PgStateStore {
    /// A store for any job; the trait's job text must be a job UUID.
    pub fn new(pool: PgPool) -> Self {
        Self { pool, job: None }
    }

    /// A store bound to one job (reads its content id once).
    pub async fn for_job(pool: PgPool, job: Uuid) -> Result<Self, DbError> {
        let row = sqlx::query("SELECT content_id FROM jobs WHERE id = $1")
            .bind(job)
            .fetch_optional(&pool)
            .await?
            .ok_or(DbError::JobNotFound(job))?;
        let content_id = row.try_get("content_id")?;
        Ok(Self {
            pool,
            job: Some(Bound {
                id: job,
                content_id,
            }),
        })
    }

    /// The pool it uses.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The job the trait's `job` text names.
    pub fn resolve(&self, job: &str) -> Result<Uuid, DbError> {
        match (&self.job, Uuid::parse_str(job)) {
            (Some(b), _) if job == b.content_id => Ok(b.id),
            (Some(b), Ok(id)) if id == b.id => Ok(id),
            (Some(b), _) => Err(DbError::WrongJob {
                bound: b.id,
                asked: job.to_owned(),
            }),
            (None, Ok(id)) => Ok(id),
            (None, Err(source)) => Err(DbError::BadJobId {
                text: job.to_owned(),
                source,
            }),
        }
    }
}

fn seam(e: DbError) -> SeamError {
    SeamError::new(e.kind(), e.retry_class(), e.to_string(), e)
}

impl StateStore for PgStateStore {
    async fn record_segment(&self, job: &str, record: &SegmentRecord) -> Result<(), SeamError> {
        let id = self.resolve(job).map_err(seam)?;
        crate::record_segment(&self.pool, id, record)
            .await
            .map_err(seam)?;
        Ok(())
    }

    async fn record_segments(
        &self,
        job: &str,
        records: &[SegmentRecord],
    ) -> Result<Vec<u32>, SeamError> {
        let id = self.resolve(job).map_err(seam)?;
        let outcome = crate::record_segments(&self.pool, id, records)
            .await
            .map_err(seam)?;
        Ok(outcome.recorded)
    }

    async fn finished_segments(&self, job: &str) -> Result<Vec<SegmentRecord>, SeamError> {
        let id = self.resolve(job).map_err(seam)?;
        crate::finished_segments(&self.pool, id).await.map_err(seam)
    }
}
