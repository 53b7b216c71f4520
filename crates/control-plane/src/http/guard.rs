//! The middleware in front of every route: authentication (spec:
//! Authentication; DESIGN.md: keys hashed, compared in constant time, `/health`
//! always open), rate limiting with its `X-RateLimit-*` headers, and request
//! latency for `GET /metrics`.
//!
//! The front door's requests (`/v2/instances/{id}/cdp`, `…/json/…`, an
//! instance's subdomain, …) are rate-limited here but authenticated by the
//! door, which also takes the instance's token.
//!
//! Open paths are the routes the tables mark open (`routes::ROUTES`,
//! `door::ROUTES`): `/health`, `/docs` and `/openapi.json`, the DevTools
//! protocol's description at `/json/protocol` and `/json/version`, the
//! dashboard's assets (`/`, `/ui`; it asks for the key and sends it on every
//! API call), the proxy's verification webhook `/v2/tokens/verify` (the token
//! it carries is the credential), live links' pages, Grid's `/status`, the
//! agents' `/internal/…` (the cluster token guards it), and `/metrics` unless
//! `metrics_require_auth`. The rate limit applies to every
//! path but `/internal/…`, per API key (or per client address when the request
//! carries no valid key): a token bucket of `requests_per_minute` that refills
//! continuously.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::extract::{ConnectInfo, MatchedPath, Request, State};
use axum::http::{HeaderMap, HeaderValue};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};

use flotilla_api_types::agent::InstanceAccessPolicy;
use flotilla_api_types::credentials::{bearer_token, constant_time_eq, matches_any_digest};
use flotilla_api_types::token_bucket::TokenBucket;

use crate::app::ControlPlane;
use crate::app::Scope;
use crate::config::ControlPlaneConfig;
use crate::error::Error;

/// Who made a request: `key:<first 12 hex of its hash>`, or `anonymous`.
#[derive(Debug, Clone)]
pub struct Principal(pub String);

/// The SHA-256 of the API key a request carried (beside its [`Principal`]),
/// for what a node must tell apart by key: a WebDriver session is its key's
/// on the instance's own port too.
#[derive(Debug, Clone, Copy)]
pub struct KeyDigest(pub [u8; 32]);

impl Principal {
    /// The request carried an accepted API key.
    pub fn is_key(&self) -> bool {
        self.0.starts_with("key:")
    }

    /// Whether the caller of an open route (`/health`, Grid's `/status`)
    /// may read the fleet's inner workings (nodes, their load, background
    /// errors): with authentication off anyone, otherwise an admin key.
    pub fn reads_the_fleet(&self, auth_enabled: bool, scope: &crate::app::Scope) -> bool {
        !auth_enabled || (self.is_key() && *scope == crate::app::Scope::Admin)
    }
}

/// Accepted API keys (SHA-256) and the rate limiter.
pub struct Guard {
    auth_enabled: bool,
    metrics_require_auth: bool,
    /// Admin keys (`api_keys`).
    key_hashes: Vec<[u8; 32]>,
    /// Tenant keys (`[[tenants]] api_keys`), with their tenant's scope.
    tenant_keys: Vec<([u8; 32], Scope)>,
    limiter: Option<RateLimiter>,
}

/// Who a request's key lets it act as.
pub struct Caller {
    pub principal: Principal,
    pub digest: KeyDigest,
    pub scope: Scope,
}

/// An `api_keys` entry that is neither a raw key nor `sha256:<64 hex>`.
#[derive(Debug, thiserror::Error)]
pub enum ApiKeyError {
    #[error("api_keys: {entry:?} is not sha256:<64 hex>: {source}")]
    NotHex {
        entry: String,
        #[source]
        source: hex::FromHexError,
    },
    /// Hex, but not 32 bytes.
    #[error("api_keys: {entry:?} is not sha256:<64 hex>")]
    NotSha256 { entry: String },
}

