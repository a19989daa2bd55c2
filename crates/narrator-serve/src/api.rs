//! The jobs API (docs/SERVE.md): `POST /v1/jobs` (JSON, the intake request's fields, or
//! multipart with the book in a part named `file`), `GET /v1/jobs`, `GET /v1/jobs/{id}`,
//! its events as Server-Sent Events, cancel, retry, delete, and its outputs with HTTP
//! Range.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::{Extension, FromRequest, Multipart, Path, Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::{Stream, StreamExt};
use narrator_text::InputFormat;
use narrator_worker::intake::{JobRequest, REQUEST_VERSION, TextFormat, parse_request};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use uuid::Uuid;

use crate::auth::Tenant;
use crate::backend::{Backend, OutputAt};
use crate::error::ErrorBody;
use crate::jobs::{Job, JobState, ListFilter, Submission, refused};
use crate::{ApiError, AppState};

fn jobs(state: &AppState) -> Result<&Backend, ApiError> {
    state.jobs.as_ref().ok_or_else(|| {
        ApiError::with(
            StatusCode::SERVICE_UNAVAILABLE,
            "jobs_off",
            "this server runs no jobs; start it with a --data folder",
        )
    })
}

fn job_id(id: &str) -> Result<Uuid, ApiError> {
    id.parse().map_err(|_| {
        ApiError::with(
            StatusCode::NOT_FOUND,
            "job_not_found",
            format!("{id:?} is not a job id; job ids are UUIDs, as POST /v1/jobs answers them"),
        )
    })
}

/// `POST /v1/jobs`: 201 with the job (and `Location`), or 200 with the job an earlier
/// request of the same `idempotency_key` made.
#[utoipa::path(post, path = "/v1/jobs", tag = "jobs",
    request_body(content(
        (crate::openapi::JobRequestDoc = "application/json"),
        (crate::openapi::JobFormDoc = "multipart/form-data"),
    ), description = "The book: JSON with the text, or a form with the file"),
    responses(
        (status = 201, description = "The job, queued", body = JobBody, headers(("Location" = String, description = "The job's URL"))),
        (status = 200, description = "The job an earlier request with the same idempotency_key made", body = JobBody),
        (status = 400, description = "A request the schema refuses", body = ErrorBody),
        (status = 401, description = "No token, or one this server does not know (with tokens)", body = ErrorBody),
        (status = 413, description = "The book is over --max-input-mb", body = ErrorBody),
        (status = 415, description = "Neither JSON nor multipart, or a file that is no book", body = ErrorBody),
        (status = 422, description = "A book that does not read (nothing speakable, a broken EPUB)", body = ErrorBody),
        (status = 503, description = "The fleet is out of reach", body = ErrorBody),
        (status = 507, description = "The job could not be stored", body = ErrorBody)
    ))]
pub async fn create(
    State(state): State<Arc<AppState>>,
    Extension(Tenant(tenant)): Extension<Tenant>,
    req: Request,
) -> Response {
    match create_job(&state, &tenant, req).await {
        Ok((job, created)) => {
            let status = if created {
                StatusCode::CREATED
            } else {
                StatusCode::OK
            };
            let mut res = (status, Json(job_json(&job))).into_response();
            if let Ok(v) = HeaderValue::from_str(&format!("/v1/jobs/{}", job.id)) {
                res.headers_mut().insert(header::LOCATION, v);
            }
            res
        }
        Err(e) => e.into_response(),
    }
}

pub(crate) async fn create_job(
    state: &Arc<AppState>,
    tenant: &str,
    req: Request,
) -> Result<(Job, bool), ApiError> {
    let jobs = jobs(state)?;
    let content_type = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_ascii_lowercase();
    let submission = if content_type.starts_with("multipart/form-data") {
        let form = Multipart::from_request(req, &()).await.map_err(|e| {
            ApiError::bad(
                "invalid_request",
                format!("the multipart body does not read: {e}"),
            )
        })?;
        from_form(form).await?
    } else if content_type.starts_with("application/json") {
        let body = Bytes::from_request(req, &()).await.map_err(body_error)?;
        from_json(&body)?
    } else {
        return Err(ApiError::with(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            "send the job as application/json (the request's fields, the book in `text`) or multipart/form-data (the book in a part named `file`)",
        ));
    };
    jobs.submit(tenant, submission).await
}

