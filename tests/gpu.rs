//! The GPU path on this GPU-less machine, with ONNX Runtime's real CUDA build
//! (`bash ops/setup.sh --gpu`, which `ops/test.sh` runs): doctor names every missing
//! library, `--device auto` runs on the CPU without a warning (there is no GPU to miss;
//! a worker's status row shows no fallback), `--device cuda:0` fails in one line;
//! calibrations by GPU model are shared through the database and used for plans of
//! mixed fleets. (Where a GPU is present but CUDA cannot start, `auto` warns: the unit
//! test `auto_warns_only_where_a_gpu_is_present` in the narrator crate.)

use std::path::{Path, PathBuf};
use std::process::Command;

use narrator_test_support::{World, narrator_bin, root, test_cache_dir};

/// The CUDA build `ops/setup.sh --gpu` installs (never skipped: `ops/test.sh` installs it).
fn gpu_build() -> PathBuf {
    let dir = root().join(".deps/onnxruntime-gpu");
    assert!(
        dir.join("libonnxruntime_providers_cuda.so").is_file(),
        "ONNX Runtime's CUDA build is missing: run `bash ops/setup.sh --gpu` (ops/test.sh does)"
    );
    dir
}

/// `narrator` picking its ONNX Runtime build itself (the CUDA one when installed), with
/// the loader seeing only the system's folders.
fn narrator_auto() -> Command {
    gpu_build();
    let mut c = Command::new(narrator_bin());
    narrator_test_support::use_test_data(&mut c)
        .env("NARRATOR_ORT_BUILD", "auto")
        .env_remove("LD_LIBRARY_PATH")
        .env_remove("NARRATOR_CUDA_LIBS")
        .env_remove("NARRATOR_ONNXRUNTIME")
        .env_remove("NARRATOR_DEVICE")
        .env_remove("NARRATOR_VOICE");
    c
}

fn doctor_libraries(cuda_libs: Option<&Path>) -> (Vec<String>, serde_json::Value) {
    let mut c = narrator_auto();
    if let Some(dir) = cuda_libs {
        c.env("NARRATOR_CUDA_LIBS", dir);
    }
    let out = c.args(["doctor", "--json"]).output().expect("doctor");
    assert!(
        out.status.success(),
        "doctor fails only on errors, and a GPU-less machine has none: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("doctor JSON");
    let build = &v["runtime"]["cuda_build"];
    let mut missing: Vec<String> = build["libraries"]
        .as_array()
        .expect("libraries")
        .iter()
        .filter(|l| l["path"].is_null())
        .map(|l| l["name"].as_str().unwrap_or_default().to_owned())
        .collect();
    missing.sort();
    (missing, v)
}

#[test]
fn doctor_names_exactly_the_missing_cuda_libraries() {
    // No CUDA wheels: every CUDA library the provider links or opens, and the driver.
    let empty = tempfile::tempdir().expect("dir");
    let (missing, v) = doctor_libraries(Some(empty.path()));
    assert_eq!(
        missing,
        [
            "libcublas.so.13",
            "libcublasLt.so.13",
            "libcuda.so.1",
            "libcudart.so.13",
            "libcudnn.so.9",
            "libcurand.so.10"
        ],
        "{v:#}"
    );
    let build = &v["runtime"]["cuda_build"];
    assert_eq!(build["cuda_major"], 13);
    let finding = v["findings"]
        .as_array()
        .expect("findings")
        .iter()
        .find(|f| f["check"] == "cuda_libraries")
        .expect("a cuda_libraries finding");
    assert_eq!(finding["severity"], "warning", "no GPU here: {finding}");
    let measured = finding["measured"].as_str().unwrap_or_default();
    assert!(measured.contains("libcudart.so.13"), "{measured}");
    let fix = finding["fix"].as_str().unwrap_or_default();
    assert!(
        fix.contains("nvidia-cublas") && fix.contains("ops/setup.sh --gpu"),
        "{fix}"
    );
    assert!(fix.contains("NVIDIA driver"), "{fix}");

    // With the wheels setup unpacked: only the driver is missing; cuDNN's parts resolve
    // from narrator's folder (which narrator loads first).
    let (missing, v) = doctor_libraries(None);
    assert_eq!(missing, ["libcuda.so.1"], "{v:#}");
    let libs = v["runtime"]["cuda_build"]["libraries"]
        .as_array()
        .expect("libraries")
        .clone();
    let graph = libs
        .iter()
        .find(|l| l["name"] == "libcudnn_graph.so.9")
        .expect("cuDNN's graph library is checked");
    // Found next to libcudnn.so.9 (its own $ORIGIN), which narrator loads first.
    assert!(
        graph["path"]
            .as_str()
            .is_some_and(|p| p.ends_with(".deps/cuda/lib/libcudnn_graph.so.9")),
        "{graph}"
    );
    let cudnn = libs
        .iter()
        .find(|l| l["name"] == "libcudnn.so.9")
        .expect("cuDNN is checked");
    assert_eq!(cudnn["via"], "bundled", "{cudnn}");
    assert_eq!(v["runtime"]["cuda_build"]["cudnn_major"], 9);
    let text = narrator_auto().arg("doctor").output().expect("doctor");
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("cuda_libraries: 1 of") && text.contains("libcuda.so.1"),
        "{text}"
    );
}

