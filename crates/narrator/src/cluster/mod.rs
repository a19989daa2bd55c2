//! The distributed mode: `submit`, `worker`, `status`, `jobs`, `workers`, `cancel`,
//! `retry`, `migrate`. Jobs and figures live in Postgres, segments travel through
//! RabbitMQ, audio goes to S3; the pipeline is the embedded one with these seams.

pub(crate) mod admin;
pub(crate) mod fleet;
pub(crate) mod submit;
pub(crate) mod via_broker;
pub(crate) mod worker;

use std::time::Duration;

use anyhow::{Context, bail};
use narrator_db::PgPool;
use narrator_s3::{S3AudioStore, S3Config};

use crate::cli::ServiceArgs;

/// Connects to Postgres and checks that `narrator migrate` has run.
pub(crate) async fn database(args: &ServiceArgs) -> anyhow::Result<PgPool> {
    let pool = narrator_db::connect(&args.database_url)
        .await
        .with_context(|| format!("database {}", redact(&args.database_url)))?;
    if !narrator_db::schema_ready(&pool).await? {
        bail!(
            "database {} has no narrator tables: run `narrator migrate` first",
            redact(&args.database_url)
        );
    }
    Ok(pool)
}

/// Connects to RabbitMQ (automatic recovery on).
pub(crate) async fn broker(args: &ServiceArgs, name: &str) -> anyhow::Result<lapin::Connection> {
    Ok(narrator_broker::connect_with(&args.amqp_url, name, args.amqp_ca_file.as_deref()).await?)
}

/// The S3 settings from flags and environment (credentials from the AWS chain).
pub(crate) fn s3_config(args: &ServiceArgs) -> S3Config {
    S3Config {
        endpoint: args.s3_endpoint.clone(),
        public_endpoint: args.s3_public_endpoint.clone(),
        bucket: args.s3_bucket.clone(),
        region: args.s3_region.clone(),
        ca_file: args.s3_ca_file.clone(),
        ..S3Config::default()
    }
}

/// Connects to the bucket (checks it exists).
pub(crate) async fn store(args: &ServiceArgs) -> anyhow::Result<S3AudioStore> {
    Ok(S3AudioStore::connect(s3_config(args)).await?)
}

/// A URL without its password or password-like query parameters.
pub(crate) fn redact(url: &str) -> String {
    narrator_net::redact(url)
}

/// How long presigned URLs printed by `status` stay valid.
pub(crate) const PRESIGN_FOR: Duration = Duration::from_secs(24 * 3600);

/// Parses a job id argument with one clear error.
pub(crate) fn job_id(text: &str) -> anyhow::Result<narrator_db::Uuid> {
    narrator_db::Uuid::parse_str(text.trim()).map_err(|_| {
        anyhow::anyhow!(
            "'{text}' is not a job id: job ids are UUIDs as printed by `narrator submit` or `narrator jobs`"
        )
    })
}
