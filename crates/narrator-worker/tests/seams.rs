//! The worker library through its in-process seams, against the real services (a
//! database, a broker vhost and the S3 server from `narrator_test_support`): a
//! synthesizer is handed in directly, so a test can make one segment panic without any
//! hook in the production binary.

use std::sync::Arc;
use std::time::Duration;

use narrator_db::JobState;
use narrator_pipeline::{Budget, Synthesizer};
use narrator_test_support::{VOICE, World, book_text, root};
use narrator_worker::{VoiceEngine, Worker, WorkerConfig};

/// A null-engine synthesizer (silence of the right length) whose segments containing
/// `panic_on` panic in synthesis.
fn panicking_synth(panic_on: &'static str) -> Synthesizer {
    let deps = root().join(".deps");
    let voice = narrator_engine::Voice::find(&deps.join("voices"), VOICE).expect("voice");
    let phonemizer = narrator_phonemes::Phonemizer::new(&deps).expect("espeak-ng data");
    let pool = narrator_engine::EnginePool::start_with(1, |_| {
        Ok(Box::new(narrator_engine::NullBackend {
            samples_per_id: 384,
        }) as Box<dyn narrator_engine::Backend>)
    })
    .expect("pool");
    let scales = voice.family.default_scales();
    Synthesizer::new(&voice, phonemizer, pool, scales)
        .expect("synth")
        .with_budget(Budget {
            max_tokens: 16 * 512,
            max_requests: 16,
            max_wait: Duration::from_millis(200),
        })
        .with_fault(Arc::new(move |s| {
            if s.text.contains(panic_on) {
                panic!("injected panic on segment {}", s.index);
            }
            None
        }))
}

fn config(w: &World, synth: Synthesizer) -> WorkerConfig {
    WorkerConfig {
        id: "seams".into(),
        host: "test".into(),
        engine: "null".into(),
        voices: vec![VoiceEngine {
            voice: VOICE.into(),
            synth,
            plan: serde_json::json!({}),
            prefetch: 32,
            in_flight: 1,
        }],
        pool: w.pool.clone(),
        store: w.store(),
        amqp_url: w.amqp_url.clone(),
        amqp_ca_file: None,
        device: "cpu".into(),
        hardware: serde_json::json!({}),
        pack_max: 64,
        reconcile_after: Duration::from_secs(30),
        heartbeat: Duration::from_secs(1),
        lease: Duration::from_secs(300),
        keep_intermediates: false,
        broker_timeout: Duration::from_secs(60),
        health: narrator_telemetry::serve::Health::new(),
        gauges: false,
    }
}

/// Starts a worker with `synth` and runs it until `job` ends (at most 60 s).
fn run_until_ended(
    w: &World,
    synth: Synthesizer,
    job: narrator_db::Uuid,
) -> Result<
    Result<narrator_worker::Summary, narrator_worker::WorkerError>,
    tokio::time::error::Elapsed,
> {
    let worker =
        w.rt.block_on(Worker::start(config(w, synth)))
            .expect("worker starts");
    let pool = w.pool.clone();
    let ended = async move {
        loop {
            let state = narrator_db::job_state(&pool, job).await.expect("state");
            if state.is_some_and(|s| s.is_final()) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    w.rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(60), worker.run_until(ended)).await
    })
}

/// Promise 7: a segment that makes synthesis panic takes only itself down. Its batch
/// is run again one segment at a time; it is dead-lettered with the panic as its reason,
/// its neighbours are done on their first attempt, and the worker keeps running.
#[test]
fn a_panicking_segment_fails_alone_and_its_neighbours_are_not_charged() {
    let w = World::new();
    let book = w.book(
        "panic.md",
        &book_text(1, 6, Some((3, "This sentence makes the engine panic."))),
    );
    let job = w.submit(&book, &["--format", "wav"]);
    let summary = run_until_ended(&w, panicking_synth("makes the engine panic"), job)
        .expect("the job ends")
        .expect("the worker ran without error");
    assert_eq!(summary.segments_done, 5);
    assert_eq!(w.state(job), JobState::Failed);
    let rows = w.segment_rows(job);
    for (idx, state, attempts, kind, reason) in rows {
        if idx == 2 {
            assert_eq!((state.as_str(), kind.as_deref()), ("failed", Some("panic")));
            assert!(
                reason
                    .as_deref()
                    .unwrap_or("")
                    .contains("injected panic on segment 2"),
                "{reason:?}"
            );
        } else {
            assert_eq!((state.as_str(), attempts), ("done", 1), "segment {idx}");
        }
    }
    assert_eq!(w.queue_ready(narrator_broker::DEAD_LETTER_QUEUE), 1);
}

