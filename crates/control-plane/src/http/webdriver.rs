//! WebDriver's endpoints on the control plane's port, under `/` and under
//! `/wd/hub` (Selenium Grid's prefix): `POST /session` creates an instance
//! and attaches its node's chromedriver to its browser, `/session/{id}/…`
//! passes every command on to that chromedriver (through the instance's
//! HTTP port, like the front door), `DELETE /session/{id}` ends the session
//! and deletes the instance, `GET /status` answers as Grid 4 does. Every
//! refusal is the W3C JSON (`{"value": {"error", "message", "stacktrace"}}`).

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Extension, Path, Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use http_body_util::BodyExt as _;
use serde_json::{Value, json};

use flotilla_api_types::InstanceId;
use flotilla_api_types::webdriver_path::{CommandPath, CommandPathError};

use crate::app::keys::Principal;
use crate::app::webdriver::WebDriverRefusal;
use crate::app::webdriver_sessions::{InstancePort, PortCall, SessionCaller};
use crate::app::{ControlPlane, DoorTarget, Scope};

/// The largest new-session body (capabilities with a base64 extension or
/// profile would be larger; those are refused anyway).
const MAX_NEW_SESSION: usize = 1 << 20;

impl IntoResponse for WebDriverRefusal {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        (status, axum::Json(self.body())).into_response()
    }
}

/// What the request's key sees (an admin's when none was needed).
fn scope_of(request: &Request) -> Scope {
    request
        .extensions()
        .get::<Scope>()
        .cloned()
        .unwrap_or(Scope::Admin)
}

fn principal_of(request: &Request) -> String {
    request
        .extensions()
        .get::<Principal>()
        .map_or_else(|| "anonymous".into(), |p| p.0.clone())
}

/// `POST /session`, `POST /wd/hub/session`.
#[utoipa::path(post, path = "/session", tag = "webdriver",
    request_body(content = Object, description = "W3C: {\"capabilities\": {\"alwaysMatch\": {…}, \"firstMatch\": [{…}]}}; also at /wd/hub/session"),
    responses(
        (status = 200, description = "{\"value\": {\"sessionId\", \"capabilities\"}}: the session id is its instance's id", content_type = "application/json"),
        (status = 400, description = "W3C invalid argument (a capability of the wrong type, refused goog:chromeOptions or moz:firefoxOptions args, options or prefs)", content_type = "application/json"),
        (status = 401, description = "No valid API key (Bearer, or Basic from http://user:KEY@host)", content_type = "application/json"),
        (status = 500, description = "W3C session not created (no room within webdriver.session_request_timeout_sec, a browser or version the fleet does not run)", content_type = "application/json"),
    ))]
pub async fn new_session(
    State(control_plane): State<Arc<ControlPlane>>,
    request: Request,
) -> Response {
    let caller = session_caller(&control_plane, &request);
    match start(&control_plane, caller, request).await {
        Ok(value) => axum::Json(json!({"value": value})).into_response(),
        Err(refusal) => refusal.into_response(),
    }
}

/// Starts the session `request` asks for.
async fn start(
    control_plane: &ControlPlane,
    caller: SessionCaller,
    request: Request,
) -> Result<Value, WebDriverRefusal> {
    let body = limited_body(request).await?;
    control_plane
        .webdriver_session_start(&body, caller, &DoorPort)
        .await
}

/// Who asks for a new session, and where they reached the door.
fn session_caller(control_plane: &ControlPlane, request: &Request) -> SessionCaller {
    SessionCaller {
        principal: principal_of(request),
        scope: scope_of(request),
        key: request
            .extensions()
            .get::<crate::app::keys::KeyDigest>()
            .map(|digest| hex::encode(digest.0)),
        door: door_authority(control_plane, request),
    }
}

/// The new session's body, at most [`MAX_NEW_SESSION`].
async fn limited_body(request: Request) -> Result<bytes::Bytes, WebDriverRefusal> {
    Ok(
        http_body_util::Limited::new(request.into_body(), MAX_NEW_SESSION)
            .collect()
            .await
            .map_err(|_| {
                WebDriverRefusal::invalid_argument("the new session's body is larger than 1 MiB")
            })?
            .to_bytes(),
    )
}

/// `ws(s)://host[:port]` of the door, as the client reached it (or
/// `public_url`).
fn door_authority(control_plane: &ControlPlane, request: &Request) -> String {
    if let Some(public) = &control_plane.config().public_url {
        let public = public.trim_end_matches('/');
        return public
            .replacen("https://", "wss://", 1)
            .replacen("http://", "ws://", 1);
    }
    let host = request
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .filter(|h| {
            h.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-.:[]".contains(&b))
        })
        .unwrap_or("localhost");
    format!("ws://{host}")
}

/// The instance's HTTP port, through the front door's connections.
struct DoorPort;

