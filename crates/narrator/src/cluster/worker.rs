//! `narrator worker`: per voice, a RabbitMQ consumer feeds the pipeline's worker loop,
//! which stores audio in S3 and records figures in Postgres before each ack. Around it:
//! a guard that skips redelivered, cancelled and unknown segments before any work, the
//! failure path (retry tiers, dead letters with the reason in the database), a heartbeat,
//! the outbox reconciler, and the assembler (exactly one worker builds a finished job's
//! outputs; a dead assembler's job is taken over).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::Context;
use narrator_audio::{AudioFormat, Pauses};
use narrator_broker::{Consumer, Decision, MAX_ATTEMPTS, Publisher, failure_decision};
use narrator_core::{Delivery, SeamError, SegmentQueue, SegmentRecord, StateStore};
use narrator_db::{Output, PgPool, SegmentCheck, Uuid, WorkerInfo};
use narrator_pipeline::{AssembleOptions, Event, RunOptions, Stages, assemble, work};
use narrator_s3::S3AudioStore;
use tokio::sync::{mpsc, watch};

use crate::cli::WorkerArgs;
use crate::cluster::{self, submit::publish_segments};
use crate::engine;
use crate::paths::Paths;

/// The consumer behind a check: deliveries that need no work are settled here.
struct GuardedQueue {
    inner: Consumer,
    pool: PgPool,
    stop: watch::Receiver<bool>,
    worker: String,
    /// Checked deliveries that need work, in delivery order.
    ready: tokio::sync::Mutex<std::collections::VecDeque<Delivery<GuardTicket>>>,
}

/// A delivery's ticket with what the failure path needs.
struct GuardTicket {
    job: Uuid,
    index: u32,
    attempt: u32,
    inner: narrator_broker::Ticket,
}

/// Most deliveries checked with one database query: everything the broker has already
/// sent, up to this many, is checked at once.
const CHECK_GROUP: usize = 64;

impl GuardedQueue {
    async fn next_inner(&self) -> Result<Option<Delivery<GuardTicket>>, SeamError> {
        let mut ready = self.ready.lock().await;
        loop {
            if let Some(d) = ready.pop_front() {
                return Ok(Some(d));
            }
            let group = self.inner.next_deliveries(CHECK_GROUP).await?;
            if group.is_empty() {
                return Ok(None);
            }
            let mut parsed = Vec::with_capacity(group.len());
            for d in group {
                match Uuid::parse_str(&d.job_id) {
                    Ok(job) => parsed.push((job, d)),
                    Err(_) => {
                        let decision = Decision::DeadLetter {
                            reason: format!("job id '{}' is not a UUID", d.job_id),
                        };
                        self.inner.settle(d.ticket, decision).await?;
                    }
                }
            }
            let keys: Vec<(Uuid, u32)> = parsed
                .iter()
                .map(|(job, d)| (*job, d.segment.index))
                .collect();
            let checks = match narrator_db::check_segments(&self.pool, &keys).await {
                // One check per delivery, in their order (see check_segments).
                Ok(c) => c,
                Err(e) => {
                    // The database is away: let the messages come back later.
                    tracing::warn!(error = %e, deliveries = parsed.len(), "cannot check deliveries; retrying them later");
                    for (_, d) in parsed {
                        let decision = failure_decision(e.kind(), &e.to_string(), d.attempt);
                        self.inner.settle(d.ticket, decision).await?;
                    }
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    continue;
                }
            };
            for ((job, d), check) in parsed.into_iter().zip(checks) {
                let index = d.segment.index;
                match check {
                    SegmentCheck::Work if d.attempt > MAX_ATTEMPTS => {
                        // The broker's delivery limit dead-letters the next return on its
                        // own, without a reason or a record: give up here, with both.
                        let ticket = GuardTicket {
                            job,
                            index,
                            attempt: d.attempt,
                            inner: d.ticket,
                        };
                        let reason = format!(
                            "delivered {} times without being finished (workers stopped or died holding it)",
                            d.attempt
                        );
                        self.fail(ticket, "delivery_limit", &reason).await?;
                    }
                    SegmentCheck::Work => ready.push_back(Delivery {
                        job_id: d.job_id,
                        segment: d.segment,
                        attempt: d.attempt,
                        enqueued_at_ms: d.enqueued_at_ms,
                        ticket: GuardTicket {
                            job,
                            index,
                            attempt: d.attempt,
                            inner: d.ticket,
                        },
                    }),
                    other => {
                        tracing::debug!(%job, index, ?other, worker = %self.worker, "skipping a delivery that needs no work");
                        self.inner.settle(d.ticket, Decision::Ack).await?;
                    }
                }
            }
        }
    }
}

