//! End-to-end checks of the encoders: every format is decoded back with an independent
//! decoder (hound, libopus + the ogg crate's reader, symphonia's pure-Rust MP3 decoder) and
//! the result compared with what went in: length, pitch, loudness, tags. The streaming test
//! measures this thread's heap with a counting allocator to prove memory stays flat.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::io::{self, Cursor, Seek, SeekFrom, Write};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use narrator_audio::{
    AudioError, AudioFormat, AudioSink, ChapterMark, EncodedInfo, EncoderSpec, create_encoder,
    encode_wav_file, read_wav_i16,
};

type TestResult = Result<(), Box<dyn std::error::Error>>;

const RATE: u32 = 22050;

// ---------------------------------------------------------------------------------------
// Per-thread heap accounting (tests run on parallel threads; each measures only itself).

struct CountingAlloc;

thread_local! {
    static LIVE: Cell<i64> = const { Cell::new(0) };
    static PEAK: Cell<i64> = const { Cell::new(0) };
}

fn track(delta: i64) {
    // `try_with` so that allocations during thread teardown are simply not counted.
    let _ = LIVE.try_with(|live| {
        let now = live.get() + delta;
        live.set(now);
        let _ = PEAK.try_with(|peak| peak.set(peak.get().max(now)));
    });
}

// SAFETY: forwards every call to the system allocator unchanged; only counts sizes.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        track(layout.size() as i64);
        // SAFETY: same contract as our caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        track(-(layout.size() as i64));
        // SAFETY: same contract as our caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        track(new_size as i64 - layout.size() as i64);
        // SAFETY: same contract as our caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

/// Heap bytes live on this thread now; resets the peak to it.
fn heap_mark() -> i64 {
    let live = LIVE.with(Cell::get);
    PEAK.with(|p| p.set(live));
    live
}

fn heap_peak() -> i64 {
    PEAK.with(Cell::get)
}

// ---------------------------------------------------------------------------------------
// Writers and signals.

/// An in-memory file the test can still read after the sink has consumed its handle.
#[derive(Clone, Default)]
struct SharedFile(Arc<Mutex<Cursor<Vec<u8>>>>);

impl SharedFile {
    fn bytes(&self) -> Vec<u8> {
        self.0
            .lock()
            .map(|c| c.get_ref().clone())
            .unwrap_or_default()
    }
}

impl Write for SharedFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0
            .lock()
            .map_err(|_| io::Error::other("poisoned"))?
            .write(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Seek for SharedFile {
    fn seek(&mut self, pos: SeekFrom) -> io::Result<u64> {
        self.0
            .lock()
            .map_err(|_| io::Error::other("poisoned"))?
            .seek(pos)
    }
}

/// Counts bytes like a file would grow, stores nothing.
#[derive(Clone, Default)]
struct CountingFile(Arc<Mutex<(u64, u64)>>); // (position, length)

impl CountingFile {
    fn len(&self) -> u64 {
        self.0.lock().map(|g| g.1).unwrap_or_default()
    }
}

impl Write for CountingFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let mut g = self.0.lock().map_err(|_| io::Error::other("poisoned"))?;
        g.0 += buf.len() as u64;
        g.1 = g.1.max(g.0);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Seek for CountingFile {
    fn seek(&mut self, pos: SeekFrom) -> io::Result<u64> {
        let mut g = self.0.lock().map_err(|_| io::Error::other("poisoned"))?;
        g.0 = match pos {
            SeekFrom::Start(p) => p,
            SeekFrom::End(d) => g.1.saturating_add_signed(d),
            SeekFrom::Current(d) => g.0.saturating_add_signed(d),
        };
        Ok(g.0)
    }
}

fn sine(freq: f64, amplitude: f64, seconds: f64) -> Vec<i16> {
    let n = (seconds * f64::from(RATE)).round() as usize;
    (0..n)
        .map(|i| {
            let t = i as f64 / f64::from(RATE);
            (amplitude * 32767.0 * (2.0 * std::f64::consts::PI * freq * t).sin()).round() as i16
        })
        .collect()
}

/// Something closer to speech for throughput figures: a gliding harmonic tone with a
/// syllable-rate envelope, a bit of noise, and a pause every few seconds.
fn speechlike_second(second: u64) -> Vec<i16> {
    let mut seed = second.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..RATE as u64)
        .map(|i| {
            let t = (second * u64::from(RATE) + i) as f64 / f64::from(RATE);
            if second % 7 == 6 && i > u64::from(RATE) / 2 {
                return 0;
            }
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let noise = (seed % 2001) as f64 / 1000.0 - 1.0;
            let f0 = 120.0 + 40.0 * (t * 0.7).sin();
            let voiced: f64 = (1..8)
                .map(|h| (2.0 * std::f64::consts::PI * f0 * h as f64 * t).sin() / h as f64)
                .sum();
            let envelope = 0.5 + 0.5 * (2.0 * std::f64::consts::PI * 4.0 * t).sin();
            (envelope * (0.25 * voiced + 0.03 * noise) * 32767.0).clamp(-32767.0, 32767.0) as i16
        })
        .collect()
}

