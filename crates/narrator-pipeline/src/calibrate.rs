//! Calibration: growing batches of sentence-sized items on the loaded engine, measuring
//! wall time, audio made and memory per batch, until throughput stops improving, memory
//! would run out, or the time budget is spent. The result fits `memory ≈ fixed +
//! bytes_per_token × padded tokens` and feeds [`narrator_hardware::plan`].

use std::time::{Duration, Instant};

use narrator_core::Segment;
use narrator_hardware::{Calibration, CalibrationPoint};

use crate::{PipelineError, Synthesizer};

/// A paragraph whose sentences are cut into calibration items.
const TEXT: &str = "The old lighthouse keeper climbed the spiral stairs every evening, \
counting the steps as his father had done before him, and when he reached the lamp room \
he wiped the great lens until it shone like still water under a winter moon.";

/// How calibration runs.
pub struct CalibrateOptions<'a> {
    /// Voice name (recorded).
    pub voice: String,
    /// Device model (recorded; plans use a knee only on the same model).
    pub device_model: String,
    /// Runtime version (recorded; part of the cache key).
    pub runtime: String,
    /// Padded length of each item (a sentence is about 100–150 ids).
    pub item_tokens: usize,
    /// Largest batch tried.
    pub max_batch: usize,
    /// Time budget for the whole measurement.
    pub max_duration: Duration,
    /// Stop growing once a doubling improves throughput by less than this.
    pub knee_gain: f64,
    /// Memory the batches may use (free memory after the safety margin).
    pub memory_limit: u64,
    /// Memory in use on the device now (NVML used memory, or this process's peak RSS
    /// after `reset` was called).
    pub memory_now: &'a dyn Fn() -> Option<u64>,
    /// Called before each batch (resets the peak RSS on CPU).
    pub reset: &'a dyn Fn(),
    /// Intra-op threads and sessions of the engine being measured (recorded).
    pub intra_threads: usize,
    /// Sessions (recorded).
    pub sessions: usize,
}

/// Items of exactly `tokens` ids, cut from the voice's own phonemes of [`TEXT`].
pub fn calibration_items(synth: &Synthesizer, tokens: usize) -> Result<Vec<i64>, PipelineError> {
    let seg = Segment {
        index: 0,
        chapter: 0,
        text: TEXT.to_string(),
        pause_after: narrator_core::PauseAfter::Paragraph,
        speaker: 0,
        speed: None,
        timed: false,
    };
    let p = synth.prepare(seg)?;
    let ids: Vec<i64> = p.utterances.concat();
    if ids.is_empty() {
        return Err(PipelineError::Internal("calibration text made no phonemes"));
    }
    Ok(ids.iter().copied().cycle().take(tokens.max(4)).collect())
}

