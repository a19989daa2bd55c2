//! `narrator serve` (docs/SERVE.md): narrator over HTTP, from one process. The server
//! loads one voice's engine and serves:
//!
//! - the jobs API ([`api`]): books made by the server itself in its data folder
//!   ([`jobs`], the library path of `narrator run`) or handed to the fleet ([`fleet`], the
//!   intake's path), behind one [`backend::Backend`];
//! - OpenAI-compatible speech ([`speech`]), streamed sentence by sentence;
//! - the web page ([`pages`]), `/openapi.json` ([`openapi`]), `/metrics`, `/healthz`,
//!   `/readyz`;
//! - bearer tokens and tenants ([`auth`]).
//!
//! The binary parses the flags, loads the engine ([`narrator_pipeline::load`]) and
//! connects the fleet; this crate owns the routes ([`router`]).

pub mod api;
pub mod auth;
pub mod backend;
pub mod error;
pub mod fleet;
pub mod jobs;
pub mod openapi;
pub mod pages;
pub mod speech;

use std::future::Future;
use std::sync::Arc;

use axum::Router;
use axum::extract::{DefaultBodyLimit, State};
use axum::routing::{get, post};
use axum::{Json, response::IntoResponse};
use narrator_engine::Voice;
use narrator_pipeline::synth::Synthesizer;
use serde_json::json;
use std::path::PathBuf;

pub use error::ApiError;

/// OpenAI's voice names: each is spoken by the server's voice unless the configuration
/// maps it elsewhere (only one voice is loaded for now).
pub const OPENAI_VOICES: [&str; 11] = [
    "alloy", "ash", "ballad", "coral", "echo", "fable", "nova", "onyx", "sage", "shimmer", "verse",
];

/// The model names `POST /v1/audio/speech` accepts: OpenAI's, and `narrator`.
pub const MODELS: [&str; 4] = ["narrator", "tts-1", "tts-1-hd", "gpt-4o-mini-tts"];

/// The largest request body accepted (413 beyond).
pub const MAX_BODY_BYTES: usize = 1 << 20;

/// What the server runs with.
pub struct ServeConfig {
    /// `HOST:PORT` to listen on (`:0` picks a free port, printed).
    pub listen: String,
    /// The voice it speaks with, and its loaded engine.
    pub voice: Voice,
    pub synth: Arc<Synthesizer>,
    /// The longest `input` accepted, in characters (413 beyond).
    pub max_input_chars: usize,
    /// Silences between sentences and paragraphs.
    pub pauses: narrator_audio::Pauses,
    /// Sentences of one request synthesized at once (the batches the engine keeps in
    /// flight, [`narrator_pipeline::load::Loaded::in_flight`]).
    pub parallel: usize,
    /// Where jobs are kept (`None`: no jobs API).
    pub data: Option<PathBuf>,
    /// Jobs made at once.
    pub jobs: usize,
    /// Where voices are looked up.
    pub voices_dir: PathBuf,
    /// The largest book a job may bring, in bytes (413 beyond).
    pub max_input_bytes: u64,
    /// The tokens it accepts (none: everything is the tenant `local`, and the server
    /// must listen on loopback).
    pub tokens: auth::Tokens,
    /// Speech requests one tenant may have in progress at once (429 beyond); with
    /// tokens only (without, all requests are one tenant's).
    pub speech_per_tenant: usize,
    /// Origins whose pages may call the API (CORS); none: no CORS headers.
    pub cors_origins: Vec<String>,
    /// The fleet to hand jobs to (`None`: the server makes them in `data`).
    pub fleet: Option<fleet::FleetJobs>,
    /// `/metrics` without a token (for a scraper inside the network).
    pub metrics_open: bool,
}

/// The routes' shared state.
pub struct AppState {
    pub voice: Voice,
    pub synth: Arc<Synthesizer>,
    pub max_input_chars: usize,
    pub pauses: narrator_audio::Pauses,
    pub parallel: usize,
    /// Speech requests being spoken now.
    pub active: std::sync::atomic::AtomicUsize,
    /// The jobs (`None` without a data folder or a fleet).
    pub jobs: Option<backend::Backend>,
    /// The largest book a job may bring, in bytes.
    pub max_input_bytes: u64,
    pub tokens: auth::Tokens,
    pub speech_slots: Arc<auth::SpeechSlots>,
    /// The voice's preview, once made.
    pub preview: tokio::sync::OnceCell<axum::body::Bytes>,
    /// Renders `/metrics`.
    pub metrics: Option<metrics_exporter_prometheus::PrometheusHandle>,
    /// `/metrics` without a token.
    pub metrics_open: bool,
}

