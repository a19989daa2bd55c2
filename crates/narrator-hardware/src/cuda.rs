//! Whether ONNX Runtime's CUDA build can start here, read from the files, before any job.
//!
//! The CUDA execution provider is a shared library (`libonnxruntime_providers_cuda.so`)
//! that ONNX Runtime opens when a session asks for CUDA. If one library it needs is
//! missing, the failure comes late (at the first session) and names one file at a time.
//! [`inspect`] reads the provider's ELF dynamic section (`DT_NEEDED`, `DT_RPATH`,
//! `DT_RUNPATH`) and resolves every needed library, transitively, the way the dynamic
//! loader would: `DT_RPATH` (when there is no `DT_RUNPATH`), `LD_LIBRARY_PATH`,
//! `DT_RUNPATH` (with `$ORIGIN`), then narrator's own folders (the ONNX Runtime folder and
//! the CUDA wheels `ops/setup.sh --gpu` unpacks; narrator preloads what it finds there,
//! see [`CudaBuild::preload_order`]), the `ldconfig` cache and the default folders.
//! Libraries opened at run time rather than linked are checked too: the driver's
//! `libcuda.so.1` (opened by the CUDA runtime), cuDNN 9 (the CUDA 12/13 providers open
//! `libcudnn.so.9` themselves) and its sub-libraries (opened by `libcudnn.so.9`). Every missing library is named with what provides it.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The CUDA execution provider's library in an ONNX Runtime folder.
pub const PROVIDER_LIBRARY: &str = "libonnxruntime_providers_cuda.so";

/// cuDNN 9 opens these itself (by name, next to `libcudnn.so.9`) when a graph needs them.
const CUDNN9_PARTS: &[&str] = &[
    "libcudnn_graph.so.9",
    "libcudnn_ops.so.9",
    "libcudnn_cnn.so.9",
    "libcudnn_adv.so.9",
    "libcudnn_heuristic.so.9",
    "libcudnn_engines_precompiled.so.9",
    "libcudnn_engines_runtime_compiled.so.9",
];

/// Whether `ort_dir` holds ONNX Runtime's CUDA build (its CUDA provider library).
pub fn is_cuda_build(ort_dir: &Path) -> bool {
    ort_dir.join(PROVIDER_LIBRARY).is_file()
}

/// Where a library was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Via {
    /// The needing object's `DT_RPATH`.
    Rpath,
    /// `LD_LIBRARY_PATH`.
    LdLibraryPath,
    /// The needing object's `DT_RUNPATH`.
    Runpath,
    /// One of narrator's folders (the ONNX Runtime folder, `.deps/cuda/lib`,
    /// `NARRATOR_CUDA_LIBS`): narrator loads it before the provider.
    Bundled,
    /// The `ldconfig` cache.
    LdCache,
    /// A default folder (`/lib`, `/usr/lib`, multiarch).
    Default,
}

/// Where the loader looks, besides each object's own `DT_RPATH`/`DT_RUNPATH`.
#[derive(Debug, Clone, Default)]
pub struct LoaderPaths {
    /// `LD_LIBRARY_PATH`, in order.
    pub ld_library_path: Vec<PathBuf>,
    /// narrator's folders, in order.
    pub bundled: Vec<PathBuf>,
    /// The `ldconfig` cache: library name → path (this architecture only).
    pub cache: BTreeMap<String, PathBuf>,
    /// The loader's default folders.
    pub defaults: Vec<PathBuf>,
}

