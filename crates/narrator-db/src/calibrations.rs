//! Calibrations by GPU model, shared by the fleet (the `gpu_calibrations` table): one
//! H200's measurement serves every H200 worker, so a new worker on a known model skips
//! calibrating. The calibration itself is opaque JSON here (narrator-hardware's
//! `Calibration`); the key is voice, device model and ONNX Runtime version.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::types::Json;
use sqlx::{PgExecutor, Row};

use crate::error::DbError;

/// One stored calibration.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StoredCalibration {
    /// Voice name.
    pub voice: String,
    /// GPU model as NVML names it ("NVIDIA H200").
    pub device_model: String,
    /// ONNX Runtime version.
    pub runtime: String,
    /// The calibration (narrator-hardware's `Calibration` as JSON).
    pub calibration: serde_json::Value,
    /// The worker that measured it.
    pub measured_by: String,
    /// When it was stored.
    pub measured_at: DateTime<Utc>,
}

/// Stores (or replaces) the calibration of `voice` on `device_model` with `runtime`.
pub async fn put_calibration(
    exec: impl PgExecutor<'_>,
    voice: &str,
    device_model: &str,
    runtime: &str,
    calibration: &serde_json::Value,
    measured_by: &str,
) -> Result<(), DbError> {
    sqlx::query(
        "INSERT INTO gpu_calibrations (voice, device_model, runtime, calibration, measured_by) \
         VALUES ($1, $2, $3, $4, $5) \
         ON CONFLICT (voice, device_model, runtime) DO UPDATE SET \
           calibration = EXCLUDED.calibration, measured_by = EXCLUDED.measured_by, \
           measured_at = now()",
    )
    .bind(voice)
    .bind(device_model)
    .bind(runtime)
    .bind(Json(calibration))
    .bind(measured_by)
    .execute(exec)
    .await?;
    Ok(())
}

/// Every stored calibration, by voice, model and runtime.
pub async fn list_calibrations(
    exec: impl PgExecutor<'_>,
) -> Result<Vec<StoredCalibration>, DbError> {
    let rows = sqlx::query(
        "SELECT voice, device_model, runtime, calibration, measured_by, measured_at \
         FROM gpu_calibrations ORDER BY voice, device_model, runtime",
    )
    .fetch_all(exec)
    .await?;
    rows.into_iter()
        .map(|r| {
            Ok(StoredCalibration {
                voice: r.try_get("voice")?,
                device_model: r.try_get("device_model")?,
                runtime: r.try_get("runtime")?,
                calibration: r.try_get::<Json<serde_json::Value>, _>("calibration")?.0,
                measured_by: r.try_get("measured_by")?,
                measured_at: r.try_get("measured_at")?,
            })
        })
        .collect::<Result<_, sqlx::Error>>()
        .map_err(DbError::from)
}
