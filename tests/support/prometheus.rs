//! A real Prometheus (Debian's `prometheus` package) for the tests: scrapes the given
//! targets every second, loads the alert rules of `ops/prometheus/alerts.yml`, and
//! answers PromQL through its HTTP query API.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::root;

/// A free TCP port on 127.0.0.1 (bound, then released).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// An HTTP client that returns every status as a response (10 s timeout).
fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(10)))
        .build()
        .into()
}

/// `GET url`: the status and the body (any status; a connection failure is status 0).
pub fn http_get(url: &str) -> (u16, String) {
    match agent().get(url).call() {
        Ok(mut r) => {
            let status = r.status().as_u16();
            (status, r.body_mut().read_to_string().unwrap_or_default())
        }
        Err(_) => (0, String::new()),
    }
}

/// A running Prometheus server.
pub struct Prometheus {
    child: Child,
    _dir: tempfile::TempDir,
    /// Its HTTP port.
    pub port: u16,
}

impl Prometheus {
    /// Starts Prometheus scraping `targets` (`host:port`, path `/metrics`) every second
    /// and waits until it is ready.
    pub fn scraping(targets: &[String]) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let rules = root().join("ops/prometheus/alerts.yml");
        let config = format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
             rule_files:\n  - {}\n\
             scrape_configs:\n  - job_name: narrator\n    static_configs:\n      - targets: [{}]\n",
            rules.display(),
            targets
                .iter()
                .map(|t| format!("'{t}'"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        let config_path = dir.path().join("prometheus.yml");
        std::fs::write(&config_path, config).expect("write prometheus.yml");
        let port = free_port();
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config_path.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("prometheus.log")).expect("log file"))
            .spawn()
            .expect(
                "Debian's `prometheus` must be installed for this test (ops/test.sh installs it)",
            );
        let p = Self {
            child,
            _dir: dir,
            port,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while http_get(&format!("http://127.0.0.1:{port}/-/ready")).0 != 200 {
            assert!(
                Instant::now() < deadline,
                "prometheus not ready: {}",
                p.log()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        p
    }

    /// Its log.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self._dir.path().join("prometheus.log")).unwrap_or_default()
    }

    /// The result vector of an instant query (`data.result`); panics on a query error.
    pub fn query(&self, expr: &str) -> Vec<serde_json::Value> {
        let mut r = agent()
            .get(&format!("http://127.0.0.1:{}/api/v1/query", self.port))
            .query("query", expr)
            .call()
            .expect("query prometheus");
        let body = r.body_mut().read_to_string().expect("body");
        let v: serde_json::Value = serde_json::from_str(&body).expect("JSON");
        assert_eq!(v["status"], "success", "{expr}: {body}");
        v["data"]["result"].as_array().cloned().unwrap_or_default()
    }

    /// The single value of an instant query, if it has one.
    pub fn value(&self, expr: &str) -> Option<f64> {
        let result = self.query(expr);
        let first = result.first()?;
        first["value"][1].as_str()?.parse().ok()
    }

    /// The alert rules Prometheus loaded (names).
    pub fn rule_names(&self) -> Vec<String> {
        let (_, body) = http_get(&format!("http://127.0.0.1:{}/api/v1/rules", self.port));
        let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
        v["data"]["groups"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
            .filter_map(|r| r["name"].as_str().map(str::to_string))
            .collect()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
