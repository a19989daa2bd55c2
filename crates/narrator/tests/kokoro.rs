//! `narrator run` with the Kokoro-82M family (run `bash ops/setup.sh --kokoro` first):
//! a book with chapters in WAV and M4B, speed, blends and the job identity, the voice
//! list, and bad voice names.

use std::path::Path;
use std::process::Command;

use narrator_test_support::media;

mod common;
use common::{ROOT, hound_like_len, manifest, run_err, run_ok};

/// The binary, once Kokoro is installed.
fn narrator() -> Command {
    assert!(
        Path::new(ROOT)
            .join(".deps/voices/kokoro/model.onnx")
            .is_file(),
        "Kokoro missing: run `bash ops/setup.sh --kokoro` first"
    );
    common::narrator()
}

fn wav(path: &Path) -> (u64, u32) {
    hound_like_len(path)
}

const BOOK: &str = "---\ntitle: The Pool of Tears\nauthor: Lewis Carroll\ncover: cover.png\n---\n\n\
# Chapter One\n\nCuriouser and curiouser, cried Alice. Now I am opening out like the \
largest telescope that ever was!\n\n# Chapter Two\n\nGoodbye, feet. Oh, my poor little \
feet, I wonder who will put on your shoes now?\n";

#[test]
fn a_kokoro_voice_reads_a_book_with_chapters_speed_and_blends() {
    let dir = tempfile::tempdir().expect("tmp");
    let book = dir.path().join("pool.md");
    std::fs::write(&book, BOOK).expect("write");
    std::fs::write(dir.path().join("cover.png"), media::PNG).expect("cover");
    let b = book.to_str().expect("utf8");
    let out = |n: &str| dir.path().join(n);
    let s = |p: &Path| p.to_str().expect("utf8").to_owned();

    // WAV with chapter files: 24 kHz, every chapter there, the voice in the manifest.
    let wav_dir = out("wav");
    let o = run_ok(&[
        "run",
        b,
        "--voice",
        "af_heart",
        "--format",
        "wav",
        "--chapter-files",
        "--out",
        &s(&wav_dir),
        "--json",
    ]);
    let summary: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    let m = manifest(&wav_dir);
    assert_eq!(m["voice"], "af_heart", "{m}");
    assert_eq!(m["chapters"].as_array().map(Vec::len), Some(2), "{m}");
    let (samples, rate) = wav(&wav_dir.join(m["book"]["file"].as_str().expect("file")));
    assert_eq!(rate, 24_000);
    let normal = samples as f64 / 24_000.0;
    assert!(
        (4.0..30.0).contains(&normal),
        "{normal} s for four sentences"
    );
    for c in m["chapters"].as_array().expect("chapters") {
        let (n, r) = wav(&wav_dir.join(c["file"].as_str().expect("chapter file")));
        assert_eq!(r, 24_000);
        assert!(n > 24_000, "a chapter of {n} samples");
    }
    assert!(summary["rtf"].as_f64().is_some(), "{summary}");

    // --speed 1.5: the same book, about 1.5 times shorter, its words timed.
    let fast = out("fast");
    run_ok(&[
        "run",
        b,
        "--voice",
        "af_heart",
        "--speed",
        "1.5",
        "--format",
        "wav",
        "--subtitles",
        "vtt",
        "--out",
        &s(&fast),
    ]);
    let words = common::word_timings(&fast);
    assert!(words.pauses >= 2, "{words:?}");
    assert!(words.loud > 20.0 * words.quiet, "{words:?}");
    assert!(words.stamps * 10 >= words.words * 7, "{words:?}");
    let mf = manifest(&fast);
    let (n, _) = wav(&fast.join(mf["book"]["file"].as_str().expect("file")));
    let ratio = normal / (n as f64 / 24_000.0);
    // Chapter and paragraph pauses do not scale with speed, so a little under 1.5.
    assert!(
        (1.2..1.7).contains(&ratio),
        "speed 1.5 made it {ratio:.2}x shorter"
    );

    // A blend in the same folder is another job: nothing of af_heart's is reused.
    let o = run_ok(&[
        "run",
        b,
        "--voice",
        "af_bella:2+af_sky:1",
        "--format",
        "wav",
        "--chapter-files",
        "--out",
        &s(&wav_dir),
        "--json",
    ]);
    let summary: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(summary["resumed_segments"], 0, "{summary}");
    assert_eq!(manifest(&wav_dir)["voice"], "af_bella:2+af_sky:1");

    // M4B from 24 kHz audio: chapters, tags, cover and duration as ffprobe reads them.
    let m4b = out("m4b");
    run_ok(&[
        "run",
        b,
        "--voice",
        "bf_emma",
        "--format",
        "m4b",
        "--out",
        &s(&m4b),
    ]);
    let m = manifest(&m4b);
    media::check_m4b(&m, &m4b.join(m["book"]["file"].as_str().expect("file")));
}

#[test]
fn voices_lists_kokoro_with_family_language_gender_and_grade() {
    let o = run_ok(&["voices", "--json"]);
    let list: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    let list = list.as_array().expect("array");
    let kokoro: Vec<_> = list.iter().filter(|v| v["family"] == "kokoro").collect();
    assert_eq!(kokoro.len(), 54);
    let heart = kokoro
        .iter()
        .find(|v| v["name"] == "af_heart")
        .expect("af_heart");
    assert_eq!(heart["language"], "en-US");
    assert_eq!(heart["gender"], "female");
    assert_eq!(heart["quality"], "A");
    assert_eq!(heart["sample_rate"], 24_000);
    let joe = list
        .iter()
        .find(|v| v["name"] == "en_US-joe-medium")
        .expect("joe");
    assert_eq!(joe["family"], "piper");
    // A reader that goes away (`narrator voices | head`) ends the listing, not in a panic.
    let mut child = narrator()
        .arg("voices")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn");
    drop(child.stdout.take());
    let out = child.wait_with_output().expect("wait");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && !err.contains("panicked"), "{err}");
    let table = String::from_utf8(run_ok(&["voices"]).stdout).expect("utf8");
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("bm_george") && l.contains("kokoro") && l.contains("male")),
        "{table}"
    );
}