fn body_error(e: axum::extract::rejection::BytesRejection) -> ApiError {
    if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
        ApiError::with(
            StatusCode::PAYLOAD_TOO_LARGE,
            "body_too_large",
            "the request body is over this server's limit (--max-input-mb); split the book",
        )
    } else {
        ApiError::bad("invalid_request", format!("the body does not read: {e}"))
    }
}

/// The request as the intake reads it (`version` may be left out).
fn request_of(mut fields: Map<String, Value>) -> Result<JobRequest, ApiError> {
    if fields.contains_key("source") {
        return Err(ApiError::bad(
            "source_not_supported",
            "this server makes books itself and reads no S3 source; send the book as `text`, or upload it as multipart `file`",
        ));
    }
    fields
        .entry("version")
        .or_insert_with(|| json!(REQUEST_VERSION));
    let bytes = serde_json::to_vec(&Value::Object(fields)).unwrap_or_default();
    parse_request(&bytes).map_err(refused)
}

fn from_json(body: &[u8]) -> Result<Submission, ApiError> {
    let value: Value = serde_json::from_slice(body).map_err(|e| {
        ApiError::bad(
            "not_json",
            format!("the body is not JSON ({e}); send a JSON object with the book in `text`"),
        )
    })?;
    let Value::Object(fields) = value else {
        return Err(ApiError::bad(
            "invalid_request",
            "the body is JSON but not an object; send {\"text\": \"…\", …}",
        ));
    };
    let mut request = request_of(fields)?;
    let text = request.text.take().unwrap_or_default();
    let format = match request.text_format {
        TextFormat::Md => InputFormat::Markdown,
        TextFormat::Txt => InputFormat::Text,
    };
    Ok(Submission {
        fallback_title: first_words(&text),
        request,
        book: text.into_bytes(),
        format,
        source: "text".into(),
    })
}

/// A title for a text without one: its first line with words, cut to about 60
/// characters at a word.
fn first_words(text: &str) -> String {
    let line = text
        .lines()
        .map(|l| l.trim().trim_start_matches('#').trim())
        .find(|l| l.chars().any(char::is_alphanumeric))
        .unwrap_or("text");
    let mut title = String::new();
    for w in line.split_whitespace() {
        if !title.is_empty() && title.len() + w.len() > 60 {
            break;
        }
        if !title.is_empty() {
            title.push(' ');
        }
        title.push_str(w);
    }
    title
}

