//! What a worker runs on, and how it should run there.
//!
//! - [`profile`]: one probe of GPUs (NVML), CPU, memory, swap, cgroup limits and NUMA into a
//!   [`HardwareProfile`]; no NVML or no GPU is a CPU profile with the reason, never an error.
//! - [`doctor`]: the field guide's checklist as findings (severity, measured, why, fix).
//! - [`catalog`]: calibrations by GPU model (shipped, files, the fleet's table) and the
//!   memory-only rule for models without one.
//! - [`cuda`]: whether ONNX Runtime's CUDA build can start: its needed libraries resolved
//!   as the loader would, each missing one named with what provides it.
//! - [`plan`]: batch plans from free memory and a calibration (memory per padded token,
//!   throughput per batch size), with the knee where throughput stops improving.
//! - [`threads`]: background threads at a lower priority than inference.

pub mod catalog;
pub mod cuda;
pub mod doctor;
pub mod memory;
pub mod plan;
pub mod profile;
pub mod threads;

pub use catalog::Catalog;
pub use doctor::{Finding, RuntimeFacts, Severity, diagnose};
pub use plan::{
    Calibration, CalibrationPoint, CalibrationSource, DeviceSpec, GRAPH_SWITCH_GAIN,
    LAYOUT_SWITCH_GAIN, LayoutPoint, Plan, PlanLimits, PlanOrigin, PlanSource, choose_layout, plan,
};
pub use profile::{
    CpuInfo, GpuInfo, HardwareProfile, MemoryInfo, THROTTLE_REASONS, gpus_now, probe, sample_gpus,
};
