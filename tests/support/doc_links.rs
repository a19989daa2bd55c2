//! The documentation's link check: every relative link in the repository's Markdown must
//! lead somewhere.
//!
//! Files read: every `*.md` at the repository root (README.md, CONTRIBUTING.md, ...), under
//! `docs/` (recursively, `docs/notes/` included) and under `crates/` (recursively, build
//! folders skipped).
//!
//! Links checked: inline links and images, `[text](target)` and `![alt](target)` (an
//! optional `"title"` and `<...>` around the target are understood), and reference
//! definitions, `[label]: target`. Targets with a scheme (`https:`, `http:`, `mailto:`,
//! ...) are left alone; every other target is resolved against the folder of the file
//! that holds it (a leading `/` against the repository root), percent-escapes decoded,
//! and must name a file or folder that exists inside the repository. Text inside fenced
//! code blocks and code spans is not a link and is not checked. Raw HTML (`<a href>`,
//! `<img src>`) is not checked.
//!
//! Anchors: a `#fragment` of a link into a Markdown file, or of a link within the same
//! file (`[x](#heading)`), must be one of that file's anchors as GitHub makes them: each
//! heading's text with code marks, emphasis stars and link targets removed, lower-cased,
//! every character other than a letter, a digit, `-`, `_` or a space dropped, and each
//! space made a `-`; a repeated heading gets `-1`, `-2`, ...; an HTML `id="..."` or
//! `name="..."` counts too. The fragment of a link to any other kind of file is not
//! checked.
//!
//! The test fails listing every broken link with its file, line and target.

use std::collections::{HashMap, HashSet};
use std::fs;
use std::path::{Component, Path, PathBuf};

/// The repository's root: this crate lives in `tests/`.
fn repo_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest
        .parent()
        .map_or_else(|| manifest.join(".."), Path::to_path_buf)
}

fn is_markdown(path: &Path) -> bool {
    path.extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("md"))
}

/// Every Markdown file the check reads, sorted.
fn markdown_files(root: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    if let Ok(entries) = fs::read_dir(root) {
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_file() && is_markdown(&path) {
                files.push(path);
            }
        }
    }
    for dir in ["docs", "crates"] {
        walk(&root.join(dir), &mut files);
    }
    files.sort();
    files
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if path.is_dir() {
            if name != "target" && name != "node_modules" && !name.starts_with('.') {
                walk(&path, out);
            }
        } else if is_markdown(&path) {
            out.push(path);
        }
    }
}

/// A link target found in a file, with its 1-based line.
#[derive(Debug, PartialEq)]
struct Link {
    line: usize,
    target: String,
}

/// The opening of a fenced code block: its character and length.
fn fence_open(line: &str) -> Option<(char, usize)> {
    let trimmed = line.trim_start();
    if line.len() - trimmed.len() > 3 {
        return None;
    }
    for ch in ['`', '~'] {
        let n = trimmed.chars().take_while(|&c| c == ch).count();
        if n >= 3 {
            return Some((ch, n));
        }
    }
    None
}

fn fence_closes(line: &str, (ch, n): (char, usize)) -> bool {
    let trimmed = line.trim();
    let run = trimmed.chars().take_while(|&c| c == ch).count();
    run >= n && trimmed.chars().all(|c| c == ch)
}

/// The lines of a Markdown text outside fenced code blocks, with their 1-based numbers.
fn prose_lines(text: &str) -> Vec<(usize, &str)> {
    let mut out = Vec::new();
    let mut fence = None;
    for (i, line) in text.lines().enumerate() {
        match fence {
            Some(f) => {
                if fence_closes(line, f) {
                    fence = None;
                }
            }
            None => match fence_open(line) {
                Some(f) => fence = Some(f),
                None => out.push((i + 1, line)),
            },
        }
    }
    out
}

