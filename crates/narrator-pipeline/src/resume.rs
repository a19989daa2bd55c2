//! Resuming an embedded run from what an earlier one left in its output folder: a finished
//! book (`out/manifest.json` and the files it lists) and the work folder
//! (`out/.narrator/`: `job.json`, the journal of stored segments, the segments).
//!
//! [`prepare`] is the step `narrator run` takes before synthesis: the book is already
//! finished as asked ([`Previous::Finished`]), or an earlier run of the same job left
//! segments to resume from ([`Previous::Resume`]), or this run starts fresh. What makes
//! a finished book stand for this run is [`finished_as_asked`], one named reason per
//! thing that must match ([`Stale`]).

use std::path::{Path, PathBuf};

use anyhow::Context;
use narrator_audio::AudioFormat;
use narrator_core::{JobPlan, Manifest};
use serde::{Deserialize, Serialize};

/// The outputs a run asks for, as a finished book's manifest must show them.
#[derive(Debug, Clone, Copy)]
pub struct Outputs<'a> {
    pub format: AudioFormat,
    /// One file per chapter too (where the format has chapter files).
    pub chapter_files: bool,
    /// How many subtitle files.
    pub subtitles: usize,
    /// The read-along EPUB's overlay (`words`, `sentences`), if one is asked for.
    pub epub_overlay: Option<&'a str>,
}

/// Why a finished book in the output folder does not stand for this run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stale {
    /// Another text, voice, rate or rules (the job id differs).
    OtherJob,
    /// Another audio format.
    OtherFormat,
    /// Other title, metadata or cover: the files are rebuilt from the kept segments.
    OtherTags,
    /// Chapter files asked for and not there, or there and not asked for.
    OtherChapterFiles,
    /// Another number of subtitle files.
    OtherSubtitles,
    /// Another read-along EPUB overlay, or none.
    OtherOverlay,
    /// A file the manifest lists is gone.
    Missing(String),
}

/// Whether the finished book `m` in `out` is this plan's, made as `want` asks, with every
/// file it lists in place.
pub fn finished_as_asked(
    m: &Manifest,
    plan: &JobPlan,
    want: &Outputs<'_>,
    out: &Path,
) -> Result<(), Stale> {
    if m.job_id != plan.job_id {
        return Err(Stale::OtherJob);
    }
    if m.format != want.format.extension() {
        return Err(Stale::OtherFormat);
    }
    if !same_tags(m, plan) {
        return Err(Stale::OtherTags);
    }
    let chapter_files = want.chapter_files && want.format.supports_chapter_files();
    if m.chapters.iter().any(|c| c.file.is_some() != chapter_files) {
        return Err(Stale::OtherChapterFiles);
    }
    if m.book.subtitles.len() != want.subtitles {
        return Err(Stale::OtherSubtitles);
    }
    if m.book.epub_overlay.as_deref() != want.epub_overlay {
        return Err(Stale::OtherOverlay);
    }
    let listed = std::iter::once(&m.book.file)
        .chain(&m.book.subtitles)
        .chain(&m.book.epub)
        .chain(m.chapters.iter().flat_map(|c| &c.file));
    for f in listed {
        if !out.join(f).is_file() {
            return Err(Stale::Missing(f.clone()));
        }
    }
    Ok(())
}

/// Whether a finished book's files carry the tags this plan would give them (a new
/// `--author` or cover rebuilds the files from the kept segments).
fn same_tags(m: &Manifest, plan: &JobPlan) -> bool {
    let without_cover = narrator_core::BookMeta {
        cover: None,
        resources: Vec::new(),
        ..plan.meta.clone()
    };
    let cover = plan
        .meta
        .cover
        .as_ref()
        .map(|c| (c.mime.as_str(), c.data.len() as u64));
    m.book.title == plan.title
        && m.book.meta == without_cover
        && m.book.cover.as_ref().map(|c| (c.mime.as_str(), c.bytes)) == cover
}

/// The work folder's `job.json`: which job its segments belong to, and the wall time
/// spent on it so far (a resumed job's figures include it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobState {
    pub job_id: String,
    pub segments: usize,
    pub wall_seconds: f64,
}

