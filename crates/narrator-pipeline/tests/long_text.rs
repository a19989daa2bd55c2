//! The whole pipeline over a whole book (../shared/corpus/alice29.txt, 12 chapters) with
//! the real text and phoneme stages and the null backend in place of the model, so a
//! 2.5-hour book runs in seconds: queue, stores, journal, batching and assembly at scale.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use narrator_audio::{AudioFormat, Pauses};
use narrator_core::StateStore;
use narrator_engine::{
    Backend, BatchOutput, Device, EngineError, EnginePool, NullBackend, Scales, Voice,
};
use narrator_phonemes::Phonemizer;
use narrator_pipeline::{
    AssembleOptions, AudioIdentity, Budget, Event, Finished, JournalStateStore, LocalAudioStore,
    RunOptions, Stages, SubtitleFormat, Synthesizer, assemble, encode_as_stored, finish_early,
    plan_job, synthesize_job,
};

const ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");

fn deps() -> PathBuf {
    let d = Path::new(ROOT).join(".deps");
    assert!(d.join("voices").is_dir(), "run `bash ops/setup.sh` first");
    d
}

fn synthesizer(pool: EnginePool) -> Synthesizer {
    let d = deps();
    let voice = Voice::find(&d.join("voices"), "en_US-joe-medium").expect("voice");
    let ph = Phonemizer::new(&d).expect("espeak");
    Synthesizer::new(&voice, ph, pool, Scales::DETERMINISTIC).expect("synth")
}

fn alice() -> narrator_text::Document {
    // The corpus beside the checkout, or where this project's machines keep it.
    let path = [
        Path::new(ROOT).join("../shared/corpus/alice29.txt"),
        PathBuf::from("/work/shared/corpus/alice29.txt"),
    ]
    .into_iter()
    .find(|p| p.is_file())
    .expect("the corpus ../shared/corpus/alice29.txt is missing beside the checkout");
    narrator_text::load_document(&path, &Default::default()).expect("alice")
}

/// The plan of Alice's first chapter for the null voice.
fn chapter_one() -> narrator_core::JobPlan {
    first_chapters(1)
}

/// The plan of Alice's first `n` chapters (all of them for 12), null voice.
fn first_chapters(n: usize) -> narrator_core::JobPlan {
    let mut doc = alice();
    doc.chapters.truncate(n);
    let id = AudioIdentity {
        voice: "null",
        voice_digest: "0",
        scales: Scales::DETERMINISTIC,
        speaker: 0,
    };
    plan_job(&doc, "alice29.txt", "alice", &id)
}

