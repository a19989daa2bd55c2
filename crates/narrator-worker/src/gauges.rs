//! The worker's sampled metrics (every [`SAMPLE_EVERY`], only when `/metrics` is
//! served): per voice the plan (budget, prefetch), the device-busy fraction and a CPU
//! fallback; the voices' queue depths and the dead letters (passive declares); jobs by
//! state, the oldest unfinished job and jobs without progress for a lease (one query);
//! per GPU what NVML reports (memory, utilisation, temperature, power, clocks, throttle
//! reasons). Counters and histograms are recorded where the work happens.

use std::sync::Arc;
use std::time::{Duration, Instant};

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
    fn engines(&self, last: &mut Option<(Instant, Vec<f64>)>) {
        let now = Instant::now();
        let busy: Vec<f64> = self
            .describe
            .reports
            .iter()
            .map(|r| r.synth.stats().busy_seconds)
            .collect();
        for (i, r) in self.describe.reports.iter().enumerate() {
            let device = r.synth.pool().device().to_string();
            let labels = [("voice", r.voice.clone()), ("device", device)];
            let budget = r.synth.budget();
            metrics::gauge!(m::PLAN_BUDGET_TOKENS, &labels).set(budget.max_tokens as f64);
            metrics::gauge!(m::PLAN_BUDGET_REQUESTS, &labels).set(budget.max_requests as f64);
            metrics::gauge!(m::PLAN_PREFETCH, "voice" => r.voice.clone())
                .set(f64::from(r.prefetch));
            let fallback = r.synth.stats().fallback.is_some();
            metrics::gauge!(m::CPU_FALLBACK_ACTIVE, "voice" => r.voice.clone()).set(if fallback {
                1.0
            } else {
                0.0
            });
            if let Some((then, before)) = last.as_ref() {
                let wall = now.duration_since(*then).as_secs_f64();
                if wall > 0.0 {
                    let ratio = (busy[i] - before.get(i).copied().unwrap_or(0.0)) / wall;
                    metrics::gauge!(m::DEVICE_BUSY_RATIO, &labels).set(ratio.clamp(0.0, 1.0));
                }
            }
        }
        *last = Some((now, busy));
    }

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

    async fn jobs(&self) {
        let gauges = match narrator_db::voice_gauges(&self.pool, self.lease).await {
            Ok(g) => g,
            Err(e) => {
                tracing::debug!(error = %e, "cannot read the job gauges");
                return;
            }
        };
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
    let mut last = None;
    loop {
        g.engines(&mut last);
        g.queues().await;
        g.jobs().await;
        gpus().await;
        tokio::select! {
            biased;
            _ = stop.wait_for(|v| *v) => return,
            _ = tick.tick() => {}
        }
    }
}