/// CPU seconds used by this thread so far (Linux; `None` elsewhere): the figure that
/// matters on a shared machine, where wall time also counts other processes.
fn thread_cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/thread-self/stat").ok()?;
    // Fields after the parenthesised command name; utime and stime are the 12th and 13th.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split(' ').collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(ticks as f64 / 100.0) // USER_HZ is 100 on Linux
}

fn rms(x: &[f32]) -> f64 {
    (x.iter().map(|&v| f64::from(v) * f64::from(v)).sum::<f64>() / x.len().max(1) as f64).sqrt()
}

/// Sign changes per second.
fn zero_crossings_per_second(x: &[f32], rate: u32) -> f64 {
    let crossings = x
        .windows(2)
        .filter(|w| (w[0] < 0.0) != (w[1] < 0.0))
        .count();
    crossings as f64 * f64::from(rate) / x.len().max(1) as f64
}

fn two_chapters() -> Vec<ChapterMark> {
    vec![
        ChapterMark {
            title: "Prologue".into(),
            start_seconds: 0.0,
        },
        ChapterMark {
            title: "Chapter One: Départ".into(),
            start_seconds: 1.5,
        },
    ]
}

fn encode(spec: &EncoderSpec, chunks: &[&[i16]]) -> Result<(EncodedInfo, Vec<u8>), AudioError> {
    let file = SharedFile::default();
    let mut sink = create_encoder(spec, file.clone())?;
    for c in chunks {
        sink.write(c)?;
    }
    let info = sink.finish()?;
    Ok((info, file.bytes()))
}

/// `encode`, but the sink is created with every chapter starting at 0 and given `chapters`
/// only after the audio, as a book encoded during its synthesis is.
fn encode_then_set_chapters(
    spec: &EncoderSpec,
    chapters: &[ChapterMark],
    chunks: &[&[i16]],
) -> Result<Vec<u8>, AudioError> {
    let unknown = EncoderSpec {
        chapters: chapters
            .iter()
            .map(|c| ChapterMark {
                start_seconds: 0.0,
                ..c.clone()
            })
            .collect(),
        ..spec.clone()
    };
    let file = SharedFile::default();
    let mut sink = create_encoder(&unknown, file.clone())?;
    for c in chunks {
        sink.write(c)?;
    }
    sink.set_chapters(chapters)?;
    sink.finish()?;
    Ok(file.bytes())
}

