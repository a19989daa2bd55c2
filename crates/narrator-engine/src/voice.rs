//! Voices on disk. A Piper voice is `NAME.onnx` next to `NAME.onnx.json` (its JSON config
//! says the sample rate, the espeak-ng voice, the phoneme id map and the default inference
//! scales); Kokoro voices live in one installation, `kokoro/` ([`crate::kokoro`]).
//! [`Voice::find`] is the one place that names every family.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::family::{Batching, Capabilities, Family, VoiceInfo};
use crate::runtime::Runtime;
use crate::{Backend, EngineError, PiperEngine, SessionOptions};

/// Inference scales of a VITS voice (`scales` input: noise, length, noise_w).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Scales {
    /// Noise added to the prior (expressiveness); 0 makes output deterministic.
    pub noise: f32,
    /// Speaking rate: larger is slower.
    pub length: f32,
    /// Noise of the duration predictor; 0 makes durations deterministic.
    pub noise_w: f32,
}

impl Scales {
    /// Scales that make synthesis deterministic (used to compare batched and single runs).
    pub const DETERMINISTIC: Scales = Scales {
        noise: 0.0,
        length: 1.0,
        noise_w: 0.0,
    };
}

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

/// An installed voice: its name and its model family.
#[derive(Debug, Clone)]
pub struct Voice {
    /// Name, e.g. `en_US-joe-medium` (a Piper file stem) or `af_heart`,
    /// `af_bella:2+af_sky:1` (a Kokoro voice or blend, as written by [`Voice::find`]).
    pub name: String,
    /// Its family: ids, capabilities, sessions.
    pub family: Arc<dyn Family>,
}

impl Voice {
    /// Loads the voice `name` from the voices folder `dir`: a Piper voice
    /// (`NAME.onnx` + `NAME.onnx.json`), or a Kokoro voice or blend
    /// (`af_heart`, `af_bella:2+af_sky:1`) from `dir/kokoro`.
    pub fn find(dir: &Path, name: &str) -> Result<Self, EngineError> {
        let model_path = dir.join(format!("{name}.onnx"));
        let config_path = dir.join(format!("{name}.onnx.json"));
        if model_path.is_file() && config_path.is_file() {
            return Self::load(&model_path);
        }
        if let Some(spec) = crate::kokoro::VoiceSpec::parse(name)? {
            let voice = crate::kokoro::KokoroVoice::open(&dir.join(crate::kokoro::DIR), &spec)?;
            return Ok(Self {
                name: spec.to_string(),
                family: Arc::new(voice),
            });
        }
        let installed = list_voices(dir)
            .map(|v| {
                let mut names: Vec<String> = v
                    .iter()
                    .filter(|v| v.family.info().family == "piper")
                    .map(|v| v.name.clone())
                    .collect();
                if v.iter().any(|v| v.family.info().family == "kokoro") {
                    names.push("the Kokoro voices (af_heart, ...)".into());
                }
                names.join(", ")
            })
            .unwrap_or_default();
        Err(EngineError::UnknownVoice {
            name: name.to_string(),
            dir: dir.to_path_buf(),
            installed: if installed.is_empty() {
                "none".into()
            } else {
                installed
            },
        })
    }

    /// Loads a Piper voice from its `.onnx` path (the config sits beside it).
    pub fn load(model_path: &Path) -> Result<Self, EngineError> {
        let voice = PiperVoice::load(model_path)?;
        let name = model_path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(".onnx"))
            .unwrap_or("voice")
            .to_string();
        Ok(Self {
            name,
            family: Arc::new(voice),
        })
    }

    /// What `narrator voices` shows of it.
    pub fn info(&self) -> VoiceInfo {
        self.family.info()
    }

    /// The model file its sessions load.
    pub fn model_path(&self) -> PathBuf {
        self.family.model_path()
    }
}

/// The family a voice name belongs to, from the name alone (for status lines and
/// figures, where the voice may not be installed): `kokoro` for a Kokoro voice or blend,
/// else `piper`.
pub fn family_of(name: &str) -> &'static str {
    match crate::kokoro::VoiceSpec::parse(name) {
        Ok(Some(_)) | Err(_) => "kokoro",
        Ok(None) => "piper",
    }
}

/// Phonemes per utterance before a cut at a word (VITS quality and memory degrade on very
/// long inputs; Kokoro takes at most 510 ids and sounds rushed near that).
pub const MAX_ITEM_PHONEMES: usize = 400;

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
    fn info(&self) -> VoiceInfo {
        VoiceInfo {
            family: "piper",
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

/// Every voice in `dir` (Piper: files `*.onnx` with a readable `*.onnx.json`; Kokoro:
/// every voice of an installation in `dir/kokoro`), Piper voices first, each sorted by name.
pub fn list_voices(dir: &Path) -> Result<Vec<Voice>, EngineError> {
    let entries = std::fs::read_dir(dir).map_err(|source| EngineError::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    let mut voices = Vec::new();
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().is_some_and(|e| e == "onnx")
            && let Ok(v) = Voice::load(&path)
        {
            voices.push(v);
        }
    }
    voices.sort_by(|a, b| a.name.cmp(&b.name));
    voices.extend(crate::kokoro::list(&dir.join(crate::kokoro::DIR)));
    Ok(voices)
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

    #[test]
    fn an_unknown_voice_names_the_installed_ones() {
        let dir = std::env::temp_dir().join(format!("narrator-voices-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("tmp");
        let e = Voice::find(&dir, "xx_XX-nobody-low").expect_err("unknown");
        assert_eq!(e.kind(), "unknown_voice");
        assert!(e.to_string().contains("narrator voices"), "{e}");
    }
}
