//! narrator's telemetry, in one place for every command:
//! - logs on stderr, as text or as JSON lines that carry the trace and span ids
//!   ([`LogFormat`]);
//! - `tracing` spans exported over OTLP (gRPC or HTTP/protobuf) when asked for, configured
//!   by the standard `OTEL_*` environment ([`otlp`]); off by default, and then free: no
//!   exporter, no OpenTelemetry layer, and spans below the log level are never built;
//! - W3C trace context carried with the work, through AMQP headers and the database
//!   ([`propagate`]);
//! - Prometheus metrics and the `/metrics`, `/healthz` and `/readyz` endpoints
//!   ([`metrics`], [`serve`]).

pub mod json;
pub mod metrics;
#[cfg(feature = "otlp")]
pub mod otlp;
pub mod propagate;
#[cfg(feature = "serve")]
pub mod serve;

use tracing_subscriber::Layer;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

pub use propagate::TraceContext;

/// How log lines are written on stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line, with `trace_id` and `span_id` when traces are on.
    Json,
}

impl std::str::FromStr for LogFormat {
    type Err = TelemetryError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "text" => Ok(Self::Text),
            "json" => Ok(Self::Json),
            _ => Err(TelemetryError::LogFormat(s.to_string())),
        }
    }
}

/// What to set up.
#[derive(Debug, Clone)]
pub struct Options {
    /// Log filter (`EnvFilter` syntax, e.g. `warn` or `narrator=debug`).
    pub log: String,
    /// Text or JSON lines.
    pub log_format: LogFormat,
    /// Export spans over OTLP (see [`otlp`] for the environment it reads).
    pub traces: bool,
    /// `service.name` when neither `OTEL_SERVICE_NAME` nor `OTEL_RESOURCE_ATTRIBUTES`
    /// names one (e.g. `narrator-worker`).
    pub service: String,
    /// `service.instance.id` (e.g. the worker's id), when there is one.
    pub instance: Option<String>,
}

/// A telemetry set-up failure.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// `--log-format` is neither text nor json.
    #[error("unknown log format `{0}`: use `text` or `json`")]
    LogFormat(String),
    /// `OTEL_EXPORTER_OTLP_PROTOCOL` names a protocol this build does not speak.
    #[error("{var}={value} is not supported: set it to `grpc` or `http/protobuf` (the default)")]
    Protocol {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
    },
    /// The OTLP exporter could not be built (a malformed endpoint, say).
    #[error("cannot set up the OTLP trace exporter: {0} (check OTEL_EXPORTER_OTLP_ENDPOINT)")]
    Exporter(String),
    /// Traces were asked for, but this build has no OTLP exporter.
    #[error(
        "this narrator was built without OTLP export (cargo feature `otlp`): rebuild with the default features, or leave --otlp and OTEL_TRACES_EXPORTER unset"
    )]
    NoExporter,
    /// The `/metrics` recorder could not be installed.
    #[error("cannot install the Prometheus recorder: {0}")]
    Metrics(String),
    /// The metrics/health listener could not bind.
    #[error("cannot listen on {addr} for /metrics, /healthz and /readyz: {source}")]
    Listen {
        /// The address.
        addr: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

/// The running telemetry: call [`Telemetry::shutdown`] before the process exits so that
/// spans still buffered are exported.
#[derive(Debug)]
pub struct Telemetry {
    provider: Option<opentelemetry_sdk::trace::SdkTracerProvider>,
}

impl Telemetry {
    /// Whether spans are exported.
    pub fn traces_on(&self) -> bool {
        self.provider.is_some()
    }

    /// Exports the spans still buffered and stops the exporter (waits at most the
    /// exporter's timeout). Call it outside the async runtime's worker threads while the
    /// runtime still runs (the export runs on it).
    pub fn shutdown(mut self) {
        // Shutting the provider down exports what its batch processor still holds.
        if let Some(provider) = self.provider.take()
            && let Err(e) = provider.shutdown()
        {
            eprintln!("warning: could not export the last spans: {e}");
        }
    }
}

/// Sets up logging and, when `options.traces`, the OTLP exporter. Call it inside the
/// Tokio runtime (the exporter's batches are sent from a task of it). A second call in a
/// process keeps the first set-up.
pub fn init(options: &Options) -> Result<Telemetry, TelemetryError> {
    let filter = || {
        tracing_subscriber::EnvFilter::try_new(&options.log)
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"))
    };
    let log_layer = match options.log_format {
        // Colours only on a terminal: a log file or a pipe gets plain text.
        LogFormat::Text => tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .with_filter(filter())
            .boxed(),
        LogFormat::Json => json::JsonLayer::stderr().with_filter(filter()).boxed(),
    };
    let provider = if options.traces {
        Some(exporter(options)?)
    } else {
        None
    };
    if let Some(p) = &provider {
        // Spans recorded after the fact (see `propagate::record_interval`) use it.
        opentelemetry::global::set_tracer_provider(p.clone());
    }
    let trace_layer = provider.as_ref().map(|p| {
        use opentelemetry::trace::TracerProvider as _;
        tracing_opentelemetry::layer()
            .with_tracer(p.tracer("narrator"))
            .with_tracked_inactivity(false)
            .with_threads(false)
            .with_filter(span_filter())
    });
    let _ = tracing_subscriber::registry()
        .with(log_layer)
        .with(trace_layer)
        .try_init();
    Ok(Telemetry { provider })
}

#[cfg(feature = "otlp")]
fn exporter(
    options: &Options,
) -> Result<opentelemetry_sdk::trace::SdkTracerProvider, TelemetryError> {
    otlp::provider(&options.service, options.instance.as_deref())
}

#[cfg(not(feature = "otlp"))]
fn exporter(_: &Options) -> Result<opentelemetry_sdk::trace::SdkTracerProvider, TelemetryError> {
    Err(TelemetryError::NoExporter)
}

#[cfg(feature = "otlp")]
fn span_filter() -> tracing_subscriber::filter::Targets {
    otlp::span_filter()
}

/// Never used without an exporter (there is no provider), but the layer's type needs one.
#[cfg(not(feature = "otlp"))]
fn span_filter() -> tracing_subscriber::filter::Targets {
    tracing_subscriber::filter::Targets::new()
}
