//! narrator-text turns an input file (plain text, Markdown or EPUB) into the speakable
//! document model the rest of narrator works on: a [`Document`] made of [`Chapter`]s,
//! each a list of [`Paragraph`]s, each a list of normalized sentences that a Piper/VITS
//! voice behind espeak-ng can read aloud as they are.
//!
//! The crate owns everything between "bytes on disk" and "sentences": input checks
//! (size, emptiness, binary content, encoding), format parsing, chapter detection,
//! text normalization, sentence segmentation and the per-sentence length cap. It does no
//! I/O beyond reading the one input file and has no threads or async: every step is a
//! plain function of its input, so the same document always yields the same model.
//!
//! Flow: `load_document` → format parser (`plain`, `markdown`, `epub`) produces raw
//! chapters of raw paragraph text → `build` normalizes (`normalize`), splits
//! (`segment`), drops what is empty and collects warnings → [`Document`].

mod build;
mod epub;
mod error;
mod heading;
mod input;
mod lexicon;
mod markdown;
mod normalize;
mod plain;
mod segment;

use std::path::Path;

use serde::{Deserialize, Serialize};

pub use error::TextError;
pub use lexicon::{Lexicon, LexiconError};
pub use normalize::{Language, Script, normalize_text};
pub use segment::{cap_sentence, split_sentences};

/// The input formats narrator can read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InputFormat {
    /// Plain UTF-8 text; chapters from lines such as `CHAPTER IV.` or `Part One`.
    Text,
    /// CommonMark; chapters from `#` / `##` headings.
    Markdown,
    /// EPUB 2 or 3; chapters from the spine, titles from the table of contents.
    Epub,
}

impl InputFormat {
    /// File extensions (lower case, without the dot) that [`load_document`] accepts.
    pub const SUPPORTED_EXTENSIONS: &'static [&'static str] = &["txt", "md", "markdown", "epub"];

    /// The format for a file extension (case-insensitive, without the dot).
    pub fn from_extension(ext: &str) -> Option<Self> {
        match ext.to_ascii_lowercase().as_str() {
            "txt" => Some(Self::Text),
            "md" | "markdown" => Some(Self::Markdown),
            "epub" => Some(Self::Epub),
            _ => None,
        }
    }

    /// The format for a path, from its extension.
    pub fn from_path(path: &Path) -> Option<Self> {
        path.extension()
            .and_then(|e| e.to_str())
            .and_then(Self::from_extension)
    }
}

/// Limits applied while loading a document.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoadOptions {
    /// Largest accepted input, in bytes (default 16 MiB). For EPUB the limit applies to
    /// the uncompressed chapter documents, so images in the archive do not count.
    pub max_bytes: u64,
    /// Longest sentence handed to the voice, in characters (default 400). Longer
    /// sentences are cut at the best break at or before this length. Values below 1
    /// are treated as 1.
    pub max_sentence_chars: usize,
    /// The voice's language (`en`, `en_US`, `de`, `ru`...): which normalization rules
    /// apply and which scripts are kept (default `en`).
    pub language: String,
    /// From an EPUB, also keep how it looks (each paragraph's element and class, its
    /// images, stylesheets and fonts) for a read-along EPUB (default off: the bytes are
    /// kept with the job).
    #[serde(default)]
    pub keep_looks: bool,
}

impl Default for LoadOptions {
    fn default() -> Self {
        Self {
            max_bytes: 16 * 1024 * 1024,
            max_sentence_chars: 400,
            language: "en".to_owned(),
            keep_looks: false,
        }
    }
}

/// A whole book, ready to speak.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Document {
    /// The book's title as written, when the input names one (EPUB metadata, Markdown
    /// front matter or lone `#` heading, the first line of a plain-text title block).
    pub title: Option<String>,
    /// Chapters in reading order; never empty, none without paragraphs.
    pub chapters: Vec<Chapter>,
    /// What was skipped or guessed, one line per kind, meant for the user.
    pub warnings: Vec<String>,
    /// Author, language, date, publisher and cover, as far as the input gives them
    /// (EPUB metadata, Markdown front matter).
    pub meta: narrator_core::BookMeta,
}

