//! The one error type of the crate. Every variant is a user-facing problem with the input
//! (the crate has no other failure modes), so each `Display` is a single line that says
//! what was wrong, names the file, and says what to do. [`TextError::kind`] gives the
//! stable snake_case word used as metric label and `failure_kind` column.

use std::path::PathBuf;

use thiserror::Error;

/// Why an input could not be turned into a [`crate::Document`].
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum TextError {
    /// The path does not exist.
    #[error("input file {path} not found; check the path and spelling")]
    NotFound {
        /// The path as given.
        path: PathBuf,
    },
    /// The path exists but could not be read.
    #[error("cannot read input file {path} ({reason}); check that it is a readable file")]
    Unreadable {
        /// The path as given.
        path: PathBuf,
        /// Short reason, e.g. "permission denied" or "it is a directory".
        reason: String,
        /// The underlying I/O error, when there is one.
        #[source]
        source: Option<std::io::Error>,
    },
    /// The extension is not one of the supported ones (or EPUB was passed as text).
    #[error(
        "cannot read {path}: unsupported input format {found:?}; use a .txt, .md, .markdown or .epub file"
    )]
    UnsupportedFormat {
        /// The path as given.
        path: PathBuf,
        /// The extension (or format) that was found.
        found: String,
    },
    /// Zero bytes, or nothing but whitespace.
    #[error("input file {path} is empty; give a file with some text in it")]
    Empty {
        /// The path as given.
        path: PathBuf,
    },
    /// NUL bytes or many control characters near the start.
    #[error(
        "input file {path} looks binary, not text; give a UTF-8 .txt/.md file or an .epub (convert PDF or DOCX to text first)"
    )]
    Binary {
        /// The path as given.
        path: PathBuf,
    },
    /// Not valid UTF-8.
    #[error(
        "input file {path} is not valid UTF-8 (first bad byte at offset {offset}); convert it first, e.g. `iconv -f WINDOWS-1252 -t UTF-8 in.txt > out.txt` (or -f UTF-16 for Notepad 'Unicode' files)"
    )]
    InvalidUtf8 {
        /// The path as given.
        path: PathBuf,
        /// Byte offset of the first invalid byte.
        offset: usize,
    },
    /// Larger than [`crate::LoadOptions::max_bytes`].
    #[error(
        "input file {path} is too large: {} is over the limit of {}; pass --max-input-mb with a larger value to raise it",
        human_size(*size),
        human_size(*limit)
    )]
    TooLarge {
        /// The path as given.
        path: PathBuf,
        /// The size found, in bytes (for EPUB: uncompressed chapter text).
        size: u64,
        /// The limit, in bytes.
        limit: u64,
    },
    /// The file is not a readable EPUB (not a zip, no package file, empty spine...).
    #[error(
        "EPUB {path} is broken: {reason}; re-export it (e.g. with Calibre) or convert it to text"
    )]
    EpubBroken {
        /// The path as given.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
        /// The zip error, when the archive itself could not be read.
        #[source]
        source: Option<zip::result::ZipError>,
    },
    /// A document inside the EPUB is not well-formed XML.
    #[error(
        "EPUB {path} is broken: {entry} is not well-formed XHTML at line {line}, column {column}; repair it (e.g. re-save the book in Calibre) or convert it to text"
    )]
    EpubMalformed {
        /// The path as given.
        path: PathBuf,
        /// The entry inside the archive.
        entry: String,
        /// 1-based line of the error.
        line: u32,
        /// 1-based column of the error.
        column: u32,
        /// The parser's error.
        #[source]
        source: roxmltree::Error,
    },
    /// The cover named by the book (front matter) or a flag cannot be used.
    #[error("cover {cover} of {path} cannot be used: {reason}")]
    Cover {
        /// The book.
        path: PathBuf,
        /// The cover file as named.
        cover: String,
        /// What is wrong and what to do.
        reason: String,
    },
    /// After cleaning, no sentence with a letter or digit remains.
    #[error(
        "input file {path} has nothing speakable: after removing markup, symbols and unsupported scripts no sentence is left; check that it is the right file and that the voice speaks its language (`narrator voices` lists their languages)"
    )]
    NothingSpeakable {
        /// The path as given.
        path: PathBuf,
    },
}

impl TextError {
    /// Stable snake_case name of the error kind, for metrics and the `failure_kind` column.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::NotFound { .. } => "not_found",
            Self::Unreadable { .. } => "unreadable",
            Self::UnsupportedFormat { .. } => "unsupported_format",
            Self::Empty { .. } => "empty",
            Self::Binary { .. } => "binary",
            Self::InvalidUtf8 { .. } => "invalid_utf8",
            Self::TooLarge { .. } => "too_large",
            Self::EpubBroken { .. } | Self::EpubMalformed { .. } => "epub_broken",
            Self::NothingSpeakable { .. } => "nothing_speakable",
            Self::Cover { .. } => "cover",
        }
    }

    /// The same error with the control characters of what the input named escaped (an
    /// archive entry, a cover's path, a reason quoting them), so that its message stays one
    /// line, and a terminal shows it as written, whatever a book calls its files.
    pub(crate) fn one_line(self) -> Self {
        match self {
            Self::EpubBroken {
                path,
                reason,
                source,
            } => Self::EpubBroken {
                path,
                reason: escape_controls(&reason),
                source,
            },
            Self::EpubMalformed {
                path,
                entry,
                line,
                column,
                source,
            } => Self::EpubMalformed {
                path,
                entry: escape_controls(&entry),
                line,
                column,
                source,
            },
            Self::Cover {
                path,
                cover,
                reason,
            } => Self::Cover {
                path,
                cover: escape_controls(&cover),
                reason: escape_controls(&reason),
            },
            other => other,
        }
    }
}

/// `text` with its control characters (line breaks, escape sequences) escaped as `\n`,
/// `\u{1b}`: for messages, which are one line.
pub(crate) fn escape_controls(text: &str) -> String {
    if !text.chars().any(char::is_control) {
        return text.to_owned();
    }
    text.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// Bytes as a short human string: exact bytes below 1 MiB, else MiB with one decimal.
fn human_size(bytes: u64) -> String {
    const MIB: u64 = 1024 * 1024;
    if bytes < MIB {
        format!("{bytes} bytes")
    } else {
        let mib = bytes as f64 / MIB as f64;
        format!("{mib:.1} MiB")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_one_line_and_name_the_path() {
        let p = PathBuf::from("/books/x.txt");
        let errors = [
            TextError::NotFound { path: p.clone() },
            TextError::Empty { path: p.clone() },
            TextError::TooLarge {
                path: p.clone(),
                size: 40 * 1024 * 1024,
                limit: 16 * 1024 * 1024,
            },
            TextError::InvalidUtf8 {
                path: p.clone(),
                offset: 17,
            },
        ];
        for e in errors {
            let msg = e.to_string();
            assert!(!msg.contains('\n'), "{msg}");
            assert!(msg.contains("/books/x.txt"), "{msg}");
        }
    }

    #[test]
    fn too_large_says_sizes_and_flag() {
        let e = TextError::TooLarge {
            path: PathBuf::from("b.txt"),
            size: 40 * 1024 * 1024,
            limit: 16 * 1024 * 1024,
        };
        let msg = e.to_string();
        assert!(
            msg.contains("40.0 MiB") && msg.contains("16.0 MiB"),
            "{msg}"
        );
        assert!(msg.contains("--max-input-mb"), "{msg}");
        assert_eq!(e.kind(), "too_large");
    }
}
