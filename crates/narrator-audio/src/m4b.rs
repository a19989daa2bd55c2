//! M4B: AAC-LC, mono, at the voice's rate, 64 kbit/s, in an MP4 container written by
//! FFmpeg's `ipod` muxer (libavformat), encoded by FFmpeg's native AAC encoder
//! (libavcodec), both from Debian's FFmpeg packages through `ffmpeg-next`.
//!
//! What the muxer writes from the spec: a QuickTime chapter track (what Apple Books and
//! iOS read) plus Nero `chpl` chapters (what most other players read), iTunes tags
//! (`©nam` title, `©ART` author, `©alb` book, `©wrt` narrator, `©day`, `©gen`,
//! `stik`=2 "Audiobook"), the track language, and the cover as a `covr` atom. The index
//! (`moov`) is moved before the audio when the file is finished (`+faststart`), so
//! players can start and seek before the whole file is read.
//!
//! The publisher has no iTunes atom that FFmpeg 5.1 writes, so M4B files do not carry it
//! (the manifest and the other formats do).
//!
//! The muxer writes a file by path (it seeks and rewrites on its own), so this sink is
//! made by [`crate::create_file_encoder`] only. Memory: one AAC frame of samples plus
//! the muxer's index (a few bytes per 1024 samples).

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use ff::{ChannelLayout, Dictionary, Packet, Rational, codec, format};
use ffmpeg_next as ff;

use crate::sink::encoded_info;
use crate::{AudioError, AudioSink, EncodedInfo, EncoderSpec};

/// AAC-LC bitrate: transparent for a mono 22.05 kHz voice (the MP3 output uses the same).
const BITRATE: usize = 64_000;
/// Chapter times are given to the muxer in milliseconds.
const MILLIS: Rational = Rational(1, 1000);

pub(crate) struct M4bSink {
    octx: format::context::Output,
    encoder: ff::encoder::Audio,
    /// Samples per AAC frame (1024).
    frame_size: usize,
    /// Samples not yet sent (fewer than one frame between calls).
    pending: Vec<f32>,
    /// Timestamp of the next frame, in samples.
    pts: i64,
    encoder_time_base: Rational,
    stream_time_base: Rational,
    sample_rate: u32,
    samples_in: u64,
    chapters: usize,
    path: PathBuf,
}

/// FFmpeg's global set-up, once per process: its own log goes to stderr at error level
/// only (narrator reports failures itself).
/// A failure is kept, so every later file reports it too.
pub(crate) fn init() -> Result<(), AudioError> {
    static INIT: OnceLock<Result<(), ff::Error>> = OnceLock::new();
    let result = *INIT.get_or_init(|| {
        ff::util::log::set_level(ff::util::log::Level::Error);
        ff::init()
    });
    result.map_err(AudioError::m4b("starting FFmpeg's libraries"))
}

