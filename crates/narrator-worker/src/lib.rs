//! narrator's distributed worker, as a library: `narrator worker` parses its flags, loads
//! the engines and hands them here in a [`WorkerConfig`]; [`Worker::start`] connects and
//! starts every loop, [`Worker::run_until`] runs them until a shutdown signal (or a loop
//! fails) and drains.
//!
//! Per voice (and device) a RabbitMQ consumer feeds the pipeline's worker loop, which
//! stores audio in S3 and records figures in Postgres before each ack. Around it:
//! - [`guard`]: deliveries that need no work (redelivered, cancelled, unknown) are settled
//!   before any work; a message of another cluster stops the worker untouched;
//! - [`state`]: recording, and telling the assembler when a job's last segment is in;
//! - [`assembler`]: exactly one worker builds a finished job's outputs; a dead
//!   assembler's job is taken over (by process instance, not by a reusable name);
//!   transient failures are retried with backoff;
//! - [`dispatcher`]: each running job keeps a window of segments published, topped up
//!   after each recording, so books share the queue (fair share);
//! - [`reconciler`]: the outbox (windows no recording tops up: a producer that died, a
//!   window that grew with the fleet) and the stuck-job watchdog (jobs without progress for a lease get their missing segments
//!   published again);
//! - [`heartbeat`]: the worker's row in `workers`, with its plan and figures.
//!
//! Failures carry their retry class in their type ([`narrator_core::RetryClass`]): an
//! outage of a service is postponed without charging the segment an attempt.

pub mod assembler;
pub mod dispatcher;
pub mod events;
pub mod gauges;
pub mod guard;
pub mod heartbeat;
pub mod intake;
pub mod liveness;
pub mod outage;
pub mod publish;
pub mod reconciler;
pub mod request;
pub mod state;
pub mod submit;

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use narrator_broker::{BrokerError, Consumer, Publisher};
use narrator_db::{DbError, PgPool, Uuid};
use narrator_pipeline::{Event, RunOptions, Stages, Synthesizer, work};
use narrator_s3::S3AudioStore;
use narrator_telemetry::serve::Health;
use tokio::sync::{mpsc, watch};

pub use publish::{dispatch, first_window, fleet_share, publish_segments, window_of};
pub use submit::{Submission, Submitted, Submitter, retry_job};

/// One voice on one device, loaded and planned by the caller.
pub struct VoiceEngine {
    /// The voice (its queue is `narrator.segments.<voice>`).
    pub voice: String,
    /// Phonemizer + engine, with its budget.
    pub synth: Synthesizer,
    /// The plan as JSON (shown in the worker's row).
    pub plan: serde_json::Value,
    /// Unacknowledged messages held for this engine.
    pub prefetch: u16,
    /// Batches in synthesis at once.
    pub in_flight: usize,
}

/// Everything a worker runs with.
pub struct WorkerConfig {
    /// Name in the workers table and in segment figures (e.g. `host:1`; may be reused by
    /// a restarted process).
    pub id: String,
    /// Host name.
    pub host: String,
    /// Engine kind shown in the plan (`onnx`, `null`).
    pub engine: String,
    /// The engines, one per voice and device.
    pub voices: Vec<VoiceEngine>,
    /// The database (migrated).
    pub pool: PgPool,
    /// The bucket.
    pub store: S3AudioStore,
    /// RabbitMQ URL (connected with automatic recovery).
    pub amqp_url: String,
    /// CA certificates (PEM) trusted for `amqps://` besides the system's store.
    pub amqp_ca_file: Option<std::path::PathBuf>,
    /// Device shown when no engine says (normally the first engine's).
    pub device: String,
    /// The hardware profile (JSON) for the worker's row.
    pub hardware: serde_json::Value,
    /// Most segments of one job stored and recorded together.
    pub pack_max: usize,
    /// The outbox reconciler republishes segments unpublished for this long.
    pub reconcile_after: Duration,
    /// Between heartbeats; an assembly whose claimer missed 6 is taken over.
    pub heartbeat: Duration,
    /// A job without progress for this long gets its missing segments published again.
    pub lease: Duration,
    /// Keep a finished job's segment audio and packs (for debugging) instead of
    /// deleting them once its outputs are stored.
    pub keep_intermediates: bool,
    /// How long the broker connection may stay down (lapin reconnecting) before the
    /// worker gives up and fails, for its supervisor to restart it.
    pub broker_timeout: Duration,
    /// How long a segment may be postponed for outages (from its first postponement)
    /// before it fails with the outage as its reason.
    pub postpone_budget: Duration,
    /// Work in progress is wedged past this (a batch: past 10 × the engine's mean batch
    /// and at least this; an assembly: this plus a tenth of the book's audio time): the
    /// worker fails `/healthz` and stops ([`liveness`]).
    pub wedged_after: Duration,
    /// Liveness and readiness for `/healthz` and `/readyz`: the worker keeps the
    /// `broker` and `database` checks and the `heartbeat` and `broker watch` loops (the
    /// caller sets `engines` once they are warm).
    pub health: Arc<Health>,
    /// Sample the gauges of `/metrics` (queue depths, jobs, GPUs) every 5 s.
    pub gauges: bool,
    /// A delivery waiting for the device this long goes ahead of younger ones of the
    /// high lane (default [`narrator_pipeline::batcher::MAX_HOLD`], 5 minutes): a
    /// priority flood never holds normal-lane deliveries up to the broker's
    /// `consumer_timeout`.
    pub max_hold: Duration,
    /// Serve the producers' intake (`narrator.intake`, [`intake`]) with these settings;
    /// `None`: this worker takes no requests (`--no-intake`).
    pub intake: Option<intake::IntakeConfig>,
}

