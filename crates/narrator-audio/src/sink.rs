//! The streaming encoder interface: [`AudioSink`], [`EncoderSpec`], [`create_encoder`].
//!
//! A sink takes mono i16 chunks as the pipeline produces them and writes encoded bytes
//! straight to its writer, so memory stays bounded by one chunk plus codec state, however
//! long the book. `finish` consumes the sink: it flushes codec delay, fixes up headers that
//! need the final length (WAV sizes, MP3 LAME/ID3 tags, Ogg end-of-stream) and flushes the
//! writer. Seek is required because WAV and MP3 headers are rewritten at the end.

use std::io::{self, BufWriter, Seek, SeekFrom, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

use crate::{AudioError, AudioFormat};

/// A chapter start, written as Vorbis-comment chapter tags (Opus) or ID3 CHAP frames (MP3).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChapterMark {
    /// Chapter title as shown by players.
    pub title: String,
    /// Start time from the beginning of the file, in seconds.
    pub start_seconds: f64,
}

/// The tags written into a file (ignored by WAV). Each format has its own names for
/// them: Vorbis comments in Opus, ID3v2.3 frames in MP3, iTunes atoms in M4B.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Tags {
    /// Track title: the chapter's for a chapter file, the book's for the book file.
    pub title: Option<String>,
    /// The book's author (ARTIST, TPE1, ©ART).
    pub artist: Option<String>,
    /// The book's title (ALBUM, TALB, ©alb).
    pub album: Option<String>,
    /// Who or what reads it: `narrator (VOICE)` (COMPOSER, TCOM, ©wrt, as audiobook
    /// taggers do).
    pub narrator: Option<String>,
    /// Publication date or year (DATE, TYER, ©day).
    pub date: Option<String>,
    /// BCP 47 language tag (LANGUAGE, TLAN as ISO 639-2, the MP4 track language).
    pub language: Option<String>,
    /// Publisher (ORGANIZATION, TPUB, ©pub).
    pub publisher: Option<String>,
    /// Genre (GENRE, TCON, ©gen); `Audiobook` for narrator's outputs.
    pub genre: Option<String>,
    /// Cover image (METADATA_BLOCK_PICTURE, APIC, covr).
    pub cover: Option<narrator_core::Cover>,
}

/// What to encode and how.
#[derive(Debug, Clone, PartialEq)]
pub struct EncoderSpec {
    /// Output format.
    pub format: AudioFormat,
    /// Rate of the mono i16 samples given to [`AudioSink::write`].
    pub sample_rate: u32,
    /// Tags (ignored by WAV).
    pub tags: Tags,
    /// Chapter marks, in ascending start order (ignored by WAV).
    pub chapters: Vec<ChapterMark>,
    /// How hard the lossy encoders work (the defaults were chosen by measurement).
    pub tuning: EncoderTuning,
}

/// Effort settings of the lossy encoders. The defaults were chosen by measuring CPU time
/// and the decoded signal's SNR on the shipped voice's speech (docs/BENCHMARKS.md, issue
/// 18: `cargo test -p narrator-audio --release --test encoders -- --ignored speech_effort`):
/// Opus complexity 5 costs 18 CPU s per hour of speech against 66 at complexity 10 (where
/// libopus spends it on SILK/hybrid mode decisions) for 0.3 dB less SNR; CELT-only mode and
/// the band cap gained nothing at 5. LAME stays at its default `-q 3` (`-q 2` costs twice
/// the CPU; `-q 5` the same as 3; `-q 7` half, but LAME rates it "ok quality" and a
/// waveform SNR cannot see what its cheaper noise shaping loses).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EncoderTuning {
    /// libopus complexity, 0 (cheapest) to 10.
    pub opus_complexity: u8,
    /// libopus in its CELT-only mode (`OPUS_APPLICATION_RESTRICTED_LOWDELAY`): no
    /// SILK/hybrid mode decisions, the same transform codec for every frame.
    pub opus_celt_only: bool,
    /// Caps Opus's coded band at what the input rate can hold (super-wideband, 12 kHz,
    /// for voices at 24 kHz or less) instead of letting the encoder pick fullband.
    pub opus_band_cap: bool,
    /// LAME algorithm quality, 0 (best, slowest) to 9 (fastest).
    pub mp3_quality: u8,
}

impl Default for EncoderTuning {
    fn default() -> Self {
        EncoderTuning {
            opus_complexity: 5,
            opus_celt_only: false,
            opus_band_cap: false,
            mp3_quality: 3,
        }
    }
}

impl EncoderSpec {
    /// A spec with no tags and no chapters.
    pub fn new(format: AudioFormat, sample_rate: u32) -> Self {
        EncoderSpec {
            format,
            sample_rate,
            tags: Tags::default(),
            chapters: Vec::new(),
            tuning: EncoderTuning::default(),
        }
    }

