//! MP3 via LAME: mono, 64 kbit/s CBR at the voice's rate (22050 Hz is MPEG-2 Layer III).
//!
//! Layout: an ID3v2.3 tag (TIT2/TPE1/TALB/TCOM/TYER/TLAN/TPUB/TCON, APIC with the cover,
//! one CHAP frame per chapter and a CTOC listing them) when tags or chapters are given, then LAME's Info frame, then the audio.
//! LAME writes a placeholder for the Info frame at the start of the stream; `finish`
//! seeks back and fills it in (length, encoder delay and padding for gapless players),
//! and rewrites the ID3 tag in place with the last chapter's end time, now known (and
//! every chapter's start, when [`AudioSink::set_chapters`] moved them).
//! Both rewrites keep the size, so nothing after them moves.

use std::io::{Seek, SeekFrom, Write};

use mp3lame_encoder::{Bitrate, BuildError, Builder, FlushGap, Mode, MonoPcm, Quality};

use crate::sink::{Tracked, encoded_info};
use crate::{AudioError, AudioSink, EncodedInfo, EncoderSpec};

/// Samples handed to LAME per call, which bounds the output buffer.
const LAME_CHUNK: usize = 16 * 1024;

pub(crate) struct Mp3Sink<W: Write + Seek> {
    out: Tracked<W>,
    encoder: mp3lame_encoder::Encoder,
    buf: Vec<u8>,
    spec: EncoderSpec,
    /// Length of the ID3 tag at the start (0 when none), i.e. where LAME's stream begins.
    id3_len: u64,
    samples_in: u64,
}

/// LAME's `-q` scale: 0 best and slowest, 9 fastest.
fn lame_quality(q: u8) -> Quality {
    match q {
        0 => Quality::Best,
        1 => Quality::SecondBest,
        2 => Quality::NearBest,
        3 => Quality::VeryNice,
        4 => Quality::Nice,
        5 => Quality::Good,
        6 => Quality::Decent,
        7 => Quality::Ok,
        8 => Quality::SecondWorst,
        _ => Quality::Worst,
    }
}

impl<W: Write + Seek> Mp3Sink<W> {
    pub(crate) fn new(spec: &EncoderSpec, mut out: Tracked<W>) -> Result<Self, AudioError> {
        let setup = |source: BuildError| AudioError::Mp3Setup {
            sample_rate: spec.sample_rate,
            source,
        };
        let mut builder = Builder::new().ok_or_else(|| setup(BuildError::NoMem))?;
        builder.set_num_channels(1).map_err(setup)?;
        builder.set_sample_rate(spec.sample_rate).map_err(setup)?;
        builder.set_mode(Mode::Mono).map_err(setup)?;
        builder.set_brate(Bitrate::Kbps64).map_err(setup)?;
        builder
            .set_quality(lame_quality(spec.tuning.mp3_quality))
            .map_err(setup)?;
        builder.set_to_write_vbr_tag(true).map_err(setup)?;
        let encoder = builder.build().map_err(setup)?;

        let tag = id3_tag(spec, None);
        out.write_all(&tag)
            .map_err(AudioError::io("writing the MP3 ID3 tag"))?;
        Ok(Mp3Sink {
            out,
            encoder,
            buf: Vec::new(),
            spec: spec.clone(),
            id3_len: tag.len() as u64,
            samples_in: 0,
        })
    }

    fn write_buf(&mut self) -> Result<(), AudioError> {
        self.out
            .write_all(&self.buf)
            .map_err(AudioError::io("writing MP3 frames"))?;
        self.buf.clear();
        Ok(())
    }
}

impl<W: Write + Seek> AudioSink for Mp3Sink<W> {
    fn write(&mut self, samples: &[i16]) -> Result<(), AudioError> {
        for part in samples.chunks(LAME_CHUNK) {
            self.buf
                .reserve(mp3lame_encoder::max_required_buffer_size(part.len()));
            self.encoder.encode_to_vec(MonoPcm(part), &mut self.buf)?;
            self.write_buf()?;
        }
        self.samples_in += samples.len() as u64;
        Ok(())
    }

