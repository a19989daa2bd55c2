//! `narrator doctor` and `narrator plan`: what this machine is, what is wrong with it for
//! inference, and the batch plan a worker would run here (or on simulated GPUs).

use anyhow::Context;
use narrator_hardware::{
    Calibration, Catalog, DeviceSpec, Plan, PlanLimits, RuntimeFacts, Severity, diagnose,
};

use crate::cluster::fleet;

use crate::cli::{DoctorArgs, PlanArgs};
use crate::engine::{self, Planning};
use crate::paths::Paths;

/// `narrator doctor`: the profile and the checklist; exit status 1 when a check failed
/// with severity error.
pub(crate) fn doctor(global: &crate::cli::Global, args: DoctorArgs) -> anyhow::Result<()> {
    let profile = narrator_hardware::probe();
    // The runtime is optional here: doctor must work on a machine that is not set up.
    let runtime = crate::paths::resolve(global)
        .ok()
        .and_then(|p| runtime_facts(&p));
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

/// What doctor checks: the CUDA build a GPU worker would load (read from its files,
/// not loaded, with every needed library resolved), else the CPU build, loaded.
fn runtime_facts(paths: &Paths) -> Option<RuntimeFacts> {
    let gpu_lib = narrator_pipeline::load::cuda_library(paths).ok().flatten();
    let cuda_dir = gpu_lib.as_deref().and_then(std::path::Path::parent);
    if let (Some(lib), Some(dir)) = (&gpu_lib, cuda_dir) {
        let build = match narrator_pipeline::load::inspect(paths, dir) {
            Ok(b) => Some(b),
            Err(e) => {
                println!("CUDA build at {}: {e:#}", dir.display());
                None
            }
        };
        return Some(RuntimeFacts {
            library: lib.display().to_string(),
            version: narrator_hardware::doctor::version_from_library_path(lib),
            cuda_provider: true,
            cuda_major: build.as_ref().and_then(|b| b.cuda_major),
            cuda_build: build,
        });
    }
    let lib = paths
        .explicit_onnxruntime
        .clone()
        .unwrap_or_else(|| paths.onnxruntime.clone());
    let rt = narrator_engine::load_runtime(&lib).ok()?;
    Some(RuntimeFacts {
        library: rt.library.display().to_string(),
        version: narrator_hardware::doctor::version_from_library_path(&rt.library),
        cuda_provider: rt.cuda_available,
        cuda_major: None,
        cuda_build: None,
    })
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
pub(crate) async fn plan(global: &crate::cli::Global, args: PlanArgs) -> anyhow::Result<()> {
    let simulated: Vec<DeviceSpec> = args
        .simulate_gpu
        .iter()
        .map(|s| parse_simulated(s))
        .collect::<anyhow::Result<_>>()?;
    let limits = PlanLimits::default();
    // Calibrations by GPU model: shipped, then files, then the fleet's (the later wins).
    let mut catalog = Catalog::shipped()?;
    for f in &args.calibration {
        catalog.add_file(f)?;
    }
    let db = match &args.database_url {
        Some(url) => Some(fleet::connect(url).await?),
        None => None,
    };
    if let Some(db) = &db {
        fleet::load_into(db, &mut catalog).await?;
    }
    let calibration: Calibration = match args.bytes_per_token {
        Some(b) if b > 0.0 && b.is_finite() => {
            Calibration::supplied(&args.engine.voice.name, b, engine::ITEM_TOKENS)
        }
        Some(b) => anyhow::bail!("--bytes-per-token {b}: give a positive number of bytes"),
        None => {
            let paths = crate::paths::resolve(global)?;
            let voice = engine::find_voice(&paths, &args.engine)?;
            let planning = match args.engine.calibrate.as_deref() {
                Some(p) => p.parse()?,
                None => Planning::Calibrate,
            };
            let loaded = engine::load(
                &paths,
                &engine::options(&args.engine),
                voice,
                planning,
                &catalog,
            )?;
            let mut v = loaded.plan_json();
            if let (Some(o), Some(c)) = (v.as_object_mut(), &loaded.calibration) {
                o.insert("calibration_full".into(), serde_json::to_value(c)?);
            }
            print_plan_with("this machine", &loaded.plan, v, args.json)?;
            let c = loaded
                .calibration
                .context("no calibration was measured or cached; run without --calibrate cached")?;
            if let Some(db) = &db {
                fleet::share(db, &c, &crate::host_name()).await?;
            }
            if !args.json {
                println!(
                    "  calibration ({}, {:.1} s): {:.2} MiB per padded token, {:.0} MiB fixed",
                    c.source,
                    c.seconds,
                    c.bytes_per_token / 1048576.0,
                    c.fixed_bytes as f64 / 1048576.0
                );
                for l in &c.layouts {
                    let memory = l
                        .memory_bytes
                        .map(|b| format!(", {:.0} MiB at its peak", b as f64 / 1048576.0))
                        .unwrap_or_default();
                    let graph = l
                        .graph
                        .as_deref()
                        .map(|g| format!(", graph {g}"))
                        .unwrap_or_default();
                    println!(
                        "    layout {} session(s) × {} thread(s){graph}: {:.1}x realtime (batch 1, all sessions busy){memory}",
                        l.sessions, l.intra_threads, l.throughput
                    );
                }
                if !c.layout_reason.is_empty() {
                    println!("    layout chosen: {}", c.layout_reason);
                }
                if !c.graph_reason.is_empty() {
                    println!(
                        "    graph chosen: {} ({})",
                        c.graph.as_deref().unwrap_or("the default"),
                        c.graph_reason
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
    let runtime = calibration.runtime.clone();
    for d in &simulated {
        let p = catalog.plan(d, &args.engine.voice.name, &runtime, &calibration, &limits);
        let label = match catalog.find(&args.engine.voice.name, &d.model(), &runtime) {
            Some(_) => format!("simulated {}", d.model()),
            None => format!(
                "simulated {} ({} bytes/token from {})",
                d.model(),
                calibration.bytes_per_token.round(),
                calibration.source
            ),
        };
        print_plan(&label, &p, args.json)?;
    }
    Ok(())
}
