//! The crate's one error type, [`AudioError`].
//!
//! Every variant keeps its cause as a `#[source]` (I/O, hound, libopus, LAME, rubato) so the
//! binary can print the whole chain, and says in one line what failed and what to do.
//! [`AudioError::kind`] gives the stable word used as metric label and `failure_kind` column.

use std::path::PathBuf;

/// What went wrong while post-processing or encoding audio.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AudioError {
    /// The output (or input) stream failed: disk full, closed pipe, permissions.
    #[error(
        "audio I/O failed while {context}; check that the output location is writable and has free space"
    )]
    Io {
        /// What the encoder was doing, e.g. "writing Ogg pages".
        context: &'static str,
        /// The underlying I/O error.
        #[source]
        source: std::io::Error,
    },

    /// The output file could not be created.
    #[error("cannot create audio file {}; check that its folder exists and is writable", .path.display())]
    Create {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },

    /// FFmpeg's libraries (AAC encoder, MP4 muxer) failed while writing an M4B file.
    #[error(
        "M4B encoding failed while {context}; check that the output location is writable and has free space (FFmpeg: {source})"
    )]
    M4b {
        /// What was being done, e.g. "writing the MP4 header".
        context: &'static str,
        /// FFmpeg's error.
        #[source]
        source: ffmpeg_next::Error,
    },

    /// FFmpeg's encoders (AAC, FLAC) failed while encoding a stream.
    #[error("{codec} encoding failed while {context} (FFmpeg: {source})")]
    Stream {
        codec: &'static str,
        /// What was being done.
        context: &'static str,
        #[source]
        source: ffmpeg_next::Error,
    },

    /// hound failed to write a WAV stream (I/O, or the 4 GiB WAV size limit was hit).
    #[error(
        "writing WAV audio failed; check that the output location is writable and has free space"
    )]
    WavWrite {
        /// The hound error.
        #[source]
        source: hound::Error,
    },

    /// The WAV output reached the format's 4 GiB limit.
    #[error(
        "WAV output is limited to 4 GiB ({hours:.1} h at this rate); choose opus or mp3 for this book"
    )]
    WavTooLong {
        /// How many hours fit at the spec's rate.
        hours: f64,
    },

    /// A WAV file could not be opened or parsed.
    #[error("cannot read WAV file {}; check that it exists and is a valid WAV file", .path.display())]
    WavRead {
        /// The file that failed.
        path: PathBuf,
        /// The hound error.
        #[source]
        source: hound::Error,
    },

    /// A WAV file parsed fine but is not the mono 16-bit integer PCM that narrator stores.
    #[error("WAV file {} is {found}, expected mono 16-bit integer PCM; re-render the segment", .path.display())]
    UnsupportedWav {
        /// The file that failed.
        path: PathBuf,
        /// What the file actually holds, e.g. "stereo 16-bit int".
        found: String,
    },

    /// libopus refused to create the encoder or to encode a frame.
    #[error("Opus encoding failed in {}; this is a bug or a broken libopus build, please report it", .source.function())]
    Opus {
        /// The libopus error.
        #[source]
        source: opus::Error,
    },

    /// LAME refused the configuration (e.g. an unsupported sample rate).
    #[error(
        "cannot configure the MP3 encoder for {sample_rate} Hz mono; use a rate of 8000-48000 Hz or choose wav/opus"
    )]
    Mp3Setup {
        /// The input sample rate that was asked for.
        sample_rate: u32,
        /// The LAME error.
        #[source]
        source: mp3lame_encoder::BuildError,
    },

    /// LAME failed while encoding or flushing.
    #[error("MP3 encoding failed; this is a bug or a broken libmp3lame build, please report it")]
    Mp3Encode {
        /// The LAME error.
        #[source]
        source: mp3lame_encoder::EncodeError,
    },

    /// rubato could not be set up for this rate pair.
    #[error(
        "cannot set up resampling from {from} Hz to {to} Hz; use a common sample rate such as 22050 Hz"
    )]
    ResamplerSetup {
        /// Input rate.
        from: u32,
        /// Output rate.
        to: u32,
        /// The rubato error.
        #[source]
        source: rubato::ResamplerConstructionError,
    },

    /// rubato failed while resampling (should not happen with correctly sized buffers).
    #[error("resampling failed; this is a bug in narrator-audio, please report it")]
    Resample {
        /// The rubato error.
        #[source]
        source: rubato::ResampleError,
    },

    /// An internal invariant failed; never the caller's fault.
    #[error("internal error in narrator-audio: {what}; please report it")]
    Internal {
        /// Which invariant.
        what: &'static str,
    },

    /// The [`crate::EncoderSpec`] cannot be honoured.
    #[error("invalid encoder settings: {reason}")]
    InvalidSpec {
        /// What is wrong and how to fix it.
        reason: String,
    },

    /// A format name that is not one of `wav`, `opus`, `mp3`, `m4b`.
    #[error("unknown audio format {given:?}; choose one of: wav, opus, mp3, m4b")]
    UnknownFormat {
        /// The rejected input.
        given: String,
    },
}

impl AudioError {
    /// A stable one-word label for metrics and the `failure_kind` column.
    pub fn kind(&self) -> &'static str {
        match self {
            AudioError::Io { .. } => "audio_io",
            AudioError::Create { .. } => "audio_create",
            AudioError::M4b { .. } => "m4b_encode",
            AudioError::Stream { .. } => "stream_encode",
            AudioError::WavWrite { .. } => "wav_write",
            AudioError::WavTooLong { .. } => "wav_too_long",
            AudioError::WavRead { .. } => "wav_read",
            AudioError::UnsupportedWav { .. } => "unsupported_wav",
            AudioError::Opus { .. } => "opus_encode",
            AudioError::Mp3Setup { .. } => "mp3_setup",
            AudioError::Mp3Encode { .. } => "mp3_encode",
            AudioError::ResamplerSetup { .. } => "resampler_setup",
            AudioError::Resample { .. } => "resample",
            AudioError::Internal { .. } => "audio_internal",
            AudioError::InvalidSpec { .. } => "invalid_encoder_spec",
            AudioError::UnknownFormat { .. } => "unknown_audio_format",
        }
    }

    pub(crate) fn io(context: &'static str) -> impl FnOnce(std::io::Error) -> AudioError {
        move |source| AudioError::Io { context, source }
    }

    pub(crate) fn m4b(context: &'static str) -> impl FnOnce(ffmpeg_next::Error) -> AudioError {
        move |source| AudioError::M4b { context, source }
    }

    pub(crate) fn invalid_spec(reason: impl Into<String>) -> AudioError {
        AudioError::InvalidSpec {
            reason: reason.into(),
        }
    }
}

impl From<opus::Error> for AudioError {
    fn from(source: opus::Error) -> Self {
        AudioError::Opus { source }
    }
}

impl From<mp3lame_encoder::EncodeError> for AudioError {
    fn from(source: mp3lame_encoder::EncodeError) -> Self {
        AudioError::Mp3Encode { source }
    }
}

impl From<rubato::ResampleError> for AudioError {
    fn from(source: rubato::ResampleError) -> Self {
        AudioError::Resample { source }
    }
}
