//! Queue and exchange names, and their idempotent declaration.

use std::time::Duration;

use lapin::options::{
    ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{Channel, ExchangeKind};

use crate::{BrokerError, RETRY_TIER_HEADER};

/// Fanout exchange that dead-lettered messages go to.
pub const DEAD_LETTER_EXCHANGE: &str = "narrator.dlx";
/// The queue of dead letters.
pub const DEAD_LETTER_QUEUE: &str = "narrator.dead";
/// Headers exchange that routes a retry to its tier by [`RETRY_TIER_HEADER`].
pub const RETRY_EXCHANGE: &str = "narrator.retry";
/// The retry delays; each is one queue with one `x-message-ttl`.
pub const RETRY_TIERS: [Duration; 3] = [
    Duration::from_secs(5),
    Duration::from_secs(30),
    Duration::from_secs(300),
];
/// Deliveries a work queue allows a message before it dead-letters it.
pub const DEFAULT_DELIVERY_LIMIT: u32 = 5;

/// Settings of a voice's work queue. Changing them for an existing queue is refused by
/// the broker (PRECONDITION_FAILED): delete the queue first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TopologyConfig {
    /// `x-delivery-limit` of the work queue.
    pub delivery_limit: u32,
}

impl Default for TopologyConfig {
    fn default() -> Self {
        Self {
            delivery_limit: DEFAULT_DELIVERY_LIMIT,
        }
    }
}

/// Priority lanes per voice: 0 (normal) and 1 (high). A job's lane is [`lane_of`] its
/// priority; a worker consumes every lane and hands higher lanes to the device first.
pub const LANES: u8 = 2;

/// The lane of a job's priority: 1 (high) for a priority above 0, else 0.
pub fn lane_of(priority: i32) -> u8 {
    u8::from(priority > 0)
}

/// The work queue of a voice (its normal lane).
pub fn work_queue(voice: &str) -> String {
    format!("narrator.segments.{voice}")
}

/// The queue of a voice's `lane`: [`work_queue`] for lane 0, `….high` for lane 1.
pub fn lane_queue(voice: &str, lane: u8) -> String {
    match lane {
        0 => work_queue(voice),
        _ => format!("narrator.segments.{voice}.high"),
    }
}

/// The tier label of a delay (`5s`), rounded up to the next tier (the last beyond it).
pub(crate) fn tier_label(after: Duration) -> String {
    let tier = RETRY_TIERS
        .iter()
        .find(|t| **t >= after)
        .unwrap_or(&RETRY_TIERS[RETRY_TIERS.len() - 1]);
    format!("{}s", tier.as_secs())
}

/// The retry queue that a delay goes to, e.g. `narrator.retry.30s`.
pub fn retry_queue(after: Duration) -> String {
    format!("{RETRY_EXCHANGE}.{}", tier_label(after))
}

fn long(s: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(s))
}

fn durable() -> QueueDeclareOptions {
    QueueDeclareOptions {
        durable: true,
        ..QueueDeclareOptions::default()
    }
}

async fn exchange(channel: &Channel, name: &str, kind: ExchangeKind) -> Result<(), BrokerError> {
    let opts = ExchangeDeclareOptions {
        durable: true,
        ..ExchangeDeclareOptions::default()
    };
    channel
        .exchange_declare(name.into(), kind, opts, FieldTable::default())
        .await
        .map_err(|e| BrokerError::amqp(format!("exchange.declare {name}"), e))
}

async fn queue(channel: &Channel, name: &str, args: FieldTable) -> Result<(), BrokerError> {
    channel
        .queue_declare(name.into(), durable(), args)
        .await
        .map(drop)
        .map_err(|e| BrokerError::amqp(format!("queue.declare {name}"), e))
}

async fn bind(
    channel: &Channel,
    queue: &str,
    exchange: &str,
    args: FieldTable,
) -> Result<(), BrokerError> {
    channel
        .queue_bind(
            queue.into(),
            exchange.into(),
            "".into(),
            QueueBindOptions::default(),
            args,
        )
        .await
        .map_err(|e| BrokerError::amqp(format!("queue.bind {queue} → {exchange}"), e))
}

/// The producers' queue: one message per book to narrate (docs/PRODUCERS.md), served by
/// every worker that takes intake.
pub const INTAKE_QUEUE: &str = "narrator.intake";
/// Where requests that cannot make a job go, with the reason in a header.
pub const INTAKE_DEAD_QUEUE: &str = "narrator.intake.dead";
/// The intake's dead-letter exchange (fanout to [`INTAKE_DEAD_QUEUE`]).
pub const INTAKE_DEAD_EXCHANGE: &str = "narrator.intake.dlx";
/// A direct exchange bound to [`INTAKE_QUEUE`] (routing key `narrator.intake`), for
/// producers that publish to an exchange rather than the default one.
pub const JOBS_EXCHANGE: &str = "narrator.jobs";
/// Header of a dead-lettered request: why it made no job (one line).
pub const INTAKE_REASON_HEADER: &str = "x-narrator-reason";
/// Header of a dead-lettered request: the error's code, as in the reply.
pub const INTAKE_CODE_HEADER: &str = "x-narrator-error-code";
/// The topic exchange of the jobs' events (CloudEvents 1.0, structured JSON), routing
/// keys `job.queued`, `job.done`, `job.failed`, `job.cancelled`, `job.retried`.
pub const EVENTS_EXCHANGE: &str = "narrator.events";
/// Deliveries the intake allows a request before the broker dead-letters it: a
/// request that kills the worker serving it every time does not circle forever.
pub const INTAKE_DELIVERY_LIMIT: u32 = 5;

