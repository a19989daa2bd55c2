//! `narrator bench`: the field guide's performance table, measured on a loaded synthesizer.
//!
//! Three measurements, each for about [`BenchOptions::seconds`]:
//! - **single**: one 10-second utterance at a time: the RTF a lone request sees;
//! - **sweep**: batches of 1, 2, 4, … sentences, length-bucketed as the batcher forms them
//!   (sorted by length, neighbours together), through [`Synthesizer::synthesize`] with the
//!   budget set to the batch: RTF, throughput and batch latency per size;
//! - **concurrency**: C clients, each sending the 10-second utterance and waiting for its
//!   audio, through a batching actor on the synthesizer's own budget ([`Batcher`],
//!   `max_wait`, one batch per engine session at a time), as a worker serves them: p50/p95
//!   latency per C. C doubles while p95 stays within the target, then the boundary is
//!   bisected ([`ConcurrencySearch`]); the largest C within the target is the maximum
//!   stable concurrency (the field guide's definition, p95 ≤ 2 s by default).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use narrator_core::{PauseAfter, Segment};
use serde::{Deserialize, Serialize};
use tokio::sync::{Semaphore, mpsc, oneshot};
use tokio::task::JoinSet;

use crate::{Batcher, Budget, PipelineError, Prepared, Synthesizer};

/// Sentences of the sweep: short to long, as a book mixes them.
const SENTENCES: &[&str] = &[
    "It rained.",
    "The door was open.",
    "She laughed and shook her head.",
    "Nobody in the village remembered who had planted the orchard.",
    "By noon the fog had lifted, and the boats came back one after another.",
    "He wrote every evening, a page at a time, in a notebook with a cracked green cover.",
    "The train was late again, so the children sat on their suitcases and counted the \
     pigeons on the station roof.",
    "When the letter finally arrived, it was three weeks old, stained with coffee, and \
     addressed to a man who had moved away in the spring.",
    "Are you sure?",
    "The kettle sang, the cat stretched, and the morning began as it always did.",
    "Far below the bridge, the river turned silver in the last of the light, and for a \
     moment the whole city seemed to hold its breath before the street lamps came on.",
    "They argued about the map for an hour, then followed the river instead.",
];

/// One sentence of about ten seconds of speech (one utterance, under the phoneme cap).
const UTTERANCE: &str = "On the last evening of the summer the fishermen pulled their \
boats high onto the shingle, mended the torn nets by lantern light, and talked quietly \
about the storms that the old men said were coming from the west.";

/// What to measure and for how long.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// Time per measurement point, in seconds.
    pub seconds: f64,
    /// Fewest timed runs (or requests) per point, even past `seconds`.
    pub min_samples: usize,
    /// Batch sizes of the sweep.
    pub batches: Vec<usize>,
    /// The plan's batch size: `rtf_batched` is measured there.
    pub plan_batch: usize,
    /// p95 latency target of the concurrency search, in seconds.
    pub latency_target: f64,
    /// Largest concurrency tried.
    pub max_concurrency: usize,
}

/// One batch size of the sweep.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SweepPoint {
    /// Sentences per engine run asked for.
    pub batch: usize,
    /// Largest engine run that actually ran (smaller after an out-of-memory halving).
    pub largest_run: usize,
    /// Processing time / audio time (lower is faster).
    pub rtf: f64,
    /// Audio seconds per wall second.
    pub throughput: f64,
    /// Median batch latency, seconds.
    pub p50_seconds: f64,
    /// 95th percentile batch latency, seconds.
    pub p95_seconds: f64,
    /// Timed batches.
    pub runs: usize,
    /// Padded tokens over real tokens, minus one (the cost of batching unequal lengths).
    pub padding: f64,
}

/// One concurrency level.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ConcurrencyPoint {
    /// Clients, each with one request outstanding.
    pub concurrency: usize,
    /// Median request latency, seconds.
    pub p50_seconds: f64,
    /// 95th percentile request latency, seconds.
    pub p95_seconds: f64,
    /// Audio seconds per wall second (clients × audio per request / mean latency).
    pub throughput: f64,
    /// Requests timed.
    pub requests: usize,
}