impl LoaderPaths {
    /// This process's view: `LD_LIBRARY_PATH`, `ldconfig -p` and the default folders, with
    /// `bundled` as narrator's own folders.
    pub fn from_env(bundled: Vec<PathBuf>) -> Self {
        let ld_library_path = std::env::var_os("LD_LIBRARY_PATH")
            .map(|v| {
                std::env::split_paths(&v)
                    .filter(|p| !p.as_os_str().is_empty())
                    .collect()
            })
            .unwrap_or_default();
        let defaults = [
            "/lib/x86_64-linux-gnu",
            "/usr/lib/x86_64-linux-gnu",
            "/lib/aarch64-linux-gnu",
            "/usr/lib/aarch64-linux-gnu",
            "/lib64",
            "/usr/lib64",
            "/lib",
            "/usr/lib",
        ]
        .iter()
        .map(PathBuf::from)
        .filter(|p| p.is_dir())
        .collect();
        Self {
            ld_library_path,
            bundled,
            cache: ldconfig_cache(),
            defaults,
        }
    }
}

/// `ldconfig -p`, parsed: `\tlibfoo.so.1 (libc6,x86-64) => /path/libfoo.so.1`, keeping
/// this architecture's entries, the first per name (the loader's choice).
fn ldconfig_cache() -> BTreeMap<String, PathBuf> {
    let out = ["ldconfig", "/sbin/ldconfig", "/usr/sbin/ldconfig"]
        .iter()
        .find_map(|cmd| std::process::Command::new(cmd).arg("-p").output().ok())
        .filter(|o| o.status.success());
    out.map(|o| parse_ldconfig(&String::from_utf8_lossy(&o.stdout)))
        .unwrap_or_default()
}

/// Parses `ldconfig -p` output for this build's architecture.
pub fn parse_ldconfig(text: &str) -> BTreeMap<String, PathBuf> {
    let arch_tag = if cfg!(target_arch = "x86_64") {
        Some("x86-64")
    } else if cfg!(target_arch = "aarch64") {
        Some("AArch64")
    } else {
        None
    };
    let mut map = BTreeMap::new();
    for line in text
        .lines()
        .filter(|l| l.starts_with('\t') || l.starts_with(' '))
    {
        let Some((left, path)) = line.split_once("=>") else {
            continue;
        };
        let Some((name, flags)) = left.trim().split_once(' ') else {
            continue;
        };
        let right_arch = match arch_tag {
            Some(tag) => flags.contains(tag),
            None => true,
        };
        if right_arch {
            map.entry(name.to_owned())
                .or_insert_with(|| PathBuf::from(path.trim()));
        }
    }
    map
}

/// One library the CUDA build needs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NeededLibrary {
    /// The name it is asked for by (`libcudart.so.13`).
    pub name: String,
    /// Which object needs it (a file name), or what opens it at run time.
    pub needed_by: String,
    /// Where it resolved; `None` when missing.
    pub path: Option<PathBuf>,
    /// How it resolved.
    pub via: Option<Via>,
    /// What provides it (a PyPI package, the driver, the system).
    pub provided_by: String,
}

/// What [`inspect`] found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CudaBuild {
    /// The provider library inspected.
    pub provider: PathBuf,
    /// Every library it needs, directly or not, in the order found.
    pub libraries: Vec<NeededLibrary>,
    /// The CUDA major version the build links (`libcudart.so.N`).
    pub cuda_major: Option<u32>,
    /// The cuDNN major version the build links (`libcudnn.so.N`).
    pub cudnn_major: Option<u32>,
    /// Found libraries in an order that loads dependencies first.
    #[serde(skip)]
    load_order: Vec<(PathBuf, Via)>,
}

impl CudaBuild {
    /// The libraries that were not found.
    pub fn missing(&self) -> impl Iterator<Item = &NeededLibrary> {
        self.libraries.iter().filter(|l| l.path.is_none())
    }

    /// One line naming every missing library and what provides it; `None` when all
    /// resolve.
    pub fn problem(&self) -> Option<String> {
        let missing: Vec<String> = self
            .missing()
            .map(|l| format!("{} ({})", l.name, l.provided_by))
            .collect();
        match missing.len() {
            0 => None,
            1 => Some(format!("{} is not found", missing[0])),
            _ => Some(format!("{} are not found", missing.join(", "))),
        }
    }

