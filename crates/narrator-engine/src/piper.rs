//! The Piper (VITS) family, whole: a voice on disk ([`PiperVoice`]: `NAME.onnx` next to
//! `NAME.onnx.json`, whose JSON config ([`VoiceConfig`]) says the sample rate, the
//! espeak-ng voice, the phoneme id map and the default inference scales), its
//! [`Family`] declaration, and its backend ([`PiperEngine`]): one ONNX Runtime session,
//! batches of phoneme-id sequences in, one exactly trimmed waveform per item out.
//!
//! Batching: items are padded to the longest one and run together; the voice's frames per
//! phoneme (`/Ceil_output_0`, exposed as an extra output by [`crate::splice`]) give each
//! item's true sample count, so padding never leaks into the audio. A voice without that
//! tensor still works, one item per run.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use ort::session::{RunOptions, Session};
use ort::value::Tensor;

use crate::family::{Batching, Capabilities, Family, FamilyKind, MAX_ITEM_PHONEMES, VoiceInfo};
use crate::runtime::Runtime;
use crate::session::{ArenaPolicy, Opened, SessionOptions, open_session, ort_err, run_failure};
use crate::splice::{self, Dim};
use crate::{Backend, BatchOutput, Device, EngineError, Scales};

/// What narrator needs from a voice's `.onnx.json`.
#[derive(Debug, Clone)]
pub struct VoiceConfig {
    /// Output sample rate in Hz.
    pub sample_rate: u32,
    /// Piper's quality tier (`x_low`, `low`, `medium`, `high`).
    pub quality: String,
    /// Language code, e.g. `en_US`.
    pub language: String,
    /// espeak-ng voice used to phonemize, e.g. `en-us`.
    pub espeak_voice: String,
    /// Default inference scales.
    pub scales: Scales,
    /// Number of speakers (1 for single-speaker voices).
    pub num_speakers: u32,
    /// The whole JSON document (the phoneme id map is read from it by the phonemes crate).
    pub raw: serde_json::Value,
}

impl VoiceConfig {
    /// Parses a Piper voice config.
    pub fn from_json(path: &Path, text: &str) -> Result<Self, EngineError> {
        let bad = |what: &str| EngineError::VoiceConfig {
            path: path.to_path_buf(),
            reason: what.to_string(),
        };
        let raw: serde_json::Value =
            serde_json::from_str(text).map_err(|e| bad(&format!("not valid JSON ({e})")))?;
        let sample_rate = raw
            .pointer("/audio/sample_rate")
            .and_then(|v| v.as_u64())
            .ok_or_else(|| bad("missing audio.sample_rate"))?;
        // Not cut to 32 bits: 4294967296 would be a rate of 0 (a division by zero later).
        let sample_rate = u32::try_from(sample_rate)
            .ok()
            .filter(|&r| r > 0)
            .ok_or_else(|| {
                bad(&format!(
                    "audio.sample_rate {sample_rate} is not a sample rate"
                ))
            })?;
        let espeak_voice = raw
            .pointer("/espeak/voice")
            .and_then(|v| v.as_str())
            .ok_or_else(|| bad("missing espeak.voice"))?
            .to_string();
        if raw
            .get("phoneme_id_map")
            .and_then(|m| m.as_object())
            .is_none()
        {
            return Err(bad("missing phoneme_id_map"));
        }
        let f = |p: &str, d: f32| {
            raw.pointer(p)
                .and_then(|v| v.as_f64())
                .map_or(d, |v| v as f32)
        };
        let scales = Scales {
            noise: f("/inference/noise_scale", 0.667),
            length: f("/inference/length_scale", 1.0),
            noise_w: f("/inference/noise_w", 0.8),
        };
        let s = |p: &str| {
            raw.pointer(p)
                .and_then(|v| v.as_str())
                .unwrap_or("")
                .to_string()
        };
        Ok(Self {
            sample_rate,
            quality: s("/audio/quality"),
            language: s("/language/code"),
            espeak_voice,
            scales,
            num_speakers: raw
                .get("num_speakers")
                .and_then(|v| v.as_u64())
                .unwrap_or(1) as u32,
            raw,
        })
    }
}

