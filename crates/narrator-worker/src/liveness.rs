//! Liveness of work in progress. A wedged GPU, phonemizer or encoder leaves every loop
//! ticking and the heartbeat fresh while deliveries sit unacknowledged and an assembly
//! claim is never given up. So the work itself is watched: a batch that has run past
//! 10 times this engine's mean batch (and at least `--wedged-after`), phonemizing past
//! `--wedged-after`, or an assembly past its budget (`--wedged-after` plus a tenth of the
//! book's audio time) *wedges* the worker: `/healthz` fails, the worker's row says why,
//! and the worker stops with that reason (its deliveries go back to the queue when its
//! connection closes, its assembly is put back for another worker), for its supervisor
//! to restart it.

use std::sync::Arc;
use std::time::Duration;

use narrator_pipeline::{Synthesizer, Work};
use narrator_telemetry::serve::Health;
use tokio::sync::watch;

/// A batch is wedged past this many times the engine's mean batch.
pub const BATCH_FACTOR: u32 = 10;

/// The default floor of every limit (`narrator worker --wedged-after`).
pub const WEDGED_AFTER: Duration = Duration::from_secs(600);

/// Why this worker is wedged, once it is (the first reason wins).
#[derive(Debug)]
pub struct Wedge {
    reason: watch::Sender<Option<String>>,
    health: Arc<Health>,
}

impl Wedge {
    /// Not wedged; reports go to `health`.
    pub fn new(health: Arc<Health>) -> Arc<Self> {
        Arc::new(Self {
            reason: watch::Sender::new(None),
            health,
        })
    }

    /// Work named `what` (`engine`, `assembly`) ran past its limit: fails `/healthz`
    /// and wakes [`Wedge::wait`].
    pub fn report(&self, what: &str, reason: String) {
        tracing::error!(%reason, "work in progress is wedged; the worker stops");
        self.health.stall(what, reason.clone());
        self.reason.send_if_modified(|r| {
            let first = r.is_none();
            if first {
                *r = Some(reason);
            }
            first
        });
    }

    /// The reason, once wedged.
    pub fn reason(&self) -> Option<String> {
        self.reason.borrow().clone()
    }

    /// Resolves with the reason once the worker is wedged.
    pub async fn wait(&self) -> String {
        let mut rx = self.reason.subscribe();
        let Ok(r) = rx.wait_for(Option::is_some).await else {
            // The sender lives in `self`: not reached while `self` is borrowed.
            return std::future::pending().await;
        };
        r.clone().unwrap_or_default()
    }
}

/// How long `work` may run: a batch [`BATCH_FACTOR`] times the engine's mean batch
/// (`mean_batch`, seconds) and at least `floor`; phonemizing `floor`.
pub fn limit(work: Work, mean_batch: Option<f64>, floor: Duration) -> Duration {
    match (work, mean_batch) {
        (Work::Batch, Some(mean)) => Duration::try_from_secs_f64(mean * f64::from(BATCH_FACTOR))
            .unwrap_or(Duration::MAX)
            .max(floor),
        _ => floor,
    }
}

/// The budget of an assembly of `audio_seconds` of audio: `floor` plus a tenth of it
/// (encoders run tens of times faster than real time).
pub fn assembly_budget(audio_seconds: f64, floor: Duration) -> Duration {
    floor + Duration::try_from_secs_f64(audio_seconds.max(0.0) / 10.0).unwrap_or(Duration::MAX)
}

/// Checks every second the work in progress of each voice's synthesizer; reports the
/// first that runs past its limit and ends.
pub(crate) async fn watch_engines(
    synths: Vec<(String, Arc<Synthesizer>)>,
    floor: Duration,
    wedge: Arc<Wedge>,
    mut stop: watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            biased;
            _ = stop.wait_for(|v| *v) => return,
            _ = tick.tick() => {}
        }
        for (voice, synth) in &synths {
            let Some((work, ran)) = synth.longest_running() else {
                continue;
            };
            let allowed = limit(work, synth.mean_batch_seconds(), floor);
            if ran > allowed {
                wedge.report(
                    "engine",
                    format!(
                        "voice {voice}: {} has run for {:.0} s (limit {:.0} s); the engine, \
                         phonemizer or device is wedged",
                        work.as_str(),
                        ran.as_secs_f64(),
                        allowed.as_secs_f64()
                    ),
                );
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_scale_with_the_engines_own_batches_above_the_floor() {
        let floor = Duration::from_secs(600);
        assert_eq!(limit(Work::Batch, None, floor), floor);
        assert_eq!(limit(Work::Batch, Some(2.0), floor), floor);
        assert_eq!(
            limit(Work::Batch, Some(120.0), floor),
            Duration::from_secs(1200)
        );
        assert_eq!(limit(Work::Phonemize, Some(120.0), floor), floor);
        assert_eq!(
            assembly_budget(36_000.0, floor),
            Duration::from_secs(600 + 3600)
        );
    }

    #[tokio::test]
    async fn the_first_reason_wins_and_fails_healthz() {
        let health = Health::new();
        let wedge = Wedge::new(health.clone());
        assert!(wedge.reason().is_none());
        wedge.report("engine", "first".into());
        wedge.report("assembly", "second".into());
        assert_eq!(wedge.wait().await, "first");
        assert!(!health.healthy().0);
    }
}