/// The server's routes.
pub fn router(state: Arc<AppState>) -> Router {
    // A book, and the form around it.
    let upload_limit = usize::try_from(state.max_input_bytes)
        .unwrap_or(usize::MAX)
        .saturating_add(64 * 1024);
    let api = Router::new()
        .route("/v1/models", get(models))
        .route("/v1/voices", get(voices))
        .route("/v1/voices/{name}/preview", get(speech::preview))
        .route("/v1/audio/speech", post(speech::speak))
        .route(
            "/v1/jobs",
            post(api::create)
                .layer(DefaultBodyLimit::max(upload_limit))
                .get(api::list),
        )
        .route("/v1/jobs/{id}", get(api::get).delete(api::delete))
        .route("/v1/jobs/{id}/events", get(api::events))
        .route("/v1/jobs/{id}/cancel", post(api::cancel))
        .route("/v1/jobs/{id}/retry", post(api::retry))
        .route("/v1/jobs/{id}/outputs/{name}", get(api::output))
        .route("/v1/workers", get(api::workers))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            auth::require_token,
        ));
    let mut metrics = Router::new().route("/metrics", get(prometheus));
    if !state.metrics_open {
        metrics = metrics.layer(axum::middleware::from_fn_with_state(
            state.clone(),
            auth::require_token,
        ));
    }
    let pages = Router::new()
        .route("/", get(pages::index))
        .route(
            "/jobs",
            post(pages::submit).layer(DefaultBodyLimit::max(upload_limit)),
        )
        .route("/jobs/{id}", get(pages::job))
        .route("/workers", get(pages::workers))
        .route("/jobs/{id}/{action}", post(pages::act))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            pages::page_tenant,
        ));
    Router::new()
        .route("/healthz", get(healthz))
        .route("/openapi.json", get(openapi::serve))
        .route("/readyz", get(readyz))
        .route("/signin", get(pages::signin_form).post(pages::signin))
        .route("/signout", post(pages::signout))
        .route("/static/{name}", get(pages::asset))
        .merge(api)
        .merge(pages)
        .merge(metrics)
        .layer(axum::middleware::from_fn(count_request))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(state)
}

/// Serves until `shutdown` resolves. Prints `narrator serve: listening on http://ADDR`
/// to stderr once bound.
pub async fn run(
    config: ServeConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(&config.listen)
        .await
        .map_err(|e| {
            anyhow::anyhow!(
                "cannot listen on {}: {e}; choose another --listen address (HOST:PORT)",
                config.listen
            )
        })?;
    let addr = listener.local_addr()?;
    let embedded = match (&config.data, &config.fleet) {
        (Some(data), None) => Some(jobs::Jobs::open(
            data,
            jobs::JobEngine {
                voice: config.voice.clone(),
                voices_dir: config.voices_dir.clone(),
                synth: config.synth.clone(),
                in_flight: config.parallel,
                max_input_bytes: config.max_input_bytes,
            },
            config.jobs,
        )?),
        _ => None,
    };
    let jobs = match config.fleet {
        Some(fleet) => Some(backend::Backend::Fleet(Arc::new(fleet))),
        None => embedded.clone().map(backend::Backend::Embedded),
    };
    // Without tokens every request is the one tenant `local`: no limit among them.
    let speech_limit = if config.tokens.is_empty() {
        usize::MAX
    } else {
        config.speech_per_tenant.max(1)
    };
    let state = Arc::new(AppState {
        voice: config.voice,
        synth: config.synth,
        max_input_chars: config.max_input_chars,
        pauses: config.pauses,
        parallel: config.parallel,
        active: std::sync::atomic::AtomicUsize::new(0),
        jobs,
        max_input_bytes: config.max_input_bytes,
        tokens: config.tokens,
        speech_slots: Arc::new(auth::SpeechSlots::new(speech_limit)),
        preview: tokio::sync::OnceCell::new(),
        metrics: match narrator_telemetry::metrics::install() {
            Ok(h) => Some(h),
            Err(e) => {
                tracing::warn!(error = %e, "no /metrics: the Prometheus recorder did not install");
                None
            }
        },
        metrics_open: config.metrics_open,
    });
    let mut app = router(state);
    if !config.cors_origins.is_empty() {
        app = app.layer(cors(&config.cors_origins)?);
    }
    eprintln!("narrator serve: listening on http://{addr}");
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await?;
    if let Some(jobs) = embedded {
        // The jobs being made keep what they made and are queued again next start.
        jobs.close().await;
    }
    Ok(())
}

