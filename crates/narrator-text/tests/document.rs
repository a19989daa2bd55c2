//! End-to-end tests of narrator-text through its public API: real files on disk,
//! the alice29 corpus, an EPUB built here with the zip crate, every error kind, and
//! random input that must never panic.

use std::io::Write;
use std::path::{Path, PathBuf};

use narrator_text::{
    Document, InputFormat, LoadOptions, TextError, cap_sentence, load_document, parse_document,
    parse_epub_bytes,
};

/// The public-domain corpus beside the checkout (`../shared/corpus/alice29.txt`), or where
/// this project's machines keep it.
fn alice_path() -> PathBuf {
    let beside = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/corpus/alice29.txt");
    [beside, PathBuf::from("/work/shared/corpus/alice29.txt")]
        .into_iter()
        .find(|p| p.is_file())
        .expect("the corpus ../shared/corpus/alice29.txt is missing beside the checkout")
}

fn opts() -> LoadOptions {
    LoadOptions::default()
}

fn write_file(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let path = dir.join(name);
    let mut f = std::fs::File::create(&path).expect("create test file");
    f.write_all(bytes).expect("write test file");
    path
}

fn all_sentences(doc: &Document) -> Vec<&str> {
    doc.chapters
        .iter()
        .flat_map(|c| &c.paragraphs)
        .flat_map(|p| &p.sentences)
        .map(String::as_str)
        .collect()
}

fn titles(doc: &Document) -> Vec<&str> {
    doc.chapters.iter().map(|c| c.title.as_str()).collect()
}

#[test]
fn alice_has_twelve_titled_chapters() {
    let doc = load_document(&alice_path(), &opts()).expect("alice parses");
    assert_eq!(
        doc.title.as_deref(),
        Some("ALICE'S ADVENTURES IN WONDERLAND")
    );
    assert_eq!(
        titles(&doc),
        [
            "Chapter 1: Down the Rabbit-Hole",
            "Chapter 2: The Pool of Tears",
            "Chapter 3: A Caucus-Race and a Long Tale",
            "Chapter 4: The Rabbit Sends in a Little Bill",
            "Chapter 5: Advice from a Caterpillar",
            "Chapter 6: Pig and Pepper",
            "Chapter 7: A Mad Tea-Party",
            "Chapter 8: The Queen's Croquet-Ground",
            "Chapter 9: The Mock Turtle's Story",
            "Chapter 10: The Lobster Quadrille",
            "Chapter 11: Who Stole the Tarts?",
            "Chapter 12: Alice's Evidence",
        ]
    );
    for ch in &doc.chapters {
        assert!(
            ch.sentence_count() >= 50,
            "{} has {} sentences",
            ch.title,
            ch.sentence_count()
        );
        assert!(ch.paragraphs.len() >= 20, "{}", ch.title);
    }
    let sentences = all_sentences(&doc);
    assert!(sentences.len() > 1000, "{}", sentences.len());
    for s in &sentences {
        assert!(s.chars().count() <= 400, "too long: {s}");
        assert!(
            !s.contains("--") && !s.contains('`') && !s.contains('\r'),
            "{s}"
        );
    }
    // The first paragraph, hard-wrapped over five lines, is one sentence with its quotes.
    let first = &doc.chapters[0].paragraphs[0].sentences;
    assert_eq!(first.len(), 1);
    assert!(first[0].starts_with("Alice was beginning to get very tired"));
    assert!(first[0].ends_with("without pictures or conversation?'"));
    // Exclamations inside a quotation split into sentences.
    assert!(sentences.contains(&"Oh dear!"));
    // The title page is skipped, and said so.
    assert!(
        doc.warnings.iter().any(|w| w.contains("title page")),
        "{:?}",
        doc.warnings
    );
    assert!(
        !doc.warnings
            .iter()
            .any(|w| w.contains("skipped") && w.contains("characters"))
    );
}

#[test]
fn plain_text_chapters_and_preface() {
    let text = "My Little Book\n\nThis is a preface that explains, at some length and with a great deal of care, why this\nbook exists at all and whom it is for.\n\nCHAPTER I.\nThe Start\n\nIt began on a Monday. Nobody noticed.\n\nChapter 2. The Middle\n\nThings happened.\n\nPart Two\n\nMore happened.\n\nEPILOGUE\n\nAll done.\n";
    let doc = parse_document(text, InputFormat::Text, &opts()).expect("parses");
    assert_eq!(doc.title.as_deref(), Some("My Little Book"));
    assert_eq!(
        titles(&doc),
        [
            "My Little Book",
            "Chapter 1: The Start",
            "Chapter 2: The Middle",
            "Part Two",
            "Epilogue"
        ]
    );
    assert_eq!(
        doc.chapters[1].paragraphs[0].sentences,
        ["It began on a Monday.", "Nobody noticed."]
    );
}

#[test]
fn plain_text_without_headings_is_one_chapter() {
    let doc =
        parse_document("Just a note.\n\nAnother one.", InputFormat::Text, &opts()).expect("parses");
    assert_eq!(doc.chapters.len(), 1);
    assert_eq!(doc.chapters[0].paragraphs.len(), 2);
}

