//! Which ONNX Runtime build a process loads, and whether CUDA can start, decided once
//! before the library is loaded (ONNX Runtime loads once per process).
//!
//! `ops/setup.sh` puts the CPU build in `.deps/onnxruntime` and, with `--gpu`, the CUDA
//! build in `.deps/onnxruntime-gpu` and the CUDA user-space libraries in
//! `.deps/cuda/lib`. For `--device auto` or `cuda:N` the CUDA build is used when present
//! (`--ort-build` forces either). Before loading it, its needed libraries are resolved
//! as the loader would ([`narrator_hardware::cuda::inspect`]) and NVML is asked for GPUs:
//! - `--device cuda:N` with a cause: one error line naming it;
//! - `--device auto` with a cause on a machine with an NVIDIA GPU (NVML lists one, or
//!   the driver's device nodes exist): one warning naming it, then the CPU build on the
//!   CPU, the cause kept as [`Selected::fallback`] (a worker's status row shows it);
//! - `--device auto` on a machine with no NVIDIA GPU: the CPU, quietly (the cause is
//!   logged at debug level; `narrator doctor` still reports it);
//! - no cause: the libraries found in narrator's folders are loaded first (globally), so
//!   the provider finds them without `LD_LIBRARY_PATH`.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use anyhow::bail;
use narrator_engine::{Runtime, load_runtime};
use narrator_hardware::cuda::{self, CudaBuild, LoaderPaths};

use super::{OrtBuild, Paths};

/// The runtime a process loaded, and the device spec to use with it.
#[derive(Debug)]
pub struct Selected {
    /// The loaded runtime.
    pub rt: &'static Runtime,
    /// Why `--device auto` runs on the CPU although GPUs or a CUDA build are here.
    pub fallback: Option<String>,
}

impl Selected {
    /// The device spec to run `spec` with: `cpu` after a fallback, else `spec`.
    pub fn device_spec<'a>(&self, spec: &'a str) -> &'a str {
        if self.fallback.is_some() { "cpu" } else { spec }
    }
}

static SELECTED: OnceLock<Selected> = OnceLock::new();

/// Whether a `--device` spec may use a GPU, and whether it insists on one.
fn wants(spec: &str) -> (bool, bool) {
    let parts: Vec<&str> = spec.split(',').map(str::trim).collect();
    let cuda = parts.iter().any(|p| p.starts_with("cuda"));
    (cuda || parts.contains(&"auto"), cuda)
}

/// The folders narrator loads CUDA libraries from: `NARRATOR_CUDA_LIBS` (a path list),
/// else `DATA_DIR/cuda/lib`; the CUDA build's own folder always comes first.
pub fn bundled_dirs(paths: &Paths, ort_dir: &Path) -> Vec<PathBuf> {
    let mut dirs = vec![ort_dir.to_path_buf()];
    match std::env::var_os("NARRATOR_CUDA_LIBS") {
        Some(v) if !v.is_empty() => dirs.extend(std::env::split_paths(&v)),
        _ => dirs.push(paths.data.join("cuda").join("lib")),
    }
    dirs
}

/// Inspects the CUDA build in `ort_dir` against this process's loader paths.
pub fn inspect(paths: &Paths, ort_dir: &Path) -> anyhow::Result<CudaBuild> {
    let loader = LoaderPaths::from_env(bundled_dirs(paths, ort_dir));
    Ok(cuda::inspect(ort_dir, &loader)?)
}

/// Why CUDA cannot start with the build in `ort_dir`, or `None` (plus the inspection).
fn cuda_problem(paths: &Paths, ort_dir: &Path) -> anyhow::Result<(Option<String>, CudaBuild)> {
    let build = inspect(paths, ort_dir)?;
    if let Some(p) = build.problem() {
        return Ok((Some(p), build));
    }
    let (gpus, probe) = narrator_hardware::gpus_now();
    if gpus.is_empty() {
        let why = probe.reason.unwrap_or_else(|| "no GPU found".into());
        return Ok((Some(format!("NVML lists no GPU ({why})")), build));
    }
    Ok((None, build))
}

/// Loads the runtime for `--device spec` once per process (later calls return the first
/// choice whatever their spec: one runtime per process).
pub fn runtime(paths: &Paths, spec: &str) -> anyhow::Result<&'static Selected> {
    if let Some(s) = SELECTED.get() {
        return Ok(s);
    }
    let selected = select(paths, spec)?;
    let _ = SELECTED.set(selected);
    SELECTED
        .get()
        .ok_or_else(|| anyhow::anyhow!("the runtime choice vanished (a bug)"))
}

/// The CUDA build a GPU device would load: `--onnxruntime` when it is one, else the
/// installed one unless `--ort-build cpu`; `None` when there is none to load.
pub fn cuda_library(paths: &Paths) -> anyhow::Result<Option<PathBuf>> {
    Ok(match (&paths.explicit_onnxruntime, paths.ort_build) {
        (Some(lib), _) => lib
            .parent()
            .filter(|d| cuda::is_cuda_build(d))
            .map(|_| lib.clone()),
        (None, OrtBuild::Cpu) => None,
        (None, OrtBuild::Cuda) => match &paths.onnxruntime_gpu {
            Some(lib) => Some(lib.clone()),
            None => bail!(
                "--ort-build cuda: ONNX Runtime's CUDA build is not installed in {}: run \
                 `bash ops/setup.sh --gpu`",
                paths.data.join("onnxruntime-gpu").display()
            ),
        },
        (None, OrtBuild::Auto) => paths.onnxruntime_gpu.clone(),
    })
}

