//! The field guide's checklist, as pure functions over a [`HardwareProfile`].
//!
//! [`diagnose`] runs every check and returns one or more [`Finding`]s per check: passing
//! checks are reported too (severity [`Severity::Ok`], with what was measured), so
//! `narrator doctor` shows the whole checklist. Checks that need a GPU are skipped on a
//! CPU-only machine, which gets one [`Severity::Info`] finding saying why it runs on the
//! CPU. [`render_text`] turns a profile and its findings into a plain-ASCII report.

use std::fmt::Write as _;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::profile::{BENIGN_THROTTLE_REASONS, GpuInfo, HardwareProfile};

/// How much a finding matters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// The check passed.
    Ok,
    /// Worth knowing; nothing to fix.
    Info,
    /// Works, but slower or less reliably than it could; the fix says how.
    Warning,
    /// Will not work as intended until fixed.
    Error,
}

impl Severity {
    /// The report's marker: "ok", "info", "WARN" or "ERROR".
    pub fn symbol(self) -> &'static str {
        match self {
            Severity::Ok => "ok",
            Severity::Info => "info",
            Severity::Warning => "WARN",
            Severity::Error => "ERROR",
        }
    }
}

/// One result of one check.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Finding {
    /// Stable id of the check, e.g. "gpu_numa_affinity".
    pub check: String,
    /// How much it matters.
    pub severity: Severity,
    /// What was measured, e.g. "GPU 0: persistence mode off".
    pub measured: String,
    /// Why it matters.
    pub why: String,
    /// What to do about it (a command where there is one); empty when nothing is needed.
    pub fix: String,
}

/// What the loaded ONNX Runtime can do, for the checks that depend on it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuntimeFacts {
    /// Path of the ONNX Runtime library that was loaded.
    pub library: String,
    /// Its version, e.g. "1.22.0" (see [`version_from_library_path`]).
    pub version: Option<String>,
    /// Whether it has the CUDA execution provider.
    pub cuda_provider: bool,
    /// The CUDA major version its CUDA build needs, if known, e.g. 13.
    pub cuda_major: Option<u32>,
    /// The CUDA build's needed libraries, resolved as the loader would
    /// ([`crate::cuda::inspect`]); `None` for a CPU build or when not inspected.
    #[serde(default)]
    pub cuda_build: Option<crate::cuda::CudaBuild>,
}

/// The version in an ONNX Runtime library's file name: "1.22.0" from
/// `libonnxruntime.so.1.22.0` or `libonnxruntime.1.22.0.dylib`; `None` when the name
/// carries none (`libonnxruntime.so`, `onnxruntime.dll`).
pub fn version_from_library_path(path: &Path) -> Option<String> {
    let name = path.file_name()?.to_str()?;
    let parts: Vec<&str> = name.split('.').collect();
    let is_number = |p: &&str| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit());
    // The first run of numeric dot-separated parts after the library's own name.
    let start = parts.iter().skip(1).position(is_number)? + 1;
    let run: Vec<&str> = parts
        .iter()
        .skip(start)
        .take_while(|p| is_number(p))
        .copied()
        .collect();
    Some(run.join("."))
}

/// Runs the checklist over a profile and, when known, the loaded ONNX Runtime.
///
/// Returns the findings in checklist order: GPU availability, per-GPU checks (NUMA
/// affinity, persistence mode, power limit, thermals/throttling), the ONNX Runtime
/// checks (CUDA provider, its libraries, driver vs build), per-GPU compute capability,
/// PCIe link and ECC, then host memory, swap, available memory and cgroup limits.
pub fn diagnose(profile: &HardwareProfile, runtime: Option<&RuntimeFacts>) -> Vec<Finding> {
    let mut out = Vec::new();
    check_gpu_available(profile, &mut out);
    check_numa_affinity(profile, &mut out);
    for gpu in &profile.gpus {
        check_persistence(gpu, &mut out);
        check_power_limit(gpu, &mut out);
        check_thermal(gpu, &mut out);
    }
    check_cuda_provider(profile, runtime, &mut out);
    check_cuda_libraries(profile, runtime, &mut out);
    check_cuda_driver(profile, runtime, &mut out);
    for gpu in &profile.gpus {
        check_compute_capability(gpu, runtime, &mut out);
        check_pcie_link(gpu, &mut out);
        check_ecc(gpu, &mut out);
    }
    check_ram_vs_vram(profile, &mut out);
    check_swap(profile, &mut out);
    check_memory_available(profile, &mut out);
    check_cgroup_limits(profile, &mut out);
    out
}

fn finding(
    check: &str,
    severity: Severity,
    measured: impl Into<String>,
    why: impl Into<String>,
    fix: impl Into<String>,
) -> Finding {
    Finding {
        check: check.to_owned(),
        severity,
        measured: measured.into(),
        why: why.into(),
        fix: fix.into(),
    }
}

fn gpu_label(gpu: &GpuInfo) -> String {
    format!("GPU {} ({})", gpu.index, gpu.name)
}

/// 9. Is there a GPU at all?
fn check_gpu_available(profile: &HardwareProfile, out: &mut Vec<Finding>) {
    if profile.gpus.is_empty() {
        let reason = profile
            .gpu_probe
            .reason
            .as_deref()
            .unwrap_or("no GPU was found");
        out.push(finding(
            "gpu_available",
            Severity::Info,
            format!("running on CPU: {reason}"),
            "No NVIDIA GPU is usable, so the worker synthesizes on the CPU.",
            "If this host should have a GPU: install the NVIDIA driver so that `nvidia-smi` \
             works (in a container: run it with `--gpus all` and the NVIDIA Container Toolkit).",
        ));
    } else {
        let names: Vec<String> = profile.gpus.iter().map(gpu_label).collect();
        out.push(finding(
            "gpu_available",
            Severity::Ok,
            format!("{} GPU(s): {}", profile.gpus.len(), names.join(", ")),
            "NVML reports the GPUs the worker can use.",
            "",
        ));
    }
}

