//! Recognizing chapter-heading lines (`CHAPTER IV.`, `Chapter 12`, `Part One`,
//! `PROLOGUE: The Storm`) and rewriting them into speakable titles (`Chapter 4`,
//! `Part One`, `Prologue: The Storm`).
//!
//! This is the only place where Roman numerals are turned into digits: a numeral is
//! converted only right after a heading keyword, so a lone "I" in prose is never touched.
//! Plain text uses [`parse_heading`] to find chapters; Markdown and EPUB titles go
//! through [`speakable_title`] so all formats name chapters the same way.

/// A recognized heading: `label` is e.g. "Chapter 4", `title` the rest of the line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Heading {
    pub(crate) label: String,
    pub(crate) title: Option<String>,
}

impl Heading {
    /// "Chapter 4: Title", or just the label.
    pub(crate) fn display(&self) -> String {
        match &self.title {
            Some(t) => format!("{}: {}", self.label, t),
            None => self.label.clone(),
        }
    }
}

/// Keywords followed by a number.
const NUMBERED: &[&str] = &["chapter", "part", "book", "volume"];
/// Keywords that stand alone.
const STANDALONE: &[&str] = &[
    "prologue",
    "epilogue",
    "preface",
    "foreword",
    "introduction",
    "afterword",
    "interlude",
    "appendix",
];
/// Spelled-out numbers accepted after a keyword ("Part One").
const NUMBER_WORDS: &[&str] = &[
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
    "thirteen",
    "fourteen",
    "fifteen",
    "sixteen",
    "seventeen",
    "eighteen",
    "nineteen",
    "twenty",
];

/// Longest line (in chars) that can be a heading.
const MAX_HEADING_CHARS: usize = 100;

fn is_separator(c: char) -> bool {
    matches!(c, '.' | ':' | '-' | '\u{2013}' | '\u{2014}' | ',' | ';')
}

/// Parses a single trimmed line as a chapter heading.
pub(crate) fn parse_heading(line: &str) -> Option<Heading> {
    let line = line.trim();
    if line.is_empty() || line.chars().count() > MAX_HEADING_CHARS {
        return None;
    }
    let word_end = line
        .find(|c: char| c.is_whitespace() || is_separator(c))
        .unwrap_or(line.len());
    let (word, rest) = line.split_at(word_end);
    if !is_heading_case(word) {
        return None;
    }
    let lower = word.to_ascii_lowercase();
    if NUMBERED.contains(&lower.as_str()) {
        let rest = rest.trim_start_matches(|c: char| c.is_whitespace() || c == '.');
        let num_end = rest
            .find(|c: char| !c.is_alphanumeric())
            .unwrap_or(rest.len());
        let (num, after) = rest.split_at(num_end);
        let number = parse_number(num)?;
        let title = tail_title(after)?;
        Some(Heading {
            label: format!("{} {}", capitalize(&lower), number),
            title,
        })
    } else if STANDALONE.contains(&lower.as_str()) {
        let title = tail_title(rest)?;
        Some(Heading {
            label: capitalize(&lower),
            title,
        })
    } else {
        None
    }
}

/// Rewrites a heading from any format into its speakable form ("CHAPTER IV" →
/// "Chapter 4"); text that is not a recognized heading is returned unchanged.
pub(crate) fn speakable_title(raw: &str) -> String {
    match parse_heading(raw) {
        Some(h) => h.display(),
        None => raw.trim().to_owned(),
    }
}

/// What follows the number: `None` = not a heading, `Some(None)` = no title.
fn tail_title(after: &str) -> Option<Option<String>> {
    if after.trim().is_empty() {
        return Some(None);
    }
    // The number must end at whitespace or a separator, not run into letters.
    let first = after.chars().next()?;
    if !(first.is_whitespace() || is_separator(first)) {
        return None;
    }
    let had_separator = after.trim_start().starts_with(is_separator);
    let title = after
        .trim_start_matches(|c: char| c.is_whitespace() || is_separator(c))
        .trim();
    if title.is_empty() {
        return Some(None);
    }
    // "Part I think so." is prose: without a separator the title must look like one.
    let starts_upper = title
        .chars()
        .next()
        .is_some_and(|c| c.is_uppercase() || c.is_ascii_digit() || is_quote(c));
    if !had_separator && !starts_upper {
        return None;
    }
    Some(Some(title.to_owned()))
}

fn is_quote(c: char) -> bool {
    matches!(c, '"' | '\'' | '\u{2018}' | '\u{201c}' | '`')
}

/// "CHAPTER" or "Chapter", not "chapter" (which is prose).
fn is_heading_case(word: &str) -> bool {
    let mut chars = word.chars();
    let Some(first) = chars.next() else {
        return false;
    };
    if !first.is_uppercase() {
        return false;
    }
    let rest: Vec<char> = chars.collect();
    rest.iter().all(|c| c.is_uppercase()) || rest.iter().all(|c| c.is_lowercase())
}

