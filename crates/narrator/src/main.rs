//! The `narrator` command: wiring of the crates, one clear line per error.

mod bench;
mod cli;
#[cfg(feature = "fleet")]
mod cluster;
/// The seams of the distributed mode that `plan` and `bench` reach, in a build without it.
#[cfg(not(feature = "fleet"))]
#[path = "cluster/lean.rs"]
mod cluster;
mod engine;
mod hardware;
mod paths;
mod progress;
mod run;
#[cfg(feature = "serve")]
mod serve;
mod voices;

use clap::Parser;

use std::io::Write;

use crate::cli::{Cli, Command, VoicesAction, VoicesArgs};
use crate::paths::Paths;

/// Logs, and traces when asked for (`--otlp` or `OTEL_TRACES_EXPORTER=otlp`, unless
/// `OTEL_SDK_DISABLED=true`). Runs inside the runtime: the exporter sends from a task.
fn init_telemetry(cli: &Cli) -> anyhow::Result<narrator_telemetry::Telemetry> {
    let env_on = std::env::var("OTEL_TRACES_EXPORTER").is_ok_and(|v| v.trim() == "otlp");
    let disabled = std::env::var("OTEL_SDK_DISABLED").is_ok_and(|v| v.trim() == "true");
    let (service, instance) = match &cli.command {
        Command::Worker(w) => ("narrator-worker", w.id.clone()),
        Command::Submit(_) => ("narrator-submit", None),
        _ => ("narrator", None),
    };
    Ok(narrator_telemetry::init(&narrator_telemetry::Options {
        log: cli.global.log.clone(),
        log_format: cli.global.log_format,
        traces: (cli.global.otlp || env_on) && !disabled,
        service: service.to_string(),
        instance,
    })?)
}

fn voices(paths: &Paths, args: VoicesArgs) -> anyhow::Result<()> {
    match args.action {
        Some(VoicesAction::Install { source, force }) => {
            let names = voices::install(paths, &source, force)?;
            if let Ok(kind) = source.parse::<narrator_engine::FamilyKind>() {
                println!(
                    "{kind} voices ready in {}: {} (`narrator voices` lists them)",
                    narrator_engine::installation(&paths.voices, kind).display(),
                    names.join(", ")
                );
            } else {
                for name in names {
                    println!("installed voice {name} in {}", paths.voices.display());
                }
            }
            return Ok(());
        }
        Some(VoicesAction::Remove { name }) => {
            voices::remove(paths, &name)?;
            println!("removed voice {name} from {}", paths.voices.display());
            return Ok(());
        }
        None => {}
    }
    if !paths.voices.is_dir() {
        println!(
            "no voices in {} (run `bash ops/setup.sh`)",
            paths.voices.display()
        );
        return Ok(());
    }
    let list = narrator_engine::list_voices(&paths.voices)?;
    if args.json {
        let v: Vec<_> = list
            .iter()
            .map(|v| {
                let i = v.info();
                serde_json::json!({
                    "name": v.name, "family": i.family, "language": i.language,
                    "gender": i.gender, "sample_rate": i.sample_rate,
                    "quality": i.quality, "path": v.model_path(),
                })
            })
            .collect();
        println!("{}", serde_json::Value::Array(v));
    } else if list.is_empty() {
        println!(
            "no voices in {} (run `bash ops/setup.sh`)",
            paths.voices.display()
        );
    } else {
        // Written line by line to a locked stdout: a reader that stops early (`| head`)
        // ends the listing, not the process with a panic.
        let mut out = std::io::stdout().lock();
        let table = |out: &mut std::io::StdoutLock<'_>| -> std::io::Result<()> {
            writeln!(
                out,
                "{:<20} {:<7} {:<8} {:<7} {:>6}  {:<8} PATH",
                "NAME", "FAMILY", "LANGUAGE", "GENDER", "RATE", "QUALITY"
            )?;
            for v in &list {
                let i = v.info();
                let dash = |s: &str| {
                    if s.is_empty() {
                        "-".to_string()
                    } else {
                        s.to_string()
                    }
                };
                writeln!(
                    out,
                    "{:<20} {:<7} {:<8} {:<7} {:>6}  {:<8} {}",
                    v.name,
                    i.family,
                    i.language,
                    dash(&i.gender),
                    i.sample_rate,
                    dash(&i.quality),
                    v.model_path().display()
                )?;
            }
            Ok(())
        };
        match table(&mut out) {
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
            other => other?,
        }
    }
    Ok(())
}

