//! The front door (HTTP side): every instance through the control plane's own
//! port, so that clients need to reach nothing else.
//!
//! - By path: `/v2/instances/{id}/cdp` (the browser's CDP WebSocket),
//!   `/v2/instances/{id}/json/…` and `/devtools/…` (the DevTools HTTP and
//!   WebSocket endpoints), `/stream` (MJPEG), `/stream/ws` (binary frames),
//!   `/stream/frame.jpg`, `/screenshot`, `/tabs`.
//! - By subdomain: with `gateway.base_domain`, `Host: <subdomain>.<base_domain>`
//!   reaches the instance with the same paths minus `/v2/instances/{id}`, so
//!   each instance has an origin of its own.
//!
//! A request is admitted by an API key (the guard) or the instance's token
//! (`app::door`), then forwarded to the instance's port on its node (the
//! node agent's host), carrying the instance's token; the agent's servers do
//! the rest (activity, waking a dormant instance, download rewriting). Bodies
//! stream through (an MJPEG stream never ends); WebSocket upgrades are relayed
//! as bytes once the agent has answered 101. DevTools answers get their URLs
//! pointed back through the door, on the scheme and host the client used
//! (`X-Forwarded-Proto` / `X-Forwarded-Host` only from `trusted_proxies`).
//! The credential of the client is never passed on, nor logged.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{ConnectInfo, Path, Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http_body_util::BodyExt;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use flotilla_api_types::InstanceId;
use flotilla_api_types::credentials::bearer_token;
use flotilla_api_types::origin::same_origin;

use crate::app::{ControlPlane, DoorTarget};
use crate::error::Error;
use crate::http::Principal;

/// Which of the instance's ports a route reaches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Port {
    Debug,
    Stream,
    Http,
}

/// Where a door path goes on the instance: port, path, whether the
/// answer's DevTools URLs must be pointed back through the door, and
/// whether it is a WebSocket endpoint (nothing else is served there).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Route {
    port: Port,
    path: String,
    rewrite: bool,
    websocket: bool,
}

/// The route of `rest`, the path after the instance prefix (or the whole
/// path on a subdomain); `None` when the door has nothing there.
fn route(id: &InstanceId, rest: &str) -> Option<Route> {
    let to = |port, path: &str, rewrite| {
        Some(Route {
            port,
            path: path.to_owned(),
            rewrite,
            websocket: false,
        })
    };
    let socket = |port, path: &str| {
        Some(Route {
            port,
            path: path.to_owned(),
            rewrite: false,
            websocket: true,
        })
    };
    match rest {
        // `/se/cdp`: the same, where Selenium's clients look for it (a
        // session's `se:cdp`; selenium-webdriver uses any URL with this
        // path as it is).
        "/cdp" | "/se/cdp" => socket(Port::Debug, &format!("/devtools/browser/{id}")),
        "/json" => to(Port::Debug, "/json", true),
        "/stream" => to(Port::Stream, "/", false),
        "/stream/ws" => socket(Port::Stream, "/ws"),
        "/stream/frame.jpg" => to(Port::Stream, "/frame.jpg", false),
        "/screenshot" => to(Port::Http, "/screenshot", false),
        "/downloads" => to(Port::Http, "/downloads", false),
        "/recordings" => to(Port::Http, "/recordings", false),
        "/tabs" => to(Port::Http, "/tabs", false),
        "/webdriver/bidi" => socket(Port::Http, &format!("/webdriver/session/{id}/se/bidi")),
        _ if rest.starts_with("/json/") => to(Port::Debug, rest, true),
        _ if rest.starts_with("/devtools/") => socket(Port::Debug, rest),
        _ if rest.starts_with("/recordings/") && rest.len() > "/recordings/".len() => {
            to(Port::Http, rest, false)
        }
        _ if rest.starts_with("/downloads/") && rest.len() > "/downloads/".len() => {
            to(Port::Http, rest, false)
        }
        _ => None,
    }
}

/// The instance and the rest of a `/v2/instances/{id}/…` door path.
fn split_door_path(path: &str) -> Option<(&str, &str)> {
    let after = path.strip_prefix("/v2/instances/")?;
    let id = after.split_once('/')?.0;
    let rest = &after[id.len()..];
    let kind = rest.trim_start_matches('/').split('/').next()?;
    matches!(
        kind,
        "cdp"
            | "json"
            | "devtools"
            | "stream"
            | "screenshot"
            | "tabs"
            | "downloads"
            | "recordings"
            | "webdriver"
            | "se"
    )
    .then_some((id, rest))
}

/// Whether the guard should leave authentication of `request` to the door
/// (an instance token opens it as well as an API key).
pub fn is_door_request(control_plane: &ControlPlane, request: &Request) -> bool {
    split_door_path(request.uri().path()).is_some()
        || subdomain_of(control_plane, request).is_some()
}

fn subdomain_of(control_plane: &ControlPlane, request: &Request) -> Option<InstanceId> {
    let host = request.headers().get(header::HOST)?.to_str().ok()?;
    control_plane.door_instance_of_host(host)
}

/// Middleware: a request on an instance's subdomain goes through the door,
/// whatever its path; any other request goes on to the router.
pub async fn by_subdomain(
    State(control_plane): State<Arc<ControlPlane>>,
    request: Request,
    next: Next,
) -> Response {
    let Some(id) = subdomain_of(&control_plane, &request) else {
        return next.run(request).await;
    };
    let rest = request.uri().path().to_owned();
    match route(&id, &rest) {
        Some(route) => pass(&control_plane, request, id, route, "").await,
        None => not_on_subdomain(&rest).into_response(),
    }
}

fn not_on_subdomain(rest: &str) -> Error {
    Error::NotFound(format!(
        "no such path on an instance's subdomain: {rest}; the door serves /json/…, /devtools/…, /stream, /stream/ws, /stream/frame.jpg, /screenshot, /tabs, /downloads and /recordings"
    ))
}

