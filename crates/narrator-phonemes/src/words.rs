//! Which word of the text each phoneme was said for.
//!
//! `espeak_TextToPhonemes` returns phonemes without saying which characters they came
//! from (its spaces are no word map: it joins "out of" into one word and spells "2021"
//! as four). Synthesis does say: espeak-ng reports a word event (its character position)
//! before each word's phoneme events. The phonemes of the two streams are the same
//! (stress marks aside, measured: docs/notes/issue30-durations.md), so the words are
//! carried across by aligning them: a diff of the two phoneme strings, each matched
//! phoneme taking its word from the event stream. A phoneme the diff could not match
//! takes its neighbour's word, a stress mark the next phoneme's; spaces, punctuation and
//! linking glides belong to no word.
//!
//! Words are the text's whitespace-separated tokens: every event inside one token (the
//! digits of a number, `$` and `5` of `$5`) is that token. A token no phoneme was said
//! for (espeak-ng's merged "of" in "out of", a lone dash) joins the word before it, so
//! the words cover the text without gaps in the order spoken.

use std::ops::Range;

use similar::{Algorithm, DiffOp, capture_diff_slices};
use unicode_normalization::UnicodeNormalization;
use unicode_normalization::char::is_combining_mark;

use crate::ffi::SynthEvent;

/// Sentences of phonemes with, per phoneme, the word it was said for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Phonemized {
    /// One list per sentence, each phoneme one character, as
    /// [`crate::Phonemizer::phonemize`] returns them.
    pub sentences: Vec<Vec<String>>,
    /// Per sentence, per phoneme: the index in [`Phonemized::words`] of its word, or
    /// `None` (spaces, punctuation, pauses).
    pub owners: Vec<Vec<Option<u32>>>,
    /// The words spoken, in order: byte ranges of the text.
    pub words: Vec<Range<usize>>,
}

/// Whether `c` is (part of) a phoneme both streams carry: letters and their combining
/// marks, but not stress marks or Piper's linking glide.
fn is_phone(c: char) -> bool {
    (c.is_alphabetic() || is_combining_mark(c)) && !matches!(c, 'ˈ' | 'ˌ' | 'ʲ')
}

fn is_stress(c: &str) -> bool {
    matches!(c, "ˈ" | "ˌ")
}

/// Whitespace-separated tokens of `text`, as byte ranges.
fn tokens(text: &str) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    let mut start = None;
    for (i, c) in text.char_indices() {
        match (c.is_whitespace(), start) {
            (true, Some(s)) => {
                out.push(s..i);
                start = None;
            }
            (false, None) => start = Some(i),
            _ => {}
        }
    }
    if let Some(s) = start {
        out.push(s..text.len());
    }
    out
}

/// The token holding byte `at`, or the first after it (an event on a space).
fn token_at(tokens: &[Range<usize>], at: usize) -> Option<usize> {
    let i = tokens.partition_point(|t| t.end <= at);
    (i < tokens.len()).then_some(i)
}

/// Assigns each phoneme of `sentences` (the phonemization of `text`) the token of
/// `text` it was said for, from the synthesis `events` of the same text: per sentence,
/// per phoneme, a token index (see [`tokens`]).
fn token_owners(
    text: &str,
    sentences: &[Vec<String>],
    events: &[SynthEvent],
) -> (Vec<Range<usize>>, Vec<Vec<Option<usize>>>) {
    let tokens = tokens(text);
    let char_bytes: Vec<usize> = text.char_indices().map(|(i, _)| i).collect();
    // The event stream: phoneme characters with their token.
    let mut heard: Vec<(char, Option<usize>)> = Vec::new();
    let mut token = None;
    for event in events {
        match event {
            SynthEvent::Word { char_start, .. } => {
                let byte = char_bytes.get(*char_start).copied().unwrap_or(text.len());
                token = token_at(&tokens, byte);
            }
            SynthEvent::Phoneme(name) => {
                heard.extend(name.nfd().filter(|&c| is_phone(c)).map(|c| (c, token)));
            }
        }
    }
    // The phonemizer's stream: phoneme characters with their place.
    let mut said: Vec<(char, usize, usize)> = Vec::new();
    for (s, sentence) in sentences.iter().enumerate() {
        for (p, phoneme) in sentence.iter().enumerate() {
            said.extend(phoneme.chars().filter(|&c| is_phone(c)).map(|c| (c, s, p)));
        }
    }
    let a: Vec<char> = heard.iter().map(|h| h.0).collect();
    let b: Vec<char> = said.iter().map(|s| s.0).collect();
    let mut owners: Vec<Vec<Option<usize>>> =
        sentences.iter().map(|s| vec![None; s.len()]).collect();
    let mut matched = vec![None; said.len()];
    for op in capture_diff_slices(Algorithm::Myers, &a, &b) {
        if let DiffOp::Equal {
            old_index,
            new_index,
            len,
        } = op
        {
            for k in 0..len {
                matched[new_index + k] = heard[old_index + k].1;
            }
        }
    }
    // Unmatched phonemes take the previous one's word (the next one's at the start).
    let first = matched.iter().flatten().next().copied();
    let mut last = first;
    for (i, &(_, s, p)) in said.iter().enumerate() {
        let owner = matched[i].or(last);
        last = owner;
        owners[s][p] = owner;
    }
    // A stress mark belongs to the phoneme after it.
    for (s, sentence) in sentences.iter().enumerate() {
        for p in (0..sentence.len()).rev() {
            if is_stress(&sentence[p]) {
                owners[s][p] = owners[s].get(p + 1).copied().flatten();
            }
        }
    }
    (tokens, owners)
}

