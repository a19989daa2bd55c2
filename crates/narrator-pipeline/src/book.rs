//! A book read and planned for a voice: the steps every way in shares (`narrator run`,
//! `narrator synth`, `narrator submit`, and the producers to come). The voice's language
//! decides how the text is read; the caller's metadata goes over what the input says; the
//! book's own lexicon and then the caller's apply; and the plan's identity is the voice,
//! its model, and exactly the scales and speaker its segments are synthesized with
//! ([`Identity`]).

use std::path::{Path, PathBuf};

use anyhow::bail;
use narrator_audio::AudioFormat;
use narrator_core::JobPlan;
use narrator_engine::{ScaleOverrides, Scales, Voice};
use narrator_text::{Document, Lexicon, LoadOptions};

use crate::plan::{AudioIdentity, plan_job};

/// Metadata given with a book (flags, a request's fields): it goes over what the input
/// says. Empty or blank values are ignored.
#[derive(Debug, Clone, Default)]
pub struct MetaOverrides {
    pub title: Option<String>,
    pub author: Option<String>,
    /// A cover image file (a path relative to the book's folder is tried too).
    pub cover: Option<PathBuf>,
    pub language: Option<String>,
    pub date: Option<String>,
    pub publisher: Option<String>,
}

/// How a book is read.
#[derive(Debug, Clone, Default)]
pub struct ReadOptions {
    /// The largest input accepted, in bytes.
    pub max_input_bytes: u64,
    /// Keep the input's looks (a read-along EPUB shows an EPUB input as it looked).
    pub keep_looks: bool,
    /// Lexicon files applied after the book's own (`BOOK_STEM.lexicon` beside it).
    pub lexicons: Vec<PathBuf>,
    /// Metadata over the input's.
    pub meta: MetaOverrides,
}

/// Input limits, and the voice's language: it picks the normalization rules and the
/// scripts kept.
pub fn load_options(voice: &Voice, max_input_bytes: u64, keep_looks: bool) -> LoadOptions {
    let language = voice.info().language;
    LoadOptions {
        max_bytes: max_input_bytes,
        language: if language.is_empty() {
            voice.family.espeak_voice().to_owned()
        } else {
            language
        },
        keep_looks,
        ..LoadOptions::default()
    }
}

/// The lexicon for `book`: `BOOK_STEM.lexicon` beside it when there is one (the book's
/// own), then every file of `files` in order. A line that cannot be used is an error.
pub fn lexicon_for(book: Option<&Path>, files: &[PathBuf]) -> anyhow::Result<Lexicon> {
    let mut lexicon = Lexicon::default();
    if let Some(own) = book
        .map(|b| b.with_extension("lexicon"))
        .filter(|p| p.is_file())
    {
        lexicon = Lexicon::load(&own)?;
        tracing::info!(file = %own.display(), entries = lexicon.len(), "the book's lexicon");
    }
    for file in files {
        lexicon = lexicon.then(Lexicon::load(file)?);
    }
    Ok(lexicon)
}

/// Puts `meta` over what the input says (`book`: where a relative cover path is tried).
pub fn apply_meta(doc: &mut Document, meta: &MetaOverrides, book: &Path) -> anyhow::Result<()> {
    let clean = |s: &Option<String>| {
        s.as_deref()
            .map(|v| v.split_whitespace().collect::<Vec<_>>().join(" "))
            .filter(|v| !v.is_empty())
    };
    if let Some(title) = clean(&meta.title) {
        doc.title = Some(title);
    }
    let cover = match &meta.cover {
        Some(path) => Some(narrator_text::load_cover(path, book)?),
        None => None,
    };
    let flags = narrator_core::BookMeta {
        author: clean(&meta.author),
        language: clean(&meta.language),
        date: clean(&meta.date),
        publisher: clean(&meta.publisher),
        cover,
        ..Default::default()
    };
    doc.meta = std::mem::take(&mut doc.meta).overridden_by(flags);
    Ok(())
}

/// A book read from a file.
#[derive(Debug)]
pub struct ReadBook {
    pub doc: Document,
    /// The lexicon applied (empty when none was).
    pub lexicon: Lexicon,
}

/// Reads the book at `path` for `voice`: parsed, the metadata put over it, the lexicons
/// applied. Its warnings are in `doc.warnings` for the caller to show.
pub fn read_book(path: &Path, voice: &Voice, opts: &ReadOptions) -> anyhow::Result<ReadBook> {
    let load = load_options(voice, opts.max_input_bytes, opts.keep_looks);
    let mut doc = narrator_text::load_document(path, &load)?;
    apply_meta(&mut doc, &opts.meta, path)?;
    let lexicon = lexicon_for(Some(path), &opts.lexicons)?;
    doc.apply_lexicon(&lexicon, &load)?;
    Ok(ReadBook { doc, lexicon })
}

