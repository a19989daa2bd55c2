//! Sample-level helpers between the model and the encoders: Piper's peak normalization
//! (float → i16) and the silences inserted between sentences, paragraphs and chapters.
//!
//! These are pure functions over slices so the pipeline can unit-test its assembly logic
//! without any encoder.

use serde::{Deserialize, Serialize};

/// Below this peak an utterance is treated as silence (Piper uses the same guard).
const SILENCE_PEAK: f32 = 1e-8;

/// Piper's per-utterance peak normalization: divide by max |x| (if max < 1e-8 → silence),
/// clip to [-1, 1], scale by 32767, cast to i16 (truncating toward zero, as numpy's
/// `astype("int16")` does).
///
/// NaN samples become 0; infinite samples are ignored for the peak and clipped.
pub fn peak_normalize_to_i16(samples: &[f32]) -> Vec<i16> {
    let peak = samples
        .iter()
        .filter(|x| x.is_finite())
        .fold(0.0f32, |m, x| m.max(x.abs()));
    if peak < SILENCE_PEAK {
        return vec![0; samples.len()];
    }
    samples
        .iter()
        .map(|&x| {
            if x.is_nan() {
                return 0;
            }
            // `as` saturates and truncates toward zero, like numpy's astype on clipped data.
            ((x / peak).clamp(-1.0, 1.0) * 32767.0) as i16
        })
        .collect()
}

/// Where a pause goes: the domain's [`narrator_core::PauseAfter`], one type for the
/// planner and the encoders.
pub use narrator_core::PauseAfter as PauseKind;

/// How long each kind of pause lasts, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(default)]
pub struct Pauses {
    /// Silence after a sentence (default 250 ms).
    pub sentence_ms: u32,
    /// Silence after a paragraph (default 600 ms).
    pub paragraph_ms: u32,
    /// Silence after a chapter (default 1500 ms).
    pub chapter_ms: u32,
}

impl Default for Pauses {
    fn default() -> Self {
        Pauses {
            sentence_ms: 250,
            paragraph_ms: 600,
            chapter_ms: 1500,
        }
    }
}

impl Pauses {
    /// The pause length in milliseconds.
    pub fn millis(&self, kind: PauseKind) -> u32 {
        match kind {
            PauseKind::None => 0,
            PauseKind::Sentence => self.sentence_ms,
            PauseKind::Paragraph => self.paragraph_ms,
            PauseKind::Chapter => self.chapter_ms,
        }
    }

    /// The pause length in samples at `sample_rate`, rounded to the nearest sample.
    pub fn samples(&self, kind: PauseKind, sample_rate: u32) -> usize {
        let ms = u64::from(self.millis(kind));
        let n = (ms * u64::from(sample_rate) + 500) / 1000;
        usize::try_from(n).unwrap_or(usize::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peak_normalization_matches_piper_formula() {
        // peak is 0.5: x / 0.5 * 32767, truncated toward zero.
        // 0.1 / 0.5 * 32767 = 6553.4 → 6553; 0.3 / 0.5 * 32767 = 19660.2 → 19660;
        // -0.25 / 0.5 * 32767 = -16383.5 → -16383.
        let out = peak_normalize_to_i16(&[0.5, -0.25, 0.1, 0.0, -0.5, 0.3]);
        assert_eq!(out, vec![32767, -16383, 6553, 0, -32767, 19660]);
    }

    #[test]
    fn peak_normalization_scales_up_quiet_audio() {
        let out = peak_normalize_to_i16(&[0.001, -0.002, 0.0005]);
        assert_eq!(out, vec![16383, -32767, 8191]);
    }

    #[test]
    fn silence_stays_silence() {
        assert_eq!(peak_normalize_to_i16(&[0.0; 4]), vec![0; 4]);
        assert_eq!(peak_normalize_to_i16(&[1e-9, -5e-9]), vec![0, 0]);
        assert!(peak_normalize_to_i16(&[]).is_empty());
    }

    #[test]
    fn nan_and_inf_do_not_poison_the_peak() {
        let out = peak_normalize_to_i16(&[f32::NAN, 0.5, f32::INFINITY, -0.25]);
        assert_eq!(out, vec![0, 32767, 32767, -16383]);
    }

    #[test]
    fn pause_lengths_in_samples() {
        let p = Pauses::default();
        assert_eq!(p.samples(PauseKind::None, 22050), 0);
        assert_eq!(p.samples(PauseKind::Sentence, 22050), 5513); // 5512.5 rounds up
        assert_eq!(p.samples(PauseKind::Paragraph, 22050), 13230);
        assert_eq!(p.samples(PauseKind::Chapter, 22050), 33075);
        assert_eq!(p.samples(PauseKind::Chapter, 48000), 72000);
    }
}