/// `/json/protocol` and `/json/version` at the door's root, where CDP
/// clients given a door URL look for them (chrome-remote-interface fetches
/// the protocol from the root of its WebSocket's host): the fleet's Chromium
/// answers them, through any running instance. They describe the browser and
/// its protocol, nothing of an instance (`webSocketDebuggerUrl` is left out:
/// an instance's own is at `/v2/instances/{id}/json/version`), so they are
/// open like `/openapi.json`.
pub async fn devtools_document(
    State(control_plane): State<Arc<ControlPlane>>,
    uri: axum::http::Uri,
) -> Response {
    let path = uri.path();
    let fetched = async {
        let target = control_plane.door_any_running().await?;
        let route = Route {
            port: Port::Debug,
            path: path.to_owned(),
            rewrite: false,
            websocket: false,
        };
        let request = Request::builder()
            .uri(path)
            .body(Body::empty())
            .map_err(Error::internal)?;
        let external = External {
            secure: false,
            authority: String::new(),
        };
        let response = forward_http(request, &target, &route, &external, "")
            .await
            .map_err(|error| Error::BadGateway(format!("the browser did not answer: {error}")))?;
        let bytes = http_body_util::Limited::new(response.into_body(), MAX_REWRITTEN_BODY)
            .collect()
            .await
            .map_err(|error| Error::BadGateway(format!("the browser's answer: {error}")))?
            .to_bytes();
        let mut document: serde_json::Value = serde_json::from_slice(&bytes).map_err(|error| {
            Error::BadGateway(format!("the browser's answer is not JSON: {error}"))
        })?;
        if let Some(fields) = document.as_object_mut() {
            fields.remove("webSocketDebuggerUrl");
        }
        Ok::<_, Error>(axum::Json(document))
    };
    fetched.await.into_response()
}

/// Handler of every `/v2/instances/{instance_id}/…` door route.
pub async fn by_path(
    State(control_plane): State<Arc<ControlPlane>>,
    Path(params): Path<Vec<(String, String)>>,
    request: Request,
) -> Response {
    let path = request.uri().path().to_owned();
    match door_route(&params, &path) {
        Some((id, route)) => {
            let prefix = format!("/v2/instances/{id}");
            pass(&control_plane, request, id, route, &prefix).await
        }
        None => Error::NotFound(format!("no such path: {path}")).into_response(),
    }
}

/// The instance and the route a door path names, if it names one.
fn door_route(params: &[(String, String)], path: &str) -> Option<(InstanceId, Route)> {
    let (_, value) = params.iter().find(|(name, _)| name == "instance_id")?;
    let id = InstanceId::new(value.clone());
    let (_, rest) = split_door_path(path)?;
    let route = route(&id, rest)?;
    Some((id, route))
}

/// Admits `request` and forwards it along `route`.
async fn pass(
    control_plane: &ControlPlane,
    request: Request,
    id: InstanceId,
    route: Route,
    prefix: &str,
) -> Response {
    let key_holder = request
        .extensions()
        .get::<Principal>()
        .is_some_and(|p| p.0.starts_with("key:"));
    let header_token = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer_token)
        .map(str::to_owned);
    let query_token = request.uri().query().and_then(|q| {
        form_urlencoded::parse(q.as_bytes())
            .find(|(name, _)| name == "token")
            .map(|(_, value)| value.into_owned())
    });
    let tokens: Vec<&str> = header_token
        .iter()
        .chain(&query_token)
        .map(String::as_str)
        .collect();
    let target = match control_plane.door_open(&id, key_holder, &tokens).await {
        Ok(target) => target,
        Err(error) => return error.into_response(),
    };
    // A WebDriver session's BiDi socket is its key's, as its commands are
    // (the instance's own token opens it too).
    if key_holder
        && route.path.ends_with("/se/bidi")
        && let Some(principal) = request.extensions().get::<Principal>()
        && control_plane
            .webdriver_target(&id, &principal.0)
            .await
            .is_err()
    {
        return Error::NotFound(format!("no WebDriver session {id} of this key")).into_response();
    }
    let upgrade = is_upgrade(request.headers());
    if upgrade && let Some(refusal) = foreign_origin(control_plane, &request) {
        return refusal.into_response();
    }
    if route.websocket && !upgrade {
        return Error::UpgradeRequired(format!(
            "{} is a WebSocket endpoint: connect with a WebSocket client (Upgrade: websocket)",
            route.path
        ))
        .into_response();
    }
    let external = external_base(control_plane, &request);
    let outcome = if upgrade {
        forward_upgrade(control_plane, request, &target, &route, None).await
    } else {
        forward_http(request, &target, &route, &external, prefix).await
    };
    outcome.unwrap_or_else(|error| {
        tracing::debug!(instance = %target.id, %error, "front door request failed");
        Error::BadGateway(format!(
            "instance {} did not answer through the front door: {error}",
            target.id
        ))
        .into_response()
    })
}

/// The refusal of a WebSocket upgrade that a page of another site sent
/// (its `Origin` is neither the host the client asked nor `public_url`'s):
/// otherwise any page its user visits could open the live view, and drive
/// the browser, in that user's name. Clients that are not browsers send no
/// `Origin`. The door checks it here and does not pass it on.
fn foreign_origin(control_plane: &ControlPlane, request: &Request) -> Option<Error> {
    let origin = request.headers().get(header::ORIGIN)?;
    let origin = origin.to_str().unwrap_or("null");
    let external = external_base(control_plane, request);
    let public = control_plane
        .config()
        .public_url
        .as_deref()
        .and_then(|url| url.split_once("://"))
        .map(|(_, authority)| authority.trim_end_matches('/'));
    let same = same_origin(origin, &external.authority)
        || public.is_some_and(|authority| same_origin(origin, authority));
    (!same).then(|| {
        Error::Forbidden(format!(
            "a WebSocket opened by a page of {origin} is refused: only pages of this server may open it"
        ))
    })
}

