//! Property tests of every parser of narrator-text: plain text, Markdown with YAML front
//! matter, EPUB, and pronunciation lexicons. Each property draws inputs of one kind
//! (arbitrary bytes, arbitrary text, near-valid structured inputs, mutations of real
//! files, bombs) and asserts of every one:
//!
//! - the parser returns (no panic), with a result or one error, and a `TextError` is one
//!   line, as the CLI prints it;
//! - it stays within the memory bound and the time limit of the harness
//!   (`tests/support/properties.rs`: at most 64 MiB + 64 × the input at its peak, counted
//!   by a global allocator; at most 20 s);
//! - a document it returns keeps the model's promises: at least one chapter, no chapter
//!   without paragraphs, no paragraph without sentences, every sentence within the cap and
//!   with a letter or digit in it; a lexicon never makes a sentence longer than its limit.
//!
//! `NARRATOR_PROPTEST_CASES` sets the cases per property (256 by default);
//! `ops/fuzz.sh` runs them by the hundred thousand.

#[path = "../../../tests/support/properties.rs"]
mod properties;

use std::io::Write;
use std::path::{Path, PathBuf};

use narrator_text::{
    Document, InputFormat, Lexicon, LoadOptions, TextError, load_document, parse_document,
    parse_epub_bytes,
};
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::{Index, select};
use proptest::test_runner::TestCaseError;

use properties::{
    Mutation, check, check_heavy, ensure, measure, memory_bound, mutate, mutations, within_bounds,
};

// ---------------------------------------------------------------------------------------
// Real inputs and what every result must satisfy.

/// The shipped sample book.
const SAMPLE_MD: &str = include_str!("../../../examples/sample.md");

/// Front matter with every key narrator reads (no cover: a cover is a file).
const FRONT: &str = "---\ntitle: The Hunting of the Snark\nauthors:\n  - Lewis Carroll\n  - Henry Holiday\nlang: en-GB\nyear: 1876\npublisher: Macmillan\ntags: [verse, nonsense]\n---\n\n";

/// Alice in Wonderland (the corpus beside the checkout), when it is there.
fn alice() -> Option<String> {
    let beside = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/corpus/alice29.txt");
    [beside, PathBuf::from("/work/shared/corpus/alice29.txt")]
        .into_iter()
        .find_map(|p| std::fs::read_to_string(p).ok())
}

/// Real texts to mutate: the sample (plain and with front matter) and slices of Alice.
fn real_texts() -> Vec<String> {
    let mut texts = vec![SAMPLE_MD.to_owned(), format!("{FRONT}{SAMPLE_MD}")];
    if let Some(alice) = alice() {
        // The title page and chapter I, a middle stretch, the end: headings, poems,
        // dialogue.
        let bytes = alice.as_bytes();
        for (from, to) in [
            (0, 12_000),
            (60_000, 66_000),
            (bytes.len() - 6_000, bytes.len()),
        ] {
            texts.push(String::from_utf8_lossy(&bytes[from..to]).into_owned());
        }
    }
    texts
}

/// Options with a random sentence cap and language, keeping an EPUB's looks or not.
fn load_options() -> impl Strategy<Value = LoadOptions> {
    (
        0usize..500,
        select(&["en", "en_US", "de", "fr", "ru", "ja"][..]),
        any::<bool>(),
    )
        .prop_map(|(max_sentence_chars, language, keep_looks)| LoadOptions {
            max_bytes: 1 << 20,
            max_sentence_chars,
            language: language.to_owned(),
            keep_looks,
        })
}

/// What a document must be (see [`Document`]'s fields).
fn check_document(doc: &Document, opts: &LoadOptions) -> Result<(), TestCaseError> {
    let cap = opts.max_sentence_chars.max(1);
    ensure(!doc.chapters.is_empty(), || {
        "a document without chapters".into()
    })?;
    for w in &doc.warnings {
        ensure(!w.chars().any(char::is_control), || {
            format!("a warning is not one line: {w:?}")
        })?;
    }
    for chapter in &doc.chapters {
        ensure(!chapter.paragraphs.is_empty(), || {
            format!("chapter {:?} has no paragraphs", chapter.title)
        })?;
        for p in &chapter.paragraphs {
            ensure(!p.sentences.is_empty(), || {
                "a paragraph without sentences".into()
            })?;
            for s in &p.sentences {
                ensure(s.chars().count() <= cap, || {
                    format!("sentence over the cap of {cap}: {s:?}")
                })?;
                ensure(s.chars().any(char::is_alphanumeric), || {
                    format!("sentence with nothing to say: {s:?}")
                })?;
            }
        }
    }
    Ok(())
}

/// A result is a document that keeps its promises, or one error of one line.
fn check_result(
    result: Result<Document, TextError>,
    opts: &LoadOptions,
) -> Result<(), TestCaseError> {
    match result {
        Ok(doc) => {
            properties::note("ok");
            check_document(&doc, opts)
        }
        Err(e) => {
            properties::note(e.kind());
            let line = e.to_string();
            ensure(
                !line.chars().any(char::is_control) && !line.is_empty(),
                || format!("{} error is not one line: {line:?}", e.kind()),
            )
        }
    }
}

/// A file in a folder of the property's own, rewritten for each case.
struct Scratch {
    _dir: tempfile::TempDir,
    path: PathBuf,
}

impl Scratch {
    fn new(name: &str) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join(name);
        Self { _dir: dir, path }
    }

    fn with_extension(&self, ext: &str) -> PathBuf {
        self.path.with_extension(ext)
    }

    fn write(&self, path: &Path, bytes: &[u8]) {
        let mut f = std::fs::File::create(path).expect("create");
        f.write_all(bytes).expect("write");
    }
}

// ---------------------------------------------------------------------------------------
// Mutations of real inputs.

/// Byte sequences a mutation may splice in: the syntax of every format read here.
const TOKENS: &[&str] = &[
    "\n",
    "\n\n",
    "\r\n",
    "---\n",
    "# ",
    "## ",
    "### ",
    "```\n",
    "> ",
    "- ",
    "1. ",
    "|a|b|\n|-|-|\n",
    "[^1]",
    "[^1]: ",
    "![i](",
    "](",
    "<b>",
    "</b>",
    "<",
    ">",
    "&",
    ";",
    "&nbsp;",
    "&bogus;",
    "&#0;",
    "&#x110000;",
    "&#65;",
    "&amp;",
    "<!DOCTYPE x [<!ENTITY e \"eeee\">]>",
    "&e;",
    "<![CDATA[",
    "]]>",
    "<!--",
    "-->",
    "<p>",
    "</p>",
    "<h1>",
    "</h1>",
    "<br/>",
    "\"",
    "'",
    ": ",
    "title: ",
    "author: ",
    "cover: ",
    "&a ",
    "*a",
    "[",
    "]",
    "{",
    "}",
    "[[",
    "]]",
    "$1",
    "/",
    "=",
    "CHAPTER IV.",
    "Chapter 12",
    "PROLOGUE",
    "Mr.",
    "e.g.",
    "3.50",
    "12:30",
    "$",
    "%",
    "\u{2014}",
    "\u{2026}",
    "\u{feff}",
    "\u{0}",
    "\u{7}",
    "\u{1f600}",
    "\u{6f22}",
    "\u{0301}",
    "\u{202e}",
    "\u{fffd}",
    "\u{10ffff}",
];

