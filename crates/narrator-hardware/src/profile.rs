//! One probe of the machine a worker runs on.
//!
//! [`probe`] gathers the CPU and memory (sysinfo), cgroup limits, swap activity and NUMA
//! layout (`/proc` and `/sys`), and every NVIDIA GPU NVML can see. Nothing here fails:
//! a machine without NVML, without a driver or without a GPU gives a CPU-only profile
//! whose [`GpuProbe::reason`] says why, and a GPU field that a board does not report
//! (NVML answers "not supported" per field on some boards) is `None`.
//!
//! The parsing is split into small pure functions over file contents so it can be tested
//! with literal inputs.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use nvml_wrapper::Nvml;
use nvml_wrapper::bitmasks::device::ThrottleReasons;
use nvml_wrapper::enum_wrappers::device::{
    Clock, EccCounter, MemoryError, TemperatureSensor, TemperatureThreshold,
};
use nvml_wrapper::error::NvmlError;
use serde::{Deserialize, Serialize};
use sysinfo::{CpuRefreshKind, MemoryRefreshKind, RefreshKind, System};

/// How long [`probe`] waits at least between its two `/proc/vmstat` samples.
const SWAP_SAMPLE_INTERVAL: Duration = Duration::from_millis(200);

/// Where cgroup hierarchies are mounted.
const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// cgroup v1 reports "no limit" as a huge number (`PAGE_COUNTER_MAX` rounded to a page,
/// 9223372036854771712 on x86-64); anything at or above this is treated as unlimited.
const V1_UNLIMITED_THRESHOLD: u64 = 1 << 62;

/// Throttle reasons that are not a problem: an idle GPU clocks down, and application
/// clocks are a deliberate setting. [`GpuInfo::throttle_reasons`] uses these names.
pub(crate) const BENIGN_THROTTLE_REASONS: &[&str] = &["gpu_idle", "applications_clocks_setting"];

/// Everything a worker needs to know about the machine it runs on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HardwareProfile {
    /// Host name ("unknown" when the system does not say).
    pub host: String,
    /// Operating system, e.g. "Linux (Ubuntu 24.04)".
    pub os: Option<String>,
    /// Kernel version, e.g. "6.8.0-45-generic".
    pub kernel: Option<String>,
    /// Processor.
    pub cpu: CpuInfo,
    /// RAM, swap and the cgroup memory limit.
    pub memory: MemoryInfo,
    /// NUMA nodes from `/sys/devices/system/node`; empty when the kernel shows none.
    pub numa_nodes: Vec<NumaNode>,
    /// NVIDIA GPUs NVML reported; empty on a CPU-only machine.
    pub gpus: Vec<GpuInfo>,
    /// Whether GPUs could be probed, and if not, why.
    pub gpu_probe: GpuProbe,
    /// When the probe ran (milliseconds since the Unix epoch).
    pub probed_at_unix_ms: u64,
}

/// The processor and how much of it this process may use.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CpuInfo {
    /// Model name ("unknown CPU" when the system does not say).
    pub model: String,
    /// Vendor id, e.g. "GenuineIntel".
    pub vendor: Option<String>,
    /// Physical cores (equal to `logical_cores` when the system does not say).
    pub physical_cores: usize,
    /// Logical CPUs (hardware threads) of the machine.
    pub logical_cores: usize,
    /// Current frequency of the first CPU, in MHz.
    pub frequency_mhz: Option<u64>,
    /// CPU limit of this process's cgroup, in cores (cgroup v2 `cpu.max`, or v1
    /// `cpu.cfs_quota_us / cpu.cfs_period_us`); `None` when unlimited.
    pub cgroup_cpu_limit: Option<f64>,
    /// Cores this process can actually use: the smallest of `logical_cores`, the
    /// standard library's available parallelism (CPU affinity) and the cgroup limit
    /// rounded up; at least 1.
    pub usable_cores: usize,
}

/// RAM, swap and cgroup memory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemoryInfo {
    /// Physical RAM.
    pub total_bytes: u64,
    /// RAM available for new allocations without swapping (`MemAvailable`).
    pub available_bytes: u64,
    /// Swap space configured.
    pub swap_total_bytes: u64,
    /// Swap space in use.
    pub swap_used_bytes: u64,
    /// Pages swapped in per second during the probe (`pswpin` in `/proc/vmstat`).
    pub swap_in_pages_per_s: Option<f64>,
    /// Pages swapped out per second during the probe (`pswpout` in `/proc/vmstat`).
    pub swap_out_pages_per_s: Option<f64>,
    /// Memory limit of this process's cgroup (v2 `memory.max`, v1
    /// `memory.limit_in_bytes`); `None` when unlimited.
    pub cgroup_limit_bytes: Option<u64>,
    /// Memory the cgroup uses now (v2 `memory.current`, v1 `memory.usage_in_bytes`).
    pub cgroup_usage_bytes: Option<u64>,
}

/// One NUMA node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NumaNode {
    /// Node number (the N of `nodeN`).
    pub id: u32,
    /// The node's CPUs as the kernel lists them, e.g. "0-15,32-47".
    pub cpus: String,
    /// Memory attached to the node.
    pub memory_total_bytes: Option<u64>,
}

/// Whether GPUs could be probed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuProbe {
    /// True when NVML started and reported at least one GPU.
    pub available: bool,
    /// Why there are no GPUs (no NVML, no driver, no device), when `available` is false.
    pub reason: Option<String>,
}

/// CUDA compute capability, e.g. 9.0 for Hopper.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ComputeCapability {
    /// Major version.
    pub major: i32,
    /// Minor version.
    pub minor: i32,
}

/// Current and maximum clocks of a GPU, in MHz.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuClocks {
    /// Current graphics clock.
    pub graphics_mhz: Option<u32>,
    /// Current SM clock.
    pub sm_mhz: Option<u32>,
    /// Current memory clock.
    pub memory_mhz: Option<u32>,
    /// Maximum graphics clock.
    pub max_graphics_mhz: Option<u32>,
    /// Maximum SM clock.
    pub max_sm_mhz: Option<u32>,
    /// Maximum memory clock.
    pub max_memory_mhz: Option<u32>,
}

