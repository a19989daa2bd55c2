//! Text normalization: from one raw paragraph to one clean, speakable line.
//!
//! espeak-ng (the phonemizer behind Piper voices) reads ordinary English prose well,
//! punctuation included, so this module changes as little as possible and only where
//! the phonemizer stumbles:
//!
//! 1. Unicode NFC, so "e + combining acute" and "é" are the same letter.
//! 2. Character pass: whitespace variants become a space; control and invisible
//!    characters vanish; emphasis markers (`*`, `_word_`) vanish; TeX/backtick quotes
//!    become curly quotes; ligatures and full-width forms become ASCII; emoji, other
//!    scripts (CJK, Cyrillic, Arabic, Greek...) and stray symbols are removed and
//!    counted in [`Skipped`] so the document can warn once per kind.
//! 3. Dashes: an em-dash (or `--`, or a spaced dash) becomes a ", " pause (or "…" when
//!    it cuts off the end of a sentence); an en-dash between digits reads "to".
//! 4. Expansions: currency (`$3.50` → "3 dollars 50 cents"), percentages, `&`, clock
//!    times (`3:45 pm` → "3 45 p m"), and titles/Latin abbreviations (`Mr.` →
//!    "Mister", `e.g.` → "for example") so that their period never ends a sentence.
//!    Plain numbers, years and ordinals are left to espeak, which reads them well.
//! 5. Whitespace collapse and tidy-up of punctuation left dangling by removals.
//!
//! By the voice's language ([`Language`]): the expansions of step 4 and the en-dash
//! "to" are English and apply to English voices only (espeak-ng reads numbers, dates,
//! currency signs and percentages in the voice's own language); step 2 keeps, besides
//! Latin, the scripts the voice's language is written in (Cyrillic for a Russian voice,
//! Greek for Greek, Han and kana for Japanese...) and removes the others.

use unicode_normalization::UnicodeNormalization;

/// The voice's language, as normalization needs it: whether the English rules apply
/// and which scripts besides Latin it reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Language {
    code: &'static str,
    english: bool,
    scripts: &'static [Script],
}

/// A writing system beyond Latin, by its Unicode blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Script {
    /// Cyrillic.
    Cyrillic,
    /// Greek.
    Greek,
    /// Hebrew.
    Hebrew,
    /// Arabic (also Persian, Urdu).
    Arabic,
    /// Devanagari (Hindi, Marathi, Nepali).
    Devanagari,
    /// Bengali.
    Bengali,
    /// Tamil.
    Tamil,
    /// Thai.
    Thai,
    /// Armenian.
    Armenian,
    /// Georgian.
    Georgian,
    /// Han ideographs and CJK punctuation.
    Han,
    /// Hiragana and katakana.
    Kana,
    /// Hangul.
    Hangul,
}

impl Script {
    fn contains(self, c: char) -> bool {
        let u = u32::from(c);
        let cjk_punct = (0x3000..=0x303f).contains(&u) || (0xff00..=0xffef).contains(&u);
        match self {
            Script::Cyrillic => {
                matches!(u, 0x400..=0x52f | 0x1c80..=0x1c8f | 0x2de0..=0x2dff | 0xa640..=0xa69f)
            }
            Script::Greek => matches!(u, 0x370..=0x3ff | 0x1f00..=0x1fff),
            Script::Hebrew => matches!(u, 0x590..=0x5ff | 0xfb1d..=0xfb4f),
            Script::Arabic => {
                matches!(u, 0x600..=0x6ff | 0x750..=0x77f | 0x8a0..=0x8ff | 0xfb50..=0xfdff | 0xfe70..=0xfeff)
            }
            Script::Devanagari => matches!(u, 0x900..=0x97f | 0xa8e0..=0xa8ff),
            Script::Bengali => matches!(u, 0x980..=0x9ff),
            Script::Tamil => matches!(u, 0xb80..=0xbff),
            Script::Thai => matches!(u, 0xe00..=0xe7f),
            Script::Armenian => matches!(u, 0x530..=0x58f),
            Script::Georgian => matches!(u, 0x10a0..=0x10ff | 0x2d00..=0x2d2f),
            Script::Han => {
                matches!(u, 0x4e00..=0x9fff | 0x3400..=0x4dbf | 0xf900..=0xfaff) || cjk_punct
            }
            Script::Kana => matches!(u, 0x3040..=0x30ff | 0x31f0..=0x31ff) || cjk_punct,
            Script::Hangul => {
                matches!(u, 0xac00..=0xd7af | 0x1100..=0x11ff | 0x3130..=0x318f) || cjk_punct
            }
        }
    }
}

