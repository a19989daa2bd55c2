//! Piper 1.8.0's text → sentences of phonemes, rebuilt on espeak-ng 1.51.
//!
//! The steps follow Piper's `PiperVoice.phonemize` and `EspeakPhonemizer.phonemize`:
//! text between `[[` and `]]` is taken as raw phonemes; every other part goes through
//! espeak-ng clause by clause; each clause's `(lang)` switch markers are removed, its
//! terminator (see `clause.rs`) appended, plus a space after `, : ;`; the result is
//! NFD-normalized and split into characters; a sentence ends after `. ? !`, a paragraph
//! break or the end of the text. Sentences without phonemes are dropped, as Piper's
//! `synthesize` skips them.

use std::ffi::CString;

use unicode_normalization::UnicodeNormalization;

use crate::PhonemeError;
use crate::clause::clause_end;
use crate::ffi::{Espeak, PHONEMES_ASCII, PHONEMES_IPA, RawClause};
use crate::linking::{SEPARATOR, merge_linking, strip_separators};
use crate::words::Phonemized;

/// One piece of the input: plain text, or a `[[ raw phonemes ]]` block.
#[derive(Debug, PartialEq, Eq)]
enum Part<'a> {
    Text(&'a str),
    Raw(&'a str),
}

/// Splits like Python's `re.split(r"(\[\[.*?\]\])", text)`: leftmost `[[`, shortest
/// match to `]]`, no newline inside. Piper then treats every part that starts with `[[`
/// as raw phonemes, even an unclosed one; so does this.
fn split_raw_blocks(text: &str) -> Vec<Part<'_>> {
    let mut parts = Vec::new();
    let mut last = 0;
    let mut search = 0;
    while let Some(rel) = text[search..].find("[[") {
        let open = search + rel;
        let body_start = open + 2;
        let line_end = text[body_start..]
            .find('\n')
            .map_or(text.len(), |i| body_start + i);
        match text[body_start..line_end].find("]]") {
            Some(close_rel) => {
                let close = body_start + close_rel + 2;
                parts.push(Part::Text(&text[last..open]));
                parts.push(Part::Raw(&text[open..close]));
                last = close;
                search = close;
            }
            // Python's regex retries one character later ("[[[a]]" matches at index 1).
            None => search = open + 1,
        }
    }
    parts.push(Part::Text(&text[last..]));
    parts
        .into_iter()
        .map(|part| match part {
            Part::Text(t) if t.starts_with("[[") => Part::Raw(t),
            other => other,
        })
        .collect()
}

fn text_of<'a>(part: &Part<'a>) -> &'a str {
    match part {
        Part::Text(t) | Part::Raw(t) => t,
    }
}

