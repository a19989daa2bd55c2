//! The worker library through its in-process seams, against the real services (a
//! database, a broker vhost and the S3 server from `narrator_test_support`): a
//! synthesizer is handed in directly, so a test can make one segment panic without any
//! hook in the production binary.

use std::sync::Arc;
use std::time::Duration;

use narrator_db::JobState;
use narrator_pipeline::{Budget, Synthesizer};
use narrator_test_support::{PrivateS3, VOICE, World, book_text, root};
use narrator_worker::{VoiceEngine, Worker, WorkerConfig};

/// A null-engine synthesizer (silence of the right length) with `budget` and `fault`
/// run on every segment before synthesis.
fn synth_with(budget: Budget, fault: narrator_pipeline::Fault) -> Synthesizer {
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
        .with_budget(budget)
        .with_fault(fault)
}

/// A null-engine synthesizer whose segments containing `panic_on` panic in synthesis.
fn panicking_synth(panic_on: &'static str) -> Synthesizer {
    let budget = Budget {
        max_tokens: 16 * 512,
        max_requests: 16,
        max_wait: Duration::from_millis(200),
    };
    synth_with(
        budget,
        Arc::new(move |s| {
            if s.text.contains(panic_on) {
                panic!("injected panic on segment {}", s.index);
            }
            None
        }),
    )
}

/// A null-engine synthesizer that takes `each` per segment, one segment at a time.
fn slow_synth(each: Duration) -> Synthesizer {
    let one_at_a_time = Budget {
        max_tokens: 16 * 512,
        max_requests: 1,
        max_wait: Duration::from_millis(1),
    };
    synth_with(
        one_at_a_time,
        Arc::new(move |_| {
            std::thread::sleep(each);
            None
        }),
    )
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
        postpone_budget: Duration::from_secs(86_400),
        wedged_after: Duration::from_secs(600),
        health: narrator_telemetry::serve::Health::new(),
        gauges: false,
        max_hold: narrator_pipeline::batcher::MAX_HOLD,
        intake: None,
    }
}

type Ran = Result<
    Result<narrator_worker::Summary, narrator_worker::WorkerError>,
    tokio::time::error::Elapsed,
>;

/// Starts a worker with `synth` and runs it until `job` ends (at most 60 s).
fn run_until_ended(w: &World, synth: Synthesizer, job: narrator_db::Uuid) -> Ran {
    run_config_until_ended(w, config(w, synth), job, Duration::from_secs(60))
}

