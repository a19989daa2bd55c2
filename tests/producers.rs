//! Producers on RabbitMQ (docs/PRODUCERS.md), with clients no one here wrote: Python's
//! pika runs `examples/producers/request.py` and Node's amqplib
//! `examples/producers/node/request.mjs` against a real worker, and Python's
//! `jsonschema` checks every request, reply and event against `docs/schema/`. Services as in
//! `cluster.rs` (`bash ops/test.sh` starts them).

use std::time::Duration;

use lapin::options::{BasicAckOptions, BasicGetOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::FieldTable;
use narrator_broker::{EVENTS_EXCHANGE, INTAKE_DEAD_QUEUE, INTAKE_QUEUE};
use narrator_db::{JobState, Uuid};
use narrator_test_support::{PrivateRabbit, Services, World, assert_schema, book_text};

fn job_of(reply: &serde_json::Value) -> Uuid {
    reply["job_id"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no job id in {reply}"))
}

/// One message in, a reply out, the book done: the request (with producer metadata)
/// makes a job that a worker narrates; the same request again (its message_id) makes no
/// second job and is answered with the first; the reply follows the schema.
#[test]
fn a_book_requested_with_pika_is_answered_once_and_narrated() {
    let mut w = World::new();
    let text = book_text(2, 2, None);
    let book = w.book("requested.md", &text);
    assert_schema(
        "job-request.v1.json",
        &serde_json::json!({"version": 1, "text": text, "format": "wav",
            "metadata": {"isbn": "978-0-00-000000-0"}}),
    );
    w.worker("a", &["--engine", "null"], &[]);
    let listener = w.listen_events("any");
    let args = [
        "--message-id",
        "order-17",
        "--set",
        "format=\"wav\"",
        "--set",
        "metadata={\"isbn\": \"978-0-00-000000-0\"}",
    ];
    let (code, reply) = w.request(&book, &args);
    assert_eq!(code, 0, "{reply}");
    assert_schema("job-reply.v1.json", &reply);
    assert_eq!(reply["duplicate"], false, "{reply}");
    assert_eq!(reply["idempotency_key"], "order-17", "{reply}");
    assert_eq!(reply["segments"], 4, "{reply}");
    let job = job_of(&reply);
    // The same request again (a producer that lost its confirm publishes it again).
    let (code, again) = w.request(&book, &args);
    assert_eq!(code, 0, "{again}");
    assert_schema("job-reply.v1.json", &again);
    assert_eq!(job_of(&again), job, "one job per request");
    assert_eq!(again["duplicate"], true, "{again}");
    w.wait_state(job, JobState::Done, Duration::from_secs(120));
    let jobs: i64 =
        w.rt.block_on(sqlx::query_scalar("SELECT count(*) FROM jobs").fetch_one(&w.pool))
            .expect("count");
    assert_eq!(jobs, 1, "the request made one job");
    let (key, metadata): (Option<String>, Option<serde_json::Value>) =
        w.rt.block_on(
            sqlx::query_as("SELECT request_key, request_metadata FROM jobs WHERE id = $1")
                .bind(job)
                .fetch_one(&w.pool),
        )
        .expect("row");
    assert_eq!(key.as_deref(), Some("order-17"));
    assert_eq!(
        metadata,
        Some(serde_json::json!({"isbn": "978-0-00-000000-0"}))
    );
    let st = w.status(job);
    assert_eq!(st["segments_done"], 4, "{st}");
    assert_eq!(st["format"], "wav", "{st}");
    assert_eq!(st["request_key"], "order-17", "{st}");
    assert_eq!(st["request_metadata"]["isbn"], "978-0-00-000000-0", "{st}");
    let out = w.ok(&["jobs", "--json"]);
    let listed: serde_json::Value = serde_json::from_slice(&out.stdout).expect("jobs --json");
    assert_eq!(listed[0]["request_key"], "order-17", "{listed}");
    assert_eq!(listed[0]["request_metadata"]["isbn"], "978-0-00-000000-0");
    let out = w.ok(&["jobs"]);
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains("[request order-17]"), "{table}");
    assert_eq!(w.queue_ready(INTAKE_QUEUE), 0);
    // The events: job.queued once (the second delivery made no job), then job.done with
    // every output and a URL that serves it.
    let events = listener.events(Duration::from_secs(120));
    announced_and_served(events, job, "order-17");
}

/// A worker killed between recording a request's job and acknowledging it: the request
/// goes back to the queue, the next worker finds the job its key made and answers with
/// it (`duplicate: true`), and the book is narrated once.
#[test]
fn a_worker_killed_mid_intake_leaves_one_job() {
    let mut w = World::new();
    let book = w.book("once.md", &book_text(1, 3, None));
    let doomed = w.worker(
        "doomed",
        &["--engine", "null"],
        &[("NARRATOR_TEST_INTAKE_ABORT", "1")],
    );
    // The request outlives the worker: the reply comes from the next one.
    let python = narrator_test_support::clients_python();
    let producer = std::process::Command::new(python)
        .arg(narrator_test_support::root().join("examples/producers/request.py"))
        .arg(&w.amqp_url)
        .arg(&book)
        .args(["--message-id", "order-killed", "--set", "format=\"wav\""])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("request.py");
    let status = w.wait_exit(doomed, Duration::from_secs(60));
    assert!(!status.success(), "the worker aborted after recording");
    w.worker("next", &["--engine", "null"], &[]);
    let out = producer.wait_with_output().expect("request.py");
    let reply: serde_json::Value =
        serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null);
    assert!(out.status.success(), "{reply} {}", w.logs());
    assert_schema("job-reply.v1.json", &reply);
    assert_eq!(
        reply["duplicate"], true,
        "the job was recorded before: {reply}"
    );
    let job = job_of(&reply);
    w.wait_state(job, JobState::Done, Duration::from_secs(120));
    let jobs: i64 =
        w.rt.block_on(sqlx::query_scalar("SELECT count(*) FROM jobs").fetch_one(&w.pool))
            .expect("count");
    assert_eq!(jobs, 1, "one job for the request");
}

