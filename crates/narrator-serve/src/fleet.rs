//! The fleet gateway: with a database, a broker and S3 configured, `narrator serve` makes
//! no books itself. A job goes to the fleet through the intake's own path
//! ([`narrator_worker::intake::Intake::accept_for`]: read, planned, recorded with its
//! tenant, its first window published); an uploaded file goes to the bucket under
//! `incoming/` first and is named by its `source`, as `submit --via-broker` sends a large
//! book. Status comes from Postgres, outputs are redirects to presigned S3 URLs (the
//! audio's Range requests go to S3), and a job's events are its row, looked at every
//! second.

use std::time::Duration;

use axum::http::StatusCode;
use chrono::Utc;
use narrator_db::{JobState, JobStatus, PgPool, TenantJobs, Uuid};
use narrator_s3::S3AudioStore;
use narrator_text::InputFormat;
use narrator_worker::intake::{Intake, Reply};

use crate::ApiError;
use crate::jobs::{
    Job, JobFailure, JobOutput, ListFilter, Submission, no_such_output, not_done, not_found,
    refused,
};

/// How long an output's presigned URL lasts (a redirect is asked for each time).
const PRESIGN_FOR: Duration = Duration::from_secs(3600);

/// The fleet as the server reaches it.
pub struct FleetJobs {
    pool: PgPool,
    conn: lapin::Connection,
    intake: Intake,
    store: S3AudioStore,
}

fn unavailable(what: &str, e: impl std::fmt::Display) -> ApiError {
    ApiError::with(
        StatusCode::SERVICE_UNAVAILABLE,
        "unavailable",
        format!("{what}: {e}; try again shortly"),
    )
    .retry_after(5)
}

impl FleetJobs {
    /// A gateway recording into `pool`, publishing on `conn`, reading and writing books
    /// and outputs in `store`'s bucket; books over `max_input_bytes` are refused.
    pub async fn connect(
        pool: PgPool,
        conn: lapin::Connection,
        store: S3AudioStore,
        voices_dir: std::path::PathBuf,
        max_input_bytes: u64,
    ) -> anyhow::Result<Self> {
        let intake = Intake::new(
            pool.clone(),
            &conn,
            store.clone(),
            narrator_worker::intake::IntakeConfig {
                voices_dir,
                max_input_bytes,
                prefetch: 1,
                abort_after_record: false,
            },
        )
        .await?;
        Ok(Self {
            pool,
            conn,
            intake,
            store,
        })
    }

    /// Whether the database answers.
    pub async fn check(&self) -> Result<(), ApiError> {
        sqlx_ping(&self.pool)
            .await
            .map_err(|e| unavailable("the database does not answer", e))
    }

    /// The intake's path, for `tenant`; an upload is put in the bucket first.
    pub async fn submit(&self, tenant: &str, s: Submission) -> Result<(Job, bool), ApiError> {
        let mut request = s.request;
        if s.source == "text" {
            request.text = Some(String::from_utf8_lossy(&s.book).into_owned());
            request.text_format = match s.format {
                InputFormat::Text => narrator_worker::intake::TextFormat::Txt,
                _ => narrator_worker::intake::TextFormat::Md,
            };
        } else {
            let name = s.source.trim_start_matches("upload:");
            let object = format!("incoming/{}/{name}", Uuid::new_v4());
            self.store
                .put_bytes(&object, s.book, "application/octet-stream")
                .await
                .map_err(|e| unavailable("storing the upload in S3", e))?;
            request.source = Some(format!("s3://{}/{object}", self.store.bucket()));
            // The title the upload's name gives, as the embedded server's.
            if request.title.is_none() && s.format != InputFormat::Epub {
                request.title = Some(s.fallback_title.clone());
            }
        }
        let reply = self
            .intake
            .accept_for(request, None, Some(tenant))
            .await
            .map_err(refused)?;
        let Reply::Accepted {
            job_id, duplicate, ..
        } = reply
        else {
            return Err(ApiError::with(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "the intake answered a refusal as accepted",
            ));
        };
        Ok((self.get(tenant, job_id).await?, !duplicate))
    }

    async fn status(&self, tenant: &str, id: Uuid) -> Result<JobStatus, ApiError> {
        let status = narrator_db::job_status(&self.pool, id)
            .await
            .map_err(|e| unavailable("reading the job", e))?
            .ok_or_else(|| not_found(id))?;
        if status.summary.tenant.as_deref() != Some(tenant) {
            return Err(not_found(id));
        }
        Ok(status)
    }

    /// A tenant's job.
    pub async fn get(&self, tenant: &str, id: Uuid) -> Result<Job, ApiError> {
        let status = self.status(tenant, id).await?;
        let outputs = match status.summary.state {
            JobState::Done => narrator_db::job_outputs(&self.pool, id)
                .await
                .map_err(|e| unavailable("reading the job's outputs", e))?,
            _ => Vec::new(),
        };
        Ok(job_of(&status, &outputs))
    }

    /// A tenant's jobs, newest first, and the cursor of the next page.
    pub async fn list(
        &self,
        tenant: &str,
        f: &ListFilter,
    ) -> Result<(Vec<Job>, Option<Uuid>), ApiError> {
        let limit = u32::try_from(f.limit).unwrap_or(100);
        let rows = narrator_db::list_tenant_jobs(
            &self.pool,
            &TenantJobs {
                tenant,
                state: f.state,
                voice: f.voice.as_deref(),
                after: f.after,
                limit: limit + 1,
            },
        )
        .await
        .map_err(|e| unavailable("listing the jobs", e))?;
        let mut jobs: Vec<Job> = rows
            .iter()
            .map(|s| {
                job_of(
                    &JobStatus {
                        summary: s.clone(),
                        chapters: Vec::new(),
                        warnings: Vec::new(),
                        waiting: None,
                    },
                    &[],
                )
            })
            .collect();
        let next = (jobs.len() > f.limit).then(|| {
            jobs.truncate(f.limit);
            jobs.last().map(|j| j.id)
        });
        Ok((jobs, next.flatten()))
    }

