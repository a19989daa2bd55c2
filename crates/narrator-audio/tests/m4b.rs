//! M4B files read back by an independent reader: FFmpeg's command-line tools (Debian's
//! `ffmpeg` package, installed by ops/setup.sh), not the libraries' calls that wrote them.
//! Checked: duration, chapter count, titles and starts (within one AAC frame), tags,
//! the cover (the same bytes come out), and that the audio is the tone that went in.

use std::path::Path;
use std::process::Command;

use narrator_audio::{AudioFormat, ChapterMark, EncoderSpec, Tags, create_file_encoder};

type TestResult = Result<(), Box<dyn std::error::Error>>;

const RATE: u32 = 22050;
/// One AAC frame at the test rate: the precision promised for chapter starts.
const FRAME_SECONDS: f64 = 1024.0 / RATE as f64;

/// A valid 1×1 PNG.
const PNG: [u8; 67] = [
    0x89, 0x50, 0x4E, 0x47, 0x0D, 0x0A, 0x1A, 0x0A, 0x00, 0x00, 0x00, 0x0D, 0x49, 0x48, 0x44, 0x52,
    0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x01, 0x08, 0x06, 0x00, 0x00, 0x00, 0x1F, 0x15, 0xC4,
    0x89, 0x00, 0x00, 0x00, 0x0A, 0x49, 0x44, 0x41, 0x54, 0x78, 0x9C, 0x63, 0x00, 0x01, 0x00, 0x00,
    0x05, 0x00, 0x01, 0x0D, 0x0A, 0x2D, 0xB4, 0x00, 0x00, 0x00, 0x00, 0x49, 0x45, 0x4E, 0x44, 0xAE,
    0x42, 0x60, 0x82,
];

fn sine(freq: f64, seconds: f64) -> Vec<i16> {
    let n = (seconds * f64::from(RATE)) as usize;
    (0..n)
        .map(|i| {
            let t = i as f64 / f64::from(RATE);
            (0.5 * (2.0 * std::f64::consts::PI * freq * t).sin() * 32767.0) as i16
        })
        .collect()
}

/// `ffprobe -of json` of the file: format, streams and chapters.
fn probe(path: &Path) -> Result<serde_json::Value, Box<dyn std::error::Error>> {
    let out = Command::new("ffprobe")
        .args([
            "-v",
            "error",
            "-of",
            "json",
            "-show_format",
            "-show_streams",
        ])
        .arg("-show_chapters")
        .arg(path)
        .output()
        .map_err(|e| {
            format!("ffprobe cannot run ({e}): install Debian's ffmpeg (bash ops/setup.sh)")
        })?;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(serde_json::from_slice(&out.stdout)?)
}

/// The embedded picture, copied out by ffmpeg into `to`.
fn extract_cover(path: &Path, to: &Path) -> Result<Vec<u8>, Box<dyn std::error::Error>> {
    let status = Command::new("ffmpeg")
        .args(["-v", "error", "-i"])
        .arg(path)
        .args(["-map", "0:v", "-c", "copy", "-f", "image2"])
        .arg(to)
        .status()?;
    assert!(status.success(), "{}: no cover stream", path.display());
    Ok(std::fs::read(to)?)
}

fn secs(v: &serde_json::Value) -> f64 {
    v.as_str().and_then(|s| s.parse().ok()).unwrap_or(f64::NAN)
}