#[test]
fn markdown_chapters_from_headings() {
    let md = "# A Tale\n\n## Chapter IV\n\nHe said _hello_ to **Dr. Who** at 3:45 pm. She paid $3.50!\n\n```rust\nfn main() {}\n```\n\n## The [Second](x.html) One\n\n> A quote, with `code`.\n";
    let dir = tempfile::tempdir().expect("tempdir");
    let path = write_file(dir.path(), "tale.MD", md.as_bytes());
    let doc = load_document(&path, &opts()).expect("parses");
    assert_eq!(doc.title.as_deref(), Some("A Tale"));
    assert_eq!(titles(&doc), ["Chapter 4", "The Second One"]);
    assert_eq!(
        doc.chapters[0].paragraphs[0].sentences,
        [
            "He said hello to Doctor Who at 3 45 p m.",
            "She paid 3 dollars 50 cents!"
        ]
    );
    assert_eq!(doc.chapters[0].paragraphs.len(), 1, "code block is skipped");
    assert_eq!(
        doc.chapters[1].paragraphs[0].sentences,
        ["A quote, with code."]
    );
}

#[test]
fn sentence_splitting_through_the_pipeline() {
    let text = "Mr. Smith paid $4.20, i.e. a lot. J. R. R. Tolkien wrote 3.5 books? \u{201c}No!\u{201d} She laughed. Call me at 10:00. Etc. etc. is fine.";
    let doc = parse_document(text, InputFormat::Text, &opts()).expect("parses");
    assert_eq!(
        all_sentences(&doc),
        [
            "Mister Smith paid 4 dollars 20 cents, that is a lot.",
            "J. R. R. Tolkien wrote 3.5 books?",
            "\u{201c}No!\u{201d}",
            "She laughed.",
            "Call me at 10 o'clock.",
            "Et cetera et cetera is fine.",
        ]
    );
}

#[test]
fn normalization_cases() {
    let text = "It rose 10% \u{2014} or \u{a3}5 \u{2014} on the 21st & 22nd of May 1865. Caf\u{e9} na\u{ef}ve r\u{e9}sum\u{e9}, e.g. *fine*; vs. etc.";
    let doc = parse_document(text, InputFormat::Text, &opts()).expect("parses");
    assert_eq!(
        all_sentences(&doc),
        [
            "It rose 10 percent, or 5 pounds, on the 21st and 22nd of May 1865.",
            "Caf\u{e9} na\u{ef}ve r\u{e9}sum\u{e9}, for example fine; versus et cetera."
        ]
    );
}

#[test]
fn huge_unpunctuated_sentence_is_capped_without_losing_words() {
    let words: Vec<String> = (0..4000).map(|i| format!("w{i}")).collect();
    let text = words.join(" ");
    assert!(text.len() >= 20_000, "{}", text.len());
    let text = &text[..20_000];
    let opts = LoadOptions {
        max_sentence_chars: 400,
        ..LoadOptions::default()
    };
    let doc = parse_document(text, InputFormat::Text, &opts).expect("parses");
    let pieces = all_sentences(&doc);
    assert!(pieces.len() >= 50, "{}", pieces.len());
    assert!(pieces.iter().all(|p| p.chars().count() <= 400));
    assert_eq!(pieces.join(" "), text, "no word lost or altered");

    // One word of 20,000 letters: cut mid-word, nothing lost.
    let long_word = "a".repeat(20_000);
    let pieces = cap_sentence(&long_word, 400);
    assert_eq!(pieces.len(), 50);
    assert_eq!(pieces.concat(), long_word);
}

#[test]
fn emoji_and_cjk_are_skipped_with_one_warning_each() {
    let text = "Hello \u{1f600} world \u{1f44d}.\n\nIt says \u{6f22}\u{5b57} here \u{1f680}.\n\n\u{041f}\u{0440}\u{0438}\u{0432}\u{0435}\u{0442}\n\nCaf\u{e9} stays.";
    let doc = parse_document(text, InputFormat::Text, &opts()).expect("parses");
    assert_eq!(
        all_sentences(&doc),
        ["Hello world.", "It says here.", "Caf\u{e9} stays."]
    );
    assert_eq!(
        doc.warnings,
        [
            "skipped 3 emoji/pictographs",
            "skipped 8 characters in scripts the voice's language does not use (e.g. \"\u{6f22}\")"
        ]
    );
}