/// The synthesizer on `pool`, with a local store and journal in `dir`, events dropped.
fn local_stages(pool: EnginePool, dir: &Path) -> Stages<LocalAudioStore, JournalStateStore> {
    Stages {
        synth: Arc::new(synthesizer(pool)),
        store: Arc::new(LocalAudioStore::new(dir.join("seg"), dir.to_path_buf()).expect("store")),
        state: Arc::new(JournalStateStore::open(dir.join("journal.jsonl")).expect("journal")),
        on_event: Arc::new(|_: Event| {}),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_whole_book_assembles_into_twelve_chapters_with_every_segment_once() {
    let plan = first_chapters(12);
    assert_eq!(plan.chapters.len(), 12);
    assert!(
        plan.segments.len() > 1000,
        "{} segments",
        plan.segments.len()
    );

    let pool = EnginePool::start_with(2, |_| {
        Ok(Box::new(NullBackend::default()) as Box<dyn Backend>)
    })
    .expect("pool");
    let dir = tempfile::tempdir().expect("tmp");
    let stages = local_stages(pool, dir.path());
    stages.synth.set_budget(Budget {
        max_tokens: 8 * 400,
        max_requests: 8,
        max_wait: Duration::ZERO,
    });
    let opts = RunOptions::embedded("test".into(), 3);
    let records = synthesize_job(&plan, &stages, &opts)
        .await
        .expect("synthesize");
    assert_eq!(records.len(), plan.segments.len());
    assert!(
        records.iter().any(|r| r.batch_size > 1),
        "segments were batched"
    );

    let aopts = AssembleOptions {
        format: AudioFormat::Wav,
        sample_rate: stages.synth.sample_rate(),
        chapter_files: true,
        pauses: Pauses::default(),
        staging: dir.path().join("staging"),
        subtitles: vec![SubtitleFormat::Srt, SubtitleFormat::Vtt],
        epub3: None,
    };
    let m = assemble(&plan, &records, &stages.store, &aopts, 1.0)
        .await
        .expect("assemble");
    assert_eq!(m.chapters.len(), 12);
    for c in &m.chapters {
        let file = c.file.as_deref().expect("a chapter file");
        let f = dir.path().join(file);
        assert!(
            std::fs::metadata(&f).expect("chapter file").len() > 1000,
            "{file}"
        );
    }
    let idx: Vec<u32> = m.segments.iter().map(|s| s.index).collect();
    assert_eq!(idx, (0..plan.segments.len() as u32).collect::<Vec<_>>());
    let starts: Vec<f64> = m.chapters.iter().map(|c| c.start_seconds).collect();
    assert!(starts.windows(2).all(|w| w[0] < w[1]), "chapters in order");
    let last = m.chapters.last().expect("last");
    assert!((last.start_seconds + last.seconds - m.book.seconds).abs() < 1e-6);
    assert!(
        m.book.seconds > 3600.0,
        "a whole book at the null voice's pace: {}",
        m.book.seconds
    );
    assert!(dir.path().join("manifest.json").is_file());
    // Subtitles: the book's and each chapter's, each cue of a one-cue segment at that
    // segment's exact place in its file.
    let stem = m.book.file.trim_end_matches(".wav");
    assert_eq!(
        m.book.subtitles,
        [format!("{stem}.srt"), format!("{stem}.vtt")]
    );
    let srt = std::fs::read_to_string(dir.path().join(&m.book.subtitles[0])).expect("srt");
    let clock = |s: f64| {
        let ms = (s * 1000.0).round() as u64;
        format!(
            "{:02}:{:02}:{:02},{:03}",
            ms / 3_600_000,
            ms / 60_000 % 60,
            ms / 1000 % 60,
            ms % 1000
        )
    };
    let mut checked = 0;
    for (seg, entry) in plan.segments.iter().zip(&m.segments) {
        if seg.text.chars().count() <= 40 && !seg.text.trim().is_empty() {
            let line = format!(
                "{} --> {}\n{}\n",
                clock(entry.start_seconds),
                clock(entry.start_seconds + entry.seconds),
                seg.text.split_whitespace().collect::<Vec<_>>().join(" ")
            );
            assert!(srt.contains(&line), "segment {}: {line}", seg.index);
            checked += 1;
        }
    }
    assert!(checked > 100, "{checked} short segments checked");
    for c in &m.chapters {
        assert_eq!(c.subtitles.len(), 2, "{c:?}");
        let vtt = std::fs::read_to_string(dir.path().join(&c.subtitles[1])).expect("vtt");
        assert!(vtt.starts_with("WEBVTT\n\n"), "{}", c.subtitles[1]);
    }
}

/// Fails every batch holding an utterance of exactly `len` ids.
/// A book encoded while it is synthesized (segments reported in the order they are
/// stored, the chapters' starts unknown until the end) is the book assembled after it:
/// the same MP3 bytes, chapter marks and chapter files included, and the same manifest but
/// for the wall time. An encoder whose segments stop coming ends with an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_book_encoded_during_its_synthesis_is_the_book_assembled_after_it() {
    let plan = first_chapters(3);
    let pool = EnginePool::start_with(2, |_| {
        Ok(Box::new(NullBackend::default()) as Box<dyn Backend>)
    })
    .expect("pool");
    let dir = tempfile::tempdir().expect("tmp");
    let (early_out, after_out) = (dir.path().join("early"), dir.path().join("after"));
    let store = |out: &Path| {
        Arc::new(LocalAudioStore::new(dir.path().join("seg"), out.to_path_buf()).expect("store"))
    };
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let stages = Stages {
        on_event: Arc::new(move |e: Event| {
            if let Event::SegmentDone { record } = e {
                let _ = tx.send(record);
            }
        }),
        store: store(&early_out),
        ..local_stages(pool, dir.path())
    };
    stages.synth.set_budget(Budget {
        max_tokens: 8 * 400,
        max_requests: 8,
        max_wait: Duration::ZERO,
    });
    let rate = stages.synth.sample_rate();
    let aopts = |out: &Path| AssembleOptions {
        format: AudioFormat::Mp3,
        sample_rate: rate,
        chapter_files: true,
        pauses: Pauses::default(),
        staging: out.join("staging"),
        subtitles: vec![SubtitleFormat::Vtt],
        epub3: None,
    };
    let early = {
        let (plan, store, aopts) = (plan.clone(), stages.store.clone(), aopts(&early_out));
        tokio::spawn(async move { encode_as_stored(&plan, rx, &store, &aopts).await })
    };
    let opts = RunOptions::embedded("test".into(), 3);
    let records = synthesize_job(&plan, &stages, &opts)
        .await
        .expect("synthesize");
    let book = early
        .await
        .expect("task")
        .expect("encoded during synthesis");
    let (m_early, how) = finish_early(
        book,
        &plan,
        &records,
        &stages.store,
        &aopts(&early_out),
        1.0,
    )
    .await
    .expect("finish");
    assert_eq!(how, Finished::Early);
    let mut m_after = assemble(&plan, &records, &store(&after_out), &aopts(&after_out), 1.0)
        .await
        .expect("assemble");
    assert!(
        m_early
            .chapters
            .iter()
            .skip(1)
            .all(|c| c.start_seconds > 0.0)
    );
    (m_after.wall_seconds, m_after.rtf) = (m_early.wall_seconds, m_early.rtf);
    assert_eq!(m_early, m_after);
    let files = m_early
        .chapters
        .iter()
        .filter_map(|c| c.file.clone())
        .chain([m_early.book.file.clone()]);
    for f in files {
        let early = std::fs::read(early_out.join(&f)).expect("early file");
        let after = std::fs::read(after_out.join(&f)).expect("file");
        assert!(early.len() > 1000 && early == after, "{f} differs");
    }

    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    drop(tx);
    let waiting = encode_as_stored(&plan, rx, &store(&early_out), &aopts(&early_out)).await;
    assert!(waiting.is_err(), "no segment will come");
}

struct FailOn {
    len: usize,
    calls: Arc<AtomicUsize>,
}

impl Backend for FailOn {
    fn synthesize(&mut self, items: &[&[i64]], scales: Scales) -> Result<BatchOutput, EngineError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        if items.iter().any(|i| i.len() == self.len) {
            return Err(EngineError::Stopped);
        }
        NullBackend::default().synthesize(items, scales)
    }
    fn supports_batching(&self) -> bool {
        true
    }
    fn device(&self) -> Device {
        Device::Cpu
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_failure_stops_the_job_and_keeps_finished_segments() {
    let plan = chapter_one();
    let calls = Arc::new(AtomicUsize::new(0));
    // Find the id length of segment 10's first utterance, and fail on it.
    let probe = synthesizer(
        EnginePool::start_with(1, |_| {
            Ok(Box::new(NullBackend::default()) as Box<dyn Backend>)
        })
        .expect("pool"),
    );
    let len = probe
        .prepare(plan.segments[10].clone())
        .expect("prep")
        .utterances[0]
        .len();
    let c = calls.clone();
    let pool = EnginePool::start_with(1, move |_| {
        Ok(Box::new(FailOn {
            len,
            calls: c.clone(),
        }) as Box<dyn Backend>)
    })
    .expect("pool");
    let dir = tempfile::tempdir().expect("tmp");
    let stages = local_stages(pool, dir.path());
    let opts = RunOptions::embedded("test".into(), 1);
    let err = synthesize_job(&plan, &stages, &opts)
        .await
        .expect_err("must fail");
    assert_eq!(err.kind(), "engine_stopped", "{err}");
    let done = stages
        .state
        .finished_segments(&plan.job_id)
        .await
        .expect("journal");
    assert!(
        done.len() >= 10,
        "segments before the failure are kept for resume: {}",
        done.len()
    );
    assert!(done.iter().all(|r| r.index != 10));
}

/// Out of memory: a "GPU" with room for 300 padded tokens per run, a plan of 16 items of
/// up to 402 tokens. Each failure halves the budget and runs the batch again; after three
/// failures of one batch it falls back to the CPU pool, and every segment is still made
/// exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_memory_halves_the_budget_then_falls_back_to_cpu() {
    let plan = chapter_one();
    let gpu = EnginePool::start_with(1, |_| {
        Ok(Box::new(narrator_engine::MemoryLimit {
            inner: Box::new(NullBackend::default()),
            max_tokens: 300,
            device: Device::Cuda(0),
        }) as Box<dyn Backend>)
    })
    .expect("pool");
    let dir = tempfile::tempdir().expect("tmp");
    let fell_back = Arc::new(AtomicUsize::new(0));
    let f = fell_back.clone();
    let synth = synthesizer(gpu)
        .with_budget(Budget {
            max_tokens: 16 * 402,
            max_requests: 16,
            max_wait: Duration::ZERO,
        })
        .with_fallback(Box::new(move || {
            f.fetch_add(1, Ordering::SeqCst);
            let cpu = EnginePool::start_with(1, |_| {
                Ok(Box::new(NullBackend::default()) as Box<dyn Backend>)
            })?;
            Ok((cpu, Budget::single()))
        }));
    let stages = Stages {
        synth: Arc::new(synth),
        ..local_stages(
            EnginePool::start_with(1, |_| {
                Ok(Box::new(NullBackend::default()) as Box<dyn Backend>)
            })
            .expect("pool"),
            dir.path(),
        )
    };
    let opts = RunOptions::embedded("test".into(), 1);
    let records = synthesize_job(&plan, &stages, &opts)
        .await
        .expect("the job survives out-of-memory failures");
    assert_eq!(records.len(), plan.segments.len());
    let stats = stages.synth.stats();
    assert!(stats.oom_events >= 3, "{stats:?}");
    assert_eq!(fell_back.load(Ordering::SeqCst), 1, "one fallback");
    assert!(
        stats
            .fallback
            .as_deref()
            .is_some_and(|f| f.contains("fell back to cpu")),
        "{stats:?}"
    );
    assert_eq!(stages.synth.pool().device(), Device::Cpu);
    assert_eq!(stages.synth.budget(), Budget::single());
    assert!(stats.busy_seconds >= 0.0 && stats.runs as usize >= plan.segments.len() / 16);
}

/// Without a fallback (a CPU out of memory), halving goes on until batches fit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_memory_on_cpu_halves_until_batches_fit() {
    let plan = chapter_one();
    let limited = EnginePool::start_with(1, |_| {
        Ok(Box::new(narrator_engine::MemoryLimit {
            inner: Box::new(NullBackend::default()),
            max_tokens: 1000,
            device: Device::Cpu,
        }) as Box<dyn Backend>)
    })
    .expect("pool");
    let dir = tempfile::tempdir().expect("tmp");
    let stages = local_stages(limited, dir.path());
    stages.synth.set_budget(Budget {
        max_tokens: 32 * 402,
        max_requests: 32,
        max_wait: Duration::ZERO,
    });
    let records = synthesize_job(&plan, &stages, &RunOptions::embedded("test".into(), 2))
        .await
        .expect("the job finishes on a smaller budget");
    assert_eq!(records.len(), plan.segments.len());
    let b = stages.synth.budget();
    assert!(b.max_tokens <= 1000 && b.max_tokens >= 250, "{b:?}");
    let stats = stages.synth.stats();
    assert!(
        stats.oom_events >= 1 && stats.fallback.is_none(),
        "{stats:?}"
    );
}

