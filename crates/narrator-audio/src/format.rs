//! [`AudioFormat`]: the names of the output formats narrator can write.
//!
//! Parsing, display and serde all use the same lowercase word (`wav`, `opus`, `mp3`, `m4b`),
//! which is also the file extension, so CLI flags, config files, job messages and file
//! names never disagree.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::AudioError;

/// An output container/codec.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AudioFormat {
    /// 16-bit PCM mono at the model's rate: lossless, large (~155 MB per hour at 22050 Hz).
    Wav,
    /// Ogg Opus at 48 kHz, ~40 kbit/s, with chapter tags: small, best quality per byte.
    Opus,
    /// MP3 (LAME) at the model's rate, 64 kbit/s CBR: plays everywhere.
    Mp3,
    /// M4B: AAC-LC at the model's rate, 64 kbit/s, in an MP4 container with a chapter
    /// track, book tags and cover; what audiobook players and stores expect. One file
    /// for the whole book (no chapter files).
    M4b,
}

impl AudioFormat {
    /// Every format, in the order shown to users.
    pub const ALL: [AudioFormat; 4] = [
        AudioFormat::Wav,
        AudioFormat::Opus,
        AudioFormat::Mp3,
        AudioFormat::M4b,
    ];

    /// The file extension, without the dot; the same word as `Display` and serde.
    pub fn extension(&self) -> &'static str {
        match self {
            AudioFormat::Wav => "wav",
            AudioFormat::Opus => "opus",
            AudioFormat::Mp3 => "mp3",
            AudioFormat::M4b => "m4b",
        }
    }

    /// The MIME type, for object stores and HTTP responses.
    pub fn mime_type(&self) -> &'static str {
        match self {
            AudioFormat::Wav => "audio/wav",
            AudioFormat::Opus => "audio/ogg",
            AudioFormat::Mp3 => "audio/mpeg",
            AudioFormat::M4b => "audio/mp4",
        }
    }

    /// Whether chapters can also get files of their own (all but M4B, whose one file
    /// carries the chapters for the player).
    pub fn supports_chapter_files(&self) -> bool {
        !matches!(self, AudioFormat::M4b)
    }
}

impl fmt::Display for AudioFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.extension())
    }
}

impl FromStr for AudioFormat {
    type Err = AudioError;

    /// Accepts `wav`, `opus`, `mp3` in any case, with or without a leading dot.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let word = s.trim().trim_start_matches('.');
        AudioFormat::ALL
            .into_iter()
            .find(|f| f.extension().eq_ignore_ascii_case(word))
            .ok_or_else(|| AudioError::UnknownFormat {
                given: s.to_owned(),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_displays_and_serializes_the_same_word() {
        for f in AudioFormat::ALL {
            let word = f.to_string();
            assert_eq!(word, f.extension());
            assert_eq!(word.parse::<AudioFormat>().ok(), Some(f));
            assert_eq!(serde_json::to_string(&f).ok(), Some(format!("\"{word}\"")));
        }
        assert_eq!("MP3".parse::<AudioFormat>().ok(), Some(AudioFormat::Mp3));
        assert_eq!(".opus".parse::<AudioFormat>().ok(), Some(AudioFormat::Opus));
    }

    #[test]
    fn unknown_format_lists_the_choices() {
        let err = "flac".parse::<AudioFormat>().err().map(|e| e.to_string());
        let msg = err.unwrap_or_default();
        assert!(msg.contains("\"flac\""), "{msg}");
        assert!(msg.contains("wav, opus, mp3, m4b"), "{msg}");
    }
}
