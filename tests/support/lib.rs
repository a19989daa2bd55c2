//! The test support every whole-system suite shares: a [`World`] per test (a fresh
//! Postgres database, a private RabbitMQ vhost, the S3 test server, `narrator` processes
//! run as a user would), book texts, and [`check_job`], the checker every fault test ends
//! with. `bash ops/test.sh` starts the services and sets the environment.
//!
//! The services are the real ones: Postgres at `NARRATOR_DATABASE_URL`/`DATABASE_URL`'s
//! server (each World makes its own database and drops it), RabbitMQ at 127.0.0.1:5672
//! (each World makes its own vhost with `rabbitmqctl`, so no test sees another's
//! messages), and the S3 server at `NARRATOR_S3_ENDPOINT`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use lapin::options::QueueDeclareOptions;
use lapin::types::FieldTable;
use narrator_db::{JobState, PgPool, Uuid};
use narrator_s3::{S3AudioStore, S3Config};

pub use narrator_db;

#[cfg(test)]
mod doc_links;
pub mod http;
pub mod media;
pub mod otlp;
pub mod prometheus;
pub mod tls;

/// The voice every suite uses (shipped by `ops/setup.sh`).
pub const VOICE: &str = "en_US-joe-medium";

/// One World at a time per test process under `cargo test`: tests share the two CPU
/// cores, and timings in the worker (heartbeats, leases) must not starve. Under
/// `ops/test.sh` (cargo-nextest, a process per test) `.config/nextest.toml`'s `world`
/// group allows two at once.
static SERIAL: Mutex<()> = Mutex::new(());

/// With `NARRATOR_TEST_LOG` set (a tracing filter, e.g. `narrator_worker=debug`), what the
/// libraries running inside a test process log goes to stderr, with times: what to read
/// when an in-process test (a worker through its seams) fails.
fn log_in_process() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    let Ok(filter) = std::env::var("NARRATOR_TEST_LOG") else {
        return;
    };
    ONCE.call_once(|| {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_writer(std::io::stderr)
            .try_init();
    });
}

/// The repository root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("repository root")
        .to_path_buf()
}

/// The `narrator` binary of this build: `target/<profile>/narrator`, beside the test
/// executable's `deps/` folder (cargo builds it for the workspace's tests).
pub fn narrator_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("NARRATOR_BIN") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("test executable");
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile>");
    let bin = profile_dir.join("narrator");
    assert!(
        bin.exists(),
        "{} is missing: build it first (`cargo build -p narrator`; `cargo test --workspace` does)",
        bin.display()
    );
    bin
}

/// The calibration cache the tests' `narrator` processes share (`NARRATOR_CACHE_DIR`):
/// `target/<profile>/narrator-test-cache`, beside the test executables, so the suite
/// never leaves calibrations in `.deps/cache`, where a user's `narrator run` would then
/// read them (a few seconds' measurement instead of a real one, or of the default).
pub fn test_cache_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable");
    exe.parent()
        .and_then(Path::parent)
        .expect("target/<profile>")
        .join("narrator-test-cache")
}

/// Points `c` at the repository's `.deps` (voices, runtimes, espeak-ng data) and at the
/// suite's own calibration cache ([`test_cache_dir`]).
pub fn use_test_data(c: &mut Command) -> &mut Command {
    c.env("NARRATOR_DATA_DIR", root().join(".deps"))
        .env("NARRATOR_CACHE_DIR", test_cache_dir())
}

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_string())
}

/// The Postgres server's admin URL (a database is created per World on it).
pub fn admin_url() -> String {
    std::env::var("NARRATOR_DATABASE_URL")
        .or_else(|_| std::env::var("DATABASE_URL"))
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into())
}

/// The shared server, database `name`.
pub fn database_url(name: &str) -> String {
    database_url_on(&admin_url(), name)
}

/// The server of `admin`, database `name`.
pub fn database_url_on(admin: &str, name: &str) -> String {
    match admin.rfind('/') {
        Some(i) if admin[..i].contains("://") && admin[i..].len() > 1 => {
            format!("{}/{name}", &admin[..i])
        }
        _ => panic!("cannot derive a database URL from {admin}"),
    }
}

/// Where a World's services are.
#[derive(Debug, Clone)]
pub struct Services {
    /// A Postgres admin URL (databases are created on its server).
    pub admin_url: String,
    /// The RabbitMQ node (`rabbitmqctl -n`); `None`: the default node.
    pub rabbit_node: Option<String>,
    /// Its AMQP port.
    pub amqp_port: u16,
}

impl Services {
    /// The shared services of the machine (Postgres of `DATABASE_URL`, RabbitMQ 5672).
    pub fn shared() -> Self {
        Self {
            admin_url: admin_url(),
            rabbit_node: None,
            amqp_port: 5672,
        }
    }

    fn rabbitmqctl(&self, args: &[&str]) -> String {
        let mut all: Vec<&str> = Vec::new();
        if let Some(node) = &self.rabbit_node {
            all.extend(["-n", node.as_str()]);
        }
        all.extend_from_slice(args);
        rabbitmqctl(&all)
    }
}

fn rabbitmqctl(args: &[&str]) -> String {
    let out = Command::new("rabbitmqctl")
        .args(args)
        .output()
        .expect("rabbitmqctl (the broker's own CLI) must be runnable for the system tests");
    assert!(
        out.status.success(),
        "rabbitmqctl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// Creates the empty database `name` on the server of `admin`.
pub async fn create_database(admin: &str, name: &str) {
    let admin_pool = narrator_db::connect(admin).await.expect("admin database");
    sqlx::query(&format!("CREATE DATABASE {name}"))
        .execute(&admin_pool)
        .await
        .expect("create database");
    admin_pool.close().await;
}

/// A fresh database on the shared server (DATABASE_URL) with narrator's schema, for a
/// test of the data layer; dropped, with its connections, when this is, also after a
/// failed assertion.
pub struct TestDb {
    /// Its pool.
    pub pool: PgPool,
    admin: String,
    name: String,
}

impl TestDb {
    pub async fn new() -> Self {
        let admin = admin_url();
        let name = format!("narrator_db_{}", Uuid::new_v4().simple());
        create_database(&admin, &name).await;
        let pool = narrator_db::connect(&database_url_on(&admin, &name))
            .await
            .expect("test database");
        narrator_db::migrate(&pool)
            .await
            .expect("migrate the test database");
        Self { pool, admin, name }
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let (admin, name) = (self.admin.clone(), self.name.clone());
        // Dropped inside the test's runtime, which cannot block: a thread of its own.
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async {
                if let Ok(p) = narrator_db::connect(&admin).await {
                    let drop = format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)");
                    let _ = sqlx::query(&drop).execute(&p).await;
                }
            });
        })
        .join();
    }
}

