//! `narrator worker`: parses the flags, finds the voices, loads and warms up an engine
//! per voice and device, then hands everything to `narrator_worker` (the consumers, the
//! delivery guard, recording, assembly, the reconciler, the watchdog, the heartbeat).

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use narrator_worker::{VoiceEngine, Worker, WorkerConfig};

use crate::cli::{EngineArgs, WorkerArgs};
use crate::cluster;
use crate::engine;
use crate::paths::Paths;

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

/// One engine per voice and device: `--device cuda:0,cuda:1`, or `auto` for every GPU
/// NVML lists when the runtime has CUDA (else the CPU); the null engine runs where
/// `--device` says.
fn engine_targets(
    paths: &Paths,
    found: Vec<(narrator_engine::Voice, EngineArgs)>,
    null_engine: bool,
) -> anyhow::Result<Vec<(narrator_engine::Voice, EngineArgs)>> {
    let mut engines = Vec::new();
    for (voice, eargs) in found {
        let targets = if null_engine {
            vec![eargs.device.clone()]
        } else {
            let selected = narrator_pipeline::load::runtime(paths, &eargs.device)?;
            let gpus: Vec<u32> = narrator_hardware::probe()
                .gpus
                .iter()
                .map(|g| g.index)
                .collect();
            engine::expand_devices(
                selected.device_spec(&eargs.device),
                selected.rt.cuda_available,
                &gpus,
            )?
        };
        for device in targets {
            let mut e = eargs.clone();
            e.device = device;
            engines.push((voice.clone(), e));
        }
    }
    Ok(engines)
}

/// Loads a voice for a device with the fleet's calibrations (a new one is shared with
/// the fleet), then runs one batch at the full budget before consuming: a plan too large
/// for the device fails (or shrinks) here, not in the middle of a book.
async fn load_and_warm_up(
    paths: &Paths,
    eargs: &EngineArgs,
    voice: narrator_engine::Voice,
    catalog: &narrator_hardware::Catalog,
    pool: &narrator_db::PgPool,
    worker_id: &str,
) -> anyhow::Result<engine::Loaded> {
    let name = voice.name.clone();
    let planning = match eargs.calibrate.as_deref() {
        Some(p) => p.parse()?,
        None => engine::Planning::Calibrate,
    };
    let loaded = engine::load(paths, &engine::options(eargs), voice, planning, catalog)?;
    if let Some(c) = &loaded.calibration {
        cluster::fleet::share(pool, c, worker_id).await?;
    }
    let secs = tokio::task::block_in_place(|| {
        narrator_pipeline::warm_up(&loaded.synth, engine::ITEM_TOKENS, engine::MAX_ITEM_TOKENS)
    })
    .with_context(|| format!("warming up voice {name} at the planned batch"))?;
    // The arena keeps what calibration and warm-up grew it to; a larger run gives back
    // what it adds (`--cpu-arena bounded`), so RSS stays flat.
    loaded.arena.settle();
    tracing::info!(
        voice = %name,
        seconds = secs,
        arena = ?loaded.arena.mode(),
        arena_kept_tokens = loaded.arena.kept_tokens(),
        "warm-up at the full budget done"
    );
    Ok(loaded)
}

