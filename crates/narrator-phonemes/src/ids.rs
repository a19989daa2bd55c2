//! Phonemes → model input ids, as Piper's `phonemes_to_ids` does it: BOS `^`, then PAD
//! `_` after every phoneme (and after BOS), then EOS `$`. Phonemes missing from the
//! voice's map are skipped and reported. Voices with `vowel_clusters` get adjacent
//! vowels merged first, as Piper does per sentence.

use std::collections::{HashMap, HashSet};

use serde_json::Value;

use crate::PhonemeError;
use crate::error::VoiceConfigProblem;

const BOS: &str = "^";
const EOS: &str = "$";
const PAD: &str = "_";

/// A voice's `phoneme_id_map` (and `vowel_clusters`), ready to turn phonemes into ids.
#[derive(Debug, Clone)]
pub struct PhonemeIdMap {
    map: HashMap<String, Vec<i64>>,
    bos: Vec<i64>,
    eos: Vec<i64>,
    pad: Vec<i64>,
    /// Clusters of phonemes merged into one before lookup; `None` for most voices.
    vowel_clusters: Option<VowelClusters>,
}

#[derive(Debug, Clone)]
struct VowelClusters {
    set: HashSet<Vec<String>>,
    max_len: usize,
}

impl PhonemeIdMap {
    /// Reads `phoneme_id_map` (and the optional `vowel_clusters`) from a Piper voice
    /// config (the voice's `.onnx.json`, parsed).
    pub fn from_voice_config(json: &Value) -> Result<Self, PhonemeError> {
        let object = json
            .get("phoneme_id_map")
            .and_then(Value::as_object)
            .ok_or(VoiceConfigProblem::MissingIdMap)?;
        let mut map = HashMap::with_capacity(object.len());
        for (phoneme, ids) in object {
            let ids = ids
                .as_array()
                .and_then(|list| list.iter().map(Value::as_i64).collect::<Option<Vec<_>>>())
                .ok_or_else(|| VoiceConfigProblem::BadIds(phoneme.clone()))?;
            map.insert(phoneme.clone(), ids);
        }
        let special = |symbol: &'static str| {
            map.get(symbol)
                .cloned()
                .ok_or(VoiceConfigProblem::MissingSymbol(symbol))
        };
        let (bos, eos, pad) = (special(BOS)?, special(EOS)?, special(PAD)?);
        let vowel_clusters = match json.get("vowel_clusters") {
            None | Some(Value::Null) => None,
            Some(value) => VowelClusters::parse(value)?,
        };
        Ok(PhonemeIdMap {
            map,
            bos,
            eos,
            pad,
            vowel_clusters,
        })
    }

    /// The ids for one sentence of phonemes, with BOS, PAD and EOS as Piper adds them,
    /// and the phonemes that were skipped because the voice has no id for them.
    pub fn ids(&self, phonemes: &[String]) -> (Vec<i64>, Vec<String>) {
        let (ids, unknown, _) = self.ids_with_sources(phonemes);
        (ids, unknown)
    }

    /// [`PhonemeIdMap::ids`] with, for each id, the index in `phonemes` it was made
    /// from: a phoneme's ids and the PAD after them are its own (a merged vowel cluster's
    /// are its first phoneme's); BOS, the first PAD and EOS are `None`.
    pub fn ids_with_sources(
        &self,
        phonemes: &[String],
    ) -> (Vec<i64>, Vec<String>, Vec<Option<usize>>) {
        let merged;
        let (phonemes, firsts): (&[String], Vec<usize>) = match &self.vowel_clusters {
            Some(clusters) => {
                let (m, firsts) = clusters.merge(phonemes);
                merged = m;
                (merged.as_slice(), firsts)
            }
            None => (phonemes, (0..phonemes.len()).collect()),
        };
        let mut ids = Vec::with_capacity(2 * phonemes.len() + 3);
        let mut sources = Vec::with_capacity(2 * phonemes.len() + 3);
        let mut unknown = Vec::new();
        ids.extend_from_slice(&self.bos);
        ids.extend_from_slice(&self.pad);
        sources.resize(ids.len(), None);
        for (phoneme, &source) in phonemes.iter().zip(&firsts) {
            match self.map.get(phoneme) {
                Some(phoneme_ids) => {
                    ids.extend_from_slice(phoneme_ids);
                    ids.extend_from_slice(&self.pad);
                    sources.resize(ids.len(), Some(source));
                }
                None => unknown.push(phoneme.clone()),
            }
        }
        ids.extend_from_slice(&self.eos);
        sources.resize(ids.len(), None);
        (ids, unknown, sources)
    }

    /// Whether the voice has an id for `phoneme`.
    pub fn contains(&self, phoneme: &str) -> bool {
        self.map.contains_key(phoneme)
    }

    /// Number of phonemes in the map.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// True for an empty map (never the case for a map built by `from_voice_config`).
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

