//! Sentence segmentation and the per-sentence length cap.
//!
//! Input is one normalized paragraph (see [`crate::normalize_text`]): a single line,
//! abbreviations like "Mr." already spelled out. A sentence ends at `.`, `?`, `!` or `…`
//! (plus any closing quotes or brackets right after) when whitespace and then an
//! upper-case letter, a digit or an opening quote follow. A period does not end a
//! sentence after an initial ("J. R. R. Tolkien"), a leftover abbreviation, or inside a
//! number (no whitespace follows, so it never matches). The punctuation stays with the
//! sentence: the voice needs it for intonation.
//!
//! [`cap_sentence`] then cuts anything longer than the cap at the best break: the last
//! `;`, `:`, `,` or dash in the window, else the last space, else mid-word as a last
//! resort. Each cut looks at one window of `cap` characters, so the work is linear in
//! the sentence length.

/// Words (lower case, without the final period) after which a period does not end a
/// sentence. Most common ones are already expanded by normalization; these are the
/// leftovers and a safety net for text that bypassed it. Words that also end sentences
/// as ordinary words or names ("no", "Jan", "Inc") are deliberately absent.
const NO_SPLIT_AFTER: &[&str] = &[
    "mr", "mrs", "ms", "dr", "st", "prof", "capt", "lt", "col", "sgt", "rev", "mt", "gen", "gov",
    "fr", "vs", "e.g", "i.e", "cf", "fig", "vol", "pp", "approx", "dept", "feb", "apr", "aug",
    "sept", "oct", "nov",
];

fn is_terminator(c: char) -> bool {
    matches!(c, '.' | '?' | '!' | '\u{2026}') || is_script_terminator(c)
}

/// Sentence ends of scripts without letter case or spaces after a sentence: the CJK full
/// stop, full-width `！？．`, the Devanagari danda and double danda. A sentence always
/// ends after one of them.
fn is_script_terminator(c: char) -> bool {
    matches!(
        c,
        '\u{3002}' | '\u{ff01}' | '\u{ff1f}' | '\u{ff0e}' | '\u{0964}' | '\u{0965}'
    )
}

fn is_closer(c: char) -> bool {
    matches!(
        c,
        '\'' | '"' | '\u{2019}' | '\u{201d}' | '\u{bb}' | '\u{203a}' | ')' | ']' | '}'
    )
}

fn is_opener(c: char) -> bool {
    matches!(
        c,
        '\'' | '"'
            | '\u{2018}'
            | '\u{201c}'
            | '\u{ab}'
            | '\u{2039}'
            | '('
            | '['
            | '\u{bf}'
            | '\u{a1}'
    )
}

/// Splits one normalized paragraph into sentences, keeping their punctuation.
pub fn split_sentences(text: &str) -> Vec<String> {
    let chars: Vec<(usize, char)> = text.char_indices().collect();
    let mut sentences = Vec::new();
    let mut start_byte = 0;
    let mut i = 0;
    while i < chars.len() {
        let (_, c) = chars[i];
        if !is_terminator(c) {
            i += 1;
            continue;
        }
        let term_start = i;
        let mut j = i;
        while j < chars.len() && is_terminator(chars[j].1) {
            j += 1;
        }
        let single_period = j - term_start == 1 && c == '.';
        let script_end = chars[term_start..j]
            .iter()
            .any(|&(_, t)| is_script_terminator(t));
        while j < chars.len()
            && (is_closer(chars[j].1) || matches!(chars[j].1, '\u{300d}' | '\u{300f}'))
        {
            j += 1;
        }
        if script_end {
            let mut k = j;
            while k < chars.len() && chars[k].1.is_whitespace() {
                k += 1;
            }
            let end_byte = chars.get(j).map_or(text.len(), |x| x.0);
            push_trimmed(&mut sentences, &text[start_byte..end_byte]);
            start_byte = chars.get(k).map_or(text.len(), |x| x.0);
            i = k;
            continue;
        }
        // Needs whitespace, then a plausible sentence start.
        let mut k = j;
        while k < chars.len() && chars[k].1.is_whitespace() {
            k += 1;
        }
        if k == j || k >= chars.len() {
            i = j.max(i + 1);
            continue;
        }
        let starts_sentence = starts_sentence(&chars, k);
        let blocked = single_period && period_is_not_an_end(&chars, term_start, k);
        if starts_sentence && !blocked {
            let end_byte = chars.get(j).map_or(text.len(), |x| x.0);
            push_trimmed(&mut sentences, &text[start_byte..end_byte]);
            start_byte = chars[k].0;
        }
        i = k;
    }
    push_trimmed(&mut sentences, &text[start_byte..]);
    sentences
}