    /// The libraries found in narrator's own folders, dependencies first: loading them in
    /// this order (globally) before the provider makes the loader use them, whatever
    /// `LD_LIBRARY_PATH` says.
    pub fn preload_order(&self) -> Vec<PathBuf> {
        self.load_order
            .iter()
            .filter(|(_, via)| *via == Via::Bundled)
            .map(|(p, _)| p.clone())
            .collect()
    }
}

/// Why a library could not be read.
#[derive(Debug, thiserror::Error)]
pub enum InspectError {
    /// The file could not be opened or mapped.
    #[error("cannot read {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The file is not an ELF shared library this can read.
    #[error("{} is not a readable ELF library: {reason}", path.display())]
    NotElf {
        /// The file.
        path: PathBuf,
        /// goblin's message.
        reason: String,
    },
}

/// The dynamic-section facts of one ELF object.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ElfDeps {
    /// `DT_NEEDED`, in order.
    pub needed: Vec<String>,
    /// `DT_RPATH` entries (with `$ORIGIN` expanded).
    pub rpath: Vec<PathBuf>,
    /// `DT_RUNPATH` entries (with `$ORIGIN` expanded).
    pub runpath: Vec<PathBuf>,
}

/// Reads `path`'s dynamic section (the file is mapped, so only the pages holding the
/// headers are read, even for the 280 MB CUDA provider).
pub fn elf_deps(path: &Path) -> Result<ElfDeps, InspectError> {
    let read = |source| InspectError::Read {
        path: path.to_path_buf(),
        source,
    };
    let file = std::fs::File::open(path).map_err(read)?;
    // SAFETY: the mapping is read-only and lives only during this parse; a library being
    // replaced under it at that moment is the one risk, the same as the loader's.
    #[allow(unsafe_code)]
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(read)?;
    let elf = goblin::elf::Elf::parse(&map).map_err(|e| InspectError::NotElf {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })?;
    let origin = path.parent().unwrap_or(Path::new("/"));
    let expand = |list: &[&str]| -> Vec<PathBuf> {
        list.iter()
            .flat_map(|entry| entry.split(':'))
            .filter(|e| !e.is_empty())
            .map(|e| {
                PathBuf::from(
                    e.replace("${ORIGIN}", &origin.to_string_lossy())
                        .replace("$ORIGIN", &origin.to_string_lossy()),
                )
            })
            .collect()
    };
    Ok(ElfDeps {
        needed: elf.libraries.iter().map(|s| s.to_string()).collect(),
        rpath: expand(&elf.rpaths),
        runpath: expand(&elf.runpaths),
    })
}

/// What provides a library, for the fix: the PyPI wheel (the packages
/// `onnxruntime-gpu[cuda,cudnn]` pulls in), the NVIDIA driver, or the system.
pub fn provided_by(name: &str) -> String {
    let stem = name.split(".so").next().unwrap_or(name);
    let pypi = match stem {
        "libcuda" | "libnvidia-ml" => {
            return "the NVIDIA driver: install it on the host, or run the container with the \
                    NVIDIA container toolkit"
                .into();
        }
        "libcudart" => "nvidia-cuda-runtime",
        "libcublas" | "libcublasLt" => "nvidia-cublas",
        "libcufft" => "nvidia-cufft",
        "libcurand" => "nvidia-curand",
        "libnvrtc" | "libnvrtc-builtins" => "nvidia-cuda-nvrtc",
        "libnvJitLink" => "nvidia-nvjitlink",
        "libcupti" => "nvidia-cuda-cupti",
        s if s.starts_with("libcudnn") => "nvidia-cudnn-cu13",
        s if s.starts_with("libonnxruntime") => {
            return "ONNX Runtime's CUDA build (PyPI onnxruntime-gpu; bash ops/setup.sh --gpu)"
                .into();
        }
        _ => return "the system (a distribution package)".into(),
    };
    format!("PyPI {pypi}; bash ops/setup.sh --gpu")
}

/// The major version in a versioned library name: `libcudart.so.13` → 13.
pub fn soname_major(name: &str) -> Option<u32> {
    name.split(".so.").nth(1)?.split('.').next()?.parse().ok()
}