/// Starts a worker with `config` and runs it until `job` ends (at most `within`).
fn run_config_until_ended(
    w: &World,
    config: WorkerConfig,
    job: narrator_db::Uuid,
    within: Duration,
) -> Ran {
    let worker = w.rt.block_on(Worker::start(config)).expect("worker starts");
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
    w.rt.block_on(async { tokio::time::timeout(within, worker.run_until(ended)).await })
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
                    speed: None,
                    timed: false,
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

/// An outage that outlasts the postponement budget fails the segments instead of
/// postponing them for ever: the store goes away for good (a bucket quota, or a 4xx taken
/// for an outage, look the same to the worker); with a 3 s budget the deliveries are
/// postponed once, uncharged, and on their next delivery they fail with the outage and the
/// budget in their reason, and the job ends failed, for `narrator retry` once it is fixed.
#[test]
fn an_outage_past_the_postponement_budget_fails_the_segments_with_it_as_the_reason() {
    let mut w = World::new();
    let mut s3 = PrivateS3::start(9031);
    w.use_s3_endpoint(&s3.endpoint());
    let book = w.book("budget.md", &book_text(1, 3, None));
    let job = w.submit(&book, &["--format", "wav"]);
    let mut config = config(&w, panicking_synth("no sentence says this"));
    config.postpone_budget = Duration::from_secs(3);
    s3.down();
    run_config_until_ended(&w, config, job, Duration::from_secs(90))
        .expect("the job ends instead of being postponed for ever")
        .expect("the worker ran without error");
    assert_eq!(w.state(job), JobState::Failed);
    for (idx, state, attempts, kind, reason) in w.segment_rows(job) {
        let reason = reason.unwrap_or_default();
        assert_eq!(state, "failed", "segment {idx}");
        assert_eq!(attempts, 1, "postponements are not charged: segment {idx}");
        assert_eq!(kind.as_deref(), Some("store_io"), "segment {idx}: {reason}");
        assert!(
            reason.contains("postponement budget is 3 s"),
            "segment {idx}: {reason}"
        );
    }
}

/// Promise: a cancelled job leaves nothing in the store. A job is cancelled while its
/// segments are synthesized (one at a time, 200 ms each), and an assembly that finished
/// after the cancel left a book under `out/`: once the lease (1 s here) has passed, a
/// worker's sweep deletes every object of the job and records it; the job stays
/// cancelled.
#[test]
fn a_cancelled_job_leaves_nothing_in_the_store() {
    let w = World::new();
    let book = w.book("cancel.md", &book_text(1, 12, None));
    let job = w.submit(&book, &["--format", "wav"]);
    let slow = slow_synth(Duration::from_millis(200));
    let mut config = config(&w, slow);
    config.lease = Duration::from_secs(1);
    config.pack_max = 1;
    let worker = w.rt.block_on(Worker::start(config)).expect("worker starts");
    let store = w.store();
    let (pool, store2) = (w.pool.clone(), store.clone());
    let released = async move {
        let job_prefix = store2.job_prefix(&job.to_string());
        // Some segments stored, then the cancel, then a late assembly's output.
        loop {
            let stored = store2.list(&job_prefix).await.expect("list");
            if stored.len() >= 2 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(
            narrator_db::cancel_job(&pool, job).await.expect("cancel"),
            "the job was still running when cancelled"
        );
        let late = store2.output_key(&job.to_string(), "book.wav");
        store2
            .put_bytes(&late, b"RIFF".to_vec(), "audio/wav")
            .await
            .expect("put");
        loop {
            let done: bool = sqlx::query_scalar(
                "SELECT storage_released_at IS NOT NULL FROM jobs WHERE id = $1",
            )
            .bind(job)
            .fetch_one(&pool)
            .await
            .expect("released");
            if done {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    w.rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(60), worker.run_until(released)).await
    })
    .expect("the cancelled job's storage is released")
    .expect("the worker ran without error");
    assert_eq!(w.state(job), JobState::Cancelled);
    let left =
        w.rt.block_on(store.list(&store.job_prefix(&job.to_string())));
    assert_eq!(left.expect("list"), Vec::<String>::new(), "objects left");
}

/// Item 2 of the reliability issue: a message lost while its voice has a steady backlog
/// is published again without waiting for the voice to be idle. A 120-segment book keeps
/// the voice busy (150 ms a segment, one at a time: about 18 s; the test ends with the
/// small book, so its length costs nothing); a one-segment book of a higher priority lost
/// its only message. The watchdog sees one segment out that no
/// message accounts for, publishes it again after the lease (1 s), and the small book is
/// done long before the big one.
#[test]
fn a_lost_message_is_published_again_while_its_voice_is_busy() {
    let w = World::new();
    let big = w.submit(
        &w.book("big.md", &book_text(1, 120, None)),
        &["--format", "wav"],
    );
    let small = w.submit(
        &w.book("small.md", &book_text(1, 1, None)),
        &["--format", "wav", "--priority", "5"],
    );
    // Lose the small book's message (the broker dropped it).
    let conn = w.broker();
    w.rt.block_on(async {
        let ch = conn.create_channel().await.expect("channel");
        let queue = narrator_broker::lane_queue(VOICE, narrator_broker::lane_of(5));
        let m = ch
            .basic_get(
                queue.as_str().into(),
                lapin::options::BasicGetOptions { no_ack: false },
            )
            .await
            .expect("basic.get")
            .expect("the small book's message");
        m.ack(lapin::options::BasicAckOptions::default())
            .await
            .expect("ack");
    });
    let mut config = config(&w, slow_synth(Duration::from_millis(150)));
    config.lease = Duration::from_secs(1);
    run_config_until_ended(&w, config, small, Duration::from_secs(60))
        .expect("the lost segment is published again")
        .expect("the worker ran without error");
    assert_eq!(w.state(small), JobState::Done);
    assert_ne!(
        w.state(big),
        JobState::Done,
        "the small book must not have waited for the voice to be idle"
    );
    let big_done = w.segment_rows(big).iter().filter(|r| r.1 == "done").count();
    assert!(
        big_done < 120,
        "the backlog was still there: {big_done} of 120 done"
    );
}

/// Item 5 of the reliability issue: a wedged engine does not look healthy. One segment's
/// batch hangs (the engine never returns, as a hung GPU would) while every loop keeps
/// ticking; past `--wedged-after` the worker fails `/healthz`, its row says why, and it
/// stops with that reason, its deliveries going back to the queue. A second worker then
/// finishes the job.
///
/// Phonemizing shares `--wedged-after` as its limit (`liveness::limit`), so a slow first
/// espeak-ng chunk on a busy machine could wedge the worker as *phonemizing* before the
/// engine hangs. So the phonemizer is warmed before the worker starts, the limit (5 s) is
/// far above what phonemizing one warm sentence takes, and the hang is unmistakable: the
/// hook notes when the batch starts hanging, the worker must still be running then, and
/// the deadlines are separate: start-up (messages taken, segments 0 to 2 done, the hanging
/// batch reached) has its own, and the wedge-to-stop deadline counts from the hang.
#[test]
fn a_wedged_engine_fails_healthz_and_another_worker_finishes_its_work() {
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Instant;
    static RELEASE: AtomicBool = AtomicBool::new(false);
    static HUNG_AT: OnceLock<Instant> = OnceLock::new();
    const WEDGED_AFTER: Duration = Duration::from_secs(5);
    // From the worker's start to the hanging batch: a minute, as a loaded machine needs.
    const START_UP: Duration = Duration::from_secs(60);
    // From the hang to the worker's stop: the limit, the watcher's 1 s tick, and the
    // drain (the connection closed, the row written).
    const HANG_TO_STOP: Duration = Duration::from_secs(5 + 25);
    // The hook hangs past every deadline above, until the test lets go.
    const HANG_AT_MOST: Duration = Duration::from_secs(120);
    let w = World::new();
    let book = w.book(
        "wedge.md",
        &book_text(1, 6, Some((3, "This sentence wedges the engine."))),
    );
    let job = w.submit(&book, &["--format", "wav"]);
    let budget = Budget {
        max_tokens: 16 * 512,
        max_requests: 1,
        max_wait: Duration::from_millis(1),
    };
    let hangs = synth_with(
        budget,
        Arc::new(|s| {
            if s.text.contains("wedges the engine") {
                let at = *HUNG_AT.get_or_init(Instant::now);
                while !RELEASE.load(Ordering::Relaxed) && at.elapsed() < HANG_AT_MOST {
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
            None
        }),
    );
    // espeak-ng loads its voice on the first chunk: done here, outside any limit.
    hangs
        .prepare(narrator_core::Segment {
            index: 0,
            chapter: 0,
            text: "Warming up the phonemizer before the worker starts.".into(),
            pause_after: narrator_core::PauseAfter::Sentence,
            speaker: 0,
            speed: None,
            timed: false,
        })
        .expect("the phonemizer warms up");
    let mut first = config(&w, hangs);
    first.wedged_after = WEDGED_AFTER;
    first.id = "wedged".into();
    let health = first.health.clone();
    let worker = w.rt.block_on(Worker::start(first)).expect("worker starts");
    let (stopped, hang_to_stop) = w.rt.block_on(async {
        let run = worker.run_until(std::future::pending());
        tokio::pin!(run);
        let hung = async {
            loop {
                if let Some(at) = HUNG_AT.get() {
                    return *at;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        };
        let hung_at = tokio::select! {
            r = &mut run => panic!(
                "the worker stopped before the engine hung (phonemizing wedged?): {r:?}"
            ),
            at = tokio::time::timeout(START_UP, hung) => {
                at.expect("the hanging segment reaches the engine within the start-up deadline")
            }
        };
        let stopped = tokio::time::timeout_at((hung_at + HANG_TO_STOP).into(), &mut run)
            .await
            .expect("the wedged worker stops by itself within its deadline from the hang");
        (stopped, hung_at.elapsed())
    });
    let error = stopped.expect_err("it stops with an error");
    let text = error.to_string();
    assert!(
        matches!(error, narrator_worker::WorkerError::Wedged { .. }),
        "{text}"
    );
    assert!(text.contains("a batch has run for"), "{text}");
    assert!(
        hang_to_stop >= WEDGED_AFTER,
        "stopped {hang_to_stop:?} after the hang, before the limit: {text}"
    );
    let (alive, body) = health.healthy();
    assert!(!alive, "/healthz must fail: {body}");
    let plan: serde_json::Value =
        w.rt.block_on(
            sqlx::query_scalar("SELECT plan FROM workers WHERE id = 'wedged'").fetch_one(&w.pool),
        )
        .expect("the worker's row");
    assert!(
        plan[0]["wedged"]
            .as_str()
            .is_some_and(|r| r.contains("a batch has run for")),
        "the row says why: {plan}"
    );
    RELEASE.store(true, Ordering::Relaxed);
    run_until_ended(&w, panicking_synth("no sentence says this"), job)
        .expect("another worker finishes the job")
        .expect("the worker ran without error");
    assert_eq!(w.state(job), JobState::Done);
}

/// Item 5 for assemblies: an assembly whose store hangs (s3s-fs frozen with SIGSTOP:
/// connections accepted, no answer) runs past its budget (`--wedged-after` 1 s plus a
/// tenth of the book's audio time); the worker fails `/healthz` and stops with the
/// reason, the assembly is put back, and once the store is back another worker
/// assembles the job.
#[test]
fn a_wedged_assembly_stops_its_worker_and_another_assembles_the_job() {
    let mut w = World::new();
    let s3 = PrivateS3::start(narrator_test_support::prometheus::free_port());
    w.use_s3_endpoint(&s3.endpoint());
    let book = w.book("stuck.md", &book_text(1, 4, None));
    let job = w.submit(&book, &["--format", "wav"]);
    // Every segment done and the job assembled, its segment audio kept...
    let mut first = config(&w, panicking_synth("no sentence says this"));
    first.keep_intermediates = true;
    run_config_until_ended(&w, first, job, Duration::from_secs(60))
        .expect("the job ends")
        .expect("the worker ran without error");
    assert_eq!(w.state(job), JobState::Done);
    // ...then put back to be assembled again, with the store frozen.
    w.rt.block_on(
        sqlx::query(
            "UPDATE jobs SET state = 'running', finished_at = NULL, outputs = '[]', \
               assembler = NULL, assembler_instance = NULL WHERE id = $1",
        )
        .bind(job)
        .execute(&w.pool),
    )
    .expect("reset");
    let mut second = config(&w, panicking_synth("no sentence says this"));
    second.id = "frozen".into();
    second.wedged_after = Duration::from_secs(1);
    s3.pause();
    let health = second.health.clone();
    let worker = w.rt.block_on(Worker::start(second)).expect("worker starts");
    let stopped = w.rt.block_on(async {
        tokio::time::timeout(
            Duration::from_secs(60),
            worker.run_until(std::future::pending()),
        )
        .await
    });
    s3.resume();
    let error = stopped
        .expect("the wedged worker stops by itself")
        .expect_err("it stops with an error");
    let text = error.to_string();
    assert!(
        matches!(error, narrator_worker::WorkerError::Wedged { .. }),
        "{text}"
    );
    assert!(text.contains("past its budget"), "{text}");
    assert!(!health.healthy().0, "/healthz must fail");
    run_until_ended(&w, panicking_synth("no sentence says this"), job)
        .expect("another worker assembles the job")
        .expect("the worker ran without error");
    assert_eq!(w.state(job), JobState::Done);
}
