//! Errors as OpenAI's API shapes them: a status and
//! `{"error": {"message": "…", "type": "…", "code": "…", "param": null}}`, the message one
//! line that says what was wrong and what to do.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// A request the server refuses, or a failure of its own.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct ApiError {
    pub status: StatusCode,
    /// A stable word for clients.
    pub code: &'static str,
    pub message: String,
    /// Seconds after which the request may be tried again (`Retry-After`, with 429 and 503).
    pub retry_after: Option<u32>,
}

impl ApiError {
    /// 400: the request as such is wrong.
    pub fn bad(code: &'static str, message: impl Into<String>) -> Self {
        Self::with(StatusCode::BAD_REQUEST, code, message)
    }

    /// Any status.
    pub fn with(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into().replace('\n', " "),
            retry_after: None,
        }
    }

    /// The same, to be tried again after `seconds`.
    pub fn retry_after(mut self, seconds: u32) -> Self {
        self.retry_after = Some(seconds);
        self
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let kind = if self.status.is_server_error() {
            "server_error"
        } else {
            "invalid_request_error"
        };
        let body = json!({"error": {
            "message": self.message, "type": kind, "code": self.code, "param": null,
        }});
        let mut res = (self.status, Json(body)).into_response();
        if let Some(s) = self.retry_after {
            res.headers_mut()
                .insert(axum::http::header::RETRY_AFTER, s.into());
        }
        res
    }
}

/// The error body, as documented (`/openapi.json`).
#[derive(serde::Serialize, utoipa::ToSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

/// One error: a line that says what was wrong and what to do, and a stable code.
#[derive(serde::Serialize, utoipa::ToSchema)]
pub struct ErrorDetail {
    pub message: String,
    /// `invalid_request_error` or `server_error`.
    #[serde(rename = "type")]
    pub kind: String,
    pub code: String,
    /// Always null (OpenAI's shape).
    pub param: Option<String>,
}
