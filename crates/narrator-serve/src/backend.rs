//! Where jobs go: made by the server itself ([`crate::jobs::Jobs`], embedded) or by the
//! fleet ([`crate::fleet::FleetJobs`], the gateway). The API and the pages ask this.

use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures_util::Stream;
use tokio::sync::broadcast::error::RecvError;
use uuid::Uuid;

use crate::ApiError;
use crate::fleet::FleetJobs;
use crate::jobs::{Job, Jobs, ListFilter, Submission};

/// The jobs of this server.
#[derive(Clone)]
pub enum Backend {
    Embedded(Arc<Jobs>),
    Fleet(Arc<FleetJobs>),
}

/// Where a done job's output is.
pub enum OutputAt {
    /// A file of the server's.
    File(PathBuf),
    /// A (presigned) URL to redirect to.
    Url(String),
}

/// A job's successive states, as they change.
pub type Changes = Pin<Box<dyn Stream<Item = Job> + Send>>;

impl Backend {
    pub async fn submit(&self, tenant: &str, s: Submission) -> Result<(Job, bool), ApiError> {
        match self {
            Backend::Embedded(j) => j.submit(tenant, s).await,
            Backend::Fleet(f) => f.submit(tenant, s).await,
        }
    }

    pub async fn get(&self, tenant: &str, id: Uuid) -> Result<Job, ApiError> {
        match self {
            Backend::Embedded(j) => j.get(tenant, id),
            Backend::Fleet(f) => f.get(tenant, id).await,
        }
    }

    pub async fn list(
        &self,
        tenant: &str,
        filter: &ListFilter,
    ) -> Result<(Vec<Job>, Option<Uuid>), ApiError> {
        match self {
            Backend::Embedded(j) => Ok(j.list(tenant, filter)),
            Backend::Fleet(f) => f.list(tenant, filter).await,
        }
    }

    pub async fn cancel(&self, tenant: &str, id: Uuid) -> Result<Job, ApiError> {
        match self {
            Backend::Embedded(j) => j.cancel(tenant, id),
            Backend::Fleet(f) => f.cancel(tenant, id).await,
        }
    }

    pub async fn retry(&self, tenant: &str, id: Uuid) -> Result<Job, ApiError> {
        match self {
            Backend::Embedded(j) => j.retry(tenant, id),
            Backend::Fleet(f) => f.retry(tenant, id).await,
        }
    }

    pub async fn delete(&self, tenant: &str, id: Uuid) -> Result<(), ApiError> {
        match self {
            Backend::Embedded(j) => j.delete(tenant, id),
            Backend::Fleet(f) => f.delete(tenant, id).await,
        }
    }

    pub async fn output(&self, tenant: &str, id: Uuid, name: &str) -> Result<OutputAt, ApiError> {
        match self {
            Backend::Embedded(j) => j.output(tenant, id, name).map(OutputAt::File),
            Backend::Fleet(f) => f.output(tenant, id, name).await.map(OutputAt::Url),
        }
    }

    /// The fleet's workers seen in the last minute (404 on a server that makes its jobs
    /// itself).
    pub async fn workers(&self) -> Result<Vec<narrator_db::WorkerStatus>, ApiError> {
        match self {
            Backend::Embedded(_) => Err(ApiError::with(
                axum::http::StatusCode::NOT_FOUND,
                "not_fleet",
                "this server makes its jobs itself and has no workers; start it with --fleet to front a fleet",
            )),
            Backend::Fleet(f) => f.workers().await,
        }
    }

    /// Whether jobs can be taken now (`/readyz`).
    pub async fn ready(&self) -> Result<(), ApiError> {
        match self {
            Backend::Embedded(j) => j.check_writable().map_err(|e| {
                ApiError::with(
                    axum::http::StatusCode::SERVICE_UNAVAILABLE,
                    "not_ready",
                    format!(
                        "the jobs' folder cannot be written: {e}; free space or fix its permissions"
                    ),
                )
                .retry_after(5)
            }),
            Backend::Fleet(f) => f.check().await,
        }
    }

    /// The job as it is, then each change, until it is done, failed or cancelled:
    /// embedded from the runner's own changes, in the fleet from its row every second.
    pub async fn changes(&self, tenant: &str, id: Uuid) -> Result<Changes, ApiError> {
        match self {
            Backend::Embedded(jobs) => {
                // Subscribed before the first look, so no change falls between the two.
                let rx = jobs.watch();
                let first = jobs.get(tenant, id)?;
                let (jobs, tenant) = (jobs.clone(), tenant.to_string());
                let stream = futures_util::stream::unfold(
                    (Some(first), rx, false),
                    move |(first, mut rx, ended)| {
                        let (jobs, tenant) = (jobs.clone(), tenant.clone());
                        async move {
                            if ended {
                                return None;
                            }
                            let job = match first {
                                Some(job) => job,
                                None => loop {
                                    match rx.recv().await {
                                        Ok(job) if job.id == id => break job,
                                        Ok(_) => continue,
                                        // Fell behind: the job as it is now.
                                        Err(RecvError::Lagged(_)) => match jobs.get(&tenant, id) {
                                            Ok(job) => break job,
                                            Err(_) => return None,
                                        },
                                        Err(RecvError::Closed) => return None,
                                    }
                                },
                            };
                            let ended = job.state.is_final();
                            Some((job, (None, rx, ended)))
                        }
                    },
                );
                Ok(Box::pin(stream))
            }
            Backend::Fleet(fleet) => {
                let first = fleet.get(tenant, id).await?;
                let (fleet, tenant) = (fleet.clone(), tenant.to_string());
                let stream = futures_util::stream::unfold(
                    (Some(first), None::<Job>),
                    move |(first, last)| {
                        let (fleet, tenant) = (fleet.clone(), tenant.clone());
                        async move {
                            if last.as_ref().is_some_and(|j| j.state.is_final()) {
                                return None;
                            }
                            let job = match first {
                                Some(job) => job,
                                None => loop {
                                    tokio::time::sleep(Duration::from_secs(1)).await;
                                    let Ok(job) = fleet.get(&tenant, id).await else {
                                        continue;
                                    };
                                    let moved = last.as_ref().is_none_or(|l| {
                                        l.state != job.state || l.segments_done != job.segments_done
                                    });
                                    if moved {
                                        break job;
                                    }
                                },
                            };
                            Some((job.clone(), (None, Some(job))))
                        }
                    },
                );
                Ok(Box::pin(stream))
            }
        }
    }
}
