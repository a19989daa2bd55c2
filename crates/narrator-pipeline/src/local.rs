//! The embedded seams: segment audio in a local folder, figures in an append-only journal.
//!
//! Layout inside the work folder (`OUT/.narrator/`): `job.json` (the plan's id),
//! `segments/NNNNNN.wav` (written to a temporary name and renamed, so a file that exists is
//! complete), `journal.jsonl` (one [`SegmentRecord`] per line, appended after the audio is
//! stored). A process killed at any point leaves at worst an unrenamed temporary file or a
//! torn last journal line; both are ignored on resume, and that segment is made again.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use narrator_core::{AudioStore, RetryClass, SeamError, SegmentAudio, SegmentRecord, StateStore};

fn io_err(kind: &'static str, what: &str, path: &Path, e: std::io::Error) -> SeamError {
    // A local disk that fails (full, read-only) is the machine's fault, not the segment's.
    SeamError::new(
        kind,
        RetryClass::Infrastructure,
        format!("{what} {}: {e}", path.display()),
        e,
    )
}

/// Segment audio as WAV files in a folder; outputs moved into the output folder.
#[derive(Debug, Clone)]
pub struct LocalAudioStore {
    segments: PathBuf,
    outputs: PathBuf,
}

impl LocalAudioStore {
    /// Segments go to `segments`, finished outputs to `outputs`.
    pub fn new(segments: PathBuf, outputs: PathBuf) -> Result<Self, SeamError> {
        std::fs::create_dir_all(&segments)
            .map_err(|e| io_err("store_io", "cannot create", &segments, e))?;
        Ok(Self { segments, outputs })
    }

    fn path(&self, index: u32) -> PathBuf {
        self.segments.join(format!("{index:06}.wav"))
    }
}

impl AudioStore for LocalAudioStore {
    async fn put_segment(
        &self,
        _job: &str,
        index: u32,
        audio: &SegmentAudio,
    ) -> Result<(), SeamError> {
        let path = self.path(index);
        let tmp = path.with_extension("wav.tmp");
        narrator_audio::encode_wav_file(&tmp, audio.sample_rate, &audio.samples).map_err(|e| {
            SeamError::new(
                "store_io",
                RetryClass::Infrastructure,
                format!("cannot write {}: {e}", tmp.display()),
                e,
            )
        })?;
        std::fs::rename(&tmp, &path).map_err(|e| io_err("store_io", "cannot rename into", &path, e))
    }

    async fn get_segment(&self, _job: &str, index: u32) -> Result<SegmentAudio, SeamError> {
        let path = self.path(index);
        let (sample_rate, samples) = narrator_audio::read_wav_i16(&path).map_err(|e| {
            SeamError::new(
                "store_io",
                RetryClass::Infrastructure,
                format!("cannot read segment audio {}: {e}", path.display()),
                e,
            )
        })?;
        Ok(SegmentAudio {
            sample_rate,
            samples,
        })
    }

    async fn has_segment(&self, _job: &str, index: u32) -> Result<bool, SeamError> {
        Ok(self.path(index).is_file())
    }

    async fn put_output(&self, _job: &str, name: &str, file: &Path) -> Result<(), SeamError> {
        let dest = self.outputs.join(name);
        if file != dest {
            std::fs::rename(file, &dest)
                .map_err(|e| io_err("store_io", "cannot move output to", &dest, e))?;
        }
        Ok(())
    }
}

/// Per-segment figures appended to a JSON-lines journal.
#[derive(Debug)]
pub struct JournalStateStore {
    path: PathBuf,
    file: Mutex<std::fs::File>,
}

impl JournalStateStore {
    /// Opens (creating) the journal at `path`.
    pub fn open(path: PathBuf) -> Result<Self, SeamError> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|e| io_err("state_io", "cannot open journal", &path, e))?;
        Ok(Self {
            path,
            file: Mutex::new(file),
        })
    }
}