/// A worker's failure.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// The broker could not be used.
    #[error(transparent)]
    Broker(#[from] BrokerError),
    /// The database could not be used.
    #[error(transparent)]
    Db(#[from] DbError),
    /// A voice's loop ended with an error.
    #[error("worker loop for voice {voice}: {source}")]
    Loop {
        /// The voice.
        voice: String,
        /// The cause.
        #[source]
        source: narrator_pipeline::PipelineError,
    },
    /// A loop panicked.
    #[error("worker loop panicked: {0}")]
    Panicked(String),
    /// Work in progress ran past its limit (a wedged engine, phonemizer or encoder).
    #[error(
        "{reason}; the worker stops so that its supervisor restarts it (its deliveries go \
         back to the queue): check the device and the engine"
    )]
    Wedged {
        /// What ran for how long, and its limit.
        reason: String,
    },
    /// The broker connection was lost and not recovered in time.
    #[error(
        "lost the connection to RabbitMQ and could not reconnect within {} s ({state}); \
         the worker stops so that its supervisor restarts it: check the broker",
        .waited.as_secs()
    )]
    BrokerLost {
        /// How long it waited.
        waited: Duration,
        /// The connection's last state.
        state: String,
    },
}

impl WorkerError {
    /// How a failure of this kind is retried: the broker's and the database's say;
    /// the worker's own (a loop, a wedge, a lost connection) are outages of this process.
    pub fn retry_class(&self) -> narrator_core::RetryClass {
        match self {
            Self::Broker(e) => e.retry_class(),
            Self::Db(e) => e.retry_class(),
            _ => narrator_core::RetryClass::Infrastructure,
        }
    }
}

/// What a worker did, once stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Summary {
    /// Segments it recorded done.
    pub segments_done: u64,
}

/// A started worker: its loops run; [`Worker::run_until`] waits for them.
pub struct Worker {
    id: String,
    broker_timeout: Duration,
    pool: PgPool,
    conn: lapin::Connection,
    stop_tx: watch::Sender<bool>,
    loops: tokio::task::JoinSet<Result<(), WorkerError>>,
    services: tokio::task::JoinSet<()>,
    describe: Arc<heartbeat::Describe>,
    done: Arc<AtomicU64>,
    health: Arc<Health>,
    wedge: Arc<liveness::Wedge>,
}

/// What every engine loop of a worker shares (and the services after them).
struct EngineShared {
    pool: PgPool,
    store: S3AudioStore,
    cluster: String,
    id: String,
    instance: Uuid,
    every: Duration,
    stop: watch::Receiver<bool>,
    complete_tx: mpsc::UnboundedSender<Uuid>,
    done: Arc<AtomicU64>,
    outages: Arc<outage::Outages>,
    dispatcher: Arc<dispatcher::Dispatcher>,
}

/// The services' settings, from the worker's configuration and its engine loops.
struct ServiceSettings {
    describe: Arc<heartbeat::Describe>,
    watched: Vec<(String, Arc<Synthesizer>)>,
    voices: Vec<String>,
    rates: std::collections::HashMap<String, u32>,
    health: Arc<Health>,
    wedge: Arc<liveness::Wedge>,
    gauges: bool,
    lease: Duration,
    reconcile_after: Duration,
    wedged_after: Duration,
    keep_intermediates: bool,
}

