//! `GET /v2/playwright`: a Playwright client (`chromium.connect()`) that
//! gets an instance of its own for the connection. The instance is created
//! through the normal path (placement, wait queue, warm pool, sandbox,
//! events) from the create body's options, given as query parameters
//! (`?image=…&config.record=true&config={…}`, each value JSON where it
//! parses as JSON, else a string) or as a `flotilla-options` header of the
//! body's JSON (query parameters override it). The connection is then the
//! instance's own (`/v2/instances/{id}/playwright`), and the instance is
//! deleted when the client disconnects, unless `keep=true`. The instance's
//! id is in the handshake's `flotilla-instance-id` header. Its options and
//! its instance's life are `app::playwright`'s; the relay is the door's.
//!
//! Credential: an API key, as `Authorization: Bearer` or `?token=` (the
//! guard reads either here).

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use flotilla_api_types::playwright::client_version;

use crate::app::playwright::{ConnectOptions, Relayed};
use crate::app::{ControlPlane, Scope};
use crate::error::Result;

/// The path, which the guard also reads `?token=` on.
pub const PATH: &str = "/v2/playwright";

/// `GET /v2/playwright`.
#[utoipa::path(get, path = "/v2/playwright", tag = "playwright",
    params(
        ("token" = Option<String>, Query, description = "An API key (or send Authorization: Bearer)"),
        ("keep" = Option<bool>, Query, description = "Keep the instance after the client disconnects (default false: deleted)"),
        ("wait_sec" = Option<u64>, Query, description = "Wait up to this many seconds for room (0..=scheduler.max_wait_sec)"),
        ("image" = Option<String>, Query, description = "Any member of the create body, by name or dotted path (config.record=true), its value JSON or a string"),
        ("flotilla-options" = Option<String>, Header, description = "The create body as JSON (query parameters override it)"),
    ),
    responses(
        (status = 101, description = "WebSocket of Playwright's protocol, to a new instance (its id in flotilla-instance-id)"),
        (status = 400, description = "Options that are not a create body", body = flotilla_api_types::ErrorResponse),
        (status = 401, description = "No valid API key", body = flotilla_api_types::ErrorResponse),
        (status = 426, description = "Not a WebSocket upgrade", body = flotilla_api_types::ErrorResponse),
        (status = 428, description = "The client's Playwright version is not installed on the node; the text names those that are", content_type = "text/plain"),
        (status = 503, description = "No node has room (within wait_sec)", body = flotilla_api_types::ErrorResponse),
    ))]
pub async fn connect(State(control_plane): State<Arc<ControlPlane>>, request: Request) -> Response {
    connect_new(&control_plane, request)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

async fn connect_new(control_plane: &Arc<ControlPlane>, mut request: Request) -> Result<Response> {
    super::door::check_upgrade(control_plane, &request, PATH)?;
    let options = ConnectOptions::read(
        request
            .headers()
            .get("flotilla-options")
            .map(HeaderValue::as_bytes),
        request.uri().query(),
    )?;
    // Not a Playwright client: refused before an instance is made for it
    // (the node answers a version it does not serve the same way).
    let user_agent = request
        .headers()
        .get(axum::http::header::USER_AGENT)
        .and_then(|value| value.to_str().ok());
    if user_agent.and_then(client_version).is_none() {
        return Ok((
            StatusCode::PRECONDITION_REQUIRED,
            "not a Playwright client (its User-Agent names no Playwright version): connect with Playwright's chromium.connect()\n",
        )
            .into_response());
    }
    let scope = request
        .extensions()
        .get::<Scope>()
        .cloned()
        .unwrap_or(Scope::Admin);
    // The client's query (its options, its key) is not passed on.
    *request.uri_mut() = axum::http::Uri::from_static("/playwright");
    let relaying = control_plane.clone();
    control_plane
        .playwright_connect(options, scope, move |target| async move {
            let (closed, ended) = tokio::sync::oneshot::channel::<()>();
            let mut answer =
                super::door::forward_playwright(&relaying, request, &target, closed).await;
            if let Ok(value) = HeaderValue::from_str(target.id.as_str()) {
                answer.headers_mut().insert("flotilla-instance-id", value);
            }
            let upgraded = answer.status() == StatusCode::SWITCHING_PROTOCOLS;
            Relayed {
                answer,
                upgraded,
                ended,
            }
        })
        .await
}