async fn dispatch(cli: Cli) -> anyhow::Result<()> {
    // Only the commands that phonemize or synthesize need the data folder.
    let paths = || crate::paths::resolve(&cli.global);
    match cli.command {
        Command::Run(a) => run::run(&paths()?, a).await,
        Command::Synth(a) => run::synth(&paths()?, a).await,
        #[cfg(feature = "serve")]
        Command::Serve(a) => serve::serve(&paths()?, a, shutdown_signal()).await,
        #[cfg(not(feature = "serve"))]
        Command::Serve(_) => Err(anyhow::anyhow!(
            "this narrator was built without `narrator serve`; build it with its default features"
        )),
        Command::Voices(a) => voices(&paths()?, a),
        #[cfg(feature = "fleet")]
        Command::Submit(a) if a.via_broker => cluster::via_broker::submit(a).await,
        #[cfg(feature = "fleet")]
        Command::Submit(a) => cluster::submit::submit(&paths()?, a).await,
        #[cfg(feature = "fleet")]
        Command::Worker(a) => cluster::worker::worker(&paths()?, a).await,
        #[cfg(feature = "fleet")]
        Command::Status(a) => cluster::admin::status(a).await,
        #[cfg(feature = "fleet")]
        Command::Jobs(a) => cluster::admin::jobs(a).await,
        #[cfg(feature = "fleet")]
        Command::Workers(a) => cluster::admin::workers(a).await,
        #[cfg(feature = "fleet")]
        Command::Cancel(a) => cluster::admin::cancel(a).await,
        #[cfg(feature = "fleet")]
        Command::Retry(a) => cluster::admin::retry(a).await,
        #[cfg(feature = "fleet")]
        Command::Migrate(a) => cluster::admin::migrate(a).await,
        #[cfg(not(feature = "fleet"))]
        Command::Submit(_)
        | Command::Worker(_)
        | Command::Status(_)
        | Command::Jobs(_)
        | Command::Workers(_)
        | Command::Cancel(_)
        | Command::Retry(_)
        | Command::Migrate(_) => Err(cluster::left_out("the distributed mode")),
        Command::Doctor(a) => hardware::doctor(&cli.global, a),
        Command::Plan(a) => hardware::plan(&cli.global, a).await,
        Command::Bench(a) => bench::bench(&cli.global, a).await,
    }
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}

/// glibc raises its mmap threshold to the size of each large block freed (up to 32 MiB);
/// from then on, blocks of a few MiB (segment audio, ONNX Runtime arena regions given
/// back) come from the heap and stay with the process when freed, so a worker's RSS rises
/// in steps over a book. Setting the threshold turns that adjustment off: blocks of
/// 256 KiB and more are mapped and go back to the system when freed. A
/// `MALLOC_MMAP_THRESHOLD_` in the environment is left to win.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
fn fix_malloc_mmap_threshold() {
    if std::env::var_os("MALLOC_MMAP_THRESHOLD_").is_none() {
        // SAFETY: mallopt only sets an allocator parameter; no other thread runs yet.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, 256 * 1024);
        }
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn fix_malloc_mmap_threshold() {}

/// `NAME_FILE` variables (Docker and Kubernetes secrets mounted as files) become `NAME`
/// before the flags are read, for the variables in [`narrator_net::FILE_SECRETS`].
#[allow(unsafe_code)]
fn read_file_secrets() -> Result<(), narrator_net::SecretError> {
    let found = narrator_net::file_secrets(narrator_net::FILE_SECRETS, |k| std::env::var(k).ok())?;
    for (name, value) in found {
        // SAFETY: called first in `main`, before any other thread (runtime, logger) exists.
        unsafe { std::env::set_var(name, value) };
    }
    Ok(())
}

fn main() -> std::process::ExitCode {
    fix_malloc_mmap_threshold();
    if let Err(e) = read_file_secrets() {
        eprintln!("error: {e}");
        return std::process::ExitCode::from(2);
    }
    let cli = Cli::parse();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let telemetry = match rt.block_on(async { init_telemetry(&cli) }) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("error: {}", one_line(&e));
            return std::process::ExitCode::FAILURE;
        }
    };
    // The worker handles its own signals (it drains its batches in flight).
    let handles_signals = matches!(cli.command, Command::Worker(_));
    let result = rt.block_on(async {
        if handles_signals {
            return Some(dispatch(cli).await);
        }
        tokio::select! {
            r = dispatch(cli) => Some(r),
            _ = shutdown_signal() => None,
        }
    });
    // Spans still buffered (a short `submit`) are exported while the runtime runs.
    telemetry.shutdown();
    // Engine threads may be mid-run; finished segments are already safe on disk.
    rt.shutdown_background();
    match result {
        Some(Ok(())) => std::process::ExitCode::SUCCESS,
        Some(Err(e)) => {
            eprintln!("error: {}", one_line(&e));
            std::process::ExitCode::FAILURE
        }
        None => {
            eprintln!(
                "interrupted: finished segments are saved; run the same command again to resume"
            );
            std::process::ExitCode::from(130)
        }
    }
}

/// This machine's name: the workers table, segment figures, shared calibrations.
pub(crate) fn host_name() -> String {
    std::fs::read_to_string("/etc/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

/// The error and its causes on one line, without repeating a cause the message already shows.
pub(crate) fn one_line(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let s = cause.to_string();
        if out.contains(&s) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&s);
    }
    out.replace('\n', " ")
}
