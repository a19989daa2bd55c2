//! Ogg Opus: resample to 48 kHz, encode 20 ms frames with libopus, wrap them in Ogg pages.
//!
//! Layout (RFC 7845): page 0 holds `OpusHead` (pre-skip = encoder lookahead, input rate =
//! the voice's rate, mapping family 0), the next page(s) hold `OpusTags` (vendor, TITLE,
//! ARTIST, and chapters as `CHAPTERnnn=HH:MM:SS.mmm` / `CHAPTERnnnNAME=title`), then audio
//! pages of ~1 s (50 packets) each. Granule positions count 48 kHz samples including the
//! pre-skip; the final partial frame is padded with silence and the end trimmed through
//! the last page's granule, which carries the end-of-stream flag. Chapters moved by
//! [`AudioSink::set_chapters`] are written by rewriting the header pages in place.
//!
//! Memory: one resampler chunk, less than one frame of 48 kHz samples, one held-back
//! packet (so the last one can be flagged end-of-stream) and one Ogg page.

use std::io::{Seek, SeekFrom, Write};

use ogg::writing::{PacketWriteEndInfo, PacketWriter};

use crate::resample::{OPUS_RATE, To48k};
use crate::sink::{Tracked, encoded_info};
use crate::{AudioError, AudioSink, ChapterMark, EncodedInfo, EncoderSpec};

/// 20 ms at 48 kHz.
const FRAME: usize = 960;
/// Target bitrate: transparent speech for mono voices, ~18 MB per hour.
const BITRATE_BPS: i32 = 40_000;
/// Packets per audio page: ~1 s, a good seek granularity for players.
const PACKETS_PER_PAGE: u32 = 50;
/// libopus never produces more than this for one 20 ms mono frame.
const MAX_PACKET: usize = 4000;

pub(crate) struct OggOpusSink<W: Write + Seek> {
    ogg: PacketWriter<'static, Tracked<W>>,
    serial: u32,
    encoder: opus::Encoder,
    resampler: To48k,
    /// 48 kHz samples not yet encoded (less than one frame between calls).
    pcm: Vec<f32>,
    scratch: Vec<u8>,
    /// The newest packet, written once we know whether it is the last.
    held: Option<Vec<u8>>,
    frames_encoded: u64,
    packets_in_page: u32,
    pre_skip: u16,
    sample_rate: u32,
    samples_in: u64,
    /// What the header pages were made from, to make them again with moved chapters.
    spec: EncoderSpec,
    /// Bytes of the two header pages (OpusHead, OpusTags) at the start of the file.
    header_len: u64,
    /// [`AudioSink::set_chapters`] moved the chapters: rewrite the header at `finish`.
    rewrite_header: bool,
}

impl<W: Write + Seek> OggOpusSink<W> {
    pub(crate) fn new(spec: &EncoderSpec, out: Tracked<W>) -> Result<Self, AudioError> {
        let tuning = spec.tuning;
        let application = if tuning.opus_celt_only {
            opus::Application::LowDelay
        } else {
            opus::Application::Audio
        };
        let mut encoder = opus::Encoder::new(OPUS_RATE, opus::Channels::Mono, application)?;
        encoder.set_bitrate(opus::Bitrate::Bits(BITRATE_BPS))?;
        // Signal type stays on auto: forcing `Voice` selects SILK/hybrid, which measured
        // ~3x slower here (55 s vs 19 s of CPU per hour) for no audible gain at 40 kbit/s.
        encoder.set_complexity(i32::from(tuning.opus_complexity.min(10)))?;
        if tuning.opus_band_cap && spec.sample_rate <= 24_000 {
            encoder.set_max_bandwidth(opus::Bandwidth::Superwideband)?;
        }
        let lookahead = encoder.get_lookahead()?;
        let pre_skip = u16::try_from(lookahead).map_err(|_| AudioError::Internal {
            what: "libopus reported an out-of-range lookahead",
        })?;

        let mut sink = OggOpusSink {
            ogg: PacketWriter::new(out),
            serial: stream_serial(),
            encoder,
            resampler: To48k::new(spec.sample_rate)?,
            pcm: Vec::with_capacity(2 * FRAME),
            scratch: vec![0; MAX_PACKET],
            held: None,
            frames_encoded: 0,
            packets_in_page: 0,
            pre_skip,
            sample_rate: spec.sample_rate,
            samples_in: 0,
            spec: spec.clone(),
            header_len: 0,
            rewrite_header: false,
        };
        let head = opus_head(pre_skip, spec.sample_rate);
        let tags = opus_tags(spec);
        sink.write_page_packet(head, PacketWriteEndInfo::EndPage, 0)?;
        sink.write_page_packet(tags, PacketWriteEndInfo::EndPage, 0)?;
        sink.header_len = sink.ogg.inner().len();
        Ok(sink)
    }

