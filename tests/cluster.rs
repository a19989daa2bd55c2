//! The distributed mode end to end, with everything real: RabbitMQ (127.0.0.1:5672, a
//! vhost per test), Postgres (NARRATOR_DATABASE_URL's server; each test makes its own
//! database), the S3 test server (`bash ops/s3-server.sh start`), the `narrator` binary
//! as producer and workers, and the real voice where the test is about synthesis.
//! `bash ops/test.sh` starts the services and sets the environment; the shared set-up
//! is `narrator_test_support`.

use std::time::{Duration, Instant};

use lapin::options::{BasicAckOptions, BasicGetOptions};
use lapin::types::FieldTable;
use narrator_broker::{DEAD_LETTER_QUEUE, DEAD_REASON_HEADER, SegmentMessage};
use narrator_db::{JobState, Uuid};
use narrator_test_support::{VOICE, World, book_text, indices, media, output_key, root};

#[test]
fn two_workers_one_killed_mid_job_the_job_completes_with_every_segment_once() {
    let mut w = World::new();
    let book = w.book("three.md", &book_text(3, 5, None));
    let a = w.worker("a", &[], &[]);
    w.worker("b", &[], &[]);
    let job = w.submit(
        &book,
        &[
            "--format",
            "wav",
            "--chapter-files",
            "--subtitles",
            "srt,vtt",
        ],
    );
    let deadline = Instant::now() + Duration::from_secs(120);
    while w.done_count(job) < 3 {
        assert!(Instant::now() < deadline, "no progress: {}", w.status(job));
        std::thread::sleep(Duration::from_millis(50));
    }
    let killed = w.stop(a, 9);
    assert!(!killed.success());
    w.worker("c", &[], &[]);
    w.wait_state(job, JobState::Done, Duration::from_secs(240));

    let st = w.status(job);
    let total = st["segments_total"].as_u64().expect("total");
    assert_eq!(total, 15);
    assert_eq!(st["segments_done"], total);
    assert!(st["rtf"].as_f64().expect("rtf") > 0.0, "{st}");
    assert!(
        st["latency_seconds"].as_f64().expect("latency") > 0.0,
        "{st}"
    );
    let outputs = st["outputs"].as_array().expect("outputs");
    assert_eq!(
        outputs.iter().filter(|o| o["kind"] == "chapter").count(),
        3,
        "{st}"
    );
    for o in outputs {
        let url = o["url"].as_str().expect("presigned url");
        assert!(
            url.starts_with("http") && url.contains("X-Amz-Signature"),
            "{url}"
        );
    }
    let manifest = w.manifest(job);
    assert_eq!(indices(&manifest), (0..total).collect::<Vec<_>>());
    let book_key = output_key(&st, "book");
    let (rate, samples) = narrator_audio::decode_wav_bytes(&w.s3_get(&book_key)).expect("wav");
    let seconds = samples.len() as f64 / f64::from(rate);
    let want = manifest["book"]["seconds"].as_f64().expect("seconds");
    assert!((seconds - want).abs() < 0.01, "{seconds} vs {want}");
    // Subtitles of the book and of each chapter file, written by the assembling worker
    // from the layout: the book's first cue at the first segment's start.
    let kinds = |kind: &str| outputs.iter().filter(|o| o["kind"] == kind).count();
    assert_eq!(
        (
            kinds("subtitles"),
            kinds("chapter subtitles"),
            kinds("timings")
        ),
        (2, 6, 1),
        "{st}"
    );
    let timings: serde_json::Value =
        serde_json::from_slice(&w.s3_get(&output_key(&st, "timings"))).expect("timings.json");
    let sentences = timings["sentences"].as_array().expect("sentences");
    assert_eq!(sentences.len() as u64, total);
    for (t, m) in sentences
        .iter()
        .zip(manifest["segments"].as_array().expect("segments"))
    {
        let start = t["start"].as_f64().expect("start");
        assert!((start - m["start_seconds"].as_f64().expect("s")).abs() < 1e-9);
    }
    let srt = String::from_utf8(w.s3_get(&output_key(&st, "subtitles"))).expect("utf8");
    let first = manifest["segments"][0]["start_seconds"]
        .as_f64()
        .expect("start");
    let ms = (first * 1000.0).round() as u64;
    assert!(
        srt.starts_with(&format!("1\n00:00:{:02},{:03} --> ", ms / 1000, ms % 1000)),
        "{srt}"
    );
    // Every segment recorded exactly once, by the workers that ran.
    let rows: Vec<(i32, String, i32)> = w.rt.block_on(async {
        sqlx::query_as("SELECT idx, worker, attempts FROM segment_figures WHERE job_id = $1 AND state = 'done' ORDER BY idx")
            .bind(job)
            .fetch_all(&w.pool)
            .await
            .expect("figures")
    });
    assert_eq!(rows.len() as u64, total);
    assert!(
        rows.iter()
            .all(|(_, worker, _)| ["a", "b", "c"].contains(&worker.as_str()))
    );
    assert!(w.worker_log("c").contains("ready"));
}

