//! Pronunciation lexicons: how to say the words the voice gets wrong.
//!
//! A lexicon is a UTF-8 text file, one entry per line, `#` starts a comment line:
//!
//! ```text
//! # word (or several words) = what to say instead
//! Cheshire = Chesh-er
//! Hermione = her-my-oh-nee
//! # phonemes, in the voice's IPA, inside [[ ]] (as Piper reads them)
//! Nguyen = [[ŋwˈiən]]
//! # a regular expression between slashes (Rust regex syntax)
//! /\bch\.\s*(\d+)/ = chapter $1
//! ```
//!
//! Rules:
//! - A word entry matches whole words only (`Cheshire` does not match `Cheshires`), in
//!   any case (`cheshire`, `CHESHIRE`); inner spaces match any run of spaces.
//! - A regex entry (`/…/`) is case-sensitive unless it says `(?i)`; `$1`… in the
//!   replacement are its groups.
//! - Entries apply in file order to each sentence **after** normalization (so `Mr.` is
//!   already `Mister`, numbers are words), just before phonemization. Text an earlier
//!   entry produced inside `[[ ]]` is never matched again.
//! - Several lexicons (the book's, then `--lexicon` files) are one list, in that order.
//! - No entry may make a sentence longer than twice the sentence cap (800 characters by
//!   default): a rule that feeds on its own output (`/(a+)/ = $1$1`) is an error naming
//!   its file and line, not a book that grows without end.
//!
//! The replacement goes into the segment text itself, so a distributed job carries it
//! in its messages and every worker says the same.

use std::path::Path;

use regex::Regex;

/// One entry.
#[derive(Debug, Clone)]
struct Entry {
    pattern: Regex,
    replacement: String,
    /// Where it was written, for errors.
    file: String,
    line: usize,
}

/// Entries in order, with their source text (stored with a job).
#[derive(Debug, Clone, Default)]
pub struct Lexicon {
    entries: Vec<Entry>,
    source: String,
}

/// A lexicon line that cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("lexicon {file}, line {line}: {reason}")]
pub struct LexiconError {
    /// The file (or `<flag>`).
    pub file: String,
    /// 1-based line.
    pub line: usize,
    /// What is wrong and what to do.
    pub reason: String,
}

/// The most memory one lexicon file's patterns may take once compiled, together: 40
/// lines of `/\w{100}/` took 230 MB before this bound (each Unicode `\w` repeated is a
/// large automaton); a word entry takes about 22 KB, so this allows some 3,000 of them.
pub(crate) const MAX_COMPILED_BYTES: usize = 64 << 20;

/// The heap a compiled `pattern` holds (as the regex crate builds it).
fn compiled_bytes(pattern: &str) -> usize {
    regex_automata::meta::Regex::new(pattern).map_or(0, |r| r.memory_usage())
}