    /// Checks what every encoder relies on: a usable rate and sane chapter marks.
    pub(crate) fn validate(&self) -> Result<(), AudioError> {
        if !(1000..=384_000).contains(&self.sample_rate) {
            return Err(AudioError::invalid_spec(format!(
                "sample rate {} Hz is out of range; pass the voice's rate (e.g. 22050)",
                self.sample_rate
            )));
        }
        let mut previous = 0.0f64;
        for (i, c) in self.chapters.iter().enumerate() {
            if !c.start_seconds.is_finite() || c.start_seconds < previous {
                return Err(AudioError::invalid_spec(format!(
                    "chapter {} {:?} starts at {} s, before the previous one or not a number; \
                     pass chapters sorted by start time",
                    i + 1,
                    c.title,
                    c.start_seconds
                )));
            }
            previous = c.start_seconds;
        }
        Ok(())
    }
}

/// What an encoder wrote, returned by [`AudioSink::finish`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EncodedInfo {
    /// Input samples received (at the input rate).
    pub samples_in: u64,
    /// Duration of the audio, `samples_in / sample_rate`.
    pub seconds: f64,
    /// Bytes of the finished file.
    pub bytes: u64,
}

/// A streaming encoder: write chunks of mono i16 samples as they come, then finish.
pub trait AudioSink {
    /// Encodes one chunk of mono samples at the spec's rate. Chunks may have any length.
    fn write(&mut self, samples: &[i16]) -> Result<(), AudioError>;

    /// Writes `samples` samples of silence (a pause) without allocating them all at once.
    fn write_silence(&mut self, samples: usize) -> Result<(), AudioError> {
        const ZEROS: [i16; 4096] = [0; 4096];
        let mut left = samples;
        while left > 0 {
            let n = left.min(ZEROS.len());
            self.write(&ZEROS[..n])?;
            left -= n;
        }
        Ok(())
    }

    /// Moves the chapter marks given at creation to `chapters`: the same titles in the
    /// same order, with the starts now known. For a book encoded while its parts were
    /// still being synthesized: the header that lists the chapters (Opus comments, MP3
    /// CHAP frames) is rewritten in place by [`AudioSink::finish`], which its fixed-width
    /// times allow. An error leaves the sink as it was: encode the file again with the
    /// final chapters in the spec (M4B always needs this; WAV has no chapters).
    fn set_chapters(&mut self, chapters: &[ChapterMark]) -> Result<(), AudioError>;

    /// Flushes the codec and fixes up the headers. An empty stream gives a valid, empty file.
    fn finish(self: Box<Self>) -> Result<EncodedInfo, AudioError>;
}

/// `spec` with its chapters' starts moved to those of `chapters` (see
/// [`AudioSink::set_chapters`]): the count and titles must be those of `spec`.
pub(crate) fn with_chapter_starts(
    spec: &EncoderSpec,
    chapters: &[ChapterMark],
) -> Result<EncoderSpec, AudioError> {
    let same_titles = spec.chapters.len() == chapters.len()
        && spec
            .chapters
            .iter()
            .zip(chapters)
            .all(|(a, b)| a.title == b.title);
    if !same_titles {
        return Err(AudioError::invalid_spec(format!(
            "the final chapter marks ({}) are not the {} chapters the file was created with; \
             give the same titles in the same order",
            chapters.len(),
            spec.chapters.len()
        )));
    }
    let moved = EncoderSpec {
        chapters: chapters.to_vec(),
        ..spec.clone()
    };
    moved.validate()?;
    Ok(moved)
}

/// Creates the streaming encoder for `spec.format`, writing to `out` (wrapped in a buffer).
/// M4B is written by FFmpeg's muxer, which needs a file: use [`create_file_encoder`].
pub fn create_encoder<W: Write + Seek + Send + 'static>(
    spec: &EncoderSpec,
    out: W,
) -> Result<Box<dyn AudioSink + Send>, AudioError> {
    spec.validate()?;
    let out = Tracked::new(out)?;
    Ok(match spec.format {
        AudioFormat::Wav => Box::new(crate::wav::WavSink::new(spec, out)?),
        AudioFormat::Opus => Box::new(crate::ogg_opus::OggOpusSink::new(spec, out)?),
        AudioFormat::Mp3 => Box::new(crate::mp3::Mp3Sink::new(spec, out)?),
        AudioFormat::M4b => {
            return Err(AudioError::invalid_spec(
                "M4B is written to a file by FFmpeg's muxer; use create_file_encoder",
            ));
        }
    })
}

