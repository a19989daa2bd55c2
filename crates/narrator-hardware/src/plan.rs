//! Batch plans: how much work one device takes at once.
//!
//! A plan comes from two things: the device's free memory, and a [`Calibration`] of the
//! voice on a device (memory per padded phoneme token, throughput and latency per batch
//! size). Memory gives the ceiling: `max_batch_tokens` is the padded cost (longest item ×
//! items, as in TEI/TGI) that fits in free memory after a safety margin. Throughput gives
//! the knee: the batch after which doubling the batch improves throughput by less than
//! [`PlanLimits::knee_gain`], or its latency passes [`PlanLimits::latency_target_s`]. The
//! plan takes the smaller of the two, so it never exceeds memory and never grows past the
//! point where a bigger batch only adds latency.
//!
//! Everything here is plain arithmetic on measured figures, so plans for simulated GPUs
//! (`narrator plan --simulate-gpu`) and the unit tests below need no device.

use serde::{Deserialize, Serialize};

/// The device a plan is for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum DeviceSpec {
    /// An NVIDIA GPU.
    Gpu {
        /// Model name, e.g. "NVIDIA H200".
        name: String,
        /// CUDA device index.
        index: u32,
        /// Total memory.
        total_bytes: u64,
        /// Free memory now (before this worker's batches; the model weights may already be
        /// loaded, see [`Calibration::fixed_bytes`]).
        free_bytes: u64,
    },
    /// CPU execution.
    Cpu {
        /// Cores this process may use (cgroup limit included).
        cores: usize,
        /// Available RAM (cgroup limit included).
        available_bytes: u64,
    },
}

impl DeviceSpec {
    /// `cuda:N` or `cpu`.
    pub fn label(&self) -> String {
        match self {
            DeviceSpec::Gpu { index, .. } => format!("cuda:{index}"),
            DeviceSpec::Cpu { .. } => "cpu".into(),
        }
    }

    /// The device model a calibration is valid for ("cpu" for every CPU).
    pub fn model(&self) -> String {
        match self {
            DeviceSpec::Gpu { name, .. } => name.clone(),
            DeviceSpec::Cpu { .. } => "cpu".into(),
        }
    }

    /// A simulated GPU of `gib` GiB with 95 % of it free (the driver and context keep the
    /// rest), for `--simulate-gpu NAME:GIB`.
    pub fn simulated_gpu(name: &str, gib: f64) -> Self {
        let total = (gib * GIB) as u64;
        DeviceSpec::Gpu {
            name: name.to_string(),
            index: 0,
            total_bytes: total,
            free_bytes: (total as f64 * 0.95) as u64,
        }
    }

    fn available_bytes(&self) -> u64 {
        match self {
            DeviceSpec::Gpu { free_bytes, .. } => *free_bytes,
            DeviceSpec::Cpu {
                available_bytes, ..
            } => *available_bytes,
        }
    }
}

const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

/// One measured batch size.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CalibrationPoint {
    /// Items in the batch (all of [`Calibration::item_tokens`] tokens).
    pub batch: usize,
    /// Padded tokens: longest item × items.
    pub tokens: usize,
    /// Memory the batch needed above the loaded model (high-water mark delta).
    pub memory_bytes: u64,
    /// Median wall time of one run.
    pub seconds: f64,
    /// Slowest run (with the few runs calibration can afford, this stands for p95).
    pub max_seconds: f64,
    /// Audio one run produced, in seconds.
    pub audio_seconds: f64,
}

impl CalibrationPoint {
    /// Audio seconds per wall second (median run).
    pub fn throughput(&self) -> f64 {
        if self.seconds > 0.0 {
            self.audio_seconds / self.seconds
        } else {
            0.0
        }
    }

    /// Audio seconds per wall second of its slowest run.
    pub fn worst_throughput(&self) -> f64 {
        if self.max_seconds > 0.0 {
            self.audio_seconds / self.max_seconds
        } else {
            self.throughput()
        }
    }

    /// Whether this (larger) batch beats `smaller` by at least `gain` even in its slowest
    /// run: on a noisy host a flat curve then stays at the smaller batch, while a device
    /// that really gains from batching (a GPU below its knee) passes easily.
    pub fn beats(&self, smaller: &CalibrationPoint, gain: f64) -> bool {
        self.worst_throughput() >= smaller.throughput() * (1.0 + gain)
    }
}

/// One thread layout's throughput on CPU (batch 1, every session busy).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LayoutPoint {
    /// Sessions.
    pub sessions: usize,
    /// Intra-op threads per session.
    pub intra_threads: usize,
    /// Audio seconds per wall second (median of alternated rounds).
    pub throughput: f64,
    /// Resident memory the layout takes at its peak, in bytes: its sessions (weights,
    /// prepacked copies) and the working memory of one sentence-sized run on each, all at
    /// once. `None` where it could not be read (calibrations cached before it was kept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<u64>,
    /// The slowest and the fastest of its rounds (× realtime): the measurement's own
    /// noise. `None` in calibrations cached before they were kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub range: Option<(f64, f64)>,
    /// The graph its sessions loaded where the voice has several ([`Calibration::graph`]);
    /// `None`: the family's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub graph: Option<String>,
}

