//! An OTLP trace receiver for the tests: decodes the real OTLP protobuf wire format
//! (`opentelemetry-proto`), over gRPC (tonic) or HTTP/protobuf (`POST /v1/traces`), and
//! keeps every span it receives.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use prost::Message;

/// A span as received.
#[derive(Debug, Clone)]
pub struct ReceivedSpan {
    /// 32 hex digits.
    pub trace_id: String,
    /// 16 hex digits.
    pub span_id: String,
    /// Empty for a root span.
    pub parent_span_id: String,
    /// The span's name.
    pub name: String,
    /// The resource's `service.name`.
    pub service: String,
    /// (trace id, span id) of each link.
    pub links: Vec<(String, String)>,
    /// String forms of the span's attributes.
    pub attributes: Vec<(String, String)>,
    /// Start and end, Unix nanoseconds.
    pub start_ns: u64,
    /// End, Unix nanoseconds.
    pub end_ns: u64,
}

impl ReceivedSpan {
    /// An attribute's value.
    pub fn attr(&self, key: &str) -> Option<&str> {
        self.attributes
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

type Store = Arc<Mutex<Vec<ReceivedSpan>>>;

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn value(v: &Option<opentelemetry_proto::tonic::common::v1::AnyValue>) -> String {
    match v.as_ref().and_then(|v| v.value.as_ref()) {
        Some(Value::StringValue(s)) => s.clone(),
        Some(Value::IntValue(i)) => i.to_string(),
        Some(Value::DoubleValue(d)) => d.to_string(),
        Some(Value::BoolValue(b)) => b.to_string(),
        Some(other) => format!("{other:?}"),
        None => String::new(),
    }
}

fn keep(store: &Store, request: ExportTraceServiceRequest) {
    let mut out = store.lock().unwrap_or_else(|e| e.into_inner());
    for rs in request.resource_spans {
        let service = rs
            .resource
            .as_ref()
            .and_then(|r| r.attributes.iter().find(|a| a.key == "service.name"))
            .map(|a| value(&a.value))
            .unwrap_or_default();
        for ss in rs.scope_spans {
            for s in ss.spans {
                out.push(ReceivedSpan {
                    trace_id: hex(&s.trace_id),
                    span_id: hex(&s.span_id),
                    parent_span_id: hex(&s.parent_span_id),
                    name: s.name,
                    service: service.clone(),
                    links: s
                        .links
                        .iter()
                        .map(|l| (hex(&l.trace_id), hex(&l.span_id)))
                        .collect(),
                    attributes: s
                        .attributes
                        .iter()
                        .map(|a| (a.key.clone(), value(&a.value)))
                        .collect(),
                    start_ns: s.start_time_unix_nano,
                    end_ns: s.end_time_unix_nano,
                });
            }
        }
    }
}

struct Grpc(Store);

#[tonic::async_trait]
impl TraceService for Grpc {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        keep(&self.0, request.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

async fn http_export(
    axum::extract::State(store): axum::extract::State<Store>,
    body: axum::body::Bytes,
) -> Result<Vec<u8>, (axum::http::StatusCode, String)> {
    let request = ExportTraceServiceRequest::decode(body).map_err(|e| {
        (
            axum::http::StatusCode::BAD_REQUEST,
            format!("not an OTLP protobuf request: {e}"),
        )
    })?;
    keep(&store, request);
    Ok(ExportTraceServiceResponse::default().encode_to_vec())
}

/// A running receiver.
pub struct OtlpReceiver {
    /// The address it listens on.
    pub addr: SocketAddr,
    store: Store,
    runtime: Option<tokio::runtime::Runtime>,
}

/// The OTLP transport a receiver speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// gRPC (`OTEL_EXPORTER_OTLP_PROTOCOL=grpc`).
    Grpc,
    /// HTTP with protobuf bodies (`http/protobuf`).
    HttpProtobuf,
}

impl OtlpReceiver {
    /// Listens on a free local port.
    pub fn start(transport: Transport) -> Self {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("receiver runtime");
        let store: Store = Arc::default();
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let s = store.clone();
        match transport {
            Transport::Grpc => {
                runtime.spawn(async move {
                    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
                    let _ = tonic::transport::Server::builder()
                        .add_service(TraceServiceServer::new(Grpc(s)))
                        .serve_with_incoming(incoming)
                        .await;
                });
            }
            Transport::HttpProtobuf => {
                let app = axum::Router::new()
                    .route("/v1/traces", axum::routing::post(http_export))
                    .with_state(s);
                runtime.spawn(async move {
                    let _ = axum::serve(listener, app).await;
                });
            }
        }
        Self {
            addr,
            store,
            runtime: Some(runtime),
        }
    }

    /// The environment that points a `narrator` process at this receiver.
    pub fn env(&self, transport: Transport) -> Vec<(&'static str, String)> {
        let protocol = match transport {
            Transport::Grpc => "grpc",
            Transport::HttpProtobuf => "http/protobuf",
        };
        vec![
            ("NARRATOR_OTLP", "true".into()),
            (
                "OTEL_EXPORTER_OTLP_ENDPOINT",
                format!("http://{}", self.addr),
            ),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", protocol.into()),
            ("OTEL_BSP_SCHEDULE_DELAY", "200".into()),
        ]
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<ReceivedSpan> {
        self.store.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Waits until `done` holds for the spans received (or `within` passes); returns them.
    pub fn wait_for(
        &self,
        within: Duration,
        done: impl Fn(&[ReceivedSpan]) -> bool,
    ) -> Vec<ReceivedSpan> {
        let deadline = Instant::now() + within;
        loop {
            let spans = self.spans();
            if done(&spans) || Instant::now() > deadline {
                return spans;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for OtlpReceiver {
    fn drop(&mut self) {
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}