/// Languages (ISO 639-1/3 primary subtags, as voice configs and espeak-ng name them)
/// written in a script besides Latin.
const SCRIPTS: &[(&str, &[Script])] = &[
    ("ru", &[Script::Cyrillic]),
    ("uk", &[Script::Cyrillic]),
    ("be", &[Script::Cyrillic]),
    ("bg", &[Script::Cyrillic]),
    ("mk", &[Script::Cyrillic]),
    ("sr", &[Script::Cyrillic]),
    ("kk", &[Script::Cyrillic]),
    ("ky", &[Script::Cyrillic]),
    ("mn", &[Script::Cyrillic]),
    ("tt", &[Script::Cyrillic]),
    ("el", &[Script::Greek]),
    ("grc", &[Script::Greek]),
    ("he", &[Script::Hebrew]),
    ("yi", &[Script::Hebrew]),
    ("ar", &[Script::Arabic]),
    ("fa", &[Script::Arabic]),
    ("ur", &[Script::Arabic]),
    ("ps", &[Script::Arabic]),
    ("hi", &[Script::Devanagari]),
    ("mr", &[Script::Devanagari]),
    ("ne", &[Script::Devanagari]),
    ("bn", &[Script::Bengali]),
    ("ta", &[Script::Tamil]),
    ("th", &[Script::Thai]),
    ("hy", &[Script::Armenian]),
    ("ka", &[Script::Georgian]),
    ("zh", &[Script::Han]),
    ("cmn", &[Script::Han]),
    ("yue", &[Script::Han]),
    ("ja", &[Script::Han, Script::Kana]),
    ("ko", &[Script::Hangul, Script::Han]),
];

impl Language {
    /// English: the rules narrator was first written for.
    pub const ENGLISH: Language = Language {
        code: "en",
        english: true,
        scripts: &[],
    };

    /// The language of a BCP 47 tag, a voice's `language.code` (`en_US`) or an espeak-ng
    /// voice (`en-us`, `cmn`): its primary subtag decides. Unknown or empty: English.
    pub fn of(tag: &str) -> Language {
        let primary = tag
            .split(['-', '_'])
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase();
        if primary.is_empty() || primary == "en" || primary == "eng" {
            return Language::ENGLISH;
        }
        let (code, scripts) = SCRIPTS
            .iter()
            .find(|(c, _)| *c == primary)
            .map_or(("", &[][..]), |(c, s)| (*c, *s));
        Language {
            // A Latin-script language keeps its own tag only through `english: false`;
            // the code is for messages.
            code: if code.is_empty() { "other" } else { code },
            english: false,
            scripts,
        }
    }

    /// The primary language subtag (`en`, `ru`, ...; `other` for Latin-script languages
    /// narrator has no script list for).
    pub fn code(&self) -> &'static str {
        self.code
    }

    /// Whether the English expansions apply.
    pub fn is_english(&self) -> bool {
        self.english
    }

    fn reads(&self, c: char) -> bool {
        self.scripts.iter().any(|s| s.contains(c))
    }
}

/// Characters removed from a document, by kind, with one example each.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Skipped {
    emoji: usize,
    script: usize,
    script_example: Option<char>,
    symbol: usize,
    symbol_example: Option<char>,
}

impl Skipped {
    /// One warning line per kind that occurred.
    pub(crate) fn warnings(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.emoji > 0 {
            out.push(format!("skipped {} emoji/pictographs", self.emoji));
        }
        if self.script > 0 {
            out.push(format!(
                "skipped {} characters in scripts the voice's language does not use (e.g. \"{}\")",
                self.script,
                self.script_example.unwrap_or('?')
            ));
        }
        if self.symbol > 0 {
            out.push(format!(
                "skipped {} unsupported symbols (e.g. \"{}\")",
                self.symbol,
                self.symbol_example.unwrap_or('?')
            ));
        }
        out
    }
}

/// Normalizes one paragraph (or title) of raw text into a single speakable line.
///
/// This is the whole normalization pipeline described in the module docs, without
/// sentence splitting; characters it removes are not reported.
pub fn normalize_text(text: &str) -> String {
    normalize(text, Language::ENGLISH, &mut Skipped::default())
}