/// How much faster than the default graph's fastest round another graph's slowest round
/// must be before a calibration loads it instead. Both run in the same thread layout, so
/// the rest of a run (phonemizing, encoding) takes the same share of the CPU with either:
/// the bar is the measurement's noise, which the ranges already carry.
pub const GRAPH_SWITCH_GAIN: f64 = 0.03;

/// How much faster than the default layout's fastest round another layout's slowest round
/// must be before a calibration switches to it. The comparison runs the engine alone; a
/// run also phonemizes and encodes on the same cores, which the default layout (one
/// single-threaded session per core) leaves room for and one session spinning on every
/// core does not: on the 2-core VM an engine-only win of 8 % for 1 × 2 became a 6–16 %
/// loss end to end (issue 28). So the bar is the rest of a run's share of the CPU, not
/// just the noise.
pub const LAYOUT_SWITCH_GAIN: f64 = 0.15;

impl LayoutPoint {
    /// `SESSIONSxTHREADS`, with the graph where one was named (`2x1 fp32`).
    pub fn name(&self) -> String {
        match &self.graph {
            Some(g) => format!("{}x{} {g}", self.sessions, self.intra_threads),
            None => format!("{}x{}", self.sessions, self.intra_threads),
        }
    }

    /// Its slowest round (its median where the rounds were not kept).
    pub fn worst(&self) -> f64 {
        self.range.map_or(self.throughput, |(lo, _)| lo)
    }

    /// Its fastest round (its median where the rounds were not kept).
    pub fn best(&self) -> f64 {
        self.range.map_or(self.throughput, |(_, hi)| hi)
    }

    /// Throughput per GiB of [`Self::memory_bytes`].
    pub fn throughput_per_gib(&self) -> Option<f64> {
        self.memory_bytes
            .filter(|&b| b > 0)
            .map(|b| self.throughput / (b as f64 / f64::from(1u32 << 30)))
    }
}

/// Which of two measured CPU layouts runs, and why. `default` is what an uncalibrated run
/// uses (one single-threaded session per core); `other` replaces it only if even its
/// slowest round beats the default's fastest by `gain` (see [`LAYOUT_SWITCH_GAIN`]), so a
/// calibration confirms the uncalibrated choice unless the measurement clears its own
/// noise. What is compared: throughput, or, when memory is tight (the default layout's
/// peak takes more than half of `available_bytes`, the share an uncalibrated run allows
/// its sessions), throughput per GiB.
pub fn choose_layout<'a>(
    default: &'a LayoutPoint,
    other: &'a LayoutPoint,
    available_bytes: u64,
    gain: f64,
) -> (&'a LayoutPoint, String) {
    let name = |l: &LayoutPoint| l.name();
    let tight = default
        .memory_bytes
        .is_some_and(|b| b > available_bytes / 2);
    let per_gib = (default.throughput_per_gib(), other.throughput_per_gib());
    if let (true, (Some(d), Some(o))) = (tight, per_gib) {
        let mib = |l: &LayoutPoint| l.memory_bytes.unwrap_or(0) >> 20;
        let why = format!(
            "memory is tight ({} MiB available; {} peaks at {} MiB, {} at {} MiB): {:.1} vs {:.1}x realtime per GiB",
            available_bytes >> 20,
            name(default),
            mib(default),
            name(other),
            mib(other),
            d,
            o
        );
        return if o >= d * (1.0 + gain) {
            (
                other,
                format!("{} by throughput per GiB; {why}", name(other)),
            )
        } else {
            (
                default,
                format!("{} by throughput per GiB; {why}", name(default)),
            )
        };
    }
    let why = format!(
        "{} {:.1}x ({:.1}-{:.1}) vs {} {:.1}x ({:.1}-{:.1}) realtime, engine alone; \
         another layout must win by {:.0} % over the default's best round",
        name(default),
        default.throughput,
        default.worst(),
        default.best(),
        name(other),
        other.throughput,
        other.worst(),
        other.best(),
        gain * 100.0
    );
    if other.worst() >= default.best() * (1.0 + gain) {
        (other, format!("{} by throughput: {why}", name(other)))
    } else {
        (default, format!("{} by throughput: {why}", name(default)))
    }
}