/// 1. GPU <-> NUMA node affinity.
fn check_numa_affinity(profile: &HardwareProfile, out: &mut Vec<Finding>) {
    if profile.gpus.is_empty() {
        return;
    }
    let nodes = profile.numa_nodes.len();
    if nodes <= 1 {
        out.push(finding(
            "gpu_numa_affinity",
            Severity::Ok,
            if nodes == 1 {
                "1 NUMA node: every GPU is local to every CPU".to_owned()
            } else {
                "no NUMA information: treated as a single node".to_owned()
            },
            "On a single node there is no remote memory to avoid; no pinning needed.",
            "",
        ));
        return;
    }
    let why = "Host-to-device copies and the worker's CPU threads are fastest from the CPUs \
               and memory of the GPU's own NUMA node; from the other socket every transfer \
               crosses the inter-socket link.";
    for gpu in &profile.gpus {
        let i = gpu.index;
        let finding = match (gpu.numa_node, gpu.cpu_affinity.as_deref()) {
            (Some(node), _) => {
                let cpus = profile
                    .numa_nodes
                    .iter()
                    .find(|n| i64::from(n.id) == i64::from(node))
                    .map(|n| format!(" (CPUs {})", n.cpus))
                    .unwrap_or_default();
                finding(
                    "gpu_numa_affinity",
                    Severity::Info,
                    format!("{} is on NUMA node {node} of {nodes}{cpus}", gpu_label(gpu)),
                    why,
                    format!(
                        "Run its worker on that node: numactl --cpunodebind={node} \
                         --membind={node} narrator worker --device cuda:{i}"
                    ),
                )
            }
            (None, Some(cpus)) => finding(
                "gpu_numa_affinity",
                Severity::Info,
                format!(
                    "{}: NUMA node unknown; NVML's CPU affinity is {cpus} ({nodes} NUMA nodes)",
                    gpu_label(gpu)
                ),
                why,
                format!(
                    "Run its worker on those CPUs: taskset -c {cpus} narrator worker --device cuda:{i}"
                ),
            ),
            (None, None) => finding(
                "gpu_numa_affinity",
                Severity::Info,
                format!("{}: NUMA node unknown ({nodes} NUMA nodes)", gpu_label(gpu)),
                why,
                "Find the GPU's node with `nvidia-smi topo -m` and run the worker under \
                 `numactl --cpunodebind=N --membind=N`.",
            ),
        };
        out.push(finding);
    }
}

/// 2. Persistence mode.
fn check_persistence(gpu: &GpuInfo, out: &mut Vec<Finding>) {
    let i = gpu.index;
    let label = gpu_label(gpu);
    out.push(match gpu.persistence_mode {
        Some(false) => finding(
            "gpu_persistence_mode",
            Severity::Warning,
            format!("{label}: persistence mode off"),
            "Without persistence mode the driver tears the GPU down whenever no process uses \
             it: every worker start pays seconds of initialization, and NVML queries are slow.",
            format!("sudo nvidia-smi -i {i} -pm 1 (or enable the nvidia-persistenced service)"),
        ),
        Some(true) => finding(
            "gpu_persistence_mode",
            Severity::Ok,
            format!("{label}: persistence mode on"),
            "The driver keeps the GPU initialized between processes.",
            "",
        ),
        None => finding(
            "gpu_persistence_mode",
            Severity::Info,
            format!("{label}: persistence mode not reported by NVML"),
            "This board or driver does not report persistence mode.",
            "",
        ),
    });
}

/// 3. Power limit below the board's default.
fn check_power_limit(gpu: &GpuInfo, out: &mut Vec<Finding>) {
    let i = gpu.index;
    let label = gpu_label(gpu);
    out.push(
        match (gpu.power_limit_watts, gpu.power_default_limit_watts) {
            (Some(limit), Some(default)) if limit + 0.5 < default => finding(
                "gpu_power_limit",
                Severity::Warning,
                format!("{label}: power limit {limit:.0} W, below the default {default:.0} W"),
                "A lowered power limit caps the clocks under load, and throughput drops with it.",
                format!("sudo nvidia-smi -i {i} -pl {default:.0}"),
            ),
            (Some(limit), Some(default)) => finding(
                "gpu_power_limit",
                Severity::Ok,
                format!("{label}: power limit {limit:.0} W (default {default:.0} W)"),
                "The board may draw its full rated power.",
                "",
            ),
            _ => finding(
                "gpu_power_limit",
                Severity::Info,
                format!("{label}: power limit not reported by NVML"),
                "This board does not report its power limits.",
                "",
            ),
        },
    );
}

/// 4. Temperature near slowdown, or clocks held back.
fn check_thermal(gpu: &GpuInfo, out: &mut Vec<Finding>) {
    let label = gpu_label(gpu);
    let i = gpu.index;
    let hot = match (gpu.temperature_c, gpu.slowdown_temperature_c) {
        (Some(t), Some(slow)) => t + 5 >= slow,
        _ => false,
    };
    let active: Vec<&str> = gpu
        .throttle_reasons
        .iter()
        .map(String::as_str)
        .filter(|r| !BENIGN_THROTTLE_REASONS.contains(r))
        .collect();
    let temperature = match (gpu.temperature_c, gpu.slowdown_temperature_c) {
        (Some(t), Some(slow)) => format!("{t} C (slowdown at {slow} C)"),
        (Some(t), None) => format!("{t} C"),
        _ => "temperature not reported".to_owned(),
    };
    if !hot && active.is_empty() {
        out.push(finding(
            "gpu_thermal_throttling",
            Severity::Ok,
            format!("{label}: {temperature}, clocks not held back"),
            "The GPU runs at the clocks it chooses.",
            "",
        ));
        return;
    }
    let mut fixes = Vec::new();
    let thermal = hot || active.iter().any(|r| r.contains("thermal"));
    if thermal {
        fixes.push(
            "improve cooling (airflow, fans, inlet temperature) and watch \
             `nvidia-smi -q -d TEMPERATURE,PERFORMANCE`"
                .to_owned(),
        );
    }
    if active.contains(&"sw_power_cap") {
        fixes.push(format!(
            "the board is at its power limit: check it with `nvidia-smi -i {i} -q -d POWER` and \
             raise it toward the default if it was lowered"
        ));
    }
    if active
        .iter()
        .any(|r| *r == "hw_slowdown" || *r == "hw_power_brake_slowdown")
    {
        fixes.push(
            "hardware slowdown: check the power supply and its cables, and the board's health \
             in `nvidia-smi -q -d PERFORMANCE`"
                .to_owned(),
        );
    }
    if fixes.is_empty() {
        fixes.push(format!(
            "see why the clocks are held back: nvidia-smi -i {i} -q -d PERFORMANCE"
        ));
    }
    let reasons = if active.is_empty() {
        "none".to_owned()
    } else {
        active.join(", ")
    };
    out.push(finding(
        "gpu_thermal_throttling",
        Severity::Warning,
        format!("{label}: {temperature}; active throttle reasons: {reasons}"),
        "The GPU is holding its clocks back (or is about to), so batches take longer than \
         the plan measured.",
        capitalize(&fixes.join("; ")),
    ));
}

/// 8. A GPU, but the loaded ONNX Runtime cannot use it.
fn check_cuda_provider(
    profile: &HardwareProfile,
    runtime: Option<&RuntimeFacts>,
    out: &mut Vec<Finding>,
) {
    if profile.gpus.is_empty() {
        return;
    }
    let Some(rt) = runtime else {
        out.push(finding(
            "onnxruntime_cuda_provider",
            Severity::Info,
            "ONNX Runtime not checked",
            "Whether the ONNX Runtime the worker loads has the CUDA execution provider was not \
             checked.",
            "Pass --onnxruntime PATH to check the library the worker will load.",
        ));
        return;
    };
    let version = rt.version.as_deref().unwrap_or("(version unknown)");
    if rt.cuda_provider {
        out.push(finding(
            "onnxruntime_cuda_provider",
            Severity::Ok,
            format!(
                "ONNX Runtime {version} at {} has the CUDA execution provider",
                rt.library
            ),
            "The worker can run the model on the GPU.",
            "",
        ));
    } else {
        out.push(finding(
            "onnxruntime_cuda_provider",
            Severity::Error,
            format!(
                "ONNX Runtime {version} at {} has no CUDA execution provider, with {} GPU(s) present",
                rt.library,
                profile.gpus.len()
            ),
            "This is a CPU-only ONNX Runtime build: the worker would run on the CPU while the \
             GPUs sit idle.",
            "Run `bash ops/setup.sh --gpu` (ONNX Runtime's CUDA build into .deps/onnxruntime-gpu, \
             which narrator then picks for --device auto/cuda:N), or pass --onnxruntime PATH.",
        ));
    }
}

