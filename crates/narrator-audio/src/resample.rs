//! Streaming resampling of mono i16 at the voice's rate to f32 at 48 kHz for Opus.
//!
//! Uses rubato's synchronous FFT resampler (fixed input chunk): for a fixed rational ratio
//! such as 22050 → 48000 (147:320) it is exact, has a flat passband to ~97 % of the input
//! Nyquist, and costs a few milliseconds per minute of audio. The resampler's startup delay
//! is trimmed here and the tail is flushed in [`To48k::finish`], so the output has exactly
//! `round(n × 48000 / rate)` samples, aligned with the input: chapter times stay exact.

use rubato::audioadapter_buffers::direct::InterleavedSlice;
use rubato::{Fft, FixedSync, Resampler, WindowFunction};

use crate::AudioError;

/// Opus always runs at 48 kHz.
pub(crate) const OPUS_RATE: u32 = 48_000;

/// Wanted input chunk (frames) and FFT sub-chunks: ~512-frame FFT blocks, 13 ms delay.
const CHUNK_IN: usize = 2048;
const SUB_CHUNKS: usize = 4;

/// Mono i16 at `rate` → f32 at 48 kHz, fed in chunks of any size.
pub(crate) struct To48k {
    rate: u32,
    /// `None` when the input is already 48 kHz.
    fft: Option<Fft<f32>>,
    /// Converted input not yet consumed by the resampler (less than one chunk between calls).
    pending: Vec<f32>,
    /// Scratch output of one `process_into_buffer` call.
    scratch: Vec<f32>,
    /// Output frames of startup delay still to drop.
    to_trim: usize,
    samples_in: u64,
    produced: u64,
}

fn internal(_: impl std::fmt::Debug) -> AudioError {
    AudioError::Internal {
        what: "resampler buffer sizes disagree",
    }
}

impl To48k {
    pub(crate) fn new(rate: u32) -> Result<Self, AudioError> {
        let fft = if rate == OPUS_RATE {
            None
        } else {
            let fft = Fft::<f32>::new_custom(
                rate as usize,
                OPUS_RATE as usize,
                CHUNK_IN,
                SUB_CHUNKS,
                1,
                WindowFunction::BlackmanHarris2,
                FixedSync::Input,
            )
            .map_err(|source| AudioError::ResamplerSetup {
                from: rate,
                to: OPUS_RATE,
                source,
            })?;
            Some(fft)
        };
        let (to_trim, scratch) = match &fft {
            Some(f) => (f.output_delay(), vec![0.0; f.output_frames_max()]),
            None => (0, Vec::new()),
        };
        Ok(To48k {
            rate,
            fft,
            pending: Vec::new(),
            scratch,
            to_trim,
            samples_in: 0,
            produced: 0,
        })
    }

    /// Number of 48 kHz samples the whole input maps to.
    pub(crate) fn expected_len(&self) -> u64 {
        let rate = u64::from(self.rate);
        (self.samples_in * u64::from(OPUS_RATE) + rate / 2) / rate
    }

    /// Resamples `samples` and appends whatever output is ready to `out`.
    pub(crate) fn push(&mut self, samples: &[i16], out: &mut Vec<f32>) -> Result<(), AudioError> {
        self.samples_in += samples.len() as u64;
        let as_float = samples.iter().map(|&s| f32::from(s) / 32768.0);
        if self.fft.is_none() {
            out.extend(as_float);
            self.produced += samples.len() as u64;
            return Ok(());
        }
        self.pending.extend(as_float);
        self.drain_full_chunks(out, u64::MAX)
    }

    /// Flushes the resampler tail; afterwards exactly [`Self::expected_len`] samples have
    /// been appended over all calls.
    pub(crate) fn finish(&mut self, out: &mut Vec<f32>) -> Result<(), AudioError> {
        let Some(fft) = &self.fft else {
            return Ok(());
        };
        let chunk = fft.input_frames_next();
        let expected = self.expected_len();
        // Zeros after the end behave like rubato's partial chunks and push the tail out.
        while self.produced < expected {
            let fill = chunk - self.pending.len() % chunk;
            self.pending.resize(self.pending.len() + fill, 0.0);
            self.drain_full_chunks(out, expected)?;
        }
        self.pending.clear();
        Ok(())
    }