/// Writes the worker's row before anything is consumed: it names this process
/// (`instance`), so claims and engine marks of a predecessor under the same id are told
/// from ours.
async fn register(config: &WorkerConfig, instance: Uuid) -> Result<(), WorkerError> {
    let first = narrator_db::WorkerInfo {
        id: config.id.clone(),
        host: config.host.clone(),
        device: config.device.clone(),
        hardware: config.hardware.clone(),
        plan: serde_json::Value::Array(Vec::new()),
        instance: Some(instance),
        stale_after: Some(config.heartbeat * 6),
    };
    narrator_db::heartbeat(&config.pool, &first, 0).await?;
    Ok(())
}

/// Declares the queues of the voices served (each once); returns their names.
async fn declare_queues(
    conn: &lapin::Connection,
    voices: &[VoiceEngine],
) -> Result<Vec<String>, WorkerError> {
    let channel = open_channel(conn).await?;
    let mut names: Vec<String> = Vec::new();
    for v in voices {
        if !names.contains(&v.voice) {
            narrator_broker::declare(&channel, &v.voice).await?;
            names.push(v.voice.clone());
        }
    }
    Ok(names)
}

/// A new channel on `conn`.
pub(crate) async fn open_channel(conn: &lapin::Connection) -> Result<lapin::Channel, WorkerError> {
    Ok(conn.create_channel().await.map_err(|e| BrokerError::Amqp {
        op: "channel.open".into(),
        source: e,
    })?)
}

impl Worker {
    /// Connects to the broker, declares the voices' queues, reads the cluster id and
    /// starts every loop: per engine a consumer and the pipeline
    /// ([`Worker::spawn_engine_loop`]), then the services
    /// ([`Worker::spawn_services`]): heartbeat, gauges, the reconciler (outbox and stuck
    /// jobs) and the assembler.
    pub async fn start(config: WorkerConfig) -> Result<Self, WorkerError> {
        let health = config.health.clone();
        let wedge = liveness::Wedge::new(health.clone());
        health.set("broker", false, "connecting");
        health.set("database", false, "connecting");
        let instance = Uuid::new_v4();
        let pool = config.pool.clone();
        let cluster = narrator_db::cluster_id(&pool).await?.to_string();
        let every = config.heartbeat;
        register(&config, instance).await?;
        let conn = narrator_broker::connect_with(
            &config.amqp_url,
            &format!("narrator-worker {}", config.id),
            config.amqp_ca_file.as_deref(),
        )
        .await?;
        let names = declare_queues(&conn, &config.voices).await?;
        let (stop_tx, stop) = watch::channel(false);
        let (complete_tx, complete_rx) = mpsc::unbounded_channel();
        let dispatcher = Arc::new(dispatcher::Dispatcher::new(
            pool.clone(),
            Publisher::new(&conn).await?,
            cluster.clone(),
            every * 6,
        ));
        let shared = EngineShared {
            pool: pool.clone(),
            store: config.store.clone(),
            cluster,
            id: config.id.clone(),
            instance,
            every,
            stop,
            complete_tx,
            done: Arc::new(AtomicU64::new(0)),
            outages: Arc::new(outage::Outages::new()),
            dispatcher,
        };
        let mut loops = tokio::task::JoinSet::new();
        let mut reports = Vec::new();
        let mut watched = Vec::new();
        // Each served voice's output rate, as its loaded voice says: what the assembler
        // makes its jobs' outputs at.
        let rates: std::collections::HashMap<String, u32> = config
            .voices
            .iter()
            .map(|v| (v.voice.clone(), v.synth.sample_rate()))
            .collect();
        let WorkerConfig {
            voices,
            engine,
            pack_max,
            postpone_budget,
            max_hold,
            ..
        } = config;
        for v in voices {
            let report = Self::spawn_engine_loop(
                &shared,
                &conn,
                v,
                (&engine, pack_max, postpone_budget, max_hold),
                &mut loops,
            )
            .await?;
            watched.push((report.voice.clone(), report.synth.clone()));
            reports.push(report);
        }
        let describe = Arc::new(heartbeat::Describe {
            id: config.id.clone(),
            host: config.host,
            device: config.device,
            hardware: config.hardware,
            instance,
            stale_after: every * 6,
            reports,
            outages: shared.outages.clone(),
            wedge: wedge.clone(),
            last: std::sync::Mutex::new(None),
        });
        health.set("broker", true, format!("consuming {}", names.join(", ")));
        health.set("database", true, "reachable");
        let mut services = Self::spawn_services(
            &shared,
            &conn,
            ServiceSettings {
                describe: describe.clone(),
                watched,
                voices: names,
                rates,
                health: health.clone(),
                wedge: wedge.clone(),
                gauges: config.gauges,
                lease: config.lease,
                reconcile_after: config.reconcile_after,
                wedged_after: config.wedged_after,
                keep_intermediates: config.keep_intermediates,
            },
            complete_rx,
        )
        .await?;
        if let Some(config) = config.intake.clone() {
            Self::spawn_intake(&shared, &conn, config, &mut services).await?;
        }
        Ok(Self {
            id: config.id,
            broker_timeout: config.broker_timeout,
            pool,
            conn,
            stop_tx,
            loops,
            services,
            describe,
            done: shared.done,
            health,
            wedge,
        })
    }