/// `[label]: target` at the start of a line.
fn reference_definition(line: &str) -> Option<String> {
    let rest = line.trim_start().strip_prefix('[')?;
    let close = rest.find("]:")?;
    let label = &rest[..close];
    if label.is_empty() || label.starts_with('^') {
        return None;
    }
    let target = rest[close + 2..].trim();
    let target = target
        .strip_prefix('<')
        .and_then(|t| t.split_once('>').map(|(t, _)| t))
        .unwrap_or_else(|| target.split_whitespace().next().unwrap_or(""));
    Some(target.to_string())
}

/// The target of an inline link whose `(` ends just before `rest`.
fn inline_target(rest: &str) -> String {
    let rest = rest.trim_start();
    if let Some(angled) = rest.strip_prefix('<') {
        return angled.split('>').next().unwrap_or("").to_string();
    }
    let mut depth = 0usize;
    let mut end = rest.len();
    for (i, c) in rest.char_indices() {
        match c {
            '(' => depth += 1,
            ')' if depth == 0 => {
                end = i;
                break;
            }
            ')' => depth -= 1,
            c if c.is_whitespace() => {
                end = i;
                break;
            }
            _ => {}
        }
    }
    rest[..end].to_string()
}

/// Every link and image target of a Markdown text, outside code.
fn links(text: &str) -> Vec<Link> {
    let mut out = Vec::new();
    // An open code span (its backtick count) carries over to the next line of a paragraph.
    let mut code: Option<usize> = None;
    for (line_no, line) in prose_lines(text) {
        if line.trim().is_empty() {
            code = None;
            continue;
        }
        if code.is_none()
            && let Some(target) = reference_definition(line)
        {
            out.push(Link {
                line: line_no,
                target,
            });
            continue;
        }
        let chars: Vec<(usize, char)> = line.char_indices().collect();
        let mut k = 0;
        while k < chars.len() {
            let (at, c) = chars[k];
            if c == '`' {
                let run = chars[k..].iter().take_while(|(_, c)| *c == '`').count();
                code = match code {
                    Some(open) if open == run => None,
                    Some(open) => Some(open),
                    None => Some(run),
                };
                k += run;
                continue;
            }
            if code.is_none() && c == ']' && line[at..].starts_with("](") {
                out.push(Link {
                    line: line_no,
                    target: inline_target(&line[at + 2..]),
                });
            }
            k += 1;
        }
    }
    out
}