impl JobState {
    fn path(work: &Path) -> PathBuf {
        work.join("job.json")
    }

    /// The state an earlier run left in `work`, if it can be read.
    pub fn read(work: &Path) -> Option<JobState> {
        let bytes = std::fs::read(Self::path(work)).ok()?;
        serde_json::from_slice(&bytes).ok()
    }

    /// Writes it to `work` (through a temporary file: a crash leaves the old one).
    pub fn save(&self, work: &Path) -> anyhow::Result<()> {
        let tmp = work.join("job.json.tmp");
        std::fs::write(&tmp, serde_json::to_vec(self)?)
            .with_context(|| format!("writing {}", tmp.display()))?;
        std::fs::rename(&tmp, Self::path(work))
            .with_context(|| format!("writing {}", Self::path(work).display()))?;
        Ok(())
    }
}

/// What an earlier run left for this one.
#[derive(Debug)]
pub enum Previous {
    /// The book is finished as asked: nothing to do.
    Finished(Box<Manifest>),
    /// Segments of this job are kept in the work folder, after this much wall time.
    Resume { wall_seconds: f64 },
    /// Nothing of this job: start from the first segment.
    Fresh,
}

/// The step before synthesis: a finished book that stands for this run is returned as it
/// is; one that does not is removed with the files it lists (a manifest from an earlier
/// job must not be mistaken for this one's, and a complete one must not survive a rebuild
/// half-done); a work folder of another job is cleared. The work folder `out/.narrator`
/// then exists with this job's state in it.
pub fn prepare(out: &Path, plan: &JobPlan, want: &Outputs<'_>) -> anyhow::Result<Previous> {
    let manifest_path = out.join("manifest.json");
    if let Ok(bytes) = std::fs::read(&manifest_path) {
        let found = serde_json::from_slice::<Manifest>(&bytes).ok();
        if let Some(m) = found.as_ref() {
            match finished_as_asked(m, plan, want, out) {
                Ok(()) => return Ok(Previous::Finished(Box::new(m.clone()))),
                Err(why) => {
                    tracing::debug!(?why, "the finished book in the output folder is rebuilt")
                }
            }
            // The outputs it lists belong to another job or format: remove them with it.
            for f in m
                .chapters
                .iter()
                .flat_map(|c| &c.file)
                .chain([&m.book.file])
            {
                if !f.contains('/') {
                    let _ = std::fs::remove_file(out.join(f));
                }
            }
        }
        std::fs::remove_file(&manifest_path)
            .with_context(|| format!("removing stale {}", manifest_path.display()))?;
    }
    let work = out.join(".narrator");
    let previous = match JobState::read(&work) {
        Some(s) if s.job_id == plan.job_id => Previous::Resume {
            wall_seconds: s.wall_seconds,
        },
        Some(_) => {
            std::fs::remove_dir_all(&work)
                .with_context(|| format!("clearing {} of another job", work.display()))?;
            Previous::Fresh
        }
        None => Previous::Fresh,
    };
    std::fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;
    let wall_seconds = match previous {
        Previous::Resume { wall_seconds } => wall_seconds,
        _ => 0.0,
    };
    JobState {
        job_id: plan.job_id.clone(),
        segments: plan.segments.len(),
        wall_seconds,
    }
    .save(&work)?;
    Ok(previous)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(job: &str) -> JobPlan {
        serde_json::from_value(serde_json::json!({
            "job_id": job, "title": "Book", "source": "book.txt", "voice": "v",
            "chapters": [], "segments": [], "warnings": [],
        }))
        .expect("plan")
    }

    fn manifest(job: &str, format: AudioFormat) -> Manifest {
        let ext = format.extension();
        serde_json::from_value(serde_json::json!({
            "job_id": job, "narrator_version": "0", "source": "book.txt", "format": ext,
            "book": { "title": "Book", "file": format!("book.{ext}"), "seconds": 1.0 },
            "chapters": [{ "title": "One", "seconds": 1.0, "start_seconds": 0.0 }],
            "voice": "v", "sample_rate": 22050, "audio_seconds": 1.0, "speech_seconds": 1.0,
            "wall_seconds": 1.0, "rtf": 1.0, "segments": [], "warnings": [],
        }))
        .expect("manifest")
    }

    const OPUS: Outputs<'static> = Outputs {
        format: AudioFormat::Opus,
        chapter_files: false,
        subtitles: 0,
        epub_overlay: None,
    };

    #[test]
    fn a_finished_book_stands_only_as_asked_and_whole() {
        let dir = tempfile::tempdir().expect("dir");
        let out = dir.path();
        let m = manifest("j1", AudioFormat::Opus);
        // Its file is not there yet.
        assert_eq!(
            finished_as_asked(&m, &plan("j1"), &OPUS, out),
            Err(Stale::Missing("book.opus".into()))
        );
        std::fs::write(out.join("book.opus"), b"x").expect("write");
        assert_eq!(finished_as_asked(&m, &plan("j1"), &OPUS, out), Ok(()));
        assert_eq!(
            finished_as_asked(&m, &plan("j2"), &OPUS, out),
            Err(Stale::OtherJob)
        );
        let mp3 = Outputs {
            format: AudioFormat::Mp3,
            ..OPUS
        };
        assert_eq!(
            finished_as_asked(&m, &plan("j1"), &mp3, out),
            Err(Stale::OtherFormat)
        );
        let chapters = Outputs {
            chapter_files: true,
            ..OPUS
        };
        assert_eq!(
            finished_as_asked(&m, &plan("j1"), &chapters, out),
            Err(Stale::OtherChapterFiles)
        );
        let subs = Outputs {
            subtitles: 1,
            ..OPUS
        };
        assert_eq!(
            finished_as_asked(&m, &plan("j1"), &subs, out),
            Err(Stale::OtherSubtitles)
        );
        let epub = Outputs {
            epub_overlay: Some("words"),
            ..OPUS
        };
        assert_eq!(
            finished_as_asked(&m, &plan("j1"), &epub, out),
            Err(Stale::OtherOverlay)
        );
        let mut retitled = plan("j1");
        retitled.title = "Another".into();
        assert_eq!(
            finished_as_asked(&m, &retitled, &OPUS, out),
            Err(Stale::OtherTags)
        );
    }

    #[test]
    fn prepare_returns_a_finished_book_resumes_its_job_and_clears_another() {
        let dir = tempfile::tempdir().expect("dir");
        let out = dir.path();
        // Nothing there: fresh, and the work folder holds this job's state.
        assert!(matches!(
            prepare(out, &plan("j1"), &OPUS).expect("prepare"),
            Previous::Fresh
        ));
        let work = out.join(".narrator");
        let state = JobState::read(&work).expect("state");
        assert_eq!((state.job_id.as_str(), state.wall_seconds), ("j1", 0.0));
        // An earlier run of the job spent 12 s: resumed with its time.
        JobState {
            wall_seconds: 12.0,
            ..state
        }
        .save(&work)
        .expect("save");
        std::fs::write(work.join("journal.jsonl"), b"").expect("journal");
        match prepare(out, &plan("j1"), &OPUS).expect("prepare") {
            Previous::Resume { wall_seconds } => assert_eq!(wall_seconds, 12.0),
            other => panic!("expected a resume, got {other:?}"),
        }
        // Another job: the work folder is cleared.
        assert!(matches!(
            prepare(out, &plan("j2"), &OPUS).expect("prepare"),
            Previous::Fresh
        ));
        assert!(!work.join("journal.jsonl").exists());
        // A finished book of j2 stands for j2 as asked, and is removed for j3.
        let m = manifest("j2", AudioFormat::Opus);
        std::fs::write(
            out.join("manifest.json"),
            serde_json::to_vec(&m).expect("json"),
        )
        .expect("write");
        std::fs::write(out.join("book.opus"), b"x").expect("write");
        assert!(
            matches!(prepare(out, &plan("j2"), &OPUS).expect("prepare"), Previous::Finished(f) if f.job_id == "j2")
        );
        assert!(matches!(
            prepare(out, &plan("j3"), &OPUS).expect("prepare"),
            Previous::Fresh
        ));
        assert!(!out.join("manifest.json").exists() && !out.join("book.opus").exists());
    }
}
