//! Assembly of the final [`Document`] from what a format parser found.
//!
//! Parsers only find structure: a [`RawBook`] of chapters holding raw paragraph text.
//! This module applies the same rules to every format, so they cannot drift apart:
//! normalize each paragraph, split it into sentences, cap each sentence, drop what is
//! not speakable (no letter or digit), drop empty paragraphs and chapters, decide what
//! to do with text before the first heading, name untitled chapters, and turn the
//! counts of removed characters into one warning per kind.

use std::path::Path;

use crate::error::escape_controls;
use crate::heading::speakable_title;
use crate::normalize::{Language, Skipped, normalize};
use crate::segment::{cap_sentence, split_sentences};
use crate::{Chapter, Document, LoadOptions, Paragraph, TextError};

/// A chapter as a parser found it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct RawChapter {
    /// Title as written (e.g. "CHAPTER IV"), if the format gave one.
    pub(crate) title: Option<String>,
    /// Raw paragraph texts, one per block.
    pub(crate) blocks: Vec<String>,
    /// Text that came before the first heading (title page or preface).
    pub(crate) leading: bool,
    /// How each block looked (EPUB with `keep_looks`): empty, or one per block.
    pub(crate) looks: Vec<narrator_core::SourceBlock>,
    /// Stylesheets and trailing images (EPUB with `keep_looks`).
    pub(crate) chapter_looks: crate::ChapterLooks,
}

/// A book as a parser found it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct RawBook {
    pub(crate) title: Option<String>,
    /// Author, language, date, publisher, cover found in the input.
    pub(crate) meta: narrator_core::BookMeta,
    /// A cover named by path (Markdown front matter), relative to the input file.
    pub(crate) cover_path: Option<String>,
    pub(crate) chapters: Vec<RawChapter>,
    pub(crate) warnings: Vec<String>,
}

/// Leading text counts as a real preface (and is kept) from this many words...
const PREFACE_MIN_WORDS: usize = 40;
/// ...or when one of its sentences has at least this many words (prose, not a title page).
const PREFACE_MIN_SENTENCE_WORDS: usize = 12;

pub(crate) fn build(
    raw: RawBook,
    opts: &LoadOptions,
    origin: &Path,
) -> Result<Document, TextError> {
    let cap = opts.max_sentence_chars.max(1);
    let language = Language::of(&opts.language);
    let mut skipped = Skipped::default();
    // One line each, whatever the input named (an archive entry, front matter).
    let mut warnings: Vec<String> = raw.warnings.iter().map(|w| escape_controls(w)).collect();
    // The title as written goes into tags and file names; its spoken form names
    // untitled chapters.
    let written_title = raw
        .title
        .as_deref()
        .map(|t| t.split_whitespace().collect::<Vec<_>>().join(" "));
    let doc_title = raw
        .title
        .map(|t| normalize(&t, language, &mut skipped))
        .filter(|t| is_speakable(t));
    let has_headed = raw.chapters.iter().any(|c| !c.leading);

    let mut chapters: Vec<Chapter> = Vec::new();
    for rc in raw.chapters {
        let mut chapter_looks = rc.chapter_looks;
        let mut looks = rc
            .looks
            .into_iter()
            .map(Some)
            .chain(std::iter::repeat(None));
        // Images of a block with nothing to say go with the next block that has.
        let mut images = Vec::new();
        let mut paragraphs: Vec<Paragraph> = Vec::new();
        for b in &rc.blocks {
            let look = looks.next().flatten();
            match paragraph(b, cap, language, &mut skipped) {
                Some(mut p) => {
                    p.look = look.map(|mut l| {
                        images.append(&mut l.images);
                        l.images = std::mem::take(&mut images);
                        l
                    });
                    paragraphs.push(p);
                }
                None => images.extend(look.into_iter().flat_map(|l| l.images)),
            }
        }
        images.append(&mut chapter_looks.images_after);
        chapter_looks.images_after = images;
        if paragraphs.is_empty() {
            continue;
        }
        let own_title = rc
            .title
            .map(|t| normalize(&speakable_title(&t), language, &mut skipped))
            .filter(|t| is_speakable(t));
        let title = if rc.leading && has_headed {
            let words = word_count(&paragraphs);
            if !is_real_content(&paragraphs) {
                warnings.push(format!(
                    "skipped {words} words of title page before the first chapter"
                ));
                continue;
            }
            own_title
                .or_else(|| doc_title.clone())
                .unwrap_or_else(|| "Opening".to_owned())
        } else if rc.leading {
            own_title
                .or_else(|| doc_title.clone())
                .unwrap_or_else(|| "Chapter 1".to_owned())
        } else {
            own_title.unwrap_or_else(|| format!("Chapter {}", chapters.len() + 1))
        };
        let title = cap_sentence(&title, cap)
            .into_iter()
            .next()
            .unwrap_or(title);
        chapters.push(Chapter {
            title,
            paragraphs,
            looks: chapter_looks,
        });
    }
    if chapters.is_empty() {
        return Err(TextError::NothingSpeakable {
            path: origin.to_path_buf(),
        });
    }
    warnings.extend(skipped.warnings());
    Ok(Document {
        title: doc_title.and(written_title),
        chapters,
        warnings,
        meta: raw.meta,
    })
}

