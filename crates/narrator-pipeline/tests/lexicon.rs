//! A pronunciation lexicon changes what the voice is given for exactly the words it
//! names: the phoneme ids of every other word stay the same. Real espeak-ng data and the
//! real voice's id map (`bash ops/setup.sh` first).

use std::path::{Path, PathBuf};

use narrator_phonemes::{PhonemeIdMap, Phonemizer, espeak_voice_of};
use narrator_text::Lexicon;

fn deps() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.deps")
}

/// The phoneme ids of `text`, one list per word (split at the space phoneme).
fn ids_by_word(text: &str) -> Vec<Vec<i64>> {
    let config: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(deps().join("voices/en_US-joe-medium.onnx.json"))
            .expect("the voice (bash ops/setup.sh)"),
    )
    .expect("config");
    let map = PhonemeIdMap::from_voice_config(&config).expect("id map");
    let voice = espeak_voice_of(&config).expect("espeak voice");
    let phonemizer = Phonemizer::new(&deps()).expect("espeak-ng data");
    let sentences = phonemizer.phonemize(voice, text).expect("phonemize");
    assert_eq!(sentences.len(), 1, "{sentences:?}");
    let mut words = vec![Vec::new()];
    for p in &sentences[0] {
        if p == " " {
            words.push(Vec::new());
        } else {
            let (ids, unknown) = map.ids(std::slice::from_ref(p));
            assert!(unknown.is_empty(), "{unknown:?}");
            // Between BOS/EOS and pads: the ids of this one phoneme.
            words.last_mut().expect("a word").extend(ids);
        }
    }
    words
}

/// Which words of `text` (by position) the lexicon should change.
fn positions(text: &str, word: &str) -> Vec<usize> {
    text.split_whitespace()
        .enumerate()
        .filter(|(_, w)| {
            w.trim_matches(|c: char| !c.is_alphanumeric())
                .eq_ignore_ascii_case(word)
        })
        .map(|(i, _)| i)
        .collect()
}

fn check(entry: &str, word: &str) {
    let text = "Alice saw the Cheshire cat, and the Cheshires smiled at the CHESHIRE moon.";
    let lexicon = Lexicon::parse(entry, "test").expect("lexicon");
    let changed = lexicon.apply(text, 800).expect("applies");
    let before = ids_by_word(text);
    let after = ids_by_word(&changed);
    assert_eq!(before.len(), text.split_whitespace().count(), "{before:?}");
    assert_eq!(before.len(), after.len(), "{changed}");
    let expected = positions(text, word);
    assert_eq!(expected, [3, 11], "the test's own text");
    let differing: Vec<usize> = (0..before.len())
        .filter(|&i| before[i] != after[i])
        .collect();
    assert_eq!(differing, expected, "{entry}: {changed}");
}

#[test]
fn a_respelling_changes_the_ids_of_exactly_the_matching_words() {
    check("Cheshire = Chayshire", "Cheshire");
}

#[test]
fn ipa_phonemes_change_the_ids_of_exactly_the_matching_words() {
    check("cheshire = [[tʃˈeɪʃaɪɚ]]", "Cheshire");
}