impl Lexicon {
    /// Parses lexicon text; `file` names it in errors. Its patterns may take at most
    /// [`MAX_COMPILED_BYTES`] once compiled.
    pub fn parse(text: &str, file: &str) -> Result<Lexicon, LexiconError> {
        let mut entries = Vec::new();
        let mut compiled = 0usize;
        for (i, raw) in text.lines().enumerate() {
            let line = raw.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let err = |reason: String| LexiconError {
                file: file.to_owned(),
                line: i + 1,
                reason,
            };
            let (pattern, replacement) = split_entry(line).ok_or_else(|| {
                err("expected `WORD = REPLACEMENT` or `/REGEX/ = REPLACEMENT`".into())
            })?;
            let replacement = replacement.trim();
            if replacement.is_empty() {
                return Err(err(
                    "the replacement is empty; say what to pronounce, or remove the line".into(),
                ));
            }
            if replacement.contains("[[") != replacement.contains("]]") {
                return Err(err(
                    "phonemes go inside [[ and ]]; one of the two is missing".into(),
                ));
            }
            let (source, what) = if let Some(re) =
                pattern.strip_prefix('/').and_then(|p| p.strip_suffix('/'))
            {
                (re.to_owned(), "invalid regular expression")
            } else {
                let words: Vec<String> = pattern.split_whitespace().map(regex::escape).collect();
                if words.is_empty() {
                    return Err(err("the word to replace is empty".into()));
                }
                (
                    format!(r"(?i)\b{}\b", words.join(r"\s+")),
                    "cannot match this word",
                )
            };
            let pattern = Regex::new(&source).map_err(|e| err(format!("{what}: {e}")))?;
            compiled = compiled.saturating_add(compiled_bytes(&source));
            if compiled > MAX_COMPILED_BYTES {
                return Err(err(format!(
                    "the patterns up to this line take more than {} MiB once compiled; use \
                     fewer or narrower patterns (`\\w` and `.` match letters of every script: \
                     `[a-z]` is far smaller), or split the lexicon between books",
                    MAX_COMPILED_BYTES >> 20
                )));
            }
            entries.push(Entry {
                pattern,
                replacement: replacement.to_owned(),
                file: file.to_owned(),
                line: i + 1,
            });
        }
        Ok(Lexicon {
            entries,
            source: text.to_owned(),
        })
    }

    /// Reads and parses a lexicon file.
    pub fn load(path: &Path) -> Result<Lexicon, LexiconError> {
        let text = std::fs::read_to_string(path).map_err(|e| LexiconError {
            file: path.display().to_string(),
            line: 0,
            reason: format!(
                "cannot be read ({}); check the path, and that it is UTF-8 text",
                e.kind()
            ),
        })?;
        Lexicon::parse(&text, &path.display().to_string())
    }

    /// This lexicon's entries followed by `later`'s.
    pub fn then(mut self, later: Lexicon) -> Lexicon {
        self.entries.extend(later.entries);
        if !later.source.is_empty() {
            if !self.source.is_empty() && !self.source.ends_with('\n') {
                self.source.push('\n');
            }
            self.source.push_str(&later.source);
        }
        self
    }

    /// No entries.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// The text the entries came from (all files, in order).
    pub fn source(&self) -> &str {
        &self.source
    }

    /// `sentence` with every entry applied in order, `[[ ]]` blocks left alone; an entry
    /// that makes it longer than `limit` characters (or than it was, if it was longer) is
    /// an error naming the entry.
    pub fn apply(&self, sentence: &str, limit: usize) -> Result<String, LexiconError> {
        let limit = limit.max(sentence.chars().count());
        // Past this many bytes the text has more than `limit` characters (4 bytes at most
        // each): an entry stops there, so one whose replacement names its match a million
        // times costs no more memory than the limit allows, not the million copies.
        let budget = limit.saturating_mul(4);
        let mut text = sentence.to_owned();
        for e in &self.entries {
            if !e.pattern.is_match(&text) {
                continue;
            }
            let (grown, whole) =
                outside_phonemes(&text, |part, out| e.replace_into(part, out, budget));
            let chars = grown.chars().count();
            if !whole || chars > limit {
                let start: String = sentence.chars().take(40).collect();
                let at_least = if whole { "" } else { "at least " };
                return Err(LexiconError {
                    file: e.file.clone(),
                    line: e.line,
                    reason: format!(
                        "this entry makes the sentence \"{start}…\" {at_least}{chars} characters \
                         long, over the {limit} a sentence may grow to; make its replacement \
                         shorter or its pattern narrower (does it match its own output?)"
                    ),
                });
            }
            text = grown;
        }
        Ok(text)
    }
}

