//! Prints the document model of a file: `cargo run -p narrator-text --example dump -- book.txt`.
//! With `--json`, prints it as JSON instead.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use narrator_text::{LoadOptions, load_document};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let json = args.iter().any(|a| a == "--json");
    let Some(path) = args
        .iter()
        .find(|a| !a.starts_with("--"))
        .map(PathBuf::from)
    else {
        eprintln!("usage: dump [--json] <file.txt|.md|.epub>");
        return ExitCode::FAILURE;
    };
    let started = Instant::now();
    let doc = match load_document(&path, &LoadOptions::default()) {
        Ok(doc) => doc,
        Err(e) => {
            eprintln!("error ({}): {e}", e.kind());
            return ExitCode::FAILURE;
        }
    };
    let elapsed = started.elapsed();
    if json {
        match serde_json::to_string_pretty(&doc) {
            Ok(s) => println!("{s}"),
            Err(e) => {
                eprintln!("cannot serialize: {e}");
                return ExitCode::FAILURE;
            }
        }
        return ExitCode::SUCCESS;
    }
    println!("title: {:?}", doc.title);
    for (i, ch) in doc.chapters.iter().enumerate() {
        println!(
            "[{}] {} ({} paragraphs, {} sentences)",
            i + 1,
            ch.title,
            ch.paragraphs.len(),
            ch.sentence_count()
        );
        for p in &ch.paragraphs {
            for s in &p.sentences {
                println!("    | {s}");
            }
            println!("    ¶");
        }
    }
    for w in &doc.warnings {
        println!("warning: {w}");
    }
    eprintln!("parsed in {elapsed:?}, {} sentences", doc.sentence_count());
    ExitCode::SUCCESS
}