impl SegmentQueue for GuardedQueue {
    type Ticket = GuardTicket;

    async fn next(&self) -> Result<Option<Delivery<GuardTicket>>, SeamError> {
        let mut stop = self.stop.clone();
        tokio::select! {
            biased;
            _ = stop.wait_for(|v| *v) => Ok(None),
            d = self.next_inner() => d,
        }
    }

    async fn ack(&self, ticket: GuardTicket) -> Result<(), SeamError> {
        self.inner.ack(ticket.inner).await
    }

    async fn requeue(&self, ticket: GuardTicket) -> Result<(), SeamError> {
        self.inner.requeue(ticket.inner).await
    }

    async fn abandoned_jobs(&self, jobs: Vec<String>) -> Result<Vec<String>, SeamError> {
        let ids: Vec<Uuid> = jobs
            .iter()
            .filter_map(|j| Uuid::parse_str(j).ok())
            .collect();
        let gone = narrator_db::abandoned_jobs(&self.pool, &ids)
            .await
            .map_err(|e| SeamError::new(e.kind(), e.to_string(), e))?;
        Ok(gone.iter().map(Uuid::to_string).collect())
    }

    async fn fail(&self, ticket: GuardTicket, kind: &str, reason: &str) -> Result<(), SeamError> {
        let decision = failure_decision(kind, reason, ticket.attempt);
        if let Decision::DeadLetter { reason: why } = &decision {
            let (job, index) = (ticket.job, ticket.index);
            let recorded = async {
                narrator_db::fail_segment(&self.pool, job, index, ticket.attempt, kind, why)
                    .await?;
                narrator_db::fail_settled_jobs(&self.pool).await
            };
            if let Err(e) = recorded.await {
                tracing::warn!(%job, index, error = %e, "cannot record a dead-lettered segment");
            }
        }
        Ok(self.inner.settle(ticket.inner, decision).await?)
    }
}

/// Records into Postgres; tells the assembler when a job's last segment is in.
struct ClusterState {
    pool: PgPool,
    complete: mpsc::UnboundedSender<Uuid>,
    done: Arc<AtomicU64>,
}

impl StateStore for ClusterState {
    async fn record_segment(&self, job: &str, record: &SegmentRecord) -> Result<(), SeamError> {
        let id = Uuid::parse_str(job).map_err(|e| SeamError::new("input", e.to_string(), e))?;
        let outcome = narrator_db::record_segment(&self.pool, id, record)
            .await
            .map_err(|e| SeamError::new(e.kind(), e.to_string(), e))?;
        if outcome.newly_done {
            self.done.fetch_add(1, Ordering::Relaxed);
        }
        if outcome.job_complete {
            let _ = self.complete.send(id);
        }
        Ok(())
    }

    async fn record_segments(&self, job: &str, records: &[SegmentRecord]) -> Result<(), SeamError> {
        let id = Uuid::parse_str(job).map_err(|e| SeamError::new("input", e.to_string(), e))?;
        let outcome = narrator_db::record_segments(&self.pool, id, records)
            .await
            .map_err(|e| SeamError::new(e.kind(), e.to_string(), e))?;
        self.done.fetch_add(outcome.newly_done, Ordering::Relaxed);
        if outcome.job_complete {
            let _ = self.complete.send(id);
        }
        Ok(())
    }

    async fn finished_segments(&self, job: &str) -> Result<Vec<SegmentRecord>, SeamError> {
        let id = Uuid::parse_str(job).map_err(|e| SeamError::new("input", e.to_string(), e))?;
        narrator_db::finished_segments(&self.pool, id)
            .await
            .map_err(|e| SeamError::new(e.kind(), e.to_string(), e))
    }
}