impl Entry {
    /// Appends `part` with every match replaced to `out`, as `Regex::replace_all` does (the
    /// same expansion of `$1`, `${name}`, `$$`), but stops, returning `false`, as soon as
    /// `out` would hold more than `budget` bytes.
    fn replace_into(&self, part: &str, out: &mut String, budget: usize) -> bool {
        let mut last = 0;
        let mut over = false;
        for caps in self.pattern.captures_iter(part) {
            let Some(m) = caps.get(0) else { continue };
            out.push_str(&part[last..m.start()]);
            regex_automata::util::interpolate::string(
                &self.replacement,
                |index, dst| {
                    if let Some(group) = caps.get(index) {
                        if dst.len() + group.len() > budget {
                            over = true;
                        } else {
                            dst.push_str(group.as_str());
                        }
                    }
                },
                |name| self.pattern.capture_names().position(|n| n == Some(name)),
                out,
            );
            last = m.end();
            if over || out.len() > budget {
                return false;
            }
        }
        out.push_str(&part[last..]);
        out.len() <= budget
    }
}

/// `WORD = REPLACEMENT` at the first ` = ` outside a regex, or `/REGEX/ = REPLACEMENT`.
fn split_entry(line: &str) -> Option<(&str, &str)> {
    if line.starts_with('/') {
        // The regex ends at the last `/` before a `=`.
        let eq = line.rfind('=')?;
        let (pat, rest) = line.split_at(eq);
        let pat = pat.trim();
        return (pat.len() >= 2 && pat.ends_with('/')).then(|| (pat, &rest[1..]));
    }
    let (word, replacement) = line.split_once('=')?;
    Some((word.trim(), replacement))
}

