//! The global location flags, handed to the library that resolves them
//! ([`narrator_pipeline::load::Paths`]).

pub(crate) use narrator_pipeline::load::Paths;

use crate::cli::Global;

/// Resolves the data folder, voices, runtime and cache from the global flags.
pub(crate) fn resolve(g: &Global) -> anyhow::Result<Paths> {
    Paths::resolve(&narrator_pipeline::load::PathFlags {
        data_dir: g.data_dir.clone(),
        voices_dir: g.voices_dir.clone(),
        onnxruntime: g.onnxruntime.clone(),
        ort_build: g.ort_build,
        cache_dir: g.cache_dir.clone(),
    })
}
