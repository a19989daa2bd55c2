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
pub use decide::{Decision, FailureKind, MAX_ATTEMPTS, POSTPONE_BUDGET, decide, within_budget};
pub use error::BrokerError;
pub use message::{MESSAGE_VERSION, SegmentMessage};
pub use publisher::Publisher;
pub use topology::{
    DEAD_LETTER_EXCHANGE, DEAD_LETTER_QUEUE, DEFAULT_DELIVERY_LIMIT, EVENTS_EXCHANGE,
    INTAKE_CODE_HEADER, INTAKE_DEAD_EXCHANGE, INTAKE_DEAD_QUEUE, INTAKE_DELIVERY_LIMIT,
    INTAKE_QUEUE, INTAKE_REASON_HEADER, JOBS_EXCHANGE, LANES, RETRY_EXCHANGE, RETRY_TIERS,
    TopologyConfig, declare, declare_intake, declare_with, delete_voice_queues, lane_of,
    lane_queue, retry_queue, work_queue,
};

/// Header: attempts made before this message was (re)published to a retry tier.
pub const ATTEMPTS_HEADER: &str = "x-narrator-attempts";
/// Header: why a message was dead-lettered by [`Consumer::settle`].
pub const DEAD_REASON_HEADER: &str = "x-narrator-dead-reason";
/// Header: the retry tier a message is routed to (`5s`, `30s`, `300s`).
pub const RETRY_TIER_HEADER: &str = "x-narrator-retry-tier";
/// Header on a postponed message: when it was first postponed (ms since the Unix epoch);
/// the postponement budget counts from it.
pub const POSTPONED_SINCE_HEADER: &str = "x-narrator-postponed-since";
/// W3C trace context: the trace and parent span of the job a segment belongs to.
pub const TRACEPARENT_HEADER: &str = "traceparent";
/// W3C trace context: vendor state.
pub const TRACESTATE_HEADER: &str = "tracestate";

/// How long [`connect`] waits for the broker before it gives up.
pub const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

pub use narrator_net::redact;

/// Connects with lapin's automatic recovery enabled (it replays exchanges, queues,
/// bindings, consumers, confirm mode and, since lapin 4.12.3, `basic_qos`).
/// Must run inside a Tokio runtime.
pub async fn connect(uri: &str) -> Result<lapin::Connection, BrokerError> {
    connect_with(uri, "narrator", None).await
}

/// [`connect`] with a connection name (shown by `rabbitmqctl list_connections
/// client_properties` and the management UI).
pub async fn connect_named(uri: &str, name: &str) -> Result<lapin::Connection, BrokerError> {
    connect_with(uri, name, None).await
}

/// [`connect_named`] trusting, for `amqps://`, the CA certificates (PEM) in `ca_file` as
/// well as the system's store. The server's certificate must be valid for the URI's host.
pub async fn connect_with(
    uri: &str,
    name: &str,
    ca_file: Option<&std::path::Path>,
) -> Result<lapin::Connection, BrokerError> {
    let cert_chain = match ca_file {
        Some(path) => {
            Some(
                std::fs::read_to_string(path).map_err(|source| BrokerError::CaFile {
                    path: path.to_owned(),
                    source,
                })?,
            )
        }
        None => None,
    };
    let props = lapin::ConnectionProperties::default().with_connection_name(name.into());
    let recovering = open(uri, props.clone().enable_auto_recover(), cert_chain.clone());
    match tokio::time::timeout(CONNECT_TIMEOUT, recovering).await {
        Ok(Ok(conn)) => Ok(conn),
        // With automatic recovery lapin retries the first connection too (with backoff),
        // so a refused certificate looks like no answer. One attempt without retries
        // names the cause.
        _ => {
            let once = open(uri, props, cert_chain);
            match tokio::time::timeout(CONNECT_TIMEOUT / 2, once).await {
                Ok(Err(source)) => Err(BrokerError::connect(uri, Some(source))),
                Ok(Ok(conn)) => {
                    let _ = conn.close(200, "diagnostic connection".into()).await;
                    Err(BrokerError::connect(uri, None))
                }
                Err(_) => Err(BrokerError::connect(uri, None)),
            }
        }
    }
}

async fn open(
    uri: &str,
    props: lapin::ConnectionProperties,
    cert_chain: Option<String>,
) -> lapin::Result<lapin::Connection> {
    lapin::DefaultConnectionBuilder::new()?
        .with_uri_str(uri.to_owned())
        .with_properties(props)
        .with_tls_config(lapin::tcp::OwnedTLSConfig {
            identity: None,
            cert_chain,
        })
        .connect()
        .await
}
