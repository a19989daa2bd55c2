//! How a clause ended, read back from the text espeak-ng consumed for it.
//!
//! Piper 1.8.0 links an espeak-ng build that reports each clause's terminator
//! (`espeak_TextToPhonemesWithTerminator`); Debian's 1.51 only says how far it read.
//! Measured against Piper (see `tests/piper_fixture.rs` and the notes there), the
//! terminator it reports is:
//! - the FIRST character of the run of `. ? ! , : ;` that ends the clause (`?!` → `?`,
//!   `!?` → `!`, `?.` → `?`), after closing quotes and brackets are set aside;
//! - nothing, and not a sentence end, for an ellipsis (`...`, `..`, `…`), also when a
//!   comma precedes it only the comma counts (`,...` → `,`);
//! - `;` (not a sentence end) for a clause cut at a dash (`—`, `–`);
//! - nothing but a sentence end for a paragraph break (a blank line), whatever
//!   punctuation precedes it;
//! - nothing otherwise (a clause espeak-ng cut for length, or the end of the text, which
//!   ends the sentence).
//!
//! espeak-ng reads one character past the clause (the first character of the next one),
//! except at the end of the text, so that character is dropped before looking.

/// How one clause ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ClauseEnd {
    /// The punctuation Piper appends to the clause's phonemes, if any.
    pub(crate) terminator: Option<char>,
    /// The clause ends a sentence (Piper starts a new phoneme list after it).
    pub(crate) sentence_end: bool,
}

/// Closing quotes and brackets that may follow a clause's punctuation.
fn is_closer(c: char) -> bool {
    matches!(
        c,
        '"' | '\'' | ')' | ']' | '}' | '»' | '›' | '”' | '’' | '`' | '」' | '』'
    )
}

fn is_clause_punct(c: char) -> bool {
    matches!(c, '.' | '?' | '!' | ',' | ':' | ';' | '…')
}

/// Reads how a clause ended from `consumed`, the text espeak-ng consumed for it.
/// `at_eof`: espeak-ng reached the end of the text (no look-ahead character).
pub(crate) fn clause_end(consumed: &str, at_eof: bool) -> ClauseEnd {
    let mut text = consumed;
    if !at_eof {
        // Drop the one character espeak-ng read ahead.
        if let Some((idx, _)) = text.char_indices().next_back() {
            text = &text[..idx];
        }
    }
    let trimmed = text.trim_end();
    let trailing_space = &text[trimmed.len()..];
    if trailing_space.matches('\n').count() >= 2 {
        // A blank line: espeak-ng ends the paragraph and Piper reports no terminator.
        return ClauseEnd {
            terminator: None,
            sentence_end: true,
        };
    }
    let core = trimmed.trim_end_matches(|c: char| is_closer(c) || c.is_whitespace());
    let run_start = core
        .char_indices()
        .rev()
        .take_while(|&(_, c)| is_clause_punct(c))
        .last()
        .map_or(core.len(), |(idx, _)| idx);
    let run = &core[run_start..];
    if let Some(first) = run.chars().next() {
        if first == '…' || run.starts_with("..") {
            return ClauseEnd {
                terminator: None,
                sentence_end: false,
            };
        }
        return ClauseEnd {
            terminator: Some(first),
            sentence_end: matches!(first, '.' | '?' | '!'),
        };
    }
    if core.ends_with(['—', '–']) {
        return ClauseEnd {
            terminator: Some(';'),
            sentence_end: false,
        };
    }
    ClauseEnd {
        terminator: None,
        sentence_end: at_eof,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn end(consumed: &str, at_eof: bool) -> (Option<char>, bool) {
        let e = clause_end(consumed, at_eof);
        (e.terminator, e.sentence_end)
    }

    #[test]
    fn plain_punctuation_and_lookahead() {
        assert_eq!(end("Hello, w", false), (Some(','), false));
        assert_eq!(end("orld. H", false), (Some('.'), true));
        assert_eq!(end("hanks; o", false), (Some(';'), false));
        assert_eq!(end("k: y", false), (Some(':'), false));
        assert_eq!(end("es!", true), (Some('!'), true));
        // The look-ahead character is dropped even when it is the whole next word.
        assert_eq!(end("Hi, a", false), (Some(','), false));
    }

    #[test]
    fn first_mark_of_a_run_wins() {
        assert_eq!(end("ow are you?! F", false), (Some('?'), true));
        assert_eq!(end("Yes!? N", false), (Some('!'), true));
        assert_eq!(end("mm?. F", false), (Some('?'), true));
        assert_eq!(end("ine.!", true), (Some('.'), true));
    }

    #[test]
    fn quotes_and_brackets_are_skipped() {
        assert_eq!(end("He said \"Stop!\"", false), (Some('!'), true));
        assert_eq!(end("(Yes.)", false), (Some('.'), true));
        assert_eq!(end(" he said. '", false), (Some('.'), true));
        assert_eq!(end("Okay.’", false), (Some('.'), true));
    }

    #[test]
    fn ellipsis_is_no_terminator() {
        assert_eq!(end("ine... t", false), (None, false));
        assert_eq!(end("Hey ... y", false), (None, false));
        assert_eq!(end("Ellipsis … h", false), (None, false));
        assert_eq!(end("so...", true), (None, false));
        assert_eq!(end("Well,... o", false), (Some(','), false));
    }

    #[test]
    fn dash_paragraph_and_none() {
        assert_eq!(end("Wait — w", false), (Some(';'), false));
        assert_eq!(end("Hi.\n\nN", false), (None, true));
        assert_eq!(end("Hi,\n \nn", false), (None, true));
        assert_eq!(end("Hi.\nN", false), (Some('.'), true));
        assert_eq!(end("Hello world", true), (None, true));
        assert_eq!(end("a very long clause cut here w", false), (None, false));
        assert_eq!(end("", true), (None, true));
    }
}