fn is_upgrade(headers: &HeaderMap) -> bool {
    headers
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"))
}

/// Scheme and authority the client used (what URLs handed back must use).
struct External {
    secure: bool,
    authority: String,
}

fn external_base(control_plane: &ControlPlane, request: &Request) -> External {
    let headers = request.headers();
    let text = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(|v| v.split(',').next().unwrap_or("").trim().to_owned())
            .filter(|v| !v.is_empty())
    };
    let trusted = request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .is_some_and(|peer| is_trusted(&control_plane.config().trusted_proxies, peer.0.ip()));
    let forwarded_proto = trusted.then(|| text("x-forwarded-proto")).flatten();
    let forwarded_host = trusted.then(|| text("x-forwarded-host")).flatten();
    let host = forwarded_host
        .or_else(|| text("host"))
        .filter(|h| {
            h.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-.:[]".contains(&b))
        })
        .unwrap_or_else(|| "localhost".into());
    let secure = match forwarded_proto {
        Some(proto) => proto.eq_ignore_ascii_case("https"),
        None => control_plane
            .config()
            .public_url
            .as_deref()
            .is_some_and(|url| url.starts_with("https://")),
    };
    External {
        secure,
        authority: host,
    }
}

/// An address or network of `trusted_proxies`.
pub(crate) fn parse_network(entry: &str) -> Option<(IpAddr, u8)> {
    let (address, prefix) = match entry.split_once('/') {
        Some((address, prefix)) => (address, Some(prefix)),
        None => (entry, None),
    };
    let ip: IpAddr = address.trim().parse().ok()?;
    let full = if ip.is_ipv4() { 32 } else { 128 };
    let prefix = match prefix {
        Some(prefix) => prefix.parse::<u8>().ok().filter(|p| *p <= full)?,
        None => full,
    };
    Some((ip, prefix))
}

fn is_trusted(networks: &[String], peer: IpAddr) -> bool {
    let peer = match peer {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(peer, IpAddr::V4),
        v4 => v4,
    };
    networks
        .iter()
        .filter_map(|entry| parse_network(entry))
        .any(|(network, prefix)| match (peer, network) {
            (IpAddr::V4(a), IpAddr::V4(b)) => {
                let mask = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
                u32::from(a) & mask == u32::from(b) & mask
            }
            (IpAddr::V6(a), IpAddr::V6(b)) => {
                let mask = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
                u128::from(a) & mask == u128::from(b) & mask
            }
            _ => false,
        })
}

/// The upstream path and query: the route's path, the client's query minus
/// `token`.
fn upstream_target(request: &Request, route: &Route) -> String {
    let query: Vec<&str> = request
        .uri()
        .query()
        .unwrap_or("")
        .split('&')
        .filter(|pair| {
            let name = pair.split('=').next().unwrap_or("");
            !name.is_empty() && name != "token"
        })
        .collect();
    if query.is_empty() {
        route.path.clone()
    } else {
        format!("{}?{}", route.path, query.join("&"))
    }
}

/// Request headers not passed on: the client's credential and `Host` (set
/// here), hop-by-hop headers, and forwarding headers the door does not vouch for.
fn passed_on(name: &HeaderName) -> bool {
    !matches!(
        name.as_str(),
        "host"
            | "origin"
            | "authorization"
            | "connection"
            | "keep-alive"
            | "proxy-authorization"
            | "proxy-connection"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
            | "x-forwarded-for"
            | "x-forwarded-host"
            | "x-forwarded-proto"
    )
}

fn port_of(target: &DoorTarget, route: &Route) -> u16 {
    match route.port {
        Port::Debug => target.ports[0],
        Port::Stream => target.ports[1],
        Port::Http => target.ports[2],
    }
}

/// Longest a DevTools JSON answer may be (`/json/protocol` is ~1 MB).
const MAX_REWRITTEN_BODY: usize = 32 << 20;
/// Longest a connection to an instance port may take to open.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// `host:port` of the instance port a route reaches (`[host]:port` for IPv6).
fn authority_of(target: &DoorTarget, route: &Route) -> String {
    let port = port_of(target, route);
    if target.host.contains(':') {
        format!("[{}]:{port}", target.host)
    } else {
        format!("{}:{port}", target.host)
    }
}

async fn connect(target: &DoorTarget, route: &Route) -> std::io::Result<(TcpStream, String)> {
    let authority = authority_of(target, route);
    let stream = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(&authority))
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out"))??;
    stream.set_nodelay(true)?;
    Ok((stream, authority))
}

async fn forward_http(
    request: Request,
    target: &DoorTarget,
    route: &Route,
    external: &External,
    prefix: &str,
) -> std::io::Result<Response> {
    let (stream, authority) = connect(target, route).await?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(std::io::Error::other)?;
    tokio::spawn(connection);
    send_upstream(
        request,
        (&mut sender, &authority),
        (target, route),
        (external, prefix),
    )
    .await
}