    fn drain_full_chunks(&mut self, out: &mut Vec<f32>, limit: u64) -> Result<(), AudioError> {
        let Some(fft) = self.fft.as_mut() else {
            return Ok(());
        };
        let mut pos = 0;
        loop {
            let need = fft.input_frames_next();
            if self.pending.len() - pos < need {
                break;
            }
            let input =
                InterleavedSlice::new(&self.pending[pos..pos + need], 1, need).map_err(internal)?;
            let frames_out = self.scratch.len();
            let mut output = InterleavedSlice::new_mut(&mut self.scratch[..], 1, frames_out)
                .map_err(internal)?;
            let (used, made) = fft.process_into_buffer(&input, &mut output, None)?;
            pos += used;
            let mut ready = &self.scratch[..made];
            let trim = self.to_trim.min(ready.len());
            self.to_trim -= trim;
            ready = &ready[trim..];
            let room = usize::try_from(limit.saturating_sub(self.produced)).unwrap_or(usize::MAX);
            let ready = &ready[..ready.len().min(room)];
            out.extend_from_slice(ready);
            self.produced += ready.len() as u64;
        }
        self.pending.drain(..pos);
        Ok(())
    }
}

/// The 48 kHz signal the Opus encoder is given for `samples` at `rate`, whole: what a
/// decoded Opus stream is compared with when measuring what the codec changed.
pub fn resample_for_opus(samples: &[i16], rate: u32) -> Result<Vec<f32>, AudioError> {
    let mut r = To48k::new(rate)?;
    let mut out = Vec::with_capacity(samples.len() * 48 / 22 + 64);
    r.push(samples, &mut out)?;
    r.finish(&mut out)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sine(rate: u32, freq: f64, n: usize) -> Vec<i16> {
        (0..n)
            .map(|i| {
                let t = i as f64 / f64::from(rate);
                (16000.0 * (2.0 * std::f64::consts::PI * freq * t).sin()) as i16
            })
            .collect()
    }

    #[test]
    fn output_length_is_exact_for_any_chunking() -> Result<(), AudioError> {
        for (n, chunk) in [
            (0usize, 1usize),
            (1, 1),
            (1000, 7),
            (22050, 4410),
            (66150, 100_000),
        ] {
            let input = sine(22050, 440.0, n);
            let mut r = To48k::new(22050)?;
            let mut out = Vec::new();
            for c in input.chunks(chunk) {
                r.push(c, &mut out)?;
            }
            r.finish(&mut out)?;
            let want = (n as u64 * 48000 + 11025) / 22050;
            assert_eq!(out.len() as u64, want, "n={n} chunk={chunk}");
        }
        Ok(())
    }

    #[test]
    fn delay_is_trimmed_so_the_signal_stays_aligned() -> Result<(), AudioError> {
        // A single click at input sample 11025 (0.5 s) must come out near 24000 (0.5 s).
        let mut input = vec![0i16; 22050];
        input[11025] = 30000;
        let mut r = To48k::new(22050)?;
        let mut out = Vec::new();
        r.push(&input, &mut out)?;
        r.finish(&mut out)?;
        let peak = out
            .iter()
            .enumerate()
            .max_by(|a, b| a.1.abs().total_cmp(&b.1.abs()))
            .map(|(i, _)| i);
        let peak = peak.unwrap_or_default() as i64;
        assert!((peak - 24000).abs() <= 2, "click at {peak}");
        Ok(())
    }

    #[test]
    fn passthrough_at_48k() -> Result<(), AudioError> {
        let mut r = To48k::new(48000)?;
        let mut out = Vec::new();
        r.push(&[16384, -16384], &mut out)?;
        r.finish(&mut out)?;
        assert_eq!(out, vec![0.5, -0.5]);
        Ok(())
    }
}
