//! Against the real RabbitMQ (127.0.0.1:5672, or NARRATOR_AMQP_URL). Each test uses its
//! own voice, so its work queue is its own, and deletes it at the end. These tests fail,
//! never skip, when the broker is down.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lapin::Connection;
use lapin::options::{BasicAckOptions, BasicGetOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable};
use narrator_broker::{
    Consumer, DEAD_LETTER_QUEUE, DEAD_REASON_HEADER, Decision, Publisher, SegmentMessage,
    TopologyConfig, declare, declare_with, delete_voice_queues, work_queue,
};
use narrator_core::{PauseAfter, Segment, SegmentQueue};

fn amqp_url() -> String {
    std::env::var("NARRATOR_AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into())
}

async fn connect() -> Connection {
    match narrator_broker::connect(&amqp_url()).await {
        Ok(c) => c,
        Err(e) => panic!(
            "these tests need RabbitMQ at {}: {e}\nstart it with `rabbitmq-server -detached` (or set NARRATOR_AMQP_URL)",
            narrator_broker::redact(&amqp_url())
        ),
    }
}

fn unique(name: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("test-{name}-{}-{nanos}", std::process::id())
}

fn msg(job: &str, voice: &str, index: u32) -> SegmentMessage {
    SegmentMessage::new(
        job,
        voice,
        Segment {
            index,
            chapter: index / 4,
            text: format!("Sentence number {index}."),
            pause_after: PauseAfter::Sentence,
            speaker: 0,
            speed: None,
            timed: false,
        },
    )
}

/// A test's voice: declared, and its work queue deleted by `finish`.
struct Fixture {
    conn: Connection,
    voice: String,
    job: String,
    publisher: Publisher,
}

impl Fixture {
    async fn new(name: &str, config: TopologyConfig) -> Self {
        let conn = connect().await;
        let voice = unique(name);
        let ch = conn.create_channel().await.expect("channel");
        declare_with(&ch, &voice, config).await.expect("declare");
        // Declaring twice is harmless.
        declare_with(&ch, &voice, config)
            .await
            .expect("declare again");
        let publisher = Publisher::new(&conn).await.expect("publisher");
        Self {
            job: format!("job-{voice}"),
            conn,
            voice,
            publisher,
        }
    }

    async fn publish(&self, n: u32) {
        for i in 0..n {
            self.publisher
                .publish(&msg(&self.job, &self.voice, i))
                .await
                .expect("publish");
        }
    }

    async fn ready(&self) -> u32 {
        let ch = self.conn.create_channel().await.expect("channel");
        let q = ch
            .queue_declare(
                work_queue(&self.voice).into(),
                QueueDeclareOptions {
                    passive: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .expect("passive declare");
        let _ = ch.close(200, "done".into()).await;
        q.message_count()
    }

    async fn finish(self) {
        let ch = self.conn.create_channel().await.expect("channel");
        delete_voice_queues(&ch, &self.voice).await.expect("delete");
        let _ = self.conn.close(200, "done".into()).await;
    }
}

async fn next_within(
    c: &Consumer,
    wait: Duration,
) -> Option<narrator_core::Delivery<narrator_broker::Ticket>> {
    match tokio::time::timeout(wait, c.next()).await {
        Ok(r) => Some(r.expect("next").expect("consumer still open")),
        Err(_) => None,
    }
}

/// Looks in `narrator.dead` for a message of `job`; takes (acks) it and leaves the
/// others (closing the channel requeues them). Returns its headers.
async fn take_dead_letter(conn: &Connection, job: &str) -> Option<FieldTable> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while tokio::time::Instant::now() < deadline {
        let ch = conn.create_channel().await.expect("channel");
        let mut found = None;
        while let Some(m) = ch
            .basic_get(DEAD_LETTER_QUEUE.into(), BasicGetOptions { no_ack: false })
            .await
            .expect("basic.get")
        {
            if SegmentMessage::decode(&m.delivery.data).is_ok_and(|d| d.job_id == job) {
                m.delivery
                    .acker
                    .ack(BasicAckOptions::default())
                    .await
                    .expect("ack");
                found = Some(m.delivery.properties.headers().clone().unwrap_or_default());
                break;
            }
        }
        let _ = ch.close(200, "done".into()).await;
        if found.is_some() {
            return found;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    None
}

const WAIT: Duration = Duration::from_secs(5);

#[tokio::test]
async fn publishes_n_and_consumes_the_same_n() {
    let f = Fixture::new("roundtrip", TopologyConfig::default()).await;
    f.publish(6).await;
    let c = Consumer::start(&f.conn, &f.voice, 10)
        .await
        .expect("consumer");
    let mut got = Vec::new();
    for _ in 0..6 {
        let d = next_within(&c, WAIT).await.expect("a delivery");
        assert_eq!(d.job_id, f.job);
        assert_eq!(d.attempt, 1);
        assert_eq!(d.segment, msg(&f.job, &f.voice, d.segment.index).segment);
        got.push(d.segment.index);
        c.ack(d.ticket).await.expect("ack");
    }
    got.sort_unstable();
    assert_eq!(got, [0, 1, 2, 3, 4, 5]);
    assert!(next_within(&c, Duration::from_millis(300)).await.is_none());
    assert_eq!(f.ready().await, 0);
    f.finish().await;
}

#[tokio::test]
async fn deliveries_already_sent_are_handed_over_as_one_group() {
    let f = Fixture::new("groups", TopologyConfig::default()).await;
    f.publish(12).await;
    let c = Consumer::start(&f.conn, &f.voice, 20)
        .await
        .expect("consumer");
    // Let the broker push all twelve to the consumer.
    let first = tokio::time::timeout(WAIT, c.next_deliveries(1))
        .await
        .expect("a delivery")
        .expect("next");
    assert_eq!(first.len(), 1, "max 1 hands over one");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let group = tokio::time::timeout(WAIT, c.next_deliveries(8))
        .await
        .expect("deliveries")
        .expect("next");
    assert_eq!(group.len(), 8, "eight were waiting: a full group of 8");
    let rest = tokio::time::timeout(WAIT, c.next_deliveries(64))
        .await
        .expect("deliveries")
        .expect("next");
    assert_eq!(rest.len(), 3, "the three left, without waiting for more");
    let got: Vec<u32> = first
        .iter()
        .chain(&group)
        .chain(&rest)
        .map(|d| d.segment.index)
        .collect();
    // One queue, one consumer: each once, in order.
    assert_eq!(got, (0..12).collect::<Vec<_>>());
    for d in first.into_iter().chain(group).chain(rest) {
        c.ack(d.ticket).await.expect("ack");
    }
    // Nothing left: the next call waits (for the first delivery), it does not return empty.
    assert!(
        tokio::time::timeout(Duration::from_millis(300), c.next_deliveries(8))
            .await
            .is_err()
    );
    assert_eq!(f.ready().await, 0);
    f.finish().await;
}

#[tokio::test]
async fn an_unroutable_publish_is_an_error() {
    let conn = connect().await;
    let publisher = Publisher::new(&conn).await.expect("publisher");
    let voice = unique("nowhere"); // never declared: no queue
    let e = publisher
        .publish(&msg("j", &voice, 0))
        .await
        .expect_err("a message to a missing queue must not be silently dropped");
    assert_eq!(e.kind(), "broker_unroutable", "{e}");
    // The channel is still usable afterwards.
    let f = Fixture::new("after-unroutable", TopologyConfig::default()).await;
    publisher
        .publish(&msg("j", &f.voice, 0))
        .await
        .expect("publish");
    f.finish().await;
}

#[tokio::test]
async fn a_consumer_that_does_not_ack_holds_exactly_its_prefetch() {
    let f = Fixture::new("prefetch", TopologyConfig::default()).await;
    f.publish(10).await;
    let c = Consumer::start(&f.conn, &f.voice, 3)
        .await
        .expect("consumer");
    assert_eq!(c.prefetch_in_effect(), Some(3));
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(next_within(&c, WAIT).await.expect("within the prefetch"));
    }
    assert!(
        next_within(&c, Duration::from_millis(700)).await.is_none(),
        "a 4th delivery arrived with prefetch 3"
    );
    assert_eq!(f.ready().await, 7);
    // Acking one lets exactly one more in.
    let first = held.remove(0);
    c.ack(first.ticket).await.expect("ack");
    held.push(next_within(&c, WAIT).await.expect("one more after an ack"));
    assert!(next_within(&c, Duration::from_millis(500)).await.is_none());
    assert_eq!(f.ready().await, 6);
    for d in held {
        c.ack(d.ticket).await.expect("ack");
    }
    f.finish().await;
}

#[tokio::test]
async fn a_requeued_delivery_comes_back_as_attempt_two() {
    let f = Fixture::new("requeue", TopologyConfig::default()).await;
    f.publish(1).await;
    let c = Consumer::start(&f.conn, &f.voice, 1)
        .await
        .expect("consumer");
    let d = next_within(&c, WAIT).await.expect("first");
    assert_eq!(d.attempt, 1);
    c.requeue(d.ticket).await.expect("requeue");
    let d = next_within(&c, WAIT).await.expect("redelivered");
    assert_eq!((d.segment.index, d.attempt), (0, 2));
    c.ack(d.ticket).await.expect("ack");
    f.finish().await;
}

#[tokio::test]
async fn a_message_over_the_delivery_limit_ends_in_narrator_dead() {
    let f = Fixture::new("limit", TopologyConfig { delivery_limit: 2 }).await;
    f.publish(1).await;
    let c = Consumer::start(&f.conn, &f.voice, 1)
        .await
        .expect("consumer");
    let mut deliveries = 0;
    while let Some(d) = next_within(&c, Duration::from_secs(2)).await {
        deliveries += 1;
        assert_eq!(d.attempt, deliveries);
        assert!(deliveries <= 10, "the delivery limit is not enforced");
        c.requeue(d.ticket).await.expect("requeue");
    }
    assert_eq!(
        deliveries, 3,
        "limit 2: the first delivery and 2 redeliveries"
    );
    let headers = take_dead_letter(&f.conn, &f.job)
        .await
        .expect("the message is in narrator.dead");
    assert!(headers.contains_key("x-death"), "{headers:?}");
    f.finish().await;
}

#[tokio::test]
async fn settle_dead_letter_records_the_reason() {
    let f = Fixture::new("dead-reason", TopologyConfig::default()).await;
    f.publish(1).await;
    let c = Consumer::start(&f.conn, &f.voice, 1)
        .await
        .expect("consumer");
    let d = next_within(&c, WAIT).await.expect("delivery");
    let reason = "voice cannot speak this".to_string();
    c.settle(
        d.ticket,
        Decision::DeadLetter {
            reason: reason.clone(),
        },
    )
    .await
    .expect("settle");
    let headers = take_dead_letter(&f.conn, &f.job)
        .await
        .expect("dead letter");
    match headers.inner().get(DEAD_REASON_HEADER) {
        Some(AMQPValue::LongString(s)) => assert_eq!(s.to_string(), reason),
        other => panic!("no reason header: {other:?}"),
    }
    assert!(next_within(&c, Duration::from_millis(300)).await.is_none());
    assert_eq!(f.ready().await, 0);
    f.finish().await;
}

#[tokio::test]
async fn settle_retry_comes_back_through_the_tier_as_the_next_attempt() {
    let f = Fixture::new("retry", TopologyConfig::default()).await;
    f.publish(1).await;
    let c = Consumer::start(&f.conn, &f.voice, 1)
        .await
        .expect("consumer");
    let d = next_within(&c, WAIT).await.expect("delivery");
    let decision = narrator_broker::decide(narrator_broker::FailureKind::Transient, d.attempt);
    assert_eq!(
        decision,
        Decision::Retry {
            after: Duration::from_secs(5)
        }
    );
    c.settle(d.ticket, decision).await.expect("settle");
    assert!(
        next_within(&c, Duration::from_secs(3)).await.is_none(),
        "came back before its delay"
    );
    let d = next_within(&c, Duration::from_secs(10))
        .await
        .expect("back from narrator.retry.5s");
    assert_eq!((d.segment.index, d.attempt), (0, 2));
    c.ack(d.ticket).await.expect("ack");
    f.finish().await;
}

#[tokio::test]
async fn an_unreachable_broker_is_one_clear_error() {
    let e = narrator_broker::connect("amqp://guest:secret@127.0.0.1:1/%2f")
        .await
        .expect_err("nothing listens on port 1");
    let text = e.to_string();
    assert!(text.contains("rabbitmq-server -detached"), "{text}");
    assert!(!text.contains("secret"), "{text}");
}

#[tokio::test]
async fn declare_is_idempotent_and_the_default_queue_carries_a_delivery_limit() {
    let conn = connect().await;
    let voice = unique("declare");
    let ch = conn.create_channel().await.expect("channel");
    declare(&ch, &voice).await.expect("declare");
    declare(&ch, &voice).await.expect("declare again");
    // A different limit for the same queue is refused: the limit is really set.
    let other = conn.create_channel().await.expect("channel");
    assert!(
        declare_with(&other, &voice, TopologyConfig { delivery_limit: 7 })
            .await
            .is_err()
    );
    let ch = conn.create_channel().await.expect("channel");
    delete_voice_queues(&ch, &voice).await.expect("delete");
}

/// Closes the connection named `name` from the broker's side, as a network failure would.
fn force_close(name: &str) {
    let out = std::process::Command::new("rabbitmqctl")
        .args([
            "list_connections",
            "-q",
            "--no-table-headers",
            "pid",
            "client_properties",
        ])
        .output()
        .expect("rabbitmqctl (this test needs it on PATH, beside the server)");
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find(|l| l.contains(name))
        .unwrap_or_else(|| panic!("connection {name} not listed:\n{text}"));
    let pid = line.split_whitespace().next().expect("pid column");
    let status = std::process::Command::new("rabbitmqctl")
        .args(["close_connection", pid, "test: simulated failure"])
        .status()
        .expect("rabbitmqctl close_connection");
    assert!(status.success());
}

#[tokio::test]
async fn after_a_reconnect_the_consumer_still_holds_only_its_prefetch() {
    let name = unique("recover");
    let conn = match narrator_broker::connect_named(&amqp_url(), &name).await {
        Ok(c) => c,
        Err(e) => panic!("these tests need RabbitMQ: {e}"),
    };
    let f = Fixture::new("recover", TopologyConfig::default()).await;
    f.publish(10).await;
    let c = Consumer::start(&conn, &f.voice, 3).await.expect("consumer");
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(next_within(&c, WAIT).await.expect("within the prefetch"));
    }
    force_close(&name);
    // Tickets from before the reconnect are stale: settling them sends nothing, and the
    // broker has requeued their messages.
    tokio::time::sleep(Duration::from_millis(500)).await;
    for d in held.drain(..) {
        c.ack(d.ticket).await.expect("a stale ack is not an error");
    }
    for _ in 0..3 {
        held.push(
            next_within(&c, Duration::from_secs(20))
                .await
                .expect("deliveries resume after recovery"),
        );
    }
    // The same three came back, redelivered (the quorum queue counted the return).
    assert!(
        held.iter().all(|d| d.attempt == 2),
        "{:?}",
        held.iter().map(|d| d.attempt).collect::<Vec<_>>()
    );
    assert!(
        next_within(&c, Duration::from_millis(700)).await.is_none(),
        "more than the prefetch after a reconnect"
    );
    assert_eq!(c.prefetch_in_effect(), Some(3));
    assert_eq!(f.ready().await, 7);
    for d in held {
        c.ack(d.ticket).await.expect("ack");
    }
    let _ = conn.close(200, "done".into()).await;
    f.finish().await;
}