/// Fault injection for tests, from the environment: `NARRATOR_TEST_FAIL_TEXT` (a segment
/// containing it fails its batch, for good, or with `NARRATOR_TEST_FAIL_ONCE` set
/// transiently on its first run only) and `NARRATOR_TEST_ABORT_TEXT` (a segment containing
/// it kills the whole process when it reaches the engine, as a crash of the runtime would).
fn with_test_faults(mut synth: narrator_pipeline::Synthesizer) -> narrator_pipeline::Synthesizer {
    if let Ok(needle) = std::env::var("NARRATOR_TEST_FAIL_TEXT") {
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
    if let Ok(needle) = std::env::var("NARRATOR_TEST_ABORT_TEXT") {
        tracing::warn!(%needle, "fault injection on: segments containing it abort the process");
        synth = synth.with_fault(Arc::new(move |s| {
            if s.text.contains(&needle) {
                eprintln!("aborting on segment {} (NARRATOR_TEST_ABORT_TEXT)", s.index);
                std::process::abort();
            }
            None
        }));
    }
    synth
}

/// `narrator worker`.
pub(crate) async fn worker(paths: &Paths, args: WorkerArgs) -> anyhow::Result<()> {
    let mut shutdown = Shutdown::listen();
    let voices = if args.voices.is_empty() {
        vec![args.engine_args.voice.name.clone()]
    } else {
        args.voices.clone()
    };
    let worker_id = args
        .id
        .clone()
        .unwrap_or_else(|| format!("{}:{}", crate::host_name(), std::process::id()));
    let null_engine = match args.engine.as_str() {
        "onnx" => false,
        "null" => true,
        other => anyhow::bail!("--engine {other}: use onnx or null"),
    };
    // Voices first: a typo fails before anything connects or loads.
    let mut found = Vec::new();
    for v in &voices {
        let mut e = args.engine_args.clone();
        e.voice.name = v.clone();
        found.push((engine::find_voice(paths, &e)?, e));
    }
    // /healthz and /readyz answer while the engines load (not ready until they are warm).
    let health = narrator_telemetry::serve::Health::new();
    health.set("engines", false, "loading and warming up");
    let _server = match &args.listen {
        Some(addr) => {
            let server = narrator_telemetry::serve::serve(addr, health.clone()).await?;
            eprintln!(
                "worker {worker_id}: /metrics, /healthz and /readyz on http://{}",
                server.addr
            );
            Some(server)
        }
        None => None,
    };
    // Then the services: a wrong URL fails before the engines load. (The broker is
    // connected again by `Worker::start`; this check fails fast on a wrong URL.)
    let pool = cluster::database(&args.services).await?;
    let store = cluster::store(&args.services).await?;
    cluster::broker(&args.services, "narrator-worker check")
        .await?
        .close(200, "checked".into())
        .await
        .ok();
    // Calibrations by GPU model: shipped, then the fleet's (a worker on a known model
    // plans from it instead of calibrating).
    let mut catalog = narrator_hardware::Catalog::shipped()?;
    cluster::fleet::load_into(&pool, &mut catalog).await?;
    let mut loaded_engines: Vec<VoiceEngine> = Vec::new();
    let mut devices = Vec::new();
    let engines = engine_targets(paths, found, null_engine)?;
    for (voice, eargs) in engines {
        let name = voice.name.clone();
        let loaded = if null_engine {
            engine::load_null(
                paths,
                &engine::options(&eargs),
                voice,
                usize::from(args.null_samples_per_id),
            )?
        } else {
            load_and_warm_up(paths, &eargs, voice, &catalog, &pool, &worker_id).await?
        };
        let mut base = loaded.plan_json();
        // Which voice this plan serves: `submit` warns about voices no worker serves.
        base["voice"] = name.clone().into();
        base["family"] = loaded.synth.family().as_str().into();
        let synth = with_test_faults(loaded.synth);
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
        loaded_engines.push(VoiceEngine {
            voice: name,
            synth,
            plan: base,
            prefetch,
            in_flight: loaded.in_flight,
        });
    }
    let profile = narrator_hardware::probe();
    tracing::info!(hardware = %profile.summary(), "hardware profile");
    let config = WorkerConfig {
        id: worker_id.clone(),
        host: crate::host_name(),
        engine: args.engine.clone(),
        voices: loaded_engines,
        pool,
        store,
        amqp_url: args.services.amqp_url.clone(),
        amqp_ca_file: args.services.amqp_ca_file.clone(),
        device: devices.first().cloned().unwrap_or_else(|| "cpu".into()),
        hardware: serde_json::to_value(&profile).unwrap_or_default(),
        pack_max: args.pack_max,
        reconcile_after: Duration::from_secs(args.reconcile_after),
        heartbeat: Duration::from_secs(args.heartbeat.max(1)),
        lease: Duration::from_secs(args.lease.max(1)),
        keep_intermediates: args.keep_intermediates,
        broker_timeout: Duration::from_secs(args.broker_timeout.max(1)),
        postpone_budget: Duration::from_secs(args.postpone_budget),
        wedged_after: Duration::from_secs(args.wedged_after),
        health: health.clone(),
        gauges: args.listen.is_some(),
        max_hold: Duration::from_secs(args.max_hold),
        intake: (!args.no_intake).then(|| narrator_worker::intake::IntakeConfig {
            voices_dir: paths.voices.clone(),
            max_input_bytes: args.intake_max_mb.saturating_mul(1024 * 1024),
            prefetch: args.intake_prefetch,
            // Fault injection for the tests (tests/producers.rs): killed mid-intake.
            abort_after_record: std::env::var_os("NARRATOR_TEST_INTAKE_ABORT").is_some(),
        }),
    };
    health.set("engines", true, format!("{} warm", devices.join(", ")));
    let worker = Worker::start(config).await?;
    eprintln!("worker {worker_id} ready");
    let stopping = async {
        shutdown.requested().await;
        eprintln!("worker {worker_id}: stopping after the batches in flight");
    };
    let summary = worker.run_until(stopping).await?;
    eprintln!(
        "worker {worker_id}: stopped after {} segments",
        summary.segments_done
    );
    Ok(())
}
