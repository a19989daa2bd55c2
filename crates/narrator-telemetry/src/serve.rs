//! The worker's HTTP endpoints: `/metrics` (Prometheus text format), `/healthz` (the
//! process is alive and its loops tick) and `/readyz` (it can take work: every readiness
//! check holds). Both probes answer 200 or 503 with a JSON body that says which check
//! failed. `/readyz` names the failing checks only: what they saw (a database's error
//! text, say) goes to the log, not to whoever can reach the port.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use metrics_exporter_prometheus::PrometheusHandle;
use serde_json::{Value, json};

use crate::TelemetryError;

/// Liveness and readiness, shared by the loops that report to it.
#[derive(Debug, Default)]
pub struct Health {
    loops: Mutex<BTreeMap<String, (Instant, Duration)>>,
    checks: Mutex<BTreeMap<String, (bool, String)>>,
    /// Work that has run past its limit (a wedged engine, phonemizer or encoder), by name.
    stalls: Mutex<BTreeMap<String, String>>,
}

impl Health {
    /// Nothing registered: healthy, not ready.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Registers a loop that must [`Health::tick`] at least every `within`; it counts as
    /// ticking from now.
    pub fn expect_loop(&self, name: &str, within: Duration) {
        lock(&self.loops).insert(name.to_string(), (Instant::now(), within));
    }

    /// A registered loop went round.
    pub fn tick(&self, name: &str) {
        if let Some(entry) = lock(&self.loops).get_mut(name) {
            entry.0 = Instant::now();
        }
    }

    /// Work in progress named `name` has run past its limit: the process is not alive
    /// in any useful sense, whatever its loops do; `/healthz` fails from now on, saying
    /// what (a worker stops itself after this, so it is not cleared).
    pub fn stall(&self, name: &str, detail: impl Into<String>) {
        lock(&self.stalls).insert(name.to_string(), detail.into());
    }

    /// Sets a readiness check (`engines`, `broker`, `database`, ...), with what it saw
    /// (logged when the check fails; never served).
    pub fn set(&self, check: &str, ok: bool, detail: impl Into<String>) {
        let detail = detail.into();
        if !ok {
            tracing::warn!(check, detail = %detail, "readiness check failing");
        }
        lock(&self.checks).insert(check.to_string(), (ok, detail));
        metrics::gauge!(crate::metrics::READY).set(if self.ready().0 { 1.0 } else { 0.0 });
    }

    /// Whether every loop ticked in time, and the loops' ages.
    pub fn healthy(&self) -> (bool, Value) {
        let now = Instant::now();
        let mut ok = true;
        let mut loops = serde_json::Map::new();
        for (name, (last, within)) in lock(&self.loops).iter() {
            let age = now.saturating_duration_since(*last);
            let alive = age <= *within;
            ok &= alive;
            loops.insert(
                name.clone(),
                json!({"ok": alive, "seconds_since_tick": age.as_secs_f64(), "limit_seconds": within.as_secs_f64()}),
            );
        }
        let stalls = lock(&self.stalls).clone();
        ok &= stalls.is_empty();
        (
            ok,
            json!({"status": if ok { "ok" } else { "stalled" }, "loops": loops, "stalled_work": stalls}),
        )
    }

    /// What `/readyz` serves: whether the worker can take work, each check's state and
    /// the names of those failing, without what they saw.
    pub fn ready_public(&self) -> (bool, Value) {
        let checks = lock(&self.checks);
        let ok = !checks.is_empty() && checks.values().all(|(ok, _)| *ok);
        let states: serde_json::Map<String, Value> = checks
            .iter()
            .map(|(k, (ok, _))| (k.clone(), json!({"ok": ok})))
            .collect();
        let failing: Vec<&String> = checks
            .iter()
            .filter(|(_, (ok, _))| !ok)
            .map(|(k, _)| k)
            .collect();
        (
            ok,
            json!({"status": if ok { "ready" } else { "not ready" }, "checks": states, "failing": failing}),
        )
    }