/// Sends `request` on to `target` over `sender` (a connection to
/// `authority`): the answer, its DevTools URLs pointed back at the door when
/// the route says so.
async fn send_upstream(
    request: Request,
    (sender, authority): (&mut SendRequest, &str),
    (target, route): (&DoorTarget, &Route),
    (external, prefix): (&External, &str),
) -> std::io::Result<Response> {
    let path = upstream_target(&request, route);
    let (parts, body) = request.into_parts();
    let mut upstream = hyper::Request::builder().method(parts.method).uri(path);
    for (name, value) in &parts.headers {
        if passed_on(name) {
            upstream = upstream.header(name, value);
        }
    }
    upstream = upstream.header(header::HOST, authority);
    if let Some(token) = &target.token {
        upstream = upstream.header(header::AUTHORIZATION, format!("Bearer {token}"));
    }
    let upstream = upstream.body(body).map_err(std::io::Error::other)?;
    let response = sender
        .send_request(upstream)
        .await
        .map_err(std::io::Error::other)?;
    let (mut parts, body) = response.into_parts();
    if !route.rewrite {
        return Ok(Response::from_parts(parts, Body::new(body)));
    }
    let bytes = http_body_util::Limited::new(body, MAX_REWRITTEN_BODY)
        .collect()
        .await
        .map_err(|e| std::io::Error::other(e.to_string()))?
        .to_bytes();
    let rewritten = match std::str::from_utf8(&bytes) {
        Ok(text) => point_back(text, authority, external, prefix).into_bytes(),
        Err(_) => bytes.to_vec(),
    };
    parts.headers.remove(header::TRANSFER_ENCODING);
    parts
        .headers
        .insert(header::CONTENT_LENGTH, HeaderValue::from(rewritten.len()));
    Ok(Response::from_parts(parts, Body::from(rewritten)))
}

/// Passes `request` on to the instance's HTTP port at `path` (the client's
/// query kept, but for `token`), as the door passes its own requests: the
/// answer streams back as it comes. The connection is one kept from an
/// earlier request when one is idle (WebDriver clients send command after
/// command), and is kept for the next.
pub(crate) async fn forward_to_http_port(
    request: Request,
    target: &DoorTarget,
    path: String,
) -> std::io::Result<Response> {
    let route = Route {
        port: Port::Http,
        path,
        rewrite: false,
        websocket: false,
    };
    let external = External {
        secure: false,
        authority: String::new(),
    };
    let authority = authority_of(target, &route);
    let mut sender = match KEPT.take(&authority) {
        Some(sender) => sender,
        None => {
            let (stream, _) = connect(target, &route).await?;
            let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                .await
                .map_err(std::io::Error::other)?;
            tokio::spawn(connection);
            sender
        }
    };
    let answer = send_upstream(
        request,
        (&mut sender, &authority),
        (target, &route),
        (&external, ""),
    )
    .await;
    if answer.is_ok() {
        KEPT.put(authority, sender);
    }
    answer
}

type SendRequest = hyper::client::conn::http1::SendRequest<Body>;

/// Idle connections to instance HTTP ports, by `host:port`: reused for
/// WebDriver commands. One kept longer than [`KEEP_IDLE`] is not used (the
/// node closes idle connections after `listeners.idle_timeout_sec`, and a
/// request must never race that close).
static KEPT: std::sync::LazyLock<KeptConnections> = std::sync::LazyLock::new(Default::default);

/// How long an idle connection may wait for its next request.
const KEEP_IDLE: Duration = Duration::from_secs(5);
/// Idle connections kept per port.
const KEEP_PER_PORT: usize = 4;

#[derive(Default)]
struct KeptConnections {
    idle:
        std::sync::Mutex<std::collections::HashMap<String, Vec<(std::time::Instant, SendRequest)>>>,
}

impl KeptConnections {
    /// An idle connection to `authority` ready for a request, if one is kept.
    fn take(&self, authority: &str) -> Option<SendRequest> {
        let mut idle = self.idle.lock().expect("kept connections");
        let senders = idle.get_mut(authority)?;
        while let Some((since, sender)) = senders.pop() {
            if since.elapsed() < KEEP_IDLE && sender.is_ready() && !sender.is_closed() {
                return Some(sender);
            }
        }
        idle.remove(authority);
        None
    }

    /// Keeps `sender` for the next request to `authority`.
    fn put(&self, authority: String, sender: SendRequest) {
        let mut idle = self.idle.lock().expect("kept connections");
        idle.retain(|_, senders| {
            senders.retain(|(since, sender)| since.elapsed() < KEEP_IDLE && !sender.is_closed());
            !senders.is_empty()
        });
        let senders = idle.entry(authority).or_default();
        if senders.len() < KEEP_PER_PORT {
            senders.push((std::time::Instant::now(), sender));
        }
    }
}

/// DevTools URLs of `internal` (the port the door called) pointed at the door.
fn point_back(text: &str, internal: &str, external: &External, prefix: &str) -> String {
    let (ws, param) = if external.secure {
        ("wss", "wss")
    } else {
        ("ws", "ws")
    };
    text.replace(
        &format!("ws://{internal}/"),
        &format!("{ws}://{}{prefix}/", external.authority),
    )
    .replace(
        &format!("ws={internal}/"),
        &format!("{param}={}{prefix}/", external.authority),
    )
}

/// Resolves when a relayed connection must end (a live link expired or was
/// revoked).
pub(crate) type Ends = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

/// A live link's socket: to the instance's stream port at `path` (the
/// client's path and query are not passed on), cut off when `ends` resolves.
pub(crate) async fn forward_live(
    control_plane: &ControlPlane,
    mut request: Request,
    (target, path): (&DoorTarget, &str),
    ends: Ends,
) -> Response {
    if !is_upgrade(request.headers()) {
        return Error::UpgradeRequired(
            "a live view's socket is a WebSocket: connect with Upgrade: websocket".into(),
        )
        .into_response();
    }
    // A live link's page may be embedded anywhere, but its socket is opened
    // by that page, which is this server's.
    if let Some(refusal) = foreign_origin(control_plane, &request) {
        return refusal.into_response();
    }
    *request.uri_mut() = axum::http::Uri::from_static("/");
    let route = Route {
        port: Port::Stream,
        path: path.to_owned(),
        rewrite: false,
        websocket: true,
    };
    forward_upgrade(control_plane, request, target, &route, Some(ends))
        .await
        .unwrap_or_else(|error| {
            Error::BadGateway(format!("instance {} did not answer: {error}", target.id))
                .into_response()
        })
}

