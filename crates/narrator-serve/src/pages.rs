//! The web page at `/` (templates in `templates/`, compiled in by askama; plain
//! JavaScript in `static/app.js`, served from the binary): the jobs list with a filter by
//! state, a form to submit a book, and a page per job with its progress, players,
//! downloads, cancel and retry. Every page is rendered on the server and works without
//! JavaScript (forms post, links filter); the script only keeps them live (the job's
//! Server-Sent Events, the list's progress, the voice's preview). With tokens, a sign-in
//! form sets an HttpOnly, SameSite=Strict cookie holding the token.

use std::sync::Arc;

use askama::Template;
use axum::Form;
use axum::extract::{Extension, Path, Query, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{Html, IntoResponse, Redirect, Response};
use chrono::Utc;
use serde::Deserialize;
use uuid::Uuid;

use crate::AppState;
use crate::auth::{COOKIE, Tenant, with_tenant};
use crate::jobs::{Job, JobState, ListFilter};

/// Middleware on the pages: the tenant from the sign-in cookie (or none needed), else
/// the sign-in page.
pub async fn page_tenant(State(state): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    with_tenant(&state, req, next, |_, _| {
        Redirect::to("/signin").into_response()
    })
    .await
}

fn render(t: &impl Template, status: StatusCode) -> Response {
    match t.render() {
        Ok(html) => (status, Html(html)).into_response(),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("the page did not render: {e}"),
        )
            .into_response(),
    }
}