/// Normalized, split and capped sentences of one raw block; `None` if none is speakable.
fn paragraph(
    block: &str,
    cap: usize,
    language: Language,
    skipped: &mut Skipped,
) -> Option<Paragraph> {
    let text = normalize(block, language, skipped);
    let sentences: Vec<String> = split_sentences(&text)
        .iter()
        .flat_map(|s| cap_sentence(s, cap))
        .filter(|s| is_speakable(s))
        .collect();
    (!sentences.is_empty()).then_some(Paragraph {
        sentences,
        look: None,
    })
}

/// At least one letter or digit: something the voice will actually say.
fn is_speakable(s: &str) -> bool {
    s.chars().any(char::is_alphanumeric)
}

fn word_count(paragraphs: &[Paragraph]) -> usize {
    paragraphs
        .iter()
        .flat_map(|p| &p.sentences)
        .map(|s| s.split_whitespace().count())
        .sum()
}

fn is_real_content(paragraphs: &[Paragraph]) -> bool {
    word_count(paragraphs) >= PREFACE_MIN_WORDS
        || paragraphs
            .iter()
            .flat_map(|p| &p.sentences)
            .any(|s| s.split_whitespace().count() >= PREFACE_MIN_SENTENCE_WORDS)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chapter(title: Option<&str>, blocks: &[&str], leading: bool) -> RawChapter {
        RawChapter {
            title: title.map(str::to_owned),
            blocks: blocks.iter().map(|b| (*b).to_owned()).collect(),
            leading,
            ..RawChapter::default()
        }
    }

    fn run(raw: RawBook) -> Result<Document, TextError> {
        build(raw, &LoadOptions::default(), Path::new("t.txt"))
    }

    #[test]
    fn title_page_dropped_preface_kept() {
        let book = RawBook {
            title: Some("My Book".into()),
            chapters: vec![
                chapter(None, &["MY BOOK", "A. Writer"], true),
                chapter(Some("CHAPTER I"), &["It began."], false),
            ],
            warnings: vec![],
            ..RawBook::default()
        };
        let doc = run(book).expect("doc");
        assert_eq!(doc.chapters.len(), 1);
        assert_eq!(doc.chapters[0].title, "Chapter 1");
        assert!(doc.warnings[0].contains("title page"), "{:?}", doc.warnings);

        let preface = "This book was written over many long winters in a small cabin by the sea, and I owe thanks to many people.";
        let book = RawBook {
            title: Some("My Book".into()),
            chapters: vec![
                chapter(None, &[preface], true),
                chapter(Some("CHAPTER I"), &["It began."], false),
            ],
            warnings: vec![],
            ..RawBook::default()
        };
        let doc = run(book).expect("doc");
        assert_eq!(doc.chapters.len(), 2);
        assert_eq!(doc.chapters[0].title, "My Book");
    }

    #[test]
    fn untitled_and_empty_chapters() {
        let book = RawBook {
            title: None,
            chapters: vec![
                chapter(None, &["One."], false),
                chapter(Some("Empty"), &["\u{1f600} * * *", "  "], false),
                chapter(None, &["Two."], false),
            ],
            warnings: vec![],
            ..RawBook::default()
        };
        let doc = run(book).expect("doc");
        let titles: Vec<_> = doc.chapters.iter().map(|c| c.title.as_str()).collect();
        assert_eq!(titles, ["Chapter 1", "Chapter 2"]);
        assert_eq!(doc.warnings, ["skipped 1 emoji/pictographs"]);
    }

    #[test]
    fn nothing_speakable_is_an_error() {
        let book = RawBook {
            title: None,
            chapters: vec![chapter(None, &["\u{6f22}\u{5b57} \u{2192} ..."], true)],
            warnings: vec![],
            ..RawBook::default()
        };
        let err = run(book).expect_err("must fail");
        assert_eq!(err.kind(), "nothing_speakable");
    }
}