impl VoiceConfig {
    /// The named speakers (`speaker_id_map`), by id.
    pub fn speakers(&self) -> Vec<(String, u32)> {
        let mut v: Vec<(String, u32)> = self
            .raw
            .get("speaker_id_map")
            .and_then(|m| m.as_object())
            .map(|m| {
                m.iter()
                    .filter_map(|(name, id)| {
                        Some((name.clone(), u32::try_from(id.as_u64()?).ok()?))
                    })
                    .collect()
            })
            .unwrap_or_default();
        v.sort_by_key(|(_, id)| *id);
        v
    }

    /// The speaker id for `given`: a name of `speaker_id_map`, or a number below
    /// `num_speakers`. `voice` names the voice in the error, which lists the speakers.
    pub fn speaker_id(&self, voice: &str, given: &str) -> Result<u32, EngineError> {
        let named = self.speakers();
        if let Some((_, id)) = named.iter().find(|(n, _)| n == given) {
            return Ok(*id);
        }
        if let Ok(id) = given.trim().parse::<u32>()
            && id < self.num_speakers.max(1)
        {
            return Ok(id);
        }
        let speakers = if self.num_speakers <= 1 {
            "one (it is a single-speaker voice; leave --speaker out)".to_string()
        } else if named.is_empty() {
            format!("ids 0 to {}", self.num_speakers - 1)
        } else {
            let list: Vec<String> = named
                .iter()
                .take(20)
                .map(|(n, i)| format!("{n} ({i})"))
                .collect();
            let more = named.len().saturating_sub(20);
            if more > 0 {
                format!(
                    "{} and {more} more (ids 0 to {})",
                    list.join(", "),
                    self.num_speakers - 1
                )
            } else {
                list.join(", ")
            }
        };
        Err(EngineError::UnknownSpeaker {
            voice: voice.to_string(),
            given: given.to_string(),
            speakers,
        })
    }
}

/// A Piper (VITS) voice: one `.onnx` file and its `.onnx.json` config.
#[derive(Debug, Clone)]
pub struct PiperVoice {
    /// The `.onnx` model.
    pub model_path: PathBuf,
    /// The `.onnx.json` config.
    pub config_path: PathBuf,
    /// The parsed config.
    pub config: VoiceConfig,
    ids: narrator_phonemes::PhonemeIdMap,
}

impl PiperVoice {
    /// Reads the config beside `model_path`.
    pub fn load(model_path: &Path) -> Result<Self, EngineError> {
        let config_path = PathBuf::from(format!("{}.json", model_path.display()));
        let text = std::fs::read_to_string(&config_path).map_err(|source| EngineError::Io {
            path: config_path.clone(),
            source,
        })?;
        let config = VoiceConfig::from_json(&config_path, &text)?;
        let ids = narrator_phonemes::PhonemeIdMap::from_voice_config(&config.raw).map_err(|e| {
            EngineError::VoiceConfig {
                path: config_path.clone(),
                reason: e.to_string(),
            }
        })?;
        Ok(Self {
            model_path: model_path.to_path_buf(),
            config_path,
            config,
            ids,
        })
    }
}

impl Family for PiperVoice {
    fn kind(&self) -> FamilyKind {
        FamilyKind::Piper
    }

    fn info(&self) -> VoiceInfo {
        VoiceInfo {
            family: FamilyKind::Piper,
            language: self.config.language.clone(),
            gender: String::new(),
            quality: self.config.quality.clone(),
            sample_rate: self.config.sample_rate,
        }
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            sample_rate: self.config.sample_rate,
            // Exact when the voice has its frames tensor; a session without it says so
            // (`Backend::supports_batching`) and runs one item per run.
            batching: Batching::Padded,
            max_item_phonemes: MAX_ITEM_PHONEMES,
            max_run_ids: usize::MAX,
            speed: true,
        }
    }

    fn espeak_voice(&self) -> &str {
        &self.config.espeak_voice
    }

    fn phoneme_ids_with_sources(
        &self,
        phonemes: &[String],
    ) -> (Vec<i64>, Vec<String>, Vec<Option<usize>>) {
        let (ids, unknown, sources) = self.ids.ids_with_sources(phonemes);
        // BOS, PAD, EOS alone: nothing to say.
        if ids.len() > 3 {
            (ids, unknown, sources)
        } else {
            (Vec::new(), unknown, Vec::new())
        }
    }

    fn default_scales(&self) -> Scales {
        self.config.scales
    }

    fn speaker_id(&self, voice: &str, given: &str) -> Result<u32, EngineError> {
        self.config.speaker_id(voice, given)
    }

    fn identity(&self) -> String {
        let size = std::fs::metadata(&self.model_path)
            .map(|m| m.len())
            .unwrap_or(0);
        format!("{size}:{}", self.config.raw)
    }

    fn open(
        &self,
        rt: &'static Runtime,
        opts: &SessionOptions,
    ) -> Result<Box<dyn Backend>, EngineError> {
        Ok(Box::new(PiperEngine::load(rt, &self.model_path, opts)?))
    }

    fn model_path(&self) -> PathBuf {
        self.model_path.clone()
    }

    fn own_files(&self) -> Vec<PathBuf> {
        vec![self.config_path.clone(), self.model_path.clone()]
    }
}