/// What calibrating one voice on one device measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Calibration {
    /// Voice name.
    pub voice: String,
    /// Device model ("cpu" for CPUs).
    pub device_model: String,
    /// ONNX Runtime version (calibrations are cached per voice, device model and runtime).
    pub runtime: String,
    /// Padded length of the sentence-sized items measured.
    pub item_tokens: usize,
    /// Fitted memory that does not grow with the batch (workspace), in bytes.
    pub fixed_bytes: u64,
    /// Fitted memory per padded token, in bytes.
    pub bytes_per_token: f64,
    /// Intra-op threads of the session measured.
    pub intra_threads: usize,
    /// Sessions measured.
    pub sessions: usize,
    /// The measured batch sizes, smallest first (empty when supplied by hand).
    pub points: Vec<CalibrationPoint>,
    /// Where it came from.
    pub source: CalibrationSource,
    /// Thread layouts measured on CPU (one session using every core, one single-threaded
    /// session per core); empty when the layout was fixed by flags or on a GPU.
    #[serde(default)]
    pub layouts: Vec<LayoutPoint>,
    /// Why the layout that runs was chosen (empty when none was measured).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub layout_reason: String,
    /// The graph chosen where the voice has several installed for this device (Kokoro's
    /// `int8` and `fp32` on CPU), timed side by side in the chosen layout (they are in
    /// [`Self::layouts`] too); `None`: the family's default, nothing to choose.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub graph: Option<String>,
    /// Why that graph (empty when none was measured).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub graph_reason: String,
    /// Seconds the measurement took.
    pub seconds: f64,
}

/// Where a [`Calibration`] came from (serialized as its lowercase name).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CalibrationSource {
    /// Measured by this process.
    Measured,
    /// Measured earlier on this machine and read from the calibration cache.
    Cache,
    /// A calibration of this GPU model, shipped or from the fleet ([`crate::catalog`]).
    Catalog,
    /// Nothing measured: a memory figure given by hand (`--bytes-per-token`) or none.
    Supplied,
}

impl CalibrationSource {
    /// The name `--json` and the cache files use.
    pub fn as_str(self) -> &'static str {
        match self {
            CalibrationSource::Measured => "measured",
            CalibrationSource::Cache => "cache",
            CalibrationSource::Catalog => "catalog",
            CalibrationSource::Supplied => "supplied",
        }
    }
}

impl std::fmt::Display for CalibrationSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a [`Plan`] was made from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PlanOrigin {
    /// No calibration: the measured default.
    Default,
    /// A calibration of this machine (measured now, or cached).
    Calibration,
    /// A calibration of this GPU model (shipped, or from the fleet).
    Catalog,
    /// Fixed by flags alone (the null engine's `--max-batch`).
    Flags,
    /// Not recorded (plans stored before the field existed).
    #[default]
    Unknown,
}

impl PlanOrigin {
    /// Every origin a plan records, in the order they are read back.
    const RECORDED: [PlanOrigin; 4] = [
        PlanOrigin::Default,
        PlanOrigin::Calibration,
        PlanOrigin::Catalog,
        PlanOrigin::Flags,
    ];

    /// Its name in `--json`, the progress line and the database.
    pub fn as_str(self) -> &'static str {
        match self {
            PlanOrigin::Default => "default",
            PlanOrigin::Calibration => "calibration",
            PlanOrigin::Catalog => "catalog",
            PlanOrigin::Flags => "flags",
            PlanOrigin::Unknown => "unknown",
        }
    }
}

/// Where a plan came from and whether flags changed it, written `ORIGIN` or
/// `ORIGIN+flags` (`default`, `calibration+flags`, ...) in `--json`, the progress line
/// and the database.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(into = "String", from = "String")]
pub struct PlanSource {
    /// What the plan was made from.
    pub origin: PlanOrigin,
    /// Flags (`--sessions`, `--intra-threads`, `--max-batch`) changed it.
    pub flags: bool,
}

impl From<PlanOrigin> for PlanSource {
    fn from(origin: PlanOrigin) -> Self {
        Self {
            origin,
            flags: false,
        }
    }
}

impl std::fmt::Display for PlanSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.origin.as_str())?;
        // A plan made by flags alone says so once.
        if self.flags && self.origin != PlanOrigin::Flags {
            f.write_str("+flags")?;
        }
        Ok(())
    }
}

impl From<PlanSource> for String {
    fn from(s: PlanSource) -> String {
        s.to_string()
    }
}

impl From<String> for PlanSource {
    /// Reads what [`Display`](std::fmt::Display) writes; anything else (an empty string
    /// from older records) is `unknown`.
    fn from(s: String) -> Self {
        let (origin, flags) = match s.strip_suffix("+flags") {
            Some(o) => (o, true),
            None => (s.as_str(), false),
        };
        let origin = PlanOrigin::RECORDED
            .into_iter()
            .find(|o| o.as_str() == origin)
            .unwrap_or(PlanOrigin::Unknown);
        Self { origin, flags }
    }
}

impl Calibration {
    /// A calibration with only a memory figure (`--bytes-per-token`), no throughput curve.
    pub fn supplied(voice: &str, bytes_per_token: f64, item_tokens: usize) -> Self {
        Self {
            voice: voice.to_string(),
            device_model: "any".into(),
            runtime: "any".into(),
            item_tokens,
            fixed_bytes: 0,
            bytes_per_token,
            intra_threads: 1,
            sessions: 1,
            points: Vec::new(),
            source: CalibrationSource::Supplied,
            layouts: Vec::new(),
            layout_reason: String::new(),
            graph: None,
            graph_reason: String::new(),
            seconds: 0.0,
        }
    }