/// A minimal EPUB 3 with nav and NCX, two chapters, an untitled cover page and a
/// stylesheet, written with the zip crate.
fn build_epub() -> Vec<u8> {
    use zip::write::SimpleFileOptions;
    let container = r#"<?xml version="1.0"?>
<container version="1.0" xmlns="urn:oasis:names:tc:opendocument:xmlns:container">
  <rootfiles><rootfile full-path="OEBPS/content.opf" media-type="application/oebps-package+xml"/></rootfiles>
</container>"#;
    let opf = r#"<?xml version="1.0" encoding="UTF-8"?>
<package xmlns="http://www.idpf.org/2007/opf" version="3.0" unique-identifier="id">
  <metadata xmlns:dc="http://purl.org/dc/elements/1.1/">
    <dc:title>The Test Book</dc:title><dc:identifier id="id">x</dc:identifier>
  </metadata>
  <manifest>
    <item id="nav" href="nav.xhtml" media-type="application/xhtml+xml" properties="nav"/>
    <item id="ncx" href="toc.ncx" media-type="application/x-dtbncx+xml"/>
    <item id="css" href="style.css" media-type="text/css"/>
    <item id="c1" href="Text/chapter%201.xhtml" media-type="application/xhtml+xml"/>
    <item id="c2" href="Text/ch2.xhtml" media-type="application/xhtml+xml"/>
    <item id="notes" href="Text/notes.xhtml" media-type="application/xhtml+xml"/>
  </manifest>
  <spine toc="ncx">
    <itemref idref="c1"/><itemref idref="c2"/><itemref idref="notes" linear="no"/>
  </spine>
</package>"#;
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
<p>It was a cold&nbsp;night&mdash;very cold. Mr.&nbsp;Gray arrived.</p>
<script>document.write("no")</script>
<div><p>Caf&eacute; lights &amp; rain.</p></div>
</body></html>"#;
    let ch2 = r#"<?xml version="1.0" encoding="UTF-8"?>
<html xmlns="http://www.w3.org/1999/xhtml"><body>
<section><h2 id="start">Day Two</h2><ul><li>First item.</li><li>Second item.</li></ul>
<blockquote>A quoted line.</blockquote></section></body></html>"#;
    let notes = r#"<html xmlns="http://www.w3.org/1999/xhtml"><body><p>Notes are not linear.</p></body></html>"#;

    let mut buf = std::io::Cursor::new(Vec::new());
    {
        let mut zip = zip::ZipWriter::new(&mut buf);
        let stored =
            SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
        let deflated = SimpleFileOptions::default();
        zip.start_file("mimetype", stored).expect("zip");
        zip.write_all(b"application/epub+zip").expect("zip");
        for (name, body) in [
            ("META-INF/container.xml", container),
            ("OEBPS/content.opf", opf),
            ("OEBPS/nav.xhtml", nav),
            ("OEBPS/toc.ncx", ncx),
            ("OEBPS/style.css", "p { margin: 0 }"),
            ("OEBPS/Text/chapter 1.xhtml", ch1),
            ("OEBPS/Text/ch2.xhtml", ch2),
            ("OEBPS/Text/notes.xhtml", notes),
        ] {
            zip.start_file(name, deflated).expect("zip");
            zip.write_all(body.as_bytes()).expect("zip");
        }
        zip.finish().expect("zip");
    }
    buf.into_inner()
}

#[test]
fn epub_chapters_in_spine_order_with_toc_titles() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = write_file(dir.path(), "book.EPUB", &build_epub());
    let doc = load_document(&path, &opts()).expect("epub parses");
    assert_eq!(doc.title.as_deref(), Some("The Test Book"));
    assert_eq!(titles(&doc), ["Chapter 1: Arrival", "The Second Day"]);
    let ch1: Vec<&Vec<String>> = doc.chapters[0]
        .paragraphs
        .iter()
        .map(|p| &p.sentences)
        .collect();
    assert_eq!(
        ch1,
        [
            &vec![
                "It was a cold night, very cold.".to_owned(),
                "Mister Gray arrived.".to_owned()
            ],
            &vec!["Caf\u{e9} lights and rain.".to_owned()],
        ]
    );
    // The chapter-two heading differs from its TOC label, so it is read as a paragraph.
    let ch2: Vec<&str> = doc.chapters[1]
        .paragraphs
        .iter()
        .flat_map(|p| &p.sentences)
        .map(String::as_str)
        .collect();
    assert_eq!(
        ch2,
        ["Day Two.", "First item.", "Second item.", "A quoted line."]
    );
    // Same bytes from memory.
    assert_eq!(
        parse_epub_bytes(&build_epub(), &opts()).expect("parses"),
        doc
    );
}

#[test]
fn epub_without_toc_uses_headings_then_numbers() {
    use zip::write::SimpleFileOptions;
    let mut buf = std::io::Cursor::new(Vec::new());
    {
        let mut zip = zip::ZipWriter::new(&mut buf);
        let o = SimpleFileOptions::default();
        let files = [
            (
                "META-INF/container.xml",
                r#"<container><rootfiles><rootfile full-path="book.opf"/></rootfiles></container>"#,
            ),
            (
                "book.opf",
                r#"<package><manifest><item id="a" href="a.html" media-type="application/xhtml+xml"/><item id="b" href="b.html" media-type="application/xhtml+xml"/></manifest><spine><itemref idref="a"/><itemref idref="b"/></spine></package>"#,
            ),
            (
                "a.html",
                "<html><body><h2>The Heading</h2><p>Alpha.</p></body></html>",
            ),
            ("b.html", "<html><body><p>Beta.</p></body></html>"),
        ];
        for (name, body) in files {
            zip.start_file(name, o).expect("zip");
            zip.write_all(body.as_bytes()).expect("zip");
        }
        zip.finish().expect("zip");
    }
    let doc = parse_epub_bytes(&buf.into_inner(), &opts()).expect("parses");
    assert_eq!(doc.title, None);
    assert_eq!(titles(&doc), ["The Heading", "Chapter 2"]);
}

fn epub_with(files: &[(&str, &str)]) -> Vec<u8> {
    use zip::write::SimpleFileOptions;
    let mut buf = std::io::Cursor::new(Vec::new());
    {
        let mut zip = zip::ZipWriter::new(&mut buf);
        for (name, body) in files {
            zip.start_file(*name, SimpleFileOptions::default())
                .expect("zip");
            zip.write_all(body.as_bytes()).expect("zip");
        }
        zip.finish().expect("zip");
    }
    buf.into_inner()
}

