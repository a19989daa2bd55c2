//! The engine flags, handed to the library's loader ([`narrator_pipeline::load`]).

use narrator_pipeline::load::{EngineOptions, TestHooks};

use crate::cli::EngineArgs;
use crate::paths::Paths;

pub(crate) use narrator_pipeline::load::{
    ITEM_TOKENS, Loaded, MAX_ITEM_TOKENS, Planning, UNKNOWN_GPU, expand_devices, load, load_null,
};

/// What the engine flags choose (the test hooks from this process's environment).
pub(crate) fn options(args: &EngineArgs) -> EngineOptions {
    EngineOptions {
        device: args.device.clone(),
        sessions: args.sessions,
        intra_threads: args.intra_threads,
        max_batch: args.max_batch,
        gpu_mem_limit_mib: args.gpu_mem_limit_mib,
        pad_to: args.pad_to,
        no_spin: args.no_spin,
        cpu_arena: args.cpu_arena,
        scales: args.voice.scales(),
        hooks: TestHooks::from_env(),
    }
}

/// Finds the voice (cheap, so bad names fail before anything heavy is loaded).
pub(crate) fn find_voice(
    paths: &Paths,
    args: &EngineArgs,
) -> anyhow::Result<narrator_engine::Voice> {
    Ok(narrator_engine::Voice::find(
        &paths.voices,
        &args.voice.name,
    )?)
}
