//! The error body of every non-2xx control-plane response, and the success
//! message body.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Machine-readable error codes (DESIGN.md, "Decisions on the control plane API").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// 400: the request is malformed or a value is out of range.
    InvalidRequest,
    /// 404: the instance or node does not exist.
    NotFound,
    /// 409: the instance's state does not allow the operation.
    InvalidState,
    /// 503: no node has room for the instance.
    InsufficientCapacity,
    /// 401: missing or wrong API key.
    Unauthorized,
    /// 429: too many requests.
    RateLimited,
    /// 502: the front door could not reach the instance on its node.
    BadGateway,
    /// 413: the request body is larger than the operation accepts.
    PayloadTooLarge,
    /// 403: a browser page of another site asked (a WebSocket upgrade
    /// whose `Origin` is not this server's).
    Forbidden,
    /// 500: a fault on our side; the detail is logged, not shown.
    Internal,
    /// 504: the page of a REST action did not finish within its `timeout_ms`.
    Timeout,
}

impl ErrorCode {
    /// The code of an HTTP answer that carries no readable `{detail, code}`
    /// body (a proxy's page, a cut body), from its status.
    pub fn of_status(status: u16) -> Self {
        match status {
            400 => Self::InvalidRequest,
            401 => Self::Unauthorized,
            403 => Self::Forbidden,
            404 => Self::NotFound,
            409 => Self::InvalidState,
            413 => Self::PayloadTooLarge,
            429 => Self::RateLimited,
            502 => Self::BadGateway,
            503 => Self::InsufficientCapacity,
            504 => Self::Timeout,
            _ => Self::Internal,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::InvalidRequest => "invalid_request",
            Self::NotFound => "not_found",
            Self::InvalidState => "invalid_state",
            Self::InsufficientCapacity => "insufficient_capacity",
            Self::Unauthorized => "unauthorized",
            Self::RateLimited => "rate_limited",
            Self::BadGateway => "bad_gateway",
            Self::PayloadTooLarge => "payload_too_large",
            Self::Forbidden => "forbidden",
            Self::Internal => "internal",
            Self::Timeout => "timeout",
        }
    }
}

/// ErrorResponse: `{"detail": "...", "code": "..."}`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ErrorResponse {
    /// What failed and, where it helps, what to do about it.
    pub detail: String,
    pub code: ErrorCode,
}

/// MessageResponse: a human-readable confirmation.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct MessageResponse {
    pub message: String,
}