struct Walk<'a> {
    paths: &'a LoaderPaths,
    seen: HashSet<String>,
    libraries: Vec<NeededLibrary>,
    load_order: Vec<(PathBuf, Via)>,
}

impl Walk<'_> {
    /// Finds `name` for an object with `deps`, in the loader's order.
    fn resolve(&self, name: &str, deps: &ElfDeps) -> Option<(PathBuf, Via)> {
        if name.contains('/') {
            let p = PathBuf::from(name);
            return p.is_file().then_some((p, Via::Default));
        }
        let in_dirs = |dirs: &[PathBuf], via: Via| {
            dirs.iter()
                .map(|d| d.join(name))
                .find(|p| p.is_file())
                .map(|p| (p, via))
        };
        let rpath = if deps.runpath.is_empty() {
            &deps.rpath[..]
        } else {
            &[]
        };
        in_dirs(rpath, Via::Rpath)
            .or_else(|| in_dirs(&self.paths.ld_library_path, Via::LdLibraryPath))
            .or_else(|| in_dirs(&deps.runpath, Via::Runpath))
            .or_else(|| in_dirs(&self.paths.bundled, Via::Bundled))
            .or_else(|| {
                self.paths
                    .cache
                    .get(name)
                    .filter(|p| p.is_file())
                    .map(|p| (p.clone(), Via::LdCache))
            })
            .or_else(|| in_dirs(&self.paths.defaults, Via::Default))
    }

    /// Records `name` (needed by `by`) and, when found, walks its own needs first.
    fn visit(&mut self, name: &str, by: &str, deps: &ElfDeps) {
        if !self.seen.insert(name.to_owned()) {
            return;
        }
        let found = self.resolve(name, deps);
        let index = self.libraries.len();
        self.libraries.push(NeededLibrary {
            name: name.to_owned(),
            needed_by: by.to_owned(),
            path: found.as_ref().map(|(p, _)| p.clone()),
            via: found.as_ref().map(|(_, v)| *v),
            provided_by: provided_by(name),
        });
        let Some((path, via)) = found else {
            return;
        };
        match elf_deps(&path) {
            Ok(own) => {
                for n in &own.needed {
                    self.visit(n, name, &own);
                }
            }
            Err(e) => {
                // Unreadable is as good as missing for the loader.
                self.libraries[index].path = None;
                self.libraries[index].via = None;
                self.libraries[index].provided_by =
                    format!("{} ({e})", self.libraries[index].provided_by);
                return;
            }
        }
        self.load_order.push((path, via));
    }
}

