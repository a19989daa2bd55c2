//! Property tests of the voice files narrator-engine reads, without a model or ONNX
//! Runtime: a Piper voice's JSON config (`VoiceConfig::from_json`, and through
//! `PiperVoice::load` the phoneme id map narrator-phonemes reads from it), the Kokoro
//! voice names and blends (`VoiceSpec::parse`), Kokoro's `vocab.json` (`Vocab::load`) and
//! its voice files (`KokoroVoice::open`, float32 `[510, 256]`). Inputs: arbitrary bytes
//! and text, near-valid structured inputs, and mutations of a real config (the CC0 voice
//! `en_US-joe-medium`'s, in `tests/fixtures/`).
//!
//! Each must return a result or one error of one line, never panic, within the memory
//! and time bounds of the harness (`tests/support/properties.rs`); what it accepts must
//! be usable: a config's speakers and ids answer, a blend's weights are positive and
//! finite, a vocabulary has the space, a voice has its 510 × 256 styles.

#[path = "../../../tests/support/properties.rs"]
mod properties;

use std::path::{Path, PathBuf};

use narrator_engine::kokoro::{self, KokoroVoice, Vocab, VoiceSpec};
use narrator_engine::{EngineError, Family, PiperVoice, VoiceConfig};
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::select;
use proptest::test_runner::TestCaseError;

use properties::{Mutation, check, check_heavy, ensure, mutate, mutations, within_bounds};

/// The real config of the voice `ops/setup.sh` installs (CC0).
const JOE: &str = include_str!("fixtures/en_US-joe-medium.onnx.json");

/// A real `vocab.json` of Kokoro, in part (its punctuation, the space, some letters).
const VOCAB: &str = r#"{"vocab": {";": 1, ":": 2, ",": 3, ".": 4, "!": 5, "?": 6, "—": 9, "…": 10, "\"": 11, "(": 12, ")": 13, "“": 14, "”": 15, " ": 16, "̃": 17, "ʣ": 18, "a": 43, "b": 44, "d": 46, "e": 47, "h": 50, "i": 51, "k": 53, "l": 54, "n": 56, "o": 57, "s": 61, "t": 62, "ð": 81, "ə": 83, "ɪ": 102, "ˈ": 156, "ˌ": 157}}"#;

/// Bytes of one Kokoro voice file.
const STYLE_BYTES: usize = kokoro::STYLE_ROWS * kokoro::STYLE_DIM * 4;

fn one_line(e: &EngineError) -> Result<(), TestCaseError> {
    properties::note(e.kind());
    let line = e.to_string();
    ensure(!line.contains('\n') && !line.is_empty(), || {
        format!("{} error is not one line: {line:?}", e.kind())
    })
}

/// What a JSON config is made of.
const TOKENS: &[&str] = &[
    "{",
    "}",
    "[",
    "]",
    ",",
    ":",
    "\"",
    "\\",
    "\\u0000",
    "\\ud800",
    "null",
    "true",
    "-1",
    "0",
    "1e999",
    "-0.0",
    "4294967296",
    "18446744073709551616",
    "NaN",
    "\"\"",
    "[[[[",
    "\"phoneme_id_map\"",
    "\"num_speakers\"",
    "\"sample_rate\"",
    "\"espeak\"",
    "\"voice\"",
    "\"speaker_id_map\"",
    "\"vowel_clusters\"",
    "\"phoneme_type\"",
    "\u{feff}",
    "\u{0}",
    "é",
];