    /// One served voice: its consumer, the guarded queue over it, and the pipeline's
    /// worker loop in `loops` (prefetched deliveries go back to the queue when it ends).
    /// Returns what the heartbeat reports of it.
    async fn spawn_engine_loop(
        shared: &EngineShared,
        conn: &lapin::Connection,
        v: VoiceEngine,
        (engine, pack_max, postpone_budget, max_hold): (&str, usize, Duration, Duration),
        loops: &mut tokio::task::JoinSet<Result<(), WorkerError>>,
    ) -> Result<heartbeat::Report, WorkerError> {
        let name = v.voice.clone();
        let synth = Arc::new(v.synth);
        let consumer = Consumer::start(conn, &name, v.prefetch)
            .await?
            .for_cluster(shared.cluster.clone())
            .with_postpone_budget(postpone_budget);
        let report = heartbeat::Report {
            voice: name.clone(),
            engine: engine.to_string(),
            prefetch: v.prefetch,
            base: v.plan,
            synth: synth.clone(),
            held: consumer.held_counter(),
            held_high: consumer.held_high_counter(),
        };
        let queue = Arc::new(
            guard::GuardedQueue::new(
                consumer,
                shared.pool.clone(),
                shared.stop.clone(),
                shared.id.clone(),
                shared.outages.clone(),
                (shared.instance, shared.every * 6),
            )
            .with_dispatcher(shared.dispatcher.clone(), name.clone()),
        );
        let stages = Stages {
            synth,
            store: Arc::new(shared.store.clone()),
            state: Arc::new(state::ClusterState::new(
                shared.pool.clone(),
                shared.complete_tx.clone(),
                shared.done.clone(),
                (shared.dispatcher.clone(), name.clone()),
            )),
            on_event: Arc::new(|e| {
                if let Event::Warning(w) = e {
                    tracing::warn!("{w}");
                }
            }),
        };
        let opts = RunOptions {
            worker: shared.id.clone(),
            in_flight: v.in_flight,
            isolate_failures: true,
            stop: Some(shared.stop.clone()),
            // Segments are checked in Postgres when delivered; only those that then
            // waited (a full device, a long max_wait) are checked again.
            recheck_after: Duration::from_secs(1),
            pack_max,
            voice: name.clone(),
            max_hold,
        };
        loops.spawn(async move {
            let result = work(queue.clone(), &stages, &opts).await;
            // Deliveries prefetched but not started go back to the queue.
            let _ = queue.close().await;
            result.map(|_| ()).map_err(|source| WorkerError::Loop {
                voice: name,
                source,
            })
        });
        Ok(report)
    }

    /// The producers' intake: `config.prefetch` consumers, each an [`intake::Intake`] on
    /// channels of its own serving one request at a time, until the worker stops; a
    /// consumer that ends otherwise (its channel closed) is started again with backoff,
    /// and the worker goes on with its segments meanwhile.
    async fn spawn_intake(
        shared: &EngineShared,
        conn: &lapin::Connection,
        config: intake::IntakeConfig,
        services: &mut tokio::task::JoinSet<()>,
    ) -> Result<(), WorkerError> {
        // Declared with the services' (spawn_services).
        for _ in 0..config.prefetch.max(1) {
            let channel = open_channel(conn).await?;
            let intake = intake::Intake::new(
                shared.pool.clone(),
                conn,
                shared.store.clone(),
                config.clone(),
            )
            .await?;
            let stop = shared.stop.clone();
            services.spawn(async move {
                // The channel recovers with the connection (a broker restart); the
                // consumer is registered again after any end that is not the worker's stop.
                let mut pause = Duration::from_secs(1);
                loop {
                    match intake.serve(channel.clone(), stop.clone()).await {
                        Ok(()) if *stop.borrow() => return,
                        Ok(()) => tracing::warn!("the intake's consumer ended; consuming again"),
                        Err(e) => {
                            tracing::warn!(error = %e, "the intake stopped; consuming again")
                        }
                    }
                    tokio::time::sleep(jittered(pause)).await;
                    pause = (pause * 2).min(Duration::from_secs(30));
                }
            });
        }
        Ok(())
    }