// ---------------------------------------------------------------------------------------
// Plain text and Markdown.

/// Pieces that exercise every rule of the text parsers and the normalizer.
const PIECES: &[&str] = &[
    "a",
    "Z",
    "word",
    " ",
    "  ",
    "\n",
    "\n\n",
    "\r\n",
    "\t",
    ".",
    "...",
    "?",
    "!",
    "\u{2026}",
    ",",
    ";",
    ":",
    "-",
    "--",
    "\u{2014}",
    "'",
    "\"",
    "`",
    "\u{201c}",
    "\u{201d}",
    "(",
    ")",
    "[",
    "]",
    "*",
    "_",
    "#",
    "# ",
    "## ",
    "### ",
    "$",
    "\u{a3}",
    "%",
    "&",
    "&c.",
    "1",
    "42",
    "3.50",
    "12:30",
    "1865",
    "21st",
    "pm",
    "Mr.",
    "St.",
    "e.g.",
    "etc.",
    "No.",
    "CHAPTER IV",
    "Chapter 12.",
    "PROLOGUE",
    "Part One",
    "I.",
    "J.",
    "\u{1f600}",
    "\u{200d}",
    "\u{6f22}",
    "\u{0416}",
    "\u{0301}",
    "\u{e9}",
    "\u{feff}",
    "\u{fb01}",
    "\u{202e}",
    "```\n",
    "> ",
    "- ",
    "1. ",
    "[x](y)",
    "![i](j)",
    "<b>",
    "|a|b|\n|-|-|\n",
    "---\n",
    "[^1]",
    "\u{fffd}",
    "\u{10ffff}",
    "\u{e000}",
];

fn pieces_text() -> impl Strategy<Value = String> {
    vec(select(PIECES), 0..300).prop_map(|p| p.concat())
}

/// Any characters at all (proptest's default `String` leaves out control characters),
/// or printable ones only (past the binary check).
fn any_chars() -> impl Strategy<Value = String> {
    prop_oneof![
        vec(any::<char>(), 0..2_000).prop_map(String::from_iter),
        "\\PC{0,2000}",
    ]
}

fn format() -> impl Strategy<Value = InputFormat> {
    prop_oneof![Just(InputFormat::Text), Just(InputFormat::Markdown)]
}

#[test]
fn text_and_markdown_files_of_arbitrary_bytes() {
    let scratch = Scratch::new("in");
    check(
        "text_markdown_arbitrary_bytes",
        (
            prop_oneof![
                vec(any::<u8>(), 0..4_096),
                // Printable ASCII and line breaks: past the binary and UTF-8 checks.
                vec(prop_oneof![8 => 0x20u8..0x7f, 1 => Just(b'\n')], 0..4_096),
                // With high bytes: into the UTF-8 check.
                vec(
                    prop_oneof![8 => 0x20u8..0x7f, 1 => Just(b'\n'), 1 => 0x80u8..=0xff],
                    0..4_096
                ),
            ],
            format(),
            load_options(),
        ),
        |(bytes, format, opts)| {
            let path = scratch.with_extension(match format {
                InputFormat::Markdown => "md",
                _ => "txt",
            });
            scratch.write(&path, &bytes);
            let result = within_bounds(bytes.len(), || load_document(&path, &opts))?;
            check_result(result, &opts)
        },
    );
}

#[test]
fn text_and_markdown_of_arbitrary_text() {
    check(
        "text_markdown_arbitrary_text",
        (
            prop_oneof![any_chars(), pieces_text()],
            format(),
            load_options(),
        ),
        |(text, format, opts)| {
            let result = within_bounds(text.len(), || parse_document(&text, format, &opts))?;
            check_result(result, &opts)
        },
    );
}

#[test]
fn text_and_markdown_mutations_of_real_books() {
    let texts = real_texts();
    let scratch = Scratch::new("in");
    check(
        "text_markdown_mutations",
        (
            0..texts.len(),
            mutations(TOKENS),
            format(),
            load_options(),
            any::<bool>(),
        ),
        |(which, edits, format, opts, file)| {
            let bytes = mutate(texts[which].clone().into_bytes(), &edits);
            let result = if file {
                // As a file: the size, binary and UTF-8 checks first.
                let path = scratch.with_extension(match format {
                    InputFormat::Markdown => "md",
                    _ => "txt",
                });
                scratch.write(&path, &bytes);
                within_bounds(bytes.len(), || load_document(&path, &opts))?
            } else {
                // As text (stdin), decoded lossily: the parsers get every mutation.
                let text = String::from_utf8_lossy(&bytes);
                within_bounds(bytes.len(), || parse_document(&text, format, &opts))?
            };
            check_result(result, &opts)
        },
    );
}

/// A YAML scalar as front matter may hold it.
fn yaml_scalar() -> impl Strategy<Value = String> {
    prop_oneof![
        "[A-Za-z][A-Za-z .,'-]{0,30}",
        "\"[^\"\\\\]{0,20}\"",
        "'[^']{0,20}'",
        "[0-9]{1,6}",
        "-?[0-9]{1,3}\\.[0-9]{1,3}",
        Just("~".to_owned()),
        Just("true".to_owned()),
        Just("".to_owned()),
        Just("|\n  a block\n  of text".to_owned()),
        Just("&anchor value".to_owned()),
        Just("*anchor".to_owned()),
        Just("!!binary aGVsbG8=".to_owned()),
        Just("[unclosed".to_owned()),
        Just("{a: [b, {c: d}]}".to_owned()),
        "\\PC{0,12}",
    ]
}

/// A front matter value: a scalar, a list of them, or a nested mapping.
fn yaml_value() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => yaml_scalar(),
        1 => vec(yaml_scalar(), 0..6).prop_map(|v| format!("[{}]", v.join(", "))),
        1 => vec(yaml_scalar(), 1..5)
            .prop_map(|v| v.iter().map(|s| format!("\n  - {s}")).collect::<String>()),
        1 => vec(("[a-z]{1,6}", yaml_scalar()), 1..4).prop_map(|kv| {
            kv.iter().map(|(k, v)| format!("\n  {k}: {v}")).collect::<String>()
        }),
    ]
}

fn yaml_key() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => select(&[
            "title", "author", "authors", "creator", "language", "lang", "date", "year",
            "publisher", "cover", "cover-image", "cover_image",
        ][..]).prop_map(str::to_owned),
        1 => "[a-z_-]{1,10}",
        1 => "\\PC{1,6}",
    ]
}

