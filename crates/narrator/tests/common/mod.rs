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

/// What [`word_timings`] measured.
#[derive(Debug)]
pub(crate) struct WordCheck {
    /// Mean rms of the words' samples.
    pub(crate) loud: f64,
    /// Mean rms of the pauses between words (150 ms or more) and after each sentence's
    /// last word (100 ms or more, before the next sentence's pause).
    pub(crate) quiet: f64,
    /// How many such pauses.
    pub(crate) pauses: usize,
    /// Words in timings.json.
    pub(crate) words: usize,
    /// Inline timestamps in the WebVTT.
    pub(crate) stamps: usize,
}

/// Checks the word timings of a run made `--format wav --subtitles vtt` into `out`:
/// timings.json holds every token of every sentence, in order, each word inside its
/// sentence's speech; FFmpeg reads the WebVTT. Returns what the audio says of them.
pub(crate) fn word_timings(out: &Path) -> WordCheck {
    let m = manifest(out);
    let timings: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("timings.json")).expect("timings.json"))
            .expect("json");
    let (rate, samples) =
        narrator_audio::read_wav_i16(&out.join(m["book"]["file"].as_str().expect("file")))
            .expect("book wav");
    assert_eq!(timings["sample_rate"].as_u64(), Some(u64::from(rate)));
    let rms = |a: u64, b: u64| {
        let part = &samples[a as usize..b as usize];
        let sum: f64 = part.iter().map(|&x| f64::from(x) * f64::from(x)).sum();
        (sum / part.len().max(1) as f64).sqrt()
    };
    let n = |v: &serde_json::Value, k: &str| v[k].as_u64().expect("sample");
    let (mut in_words, mut in_pauses) = ((0.0, 0u64), (0.0, 0u64));
    let mut pauses = 0;
    let sentences = timings["sentences"].as_array().expect("sentences");
    for sentence in sentences {
        let text = sentence["text"].as_str().expect("text");
        let words = sentence["words"]
            .as_array()
            .expect("every sentence has words");
        // Every token of the text, in order, in the words.
        let tokens: Vec<&str> = words
            .iter()
            .flat_map(|w| w["text"].as_str().expect("word").split_whitespace())
            .collect();
        assert_eq!(
            tokens,
            text.split_whitespace().collect::<Vec<_>>(),
            "{text}"
        );
        let (a, b) = (n(sentence, "start_sample"), n(sentence, "end_sample"));
        let mut at = a;
        for w in words {
            let (ws, we) = (n(w, "start_sample"), n(w, "end_sample"));
            assert!(ws >= at && we > ws && we <= b, "{text}: {w}");
            if ws - at >= u64::from(rate) * 3 / 20 && at > a {
                in_pauses.0 += rms(at, ws) * (ws - at) as f64;
                in_pauses.1 += ws - at;
                pauses += 1;
            }
            in_words.0 += rms(ws, we) * (we - ws) as f64;
            in_words.1 += we - ws;
            at = we;
        }
        if b - at >= u64::from(rate) / 10 {
            in_pauses.0 += rms(at, b) * (b - at) as f64;
            in_pauses.1 += b - at;
            pauses += 1;
        }
    }
    let vtt_name = m["book"]["subtitles"]
        .as_array()
        .and_then(|s| {
            s.iter()
                .find_map(|n| n.as_str().filter(|n| n.ends_with(".vtt")))
        })
        .expect("a WebVTT");
    let vtt = std::fs::read_to_string(out.join(vtt_name)).expect("vtt");
    // FFmpeg reads the file, inline times and all.
    let cues = narrator_test_support::media::subtitle_cues(&out.join(vtt_name));
    assert!(cues.len() >= sentences.len());
    assert!(!cues[0].2.trim().is_empty());
    WordCheck {
        loud: in_words.0 / in_words.1.max(1) as f64,
        quiet: in_pauses.0 / in_pauses.1.max(1) as f64,
        pauses,
        words: sentences
            .iter()
            .map(|s| s["words"].as_array().map_or(0, Vec::len))
            .sum(),
        stamps: vtt.matches("<00:").count(),
    }
}
