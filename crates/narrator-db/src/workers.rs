//! Workers: each process upserts its row on a heartbeat; `narrator workers` lists those
//! seen recently, with what they did in the last ten minutes (the `worker_recent` view).

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::types::Json;
use sqlx::{PgExecutor, Row};

use crate::error::{DbError, int8, unsigned};
use crate::secs;

/// What a worker says about itself.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WorkerInfo {
    /// Unique per process, e.g. `host:pid`.
    pub id: String,
    /// Host name.
    pub host: String,
    /// Device it synthesizes on (`cpu`, `cuda:0`).
    pub device: String,
    /// Its hardware profile.
    pub hardware: serde_json::Value,
    /// Its batch plan.
    pub plan: serde_json::Value,
    /// This process's incarnation: new at every start, so claims made by a process that
    /// died are told from those of its successor under the same `id`.
    pub instance: Option<uuid::Uuid>,
    /// After how long without a heartbeat this worker counts as gone (6 of its own
    /// heartbeats): peers judge it by this, not by their own interval.
    #[serde(skip_serializing_if = "Option::is_none", with = "opt_secs")]
    pub stale_after: Option<std::time::Duration>,
}

/// `Option<Duration>` as seconds.
mod opt_secs {
    pub(super) fn serialize<S: serde::Serializer>(
        d: &Option<std::time::Duration>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => s.serialize_f64(d.as_secs_f64()),
            None => s.serialize_none(),
        }
    }
}

/// A row of the `worker_recent` view.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WorkerStatus {
    /// What the worker said.
    #[serde(flatten)]
    pub info: WorkerInfo,
    /// Segments it finished since it started.
    pub segments_done: u64,
    /// First heartbeat.
    pub started_at: DateTime<Utc>,
    /// Latest heartbeat.
    pub last_seen: DateTime<Utc>,
    /// Segments it finished in the last 10 minutes.
    pub recent_segments: u64,
    /// Median RTF of those; `None` when there are none.
    pub recent_median_rtf: Option<f64>,
}

/// Upserts the worker's row: its description, its count of finished segments, and
/// `last_seen = now()` (`started_at` is kept from the first beat).
pub async fn heartbeat(
    exec: impl PgExecutor<'_>,
    worker: &WorkerInfo,
    segments_done: u64,
) -> Result<(), DbError> {
    sqlx::query(
        "INSERT INTO workers (id, host, device, hardware, plan, segments_done, instance, \
           stale_after_s) VALUES ($1, $2, $3, $4, $5, $6, $7, $8) \
         ON CONFLICT (id) DO UPDATE SET host = EXCLUDED.host, device = EXCLUDED.device, \
           hardware = EXCLUDED.hardware, plan = EXCLUDED.plan, \
           segments_done = EXCLUDED.segments_done, instance = EXCLUDED.instance, \
           stale_after_s = EXCLUDED.stale_after_s, \
           started_at = CASE WHEN workers.instance IS DISTINCT FROM EXCLUDED.instance \
             THEN now() ELSE workers.started_at END, last_seen = now()",
    )
    .bind(&worker.id)
    .bind(&worker.host)
    .bind(&worker.device)
    .bind(Json(&worker.hardware))
    .bind(Json(&worker.plan))
    .bind(int8("segments done", segments_done)?)
    .bind(worker.instance)
    .bind(worker.stale_after.map(secs))
    .execute(exec)
    .await?;
    Ok(())
}

/// Deletes the rows of workers not seen for `unseen_for` (a day, from the heartbeat):
/// worker ids are `host:pid` by default, so every restart leaves a row behind, and the
/// live-worker filters would otherwise read more rows as the fleet ages. Nothing keeps a
/// reference to the row: segments and jobs name a worker by its id string (no foreign
/// key), and a deleted row reads as a worker gone, which it is. Returns how many rows
/// went.
pub async fn forget_workers(
    exec: impl PgExecutor<'_>,
    unseen_for: Duration,
) -> Result<u64, DbError> {
    Ok(
        sqlx::query("DELETE FROM workers WHERE last_seen < now() - make_interval(secs => $1)")
            .bind(secs(unseen_for))
            .execute(exec)
            .await?
            .rows_affected(),
    )
}

/// Workers seen within `active_within`, by id.
pub async fn list_workers(
    exec: impl PgExecutor<'_>,
    active_within: Duration,
) -> Result<Vec<WorkerStatus>, DbError> {
    sqlx::query(
        "SELECT * FROM worker_recent WHERE last_seen >= now() - make_interval(secs => $1) \
         ORDER BY id",
    )
    .bind(secs(active_within))
    .fetch_all(exec)
    .await?
    .iter()
    .map(|row| {
        let Json(hardware): Json<serde_json::Value> = row.try_get("hardware")?;
        let Json(plan): Json<serde_json::Value> = row.try_get("plan")?;
        Ok(WorkerStatus {
            info: WorkerInfo {
                id: row.try_get("id")?,
                host: row.try_get("host")?,
                device: row.try_get("device")?,
                hardware,
                plan,
                // Not in the view: it matters to assembly claims only.
                instance: None,
                stale_after: row
                    .try_get::<Option<f64>, _>("stale_after_s")?
                    .filter(|s| s.is_finite() && *s > 0.0)
                    .map(std::time::Duration::from_secs_f64),
            },
            segments_done: unsigned("segments_done", row.try_get("segments_done")?)?,
            started_at: row.try_get("started_at")?,
            last_seen: row.try_get("last_seen")?,
            recent_segments: unsigned("recent_segments", row.try_get("recent_segments")?)?,
            recent_median_rtf: row.try_get("recent_median_rtf")?,
        })
    })
    .collect()
}

/// The voices that workers seen within `active_within` serve (their plans), sorted: one
/// read of the workers' rows, without [`list_workers`]' recent figures (which read every
/// segment the fleet finished in the last ten minutes).
pub async fn served_voices(
    exec: impl PgExecutor<'_>,
    active_within: Duration,
) -> Result<Vec<String>, DbError> {
    Ok(sqlx::query_scalar(
        "SELECT DISTINCT p->>'voice' AS voice FROM workers w \
         CROSS JOIN LATERAL jsonb_array_elements( \
           CASE WHEN jsonb_typeof(w.plan) = 'array' THEN w.plan ELSE '[]' END) p \
         WHERE w.last_seen >= now() - make_interval(secs => $1) \
           AND jsonb_typeof(p->'voice') = 'string' \
         ORDER BY voice",
    )
    .bind(secs(active_within))
    .fetch_all(exec)
    .await?)
}
