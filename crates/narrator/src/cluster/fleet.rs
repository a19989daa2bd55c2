//! What `plan` and `bench` share with the fleet through Postgres: calibrations by GPU
//! model (`gpu_calibrations`), read into a [`Catalog`] before planning and written after
//! a worker or `narrator plan` measured one on a GPU; and `narrator bench` results
//! (`bench_results`), stored after a run and listed by `bench --fleet`.

use anyhow::{Context, bail};
use narrator_db::{BenchRow, PgPool, StoredBench};
use narrator_hardware::{Calibration, Catalog};
use narrator_net::redact;
use narrator_pipeline::BenchFigures;

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
    let shareable = c.source == narrator_hardware::CalibrationSource::Measured
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

/// Connects for bench results (the schema must have been migrated).
pub(crate) async fn bench_store(url: &str) -> anyhow::Result<PgPool> {
    let shown = redact(url);
    let pool = narrator_db::connect(url)
        .await
        .with_context(|| format!("database {shown}"))?;
    if !narrator_db::bench_table_exists(&pool).await? {
        bail!(
            "database {shown} has no bench_results table: run `narrator migrate` first (or pass --no-store)"
        );
    }
    Ok(pool)
}

/// `narrator bench --fleet`: the newest result per hardware and voice.
pub(crate) async fn print_bench_table(url: Option<&str>, json: bool) -> anyhow::Result<()> {
    let Some(url) = url else {
        bail!(
            "--fleet reads the results from Postgres: pass --database-url or set NARRATOR_DATABASE_URL"
        );
    };
    let pool = bench_store(url).await?;
    let rows = narrator_db::fleet_bench(&pool).await?;
    if json {
        for r in &rows {
            println!("{}", serde_json::to_string(r)?);
        }
        return Ok(());
    }
    print!("{}", render_bench_table(&rows));
    Ok(())
}

/// Stores a finished `narrator bench` run (its figures are already printed).
pub(crate) async fn record_bench(
    db: &PgPool,
    at: crate::bench::Measured<'_>,
    figures: &BenchFigures,
    report: serde_json::Value,
) -> anyhow::Result<()> {
    let row = BenchRow {
        host: at.host.to_string(),
        hardware: at.hardware,
        device: at.device,
        voice: at.voice.to_string(),
        rtf_single: figures.rtf_single,
        rtf_batched: figures.rtf_batched,
        batched_at: u32::try_from(figures.batched_at).unwrap_or(u32::MAX),
        max_stable_concurrency: u32::try_from(figures.max_stable_concurrency).unwrap_or(u32::MAX),
        latency_target_seconds: figures.latency_target_seconds,
        report,
    };
    let id = narrator_db::record_bench(db, &row)
        .await
        .context("storing the results (they are printed above)")?;
    eprintln!("stored as bench result {id} (see `narrator bench --fleet`)");
    Ok(())
}

fn render_bench_table(rows: &[StoredBench]) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    if rows.is_empty() {
        s.push_str("no bench results stored yet: run `narrator bench` on each worker type with NARRATOR_DATABASE_URL set\n");
        return s;
    }
    let _ = writeln!(
        s,
        "| hardware | voice | single RTF | batched RTF | max stable concurrency | measured |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|");
    for r in rows {
        let b = &r.row;
        let _ = writeln!(
            s,
            "| {} | {} | {:.3} | {:.3} (batch {}) | {} (p95 ≤ {} s) | {} on {} |",
            b.hardware,
            b.voice,
            b.rtf_single,
            b.rtf_batched,
            b.batched_at,
            b.max_stable_concurrency,
            b.latency_target_seconds,
            r.measured_at.format("%Y-%m-%d %H:%M"),
            b.host
        );
    }
    s
}