/// `sha256:<hex>` as configured, or a raw key (hashed here, with a warning).
pub fn key_digest(entry: &str) -> Result<[u8; 32], ApiKeyError> {
    match entry.strip_prefix("sha256:") {
        Some(hex_digest) => {
            let bytes = hex::decode(hex_digest).map_err(|source| ApiKeyError::NotHex {
                entry: entry.to_owned(),
                source,
            })?;
            bytes.try_into().map_err(|_| ApiKeyError::NotSha256 {
                entry: entry.to_owned(),
            })
        }
        None => {
            tracing::warn!(
                "api_keys holds a raw key; store its hash instead (`flotilla keys create` prints the line)"
            );
            Ok(Sha256::digest(entry.as_bytes()).into())
        }
    }
}

/// Checks the `api_keys` entries (for configuration validation).
pub fn check_api_keys(keys: &[String]) -> Result<(), ApiKeyError> {
    keys.iter().try_for_each(|k| key_digest(k).map(drop))
}

impl Guard {
    /// From a validated configuration (an entry that is not a key is skipped).
    pub fn new(config: &ControlPlaneConfig) -> Self {
        Self {
            auth_enabled: config.auth_enabled,
            metrics_require_auth: config.metrics_require_auth,
            key_hashes: config
                .api_keys
                .iter()
                .filter_map(|k| key_digest(k).ok())
                .collect(),
            tenant_keys: config
                .tenants
                .iter()
                .flat_map(|tenant| {
                    let scope = Scope::Tenant(tenant.name.as_str().into());
                    tenant
                        .api_keys
                        .iter()
                        .filter_map(move |k| Some((key_digest(k).ok()?, scope.clone())))
                })
                .collect(),
            limiter: config
                .rate_limit
                .enabled
                .then(|| RateLimiter::new(config.rate_limit.requests_per_minute)),
        }
    }

    fn is_open(&self, path: &str) -> bool {
        super::routes::is_open(path, !self.metrics_require_auth)
    }

    /// The key's id when the request carries an accepted key. Every accepted
    /// key is compared, so the time does not say which one matched.
    fn principal(&self, headers: &HeaderMap, path: &str, query: Option<&str>) -> Option<Caller> {
        let Some(authorization) = headers.get(axum::http::header::AUTHORIZATION) else {
            // Playwright clients may carry the key in the URL they connect to.
            let key = (path == super::playwright::PATH)
                .then(|| query_token(query?))
                .flatten()?;
            return self.principal_of_key(&key);
        };
        let authorization = authorization.to_str().ok()?;
        // WebDriver clients carry credentials in the URL (`http://user:KEY@host`),
        // which they send as Basic.
        let basic = super::routes::is_webdriver(path)
            .then(|| basic_password(authorization))
            .flatten();
        let presented = match &basic {
            Some(password) => password.as_str(),
            None => bearer_token(authorization)?,
        };
        self.principal_of_key(presented)
    }

    /// Who `presented` lets a request act as, when it is an accepted key
    /// (admin or tenant): every key is compared, whichever matches.
    fn principal_of_key(&self, presented: &str) -> Option<Caller> {
        let hash: [u8; 32] = Sha256::digest(presented.as_bytes()).into();
        let admin = matches_any_digest(presented.as_bytes(), &self.key_hashes);
        let mut tenant = None;
        for (digest, scope) in &self.tenant_keys {
            if constant_time_eq(digest, &hash) {
                tenant = Some(scope.clone());
            }
        }
        let scope = match (admin, tenant) {
            (true, _) => Scope::Admin,
            (false, Some(scope)) => scope,
            (false, None) => return None,
        };
        Some(Caller {
            principal: Principal(format!("key:{}", &hex::encode(hash)[..12])),
            digest: KeyDigest(hash),
            scope,
        })
    }

    /// What agents need to admit clients on instance ports: the admin keys
    /// (a tenant's key reaches its instances through the front door, or
    /// with their own tokens, which `urls` carry).
    pub fn instance_access_policy(&self) -> InstanceAccessPolicy {
        InstanceAccessPolicy {
            auth_enabled: self.auth_enabled,
            api_key_sha256: self.key_hashes.iter().map(hex::encode).collect(),
        }
    }
}