#[test]
fn broken_epubs_give_clear_errors() {
    let container = (
        "META-INF/container.xml",
        r#"<container><rootfiles><rootfile full-path="p.opf"/></rootfiles></container>"#,
    );
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (b"this is not a zip at all".to_vec(), "not a zip"),
        (epub_with(&[("x.txt", "hi")]), "no package"),
        (epub_with(&[container]), "package file p.opf is missing"),
        (
            epub_with(&[
                container,
                ("p.opf", "<package><manifest/><spine/></package>"),
            ]),
            "spine lists no chapters",
        ),
        (
            epub_with(&[
                container,
                (
                    "p.opf",
                    r#"<package><manifest><item id="a" href="a.xhtml" media-type="application/xhtml+xml"/></manifest><spine><itemref idref="a"/></spine></package>"#,
                ),
                ("a.xhtml", "<html><body><p>unclosed</body></html>"),
            ]),
            "a.xhtml is not well-formed XHTML at line 1",
        ),
    ];
    let dir = tempfile::tempdir().expect("tempdir");
    for (i, (bytes, expected)) in cases.into_iter().enumerate() {
        let path = write_file(dir.path(), &format!("b{i}.epub"), &bytes);
        let err = load_document(&path, &opts()).expect_err("must fail");
        assert_eq!(err.kind(), "epub_broken", "{err}");
        let msg = err.to_string();
        assert!(msg.contains(expected), "{msg}");
        assert!(msg.contains(&format!("b{i}.epub")), "{msg}");
        assert!(!msg.contains('\n'), "{msg}");
    }
}

/// Found by the property `epub_random_structure` (tests/properties.rs): an href of
/// `a%0a.xhtml` names the archive entry "a\n.xhtml", and the error naming it was two
/// lines. Errors and warnings escape what a book names instead.
#[test]
fn names_with_control_characters_stay_on_one_line() {
    let container = (
        "META-INF/container.xml",
        r#"<container><rootfiles><rootfile full-path="p.opf"/></rootfiles></container>"#,
    );
    let opf = (
        "p.opf",
        r#"<package><manifest><item id="a" href="a%0a.xhtml" media-type="application/xhtml+xml"/><item id="b" href="b%0a%1b.xhtml" media-type="application/xhtml+xml"/></manifest><spine><itemref idref="a"/><itemref idref="b"/></spine></package>"#,
    );
    let err = parse_epub_bytes(
        &epub_with(&[container, opf, ("a\n.xhtml", "not XML")]),
        &opts(),
    )
    .expect_err("not well-formed");
    let msg = err.to_string();
    assert!(
        !msg.chars().any(char::is_control) && msg.contains("a\\n.xhtml is not well-formed"),
        "{msg}"
    );
    let doc = parse_epub_bytes(
        &epub_with(&[
            container,
            opf,
            ("a\n.xhtml", "<html><body><p>Text.</p></body></html>"),
        ]),
        &opts(),
    )
    .expect("the chapter that is there is read");
    assert!(
        doc.warnings
            .iter()
            .any(|w| w.contains("b\\n\\u{1b}.xhtml is missing")),
        "{:?}",
        doc.warnings
    );
    assert!(
        doc.warnings
            .iter()
            .all(|w| !w.chars().any(char::is_control)),
        "{:?}",
        doc.warnings
    );
    // A cover named with an escape character (YAML's `\e`; line breaks in front matter
    // values are folded to spaces).
    let md = "---\ncover: \"img/a\\eb.jpg\"\n---\n\nText.\n";
    let err = parse_document(md, InputFormat::Markdown, &opts()).expect_err("no such cover");
    let msg = err.to_string();
    assert!(
        !msg.chars().any(char::is_control) && msg.contains("img/a\\u{1b}b.jpg"),
        "{msg}"
    );
}

fn load_err(name: &str, bytes: &[u8], opts: &LoadOptions) -> TextError {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = write_file(dir.path(), name, bytes);
    load_document(&path, opts).expect_err("must fail")
}

