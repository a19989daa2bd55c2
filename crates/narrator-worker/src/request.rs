//! The producer's side of the intake (docs/PRODUCERS.md), in Rust: a [`JobRequest`]
//! published to `narrator.intake` with confirms, and its reply read from RabbitMQ's
//! direct reply-to. `narrator submit --via-broker` is built on it; it needs the broker
//! only (and S3 for a book sent by `source`).

use std::time::Duration;

use futures_util::StreamExt;
use lapin::options::BasicConsumeOptions;
use lapin::types::{FieldTable, ShortString};
use lapin::{BasicProperties, Connection, Consumer};
use narrator_broker::{BrokerError, INTAKE_QUEUE, Publisher};

use crate::intake::{JobRequest, Reply};

/// RabbitMQ's pseudo-queue for replies on the requesting channel.
const DIRECT_REPLY_TO: &str = "amq.rabbitmq.reply-to";

/// Why a request got no answer.
#[derive(Debug, thiserror::Error)]
pub enum RequestFailed {
    /// The broker could not take the request.
    #[error(transparent)]
    Broker(#[from] BrokerError),
    /// The request could not be encoded.
    #[error("encoding the request: {0}")]
    Encode(#[from] serde_json::Error),
    /// The request is in `narrator.intake` (the broker confirmed it), but no worker
    /// answered in time.
    #[error(
        "request {key} is queued in {INTAKE_QUEUE}, but no worker answered within {} s; \
         it is served when a worker that takes intake runs (`narrator worker` without \
         --no-intake); `narrator jobs` lists its job once one has",
        waited.as_secs()
    )]
    NoReply {
        /// The request's name.
        key: String,
        /// How long it waited.
        waited: Duration,
    },
    /// The reply could not be read.
    #[error("the reply to request {key} is not one this version reads: {detail}")]
    BadReply {
        /// The request's name.
        key: String,
        /// What was wrong.
        detail: String,
    },
}

/// Publishes requests and waits for their replies, one at a time, on one channel.
pub struct Requester {
    publisher: Publisher,
    replies: Consumer,
}

impl Requester {
    /// A requester on `conn`: the intake declared (a request published before any worker
    /// started waits in it), the reply consumer registered.
    pub async fn new(conn: &Connection) -> Result<Self, RequestFailed> {
        let publisher = Publisher::new(conn).await?;
        narrator_broker::declare_intake(publisher.channel()).await?;
        let replies = publisher
            .channel()
            .basic_consume(
                DIRECT_REPLY_TO.into(),
                "".into(),
                BasicConsumeOptions {
                    no_ack: true,
                    ..BasicConsumeOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .map_err(|e| BrokerError::amqp(format!("basic.consume {DIRECT_REPLY_TO}"), e))?;
        Ok(Self { publisher, replies })
    }

    /// Publishes `request` named `key` (its `message_id`: the same key again makes no
    /// second job) and waits up to `wait` for its reply.
    pub async fn request(
        &mut self,
        request: &JobRequest,
        key: &str,
        wait: Duration,
    ) -> Result<Reply, RequestFailed> {
        let body = serde_json::to_vec(request)?;
        let correlation = narrator_db::Uuid::new_v4().to_string();
        let props = BasicProperties::default()
            .with_content_type(ShortString::from("application/json"))
            .with_message_id(ShortString::from(key))
            .with_correlation_id(ShortString::from(correlation.as_str()))
            .with_reply_to(ShortString::from(DIRECT_REPLY_TO));
        self.publisher
            .publish_raw("", INTAKE_QUEUE, &body, props)
            .await?;
        let no_reply = || RequestFailed::NoReply {
            key: key.to_string(),
            waited: wait,
        };
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let next = tokio::time::timeout_at(deadline, self.replies.next())
                .await
                .map_err(|_| no_reply())?;
            let delivery = match next {
                Some(Ok(d)) => d,
                Some(Err(e)) => return Err(BrokerError::amqp("reply delivery", e).into()),
                None => return Err(no_reply()),
            };
            // A late reply to an earlier request of this channel is not this one's.
            let ours = delivery
                .properties
                .correlation_id()
                .as_ref()
                .is_some_and(|c| c.as_str() == correlation);
            if ours {
                return serde_json::from_slice(&delivery.data).map_err(|e| {
                    RequestFailed::BadReply {
                        key: key.to_string(),
                        detail: e.to_string(),
                    }
                });
            }
        }
    }
}
