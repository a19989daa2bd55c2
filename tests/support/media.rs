//! Audio files read back by an independent reader: FFmpeg's `ffprobe` and `ffmpeg`
//! (Debian's ffmpeg package, installed by ops/setup.sh), never the libraries' calls
//! that wrote them; EPUBs checked by EPUBCheck; and the test books in formats other
//! than text (an EPUB with a stylesheet and images).

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

/// Seconds of audio FFmpeg decodes from a file, counted from its samples (not from its
/// header, which a stream may leave unknown: a streamed FLAC's STREAMINFO has no length).
pub fn decoded_seconds(path: &Path) -> f64 {
    let out = Command::new("ffmpeg")
        .args(["-v", "error", "-i"])
        .arg(path)
        .args(["-f", "s16le", "-ac", "1", "-ar", "8000", "-"])
        .output()
        .expect("ffmpeg (Debian's, installed by ops/setup.sh)");
    assert!(
        out.status.success(),
        "ffmpeg could not decode {}: {}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout.len() as f64 / 2.0 / 8000.0
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

/// A two-chapter EPUB 3 with an author, a cover, a stylesheet (whose `url()` names an
/// image) and an illustration before a paragraph with a class.
pub fn harbour_epub(path: &Path) {
    use std::io::Write;
    let f = std::fs::File::create(path).expect("create");
    let mut z = zip::ZipWriter::new(f);
    let opt = zip::write::SimpleFileOptions::default();
    for image in ["OEBPS/cover.png", "OEBPS/art/boat at dawn.png"] {
        z.start_file(image, opt).expect("entry");
        z.write_all(&PNG).expect("write");
    }
    let mut put = |name: &str, body: &str| {
        z.start_file(name, opt).expect("entry");
        z.write_all(body.as_bytes()).expect("write");
    };
    put("mimetype", "application/epub+zip");
    put(
        "META-INF/container.xml",
        r#"<?xml version="1.0"?><container version="1.0" xmlns="urn:oasis:names:tc:opendocument:xmlns:container"><rootfiles><rootfile full-path="OEBPS/book.opf" media-type="application/oebps-package+xml"/></rootfiles></container>"#,
    );
    put(
        "OEBPS/book.opf",
        r#"<?xml version="1.0"?><package xmlns="http://www.idpf.org/2007/opf" version="3.0"><metadata xmlns:dc="http://purl.org/dc/elements/1.1/"><dc:title>Harbour Notes</dc:title><dc:creator>Ada Quay</dc:creator><dc:language>en</dc:language><dc:date>1901</dc:date><dc:publisher>Tide Press</dc:publisher></metadata><manifest><item id="cv" href="cover.png" media-type="image/png" properties="cover-image"/><item id="nav" href="nav.xhtml" media-type="application/xhtml+xml" properties="nav"/><item id="css" href="css/harbour.css" media-type="text/css"/><item id="boat" href="art/boat%20at%20dawn.png" media-type="image/png"/><item id="a" href="a.xhtml" media-type="application/xhtml+xml"/><item id="b" href="b.xhtml" media-type="application/xhtml+xml"/></manifest><spine><itemref idref="a"/><itemref idref="b"/></spine></package>"#,
    );
    put(
        "OEBPS/nav.xhtml",
        r#"<?xml version="1.0"?><html xmlns="http://www.w3.org/1999/xhtml" xmlns:epub="http://www.idpf.org/2007/ops"><body><nav epub:type="toc"><ol><li><a href="a.xhtml">Morning Tide</a></li><li><a href="b.xhtml">Evening Tide</a></li></ol></nav></body></html>"#,
    );
    put(
        "OEBPS/a.xhtml",
        r#"<?xml version="1.0"?><html xmlns="http://www.w3.org/1999/xhtml"><head><title>a</title><link rel="stylesheet" type="text/css" href="css/harbour.css"/></head><body><h1>Morning Tide</h1><div class="plate"><img src="art/boat%20at%20dawn.png" alt="A boat at dawn"/></div><p class="first">The boats went out before dawn. Gulls followed them.</p></body></html>"#,
    );
    put(
        "OEBPS/css/harbour.css",
        ".first { text-indent: 0 }\n.plate { background: url(../art/boat%20at%20dawn.png) }\n",
    );
    put(
        "OEBPS/b.xhtml",
        r#"<?xml version="1.0"?><html xmlns="http://www.w3.org/1999/xhtml"><body><h1>Evening Tide</h1><p>By dusk the harbour was full again.</p></body></html>"#,
    );
    z.finish().expect("finish");
}

/// Checks that the read-along EPUB made from [`harbour_epub`] kept its looks: the
/// stylesheet and illustration byte for byte at their archive paths, linked and shown
/// where the book had them, the paragraph's class; the second chapter, which had none,
/// shows none.
pub fn assert_harbour_looks_kept(epub: &Path) {
    use std::io::Read as _;
    let mut zip = zip::ZipArchive::new(std::fs::File::open(epub).expect("epub")).expect("zip");
    let mut entry = |name: &str| {
        let mut bytes = Vec::new();
        zip.by_name(name)
            .unwrap_or_else(|e| panic!("{name} in the EPUB: {e}"))
            .read_to_end(&mut bytes)
            .expect("read");
        bytes
    };
    assert_eq!(entry("OEBPS/source/OEBPS/art/boat at dawn.png"), PNG);
    let css = String::from_utf8(entry("OEBPS/source/OEBPS/css/harbour.css")).expect("css");
    assert!(css.contains(".first { text-indent: 0 }"), "{css}");
    let first = String::from_utf8(entry("OEBPS/text/ch001.xhtml")).expect("xhtml");
    assert!(
        first.contains(r#"href="../source/OEBPS/css/harbour.css""#),
        "the chapter links the book's stylesheet: {first}"
    );
    let image = first
        .find(r#"<img src="../source/OEBPS/art/boat%20at%20dawn.png" alt="A boat at dawn"/>"#)
        .expect("the illustration, where the book had it");
    let paragraph = first
        .find(r#"<p class="first"><span id="s000000">"#)
        .expect("the paragraph keeps its class");
    assert!(image < paragraph, "the image comes before the paragraph");
    let second = String::from_utf8(entry("OEBPS/text/ch002.xhtml")).expect("xhtml");
    assert!(
        !second.contains("harbour.css") && !second.contains("<img"),
        "the second chapter links no stylesheet and shows no image: {second}"
    );
}