/// Runs the calibration (blocking: call from a blocking thread).
pub fn calibrate(
    synth: &Synthesizer,
    opts: &CalibrateOptions<'_>,
) -> Result<Calibration, PipelineError> {
    let item = calibration_items(synth, opts.item_tokens)?;
    let pool = synth.pool();
    let scales = synth.scales();
    let rate = f64::from(synth.sample_rate());
    let started = Instant::now();
    // One run first: session initialisation and first-use allocations are not a batch's.
    pool.synthesize_blocking(vec![item.clone()], scales)?;
    (opts.reset)();
    let base = (opts.memory_now)().unwrap_or(0);
    let mut points: Vec<CalibrationPoint> = Vec::new();
    // Every timed run per batch size: a size is timed again beside its successor, so each
    // comparison is between runs taken in alternation, not minutes apart on a noisy host.
    let mut times: Vec<Vec<f64>> = Vec::new();
    let run = |n: usize| -> Result<f64, PipelineError> {
        let t = Instant::now();
        pool.synthesize_blocking(vec![item.clone(); n], scales)?;
        Ok(t.elapsed().as_secs_f64())
    };
    let mut batch = 1;
    while batch <= opts.max_batch.max(1) {
        if let Some(last) = points.last() {
            // Next: a warm-up and three runs of twice the last batch, three more of it.
            let next = last.max_seconds * (2.0 * 4.0 + 3.0);
            if started.elapsed() + Duration::from_secs_f64(next) > opts.max_duration {
                break;
            }
            let (fixed, bpt) = Calibration::fit(&points);
            let need = fixed as f64 + bpt * (batch * opts.item_tokens) as f64;
            if bpt > 0.0 && need > opts.memory_limit as f64 {
                break;
            }
        }
        (opts.reset)();
        // A warm-up run at this shape (allocations, kernel selection), then three timed
        // runs, alternating with the previous size when there is one.
        let warm = pool.synthesize_blocking(vec![item.clone(); batch], scales)?;
        let memory = (opts.memory_now)().unwrap_or(base).saturating_sub(base);
        let mut mine = Vec::new();
        for _ in 0..3 {
            if let Some(prev) = times.last_mut() {
                prev.push(run(batch / 2)?);
            }
            mine.push(run(batch)?);
        }
        times.push(mine);
        let audio_seconds = warm.audio.iter().map(|w| w.len() as f64).sum::<f64>() / rate;
        points.push(CalibrationPoint {
            batch,
            tokens: batch * item.len(),
            memory_bytes: memory,
            seconds: 0.0,
            max_seconds: 0.0,
            audio_seconds,
        });
        for (p, t) in points.iter_mut().zip(&times) {
            let mut t = t.clone();
            t.sort_by(f64::total_cmp);
            p.seconds = t[t.len() / 2];
            p.max_seconds = t[t.len() - 1];
        }
        let n = points.len();
        let (new, flat) = match n {
            1 => (&points[0], false),
            _ => (
                &points[n - 1],
                !points[n - 1].beats(&points[n - 2], opts.knee_gain),
            ),
        };
        tracing::info!(
            batch,
            seconds = new.seconds,
            throughput = new.throughput(),
            memory_mib = memory / (1 << 20),
            "calibration point"
        );
        if flat || !pool.supports_batching() {
            break;
        }
        batch *= 2;
    }
    let (fixed_bytes, bytes_per_token) = Calibration::fit(&points);
    Ok(Calibration {
        voice: opts.voice.clone(),
        device_model: opts.device_model.clone(),
        runtime: opts.runtime.clone(),
        item_tokens: item.len(),
        fixed_bytes,
        bytes_per_token,
        intra_threads: opts.intra_threads,
        sessions: opts.sessions,
        points,
        source: narrator_hardware::CalibrationSource::Measured,
        layouts: Vec::new(),
        layout_reason: String::new(),
        graph: None,
        graph_reason: String::new(),
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// Runs one batch at the full budget (items of the calibration's length), so a plan too
/// large for the device fails at start, not in the middle of a book. Out of memory halves
/// the budget and tries again (at most 6 times); returns the seconds of the last run.
/// Then one utterance of `longest` ids, the longest the phonemizer hands the engine (it
/// runs alone whatever the budget): ONNX Runtime's arena grows to the largest shape it has
/// seen and keeps it, so this makes memory grow at start rather than hours into a book.
pub fn warm_up(
    synth: &Synthesizer,
    item_tokens: usize,
    longest: usize,
) -> Result<f64, PipelineError> {
    let seconds = warm_up_budget(synth, item_tokens)?;
    let item = calibration_items(synth, longest)?;
    match synth.pool().synthesize_blocking(vec![item], synth.scales()) {
        Ok(_) => {}
        // The batches' own out-of-memory handling (halve, fall back) takes over there.
        Err(e @ narrator_engine::EngineError::OutOfMemory { .. }) => {
            tracing::warn!(error = %e, longest, "the longest utterance alone ran out of memory at warm-up");
        }
        Err(e) => return Err(e.into()),
    }
    Ok(seconds)
}

fn warm_up_budget(synth: &Synthesizer, item_tokens: usize) -> Result<f64, PipelineError> {
    for _ in 0..6 {
        let budget = synth.budget();
        let item = calibration_items(synth, item_tokens.min(budget.max_tokens.max(4)))?;
        let n = (budget.max_tokens / item.len().max(1)).clamp(1, budget.max_requests.max(1));
        let t = Instant::now();
        match synth
            .pool()
            .synthesize_blocking(vec![item; n], synth.scales())
        {
            Ok(_) => return Ok(t.elapsed().as_secs_f64()),
            Err(e @ narrator_engine::EngineError::OutOfMemory { .. }) if n > 1 => {
                tracing::warn!(error = %e, "warm-up ran out of memory: halving the batch budget");
                synth.set_budget(crate::Budget {
                    max_tokens: (budget.max_tokens / 2).max(1),
                    max_requests: (budget.max_requests / 2).max(1),
                    max_wait: budget.max_wait,
                });
            }
            Err(e) => return Err(e.into()),
        }
    }
    Err(PipelineError::Internal(
        "warm-up kept running out of memory",
    ))
}

/// One side of a side-by-side engine measurement ([`compare_layouts`], [`compare_graphs`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Measured {
    /// × realtime (median of the rounds).
    pub x: f64,
    /// The slowest and fastest rounds (× realtime): the measurement's own noise.
    pub range: (f64, f64),
    /// Resident memory its first run added at its peak (arena growth and working
    /// buffers, not its weights), in bytes; `None` where the peak cannot be read or reset.
    pub work_bytes: Option<u64>,
}

/// Runs `f` once and returns the resident memory it added at its peak.
fn peak_added<T>(
    f: impl FnOnce() -> Result<T, PipelineError>,
) -> Result<Option<u64>, PipelineError> {
    use narrator_hardware::memory;
    let before = memory::process_rss();
    let reset = memory::reset_peak_rss();
    f()?;
    let peak = memory::process_peak_rss();
    Ok(match (reset, before, peak) {
        (true, Some(b), Some(p)) => Some(p.saturating_sub(b)),
        _ => None,
    })
}

/// Two workloads, each returning the samples it made: a first run of each (whose memory
/// is measured: arenas grow), then `rounds` rounds alternating them, timed.
fn alternate(
    a: impl Fn() -> Result<f64, PipelineError>,
    b: impl Fn() -> Result<f64, PipelineError>,
    sample_rate: u32,
    rounds: usize,
) -> Result<(Measured, Measured), PipelineError> {
    let a_work = peak_added(&a)?;
    let b_work = peak_added(&b)?;
    let rate = f64::from(sample_rate);
    let (mut ra, mut rb) = (Vec::new(), Vec::new());
    for _ in 0..rounds.max(1) {
        let t = Instant::now();
        let samples = a()?;
        ra.push(samples / rate / t.elapsed().as_secs_f64());
        let t = Instant::now();
        let samples = b()?;
        rb.push(samples / rate / t.elapsed().as_secs_f64());
    }
    let measured = |mut v: Vec<f64>, work_bytes| {
        v.sort_by(f64::total_cmp);
        Measured {
            x: v[v.len() / 2],
            range: (v[0], v[v.len() - 1]),
            work_bytes,
        }
    };
    Ok((measured(ra, a_work), measured(rb, b_work)))
}

/// `k` batch-1 runs of `item` on `pool` at once (every session busy): the samples made.
fn all_busy(
    pool: &narrator_engine::EnginePool,
    k: usize,
    item: &[i64],
    scales: narrator_engine::Scales,
) -> Result<f64, PipelineError> {
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..k)
            .map(|_| s.spawn(|| pool.synthesize_blocking(vec![item.to_vec()], scales)))
            .collect();
        let mut samples = 0usize;
        for h in handles {
            let out = h
                .join()
                .map_err(|_| PipelineError::Internal("a calibration thread panicked"))??;
            samples += out.audio.iter().map(Vec::len).sum::<usize>();
        }
        Ok(samples as f64)
    })
}