fn push_trimmed(out: &mut Vec<String>, s: &str) {
    let s = s.trim();
    if !s.is_empty() {
        out.push(s.to_owned());
    }
}

/// Upper case, digit, or an opening quote/bracket (not followed by lower case).
fn starts_sentence(chars: &[(usize, char)], k: usize) -> bool {
    let Some(&(_, c)) = chars.get(k) else {
        return false;
    };
    if c.is_uppercase() || c.is_ascii_digit() {
        return true;
    }
    if is_opener(c) {
        return chars.get(k + 1).is_none_or(|&(_, n)| !n.is_lowercase());
    }
    false
}

/// True when the period at `dot` belongs to an initial or an abbreviation.
fn period_is_not_an_end(chars: &[(usize, char)], dot: usize, next: usize) -> bool {
    // The word right before the period (letters and inner periods: "e.g").
    let mut b = dot;
    while b > 0 && (chars[b - 1].1.is_alphabetic() || chars[b - 1].1 == '.') {
        b -= 1;
    }
    let word: String = chars[b..dot].iter().map(|x| x.1).collect();
    if word.is_empty() {
        return false;
    }
    let mut letters = word.chars();
    let single_letter = letters.next().is_some_and(char::is_uppercase) && letters.next().is_none();
    if single_letter {
        // "J. R. R. Tolkien": an initial. A lone "I." ends a sentence unless another
        // initial follows ("I. M. Pei").
        if word != "I" {
            return true;
        }
        let next_is_initial = chars.get(next).is_some_and(|x| x.1.is_uppercase())
            && chars.get(next + 1).is_some_and(|x| x.1 == '.');
        return next_is_initial;
    }
    let lower = word.to_lowercase();
    if NO_SPLIT_AFTER.contains(&lower.as_str()) {
        return true;
    }
    // Dotted acronyms such as "U.S" with one-letter parts.
    word.contains('.') && word.split('.').all(|p| p.chars().count() <= 1)
}

