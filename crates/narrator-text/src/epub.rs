//! EPUB structure: chapters from the spine, titles from the table of contents.
//!
//! Reading order is the OPF spine (`META-INF/container.xml` → package file → spine
//! `itemref`s; non-linear items such as footnote pages are skipped). A chapter's title
//! is its entry in the EPUB 3 nav document or the EPUB 2 NCX when there is one, else the
//! first heading in its XHTML, else the builder's "Chapter N". A spine file with neither
//! (a book split into several files per chapter) continues the previous chapter.
//!
//! Each XHTML file is parsed as XML with roxmltree. XML knows only five named entities,
//! so common HTML ones (`&nbsp;`, `&mdash;`, `&eacute;`...) are replaced with their
//! characters first and unknown ones dropped (with a warning); a stray `&` is escaped.
//! A file that is still not well-formed XML is an error naming the file and position.
//! The package file and `container.xml` go through the same replacement, so no entity a
//! DTD declares is ever expanded anywhere (an "entity bomb" cannot take the memory).
//! Paragraphs come from block elements (p, div, h1–h6, li, blockquote...); scripts,
//! styles, navigation, SVG and MathML are dropped.
//!
//! Limits: the declared uncompressed size of the spine documents must fit in
//! `max_bytes` (images do not count), and every read is bounded, so a zip bomb cannot
//! exhaust memory.

use std::borrow::Cow;
use std::collections::HashMap;
use std::io::{Read, Seek};
use std::path::{Path, PathBuf};

use roxmltree::{Document as Xml, Node, ParsingOptions};
use zip::ZipArchive;
use zip::result::ZipError;

use crate::build::{RawBook, RawChapter};
use crate::{LoadOptions, TextError};

const CONTAINER: &str = "META-INF/container.xml";
const OPS_NS: &str = "http://www.idpf.org/2007/ops";
/// Package, container and TOC files are small; cap each read at this size.
const MAX_META_BYTES: u64 = 8 * 1024 * 1024;
/// Node limit for one XHTML document, against pathological inputs.
const MAX_XML_NODES: u32 = 5_000_000;

