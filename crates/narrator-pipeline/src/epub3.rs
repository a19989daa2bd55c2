//! Read-along EPUB 3 with Media Overlays: the book's text as XHTML (each sentence a
//! `span` with an id, paragraphs as the book had them), one MP3 per chapter, and per
//! chapter a SMIL file pairing every sentence with its clip of that chapter's audio, at
//! the exact samples the assembly placed it (the same layout as the subtitles). Reading
//! systems that play Media Overlays (Thorium, Apple Books, BookFusion...) highlight each
//! sentence as it is read. The package has navigation, the book's metadata and cover,
//! and `media:duration` for each overlay and the whole book, as EPUB 3.3 asks.
//!
//! The text is what was spoken (after normalization and lexicons), as in the subtitles.
//! From an EPUB input read with `keep_looks`, each paragraph is shown as the element and
//! class it had, with the images before it, and the chapter links the stylesheets its
//! pages linked: the source's stylesheets, images and fonts are carried under `source/`
//! at their archive paths, so the stylesheets' own `url()`s still resolve. Inline markup
//! (emphasis, links) is not kept: a sentence can cross it.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use narrator_core::{JobPlan, PauseAfter};

use crate::PipelineError;

/// The media type of an EPUB (the `mimetype` file, and an EPUB's MIME type).
pub const EPUB_MIME: &str = "application/epub+zip";

/// One chapter of the EPUB: its audio file and where each of its sentences is spoken in
/// it.
#[derive(Debug, Clone)]
pub struct EpubChapter {
    /// The chapter's audio (an MP3 file).
    pub audio: PathBuf,
    /// Its length, in seconds.
    pub seconds: f64,
    /// Its segments, in order.
    pub sentences: Vec<EpubSentence>,
}

/// Where one segment is spoken in its chapter's audio.
#[derive(Debug, Clone)]
pub struct EpubSentence {
    /// The segment's index.
    pub index: u32,
    /// Its first sample, in seconds of the chapter's audio.
    pub start: f64,
    /// The end of its speech (pauses excluded), in seconds.
    pub end: f64,
    /// Its words: byte range in the segment's text and start in seconds (empty: not
    /// known). With word-level overlays each word is a `span` and a clip of its own.
    pub words: Vec<(std::ops::Range<usize>, f64)>,
}

/// How fine the Media Overlays are (`--epub-overlay sentence|word`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Overlay {
    #[default]
    /// One clip per sentence.
    Sentences,
    /// One clip per word (per sentence where its words are not known): each from the
    /// word's start to the next word's, so the clips still cover the whole sentence.
    Words,
}

impl Overlay {
    /// Its name, as `--epub-overlay` takes it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Sentences => "sentence",
            Self::Words => "word",
        }
    }
}

/// An `--epub-overlay` value that is not one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown overlay '{0}': use sentence (a clip per sentence) or word (a clip per word)")]
pub struct UnknownOverlay(pub String);

impl std::str::FromStr for Overlay {
    type Err = UnknownOverlay;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "sentence" | "sentences" => Ok(Self::Sentences),
            "word" | "words" => Ok(Self::Words),
            _ => Err(UnknownOverlay(s.to_string())),
        }
    }
}

/// `h:mm:ss.fff`, a SMIL clock value (also what `media:duration` takes).
fn clock(seconds: f64) -> String {
    let ms = (seconds.max(0.0) * 1000.0).round() as u64;
    format!(
        "{}:{:02}:{:02}.{:03}",
        ms / 3_600_000,
        ms / 60_000 % 60,
        ms / 1000 % 60,
        ms % 1000
    )
}

/// Text escaped for XML content and attribute values.
fn xml(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            // Characters XML 1.0 does not allow.
            c if (c as u32) < 0x20 && !matches!(c, '\t' | '\n' | '\r') => out.push(' '),
            c => out.push(c),
        }
    }
    out
}

/// The id of a segment's `span`.
fn sentence_id(index: u32) -> String {
    format!("s{index:06}")
}

/// The book's language tag (`en` when it says none).
fn language(plan: &JobPlan) -> String {
    plan.meta
        .language
        .clone()
        .filter(|l| !l.trim().is_empty())
        .unwrap_or_else(|| "en".into())
}