    /// The header pages as `new` writes them (same serial, page numbers and CRCs), made
    /// from `spec`.
    fn header_pages(&self, spec: &EncoderSpec) -> Result<Vec<u8>, AudioError> {
        let mut pages = PacketWriter::new(Vec::new());
        for packet in [opus_head(self.pre_skip, self.sample_rate), opus_tags(spec)] {
            pages
                .write_packet(packet, self.serial, PacketWriteEndInfo::EndPage, 0)
                .map_err(AudioError::io("writing Ogg pages"))?;
        }
        Ok(pages.into_inner())
    }

    fn write_page_packet(
        &mut self,
        packet: Vec<u8>,
        end: PacketWriteEndInfo,
        granule: u64,
    ) -> Result<(), AudioError> {
        self.ogg
            .write_packet(packet, self.serial, end, granule)
            .map_err(AudioError::io("writing Ogg pages"))
    }

    /// Encodes every whole frame in `self.pcm`.
    fn encode_frames(&mut self) -> Result<(), AudioError> {
        let mut start = 0;
        while self.pcm.len() - start >= FRAME {
            let len = self
                .encoder
                .encode_float(&self.pcm[start..start + FRAME], &mut self.scratch)?;
            start += FRAME;
            let packet = self.scratch[..len].to_vec();
            if let Some(previous) = self.held.replace(packet) {
                // `previous` is not the last packet: its granule is its end position.
                let granule = self.frames_encoded * FRAME as u64;
                self.packets_in_page += 1;
                let end = if self.packets_in_page >= PACKETS_PER_PAGE {
                    self.packets_in_page = 0;
                    PacketWriteEndInfo::EndPage
                } else {
                    PacketWriteEndInfo::NormalPacket
                };
                self.write_page_packet(previous, end, granule)?;
            }
            self.frames_encoded += 1;
        }
        self.pcm.drain(..start);
        Ok(())
    }
}

impl<W: Write + Seek> AudioSink for OggOpusSink<W> {
    fn write(&mut self, samples: &[i16]) -> Result<(), AudioError> {
        self.samples_in += samples.len() as u64;
        // Bound the resampled backlog for very large chunks.
        for part in samples.chunks(1 << 16) {
            self.resampler.push(part, &mut self.pcm)?;
            self.encode_frames()?;
        }
        Ok(())
    }

    /// Checked here, written by `finish`: the chapter comments' times have a fixed
    /// width (under 100 hours), so the comment header keeps its size and no page moves.
    fn set_chapters(&mut self, chapters: &[ChapterMark]) -> Result<(), AudioError> {
        let moved = crate::sink::with_chapter_starts(&self.spec, chapters)?;
        let pages = self.header_pages(&moved)?;
        if pages.len() as u64 != self.header_len {
            return Err(AudioError::invalid_spec(format!(
                "the chapter comments with the final times take {} bytes instead of {} \
                 (a chapter at 100 hours or later); create the file with the final chapters",
                pages.len(),
                self.header_len
            )));
        }
        self.spec = moved;
        self.rewrite_header = true;
        Ok(())
    }

    fn finish(mut self: Box<Self>) -> Result<EncodedInfo, AudioError> {
        self.resampler.finish(&mut self.pcm)?;
        let audio_48k = self.resampler.expected_len();
        // The decoder drops `pre_skip` samples first, so the frames must cover both.
        let end_granule = audio_48k + u64::from(self.pre_skip);
        let frames_needed = end_granule.div_ceil(FRAME as u64).max(1);
        let target = usize::try_from(frames_needed - self.frames_encoded).map_err(|_| {
            AudioError::Internal {
                what: "Opus frame count overflow",
            }
        })? * FRAME;
        self.pcm.resize(target, 0.0);
        self.encode_frames()?;
        let last = self.held.take().ok_or(AudioError::Internal {
            what: "no Opus packet to end the stream with",
        })?;
        // The last granule is below the frames' end: players trim the padding.
        self.write_page_packet(last, PacketWriteEndInfo::EndStream, end_granule)?;

        let header = if self.rewrite_header {
            Some(self.header_pages(&self.spec)?)
        } else {
            None
        };
        let OggOpusSink {
            ogg,
            sample_rate,
            samples_in,
            ..
        } = *self;
        let mut out = ogg.into_inner();
        if let Some(header) = header {
            let end = out.len();
            out.seek(SeekFrom::Start(0))
                .and_then(|_| out.write_all(&header))
                .and_then(|_| out.seek(SeekFrom::Start(end)))
                .map_err(AudioError::io("rewriting the Ogg Opus header"))?;
        }
        let bytes = out.finish()?;
        Ok(encoded_info(samples_in, sample_rate, bytes))
    }
}

