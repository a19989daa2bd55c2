//! narrator's RabbitMQ segment queue, the networked twin of the in-process queue in
//! `narrator-pipeline`.
//!
//! - [`declare`]: the topology, idempotently. Per voice a durable quorum work queue
//!   `narrator.segments.<voice>` with an explicit `x-delivery-limit` that dead-letters to
//!   the fanout exchange `narrator.dlx` → queue `narrator.dead`. Shared retry tiers
//!   `narrator.retry.5s|30s|300s`, each with ONE `x-message-ttl`, bound to the headers
//!   exchange `narrator.retry`; an expired message is dead-lettered through the default
//!   exchange with its original routing key, i.e. back to its voice's work queue.
//! - [`Publisher`]: confirm mode, `mandatory`, persistent; a nack or a returned
//!   (unroutable) message is an error, never silent.
//! - [`Consumer`]: implements [`narrator_core::SegmentQueue`] with a prefetch; errors are
//!   mapped by the pure [`decide`] to a [`Decision`], and [`Consumer::settle`] is the only
//!   code that talks to lapin's ack/nack/reject.
//!
//! Attempts: the quorum queue counts failed deliveries in `x-delivery-count`; a retry
//! through a tier is a new message, so the attempts made before it travel in the
//! `x-narrator-attempts` header. `attempt = x-narrator-attempts + x-delivery-count + 1`.

mod consumer;
mod decide;
mod error;
mod message;
mod publisher;
mod topology;

pub use consumer::{Consumer, Ticket, failure_decision};
pub use decide::{Decision, FailureKind, MAX_ATTEMPTS, decide};
pub use error::BrokerError;
pub use message::{MESSAGE_VERSION, SegmentMessage};
pub use publisher::Publisher;
pub use topology::{
    DEAD_LETTER_EXCHANGE, DEAD_LETTER_QUEUE, DEFAULT_DELIVERY_LIMIT, LANES, RETRY_EXCHANGE,
    RETRY_TIERS, TopologyConfig, declare, declare_with, delete_voice_queues, lane_of, lane_queue,
    retry_queue, work_queue,
};

/// Header: attempts made before this message was (re)published to a retry tier.
pub const ATTEMPTS_HEADER: &str = "x-narrator-attempts";
/// Header: why a message was dead-lettered by [`Consumer::settle`].
pub const DEAD_REASON_HEADER: &str = "x-narrator-dead-reason";
/// Header: the retry tier a message is routed to (`5s`, `30s`, `300s`).
pub const RETRY_TIER_HEADER: &str = "x-narrator-retry-tier";
/// W3C trace context: the trace and parent span of the job a segment belongs to.
pub const TRACEPARENT_HEADER: &str = "traceparent";
/// W3C trace context: vendor state.
pub const TRACESTATE_HEADER: &str = "tracestate";

/// How long [`connect`] waits for the broker before it gives up.
pub const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Connects with lapin's automatic recovery enabled (it replays exchanges, queues,
/// bindings, consumers, confirm mode and, since lapin 4.12.3, `basic_qos`).
/// Must run inside a Tokio runtime.
pub async fn connect(uri: &str) -> Result<lapin::Connection, BrokerError> {
    connect_named(uri, "narrator").await
}

/// [`connect`] with a connection name (shown by `rabbitmqctl list_connections
/// client_properties` and the management UI).
pub async fn connect_named(uri: &str, name: &str) -> Result<lapin::Connection, BrokerError> {
    let props = lapin::ConnectionProperties::default()
        .with_connection_name(name.into())
        .enable_auto_recover();
    match tokio::time::timeout(CONNECT_TIMEOUT, lapin::Connection::connect(uri, props)).await {
        Ok(Ok(conn)) => Ok(conn),
        Ok(Err(source)) => Err(BrokerError::Connect {
            uri: redact(uri),
            source: Some(source),
        }),
        Err(_) => Err(BrokerError::Connect {
            uri: redact(uri),
            source: None,
        }),
    }
}

/// The URI without its password, for messages and logs.
pub fn redact(uri: &str) -> String {
    let Some(scheme_end) = uri.find("://").map(|i| i + 3) else {
        return uri.to_string();
    };
    let rest = &uri[scheme_end..];
    let Some(at) = rest.find('@') else {
        return uri.to_string();
    };
    let userinfo = &rest[..at];
    match userinfo.find(':') {
        Some(colon) => format!(
            "{}{}:***{}",
            &uri[..scheme_end],
            &userinfo[..colon],
            &rest[at..]
        ),
        None => uri.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn redact_hides_only_the_password() {
        assert_eq!(
            redact("amqp://guest:secret@127.0.0.1:5672/%2f"),
            "amqp://guest:***@127.0.0.1:5672/%2f"
        );
        assert_eq!(redact("amqp://127.0.0.1:5672"), "amqp://127.0.0.1:5672");
        assert_eq!(redact("amqp://user@h"), "amqp://user@h");
    }
}