/// [`normalize_text`] for a voice of `language`, counting what was removed into `skipped`.
pub(crate) fn normalize(text: &str, language: Language, skipped: &mut Skipped) -> String {
    let nfc: String = text.nfc().collect();
    let cleaned = clean_chars(&nfc, language, skipped);
    let dashed = fix_dashes(&cleaned, language);
    if language.is_english() {
        tidy(&expand(&dashed))
    } else {
        tidy(&dashed)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    Keep,
    Space,
    Drop,
    Emoji,
    Script,
    Symbol,
}

fn classify(c: char) -> Class {
    if c.is_whitespace() {
        return Class::Space;
    }
    if c.is_control() {
        return Class::Drop;
    }
    match u32::from(c) {
        // Soft hyphen, zero-width and direction marks, word joiner, BOM, variation
        // selectors, emoji tags and skin-tone modifiers: invisible, part of nothing
        // we can say.
        0xad | 0x200b..=0x200f | 0x2060..=0x206f | 0xfeff | 0xfe00..=0xfe0f => Class::Drop,
        0xe0000..=0xe007f | 0x1f3fb..=0x1f3ff => Class::Drop,
        // Bullets, daggers, asterisms, reference marks: typographic noise when spoken.
        0x2020..=0x2023 | 0x2042 | 0x203b | 0x2043 => Class::Space,
        0x20..=0x7e | 0xa1..=0xff => Class::Keep,
        // Latin Extended-A/B, IPA, spacing modifiers, combining diacritics.
        0x100..=0x36f | 0x1ab0..=0x1aff | 0x1dc0..=0x1dff | 0x1e00..=0x1eff => Class::Keep,
        0x2c60..=0x2c7f | 0xa720..=0xa7ff | 0xab30..=0xab6f => Class::Keep,
        // General punctuation (dashes, quotes, ellipsis, per mille), currency signs,
        // letter-like symbols (™, №), number forms (½, Ⅳ), ligatures, full-width ASCII.
        0x2010..=0x205e | 0x20a0..=0x20cf | 0x2100..=0x218f => Class::Keep,
        0xfb00..=0xfb06 | 0xff01..=0xff5e => Class::Keep,
        // Two- and three-em dashes are dashes, not symbols.
        0x2e3a | 0x2e3b => Class::Keep,
        // Pictographs: misc symbols, dingbats, arrows-and-stars block, emoji planes.
        0x2600..=0x27bf | 0x2b00..=0x2bff | 0x1f000..=0x1faff => Class::Emoji,
        0x3030 | 0x303d | 0x3297 | 0x3299 => Class::Emoji,
        // Arrows, math, technical, box drawing, shapes, private use, math letters.
        0x2190..=0x25ff | 0x27c0..=0x2aff | 0x2e00..=0x2e7f => Class::Symbol,
        0xe000..=0xf8ff | 0xf0000..=0x10ffff | 0x1d400..=0x1d7ff | 0xfff0..=0xffff => Class::Symbol,
        // Everything else is a script an English voice cannot read (CJK, Cyrillic,
        // Greek, Arabic, Hebrew, Devanagari, ...), including its punctuation.
        _ => Class::Script,
    }
}

fn is_alnum(c: Option<char>) -> bool {
    c.is_some_and(char::is_alphanumeric)
}

/// Step 2: per-character cleaning and counting.
fn clean_chars(text: &str, language: Language, skipped: &mut Skipped) -> String {
    let text = text.replace("``", "\u{201c}").replace("''", "\u{201d}");
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    let mut prev: Option<char> = None;
    while let Some(c) = chars.next() {
        let next = chars.peek().copied();
        match classify(c) {
            Class::Space => out.push(' '),
            Class::Drop => {}
            Class::Emoji => {
                skipped.emoji += 1;
                out.push(' ');
            }
            Class::Script if language.reads(c) => out.push(c),
            Class::Script => {
                skipped.script += 1;
                skipped.script_example.get_or_insert(c);
                out.push(' ');
            }
            Class::Symbol => {
                skipped.symbol += 1;
                skipped.symbol_example.get_or_insert(c);
                out.push(' ');
            }
            Class::Keep => match c {
                '`' => out.push('\u{2018}'),
                '*' => {}
                '_' if is_alnum(prev) && is_alnum(next) => out.push(' '),
                '_' => {}
                '\u{2e3a}' | '\u{2e3b}' | '\u{2015}' => out.push('\u{2014}'),
                '\u{fb00}' => out.push_str("ff"),
                '\u{fb01}' => out.push_str("fi"),
                '\u{fb02}' => out.push_str("fl"),
                '\u{fb03}' => out.push_str("ffi"),
                '\u{fb04}' => out.push_str("ffl"),
                '\u{fb05}' | '\u{fb06}' => out.push_str("st"),
                '\u{ff01}'..='\u{ff5e}' => {
                    // Full-width ASCII sits exactly 0xfee0 above ASCII.
                    let ascii = char::from_u32(u32::from(c) - 0xfee0).unwrap_or(' ');
                    out.push(ascii);
                }
                // An apostrophe inside a word is an apostrophe, whichever glyph.
                '\u{2019}' if is_alnum(prev) && is_alnum(next) => out.push('\''),
                _ => out.push(c),
            },
        }
        prev = Some(c);
    }
    out
}

fn is_closing_quote(c: char) -> bool {
    matches!(
        c,
        '\'' | '"' | '\u{2019}' | '\u{201d}' | '\u{bb}' | '\u{203a}' | ')' | ']'
    )
}

fn is_terminal(c: char) -> bool {
    matches!(c, '.' | '!' | '?' | '\u{2026}' | ',' | ';' | ':')
}

/// Step 3: ellipses and dashes.
fn fix_dashes(text: &str, language: Language) -> String {
    let text = text.replace(". . .", "\u{2026}").replace("...", "\u{2026}");
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let prev = i.checked_sub(1).and_then(|p| chars.get(p)).copied();
        let spaced_before = prev.is_none_or(char::is_whitespace);
        // Length of a pause dash starting at i, if any.
        let dash_len = match c {
            '\u{2014}' => 1,
            '-' => {
                let run = chars[i..].iter().take_while(|&&d| d == '-').count();
                let spaced_after = chars.get(i + run).is_none_or(|n| n.is_whitespace());
                // "5 - 3" is arithmetic, not a pause.
                let before = chars[..i].iter().rev().find(|c| !c.is_whitespace());
                let after = chars[i + run..].iter().find(|c| !c.is_whitespace());
                let digits = before.is_some_and(char::is_ascii_digit)
                    && after.is_some_and(char::is_ascii_digit);
                if run >= 2 || (run == 1 && spaced_before && spaced_after && !digits) {
                    run
                } else {
                    0
                }
            }
            '\u{2013}' => {
                let next = chars.get(i + 1).copied();
                if prev.is_some_and(|p| p.is_ascii_digit())
                    && next.is_some_and(|n| n.is_ascii_digit())
                {
                    // A range: "to" in English; other languages' voices read the dash.
                    out.push_str(if language.is_english() {
                        " to "
                    } else {
                        "\u{2013}"
                    });
                    i += 1;
                    continue;
                }
                if spaced_before || next.is_none_or(char::is_whitespace) {
                    1
                } else {
                    out.push('-');
                    i += 1;
                    continue;
                }
            }
            _ => 0,
        };
        if dash_len == 0 {
            out.push(c);
            i += 1;
            continue;
        }
        i += dash_len;
        // Look past spaces to see what the dash leads into.
        let mut j = i;
        while chars.get(j).is_some_and(|c| c.is_whitespace()) {
            j += 1;
        }
        let next = chars.get(j).copied();
        let trimmed_len = out.trim_end().len();
        out.truncate(trimmed_len);
        let last = out.chars().last();
        let cut_off = next.is_none_or(|n| is_closing_quote(n) || is_terminal(n));
        match last {
            None => {}
            Some(l) if is_terminal(l) || matches!(l, '(' | '[' | '\u{2018}' | '\u{201c}') => {}
            Some(_) if cut_off && next.is_none_or(is_closing_quote) => out.push('\u{2026}'),
            Some(_) if cut_off => {}
            Some(_) => out.push(','),
        }
        let after_opener = out
            .chars()
            .last()
            .is_some_and(|l| matches!(l, '(' | '[' | '\u{2018}' | '\u{201c}' | '"'));
        if !cut_off && !out.is_empty() && !after_opener {
            out.push(' ');
        }
        i = j;
    }
    out
}

