//! Segment text to segment audio: phonemize (espeak-ng, on a blocking thread), cap each
//! utterance's length, map to ids, run batches on the engine pool, normalize like Piper.

use narrator_telemetry::metrics as m;
use std::sync::Arc;
use std::time::Instant;
use tracing::Instrument;

use narrator_core::{Segment, SegmentAudio};
use std::sync::{Mutex, RwLock};

use narrator_engine::{
    Batching, Capabilities, Device, EngineError, EnginePool, Family, FamilyKind, ScaleOverrides,
    Scales, Voice,
};
use narrator_phonemes::Phonemizer;

use crate::PipelineError;
use crate::batcher::Budget;

/// Utterances longer than this many phonemes are cut at a word boundary before synthesis
/// (the default of both families; a family may declare a smaller one).
pub const MAX_PHONEMES: usize = narrator_engine::MAX_ITEM_PHONEMES;

/// A segment ready for the engine.
#[derive(Debug, Clone)]
pub struct Prepared {
    /// The segment.
    pub segment: Segment,
    /// The scales its job recorded ([`narrator_core::Delivery::scales`]: those its
    /// identity was hashed with), which it runs with; `None`: see
    /// [`Synthesizer::scales_for`].
    pub scales: Option<Scales>,
    /// One id sequence per utterance (espeak sentence, capped in length).
    pub utterances: Vec<Vec<i64>>,
    /// Per utterance, per id: the index in `words` of the word it was made for (`None`:
    /// boundaries, spaces, punctuation).
    pub id_words: Vec<Vec<Option<u32>>>,
    /// The words of the segment's text that were spoken: byte ranges.
    pub words: Vec<std::ops::Range<usize>>,
    /// Phonemes the voice has no id for (skipped, as Piper does).
    pub unknown: Vec<String>,
    /// When it was queued (for queue-wait figures).
    pub queued_at: Instant,
    /// The segment's span (in its job's trace), open until it is acknowledged; none
    /// until the runner sets it.
    pub span: tracing::Span,
}

impl Prepared {
    /// Padded cost of this segment's longest utterance.
    pub fn max_len(&self) -> usize {
        self.utterances.iter().map(Vec::len).max().unwrap_or(0)
    }

    /// Total phoneme ids.
    pub fn total_ids(&self) -> usize {
        self.utterances.iter().map(Vec::len).sum()
    }
}

/// A synthesized segment with its share of the batch's figures.
#[derive(Debug, Clone)]
pub struct Synthesized {
    /// The prepared input.
    pub prepared: Prepared,
    /// Its audio.
    pub audio: SegmentAudio,
    /// Its share of the batch's inference time (by ids).
    pub inference_seconds: f64,
    /// Time from queueing to the start of its batch.
    pub queue_wait_seconds: f64,
    /// Utterances in the largest engine run of its batch.
    pub batch_size: u32,
    /// Where each word is spoken in `audio` (empty where the engine gave no durations).
    pub words: Vec<narrator_core::WordTiming>,
}

/// Splits a phoneme sequence into pieces of at most `max` phonemes, at spaces when possible.
pub fn cap_phonemes(phonemes: Vec<String>, max: usize) -> Vec<Vec<String>> {
    if phonemes.len() <= max {
        return vec![phonemes];
    }
    let mut out = Vec::new();
    let mut rest = phonemes.as_slice();
    while rest.len() > max {
        let cut = rest[..max]
            .iter()
            .rposition(|p| p == " ")
            .filter(|&i| i > max / 4)
            .map_or(max, |i| i + 1);
        out.push(rest[..cut].to_vec());
        rest = &rest[cut..];
    }
    if !rest.is_empty() {
        out.push(rest.to_vec());
    }
    out
}

/// Phonemizer, the voice's family (ids, capabilities) and engine pool for one voice.
#[derive(Debug)]
pub struct Synthesizer {
    phonemizer: Phonemizer,
    family: Arc<dyn Family>,
    caps: Capabilities,
    pool: RwLock<Arc<EnginePool>>,
    scales: Scales,
    fault: Option<FaultHook>,
    budget: Mutex<Budget>,
    fallback: Option<FallbackHook>,
    stats: Mutex<EngineStats>,
    /// Work in progress (phonemizing, batches), for liveness: see [`Synthesizer::longest_running`].
    running: Mutex<Running>,
}

