//! `narrator bench`: the field guide's performance table for this machine (single RTF,
//! batched RTF, maximum stable concurrency), with the batch sweep and the concurrency
//! levels behind it, an optional plot, and the fleet's table from Postgres.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, bail};
use narrator_hardware::HardwareProfile;
use narrator_pipeline::{BenchFigures, BenchOptions};

use crate::cli::BenchArgs;
use crate::cluster::fleet;
use crate::engine::{self, Planning};

/// Largest batch of the default sweep on CPU, whatever the plan (so the knee shows).
const CPU_SWEEP_TO: usize = 8;

/// Fewest timed runs or requests per measurement point.
const MIN_SAMPLES: usize = 5;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PlotKind {
    Svg,
    Png,
}

fn plot_kind(path: &Path) -> anyhow::Result<PlotKind> {
    match path
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase)
        .as_deref()
    {
        Some("svg") => Ok(PlotKind::Svg),
        Some("png") => Ok(PlotKind::Png),
        _ => bail!(
            "--plot {}: the file name must end in .svg or .png",
            path.display()
        ),
    }
}

/// Checks the flags before anything heavy is loaded.
fn validate(args: &BenchArgs) -> anyhow::Result<Option<PlotKind>> {
    if !(args.seconds.is_finite() && args.seconds > 0.0 && args.seconds <= 600.0) {
        bail!(
            "--seconds {}: give the time per measurement point, more than 0 and at most 600",
            args.seconds
        );
    }
    if !(args.latency_target.is_finite() && args.latency_target > 0.0) {
        bail!(
            "--latency-target {}: give a positive number of seconds, e.g. 2",
            args.latency_target
        );
    }
    if args.batches.contains(&0) {
        bail!("--batches: batch sizes start at 1, e.g. --batches 1,2,4,8");
    }
    if args.max_concurrency == 0 {
        bail!("--max-concurrency: at least 1");
    }
    let kind = args.plot.as_deref().map(plot_kind).transpose()?;
    if let Some(p) = &args.plot
        && let Some(dir) = p.parent().filter(|d| !d.as_os_str().is_empty())
        && !dir.is_dir()
    {
        bail!(
            "--plot {}: folder {} does not exist",
            p.display(),
            dir.display()
        );
    }
    Ok(kind)
}

/// The default sweep: 1, 2, 4, … up to the plan's batch (on CPU at least up to 8, since
/// memory is not the limit there), plus the plan's batch itself.
pub(crate) fn default_batches(plan_batch: usize, on_gpu: bool, batching: bool) -> Vec<usize> {
    if !batching {
        return vec![1];
    }
    let top = if on_gpu {
        plan_batch.max(1)
    } else {
        plan_batch.max(CPU_SWEEP_TO)
    };
    let mut v: Vec<usize> = std::iter::successors(Some(1usize), |b| Some(b * 2))
        .take_while(|b| *b <= top)
        .collect();
    v.push(plan_batch.max(1));
    v.sort_unstable();
    v.dedup();
    v
}

/// The hardware as one table cell: the GPU for a GPU run, else the CPU.
pub(crate) fn hardware_label(profile: &HardwareProfile, device: &str) -> String {
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    if let Some(i) = device
        .strip_prefix("cuda:")
        .and_then(|i| i.parse::<u32>().ok())
        && let Some(g) = profile.gpus.iter().find(|g| g.index == i)
    {
        return format!("{} ({:.0} GiB)", g.name, gib(g.memory_total_bytes));
    }
    format!(
        "{} ({} cores, {:.0} GiB RAM)",
        profile.cpu.model.trim(),
        profile.cpu.usable_cores,
        gib(profile.memory.total_bytes)
    )
}

/// One sentence under the table: what the plan is and where the throughput peaks.
fn note(f: &BenchFigures, plan: &serde_json::Value) -> String {
    let best = f
        .batch_sweep
        .iter()
        .max_by(|a, b| a.throughput.total_cmp(&b.throughput));
    let sessions = plan["sessions"].as_u64().unwrap_or(1);
    let mut s = format!(
        "plan: batch {} × {} session(s)",
        plan["max_batch_requests"].as_u64().unwrap_or(1),
        sessions
    );
    if let Some(b) = best {
        s.push_str(&format!(
            "; best throughput at batch {} ({:.1}x realtime)",
            b.batch, b.throughput
        ));
    }
    s.push_str(&format!("; {:.1} s utterance", f.utterance_seconds));
    s
}

