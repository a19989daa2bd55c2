//! Loading the ONNX Runtime shared library once per process (`ort::init_from`).
//!
//! `ort` allows one environment per process, so it lives in a `OnceLock`. Loading is the
//! first thing that can go wrong on a fresh machine; every failure says which command
//! fixes it instead of panicking inside `ort::init()`.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use ort::environment::Environment;

use crate::EngineError;

/// The loaded runtime: where it came from and what it can do.
#[derive(Debug)]
pub struct Runtime {
    /// The library that was loaded.
    pub library: PathBuf,
    /// Whether this build of ONNX Runtime carries the CUDA execution provider.
    pub cuda_available: bool,
    env: Environment,
}

impl Runtime {
    /// The `ort` environment sessions are created in.
    pub fn environment(&self) -> &Environment {
        &self.env
    }
}

static RUNTIME: OnceLock<Runtime> = OnceLock::new();

/// Loads ONNX Runtime from `library` (once; later calls return the same runtime and fail
/// if they name a different file).
pub fn load_runtime(library: &Path) -> Result<&'static Runtime, EngineError> {
    if let Some(rt) = RUNTIME.get() {
        if rt.library != library {
            return Err(EngineError::Runtime {
                library: library.to_path_buf(),
                reason: format!(
                    "ONNX Runtime is already loaded from {}",
                    rt.library.display()
                ),
                fix: "use one --onnxruntime path per process",
            });
        }
        return Ok(rt);
    }
    if !library.is_file() {
        return Err(EngineError::Runtime {
            library: library.to_path_buf(),
            reason: "the file does not exist".into(),
            fix: "run `bash ops/setup.sh` (it installs onnxruntime 1.32.0 from PyPI) or pass --onnxruntime PATH",
        });
    }
    let builder = ort::init_from(library).map_err(|e| EngineError::Runtime {
        library: library.to_path_buf(),
        reason: e.to_string(),
        fix: "run `bash ops/setup.sh` to install a supported onnxruntime (>= 1.22 needed, 1.32.0 tested)",
    })?;
    let env = builder
        .with_name("narrator")
        .build()
        .map_err(|e| EngineError::Runtime {
            library: library.to_path_buf(),
            reason: e.to_string(),
            fix: "run `bash ops/setup.sh` to reinstall onnxruntime",
        })?;
    use ort::ep::ExecutionProvider as _;
    let cuda_available = ort::ep::CUDA::is_available().unwrap_or(false);
    let rt = Runtime {
        library: library.to_path_buf(),
        cuda_available,
        env,
    };
    // A concurrent first call may have won the race; both loaded the same library.
    let _ = RUNTIME.set(rt);
    RUNTIME.get().ok_or_else(|| EngineError::Runtime {
        library: library.to_path_buf(),
        reason: "runtime vanished after loading".into(),
        fix: "report this as a bug",
    })
}
