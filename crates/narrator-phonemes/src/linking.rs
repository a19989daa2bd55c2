//! Piper's visible linking glide `ʲ`, restored from espeak-ng 1.51's ASCII phonemes.
//!
//! espeak-ng inserts a linking phoneme `;` between an i-type vowel and a following vowel
//! ("the other", "very angry", "curiosity"). Its IPA name is meant to be empty after an
//! i-vowel, and in 1.51 it is. The espeak-ng master that Piper 1.8.0 links evaluates that
//! condition wrongly (espeak-ng issue #2367), so Piper prints the glide as `ʲ`
//! (`ðɪʲ ˈʌðɚ`) and its voices were trained on it. 1.51 still shows the `;` in its ASCII
//! mnemonics, so the text is phonemized twice, once in IPA and once in ASCII, both with a
//! phoneme separator; the two outputs list the same phonemes in the same order, and every
//! `;` in the ASCII output becomes `ʲ` at the same place in the IPA output.

/// Separator between phonemes passed to espeak-ng (a private-use code point that never
/// occurs in its output).
pub(crate) const SEPARATOR: char = '\u{E000}';

/// The glide Piper prints for espeak-ng's linking phoneme.
const GLIDE: &str = "ʲ";

/// Merges one clause: `ipa` and `ascii` are the same clause phonemized with
/// [`SEPARATOR`]. Returns the IPA without separators, with `ʲ` where the ASCII has a
/// linking `;` and the IPA nothing. Words whose phoneme counts differ (IPA names that
/// start with a modifier letter get no separator) are left as plain IPA.
pub(crate) fn merge_linking(ipa: &str, ascii: &str) -> String {
    let mut out = String::with_capacity(ipa.len() + 8);
    let ipa_words = ipa.split(' ');
    let ascii_words: Vec<&str> = ascii.split(' ').collect();
    if ipa.split(' ').count() != ascii_words.len() {
        return strip_separators(ipa);
    }
    for (i, (ipa_word, ascii_word)) in ipa_words.zip(ascii_words).enumerate() {
        if i > 0 {
            out.push(' ');
        }
        let ipa_phonemes = ipa_word.split(SEPARATOR);
        let ascii_phonemes = ascii_word.split(SEPARATOR);
        if ipa_phonemes.clone().count() != ascii_phonemes.clone().count() {
            out.push_str(&strip_separators(ipa_word));
            continue;
        }
        for (ipa_ph, ascii_ph) in ipa_phonemes.zip(ascii_phonemes) {
            if ipa_ph.is_empty() && ascii_ph == ";" {
                out.push_str(GLIDE);
            } else {
                out.push_str(ipa_ph);
            }
        }
    }
    out
}

/// Removes [`SEPARATOR`]s (used when no ASCII twin is available).
pub(crate) fn strip_separators(ipa: &str) -> String {
    ipa.chars().filter(|&c| c != SEPARATOR).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sep(s: &str) -> String {
        s.replace('_', &SEPARATOR.to_string())
    }

    #[test]
    fn glide_after_word_final_i_vowel() {
        // 1.51's output for "up the other".
        let ipa = sep("ˌʌ_p ð_ɪ_ ˈʌ_ð_ɚ");
        let ascii = sep(",V_p D_I2_; 'V_D_3");
        assert_eq!(merge_linking(&ipa, &ascii), "ˌʌp ðɪʲ ˈʌðɚ");
    }

    #[test]
    fn glide_inside_a_word_and_pauses_untouched() {
        let ipa = sep("k_j_ˌʊɹ_ɹ_ɪ__ˈɔ_s_ᵻ_ɾ_i");
        let ascii = sep("k_j_,U@_r_I2_;_'O2_s_I#_t#_i");
        assert_eq!(merge_linking(&ipa, &ascii), "kjˌʊɹɹɪʲˈɔsᵻɾi");
        // Pause phonemes ("_:") are also empty in IPA but stay empty.
        let ipa = sep("ˈiː_t__ æ_n_d");
        let ascii = sep("'i:_t__:__: a_n_d");
        assert_eq!(merge_linking(&ipa, &ascii), "ˈiːt ænd");
    }

    #[test]
    fn mismatched_counts_fall_back_to_plain_ipa() {
        let ipa = sep("ð_ɪ_ ˈʌ");
        let ascii = sep("D_I2_; 'V extra");
        assert_eq!(merge_linking(&ipa, &ascii), "ðɪ ˈʌ");
        let ipa = sep("a_b ð_ɪ_");
        let ascii = sep("a_b D_I2_;_x");
        assert_eq!(merge_linking(&ipa, &ascii), "ab ðɪ");
    }
}
