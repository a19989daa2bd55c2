//! Where the voices, the runtime and the phonemizer data are: flags, environment, or the
//! `.deps` folder that ops/setup.sh fills.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};

/// Which ONNX Runtime build to load (`--ort-build`: auto, cpu or cuda).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OrtBuild {
    /// The CUDA build for `--device auto|cuda:N` when installed, else the CPU build.
    #[default]
    Auto,
    /// The CPU build (`.deps/onnxruntime`).
    Cpu,
    /// The CUDA build (`.deps/onnxruntime-gpu`, from `ops/setup.sh --gpu`).
    Cuda,
}

impl std::str::FromStr for OrtBuild {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(OrtBuild::Auto),
            "cpu" => Ok(OrtBuild::Cpu),
            "cuda" => Ok(OrtBuild::Cuda),
            other => Err(format!(
                "unknown ONNX Runtime build '{other}': use auto, cpu or cuda"
            )),
        }
    }
}

/// What the caller was told about locations (flags or environment); `None`: find it.
#[derive(Debug, Clone, Default)]
pub struct PathFlags {
    /// The data folder (`.deps`); default: the nearest `.deps` with voices above the
    /// working directory or the executable.
    pub data_dir: Option<PathBuf>,
    /// The voices folder; default DATA_DIR/voices.
    pub voices_dir: Option<PathBuf>,
    /// An ONNX Runtime library to load whatever the device.
    pub onnxruntime: Option<PathBuf>,
    /// Which build to load.
    pub ort_build: OrtBuild,
    /// Calibrations and other measured facts; default DATA_DIR/cache.
    pub cache_dir: Option<PathBuf>,
}

/// Resolved locations.
#[derive(Debug, Clone)]
pub struct Paths {
    pub voices: PathBuf,
    /// The CPU build (`DATA_DIR/onnxruntime/libonnxruntime.so.*`), or `--onnxruntime`.
    pub onnxruntime: PathBuf,
    /// `--onnxruntime`, when given: loaded whatever the device.
    pub explicit_onnxruntime: Option<PathBuf>,
    /// The CUDA build (`DATA_DIR/onnxruntime-gpu/libonnxruntime.so.*`), when installed.
    pub onnxruntime_gpu: Option<PathBuf>,
    /// `--ort-build`.
    pub ort_build: OrtBuild,
    /// The data folder (`.deps`).
    pub data: PathBuf,
    pub espeak_parent: PathBuf,
    /// Calibrations and other measured facts (`--cache-dir`, default DATA_DIR/cache).
    pub cache: PathBuf,
}

fn find_deps() -> Option<PathBuf> {
    let mut starts = Vec::new();
    if let Ok(cwd) = std::env::current_dir() {
        starts.push(cwd);
    }
    if let Ok(exe) = std::env::current_exe() {
        starts.push(exe);
    }
    starts
        .iter()
        .flat_map(|s| s.ancestors())
        .map(|a| a.join(".deps"))
        .find(|d| d.join("voices").is_dir())
}

fn newest_runtime(dir: &Path) -> Option<PathBuf> {
    let mut libs: Vec<PathBuf> = std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("libonnxruntime.so."))
        })
        .collect();
    libs.sort();
    libs.pop()
}

impl Paths {
    pub fn resolve(g: &PathFlags) -> anyhow::Result<Self> {
        let data = g.data_dir.clone().or_else(find_deps);
        let need = |what: &str| -> anyhow::Result<PathBuf> {
            match &data {
                Some(d) => Ok(d.clone()),
                None => bail!(
                    "cannot find narrator's data folder for {what}: run `bash ops/setup.sh` in the repository, or set NARRATOR_DATA_DIR"
                ),
            }
        };
        let voices = match &g.voices_dir {
            Some(v) => v.clone(),
            None => need("voices")?.join("voices"),
        };
        let onnxruntime = match &g.onnxruntime {
            Some(p) => p.clone(),
            None => {
                let dir = need("ONNX Runtime")?.join("onnxruntime");
                newest_runtime(&dir).unwrap_or_else(|| dir.join("libonnxruntime.so.1.32.0"))
            }
        };
        let espeak_parent = need("espeak-ng data")?;
        let onnxruntime_gpu =
            newest_runtime(&espeak_parent.join("onnxruntime-gpu")).filter(|lib| {
                lib.parent()
                    .is_some_and(narrator_hardware::cuda::is_cuda_build)
            });
        if !espeak_parent.join("espeak-ng-data").is_dir() {
            return Err(anyhow::anyhow!(
                "espeak-ng data is missing in {}: run `bash ops/setup.sh`",
                espeak_parent.display()
            ))
            .context("locating the phonemizer data");
        }
        let cache = g
            .cache_dir
            .clone()
            .unwrap_or_else(|| espeak_parent.join("cache"));
        Ok(Self {
            voices,
            onnxruntime,
            explicit_onnxruntime: g.onnxruntime.clone(),
            onnxruntime_gpu,
            ort_build: g.ort_build,
            data: espeak_parent.clone(),
            espeak_parent,
            cache,
        })
    }
}