/// Everything `narrator bench` measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchFigures {
    /// RTF of one 10-second utterance at a time.
    pub rtf_single: f64,
    /// RTF at the plan's batch size (`batched_at`).
    pub rtf_batched: f64,
    /// The batch size of `rtf_batched`.
    pub batched_at: usize,
    /// Length of the utterance of `rtf_single` and of the concurrency test, seconds.
    pub utterance_seconds: f64,
    /// The sweep, by batch size.
    pub batch_sweep: Vec<SweepPoint>,
    /// The concurrency levels measured, in the order they were tried.
    pub concurrency: Vec<ConcurrencyPoint>,
    /// Largest concurrency whose p95 latency stayed within the target (0: not even one).
    pub max_stable_concurrency: usize,
    /// The p95 latency target, seconds.
    pub latency_target_seconds: f64,
    /// Wall time of the whole benchmark, seconds.
    pub seconds: f64,
}

/// The `q` quantile (0..=1) of `v` by nearest rank; 0 when empty.
pub fn quantile(v: &[f64], q: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let rank = (q * s.len() as f64).ceil() as usize;
    s[rank.clamp(1, s.len()) - 1]
}

/// The search for the largest concurrency within the latency target: 1, 2, 4, … while
/// p95 stays within it, then bisection between the largest good and the smallest bad level.
#[derive(Debug, Clone)]
pub struct ConcurrencySearch {
    target: f64,
    cap: usize,
    good: usize,
    bad: Option<usize>,
}

impl ConcurrencySearch {
    /// A search for p95 ≤ `target` seconds, up to `cap` clients.
    pub fn new(target: f64, cap: usize) -> Self {
        Self {
            target,
            cap: cap.max(1),
            good: 0,
            bad: None,
        }
    }

    /// The next level to measure, or `None` when the boundary is found.
    pub fn next(&self) -> Option<usize> {
        match self.bad {
            None if self.good >= self.cap => None,
            None => Some((self.good * 2).clamp(1, self.cap)),
            Some(bad) if bad <= self.good + 1 => None,
            Some(bad) => Some(self.good + (bad - self.good) / 2),
        }
    }

    /// Records the p95 latency measured at `level`.
    pub fn record(&mut self, level: usize, p95: f64) {
        if p95 <= self.target {
            self.good = self.good.max(level);
        } else {
            self.bad = Some(self.bad.map_or(level, |b| b.min(level)));
        }
    }

    /// The largest level within the target so far (0: none).
    pub fn result(&self) -> usize {
        self.good
    }
}

fn segment(text: &str) -> Segment {
    Segment {
        index: 0,
        chapter: 0,
        text: text.to_string(),
        pause_after: PauseAfter::Sentence,
        speaker: 0,
        speed: None,
        timed: false,
    }
}

fn prepare(synth: &Synthesizer, text: &str) -> Result<Prepared, PipelineError> {
    let p = synth.prepare(segment(text))?;
    if p.utterances.is_empty() {
        return Err(PipelineError::Internal(
            "the benchmark text made no phonemes for this voice",
        ));
    }
    Ok(p)
}

fn audio_seconds(out: &[crate::synth::Synthesized]) -> f64 {
    out.iter().map(|s| s.audio.seconds()).sum()
}

/// Runs the whole benchmark on `synth` (its budget is restored afterwards).
pub async fn bench(
    synth: Arc<Synthesizer>,
    opts: &BenchOptions,
) -> Result<BenchFigures, PipelineError> {
    let started = Instant::now();
    let plan_budget = synth.budget();
    let prep = synth.clone();
    let (utterance, sentences) = tokio::task::spawn_blocking(move || {
        let u = prepare(&prep, UTTERANCE)?;
        let s = SENTENCES
            .iter()
            .map(|t| prepare(&prep, t))
            .collect::<Result<Vec<_>, _>>()?;
        Ok::<_, PipelineError>((u, s))
    })
    .await
    .map_err(|_| PipelineError::Internal("phonemizing the benchmark text panicked"))??;
    // Warm-up: first runs allocate.
    let first = synth.synthesize(vec![utterance.clone()]).await?;
    let utterance_seconds = audio_seconds(&first);

    // Single: one request at a time.
    let (mut wall, mut audio, mut n) = (0.0, 0.0, 0usize);
    let t = Instant::now();
    while n < opts.min_samples.max(1) || t.elapsed().as_secs_f64() < opts.seconds {
        let r = Instant::now();
        let out = synth.synthesize(vec![utterance.clone()]).await?;
        wall += r.elapsed().as_secs_f64();
        audio += audio_seconds(&out);
        n += 1;
    }
    let rtf_single = wall / audio.max(f64::EPSILON);

    let result = sweep_all(&synth, &sentences, opts).await;
    synth.set_budget(plan_budget);
    let batch_sweep = result?;
    let at = batch_sweep
        .iter()
        .find(|p| p.batch == opts.plan_batch)
        .or_else(|| batch_sweep.iter().rfind(|p| p.batch <= opts.plan_batch))
        .or(batch_sweep.first());
    let (rtf_batched, batched_at) = at.map_or((rtf_single, 1), |p| (p.rtf, p.batch));

    let mut search = ConcurrencySearch::new(opts.latency_target, opts.max_concurrency);
    let mut concurrency = Vec::new();
    while let Some(level) = search.next() {
        let point = concurrent(&synth, &utterance, level, opts).await?;
        tracing::info!(
            concurrency = level,
            p50 = point.p50_seconds,
            p95 = point.p95_seconds,
            "concurrency point"
        );
        search.record(level, point.p95_seconds);
        concurrency.push(point);
    }
    Ok(BenchFigures {
        rtf_single,
        rtf_batched,
        batched_at,
        utterance_seconds,
        batch_sweep,
        concurrency,
        max_stable_concurrency: search.result(),
        latency_target_seconds: opts.latency_target,
        seconds: started.elapsed().as_secs_f64(),
    })
}

