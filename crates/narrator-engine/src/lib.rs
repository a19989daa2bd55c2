//! Inference for narrator.
//!
//! - [`runtime`]: loads ONNX Runtime once per process (`ort::init_from`).
//! - [`family`]: what a model family declares (ids, capabilities, sessions) and which
//!   family it is ([`FamilyKind`]): the seam.
//! - [`voice`]: voices on disk, whatever their family: find, list, install.
//! - [`session`]: ONNX Runtime sessions as every family opens them (options, CPU arena).
//! - [`scales`]: inference scales from a voice's defaults and a user's settings.
//! - [`piper`]: the Piper/VITS family whole: its voice files and their configs, and its
//!   backend (padded batches in, exactly trimmed waveforms out).
//! - [`kokoro`]: the Kokoro-82M family whole: its installation, voices and blends, and
//!   its backend (packed runs cut at exact token boundaries).
//! - [`splice`]: exposes the per-phoneme frame counts as a graph output at load time.
//! - [`pool`]: engine threads (one session each) behind an async handle.

pub mod family;
pub mod kokoro;
pub mod limit;
pub mod null;
pub mod piper;
pub mod pool;
pub mod runtime;
pub mod scales;
pub mod session;
pub mod splice;
pub mod voice;

use std::path::PathBuf;

pub use family::{Batching, Capabilities, Family, FamilyKind, MAX_ITEM_PHONEMES, VoiceInfo};
pub use kokoro::{KokoroEngine, KokoroVoice};
pub use limit::{MemoryLimit, Paced};
pub use null::NullBackend;
pub use piper::{PiperEngine, PiperVoice, VoiceConfig};
pub use pool::{EnginePool, PoolOptions};
pub use runtime::{Runtime, load_runtime};
pub use scales::{ScaleOverrides, Scales};
pub use session::{ArenaPolicy, CpuArena, SessionOptions};
pub use voice::{InstallOptions, Voice, install_family, installation, list_family, list_voices};

/// A synthesis backend: synchronous, owned by one engine thread.
pub trait Backend: Send {
    /// Synthesizes a batch of phoneme-id sequences; one waveform per item, each trimmed
    /// to its own length.
    fn synthesize(&mut self, items: &[&[i64]], scales: Scales) -> Result<BatchOutput, EngineError>;
    /// [`Backend::synthesize`] with each item's speaker id (multi-speaker voices; one per
    /// item). Backends without speakers (the null engine) ignore them; wrappers forward.
    fn synthesize_speakers(
        &mut self,
        items: &[&[i64]],
        speakers: &[i64],
        scales: Scales,
    ) -> Result<BatchOutput, EngineError> {
        let _ = speakers;
        self.synthesize(items, scales)
    }
    /// Whether several items can run in one batch and still be trimmed exactly.
    fn supports_batching(&self) -> bool;
    /// Where it runs.
    fn device(&self) -> Device;
}

/// Where inference runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Device {
    /// CUDA when the loaded runtime has it, else CPU.
    Auto,
    /// CPU execution provider.
    Cpu,
    /// CUDA execution provider on GPU N.
    Cuda(u32),
}

impl std::fmt::Display for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Device::Auto => f.write_str("auto"),
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

impl std::str::FromStr for Device {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(Device::Auto),
            "cpu" => Ok(Device::Cpu),
            "cuda" => Ok(Device::Cuda(0)),
            _ => s
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .map(Device::Cuda)
                .ok_or_else(|| format!("unknown device `{s}`: use auto, cpu or cuda:N")),
        }
    }
}

/// One batch's result: a trimmed waveform per item, in input order.
#[derive(Debug, Clone)]
pub struct BatchOutput {
    /// Float samples in [-1, 1] (before normalization), one vector per item.
    pub audio: Vec<Vec<f32>>,
    /// Wall time of the model run.
    pub inference_seconds: f64,
    /// Per item, the samples each of its ids lasts in that item's audio, from the
    /// model's own durations (one entry per id, in order; the item's audio starts at its
    /// first id, and what follows its last id is the model's pause): what word and
    /// sentence timings are made from. Empty for an item whose durations are unknown (a
    /// graph without the durations output).
    pub token_samples: Vec<Vec<u32>>,
}

impl BatchOutput {
    /// An output of `audio` whose durations are unknown.
    pub fn untimed(audio: Vec<Vec<f32>>, inference_seconds: f64) -> Self {
        let token_samples = vec![Vec::new(); audio.len()];
        Self {
            audio,
            inference_seconds,
            token_samples,
        }
    }
}

/// Padded cost of a batch: longest item × items (what the engine allocates for).
pub fn padded_tokens(items: &[&[i64]]) -> usize {
    items.iter().map(|i| i.len()).max().unwrap_or(0) * items.len()
}

