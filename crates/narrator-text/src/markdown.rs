//! Markdown structure: chapters from `#` / `##` headings, paragraphs from block elements.
//!
//! pulldown-cmark does the parsing, so inline markup (emphasis, strong, strikethrough,
//! inline code) is already gone and links keep only their text. Choices made here:
//! - Code blocks, images, raw HTML and footnote definitions are skipped: none of them
//!   reads well aloud, and a listener cannot follow code. Inline `code` is read as text.
//! - One `#` heading before any `##` is the book's title, and then `##` headings are the
//!   chapters; otherwise both `#` and `##` start chapters. YAML front matter `title:`
//!   overrides the title. Deeper headings become spoken paragraphs (with a period, so
//!   the voice pauses after them).
//! - List items, block quotes and table rows are paragraphs (table cells joined by
//!   commas).

use pulldown_cmark::{Event, HeadingLevel, Options, Parser, Tag, TagEnd};

use crate::build::{RawBook, RawChapter};

#[derive(Debug, Clone, PartialEq, Eq)]
enum Item {
    Heading(HeadingLevel, String),
    Block(String),
}

pub(crate) fn parse(text: &str) -> RawBook {
    let (items, meta_title) = items(text);
    let h1: Vec<usize> = items
        .iter()
        .enumerate()
        .filter(|(_, it)| matches!(it, Item::Heading(HeadingLevel::H1, _)))
        .map(|(i, _)| i)
        .collect();
    let first_heading = items.iter().position(|it| matches!(it, Item::Heading(..)));
    let has_h2 = items
        .iter()
        .any(|it| matches!(it, Item::Heading(HeadingLevel::H2, _)));
    // A lone leading `#` above `##` chapters is the book title.
    let h1_is_title = h1.len() == 1 && first_heading == h1.first().copied() && has_h2;

    let mut book = RawBook {
        title: meta_title,
        ..RawBook::default()
    };
    if book.title.is_none() && h1.len() == 1 {
        book.title = items.get(h1[0]).and_then(|it| match it {
            Item::Heading(_, t) => Some(t.clone()),
            Item::Block(_) => None,
        });
    }
    let mut current = RawChapter {
        leading: true,
        ..RawChapter::default()
    };
    for item in items {
        match item {
            Item::Heading(HeadingLevel::H1, _) if h1_is_title => {}
            Item::Heading(HeadingLevel::H1 | HeadingLevel::H2, title) => {
                book.chapters.push(std::mem::take(&mut current));
                current.title = Some(title);
            }
            Item::Heading(_, text) => current.blocks.push(with_period(text)),
            Item::Block(text) => current.blocks.push(text),
        }
    }
    book.chapters.push(current);
    book.chapters
        .retain(|c| !c.blocks.is_empty() || c.title.is_some());
    book
}

/// A heading read inside a chapter ends with punctuation so the voice pauses.
fn with_period(mut text: String) -> String {
    if !text.trim_end().ends_with(['.', '!', '?', ':', '\u{2026}']) {
        text.push('.');
    }
    text
}

