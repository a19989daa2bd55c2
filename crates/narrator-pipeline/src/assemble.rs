//! Chapter files, the whole-book file and `manifest.json` from stored segment audio.
//!
//! The layout (where every segment and pause falls) is a pure function of the plan and
//! the recorded sample counts, computed before any audio is read, so chapter marks can go
//! into the book file's header. Audio then streams segment by segment into the book's
//! encoder (and, when chapter files are asked for, its chapter's): memory stays at one
//! segment however long the book is.
//! Every file is written under a staging name and published through the store; the
//! manifest goes last, so its presence means everything it lists is complete.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use narrator_audio::{
    AudioFormat, AudioSink, ChapterMark, EncoderSpec, PauseKind, Pauses, Tags, create_file_encoder,
};
use narrator_core::{
    AudioStore, BookEntry, ChapterEntry, CoverEntry, JobPlan, Manifest, SegmentEntry, SegmentRecord,
};

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;

use futures_util::FutureExt;
use futures_util::future::{BoxFuture, Shared};
use narrator_core::{PackedAt, SeamError, SegmentAudio};
use tokio::task::{JoinHandle, JoinSet};
use tracing::{Instrument, info_span};

use crate::PipelineError;

/// Assembly settings.
#[derive(Debug, Clone)]
pub struct AssembleOptions {
    /// Output format.
    pub format: AudioFormat,
    /// The voice's output rate in Hz (its family's `Capabilities::sample_rate`: the
    /// loaded voice's, or the rate its job's segments were recorded at): every output is
    /// made at this rate, and a segment stored at another fails the assembly.
    pub sample_rate: u32,
    /// Also one file per chapter (formats that support them): every sample is then
    /// encoded twice, once for its chapter's file and once for the book's.
    pub chapter_files: bool,
    /// Pause lengths.
    pub pauses: Pauses,
    /// Folder for files being written (same filesystem as the outputs for a local store).
    pub staging: PathBuf,
    /// Subtitle files to write beside the book file (and each chapter file).
    pub subtitles: Vec<crate::SubtitleFormat>,
    /// Also a read-along EPUB 3 (`--format epub3`) with overlays this fine, from the
    /// chapter files: `format` must then be MP3 and `chapter_files` on (the EPUB's audio).
    pub epub3: Option<crate::epub3::Overlay>,
}

/// The staging folder's subfolder where the EPUB's copies of the chapter files wait.
const EPUB_AUDIO: &str = "epub-audio";

/// A file-name-safe form of a title: lowercase ASCII letters and digits joined by `-`.
pub fn slug(title: &str, max: usize) -> String {
    let mut s = String::new();
    for c in title.chars() {
        if c.is_ascii_alphanumeric() {
            s.push(c.to_ascii_lowercase());
        } else if !s.ends_with('-') && !s.is_empty() {
            s.push('-');
        }
        if s.len() >= max {
            break;
        }
    }
    s.trim_end_matches('-').to_string()
}

/// Where one chapter falls.
#[derive(Debug, Clone, PartialEq)]
pub struct ChapterLayout {
    /// Title.
    pub title: String,
    /// Output file name; none for formats without chapter files (M4B).
    pub file: Option<String>,
    /// Samples in the chapter (no trailing chapter pause).
    pub samples: u64,
    /// First sample of the chapter in the book file.
    pub book_start: u64,
}

/// Where everything falls, in samples.
#[derive(Debug, Clone, PartialEq)]
pub struct Layout {
    /// Chapters in order.
    pub chapters: Vec<ChapterLayout>,
    /// `(book start, samples)` of every segment, by index.
    pub segments: Vec<(u64, u64)>,
    /// Samples in the book file.
    pub book_samples: u64,
    /// Book file name.
    pub book_file: String,
}

/// Computes the layout. `records` must hold one record per segment, sorted by index;
/// `chapter_files`: chapters get files of their own where `format` supports them.
pub fn layout(
    plan: &JobPlan,
    records: &[SegmentRecord],
    pauses: &Pauses,
    rate: u32,
    format: AudioFormat,
    chapter_files: bool,
) -> Layout {
    let ext = format.extension();
    let width = plan.chapters.len().to_string().len().max(2);
    let mut chapters = Vec::new();
    let mut segments = Vec::with_capacity(records.len());
    let mut pos = 0u64;
    for (ci, ch) in plan.chapters.iter().enumerate() {
        if ci > 0 {
            pos += pauses.samples(PauseKind::Chapter, rate) as u64;
        }
        let start = pos;
        let range = ch.first_segment as usize..(ch.first_segment + ch.segment_count) as usize;
        let last = range.end.saturating_sub(1);
        for i in range {
            let n = records.get(i).map_or(0, |r| r.samples);
            segments.push((pos, n));
            pos += n;
            if i != last {
                pos += pauses.samples(plan.segments[i].pause_after, rate) as u64;
            }
        }
        let name = slug(&ch.title, 48);
        let file = (chapter_files && format.supports_chapter_files()).then(|| {
            if name.is_empty() {
                format!("{:0width$}.{ext}", ci + 1)
            } else {
                format!("{:0width$}-{name}.{ext}", ci + 1)
            }
        });
        chapters.push(ChapterLayout {
            title: ch.title.clone(),
            file,
            samples: pos - start,
            book_start: start,
        });
    }
    let book = slug(&plan.title, 64);
    // Chapter files always start with their number; the book's never does (a title such
    // as "01 Intro" would otherwise name the same file as a first chapter "Intro").
    let book_file = if book.is_empty() {
        format!("book.{ext}")
    } else if book.starts_with(|c: char| c.is_ascii_digit()) {
        format!("book-{book}.{ext}")
    } else {
        format!("{book}.{ext}")
    };
    Layout {
        chapters,
        segments,
        book_samples: pos,
        book_file,
    }
}

fn encoder(path: &Path, spec: &EncoderSpec) -> Result<Box<dyn AudioSink + Send>, PipelineError> {
    Ok(create_file_encoder(spec, path)?)
}