/// A segment's text as XHTML: with word-level overlays, each timed word a `span` of its
/// own inside the sentence's.
fn sentence_body(text: &str, index: u32, words: &[(std::ops::Range<usize>, f64)]) -> String {
    if words.is_empty() {
        return xml(text);
    }
    let mut out = String::new();
    let mut at = 0;
    for (k, (range, _)) in words.iter().enumerate() {
        let (Some(before), Some(word)) = (text.get(at..range.start), text.get(range.clone()))
        else {
            return xml(text);
        };
        out.push_str(&xml(before));
        let _ = write!(
            out,
            "<span id=\"{}\">{}</span>",
            word_id(index, k),
            xml(word)
        );
        at = range.end;
    }
    out.push_str(&xml(text.get(at..).unwrap_or("")));
    out
}

/// The id of a word's `span`.
fn word_id(index: u32, word: usize) -> String {
    format!("s{index:06}w{word}")
}

/// The element a source paragraph is shown as: its own where XHTML allows it with
/// spans inside, else `p` (list items, table cells and the like, out of their lists).
fn block_tag(tag: &str) -> &str {
    match tag {
        "p" | "h1" | "h2" | "h3" | "h4" | "h5" | "h6" | "blockquote" | "pre" | "address"
        | "div" => tag,
        _ => "p",
    }
}

/// Image types every reading system shows (EPUB core media types).
fn is_core_image(mime: &str) -> bool {
    matches!(
        mime,
        "image/jpeg" | "image/png" | "image/gif" | "image/svg+xml"
    )
}

/// A kept source file's place in the EPUB, relative to its package document.
fn source_href(path: &str) -> String {
    let mut out = String::from("source/");
    for b in path.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~' | b'/') {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// Whether `path` is a kept source file of `mime`-kind `is_kind`.
fn kept(plan: &JobPlan, path: &str, is_kind: impl Fn(&str) -> bool) -> bool {
    plan.meta
        .resources
        .iter()
        .any(|f| f.path == path && is_kind(&f.mime))
}

/// The source's images, each in a `div` of its own (those that were kept).
fn images_xhtml(plan: &JobPlan, images: &[narrator_core::SourceImage], out: &mut String) {
    for image in images {
        if kept(plan, &image.src, is_core_image) {
            let _ = writeln!(
                out,
                "    <div class=\"narrator-image\"><img src=\"../{}\" alt=\"{}\"/></div>",
                xml(&source_href(&image.src)),
                xml(&image.alt)
            );
        }
    }
}

/// Chapter `ci`'s XHTML: its title, then its segments grouped in paragraphs where the
/// book had them; from an EPUB that kept its looks, each paragraph as the element and
/// class it was, its images, and its stylesheets.
fn chapter_xhtml(
    plan: &JobPlan,
    ci: usize,
    chapter: &EpubChapter,
    overlay: Overlay,
    lang: &str,
) -> String {
    let ch = &plan.chapters[ci];
    let first = ch.first_segment as usize;
    let segments = plan
        .segments
        .get(first..first + ch.segment_count as usize)
        .unwrap_or(&[]);
    let paragraphs = segments
        .iter()
        .filter(|s| matches!(s.pause_after, PauseAfter::Paragraph | PauseAfter::Chapter))
        .count();
    let blocks = (ch.blocks.len() == paragraphs).then_some(ch.blocks.as_slice());
    let timed: std::collections::HashMap<u32, &EpubSentence> =
        chapter.sentences.iter().map(|t| (t.index, t)).collect();
    let mut body = String::new();
    let _ = writeln!(
        body,
        "    <h1 class=\"narrator-chapter-title\">{}</h1>",
        xml(&ch.title)
    );
    let mut open: Option<&str> = None;
    let mut paragraph = 0;
    for s in segments {
        let words = match overlay {
            Overlay::Words => timed.get(&s.index).map_or(&[][..], |t| t.words.as_slice()),
            Overlay::Sentences => &[],
        };
        match open {
            Some(_) => body.push(' '),
            None => {
                let look = blocks.and_then(|b| b.get(paragraph));
                let tag = look.map_or("p", |l| block_tag(&l.tag));
                if let Some(look) = look {
                    images_xhtml(plan, &look.images, &mut body);
                }
                let _ = write!(body, "    <{tag}");
                if let Some(class) = look.and_then(|l| l.class.as_deref()) {
                    let _ = write!(body, " class=\"{}\"", xml(class));
                }
                body.push('>');
                open = Some(tag);
            }
        }
        let _ = write!(
            body,
            "<span id=\"{}\">{}</span>",
            sentence_id(s.index),
            sentence_body(&s.text, s.index, words)
        );
        if matches!(s.pause_after, PauseAfter::Paragraph | PauseAfter::Chapter)
            && let Some(tag) = open.take()
        {
            let _ = writeln!(body, "</{tag}>");
            paragraph += 1;
        }
    }
    if let Some(tag) = open {
        let _ = writeln!(body, "</{tag}>");
    }
    if blocks.is_some() {
        images_xhtml(plan, &ch.images_after, &mut body);
    }
    let mut links =
        String::from("  <link rel=\"stylesheet\" type=\"text/css\" href=\"../style.css\"/>\n");
    for sheet in &ch.stylesheets {
        if kept(plan, sheet, |m| m == "text/css") {
            let _ = writeln!(
                links,
                "  <link rel=\"stylesheet\" type=\"text/css\" href=\"../{}\"/>",
                xml(&source_href(sheet))
            );
        }
    }
    format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<!DOCTYPE html>\n\
<html xmlns=\"http://www.w3.org/1999/xhtml\" xmlns:epub=\"http://www.idpf.org/2007/ops\" \
xml:lang=\"{lang}\" lang=\"{lang}\">\n<head>\n  <meta charset=\"UTF-8\"/>\n  <title>{title}</title>\n\
{links}</head>\n<body>\n  \
<section epub:type=\"chapter\" id=\"chapter\" aria-label=\"{title}\">\n{body}  </section>\n</body>\n</html>\n",
        lang = xml(lang),
        title = xml(&ch.title),
    )
}

