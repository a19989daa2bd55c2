//! # narrator-audio
//!
//! Everything between "float samples from the model" and "bytes in a file":
//!
//! ```text
//! f32 from VITS ──peak_normalize_to_i16──▶ i16 segment ──encode_wav_file──▶ segment.wav
//!                                                                              │
//!            read_wav_i16 ◀────────────────────────────────────────────────────┘
//!                 │  + Pauses::samples (silence between sentences/paragraphs/chapters)
//!                 ▼
//!   create_encoder(EncoderSpec) ─▶ Box<dyn AudioSink>: write(chunk)… finish()
//!                                    ├─ WAV  16-bit mono, input rate (hound)
//!                                    ├─ Opus 48 kHz (rubato FFT) → libopus → Ogg, chapter tags
//!                                    ├─ MP3  LAME 64 kbit/s mono, Info tag, ID3v2 CHAP/CTOC
//!                                    └─ M4B  FFmpeg AAC-LC 64 kbit/s → MP4 (chapter track,
//!                                            iTunes tags, cover): create_file_encoder only
//! ```
//!
//! Everything is synchronous and streaming: a sink holds at most one chunk plus codec
//! state, so an hours-long book never sits in memory. Run it on a blocking thread.

mod error;
mod format;
mod m4b;
mod mp3;
mod ogg_opus;
mod pcm;
mod resample;
mod sink;
mod stream;
mod wav;

pub use error::AudioError;
pub use format::AudioFormat;
pub use mp3::Mp3Stream;
pub use pcm::{PauseKind, Pauses, peak_normalize_to_i16};
pub use resample::resample_for_opus;
pub use sink::{
    AudioSink, ChapterMark, EncodedInfo, EncoderSpec, EncoderTuning, Tags, create_encoder,
    create_file_encoder,
};
pub use stream::{CodecStream, StreamCodec};
pub use wav::{decode_wav_bytes, encode_wav_bytes, encode_wav_file, read_wav_i16};
