//! AAC and FLAC made as they are sent (an HTTP response), by FFmpeg's native encoders
//! without a muxer: AAC as ADTS (a 7-byte header before each frame, so a player can start
//! anywhere), FLAC as a native FLAC stream (`fLaC`, a STREAMINFO whose length and MD5 are
//! left unknown, as a stream's must be, then the frames). Each [`CodecStream::encode`]
//! returns the frames its samples completed.

use ff::{ChannelLayout, Packet, Rational, codec, format};
use ffmpeg_next as ff;

use crate::AudioError;

/// Which codec.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamCodec {
    /// AAC-LC in ADTS, 64 kbit/s.
    Aac,
    /// FLAC, 16-bit.
    Flac,
}

impl StreamCodec {
    fn name(self) -> &'static str {
        match self {
            StreamCodec::Aac => "AAC",
            StreamCodec::Flac => "FLAC",
        }
    }
}

/// An encoder of one stream.
pub struct CodecStream {
    codec: StreamCodec,
    encoder: ff::encoder::Audio,
    frame_size: usize,
    pending: Vec<i16>,
    pts: i64,
    sample_rate: u32,
    /// FLAC's stream header, sent before the first frame.
    header: Option<Vec<u8>>,
}

/// ADTS's index of a sampling rate.
fn adts_rate_index(rate: u32) -> Option<u8> {
    [
        96000, 88200, 64000, 48000, 44100, 32000, 24000, 22050, 16000, 12000, 11025, 8000, 7350,
    ]
    .iter()
    .position(|&r| r == rate)
    .and_then(|i| u8::try_from(i).ok())
}

/// The 7-byte ADTS header of an AAC-LC mono frame of `len` bytes.
fn adts_header(rate_index: u8, len: usize) -> [u8; 7] {
    let full = len + 7;
    let channels = 1u8;
    [
        0xFF,
        0xF1,                                           // MPEG-4, layer 0, no CRC
        (1 << 6) | (rate_index << 2) | (channels >> 2), // AAC LC (object type 2 - 1)
        ((channels & 3) << 6) | ((full >> 11) & 0x3) as u8,
        ((full >> 3) & 0xFF) as u8,
        (((full & 7) << 5) as u8) | 0x1F,
        0xFC, // buffer fullness 0x7FF (variable), one raw data block
    ]
}

/// `fLaC` and a STREAMINFO block (the last metadata block) for 16-bit mono at `rate`
/// with blocks of `block` samples; the total length and MD5 unknown (0).
fn flac_header(rate: u32, block: usize) -> Vec<u8> {
    let block = u16::try_from(block).unwrap_or(u16::MAX);
    let mut h = b"fLaC".to_vec();
    h.push(0x80); // last metadata block, type 0 (STREAMINFO)
    h.extend_from_slice(&[0, 0, 34]);
    h.extend_from_slice(&16u16.to_be_bytes()); // min block size (the last may be short)
    h.extend_from_slice(&block.to_be_bytes());
    h.extend_from_slice(&[0; 6]); // min and max frame size: unknown
    // 20 bits rate, 3 bits channels - 1, 5 bits bits per sample - 1, 36 bits samples.
    let bits: u64 = (u64::from(rate) << 44) | (15u64 << 36);
    h.extend_from_slice(&bits.to_be_bytes());
    h.extend_from_slice(&[0; 16]); // MD5: unknown
    h
}