#[test]
fn auto_runs_on_the_cpu_quietly_without_a_gpu_and_cuda_fails_in_one_line() {
    let dir = tempfile::tempdir().expect("dir");
    let text = dir.path().join("hello.txt");
    std::fs::write(&text, "Hello there. This runs on the CPU.\n").expect("text");
    let wav = dir.path().join("hello.wav");
    let out = narrator_auto()
        .args(["synth"])
        .arg(&text)
        .arg("-o")
        .arg(&wav)
        .output()
        .expect("synth");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        std::fs::metadata(&wav).expect("wav").len() > 10_000,
        "no audio"
    );
    assert!(
        !err.contains('\u{1b}'),
        "no colour codes off a terminal: {err:?}"
    );
    // No GPU on this machine: nothing to warn about (the CUDA build is installed, the
    // driver is not).
    assert!(!err.contains("WARN"), "no warning without a GPU: {err}");

    let out = narrator_auto()
        .args(["synth", "--device", "cuda:0"])
        .arg(&text)
        .arg("-o")
        .arg(dir.path().join("never.wav"))
        .output()
        .expect("synth");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    assert!(
        err.starts_with("error: --device cuda:0: CUDA cannot start: ")
            && err.contains("libcuda.so.1 (the NVIDIA driver"),
        "{err}"
    );
    assert!(!dir.path().join("never.wav").exists());
}

/// Worker `id`'s row in `narrator workers --json` once it shows its engines' plans (one
/// per voice and device; the first heartbeat may come before them).
fn worker_row(w: &World, id: &str) -> serde_json::Value {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    loop {
        let out = w.ok(&["workers", "--json"]);
        let list: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
        if let Some(row) = list
            .as_array()
            .and_then(|l| l.iter().find(|r| r["id"] == id && r["plan"][0].is_object()))
        {
            return row.clone();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no row for worker {id}: {list}"
        );
        std::thread::sleep(std::time::Duration::from_millis(300));
    }
}

/// A worker on `--device auto` on this GPU-less machine runs on the CPU: its status row
/// says cpu with no fallback, its log has no warning about it.
#[test]
fn a_worker_without_a_gpu_runs_on_the_cpu_without_a_fallback_warning() {
    let mut w = World::new();
    w.worker(
        "gpu-less",
        &["--calibrate", "cached"],
        &[("NARRATOR_ORT_BUILD", "auto")],
    );
    let row = worker_row(&w, "gpu-less");
    assert_eq!(row["device"], "cpu", "{row}");
    assert!(row["plan"][0]["device_fallback"].is_null(), "{row}");
    let text = String::from_utf8_lossy(&w.ok(&["workers"]).stdout).to_string();
    assert!(!text.contains("instead of a GPU"), "{text}");
    let log = w.worker_log("gpu-less");
    assert!(!log.contains("runs on the CPU"), "{log}");
}