/// The voice `name` in the voices folder `dir`, if its file pair is there
/// (`NAME.onnx` + `NAME.onnx.json`).
pub fn find(dir: &Path, name: &str) -> Option<Result<PiperVoice, EngineError>> {
    let model_path = dir.join(format!("{name}.onnx"));
    let config_path = dir.join(format!("{name}.onnx.json"));
    (model_path.is_file() && config_path.is_file()).then(|| PiperVoice::load(&model_path))
}

/// The voice's name: its model file's stem.
pub fn name_of(model_path: &Path) -> String {
    model_path
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_suffix(".onnx"))
        .unwrap_or("voice")
        .to_string()
}

/// Every Piper voice in the voices folder `dir` (files `*.onnx` with a readable
/// `*.onnx.json`), by name, sorted.
pub fn list(dir: &Path) -> Vec<(String, PiperVoice)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut voices: Vec<(String, PiperVoice)> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "onnx"))
        .filter_map(|p| Some((name_of(&p), PiperVoice::load(&p).ok()?)))
        .collect();
    voices.sort_by(|a, b| a.0.cmp(&b.0));
    voices
}

/// The internal tensor holding frames per phoneme in Piper's VITS export.
pub const FRAMES_TENSOR: &str = "/Ceil_output_0";

/// One loaded voice model in one ONNX Runtime session.
pub struct PiperEngine {
    session: Session,
    plain: RunOptions,
    shrinking: RunOptions,
    arena: Arc<ArenaPolicy>,
    has_frames: bool,
    has_sid: bool,
    device: Device,
    pad_multiple: usize,
}