/// Thread layouts on CPU: the synthesizer's pool (one session using every core) against
/// `many` (one single-threaded session per core), each running batch-1 items with every
/// session busy, alternated for `rounds` rounds, after a first run of each whose memory
/// is measured. Returns (the synthesizer's pool, `many`). Whether to switch is
/// [`narrator_hardware::choose_layout`]'s call.
pub fn compare_layouts(
    synth: &Synthesizer,
    many: &narrator_engine::EnginePool,
    item_tokens: usize,
    rounds: usize,
) -> Result<(Measured, Measured), PipelineError> {
    let item = calibration_items(synth, item_tokens)?;
    let scales = synth.scales();
    let one = synth.pool();
    let k = many.sessions().max(1);
    let sequential = || -> Result<f64, PipelineError> {
        let mut samples = 0usize;
        for _ in 0..k {
            let out = one.synthesize_blocking(vec![item.clone()], scales)?;
            samples += out.audio.iter().map(Vec::len).sum::<usize>();
        }
        Ok(samples as f64)
    };
    alternate(
        sequential,
        || all_busy(many, k, &item, scales),
        synth.sample_rate(),
        rounds,
    )
}

/// Two graphs of one voice in the same thread layout (e.g. Kokoro's int8 and fp32 on a
/// CPU, where which is faster depends on the CPU's instructions): the synthesizer's pool
/// against `other`, every session of each busy with batch-1 items, alternated for
/// `rounds` rounds. Returns (the synthesizer's pool, `other`).
pub fn compare_graphs(
    synth: &Synthesizer,
    other: &narrator_engine::EnginePool,
    item_tokens: usize,
    rounds: usize,
) -> Result<(Measured, Measured), PipelineError> {
    let item = calibration_items(synth, item_tokens)?;
    let scales = synth.scales();
    let mine = synth.pool();
    alternate(
        || all_busy(&mine, mine.sessions().max(1), &item, scales),
        || all_busy(other, other.sessions().max(1), &item, scales),
        synth.sample_rate(),
        rounds,
    )
}
