//! narrator's domain: what a job, a segment, a manifest and a figure are, and the three
//! seams the embedded and the distributed modes implement differently:
//!
//! - where segment audio is kept ([`AudioStore`]: a local folder, or S3),
//! - where job state and per-segment figures are recorded ([`StateStore`]: a journal file
//!   beside the output, or Postgres),
//! - where segments come from (an in-process channel, or RabbitMQ; the pipeline pulls from
//!   a `tokio` channel that either feeds).
//!
//! This crate has no runtime or client dependencies; adapters depend on it, never on each
//! other.

pub mod manifest;
pub mod seams;

pub use manifest::{BookEntry, ChapterEntry, CoverEntry, Manifest, SegmentEntry};
pub use seams::{
    AudioStore, Delivery, Failure, RetryClass, SeamError, SegmentQueue, StateStore, TraceContext,
};

use serde::{Deserialize, Serialize};

/// The pause that follows a segment when the audio is assembled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PauseAfter {
    /// Another sentence of the same paragraph follows.
    Sentence,
    /// The paragraph ends.
    Paragraph,
    /// The chapter ends.
    Chapter,
    /// A piece of a sentence that was split for length; the rest follows directly.
    None,
}

/// Inference scales (a VITS voice's `scales` input: noise, length, noise_w; Kokoro runs at
/// the speaking rate `1 / length`). Part of a job's identity: a job's segments are
/// synthesized with the scales its identity was hashed with (see [`Delivery::scales`]).
/// `narrator_engine::ScaleOverrides::resolve` makes them from a voice's defaults and the
/// settings a user chose.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Scales {
    /// Noise added to the prior (expressiveness); 0 makes output deterministic.
    pub noise: f32,
    /// Speaking rate: larger is slower.
    pub length: f32,
    /// Noise of the duration predictor; 0 makes durations deterministic.
    pub noise_w: f32,
}

impl Scales {
    /// Scales that make synthesis deterministic (used to compare batched and single runs).
    pub const DETERMINISTIC: Scales = Scales {
        noise: 0.0,
        length: 1.0,
        noise_w: 0.0,
    };
}

/// The unit of work: a bounded piece of text (one sentence, or part of a long one) that
/// carries everything a worker needs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Segment {
    /// Position in the job, from 0, unique and dense.
    pub index: u32,
    /// Chapter it belongs to, from 0.
    pub chapter: u32,
    /// The text to speak (already normalized).
    pub text: String,
    /// The pause after it.
    pub pause_after: PauseAfter,
    /// The voice's speaker id (multi-speaker voices; 0 for the others and by default).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub speaker: u32,
    /// The job's speaking rate (`submit --speed`), where it set one: a worker reads it
    /// from the job's row, never from a message, and runs the segment at that rate
    /// whatever its own flags say. `None`: the rate the engine was loaded with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub speed: Option<f32>,
    /// Its words are timed (the job asked for subtitles or an EPUB): mapping phonemes to
    /// words costs espeak-ng a synthesis pass, about 25 times the phonemizing alone, so
    /// it is done only when a job will use it. Set like `speed`: by `run` from its
    /// flags, by a worker from the job's row.
    #[serde(default, skip_serializing_if = "is_false")]
    pub timed: bool,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// A chapter as planned: its title and its range of segments.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ChapterPlan {
    /// Chapter title.
    pub title: String,
    /// Index of its first segment.
    pub first_segment: u32,
    /// Number of segments.
    pub segment_count: u32,
    /// How each of its paragraphs looked in the source EPUB, in order (one per
    /// paragraph; empty for other inputs, or when the job writes no read-along EPUB).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub blocks: Vec<SourceBlock>,
    /// The source's stylesheets this chapter's pages linked (paths in
    /// [`BookMeta::resources`]), in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stylesheets: Vec<String>,
    /// Images after its last paragraph.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub images_after: Vec<SourceImage>,
}