/// A multipart job: the book in `file` (or `text`), the request's other fields as form
/// fields (`subtitles` repeated or comma-separated, `metadata` as JSON).
async fn from_form(mut form: Multipart) -> Result<Submission, ApiError> {
    let mut fields = Map::new();
    let mut file: Option<(String, Vec<u8>)> = None;
    let bad_part = |e: axum::extract::multipart::MultipartError| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::with(
                StatusCode::PAYLOAD_TOO_LARGE,
                "body_too_large",
                "the upload is over this server's limit (--max-input-mb); split the book",
            )
        } else {
            ApiError::bad(
                "invalid_request",
                format!("a part of the form does not read: {e}"),
            )
        }
    };
    while let Some(field) = form.next_field().await.map_err(bad_part)? {
        let name = field.name().unwrap_or_default().to_string();
        if name == "file" {
            let filename = field.file_name().unwrap_or_default().to_string();
            let bytes = field.bytes().await.map_err(bad_part)?;
            // A form's file input left empty still sends the part, nameless and empty.
            if !(filename.is_empty() && bytes.is_empty()) {
                file = Some((filename, bytes.to_vec()));
            }
            continue;
        }
        let text = field.text().await.map_err(bad_part)?;
        let value = match name.as_str() {
            _ if text.trim().is_empty() => continue,
            "speed" => json!(text.trim().parse::<f64>().map_err(|_| {
                ApiError::bad("invalid_request", format!("speed {text:?} is not a number"))
            })?),
            "chapter_files" => json!(matches!(
                text.trim().to_ascii_lowercase().as_str(),
                "true" | "on" | "1" | "yes"
            )),
            "speaker" => text
                .trim()
                .parse::<u32>()
                .map_or_else(|_| json!(text), |n| json!(n)),
            "metadata" => serde_json::from_str(&text).map_err(|e| {
                ApiError::bad(
                    "invalid_request",
                    format!("metadata is not a JSON object ({e})"),
                )
            })?,
            "subtitles" => {
                let list = fields.entry("subtitles").or_insert_with(|| json!([]));
                if let Value::Array(list) = list {
                    list.extend(
                        text.split(',')
                            .map(str::trim)
                            .filter(|s| !s.is_empty())
                            .map(|s| json!(s)),
                    );
                }
                continue;
            }
            _ => json!(text),
        };
        fields.insert(name, value);
    }
    let Some((filename, bytes)) = file else {
        if fields.contains_key("text") {
            let body = serde_json::to_vec(&Value::Object(fields)).unwrap_or_default();
            return from_json(&body);
        }
        return Err(ApiError::bad(
            "missing_file",
            "the form has no part named `file`; attach the book (.txt, .md or .epub) as `file`, or send its text as `text`",
        ));
    };
    if fields.contains_key("text") {
        return Err(ApiError::bad(
            "invalid_request",
            "the form has both `file` and `text`; send the book once",
        ));
    }
    let format = InputFormat::from_path(std::path::Path::new(&filename)).ok_or_else(|| {
        ApiError::with(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_book",
            format!(
                "{filename:?} is not a book this server reads; upload a .txt, .md or .epub file"
            ),
        )
    })?;
    // The intake's checks want the book in the request; a placeholder stands for it.
    fields.insert("text".into(), json!("file"));
    let mut request = request_of(fields)?;
    request.text = None;
    let name = std::path::Path::new(&filename)
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("book")
        .to_string();
    Ok(Submission {
        fallback_title: narrator_pipeline::book::file_stem(std::path::Path::new(&name)),
        request,
        book: bytes,
        format,
        source: format!("upload:{name}"),
    })
}

/// A job as the API shows it: the record, with its progress and its URL.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct JobBody {
    #[serde(flatten)]
    pub job: Job,
    /// Segments made, as a fraction of all (0 to 1).
    pub progress: f64,
    /// `/v1/jobs/{id}`.
    pub url: String,
}

/// A page of jobs.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct JobList {
    pub data: Vec<JobBody>,
    /// The `cursor` of the next page; null on the last.
    pub next_cursor: Option<Uuid>,
}

/// A job as the API shows it ([`JobBody`]).
pub fn job_json(job: &Job) -> Value {
    let progress = if job.segments == 0 {
        0.0
    } else {
        job.segments_done as f64 / job.segments as f64
    };
    serde_json::to_value(JobBody {
        url: format!("/v1/jobs/{}", job.id),
        job: job.clone(),
        progress,
    })
    .unwrap_or_default()
}

/// `GET /v1/jobs` query.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// Only jobs in this state (queued, running, assembling, done, failed, cancelled).
    pub state: Option<String>,
    /// Only jobs read by this voice.
    pub voice: Option<String>,
    /// At most this many (1 to 100, default 20).
    pub limit: Option<usize>,
    /// `next_cursor` of the page before.
    pub cursor: Option<String>,
}

/// `GET /v1/jobs?state=&voice=&limit=&cursor=`: newest first, `next_cursor` for the
/// next page.
#[utoipa::path(get, path = "/v1/jobs", tag = "jobs", params(ListQuery),
    responses(
        (status = 200, description = "The tenant's jobs, newest first", body = JobList),
        (status = 400, description = "A filter, limit or cursor this server does not take", body = ErrorBody),
        (status = 401, description = "No token, or one this server does not know (with tokens)", body = ErrorBody),
        (status = 503, description = "The fleet is out of reach", body = ErrorBody)
    ))]