/// The S3 settings of the test server.
pub fn s3_config() -> S3Config {
    S3Config {
        endpoint: std::env::var("NARRATOR_S3_ENDPOINT").ok(),
        bucket: env_or("NARRATOR_S3_BUCKET", "narrator"),
        ..Default::default()
    }
}

/// A segment row: (index, state, attempts, failure kind, failure reason).
pub type SegmentRow = (i32, String, i32, Option<String>, Option<String>);

/// Postgres' cumulative counters of one database (pg_stat_database).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DbCounts {
    /// Transactions committed and rolled back.
    pub transactions: i64,
    /// Rows inserted.
    pub inserted: i64,
    /// Rows updated.
    pub updated: i64,
    /// Rows deleted.
    pub deleted: i64,
    /// Rows read by sequential scans and index scans (before filters).
    pub returned: i64,
    /// Rows fetched from the table by index scans.
    pub fetched: i64,
}

impl std::ops::Sub for DbCounts {
    type Output = Self;
    fn sub(self, o: Self) -> Self {
        Self {
            transactions: self.transactions - o.transactions,
            inserted: self.inserted - o.inserted,
            updated: self.updated - o.updated,
            deleted: self.deleted - o.deleted,
            returned: self.returned - o.returned,
            fetched: self.fetched - o.fetched,
        }
    }
}

/// One test's world: its database, its broker vhost, its worker processes, a folder.
pub struct World {
    /// A runtime for the test's own service calls.
    pub rt: tokio::runtime::Runtime,
    /// Its database's URL.
    pub db_url: String,
    db_names: Vec<String>,
    /// Its database.
    pub pool: PgPool,
    /// Its broker vhost's URL.
    pub amqp_url: String,
    vhost: String,
    /// Worker processes started with [`World::worker`].
    pub workers: Vec<Child>,
    /// A temporary folder (books, logs).
    pub tmp: tempfile::TempDir,
    /// The S3 server and bucket of this world's commands and checks (the shared test
    /// server unless a test points it at its own with [`World::use_s3_endpoint`]).
    s3_endpoint: Option<String>,
    services: Services,
    _serial: std::sync::MutexGuard<'static, ()>,
}

impl World {
    /// A fresh database (migrated with `narrator migrate`) and a fresh vhost on the
    /// shared services.
    pub fn new() -> Self {
        Self::on(Services::shared())
    }

    /// The same on other servers (a private Postgres or RabbitMQ node of a fault test).
    pub fn on(services: Services) -> Self {
        let serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        log_in_process();
        assert!(
            std::env::var("NARRATOR_S3_ENDPOINT").is_ok(),
            "NARRATOR_S3_ENDPOINT is not set: run `bash ops/s3-server.sh start` and \
             `eval \"$(bash ops/s3-server.sh env)\"` (bash ops/test.sh does both)"
        );
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let vhost = format!("narrator-test-{}", Uuid::new_v4().simple());
        services.rabbitmqctl(&["-q", "add_vhost", &vhost]);
        services.rabbitmqctl(&[
            "-q",
            "set_permissions",
            "-p",
            &vhost,
            "guest",
            ".*",
            ".*",
            ".*",
        ]);
        let amqp_url = format!(
            "amqp://guest:guest@127.0.0.1:{}/{vhost}",
            services.amqp_port
        );
        let db_name = format!("narrator_sys_{}", Uuid::new_v4().simple());
        let db_url = database_url_on(&services.admin_url, &db_name);
        let pool = rt.block_on(async {
            create_database(&services.admin_url, &db_name).await;
            narrator_db::connect(&db_url).await.expect("test database")
        });
        let world = Self {
            rt,
            db_url,
            db_names: vec![db_name],
            pool,
            amqp_url,
            vhost,
            workers: Vec::new(),
            tmp: tempfile::tempdir().expect("tmp"),
            s3_endpoint: std::env::var("NARRATOR_S3_ENDPOINT").ok(),
            services,
            _serial: serial,
        };
        let out = world.ok(&["migrate"]);
        assert!(String::from_utf8_lossy(&out.stdout).contains("up to date"));
        world
    }

    /// Another fresh, migrated database on the same server (another cluster): its URL.
    pub fn other_database(&mut self) -> String {
        let name = format!("narrator_sys_{}", Uuid::new_v4().simple());
        self.rt
            .block_on(create_database(&self.services.admin_url, &name));
        self.db_names.push(name.clone());
        let url = database_url_on(&self.services.admin_url, &name);
        let out = self
            .cmd()
            .env("NARRATOR_DATABASE_URL", &url)
            .arg("migrate")
            .output()
            .expect("migrate");
        assert!(out.status.success(), "migrate the other database");
        url
    }

    /// Commands, workers and checks from now on use the S3 server at `endpoint` (same
    /// bucket name and test credentials).
    pub fn use_s3_endpoint(&mut self, endpoint: &str) {
        self.s3_endpoint = Some(endpoint.to_string());
    }

    /// `narrator` with this world's services and data folder, and no test hooks.
    pub fn cmd(&self) -> Command {
        let mut c = Command::new(narrator_bin());
        // The CPU build (tests/gpu.rs sets NARRATOR_ORT_BUILD=auto for the CUDA build's
        // fallback on this GPU-less machine).
        use_test_data(&mut c)
            .env("NARRATOR_ORT_BUILD", "cpu")
            .env("NARRATOR_DATABASE_URL", &self.db_url)
            .env("NARRATOR_AMQP_URL", &self.amqp_url)
            .envs(self.s3_endpoint.iter().map(|e| ("NARRATOR_S3_ENDPOINT", e)))
            .env_remove("NARRATOR_TEST_FAIL_TEXT")
            .env_remove("NARRATOR_TEST_FAIL_ONCE")
            .env_remove("NARRATOR_TEST_CRASH_AFTER_COMMIT")
            .env_remove("NARRATOR_TEST_ABORT_TEXT")
            .env_remove("NARRATOR_VOICE");
        c
    }

