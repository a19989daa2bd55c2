//! Command-line arguments (clap derive). Every option has an environment fallback.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

/// narrator: long texts to speech, at scale.
#[derive(Debug, Parser)]
#[command(name = "narrator", version, about, long_about = None)]
pub(crate) struct Cli {
    #[command(flatten)]
    pub(crate) global: Global,
    #[command(subcommand)]
    pub(crate) command: Command,
}

/// Options every command shares.
#[derive(Debug, Args)]
pub(crate) struct Global {
    /// Folder made by ops/setup.sh (voices/, onnxruntime/, espeak-ng-data/). Default: the
    /// nearest `.deps` above the current folder or the executable.
    #[arg(long, env = "NARRATOR_DATA_DIR", global = true)]
    pub(crate) data_dir: Option<PathBuf>,
    /// The ONNX Runtime shared library (default: DATA_DIR/onnxruntime/libonnxruntime.so.*).
    #[arg(long, env = "NARRATOR_ONNXRUNTIME", global = true)]
    pub(crate) onnxruntime: Option<PathBuf>,
    /// Folder of Piper voices (default: DATA_DIR/voices).
    #[arg(long, env = "NARRATOR_VOICES_DIR", global = true)]
    pub(crate) voices_dir: Option<PathBuf>,
    /// Log filter, e.g. `info` or `narrator=debug` (default: warn).
    #[arg(long, env = "NARRATOR_LOG", global = true, default_value = "warn")]
    pub(crate) log: String,
}

/// Inference settings.
#[derive(Debug, Args, Clone)]
pub(crate) struct EngineArgs {
    /// Voice name (see `narrator voices`).
    #[arg(long, env = "NARRATOR_VOICE", default_value = "en_US-joe-medium")]
    pub(crate) voice: String,
    /// Where to run: auto (CUDA when available), cpu, cuda:N.
    #[arg(long, env = "NARRATOR_DEVICE", default_value = "auto")]
    pub(crate) device: String,
    /// Threads inside each ONNX Runtime session (default: all cores on CPU).
    #[arg(long, env = "NARRATOR_INTRA_THREADS")]
    pub(crate) intra_threads: Option<usize>,
    /// Engine sessions, one thread each (default 1).
    #[arg(long, env = "NARRATOR_SESSIONS", default_value_t = 1)]
    pub(crate) sessions: usize,
    /// Utterances per engine run (default: 1 on CPU, where batching was measured slower; 8 on CUDA).
    #[arg(long, env = "NARRATOR_MAX_BATCH")]
    pub(crate) max_batch: Option<usize>,
    /// Noise scale (default: the voice's). 0 makes output deterministic.
    #[arg(long)]
    pub(crate) noise_scale: Option<f32>,
    /// Length scale: above 1 speaks slower (default: the voice's).
    #[arg(long)]
    pub(crate) length_scale: Option<f32>,
    /// Duration noise (default: the voice's).
    #[arg(long)]
    pub(crate) noise_w: Option<f32>,
}

/// Pauses and input limits.
#[derive(Debug, Args, Clone)]
pub(crate) struct TextArgs {
    /// Silence after a sentence, in milliseconds.
    #[arg(long, default_value_t = 250)]
    pub(crate) sentence_pause_ms: u32,
    /// Silence after a paragraph, in milliseconds.
    #[arg(long, default_value_t = 600)]
    pub(crate) paragraph_pause_ms: u32,
    /// Silence between chapters in the whole-book file, in milliseconds.
    #[arg(long, default_value_t = 1500)]
    pub(crate) chapter_pause_ms: u32,
    /// Largest input accepted, in MiB.
    #[arg(long, default_value_t = 16)]
    pub(crate) max_input_mb: u64,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Turn a book (.txt, .md, .epub) into an audiobook folder: one file per chapter, the
    /// whole book, and manifest.json. Interrupted runs resume where they stopped.
    Run(RunArgs),
    /// Speak a short text file (or - for stdin) into one audio file.
    Synth(SynthArgs),
    /// List installed voices.
    Voices(VoicesArgs),
}

#[derive(Debug, Args)]
pub(crate) struct RunArgs {
    /// The book: .txt, .md or .epub.
    pub(crate) book: PathBuf,
    /// Output folder (created if missing).
    #[arg(long, short)]
    pub(crate) out: PathBuf,
    /// Audio format: wav, opus or mp3.
    #[arg(long, default_value = "opus")]
    pub(crate) format: String,
    /// Print the final summary as JSON instead of a progress bar and text.
    #[arg(long)]
    pub(crate) json: bool,
    /// Keep the per-segment audio in OUT/.narrator after success.
    #[arg(long)]
    pub(crate) keep_work: bool,
    #[command(flatten)]
    pub(crate) engine: EngineArgs,
    #[command(flatten)]
    pub(crate) text: TextArgs,
}

#[derive(Debug, Args)]
pub(crate) struct SynthArgs {
    /// Text file to speak, or `-` to read standard input.
    pub(crate) input: PathBuf,
    /// Output file; its extension picks the format (.wav, .opus, .mp3).
    #[arg(long, short)]
    pub(crate) output: PathBuf,
    #[command(flatten)]
    pub(crate) engine: EngineArgs,
    #[command(flatten)]
    pub(crate) text: TextArgs,
}

#[derive(Debug, Args)]
pub(crate) struct VoicesArgs {
    /// Print JSON instead of a table.
    #[arg(long)]
    pub(crate) json: bool,
}