pub async fn list(
    State(state): State<Arc<AppState>>,
    Extension(Tenant(tenant)): Extension<Tenant>,
    query: Result<Query<ListQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let jobs = jobs(&state)?;
    let Query(q) = query.map_err(|e| ApiError::bad("invalid_request", e.body_text()))?;
    let state_filter = match q.state.as_deref().filter(|s| !s.is_empty()) {
        Some(s) => Some(JobState::parse(s).map_err(|_| {
            ApiError::bad(
                "invalid_state",
                format!("state {s:?} is not one of {}", JobState::NAMES),
            )
        })?),
        None => None,
    };
    let limit = q.limit.unwrap_or(20);
    if !(1..=100).contains(&limit) {
        return Err(ApiError::bad(
            "invalid_limit",
            format!("limit {limit} is outside 1 to 100"),
        ));
    }
    let after = match q.cursor.as_deref().filter(|s| !s.is_empty()) {
        Some(c) => Some(c.parse::<Uuid>().map_err(|_| {
            ApiError::bad(
                "invalid_cursor",
                format!(
                    "cursor {c:?} is not one this server gave; use next_cursor of the page before"
                ),
            )
        })?),
        None => None,
    };
    let filter = ListFilter {
        state: state_filter,
        voice: q.voice.filter(|v| !v.is_empty()),
        limit,
        after,
    };
    let (page, next) = jobs.list(&tenant, &filter).await?;
    Ok(Json(json!({
        "data": page.iter().map(job_json).collect::<Vec<_>>(),
        "next_cursor": next,
    })))
}

/// `GET /v1/jobs/{id}`.
#[utoipa::path(get, path = "/v1/jobs/{id}", tag = "jobs",
    params(("id" = String, Path, description = "The job's id")),
    responses(
        (status = 200, description = "The job", body = JobBody),
        (status = 401, description = "No token, or one this server does not know (with tokens)", body = ErrorBody),
        (status = 404, description = "No such job of this tenant's", body = ErrorBody),
        (status = 503, description = "The fleet is out of reach", body = ErrorBody)
    ))]
pub async fn get(
    State(state): State<Arc<AppState>>,
    Extension(Tenant(tenant)): Extension<Tenant>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let job = jobs(&state)?.get(&tenant, job_id(&id)?).await?;
    Ok(Json(job_json(&job)))
}

/// `POST /v1/jobs/{id}/cancel`: 202 with the job (it may still be running: its events
/// say when it is cancelled).
#[utoipa::path(post, path = "/v1/jobs/{id}/cancel", tag = "jobs",
    params(("id" = String, Path, description = "The job's id")),
    responses(
        (status = 202, description = "Cancelled, or being cancelled (its events say when)", body = JobBody),
        (status = 401, description = "No token, or one this server does not know (with tokens)", body = ErrorBody),
        (status = 404, description = "No such job of this tenant's", body = ErrorBody),
        (status = 409, description = "The job is done or failed already", body = ErrorBody),
        (status = 503, description = "The fleet is out of reach", body = ErrorBody)
    ))]
pub async fn cancel(
    State(state): State<Arc<AppState>>,
    Extension(Tenant(tenant)): Extension<Tenant>,
    Path(id): Path<String>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let job = jobs(&state)?.cancel(&tenant, job_id(&id)?).await?;
    Ok((StatusCode::ACCEPTED, Json(job_json(&job))))
}

/// `POST /v1/jobs/{id}/retry`.
#[utoipa::path(post, path = "/v1/jobs/{id}/retry", tag = "jobs",
    params(("id" = String, Path, description = "The job's id")),
    responses(
        (status = 202, description = "Queued again", body = JobBody),
        (status = 401, description = "No token, or one this server does not know (with tokens)", body = ErrorBody),
        (status = 404, description = "No such job of this tenant's", body = ErrorBody),
        (status = 409, description = "Only a failed (or, embedded, cancelled) job is retried", body = ErrorBody),
        (status = 503, description = "The fleet is out of reach", body = ErrorBody)
    ))]