/// Whether an ONNX Runtime error message reports a failed allocation (CPU arena, CUDA
/// BFC arena, cuDNN or cuBLAS workspace).
pub fn is_allocation_failure(message: &str) -> bool {
    let m = message.to_ascii_lowercase();
    [
        "failed to allocate",
        "out of memory",
        "bfcarena",
        "cudnn_status_alloc_failed",
        "cublas_status_alloc_failed",
        "cudaerrormemoryallocation",
        "std::bad_alloc",
        "available memory of",
    ]
    .iter()
    .any(|p| m.contains(p))
}

/// What can go wrong in inference.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The ONNX Runtime library could not be loaded.
    #[error("cannot load ONNX Runtime from {}: {reason}; {fix}", library.display())]
    Runtime {
        /// The library path.
        library: PathBuf,
        /// What went wrong.
        reason: String,
        /// What to do.
        fix: &'static str,
    },
    /// CUDA was asked for but the runtime has no CUDA provider.
    #[error("--device cuda was asked for, but the ONNX Runtime at {} has no CUDA execution provider: install onnxruntime-gpu (see ops/gpu-check.sh) or use --device cpu", library.display())]
    NoCuda {
        /// The library path.
        library: PathBuf,
    },
    /// A voice name that is not installed.
    #[error("unknown voice `{name}` (installed in {}: {installed}); run `narrator voices` to list them", dir.display())]
    UnknownVoice {
        /// The name asked for.
        name: String,
        /// The voices folder.
        dir: PathBuf,
        /// Installed voice names.
        installed: String,
    },
    /// A speaker the voice does not have.
    #[error("voice {voice} has no speaker `{given}`; its speakers: {speakers}")]
    UnknownSpeaker {
        /// The voice.
        voice: String,
        /// The speaker asked for.
        given: String,
        /// What it has (names with ids, or the id range).
        speakers: String,
    },
    /// A voice whose family is not installed, or whose files are missing.
    #[error("voice {voice} is not installed ({} is missing): run `narrator voices install kokoro` (or `bash ops/setup.sh --kokoro`)", missing.display())]
    NotInstalled {
        /// The voice asked for.
        voice: String,
        /// The first file found missing.
        missing: PathBuf,
    },
    /// A voice whose language narrator cannot phonemize.
    #[error(
        "voice {voice} reads {language}, which needs a G2P narrator does not have (Kokoro's Japanese and Chinese voices were trained on misaki's pyopenjtalk/pypinyin phonemes, available only in Python); choose a voice of another language (`narrator voices`)"
    )]
    UnsupportedLanguage {
        /// The voice asked for.
        voice: String,
        /// Its language.
        language: String,
    },
    /// A family's installation that could not be made.
    #[error("installing the {family} voices failed: {reason}")]
    Install {
        /// The family.
        family: FamilyKind,
        /// What went wrong.
        reason: String,
    },
    /// A voice blend that cannot be made.
    #[error("voice blend `{given}`: {reason}; write it as `af_bella:2+af_sky:1`")]
    BadBlend {
        /// What was given.
        given: String,
        /// What is wrong.
        reason: String,
    },
    /// A voice config that cannot be used.
    #[error("voice config {} is unusable: {reason}; reinstall the voice (bash ops/setup.sh)", path.display())]
    VoiceConfig {
        /// The config path.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A file could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Io {
        /// The path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// ONNX Runtime reported an error.
    #[error("ONNX Runtime failed while {what}: {source}")]
    Ort {
        /// What we were doing.
        what: &'static str,
        /// The cause.
        #[source]
        source: ort::Error,
    },
    /// The device ran out of memory for a batch (the caller halves its budget and retries).
    #[error(
        "out of device memory on {device} for a batch of {items} items, {tokens} padded tokens: {detail}"
    )]
    OutOfMemory {
        /// Where.
        device: Device,
        /// Items in the batch.
        items: usize,
        /// Longest item × items.
        tokens: usize,
        /// What the allocator said.
        detail: String,
    },
    /// An item with no phonemes.
    #[error("batch item {index} has no phoneme ids")]
    EmptyItem {
        /// Its position in the batch.
        index: usize,
    },
    /// The engine threads are gone.
    #[error("the inference threads stopped")]
    Stopped,
}

impl EngineError {
    /// A stable word for metrics and the `failure_kind` column.
    pub fn kind(&self) -> &'static str {
        match self {
            EngineError::Runtime { .. } => "runtime_missing",
            EngineError::NoCuda { .. } => "no_cuda",
            EngineError::UnknownVoice { .. } => "unknown_voice",
            EngineError::UnknownSpeaker { .. } => "unknown_speaker",
            EngineError::VoiceConfig { .. } => "voice_config",
            EngineError::NotInstalled { .. } => "voice_not_installed",
            EngineError::UnsupportedLanguage { .. } => "unsupported_language",
            EngineError::BadBlend { .. } => "bad_blend",
            EngineError::Install { .. } => "install_failed",
            EngineError::Io { .. } => "io",
            EngineError::Ort { .. } => "inference",
            EngineError::OutOfMemory { .. } => "out_of_memory",
            EngineError::EmptyItem { .. } => "empty_item",
            EngineError::Stopped => "engine_stopped",
        }
    }
}