/// Chapters set after the audio give the file made with them from the start: the same
/// MP3 bytes; for Opus (whose stream serial is random) the same comments, packets and
/// granules, read through the ogg crate's checksum-verifying reader. Marks that are not
/// the ones the sink was created with are refused, and leave the sink usable.
#[test]
fn chapters_set_after_the_audio_give_the_file_made_with_them() -> TestResult {
    let input = sine(440.0, 0.5, 3.0);
    let chunks: Vec<&[i16]> = input.chunks(4096).collect();
    for format in [AudioFormat::Opus, AudioFormat::Mp3, AudioFormat::Wav] {
        let spec = EncoderSpec {
            tags: narrator_audio::Tags {
                title: Some("A Book".into()),
                ..Default::default()
            },
            chapters: two_chapters(),
            ..EncoderSpec::new(format, RATE)
        };
        let (_, direct) = encode(&spec, &chunks)?;
        let late = encode_then_set_chapters(&spec, &two_chapters(), &chunks)?;
        if format == AudioFormat::Opus {
            let (a, b) = (parse_ogg_opus(direct)?, parse_ogg_opus(late)?);
            assert!(
                b.tags.iter().any(|t| t == "CHAPTER002=00:00:01.500"),
                "{:?}",
                b.tags
            );
            assert_eq!(a.tags, b.tags);
            assert_eq!(a.audio, b.audio);
            assert_eq!(a.granules, b.granules);
            assert!(b.ended);
        } else {
            assert!(direct == late, "{format:?}: the files differ");
        }
    }
    let spec = EncoderSpec {
        chapters: two_chapters(),
        ..EncoderSpec::new(AudioFormat::Opus, RATE)
    };
    let file = SharedFile::default();
    let mut sink = create_encoder(&spec, file.clone())?;
    sink.write(&input)?;
    let mut renamed = two_chapters();
    renamed[1].title = "Another title".into();
    let refused = sink
        .set_chapters(&renamed)
        .err()
        .ok_or("other titles accepted")?;
    assert!(refused.to_string().contains("same titles"), "{refused}");
    let unsorted = [two_chapters()[1].clone(), two_chapters()[0].clone()];
    assert!(sink.set_chapters(&unsorted).is_err());
    sink.finish()?;
    let ogg = parse_ogg_opus(file.bytes())?;
    assert!(ogg.tags.iter().any(|t| t == "CHAPTER002=00:00:01.500"));
    Ok(())
}

// ---------------------------------------------------------------------------------------
// WAV

#[test]
fn wav_file_round_trip_is_exact() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("segment.wav");
    let samples: Vec<i16> = vec![0, 1, -1, 32767, -32768, 1234, -4321];
    encode_wav_file(&path, RATE, &samples)?;
    assert_eq!(read_wav_i16(&path)?, (RATE, samples));
    assert_eq!(std::fs::metadata(&path)?.len(), 44 + 14);
    Ok(())
}

#[test]
fn wav_sink_streams_chunks_and_reports_size() -> TestResult {
    let a = sine(440.0, 0.5, 0.3);
    let b = sine(220.0, 0.2, 0.2);
    let (info, bytes) = encode(&EncoderSpec::new(AudioFormat::Wav, RATE), &[&a, &b, &[]])?;
    assert_eq!(info.samples_in, (a.len() + b.len()) as u64);
    assert_eq!(info.bytes, bytes.len() as u64);
    assert!((info.seconds - 0.5).abs() < 1e-3);
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("book.wav");
    std::fs::write(&path, &bytes)?;
    let (rate, back) = read_wav_i16(&path)?;
    assert_eq!(rate, RATE);
    assert_eq!(back, [a, b].concat());
    Ok(())
}

#[test]
fn empty_wav_is_a_valid_file() -> TestResult {
    let (info, bytes) = encode(&EncoderSpec::new(AudioFormat::Wav, RATE), &[])?;
    assert_eq!((info.samples_in, info.bytes), (0, 44));
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("empty.wav");
    std::fs::write(&path, bytes)?;
    assert_eq!(read_wav_i16(&path)?, (RATE, vec![]));
    Ok(())
}

#[test]
fn reading_a_stereo_or_missing_wav_is_a_clear_error() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("stereo.wav");
    let spec = hound::WavSpec {
        channels: 2,
        sample_rate: RATE,
        bits_per_sample: 16,
        sample_format: hound::SampleFormat::Int,
    };
    let mut w = hound::WavWriter::create(&path, spec)?;
    w.write_sample(0i16)?;
    w.write_sample(0i16)?;
    w.finalize()?;
    let err = read_wav_i16(&path).err().ok_or("stereo accepted")?;
    assert_eq!(err.kind(), "unsupported_wav");
    assert!(err.to_string().contains("2 channel(s)"), "{err}");
    let missing = read_wav_i16(&dir.path().join("nope.wav"))
        .err()
        .ok_or("missing accepted")?;
    assert_eq!(missing.kind(), "wav_read");
    assert!(std::error::Error::source(&missing).is_some());
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Ogg Opus

