//! One loader for a voice, shared by every command that synthesizes (`run`, `synth`,
//! `plan`, `bench`, `worker`, and the server to come): the ONNX Runtime build and its
//! device ([`runtime`]), the sessions, the phonemizer, the calibration (cached, from the
//! fleet's catalog, or measured now) and the batch plan, as named steps:
//!
//! ```text
//! runtime ─► open_sessions ─► find_calibration ─┬─ cached: apply_cached
//!                                               └─ none:   measure (layouts, graphs, batch sweep)
//!         ─► plan_from ─► apply_overrides (flags, the model's limits) ─► with_cpu_fallback
//! ```
//!
//! Everything a caller chooses is in [`EngineOptions`]; test hooks are
//! [`TestHooks`], read from the environment by the binary, never here.

mod cache;
mod paths;
pub mod runtime;

use anyhow::Context;
use std::sync::Arc;
use std::time::Duration;

use narrator_engine::{
    ArenaPolicy, Backend, Batching, CpuArena, Device, EnginePool, MemoryLimit, PoolOptions,
    Runtime, ScaleOverrides, SessionOptions, Voice,
};
use narrator_hardware::{
    Calibration, CalibrationSource, Catalog, DeviceSpec, HardwareProfile, LayoutPoint, Plan,
    PlanLimits, PlanOrigin,
};
use narrator_phonemes::Phonemizer;

use crate::{Budget, CalibrateOptions, Synthesizer, calibrate};

pub use cache::calibration_path;
pub use paths::{OrtBuild, PathFlags, Paths};
pub use runtime::{Selected, bundled_dirs, cuda_library, inspect, runtime};

/// How the engine runs: the `--device`, layout, batch and scale flags of every command
/// that synthesizes.
#[derive(Debug, Clone, Default)]
pub struct EngineOptions {
    /// `auto`, `cpu`, `cuda:N` (a worker may list several, comma-separated).
    pub device: String,
    /// Sessions (engine replicas); `None` with `intra_threads` `None`: measured on CPU.
    pub sessions: Option<usize>,
    /// Intra-op threads per session.
    pub intra_threads: Option<usize>,
    /// Items per engine run, overriding the plan.
    pub max_batch: Option<usize>,
    /// The CUDA arena's limit, MiB.
    pub gpu_mem_limit_mib: Option<usize>,
    /// Padded lengths rounded up to a multiple of this (GPU default 16).
    pub pad_to: Option<usize>,
    /// Intra-op threads wait without spinning.
    pub no_spin: bool,
    /// The CPU arena's policy.
    pub cpu_arena: CpuArena,
    /// Speed and the voice's scales, over the voice's defaults.
    pub scales: ScaleOverrides,
    /// Hooks for tests; all off in production.
    pub hooks: TestHooks,
}

/// Test hooks, off unless a test sets them (the binary reads them from its environment
/// with [`TestHooks::from_env`]).
#[derive(Debug, Clone, Default)]
pub struct TestHooks {
    /// `NARRATOR_TEST_GPU_MEMORY_TOKENS=N`: the engine claims to be `cuda:0` with room for
    /// N padded tokens per run, so the out-of-memory path (halve, retry, fall back to
    /// CPU) runs on machines without a GPU.
    pub gpu_memory_tokens: Option<usize>,
    /// `NARRATOR_TEST_GPU_MODEL`: the model name of a claimed GPU NVML does not describe.
    pub gpu_model: Option<String>,
    /// `NARRATOR_TEST_QUICK_CALIBRATION`: one round and batch 1 only, for tests of what a
    /// calibration records and how runs use it rather than of what it measures (Kokoro's
    /// takes minutes on two cores).
    pub quick_calibration: bool,
    /// `NARRATOR_TEST_RUN_MS`: every null-engine run takes this long, whatever its size
    /// (a GPU-like worker whose speed grows with its batch budget).
    pub run_ms: Option<Duration>,
}

impl TestHooks {
    /// The hooks this process's environment sets.
    pub fn from_env() -> Self {
        let var = |k: &str| std::env::var(k).ok();
        TestHooks {
            gpu_memory_tokens: var("NARRATOR_TEST_GPU_MEMORY_TOKENS").and_then(|v| v.parse().ok()),
            gpu_model: var("NARRATOR_TEST_GPU_MODEL"),
            quick_calibration: std::env::var_os("NARRATOR_TEST_QUICK_CALIBRATION").is_some(),
            run_ms: var("NARRATOR_TEST_RUN_MS")
                .and_then(|v| v.parse::<u64>().ok())
                .map(Duration::from_millis),
        }
    }

    /// How a calibration measures: rounds of each side-by-side comparison (layouts,
    /// graphs) and the batch sweep's time budget.
    fn calibration_effort(&self) -> (usize, Duration) {
        if self.quick_calibration {
            (1, Duration::ZERO)
        } else {
            (3, Duration::from_secs(25))
        }
    }
}