/// CORS for these origins only: the API's methods, and the headers a page sends
/// (`Authorization`, `Content-Type`, `Range`).
fn cors(origins: &[String]) -> anyhow::Result<tower_http::cors::CorsLayer> {
    use axum::http::{HeaderValue, Method, header};
    let origins = origins
        .iter()
        .map(|o| {
            HeaderValue::from_str(o.trim_end_matches('/')).map_err(|_| {
                anyhow::anyhow!(
                    "--cors-origin {o:?} is not an origin; give one as https://host[:port]"
                )
            })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    Ok(tower_http::cors::CorsLayer::new()
        .allow_origin(origins)
        .allow_methods([Method::GET, Method::POST, Method::DELETE])
        .allow_headers([header::AUTHORIZATION, header::CONTENT_TYPE, header::RANGE])
        .expose_headers([
            header::CONTENT_RANGE,
            header::LOCATION,
            header::RETRY_AFTER,
            header::HeaderName::from_static("x-sample-rate"),
        ]))
}

/// Counts every request by its route's template, method and status, and times it to its
/// response's head.
async fn count_request(
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let route = req
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .map_or("unmatched", |p| p.as_str())
        .to_string();
    let method = req.method().as_str().to_string();
    let started = std::time::Instant::now();
    let res = next.run(req).await;
    let status = res.status().as_u16().to_string();
    metrics::histogram!(narrator_telemetry::metrics::HTTP_REQUEST_SECONDS, "route" => route.clone(), "method" => method.clone())
        .record(started.elapsed().as_secs_f64());
    metrics::counter!(narrator_telemetry::metrics::HTTP_REQUESTS, "route" => route, "method" => method, "status" => status)
        .increment(1);
    res
}

/// `GET /metrics`: Prometheus text (the requests, the speech in progress, the engine's
/// runs and the segments the embedded jobs made); needs a token unless `--metrics-open`.
async fn prometheus(State(state): State<Arc<AppState>>) -> axum::response::Response {
    metrics::gauge!(narrator_telemetry::metrics::SPEECH_ACTIVE)
        .set(state.active.load(std::sync::atomic::Ordering::Relaxed) as f64);
    match &state.metrics {
        Some(h) => (
            [(
                axum::http::header::CONTENT_TYPE,
                "text/plain; version=0.0.4",
            )],
            h.render(),
        )
            .into_response(),
        None => axum::http::StatusCode::SERVICE_UNAVAILABLE.into_response(),
    }
}

/// `GET /healthz`: 200 once the engine is loaded (it is before the server listens).
#[utoipa::path(get, path = "/healthz", tag = "health",
    responses((status = 200, description = "ok", content_type = "text/plain")))]
pub async fn healthz() -> &'static str {
    "ok\n"
}

/// `GET /readyz`: 200 once the engine is loaded and jobs can be taken (the jobs' folder
/// can be written; in the fleet, the database answers); 503 otherwise.
#[utoipa::path(get, path = "/readyz", tag = "health",
    responses(
        (status = 200, description = "ready", content_type = "text/plain"),
        (status = 503, description = "Jobs cannot be taken now (Retry-After)", body = error::ErrorBody),
    ))]
pub async fn readyz(State(state): State<Arc<AppState>>) -> Result<&'static str, ApiError> {
    if let Some(jobs) = &state.jobs {
        jobs.ready().await?;
    }
    Ok("ready\n")
}

/// `GET /v1/models`, as OpenAI lists them.
#[utoipa::path(get, path = "/v1/models", tag = "speech",
    responses(
        (status = 200, description = "The model names /v1/audio/speech takes, as OpenAI lists models", body = Object),
        (status = 401, description = "No token, or one this server does not know (with tokens)", body = error::ErrorBody),
    ))]
pub async fn models() -> impl IntoResponse {
    let data: Vec<_> = MODELS
        .iter()
        .map(|id| json!({"id": id, "object": "model", "created": 0, "owned_by": "narrator"}))
        .collect();
    Json(json!({"object": "list", "data": data}))
}

/// `GET /v1/voices`: the voice this server speaks with, and the OpenAI names it answers to.
#[utoipa::path(get, path = "/v1/voices", tag = "speech",
    responses(
        (status = 200, description = "The voices: name, family, language, gender, quality, sample rate, and the OpenAI names each answers to", body = Object),
        (status = 401, description = "No token, or one this server does not know (with tokens)", body = error::ErrorBody),
    ))]
pub async fn voices(State(state): State<Arc<AppState>>) -> impl IntoResponse {
    let info = state.voice.info();
    Json(json!({"voices": [{
        "name": state.voice.name,
        "family": info.family,
        "language": info.language,
        "gender": info.gender,
        "quality": info.quality,
        "sample_rate": info.sample_rate,
        "openai_names": OPENAI_VOICES,
    }]}))
}
