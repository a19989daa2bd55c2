//! Phonemization speed on a plain-text book, paragraph by paragraph.
//!
//! ```text
//! cargo run --release -p narrator-phonemes --example phonemize_speed -- BOOK.txt [--chapter1] [--json]
//! ```
//! `--chapter1` keeps the text from "CHAPTER I" to "CHAPTER II"; `--json` prints each
//! paragraph's sentences (one JSON array per line) instead of the timing. The timing is
//! given twice: phonemes alone, and with each phoneme's word (what word timings cost).

use std::error::Error;
use std::path::Path;
use std::time::Instant;

use narrator_phonemes::{PhonemeIdMap, Phonemizer, espeak_voice_of};

fn main() -> Result<(), Box<dyn Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let book = args
        .iter()
        .find(|a| !a.starts_with("--"))
        .ok_or("usage: phonemize_speed BOOK.txt [--chapter1] [--json]")?;
    let chapter1 = args.iter().any(|a| a == "--chapter1");
    let json = args.iter().any(|a| a == "--json");

    let deps = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.deps");
    let config: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(
        deps.join("voices/en_US-joe-medium.onnx.json"),
    )?)?;
    let voice = espeak_voice_of(&config)?.to_owned();
    let id_map = PhonemeIdMap::from_voice_config(&config)?;
    let phonemizer = Phonemizer::new(&deps)?;

    let text = std::fs::read_to_string(book)?.replace("\r\n", "\n");
    let text = if chapter1 {
        let start = text.find("CHAPTER I").ok_or("no CHAPTER I")?;
        let end = text[start..]
            .find("CHAPTER II")
            .map_or(text.len(), |i| start + i);
        &text[start..end]
    } else {
        text.as_str()
    };
    let paragraphs: Vec<&str> = text
        .split("\n\n")
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .collect();

    if json {
        for paragraph in &paragraphs {
            let sentences: Vec<String> = phonemizer
                .phonemize(&voice, paragraph)?
                .iter()
                .map(|s| s.concat())
                .collect();
            println!("{}", serde_json::to_string(&sentences)?);
        }
        return Ok(());
    }

    let started = Instant::now();
    let (mut sentences, mut ids, mut skipped) = (0usize, 0usize, 0usize);
    for paragraph in &paragraphs {
        for sentence in phonemizer.phonemize(&voice, paragraph)? {
            let (sentence_ids, unknown) = id_map.ids(&sentence);
            sentences += 1;
            ids += sentence_ids.len();
            skipped += unknown.len();
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    let started = Instant::now();
    let mut words = 0usize;
    for paragraph in &paragraphs {
        words += phonemizer.phonemize_words(&voice, paragraph)?.words.len();
    }
    let with_words = started.elapsed().as_secs_f64();
    println!(
        "with words: {words} words in {with_words:.3} s ({:.1}x the time of phonemes alone)",
        with_words / seconds
    );
    println!(
        "espeak-ng {}: {} paragraphs, {} chars, {sentences} sentences, {ids} ids ({skipped} phonemes skipped) in {seconds:.3} s = {:.0} sentences/s, {:.0} chars/s",
        phonemizer.espeak_version(),
        paragraphs.len(),
        text.chars().count(),
        sentences as f64 / seconds,
        text.chars().count() as f64 / seconds,
    );
    Ok(())
}