async fn sweep_all(
    synth: &Arc<Synthesizer>,
    sentences: &[Prepared],
    opts: &BenchOptions,
) -> Result<Vec<SweepPoint>, PipelineError> {
    let mut out = Vec::new();
    for &batch in &opts.batches {
        let p = sweep_point(synth, sentences, batch.max(1), opts).await?;
        tracing::info!(batch, rtf = p.rtf, throughput = p.throughput, "sweep point");
        out.push(p);
    }
    Ok(out)
}

/// Batches of `batch` neighbouring sentences by length, cycling through the sorted pool.
async fn sweep_point(
    synth: &Arc<Synthesizer>,
    sentences: &[Prepared],
    batch: usize,
    opts: &BenchOptions,
) -> Result<SweepPoint, PipelineError> {
    let copies = (2 * batch).div_ceil(sentences.len().max(1)).max(1);
    let mut pool: Vec<Prepared> = sentences
        .iter()
        .flat_map(|p| std::iter::repeat_n(p.clone(), copies))
        .collect();
    pool.sort_by_key(Prepared::max_len);
    let chunks: Vec<Vec<Prepared>> = pool.chunks(batch).map(<[_]>::to_vec).collect();
    let longest = pool.iter().map(Prepared::max_len).max().unwrap_or(1);
    let wait = synth.budget().max_wait;
    synth.set_budget(Budget {
        max_tokens: batch * longest,
        max_requests: batch,
        max_wait: wait,
    });
    // A warm-up run at this size (allocations, kernel selection).
    synth.synthesize(chunks[0].clone()).await?;
    let (mut wall, mut audio, mut lat) = (0.0, 0.0, Vec::new());
    let (mut padded, mut real, mut largest) = (0usize, 0usize, 0usize);
    let t = Instant::now();
    let mut i = 0;
    // Whole cycles through the pool, so every length counts as often as the others.
    while lat.len() < opts.min_samples.max(1)
        || t.elapsed().as_secs_f64() < opts.seconds
        || i % chunks.len() != 0
    {
        let chunk = &chunks[i % chunks.len()];
        i += 1;
        padded += chunk.iter().map(Prepared::max_len).max().unwrap_or(0) * chunk.len();
        real += chunk.iter().map(Prepared::total_ids).sum::<usize>();
        let r = Instant::now();
        let done = synth.synthesize(chunk.clone()).await?;
        let s = r.elapsed().as_secs_f64();
        largest = largest.max(
            done.iter()
                .map(|d| d.batch_size as usize)
                .max()
                .unwrap_or(0),
        );
        wall += s;
        audio += audio_seconds(&done);
        lat.push(s);
    }
    Ok(SweepPoint {
        batch,
        largest_run: largest,
        rtf: wall / audio.max(f64::EPSILON),
        throughput: audio / wall.max(f64::EPSILON),
        p50_seconds: quantile(&lat, 0.5),
        p95_seconds: quantile(&lat, 0.95),
        runs: lat.len(),
        padding: padded as f64 / real.max(1) as f64 - 1.0,
    })
}

