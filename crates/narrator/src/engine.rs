//! Wiring one voice to a synthesizer: runtime, sessions, phonemizer, batch plan.

use anyhow::Context;
use std::sync::Arc;

use narrator_engine::{
    ArenaPolicy, Backend, Batching, Device, EnginePool, MemoryLimit, PoolOptions, Scales,
    SessionOptions, Voice,
};
use narrator_hardware::{
    Calibration, CalibrationSource, Catalog, DeviceSpec, HardwareProfile, Plan, PlanLimits,
    PlanOrigin,
};
use narrator_phonemes::Phonemizer;
use narrator_pipeline::{Budget, CalibrateOptions, Synthesizer, calibrate};

use crate::cli::EngineArgs;
use crate::paths::Paths;

/// A loaded voice and how it will be run.
pub(crate) struct Loaded {
    pub(crate) synth: Synthesizer,
    pub(crate) in_flight: usize,
    /// The plan the budget came from.
    pub(crate) plan: Plan,
    /// The calibration the plan used (measured, cached or none).
    pub(crate) calibration: Option<Calibration>,
    /// The machine as probed while loading (`None` for the null engine).
    pub(crate) profile: Option<HardwareProfile>,
    /// The ONNX Runtime version, when the library's name tells it.
    pub(crate) runtime: Option<String>,
    /// The sessions' CPU arena policy: settle it once warmed up.
    #[cfg_attr(not(feature = "fleet"), allow(dead_code))] // the worker settles it
    pub(crate) arena: Arc<ArenaPolicy>,
    /// Why `--device auto` runs on the CPU although a GPU or a CUDA build is here.
    pub(crate) device_fallback: Option<String>,
}

