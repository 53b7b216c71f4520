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
    /// 426: a WebSocket endpoint asked for without `Upgrade: websocket`.
    #[error("{0}")]
    UpgradeRequired(String),
    /// 403: a WebSocket upgrade from a page of another origin.
    #[error("{0}")]
    Forbidden(String),
    /// 504: a REST action's page did not finish within its `timeout_ms`.
    #[error("{0}")]
    Timeout(String),
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
            Self::UpgradeRequired(_) => StatusCode::UPGRADE_REQUIRED,
            Self::Forbidden(_) => StatusCode::FORBIDDEN,
            Self::Timeout(_) => StatusCode::GATEWAY_TIMEOUT,
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
            Self::UpgradeRequired(_) => ErrorCode::InvalidRequest,
            Self::Forbidden(_) => ErrorCode::Forbidden,
            Self::Timeout(_) => ErrorCode::Timeout,
            Self::Internal(_) => ErrorCode::Internal,
        }
    }
}

/// What a node agent's refusal means to a client of the control plane.
impl From<crate::nodes::NodeCallError> for Error {
    fn from(error: crate::nodes::NodeCallError) -> Self {
        use crate::nodes::NodeCallError::{Rejected, Unreachable};
        match error {
            Rejected {
                code: ErrorCode::InvalidRequest,
                detail,
            } => Self::InvalidRequest(detail),
            Rejected {
                code: ErrorCode::NotFound,
                detail,
            } => Self::InvalidState(format!(
                "{detail}; its node no longer holds it (the node restarted?)"
            )),
            Rejected {
                code: ErrorCode::InvalidState,
                detail,
            } => Self::InvalidState(detail),
            // Full or shutting down, or the snapshot store failed: retryable,
            // and the detail says which.
            Rejected {
                code: ErrorCode::InsufficientCapacity | ErrorCode::BadGateway,
                detail,
            } => Self::InsufficientCapacity(detail),
            Rejected { detail, .. } => Self::Internal(anyhow::anyhow!("{detail}")),
            Unreachable(detail) => Self::InsufficientCapacity(detail),
        }
    }
}

impl Error {
    /// What a node's refusal of a job on a page (a REST action, an MCP
    /// step) means to its client: the node's status kept. A node that
    /// cannot be reached is logged with its address, not shown.
    pub fn of_page_job(
        node: &flotilla_api_types::NodeId,
        error: crate::nodes::NodeCallError,
    ) -> Self {
        use crate::nodes::NodeCallError::{Rejected, Unreachable};
        match error {
            Rejected { code, detail } => match code {
                ErrorCode::InvalidRequest => Self::InvalidRequest(detail),
                ErrorCode::NotFound => Self::NotFound(detail),
                ErrorCode::Timeout => Self::Timeout(detail),
                ErrorCode::BadGateway => Self::BadGateway(detail),
                ErrorCode::PayloadTooLarge => Self::PayloadTooLarge(detail),
                ErrorCode::InvalidState => Self::InvalidState(detail),
                other => Rejected {
                    code: other,
                    detail,
                }
                .into(),
            },
            Unreachable(detail) => {
                tracing::warn!(%node, detail, "a node did not answer a job on a page");
                Self::BadGateway(format!("node {node} did not answer; retry"))
            }
        }
    }
}

/// A refused `config.proxy`: the message names the field.
impl From<flotilla_api_types::instances::ProxyError> for Error {
    fn from(error: flotilla_api_types::instances::ProxyError) -> Self {
        Self::InvalidRequest(error.to_string())
    }
}

/// Refused `config.prefs`: the message names the key.
impl From<flotilla_api_types::prefs::PrefsError> for Error {
    fn from(error: flotilla_api_types::prefs::PrefsError) -> Self {
        Self::InvalidRequest(error.to_string())
    }
}

impl From<flotilla_api_types::profiles::InvalidProfileName> for Error {
    fn from(error: flotilla_api_types::profiles::InvalidProfileName) -> Self {
        Self::InvalidRequest(error.to_string())
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
            Self::UpgradeRequired(_) => {
                let headers = response.headers_mut();
                headers.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
                headers.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
            }
            _ => {}
        }
        response
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nodes::NodeCallError;

    #[test]
    fn agent_refusals_map_to_the_clients_status_by_their_code() {
        let refused = |code| NodeCallError::Rejected {
            code,
            detail: "why".into(),
        };
        // (refusal, status for the client, whether another node may take it)
        for (error, status, elsewhere) in [
            (
                refused(ErrorCode::InvalidRequest),
                StatusCode::BAD_REQUEST,
                false,
            ),
            (refused(ErrorCode::NotFound), StatusCode::CONFLICT, false),
            (
                refused(ErrorCode::InvalidState),
                StatusCode::CONFLICT,
                false,
            ),
            (
                refused(ErrorCode::InsufficientCapacity),
                StatusCode::SERVICE_UNAVAILABLE,
                true,
            ),
            // The snapshot store is shared: another node would fail alike.
            (
                refused(ErrorCode::BadGateway),
                StatusCode::SERVICE_UNAVAILABLE,
                false,
            ),
            (
                refused(ErrorCode::Internal),
                StatusCode::INTERNAL_SERVER_ERROR,
                false,
            ),
            (
                NodeCallError::Unreachable("gone".into()),
                StatusCode::SERVICE_UNAVAILABLE,
                true,
            ),
        ] {
            assert_eq!(error.node_unavailable(), elsewhere, "{error}");
            assert_eq!(Error::from(error).status(), status);
        }
    }
}
