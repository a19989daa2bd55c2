//! What the `narrator` command's test files share: the binary pointed at the test data,
//! runs that must pass or fail in one line, and readers of what a run writes.

#![allow(dead_code)] // each test file uses its own part

use std::path::Path;
use std::process::{Command, Output};

pub(crate) const ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");

/// The binary with the test data folder and the CPU build of ONNX Runtime, whatever
/// `ops/setup.sh --gpu` installed: the GPU-less fallback of `--device auto` (one warning
/// line) has its own tests (tests/gpu.rs).
pub(crate) fn narrator() -> Command {
    let deps = Path::new(ROOT).join(".deps");
    assert!(
        deps.join("voices").is_dir(),
        "voices missing: run `bash ops/setup.sh` first"
    );
    let mut c = Command::new(env!("CARGO_BIN_EXE_narrator"));
    narrator_test_support::use_test_data(&mut c)
        .env("NARRATOR_ORT_BUILD", "cpu")
        .env_remove("NARRATOR_VOICE");
    c
}

/// Runs `narrator ARGS`, which must succeed.
pub(crate) fn run_ok(args: &[&str]) -> Output {
    let out = narrator().args(args).output().expect("spawn narrator");
    assert!(
        out.status.success(),
        "narrator {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A failure must be exactly one line on stderr, a non-zero exit, and no panic.
pub(crate) fn run_err(args: &[&str]) -> String {
    let out = narrator().args(args).output().expect("spawn narrator");
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(
        !out.status.success(),
        "narrator {args:?} should fail; stderr: {err}"
    );
    assert!(!err.contains("panicked"), "panic: {err}");
    assert_eq!(
        err.trim_end().lines().count(),
        1,
        "one line expected, got: {err}"
    );
    assert!(err.starts_with("error: "), "{err}");
    err
}

/// The run's `manifest.json`.
pub(crate) fn manifest(dir: &Path) -> serde_json::Value {
    let bytes = std::fs::read(dir.join("manifest.json")).expect("manifest.json");
    serde_json::from_slice(&bytes).expect("manifest is JSON")
}

/// (samples, rate) of a 16-bit mono WAV written by narrator (44-byte header).
pub(crate) fn hound_like_len(path: &Path) -> (u64, u32) {
    let b = std::fs::read(path).expect("wav");
    assert_eq!(&b[..4], b"RIFF");
    let rate = u32::from_le_bytes([b[24], b[25], b[26], b[27]]);
    ((b.len() as u64 - 44) / 2, rate)
}

/// Seconds of a WAV written by narrator.
pub(crate) fn wav_seconds(path: &Path) -> f64 {
    let r = hound_like_len(path);
    r.0 as f64 / f64::from(r.1)
}