impl JournalStateStore {
    /// Drops from the journal at `path` (if any) the records of segments that were made
    /// without word timings although they had something to say: a job that now wants
    /// words (subtitles, an EPUB) makes them again instead of resuming them untimed. The
    /// journal is rewritten whole (a temporary file renamed over it) before it is opened.
    /// Returns how many were dropped.
    pub fn forget_untimed(path: &Path) -> Result<usize, SeamError> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
            Err(e) => return Err(io_err("state_io", "cannot read", path, e)),
        };
        let mut kept = String::with_capacity(text.len());
        let mut dropped = 0;
        for line in text.lines() {
            let untimed = serde_json::from_str::<SegmentRecord>(line)
                .is_ok_and(|r| r.words.is_empty() && r.phoneme_ids > 0);
            if untimed {
                dropped += 1;
            } else {
                kept.push_str(line);
                kept.push('\n');
            }
        }
        if dropped > 0 {
            let tmp = path.with_extension("jsonl.tmp");
            std::fs::write(&tmp, kept)
                .and_then(|()| std::fs::rename(&tmp, path))
                .map_err(|e| io_err("state_io", "cannot rewrite", path, e))?;
        }
        Ok(dropped)
    }
}

impl StateStore for JournalStateStore {
    async fn record_segment(&self, _job: &str, record: &SegmentRecord) -> Result<(), SeamError> {
        let mut line = serde_json::to_vec(record).map_err(|e| {
            SeamError::new(
                "state_io",
                RetryClass::Permanent,
                "cannot encode a segment record",
                e,
            )
        })?;
        line.push(b'\n');
        let mut f = self.file.lock().map_err(|_| {
            SeamError::msg("state_io", RetryClass::Permanent, "journal lock poisoned")
        })?;
        // One write call per line: a kill leaves at worst one torn final line.
        f.write_all(&line)
            .map_err(|e| io_err("state_io", "cannot append to", &self.path, e))
    }

    async fn finished_segments(&self, _job: &str) -> Result<Vec<SegmentRecord>, SeamError> {
        let text = std::fs::read_to_string(&self.path)
            .map_err(|e| io_err("state_io", "cannot read", &self.path, e))?;
        let mut by_index = std::collections::BTreeMap::new();
        for line in text.lines() {
            if let Ok(r) = serde_json::from_str::<SegmentRecord>(line) {
                by_index.insert(r.index, r);
            }
        }
        Ok(by_index.into_values().collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(index: u32) -> SegmentRecord {
        SegmentRecord {
            index,
            samples: 10,
            sample_rate: 22050,
            audio_seconds: 1.0,
            inference_seconds: 0.1,
            queue_wait_seconds: 0.0,
            batch_size: 1,
            attempts: 1,
            worker: "w".into(),
            phoneme_ids: 3,
            packed: None,
            words: Vec::new(),
        }
    }

    #[tokio::test]
    async fn journal_survives_a_torn_last_line_and_duplicates() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("journal.jsonl");
        let j = JournalStateStore::open(path.clone()).expect("open");
        j.record_segment("j", &rec(1)).await.expect("rec");
        j.record_segment("j", &rec(0)).await.expect("rec");
        j.record_segment("j", &rec(1)).await.expect("rec");
        drop(j);
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .expect("open");
        f.write_all(b"{\"index\":2,\"samp").expect("torn");
        let j = JournalStateStore::open(path).expect("reopen");
        let idx: Vec<u32> = j
            .finished_segments("j")
            .await
            .expect("read")
            .iter()
            .map(|r| r.index)
            .collect();
        assert_eq!(idx, [0, 1]);
    }

    #[tokio::test]
    async fn stored_segments_read_back_exactly_and_temporaries_do_not_count() {
        let dir = tempfile::tempdir().expect("tmp");
        let s =
            LocalAudioStore::new(dir.path().join("seg"), dir.path().to_path_buf()).expect("store");
        let audio = SegmentAudio {
            sample_rate: 22050,
            samples: vec![1, -2, 3, i16::MAX, i16::MIN],
        };
        assert!(!s.has_segment("j", 4).await.expect("has"));
        std::fs::write(dir.path().join("seg/000004.wav.tmp"), b"half").expect("tmp");
        assert!(!s.has_segment("j", 4).await.expect("has"));
        s.put_segment("j", 4, &audio).await.expect("put");
        assert!(s.has_segment("j", 4).await.expect("has"));
        assert_eq!(s.get_segment("j", 4).await.expect("get"), audio);
    }
}
