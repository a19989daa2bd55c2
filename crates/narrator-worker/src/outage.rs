//! Outages of the services a worker depends on. A failure of retry class
//! [`Infrastructure`](narrator_core::RetryClass::Infrastructure) is the service's, not the
//! segment's: the segment is postponed without being charged an attempt, the worker
//! pauses before taking more work (backing off while the outage lasts), and the operator
//! is told once when it starts and once when it ends (the log, and the worker's row).

use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

/// The longest pause between tries while a service is away.
pub const MAX_PAUSE: Duration = Duration::from_secs(60);

/// One worker's view of the outage in progress, if any.
#[derive(Debug, Default)]
pub struct Outages {
    state: Mutex<Option<Active>>,
}

#[derive(Debug, Clone)]
struct Active {
    kind: &'static str,
    error: String,
    since: SystemTime,
    started: Instant,
    failures: u32,
    pause_until: Instant,
}

impl Outages {
    /// A new tracker with no outage.
    pub fn new() -> Self {
        Self::default()
    }

    /// A failure of kind `kind` (e.g. `db_unavailable`, `store_io`) caused by a service:
    /// logged when an outage starts. The pause before the next deliveries grows each time
    /// work is tried again after a pause and fails (5 s doubling to [`MAX_PAUSE`],
    /// jittered); failures of deliveries taken together count once. Returns the pause.
    pub fn failed(&self, kind: &'static str, error: &str) -> Duration {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        let active = state.get_or_insert_with(|| {
            tracing::warn!(kind, %error, "a service is away: deliveries are postponed without being charged attempts until it is back");
            Active {
                kind,
                error: error.to_string(),
                since: SystemTime::now(),
                started: now,
                failures: 0,
                pause_until: now,
            }
        });
        active.kind = kind;
        active.error = error.to_string();
        if now < active.pause_until {
            // Another delivery of the group that already failed: same pause.
            return active.pause_until - now;
        }
        active.failures += 1;
        let pause = crate::backoff(active.failures).min(crate::jittered(MAX_PAUSE));
        active.pause_until = now + pause;
        pause
    }

    /// Work went through: an outage in progress is over (logged once).
    pub fn succeeded(&self) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(a) = state.take() {
            tracing::warn!(
                kind = a.kind,
                seconds = a.started.elapsed().as_secs_f64(),
                failures = a.failures,
                "the service is back; work resumes"
            );
        }
    }

    /// How long to wait before taking more work (zero without an outage).
    pub fn pause(&self) -> Duration {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.as_ref().map_or(Duration::ZERO, |a| {
            a.pause_until.saturating_duration_since(Instant::now())
        })
    }

    /// The outage for the worker's row: `null`, or `{kind, error, since_unix_s, failures}`.
    pub fn describe(&self) -> serde_json::Value {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        match &*state {
            None => serde_json::Value::Null,
            Some(a) => serde_json::json!({
                "kind": a.kind,
                "error": a.error,
                "since_unix_s": a.since.duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0),
                "failures": a.failures,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_outage_pauses_longer_with_each_failure_and_ends_on_success() {
        let o = Outages::new();
        assert_eq!(o.pause(), Duration::ZERO);
        assert!(o.describe().is_null());
        let first = o.failed("store_io", "connection refused");
        assert!((4.0..=6.0).contains(&first.as_secs_f64()), "{first:?}");
        // The rest of the same group: the same pause, not a longer one.
        let same = o.failed("store_io", "connection refused");
        assert!(same <= first, "{same:?} vs {first:?}");
        assert_eq!(o.describe()["failures"].as_u64(), Some(1));
        // A try after the pause that fails again: longer.
        o.state
            .lock()
            .expect("lock")
            .as_mut()
            .expect("active")
            .pause_until = Instant::now();
        let second = o.failed("store_io", "connection refused");
        assert!(second.as_secs_f64() >= 8.0, "{second:?}");
        assert!(o.pause() > Duration::from_secs(7));
        let d = o.describe();
        assert_eq!(
            (d["kind"].as_str(), d["failures"].as_u64()),
            (Some("store_io"), Some(2))
        );
        o.succeeded();
        assert_eq!(o.pause(), Duration::ZERO);
        assert!(o.describe().is_null());
    }
}
