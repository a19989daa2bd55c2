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

/// Stores a calibration measured on a GPU for the rest of the fleet.
pub(crate) async fn store(db: &PgPool, c: &Calibration, measured_by: &str) -> anyhow::Result<()> {
    let mut stored = c.clone();
    stored.source = "measured".into();
    narrator_db::put_calibration(
        db,
        &c.voice,
        &c.device_model,
        &c.runtime,
        &serde_json::to_value(&stored)?,
        measured_by,
    )
    .await
    .context("storing the calibration for the fleet (an older schema needs `narrator migrate`)")?;
    eprintln!(
        "calibration of {} on {} stored for the fleet",
        c.voice, c.device_model
    );
    Ok(())
}
