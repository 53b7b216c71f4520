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

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Instant;

use axum::extract::{ConnectInfo, MatchedPath, Request, State};
use axum::http::{HeaderMap, HeaderValue};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use flotilla_api_types::credentials::bearer_token;

use crate::app::ControlPlane;
use crate::app::Scope;
use crate::app::keys::{Caller, KeyRing, Principal};
use crate::error::Error;

/// The key's id when the request carries an accepted key. Every accepted
/// key is compared, so the time does not say which one matched.
fn caller_of(
    keys: &KeyRing,
    headers: &HeaderMap,
    path: &str,
    query: Option<&str>,
) -> Option<Caller> {
    let Some(authorization) = headers.get(axum::http::header::AUTHORIZATION) else {
        // Playwright clients may carry the key in the URL they connect to.
        let key = (path == super::playwright::PATH)
            .then(|| query_token(query?))
            .flatten()?;
        return keys.caller_of_key(&key);
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
    keys.caller_of_key(presented)
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
    let keys = &control_plane.keys;
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
    let caller = caller_of(
        keys,
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
    let quota = keys
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
        (_, None)
            if keys.auth_enabled
                && !super::routes::is_open(&path, !keys.metrics_require_auth)
                && !door =>
        {
            unauthorized(&request)
        }
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