    /// The ID3 tag is rewritten at `finish` anyway; its size depends only on the texts.
    fn set_chapters(&mut self, chapters: &[crate::ChapterMark]) -> Result<(), AudioError> {
        self.spec = crate::sink::with_chapter_starts(&self.spec, chapters)?;
        Ok(())
    }

    fn finish(mut self: Box<Self>) -> Result<EncodedInfo, AudioError> {
        self.buf
            .reserve(mp3lame_encoder::max_required_buffer_size(0));
        self.encoder.flush_to_vec::<FlushGap>(&mut self.buf)?;
        self.write_buf()?;

        // LAME left a zeroed frame right after our ID3 tag for its Info tag.
        let mut info = Vec::with_capacity(self.encoder.lame_tag_size());
        if self.encoder.lame_tag_encode_to_vec(&mut info).is_some() {
            self.out
                .seek(SeekFrom::Start(self.id3_len))
                .and_then(|_| self.out.write_all(&info))
                .map_err(AudioError::io("writing the MP3 Info tag"))?;
        }
        let seconds = self.samples_in as f64 / f64::from(self.spec.sample_rate);
        if self.id3_len > 0 {
            let tag = id3_tag(&self.spec, Some(seconds));
            if tag.len() as u64 != self.id3_len {
                return Err(AudioError::Internal {
                    what: "rewritten ID3 tag changed size",
                });
            }
            self.out
                .seek(SeekFrom::Start(0))
                .and_then(|_| self.out.write_all(&tag))
                .map_err(AudioError::io("rewriting the MP3 ID3 tag"))?;
        }
        let end = self.out.len();
        self.out
            .seek(SeekFrom::Start(end))
            .map_err(AudioError::io("finishing the MP3 file"))?;
        let bytes = self.out.finish()?;
        Ok(encoded_info(self.samples_in, self.spec.sample_rate, bytes))
    }
}

/// MP3 made as it is sent (an HTTP response): the same LAME settings as the files, but
/// no ID3 tag and no Info frame (they are written last, into a file's start, which a
/// stream no longer has), so every [`Mp3Stream::encode`] returns the frames finished so
/// far and a player can start on the first.
pub struct Mp3Stream {
    encoder: mp3lame_encoder::Encoder,
}

impl Mp3Stream {
    /// Mono at `sample_rate`, LAME quality `quality` (0 best … 9 fastest).
    pub fn new(sample_rate: u32, quality: u8) -> Result<Self, AudioError> {
        let setup = |source: BuildError| AudioError::Mp3Setup {
            sample_rate,
            source,
        };
        let mut builder = Builder::new().ok_or_else(|| setup(BuildError::NoMem))?;
        builder.set_num_channels(1).map_err(setup)?;
        builder.set_sample_rate(sample_rate).map_err(setup)?;
        builder.set_mode(Mode::Mono).map_err(setup)?;
        builder.set_brate(Bitrate::Kbps64).map_err(setup)?;
        builder.set_quality(lame_quality(quality)).map_err(setup)?;
        builder.set_to_write_vbr_tag(false).map_err(setup)?;
        Ok(Self {
            encoder: builder.build().map_err(setup)?,
        })
    }

    /// The frames `samples` completed (LAME keeps up to a frame and its look-ahead).
    pub fn encode(&mut self, samples: &[i16]) -> Result<Vec<u8>, AudioError> {
        let mut out = Vec::new();
        for part in samples.chunks(LAME_CHUNK) {
            out.reserve(mp3lame_encoder::max_required_buffer_size(part.len()));
            self.encoder.encode_to_vec(MonoPcm(part), &mut out)?;
        }
        Ok(out)
    }

    /// The last frames.
    pub fn finish(mut self) -> Result<Vec<u8>, AudioError> {
        let mut out = Vec::with_capacity(mp3lame_encoder::max_required_buffer_size(0));
        self.encoder.flush_to_vec::<FlushGap>(&mut out)?;
        Ok(out)
    }
}

