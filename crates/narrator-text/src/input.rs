//! Input gatekeeping: the only module that touches the file system. It turns a path into
//! checked text (or an opened EPUB archive) and hands it to the format parser.
//!
//! Checks run cheapest first and each maps to one [`TextError`] variant, so a user gets
//! the most useful message: missing file → unsupported extension → too large (from the
//! metadata, before reading) → empty → binary (NUL bytes / control characters in the
//! first 8 KiB) → UTF-16 or invalid UTF-8 (with the byte offset). Text given in memory
//! (stdin) goes through the same checks except the file ones.

use std::fs::File;
use std::io::{self, Read, Seek};
use std::path::Path;

use crate::{Document, InputFormat, LoadOptions, TextError, build, epub, markdown, plain};

/// Name used in error messages for input that did not come from a file.
pub(crate) const STDIN_ORIGIN: &str = "<stdin>";

/// How many leading bytes the binary sniffing looks at.
const SNIFF_BYTES: usize = 8 * 1024;

pub(crate) fn load(path: &Path, opts: &LoadOptions) -> Result<Document, TextError> {
    let meta = std::fs::metadata(path).map_err(|e| io_error(path, e))?;
    if meta.is_dir() {
        return Err(TextError::Unreadable {
            path: path.to_path_buf(),
            reason: "it is a directory".to_owned(),
            source: None,
        });
    }
    let Some(format) = InputFormat::from_path(path) else {
        let found = path
            .extension()
            .map(|e| format!(".{}", e.to_string_lossy()))
            .unwrap_or_else(|| "no extension".to_owned());
        return Err(TextError::UnsupportedFormat {
            path: path.to_path_buf(),
            found,
        });
    };
    if meta.len() == 0 {
        return Err(TextError::Empty {
            path: path.to_path_buf(),
        });
    }
    let file = File::open(path).map_err(|e| io_error(path, e))?;
    match format {
        InputFormat::Epub => parse_epub(file, opts, path),
        InputFormat::Text | InputFormat::Markdown => {
            if meta.len() > opts.max_bytes {
                return Err(too_large(path, meta.len(), opts.max_bytes));
            }
            // Read at most one byte past the limit: the file may grow while we read.
            let mut bytes = Vec::new();
            file.take(opts.max_bytes.saturating_add(1))
                .read_to_end(&mut bytes)
                .map_err(|e| io_error(path, e))?;
            if bytes.len() as u64 > opts.max_bytes {
                return Err(too_large(path, bytes.len() as u64, opts.max_bytes));
            }
            let text = decode(&bytes, path)?;
            parse_text(text, format, opts, path)
        }
    }
}

/// A book held in memory, read as a file of `format` would be (the same bounds, the same
/// decoding). `origin` names it in errors.
pub(crate) fn parse_bytes(
    bytes: &[u8],
    format: InputFormat,
    opts: &LoadOptions,
    origin: &Path,
) -> Result<Document, TextError> {
    if bytes.is_empty() {
        return Err(TextError::Empty {
            path: origin.to_path_buf(),
        });
    }
    match format {
        InputFormat::Epub => parse_epub(std::io::Cursor::new(bytes), opts, origin),
        InputFormat::Text | InputFormat::Markdown => {
            if bytes.len() as u64 > opts.max_bytes {
                return Err(too_large(origin, bytes.len() as u64, opts.max_bytes));
            }
            parse_text(decode(bytes, origin)?, format, opts, origin)
        }
    }
}

/// Checks and parses text already in memory. `origin` names it in errors.
pub(crate) fn parse_text(
    text: &str,
    format: InputFormat,
    opts: &LoadOptions,
    origin: &Path,
) -> Result<Document, TextError> {
    if text.len() as u64 > opts.max_bytes {
        return Err(too_large(origin, text.len() as u64, opts.max_bytes));
    }
    check_bytes(text.as_bytes(), origin)?;
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut raw = match format {
        InputFormat::Text => plain::parse(text),
        InputFormat::Markdown => markdown::parse(text),
        InputFormat::Epub => {
            return Err(TextError::UnsupportedFormat {
                path: origin.to_path_buf(),
                found: "EPUB given as text (pass the .epub file itself)".to_owned(),
            });
        }
    };
    if let Some(cover) = raw.cover_path.take() {
        // Relative to the book's folder (to the working folder for stdin).
        let base = match origin.to_str() {
            Some(STDIN_ORIGIN) => Path::new("."),
            _ => origin.parent().unwrap_or(Path::new(".")),
        };
        raw.meta.cover = Some(read_cover(&base.join(&cover), &cover, origin, Some(base))?);
    }
    build::build(raw, opts, origin)
}

/// Parses an EPUB archive from any seekable reader.
pub(crate) fn parse_epub<R: Read + Seek>(
    reader: R,
    opts: &LoadOptions,
    origin: &Path,
) -> Result<Document, TextError> {
    let raw = epub::parse(reader, opts, origin)?;
    build::build(raw, opts, origin)
}