    /// Runs `narrator ARGS`, which must succeed.
    pub fn ok(&self, args: &[&str]) -> Output {
        let out = self.cmd().args(args).output().expect("spawn narrator");
        assert!(
            out.status.success(),
            "narrator {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }

    /// Runs `narrator ARGS`, which must fail with exactly one line on stderr and no
    /// panic; returns that line.
    pub fn err(&self, args: &[&str]) -> String {
        let out = self.cmd().args(args).output().expect("spawn narrator");
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(!out.status.success(), "{args:?} should fail: {err}");
        assert!(!err.contains("panicked"), "panic: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
        err
    }

    /// Starts a worker (`--id ID --heartbeat 1`, log level info, stderr to a file) with
    /// `env` and waits for its "ready" line; returns its index in [`World::workers`].
    pub fn worker(&mut self, id: &str, args: &[&str], env: &[(&str, &str)]) -> usize {
        let i = self.spawn_worker(id, args, env);
        // Loading and warming a voice takes seconds alone, and a minute or more while the
        // other tests of the suite load theirs on the same two cores.
        let deadline = Instant::now() + Duration::from_secs(180);
        loop {
            let text = self.worker_log(id);
            // The worker's own line, not a log line such as "engine ready".
            if text.contains(&format!("worker {id} ready")) {
                return i;
            }
            if let Ok(Some(status)) = self.workers[i].try_wait() {
                panic!("worker {id} exited with {status}: {text}");
            }
            assert!(Instant::now() < deadline, "worker {id} not ready: {text}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Starts a worker without waiting for it.
    pub fn spawn_worker(&mut self, id: &str, args: &[&str], env: &[(&str, &str)]) -> usize {
        let log = self.log_path(id);
        // Appending: a worker restarted under the same id keeps one log.
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .expect("log");
        let mut c = self.cmd();
        c.args(["--log", "info", "worker", "--id", id, "--heartbeat", "1"])
            .args(args)
            .stdout(Stdio::null())
            .stderr(file);
        for (k, v) in env {
            c.env(k, v);
        }
        self.workers.push(c.spawn().expect("spawn worker"));
        self.workers.len() - 1
    }

    fn log_path(&self, id: &str) -> PathBuf {
        self.tmp
            .path()
            .join(format!("{}.log", id.replace([':', '/'], "_")))
    }

    /// Every worker's log (the tail of each), for a failure message.
    pub fn logs(&self) -> String {
        let mut out = String::new();
        let mut entries: Vec<_> = std::fs::read_dir(self.tmp.path())
            .map(|d| d.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        entries.sort();
        for p in entries
            .into_iter()
            .filter(|p| p.extension().is_some_and(|e| e == "log"))
        {
            let text = std::fs::read_to_string(&p).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(40).collect();
            out.push_str(&format!("--- {} (last lines)\n", p.display()));
            for l in tail.into_iter().rev() {
                out.push_str(l);
                out.push('\n');
            }
        }
        out
    }

    /// What worker `id` wrote to stderr so far.
    pub fn worker_log(&self, id: &str) -> String {
        std::fs::read_to_string(self.log_path(id)).unwrap_or_default()
    }

    /// Writes a book file into the world's folder.
    pub fn book(&self, name: &str, text: &str) -> PathBuf {
        let p = self.tmp.path().join(name);
        std::fs::write(&p, text).expect("book");
        p
    }

    /// `narrator submit BOOK --json EXTRA...`: the job id.
    pub fn submit(&self, book: &Path, extra: &[&str]) -> Uuid {
        self.submit_with(book, extra, &[])
    }

    /// [`World::submit`] with `env` set (telemetry settings, say).
    pub fn submit_with(&self, book: &Path, extra: &[&str], env: &[(&str, String)]) -> Uuid {
        let v = self.submit_json(book, extra, env);
        v["job_id"].as_str().expect("job_id").parse().expect("uuid")
    }

    /// `narrator submit BOOK --json EXTRA` with `env`: its JSON line.
    pub fn submit_json(
        &self,
        book: &Path,
        extra: &[&str],
        env: &[(&str, String)],
    ) -> serde_json::Value {
        let mut args = vec!["submit", book.to_str().expect("utf8"), "--json"];
        args.extend_from_slice(extra);
        let out = self
            .cmd()
            .args(&args)
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .output()
            .expect("spawn narrator");
        assert!(
            out.status.success(),
            "narrator {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let line = String::from_utf8_lossy(&out.stdout).to_string();
        serde_json::from_str(line.trim()).expect("submit JSON")
    }

    /// `narrator status JOB --json`.
    pub fn status(&self, job: Uuid) -> serde_json::Value {
        let out = self.ok(&["status", &job.to_string(), "--json"]);
        serde_json::from_slice(&out.stdout).expect("status JSON")
    }

    /// The job's state.
    pub fn state(&self, job: Uuid) -> JobState {
        self.rt
            .block_on(narrator_db::job_state(&self.pool, job))
            .expect("job_state")
            .expect("job exists")
    }

    /// Waits until the job is in `want`, at most `within`.
    pub fn wait_state(&self, job: Uuid, want: JobState, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let state = self.state(job);
            if state == want {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "job {job} is {state:?}, wanted {want:?}; status: {}\n{}",
                self.status(job),
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Segments of the job recorded done.
    pub fn done_count(&self, job: Uuid) -> u32 {
        self.rt
            .block_on(narrator_db::job_status(&self.pool, job))
            .expect("status")
            .expect("job")
            .summary
            .segments_done
    }

    /// The job's segments: (index, state, attempts, failure kind, failure reason), by index.
    pub fn segment_rows(&self, job: Uuid) -> Vec<SegmentRow> {
        self.rt
            .block_on(
                sqlx::query_as(
                    "SELECT idx, state, attempts, failure_kind, failure_reason FROM segments \
                     WHERE job_id = $1 ORDER BY idx",
                )
                .bind(job)
                .fetch_all(&self.pool),
            )
            .expect("segments")
    }

    /// Postgres' counters of this world's database (pg_stat_database: what every session
    /// on it did since it was created) once they stop moving: sessions publish their
    /// counts when they end or idle, so stop the world's workers (and close
    /// [`World::pool`]) first. Read from the admin database: a session on this one would
    /// count its own reading.
    pub fn settled_db_counts(&self) -> DbCounts {
        let admin = self.services.admin_url.clone();
        let name = self.db_names[0].clone();
        self.rt.block_on(async move {
            let pool = narrator_db::connect(&admin).await.expect("admin database");
            let read = || async {
                let row: (i64, i64, i64, i64, i64, i64) = sqlx::query_as(
                    "SELECT xact_commit + xact_rollback, tup_inserted, tup_updated, tup_deleted, \
                       tup_returned, tup_fetched FROM pg_stat_database WHERE datname = $1",
                )
                .bind(&name)
                .fetch_one(&pool)
                .await
                .expect("pg_stat_database");
                DbCounts {
                    transactions: row.0,
                    inserted: row.1,
                    updated: row.2,
                    deleted: row.3,
                    returned: row.4,
                    fetched: row.5,
                }
            };
            let mut last = read().await;
            for _ in 0..30 {
                tokio::time::sleep(Duration::from_secs(1)).await;
                let now = read().await;
                if now == last {
                    break;
                }
                last = now;
            }
            pool.close().await;
            last
        })
    }

    /// A connection to this world's vhost.
    pub fn broker(&self) -> lapin::Connection {
        self.rt
            .block_on(narrator_broker::connect(&self.amqp_url))
            .expect("amqp")
    }

    /// Ready messages in `queue` of this world's vhost.
    pub fn queue_ready(&self, queue: &str) -> u32 {
        self.rt.block_on(async {
            let conn = narrator_broker::connect(&self.amqp_url)
                .await
                .expect("amqp");
            let ch = conn.create_channel().await.expect("channel");
            let q = ch
                .queue_declare(
                    queue.into(),
                    QueueDeclareOptions {
                        passive: true,
                        ..Default::default()
                    },
                    FieldTable::default(),
                )
                .await
                .expect("passive declare");
            let _ = conn.close(200, "ok".into()).await;
            q.message_count()
        })
    }

    /// Runs the Python producer example (`examples/producers/request.py`, with pika)
    /// against this world's broker: `book` as the request's text, `args` its other
    /// flags. Returns its exit status and the reply it printed (`null` without one).
    pub fn request(&self, book: &Path, args: &[&str]) -> (i32, serde_json::Value) {
        let mut python = Command::new(clients_python());
        python.arg(root().join("examples/producers/request.py"));
        self.run_request(python, book, args)
    }

    /// [`World::request`] with the Node producer example
    /// (`examples/producers/node/request.mjs`, with amqplib).
    pub fn request_node(&self, book: &Path, args: &[&str]) -> (i32, serde_json::Value) {
        self.run_request(node_example("request.mjs"), book, args)
    }

    /// Runs a producer example's request script (`script`: its interpreter and path)
    /// with this world's broker, `book` and `args`.
    fn run_request(
        &self,
        mut script: Command,
        book: &Path,
        args: &[&str],
    ) -> (i32, serde_json::Value) {
        let out = script
            .arg(&self.amqp_url)
            .arg(book)
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("run {script:?}: {e}"));
        let stdout = String::from_utf8_lossy(&out.stdout);
        let reply = stdout
            .lines()
            .last()
            .and_then(|l| serde_json::from_str(l).ok())
            .unwrap_or(serde_json::Value::Null);
        assert!(
            out.status.code().is_some_and(|c| c < 2),
            "no reply: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            self.logs()
        );
        (out.status.code().unwrap_or(-1), reply)
    }

    /// Starts the Python events listener (`examples/producers/events.py`, pika) on this
    /// world's broker, its queue bound to `narrator.events`, until `until_done` (a job id
    /// or `any`) ends; returns once the queue is bound.
    pub fn listen_events(&self, until_done: &str) -> EventListener {
        let mut python = Command::new(clients_python());
        python.arg(root().join("examples/producers/events.py"));
        self.listen_with(python, until_done)
    }

    /// [`World::listen_events`] with the Node listener
    /// (`examples/producers/node/events.mjs`, with amqplib).
    pub fn listen_events_node(&self, until_done: &str) -> EventListener {
        self.listen_with(node_example("events.mjs"), until_done)
    }

    /// Starts a producer example's events script (`script`: its interpreter and path) on
    /// this world's broker; returns once it printed `{"ready": true}`.
    fn listen_with(&self, mut script: Command, until_done: &str) -> EventListener {
        let mut child = script
            .arg(&self.amqp_url)
            .args(["--until-done", until_done, "--timeout", "240"])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("run {script:?}: {e}"));
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
            {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        let ready = rx
            .recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|_| panic!("{script:?} bound its queue"));
        // As JSON: Python's json.dumps writes `{"ready": true}`, JSON.stringify `{"ready":true}`.
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&ready).ok(),
            Some(serde_json::json!({"ready": true})),
            "{script:?} printed {ready}"
        );
        EventListener { child, lines: rx }
    }

    /// `rabbitmqctl list_channels` of this vhost: (prefetch, unacknowledged) of each
    /// channel that consumes.
    pub fn consumer_holdings(&self) -> Vec<(u64, u64)> {
        self.services
            .rabbitmqctl(&[
                "-q",
                "--no-table-headers",
                // list_channels lists every vhost's channels (it takes no -p): this
                // world's are picked by their vhost column.
                "list_channels",
                "vhost",
                "prefetch_count",
                "messages_unacknowledged",
                "consumer_count",
            ])
            .lines()
            .filter_map(|l| {
                let (vhost, counts) = l.split_once(char::is_whitespace)?;
                let n: Vec<u64> = counts
                    .split_whitespace()
                    .filter_map(|x| x.parse().ok())
                    .collect();
                (vhost == self.vhost && n.len() == 3 && n[2] > 0).then(|| (n[0], n[1]))
            })
            .collect()
    }

    /// This world's bucket.
    pub fn store(&self) -> S3AudioStore {
        let config = S3Config {
            endpoint: self.s3_endpoint.clone(),
            ..s3_config()
        };
        self.rt.block_on(S3AudioStore::connect(config)).expect("s3")
    }

    /// An object's bytes.
    pub fn s3_get(&self, key: &str) -> Vec<u8> {
        let store = self.store();
        self.rt.block_on(store.get_bytes(key)).expect("s3 get")
    }

    /// The job's manifest.json.
    pub fn manifest(&self, job: Uuid) -> serde_json::Value {
        let key = output_key(&self.status(job), "manifest");
        serde_json::from_slice(&self.s3_get(&key)).expect("manifest JSON")
    }

    /// Sends SIGTERM (`signal` 15) or SIGKILL (9) to worker `i` and waits for it.
    pub fn stop(&mut self, i: usize, signal: i32) -> ExitStatus {
        let pid = self.workers[i].id();
        let sig = if signal == 9 { "-KILL" } else { "-TERM" };
        let _ = Command::new("kill").args([sig, &pid.to_string()]).status();
        self.wait_exit(i, Duration::from_secs(60))
    }

    /// Waits until worker `i` exits, at most `within`.
    pub fn wait_exit(&mut self, i: usize, within: Duration) -> ExitStatus {
        let deadline = Instant::now() + within;
        loop {
            if let Ok(Some(s)) = self.workers[i].try_wait() {
                return s;
            }
            assert!(Instant::now() < deadline, "worker {i} did not exit");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Default for World {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for World {
    fn drop(&mut self) {
        for w in &mut self.workers {
            let _ = w.kill();
            let _ = w.wait();
        }
        let pool = self.pool.clone();
        let names = self.db_names.clone();
        let admin = self.services.admin_url.clone();
        self.rt.block_on(async move {
            pool.close().await;
            if let Ok(p) = narrator_db::connect(&admin).await {
                for name in names {
                    let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                        .execute(&p)
                        .await;
                }
            }
        });
        let mut c = Command::new("rabbitmqctl");
        if let Some(node) = &self.services.rabbit_node {
            c.args(["-n", node]);
        }
        let _ = c.args(["-q", "delete_vhost", &self.vhost]).output();
    }
}

/// A Markdown book of `chapters` chapters of `sentences` distinct sentences each; with
/// `extra = Some((n, text))` the n-th sentence (from 1) is `text`.
/// The events listener of [`World::listen_events`] (Python) or
/// [`World::listen_events_node`] (Node).
pub struct EventListener {
    child: Child,
    lines: std::sync::mpsc::Receiver<String>,
}

impl EventListener {
    /// Waits for the listener to end (its job done or failed) and returns the events it
    /// printed.
    pub fn events(mut self, within: Duration) -> Vec<serde_json::Value> {
        let deadline = Instant::now() + within;
        let mut events = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => events.push(serde_json::from_str(&line).expect("an event as JSON")),
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                    let _ = self.child.kill();
                    panic!("the events listener did not finish within {within:?}; got {events:?}");
                }
            }
        }
        let status = self.child.wait().expect("the events listener");
        assert!(
            status.success(),
            "the events listener: {status}; got {events:?}"
        );
        events
    }
}

/// The Python of the producers' clients (`.deps/clients-venv`: pika, jsonschema; made by
/// `bash ops/setup.sh --test`).
pub fn clients_python() -> PathBuf {
    let python = root().join(".deps/clients-venv/bin/python");
    assert!(
        python.exists(),
        "{} is missing: run `bash ops/setup.sh --test` (bash ops/test.sh does)",
        python.display()
    );
    python
}

/// The Node producer example's `node_modules` (`.deps/clients-node`: amqplib as
/// `examples/producers/node/package-lock.json` pins it; made by `bash ops/setup.sh --test`).
pub fn clients_node() -> PathBuf {
    let dir = root().join(".deps/clients-node");
    assert!(
        dir.join("node_modules/amqplib/package.json").exists(),
        "{} has no amqplib: run `bash ops/setup.sh --test` (bash ops/test.sh does)",
        dir.display()
    );
    dir
}

/// `node` running the Node producer example's `script` (`examples/producers/node/`)
/// through its link in [`clients_node`]: ESM resolves `import "amqplib"` from the
/// script's folder (NODE_PATH is ignored), and `--preserve-symlinks-main` makes that
/// folder the link's, beside `.deps/clients-node/node_modules`.
fn node_example(script: &str) -> Command {
    let link = clients_node().join(script);
    assert!(
        link.exists(),
        "{} is missing: run `bash ops/setup.sh --test` (it links examples/producers/node/*.mjs)",
        link.display()
    );
    let mut node = Command::new("node");
    node.arg("--preserve-symlinks-main").arg(link);
    node
}

/// Checks `value` against the JSON Schema `docs/schema/NAME` with Python's `jsonschema`
/// (a validator no one here wrote); panics with its message when it does not hold.
pub fn assert_schema(name: &str, value: &serde_json::Value) {
    let out = Command::new(clients_python())
        .args([
            "-c",
            "import json, sys, jsonschema\n\
             schema = json.load(open(sys.argv[1]))\n\
             jsonschema.Draft202012Validator.check_schema(schema)\n\
             jsonschema.validate(json.loads(sys.argv[2]), schema,\n\
                 format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)",
        ])
        .arg(root().join("docs/schema").join(name))
        .arg(value.to_string())
        .output()
        .expect("python jsonschema");
    assert!(
        out.status.success(),
        "{value} does not follow {name}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

pub fn book_text(chapters: usize, sentences: usize, extra: Option<(usize, &str)>) -> String {
    let mut s = String::from("# A Test of the Distributed Mode\n\n");
    let mut n = 0;
    for c in 1..=chapters {
        s.push_str(&format!("## Chapter {c}\n\n"));
        for i in 0..sentences {
            n += 1;
            match extra {
                Some((at, text)) if at == n => s.push_str(&format!("{text} ")),
                _ => s.push_str(&format!(
                    "Sentence number {n} of chapter {c} is here, line {i}. "
                )),
            }
            if i % 3 == 2 {
                s.push_str("\n\n");
            }
        }
        s.push_str("\n\n");
    }
    s
}

/// The S3 key of a job's output of `kind` (book, manifest, ...), from its status JSON.
pub fn output_key(status: &serde_json::Value, kind: &str) -> String {
    status["outputs"]
        .as_array()
        .expect("outputs")
        .iter()
        .find(|o| o["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind} output: {status}"))["key"]
        .as_str()
        .expect("key")
        .to_string()
}

/// The segment indices a manifest lists, in its order.
pub fn indices(manifest: &serde_json::Value) -> Vec<u64> {
    manifest["segments"]
        .as_array()
        .expect("segments")
        .iter()
        .map(|s| s["index"].as_u64().expect("index"))
        .collect()
}

/// The checker every fault test ends with, for a job submitted with `--format wav`:
/// - it ended `done`;
/// - the manifest lists every segment exactly once, in order;
/// - every recorded figure agrees with the audio the record points at (sample count and
///   rate), read back from S3 — read before the intermediates are deleted, so the test
///   passes `--keep-intermediates` to its workers only when it says so, else the
///   figures are checked against the book;
/// - the whole book is the segments' audio at the manifest's places, exactly, with only
///   silence (the pauses) between them;
/// - no intermediate object (segment audio, packs) is left once done, unless kept.
pub fn check_job(w: &World, job: Uuid, kept_intermediates: bool) {
    assert_eq!(w.state(job), JobState::Done, "status: {}", w.status(job));
    let manifest = w.manifest(job);
    let total =
        w.rt.block_on(narrator_db::job_status(&w.pool, job))
            .expect("status")
            .expect("job")
            .summary
            .segments_total;
    let listed = indices(&manifest);
    assert_eq!(
        listed,
        (0..u64::from(total)).collect::<Vec<_>>(),
        "every segment once, in order"
    );
    let records =
        w.rt.block_on(narrator_db::finished_segments(&w.pool, job))
            .expect("records");
    assert_eq!(records.len(), total as usize);
    let status = w.status(job);
    let book_key = output_key(&status, "book");
    assert!(
        book_key.ends_with(".wav"),
        "the checker needs --format wav: {book_key}"
    );
    let (rate, book) =
        narrator_audio::decode_wav_bytes(&w.s3_get(&book_key)).expect("the book is a WAV");
    let store = w.store();
    let mut covered = vec![false; book.len()];
    for (entry, record) in manifest["segments"]
        .as_array()
        .expect("segments")
        .iter()
        .zip(&records)
    {
        assert_eq!(record.sample_rate, rate, "segment {}", record.index);
        let start =
            (entry["start_seconds"].as_f64().expect("start") * f64::from(rate)).round() as usize;
        let n = record.samples as usize;
        assert!(
            start + n <= book.len(),
            "segment {} ends past the book",
            record.index
        );
        let secs = entry["seconds"].as_f64().expect("seconds");
        assert!(
            (secs - record.samples as f64 / f64::from(rate)).abs() < 1e-3,
            "segment {}: manifest {secs} s, record {} samples",
            record.index,
            record.samples
        );
        if kept_intermediates {
            // The stored audio the record points at has exactly the recorded samples,
            // and it is what the book holds.
            let packed = record.packed.as_ref().expect("S3 segments are packed");
            let pack = w.rt.block_on(store.get_bytes(&packed.key)).expect("pack");
            let wav = &pack[packed.offset as usize..(packed.offset + packed.len) as usize];
            let (r, samples) = narrator_audio::decode_wav_bytes(wav).expect("segment WAV");
            assert_eq!((r, samples.len()), (rate, n), "segment {}", record.index);
            assert_eq!(
                &book[start..start + n],
                &samples[..],
                "segment {} in the book",
                record.index
            );
        }
        covered[start..start + n].iter_mut().for_each(|c| *c = true);
    }
    let noisy_gaps = book
        .iter()
        .zip(&covered)
        .filter(|(s, c)| !**c && **s != 0)
        .count();
    assert_eq!(noisy_gaps, 0, "only silence between segments");
    let speech: usize = records.iter().map(|r| r.samples as usize).sum();
    assert_eq!(
        covered.iter().filter(|c| **c).count(),
        speech,
        "segments do not overlap and all are in the book"
    );
    let left: usize = store
        .intermediate_prefixes(&job.to_string())
        .iter()
        .map(|p| w.rt.block_on(store.list(p)).expect("list").len())
        .sum();
    if kept_intermediates {
        assert!(left > 0, "intermediates kept");
    } else {
        assert_eq!(left, 0, "no intermediate object left once done");
    }
}

/// Runs `cmd`, which must succeed; returns stdout.
fn run_ok(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).to_string()
}

fn wait_port(port: u16, up: bool, within: Duration) {
    let deadline = Instant::now() + within;
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() != up {
        assert!(
            Instant::now() < deadline,
            "port {port} did not go {}",
            if up { "up" } else { "down" }
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A private RabbitMQ node: its own node name, AMQP port, distribution port, data and
/// log folders and no plugins, started and stopped by the test (the shared broker on
/// 5672 is untouched). Stopped and deleted on drop.
pub struct PrivateRabbit {
    /// The node name (`rabbitmqctl -n NODE`).
    pub node: String,
    /// Its AMQP port.
    pub port: u16,
    dir: tempfile::TempDir,
}

impl PrivateRabbit {
    /// Starts a node listening on `port` (distribution on `port + 20000`).
    pub fn start(port: u16) -> Self {
        Self::start_with(port, None, None)
    }

    /// A node whose `consumer_timeout` is `timeout` (RabbitMQ's default is 30 minutes):
    /// a channel holding a delivery unacknowledged for longer is closed by the broker and
    /// its deliveries go back to their queues. The channels check it every 5 s (their
    /// tick, `channel_tick_interval`, is 60 s by default), so it fires within 5 s of
    /// `timeout` rather than within a minute.
    pub fn start_with_consumer_timeout(port: u16, timeout: Duration) -> Self {
        Self::start_with(port, None, Some(timeout))
    }

    /// A node listening on `port` for AMQP and on `tls_port` for AMQPS with the
    /// [`tls::TestPki`] server certificate (no client certificates asked).
    pub fn start_tls(port: u16, tls_port: u16, pki: &tls::TestPki) -> Self {
        Self::start_with(port, Some((tls_port, pki)), None)
    }

    fn start_with(
        port: u16,
        tls: Option<(u16, &tls::TestPki)>,
        consumer_timeout: Option<Duration>,
    ) -> Self {
        let dir = tempfile::tempdir().expect("rabbit dir");
        std::fs::write(dir.path().join("enabled_plugins"), "[].\n").expect("plugins");
        let mut conf = String::new();
        if let Some((tls_port, pki)) = tls {
            let (cert, key) = pki.copy_server_files(dir.path());
            conf = format!(
                "listeners.ssl.default = {tls_port}\nssl_options.cacertfile = {}\n\
                 ssl_options.certfile = {}\nssl_options.keyfile = {}\n\
                 ssl_options.verify = verify_none\nssl_options.fail_if_no_peer_cert = false\n",
                dir.path().join("ca.pem").display(),
                cert.display(),
                key.display()
            );
        }
        if let Some(timeout) = consumer_timeout {
            conf.push_str(&format!("consumer_timeout = {}\n", timeout.as_millis()));
            std::fs::write(
                dir.path().join("advanced.config"),
                "[{rabbit, [{channel_tick_interval, 5000}]}].\n",
            )
            .expect("advanced.config");
        }
        std::fs::write(dir.path().join("rabbitmq.conf"), conf).expect("rabbitmq.conf");
        // Run as root, Debian's rabbitmq-server switches to the rabbitmq user.
        give_to("rabbitmq", dir.path());
        let node = format!("narrator-test-{port}@localhost");
        let rabbit = Self { node, port, dir };
        run_ok(
            rabbit
                .env(&mut Command::new("rabbitmq-server"))
                .arg("-detached"),
        );
        // The node registers a moment after -detached returns.
        let deadline = Instant::now() + Duration::from_secs(60);
        while !Command::new("rabbitmqctl")
            .args(["-q", "-n", &rabbit.node, "await_startup", "--timeout", "60"])
            .output()
            .is_ok_and(|o| o.status.success())
        {
            assert!(
                Instant::now() < deadline,
                "RabbitMQ node {} did not start",
                rabbit.node
            );
            std::thread::sleep(Duration::from_millis(500));
        }
        wait_port(port, true, Duration::from_secs(30));
        rabbit
    }

    fn env<'a>(&self, c: &'a mut Command) -> &'a mut Command {
        let d = self.dir.path();
        c.env("RABBITMQ_NODENAME", &self.node)
            .env("RABBITMQ_NODE_PORT", self.port.to_string())
            .env(
                "RABBITMQ_DIST_PORT",
                (u32::from(self.port) + 20000).to_string(),
            )
            .env("RABBITMQ_MNESIA_BASE", d.join("mnesia"))
            .env("RABBITMQ_LOG_BASE", d.join("log"))
            .env("RABBITMQ_PID_FILE", d.join("pid"))
            .env("RABBITMQ_ENABLED_PLUGINS_FILE", d.join("enabled_plugins"))
            .env("RABBITMQ_CONFIG_FILE", d.join("rabbitmq.conf"))
            // Written only for settings rabbitmq.conf has no key for.
            .env("RABBITMQ_ADVANCED_CONFIG_FILE", d.join("advanced.config"))
            .stdin(Stdio::null())
    }

    /// `amqp://guest:guest@127.0.0.1:PORT/%2f`
    pub fn url(&self) -> String {
        format!("amqp://guest:guest@127.0.0.1:{}/%2f", self.port)
    }

    /// `rabbitmqctl stop_app`: the broker stops serving (connections dropped), as in an
    /// upgrade; the node stays up.
    pub fn stop_app(&self) {
        run_ok(Command::new("rabbitmqctl").args(["-q", "-n", &self.node, "stop_app"]));
        wait_port(self.port, false, Duration::from_secs(30));
    }

    /// `rabbitmqctl start_app`.
    pub fn start_app(&self) {
        run_ok(Command::new("rabbitmqctl").args(["-q", "-n", &self.node, "start_app"]));
        run_ok(Command::new("rabbitmqctl").args([
            "-n",
            &self.node,
            "await_startup",
            "--timeout",
            "60",
        ]));
        wait_port(self.port, true, Duration::from_secs(30));
    }
}

impl Drop for PrivateRabbit {
    fn drop(&mut self) {
        let _ = Command::new("rabbitmqctl")
            .args(["-q", "-n", &self.node, "stop"])
            .output();
    }
}

/// A private Postgres cluster: `initdb` in a temporary folder (run as the `postgres`
/// user when the test runs as root, as Postgres refuses root), its own port, started,
/// stopped and restarted by the test. Stopped and deleted on drop.
pub struct PrivatePostgres {
    /// Its port.
    pub port: u16,
    listen: &'static str,
    dir: tempfile::TempDir,
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

/// When running as root: `dir` belongs to `user` (a server that runs as that user
/// writes there).
fn give_to(user: &str, dir: &Path) {
    if is_root() {
        run_ok(
            Command::new("chown")
                .args(["-R", &format!("{user}:{user}")])
                .arg(dir),
        );
    }
}

fn as_postgres(program: &str) -> Command {
    let program = postgres_program(program);
    if is_root() {
        let mut c = Command::new("runuser");
        c.arg("-u").arg("postgres").arg("--").arg(program);
        c
    } else {
        Command::new(program)
    }
}

/// `initdb` or `pg_ctl`: on PATH where it is, else in Debian's versioned folder
/// (`/usr/lib/postgresql/<newest>/bin`, where the `postgresql` package puts them without
/// a link on PATH).
fn postgres_program(program: &str) -> PathBuf {
    let on_path = std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|d| d.join(program).is_file()));
    if on_path {
        return PathBuf::from(program);
    }
    let newest = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .max();
    match newest {
        Some(v) => Path::new("/usr/lib/postgresql")
            .join(v.to_string())
            .join("bin")
            .join(program),
        None => PathBuf::from(program),
    }
}

impl PrivatePostgres {
    /// A new cluster on `port`, started, with trust authentication on 127.0.0.1.
    pub fn start(port: u16) -> Self {
        let pg = Self::init(port, "127.0.0.1");
        pg.up();
        pg
    }

    fn init(port: u16, listen: &'static str) -> Self {
        let dir = tempfile::tempdir().expect("pg dir");
        let data = dir.path().join("data");
        give_to("postgres", dir.path());
        run_ok(
            as_postgres("initdb")
                .args(["-A", "trust", "-U", "postgres", "--no-sync", "-D"])
                .arg(&data),
        );
        Self { port, listen, dir }
    }

    /// A new cluster on `port` with TLS (the [`tls::TestPki`] server certificate),
    /// listening on 127.0.0.1 and on 127.0.0.2 (a loopback address the certificate does
    /// not name). The role `narrator_tls` may log in over TLS only; `postgres` either way
    /// (the tests' own admin connections).
    pub fn start_tls(port: u16, pki: &tls::TestPki) -> Self {
        let pg = Self::init(port, "127.0.0.1,127.0.0.2");
        let (cert, key) = pki.copy_server_files(pg.dir.path());
        give_to("postgres", pg.dir.path());
        let conf = pg.data().join("postgresql.conf");
        let mut text = std::fs::read_to_string(&conf).expect("postgresql.conf");
        text.push_str(&format!(
            "\nssl = on\nssl_cert_file = '{}'\nssl_key_file = '{}'\n",
            cert.display(),
            key.display()
        ));
        std::fs::write(&conf, text).expect("postgresql.conf");
        std::fs::write(
            pg.data().join("pg_hba.conf"),
            "local all all trust\nhostnossl all narrator_tls 127.0.0.0/8 reject\n\
             host all all 127.0.0.0/8 trust\n",
        )
        .expect("pg_hba.conf");
        pg.up();
        run_ok(
            as_postgres("psql")
                .arg("-h")
                .arg(pg.dir.path())
                .args(["-p", &pg.port.to_string(), "-U", "postgres", "-qc"])
                .arg("CREATE ROLE narrator_tls LOGIN SUPERUSER"),
        );
        pg
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// `postgres://postgres@127.0.0.1:PORT/postgres`
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// Starts the server.
    pub fn up(&self) {
        let opts = format!(
            "-p {} -k {} -c listen_addresses={}",
            self.port,
            self.dir.path().display(),
            self.listen
        );
        run_ok(
            as_postgres("pg_ctl")
                .args(["-w", "-t", "60", "-D"])
                .arg(self.data())
                .args(["-o", &opts, "-l"])
                .arg(self.dir.path().join("log"))
                .arg("start"),
        );
    }

    /// Stops the server (fast shutdown: sessions are cut, as in a failover).
    pub fn down(&self) {
        run_ok(
            as_postgres("pg_ctl")
                .args(["-w", "-D"])
                .arg(self.data())
                .args(["-m", "fast", "stop"]),
        );
    }
}

impl Drop for PrivatePostgres {
    fn drop(&mut self) {
        let _ = as_postgres("pg_ctl")
            .args(["-w", "-D"])
            .arg(self.data())
            .args(["-m", "immediate", "stop"])
            .output();
    }
}

/// Waits until `check` holds, at most `within`; `what` names it in the failure.
pub fn eventually(within: Duration, what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A private S3 server (s3s-fs) on its own port and data folder, stopped and started by
/// the test; the shared one is untouched.
pub struct PrivateS3 {
    port: u16,
    data: tempfile::TempDir,
    child: Option<Child>,
}

impl PrivateS3 {
    /// Starts one on `port` with an empty bucket `narrator`.
    pub fn start(port: u16) -> Self {
        let data = tempfile::tempdir().expect("s3 data");
        std::fs::create_dir_all(data.path().join("narrator")).expect("bucket");
        let mut s = Self {
            port,
            data,
            child: None,
        };
        s.up();
        s
    }

    /// Its URL.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Starts it (again), on the same data.
    pub fn up(&mut self) {
        // Another process on the port (a server a killed test run left behind) would
        // answer in its place, and freezing this one would freeze nothing.
        assert!(
            std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err(),
            "port {} is taken: stop the process listening there (an s3s-fs a killed test \
             run left behind: `pkill -f 's3s-fs.*--port {}'`)",
            self.port,
            self.port
        );
        let bin = root().join(".deps/s3/s3s-fs/bin/s3s-fs");
        let child = Command::new(&bin)
            .args(["--host", "127.0.0.1", "--port", &self.port.to_string()])
            .args([
                "--access-key",
                "narrator",
                "--secret-key",
                "narrator-secret",
            ])
            .arg(self.data.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("{}: {e} (run bash ops/setup.sh)", bin.display()));
        self.child = Some(child);
        eventually(Duration::from_secs(10), "s3s-fs answers", || {
            std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok()
        });
    }

    /// Freezes it (SIGSTOP): connections are accepted, requests hang, as with a wedged
    /// store, until [`PrivateS3::resume`].
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// Thaws it (SIGCONT).
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, which: &str) {
        let child = self.child.as_ref().expect("s3s-fs is up");
        let ok = Command::new("kill")
            .args([which, &child.id().to_string()])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill {which} s3s-fs");
    }

    /// Stops it (kill): the store is away until [`PrivateS3::up`].
    pub fn down(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for PrivateS3 {
    fn drop(&mut self) {
        self.down();
    }
}

/// A `narrator serve` process on a free loopback port (real voice, CPU), killed when
/// dropped; its stderr kept for failure messages.
pub struct Served {
    child: Child,
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    log: std::sync::Arc<Mutex<String>>,
    /// Its `--data` folder, when the test gave none (removed with it).
    _data: Option<tempfile::TempDir>,
}

impl Served {
    /// Starts `narrator serve --listen 127.0.0.1:0 ARGS` (with a `--data` folder of its
    /// own unless ARGS name one) and waits (up to 180 s) for the address it prints.
    pub fn start(args: &[&str]) -> Self {
        let mut command = Command::new(narrator_bin());
        use_test_data(&mut command)
            .env("NARRATOR_ORT_BUILD", "cpu")
            .env_remove("NARRATOR_VOICE");
        Self::spawn(command, args)
    }

    /// The same with `world`'s services and data folder (for `--fleet`).
    pub fn in_world(world: &World, args: &[&str]) -> Self {
        Self::spawn(world.cmd(), args)
    }

    fn spawn(mut command: Command, args: &[&str]) -> Self {
        let data = (!args.contains(&"--data")).then(|| tempfile::tempdir().expect("tempdir"));
        command.args(["serve", "--listen", "127.0.0.1:0"]);
        if let Some(d) = &data {
            command.arg("--data").arg(d.path());
        }
        let mut child = command
            .args(args)
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn narrator serve");
        let stderr = child.stderr.take().expect("stderr");
        let log = std::sync::Arc::new(Mutex::new(String::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let kept = log.clone();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(stderr)
                .lines()
                .map_while(Result::ok)
            {
                if let Some(url) = line.split("listening on ").nth(1) {
                    let _ = tx.send(url.trim().to_string());
                }
                let mut log = kept.lock().unwrap_or_else(|p| p.into_inner());
                log.push_str(&line);
                log.push('\n');
            }
        });
        let url = rx
            .recv_timeout(Duration::from_secs(180))
            .unwrap_or_else(|_| {
                let _ = child.kill();
                panic!(
                    "narrator serve printed no address: {}",
                    log.lock().unwrap_or_else(|p| p.into_inner())
                )
            });
        Served {
            child,
            url,
            log,
            _data: data,
        }
    }

    /// Kills it at once (SIGKILL: nothing is saved on the way out).
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// What it wrote to stderr so far.
    pub fn log(&self) -> String {
        self.log.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