    /// Fits `memory ≈ fixed + bytes_per_token × tokens` to the points (least squares);
    /// with fewer than two distinct sizes, or a non-positive slope (an allocator that
    /// reused memory), falls back to the largest memory per token seen, with no fixed part.
    pub fn fit(points: &[CalibrationPoint]) -> (u64, f64) {
        let n = points.len() as f64;
        let fallback = || {
            let bpt = points
                .iter()
                .filter(|p| p.tokens > 0)
                .map(|p| p.memory_bytes as f64 / p.tokens as f64)
                .fold(0.0, f64::max);
            (0, bpt)
        };
        if points.len() < 2 {
            return fallback();
        }
        let mx = points.iter().map(|p| p.tokens as f64).sum::<f64>() / n;
        let my = points.iter().map(|p| p.memory_bytes as f64).sum::<f64>() / n;
        let sxx: f64 = points.iter().map(|p| (p.tokens as f64 - mx).powi(2)).sum();
        let sxy: f64 = points
            .iter()
            .map(|p| (p.tokens as f64 - mx) * (p.memory_bytes as f64 - my))
            .sum();
        if sxx <= 0.0 || sxy <= 0.0 {
            return fallback();
        }
        let slope = sxy / sxx;
        let intercept = (my - slope * mx).max(0.0);
        (intercept as u64, slope)
    }

    /// The knee: the largest measured batch whose step up from the previous one still
    /// improved throughput by at least `gain` (relative, in its slowest run: see
    /// [`CalibrationPoint::beats`]) and whose slowest run stayed
    /// within `latency_target_s`. `None` without points. `Some((batch, still_rising))`:
    /// `still_rising` is true when the largest measured batch was still improving, so a
    /// bigger one might be better yet.
    pub fn knee(&self, gain: f64, latency_target_s: f64) -> Option<(usize, bool)> {
        let mut pts: Vec<&CalibrationPoint> = self.points.iter().collect();
        pts.sort_by_key(|p| p.batch);
        let first = pts.first()?;
        let mut best = first;
        for p in pts.iter().skip(1) {
            if p.max_seconds > latency_target_s {
                return Some((best.batch, false));
            }
            if p.beats(best, gain) {
                best = p;
            } else {
                return Some((best.batch, false));
            }
        }
        Some((best.batch, pts.len() > 1))
    }
}

/// Knobs of planning (defaults follow the field guide).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlanLimits {
    /// Fraction of free memory kept free (fragmentation, other processes, the CUDA
    /// context growing).
    pub safety_margin: f64,
    /// A bigger batch must improve throughput by at least this much to be worth it.
    pub knee_gain: f64,
    /// The slowest run of a planned batch must stay within this.
    pub latency_target_s: f64,
    /// Upper bound on items per batch, whatever memory allows.
    pub max_requests_cap: usize,
    /// The shortest items counted when turning tokens into a request cap.
    pub short_item_tokens: usize,
    /// Where calibration found no knee on a GPU (no curve, or still rising at its largest
    /// batch): the most sentence-sized items per batch memory alone may give.
    pub uncurved_gpu_items: usize,
}

impl Default for PlanLimits {
    fn default() -> Self {
        Self {
            safety_margin: 0.2,
            knee_gain: 0.05,
            latency_target_s: 2.0,
            max_requests_cap: 256,
            short_item_tokens: 16,
            uncurved_gpu_items: 64,
        }
    }
}

/// How a worker runs one device.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    /// `cuda:N` or `cpu`.
    pub device: String,
    /// Device model.
    pub device_model: String,
    /// Padded-cost budget per engine run: longest item × items.
    pub max_batch_tokens: usize,
    /// Items (utterances) per engine run at most.
    pub max_batch_requests: usize,
    /// How long a partial batch waits for more work once the device is free.
    pub max_wait_ms: u64,
    /// Threads inside each session.
    pub intra_threads: usize,
    /// Sessions (engine threads) on the device.
    pub sessions: usize,
    /// Unacknowledged messages to hold: enough for two batches per session plus one
    /// being stored.
    pub prefetch: usize,
    /// Memory the plan may use for batches, in bytes.
    pub memory_budget_bytes: u64,
    /// Sentence-sized items (of the calibration's length) one batch holds.
    pub batch_items: usize,
    /// One sentence on what decided the plan.
    pub reason: String,
    /// Where the plan came from, and whether flags changed it.
    #[serde(default)]
    pub source: PlanSource,
    /// The graph the sessions loaded where the voice has several for this device
    /// ([`Calibration::graph`]; Kokoro's `int8` or `fp32` on CPU); `None` otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub graph: Option<String>,
}

impl Plan {
    /// One line on the layout: sessions × threads, batch, and where it came from.
    pub fn layout_line(&self) -> String {
        let s = |n: usize| if n == 1 { "" } else { "s" };
        format!(
            "{} session{} x {} thread{} on {}, up to {} item{} per run (plan: {})",
            self.sessions,
            s(self.sessions),
            self.intra_threads,
            s(self.intra_threads),
            self.device,
            self.max_batch_requests,
            s(self.max_batch_requests),
            self.source
        )
    }
}