/// One NVIDIA GPU as NVML reports it. Fields a board does not report are `None`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuInfo {
    /// NVML index (the CUDA device index unless `CUDA_VISIBLE_DEVICES` reorders them).
    pub index: u32,
    /// Model name, e.g. "NVIDIA H200".
    pub name: String,
    /// GPU UUID, e.g. "GPU-5f2c...".
    pub uuid: String,
    /// Total device memory.
    pub memory_total_bytes: u64,
    /// Free device memory now.
    pub memory_free_bytes: u64,
    /// Device memory in use now.
    pub memory_used_bytes: u64,
    /// CUDA compute capability.
    pub compute_capability: Option<ComputeCapability>,
    /// NVIDIA driver version, e.g. "550.90.07".
    pub driver_version: Option<String>,
    /// Highest CUDA version the driver supports, e.g. "12.4".
    pub cuda_driver_version: Option<String>,
    /// GPU die temperature, in degrees Celsius.
    pub temperature_c: Option<u32>,
    /// Temperature at which the GPU starts to slow down, in degrees Celsius.
    pub slowdown_temperature_c: Option<u32>,
    /// Power draw now, in watts.
    pub power_draw_watts: Option<f64>,
    /// Enforced power limit, in watts.
    pub power_limit_watts: Option<f64>,
    /// Default power limit of the board, in watts.
    pub power_default_limit_watts: Option<f64>,
    /// Whether persistence mode is on (the driver stays loaded between processes).
    pub persistence_mode: Option<bool>,
    /// Current and maximum clocks.
    pub clocks: GpuClocks,
    /// Active throttle reasons (clock event reasons), e.g. "gpu_idle", "sw_power_cap",
    /// "hw_thermal_slowdown"; empty when the clocks are not held back.
    pub throttle_reasons: Vec<String>,
    /// Share of NVML's last sample period a kernel ran, percent.
    #[serde(default)]
    pub utilization_percent: Option<u32>,
    /// Current PCIe link generation.
    pub pcie_generation: Option<u32>,
    /// Maximum PCIe link generation of the GPU and system.
    pub pcie_max_generation: Option<u32>,
    /// Current PCIe link width (lanes).
    pub pcie_width: Option<u32>,
    /// Maximum PCIe link width (lanes).
    pub pcie_max_width: Option<u32>,
    /// PCI bus id as sysfs spells it, e.g. "0000:3b:00.0".
    pub pci_bus_id: Option<String>,
    /// NUMA node the GPU is attached to (from sysfs); `None` when unknown.
    pub numa_node: Option<i32>,
    /// CPUs close to the GPU (NVML's ideal CPU affinity), e.g. "0-15,32-47".
    pub cpu_affinity: Option<String>,
    /// Whether ECC is on now; `None` where the board has no ECC (or NVML did not say).
    #[serde(default)]
    pub ecc_enabled: Option<bool>,
    /// The ECC mode after the next reboot/reset (differs from `ecc_enabled` when a change
    /// is pending).
    #[serde(default)]
    pub ecc_pending: Option<bool>,
    /// Uncorrected ECC errors since the driver loaded (volatile counter).
    #[serde(default)]
    pub ecc_uncorrected_errors: Option<u64>,
}

impl HardwareProfile {
    /// Total memory of all GPUs.
    pub fn total_vram_bytes(&self) -> u64 {
        self.gpus.iter().map(|g| g.memory_total_bytes).sum()
    }