pub async fn retry(
    State(state): State<Arc<AppState>>,
    Extension(Tenant(tenant)): Extension<Tenant>,
    Path(id): Path<String>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let job = jobs(&state)?.retry(&tenant, job_id(&id)?).await?;
    Ok((StatusCode::ACCEPTED, Json(job_json(&job))))
}

/// `DELETE /v1/jobs/{id}`: 204.
#[utoipa::path(delete, path = "/v1/jobs/{id}", tag = "jobs",
    params(("id" = String, Path, description = "The job's id")),
    responses(
        (status = 204, description = "Deleted, with its files"),
        (status = 401, description = "No token, or one this server does not know (with tokens)", body = ErrorBody),
        (status = 404, description = "No such job of this tenant's", body = ErrorBody),
        (status = 409, description = "The job is not finished: cancel it first", body = ErrorBody),
        (status = 500, description = "Its files could not be removed", body = ErrorBody),
        (status = 501, description = "Not offered by the fleet gateway", body = ErrorBody),
        (status = 503, description = "The fleet is out of reach", body = ErrorBody)
    ))]
pub async fn delete(
    State(state): State<Arc<AppState>>,
    Extension(Tenant(tenant)): Extension<Tenant>,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    jobs(&state)?.delete(&tenant, job_id(&id)?).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `GET /v1/jobs/{id}/outputs/{name}`, with Range, `ETag` and `Last-Modified`.
#[utoipa::path(get, path = "/v1/jobs/{id}/outputs/{name}", tag = "jobs",
    params(("id" = String, Path, description = "The job's id"),
           ("name" = String, Path, description = "book, manifest, or a file name the job's outputs list"),
           ("Range" = Option<String>, Header, description = "bytes=FIRST-LAST")),
    responses(
        (status = 200, description = "The file, typed by its name (audio/mpeg, audio/ogg, audio/wav, audio/mp4, text/vtt, application/x-subrip, application/json, application/epub+zip)", content_type = "*/*"),
        (status = 206, description = "The range asked for", content_type = "*/*"),
        (status = 307, description = "Fleet: the file's presigned S3 URL (Location)"),
        (status = 304, description = "Not modified since If-Modified-Since"),
        (status = 416, description = "A range outside the file"),
        (status = 401, description = "No token, or one this server does not know (with tokens)", body = ErrorBody),
        (status = 404, description = "No such job, or no such output", body = ErrorBody),
        (status = 409, description = "The job is not done", body = ErrorBody),
        (status = 500, description = "The file could not be read", body = ErrorBody),
        (status = 503, description = "The fleet is out of reach", body = ErrorBody)
    ))]
pub async fn output(
    State(state): State<Arc<AppState>>,
    Extension(Tenant(tenant)): Extension<Tenant>,
    Path((id, name)): Path<(String, String)>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let path = match jobs(&state)?.output(&tenant, job_id(&id)?, &name).await? {
        OutputAt::File(path) => path,
        // The fleet's outputs are in S3: the client follows (and seeks) there.
        OutputAt::Url(url) => return Ok(axum::response::Redirect::temporary(&url).into_response()),
    };
    let mut req = axum::http::Request::new(Body::empty());
    for h in [
        header::RANGE,
        header::IF_RANGE,
        header::IF_MODIFIED_SINCE,
        header::IF_UNMODIFIED_SINCE,
    ] {
        if let Some(v) = headers.get(&h) {
            req.headers_mut().insert(h, v.clone());
        }
    }
    let file_name = path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("output")
        .to_string();
    let res = tower_http::services::ServeFile::new(&path)
        .try_call(req)
        .await
        .map_err(|e| {
            ApiError::with(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                format!("reading {file_name}: {e}"),
            )
        })?;
    let (mut parts, body) = res.into_parts();
    if parts.status == StatusCode::NOT_FOUND {
        return Err(ApiError::with(
            StatusCode::NOT_FOUND,
            "output_gone",
            format!(
                "{file_name} is gone from the server's data folder; retry the job to make it again"
            ),
        ));
    }
    if let Ok(v) = HeaderValue::from_str(&format!("inline; filename=\"{file_name}\"")) {
        parts.headers.insert(header::CONTENT_DISPOSITION, v);
    }
    Ok(Response::from_parts(parts, Body::new(body)))
}