/// Where a bench result was measured (stored with it).
#[cfg_attr(not(feature = "fleet"), allow(dead_code))] // nothing stores it then
pub(crate) struct Measured<'a> {
    pub(crate) host: &'a str,
    pub(crate) hardware: String,
    pub(crate) device: String,
    pub(crate) voice: &'a str,
}

/// `narrator bench`.
pub(crate) async fn bench(global: &crate::cli::Global, args: BenchArgs) -> anyhow::Result<()> {
    if args.fleet {
        return fleet::print_bench_table(args.database_url.as_deref(), args.json).await;
    }
    let plot = validate(&args)?;
    let paths = crate::paths::resolve(global)?;
    let voice = engine::find_voice(&paths, &args.engine)?;
    let planning = match args.engine.calibrate.as_deref() {
        Some(p) => p.parse()?,
        None => Planning::Calibrate,
    };
    // Connect first: a wrong URL fails before minutes of measuring.
    let db = match (&args.database_url, args.no_store) {
        (Some(url), false) => Some(fleet::bench_store(url).await?),
        _ => None,
    };
    let loaded = engine::load(
        &paths,
        &engine::options(&args.engine),
        voice,
        planning,
        &Default::default(),
    )?;
    let plan = loaded.plan_json();
    let (profile, runtime) = (loaded.profile, loaded.runtime);
    let synth = Arc::new(loaded.synth);
    let device = synth.pool().device();
    let on_gpu = matches!(device, narrator_engine::Device::Cuda(_));
    let plan_batch = synth.budget().max_requests.max(1);
    let batches = if args.batches.is_empty() {
        default_batches(plan_batch, on_gpu, synth.pool().supports_batching())
    } else {
        args.batches.clone()
    };
    let opts = BenchOptions {
        seconds: args.seconds,
        min_samples: MIN_SAMPLES,
        batches,
        plan_batch,
        latency_target: args.latency_target,
        max_concurrency: args.max_concurrency,
    };
    eprintln!(
        "benchmarking {} on {device}: single requests, batches {:?}, then concurrency up to p95 {} s ({} s per point)",
        args.engine.voice.name, opts.batches, opts.latency_target, opts.seconds
    );
    let figures = narrator_pipeline::bench(synth.clone(), &opts)
        .await
        .context("benchmark")?;
    // The profile and runtime version from loading: probing again would sleep for the
    // swap sample a second time.
    let profile = profile.unwrap_or_else(narrator_hardware::probe);
    let hardware = hardware_label(&profile, &device.to_string());
    let mut report = serde_json::to_value(&figures)?;
    if let Some(o) = report.as_object_mut() {
        o.insert("device".into(), device.to_string().into());
        o.insert("hardware".into(), hardware.clone().into());
        o.insert("host".into(), profile.host.clone().into());
        o.insert("voice".into(), args.engine.voice.name.clone().into());
        o.insert("runtime".into(), runtime.clone().into());
        o.insert("note".into(), note(&figures, &plan).into());
        o.insert("plan".into(), plan.clone());
        o.insert("profile".into(), serde_json::to_value(&profile)?);
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", render(&report, &figures, &profile));
    }
    if let (Some(path), Some(kind)) = (&args.plot, plot) {
        draw(
            path,
            kind,
            &figures,
            &format!("{} — {}", hardware, args.engine.voice.name),
        )?;
        eprintln!("plot written to {}", path.display());
    }
    if let Some(db) = db {
        let measured = Measured {
            host: &profile.host,
            hardware,
            device: device.to_string(),
            voice: &args.engine.voice.name,
        };
        fleet::record_bench(&db, measured, &figures, report).await?;
    }
    Ok(())
}

