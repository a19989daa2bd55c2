//! Consuming a voice's work queue as a [`SegmentQueue`], and settling deliveries.

use std::sync::atomic::{AtomicU64, Ordering};

use futures_lite::StreamExt;
use lapin::Acker;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicNackOptions, BasicQosOptions, BasicRejectOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{BasicProperties, Channel, Connection};
use narrator_core::{Delivery, Failure, SeamError, SegmentQueue};
use tokio::sync::Mutex;

use crate::{
    ATTEMPTS_HEADER, BrokerError, DEAD_LETTER_EXCHANGE, DEAD_REASON_HEADER, Decision, FailureKind,
    LANES, POSTPONED_SINCE_HEADER, Publisher, RETRY_EXCHANGE, RETRY_TIER_HEADER, SegmentMessage,
    decide, lane_queue, topology::tier_label, work_queue,
};

/// Header the quorum queue sets on a redelivery: failed deliveries so far.
const DELIVERY_COUNT_HEADER: &str = "x-delivery-count";

/// Milliseconds since the Unix epoch.
fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// What settles one delivery: lapin's acker, plus the message for a republish.
#[derive(Debug)]
pub struct Ticket {
    acker: Acker,
    body: Vec<u8>,
    properties: BasicProperties,
    attempt: u32,
    tag: (u8, u64),
    lane: u8,
}

impl Ticket {
    /// When this message was first postponed for an outage (ms since the Unix epoch),
    /// if it ever was.
    pub fn postponed_since_ms(&self) -> Option<u64> {
        int_header(self.properties.headers().as_ref()?, POSTPONED_SINCE_HEADER)
    }
}

/// A delivery not settled yet, as [`Consumer::close`] returns it uncharged.
#[derive(Debug)]
struct Held {
    acker: Acker,
    body: Vec<u8>,
    properties: BasicProperties,
    lane: u8,
}

/// Header on a message a clean shutdown returned to its queue.
const RETURNED_HEADER: &str = "x-narrator-returned";

impl Ticket {
    /// The delivery attempt, from 1.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// Whether the broker delivered it again after a consumer went away holding it (a
    /// process that died or a connection that dropped): its `x-delivery-count` is above 0.
    pub fn returned(&self) -> bool {
        self.properties
            .headers()
            .as_ref()
            .and_then(|h| int_header(h, DELIVERY_COUNT_HEADER))
            .is_some_and(|n| n > 0)
    }
}

/// A retry's per-message TTL in its tier, in milliseconds: 80 to 100 % of the tier's
/// delay (`r` in 0..1). The tier queue's own TTL caps it; a message expires no earlier
/// than its TTL, and at the latest when the tier's TTL runs out.
pub(crate) fn jittered_expiration(after: std::time::Duration, r: f64) -> String {
    let tier = crate::RETRY_TIERS
        .iter()
        .find(|t| **t >= after)
        .copied()
        .unwrap_or(crate::RETRY_TIERS[crate::RETRY_TIERS.len() - 1]);
    let ms = tier.as_millis() as f64 * (0.8 + 0.2 * r.clamp(0.0, 1.0));
    format!("{}", ms.round() as u64)
}

/// The attempts narrator charged a message before this delivery (`x-narrator-attempts`),
/// without what the broker counted for consumers that went away.
fn charged_before(properties: &BasicProperties) -> u32 {
    properties
        .headers()
        .as_ref()
        .and_then(|h| int_header(h, ATTEMPTS_HEADER))
        .and_then(|n| u32::try_from(n).ok())
        .unwrap_or(0)
}

enum Action {
    Decided(Decision),
    Requeue,
}

