//! The control plane's one error type and its one mapping to HTTP: a status and
//! the `{detail, code}` body. Internal causes are logged, never shown to clients.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use flotilla_api_types::{ErrorCode, ErrorResponse};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// 400: the message names the field and what is accepted.
    #[error("{0}")]
    InvalidRequest(String),
    /// 404.
    #[error("{0}")]
    NotFound(String),
    /// 409: the instance's state does not allow the operation.
    #[error("{0}")]
    InvalidState(String),
    /// 503: no node can take the instance.
    #[error("{0}")]
    InsufficientCapacity(String),
    /// 401.
    #[error("{0}")]
    Unauthorized(String),
    /// 429, with the seconds after which to retry.
    #[error("{detail}")]
    RateLimited {
        detail: String,
        retry_after_sec: u64,
    },
    /// 502: the front door could not reach the instance's node.
    #[error("{0}")]
    BadGateway(String),
    /// 413: the body is larger than the operation accepts.
    #[error("{0}")]
    PayloadTooLarge(String),
    /// 500: the cause is logged; the client sees a generic message.
    #[error("internal error: {0:#}")]
    Internal(#[from] anyhow::Error),
}

impl Error {
    pub fn internal(context: impl std::fmt::Display) -> Self {
        Self::Internal(anyhow::anyhow!("{context}"))
    }

    pub fn status(&self) -> StatusCode {
        match self {
            Self::InvalidRequest(_) => StatusCode::BAD_REQUEST,
            Self::NotFound(_) => StatusCode::NOT_FOUND,
            Self::InvalidState(_) => StatusCode::CONFLICT,
            Self::InsufficientCapacity(_) => StatusCode::SERVICE_UNAVAILABLE,
            Self::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            Self::RateLimited { .. } => StatusCode::TOO_MANY_REQUESTS,
            Self::BadGateway(_) => StatusCode::BAD_GATEWAY,
            Self::PayloadTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            Self::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    pub fn code(&self) -> ErrorCode {
        match self {
            Self::InvalidRequest(_) => ErrorCode::InvalidRequest,
            Self::NotFound(_) => ErrorCode::NotFound,
            Self::InvalidState(_) => ErrorCode::InvalidState,
            Self::InsufficientCapacity(_) => ErrorCode::InsufficientCapacity,
            Self::Unauthorized(_) => ErrorCode::Unauthorized,
            Self::RateLimited { .. } => ErrorCode::RateLimited,
            Self::BadGateway(_) => ErrorCode::BadGateway,
            Self::PayloadTooLarge(_) => ErrorCode::PayloadTooLarge,
            Self::Internal(_) => ErrorCode::Internal,
        }
    }
}

impl From<sqlx::Error> for Error {
    fn from(error: sqlx::Error) -> Self {
        Self::Internal(anyhow::Error::new(error).context("store query failed"))
    }
}

impl IntoResponse for Error {
    fn into_response(self) -> Response {
        let detail = match &self {
            Self::Internal(cause) => {
                tracing::error!(error = format!("{cause:#}"), "internal error");
                "internal error; the cause is in the control plane's log".to_owned()
            }
            other => other.to_string(),
        };
        let status = self.status();
        let body = ErrorResponse {
            detail,
            code: self.code(),
        };
        let mut response = (status, axum::Json(body)).into_response();
        match &self {
            Self::Unauthorized(_) => {
                response
                    .headers_mut()
                    .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            }
            Self::RateLimited {
                retry_after_sec, ..
            } => {
                response
                    .headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from(*retry_after_sec));
            }
            _ => {}
        }
        response
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
