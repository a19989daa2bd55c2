//! The narrator pipeline, shared by the embedded and the distributed modes:
//!
//! ```text
//! Document ─plan─► JobPlan(segments) ─► prepare (espeak) ─► batch ─► EnginePool ─► normalize
//!                                                                              │
//!     manifest ◄─ assemble ◄─ AudioStore.get ◄── StateStore.record ◄─ AudioStore.put
//! ```
//!
//! [`local`] holds the embedded seams; the distributed ones live in their own crates and
//! plug into the same generic functions.

pub mod assemble;
pub mod batcher;
pub mod bench;
pub mod book;
pub mod calibrate;
pub mod embedded;
pub mod epub3;
mod flush;
pub mod load;
pub mod local;
pub mod plan;
pub mod queue;
pub mod resume;
pub mod runner;
pub mod subtitles;
pub mod synth;

use std::path::PathBuf;

use narrator_core::{Failure, RetryClass};

pub use assemble::{
    AssembleOptions, EarlyBook, Finished, assemble, encode_as_stored, encodes_early, finish_early,
};
pub use batcher::{Batcher, Budget};
pub use bench::{BenchFigures, BenchOptions, ConcurrencyPoint, SweepPoint, bench};
pub use calibrate::{CalibrateOptions, calibrate, warm_up};
pub use local::{JournalStateStore, LocalAudioStore};
pub use plan::{AudioIdentity, plan_job};
pub use queue::InProcessQueue;
pub use runner::{Event, PACK_MAX, RunOptions, Stages, synthesize_job, work};
pub use subtitles::SubtitleFormat;
pub use synth::{EngineStats, Fallback, Fault, Prepared, Synthesizer, Work, engine_runs};

/// What can stop a job.
#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    /// Phonemization failed.
    #[error(transparent)]
    Phonemes(#[from] narrator_phonemes::PhonemeError),
    /// Inference failed.
    #[error(transparent)]
    Engine(#[from] narrator_engine::EngineError),
    /// Encoding failed.
    #[error(transparent)]
    Audio(#[from] narrator_audio::AudioError),
    /// A store failed.
    #[error(transparent)]
    Seam(#[from] narrator_core::SeamError),
    /// A file could not be written.
    #[error("cannot write {}: {source}", path.display())]
    Io {
        /// The path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// Stored audio does not match its record.
    #[error("segment {index} is damaged ({reason}); delete it from the work folder and run again")]
    Corrupt {
        /// Segment index.
        index: u32,
        /// What does not match.
        reason: String,
    },
    /// Synthesis ended with segments missing.
    #[error("only {done} of {total} segments were made; run the same command again to finish")]
    Incomplete {
        /// Finished.
        done: usize,
        /// In the job.
        total: usize,
    },
    /// A task panicked or was cancelled.
    #[error("a pipeline task failed: {0}")]
    Task(String),
    /// The manifest could not be encoded.
    #[error("cannot encode manifest.json: {0}")]
    Manifest(#[source] serde_json::Error),
    /// A failure injected by a test's [`synth::Fault`] hook.
    #[error("segment {index} {} (failure injected by a test hook)", if *permanent { "cannot be spoken" } else { "failed for now" })]
    Injected {
        /// The segment that triggered it.
        index: u32,
        /// Permanent (never retried) or transient (retried later).
        permanent: bool,
    },
    /// A bug.
    #[error("internal error: {0}")]
    Internal(&'static str),
    /// Synthesizing the segment panicked (a bug of the engine or its glue on this
    /// input). Caught per batch: the segment fails alone; the process goes on.
    #[error("synthesis panicked: {0}")]
    Panicked(String),
}

impl PipelineError {
    /// How a segment that failed with this error is retried. Phonemizing or encoding a
    /// segment is deterministic: it fails the same way every time. The engine can fail
    /// for the moment (out of memory, a stopped session); the stores say for themselves.
    pub fn retry_class(&self) -> RetryClass {
        match self {
            // Writing audio files fails on the disk (full, read-only), not on the input.
            PipelineError::Audio(narrator_audio::AudioError::Io { .. })
            | PipelineError::Audio(narrator_audio::AudioError::WavWrite {
                source: hound::Error::IoError(_),
            }) => RetryClass::Infrastructure,
            // A panic reproduced on the segment alone repeats on every try.
            PipelineError::Phonemes(_)
            | PipelineError::Audio(_)
            | PipelineError::Manifest(_)
            | PipelineError::Panicked(_) => RetryClass::Permanent,
            PipelineError::Engine(e) => match e {
                narrator_engine::EngineError::UnknownVoice { .. }
                | narrator_engine::EngineError::VoiceConfig { .. }
                | narrator_engine::EngineError::EmptyItem { .. } => RetryClass::Permanent,
                _ => RetryClass::Transient,
            },
            PipelineError::Seam(e) => e.class,
            PipelineError::Io { .. } => RetryClass::Infrastructure,
            PipelineError::Injected {
                permanent: true, ..
            } => RetryClass::Permanent,
            PipelineError::Corrupt { .. }
            | PipelineError::Incomplete { .. }
            | PipelineError::Task(_)
            | PipelineError::Injected { .. }
            | PipelineError::Internal(_) => RetryClass::Transient,
        }
    }

    /// What the queue needs to decide on a segment that failed with this error.
    pub fn failure(&self) -> Failure {
        Failure {
            kind: self.kind(),
            class: self.retry_class(),
            reason: self.to_string(),
        }
    }

    /// A stable word for metrics and the `failure_kind` column.
    pub fn kind(&self) -> &'static str {
        match self {
            PipelineError::Phonemes(e) => e.kind(),
            PipelineError::Engine(e) => e.kind(),
            PipelineError::Audio(e) => e.kind(),
            PipelineError::Seam(e) => e.kind,
            PipelineError::Io { .. } => "io",
            PipelineError::Corrupt { .. } => "corrupt_segment",
            PipelineError::Incomplete { .. } => "incomplete",
            PipelineError::Task(_) => "task",
            PipelineError::Manifest(_) => "manifest",
            PipelineError::Injected {
                permanent: true, ..
            } => "text_unspeakable",
            PipelineError::Injected {
                permanent: false, ..
            } => "engine_transient",
            PipelineError::Internal(_) => "internal",
            PipelineError::Panicked(_) => "panic",
        }
    }
}