/// The book's tags for every output: author, book title, narrator, date, language,
/// publisher, cover; `title` is the file's own (the book's, or a chapter's).
pub fn book_tags(plan: &JobPlan, title: &str) -> Tags {
    Tags {
        title: Some(title.to_string()),
        artist: plan.meta.author.clone(),
        album: Some(plan.title.clone()),
        narrator: Some(format!("narrator ({})", plan.voice)),
        date: plan.meta.date.clone(),
        language: plan.meta.language.clone(),
        publisher: plan.meta.publisher.clone(),
        genre: Some("Audiobook".to_string()),
        cover: plan.meta.cover.clone(),
    }
}

/// Segments always read ahead during assembly, whatever their size.
const READ_AHEAD: usize = 64;
/// More segments are read ahead while their stored bytes stay within this budget (an
/// object store's first byte takes tens of milliseconds: small segments need many reads
/// in flight to keep the encoders busy; large ones are bounded by memory).
const READ_AHEAD_BYTES: u64 = 8 << 20;
/// At most this many segments ahead, however small.
const READ_AHEAD_MAX: usize = 1024;

/// A pack being fetched once for all of its segments.
type PackFetch = Shared<BoxFuture<'static, Result<Arc<Vec<u8>>, Arc<SeamError>>>>;

/// Segment audio in index order, fetched by tasks ahead of the reader ([`READ_AHEAD`],
/// or more within [`READ_AHEAD_BYTES`]): a networked store's latency overlaps the
/// encoding instead of adding up, and the fetches progress while the encoders run. A pack (several segments in one object)
/// is fetched once, by its first segment, and kept until its last segment is taken.
struct ReadAhead<A> {
    store: Arc<A>,
    job: String,
    next_to_fetch: u32,
    total: u32,
    /// Where each segment is, by index (`None`: under its own key).
    places: Vec<Option<PackedAt>>,
    /// Packs fetched or being fetched, with how many of their segments are still to come.
    packs: HashMap<String, (PackFetch, usize)>,
    /// Segments per pack.
    per_pack: HashMap<String, usize>,
    /// Stored bytes of each segment, by index (from its record).
    sizes: Vec<u64>,
    /// Stored bytes of the segments in `pending`.
    bytes_ahead: u64,
    pending: VecDeque<(JoinHandle<Result<SegmentAudio, SeamError>>, u64)>,
}

impl<A: AudioStore + 'static> ReadAhead<A> {
    fn new(store: Arc<A>, job: String, records: &[SegmentRecord], total: usize) -> Self {
        let mut places = vec![None; total];
        let mut sizes = vec![0; total];
        let mut per_pack = HashMap::new();
        for r in records {
            let Some(size) = sizes.get_mut(r.index as usize) else {
                continue;
            };
            // A WAV of 16-bit samples, when the record does not say where it is.
            *size = r.samples.saturating_mul(2).saturating_add(44);
            if let Some(at) = &r.packed {
                *per_pack.entry(at.key.clone()).or_insert(0) += 1;
                *size = at.len;
                places[r.index as usize] = Some(at.clone());
            }
        }
        let mut r = Self {
            store,
            job,
            next_to_fetch: 0,
            total: u32::try_from(total).unwrap_or(u32::MAX),
            places,
            packs: HashMap::new(),
            per_pack,
            sizes,
            bytes_ahead: 0,
            pending: VecDeque::with_capacity(READ_AHEAD),
        };
        r.fill();
        r
    }

    /// The shared fetch of `key`, started by the first segment that needs it.
    fn pack(&mut self, key: &str) -> PackFetch {
        if let Some((fetch, left)) = self.packs.get_mut(key) {
            let fetch = fetch.clone();
            *left -= 1;
            if *left == 0 {
                self.packs.remove(key);
            }
            return fetch;
        }
        let (store, job, k) = (self.store.clone(), self.job.clone(), key.to_owned());
        let span = info_span!(
            "fetch",
            otel.name = "GET segment pack",
            otel.kind = "client"
        );
        let fetch = async move {
            store
                .get_pack(&job, &k)
                .await
                .map(Arc::new)
                .map_err(Arc::new)
        }
        .instrument(span)
        .boxed()
        .shared();
        let left = self.per_pack.get(key).copied().unwrap_or(1);
        if left > 1 {
            self.packs.insert(key.to_owned(), (fetch.clone(), left - 1));
        }
        fetch
    }

    fn fill(&mut self) {
        while self.next_to_fetch < self.total && self.pending.len() < READ_AHEAD_MAX {
            let i = self.next_to_fetch;
            let size = self.sizes.get(i as usize).copied().unwrap_or(0);
            if self.pending.len() >= READ_AHEAD
                && self.bytes_ahead.saturating_add(size) > READ_AHEAD_BYTES
            {
                break;
            }
            let task = match self.places[i as usize].clone() {
                None => {
                    let (store, job) = (self.store.clone(), self.job.clone());
                    tokio::spawn(async move { store.get_segment(&job, i).await })
                }
                Some(at) => {
                    let fetch = self.pack(&at.key);
                    tokio::spawn(async move {
                        let pack = fetch
                            .await
                            .map_err(|e| SeamError::msg(e.kind, e.class, e.message.clone()))?;
                        segment_in_pack(&pack, &at, i)
                    })
                }
            };
            self.pending.push_back((task, size));
            self.bytes_ahead += size;
            self.next_to_fetch += 1;
        }
    }

    async fn next(&mut self) -> Result<SegmentAudio, PipelineError> {
        let (handle, size) = self
            .pending
            .pop_front()
            .ok_or(PipelineError::Internal("read past the last segment"))?;
        self.bytes_ahead -= size;
        let audio = handle
            .await
            .map_err(|e| PipelineError::Task(e.to_string()))??;
        self.fill();
        Ok(audio)
    }
}