/// Markdown with front matter of random keys and values, then headings of every level
/// and paragraphs.
fn markdown_book() -> impl Strategy<Value = String> {
    let front = vec((yaml_key(), yaml_value()), 0..10).prop_map(|kv| {
        let body: String = kv.iter().map(|(k, v)| format!("{k}: {v}\n")).collect();
        format!("---\n{body}---\n\n")
    });
    let block = prop_oneof![
        (1usize..7, "[A-Za-z0-9 .,!?'-]{0,40}")
            .prop_map(|(level, t)| format!("{} {t}\n\n", "#".repeat(level))),
        "[A-Za-z0-9 .,!?'\"*_`-]{1,200}".prop_map(|t| format!("{t}\n\n")),
        pieces_text().prop_map(|t| format!("{t}\n\n")),
        Just("```\ncode();\n```\n\n".to_owned()),
        Just("- one\n- two\n\n> quoted\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n".to_owned()),
    ];
    (
        prop_oneof![3 => front, 1 => Just(String::new())],
        vec(block, 0..20),
    )
        .prop_map(|(front, blocks)| format!("{front}{}", blocks.concat()))
}

#[test]
fn markdown_with_random_front_matter_and_headings() {
    check(
        "markdown_front_matter",
        (
            markdown_book(),
            load_options(),
            prop::option::of(mutations(TOKENS)),
        ),
        |(md, opts, edits)| {
            let md = match edits {
                Some(edits) => {
                    String::from_utf8_lossy(&mutate(md.into_bytes(), &edits)).into_owned()
                }
                None => md,
            };
            let result = within_bounds(md.len(), || {
                parse_document(&md, InputFormat::Markdown, &opts)
            })?;
            check_result(result, &opts)
        },
    );
}

/// Front matter built to take memory or time: aliases of aliases (a "billion laughs"),
/// deep nesting, many nodes.
#[derive(Debug, Clone)]
enum Bomb {
    /// `levels` levels of `fan` aliases each.
    Laughs { levels: usize, fan: usize },
    /// `depth` nested lists under a key, flow (`[[…]]`) or block style.
    Deep { depth: usize, flow: bool },
    /// A list of `items` scalars.
    Wide { items: usize },
}

impl Bomb {
    fn yaml(&self) -> String {
        match *self {
            Bomb::Laughs { levels, fan } => {
                let mut y = format!("a0: &a0 [{}]\n", vec!["\"lol\""; fan].join(", "));
                for l in 1..=levels {
                    let refs = vec![format!("*a{}", l - 1); fan].join(", ");
                    y.push_str(&format!("a{l}: &a{l} [{refs}]\n"));
                }
                y
            }
            Bomb::Deep { depth, flow: true } => {
                format!("x: {}y{}\n", "[".repeat(depth), "]".repeat(depth))
            }
            Bomb::Deep { depth, flow: false } => {
                let mut y = String::from("x:\n");
                for d in 1..=depth {
                    y.push_str(&"  ".repeat(d));
                    y.push_str("-\n");
                }
                y.push_str(&"  ".repeat(depth + 1));
                y.push_str("- y\n");
                y
            }
            Bomb::Wide { items } => format!("list: [{}]\n", vec!["x"; items].join(", ")),
        }
    }

    /// Whether narrator must refuse it: an alias, more than 10,000 nodes or more than 32
    /// levels (the top mapping is the first).
    fn refused(&self) -> bool {
        match *self {
            Bomb::Laughs { .. } => true,
            // The top mapping, then `depth` lists (block style: one more, the innermost).
            Bomb::Deep { depth, flow: true } => 1 + depth > 32,
            Bomb::Deep { depth, flow: false } => 1 + depth + 1 > 32,
            // The mapping, `title`, its value, `list`, the list, the items.
            Bomb::Wide { items } => 5 + items > 10_000,
        }
    }
}

fn bomb() -> impl Strategy<Value = Bomb> {
    prop_oneof![
        (1usize..9, 1usize..16).prop_map(|(levels, fan)| Bomb::Laughs { levels, fan }),
        (1usize..200, any::<bool>()).prop_map(|(depth, flow)| Bomb::Deep { depth, flow }),
        prop_oneof![0usize..12_000, 9_990usize..10_010].prop_map(|items| Bomb::Wide { items }),
    ]
}

#[test]
fn front_matter_bombs_are_refused_within_bounds() {
    let opts = LoadOptions::default();
    check_heavy("markdown_front_matter_bombs", bomb(), |bomb| {
        let md = format!(
            "---\ntitle: Bomb\n{}---\n\n## One\n\nSome text.\n",
            bomb.yaml()
        );
        let doc = within_bounds(md.len(), || {
            parse_document(&md, InputFormat::Markdown, &opts)
        })?
        .map_err(|e| TestCaseError::fail(format!("front matter is never fatal: {e}")))?;
        check_document(&doc, &opts)?;
        properties::note(if doc.title.is_none() {
            "refused"
        } else {
            "read"
        });
        if bomb.refused() {
            ensure(doc.title.is_none(), || {
                "a refused front matter gave a title".into()
            })?;
            ensure(
                doc.warnings.iter().any(|w| w.contains("front matter")),
                || format!("no warning says why: {:?}", doc.warnings),
            )
        } else {
            ensure(doc.title.as_deref() == Some("Bomb"), || {
                format!("front matter within the limits is read: {:?}", doc.warnings)
            })
        }
    });
}

// ---------------------------------------------------------------------------------------
// EPUB.

/// A zip archive of `entries`, each deflated or stored.
fn zip_of(entries: &[(String, Vec<u8>)], stored: bool) -> Vec<u8> {
    use zip::write::SimpleFileOptions;
    let method = if stored {
        zip::CompressionMethod::Stored
    } else {
        zip::CompressionMethod::Deflated
    };
    let options = SimpleFileOptions::default().compression_method(method);
    let mut buf = std::io::Cursor::new(Vec::new());
    {
        let mut zip = zip::ZipWriter::new(&mut buf);
        for (name, body) in entries {
            // A name the zip writer refuses (it checks little) is left out.
            if zip.start_file(name.as_str(), options).is_ok() {
                zip.write_all(body).expect("zip");
            }
        }
        zip.finish().expect("zip");
    }
    buf.into_inner()
}

const CONTAINER: &str = r#"<?xml version="1.0"?>
<container version="1.0" xmlns="urn:oasis:names:tc:opendocument:xmlns:container">
  <rootfiles><rootfile full-path="OEBPS/content.opf" media-type="application/oebps-package+xml"/></rootfiles>
</container>"#;

