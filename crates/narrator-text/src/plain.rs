//! Plain-text structure: paragraphs and chapters from a `.txt` file.
//!
//! Paragraphs are blocks separated by blank lines; the hard-wrapped lines of a block
//! are joined with a space (or with nothing after a trailing hyphen, so "waistcoat-" +
//! "pocket" stays one word). A block whose first line is a heading
//! ([`crate::heading::parse_heading`]: `CHAPTER IV.`, `Part One`, `PROLOGUE`...) starts a
//! chapter; its title may follow on the same line, on the next line of the block, or
//! as the next one-line block when that line looks like a title (short, title case),
//! which is how many Gutenberg texts, alice29.txt included, lay it out.
//!
//! Text before the first heading is marked `leading`; the builder keeps it only when it
//! is real prose (a preface), not a title page. A first one-line title-like block is
//! taken as the document title. Project Gutenberg licence boilerplate around the
//! `*** START OF` / `*** END OF` markers is cut off.

use crate::build::{RawBook, RawChapter};
use crate::heading::parse_heading;

/// Longest line (in chars) taken as a title line.
const MAX_TITLE_CHARS: usize = 80;
/// Most words in a title line.
const MAX_TITLE_WORDS: usize = 12;

pub(crate) fn parse(text: &str) -> RawBook {
    let text = text.replace("\r\n", "\n").replace('\r', "\n");
    let body = strip_gutenberg(&text);
    let blocks = blocks(body);

    let mut book = RawBook::default();
    let mut current = RawChapter {
        leading: true,
        ..RawChapter::default()
    };
    let mut i = 0;
    while i < blocks.len() {
        let block = &blocks[i];
        i += 1;
        let Some(first) = block.first() else {
            continue;
        };
        let Some(heading) = parse_heading(first) else {
            if i == 1 && block.len() == 1 && is_title_like(first) {
                book.title = Some(first.trim().to_owned());
            }
            current.blocks.push(join_lines(block));
            continue;
        };
        let mut heading = heading;
        let mut body_from = 1;
        if heading.title.is_none() {
            if let Some(second) = block
                .get(1)
                .filter(|l| block.len() == 2 && is_title_like(l))
            {
                heading.title = Some(second.trim().to_owned());
                body_from = 2;
            } else if block.len() == 1
                && let Some(next) = blocks.get(i)
                && next.len() == 1
                && is_title_like(next[0])
                && parse_heading(next[0]).is_none()
            {
                heading.title = Some(next[0].trim().to_owned());
                i += 1;
            }
        }
        book.chapters.push(std::mem::take(&mut current));
        current.title = Some(heading.display());
        if block.len() > body_from {
            current.blocks.push(join_lines(&block[body_from..]));
        }
    }
    book.chapters.push(current);
    book.chapters
        .retain(|c| !c.blocks.is_empty() || c.title.is_some());
    book
}

/// The text between Project Gutenberg's start and end markers, if present.
fn strip_gutenberg(text: &str) -> &str {
    let mut body = text;
    if let Some(pos) = find_marker(body, "*** START OF") {
        body = body[pos..].split_once('\n').map_or("", |(_, rest)| rest);
    }
    if let Some(pos) = find_marker(body, "*** END OF") {
        body = &body[..pos];
    }
    body
}

/// Byte offset of the start of the line holding `marker` followed by "PROJECT GUTENBERG".
fn find_marker(text: &str, marker: &str) -> Option<usize> {
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        let upper = line.to_ascii_uppercase();
        if upper.trim_start().starts_with(marker) && upper.contains("PROJECT GUTENBERG") {
            return Some(offset);
        }
        offset += line.len();
    }
    None
}

/// Blank-line separated blocks of non-blank lines.
fn blocks(text: &str) -> Vec<Vec<&str>> {
    let mut out = Vec::new();
    let mut current: Vec<&str> = Vec::new();
    for line in text.lines() {
        if line.trim().is_empty() {
            if !current.is_empty() {
                out.push(std::mem::take(&mut current));
            }
        } else {
            current.push(line);
        }
    }
    if !current.is_empty() {
        out.push(current);
    }
    out
}

/// Joins hard-wrapped lines into one paragraph.
fn join_lines(lines: &[&str]) -> String {
    let mut out = String::new();
    for line in lines {
        let line = line.trim();
        if !out.is_empty() && !out.ends_with('-') {
            out.push(' ');
        }
        out.push_str(line);
    }
    out
}