#[test]
fn error_kinds_for_bad_files() {
    let o = opts();
    assert_eq!(load_err("e.txt", b"", &o).kind(), "empty");
    assert_eq!(load_err("w.md", b" \n\t\r\n ", &o).kind(), "empty");
    assert_eq!(
        load_err("b.txt", b"PK\x03\x04\0\0\x01\x02binary", &o).kind(),
        "binary"
    );
    let bad = load_err("l.txt", b"caf\xe9 au lait", &o);
    assert_eq!(bad.kind(), "invalid_utf8");
    assert!(
        bad.to_string().contains("offset 3") && bad.to_string().contains("iconv"),
        "{bad}"
    );
    let unsupported = load_err("book.pdf", b"%PDF-1.4", &o);
    assert_eq!(unsupported.kind(), "unsupported_format");
    assert!(unsupported.to_string().contains(".epub"), "{unsupported}");
    let small = LoadOptions {
        max_bytes: 10,
        ..LoadOptions::default()
    };
    let big = load_err("big.txt", b"This text is longer than ten bytes.", &small);
    assert_eq!(big.kind(), "too_large");
    assert!(big.to_string().contains("--max-input-mb"), "{big}");
    assert_eq!(
        load_err("sym.txt", "\u{1f600} \u{2192} ... ---".as_bytes(), &o).kind(),
        "nothing_speakable"
    );

    let missing = load_document(Path::new("/definitely/not/here.txt"), &o).expect_err("missing");
    assert_eq!(missing.kind(), "not_found");
    assert!(missing.to_string().contains("/definitely/not/here.txt"));
    let dir = tempfile::tempdir().expect("tempdir");
    assert_eq!(
        load_document(dir.path(), &o).expect_err("dir").kind(),
        "unreadable"
    );

    // The same checks apply to text from stdin.
    assert_eq!(
        parse_document("  ", InputFormat::Text, &o)
            .expect_err("e")
            .kind(),
        "empty"
    );
    assert_eq!(
        parse_document("a\0b", InputFormat::Text, &o)
            .expect_err("b")
            .kind(),
        "binary"
    );
    assert_eq!(
        parse_document("x", InputFormat::Epub, &o)
            .expect_err("epub")
            .kind(),
        "unsupported_format"
    );
    assert_eq!(
        parse_document("0123456789ABC", InputFormat::Markdown, &small)
            .expect_err("big")
            .kind(),
        "too_large"
    );
}

/// xorshift64*: a tiny deterministic generator, so failures reproduce.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        usize::try_from(self.next() % n as u64).unwrap_or(0)
    }
}

