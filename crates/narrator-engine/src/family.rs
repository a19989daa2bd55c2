//! Model families: what a family of voice models takes and gives, declared once.
//!
//! A [`Family`] is one installed voice of one model family (a Piper/VITS voice file, a
//! Kokoro-82M voice or blend). It says how its text becomes ids (the espeak-ng voice and
//! the id map), what its runs accept ([`Capabilities`]: sample rate, how several
//! utterances share a run, the longest input, whether speed is an input) and how to open
//! a session ([`Family::open`]). The pipeline, batcher, planner, worker and assembler read
//! only this; which family a voice is of is a type, [`FamilyKind`], that the voice itself
//! says ([`Family::kind`]). [`crate::voice`] is the one place that names every family.

use std::path::PathBuf;

use crate::{Backend, EngineError, Scales, SessionOptions, runtime::Runtime};

/// Phonemes per utterance before a cut at a word (VITS quality and memory degrade on very
/// long inputs; Kokoro takes at most 510 ids and sounds rushed near that).
pub const MAX_ITEM_PHONEMES: usize = 400;

/// The model families narrator runs. Serialized (JSON outputs, metric labels, worker
/// rows) as its lowercase name, `piper` or `kokoro`.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum FamilyKind {
    /// Piper (VITS) voices: one `NAME.onnx` + `NAME.onnx.json` pair per voice
    /// ([`crate::piper`]).
    Piper,
    /// Kokoro-82M: one installation, `kokoro/`, of 54 voices and their blends
    /// ([`crate::kokoro`]).
    Kokoro,
}

impl FamilyKind {
    /// Every family, in the order voices are listed.
    pub const ALL: [FamilyKind; 2] = [FamilyKind::Piper, FamilyKind::Kokoro];

    /// Its name: `piper`, `kokoro` (as serialized).
    pub fn as_str(self) -> &'static str {
        match self {
            FamilyKind::Piper => "piper",
            FamilyKind::Kokoro => "kokoro",
        }
    }
}

impl std::fmt::Display for FamilyKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // `pad`: widths and alignment (`{:<7}`) apply, as to a string.
        f.pad(self.as_str())
    }
}

impl std::str::FromStr for FamilyKind {
    type Err = String;

    /// A family by its name, in any case.
    fn from_str(s: &str) -> Result<Self, String> {
        FamilyKind::ALL
            .into_iter()
            .find(|k| k.as_str().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| format!("unknown model family `{s}`: use piper or kokoro"))
    }
}

/// How several utterances share one engine run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Batching {
    /// Padded to the longest and run as one batch, trimmed exactly per item (a run costs
    /// longest × items).
    Padded,
    /// No batch dimension: utterances are packed end to end into one input and the audio
    /// is cut back at the exact token boundaries the model's durations give (a run costs
    /// the sum of its items, up to [`Capabilities::max_run_ids`]).
    Packed,
    /// One utterance per run.
    Single,
}

/// What a family's runs accept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Capabilities {
    /// Output sample rate in Hz.
    pub sample_rate: u32,
    /// How utterances share a run.
    pub batching: Batching,
    /// Most phonemes one utterance may have (longer ones are cut at words first).
    pub max_item_phonemes: usize,
    /// Most ids one run accepts (packed runs: all items together).
    pub max_run_ids: usize,
    /// Whether the model takes a speaking rate (`--speed`) and honours it.
    pub speed: bool,
}

/// What `narrator voices` shows of a voice.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct VoiceInfo {
    /// The model family (serialized `piper`, `kokoro`).
    pub family: FamilyKind,
    /// Language code, e.g. `en_US`, `en-gb`.
    pub language: String,
    /// `female`, `male`, or empty when the voice does not say.
    pub gender: String,
    /// Piper's quality tier (`medium`) or Kokoro's published grade (`A`, `C+`); may be empty.
    pub quality: String,
    /// Output sample rate in Hz.
    pub sample_rate: u32,
}

/// One installed voice of one model family.
pub trait Family: Send + Sync + std::fmt::Debug {
    /// Which family it is.
    fn kind(&self) -> FamilyKind;
    /// What `narrator voices` lists.
    fn info(&self) -> VoiceInfo;
    /// What its runs accept.
    fn capabilities(&self) -> Capabilities;
    /// The espeak-ng voice that phonemizes its text.
    fn espeak_voice(&self) -> &str;
    /// Maps one utterance's phonemes to the ids one run takes, and lists the phonemes it
    /// has no id for (skipped). Empty ids: nothing to say.
    fn phoneme_ids(&self, phonemes: &[String]) -> (Vec<i64>, Vec<String>) {
        let (ids, unknown, _) = self.phoneme_ids_with_sources(phonemes);
        (ids, unknown)
    }
    /// The same, with each id's phoneme: the index in `phonemes` it was made from, `None`
    /// for ids the family adds (boundaries). Word timings follow these from the model's
    /// per-id durations back to the words.
    fn phoneme_ids_with_sources(
        &self,
        phonemes: &[String],
    ) -> (Vec<i64>, Vec<String>, Vec<Option<usize>>);
    /// The inference scales it runs with by default ([`crate::ScaleOverrides::resolve`]
    /// applies a user's settings to them).
    fn default_scales(&self) -> Scales;
    /// The speaker id for `given` (a name or a number), or why it has none such.
    fn speaker_id(&self, voice: &str, given: &str) -> Result<u32, EngineError>;
    /// A string that changes whenever its audio would (model size, config, style):
    /// hashed into a job's identity, so resuming never mixes two voices.
    fn identity(&self) -> String;
    /// Opens a session on the calling thread.
    fn open(
        &self,
        rt: &'static Runtime,
        opts: &SessionOptions,
    ) -> Result<Box<dyn Backend>, EngineError>;
    /// The graphs installed for this voice that a session on `device` may load, by the
    /// name [`SessionOptions::graph`] takes, the family's default for the device first.
    /// Empty where there is one graph only (or a setting fixed it): nothing to choose.
    /// A calibration on CPU times them side by side and keeps the faster.
    fn graphs(&self, _device: crate::Device) -> Vec<&'static str> {
        Vec::new()
    }
    /// The model file its sessions load.
    fn model_path(&self) -> PathBuf;
    /// The files `narrator voices remove` deletes (none where the voice shares its files
    /// with others of its family).
    fn own_files(&self) -> Vec<PathBuf>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_family_is_named_serialized_and_parsed_as_its_lowercase_name() {
        for kind in FamilyKind::ALL {
            let json = serde_json::to_value(kind).expect("serializes");
            assert_eq!(json, serde_json::Value::from(kind.as_str()));
            assert_eq!(serde_json::from_value::<FamilyKind>(json).ok(), Some(kind));
            assert_eq!(kind.to_string(), kind.as_str());
            assert_eq!(kind.as_str().to_uppercase().parse::<FamilyKind>(), Ok(kind));
        }
        assert_eq!(format!("[{:<7}]", FamilyKind::Piper), "[piper  ]");
        let e = "vits".parse::<FamilyKind>().expect_err("unknown");
        assert!(e.contains("piper or kokoro"), "{e}");
    }
}