    /// One line for logs, e.g. "2 cores (Intel Xeon ...), 23.4 GiB RAM, no GPU (reason)"
    /// or "64 cores (AMD EPYC ...), 1007.7 GiB RAM, 8 × NVIDIA H200 140 GiB".
    pub fn summary(&self) -> String {
        let cpu = &self.cpu;
        let cores = if cpu.usable_cores < cpu.logical_cores {
            format!("{} cores, {} usable", cpu.logical_cores, cpu.usable_cores)
        } else {
            format!("{} cores", cpu.logical_cores)
        };
        let mut ram = format!("{:.1} GiB RAM", gib(self.memory.total_bytes));
        if let Some(limit) = self.memory.cgroup_limit_bytes
            && limit < self.memory.total_bytes
        {
            ram.push_str(&format!(" ({:.1} GiB cgroup limit)", gib(limit)));
        }
        let gpus = if self.gpus.is_empty() {
            match &self.gpu_probe.reason {
                Some(reason) => format!("no GPU ({reason})"),
                None => "no GPU".to_owned(),
            }
        } else {
            // Group identical boards: "8 × NVIDIA H200 140 GiB".
            let mut groups: Vec<(String, usize)> = Vec::new();
            for gpu in &self.gpus {
                let label = format!("{} {:.0} GiB", gpu.name, gib(gpu.memory_total_bytes));
                match groups.iter_mut().find(|(l, _)| *l == label) {
                    Some((_, n)) => *n += 1,
                    None => groups.push((label, 1)),
                }
            }
            groups
                .iter()
                .map(|(label, n)| format!("{n} × {label}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        format!("{cores} ({}), {ram}, {gpus}", cpu.model)
    }
}

/// Bytes as GiB.
pub(crate) fn gib(bytes: u64) -> f64 {
    bytes as f64 / (1u64 << 30) as f64
}

/// Probes the machine: CPU, memory, swap activity, cgroup limits, NUMA nodes and GPUs.
///
/// Never fails and takes well under a second on a CPU machine: it samples
/// `/proc/vmstat` twice at least 200 ms apart (probing the GPUs in between) to see
/// whether the machine is swapping. NVML itself can take longer to start on GPUs
/// without persistence mode.
pub fn probe() -> HardwareProfile {
    let started = Instant::now();
    let vmstat_before = std::fs::read_to_string("/proc/vmstat").ok();
    let probed_at_unix_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0);

    let system = System::new_with_specifics(
        RefreshKind::nothing()
            .with_memory(MemoryRefreshKind::everything())
            .with_cpu(CpuRefreshKind::nothing().with_frequency()),
    );
    if let Err(e) = &system {
        tracing::warn!(error = %e, "sysinfo could not read the system; CPU and memory figures are partial");
    }
    let system = system.ok();

    let cgroup = CgroupLimits::read();
    let cpu = cpu_info(system.as_ref(), cgroup.cpu_cores);
    let numa_nodes = numa_nodes(Path::new("/sys/devices/system/node"));
    let (gpus, gpu_probe) = probe_gpus(cpu.logical_cores);

    // Second vmstat sample: the GPU probe above usually already took the interval.
    let elapsed = started.elapsed();
    if elapsed < SWAP_SAMPLE_INTERVAL {
        std::thread::sleep(SWAP_SAMPLE_INTERVAL - elapsed);
    }
    let vmstat_after = std::fs::read_to_string("/proc/vmstat").ok();
    let rates = match (vmstat_before, vmstat_after) {
        (Some(before), Some(after)) => swap_rates(&before, &after, started.elapsed()),
        _ => None,
    };

    let memory = MemoryInfo {
        total_bytes: system.as_ref().map_or(0, System::total_memory),
        available_bytes: system.as_ref().map_or(0, System::available_memory),
        swap_total_bytes: system.as_ref().map_or(0, System::total_swap),
        swap_used_bytes: system.as_ref().map_or(0, System::used_swap),
        swap_in_pages_per_s: rates.map(|r| r.0),
        swap_out_pages_per_s: rates.map(|r| r.1),
        cgroup_limit_bytes: cgroup.memory_limit_bytes,
        cgroup_usage_bytes: cgroup.memory_usage_bytes,
    };

    HardwareProfile {
        host: System::host_name().unwrap_or_else(|_| "unknown".to_owned()),
        os: System::long_os_version().ok(),
        kernel: System::kernel_version().ok(),
        cpu,
        memory,
        numa_nodes,
        gpus,
        gpu_probe,
        probed_at_unix_ms,
    }
}

fn cpu_info(system: Option<&System>, cgroup_cpu_limit: Option<f64>) -> CpuInfo {
    let cpus = system.map(System::cpus).unwrap_or_default();
    let available = std::thread::available_parallelism().map_or(1, usize::from);
    let logical_cores = if cpus.is_empty() {
        available
    } else {
        cpus.len()
    };
    let first = cpus.first();
    let model = first
        .map(|c| c.brand().trim().to_owned())
        .filter(|b| !b.is_empty())
        .unwrap_or_else(|| "unknown CPU".to_owned());
    let vendor = first
        .map(|c| c.vendor_id().trim().to_owned())
        .filter(|v| !v.is_empty());
    let frequency_mhz = first.map(|c| c.frequency()).filter(|&f| f > 0);
    let physical_cores = System::physical_core_count()
        .ok()
        .filter(|&n| n > 0)
        .unwrap_or(logical_cores);
    CpuInfo {
        model,
        vendor,
        physical_cores,
        logical_cores,
        frequency_mhz,
        cgroup_cpu_limit,
        usable_cores: usable_cores(logical_cores, available, cgroup_cpu_limit),
    }
}

/// The cores a process may use: the smallest of the machine's logical CPUs, the
/// available parallelism (affinity) and the cgroup limit rounded up; at least 1.
fn usable_cores(logical: usize, available_parallelism: usize, cgroup_limit: Option<f64>) -> usize {
    let mut cores = logical.min(available_parallelism);
    if let Some(limit) = cgroup_limit
        && limit.is_finite()
        && limit > 0.0
    {
        // A float-to-int `as` cast saturates; the limit is positive and finite here.
        cores = cores.min(limit.ceil() as usize);
    }
    cores.max(1)
}

// ---------------------------------------------------------------------------------------
// cgroups

/// The limits of this process's cgroup (the smallest along the path to the root).
#[derive(Debug, Default, Clone, Copy, PartialEq)]
struct CgroupLimits {
    cpu_cores: Option<f64>,
    memory_limit_bytes: Option<u64>,
    memory_usage_bytes: Option<u64>,
}

/// One line of `/proc/self/cgroup`: `hierarchy-id:controllers:path`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct CgroupEntry {
    hierarchy: u32,
    controllers: Vec<String>,
    path: String,
}

impl CgroupLimits {
    fn read() -> Self {
        let Ok(text) = std::fs::read_to_string("/proc/self/cgroup") else {
            return Self::default();
        };
        let entries = parse_proc_cgroup(&text);
        let root = Path::new(CGROUP_ROOT);
        let mut limits = Self::default();

        // cgroup v2: the unified hierarchy at /sys/fs/cgroup (pure v2) or
        // /sys/fs/cgroup/unified (hybrid).
        if let Some(v2) = entries.iter().find(|e| e.hierarchy == 0) {
            let base = if root.join("cgroup.controllers").exists() {
                root.to_path_buf()
            } else {
                root.join("unified")
            };
            let dirs = cgroup_dirs(&base, &v2.path);
            limits.cpu_cores = min_over(&dirs, "cpu.max", parse_cpu_max);
            limits.memory_limit_bytes = min_over(&dirs, "memory.max", parse_memory_max);
            limits.memory_usage_bytes = dirs
                .first()
                .and_then(|d| read_trimmed(&d.join("memory.current")))
                .and_then(|s| s.parse().ok());
        }

        // cgroup v1: one hierarchy per controller group.
        for entry in entries.iter().filter(|e| e.hierarchy != 0) {
            let has = |c: &str| entry.controllers.iter().any(|x| x == c);
            if has("cpu") {
                let dirs = v1_dirs(root, entry, "cpu");
                let quota = dirs.iter().filter_map(|d| {
                    let quota = read_trimmed(&d.join("cpu.cfs_quota_us"))?;
                    let period = read_trimmed(&d.join("cpu.cfs_period_us"))?;
                    parse_cfs_quota(&quota, &period)
                });
                limits.cpu_cores = min_f64(limits.cpu_cores, quota.reduce(f64::min));
            }
            if has("memory") {
                let dirs = v1_dirs(root, entry, "memory");
                let limit = min_over(&dirs, "memory.limit_in_bytes", parse_v1_memory_limit);
                limits.memory_limit_bytes = min_opt(limits.memory_limit_bytes, limit);
                if limits.memory_usage_bytes.is_none() {
                    limits.memory_usage_bytes = dirs
                        .first()
                        .and_then(|d| read_trimmed(&d.join("memory.usage_in_bytes")))
                        .and_then(|s| s.parse().ok());
                }
            }
        }
        limits
    }
}

/// The directories of a v1 controller's hierarchy for `entry`, leaf first.
fn v1_dirs(root: &Path, entry: &CgroupEntry, controller: &str) -> Vec<PathBuf> {
    // Mounted as e.g. /sys/fs/cgroup/cpu,cpuacct with /sys/fs/cgroup/cpu as a link.
    let joined = root.join(entry.controllers.join(","));
    let base = if joined.is_dir() {
        joined
    } else {
        root.join(controller)
    };
    cgroup_dirs(&base, &entry.path)
}

/// The cgroup directory for `path` under `base` and its ancestors up to `base`, leaf
/// first. When the leaf is not visible (a container sees its own cgroup as the mount
/// root), only `base` is returned.
fn cgroup_dirs(base: &Path, path: &str) -> Vec<PathBuf> {
    if !base.is_dir() {
        return Vec::new();
    }
    let relative = path.trim_start_matches('/');
    let leaf = base.join(relative);
    if relative.is_empty() || !leaf.is_dir() {
        return vec![base.to_path_buf()];
    }
    leaf.ancestors()
        .take_while(|d| d.starts_with(base))
        .map(Path::to_path_buf)
        .collect()
}

fn min_over<T: PartialOrd + Copy>(
    dirs: &[PathBuf],
    file: &str,
    parse: fn(&str) -> Option<T>,
) -> Option<T> {
    dirs.iter()
        .filter_map(|d| read_trimmed(&d.join(file)).and_then(|s| parse(&s)))
        .reduce(|a, b| if b < a { b } else { a })
}

fn min_opt(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

fn min_f64(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

fn read_trimmed(path: &Path) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_owned())
}

/// Parses `/proc/self/cgroup`.
fn parse_proc_cgroup(text: &str) -> Vec<CgroupEntry> {
    text.lines()
        .filter_map(|line| {
            let mut parts = line.splitn(3, ':');
            let hierarchy = parts.next()?.trim().parse().ok()?;
            let controllers = parts
                .next()?
                .split(',')
                .filter(|c| !c.is_empty())
                .map(str::to_owned)
                .collect();
            let path = parts.next()?.to_owned();
            Some(CgroupEntry {
                hierarchy,
                controllers,
                path,
            })
        })
        .collect()
}

/// Parses cgroup v2 `cpu.max` ("$MAX $PERIOD") into cores; "max" is no limit.
fn parse_cpu_max(text: &str) -> Option<f64> {
    let mut parts = text.split_whitespace();
    let quota = parts.next()?;
    if quota == "max" {
        return None;
    }
    let quota: f64 = quota.parse().ok()?;
    let period: f64 = parts.next().map_or(Some(100_000.0), |p| p.parse().ok())?;
    (quota > 0.0 && period > 0.0).then(|| quota / period)
}

/// Parses cgroup v1 `cpu.cfs_quota_us` and `cpu.cfs_period_us` into cores; a quota of
/// -1 is no limit.
fn parse_cfs_quota(quota: &str, period: &str) -> Option<f64> {
    let quota: i64 = quota.trim().parse().ok()?;
    let period: i64 = period.trim().parse().ok()?;
    (quota > 0 && period > 0).then(|| quota as f64 / period as f64)
}

/// Parses cgroup v2 `memory.max`; "max" is no limit.
fn parse_memory_max(text: &str) -> Option<u64> {
    let text = text.trim();
    if text == "max" {
        return None;
    }
    text.parse().ok()
}

/// Parses cgroup v1 `memory.limit_in_bytes`; a huge value is no limit.
fn parse_v1_memory_limit(text: &str) -> Option<u64> {
    let limit: u64 = text.trim().parse().ok()?;
    (limit < V1_UNLIMITED_THRESHOLD).then_some(limit)
}

// ---------------------------------------------------------------------------------------
// swap activity

/// The cumulative `pswpin` and `pswpout` counters of `/proc/vmstat`.
fn parse_vmstat_swap(text: &str) -> Option<(u64, u64)> {
    let mut swap_in = None;
    let mut swap_out = None;
    for line in text.lines() {
        let mut parts = line.split_whitespace();
        match (parts.next(), parts.next()) {
            (Some("pswpin"), Some(v)) => swap_in = v.parse().ok(),
            (Some("pswpout"), Some(v)) => swap_out = v.parse().ok(),
            _ => {}
        }
    }
    Some((swap_in?, swap_out?))
}

/// Pages swapped in and out per second between two `/proc/vmstat` samples.
fn swap_rates(before: &str, after: &str, elapsed: Duration) -> Option<(f64, f64)> {
    let secs = elapsed.as_secs_f64();
    if secs <= 0.0 {
        return None;
    }
    let (in0, out0) = parse_vmstat_swap(before)?;
    let (in1, out1) = parse_vmstat_swap(after)?;
    Some((
        in1.saturating_sub(in0) as f64 / secs,
        out1.saturating_sub(out0) as f64 / secs,
    ))
}

// ---------------------------------------------------------------------------------------
// NUMA

/// The NUMA nodes under `dir` (`/sys/devices/system/node`), sorted by id.
fn numa_nodes(dir: &Path) -> Vec<NumaNode> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut nodes: Vec<NumaNode> = entries
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let name = entry.file_name();
            let id: u32 = name.to_str()?.strip_prefix("node")?.parse().ok()?;
            let path = entry.path();
            Some(NumaNode {
                id,
                cpus: read_trimmed(&path.join("cpulist")).unwrap_or_default(),
                memory_total_bytes: std::fs::read_to_string(path.join("meminfo"))
                    .ok()
                    .and_then(|m| parse_numa_meminfo(&m)),
            })
        })
        .collect();
    nodes.sort_by_key(|n| n.id);
    nodes
}

