//! ONNX Runtime sessions as every family opens them: the options a session takes
//! ([`SessionOptions`]: threads, device, spinning, the CUDA arena's cap, padding, the
//! graph), the CPU arena's policy between runs ([`CpuArena`], [`ArenaPolicy`]), and
//! [`open_session`], which builds a session from model bytes with them. A family's
//! backend ([`crate::PiperEngine`], [`crate::KokoroEngine`]) adds only its own inputs and
//! outputs.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use ort::session::{RunOptions, Session, builder::GraphOptimizationLevel};

use crate::{Device, EngineError, runtime::Runtime};

/// Options for one session.
#[derive(Debug, Clone)]
pub struct SessionOptions {
    /// Threads ONNX Runtime uses inside one operator.
    pub intra_threads: usize,
    /// Where to run.
    pub device: Device,
    /// CUDA only: cap on the CUDA arena in bytes (ONNX Runtime's `gpu_mem_limit`).
    /// Allocations past it fail as out of memory; `None` leaves ONNX Runtime's default.
    pub gpu_mem_limit: Option<usize>,
    /// Whether idle intra-op threads spin (ONNX Runtime's default: fastest when the
    /// session has the cores to itself) or sleep (leaves CPU to services sharing them).
    pub spin: bool,
    /// What ONNX Runtime's CPU arena does between runs; shared by a pool's sessions.
    pub cpu_arena: Arc<ArenaPolicy>,
    /// Pad every batch to a multiple of this many phoneme tokens (1: to the longest item
    /// exactly). On CUDA, cuDNN rebuilds a convolution's plan whenever the input shape
    /// changes, so fewer distinct lengths (16 by default there) save that per-run cost;
    /// the audio is the same, as padding is masked by `input_lengths` and trimmed.
    pub pad_multiple: usize,
    /// Which of the family's installed graphs to load ([`crate::Family::graphs`]), e.g.
    /// Kokoro's `fp32`; `None`: the family's own default for the device.
    pub graph: Option<String>,
}

/// What ONNX Runtime's CPU memory arena does between runs. A VITS run's memory grows
/// with the audio it makes, so an arena that keeps its peak grows in steps, to the
/// largest run seen so far, and never gives memory back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CpuArena {
    /// The arena keeps every region it grew (ONNX Runtime's default).
    Keep,
    /// The arena keeps what runs up to the warm-up's largest need; a larger run gives
    /// back what it added, once it ends ([`ArenaPolicy::settle`] ends the warm-up). RSS
    /// stays flat after warm-up at no cost to ordinary runs.
    #[default]
    Bounded,
    /// Regions not in use are freed after every run (about 10 % slower on CPU).
    Shrink,
    /// No arena: tensors come from and go back to the system allocator each run.
    Off,
}

impl std::str::FromStr for CpuArena {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "keep" => Ok(Self::Keep),
            "bounded" => Ok(Self::Bounded),
            "shrink" => Ok(Self::Shrink),
            "off" => Ok(Self::Off),
            other => Err(format!(
                "unknown CPU arena mode '{other}': use bounded, keep, shrink or off"
            )),
        }
    }
}

/// A pool's arena mode and, for [`CpuArena::Bounded`], the largest run of the warm-up.
#[derive(Debug, Default)]
pub struct ArenaPolicy {
    mode: CpuArena,
    settled: AtomicBool,
    kept_tokens: AtomicUsize,
}

impl ArenaPolicy {
    /// A policy for one pool's sessions.
    pub fn new(mode: CpuArena) -> Arc<Self> {
        Arc::new(Self {
            mode,
            ..Self::default()
        })
    }

    /// The mode.
    pub fn mode(&self) -> CpuArena {
        self.mode
    }

    /// The warm-up is over: in bounded mode, a run larger (in padded tokens) than any
    /// before now gives back what it added to the arena.
    pub fn settle(&self) {
        self.settled.store(true, Ordering::Release);
    }

    /// Ends the warm-up now with the arenas kept at runs of `tokens` (batch × padded
    /// length): a larger run gives back what it added when it ends. With several sessions
    /// each session's arena otherwise stays at the largest run it ever made, and their
    /// sum is what several sessions cost (measured on 2 cores, 2 sessions, Alice ch. I:
    /// 1,170–1,250 MiB kept, 880–905 MiB with 300–500 kept tokens, 2–6 % slower; shrinking
    /// after every run: 815 MiB, 13 % slower; see docs/BENCHMARKS.md).
    pub fn settle_at(&self, tokens: usize) {
        self.kept_tokens.store(tokens, Ordering::Release);
        self.settle();
    }

    /// The largest run (batch × padded length) the arena was grown for before settling.
    pub fn kept_tokens(&self) -> usize {
        self.kept_tokens.load(Ordering::Acquire)
    }

    /// Whether a run of `tokens` frees the arena's unused regions when it ends.
    pub(crate) fn shrink_after(&self, tokens: usize) -> bool {
        match self.mode {
            CpuArena::Keep | CpuArena::Off => false,
            CpuArena::Shrink => true,
            CpuArena::Bounded if self.settled.load(Ordering::Acquire) => {
                tokens > self.kept_tokens()
            }
            CpuArena::Bounded => {
                self.kept_tokens.fetch_max(tokens, Ordering::AcqRel);
                false
            }
        }
    }
}

pub(crate) fn ort_err(what: &'static str) -> impl Fn(ort::Error) -> EngineError {
    move |e| EngineError::Ort { what, source: e }
}