/// What is in progress now: an id per piece of work, with what it is and since when.
#[derive(Debug, Default)]
struct Running {
    next: u64,
    started: std::collections::BTreeMap<u64, (Work, Instant)>,
}

/// A kind of work a synthesizer does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Work {
    /// Phonemizing one segment (espeak-ng).
    Phonemize,
    /// Synthesizing a batch (the engine's runs).
    Batch,
}

impl Work {
    /// One word for logs and the worker's row.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Phonemize => "phonemizing",
            Self::Batch => "a batch",
        }
    }
}

/// A piece of work registered in [`Running`] until it is dropped.
struct InProgress<'a> {
    running: &'a Mutex<Running>,
    id: u64,
}

impl Drop for InProgress<'_> {
    fn drop(&mut self) {
        let mut r = self.running.lock().unwrap_or_else(|e| e.into_inner());
        r.started.remove(&self.id);
    }
}

/// Builds the CPU pool (and its budget) a GPU worker falls back to after repeated
/// out-of-memory failures.
pub type Fallback = Box<dyn Fn() -> Result<(EnginePool, Budget), EngineError> + Send + Sync>;

struct FallbackHook(Fallback);

impl std::fmt::Debug for FallbackHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Fallback")
    }
}

/// Out-of-memory failures of one batch after which a GPU falls back to CPU.
pub const OOM_FALLBACK_AFTER: u32 = 3;

/// What the engine has done so far (for the heartbeat and `narrator workers`).
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct EngineStats {
    /// Wall seconds the device spent running batches.
    pub busy_seconds: f64,
    /// Batches run (each one or more engine runs).
    pub batches: u64,
    /// Engine runs.
    pub runs: u64,
    /// Out-of-memory failures (each halved the budget).
    pub oom_events: u64,
    /// The last one, in words.
    pub last_oom: Option<String>,
    /// Set once the worker fell back to CPU, with why.
    pub fallback: Option<String>,
}

struct FaultHook(Fault);

impl std::fmt::Debug for FaultHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FaultHook")
    }
}

/// A test hook: a segment for which it returns `Some(permanent)` makes its whole engine
/// run fail (as a NaN or a kernel error caused by one item would), with a permanent or a
/// transient error. Set only by fault-injection set-ups, never by default.
pub type Fault = Arc<dyn Fn(&Segment) -> Option<bool> + Send + Sync>;

impl Synthesizer {
    /// Builds the synthesizer for `voice` on a started pool.
    pub fn new(
        voice: &Voice,
        phonemizer: Phonemizer,
        pool: EnginePool,
        scales: Scales,
    ) -> Result<Self, PipelineError> {
        Ok(Self {
            phonemizer,
            family: voice.family.clone(),
            caps: voice.family.capabilities(),
            pool: RwLock::new(Arc::new(pool)),
            scales,
            fault: None,
            budget: Mutex::new(Budget::single()),
            fallback: None,
            stats: Mutex::new(EngineStats::default()),
            running: Mutex::default(),
        })
    }

    /// Sets the batch budget (from the plan).
    pub fn with_budget(self, budget: Budget) -> Self {
        self.set_budget(budget);
        self
    }

    /// Installs the CPU fallback used after repeated out-of-memory failures on a GPU.
    pub fn with_fallback(mut self, fallback: Fallback) -> Self {
        self.fallback = Some(FallbackHook(fallback));
        self
    }

    /// Replaces the engine pool (another thread layout chosen by calibration); the old
    /// pool's threads finish their batches and exit.
    pub fn set_pool(&self, pool: EnginePool) {
        let old = std::mem::replace(
            &mut *self.pool.write().unwrap_or_else(|e| e.into_inner()),
            Arc::new(pool),
        );
        drop(old);
    }