/// `GET /v1/jobs/{id}/events`: Server-Sent Events. `state` first (the job as it is), then
/// `progress` as segments are made and `state` at each change of state; the stream ends
/// after the job's final state (done, failed or cancelled).
#[utoipa::path(get, path = "/v1/jobs/{id}/events", tag = "jobs",
    params(("id" = String, Path, description = "The job's id")),
    responses(
        (status = 200, description = "Server-Sent Events: `state` and `progress`, each with the job (JobBody) as data; the stream ends after the final state", content_type = "text/event-stream"),
        (status = 401, description = "No token, or one this server does not know (with tokens)", body = ErrorBody),
        (status = 404, description = "No such job of this tenant's", body = ErrorBody),
        (status = 503, description = "The fleet is out of reach", body = ErrorBody)
    ))]
pub async fn events(
    State(state): State<Arc<AppState>>,
    Extension(Tenant(tenant)): Extension<Tenant>,
    Path(id): Path<String>,
) -> Result<Sse<impl Stream<Item = Result<SseEvent, Infallible>>>, ApiError> {
    let changes = jobs(&state)?.changes(&tenant, job_id(&id)?).await?;
    let mut last: Option<JobState> = None;
    let stream = changes.map(move |job| {
        let kind = match last {
            Some(s) if s == job.state => "progress",
            _ => "state",
        };
        last = Some(job.state);
        Ok(SseEvent::default()
            .event(kind)
            .json_data(job_json(&job))
            .unwrap_or_else(|_| SseEvent::default().event(kind)))
    });
    Ok(Sse::new(stream).keep_alive(KeepAlive::new().interval(Duration::from_secs(15))))
}

/// One worker of the fleet, as `GET /v1/workers` shows it.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct WorkerBody {
    /// `host:pid`.
    pub id: String,
    pub host: String,
    /// `cpu`, `cuda:0`, …
    pub device: String,
    /// Its batch plan per voice (sessions, threads, batch sizes).
    #[schema(value_type = Object)]
    pub plan: Value,
    /// Segments it made since it started.
    pub segments_done: u64,
    /// Segments it made in the last 10 minutes, and per second over them.
    pub recent_segments: u64,
    pub segments_per_second: f64,
    /// Median RTF of those.
    pub recent_median_rtf: Option<f64>,
    pub started_at: chrono::DateTime<chrono::Utc>,
    pub last_seen: chrono::DateTime<chrono::Utc>,
}

impl From<&narrator_db::WorkerStatus> for WorkerBody {
    fn from(w: &narrator_db::WorkerStatus) -> Self {
        WorkerBody {
            id: w.info.id.clone(),
            host: w.info.host.clone(),
            device: w.info.device.clone(),
            plan: w.info.plan.clone(),
            segments_done: w.segments_done,
            recent_segments: w.recent_segments,
            segments_per_second: w.recent_segments as f64 / 600.0,
            recent_median_rtf: w.recent_median_rtf,
            started_at: w.started_at,
            last_seen: w.last_seen,
        }
    }
}

/// The fleet's workers.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct WorkerList {
    pub data: Vec<WorkerBody>,
}

/// `GET /v1/workers`: the fleet's workers seen in the last minute.
#[utoipa::path(get, path = "/v1/workers", tag = "jobs",
    responses(
        (status = 200, description = "The fleet's workers seen in the last minute", body = WorkerList),
        (status = 401, description = "No token, or one this server does not know (with tokens)", body = ErrorBody),
        (status = 404, description = "This server makes its jobs itself (no --fleet)", body = ErrorBody),
        (status = 503, description = "The fleet is out of reach", body = ErrorBody),
    ))]
pub async fn workers(State(state): State<Arc<AppState>>) -> Result<Json<WorkerList>, ApiError> {
    let workers = jobs(&state)?.workers().await?;
    Ok(Json(WorkerList {
        data: workers.iter().map(WorkerBody::from).collect(),
    }))
}