/// Whether a target names its own scheme (`https:`, `mailto:`, ...).
fn has_scheme(target: &str) -> bool {
    let Some(colon) = target.find(':') else {
        return false;
    };
    let scheme = &target[..colon];
    scheme
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic())
        && scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    let hex = |b: u8| (b as char).to_digit(16);
    while i < bytes.len() {
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let (Some(hi), Some(lo)) = (hex(bytes[i + 1]), hex(bytes[i + 2]))
        {
            out.push((hi * 16 + lo) as u8);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `path` with `.` and `..` taken out, without touching the file system.
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

/// A heading's text as GitHub turns it into an anchor.
fn slug(heading: &str) -> String {
    // Links and images keep their text only.
    let mut text = String::new();
    let mut rest = heading;
    while let Some(open) = rest.find("](") {
        let after = &rest[open + 2..];
        let target_len = inline_target(after).len();
        let close = after[target_len..]
            .find(')')
            .map_or(after.len(), |c| target_len + c + 1);
        text.push_str(&rest[..open]);
        rest = &after[close..];
    }
    text.push_str(rest);
    let mut out = String::new();
    for c in text.trim().to_lowercase().chars() {
        if c == ' ' {
            out.push('-');
        } else if c == '-' || c == '_' || c.is_alphanumeric() {
            out.push(c);
        }
    }
    out
}

/// Every anchor a Markdown text offers: its headings' slugs (repeats numbered) and HTML
/// ids and names.
fn anchors(text: &str) -> HashSet<String> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut out = HashSet::new();
    let mut add = |base: String, out: &mut HashSet<String>| {
        let n = seen.entry(base.clone()).or_insert(0);
        let anchor = if *n == 0 {
            base.clone()
        } else {
            format!("{base}-{n}")
        };
        *n += 1;
        out.insert(anchor);
    };
    let lines = prose_lines(text);
    for (idx, &(line_no, line)) in lines.iter().enumerate() {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        let hashes = trimmed.chars().take_while(|&c| c == '#').count();
        if indent <= 3
            && (1..=6).contains(&hashes)
            && trimmed[hashes..]
                .chars()
                .next()
                .is_none_or(char::is_whitespace)
        {
            let mut title = trimmed[hashes..].trim();
            // A closing sequence of #s.
            let stripped = title.trim_end_matches('#');
            if stripped.is_empty() || stripped.ends_with(' ') {
                title = stripped.trim_end();
            }
            add(slug(title), &mut out);
        } else if indent <= 3
            && !trimmed.is_empty()
            && (trimmed.trim_end().chars().all(|c| c == '=')
                || (trimmed.trim_end().chars().all(|c| c == '-') && trimmed.trim_end().len() >= 2))
            && idx > 0
        {
            // A setext heading: the line before, if it is a paragraph's line.
            let (prev_no, prev) = lines[idx - 1];
            let prev_trimmed = prev.trim();
            if prev_no + 1 == line_no
                && !prev_trimmed.is_empty()
                && !prev_trimmed.starts_with(['#', '-', '*', '+', '|', '>'])
            {
                add(slug(prev_trimmed), &mut out);
            }
        }
        for attr in ["id=\"", "name=\""] {
            let mut rest = line;
            while let Some(at) = rest.find(attr) {
                let value = &rest[at + attr.len()..];
                if let Some(end) = value.find('"') {
                    out.insert(value[..end].to_string());
                    rest = &value[end..];
                } else {
                    break;
                }
            }
        }
    }
    out
}

/// Every broken link of `files` (inside the repository at `root`), as `file:line: target:
/// why`, paths relative to the root.
fn broken_links(root: &Path, files: &[PathBuf]) -> Vec<String> {
    let root = normalize(root);
    let mut anchor_cache: HashMap<PathBuf, Option<HashSet<String>>> = HashMap::new();
    let mut anchors_of = |path: &Path| -> Option<HashSet<String>> {
        anchor_cache
            .entry(path.to_path_buf())
            .or_insert_with(|| fs::read_to_string(path).ok().map(|t| anchors(&t)))
            .clone()
    };
    let mut broken = Vec::new();
    for file in files {
        let file = normalize(file);
        let shown = file
            .strip_prefix(&root)
            .unwrap_or(&file)
            .display()
            .to_string();
        let text = match fs::read_to_string(&file) {
            Ok(text) => text,
            Err(e) => {
                broken.push(format!("{shown}: cannot be read: {e}"));
                continue;
            }
        };
        let dir = file
            .parent()
            .map_or_else(|| root.clone(), Path::to_path_buf);
        for Link { line, target } in links(&text) {
            let mut report = |why: &str| broken.push(format!("{shown}:{line}: {target}: {why}"));
            if target.is_empty() {
                report("empty target");
                continue;
            }
            if has_scheme(&target) {
                continue;
            }
            let (path_part, fragment) = match target.split_once('#') {
                Some((p, f)) => (p, Some(f)),
                None => (target.as_str(), None),
            };
            let path_part = path_part.split('?').next().unwrap_or("");
            let resolved = if path_part.is_empty() {
                file.clone()
            } else {
                let decoded = percent_decode(path_part);
                match decoded.strip_prefix('/') {
                    Some(from_root) => normalize(&root.join(from_root)),
                    None => normalize(&dir.join(&decoded)),
                }
            };
            if !resolved.starts_with(&root) {
                report("points outside the repository");
                continue;
            }
            if !resolved.exists() {
                report("no such file or folder");
                continue;
            }
            let Some(fragment) = fragment else {
                continue;
            };
            if !(resolved.is_file() && is_markdown(&resolved)) {
                continue;
            }
            let fragment = percent_decode(fragment);
            match anchors_of(&resolved) {
                Some(set) if set.contains(&fragment) || set.contains(&fragment.to_lowercase()) => {}
                Some(_) => report("no such heading"),
                None => report("cannot read the file to check its headings"),
            }
        }
    }
    broken
}

#[test]
fn every_relative_link_in_the_docs_resolves() {
    let root = repo_root();
    let files = markdown_files(&root);
    let names: Vec<String> = files
        .iter()
        .map(|f| f.strip_prefix(&root).unwrap_or(f).display().to_string())
        .collect();
    assert!(
        names.iter().any(|n| n == "README.md") && names.iter().any(|n| n.starts_with("docs/")),
        "the check found no README.md or docs/ under {}: {names:?}",
        root.display()
    );
    let broken = broken_links(&root, &files);
    assert!(
        broken.is_empty(),
        "{} broken link(s) in the documentation ({} files read):\n{}",
        broken.len(),
        files.len(),
        broken.join("\n")
    );
}

#[test]
fn anchors_are_made_as_github_makes_them() {
    assert_eq!(
        slug("Calibration on CPU: `narrator plan --calibrate always` (release build)"),
        "calibration-on-cpu-narrator-plan---calibrate-always-release-build"
    );
    assert_eq!(
        slug("The soak's RSS growth: found and fixed"),
        "the-soaks-rss-growth-found-and-fixed"
    );
    assert_eq!(
        slug("Options (flags, with environment fallbacks)"),
        "options-flags-with-environment-fallbacks"
    );
    assert_eq!(slug("`narrator bench`"), "narrator-bench");
    assert_eq!(slug("See [the guide](docs/X.md) now"), "see-the-guide-now");
    assert_eq!(slug("Über_alles → 2×"), "über_alles--2");
    let set = anchors(
        "# Title\n\n## Part\n\n## Part\n\n```\n# not a heading\n```\n\nSetext\n------\n<a id=\"here\"></a>\n",
    );
    for a in ["title", "part", "part-1", "setext", "here"] {
        assert!(set.contains(a), "{a} in {set:?}");
    }
    assert!(!set.contains("not-a-heading"), "{set:?}");
}

/// The check itself fails on broken links: a folder with one of each kind of link, good
/// and bad, reports exactly the bad ones.
#[test]
fn broken_links_are_reported_with_file_line_and_target() {
    let unique = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let root = std::env::temp_dir().join(format!(
        "narrator-doc-links-{}-{unique}",
        std::process::id()
    ));
    let docs = root.join("docs");
    fs::create_dir_all(&docs).expect("temporary folder");
    fs::write(root.join("LICENSE"), "text").expect("write");
    fs::write(
        docs.join("OTHER.md"),
        "# Other\n\n## A section: with `code`\n",
    )
    .expect("write");
    let readme = "\
# Readme

[ok](docs/OTHER.md) and ![image ok](LICENSE) and [web](https://example.org/x.md)
[missing](docs/MISSING.md)
[anchor ok](docs/OTHER.md#a-section-with-code) [anchor bad](docs/OTHER.md#nope)
[here ok](#readme) [here bad](#gone) `[in code](nowhere.md)`
[outside](../../outside.md) [mail](mailto:someone@example.org)

```sh
[in a fence](nowhere.md)
```

[ref]: docs/GONE.md
";
    fs::write(root.join("README.md"), readme).expect("write");
    let files = markdown_files(&root);
    assert_eq!(files.len(), 2, "{files:?}");
    let broken = broken_links(&root, &files);
    let _ = fs::remove_dir_all(&root);
    assert_eq!(
        broken,
        vec![
            "README.md:4: docs/MISSING.md: no such file or folder".to_string(),
            "README.md:5: docs/OTHER.md#nope: no such heading".to_string(),
            "README.md:6: #gone: no such heading".to_string(),
            "README.md:7: ../../outside.md: points outside the repository".to_string(),
            "README.md:13: docs/GONE.md: no such file or folder".to_string(),
        ],
        "{broken:#?}"
    );
}