    /// The batch budget now (halved by each out-of-memory failure).
    pub fn budget(&self) -> Budget {
        *self.budget.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Replaces the batch budget. A packed family's runs hold at most its
    /// [`Capabilities::max_run_ids`]: a larger budget would hand one session a run of many
    /// model runs in a row while the others wait (measured on 2 cores, Kokoro, 297 words:
    /// 47–48 s uncapped, 29.4 s capped; docs/BENCHMARKS.md, issue 28).
    pub fn set_budget(&self, budget: Budget) {
        let cap = match self.caps.batching {
            Batching::Packed => self.caps.max_run_ids,
            Batching::Padded | Batching::Single => usize::MAX,
        };
        *self.budget.lock().unwrap_or_else(|e| e.into_inner()) = Budget {
            max_tokens: budget.max_tokens.min(cap).max(1),
            max_requests: budget.max_requests.max(1),
            max_wait: budget.max_wait,
        };
    }

    /// Lowers the batch budget to at most `to` (each limit the smaller of the two) and
    /// returns the result: concurrent batches that ran out of memory at an older, larger
    /// budget cannot undo a smaller one.
    pub fn shrink_budget(&self, to: Budget) -> Budget {
        let mut budget = self.budget.lock().unwrap_or_else(|e| e.into_inner());
        *budget = shrunk(*budget, to);
        *budget
    }

    /// What the engine has done so far.
    pub fn stats(&self) -> EngineStats {
        self.stats.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The work in progress that has run longest: what it is and for how long.
    pub fn longest_running(&self) -> Option<(Work, std::time::Duration)> {
        let r = self.running.lock().unwrap_or_else(|e| e.into_inner());
        r.started
            .values()
            .min_by_key(|(_, since)| *since)
            .map(|(work, since)| (*work, since.elapsed()))
    }

    /// The mean wall seconds of this engine's batches so far (`None` before the first).
    pub fn mean_batch_seconds(&self) -> Option<f64> {
        let s = self.stats();
        (s.batches > 0).then(|| s.busy_seconds / s.batches as f64)
    }

    fn begin(&self, work: Work) -> InProgress<'_> {
        let mut r = self.running.lock().unwrap_or_else(|e| e.into_inner());
        let id = r.next;
        r.next += 1;
        r.started.insert(id, (work, Instant::now()));
        InProgress {
            running: &self.running,
            id,
        }
    }

    fn note(&self, f: impl FnOnce(&mut EngineStats)) {
        f(&mut self.stats.lock().unwrap_or_else(|e| e.into_inner()));
    }

    /// Installs a [`Fault`] hook (fault-injection tests only).
    pub fn with_fault(mut self, fault: Fault) -> Self {
        self.fault = Some(FaultHook(fault));
        self
    }

    /// The scales every run uses.
    pub fn scales(&self) -> Scales {
        self.scales
    }

    /// The voice's sample rate.
    pub fn sample_rate(&self) -> u32 {
        self.caps.sample_rate
    }

    /// The voice's model family.
    pub fn family(&self) -> FamilyKind {
        self.family.kind()
    }

    /// What the voice's family declares.
    pub fn capabilities(&self) -> Capabilities {
        self.caps
    }

    /// How a run's cost is counted: packed families pay for the sum of their items.
    fn cost(&self) -> RunCost {
        match self.caps.batching {
            Batching::Packed => RunCost::Sum,
            Batching::Padded | Batching::Single => RunCost::Padded,
        }
    }

    /// The engine pool (the CPU one after a fallback).
    pub fn pool(&self) -> Arc<EnginePool> {
        self.pool.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Phonemizes one segment (blocking: call from a blocking thread).
    pub fn prepare(&self, segment: Segment) -> Result<Prepared, PipelineError> {
        let _running = self.begin(Work::Phonemize);
        let voice = self.family.espeak_voice();
        let phonemized = if segment.timed {
            self.phonemizer.phonemize_words(voice, &segment.text)?
        } else {
            let sentences = self.phonemizer.phonemize(voice, &segment.text)?;
            narrator_phonemes::Phonemized {
                owners: sentences.iter().map(|s| vec![None; s.len()]).collect(),
                sentences,
                words: Vec::new(),
            }
        };
        let mut utterances = Vec::new();
        let mut id_words = Vec::new();
        let mut unknown = Vec::new();
        for (sentence, owners) in phonemized.sentences.into_iter().zip(phonemized.owners) {
            if sentence.is_empty() {
                continue;
            }
            let mut at = 0;
            for piece in cap_phonemes(sentence, self.caps.max_item_phonemes) {
                let owners = owners.get(at..at + piece.len()).unwrap_or(&[]);
                at += piece.len();
                let (ids, missing, sources) = self.family.phoneme_ids_with_sources(&piece);
                unknown.extend(missing);
                if !ids.is_empty() {
                    id_words.push(
                        sources
                            .iter()
                            .map(|s| s.and_then(|i| owners.get(i).copied().flatten()))
                            .collect(),
                    );
                    utterances.push(ids);
                }
            }
        }
        Ok(Prepared {
            segment,
            scales: None,
            utterances,
            id_words,
            words: phonemized.words,
            unknown,
            queued_at: Instant::now(),
            span: tracing::Span::none(),
        })
    }

    /// Synthesizes a batch of prepared segments, in engine runs within the budget.
    ///
    /// Out of memory: the budget is halved and the batch runs again; after
    /// [`OOM_FALLBACK_AFTER`] failures of one batch on a GPU (or one at the smallest budget)
    /// the worker falls back to CPU when a fallback is installed, and says so.
    pub async fn synthesize(
        &self,
        batch: Vec<Prepared>,
    ) -> Result<Vec<Synthesized>, PipelineError> {
        let started = Instant::now();
        let _running = self.begin(Work::Batch);
        if let Some(FaultHook(fault)) = &self.fault {
            // On a blocking thread, where the engine's own work runs: a hook that hangs
            // (a wedged engine) or sleeps (a slow one) must not stall the async threads.
            // Its panic is the batch's, as an engine's would be.
            let (fault, segments) = (
                fault.clone(),
                batch.iter().map(|p| p.segment.clone()).collect::<Vec<_>>(),
            );
            let hit = tokio::task::spawn_blocking(move || {
                segments
                    .iter()
                    .find_map(|s| fault(s).map(|permanent| (s.index, permanent)))
            })
            .await
            .unwrap_or_else(|e| match e.try_into_panic() {
                Ok(payload) => std::panic::resume_unwind(payload),
                Err(_) => None,
            });
            if let Some((index, permanent)) = hit {
                return Err(PipelineError::Injected { index, permanent });
            }
        }
        let items: Vec<&[i64]> = batch
            .iter()
            .flat_map(|p| p.utterances.iter().map(Vec::as_slice))
            .collect();
        // Each utterance as its segment's speaker and at its job's rate (segments of
        // several jobs share a batch; a run takes one rate, so rates run apart).
        let speakers: Vec<i64> = batch
            .iter()
            .flat_map(|p| p.utterances.iter().map(|_| i64::from(p.segment.speaker)))
            .collect();
        let scales: Vec<Scales> = batch
            .iter()
            .flat_map(|p| {
                let s = self.scales_for(p);
                p.utterances.iter().map(move |_| s)
            })
            .collect();
        let mut failures = 0u32;
        let (waves, token_samples, inference_seconds, largest) = loop {
            let budget = self.budget();
            match self.run_all(&items, &speakers, &scales, budget).await {
                Ok(done) => break done,
                Err(EngineError::OutOfMemory {
                    device,
                    items: n,
                    tokens,
                    detail,
                }) => {
                    failures += 1;
                    metrics::counter!(m::OOM_EVENTS, "device" => device.to_string()).increment(1);
                    let what = format!("{n} items, {tokens} padded tokens on {device}: {detail}");
                    self.note(|s| {
                        s.oom_events += 1;
                        s.last_oom = Some(what.clone());
                    });
                    let smallest = budget.max_requests <= 1 && tokens <= budget.max_tokens.max(1);
                    let on_gpu = matches!(device, Device::Cuda(_));
                    if on_gpu
                        && (failures >= OOM_FALLBACK_AFTER || smallest)
                        && let Some(FallbackHook(make)) = &self.fallback
                    {
                        self.fall_back(make, &what).await?;
                        continue;
                    }
                    if smallest {
                        return Err(EngineError::OutOfMemory {
                            device,
                            items: n,
                            tokens,
                            detail,
                        }
                        .into());
                    }
                    let halved = Budget {
                        max_tokens: (budget.max_tokens / 2).max(1),
                        max_requests: (budget.max_requests / 2).max(1),
                        max_wait: budget.max_wait,
                    };
                    // Another batch may have shrunk the budget (or fallen back to CPU)
                    // meanwhile: never raise it again.
                    let halved = self.shrink_budget(halved);
                    tracing::warn!(
                        error = %what,
                        max_batch_tokens = halved.max_tokens,
                        max_batch_requests = halved.max_requests,
                        "out of memory: halved the batch budget, running the batch again"
                    );
                }
                Err(e) => return Err(e.into()),
            }
        };
        self.note(|s| {
            s.busy_seconds += inference_seconds;
            s.batches += 1;
        });
        let total_ids: usize = batch.iter().map(Prepared::total_ids).sum::<usize>().max(1);
        let n = largest as u32;
        let mut audio_iter = waves.into_iter().zip(token_samples);
        let mut result = Vec::with_capacity(batch.len());
        for p in batch {
            let mut samples = Vec::new();
            let mut words = WordSpans::new(p.words.len());
            for u in 0..p.utterances.len() {
                let (wave, durations) = audio_iter.next().ok_or(PipelineError::Internal(
                    "engine returned fewer items than sent",
                ))?;
                words.add(samples.len(), &durations, p.id_words.get(u));
                samples.extend(narrator_audio::peak_normalize_to_i16(&wave));
            }
            let words = words.finish(&p.words);
            let share = inference_seconds * p.total_ids() as f64 / total_ids as f64;
            let wait = started.saturating_duration_since(p.queued_at).as_secs_f64();
            result.push(Synthesized {
                audio: SegmentAudio {
                    sample_rate: self.caps.sample_rate,
                    samples,
                },
                inference_seconds: share,
                queue_wait_seconds: wait,
                batch_size: n,
                prepared: p,
                words,
            });
        }
        Ok(result)
    }
}

impl Synthesizer {
    /// The scales a prepared segment runs with: those its job recorded (the scales its
    /// identity was hashed with, [`Prepared::scales`]), whatever this synthesizer was
    /// loaded with; else the synthesizer's own, at the segment's rate where its job set
    /// one (`--speed` divides the voice's default length scale, as on the command line:
    /// [`ScaleOverrides::resolve`]).
    pub fn scales_for(&self, p: &Prepared) -> Scales {
        if let Some(recorded) = p.scales {
            return recorded;
        }
        let own = self.scales;
        ScaleOverrides {
            speed: p.segment.speed,
            length: Some(own.length),
            noise: Some(own.noise),
            noise_w: Some(own.noise_w),
        }
        .resolve(self.family.default_scales())
    }

    /// Runs every item in engine runs within `budget`; waves in input order, the
    /// inference seconds, and the largest run.
    async fn run_all(
        &self,
        items: &[&[i64]],
        speakers: &[i64],
        scales: &[Scales],
        budget: Budget,
    ) -> Result<(Vec<Vec<f32>>, Vec<Vec<u32>>, f64, usize), EngineError> {
        let pool = self.pool();
        let device = pool.device().to_string();
        let lens: Vec<usize> = items.iter().map(|i| i.len()).collect();
        let mut waves: Vec<Vec<f32>> = vec![Vec::new(); items.len()];
        let mut token_samples: Vec<Vec<u32>> = vec![Vec::new(); items.len()];
        let mut inference_seconds = 0.0;
        let mut largest = 0;
        // Items of one rate run together (almost always all of them), in their order.
        let mut rates: Vec<(Scales, Vec<usize>)> = Vec::new();
        for (i, s) in scales.iter().enumerate() {
            match rates.iter_mut().find(|(r, _)| r == s) {
                Some((_, members)) => members.push(i),
                None => rates.push((*s, vec![i])),
            }
        }
        let runs = rates.iter().flat_map(|(s, members)| {
            let member_lens: Vec<usize> = members.iter().map(|&i| lens[i]).collect();
            engine_runs_costed(&member_lens, &budget, self.cost())
                .into_iter()
                .map(move |run| (*s, run.into_iter().map(|j| members[j]).collect::<Vec<_>>()))
        });
        for (run_scales, run) in runs {
            let ids = run.iter().map(|&i| items[i].to_vec()).collect();
            let run_speakers = run.iter().map(|&i| speakers[i]).collect();
            let tokens: usize = run.iter().map(|&i| lens[i]).sum();
            let padded = run.iter().map(|&i| lens[i]).max().unwrap_or(0) * run.len();
            let span = tracing::info_span!("engine run", narrator.device = %device,
                narrator.batch_size = run.len(), narrator.tokens = tokens, narrator.padded_tokens = padded);
            let out = pool
                .synthesize_as(ids, run_speakers, run_scales)
                .instrument(span)
                .await?;
            let class = m::size_class(run.len());
            metrics::histogram!(m::ENGINE_RUN_SECONDS, "device" => device.clone(), "batch" => class)
                .record(out.inference_seconds);
            metrics::histogram!(m::BATCH_SIZE, "device" => device.clone()).record(run.len() as f64);
            if padded > 0 {
                let padding = 1.0 - tokens as f64 / padded as f64;
                metrics::histogram!(m::BATCH_PADDING, "device" => device.clone()).record(padding);
            }
            inference_seconds += out.inference_seconds;
            self.note(|s| s.runs += 1);
            largest = largest.max(run.len());
            if out.audio.len() != run.len() {
                return Err(EngineError::Stopped);
            }
            let mut durations = out.token_samples.into_iter();
            for (&i, wave) in run.iter().zip(out.audio) {
                waves[i] = wave;
                token_samples[i] = durations.next().unwrap_or_default();
            }
        }
        Ok((waves, token_samples, inference_seconds, largest))
    }

    async fn fall_back(&self, make: &Fallback, what: &str) -> Result<(), PipelineError> {
        if !matches!(self.pool().device(), Device::Cuda(_)) {
            // Another batch fell back already; this one runs again on the CPU pool.
            return Ok(());
        }
        let (pool, budget) = make()?;
        let reason = format!(
            "fell back to {} after out-of-memory failures on the GPU (last: {what})",
            pool.device()
        );
        tracing::error!("{reason}");
        metrics::counter!(m::CPU_FALLBACKS, "device" => self.pool().device().to_string())
            .increment(1);
        let old = std::mem::replace(
            &mut *self.pool.write().unwrap_or_else(|e| e.into_inner()),
            Arc::new(pool),
        );
        // Joining the old engine threads blocks: not on the async runtime's threads.
        tokio::task::spawn_blocking(move || drop(old));
        self.set_budget(budget);
        self.note(|s| s.fallback = Some(reason));
        Ok(())
    }
}

/// Each word's first and last sample in a segment's audio, gathered utterance by
/// utterance from the model's per-id durations.
struct WordSpans {
    spans: Vec<Option<(u64, u64)>>,
    /// False once an utterance came without durations: no word is timed then.
    timed: bool,
}

impl WordSpans {
    fn new(words: usize) -> Self {
        Self {
            spans: vec![None; words],
            timed: true,
        }
    }

    /// An utterance starting at sample `offset` of the segment, with each id's samples
    /// and each id's word.
    fn add(&mut self, offset: usize, durations: &[u32], words: Option<&Vec<Option<u32>>>) {
        let Some(words) = words.filter(|w| w.len() == durations.len() && !w.is_empty()) else {
            self.timed = false;
            return;
        };
        let mut at = offset as u64;
        for (&d, word) in durations.iter().zip(words) {
            let end = at + u64::from(d);
            if let Some(span) = word.and_then(|w| self.spans.get_mut(w as usize))
                && d > 0
            {
                *span = Some(span.map_or((at, end), |(s, e)| (s.min(at), e.max(end))));
            }
            at = end;
        }
    }

    /// The timed words (a word none of whose ids lasted a sample is left out).
    fn finish(self, words: &[std::ops::Range<usize>]) -> Vec<narrator_core::WordTiming> {
        if !self.timed {
            return Vec::new();
        }
        let u32_of = |n: u64| u32::try_from(n).unwrap_or(u32::MAX);
        self.spans
            .iter()
            .zip(words)
            .filter_map(|(span, range)| {
                span.map(|(s, e)| narrator_core::WordTiming {
                    text: [u32_of(range.start as u64), u32_of(range.end as u64)],
                    samples: [u32_of(s), u32_of(e)],
                })
            })
            .collect()
    }
}

/// Each limit of `current` lowered to `to`'s (never below 1).
fn shrunk(current: Budget, to: Budget) -> Budget {
    Budget {
        max_tokens: current.max_tokens.min(to.max_tokens).max(1),
        max_requests: current.max_requests.min(to.max_requests).max(1),
        max_wait: current.max_wait,
    }
}

/// How an engine run's size is counted against the budget's tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunCost {
    /// Padded batches: longest × items.
    Padded,
    /// Packed runs: the items' ids end to end, one separator between two.
    Sum,
}

/// Splits items (by their lengths) into engine runs: shortest first, each run as long as
/// its padded cost (longest × items) and its item count stay within `budget`; an item
/// over the budget on its own runs alone.
pub fn engine_runs(lens: &[usize], budget: &Budget) -> Vec<Vec<usize>> {
    engine_runs_costed(lens, budget, RunCost::Padded)
}

/// [`engine_runs`] with the run's cost counted as `cost` says. Packed runs keep the
/// items' order (sentences of one segment stay next to each other in a run).
pub fn engine_runs_costed(lens: &[usize], budget: &Budget, cost: RunCost) -> Vec<Vec<usize>> {
    let mut order: Vec<usize> = (0..lens.len()).collect();
    if cost == RunCost::Padded {
        order.sort_by_key(|&i| lens[i]);
    }
    let mut runs: Vec<Vec<usize>> = Vec::new();
    let mut current: Vec<usize> = Vec::new();
    let mut sum = 0;
    for i in order {
        let size = match cost {
            RunCost::Padded => lens[i] * (current.len() + 1),
            RunCost::Sum => sum + usize::from(!current.is_empty()) + lens[i],
        };
        let fits = current.is_empty()
            || (current.len() < budget.max_requests && size <= budget.max_tokens);
        if !fits {
            runs.push(std::mem::take(&mut current));
            sum = 0;
        }
        sum += usize::from(!current.is_empty()) + lens[i];
        current.push(i);
    }
    if !current.is_empty() {
        runs.push(current);
    }
    runs
}

/// Shared handle used by the runner's tasks.
pub type SharedSynthesizer = Arc<Synthesizer>;

#[cfg(test)]
mod tests {
    use super::*;