/// A loaded voice and how it will be run.
pub struct Loaded {
    pub synth: Synthesizer,
    /// Batches a runner keeps in flight (the sessions and one more; 4 for the null engine).
    pub in_flight: usize,
    /// The plan the budget came from.
    pub plan: Plan,
    /// The calibration the plan used (measured, cached or none).
    pub calibration: Option<Calibration>,
    /// The machine as probed while loading (`None` for the null engine).
    pub profile: Option<HardwareProfile>,
    /// The ONNX Runtime version, when the library's name tells it.
    pub runtime: Option<String>,
    /// The sessions' CPU arena policy: settle it once warmed up (the worker does).
    pub arena: Arc<ArenaPolicy>,
    /// Why `--device auto` runs on the CPU although a GPU or a CUDA build is here.
    pub device_fallback: Option<String>,
}

impl Loaded {
    /// The plan with what actually runs (after flags and the engine's limits).
    pub fn plan_json(&self) -> serde_json::Value {
        let b = self.synth.budget();
        let mut v = serde_json::to_value(&self.plan).unwrap_or_default();
        if let Some(o) = v.as_object_mut() {
            if let Some(why) = &self.device_fallback {
                o.insert("device_fallback".into(), why.clone().into());
            }
            o.insert("max_batch_tokens".into(), b.max_tokens.into());
            o.insert("max_batch_requests".into(), b.max_requests.into());
            o.insert("max_wait_ms".into(), (b.max_wait.as_millis() as u64).into());
            if let Some(c) = &self.calibration {
                o.insert("calibration".into(), serde_json::json!({
                    "source": c.source, "bytes_per_token": c.bytes_per_token,
                    "fixed_bytes": c.fixed_bytes, "points": c.points.len(), "seconds": c.seconds,
                    "layouts": c.layouts, "layout_reason": c.layout_reason,
                    "graph": c.graph, "graph_reason": c.graph_reason,
                }));
            }
        }
        v
    }
}

/// How a plan is found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Planning {
    /// A cached calibration, or measure one now (workers, `narrator plan`).
    Calibrate,
    /// Measure again even if cached.
    Recalibrate,
    /// A cached calibration if there is one, else the defaults (embedded runs).
    CachedOnly,
}

impl std::str::FromStr for Planning {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> anyhow::Result<Self> {
        Ok(match s {
            "auto" => Planning::Calibrate,
            "always" => Planning::Recalibrate,
            "cached" => Planning::CachedOnly,
            other => anyhow::bail!("--calibrate {other}: use auto, always or cached"),
        })
    }
}

/// The devices a worker drives for `--device SPEC`: a comma-separated list (`cpu`,
/// `cuda:N`), or `auto`: every GPU in `gpus` when the runtime has CUDA, else the CPU.
pub fn expand_devices(spec: &str, cuda: bool, gpus: &[u32]) -> anyhow::Result<Vec<String>> {
    let mut out = Vec::new();
    for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match part {
            "auto" if cuda && !gpus.is_empty() => {
                out.extend(gpus.iter().map(|i| format!("cuda:{i}")))
            }
            "auto" => out.push(if cuda { "cuda:0".into() } else { "cpu".into() }),
            other => {
                let d: Device = other.parse().map_err(anyhow::Error::msg)?;
                out.push(d.to_string());
            }
        }
    }
    out.dedup();
    if out.is_empty() {
        anyhow::bail!("--device '{spec}': name at least one device (auto, cpu, cuda:N)");
    }
    Ok(out)
}

/// Longest utterance the phonemizer hands the engine (a `--max-batch N` budget is N of them).
pub const MAX_ITEM_TOKENS: usize = crate::synth::MAX_PHONEMES + 2;

/// Sentences one packed run may hold (a family without a batch dimension).
const PACKED_RUN_ITEMS: usize = 16;

/// Sentence-sized calibration items, in padded tokens.
pub const ITEM_TOKENS: usize = 128;

/// The model name of a GPU NVML does not describe: never shared with the fleet.
pub const UNKNOWN_GPU: &str = "unknown GPU";

/// The device as the planner sees it: the GPU's memory from NVML, or this machine's cores
/// and available memory (cgroup limits included).
pub fn device_spec(device: Device, profile: &HardwareProfile, hooks: &TestHooks) -> DeviceSpec {
    match device {
        Device::Cuda(i) => match profile.gpus.iter().find(|g| g.index == i) {
            Some(g) => DeviceSpec::Gpu {
                name: g.name.clone(),
                index: i,
                total_bytes: g.memory_total_bytes,
                free_bytes: g.memory_free_bytes,
            },
            // CUDA without NVML (or a test's claimed GPU): plan as an unknown 16 GiB card
            // (tests name the model with the `gpu_model` hook).
            None => DeviceSpec::Gpu {
                name: hooks
                    .gpu_model
                    .clone()
                    .unwrap_or_else(|| UNKNOWN_GPU.into()),
                index: i,
                total_bytes: 16 << 30,
                free_bytes: 15 << 30,
            },
        },
        _ => DeviceSpec::Cpu {
            cores: profile.cpu.usable_cores.max(1),
            available_bytes: profile.memory.cgroup_limit_bytes.map_or(
                profile.memory.available_bytes,
                |l| {
                    l.saturating_sub(profile.memory.cgroup_usage_bytes.unwrap_or(0))
                        .min(profile.memory.available_bytes)
                },
            ),
        },
    }
}