/// A consumer of one voice's work queue with a fixed prefetch.
#[derive(Debug)]
pub struct Consumer {
    channel: Channel,
    /// One stream per priority lane, highest lane first.
    streams: Mutex<Vec<(u8, lapin::Consumer)>>,
    publisher: Publisher,
    prefetch: u16,
    voice: String,
    /// The normal lane's queue (for logs).
    queue: String,
    /// The database's cluster id: a message of another cluster is left in the queue.
    cluster: Option<String>,
    /// Consumer tags (to cancel them on close).
    tags: Vec<String>,
    /// How long a delivery may be postponed for outages before it fails.
    postpone_budget: std::time::Duration,
    /// Deliveries handed out and not settled yet, by (lane, delivery tag).
    held: std::sync::Mutex<std::collections::HashMap<(u8, u64), Held>>,
    /// How many are held, for whoever reports it (the heartbeat).
    held_count: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    /// How many of them are of the high lane (the rest are of the normal lane): the
    /// watchdog tells which lane's messages are missing.
    held_high: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

/// What taking one stream item did.
enum Took {
    /// Go on collecting.
    More,
    /// The stream recovered from an interruption: hand over what was collected.
    Recovered,
    /// The stream ended (consumer cancelled).
    Ended,
}

fn consumer_tag(voice: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!(
        "narrator-{voice}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

fn str_header(headers: &FieldTable, name: &str) -> Option<String> {
    match headers.inner().get(name)? {
        AMQPValue::LongString(v) => Some(String::from_utf8_lossy(v.as_bytes()).into_owned()),
        AMQPValue::ShortString(v) => Some(v.as_str().to_string()),
        _ => None,
    }
}

/// The W3C trace context a message carries in its headers.
pub(crate) fn trace_of(properties: &BasicProperties) -> Option<narrator_core::TraceContext> {
    let headers = properties.headers().as_ref()?;
    Some(narrator_core::TraceContext {
        traceparent: str_header(headers, crate::TRACEPARENT_HEADER)?,
        tracestate: str_header(headers, crate::TRACESTATE_HEADER),
    })
}

fn int_header(headers: &FieldTable, name: &str) -> Option<u64> {
    match headers.inner().get(name)? {
        AMQPValue::ShortShortUInt(v) => Some(u64::from(*v)),
        AMQPValue::ShortUInt(v) => Some(u64::from(*v)),
        AMQPValue::LongUInt(v) => Some(u64::from(*v)),
        AMQPValue::ShortShortInt(v) => u64::try_from(*v).ok(),
        AMQPValue::ShortInt(v) => u64::try_from(*v).ok(),
        AMQPValue::LongInt(v) => u64::try_from(*v).ok(),
        AMQPValue::LongLongInt(v) => u64::try_from(*v).ok(),
        _ => None,
    }
}

/// `x-narrator-attempts` (attempts before the last retry) + `x-delivery-count` + 1.
pub(crate) fn attempt_of(properties: &BasicProperties) -> u32 {
    let (before, failed) = properties.headers().as_ref().map_or((0, 0), |h| {
        (
            int_header(h, ATTEMPTS_HEADER).unwrap_or(0),
            int_header(h, DELIVERY_COUNT_HEADER).unwrap_or(0),
        )
    });
    u32::try_from(before.saturating_add(failed).saturating_add(1)).unwrap_or(u32::MAX)
}

/// The headers for a republish: the old ones without the broker's delivery count, with
/// the attempts made so far and `extra`.
fn republish_headers(
    properties: &BasicProperties,
    attempt: u32,
    extra: (&str, &str),
) -> FieldTable {
    let mut headers = FieldTable::default();
    if let Some(old) = properties.headers() {
        for (k, v) in old.inner() {
            if k.as_str() != DELIVERY_COUNT_HEADER {
                headers.insert(k.clone(), v.clone());
            }
        }
    }
    headers.insert(ATTEMPTS_HEADER.into(), AMQPValue::LongUInt(attempt));
    headers.insert(
        extra.0.into(),
        AMQPValue::LongString(LongString::from(extra.1)),
    );
    headers
}

/// `headers` without `name`.
fn without(headers: &FieldTable, name: &str) -> FieldTable {
    let mut kept = FieldTable::default();
    for (k, v) in headers.inner() {
        if k.as_str() != name {
            kept.insert(k.clone(), v.clone());
        }
    }
    kept
}

impl Consumer {
    /// Opens a channel and consumes every priority lane of `voice` (declare them first
    /// with [`crate::declare`]): the normal lane with `prefetch`, the high lane with twice
    /// that, so a worker busy with a priority book holds its next batches while those in
    /// flight are recorded and acknowledged (with the same prefetch, the batches in flight
    /// held all of it and the worker went back to the normal lane meanwhile). After a
    /// recovery both lanes have `prefetch` (the channel's last QoS is replayed). Also
    /// opens a confirm-mode channel for retries and dead letters.
    pub async fn start(
        connection: &Connection,
        voice: &str,
        prefetch: u16,
    ) -> Result<Self, BrokerError> {
        let channel = connection
            .create_channel()
            .await
            .map_err(|e| BrokerError::amqp("channel.open", e))?;
        let mut streams = Vec::new();
        let mut tags = Vec::new();
        for lane in (0..LANES).rev() {
            // Per-consumer QoS applies to consumers created after it: set it first.
            let lane_prefetch = if lane > 0 {
                prefetch.saturating_mul(2)
            } else {
                prefetch
            };
            channel
                .basic_qos(lane_prefetch, BasicQosOptions { global: false })
                .await
                .map_err(|e| BrokerError::amqp("basic.qos", e))?;
            let queue = lane_queue(voice, lane);
            let tag = consumer_tag(voice);
            let stream = channel
                .basic_consume(
                    queue.as_str().into(),
                    tag.as_str().into(),
                    BasicConsumeOptions::default(),
                    FieldTable::default(),
                )
                .await
                .map_err(|e| BrokerError::amqp(format!("basic.consume {queue}"), e))?;
            streams.push((lane, stream));
            tags.push(tag);
        }
        Ok(Self {
            publisher: Publisher::new(connection).await?,
            streams: Mutex::new(streams),
            channel,
            prefetch,
            voice: voice.to_string(),
            queue: work_queue(voice),
            cluster: None,
            tags,
            postpone_budget: crate::POSTPONE_BUDGET,
            held: std::sync::Mutex::default(),
            held_count: std::sync::Arc::default(),
            held_high: std::sync::Arc::default(),
        })
    }

    /// Accept only messages of `cluster` (and those without one, from versions before
    /// cluster ids): a message of another cluster is returned to the queue untouched and
    /// [`Consumer::next_deliveries`] fails with [`BrokerError::WrongCluster`].
    pub fn for_cluster(mut self, cluster: impl Into<String>) -> Self {
        self.cluster = Some(cluster.into());
        self
    }

    /// Fail a delivery postponed for outages for longer than `budget` (counted from its
    /// first postponement) instead of postponing it again; [`crate::POSTPONE_BUDGET`]
    /// unless set.
    pub fn with_postpone_budget(mut self, budget: std::time::Duration) -> Self {
        self.postpone_budget = budget;
        self
    }

    /// The decision for `failure` of `ticket`'s delivery: [`failure_decision`], with a
    /// postponement past the budget turned into a dead letter that names the outage.
    pub fn decision_for(&self, ticket: &Ticket, failure: &Failure) -> Decision {
        let postponed_for = ticket
            .postponed_since_ms()
            .map(|since| std::time::Duration::from_millis(now_ms().saturating_sub(since)));
        match crate::within_budget(
            failure_decision(failure, ticket.attempt),
            postponed_for,
            self.postpone_budget,
        ) {
            Decision::DeadLetter { reason } if postponed_for.is_some() => Decision::DeadLetter {
                reason: format!("{reason}: {}: {}", failure.kind, failure.reason),
            },
            other => other,
        }
    }

    /// Deliveries handed out and not settled yet (unacknowledged), kept up to date: the
    /// heartbeat reports it so that peers can tell a voice's lost messages from held ones.
    pub fn held_counter(&self) -> std::sync::Arc<std::sync::atomic::AtomicUsize> {
        self.held_count.clone()
    }

    /// Whether it holds deliveries of the high lane (handed out, not settled).
    pub fn holds_high(&self) -> bool {
        self.held_high.load(Ordering::Relaxed) > 0
    }

    /// Of [`Consumer::held_counter`], those of the high lane.
    pub fn held_high_counter(&self) -> std::sync::Arc<std::sync::atomic::AtomicUsize> {
        self.held_high.clone()
    }

    /// The prefetch this consumer keeps.
    pub fn prefetch(&self) -> u16 {
        self.prefetch
    }

    /// The prefetch the channel has in effect, as lapin recorded it.
    pub fn prefetch_in_effect(&self) -> Option<u16> {
        self.channel.status().qos().prefetch_count
    }

    /// A clean stop: cancels the consumers, returns every delivery not settled yet
    /// (those handed out and not started, and those the broker had sent ahead) to its
    /// queue *uncharged* (republished with the attempts made before it, then
    /// acknowledged: the quorum queue would count a delivery returned by closing the
    /// channel), then closes the channel. Anything it cannot return goes back with the
    /// channel, counted.
    pub async fn close(&self) -> Result<(), BrokerError> {
        let mut cancelled = true;
        for tag in &self.tags {
            cancelled &= self
                .channel
                .basic_cancel(tag.as_str().into(), Default::default())
                .await
                .is_ok();
        }
        if cancelled {
            // What the broker sent before the cancel is in the streams' buffers.
            let mut streams = self.streams.lock().await;
            for (lane, stream) in streams.iter_mut() {
                while let Some(Some(Ok(d))) = futures_lite::future::poll_once(stream.next()).await {
                    self.hold((*lane, d.delivery_tag), &d.acker, &d.data, &d.properties);
                }
            }
        }
        let held: Vec<Held> = {
            let mut map = self.held.lock().unwrap_or_else(|e| e.into_inner());
            let held = map.drain().map(|(_, h)| h).collect();
            self.gauge_held(&map);
            held
        };
        let mut returned = 0;
        for h in held {
            let props = h.properties.clone().with_headers(republish_headers(
                &h.properties,
                charged_before(&h.properties),
                (RETURNED_HEADER, "shutdown"),
            ));
            let queue = lane_queue(&self.voice, h.lane);
            if self
                .publisher
                .publish_raw("", &queue, &h.body, props)
                .await
                .is_ok()
                && h.acker.ack(BasicAckOptions::default()).await.is_ok()
            {
                count_op("ack");
                returned += 1;
            }
        }
        if returned > 0 {
            tracing::info!(queue = %self.queue, returned, "returned unstarted deliveries to the queue, uncharged");
        }
        self.channel
            .close(200, "consumer closed".into())
            .await
            .map_err(|e| BrokerError::amqp("channel.close", e))
    }

    fn hold(&self, tag: (u8, u64), acker: &Acker, body: &[u8], properties: &BasicProperties) {
        let mut map = self.held.lock().unwrap_or_else(|e| e.into_inner());
        map.insert(
            tag,
            Held {
                acker: acker.clone(),
                body: body.to_vec(),
                properties: properties.clone(),
                lane: tag.0,
            },
        );
        self.gauge_held(&map);
    }

    fn gauge_held(&self, map: &std::collections::HashMap<(u8, u64), Held>) {
        let n = map.len();
        self.held_count.store(n, Ordering::Relaxed);
        let high = map.keys().filter(|k| k.0 > 0).count();
        self.held_high.store(high, Ordering::Relaxed);
        metrics::gauge!(narrator_telemetry::metrics::IN_FLIGHT, "voice" => self.voice.clone())
            .set(n as f64);
    }

    async fn reapply_qos(&self) -> Result<(), BrokerError> {
        // lapin 4.12.3 replays basic_qos before it re-creates consumers; re-applying it
        // keeps the limit right should a lapin version not (NOTES.md, issue 3).
        self.channel
            .basic_qos(self.prefetch, BasicQosOptions { global: false })
            .await
            .map_err(|e| BrokerError::amqp("basic.qos after recovery", e))?;
        tracing::info!(queue = %self.queue, prefetch = self.prefetch, "connection recovered; prefetch re-applied");
        Ok(())
    }

    /// The next decodable delivery; a malformed one is dead-lettered on the way.
    pub async fn next_delivery(&self) -> Result<Option<Delivery<Ticket>>, BrokerError> {
        Ok(self.next_deliveries(1).await?.pop())
    }

    /// Waits for the next decodable delivery, then adds up to `max - 1` more that the
    /// broker has already sent (no waiting for them), so the caller can handle a group at
    /// once; higher priority lanes first. Empty once the consumer has ended. Malformed
    /// messages are dead-lettered on the way; a message of another cluster ends it with
    /// [`BrokerError::WrongCluster`], everything taken returned to the queue.
    pub async fn next_deliveries(&self, max: usize) -> Result<Vec<Delivery<Ticket>>, BrokerError> {
        let max = max.max(1);
        let mut streams = self.streams.lock().await;
        let mut out: Vec<Delivery<Ticket>> = Vec::new();
        let mut ended = vec![false; streams.len()];
        loop {
            // What has arrived already, highest lane first.
            for (i, (lane, stream)) in streams.iter_mut().enumerate() {
                while out.len() < max && !ended[i] {
                    let Some(item) = futures_lite::future::poll_once(stream.next()).await else {
                        break;
                    };
                    match self.take(*lane, item, &mut out).await? {
                        Took::More => {}
                        Took::Ended => ended[i] = true,
                        Took::Recovered if !out.is_empty() => return Ok(out),
                        Took::Recovered => {}
                    }
                }
            }
            if !out.is_empty() || ended.iter().all(|e| *e) {
                return Ok(out);
            }
            // Nothing yet: wait for the first delivery of any lane.
            let waits = streams
                .iter_mut()
                .enumerate()
                .filter(|(i, _)| !ended[*i])
                .map(|(i, (lane, s))| {
                    let lane = *lane;
                    Box::pin(async move { (i, lane, s.next().await) })
                });
            let ((i, lane, item), _, _) = futures_util::future::select_all(waits).await;
            match self.take(lane, item, &mut out).await? {
                Took::Ended => ended[i] = true,
                Took::Recovered if !out.is_empty() => return Ok(out),
                Took::More | Took::Recovered => {}
            }
        }
    }

    /// Handles one stream item of `lane`: a delivery joins `out`; a malformed one is
    /// dead-lettered; one of another cluster returns everything taken and fails.
    async fn take(
        &self,
        lane: u8,
        item: Option<Result<lapin::message::Delivery, lapin::Error>>,
        out: &mut Vec<Delivery<Ticket>>,
    ) -> Result<Took, BrokerError> {
        let d = match item {
            None => return Ok(Took::Ended),
            Some(Ok(d)) => d,
            Some(Err(e)) => {
                tracing::warn!(queue = %self.queue, error = %e, "consumer interrupted; waiting for recovery");
                self.channel
                    .wait_for_recovery(e)
                    .await
                    .map_err(|e| BrokerError::amqp(format!("consume {}", self.queue), e))?;
                self.reapply_qos().await?;
                // The old channel's deliveries come again with new tags; those taken
                // before the interruption are handed over, their acks fail on the old
                // channel and the broker delivers them again.
                let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
                held.clear();
                self.gauge_held(&held);
                return Ok(Took::Recovered);
            }
        };
        let attempt = attempt_of(&d.properties);
        let decoded = SegmentMessage::decode(&d.data);
        let trace = trace_of(&d.properties);
        count_op("deliver");
        self.hold((lane, d.delivery_tag), &d.acker, &d.data, &d.properties);
        let ticket = Ticket {
            acker: d.acker,
            body: d.data,
            properties: d.properties,
            attempt,
            tag: (lane, d.delivery_tag),
            lane,
        };
        match decoded {
            Ok(m) if m.cluster.is_some() && self.cluster.is_some() && m.cluster != self.cluster => {
                // Not this database's message: back to the queue, untouched, with
                // everything taken so far, and stop.
                let wrong = BrokerError::WrongCluster {
                    queue: lane_queue(&self.voice, lane),
                    message: m.cluster.unwrap_or_default(),
                    database: self.cluster.clone().unwrap_or_default(),
                };
                self.settle_inner(ticket, Action::Requeue).await?;
                for d in out.drain(..) {
                    self.settle_inner(d.ticket, Action::Requeue).await?;
                }
                Err(wrong)
            }
            Ok(m) => {
                out.push(Delivery {
                    job_id: m.job_id,
                    segment: m.segment,
                    // A message carries no scales: the worker reads its job's.
                    scales: None,
                    attempt,
                    enqueued_at_ms: Some(m.enqueued_at_ms),
                    lane,
                    alone: false,
                    trace,
                    ticket,
                });
                Ok(Took::More)
            }
            Err(e) => {
                tracing::warn!(queue = %self.queue, error = %e, "dead-lettering a malformed message");
                self.settle(ticket, decide(FailureKind::Malformed, attempt))
                    .await?;
                Ok(Took::More)
            }
        }
    }

    /// Carries out a [`Decision`] (see [`decide`]). Retry: republish to the tier, then
    /// ack. Dead letter: republish to `narrator.dlx` with the reason in
    /// `x-narrator-dead-reason`, then ack; if that publish fails, reject without requeue
    /// (the broker dead-letters it, the reason is logged).
    pub async fn settle(&self, ticket: Ticket, decision: Decision) -> Result<(), BrokerError> {
        self.settle_inner(ticket, Action::Decided(decision)).await
    }

    /// The only code that acks, nacks or rejects.
    async fn settle_inner(&self, ticket: Ticket, action: Action) -> Result<(), BrokerError> {
        let Ticket {
            acker,
            body,
            properties,
            attempt,
            tag,
            lane,
        } = ticket;
        let queue = lane_queue(&self.voice, lane);
        {
            let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
            held.remove(&tag);
            self.gauge_held(&held);
        }
        count_decision(&self.voice, &action);
        let (op, sent) = match action {
            Action::Requeue => {
                let opts = BasicNackOptions {
                    requeue: true,
                    multiple: false,
                };
                ("basic.nack", acker.nack(opts).await)
            }
            Action::Decided(Decision::Release) => {
                let props = properties.clone().with_headers(republish_headers(
                    &properties,
                    charged_before(&properties),
                    (RETURNED_HEADER, "consumer gone"),
                ));
                if let Err(e) = self.publisher.publish_raw("", &queue, &body, props).await {
                    let opts = BasicNackOptions {
                        requeue: true,
                        multiple: false,
                    };
                    if let Err(nack) = acker.nack(opts).await {
                        tracing::warn!(error = %nack, "nack after a failed release publish failed");
                    }
                    return Err(e);
                }
                ("basic.ack", acker.ack(BasicAckOptions::default()).await)
            }
            Action::Decided(Decision::Ack) => {
                ("basic.ack", acker.ack(BasicAckOptions::default()).await)
            }
            Action::Decided(
                decision @ (Decision::Retry { after } | Decision::Postpone { after }),
            ) => {
                let tier = tier_label(after);
                // A postponed delivery goes back with the attempts charged before it: this
                // one is not charged.
                let charged = match decision {
                    Decision::Postpone { .. } => charged_before(&properties),
                    _ => attempt,
                };
                let mut headers =
                    republish_headers(&properties, charged, (RETRY_TIER_HEADER, &tier));
                match decision {
                    // The postponement budget counts from the first postponement.
                    Decision::Postpone { .. } => {
                        if int_header(&headers, POSTPONED_SINCE_HEADER).is_none() {
                            headers.insert(
                                POSTPONED_SINCE_HEADER.into(),
                                AMQPValue::LongLongInt(i64::try_from(now_ms()).unwrap_or(i64::MAX)),
                            );
                        }
                    }
                    // A charged retry: the segment got through to fail on its own, so
                    // the outage was over.
                    _ => headers = without(&headers, POSTPONED_SINCE_HEADER),
                }
                // Jitter: segments that failed together do not all come back together.
                let props = properties
                    .clone()
                    .with_headers(headers)
                    .with_expiration(jittered_expiration(after, fastrand::f64()).into());
                let published = self
                    .publisher
                    .publish_raw(RETRY_EXCHANGE, &queue, &body, props)
                    .await;
                if let Err(e) = published {
                    let opts = BasicNackOptions {
                        requeue: true,
                        multiple: false,
                    };
                    if let Err(nack) = acker.nack(opts).await {
                        tracing::warn!(error = %nack, "nack after a failed retry publish failed");
                    }
                    return Err(e);
                }
                ("basic.ack", acker.ack(BasicAckOptions::default()).await)
            }
            Action::Decided(Decision::DeadLetter { reason }) => {
                let props = properties.clone().with_headers(republish_headers(
                    &properties,
                    attempt,
                    (DEAD_REASON_HEADER, &reason),
                ));
                match self
                    .publisher
                    .publish_raw(DEAD_LETTER_EXCHANGE, &queue, &body, props)
                    .await
                {
                    Ok(()) => {
                        tracing::warn!(queue = %self.queue, attempt, %reason, "dead-lettered");
                        ("basic.ack", acker.ack(BasicAckOptions::default()).await)
                    }
                    Err(e) => {
                        tracing::warn!(queue = %self.queue, attempt, %reason, error = %e,
                            "dead-letter publish failed; rejecting (the broker dead-letters it without the reason)");
                        let opts = BasicRejectOptions { requeue: false };
                        ("basic.reject", acker.reject(opts).await)
                    }
                }
            }
        };
        count_op(op.trim_start_matches("basic."));
        match sent {
            Ok(true) => Ok(()),
            Ok(false) => {
                // The channel closed or recovered: the broker will deliver it again.
                tracing::warn!(queue = %self.queue, op, "not settled: the channel was closed or recovered; it will be delivered again");
                Ok(())
            }
            Err(e) => Err(BrokerError::amqp(op, e)),
        }
    }
}

impl SegmentQueue for Consumer {
    type Ticket = Ticket;

    fn holds_higher_lane(&self) -> bool {
        self.holds_high()
    }

    async fn next(&self) -> Result<Option<Delivery<Ticket>>, SeamError> {
        Ok(self.next_delivery().await?)
    }

    async fn ack(&self, ticket: Ticket) -> Result<(), SeamError> {
        Ok(self
            .settle_inner(ticket, Action::Decided(Decision::Ack))
            .await?)
    }

    async fn requeue(&self, ticket: Ticket) -> Result<(), SeamError> {
        Ok(self.settle_inner(ticket, Action::Requeue).await?)
    }

    async fn fail(&self, ticket: Ticket, failure: &Failure) -> Result<(), SeamError> {
        let decision = self.decision_for(&ticket, failure);
        metrics::counter!(
            narrator_telemetry::metrics::SEGMENTS_FAILED,
            "voice" => self.voice.clone(),
            "class" => failure.class.as_str(),
        )
        .increment(1);
        Ok(self.settle(ticket, decision).await?)
    }
}

/// Counts retries, postponements and dead letters by voice.
fn count_decision(voice: &str, action: &Action) {
    use narrator_telemetry::metrics as m;
    let name = match action {
        Action::Decided(Decision::Retry { .. }) => m::SEGMENTS_RETRIED,
        Action::Decided(Decision::Postpone { .. }) => m::SEGMENTS_POSTPONED,
        Action::Decided(Decision::DeadLetter { .. }) => m::SEGMENTS_DEAD_LETTERED,
        _ => return,
    };
    metrics::counter!(name, "voice" => voice.to_string()).increment(1);
}

/// The decision for `failure` on `attempt` (its retry class decides), with the error's
/// own words in a dead letter's reason.
pub fn failure_decision(failure: &Failure, attempt: u32) -> Decision {
    match decide(failure.class.into(), attempt) {
        Decision::DeadLetter { reason: why } => Decision::DeadLetter {
            reason: format!("{why}: {}: {}", failure.kind, failure.reason),
        },
        other => other,
    }
}

/// Counts one AMQP operation on a segment message ([`narrator_telemetry::metrics::BROKER_MESSAGES`]).
pub(crate) fn count_op(op: &'static str) {
    metrics::counter!(narrator_telemetry::metrics::BROKER_MESSAGES, "op" => op).increment(1);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn props(pairs: &[(&str, AMQPValue)]) -> BasicProperties {
        let mut h = FieldTable::default();
        for (k, v) in pairs {
            h.insert((*k).into(), v.clone());
        }
        BasicProperties::default().with_headers(h)
    }

    #[test]
    fn retry_expirations_spread_within_the_tier() {
        let five = std::time::Duration::from_secs(5);
        assert_eq!(jittered_expiration(five, 0.0), "4000");
        assert_eq!(jittered_expiration(five, 1.0), "5000");
        assert_eq!(
            jittered_expiration(std::time::Duration::from_secs(31), 0.5),
            "270000"
        );
    }

    #[test]
    fn attempt_counts_retries_and_redeliveries() {
        assert_eq!(attempt_of(&BasicProperties::default()), 1);
        assert_eq!(
            attempt_of(&props(&[(
                DELIVERY_COUNT_HEADER,
                AMQPValue::LongLongInt(1)
            )])),
            2
        );
        assert_eq!(
            attempt_of(&props(&[
                (ATTEMPTS_HEADER, AMQPValue::LongUInt(2)),
                (DELIVERY_COUNT_HEADER, AMQPValue::LongInt(1)),
            ])),
            4
        );
    }

    #[test]
    fn a_republish_drops_the_delivery_count_and_records_attempts() {
        let p = props(&[
            (DELIVERY_COUNT_HEADER, AMQPValue::LongLongInt(3)),
            ("x-narrator-job", AMQPValue::LongString("j".into())),
        ]);
        let h = republish_headers(&p, 4, (DEAD_REASON_HEADER, "why"));
        assert!(!h.contains_key(DELIVERY_COUNT_HEADER));
        assert!(h.contains_key("x-narrator-job"));
        assert_eq!(int_header(&h, ATTEMPTS_HEADER), Some(4));
        assert!(h.contains_key(DEAD_REASON_HEADER));
    }
}