/// The words of `text` (byte ranges) and each phoneme's word, from token owners: tokens
/// without phonemes join the word before them (the first word takes those before it).
fn words_of(
    tokens: &[Range<usize>],
    owners: Vec<Vec<Option<usize>>>,
) -> (Vec<Range<usize>>, Vec<Vec<Option<u32>>>) {
    let mut spoken = vec![false; tokens.len()];
    for &t in owners.iter().flatten().flatten() {
        spoken[t] = true;
    }
    let mut words: Vec<Range<usize>> = Vec::new();
    let mut word_of = vec![0u32; tokens.len()];
    let mut pending_start = None;
    for (t, range) in tokens.iter().enumerate() {
        if spoken[t] {
            let start = pending_start.take().unwrap_or(range.start);
            words.push(start..range.end);
        } else if let Some(last) = words.last_mut() {
            last.end = range.end;
        } else {
            pending_start.get_or_insert(range.start);
        }
        word_of[t] = u32::try_from(words.len().saturating_sub(1)).unwrap_or(u32::MAX);
    }
    let owners = owners
        .into_iter()
        .map(|s| s.into_iter().map(|o| o.map(|t| word_of[t])).collect())
        .collect();
    (words, owners)
}

/// Per sentence, per phoneme, the word of `text` it was said for, and the words as byte
/// ranges of `text`, from the synthesis `events` of `text`.
pub(crate) fn assign(
    text: &str,
    sentences: &[Vec<String>],
    events: &[SynthEvent],
) -> (Vec<Range<usize>>, Vec<Vec<Option<u32>>>) {
    let (tokens, owners) = token_owners(text, sentences, events);
    words_of(&tokens, owners)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chars(s: &str) -> Vec<String> {
        s.chars().map(String::from).collect()
    }

    fn word(at: usize) -> SynthEvent {
        SynthEvent::Word { char_start: at }
    }

    fn ph(name: &str) -> SynthEvent {
        SynthEvent::Phoneme(name.into())
    }

    /// A word event at character `at` and its phonemes (names separated by spaces).
    fn said(at: usize, names: &str) -> Vec<SynthEvent> {
        std::iter::once(word(at))
            .chain(names.split(' ').map(ph))
            .collect()
    }

    fn spelled(text: &str, words: &[Range<usize>]) -> Vec<String> {
        words.iter().map(|r| text[r.clone()].to_string()).collect()
    }

    #[test]
    fn phonemes_take_the_word_of_their_event_and_stress_the_next_ones() {
        let text = "Go now.";
        let sentences = vec![chars("ɡˈoʊ nˈaʊ.")];
        let events = [word(0), ph("ɡ"), ph("oʊ"), word(3), ph("n"), ph("aʊ")];
        let (words, owners) = assign(text, &sentences, &events);
        assert_eq!(spelled(text, &words), ["Go", "now."]);
        let o = &owners[0];
        assert_eq!(
            o,
            &[
                Some(0),
                Some(0),
                Some(0),
                Some(0),
                None,
                Some(1),
                Some(1),
                Some(1),
                Some(1),
                None
            ]
        );
    }

    #[test]
    fn a_merged_word_joins_the_one_before_and_a_number_is_one_word() {
        // espeak-ng says "out of" as one word (one event) and "2021" as four.
        let text = "out of 2021 — yes";
        let sentences = vec![chars("aʊɾəv twɛnti twɛnti wʌn, jɛs")];
        let events: Vec<SynthEvent> = [
            said(0, "aʊ ɾ ə v"),
            said(7, "t w ɛ n t i"),
            said(8, "t w ɛ n t i"),
            said(10, "w ʌ n"),
            said(14, "j ɛ s"),
        ]
        .concat();
        let (words, owners) = assign(text, &sentences, &events);
        assert_eq!(spelled(text, &words), ["out of", "2021 —", "yes"]);
        let owned: Vec<Option<u32>> = owners[0].clone();
        assert_eq!(owned[0], Some(0));
        assert_eq!(owned[6], Some(1), "the number's first phoneme");
        assert_eq!(owned.last().copied().flatten(), Some(2));
        assert!(owned.iter().flatten().all(|&w| w <= 2));
    }

    #[test]
    fn phonemes_the_events_lack_take_their_neighbours_word() {
        let text = "a b";
        // The phonemizer has an extra "x" after "b" the events do not; sentences may
        // cut the stream anywhere.
        let sentences = vec![chars("a b"), chars("x")];
        let events = [word(0), ph("a"), word(2), ph("b")];
        let (words, owners) = assign(text, &sentences, &events);
        assert_eq!(spelled(text, &words), ["a", "b"]);
        assert_eq!(owners[0], vec![Some(0), None, Some(1)]);
        assert_eq!(owners[1], vec![Some(1)]);
    }

    #[test]
    fn leading_tokens_without_phonemes_join_the_first_word() {
        let text = "— “Hello";
        let sentences = vec![chars("həlˈoʊ")];
        let events = [word(2), ph("h"), ph("ə"), ph("l"), ph("oʊ")];
        let (words, owners) = assign(text, &sentences, &events);
        assert_eq!(spelled(text, &words), ["— “Hello"]);
        assert!(owners[0].iter().all(|o| *o == Some(0)));
        let (words, owners) = assign("", &[], &[]);
        assert!(words.is_empty() && owners.is_empty());
    }
}