    /// The worker's services beside its engine loops: the engines' wedge watch, the
    /// heartbeat, the gauges (when asked), the reconciler, the assembler and the events'
    /// publisher (with the producers' topology declared).
    async fn spawn_services(
        shared: &EngineShared,
        conn: &lapin::Connection,
        s: ServiceSettings,
        complete_rx: mpsc::UnboundedReceiver<Uuid>,
    ) -> Result<tokio::task::JoinSet<()>, WorkerError> {
        let every = shared.every;
        // A heartbeat may wait for the database's statement timeout before it fails.
        s.health
            .expect_loop("heartbeat", every * 3 + Duration::from_secs(130));
        s.health
            .expect_loop("broker watch", Duration::from_secs(30));
        let mut services = tokio::task::JoinSet::new();
        services.spawn(liveness::watch_engines(
            s.watched,
            s.wedged_after,
            s.wedge.clone(),
            shared.stop.clone(),
        ));
        services.spawn(heartbeat::heartbeat(
            shared.pool.clone(),
            s.describe.clone(),
            shared.done.clone(),
            (every, s.health.clone()),
            shared.stop.clone(),
        ));
        if s.gauges {
            services.spawn(gauges::gauges(
                gauges::Gauges {
                    pool: shared.pool.clone(),
                    channel: open_channel(conn).await?,
                    describe: s.describe,
                    lease: s.lease,
                },
                shared.stop.clone(),
            ));
        }
        services.spawn(reconciler::reconciler(
            reconciler::Reconciler {
                pool: shared.pool.clone(),
                publisher: Publisher::new(conn).await?,
                channel: open_channel(conn).await?,
                cluster: shared.cluster.clone(),
                dispatcher: shared.dispatcher.clone(),
                voices: s.voices,
                unpublished_after: s.reconcile_after,
                lease: s.lease,
                heartbeat: every,
                suspected: std::collections::BTreeMap::new(),
            },
            shared.stop.clone(),
        ));
        services.spawn(assembler::assembler(
            assembler::Assembler {
                pool: shared.pool.clone(),
                store: shared.store.clone(),
                worker: shared.id.clone(),
                instance: shared.instance,
                stale: every * 6,
                keep_intermediates: s.keep_intermediates,
                release_after: s.lease,
                wedge: s.wedge,
                wedged_after: s.wedged_after,
                rates: s.rates,
            },
            complete_rx,
            shared.stop.clone(),
        ));
        // The jobs' events (docs/PRODUCERS.md): every worker publishes the outbox.
        let channel = open_channel(conn).await?;
        narrator_broker::declare_intake(&channel).await?;
        let _ = channel.close(200, "declared".into()).await;
        services.spawn(events::publish_events(
            events::EventPublisher {
                pool: shared.pool.clone(),
                publisher: Publisher::new(conn).await?,
                store: shared.store.clone(),
                cluster: shared.cluster.clone(),
            },
            shared.stop.clone(),
        ));
        Ok(services)
    }

