//! `manifest.json`: the index of a finished audiobook. It is written last, atomically, so
//! its presence means every file it lists is complete.

use serde::{Deserialize, Serialize};

/// The whole-book file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BookEntry {
    /// Title.
    pub title: String,
    /// File name inside the output folder.
    pub file: String,
    /// Duration.
    pub seconds: f64,
    /// Author, language, date and publisher, where the input or flags gave them.
    #[serde(flatten)]
    pub meta: crate::BookMeta,
    /// The cover embedded in the audio files, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cover: Option<CoverEntry>,
    /// Its subtitle files (`--subtitles`), times relative to the book file.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub subtitles: Vec<String>,
    /// `timings.json` (with `--subtitles`): every sentence's first and last sample of
    /// speech in the book file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timings: Option<String>,
    /// The read-along EPUB 3 (`--format epub3`): the text, one MP3 per chapter and Media
    /// Overlays pairing each sentence with its audio.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epub: Option<String>,
    /// How fine its overlays are: `sentence` or `word`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epub_overlay: Option<String>,
}

/// The cover embedded in the book's audio files.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CoverEntry {
    /// `image/jpeg` or `image/png`.
    pub mime: String,
    /// Size of the image.
    pub bytes: u64,
}

/// One chapter: its own file (not for M4B, whose one file holds the chapters) and its
/// place in the book file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChapterEntry {
    /// Chapter title.
    pub title: String,
    /// File name inside the output folder; none for formats without chapter files (M4B).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    /// Duration of the chapter file.
    pub seconds: f64,
    /// Where the chapter starts in the whole-book file.
    pub start_seconds: f64,
    /// Subtitle files of its chapter file, times relative to that file.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub subtitles: Vec<String>,
}

/// One segment's place in the book.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SegmentEntry {
    /// Segment index.
    pub index: u32,
    /// Chapter index.
    pub chapter: u32,
    /// Start in the whole-book file.
    pub start_seconds: f64,
    /// Duration of its speech.
    pub seconds: f64,
}

/// The manifest of a finished job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// Job id.
    pub job_id: String,
    /// narrator version that wrote it.
    pub narrator_version: String,
    /// The input file.
    pub source: String,
    /// Audio format (`wav`, `opus`, `mp3`, `m4b`).
    pub format: String,
    /// The whole-book file.
    pub book: BookEntry,
    /// Chapters in order.
    pub chapters: Vec<ChapterEntry>,
    /// Voice name.
    pub voice: String,
    /// Sample rate of the voice.
    pub sample_rate: u32,
    /// Total audio, pauses included (= `book.seconds`).
    pub audio_seconds: f64,
    /// Speech only, pauses excluded.
    pub speech_seconds: f64,
    /// Wall time of the run(s) that made it, start to manifest.
    pub wall_seconds: f64,
    /// `wall_seconds / audio_seconds`.
    pub rtf: f64,
    /// Every segment exactly once, in order.
    pub segments: Vec<SegmentEntry>,
    /// Warnings about the input.
    pub warnings: Vec<String>,
}
