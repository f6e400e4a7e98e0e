//! API errors in E2B's shape: an HTTP status and `{"code": <status>, "message": "..."}`.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
        }
    }
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }
    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, message)
    }
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, message)
    }
    pub fn conflict(message: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, message)
    }
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, message)
    }
    pub fn sandbox_not_found(id: &str) -> Self {
        Self::not_found(format!("sandbox {id} not found"))
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if self.status.is_server_error() {
            tracing::error!(status = %self.status, "{}", self.message);
        }
        let body = serde_json::json!({ "code": self.status.as_u16(), "message": self.message });
        (self.status, Json(body)).into_response()
    }
}

impl From<cella_store::StoreError> for ApiError {
    fn from(e: cella_store::StoreError) -> Self {
        ApiError::internal(format!("store: {e}"))
    }
}

impl From<cella_sandbox::SandboxError> for ApiError {
    fn from(e: cella_sandbox::SandboxError) -> Self {
        use cella_sandbox::SandboxError as E;
        let status = match &e {
            E::NotFound(_) => StatusCode::NOT_FOUND,
            E::UnknownTemplate { .. } | E::TemplateUnavailable(_) => StatusCode::BAD_REQUEST,
            E::Paused(_) | E::NotPaused(_) => StatusCode::CONFLICT,
            E::Unsupported(_) => StatusCode::NOT_IMPLEMENTED,
            E::Create(_) | E::Io { .. } => StatusCode::INTERNAL_SERVER_ERROR,
        };
        ApiError::new(status, e.to_string())
    }
}

/// Rejections of axum's extractors (malformed JSON, wrong content type) as E2B errors.
pub fn json_rejection(e: axum::extract::rejection::JsonRejection) -> ApiError {
    ApiError::bad_request(format!("invalid request body: {}", e.body_text()))
}