#[test]
fn a_redelivered_finished_segment_is_neither_synthesized_nor_counted_again() {
    let mut w = World::new();
    let book = w.book("small.md", &book_text(2, 4, None));
    let first = w.worker("first", &["--engine", "null"], &[]);
    let job = w.submit(&book, &["--format", "wav"]);
    w.wait_state(job, JobState::Done, Duration::from_secs(60));
    assert!(w.stop(first, 15).success());
    let before: Vec<(i32, String, chrono::DateTime<chrono::Utc>)> = w.rt.block_on(async {
        sqlx::query_as("SELECT idx, worker, done_at FROM segments WHERE job_id = $1 ORDER BY idx")
            .bind(job)
            .fetch_all(&w.pool)
            .await
            .expect("rows")
    });
    let status_before = w.status(job);
    // Deliver every segment again, as a broker does after a worker died before its acks.
    w.rt.block_on(async {
        let stored = narrator_db::load_job(&w.pool, job).await.expect("job");
        let conn = narrator_broker::connect(&w.amqp_url).await.expect("amqp");
        let publisher = narrator_broker::Publisher::new(&conn)
            .await
            .expect("publisher");
        let messages: Vec<SegmentMessage> = stored
            .plan
            .segments
            .iter()
            .map(|s| SegmentMessage::new(job.to_string(), VOICE, s.clone()))
            .collect();
        publisher.publish_batch(&messages).await.expect("publish");
        let _ = conn.close(200, "ok".into()).await;
    });
    let second = w.worker("second", &["--engine", "null"], &[]);
    let queue = narrator_broker::work_queue(VOICE);
    let deadline = Instant::now() + Duration::from_secs(30);
    while w.queue_ready(&queue) > 0 {
        assert!(Instant::now() < deadline, "redeliveries not consumed");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(w.stop(second, 15).success());
    assert!(
        w.worker_log("second").contains("stopped after 0 segments"),
        "{}",
        w.worker_log("second")
    );
    assert_eq!(
        w.queue_ready(&queue),
        0,
        "every redelivery was acknowledged"
    );
    let after: Vec<(i32, String, chrono::DateTime<chrono::Utc>)> = w.rt.block_on(async {
        sqlx::query_as("SELECT idx, worker, done_at FROM segments WHERE job_id = $1 ORDER BY idx")
            .bind(job)
            .fetch_all(&w.pool)
            .await
            .expect("rows")
    });
    assert_eq!(before, after);
    let status_after = w.status(job);
    assert_eq!(
        status_after["segments_done"],
        status_before["segments_done"]
    );
    assert_eq!(
        status_after["audio_seconds"],
        status_before["audio_seconds"]
    );
    assert_eq!(status_after["state"], "done");
}

#[test]
fn segments_a_crashed_producer_never_published_are_published_by_the_reconciler() {
    let mut w = World::new();
    let book = w.book("outbox.md", &book_text(2, 6, None));
    let out = w
        .cmd()
        .args(["submit", book.to_str().expect("utf8"), "--json"])
        .env("NARRATOR_TEST_CRASH_AFTER_COMMIT", "1")
        .output()
        .expect("spawn");
    assert!(!out.status.success(), "the producer must die");
    let (job, unpublished): (Uuid, i64) = w.rt.block_on(async {
        sqlx::query_as(
            "SELECT j.id, count(*) FILTER (WHERE s.published_at IS NULL) FROM jobs j \
             JOIN segments s ON s.job_id = j.id GROUP BY j.id",
        )
        .fetch_one(&w.pool)
        .await
        .expect("the job was committed")
    });
    assert_eq!(unpublished, 12, "nothing was published");
    assert_eq!(w.queue_ready(&narrator_broker::work_queue(VOICE)), 0);
    w.worker(
        "reconciling",
        &["--engine", "null", "--reconcile-after", "1"],
        &[],
    );
    w.wait_state(job, JobState::Done, Duration::from_secs(60));
    let still: i64 = w.rt.block_on(async {
        sqlx::query_scalar(
            "SELECT count(*) FROM segments WHERE job_id = $1 AND published_at IS NULL",
        )
        .bind(job)
        .fetch_one(&w.pool)
        .await
        .expect("count")
    });
    assert_eq!(still, 0);
    assert_eq!(indices(&w.manifest(job)), (0..12).collect::<Vec<_>>());
}

/// Takes the dead letter of `job` from `narrator.dead` (others are left there).
fn take_dead_letter(w: &World, job: Uuid) -> Option<FieldTable> {
    w.rt.block_on(async {
        let conn = narrator_broker::connect(&w.amqp_url).await.expect("amqp");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while tokio::time::Instant::now() < deadline {
            let ch = conn.create_channel().await.expect("channel");
            let mut found = None;
            while let Some(m) = ch
                .basic_get(DEAD_LETTER_QUEUE.into(), BasicGetOptions { no_ack: false })
                .await
                .expect("basic.get")
            {
                if SegmentMessage::decode(&m.delivery.data)
                    .is_ok_and(|d| d.job_id == job.to_string())
                {
                    m.delivery
                        .acker
                        .ack(BasicAckOptions::default())
                        .await
                        .expect("ack");
                    found = Some(m.delivery.properties.headers().clone().unwrap_or_default());
                    break;
                }
            }
            let _ = ch.close(200, "ok".into()).await;
            if found.is_some() {
                let _ = conn.close(200, "ok".into()).await;
                return found;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        None
    })
}

#[test]
fn a_failing_segment_is_dead_lettered_alone_and_the_job_can_be_retried() {
    let mut w = World::new();
    let book = w.book(
        "poison.md",
        &book_text(2, 8, Some((6, "The word Xyzzy cannot be said."))),
    );
    let faulty = w.worker(
        "faulty",
        &["--engine", "null", "--max-batch", "8"],
        &[("NARRATOR_TEST_FAIL_TEXT", "Xyzzy")],
    );
    let job = w.submit(&book, &["--format", "wav"]);
    w.wait_state(job, JobState::Failed, Duration::from_secs(60));
    // The job fails once its other segments are done.
    let st = w.status(job);
    assert_eq!(st["state"], "failed");
    assert_eq!(
        st["segments_done"], 15,
        "only the poisoned segment failed: {st}"
    );
    assert_eq!(st["segments_failed"], 1, "{st}");
    let reason = st["failure_reason"].as_str().expect("reason");
    assert!(
        reason.contains("1 of 16 segments failed")
            && reason.contains("segment 5")
            && reason.contains("narrator retry"),
        "{reason}"
    );
    let (kind, why): (String, String) = w.rt.block_on(async {
        sqlx::query_as(
            "SELECT failure_kind, failure_reason FROM segments WHERE job_id = $1 AND idx = 5",
        )
        .bind(job)
        .fetch_one(&w.pool)
        .await
        .expect("segment row")
    });
    assert_eq!(kind, "text_unspeakable");
    assert!(why.contains("cannot be spoken"), "{why}");
    let headers = take_dead_letter(&w, job).expect("a dead letter for the job");
    assert!(
        headers.inner().contains_key(DEAD_REASON_HEADER),
        "{headers:?}"
    );

    assert!(w.stop(faulty, 15).success());
    w.worker("healthy", &["--engine", "null"], &[]);
    let out = w.ok(&["retry", &job.to_string()]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("1 segments to redo, 1 enqueued now"));
    w.wait_state(job, JobState::Done, Duration::from_secs(60));
    assert_eq!(indices(&w.manifest(job)), (0..16).collect::<Vec<_>>());
    let err = w.err(&["retry", &job.to_string()]);
    assert!(err.contains("not failed"), "{err}");
}

/// A book whose every segment fails for good ends `failed` at the pace its failures are
/// recorded: each failure frees room in the book's window and tops it up, as a recording
/// does. Topped up only by recordings, a failing book advanced one window (64 segments
/// here) per reconciler tick (10 s): 2,000 segments would take over 5 minutes.
#[test]
fn a_book_whose_every_segment_fails_ends_failed_within_90_s() {
    let mut w = World::new();
    // 20 chapters of 100 sentences, every one with the word that fails.
    let mut text = String::from("# Nothing Can Be Said\n\n");
    for c in 1..=20 {
        text.push_str(&format!("## Chapter {c}\n\n"));
        for i in 0..100 {
            text.push_str(&format!("Plugh number {i} of chapter {c} fails. "));
            if i % 5 == 4 {
                text.push_str("\n\n");
            }
        }
        text.push_str("\n\n");
    }
    let book = w.book("failing.md", &text);
    let worker = w.worker(
        "failing",
        &["--engine", "null", "--prefetch", "16"],
        &[("NARRATOR_TEST_FAIL_TEXT", "Plugh")],
    );
    let job = w.submit(&book, &["--format", "wav"]);
    let st = w.status(job);
    assert_eq!(st["segments_total"], 2000, "{st}");
    w.wait_state(job, JobState::Failed, Duration::from_secs(90));
    let st = w.status(job);
    assert_eq!(st["segments_failed"], 2000, "{st}");
    assert!(w.stop(worker, 15).success(), "{}", w.logs());
}

#[test]
fn a_cancelled_job_gets_no_more_work() {
    let mut w = World::new();
    let book = w.book("cancel.md", &book_text(2, 10, None));
    let job = w.submit(&book, &[]);
    let out = w.ok(&["cancel", &job.to_string()]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("cancelled"));
    let worker = w.worker("idle", &["--engine", "null"], &[]);
    let queue = narrator_broker::work_queue(VOICE);
    let deadline = Instant::now() + Duration::from_secs(30);
    while w.queue_ready(&queue) > 0 {
        assert!(Instant::now() < deadline, "cancelled segments not drained");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(w.stop(worker, 15).success());
    assert_eq!(w.done_count(job), 0);
    assert_eq!(w.state(job), JobState::Cancelled);
    assert_eq!(w.queue_ready(&queue), 0);
    let err = w.err(&["cancel", &job.to_string()]);
    assert!(err.contains("already ended"), "{err}");
    let err = w.err(&["status", &job.to_string(), "--wait"]);
    assert!(err.contains("ended cancelled"), "{err}");
}

#[test]
fn sigterm_finishes_the_batch_in_flight_and_exits_cleanly() {
    let mut w = World::new();
    let sample = root().join("examples/sample.md");
    let worker = w.worker("draining", &[], &[]);
    let job = w.submit(&sample, &["--format", "wav"]);
    let deadline = Instant::now() + Duration::from_secs(120);
    while w.done_count(job) < 1 {
        assert!(Instant::now() < deadline, "{}", w.status(job));
        std::thread::sleep(Duration::from_millis(50));
    }
    let status = w.stop(worker, 15);
    assert!(
        status.success(),
        "exit {status}: {}",
        w.worker_log("draining")
    );
    let log = w.worker_log("draining");
    assert!(
        log.contains("stopping after the batches in flight"),
        "{log}"
    );
    let done = w.done_count(job);
    assert!(
        log.contains(&format!("stopped after {done} segments")),
        "every segment it finished is recorded ({done}): {log}"
    );
    // Whatever it had prefetched went back to the queue; another worker finishes.
    w.worker("finisher", &[], &[]);
    w.wait_state(job, JobState::Done, Duration::from_secs(180));
    let manifest = w.manifest(job);
    let n = manifest["segments"].as_array().expect("segments").len() as u64;
    assert_eq!(indices(&manifest), (0..n).collect::<Vec<_>>());
}

#[test]
fn commands_fail_with_one_clear_line_and_never_print_secrets() {
    let w = World::new();
    let err = w.err(&["status", "not-a-job"]);
    assert!(err.contains("is not a job id"), "{err}");
    let err = w.err(&["status", &Uuid::new_v4().to_string()]);
    assert!(err.contains("no job"), "{err}");
    // One bad input among good ones: nothing is recorded.
    let good = w.book("good.md", &book_text(1, 3, None));
    let missing = w.tmp.path().join("missing.txt");
    let err = w.err(&[
        "submit",
        good.to_str().expect("utf8"),
        missing.to_str().expect("utf8"),
    ]);
    assert!(err.contains("missing.txt"), "{err}");
    let out = w.ok(&["jobs", "--json"]);
    let jobs: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(jobs.as_array().map(Vec::len), Some(0), "{jobs}");
    let empty = w.tmp.path().join("empty");
    std::fs::create_dir_all(&empty).expect("dir");
    let err = w.err(&["submit", empty.to_str().expect("utf8")]);
    assert!(err.contains("holds no books"), "{err}");
    // An unmigrated database is named, with the fix.
    let bare = format!("narrator_bare_{}", Uuid::new_v4().simple());
    let bare_url = narrator_test_support::database_url(&bare);
    w.rt.block_on(async {
        sqlx::query(&format!("CREATE DATABASE {bare}"))
            .execute(&w.pool)
            .await
            .expect("create");
    });
    let err = w.err(&["jobs", "--database-url", &bare_url]);
    w.rt.block_on(async {
        let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS {bare} WITH (FORCE)"))
            .execute(&w.pool)
            .await;
    });
    assert!(err.contains("run `narrator migrate`"), "{err}");
    // Secrets in the environment are not echoed by --help or errors.
    for sub in ["worker", "submit", "status"] {
        let out = w
            .cmd()
            .args([sub, "--help"])
            .env(
                "NARRATOR_AMQP_URL",
                "amqp://user:SuperSecret1@127.0.0.1:1/%2f",
            )
            .env(
                "NARRATOR_DATABASE_URL",
                "postgres://u:SuperSecret2@127.0.0.1:1/x",
            )
            .output()
            .expect("help");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success());
        assert!(!text.contains("SuperSecret"), "{text}");
    }
    let out = w
        .cmd()
        .args(["jobs"])
        .env(
            "NARRATOR_DATABASE_URL",
            "postgres://u:SuperSecret3@127.0.0.1:1/x",
        )
        .output()
        .expect("jobs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        !err.contains("SuperSecret3") && err.contains("***"),
        "{err}"
    );
}

/// (segments recorded in a pack, distinct packs) of a job.
fn packs(w: &World, job: Uuid) -> (i64, i64) {
    w.rt.block_on(async {
        sqlx::query_as(
            "SELECT count(pack_key), count(DISTINCT pack_key) FROM segments WHERE job_id = $1",
        )
        .bind(job)
        .fetch_one(&w.pool)
        .await
        .expect("packs")
    })
}

#[test]
fn segments_finished_together_are_stored_in_packs_and_assemble_exactly() {
    let mut w = World::new();
    let book = w.book("packs.md", &book_text(2, 60, None));
    let worker = w.worker("packer", &["--engine", "null"], &[]);
    let job = w.submit(&book, &["--format", "wav"]);
    // `status --wait` returns once the job has ended, with its status.
    let out = w.ok(&["status", &job.to_string(), "--wait", "--json"]);
    let st: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(st["state"], "done", "{st}");
    let (packed, pack_count) = packs(&w, job);
    assert!(
        packed >= 2 && pack_count < packed,
        "{packed} of 120 segments in {pack_count} packs: a fast worker stores groups"
    );
    // The book holds every segment's samples (the assembler checks each count).
    let manifest = w.manifest(job);
    assert_eq!(indices(&manifest), (0..120).collect::<Vec<_>>());
    let book_key = output_key(&st, "book");
    let (rate, samples) = narrator_audio::decode_wav_bytes(&w.s3_get(&book_key)).expect("wav");
    let seconds = samples.len() as f64 / f64::from(rate);
    let want = manifest["book"]["seconds"].as_f64().expect("seconds");
    assert!((seconds - want).abs() < 0.01, "{seconds} vs {want}");
    assert!(w.stop(worker, 15).success());

    // --pack-max 1: every segment in an object of its own (a pack of one, under a key
    // no other copy of it can overwrite).
    let single = w.worker("single", &["--engine", "null", "--pack-max", "1"], &[]);
    let book = w.book("single.md", &book_text(1, 30, None));
    let job = w.submit(&book, &["--format", "wav"]);
    w.ok(&["status", &job.to_string(), "--wait"]);
    assert_eq!(packs(&w, job), (30, 30));
    assert_eq!(indices(&w.manifest(job)), (0..30).collect::<Vec<_>>());
    assert!(w.stop(single, 15).success());
    let out = w
        .cmd()
        .args(["worker", "--pack-max", "0"])
        .output()
        .expect("spawn narrator");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("--pack-max"), "{err}");
}

#[test]
fn a_folder_of_books_is_one_command_and_every_book_becomes_a_done_job() {
    let mut w = World::new();
    let dir = w.tmp.path().join("shelf");
    std::fs::create_dir_all(dir.join("more")).expect("dirs");
    std::fs::write(dir.join("a.md"), book_text(1, 3, None)).expect("a");
    std::fs::write(
        dir.join("b.txt"),
        "CHAPTER I. One\n\nA first line. A second line.\n",
    )
    .expect("b");
    std::fs::write(dir.join("more/c.md"), book_text(2, 2, None)).expect("c");
    std::fs::write(dir.join("notes.json"), "{}").expect("not a book");
    w.worker("shelf", &["--engine", "null"], &[]);
    let out = w.ok(&[
        "submit",
        dir.to_str().expect("utf8"),
        "--json",
        "--priority",
        "3",
    ]);
    let jobs: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
        .collect();
    assert_eq!(jobs.len(), 3, "{jobs:?}");
    for j in &jobs {
        let id: Uuid = j["job_id"].as_str().expect("id").parse().expect("uuid");
        w.wait_state(id, JobState::Done, Duration::from_secs(60));
        assert_eq!(w.status(id)["priority"], 3);
    }
    let out = w.ok(&["jobs"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(text.matches(" done ").count(), 3, "{text}");
    let out = w.ok(&["workers", "--json"]);
    let workers: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let me = workers
        .as_array()
        .expect("list")
        .iter()
        .find(|x| x["id"] == "shelf")
        .expect("the worker is listed");
    assert_eq!(me["plan"][0]["engine"], "null", "{me}");
}

#[test]
fn a_transient_failure_is_retried_through_the_delay_queue_and_succeeds() {
    let mut w = World::new();
    let book = w.book(
        "flaky.md",
        &book_text(1, 6, Some((3, "The word Plugh works the second time."))),
    );
    w.worker(
        "flaky",
        // One segment per batch: a failed batch of several is re-run one by one at once,
        // which would hide the retry tier this test is about.
        &["--engine", "null", "--max-batch", "1"],
        &[
            ("NARRATOR_TEST_FAIL_TEXT", "Plugh"),
            ("NARRATOR_TEST_FAIL_ONCE", "1"),
        ],
    );
    let job = w.submit(&book, &["--format", "wav"]);
    // Attempt 1 fails transiently; the 5 s retry tier brings it back as attempt 2.
    w.wait_state(job, JobState::Done, Duration::from_secs(60));
    let attempts: Vec<(i32, i32)> = w.rt.block_on(async {
        sqlx::query_as("SELECT idx, attempts FROM segments WHERE job_id = $1 ORDER BY idx")
            .bind(job)
            .fetch_all(&w.pool)
            .await
            .expect("rows")
    });
    for (idx, n) in attempts {
        assert_eq!(n, if idx == 2 { 2 } else { 1 }, "segment {idx}");
    }
    assert_eq!(w.status(job)["segments_failed"], 0);
    assert!(
        w.worker_log("flaky").contains("segment failed"),
        "{}",
        w.worker_log("flaky")
    );
}

/// `rabbitmqctl`'s view of every channel with a consumer: (prefetch, unacknowledged).
fn worker_plan(w: &World, id: &str) -> serde_json::Value {
    let out = w.ok(&["workers", "--json"]);
    let workers: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    workers
        .as_array()
        .expect("list")
        .iter()
        .find(|x| x["id"] == id)
        .unwrap_or_else(|| panic!("worker {id} is listed: {workers}"))["plan"][0]
        .clone()
}

/// Two workers with different budgets on one queue (engine runs of 100 ms whatever their
/// size, like a GPU below its knee): each holds at most its plan's prefetch (two batches
/// plus one), and the one with the 4× budget does several times the work.
#[test]
fn two_workers_with_different_plans_pull_in_proportion_and_hold_only_their_prefetch() {
    let mut w = World::new();
    let pace = [("NARRATOR_TEST_RUN_MS", "100")];
    w.worker("small", &["--engine", "null", "--max-batch", "2"], &pace);
    w.worker("large", &["--engine", "null", "--max-batch", "8"], &pace);
    let (small, large) = (worker_plan(&w, "small"), worker_plan(&w, "large"));
    assert_eq!(small["prefetch"], 5, "2 batches of 2 + 1: {small}");
    assert_eq!(large["prefetch"], 17, "2 batches of 8 + 1: {large}");
    assert_eq!(large["max_batch_requests"], 8, "{large}");
    let job = w.submit(
        &w.book("fleet.md", &book_text(8, 45, None)),
        &["--format", "wav"],
    );
    let mut samples = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    while w.state(job) != JobState::Done {
        assert!(Instant::now() < deadline, "job not done: {}", w.status(job));
        samples.extend(w.consumer_holdings());
    }
    assert!(samples.len() >= 2, "{samples:?}");
    for &(prefetch, unacked) in &samples {
        assert!(
            unacked <= prefetch,
            "a consumer holds {unacked} > its prefetch {prefetch}"
        );
        // 5 and 17: the two workers' segment consumers; 1: each of their intake's
        // consumers of producers' requests (`--intake-prefetch` of them,
        // docs/PRODUCERS.md).
        assert!(
            [5, 17, 1].contains(&prefetch),
            "only the two workers consume: {samples:?}"
        );
    }
    assert!(
        samples.iter().any(|&(p, u)| p == 17 && u > 5),
        "the large worker held more than the small one's prefetch at some point: {samples:?}"
    );
    let per_worker: Vec<(String, i64)> = w.rt.block_on(async {
        sqlx::query_as(
            "SELECT worker, count(*) FROM segments WHERE job_id = $1 GROUP BY worker ORDER BY worker",
        )
        .bind(job)
        .fetch_all(&w.pool)
        .await
        .expect("per worker")
    });
    let count = |id: &str| {
        per_worker
            .iter()
            .find(|(w, _)| w == id)
            .map_or(0, |(_, n)| *n)
    };
    let (s, l) = (count("small"), count("large"));
    eprintln!(
        "segments per worker: {per_worker:?}; {} holdings sampled",
        samples.len()
    );
    assert!(s > 0, "both pulled work: {per_worker:?}");
    // Engine runs of 100 ms each: the heartbeat reports the busy time and the fraction.
    std::thread::sleep(Duration::from_millis(1500));
    let after = worker_plan(&w, "large");
    let busy = after["busy_seconds"].as_f64().unwrap_or(0.0);
    let runs = after["engine_runs"].as_f64().unwrap_or(0.0);
    assert!(runs >= 1.0 && busy >= 0.09 * runs, "{after}");
    let fraction = after["device_busy_fraction"]
        .as_f64()
        .expect("a fraction after two beats");
    assert!((0.0..=1.0).contains(&fraction), "{after}");
    assert!(
        l as f64 >= 2.0 * s as f64,
        "the 4x budget did at least twice the segments: {per_worker:?}"
    );
}

/// A "GPU" with room for 150 padded tokens per run and a plan of 8 items: out-of-memory
/// failures halve the budget, then the worker falls back to CPU, the job finishes, and
/// the workers table records the events and the fallback.
#[test]
fn out_of_memory_is_recorded_and_the_worker_falls_back_to_cpu() {
    let mut w = World::new();
    w.worker(
        "oom",
        &["--engine", "null", "--max-batch", "8"],
        &[("NARRATOR_TEST_GPU_MEMORY_TOKENS", "150")],
    );
    let before = worker_plan(&w, "oom");
    assert_eq!(before["device"], "cuda:0", "{before}");
    let job = w.submit(
        &w.book("oom.md", &book_text(2, 12, None)),
        &["--format", "wav"],
    );
    w.wait_state(job, JobState::Done, Duration::from_secs(60));
    let deadline = Instant::now() + Duration::from_secs(10);
    let plan = loop {
        let p = worker_plan(&w, "oom");
        if p["fallback"].is_string() || Instant::now() > deadline {
            break p;
        }
        std::thread::sleep(Duration::from_millis(300));
    };
    assert!(plan["oom_events"].as_u64().unwrap_or(0) >= 3, "{plan}");
    assert!(
        plan["last_oom"]
            .as_str()
            .is_some_and(|s| s.contains("padded tokens")),
        "{plan}"
    );
    assert!(
        plan["fallback"]
            .as_str()
            .is_some_and(|s| s.contains("fell back to cpu")),
        "{plan}"
    );
    assert_eq!(plan["device"], "cpu", "{plan}");
    assert_eq!(plan["max_batch_requests"], 1, "{plan}");
    assert_eq!(
        w.done_count(job) as usize,
        w.status(job)["segments_total"].as_u64().unwrap_or(0) as usize
    );
    assert!(w.worker_log("oom").contains("fell back to cpu"));
}

/// Distributed M4B: the book's front matter and cover travel with the job (jobs table),
/// a worker assembles one M4B whose chapters, tags and cover ffprobe reads back, and no
/// chapter outputs are listed.
#[test]
fn an_m4b_with_front_matter_cover_and_lexicons_is_assembled_by_a_worker() {
    let mut w = World::new();
    std::fs::write(w.tmp.path().join("cover.png"), media::PNG).expect("cover");
    let book = w.book(
        "ledger.md",
        &format!(
            "---\ntitle: The Keeper's Ledger\nauthor: Mara Quill\nlanguage: en-GB\ndate: 1999\npublisher: Tide Press\ncover: cover.png\n---\n\n{}",
            book_text(3, 3, None)
        ),
    );
    // The book's own lexicon (beside it) and one given by flag: both go into the
    // segments' text, and the job records them.
    std::fs::write(w.tmp.path().join("ledger.lexicon"), "sentence = sentinel\n").expect("lexicon");
    let extra = w.tmp.path().join("more.lexicon");
    std::fs::write(&extra, "/\\bline (\\d)/ = row $1\n").expect("lexicon");
    w.worker("m4b", &["--engine", "null"], &[]);
    let job = w.submit(
        &book,
        &[
            "--format",
            "m4b",
            "--lexicon",
            extra.to_str().expect("utf8"),
        ],
    );
    let recorded: Option<String> =
        w.rt.block_on(
            sqlx::query_scalar("SELECT lexicon FROM jobs WHERE id = $1")
                .bind(job)
                .fetch_one(&w.pool),
        )
        .expect("lexicon column");
    assert_eq!(
        recorded.as_deref(),
        Some("sentence = sentinel\n/\\bline (\\d)/ = row $1\n")
    );
    let texts: Vec<String> =
        w.rt.block_on(
            sqlx::query_scalar("SELECT text FROM segments WHERE job_id = $1 ORDER BY idx")
                .bind(job)
                .fetch_all(&w.pool),
        )
        .expect("segments");
    assert!(
        texts[0] == "sentinel number 1 of chapter 1 is here, row 0.",
        "{texts:?}"
    );
    assert!(
        texts
            .iter()
            .all(|t| !t.contains("Sentence") && !t.contains("line"))
    );
    w.wait_state(job, JobState::Done, Duration::from_secs(60));
    let status = w.status(job);
    let kinds: Vec<&str> = status["outputs"]
        .as_array()
        .expect("outputs")
        .iter()
        .filter_map(|o| o["kind"].as_str())
        .collect();
    assert_eq!(kinds, ["book", "manifest"], "{status}");
    let manifest = w.manifest(job);
    assert_eq!(manifest["book"]["author"], "Mara Quill");
    assert_eq!(manifest["book"]["publisher"], "Tide Press");
    let m4b = w.tmp.path().join("book.m4b");
    std::fs::write(&m4b, w.s3_get(&output_key(&status, "book"))).expect("download");
    let tags = media::check_m4b(&manifest, &m4b);
    assert_eq!(tags["title"], "The Keeper's Ledger");
    assert_eq!(tags["artist"], "Mara Quill");
    assert_eq!(tags["date"], "1999");
    assert_eq!(manifest["chapters"].as_array().map(Vec::len), Some(3));
}

/// Workers say which voices they serve (their status rows); `submit` warns when no
/// worker serves the job's voice, and says which voices are served.
#[test]
fn submit_warns_when_no_worker_serves_the_voice() {
    let mut w = World::new();
    let book = w.book("alone.md", &book_text(1, 2, None));
    let path = book.to_str().expect("utf8");
    let out = w.ok(&["submit", path, "--json"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!(
            "no worker seen in the last 60 s serves voice {VOICE}"
        )) && err.contains("voices served now: none"),
        "{err}"
    );
    let line: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(line["voice_served"], false);
    w.worker("served", &["--engine", "null"], &[]);
    let out = w.ok(&["submit", path, "--json"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("serves voice"), "{err}");
    let line: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(line["voice_served"], true);
    let workers: serde_json::Value =
        serde_json::from_slice(&w.ok(&["workers", "--json"]).stdout).expect("json");
    assert_eq!(workers[0]["plan"][0]["voice"], VOICE, "{workers}");
}

#[test]
fn one_worker_serves_a_piper_and_a_kokoro_voice_each_at_its_own_rate() {
    if !root().join(".deps/voices/kokoro/model.onnx").is_file() {
        panic!("Kokoro missing: run `bash ops/setup.sh --kokoro` first");
    }
    let mut w = World::new();
    let piper = w.book("piper.md", &book_text(1, 2, None));
    let kokoro = w.book("kokoro.md", &book_text(1, 2, None));
    // One worker, both families: each voice has its lane and its own plan (the defaults:
    // calibrating Kokoro on this CPU takes over a minute, and plans are tested elsewhere).
    w.worker(
        "both",
        &[
            "--voices",
            &format!("{VOICE},af_heart"),
            "--calibrate",
            "cached",
        ],
        &[],
    );
    let a = w.submit(&piper, &["--format", "wav"]);
    let b = w.submit(&kokoro, &["--format", "wav", "--voice", "af_heart"]);
    for (job, voice, rate) in [(a, VOICE, 22_050), (b, "af_heart", 24_000)] {
        w.wait_state(job, JobState::Done, Duration::from_secs(240));
        let st = w.status(job);
        let family = if rate == 24_000 { "kokoro" } else { "piper" };
        assert_eq!(st["family"], family, "{st}");
        let manifest = w.manifest(job);
        assert_eq!(manifest["voice"], voice, "{manifest}");
        let (r, samples) =
            narrator_audio::decode_wav_bytes(&w.s3_get(&output_key(&st, "book"))).expect("wav");
        assert_eq!(r, rate, "{voice}");
        let seconds = samples.len() as f64 / f64::from(r);
        let want = manifest["book"]["seconds"].as_f64().expect("seconds");
        assert!(
            (seconds - want).abs() < 0.01,
            "{voice}: {seconds} vs {want}"
        );
        assert!(seconds > 2.0, "{voice}: {seconds} s for two sentences");
    }
}

#[test]
fn each_job_runs_at_its_own_submitted_speed_on_a_worker_that_batches_them_together() {
    let mut w = World::new();
    let book = w.book("rate.md", &book_text(1, 6, None));
    // Both jobs queued before the worker starts: its batches hold segments of both.
    // Deterministic durations (noise 0), recorded with each job: its workers synthesize
    // with the scales the job names.
    let still = ["--noise-w", "0", "--noise-scale", "0"];
    let normal = w.submit(&book, &[&["--format", "wav"][..], &still].concat());
    let fast = w.submit(
        &book,
        &[&["--format", "wav", "--speed", "1.5"][..], &still].concat(),
    );
    assert_ne!(normal, fast, "the rate is part of the job's identity");
    w.worker("rates", &["--max-batch", "12"], &[]);
    let speech = |job| {
        w.wait_state(job, JobState::Done, Duration::from_secs(240));
        let m = w.manifest(job);
        m["segments"]
            .as_array()
            .expect("segments")
            .iter()
            .map(|s| s["seconds"].as_f64().expect("seconds"))
            .collect::<Vec<f64>>()
    };
    let (a, b) = (speech(normal), speech(fast));
    assert_eq!(a.len(), b.len());
    for (n, f) in a.iter().zip(&b) {
        // Durations scale with the length scale, less the trimmed edges: 1/1.5 = 0.67.
        let ratio = f / n;
        assert!(
            (0.55..0.8).contains(&ratio),
            "{f} s at 1.5x vs {n} s: {ratio}"
        );
    }
    let settings: serde_json::Value = w.rt.block_on(async {
        sqlx::query_scalar("SELECT settings::jsonb FROM jobs WHERE id = $1")
            .bind(fast)
            .fetch_one(&w.pool)
            .await
            .expect("settings")
    });
    assert_eq!(settings["speed"].as_f64(), Some(1.5), "{settings}");
}

/// Issue 30, item 4: a book made by workers is timed as if made by one `run`: every
/// sentence and every word at the same samples (noise 0 on both sides); asked for as a
/// read-along EPUB 3 with word overlays (from the words the workers recorded), the
/// assembler writes one that EPUBCheck accepts; from an EPUB input, one that keeps the
/// source's stylesheet, images and classes.
#[test]
fn a_book_made_by_workers_is_timed_like_the_same_book_made_by_run() {
    // Deterministic durations (noise 0) on both sides: the same text and voice must give
    // the same sentences at the same samples, whoever made them and however batched.
    let deterministic = ["--noise-w", "0", "--noise-scale", "0"];
    let mut w = World::new();
    let book = w.book("timed.md", &book_text(2, 4, None));
    let embedded = w.tmp.path().join("embedded");
    let o = std::process::Command::new(narrator_test_support::narrator_bin())
        .arg("run")
        .arg(&book)
        .arg("--out")
        .arg(&embedded)
        .args(["--format", "wav", "--subtitles", "srt"])
        .args(deterministic)
        .output()
        .expect("spawn narrator run");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let local: serde_json::Value =
        serde_json::from_slice(&std::fs::read(embedded.join("timings.json")).expect("timings"))
            .expect("json");

    // The job records its scales and the workers synthesize with them: their own noise
    // flags (the voice's defaults here) do not change its audio.
    w.worker("t1", &["--max-batch", "4"], &[]);
    w.worker("t2", &[], &[]);
    let mut submit = vec![
        "--format",
        "epub3",
        "--epub-overlay",
        "word",
        "--subtitles",
        "srt",
    ];
    submit.extend(deterministic);
    let job = w.submit(&book, &submit);
    w.wait_state(job, JobState::Done, Duration::from_secs(240));
    let st = w.status(job);
    let epub = w.tmp.path().join("distributed.epub");
    std::fs::write(&epub, w.s3_get(&output_key(&st, "epub"))).expect("write epub");
    narrator_test_support::media::epubcheck(&epub);
    let manifest: serde_json::Value =
        serde_json::from_slice(&w.s3_get(&output_key(&st, "manifest"))).expect("manifest");
    assert_eq!(manifest["book"]["epub_overlay"], "word", "{manifest}");
    let remote: serde_json::Value =
        serde_json::from_slice(&w.s3_get(&output_key(&st, "timings"))).expect("timings.json");
    assert_eq!(local["sample_rate"], remote["sample_rate"]);
    let (a, b) = (
        local["sentences"].as_array().expect("sentences"),
        remote["sentences"].as_array().expect("sentences"),
    );
    assert_eq!(a.len(), b.len());
    assert!(a.len() >= 8, "{local}");
    for (x, y) in a.iter().zip(b) {
        for k in ["index", "chapter", "text", "start_sample", "end_sample"] {
            assert_eq!(x[k], y[k], "{k}: embedded {x} vs distributed {y}");
        }
        // Every word too: recorded by each worker with its segment, read back by the
        // assembler from the database.
        let words = x["words"].as_array().expect("embedded words");
        assert!(!words.is_empty(), "{x}");
        assert_eq!(x["words"], y["words"], "words of sentence {}", x["index"]);
    }

    // From an EPUB, the assembler shows the book as it looked: its stylesheet, images
    // and classes, kept with the job at submission.
    let source = w.tmp.path().join("harbour.epub");
    narrator_test_support::media::harbour_epub(&source);
    let job = w.submit(&source, &["--format", "epub3"]);
    w.wait_state(job, JobState::Done, Duration::from_secs(240));
    let epub = w.tmp.path().join("harbour-read-along.epub");
    std::fs::write(&epub, w.s3_get(&output_key(&w.status(job), "epub"))).expect("write epub");
    narrator_test_support::media::epubcheck(&epub);
    narrator_test_support::media::assert_harbour_looks_kept(&epub);
}