pub(crate) fn parse<R: Read + Seek>(
    reader: R,
    opts: &LoadOptions,
    origin: &Path,
) -> Result<RawBook, TextError> {
    let zip = ZipArchive::new(reader).map_err(|e| {
        let reason = match &e {
            ZipError::InvalidArchive(_) | ZipError::Io(_) => "it is not a zip archive".to_owned(),
            other => format!("its zip archive cannot be read ({other})"),
        };
        TextError::EpubBroken {
            path: origin.to_path_buf(),
            reason,
            source: Some(e),
        }
    })?;
    let mut epub = Epub::new(zip, origin);
    let mut warnings = Vec::new();

    let opf_path = epub.package_path(&mut warnings)?;
    let opf_bytes = epub
        .read(&opf_path, MAX_META_BYTES)?
        .ok_or_else(|| epub.broken(format!("the package file {opf_path} is missing")))?;
    let opf_text = decode(&opf_bytes);
    // Entities declared in a DTD are never expanded (as in the chapters): one of 1 MiB
    // used thousands of times would ask for gigabytes.
    let opf_text = fix_entities(&opf_text, &mut EntityStats::default());
    let opf_xml = epub.parse_xml(&opf_text, &opf_path)?;
    let package = Package::from_xml(&opf_xml, dir_of(&opf_path));
    if package.spine.is_empty() {
        return Err(epub.broken("its spine lists no chapters".to_owned()));
    }

    let toc = epub.table_of_contents(&package, &mut warnings);

    // Size check on the declared sizes of what we will read.
    let spine_docs: Vec<&ManifestItem> = package
        .spine
        .iter()
        .filter_map(|idref| {
            let item = package.manifest.get(idref);
            if item.is_none() {
                warnings.push(format!(
                    "spine entry {idref:?} is not in the manifest; skipped"
                ));
            }
            item
        })
        .filter(|item| item.is_html())
        .collect();
    let declared: u64 = spine_docs
        .iter()
        .map(|it| epub.declared_size(&it.path))
        .sum();
    if declared > opts.max_bytes {
        return Err(TextError::TooLarge {
            path: origin.to_path_buf(),
            size: declared,
            limit: opts.max_bytes,
        });
    }

    let mut book = RawBook {
        title: package.title.clone(),
        meta: package.meta.clone(),
        ..RawBook::default()
    };
    if let Some(cover) = &package.cover {
        match epub.read(cover, narrator_core::MAX_COVER_BYTES as u64) {
            Ok(Some(bytes)) => match narrator_core::Cover::from_bytes(bytes) {
                Ok(c) => book.meta.cover = Some(c),
                Err(reason) => warnings.push(format!(
                    "the cover image {cover} is not used: {reason} (or pass --cover FILE)"
                )),
            },
            Ok(None) => warnings.push(format!(
                "the cover image {cover} is missing from the archive; the audio has no cover (pass --cover FILE)"
            )),
            Err(e) => warnings.push(format!(
                "the cover image {cover} is not used: {e} (pass --cover FILE)"
            )),
        }
    }
    let mut unknown_entities = EntityStats::default();
    for item in spine_docs {
        let Some(bytes) = epub.read(&item.path, opts.max_bytes)? else {
            warnings.push(format!(
                "chapter file {} is missing from the archive; skipped",
                item.path
            ));
            continue;
        };
        let text = decode(&bytes);
        let fixed = fix_entities(&text, &mut unknown_entities);
        let xml = epub.parse_xml(&fixed, &item.path)?;
        let dir = dir_of(&item.path);
        let (mut blocks, mut images_after) = xhtml_blocks(&xml, dir);
        let sheets = if opts.keep_looks {
            stylesheets(&xml, dir)
        } else {
            Vec::new()
        };
        let toc_title = toc.get(&item.path).cloned();
        let first_heading = blocks.iter().position(|b| b.heading);

        if toc_title.is_none()
            && first_heading.is_none()
            && !toc.is_empty()
            && let Some(prev) = book.chapters.last_mut()
        {
            if opts.keep_looks {
                // The previous file's trailing images come before this one's text.
                if let Some(first) = blocks.first_mut() {
                    let mut images = std::mem::take(&mut prev.chapter_looks.images_after);
                    images.append(&mut first.look.images);
                    first.look.images = images;
                }
                prev.chapter_looks.images_after.append(&mut images_after);
                for sheet in sheets {
                    if !prev.chapter_looks.stylesheets.contains(&sheet) {
                        prev.chapter_looks.stylesheets.push(sheet);
                    }
                }
            }
            push_blocks(prev, blocks, opts.keep_looks);
            continue;
        }
        let title = match (toc_title, first_heading) {
            (Some(t), Some(h)) => {
                let heading = simplify(&blocks[h].text);
                let toc_s = simplify(&t);
                if heading == toc_s || toc_s.contains(&heading) {
                    take_block(&mut blocks, h, &mut images_after);
                    Some(t)
                } else if heading.contains(&toc_s) {
                    Some(take_block(&mut blocks, h, &mut images_after))
                } else {
                    Some(t)
                }
            }
            (Some(t), None) => Some(t),
            (None, Some(h)) => Some(take_block(&mut blocks, h, &mut images_after)),
            (None, None) => None,
        };
        let mut chapter = RawChapter {
            title,
            leading: false,
            ..RawChapter::default()
        };
        if opts.keep_looks {
            chapter.chapter_looks = crate::ChapterLooks {
                stylesheets: sheets,
                images_after,
            };
        }
        push_blocks(&mut chapter, blocks, opts.keep_looks);
        book.chapters.push(chapter);
    }
    if opts.keep_looks {
        book.meta.resources = epub.looks(&package, &mut warnings)?;
    }
    if let Some(example) = unknown_entities.example {
        warnings.push(format!(
            "dropped {} unknown HTML entities (e.g. &{example};)",
            unknown_entities.count
        ));
    }
    book.warnings = warnings;
    Ok(book)
}

/// The archive plus the origin path for errors.
struct Epub<R> {
    zip: ZipArchive<R>,
    origin: PathBuf,
    /// Lower-cased entry name → real name, for books whose hrefs differ in case.
    lower_names: HashMap<String, String>,
}

impl<R: Read + Seek> Epub<R> {
    /// The package's stylesheets, images and fonts, sorted by path, for a read-along
    /// EPUB. More than [`narrator_core::MAX_SOURCE_FILES_BYTES`] in all keeps none (with
    /// a warning); a file missing from the archive is left out (with a warning).
    fn looks(
        &mut self,
        package: &Package,
        warnings: &mut Vec<String>,
    ) -> Result<Vec<narrator_core::SourceFile>, TextError> {
        let mut items: Vec<&ManifestItem> = package
            .manifest
            .values()
            .filter(|item| item.is_look())
            .collect();
        items.sort_by(|a, b| a.path.cmp(&b.path));
        items.dedup_by(|a, b| a.path == b.path);
        let total: u64 = items.iter().map(|it| self.declared_size(&it.path)).sum();
        let limit = narrator_core::MAX_SOURCE_FILES_BYTES;
        if total > limit {
            warnings.push(format!(
                "the book's stylesheets, images and fonts take {} MiB, over the {} MiB a \
                 read-along EPUB keeps; it shows the text without them",
                total >> 20,
                limit >> 20
            ));
            return Ok(Vec::new());
        }
        let mut files = Vec::new();
        for item in items {
            match self.read(&item.path, limit)? {
                Some(data) => files.push(narrator_core::SourceFile {
                    path: item.path.clone(),
                    mime: item.media_type.clone(),
                    data: std::sync::Arc::new(data),
                }),
                None => warnings.push(format!(
                    "{} is in the package but not in the archive; the read-along EPUB \
                     goes without it",
                    item.path
                )),
            }
        }
        Ok(files)
    }