/// `text` again, `f` appending each part outside `[[ … ]]` (the blocks are copied as
/// they are); `false` with what was built so far as soon as `f` returns `false`.
fn outside_phonemes(text: &str, mut f: impl FnMut(&str, &mut String) -> bool) -> (String, bool) {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("[[") {
        if !f(&rest[..start], &mut out) {
            return (out, false);
        }
        match rest[start..].find("]]") {
            Some(end) => {
                out.push_str(&rest[start..start + end + 2]);
                rest = &rest[start + end + 2..];
            }
            None => {
                out.push_str(&rest[start..]);
                rest = "";
            }
        }
    }
    let whole = f(rest, &mut out);
    (out, whole)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lex(text: &str) -> Lexicon {
        Lexicon::parse(text, "test").expect("lexicon")
    }

    #[test]
    fn words_match_whole_words_in_any_case() {
        let l = lex("# names\nCheshire = Chesh-er\n\nNew York = Noo York\n");
        assert_eq!(l.len(), 2);
        assert_eq!(
            l.apply("The Cheshire cat, CHESHIRE, cheshire; not Cheshires.", 800)
                .expect("applies"),
            "The Chesh-er cat, Chesh-er, Chesh-er; not Cheshires."
        );
        assert_eq!(
            l.apply("In New  York.", 800).expect("applies"),
            "In Noo York."
        );
    }

    #[test]
    fn regexes_are_case_sensitive_and_take_groups() {
        let l = lex(r"/\bch (\d+)/ = chapter $1");
        assert_eq!(
            l.apply("see ch 4, Ch 5", 800).expect("applies"),
            "see chapter 4, Ch 5"
        );
    }

    #[test]
    fn phonemes_are_not_matched_again() {
        let l = lex("Nguyen = [[ŋwˈiən]]\nwˈiən = nope\nn = en\n");
        assert_eq!(l.apply("Mr Nguyen", 800).expect("applies"), "Mr [[ŋwˈiən]]");
    }

    #[test]
    fn bad_lines_say_where_and_what() {
        let e =
            Lexicon::parse("ok = fine\nno equals sign here\n", "names.lexicon").expect_err("bad");
        assert_eq!(e.line, 2);
        assert!(
            e.to_string().starts_with("lexicon names.lexicon, line 2:"),
            "{e}"
        );
        let e = Lexicon::parse("/(unclosed/ = x", "l").expect_err("regex");
        assert!(e.reason.contains("invalid regular expression"), "{e}");
        let e = Lexicon::parse("word = [[abc", "l").expect_err("brackets");
        assert!(e.reason.contains("[["), "{e}");
        let e = Lexicon::parse("word =  ", "l").expect_err("empty");
        assert!(e.reason.contains("empty"), "{e}");
    }

    #[test]
    fn an_entry_that_feeds_on_its_own_output_is_stopped_and_named() {
        let l =
            lex("Cheshire = Chesh-er\n# doubles every run of a's\n/(a+)/ = $1$1\n/(a+)/ = $1$1\n")
                .then(Lexicon::parse("/(a+)/ = $1$1$1$1", "more.lexicon").expect("lexicon"));
        // Doubling twice makes 16 characters 31, within 40; quadrupling then passes it.
        let e = l.apply("a cat and a rat.", 40).expect_err("grows too long");
        assert_eq!((e.file.as_str(), e.line), ("more.lexicon", 1), "{e}");
        assert!(
            e.to_string().contains("91 characters long, over the 40"),
            "{e}"
        );
        // With room, each entry applies once, in order.
        assert_eq!(l.apply("a", 800).expect("fits"), "aaaaaaaaaaaaaaaa");
        // A sentence already longer than the limit may keep its length.
        assert_eq!(
            lex("x = y").apply("xxxx x", 3).expect("same length"),
            "xxxx y"
        );
    }

    #[test]
    fn patterns_that_compile_to_too_much_memory_are_refused_by_line() {
        // Each `\w{100}` compiles to megabytes: before the bound, 40 of them took 230 MB.
        let text: String = (0..40).map(|i| format!("/\\w{{100}}{i}/ = x\n")).collect();
        let e = Lexicon::parse(&text, "big.lexicon").expect_err("too many patterns");
        assert_eq!(e.file, "big.lexicon");
        assert!(e.line > 1 && e.line < 40, "line {}", e.line);
        assert!(
            e.reason.contains("more than 64 MiB once compiled"),
            "{}",
            e.reason
        );
        // Ordinary lexicons are far below it: a thousand words.
        let words: String = (0..1000)
            .map(|i| format!("name{i} = nayme {i}\n"))
            .collect();
        assert_eq!(
            Lexicon::parse(&words, "names.lexicon")
                .expect("words")
                .len(),
            1000
        );
    }

    #[test]
    fn an_entry_that_names_its_match_many_times_stops_at_the_limit() {
        // Found by the property `lexicon_amplification` (tests/properties.rs): each of 214
        // matches became 131,073 copies of itself, 28 million characters built in full
        // (84 MB) before the length was checked; a line of a million `$0` on a sentence of
        // 400 characters asked for 400 million.
        let l = lex(&format!("/./ = {}", "$0".repeat(131_073)));
        let e = l.apply(&"a".repeat(214), 0).expect_err("grows too long");
        assert!(
            e.reason.contains("at least") && e.reason.contains("over the 214"),
            "{e}"
        );
        // Within the limit it applies in full.
        assert_eq!(
            l.apply("a", 200_000).expect("fits").len(),
            131_073,
            "one match, 131,073 copies"
        );
    }

    #[test]
    fn replacements_expand_as_regex_does() {
        let sentence = "ab cd ef";
        for (pattern, replacement) in [
            (r"(\w)(\w)", "$2$1"),
            (r"(\w)(\w)", "${2}x$1"),
            (r"(\w)(\w)", "$1x"),
            (r"(?P<n>\w)\w", "[${n}]"),
            (r"(?P<n>\w)\w", "$n$$"),
            (r"(\w)", "$9-$"),
            (r"(\w)", "${1"),
            (r"\w*", "<$0>"),
        ] {
            let re = Regex::new(pattern).expect("regex");
            let expected = re.replace_all(sentence, replacement).into_owned();
            let l = lex(&format!("/{pattern}/ = {replacement}"));
            assert_eq!(
                l.apply(sentence, 800).expect("applies"),
                expected,
                "/{pattern}/ = {replacement}"
            );
        }
    }

    #[test]
    fn lexicons_chain_in_order() {
        let l = lex("a = b").then(lex("b = c"));
        assert_eq!(l.apply("a", 800).expect("applies"), "c");
        assert_eq!(l.source(), "a = b\nb = c");
    }
}