/// The ID3v2.3 tag, or nothing when there is no title, artist or chapter. `total_seconds`
/// is the end of the last chapter; before it is known the last chapter ends where it
/// starts. The size depends only on the texts, never on the times.
fn id3_tag(spec: &EncoderSpec, total_seconds: Option<f64>) -> Vec<u8> {
    let mut frames = Vec::new();
    let t = &spec.tags;
    let year = t
        .date
        .as_deref()
        .and_then(|d| d.get(..4))
        .filter(|y| y.bytes().all(|b| b.is_ascii_digit()));
    let language = t.language.as_deref().and_then(iso639_2);
    for (id, value) in [
        (b"TIT2", t.title.as_deref()),
        (b"TPE1", t.artist.as_deref()),
        (b"TALB", t.album.as_deref()),
        (b"TCOM", t.narrator.as_deref()),
        (b"TYER", year),
        (b"TLAN", language),
        (b"TPUB", t.publisher.as_deref()),
        (b"TCON", t.genre.as_deref()),
    ] {
        if let Some(v) = value {
            frames.extend(id3_frame(id, &text_payload(v)));
        }
    }
    if let Some(cover) = &t.cover {
        // APIC: text encoding, MIME (Latin-1, NUL), picture type 3 (front cover),
        // empty description, the image.
        let mut apic = vec![0u8];
        apic.extend_from_slice(cover.mime.as_bytes());
        apic.extend_from_slice(&[0, 3, 0]);
        apic.extend_from_slice(&cover.data);
        frames.extend(id3_frame(b"APIC", &apic));
    }
    // CTOC holds at most 255 children; further chapters still get CHAP frames.
    let ids: Vec<String> = (0..spec.chapters.len()).map(|i| format!("ch{i}")).collect();
    if !spec.chapters.is_empty() {
        let mut toc = Vec::new();
        toc.extend_from_slice(b"toc\0");
        toc.push(0b11); // top-level, ordered
        let listed = &ids[..ids.len().min(255)];
        toc.push(listed.len() as u8);
        for id in listed {
            toc.extend_from_slice(id.as_bytes());
            toc.push(0);
        }
        frames.extend(id3_frame(b"CTOC", &toc));
    }
    for (i, chapter) in spec.chapters.iter().enumerate() {
        let end_seconds = spec
            .chapters
            .get(i + 1)
            .map(|next| next.start_seconds)
            .or(total_seconds)
            .unwrap_or(chapter.start_seconds)
            .max(chapter.start_seconds);
        let mut chap = Vec::new();
        chap.extend_from_slice(ids[i].as_bytes());
        chap.push(0);
        chap.extend_from_slice(&millis(chapter.start_seconds).to_be_bytes());
        chap.extend_from_slice(&millis(end_seconds).to_be_bytes());
        chap.extend_from_slice(&u32::MAX.to_be_bytes()); // byte offsets unused
        chap.extend_from_slice(&u32::MAX.to_be_bytes());
        chap.extend(id3_frame(b"TIT2", &text_payload(&chapter.title)));
        frames.extend(id3_frame(b"CHAP", &chap));
    }
    if frames.is_empty() {
        return frames;
    }
    let mut tag = Vec::with_capacity(10 + frames.len());
    tag.extend_from_slice(b"ID3\x03\x00\x00");
    tag.extend_from_slice(&syncsafe(frames.len() as u32));
    tag.extend(frames);
    tag
}

/// The ISO 639-2 code of a BCP 47 tag's language, for the languages espeak-ng voices
/// come in most (ID3's TLAN and MP4's track language want three letters); `None` when
/// unknown, and the tag is left out rather than guessed.
pub(crate) fn iso639_2(tag: &str) -> Option<&'static str> {
    let primary = tag.split(['-', '_']).next()?.to_ascii_lowercase();
    Some(match primary.as_str() {
        "en" | "eng" => "eng",
        "fr" | "fra" | "fre" => "fra",
        "de" | "deu" | "ger" => "deu",
        "es" | "spa" => "spa",
        "it" | "ita" => "ita",
        "pt" | "por" => "por",
        "nl" | "nld" | "dut" => "nld",
        "ru" | "rus" => "rus",
        "pl" | "pol" => "pol",
        "uk" | "ukr" => "ukr",
        "cs" | "ces" | "cze" => "ces",
        "sv" | "swe" => "swe",
        "da" | "dan" => "dan",
        "no" | "nb" | "nob" | "nor" => "nor",
        "fi" | "fin" => "fin",
        "el" | "ell" | "gre" => "ell",
        "tr" | "tur" => "tur",
        "hu" | "hun" => "hun",
        "ro" | "ron" | "rum" => "ron",
        "ca" | "cat" => "cat",
        "zh" | "zho" | "chi" => "zho",
        "ja" | "jpn" => "jpn",
        "ko" | "kor" => "kor",
        "ar" | "ara" => "ara",
        "hi" | "hin" => "hin",
        "vi" | "vie" => "vie",
        "fa" | "fas" | "per" => "fas",
        "he" | "heb" => "heb",
        _ => return None,
    })
}