    fn new(zip: ZipArchive<R>, origin: &Path) -> Self {
        let lower_names = zip
            .file_names()
            .filter_map(Result::ok)
            .map(|n| (n.to_lowercase(), n.into_owned()))
            .collect();
        Self {
            zip,
            origin: origin.to_path_buf(),
            lower_names,
        }
    }

    fn broken(&self, reason: String) -> TextError {
        TextError::EpubBroken {
            path: self.origin.clone(),
            reason,
            source: None,
        }
    }

    fn real_name(&self, name: &str) -> Option<String> {
        self.lower_names.get(&name.to_lowercase()).cloned()
    }

    fn declared_size(&mut self, name: &str) -> u64 {
        let Some(real) = self.real_name(name) else {
            return 0;
        };
        self.zip.by_name(&real).map_or(0, |f| f.size())
    }

    /// Reads an entry, at most `limit` bytes; `None` when it does not exist.
    fn read(&mut self, name: &str, limit: u64) -> Result<Option<Vec<u8>>, TextError> {
        let Some(real) = self.real_name(name) else {
            return Ok(None);
        };
        let origin = self.origin.clone();
        let entry = self.zip.by_name(&real);
        let file = match entry {
            Ok(f) => f,
            Err(ZipError::FileNotFound) => return Ok(None),
            Err(e) => {
                return Err(TextError::EpubBroken {
                    path: origin,
                    reason: format!("entry {name} cannot be read ({e})"),
                    source: Some(e),
                });
            }
        };
        let mut bytes = Vec::new();
        file.take(limit.saturating_add(1))
            .read_to_end(&mut bytes)
            .map_err(|e| TextError::EpubBroken {
                path: origin.clone(),
                reason: format!("entry {name} cannot be decompressed ({e})"),
                source: None,
            })?;
        if bytes.len() as u64 > limit {
            return Err(TextError::TooLarge {
                path: origin,
                size: bytes.len() as u64,
                limit,
            });
        }
        Ok(Some(bytes))
    }

    fn parse_xml<'a>(&self, text: &'a str, entry: &str) -> Result<Xml<'a>, TextError> {
        let options = ParsingOptions {
            allow_dtd: true,
            nodes_limit: MAX_XML_NODES,
            ..ParsingOptions::default()
        };
        Xml::parse_with_options(text, options).map_err(|e| {
            let pos = e.pos();
            TextError::EpubMalformed {
                path: self.origin.clone(),
                entry: entry.to_owned(),
                line: pos.row,
                column: pos.col,
                source: e,
            }
        })
    }

    /// The package (OPF) path from container.xml, or the only .opf in the archive.
    fn package_path(&mut self, warnings: &mut Vec<String>) -> Result<String, TextError> {
        if let Some(bytes) = self.read(CONTAINER, MAX_META_BYTES)? {
            let text = decode(&bytes);
            let text = fix_entities(&text, &mut EntityStats::default());
            let xml = self.parse_xml(&text, CONTAINER)?;
            let path = xml
                .descendants()
                .find(|n| n.tag_name().name() == "rootfile")
                .and_then(|n| n.attribute("full-path"))
                .map(|p| resolve("", p));
            return path
                .ok_or_else(|| self.broken(format!("{CONTAINER} names no package (.opf) file")));
        }
        let mut opfs: Vec<String> = self
            .lower_names
            .values()
            .filter(|n| n.to_lowercase().ends_with(".opf"))
            .cloned()
            .collect();
        opfs.sort();
        match opfs.as_slice() {
            [only] => {
                warnings.push(format!("{CONTAINER} is missing; using {only}"));
                Ok(only.clone())
            }
            [] => Err(self.broken(format!("it has no {CONTAINER} and no package (.opf) file"))),
            _ => Err(self.broken(format!("it has no {CONTAINER} and several .opf files"))),
        }
    }

    /// Entry path → title, from the nav document (EPUB 3) or else the NCX (EPUB 2).
    /// A broken TOC is only a warning: headings still give titles.
    fn table_of_contents(
        &mut self,
        package: &Package,
        warnings: &mut Vec<String>,
    ) -> HashMap<String, String> {
        let candidates = [(package.nav.clone(), true), (package.ncx.clone(), false)];
        for (path, is_nav) in candidates {
            let Some(path) = path else { continue };
            let bytes = match self.read(&path, MAX_META_BYTES) {
                Ok(Some(b)) => b,
                Ok(None) | Err(_) => {
                    warnings.push(format!(
                        "table of contents {path} cannot be read; titles come from headings"
                    ));
                    continue;
                }
            };
            let text = decode(&bytes);
            let fixed = fix_entities(&text, &mut EntityStats::default());
            let Ok(xml) = self.parse_xml(&fixed, &path) else {
                warnings.push(format!(
                    "table of contents {path} is not well-formed; titles come from headings"
                ));
                continue;
            };
            let toc = if is_nav {
                nav_entries(&xml, dir_of(&path))
            } else {
                ncx_entries(&xml, dir_of(&path))
            };
            if !toc.is_empty() {
                return toc;
            }
        }
        HashMap::new()
    }
}