/// One timed request: sent, answered, audio seconds, whether it was its client's first.
type Sample = (Instant, Instant, f64, bool);

struct Request {
    prepared: Prepared,
    reply: oneshot::Sender<Result<f64, String>>,
}

/// Serves requests as a worker does: a batcher on the synthesizer's budget, one batch per
/// free engine session. Ends when every sender is gone and the last batch is answered.
async fn serve(synth: Arc<Synthesizer>, mut rx: mpsc::Receiver<Request>) {
    let slots = Arc::new(Semaphore::new(synth.pool().sessions().max(1)));
    let mut batcher: Batcher<Request> = Batcher::new();
    let mut tasks = JoinSet::new();
    let mut open = true;
    let add = |b: &mut Batcher<Request>, r: Request| {
        let (len, n) = (r.prepared.max_len(), r.prepared.utterances.len());
        b.append(r, len, n, Instant::now());
    };
    loop {
        while let Ok(r) = rx.try_recv() {
            add(&mut batcher, r);
        }
        if batcher.is_empty() {
            if !open {
                break;
            }
            match rx.recv().await {
                Some(r) => add(&mut batcher, r),
                None => open = false,
            }
            continue;
        }
        let Ok(permit) = slots.clone().acquire_owned().await else {
            break;
        };
        while let Ok(r) = rx.try_recv() {
            add(&mut batcher, r);
        }
        let budget = synth.budget();
        let now = Instant::now();
        if let Some(batch) = batcher.next_batch(&budget, now, !open) {
            let synth = synth.clone();
            tasks.spawn(async move {
                let (prepared, replies): (Vec<_>, Vec<_>) =
                    batch.into_iter().map(|r| (r.prepared, r.reply)).unzip();
                let result = synth.synthesize(prepared).await;
                drop(permit);
                match result {
                    Ok(done) => {
                        for (d, reply) in done.iter().zip(replies) {
                            let _ = reply.send(Ok(d.audio.seconds()));
                        }
                    }
                    Err(e) => {
                        for reply in replies {
                            let _ = reply.send(Err(e.to_string()));
                        }
                    }
                }
            });
            continue;
        }
        drop(permit);
        let deadline = batcher.deadline(&budget).unwrap_or(now);
        tokio::select! {
            r = rx.recv() => match r {
                Some(r) => add(&mut batcher, r),
                None => open = false,
            },
            _ = tokio::time::sleep_until(deadline.into()) => {}
        }
    }
    while tasks.join_next().await.is_some() {}
}