struct OggOpus {
    head: Vec<u8>,
    tags: Vec<String>,
    vendor: String,
    audio: Vec<Vec<u8>>,
    last_granule: u64,
    granules: Vec<u64>,
    ended: bool,
}

fn parse_ogg_opus(bytes: Vec<u8>) -> Result<OggOpus, Box<dyn std::error::Error>> {
    let mut reader = ogg::reading::PacketReader::new(Cursor::new(bytes));
    let head = reader.read_packet_expected()?;
    assert!(head.first_in_stream());
    let tags_packet = reader.read_packet_expected()?;
    let t = &tags_packet.data;
    assert_eq!(&t[..8], b"OpusTags");
    let u32_at = |i: usize| -> Result<usize, Box<dyn std::error::Error>> {
        let b: [u8; 4] = t.get(i..i + 4).ok_or("short OpusTags")?.try_into()?;
        Ok(u32::from_le_bytes(b) as usize)
    };
    let vendor_len = u32_at(8)?;
    let vendor = String::from_utf8(t[12..12 + vendor_len].to_vec())?;
    let mut pos = 12 + vendor_len;
    let count = u32_at(pos)?;
    pos += 4;
    let mut tags = Vec::new();
    for _ in 0..count {
        let len = u32_at(pos)?;
        tags.push(String::from_utf8(t[pos + 4..pos + 4 + len].to_vec())?);
        pos += 4 + len;
    }
    let mut audio = Vec::new();
    let mut granules = Vec::new();
    let mut last_granule = 0;
    let mut ended = false;
    while let Some(p) = reader.read_packet()? {
        if p.last_in_page() {
            granules.push(p.absgp_page());
        }
        last_granule = p.absgp_page();
        ended = p.last_in_stream();
        audio.push(p.data);
    }
    Ok(OggOpus {
        head: head.data,
        tags,
        vendor,
        audio,
        last_granule,
        granules,
        ended,
    })
}

#[test]
fn opus_sine_with_chapters_decodes_back_to_the_same_tone() -> TestResult {
    let input = sine(440.0, 0.5, 3.0);
    let spec = EncoderSpec {
        tags: narrator_audio::Tags {
            title: Some("A Book".into()),
            artist: Some("narrator".into()),
            ..Default::default()
        },
        chapters: two_chapters(),
        ..EncoderSpec::new(AudioFormat::Opus, RATE)
    };
    // Odd chunk sizes exercise the resampler and frame buffering.
    let chunks: Vec<&[i16]> = input.chunks(3001).collect();
    let (info, bytes) = encode(&spec, &chunks)?;
    assert_eq!(info.bytes, bytes.len() as u64);
    assert_eq!(info.samples_in, 66150);
    let ogg = parse_ogg_opus(bytes)?;

    // OpusHead
    let h = &ogg.head;
    assert_eq!(h.len(), 19);
    assert_eq!(&h[..8], b"OpusHead");
    assert_eq!(h[8], 1, "version");
    assert_eq!(h[9], 1, "channels");
    let pre_skip = u64::from(u16::from_le_bytes([h[10], h[11]]));
    assert!((80..=2000).contains(&pre_skip), "pre-skip {pre_skip}");
    assert_eq!(u32::from_le_bytes([h[12], h[13], h[14], h[15]]), RATE);
    assert_eq!(i16::from_le_bytes([h[16], h[17]]), 0, "gain");
    assert_eq!(h[18], 0, "mapping family");

    // OpusTags
    assert!(ogg.vendor.starts_with("narrator-audio"), "{}", ogg.vendor);
    for want in [
        "TITLE=A Book",
        "ARTIST=narrator",
        "CHAPTER001=00:00:00.000",
        "CHAPTER001NAME=Prologue",
        "CHAPTER002=00:00:01.500",
        "CHAPTER002NAME=Chapter One: Départ",
    ] {
        assert!(
            ogg.tags.iter().any(|t| t == want),
            "{want} missing in {:?}",
            ogg.tags
        );
    }

    // Granules: monotonic, end of stream flagged, duration right.
    assert!(ogg.ended, "last page must carry end-of-stream");
    assert!(
        ogg.granules.windows(2).all(|w| w[0] <= w[1]),
        "{:?}",
        ogg.granules
    );
    assert!(
        ogg.granules.len() >= 3,
        "pages of ~1 s expected: {:?}",
        ogg.granules
    );
    let duration = ogg.last_granule - pre_skip;
    assert!(
        duration.abs_diff(144_000) <= 960,
        "duration {duration} samples at 48 kHz"
    );

    // Decode and compare with the input tone.
    let mut decoder = opus::Decoder::new(48000, opus::Channels::Mono)?;
    let mut pcm = Vec::new();
    let mut frame = vec![0f32; 5760];
    for packet in &ogg.audio {
        let n = decoder.decode_float(packet, &mut frame, false)?;
        pcm.extend_from_slice(&frame[..n]);
    }
    let pcm = &pcm[pre_skip as usize..(pre_skip + duration) as usize];
    let body = &pcm[4800..pcm.len() - 4800]; // skip 0.1 s at both ends
    let zc = zero_crossings_per_second(body, 48000);
    assert!(
        (zc - 880.0).abs() < 20.0,
        "zero crossings {zc}/s, want ~880"
    );
    let level = rms(body);
    let want = 0.5 / 2f64.sqrt();
    assert!(
        (level - want).abs() < 0.1 * want,
        "rms {level}, want {want}"
    );
    Ok(())
}

