//! Wiring one voice to a synthesizer: runtime, sessions, phonemizer, batch plan.

use anyhow::Context;
use narrator_engine::{
    Device, EnginePool, PoolOptions, Scales, SessionOptions, Voice, load_runtime,
};
use narrator_phonemes::Phonemizer;
use narrator_pipeline::Synthesizer;

use crate::cli::EngineArgs;
use crate::paths::Paths;

/// A loaded voice and how it will be run.
pub(crate) struct Loaded {
    pub(crate) synth: Synthesizer,
    pub(crate) max_batch: usize,
    pub(crate) in_flight: usize,
}

/// Finds the voice (cheap, so bad names fail before anything heavy is loaded).
pub(crate) fn find_voice(paths: &Paths, args: &EngineArgs) -> anyhow::Result<Voice> {
    Ok(Voice::find(&paths.voices, &args.voice)?)
}

/// The voice's scales with the flags' overrides.
pub(crate) fn scales(args: &EngineArgs, voice: &Voice) -> Scales {
    let d = voice.config.scales;
    Scales {
        noise: args.noise_scale.unwrap_or(d.noise),
        length: args.length_scale.unwrap_or(d.length),
        noise_w: args.noise_w.unwrap_or(d.noise_w),
    }
}

/// Loads the runtime, the sessions and the phonemizer for `voice`.
pub(crate) fn load(paths: &Paths, args: &EngineArgs, voice: Voice) -> anyhow::Result<Loaded> {
    let device: Device = args.device.parse().map_err(anyhow::Error::msg)?;
    let rt = load_runtime(&paths.onnxruntime)?;
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let sessions = args.sessions.max(1);
    // On CPU the measured best was one session using every core, one segment per run.
    let intra = args
        .intra_threads
        .unwrap_or_else(|| (cores / sessions).max(1));
    let pool = EnginePool::start(
        rt,
        voice.model_path.clone(),
        PoolOptions {
            sessions,
            session: SessionOptions {
                intra_threads: intra,
                device,
            },
        },
    )
    .with_context(|| format!("loading voice {}", voice.name))?;
    let on_gpu = matches!(pool.device(), Device::Cuda(_));
    let max_batch = args.max_batch.unwrap_or(if on_gpu { 8 } else { 1 });
    let max_batch = if pool.supports_batching() {
        max_batch
    } else {
        1
    };
    let scales = scales(args, &voice);
    let phonemizer = Phonemizer::new(&paths.espeak_parent)?;
    tracing::info!(voice = %voice.name, device = %pool.device(), sessions, intra, max_batch, "engine ready");
    let synth = Synthesizer::new(&voice, phonemizer, pool, scales)?;
    Ok(Loaded {
        synth,
        max_batch,
        in_flight: sessions + 1,
    })
}

/// The voice's phonemizer with the null engine (silence of the right length, instantly):
/// everything around inference runs for real, for control-plane benchmarks and tests.
pub(crate) fn load_null(paths: &Paths, args: &EngineArgs, voice: Voice) -> anyhow::Result<Loaded> {
    let pool = EnginePool::start_with(1, |_| {
        Ok(Box::new(narrator_engine::NullBackend::default()) as Box<dyn narrator_engine::Backend>)
    })?;
    let scales = scales(args, &voice);
    let phonemizer = Phonemizer::new(&paths.espeak_parent)?;
    let synth = Synthesizer::new(&voice, phonemizer, pool, scales)?;
    Ok(Loaded {
        synth,
        max_batch: args.max_batch.unwrap_or(32),
        in_flight: 4,
    })
}