#[test]
fn random_input_never_panics() {
    // Pieces that exercise every rule: headings, markup, numbers, abbreviations,
    // quotes, dashes, emoji, other scripts, combining marks, control characters.
    const PIECES: &[&str] = &[
        "a",
        "Z",
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
        "\u{2013}",
        "'",
        "\"",
        "`",
        "\u{2018}",
        "\u{201d}",
        "(",
        ")",
        "[",
        "*",
        "_",
        "#",
        "## ",
        "# ",
        "$",
        "\u{a3}",
        "\u{20ac}",
        "%",
        "&",
        "&c.",
        "1",
        "42",
        "3.50",
        "12:30",
        "9:05",
        "pm",
        "a.m.",
        "Mr.",
        "Mrs",
        "St.",
        "e.g.",
        "etc.",
        "No.",
        "vs",
        "CHAPTER IV",
        "Chapter 12.",
        "PROLOGUE",
        "Part One",
        "I.",
        "J.",
        "\u{1f600}",
        "\u{1f44d}\u{1f3fd}",
        "\u{200d}",
        "\u{fe0f}",
        "\u{6f22}",
        "\u{0416}",
        "\u{0301}",
        "\u{e9}",
        "\u{0}",
        "\u{7}",
        "\u{feff}",
        "\u{fb01}",
        "\u{ff21}",
        "\u{2192}",
        "```\n",
        "> ",
        "- ",
        "1. ",
        "[x](y)",
        "![i](j)",
        "<b>",
        "|a|b|\n|-|-|\n",
        "---\n",
        "\u{e000}",
        "\u{10ffff}",
        "\u{fffd}",
        "\u{2e3a}",
    ];
    // NARRATOR_TEXT_FUZZ_ROUNDS=100000 for a longer local run.
    let rounds: usize = std::env::var("NARRATOR_TEXT_FUZZ_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(400);
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for round in 0..rounds {
        let mut text = String::new();
        let len = rng.below(120);
        for _ in 0..len {
            text.push_str(PIECES[rng.below(PIECES.len())]);
        }
        let opts = LoadOptions {
            max_bytes: 1 << 20,
            max_sentence_chars: rng.below(60),
            // Every rule set: English, another Latin-script language, one with its own script.
            language: ["en", "de", "ru", "ja"][rng.below(4)].to_owned(),
            keep_looks: false,
        };
        for format in [InputFormat::Text, InputFormat::Markdown] {
            if let Ok(doc) = parse_document(&text, format, &opts) {
                let cap = opts.max_sentence_chars.max(1);
                for s in all_sentences(&doc) {
                    assert!(s.chars().count() <= cap, "round {round}: {s:?} over {cap}");
                }
            }
        }
    }
    // Raw random bytes, decoded lossily, and as an "EPUB".
    for _ in 0..200 {
        let len = rng.below(600);
        let bytes: Vec<u8> = (0..len).map(|_| (rng.next() & 0xff) as u8).collect();
        let text = String::from_utf8_lossy(&bytes);
        let _ = parse_document(&text, InputFormat::Text, &opts());
        let _ = parse_document(&text, InputFormat::Markdown, &opts());
        let _ = parse_epub_bytes(&bytes, &opts());
    }
    // Random unicode scalar values.
    for _ in 0..200 {
        let len = rng.below(200);
        let text: String = (0..len)
            .filter_map(|_| char::from_u32(u32::try_from(rng.next() % 0x11_0000).unwrap_or(0)))
            .collect();
        let _ = parse_document(&text, InputFormat::Text, &opts());
        let _ = parse_document(&text, InputFormat::Markdown, &opts());
    }
}

#[test]
fn document_round_trips_through_json() {
    let doc =
        parse_document("CHAPTER I\n\nHello there.", InputFormat::Text, &opts()).expect("parses");
    let json = serde_json::to_string(&doc).expect("serialize");
    let back: Document = serde_json::from_str(&json).expect("deserialize");
    assert_eq!(back, doc);
}

/// An EPUB of the given entries (bytes, so images can be in it).
fn epub_of(files: &[(&str, &[u8])]) -> Vec<u8> {
    use zip::write::SimpleFileOptions;
    let mut buf = std::io::Cursor::new(Vec::new());
    {
        let mut zip = zip::ZipWriter::new(&mut buf);
        for (name, body) in files {
            zip.start_file(*name, SimpleFileOptions::default())
                .expect("zip");
            zip.write_all(body).expect("zip");
        }
        zip.finish().expect("zip");
    }
    buf.into_inner()
}

const JPEG: &[u8] = &[0xFF, 0xD8, 0xFF, 0xE0, 0, 16, b'J', b'F', b'I', b'F', 0];

fn metadata_epub(metadata: &str, manifest_extra: &str, cover: Option<(&str, &[u8])>) -> Vec<u8> {
    let container =
        r#"<container><rootfiles><rootfile full-path="OPS/book.opf"/></rootfiles></container>"#;
    let opf = format!(
        r#"<?xml version="1.0"?>
<package xmlns="http://www.idpf.org/2007/opf" xmlns:opf="http://www.idpf.org/2007/opf" version="2.0">
  <metadata xmlns:dc="http://purl.org/dc/elements/1.1/">{metadata}</metadata>
  <manifest>
    <item id="c1" href="c1.xhtml" media-type="application/xhtml+xml"/>{manifest_extra}
  </manifest>
  <spine><itemref idref="c1"/></spine>
</package>"#
    );
    let ch = r#"<html xmlns="http://www.w3.org/1999/xhtml"><body><h1>One</h1><p>A line of text.</p></body></html>"#;
    let mut files: Vec<(&str, &[u8])> = vec![
        ("META-INF/container.xml", container.as_bytes()),
        ("OPS/book.opf", opf.as_bytes()),
        ("OPS/c1.xhtml", ch.as_bytes()),
    ];
    if let Some(c) = cover {
        files.push(c);
    }
    epub_of(&files)
}

#[test]
fn entities_a_dtd_declares_in_the_package_or_container_are_never_expanded() {
    // 64 KiB used 2,000 times would be a 128 MB title (and 1 MiB × 5,000, 5 GB).
    let big = "x".repeat(64 * 1024);
    let refs = "&big;".repeat(2_000);
    let container = format!(
        r#"<?xml version="1.0"?><!DOCTYPE container [<!ENTITY big "{big}">]><container><rootfiles><rootfile full-path="OPS/book.opf" media-type="&big;"/></rootfiles></container>"#
    );
    let opf = format!(
        r#"<?xml version="1.0"?>
<!DOCTYPE package [<!ENTITY big "{big}">]>
<package xmlns="http://www.idpf.org/2007/opf" version="2.0">
  <metadata xmlns:dc="http://purl.org/dc/elements/1.1/"><dc:title>Bomb{refs}</dc:title></metadata>
  <manifest><item id="c1" href="c1.xhtml" media-type="application/xhtml+xml"/></manifest>
  <spine><itemref idref="c1"/></spine>
</package>"#
    );
    let ch = r#"<html xmlns="http://www.w3.org/1999/xhtml"><body><h1>One</h1><p>A line of text.</p></body></html>"#;
    let bytes = epub_of(&[
        ("META-INF/container.xml", container.as_bytes()),
        ("OPS/book.opf", opf.as_bytes()),
        ("OPS/c1.xhtml", ch.as_bytes()),
    ]);
    let doc = parse_epub_bytes(&bytes, &opts()).expect("parses");
    assert_eq!(
        doc.title.as_deref(),
        Some("Bomb"),
        "the references are dropped"
    );
    assert_eq!(all_sentences(&doc), ["A line of text."]);
}

#[test]
fn epub_metadata_and_cover_come_with_the_document() {
    // EPUB 2: roles in opf:role, dates by event, the cover named by <meta name="cover">.
    let epub2 = metadata_epub(
        r#"<dc:title>Alice</dc:title>
           <dc:creator opf:role="ill">John Tenniel</dc:creator>
           <dc:creator opf:role="aut">Lewis Carroll</dc:creator>
           <dc:language>en-GB</dc:language>
           <dc:date opf:event="creation">2008-06-27</dc:date>
           <dc:date opf:event="publication">1865</dc:date>
           <dc:publisher>Macmillan</dc:publisher>
           <meta name="cover" content="img"/>"#,
        r#"<item id="img" href="images/front.jpg" media-type="image/jpeg"/>"#,
        Some(("OPS/images/front.jpg", JPEG)),
    );
    let doc = parse_epub_bytes(&epub2, &opts()).expect("epub 2");
    assert_eq!(doc.title.as_deref(), Some("Alice"));
    let m = &doc.meta;
    assert_eq!(m.author.as_deref(), Some("Lewis Carroll"));
    assert_eq!(m.language.as_deref(), Some("en-GB"));
    assert_eq!(m.date.as_deref(), Some("1865"));
    assert_eq!(m.publisher.as_deref(), Some("Macmillan"));
    let cover = m.cover.as_ref().expect("cover");
    assert_eq!(cover.mime, "image/jpeg");
    assert_eq!(cover.data.as_slice(), JPEG);

    // EPUB 3: roles in <meta refines>, the cover by properties="cover-image".
    let epub3 = metadata_epub(
        r##"<dc:title>Snark</dc:title>
           <dc:creator id="a1">Lewis Carroll</dc:creator>
           <meta refines="#a1" property="role">aut</meta>
           <dc:creator id="a2">Henry Holiday</dc:creator>
           <meta refines="#a2" property="role">ill</meta>"##,
        r#"<item id="x" href="cv.png" media-type="image/png" properties="cover-image"/>"#,
        Some(("OPS/cv.png", b"\x89PNG\r\n\x1a\n rest")),
    );
    let doc = parse_epub_bytes(&epub3, &opts()).expect("epub 3");
    assert_eq!(doc.meta.author.as_deref(), Some("Lewis Carroll"));
    assert_eq!(
        doc.meta.cover.as_ref().map(|c| c.mime.as_str()),
        Some("image/png")
    );
    assert!(doc.warnings.is_empty(), "{:?}", doc.warnings);

    // A cover the manifest names but the archive lacks: a warning, no cover, no failure.
    let missing = metadata_epub(
        "<dc:title>T</dc:title>",
        r#"<item id="cover" href="cover.jpg" media-type="image/jpeg"/>"#,
        None,
    );
    let doc = parse_epub_bytes(&missing, &opts()).expect("epub");
    assert!(doc.meta.cover.is_none());
    assert!(
        doc.warnings
            .iter()
            .any(|w| w.contains("cover.jpg") && w.contains("--cover")),
        "{:?}",
        doc.warnings
    );
}

#[test]
fn markdown_front_matter_cover_is_read_relative_to_the_book() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir(dir.path().join("img")).expect("mkdir");
    write_file(&dir.path().join("img"), "c.jpg", JPEG);
    let md = "---\ntitle: T\nauthor: A. Writer\ncover: img/c.jpg\n---\n\n# One\n\nText here.\n";
    let path = write_file(dir.path(), "book.md", md.as_bytes());
    let doc = load_document(&path, &opts()).expect("md");
    assert_eq!(doc.meta.author.as_deref(), Some("A. Writer"));
    assert_eq!(
        doc.meta.cover.as_ref().map(|c| c.data.len()),
        Some(JPEG.len())
    );
    // A cover that is missing or not an image is one clear error naming it.
    let bad = write_file(
        dir.path(),
        "bad.md",
        b"---\ncover: img/nope.jpg\n---\n\nText.\n",
    );
    let err = load_document(&bad, &opts()).expect_err("missing cover");
    assert_eq!(err.kind(), "cover");
    assert!(err.to_string().contains("img/nope.jpg"), "{err}");
    write_file(&dir.path().join("img"), "c.gif", b"GIF89a....");
    let gif = write_file(
        dir.path(),
        "gif.md",
        b"---\ncover: img/c.gif\n---\n\nText.\n",
    );
    let err = load_document(&gif, &opts()).expect_err("gif cover");
    assert!(err.to_string().contains("JPEG or PNG"), "{err}");
    // The book's own front matter may not reach outside its folder: by `..`, by an
    // absolute path, or through a link; and a FIFO is refused, not waited on.
    let outside = tempfile::tempdir().expect("tempdir");
    let secret = write_file(outside.path(), "secret.jpg", JPEG);
    std::os::unix::fs::symlink(&secret, dir.path().join("img/link.jpg")).expect("symlink");
    let fifo = dir.path().join("img/fifo.jpg");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .expect("mkfifo");
    assert!(made.success());
    for (cover, says) in [
        (
            format!(
                "../{}/secret.jpg",
                outside
                    .path()
                    .file_name()
                    .expect("a name")
                    .to_string_lossy()
            ),
            "outside the book's folder",
        ),
        (secret.display().to_string(), "outside the book's folder"),
        ("img/link.jpg".to_string(), "outside the book's folder"),
        ("img/fifo.jpg".to_string(), "not a regular file"),
    ] {
        let md = write_file(
            dir.path(),
            "escape.md",
            format!("---\ncover: {cover}\n---\n\nText.\n").as_bytes(),
        );
        let err = load_document(&md, &opts()).expect_err(&cover);
        assert_eq!(err.kind(), "cover", "{cover}: {err}");
        assert!(err.to_string().contains(says), "{cover}: {err}");
    }
    // Given on the command line, a cover may be anywhere (still a regular file).
    assert!(narrator_text::load_cover(&secret, &path).is_ok());
    let err = narrator_text::load_cover(&fifo, &path).expect_err("fifo");
    assert!(err.to_string().contains("not a regular file"), "{err}");
}

