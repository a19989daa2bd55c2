//! narrator's Postgres state for the distributed mode: jobs, their segments (each also an
//! outbox entry and, once done, a row of figures) and workers, in the schema of the root
//! `migrations/` folder, plus [`PgStateStore`], the Postgres twin of the pipeline's
//! journal, so the same runner records into either.
//!
//! Every query is a plain `sqlx::query` with binds (no compile-time checked macros, so
//! building needs no database). Functions take `impl PgExecutor<'_>` (a pool, a connection
//! or a transaction) unless they need several statements in one transaction, then a
//! `&PgPool`. Exactly-once effects under at-least-once delivery come from single
//! conditional statements (`UPDATE … WHERE state <> 'done'`, `… WHERE state = 'running'
//! AND segments_done = segments_total`), whose row locks serialize concurrent callers;
//! no advisory locks, no read-then-write.
//!
//! The views `job_status`, `segment_figures` and `worker_recent` are documented in the
//! migration that creates them; they are what a user queries with plain SQL.

mod assembly;
mod bench;
mod calibrations;
mod deliveries;
mod dispatch;
mod error;
mod events;
mod gauges;
mod jobs;
mod prune;
mod rescue;
mod retry;
mod segments;
mod store;
mod stored_job;
mod workers;

pub use assembly::{
    Output, assembly_attempts, claim_assembly_for, finish_with_outputs, highest_priority,
    job_outputs, postpone_assembly, take_over_assemblies,
};
pub use bench::{BenchRow, StoredBench, bench_table_exists, fleet_bench, record_bench};
pub use calibrations::{StoredCalibration, list_calibrations, put_calibration};
pub use deliveries::{
    DeliveryHistory, DeliveryKey, SegmentCheck, abandoned_jobs, check_deliveries, check_segment,
    check_segments, mark_in_engine,
};
pub use dispatch::{
    ClaimLimits, Claimed, FleetShare, MIN_DISPATCH_WINDOW, claim_dispatch, dispatch_candidates,
    fleet_shares,
};
pub use error::DbError;
pub use events::{
    EventJob, PendingEvent, claim_events, mark_events_published, note_progress,
    prune_published_events,
};
pub use gauges::{GAUGE_FINISHED_WITHIN, VoiceGauges, voice_gauges};
pub use jobs::{
    ChapterProgress, Created, JobRequestRecord, JobState, JobStatus, JobSummary, TenantJobs,
    cancel_job, claim_assembly, create_job, create_job_with, create_requested_job, fail_job,
    finish_job, job_by_request_key, job_state, job_status, list_jobs, list_tenant_jobs,
};
pub use prune::{
    PrunableJob, cancelled_unreleased, claim_prune, delete_ended_job, prunable_jobs,
    storage_released,
};
pub use rescue::{LossLook, Rescue, VoiceOutstanding, rescue_lost_segments, voice_outstanding};
pub use retry::{RetryOutcome, fail_settled_jobs, retry_job};
pub use segments::{
    RecordOutcome, RecordsOutcome, fail_segment, finished_segments, mark_published, record_segment,
    record_segments,
};
pub use store::PgStateStore;
pub use stored_job::{JobSettings, StoredJob, job_route, job_trace, load_job};
pub use workers::{
    WorkerInfo, WorkerStatus, forget_workers, heartbeat, list_workers, served_voices,
};

pub use sqlx::{PgConnection, PgPool};
pub use uuid::Uuid;

/// The schema's migrations (root `migrations/`, embedded by build.rs): version,
/// description, SQL, in version order.
const MIGRATIONS: &[(i64, &str, &str)] = include!(concat!(env!("OUT_DIR"), "/migrations.rs"));

/// The schema's migrations as sqlx runs them (checksums as sqlx's `migrate!` computes
/// them, so databases migrated by earlier builds stay valid).
pub async fn migrator() -> Result<sqlx::migrate::Migrator, DbError> {
    Ok(sqlx::migrate::Migrator::new(Embedded).await?)
}

/// [`MIGRATIONS`] as a source for sqlx's migrator.
#[derive(Debug)]
struct Embedded;

impl<'s> sqlx::migrate::MigrationSource<'s> for Embedded {
    fn resolve(
        self,
    ) -> std::pin::Pin<
        Box<
            dyn std::future::Future<
                    Output = Result<Vec<sqlx::migrate::Migration>, sqlx::error::BoxDynError>,
                > + Send
                + 's,
        >,
    > {
        let migrations = MIGRATIONS
            .iter()
            .map(|&(version, description, sql)| {
                sqlx::migrate::Migration::new(
                    version,
                    description.into(),
                    sqlx::migrate::MigrationType::Simple,
                    sql.into(),
                    false,
                )
            })
            .collect();
        Box::pin(std::future::ready(Ok(migrations)))
    }
}

/// Connects a pool to `url` (`postgres://user@host:port/db`). TLS as libpq: `sslmode`
/// (`disable`, `prefer` (the default), `require`, `verify-ca`, `verify-full`) and
/// `sslrootcert` in the URL or `PGSSLMODE` / `PGSSLROOTCERT`; certificates are checked
/// against the system's store plus `sslrootcert`.
pub async fn connect(url: &str) -> Result<PgPool, DbError> {
    let options: sqlx::postgres::PgConnectOptions = url.parse().map_err(DbError::Unavailable)?;
    // No statement hangs for ever (a stuck query, a lock held by a dead session): the
    // server cancels it, the caller sees an outage and retries later.
    let timeout = format!("{}s", STATEMENT_TIMEOUT.as_secs());
    let options = options.options([
        ("statement_timeout", timeout.as_str()),
        ("idle_in_transaction_session_timeout", timeout.as_str()),
    ]);
    sqlx::postgres::PgPoolOptions::new()
        .max_connections(16)
        .acquire_timeout(ACQUIRE_TIMEOUT)
        .connect_with(options)
        .await
        .map_err(DbError::on_connect)
}

/// The longest a statement may run before the server cancels it.
pub const STATEMENT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(120);
/// The longest a caller waits for a pooled connection (the database away or saturated).
pub const ACQUIRE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Applies every migration not applied yet (what `narrator migrate` runs).
pub async fn migrate(pool: &PgPool) -> Result<(), DbError> {
    migrator().await?.run(pool).await?;
    Ok(())
}

/// Whether every migration this build knows has been applied (`narrator migrate`).
pub async fn schema_ready(pool: &PgPool) -> Result<bool, DbError> {
    let exists: Option<String> = sqlx::query_scalar("SELECT to_regclass('_sqlx_migrations')::text")
        .fetch_one(pool)
        .await
        .map_err(DbError::Unavailable)?;
    if exists.is_none() {
        return Ok(false);
    }
    let applied: Vec<i64> =
        sqlx::query_scalar("SELECT version FROM _sqlx_migrations WHERE success")
            .fetch_all(pool)
            .await?;
    Ok(MIGRATIONS.iter().all(|m| applied.contains(&m.0)))
}

/// The cluster id `narrator migrate` made for this database; every segment message
/// carries it, so a worker can tell a message of another cluster from its own.
pub async fn cluster_id(exec: impl sqlx::PgExecutor<'_>) -> Result<Uuid, DbError> {
    sqlx::query_scalar("SELECT id FROM cluster")
        .fetch_optional(exec)
        .await?
        .ok_or(DbError::Corrupt {
            column: "cluster.id",
            value: "no row (run `narrator migrate`)".into(),
        })
}

/// Seconds of a `Duration` as a bind for `make_interval(secs => $n)`.
pub(crate) fn secs(d: std::time::Duration) -> f64 {
    d.as_secs_f64()
}