/// Declares the producers' topology: [`INTAKE_QUEUE`] (a durable quorum queue with a
/// delivery limit), its dead letters, [`JOBS_EXCHANGE`] and [`EVENTS_EXCHANGE`].
/// Idempotent; `narrator migrate` and workers declare it.
pub async fn declare_intake(channel: &Channel) -> Result<(), BrokerError> {
    exchange(channel, EVENTS_EXCHANGE, ExchangeKind::Topic).await?;
    exchange(channel, INTAKE_DEAD_EXCHANGE, ExchangeKind::Fanout).await?;
    queue(channel, INTAKE_DEAD_QUEUE, FieldTable::default()).await?;
    bind(
        channel,
        INTAKE_DEAD_QUEUE,
        INTAKE_DEAD_EXCHANGE,
        FieldTable::default(),
    )
    .await?;
    let mut args = FieldTable::default();
    args.insert("x-queue-type".into(), long("quorum"));
    args.insert(
        "x-delivery-limit".into(),
        AMQPValue::LongUInt(INTAKE_DELIVERY_LIMIT),
    );
    args.insert("x-dead-letter-exchange".into(), long(INTAKE_DEAD_EXCHANGE));
    queue(channel, INTAKE_QUEUE, args).await?;
    exchange(channel, JOBS_EXCHANGE, ExchangeKind::Direct).await?;
    channel
        .queue_bind(
            INTAKE_QUEUE.into(),
            JOBS_EXCHANGE.into(),
            INTAKE_QUEUE.into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .map_err(|e| BrokerError::amqp(format!("queue.bind {INTAKE_QUEUE} → {JOBS_EXCHANGE}"), e))
}

/// Declares the shared topology and `voice`'s work queue with the default settings.
pub async fn declare(channel: &Channel, voice: &str) -> Result<(), BrokerError> {
    declare_with(channel, voice, TopologyConfig::default()).await
}

/// Declares the shared topology (dead letters, retry tiers) and `voice`'s quorum work
/// queue. Idempotent while the settings do not change.
pub async fn declare_with(
    channel: &Channel,
    voice: &str,
    config: TopologyConfig,
) -> Result<(), BrokerError> {
    exchange(channel, DEAD_LETTER_EXCHANGE, ExchangeKind::Fanout).await?;
    queue(channel, DEAD_LETTER_QUEUE, FieldTable::default()).await?;
    bind(
        channel,
        DEAD_LETTER_QUEUE,
        DEAD_LETTER_EXCHANGE,
        FieldTable::default(),
    )
    .await?;

    exchange(channel, RETRY_EXCHANGE, ExchangeKind::Headers).await?;
    for tier in RETRY_TIERS {
        let name = retry_queue(tier);
        let mut args = FieldTable::default();
        let ttl = u32::try_from(tier.as_millis()).unwrap_or(u32::MAX);
        args.insert("x-message-ttl".into(), AMQPValue::LongUInt(ttl));
        // The default exchange with the original routing key: back to the work queue.
        args.insert("x-dead-letter-exchange".into(), long(""));
        queue(channel, &name, args).await?;
        let mut binding = FieldTable::default();
        binding.insert("x-match".into(), long("all"));
        binding.insert(RETRY_TIER_HEADER.into(), long(&tier_label(tier)));
        bind(channel, &name, RETRY_EXCHANGE, binding).await?;
    }

    for lane in 0..LANES {
        let mut args = FieldTable::default();
        args.insert("x-queue-type".into(), long("quorum"));
        args.insert(
            "x-delivery-limit".into(),
            AMQPValue::LongUInt(config.delivery_limit),
        );
        args.insert("x-dead-letter-exchange".into(), long(DEAD_LETTER_EXCHANGE));
        queue(channel, &lane_queue(voice, lane), args).await?;
    }
    Ok(())
}

/// Deletes `voice`'s work queues (every lane, not the shared queues); returns the
/// messages they held.
pub async fn delete_voice_queues(channel: &Channel, voice: &str) -> Result<u32, BrokerError> {
    let mut n = 0;
    for lane in 0..LANES {
        let name = lane_queue(voice, lane);
        n += channel
            .queue_delete(name.as_str().into(), QueueDeleteOptions::default())
            .await
            .map_err(|e| BrokerError::amqp(format!("queue.delete {name}"), e))?;
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_round_up_to_a_tier() {
        let q = |s| retry_queue(Duration::from_secs(s));
        assert_eq!(q(0), "narrator.retry.5s");
        assert_eq!(q(5), "narrator.retry.5s");
        assert_eq!(q(6), "narrator.retry.30s");
        assert_eq!(q(31), "narrator.retry.300s");
        assert_eq!(q(9999), "narrator.retry.300s");
        assert_eq!(
            work_queue("en_US-joe-medium"),
            "narrator.segments.en_US-joe-medium"
        );
        assert_eq!(lane_queue("v", 0), "narrator.segments.v");
        assert_eq!(lane_queue("v", 1), "narrator.segments.v.high");
        assert_eq!(
            (lane_of(-3), lane_of(0), lane_of(1), lane_of(99)),
            (0, 0, 1, 1)
        );
    }
}