    /// The worker's id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Runs until `shutdown` completes or a loop ends, then drains: no new batch starts,
    /// the batches in flight are finished (stored, recorded, acknowledged), prefetched
    /// deliveries go back to the queue. The first loop error is returned.
    pub async fn run_until(
        mut self,
        shutdown: impl Future<Output = ()>,
    ) -> Result<Summary, WorkerError> {
        let mut failure = None;
        tokio::select! {
            _ = shutdown => {
                tracing::info!(worker = %self.id, "stopping after the batches in flight");
            }
            Some(r) = self.loops.join_next() => {
                failure = loop_failure(r);
            }
            lost = broker_lost(&self.conn, self.broker_timeout, &self.health) => {
                failure = Some(lost);
            }
            reason = self.wedge.wait() => {
                failure = Some(WorkerError::Wedged { reason });
            }
        }
        self.health
            .set("stopping", false, "draining the batches in flight");
        let _ = self.stop_tx.send(true);
        // Without a broker the loops cannot settle what they hold: give them a bounded
        // time (the broker redelivers whatever was not acknowledged).
        // A wedged loop never drains either.
        let broker_gone = matches!(
            failure,
            Some(WorkerError::BrokerLost { .. } | WorkerError::Wedged { .. })
        );
        let (loops, services) = (&mut self.loops, &mut self.services);
        let drain = async {
            let mut later = None;
            while let Some(r) = loops.join_next().await {
                later = later.or(loop_failure(r));
            }
            while services.join_next().await.is_some() {}
            later
        };
        let later = if broker_gone {
            tokio::time::timeout(DRAIN_WITHOUT_BROKER, drain)
                .await
                .unwrap_or_default()
        } else {
            drain.await
        };
        self.loops.abort_all();
        self.services.abort_all();
        let failure = failure.or(later);
        let done = self.done.load(Ordering::Relaxed);
        let _ = narrator_db::heartbeat(&self.pool, &self.describe.info(), done).await;
        let _ = tokio::time::timeout(
            Duration::from_secs(5),
            self.conn.close(200, "worker stopped".into()),
        )
        .await;
        match failure {
            Some(e) => Err(e),
            None => Ok(Summary {
                segments_done: done,
            }),
        }
    }
}

/// How long a worker that lost its broker waits for its loops before it exits.
const DRAIN_WITHOUT_BROKER: Duration = Duration::from_secs(10);

/// Resolves once the connection has not been connected for `timeout` (lapin reconnects
/// with backoff meanwhile), or at once when lapin gave up.
async fn broker_lost(conn: &lapin::Connection, timeout: Duration, health: &Health) -> WorkerError {
    let mut down_since: Option<std::time::Instant> = None;
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    loop {
        tick.tick().await;
        health.tick("broker watch");
        let status = conn.status();
        health.set(
            "broker",
            status.connected(),
            if status.connected() {
                "consuming"
            } else {
                "connection lost; reconnecting"
            },
        );
        if status.connected() {
            if let Some(since) = down_since.take() {
                tracing::warn!(
                    seconds = since.elapsed().as_secs_f64(),
                    "RabbitMQ connection recovered"
                );
            }
            continue;
        }
        let since = *down_since.get_or_insert_with(|| {
            tracing::warn!(
                timeout_s = timeout.as_secs(),
                "RabbitMQ connection lost; reconnecting"
            );
            std::time::Instant::now()
        });
        let gave_up = status.closed() || status.errored();
        if gave_up || since.elapsed() >= timeout {
            return WorkerError::BrokerLost {
                waited: since.elapsed(),
                state: if gave_up {
                    "reconnection attempts exhausted".into()
                } else {
                    "still reconnecting".into()
                },
            };
        }
    }
}

fn loop_failure(r: Result<Result<(), WorkerError>, tokio::task::JoinError>) -> Option<WorkerError> {
    match r {
        Ok(Ok(())) => None,
        Ok(Err(e)) => Some(e),
        Err(e) => Some(WorkerError::Panicked(e.to_string())),
    }
}

/// A delay of about `base`, spread by ±20 % so that workers that failed together do
/// not retry together.
pub fn jittered(base: Duration) -> Duration {
    base.mul_f64(0.8 + 0.4 * fastrand::f64())
}

/// Backoff for the `attempt`-th retry (from 1): 5 s doubling up to 5 minutes, jittered.
pub fn backoff(attempt: u32) -> Duration {
    let secs = 5u64
        .saturating_mul(1 << attempt.saturating_sub(1).min(6))
        .min(300);
    jittered(Duration::from_secs(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_five_minutes_with_jitter() {
        for (attempt, base) in [(1, 5.0), (2, 10.0), (3, 20.0), (7, 300.0), (40, 300.0)] {
            for _ in 0..50 {
                let d = backoff(attempt).as_secs_f64();
                assert!(
                    (base * 0.8..=base * 1.2).contains(&d),
                    "attempt {attempt}: {d} s"
                );
            }
        }
        let spread: std::collections::HashSet<u128> =
            (0..20).map(|_| backoff(1).as_millis()).collect();
        assert!(spread.len() > 1, "jitter spreads the delays");
    }
}