fn render(report: &serde_json::Value, f: &BenchFigures, profile: &HardwareProfile) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    let _ = writeln!(
        s,
        "narrator bench: {} on {} | host {} | CPU {} ({} usable cores), RAM {:.1} GiB | ONNX Runtime {}",
        report["voice"].as_str().unwrap_or("?"),
        report["device"].as_str().unwrap_or("?"),
        profile.host,
        profile.cpu.model.trim(),
        profile.cpu.usable_cores,
        gib(profile.memory.total_bytes),
        report["runtime"].as_str().unwrap_or("unknown"),
    );
    for g in &profile.gpus {
        let _ = writeln!(
            s,
            "GPU {}: {} ({:.1} GiB, {:.1} GiB free)",
            g.index,
            g.name,
            gib(g.memory_total_bytes),
            gib(g.memory_free_bytes)
        );
    }
    let _ = writeln!(s);
    let _ = writeln!(
        s,
        "| hardware | single RTF | batched RTF | max stable concurrency (p95 ≤ {} s) | note |",
        f.latency_target_seconds
    );
    let _ = writeln!(s, "|---|---|---|---|---|");
    let _ = writeln!(
        s,
        "| {} | {:.3} | {:.3} (batch {}) | {} | {} |",
        report["hardware"].as_str().unwrap_or("?"),
        f.rtf_single,
        f.rtf_batched,
        f.batched_at,
        f.max_stable_concurrency,
        report["note"].as_str().unwrap_or("")
    );
    let _ = writeln!(
        s,
        "\nbatch sweep (sentences per engine run, neighbours by length):"
    );
    let _ = writeln!(
        s,
        "| batch | RTF | x realtime | p50 s | p95 s | runs | padding |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|");
    for p in &f.batch_sweep {
        let halved = if p.largest_run < p.batch {
            format!(" (ran {} after out of memory)", p.largest_run)
        } else {
            String::new()
        };
        let _ = writeln!(
            s,
            "| {}{} | {:.3} | {:.1} | {:.3} | {:.3} | {} | {:.0} % |",
            p.batch,
            halved,
            p.rtf,
            p.throughput,
            p.p50_seconds,
            p.p95_seconds,
            p.runs,
            p.padding * 100.0
        );
    }
    let _ = writeln!(
        s,
        "\nconcurrency ({:.1} s utterance per request, in the order measured):",
        f.utterance_seconds
    );
    let _ = writeln!(
        s,
        "| clients | p50 s | p95 s | x realtime | requests | within target |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|");
    for p in &f.concurrency {
        let _ = writeln!(
            s,
            "| {} | {:.3} | {:.3} | {:.1} | {} | {} |",
            p.concurrency,
            p.p50_seconds,
            p.p95_seconds,
            p.throughput,
            p.requests,
            if p.p95_seconds <= f.latency_target_seconds {
                "yes"
            } else {
                "no"
            }
        );
    }
    let _ = writeln!(s, "\n({:.1} s in all)", f.seconds);
    s
}

/// A TrueType font for the plot's text: `NARRATOR_PLOT_FONT`, else DejaVu Sans or
/// Liberation Sans where Debian and most distributions put them.
fn plot_font() -> anyhow::Result<&'static [u8]> {
    let candidates: Vec<PathBuf> = match std::env::var_os("NARRATOR_PLOT_FONT") {
        Some(p) => vec![PathBuf::from(p)],
        None => [
            "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
            "/usr/share/fonts/TTF/DejaVuSans.ttf",
            "/usr/share/fonts/dejavu/DejaVuSans.ttf",
            "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
        ]
        .iter()
        .map(PathBuf::from)
        .collect(),
    };
    for c in &candidates {
        if let Ok(bytes) = std::fs::read(c) {
            return Ok(Box::leak(bytes.into_boxed_slice()));
        }
    }
    bail!(
        "--plot needs a TrueType font for its labels and found none at {}: install one \
         (Debian: apt-get install fonts-dejavu-core) or set NARRATOR_PLOT_FONT=/path/to/font.ttf",
        candidates
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    )
}

/// Throughput and p95 latency against batch size (top) and concurrency (bottom).
fn draw(path: &Path, kind: PlotKind, f: &BenchFigures, title: &str) -> anyhow::Result<()> {
    use plotters::prelude::*;
    static FONT: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    FONT.get_or_init(|| {
        let bytes = plot_font().map_err(|e| e.to_string())?;
        plotters::style::register_font("sans-serif", FontStyle::Normal, bytes)
            .map_err(|_| "the plot font is not a usable TrueType font".to_string())
    })
    .clone()
    .map_err(anyhow::Error::msg)?;
    let size = (1200, 900);
    let result = match kind {
        PlotKind::Svg => charts(&SVGBackend::new(path, size).into_drawing_area(), f, title),
        PlotKind::Png => charts(
            &BitMapBackend::new(path, size).into_drawing_area(),
            f,
            title,
        ),
    };
    result.with_context(|| format!("drawing {}", path.display()))
}

