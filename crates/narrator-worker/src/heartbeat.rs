//! The worker's row in `workers`: hardware, per voice the plan with the budget now, the
//! failures and fallback, the device-busy fraction, and the process instance that makes
//! assembly claims safe when an id is reused.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use narrator_db::{PgPool, Uuid, WorkerInfo};
use tokio::sync::watch;

/// One voice's engine, as the heartbeat reports it.
pub(crate) struct Report {
    pub(crate) voice: String,
    pub(crate) engine: String,
    pub(crate) prefetch: u16,
    pub(crate) base: serde_json::Value,
    pub(crate) synth: Arc<narrator_pipeline::Synthesizer>,
    /// Deliveries of this voice the worker holds unacknowledged.
    pub(crate) held: Arc<std::sync::atomic::AtomicUsize>,
    /// Of those, the high lane's.
    pub(crate) held_high: Arc<std::sync::atomic::AtomicUsize>,
}

/// What the worker says about itself at each heartbeat: the hardware profile, and per
/// voice the plan with the budget now (halved by out-of-memory failures), those failures,
/// a fallback to CPU, and the device-busy fraction since the last beat.
pub struct Describe {
    pub(crate) id: String,
    pub(crate) host: String,
    pub(crate) device: String,
    pub(crate) hardware: serde_json::Value,
    pub(crate) instance: Uuid,
    /// After how long without a beat peers count this worker gone.
    pub(crate) stale_after: std::time::Duration,
    pub(crate) reports: Vec<Report>,
    pub(crate) outages: Arc<crate::outage::Outages>,
    /// Why the worker is wedged, once it is.
    pub(crate) wedge: Arc<crate::liveness::Wedge>,
    /// (when, busy seconds per voice) at the last beat.
    pub(crate) last: std::sync::Mutex<Option<(std::time::Instant, Vec<f64>)>>,
}

impl Describe {
    /// The row the next heartbeat writes.
    pub fn info(&self) -> WorkerInfo {
        let now = std::time::Instant::now();
        let stats: Vec<_> = self.reports.iter().map(|r| r.synth.stats()).collect();
        // Busy session-seconds per session: the fraction of the device's sessions in use.
        let busy: Vec<f64> = stats
            .iter()
            .zip(&self.reports)
            .map(|(s, r)| s.busy_seconds / r.synth.pool().sessions().max(1) as f64)
            .collect();
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        let fractions: Vec<Option<f64>> = match &*last {
            Some((at, before)) => {
                let wall = now.duration_since(*at).as_secs_f64();
                busy.iter()
                    .zip(before)
                    .map(|(b, a)| (wall > 0.0).then(|| ((b - a) / wall).clamp(0.0, 1.0)))
                    .collect()
            }
            None => vec![None; busy.len()],
        };
        *last = Some((now, busy));
        let plans = self
            .reports
            .iter()
            .zip(stats)
            .zip(fractions)
            .map(|((r, st), busy_fraction)| {
                let b = r.synth.budget();
                gauge_engine(r, &b, busy_fraction, st.fallback.is_some());
                let mut v = r.base.clone();
                if let Some(o) = v.as_object_mut() {
                    o.insert("voice".into(), r.voice.clone().into());
                    o.insert("engine".into(), r.engine.clone().into());
                    o.insert("prefetch".into(), r.prefetch.into());
                    let held = r.held.load(Ordering::Relaxed);
                    let high = r.held_high.load(Ordering::Relaxed).min(held);
                    o.insert("held".into(), held.into());
                    // By lane (normal, high): the watchdog's rescue tells the lost from
                    // the held within each lane.
                    o.insert("held_lanes".into(), serde_json::json!([held - high, high]));
                    o.insert("device".into(), r.synth.pool().device().to_string().into());
                    o.insert("max_batch_tokens".into(), b.max_tokens.into());
                    o.insert("max_batch_requests".into(), b.max_requests.into());
                    o.insert("max_wait_ms".into(), (b.max_wait.as_millis() as u64).into());
                    o.insert("busy_seconds".into(), st.busy_seconds.into());
                    o.insert("device_busy_fraction".into(), busy_fraction.into());
                    o.insert("engine_runs".into(), st.runs.into());
                    o.insert("oom_events".into(), st.oom_events.into());
                    o.insert("last_oom".into(), st.last_oom.into());
                    o.insert("fallback".into(), st.fallback.into());
                    o.insert("outage".into(), self.outages.describe());
                    o.insert("wedged".into(), self.wedge.reason().into());
                }
                v
            })
            .collect();
        let device = self.reports.first().map_or_else(
            || self.device.clone(),
            |r| r.synth.pool().device().to_string(),
        );
        WorkerInfo {
            id: self.id.clone(),
            host: self.host.clone(),
            device,
            hardware: self.hardware.clone(),
            plan: serde_json::Value::Array(plans),
            instance: Some(self.instance),
            stale_after: Some(self.stale_after),
        }
    }
}