/// Runs (batch × padded length, in tokens) whose arena memory sessions keep when there
/// are several of them (a larger run gives back what it added when it ends). Measured on
/// 2 cores with Alice ch. I (sentences up to ~780 tokens): see docs/BENCHMARKS.md, issue 18.
const MULTI_SESSION_KEPT_TOKENS: usize = 512;

/// Memory one more CPU session may take at its peak (weights, kept arena, one long run).
const BYTES_PER_CPU_SESSION: u64 = 768 << 20;

/// Sessions on CPU when nothing was measured: one single-threaded session per core, as
/// many as half the available memory holds at [`BYTES_PER_CPU_SESSION`]. Measured on a
/// 2-core machine, 2 sessions × 1 thread run the voice ~15 % faster than 1 session × 2
/// threads, and the calibration keeps this layout unless the other one beats it.
fn default_cpu_sessions(cores: usize, available_bytes: u64) -> usize {
    let by_memory =
        usize::try_from(available_bytes / 2 / BYTES_PER_CPU_SESSION).unwrap_or(usize::MAX);
    by_memory.clamp(1, cores.max(1))
}

/// Resident memory added since `before` (a [`narrator_hardware::memory::process_rss`]).
fn rss_added_since(before: Option<u64>) -> Option<u64> {
    Some(narrator_hardware::memory::process_rss()?.saturating_sub(before?))
}

/// The memory a layout may use: what is available on CPU, unbounded on a GPU.
fn available_bytes(spec: &DeviceSpec) -> u64 {
    match spec {
        DeviceSpec::Cpu {
            available_bytes, ..
        } => *available_bytes,
        DeviceSpec::Gpu { .. } => u64::MAX,
    }
}

/// The thread layout sessions run with: set by flags, the defaults, or a calibration.
#[derive(Debug, Clone, Copy)]
struct Layout {
    sessions: usize,
    intra: usize,
    /// Neither `--sessions` nor `--intra-threads`: a calibration measures the layout.
    auto: bool,
    /// The device is (or may be) a GPU: the CPU threads only feed it.
    on_gpu: bool,
}

impl Layout {
    /// On a GPU one non-spinning intra-op thread per session leaves the cores to the
    /// phonemizer and the encoders; on CPU one single-threaded session per core (as
    /// memory allows) unless flags say otherwise.
    fn initial(
        opts: &EngineOptions,
        device: Device,
        rt: &Runtime,
        profile: &HardwareProfile,
    ) -> Self {
        let cores = profile.cpu.usable_cores.max(1);
        let auto = opts.sessions.is_none() && opts.intra_threads.is_none();
        let on_gpu = match device {
            Device::Cuda(_) => true,
            Device::Auto => rt.cuda_available,
            Device::Cpu => false,
        };
        let default_sessions = if on_gpu || !auto {
            1
        } else {
            default_cpu_sessions(cores, profile.memory.available_bytes)
        };
        let sessions = opts.sessions.unwrap_or(default_sessions).max(1);
        let intra = opts
            .intra_threads
            .unwrap_or_else(|| if on_gpu { 1 } else { (cores / sessions).max(1) });
        Layout {
            sessions,
            intra,
            auto,
            on_gpu,
        }
    }

    /// Its name in the calibration cache.
    fn cache_name(&self) -> String {
        if self.auto {
            "auto".to_string()
        } else {
            format!("{}x{}", self.intra, self.sessions)
        }
    }
}

/// Loads the runtime, the sessions and the phonemizer for `voice`, and plans its batches.
/// On a GPU whose model `catalog` knows, the plan comes from that calibration and nothing
/// is measured (unless `planning` is [`Planning::Recalibrate`]).
pub fn load(
    paths: &Paths,
    opts: &EngineOptions,
    voice: Voice,
    planning: Planning,
    catalog: &Catalog,
) -> anyhow::Result<Loaded> {
    let selected = runtime(paths, &opts.device)?;
    let device: Device = selected
        .device_spec(&opts.device)
        .parse()
        .map_err(anyhow::Error::msg)?;
    let profile = narrator_hardware::probe();
    let mut l = Loader {
        paths,
        opts,
        voice: &voice,
        rt: selected.rt,
        arena: ArenaPolicy::new(opts.cpu_arena),
        cores: profile.cpu.usable_cores.max(1),
        layout: Layout::initial(opts, device, selected.rt, &profile),
        used: device,
        spec: DeviceSpec::Cpu {
            cores: 1,
            available_bytes: 0,
        },
        runtime: narrator_hardware::doctor::version_from_library_path(&selected.rt.library)
            .unwrap_or_else(|| "unknown".into()),
        measure_cpu: false,
        graphs: Vec::new(),
        loaded_graph: None,
    };
    let (mut synth, pool_load_bytes) = l.open_sessions(device, &profile)?;
    let (calibration, catalog_origin) = match l.find_calibration(planning, catalog) {
        Some((c, origin)) => (Some(l.apply_cached(c, &synth)?), origin),
        None if planning == Planning::CachedOnly => (None, None),
        None => (Some(l.measure(&mut synth, pool_load_bytes)?), None),
    };
    let mut plan = l.plan_from(calibration.as_ref(), catalog_origin.as_deref());
    l.apply_overrides(&mut plan, &synth, calibration.is_some());
    synth.set_budget(Budget {
        max_tokens: plan.max_batch_tokens,
        max_requests: plan.max_batch_requests,
        max_wait: Duration::from_millis(plan.max_wait_ms),
    });
    if matches!(l.used, Device::Cuda(_)) {
        synth = l.with_cpu_fallback(synth);
    }
    tracing::info!(voice = %voice.name, device = %l.used, sessions = l.layout.sessions,
        intra = l.layout.intra, plan = ?plan, "engine ready");
    Ok(Loaded {
        synth,
        in_flight: l.layout.sessions + 1,
        plan,
        calibration,
        profile: Some(profile),
        runtime: Some(l.runtime).filter(|r| r != "unknown"),
        arena: l.arena,
        device_fallback: selected.fallback.clone(),
    })
}