#[test]
fn m4b_has_chapters_tags_and_cover_that_ffmpeg_reads_back() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("book.m4b");
    let parts = [
        ("Chapter One", 440.0, 2.0),
        ("Chapter Two: Ünïcödé", 660.0, 1.5),
        ("Three", 880.0, 2.5),
    ];
    let mut start = 0.0;
    let chapters: Vec<ChapterMark> = parts
        .iter()
        .map(|&(title, _, len)| {
            let c = ChapterMark {
                title: title.into(),
                start_seconds: start,
            };
            start += len;
            c
        })
        .collect();
    let cover = narrator_core::Cover::from_bytes(PNG.to_vec())?;
    let spec = EncoderSpec {
        tags: Tags {
            title: Some("The Book".into()),
            artist: Some("Ann Author".into()),
            album: Some("The Book".into()),
            narrator: Some("narrator (test)".into()),
            date: Some("1865".into()),
            language: Some("en-GB".into()),
            publisher: Some("Macmillan".into()),
            genre: Some("Audiobook".into()),
            cover: Some(cover),
        },
        chapters,
        ..EncoderSpec::new(AudioFormat::M4b, RATE)
    };
    let mut sink = create_file_encoder(&spec, &path)?;
    for &(_, freq, len) in &parts {
        // Odd chunk sizes exercise the frame buffering.
        for chunk in sine(freq, len).chunks(3001) {
            sink.write(chunk)?;
        }
    }
    let info = sink.finish()?;
    assert_eq!(info.samples_in, (6.0 * f64::from(RATE)) as u64);
    assert_eq!(info.bytes, std::fs::metadata(&path)?.len());

    let p = probe(&path)?;
    let duration = secs(&p["format"]["duration"]);
    assert!(
        (duration - 6.0).abs() <= FRAME_SECONDS,
        "duration {duration}"
    );
    let chapters = p["chapters"].as_array().cloned().unwrap_or_default();
    assert_eq!(chapters.len(), 3, "{p}");
    let mut expected_start = 0.0;
    for (c, &(title, _, len)) in chapters.iter().zip(&parts) {
        assert_eq!(c["tags"]["title"], title);
        let s = secs(&c["start_time"]);
        assert!(
            (s - expected_start).abs() <= FRAME_SECONDS,
            "{title}: start {s}"
        );
        let e = secs(&c["end_time"]);
        assert!(
            (e - (expected_start + len)).abs() <= FRAME_SECONDS,
            "{title}: end {e}"
        );
        expected_start += len;
    }
    let tags = &p["format"]["tags"];
    assert_eq!(tags["title"], "The Book");
    assert_eq!(tags["artist"], "Ann Author");
    assert_eq!(tags["album"], "The Book");
    assert_eq!(tags["composer"], "narrator (test)");
    assert_eq!(tags["date"], "1865");
    assert_eq!(tags["genre"], "Audiobook");
    assert_eq!(tags["media_type"], "2", "iTunes media kind Audiobook");
    let streams = p["streams"].as_array().cloned().unwrap_or_default();
    let audio = streams
        .iter()
        .find(|s| s["codec_type"] == "audio")
        .ok_or("no audio stream")?;
    assert_eq!(audio["codec_name"], "aac");
    assert_eq!(audio["channels"], 1);
    assert_eq!(audio["sample_rate"], RATE.to_string());
    assert_eq!(audio["tags"]["language"], "eng");
    let pic = streams
        .iter()
        .find(|s| s["disposition"]["attached_pic"] == 1)
        .ok_or("no cover stream")?;
    assert_eq!(pic["codec_name"], "png");

    // The cover comes out byte for byte.
    assert_eq!(extract_cover(&path, &dir.path().join("cover.png"))?, PNG);

    // The audio is the tones that went in: 440, 660 and 880 Hz by zero crossings in the
    // middle of each chapter, decoded by ffmpeg.
    let pcm = Command::new("ffmpeg")
        .args(["-v", "error", "-i"])
        .arg(&path)
        .args(["-map", "0:a", "-f", "s16le", "-ac", "1", "-"])
        .output()?;
    assert!(pcm.status.success());
    let samples: Vec<i16> = pcm
        .stdout
        .chunks_exact(2)
        .map(|b| i16::from_le_bytes([b[0], b[1]]))
        .collect();
    let mut at = 0.0;
    for &(title, freq, len) in &parts {
        let from = ((at + 0.25) * f64::from(RATE)) as usize;
        let to = ((at + len - 0.25) * f64::from(RATE)) as usize;
        let window = &samples[from..to.min(samples.len())];
        let crossings = window
            .windows(2)
            .filter(|w| (w[0] < 0) != (w[1] < 0))
            .count();
        let measured = crossings as f64 / 2.0 / (window.len() as f64 / f64::from(RATE));
        assert!(
            (measured - freq).abs() < freq * 0.02,
            "{title}: {measured} Hz, expected {freq}"
        );
        at += len;
    }
    Ok(())
}