#[test]
fn an_epub_read_with_its_looks_keeps_elements_classes_images_and_stylesheets() {
    let container =
        r#"<container><rootfiles><rootfile full-path="OPS/book.opf"/></rootfiles></container>"#;
    let opf = r#"<?xml version="1.0"?>
<package xmlns="http://www.idpf.org/2007/opf" version="3.0">
  <metadata xmlns:dc="http://purl.org/dc/elements/1.1/"><dc:title>Looks</dc:title></metadata>
  <manifest>
    <item id="c1" href="text/c1.xhtml" media-type="application/xhtml+xml"/>
    <item id="css" href="styles/book.css" media-type="text/css"/>
    <item id="font" href="fonts/serif.otf" media-type="font/otf"/>
    <item id="map" href="images/map.jpg" media-type="image/jpeg"/>
    <item id="gone" href="images/gone.png" media-type="image/png"/>
  </manifest>
  <spine><itemref idref="c1"/></spine>
</package>"#;
    let ch = r#"<html xmlns="http://www.w3.org/1999/xhtml"><head><link rel="stylesheet" href="../styles/book.css"/></head>
<body><h1>One</h1><figure><img src="../images/map.jpg" alt=" The   map "/></figure>
<p class="opening first">A line of text. Another one.</p>
<blockquote class="verse">Said the sea.</blockquote>
<ul><li>An item.</li></ul><p>* * *</p><p><img src="../images/map.jpg" alt="again"/></p></body></html>"#;
    let bytes = epub_of(&[
        ("META-INF/container.xml", container.as_bytes()),
        ("OPS/book.opf", opf.as_bytes()),
        ("OPS/text/c1.xhtml", ch.as_bytes()),
        ("OPS/styles/book.css", b"p.first { text-indent: 0 }"),
        ("OPS/fonts/serif.otf", b"OTTO"),
        ("OPS/images/map.jpg", JPEG),
    ]);
    let looks = LoadOptions {
        keep_looks: true,
        ..opts()
    };
    let doc = parse_epub_bytes(&bytes, &looks).expect("parses");
    let chapter = &doc.chapters[0];
    let shown: Vec<(String, Option<String>, Vec<String>)> = chapter
        .paragraphs
        .iter()
        .map(|p| {
            let look = p.look.clone().expect("every paragraph says how it looked");
            (
                look.tag,
                look.class,
                look.images
                    .iter()
                    .map(|i| format!("{} {}", i.src, i.alt))
                    .collect(),
            )
        })
        .collect();
    assert_eq!(
        shown,
        [
            (
                "p".to_owned(),
                Some("opening first".to_owned()),
                vec!["OPS/images/map.jpg The map".to_owned()]
            ),
            ("blockquote".to_owned(), Some("verse".to_owned()), vec![]),
            ("li".to_owned(), None, vec![]),
        ],
        "the heading is the title; the unspeakable `* * *` is dropped"
    );
    assert_eq!(chapter.looks.stylesheets, ["OPS/styles/book.css"]);
    let after: Vec<&str> = chapter
        .looks
        .images_after
        .iter()
        .map(|i| i.alt.as_str())
        .collect();
    assert_eq!(
        after,
        ["again"],
        "an image after the last paragraph stays there"
    );
    let files: Vec<(&str, &str, usize)> = doc
        .meta
        .resources
        .iter()
        .map(|f| (f.path.as_str(), f.mime.as_str(), f.data.len()))
        .collect();
    assert_eq!(
        files,
        [
            ("OPS/fonts/serif.otf", "font/otf", 4),
            ("OPS/images/map.jpg", "image/jpeg", JPEG.len()),
            ("OPS/styles/book.css", "text/css", 26),
        ],
        "stylesheets, fonts and images, by path"
    );
    assert!(
        doc.warnings
            .iter()
            .any(|w| w.contains("OPS/images/gone.png") && w.contains("not in the archive")),
        "{:?}",
        doc.warnings
    );

    // Not asked: nothing kept, the text the same.
    let plain = parse_epub_bytes(&bytes, &opts()).expect("parses");
    assert!(plain.meta.resources.is_empty());
    assert!(plain.chapters[0].looks.is_empty());
    assert!(
        plain.chapters[0]
            .paragraphs
            .iter()
            .all(|p| p.look.is_none())
    );
    assert_eq!(all_sentences(&plain), all_sentences(&doc));
}