/// What [`load`] knows while it goes.
struct Loader<'a> {
    paths: &'a Paths,
    opts: &'a EngineOptions,
    voice: &'a Voice,
    rt: &'static Runtime,
    arena: Arc<ArenaPolicy>,
    cores: usize,
    layout: Layout,
    /// The device the sessions run on (a claimed GPU under the memory-limit hook).
    used: Device,
    /// `used` as the planner sees it.
    spec: DeviceSpec,
    /// The ONNX Runtime version (`unknown` when its library's name does not tell).
    runtime: String,
    /// Whether thread layouts and graphs are measured here (the CPU, for real).
    measure_cpu: bool,
    /// Graphs this voice has installed for the device, the default first (Kokoro's int8
    /// and fp32 on CPU); empty where there is nothing to choose.
    graphs: Vec<&'static str>,
    /// The graph the running sessions loaded, where there was a choice.
    loaded_graph: Option<String>,
}

impl Loader<'_> {
    fn session_options(&self) -> SessionOptions {
        SessionOptions {
            intra_threads: self.layout.intra,
            device: self.used,
            gpu_mem_limit: self.opts.gpu_mem_limit_mib.map(|m| m << 20),
            spin: !self.opts.no_spin && !self.layout.on_gpu,
            cpu_arena: self.arena.clone(),
            pad_multiple: self
                .opts
                .pad_to
                .unwrap_or(if self.layout.on_gpu { 16 } else { 1 })
                .max(1),
            graph: None,
        }
    }

    /// Step 1: the sessions (or, under the memory-limit hook, CPU sessions behind a
    /// claimed GPU's limit) and the phonemizer; what loading added to resident memory
    /// (weights, prepacked copies), which the calibration weighs layouts with.
    fn open_sessions(
        &mut self,
        device: Device,
        profile: &HardwareProfile,
    ) -> anyhow::Result<(Synthesizer, Option<u64>)> {
        let session = SessionOptions {
            device,
            ..self.session_options()
        };
        let sessions = self.layout.sessions;
        let rss_before = narrator_hardware::memory::process_rss();
        let pool = match self.opts.hooks.gpu_memory_tokens {
            None => EnginePool::start(
                self.rt,
                self.voice.family.clone(),
                PoolOptions { sessions, session },
            ),
            Some(limit) => {
                let (family, rt) = (self.voice.family.clone(), self.rt);
                EnginePool::start_with(sessions, move |_| {
                    let cpu = SessionOptions {
                        device: Device::Cpu,
                        ..session.clone()
                    };
                    Ok(Box::new(MemoryLimit {
                        inner: family.open(rt, &cpu)?,
                        max_tokens: limit,
                        device: Device::Cuda(0),
                    }) as Box<dyn Backend>)
                })
            }
        }
        .with_context(|| format!("loading voice {}", self.voice.name))?;
        let load_bytes = rss_added_since(rss_before);
        let phonemizer = Phonemizer::new(&self.paths.espeak_parent)?;
        let scales = self.opts.scales.resolve(self.voice.family.default_scales());
        let synth = Synthesizer::new(self.voice, phonemizer, pool, scales)?;
        self.used = synth.pool().device();
        self.spec = device_spec(self.used, profile, &self.opts.hooks);
        self.measure_cpu = matches!(self.spec, DeviceSpec::Cpu { .. })
            && self.opts.hooks.gpu_memory_tokens.is_none();
        if self.measure_cpu {
            self.graphs = self.voice.family.graphs(self.used);
        }
        self.loaded_graph = self.graphs.first().map(|g| g.to_string());
        Ok((synth, load_bytes))
    }

    /// A CPU pool of (sessions, intra-op threads, graph), as calibrations compare them.
    fn cpu_pool(
        &self,
        sessions: usize,
        intra: usize,
        graph: Option<&str>,
    ) -> anyhow::Result<EnginePool> {
        EnginePool::start(
            self.rt,
            self.voice.family.clone(),
            PoolOptions {
                sessions,
                session: SessionOptions {
                    intra_threads: intra,
                    device: Device::Cpu,
                    gpu_mem_limit: None,
                    spin: !self.opts.no_spin,
                    cpu_arena: self.arena.clone(),
                    pad_multiple: 1,
                    graph: graph.map(str::to_string),
                },
            },
        )
        .with_context(|| format!("loading voice {} with {sessions} sessions", self.voice.name))
    }

    fn cache_path(&self) -> std::path::PathBuf {
        calibration_path(
            self.paths,
            &self.voice.name,
            &self.spec.model(),
            &self.runtime,
            &self.layout.cache_name(),
        )
    }

    /// Step 2: a calibration to plan with, unless `planning` says measure: the fleet's
    /// for this GPU model (with where it came from), else this machine's cached one.
    fn find_calibration(
        &self,
        planning: Planning,
        catalog: &Catalog,
    ) -> Option<(Calibration, Option<String>)> {
        if planning == Planning::Recalibrate {
            return None;
        }
        let known = match &self.spec {
            DeviceSpec::Gpu { .. } => {
                catalog.find(&self.voice.name, &self.spec.model(), &self.runtime)
            }
            DeviceSpec::Cpu { .. } => None,
        };
        match known {
            Some((c, origin)) => {
                let mut c = c.clone();
                c.source = CalibrationSource::Catalog;
                c.device_model = self.spec.model();
                Some((c, Some(origin.0.clone())))
            }
            None => cache::read_cached(&self.cache_path()).map(|c| (c, None)),
        }
    }

    /// Step 3a: run as a cached calibration chose: its thread layout (when the layout is
    /// measured) and its graph, if that is still installed.
    fn apply_cached(&mut self, c: Calibration, synth: &Synthesizer) -> anyhow::Result<Calibration> {
        let graph = c.graph.as_deref().filter(|g| {
            self.graphs
                .get(1..)
                .is_some_and(|others| others.contains(g))
        });
        if let Some(g) = graph {
            self.loaded_graph = Some(g.to_string());
        }
        let relayout = self.layout.auto
            && self.measure_cpu
            && (c.sessions, c.intra_threads) != (self.layout.sessions, self.layout.intra);
        if relayout {
            (self.layout.sessions, self.layout.intra) = (c.sessions, c.intra_threads);
        }
        if relayout || graph.is_some() {
            synth.set_pool(self.cpu_pool(self.layout.sessions, self.layout.intra, graph)?);
        }
        Ok(c)
    }

    /// Step 3b: measure now, and cache it: the thread layout and the graph (CPU), then the
    /// batch sweep.
    fn measure(
        &mut self,
        synth: &mut Synthesizer,
        pool_load_bytes: Option<u64>,
    ) -> anyhow::Result<Calibration> {
        let (mut layouts, layout_reason, memory) = self.measure_layouts(synth, pool_load_bytes)?;
        let (graph, graph_reason) = self.measure_graphs(synth, memory, &mut layouts)?;
        let mut c = self.sweep_batches(synth)?;
        c.layouts = layouts;
        c.layout_reason = layout_reason;
        c.graph = graph;
        c.graph_reason = graph_reason;
        cache::write_cached(&self.cache_path(), &c);
        Ok(c)
    }

    /// The default layout (one single-threaded session per core) against one session on
    /// every core: the default stays unless the other is faster by the knee gain, so a
    /// calibration confirms what an uncalibrated run already does. When memory is tight,
    /// throughput per GiB decides ([`narrator_hardware::choose_layout`]). Returns both
    /// points, why, and the running layout's measured peak memory.
    fn measure_layouts(
        &mut self,
        synth: &mut Synthesizer,
        pool_load_bytes: Option<u64>,
    ) -> anyhow::Result<(Vec<LayoutPoint>, String, Option<u64>)> {
        let Layout {
            sessions, intra, ..
        } = self.layout;
        if !(self.layout.auto && self.measure_cpu && sessions >= 2) {
            return Ok((Vec::new(), String::new(), None));
        }
        let cores = self.cores;
        let default_pool = synth.pool();
        let rss_before_one = narrator_hardware::memory::process_rss();
        synth.set_pool(self.cpu_pool(1, cores, None)?);
        let one_load_bytes = rss_added_since(rss_before_one);
        let rounds = self.opts.hooks.calibration_effort().0;
        let (m_one, m_many) = tokio::task::block_in_place(|| {
            crate::calibrate::compare_layouts(synth, &default_pool, ITEM_TOKENS, rounds)
        })
        .with_context(|| format!("comparing thread layouts for voice {}", self.voice.name))?;
        let sum = |a: Option<u64>, b: Option<u64>| Some(a? + b?);
        let one = LayoutPoint {
            sessions: 1,
            intra_threads: cores,
            throughput: m_one.x,
            memory_bytes: sum(one_load_bytes, m_one.work_bytes),
            range: Some(m_one.range),
            graph: None,
        };
        let many = LayoutPoint {
            sessions,
            intra_threads: intra,
            throughput: m_many.x,
            memory_bytes: sum(pool_load_bytes, m_many.work_bytes),
            range: Some(m_many.range),
            graph: None,
        };
        let (chosen, why) = narrator_hardware::choose_layout(
            &many,
            &one,
            available_bytes(&self.spec),
            narrator_hardware::LAYOUT_SWITCH_GAIN,
        );
        let switch = chosen == &one;
        tracing::info!(
            one_x = one.throughput,
            many_x = many.throughput,
            one_bytes = one.memory_bytes,
            many_bytes = many.memory_bytes,
            cores,
            "thread layouts measured: {why}"
        );
        let memory = if switch {
            one.memory_bytes
        } else {
            many.memory_bytes
        };
        if switch {
            (self.layout.sessions, self.layout.intra) = (1, cores);
        } else {
            synth.set_pool(match Arc::try_unwrap(default_pool) {
                Ok(pool) => pool,
                Err(_) => self.cpu_pool(sessions, intra, None)?,
            });
        }
        Ok((vec![one, many], why, memory))
    }

    /// Each other graph against the default in the layout chosen; the first that wins
    /// by [`narrator_hardware::GRAPH_SWITCH_GAIN`] is loaded. Returns the graph chosen
    /// (`None`: the default) and why; the points measured go to `layouts`.
    fn measure_graphs(
        &mut self,
        synth: &Synthesizer,
        default_memory: Option<u64>,
        layouts: &mut Vec<LayoutPoint>,
    ) -> anyhow::Result<(Option<String>, String)> {
        let (mut graph, mut graph_reason) = (None, String::new());
        let graphs = self.graphs.clone();
        if let [default_graph, others @ ..] = graphs.as_slice() {
            for other in others {
                let (switch, why, points) =
                    self.compare_graph(synth, (default_graph, other), default_memory)?;
                layouts.extend(points);
                graph_reason = why;
                if switch {
                    graph = Some(other.to_string());
                    self.loaded_graph = graph.clone();
                    break;
                }
            }
        }
        Ok((graph, graph_reason))
    }

    /// Times `other` against the default graph in the current layout and loads it into
    /// `synth` if [`narrator_hardware::choose_layout`] says it wins. Returns whether it
    /// did, why, and both measurements for the calibration's record.
    fn compare_graph(
        &self,
        synth: &Synthesizer,
        (default_graph, other): (&str, &str),
        default_memory: Option<u64>,
    ) -> anyhow::Result<(bool, String, Vec<LayoutPoint>)> {
        let Layout {
            sessions, intra, ..
        } = self.layout;
        let rss_before = narrator_hardware::memory::process_rss();
        let other_pool = self.cpu_pool(sessions, intra, Some(other))?;
        let other_load = rss_added_since(rss_before);
        let rounds = self.opts.hooks.calibration_effort().0;
        let (a, b) = tokio::task::block_in_place(|| {
            crate::calibrate::compare_graphs(synth, &other_pool, ITEM_TOKENS, rounds)
        })
        .with_context(|| {
            format!(
                "comparing the graphs {default_graph} and {other} of voice {}",
                self.voice.name
            )
        })?;
        let point = |graph: &str, m: &crate::calibrate::Measured, load: Option<u64>| LayoutPoint {
            sessions,
            intra_threads: intra,
            throughput: m.x,
            memory_bytes: load.zip(m.work_bytes).map(|(l, w)| l + w),
            range: Some(m.range),
            graph: Some(graph.to_string()),
        };
        // The default graph's memory as its layout was measured (its first runs grew its
        // arenas there; here they are warm), where it was.
        let mut d = point(default_graph, &a, None);
        d.memory_bytes = default_memory;
        let o = point(other, &b, other_load);
        let (chosen, why) = narrator_hardware::choose_layout(
            &d,
            &o,
            available_bytes(&self.spec),
            narrator_hardware::GRAPH_SWITCH_GAIN,
        );
        tracing::info!(
            default_x = d.throughput,
            other_x = o.throughput,
            "graphs measured: {why}"
        );
        let switch = chosen == &o;
        if switch {
            synth.set_pool(other_pool);
        }
        Ok((switch, why, vec![d, o]))
    }

    /// The batch sweep ([`calibrate`]): throughput and memory by batch size, up to the
    /// device's memory less the safety margin.
    fn sweep_batches(&self, synth: &Synthesizer) -> anyhow::Result<Calibration> {
        let name = &self.voice.name;
        eprintln!(
            "calibrating {name} on {} (up to 30 s, once per voice, device and runtime)",
            self.spec.label()
        );
        let on_gpu = matches!(self.spec, DeviceSpec::Gpu { .. });
        let gpu_index = match self.used {
            Device::Cuda(i) => i,
            _ => 0,
        };
        let memory_now = move || {
            if on_gpu {
                narrator_hardware::memory::gpu_used_bytes(gpu_index)
                    .or_else(narrator_hardware::memory::process_peak_rss)
            } else {
                narrator_hardware::memory::process_peak_rss()
            }
        };
        let reset = || {
            narrator_hardware::memory::reset_peak_rss();
        };
        let free = match &self.spec {
            DeviceSpec::Gpu { free_bytes, .. } => *free_bytes,
            DeviceSpec::Cpu {
                available_bytes, ..
            } => *available_bytes,
        };
        let limits = PlanLimits::default();
        let opts = CalibrateOptions {
            voice: name.clone(),
            device_model: self.spec.model(),
            runtime: self.runtime.clone(),
            item_tokens: ITEM_TOKENS,
            max_batch: 256,
            max_duration: self.opts.hooks.calibration_effort().1,
            knee_gain: limits.knee_gain,
            memory_limit: (free as f64 * (1.0 - limits.safety_margin)) as u64,
            memory_now: &memory_now,
            reset: &reset,
            intra_threads: self.layout.intra,
            sessions: self.layout.sessions,
        };
        tokio::task::block_in_place(|| calibrate(synth, &opts))
            .with_context(|| format!("calibrating voice {name}"))
    }

    /// Step 4: the plan from the calibration, or the uncalibrated default: the measured
    /// CPU default (one item per run), or a conservative GPU batch until a worker
    /// calibrates. The layout and graph are what runs.
    fn plan_from(&self, calibration: Option<&Calibration>, catalog_origin: Option<&str>) -> Plan {
        let limits = PlanLimits::default();
        let spec = &self.spec;
        let mut plan = match calibration {
            Some(c) if c.source == CalibrationSource::Catalog => {
                let mut p = narrator_hardware::plan(spec, c, &limits);
                p.reason = format!(
                    "calibration of {} from {}: {}",
                    spec.model(),
                    catalog_origin.unwrap_or("the catalog"),
                    p.reason
                );
                p
            }
            Some(c) => narrator_hardware::plan(spec, c, &limits),
            None => {
                let mut c = Calibration::supplied(&self.voice.name, 0.0, ITEM_TOKENS);
                c.device_model = spec.model();
                let mut p = narrator_hardware::plan(spec, &c, &limits);
                if let DeviceSpec::Gpu { .. } = spec {
                    p.batch_items = 8;
                    p.max_batch_tokens = 8 * ITEM_TOKENS;
                    p.max_batch_requests = 8 * ITEM_TOKENS / limits.short_item_tokens;
                    p.max_wait_ms = 5;
                    p.prefetch = 2 * p.max_batch_requests + 1;
                    p.reason = "no calibration cached for this GPU: 8 sentence-sized items; run `narrator plan` to calibrate".into();
                }
                p
            }
        };
        plan.sessions = self.layout.sessions;
        plan.intra_threads = self.layout.intra;
        plan.graph = self.loaded_graph.clone();
        plan
    }

    /// Step 5: what flags and the model fix over the plan: `--max-batch`, runs packed for
    /// a family without a batch dimension, one item per run where batching is not exact;
    /// and the arena kept at sentence-sized runs when several CPU sessions share memory.
    fn apply_overrides(&self, plan: &mut Plan, synth: &Synthesizer, calibrated: bool) {
        let sessions = self.layout.sessions;
        if self.measure_cpu && sessions > 1 && self.arena.mode() == CpuArena::Bounded {
            // Each session's arena would keep the largest run it ever made, and several of
            // them add up: keep them at sentence-sized runs, larger runs give back theirs.
            self.arena.settle_at(MULTI_SESSION_KEPT_TOKENS);
        }
        if !self.layout.auto || self.opts.max_batch.is_some() {
            plan.source.flags = true;
        }
        if let Some(n) = self.opts.max_batch {
            plan.max_batch_requests = n.max(1);
            plan.max_batch_tokens = n.max(1) * MAX_ITEM_TOKENS;
            plan.batch_items = n.max(1);
            plan.prefetch = 2 * plan.max_batch_requests * sessions + sessions;
            plan.reason = format!(
                "set by --max-batch {n} (the measured plan was: {})",
                plan.reason
            );
        }
        let caps = synth.capabilities();
        if caps.batching == Batching::Packed && synth.pool().supports_batching() {
            if !calibrated && self.opts.max_batch.is_none() && self.layout.on_gpu {
                // No batch dimension: on a GPU, sentences packed end to end into one model
                // run (cut at their token boundaries) are how one run fills the device. On
                // CPU one sentence per run stays the default: packing measured no faster on
                // 2 cores and took 250 MiB more (Kokoro, 297 words, 3 rounds: 29.4 s both,
                // 1,168 against 917 MiB peak; docs/BENCHMARKS.md, issue 28).
                plan.max_batch_tokens = caps.max_run_ids;
                plan.max_batch_requests = PACKED_RUN_ITEMS;
                plan.batch_items = PACKED_RUN_ITEMS;
                plan.prefetch = 2 * PACKED_RUN_ITEMS * sessions + sessions;
                plan.reason = format!(
                    "no batch dimension: sentences packed into runs of up to {} ids, cut at their exact token boundaries",
                    caps.max_run_ids
                );
            } else if plan.max_batch_tokens > caps.max_run_ids {
                plan.max_batch_tokens = caps.max_run_ids;
                plan.reason = format!(
                    "{} (runs packed up to the model's {} ids)",
                    plan.reason, caps.max_run_ids
                );
            }
        }
        if !synth.pool().supports_batching() {
            plan.max_batch_requests = 1;
            plan.reason = format!(
                "{} (this voice cannot be batched exactly: one item per run)",
                plan.reason
            );
        }
    }

    /// Step 6 (GPU): after repeated out-of-memory failures, the same voice on CPU, one
    /// item per run.
    fn with_cpu_fallback(&self, synth: Synthesizer) -> Synthesizer {
        let (family, rt) = (self.voice.family.clone(), self.rt);
        let cpu = SessionOptions {
            intra_threads: self.cores,
            device: Device::Cpu,
            gpu_mem_limit: None,
            spin: !self.opts.no_spin,
            cpu_arena: self.arena.clone(),
            pad_multiple: 1,
            graph: None,
        };
        synth.with_fallback(Box::new(move || {
            let pool = EnginePool::start(
                rt,
                family.clone(),
                PoolOptions {
                    sessions: 1,
                    session: cpu.clone(),
                },
            )?;
            Ok((pool, Budget::single()))
        }))
    }
}