fn select(paths: &Paths, spec: &str) -> anyhow::Result<Selected> {
    let (may_gpu, insists) = wants(spec);
    let gpu_lib = cuda_library(paths)?;
    let cpu_lib = paths
        .explicit_onnxruntime
        .clone()
        .unwrap_or_else(|| paths.onnxruntime.clone());
    let Some(gpu_lib) = gpu_lib.filter(|_| may_gpu) else {
        // The CPU build: say so when auto leaves GPUs idle.
        let rt = load_runtime(&cpu_lib)?;
        let mut fallback = None;
        if spec.split(',').any(|p| p.trim() == "auto") && !rt.cuda_available {
            let gpus = narrator_hardware::gpus_now().0.len();
            if gpus > 0 {
                let why = format!(
                    "{gpus} GPU(s) here, but the ONNX Runtime at {} is the CPU build: run \
                     `bash ops/setup.sh --gpu` (or pass --onnxruntime PATH) to use them",
                    rt.library.display()
                );
                tracing::warn!("--device auto runs on the CPU: {why}");
                fallback = Some(why);
            }
        }
        return Ok(Selected { rt, fallback });
    };
    let ort_dir = gpu_lib.parent().unwrap_or(Path::new("."));
    let (problem, build) = cuda_problem(paths, ort_dir)?;
    match problem {
        Some(why) if insists => {
            bail!("--device {spec}: CUDA cannot start: {why} (see `narrator doctor` for the fix)")
        }
        Some(why) => {
            let fallback = auto_fallback(&why, nvidia_gpu_present());
            // The CPU build is the leaner library; the CUDA build runs on the CPU too when
            // it was named explicitly.
            let lib = if paths.explicit_onnxruntime.is_some() || !paths.onnxruntime.is_file() {
                gpu_lib
            } else {
                paths.onnxruntime.clone()
            };
            Ok(Selected {
                rt: load_runtime(&lib)?,
                fallback,
            })
        }
        None => {
            for lib in build.preload_order() {
                preload(&lib)?;
            }
            Ok(Selected {
                rt: load_runtime(&gpu_lib)?,
                fallback: None,
            })
        }
    }
}

/// Loads `lib` globally so that later `DT_NEEDED` lookups of its name find it.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
fn preload(lib: &Path) -> anyhow::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(lib.as_os_str().as_bytes())?;
    // SAFETY: dlopen with a valid C string; the handle is kept for the process's life
    // (never closed), as the CUDA provider keeps using the library.
    let handle = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
    if handle.is_null() {
        // SAFETY: dlerror returns a C string owned by libc, valid until the next dl call.
        let err = unsafe {
            let e = libc::dlerror();
            if e.is_null() {
                "unknown error".to_owned()
            } else {
                std::ffi::CStr::from_ptr(e).to_string_lossy().into_owned()
            }
        };
        bail!("loading {}: {err}", lib.display());
    }
    Ok(())
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn preload(_lib: &Path) -> anyhow::Result<()> {
    Ok(())
}

/// What `--device auto` says when CUDA cannot start for `why`: with a GPU here, a
/// warning and the cause for the worker's status row; without one, the CPU is simply
/// the device (a debug line, no fallback).
fn auto_fallback(why: &str, gpu_present: bool) -> Option<String> {
    if gpu_present {
        tracing::warn!("--device auto runs on the CPU: CUDA cannot start: {why}");
        Some(format!("CUDA cannot start: {why}"))
    } else {
        tracing::debug!("--device auto runs on the CPU: no NVIDIA GPU here ({why})");
        None
    }
}

/// Whether this machine has an NVIDIA GPU, usable or not: NVML lists one, or the
/// kernel driver shows one (`/proc/driver/nvidia/gpus/*`, `/dev/nvidia0`...), which it
/// does even when the user-space libraries that CUDA needs are missing.
fn nvidia_gpu_present() -> bool {
    !narrator_hardware::gpus_now().0.is_empty()
        || std::fs::read_dir("/proc/driver/nvidia/gpus").is_ok_and(|mut d| d.next().is_some())
        || (0..16).any(|i| Path::new(&format!("/dev/nvidia{i}")).exists())
}

#[cfg(test)]
mod tests {
    use super::{auto_fallback, wants};

    #[test]
    fn auto_warns_only_where_a_gpu_is_present() {
        assert_eq!(
            auto_fallback("libcuda.so.1 missing", true).as_deref(),
            Some("CUDA cannot start: libcuda.so.1 missing")
        );
        assert_eq!(auto_fallback("libcuda.so.1 missing", false), None);
    }

    #[test]
    fn device_specs_say_whether_a_gpu_may_or_must_be_used() {
        assert_eq!(wants("auto"), (true, false));
        assert_eq!(wants("cpu"), (false, false));
        assert_eq!(wants("cuda:0"), (true, true));
        assert_eq!(wants("cpu, cuda:1"), (true, true));
    }
}