/// Reads a cover image (JPEG or PNG) named `shown` for the book `book`: a regular file
/// (a FIFO or device would block or never end), and, when `inside` is given (a cover the
/// book itself names), one inside that folder once links are resolved: a book's front
/// matter cannot make narrator read files from elsewhere.
pub(crate) fn read_cover(
    path: &Path,
    shown: &str,
    book: &Path,
    inside: Option<&Path>,
) -> Result<narrator_core::Cover, TextError> {
    let problem = |reason: String| TextError::Cover {
        path: book.to_path_buf(),
        cover: shown.to_owned(),
        reason,
    };
    let opened = |e: std::io::Error| {
        problem(format!(
            "{} cannot be opened ({}); fix the path (relative to the book's folder) or leave the cover out",
            path.display(),
            e.kind()
        ))
    };
    if let Some(dir) = inside {
        let real = path.canonicalize().map_err(opened)?;
        let root = dir.canonicalize().map_err(opened)?;
        if !real.starts_with(&root) {
            return Err(problem(format!(
                "{} is outside the book's folder {}; put the cover beside the book, or give it \
                 with --cover",
                real.display(),
                root.display()
            )));
        }
    }
    if !std::fs::metadata(path).map_err(opened)?.is_file() {
        return Err(problem(format!(
            "{} is not a regular file; give a JPEG or PNG file",
            path.display()
        )));
    }
    let file = File::open(path).map_err(|e| {
        problem(format!(
            "{} cannot be opened ({}); fix the path (relative to the book's folder) or leave the cover out",
            path.display(),
            e.kind()
        ))
    })?;
    let mut bytes = Vec::new();
    file.take(narrator_core::MAX_COVER_BYTES as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| problem(format!("{} cannot be read ({})", path.display(), e.kind())))?;
    narrator_core::Cover::from_bytes(bytes).map_err(problem)
}

/// Validates raw bytes as UTF-8 text, after the empty and binary checks.
fn decode<'a>(bytes: &'a [u8], path: &Path) -> Result<&'a str, TextError> {
    // UTF-16 files are full of NUL bytes; say "encoding", not "binary".
    if bytes.starts_with(&[0xff, 0xfe]) || bytes.starts_with(&[0xfe, 0xff]) {
        return Err(TextError::InvalidUtf8 {
            path: path.to_path_buf(),
            offset: 0,
        });
    }
    check_bytes(bytes, path)?;
    std::str::from_utf8(bytes).map_err(|e| TextError::InvalidUtf8 {
        path: path.to_path_buf(),
        offset: e.valid_up_to(),
    })
}

/// Empty / whitespace-only and binary checks shared by files and in-memory text.
fn check_bytes(bytes: &[u8], origin: &Path) -> Result<(), TextError> {
    let blank = |c: char| c.is_whitespace() || c == '\u{feff}';
    if std::str::from_utf8(bytes).is_ok_and(|s| s.chars().all(blank)) {
        return Err(TextError::Empty {
            path: origin.to_path_buf(),
        });
    }
    if looks_binary(bytes) {
        return Err(TextError::Binary {
            path: origin.to_path_buf(),
        });
    }
    Ok(())
}

/// NUL bytes, or more than 10 % control bytes other than whitespace, in the first 8 KiB.
pub(crate) fn looks_binary(bytes: &[u8]) -> bool {
    let head = &bytes[..bytes.len().min(SNIFF_BYTES)];
    if head.contains(&0) {
        return true;
    }
    let control = head
        .iter()
        .filter(|&&b| (b < 0x20 && !matches!(b, b'\t' | b'\n' | b'\r' | 0x0c)) || b == 0x7f)
        .count();
    control * 10 > head.len()
}

fn too_large(path: &Path, size: u64, limit: u64) -> TextError {
    TextError::TooLarge {
        path: path.to_path_buf(),
        size,
        limit,
    }
}

fn io_error(path: &Path, e: io::Error) -> TextError {
    if e.kind() == io::ErrorKind::NotFound {
        TextError::NotFound {
            path: path.to_path_buf(),
        }
    } else {
        TextError::Unreadable {
            path: path.to_path_buf(),
            reason: e.kind().to_string(),
            source: Some(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binary_sniffing() {
        assert!(looks_binary(b"abc\0def"));
        assert!(looks_binary(&[1, 2, 3, 4, 5, b'a']));
        assert!(!looks_binary(b"Hello,\r\n\tworld\x0c"));
        assert!(!looks_binary("caf\u{e9} na\u{ef}ve".as_bytes()));
    }

    #[test]
    fn utf16_is_an_encoding_error_not_binary() {
        let e = decode(&[0xff, 0xfe, b'h', 0, b'i', 0], Path::new("u.txt"));
        assert!(matches!(e, Err(TextError::InvalidUtf8 { offset: 0, .. })));
    }

    #[test]
    fn invalid_utf8_reports_offset() {
        let e = decode(b"hello \xe9t\xe9", Path::new("l1.txt"));
        match e {
            Err(TextError::InvalidUtf8 { offset, .. }) => assert_eq!(offset, 6),
            other => panic!("expected InvalidUtf8, got {other:?}"),
        }
    }
}