impl std::fmt::Debug for PiperEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PiperEngine")
            .field("has_frames", &self.has_frames)
            .field("device", &self.device)
            .finish()
    }
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
        let Opened {
            session,
            plain,
            shrinking,
            device,
        } = open_session(rt, &bytes, opts, "loading the voice model")?;
        let has_sid = session.inputs().iter().any(|i| i.name() == "sid");
        Ok(Self {
            session,
            plain,
            shrinking,
            arena: opts.cpu_arena.clone(),
            has_frames,
            has_sid,
            device,
            pad_multiple: opts.pad_multiple.max(1),
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
        self.synthesize_speakers(items, &vec![0; items.len()], scales)
    }

    fn synthesize_speakers(
        &mut self,
        items: &[&[i64]],
        speakers: &[i64],
        scales: Scales,
    ) -> Result<BatchOutput, EngineError> {
        if speakers.len() != items.len() {
            return Err(EngineError::Stopped);
        }
        if items.is_empty() {
            return Ok(BatchOutput::untimed(Vec::new(), 0.0));
        }
        if items.len() > 1 && !self.has_frames {
            let mut audio = Vec::with_capacity(items.len());
            let mut secs = 0.0;
            for (it, &speaker) in items.iter().zip(speakers) {
                let out = self.synthesize_speakers(&[it], &[speaker], scales)?;
                secs += out.inference_seconds;
                audio.extend(out.audio);
            }
            return Ok(BatchOutput::untimed(audio, secs));
        }
        if let Some(i) = items.iter().position(|it| it.is_empty()) {
            return Err(EngineError::EmptyItem { index: i });
        }
        let b = items.len();
        let t = items
            .iter()
            .map(|it| it.len())
            .max()
            .unwrap_or(0)
            .next_multiple_of(self.pad_multiple);
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
                Tensor::from_array(([b], speakers.to_vec()))
                    .map_err(&mk)?
                    .into(),
            ));
        }
        let device = self.device;
        let options = if self.arena.shrink_after(b * t) {
            &self.shrinking
        } else {
            &self.plain
        };
        let outputs = self
            .session
            .run_with_options(inputs, options)
            .map_err(|e| run_failure(e, device, b, b * t, "running the voice model"))?;
        let (shape, wave) = outputs["output"]
            .try_extract_tensor::<f32>()
            .map_err(ort_err("reading the audio output"))?;
        let total = *shape.last().unwrap_or(&0) as usize;
        let inference_seconds = started.elapsed().as_secs_f64();
        if !self.has_frames {
            return Ok(BatchOutput::untimed(
                vec![wave[..total].to_vec()],
                inference_seconds,
            ));
        }
        let (fshape, frames) = outputs[FRAMES_TENSOR]
            .try_extract_tensor::<f32>()
            .map_err(ort_err("reading the frame counts"))?;
        let p = *fshape.last().unwrap_or(&0) as usize;
        let item_frames = |i: usize| &frames[i * p..(i + 1) * p];
        let per_item: Vec<f64> = (0..b)
            .map(|i| item_frames(i).iter().map(|&f| f64::from(f)).sum())
            .collect();
        let max_frames = per_item.iter().cloned().fold(0.0, f64::max);
        // Samples per frame (the vocoder's hop length), as the padded output shows it.
        let hop = if max_frames > 0.0 {
            (total as f64 / max_frames).round()
        } else {
            0.0
        };
        let audio = (0..b)
            .map(|i| {
                let n = ((per_item[i] * hop) as usize).min(total);
                wave[i * total..i * total + n].to_vec()
            })
            .collect();
        // Each id's frames (whole numbers: VITS rounds them up) times the hop; padding
        // positions past the item's own ids are 0.
        let token_samples = (0..b)
            .map(|i| {
                item_frames(i)[..items[i].len().min(p)]
                    .iter()
                    .map(|&f| (f64::from(f) * hop) as u32)
                    .collect()
            })
            .collect();
        Ok(BatchOutput {
            audio,
            inference_seconds,
            token_samples,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_piper_config() {
        let json = r#"{"audio":{"sample_rate":22050,"quality":"medium"},"espeak":{"voice":"en-us"},
            "inference":{"noise_scale":0.5,"length_scale":1.1,"noise_w":0.7},
            "phoneme_id_map":{"_":[0]},"num_speakers":1,"language":{"code":"en_US"}}"#;
        let c = VoiceConfig::from_json(Path::new("v.json"), json).expect("valid");
        assert_eq!(c.sample_rate, 22050);
        assert_eq!(c.espeak_voice, "en-us");
        assert_eq!(
            c.scales,
            Scales {
                noise: 0.5,
                length: 1.1,
                noise_w: 0.7
            }
        );
        assert_eq!(c.language, "en_US");
    }

    #[test]
    fn a_sample_rate_of_zero_or_past_32_bits_is_refused() {
        // Found by the property `voice_config_piper` (tests/properties.rs): 4294967296 was
        // cut to a rate of 0, which the Opus resampler then divides by.
        for rate in ["0", "4294967296", "4294989346"] {
            let json = format!(
                r#"{{"audio":{{"sample_rate":{rate}}},"espeak":{{"voice":"en-us"}},"phoneme_id_map":{{"_":[0]}}}}"#
            );
            let e = VoiceConfig::from_json(Path::new("v.json"), &json).expect_err(rate);
            assert!(
                e.to_string()
                    .contains(&format!("audio.sample_rate {rate} is not a sample rate")),
                "{e}"
            );
        }
    }

    #[test]
    fn a_config_without_phoneme_map_is_refused_with_the_reason() {
        let json = r#"{"audio":{"sample_rate":22050},"espeak":{"voice":"en-us"}}"#;
        let e = VoiceConfig::from_json(Path::new("v.json"), json).expect_err("invalid");
        assert!(e.to_string().contains("phoneme_id_map"), "{e}");
    }
}