impl CodecStream {
    /// A mono stream of `codec` at `sample_rate`.
    pub fn new(codec: StreamCodec, sample_rate: u32) -> Result<Self, AudioError> {
        crate::m4b::init()?;
        let name = codec.name();
        let fail = |context: &'static str| {
            move |source| AudioError::Stream {
                codec: name,
                context,
                source,
            }
        };
        let rate = i32::try_from(sample_rate)
            .map_err(|_| AudioError::invalid_spec("sample rate out of range"))?;
        if codec == StreamCodec::Aac && adts_rate_index(sample_rate).is_none() {
            return Err(AudioError::invalid_spec(format!(
                "AAC in ADTS has no sampling rate {sample_rate} Hz"
            )));
        }
        let (id, sample) = match codec {
            StreamCodec::Aac => (
                codec::Id::AAC,
                format::Sample::F32(format::sample::Type::Planar),
            ),
            StreamCodec::Flac => (
                codec::Id::FLAC,
                format::Sample::I16(format::sample::Type::Packed),
            ),
        };
        let found = ff::encoder::find(id).ok_or(AudioError::Stream {
            codec: name,
            context: "finding FFmpeg's encoder (install Debian's libavcodec59)",
            source: ff::Error::EncoderNotFound,
        })?;
        let mut setup = codec::context::Context::new_with_codec(found)
            .encoder()
            .audio()
            .map_err(fail("setting up the encoder"))?;
        setup.set_rate(rate);
        setup.set_channel_layout(ChannelLayout::MONO);
        #[cfg(not(ffmpeg7))]
        setup.set_channels(1);
        setup.set_format(sample);
        if codec == StreamCodec::Aac {
            setup.set_bit_rate(64_000);
        }
        setup.set_time_base(Rational(1, rate));
        let encoder = setup.open_as(found).map_err(fail("opening the encoder"))?;
        let frame_size = usize::try_from(encoder.frame_size())
            .ok()
            .filter(|&n| n > 0)
            .unwrap_or(match codec {
                StreamCodec::Aac => 1024,
                StreamCodec::Flac => 4608,
            });
        Ok(Self {
            codec,
            encoder,
            frame_size,
            pending: Vec::with_capacity(frame_size),
            pts: 0,
            sample_rate,
            header: (codec == StreamCodec::Flac).then(|| flac_header(sample_rate, frame_size)),
        })
    }

    /// The frames `samples` completed.
    pub fn encode(&mut self, samples: &[i16]) -> Result<Vec<u8>, AudioError> {
        let mut out = self.header.take().unwrap_or_default();
        let mut rest = samples;
        while !rest.is_empty() {
            let take = (self.frame_size - self.pending.len()).min(rest.len());
            self.pending.extend_from_slice(&rest[..take]);
            rest = &rest[take..];
            if self.pending.len() == self.frame_size {
                self.send_pending(&mut out)?;
            }
        }
        Ok(out)
    }

    /// The last frames.
    pub fn finish(mut self) -> Result<Vec<u8>, AudioError> {
        let mut out = self.header.take().unwrap_or_default();
        if !self.pending.is_empty() {
            self.send_pending(&mut out)?;
        }
        self.encoder
            .send_eof()
            .map_err(|source| AudioError::Stream {
                codec: self.codec.name(),
                context: "flushing the encoder",
                source,
            })?;
        self.take_packets(&mut out)?;
        Ok(out)
    }

    fn send_pending(&mut self, out: &mut Vec<u8>) -> Result<(), AudioError> {
        let n = self.pending.len();
        let mut frame = match self.codec {
            StreamCodec::Aac => {
                let mut f = ff::frame::Audio::new(
                    format::Sample::F32(format::sample::Type::Planar),
                    n,
                    ChannelLayout::MONO,
                );
                for (d, &s) in f.plane_mut::<f32>(0)[..n].iter_mut().zip(&self.pending) {
                    *d = f32::from(s) / 32768.0;
                }
                f
            }
            StreamCodec::Flac => {
                let mut f = ff::frame::Audio::new(
                    format::Sample::I16(format::sample::Type::Packed),
                    n,
                    ChannelLayout::MONO,
                );
                f.plane_mut::<i16>(0)[..n].copy_from_slice(&self.pending);
                f
            }
        };
        frame.set_rate(self.sample_rate);
        frame.set_pts(Some(self.pts));
        self.pts += n as i64;
        self.pending.clear();
        self.encoder
            .send_frame(&frame)
            .map_err(|source| AudioError::Stream {
                codec: self.codec.name(),
                context: "encoding",
                source,
            })?;
        self.take_packets(out)
    }

    /// Appends every packet the encoder has ready (AAC with its ADTS header).
    fn take_packets(&mut self, out: &mut Vec<u8>) -> Result<(), AudioError> {
        let mut packet = Packet::empty();
        loop {
            match self.encoder.receive_packet(&mut packet) {
                Ok(()) => {
                    let data = packet.data().unwrap_or_default();
                    if let (StreamCodec::Aac, Some(index)) =
                        (self.codec, adts_rate_index(self.sample_rate))
                    {
                        out.extend_from_slice(&adts_header(index, data.len()));
                    }
                    out.extend_from_slice(data);
                }
                Err(ff::Error::Eof) => return Ok(()),
                Err(ff::Error::Other { errno }) if errno == ff::util::error::EAGAIN => {
                    return Ok(());
                }
                Err(source) => {
                    return Err(AudioError::Stream {
                        codec: self.codec.name(),
                        context: "encoding",
                        source,
                    });
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tone(n: usize) -> Vec<i16> {
        (0..n)
            .map(|i| ((i as f64 * 0.05).sin() * 8000.0) as i16)
            .collect()
    }

    #[test]
    fn aac_is_adts_frames_of_the_right_lengths() {
        let mut s = CodecStream::new(StreamCodec::Aac, 22050).expect("encoder");
        let mut all = s.encode(&tone(22050)).expect("encode");
        all.extend(s.finish().expect("finish"));
        // Walk the frames by their headers' lengths: they tile the whole.
        let (mut at, mut frames) = (0, 0);
        while at < all.len() {
            assert_eq!((all[at], all[at + 1]), (0xFF, 0xF1), "a sync word at {at}");
            let len = (usize::from(all[at + 3] & 3) << 11)
                | (usize::from(all[at + 4]) << 3)
                | usize::from(all[at + 5] >> 5);
            at += len;
            frames += 1;
        }
        assert_eq!(at, all.len());
        // A second of 1024-sample frames, and the encoder's priming.
        assert!((21..=25).contains(&frames), "{frames} frames");
    }

    #[test]
    fn flac_starts_with_its_streaminfo() {
        let mut s = CodecStream::new(StreamCodec::Flac, 24000).expect("encoder");
        let first = s.encode(&tone(24000)).expect("encode");
        assert_eq!(&first[..4], b"fLaC");
        assert_eq!(first[4], 0x80);
        let rate = (u32::from(first[18]) << 12)
            | (u32::from(first[19]) << 4)
            | (u32::from(first[20]) >> 4);
        assert_eq!(rate, 24000);
        // A frame's sync code follows the header.
        assert_eq!((first[42], first[43] & 0xFE), (0xFF, 0xF8));
        let rest = s.finish().expect("finish");
        assert!(!rest.is_empty());
    }
}
