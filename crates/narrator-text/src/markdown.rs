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
    let (items, front) = items(text);
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
        title: front.title,
        meta: front.meta,
        cover_path: front.cover,
        warnings: front.warnings,
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

/// Headings and text blocks in order, plus what the front matter says.
fn items(text: &str) -> (Vec<Item>, FrontMatter) {
    let options = Options::ENABLE_YAML_STYLE_METADATA_BLOCKS
        | Options::ENABLE_STRIKETHROUGH
        | Options::ENABLE_TABLES
        | Options::ENABLE_FOOTNOTES;
    let mut items = Vec::new();
    let mut buf = String::new();
    let mut skip_depth = 0usize;
    let mut heading: Option<HeadingLevel> = None;
    let mut in_meta = false;
    let mut front = FrontMatter::default();
    let mut meta_text = String::new();

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
            Event::End(TagEnd::MetadataBlock(_)) => {
                in_meta = false;
                front = front_matter(&meta_text);
            }
            Event::Text(t) if in_meta => meta_text.push_str(&t),
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
    (items, front)
}

/// What YAML front matter says about the book.
#[derive(Debug, Default, PartialEq)]
struct FrontMatter {
    title: Option<String>,
    meta: narrator_core::BookMeta,
    /// `cover:` as written (a path relative to the Markdown file).
    cover: Option<String>,
    warnings: Vec<String>,
}

/// Reads YAML front matter: `title`, `author` (or `authors`, a string or a list),
/// `language` (or `lang`), `date` (or `year`), `publisher`, `cover` (or `cover-image`,
/// `cover_image`). Unknown keys are ignored; front matter that is not YAML is a warning.
fn front_matter(yaml: &str) -> FrontMatter {
    use yaml_rust2::{Yaml, YamlLoader};
    let mut front = FrontMatter::default();
    if let Some(why) = unsafe_yaml(yaml) {
        front.warnings.push(format!(
            "front matter {why}, which narrator does not read (aliases and deep or huge \
             documents can take a machine's memory); its title, author and cover are ignored"
        ));
        return front;
    }
    let docs = match YamlLoader::load_from_str(yaml) {
        Ok(docs) => docs,
        Err(e) => {
            front.warnings.push(format!(
                "front matter is not valid YAML ({e}); its title, author and cover are ignored"
            ));
            return front;
        }
    };
    let Some(doc) = docs.first() else {
        return front;
    };
    let text = |v: &Yaml| -> Option<String> {
        let s = match v {
            Yaml::String(s) => s.clone(),
            Yaml::Integer(i) => i.to_string(),
            Yaml::Real(r) => r.clone(),
            Yaml::Array(items) => items
                .iter()
                .filter_map(|i| i.as_str().map(str::trim))
                .filter(|s| !s.is_empty())
                .collect::<Vec<_>>()
                .join(", "),
            _ => return None,
        };
        let s = s.split_whitespace().collect::<Vec<_>>().join(" ");
        (!s.is_empty()).then_some(s)
    };
    let first = |keys: &[&str]| keys.iter().find_map(|k| text(&doc[*k]));
    front.title = first(&["title"]);
    front.meta.author = first(&["author", "authors", "creator"]);
    front.meta.language = first(&["language", "lang"]);
    front.meta.date = first(&["date", "year"]);
    front.meta.publisher = first(&["publisher"]);
    front.cover = first(&["cover", "cover-image", "cover_image"]);
    front
}

/// Most nodes front matter may have (a book's metadata has a few dozen).
const MAX_YAML_NODES: usize = 10_000;
/// Deepest nesting front matter may have.
const MAX_YAML_DEPTH: usize = 32;

