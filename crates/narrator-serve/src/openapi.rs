//! `GET /openapi.json`: the API as an OpenAPI 3.1 document, generated from the handlers'
//! and types' annotations (utoipa). The JSON job request's schema is the intake's own,
//! `docs/schema/job-request.v1.json`, as this server takes it (no `source`, `version`
//! optional, `text` required).

use axum::Json;
use serde_json::Value;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

use crate::api::{JobBody, JobList, WorkerBody, WorkerList};
use crate::error::{ErrorBody, ErrorDetail};
use crate::jobs::{Job, JobFailure, JobOutput, JobStateDoc};
use crate::speech::SpeechRequest;

/// A job asked for as JSON (its schema is replaced by the intake's, below).
#[derive(utoipa::ToSchema)]
#[schema(as = JobRequest)]
#[allow(dead_code)]
pub(crate) struct JobRequestDoc {
    text: String,
}

/// A job asked for as a form: the book in `file`, the request's other fields beside it.
#[derive(utoipa::ToSchema)]
#[schema(as = JobForm)]
#[allow(dead_code)]
pub(crate) struct JobFormDoc {
    /// The book: a .txt, .md or .epub file (or `text` instead).
    #[schema(value_type = Option<String>, format = Binary)]
    file: Option<Vec<u8>>,
    /// The book's text, when no file is sent.
    text: Option<String>,
    title: Option<String>,
    author: Option<String>,
    language: Option<String>,
    voice: Option<String>,
    speed: Option<f64>,
    /// opus, mp3, m4b, wav or epub3.
    format: Option<String>,
    chapter_files: Option<bool>,
    /// srt and/or vtt (repeated, or comma-separated).
    subtitles: Option<Vec<String>>,
    idempotency_key: Option<String>,
    /// A JSON object, kept with the job.
    metadata: Option<String>,
}

struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "A token from `narrator serve token add NAME`; a server without tokens takes none",
                    ))
                    .build(),
            ),
        );
    }
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "narrator serve",
        description = "Audiobooks as jobs, and OpenAI-compatible speech (docs/SERVE.md). Errors are {\"error\": {\"message\", \"type\", \"code\", \"param\"}}.",
    ),
    paths(
        crate::api::create, crate::api::list, crate::api::get, crate::api::events,
        crate::api::cancel, crate::api::retry, crate::api::delete, crate::api::output,
        crate::api::workers,
        crate::speech::speak, crate::speech::preview, crate::models, crate::voices,
        crate::healthz, crate::readyz,
    ),
    components(schemas(
        Job, JobBody, JobList, JobOutput, JobFailure, JobStateDoc, ErrorBody, ErrorDetail,
        SpeechRequest, JobRequestDoc, JobFormDoc, WorkerBody, WorkerList,
    )),
    modifiers(&BearerAuth),
    security(("bearer" = [])),
)]
struct ApiDoc;

/// The document, with the intake's request schema in place.
pub fn document() -> Value {
    let mut doc = serde_json::to_value(ApiDoc::openapi()).unwrap_or_default();
    if let Some(schemas) = doc
        .pointer_mut("/components/schemas")
        .and_then(Value::as_object_mut)
    {
        schemas.insert("JobRequest".into(), job_request_schema());
    }
    // The health checks need no token.
    for open in ["/healthz", "/readyz"] {
        if let Some(op) = doc
            .pointer_mut(&format!("/paths/{}/get", open.replace('/', "~1")))
            .and_then(Value::as_object_mut)
        {
            op.insert("security".into(), serde_json::json!([]));
        }
    }
    doc
}

/// `docs/schema/job-request.v1.json` as `POST /v1/jobs` takes it.
fn job_request_schema() -> Value {
    let mut schema: Value =
        serde_json::from_str(include_str!("../../../docs/schema/job-request.v1.json"))
            .unwrap_or_default();
    if let Some(s) = schema.as_object_mut() {
        for key in ["$schema", "$id", "oneOf"] {
            s.remove(key);
        }
        s.insert("required".into(), serde_json::json!(["text"]));
        s.insert(
            "description".into(),
            Value::String(
                "A book to narrate: the fields of the intake's request (docs/PRODUCERS.md), the book in text; version may be left out; source is the fleet intake's only."
                    .into(),
            ),
        );
        if let Some(p) = s.get_mut("properties").and_then(Value::as_object_mut) {
            p.remove("source");
        }
    }
    schema
}

/// `GET /openapi.json`.
pub async fn serve() -> Json<Value> {
    Json(document())
}