/// A queue that reports every job abandoned once `after` segments were acknowledged (as
/// a cancellation seen by the worker's database check).
struct Abandoning {
    inner: narrator_pipeline::InProcessQueue,
    after: usize,
    acks: AtomicUsize,
}

impl narrator_core::SegmentQueue for Abandoning {
    type Ticket = narrator_pipeline::queue::Ticket;

    async fn next(
        &self,
    ) -> Result<Option<narrator_core::Delivery<Self::Ticket>>, narrator_core::SeamError> {
        self.inner.next().await
    }

    async fn ack(&self, ticket: Self::Ticket) -> Result<(), narrator_core::SeamError> {
        self.acks.fetch_add(1, Ordering::SeqCst);
        self.inner.ack(ticket).await
    }

    async fn requeue(&self, ticket: Self::Ticket) -> Result<(), narrator_core::SeamError> {
        self.inner.requeue(ticket).await
    }

    async fn abandoned_jobs(
        &self,
        jobs: Vec<String>,
    ) -> Result<Vec<String>, narrator_core::SeamError> {
        Ok(if self.acks.load(Ordering::SeqCst) >= self.after {
            jobs
        } else {
            Vec::new()
        })
    }
}

/// Once the job is abandoned, the segments waiting in the batcher are acknowledged
/// without reaching the engine, and the worker loop drains and ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn segments_of_an_abandoned_job_never_reach_the_engine() {
    let plan = chapter_one();
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    let pool = EnginePool::start_with(1, move |_| {
        Ok(Box::new(FailOn {
            len: usize::MAX,
            calls: c.clone(),
        }) as Box<dyn Backend>)
    })
    .expect("pool");
    let dir = tempfile::tempdir().expect("tmp");
    let stages = local_stages(pool, dir.path());
    let queue = Arc::new(Abandoning {
        inner: narrator_pipeline::InProcessQueue::new(),
        after: 5,
        acks: AtomicUsize::new(0),
    });
    queue
        .inner
        .publish(&plan.job_id, plan.segments.clone())
        .expect("publish");
    queue.inner.close();
    let records =
        narrator_pipeline::work(queue.clone(), &stages, &RunOptions::embedded("t".into(), 1))
            .await
            .expect("work");
    let total = plan.segments.len();
    assert!(total > 40, "{total}");
    assert!(
        records.len() >= 5 && records.len() < 10,
        "{} of {total} synthesized",
        records.len()
    );
    assert_eq!(
        queue.acks.load(Ordering::SeqCst),
        total,
        "every segment acknowledged"
    );
    assert!(
        calls.load(Ordering::SeqCst) < 10 + 5,
        "engine runs: {}",
        calls.load(Ordering::SeqCst)
    );
}