/// Segment `index`'s audio: the WAV at `at` within `pack`.
fn segment_in_pack(pack: &[u8], at: &PackedAt, index: u32) -> Result<SegmentAudio, SeamError> {
    let range = usize::try_from(at.offset)
        .ok()
        .zip(usize::try_from(at.offset.saturating_add(at.len)).ok())
        .filter(|&(_, end)| end <= pack.len());
    let Some((start, end)) = range else {
        return Err(SeamError::msg(
            "store_corrupt",
            narrator_core::RetryClass::Permanent,
            format!(
                "segment {index}: pack {:?} has {} bytes, the record says {}..{}; store the job again",
                at.key,
                pack.len(),
                at.offset,
                at.offset.saturating_add(at.len)
            ),
        ));
    };
    let (sample_rate, samples) =
        narrator_audio::decode_wav_bytes(&pack[start..end]).map_err(|e| {
            SeamError::new(
                "store_corrupt",
                narrator_core::RetryClass::Permanent,
                format!("segment {index} in pack {:?}: {e}", at.key),
                e,
            )
        })?;
    Ok(SegmentAudio {
        sample_rate,
        samples,
    })
}

impl<A> Drop for ReadAhead<A> {
    fn drop(&mut self) {
        for (h, _) in &self.pending {
            h.abort();
        }
    }
}

/// Outputs uploading at once while the assembly goes on.
const UPLOADS: usize = 2;

/// An upload task's outcome as the assembly's.
fn uploaded(
    done: Result<Result<(), SeamError>, tokio::task::JoinError>,
) -> Result<(), PipelineError> {
    done.map_err(|e| PipelineError::Task(e.to_string()))?
        .map_err(PipelineError::from)
}

/// The voice's rate (the options') and the layout of every output.
fn final_layout(
    plan: &JobPlan,
    records: &[SegmentRecord],
    opts: &AssembleOptions,
) -> (u32, Layout) {
    let rate = opts.sample_rate;
    let lay = layout(
        plan,
        records,
        &opts.pauses,
        rate,
        opts.format,
        opts.chapter_files,
    );
    (rate, lay)
}

/// Segment audio in index order, each with the sample count its record gives.
trait InOrder {
    /// Segment `index`'s audio (the segments are asked for in order) and its recorded length.
    async fn next(&mut self, index: u32) -> Result<(SegmentAudio, u64), PipelineError>;
}

/// [`ReadAhead`] with the records it was made from.
struct Recorded<'a, A> {
    ahead: ReadAhead<A>,
    records: &'a [SegmentRecord],
}

impl<A: AudioStore + 'static> InOrder for Recorded<'_, A> {
    async fn next(&mut self, index: u32) -> Result<(SegmentAudio, u64), PipelineError> {
        let audio = self.ahead.next().await?;
        let expected = self.records.get(index as usize).map_or(0, |r| r.samples);
        Ok((audio, expected))
    }
}

/// The book's encoder settings; `starts`: each chapter's first sample in the book
/// (`None`: not known yet, every chapter at 0 until [`AudioSink::set_chapters`]).
fn book_spec(
    plan: &JobPlan,
    opts: &AssembleOptions,
    lay: &Layout,
    rate: u32,
    starts: bool,
) -> EncoderSpec {
    let mut spec = EncoderSpec::new(opts.format, rate);
    spec.tags = book_tags(plan, &plan.title);
    spec.chapters = chapter_marks(lay, rate, starts);
    spec
}

/// The book file's chapter marks (at 0 when `starts` is false).
fn chapter_marks(lay: &Layout, rate: u32, starts: bool) -> Vec<ChapterMark> {
    lay.chapters
        .iter()
        .map(|c| ChapterMark {
            title: c.title.clone(),
            start_seconds: if starts {
                c.book_start as f64 / f64::from(rate)
            } else {
                0.0
            },
        })
        .collect()
}

/// Outputs encoded from every segment: the chapter files uploaded or uploading, the
/// book's encoder still open (its chapters may still move).
struct Encoded {
    book: Box<dyn AudioSink + Send>,
    book_path: PathBuf,
    uploads: JoinSet<Result<(), SeamError>>,
    read_wait: Duration,
    upload_wait: Duration,
}

/// Streams every segment, in order, with the pauses between them, into the book's encoder
/// and (with chapter files) its chapter's; each chapter file goes up while the next one
/// is encoded. `lay` gives the file names (its positions are not used).
async fn encode_outputs<A: AudioStore + 'static>(
    plan: &JobPlan,
    lay: &Layout,
    book_spec: &EncoderSpec,
    opts: &AssembleOptions,
    store: &Arc<A>,
    source: &mut impl InOrder,
) -> Result<Encoded, PipelineError> {
    let rate = book_spec.sample_rate;
    std::fs::create_dir_all(&opts.staging).map_err(|source| PipelineError::Io {
        path: opts.staging.clone(),
        source,
    })?;
    let book_path = opts.staging.join(&lay.book_file);
    let mut book = encoder(&book_path, book_spec)?;
    let (mut read_wait, mut upload_wait) = (Duration::ZERO, Duration::ZERO);
    let mut uploads: JoinSet<Result<(), SeamError>> = JoinSet::new();

    for (ci, (ch, cl)) in plan.chapters.iter().zip(&lay.chapters).enumerate() {
        if ci > 0 {
            book.write_silence(opts.pauses.samples(PauseKind::Chapter, rate))?;
        }
        let mut spec = EncoderSpec::new(opts.format, rate);
        spec.tags = book_tags(plan, &ch.title);
        let path = cl.file.as_ref().map(|f| opts.staging.join(f));
        let encode = info_span!(
            "encode chapter",
            narrator.chapter = ci,
            narrator.segments = ch.segment_count
        );
        let mut chapter = match &path {
            Some(path) => Some(encode.in_scope(|| encoder(path, &spec))?),
            None => None,
        };
        let first = ch.first_segment;
        let end = first + ch.segment_count;
        async {
            for i in first..end {
                let waited = Instant::now();
                let (audio, expected) = source.next(i).await?;
                read_wait += waited.elapsed();
                if audio.sample_rate != rate {
                    return Err(PipelineError::Corrupt {
                        index: i,
                        reason: format!(
                            "stored at {} Hz, and the voice's rate is {rate} Hz",
                            audio.sample_rate
                        ),
                    });
                }
                if audio.samples.len() as u64 != expected {
                    return Err(PipelineError::Corrupt {
                        index: i,
                        reason: format!(
                            "{} samples stored, {expected} recorded",
                            audio.samples.len()
                        ),
                    });
                }
                if let Some(chapter) = chapter.as_mut() {
                    chapter.write(&audio.samples)?;
                }
                book.write(&audio.samples)?;
                if i + 1 != end {
                    let gap = opts
                        .pauses
                        .samples(plan.segments[i as usize].pause_after, rate);
                    if let Some(chapter) = chapter.as_mut() {
                        chapter.write_silence(gap)?;
                    }
                    book.write_silence(gap)?;
                }
            }
            if let Some(chapter) = chapter {
                chapter.finish()?;
            }
            Ok::<_, PipelineError>(())
        }
        .instrument(encode)
        .await?;
        // The EPUB takes its own copy: the upload may move the file (a local store).
        if let (Some(_), Some(path)) = (opts.epub3, &path) {
            let dir = opts.staging.join(EPUB_AUDIO);
            let copy = dir.join(format!("{ci}.mp3"));
            std::fs::create_dir_all(&dir)
                .and_then(|()| std::fs::copy(path, &copy))
                .map_err(|source| PipelineError::Io { path: copy, source })?;
        }
        // The chapter goes up while the next one is encoded (at most UPLOADS at once).
        let (Some(path), Some(name)) = (path, cl.file.clone()) else {
            continue;
        };
        if uploads.len() >= UPLOADS {
            let waiting = Instant::now();
            if let Some(done) = uploads.join_next().await {
                uploaded(done)?;
            }
            upload_wait += waiting.elapsed();
        }
        let (store, job) = (store.clone(), plan.job_id.clone());
        let upload =
            info_span!("upload", otel.name = %format!("PUT output {name}"), otel.kind = "client");
        uploads.spawn(async move { store.put_output(&job, &name, &path).await }.instrument(upload));
    }
    Ok(Encoded {
        book,
        book_path,
        uploads,
        read_wait,
        upload_wait,
    })
}

