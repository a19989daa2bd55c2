//! W3C trace context carried with the work: `submit` starts a book's trace; every segment
//! message carries `traceparent` (and `tracestate`) in its AMQP headers; the job's row
//! keeps it for the assembly. Without an exporter every span context is invalid and
//! nothing is carried.

use std::collections::HashMap;

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::TraceContextExt;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The header that carries the trace and parent span ids.
pub const TRACEPARENT: &str = "traceparent";
/// The header that carries vendor trace state.
pub const TRACESTATE: &str = "tracestate";

pub use narrator_core::TraceContext;

/// The trace context of `span`, when it is recorded (an exporter runs and it is sampled
/// or its parent was).
pub fn context_of(span: &tracing::Span) -> Option<TraceContext> {
    let cx = span.context();
    if !cx.span().span_context().is_valid() {
        return None;
    }
    let mut carrier = HashMap::new();
    TraceContextPropagator::new().inject_context(&cx, &mut carrier);
    Some(TraceContext {
        traceparent: carrier.remove(TRACEPARENT)?,
        tracestate: carrier.remove(TRACESTATE).filter(|s| !s.is_empty()),
    })
}

/// The trace context of the current span.
pub fn current() -> Option<TraceContext> {
    context_of(&tracing::Span::current())
}

fn remote(trace: &TraceContext) -> opentelemetry::Context {
    let mut carrier = HashMap::new();
    carrier.insert(TRACEPARENT.to_string(), trace.traceparent.clone());
    if let Some(state) = &trace.tracestate {
        carrier.insert(TRACESTATE.to_string(), state.clone());
    }
    TraceContextPropagator::new().extract(&carrier)
}

/// Makes `span` a child of the remote span `trace` names (before `span` is entered). A
/// malformed `traceparent` leaves the span a root.
pub fn set_parent(span: &tracing::Span, trace: &TraceContext) {
    let cx = remote(trace);
    if cx.span().span_context().is_valid() {
        let _ = span.set_parent(cx);
    }
}

/// Adds a link from `span` to `to` (a batch span to each segment it carries).
pub fn link(span: &tracing::Span, to: &tracing::Span) {
    let cx = to.context();
    let sc = cx.span().span_context().clone();
    if sc.is_valid() {
        span.add_link(sc);
    }
}

/// Records a span that already happened, from `start` to `end`, as a child of `parent`
/// (the time a segment waited in the queue, or for its batch to form). Nothing without
/// an exporter.
pub fn record_interval(
    parent: &tracing::Span,
    name: &'static str,
    (start, end): (std::time::SystemTime, std::time::SystemTime),
) {
    use opentelemetry::trace::{Span as _, Tracer as _};
    let cx = parent.context();
    if !cx.span().span_context().is_valid() {
        return;
    }
    let tracer = opentelemetry::global::tracer("narrator");
    let mut span = tracer
        .span_builder(name)
        .with_start_time(start.min(end))
        .start_with_context(&tracer, &cx);
    span.end_with_timestamp(end);
}

/// The trace id of `span` (32 hex digits), when recorded.
pub fn trace_id(span: &tracing::Span) -> Option<String> {
    let cx = span.context();
    let sc = cx.span().span_context().clone();
    sc.is_valid().then(|| sc.trace_id().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_malformed_traceparent_is_no_parent() {
        let cx = remote(&TraceContext {
            traceparent: "not-a-traceparent".into(),
            tracestate: None,
        });
        assert!(!cx.span().span_context().is_valid());
        let cx = remote(&TraceContext {
            traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into(),
            tracestate: Some("congo=t61rcWkgMzE".into()),
        });
        let sc = cx.span().span_context().clone();
        assert!(sc.is_valid() && sc.is_remote());
        assert_eq!(
            sc.trace_id().to_string(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert_eq!(sc.trace_state().header(), "congo=t61rcWkgMzE");
    }

    #[test]
    fn without_an_exporter_nothing_is_carried() {
        let span = tracing::info_span!("nothing");
        assert_eq!(context_of(&span), None);
    }
}
