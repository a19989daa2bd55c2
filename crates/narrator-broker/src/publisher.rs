//! Publishing with confirms: every message is acknowledged by the broker or an error.

use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{BasicProperties, Channel, Confirmation, Connection};

use crate::{BrokerError, SegmentMessage, lane_queue, work_queue};

/// Persistent JSON with the job id in a header (for operators reading the queue) and the
/// job's W3C trace context in `traceparent` / `tracestate`.
fn segment_properties(message: &SegmentMessage) -> BasicProperties {
    let mut headers = FieldTable::default();
    headers.insert(
        "x-narrator-job".into(),
        AMQPValue::LongString(LongString::from(message.job_id.as_str())),
    );
    if let Some(trace) = &message.trace {
        headers.insert(
            crate::TRACEPARENT_HEADER.into(),
            AMQPValue::LongString(LongString::from(trace.traceparent.as_str())),
        );
        if let Some(state) = &trace.tracestate {
            headers.insert(
                crate::TRACESTATE_HEADER.into(),
                AMQPValue::LongString(LongString::from(state.as_str())),
            );
        }
    }
    BasicProperties::default()
        .with_content_type("application/json".into())
        .with_delivery_mode(2)
        .with_timestamp(message.enqueued_at_ms / 1000)
        .with_headers(headers)
}

/// A confirm-mode channel that publishes persistent, `mandatory` messages.
#[derive(Debug, Clone)]
pub struct Publisher {
    channel: Channel,
}

impl Publisher {
    /// Opens a channel in confirm mode.
    pub async fn new(connection: &Connection) -> Result<Self, BrokerError> {
        let channel = connection
            .create_channel()
            .await
            .map_err(|e| BrokerError::amqp("channel.open", e))?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(|e| BrokerError::amqp("confirm.select", e))?;
        Ok(Self { channel })
    }

    /// Publishes one segment to its voice's work queue and waits for the confirm.
    pub async fn publish(&self, message: &SegmentMessage) -> Result<(), BrokerError> {
        let body = message.encode()?;
        self.publish_raw(
            "",
            &work_queue(&message.voice),
            &body,
            segment_properties(message),
        )
        .await
    }

    /// Publishes many segments pipelined: every message is sent, then every confirm
    /// awaited (one round trip for the lot instead of one per message). `Ok` means the
    /// broker confirmed all of them; on an error some may have been confirmed, and the
    /// caller publishes them again (consumers tolerate duplicates).
    pub async fn publish_batch(&self, messages: &[SegmentMessage]) -> Result<(), BrokerError> {
        let opts = BasicPublishOptions {
            mandatory: true,
            ..BasicPublishOptions::default()
        };
        let mut pending = Vec::with_capacity(messages.len());
        for m in messages {
            let body = m.encode()?;
            crate::consumer::count_op("publish");
            let key = lane_queue(&m.voice, m.lane);
            let confirm = self
                .channel
                .basic_publish(
                    "".into(),
                    key.as_str().into(),
                    opts,
                    &body,
                    segment_properties(m),
                )
                .await
                .map_err(|e| BrokerError::amqp(format!("basic.publish {key}"), e))?;
            pending.push((key, confirm));
        }
        for (key, confirm) in pending {
            let confirmation = confirm
                .await
                .map_err(|e| BrokerError::amqp(format!("basic.publish {key}"), e))?;
            self.check("", &key, confirmation)?;
        }
        Ok(())
    }

    /// The channel (a requester consumes its replies on it: RabbitMQ's direct reply-to
    /// answers on the channel that published).
    pub fn channel(&self) -> &Channel {
        &self.channel
    }

    /// Publishes a body (persistent, mandatory) and waits for the confirm; a nack or a
    /// returned message is an error. After a connection loss it waits for lapin's
    /// recovery and publishes once more.
    pub async fn publish_raw(
        &self,
        exchange: &str,
        routing_key: &str,
        body: &[u8],
        properties: BasicProperties,
    ) -> Result<(), BrokerError> {
        self.publish_confirmed(exchange, routing_key, body, properties, true)
            .await
    }

    /// [`Self::publish_raw`] for a message that may go nowhere (an event on a topic
    /// exchange no one has bound a queue to yet): not mandatory, still confirmed.
    pub async fn publish_optional(
        &self,
        exchange: &str,
        routing_key: &str,
        body: &[u8],
        properties: BasicProperties,
    ) -> Result<(), BrokerError> {
        self.publish_confirmed(exchange, routing_key, body, properties, false)
            .await
    }

    async fn publish_confirmed(
        &self,
        exchange: &str,
        routing_key: &str,
        body: &[u8],
        properties: BasicProperties,
        mandatory: bool,
    ) -> Result<(), BrokerError> {
        let properties = properties.with_delivery_mode(2);
        let mut recovered = false;
        loop {
            match self
                .try_publish(exchange, routing_key, body, properties.clone(), mandatory)
                .await
            {
                Ok(confirmation) => return self.check(exchange, routing_key, confirmation),
                Err(e) if !recovered => {
                    tracing::warn!(error = %e, "publish failed; waiting for the connection to recover");
                    self.channel.wait_for_recovery(e).await.map_err(|e| {
                        BrokerError::amqp(format!("basic.publish {routing_key}"), e)
                    })?;
                    recovered = true;
                }
                Err(e) => return Err(BrokerError::amqp(format!("basic.publish {routing_key}"), e)),
            }
        }
    }

    async fn try_publish(
        &self,
        exchange: &str,
        routing_key: &str,
        body: &[u8],
        properties: BasicProperties,
        mandatory: bool,
    ) -> lapin::Result<Confirmation> {
        let opts = BasicPublishOptions {
            mandatory,
            ..BasicPublishOptions::default()
        };
        crate::consumer::count_op("publish");
        self.channel
            .basic_publish(exchange.into(), routing_key.into(), opts, body, properties)
            .await?
            .await
    }

    fn check(
        &self,
        exchange: &str,
        routing_key: &str,
        confirmation: Confirmation,
    ) -> Result<(), BrokerError> {
        match confirmation {
            Confirmation::Ack(None) => Ok(()),
            Confirmation::Ack(Some(returned)) | Confirmation::Nack(Some(returned)) => {
                Err(BrokerError::Returned {
                    exchange: exchange.to_string(),
                    routing_key: routing_key.to_string(),
                    reply_code: returned.reply_code,
                    reply_text: returned.reply_text.to_string(),
                })
            }
            Confirmation::Nack(None) => Err(BrokerError::Nacked {
                exchange: exchange.to_string(),
                routing_key: routing_key.to_string(),
            }),
            Confirmation::NotRequested => Err(BrokerError::NotConfirmed),
        }
    }
}