/// Abbreviations whose period must not end a sentence, with their spoken form.
/// `keep_end`: the abbreviation may close a sentence, so its period is kept when
/// a new sentence follows.
struct Abbrev {
    written: &'static str,
    spoken: &'static str,
    keep_end: bool,
}

const ABBREVIATIONS: &[Abbrev] = &[
    Abbrev {
        written: "Mrs.",
        spoken: "Missus",
        keep_end: false,
    },
    Abbrev {
        written: "Mr.",
        spoken: "Mister",
        keep_end: false,
    },
    Abbrev {
        written: "Ms.",
        spoken: "Miz",
        keep_end: false,
    },
    Abbrev {
        written: "Dr.",
        spoken: "Doctor",
        keep_end: false,
    },
    Abbrev {
        written: "Prof.",
        spoken: "Professor",
        keep_end: false,
    },
    Abbrev {
        written: "Capt.",
        spoken: "Captain",
        keep_end: false,
    },
    Abbrev {
        written: "Lt.",
        spoken: "Lieutenant",
        keep_end: false,
    },
    Abbrev {
        written: "Col.",
        spoken: "Colonel",
        keep_end: false,
    },
    Abbrev {
        written: "Sgt.",
        spoken: "Sergeant",
        keep_end: false,
    },
    Abbrev {
        written: "Rev.",
        spoken: "Reverend",
        keep_end: false,
    },
    Abbrev {
        written: "Mt.",
        spoken: "Mount",
        keep_end: false,
    },
    Abbrev {
        written: "Jr.",
        spoken: "Junior",
        keep_end: true,
    },
    Abbrev {
        written: "Sr.",
        spoken: "Senior",
        keep_end: true,
    },
    Abbrev {
        written: "e.g.",
        spoken: "for example",
        keep_end: false,
    },
    Abbrev {
        written: "E.g.",
        spoken: "For example",
        keep_end: false,
    },
    Abbrev {
        written: "i.e.",
        spoken: "that is",
        keep_end: false,
    },
    Abbrev {
        written: "I.e.",
        spoken: "That is",
        keep_end: false,
    },
    Abbrev {
        written: "etc.",
        spoken: "et cetera",
        keep_end: true,
    },
    Abbrev {
        written: "Etc.",
        spoken: "Et cetera",
        keep_end: true,
    },
    Abbrev {
        written: "&c.",
        spoken: "et cetera",
        keep_end: true,
    },
    Abbrev {
        written: "vs.",
        spoken: "versus",
        keep_end: false,
    },
    Abbrev {
        written: "approx.",
        spoken: "approximately",
        keep_end: false,
    },
];