/// A short line in title case without a trailing comma or period.
fn is_title_like(line: &str) -> bool {
    let line = line.trim();
    let words: Vec<&str> = line.split_whitespace().collect();
    let Some(first) = line.chars().next() else {
        return false;
    };
    if line.chars().count() > MAX_TITLE_CHARS || words.len() > MAX_TITLE_WORDS {
        return false;
    }
    if !(first.is_uppercase()
        || first.is_ascii_digit()
        || matches!(first, '"' | '\'' | '\u{2018}' | '\u{201c}'))
    {
        return false;
    }
    let last = line.chars().last().unwrap_or(' ');
    if matches!(last, ',' | ';' | ':' | '.' | '-') && !line.ends_with("...") {
        return false;
    }
    let long_words: Vec<&&str> = words
        .iter()
        .filter(|w| w.chars().filter(|c| c.is_alphabetic()).count() >= 4)
        .collect();
    let capitalized = long_words
        .iter()
        .filter(|w| {
            w.chars()
                .find(|c| c.is_alphabetic())
                .is_some_and(char::is_uppercase)
        })
        .count();
    if matches!(last, '?' | '!') {
        // "Who Stole the Tarts?" is a title; "Are you sure?" is dialogue.
        return words.len() >= 2 && capitalized == long_words.len();
    }
    capitalized * 2 >= long_words.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn titles(book: &RawBook) -> Vec<Option<&str>> {
        book.chapters.iter().map(|c| c.title.as_deref()).collect()
    }

    #[test]
    fn headings_with_titles_in_all_positions() {
        let text = "THE BOOK\n\nCHAPTER I\n\n   Down the Hole\n\nAlice ran\nfast.\n\nCHAPTER II.\nThe Pool\n\nShe swam.\n\nCHAPTER IV. The Rabbit Sends in a Little Bill\n\nHe came.\n\nCHAPTER V\n\nShe said no.\n";
        let book = parse(text);
        assert_eq!(book.title.as_deref(), Some("THE BOOK"));
        assert_eq!(
            titles(&book),
            [
                None,
                Some("Chapter 1: Down the Hole"),
                Some("Chapter 2: The Pool"),
                Some("Chapter 4: The Rabbit Sends in a Little Bill"),
                Some("Chapter 5"),
            ]
        );
        assert!(book.chapters[0].leading);
        assert_eq!(book.chapters[1].blocks, ["Alice ran fast."]);
        // "She said no." is a sentence, not a title.
        assert_eq!(book.chapters[4].blocks, ["She said no."]);
    }

    #[test]
    fn question_titles_and_dialogue() {
        assert!(is_title_like("Who Stole the Tarts?"));
        assert!(!is_title_like("`Are you sure?'"));
        assert!(!is_title_like("Are you sure?"));
        assert!(is_title_like("A Mad Tea-Party"));
        assert!(!is_title_like("and then it was over"));
        assert!(!is_title_like("It was over."));
    }

    #[test]
    fn no_headings_is_one_leading_chapter() {
        let book = parse("Just some text.\nMore of it.\n\nAnother paragraph.");
        assert_eq!(book.chapters.len(), 1);
        assert!(book.chapters[0].leading);
        assert_eq!(
            book.chapters[0].blocks,
            ["Just some text. More of it.", "Another paragraph."]
        );
    }

    #[test]
    fn hyphenated_line_ends_join_without_space() {
        assert_eq!(
            join_lines(&["a waistcoat-", "pocket and", "farm-yard--", "while"]),
            "a waistcoat-pocket and farm-yard--while"
        );
    }

    #[test]
    fn gutenberg_boilerplate_cut() {
        let text = "The Project Gutenberg eBook of X\nlicence blah\n*** START OF THE PROJECT GUTENBERG EBOOK X ***\nStory.\n*** END OF THE PROJECT GUTENBERG EBOOK X ***\nmore licence";
        let book = parse(text);
        assert_eq!(book.chapters.len(), 1);
        assert_eq!(book.chapters[0].blocks, ["Story."]);
    }

    #[test]
    fn crlf_and_prologue_epilogue() {
        let book = parse(
            "PROLOGUE\r\n\r\nOnce.\r\n\r\nPart One\r\n\r\nTwice.\r\n\r\nEPILOGUE\r\n\r\nDone.\r\n",
        );
        assert_eq!(
            titles(&book),
            [Some("Prologue"), Some("Part One"), Some("Epilogue")]
        );
    }
}