fn charts<DB: plotters::prelude::DrawingBackend>(
    root: &plotters::prelude::DrawingArea<DB, plotters::coord::Shift>,
    f: &BenchFigures,
    title: &str,
) -> anyhow::Result<()>
where
    DB::ErrorType: 'static,
{
    use plotters::prelude::*;
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow::anyhow!("{e:?}");
    root.fill(&WHITE).map_err(err)?;
    let root = root.titled(title, ("sans-serif", 24)).map_err(err)?;
    let panels = root.split_evenly((2, 2));
    let sweep_x: Vec<f64> = f.batch_sweep.iter().map(|p| p.batch as f64).collect();
    let mut levels = f.concurrency.clone();
    levels.sort_by_key(|p| p.concurrency);
    let conc_x: Vec<f64> = levels.iter().map(|p| p.concurrency as f64).collect();
    let series = [
        (
            "throughput vs batch size",
            "batch (sentences per run)",
            "x realtime",
            sweep_x.clone(),
            f.batch_sweep
                .iter()
                .map(|p| p.throughput)
                .collect::<Vec<_>>(),
            None,
        ),
        (
            "p95 batch latency vs batch size",
            "batch (sentences per run)",
            "seconds",
            sweep_x,
            f.batch_sweep.iter().map(|p| p.p95_seconds).collect(),
            None,
        ),
        (
            "throughput vs concurrency",
            "clients",
            "x realtime",
            conc_x.clone(),
            levels.iter().map(|p| p.throughput).collect(),
            None,
        ),
        (
            "p95 request latency vs concurrency",
            "clients",
            "seconds",
            conc_x,
            levels.iter().map(|p| p.p95_seconds).collect(),
            Some(f.latency_target_seconds),
        ),
    ];
    for (area, (caption, xl, yl, xs, ys, target)) in panels.iter().zip(series) {
        let x_max = xs.iter().copied().fold(1.0, f64::max) * 1.05 + 0.5;
        let y_max = ys
            .iter()
            .copied()
            .chain(target)
            .fold(f64::MIN_POSITIVE, f64::max)
            * 1.15;
        let mut chart = ChartBuilder::on(area)
            .caption(caption, ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(0.0..x_max, 0.0..y_max)
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc(xl)
            .y_desc(yl)
            .label_style(("sans-serif", 13))
            .draw()
            .map_err(err)?;
        let pts: Vec<(f64, f64)> = xs.iter().copied().zip(ys).collect();
        chart
            .draw_series(LineSeries::new(pts.clone(), BLUE.stroke_width(2)))
            .map_err(err)?;
        chart
            .draw_series(pts.iter().map(|&p| Circle::new(p, 4, BLUE.filled())))
            .map_err(err)?;
        if let Some(t) = target {
            chart
                .draw_series(LineSeries::new([(0.0, t), (x_max, t)], RED.stroke_width(1)))
                .map_err(err)?
                .label(format!("p95 target {t} s"))
                .legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], RED));
            chart
                .configure_series_labels()
                .label_font(("sans-serif", 13))
                .border_style(BLACK)
                .draw()
                .map_err(err)?;
        }
    }
    root.present().map_err(err)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_sweep_reaches_the_plan_and_eight_on_cpu() {
        assert_eq!(default_batches(1, false, true), [1, 2, 4, 8]);
        assert_eq!(default_batches(12, false, true), [1, 2, 4, 8, 12]);
        assert_eq!(default_batches(16, true, true), [1, 2, 4, 8, 16]);
        assert_eq!(default_batches(24, true, true), [1, 2, 4, 8, 16, 24]);
        assert_eq!(default_batches(1, true, true), [1]);
        assert_eq!(default_batches(8, false, false), [1]);
    }

    #[test]
    fn plot_files_are_svg_or_png() {
        assert_eq!(plot_kind(Path::new("a.svg")).ok(), Some(PlotKind::Svg));
        assert_eq!(plot_kind(Path::new("b/c.PNG")).ok(), Some(PlotKind::Png));
        let e = plot_kind(Path::new("x.gif")).err().map(|e| e.to_string());
        assert!(e.is_some_and(|e| e.contains(".svg or .png")));
        assert!(plot_kind(Path::new("noext")).is_err());
    }
}