impl Loaded {
    /// The plan with what actually runs (after flags and the engine's limits).
    pub(crate) fn plan_json(&self) -> serde_json::Value {
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
pub(crate) enum Planning {
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
#[cfg_attr(not(feature = "fleet"), allow(dead_code))] // the worker's
pub(crate) fn expand_devices(spec: &str, cuda: bool, gpus: &[u32]) -> anyhow::Result<Vec<String>> {
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

/// Finds the voice (cheap, so bad names fail before anything heavy is loaded).
pub(crate) fn find_voice(paths: &Paths, args: &EngineArgs) -> anyhow::Result<Voice> {
    Ok(Voice::find(&paths.voices, &args.voice)?)
}

/// The voice's scales with the flags' overrides (`--speed S` is a length scale of 1/S).
pub(crate) fn scales(args: &EngineArgs, voice: &Voice) -> Scales {
    let d = voice.family.default_scales();
    let length = match args.speed {
        Some(speed) => d.length / speed,
        None => args.length_scale.unwrap_or(d.length),
    };
    Scales {
        noise: args.noise_scale.unwrap_or(d.noise),
        length,
        noise_w: args.noise_w.unwrap_or(d.noise_w),
    }
}

/// Longest utterance the phonemizer hands the engine (a `--max-batch N` budget is N of them).
pub(crate) const MAX_ITEM_TOKENS: usize = narrator_pipeline::synth::MAX_PHONEMES + 2;

/// Sentences one packed run may hold (a family without a batch dimension).
const PACKED_RUN_ITEMS: usize = 16;

/// Sentence-sized calibration items, in padded tokens.
pub(crate) const ITEM_TOKENS: usize = 128;

/// The model name of a GPU NVML does not describe: never shared with the fleet.
pub(crate) const UNKNOWN_GPU: &str = "unknown GPU";

/// The device as the planner sees it: the GPU's memory from NVML, or this machine's cores
/// and available memory (cgroup limits included).
pub(crate) fn device_spec(device: Device, profile: &HardwareProfile) -> DeviceSpec {
    match device {
        Device::Cuda(i) => match profile.gpus.iter().find(|g| g.index == i) {
            Some(g) => DeviceSpec::Gpu {
                name: g.name.clone(),
                index: i,
                total_bytes: g.memory_total_bytes,
                free_bytes: g.memory_free_bytes,
            },
            // CUDA without NVML (or a test's claimed GPU): plan as an unknown 16 GiB card
            // (tests name the model with NARRATOR_TEST_GPU_MODEL).
            None => DeviceSpec::Gpu {
                name: std::env::var("NARRATOR_TEST_GPU_MODEL")
                    .unwrap_or_else(|_| UNKNOWN_GPU.into()),
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

fn slug(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
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

/// Opens a CPU pool of (sessions, intra-op threads, graph).
type CpuPool<'a> = dyn Fn(usize, usize, Option<&str>) -> anyhow::Result<EnginePool> + 'a;

/// Times `other` against the default graph in the layout chosen (`sessions`, `intra`)
/// and loads it into `synth` if [`narrator_hardware::choose_layout`] says it wins by
/// [`narrator_hardware::GRAPH_SWITCH_GAIN`]. Returns the graph chosen (`None`: the
/// default), why, and both measurements for the calibration's record.
fn compare_graphs(
    name: &str,
    synth: &Synthesizer,
    (default_graph, other): (&str, &str),
    (sessions, intra): (usize, usize),
    default_memory: Option<u64>,
    cpu_pool: &CpuPool<'_>,
    spec: &DeviceSpec,
) -> anyhow::Result<(Option<String>, String, Vec<narrator_hardware::LayoutPoint>)> {
    let rss_before = narrator_hardware::memory::process_rss();
    let other_pool = cpu_pool(sessions, intra, Some(other))?;
    let other_load = rss_added_since(rss_before);
    let (a, b) = tokio::task::block_in_place(|| {
        narrator_pipeline::calibrate::compare_graphs(
            synth,
            &other_pool,
            ITEM_TOKENS,
            calibration_effort().0,
        )
    })
    .with_context(|| format!("comparing the graphs {default_graph} and {other} of voice {name}"))?;
    let point = |graph: &str, m: &narrator_pipeline::calibrate::Measured, load: Option<u64>| {
        narrator_hardware::LayoutPoint {
            sessions,
            intra_threads: intra,
            throughput: m.x,
            memory_bytes: load.zip(m.work_bytes).map(|(l, w)| l + w),
            range: Some(m.range),
            graph: Some(graph.to_string()),
        }
    };
    // The default graph's memory as its layout was measured (its first runs grew its
    // arenas there; here they are warm), where it was.
    let mut d = point(default_graph, &a, None);
    d.memory_bytes = default_memory;
    let o = point(other, &b, other_load);
    let available = match spec {
        DeviceSpec::Cpu {
            available_bytes, ..
        } => *available_bytes,
        DeviceSpec::Gpu { .. } => u64::MAX,
    };
    let (chosen, why) =
        narrator_hardware::choose_layout(&d, &o, available, narrator_hardware::GRAPH_SWITCH_GAIN);
    tracing::info!(
        default_x = d.throughput,
        other_x = o.throughput,
        "graphs measured: {why}"
    );
    let switch = chosen == &o;
    if switch {
        synth.set_pool(other_pool);
    }
    Ok((switch.then(|| other.to_string()), why, vec![d, o]))
}

/// Resident memory added since `before` (a [`narrator_hardware::memory::process_rss`]).
fn rss_added_since(before: Option<u64>) -> Option<u64> {
    Some(narrator_hardware::memory::process_rss()?.saturating_sub(before?))
}

/// Where a calibration of this voice, device model, runtime and thread layout is cached.
pub(crate) fn calibration_path(
    paths: &Paths,
    voice: &str,
    model: &str,
    runtime: &str,
    layout: &str,
) -> std::path::PathBuf {
    paths.cache.join("calibration").join(format!(
        "{}__{}__ort-{}__{layout}.json",
        slug(voice),
        slug(model),
        slug(runtime)
    ))
}

fn read_cached(path: &std::path::Path) -> Option<Calibration> {
    let text = std::fs::read_to_string(path).ok()?;
    match serde_json::from_str::<Calibration>(&text) {
        Ok(mut c) => {
            c.source = CalibrationSource::Cache;
            Some(c)
        }
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "ignoring an unreadable cached calibration");
            None
        }
    }
}

fn write_cached(path: &std::path::Path, c: &Calibration) {
    let write = || -> std::io::Result<()> {
        let dir = path.parent().unwrap_or(std::path::Path::new("."));
        std::fs::create_dir_all(dir)?;
        // A temporary file of its own: workers that share the cache (one volume, several
        // containers, each its own PID 1) may write the same calibration at once.
        let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
        // Readable by every user, as a plainly written file would be (tempfile makes 0600).
        #[cfg(unix)]
        tmp.as_file()
            .set_permissions(std::os::unix::fs::PermissionsExt::from_mode(0o644))?;
        std::io::Write::write_all(&mut tmp, &serde_json::to_vec_pretty(c).unwrap_or_default())?;
        tmp.persist(path).map(|_| ()).map_err(|e| e.error)
    };
    if let Err(e) = write() {
        tracing::warn!(path = %path.display(), error = %e, "cannot cache the calibration");
    }
}

/// Test hook: `NARRATOR_TEST_GPU_MEMORY_TOKENS=N` makes the engine claim to be `cuda:0`
/// with room for N padded tokens per run, so the out-of-memory path (halve, retry, fall
/// back to CPU) runs on machines without a GPU.
fn test_memory_limit() -> Option<usize> {
    std::env::var("NARRATOR_TEST_GPU_MEMORY_TOKENS")
        .ok()
        .and_then(|v| v.parse().ok())
}

/// How a calibration measures: rounds of each side-by-side comparison (layouts, graphs)
/// and the batch sweep's time budget. Test hook: `NARRATOR_TEST_QUICK_CALIBRATION` set
/// makes it one round and batch 1 only, for tests of what a calibration records and how
/// runs use it rather than of what it measures (Kokoro's takes minutes on two cores).
fn calibration_effort() -> (usize, std::time::Duration) {
    if std::env::var_os("NARRATOR_TEST_QUICK_CALIBRATION").is_some() {
        (1, std::time::Duration::ZERO)
    } else {
        (3, std::time::Duration::from_secs(25))
    }
}

/// Loads the runtime, the sessions and the phonemizer for `voice`, and plans its batches.
pub(crate) fn load(
    paths: &Paths,
    args: &EngineArgs,
    voice: Voice,
    planning: Planning,
) -> anyhow::Result<Loaded> {
    load_with(paths, args, voice, planning, &Catalog::default())
}

/// [`load`], with calibrations by GPU model: on a GPU whose model `catalog` knows, the
/// plan comes from that calibration and nothing is measured (unless `planning` is
/// [`Planning::Recalibrate`]).
pub(crate) fn load_with(
    paths: &Paths,
    args: &EngineArgs,
    voice: Voice,
    planning: Planning,
    catalog: &Catalog,
) -> anyhow::Result<Loaded> {
    let selected = crate::gpu::runtime(paths, &args.device)?;
    let rt = selected.rt;
    let device: Device = selected
        .device_spec(&args.device)
        .parse()
        .map_err(anyhow::Error::msg)?;
    let arena = ArenaPolicy::new(args.cpu_arena);
    let profile = narrator_hardware::probe();
    let cores = profile.cpu.usable_cores.max(1);
    // The thread layout is measured on CPU unless a flag fixes it.
    let auto_layout = args.sessions.is_none() && args.intra_threads.is_none();
    // On a GPU the CPU threads only feed it: one non-spinning intra-op thread per session
    // leaves the cores to the phonemizer and the encoders; padded lengths are rounded to
    // 16 tokens so cuDNN sees few distinct shapes.
    let on_gpu = match device {
        Device::Cuda(_) => true,
        Device::Auto => rt.cuda_available,
        Device::Cpu => false,
    };
    let default_sessions = if on_gpu || !auto_layout {
        1
    } else {
        default_cpu_sessions(cores, profile.memory.available_bytes)
    };
    let mut sessions = args.sessions.unwrap_or(default_sessions).max(1);
    let mut intra = args
        .intra_threads
        .unwrap_or_else(|| if on_gpu { 1 } else { (cores / sessions).max(1) });
    let session = SessionOptions {
        intra_threads: intra,
        device,
        gpu_mem_limit: args.gpu_mem_limit_mib.map(|m| m << 20),
        spin: !args.no_spin && !on_gpu,
        cpu_arena: arena.clone(),
        pad_multiple: args.pad_to.unwrap_or(if on_gpu { 16 } else { 1 }).max(1),
        graph: None,
    };
    // What loading the sessions adds to resident memory (weights, prepacked copies): the
    // calibration weighs each thread layout's memory with it.
    let rss_before_pool = narrator_hardware::memory::process_rss();
    let pool = match test_memory_limit() {
        None => EnginePool::start(
            rt,
            voice.family.clone(),
            PoolOptions {
                sessions,
                session: session.clone(),
            },
        ),
        Some(limit) => {
            let family = voice.family.clone();
            let s = session.clone();
            EnginePool::start_with(sessions, move |_| {
                let cpu = SessionOptions {
                    device: Device::Cpu,
                    ..s.clone()
                };
                Ok(Box::new(MemoryLimit {
                    inner: family.open(rt, &cpu)?,
                    max_tokens: limit,
                    device: Device::Cuda(0),
                }) as Box<dyn Backend>)
            })
        }
    }
    .with_context(|| format!("loading voice {}", voice.name))?;
    let pool_load_bytes = rss_added_since(rss_before_pool);
    let scales = scales(args, &voice);
    let phonemizer = Phonemizer::new(&paths.espeak_parent)?;
    let name = voice.name.clone();
    let mut synth = Synthesizer::new(&voice, phonemizer, pool, scales)?;
    let used = synth.pool().device();
    let spec = device_spec(used, &profile);
    let runtime = narrator_hardware::doctor::version_from_library_path(&rt.library)
        .unwrap_or_else(|| "unknown".into());
    let layout = if auto_layout {
        "auto".to_string()
    } else {
        format!("{intra}x{sessions}")
    };
    let cache = calibration_path(paths, &name, &spec.model(), &runtime, &layout);
    let on_cpu = matches!(spec, DeviceSpec::Cpu { .. }) && test_memory_limit().is_none();
    let cpu_pool = |sessions: usize, intra: usize, graph: Option<&str>| {
        EnginePool::start(
            rt,
            voice.family.clone(),
            PoolOptions {
                sessions,
                session: SessionOptions {
                    intra_threads: intra,
                    device: Device::Cpu,
                    gpu_mem_limit: None,
                    spin: !args.no_spin,
                    cpu_arena: arena.clone(),
                    pad_multiple: 1,
                    graph: graph.map(str::to_string),
                },
            },
        )
        .with_context(|| format!("loading voice {name} with {sessions} sessions"))
    };
    // Graphs this voice has installed for the device, the default first (Kokoro's int8
    // and fp32 on CPU): a calibration times them in the layout that runs (measured, or
    // fixed by flags); empty where there is nothing to choose.
    let graphs = if on_cpu {
        voice.family.graphs(used)
    } else {
        Vec::new()
    };
    let limits = PlanLimits::default();
    let known = match &spec {
        DeviceSpec::Gpu { .. } => catalog.find(&name, &spec.model(), &runtime),
        DeviceSpec::Cpu { .. } => None,
    };
    let known_origin = known.map(|(_, o)| o.0.clone());
    let cached = match planning {
        Planning::Recalibrate => None,
        _ => match known {
            Some((c, _)) => {
                let mut c = c.clone();
                c.source = CalibrationSource::Catalog;
                c.device_model = spec.model();
                Some(c)
            }
            None => read_cached(&cache),
        },
    };
    // The graph the running sessions loaded, where there was a choice.
    let mut loaded_graph = graphs.first().map(|g| g.to_string());
    let calibration = match (cached, planning) {
        (Some(c), _) => {
            // A graph the cached calibration chose, if it is still installed.
            let graph = c
                .graph
                .as_deref()
                .filter(|g| graphs.get(1..).is_some_and(|others| others.contains(g)));
            if let Some(g) = graph {
                loaded_graph = Some(g.to_string());
            }
            let relayout =
                auto_layout && on_cpu && (c.sessions, c.intra_threads) != (sessions, intra);
            if relayout {
                // The cached calibration chose another thread layout: run with it.
                (sessions, intra) = (c.sessions, c.intra_threads);
            }
            if relayout || graph.is_some() {
                synth.set_pool(cpu_pool(sessions, intra, graph)?);
            }
            Some(c)
        }
        (None, Planning::CachedOnly) => None,
        (None, _) => {
            let mut layouts = Vec::new();
            let mut layout_reason = String::new();
            // The running pool's measured peak memory (where its layout was measured).
            let mut current_memory = None;
            if auto_layout && on_cpu && sessions >= 2 {
                // The default (one single-threaded session per core) against one session
                // on every core: the default stays unless the other is faster by the knee
                // gain, so a calibration confirms what an uncalibrated run already does.
                // When memory is tight, throughput per GiB decides (choose_layout).
                let default_pool = synth.pool();
                let rss_before_one = narrator_hardware::memory::process_rss();
                synth.set_pool(cpu_pool(1, cores, None)?);
                let one_load_bytes = rss_added_since(rss_before_one);
                let m = tokio::task::block_in_place(|| {
                    narrator_pipeline::calibrate::compare_layouts(
                        &synth,
                        &default_pool,
                        ITEM_TOKENS,
                        calibration_effort().0,
                    )
                })
                .with_context(|| format!("comparing thread layouts for voice {name}"))?;
                let (m_one, m_many) = m;
                let sum = |a: Option<u64>, b: Option<u64>| Some(a? + b?);
                let one = narrator_hardware::LayoutPoint {
                    sessions: 1,
                    intra_threads: cores,
                    throughput: m_one.x,
                    memory_bytes: sum(one_load_bytes, m_one.work_bytes),
                    range: Some(m_one.range),
                    graph: None,
                };
                let many = narrator_hardware::LayoutPoint {
                    sessions,
                    intra_threads: intra,
                    throughput: m_many.x,
                    memory_bytes: sum(pool_load_bytes, m_many.work_bytes),
                    range: Some(m_many.range),
                    graph: None,
                };
                let available = match &spec {
                    DeviceSpec::Cpu {
                        available_bytes, ..
                    } => *available_bytes,
                    DeviceSpec::Gpu { .. } => u64::MAX,
                };
                let (chosen, why) = narrator_hardware::choose_layout(
                    &many,
                    &one,
                    available,
                    narrator_hardware::LAYOUT_SWITCH_GAIN,
                );
                layout_reason = why.clone();
                let switch = chosen == &one;
                tracing::info!(
                    one_x = one.throughput,
                    many_x = many.throughput,
                    one_bytes = one.memory_bytes,
                    many_bytes = many.memory_bytes,
                    cores,
                    "thread layouts measured: {why}"
                );
                current_memory = if switch {
                    one.memory_bytes
                } else {
                    many.memory_bytes
                };
                layouts.push(one);
                layouts.push(many);
                if switch {
                    (sessions, intra) = (1, cores);
                } else {
                    synth.set_pool(match Arc::try_unwrap(default_pool) {
                        Ok(pool) => pool,
                        Err(_) => cpu_pool(sessions, intra, None)?,
                    });
                }
            }
            let (mut graph, mut graph_reason) = (None, String::new());
            if let [default_graph, others @ ..] = graphs.as_slice() {
                for other in others {
                    let (chosen, why, points) = compare_graphs(
                        &name,
                        &synth,
                        (default_graph, other),
                        (sessions, intra),
                        current_memory,
                        &cpu_pool,
                        &spec,
                    )?;
                    layouts.extend(points);
                    graph_reason = why;
                    if chosen.as_deref() == Some(*other) {
                        graph = chosen;
                        loaded_graph = graph.clone();
                        break;
                    }
                }
            }
            eprintln!(
                "calibrating {name} on {} (up to 30 s, once per voice, device and runtime)",
                spec.label()
            );
            let on_gpu = matches!(spec, DeviceSpec::Gpu { .. });
            let gpu_index = match used {
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
            let free = match &spec {
                DeviceSpec::Gpu { free_bytes, .. } => *free_bytes,
                DeviceSpec::Cpu {
                    available_bytes, ..
                } => *available_bytes,
            };
            let opts = CalibrateOptions {
                voice: name.clone(),
                device_model: spec.model(),
                runtime: runtime.clone(),
                item_tokens: ITEM_TOKENS,
                max_batch: 256,
                max_duration: calibration_effort().1,
                knee_gain: limits.knee_gain,
                memory_limit: (free as f64 * (1.0 - limits.safety_margin)) as u64,
                memory_now: &memory_now,
                reset: &reset,
                intra_threads: intra,
                sessions,
            };
            let mut c = tokio::task::block_in_place(|| calibrate(&synth, &opts))
                .with_context(|| format!("calibrating voice {name}"))?;
            c.layouts = layouts;
            c.layout_reason = layout_reason;
            c.graph = graph;
            c.graph_reason = graph_reason;
            write_cached(&cache, &c);
            Some(c)
        }
    };
    let mut plan = match &calibration {
        Some(c) if c.source == CalibrationSource::Catalog => {
            let mut p = narrator_hardware::plan(&spec, c, &limits);
            p.reason = format!(
                "calibration of {} from {}: {}",
                spec.model(),
                known_origin.as_deref().unwrap_or("the catalog"),
                p.reason
            );
            p
        }
        Some(c) => narrator_hardware::plan(&spec, c, &limits),
        None => {
            // No calibration: the measured CPU default (one item per run), or a
            // conservative GPU batch until the worker calibrates.
            let mut c = Calibration::supplied(&name, 0.0, ITEM_TOKENS);
            c.device_model = spec.model();
            let mut p = narrator_hardware::plan(&spec, &c, &limits);
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
    plan.sessions = sessions;
    plan.intra_threads = intra;
    plan.graph = loaded_graph;
    if on_cpu && sessions > 1 && arena.mode() == narrator_engine::CpuArena::Bounded {
        // Each session's arena would keep the largest run it ever made, and several of
        // them add up: keep them at sentence-sized runs, larger runs give back theirs.
        arena.settle_at(MULTI_SESSION_KEPT_TOKENS);
    }
    if !auto_layout || args.max_batch.is_some() {
        plan.source.flags = true;
    }
    if let Some(n) = args.max_batch {
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
        if calibration.is_none() && args.max_batch.is_none() && on_gpu {
            // No batch dimension: on a GPU, sentences packed end to end into one model run
            // (cut at their token boundaries) are how one run fills the device. On CPU one
            // sentence per run stays the default: packing measured no faster on 2 cores and
            // took 250 MiB more (Kokoro, 297 words, 3 rounds: 29.4 s both, 1,168 against
            // 917 MiB peak; docs/BENCHMARKS.md, issue 28).
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
    synth.set_budget(Budget {
        max_tokens: plan.max_batch_tokens,
        max_requests: plan.max_batch_requests,
        max_wait: std::time::Duration::from_millis(plan.max_wait_ms),
    });
    if matches!(used, Device::Cuda(_)) {
        // After repeated out-of-memory failures: the same voice on CPU, one item per run.
        let family = voice.family.clone();
        let cpu = SessionOptions {
            intra_threads: cores,
            device: Device::Cpu,
            gpu_mem_limit: None,
            spin: !args.no_spin,
            cpu_arena: arena.clone(),
            pad_multiple: 1,
            graph: None,
        };
        synth = synth.with_fallback(Box::new(move || {
            let pool = EnginePool::start(
                rt,
                family.clone(),
                PoolOptions {
                    sessions: 1,
                    session: cpu.clone(),
                },
            )?;
            Ok((pool, Budget::single()))
        }));
    }
    tracing::info!(voice = %name, device = %used, sessions, intra, plan = ?plan, "engine ready");
    Ok(Loaded {
        synth,
        in_flight: sessions + 1,
        plan,
        calibration,
        profile: Some(profile),
        runtime: Some(runtime).filter(|r| r != "unknown"),
        arena,
        device_fallback: selected.fallback.clone(),
    })
}

/// The voice's phonemizer with the null engine (silence of the right length, instantly):
/// everything around inference runs for real, for control-plane benchmarks and tests.
/// Its plan is fixed (`--max-batch`, default 32); `NARRATOR_TEST_GPU_MEMORY_TOKENS` puts it
/// behind a claimed GPU's memory limit, with the null engine on CPU as the fallback.
#[cfg_attr(not(feature = "fleet"), allow(dead_code))] // the worker's
pub(crate) fn load_null(
    paths: &Paths,
    args: &EngineArgs,
    voice: Voice,
    samples_per_id: usize,
) -> anyhow::Result<Loaded> {
    let limit = test_memory_limit();
    // Test hook: every engine run takes this long, whatever its size (a GPU-like worker
    // whose speed grows with its batch budget).
    let pace = std::env::var("NARRATOR_TEST_RUN_MS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .map(std::time::Duration::from_millis);
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
    let scales = scales(args, &voice);
    let phonemizer = Phonemizer::new(&paths.espeak_parent)?;
    let n = args.max_batch.unwrap_or(32).max(1);
    let mut synth = Synthesizer::new(&voice, phonemizer, pool, scales)?.with_budget(Budget {
        max_tokens: n * MAX_ITEM_TOKENS,
        max_requests: n,
        max_wait: std::time::Duration::ZERO,
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
        arena: ArenaPolicy::new(args.cpu_arena),
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
