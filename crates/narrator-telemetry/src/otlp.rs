//! The OTLP trace exporter, configured by the standard environment:
//! - `OTEL_EXPORTER_OTLP_PROTOCOL` (or `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`): `grpc` or
//!   `http/protobuf` (the default, as the specification says);
//! - `OTEL_EXPORTER_OTLP_ENDPOINT` / `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`,
//!   `..._HEADERS`, `..._TIMEOUT`, `..._COMPRESSION`: read by the exporter itself;
//! - `OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`: the resource;
//! - `OTEL_TRACES_SAMPLER` / `OTEL_TRACES_SAMPLER_ARG`: the sampler;
//! - `OTEL_BSP_SCHEDULE_DELAY`, `OTEL_BSP_MAX_QUEUE_SIZE`, `OTEL_BSP_MAX_EXPORT_BATCH_SIZE`,
//!   `OTEL_BSP_EXPORT_TIMEOUT`: the batch span processor.
//!
//! Batches are exported from a task of the Tokio runtime (both transports are async).

use opentelemetry::KeyValue;
use opentelemetry_otlp::{Protocol, SpanExporter, WithExportConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{BatchConfigBuilder, SdkTracerProvider};
use tracing::Level;
use tracing_subscriber::filter::Targets;

use crate::TelemetryError;

/// Which OTLP transport the environment asks for.
pub fn protocol() -> Result<Protocol, TelemetryError> {
    for var in [
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
        "OTEL_EXPORTER_OTLP_PROTOCOL",
    ] {
        if let Ok(value) = std::env::var(var) {
            let value = value.trim().to_string();
            return match value.as_str() {
                "grpc" => Ok(Protocol::Grpc),
                "http/protobuf" => Ok(Protocol::HttpBinary),
                "" => continue,
                _ => Err(TelemetryError::Protocol { var, value }),
            };
        }
    }
    Ok(Protocol::HttpBinary)
}

fn exporter() -> Result<SpanExporter, TelemetryError> {
    let built = match protocol()? {
        Protocol::Grpc => SpanExporter::builder().with_tonic().build(),
        _ => SpanExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpBinary)
            .build(),
    };
    built.map_err(|e| TelemetryError::Exporter(e.to_string()))
}

/// Whether a resource attribute is set by the environment.
fn named_by_env(key: &str) -> bool {
    let in_attributes = std::env::var("OTEL_RESOURCE_ATTRIBUTES").is_ok_and(|a| {
        a.split(',')
            .any(|kv| kv.trim().starts_with(&format!("{key}=")))
    });
    in_attributes || (key == "service.name" && std::env::var_os("OTEL_SERVICE_NAME").is_some())
}

/// The tracer provider: OTLP exporter, batch processor on Tokio, resource from the
/// environment with `service` (and `instance`) as defaults.
pub fn provider(
    service: &str,
    instance: Option<&str>,
) -> Result<SdkTracerProvider, TelemetryError> {
    let exporter = exporter()?;
    let mut resource = Resource::builder();
    if !named_by_env("service.name") {
        resource = resource.with_service_name(service.to_string());
    }
    if let Some(instance) = instance
        && !named_by_env("service.instance.id")
    {
        resource =
            resource.with_attribute(KeyValue::new("service.instance.id", instance.to_string()));
    }
    resource = resource.with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")));
    let processor =
        opentelemetry_sdk::trace::span_processor_with_async_runtime::BatchSpanProcessor::builder(
            exporter,
            opentelemetry_sdk::runtime::Tokio,
        )
        .with_batch_config(BatchConfigBuilder::default().build())
        .build();
    Ok(SdkTracerProvider::builder()
        .with_span_processor(processor)
        .with_resource(resource.build())
        .build())
}

/// Spans and events exported: narrator's own, at info and above (never the spans of the
/// HTTP/gRPC clients that carry the export, which would trace themselves). A `Targets`
/// filter: next to the log layer's `EnvFilter`, a `filter_fn` per-layer filter lost
/// spans at `--log info` (measured: batch and assembly spans never exported).
pub fn span_filter() -> Targets {
    Targets::new().with_target("narrator", Level::INFO)
}