/// The voice's phonemizer with the null engine (silence of the right length, instantly):
/// everything around inference runs for real, for control-plane benchmarks and tests.
/// Its plan is fixed (`max_batch`, default 32); the `gpu_memory_tokens` hook puts it
/// behind a claimed GPU's memory limit, with the null engine on CPU as the fallback, and
/// `run_ms` paces every run.
pub fn load_null(
    paths: &Paths,
    opts: &EngineOptions,
    voice: Voice,
    samples_per_id: usize,
) -> anyhow::Result<Loaded> {
    let limit = opts.hooks.gpu_memory_tokens;
    let pace = opts.hooks.run_ms;
    let pool = EnginePool::start_with(1, move |_| {
        let mut null =
            Box::new(narrator_engine::NullBackend { samples_per_id }) as Box<dyn Backend>;
        if let Some(per_run) = pace {
            null = Box::new(narrator_engine::Paced {
                inner: null,
                per_run,
            });
        }
        Ok(match limit {
            Some(max_tokens) => Box::new(MemoryLimit {
                inner: null,
                max_tokens,
                device: Device::Cuda(0),
            }),
            None => null,
        })
    })?;
    let scales = opts.scales.resolve(voice.family.default_scales());
    let phonemizer = Phonemizer::new(&paths.espeak_parent)?;
    let n = opts.max_batch.unwrap_or(32).max(1);
    let mut synth = Synthesizer::new(&voice, phonemizer, pool, scales)?.with_budget(Budget {
        max_tokens: n * MAX_ITEM_TOKENS,
        max_requests: n,
        max_wait: Duration::ZERO,
    });
    if limit.is_some() {
        synth = synth.with_fallback(Box::new(move || {
            let pool = EnginePool::start_with(1, move |_| {
                Ok(Box::new(narrator_engine::NullBackend { samples_per_id }) as Box<dyn Backend>)
            })?;
            Ok((pool, Budget::single()))
        }));
    }
    let device = synth.pool().device();
    let plan = Plan {
        device: device.to_string(),
        device_model: if limit.is_some() {
            "test GPU (memory limit)".into()
        } else {
            "cpu".into()
        },
        max_batch_tokens: n * MAX_ITEM_TOKENS,
        max_batch_requests: n,
        max_wait_ms: 0,
        intra_threads: 1,
        sessions: 1,
        prefetch: 2 * n + 1,
        memory_budget_bytes: 0,
        batch_items: n,
        reason: "null engine: fixed plan (--max-batch)".into(),
        source: PlanOrigin::Flags.into(),
        graph: None,
    };
    Ok(Loaded {
        synth,
        in_flight: 4,
        plan,
        calibration: None,
        profile: None,
        runtime: None,
        arena: ArenaPolicy::new(opts.cpu_arena),
        device_fallback: None,
    })
}

#[cfg(test)]
mod tests {
    use super::expand_devices;

    #[test]
    fn auto_drives_every_gpu_or_the_cpu() {
        let ok = |spec: &str, cuda: bool, gpus: &[u32]| {
            expand_devices(spec, cuda, gpus).unwrap_or_default()
        };
        assert_eq!(ok("auto", true, &[0, 1, 2]), ["cuda:0", "cuda:1", "cuda:2"]);
        assert_eq!(ok("auto", false, &[0, 1]), ["cpu"]);
        assert_eq!(ok("auto", true, &[]), ["cuda:0"]);
        assert_eq!(ok("cuda:1", true, &[0, 1]), ["cuda:1"]);
        assert_eq!(ok("cuda:0, cuda:1", true, &[0, 1]), ["cuda:0", "cuda:1"]);
        assert_eq!(ok("cuda", true, &[0]), ["cuda:0"]);
        let err = expand_devices("gpu7", true, &[0])
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("unknown device"), "{err}");
        assert!(expand_devices(" , ", true, &[0]).is_err());
    }
}