#[test]
fn empty_opus_is_a_valid_stream() -> TestResult {
    let (info, bytes) = encode(&EncoderSpec::new(AudioFormat::Opus, RATE), &[])?;
    assert_eq!(info.samples_in, 0);
    let ogg = parse_ogg_opus(bytes)?;
    let pre_skip = u64::from(u16::from_le_bytes([ogg.head[10], ogg.head[11]]));
    assert!(ogg.ended);
    assert_eq!(ogg.audio.len(), 1);
    assert_eq!(ogg.last_granule, pre_skip);
    Ok(())
}

// ---------------------------------------------------------------------------------------
// MP3

struct DecodedMp3 {
    rate: u32,
    samples: Vec<f32>,
    title: Option<String>,
}

fn decode_mp3(bytes: Vec<u8>) -> Result<DecodedMp3, Box<dyn std::error::Error>> {
    use symphonia::core::audio::SampleBuffer;
    use symphonia::core::codecs::DecoderOptions;
    use symphonia::core::errors::Error as SymError;
    use symphonia::core::formats::FormatOptions;
    use symphonia::core::io::MediaSourceStream;
    use symphonia::core::meta::{MetadataOptions, StandardTagKey};
    use symphonia::core::probe::Hint;

    let mss = MediaSourceStream::new(Box::new(Cursor::new(bytes)), Default::default());
    let mut hint = Hint::new();
    hint.with_extension("mp3");
    let opts = FormatOptions {
        enable_gapless: true,
        ..Default::default()
    };
    let mut probed =
        symphonia::default::get_probe().format(&hint, mss, &opts, &MetadataOptions::default())?;
    let title = probed.metadata.get().and_then(|m| {
        m.current().and_then(|rev| {
            rev.tags()
                .iter()
                .find(|t| t.std_key == Some(StandardTagKey::TrackTitle))
                .map(|t| t.value.to_string())
        })
    });
    let mut format = probed.format;
    let track = format.default_track().ok_or("no track")?;
    let rate = track.codec_params.sample_rate.ok_or("no rate")?;
    let track_id = track.id;
    let mut decoder =
        symphonia::default::get_codecs().make(&track.codec_params, &DecoderOptions::default())?;
    let mut samples = Vec::new();
    loop {
        let packet = match format.next_packet() {
            Ok(p) => p,
            Err(SymError::IoError(e)) if e.kind() == io::ErrorKind::UnexpectedEof => break,
            Err(e) => return Err(e.into()),
        };
        if packet.track_id() != track_id {
            continue;
        }
        let decoded = decoder.decode(&packet)?;
        let mut buf = SampleBuffer::<f32>::new(decoded.capacity() as u64, *decoded.spec());
        buf.copy_interleaved_ref(decoded);
        samples.extend_from_slice(buf.samples());
    }
    Ok(DecodedMp3 {
        rate,
        samples,
        title,
    })
}