#[async_trait::async_trait]
impl InstancePort for DoorPort {
    async fn call(&self, target: &DoorTarget, call: PortCall) -> std::io::Result<(u16, Value)> {
        let ours = call
            .headers
            .iter()
            .map(|(name, value)| HeaderValue::from_str(value).map(|value| (*name, value)))
            .collect::<Result<Vec<_>, _>>()
            .map_err(std::io::Error::other)?;
        let method = Method::from_bytes(call.method.as_bytes()).map_err(std::io::Error::other)?;
        let request = Request::builder()
            .method(method)
            .uri(&call.path)
            .header(header::CONTENT_TYPE, "application/json")
            .extension(super::door::AgentHeaders(ours))
            .body(Body::from(call.body))
            .map_err(std::io::Error::other)?;
        let response = super::door::forward_to_http_port(request, target, call.path).await?;
        let status = response.status().as_u16();
        let bytes = response
            .into_body()
            .collect()
            .await
            .map_err(std::io::Error::other)?
            .to_bytes();
        Ok((
            status,
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        ))
    }
}

/// `/session/{id}` and `/session/{id}/…` (and under `/wd/hub`): `DELETE`
/// of the bare path ends the session and deletes its instance; everything
/// else is passed on to the session's chromedriver.
pub async fn session(
    State(control_plane): State<Arc<ControlPlane>>,
    Path(params): Path<Vec<(String, String)>>,
    request: Request,
) -> Response {
    let id = params
        .into_iter()
        .find_map(|(name, value)| (name == "id").then_some(value));
    let id = InstanceId::new(id.unwrap_or_default());
    let answered = session_command(&control_plane, id, request).await;
    answered.unwrap_or_else(IntoResponse::into_response)
}

/// A command of session `id`, ended here or passed on.
async fn session_command(
    control_plane: &ControlPlane,
    id: InstanceId,
    request: Request,
) -> Result<Response, WebDriverRefusal> {
    let rest = command_path(request.uri().path())
        .map_err(|error| WebDriverRefusal::unknown_command(error.to_string()))?;
    let target = control_plane
        .webdriver_target(&id, &principal_of(&request))
        .await?;
    if rest.is_session() && request.method() == Method::DELETE {
        control_plane
            .webdriver_session_end(&target, &id, &DoorPort)
            .await?;
        return Ok(axum::Json(json!({"value": null})).into_response());
    }
    // Sent on as the client wrote it: the node checks it the same way.
    let path = format!("/webdriver/session/{id}{}", rest.raw());
    super::door::forward_to_http_port(request, &target, path)
        .await
        .map_err(|error| {
            WebDriverRefusal::unknown(format!("the instance's node did not answer: {error}"))
        })
}

/// What follows `/session/{id}` in `path` (under `/wd/hub` or not), as
/// the client sent it, checked (see [`CommandPath`]).
fn command_path(path: &str) -> Result<CommandPath, CommandPathError> {
    let after = path.strip_prefix("/wd/hub").unwrap_or(path);
    let after = after.strip_prefix("/session/").unwrap_or_default();
    CommandPath::parse(after.find('/').map_or("", |at| &after[at..]))
}

/// `GET /status`, `GET /wd/hub/status` (open, as Grid's; its `nodes` for
/// an admin key, or anyone with authentication off).
#[utoipa::path(get, path = "/status", tag = "webdriver", security(()),
    responses((status = 200, description = "Grid 4's status: {\"value\": {\"ready\", \"message\", \"nodes\"}}; also at /wd/hub/status", content_type = "application/json")))]
pub async fn status(
    State(control_plane): State<Arc<ControlPlane>>,
    Extension(principal): Extension<Principal>,
    Extension(scope): Extension<Scope>,
) -> Response {
    let nodes_shown = principal.reads_the_fleet(control_plane.config().auth_enabled, &scope);
    match control_plane.webdriver_status(nodes_shown).await {
        Ok(value) => ([(header::CACHE_CONTROL, "no-store")], axum::Json(value)).into_response(),
        Err(error) => WebDriverRefusal::unknown(error.to_string()).into_response(),
    }
}

/// The OpenAPI entries of the session paths ([`session`] serves them all:
/// only the entries of these functions are used).
#[allow(dead_code)]
pub mod docs {
    /// Ends the session and deletes its instance (also at /wd/hub/session/{session_id}).
    #[utoipa::path(delete, path = "/session/{session_id}", tag = "webdriver",
        params(("session_id" = String, Path, description = "The session's (and its instance's) id")),
        responses((status = 200, description = "{\"value\": null}", content_type = "application/json"),
            (status = 401, content_type = "application/json"),
            (status = 404, description = "W3C invalid session id", content_type = "application/json")))]
    pub async fn session_delete() {}

    /// Any W3C WebDriver command of the session (`url`, `element`,
    /// `execute/sync`, `screenshot`, `window/rect`, `goog/cdp/execute`, …;
    /// also under /wd/hub), answered by the instance's chromedriver; and
    /// Grid's file commands, answered by the node: `se/file` (an upload,
    /// `{"file": base64 zip of one file}` → its path in the browser) and
    /// `se/files` (managed downloads: GET lists, POST `{"name"}` answers a
    /// base64 zip, DELETE removes them).
    #[utoipa::path(post, path = "/session/{session_id}/{command}", tag = "webdriver",
        params(("session_id" = String, Path), ("command" = String, Path, description = "The rest of the W3C command path")),
        responses((status = 200, description = "chromedriver's answer", content_type = "application/json"),
            (status = 401, content_type = "application/json"),
            (status = 400, description = "W3C invalid argument (a malformed upload or download name, a body over its limit)", content_type = "application/json"),
            (status = 404, description = "W3C invalid session id, or unknown command", content_type = "application/json")))]
    pub async fn session_command() {}
}