/// Titles also written without a period in British style ("Mr Smith").
const BARE_TITLES: &[(&str, &str)] = &[
    ("Mrs", "Missus"),
    ("Mr", "Mister"),
    ("Ms", "Miz"),
    ("Dr", "Doctor"),
    ("vs", "versus"),
];

/// Scanner over a char slice for the expansion step.
struct Scan<'a> {
    chars: &'a [char],
}

impl Scan<'_> {
    fn at(&self, i: usize) -> Option<char> {
        self.chars.get(i).copied()
    }

    fn starts_with(&self, i: usize, pat: &str) -> bool {
        (i..).zip(pat.chars()).all(|(k, p)| self.at(k) == Some(p))
    }

    fn skip_spaces(&self, mut i: usize) -> usize {
        while self.at(i) == Some(' ') {
            i += 1;
        }
        i
    }

    /// A number at i: digits with optional thousands commas and a decimal part.
    /// Returns (end, integer part, fraction digits).
    fn number(&self, i: usize) -> Option<(usize, String, Option<String>)> {
        if !self.at(i).is_some_and(|c| c.is_ascii_digit()) {
            return None;
        }
        let mut k = i;
        let mut int = String::new();
        while let Some(c) = self.at(k) {
            let grouping = c == ',' && self.at(k + 1).is_some_and(|d| d.is_ascii_digit());
            if !(c.is_ascii_digit() || grouping) {
                break;
            }
            int.push(c);
            k += 1;
        }
        let mut frac = None;
        if self.at(k) == Some('.') && self.at(k + 1).is_some_and(|d| d.is_ascii_digit()) {
            let mut f = String::new();
            k += 1;
            while let Some(c) = self.at(k).filter(char::is_ascii_digit) {
                f.push(c);
                k += 1;
            }
            frac = Some(f);
        }
        Some((k, int, frac))
    }

    /// Is a sentence starting after position i (spaces, then upper case or an
    /// opening quote, or the end of the text)?
    fn new_sentence_after(&self, i: usize) -> bool {
        let j = self.skip_spaces(i);
        match self.at(j) {
            None => true,
            Some(c) => j > i && (c.is_uppercase() || matches!(c, '"' | '\u{201c}' | '\u{2018}')),
        }
    }

    /// "am"/"pm" in any of its spellings at i: returns (end, "a m"/"p m", had dots).
    fn meridiem(&self, i: usize) -> Option<(usize, &'static str, bool)> {
        let first = self.at(i)?.to_ascii_lowercase();
        let spoken = match first {
            'a' => "a m",
            'p' => "p m",
            _ => return None,
        };
        let m = |k: usize| self.at(k).is_some_and(|c| c.eq_ignore_ascii_case(&'m'));
        let (end, dotted) = if m(i + 1) {
            (i + 2, false)
        } else if self.at(i + 1) == Some('.') && m(i + 2) && self.at(i + 3) == Some('.') {
            (i + 4, true)
        } else {
            return None;
        };
        if is_alnum(self.at(end)) {
            return None;
        }
        Some((end, spoken, dotted))
    }
}

fn currency_words(sign: char) -> Option<(&'static str, &'static str, &'static str, &'static str)> {
    match sign {
        '$' => Some(("dollar", "dollars", "cent", "cents")),
        '\u{a3}' => Some(("pound", "pounds", "penny", "pence")),
        '\u{20ac}' => Some(("euro", "euros", "cent", "cents")),
        '\u{a5}' => Some(("yen", "yen", "sen", "sen")),
        _ => None,
    }
}

const SCALES: &[&str] = &["thousand", "million", "billion", "trillion"];

/// Step 4: expansions for the phonemizer.
fn expand(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let s = Scan { chars: &chars };
    let mut out = String::with_capacity(text.len() + 16);
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let prev = i.checked_sub(1).and_then(|p| s.at(p));
        let word_start = !is_alnum(prev);

        // Currency: $5, $3.50, £2.01, €10 million.
        if let Some(words) = currency_words(c)
            && let Some((end, int, frac)) = s.number(i + 1)
        {
            let (end, spoken) = speak_money(&s, end, &int, frac.as_deref(), words);
            out.push_str(&spoken);
            i = end;
            continue;
        }

        if c.is_ascii_digit() && word_start {
            if let Some((end, spoken)) = speak_number_phrase(&s, i) {
                out.push_str(&spoken);
                i = end;
                continue;
            }
            // Copy a plain number whole, so its digits are not re-examined.
            let end = s.number(i).map_or(i + 1, |(e, _, _)| e);
            out.extend(&chars[i..end]);
            i = end;
            continue;
        }

        if c == '&' && !s.starts_with(i, "&c.") {
            out.push_str(" and ");
            i += 1;
            continue;
        }

        if word_start
            && (c.is_alphabetic() || c == '&')
            && let Some((end, spoken)) = speak_abbreviation(&s, i)
        {
            out.push_str(&spoken);
            i = end;
            continue;
        }

        out.push(c);
        i += 1;
    }
    out
}