/// `level` clients, each with one utterance outstanding, for about `opts.seconds`.
async fn concurrent(
    synth: &Arc<Synthesizer>,
    utterance: &Prepared,
    level: usize,
    opts: &BenchOptions,
) -> Result<ConcurrencyPoint, PipelineError> {
    let (tx, rx) = mpsc::channel::<Request>(level.max(1) * 2);
    let server = tokio::spawn(serve(synth.clone(), rx));
    let samples: Arc<Mutex<Vec<Sample>>> = Arc::default();
    let failure: Arc<Mutex<Option<String>>> = Arc::default();
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut clients = JoinSet::new();
    for _ in 0..level {
        let (tx, utterance, samples, failure, stop) = (
            tx.clone(),
            utterance.clone(),
            samples.clone(),
            failure.clone(),
            stop_rx.clone(),
        );
        clients.spawn(async move {
            let mut first = true;
            while !*stop.borrow() {
                let (reply, answer) = oneshot::channel();
                let sent = Instant::now();
                let request = Request {
                    prepared: utterance.clone(),
                    reply,
                };
                if tx.send(request).await.is_err() {
                    break;
                }
                match answer.await {
                    Ok(Ok(seconds)) => {
                        let done = Instant::now();
                        if let Ok(mut s) = samples.lock() {
                            s.push((sent, done, seconds, first));
                        }
                    }
                    Ok(Err(e)) => {
                        if let Ok(mut f) = failure.lock() {
                            f.get_or_insert(e);
                        }
                        break;
                    }
                    Err(_) => break,
                }
                first = false;
            }
        });
    }
    drop(tx);
    let start = Instant::now();
    // Enough time for the fewest samples even at latencies past the target.
    let cap = Duration::from_secs_f64(opts.seconds.max(0.1) * 4.0 + opts.latency_target * 10.0);
    let timed = |s: &[Sample]| s.iter().filter(|x| !x.3).count();
    loop {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let n = samples.lock().map(|s| timed(&s)).unwrap_or(0);
        let elapsed = start.elapsed();
        if (elapsed.as_secs_f64() >= opts.seconds && n >= opts.min_samples.max(1))
            || elapsed >= cap
            || clients.is_empty()
            || failure.lock().map(|f| f.is_some()).unwrap_or(false)
        {
            break;
        }
    }
    let end = Instant::now();
    let _ = stop_tx.send(true);
    while clients.join_next().await.is_some() {}
    let _ = server.await;
    if let Some(e) = failure.lock().ok().and_then(|mut f| f.take()) {
        return Err(PipelineError::Task(format!(
            "a benchmark request failed: {e}"
        )));
    }
    let all = samples.lock().map(|s| s.clone()).unwrap_or_default();
    // Each client's first request ramps up; requests finishing after the window ran at a
    // falling load. Without any other sample (latency beyond the window), use them all.
    let mut kept: Vec<_> = all.iter().filter(|x| !x.3 && x.1 <= end).collect();
    if kept.is_empty() {
        kept = all.iter().collect();
    }
    let lat: Vec<f64> = kept.iter().map(|x| (x.1 - x.0).as_secs_f64()).collect();
    // Little's law for `level` clients that always have one request out: throughput is
    // level × audio per request / mean latency.
    let n = kept.len().max(1) as f64;
    let mean_latency = lat.iter().sum::<f64>() / n;
    let mean_audio = kept.iter().map(|x| x.2).sum::<f64>() / n;
    Ok(ConcurrencyPoint {
        concurrency: level,
        p50_seconds: quantile(&lat, 0.5),
        p95_seconds: quantile(&lat, 0.95),
        throughput: level as f64 * mean_audio / mean_latency.max(f64::EPSILON),
        requests: lat.len(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_by_nearest_rank() {
        let v: Vec<f64> = (1..=20).map(f64::from).collect();
        assert_eq!(quantile(&v, 0.5), 10.0);
        assert_eq!(quantile(&v, 0.95), 19.0);
        assert_eq!(quantile(&v, 1.0), 20.0);
        assert_eq!(quantile(&[3.0], 0.95), 3.0);
        assert_eq!(quantile(&[], 0.5), 0.0);
        assert_eq!(quantile(&[5.0, 1.0, 3.0], 0.0), 1.0);
    }

    /// Runs the search against a latency model.
    fn search(target: f64, cap: usize, p95: impl Fn(usize) -> f64) -> (usize, Vec<usize>) {
        let mut s = ConcurrencySearch::new(target, cap);
        let mut tried = Vec::new();
        while let Some(c) = s.next() {
            assert!(!tried.contains(&c), "level {c} measured twice: {tried:?}");
            tried.push(c);
            s.record(c, p95(c));
        }
        (s.result(), tried)
    }

    #[test]
    fn search_doubles_then_bisects_to_the_boundary() {
        // Latency grows 0.25 s per client: p95 <= 2 s up to 8 clients.
        let (best, tried) = search(2.0, 1024, |c| 0.25 * c as f64);
        assert_eq!(best, 8);
        assert_eq!(tried, [1, 2, 4, 8, 16, 12, 10, 9]);
        // The field guide's CPU row: 3 stable clients.
        let (best, _) = search(2.0, 1024, |c| 0.6 * c as f64);
        assert_eq!(best, 3);
        // A GPU that holds 100 clients.
        let (best, tried) = search(2.0, 1024, |c| if c <= 100 { 1.0 } else { 3.0 });
        assert_eq!(best, 100);
        assert!(tried.len() <= 14, "{tried:?}");
    }

    #[test]
    fn search_reports_zero_when_one_client_is_too_slow_and_stops_at_the_cap() {
        let (best, tried) = search(2.0, 1024, |_| 2.5);
        assert_eq!((best, tried), (0, vec![1]));
        let (best, tried) = search(2.0, 6, |_| 0.1);
        assert_eq!(best, 6);
        assert_eq!(tried, [1, 2, 4, 6]);
        let (best, _) = search(2.0, 1, |_| 0.1);
        assert_eq!(best, 1);
    }

    #[test]
    fn the_boundary_is_exactly_the_target() {
        let (best, _) = search(1.0, 64, |c| c as f64 / 4.0);
        assert_eq!(best, 4, "p95 equal to the target is within it");
    }
}