/// One chapter (or preface, part, prologue...).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Chapter {
    /// Speakable title, e.g. `Chapter 4: The Rabbit Sends in a Little Bill`.
    pub title: String,
    /// Paragraphs in order; never empty.
    pub paragraphs: Vec<Paragraph>,
    /// The source EPUB's stylesheets its pages linked, and the images after its last
    /// paragraph (when [`LoadOptions::keep_looks`] asked).
    #[serde(default, skip_serializing_if = "ChapterLooks::is_empty")]
    pub looks: ChapterLooks,
}

/// What a chapter of a source EPUB linked and showed beyond its paragraphs.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChapterLooks {
    /// Stylesheets (paths in [`narrator_core::BookMeta::resources`]), in order.
    pub stylesheets: Vec<String>,
    /// Images after the last paragraph.
    pub images_after: Vec<narrator_core::SourceImage>,
}

impl ChapterLooks {
    /// Nothing kept.
    pub fn is_empty(&self) -> bool {
        self.stylesheets.is_empty() && self.images_after.is_empty()
    }
}

/// One paragraph: the unit after which the audio gets a longer pause.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Paragraph {
    /// Normalized sentences, punctuation kept, each at most `max_sentence_chars` long
    /// and each containing at least one letter or digit.
    pub sentences: Vec<String>,
    /// How it looked in the source EPUB, when [`LoadOptions::keep_looks`] asked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub look: Option<narrator_core::SourceBlock>,
}

impl Document {
    /// Applies a pronunciation lexicon to every sentence (not to titles: they are also
    /// the tags and file names, as written). No entry may make a sentence longer than
    /// twice `opts.max_sentence_chars` (see [`Lexicon::apply`]).
    pub fn apply_lexicon(
        &mut self,
        lexicon: &Lexicon,
        opts: &LoadOptions,
    ) -> Result<(), LexiconError> {
        if lexicon.is_empty() {
            return Ok(());
        }
        let limit = opts.max_sentence_chars.max(1).saturating_mul(2);
        for s in self
            .chapters
            .iter_mut()
            .flat_map(|c| &mut c.paragraphs)
            .flat_map(|p| &mut p.sentences)
        {
            *s = lexicon.apply(s, limit)?;
        }
        Ok(())
    }

    /// Number of sentences in the whole document.
    pub fn sentence_count(&self) -> usize {
        self.chapters.iter().map(Chapter::sentence_count).sum()
    }
}

impl Chapter {
    /// Number of sentences in this chapter.
    pub fn sentence_count(&self) -> usize {
        self.paragraphs.iter().map(|p| p.sentences.len()).sum()
    }
}

/// Reads and parses the file at `path`, choosing the format from its extension
/// (`.txt`, `.md`, `.markdown`, `.epub`, case-insensitive).
pub fn load_document(path: &Path, opts: &LoadOptions) -> Result<Document, TextError> {
    input::load(path, opts).map_err(TextError::one_line)
}

/// Parses text already in memory (e.g. read from stdin). `format` must be
/// [`InputFormat::Text`] or [`InputFormat::Markdown`]; an EPUB is binary, use
/// [`parse_epub_bytes`] or [`load_document`] for it.
pub fn parse_document(
    text: &str,
    format: InputFormat,
    opts: &LoadOptions,
) -> Result<Document, TextError> {
    input::parse_text(text, format, opts, Path::new(input::STDIN_ORIGIN))
        .map_err(TextError::one_line)
}

/// Reads a cover image given on the command line (JPEG or PNG, at most
/// [`narrator_core::MAX_COVER_BYTES`]); `book` names the input in the error.
pub fn load_cover(path: &Path, book: &Path) -> Result<narrator_core::Cover, TextError> {
    input::read_cover(path, &path.display().to_string(), book, None).map_err(TextError::one_line)
}

/// Parses a book held in memory (a producer's request) as a file of `format`: the same
/// bounds and decoding as [`load_document`]; `origin` names it in errors.
pub fn parse_bytes(
    bytes: &[u8],
    format: InputFormat,
    opts: &LoadOptions,
    origin: &str,
) -> Result<Document, TextError> {
    input::parse_bytes(bytes, format, opts, Path::new(origin)).map_err(TextError::one_line)
}

/// Parses an EPUB held in memory (e.g. read from stdin).
pub fn parse_epub_bytes(bytes: &[u8], opts: &LoadOptions) -> Result<Document, TextError> {
    input::parse_epub(
        std::io::Cursor::new(bytes),
        opts,
        Path::new(input::STDIN_ORIGIN),
    )
    .map_err(TextError::one_line)
}
