//! `GET /v2/playwright`: a Playwright client (`chromium.connect()`) that
//! gets an instance of its own for the connection. The instance is created
//! through the normal path (placement, wait queue, warm pool, sandbox,
//! events) from the create body's options, given as query parameters
//! (`?image=…&config.record=true&config={…}`, each value JSON where it
//! parses as JSON, else a string) or as a `flotilla-options` header of the
//! body's JSON (query parameters override it). The connection is then the
//! instance's own (`/v2/instances/{id}/playwright`), and the instance is
//! deleted when the client disconnects, unless `keep=true`. The instance's
//! id is in the handshake's `flotilla-instance-id` header.
//!
//! Credential: an API key, as `Authorization: Bearer` or `?token=` (the
//! guard reads either here).

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value};

use flotilla_api_types::InstanceId;
use flotilla_api_types::instances::CreateInstanceRequest;
use flotilla_api_types::playwright::client_version;

use crate::app::ControlPlane;
use crate::error::{Error, Result};

/// The path, which the guard also reads `?token=` on.
pub const PATH: &str = "/v2/playwright";
/// The largest `flotilla-options` header, and the longest query.
const MAX_OPTIONS: usize = 64 << 10;
/// The deepest dotted name (`config.proxy.server` is three).
const MAX_NAME_DEPTH: usize = 4;

/// What a connection asks for.
#[derive(Debug, Clone)]
pub struct ConnectOptions {
    pub create: CreateInstanceRequest,
    /// Keep the instance after the client disconnects.
    pub keep: bool,
    /// Seconds to wait in the create queue for room.
    pub wait_sec: u64,
}

impl ConnectOptions {
    /// Reads the `flotilla-options` header (`header`) and the query.
    pub fn read(header: Option<&[u8]>, query: Option<&str>) -> Result<Self> {
        let invalid = |why: String| Error::InvalidRequest(why);
        let mut body = match header {
            Some(bytes) if bytes.len() > MAX_OPTIONS => {
                return Err(invalid(format!(
                    "the flotilla-options header is over {MAX_OPTIONS} bytes"
                )));
            }
            Some(bytes) => match serde_json::from_slice::<Value>(bytes) {
                Ok(Value::Object(body)) => body,
                Ok(_) => {
                    return Err(invalid(
                        "flotilla-options must be a JSON object (the create body)".into(),
                    ));
                }
                Err(error) => {
                    return Err(invalid(format!("flotilla-options is not JSON: {error}")));
                }
            },
            None => Map::new(),
        };
        let query = query.unwrap_or("");
        if query.len() > MAX_OPTIONS {
            return Err(invalid(format!("the query is over {MAX_OPTIONS} bytes")));
        }
        let (mut keep, mut wait_sec) = (false, 0);
        for (name, value) in form_urlencoded::parse(query.as_bytes()) {
            match name.as_ref() {
                "token" => {}
                "keep" => {
                    keep = value.parse().map_err(|_| {
                        invalid(format!("keep must be true or false (got {value:?})"))
                    })?;
                }
                "wait_sec" => {
                    wait_sec = value.parse().map_err(|_| {
                        invalid(format!("wait_sec must be an integer (got {value:?})"))
                    })?;
                }
                _ => set_option(&mut body, &name, &value)?,
            }
        }
        let create = serde_json::from_value(Value::Object(body))
            .map_err(|error| invalid(format!("the instance's options: {error}")))?;
        Ok(Self {
            create,
            keep,
            wait_sec,
        })
    }
}

/// Sets `name` (`image`, or a dotted path such as `config.record`) in the
/// create body to `value`, read as JSON where it parses, else as a string.
fn set_option(body: &mut Map<String, Value>, name: &str, value: &str) -> Result<()> {
    let invalid = |why: String| Error::InvalidRequest(why);
    if name.split('.').count() > MAX_NAME_DEPTH {
        return Err(invalid(format!(
            "{name:?} is not an option (at most {MAX_NAME_DEPTH} names deep)"
        )));
    }
    let parsed = serde_json::from_str(value).unwrap_or_else(|_| Value::String(value.to_owned()));
    let mut keys = name.split('.').peekable();
    let mut at = body;
    while let Some(key) = keys.next() {
        if key.is_empty() {
            return Err(invalid(format!("{name:?} is not an option")));
        }
        if keys.peek().is_none() {
            at.insert(key.to_owned(), parsed);
            return Ok(());
        }
        let next = at
            .entry(key.to_owned())
            .or_insert_with(|| Value::Object(Map::new()));
        at = next.as_object_mut().ok_or_else(|| {
            invalid(format!(
                "{name:?}: {key} is given as a value and as an object"
            ))
        })?;
    }
    Err(invalid(format!("{name:?} is not an option")))
}

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