/// Builds one job's outputs (the caller holds its assembly claim) and marks it done.
async fn assemble_job(pool: &PgPool, store: &S3AudioStore, job: Uuid) -> anyhow::Result<()> {
    let started = std::time::Instant::now();
    let stored = narrator_db::load_job(pool, job).await?;
    let records = narrator_db::finished_segments(pool, job).await?;
    let loaded = started.elapsed();
    if records.len() != stored.plan.segments.len() {
        anyhow::bail!(
            "job {job} has {} of {} segments recorded",
            records.len(),
            stored.plan.segments.len()
        );
    }
    let format: AudioFormat = stored.format.parse()?;
    let wall_before = narrator_db::job_status(pool, job)
        .await?
        .and_then(|s| s.summary.wall_seconds)
        .unwrap_or(0.0);
    let staging = tempfile::Builder::new()
        .prefix("narrator-assemble-")
        .tempdir()
        .context("creating a staging folder for assembly")?;
    let opts = AssembleOptions {
        format,
        pauses: Pauses {
            sentence_ms: stored.settings.sentence_pause_ms,
            paragraph_ms: stored.settings.paragraph_pause_ms,
            chapter_ms: stored.settings.chapter_pause_ms,
        },
        staging: staging.path().to_path_buf(),
    };
    let plan = stored.plan;
    let store = Arc::new(store.clone());
    let manifest = tokio::task::block_in_place(|| {
        tokio::runtime::Handle::current().block_on(assemble(
            &plan,
            &records,
            &store,
            &opts,
            wall_before,
        ))
    })?;
    let job_text = job.to_string();
    let size = |name: &str| {
        std::fs::metadata(staging.path().join(name))
            .map(|m| m.len())
            .unwrap_or(0)
    };
    let mut outputs = vec![Output {
        key: store.output_key(&job_text, &manifest.book.file),
        kind: "book".into(),
        name: manifest.book.file.clone(),
        seconds: manifest.book.seconds,
        bytes: size(&manifest.book.file),
    }];
    outputs.extend(manifest.chapters.iter().map(|c| Output {
        key: store.output_key(&job_text, &c.file),
        kind: "chapter".into(),
        name: c.file.clone(),
        seconds: c.seconds,
        bytes: size(&c.file),
    }));
    outputs.push(Output {
        key: store.output_key(&job_text, "manifest.json"),
        kind: "manifest".into(),
        name: "manifest.json".into(),
        seconds: 0.0,
        bytes: size("manifest.json"),
    });
    let built = started.elapsed();
    if !narrator_db::finish_with_outputs(pool, job, manifest.audio_seconds, &outputs).await? {
        tracing::warn!(%job, "assembled, but the job was no longer assembling (cancelled?)");
    }
    tracing::info!(
        %job,
        segments = records.len(),
        load_s = loaded.as_secs_f64(),
        build_s = (built - loaded).as_secs_f64(),
        record_s = (started.elapsed() - built).as_secs_f64(),
        "assembled"
    );
    Ok(())
}

/// Assembles every job it is told about (if it wins the claim) and, every few seconds,
/// the jobs it takes over from dead workers.
async fn assembler(
    pool: PgPool,
    store: S3AudioStore,
    worker: String,
    mut complete: mpsc::UnboundedReceiver<Uuid>,
    stale: Duration,
    mut stop: watch::Receiver<bool>,
) {
    let mut sweep = tokio::time::interval(stale.min(Duration::from_secs(10)));
    loop {
        enum Wake {
            Stop,
            Job(Uuid),
            Sweep,
        }
        let wake = tokio::select! {
            biased;
            _ = stop.wait_for(|v| *v) => Wake::Stop,
            Some(job) = complete.recv() => Wake::Job(job),
            _ = sweep.tick() => Wake::Sweep,
        };
        let jobs = match wake {
            Wake::Stop => return,
            Wake::Job(job) => match narrator_db::claim_assembly_for(&pool, job, &worker).await {
                Ok(true) => vec![job],
                Ok(false) => vec![],
                Err(e) => {
                    tracing::warn!(%job, error = %e, "cannot claim assembly");
                    vec![]
                }
            },
            Wake::Sweep => {
                if let Err(e) = narrator_db::fail_settled_jobs(&pool).await {
                    tracing::warn!(error = %e, "cannot end jobs with failed segments");
                }
                narrator_db::take_over_assemblies(&pool, &worker, stale)
                    .await
                    .unwrap_or_else(|e| {
                        tracing::warn!(error = %e, "assembly sweep failed");
                        vec![]
                    })
            }
        };
        for job in jobs {
            tracing::info!(%job, "assembling");
            if let Err(e) = assemble_job(&pool, &store, job).await {
                let reason = format!(
                    "assembly failed: {}; run `narrator retry {job}` to assemble again",
                    crate::one_line(&e)
                );
                tracing::warn!(%job, %reason);
                let _ = narrator_db::fail_job(&pool, job, "assembly", &reason).await;
            }
        }
    }
}

