//! The worker's sampled metrics (every [`SAMPLE_EVERY`], only when `/metrics` is
//! served): the voices' queue depths and the dead letters (passive declares); jobs by
//! state, the oldest unfinished job and jobs without progress for a lease (one query);
//! per GPU what NVML reports (memory, utilisation, temperature, power, clocks, throttle
//! reasons). The per-engine gauges (plan, device-busy fraction, CPU fallback) are set by
//! the heartbeat, which computes them anyway; counters and histograms are recorded where
//! the work happens.

use std::sync::Arc;
use std::time::Duration;

use narrator_broker::{DEAD_LETTER_QUEUE, LANES, lane_queue};
use narrator_db::PgPool;
use narrator_telemetry::metrics as m;
use tokio::sync::watch;

use crate::heartbeat::Describe;
use crate::reconciler::ready_messages;

/// Between samples.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(5);

pub(crate) struct Gauges {
    pub(crate) pool: PgPool,
    pub(crate) channel: lapin::Channel,
    pub(crate) describe: Arc<Describe>,
    pub(crate) lease: Duration,
}

impl Gauges {
    async fn queues(&self) {
        let mut voices: Vec<&str> = self
            .describe
            .reports
            .iter()
            .map(|r| r.voice.as_str())
            .collect();
        voices.dedup();
        for voice in voices {
            for lane in 0..LANES {
                if let Some(n) = ready_messages(&self.channel, &lane_queue(voice, lane)).await {
                    metrics::gauge!(m::QUEUE_MESSAGES, "voice" => voice.to_string(), "lane" => lane.to_string())
                        .set(f64::from(n));
                }
            }
        }
        if let Some(n) = ready_messages(&self.channel, DEAD_LETTER_QUEUE).await {
            metrics::gauge!(m::DEAD_LETTER_MESSAGES).set(f64::from(n));
        }
    }

    /// `reported`: the voices reported before; one missing now (no unfinished job, none
    /// finished in the last hour) has its gauges set to 0 rather than left at their last
    /// values.
    async fn jobs(&self, reported: &mut std::collections::BTreeSet<String>) {
        let gauges = match narrator_db::voice_gauges(&self.pool, self.lease).await {
            Ok(g) => g,
            Err(e) => {
                tracing::debug!(error = %e, "cannot read the job gauges");
                return;
            }
        };
        let now: std::collections::BTreeSet<String> =
            gauges.iter().map(|g| g.voice.clone()).collect();
        let gone = reported
            .difference(&now)
            .map(|voice| narrator_db::VoiceGauges::empty(voice.clone()));
        let gauges: Vec<_> = gauges.into_iter().chain(gone).collect();
        *reported = now;
        for g in gauges {
            for (state, n) in &g.by_state {
                metrics::gauge!(m::JOBS, "voice" => g.voice.clone(), "state" => state.clone())
                    .set(*n as f64);
            }
            metrics::gauge!(m::OLDEST_JOB_SECONDS, "voice" => g.voice.clone())
                .set(g.oldest_unfinished_seconds);
            metrics::gauge!(m::JOBS_STALLED, "voice" => g.voice.clone()).set(g.stalled as f64);
        }
    }
}

async fn gpus() {
    let Ok(gpus) = tokio::task::spawn_blocking(narrator_hardware::sample_gpus).await else {
        return;
    };
    for g in gpus {
        let labels = [("gpu", g.index.to_string()), ("name", g.name.clone())];
        let set = |name: &'static str, v: Option<f64>| {
            if let Some(v) = v {
                metrics::gauge!(name, &labels).set(v);
            }
        };
        set(m::GPU_MEMORY_USED, Some(g.memory_used_bytes as f64));
        set(m::GPU_MEMORY_TOTAL, Some(g.memory_total_bytes as f64));
        set(
            m::GPU_UTILIZATION,
            g.utilization_percent.map(|u| f64::from(u) / 100.0),
        );
        set(m::GPU_TEMPERATURE, g.temperature_c.map(f64::from));
        set(
            m::GPU_SLOWDOWN_TEMPERATURE,
            g.slowdown_temperature_c.map(f64::from),
        );
        set(m::GPU_POWER, g.power_draw_watts);
        set(m::GPU_POWER_LIMIT, g.power_limit_watts);
        set(m::GPU_SM_CLOCK, g.clocks.sm_mhz.map(f64::from));
        set(m::GPU_SM_CLOCK_MAX, g.clocks.max_sm_mhz.map(f64::from));
        for reason in narrator_hardware::THROTTLE_REASONS {
            let active = g.throttle_reasons.iter().any(|r| r == reason);
            metrics::gauge!(m::GPU_THROTTLE, "gpu" => g.index.to_string(), "reason" => *reason)
                .set(if active { 1.0 } else { 0.0 });
        }
    }
}

/// Samples every [`SAMPLE_EVERY`] until `stop`.
pub(crate) async fn gauges(g: Gauges, mut stop: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(SAMPLE_EVERY);
    let mut reported = std::collections::BTreeSet::new();
    loop {
        g.queues().await;
        g.jobs(&mut reported).await;
        gpus().await;
        tokio::select! {
            biased;
            _ = stop.wait_for(|v| *v) => return,
            _ = tick.tick() => {}
        }
    }
}