/// Builds and publishes every output; returns the manifest (already published).
/// `wall_before` is the synthesis wall time already spent on this job.
pub async fn assemble<A: AudioStore + 'static>(
    plan: &JobPlan,
    records: &[SegmentRecord],
    store: &Arc<A>,
    opts: &AssembleOptions,
    wall_before: f64,
) -> Result<Manifest, PipelineError> {
    let started = Instant::now();
    let (rate, lay) = final_layout(plan, records, opts);
    // Segments are read in order with a few fetches ahead: a networked store's latency
    // overlaps the encoding instead of adding up (memory: about READ_AHEAD_BYTES of stored audio).
    let mut source = Recorded {
        ahead: ReadAhead::new(
            store.clone(),
            plan.job_id.clone(),
            records,
            plan.segments.len(),
        ),
        records,
    };
    let spec = book_spec(plan, opts, &lay, rate, true);
    let encoded = encode_outputs(plan, &lay, &spec, opts, store, &mut source).await?;
    publish(
        plan,
        records,
        &lay,
        encoded,
        store,
        opts,
        (started, wall_before),
    )
    .await
}

/// Finishes the book file, uploads it after the chapter files, then writes and uploads
/// the manifest. `(started, wall_before)`: when this assembly started, and the wall time
/// spent on the job before it.
async fn publish<A: AudioStore + 'static>(
    plan: &JobPlan,
    records: &[SegmentRecord],
    lay: &Layout,
    encoded: Encoded,
    store: &Arc<A>,
    opts: &AssembleOptions,
    (started, wall_before): (Instant, f64),
) -> Result<Manifest, PipelineError> {
    let Encoded {
        book,
        book_path,
        mut uploads,
        read_wait,
        mut upload_wait,
    } = encoded;
    let rate = opts.sample_rate;
    let secs = |n: u64| n as f64 / f64::from(rate);
    book.finish()?;
    let waiting = Instant::now();
    {
        let (store, job, name) = (store.clone(), plan.job_id.clone(), lay.book_file.clone());
        let upload =
            info_span!("upload", otel.name = %format!("PUT output {name}"), otel.kind = "client");
        uploads.spawn(
            async move { store.put_output(&job, &name, &book_path).await }.instrument(upload),
        );
    }
    let (book_subtitles, chapter_subtitles) = write_subtitles(plan, lay, records, rate, opts)?;
    let epub = write_epub(plan, lay, records, rate, opts)?;
    for name in book_subtitles
        .iter()
        .chain(chapter_subtitles.iter().flatten())
        .chain(epub.iter())
    {
        let (store, job, name) = (store.clone(), plan.job_id.clone(), name.clone());
        let path = opts.staging.join(&name);
        uploads.spawn(async move { store.put_output(&job, &name, &path).await });
    }
    // Every output is up before the manifest that lists them (an error ends the assembly;
    // dropping the set cancels the other uploads).
    while let Some(done) = uploads.join_next().await {
        uploaded(done)?;
    }
    upload_wait += waiting.elapsed();
    tracing::debug!(
        job = %plan.job_id,
        seconds = started.elapsed().as_secs_f64(),
        read_wait_s = read_wait.as_secs_f64(),
        upload_wait_s = upload_wait.as_secs_f64(),
        "assembly: segments read and outputs encoded and stored"
    );

    let audio_seconds = secs(lay.book_samples);
    let wall_seconds = wall_before + started.elapsed().as_secs_f64();
    let manifest = Manifest {
        job_id: plan.job_id.clone(),
        narrator_version: env!("CARGO_PKG_VERSION").to_string(),
        source: plan.source.clone(),
        format: opts.format.extension().to_string(),
        book: BookEntry {
            title: plan.title.clone(),
            file: lay.book_file.clone(),
            seconds: audio_seconds,
            meta: plan.meta.clone(),
            cover: plan.meta.cover.as_ref().map(|c| CoverEntry {
                mime: c.mime.clone(),
                bytes: c.data.len() as u64,
            }),
            timings: book_subtitles.iter().find(|f| *f == TIMINGS_FILE).cloned(),
            epub,
            epub_overlay: opts.epub3.map(|o| o.as_str().to_string()),
            subtitles: book_subtitles
                .iter()
                .filter(|f| *f != TIMINGS_FILE)
                .cloned()
                .collect(),
        },
        chapters: lay
            .chapters
            .iter()
            .zip(chapter_subtitles)
            .map(|(c, subtitles)| ChapterEntry {
                title: c.title.clone(),
                file: c.file.clone(),
                seconds: secs(c.samples),
                start_seconds: secs(c.book_start),
                subtitles,
            })
            .collect(),
        voice: plan.voice.clone(),
        sample_rate: rate,
        audio_seconds,
        speech_seconds: records.iter().map(|r| r.audio_seconds).sum(),
        wall_seconds,
        rtf: narrator_core::rtf(wall_seconds, audio_seconds),
        segments: plan
            .segments
            .iter()
            .zip(&lay.segments)
            .map(|(s, &(start, n))| SegmentEntry {
                index: s.index,
                chapter: s.chapter,
                start_seconds: secs(start),
                seconds: secs(n),
            })
            .collect(),
        warnings: plan.warnings.clone(),
    };
    let path = opts.staging.join("manifest.json");
    let json = serde_json::to_vec_pretty(&manifest).map_err(PipelineError::Manifest)?;
    std::fs::write(&path, json).map_err(|source| PipelineError::Io {
        path: path.clone(),
        source,
    })?;
    store
        .put_output(&plan.job_id, "manifest.json", &path)
        .await?;
    Ok(manifest)
}

