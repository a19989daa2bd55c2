//! A backend behind a memory limit counted in padded tokens: batches above it fail with
//! [`EngineError::OutOfMemory`], as a device allocator would. It makes the out-of-memory
//! path (halve the budget, retry, fall back to CPU) testable on machines without a GPU,
//! and can claim to be a GPU so the fallback to CPU is exercised too. Only test set-ups
//! and fault-injection hooks use it.

use crate::{Backend, BatchOutput, Device, EngineError, Scales, padded_tokens};

/// `inner` with a limit of `max_tokens` padded tokens per run, reporting `device`.
pub struct MemoryLimit {
    /// The real backend.
    pub inner: Box<dyn Backend>,
    /// Largest padded cost (longest item × items) that "fits".
    pub max_tokens: usize,
    /// The device it claims to be (e.g. `cuda:0` to exercise the fallback to CPU).
    pub device: Device,
}

impl Backend for MemoryLimit {
    fn synthesize(&mut self, items: &[&[i64]], scales: Scales) -> Result<BatchOutput, EngineError> {
        let tokens = padded_tokens(items);
        if tokens > self.max_tokens {
            return Err(EngineError::OutOfMemory {
                device: self.device,
                items: items.len(),
                tokens,
                detail: format!(
                    "Failed to allocate memory: the limit is {} padded tokens (test limit)",
                    self.max_tokens
                ),
            });
        }
        self.inner.synthesize(items, scales)
    }

    fn synthesize_speakers(
        &mut self,
        items: &[&[i64]],
        speakers: &[i64],
        scales: Scales,
    ) -> Result<BatchOutput, EngineError> {
        let tokens = padded_tokens(items);
        if tokens > self.max_tokens {
            return self.synthesize(items, scales);
        }
        self.inner.synthesize_speakers(items, speakers, scales)
    }

    fn supports_batching(&self) -> bool {
        self.inner.supports_batching()
    }

    fn device(&self) -> Device {
        self.device
    }
}

/// `inner` taking at least `per_run` per engine run whatever its size, as a GPU whose
/// batches cost about the same up to its knee. Test set-ups use it with the null backend
/// to give workers a speed that grows with their batch budget.
pub struct Paced {
    /// The real backend.
    pub inner: Box<dyn Backend>,
    /// Wall time of one run.
    pub per_run: std::time::Duration,
}

impl Backend for Paced {
    fn synthesize(&mut self, items: &[&[i64]], scales: Scales) -> Result<BatchOutput, EngineError> {
        let started = std::time::Instant::now();
        let mut out = self.inner.synthesize(items, scales)?;
        std::thread::sleep(self.per_run.saturating_sub(started.elapsed()));
        out.inference_seconds = started.elapsed().as_secs_f64();
        Ok(out)
    }

    fn synthesize_speakers(
        &mut self,
        items: &[&[i64]],
        speakers: &[i64],
        scales: Scales,
    ) -> Result<BatchOutput, EngineError> {
        let started = std::time::Instant::now();
        let mut out = self.inner.synthesize_speakers(items, speakers, scales)?;
        std::thread::sleep(self.per_run.saturating_sub(started.elapsed()));
        out.inference_seconds = started.elapsed().as_secs_f64();
        Ok(out)
    }

    fn supports_batching(&self) -> bool {
        self.inner.supports_batching()
    }

    fn device(&self) -> Device {
        self.inner.device()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::NullBackend;

    #[test]
    fn batches_above_the_limit_fail_as_out_of_memory() {
        let mut b = MemoryLimit {
            inner: Box::new(NullBackend { samples_per_id: 1 }),
            max_tokens: 10,
            device: Device::Cuda(0),
        };
        let s = Scales {
            noise: 0.0,
            length: 1.0,
            noise_w: 0.0,
        };
        assert!(b.synthesize(&[&[1, 2, 3, 4, 5], &[1, 2]], s).is_ok());
        let e = b
            .synthesize(&[&[1, 2, 3, 4, 5, 6], &[1]], s)
            .err()
            .map(|e| e.kind());
        assert_eq!(e, Some("out_of_memory"));
        assert!(crate::is_allocation_failure(
            "Failed to allocate memory for requested buffer of size 123"
        ));
        assert!(!crate::is_allocation_failure("Invalid input name: foo"));
    }
}
