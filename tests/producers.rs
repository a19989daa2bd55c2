//! Producers on RabbitMQ (docs/PRODUCERS.md), with a client no one here wrote: Python's
//! pika runs `examples/producers/request.py` against a real worker, and Python's
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
    assert_eq!(w.queue_ready(INTAKE_QUEUE), 0);
    // The events: job.queued once (the second delivery made no job), then job.done with
    // every output and a URL that serves it.
    let events = listener.events(Duration::from_secs(120));
    for e in &events {
        assert_schema("job-event.v1.json", e);
        assert_eq!(e["subject"], job.to_string(), "{e}");
        assert_eq!(e["data"]["idempotency_key"], "order-17", "{e}");
        assert_eq!(e["data"]["metadata"]["isbn"], "978-0-00-000000-0", "{e}");
    }
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