/// Headings and text blocks in order, plus a front-matter title.
fn items(text: &str) -> (Vec<Item>, Option<String>) {
    let options = Options::ENABLE_YAML_STYLE_METADATA_BLOCKS
        | Options::ENABLE_STRIKETHROUGH
        | Options::ENABLE_TABLES
        | Options::ENABLE_FOOTNOTES;
    let mut items = Vec::new();
    let mut buf = String::new();
    let mut skip_depth = 0usize;
    let mut heading: Option<HeadingLevel> = None;
    let mut in_meta = false;
    let mut meta_title = None;

    let flush = |buf: &mut String, items: &mut Vec<Item>, heading: Option<HeadingLevel>| {
        let text = buf.split_whitespace().collect::<Vec<_>>().join(" ");
        if !text.is_empty() {
            items.push(match heading {
                Some(level) => Item::Heading(level, text),
                None => Item::Block(text),
            });
        }
        buf.clear();
    };

    for event in Parser::new_ext(text, options) {
        match event {
            Event::Start(Tag::CodeBlock(_) | Tag::Image { .. } | Tag::FootnoteDefinition(_)) => {
                skip_depth += 1;
            }
            Event::End(TagEnd::CodeBlock | TagEnd::Image | TagEnd::FootnoteDefinition) => {
                skip_depth = skip_depth.saturating_sub(1);
            }
            Event::Start(Tag::MetadataBlock(_)) => in_meta = true,
            Event::End(TagEnd::MetadataBlock(_)) => in_meta = false,
            Event::Text(t) if in_meta && meta_title.is_none() => meta_title = yaml_title(&t),
            Event::Text(_) if in_meta => {}
            Event::Start(Tag::Heading { level, .. }) => {
                flush(&mut buf, &mut items, heading);
                heading = Some(level);
            }
            Event::End(TagEnd::Heading(_)) => {
                flush(&mut buf, &mut items, heading);
                heading = None;
            }
            Event::Start(
                Tag::Paragraph | Tag::Item | Tag::BlockQuote(_) | Tag::TableRow | Tag::TableHead,
            )
            | Event::End(
                TagEnd::Paragraph
                | TagEnd::Item
                | TagEnd::BlockQuote(_)
                | TagEnd::TableRow
                | TagEnd::TableHead,
            )
            | Event::Rule => flush(&mut buf, &mut items, heading),
            Event::End(TagEnd::TableCell) if skip_depth == 0 => buf.push_str(", "),
            Event::Text(t) | Event::Code(t) if skip_depth == 0 => buf.push_str(&t),
            Event::SoftBreak | Event::HardBreak if skip_depth == 0 => buf.push(' '),
            _ => {}
        }
    }
    flush(&mut buf, &mut items, heading);
    (items, meta_title)
}

/// `title: Something` from YAML front matter (simple scalar form only).
fn yaml_title(yaml: &str) -> Option<String> {
    yaml.lines().find_map(|line| {
        let value = line.strip_prefix("title:")?.trim();
        let value = value.trim_matches(|c| c == '"' || c == '\'').trim();
        (!value.is_empty()).then(|| value.to_owned())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn titles(book: &RawBook) -> Vec<Option<&str>> {
        book.chapters.iter().map(|c| c.title.as_deref()).collect()
    }

    #[test]
    fn lone_h1_is_title_and_h2_are_chapters() {
        let md = "# The Book\n\nA foreword line.\n\n## One\n\nHello *there*, [friend](http://x.y).\n\n### Aside\n\n- item a\n- item b\n\n## Two\n\n```\ncode();\n```\n\nBye `now`.\n";
        let book = parse(md);
        assert_eq!(book.title.as_deref(), Some("The Book"));
        assert_eq!(titles(&book), [None, Some("One"), Some("Two")]);
        assert_eq!(book.chapters[0].blocks, ["A foreword line."]);
        assert_eq!(
            book.chapters[1].blocks,
            ["Hello there, friend.", "Aside.", "item a", "item b"]
        );
        assert_eq!(book.chapters[2].blocks, ["Bye now."]);
    }

    #[test]
    fn several_h1_are_chapters() {
        let book = parse("# Chapter I\n\nOne.\n\n# Chapter II\n\nTwo.\n\n## Part\n\nThree.");
        assert_eq!(book.title, None);
        assert_eq!(
            titles(&book),
            [Some("Chapter I"), Some("Chapter II"), Some("Part")]
        );
    }

    #[test]
    fn front_matter_title_and_skipped_bits() {
        let md = "---\ntitle: \"Front Title\"\nauthor: me\n---\n\nText with ![an image](x.png) and <b>html</b>.[^1]\n\n[^1]: A footnote.\n\n| a | b |\n|---|---|\n| 1 | 2 |\n";
        let book = parse(md);
        assert_eq!(book.title.as_deref(), Some("Front Title"));
        assert_eq!(book.chapters.len(), 1);
        assert_eq!(
            book.chapters[0].blocks,
            ["Text with and html.", "a, b,", "1, 2,"]
        );
    }
}