fn mpeg_sync_at(bytes: &[u8], at: usize) -> bool {
    bytes.len() > at + 1 && bytes[at] == 0xFF && bytes[at + 1] & 0xE0 == 0xE0
}

#[test]
fn mp3_sine_decodes_back_with_the_right_length_and_pitch() -> TestResult {
    let input = sine(440.0, 0.5, 3.0);
    let chunks: Vec<&[i16]> = input.chunks(5000).collect();
    let (info, bytes) = encode(&EncoderSpec::new(AudioFormat::Mp3, RATE), &chunks)?;
    assert_eq!(info.bytes, bytes.len() as u64);
    assert!(
        mpeg_sync_at(&bytes, 0),
        "no frame sync: {:02x?}",
        &bytes[..4]
    );
    // ~64 kbit/s for 3 s plus one Info frame.
    assert!(
        (20_000..30_000).contains(&bytes.len()),
        "{} bytes",
        bytes.len()
    );

    let DecodedMp3 {
        rate, samples: pcm, ..
    } = decode_mp3(bytes)?;
    assert_eq!(rate, RATE);
    let seconds = pcm.len() as f64 / f64::from(rate);
    assert!((seconds - 3.0).abs() < 0.1, "decoded {seconds} s");
    let body = &pcm[2205..pcm.len() - 2205];
    let zc = zero_crossings_per_second(body, rate);
    assert!((zc - 880.0).abs() < 20.0, "zero crossings {zc}/s");
    let level = rms(body);
    assert!((level - 0.3536).abs() < 0.05, "rms {level}");
    Ok(())
}

#[test]
fn mp3_with_tags_starts_with_id3_then_frames() -> TestResult {
    let input = sine(440.0, 0.5, 3.0);
    let spec = EncoderSpec {
        tags: narrator_audio::Tags {
            title: Some("A Book".into()),
            artist: Some("narrator".into()),
            ..Default::default()
        },
        chapters: two_chapters(),
        ..EncoderSpec::new(AudioFormat::Mp3, RATE)
    };
    let (_, bytes) = encode(&spec, &[&input])?;
    assert_eq!(&bytes[..4], b"ID3\x03");
    let tag_len = 10
        + bytes[6..10]
            .iter()
            .fold(0usize, |a, &b| (a << 7) | usize::from(b));
    assert!(
        mpeg_sync_at(&bytes, tag_len),
        "no frame sync after the ID3 tag"
    );
    // The Info tag placeholder has been filled in.
    assert!(
        bytes[tag_len..tag_len + 400]
            .windows(4)
            .any(|w| w == b"Info" || w == b"Xing")
    );
    let has_chap = bytes[..tag_len]
        .windows(4)
        .filter(|w| *w == b"CHAP")
        .count();
    assert_eq!(has_chap, 2);
    let DecodedMp3 {
        samples: pcm,
        title,
        ..
    } = decode_mp3(bytes)?;
    assert_eq!(title.as_deref(), Some("A Book"));
    let seconds = pcm.len() as f64 / f64::from(RATE);
    assert!((seconds - 3.0).abs() < 0.1, "decoded {seconds} s");
    Ok(())
}