impl M4bSink {
    pub(crate) fn new(spec: &EncoderSpec, path: &Path) -> Result<Self, AudioError> {
        init()?;
        let rate = i32::try_from(spec.sample_rate)
            .map_err(|_| AudioError::invalid_spec("sample rate out of range"))?;
        let mut octx = format::output_as(path, "ipod").map_err(|source| AudioError::M4b {
            context: "creating the M4B file",
            source,
        })?;
        let codec = ff::encoder::find(codec::Id::AAC).ok_or(AudioError::M4b {
            context: "finding FFmpeg's AAC encoder (install Debian's libavcodec59)",
            source: ff::Error::EncoderNotFound,
        })?;
        let global = octx.format().flags().contains(format::Flags::GLOBAL_HEADER);
        let mut setup = codec::context::Context::new_with_codec(codec)
            .encoder()
            .audio()
            .map_err(AudioError::m4b("setting up the AAC encoder"))?;
        setup.set_rate(rate);
        setup.set_channel_layout(ChannelLayout::MONO);
        #[cfg(not(ffmpeg7))]
        setup.set_channels(1);
        setup.set_format(format::Sample::F32(format::sample::Type::Planar));
        setup.set_bit_rate(BITRATE);
        setup.set_time_base(Rational(1, rate));
        if global {
            setup.set_flags(codec::Flags::GLOBAL_HEADER);
        }
        let encoder = setup
            .open_as(codec)
            .map_err(AudioError::m4b("opening the AAC encoder"))?;
        let frame_size = usize::try_from(encoder.frame_size())
            .ok()
            .filter(|&n| n > 0)
            .unwrap_or(1024);
        {
            let mut audio = octx
                .add_stream(codec)
                .map_err(AudioError::m4b("adding the audio track"))?;
            audio.set_parameters(&encoder);
            audio.set_time_base(Rational(1, rate));
            if let Some(lang) = spec.tags.language.as_deref().and_then(crate::mp3::iso639_2) {
                let mut d = Dictionary::new();
                d.set("language", lang);
                audio.set_metadata(d);
            }
        }
        let cover = match &spec.tags.cover {
            Some(c) => Some(add_cover_stream(&mut octx, c)?),
            None => None,
        };
        for (i, c) in spec.chapters.iter().enumerate() {
            let start = millis(c.start_seconds);
            // The last chapter's end is known at `finish`; until then it ends where it starts.
            let end = spec
                .chapters
                .get(i + 1)
                .map_or(start, |n| millis(n.start_seconds).max(start));
            octx.add_chapter(i as i64, MILLIS, start, end, &c.title)
                .map_err(AudioError::m4b("adding a chapter"))?;
        }
        octx.set_metadata(tags(spec));
        let mut options = Dictionary::new();
        options.set("movflags", "+faststart");
        octx.write_header_with(options)
            .map_err(AudioError::m4b("writing the MP4 header"))?;
        if let Some((index, data)) = cover {
            let mut packet = Packet::copy(&data[..]);
            packet.set_stream(index);
            packet.set_pts(Some(0));
            packet.set_dts(Some(0));
            packet.set_flags(codec::packet::Flags::KEY);
            packet
                .write(&mut octx)
                .map_err(AudioError::m4b("writing the cover"))?;
        }
        let stream_time_base = octx
            .stream(0)
            .map(|s| s.time_base())
            .unwrap_or(Rational(1, rate));
        Ok(M4bSink {
            octx,
            encoder_time_base: Rational(1, rate),
            encoder,
            frame_size,
            pending: Vec::with_capacity(frame_size),
            pts: 0,
            stream_time_base,
            sample_rate: spec.sample_rate,
            samples_in: 0,
            chapters: spec.chapters.len(),
            path: path.to_path_buf(),
        })
    }

    /// Sends `pending` (one frame, or the shorter last one) to the encoder.
    fn send_pending(&mut self) -> Result<(), AudioError> {
        let n = self.pending.len();
        let mut frame = ff::frame::Audio::new(
            format::Sample::F32(format::sample::Type::Planar),
            n,
            ChannelLayout::MONO,
        );
        frame.set_rate(self.sample_rate);
        frame.plane_mut::<f32>(0)[..n].copy_from_slice(&self.pending);
        frame.set_pts(Some(self.pts));
        self.pts += n as i64;
        self.pending.clear();
        self.encoder
            .send_frame(&frame)
            .map_err(AudioError::m4b("encoding AAC"))?;
        self.write_packets()
    }

    /// Muxes every packet the encoder has ready.
    fn write_packets(&mut self) -> Result<(), AudioError> {
        let mut packet = Packet::empty();
        loop {
            match self.encoder.receive_packet(&mut packet) {
                Ok(()) => {
                    packet.set_stream(0);
                    packet.rescale_ts(self.encoder_time_base, self.stream_time_base);
                    packet
                        .write_interleaved(&mut self.octx)
                        .map_err(AudioError::m4b("writing AAC frames"))?;
                }
                Err(ff::Error::Eof) => return Ok(()),
                Err(ff::Error::Other { errno }) if errno == ff::util::error::EAGAIN => {
                    return Ok(());
                }
                Err(e) => return Err(AudioError::m4b("encoding AAC")(e)),
            }
        }
    }
}