/// Writes the read-along EPUB 3 into the staging folder when `opts.epub3` asks for it,
/// from the chapter files' copies and the layout; returns its name (the book file's,
/// with `.epub`).
fn write_epub(
    plan: &JobPlan,
    lay: &Layout,
    records: &[SegmentRecord],
    rate: u32,
    opts: &AssembleOptions,
) -> Result<Option<String>, PipelineError> {
    let Some(overlay) = opts.epub3 else {
        return Ok(None);
    };
    let secs = |n: u64| n as f64 / f64::from(rate);
    let chapters = plan
        .chapters
        .iter()
        .zip(&lay.chapters)
        .enumerate()
        .map(|(ci, (ch, cl))| {
            let first = ch.first_segment as usize;
            let range = first..first + ch.segment_count as usize;
            crate::epub3::EpubChapter {
                audio: opts.staging.join(EPUB_AUDIO).join(format!("{ci}.mp3")),
                seconds: secs(cl.samples),
                sentences: plan.segments[range.clone()]
                    .iter()
                    .zip(&lay.segments[range])
                    .map(|(s, &(start, n))| {
                        let at = start - cl.book_start;
                        let words = record_words(records, s.index);
                        crate::epub3::EpubSentence {
                            index: s.index,
                            start: secs(at),
                            end: secs(at + n),
                            words: words
                                .iter()
                                .map(|w| {
                                    let from = u64::from(w.samples[0]).min(n);
                                    (w.text[0] as usize..w.text[1] as usize, secs(at + from))
                                })
                                .collect(),
                        }
                    })
                    .collect(),
            }
        })
        .collect::<Vec<_>>();
    let name = Path::new(&lay.book_file)
        .with_extension("epub")
        .to_string_lossy()
        .into_owned();
    let modified = modified_now();
    crate::epub3::write_epub3(
        &opts.staging.join(&name),
        plan,
        &chapters,
        overlay,
        &modified,
    )?;
    Ok(Some(name))
}

/// Segment `index`'s words, from its record (in the segment's own samples); none when
/// its record has none.
fn record_words(records: &[SegmentRecord], index: u32) -> &[narrator_core::WordTiming] {
    records
        .get(index as usize)
        .filter(|r| r.index == index)
        .map_or(&[][..], |r| r.words.as_slice())
}

