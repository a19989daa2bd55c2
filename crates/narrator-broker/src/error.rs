//! The broker's errors, each with a stable kind word for [`narrator_core::SeamError`].

use narrator_core::{RetryClass, SeamError};

/// What went wrong talking to RabbitMQ.
#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    /// The broker could not be reached (or did not answer in time, or its TLS certificate
    /// was refused).
    #[error("cannot connect to RabbitMQ at {uri}: {cause}")]
    Connect {
        /// The URI, password redacted.
        uri: String,
        /// What failed and what to do, in words.
        cause: String,
        /// The cause; `None` on a timeout.
        #[source]
        source: Option<Box<lapin::Error>>,
    },
    /// The CA file given for `amqps://` cannot be read.
    #[error(
        "cannot read the RabbitMQ CA file {}: {source}; give a PEM file (NARRATOR_AMQP_CA_FILE)",
        .path.display()
    )]
    CaFile {
        /// The file.
        path: std::path::PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// An AMQP operation failed.
    #[error("RabbitMQ {op} failed: {source}")]
    Amqp {
        /// What was being done, e.g. `queue.declare narrator.dead`.
        op: String,
        /// The cause.
        #[source]
        source: lapin::Error,
    },
    /// The broker nacked a publish: it did not take responsibility for the message.
    #[error("RabbitMQ refused (nacked) a message for {exchange:?}/{routing_key}")]
    Nacked {
        /// Exchange published to (`""` is the default exchange).
        exchange: String,
        /// Routing key.
        routing_key: String,
    },
    /// A mandatory publish matched no queue and came back.
    #[error(
        "RabbitMQ returned a message for {exchange:?}/{routing_key} as unroutable ({reply_code} {reply_text}): is the queue declared?"
    )]
    Returned {
        /// Exchange published to.
        exchange: String,
        /// Routing key.
        routing_key: String,
        /// AMQP reply code (312 NO_ROUTE).
        reply_code: u16,
        /// Broker's text.
        reply_text: String,
    },
    /// Publisher confirms were not enabled on the channel (a bug).
    #[error("publisher confirms are not enabled on this channel")]
    NotConfirmed,
    /// A message could not be encoded.
    #[error("cannot encode a segment message: {0}")]
    Encode(#[source] serde_json::Error),
    /// A message body is not a segment message this version understands.
    #[error("malformed segment message: {0}")]
    Malformed(String),
    /// A message of another cluster: the worker's database is not its broker's.
    #[error(
        "queue {queue} holds a message of cluster {message}, but this worker's database is cluster {database}: \
         the worker is pointed at another database than the producer's; left the message in the queue \
         (give the worker the database URL `narrator submit` used)"
    )]
    WrongCluster {
        /// The queue.
        queue: String,
        /// The message's cluster id.
        message: String,
        /// The database's cluster id.
        database: String,
    },
}

impl BrokerError {
    /// A failed connection to `uri`, its cause named: a TLS certificate problem, no
    /// answer in time, or the broker away.
    pub(crate) fn connect(uri: &str, source: Option<lapin::Error>) -> Self {
        let tls = source
            .as_ref()
            .and_then(|e| narrator_net::tls_problem(e as &(dyn std::error::Error + 'static)));
        let cause = match (&source, tls) {
            (_, Some(problem)) => {
                format!("{problem}; for a private CA set NARRATOR_AMQP_CA_FILE (--amqp-ca-file)")
            }
            (None, None) => format!(
                "no answer within {} s; start it (`rabbitmq-server -detached`) or check the host and port in NARRATOR_AMQP_URL",
                crate::CONNECT_TIMEOUT.as_secs()
            ),
            (Some(e), None) => {
                format!("{e}; start it (`rabbitmq-server -detached`) or set NARRATOR_AMQP_URL")
            }
        };
        Self::Connect {
            uri: narrator_net::redact(uri),
            cause,
            source: source.map(Box::new),
        }
    }

    /// Wraps a lapin error with the operation that failed.
    pub fn amqp(op: impl Into<String>, source: lapin::Error) -> Self {
        Self::Amqp {
            op: op.into(),
            source,
        }
    }

    /// How a failure of this kind is retried: the broker being away or refusing is an
    /// outage; a message that cannot be encoded or read never gets better.
    pub fn retry_class(&self) -> RetryClass {
        match self {
            Self::Connect { .. } | Self::Amqp { .. } | Self::Nacked { .. } => {
                RetryClass::Infrastructure
            }
            Self::Returned { .. } | Self::NotConfirmed => RetryClass::Transient,
            Self::Encode(_) | Self::CaFile { .. } => RetryClass::Permanent,
            Self::Malformed(_) => RetryClass::Malformed,
            Self::WrongCluster { .. } => RetryClass::Permanent,
        }
    }

    /// Stable kind word (metric label, `failure_kind`).
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Connect { .. } => "broker_unreachable",
            Self::CaFile { .. } => "broker_config",
            Self::Amqp { .. } | Self::NotConfirmed => "broker",
            Self::Nacked { .. } => "broker_nacked",
            Self::Returned { .. } => "broker_unroutable",
            Self::Encode(_) => "message_encode",
            Self::Malformed(_) => "message_malformed",
            Self::WrongCluster { .. } => "wrong_cluster",
        }
    }
}

impl From<BrokerError> for SeamError {
    fn from(e: BrokerError) -> Self {
        let kind = e.kind();
        let message = e.to_string();
        SeamError::new(kind, e.retry_class(), message, e)
    }
}