/// `h:mm:ss`.
fn hms(secs: f64) -> String {
    let s = secs.max(0.0).round() as u64;
    format!("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
}

fn age(job: &Job) -> String {
    let s = (Utc::now() - job.created_at).num_seconds().max(0);
    match s {
        0..60 => format!("{s} s ago"),
        60..3600 => format!("{} min ago", s / 60),
        3600..86400 => format!("{} h ago", s / 3600),
        _ => format!("{} days ago", s / 86400),
    }
}

fn percent(job: &Job) -> usize {
    (100 * job.segments_done)
        .checked_div(job.segments)
        .unwrap_or(0)
}

/// A job as the pages show it.
struct JobView {
    id: Uuid,
    title: String,
    state: &'static str,
    segments: usize,
    segments_done: usize,
    percent: usize,
    voice: String,
    format: String,
    audio: String,
    rtf: String,
    source: String,
    created: String,
    age: String,
    error: Option<String>,
    can_cancel: bool,
    can_retry: bool,
    can_delete: bool,
}

impl From<&Job> for JobView {
    fn from(j: &Job) -> Self {
        JobView {
            id: j.id,
            title: j.title.clone(),
            state: j.state.as_str(),
            segments: j.segments,
            segments_done: j.segments_done,
            percent: percent(j),
            voice: j.voice.clone(),
            format: j.format.clone(),
            audio: hms(j.audio_seconds),
            rtf: j.rtf.map_or_else(|| "–".into(), |r| format!("{r:.3}")),
            source: j.source.clone(),
            created: j.created_at.to_rfc3339(),
            age: age(j),
            error: j.error.as_ref().map(|e| e.message.clone()),
            can_cancel: !j.state.is_final(),
            can_retry: matches!(j.state, JobState::Failed | JobState::Cancelled),
            can_delete: j.state.is_final(),
        }
    }
}

struct FilterLink {
    label: &'static str,
    href: String,
    current: bool,
}

struct VoiceOption {
    name: String,
    label: String,
}

#[derive(Template)]
#[template(path = "index.html")]
struct IndexPage {
    signed_in: bool,
    tenant: String,
    error: Option<String>,
    filters: Vec<FilterLink>,
    jobs: Vec<JobView>,
    state_filter: String,
    next_page: Option<String>,
    voices: Vec<VoiceOption>,
}

#[derive(Template)]
#[template(path = "job.html")]
struct JobPage {
    signed_in: bool,
    tenant: String,
    job: JobView,
    players: Vec<Player>,
    downloads: Vec<Download>,
    warnings: Vec<String>,
}

struct Player {
    label: String,
    length: String,
    url: String,
    kind: String,
}

struct Download {
    name: String,
    url: String,
    kind: String,
}

#[derive(Template)]
#[template(path = "signin.html")]
struct SigninPage {
    signed_in: bool,
    tenant: String,
    error: Option<String>,
}

/// The list page's query.
#[derive(Debug, Default, Deserialize)]
pub struct IndexQuery {
    pub state: Option<String>,
    pub cursor: Option<String>,
}

async fn index_page(
    state: &AppState,
    tenant: &str,
    q: &IndexQuery,
    error: Option<String>,
) -> IndexPage {
    let filter_state = q.state.as_deref().and_then(|s| JobState::parse(s).ok());
    let filter = ListFilter {
        state: filter_state,
        voice: None,
        limit: 50,
        after: q.cursor.as_deref().and_then(|c| c.parse().ok()),
    };
    let (jobs, next, error) = match &state.jobs {
        Some(jobs) => match jobs.list(tenant, &filter).await {
            Ok((jobs, next)) => (jobs, next, error),
            Err(e) => (Vec::new(), None, Some(e.message)),
        },
        None => (Vec::new(), None, error),
    };
    let word = filter_state.map_or("", JobState::as_str);
    let filters = std::iter::once(("All", ""))
        .chain(
            ["queued", "running", "done", "failed", "cancelled"]
                .into_iter()
                .map(|s| (s, s)),
        )
        .map(|(label, s)| FilterLink {
            label,
            href: if s.is_empty() {
                "/".into()
            } else {
                format!("/?state={s}")
            },
            current: s == word,
        })
        .collect();
    let info = state.voice.info();
    IndexPage {
        signed_in: !state.tokens.is_empty(),
        tenant: tenant.to_string(),
        error,
        filters,
        jobs: jobs.iter().map(JobView::from).collect(),
        state_filter: word.to_string(),
        next_page: next.map(|id| {
            if word.is_empty() {
                format!("/?cursor={id}")
            } else {
                format!("/?state={word}&cursor={id}")
            }
        }),
        voices: vec![VoiceOption {
            name: state.voice.name.clone(),
            label: format!("{} ({}, {})", state.voice.name, info.language, info.family),
        }],
    }
}

/// `GET /`: the jobs, and the form for a new one.
pub async fn index(
    State(state): State<Arc<AppState>>,
    Extension(Tenant(tenant)): Extension<Tenant>,
    Query(q): Query<IndexQuery>,
) -> Response {
    render(&index_page(&state, &tenant, &q, None).await, StatusCode::OK)
}

/// `POST /jobs`: the form's book made a job (then its page), or the form again with the
/// error.
pub async fn submit(
    State(state): State<Arc<AppState>>,
    Extension(Tenant(tenant)): Extension<Tenant>,
    req: Request,
) -> Response {
    match crate::api::create_job(&state, &tenant, req).await {
        Ok((job, _)) => Redirect::to(&format!("/jobs/{}", job.id)).into_response(),
        Err(e) => render(
            &index_page(&state, &tenant, &IndexQuery::default(), Some(e.message)).await,
            e.status,
        ),
    }
}

fn outputs(job: &Job) -> (Vec<Player>, Vec<Download>) {
    let mut players = Vec::new();
    let mut downloads = Vec::new();
    for o in &job.outputs {
        if let Some(seconds) = o.seconds {
            players.push(Player {
                label: match o.kind.as_str() {
                    "book" => "The whole book".to_string(),
                    _ => o.title.clone().unwrap_or_else(|| o.name.clone()),
                },
                length: hms(seconds),
                url: o.url.clone(),
                kind: o.kind.clone(),
            });
        }
        downloads.push(Download {
            name: o.name.clone(),
            url: o.url.clone(),
            kind: o.kind.clone(),
        });
    }
    (players, downloads)
}

/// `GET /jobs/{id}`.
pub async fn job(
    State(state): State<Arc<AppState>>,
    Extension(Tenant(tenant)): Extension<Tenant>,
    Path(id): Path<String>,
) -> Response {
    let found = match (id.parse::<Uuid>(), &state.jobs) {
        (Ok(uuid), Some(jobs)) => jobs.get(&tenant, uuid).await.ok(),
        _ => None,
    };
    let Some(job) = found else {
        return (
            StatusCode::NOT_FOUND,
            Html(format!(
                "<!doctype html><title>Not found · narrator</title><main><h1>No such job</h1><p>There is no job {} here. <a href=\"/\">Your jobs</a></p></main>",
                askama::filters::escape(&id, askama::filters::Html)
                    .map(|e| e.to_string())
                    .unwrap_or_default()
            )),
        )
            .into_response();
    };
    let (players, downloads) = outputs(&job);
    render(
        &JobPage {
            signed_in: !state.tokens.is_empty(),
            tenant,
            warnings: job.warnings.clone(),
            job: JobView::from(&job),
            players,
            downloads,
        },
        StatusCode::OK,
    )
}

/// `POST /jobs/{id}/{cancel,retry,delete}` from the job page's buttons; back to the page
/// (to the list after a delete).
pub async fn act(
    State(state): State<Arc<AppState>>,
    Extension(Tenant(tenant)): Extension<Tenant>,
    Path((id, action)): Path<(String, String)>,
) -> Response {
    let (Ok(uuid), Some(jobs)) = (id.parse::<Uuid>(), state.jobs.as_ref()) else {
        return Redirect::to("/").into_response();
    };
    let back = format!("/jobs/{uuid}");
    let done = match action.as_str() {
        "cancel" => jobs.cancel(&tenant, uuid).await.map(|_| back),
        "retry" => jobs.retry(&tenant, uuid).await.map(|_| back),
        "delete" => jobs.delete(&tenant, uuid).await.map(|_| "/".to_string()),
        _ => return StatusCode::NOT_FOUND.into_response(),
    };
    match done {
        Ok(to) => Redirect::to(&to).into_response(),
        // The page shows the job as it is (the action did not apply to its state).
        Err(_) => Redirect::to(&format!("/jobs/{uuid}")).into_response(),
    }
}

struct WorkerRow {
    id: String,
    device: String,
    plan: String,
    done: u64,
    recent: u64,
    rate: String,
    rtf: String,
    seen: String,
}

#[derive(Template)]
#[template(path = "workers.html")]
struct WorkersPage {
    signed_in: bool,
    tenant: String,
    /// Instead of the table: why there is none.
    note: Option<String>,
    workers: Vec<WorkerRow>,
}

/// A worker's plan, short: `VOICE SESSIONSxTHREADS bBATCH` per voice.
fn plan_line(plan: &serde_json::Value) -> String {
    let Some(voices) = plan.as_array() else {
        return String::new();
    };
    voices
        .iter()
        .map(|p| {
            format!(
                "{} {}x{} b{}",
                p["voice"].as_str().unwrap_or("?"),
                p["sessions"],
                p["intra_threads"],
                p["max_batch_requests"]
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// `GET /workers`: the fleet's workers (device, plan, segments per second).
pub async fn workers(
    State(state): State<Arc<AppState>>,
    Extension(Tenant(tenant)): Extension<Tenant>,
) -> Response {
    let (note, workers) = match &state.jobs {
        Some(jobs) => match jobs.workers().await {
            Ok(list) => (
                None,
                list.iter()
                    .map(|w| WorkerRow {
                        id: w.info.id.clone(),
                        device: w.info.device.clone(),
                        plan: plan_line(&w.info.plan),
                        done: w.segments_done,
                        recent: w.recent_segments,
                        rate: format!("{:.2}", w.recent_segments as f64 / 600.0),
                        rtf: w
                            .recent_median_rtf
                            .map_or_else(|| "–".into(), |r| format!("{r:.3}")),
                        seen: format!("{} s ago", (Utc::now() - w.last_seen).num_seconds().max(0)),
                    })
                    .collect(),
            ),
            Err(e) => (Some(e.message), Vec::new()),
        },
        None => (Some("This server runs no jobs.".into()), Vec::new()),
    };
    render(
        &WorkersPage {
            signed_in: !state.tokens.is_empty(),
            tenant,
            note,
            workers,
        },
        StatusCode::OK,
    )
}

/// `GET /signin`.
pub async fn signin_form(State(state): State<Arc<AppState>>) -> Response {
    if state.tokens.is_empty() {
        return Redirect::to("/").into_response();
    }
    render(
        &SigninPage {
            signed_in: false,
            tenant: String::new(),
            error: None,
        },
        StatusCode::OK,
    )
}

#[derive(Debug, Deserialize)]
pub struct SigninForm {
    pub token: String,
}

/// `POST /signin`: a valid token is kept in an HttpOnly, SameSite=Strict cookie.
pub async fn signin(State(state): State<Arc<AppState>>, Form(f): Form<SigninForm>) -> Response {
    let token = f.token.trim();
    if state.tokens.tenant(token).is_none() {
        return render(
            &SigninPage {
                signed_in: false,
                tenant: String::new(),
                error: Some("That token is not one this server knows; check it, or ask the operator for a new one.".into()),
            },
            StatusCode::UNAUTHORIZED,
        );
    }
    let mut res = Redirect::to("/").into_response();
    if let Ok(v) = HeaderValue::from_str(&format!(
        "{COOKIE}={token}; HttpOnly; SameSite=Strict; Path=/; Max-Age=2592000"
    )) {
        res.headers_mut().insert(header::SET_COOKIE, v);
    }
    res
}

/// `POST /signout`: the cookie cleared.
pub async fn signout() -> Response {
    let mut res = Redirect::to("/signin").into_response();
    res.headers_mut().insert(
        header::SET_COOKIE,
        HeaderValue::from_static("narrator_token=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0"),
    );
    res
}

/// `GET /static/{name}`: the page's script and style, compiled into the binary.
pub async fn asset(Path(name): Path<String>) -> Response {
    let (body, kind) = match name.as_str() {
        "app.js" => (
            include_str!("../static/app.js"),
            "text/javascript; charset=utf-8",
        ),
        "app.css" => (include_str!("../static/app.css"), "text/css; charset=utf-8"),
        _ => return StatusCode::NOT_FOUND.into_response(),
    };
    ([(header::CONTENT_TYPE, kind)], body).into_response()
}
