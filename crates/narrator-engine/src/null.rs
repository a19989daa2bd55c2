//! The null backend: silence of a plausible length, instantly.
//!
//! It exercises everything around inference (queue, stores, journal, assembly) at full
//! speed: long-text tests of the whole pipeline, and control-plane benchmarks, where the
//! model would otherwise hide the cost of everything else.

use crate::{Backend, BatchOutput, Device, EngineError, Scales};

/// Returns `samples_per_id` zero samples per phoneme id (scaled by the length scale).
#[derive(Debug, Clone)]
pub struct NullBackend {
    /// Samples per phoneme id; 256 × 1.5 sounds like this voice's pace at 22.05 kHz.
    pub samples_per_id: usize,
}

impl Default for NullBackend {
    fn default() -> Self {
        Self {
            samples_per_id: 384,
        }
    }
}

impl Backend for NullBackend {
    fn synthesize(&mut self, items: &[&[i64]], scales: Scales) -> Result<BatchOutput, EngineError> {
        if let Some(index) = items.iter().position(|i| i.is_empty()) {
            return Err(EngineError::EmptyItem { index });
        }
        let per = (self.samples_per_id as f32 * scales.length.max(0.0)) as usize;
        Ok(BatchOutput {
            audio: items.iter().map(|i| vec![0.0; i.len() * per]).collect(),
            inference_seconds: 0.0,
            token_samples: items.iter().map(|i| vec![per as u32; i.len()]).collect(),
        })
    }

    fn supports_batching(&self) -> bool {
        true
    }

    fn device(&self) -> Device {
        Device::Cpu
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths_follow_the_ids_and_the_length_scale() {
        let mut b = NullBackend { samples_per_id: 10 };
        let out = b
            .synthesize(
                &[&[1, 2, 3], &[4]],
                Scales {
                    noise: 0.0,
                    length: 2.0,
                    noise_w: 0.0,
                },
            )
            .expect("ok");
        assert_eq!(out.audio.iter().map(Vec::len).collect::<Vec<_>>(), [60, 20]);
        assert!(b.synthesize(&[&[]], Scales::DETERMINISTIC).is_err());
    }
}