fn speak_money(
    s: &Scan<'_>,
    end: usize,
    int: &str,
    frac: Option<&str>,
    (unit, units, sub, subs): (&str, &str, &str, &str),
) -> (usize, String) {
    // "$2 million" / "$1.5 billion": the unit goes after the scale word.
    let after = s.skip_spaces(end);
    for scale in SCALES {
        if s.starts_with(after, scale) && !is_alnum(s.at(after + scale.len())) {
            let num = match frac {
                Some(f) => format!("{int}.{f}"),
                None => int.to_owned(),
            };
            return (after + scale.len(), format!("{num} {scale} {units}"));
        }
    }
    let plural = |n: &str, one: &str, many: &str| -> String {
        let word = if n == "1" { one } else { many };
        format!("{n} {word}")
    };
    let spoken = match frac {
        Some(f) if f.len() == 2 => {
            let cents = f.trim_start_matches('0');
            let whole_zero = int.trim_start_matches('0').is_empty();
            match (whole_zero, cents.is_empty()) {
                (true, true) => plural("0", unit, units),
                (true, false) => plural(cents, sub, subs),
                (false, true) => plural(int, unit, units),
                (false, false) => {
                    format!("{} {}", plural(int, unit, units), plural(cents, sub, subs))
                }
            }
        }
        Some(f) => format!("{int}.{f} {units}"),
        None => plural(int, unit, units),
    };
    (end, spoken)
}

/// Percentages and clock times starting at a digit.
fn speak_number_phrase(s: &Scan<'_>, i: usize) -> Option<(usize, String)> {
    let (end, int, frac) = s.number(i)?;
    let num = match &frac {
        Some(f) => format!("{int}.{f}"),
        None => int.clone(),
    };
    // 10% / 3.5 %
    let after = s.skip_spaces(end);
    if s.at(after) == Some('%') {
        return Some((after + 1, format!("{num} percent")));
    }
    // 3:45, 10:00 pm, 7:05 a.m.
    if frac.is_none()
        && int.len() <= 2
        && !int.contains(',')
        && s.at(end) == Some(':')
        && s.at(end + 1).is_some_and(|c| c.is_ascii_digit())
        && s.at(end + 2).is_some_and(|c| c.is_ascii_digit())
        && !s
            .at(end + 3)
            .is_some_and(|c| c.is_ascii_digit() || c == ':')
    {
        let hour: u32 = int.parse().ok()?;
        let minutes: String = [s.at(end + 1)?, s.at(end + 2)?].iter().collect();
        let min: u32 = minutes.parse().ok()?;
        if hour > 24 || min > 59 {
            return None;
        }
        let mut k = end + 3;
        let mer = s.meridiem(s.skip_spaces(k));
        let mut spoken = hour.to_string();
        match (min, mer.is_some()) {
            (0, true) => {}
            (0, false) => spoken.push_str(" o'clock"),
            (1..=9, _) => spoken.push_str(&format!(" oh {min}")),
            _ => spoken.push_str(&format!(" {min}")),
        }
        if let Some((mend, word, dotted)) = mer {
            spoken.push(' ');
            spoken.push_str(word);
            k = mend;
            if dotted && s.new_sentence_after(k) {
                spoken.push('.');
            }
        }
        return Some((k, spoken));
    }
    // 9pm / 9 p.m.
    if frac.is_none() && int.len() <= 2 {
        let (mend, word, dotted) = s.meridiem(after)?;
        let mut spoken = format!("{int} {word}");
        if dotted && s.new_sentence_after(mend) {
            spoken.push('.');
        }
        return Some((mend, spoken));
    }
    None
}

fn speak_abbreviation(s: &Scan<'_>, i: usize) -> Option<(usize, String)> {
    // "St." is Saint before a name, Street after one ("Baker St.").
    if s.starts_with(i, "St.") {
        let end = i + 3;
        let prev_word_capital =
            previous_word(s, i).is_some_and(|w| w.starts_with(char::is_uppercase));
        let next = s.at(s.skip_spaces(end));
        if next.is_some_and(char::is_uppercase) && !prev_word_capital {
            return Some((end, "Saint".to_owned()));
        }
        let mut spoken = "Street".to_owned();
        if s.new_sentence_after(end) {
            spoken.push('.');
        }
        return Some((end, spoken));
    }
    // "No. 5" → "number 5".
    if s.starts_with(i, "No.")
        && s.at(s.skip_spaces(i + 3))
            .is_some_and(|c| c.is_ascii_digit())
    {
        return Some((i + 3, "number".to_owned()));
    }
    for a in ABBREVIATIONS {
        if s.starts_with(i, a.written) {
            let end = i + a.written.chars().count();
            if is_alnum(s.at(end)) {
                continue;
            }
            let mut spoken = a.spoken.to_owned();
            if a.keep_end && s.new_sentence_after(end) {
                spoken.push('.');
            }
            return Some((end, spoken));
        }
    }
    for (written, spoken) in BARE_TITLES {
        if s.starts_with(i, written) {
            let end = i + written.len();
            let next = s.at(end + 1);
            if s.at(end) == Some(' ')
                && next.is_some_and(|c| c.is_uppercase() || (*written == "vs"))
            {
                return Some((end, (*spoken).to_owned()));
            }
        }
    }
    None
}