/// Each bad request gets an error reply that says what was wrong, goes to the intake's
/// dead letters with its reason in a header, and never stops the worker: the good
/// request after them is served at once.
#[test]
fn bad_requests_are_answered_dead_lettered_and_the_next_one_served() {
    let mut w = World::new();
    let book = w.book("fine.md", &book_text(1, 2, None));
    let worker = w.worker("a", &["--engine", "null"], &[]);
    let bad: [(&[&str], &str, &str); 5] = [
        (&["--raw", "this is not JSON"], "not_json", "not JSON"),
        (
            &["--set", "source=\"s3://books/x.md\""],
            "invalid_request",
            "both text and source",
        ),
        (
            &["--set", "voice=\"xx_XX-nobody-low\""],
            "unknown_voice",
            "xx_XX-nobody-low",
        ),
        (&["--set", "speed=9"], "invalid_request", "speed 9"),
        (&["--set", "format=\"flac\""], "invalid_request", "flac"),
    ];
    for (args, code, says) in bad {
        let (exit, reply) = w.request(&book, args);
        assert_eq!(exit, 1, "{args:?}: {reply}");
        assert_schema("job-reply.v1.json", &reply);
        assert_eq!(reply["error"]["code"], code, "{args:?}: {reply}");
        let message = reply["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(says), "{args:?}: {message}");
        assert!(!message.contains('\n'), "one line: {message}");
    }
    assert_eq!(w.queue_ready(INTAKE_DEAD_QUEUE), 5, "{}", w.logs());
    // The reasons travel with the dead letters.
    let reasons = w.rt.block_on(async {
        let conn = narrator_broker::connect(&w.amqp_url).await.expect("amqp");
        let ch = conn.create_channel().await.expect("channel");
        let mut reasons = Vec::new();
        while let Some(m) = ch
            .basic_get(INTAKE_DEAD_QUEUE.into(), BasicGetOptions::default())
            .await
            .expect("get")
        {
            let headers = m.properties.headers().clone().unwrap_or_default();
            let reason = headers
                .inner()
                .get(narrator_broker::INTAKE_REASON_HEADER)
                .and_then(|v| match v {
                    lapin::types::AMQPValue::LongString(s) => {
                        Some(String::from_utf8_lossy(s.as_bytes()).into_owned())
                    }
                    _ => None,
                })
                .unwrap_or_default();
            reasons.push(reason);
            m.ack(BasicAckOptions::default()).await.expect("ack");
        }
        reasons
    });
    assert_eq!(reasons.len(), 5);
    assert!(reasons[0].contains("not JSON"), "{reasons:?}");
    // The worker never went down, and the next request is served.
    assert!(
        w.workers[worker].try_wait().expect("wait").is_none(),
        "the worker exited: {}",
        w.logs()
    );
    let (code, reply) = w.request(&book, &[]);
    assert_eq!(code, 0, "{reply}");
    w.wait_state(job_of(&reply), JobState::Done, Duration::from_secs(120));
}

/// The events' outbox: a change of state made while the broker is away (a cancel) waits
/// in the outbox, and its event is published once the broker is back; the event made
/// before the outage is not published twice.
#[test]
fn an_event_made_while_the_broker_is_away_is_published_when_it_is_back() {
    let rabbit = PrivateRabbit::start(5689);
    let mut w = World::on(Services {
        rabbit_node: Some(rabbit.node.clone()),
        amqp_port: rabbit.port,
        ..Services::shared()
    });
    // A durable queue of the test's, bound before anything happens: it outlives the
    // restart (an exclusive one would go with the connection).
    w.rt.block_on(async {
        let conn = narrator_broker::connect(&w.amqp_url).await.expect("amqp");
        let ch = conn.create_channel().await.expect("channel");
        let durable = QueueDeclareOptions {
            durable: true,
            ..QueueDeclareOptions::default()
        };
        ch.queue_declare("test.events".into(), durable, FieldTable::default())
            .await
            .expect("declare");
        ch.queue_bind(
            "test.events".into(),
            EVENTS_EXCHANGE.into(),
            "job.#".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect("bind");
        let _ = conn.close(200, "ok".into()).await;
    });
    w.worker("e1", &["--engine", "null", "--broker-timeout", "120"], &[]);
    // A book of a voice no worker serves: it stays queued.
    let book = w.book("waits.md", &book_text(1, 2, None));
    let job = w.submit(&book, &["--voice", "af_heart", "--format", "wav"]);
    wait_for(|| w.queue_ready("test.events") == 1, "job.queued published");
    rabbit.stop_app();
    w.ok(&["cancel", &job.to_string()]);
    let waiting = || -> i64 {
        w.rt.block_on(
            sqlx::query_scalar(
                "SELECT count(*) FROM job_events WHERE job_id = $1 AND kind = 'cancelled' \
                 AND published_at IS NULL",
            )
            .bind(job)
            .fetch_one(&w.pool),
        )
        .expect("count")
    };
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(waiting(), 1, "the cancel's event waits in the outbox");
    rabbit.start_app();
    wait_for(
        || waiting() == 0,
        "job.cancelled published after the restart",
    );
    let events: Vec<serde_json::Value> = w.rt.block_on(async {
        let conn = narrator_broker::connect(&w.amqp_url).await.expect("amqp");
        let ch = conn.create_channel().await.expect("channel");
        let mut events = Vec::new();
        while let Some(m) = ch
            .basic_get("test.events".into(), BasicGetOptions::default())
            .await
            .expect("get")
        {
            events.push(serde_json::from_slice(&m.data).expect("json"));
            m.ack(BasicAckOptions::default()).await.expect("ack");
        }
        events
    });
    for e in &events {
        assert_schema("job-event.v1.json", e);
    }
    let types: Vec<&str> = events.iter().filter_map(|e| e["type"].as_str()).collect();
    assert_eq!(
        types,
        ["narrator.job.queued", "narrator.job.cancelled"],
        "{events:?}"
    );
    assert_eq!(events[1]["data"]["state"], "cancelled");
}

/// A book too large for a message, named by `source`: the worker reads the EPUB from the
/// bucket (its chapters and title as `submit` reads them) and narrates it; a source that
/// is missing, or not a book, is refused with `source_unreadable` and dead-lettered.
#[test]
fn a_book_named_by_its_s3_source_is_read_from_the_bucket() {
    let mut w = World::new();
    let epub = w.tmp.path().join("harbour.epub");
    narrator_test_support::media::harbour_epub(&epub);
    let store = w.store();
    let key = format!("incoming/{}/harbour.epub", Uuid::new_v4());
    let bytes = std::fs::read(&epub).expect("epub");
    w.rt.block_on(store.put_bytes(&key, bytes, "application/epub+zip"))
        .expect("upload the book");
    let source = format!("s3://{}/{key}", store.bucket());
    assert_schema(
        "job-request.v1.json",
        &serde_json::json!({"version": 1, "source": source}),
    );
    w.worker("a", &["--engine", "null"], &[]);
    let (code, reply) = w.request(
        std::path::Path::new(&source),
        &["--message-id", "by-source", "--set", "format=\"wav\""],
    );
    assert_eq!(code, 0, "{reply} {}", w.logs());
    assert_schema("job-reply.v1.json", &reply);
    let job = job_of(&reply);
    w.wait_state(job, JobState::Done, Duration::from_secs(120));
    let st = w.status(job);
    assert_eq!(st["title"], "Harbour Notes", "{st}");
    assert_eq!(st["source"], source, "{st}");
    assert!(
        st["segments_done"].as_u64().unwrap_or(0) >= 3,
        "both chapters: {st}"
    );
    let missing = format!("s3://{}/incoming/nobody.md", store.bucket());
    let pdf = format!("s3://{}/incoming/book.pdf", store.bucket());
    for (src, says) in [(&missing, "does not exist"), (&pdf, ".txt, .md or .epub")] {
        let (code, reply) = w.request(std::path::Path::new(src), &[]);
        assert_eq!(code, 1, "{src}: {reply}");
        assert_schema("job-reply.v1.json", &reply);
        assert_eq!(reply["error"]["code"], "source_unreadable", "{reply}");
        let message = reply["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(says), "{src}: {message}");
    }
    assert_eq!(w.queue_ready(INTAKE_DEAD_QUEUE), 2, "{}", w.logs());
}

/// `narrator submit --via-broker`: the CLI as a producer, with no database (a wrong
/// database URL, no voices folder): a Markdown book in the message, an EPUB through S3,
/// the same request key again answered with the first job, a flag a request cannot carry
/// refused with what to do.
#[test]
fn submit_via_broker_needs_only_the_broker_and_s3() {
    let mut w = World::new();
    w.worker("a", &["--engine", "null"], &[]);
    let book = w.book("brokered.md", &book_text(2, 2, None));
    let epub = w.tmp.path().join("harbour.epub");
    narrator_test_support::media::harbour_epub(&epub);
    let producer = |args: &[&str]| {
        let mut c = w.cmd();
        c.env(
            "NARRATOR_DATABASE_URL",
            "postgres://nobody@127.0.0.1:9/nowhere",
        )
        .env("NARRATOR_DATA_DIR", w.tmp.path().join("no-data"))
        .env("NARRATOR_VOICES_DIR", w.tmp.path().join("no-voices"))
        .args(["submit", "--via-broker", "--json", "--format", "wav"])
        .args(args);
        c.output().expect("narrator submit --via-broker")
    };
    let replies = |out: &std::process::Output| -> Vec<serde_json::Value> {
        assert!(
            out.status.success(),
            "{}\n{}",
            String::from_utf8_lossy(&out.stderr),
            w.logs()
        );
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
            .collect()
    };
    let book_arg = book.to_str().expect("utf8");
    let args = [
        book_arg,
        "--request-key",
        "cli-1",
        "--metadata",
        r#"{"order": 7}"#,
    ];
    let first = replies(&producer(&args));
    assert_eq!(first.len(), 1, "{first:?}");
    assert_eq!(first[0]["duplicate"], false, "{first:?}");
    assert_eq!(first[0]["segments"], 4, "{first:?}");
    let job = job_of(&first[0]);
    let again = replies(&producer(&args));
    assert_eq!(job_of(&again[0]), job, "one job per request key");
    assert_eq!(again[0]["duplicate"], true);
    let by_source = replies(&producer(&[epub.to_str().expect("utf8")]));
    let epub_job = job_of(&by_source[0]);
    for j in [job, epub_job] {
        w.wait_state(j, JobState::Done, Duration::from_secs(120));
    }
    let st = w.status(job);
    assert_eq!(st["request_key"], "cli-1", "{st}");
    assert_eq!(st["request_metadata"]["order"], 7, "{st}");
    let st = w.status(epub_job);
    assert_eq!(st["title"], "Harbour Notes", "{st}");
    assert!(
        st["source"]
            .as_str()
            .is_some_and(|s| s.starts_with("s3://") && s.ends_with("/harbour.epub")),
        "{st}"
    );
    let out = producer(&[book_arg, "--cover", book_arg]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--cover is not part of a request"), "{err}");
}

/// The events of a requested 4-segment WAV book (metadata `isbn`): each follows the
/// schema and names the job and request; `job.queued` then `job.done` (progress aside),
/// and `job.done`'s URL serves the book.
fn announced_and_served(events: Vec<serde_json::Value>, job: Uuid, key: &str) {
    for e in &events {
        assert_schema("job-event.v1.json", e);
        assert_eq!(e["subject"], job.to_string(), "{e}");
        assert_eq!(e["data"]["idempotency_key"], key, "{e}");
        assert_eq!(e["data"]["metadata"]["isbn"], "978-0-00-000000-0", "{e}");
    }
    let events = without_progress(events);
    let types: Vec<&str> = events.iter().filter_map(|e| e["type"].as_str()).collect();
    assert_eq!(
        types,
        ["narrator.job.queued", "narrator.job.done"],
        "{events:?}"
    );
    let done = &events[1]["data"];
    assert_eq!(done["state"], "done", "{done}");
    assert_eq!(done["segments_done"], 4, "{done}");
    let book_url = done["outputs"]
        .as_array()
        .and_then(|o| o.iter().find(|o| o["kind"] == "book"))
        .and_then(|o| o["url"].as_str())
        .unwrap_or_else(|| panic!("no book URL in {done}"));
    let wav = ureq::get(book_url)
        .call()
        .expect("GET the book's URL")
        .body_mut()
        .read_to_vec()
        .expect("body");
    let (rate, samples) = narrator_audio::decode_wav_bytes(&wav).expect("a WAV");
    assert!(
        rate > 0 && !samples.is_empty(),
        "{rate} Hz, {} samples",
        samples.len()
    );
}

/// The events of state changes: `job.progress` may come between them (a fast job can be
/// seen running), and is tested apart.
fn without_progress(events: Vec<serde_json::Value>) -> Vec<serde_json::Value> {
    events
        .into_iter()
        .filter(|e| e["type"] != "narrator.job.progress")
        .collect()
}

/// `job.progress` while a book is read: the finished segments climb, the audio so far
/// grows, and a job's progress events come at least 5 s apart.
#[test]
fn a_running_book_announces_its_progress_every_few_seconds() {
    let mut w = World::new();
    let book = w.book("long.md", &book_text(1, 30, None));
    w.worker(
        "a",
        &["--engine", "null", "--max-batch", "2"],
        &[("NARRATOR_TEST_RUN_MS", "500")],
    );
    let listener = w.listen_events("any");
    let (code, reply) = w.request(&book, &["--set", "format=\"wav\""]);
    assert_eq!(code, 0, "{reply}");
    let events = listener.events(Duration::from_secs(180));
    let progress: Vec<&serde_json::Value> = events
        .iter()
        .filter(|e| e["type"] == "narrator.job.progress")
        .collect();
    assert!(progress.len() >= 2, "{events:?}");
    for e in &progress {
        assert_schema("job-event.v1.json", e);
        assert_eq!(e["data"]["state"], "running", "{e}");
    }
    let done: Vec<u64> = progress
        .iter()
        .filter_map(|e| e["data"]["segments_done"].as_u64())
        .collect();
    assert!(done.windows(2).all(|p| p[0] < p[1]), "climbing: {done:?}");
    assert!(done.iter().all(|&n| n > 0 && n <= 30), "{done:?}");
    let audio: Vec<f64> = progress
        .iter()
        .filter_map(|e| e["data"]["audio_seconds"].as_f64())
        .collect();
    assert!(audio.windows(2).all(|p| p[0] < p[1]), "growing: {audio:?}");
    let times: Vec<chrono::DateTime<chrono::FixedOffset>> = progress
        .iter()
        .filter_map(|e| e["time"].as_str())
        .filter_map(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
        .collect();
    assert_eq!(times.len(), progress.len());
    for pair in times.windows(2) {
        let gap = (pair[1] - pair[0]).num_milliseconds();
        assert!(gap >= 4_900, "progress {gap} ms apart: {times:?}");
    }
    assert_eq!(
        events.last().map(|e| e["type"].clone()),
        Some(serde_json::json!("narrator.job.done"))
    );
}

/// The intake outlives a broker restart: the worker's consumer of `narrator.intake` is
/// registered again once the broker is back, and a request published then is answered
/// and its book narrated, without restarting the worker.
#[test]
fn the_intake_is_served_again_after_the_broker_restarts() {
    let rabbit = PrivateRabbit::start(5690);
    let mut w = World::on(Services {
        rabbit_node: Some(rabbit.node.clone()),
        amqp_port: rabbit.port,
        ..Services::shared()
    });
    let worker = w.worker("r1", &["--engine", "null", "--broker-timeout", "120"], &[]);
    let book = w.book("before.md", &book_text(1, 2, None));
    let (code, reply) = w.request(&book, &["--set", "format=\"wav\""]);
    assert_eq!(code, 0, "{reply}");
    w.wait_state(job_of(&reply), JobState::Done, Duration::from_secs(120));
    rabbit.stop_app();
    std::thread::sleep(Duration::from_secs(2));
    rabbit.start_app();
    let book = w.book("after.md", &book_text(1, 3, None));
    let (code, reply) = w.request(&book, &["--set", "format=\"wav\""]);
    assert_eq!(code, 0, "{reply} {}", w.logs());
    w.wait_state(job_of(&reply), JobState::Done, Duration::from_secs(120));
    assert!(
        w.workers[worker].try_wait().expect("wait").is_none(),
        "the worker exited: {}",
        w.logs()
    );
}

/// Polls `cond` every 200 ms for up to 120 s.
fn wait_for(cond: impl Fn() -> bool, what: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while !cond() {
        assert!(
            std::time::Instant::now() < deadline,
            "not within 120 s: {what}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The same with Node's amqplib (`examples/producers/node`): the request is answered, and
/// the listener's job.queued and job.done follow the schema; the book is downloaded from
/// job.done's URL.
#[test]
fn a_book_requested_with_amqplib_is_answered_and_announced() {
    let mut w = World::new();
    let book = w.book("requested.md", &book_text(2, 2, None));
    w.worker("a", &["--engine", "null"], &[]);
    let listener = w.listen_events_node("any");
    let (code, reply) = w.request_node(
        &book,
        &[
            "--message-id",
            "order-18",
            "--set",
            "format=\"wav\"",
            "--set",
            "metadata={\"isbn\": \"978-0-00-000000-0\"}",
        ],
    );
    assert_eq!(code, 0, "{reply}");
    assert_schema("job-reply.v1.json", &reply);
    assert_eq!(reply["duplicate"], false, "{reply}");
    assert_eq!(reply["idempotency_key"], "order-18", "{reply}");
    assert_eq!(reply["segments"], 4, "{reply}");
    let job = job_of(&reply);
    w.wait_state(job, JobState::Done, Duration::from_secs(120));
    let events = listener.events(Duration::from_secs(120));
    announced_and_served(events, job, "order-18");
}
