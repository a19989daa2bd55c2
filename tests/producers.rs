//! Producers on RabbitMQ (docs/PRODUCERS.md), with a client no one here wrote: Python's
//! pika runs `examples/producers/request.py` against a real worker, and Python's
//! `jsonschema` checks every request and reply against `docs/schema/`. Services as in
//! `cluster.rs` (`bash ops/test.sh` starts them).

use std::time::Duration;

use lapin::options::{BasicAckOptions, BasicGetOptions};
use narrator_broker::{INTAKE_DEAD_QUEUE, INTAKE_QUEUE};
use narrator_db::{JobState, Uuid};
use narrator_test_support::{World, assert_schema, book_text};

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
