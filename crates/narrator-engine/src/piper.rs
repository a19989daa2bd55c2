//! The Piper/VITS backend: one ONNX Runtime session, batches of phoneme-id sequences in,
//! one exactly trimmed waveform per item out.
//!
//! Batching: items are padded to the longest one and run together; the voice's frames per
//! phoneme (`/Ceil_output_0`, exposed as an extra output by [`crate::splice`]) give each
//! item's true sample count, so padding never leaks into the audio. A voice without that
//! tensor still works, one item per run.

use std::path::Path;
use std::time::Instant;

use ort::session::{Session, builder::GraphOptimizationLevel};
use ort::value::Tensor;

use crate::splice::{self, Dim};
use crate::{Backend, BatchOutput, Device, EngineError, Scales, runtime::Runtime};

/// The internal tensor holding frames per phoneme in Piper's VITS export.
pub const FRAMES_TENSOR: &str = "/Ceil_output_0";

/// Options for one session.
#[derive(Debug, Clone)]
pub struct SessionOptions {
    /// Threads ONNX Runtime uses inside one operator.
    pub intra_threads: usize,
    /// Where to run.
    pub device: Device,
    /// CUDA only: cap on the CUDA arena in bytes (ONNX Runtime's `gpu_mem_limit`).
    /// Allocations past it fail as out of memory; `None` leaves ONNX Runtime's default.
    pub gpu_mem_limit: Option<usize>,
    /// Whether idle intra-op threads spin (ONNX Runtime's default: fastest when the
    /// session has the cores to itself) or sleep (leaves CPU to services sharing them).
    pub spin: bool,
}

/// One loaded voice model in one ONNX Runtime session.
pub struct PiperEngine {
    session: Session,
    has_frames: bool,
    has_sid: bool,
    device: Device,
}

impl std::fmt::Debug for PiperEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PiperEngine")
            .field("has_frames", &self.has_frames)
            .field("device", &self.device)
            .finish()
    }
}

fn ort_err(what: &'static str) -> impl Fn(ort::Error) -> EngineError {
    move |e| EngineError::Ort { what, source: e }
}

impl PiperEngine {
    /// Reads the model and creates a session (call from the thread that will run it).
    pub fn load(
        rt: &Runtime,
        model_path: &Path,
        opts: &SessionOptions,
    ) -> Result<Self, EngineError> {
        let bytes = std::fs::read(model_path).map_err(|source| EngineError::Io {
            path: model_path.to_path_buf(),
            source,
        })?;
        Self::from_bytes(rt, bytes, opts)
    }

    /// Creates a session from model bytes (the frames output is spliced in when present).
    pub fn from_bytes(
        rt: &Runtime,
        mut bytes: Vec<u8>,
        opts: &SessionOptions,
    ) -> Result<Self, EngineError> {
        let has_frames = splice::mentions(&bytes, FRAMES_TENSOR);
        if has_frames {
            splice::append_float_output(
                &mut bytes,
                FRAMES_TENSOR,
                &[
                    Dim::Named("batch_size"),
                    Dim::Fixed(1),
                    Dim::Named("phonemes"),
                ],
            );
        }
        let device = match opts.device {
            Device::Auto if rt.cuda_available => Device::Cuda(0),
            Device::Auto => Device::Cpu,
            Device::Cuda(_) if !rt.cuda_available => {
                return Err(EngineError::NoCuda {
                    library: rt.library.clone(),
                });
            }
            d => d,
        };
        let mut builder = Session::builder(rt.environment())
            .map_err(ort_err("creating a session builder"))?
            .with_optimization_level(GraphOptimizationLevel::All)
            .map_err(|e| ort_err("setting the optimization level")(e.into()))?
            .with_intra_threads(opts.intra_threads.max(1))
            .map_err(|e| ort_err("setting intra-op threads")(e.into()))?
            .with_inter_threads(1)
            .map_err(|e| ort_err("setting inter-op threads")(e.into()))?
            .with_intra_op_spinning(opts.spin)
            .map_err(|e| ort_err("setting intra-op spinning")(e.into()))?;
        if let Device::Cuda(id) = device {
            let cuda = ort::ep::CUDA::default()
                .with_device_id(id as i32)
                .with_conv_algorithm_search(ort::ep::cuda::ConvAlgorithmSearch::Heuristic);
            let cuda = match opts.gpu_mem_limit {
                Some(limit) => cuda.with_memory_limit(limit),
                None => cuda,
            };
            let cuda = cuda.build().error_on_failure();
            builder = builder
                .with_execution_providers([cuda])
                .map_err(|e| ort_err("registering the CUDA execution provider")(e.into()))?;
        }
        let session = builder
            .commit_from_memory(&bytes)
            .map_err(ort_err("loading the voice model"))?;
        let has_sid = session.inputs().iter().any(|i| i.name() == "sid");
        Ok(Self {
            session,
            has_frames,
            has_sid,
            device,
        })
    }
}