fn capitalize(lower: &str) -> String {
    let mut chars = lower.chars();
    match chars.next() {
        Some(f) => f.to_uppercase().chain(chars).collect(),
        None => String::new(),
    }
}

/// Digits, a Roman numeral or a number word, as it should be spoken.
fn parse_number(token: &str) -> Option<String> {
    if token.is_empty() {
        return None;
    }
    if token.len() <= 4 && token.bytes().all(|b| b.is_ascii_digit()) {
        return token.parse::<u32>().ok().map(|n| n.to_string());
    }
    if let Some(n) = roman_value(token) {
        return Some(n.to_string());
    }
    let lower = token.to_lowercase();
    if NUMBER_WORDS.contains(&lower.as_str()) {
        return Some(capitalize(&lower));
    }
    None
}

/// Value of a canonical Roman numeral (all upper or all lower case), 1..=3999.
pub(crate) fn roman_value(token: &str) -> Option<u32> {
    let upper = token.to_ascii_uppercase();
    if token != upper && token != token.to_ascii_lowercase() {
        return None;
    }
    if upper.is_empty() || upper.len() > 15 {
        return None;
    }
    let digit = |c: char| match c {
        'I' => Some(1),
        'V' => Some(5),
        'X' => Some(10),
        'L' => Some(50),
        'C' => Some(100),
        'D' => Some(500),
        'M' => Some(1000),
        _ => None,
    };
    let values: Vec<u32> = upper.chars().map(digit).collect::<Option<_>>()?;
    let mut total = 0i64;
    for (i, v) in values.iter().enumerate() {
        match values.get(i + 1) {
            Some(next) if next > v => total -= i64::from(*v),
            _ => total += i64::from(*v),
        }
    }
    // Reject non-canonical forms such as "IIII" or "IC" by writing the value back.
    u32::try_from(total)
        .ok()
        .filter(|n| (1..=3999).contains(n))
        .filter(|&n| to_roman(n) == upper)
}

fn to_roman(mut n: u32) -> String {
    const TABLE: &[(u32, &str)] = &[
        (1000, "M"),
        (900, "CM"),
        (500, "D"),
        (400, "CD"),
        (100, "C"),
        (90, "XC"),
        (50, "L"),
        (40, "XL"),
        (10, "X"),
        (9, "IX"),
        (5, "V"),
        (4, "IV"),
        (1, "I"),
    ];
    let mut out = String::new();
    for &(v, s) in TABLE {
        while n >= v {
            out.push_str(s);
            n -= v;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shown(line: &str) -> Option<String> {
        parse_heading(line).map(|h| h.display())
    }

    #[test]
    fn recognizes_chapter_forms() {
        assert_eq!(shown("CHAPTER I").as_deref(), Some("Chapter 1"));
        assert_eq!(shown("Chapter 12.").as_deref(), Some("Chapter 12"));
        assert_eq!(
            shown("CHAPTER IV. The Rabbit Sends in a Little Bill").as_deref(),
            Some("Chapter 4: The Rabbit Sends in a Little Bill")
        );
        assert_eq!(shown("  CHAPTER XII  ").as_deref(), Some("Chapter 12"));
        assert_eq!(shown("Part One").as_deref(), Some("Part One"));
        assert_eq!(shown("PART II: Winter").as_deref(), Some("Part 2: Winter"));
        assert_eq!(shown("PROLOGUE").as_deref(), Some("Prologue"));
        assert_eq!(shown("Epilogue").as_deref(), Some("Epilogue"));
        assert_eq!(
            shown("Epilogue: Ten Years On").as_deref(),
            Some("Epilogue: Ten Years On")
        );
        assert_eq!(
            shown("Chapter 3 \u{2014} The Storm").as_deref(),
            Some("Chapter 3: The Storm")
        );
    }

    #[test]
    fn rejects_prose() {
        assert_eq!(shown("chapter 3 was the best part"), None);
        assert_eq!(shown("Part of me wanted to stay."), None);
        assert_eq!(shown("Part I think so."), None);
        assert_eq!(shown("Chapter and verse"), None);
        assert_eq!(shown("Introduction to the theory"), None);
        assert_eq!(shown("Chapters"), None);
        assert_eq!(shown("Chapter IIII"), None);
        assert_eq!(shown(&format!("Chapter 1: {}", "word ".repeat(30))), None);
    }

    #[test]
    fn roman_numerals() {
        assert_eq!(roman_value("IV"), Some(4));
        assert_eq!(roman_value("xii"), Some(12));
        assert_eq!(roman_value("MCMXCIV"), Some(1994));
        assert_eq!(roman_value("IC"), None);
        assert_eq!(roman_value("Iv"), None);
        assert_eq!(roman_value("ABC"), None);
    }

    #[test]
    fn speakable_title_leaves_other_text() {
        assert_eq!(speakable_title("CHAPTER IX"), "Chapter 9");
        assert_eq!(speakable_title("  A Mad Tea-Party "), "A Mad Tea-Party");
    }
}