/// Creates the streaming encoder for `spec.format`, writing the file at `path` (created
/// or truncated). Every format, M4B included.
pub fn create_file_encoder(
    spec: &EncoderSpec,
    path: &std::path::Path,
) -> Result<Box<dyn AudioSink + Send>, AudioError> {
    if spec.format == AudioFormat::M4b {
        spec.validate()?;
        return Ok(Box::new(crate::m4b::M4bSink::new(spec, path)?));
    }
    let file = std::fs::File::create(path).map_err(|source| AudioError::Create {
        path: path.to_path_buf(),
        source,
    })?;
    create_encoder(spec, file)
}

pub(crate) fn encoded_info(samples_in: u64, sample_rate: u32, bytes: u64) -> EncodedInfo {
    EncodedInfo {
        samples_in,
        seconds: samples_in as f64 / f64::from(sample_rate),
        bytes,
    }
}

/// The caller's writer behind a `BufWriter`, tracking the position and the furthest byte
/// written relative to where it started, so `finish` can report the file size without
/// asking the OS and headers can be rewritten in place.
pub(crate) struct Tracked<W: Write + Seek> {
    inner: BufWriter<W>,
    base: u64,
    pos: u64,
    end: u64,
    /// Mirror of `end` for sinks whose codec library keeps the writer (hound).
    shared_end: Arc<AtomicU64>,
}

impl<W: Write + Seek> Tracked<W> {
    pub(crate) fn new(mut out: W) -> Result<Self, AudioError> {
        let base = out
            .stream_position()
            .map_err(AudioError::io("finding the start of the output"))?;
        Ok(Tracked {
            inner: BufWriter::with_capacity(64 * 1024, out),
            base,
            pos: 0,
            end: 0,
            shared_end: Arc::new(AtomicU64::new(0)),
        })
    }

    /// A handle that reads the file length after the writer has been moved away.
    pub(crate) fn length_handle(&self) -> Arc<AtomicU64> {
        Arc::clone(&self.shared_end)
    }

    /// Bytes from the start position to the furthest byte written.
    pub(crate) fn len(&self) -> u64 {
        self.end
    }

    /// Flushes everything down to the caller's writer and returns the file length.
    pub(crate) fn finish(self) -> Result<u64, AudioError> {
        let end = self.end;
        let mut out = self.inner.into_inner().map_err(|e| AudioError::Io {
            context: "flushing the encoded audio",
            source: e.into_error(),
        })?;
        out.flush()
            .map_err(AudioError::io("flushing the encoded audio"))?;
        Ok(end)
    }
}

impl<W: Write + Seek> Write for Tracked<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.pos += n as u64;
        if self.pos > self.end {
            self.end = self.pos;
            self.shared_end.store(self.end, Ordering::Relaxed);
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

impl<W: Write + Seek> Seek for Tracked<W> {
    fn seek(&mut self, pos: SeekFrom) -> io::Result<u64> {
        // Positions seen by the codecs are relative to where the output started.
        let target = match pos {
            SeekFrom::Start(p) => SeekFrom::Start(self.base + p),
            other => other,
        };
        let abs = self.inner.seek(target)?;
        self.pos = abs.checked_sub(self.base).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                "seek before the start of the output",
            )
        })?;
        Ok(self.pos)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec_with(chapters: &[(&str, f64)]) -> EncoderSpec {
        EncoderSpec {
            chapters: chapters
                .iter()
                .map(|(t, s)| ChapterMark {
                    title: (*t).to_owned(),
                    start_seconds: *s,
                })
                .collect(),
            ..EncoderSpec::new(AudioFormat::Wav, 22050)
        }
    }

    #[test]
    fn unsorted_or_nan_chapters_are_rejected() {
        assert!(spec_with(&[("a", 0.0), ("b", 2.0)]).validate().is_ok());
        let err = spec_with(&[("a", 3.0), ("b", 2.0)]).validate().err();
        assert_eq!(err.map(|e| e.kind()), Some("invalid_encoder_spec"));
        assert!(spec_with(&[("a", f64::NAN)]).validate().is_err());
        assert!(EncoderSpec::new(AudioFormat::Mp3, 0).validate().is_err());
    }

    #[test]
    fn tracked_reports_length_relative_to_start_and_survives_rewrites() -> Result<(), AudioError> {
        let mut cursor = io::Cursor::new(Vec::new());
        cursor
            .write_all(b"prefix")
            .map_err(AudioError::io("test"))?;
        let mut t = Tracked::new(cursor)?;
        t.write_all(b"0123456789").map_err(AudioError::io("test"))?;
        t.seek(SeekFrom::Start(2)).map_err(AudioError::io("test"))?;
        t.write_all(b"ab").map_err(AudioError::io("test"))?;
        assert_eq!(t.len(), 10);
        assert_eq!(t.finish()?, 10);
        Ok(())
    }
}