/// RFC 7845 §5.1 identification header, mono, channel mapping family 0.
fn opus_head(pre_skip: u16, input_rate: u32) -> Vec<u8> {
    let mut head = Vec::with_capacity(19);
    head.extend_from_slice(b"OpusHead");
    head.push(1); // version
    head.push(1); // channels
    head.extend_from_slice(&pre_skip.to_le_bytes());
    head.extend_from_slice(&input_rate.to_le_bytes());
    head.extend_from_slice(&0i16.to_le_bytes()); // output gain
    head.push(0); // mapping family
    head
}

/// RFC 7845 §5.2 comment header with title, artist and chapter tags.
fn opus_tags(spec: &EncoderSpec) -> Vec<u8> {
    let vendor = format!(
        "narrator-audio {} ({})",
        env!("CARGO_PKG_VERSION"),
        opus::version()
    );
    let t = &spec.tags;
    let mut comments: Vec<String> = [
        ("TITLE", &t.title),
        ("ARTIST", &t.artist),
        ("ALBUM", &t.album),
        ("COMPOSER", &t.narrator),
        ("DATE", &t.date),
        ("LANGUAGE", &t.language),
        ("ORGANIZATION", &t.publisher),
        ("GENRE", &t.genre),
    ]
    .into_iter()
    .filter_map(|(key, value)| value.as_ref().map(|v| format!("{key}={v}")))
    .collect();
    if let Some(cover) = &t.cover {
        use base64::Engine as _;
        comments.push(format!(
            "METADATA_BLOCK_PICTURE={}",
            base64::engine::general_purpose::STANDARD.encode(flac_picture(cover))
        ));
    }
    comments.extend(chapter_comments(&spec.chapters));

    let mut tags = Vec::new();
    tags.extend_from_slice(b"OpusTags");
    push_len_prefixed(&mut tags, vendor.as_bytes());
    tags.extend_from_slice(&(comments.len() as u32).to_le_bytes());
    for c in &comments {
        push_len_prefixed(&mut tags, c.as_bytes());
    }
    tags
}

/// A FLAC picture block (front cover, type 3), the body of `METADATA_BLOCK_PICTURE`.
/// Width, height and depth may be 0 ("unknown"); players read them from the image.
fn flac_picture(cover: &narrator_core::Cover) -> Vec<u8> {
    let mut b = Vec::with_capacity(cover.data.len() + 64);
    b.extend_from_slice(&3u32.to_be_bytes());
    b.extend_from_slice(&(cover.mime.len() as u32).to_be_bytes());
    b.extend_from_slice(cover.mime.as_bytes());
    b.extend_from_slice(&0u32.to_be_bytes()); // no description
    b.extend_from_slice(&[0; 16]); // width, height, depth, colours: unknown
    b.extend_from_slice(&(cover.data.len() as u32).to_be_bytes());
    b.extend_from_slice(&cover.data);
    b
}

fn push_len_prefixed(buf: &mut Vec<u8>, bytes: &[u8]) {
    buf.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
    buf.extend_from_slice(bytes);
}

/// `CHAPTER001=00:00:00.000` and `CHAPTER001NAME=title`, numbered from 1.
pub(crate) fn chapter_comments(chapters: &[ChapterMark]) -> Vec<String> {
    chapters
        .iter()
        .enumerate()
        .flat_map(|(i, c)| {
            let n = i + 1;
            [
                format!("CHAPTER{n:03}={}", format_timestamp(c.start_seconds)),
                format!("CHAPTER{n:03}NAME={}", c.title),
            ]
        })
        .collect()
}

/// `HH:MM:SS.mmm`, rounded to the millisecond.
pub(crate) fn format_timestamp(seconds: f64) -> String {
    let ms = (seconds.max(0.0) * 1000.0).round() as u64;
    format!(
        "{:02}:{:02}:{:02}.{:03}",
        ms / 3_600_000,
        ms / 60_000 % 60,
        ms / 1000 % 60,
        ms % 1000
    )
}

/// Ogg wants a random serial per logical stream; time and pid are random enough here.
fn stream_serial() -> u32 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos() ^ (d.as_secs() as u32))
        .unwrap_or(0);
    nanos ^ std::process::id().rotate_left(16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_hh_mm_ss_mmm() {
        assert_eq!(format_timestamp(0.0), "00:00:00.000");
        assert_eq!(format_timestamp(1.5), "00:00:01.500");
        assert_eq!(format_timestamp(3723.0456), "01:02:03.046");
        assert_eq!(format_timestamp(100.0 * 3600.0), "100:00:00.000");
    }

    #[test]
    fn chapter_tags_are_numbered_from_one_and_padded() {
        let tags = chapter_comments(&[
            ChapterMark {
                title: "Prologue".into(),
                start_seconds: 0.0,
            },
            ChapterMark {
                title: "One".into(),
                start_seconds: 61.25,
            },
        ]);
        assert_eq!(
            tags,
            vec![
                "CHAPTER001=00:00:00.000",
                "CHAPTER001NAME=Prologue",
                "CHAPTER002=00:01:01.250",
                "CHAPTER002NAME=One",
            ]
        );
    }
}