#[test]
fn m4b_needs_a_file_and_a_readable_cover() -> TestResult {
    let spec = EncoderSpec::new(AudioFormat::M4b, RATE);
    let err = narrator_audio::create_encoder(&spec, std::io::Cursor::new(Vec::new()))
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(err.contains("create_file_encoder"), "{err}");
    // A PNG signature with a broken header: refused with what to do, no file presented.
    let dir = tempfile::tempdir()?;
    let mut broken = PNG[..12].to_vec();
    broken.extend_from_slice(&[0; 4]);
    let spec = EncoderSpec {
        tags: Tags {
            cover: Some(narrator_core::Cover::from_bytes(broken)?),
            ..Tags::default()
        },
        ..EncoderSpec::new(AudioFormat::M4b, RATE)
    };
    let err = create_file_encoder(&spec, &dir.path().join("x.m4b"))
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        err.contains("cover") && err.contains("JPEG or PNG"),
        "{err}"
    );
    Ok(())
}

/// The file's tags with lower-case keys: the container's, and the audio stream's (where
/// FFmpeg puts an Ogg stream's Vorbis comments, in their upper case).
fn tags_of(p: &serde_json::Value) -> std::collections::HashMap<String, String> {
    let audio = p["streams"]
        .as_array()
        .and_then(|s| s.iter().find(|s| s["codec_type"] == "audio"))
        .map(|s| s["tags"].clone());
    [Some(p["format"]["tags"].clone()), audio]
        .into_iter()
        .flatten()
        .filter_map(|t| t.as_object().cloned())
        .flat_map(|m| {
            m.into_iter()
                .map(|(k, v)| (k.to_lowercase(), v.as_str().unwrap_or_default().to_owned()))
        })
        .collect()
}

#[test]
fn opus_and_mp3_carry_the_book_tags_and_cover_too() -> TestResult {
    let dir = tempfile::tempdir()?;
    let tags = Tags {
        title: Some("Chapter One".into()),
        artist: Some("Ann Author".into()),
        album: Some("The Book".into()),
        narrator: Some("narrator (test)".into()),
        date: Some("1865-11-26".into()),
        language: Some("en".into()),
        publisher: Some("Macmillan".into()),
        genre: Some("Audiobook".into()),
        cover: Some(narrator_core::Cover::from_bytes(PNG.to_vec())?),
    };
    for format in [AudioFormat::Opus, AudioFormat::Mp3] {
        let path = dir.path().join(format!("book.{format}"));
        let spec = EncoderSpec {
            tags: tags.clone(),
            ..EncoderSpec::new(format, RATE)
        };
        let mut sink = create_file_encoder(&spec, &path)?;
        sink.write(&sine(440.0, 1.0))?;
        sink.finish()?;
        let p = probe(&path)?;
        let t = tags_of(&p);
        let want = [
            ("title", "Chapter One"),
            ("artist", "Ann Author"),
            ("album", "The Book"),
            ("composer", "narrator (test)"),
            ("genre", "Audiobook"),
        ];
        for (k, v) in want {
            assert_eq!(t.get(k).map(String::as_str), Some(v), "{format} {k}: {t:?}");
        }
        match format {
            AudioFormat::Opus => {
                assert_eq!(t.get("date").map(String::as_str), Some("1865-11-26"));
                assert_eq!(t.get("language").map(String::as_str), Some("en"));
                assert_eq!(t.get("organization").map(String::as_str), Some("Macmillan"));
            }
            _ => {
                // ID3v2.3 has a year frame and ISO 639-2 languages.
                assert_eq!(t.get("date").map(String::as_str), Some("1865"), "{t:?}");
                assert_eq!(t.get("language").map(String::as_str), Some("eng"));
                assert_eq!(t.get("publisher").map(String::as_str), Some("Macmillan"));
            }
        }
        let extracted = dir.path().join(format!("cover-{format}.png"));
        assert_eq!(extract_cover(&path, &extracted)?, PNG, "{format} cover");
    }
    Ok(())
}