/// 8b. The CUDA build's needed libraries (ELF `DT_NEEDED`, resolved as the loader would).
/// An error with GPUs present; a warning without (`--device auto` runs on the CPU then).
fn check_cuda_libraries(
    profile: &HardwareProfile,
    runtime: Option<&RuntimeFacts>,
    out: &mut Vec<Finding>,
) {
    let Some(build) = runtime.and_then(|rt| rt.cuda_build.as_ref()) else {
        return;
    };
    let total = build.libraries.len();
    let missing: Vec<&crate::cuda::NeededLibrary> = build.missing().collect();
    let versions = format!(
        "CUDA {}, cuDNN {}",
        build
            .cuda_major
            .map_or_else(|| "?".to_owned(), |v| v.to_string()),
        build
            .cudnn_major
            .map_or_else(|| "?".to_owned(), |v| v.to_string())
    );
    if missing.is_empty() {
        out.push(finding(
            "cuda_libraries",
            Severity::Ok,
            format!(
                "all {total} libraries {} needs resolve ({versions})",
                build.provider.display()
            ),
            "The CUDA execution provider can load.",
            "",
        ));
        return;
    }
    let names: Vec<String> = missing
        .iter()
        .map(|l| format!("{} (needed by {})", l.name, l.needed_by))
        .collect();
    let mut pypi: Vec<&str> = missing
        .iter()
        .filter_map(|l| {
            l.provided_by
                .strip_prefix("PyPI ")
                .and_then(|p| p.split(';').next())
        })
        .collect();
    pypi.sort_unstable();
    pypi.dedup();
    let mut fixes = Vec::new();
    if !pypi.is_empty() {
        fixes.push(format!(
            "run `bash ops/setup.sh --gpu` (unpacks the PyPI wheels {} into .deps/cuda/lib, \
             which narrator loads first), or put the folders that hold them on \
             LD_LIBRARY_PATH or NARRATOR_CUDA_LIBS",
            pypi.join(", ")
        ));
    }
    if missing.iter().any(|l| l.name.starts_with("libcuda.so")) {
        fixes.push(
            "libcuda.so.1 comes with the NVIDIA driver, not a wheel: install the driver on \
             the host (or run the container with the NVIDIA container toolkit)"
                .to_owned(),
        );
    }
    let other: Vec<&str> = missing
        .iter()
        .filter(|l| l.provided_by.contains("system"))
        .map(|l| l.name.as_str())
        .collect();
    if !other.is_empty() {
        fixes.push(format!(
            "install the system packages that provide {}",
            other.join(", ")
        ));
    }
    out.push(finding(
        "cuda_libraries",
        if profile.gpus.is_empty() {
            Severity::Warning
        } else {
            Severity::Error
        },
        format!(
            "{} of {total} libraries the CUDA build needs are missing ({versions}): {}",
            missing.len(),
            names.join(", ")
        ),
        "ONNX Runtime opens the CUDA provider only when a session asks for CUDA, so a \
         missing library fails the first job (or `--device auto` falls back to the CPU).",
        capitalize(&fixes.join("; ")),
    ));
}

/// The oldest compute capability a CUDA major version's builds run on.
fn min_compute_capability(cuda_major: u32) -> Option<(i32, i32)> {
    match cuda_major {
        // CUDA 13 dropped Maxwell, Pascal and Volta.
        13.. => Some((7, 5)),
        12 => Some((5, 0)),
        _ => None,
    }
}

/// 9. A GPU older than the CUDA build supports.
fn check_compute_capability(gpu: &GpuInfo, runtime: Option<&RuntimeFacts>, out: &mut Vec<Finding>) {
    let (Some(cc), Some(need)) = (gpu.compute_capability, runtime.and_then(|rt| rt.cuda_major))
    else {
        return;
    };
    let Some((min_major, min_minor)) = min_compute_capability(need) else {
        return;
    };
    let label = gpu_label(gpu);
    if (cc.major, cc.minor) >= (min_major, min_minor) {
        out.push(finding(
            "gpu_compute_capability",
            Severity::Ok,
            format!(
                "{label}: compute capability {}.{} (CUDA {need} needs {min_major}.{min_minor}+)",
                cc.major, cc.minor
            ),
            "The CUDA build has kernels for this GPU.",
            "",
        ));
    } else {
        out.push(finding(
            "gpu_compute_capability",
            Severity::Error,
            format!(
                "{label}: compute capability {}.{}, below the {min_major}.{min_minor} that \
                 CUDA {need} builds support",
                cc.major, cc.minor
            ),
            "The CUDA provider would fail with 'no kernel image is available' on the first \
             run.",
            format!(
                "Use an ONNX Runtime build for an older CUDA (onnxruntime-gpu for CUDA 12 \
                 supports {}.{}+) with --onnxruntime PATH, or run this GPU's workers with \
                 --device cpu.",
                min_compute_capability(12).map_or(5, |c| c.0),
                min_compute_capability(12).map_or(0, |c| c.1)
            ),
        ));
    }
}

/// 10. A PCIe link narrower (or slower) than the card and slot allow.
fn check_pcie_link(gpu: &GpuInfo, out: &mut Vec<Finding>) {
    let (Some(gen_now), Some(gen_max), Some(w), Some(w_max)) = (
        gpu.pcie_generation,
        gpu.pcie_max_generation,
        gpu.pcie_width,
        gpu.pcie_max_width,
    ) else {
        return;
    };
    let label = gpu_label(gpu);
    let i = gpu.index;
    let measured = format!("{label}: PCIe gen{gen_now} x{w} (max gen{gen_max} x{w_max})");
    if w < w_max {
        out.push(finding(
            "gpu_pcie_link",
            Severity::Warning,
            measured,
            "Fewer lanes than the card and slot support divide host-to-device bandwidth (a \
             riser, a shared slot or a badly seated card); batches wait on copies.",
            format!(
                "Reseat the card or move it to a full x{w_max} slot; check \
                 `nvidia-smi -i {i} -q -d PCIE` and `lspci -vv` (LnkSta vs LnkCap)."
            ),
        ));
    } else if gen_now < gen_max {
        out.push(finding(
            "gpu_pcie_link",
            Severity::Info,
            measured,
            "GPUs lower the link generation while idle to save power; below the maximum \
             under load it would slow copies.",
            format!(
                "Check again under load: `nvidia-smi -i {i} --query-gpu=pcie.link.gen.current \
                 --format=csv` while a job runs; if it stays low, check the BIOS PCIe setting."
            ),
        ));
    } else {
        out.push(finding(
            "gpu_pcie_link",
            Severity::Ok,
            measured,
            "The link runs at its full width and generation.",
            "",
        ));
    }
}