/// A failed model run: out of memory when the allocator says so (the caller halves its
/// budget), else the runtime's error.
pub(crate) fn run_failure(
    e: ort::Error,
    device: Device,
    items: usize,
    tokens: usize,
    what: &'static str,
) -> EngineError {
    let detail = e.to_string();
    if crate::is_allocation_failure(&detail) {
        EngineError::OutOfMemory {
            device,
            items,
            tokens,
            detail,
        }
    } else {
        ort_err(what)(e)
    }
}

/// A session with its run options and the device it runs on.
pub(crate) struct Opened {
    pub(crate) session: Session,
    pub(crate) plain: RunOptions,
    pub(crate) shrinking: RunOptions,
    pub(crate) device: Device,
}

/// Creates a session from model bytes with the options every family shares (threads,
/// spinning, the CUDA provider and its memory cap, the CPU arena); `what` names the model
/// in errors.
pub(crate) fn open_session(
    rt: &Runtime,
    bytes: &[u8],
    opts: &SessionOptions,
    what: &'static str,
) -> Result<Opened, EngineError> {
    let device = match opts.device {
        Device::Auto if rt.cuda_available => Device::Cuda(0),
        Device::Auto => Device::Cpu,
        Device::Cuda(_) if !rt.cuda_available => {
            return Err(EngineError::NoCuda {
                library: rt.library.clone(),
            });
        }
        d => d,
    };
    let mut builder = Session::builder(rt.environment())
        .map_err(ort_err("creating a session builder"))?
        .with_optimization_level(GraphOptimizationLevel::All)
        .map_err(|e| ort_err("setting the optimization level")(e.into()))?
        .with_intra_threads(opts.intra_threads.max(1))
        .map_err(|e| ort_err("setting intra-op threads")(e.into()))?
        .with_inter_threads(1)
        .map_err(|e| ort_err("setting inter-op threads")(e.into()))?
        .with_intra_op_spinning(opts.spin)
        .map_err(|e| ort_err("setting intra-op spinning")(e.into()))?;
    let plain = RunOptions::new().map_err(ort_err("creating run options"))?;
    let mut shrinking = RunOptions::new().map_err(ort_err("creating run options"))?;
    shrinking
        .set("memory.enable_memory_arena_shrinkage", "cpu:0")
        .map_err(ort_err("enabling arena shrinkage"))?;
    // Providers in priority order, registered in one call: CUDA first, so that no
    // node it can run lands on the CPU provider (registering the CPU provider first,
    // as for `--cpu-arena off`, would put the whole graph on the CPU).
    let mut providers = Vec::new();
    if let Device::Cuda(id) = device {
        let cuda = ort::ep::CUDA::default()
            .with_device_id(id as i32)
            .with_conv_algorithm_search(ort::ep::cuda::ConvAlgorithmSearch::Heuristic);
        let cuda = match opts.gpu_mem_limit {
            Some(limit) => cuda.with_memory_limit(limit),
            None => cuda,
        };
        providers.push(cuda.build().error_on_failure());
    }
    if opts.cpu_arena.mode() == CpuArena::Off {
        providers.push(ort::ep::CPU::default().with_arena_allocator(false).build());
    }
    if !providers.is_empty() {
        builder = builder
            .with_execution_providers(providers)
            .map_err(|e| ort_err("registering the execution providers")(e.into()))?;
    }
    let session = builder.commit_from_memory(bytes).map_err(ort_err(what))?;
    Ok(Opened {
        session,
        plain,
        shrinking,
        device,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bounded_arena_shrinks_only_after_runs_larger_than_the_warm_up() {
        let p = ArenaPolicy::new(CpuArena::Bounded);
        // Warm-up: nothing shrinks; the largest run is remembered.
        assert!(!p.shrink_after(300));
        assert!(!p.shrink_after(900));
        assert!(!p.shrink_after(400));
        assert_eq!(p.kept_tokens(), 900);
        p.settle();
        assert!(!p.shrink_after(900));
        assert!(!p.shrink_after(10));
        assert!(p.shrink_after(901));
        // Settled: a larger run does not raise what is kept.
        assert_eq!(p.kept_tokens(), 900);
        // Settled at a size chosen up front (several sessions): no warm-up needed.
        let q = ArenaPolicy::new(CpuArena::Bounded);
        q.settle_at(512);
        assert!(!q.shrink_after(512));
        assert!(q.shrink_after(513));
        assert_eq!(q.kept_tokens(), 512);
        for (mode, big) in [
            (CpuArena::Keep, false),
            (CpuArena::Off, false),
            (CpuArena::Shrink, true),
        ] {
            let p = ArenaPolicy::new(mode);
            assert_eq!(p.shrink_after(1), big, "{mode:?} before settling");
            p.settle();
            assert_eq!(p.shrink_after(1), big, "{mode:?} after settling");
        }
    }

    #[test]
    fn arena_modes_parse_and_unknown_ones_say_what_to_use() {
        assert_eq!("Bounded".parse::<CpuArena>(), Ok(CpuArena::Bounded));
        assert_eq!("off".parse::<CpuArena>(), Ok(CpuArena::Off));
        assert_eq!(CpuArena::default(), CpuArena::Bounded);
        let err = "big".parse::<CpuArena>().expect_err("unknown mode");
        assert!(err.contains("bounded, keep, shrink or off"), "{err}");
    }
}