/// A real EPUB 3 (nav and NCX, two chapters, a non-linear one, metadata), as entries.
fn real_epub_entries() -> Vec<(String, String)> {
    let opf = r##"<?xml version="1.0" encoding="UTF-8"?>
<package xmlns="http://www.idpf.org/2007/opf" version="3.0" unique-identifier="id">
  <metadata xmlns:dc="http://purl.org/dc/elements/1.1/">
    <dc:title>The Test Book</dc:title><dc:identifier id="id">x</dc:identifier>
    <dc:creator id="a1">Lewis Carroll</dc:creator><meta refines="#a1" property="role">aut</meta>
    <dc:language>en-GB</dc:language><dc:date>1865</dc:date><dc:publisher>Macmillan</dc:publisher>
  </metadata>
  <manifest>
    <item id="nav" href="nav.xhtml" media-type="application/xhtml+xml" properties="nav"/>
    <item id="ncx" href="toc.ncx" media-type="application/x-dtbncx+xml"/>
    <item id="c1" href="Text/chapter%201.xhtml" media-type="application/xhtml+xml"/>
    <item id="c2" href="Text/ch2.xhtml" media-type="application/xhtml+xml"/>
    <item id="notes" href="Text/notes.xhtml" media-type="application/xhtml+xml"/>
  </manifest>
  <spine toc="ncx">
    <itemref idref="c1"/><itemref idref="c2"/><itemref idref="notes" linear="no"/>
  </spine>
</package>"##;
    let nav = r#"<?xml version="1.0" encoding="UTF-8"?>
<html xmlns="http://www.w3.org/1999/xhtml" xmlns:epub="http://www.idpf.org/2007/ops"><body>
<nav epub:type="toc"><ol>
  <li><a href="Text/chapter%201.xhtml">CHAPTER I. Arrival</a></li>
  <li><a href="Text/ch2.xhtml#start">The <em>Second</em> Day</a></li>
</ol></nav></body></html>"#;
    let ncx = r#"<?xml version="1.0"?>
<ncx xmlns="http://www.daisy.org/z3986/2005/ncx/" version="2005-1"><navMap>
  <navPoint id="n1"><navLabel><text>NCX one</text></navLabel><content src="Text/chapter%201.xhtml"/></navPoint>
</navMap></ncx>"#;
    let ch1 = r#"<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE html>
<html xmlns="http://www.w3.org/1999/xhtml"><head><title>c1</title><style>p { color: red }</style></head>
<body><h1>Chapter I. Arrival</h1>
<p>It was a cold&nbsp;night&mdash;very cold. Mr.&nbsp;Gray arrived at 3:45 pm with $3.50.</p>
<script>document.write("no")</script>
<div><p>Caf&eacute; lights &amp; rain.</p></div>
</body></html>"#;
    let ch2 = r#"<?xml version="1.0" encoding="UTF-8"?>
<html xmlns="http://www.w3.org/1999/xhtml"><body>
<section><h2 id="start">Day Two</h2><ul><li>First item.</li><li>Second item.</li></ul>
<blockquote>A quoted line.</blockquote><table><tr><td>a</td><td>b</td></tr></table></section></body></html>"#;
    let notes = r#"<html xmlns="http://www.w3.org/1999/xhtml"><body><p>Notes are not linear.</p></body></html>"#;
    [
        ("mimetype", "application/epub+zip"),
        ("META-INF/container.xml", CONTAINER),
        ("OEBPS/content.opf", opf),
        ("OEBPS/nav.xhtml", nav),
        ("OEBPS/toc.ncx", ncx),
        ("OEBPS/Text/chapter 1.xhtml", ch1),
        ("OEBPS/Text/ch2.xhtml", ch2),
        ("OEBPS/Text/notes.xhtml", notes),
    ]
    .into_iter()
    .map(|(n, b)| (n.to_owned(), b.to_owned()))
    .collect()
}

fn real_epub() -> Vec<u8> {
    let entries: Vec<(String, Vec<u8>)> = real_epub_entries()
        .into_iter()
        .map(|(n, b)| (n, b.into_bytes()))
        .collect();
    zip_of(&entries, false)
}

#[test]
fn the_real_epub_parses() {
    let doc = parse_epub_bytes(&real_epub(), &LoadOptions::default()).expect("parses");
    assert_eq!(doc.chapters.len(), 2);
    assert_eq!(doc.meta.author.as_deref(), Some("Lewis Carroll"));
}

#[test]
fn epub_of_arbitrary_bytes() {
    check(
        "epub_arbitrary_bytes",
        (
            prop_oneof![
                vec(any::<u8>(), 0..4_096),
                // A zip's signatures up front, so the reader gets past the first check.
                vec(any::<u8>(), 0..4_096).prop_map(|mut b| {
                    b.splice(0..0, b"PK\x03\x04".iter().copied());
                    b.extend_from_slice(b"PK\x05\x06");
                    b.extend_from_slice(&[0; 18]);
                    b
                }),
            ],
            load_options(),
        ),
        |(bytes, opts)| {
            let result = within_bounds(epub_size(&bytes), || parse_epub_bytes(&bytes, &opts))?;
            check_result(result, &opts)
        },
    );
}

/// Text of an XHTML element's content: words and the entities books use; with `hostile`,
/// also unknown and broken entities, stray markup and control characters.
fn xhtml_leaf(hostile: bool) -> BoxedStrategy<String> {
    let clean = prop_oneof![
        6 => "[A-Za-z][A-Za-z ,.!?']{0,40}",
        1 => select(&[
            "&nbsp;", "&mdash;", "&eacute;", "&hellip;", "&amp;", "&lt;", "&#233;", "&#x2014;",
            "<br/>", "<!-- note -->", "<![CDATA[ raw < text ]]>", "\u{feff}", "Mr.", "3.50",
        ][..]).prop_map(str::to_owned),
    ];
    if !hostile {
        return clean.boxed();
    }
    prop_oneof![
        4 => clean,
        1 => select(&[
            "&bogus;", "&", "&#0;", "&#x110000;", "&#;", "&e;", "<?pi x?>", "\u{0}", "]]>",
            "<", "</p>", "<p>", "&#xD800;", "\u{7}",
        ][..]).prop_map(str::to_owned),
        1 => pieces_text(),
    ]
    .boxed()
}

/// An element name: block and inline elements mostly, and the ones narrator skips
/// (scripts, styles, navigation, SVG, MathML, ruby annotations) now and then.
fn xhtml_tag() -> impl Strategy<Value = &'static str> {
    prop_oneof![
        8 => select(&[
            "p", "div", "span", "em", "h1", "h2", "h3", "h6", "li", "ul", "ol", "table", "tr",
            "td", "blockquote", "section", "a", "pre", "P", "Body", "br", "hr",
        ][..]),
        1 => select(&[
            "script", "style", "svg", "math", "nav", "ruby", "rt", "head", "title", "body",
        ][..]),
    ]
}

/// An XHTML fragment: elements of every kind narrator treats differently, nested.
fn xhtml_fragment(hostile: bool) -> impl Strategy<Value = String> {
    xhtml_leaf(hostile).prop_recursive(6, 64, 6, |inner| {
        (
            xhtml_tag(),
            vec(inner, 0..6),
            prop::option::of("[a-z]{1,6}=\"[a-zA-Z0-9 ]{0,10}\""),
        )
            .prop_map(|(tag, children, attr)| {
                let attr = attr.map(|a| format!(" {a}")).unwrap_or_default();
                format!("<{tag}{attr}>{}</{tag}>", children.concat())
            })
    })
}

