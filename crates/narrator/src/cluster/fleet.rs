//! The fleet's calibrations by GPU model (`gpu_calibrations`): read into a [`Catalog`]
//! before planning, written after a worker or `narrator plan` measured one on a GPU.

use anyhow::Context;
use narrator_db::PgPool;
use narrator_hardware::{Calibration, Catalog};
use narrator_net::redact;

/// Connects for calibrations (the schema must have been migrated).
pub(crate) async fn connect(url: &str) -> anyhow::Result<PgPool> {
    narrator_db::connect(url)
        .await
        .with_context(|| format!("database {} (for the fleet's calibrations)", redact(url)))
}

/// Adds every stored calibration to `catalog` (after what it holds, so they win).
pub(crate) async fn load_into(db: &PgPool, catalog: &mut Catalog) -> anyhow::Result<()> {
    let rows = narrator_db::list_calibrations(db)
        .await
        .context("reading the fleet's calibrations (an older schema needs `narrator migrate`)")?;
    for r in rows {
        let origin = format!(
            "fleet database, measured by {} at {}",
            r.measured_by,
            r.measured_at.format("%Y-%m-%d %H:%M UTC")
        );
        if let Err(e) = catalog.add_json(&r.calibration.to_string(), &origin) {
            tracing::warn!(error = %e, "ignoring an unreadable calibration in gpu_calibrations");
        }
    }
    Ok(())
}

/// Stores a calibration for the rest of the fleet when it is one worth sharing: measured
/// here (not read from the catalog, a cache or a flag) on a GPU NVML named. Returns
/// whether it was stored.
pub(crate) async fn share(db: &PgPool, c: &Calibration, measured_by: &str) -> anyhow::Result<bool> {
    let shareable = c.source == "measured"
        && !matches!(
            c.device_model.as_str(),
            "cpu" | "any" | crate::engine::UNKNOWN_GPU
        );
    if !shareable {
        return Ok(false);
    }
    narrator_db::put_calibration(
        db,
        &c.voice,
        &c.device_model,
        &c.runtime,
        &serde_json::to_value(c)?,
        measured_by,
    )
    .await
    .context("storing the calibration for the fleet (an older schema needs `narrator migrate`)")?;
    eprintln!(
        "calibration of {} on {} stored for the fleet",
        c.voice, c.device_model
    );
    Ok(true)
}
