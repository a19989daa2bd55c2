//! JSON log lines: `{"timestamp", "level", "target", "message", fields..., "span",
//! "trace_id", "span_id"}`, one per event on stderr. The ids are those of the
//! OpenTelemetry span the event happened in, so a log line finds its trace.

use std::io::Write;

use opentelemetry::trace::TraceContextExt;
use serde_json::{Map, Value};
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;

/// The layer: writes each event as one JSON object on stderr.
#[derive(Debug, Default)]
pub struct JsonLayer {
    dispatch: std::sync::OnceLock<tracing::dispatcher::WeakDispatch>,
}

impl JsonLayer {
    /// Lines to stderr.
    pub fn stderr() -> Self {
        Self::default()
    }
}

struct Fields<'a>(&'a mut Map<String, Value>);

impl Visit for Fields<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().into(), Value::from(value));
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(field.name().into(), Value::from(value));
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().into(), Value::from(value));
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.0.insert(field.name().into(), Value::from(value));
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.insert(field.name().into(), Value::from(value));
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0
            .insert(field.name().into(), Value::from(format!("{value:?}")));
    }
}

impl<S> tracing_subscriber::Layer<S> for JsonLayer
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_register_dispatch(&self, subscriber: &tracing::Dispatch) {
        let _ = self.dispatch.set(subscriber.downgrade());
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let meta = event.metadata();
        let mut line = Map::new();
        let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
        line.insert("timestamp".into(), Value::from(now));
        line.insert("level".into(), Value::from(meta.level().as_str()));
        line.insert("target".into(), Value::from(meta.target()));
        let mut fields = Map::new();
        event.record(&mut Fields(&mut fields));
        if let Some(message) = fields.remove("message") {
            line.insert("message".into(), message);
        }
        line.extend(fields);
        if let Some(span) = ctx.event_span(event) {
            line.insert("span".into(), Value::from(span.name()));
            let dispatch = self.dispatch.get().and_then(|d| d.upgrade());
            if let Some(cx) = dispatch
                .as_ref()
                .and_then(|d| tracing_opentelemetry::get_otel_context(&span.id(), d))
            {
                let sc = cx.span().span_context().clone();
                if sc.is_valid() {
                    line.insert("trace_id".into(), Value::from(sc.trace_id().to_string()));
                    line.insert("span_id".into(), Value::from(sc.span_id().to_string()));
                }
            }
        }
        let mut out = serde_json::to_vec(&Value::Object(line)).unwrap_or_default();
        out.push(b'\n');
        let _ = std::io::stderr().lock().write_all(&out);
    }
}
