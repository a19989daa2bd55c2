//! Audio files read back by an independent reader: FFmpeg's `ffprobe` and `ffmpeg`
//! (Debian's ffmpeg package, installed by ops/setup.sh), never the libraries' calls
//! that wrote them.

use std::path::Path;
use std::process::Command;

/// A valid 1×1 PNG: the cover of the test books.
pub const PNG: [u8; 67] = [
    0x89, 0x50, 0x4E, 0x47, 0x0D, 0x0A, 0x1A, 0x0A, 0x00, 0x00, 0x00, 0x0D, 0x49, 0x48, 0x44, 0x52,
    0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x01, 0x08, 0x06, 0x00, 0x00, 0x00, 0x1F, 0x15, 0xC4,
    0x89, 0x00, 0x00, 0x00, 0x0A, 0x49, 0x44, 0x41, 0x54, 0x78, 0x9C, 0x63, 0x00, 0x01, 0x00, 0x00,
    0x05, 0x00, 0x01, 0x0D, 0x0A, 0x2D, 0xB4, 0x00, 0x00, 0x00, 0x00, 0x49, 0x45, 0x4E, 0x44, 0xAE,
    0x42, 0x60, 0x82,
];

/// `ffprobe -of json` of a file: format, streams and chapters.
pub fn ffprobe(path: &Path) -> serde_json::Value {
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
        .expect("ffprobe (Debian's ffmpeg, installed by ops/setup.sh)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("ffprobe JSON")
}

/// An M4B against its manifest: its duration, every chapter's title and start (within
/// one AAC frame at 22050 Hz), AAC audio, no chapter files listed, the PNG cover
/// embedded. Returns the format tags for the caller's checks.
pub fn check_m4b(manifest: &serde_json::Value, book: &Path) -> serde_json::Value {
    let frame = 1024.0 / 22050.0;
    assert_eq!(manifest["format"], "m4b");
    assert!(
        book.to_string_lossy().ends_with(".m4b"),
        "{}",
        book.display()
    );
    let p = ffprobe(book);
    let secs = |v: &serde_json::Value| {
        v.as_str()
            .and_then(|s| s.parse::<f64>().ok())
            .expect("a time")
    };
    let duration = secs(&p["format"]["duration"]);
    let want = manifest["book"]["seconds"].as_f64().expect("seconds");
    assert!((duration - want).abs() <= frame, "{duration} vs {want}");
    let chapters = p["chapters"].as_array().expect("chapters");
    let listed = manifest["chapters"].as_array().expect("chapters");
    assert_eq!(chapters.len(), listed.len(), "{p}");
    for (c, l) in chapters.iter().zip(listed) {
        assert_eq!(c["tags"]["title"], l["title"]);
        assert!(l.get("file").is_none(), "no chapter files for M4B: {l}");
        let start = secs(&c["start_time"]);
        let want = l["start_seconds"].as_f64().expect("start");
        assert!(
            (start - want).abs() <= frame,
            "{}: {start} vs {want}",
            l["title"]
        );
    }
    let streams = p["streams"].as_array().expect("streams");
    assert!(
        streams
            .iter()
            .any(|s| s["codec_type"] == "audio" && s["codec_name"] == "aac"),
        "{p}"
    );
    let cover = streams
        .iter()
        .find(|s| s["disposition"]["attached_pic"] == 1)
        .expect("a cover");
    assert_eq!(cover["codec_name"], "png");
    assert_eq!(manifest["book"]["cover"]["bytes"], PNG.len());
    p["format"]["tags"].clone()
}

/// The cues of a subtitle file (SRT or WebVTT) as FFmpeg reads them: `(start, end,
/// text)` in seconds, in order.
pub fn subtitle_cues(path: &Path) -> Vec<(f64, f64, String)> {
    let out = Command::new("ffprobe")
        .args(["-v", "error", "-of", "json", "-show_packets", "-show_data"])
        .arg(path)
        .output()
        .expect("ffprobe (Debian's ffmpeg, installed by ops/setup.sh)");
    assert!(
        out.status.success(),
        "{}: {}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("ffprobe JSON");
    let number = |v: &serde_json::Value| {
        v.as_str()
            .and_then(|s| s.parse::<f64>().ok())
            .expect("a time")
    };
    json["packets"]
        .as_array()
        .expect("packets")
        .iter()
        .map(|p| {
            let start = number(&p["pts_time"]);
            let text = hexdump_text(p["data"].as_str().unwrap_or_default());
            (start, start + number(&p["duration_time"]), text)
        })
        .collect()
}

/// The bytes of ffprobe's `-show_data` hexdump (`00000000: 4865 6c6c  Hell`) as text.
fn hexdump_text(dump: &str) -> String {
    let mut bytes = Vec::new();
    for line in dump.lines() {
        let Some((_, rest)) = line.split_once(": ") else {
            continue;
        };
        // The hex groups end where two spaces start the ASCII column.
        let hex = rest.split("  ").next().unwrap_or_default();
        for group in hex.split_whitespace() {
            for i in (0..group.len()).step_by(2) {
                if let Ok(b) = u8::from_str_radix(&group[i..(i + 2).min(group.len())], 16) {
                    bytes.push(b);
                }
            }
        }
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Runs EPUBCheck (Debian's `epubcheck`, installed by `ops/setup.sh --test`) on `path`
/// and returns its report; fails the test unless it found no error and no fatal.
pub fn epubcheck(path: &Path) -> String {
    // Debian's /usr/bin/epubcheck is the jar itself, run through binfmt (jarwrapper),
    // which a container may not have: run the jar with java.
    let jar = Path::new("/usr/share/java/epubcheck.jar");
    assert!(
        jar.is_file(),
        "EPUBCheck missing: run `bash ops/setup.sh --test` (Debian's epubcheck)"
    );
    let out = Command::new("java")
        .arg("-jar")
        .arg(jar)
        .arg(path)
        .output()
        .expect("java (Debian's default-jre, an epubcheck dependency)");
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && report.contains("0 fatals / 0 errors"),
        "EPUBCheck: {report}"
    );
    report
}
