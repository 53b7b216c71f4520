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

use crate::app::webdriver::{NewSession, WebDriverRefusal};
use crate::app::{ControlPlane, DoorTarget, Scope};
use crate::http::Principal;

/// The largest new-session body (capabilities with a base64 extension or
/// profile would be larger; those are refused anyway).
const MAX_NEW_SESSION: usize = 1 << 20;

impl IntoResponse for WebDriverRefusal {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        (status, axum::Json(self.body())).into_response()
    }
}

fn unknown(message: impl Into<String>) -> WebDriverRefusal {
    WebDriverRefusal {
        status: 500,
        code: "unknown error",
        message: message.into(),
    }
}

/// What the request's key sees (an admin's when none was needed).
fn scope_of(request: &Request) -> crate::app::Scope {
    request
        .extensions()
        .get::<crate::app::Scope>()
        .cloned()
        .unwrap_or(crate::app::Scope::Admin)
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
        (status = 400, description = "W3C invalid argument (a capability of the wrong type, refused goog:chromeOptions args)", content_type = "application/json"),
        (status = 401, description = "No valid API key (Bearer, or Basic from http://user:KEY@host)", content_type = "application/json"),
        (status = 500, description = "W3C session not created (no room within webdriver.session_request_timeout_sec, a browser or version the fleet does not run)", content_type = "application/json"),
    ))]
pub async fn new_session(
    State(control_plane): State<Arc<ControlPlane>>,
    request: Request,
) -> Response {
    match create(&control_plane, request).await {
        Ok(value) => axum::Json(json!({"value": value})).into_response(),
        Err(refusal) => refusal.into_response(),
    }
}

async fn create(
    control_plane: &Arc<ControlPlane>,
    request: Request,
) -> Result<Value, WebDriverRefusal> {
    let owner = principal_of(&request);
    let scope = scope_of(&request);
    let owner_key = request
        .extensions()
        .get::<crate::http::KeyDigest>()
        .map(|digest| hex::encode(digest.0));
    let external = door_authority(control_plane, &request);
    let body = http_body_util::Limited::new(request.into_body(), MAX_NEW_SESSION)
        .collect()
        .await
        .map_err(|_| {
            WebDriverRefusal::invalid_argument("the new session's body is larger than 1 MiB")
        })?
        .to_bytes();
    let body: Value = serde_json::from_slice(&body)
        .map_err(|e| WebDriverRefusal::invalid_argument(format!("the body is not JSON: {e}")))?;
    let installed = control_plane
        .webdriver_browser_version()
        .await
        .map_err(|e| unknown(e.to_string()))?;
    let session = crate::app::webdriver::new_session(&body, &installed)?;
    let instance = control_plane
        .webdriver_instance_create(&session, (&owner, &scope))
        .await?;
    let owners = Owners {
        principal: &owner,
        key: owner_key.as_deref(),
    };
    match attach(control_plane, &instance.id, &session, (owners, &external)).await {
        Ok(value) => Ok(value),
        Err(refusal) => {
            // Nothing is left behind a session that did not start.
            let _ = control_plane.instance_delete(&instance.id, true).await;
            Err(refusal)
        }
    }
}

/// Whose a new session is: the principal (checked on the front door) and
/// its key's digest (checked by the node on the instance's own port).
#[derive(Clone, Copy)]
struct Owners<'a> {
    principal: &'a str,
    key: Option<&'a str>,
}