impl AudioSink for M4bSink {
    fn write(&mut self, samples: &[i16]) -> Result<(), AudioError> {
        let mut rest = samples;
        while !rest.is_empty() {
            let take = (self.frame_size - self.pending.len()).min(rest.len());
            self.pending
                .extend(rest[..take].iter().map(|&s| f32::from(s) / 32768.0));
            rest = &rest[take..];
            if self.pending.len() == self.frame_size {
                self.send_pending()?;
            }
        }
        self.samples_in += samples.len() as u64;
        Ok(())
    }

    /// FFmpeg takes the chapters when the file is created.
    fn set_chapters(&mut self, _: &[crate::ChapterMark]) -> Result<(), AudioError> {
        Err(AudioError::invalid_spec(
            "M4B chapters are fixed when the file is created; create it with the final chapters",
        ))
    }

    fn finish(mut self: Box<Self>) -> Result<EncodedInfo, AudioError> {
        if !self.pending.is_empty() {
            self.send_pending()?;
        }
        self.encoder
            .send_eof()
            .map_err(AudioError::m4b("flushing the AAC encoder"))?;
        self.write_packets()?;
        if let Some(last) = self.chapters.checked_sub(1) {
            let total = millis(self.samples_in as f64 / f64::from(self.sample_rate));
            if let Some(mut chapter) = self.octx.chapter_mut(last) {
                let start = chapter.start();
                chapter.set_end(total.max(start));
            }
        }
        self.octx
            .write_trailer()
            .map_err(AudioError::m4b("writing the MP4 index"))?;
        let bytes = std::fs::metadata(&self.path)
            .map_err(AudioError::io("measuring the M4B file"))?
            .len();
        Ok(encoded_info(self.samples_in, self.sample_rate, bytes))
    }
}

/// The book's tags as FFmpeg's MP4 muxer names them.
fn tags(spec: &EncoderSpec) -> Dictionary<'static> {
    let t = &spec.tags;
    let mut d = Dictionary::new();
    for (key, value) in [
        ("title", &t.title),
        ("artist", &t.artist),
        ("album_artist", &t.artist),
        ("album", &t.album),
        ("composer", &t.narrator),
        ("date", &t.date),
        ("genre", &t.genre),
    ] {
        if let Some(v) = value {
            d.set(key, v);
        }
    }
    // iTunes media kind 2: "Audiobook" (remembers the position, shown under Books).
    d.set("media_type", "2");
    d
}

/// Adds the cover as an attached picture (the muxer turns it into the `covr` atom).
/// Returns its stream index and the bytes to write as its one packet. ffmpeg-next has
/// no safe setter for a stream's codec type, size and disposition: set them in place.
#[allow(unsafe_code)]
fn add_cover_stream(
    octx: &mut format::context::Output,
    cover: &narrator_core::Cover,
) -> Result<(usize, std::sync::Arc<Vec<u8>>), AudioError> {
    let id = if cover.mime == "image/png" {
        codec::Id::PNG
    } else {
        codec::Id::MJPEG
    };
    // The muxer refuses a picture without dimensions; read them from the image header.
    let size = imagesize::blob_size(&cover.data).map_err(|e| {
        AudioError::invalid_spec(format!(
            "the cover ({}) cannot be read: {e}; use an ordinary JPEG or PNG file",
            cover.mime
        ))
    })?;
    let mut stream = octx
        .add_stream(ff::encoder::find(id))
        .map_err(AudioError::m4b("adding the cover"))?;
    let index = stream.index();
    // SAFETY: the stream was just created by libavformat and is owned by `octx`; its
    // codec parameters are allocated with it and not yet read by anything.
    unsafe {
        let st = stream.as_mut_ptr();
        let par = (*st).codecpar;
        (*par).codec_type = ff::ffi::AVMediaType::AVMEDIA_TYPE_VIDEO;
        (*par).codec_id = id.into();
        (*par).width = i32::try_from(size.width).unwrap_or(0);
        (*par).height = i32::try_from(size.height).unwrap_or(0);
        (*st).disposition = ff::ffi::AV_DISPOSITION_ATTACHED_PIC;
    }
    Ok((index, cover.data.clone()))
}

fn millis(seconds: f64) -> i64 {
    (seconds.max(0.0) * 1000.0).round() as i64
}