/// How one paragraph looked in the source EPUB: its element, its class and the images
/// shown before it. The read-along EPUB shows it the same way, with the source's
/// stylesheets and images.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceBlock {
    /// The XHTML element, lower case (`p`, `h2`, `blockquote`...).
    pub tag: String,
    /// Its `class` attribute.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class: Option<String>,
    /// Images that came before it (since the previous paragraph).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub images: Vec<SourceImage>,
}

/// An image of the source EPUB, where its text shows one.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceImage {
    /// Its path in [`BookMeta::resources`].
    pub src: String,
    /// Its text alternative.
    #[serde(default)]
    pub alt: String,
}

/// A stylesheet, image or font of the source EPUB, kept for the read-along EPUB.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceFile {
    /// Its path in the source archive (`OEBPS/Styles/book.css`); paths relative to each
    /// other as in the source, so the stylesheets' `url()`s still resolve.
    pub path: String,
    /// Its media type, as the source's package declared it.
    pub mime: String,
    /// Its bytes.
    pub data: std::sync::Arc<Vec<u8>>,
}

/// Most bytes of stylesheets, images and fonts kept from a source EPUB.
pub const MAX_SOURCE_FILES_BYTES: u64 = 64 << 20;

/// Everything decided before synthesis starts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobPlan {
    /// Stable id: a digest of the input and every setting that changes segment audio.
    pub job_id: String,
    /// Book title (from metadata or the file name).
    pub title: String,
    /// The input file as given.
    pub source: String,
    /// Voice name.
    pub voice: String,
    /// Chapters in order.
    pub chapters: Vec<ChapterPlan>,
    /// Segments in order.
    pub segments: Vec<Segment>,
    /// Warnings from reading the input (skipped characters and the like).
    pub warnings: Vec<String>,
    /// What the book says about itself (author, language, cover...), for the outputs' tags.
    #[serde(default)]
    pub meta: BookMeta,
    /// The pronunciation lexicon applied to the segments' text (its source, for the
    /// record; the replacements are already in `segments`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lexicon: Option<String>,
}

/// What a book says about itself beyond its title: from EPUB metadata, Markdown front
/// matter or flags. It goes into every output's tags, `manifest.json` and the jobs table;
/// it never changes the audio, so it is not part of a job's content id.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BookMeta {
    /// Author(s), as they should be shown (several joined by `, `).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub author: Option<String>,
    /// Language as a BCP 47 tag (`en`, `en-US`, `fr`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub language: Option<String>,
    /// Publication date or year as given (`1865`, `2024-05-01`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub date: Option<String>,
    /// Publisher.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub publisher: Option<String>,
    /// Cover image. Not part of the JSON forms (plans, manifests): it is stored beside
    /// the job and embedded in the audio files.
    #[serde(skip)]
    pub cover: Option<Cover>,
    /// The source EPUB's stylesheets, images and fonts, for the read-along EPUB (empty
    /// unless one is asked for). Not part of the JSON forms: stored beside the job.
    #[serde(skip)]
    pub resources: Vec<SourceFile>,
}

impl BookMeta {
    /// The year: the first four digits of `date`, when they make one.
    pub fn year(&self) -> Option<&str> {
        let d = self.date.as_deref()?.trim();
        d.get(..4).filter(|y| y.bytes().all(|b| b.is_ascii_digit()))
    }

    /// Fields of `other` that are set replace this one's (flags over the file's metadata).
    pub fn overridden_by(mut self, other: BookMeta) -> BookMeta {
        self.author = other.author.or(self.author);
        self.language = other.language.or(self.language);
        self.date = other.date.or(self.date);
        self.publisher = other.publisher.or(self.publisher);
        self.cover = other.cover.or(self.cover);
        self
    }
}

/// A cover image: JPEG or PNG bytes, shared cheaply between the encoders.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cover {
    /// `image/jpeg` or `image/png`.
    pub mime: String,
    /// The file's bytes.
    pub data: std::sync::Arc<Vec<u8>>,
}

/// Largest cover narrator embeds (players and stores expect a few hundred KiB).
pub const MAX_COVER_BYTES: usize = 10 << 20;