/// 11. ECC: uncorrected errors, or a mode change waiting for a reset.
fn check_ecc(gpu: &GpuInfo, out: &mut Vec<Finding>) {
    let Some(enabled) = gpu.ecc_enabled else {
        return;
    };
    let label = gpu_label(gpu);
    let i = gpu.index;
    let errors = gpu.ecc_uncorrected_errors.unwrap_or(0);
    if errors > 0 {
        out.push(finding(
            "gpu_ecc",
            Severity::Error,
            format!("{label}: {errors} uncorrected ECC error(s) since the driver loaded"),
            "Uncorrected memory errors corrupt results or kill CUDA contexts; the board needs \
             its pages retired (or remapped) by a reset.",
            format!(
                "Drain the GPU, then `nvidia-smi -i {i} -r` (or reboot) and watch \
                 `nvidia-smi -i {i} -q -d ECC,PAGE_RETIREMENT,ROW_REMAPPER`; replace the \
                 board if errors return."
            ),
        ));
    } else if gpu.ecc_pending.is_some_and(|p| p != enabled) {
        out.push(finding(
            "gpu_ecc",
            Severity::Warning,
            format!(
                "{label}: ECC {} now, {} after the next reset",
                if enabled { "on" } else { "off" },
                if enabled { "off" } else { "on" }
            ),
            "A pending ECC change alters usable memory (ECC keeps some) and so the plan, at \
             the next reset.",
            format!("Reset the GPU (`nvidia-smi -i {i} -r`) or reboot before calibrating."),
        ));
    } else {
        out.push(finding(
            "gpu_ecc",
            Severity::Ok,
            format!(
                "{label}: ECC {}, no uncorrected errors",
                if enabled { "on" } else { "off" }
            ),
            "",
            "",
        ));
    }
}

/// The major version of a "12.4"-style version string.
fn major_of(version: &str) -> Option<u32> {
    version.trim().split('.').next()?.parse().ok()
}

/// 7. Driver too old for the CUDA version the ONNX Runtime build needs.
fn check_cuda_driver(
    profile: &HardwareProfile,
    runtime: Option<&RuntimeFacts>,
    out: &mut Vec<Finding>,
) {
    let Some(rt) = runtime.filter(|rt| rt.cuda_provider) else {
        return;
    };
    let Some(gpu) = profile.gpus.first() else {
        return;
    };
    let ort = rt.version.as_deref().unwrap_or("(version unknown)");
    let Some(need) = rt.cuda_major else {
        out.push(finding(
            "cuda_driver_version",
            Severity::Info,
            format!("ONNX Runtime {ort}: the CUDA version of its build is unknown"),
            "The driver cannot be checked against the CUDA version the build needs.",
            "",
        ));
        return;
    };
    let driver = gpu.driver_version.as_deref().unwrap_or("(unknown)");
    let Some(have_text) = gpu.cuda_driver_version.as_deref() else {
        out.push(finding(
            "cuda_driver_version",
            Severity::Info,
            format!(
                "driver {driver} did not report its CUDA version; ONNX Runtime {ort} needs CUDA {need}"
            ),
            "NVML could not read the CUDA version the driver supports (libcuda missing?).",
            "Check `nvidia-smi` (the \"CUDA Version\" in its header).",
        ));
        return;
    };
    match major_of(have_text) {
        Some(have) if have < need => {
            let minimum = match need {
                12 => " (R525 or newer)",
                13 => " (R580 or newer)",
                _ => "",
            };
            out.push(finding(
                "cuda_driver_version",
                Severity::Error,
                format!(
                    "driver {driver} supports CUDA up to {have_text}; ONNX Runtime {ort} is built \
                     for CUDA {need}"
                ),
                "The CUDA execution provider fails to load (and the worker falls back to the \
                 CPU or stops) when the driver is older than the CUDA the build needs.",
                format!(
                    "Upgrade the NVIDIA driver to one that supports CUDA {need}{minimum}, or \
                     install an ONNX Runtime build for CUDA {have}."
                ),
            ));
        }
        Some(_) => out.push(finding(
            "cuda_driver_version",
            Severity::Ok,
            format!(
                "driver {driver} supports CUDA up to {have_text}; ONNX Runtime {ort} needs CUDA {need}"
            ),
            "The driver is new enough for the ONNX Runtime CUDA build.",
            "",
        )),
        None => out.push(finding(
            "cuda_driver_version",
            Severity::Info,
            format!("driver CUDA version {have_text:?} could not be read"),
            "The driver cannot be checked against the CUDA version the build needs.",
            "Check `nvidia-smi` (the \"CUDA Version\" in its header).",
        )),
    }
}

/// RAM this process may use: the physical RAM, or the cgroup limit when lower.
fn effective_ram(profile: &HardwareProfile) -> u64 {
    let total = profile.memory.total_bytes;
    profile
        .memory
        .cgroup_limit_bytes
        .map_or(total, |limit| limit.min(total))
}

/// 6. Host RAM below twice the GPU memory.
fn check_ram_vs_vram(profile: &HardwareProfile, out: &mut Vec<Finding>) {
    let vram = profile.total_vram_bytes();
    if profile.gpus.is_empty() || vram == 0 {
        return;
    }
    let ram = effective_ram(profile);
    let limited = if ram < profile.memory.total_bytes {
        " (cgroup limit)"
    } else {
        ""
    };
    let measured = format!(
        "RAM {}{limited}, GPU memory {} in total ({} GPU(s))",
        fmt_bytes(ram),
        fmt_bytes(vram),
        profile.gpus.len()
    );
    if u128::from(ram) < 2 * u128::from(vram) {
        out.push(finding(
            "host_ram_vs_vram",
            Severity::Warning,
            format!("{measured}: less than 2x"),
            "Loading models stages the weights in host memory, and pinned host buffers and \
             staging for transfers need host RAM too; with less than twice the GPU memory the \
             host runs out before the GPUs fill.",
            format!(
                "Give the host (or the container) at least {} of RAM, or run fewer GPUs or \
                 workers per host.",
                fmt_bytes(vram.saturating_mul(2))
            ),
        ));
    } else {
        out.push(finding(
            "host_ram_vs_vram",
            Severity::Ok,
            format!("{measured}: at least 2x"),
            "Enough host memory for staging and pinned buffers.",
            "",
        ));
    }
}