    fn ph(s: &str) -> Vec<String> {
        s.chars().map(|c| c.to_string()).collect()
    }

    fn budget(tokens: usize, requests: usize) -> Budget {
        Budget {
            max_tokens: tokens,
            max_requests: requests,
            max_wait: std::time::Duration::ZERO,
        }
    }

    #[test]
    fn a_stale_halving_never_raises_a_smaller_budget() {
        // After a fallback to one item per run, a batch that failed at the old budget of
        // 4 items halves it to 2: the budget stays at 1.
        assert_eq!(shrunk(budget(128, 1), budget(804, 2)), budget(128, 1));
        assert_eq!(shrunk(budget(1608, 4), budget(804, 2)), budget(804, 2));
        assert_eq!(shrunk(budget(10, 3), budget(0, 0)), budget(1, 1));
    }

    #[test]
    fn engine_runs_stay_within_the_padded_budget_shortest_first() {
        let lens = [100, 10, 50, 12, 400, 11];
        let runs = engine_runs(&lens, &budget(120, 8));
        assert_eq!(runs, vec![vec![1, 5, 3], vec![2], vec![0], vec![4]]);
        for r in &runs[..2] {
            let padded = r.iter().map(|&i| lens[i]).max().unwrap_or(0) * r.len();
            assert!(padded <= 120, "{r:?}");
        }
        // The request cap.
        assert_eq!(engine_runs(&[5, 5, 5], &budget(1000, 2)).len(), 2);
        // Budget of one: one item per run (the CPU plan).
        assert_eq!(
            engine_runs(&[5, 7, 6], &budget(1, 1)),
            vec![vec![0], vec![2], vec![1]]
        );
        assert!(engine_runs(&[], &budget(10, 1)).is_empty());
    }