/// Edits of the parsed JSON: values of the right type, of the wrong type, or gone.
#[derive(Debug, Clone)]
enum Edit {
    Set(&'static str, Json),
    Remove(&'static str),
}

/// A JSON value from a small set of hostile ones.
#[derive(Debug, Clone)]
enum Json {
    Int(i64),
    Big(u64),
    Float(f64),
    Text(String),
    Null,
    Ids(Vec<i64>),
    Map(Vec<(String, Vec<i64>)>),
    Clusters(Vec<Vec<String>>),
    Deep(usize),
}

impl Json {
    fn value(&self) -> serde_json::Value {
        use serde_json::{Value, json};
        match self {
            Json::Int(i) => json!(i),
            Json::Big(u) => json!(u),
            Json::Float(f) => serde_json::Number::from_f64(*f).map_or(Value::Null, Value::Number),
            Json::Text(s) => json!(s),
            Json::Null => Value::Null,
            Json::Ids(ids) => json!(ids),
            Json::Map(m) => Value::Object(m.iter().map(|(k, v)| (k.clone(), json!(v))).collect()),
            Json::Clusters(c) => json!(c),
            Json::Deep(depth) => {
                let mut v = json!(1);
                for _ in 0..*depth {
                    v = json!([v]);
                }
                v
            }
        }
    }
}

fn json_value() -> impl Strategy<Value = Json> {
    prop_oneof![
        any::<i64>().prop_map(Json::Int),
        prop_oneof![Just(0u64), Just(u64::from(u32::MAX) + 1), any::<u64>()].prop_map(Json::Big),
        prop_oneof![
            Just(0.0),
            Just(-1.0),
            Just(f64::MAX),
            Just(1e-300),
            any::<f64>()
        ]
        .prop_map(Json::Float),
        "\\PC{0,12}".prop_map(Json::Text),
        Just(Json::Null),
        vec(any::<i64>(), 0..4).prop_map(Json::Ids),
        vec(("\\PC{0,3}", vec(-3i64..300, 0..3)), 0..12).prop_map(Json::Map),
        vec(vec("[a-zə]{1,2}", 0..6), 0..8).prop_map(Json::Clusters),
        (1usize..200).prop_map(Json::Deep),
    ]
}

fn edit() -> impl Strategy<Value = Edit> {
    let key = select(
        &[
            "/audio/sample_rate",
            "/audio/quality",
            "/espeak/voice",
            "/inference/noise_scale",
            "/inference/length_scale",
            "/inference/noise_w",
            "/phoneme_id_map",
            "/phoneme_id_map/_",
            "/phoneme_id_map/^",
            "/phoneme_id_map/$",
            "/phoneme_id_map/a",
            "/num_speakers",
            "/speaker_id_map",
            "/language/code",
            "/phoneme_type",
            "/vowel_clusters",
        ][..],
    );
    prop_oneof![
        4 => (key.clone(), json_value()).prop_map(|(k, v)| Edit::Set(k, v)),
        1 => key.prop_map(Edit::Remove),
    ]
}

/// The real config with `edits` made to its JSON.
fn edited(edits: &[Edit]) -> String {
    let mut json: serde_json::Value = serde_json::from_str(JOE).expect("the fixture is JSON");
    for e in edits {
        let (path, new) = match e {
            Edit::Set(path, v) => (*path, Some(v.value())),
            Edit::Remove(path) => (*path, None),
        };
        let (parent, key) = path.rsplit_once('/').unwrap_or(("", path));
        let Some(serde_json::Value::Object(map)) = json.pointer_mut(parent) else {
            continue;
        };
        match new {
            Some(v) => {
                map.insert(key.to_owned(), v);
            }
            None => {
                map.remove(key);
            }
        }
    }
    json.to_string()
}

/// A config as text: arbitrary, the real one mutated, or the real one edited.
#[derive(Debug, Clone)]
enum ConfigInput {
    Text(String),
    Bytes(Vec<u8>),
    Mutated(Vec<Mutation>),
    Edited(Vec<Edit>),
}

fn config_input() -> impl Strategy<Value = ConfigInput> {
    prop_oneof![
        1 => "\\PC{0,400}".prop_map(ConfigInput::Text),
        1 => vec(any::<u8>(), 0..1_024).prop_map(ConfigInput::Bytes),
        3 => mutations(TOKENS).prop_map(ConfigInput::Mutated),
        3 => vec(edit(), 1..6).prop_map(ConfigInput::Edited),
    ]
}

impl ConfigInput {
    fn bytes(&self) -> Vec<u8> {
        match self {
            ConfigInput::Text(t) => t.clone().into_bytes(),
            ConfigInput::Bytes(b) => b.clone(),
            ConfigInput::Mutated(edits) => mutate(JOE.as_bytes().to_vec(), edits),
            ConfigInput::Edited(edits) => edited(edits).into_bytes(),
        }
    }
}

#[test]
fn the_real_config_loads() {
    let c = VoiceConfig::from_json(Path::new("joe.onnx.json"), JOE).expect("parses");
    assert_eq!((c.sample_rate, c.espeak_voice.as_str()), (22_050, "en-us"));
}

#[test]
fn piper_voice_configs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let model = dir.path().join("v.onnx");
    let config = dir.path().join("v.onnx.json");
    check(
        "voice_config_piper",
        (config_input(), "\\PC{0,8}"),
        |(input, speaker)| {
            let bytes = input.bytes();
            std::fs::write(&config, &bytes).expect("write");
            // The text parser, on the text as a file reader would give it.
            let text = String::from_utf8_lossy(&bytes);
            let parsed = within_bounds(bytes.len(), || {
                VoiceConfig::from_json(Path::new("v.onnx.json"), &text)
            })?;
            if let Err(e) = &parsed {
                one_line(e)?;
            }
            // The whole voice as `narrator` loads it: config and phoneme id map.
            let voice = match within_bounds(bytes.len(), || PiperVoice::load(&model))? {
                Ok(v) => v,
                Err(e) => return one_line(&e),
            };
            properties::note("ok");
            ensure(parsed.is_ok(), || {
                "the voice loads but its config does not".into()
            })?;
            // The rate it runs at is the one the config says, and a rate.
            let declared = serde_json::from_str::<serde_json::Value>(&text)
                .ok()
                .and_then(|v| v.pointer("/audio/sample_rate").and_then(|r| r.as_u64()));
            ensure(
                voice.config.sample_rate > 0
                    && declared == Some(u64::from(voice.config.sample_rate)),
                || {
                    format!(
                        "sample rate {} accepted from audio.sample_rate {declared:?}",
                        voice.config.sample_rate
                    )
                },
            )?;
            // What is accepted answers.
            let _ = voice.config.speakers();
            match voice.config.speaker_id("v", &speaker) {
                Ok(id) => ensure(
                    id < voice.config.num_speakers.max(1)
                        || voice.config.speakers().iter().any(|(_, i)| *i == id),
                    || format!("speaker {speaker:?} gave id {id}"),
                )?,
                Err(e) => one_line(&e)?,
            }
            let phonemes: Vec<String> = ["h", "ə", "l", "ˈ", "oʊ", " ", "?"]
                .iter()
                .map(|s| (*s).to_owned())
                .collect();
            let _ = voice.phoneme_ids(&phonemes);
            let _ = (voice.info(), voice.capabilities());
            Ok(())
        },
    );
}

/// A voice name as a user may type it: a catalog voice, a blend with weights of every
/// kind, or anything.
fn voice_name() -> impl Strategy<Value = String> {
    let voice = prop_oneof![
        4 => select(kokoro::VOICES).prop_map(|(n, _)| n.to_owned()),
        1 => "[a-z_]{0,12}",
        1 => Just("en_US-joe-medium".to_owned()),
    ];
    let weight = prop_oneof![
        "[0-9]{1,3}",
        "[0-9]\\.[0-9]{1,3}",
        select(
            &[
                "0", "-1", "nan", "NaN", "inf", "-inf", "1e40", "1e-50", "", " 2 ", "+3", "0x1",
                "1_0", "３",
            ][..]
        )
        .prop_map(str::to_owned),
    ];
    prop_oneof![
        3 => vec((voice, prop::option::of(weight)), 1..5).prop_map(|parts| {
            parts
                .iter()
                .map(|(v, w)| match w {
                    Some(w) => format!("{v}:{w}"),
                    None => v.clone(),
                })
                .collect::<Vec<_>>()
                .join("+")
        }),
        1 => "\\PC{0,40}",
        1 => vec(select(&["+", ":", " ", "af_heart", "1", "."][..]), 0..10).prop_map(|p| p.concat()),
    ]
}

#[test]
fn kokoro_voice_names_and_blends() {
    check("voice_spec_kokoro", voice_name(), |name| {
        let parsed = within_bounds(name.len(), || VoiceSpec::parse(&name))?;
        let spec = match parsed {
            Ok(Some(spec)) => spec,
            Ok(None) => {
                properties::note("not_kokoro");
                return Ok(());
            }
            Err(e) => return one_line(&e),
        };
        properties::note("ok");
        ensure(!spec.parts.is_empty(), || "a blend of nothing".into())?;
        for (i, (v, w)) in spec.parts.iter().enumerate() {
            ensure(w.is_finite() && *w > 0.0, || format!("{v} has weight {w}"))?;
            ensure(kokoro::VOICES.iter().any(|(n, _)| n == v), || {
                format!("{v} is no Kokoro voice")
            })?;
            ensure(!spec.parts[..i].iter().any(|(o, _)| o == v), || {
                format!("{v} is named twice")
            })?;
        }
        let _ = spec.lead();
        // What it prints reads back as the same voice: the same parents with the same
        // weights (a lone voice is printed without its weight, which changes nothing).
        let again = VoiceSpec::parse(&spec.to_string());
        let same = match &again {
            Ok(Some(s)) if spec.parts.len() == 1 => {
                s.parts.len() == 1 && s.parts[0].0 == spec.parts[0].0
            }
            Ok(Some(s)) => *s == spec,
            _ => false,
        };
        ensure(same, || format!("{spec} reads back as {again:?}"))?;
        // Finding it in a folder without voices fails in words, whatever the name.
        let _ = narrator_engine::Voice::find(Path::new("/nonexistent/narrator-voices"), &name);
        Ok(())
    });
}

/// A Kokoro installation in a folder of its own: an empty `model.onnx` (only its presence
/// is checked before a session opens), a vocabulary and voice files.
struct Install {
    dir: tempfile::TempDir,
}

impl Install {
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("model.onnx"), b"").expect("model");
        std::fs::create_dir(dir.path().join("voices")).expect("voices");
        Self { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn vocab(&self) -> PathBuf {
        self.path().join("vocab.json")
    }
}

/// A vocabulary: arbitrary, the real one mutated, or one of random entries.
#[derive(Debug, Clone)]
enum VocabInput {
    Bytes(Vec<u8>),
    Mutated(Vec<Mutation>),
    Entries(Vec<(String, Json)>),
}

fn vocab_input() -> impl Strategy<Value = VocabInput> {
    prop_oneof![
        1 => vec(any::<u8>(), 0..512).prop_map(VocabInput::Bytes),
        3 => mutations(TOKENS).prop_map(VocabInput::Mutated),
        2 => vec(
            (
                prop_oneof![Just(" ".to_owned()), "\\PC{0,3}"],
                prop_oneof![4 => (1i64..200).prop_map(Json::Int), 1 => json_value()],
            ),
            0..16,
        )
        .prop_map(VocabInput::Entries),
    ]
}

impl VocabInput {
    fn bytes(&self) -> Vec<u8> {
        match self {
            VocabInput::Bytes(b) => b.clone(),
            VocabInput::Mutated(edits) => mutate(VOCAB.as_bytes().to_vec(), edits),
            VocabInput::Entries(entries) => {
                let map: serde_json::Map<String, serde_json::Value> = entries
                    .iter()
                    .map(|(k, v)| (k.clone(), v.value()))
                    .collect();
                serde_json::json!({ "vocab": map }).to_string().into_bytes()
            }
        }
    }
}

#[test]
fn kokoro_vocabularies() {
    let install = Install::new();
    check("vocab_kokoro", vocab_input(), |input| {
        let bytes = input.bytes();
        std::fs::write(install.vocab(), &bytes).expect("write");
        let vocab = match within_bounds(bytes.len(), || Vocab::load(&install.vocab()))? {
            Ok(v) => v,
            Err(e) => return one_line(&e),
        };
        properties::note("ok");
        let phonemes: Vec<String> = ["h", "ə", "l", "oʊ", " ", "ð", "\u{0}", ""]
            .iter()
            .map(|s| (*s).to_owned())
            .collect();
        let (ids, _) = vocab.ids(&phonemes);
        ensure(ids.iter().all(|&i| i > 0), || format!("ids {ids:?}"))
    });
}

/// A voice file: its length (near the right one, or anything) and a fill byte.
#[derive(Debug, Clone)]
struct StyleFile {
    len: usize,
    fill: u8,
}

fn style_file() -> impl Strategy<Value = StyleFile> {
    (
        prop_oneof![
            2 => Just(STYLE_BYTES),
            2 => (STYLE_BYTES - 8)..(STYLE_BYTES + 8),
            1 => 0usize..4_096,
            1 => 0usize..(2 * STYLE_BYTES),
        ],
        any::<u8>(),
    )
        .prop_map(|(len, fill)| StyleFile { len, fill })
}

#[test]
fn kokoro_voice_files() {
    let install = Install::new();
    std::fs::write(install.vocab(), VOCAB).expect("vocab");
    check_heavy(
        "voice_file_kokoro",
        (
            vec(
                (
                    select(&kokoro::VOICES[..8]).prop_map(|(n, _)| n),
                    style_file(),
                ),
                1..3,
            ),
            0usize..600,
        ),
        |(files, n)| {
            let mut total = 0;
            for (name, file) in &files {
                let path = install.path().join(format!("voices/{name}.bin"));
                std::fs::write(&path, vec![file.fill; file.len]).expect("write");
                total += file.len;
            }
            let spec_name = files
                .iter()
                .map(|(name, _)| format!("{name}:1"))
                .collect::<Vec<_>>()
                .join("+");
            let Ok(Some(spec)) = VoiceSpec::parse(&spec_name) else {
                // The same voice twice: refused before any file is read.
                properties::note("bad_blend");
                return Ok(());
            };
            let opened = within_bounds(total, || KokoroVoice::open(install.path(), &spec))?;
            let right = files.iter().all(|(_, f)| f.len == STYLE_BYTES);
            match opened {
                Ok(voice) => {
                    properties::note("ok");
                    ensure(right, || "a voice file of the wrong size was read".into())?;
                    ensure(voice.style(n).len() == kokoro::STYLE_DIM, || {
                        format!("style row for {n} ids")
                    })
                }
                Err(e) => {
                    ensure(!right, || format!("good voice files refused: {e}"))?;
                    one_line(&e)
                }
            }
        },
    );
}