/// 5. Swap in use, or swapping now.
fn check_swap(profile: &HardwareProfile, out: &mut Vec<Finding>) {
    let m = &profile.memory;
    let swap_in = m.swap_in_pages_per_s.unwrap_or(0.0);
    let swap_out = m.swap_out_pages_per_s.unwrap_or(0.0);
    let used = format!(
        "swap used {} of {}",
        fmt_bytes(m.swap_used_bytes),
        fmt_bytes(m.swap_total_bytes)
    );
    if swap_in > 0.0 || swap_out > 0.0 {
        out.push(finding(
            "swap",
            Severity::Warning,
            format!("swapping: {swap_in:.0} pages/s in, {swap_out:.0} pages/s out; {used}"),
            "The host is short of memory: model weights or batches are being paged to and \
             from disk, and every page fault stalls synthesis.",
            "Reduce the batch (or run fewer workers on this host), add RAM, or stop what else \
             uses the memory; once RAM suffices, `sudo swapoff -a` keeps the worker from \
             being paged out.",
        ));
    } else if m.swap_used_bytes > 0 {
        let rate = if m.swap_in_pages_per_s.is_some() {
            "no swapping during the probe"
        } else {
            "swap activity not measured"
        };
        out.push(finding(
            "swap",
            Severity::Info,
            format!("{used}; {rate}"),
            "Pages were swapped out earlier; if they belong to the worker they come back \
             slowly the next time they are touched.",
            "Watch the si/so columns of `vmstat 1` under load; if they stay above 0, reduce \
             the batch or add RAM (`sudo swapoff -a` once RAM suffices).",
        ));
    } else {
        out.push(finding(
            "swap",
            Severity::Ok,
            if m.swap_total_bytes == 0 {
                "no swap configured".to_owned()
            } else {
                format!("{used}; no swapping")
            },
            "Nothing the worker uses is paged out.",
            "",
        ));
    }
}

/// 11. Little memory available.
fn check_memory_available(profile: &HardwareProfile, out: &mut Vec<Finding>) {
    let m = &profile.memory;
    let mut available = m.available_bytes;
    let mut note = "";
    if let (Some(limit), Some(usage)) = (m.cgroup_limit_bytes, m.cgroup_usage_bytes) {
        let headroom = limit.saturating_sub(usage);
        if headroom < available {
            available = headroom;
            note = " (under the cgroup limit)";
        }
    }
    let measured = format!("{} available{note}", fmt_bytes(available));
    if available < 1 << 30 {
        out.push(finding(
            "memory_available",
            Severity::Warning,
            measured,
            "Loading a voice model and building batches needs host memory; below 1 GiB the \
             worker risks swapping or the OOM killer.",
            "Stop other processes on the host, lower the batch size, or raise the memory limit.",
        ));
    } else {
        out.push(finding(
            "memory_available",
            Severity::Ok,
            measured,
            "Enough free memory to load a model and build batches.",
            "",
        ));
    }
}

/// 10. cgroup limits below the machine.
fn check_cgroup_limits(profile: &HardwareProfile, out: &mut Vec<Finding>) {
    let mut limits = Vec::new();
    if let Some(limit) = profile.memory.cgroup_limit_bytes
        && limit < profile.memory.total_bytes
    {
        limits.push(format!(
            "memory limit {} of {} RAM",
            fmt_bytes(limit),
            fmt_bytes(profile.memory.total_bytes)
        ));
    }
    if let Some(cores) = profile.cpu.cgroup_cpu_limit
        && cores < profile.cpu.logical_cores as f64
    {
        limits.push(format!(
            "CPU limit {cores:.2} of {} cores",
            profile.cpu.logical_cores
        ));
    }
    if limits.is_empty() {
        out.push(finding(
            "cgroup_limits",
            Severity::Ok,
            "no cgroup limit below the machine's CPU or memory",
            "The worker may use the whole machine.",
            "",
        ));
    } else {
        out.push(finding(
            "cgroup_limits",
            Severity::Info,
            format!("cgroup {}", limits.join("; ")),
            "This process may use less than the machine has; the worker plans threads and \
             batches from the limit, not from the machine.",
            "Nothing to do unless the container should have more: then raise its limits.",
        ));
    }
}

fn capitalize(text: &str) -> String {
    let mut chars = text.chars();
    match chars.next() {
        Some(first) => first.to_uppercase().chain(chars).collect(),
        None => String::new(),
    }
}

/// Bytes in the largest binary unit that keeps the number at least 1, e.g. "23.4 GiB".
fn fmt_bytes(bytes: u64) -> String {
    const UNITS: &[(u64, &str)] = &[
        (1 << 40, "TiB"),
        (1 << 30, "GiB"),
        (1 << 20, "MiB"),
        (1 << 10, "KiB"),
    ];
    for &(size, unit) in UNITS {
        if bytes >= size {
            return format!("{:.1} {unit}", bytes as f64 / size as f64);
        }
    }
    format!("{bytes} B")
}

/// A human report: the machine (CPU, memory, NUMA, each GPU), then one block per finding
/// marked "ok", "info", "WARN" or "ERROR", with why and the fix for anything not ok.
pub fn render_text(profile: &HardwareProfile, findings: &[Finding]) -> String {
    let mut s = String::new();
    let _ = render_into(&mut s, profile, findings);
    s
}