/// Why `yaml` must not be loaded, read from its events without building it: an alias
/// (the loader copies the aliased node at every use, so a few lines can ask for
/// gigabytes), more than [`MAX_YAML_NODES`] nodes or deeper than [`MAX_YAML_DEPTH`].
/// Syntax errors are left to the loader to report.
fn unsafe_yaml(yaml: &str) -> Option<String> {
    use yaml_rust2::parser::{Event, Parser};
    let mut parser = Parser::new_from_str(yaml);
    let (mut nodes, mut depth) = (0usize, 0usize);
    loop {
        let (event, mark) = parser.next_token().ok()?;
        match event {
            Event::StreamEnd => return None,
            Event::Alias(_) => {
                return Some(format!("uses a YAML alias (line {})", mark.line()));
            }
            Event::SequenceStart(..) | Event::MappingStart(..) => {
                depth += 1;
                nodes += 1;
                if depth > MAX_YAML_DEPTH {
                    return Some(format!("nests deeper than {MAX_YAML_DEPTH} levels"));
                }
            }
            Event::SequenceEnd | Event::MappingEnd => depth = depth.saturating_sub(1),
            Event::Scalar(..) => nodes += 1,
            _ => {}
        }
        if nodes > MAX_YAML_NODES {
            return Some(format!("has more than {MAX_YAML_NODES} nodes"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn front_matter_with_aliases_or_too_many_nodes_is_refused_with_a_warning_fast() {
        // A small "billion laughs": six levels of ten aliases are a million strings once
        // loaded; read as events it is a few dozen lines.
        let mut yaml = String::from(
            "a: &a [\"lol\", \"lol\", \"lol\", \"lol\", \"lol\", \"lol\", \"lol\", \"lol\", \"lol\", \"lol\"]\n",
        );
        for (prev, name) in ["a", "b", "c", "d", "e"]
            .iter()
            .zip(["b", "c", "d", "e", "f"])
        {
            let refs = vec![format!("*{prev}"); 10].join(", ");
            yaml.push_str(&format!("{name}: &{name} [{refs}]\n"));
        }
        yaml.push_str("title: Bomb\n");
        let md = format!("---\n{yaml}---\n\n## One\n\nText.\n");
        let started = std::time::Instant::now();
        let book = parse(&md);
        assert_eq!(book.title, None, "nothing is read from it");
        assert_eq!(book.warnings.len(), 1, "{:?}", book.warnings);
        assert!(
            book.warnings[0].contains("uses a YAML alias (line 2)"),
            "{:?}",
            book.warnings
        );
        assert!(
            started.elapsed() < std::time::Duration::from_secs(5),
            "read without loading"
        );
        // Too many nodes, or too deep, without any alias.
        let many = format!(
            "---\ntitle: Big\nlist: [{}]\n---\n\nText.\n",
            vec!["x"; MAX_YAML_NODES + 1].join(", ")
        );
        let book = parse(&many);
        assert!(
            book.warnings[0].contains("more than 10000 nodes"),
            "{:?}",
            book.warnings
        );
        let deep = format!(
            "---\ntitle: Deep\nx: {}{}\n---\n\nText.\n",
            "[".repeat(40),
            "]".repeat(40)
        );
        let book = parse(&deep);
        assert!(
            book.warnings[0].contains("deeper than 32"),
            "{:?}",
            book.warnings
        );
        // Ordinary front matter is still read.
        assert_eq!(unsafe_yaml("title: A\nauthors: [B, C]\n"), None);
    }

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
    fn front_matter_gives_the_book_metadata() {
        let md = "---\ntitle: The Hunting of the Snark\nauthors:\n  - Lewis Carroll\n  - Henry Holiday\nlang: en-GB\nyear: 1876\npublisher: Macmillan\ncover: images/snark.jpg\nunknown: [1, 2]\n---\n\n## Fit the First\n\nJust the place for a Snark!\n";
        let book = parse(md);
        assert_eq!(book.title.as_deref(), Some("The Hunting of the Snark"));
        assert_eq!(
            book.meta.author.as_deref(),
            Some("Lewis Carroll, Henry Holiday")
        );
        assert_eq!(book.meta.language.as_deref(), Some("en-GB"));
        assert_eq!(book.meta.date.as_deref(), Some("1876"));
        assert_eq!(book.meta.year(), Some("1876"));
        assert_eq!(book.meta.publisher.as_deref(), Some("Macmillan"));
        assert_eq!(book.cover_path.as_deref(), Some("images/snark.jpg"));
        assert!(book.warnings.is_empty(), "{:?}", book.warnings);
        let broken = parse("---\ntitle: [unclosed\n---\n\nText.\n");
        assert_eq!(broken.title, None);
        assert!(
            broken.warnings[0].contains("not valid YAML"),
            "{:?}",
            broken.warnings
        );
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
        assert_eq!(book.meta.author.as_deref(), Some("me"));
        assert_eq!(book.chapters.len(), 1);
        assert_eq!(
            book.chapters[0].blocks,
            ["Text with and html.", "a, b,", "1, 2,"]
        );
    }
}