impl Cover {
    /// A cover from an image file's bytes: JPEG or PNG by their magic numbers; anything
    /// else (or an empty or oversized file) is refused with what to do.
    pub fn from_bytes(data: Vec<u8>) -> Result<Cover, String> {
        let mime = if data.starts_with(&[0xFF, 0xD8, 0xFF]) {
            "image/jpeg"
        } else if data.starts_with(b"\x89PNG\r\n\x1a\n") {
            "image/png"
        } else {
            return Err(
                "a cover must be a JPEG or PNG image (other formats are not \
                        shown by audiobook players); convert it first"
                    .to_string(),
            );
        };
        if data.len() > MAX_COVER_BYTES {
            return Err(format!(
                "the cover is {} MiB, more than the {} MiB narrator embeds; scale it down \
                 (1400-3000 px square JPEG is what stores ask for)",
                data.len() >> 20,
                MAX_COVER_BYTES >> 20
            ));
        }
        Ok(Cover {
            mime: mime.to_string(),
            data: std::sync::Arc::new(data),
        })
    }
}

/// Mono 16-bit audio of one segment.
#[derive(Debug, Clone, PartialEq)]
pub struct SegmentAudio {
    /// Samples per second.
    pub sample_rate: u32,
    /// Samples.
    pub samples: Vec<i16>,
}

impl SegmentAudio {
    /// Duration in seconds.
    pub fn seconds(&self) -> f64 {
        self.samples.len() as f64 / f64::from(self.sample_rate.max(1))
    }
}

/// Figures recorded for each finished segment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SegmentRecord {
    /// Segment index.
    pub index: u32,
    /// Number of samples of its audio.
    pub samples: u64,
    /// Sample rate.
    pub sample_rate: u32,
    /// Audio duration.
    pub audio_seconds: f64,
    /// Its share of the batch's inference time.
    pub inference_seconds: f64,
    /// Time from enqueue to the start of its batch.
    pub queue_wait_seconds: f64,
    /// Items in the batch it ran in.
    pub batch_size: u32,
    /// Delivery attempts (1 on the first try).
    pub attempts: u32,
    /// Worker that made it.
    pub worker: String,
    /// Phoneme ids it was synthesized from (all utterances).
    pub phoneme_ids: u32,
    /// Where its audio is when it shares a stored object with other segments (a pack);
    /// `None`: under the segment's own key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub packed: Option<PackedAt>,
    /// Where each word of its text is spoken in its audio, from the model's durations
    /// (empty where the voice's graph gives none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub words: Vec<WordTiming>,
}

/// One word's speech inside its segment's audio: the word as a byte range of the
/// segment's text, and its samples from the segment's first sample (start, and the sample
/// after its last). Words are the text's whitespace-separated tokens that were spoken
/// (a token said with no sound of its own, espeak-ng's "of" in "out of", is part of the
/// word before it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct WordTiming {
    /// Byte range in the segment's text: `[start, end)`.
    pub text: [u32; 2],
    /// Sample range in the segment's audio: `[start, end)`.
    pub samples: [u32; 2],
}

impl WordTiming {
    /// The word in `text` (the segment's); empty if the range does not fit it.
    pub fn word<'a>(&self, text: &'a str) -> &'a str {
        text.get(self.text[0] as usize..self.text[1] as usize)
            .unwrap_or("")
    }
}

/// A segment's place inside a pack: one stored object holding the audio of several
/// segments (each a complete WAV), written in one request to save per-object costs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PackedAt {
    /// The pack's key in the store.
    pub key: String,
    /// Where the segment's bytes start in the pack.
    pub offset: u64,
    /// How many bytes they take.
    pub len: u64,
}

impl SegmentRecord {
    /// Real-time factor: processing time / audio time (lower is faster).
    pub fn rtf(&self) -> f64 {
        if self.audio_seconds > 0.0 {
            self.inference_seconds / self.audio_seconds
        } else {
            0.0
        }
    }
}

/// Real-time factor of `wall` seconds of work for `audio` seconds of output.
pub fn rtf(wall: f64, audio: f64) -> f64 {
    if audio > 0.0 { wall / audio } else { 0.0 }
}