/// The per-engine gauges of `/metrics`, from what the heartbeat reports (no-ops without
/// the Prometheus recorder).
fn gauge_engine(
    r: &Report,
    budget: &narrator_pipeline::Budget,
    busy_fraction: Option<f64>,
    fallback: bool,
) {
    use narrator_telemetry::metrics as m;
    let labels = [
        ("voice", r.voice.clone()),
        ("device", r.synth.pool().device().to_string()),
    ];
    metrics::gauge!(m::PLAN_BUDGET_TOKENS, &labels).set(budget.max_tokens as f64);
    metrics::gauge!(m::PLAN_BUDGET_REQUESTS, &labels).set(budget.max_requests as f64);
    metrics::gauge!(m::PLAN_PREFETCH, "voice" => r.voice.clone()).set(f64::from(r.prefetch));
    metrics::gauge!(m::CPU_FALLBACK_ACTIVE, "voice" => r.voice.clone()).set(if fallback {
        1.0
    } else {
        0.0
    });
    if let Some(f) = busy_fraction {
        metrics::gauge!(m::DEVICE_BUSY_RATIO, &labels).set(f);
    }
}

/// Rows of workers not seen for this long are deleted (by any worker's heartbeat).
pub const FORGET_WORKERS_AFTER: Duration = Duration::from_secs(24 * 3600);

/// At most this often does a worker delete the rows of long-gone workers.
const FORGET_EVERY: Duration = Duration::from_secs(300);

/// Writes the worker's row every `every` until `stop`, and every [`FORGET_EVERY`]
/// deletes the rows of workers not seen for [`FORGET_WORKERS_AFTER`].
pub(crate) async fn heartbeat(
    pool: PgPool,
    describe: Arc<Describe>,
    done: Arc<AtomicU64>,
    (every, health): (Duration, Arc<narrator_telemetry::serve::Health>),
    mut stop: watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(every);
    let mut failing = false;
    let mut forgotten: Option<std::time::Instant> = None;
    loop {
        let info = describe.info();
        let beat = narrator_db::heartbeat(&pool, &info, done.load(Ordering::Relaxed)).await;
        health.tick("heartbeat");
        match &beat {
            Ok(()) => health.set("database", true, "reachable"),
            Err(e) => health.set("database", false, format!("heartbeat failed: {e}")),
        }
        match beat {
            // Once per outage, not once per beat.
            Err(e) if !failing => {
                tracing::warn!(error = %e, "heartbeat failed; retrying every beat");
                failing = true;
            }
            Err(e) => tracing::debug!(error = %e, "heartbeat failed again"),
            Ok(()) if failing => {
                tracing::warn!("heartbeat written again");
                failing = false;
            }
            Ok(()) => {}
        }
        if forgotten.is_none_or(|at| at.elapsed() >= FORGET_EVERY) {
            forgotten = Some(std::time::Instant::now());
            match narrator_db::forget_workers(&pool, FORGET_WORKERS_AFTER).await {
                Ok(0) => {}
                Ok(n) => tracing::debug!(rows = n, "deleted the rows of workers gone a day"),
                Err(e) => tracing::debug!(error = %e, "cannot delete the rows of gone workers"),
            }
        }
        tokio::select! {
            biased;
            _ = stop.wait_for(|v| *v) => return,
            _ = tick.tick() => {}
        }
    }
}