/// Republishes segments committed but never confirmed published.
async fn reconciler(
    pool: PgPool,
    publisher: Publisher,
    after: Duration,
    mut stop: watch::Receiver<bool>,
) {
    let mut tick =
        tokio::time::interval(after.clamp(Duration::from_secs(1), Duration::from_secs(10)));
    loop {
        tokio::select! {
            biased;
            _ = stop.wait_for(|v| *v) => return,
            _ = tick.tick() => {}
        }
        let missing = match narrator_db::unpublished(&pool, after, 10_000).await {
            Ok(m) => m,
            Err(e) => {
                tracing::warn!(error = %e, "reconciler cannot read the outbox");
                continue;
            }
        };
        if missing.is_empty() {
            continue;
        }
        let mut by_job: BTreeMap<Uuid, Vec<narrator_core::Segment>> = BTreeMap::new();
        for (job, seg) in missing {
            by_job.entry(job).or_default().push(seg);
        }
        for (job, segments) in by_job {
            let voice = match narrator_db::job_voice(&pool, job).await {
                Ok(v) => v,
                Err(e) => {
                    tracing::warn!(%job, error = %e, "reconciler cannot load a job");
                    continue;
                }
            };
            tracing::info!(%job, segments = segments.len(), "republishing unpublished segments");
            if let Err(e) = publish_segments(&pool, &publisher, job, &voice, &segments).await {
                tracing::warn!(%job, error = %e, "reconciler publish failed; will try again");
            }
        }
    }
}

/// One voice's engine, as the heartbeat reports it.
struct Report {
    voice: String,
    engine: String,
    prefetch: u16,
    base: serde_json::Value,
    synth: Arc<narrator_pipeline::Synthesizer>,
}

/// What the worker says about itself at each heartbeat: the hardware profile, and per
/// voice the plan with the budget now (halved by out-of-memory failures), those failures,
/// a fallback to CPU, and the device-busy fraction since the last beat.
struct Describe {
    id: String,
    host: String,
    device: String,
    hardware: serde_json::Value,
    reports: Vec<Report>,
    /// (when, busy seconds per voice) at the last beat.
    last: std::sync::Mutex<Option<(std::time::Instant, Vec<f64>)>>,
}

impl Describe {
    fn info(&self) -> WorkerInfo {
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
                let mut v = r.base.clone();
                if let Some(o) = v.as_object_mut() {
                    o.insert("voice".into(), r.voice.clone().into());
                    o.insert("engine".into(), r.engine.clone().into());
                    o.insert("prefetch".into(), r.prefetch.into());
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
        }
    }
}

async fn heartbeat(
    pool: PgPool,
    describe: Arc<Describe>,
    done: Arc<AtomicU64>,
    every: Duration,
    mut stop: watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(every);
    loop {
        let info = describe.info();
        if let Err(e) = narrator_db::heartbeat(&pool, &info, done.load(Ordering::Relaxed)).await {
            tracing::warn!(error = %e, "heartbeat failed");
        }
        tokio::select! {
            biased;
            _ = stop.wait_for(|v| *v) => return,
            _ = tick.tick() => {}
        }
    }
}

/// SIGTERM and Ctrl-C, listened for from the worker's start: a signal that arrives while
/// the engines load or the first segments run is kept, and the worker stops cleanly as
/// soon as it is running, instead of dying on the signal's default action.
struct Shutdown {
    #[cfg(unix)]
    signals: Option<(tokio::signal::unix::Signal, tokio::signal::unix::Signal)>,
}

