//! Who may use an instance's ports (debug, stream and http) when authentication
//! is on: whoever presents an API key, or the instance's own access token, as
//! `Authorization: Bearer <credential>` or as the `token` query parameter (what
//! an `<img>`, an `EventSource` or a CDP client given a URL can send).
//!
//! The agent learns both from the control plane only: the node-wide policy
//! ([`NodeAccess`]: whether authentication is on, and the API keys' SHA-256
//! digests) with every registration and heartbeat answer, and each instance's
//! token ([`InstanceToken`]) with the create or revive call. Until the control
//! plane has answered, every request is refused. Presented credentials are
//! hashed and compared in constant time; tokens are kept in memory only and
//! never logged (their `Debug` is redacted).

use std::sync::{Arc, RwLock};

use axum::http::{HeaderMap, HeaderValue, StatusCode, header};

use flotilla_api_types::agent::InstanceAccessPolicy;
use flotilla_api_types::credentials::{bearer_token, matches_any_digest, sha256};

use crate::instance::token::InstanceToken;

/// The node-wide part of the policy.
pub struct NodeAccess {
    /// Replaced whole when the control plane sends a new policy; read on every
    /// request. A std lock: never held across an await.
    policy: RwLock<Policy>,
}

#[derive(Debug, Clone)]
struct Policy {
    auth_enabled: bool,
    api_keys: Vec<[u8; 32]>,
}

impl Default for NodeAccess {
    /// Refuses everything until the control plane sends the policy.
    fn default() -> Self {
        Self {
            policy: RwLock::new(Policy {
                auth_enabled: true,
                api_keys: Vec::new(),
            }),
        }
    }
}

impl NodeAccess {
    /// Applies the policy the control plane sent. Digests that are not 64 hex
    /// characters are skipped.
    pub fn apply(&self, policy: &InstanceAccessPolicy) {
        let api_keys = policy
            .api_key_sha256
            .iter()
            .filter_map(|digest| parse_digest(digest))
            .collect();
        let new = Policy {
            auth_enabled: policy.auth_enabled,
            api_keys,
        };
        *self.policy.write().expect("access policy lock") = new;
    }

    pub fn auth_enabled(&self) -> bool {
        self.policy.read().expect("access policy lock").auth_enabled
    }

    /// Whether `request` may use the instance whose token is `token`.
    pub fn admit(
        &self,
        token: Option<&InstanceToken>,
        headers: &HeaderMap,
        query: Option<&str>,
    ) -> Result<Admission, Refusal> {
        let policy = self.policy.read().expect("access policy lock").clone();
        if !policy.auth_enabled {
            return Ok(Admission::Open);
        }
        let header = headers
            .get(header::AUTHORIZATION)
            .and_then(|value| value.to_str().ok());
        let from_header = header.and_then(bearer_token);
        let from_query = query.and_then(query_token);
        let presented: Vec<&str> = from_header
            .into_iter()
            .chain(from_query.as_deref())
            .collect();
        for credential in &presented {
            if let Some(token) = token
                && token.matches(credential)
            {
                return Ok(Admission::InstanceToken);
            }
            if matches_any_digest(credential.as_bytes(), &policy.api_keys) {
                return Ok(Admission::ApiKey(sha256(credential.as_bytes())));
            }
        }
        Err(if presented.is_empty() {
            Refusal::Missing
        } else {
            Refusal::Invalid
        })
    }
}

/// Serves `router` on one of `slot`'s ports (live view, HTTP API) behind
/// [`require_credential`] until the instance's servers stop.
pub async fn serve_instance_port(
    listener: tokio::net::TcpListener,
    router: axum::Router,
    (access, listeners): (Arc<NodeAccess>, flotilla_net::Listeners),
    slot: Arc<crate::instance::InstanceSlot>,
) {
    let cancel = slot.servers.clone();
    let router = router.layer(axum::middleware::from_fn_with_state(
        (access, slot),
        require_credential,
    ));
    listeners.serve_router(listener, router, cancel).await;
}

/// Axum middleware of the instance's own servers (live view, HTTP API):
/// refuses a request without a credential for `slot` before any handler runs.
pub async fn require_credential(
    axum::extract::State((access, slot)): axum::extract::State<(
        Arc<NodeAccess>,
        Arc<crate::instance::InstanceSlot>,
    )>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let token = slot.access_token();
    let mut request = request;
    match access.admit(token.as_deref(), request.headers(), request.uri().query()) {
        Ok(admission) => {
            // Who was let in, for routes that serve one key only (a
            // WebDriver session is its key's).
            request.extensions_mut().insert(admission);
            next.run(request).await
        }
        Err(refusal) => refusal.response(),
    }
}

pub(crate) fn parse_digest(hex_digest: &str) -> Option<[u8; 32]> {
    if hex_digest.len() != 64 {
        return None;
    }
    let mut digest = [0u8; 32];
    for (i, byte) in digest.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex_digest.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(digest)
}

/// How a request was let in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Authentication is off.
    Open,
    /// An API key, by its SHA-256 digest.
    ApiKey([u8; 32]),
    InstanceToken,
}

/// Why a request was refused: answered 401 before anything reaches the browser.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error(
        "this instance needs a credential: send Authorization: Bearer <API key or instance token>, or ?token=<instance token> (urls.debug and urls.stream carry it)"
    )]
    Missing,
    #[error("invalid credential for this instance: use an API key or this instance's own token")]
    Invalid,
}