/// The `MemTotal` of a node's `meminfo` ("Node 0 MemTotal:  32768000 kB"), in bytes.
fn parse_numa_meminfo(text: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let (_, rest) = line.split_once("MemTotal:")?;
        let mut parts = rest.split_whitespace();
        let value: u64 = parts.next()?.parse().ok()?;
        let factor = match parts.next() {
            Some("kB") | Some("KB") | Some("KiB") => 1024,
            Some("MB") | Some("MiB") => 1024 * 1024,
            None | Some("B") => 1,
            Some(_) => return None,
        };
        value.checked_mul(factor)
    })
}

/// Formats a CPU bitmask (bit `i` of word `w` is CPU `w * 64 + i`) as a kernel-style
/// CPU list, e.g. "0-3,8". An empty mask gives an empty string.
fn cpulist_from_mask(words: &[u64]) -> String {
    let mut ranges: Vec<(usize, usize)> = Vec::new();
    for (w, &word) in words.iter().enumerate() {
        for bit in 0..64 {
            if word & (1u64 << bit) == 0 {
                continue;
            }
            let cpu = w * 64 + bit;
            match ranges.last_mut() {
                Some((_, end)) if *end + 1 == cpu => *end = cpu,
                _ => ranges.push((cpu, cpu)),
            }
        }
    }
    ranges
        .iter()
        .map(|&(start, end)| {
            if start == end {
                start.to_string()
            } else {
                format!("{start}-{end}")
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// Normalizes an NVML PCI bus id ("00000000:3B:00.0") to the sysfs spelling
/// ("0000:3b:00.0": 4-digit domain, lowercase).
fn normalize_pci_bus_id(bus_id: &str) -> Option<String> {
    let bus_id = bus_id.trim().trim_end_matches('\0');
    let (domain, rest) = bus_id.split_once(':')?;
    // "3B:00.0" without a domain: there is nothing to split a second time.
    if !rest.contains(':') {
        return Some(format!("0000:{}", bus_id.to_ascii_lowercase()));
    }
    let domain = u32::from_str_radix(domain, 16).ok()?;
    Some(format!("{domain:04x}:{}", rest.to_ascii_lowercase()))
}

/// Parses a sysfs `numa_node` file; -1 (no NUMA information) is `None`.
fn parse_numa_node(text: &str) -> Option<i32> {
    let node: i32 = text.trim().parse().ok()?;
    (node >= 0).then_some(node)
}

/// Formats NVML's CUDA driver version (e.g. 12040) as "12.4".
fn format_cuda_version(version: i32) -> String {
    format!(
        "{}.{}",
        nvml_wrapper::cuda_driver_version_major(version),
        nvml_wrapper::cuda_driver_version_minor(version)
    )
}

// ---------------------------------------------------------------------------------------
// GPUs

/// Why NVML could not start, in words for the profile.
fn nvml_unavailable_reason(error: &NvmlError) -> String {
    match error {
        NvmlError::LibloadingError(e) => {
            let text = e.to_string();
            if text.contains("No such file") || text.contains("cannot open shared object") {
                "NVML is not available (libnvidia-ml.so.1 not found): no NVIDIA driver on this \
                 machine; running on CPU"
                    .to_owned()
            } else {
                format!(
                    "NVML is not available (libnvidia-ml.so.1 failed to load: {text}); running on CPU"
                )
            }
        }
        NvmlError::DriverNotLoaded => {
            "NVML is installed but the NVIDIA driver is not loaded; running on CPU".to_owned()
        }
        NvmlError::NoPermission => {
            "NVML has no permission to talk to the NVIDIA driver; running on CPU".to_owned()
        }
        other => format!("NVML failed to start ({other}); running on CPU"),
    }
}

/// The GPUs NVML sees now (memory, utilisation, temperature, power, clocks, throttle
/// reasons), for live metrics; empty without NVML or a GPU. Blocking (NVML calls): run it
/// off the async runtime's threads.
pub fn sample_gpus() -> Vec<GpuInfo> {
    gpus_now().0
}

/// The GPUs NVML sees now and, when none, why: the GPU part of [`probe`] without its
/// 200 ms swap sample (for decisions at start-up).
pub fn gpus_now() -> (Vec<GpuInfo>, GpuProbe) {
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    probe_gpus(cores)
}

/// Probes the GPUs NVML sees. `logical_cores` sizes the CPU affinity mask.
fn probe_gpus(logical_cores: usize) -> (Vec<GpuInfo>, GpuProbe) {
    let nvml = match Nvml::init() {
        Ok(nvml) => nvml,
        Err(e) => {
            tracing::debug!(error = %e, "NVML did not start");
            let reason = nvml_unavailable_reason(&e);
            return (
                Vec::new(),
                GpuProbe {
                    available: false,
                    reason: Some(reason),
                },
            );
        }
    };
    let count = match nvml.device_count() {
        Ok(n) => n,
        Err(e) => {
            return (
                Vec::new(),
                GpuProbe {
                    available: false,
                    reason: Some(format!("NVML could not count GPUs ({e}); running on CPU")),
                },
            );
        }
    };
    if count == 0 {
        return (
            Vec::new(),
            GpuProbe {
                available: false,
                reason: Some("NVML found no GPU; running on CPU".to_owned()),
            },
        );
    }
    let driver_version = nvml.sys_driver_version().ok();
    let cuda_driver_version = nvml.sys_cuda_driver_version().ok().map(format_cuda_version);

    let mut gpus = Vec::new();
    let mut last_error = None;
    for index in 0..count {
        match nvml.device_by_index(index) {
            Ok(device) => gpus.push(gpu_info(
                index,
                &device,
                driver_version.clone(),
                cuda_driver_version.clone(),
                logical_cores,
            )),
            Err(e) => {
                tracing::warn!(index, error = %e, "NVML could not open GPU");
                last_error = Some(e);
            }
        }
    }
    let probe = if gpus.is_empty() {
        GpuProbe {
            available: false,
            reason: Some(format!(
                "NVML found {count} GPU(s) but could not open any ({}); running on CPU",
                last_error.map_or_else(|| "unknown error".to_owned(), |e| e.to_string())
            )),
        }
    } else {
        GpuProbe {
            available: true,
            reason: None,
        }
    };
    (gpus, probe)
}

fn gpu_info(
    index: u32,
    device: &nvml_wrapper::Device<'_>,
    driver_version: Option<String>,
    cuda_driver_version: Option<String>,
    logical_cores: usize,
) -> GpuInfo {
    let memory = device.memory_info().ok();
    if memory.is_none() {
        tracing::warn!(index, "NVML did not report the GPU's memory");
    }
    let pci_bus_id = device
        .pci_info()
        .ok()
        .and_then(|p| normalize_pci_bus_id(&p.bus_id));
    let numa_node = pci_bus_id.as_ref().and_then(|id| {
        let path = Path::new("/sys/bus/pci/devices").join(id).join("numa_node");
        std::fs::read_to_string(path)
            .ok()
            .and_then(|t| parse_numa_node(&t))
    });
    let watts = |mw: u32| f64::from(mw) / 1000.0;
    let ecc = device.is_ecc_enabled().ok();
    GpuInfo {
        index,
        name: device.name().unwrap_or_else(|_| "unknown GPU".to_owned()),
        uuid: device.uuid().unwrap_or_default(),
        memory_total_bytes: memory.as_ref().map_or(0, |m| m.total),
        memory_free_bytes: memory.as_ref().map_or(0, |m| m.free),
        memory_used_bytes: memory.as_ref().map_or(0, |m| m.used),
        compute_capability: device
            .cuda_compute_capability()
            .ok()
            .map(|c| ComputeCapability {
                major: c.major,
                minor: c.minor,
            }),
        driver_version,
        cuda_driver_version,
        temperature_c: device.temperature(TemperatureSensor::Gpu).ok(),
        slowdown_temperature_c: device
            .temperature_threshold(TemperatureThreshold::Slowdown)
            .ok(),
        power_draw_watts: device.power_usage().ok().map(watts),
        power_limit_watts: device.enforced_power_limit().ok().map(watts),
        power_default_limit_watts: device.power_management_limit_default().ok().map(watts),
        persistence_mode: device.is_in_persistent_mode().ok(),
        clocks: GpuClocks {
            graphics_mhz: device.clock_info(Clock::Graphics).ok(),
            sm_mhz: device.clock_info(Clock::SM).ok(),
            memory_mhz: device.clock_info(Clock::Memory).ok(),
            max_graphics_mhz: device.max_clock_info(Clock::Graphics).ok(),
            max_sm_mhz: device.max_clock_info(Clock::SM).ok(),
            max_memory_mhz: device.max_clock_info(Clock::Memory).ok(),
        },
        throttle_reasons: device
            .current_throttle_reasons()
            .map(throttle_reason_names)
            .unwrap_or_default(),
        utilization_percent: device.utilization_rates().ok().map(|u| u.gpu),
        pcie_generation: device.current_pcie_link_gen().ok(),
        pcie_max_generation: device.max_pcie_link_gen().ok(),
        pcie_width: device.current_pcie_link_width().ok(),
        pcie_max_width: device.max_pcie_link_width().ok(),
        pci_bus_id,
        numa_node,
        cpu_affinity: gpu_cpu_affinity(device, logical_cores),
        ecc_enabled: ecc.as_ref().map(|e| e.currently_enabled),
        ecc_pending: ecc.as_ref().map(|e| e.pending_enabled),
        ecc_uncorrected_errors: ecc.as_ref().and_then(|_| {
            device
                .total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile)
                .ok()
        }),
    }
}

#[cfg(target_os = "linux")]
fn gpu_cpu_affinity(device: &nvml_wrapper::Device<'_>, logical_cores: usize) -> Option<String> {
    let bits = usize::try_from(std::ffi::c_ulong::BITS).unwrap_or(64);
    let words = logical_cores.max(1).div_ceil(bits);
    let mask = device.cpu_affinity(words).ok()?;
    // Re-pack the C words (64 or 32 bits each) into 64-bit words.
    let mut packed = vec![0u64; (words * bits).div_ceil(64)];
    for (w, &word) in mask.iter().enumerate() {
        let word = widen(word);
        for bit in 0..bits {
            if word & (1u64 << bit) != 0 {
                let cpu = w * bits + bit;
                if let Some(slot) = packed.get_mut(cpu / 64) {
                    *slot |= 1u64 << (cpu % 64);
                }
            }
        }
    }
    let list = cpulist_from_mask(&packed);
    (!list.is_empty()).then_some(list)
}

/// A C `unsigned long` (32 or 64 bits) as a `u64`.
#[cfg(target_os = "linux")]
fn widen<T: Into<u64>>(word: T) -> u64 {
    word.into()
}

#[cfg(not(target_os = "linux"))]
fn gpu_cpu_affinity(_device: &nvml_wrapper::Device<'_>, _logical_cores: usize) -> Option<String> {
    None
}

/// Names of the active throttle reasons.
/// Every clock throttle reason narrator names (see `GpuInfo::throttle_reasons`).
pub const THROTTLE_REASONS: &[&str] = &[
    "gpu_idle",
    "applications_clocks_setting",
    "sw_power_cap",
    "hw_slowdown",
    "sync_boost",
    "sw_thermal_slowdown",
    "hw_thermal_slowdown",
    "hw_power_brake_slowdown",
    "display_clock_setting",
];

fn throttle_reason_names(reasons: ThrottleReasons) -> Vec<String> {
    const NAMES: &[(ThrottleReasons, &str)] = &[
        (ThrottleReasons::GPU_IDLE, "gpu_idle"),
        (
            ThrottleReasons::APPLICATIONS_CLOCKS_SETTING,
            "applications_clocks_setting",
        ),
        (ThrottleReasons::SW_POWER_CAP, "sw_power_cap"),
        (ThrottleReasons::HW_SLOWDOWN, "hw_slowdown"),
        (ThrottleReasons::SYNC_BOOST, "sync_boost"),
        (ThrottleReasons::SW_THERMAL_SLOWDOWN, "sw_thermal_slowdown"),
        (ThrottleReasons::HW_THERMAL_SLOWDOWN, "hw_thermal_slowdown"),
        (
            ThrottleReasons::HW_POWER_BRAKE_SLOWDOWN,
            "hw_power_brake_slowdown",
        ),
        (
            ThrottleReasons::DISPLAY_CLOCK_SETTING,
            "display_clock_setting",
        ),
    ];
    NAMES
        .iter()
        .filter(|(flag, _)| !flag.is_empty() && reasons.contains(*flag))
        .map(|(_, name)| (*name).to_owned())
        .collect()
}

#[cfg(test)]
#[test]
fn every_throttle_reason_is_named_in_the_list() {
    let all = throttle_reason_names(ThrottleReasons::all());
    assert_eq!(all, THROTTLE_REASONS);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_max_v2() {
        assert_eq!(parse_cpu_max("max 100000"), None);
        assert_eq!(parse_cpu_max("max"), None);
        assert_eq!(parse_cpu_max("200000 100000\n"), Some(2.0));
        assert_eq!(parse_cpu_max("150000 100000"), Some(1.5));
        assert_eq!(parse_cpu_max("50000"), Some(0.5));
        assert_eq!(parse_cpu_max(""), None);
        assert_eq!(parse_cpu_max("garbage 100000"), None);
    }

    #[test]
    fn cfs_quota_v1() {
        assert_eq!(parse_cfs_quota("-1", "100000"), None);
        assert_eq!(parse_cfs_quota("400000\n", "100000\n"), Some(4.0));
        assert_eq!(parse_cfs_quota("50000", "0"), None);
    }

    #[test]
    fn memory_limits() {
        assert_eq!(parse_memory_max("max\n"), None);
        assert_eq!(parse_memory_max("8589934592\n"), Some(8_589_934_592));
        assert_eq!(parse_memory_max("lots"), None);
        assert_eq!(parse_v1_memory_limit("9223372036854771712\n"), None);
        assert_eq!(parse_v1_memory_limit("4294967296"), Some(4_294_967_296));
    }

    #[test]
    fn proc_self_cgroup() {
        let v1 = "4:memory:/process_api/abc\n2:cpu,cpuacct:/\n0::/\n";
        let entries = parse_proc_cgroup(v1);
        assert_eq!(entries.len(), 3);
        assert_eq!(entries[0].hierarchy, 4);
        assert_eq!(entries[0].controllers, vec!["memory"]);
        assert_eq!(entries[0].path, "/process_api/abc");
        assert_eq!(entries[1].controllers, vec!["cpu", "cpuacct"]);
        assert_eq!(entries[2].hierarchy, 0);
        assert!(entries[2].controllers.is_empty());
        assert_eq!(entries[2].path, "/");
        // A path with a colon stays whole.
        let odd = parse_proc_cgroup("0::/a:b\n");
        assert_eq!(odd[0].path, "/a:b");
    }

    #[test]
    fn vmstat_swap_rates() {
        let before = "nr_free_pages 1000\npswpin 100\npswpout 40\npgfault 5\n";
        let after = "nr_free_pages 900\npswpin 150\npswpout 40\npgfault 9\n";
        assert_eq!(parse_vmstat_swap(before), Some((100, 40)));
        let (r_in, r_out) = swap_rates(before, after, Duration::from_millis(500)).expect("rates");
        assert!((r_in - 100.0).abs() < 1e-9);
        assert_eq!(r_out, 0.0);
        // Counters missing (no swap support compiled in): no rate.
        assert_eq!(parse_vmstat_swap("nr_free_pages 1\n"), None);
        assert_eq!(
            swap_rates("pswpin 1\n", "pswpin 2\n", Duration::from_secs(1)),
            None
        );
        assert_eq!(swap_rates(before, after, Duration::ZERO), None);
    }

    #[test]
    fn numa_meminfo_line() {
        let text = "Node 0 MemTotal:       32768000 kB\nNode 0 MemFree:        1000 kB\n";
        assert_eq!(parse_numa_meminfo(text), Some(32_768_000 * 1024));
        assert_eq!(parse_numa_meminfo("Node 1 MemFree: 5 kB\n"), None);
    }

    #[test]
    fn numa_node_file() {
        assert_eq!(parse_numa_node("-1\n"), None);
        assert_eq!(parse_numa_node("1\n"), Some(1));
        assert_eq!(parse_numa_node(""), None);
    }

    #[test]
    fn cpulist_formatting() {
        assert_eq!(cpulist_from_mask(&[0b1_0000_1111]), "0-3,8");
        assert_eq!(cpulist_from_mask(&[]), "");
        assert_eq!(cpulist_from_mask(&[0, 0]), "");
        assert_eq!(cpulist_from_mask(&[1]), "0");
        // 0-15 and 32-47 on the first word, 64-79 on the second.
        assert_eq!(
            cpulist_from_mask(&[0x0000_ffff_0000_ffff, 0xffff]),
            "0-15,32-47,64-79"
        );
        // A range running across the word boundary.
        assert_eq!(cpulist_from_mask(&[1u64 << 63, 1]), "63-64");
        assert_eq!(cpulist_from_mask(&[u64::MAX]), "0-63");
    }

    #[test]
    fn pci_bus_id_normalization() {
        assert_eq!(
            normalize_pci_bus_id("00000000:3B:00.0").as_deref(),
            Some("0000:3b:00.0")
        );
        assert_eq!(
            normalize_pci_bus_id("00000001:AF:00.0").as_deref(),
            Some("0001:af:00.0")
        );
        assert_eq!(
            normalize_pci_bus_id("0000:3b:00.0").as_deref(),
            Some("0000:3b:00.0")
        );
        assert_eq!(
            normalize_pci_bus_id("3B:00.0").as_deref(),
            Some("0000:3b:00.0")
        );
        assert_eq!(normalize_pci_bus_id("nonsense"), None);
        assert_eq!(normalize_pci_bus_id("zz:3B:00.0"), None);
    }

    #[test]
    fn cuda_version_formatting() {
        assert_eq!(format_cuda_version(12040), "12.4");
        assert_eq!(format_cuda_version(11080), "11.8");
        assert_eq!(format_cuda_version(13000), "13.0");
    }

    #[test]
    fn usable_core_count() {
        assert_eq!(usable_cores(16, 16, None), 16);
        assert_eq!(usable_cores(16, 8, None), 8);
        assert_eq!(usable_cores(16, 16, Some(2.5)), 3);
        assert_eq!(usable_cores(16, 16, Some(0.2)), 1);
        assert_eq!(usable_cores(4, 4, Some(64.0)), 4);
        assert_eq!(usable_cores(0, 0, None), 1);
    }

    #[test]
    fn throttle_names() {
        assert!(throttle_reason_names(ThrottleReasons::empty()).is_empty());
        let names =
            throttle_reason_names(ThrottleReasons::GPU_IDLE | ThrottleReasons::HW_THERMAL_SLOWDOWN);
        assert_eq!(names, vec!["gpu_idle", "hw_thermal_slowdown"]);
        for name in BENIGN_THROTTLE_REASONS {
            let all = throttle_reason_names(ThrottleReasons::all());
            assert!(all.iter().any(|n| n == name), "{name} is a reason name");
        }
    }

    #[test]
    fn nvml_reason_words() {
        assert!(nvml_unavailable_reason(&NvmlError::DriverNotLoaded).contains("driver"));
        assert!(nvml_unavailable_reason(&NvmlError::Unknown).contains("running on CPU"));
    }

    #[test]
    fn cgroup_dirs_walk_up_to_the_base() {
        let base = std::env::temp_dir().join(format!("narrator-hw-cg-{}", std::process::id()));
        let leaf = base.join("a/b");
        std::fs::create_dir_all(&leaf).expect("mkdir");
        std::fs::write(base.join("memory.max"), "max\n").expect("write");
        std::fs::write(base.join("a/memory.max"), "1000\n").expect("write");
        std::fs::write(leaf.join("memory.max"), "2000\n").expect("write");
        let dirs = cgroup_dirs(&base, "/a/b");
        assert_eq!(dirs, vec![leaf.clone(), base.join("a"), base.clone()]);
        assert_eq!(min_over(&dirs, "memory.max", parse_memory_max), Some(1000));
        // A path this namespace cannot see: only the base.
        assert_eq!(cgroup_dirs(&base, "/elsewhere"), vec![base.clone()]);
        assert_eq!(cgroup_dirs(&base, "/"), vec![base.clone()]);
        std::fs::remove_dir_all(&base).expect("cleanup");
    }

    #[test]
    fn summary_line() {
        let mut profile = HardwareProfile {
            host: "h".into(),
            os: None,
            kernel: None,
            cpu: CpuInfo {
                model: "Test CPU".into(),
                vendor: None,
                physical_cores: 2,
                logical_cores: 2,
                frequency_mhz: None,
                cgroup_cpu_limit: None,
                usable_cores: 2,
            },
            memory: MemoryInfo {
                total_bytes: 8 << 30,
                available_bytes: 4 << 30,
                swap_total_bytes: 0,
                swap_used_bytes: 0,
                swap_in_pages_per_s: None,
                swap_out_pages_per_s: None,
                cgroup_limit_bytes: None,
                cgroup_usage_bytes: None,
            },
            numa_nodes: Vec::new(),
            gpus: Vec::new(),
            gpu_probe: GpuProbe {
                available: false,
                reason: Some("no NVML".into()),
            },
            probed_at_unix_ms: 0,
        };
        assert_eq!(
            profile.summary(),
            "2 cores (Test CPU), 8.0 GiB RAM, no GPU (no NVML)"
        );
        assert_eq!(profile.total_vram_bytes(), 0);
        let gpu = GpuInfo {
            index: 0,
            name: "NVIDIA H200".into(),
            uuid: "GPU-0".into(),
            memory_total_bytes: 141 << 30,
            memory_free_bytes: 140 << 30,
            memory_used_bytes: 1 << 30,
            compute_capability: None,
            driver_version: None,
            cuda_driver_version: None,
            temperature_c: None,
            slowdown_temperature_c: None,
            power_draw_watts: None,
            power_limit_watts: None,
            power_default_limit_watts: None,
            persistence_mode: None,
            clocks: GpuClocks::default(),
            throttle_reasons: Vec::new(),
            utilization_percent: None,
            pcie_generation: None,
            pcie_max_generation: None,
            pcie_width: None,
            pcie_max_width: None,
            pci_bus_id: None,
            numa_node: None,
            cpu_affinity: None,
            ecc_enabled: None,
            ecc_pending: None,
            ecc_uncorrected_errors: None,
        };
        profile.gpus = vec![gpu.clone(), GpuInfo { index: 1, ..gpu }];
        profile.gpu_probe = GpuProbe {
            available: true,
            reason: None,
        };
        profile.cpu.usable_cores = 1;
        assert_eq!(
            profile.summary(),
            "2 cores, 1 usable (Test CPU), 8.0 GiB RAM, 2 × NVIDIA H200 141 GiB"
        );
        assert_eq!(profile.total_vram_bytes(), 282 << 30);
    }

    #[test]
    fn probe_this_machine() {
        let started = Instant::now();
        let profile = probe();
        let elapsed = started.elapsed();
        let json = serde_json::to_string_pretty(&profile).expect("serialize");
        println!("{json}");
        println!("{}", profile.summary());
        println!("probe took {elapsed:?}");

        assert!(profile.cpu.logical_cores >= 1);
        assert!(profile.cpu.physical_cores >= 1);
        assert!(profile.cpu.usable_cores >= 1);
        assert!(profile.cpu.usable_cores <= profile.cpu.logical_cores);
        assert!(profile.memory.total_bytes > 0);
        assert!(profile.memory.available_bytes <= profile.memory.total_bytes);
        assert!(profile.probed_at_unix_ms > 0);

        let value: serde_json::Value = serde_json::from_str(&json).expect("json");
        assert!(value["cpu"]["physical_cores"].is_u64());
        assert!(value["cpu"]["logical_cores"].is_u64());
        assert!(value["memory"]["total_bytes"].is_u64());
        assert!(value["memory"]["swap_used_bytes"].is_u64());
        let back: HardwareProfile = serde_json::from_str(&json).expect("round trip");
        assert_eq!(back, profile);

        if profile.gpu_probe.available {
            // NVML is present: the profile must at least be consistent.
            assert!(!profile.gpus.is_empty());
            assert!(profile.gpu_probe.reason.is_none());
            for gpu in &profile.gpus {
                assert!(gpu.memory_used_bytes <= gpu.memory_total_bytes);
            }
        } else {
            assert!(profile.gpus.is_empty());
            let reason = profile.gpu_probe.reason.as_deref().expect("a reason");
            assert!(!reason.is_empty());
            assert_eq!(profile.total_vram_bytes(), 0);
            // Without NVML the probe is quick (the vmstat interval plus file reads).
            assert!(elapsed < Duration::from_secs(1), "probe took {elapsed:?}");
        }
    }
}