impl Shutdown {
    fn listen() -> Self {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            let signals = match (
                signal(SignalKind::terminate()),
                signal(SignalKind::interrupt()),
            ) {
                (Ok(term), Ok(int)) => Some((term, int)),
                _ => None,
            };
            Self { signals }
        }
        #[cfg(not(unix))]
        Self {}
    }

    async fn requested(&mut self) {
        #[cfg(unix)]
        if let Some((term, int)) = &mut self.signals {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
            return;
        }
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// `narrator worker`.
pub(crate) async fn worker(paths: &Paths, args: WorkerArgs) -> anyhow::Result<()> {
    let mut shutdown = Shutdown::listen();
    let voices = if args.voices.is_empty() {
        vec![args.engine_args.voice.clone()]
    } else {
        args.voices.clone()
    };
    let worker_id = args
        .id
        .clone()
        .unwrap_or_else(|| format!("{}:{}", cluster::host_name(), std::process::id()));
    let null_engine = match args.engine.as_str() {
        "onnx" => false,
        "null" => true,
        other => anyhow::bail!("--engine {other}: use onnx or null"),
    };
    // Voices first: a typo fails before anything connects or loads.
    let mut found = Vec::new();
    for v in &voices {
        let mut e = args.engine_args.clone();
        e.voice = v.clone();
        found.push((engine::find_voice(paths, &e)?, e));
    }
    let pool = cluster::database(&args.services).await?;
    let store = cluster::store(&args.services).await?;
    let conn = cluster::broker(&args.services, &format!("narrator-worker {worker_id}")).await?;
    let channel = conn
        .create_channel()
        .await
        .context("opening a RabbitMQ channel")?;
    for (voice, _) in &found {
        narrator_broker::declare(&channel, &voice.name).await?;
    }

    let (stop_tx, stop) = watch::channel(false);
    let (complete_tx, complete_rx) = mpsc::unbounded_channel();
    let done = Arc::new(AtomicU64::new(0));
    let mut reports: Vec<Report> = Vec::new();
    let mut devices = Vec::new();
    let mut loops = tokio::task::JoinSet::new();
    // One engine, plan and consumer per voice and device: `--device cuda:0,cuda:1`, or
    // `auto` for every GPU NVML lists when the runtime has CUDA (else the CPU).
    let mut engines = Vec::new();
    for (voice, eargs) in found {
        let targets = if null_engine {
            vec![eargs.device.clone()]
        } else {
            let rt = narrator_engine::load_runtime(&paths.onnxruntime)?;
            let gpus: Vec<u32> = narrator_hardware::probe()
                .gpus
                .iter()
                .map(|g| g.index)
                .collect();
            engine::expand_devices(&eargs.device, rt.cuda_available, &gpus)?
        };
        for device in targets {
            let mut e = eargs.clone();
            e.device = device;
            engines.push((voice.clone(), e));
        }
    }
    for (voice, eargs) in engines {
        let name = voice.name.clone();
        let loaded = if null_engine {
            engine::load_null(paths, &eargs, voice, usize::from(args.null_samples_per_id))?
        } else {
            let planning = match eargs.calibrate.as_deref() {
                Some(p) => p.parse()?,
                None => engine::Planning::Calibrate,
            };
            let loaded = engine::load(paths, &eargs, voice, planning)?;
            // One batch at the full budget before consuming: a plan too large for the
            // device fails (or shrinks) here, not in the middle of a book.
            let secs = tokio::task::block_in_place(|| {
                narrator_pipeline::warm_up(
                    &loaded.synth,
                    engine::ITEM_TOKENS,
                    engine::MAX_ITEM_TOKENS,
                )
            })
            .with_context(|| format!("warming up voice {name} at the planned batch"))?;
            // The arena keeps what calibration and warm-up grew it to; a larger run
            // gives back what it adds (`--cpu-arena bounded`), so RSS stays flat.
            loaded.arena.settle();
            tracing::info!(
                voice = %name,
                seconds = secs,
                arena = ?loaded.arena.mode(),
                arena_kept_tokens = loaded.arena.kept_tokens(),
                "warm-up at the full budget done"
            );
            loaded
        };
        let base = loaded.plan_json();
        let mut synth = loaded.synth;
        if let Ok(needle) = std::env::var("NARRATOR_TEST_FAIL_TEXT") {
            // Fault injection for tests: a segment containing this text fails its batch,
            // for good, or (NARRATOR_TEST_FAIL_ONCE set) transiently on its first run only.
            let once = std::env::var_os("NARRATOR_TEST_FAIL_ONCE").is_some();
            tracing::warn!(%needle, once, "fault injection on: segments containing it fail");
            let failed = std::sync::Mutex::new(std::collections::HashSet::new());
            synth = synth.with_fault(Arc::new(move |s| {
                if !s.text.contains(&needle) {
                    return None;
                }
                if !once {
                    return Some(true);
                }
                let mut seen = failed.lock().unwrap_or_else(|e| e.into_inner());
                seen.insert(s.text.clone()).then_some(false)
            }));
        }
        // Two batches per session plus one being stored (the plan's prefetch).
        let prefetch = args
            .prefetch
            .unwrap_or_else(|| u16::try_from(loaded.plan.prefetch.max(1)).unwrap_or(u16::MAX));
        devices.push(synth.pool().device().to_string());
        eprintln!(
            "voice {name} on {}: {} items/run, {} padded tokens, wait {} ms, prefetch {prefetch} ({})",
            synth.pool().device(),
            synth.budget().max_requests,
            synth.budget().max_tokens,
            synth.budget().max_wait.as_millis(),
            loaded.plan.reason
        );
        let synth = Arc::new(synth);
        reports.push(Report {
            voice: name.clone(),
            engine: args.engine.clone(),
            prefetch,
            base,
            synth: synth.clone(),
        });
        let consumer = Consumer::start(&conn, &name, prefetch).await?;
        let queue = Arc::new(GuardedQueue {
            inner: consumer,
            pool: pool.clone(),
            stop: stop.clone(),
            worker: worker_id.clone(),
            ready: Default::default(),
        });
        let stages = Stages {
            synth,
            store: Arc::new(store.clone()),
            state: Arc::new(ClusterState {
                pool: pool.clone(),
                complete: complete_tx.clone(),
                done: done.clone(),
            }),
            on_event: Arc::new(|e| {
                if let Event::Warning(w) = e {
                    tracing::warn!("{w}");
                }
            }),
        };
        let opts = RunOptions {
            worker: worker_id.clone(),
            in_flight: loaded.in_flight,
            isolate_failures: true,
            stop: Some(stop.clone()),
            // Segments are checked in Postgres when delivered; only those that then
            // waited (a full device, a long max_wait) are checked again.
            recheck_after: Duration::from_secs(1),
            pack_max: args.pack_max,
        };
        loops.spawn(async move {
            let result = work(queue.clone(), &stages, &opts).await;
            // Deliveries prefetched but not started go back to the queue.
            let _ = queue.inner.close().await;
            result
                .map(|_| ())
                .with_context(|| format!("worker loop for voice {name}"))
        });
    }
    let profile = narrator_hardware::probe();
    tracing::info!(hardware = %profile.summary(), "hardware profile");
    let describe = Describe {
        id: worker_id.clone(),
        host: cluster::host_name(),
        device: devices.first().cloned().unwrap_or_else(|| "cpu".into()),
        hardware: serde_json::to_value(&profile).unwrap_or_default(),
        reports,
        last: std::sync::Mutex::new(None),
    };
    let every = Duration::from_secs(args.heartbeat.max(1));
    let mut services = tokio::task::JoinSet::new();
    let describe = Arc::new(describe);
    services.spawn(heartbeat(
        pool.clone(),
        describe.clone(),
        done.clone(),
        every,
        stop.clone(),
    ));
    services.spawn(reconciler(
        pool.clone(),
        Publisher::new(&conn).await?,
        Duration::from_secs(args.reconcile_after),
        stop.clone(),
    ));
    services.spawn(assembler(
        pool.clone(),
        store.clone(),
        worker_id.clone(),
        complete_rx,
        every * 6,
        stop.clone(),
    ));
    eprintln!("worker {worker_id} ready");

    let mut failure = None;
    tokio::select! {
        _ = shutdown.requested() => {
            eprintln!("worker {worker_id}: stopping after the batches in flight");
        }
        Some(r) = loops.join_next() => {
            failure = match r {
                Ok(Ok(())) => None,
                Ok(Err(e)) => Some(e),
                Err(e) => Some(anyhow::anyhow!("worker loop panicked: {e}")),
            };
        }
    }
    let _ = stop_tx.send(true);
    while let Some(r) = loops.join_next().await {
        if let Ok(Err(e)) = r {
            failure = failure.or(Some(e));
        }
    }
    while services.join_next().await.is_some() {}
    let _ = narrator_db::heartbeat(&pool, &describe.info(), done.load(Ordering::Relaxed)).await;
    let _ = conn.close(200, "worker stopped".into()).await;
    eprintln!(
        "worker {worker_id}: stopped after {} segments",
        done.load(Ordering::Relaxed)
    );
    match failure {
        Some(e) => Err(e),
        None => Ok(()),
    }
}