/// The `token` parameter of `query`.
fn query_token(query: &str) -> Option<String> {
    form_urlencoded::parse(query.as_bytes())
        .find(|(name, _)| name == "token")
        .map(|(_, value)| value.into_owned())
}

/// The middleware.
pub async fn guard(
    State(control_plane): State<Arc<ControlPlane>>,
    mut request: Request,
    next: Next,
) -> Response {
    let started = Instant::now();
    let guard = &control_plane.guard;
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or("unmatched", |p| p.as_str())
        .to_owned();
    let method = request.method().as_str().to_owned();
    let client = request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map_or(IpAddr::from([127, 0, 0, 1]), |c| c.0.ip());
    let caller = guard.principal(
        request.headers(),
        request.uri().path(),
        request.uri().query(),
    );
    let principal = caller.as_ref().map(|caller| caller.principal.clone());
    let limit_key = match &principal {
        Some(p) => p.0.clone(),
        None => format!("ip:{client}"),
    };
    let path = request.uri().path().to_owned();
    // The front door admits an instance's own token as well as a key; it
    // checks either itself.
    let door = super::door::is_door_request(&control_plane, &request);
    // Agents authenticate with the cluster token and are not rate-limited.
    let internal = super::routes::is_agents(&path);
    let quota = guard
        .limiter
        .as_ref()
        .filter(|_| !internal)
        .map(|limiter| limiter.take(&limit_key, control_plane.now().timestamp()));
    let mut response = match (&quota, &principal) {
        (Some(Err(refused)), _) => Error::RateLimited {
            detail: format!(
                "rate limit of {} requests per minute exceeded; retry in {} s",
                refused.limit, refused.retry_after_sec
            ),
            retry_after_sec: refused.retry_after_sec,
        }
        .into_response(),
        (_, None) if guard.auth_enabled && !guard.is_open(&path) && !door => unauthorized(&request),
        _ => {
            admitted_as(request.extensions_mut(), caller);
            next.run(request).await
        }
    };
    if let Some(quota) = quota {
        let state = match quota {
            Ok(state) | Err(state) => state,
        };
        let headers = response.headers_mut();
        headers.insert("x-ratelimit-limit", HeaderValue::from(state.limit));
        headers.insert("x-ratelimit-remaining", HeaderValue::from(state.remaining));
        headers.insert("x-ratelimit-reset", HeaderValue::from(state.reset_unix));
    }
    control_plane.telemetry.observe_request(
        &method,
        &route,
        response.status().as_u16(),
        started.elapsed(),
    );
    response
}

/// The 401 of a request without an accepted key, saying whether it sent
/// none or a wrong one (in WebDriver's shape on its endpoints).
fn unauthorized(request: &Request) -> Response {
    let path = request.uri().path();
    let in_query =
        path == super::playwright::PATH && request.uri().query().and_then(query_token).is_some();
    let detail = if request
        .headers()
        .contains_key(axum::http::header::AUTHORIZATION)
    {
        "invalid API key"
    } else if in_query {
        "invalid API key (the token parameter)"
    } else {
        "missing API key: send Authorization: Bearer <API_KEY>"
    };
    if super::routes::is_webdriver(path) {
        webdriver_unauthorized(detail)
    } else {
        Error::Unauthorized(detail.into()).into_response()
    }
}

/// Puts who the request acts as on it: its key's principal, digest and
/// scope, or an anonymous admin (authentication off, or an open path).
fn admitted_as(extensions: &mut axum::http::Extensions, caller: Option<Caller>) {
    match caller {
        Some(caller) => {
            extensions.insert(caller.principal);
            extensions.insert(caller.digest);
            extensions.insert(caller.scope);
        }
        None => {
            extensions.insert(Principal("anonymous".into()));
            extensions.insert(Scope::Admin);
        }
    }
}

/// The password of `Basic <base64 user:password>` (the user when there is
/// no password: some clients put the key there).
fn basic_password(authorization: &str) -> Option<String> {
    use base64::Engine as _;
    let (scheme, encoded) = authorization.trim().split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .ok()?;
    let decoded = String::from_utf8(decoded).ok()?;
    let (user, password) = decoded.split_once(':').unwrap_or((decoded.as_str(), ""));
    Some(if password.is_empty() { user } else { password }.to_owned())
}