/// Now as `CCYY-MM-DDThh:mm:ssZ` (UTC), what `dcterms:modified` takes.
fn modified_now() -> String {
    chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// Where every sentence is spoken in the book file (written with subtitles).
pub const TIMINGS_FILE: &str = "timings.json";

/// Writes the subtitle files `opts.subtitles` asks for into the staging folder: the book
/// file's (times from its start) and each chapter file's (times from the chapter's
/// start), and [`TIMINGS_FILE`]. Returns their names: the book's (the timings last), and
/// per chapter (empty without a file).
fn write_subtitles(
    plan: &JobPlan,
    lay: &Layout,
    records: &[SegmentRecord],
    rate: u32,
    opts: &AssembleOptions,
) -> Result<(Vec<String>, Vec<Vec<String>>), PipelineError> {
    if opts.subtitles.is_empty() {
        return Ok((Vec::new(), vec![Vec::new(); lay.chapters.len()]));
    }
    let secs = |n: u64| n as f64 / f64::from(rate);
    let spoken = |range: std::ops::Range<usize>, origin: u64| {
        let parts = plan.segments[range.clone()]
            .iter()
            .zip(&lay.segments[range])
            .map(move |(s, &(start, n))| crate::subtitles::Spoken {
                text: s.text.as_str(),
                start: secs(start - origin),
                seconds: secs(n),
                words: record_words(records, s.index)
                    .iter()
                    .map(|w| {
                        let at = |k: u32| secs(start - origin + u64::from(k).min(n));
                        (
                            w.text[0] as usize..w.text[1] as usize,
                            at(w.samples[0]),
                            at(w.samples[1]),
                        )
                    })
                    .collect(),
            });
        crate::subtitles::cues(parts)
    };
    let write = |stem: &str, cues: &[crate::subtitles::Cue]| {
        let mut names = Vec::new();
        for &format in &opts.subtitles {
            let name = format!("{stem}.{}", format.extension());
            let path = opts.staging.join(&name);
            std::fs::write(&path, crate::subtitles::render(format, cues))
                .map_err(|source| PipelineError::Io { path, source })?;
            names.push(name);
        }
        Ok::<_, PipelineError>(names)
    };
    let stem = |file: &str| {
        Path::new(file)
            .file_stem()
            .map_or_else(|| file.to_string(), |s| s.to_string_lossy().into_owned())
    };
    let mut book = write(&stem(&lay.book_file), &spoken(0..plan.segments.len(), 0))?;
    let timings = crate::subtitles::Timings {
        file: lay.book_file.clone(),
        sample_rate: rate,
        sentences: plan
            .segments
            .iter()
            .zip(&lay.segments)
            .map(|(s, &(start, n))| crate::subtitles::SentenceTiming {
                index: s.index,
                chapter: s.chapter,
                text: s.text.clone(),
                start_sample: start,
                end_sample: start + n,
                start: secs(start),
                end: secs(start + n),
                words: record_words(records, s.index)
                    .iter()
                    .map(|w| {
                        let (a, b) = (
                            start + u64::from(w.samples[0]).min(n),
                            start + u64::from(w.samples[1]).min(n),
                        );
                        crate::subtitles::WordEntry {
                            text: w.word(&s.text).to_string(),
                            start_sample: a,
                            end_sample: b,
                            start: secs(a),
                            end: secs(b),
                        }
                    })
                    .collect(),
            })
            .collect(),
    };
    let path = opts.staging.join(TIMINGS_FILE);
    let json = serde_json::to_vec_pretty(&timings).map_err(PipelineError::Manifest)?;
    std::fs::write(&path, json).map_err(|source| PipelineError::Io { path, source })?;
    book.push(TIMINGS_FILE.to_string());
    let mut chapters = Vec::with_capacity(lay.chapters.len());
    for (ch, c) in plan.chapters.iter().zip(&lay.chapters) {
        let names = match &c.file {
            Some(file) => {
                let first = ch.first_segment as usize;
                let range = first..first + ch.segment_count as usize;
                write(&stem(file), &spoken(range, c.book_start))?
            }
            None => Vec::new(),
        };
        chapters.push(names);
    }
    Ok((book, chapters))
}

/// Whether a book in `format` can be encoded while its segments are synthesized
/// ([`encode_as_stored`]): its chapter marks must be able to move at the end (M4B's are
/// fixed when FFmpeg creates the file).
pub fn encodes_early(format: AudioFormat) -> bool {
    format != AudioFormat::M4b
}

/// A book whose audio was encoded while it was synthesized ([`encode_as_stored`]), to be
/// finished by [`finish_early`].
pub struct EarlyBook {
    encoded: Encoded,
    /// The records its audio was checked against, in index order.
    records: Vec<SegmentRecord>,
}

/// Segments in index order, read as soon as synthesis reports them stored (in any order).
struct AsStored<A> {
    store: Arc<A>,
    job: String,
    stored: tokio::sync::mpsc::UnboundedReceiver<SegmentRecord>,
    arrived: BTreeMap<u32, SegmentRecord>,
    /// The newest pack read, kept for its next segments.
    pack: Option<(String, Arc<Vec<u8>>)>,
    taken: Vec<SegmentRecord>,
}

impl<A: AudioStore + 'static> AsStored<A> {
    /// Waits until segment `index` is stored.
    async fn record(&mut self, index: u32) -> Result<SegmentRecord, PipelineError> {
        loop {
            if let Some(r) = self.arrived.remove(&index) {
                return Ok(r);
            }
            match self.stored.recv().await {
                Some(r) if r.index >= index => {
                    self.arrived.insert(r.index, r);
                }
                Some(_) => {}
                None => {
                    return Err(PipelineError::Internal(
                        "synthesis ended before every segment was reported stored",
                    ));
                }
            }
        }
    }
}

impl<A: AudioStore + 'static> InOrder for AsStored<A> {
    async fn next(&mut self, index: u32) -> Result<(SegmentAudio, u64), PipelineError> {
        let r = self.record(index).await?;
        let audio = match &r.packed {
            None => self.store.get_segment(&self.job, index).await?,
            Some(at) => {
                let pack = match &self.pack {
                    Some((key, pack)) if *key == at.key => pack.clone(),
                    _ => {
                        let pack = Arc::new(self.store.get_pack(&self.job, &at.key).await?);
                        self.pack = Some((at.key.clone(), pack.clone()));
                        pack
                    }
                };
                segment_in_pack(&pack, at, index)?
            }
        };
        let expected = r.samples;
        self.taken.push(r);
        Ok((audio, expected))
    }
}

/// Encodes the book (and its chapter files) while it is synthesized: `stored` delivers
/// each segment's record once its audio is stored, in any order, and the segments are
/// encoded in index order as they become available, on the cores inference leaves free;
/// the encoding no longer waits for the last segment. The chapters' starts are not known
/// yet: [`finish_early`] moves them when synthesis has ended. Ends with an error when
/// `stored` closes before every segment came (e.g. segments done by an earlier run
/// report nothing: use [`assemble`] then).
pub async fn encode_as_stored<A: AudioStore + 'static>(
    plan: &JobPlan,
    stored: tokio::sync::mpsc::UnboundedReceiver<SegmentRecord>,
    store: &Arc<A>,
    opts: &AssembleOptions,
) -> Result<EarlyBook, PipelineError> {
    let mut source = AsStored {
        store: store.clone(),
        job: plan.job_id.clone(),
        stored,
        arrived: BTreeMap::new(),
        pack: None,
        taken: Vec::with_capacity(plan.segments.len()),
    };
    let rate = opts.sample_rate;
    let names = layout(
        plan,
        &[],
        &opts.pauses,
        rate,
        opts.format,
        opts.chapter_files,
    );
    let spec = book_spec(plan, opts, &names, rate, false);
    let encoded = encode_outputs(plan, &names, &spec, opts, store, &mut source).await?;
    Ok(EarlyBook {
        encoded,
        records: source.taken,
    })
}

/// How [`finish_early`] finished a book.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Finished {
    /// The book encoded during synthesis, its chapter marks moved to their starts.
    Early,
    /// Assembled again from the stored segments, for this reason.
    Again(String),
}