#[test]
fn bad_kokoro_voices_get_one_line() {
    let dir = tempfile::tempdir().expect("tmp");
    let book = dir.path().join("b.txt");
    std::fs::write(&book, "Hello there.").expect("write");
    let b = book.to_str().expect("utf8");
    let o = dir.path().join("o");
    let o = o.to_str().expect("utf8");
    for (voice, says) in [
        ("af_nobody", "unknown voice"),
        ("jf_alpha", "G2P"),
        ("af_bella:2+nobody", "not a Kokoro voice"),
        ("af_bella:0+af_sky", "positive"),
    ] {
        let e = run_err(&["run", b, "--voice", voice, "--out", o]);
        assert!(e.contains(says), "{voice}: {e}");
    }
    // A Kokoro voice with no installation says how to install it.
    let empty = tempfile::tempdir().expect("tmp");
    std::fs::create_dir_all(empty.path().join("voices")).expect("mkdir");
    let out = narrator()
        .args(["run", b, "--voice", "af_heart", "--out", o, "--voices-dir"])
        .arg(empty.path().join("voices"))
        .output()
        .expect("spawn");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("narrator voices install kokoro"), "{err}");
}

/// `narrator` with calibrations cached in `cache`, its JSON output on success. A quick
/// calibration (one round a comparison, batch 1 only): what is tested here is what it
/// records and how runs use it, not what it measures.
fn json_in(cache: &Path, args: &[&str], graph_env: Option<&str>) -> serde_json::Value {
    let mut cmd = narrator();
    cmd.env("NARRATOR_CACHE_DIR", cache)
        .env("NARRATOR_TEST_QUICK_CALIBRATION", "1")
        .args(args);
    match graph_env {
        Some(g) => cmd.env("NARRATOR_KOKORO_GRAPH", g),
        None => cmd.env_remove("NARRATOR_KOKORO_GRAPH"),
    };
    let o = cmd.output().expect("spawn narrator");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let line = String::from_utf8_lossy(&o.stdout)
        .lines()
        .find(|l| l.starts_with('{'))
        .map(str::to_owned)
        .unwrap_or_default();
    serde_json::from_str(&line).expect("one JSON object")
}

#[test]
fn a_calibration_times_both_kokoro_graphs_and_runs_keep_its_choice() {
    let fp32 = Path::new(ROOT).join(".deps/voices/kokoro/model.fp32.onnx");
    assert!(
        fp32.is_file(),
        "the fp32 graph is missing: run `bash ops/setup.sh --kokoro --gpu`"
    );
    let cache = tempfile::tempdir().expect("tmp");
    let plan = json_in(
        cache.path(),
        &[
            "plan",
            "--voice",
            "af_heart",
            "--json",
            "--calibrate",
            "always",
            // The layout fixed (not measured: that is the Piper tests' part), one session (each
            // loads the graph), to save time.
            "--sessions",
            "1",
            "--intra-threads",
            "1",
        ],
        None,
    );
    // Both graphs timed side by side in the layout that runs, and the choice explained.
    let c = &plan["calibration"];
    let timed: Vec<&str> = c["layouts"]
        .as_array()
        .map(|l| l.iter().filter_map(|p| p["graph"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(timed, ["int8", "fp32"], "{c}");
    let why = c["graph_reason"].as_str().unwrap_or_default();
    assert!(why.contains("int8") && why.contains("fp32"), "{c}");
    let chosen = c["graph"].as_str().unwrap_or("int8");
    assert_eq!(plan["graph"].as_str(), Some(chosen), "{plan}");
    assert!(why.contains(&format!("{chosen} by throughput")), "{why}");

    // A run reads the cached choice and loads that graph: set it to each in turn.
    let file = std::fs::read_dir(cache.path().join("calibration"))
        .expect("calibration cached")
        .flatten()
        .next()
        .expect("one calibration file")
        .path();
    let text = cache.path().join("one.txt");
    std::fs::write(&text, "Curiouser and curiouser, cried Alice.").expect("write");
    for graph in ["fp32", "int8"] {
        let mut cached: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&file).expect("read")).expect("json");
        cached["graph"] = graph.into();
        std::fs::write(&file, cached.to_string()).expect("write");
        let out = cache.path().join(graph);
        let run = json_in(
            cache.path(),
            &[
                "run",
                text.to_str().expect("utf8"),
                "--voice",
                "af_heart",
                "--format",
                "wav",
                "--sessions",
                "1",
                "--intra-threads",
                "1",
                "--out",
                out.to_str().expect("utf8"),
                "--json",
            ],
            None,
        );
        assert_eq!(run["plan"]["graph"], graph, "{run}");
        assert_eq!(run["plan"]["source"], "calibration+flags", "{run}");
    }
    // A setting fixes the graph: nothing to choose, nothing reported.
    let fixed = json_in(
        cache.path(),
        &[
            "plan",
            "--voice",
            "af_heart",
            "--json",
            "--sessions",
            "1",
            "--intra-threads",
            "1",
        ],
        Some("fp32"),
    );
    assert!(fixed["graph"].is_null(), "{fixed}");
}