/// A 401 in WebDriver's shape, asking for Basic credentials (what a
/// WebDriver client sends from `http://user:KEY@host/wd/hub`).
fn webdriver_unauthorized(detail: &str) -> Response {
    let message = format!(
        "{detail}; WebDriver clients: put the API key in the URL (http://flotilla:<API_KEY>@host/wd/hub) or send Authorization: Bearer <API_KEY>"
    );
    let body = serde_json::json!({"value": {"error": "unknown error", "message": message, "stacktrace": ""}});
    let mut response = (axum::http::StatusCode::UNAUTHORIZED, axum::Json(body)).into_response();
    response.headers_mut().insert(
        axum::http::header::WWW_AUTHENTICATE,
        HeaderValue::from_static("Basic realm=\"flotilla\""),
    );
    response
}

/// What the limiter says about one request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Quota {
    pub limit: u32,
    pub remaining: u32,
    /// Unix time at which the bucket is full again.
    pub reset_unix: i64,
    /// Seconds until one more request is allowed (refusals only).
    pub retry_after_sec: u64,
}

/// Token buckets per key: `per_minute` requests of burst, refilled at
/// `per_minute / 60` per second.
pub struct RateLimiter {
    per_minute: u32,
    buckets: Mutex<HashMap<String, TokenBucket>>,
}

/// Buckets kept before full ones are swept.
const SWEEP_AT: usize = 10_000;

impl RateLimiter {
    pub fn new(per_minute: u32) -> Self {
        Self {
            per_minute,
            buckets: Mutex::default(),
        }
    }

    /// Takes one request for `key` at Unix time `now_unix`.
    pub fn take(&self, key: &str, now_unix: i64) -> Result<Quota, Quota> {
        let capacity = f64::from(self.per_minute);
        let per_sec = capacity / 60.0;
        let now = Instant::now();
        let mut buckets = self.buckets.lock().expect("rate limiter lock");
        if buckets.len() >= SWEEP_AT {
            buckets.retain(|_, bucket| !bucket.is_full_at(now, capacity, per_sec));
        }
        let bucket = buckets
            .entry(key.to_owned())
            .or_insert_with(|| TokenBucket::full(capacity, now));
        bucket.refill(now, capacity, per_sec);
        let allowed = bucket.try_take();
        let tokens = bucket.tokens();
        let quota = Quota {
            limit: self.per_minute,
            remaining: tokens.floor() as u32,
            reset_unix: now_unix + ((capacity - tokens) / per_sec).ceil() as i64,
            retry_after_sec: if allowed {
                0
            } else {
                bucket.time_to_next(per_sec).as_secs_f64().ceil().max(1.0) as u64
            },
        };
        if allowed { Ok(quota) } else { Err(quota) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_allow_a_burst_then_refuse() {
        let limiter = RateLimiter::new(3);
        for remaining in [2, 1, 0] {
            let quota = limiter.take("a", 1000).unwrap();
            assert_eq!(quota.remaining, remaining);
            assert_eq!(quota.limit, 3);
        }
        let refused = limiter.take("a", 1000).unwrap_err();
        assert_eq!(refused.remaining, 0);
        assert!(refused.retry_after_sec >= 19, "{refused:?}");
        assert!(refused.reset_unix > 1000 + 50, "{refused:?}");
        assert!(limiter.take("b", 1000).is_ok(), "keys are independent");
    }

    #[test]
    fn keys_are_hashed_and_compared_whole() {
        let hash = key_digest("secret").unwrap();
        let configured = format!("sha256:{}", hex::encode(hash));
        assert_eq!(key_digest(&configured).unwrap(), hash);
        assert!(key_digest("sha256:zz").is_err());
        assert!(matches_any_digest(b"secret", &[hash]));
        assert!(!matches_any_digest(b"secreT", &[hash]));
    }
}