/// A whole XHTML document: XML declaration, a DOCTYPE (maybe declaring an entity),
/// html/head/body, each present or not; one in four with hostile content.
fn xhtml_document() -> impl Strategy<Value = String> {
    (
        any::<bool>(),
        prop_oneof![
            Just(String::new()),
            Just("<!DOCTYPE html>".to_owned()),
            "[a-z]{0,20}".prop_map(|v| format!("<!DOCTYPE html [<!ENTITY e \"{v}\">]>")),
        ],
        prop::bool::weighted(0.8),
        prop::bool::weighted(0.25)
            .prop_flat_map(|hostile| vec(xhtml_fragment(hostile), 1..6)),
    )
        .prop_map(|(decl, doctype, wrap, body)| {
            let decl = if decl {
                "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
            } else {
                ""
            };
            let body = body.concat();
            if wrap {
                format!(
                    "{decl}{doctype}<html xmlns=\"http://www.w3.org/1999/xhtml\"><head><title>t</title></head><body>{body}</body></html>"
                )
            } else {
                format!("{decl}{doctype}<div>{body}</div>")
            }
        })
}

/// An href as books write them, and as they should not.
fn href() -> impl Strategy<Value = String> {
    prop_oneof![
        6 => "[a-z]{1,8}\\.xhtml",
        3 => "Text/[a-z]{1,8}\\.xhtml",
        2 => "[a-z]{1,4}%20[a-z]{1,4}\\.xhtml",
        2 => "[a-z]{1,4}\\.xhtml#[a-z]{1,4}",
        1 => "\\.\\./[a-z]{1,8}\\.xhtml",
        1 => "\\.\\./\\.\\./\\.\\./[a-z]{1,4}",
        1 => "/[a-z]{1,8}\\.xhtml",
        1 => "[a-z]{1,4}%[0-9a-zA-Z]{0,2}\\.xhtml",
        1 => "\\./[a-z]/\\.\\./[a-z]{1,4}\\.XHTML",
        1 => "\\PC{0,12}",
        1 => Just(String::new()),
    ]
}

/// One manifest item and the file the archive holds for it.
#[derive(Debug, Clone)]
struct Item {
    id: String,
    href: String,
    media_type: &'static str,
    properties: &'static str,
    /// Where the archive holds its file: where the href leads, elsewhere, or nowhere.
    stored: Stored,
    content: String,
}

#[derive(Debug, Clone)]
enum Stored {
    AtHref,
    At(String),
    Missing,
}

fn item() -> impl Strategy<Value = Item> {
    (
        prop_oneof![
            8 => "c[0-9]{1,2}",
            1 => Just("nav".to_owned()),
            1 => Just(String::new()),
            1 => "\\PC{1,4}",
        ],
        href(),
        prop_oneof![
            12 => Just("application/xhtml+xml"),
            1 => select(&[
                "text/html",
                "",
                "image/png",
                "image/jpeg",
                "text/css",
                "application/x-dtbncx+xml",
            ][..]),
        ],
        prop_oneof![
            8 => Just(""),
            1 => select(&["nav", "cover-image", "nav cover-image", "scripted"][..]),
        ],
        prop_oneof![
            12 => Just(Stored::AtHref),
            1 => href().prop_map(Stored::At),
            1 => Just(Stored::Missing),
        ],
        prop_oneof![
            12 => xhtml_document(),
            1 => Just("\u{ff}\u{d8}\u{ff}\u{e0}JFIF".to_owned()),
            1 => "<html><body><nav epub:type=\"toc\" xmlns:epub=\"http://www.idpf.org/2007/ops\"><ol><li><a href=\"[a-z]{1,8}\\.xhtml\">[A-Z][a-z]{0,10}</a></li></ol></nav></body></html>",
            1 => "<ncx><navMap><navPoint><navLabel><text>[A-Z][a-z]{0,10}</text></navLabel><content src=\"[a-z]{1,8}\\.xhtml\"/></navPoint></navMap></ncx>",
        ],
    )
        .prop_map(|(id, href, media_type, properties, stored, content)| Item {
            id,
            href,
            media_type,
            properties,
            stored,
            content,
        })
}

/// An EPUB put together from random parts.
#[derive(Debug, Clone)]
struct EpubPlan {
    /// The package's folder.
    base: &'static str,
    /// What container.xml names: the package (`Some(None)`), another path, or no
    /// container.xml at all.
    container: Option<Option<String>>,
    items: Vec<Item>,
    /// Spine entries: which item (or an id no item has), and whether it is linear.
    spine: Vec<(Option<Index>, bool)>,
    metadata: String,
    stored: bool,
}

fn epub_plan() -> impl Strategy<Value = EpubPlan> {
    (
        prop_oneof![
            6 => select(&["", "OEBPS", "OPS", "a/b"][..]),
            1 => Just(".."),
        ],
        prop_oneof![
            12 => Just(Some(None)),
            1 => href().prop_map(|h| Some(Some(h))),
            1 => Just(None),
        ],
        vec(item(), 0..6),
        vec(
            (
                prop::option::weighted(0.9, any::<Index>()),
                prop::bool::weighted(0.9),
            ),
            0..8,
        ),
        prop_oneof![
            Just(String::new()),
            Just("<dc:title>T</dc:title><dc:creator opf:role=\"aut\">A</dc:creator><meta name=\"cover\" content=\"c0\"/>".to_owned()),
            "<dc:title>[^<&\\p{C}]{0,20}</dc:title><dc:creator id=\"a\">[^<&\\p{C}]{0,10}</dc:creator><meta refines=\"#a\" property=\"role\">[a-z]{3}</meta><dc:date>[0-9-]{0,10}</dc:date>",
        ],
        any::<bool>(),
    )
        .prop_map(|(base, container, items, spine, metadata, stored)| EpubPlan {
            base,
            container,
            items,
            spine,
            metadata,
            stored,
        })
}

/// The archive entry a correct book keeps `href` (relative to `base`) in: the fragment
/// cut, `%XX` decoded, `.` and `..` applied.
fn entry_of(base: &str, href: &str) -> String {
    let href = href.split(['#', '?']).next().unwrap_or("");
    let mut bytes = Vec::new();
    let raw = href.as_bytes();
    let mut i = 0;
    while i < raw.len() {
        if raw[i] == b'%'
            && let Some(b) = raw
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())
        {
            bytes.push(b);
            i += 3;
        } else {
            bytes.push(raw[i]);
            i += 1;
        }
    }
    let href = String::from_utf8_lossy(&bytes).into_owned();
    let mut parts: Vec<&str> = if href.starts_with('/') || base.is_empty() {
        Vec::new()
    } else {
        base.split('/').collect()
    };
    for seg in href.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            s => parts.push(s),
        }
    }
    parts.join("/")
}