/// Records the speaker id of every item it is given.
struct RecordSpeakers {
    seen: Arc<std::sync::Mutex<Vec<(usize, i64)>>>,
}

impl Backend for RecordSpeakers {
    fn synthesize(&mut self, items: &[&[i64]], scales: Scales) -> Result<BatchOutput, EngineError> {
        self.synthesize_speakers(items, &vec![0; items.len()], scales)
    }
    fn synthesize_speakers(
        &mut self,
        items: &[&[i64]],
        speakers: &[i64],
        scales: Scales,
    ) -> Result<BatchOutput, EngineError> {
        let mut seen = self.seen.lock().expect("lock");
        seen.extend(items.iter().map(|i| i.len()).zip(speakers.iter().copied()));
        NullBackend::default().synthesize(items, scales)
    }
    fn supports_batching(&self) -> bool {
        true
    }
    fn device(&self) -> Device {
        Device::Cpu
    }
}

/// Segments of different speakers (jobs of a multi-speaker voice) batched together: each
/// utterance reaches the engine with its own segment's speaker id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_utterance_reaches_the_engine_with_its_segments_speaker() {
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let record = seen.clone();
    let synth = synthesizer(
        EnginePool::start_with(1, move |_| {
            Ok(Box::new(RecordSpeakers {
                seen: record.clone(),
            }) as Box<dyn Backend>)
        })
        .expect("pool"),
    );
    let texts = [
        "One short line.",
        "A second, longer line of text here.",
        "Three.",
    ];
    let mut batch = Vec::new();
    let mut expected = Vec::new();
    for (i, text) in texts.iter().enumerate() {
        let segment = narrator_core::Segment {
            index: i as u32,
            chapter: 0,
            text: (*text).into(),
            pause_after: narrator_core::PauseAfter::Sentence,
            speaker: [3, 0, 7][i],
            speed: None,
            timed: false,
        };
        let p = synth.prepare(segment).expect("prepare");
        expected.extend(
            p.utterances
                .iter()
                .map(|u| (u.len(), i64::from(p.segment.speaker))),
        );
        batch.push(p);
    }
    synth.synthesize(batch).await.expect("synthesize");
    let mut got = seen.lock().expect("lock").clone();
    got.sort();
    expected.sort();
    assert_eq!(got, expected);
}