/// The word before position i (skipping spaces), if any.
fn previous_word(s: &Scan<'_>, i: usize) -> Option<String> {
    let mut k = i;
    while k > 0 && s.at(k - 1) == Some(' ') {
        k -= 1;
    }
    let end = k;
    while k > 0 && is_alnum(s.at(k - 1)) {
        k -= 1;
    }
    (k < end).then(|| s.chars[k..end].iter().collect())
}

/// Step 5: collapse whitespace, drop spaces before punctuation and doubled commas.
fn tidy(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let chars: Vec<char> = text
        .split_whitespace()
        .flat_map(|w| w.chars().chain([' ']))
        .collect();
    for (i, &c) in chars.iter().enumerate() {
        let next = chars.get(i + 1).copied();
        if c == ' ' {
            let punct_follows = next
                .is_some_and(|n| matches!(n, ',' | ';' | ':' | '.' | '!' | '?'))
                && chars
                    .get(i + 2)
                    .is_none_or(|a| *a == ' ' || is_closing_quote(*a));
            if punct_follows || next.is_none() || out.is_empty() {
                continue;
            }
        }
        if c == ',' {
            // A comma before other punctuation (or at the start) adds nothing.
            let mut k = i + 1;
            while chars.get(k) == Some(&' ') {
                k += 1;
            }
            let next_real = chars.get(k).copied();
            if out.trim().is_empty() || next_real.is_none_or(is_terminal) {
                continue;
            }
        }
        if out.is_empty() && matches!(c, ';' | ':') {
            continue;
        }
        out.push(c);
    }
    let trimmed = out.trim_end().len();
    out.truncate(trimmed);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(s: &str) -> String {
        normalize_text(s)
    }

    #[test]
    fn nfc_whitespace_and_controls() {
        assert_eq!(n("cafe\u{301}  au\tlait\u{7}\u{200b}"), "caf\u{e9} au lait");
        assert_eq!(n("  na\u{ef}ve\r\n line "), "na\u{ef}ve line");
        assert_eq!(n("a\u{a0}b\u{3000}c"), "a b c");
    }

    #[test]
    fn emphasis_markers_removed() {
        assert_eq!(
            n("It was _very_ *odd* and **bold**."),
            "It was very odd and bold."
        );
        assert_eq!(n("snake_case"), "snake case");
    }

    #[test]
    fn quotes_kept_and_backticks_curled() {
        assert_eq!(
            n("\u{201c}Hi,\u{201d} she said."),
            "\u{201c}Hi,\u{201d} she said."
        );
        assert_eq!(n("`Oh dear!' said Alice"), "\u{2018}Oh dear!' said Alice");
        assert_eq!(n("don\u{2019}t"), "don't");
    }

    #[test]
    fn dashes_become_pauses() {
        assert_eq!(n("the end\u{2014}or so"), "the end, or so");
        assert_eq!(n("the end \u{2014} or so"), "the end, or so");
        assert_eq!(n("farm-yard--while"), "farm-yard, while");
        assert_eq!(n("I was going to\u{2014}'"), "I was going to\u{2026}'");
        assert_eq!(n("well,\u{2014}perhaps"), "well, perhaps");
        assert_eq!(n("pages 10\u{2013}20"), "pages 10 to 20");
        assert_eq!(n("wait - what"), "wait, what");
        assert_eq!(n("5 - 3"), "5 - 3");
        assert_eq!(n("`--yes, it is"), "\u{2018}yes, it is");
    }

    #[test]
    fn currency() {
        assert_eq!(n("$5"), "5 dollars");
        assert_eq!(n("$1 bill"), "1 dollar bill");
        assert_eq!(n("$3.50"), "3 dollars 50 cents");
        assert_eq!(n("$0.99"), "99 cents");
        assert_eq!(n("$1.01"), "1 dollar 1 cent");
        assert_eq!(n("\u{a3}2.05"), "2 pounds 5 pence");
        assert_eq!(n("\u{20ac}10 each"), "10 euros each");
        assert_eq!(n("$2 million"), "2 million dollars");
        assert_eq!(n("$1,200"), "1,200 dollars");
        assert_eq!(n("costs $4."), "costs 4 dollars.");
    }

    #[test]
    fn percent_and_ampersand() {
        assert_eq!(n("10% off"), "10 percent off");
        assert_eq!(n("3.5 % more"), "3.5 percent more");
        assert_eq!(n("Tom & Jerry"), "Tom and Jerry");
    }

    #[test]
    fn times() {
        assert_eq!(n("at 3:45 pm"), "at 3 45 p m");
        assert_eq!(n("at 10:00"), "at 10 o'clock");
        assert_eq!(n("at 7:05 a.m. sharp"), "at 7 oh 5 a m sharp");
        assert_eq!(n("at 3:00 PM"), "at 3 p m");
        assert_eq!(n("by 9pm"), "by 9 p m");
        assert_eq!(n("left at 6 p.m. Then"), "left at 6 p m. Then");
        assert_eq!(n("ratio 12:345"), "ratio 12:345");
    }

    #[test]
    fn ordinals_years_and_plain_numbers_untouched() {
        assert_eq!(
            n("the 1st, 2nd, 3rd and 21st of May 1865"),
            "the 1st, 2nd, 3rd and 21st of May 1865"
        );
        assert_eq!(n("pi is 3.14159"), "pi is 3.14159");
    }

    #[test]
    fn abbreviations_expanded() {
        assert_eq!(
            n("Mr. and Mrs. Smith met Dr. Jones"),
            "Mister and Missus Smith met Doctor Jones"
        );
        assert_eq!(
            n("fruit, e.g. apples, i.e. food"),
            "fruit, for example apples, that is food"
        );
        assert_eq!(
            n("cats, dogs, etc. are pets"),
            "cats, dogs, et cetera are pets"
        );
        assert_eq!(n("cats, dogs, etc. Then"), "cats, dogs, et cetera. Then");
        assert_eq!(n("Kramer vs. Kramer"), "Kramer versus Kramer");
        assert_eq!(
            n("visit St. Paul's on Baker St. Later"),
            "visit Saint Paul's on Baker Street. Later"
        );
        assert_eq!(n("Mr Darcy"), "Mister Darcy");
        assert_eq!(n("No. 5 and No one"), "number 5 and No one");
        assert_eq!(n("Mrsomething"), "Mrsomething");
    }

    #[test]
    fn lone_i_and_roman_in_prose_untouched() {
        assert_eq!(
            n("I think CHAPTER IV is long"),
            "I think CHAPTER IV is long"
        );
    }

    #[test]
    fn unspeakable_removed_and_counted() {
        let mut sk = Skipped::default();
        let out = normalize(
            "I love \u{1f355} pizza \u{1f44d}\u{1f3fd}! \u{6f22}\u{5b57} caf\u{e9} \u{2192} on",
            Language::ENGLISH,
            &mut sk,
        );
        assert_eq!(out, "I love pizza! caf\u{e9} on");
        assert_eq!(sk.emoji, 2);
        assert_eq!(sk.script, 2);
        assert_eq!(sk.symbol, 1);
        let w = sk.warnings();
        assert_eq!(w.len(), 3);
        assert_eq!(w[0], "skipped 2 emoji/pictographs");
        assert!(w[1].contains("\"\u{6f22}\""), "{w:?}");
    }

    fn in_language(s: &str, tag: &str) -> (String, Vec<String>) {
        let mut skipped = Skipped::default();
        let out = normalize(s, Language::of(tag), &mut skipped);
        (out, skipped.warnings())
    }

    #[test]
    fn english_rules_for_english_voices_only() {
        let text = "Mr. Weber paid $3.50 at 3:45 pm, pages 4\u{2013}6 & 10%.";
        let (en, _) = in_language(text, "en_US");
        assert_eq!(en, n(text));
        assert!(
            en.contains("Mister") && en.contains("dollars") && en.contains(" to "),
            "{en}"
        );
        let (de, warnings) = in_language(text, "de_DE");
        assert_eq!(
            de,
            "Mr. Weber paid $3.50 at 3:45 pm, pages 4\u{2013}6 & 10%."
        );
        assert!(warnings.is_empty(), "{warnings:?}");
        assert_eq!(Language::of("de-de").code(), "other");
        assert!(Language::of("").is_english() && Language::of("en-gb").is_english());
    }

    #[test]
    fn scripts_are_kept_for_the_languages_written_in_them() {
        let text = "Москва and \u{0391}θήνα, 東京へ.";
        // English: both foreign scripts removed, one warning.
        let (en, w) = in_language(text, "en");
        assert_eq!(en, "and.");
        assert_eq!(w.len(), 1, "{w:?}");
        // Russian: Cyrillic stays, Greek and Japanese go.
        let (ru, w) = in_language(text, "ru_RU");
        assert!(ru.starts_with("Москва and"), "{ru}");
        assert!(!ru.contains('θ') && !ru.contains('東'), "{ru}");
        assert!(w[0].contains("does not use"), "{w:?}");
        // Greek and Japanese voices keep their own.
        assert!(in_language(text, "el").0.contains("Αθήνα"));
        let (ja, _) = in_language(text, "ja");
        assert!(ja.contains("東京へ"), "{ja}");
        assert!(!ja.contains("Москва"), "{ja}");
    }

    #[test]
    fn ligatures_and_fullwidth() {
        assert_eq!(n("\u{fb01}ne \u{ff21}\u{ff22}"), "fine AB");
    }
}