impl EpubPlan {
    fn bytes(&self) -> Vec<u8> {
        let opf_path = if self.base.is_empty() {
            "content.opf".to_owned()
        } else {
            format!("{}/content.opf", self.base)
        };
        let mut entries: Vec<(String, Vec<u8>)> = Vec::new();
        if let Some(path) = &self.container {
            let full = path.clone().unwrap_or_else(|| opf_path.clone());
            let xml = format!(
                r#"<container><rootfiles><rootfile full-path="{}"/></rootfiles></container>"#,
                xml_attr(&full)
            );
            entries.push(("META-INF/container.xml".into(), xml.into_bytes()));
        }
        let manifest: String = self
            .items
            .iter()
            .map(|it| {
                format!(
                    r#"<item id="{}" href="{}" media-type="{}" properties="{}"/>"#,
                    xml_attr(&it.id),
                    xml_attr(&it.href),
                    it.media_type,
                    it.properties
                )
            })
            .collect();
        let spine: String = self
            .spine
            .iter()
            .map(|(which, linear)| {
                let idref = match which {
                    Some(i) if !self.items.is_empty() => {
                        self.items[i.index(self.items.len())].id.as_str()
                    }
                    _ => "nowhere",
                };
                let linear = if *linear { "" } else { r#" linear="no""# };
                format!(r#"<itemref idref="{}"{linear}/>"#, xml_attr(idref))
            })
            .collect();
        let opf = format!(
            r#"<?xml version="1.0"?><package xmlns="http://www.idpf.org/2007/opf" xmlns:opf="http://www.idpf.org/2007/opf" version="3.0"><metadata xmlns:dc="http://purl.org/dc/elements/1.1/">{}</metadata><manifest>{manifest}</manifest><spine toc="c1">{spine}</spine></package>"#,
            self.metadata
        );
        entries.push((opf_path, opf.into_bytes()));
        for it in &self.items {
            let name = match &it.stored {
                Stored::AtHref => entry_of(self.base, &it.href),
                Stored::At(path) => path.clone(),
                Stored::Missing => continue,
            };
            entries.push((name, it.content.clone().into_bytes()));
        }
        zip_of(&entries, self.stored)
    }
}

fn xml_attr(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('"', "&quot;")
        .replace('<', "&lt;")
}

/// Bytes an archive inflates to (every entry, as far as it reads): with the archive's
/// own size, the input size the memory bound of an EPUB parse is measured against.
fn inflated(archive: &[u8]) -> usize {
    use std::io::Read;
    let Ok(mut zip) = zip::ZipArchive::new(std::io::Cursor::new(archive)) else {
        return 0;
    };
    let mut total = 0;
    let mut buf = vec![0u8; 64 << 10];
    for i in 0..zip.len() {
        let Ok(mut entry) = zip.by_index(i) else {
            continue;
        };
        while let Ok(n) = entry.read(&mut buf) {
            if n == 0 || total > 1 << 30 {
                break;
            }
            total += n;
        }
    }
    total
}

/// An EPUB's input size for the memory bound: the archive and what it inflates to.
fn epub_size(archive: &[u8]) -> usize {
    archive.len() + inflated(archive)
}

#[test]
fn epub_built_from_random_parts() {
    check(
        "epub_random_structure",
        (epub_plan(), load_options()),
        |(plan, opts)| {
            let bytes = plan.bytes();
            let result = within_bounds(epub_size(&bytes), || parse_epub_bytes(&bytes, &opts))?;
            check_result(result, &opts)
        },
    );
}

/// Which part of the real EPUB a mutation hits.
#[derive(Debug, Clone)]
enum EpubMutation {
    /// The archive's bytes (deflated or stored).
    Archive { stored: bool, edits: Vec<Mutation> },
    /// One entry's text, before it is zipped.
    Entry { entry: Index, edits: Vec<Mutation> },
}

fn epub_mutation() -> impl Strategy<Value = EpubMutation> {
    prop_oneof![
        1 => (any::<bool>(), mutations(TOKENS))
            .prop_map(|(stored, edits)| EpubMutation::Archive { stored, edits }),
        2 => (any::<Index>(), mutations(TOKENS))
            .prop_map(|(entry, edits)| EpubMutation::Entry { entry, edits }),
    ]
}

#[test]
fn epub_mutations_of_a_real_book() {
    let entries: Vec<(String, Vec<u8>)> = real_epub_entries()
        .into_iter()
        .map(|(n, b)| (n, b.into_bytes()))
        .collect();
    let archives = [zip_of(&entries, false), zip_of(&entries, true)];
    check(
        "epub_mutations",
        (epub_mutation(), load_options()),
        |(m, opts)| {
            let bytes = match &m {
                EpubMutation::Archive { stored, edits } => {
                    mutate(archives[usize::from(*stored)].clone(), edits)
                }
                EpubMutation::Entry { entry, edits } => {
                    let mut entries = entries.clone();
                    let i = entry.index(entries.len());
                    entries[i].1 = mutate(std::mem::take(&mut entries[i].1), edits);
                    zip_of(&entries, false)
                }
            };
            let result = within_bounds(epub_size(&bytes), || parse_epub_bytes(&bytes, &opts))?;
            check_result(result, &opts)
        },
    );
}

/// An EPUB built to take memory or time.
#[derive(Debug, Clone)]
enum EpubBomb {
    /// A chapter of `mib` MiB of one repeated byte (deflates a thousandfold); `lie`
    /// rewrites the sizes the archive declares to a few bytes.
    Zip { mib: usize, lie: bool },
    /// An entity of `kib` KiB declared in a DTD and used `uses` times, in the package
    /// file, container.xml, the nav document or a chapter.
    Entity {
        kib: usize,
        uses: usize,
        file: usize,
    },
    /// Elements nested `depth` deep in a chapter.
    Deep { depth: usize },
    /// A chapter of `count` empty elements.
    Many { count: usize },
}

fn epub_bomb() -> impl Strategy<Value = EpubBomb> {
    prop_oneof![
        (1usize..48, any::<bool>()).prop_map(|(mib, lie)| EpubBomb::Zip { mib, lie }),
        (1usize..256, 1usize..4_000, 0usize..4).prop_map(|(kib, uses, file)| EpubBomb::Entity {
            kib,
            uses,
            file
        }),
        (1usize..50_000).prop_map(|depth| EpubBomb::Deep { depth }),
        (1usize..100_000).prop_map(|count| EpubBomb::Many { count }),
    ]
}

/// Sets every size the archive declares (local headers and central directory) to `size`.
fn lie_about_sizes(zip: &mut [u8], size: u32) {
    let patch = |zip: &mut [u8], at: usize| {
        if let Some(field) = zip.get_mut(at..at + 4) {
            field.copy_from_slice(&size.to_le_bytes());
        }
    };
    let mut i = 0;
    while i + 4 <= zip.len() {
        match &zip[i..i + 4] {
            b"PK\x03\x04" => patch(zip, i + 22),
            b"PK\x01\x02" => patch(zip, i + 24),
            _ => {}
        }
        i += 1;
    }
}

impl EpubBomb {
    fn bytes(&self) -> Vec<u8> {
        let mut entries: Vec<(String, String)> = real_epub_entries();
        let set = |entries: &mut Vec<(String, String)>, name: &str, body: String| {
            if let Some(e) = entries.iter_mut().find(|(n, _)| n == name) {
                e.1 = body;
            }
        };
        match *self {
            EpubBomb::Zip { mib, lie } => {
                let body = format!("<html><body><p>{}</p></body></html>", "a".repeat(mib << 20));
                set(&mut entries, "OEBPS/Text/ch2.xhtml", body);
                let bytes: Vec<(String, Vec<u8>)> = entries
                    .into_iter()
                    .map(|(n, b)| (n, b.into_bytes()))
                    .collect();
                let mut zip = zip_of(&bytes, false);
                if lie {
                    lie_about_sizes(&mut zip, 100);
                }
                return zip;
            }
            EpubBomb::Entity { kib, uses, file } => {
                let dtd = |root: &str| {
                    format!(
                        "<!DOCTYPE {root} [<!ENTITY big \"{}\">]>",
                        "x".repeat(kib << 10)
                    )
                };
                let refs = "&big;".repeat(uses);
                let (name, old_root, new_head) = match file {
                    0 => ("OEBPS/content.opf", "<package", dtd("package")),
                    1 => ("META-INF/container.xml", "<container", dtd("container")),
                    2 => ("OEBPS/nav.xhtml", "<html", dtd("html")),
                    _ => ("OEBPS/Text/ch2.xhtml", "<html", dtd("html")),
                };
                if let Some(e) = entries.iter_mut().find(|(n, _)| n == name) {
                    let body = e.1.replacen(old_root, &format!("{new_head}{old_root}"), 1);
                    // The references where text goes: the title, an attribute, a label.
                    e.1 = body
                        .replacen("The Test Book", &format!("Bomb{refs}"), 1)
                        .replacen(
                            "media-type=\"application/oebps-package+xml\"",
                            "media-type=\"&big;\"",
                            1,
                        )
                        .replacen("CHAPTER I. Arrival", &format!("Arrival{refs}"), 1)
                        .replacen("A quoted line.", &format!("Quoted{refs}"), 1);
                }
            }
            EpubBomb::Deep { depth } => {
                let body = format!(
                    "<html><body>{}deep{}</body></html>",
                    "<div>".repeat(depth),
                    "</div>".repeat(depth)
                );
                set(&mut entries, "OEBPS/Text/ch2.xhtml", body);
            }
            EpubBomb::Many { count } => {
                let body = format!("<html><body>{}<p>x</p></body></html>", "<b/>".repeat(count));
                set(&mut entries, "OEBPS/Text/ch2.xhtml", body);
            }
        }
        let bytes: Vec<(String, Vec<u8>)> = entries
            .into_iter()
            .map(|(n, b)| (n, b.into_bytes()))
            .collect();
        zip_of(&bytes, false)
    }
}

#[test]
fn epub_bombs_are_refused_or_read_within_bounds() {
    let opts = LoadOptions {
        max_bytes: 4 << 20,
        ..LoadOptions::default()
    };
    // A zip bomb takes a while to deflate: each is made (and measured) once.
    let made = std::cell::RefCell::new(std::collections::HashMap::new());
    check_heavy("epub_bombs", epub_bomb(), |bomb| {
        let (bytes, size) = match bomb {
            EpubBomb::Zip { mib, lie } => made
                .borrow_mut()
                .entry((mib, lie))
                .or_insert_with(|| {
                    let bytes = bomb.bytes();
                    let size = epub_size(&bytes);
                    (bytes, size)
                })
                .clone(),
            _ => {
                let bytes = bomb.bytes();
                let size = epub_size(&bytes);
                (bytes, size)
            }
        };
        // A chapter over the limit must be refused before it is read: measured against
        // the archive alone.
        let refused =
            matches!(bomb, EpubBomb::Zip { mib, .. } if mib << 20 > opts.max_bytes as usize);
        let size = if refused { bytes.len() } else { size };
        let result = within_bounds(size, || parse_epub_bytes(&bytes, &opts))?;
        if refused {
            ensure(
                matches!(&result, Err(e) if e.kind() == "too_large" || e.kind() == "epub_broken"),
                || format!("a chapter over the limit of 4 MiB: {result:?}"),
            )?;
        }
        check_result(result, &opts)
    });
}

// ---------------------------------------------------------------------------------------
// Lexicons.

/// A regular expression as a lexicon might hold it (valid or not).
fn regex_source() -> impl Strategy<Value = String> {
    vec(
        select(
            &[
                "a",
                "b",
                "ch",
                "a+",
                "(a+)",
                "\\b",
                "\\d+",
                "(?i)",
                "[",
                "(",
                ")",
                "(?P<n>x)",
                ".",
                ".*",
                ".+",
                "\\",
                "{1000}",
                "a{2,}",
                "\\p{L}",
                "(?:",
                "|",
                "$",
                "^",
                "\u{e9}",
                "[[",
                "]]",
                "\\s*",
                "x{1,5000}",
                "\\w",
                "[a-z]",
                "(\\w+)",
                "\\.",
                "/",
                "=",
            ][..],
        ),
        0..10,
    )
    .prop_map(|p| p.concat())
}

/// A replacement: text, group references (`$1`, `${n}`), phonemes in `[[ ]]`.
fn replacement() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        12 => select(&[
            "$1", "$0", "${n}", "$$", "$", "a", "b ", " ", "$2x", "${1}", "[[ŋ]]", "Chesh-er",
            "=", "/", "\u{e9}",
        ][..]),
        // Half a phoneme block: refused.
        1 => select(&["[[", "]]"][..]),
    ];
    vec(piece, 1..12).prop_map(|p| p.concat())
}