impl Backend for PiperEngine {
    fn device(&self) -> Device {
        self.device
    }

    fn supports_batching(&self) -> bool {
        self.has_frames
    }

    fn synthesize(&mut self, items: &[&[i64]], scales: Scales) -> Result<BatchOutput, EngineError> {
        if items.is_empty() {
            return Ok(BatchOutput {
                audio: Vec::new(),
                inference_seconds: 0.0,
            });
        }
        if items.len() > 1 && !self.has_frames {
            let mut audio = Vec::with_capacity(items.len());
            let mut secs = 0.0;
            for it in items {
                let out = self.synthesize(&[it], scales)?;
                secs += out.inference_seconds;
                audio.extend(out.audio);
            }
            return Ok(BatchOutput {
                audio,
                inference_seconds: secs,
            });
        }
        if let Some(i) = items.iter().position(|it| it.is_empty()) {
            return Err(EngineError::EmptyItem { index: i });
        }
        let b = items.len();
        let t = items.iter().map(|it| it.len()).max().unwrap_or(0);
        let mut ids = vec![0i64; b * t];
        for (row, it) in items.iter().enumerate() {
            ids[row * t..row * t + it.len()].copy_from_slice(it);
        }
        let lengths: Vec<i64> = items.iter().map(|it| it.len() as i64).collect();
        let scales_v = vec![scales.noise, scales.length, scales.noise_w];
        let started = Instant::now();
        let mk = ort_err("building input tensors");
        let mut inputs = ort::inputs![
            "input" => Tensor::from_array(([b, t], ids)).map_err(&mk)?,
            "input_lengths" => Tensor::from_array(([b], lengths)).map_err(&mk)?,
            "scales" => Tensor::from_array(([3usize], scales_v)).map_err(&mk)?,
        ];
        if self.has_sid {
            inputs.push((
                "sid".into(),
                Tensor::from_array(([b], vec![0i64; b]))
                    .map_err(&mk)?
                    .into(),
            ));
        }
        let device = self.device;
        let outputs = self.session.run(inputs).map_err(|e| {
            let detail = e.to_string();
            if crate::is_allocation_failure(&detail) {
                EngineError::OutOfMemory {
                    device,
                    items: b,
                    tokens: b * t,
                    detail,
                }
            } else {
                ort_err("running the voice model")(e)
            }
        })?;
        let (shape, wave) = outputs["output"]
            .try_extract_tensor::<f32>()
            .map_err(ort_err("reading the audio output"))?;
        let total = *shape.last().unwrap_or(&0) as usize;
        let audio = if self.has_frames {
            let (fshape, frames) = outputs[FRAMES_TENSOR]
                .try_extract_tensor::<f32>()
                .map_err(ort_err("reading the frame counts"))?;
            let p = *fshape.last().unwrap_or(&0) as usize;
            let per_item: Vec<f64> = (0..b)
                .map(|i| {
                    frames[i * p..(i + 1) * p]
                        .iter()
                        .map(|&f| f64::from(f))
                        .sum()
                })
                .collect();
            let max_frames = per_item.iter().cloned().fold(0.0, f64::max);
            // Samples per frame (the vocoder's hop length), as the padded output shows it.
            let hop = if max_frames > 0.0 {
                (total as f64 / max_frames).round()
            } else {
                0.0
            };
            (0..b)
                .map(|i| {
                    let n = ((per_item[i] * hop) as usize).min(total);
                    wave[i * total..i * total + n].to_vec()
                })
                .collect()
        } else {
            vec![wave[..total].to_vec()]
        };
        Ok(BatchOutput {
            audio,
            inference_seconds: started.elapsed().as_secs_f64(),
        })
    }
}