#[test]
fn empty_mp3_finishes_cleanly() -> TestResult {
    let (info, bytes) = encode(&EncoderSpec::new(AudioFormat::Mp3, RATE), &[])?;
    assert_eq!(info.samples_in, 0);
    assert_eq!(info.bytes, bytes.len() as u64);
    assert!(bytes.is_empty() || mpeg_sync_at(&bytes, 0));
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Streaming: memory stays flat however long the book.

/// Writes `seconds` one-second chunks; returns (info, heap growth after the first minute,
/// peak heap above the start, CPU seconds of this thread or wall seconds if unknown).
fn stream(format: AudioFormat, seconds: u64) -> Result<(EncodedInfo, i64, i64, f64), AudioError> {
    let chunks: Vec<Vec<i16>> = (0..10).map(speechlike_second).collect();
    let out = CountingFile::default();
    let start_heap = heap_mark();
    let started = Instant::now();
    let started_cpu = thread_cpu_seconds();
    // M4B is muxed by FFmpeg into a file; its C allocations (the MP4 index, a few bytes
    // per 1024 samples) are not seen by this counter, only the sink's own.
    let dir = tempfile::tempdir().map_err(|source| AudioError::Io {
        context: "making a test folder",
        source,
    })?;
    let m4b = dir.path().join("stream.m4b");
    let mut sink: Box<dyn AudioSink + Send> = if format == AudioFormat::M4b {
        narrator_audio::create_file_encoder(&EncoderSpec::new(format, RATE), &m4b)?
    } else {
        create_encoder(&EncoderSpec::new(format, RATE), out.clone())?
    };
    let mut after_first_minute = 0;
    for s in 0..seconds {
        sink.write(&chunks[(s % 10) as usize])?;
        if s == 60 {
            after_first_minute = heap_peak();
        }
    }
    let grown = heap_peak() - after_first_minute;
    let info = sink.finish()?;
    let elapsed = match (started_cpu, thread_cpu_seconds()) {
        (Some(a), Some(b)) => b - a,
        _ => started.elapsed().as_secs_f64(),
    };
    let written = if format == AudioFormat::M4b {
        std::fs::metadata(&m4b)
            .map_err(|source| AudioError::Io {
                context: "measuring the test file",
                source,
            })?
            .len()
    } else {
        out.len()
    };
    assert_eq!(info.bytes, written);
    Ok((info, grown, heap_peak() - start_heap, elapsed))
}

#[test]
fn ten_minutes_stream_in_flat_memory() -> TestResult {
    for format in AudioFormat::ALL {
        let (info, grown, peak, _) = stream(format, 600)?;
        assert_eq!(info.samples_in, 600 * u64::from(RATE));
        assert!((info.seconds - 600.0).abs() < 1e-6);
        // Buffering the book would grow by ~26 MB here; allow for allocator noise only.
        assert!(
            grown <= 64 * 1024,
            "{format}: heap grew {grown} B after the first minute"
        );
        assert!(peak < 2 * 1024 * 1024, "{format}: peak heap {peak} B");
    }
    Ok(())
}

/// `cargo test -p narrator-audio --release -- --ignored --nocapture`
#[test]
#[ignore = "one hour of audio per format; run in release for the throughput figures"]
fn one_hour_throughput() -> TestResult {
    for format in AudioFormat::ALL {
        let (info, grown, peak, secs) = stream(format, 3600)?;
        println!(
            "{format:>4}: 1 h of {RATE} Hz mono in {secs:.1} s of CPU ({:.0}x real time), {:.1} MB out, \
             peak heap {:.0} KiB, growth after 1st minute {grown} B",
            3600.0 / secs,
            info.bytes as f64 / 1e6,
            peak as f64 / 1024.0,
        );
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Encoder effort on real speech: CPU time against what the codec changes.

/// Signal-to-noise ratio (dB) of `decoded` against `reference`, after finding the best
/// alignment within ±`max_lag` samples on a 5 s excerpt.
fn snr_db(reference: &[f32], decoded: &[f32], rate: u32, max_lag: i64) -> (f64, i64) {
    let n = reference.len().min(decoded.len());
    let from = (rate as usize * 10).min(n / 4);
    let to = (from + rate as usize * 5).min(n.saturating_sub(max_lag as usize));
    let at = |x: &[f32], i: i64| -> f64 {
        usize::try_from(i)
            .ok()
            .and_then(|i| x.get(i))
            .map_or(0.0, |&v| f64::from(v))
    };
    let mut best = (f64::MIN, 0);
    for lag in -max_lag..=max_lag {
        let c: f64 = (from..to)
            .map(|i| f64::from(reference[i]) * at(decoded, i as i64 + lag))
            .sum();
        if c > best.0 {
            best = (c, lag);
        }
    }
    let lag = best.1;
    let (mut signal, mut noise) = (0.0, 0.0);
    for (i, &r) in reference[..n].iter().enumerate() {
        let d = at(decoded, i as i64 + lag);
        signal += f64::from(r) * f64::from(r);
        noise += (f64::from(r) - d) * (f64::from(r) - d);
    }
    (10.0 * (signal / noise.max(1e-12)).log10(), lag)
}

fn decode_opus_whole(bytes: Vec<u8>) -> Result<Vec<f32>, Box<dyn std::error::Error>> {
    let ogg = parse_ogg_opus(bytes)?;
    let pre_skip = usize::from(u16::from_le_bytes([ogg.head[10], ogg.head[11]]));
    let mut decoder = opus::Decoder::new(48000, opus::Channels::Mono)?;
    let (mut pcm, mut frame) = (Vec::new(), vec![0f32; 5760]);
    for packet in &ogg.audio {
        let n = decoder.decode_float(packet, &mut frame, false)?;
        pcm.extend_from_slice(&frame[..n]);
    }
    let end = usize::try_from(ogg.last_granule)?.min(pcm.len());
    Ok(pcm[pre_skip.min(end)..end].to_vec())
}

/// Make the speech once (`narrator synth CHAPTER.txt -o /tmp/speech.wav`), then
/// `NARRATOR_SPEECH_WAV=/tmp/speech.wav cargo test -p narrator-audio --release --test
/// encoders -- --ignored --nocapture speech_effort`: every setting's CPU seconds per hour
/// of speech, SNR of the decoded signal and size, one line each.
#[test]
#[ignore = "needs NARRATOR_SPEECH_WAV (real speech); run in release for the figures"]
fn speech_effort_sweep() -> TestResult {
    let path = std::env::var("NARRATOR_SPEECH_WAV")
        .map_err(|_| "set NARRATOR_SPEECH_WAV to a WAV of the voice's speech")?;
    let (rate, input) = read_wav_i16(std::path::Path::new(&path))?;
    let hours = input.len() as f64 / f64::from(rate) / 3600.0;
    let reference48 = narrator_audio::resample_for_opus(&input, rate)?;
    let reference: Vec<f32> = input.iter().map(|&s| f32::from(s) / 32768.0).collect();
    let base = narrator_audio::EncoderTuning::default();
    let mut settings = Vec::new();
    for complexity in [10, 8, 5, 3, 1] {
        for (celt_only, band_cap) in [(false, false), (true, false), (false, true), (true, true)] {
            settings.push((
                AudioFormat::Opus,
                narrator_audio::EncoderTuning {
                    opus_complexity: complexity,
                    opus_celt_only: celt_only,
                    opus_band_cap: band_cap,
                    ..base
                },
            ));
        }
    }
    for q in [2, 3, 5, 7, 9] {
        settings.push((
            AudioFormat::Mp3,
            narrator_audio::EncoderTuning {
                mp3_quality: q,
                ..base
            },
        ));
    }
    println!("{:.1} min of speech at {rate} Hz from {path}", hours * 60.0);
    for (format, tuning) in settings {
        let spec = EncoderSpec {
            tuning,
            ..EncoderSpec::new(format, rate)
        };
        let before = thread_cpu_seconds().unwrap_or(0.0);
        let (info, bytes) = encode(&spec, &input.chunks(22050).collect::<Vec<_>>())?;
        let cpu = thread_cpu_seconds().unwrap_or(0.0) - before;
        let (snr, lag) = match format {
            AudioFormat::Opus => snr_db(&reference48, &decode_opus_whole(bytes)?, 48000, 1200),
            _ => snr_db(&reference, &decode_mp3(bytes)?.samples, rate, 1200),
        };
        println!(
            "{format} complexity={} celt_only={} band_cap={} mp3_q={}: {:.1} CPU s per hour, \
             SNR {snr:.2} dB (lag {lag}), {:.1} MB per hour",
            tuning.opus_complexity,
            tuning.opus_celt_only,
            tuning.opus_band_cap,
            tuning.mp3_quality,
            cpu / hours,
            info.bytes as f64 / 1e6 / hours,
        );
    }
    Ok(())
}