    /// Whether the worker can take work: at least one check set and all of them hold,
    /// with what each check saw (for logs and tests; `/readyz` serves [`Health::ready_public`]).
    pub fn ready(&self) -> (bool, Value) {
        let checks = lock(&self.checks);
        let ok = !checks.is_empty() && checks.values().all(|(ok, _)| *ok);
        let detail: serde_json::Map<String, Value> = checks
            .iter()
            .map(|(k, (ok, d))| (k.clone(), json!({"ok": ok, "detail": d})))
            .collect();
        (
            ok,
            json!({"status": if ok { "ready" } else { "not ready" }, "checks": detail}),
        )
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[derive(Clone)]
struct Shared {
    metrics: PrometheusHandle,
    health: Arc<Health>,
}

async fn metrics_page(State(s): State<Shared>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        s.metrics.render(),
    )
}

fn probe((ok, body): (bool, Value)) -> impl IntoResponse {
    let code = if ok {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (
        code,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
}

async fn healthz(State(s): State<Shared>) -> impl IntoResponse {
    probe(s.health.healthy())
}

async fn readyz(State(s): State<Shared>) -> impl IntoResponse {
    probe(s.health.ready_public())
}

/// A running listener.
#[derive(Debug)]
pub struct Server {
    /// The address it listens on (the port chosen when `:0` was asked for).
    pub addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Listens on `addr` (e.g. `0.0.0.0:9464`) and serves `/metrics`, `/healthz` and
/// `/readyz` until the returned [`Server`] is dropped. Installs the Prometheus recorder.
pub async fn serve(addr: &str, health: Arc<Health>) -> Result<Server, TelemetryError> {
    let metrics = crate::metrics::install()?;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| TelemetryError::Listen {
            addr: addr.to_string(),
            source,
        })?;
    let local = listener
        .local_addr()
        .map_err(|source| TelemetryError::Listen {
            addr: addr.to_string(),
            source,
        })?;
    let app = Router::new()
        .route("/metrics", get(metrics_page))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(Shared { metrics, health });
    let task = tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "the metrics/health listener stopped");
        }
    });
    Ok(Server { addr: local, task })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_only_when_every_check_holds_and_healthy_only_while_loops_tick() {
        let h = Health::new();
        assert!(!h.ready().0, "nothing checked yet");
        h.set("engines", true, "warm");
        h.set("broker", false, "connecting");
        let (ok, body) = h.ready();
        assert!(!ok);
        assert_eq!(body["checks"]["broker"]["detail"], "connecting");
        // Served: the failing check's name, not what it saw.
        h.set(
            "database",
            false,
            "password authentication failed for user \"narrator\"",
        );
        let (ok, public) = h.ready_public();
        assert!(!ok);
        assert_eq!(public["failing"], json!(["broker", "database"]));
        assert_eq!(public["checks"]["engines"]["ok"], true);
        assert!(!public.to_string().contains("password"), "{public}");
        assert!(!public.to_string().contains("connecting"), "{public}");
        h.set("database", true, "reachable");
        h.set("broker", true, "consuming");
        assert!(h.ready().0);

        assert!(h.healthy().0);
        h.expect_loop("heartbeat", Duration::ZERO);
        std::thread::sleep(Duration::from_millis(5));
        let (ok, body) = h.healthy();
        assert!(!ok);
        assert_eq!(body["loops"]["heartbeat"]["ok"], false);
        h.expect_loop("heartbeat", Duration::from_secs(60));
        h.tick("heartbeat");
        assert!(h.healthy().0);
        // Loops that tick do not make a process with wedged work alive.
        h.stall("engine", "voice v: a batch has run for 700 s (limit 600 s)");
        let (ok, body) = h.healthy();
        assert!(!ok);
        assert_eq!(
            body["stalled_work"]["engine"],
            "voice v: a batch has run for 700 s (limit 600 s)"
        );
    }
}