/// Chapter `ci`'s Media Overlay: a `par` per sentence, its text and its clip; with
/// word-level overlays a `seq` per sentence of a `par` per word.
fn chapter_smil(ci: usize, chapter: &EpubChapter, overlay: Overlay) -> String {
    let text = format!("../text/{}", chapter_name(ci, "xhtml"));
    let audio = format!("../audio/{}", chapter_name(ci, "mp3"));
    let mut pars = String::new();
    let mut n = 0;
    let mut par = |out: &mut String, indent: &str, id: &str, begin: f64, end: f64| {
        let _ = writeln!(
            out,
            "{indent}<par id=\"p{n}\"><text src=\"{text}#{id}\"/><audio src=\"{audio}\" \
             clipBegin=\"{}\" clipEnd=\"{}\"/></par>",
            clock(begin),
            clock(end),
        );
        n += 1;
    };
    for s in &chapter.sentences {
        if s.end <= s.start {
            continue;
        }
        if overlay == Overlay::Sentences || s.words.is_empty() {
            par(&mut pars, "    ", &sentence_id(s.index), s.start, s.end);
            continue;
        }
        let _ = writeln!(
            pars,
            "    <seq id=\"q{}\" epub:textref=\"{text}#{}\">",
            s.index,
            sentence_id(s.index)
        );
        for (k, (_, start)) in s.words.iter().enumerate() {
            // From the sentence's start for the first word, to the next word's start or
            // the sentence's end: the clips cover the sentence without a gap.
            let begin = if k == 0 { s.start } else { *start };
            let end = s.words.get(k + 1).map_or(s.end, |w| w.1);
            if end > begin {
                par(&mut pars, "      ", &word_id(s.index, k), begin, end);
            }
        }
        pars.push_str("    </seq>\n");
    }
    format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n\
<smil xmlns=\"http://www.w3.org/ns/SMIL\" xmlns:epub=\"http://www.idpf.org/2007/ops\" version=\"3.0\">\n\
<body>\n  <seq id=\"chapter\" epub:textref=\"{text}#chapter\" epub:type=\"chapter\">\n{pars}  </seq>\n</body>\n</smil>\n"
    )
}

/// `chNNN.ext`.
fn chapter_name(ci: usize, ext: &str) -> String {
    format!("ch{:03}.{ext}", ci + 1)
}

/// The navigation document: a table of contents of the chapters.
fn nav(plan: &JobPlan, lang: &str) -> String {
    let mut items = String::new();
    for (ci, ch) in plan.chapters.iter().enumerate() {
        let _ = writeln!(
            items,
            "      <li><a href=\"text/{}\">{}</a></li>",
            chapter_name(ci, "xhtml"),
            xml(if ch.title.trim().is_empty() {
                "Chapter"
            } else {
                &ch.title
            })
        );
    }
    format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<!DOCTYPE html>\n\
<html xmlns=\"http://www.w3.org/1999/xhtml\" xmlns:epub=\"http://www.idpf.org/2007/ops\" \
xml:lang=\"{lang}\" lang=\"{lang}\">\n<head>\n  <meta charset=\"UTF-8\"/>\n  <title>{title}</title>\n</head>\n\
<body>\n  <nav epub:type=\"toc\" id=\"toc\">\n    <h1>{title}</h1>\n    <ol>\n{items}    </ol>\n  </nav>\n</body>\n</html>\n",
        lang = xml(lang),
        title = xml(&plan.title),
    )
}