/// Asks the instance's node to attach chromedriver to its browser; the
/// new session's answer, as a client expects it.
async fn attach(
    control_plane: &ControlPlane,
    id: &InstanceId,
    session: &NewSession,
    (owners, external): (Owners<'_>, &str),
) -> Result<Value, WebDriverRefusal> {
    let target = control_plane.webdriver_target(id, owners.principal).await?;
    let body = json!({"capabilities": session.capabilities}).to_string();
    let owner_header = owners
        .key
        .map(|key| ("x-flotilla-webdriver-owner", key.to_owned()));
    let (status, answer) = call_with(
        &target,
        (Method::POST, "/webdriver/session".into(), body),
        owner_header.as_slice(),
    )
    .await?;
    let mut value = answer.get("value").cloned().unwrap_or(Value::Null);
    if !status.is_success() || value.get("sessionId").is_none() {
        let message = value["message"]
            .as_str()
            .unwrap_or("the node did not start the session");
        return Err(WebDriverRefusal::not_created(message.to_owned()));
    }
    if let Some((width, height)) = session.window_size {
        let rect = json!({"width": width, "height": height}).to_string();
        let path = format!("/webdriver/session/{id}/window/rect");
        call(&target, Method::POST, path, rect).await?;
    }
    let capabilities = &mut value["capabilities"];
    if let Some(chrome) = capabilities
        .get_mut("goog:chromeOptions")
        .and_then(Value::as_object_mut)
    {
        chrome.remove("debuggerAddress");
    }
    let query = target
        .token
        .as_deref()
        .map(|t| format!("?token={t}"))
        .unwrap_or_default();
    // chromedriver's socket is inside the instance's network: the client
    // gets the front door's, which relays to it.
    if capabilities
        .get("webSocketUrl")
        .is_some_and(Value::is_string)
    {
        capabilities["webSocketUrl"] = json!(format!(
            "{external}/v2/instances/{id}/webdriver/bidi{query}"
        ));
    }
    if session.downloads_enabled {
        capabilities["se:downloadsEnabled"] = json!(true);
    }
    capabilities["platformName"] = json!("linux");
    let version = capabilities["browserVersion"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    capabilities["se:cdp"] = json!(format!("{external}/v2/instances/{id}/se/cdp{query}"));
    capabilities["se:cdpVersion"] = json!(version);
    capabilities["flotilla:instance"] = json!(id);
    value["sessionId"] = json!(id);
    Ok(value)
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

/// A request of ours to the instance's HTTP port: its status and JSON.
async fn call(
    target: &DoorTarget,
    method: Method,
    path: String,
    body: String,
) -> Result<(StatusCode, Value), WebDriverRefusal> {
    call_with(target, (method, path, body), &[]).await
}

/// [`call`] with more header lines.
async fn call_with(
    target: &DoorTarget,
    (method, path, body): (Method, String, String),
    headers: &[(&'static str, String)],
) -> Result<(StatusCode, Value), WebDriverRefusal> {
    let ours = headers
        .iter()
        .map(|(name, value)| HeaderValue::from_str(value).map(|value| (*name, value)))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| unknown(e.to_string()))?;
    let request = Request::builder()
        .method(method)
        .uri(&path)
        .header(header::CONTENT_TYPE, "application/json")
        .extension(super::door::AgentHeaders(ours))
        .body(Body::from(body))
        .map_err(|e| unknown(e.to_string()))?;
    let response = super::door::forward_to_http_port(request, target, path)
        .await
        .map_err(|e| unknown(format!("the instance's node did not answer: {e}")))?;
    let status = response.status();
    let bytes = response
        .into_body()
        .collect()
        .await
        .map_err(|e| unknown(format!("the instance's node did not answer: {e}")))?
        .to_bytes();
    let value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    Ok((status, value))
}

/// `/session/{id}` and `/session/{id}/…` (and under `/wd/hub`): `DELETE`
/// of the bare path ends the session and deletes its instance; everything
/// else is passed on to the session's chromedriver.
pub async fn session(
    State(control_plane): State<Arc<ControlPlane>>,
    Path(params): Path<Vec<(String, String)>>,
    request: Request,
) -> Response {
    let value = |name: &str| {
        params
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
    };
    let id = InstanceId::new(value("id").unwrap_or_default());
    let rest = match command_path(request.uri().path()) {
        Ok(rest) => rest,
        Err(error) => {
            return WebDriverRefusal {
                status: 404,
                code: "unknown command",
                message: error.to_string(),
            }
            .into_response();
        }
    };
    let principal = principal_of(&request);
    let target = match control_plane.webdriver_target(&id, &principal).await {
        Ok(target) => target,
        Err(refusal) => return refusal.into_response(),
    };
    if rest.is_session() && request.method() == Method::DELETE {
        return end(&control_plane, &target, &id).await;
    }
    // Sent on as the client wrote it: the node checks it the same way.
    let path = format!("/webdriver/session/{id}{}", rest.raw());
    match super::door::forward_to_http_port(request, &target, path).await {
        Ok(response) => response,
        Err(error) => {
            unknown(format!("the instance's node did not answer: {error}")).into_response()
        }
    }
}

/// What follows `/session/{id}` in `path` (under `/wd/hub` or not), as
/// the client sent it, checked (see [`CommandPath`]).
fn command_path(path: &str) -> Result<CommandPath, CommandPathError> {
    let after = path.strip_prefix("/wd/hub").unwrap_or(path);
    let after = after.strip_prefix("/session/").unwrap_or_default();
    CommandPath::parse(after.find('/').map_or("", |at| &after[at..]))
}

/// Ends session `id`: chromedriver lets the browser go, the instance is
/// deleted (gracefully: a persistent profile is written back).
async fn end(control_plane: &ControlPlane, target: &DoorTarget, id: &InstanceId) -> Response {
    let _ = call(
        target,
        Method::DELETE,
        format!("/webdriver/session/{id}"),
        String::new(),
    )
    .await;
    match control_plane.instance_delete(id, false).await {
        Ok(_) => axum::Json(json!({"value": null})).into_response(),
        Err(error) => unknown(error.to_string()).into_response(),
    }
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
        Ok(value) => {
            let mut response = axum::Json(value).into_response();
            response
                .headers_mut()
                .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
            response
        }
        Err(error) => unknown(error.to_string()).into_response(),
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