/// Regular expressions lexicons use (valid ones).
fn valid_regex() -> impl Strategy<Value = &'static str> {
    select(
        &[
            "a",
            "a+",
            "(a+)",
            "\\bch\\.?\\s*(\\d+)",
            "(?i)cheshire",
            "(?P<n>\\w)\\w",
            "(\\w+)",
            ".",
            "\\w",
            "[aeiou]",
            "\\b\\w",
            "a*",
            "(a)(b)?",
            "\\s+",
            "\u{e9}",
            "x{1,5000}",
        ][..],
    )
}

/// Lexicon text: word and regex entries, comments, blank and broken lines.
fn lexicon_text() -> impl Strategy<Value = String> {
    let line = prop_oneof![
        12 => ("[A-Za-z][A-Za-z ]{0,12}", replacement()).prop_map(|(w, r)| format!("{w} = {r}")),
        12 => (valid_regex(), replacement()).prop_map(|(re, r)| format!("/{re}/ = {r}")),
        2 => (regex_source(), replacement()).prop_map(|(re, r)| format!("/{re}/ = {r}")),
        1 => "# [^\n]{0,20}",
        1 => Just(String::new()),
        1 => "[^\n]{0,30}",
    ];
    prop_oneof![
        4 => vec(line, 0..12).prop_map(|l| l.join("\n")),
        1 => any_chars(),
    ]
}