/// A book held in memory (a producer's request) reads as the same bytes in a file do,
/// with the same bounds, and names its origin in errors.
#[test]
fn bytes_in_memory_read_as_the_same_file_would() {
    let dir = tempfile::tempdir().expect("tempdir");
    let text = "# One\n\nIt was a bright cold day. The clocks were striking.\n";
    let file = write_file(dir.path(), "book.md", text.as_bytes());
    let from_file = load_document(&file, &opts()).expect("file");
    let in_memory = narrator_text::parse_bytes(
        text.as_bytes(),
        InputFormat::Markdown,
        &opts(),
        "amqp:narrator.intake/k",
    )
    .expect("bytes");
    assert_eq!(all_sentences(&in_memory), all_sentences(&from_file));
    let epub = narrator_text::parse_bytes(&build_epub(), InputFormat::Epub, &opts(), "s3://b/k")
        .expect("epub");
    assert_eq!(
        all_sentences(&epub),
        all_sentences(&parse_epub_bytes(&build_epub(), &opts()).expect("epub"))
    );
    let small = LoadOptions {
        max_bytes: 10,
        ..LoadOptions::default()
    };
    let big = narrator_text::parse_bytes(text.as_bytes(), InputFormat::Text, &small, "req")
        .expect_err("too large");
    assert_eq!(big.kind(), "too_large");
    let empty = narrator_text::parse_bytes(b"", InputFormat::Text, &opts(), "the request")
        .expect_err("empty");
    assert!(empty.to_string().contains("the request"), "{empty}");
}