#[derive(Debug, Clone)]
struct ManifestItem {
    path: String,
    media_type: String,
}

impl ManifestItem {
    fn is_html(&self) -> bool {
        matches!(
            self.media_type.as_str(),
            "application/xhtml+xml" | "text/html" | "application/xml" | "text/xml"
        ) || self.media_type.is_empty()
    }

    /// A stylesheet, image or font: how the book looks.
    fn is_look(&self) -> bool {
        let t = self.media_type.as_str();
        t == "text/css"
            || t.starts_with("image/")
            || t.starts_with("font/")
            || t.starts_with("application/font-")
            || t.starts_with("application/x-font-")
            || t == "application/vnd.ms-opentype"
            || t == "application/vnd.ms-fontobject"
    }
}

/// What the OPF says: title, metadata, cover, manifest, spine order, TOC documents.
struct Package {
    title: Option<String>,
    meta: narrator_core::BookMeta,
    /// Archive path of the cover image.
    cover: Option<String>,
    manifest: HashMap<String, ManifestItem>,
    spine: Vec<String>,
    nav: Option<String>,
    ncx: Option<String>,
}

impl Package {
    fn from_xml(xml: &Xml<'_>, base: &str) -> Self {
        let title = xml
            .descendants()
            .find(|n| n.is_element() && n.tag_name().name() == "title")
            .map(|n| collapse(&text_of(n)))
            .filter(|t| !t.is_empty());
        let mut manifest = HashMap::new();
        let mut nav = None;
        let mut ncx_by_type = None;
        for item in xml.descendants().filter(|n| n.tag_name().name() == "item") {
            let (Some(id), Some(href)) = (item.attribute("id"), item.attribute("href")) else {
                continue;
            };
            let media_type = item.attribute("media-type").unwrap_or("").to_owned();
            let path = resolve(base, href);
            if item
                .attribute("properties")
                .is_some_and(|p| p.split_whitespace().any(|w| w == "nav"))
            {
                nav = Some(path.clone());
            }
            if media_type == "application/x-dtbncx+xml" {
                ncx_by_type = Some(path.clone());
            }
            manifest.insert(id.to_owned(), ManifestItem { path, media_type });
        }
        let (meta, cover_id) = metadata(xml);
        let cover = cover_path(xml, base, &manifest, cover_id);
        let spine_node = xml.descendants().find(|n| n.tag_name().name() == "spine");
        let ncx = spine_node
            .and_then(|s| s.attribute("toc"))
            .and_then(|id| manifest.get(id))
            .map(|it| it.path.clone())
            .or(ncx_by_type);
        let spine = spine_node
            .map(|s| {
                s.children()
                    .filter(|n| n.tag_name().name() == "itemref")
                    .filter(|n| n.attribute("linear") != Some("no"))
                    .filter_map(|n| n.attribute("idref").map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        Self {
            title,
            meta,
            cover,
            manifest,
            spine,
            nav,
            ncx,
        }
    }
}

/// Dublin Core author(s), language, date and publisher of the OPF's `<metadata>`, and
/// the manifest id an EPUB 2 `<meta name="cover">` names.
fn metadata(xml: &Xml<'_>) -> (narrator_core::BookMeta, Option<String>) {
    let Some(md) = xml
        .descendants()
        .find(|n| n.is_element() && n.tag_name().name() == "metadata")
    else {
        return Default::default();
    };
    let elements = |name: &'static str| {
        md.descendants()
            .filter(move |n| n.is_element() && n.tag_name().name() == name)
    };
    let text = |n: Node<'_, '_>| Some(collapse(&text_of(n))).filter(|t| !t.is_empty());
    // EPUB 3 gives roles in <meta refines="#id" property="role">, EPUB 2 in opf:role.
    let role_of = |n: Node<'_, '_>| -> Option<String> {
        n.attributes()
            .find(|a| a.name() == "role")
            .map(|a| a.value().to_owned())
            .or_else(|| {
                let id = n.attribute("id")?;
                elements("meta")
                    .find(|m| {
                        m.attribute("refines") == Some(&format!("#{id}"))
                            && m.attribute("property") == Some("role")
                    })
                    .map(|m| collapse(&text_of(m)))
            })
    };
    let creators: Vec<(Option<String>, String)> = elements("creator")
        .filter_map(|n| Some((role_of(n), text(n)?)))
        .collect();
    let authors: Vec<&str> = if creators.iter().any(|(r, _)| r.as_deref() == Some("aut")) {
        creators
            .iter()
            .filter(|(r, _)| r.as_deref() == Some("aut"))
            .map(|(_, n)| n.as_str())
            .collect()
    } else {
        creators.iter().map(|(_, n)| n.as_str()).collect()
    };
    // EPUB 2 may list several dates by event; the publication date is the one wanted.
    let date = elements("date")
        .find(|n| {
            n.attributes()
                .any(|a| a.name() == "event" && a.value() == "publication")
        })
        .or_else(|| elements("date").next())
        .and_then(text);
    let meta = narrator_core::BookMeta {
        author: (!authors.is_empty()).then(|| authors.join(", ")),
        language: elements("language").find_map(text),
        date,
        publisher: elements("publisher").find_map(text),
        ..Default::default()
    };
    let cover_id = elements("meta")
        .find(|m| m.attribute("name") == Some("cover"))
        .and_then(|m| m.attribute("content"))
        .map(str::to_owned);
    (meta, cover_id)
}

/// The cover image's archive path: the EPUB 3 item with `properties="cover-image"`, else
/// the item an EPUB 2 `<meta name="cover">` names, else an image item called "cover".
fn cover_path(
    xml: &Xml<'_>,
    base: &str,
    manifest: &HashMap<String, ManifestItem>,
    cover_id: Option<String>,
) -> Option<String> {
    let items = || xml.descendants().filter(|n| n.tag_name().name() == "item");
    let href = |n: Node<'_, '_>| n.attribute("href").map(|h| resolve(base, h));
    items()
        .find(|n| {
            n.attribute("properties")
                .is_some_and(|p| p.split_whitespace().any(|w| w == "cover-image"))
        })
        .and_then(href)
        .or_else(|| {
            cover_id
                .and_then(|id| manifest.get(&id))
                .filter(|it| it.media_type.starts_with("image/"))
                .map(|it| it.path.clone())
        })
        .or_else(|| {
            items()
                .filter(|n| {
                    n.attribute("media-type")
                        .is_some_and(|t| t.starts_with("image/"))
                })
                .find(|n| {
                    n.attribute("id")
                        .is_some_and(|id| id.to_ascii_lowercase().contains("cover"))
                })
                .and_then(href)
        })
}

fn nav_entries(xml: &Xml<'_>, base: &str) -> HashMap<String, String> {
    let navs: Vec<Node<'_, '_>> = xml
        .descendants()
        .filter(|n| n.tag_name().name() == "nav")
        .collect();
    let is_toc = |n: &Node<'_, '_>| {
        n.attribute((OPS_NS, "type"))
            .is_some_and(|t| t.split_whitespace().any(|w| w == "toc"))
            || n.attribute("role") == Some("doc-toc")
    };
    let Some(nav) = navs.iter().find(|n| is_toc(n)).or(navs.first()) else {
        return HashMap::new();
    };
    let mut map = HashMap::new();
    for a in nav.descendants().filter(|n| n.tag_name().name() == "a") {
        let (Some(href), title) = (a.attribute("href"), collapse(&text_of(a))) else {
            continue;
        };
        if !title.is_empty() {
            map.entry(resolve(base, href)).or_insert(title);
        }
    }
    map
}

fn ncx_entries(xml: &Xml<'_>, base: &str) -> HashMap<String, String> {
    let mut map = HashMap::new();
    for point in xml
        .descendants()
        .filter(|n| n.tag_name().name() == "navPoint")
    {
        let label = point
            .children()
            .find(|n| n.tag_name().name() == "navLabel")
            .map(|n| collapse(&text_of(n)))
            .unwrap_or_default();
        let src = point
            .children()
            .find(|n| n.tag_name().name() == "content")
            .and_then(|n| n.attribute("src"));
        if let Some(src) = src
            && !label.is_empty()
        {
            map.entry(resolve(base, src)).or_insert(label);
        }
    }
    map
}

/// A paragraph-level piece of an XHTML document.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Block {
    text: String,
    heading: bool,
    /// How it looked (kept with `keep_looks`).
    look: narrator_core::SourceBlock,
}

impl Block {
    /// The block as spoken text; headings end with a period so the voice pauses.
    fn spoken(self) -> String {
        let mut text = self.text;
        if self.heading && !text.ends_with(['.', '!', '?', ':', '\u{2026}']) {
            text.push('.');
        }
        text
    }
}

const BLOCK_TAGS: &[&str] = &[
    "p",
    "div",
    "h1",
    "h2",
    "h3",
    "h4",
    "h5",
    "h6",
    "li",
    "blockquote",
    "section",
    "article",
    "header",
    "footer",
    "aside",
    "figure",
    "figcaption",
    "pre",
    "table",
    "tr",
    "td",
    "th",
    "dt",
    "dd",
    "dl",
    "ul",
    "ol",
    "main",
    "body",
    "hr",
    "address",
    "center",
    "caption",
];
const SKIP_TAGS: &[&str] = &[
    "script", "style", "head", "nav", "noscript", "template", "svg", "math", "rt", "rp", "title",
    "object", "iframe", "audio", "video", "button", "form", "select",
];

fn is_heading_tag(name: &str) -> bool {
    matches!(name, "h1" | "h2" | "h3" | "h4" | "h5" | "h6")
}

/// Paragraph blocks of an XHTML document at `dir` in the archive, in order, and the
/// images after the last one. Each block says how it looked: the innermost block element
/// around its text, that element's class, and the images (`img`, resolved to archive
/// paths) met since the block before.
fn xhtml_blocks(xml: &Xml<'_>, dir: &str) -> (Vec<Block>, Vec<narrator_core::SourceImage>) {
    let root = xml
        .descendants()
        .find(|n| n.tag_name().name().eq_ignore_ascii_case("body"))
        .unwrap_or_else(|| xml.root_element());
    let mut blocks = Vec::new();
    let mut buf = String::new();
    let mut heading_depth = 0usize;
    let mut images = Vec::new();
    // The block elements open around the text being collected, innermost last.
    let mut open: Vec<narrator_core::SourceBlock> = Vec::new();
    let flush = |buf: &mut String,
                 blocks: &mut Vec<Block>,
                 heading: bool,
                 open: &[narrator_core::SourceBlock],
                 images: &mut Vec<narrator_core::SourceImage>| {
        let text = collapse(buf);
        if !text.is_empty() {
            let mut look = open
                .last()
                .cloned()
                .unwrap_or_else(|| narrator_core::SourceBlock {
                    tag: "p".into(),
                    ..Default::default()
                });
            look.images = std::mem::take(images);
            blocks.push(Block {
                text,
                heading,
                look,
            });
        }
        buf.clear();
    };
    // Explicit stack: deeply nested markup must not overflow the call stack.
    let mut stack: Vec<(Node<'_, '_>, bool)> = vec![(root, true)];
    while let Some((node, entering)) = stack.pop() {
        if node.is_text() {
            buf.push_str(node.text().unwrap_or(""));
            continue;
        }
        if !node.is_element() {
            continue;
        }
        let name = node.tag_name().name().to_ascii_lowercase();
        let block = BLOCK_TAGS.contains(&name.as_str());
        if entering {
            if SKIP_TAGS.contains(&name.as_str()) {
                continue;
            }
            if name == "br" {
                buf.push(' ');
                continue;
            }
            if name == "img" {
                if let Some(src) = node.attribute("src").filter(|s| !s.trim().is_empty()) {
                    images.push(narrator_core::SourceImage {
                        src: resolve(dir, src),
                        alt: collapse(node.attribute("alt").unwrap_or("")),
                    });
                }
                continue;
            }
            if block {
                flush(&mut buf, &mut blocks, heading_depth > 0, &open, &mut images);
                open.push(narrator_core::SourceBlock {
                    tag: name.clone(),
                    class: node
                        .attribute("class")
                        .map(collapse)
                        .filter(|c| !c.is_empty()),
                    images: Vec::new(),
                });
            }
            if is_heading_tag(&name) {
                heading_depth += 1;
            }
            stack.push((node, false));
            let children: Vec<Node<'_, '_>> = node.children().collect();
            stack.extend(children.into_iter().rev().map(|c| (c, true)));
        } else {
            if block {
                flush(&mut buf, &mut blocks, heading_depth > 0, &open, &mut images);
                open.pop();
            }
            if is_heading_tag(&name) {
                heading_depth = heading_depth.saturating_sub(1);
            }
        }
    }
    flush(&mut buf, &mut blocks, false, &open, &mut images);
    (blocks, images)
}

/// Takes block `h` out (a heading that became the chapter's title), its text; its images
/// go with the block after it, or after the chapter's last.
fn take_block(
    blocks: &mut Vec<Block>,
    h: usize,
    images_after: &mut Vec<narrator_core::SourceImage>,
) -> String {
    let mut taken = blocks.remove(h);
    match blocks.get_mut(h) {
        Some(next) => {
            taken.look.images.append(&mut next.look.images);
            next.look.images = taken.look.images;
        }
        None => {
            taken.look.images.append(images_after);
            *images_after = taken.look.images;
        }
    }
    taken.text
}

/// Appends blocks to a chapter: their spoken text, and how they looked when asked.
fn push_blocks(chapter: &mut RawChapter, blocks: Vec<Block>, keep_looks: bool) {
    for b in blocks {
        if keep_looks {
            chapter.looks.push(b.look.clone());
        }
        chapter.blocks.push(b.spoken());
    }
}

/// The stylesheets an XHTML document at `dir` links, as archive paths, in order.
fn stylesheets(xml: &Xml<'_>, dir: &str) -> Vec<String> {
    xml.descendants()
        .filter(|n| n.tag_name().name().eq_ignore_ascii_case("link"))
        .filter(|n| {
            n.attribute("rel").is_some_and(|r| {
                r.split_ascii_whitespace()
                    .any(|w| w.eq_ignore_ascii_case("stylesheet"))
            })
        })
        .filter_map(|n| n.attribute("href"))
        .map(|href| resolve(dir, href))
        .collect()
}

/// All text under a node, with `br` as space.
fn text_of(node: Node<'_, '_>) -> String {
    let mut out = String::new();
    for d in node.descendants() {
        if d.is_text() {
            out.push_str(d.text().unwrap_or(""));
        } else if d.tag_name().name() == "br" {
            out.push(' ');
        }
    }
    out
}

fn collapse(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Lower-case letters and digits only, for comparing a heading with a TOC label.
fn simplify(s: &str) -> String {
    s.chars()
        .filter(|c| c.is_alphanumeric())
        .flat_map(char::to_lowercase)
        .collect()
}

/// UTF-8 text of an entry, lossily, without a BOM.
fn decode(bytes: &[u8]) -> Cow<'_, str> {
    let bytes = bytes.strip_prefix(b"\xef\xbb\xbf").unwrap_or(bytes);
    String::from_utf8_lossy(bytes)
}

fn dir_of(path: &str) -> &str {
    path.rsplit_once('/').map_or("", |(dir, _)| dir)
}

/// Resolves an href (relative to `base_dir`, percent-encoded, maybe with a fragment)
/// to an archive entry name.
fn resolve(base_dir: &str, href: &str) -> String {
    let href = href.split(['#', '?']).next().unwrap_or("");
    let href = percent_decode(href);
    let mut parts: Vec<&str> = if href.starts_with('/') || base_dir.is_empty() {
        Vec::new()
    } else {
        base_dir.split('/').collect()
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

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && let Some(hex) = bytes.get(i + 1..i + 3)
            && let Ok(hex) = std::str::from_utf8(hex)
            && let Ok(b) = u8::from_str_radix(hex, 16)
        {
            out.push(b);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[derive(Debug, Default)]
struct EntityStats {
    count: usize,
    example: Option<String>,
}

/// HTML named entities XML does not know, as characters.
fn html_entity(name: &str) -> Option<&'static str> {
    Some(match name {
        "nbsp" | "ensp" | "emsp" | "thinsp" => " ",
        "shy" | "zwnj" | "zwj" | "lrm" | "rlm" => "",
        "mdash" => "\u{2014}",
        "ndash" => "\u{2013}",
        "hellip" => "\u{2026}",
        "lsquo" => "\u{2018}",
        "rsquo" => "\u{2019}",
        "sbquo" => "\u{201a}",
        "ldquo" => "\u{201c}",
        "rdquo" => "\u{201d}",
        "bdquo" => "\u{201e}",
        "laquo" => "\u{ab}",
        "raquo" => "\u{bb}",
        "lsaquo" => "\u{2039}",
        "rsaquo" => "\u{203a}",
        "bull" => "\u{2022}",
        "middot" => "\u{b7}",
        "copy" => "\u{a9}",
        "reg" => "\u{ae}",
        "trade" => "\u{2122}",
        "deg" => "\u{b0}",
        "plusmn" => "\u{b1}",
        "times" => "\u{d7}",
        "divide" => "\u{f7}",
        "frac12" => "\u{bd}",
        "frac14" => "\u{bc}",
        "frac34" => "\u{be}",
        "sup1" => "\u{b9}",
        "sup2" => "\u{b2}",
        "sup3" => "\u{b3}",
        "pound" => "\u{a3}",
        "euro" => "\u{20ac}",
        "yen" => "\u{a5}",
        "cent" => "\u{a2}",
        "sect" => "\u{a7}",
        "para" => "\u{b6}",
        "dagger" => "\u{2020}",
        "Dagger" => "\u{2021}",
        "prime" => "\u{2032}",
        "Prime" => "\u{2033}",
        "iexcl" => "\u{a1}",
        "iquest" => "\u{bf}",
        "szlig" => "\u{df}",
        "AElig" => "\u{c6}",
        "aelig" => "\u{e6}",
        "OElig" => "\u{152}",
        "oelig" => "\u{153}",
        "Oslash" => "\u{d8}",
        "oslash" => "\u{f8}",
        "Aring" => "\u{c5}",
        "aring" => "\u{e5}",
        "Ccedil" => "\u{c7}",
        "ccedil" => "\u{e7}",
        "ETH" => "\u{d0}",
        "eth" => "\u{f0}",
        "THORN" => "\u{de}",
        "thorn" => "\u{fe}",
        "yuml" => "\u{ff}",
        _ => return accented(name),
    })
}

/// `&eacute;`-style entities: a base vowel (or n) plus an accent name.
fn accented(name: &str) -> Option<&'static str> {
    const TABLE: &[(&str, &str)] = &[
        ("Aacute", "\u{c1}"),
        ("aacute", "\u{e1}"),
        ("Agrave", "\u{c0}"),
        ("agrave", "\u{e0}"),
        ("Acirc", "\u{c2}"),
        ("acirc", "\u{e2}"),
        ("Auml", "\u{c4}"),
        ("auml", "\u{e4}"),
        ("Atilde", "\u{c3}"),
        ("atilde", "\u{e3}"),
        ("Eacute", "\u{c9}"),
        ("eacute", "\u{e9}"),
        ("Egrave", "\u{c8}"),
        ("egrave", "\u{e8}"),
        ("Ecirc", "\u{ca}"),
        ("ecirc", "\u{ea}"),
        ("Euml", "\u{cb}"),
        ("euml", "\u{eb}"),
        ("Iacute", "\u{cd}"),
        ("iacute", "\u{ed}"),
        ("Igrave", "\u{cc}"),
        ("igrave", "\u{ec}"),
        ("Icirc", "\u{ce}"),
        ("icirc", "\u{ee}"),
        ("Iuml", "\u{cf}"),
        ("iuml", "\u{ef}"),
        ("Ntilde", "\u{d1}"),
        ("ntilde", "\u{f1}"),
        ("Oacute", "\u{d3}"),
        ("oacute", "\u{f3}"),
        ("Ograve", "\u{d2}"),
        ("ograve", "\u{f2}"),
        ("Ocirc", "\u{d4}"),
        ("ocirc", "\u{f4}"),
        ("Ouml", "\u{d6}"),
        ("ouml", "\u{f6}"),
        ("Otilde", "\u{d5}"),
        ("otilde", "\u{f5}"),
        ("Uacute", "\u{da}"),
        ("uacute", "\u{fa}"),
        ("Ugrave", "\u{d9}"),
        ("ugrave", "\u{f9}"),
        ("Ucirc", "\u{db}"),
        ("ucirc", "\u{fb}"),
        ("Uuml", "\u{dc}"),
        ("uuml", "\u{fc}"),
        ("Yacute", "\u{dd}"),
        ("yacute", "\u{fd}"),
    ];
    TABLE.iter().find(|(n, _)| *n == name).map(|(_, c)| *c)
}

/// Makes HTML-flavoured XHTML acceptable to an XML parser: known HTML entities become
/// characters, unknown ones are dropped (and counted), a bare `&` becomes `&amp;`.
fn fix_entities<'a>(text: &'a str, stats: &mut EntityStats) -> Cow<'a, str> {
    if !text.contains('&') {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(pos) = rest.find('&') {
        out.push_str(&rest[..pos]);
        let after = &rest[pos + 1..];
        let name_len = after
            .char_indices()
            .take(32)
            .find(|(_, c)| !(c.is_ascii_alphanumeric() || *c == '#'))
            .filter(|(_, c)| *c == ';')
            .map(|(i, _)| i);
        match name_len {
            Some(len) if len > 0 => {
                let name = &after[..len];
                if matches!(name, "amp" | "lt" | "gt" | "quot" | "apos") || valid_char_ref(name) {
                    out.push('&');
                    out.push_str(name);
                    out.push(';');
                } else if let Some(rep) = html_entity(name) {
                    out.push_str(rep);
                } else {
                    stats.count += 1;
                    stats.example.get_or_insert_with(|| name.to_owned());
                }
                rest = &after[len + 1..];
            }
            _ => {
                out.push_str("&amp;");
                rest = after;
            }
        }
    }
    out.push_str(rest);
    Cow::Owned(out)
}

/// `#123` / `#x1F` naming a character XML allows.
fn valid_char_ref(name: &str) -> bool {
    let Some(num) = name.strip_prefix('#') else {
        return false;
    };
    let value = match num.strip_prefix(['x', 'X']) {
        Some(hex) => u32::from_str_radix(hex, 16).ok(),
        None => num.parse::<u32>().ok(),
    };
    value
        .and_then(char::from_u32)
        .is_some_and(|c| matches!(c, '\t' | '\n' | '\r') || !c.is_control())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolves_relative_hrefs() {
        assert_eq!(
            resolve("OEBPS", "Text/ch1.xhtml#p3"),
            "OEBPS/Text/ch1.xhtml"
        );
        assert_eq!(
            resolve("OEBPS/Text", "../Text/ch%201.xhtml"),
            "OEBPS/Text/ch 1.xhtml"
        );
        assert_eq!(resolve("", "./ch1.xhtml"), "ch1.xhtml");
        assert_eq!(resolve("a/b", "/root.xhtml"), "root.xhtml");
        assert_eq!(resolve("a", "../../x"), "x");
    }

    #[test]
    fn entities_fixed_for_xml() {
        let mut st = EntityStats::default();
        let out = fix_entities(
            "a&nbsp;b &mdash; caf&eacute; &amp; &#233; &#0; AT&T &bogus; &",
            &mut st,
        );
        assert_eq!(out, "a b \u{2014} caf\u{e9} &amp; &#233;  AT&amp;T  &amp;");
        assert_eq!(st.count, 2);
    }

    #[test]
    fn blocks_from_xhtml() {
        let xhtml = r#"<?xml version="1.0"?><html xmlns="http://www.w3.org/1999/xhtml"><head><title>T</title><style>p{}</style></head>
<body><h1>Chapter <em>One</em></h1><p>First   para<br/>line.</p><div>Div text<p>inner</p>tail</div>
<script>var x = 1;</script><ul><li>item</li></ul><blockquote>quote</blockquote></body></html>"#;
        let xml = Xml::parse(xhtml).expect("xml");
        let (blocks, _) = xhtml_blocks(&xml, "");
        let texts: Vec<(&str, bool)> = blocks
            .iter()
            .map(|b| (b.text.as_str(), b.heading))
            .collect();
        assert_eq!(
            texts,
            [
                ("Chapter One", true),
                ("First para line.", false),
                ("Div text", false),
                ("inner", false),
                ("tail", false),
                ("item", false),
                ("quote", false),
            ]
        );
    }
}