impl VowelClusters {
    fn parse(value: &Value) -> Result<Option<Self>, PhonemeError> {
        let list = value
            .as_array()
            .ok_or(VoiceConfigProblem::BadVowelClusters)?;
        let mut set = HashSet::new();
        for cluster in list {
            let cluster = cluster
                .as_array()
                .and_then(|items| {
                    items
                        .iter()
                        .map(|v| v.as_str().map(str::to_owned))
                        .collect::<Option<Vec<_>>>()
                })
                .ok_or(VoiceConfigProblem::BadVowelClusters)?;
            set.insert(cluster);
        }
        let max_len = set.iter().map(Vec::len).max().unwrap_or(0);
        // Piper ignores an empty list; clusters of one phoneme can never merge anything.
        Ok((max_len >= 2).then_some(VowelClusters { set, max_len }))
    }

    /// Piper's `_merge_known_vowel_clusters`: at each position the longest known cluster
    /// (of at least two phonemes) is joined into one phoneme. With each merged phoneme,
    /// the index of its first.
    fn merge(&self, phonemes: &[String]) -> (Vec<String>, Vec<usize>) {
        let mut out = Vec::with_capacity(phonemes.len());
        let mut firsts = Vec::with_capacity(phonemes.len());
        let mut i = 0;
        while i < phonemes.len() {
            let longest = (2..=self.max_len.min(phonemes.len() - i))
                .rev()
                .find(|&n| self.set.contains(&phonemes[i..i + n]));
            firsts.push(i);
            match longest {
                Some(n) => {
                    out.push(phonemes[i..i + n].concat());
                    i += n;
                }
                None => {
                    out.push(phonemes[i].clone());
                    i += 1;
                }
            }
        }
        (out, firsts)
    }
}

/// The espeak-ng voice a Piper voice config asks for (`espeak.voice`, e.g. `en-us`);
/// an error for voices whose `phoneme_type` is not `espeak`.
pub fn espeak_voice_of(json: &Value) -> Result<&str, PhonemeError> {
    if let Some(kind) = json.get("phoneme_type").and_then(Value::as_str)
        && kind != "espeak"
    {
        return Err(VoiceConfigProblem::UnsupportedPhonemeType(kind.to_owned()).into());
    }
    json.get("espeak")
        .and_then(|espeak| espeak.get("voice"))
        .and_then(Value::as_str)
        .ok_or_else(|| VoiceConfigProblem::MissingEspeakVoice.into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn phonemes(s: &str) -> Vec<String> {
        s.chars().map(String::from).collect()
    }

    fn small_map() -> Value {
        json!({
            "espeak": {"voice": "en-us"},
            "phoneme_type": "espeak",
            "phoneme_id_map": {"_": [0], "^": [1], "$": [2], " ": [3], "a": [14], "b": [15], "ab": [99]}
        })
    }

    #[test]
    fn ids_interleave_pad_and_report_unknown() {
        let map = PhonemeIdMap::from_voice_config(&small_map()).expect("valid config");
        let (ids, unknown) = map.ids(&phonemes("a b?"));
        assert_eq!(ids, vec![1, 0, 14, 0, 3, 0, 15, 0, 2]);
        assert_eq!(unknown, vec!["?".to_owned()]);
        let (_, _, sources) = map.ids_with_sources(&phonemes("a b?"));
        let each = [
            None,
            None,
            Some(0),
            Some(0),
            Some(1),
            Some(1),
            Some(2),
            Some(2),
        ];
        assert_eq!(sources, [&each[..], &[None]].concat());
        let (ids, unknown) = map.ids(&[]);
        assert_eq!(ids, vec![1, 0, 2]);
        assert!(unknown.is_empty());
    }

    #[test]
    fn vowel_clusters_merge_longest_first() {
        let mut config = small_map();
        config["vowel_clusters"] = json!([["a", "b"]]);
        let map = PhonemeIdMap::from_voice_config(&config).expect("valid config");
        let (ids, _) = map.ids(&phonemes("aab"));
        assert_eq!(ids, vec![1, 0, 14, 0, 99, 0, 2]);
        let (_, _, sources) = map.ids_with_sources(&phonemes("aab"));
        assert_eq!(
            sources,
            vec![None, None, Some(0), Some(0), Some(1), Some(1), None]
        );
    }

    #[test]
    fn config_errors_are_specific() {
        let kind_of = |v: Value| {
            PhonemeIdMap::from_voice_config(&v)
                .err()
                .map(|e| (e.kind(), e.to_string()))
        };
        let (kind, message) = kind_of(json!({})).expect("must fail");
        assert_eq!(kind, "voice_config");
        assert!(message.contains("no phoneme_id_map"), "{message}");
        let (_, message) =
            kind_of(json!({"phoneme_id_map": {"^": [1], "$": [2]}})).expect("must fail");
        assert!(message.contains("'_'"), "{message}");
        let (_, message) = kind_of(json!({"phoneme_id_map": {"^": ["x"]}})).expect("must fail");
        assert!(message.contains("'^'"), "{message}");
        assert_eq!(espeak_voice_of(&small_map()).ok(), Some("en-us"));
        assert!(espeak_voice_of(&json!({"phoneme_type": "text"})).is_err());
    }
}