/// The package document.
fn package(plan: &JobPlan, chapters: &[EpubChapter], lang: &str, modified: &str) -> String {
    let mut meta = String::new();
    let _ = writeln!(
        meta,
        "    <dc:identifier id=\"book-id\">urn:narrator:{}</dc:identifier>",
        xml(&plan.job_id)
    );
    let _ = writeln!(meta, "    <dc:title>{}</dc:title>", xml(&plan.title));
    let _ = writeln!(meta, "    <dc:language>{}</dc:language>", xml(lang));
    if let Some(author) = &plan.meta.author {
        let _ = writeln!(meta, "    <dc:creator>{}</dc:creator>", xml(author));
    }
    if let Some(publisher) = &plan.meta.publisher {
        let _ = writeln!(meta, "    <dc:publisher>{}</dc:publisher>", xml(publisher));
    }
    if let Some(date) = &plan.meta.date {
        let _ = writeln!(meta, "    <dc:date>{}</dc:date>", xml(date));
    }
    let _ = writeln!(
        meta,
        "    <meta property=\"dcterms:modified\">{modified}</meta>"
    );
    let _ = writeln!(
        meta,
        "    <meta property=\"media:narrator\">narrator ({})</meta>",
        xml(&plan.voice)
    );
    let total: f64 = chapters.iter().map(|c| c.seconds).sum();
    let _ = writeln!(
        meta,
        "    <meta property=\"media:duration\">{}</meta>",
        clock(total)
    );
    let _ = writeln!(
        meta,
        "    <meta property=\"media:active-class\">-epub-media-overlay-active</meta>"
    );
    let mut items = String::new();
    let mut spine = String::new();
    items.push_str(
        "    <item id=\"nav\" href=\"nav.xhtml\" media-type=\"application/xhtml+xml\" properties=\"nav\"/>\n",
    );
    items.push_str("    <item id=\"css\" href=\"style.css\" media-type=\"text/css\"/>\n");
    if let Some(cover) = &plan.meta.cover {
        let _ = writeln!(
            items,
            "    <item id=\"cover\" href=\"images/{}\" media-type=\"{}\" properties=\"cover-image\"/>",
            cover_name(&cover.mime),
            xml(&cover.mime)
        );
    }
    for (k, file) in kept_files(plan).enumerate() {
        let _ = writeln!(
            items,
            "    <item id=\"src{}\" href=\"{}\" media-type=\"{}\"/>",
            k + 1,
            xml(&source_href(&file.path)),
            xml(&file.mime)
        );
    }
    for (ci, chapter) in chapters.iter().enumerate() {
        let n = ci + 1;
        let _ = writeln!(
            meta,
            "    <meta property=\"media:duration\" refines=\"#mo{n}\">{}</meta>",
            clock(chapter.seconds)
        );
        let _ = writeln!(
            items,
            "    <item id=\"ch{n}\" href=\"text/{}\" media-type=\"application/xhtml+xml\" media-overlay=\"mo{n}\"/>",
            chapter_name(ci, "xhtml")
        );
        let _ = writeln!(
            items,
            "    <item id=\"mo{n}\" href=\"smil/{}\" media-type=\"application/smil+xml\"/>",
            chapter_name(ci, "smil")
        );
        let _ = writeln!(
            items,
            "    <item id=\"audio{n}\" href=\"audio/{}\" media-type=\"audio/mpeg\"/>",
            chapter_name(ci, "mp3")
        );
        let _ = writeln!(spine, "    <itemref idref=\"ch{n}\"/>");
    }
    format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n\
<package xmlns=\"http://www.idpf.org/2007/opf\" version=\"3.0\" unique-identifier=\"book-id\" xml:lang=\"{lang}\">\n\
  <metadata xmlns:dc=\"http://purl.org/dc/elements/1.1/\">\n{meta}  </metadata>\n\
  <manifest>\n{items}  </manifest>\n  <spine>\n{spine}  </spine>\n</package>\n",
        lang = xml(lang)
    )
}

/// The source files the EPUB carries: stylesheets, fonts and core image types (an image
/// of another type would need a fallback).
fn kept_files(plan: &JobPlan) -> impl Iterator<Item = &narrator_core::SourceFile> {
    plan.meta
        .resources
        .iter()
        .filter(|f| !f.mime.starts_with("image/") || is_core_image(&f.mime))
}

