//! Each phoneme's word, from espeak-ng's synthesis events, on real text. Needs
//! `ops/setup.sh` (Piper's espeak-ng data in `.deps/`).

use std::path::{Path, PathBuf};

use narrator_phonemes::{Phonemized, Phonemizer};

fn phonemizer() -> Phonemizer {
    let deps: PathBuf = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.deps");
    Phonemizer::new(&deps).unwrap_or_else(|err| panic!("{err}: run ops/setup.sh"))
}

fn spelled<'a>(text: &'a str, p: &Phonemized) -> Vec<&'a str> {
    p.words.iter().map(|r| &text[r.clone()]).collect()
}

/// The phonemes of each word, joined, in the order spoken.
fn said_by_word(p: &Phonemized) -> Vec<String> {
    let mut out = vec![String::new(); p.words.len()];
    for (sentence, owners) in p.sentences.iter().zip(&p.owners) {
        for (phoneme, owner) in sentence.iter().zip(owners) {
            if let Some(w) = owner {
                out[*w as usize].push_str(phoneme);
            }
        }
    }
    out
}

#[test]
fn words_do_not_change_the_phonemes_and_every_phoneme_has_its_word() {
    let ph = phonemizer();
    let texts = [
        "Doctor Smith paid 5 dollars for it, didn't he? I want to go out of the house.",
        "In 2021 the café's “naïve” résumé ran 1,234 km — at 10:30 on the 3rd of May...",
        "Say [[ hˈɛloʊ ]] to them.",
        "",
        "?!",
    ];
    for text in texts {
        let plain = ph.phonemize("en-us", text).expect("phonemize");
        let timed = ph.phonemize_words("en-us", text).expect("phonemize_words");
        assert_eq!(timed.sentences, plain, "{text}");
        assert_eq!(timed.owners.len(), timed.sentences.len());
        let mut last = 0;
        for (sentence, owners) in timed.sentences.iter().zip(&timed.owners) {
            assert_eq!(sentence.len(), owners.len());
            for (phoneme, owner) in sentence.iter().zip(owners) {
                let letter = phoneme.chars().all(char::is_alphabetic)
                    && !matches!(phoneme.as_str(), "ˈ" | "ˌ" | "ʲ");
                if letter {
                    let w = owner.unwrap_or_else(|| panic!("{phoneme:?} of {text:?} has no word"));
                    assert!(w >= last, "words go forward in {text:?}");
                    last = w;
                }
                if phoneme.trim().is_empty() {
                    assert_eq!(*owner, None, "a space belongs to no word");
                }
            }
        }
        // The words cover the text's tokens in order, without overlap.
        for pair in timed.words.windows(2) {
            assert!(pair[0].end < pair[1].start, "{text:?}: {:?}", timed.words);
        }
    }
}

#[test]
fn each_word_is_said_with_its_own_phonemes() {
    let ph = phonemizer();
    let text = "Doctor Smith paid 5 dollars for it, didn't he?";
    let timed = ph.phonemize_words("en-us", text).expect("phonemize_words");
    assert_eq!(
        spelled(text, &timed),
        [
            "Doctor", "Smith", "paid", "5", "dollars", "for", "it,", "didn't", "he?"
        ]
    );
    let said = said_by_word(&timed);
    assert!(said[1] == "smˈɪθ", "{said:?}");
    assert!(said[3] == "fˈaɪv", "{said:?}");
    assert!(said[8].starts_with('h'), "{said:?}");
    // A number espeak-ng says as several words is one word of the text; a raw block too.
    let text = "It was 2021, say [[ hˈɛloʊ ]] now.";
    let timed = ph.phonemize_words("en-us", text).expect("phonemize_words");
    let words = spelled(text, &timed);
    assert!(words.contains(&"2021,"), "{words:?}");
    assert!(words.contains(&"[[ hˈɛloʊ ]]"), "{words:?}");
    assert_eq!(words.last(), Some(&"now."));
}
