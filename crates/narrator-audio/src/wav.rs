//! WAV: 16-bit PCM mono at the input rate, via hound.
//!
//! Used for per-segment audio (written once with [`encode_wav_file`], read back with
//! [`read_wav_i16`] when the book is assembled) and as the lossless book format. The sink
//! streams samples to disk; hound rewrites the RIFF sizes when the sink finishes.

use std::io::{Seek, Write};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::sink::{Tracked, encoded_info};
use crate::{AudioError, AudioSink, EncodedInfo, EncoderSpec};

fn wav_spec(sample_rate: u32) -> hound::WavSpec {
    hound::WavSpec {
        channels: 1,
        sample_rate,
        bits_per_sample: 16,
        sample_format: hound::SampleFormat::Int,
    }
}

/// The RIFF sizes are u32: header (44 bytes) plus data must stay under 4 GiB.
const MAX_WAV_SAMPLES: u64 = (u32::MAX as u64 - 44) / 2;

/// Streaming 16-bit mono WAV writer.
pub(crate) struct WavSink<W: Write + Seek> {
    writer: hound::WavWriter<Tracked<W>>,
    file_len: Arc<AtomicU64>,
    sample_rate: u32,
    samples_in: u64,
}

impl<W: Write + Seek> WavSink<W> {
    pub(crate) fn new(spec: &EncoderSpec, out: Tracked<W>) -> Result<Self, AudioError> {
        let file_len = out.length_handle();
        let writer = hound::WavWriter::new(out, wav_spec(spec.sample_rate))
            .map_err(|source| AudioError::WavWrite { source })?;
        Ok(WavSink {
            writer,
            file_len,
            sample_rate: spec.sample_rate,
            samples_in: 0,
        })
    }
}

impl<W: Write + Seek> AudioSink for WavSink<W> {
    fn write(&mut self, samples: &[i16]) -> Result<(), AudioError> {
        if self.samples_in + samples.len() as u64 > MAX_WAV_SAMPLES {
            return Err(AudioError::WavTooLong {
                hours: MAX_WAV_SAMPLES as f64 / f64::from(self.sample_rate) / 3600.0,
            });
        }
        let Ok(len) = u32::try_from(samples.len()) else {
            // hound's fast path takes a u32 count; no real chunk is this big, so split it.
            for part in samples.chunks(1 << 20) {
                self.write(part)?;
            }
            return Ok(());
        };
        let mut fast = self.writer.get_i16_writer(len);
        for &s in samples {
            fast.write_sample(s);
        }
        fast.flush()
            .map_err(|source| AudioError::WavWrite { source })?;
        self.samples_in += samples.len() as u64;
        Ok(())
    }

    /// WAV has no chapter marks (the manifest lists them).
    fn set_chapters(&mut self, _: &[crate::ChapterMark]) -> Result<(), AudioError> {
        Ok(())
    }

    fn finish(self: Box<Self>) -> Result<EncodedInfo, AudioError> {
        let WavSink {
            writer,
            file_len,
            sample_rate,
            samples_in,
        } = *self;
        // Rewrites the RIFF sizes and flushes the BufWriter and the caller's writer.
        writer
            .finalize()
            .map_err(|source| AudioError::WavWrite { source })?;
        Ok(encoded_info(
            samples_in,
            sample_rate,
            file_len.load(Ordering::Relaxed),
        ))
    }
}

/// Writes `samples` as a 16-bit mono WAV file at `path` (created or truncated).
pub fn encode_wav_file(path: &Path, sample_rate: u32, samples: &[i16]) -> Result<(), AudioError> {
    let spec = EncoderSpec::new(crate::AudioFormat::Wav, sample_rate);
    spec.validate()?;
    let file = std::fs::File::create(path).map_err(AudioError::io("creating the WAV file"))?;
    let mut sink = Box::new(WavSink::new(&spec, Tracked::new(file)?)?);
    sink.write(samples)?;
    sink.finish()?;
    Ok(())
}

/// The same bytes [`encode_wav_file`] writes, built in memory (object stores).
pub fn encode_wav_bytes(sample_rate: u32, samples: &[i16]) -> Result<Vec<u8>, AudioError> {
    let spec = EncoderSpec::new(crate::AudioFormat::Wav, sample_rate);
    spec.validate()?;
    let mut buf = std::io::Cursor::new(Vec::with_capacity(44 + samples.len() * 2));
    let mut sink = Box::new(WavSink::new(&spec, Tracked::new(&mut buf)?)?);
    sink.write(samples)?;
    sink.finish()?;
    Ok(buf.into_inner())
}

/// Reads a mono 16-bit integer PCM WAV file: returns `(sample_rate, samples)`.
pub fn read_wav_i16(path: &Path) -> Result<(u32, Vec<i16>), AudioError> {
    let reader = hound::WavReader::open(path).map_err(|source| AudioError::WavRead {
        path: path.to_owned(),
        source,
    })?;
    read_wav_reader(reader, path)
}

/// [`read_wav_i16`] for WAV bytes held in memory (e.g. fetched from an object store);
/// errors name the file as `<in-memory WAV>`.
pub fn decode_wav_bytes(bytes: &[u8]) -> Result<(u32, Vec<i16>), AudioError> {
    let path = Path::new("<in-memory WAV>");
    let reader = hound::WavReader::new(std::io::Cursor::new(bytes)).map_err(|source| {
        AudioError::WavRead {
            path: path.to_owned(),
            source,
        }
    })?;
    read_wav_reader(reader, path)
}

fn read_wav_reader<R: std::io::Read>(
    mut reader: hound::WavReader<R>,
    path: &Path,
) -> Result<(u32, Vec<i16>), AudioError> {
    let read_err = |source| AudioError::WavRead {
        path: path.to_owned(),
        source,
    };
    let spec = reader.spec();
    if spec.channels != 1
        || spec.bits_per_sample != 16
        || spec.sample_format != hound::SampleFormat::Int
    {
        let format = match spec.sample_format {
            hound::SampleFormat::Int => "int",
            hound::SampleFormat::Float => "float",
        };
        return Err(AudioError::UnsupportedWav {
            path: path.to_owned(),
            found: format!(
                "{} channel(s) of {}-bit {format}",
                spec.channels, spec.bits_per_sample
            ),
        });
    }
    let samples = reader
        .samples::<i16>()
        .collect::<Result<Vec<i16>, _>>()
        .map_err(read_err)?;
    Ok((spec.sample_rate, samples))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wav_bytes_equal_the_file_and_read_back() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("a.wav");
        let samples = [0i16, 1, -1, i16::MAX, i16::MIN, 1234];
        encode_wav_file(&path, 22050, &samples).expect("file");
        let bytes = encode_wav_bytes(22050, &samples).expect("bytes");
        assert_eq!(std::fs::read(&path).expect("read"), bytes);
        assert_eq!(
            decode_wav_bytes(&bytes).expect("decode"),
            (22050, samples.to_vec())
        );
        assert_eq!(
            decode_wav_bytes(b"RIFF").expect_err("short").kind(),
            "wav_read"
        );
    }
}