impl Refusal {
    /// The `{detail, code}` body of the 401.
    pub fn body(&self) -> String {
        serde_json::json!({"detail": self.to_string(), "code": "unauthorized"}).to_string()
    }

    /// The whole 401 answer, in any body type that can hold a string.
    pub fn response<B: From<String>>(&self) -> axum::http::Response<B> {
        let mut response = axum::http::Response::new(B::from(self.body()));
        *response.status_mut() = StatusCode::UNAUTHORIZED;
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        headers.insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Bearer realm=\"flotilla instance\""),
        );
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        response
    }
}

/// The `token` parameter of a query string (the first one).
fn query_token(query: &str) -> Option<String> {
    url::form_urlencoded::parse(query.as_bytes())
        .find(|(name, _)| name == "token")
        .map(|(_, value)| value.into_owned())
}

/// `query` without its `token` parameters (what goes on to the browser);
/// `None` when nothing is left.
pub fn query_without_token(query: &str) -> Option<String> {
    let kept: Vec<&str> = query
        .split('&')
        .filter(|pair| {
            let name = pair.split('=').next().unwrap_or_default();
            !name.is_empty() && name != "token"
        })
        .collect();
    (!kept.is_empty()).then(|| kept.join("&"))
}

/// `url` with `?token=<token>` (or `&token=`) appended.
pub fn with_token(url: &str, token: &InstanceToken) -> String {
    let separator = if url.contains('?') { '&' } else { '?' };
    format!("{url}{separator}token={}", token.secret())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(authorization: Option<&str>) -> HeaderMap {
        let mut headers = HeaderMap::new();
        if let Some(value) = authorization {
            headers.insert(header::AUTHORIZATION, value.parse().unwrap());
        }
        headers
    }

    fn node(enabled: bool, keys: &[&str]) -> NodeAccess {
        let access = NodeAccess::default();
        access.apply(&InstanceAccessPolicy {
            auth_enabled: enabled,
            api_key_sha256: keys
                .iter()
                .map(|k| {
                    sha256(k.as_bytes())
                        .iter()
                        .map(|b| format!("{b:02x}"))
                        .collect()
                })
                .collect(),
        });
        access
    }

    #[test]
    fn credentials_open_only_their_instance() {
        let access = node(true, &["the-api-key"]);
        let mine = InstanceToken::new("flt_mine".into());
        let admit = |auth: Option<&str>, query: Option<&str>| {
            access.admit(Some(&mine), &headers(auth), query)
        };
        assert_eq!(admit(None, None), Err(Refusal::Missing));
        assert_eq!(admit(Some("Bearer wrong"), None), Err(Refusal::Invalid));
        assert_eq!(admit(None, Some("token=flt_other")), Err(Refusal::Invalid));
        assert_eq!(
            admit(Some("Basic Zm9vOmJhcg=="), None),
            Err(Refusal::Missing)
        );
        assert_eq!(
            admit(Some("Bearer flt_mine"), None),
            Ok(Admission::InstanceToken)
        );
        assert_eq!(
            admit(Some("bearer flt_mine"), None),
            Ok(Admission::InstanceToken)
        );
        assert_eq!(
            admit(None, Some("a=1&token=flt_mine")),
            Ok(Admission::InstanceToken)
        );
        assert_eq!(
            admit(None, Some("token=flt%5Fmine")),
            Ok(Admission::InstanceToken)
        );
        assert_eq!(
            admit(Some("Bearer the-api-key"), None),
            Ok(Admission::ApiKey(sha256(b"the-api-key")))
        );
        // A wrong header does not hide a right query parameter.
        assert_eq!(
            admit(Some("Bearer wrong"), Some("token=flt_mine")),
            Ok(Admission::InstanceToken)
        );
        // Without a token (an instance the agent learnt none for), keys only.
        assert_eq!(
            access.admit(None, &headers(Some("Bearer flt_mine")), None),
            Err(Refusal::Invalid)
        );
    }

    #[test]
    fn everything_is_refused_until_the_policy_arrives_and_open_when_off() {
        let access = NodeAccess::default();
        assert_eq!(
            access.admit(None, &headers(Some("Bearer x")), None),
            Err(Refusal::Invalid)
        );
        let open = node(false, &[]);
        assert_eq!(open.admit(None, &headers(None), None), Ok(Admission::Open));
    }

    #[test]
    fn tokens_are_stripped_and_appended() {
        assert_eq!(query_without_token("token=abc"), None);
        assert_eq!(
            query_without_token("a=1&token=abc&b=2").as_deref(),
            Some("a=1&b=2")
        );
        let token = InstanceToken::new("flt_x".into());
        assert_eq!(
            with_token("ws://h:1/devtools/browser/i", &token),
            "ws://h:1/devtools/browser/i?token=flt_x"
        );
        assert_eq!(
            with_token("http://h:1/?a=1", &token),
            "http://h:1/?a=1&token=flt_x"
        );
        assert_eq!(format!("{token:?}"), "InstanceToken(<redacted>)");
        assert!(
            Refusal::Missing
                .body()
                .contains("\"code\":\"unauthorized\"")
        );
    }
}