/// The cover's file name inside the EPUB, by its type.
fn cover_name(mime: &str) -> &'static str {
    if mime == "image/png" {
        "cover.png"
    } else {
        "cover.jpg"
    }
}

const CONTAINER: &str = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n\
<container version=\"1.0\" xmlns=\"urn:oasis:names:tc:opendocument:xmlns:container\">\n\
  <rootfiles>\n    <rootfile full-path=\"OEBPS/content.opf\" media-type=\"application/oebps-package+xml\"/>\n\
  </rootfiles>\n</container>\n";

/// The highlight reading systems show on the sentence being read.
const STYLE: &str = "body { font-family: serif; line-height: 1.5; }\n\
p { margin: 0 0 1em 0; }\n\
.-epub-media-overlay-active { background-color: #ffe9a8; }\n";

/// Writes the EPUB of `plan` to `path`: `chapters` in the plan's order (one per plan
/// chapter), overlays as fine as `overlay`, `modified` the package's `dcterms:modified`
/// (`CCYY-MM-DDThh:mm:ssZ`).
pub fn write_epub3(
    path: &Path,
    plan: &JobPlan,
    chapters: &[EpubChapter],
    overlay: Overlay,
    modified: &str,
) -> Result<(), PipelineError> {
    if chapters.len() != plan.chapters.len() {
        return Err(PipelineError::Internal(
            "an EPUB needs one audio file per chapter",
        ));
    }
    let io = |source: std::io::Error| PipelineError::Io {
        path: path.to_path_buf(),
        source,
    };
    let zip_err = |e: zip::result::ZipError| io(std::io::Error::other(e));
    let file = std::fs::File::create(path).map_err(io)?;
    let mut zip = zip::ZipWriter::new(std::io::BufWriter::new(file));
    let stored =
        zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    let deflated = zip::write::SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Deflated);
    // The `mimetype` file first, uncompressed (what every reader checks).
    zip.start_file("mimetype", stored).map_err(zip_err)?;
    zip.write_all(EPUB_MIME.as_bytes()).map_err(io)?;
    let lang = language(plan);
    let text = |zip: &mut zip::ZipWriter<_>, name: &str, body: &str| {
        zip.start_file(name, deflated).map_err(zip_err)?;
        zip.write_all(body.as_bytes()).map_err(io)
    };
    text(&mut zip, "META-INF/container.xml", CONTAINER)?;
    text(
        &mut zip,
        "OEBPS/content.opf",
        &package(plan, chapters, &lang, modified),
    )?;
    text(&mut zip, "OEBPS/nav.xhtml", &nav(plan, &lang))?;
    text(&mut zip, "OEBPS/style.css", STYLE)?;
    for (ci, chapter) in chapters.iter().enumerate() {
        text(
            &mut zip,
            &format!("OEBPS/text/{}", chapter_name(ci, "xhtml")),
            &chapter_xhtml(plan, ci, chapter, overlay, &lang),
        )?;
        text(
            &mut zip,
            &format!("OEBPS/smil/{}", chapter_name(ci, "smil")),
            &chapter_smil(ci, chapter, overlay),
        )?;
        // Compressed audio gains nothing from deflate.
        zip.start_file(format!("OEBPS/audio/{}", chapter_name(ci, "mp3")), stored)
            .map_err(zip_err)?;
        let mut audio =
            std::fs::File::open(&chapter.audio).map_err(|source| PipelineError::Io {
                path: chapter.audio.clone(),
                source,
            })?;
        std::io::copy(&mut audio, &mut zip).map_err(io)?;
    }
    for file in kept_files(plan) {
        let options = if file.mime.starts_with("image/") && file.mime != "image/svg+xml" {
            stored
        } else {
            deflated
        };
        zip.start_file(format!("OEBPS/source/{}", file.path), options)
            .map_err(zip_err)?;
        zip.write_all(&file.data).map_err(io)?;
    }
    if let Some(cover) = &plan.meta.cover {
        zip.start_file(format!("OEBPS/images/{}", cover_name(&cover.mime)), stored)
            .map_err(zip_err)?;
        zip.write_all(&cover.data).map_err(io)?;
    }
    zip.finish().map_err(zip_err)?.flush().map_err(io)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clocks_and_escapes() {
        assert_eq!(clock(3723.4567), "1:02:03.457");
        assert_eq!(clock(0.0), "0:00:00.000");
        assert_eq!(xml("a < b & \"c\"\u{1}"), "a &lt; b &amp; &quot;c&quot; ");
    }
}
