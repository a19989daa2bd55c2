//! A job's identity is computed from exactly the scales its segments are synthesized with
//! (issue 43): a job submitted at speed 1.5 with its own noise settings is hashed with the
//! scales [`ScaleOverrides::resolve`] makes of them, and a worker loaded with other
//! settings synthesizes every one of its segments at those same scales, as the job
//! recorded them. The real text and phoneme stages, a backend that records the scales of
//! each run in place of the model.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use narrator_core::{Delivery, SeamError, Segment, SegmentQueue};
use narrator_engine::{
    Backend, BatchOutput, Device, EngineError, EnginePool, NullBackend, ScaleOverrides, Scales,
    Voice,
};
use narrator_phonemes::Phonemizer;
use narrator_pipeline::queue::Ticket;
use narrator_pipeline::{
    AudioIdentity, Event, InProcessQueue, JournalStateStore, LocalAudioStore, RunOptions, Stages,
    Synthesizer, plan_job, work,
};

const ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");

fn deps() -> PathBuf {
    let d = Path::new(ROOT).join(".deps");
    assert!(d.join("voices").is_dir(), "run `bash ops/setup.sh` first");
    d
}

/// Silence of the right length, keeping the scales of every run.
struct Recording {
    null: NullBackend,
    seen: Arc<Mutex<Vec<Scales>>>,
}

impl Backend for Recording {
    fn synthesize(&mut self, items: &[&[i64]], scales: Scales) -> Result<BatchOutput, EngineError> {
        self.seen.lock().expect("lock").push(scales);
        self.null.synthesize(items, scales)
    }

    fn supports_batching(&self) -> bool {
        true
    }

    fn device(&self) -> Device {
        Device::Cpu
    }
}

/// The worker's guard in small: it hands each delivery on at the rate and the scales its
/// job recorded (read from the job's row there, never from the message).
struct AsRecorded {
    inner: InProcessQueue,
    speed: f32,
    scales: Scales,
}

impl SegmentQueue for AsRecorded {
    type Ticket = Ticket;

    async fn next(&self) -> Result<Option<Delivery<Ticket>>, SeamError> {
        Ok(self.inner.next().await?.map(|d| Delivery {
            segment: Segment {
                speed: Some(self.speed),
                ..d.segment
            },
            scales: Some(self.scales),
            ..d
        }))
    }

    async fn ack(&self, ticket: Ticket) -> Result<(), SeamError> {
        self.inner.ack(ticket).await
    }

    async fn requeue(&self, ticket: Ticket) -> Result<(), SeamError> {
        self.inner.requeue(ticket).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_submitted_at_speed_1_5_with_its_own_noise_has_the_identity_of_the_scales_it_is_synthesized_with()
 {
    let d = deps();
    let dir = tempfile::tempdir().expect("tmp");
    let voice = Voice::find(&d.join("voices"), "en_US-joe-medium").expect("voice");
    let defaults = voice.family.default_scales();
    // `narrator submit --speed 1.5 --noise-scale 0.3 --noise-w 0.4`: the scales the job's
    // identity is hashed with (and that the job records).
    let chosen = ScaleOverrides {
        speed: Some(1.5),
        noise: Some(0.3),
        noise_w: Some(0.4),
        length: None,
    };
    let scales = chosen.resolve(defaults);
    assert_eq!(
        scales,
        Scales {
            noise: 0.3,
            length: defaults.length / 1.5,
            noise_w: 0.4
        }
    );
    assert_ne!(
        (scales.noise, scales.noise_w),
        (defaults.noise, defaults.noise_w)
    );
    let book = dir.path().join("book.txt");
    std::fs::write(
        &book,
        "The first sentence is short. The second one is a little longer than the first.\n\n\
         A second paragraph follows, with a third sentence.\n",
    )
    .expect("book");
    let doc = narrator_text::load_document(&book, &Default::default()).expect("read");
    let identity = |scales| AudioIdentity {
        voice: &voice.name,
        voice_digest: "digest",
        scales,
        speaker: 0,
    };
    let plan = plan_job(&doc, "book.txt", "book", &identity(scales));
    assert!(plan.segments.len() >= 3, "{} segments", plan.segments.len());
    // The noise settings are part of the identity: the same book at the same speed with
    // the voice's own noise is another job.
    let at_defaults = ScaleOverrides {
        speed: Some(1.5),
        ..ScaleOverrides::default()
    }
    .resolve(defaults);
    assert_ne!(
        plan.job_id,
        plan_job(&doc, "book.txt", "book", &identity(at_defaults)).job_id
    );

    // A worker loaded with its own settings (deterministic scales), not the job's.
    let seen = Arc::new(Mutex::new(Vec::new()));
    let pool = {
        let seen = seen.clone();
        EnginePool::start_with(1, move |_| {
            Ok(Box::new(Recording {
                null: NullBackend::default(),
                seen: seen.clone(),
            }) as Box<dyn Backend>)
        })
        .expect("pool")
    };
    let phonemizer = Phonemizer::new(&d).expect("espeak");
    let synth = Synthesizer::new(&voice, phonemizer, pool, Scales::DETERMINISTIC).expect("synth");
    std::fs::create_dir_all(dir.path().join("out")).expect("outputs folder");
    let stages = Stages {
        synth: Arc::new(synth),
        store: Arc::new(
            LocalAudioStore::new(dir.path().join("seg"), dir.path().join("out")).expect("store"),
        ),
        state: Arc::new(
            JournalStateStore::open(dir.path().join("journal.jsonl")).expect("journal"),
        ),
        on_event: Arc::new(|_: Event| {}),
    };
    let queue = Arc::new(AsRecorded {
        inner: InProcessQueue::new(),
        speed: 1.5,
        scales,
    });
    queue
        .inner
        .publish(&plan.job_id, plan.segments.iter().cloned())
        .expect("publish");
    queue.inner.close();
    let records = work(queue, &stages, &RunOptions::embedded("test".into(), 1))
        .await
        .expect("synthesized");
    assert_eq!(records.len(), plan.segments.len());
    let seen = seen.lock().expect("lock").clone();
    assert!(!seen.is_empty(), "no engine run");
    assert!(
        seen.iter().all(|s| *s == scales),
        "runs at {seen:?}, the job's identity has {scales:?}"
    );

    // A segment whose job recorded no scales (submitted before they were recorded) runs
    // as before: the worker's own scales at the job's rate.
    let segment = Segment {
        speed: Some(1.5),
        ..plan.segments[0].clone()
    };
    let prepared = stages.synth.prepare(segment).expect("prepared");
    assert_eq!(prepared.scales, None);
    assert_eq!(
        stages.synth.scales_for(&prepared),
        Scales {
            length: defaults.length / 1.5,
            ..Scales::DETERMINISTIC
        }
    );
}
