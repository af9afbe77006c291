//! Errors in OpenAI's JSON shape: `{"error": {"message", "type", "param", "code"}}`.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// An error answered to a client. Every failure of a request ends up here; the
/// status code and `type` follow the OpenAI API.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{status}: {message}")]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// OpenAI's `type`: `invalid_request_error`, `authentication_error`, `server_error`, ...
    pub kind: &'static str,
    /// The request field at fault, if any.
    pub param: Option<String>,
    /// A machine-readable code (`invalid_api_key`, `context_length_exceeded`, ...).
    pub code: Option<&'static str>,
    /// Seconds for a `Retry-After` header (503 when the queue is full).
    pub retry_after: Option<u64>,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        ApiError { status, message: message.into(), kind, param: None, code: None, retry_after: None }
    }

    /// 400 about a request field.
    pub fn invalid(param: &str, message: impl Into<String>) -> Self {
        let mut e = Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message);
        if !param.is_empty() {
            e.param = Some(param.to_string());
        }
        e
    }

    /// 400 about the request as a whole.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }

    pub fn unauthorized() -> Self {
        let mut e = Self::new(
            StatusCode::UNAUTHORIZED,
            "invalid_request_error",
            "Incorrect or missing API key: send the header `Authorization: Bearer <key>`.",
        );
        e.code = Some("invalid_api_key");
        e
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        let mut e = Self::new(StatusCode::NOT_FOUND, "invalid_request_error", message);
        e.code = Some("not_found");
        e
    }

    pub fn method_not_allowed() -> Self {
        Self::new(StatusCode::METHOD_NOT_ALLOWED, "invalid_request_error", "Method not allowed for this endpoint.")
    }

    pub fn too_large(limit: usize) -> Self {
        let mut e = Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            format!("Request body too large: the limit is {limit} bytes (--max-body-bytes)."),
        );
        e.code = Some("request_too_large");
        e
    }

    pub fn body_timeout(limit: std::time::Duration) -> Self {
        let mut e = Self::new(
            StatusCode::REQUEST_TIMEOUT,
            "invalid_request_error",
            format!("The request body did not arrive within {:.0} s (--body-timeout).", limit.as_secs_f64()),
        );
        e.code = Some("request_timeout");
        e
    }

    pub fn queue_full(max_queue: usize) -> Self {
        let mut e = Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            format!("The server is busy: {max_queue} requests are already waiting (--max-queue). Retry later."),
        );
        e.code = Some("queue_full");
        e.retry_after = Some(1);
        e
    }

    pub fn shutting_down() -> Self {
        let mut e = Self::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", "The server is shutting down.");
        e.code = Some("shutting_down");
        e.retry_after = Some(5);
        e
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message)
    }

    pub fn context_length(message: impl Into<String>, param: &str) -> Self {
        let mut e = Self::invalid(param, message);
        e.code = Some("context_length_exceeded");
        e
    }

    /// The JSON body (also sent as an SSE event when a stream fails midway).
    pub fn body(&self) -> serde_json::Value {
        json!({"error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.code,
        }})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.status, axum::Json(self.body())).into_response();
        if let Some(s) = self.retry_after {
            r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        r
    }
}

/// Errors starting the server (the library's typed errors; request errors are [`ApiError`]).
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("cannot listen on {addr}: {source}")]
    Bind { addr: String, source: std::io::Error },
    #[error("server I/O: {0}")]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Engine(#[from] tandem_engine::EngineError),
    #[error("invalid configuration: {0}")]
    Config(String),
}