    #[test]
    fn packed_runs_count_the_sum_with_separators_and_keep_the_order() {
        let lens = [100, 10, 50, 300, 12];
        let runs = engine_runs_costed(&lens, &budget(162, 8), RunCost::Sum);
        // 100 + 1 + 10 + 1 + 50 = 162 fits; 300 alone; 12 after it.
        assert_eq!(runs, vec![vec![0, 1, 2], vec![3], vec![4]]);
        // The request cap still holds.
        assert_eq!(
            engine_runs_costed(&[1, 1, 1], &budget(100, 2), RunCost::Sum),
            vec![vec![0, 1], vec![2]]
        );
    }

    #[test]
    fn short_utterances_are_untouched() {
        assert_eq!(cap_phonemes(ph("ab cd"), 10), vec![ph("ab cd")]);
    }

    #[test]
    fn long_utterances_split_at_spaces_without_losing_phonemes() {
        let input = ph("aaaa bbbb cccc dddd eeee ffff");
        let pieces = cap_phonemes(input.clone(), 10);
        assert!(pieces.iter().all(|p| p.len() <= 10), "{pieces:?}");
        assert_eq!(pieces.concat(), input);
        assert!(
            pieces[0].last().is_some_and(|p| p == " "),
            "cut after a space: {pieces:?}"
        );
    }

    #[test]
    fn a_long_run_without_spaces_is_cut_hard() {
        let pieces = cap_phonemes(ph(&"x".repeat(25)), 10);
        assert_eq!(pieces.iter().map(Vec::len).collect::<Vec<_>>(), [10, 10, 5]);
    }
}