/// Finishes a book begun by [`encode_as_stored`] once synthesis has returned `records`:
/// its chapter marks move to their starts, and the book file and the manifest are
/// published as by [`assemble`]. A book that cannot take the marks (its header would
/// change size, or it was read with other records) is assembled again from the stored
/// segments instead.
pub async fn finish_early<A: AudioStore + 'static>(
    early: EarlyBook,
    plan: &JobPlan,
    records: &[SegmentRecord],
    store: &Arc<A>,
    opts: &AssembleOptions,
    wall_before: f64,
) -> Result<(Manifest, Finished), PipelineError> {
    let started = Instant::now();
    let EarlyBook {
        mut encoded,
        records: read_with,
    } = early;
    let (rate, lay) = final_layout(plan, records, opts);
    let same_records = read_with.len() == records.len()
        && read_with.iter().zip(records).all(|(a, b)| {
            (a.index, a.samples, a.sample_rate) == (b.index, b.samples, b.sample_rate)
        });
    let moved = if same_records {
        encoded
            .book
            .set_chapters(&chapter_marks(&lay, rate, true))
            .map_err(|e| e.to_string())
    } else {
        Err("synthesis returned other records than the ones it reported".to_string())
    };
    match moved {
        Ok(()) => {
            let m = publish(
                plan,
                records,
                &lay,
                encoded,
                store,
                opts,
                (started, wall_before),
            );
            Ok((m.await?, Finished::Early))
        }
        Err(reason) => {
            tracing::warn!(job = %plan.job_id, %reason, "assembling the book again from the stored segments");
            drop(encoded);
            let m = assemble(plan, records, store, opts, wall_before).await?;
            Ok((m, Finished::Again(reason)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use narrator_core::{ChapterPlan, PauseAfter, Segment};

    fn plan() -> JobPlan {
        let seg = |index, chapter, pause_after| Segment {
            index,
            chapter,
            text: "x".into(),
            pause_after,
            speaker: 0,
            speed: None,
            timed: false,
        };
        JobPlan {
            job_id: "j".into(),
            title: "My Book: A Tale".into(),
            source: "b.txt".into(),
            voice: "v".into(),
            chapters: vec![
                ChapterPlan {
                    title: "CHAPTER I. Down".into(),
                    first_segment: 0,
                    segment_count: 2,
                    ..ChapterPlan::default()
                },
                ChapterPlan {
                    title: "Two".into(),
                    first_segment: 2,
                    segment_count: 1,
                    ..ChapterPlan::default()
                },
            ],
            segments: vec![
                seg(0, 0, PauseAfter::Paragraph),
                seg(1, 0, PauseAfter::Chapter),
                seg(2, 1, PauseAfter::Chapter),
            ],
            warnings: vec![],
            meta: Default::default(),
            lexicon: None,
        }
    }

    fn rec(index: u32, samples: u64) -> SegmentRecord {
        SegmentRecord {
            index,
            samples,
            sample_rate: 1000,
            audio_seconds: samples as f64 / 1000.0,
            inference_seconds: 0.0,
            queue_wait_seconds: 0.0,
            batch_size: 1,
            attempts: 1,
            worker: "w".into(),
            phoneme_ids: 1,
            packed: None,
            words: Vec::new(),
        }
    }

    #[test]
    fn layout_places_pauses_between_segments_and_chapters_only() {
        let pauses = Pauses {
            sentence_ms: 100,
            paragraph_ms: 200,
            chapter_ms: 1000,
        };
        let l = layout(
            &plan(),
            &[rec(0, 500), rec(1, 300), rec(2, 400)],
            &pauses,
            1000,
            AudioFormat::Wav,
            true,
        );
        assert_eq!(l.segments, [(0, 500), (700, 300), (2000, 400)]);
        assert_eq!(l.chapters[0].samples, 1000);
        assert_eq!(l.chapters[1].book_start, 2000);
        assert_eq!(l.book_samples, 2400);
        assert_eq!(l.chapters[0].file.as_deref(), Some("01-chapter-i-down.wav"));
        assert_eq!(l.book_file, "my-book-a-tale.wav");
        // M4B: the same places, one file.
        let m = layout(
            &plan(),
            &[rec(0, 500), rec(1, 300), rec(2, 400)],
            &pauses,
            1000,
            AudioFormat::M4b,
            true,
        );
        assert_eq!(m.segments, l.segments);
        assert!(m.chapters.iter().all(|c| c.file.is_none()));
        assert_eq!(m.book_file, "my-book-a-tale.m4b");
        // Chapter files not asked for: the same places, one file.
        let one = layout(
            &plan(),
            &[rec(0, 500), rec(1, 300), rec(2, 400)],
            &pauses,
            1000,
            AudioFormat::Opus,
            false,
        );
        assert_eq!(one.segments, l.segments);
        assert!(one.chapters.iter().all(|c| c.file.is_none()));
        assert_eq!(one.book_file, "my-book-a-tale.opus");
    }

    #[test]
    fn the_book_file_never_shares_a_name_with_a_chapter_file() {
        let mut p = plan();
        p.title = "01 Intro".into();
        p.chapters[0].title = "Intro".into();
        let recs = [rec(0, 500), rec(1, 300), rec(2, 400)];
        let l = layout(&p, &recs, &Pauses::default(), 1000, AudioFormat::Mp3, true);
        assert_eq!(l.chapters[0].file.as_deref(), Some("01-intro.mp3"));
        assert_eq!(l.book_file, "book-01-intro.mp3");
        let mut names: Vec<&str> = l
            .chapters
            .iter()
            .filter_map(|c| c.file.as_deref())
            .collect();
        names.push(&l.book_file);
        let count = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), count, "{names:?}");
        p.title = "1984".into();
        let l = layout(&p, &recs, &Pauses::default(), 1000, AudioFormat::Mp3, false);
        assert_eq!(l.book_file, "book-1984.mp3");
    }

    #[test]
    fn slugs_are_safe_file_names() {
        assert_eq!(slug("  Hello, World!  ", 64), "hello-world");
        assert_eq!(slug("漢字", 64), "");
        assert!(slug(&"ab ".repeat(100), 10).len() <= 11);
    }

    /// A Kokoro book (voice `af_heart`) of one chapter of `segments` segments, its
    /// local store and the options of a WAV assembly at `rate`.
    fn kokoro_book(
        dir: &Path,
        segments: u32,
        rate: u32,
    ) -> (JobPlan, Arc<crate::LocalAudioStore>, AssembleOptions) {
        let mut plan = plan();
        plan.voice = "af_heart".into();
        plan.segments.truncate(segments as usize);
        for s in &mut plan.segments {
            s.chapter = 0;
        }
        plan.chapters.truncate(1);
        plan.chapters[0].segment_count = segments;
        std::fs::create_dir_all(dir.join("out")).expect("outputs folder");
        let store =
            crate::LocalAudioStore::new(dir.join("segments"), dir.join("out")).expect("store");
        let opts = AssembleOptions {
            format: AudioFormat::Wav,
            sample_rate: rate,
            chapter_files: false,
            pauses: Pauses::default(),
            staging: dir.join("staging"),
            subtitles: Vec::new(),
            epub3: None,
        };
        (plan, Arc::new(store), opts)
    }

    /// The rate and the samples of a manifest's book file.
    fn book_file(dir: &Path, m: &Manifest) -> (u32, Vec<i16>) {
        let bytes = std::fs::read(dir.join("out").join(&m.book.file)).expect("book file");
        narrator_audio::decode_wav_bytes(&bytes).expect("wav")
    }

    #[tokio::test]
    async fn a_kokoro_books_assembly_at_24_khz_with_no_rate_recorded_still_assembles_at_24_khz() {
        // No segment records a rate: the book is made at the loaded voice's rate (24 kHz
        // for Kokoro), never at Piper's 22,050 Hz.
        let dir = tempfile::tempdir().expect("tmp");
        let (plan, store, opts) = kokoro_book(dir.path(), 0, 24_000);
        let m = assemble(&plan, &[], &store, &opts, 0.0)
            .await
            .expect("assembles");
        assert_eq!(m.sample_rate, 24_000);
        assert_eq!(book_file(dir.path(), &m).0, 24_000);
    }

    #[tokio::test]
    async fn a_kokoro_book_is_made_at_the_voices_rate_and_audio_at_another_rate_is_refused() {
        let dir = tempfile::tempdir().expect("tmp");
        let (plan, store, opts) = kokoro_book(dir.path(), 2, 24_000);
        let audio = SegmentAudio {
            sample_rate: 24_000,
            samples: vec![100; 2400],
        };
        let mut records = Vec::new();
        for i in 0..2 {
            store.put_segment("j", i, &audio).await.expect("put");
            records.push(SegmentRecord {
                sample_rate: 24_000,
                ..rec(i, 2400)
            });
        }
        let m = assemble(&plan, &records, &store, &opts, 0.0)
            .await
            .expect("assembles");
        assert_eq!(m.sample_rate, 24_000);
        let (rate, samples) = book_file(dir.path(), &m);
        assert_eq!(rate, 24_000);
        // Two segments and the paragraph pause between them, counted at 24 kHz.
        let pause = Pauses::default().samples(PauseAfter::Paragraph, 24_000);
        assert_eq!(samples.len(), 2 * 2400 + pause);
        // Audio stored at another rate than the voice's is not spliced in.
        let dir = tempfile::tempdir().expect("tmp");
        let (plan, store, opts) = kokoro_book(dir.path(), 2, 24_000);
        let piper = SegmentAudio {
            sample_rate: 22_050,
            ..audio
        };
        for i in 0..2 {
            store.put_segment("j", i, &piper).await.expect("put");
        }
        let e = assemble(&plan, &records, &store, &opts, 0.0)
            .await
            .expect_err("another rate");
        assert!(e.to_string().contains("22050 Hz"), "{e}");
    }

    /// A store whose reads take a while and that counts how many are in flight.
    #[derive(Default)]
    struct SlowStore {
        in_flight: std::sync::atomic::AtomicUsize,
        most: std::sync::atomic::AtomicUsize,
        samples: u64,
    }

    impl AudioStore for SlowStore {
        async fn put_segment(&self, _: &str, _: u32, _: &SegmentAudio) -> Result<(), SeamError> {
            Ok(())
        }
        async fn get_segment(&self, _: &str, index: u32) -> Result<SegmentAudio, SeamError> {
            use std::sync::atomic::Ordering::SeqCst;
            let now = self.in_flight.fetch_add(1, SeqCst) + 1;
            self.most.fetch_max(now, SeqCst);
            tokio::time::sleep(Duration::from_millis(3)).await;
            self.in_flight.fetch_sub(1, SeqCst);
            Ok(SegmentAudio {
                sample_rate: 1000,
                // The index in the first sample, so the order can be checked.
                samples: std::iter::once(index as i16)
                    .chain(std::iter::repeat_n(0, self.samples as usize - 1))
                    .collect(),
            })
        }
        async fn has_segment(&self, _: &str, _: u32) -> Result<bool, SeamError> {
            Ok(true)
        }
        async fn put_output(&self, _: &str, _: &str, _: &Path) -> Result<(), SeamError> {
            Ok(())
        }
    }

    /// Reads `n` segments of `samples` each through a [`ReadAhead`]; the most reads that
    /// were in flight at once.
    async fn read_all(n: u32, samples: u64) -> usize {
        let store = Arc::new(SlowStore {
            samples,
            ..SlowStore::default()
        });
        let records: Vec<SegmentRecord> = (0..n).map(|i| rec(i, samples)).collect();
        let mut reader = ReadAhead::new(store.clone(), "j".into(), &records, n as usize);
        for i in 0..n {
            let audio = reader.next().await.expect("segment");
            assert_eq!(audio.samples[0], i as i16, "segments come back in order");
            assert_eq!(audio.samples.len() as u64, samples);
        }
        assert!(
            reader.next().await.is_err(),
            "nothing past the last segment"
        );
        store.most.load(std::sync::atomic::Ordering::SeqCst)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn small_segments_are_read_far_ahead_and_large_ones_within_the_byte_budget() {
        // Tiny segments: far more than READ_AHEAD reads in flight (an object store's
        // latency would otherwise set the pace), but never more than READ_AHEAD_MAX.
        let most = read_all(1500, 10).await;
        assert!(
            most > READ_AHEAD,
            "only {most} reads in flight for tiny segments"
        );
        assert!(most <= READ_AHEAD_MAX, "{most} reads in flight");
        // 64 KiB segments: the byte budget allows 128 of them ahead.
        let per = 32 * 1024;
        let most = read_all(400, per).await;
        let budget = (READ_AHEAD_BYTES / (per * 2 + 44)) as usize;
        assert!(
            most <= budget.max(READ_AHEAD),
            "{most} reads of 64 KiB in flight, budget {budget}"
        );
        // Large segments: READ_AHEAD of them, as before the budget.
        let most = read_all(80, 1 << 19).await;
        assert!(most <= READ_AHEAD, "{most} reads of 1 MiB in flight");
    }
}