/// Cuts `sentence` into pieces of at most `cap` characters (a cap below 1 counts as 1),
/// preferring to cut after `;` `:` `,` or a dash, then at a space; no character other
/// than the whitespace at a cut is lost.
pub fn cap_sentence(sentence: &str, cap: usize) -> Vec<String> {
    let cap = cap.max(1);
    let mut pieces = Vec::new();
    let mut rest = sentence.trim();
    // A punctuation break must leave a piece of at least this many chars, so we do
    // not produce a string of tiny fragments.
    let min_punct = cap / 3;
    while let Some((limit_byte, limit_char)) = rest.char_indices().nth(cap) {
        let window = &rest[..limit_byte];
        let mut best_punct = None;
        let mut best_space = None;
        for (n, (b, c)) in window.char_indices().enumerate() {
            match c {
                ';' | ':' | ',' | '\u{2013}' | '\u{2014}' if n + 1 >= min_punct => {
                    best_punct = Some(b + c.len_utf8());
                }
                c if c.is_whitespace() && n > 0 => best_space = Some(b),
                _ => {}
            }
        }
        let fallback = if limit_char.is_whitespace() {
            // The window ends exactly at a word boundary.
            limit_byte
        } else {
            best_space.unwrap_or(limit_byte)
        };
        let cut = best_punct.unwrap_or(fallback);
        push_trimmed(&mut pieces, &rest[..cut]);
        rest = rest[cut..].trim_start();
    }
    push_trimmed(&mut pieces, rest);
    pieces
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_after_the_sentence_ends_of_scripts_without_case_or_spaces() {
        assert_eq!(
            split_sentences("今日は晴れです。明日は雨でしょう！本当？"),
            vec!["今日は晴れです。", "明日は雨でしょう！", "本当？"]
        );
        assert_eq!(
            split_sentences("「行こう。」と彼は言った。"),
            vec!["「行こう。」", "と彼は言った。"]
        );
        assert_eq!(
            split_sentences("सफेद खरगोश दौड़ता है। वह देर से है॥ अंत"),
            vec!["सफेद खरगोश दौड़ता है।", "वह देर से है॥", "अंत"]
        );
    }

    #[test]
    fn splits_on_terminators() {
        assert_eq!(
            split_sentences("It rained. Then it stopped! Did it? Yes\u{2026} It did."),
            vec![
                "It rained.",
                "Then it stopped!",
                "Did it?",
                "Yes\u{2026}",
                "It did."
            ]
        );
    }

    #[test]
    fn keeps_closing_quotes_with_sentence() {
        assert_eq!(
            split_sentences(
                "\u{201c}Stop!\u{201d} She ran. \u{2018}Why?' he asked. 'Because.' Fine."
            ),
            vec![
                "\u{201c}Stop!\u{201d}",
                "She ran.",
                "\u{2018}Why?' he asked.",
                "'Because.'",
                "Fine."
            ]
        );
    }

    #[test]
    fn no_split_before_lower_case_or_inside_numbers() {
        assert_eq!(
            split_sentences("\u{2018}Who are you?' said the Caterpillar. It cost 3.50 today."),
            vec![
                "\u{2018}Who are you?' said the Caterpillar.",
                "It cost 3.50 today."
            ]
        );
    }

    #[test]
    fn initials_and_abbreviations_do_not_split() {
        assert_eq!(
            split_sentences("J. R. R. Tolkien wrote it. See Fig. 3 and the U.S. Army report."),
            vec![
                "J. R. R. Tolkien wrote it.",
                "See Fig. 3 and the U.S. Army report."
            ]
        );
        assert_eq!(
            split_sentences("Ask Mr. Smith. He knows."),
            vec!["Ask Mr. Smith.", "He knows."]
        );
        assert_eq!(
            split_sentences("So did I. Then we left."),
            vec!["So did I.", "Then we left."]
        );
        assert_eq!(
            split_sentences("I said no. Then Jan. Left."),
            vec!["I said no.", "Then Jan.", "Left."]
        );
    }

    #[test]
    fn digits_and_brackets_start_sentences() {
        assert_eq!(
            split_sentences("It ended. 1865 was the year. (Maybe.) (and so on)"),
            vec!["It ended.", "1865 was the year.", "(Maybe.) (and so on)"]
        );
    }

    #[test]
    fn cap_prefers_punctuation_then_spaces() {
        let s = "one two three, four five six seven eight nine ten";
        let pieces = cap_sentence(s, 20);
        assert_eq!(pieces[0], "one two three,");
        assert!(pieces.iter().all(|p| p.chars().count() <= 20), "{pieces:?}");
        assert_eq!(pieces.join(" "), s);
    }

    #[test]
    fn cap_cuts_long_words_without_losing_chars() {
        let word = "x".repeat(25);
        let pieces = cap_sentence(&word, 10);
        assert_eq!(pieces, vec!["x".repeat(10), "x".repeat(10), "x".repeat(5)]);
        assert_eq!(cap_sentence("short", 0), vec!["s", "h", "o", "r", "t"]);
    }

    #[test]
    fn cap_counts_chars_not_bytes() {
        let s = "\u{e9}t\u{e9} ".repeat(50);
        for p in cap_sentence(&s, 16) {
            assert!(p.chars().count() <= 16, "{p}");
        }
    }
}