async fn connect_new(control_plane: &Arc<ControlPlane>, request: Request) -> Result<Response> {
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
    // The instance is made, reached and deleted by a task of its own: a
    // client that leaves while it is made (the request's future dropped)
    // leaves no instance behind.
    let (answer, answered) = tokio::sync::oneshot::channel();
    let connection = control_plane.clone();
    control_plane
        .tasks()
        .spawn("playwright connection", async move {
            let made = open(&connection, request, &options).await;
            let (id, response, on_close) = match made {
                Ok(made) => made,
                Err(error) => {
                    let _ = answer.send(Err(error));
                    return;
                }
            };
            let switched = response.status() == StatusCode::SWITCHING_PROTOCOLS;
            let delivered = answer.send(Ok(response)).is_ok();
            if delivered && switched {
                if options.keep {
                    return;
                }
                // Sent never: resolves when the relay ends.
                let _ = on_close.await;
            }
            if let Err(error) = connection.instance_delete(&id, true).await {
                tracing::warn!(instance = %id, %error, "cannot delete a Playwright connection's instance");
            }
        });
    answered
        .await
        .map_err(|_| Error::InsufficientCapacity("the control plane is stopping".into()))?
}

/// Makes the connection's instance and forwards `request` to it: the
/// instance, the answer, and what resolves when the connection ends (at
/// once when it was not upgraded).
async fn open(
    control_plane: &ControlPlane,
    mut request: Request,
    options: &ConnectOptions,
) -> Result<(InstanceId, Response, tokio::sync::oneshot::Receiver<()>)> {
    let scope = request
        .extensions()
        .get::<crate::app::Scope>()
        .cloned()
        .unwrap_or(crate::app::Scope::Admin);
    let instance = control_plane
        .instance_create_waiting(options.create.clone(), options.wait_sec, &scope)
        .await?;
    let id = instance.id;
    let target = match control_plane
        .door_open(&id, Some((&scope, None)), &[])
        .await
    {
        Ok(target) => target,
        Err(error) => {
            let _ = control_plane.instance_delete(&id, true).await;
            return Err(error);
        }
    };
    // The client's query (its options, its key) is not passed on.
    *request.uri_mut() = axum::http::Uri::from_static("/playwright");
    let (closed, on_close) = tokio::sync::oneshot::channel::<()>();
    let mut response =
        super::door::forward_playwright(control_plane, request, &target, closed).await;
    if let Ok(value) = HeaderValue::from_str(id.as_str()) {
        response.headers_mut().insert("flotilla-instance-id", value);
    }
    Ok((id, response, on_close))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_come_from_the_query_and_the_header() {
        let options = ConnectOptions::read(
            Some(br#"{"image": "chromium", "config": {"record": true}}"#),
            Some("token=k&keep=true&wait_sec=5&image=chromium-headless-shell&config.max_duration_minutes=5&config.proxy=%7B%22server%22%3A%22http%3A%2F%2Fp%3A1%22%7D"),
        )
        .unwrap();
        assert!(options.keep);
        assert_eq!(options.wait_sec, 5);
        assert_eq!(
            options.create.image.as_deref(),
            Some("chromium-headless-shell")
        );
        let config = options.create.config.unwrap();
        assert!(config.record);
        assert_eq!(config.max_duration_minutes, Some(5.0));
        assert!(config.proxy.is_some());
        let none = ConnectOptions::read(None, None).unwrap();
        assert!(none.create.image.is_none() && none.create.config.is_none());
        assert!(!none.keep);
    }

    #[test]
    fn bad_options_are_refused_naming_them() {
        let refused =
            |header: Option<&[u8]>, query: &str| match ConnectOptions::read(header, Some(query)) {
                Err(Error::InvalidRequest(why)) => why,
                other => panic!("{query}: {other:?}"),
            };
        assert!(refused(None, "colour=blue").contains("colour"));
        assert!(refused(None, "config.no_such=1").contains("no_such"));
        assert!(refused(None, "keep=perhaps").contains("keep"));
        assert!(refused(None, "wait_sec=-1").contains("wait_sec"));
        assert!(refused(None, "image=a&image.b=c").contains("image"));
        assert!(refused(None, ".=1").contains("not an option"));
        assert!(refused(Some(b"[1]"), "").contains("JSON object"));
        assert!(refused(Some(b"{"), "").contains("not JSON"));
        assert!(refused(Some(&vec![b' '; MAX_OPTIONS + 1]), "").contains("over"));
        assert!(refused(None, &"a=".repeat(MAX_OPTIONS)).contains("over"));
        // A name deep enough to nest thousands of objects (whose drop would
        // recurse as deep) is refused before anything is built.
        let deep = format!("{}=1", vec!["a"; 30_000].join("."));
        assert!(refused(None, &deep).contains("deep"));
        assert!(refused(None, "config.proxy.server.x.y=1").contains("deep"));
    }
}
