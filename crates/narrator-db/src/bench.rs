//! `narrator bench` results: [`record_bench`] stores one run, [`fleet_bench`] reads the
//! fleet's table (the `bench_fleet` view: the newest run per hardware and voice).

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::types::Json;
use sqlx::{PgExecutor, Row};

use crate::error::{DbError, unsigned};

/// One benchmark run, as stored.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BenchRow {
    /// Host it ran on.
    pub host: String,
    /// The hardware as the table prints it (a worker type).
    pub hardware: String,
    /// Device it ran on (`cpu`, `cuda:0`).
    pub device: String,
    /// Voice measured.
    pub voice: String,
    /// RTF of one request at a time.
    pub rtf_single: f64,
    /// RTF at the plan's batch size.
    pub rtf_batched: f64,
    /// The batch size of `rtf_batched`.
    pub batched_at: u32,
    /// Clients whose p95 latency stayed within the target.
    pub max_stable_concurrency: u32,
    /// The p95 latency target, seconds.
    pub latency_target_seconds: f64,
    /// The whole report (`narrator bench --json`).
    pub report: serde_json::Value,
}

/// A stored run with its id and time.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StoredBench {
    /// Row id.
    pub id: i64,
    /// When it was stored.
    pub measured_at: DateTime<Utc>,
    /// The run.
    #[serde(flatten)]
    pub row: BenchRow,
}

/// Whether the schema has the bench table (an older database needs `narrator migrate`).
pub async fn bench_table_exists(exec: impl PgExecutor<'_>) -> Result<bool, DbError> {
    let t: Option<String> = sqlx::query_scalar("SELECT to_regclass('bench_results')::text")
        .fetch_one(exec)
        .await
        .map_err(DbError::Unavailable)?;
    Ok(t.is_some())
}

/// Stores one run; returns its id.
pub async fn record_bench(exec: impl PgExecutor<'_>, row: &BenchRow) -> Result<i64, DbError> {
    let id: i64 = sqlx::query_scalar(
        "INSERT INTO bench_results (host, hardware, device, voice, rtf_single, rtf_batched, \
           batched_at, max_stable_concurrency, latency_target_seconds, report) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) RETURNING id",
    )
    .bind(&row.host)
    .bind(&row.hardware)
    .bind(&row.device)
    .bind(&row.voice)
    .bind(row.rtf_single)
    .bind(row.rtf_batched)
    .bind(
        i32::try_from(row.batched_at).map_err(|_| DbError::OutOfRange {
            what: "batched_at",
            value: row.batched_at.into(),
        })?,
    )
    .bind(
        i32::try_from(row.max_stable_concurrency).map_err(|_| DbError::OutOfRange {
            what: "max_stable_concurrency",
            value: row.max_stable_concurrency.into(),
        })?,
    )
    .bind(row.latency_target_seconds)
    .bind(Json(&row.report))
    .fetch_one(exec)
    .await?;
    Ok(id)
}

/// The fleet's table: the newest run per hardware and voice, by hardware.
pub async fn fleet_bench(exec: impl PgExecutor<'_>) -> Result<Vec<StoredBench>, DbError> {
    sqlx::query("SELECT * FROM bench_fleet ORDER BY voice, rtf_batched, hardware")
        .fetch_all(exec)
        .await?
        .iter()
        .map(|r| {
            let Json(report): Json<serde_json::Value> = r.try_get("report")?;
            let batched: i32 = r.try_get("batched_at")?;
            let stable: i32 = r.try_get("max_stable_concurrency")?;
            Ok(StoredBench {
                id: r.try_get("id")?,
                measured_at: r.try_get("measured_at")?,
                row: BenchRow {
                    host: r.try_get("host")?,
                    hardware: r.try_get("hardware")?,
                    device: r.try_get("device")?,
                    voice: r.try_get("voice")?,
                    rtf_single: r.try_get("rtf_single")?,
                    rtf_batched: r.try_get("rtf_batched")?,
                    batched_at: unsigned("batched_at", batched.into())?,
                    max_stable_concurrency: unsigned("max_stable_concurrency", stable.into())?,
                    latency_target_seconds: r.try_get("latency_target_seconds")?,
                    report,
                },
            })
        })
        .collect()
}