/// Removes espeak-ng's `(lang)` switch markers, like `re.sub(r"\([^)]+\)", "", s)`.
fn strip_language_markers(phonemes: &str) -> String {
    let mut out = String::with_capacity(phonemes.len());
    let mut rest = phonemes;
    while let Some(open) = rest.find('(') {
        out.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        match after.find(')') {
            Some(close) if close > 0 => rest = &after[close + 1..],
            _ => {
                out.push('(');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// The whole Piper phonemization of `text` with espeak-ng voice `voice`.
pub(crate) fn phonemize(
    espeak: &mut Espeak,
    voice: &str,
    text: &str,
) -> Result<Vec<Vec<String>>, PhonemeError> {
    Ok(phonemize_parts(espeak, voice, text, false)?.sentences)
}

/// The same, with each phoneme's word (see `words.rs`): every plain part is also
/// synthesized for its word events; a `[[ raw ]]` block is one word.
pub(crate) fn phonemize_words(
    espeak: &mut Espeak,
    voice: &str,
    text: &str,
) -> Result<Phonemized, PhonemeError> {
    phonemize_parts(espeak, voice, text, true)
}

/// Byte offset of `part` (a slice of `text`) in `text`.
fn offset_in(text: &str, part: &str) -> usize {
    part.as_ptr().addr().saturating_sub(text.as_ptr().addr())
}

fn phonemize_parts(
    espeak: &mut Espeak,
    voice: &str,
    text: &str,
    with_words: bool,
) -> Result<Phonemized, PhonemeError> {
    let parts = split_raw_blocks(text);
    let mut sentences: Vec<Vec<String>> = Vec::new();
    let mut owners: Vec<Vec<Option<u32>>> = Vec::new();
    let mut words: Vec<std::ops::Range<usize>> = Vec::new();
    let mut prev_raw = false;
    for (i, part) in parts.iter().enumerate() {
        match part {
            Part::Raw(raw) => {
                prev_raw = true;
                if sentences.is_empty() {
                    sentences.push(Vec::new());
                    owners.push(Vec::new());
                }
                let (Some(current), Some(owned)) = (sentences.last_mut(), owners.last_mut()) else {
                    continue;
                };
                let word = u32::try_from(words.len()).ok();
                let start = offset_in(text, raw);
                words.push(start..start + raw.len());
                if i > 0 && text_of(&parts[i - 1]).ends_with(' ') {
                    current.push(" ".to_owned());
                    owned.push(None);
                }
                // Python's raw[2:-2].strip(): no NFD here, Piper passes them as written.
                let chars: Vec<char> = raw.chars().collect();
                let inner: String = if chars.len() >= 4 {
                    chars[2..chars.len() - 2].iter().collect()
                } else {
                    String::new()
                };
                for c in inner.trim().chars() {
                    current.push(c.to_string());
                    owned.push((!c.is_whitespace()).then_some(word).flatten());
                }
                if i + 1 < parts.len() && text_of(&parts[i + 1]).starts_with(' ') {
                    current.push(" ".to_owned());
                    owned.push(None);
                }
            }
            Part::Text(plain) => {
                let part_sentences = phonemize_espeak(espeak, voice, plain)?;
                let part_owners = if with_words {
                    let events = espeak.synth_events(&c_text(plain)?)?;
                    let (part_words, part_owners) =
                        crate::words::assign(plain, &part_sentences, &events);
                    let base = offset_in(text, plain);
                    let first = u32::try_from(words.len()).unwrap_or(u32::MAX);
                    words.extend(part_words.into_iter().map(|r| r.start + base..r.end + base));
                    part_owners
                        .into_iter()
                        .map(|s| s.into_iter().map(|o| o.map(|w| w + first)).collect())
                        .collect()
                } else {
                    part_sentences
                        .iter()
                        .map(|s| vec![None; s.len()])
                        .collect::<Vec<_>>()
                };
                let mut part_sentences = part_sentences.into_iter().zip(part_owners);
                if prev_raw
                    && let (Some((first, first_owned)), Some(current), Some(owned)) = (
                        part_sentences.next(),
                        sentences.last_mut(),
                        owners.last_mut(),
                    )
                {
                    current.extend(first);
                    owned.extend(first_owned);
                }
                for (sentence, owned) in part_sentences {
                    sentences.push(sentence);
                    owners.push(owned);
                }
                prev_raw = false;
            }
        }
    }
    let (sentences, owners) = sentences
        .into_iter()
        .zip(owners)
        .filter(|(sentence, _)| !sentence.is_empty())
        .unzip();
    Ok(Phonemized {
        sentences,
        owners,
        words,
    })
}

/// `text` as a C string: a NUL would end it early; espeak-ng treats other control
/// characters as spaces, so a space (one byte, as the NUL) keeps the rest of the text
/// and every offset.
fn c_text(text: &str) -> Result<CString, PhonemeError> {
    CString::new(text.replace('\0', " ")).map_err(|_| PhonemeError::Engine { offset: 0 })
}

/// `EspeakPhonemizer.phonemize` for one plain-text part (may return empty sentences).
fn phonemize_espeak(
    espeak: &mut Espeak,
    voice: &str,
    text: &str,
) -> Result<Vec<Vec<String>>, PhonemeError> {
    let c_text = c_text(text)?;
    let bytes = c_text.as_bytes();
    let separator = (SEPARATOR as i32) << 8;

    espeak.set_voice(voice)?;
    let ipa = espeak.clauses(&c_text, PHONEMES_IPA | separator)?;
    // Second pass over the same text for the linking glides; if espeak-ng cut the clauses
    // differently (never seen), the glides are left out.
    let ascii = espeak.clauses(&c_text, PHONEMES_ASCII | separator)?;
    let same_cuts = ipa.len() == ascii.len()
        && ipa
            .iter()
            .zip(&ascii)
            .all(|(a, b)| a.start == b.start && a.end == b.end);

    let mut sentences = Vec::new();
    let mut current = Vec::new();
    for (index, clause) in ipa.iter().enumerate() {
        let phonemes = match ascii.get(index) {
            Some(twin) if same_cuts => merge_linking(&clause.phonemes, &twin.phonemes),
            _ => strip_separators(&clause.phonemes),
        };
        let end = clause_end(&consumed_text(bytes, clause), clause.at_eof);
        let mut phonemes = strip_language_markers(&phonemes);
        if let Some(terminator) = end.terminator {
            phonemes.push(terminator);
            if matches!(terminator, ',' | ':' | ';') {
                phonemes.push(' ');
            }
        }
        current.extend(phonemes.nfd().map(String::from));
        if end.sentence_end {
            sentences.push(std::mem::take(&mut current));
        }
    }
    if !current.is_empty() {
        sentences.push(current);
    }
    Ok(sentences)
}

fn consumed_text(bytes: &[u8], clause: &RawClause) -> String {
    let end = clause.end.min(bytes.len());
    let start = clause.start.min(end);
    String::from_utf8_lossy(&bytes[start..end]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_blocks_split_like_pythons_regex() {
        assert_eq!(split_raw_blocks("plain"), vec![Part::Text("plain")]);
        assert_eq!(
            split_raw_blocks("say [[ hˈɛloʊ ]] now"),
            vec![
                Part::Text("say "),
                Part::Raw("[[ hˈɛloʊ ]]"),
                Part::Text(" now")
            ]
        );
        assert_eq!(
            split_raw_blocks("[[a]][[b]]"),
            vec![
                Part::Text(""),
                Part::Raw("[[a]]"),
                Part::Text(""),
                Part::Raw("[[b]]"),
                Part::Text("")
            ]
        );
        // No newline inside a block; the leftover "[[" part is still raw, as in Piper.
        assert_eq!(
            split_raw_blocks("x [[a\nb]] y"),
            vec![Part::Text("x [[a\nb]] y")]
        );
        assert_eq!(split_raw_blocks("[[a\n"), vec![Part::Raw("[[a\n")]);
    }

    #[test]
    fn language_markers_removed() {
        assert_eq!(strip_language_markers("(fr)kafe(en) ok"), "kafe ok");
        assert_eq!(strip_language_markers("a () b"), "a () b");
        assert_eq!(strip_language_markers("open (end"), "open (end");
    }
}