/// A sentence to apply a lexicon to.
fn sentence() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-zA-Z ,.]{0,200}",
        vec(
            select(
                &[
                    "a",
                    "aa",
                    " ",
                    "Cheshire",
                    "ch 4",
                    "[[ŋwˈiən]]",
                    "[[",
                    "]]",
                    "\u{e9}",
                    "x",
                    "."
                ][..]
            ),
            0..80
        )
        .prop_map(|p| p.concat()),
    ]
}

#[test]
fn lexicons_parse_and_apply_within_their_limit() {
    check(
        "lexicon_rules",
        (lexicon_text(), vec(sentence(), 1..4), 0usize..1_000),
        |(text, sentences, limit)| {
            let input = text.len() + sentences.iter().map(String::len).sum::<usize>();
            let lines = text.lines().count();
            within_bounds(input, || -> Result<(), TestCaseError> {
                let lexicon = match Lexicon::parse(&text, "prop.lexicon") {
                    Ok(l) => l,
                    Err(e) => {
                        properties::note("lexicon_refused");
                        return ensure(e.line >= 1 && e.line <= lines, || {
                            format!("error names line {} of {lines}: {e}", e.line)
                        });
                    }
                };
                for s in &sentences {
                    match lexicon.apply(s, limit) {
                        Ok(out) => {
                            properties::note("applied");
                            let most = limit.max(s.chars().count());
                            ensure(out.chars().count() <= most, || {
                                format!(
                                    "{s:?} grew to {} characters, over {most}",
                                    out.chars().count()
                                )
                            })?;
                        }
                        Err(e) => {
                            properties::note("grew_too_long");
                            ensure(e.line >= 1 && e.line <= lines, || {
                                format!("error names line {} of {lines}: {e}", e.line)
                            })?;
                        }
                    }
                }
                Ok(())
            })?
        },
    );
}

/// Entries whose replacement names the whole match many times: each match becomes
/// `copies` copies of itself.
#[test]
fn lexicon_entries_that_multiply_their_match_stay_within_bounds() {
    check_heavy(
        "lexicon_amplification",
        (
            select(&[".", ".+", "\\w", "(a)", "a*", "\\b"][..]),
            1usize..300_000,
            1usize..400,
            0usize..1_000,
        ),
        |(pattern, copies, chars, limit)| {
            let text = format!("/{pattern}/ = {}", "$0".repeat(copies));
            let s = "a".repeat(chars);
            let lexicon = Lexicon::parse(&text, "amp.lexicon")
                .map_err(|e| TestCaseError::fail(format!("valid lexicon refused: {e}")))?;
            let out = within_bounds(text.len() + s.len(), || lexicon.apply(&s, limit))?;
            properties::note(if out.is_ok() {
                "applied"
            } else {
                "grew_too_long"
            });
            if let Ok(out) = out {
                let most = limit.max(chars);
                ensure(out.chars().count() <= most, || {
                    format!("grew to {} characters, over {most}", out.chars().count())
                })?;
            }
            Ok(())
        },
    );
}

#[test]
fn documents_with_a_lexicon_keep_every_sentence_within_twice_the_cap() {
    check(
        "lexicon_on_documents",
        (lexicon_text(), pieces_text(), load_options()),
        |(lexicon, text, opts)| {
            let Ok(lexicon) = Lexicon::parse(&lexicon, "doc.lexicon") else {
                properties::note("lexicon_refused");
                return Ok(());
            };
            let Ok(mut doc) = parse_document(&text, InputFormat::Text, &opts) else {
                properties::note("no_document");
                return Ok(());
            };
            let before = doc.clone();
            let applied = within_bounds(text.len() + lexicon.source().len(), || {
                doc.apply_lexicon(&lexicon, &opts)
            })?;
            properties::note(if applied.is_ok() {
                "applied"
            } else {
                "grew_too_long"
            });
            if applied.is_ok() {
                let cap = opts.max_sentence_chars.max(1) * 2;
                for (s, was) in doc
                    .chapters
                    .iter()
                    .flat_map(|c| &c.paragraphs)
                    .flat_map(|p| &p.sentences)
                    .zip(
                        before
                            .chapters
                            .iter()
                            .flat_map(|c| &c.paragraphs)
                            .flat_map(|p| &p.sentences),
                    )
                {
                    let most = cap.max(was.chars().count());
                    ensure(s.chars().count() <= most, || {
                        format!("{s:?} is over {most} characters")
                    })?;
                }
            }
            Ok(())
        },
    );
}

// ---------------------------------------------------------------------------------------
// Real inputs against the memory bound.

/// The bound is not a wish: real books are far under it. Prints what they take.
#[test]
fn real_inputs_stay_within_the_memory_bound() {
    let opts = LoadOptions::default();
    let mut inputs: Vec<(&str, InputFormat, String)> = vec![
        ("sample.md", InputFormat::Markdown, SAMPLE_MD.to_owned()),
        ("sample.md as text", InputFormat::Text, SAMPLE_MD.to_owned()),
    ];
    if let Some(alice) = alice() {
        inputs.push(("alice29.txt", InputFormat::Text, alice.clone()));
        inputs.push(("alice29.txt as Markdown", InputFormat::Markdown, alice));
    }
    for (name, format, text) in inputs {
        let (doc, used) = measure(|| parse_document(&text, format, &opts));
        doc.expect("a real book parses");
        eprintln!(
            "real input {name}: {} bytes, peak {} bytes ({:.1} × the input), {:.3} s",
            text.len(),
            used.peak,
            used.peak as f64 / text.len() as f64,
            used.elapsed.as_secs_f64()
        );
        assert!(used.peak <= memory_bound(text.len()), "{name}: {used:?}");
    }
    let epub = real_epub();
    let (doc, used) = measure(|| parse_epub_bytes(&epub, &opts));
    doc.expect("the real EPUB parses");
    eprintln!(
        "real input test EPUB: {} bytes, peak {} bytes, {:.3} s",
        epub.len(),
        used.peak,
        used.elapsed.as_secs_f64()
    );
    assert!(used.peak <= memory_bound(epub.len()), "{used:?}");
}

/// A zip bomb at the default limit (16 MiB of chapter text): 200 MiB of one letter, 200 KB
/// deflated, once with its sizes declared and once with every declared size rewritten to
/// 100 bytes, so only the bounded read stops it.
#[test]
fn a_zip_bomb_is_refused_at_the_default_limit_within_the_memory_bound() {
    let opts = LoadOptions::default();
    for lie in [false, true] {
        let bytes = EpubBomb::Zip { mib: 200, lie }.bytes();
        let (result, used) = measure(|| parse_epub_bytes(&bytes, &opts));
        let err = result.expect_err("a 200 MiB chapter is refused");
        eprintln!(
            "zip bomb of {} bytes (sizes {}): {err}; peak {} bytes, {:.3} s",
            bytes.len(),
            if lie { "rewritten" } else { "declared" },
            used.peak,
            used.elapsed.as_secs_f64()
        );
        assert!(matches!(err.kind(), "too_large" | "epub_broken"), "{err}");
        assert!(used.peak <= memory_bound(bytes.len()), "{used:?}");
    }
}
