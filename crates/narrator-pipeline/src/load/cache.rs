//! Calibrations cached on disk, by voice, device model, runtime and thread layout.

use std::path::{Path, PathBuf};

use narrator_hardware::{Calibration, CalibrationSource};

use super::Paths;

fn slug(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Where a calibration of this voice, device model, runtime and thread layout is cached.
pub fn calibration_path(
    paths: &Paths,
    voice: &str,
    model: &str,
    runtime: &str,
    layout: &str,
) -> PathBuf {
    paths.cache.join("calibration").join(format!(
        "{}__{}__ort-{}__{layout}.json",
        slug(voice),
        slug(model),
        slug(runtime)
    ))
}

pub(super) fn read_cached(path: &Path) -> Option<Calibration> {
    let text = std::fs::read_to_string(path).ok()?;
    match serde_json::from_str::<Calibration>(&text) {
        Ok(mut c) => {
            c.source = CalibrationSource::Cache;
            Some(c)
        }
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "ignoring an unreadable cached calibration");
            None
        }
    }
}

pub(super) fn write_cached(path: &Path, c: &Calibration) {
    let write = || -> std::io::Result<()> {
        let dir = path.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir)?;
        // A temporary file of its own: workers that share the cache (one volume, several
        // containers, each its own PID 1) may write the same calibration at once.
        let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
        // Readable by every user, as a plainly written file would be (tempfile makes 0600).
        #[cfg(unix)]
        tmp.as_file()
            .set_permissions(std::os::unix::fs::PermissionsExt::from_mode(0o644))?;
        std::io::Write::write_all(&mut tmp, &serde_json::to_vec_pretty(c).unwrap_or_default())?;
        tmp.persist(path).map(|_| ()).map_err(|e| e.error)
    };
    if let Err(e) = write() {
        tracing::warn!(path = %path.display(), error = %e, "cannot cache the calibration");
    }
}