fn millis(seconds: f64) -> u32 {
    (seconds.max(0.0) * 1000.0).round().min(f64::from(u32::MAX)) as u32
}

/// Text frame body: UTF-16 with BOM (encoding 1), which every ID3v2.3 reader handles.
fn text_payload(text: &str) -> Vec<u8> {
    let mut body = vec![1u8, 0xFF, 0xFE];
    for unit in text.encode_utf16() {
        body.extend_from_slice(&unit.to_le_bytes());
    }
    body
}

fn id3_frame(id: &[u8; 4], body: &[u8]) -> Vec<u8> {
    let mut frame = Vec::with_capacity(10 + body.len());
    frame.extend_from_slice(id);
    frame.extend_from_slice(&(body.len() as u32).to_be_bytes()); // v2.3: plain size
    frame.extend_from_slice(&[0, 0]);
    frame.extend_from_slice(body);
    frame
}

fn syncsafe(n: u32) -> [u8; 4] {
    [
        ((n >> 21) & 0x7F) as u8,
        ((n >> 14) & 0x7F) as u8,
        ((n >> 7) & 0x7F) as u8,
        (n & 0x7F) as u8,
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{AudioFormat, ChapterMark};

    #[test]
    fn a_stream_is_frames_from_the_first_call_and_decodes_to_its_length() {
        let rate = 22050;
        let tone: Vec<i16> = (0..rate)
            .map(|i| ((i as f64 * 0.05).sin() * 8000.0) as i16)
            .collect();
        let mut stream = super::Mp3Stream::new(rate as u32, 5).expect("encoder");
        let first = stream.encode(&tone[..rate / 2]).expect("encode");
        // MPEG-2 Layer III frame sync from the first byte: no tag, no Info frame.
        assert!(first.len() > 1000 && first[0] == 0xFF && first[1] & 0xE0 == 0xE0);
        let mut all = first;
        all.extend(stream.encode(&tone[rate / 2..]).expect("encode"));
        all.extend(stream.finish().expect("finish"));
        // 64 kbit/s: about 8,000 bytes a second.
        assert!((7_000..10_000).contains(&all.len()), "{}", all.len());
    }

    #[test]
    fn no_metadata_no_tag() {
        assert!(id3_tag(&EncoderSpec::new(AudioFormat::Mp3, 22050), None).is_empty());
    }

    #[test]
    fn tag_size_does_not_depend_on_the_total_length() {
        let spec = EncoderSpec {
            tags: crate::Tags {
                title: Some("Böök".into()),
                ..Default::default()
            },
            chapters: vec![
                ChapterMark {
                    title: "One".into(),
                    start_seconds: 0.0,
                },
                ChapterMark {
                    title: "Two".into(),
                    start_seconds: 1.5,
                },
            ],
            ..EncoderSpec::new(AudioFormat::Mp3, 22050)
        };
        let before = id3_tag(&spec, None);
        let after = id3_tag(&spec, Some(3.0));
        assert_eq!(before.len(), after.len());
        assert_ne!(before, after);
        assert_eq!(&after[..3], b"ID3");
        let size = after[6..10]
            .iter()
            .fold(0usize, |acc, &b| (acc << 7) | usize::from(b));
        assert_eq!(size + 10, after.len());
        // The second chapter's end time (3000 ms, big endian) is in the rewritten tag.
        assert!(
            after
                .windows(8)
                .any(|w| w == [0, 0, 0x05, 0xDC, 0, 0, 0x0B, 0xB8])
        );
    }
}
