//! Every refusal the proxy answers, and its one conversion into the spec's
//! status, plain-text body and headers (`Retry-After`). Handlers decide
//! *that* and *why* a request is refused; this module decides how it looks on
//! the wire.

use crate::auth::{Decision, Grant};
use crate::http::Response;

/// Why a request is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// 400; the reason names what is wrong.
    BadRequest(String),
    /// 400 for a body that cannot be read as what the endpoint takes.
    InvalidBody(String),
    /// 401: a credential is needed and none (or no valid one) was presented.
    Unauthenticated,
    /// 401 on `/peer/…`: the request is not signed by a peer of the cluster.
    PeerUnauthenticated,
    /// 403: the credential does not grant the topic.
    Forbidden,
    /// 404.
    NotFound,
    /// 405.
    MethodNotAllowed,
    /// 408: the request did not arrive within its deadline (slowloris).
    RequestTimeout,
    /// 413.
    BodyTooLarge,
    /// 429, retry after the rate-limit window.
    RateLimited { retry_after_sec: u64 },
    /// 431.
    HeadTooLarge,
    /// 431: more header fields than the parser holds.
    TooManyHeaders,
    /// 503: `max_connections` streams are open.
    TooManyConnections,
    /// 503: the verification webhook cannot answer (breaker open or failing).
    AuthUnavailable { retry_after_sec: u64 },
    /// 503: the peer that owns the topic did not take the publish.
    OwnerUnavailable,
}

impl Refusal {
    /// A request's access: the grant, or the refusal that answers it.
    pub fn from_decision(decision: Decision) -> Result<Grant, Refusal> {
        match decision {
            Decision::Allowed(grant) => Ok(grant),
            Decision::Unauthenticated => Err(Self::Unauthenticated),
            Decision::Forbidden => Err(Self::Forbidden),
            Decision::Unavailable { retry_after } => Err(Self::AuthUnavailable {
                retry_after_sec: retry_after,
            }),
        }
    }

    fn status_and_text(&self) -> (u16, String) {
        match self {
            Self::BadRequest(reason) => (400, reason.clone()),
            Self::InvalidBody(reason) => (400, format!("Invalid body: {reason}")),
            Self::Unauthenticated => (401, "Authentication required".into()),
            Self::PeerUnauthenticated => (401, "Peer authentication failed".into()),
            Self::Forbidden => (403, "Access denied to topic".into()),
            Self::NotFound => (404, "Not found".into()),
            Self::MethodNotAllowed => (405, "Method not allowed".into()),
            Self::RequestTimeout => (408, "The request did not arrive in time".into()),
            Self::BodyTooLarge => (413, "Request body too large".into()),
            Self::RateLimited { .. } => (429, "Rate limit exceeded".into()),
            Self::HeadTooLarge => (431, "Request head too large".into()),
            Self::TooManyHeaders => (431, "Too many header fields".into()),
            Self::TooManyConnections => (503, "Too many connections".into()),
            Self::AuthUnavailable { .. } => (503, "Authentication unavailable".into()),
            Self::OwnerUnavailable => (503, "The topic's owner is unavailable".into()),
        }
    }

    /// Seconds a client should wait before trying again, where that helps.
    fn retry_after_sec(&self) -> Option<u64> {
        match self {
            Self::RateLimited { retry_after_sec } | Self::AuthUnavailable { retry_after_sec } => {
                Some(*retry_after_sec)
            }
            Self::TooManyConnections => Some(30),
            Self::OwnerUnavailable => Some(1),
            _ => None,
        }
    }
}

impl From<Refusal> for Response {
    fn from(refusal: Refusal) -> Self {
        let (status, text) = refusal.status_and_text();
        let response = Response::text(status, &text);
        match refusal.retry_after_sec() {
            Some(seconds) => response.with_header("Retry-After", seconds.to_string()),
            None => response,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wire(refusal: Refusal) -> String {
        String::from_utf8(Response::from(refusal).encode(false)).unwrap()
    }

    #[test]
    fn refusals_carry_the_spec_status_and_retry_after() {
        let limited = wire(Refusal::RateLimited {
            retry_after_sec: 60,
        });
        assert!(limited.starts_with("HTTP/1.1 429 Too Many Requests\r\n"));
        assert!(limited.contains("Retry-After: 60\r\n"));
        assert!(limited.ends_with("\r\n\r\nRate limit exceeded"));
        let full = wire(Refusal::TooManyConnections);
        assert!(full.starts_with("HTTP/1.1 503 "));
        assert!(full.contains("Retry-After: 30\r\n"));
        let bad = wire(Refusal::InvalidBody("data: missing".into()));
        assert!(bad.starts_with("HTTP/1.1 400 "));
        assert!(bad.ends_with("Invalid body: data: missing"));
        assert!(!bad.contains("Retry-After"));
    }

    #[test]
    fn decisions_become_grants_or_refusals() {
        assert_eq!(
            Refusal::from_decision(Decision::Forbidden).unwrap_err(),
            Refusal::Forbidden
        );
        assert_eq!(
            Refusal::from_decision(Decision::Unavailable { retry_after: 5 }).unwrap_err(),
            Refusal::AuthUnavailable { retry_after_sec: 5 }
        );
    }
}