/// Relays a WebSocket (or other upgrade) to the instance; the relay runs
/// as the control plane's background work ("door relay") and ends at
/// shutdown, or when `ends` resolves.
async fn forward_upgrade(
    control_plane: &ControlPlane,
    mut request: Request,
    target: &DoorTarget,
    route: &Route,
    ends: Option<Ends>,
) -> std::io::Result<Response> {
    let (mut upstream, authority) = connect(target, route).await?;
    let mut head = format!(
        "GET {} HTTP/1.1\r\nHost: {authority}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n",
        upstream_target(&request, route)
    );
    for (name, value) in request.headers() {
        if passed_on(name)
            && let Ok(value) = value.to_str()
        {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
    }
    if let Some(token) = &target.token {
        head.push_str(&format!("Authorization: Bearer {token}\r\n"));
    }
    head.push_str("\r\n");
    upstream.write_all(head.as_bytes()).await?;
    let (status, headers, early) = read_response_head(&mut upstream).await?;
    let mut response = Response::builder().status(status);
    for (name, value) in &headers {
        response = response.header(name.as_str(), value.as_slice());
    }
    if status != StatusCode::SWITCHING_PROTOCOLS {
        return response
            .body(Body::from(early))
            .map_err(std::io::Error::other);
    }
    let upgrade = hyper::upgrade::on(&mut request);
    let instance = target.id.clone();
    let stopping = control_plane.tasks().stopping();
    control_plane.tasks().spawn("door relay", async move {
        let upgraded = match upgrade.await {
            Ok(upgraded) => upgraded,
            Err(error) => {
                tracing::debug!(%instance, %error, "client upgrade failed");
                return;
            }
        };
        let mut client = TokioIo::new(upgraded);
        if !early.is_empty() && client.write_all(&early).await.is_err() {
            return;
        }
        let relay = tokio::io::copy_bidirectional(&mut client, &mut upstream);
        let ends = ends.unwrap_or_else(|| Box::pin(std::future::pending()));
        tokio::select! {
            _ = relay => {}
            () = ends => tracing::debug!(%instance, "live link ended: viewer cut off"),
            () = stopping.cancelled() => {}
        }
    });
    response.body(Body::empty()).map_err(std::io::Error::other)
}

/// Reads an HTTP response head: status, headers, and bytes that came after it.
async fn read_response_head(
    stream: &mut TcpStream,
) -> std::io::Result<(StatusCode, Vec<(String, Vec<u8>)>, Vec<u8>)> {
    let mut buffer = Vec::with_capacity(1024);
    let head_end = loop {
        let mut chunk = [0u8; 2048];
        let n = tokio::time::timeout(Duration::from_secs(60), stream.read(&mut chunk))
            .await
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "no answer"))??;
        if n == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the instance closed the connection",
            ));
        }
        buffer.extend_from_slice(&chunk[..n]);
        if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            break end + 4;
        }
        if buffer.len() > 64 * 1024 {
            return Err(std::io::Error::other("answer head too large"));
        }
    };
    let mut parsed_headers = [httparse::EMPTY_HEADER; 64];
    let mut parsed = httparse::Response::new(&mut parsed_headers);
    parsed
        .parse(&buffer[..head_end])
        .map_err(std::io::Error::other)?;
    let status = StatusCode::from_u16(parsed.code.unwrap_or(502)).map_err(std::io::Error::other)?;
    let headers = parsed
        .headers
        .iter()
        .map(|h| (h.name.to_owned(), h.value.to_vec()))
        .collect();
    Ok((status, headers, buffer[head_end..].to_vec()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn door_paths_route_to_the_right_port() {
        let id = InstanceId::new("i-1");
        // (path, (port, upstream path, rewritten, WebSocket only))
        let cases = [
            (
                "/cdp",
                Some((Port::Debug, "/devtools/browser/i-1", false, true)),
            ),
            ("/json", Some((Port::Debug, "/json", true, false))),
            (
                "/json/version/",
                Some((Port::Debug, "/json/version/", true, false)),
            ),
            ("/json/new", Some((Port::Debug, "/json/new", true, false))),
            (
                "/devtools/page/AB",
                Some((Port::Debug, "/devtools/page/AB", false, true)),
            ),
            ("/stream", Some((Port::Stream, "/", false, false))),
            ("/stream/ws", Some((Port::Stream, "/ws", false, true))),
            (
                "/screenshot",
                Some((Port::Http, "/screenshot", false, false)),
            ),
            ("/tabs", Some((Port::Http, "/tabs", false, false))),
            ("/", None),
            ("/cdp/x", None),
            ("/stream/other", None),
            ("/jsonx", None),
        ];
        for (rest, expected) in cases {
            let expected = expected.map(|(port, path, rewrite, websocket)| Route {
                port,
                path: path.into(),
                rewrite,
                websocket,
            });
            assert_eq!(route(&id, rest), expected, "{rest}");
        }
        assert_eq!(
            split_door_path("/v2/instances/abc/json/version"),
            Some(("abc", "/json/version"))
        );
        assert_eq!(split_door_path("/v2/instances/abc/dormant"), None);
        assert_eq!(split_door_path("/v2/instances/abc"), None);
    }

    #[test]
    fn devtools_urls_point_back_through_the_door() {
        let text = r#"{"webSocketDebuggerUrl":"ws://10.0.0.5:20001/devtools/page/X?token=t","devtoolsFrontendUrl":"/devtools/inspector.html?ws=10.0.0.5:20001/devtools/page/X%3Ftoken%3Dt"}"#;
        let external = External {
            secure: true,
            authority: "door.example.com".into(),
        };
        let out = point_back(text, "10.0.0.5:20001", &external, "/v2/instances/i");
        assert!(
            out.contains(r#""wss://door.example.com/v2/instances/i/devtools/page/X?token=t""#),
            "{out}"
        );
        assert!(
            out.contains("wss=door.example.com/v2/instances/i/devtools/page/X%3Ftoken%3Dt"),
            "{out}"
        );
        assert!(!out.contains("10.0.0.5"));
    }

    #[test]
    fn only_listed_proxies_are_trusted() {
        let trusted = vec!["10.0.0.0/8".to_owned(), "::1".to_owned()];
        assert!(is_trusted(&trusted, "10.1.2.3".parse().unwrap()));
        assert!(is_trusted(&trusted, "::ffff:10.1.2.3".parse().unwrap()));
        assert!(is_trusted(&trusted, "::1".parse().unwrap()));
        assert!(!is_trusted(&trusted, "11.0.0.1".parse().unwrap()));
        assert!(!is_trusted(&[], "127.0.0.1".parse().unwrap()));
        assert!(parse_network("10.0.0.0/33").is_none());
        assert!(parse_network("example.com").is_none());
    }
}

/// The routes of the door, one handler each so that the OpenAPI document
/// lists them; all go through [`by_path`].
pub mod routes {
    use super::*;

    type Params = Path<Vec<(String, String)>>;

    /// The DevTools protocol of the fleet's Chromium (what chrome-remote-interface
    /// fetches from the root of a door URL's host). Open: it describes the
    /// protocol, nothing of an instance.
    #[utoipa::path(get, path = "/json/protocol", tag = "front door", security(()),
        responses((status = 200, description = "Chromium's protocol description", content_type = "application/json"),
            (status = 502, description = "The browser asked did not answer", body = flotilla_api_types::ErrorResponse),
            (status = 503, description = "No browser is running to ask", body = flotilla_api_types::ErrorResponse)))]
    pub async fn json_protocol(state: State<Arc<ControlPlane>>, uri: axum::http::Uri) -> Response {
        devtools_document(state, uri).await
    }

    /// The fleet's Chromium version (`Browser`, `Protocol-Version`,
    /// `User-Agent`, …; no `webSocketDebuggerUrl`: an instance's is at
    /// `/v2/instances/{id}/json/version`). Open, like `/json/protocol`.
    #[utoipa::path(get, path = "/json/version", tag = "front door", security(()),
        responses((status = 200, description = "Chromium's version object", content_type = "application/json"),
            (status = 502, description = "The browser asked did not answer", body = flotilla_api_types::ErrorResponse),
            (status = 503, description = "No browser is running to ask", body = flotilla_api_types::ErrorResponse)))]
    pub async fn json_version_of_the_fleet(
        state: State<Arc<ControlPlane>>,
        uri: axum::http::Uri,
    ) -> Response {
        devtools_document(state, uri).await
    }

    /// The browser's CDP WebSocket (Playwright `connectOverCDP`, Puppeteer
    /// `browserWSEndpoint`): `urls.debug` when `public_url` is set.
    #[utoipa::path(get, path = "/v2/instances/{instance_id}/cdp", tag = "front door",
        params(("instance_id" = String, Path), ("token" = Option<String>, Query, description = "The instance's access token (or send an API key or the token as Authorization: Bearer)")),
        responses(
            (status = 101, description = "WebSocket to the browser target"),
            (status = 401, description = "No valid API key or instance token", body = flotilla_api_types::ErrorResponse),
            (status = 426, description = "Not a WebSocket upgrade", body = flotilla_api_types::ErrorResponse),
            (status = 404, body = flotilla_api_types::ErrorResponse),
            (status = 409, description = "The instance is stopped or failed", body = flotilla_api_types::ErrorResponse),
            (status = 502, description = "The instance's node did not answer", body = flotilla_api_types::ErrorResponse),
        ))]
    pub async fn cdp(
        state: State<Arc<ControlPlane>>,
        params: Params,
        request: Request,
    ) -> Response {
        by_path(state, params, request).await
    }

    /// The same browser CDP WebSocket, where Selenium's clients look for it
    /// (a WebDriver session's `se:cdp` capability).
    #[utoipa::path(get, path = "/v2/instances/{instance_id}/se/cdp", tag = "front door",
        params(("instance_id" = String, Path), ("token" = Option<String>, Query, description = "The instance's access token (or send an API key or the token as Authorization: Bearer)")),
        responses(
            (status = 101, description = "WebSocket to the browser target"),
            (status = 401, description = "No valid API key or instance token", body = flotilla_api_types::ErrorResponse),
            (status = 426, description = "Not a WebSocket upgrade", body = flotilla_api_types::ErrorResponse),
            (status = 404, body = flotilla_api_types::ErrorResponse),
            (status = 409, description = "The instance is stopped or failed", body = flotilla_api_types::ErrorResponse),
            (status = 502, description = "The instance's node did not answer", body = flotilla_api_types::ErrorResponse),
        ))]
    pub async fn se_cdp(
        state: State<Arc<ControlPlane>>,
        params: Params,
        request: Request,
    ) -> Response {
        by_path(state, params, request).await
    }

    /// DevTools `/json/version`; its `webSocketDebuggerUrl` points back
    /// through the door (with the token). A trailing slash is accepted.
    #[utoipa::path(get, path = "/v2/instances/{instance_id}/json/version", tag = "front door",
        params(("instance_id" = String, Path), ("token" = Option<String>, Query)),
        responses((status = 200, description = "Chromium's version object", content_type = "application/json"),
            (status = 401, body = flotilla_api_types::ErrorResponse), (status = 404, body = flotilla_api_types::ErrorResponse)))]
    pub async fn json_version(
        state: State<Arc<ControlPlane>>,
        params: Params,
        request: Request,
    ) -> Response {
        by_path(state, params, request).await
    }

    /// DevTools `/json/list`: the targets, their URLs through the door.
    #[utoipa::path(get, path = "/v2/instances/{instance_id}/json/list", tag = "front door",
        params(("instance_id" = String, Path), ("token" = Option<String>, Query)),
        responses((status = 200, description = "Chromium's target list", content_type = "application/json"),
            (status = 401, body = flotilla_api_types::ErrorResponse), (status = 404, body = flotilla_api_types::ErrorResponse)))]
    pub async fn json_list(
        state: State<Arc<ControlPlane>>,
        params: Params,
        request: Request,
    ) -> Response {
        by_path(state, params, request).await
    }

    /// DevTools `/json/new?<url>` (PUT, as Chromium requires): a new tab.
    #[utoipa::path(put, path = "/v2/instances/{instance_id}/json/new", tag = "front door",
        params(("instance_id" = String, Path), ("token" = Option<String>, Query)),
        responses((status = 200, description = "The new target", content_type = "application/json"),
            (status = 401, body = flotilla_api_types::ErrorResponse), (status = 404, body = flotilla_api_types::ErrorResponse)))]
    pub async fn json_new(
        state: State<Arc<ControlPlane>>,
        params: Params,
        request: Request,
    ) -> Response {
        by_path(state, params, request).await
    }

    /// A page target's CDP WebSocket.
    #[utoipa::path(get, path = "/v2/instances/{instance_id}/devtools/page/{target}", tag = "front door",
        params(("instance_id" = String, Path), ("target" = String, Path), ("token" = Option<String>, Query)),
        responses((status = 101, description = "WebSocket to the page target"),
            (status = 401, body = flotilla_api_types::ErrorResponse), (status = 404, body = flotilla_api_types::ErrorResponse),
            (status = 409, description = "The instance is stopped or failed", body = flotilla_api_types::ErrorResponse),
            (status = 426, description = "Not a WebSocket upgrade", body = flotilla_api_types::ErrorResponse),
            (status = 502, body = flotilla_api_types::ErrorResponse)))]
    pub async fn page(
        state: State<Arc<ControlPlane>>,
        params: Params,
        request: Request,
    ) -> Response {
        by_path(state, params, request).await
    }

    /// The live view as MJPEG (shows in an `<img>`): `urls.stream` when
    /// `public_url` is set.
    #[utoipa::path(get, path = "/v2/instances/{instance_id}/stream", tag = "front door",
        params(("instance_id" = String, Path), ("token" = Option<String>, Query)),
        responses((status = 200, description = "multipart/x-mixed-replace JPEG frames", content_type = "multipart/x-mixed-replace"),
            (status = 401, body = flotilla_api_types::ErrorResponse), (status = 404, body = flotilla_api_types::ErrorResponse)))]
    pub async fn stream(
        state: State<Arc<ControlPlane>>,
        params: Params,
        request: Request,
    ) -> Response {
        by_path(state, params, request).await
    }

    /// The live view as a WebSocket of binary JPEG frames.
    #[utoipa::path(get, path = "/v2/instances/{instance_id}/stream/ws", tag = "front door",
        params(("instance_id" = String, Path), ("token" = Option<String>, Query)),
        responses((status = 101, description = "WebSocket of binary JPEG frames"),
            (status = 401, body = flotilla_api_types::ErrorResponse), (status = 404, body = flotilla_api_types::ErrorResponse),
            (status = 409, description = "The instance is stopped or failed", body = flotilla_api_types::ErrorResponse),
            (status = 426, description = "Not a WebSocket upgrade", body = flotilla_api_types::ErrorResponse),
            (status = 502, body = flotilla_api_types::ErrorResponse)))]
    pub async fn stream_ws(
        state: State<Arc<ControlPlane>>,
        params: Params,
        request: Request,
    ) -> Response {
        by_path(state, params, request).await
    }

    /// The WebDriver BiDi socket of the instance's WebDriver session (made
    /// with `webSocketUrl: true`; the session's `webSocketUrl` capability
    /// points here), relayed to its chromedriver.
    #[utoipa::path(get, path = "/v2/instances/{instance_id}/webdriver/bidi", tag = "front door",
        params(("instance_id" = String, Path), ("token" = Option<String>, Query)),
        responses((status = 101, description = "WebSocket of WebDriver BiDi messages"),
            (status = 401, body = flotilla_api_types::ErrorResponse), (status = 404, body = flotilla_api_types::ErrorResponse),
            (status = 409, description = "The instance is stopped or failed", body = flotilla_api_types::ErrorResponse),
            (status = 426, description = "Not a WebSocket upgrade", body = flotilla_api_types::ErrorResponse),
            (status = 502, body = flotilla_api_types::ErrorResponse)))]
    pub async fn webdriver_bidi(
        state: State<Arc<ControlPlane>>,
        params: Params,
        request: Request,
    ) -> Response {
        by_path(state, params, request).await
    }

    /// The live view's newest frame.
    #[utoipa::path(get, path = "/v2/instances/{instance_id}/stream/frame.jpg", tag = "front door",
        params(("instance_id" = String, Path), ("token" = Option<String>, Query)),
        responses((status = 200, content_type = "image/jpeg"), (status = 401, body = flotilla_api_types::ErrorResponse),
            (status = 404, description = "No such instance, or no frame yet", body = flotilla_api_types::ErrorResponse),
            (status = 409, description = "The instance is stopped or failed", body = flotilla_api_types::ErrorResponse),
            (status = 502, body = flotilla_api_types::ErrorResponse)))]
    pub async fn frame(
        state: State<Arc<ControlPlane>>,
        params: Params,
        request: Request,
    ) -> Response {
        by_path(state, params, request).await
    }

    /// A PNG of a tab (`?tab=<id>`, default the first).
    #[utoipa::path(get, path = "/v2/instances/{instance_id}/screenshot", tag = "front door",
        params(("instance_id" = String, Path), ("tab" = Option<String>, Query), ("token" = Option<String>, Query)),
        responses((status = 200, content_type = "image/png", description = "The PNG; `X-Screenshot-Scale` says how much a page over `agent.screenshot_max_pixels` was scaled down (1 when not)"),
            (status = 400, description = "An unknown query parameter", body = flotilla_api_types::ErrorResponse),
            (status = 401, body = flotilla_api_types::ErrorResponse),
            (status = 404, description = "No such instance or tab", body = flotilla_api_types::ErrorResponse),
            (status = 409, description = "The instance is stopped or failed", body = flotilla_api_types::ErrorResponse),
            (status = 413, description = "The PNG would exceed agent.screenshot_max_bytes", body = flotilla_api_types::ErrorResponse),
            (status = 502, body = flotilla_api_types::ErrorResponse),
            (status = 503, description = "Too many captures at once on the node", body = flotilla_api_types::ErrorResponse)))]
    pub async fn screenshot(
        state: State<Arc<ControlPlane>>,
        params: Params,
        request: Request,
    ) -> Response {
        by_path(state, params, request).await
    }

    /// The files the instance's pages downloaded (newest first).
    #[utoipa::path(get, path = "/v2/instances/{instance_id}/downloads", tag = "instances",
        params(("instance_id" = String, Path), ("token" = Option<String>, Query)),
        responses((status = 200, body = flotilla_api_types::instances::DownloadList),
            (status = 401, body = flotilla_api_types::ErrorResponse), (status = 404, body = flotilla_api_types::ErrorResponse)))]
    pub async fn downloads(
        state: State<Arc<ControlPlane>>,
        params: Params,
        request: Request,
    ) -> Response {
        by_path(state, params, request).await
    }

    /// One download's bytes (`Content-Disposition: attachment`).
    #[utoipa::path(get, path = "/v2/instances/{instance_id}/downloads/{name}", tag = "instances",
        params(("instance_id" = String, Path), ("name" = String, Path, description = "A name from the listing: a plain file name", pattern = r"^[^./\\\x00-\x1f\x7f-\x9f][^/\\\x00-\x1f\x7f-\x9f]*$", min_length = 1, max_length = 63), ("token" = Option<String>, Query)),
        responses((status = 200, description = "The file", content_type = "application/octet-stream"),
            (status = 400, description = "Not a plain file name", body = flotilla_api_types::ErrorResponse),
            (status = 401, body = flotilla_api_types::ErrorResponse), (status = 404, body = flotilla_api_types::ErrorResponse)))]
    pub async fn download(
        state: State<Arc<ControlPlane>>,
        params: Params,
        request: Request,
    ) -> Response {
        by_path(state, params, request).await
    }

    /// Removes one download.
    #[utoipa::path(delete, path = "/v2/instances/{instance_id}/downloads/{name}", tag = "instances",
        params(("instance_id" = String, Path), ("name" = String, Path, description = "A name from the listing: a plain file name", pattern = r"^[^./\\\x00-\x1f\x7f-\x9f][^/\\\x00-\x1f\x7f-\x9f]*$", min_length = 1, max_length = 63), ("token" = Option<String>, Query)),
        responses((status = 200, body = flotilla_api_types::MessageResponse),
            (status = 400, body = flotilla_api_types::ErrorResponse),
            (status = 401, body = flotilla_api_types::ErrorResponse), (status = 404, body = flotilla_api_types::ErrorResponse)))]
    pub async fn download_delete(
        state: State<Arc<ControlPlane>>,
        params: Params,
        request: Request,
    ) -> Response {
        by_path(state, params, request).await
    }

    /// The recordings of the instance's live view (`config.record`), oldest
    /// first; while it runs, the last one is still being written.
    #[utoipa::path(get, path = "/v2/instances/{instance_id}/recordings", tag = "instances",
        params(("instance_id" = String, Path), ("token" = Option<String>, Query)),
        responses((status = 200, body = flotilla_api_types::instances::RecordingList),
            (status = 401, body = flotilla_api_types::ErrorResponse), (status = 404, body = flotilla_api_types::ErrorResponse)))]
    pub async fn recordings(
        state: State<Arc<ControlPlane>>,
        params: Params,
        request: Request,
    ) -> Response {
        by_path(state, params, request).await
    }

    /// One recording's video (MP4/H.264).
    #[utoipa::path(get, path = "/v2/instances/{instance_id}/recordings/{recording_id}", tag = "instances",
        params(("instance_id" = String, Path), ("recording_id" = String, Path, description = "An id from the listing"), ("token" = Option<String>, Query)),
        responses((status = 200, description = "The video", content_type = "video/mp4"),
            (status = 401, body = flotilla_api_types::ErrorResponse), (status = 404, body = flotilla_api_types::ErrorResponse)))]
    pub async fn recording(
        state: State<Arc<ControlPlane>>,
        params: Params,
        request: Request,
    ) -> Response {
        by_path(state, params, request).await
    }

    /// The open tabs: `[{id, url, title}]`.
    #[utoipa::path(get, path = "/v2/instances/{instance_id}/tabs", tag = "front door",
        params(("instance_id" = String, Path), ("token" = Option<String>, Query)),
        responses((status = 200, content_type = "application/json"), (status = 401, body = flotilla_api_types::ErrorResponse),
            (status = 404, body = flotilla_api_types::ErrorResponse)))]
    pub async fn tabs(
        state: State<Arc<ControlPlane>>,
        params: Params,
        request: Request,
    ) -> Response {
        by_path(state, params, request).await
    }
}