/// Resolves every library the CUDA provider in `ort_dir` needs (see the module docs).
pub fn inspect(ort_dir: &Path, paths: &LoaderPaths) -> Result<CudaBuild, InspectError> {
    let provider = ort_dir.join(PROVIDER_LIBRARY);
    let deps = elf_deps(&provider)?;
    let mut walk = Walk {
        paths,
        seen: HashSet::from([PROVIDER_LIBRARY.to_owned()]),
        libraries: Vec::new(),
        load_order: Vec::new(),
    };
    for n in &deps.needed {
        walk.visit(n, PROVIDER_LIBRARY, &deps);
    }
    // Opened at run time, not linked: the driver (by the CUDA runtime); cuDNN 9, which
    // ONNX Runtime's CUDA 12/13 builds open themselves (the name is built at run time, so
    // it is not in DT_NEEDED); and cuDNN's parts (by libcudnn, from its own folder first).
    let cuda_major = walk
        .libraries
        .iter()
        .find(|l| l.name.starts_with("libcudart.so."))
        .and_then(|l| soname_major(&l.name));
    if cuda_major.is_some() {
        let none = ElfDeps::default();
        walk.visit("libcuda.so.1", "libcudart (opened at run time)", &none);
    }
    if cuda_major.is_some_and(|m| m >= 12) {
        walk.visit(
            "libcudnn.so.9",
            "libonnxruntime_providers_cuda.so (opened at run time)",
            &deps,
        );
    }
    let cudnn = walk
        .libraries
        .iter()
        .find(|l| l.name.starts_with("libcudnn.so.9"))
        .cloned();
    if let Some(cudnn) = cudnn.filter(|c| c.path.is_some()) {
        let own_dir = ElfDeps {
            runpath: cudnn
                .path
                .as_deref()
                .and_then(Path::parent)
                .map(Path::to_path_buf)
                .into_iter()
                .collect(),
            ..ElfDeps::default()
        };
        for part in CUDNN9_PARTS {
            walk.visit(part, "libcudnn.so.9 (opened at run time)", &own_dir);
        }
    }
    let cudnn_major = walk
        .libraries
        .iter()
        .find(|l| l.name.starts_with("libcudnn.so."))
        .and_then(|l| soname_major(&l.name));
    Ok(CudaBuild {
        provider,
        cuda_major,
        cudnn_major,
        libraries: walk.libraries,
        load_order: walk.load_order,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ldconfig_output_is_parsed_for_this_architecture() {
        let text = "3 libs found in cache `/etc/ld.so.cache'\n\
            \tlibz.so.1 (libc6,x86-64) => /lib/x86_64-linux-gnu/libz.so.1\n\
            \tlibz.so.1 (libc6) => /lib/i386-linux-gnu/libz.so.1\n\
            \tlibz.so.1 (libc6,AArch64) => /lib/aarch64-linux-gnu/libz.so.1\n";
        let map = parse_ldconfig(text);
        if cfg!(target_arch = "x86_64") {
            assert_eq!(
                map.get("libz.so.1"),
                Some(&PathBuf::from("/lib/x86_64-linux-gnu/libz.so.1"))
            );
        }
        assert_eq!(map.len(), 1);
    }

    #[test]
    fn sonames_give_major_versions_and_providers() {
        assert_eq!(soname_major("libcudart.so.13"), Some(13));
        assert_eq!(soname_major("libcudnn.so.9.1.0"), Some(9));
        assert_eq!(soname_major("libfoo.so"), None);
        assert!(provided_by("libcublasLt.so.13").contains("nvidia-cublas"));
        assert!(provided_by("libcudnn_graph.so.9").contains("nvidia-cudnn-cu13"));
        assert!(provided_by("libcuda.so.1").contains("NVIDIA driver"));
        assert!(provided_by("libstdc++.so.6").contains("system"));
    }

    /// This test binary's own needs resolve, and a made-up one is reported missing.
    #[test]
    fn a_real_elf_file_resolves_like_the_loader() {
        let exe = std::env::current_exe().expect("test binary");
        let deps = elf_deps(&exe).expect("ELF");
        assert!(deps.needed.iter().any(|n| n.starts_with("libc.so")));
        let paths = LoaderPaths::from_env(Vec::new());
        let mut walk = Walk {
            paths: &paths,
            seen: HashSet::new(),
            libraries: Vec::new(),
            load_order: Vec::new(),
        };
        for n in &deps.needed {
            walk.visit(n, "test", &deps);
        }
        walk.visit("libnarrator-nonexistent.so.7", "test", &deps);
        let missing: Vec<&str> = walk
            .libraries
            .iter()
            .filter(|l| l.path.is_none())
            .map(|l| l.name.as_str())
            .collect();
        assert_eq!(missing, ["libnarrator-nonexistent.so.7"]);
    }

    #[test]
    fn a_non_elf_file_is_a_clear_error() {
        let dir = std::env::temp_dir().join(format!("narrator-cuda-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("test value");
        std::fs::write(dir.join(PROVIDER_LIBRARY), b"not an ELF file at all").expect("test value");
        let err = inspect(&dir, &LoaderPaths::default()).expect_err("must fail");
        assert!(err.to_string().contains("not a readable ELF"), "{err}");
        std::fs::remove_dir_all(&dir).ok();
    }
}