/// Messages forged into the lane beside a job's real ones (anyone who reaches the broker
/// can publish): one naming a segment index no segment can have (2³¹, past the
/// database's `int4`), and one rewriting a real segment's text. Each is dead-lettered
/// alone with its reason; the messages delivered in their group are done on their first
/// attempt, from the database's text.
#[test]
fn forged_messages_are_dead_lettered_alone() {
    let w = World::new();
    let book = w.book("poison.md", &book_text(1, 6, None));
    let job = w.submit(&book, &["--format", "wav"]);
    let conn = w.broker();
    w.rt.block_on(async {
        let cluster = narrator_db::cluster_id(&w.pool).await.expect("cluster id");
        let forged = |index: u32| {
            narrator_broker::SegmentMessage::new(
                job.to_string(),
                VOICE,
                narrator_core::Segment {
                    index,
                    chapter: 0,
                    text: "Send all the money to the account below.".into(),
                    pause_after: narrator_core::PauseAfter::Sentence,
                    speaker: 0,
                },
            )
            .in_lane(narrator_broker::lane_of(0))
            .in_cluster(cluster.to_string())
        };
        narrator_broker::Publisher::new(&conn)
            .await
            .expect("publisher")
            .publish_batch(&[forged(1 << 31), forged(0)])
            .await
            .expect("publish");
    });
    run_until_ended(&w, panicking_synth("no sentence says this"), job)
        .expect("the job ends (its segments are not held back by the forged messages)")
        .expect("the worker ran without error");
    assert_eq!(w.state(job), JobState::Done);
    for (idx, state, attempts, _, _) in w.segment_rows(job) {
        assert_eq!((state.as_str(), attempts), ("done", 1), "segment {idx}");
    }
    assert_eq!(
        w.queue_ready(narrator_broker::DEAD_LETTER_QUEUE),
        2,
        "the forged ones alone"
    );
}

/// A message naming its job in another form of the same UUID (braced, upper-case) is
/// worked under the job's canonical id: its audio goes under the job's own keys, which the
/// assembler cleans up, and nothing is left under the other form.
#[test]
fn a_job_id_in_another_form_is_worked_under_the_canonical_one() {
    let w = World::new();
    let book = w.book("forms.md", &book_text(1, 3, None));
    let job = w.submit(&book, &["--format", "wav"]);
    let odd = format!("{{{}}}", job.to_string().to_uppercase());
    let conn = w.broker();
    let store = w.store();
    w.rt.block_on(async {
        let cluster = narrator_db::cluster_id(&w.pool).await.expect("cluster id");
        let segment = narrator_db::load_job(&w.pool, job)
            .await
            .expect("job")
            .plan
            .segments[1]
            .clone();
        let again = narrator_broker::SegmentMessage::new(odd.clone(), VOICE, segment)
            .in_lane(narrator_broker::lane_of(0))
            .in_cluster(cluster.to_string());
        narrator_broker::Publisher::new(&conn)
            .await
            .expect("publisher")
            .publish_batch(&[again])
            .await
            .expect("publish");
    });
    run_until_ended(&w, panicking_synth("no sentence says this"), job)
        .expect("the job ends")
        .expect("the worker ran without error");
    assert_eq!(w.state(job), JobState::Done);
    let left = w.rt.block_on(async {
        let mut keys = Vec::new();
        for prefix in store.intermediate_prefixes(&odd) {
            keys.extend(store.list(&prefix).await.expect("list"));
        }
        keys
    });
    assert!(
        left.is_empty(),
        "objects under the other form of the id: {left:?}"
    );
}
