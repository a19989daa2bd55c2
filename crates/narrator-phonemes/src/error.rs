//! The crate's one error type. Every message is a single line that says what was wrong
//! and what to do; [`PhonemeError::kind`] is the stable word for metrics and databases.

use std::path::PathBuf;

/// What can go wrong while turning text into phoneme ids.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PhonemeError {
    /// The directory given to [`crate::Phonemizer::new`] has no usable `espeak-ng-data`.
    #[error(
        "espeak-ng data not found at {}: run ops/setup.sh (it extracts Piper's espeak-ng-data into .deps/)",
        .path.display()
    )]
    DataNotFound {
        /// The `espeak-ng-data` directory (or file inside it) that is missing.
        path: PathBuf,
    },

    /// `espeak_Initialize` refused the data directory.
    #[error(
        "espeak-ng failed to initialize with data at {} (code {code}): the data may be corrupt or from another espeak-ng version; re-run ops/setup.sh",
        .path.display()
    )]
    Initialize {
        /// The directory that contains `espeak-ng-data`.
        path: PathBuf,
        /// What `espeak_Initialize` returned.
        code: i32,
    },

    /// espeak-ng is process-global and was already initialized with other data.
    #[error(
        "espeak-ng is already initialized with data at {} in this process, so {} cannot be used: use one espeak-ng data directory per process",
        .active.display(),
        .requested.display()
    )]
    DataPathConflict {
        /// The data directory espeak-ng is running with.
        active: PathBuf,
        /// The data directory that was asked for.
        requested: PathBuf,
    },

    /// `espeak_SetVoiceByName` did not find the voice.
    #[error(
        "espeak-ng voice '{voice}' not found in the espeak-ng data: check the voice config's espeak.voice (e.g. 'en-us')"
    )]
    UnknownVoice {
        /// The voice name that was asked for.
        voice: String,
    },

    /// espeak-ng gave no phonemes for a clause (it could not decode the text).
    #[error(
        "espeak-ng could not phonemize the text at byte {offset}: report the text that caused it; phonemizing the rest is not possible"
    )]
    Engine {
        /// Byte offset in the (NUL-free) text where espeak-ng stopped.
        offset: usize,
    },

    /// The voice's `.onnx.json` is not a Piper voice config this crate understands.
    #[error("voice config: {problem}: use the .onnx.json that belongs to a Piper voice")]
    VoiceConfig {
        /// What is wrong, e.g. "no phoneme_id_map object".
        problem: VoiceConfigProblem,
    },
}

/// Which part of a voice config is unusable (kept structured, not as free text).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum VoiceConfigProblem {
    /// `phoneme_id_map` is absent or not an object.
    #[error("no phoneme_id_map object")]
    MissingIdMap,
    /// A value in `phoneme_id_map` is not a list of integers.
    #[error("phoneme_id_map entry '{0}' is not a list of integers")]
    BadIds(String),
    /// One of the special symbols `^`, `$`, `_` has no ids.
    #[error("phoneme_id_map lacks the special symbol '{0}'")]
    MissingSymbol(&'static str),
    /// `vowel_clusters` is not a list of lists of strings.
    #[error("vowel_clusters is not a list of lists of phoneme strings")]
    BadVowelClusters,
    /// `espeak.voice` is absent or not a string.
    #[error("no espeak.voice string")]
    MissingEspeakVoice,
    /// `phoneme_type` is something other than `espeak`.
    #[error("phoneme_type '{0}' is not supported (only 'espeak')")]
    UnsupportedPhonemeType(String),
}

impl PhonemeError {
    /// A stable, lowercase word for this kind of error: the metric label and the
    /// `failure_kind` stored with a failed segment.
    pub fn kind(&self) -> &'static str {
        match self {
            PhonemeError::DataNotFound { .. } => "espeak_data_missing",
            PhonemeError::Initialize { .. } => "espeak_init",
            PhonemeError::DataPathConflict { .. } => "espeak_data_conflict",
            PhonemeError::UnknownVoice { .. } => "espeak_voice",
            PhonemeError::Engine { .. } => "espeak_engine",
            PhonemeError::VoiceConfig { .. } => "voice_config",
        }
    }
}

impl From<VoiceConfigProblem> for PhonemeError {
    fn from(problem: VoiceConfigProblem) -> Self {
        PhonemeError::VoiceConfig { problem }
    }
}