    /// Cancels a job of the tenant's (workers drop its remaining segments).
    pub async fn cancel(&self, tenant: &str, id: Uuid) -> Result<Job, ApiError> {
        let job = self.get(tenant, id).await?;
        if job.state == JobState::Cancelled {
            return Ok(job);
        }
        let cancelled = narrator_db::cancel_job(&self.pool, id)
            .await
            .map_err(|e| unavailable("cancelling the job", e))?;
        if !cancelled {
            return Err(ApiError::with(
                StatusCode::CONFLICT,
                "job_finished",
                format!(
                    "job {id} is {} already; nothing to cancel",
                    job.state.as_str()
                ),
            ));
        }
        self.get(tenant, id).await
    }

    /// Puts a failed job back to work.
    pub async fn retry(&self, tenant: &str, id: Uuid) -> Result<Job, ApiError> {
        self.status(tenant, id).await?;
        let (outcome, _) = narrator_worker::retry_job(&self.pool, &self.conn, id)
            .await
            .map_err(|e| unavailable("retrying the job", e))?;
        match outcome {
            narrator_db::RetryOutcome::Retried(_) => self.get(tenant, id).await,
            narrator_db::RetryOutcome::NotFailed(state) => Err(ApiError::with(
                StatusCode::CONFLICT,
                "job_not_retryable",
                format!(
                    "job {id} is {}; only a failed job is retried in the fleet (submit a cancelled book again)",
                    state.as_str()
                ),
            )),
            narrator_db::RetryOutcome::Pruning => Err(ApiError::with(
                StatusCode::CONFLICT,
                "job_not_retryable",
                format!("job {id} is being pruned; submit the book again"),
            )),
        }
    }

    /// Not in the fleet yet: the pruner (`narrator jobs prune`) releases ended jobs.
    pub async fn delete(&self, tenant: &str, id: Uuid) -> Result<(), ApiError> {
        self.status(tenant, id).await?;
        Err(ApiError::with(
            StatusCode::NOT_IMPLEMENTED,
            "not_supported",
            "deleting a job is not offered through the fleet gateway yet; the operator's `narrator jobs prune` releases ended jobs",
        ))
    }

    /// A presigned URL of a done job's output `name`.
    pub async fn output(&self, tenant: &str, id: Uuid, name: &str) -> Result<String, ApiError> {
        let status = self.status(tenant, id).await?;
        if status.summary.state != JobState::Done {
            return Err(not_done(id, status.summary.state));
        }
        let outputs = narrator_db::job_outputs(&self.pool, id)
            .await
            .map_err(|e| unavailable("reading the job's outputs", e))?;
        let found = outputs
            .iter()
            .find(|o| match name {
                "book" | "manifest" => o.kind == name,
                _ => o.name == name,
            })
            .ok_or_else(|| no_such_output(id, name))?;
        self.store
            .presign_get(&found.key, PRESIGN_FOR)
            .await
            .map_err(|e| unavailable("signing the output's URL", e))
    }
}

impl FleetJobs {
    /// The workers seen in the last minute.
    pub async fn workers(&self) -> Result<Vec<narrator_db::WorkerStatus>, ApiError> {
        narrator_db::list_workers(&self.pool, Duration::from_secs(60))
            .await
            .map_err(|e| unavailable("listing the workers", e))
    }
}

async fn sqlx_ping(pool: &PgPool) -> Result<(), narrator_db::DbError> {
    narrator_db::cluster_id(pool).await.map(|_| ())
}

/// A fleet job as the API shows it.
fn job_of(status: &JobStatus, outputs: &[narrator_db::Output]) -> Job {
    let s = &status.summary;
    let tenant = s.tenant.clone().unwrap_or_default();
    let mut chapters = status.chapters.iter();
    let outputs = outputs
        .iter()
        .map(|o| JobOutput {
            kind: o.kind.clone(),
            name: o.name.clone(),
            url: format!("/v1/jobs/{}/outputs/{}", s.job_id, o.name),
            seconds: matches!(o.kind.as_str(), "book" | "chapter").then_some(o.seconds),
            title: match o.kind.as_str() {
                "book" => Some(s.title.clone()),
                "chapter" => chapters.next().map(|c| c.title.clone()),
                _ => None,
            },
        })
        .collect();
    Job {
        id: s.job_id,
        state: s.state,
        idempotency_key: s.request_key.as_deref().map(|k| {
            k.strip_prefix(&format!("{tenant}:"))
                .unwrap_or(k)
                .to_string()
        }),
        tenant,
        title: s.title.clone(),
        voice: s.voice.clone(),
        format: s.format.clone(),
        source: s.source.clone(),
        metadata: s
            .request_metadata
            .as_ref()
            .and_then(|m| m.as_object().cloned()),
        created_at: s.created_at,
        updated_at: s
            .finished_at
            .or(s.started_at)
            .unwrap_or(s.created_at)
            .min(Utc::now()),
        segments: s.segments_total as usize,
        segments_done: s.segments_done as usize,
        segments_resumed: 0,
        audio_seconds: s.audio_seconds,
        wall_seconds: s.wall_seconds.unwrap_or(0.0),
        rtf: if s.state == JobState::Done {
            s.rtf
        } else {
            None
        },
        error: s.failure_reason.as_ref().map(|m| JobFailure {
            code: s.failure_kind.clone().unwrap_or_else(|| "failed".into()),
            message: m.clone(),
        }),
        outputs,
        warnings: status.warnings.clone(),
    }
}
