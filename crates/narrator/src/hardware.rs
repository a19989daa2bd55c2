//! `narrator doctor` and `narrator plan`: what this machine is, what is wrong with it for
//! inference, and the batch plan a worker would run here (or on simulated GPUs).

use anyhow::Context;
use narrator_hardware::{
    Calibration, DeviceSpec, Plan, PlanLimits, RuntimeFacts, Severity, diagnose,
};

use crate::cli::{DoctorArgs, PlanArgs};
use crate::engine::{self, Planning};
use crate::paths::Paths;

/// CUDA major version the PyPI onnxruntime-gpu 1.19+ wheels are built for.
const ORT_GPU_CUDA_MAJOR: u32 = 12;

/// `narrator doctor`: the profile and the checklist; exit status 1 when a check failed
/// with severity error.
pub(crate) fn doctor(global: &crate::cli::Global, args: DoctorArgs) -> anyhow::Result<()> {
    let profile = narrator_hardware::probe();
    // The runtime is optional here: doctor must work on a machine that is not set up.
    let runtime = Paths::resolve(global)
        .ok()
        .and_then(|p| narrator_engine::load_runtime(&p.onnxruntime).ok())
        .map(|rt| RuntimeFacts {
            library: rt.library.display().to_string(),
            version: narrator_hardware::doctor::version_from_library_path(&rt.library),
            cuda_provider: rt.cuda_available,
            cuda_major: rt.cuda_available.then_some(ORT_GPU_CUDA_MAJOR),
        });
    let findings = diagnose(&profile, runtime.as_ref());
    if args.json {
        let mut v = serde_json::to_value(&profile).context("encoding the profile")?;
        if let Some(o) = v.as_object_mut() {
            o.insert("runtime".into(), serde_json::to_value(&runtime)?);
            o.insert("findings".into(), serde_json::to_value(&findings)?);
        }
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        if runtime.is_none() {
            println!("ONNX Runtime: not found (run `bash ops/setup.sh`); runtime checks skipped");
        }
        print!(
            "{}",
            narrator_hardware::doctor::render_text(&profile, &findings)
        );
    }
    let errors = findings
        .iter()
        .filter(|f| f.severity == Severity::Error)
        .count();
    if errors > 0 {
        anyhow::bail!("doctor found {errors} problem(s) of severity error (see above)");
    }
    Ok(())
}

/// Parses `NAME:GIB` (the name may contain colons; the last field is the size).
fn parse_simulated(s: &str) -> anyhow::Result<DeviceSpec> {
    let (name, gib) = s
        .rsplit_once(':')
        .with_context(|| format!("--simulate-gpu {s}: expected NAME:GIB, e.g. 'Tesla T4:16'"))?;
    let gib: f64 = gib
        .trim()
        .parse()
        .ok()
        .filter(|g: &f64| *g > 0.0 && g.is_finite())
        .with_context(|| format!("--simulate-gpu {s}: '{gib}' is not a size in GiB"))?;
    Ok(DeviceSpec::simulated_gpu(name.trim(), gib))
}

fn print_plan(label: &str, p: &Plan, json: bool) -> anyhow::Result<()> {
    print_plan_with(label, p, serde_json::to_value(p)?, json)
}

fn print_plan_with(
    label: &str,
    p: &Plan,
    mut v: serde_json::Value,
    json: bool,
) -> anyhow::Result<()> {
    if json {
        if let Some(o) = v.as_object_mut() {
            o.insert("for".into(), label.into());
        }
        println!("{}", serde_json::to_string(&v)?);
    } else {
        println!("{label}: {} ({})", p.device, p.device_model);
        println!(
            "  max_batch_tokens {}  max_batch_requests {}  max_wait {} ms  sessions {} × {} threads  prefetch {}",
            p.max_batch_tokens,
            p.max_batch_requests,
            p.max_wait_ms,
            p.sessions,
            p.intra_threads,
            p.prefetch
        );
        println!(
            "  {} sentence-sized items per batch, {:.0} MiB for batches",
            p.batch_items,
            p.memory_budget_bytes as f64 / 1048576.0
        );
        println!("  why: {}", p.reason);
    }
    Ok(())
}

/// `narrator plan`.
pub(crate) fn plan(global: &crate::cli::Global, args: PlanArgs) -> anyhow::Result<()> {
    let simulated: Vec<DeviceSpec> = args
        .simulate_gpu
        .iter()
        .map(|s| parse_simulated(s))
        .collect::<anyhow::Result<_>>()?;
    let limits = PlanLimits::default();
    let calibration: Calibration = match args.bytes_per_token {
        Some(b) if b > 0.0 && b.is_finite() => {
            Calibration::supplied(&args.engine.voice, b, engine::ITEM_TOKENS)
        }
        Some(b) => anyhow::bail!("--bytes-per-token {b}: give a positive number of bytes"),
        None => {
            let paths = Paths::resolve(global)?;
            let voice = engine::find_voice(&paths, &args.engine)?;
            let planning = match args.engine.calibrate.as_deref() {
                Some(p) => p.parse()?,
                None => Planning::Calibrate,
            };
            let loaded = engine::load(&paths, &args.engine, voice, planning)?;
            print_plan_with("this machine", &loaded.plan, loaded.plan_json(), args.json)?;
            let c = loaded
                .calibration
                .context("no calibration was measured or cached; run without --calibrate cached")?;
            if !args.json {
                println!(
                    "  calibration ({}, {:.1} s): {:.2} MiB per padded token, {:.0} MiB fixed",
                    c.source,
                    c.seconds,
                    c.bytes_per_token / 1048576.0,
                    c.fixed_bytes as f64 / 1048576.0
                );
                for l in &c.layouts {
                    println!(
                        "    layout {} session(s) × {} thread(s): {:.1}x realtime (batch 1, all sessions busy)",
                        l.sessions, l.intra_threads, l.throughput
                    );
                }
                for p in &c.points {
                    println!(
                        "    batch {:>3}: {:>7.3} s (slowest {:.3} s), {:>6.1}x realtime, {:>7.1} MiB",
                        p.batch,
                        p.seconds,
                        p.max_seconds,
                        p.throughput(),
                        p.memory_bytes as f64 / 1048576.0
                    );
                }
            }
            c
        }
    };
    for d in &simulated {
        let p = narrator_hardware::plan(d, &calibration, &limits);
        let label = format!(
            "simulated {} ({} bytes/token from {})",
            d.model(),
            calibration.bytes_per_token.round(),
            calibration.source
        );
        print_plan(&label, &p, args.json)?;
    }
    Ok(())
}