/// A calibration measured by one worker of a GPU model is stored for the fleet; the next
/// worker of that model plans from it without measuring, and `plan` uses it too.
#[test]
fn calibrations_by_gpu_model_are_shared_through_the_database() {
    let mut w = World::new();
    let model = format!("Test GPU {}", narrator_db::Uuid::new_v4().simple());
    let env = [
        ("NARRATOR_TEST_GPU_MEMORY_TOKENS", "2000"),
        ("NARRATOR_TEST_GPU_MODEL", model.as_str()),
    ];
    let a = w.worker("gpu-a", &[], &env);
    let log_a = w.worker_log("gpu-a");
    assert!(log_a.contains("calibrating"), "{log_a}");
    assert!(log_a.contains("stored for the fleet"), "{log_a}");
    let rows: Vec<(String, String)> = w.rt.block_on(async {
        sqlx::query_as("SELECT device_model, measured_by FROM gpu_calibrations")
            .fetch_all(&w.pool)
            .await
            .expect("calibrations")
    });
    assert_eq!(rows, [(model.clone(), "gpu-a".to_owned())]);
    w.stop(a, 15);

    w.worker("gpu-b", &[], &env);
    let log_b = w.worker_log("gpu-b");
    assert!(
        !log_b.contains("calibrating"),
        "gpu-b measured again: {log_b}"
    );
    let b = worker_row(&w, "gpu-b");
    let reason = b["plan"][0]["reason"].as_str().unwrap_or_default();
    assert!(
        reason.starts_with(&format!(
            "calibration of {model} from fleet database, measured by gpu-a"
        )),
        "{b}"
    );
    assert_eq!(b["plan"][0]["calibration"]["source"], "catalog", "{b}");

    // `narrator plan` reads the same table for a simulated GPU of that model.
    let out = w.ok(&[
        "plan",
        "--json",
        "--bytes-per-token",
        "500000",
        "--simulate-gpu",
        &format!("{model}:16"),
    ]);
    let p: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one plan as JSON");
    let reason = p["reason"].as_str().unwrap_or_default();
    assert!(
        reason.starts_with(&format!("calibration of {model} (fleet database")),
        "{p}"
    );
    // The test's calibration files in the shared cache.
    for e in std::fs::read_dir(test_cache_dir().join("calibration"))
        .into_iter()
        .flatten()
        .flatten()
    {
        if e.file_name().to_string_lossy().contains("Test_GPU_") {
            std::fs::remove_file(e.path()).ok();
        }
    }
}

/// A GPU calibration as `narrator plan --json` prints it under `calibration_full`: the
/// throughput stops rising after `knee` items.
fn calibration(model: &str, bytes_per_token: f64, knee: usize) -> serde_json::Value {
    let mut points = Vec::new();
    let mut b = 1usize;
    while b <= knee * 2 {
        let seconds = 0.05 * b as f64 / b.min(knee) as f64;
        points.push(serde_json::json!({
            "batch": b, "tokens": b * 128,
            "memory_bytes": (bytes_per_token * (b * 128) as f64) as u64,
            "seconds": seconds, "max_seconds": seconds, "audio_seconds": 5.0 * b as f64,
        }));
        b *= 2;
    }
    serde_json::json!({
        "voice": "en_US-joe-medium", "device_model": model, "runtime": "1.31.1",
        "item_tokens": 128, "fixed_bytes": 0, "bytes_per_token": bytes_per_token,
        "intra_threads": 1, "sessions": 1, "points": points, "source": "measured",
        "layouts": [], "seconds": 12.0,
    })
}

/// Mixed fleet: two models with calibration files get their own budgets and prefetch; a
/// third, unknown model is planned by the memory-only rule.
#[test]
fn plans_for_a_mixed_fleet_tell_gpu_models_apart() {
    let dir = tempfile::tempdir().expect("dir");
    let a = dir.path().join("a.json");
    let b = dir.path().join("b.json");
    std::fs::write(&a, calibration("Model A", 400_000.0, 32).to_string()).expect("a");
    std::fs::write(&b, calibration("Model B", 900_000.0, 8).to_string()).expect("b");
    let out = narrator_auto()
        .env_remove("NARRATOR_DATABASE_URL")
        .args(["plan", "--json", "--bytes-per-token", "700000"])
        .args([
            "--simulate-gpu",
            "Model A:80",
            "--simulate-gpu",
            "Model B:24",
        ])
        .args(["--simulate-gpu", "Tesla T4:16"])
        .arg("--calibration")
        .arg(&a)
        .arg("--calibration")
        .arg(&b)
        .output()
        .expect("plan");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let plans: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON plan per line"))
        .collect();
    assert_eq!(plans.len(), 3, "{plans:?}");
    let (pa, pb, pt) = (&plans[0], &plans[1], &plans[2]);
    assert_eq!(pa["batch_items"], 32, "{pa}");
    assert_eq!(pb["batch_items"], 8, "{pb}");
    assert!(
        pa["reason"]
            .as_str()
            .is_some_and(|r| r.starts_with("calibration of Model A (")),
        "{pa}"
    );
    assert_ne!(pa["max_batch_tokens"], pb["max_batch_tokens"]);
    assert_ne!(pa["prefetch"], pb["prefetch"]);
    assert!(
        pt["reason"]
            .as_str()
            .is_some_and(|r| r.starts_with("memory-only rule (no calibration of Tesla T4)")),
        "{pt}"
    );
    assert_eq!(pt["batch_items"], 64, "{pt}");

    // A file that is not a calibration: one line saying what to give.
    let bad = dir.path().join("bad.json");
    std::fs::write(&bad, "{}").expect("bad");
    let out = narrator_auto()
        .args(["plan", "--bytes-per-token", "1", "--calibration"])
        .arg(&bad)
        .output()
        .expect("plan");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(err.contains("is not a narrator calibration"), "{err}");
}