fn render_into(
    s: &mut String,
    profile: &HardwareProfile,
    findings: &[Finding],
) -> std::fmt::Result {
    let os = [profile.os.as_deref(), profile.kernel.as_deref()]
        .into_iter()
        .flatten()
        .collect::<Vec<_>>()
        .join(", kernel ");
    if os.is_empty() {
        writeln!(s, "Host:    {}", profile.host)?;
    } else {
        writeln!(s, "Host:    {} ({os})", profile.host)?;
    }

    let cpu = &profile.cpu;
    write!(s, "CPU:     {}", cpu.model)?;
    if let Some(vendor) = &cpu.vendor {
        write!(s, " ({vendor})")?;
    }
    write!(
        s,
        ", {} physical / {} logical cores, {} usable",
        cpu.physical_cores, cpu.logical_cores, cpu.usable_cores
    )?;
    if let Some(limit) = cpu.cgroup_cpu_limit {
        write!(s, " (cgroup limit {limit:.2} cores)")?;
    }
    if let Some(mhz) = cpu.frequency_mhz {
        write!(s, ", {mhz} MHz")?;
    }
    writeln!(s)?;

    let m = &profile.memory;
    write!(
        s,
        "Memory:  {} total, {} available; swap {} used of {}",
        fmt_bytes(m.total_bytes),
        fmt_bytes(m.available_bytes),
        fmt_bytes(m.swap_used_bytes),
        fmt_bytes(m.swap_total_bytes)
    )?;
    if let (Some(i), Some(o)) = (m.swap_in_pages_per_s, m.swap_out_pages_per_s) {
        write!(s, " ({i:.0} in / {o:.0} out pages/s)")?;
    }
    if let Some(limit) = m.cgroup_limit_bytes {
        write!(s, "; cgroup limit {}", fmt_bytes(limit))?;
        if let Some(usage) = m.cgroup_usage_bytes {
            write!(s, " ({} used)", fmt_bytes(usage))?;
        }
    }
    writeln!(s)?;

    if profile.numa_nodes.is_empty() {
        writeln!(s, "NUMA:    no information")?;
    } else {
        let nodes: Vec<String> = profile
            .numa_nodes
            .iter()
            .map(|n| match n.memory_total_bytes {
                Some(b) => format!("node{} CPUs {} ({})", n.id, n.cpus, fmt_bytes(b)),
                None => format!("node{} CPUs {}", n.id, n.cpus),
            })
            .collect();
        writeln!(
            s,
            "NUMA:    {} node(s): {}",
            profile.numa_nodes.len(),
            nodes.join("; ")
        )?;
    }

    if profile.gpus.is_empty() {
        let reason = profile.gpu_probe.reason.as_deref().unwrap_or("none found");
        writeln!(s, "GPU:     none ({reason})")?;
    }
    for gpu in &profile.gpus {
        write!(
            s,
            "GPU {}:   {}, {} ({} free)",
            gpu.index,
            gpu.name,
            fmt_bytes(gpu.memory_total_bytes),
            fmt_bytes(gpu.memory_free_bytes)
        )?;
        if let Some(cc) = gpu.compute_capability {
            write!(s, ", compute {}.{}", cc.major, cc.minor)?;
        }
        if let Some(driver) = &gpu.driver_version {
            write!(s, ", driver {driver}")?;
        }
        if let Some(cuda) = &gpu.cuda_driver_version {
            write!(s, " (CUDA {cuda})")?;
        }
        if let Some(t) = gpu.temperature_c {
            write!(s, ", {t} C")?;
        }
        match (gpu.power_draw_watts, gpu.power_limit_watts) {
            (Some(draw), Some(limit)) => write!(s, ", {draw:.0}/{limit:.0} W")?,
            (Some(draw), None) => write!(s, ", {draw:.0} W")?,
            _ => {}
        }
        if let (Some(g), Some(w)) = (gpu.pcie_generation, gpu.pcie_width) {
            write!(s, ", PCIe gen{g} x{w}")?;
            if let (Some(mg), Some(mw)) = (gpu.pcie_max_generation, gpu.pcie_max_width)
                && (mg, mw) != (g, w)
            {
                write!(s, " (max gen{mg} x{mw})")?;
            }
        }
        if let Some(bus) = &gpu.pci_bus_id {
            write!(s, ", {bus}")?;
        }
        if let Some(node) = gpu.numa_node {
            write!(s, ", NUMA node {node}")?;
        }
        if let Some(cpus) = &gpu.cpu_affinity {
            write!(s, ", CPUs {cpus}")?;
        }
        writeln!(s)?;
    }

    writeln!(s)?;
    for f in findings {
        let marker = format!("[{}]", f.severity.symbol());
        writeln!(s, "{marker:<8} {}: {}", f.check, f.measured)?;
        if f.severity != Severity::Ok {
            if !f.why.is_empty() {
                writeln!(s, "         why: {}", f.why)?;
            }
            if !f.fix.is_empty() {
                writeln!(s, "         fix: {}", f.fix)?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::{ComputeCapability, CpuInfo, GpuClocks, GpuProbe, MemoryInfo, NumaNode};

    const GIB: u64 = 1 << 30;

    /// A healthy GPU: persistence on, full power limit, cool, not throttled.
    fn healthy_gpu(index: u32) -> GpuInfo {
        GpuInfo {
            index,
            name: "NVIDIA H200".into(),
            uuid: format!("GPU-{index}"),
            memory_total_bytes: 141 * GIB,
            memory_free_bytes: 140 * GIB,
            memory_used_bytes: GIB,
            compute_capability: Some(ComputeCapability { major: 9, minor: 0 }),
            driver_version: Some("550.90.07".into()),
            cuda_driver_version: Some("12.4".into()),
            temperature_c: Some(40),
            slowdown_temperature_c: Some(87),
            power_draw_watts: Some(120.0),
            power_limit_watts: Some(700.0),
            power_default_limit_watts: Some(700.0),
            persistence_mode: Some(true),
            clocks: GpuClocks::default(),
            throttle_reasons: vec!["gpu_idle".into()],
            utilization_percent: Some(0),
            pcie_generation: Some(5),
            pcie_max_generation: Some(5),
            pcie_width: Some(16),
            pcie_max_width: Some(16),
            pci_bus_id: Some(format!("0000:{:02x}:00.0", 0x3b + index)),
            numa_node: Some(0),
            cpu_affinity: Some("0-31".into()),
            ecc_enabled: Some(true),
            ecc_pending: Some(true),
            ecc_uncorrected_errors: Some(0),
        }
    }

    /// A healthy machine with `n` GPUs (each changed by `edit`), 2 TiB RAM, one NUMA node.
    fn profile_with_gpus(n: u32, edit: impl Fn(&mut GpuInfo)) -> HardwareProfile {
        let gpus: Vec<GpuInfo> = (0..n)
            .map(|i| {
                let mut g = healthy_gpu(i);
                edit(&mut g);
                g
            })
            .collect();
        HardwareProfile {
            host: "test-host".into(),
            os: Some("Linux (Test 1.0)".into()),
            kernel: Some("6.8.0".into()),
            cpu: CpuInfo {
                model: "Test CPU".into(),
                vendor: Some("GenuineIntel".into()),
                physical_cores: 32,
                logical_cores: 64,
                frequency_mhz: Some(2400),
                cgroup_cpu_limit: None,
                usable_cores: 64,
            },
            memory: MemoryInfo {
                total_bytes: 2048 * GIB,
                available_bytes: 2000 * GIB,
                swap_total_bytes: 0,
                swap_used_bytes: 0,
                swap_in_pages_per_s: Some(0.0),
                swap_out_pages_per_s: Some(0.0),
                cgroup_limit_bytes: None,
                cgroup_usage_bytes: None,
            },
            numa_nodes: vec![NumaNode {
                id: 0,
                cpus: "0-63".into(),
                memory_total_bytes: Some(2048 * GIB),
            }],
            gpu_probe: GpuProbe {
                available: n > 0,
                reason: (n == 0).then(|| "NVML found no GPU; running on CPU".to_owned()),
            },
            gpus,
            probed_at_unix_ms: 1,
        }
    }

    fn two_numa_nodes(p: &mut HardwareProfile) {
        p.numa_nodes = vec![
            NumaNode {
                id: 0,
                cpus: "0-31".into(),
                memory_total_bytes: Some(1024 * GIB),
            },
            NumaNode {
                id: 1,
                cpus: "32-63".into(),
                memory_total_bytes: Some(1024 * GIB),
            },
        ];
    }

    fn cuda_runtime(cuda_provider: bool, cuda_major: Option<u32>) -> RuntimeFacts {
        RuntimeFacts {
            library: "/opt/ort/lib/libonnxruntime.so.1.22.0".into(),
            version: Some("1.22.0".into()),
            cuda_provider,
            cuda_major,
            cuda_build: None,
        }
    }

    fn with_check<'a>(findings: &'a [Finding], check: &str) -> Vec<&'a Finding> {
        findings.iter().filter(|f| f.check == check).collect()
    }

    fn only(findings: &[Finding], check: &str) -> Finding {
        let found = with_check(findings, check);
        assert_eq!(found.len(), 1, "one {check} finding in {findings:#?}");
        found[0].clone()
    }

    #[test]
    fn healthy_gpu_machine_is_all_ok() {
        let p = profile_with_gpus(2, |_| {});
        let rt = cuda_runtime(true, Some(12));
        let findings = diagnose(&p, Some(&rt));
        for f in &findings {
            assert_eq!(f.severity, Severity::Ok, "{f:#?}");
        }
        for check in [
            "gpu_available",
            "gpu_numa_affinity",
            "gpu_persistence_mode",
            "gpu_power_limit",
            "gpu_thermal_throttling",
            "onnxruntime_cuda_provider",
            "cuda_driver_version",
            "host_ram_vs_vram",
            "swap",
            "memory_available",
            "cgroup_limits",
        ] {
            assert!(!with_check(&findings, check).is_empty(), "{check} reported");
        }
        // Per-GPU checks report once per GPU.
        assert_eq!(with_check(&findings, "gpu_persistence_mode").len(), 2);
    }

    #[test]
    fn healthy_cpu_machine() {
        let mut p = profile_with_gpus(0, |_| {});
        p.gpu_probe.reason = Some("NVML is not available (libnvidia-ml.so.1 not found)".into());
        let findings = diagnose(&p, None);
        let gpu = only(&findings, "gpu_available");
        assert_eq!(gpu.severity, Severity::Info);
        assert!(
            gpu.measured
                .starts_with("running on CPU: NVML is not available")
        );
        // GPU checks do not apply.
        for check in [
            "gpu_numa_affinity",
            "gpu_persistence_mode",
            "onnxruntime_cuda_provider",
            "cuda_driver_version",
            "host_ram_vs_vram",
        ] {
            assert!(with_check(&findings, check).is_empty(), "{check} skipped");
        }
        assert!(
            findings
                .iter()
                .filter(|f| f.check != "gpu_available")
                .all(|f| f.severity == Severity::Ok)
        );
    }

    #[test]
    fn numa_affinity_names_the_node() {
        let mut p = profile_with_gpus(2, |g| {
            g.numa_node = Some(i32::try_from(g.index).unwrap_or(0));
        });
        two_numa_nodes(&mut p);
        let findings = diagnose(&p, None);
        let numa = with_check(&findings, "gpu_numa_affinity");
        assert_eq!(numa.len(), 2);
        assert!(numa.iter().all(|f| f.severity == Severity::Info));
        assert!(numa[1].measured.contains("NUMA node 1 of 2 (CPUs 32-63)"));
        assert!(
            numa[1]
                .fix
                .contains("numactl --cpunodebind=1 --membind=1 narrator worker --device cuda:1"),
            "{}",
            numa[1].fix
        );
        assert!(numa[0].fix.contains("--cpunodebind=0 --membind=0"));
        assert!(numa[0].fix.contains("cuda:0"));
    }

    #[test]
    fn numa_affinity_without_node_uses_cpu_affinity() {
        let mut p = profile_with_gpus(1, |g| {
            g.numa_node = None;
            g.cpu_affinity = Some("0-15,32-47".into());
        });
        two_numa_nodes(&mut p);
        let f = only(&diagnose(&p, None), "gpu_numa_affinity");
        assert_eq!(f.severity, Severity::Info);
        assert!(
            f.fix
                .contains("taskset -c 0-15,32-47 narrator worker --device cuda:0")
        );
    }

    #[test]
    fn persistence_off_warns() {
        let p = profile_with_gpus(2, |g| g.persistence_mode = Some(g.index == 0));
        let findings = diagnose(&p, None);
        let pm = with_check(&findings, "gpu_persistence_mode");
        assert_eq!(pm[0].severity, Severity::Ok);
        assert_eq!(pm[1].severity, Severity::Warning);
        assert!(pm[1].fix.contains("sudo nvidia-smi -i 1 -pm 1"));
    }

    #[test]
    fn low_power_limit_warns() {
        let p = profile_with_gpus(1, |g| g.power_limit_watts = Some(450.0));
        let f = only(&diagnose(&p, None), "gpu_power_limit");
        assert_eq!(f.severity, Severity::Warning);
        assert!(f.measured.contains("450 W"));
        assert!(f.measured.contains("700 W"));
        assert_eq!(f.fix, "sudo nvidia-smi -i 0 -pl 700");
    }

    #[test]
    fn hot_gpu_warns() {
        let p = profile_with_gpus(1, |g| g.temperature_c = Some(84));
        let f = only(&diagnose(&p, None), "gpu_thermal_throttling");
        assert_eq!(f.severity, Severity::Warning);
        assert!(f.measured.contains("84 C (slowdown at 87 C)"));
        assert!(f.fix.contains("cooling"));
        // 6 C below slowdown is fine.
        let p = profile_with_gpus(1, |g| g.temperature_c = Some(81));
        let f = only(&diagnose(&p, None), "gpu_thermal_throttling");
        assert_eq!(f.severity, Severity::Ok);
    }

    #[test]
    fn throttle_reasons_warn_except_benign_ones() {
        let p = profile_with_gpus(1, |g| {
            g.throttle_reasons = vec!["gpu_idle".into(), "applications_clocks_setting".into()];
        });
        let f = only(&diagnose(&p, None), "gpu_thermal_throttling");
        assert_eq!(f.severity, Severity::Ok);

        let p = profile_with_gpus(1, |g| {
            g.throttle_reasons = vec!["sw_power_cap".into(), "hw_thermal_slowdown".into()];
        });
        let f = only(&diagnose(&p, None), "gpu_thermal_throttling");
        assert_eq!(f.severity, Severity::Warning);
        assert!(f.measured.contains("sw_power_cap, hw_thermal_slowdown"));
        assert!(f.fix.contains("power limit"));
        assert!(f.fix.contains("cooling"));
    }

    #[test]
    fn swap_in_use_and_swapping() {
        let mut p = profile_with_gpus(0, |_| {});
        p.memory.swap_total_bytes = 8 * GIB;
        p.memory.swap_used_bytes = GIB;
        let f = only(&diagnose(&p, None), "swap");
        assert_eq!(f.severity, Severity::Info);
        assert!(f.measured.contains("1.0 GiB of 8.0 GiB"));

        p.memory.swap_in_pages_per_s = Some(250.0);
        let f = only(&diagnose(&p, None), "swap");
        assert_eq!(f.severity, Severity::Warning);
        assert!(f.measured.contains("250 pages/s in"));
        assert!(f.why.contains("model weights or batches are being paged"));
        assert!(f.fix.contains("sudo swapoff -a"));
        assert!(f.fix.contains("Reduce the batch"));
    }

    #[test]
    fn ram_below_twice_vram_warns() {
        let mut p = profile_with_gpus(2, |_| {});
        p.memory.total_bytes = 256 * GIB;
        p.memory.available_bytes = 200 * GIB;
        let f = only(&diagnose(&p, None), "host_ram_vs_vram");
        assert_eq!(f.severity, Severity::Warning);
        assert!(f.measured.contains("282.0 GiB"), "{}", f.measured);
        assert!(f.fix.contains("564.0 GiB"), "{}", f.fix);

        // A cgroup limit counts as the RAM.
        let mut p = profile_with_gpus(1, |_| {});
        p.memory.cgroup_limit_bytes = Some(64 * GIB);
        let f = only(&diagnose(&p, None), "host_ram_vs_vram");
        assert_eq!(f.severity, Severity::Warning);
        assert!(f.measured.contains("(cgroup limit)"));
    }

    #[test]
    fn old_driver_for_cuda_build_is_an_error() {
        let p = profile_with_gpus(1, |g| g.cuda_driver_version = Some("11.8".into()));
        let rt = cuda_runtime(true, Some(12));
        let f = only(&diagnose(&p, Some(&rt)), "cuda_driver_version");
        assert_eq!(f.severity, Severity::Error);
        assert!(f.measured.contains("11.8"));
        assert!(f.fix.contains("Upgrade the NVIDIA driver"));
        assert!(f.fix.contains("CUDA 12"));
        assert!(f.fix.contains("ONNX Runtime build for CUDA 11"));

        // A newer driver runs older CUDA builds.
        let p = profile_with_gpus(1, |g| g.cuda_driver_version = Some("13.0".into()));
        let f = only(&diagnose(&p, Some(&rt)), "cuda_driver_version");
        assert_eq!(f.severity, Severity::Ok);
    }

    #[test]
    fn cpu_only_runtime_with_gpu_is_an_error() {
        let p = profile_with_gpus(1, |_| {});
        let rt = cuda_runtime(false, None);
        let findings = diagnose(&p, Some(&rt));
        let f = only(&findings, "onnxruntime_cuda_provider");
        assert_eq!(f.severity, Severity::Error);
        assert!(f.fix.to_lowercase().contains("ops/setup.sh --gpu"));
        assert!(f.fix.contains("--onnxruntime PATH"));
        // The driver check needs a CUDA build; it does not apply.
        assert!(with_check(&findings, "cuda_driver_version").is_empty());
        // Without runtime facts the provider is not checked.
        let f = only(&diagnose(&p, None), "onnxruntime_cuda_provider");
        assert_eq!(f.severity, Severity::Info);
    }

    #[test]
    fn cgroup_limits_are_info() {
        let mut p = profile_with_gpus(0, |_| {});
        p.memory.cgroup_limit_bytes = Some(16 * GIB);
        p.cpu.cgroup_cpu_limit = Some(4.0);
        let f = only(&diagnose(&p, None), "cgroup_limits");
        assert_eq!(f.severity, Severity::Info);
        assert!(f.measured.contains("memory limit 16.0 GiB"));
        assert!(f.measured.contains("CPU limit 4.00 of 64 cores"));
        assert!(f.why.contains("plans"));
        // A limit above the machine is no limit.
        p.memory.cgroup_limit_bytes = Some(4096 * GIB);
        p.cpu.cgroup_cpu_limit = Some(128.0);
        let f = only(&diagnose(&p, None), "cgroup_limits");
        assert_eq!(f.severity, Severity::Ok);
    }

    #[test]
    fn low_available_memory_warns() {
        let mut p = profile_with_gpus(0, |_| {});
        p.memory.available_bytes = 512 << 20;
        let f = only(&diagnose(&p, None), "memory_available");
        assert_eq!(f.severity, Severity::Warning);
        assert!(f.measured.contains("512.0 MiB"));
        // Headroom under a cgroup limit counts too.
        let mut p = profile_with_gpus(0, |_| {});
        p.memory.cgroup_limit_bytes = Some(4 * GIB);
        p.memory.cgroup_usage_bytes = Some(4 * GIB - (100 << 20));
        let f = only(&diagnose(&p, None), "memory_available");
        assert_eq!(f.severity, Severity::Warning);
        assert!(f.measured.contains("cgroup"));
    }

    #[test]
    fn library_versions() {
        let v = |p: &str| version_from_library_path(Path::new(p));
        assert_eq!(
            v("/usr/lib/libonnxruntime.so.1.32.0").as_deref(),
            Some("1.32.0")
        );
        assert_eq!(v("libonnxruntime.so.1.22.0").as_deref(), Some("1.22.0"));
        assert_eq!(
            v("/opt/libonnxruntime.1.20.1.dylib").as_deref(),
            Some("1.20.1")
        );
        assert_eq!(v("libonnxruntime.so.1").as_deref(), Some("1"));
        assert_eq!(v("/usr/lib/libonnxruntime.so"), None);
        assert_eq!(v("onnxruntime.dll"), None);
        assert_eq!(v("/"), None);
    }

    #[test]
    fn severity_serializes_lowercase() {
        let json = serde_json::to_string(&Severity::Warning).expect("json");
        assert_eq!(json, "\"warning\"");
        let f = finding("swap", Severity::Ok, "m", "w", "");
        let back: Finding =
            serde_json::from_str(&serde_json::to_string(&f).expect("json")).expect("parse");
        assert_eq!(back, f);
        assert!(Severity::Error > Severity::Warning && Severity::Warning > Severity::Info);
    }

    #[test]
    fn report_is_ascii_with_markers() {
        let mut p = profile_with_gpus(1, |g| g.persistence_mode = Some(false));
        two_numa_nodes(&mut p);
        let rt = cuda_runtime(false, None);
        let findings = diagnose(&p, Some(&rt));
        let text = render_text(&p, &findings);
        println!("{text}");
        assert!(text.is_ascii());
        assert!(text.contains("CPU:     Test CPU (GenuineIntel), 32 physical / 64 logical"));
        assert!(text.contains("NUMA:    2 node(s)"));
        assert!(text.contains("GPU 0:   NVIDIA H200"));
        assert!(text.contains("[ok]"));
        assert!(text.contains("[info]"));
        assert!(text.contains("[WARN]   gpu_persistence_mode"));
        assert!(text.contains("[ERROR]  onnxruntime_cuda_provider"));
        assert!(text.contains("fix: sudo nvidia-smi -i 0 -pm 1"));

        let cpu = profile_with_gpus(0, |_| {});
        let text = render_text(&cpu, &diagnose(&cpu, None));
        assert!(text.contains("GPU:     none (NVML found no GPU; running on CPU)"));
        assert!(text.is_ascii());
    }

    #[test]
    fn byte_formatting() {
        assert_eq!(fmt_bytes(0), "0 B");
        assert_eq!(fmt_bytes(1023), "1023 B");
        assert_eq!(fmt_bytes(1536), "1.5 KiB");
        assert_eq!(fmt_bytes(23 * GIB + GIB / 2), "23.5 GiB");
        assert_eq!(fmt_bytes(2 << 40), "2.0 TiB");
    }
}