/// The plan for `device` given `calib` (see the module docs).
pub fn plan(device: &DeviceSpec, calib: &Calibration, limits: &PlanLimits) -> Plan {
    let item = calib.item_tokens.max(1);
    let usable = device.available_bytes() as f64 * (1.0 - limits.safety_margin);
    let for_batches = (usable - calib.fixed_bytes as f64).max(0.0);
    let memory_tokens = if calib.bytes_per_token > 0.0 {
        (for_batches / calib.bytes_per_token) as usize
    } else {
        usize::MAX
    };
    let memory_items = memory_tokens / item;
    let same_device = calib.device_model == device.model();
    let knee = if same_device {
        calib.knee(limits.knee_gain, limits.latency_target_s)
    } else {
        None
    };
    let (sessions, intra) = match device {
        DeviceSpec::Cpu { cores, .. } => {
            let sessions = calib.sessions.clamp(1, (*cores).max(1));
            (sessions, (cores / sessions).max(1))
        }
        DeviceSpec::Gpu { .. } => (1, 1),
    };
    let mib = |b: f64| b / (1024.0 * 1024.0);
    let memory_note = if calib.bytes_per_token > 0.0 {
        format!(
            "{:.0} MiB free for batches at {:.2} MiB per token holds {} items of {} tokens",
            mib(for_batches),
            mib(calib.bytes_per_token),
            memory_items,
            item
        )
    } else {
        "memory per token was not measurable".to_string()
    };
    let (items, why) = match (device, knee) {
        (_, Some((k, false))) if k <= memory_items => (
            k,
            format!(
                "throughput stopped improving by {:.0} % (or latency passed {:.1} s) after batch {k}; {memory_note}",
                limits.knee_gain * 100.0,
                limits.latency_target_s
            ),
        ),
        (DeviceSpec::Cpu { .. }, Some((k, true))) if k <= memory_items => (
            k,
            format!("batch {k} was the largest measured and still the fastest; {memory_note}"),
        ),
        (DeviceSpec::Cpu { .. }, None) => (
            1,
            "no throughput curve for this CPU: one item per run (measured fastest on small CPUs); calibrate to measure".to_string(),
        ),
        (_, Some((k, _))) if k > memory_items => (
            memory_items.max(1),
            format!("memory caps the batch below the measured knee ({k}): {memory_note}"),
        ),
        (DeviceSpec::Gpu { .. }, knee) => {
            // Still rising at the largest measured batch: at least that batch.
            let cap = limits.uncurved_gpu_items.max(knee.map_or(0, |(k, _)| k));
            if memory_items > cap {
                (
                    cap,
                    format!(
                        "no knee measured on this GPU model: {cap} items (the uncurved cap); {memory_note}"
                    ),
                )
            } else {
                (memory_items.max(1), format!("memory decides: {memory_note}"))
            }
        }
        (DeviceSpec::Cpu { .. }, Some((k, _))) => (k, memory_note.clone()),
    };
    let items = items.max(1);
    let max_batch_tokens = (items * item).min(memory_tokens.max(item));
    let max_batch_requests = match device {
        DeviceSpec::Cpu { .. } => items,
        DeviceSpec::Gpu { .. } => (max_batch_tokens / limits.short_item_tokens.max(1))
            .clamp(items, limits.max_requests_cap.max(items)),
    };
    let max_wait_ms = if items <= 1 {
        0
    } else {
        // A quarter of the batch's own run time (bounded): waiting longer than that for a
        // fuller batch costs more latency than it gains throughput.
        let points: &[CalibrationPoint] = if same_device { &calib.points } else { &[] };
        let at_knee = points
            .iter()
            .filter(|p| p.batch <= items)
            .max_by_key(|p| p.batch)
            .map(|p| p.seconds);
        at_knee.map_or(20, |s| ((s * 250.0) as u64).clamp(2, 50))
    };
    let memory_budget_bytes = (max_batch_tokens as f64 * calib.bytes_per_token) as u64;
    Plan {
        device: device.label(),
        device_model: device.model(),
        max_batch_tokens,
        max_batch_requests,
        max_wait_ms,
        intra_threads: intra,
        sessions,
        prefetch: 2 * max_batch_requests * sessions + sessions,
        memory_budget_bytes,
        batch_items: items,
        reason: why,
        source: PlanSource::from(match calib.source {
            CalibrationSource::Supplied => PlanOrigin::Default,
            CalibrationSource::Catalog => PlanOrigin::Catalog,
            CalibrationSource::Measured | CalibrationSource::Cache => PlanOrigin::Calibration,
        }),
        graph: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1024 * 1024;

    /// The field guide's table: sentence-sized items per batch on each GPU.
    const FIELD_GUIDE: &[(&str, f64, usize)] = &[
        ("Tesla T4", 16.0, 4),
        ("NVIDIA GeForce RTX 3060", 12.0, 4),
        ("NVIDIA GeForce RTX 3090", 24.0, 8),
        ("NVIDIA A100-SXM4-40GB", 40.0, 16),
        ("NVIDIA A100-SXM4-80GB", 80.0, 16),
        ("NVIDIA H200", 141.0, 16),
    ];

    fn calib(bpt_mib: f64) -> Calibration {
        let mut c = Calibration::supplied("en_US-joe-medium", bpt_mib * MIB as f64, 128);
        c.fixed_bytes = 300 * MIB;
        c
    }

    fn point(batch: usize, seconds: f64, audio_per_item: f64) -> CalibrationPoint {
        CalibrationPoint {
            batch,
            tokens: batch * 128,
            memory_bytes: 200 * MIB + batch as u64 * 128 * 2 * MIB,
            seconds,
            max_seconds: seconds * 1.1,
            audio_seconds: audio_per_item * batch as f64,
        }
    }

    fn assert_fits(p: &Plan, d: &DeviceSpec, c: &Calibration) {
        let needed = c.fixed_bytes as f64 + p.max_batch_tokens as f64 * c.bytes_per_token;
        let free = match d {
            DeviceSpec::Gpu { free_bytes, .. } => *free_bytes,
            DeviceSpec::Cpu {
                available_bytes, ..
            } => *available_bytes,
        };
        assert!(
            needed <= free as f64,
            "{}: plan needs {needed} bytes of {free}",
            p.device_model
        );
    }

    #[test]
    fn simulated_gpus_match_or_beat_the_field_guide_and_fit_in_memory() {
        // 2 MiB per padded token: a 128-token sentence needs 256 MiB of activations.
        let c = calib(2.0);
        for &(name, gib, guide) in FIELD_GUIDE {
            let d = DeviceSpec::simulated_gpu(name, gib);
            let p = plan(&d, &c, &PlanLimits::default());
            assert!(
                p.batch_items >= guide,
                "{name}: plan {} items < field guide {guide} ({})",
                p.batch_items,
                p.reason
            );
            assert!(p.max_batch_tokens >= guide * c.item_tokens, "{name}");
            assert!(p.max_batch_requests >= p.batch_items, "{name}");
            assert_fits(&p, &d, &c);
            assert_eq!(p.device, "cuda:0");
            assert_eq!(p.prefetch, 2 * p.max_batch_requests + 1);
            assert!(p.max_wait_ms > 0, "{name}: batching GPUs wait a little");
        }
    }

    #[test]
    fn plans_grow_with_memory_until_the_uncurved_cap() {
        let c = calib(8.0); // 1 GiB per sentence: memory decides on small cards.
        let limits = PlanLimits::default();
        let mut by_memory = FIELD_GUIDE.to_vec();
        by_memory.sort_by(|a, b| a.1.total_cmp(&b.1));
        let items: Vec<usize> = by_memory
            .iter()
            .map(|&(n, g, _)| plan(&DeviceSpec::simulated_gpu(n, g), &c, &limits).batch_items)
            .collect();
        assert!(
            items
                .windows(2)
                .all(|w| w[0] <= w[1] || w[1] == limits.uncurved_gpu_items),
            "{items:?}"
        );
        // RTX 3060: 12 GiB × 0.95 × 0.8 − 0.3 GiB ≈ 8.8 GiB → 8 sentences of 1 GiB; T4
        // (16 GiB) → 11.
        assert_eq!(&items[..2], &[8, 11]);
        assert_eq!(*items.last().unwrap_or(&0), limits.uncurved_gpu_items);
        for &(n, g, _) in FIELD_GUIDE {
            let d = DeviceSpec::simulated_gpu(n, g);
            assert_fits(&plan(&d, &c, &limits), &d, &c);
        }
    }

    #[test]
    fn a_card_too_small_for_one_batch_still_gets_one_item_and_says_why() {
        let c = calib(64.0); // 8 GiB per sentence
        let d = DeviceSpec::simulated_gpu("Tiny", 4.0);
        let p = plan(&d, &c, &PlanLimits::default());
        assert_eq!(p.batch_items, 1);
        assert!(p.reason.contains("memory"), "{}", p.reason);
    }

    #[test]
    fn the_knee_caps_a_measured_gpu_below_what_memory_allows() {
        let mut c = calib(2.0);
        c.device_model = "NVIDIA H200".into();
        // Throughput doubles up to 16, then flattens (+3 %).
        c.points = vec![
            point(1, 0.010, 6.0),
            point(2, 0.010, 6.0),
            point(4, 0.011, 6.0),
            point(8, 0.012, 6.0),
            point(16, 0.013, 6.0),
            point(32, 0.0252, 6.0),
        ];
        let d = DeviceSpec::simulated_gpu("NVIDIA H200", 141.0);
        let p = plan(&d, &c, &PlanLimits::default());
        assert_eq!(p.batch_items, 16, "{}", p.reason);
        assert_eq!(p.max_batch_tokens, 16 * 128);
        assert!(p.reason.contains("after batch 16"), "{}", p.reason);
        // A calibration of another model does not decide this one's knee.
        let other = DeviceSpec::simulated_gpu("Tesla T4", 16.0);
        let q = plan(&other, &c, &PlanLimits::default());
        assert!(q.reason.contains("memory decides"), "{}", q.reason);
        assert!(!q.reason.contains("after batch"), "{}", q.reason);
    }

    #[test]
    fn latency_caps_the_batch() {
        let mut c = calib(2.0);
        c.device_model = "NVIDIA H200".into();
        c.points = vec![point(1, 0.5, 6.0), point(2, 0.6, 6.0), point(4, 2.5, 6.0)];
        let p = plan(
            &DeviceSpec::simulated_gpu("NVIDIA H200", 141.0),
            &c,
            &PlanLimits::default(),
        );
        assert_eq!(p.batch_items, 2, "{}", p.reason);
    }

    fn cpu(cores: usize) -> DeviceSpec {
        DeviceSpec::Cpu {
            cores,
            available_bytes: 16 * 1024 * MIB,
        }
    }

    #[test]
    fn cpu_with_batch_one_fastest_runs_one_item_without_waiting() {
        let mut c = calib(2.0);
        c.device_model = "cpu".into();
        c.intra_threads = 2;
        // This machine's shape: batch 2 and 4 slower than batch 1.
        c.points = vec![point(1, 0.40, 6.0), point(2, 0.85, 6.0), point(4, 1.9, 6.0)];
        let p = plan(&cpu(2), &c, &PlanLimits::default());
        assert_eq!(
            (p.batch_items, p.max_batch_requests),
            (1, 1),
            "{}",
            p.reason
        );
        assert_eq!(p.max_wait_ms, 0);
        assert_eq!(p.intra_threads, 2);
        assert_eq!(p.sessions, 1);
        assert_eq!(p.prefetch, 3);
        assert_eq!(p.device, "cpu");
    }

    #[test]
    fn cpu_where_batching_pays_batches_and_splits_cores_across_sessions() {
        let mut c = calib(2.0);
        c.device_model = "cpu".into();
        c.sessions = 4;
        c.points = vec![point(1, 0.40, 6.0), point(2, 0.60, 6.0), point(4, 0.9, 6.0)];
        let p = plan(&cpu(16), &c, &PlanLimits::default());
        assert_eq!(p.batch_items, 4, "{}", p.reason);
        assert_eq!((p.sessions, p.intra_threads), (4, 4));
        assert_eq!(p.prefetch, 2 * 4 * 4 + 4);
        assert!(p.max_wait_ms > 0);
    }

    fn layout(sessions: usize, intra: usize, throughput: f64, mib: Option<u64>) -> LayoutPoint {
        LayoutPoint {
            sessions,
            intra_threads: intra,
            throughput,
            memory_bytes: mib.map(|m| m * MIB),
            range: None,
            graph: None,
        }
    }

    #[test]
    fn another_layout_wins_only_beyond_the_noise_and_the_rest_of_a_run() {
        let mut default = layout(2, 1, 10.0, None);
        default.range = Some((9.5, 10.4));
        // 8 % faster in the median (this VM's engine-only result for 1 × 2): stays.
        let mut other = layout(1, 2, 10.8, None);
        other.range = Some((10.2, 11.3));
        let (l, why) = choose_layout(&default, &other, 16 << 30, LAYOUT_SWITCH_GAIN);
        assert_eq!(l, &default, "{why}");
        assert!(why.contains("9.5-10.4") && why.contains("15 %"), "{why}");
        // A clear win, even in its slowest round: switches.
        other.range = Some((12.5, 13.5));
        other.throughput = 13.0;
        let (l, why) = choose_layout(&default, &other, 16 << 30, LAYOUT_SWITCH_GAIN);
        assert_eq!(l, &other, "{why}");
        // Wide noise in the default hides a median win.
        default.range = Some((7.0, 12.5));
        let (l, _) = choose_layout(&default, &other, 16 << 30, LAYOUT_SWITCH_GAIN);
        assert_eq!(l, &default);
    }

    #[test]
    fn another_graph_wins_when_its_slowest_round_beats_the_default_graphs_best() {
        let graph = |name: &str, x: f64, range: (f64, f64)| LayoutPoint {
            graph: Some(name.into()),
            range: Some(range),
            ..layout(2, 1, x, Some(900))
        };
        // Kokoro on an AVX-512 host (issue 28's second bench): fp32 about 11 % faster.
        let int8 = graph("int8", 2.48, (2.42, 2.55));
        let fp32 = graph("fp32", 2.75, (2.68, 2.83));
        let (g, why) = choose_layout(&int8, &fp32, 16 << 30, GRAPH_SWITCH_GAIN);
        assert_eq!(g.graph.as_deref(), Some("fp32"), "{why}");
        assert!(why.starts_with("2x1 fp32 by throughput"), "{why}");
        // On the first host int8 was faster: it stays, and so it does on a tie in noise.
        let slow_fp32 = graph("fp32", 1.95, (1.9, 2.0));
        let (g, _) = choose_layout(&int8, &slow_fp32, 16 << 30, GRAPH_SWITCH_GAIN);
        assert_eq!(g.graph.as_deref(), Some("int8"));
        let overlapping = graph("fp32", 2.60, (2.50, 2.70));
        let (g, why) = choose_layout(&int8, &overlapping, 16 << 30, GRAPH_SWITCH_GAIN);
        assert_eq!(g.graph.as_deref(), Some("int8"), "{why}");
    }

    #[test]
    fn layouts_are_chosen_by_throughput_unless_memory_is_tight() {
        // 2×1 is 20 % faster but holds twice the memory (this VM's shape).
        let default = layout(2, 1, 12.0, Some(600));
        let other = layout(1, 2, 10.0, Some(320));
        let gain = PlanLimits::default().knee_gain;
        // Plenty of memory: throughput decides, and the default stays.
        let (l, why) = choose_layout(&default, &other, 16 << 30, gain);
        assert_eq!(l, &default, "{why}");
        assert!(why.contains("by throughput"), "{why}");
        // Under 1.2 GiB available, 600 MiB is more than half: per GiB, 1×2 gives
        // 10/0.3125 = 32x against 12/0.586 = 20.5x, and wins.
        let (l, why) = choose_layout(&default, &other, 1000 * MIB, gain);
        assert_eq!(l, &other, "{why}");
        assert!(
            why.contains("per GiB") && why.contains("1000 MiB available"),
            "{why}"
        );
        // Tight, but the other layout is no leaner per GiB by the gain: the default stays.
        let lean_default = layout(2, 1, 12.0, Some(600));
        let heavy_other = layout(1, 2, 10.0, Some(520));
        let (l, why) = choose_layout(&lean_default, &heavy_other, 1000 * MIB, gain);
        assert_eq!(l, &lean_default, "{why}");
        // Without memory figures (an old cached calibration), throughput decides.
        let (old_default, old_other) = (layout(2, 1, 10.0, None), layout(1, 2, 11.0, None));
        let (l, _) = choose_layout(&old_default, &old_other, 1000 * MIB, gain);
        assert_eq!(l, &old_other);
    }

    #[test]
    fn plan_sources_are_written_and_read_as_one_word_with_flags() {
        for (source, text) in [
            (PlanSource::from(PlanOrigin::Default), "default"),
            (
                PlanSource {
                    origin: PlanOrigin::Calibration,
                    flags: true,
                },
                "calibration+flags",
            ),
            (PlanSource::from(PlanOrigin::Catalog), "catalog"),
            (PlanSource::from(PlanOrigin::Flags), "flags"),
        ] {
            let json = serde_json::to_string(&source).expect("serialize");
            assert_eq!(json, format!("\"{text}\""));
            assert_eq!(
                serde_json::from_str::<PlanSource>(&json).expect("read"),
                source
            );
        }
        // Plans stored before the field existed, or with an empty one.
        let old: PlanSource = serde_json::from_str("\"\"").expect("read");
        assert_eq!(old.origin, PlanOrigin::Unknown);
        assert_eq!(old.to_string(), "unknown");
        // A plan from a supplied calibration is the default; from a cache, a calibration.
        let mut c = calib(1.0);
        let limits = PlanLimits::default();
        let cpu = DeviceSpec::Cpu {
            cores: 2,
            available_bytes: 8 << 30,
        };
        assert_eq!(plan(&cpu, &c, &limits).source.to_string(), "default");
        c.source = CalibrationSource::Cache;
        assert_eq!(plan(&cpu, &c, &limits).source.to_string(), "calibration");
    }

    #[test]
    fn layout_points_without_memory_read_back_from_older_caches() {
        let old = r#"{"sessions":2,"intra_threads":1,"throughput":11.5}"#;
        let l: LayoutPoint = serde_json::from_str(old).expect("an old layout point");
        assert_eq!(l.memory_bytes, None);
        assert_eq!(l.throughput_per_gib(), None);
        let new = serde_json::to_string(&layout(2, 1, 11.5, Some(512))).expect("json");
        assert!(new.contains(r#""memory_bytes":536870912"#), "{new}");
    }

    #[test]
    fn cpu_without_a_curve_runs_one_item() {
        let c = calib(2.0);
        for cores in [2, 16] {
            let p = plan(&cpu(cores), &c, &PlanLimits::default());
            assert_eq!(p.batch_items, 1);
            assert_eq!(p.intra_threads, cores);
            assert!(p.reason.contains("calibrate"), "{}", p.reason);
        }
    }

    #[test]
    fn the_fit_recovers_a_linear_memory_model() {
        let pts: Vec<_> = [1usize, 2, 4, 8]
            .iter()
            .map(|&b| point(b, 0.1, 1.0))
            .collect();
        let (fixed, bpt) = Calibration::fit(&pts);
        assert_eq!(fixed, 200 * MIB);
        assert!((bpt - 2.0 * MIB as f64).abs() < 1.0, "{bpt}");
        // An allocator that did not grow: no slope, the largest ratio is used.
        let mut flat = pts.clone();
        for p in &mut flat {
            p.memory_bytes = 100 * MIB;
        }
        let (fixed, bpt) = Calibration::fit(&flat);
        assert_eq!(fixed, 0);
        assert!((bpt - 100.0 * MIB as f64 / 128.0).abs() < 1.0);
    }
}
