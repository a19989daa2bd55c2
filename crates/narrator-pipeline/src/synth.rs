//! Segment text to segment audio: phonemize (espeak-ng, on a blocking thread), cap each
//! utterance's length, map to ids, run batches on the engine pool, normalize like Piper.

use std::sync::Arc;
use std::time::Instant;

use narrator_core::{Segment, SegmentAudio};
use narrator_engine::{EnginePool, Scales, Voice};
use narrator_phonemes::{PhonemeIdMap, Phonemizer};

use crate::PipelineError;

/// Utterances longer than this many phonemes are cut at a word boundary before synthesis
/// (VITS quality and memory degrade on very long inputs).
pub const MAX_PHONEMES: usize = 400;

/// A segment ready for the engine.
#[derive(Debug, Clone)]
pub struct Prepared {
    /// The segment.
    pub segment: Segment,
    /// One id sequence per utterance (espeak sentence, capped in length).
    pub utterances: Vec<Vec<i64>>,
    /// Phonemes the voice has no id for (skipped, as Piper does).
    pub unknown: Vec<String>,
    /// When it was queued (for queue-wait figures).
    pub queued_at: Instant,
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

/// Phonemizer, id map and engine pool for one voice.
#[derive(Debug)]
pub struct Synthesizer {
    phonemizer: Phonemizer,
    ids: PhonemeIdMap,
    espeak_voice: String,
    pool: EnginePool,
    scales: Scales,
    sample_rate: u32,
    fault: Option<FaultHook>,
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
        let ids = PhonemeIdMap::from_voice_config(&voice.config.raw)?;
        Ok(Self {
            phonemizer,
            ids,
            espeak_voice: voice.config.espeak_voice.clone(),
            pool,
            scales,
            sample_rate: voice.config.sample_rate,
            fault: None,
        })
    }

    /// Installs a [`Fault`] hook (fault-injection tests only).
    pub fn with_fault(mut self, fault: Fault) -> Self {
        self.fault = Some(FaultHook(fault));
        self
    }

    /// The voice's sample rate.
    pub fn sample_rate(&self) -> u32 {
        self.sample_rate
    }

    /// The engine pool.
    pub fn pool(&self) -> &EnginePool {
        &self.pool
    }

    /// Phonemizes one segment (blocking: call from a blocking thread).
    pub fn prepare(&self, segment: Segment) -> Result<Prepared, PipelineError> {
        let sentences = self
            .phonemizer
            .phonemize(&self.espeak_voice, &segment.text)?;
        let mut utterances = Vec::new();
        let mut unknown = Vec::new();
        for sentence in sentences {
            if sentence.is_empty() {
                continue;
            }
            for piece in cap_phonemes(sentence, MAX_PHONEMES) {
                let (ids, missing) = self.ids.ids(&piece);
                unknown.extend(missing);
                // BOS, PAD, EOS alone: nothing to say.
                if ids.len() > 3 {
                    utterances.push(ids);
                }
            }
        }
        Ok(Prepared {
            segment,
            utterances,
            unknown,
            queued_at: Instant::now(),
        })
    }

    /// Synthesizes a batch of prepared segments, in engine runs of at most `max_items`
    /// utterances each.
    pub async fn synthesize(
        &self,
        batch: Vec<Prepared>,
        max_items: usize,
    ) -> Result<Vec<Synthesized>, PipelineError> {
        let started = Instant::now();
        if let Some(FaultHook(fault)) = &self.fault
            && let Some((index, permanent)) = batch
                .iter()
                .find_map(|p| fault(&p.segment).map(|permanent| (p.segment.index, permanent)))
        {
            return Err(PipelineError::Injected { index, permanent });
        }
        let items: Vec<&[i64]> = batch
            .iter()
            .flat_map(|p| p.utterances.iter().map(Vec::as_slice))
            .collect();
        // Engine runs of at most `max_items` utterances, shortest first, so each run pads
        // as little as possible (on CPU one utterance per run was measured fastest).
        let mut order: Vec<usize> = (0..items.len()).collect();
        order.sort_by_key(|&i| items[i].len());
        let mut waves: Vec<Vec<f32>> = vec![Vec::new(); items.len()];
        let mut inference_seconds = 0.0;
        let mut largest = 0;
        for run in order.chunks(max_items.max(1)) {
            let ids = run.iter().map(|&i| items[i].to_vec()).collect();
            let out = self.pool.synthesize(ids, self.scales).await?;
            inference_seconds += out.inference_seconds;
            largest = largest.max(run.len());
            if out.audio.len() != run.len() {
                return Err(PipelineError::Internal(
                    "engine returned a different number of items",
                ));
            }
            for (&i, wave) in run.iter().zip(out.audio) {
                waves[i] = wave;
            }
        }
        let out = narrator_engine::BatchOutput {
            audio: waves,
            inference_seconds,
        };
        let total_ids: usize = batch.iter().map(Prepared::total_ids).sum::<usize>().max(1);
        let n = largest as u32;
        let mut audio_iter = out.audio.into_iter();
        let mut result = Vec::with_capacity(batch.len());
        for p in batch {
            let mut samples = Vec::new();
            for _ in 0..p.utterances.len() {
                let wave = audio_iter.next().ok_or(PipelineError::Internal(
                    "engine returned fewer items than sent",
                ))?;
                samples.extend(narrator_audio::peak_normalize_to_i16(&wave));
            }
            let share = out.inference_seconds * p.total_ids() as f64 / total_ids as f64;
            let wait = started.saturating_duration_since(p.queued_at).as_secs_f64();
            result.push(Synthesized {
                audio: SegmentAudio {
                    sample_rate: self.sample_rate,
                    samples,
                },
                inference_seconds: share,
                queue_wait_seconds: wait,
                batch_size: n,
                prepared: p,
            });
        }
        Ok(result)
    }
}

/// Shared handle used by the runner's tasks.
pub type SharedSynthesizer = Arc<Synthesizer>;

#[cfg(test)]
mod tests {
    use super::*;

    fn ph(s: &str) -> Vec<String> {
        s.chars().map(|c| c.to_string()).collect()
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