/// A book held in memory (a producer's request: `bytes` of `format`, named `origin` in
/// errors), read as [`read_book`] reads a file, with `lexicon` (a lexicon's text, applied
/// after `opts.lexicons`) when the request has one.
pub fn read_book_bytes(
    bytes: &[u8],
    format: narrator_text::InputFormat,
    origin: &str,
    lexicon: Option<&str>,
    voice: &Voice,
    opts: &ReadOptions,
) -> anyhow::Result<ReadBook> {
    let load = load_options(voice, opts.max_input_bytes, opts.keep_looks);
    let mut doc = narrator_text::parse_bytes(bytes, format, &load, origin)?;
    apply_meta(&mut doc, &opts.meta, Path::new(origin))?;
    let mut all = lexicon_for(None, &opts.lexicons)?;
    if let Some(text) = lexicon {
        all = all.then(Lexicon::parse(text, "the request's lexicon")?);
    }
    doc.apply_lexicon(&all, &load)?;
    Ok(ReadBook { doc, lexicon: all })
}

/// What besides the text decides a book's audio: the voice, a digest of its model, and
/// the scales and speaker its segments are synthesized with. A worker synthesizes a
/// job's segments with exactly these scales, so the job id names the audio.
#[derive(Debug, Clone, PartialEq)]
pub struct Identity {
    pub voice: String,
    pub voice_digest: String,
    pub scales: Scales,
    pub speaker: u32,
}

impl Identity {
    /// The identity of `voice` with `overrides` over its default scales and `speaker`
    /// (a name or number the voice knows; `None`: its first).
    pub fn of(
        voice: &Voice,
        overrides: &ScaleOverrides,
        speaker: Option<&str>,
    ) -> anyhow::Result<Self> {
        let speaker = match speaker {
            Some(s) => voice.family.speaker_id(&voice.name, s)?,
            None => 0,
        };
        Ok(Identity {
            voice: voice.name.clone(),
            voice_digest: voice_digest(voice),
            scales: overrides.resolve(voice.family.default_scales()),
            speaker,
        })
    }

    /// As the planner hashes it.
    pub fn audio(&self) -> AudioIdentity<'_> {
        AudioIdentity {
            voice: &self.voice,
            voice_digest: &self.voice_digest,
            scales: self.scales,
            speaker: self.speaker,
        }
    }
}

/// A digest of the voice's model identity (FNV-1a of [`narrator_engine::Family::identity`]).
pub fn voice_digest(voice: &Voice) -> String {
    voice
        .family
        .identity()
        .bytes()
        .fold(0xcbf29ce484222325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x100000001b3)
        })
        .to_string()
}

/// Plans `doc` (from `source`, titled `fallback_title` when it has no title) for
/// `identity`; a book with nothing speakable is an error.
pub fn plan_book(
    doc: &Document,
    source: &str,
    fallback_title: &str,
    identity: &Identity,
    lexicon: &Lexicon,
) -> anyhow::Result<JobPlan> {
    let mut plan = plan_job(doc, source, fallback_title, &identity.audio());
    plan.lexicon = (!lexicon.is_empty()).then(|| lexicon.source().to_owned());
    if plan.segments.is_empty() {
        bail!("{source} has nothing speakable after cleaning; check that it holds readable text");
    }
    Ok(plan)
}

/// A book's file name without its extension (its title when it has none).
pub fn file_stem(p: &Path) -> String {
    p.file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("book")
        .to_string()
}

/// `--chapter-files` with a format that keeps its chapters in one file is refused.
pub fn check_chapter_files(format: AudioFormat, chapter_files: bool) -> anyhow::Result<()> {
    if chapter_files && !format.supports_chapter_files() {
        bail!(
            "--chapter-files: {format} keeps its chapters inside its one file; drop the flag, or \
             use --format opus, mp3 or wav for one file per chapter"
        );
    }
    Ok(())
}

/// What `--format` names: an audio format, or `epub3` (a read-along EPUB 3, whose audio
/// is MP3, one file per chapter: the book's MP3 and chapter files come with it). Returns
/// the audio format, whether there are chapter files, and whether an EPUB is wanted.
/// (`--epub-overlay` says how fine its overlays are.)
pub fn output_format(name: &str, chapter_files: bool) -> anyhow::Result<(AudioFormat, bool, bool)> {
    let word = name.trim().trim_start_matches('.').to_ascii_lowercase();
    if word == "epub3" || word == "epub" {
        return Ok((AudioFormat::Mp3, true, true));
    }
    let format: AudioFormat = name.parse().map_err(|_| {
        anyhow::anyhow!(
            "unknown format {name:?}; choose one of: wav, opus, mp3, m4b, epub3 (a read-along \
             EPUB 3 with MP3 audio)"
        )
    })?;
    check_chapter_files(format, chapter_files)?;
    Ok((format, chapter_files, false))
}

/// The formats `--subtitles` names.
pub fn subtitle_formats(names: &[String]) -> anyhow::Result<Vec<crate::SubtitleFormat>> {
    let mut formats = Vec::new();
    for name in names {
        let format = name.parse()?;
        if !formats.contains(&format) {
            formats.push(format);
        }
    }
    Ok(formats)
}
