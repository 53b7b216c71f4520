//! The front door (HTTP side): every instance through the control plane's own
//! port, so that clients need to reach nothing else.
//!
//! - By path: `/v2/instances/{id}/cdp` (the browser's CDP WebSocket),
//!   `/bidi` (a Firefox instance's WebDriver BiDi WebSocket),
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
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http_body_util::BodyExt;
use hyper_util::rt::TokioIo;

use tokio::net::TcpStream;

use flotilla_api_types::InstanceId;
use flotilla_api_types::credentials::bearer_token;
use flotilla_api_types::origin::same_origin;
use flotilla_net::upgrade;

use crate::app::keys::Principal;
use crate::app::{ControlPlane, DoorTarget};
use crate::error::Error;

/// Which of the instance's ports a route reaches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Port {
    Debug,
    Stream,
    Http,
}

/// Who a door route belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// At the door's root, describing the fleet's browser (no instance
    /// data): open without a credential.
    Fleet,
    /// Under `/v2/instances/{instance_id}` (or on an instance's subdomain):
    /// admitted by an API key or the instance's token.
    Instance,
}

/// One route of the front door.
pub struct DoorRoute {
    pub scope: Scope,
    /// The path after `/v2/instances/{instance_id}` (or the whole path on
    /// an instance's subdomain, or at the root for the fleet), in the
    /// router's syntax: `{name}` is one segment, `{*rest}` one or more.
    pub path: &'static str,
    pub methods: &'static [Method],
    port: Port,
    /// The path on the instance's port, `{id}` standing for the instance;
    /// `None`: the path as it came.
    to: Option<&'static str>,
    /// Its answer's DevTools URLs are pointed back through the door.
    rewrite: bool,
    /// A WebSocket endpoint: a plain request is refused (426).
    websocket: bool,
    /// Adds its operations to the OpenAPI document ([`super::door_docs`]);
    /// none for a catch-all that the routes before it describe.
    pub docs: &'static [fn(&mut utoipa::openapi::OpenApi)],
}

use super::routes::{doc_only as doc, shaped_like};

const GET: &[Method] = &[Method::GET];

/// An instance route at `path`, answering GET, reaching `port` at the same
/// path; the fields below change what differs.
const fn instance(path: &'static str, port: Port) -> DoorRoute {
    DoorRoute {
        scope: Scope::Instance,
        path,
        methods: GET,
        port,
        to: None,
        rewrite: false,
        websocket: false,
        docs: &[],
    }
}

/// Every route of the front door, in one table: it makes the router's
/// routes ([`router`]), the door's reading of a path or a subdomain's
/// ([`route`], [`is_door_request`]), the paths the guard leaves open
/// ([`is_open`]) and the door's entries in the OpenAPI document
/// ([`document`]). The first route whose path matches is taken (a route's
/// path before the catch-all it narrows).
pub static ROUTES: &[DoorRoute] = {
    use super::door_docs as d;
    use Port::{Debug, Http, Stream};
    &[
        DoorRoute {
            scope: Scope::Fleet,
            docs: &[doc::<d::__path_json_protocol>],
            ..instance("/json/protocol", Debug)
        },
        DoorRoute {
            scope: Scope::Fleet,
            docs: &[doc::<d::__path_json_version_of_the_fleet>],
            ..instance("/json/version", Debug)
        },
        // The browser's CDP socket.
        DoorRoute {
            to: Some("/devtools/browser/{id}"),
            websocket: true,
            docs: &[doc::<d::__path_cdp>],
            ..instance("/cdp", Debug)
        },
        // A Firefox instance's WebDriver BiDi socket.
        DoorRoute {
            to: Some("/session"),
            websocket: true,
            docs: &[doc::<d::__path_bidi>],
            ..instance("/bidi", Debug)
        },
        // The same, where Selenium's clients look for it (a session's
        // `se:cdp`; selenium-webdriver uses any URL with this path as it is).
        DoorRoute {
            to: Some("/devtools/browser/{id}"),
            websocket: true,
            docs: &[doc::<d::__path_se_cdp>],
            ..instance("/se/cdp", Debug)
        },
        DoorRoute {
            methods: &[Method::GET, Method::PUT],
            rewrite: true,
            ..instance("/json", Debug)
        },
        DoorRoute {
            rewrite: true,
            docs: &[doc::<d::__path_json_version>],
            ..instance("/json/version", Debug)
        },
        DoorRoute {
            rewrite: true,
            docs: &[doc::<d::__path_json_list>],
            ..instance("/json/list", Debug)
        },
        DoorRoute {
            methods: &[Method::PUT],
            rewrite: true,
            docs: &[doc::<d::__path_json_new>],
            ..instance("/json/new", Debug)
        },
        DoorRoute {
            methods: &[Method::GET, Method::PUT],
            rewrite: true,
            ..instance("/json/{*rest}", Debug)
        },
        DoorRoute {
            websocket: true,
            docs: &[doc::<d::__path_page>],
            ..instance("/devtools/page/{target}", Debug)
        },
        DoorRoute {
            websocket: true,
            ..instance("/devtools/{*rest}", Debug)
        },
        DoorRoute {
            to: Some("/"),
            docs: &[doc::<d::__path_stream>],
            ..instance("/stream", Stream)
        },
        DoorRoute {
            to: Some("/ws"),
            websocket: true,
            docs: &[doc::<d::__path_stream_ws>],
            ..instance("/stream/ws", Stream)
        },
        DoorRoute {
            to: Some("/frame.jpg"),
            docs: &[doc::<d::__path_frame>],
            ..instance("/stream/frame.jpg", Stream)
        },
        DoorRoute {
            docs: &[doc::<d::__path_screenshot>],
            ..instance("/screenshot", Http)
        },
        DoorRoute {
            docs: &[doc::<d::__path_tabs>],
            ..instance("/tabs", Http)
        },
        DoorRoute {
            to: Some("/webdriver/session/{id}/se/bidi"),
            websocket: true,
            docs: &[doc::<d::__path_webdriver_bidi>],
            ..instance("/webdriver/bidi", Http)
        },
        DoorRoute {
            websocket: true,
            docs: &[doc::<d::__path_playwright>],
            ..instance("/playwright", Http)
        },
        DoorRoute {
            docs: &[doc::<d::__path_downloads>],
            ..instance("/downloads", Http)
        },
        DoorRoute {
            methods: &[Method::GET, Method::DELETE],
            docs: &[doc::<d::__path_download>, doc::<d::__path_download_delete>],
            ..instance("/downloads/{name}", Http)
        },
        DoorRoute {
            docs: &[doc::<d::__path_recordings>],
            ..instance("/recordings", Http)
        },
        DoorRoute {
            docs: &[doc::<d::__path_recording>],
            ..instance("/recordings/{recording_id}", Http)
        },
    ]
};

/// The prefix of an instance's routes by path.
const INSTANCE_PREFIX: &str = "/v2/instances/{instance_id}";

/// The door's routes: every route of [`ROUTES`] with its methods, to the
/// door's handlers.
pub fn router() -> axum::Router<Arc<ControlPlane>> {
    use axum::routing::{MethodFilter, on};
    let mut router = axum::Router::new();
    for route in ROUTES {
        let filter = route
            .methods
            .iter()
            .filter_map(|method| MethodFilter::try_from(method.clone()).ok())
            .reduce(MethodFilter::or)
            .expect("a door route answers some method");
        router = match route.scope {
            Scope::Fleet => router.route(route.path, on(filter, devtools_document)),
            Scope::Instance => router.route(
                &format!("{INSTANCE_PREFIX}{}", route.path),
                on(filter, by_path),
            ),
        };
    }
    router
}

/// Adds the door's operations to the OpenAPI document.
pub fn document(openapi: &mut utoipa::openapi::OpenApi) {
    for add in ROUTES.iter().flat_map(|route| route.docs) {
        add(openapi);
    }
}

/// Whether `path` is a route of the fleet's (open without a credential).
pub fn is_open(path: &str) -> bool {
    ROUTES
        .iter()
        .any(|route| route.scope == Scope::Fleet && route.path == path)
}

/// The instance route whose path `rest` has (the path after the instance
/// prefix, or the whole path on a subdomain).
fn instance_route(rest: &str) -> Option<&'static DoorRoute> {
    ROUTES
        .iter()
        .find(|route| route.scope == Scope::Instance && shaped_like(route.path, rest))
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

/// Why the door has no route for a request.
#[derive(Debug, Clone, PartialEq, Eq)]
enum NoRoute {
    NoSuchPath,
    /// The path is a route, which does not answer this method.
    Method(&'static [Method]),
}

/// The route of `method` on `rest` of instance `id`.
fn route(id: &InstanceId, method: &Method, rest: &str) -> Result<Route, NoRoute> {
    let found = instance_route(rest).ok_or(NoRoute::NoSuchPath)?;
    // HEAD wherever GET (as the router does).
    let asked = if *method == Method::HEAD {
        &Method::GET
    } else {
        method
    };
    if !found.methods.contains(asked) {
        return Err(NoRoute::Method(found.methods));
    }
    Ok(Route {
        port: found.port,
        path: match found.to {
            Some(to) => to.replace("{id}", id.as_str()),
            None => rest.to_owned(),
        },
        rewrite: found.rewrite,
        websocket: found.websocket,
    })
}

/// The instance and the rest of a `/v2/instances/{id}/…` path of a door
/// route.
fn split_door_path(path: &str) -> Option<(&str, &str)> {
    let after = path.strip_prefix("/v2/instances/")?;
    let id = after.split_once('/')?.0;
    let rest = &after[id.len()..];
    instance_route(rest).map(|_| (id, rest))
}

/// Whether the guard should leave authentication of `request` to the door
/// (an instance token opens it as well as an API key).
pub fn is_door_request(control_plane: &ControlPlane, request: &Request) -> bool {
    split_door_path(request.uri().path()).is_some()
        || subdomain_of(control_plane, request).is_some()
}

/// The answer to a request the door has no route for.
fn no_route(method: &Method, path: &str, why: NoRoute) -> Response {
    match why {
        NoRoute::NoSuchPath => {
            let served: Vec<&str> = ROUTES
                .iter()
                .filter(|route| route.scope == Scope::Instance)
                .map(|route| route.path)
                .collect();
            Error::NotFound(format!(
                "no such path on an instance: {path}; the door serves {}",
                served.join(", ")
            ))
            .into_response()
        }
        NoRoute::Method(allowed) => {
            let allowed: Vec<&str> = allowed.iter().map(Method::as_str).collect();
            let mut response = (
                StatusCode::METHOD_NOT_ALLOWED,
                Error::InvalidRequest(format!("method {method} is not allowed on {path}")),
            )
                .into_response();
            if let Ok(value) = HeaderValue::from_str(&allowed.join(", ")) {
                response.headers_mut().insert(header::ALLOW, value);
            }
            response
        }
    }
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
    match route(&id, request.method(), &rest) {
        Ok(route) => pass(&control_plane, request, id, route, "").await,
        Err(why) => no_route(request.method(), &rest, why),
    }
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
    fleet_document(&control_plane, uri.path())
        .await
        .map(axum::Json)
        .into_response()
}

/// The fleet's Chromium's answer at `path`, through any running instance,
/// without its `webSocketDebuggerUrl`.
async fn fleet_document(
    control_plane: &ControlPlane,
    path: &str,
) -> Result<serde_json::Value, Error> {
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
    let mut document: serde_json::Value = serde_json::from_slice(&bytes)
        .map_err(|error| Error::BadGateway(format!("the browser's answer is not JSON: {error}")))?;
    if let Some(fields) = document.as_object_mut() {
        fields.remove("webSocketDebuggerUrl");
    }
    Ok(document)
}

/// Handler of every `/v2/instances/{instance_id}/…` door route.
pub async fn by_path(
    State(control_plane): State<Arc<ControlPlane>>,
    Path(params): Path<Vec<(String, String)>>,
    request: Request,
) -> Response {
    let path = request.uri().path().to_owned();
    let addressed = instance_and_rest(params, &path);
    match addressed.and_then(|(id, rest)| Ok((route(&id, request.method(), rest)?, id))) {
        Ok((route, id)) => {
            let prefix = format!("/v2/instances/{id}");
            pass(&control_plane, request, id, route, &prefix).await
        }
        Err(why) => no_route(request.method(), &path, why),
    }
}

/// The instance a door path names (its router parameter) and the path after
/// its prefix.
fn instance_and_rest(
    params: Vec<(String, String)>,
    path: &str,
) -> Result<(InstanceId, &str), NoRoute> {
    let id = params
        .into_iter()
        .find_map(|(name, value)| (name == "instance_id").then(|| InstanceId::new(value)));
    let rest = split_door_path(path).map(|(_, rest)| rest);
    id.zip(rest).ok_or(NoRoute::NoSuchPath)
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
    let key_scope = request
        .extensions()
        .get::<crate::app::Scope>()
        .filter(|_| key_holder)
        .cloned();
    let principal = request.extensions().get::<Principal>().map(|p| p.0.clone());
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
    let key = key_scope
        .as_ref()
        .map(|scope| (scope, principal.as_deref()));
    let target = match control_plane.door_open(&id, key, &tokens).await {
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
        forward_upgrade(control_plane, request, &target, &route, (None, None)).await
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

fn is_trusted(networks: &[String], peer: IpAddr) -> bool {
    networks
        .iter()
        .filter_map(|entry| flotilla_net::IpNetwork::parse(entry).ok())
        .any(|network| network.contains(peer))
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
    // The agent's own headers come from the control plane alone.
    !name.as_str().starts_with("x-flotilla-")
        && !matches!(
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
    if let Some(AgentHeaders(ours)) = parts.extensions.get::<AgentHeaders>() {
        for (name, value) in ours {
            upstream = upstream.header(*name, value);
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

/// Header lines the control plane itself adds to a request it passes to an
/// instance's port (`x-flotilla-…`: a client's own never pass, see
/// [`passed_on`]); carried as an extension of the request.
#[derive(Debug, Clone, Default)]
pub(crate) struct AgentHeaders(pub Vec<(&'static str, HeaderValue)>);

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
    forward_upgrade(control_plane, request, target, &route, (Some(ends), None))
        .await
        .unwrap_or_else(|error| {
            Error::BadGateway(format!("instance {} did not answer: {error}", target.id))
                .into_response()
        })
}

/// How long the door waits for each read of an instance's answer to an
/// upgrade (a dormant instance is woken first).
const UPSTREAM_ANSWER: Duration = Duration::from_secs(60);

/// A Playwright connection to a new instance (`GET /v2/playwright`): to
/// the instance's `/playwright` route; `closed` is dropped when the
/// connection ends (at once when it was not upgraded).
pub(crate) async fn forward_playwright(
    control_plane: &ControlPlane,
    request: Request,
    target: &DoorTarget,
    closed: tokio::sync::oneshot::Sender<()>,
) -> Response {
    let route = Route {
        port: Port::Http,
        path: "/playwright".to_owned(),
        rewrite: false,
        websocket: true,
    };
    forward_upgrade(control_plane, request, target, &route, (None, Some(closed)))
        .await
        .unwrap_or_else(|error| {
            Error::BadGateway(format!("instance {} did not answer: {error}", target.id))
                .into_response()
        })
}

/// Refuses a request to the WebSocket endpoint `path` that is not an
/// upgrade (426), or whose `Origin` is another site's.
pub(crate) fn check_upgrade(
    control_plane: &ControlPlane,
    request: &Request,
    path: &str,
) -> Result<(), Error> {
    if !is_upgrade(request.headers()) {
        return Err(Error::UpgradeRequired(format!(
            "{path} is a WebSocket endpoint: connect with a WebSocket client (Upgrade: websocket)"
        )));
    }
    foreign_origin(control_plane, request).map_or(Ok(()), Err)
}

/// Relays a WebSocket (or other upgrade) to the instance; the relay runs
/// as the control plane's background work ("door relay") and ends at
/// shutdown, or when `ends` resolves. `closed` is dropped when the relay
/// ends (or at once, when the instance did not switch protocols).
async fn forward_upgrade(
    control_plane: &ControlPlane,
    mut request: Request,
    target: &DoorTarget,
    route: &Route,
    (ends, closed): (Option<Ends>, Option<tokio::sync::oneshot::Sender<()>>),
) -> std::io::Result<Response> {
    let (mut upstream, authority) = connect(target, route).await?;
    let mut extra = vec![
        "Connection: Upgrade".to_owned(),
        "Upgrade: websocket".to_owned(),
    ];
    if let Some(token) = &target.token {
        extra.push(format!("Authorization: Bearer {token}"));
    }
    let head = upgrade::request_head(
        &upstream_target(&request, route),
        &authority,
        request.headers(),
        passed_on,
        &extra,
    );
    let mut answer = upgrade::handshake(&mut upstream, &head, UPSTREAM_ANSWER).await?;
    let response = answer.response();
    if !answer.switched() {
        return response
            .body(Body::from(answer.early))
            .map_err(std::io::Error::other);
    }
    let switched = upgrade::Switched::of(&mut request, &mut answer);
    let instance = target.id.clone();
    let stopping = control_plane.tasks().stopping();
    control_plane.tasks().spawn("door relay", async move {
        // A client that never completes its upgrade holds no shutdown.
        let client = tokio::select! {
            client = switched.client() => client,
            () = stopping.cancelled() => None,
        };
        let Some(mut client) = client else {
            return;
        };
        let relay = tokio::io::copy_bidirectional(&mut client, &mut upstream);
        let ends = ends.unwrap_or_else(|| Box::pin(std::future::pending()));
        tokio::select! {
            _ = relay => {}
            () = ends => tracing::debug!(%instance, "live link ended: viewer cut off"),
            () = stopping.cancelled() => {}
        }
        drop(closed);
    });
    response.body(Body::empty()).map_err(std::io::Error::other)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn door_paths_route_to_the_right_port() {
        let id = InstanceId::new("i-1");
        // (method, path, (port, upstream path, rewritten, WebSocket only))
        let get = Method::GET;
        let cases = [
            (
                &get,
                "/cdp",
                Some((Port::Debug, "/devtools/browser/i-1", false, true)),
            ),
            (
                &get,
                "/se/cdp",
                Some((Port::Debug, "/devtools/browser/i-1", false, true)),
            ),
            (&get, "/json", Some((Port::Debug, "/json", true, false))),
            (
                &get,
                "/json/version/",
                Some((Port::Debug, "/json/version/", true, false)),
            ),
            (
                &Method::PUT,
                "/json/new",
                Some((Port::Debug, "/json/new", true, false)),
            ),
            (
                &get,
                "/devtools/page/AB",
                Some((Port::Debug, "/devtools/page/AB", false, true)),
            ),
            (&get, "/stream", Some((Port::Stream, "/", false, false))),
            (&get, "/stream/ws", Some((Port::Stream, "/ws", false, true))),
            (
                &get,
                "/screenshot",
                Some((Port::Http, "/screenshot", false, false)),
            ),
            (&get, "/tabs", Some((Port::Http, "/tabs", false, false))),
            (
                &get,
                "/webdriver/bidi",
                Some((Port::Http, "/webdriver/session/i-1/se/bidi", false, true)),
            ),
            (
                &Method::DELETE,
                "/downloads/a.pdf",
                Some((Port::Http, "/downloads/a.pdf", false, false)),
            ),
            (&get, "/", None),
            (&get, "/cdp/x", None),
            (&get, "/stream/other", None),
            (&get, "/jsonx", None),
            (&get, "/json/", None),
            (&get, "/downloads/", None),
            (&get, "/downloads/a/b", None),
            (&get, "/recordings/", None),
        ];
        for (method, rest, expected) in cases {
            let expected = expected
                .map(|(port, path, rewrite, websocket)| Route {
                    port,
                    path: path.into(),
                    rewrite,
                    websocket,
                })
                .ok_or(NoRoute::NoSuchPath);
            assert_eq!(route(&id, method, rest), expected, "{method} {rest}");
        }
        assert_eq!(
            split_door_path("/v2/instances/abc/json/version"),
            Some(("abc", "/json/version"))
        );
        assert_eq!(split_door_path("/v2/instances/abc/dormant"), None);
        assert_eq!(split_door_path("/v2/instances/abc"), None);
        assert_eq!(split_door_path("/v2/instances/abc/stream/other"), None);
    }

    /// A path of the table answers only its methods, by path and on a
    /// subdomain alike.
    #[test]
    fn a_route_answers_only_its_methods() {
        let id = InstanceId::new("i-1");
        assert_eq!(
            route(&id, &Method::GET, "/json/new"),
            Err(NoRoute::Method(&[Method::PUT]))
        );
        assert_eq!(
            route(&id, &Method::POST, "/downloads/a.pdf"),
            Err(NoRoute::Method(&[Method::GET, Method::DELETE]))
        );
        // HEAD wherever GET: a client probes a download before fetching it.
        assert!(route(&id, &Method::HEAD, "/downloads/a.pdf").is_ok());
        assert!(route(&id, &Method::HEAD, "/stream/frame.jpg").is_ok());
        assert!(route(&id, &Method::HEAD, "/json/new").is_err());
        let refused = no_route(
            &Method::POST,
            "/downloads/a.pdf",
            NoRoute::Method(&[Method::GET, Method::DELETE]),
        );
        assert_eq!(refused.status(), StatusCode::METHOD_NOT_ALLOWED);
        assert_eq!(refused.headers()[header::ALLOW], "GET, DELETE");
    }

    /// The table is whole: each documented operation is at its route's
    /// path with one of its methods, each route with a parameter or a
    /// single method is documented or narrowed by the routes before it,
    /// and only the fleet's routes are open.
    #[test]
    fn the_route_table_and_the_openapi_document_agree() {
        let mut openapi = utoipa::openapi::OpenApiBuilder::new().build();
        for route in ROUTES {
            let full = match route.scope {
                Scope::Fleet => route.path.to_owned(),
                Scope::Instance => format!("{INSTANCE_PREFIX}{}", route.path),
            };
            for add in route.docs {
                let mut one = utoipa::openapi::OpenApiBuilder::new().build();
                add(&mut one);
                let (path, item) = one.paths.paths.into_iter().next().expect("an operation");
                assert_eq!(path, full, "the documented path of {}", route.path);
                let documented = [
                    (Method::GET, item.get.is_some()),
                    (Method::PUT, item.put.is_some()),
                    (Method::DELETE, item.delete.is_some()),
                ];
                for (method, present) in documented {
                    assert!(
                        !present || route.methods.contains(&method),
                        "{full}: {method} is documented but not routed"
                    );
                }
            }
            let open = is_open(&full);
            assert_eq!(open, route.scope == Scope::Fleet, "{full}");
            if route.docs.is_empty() {
                assert!(
                    route.path.contains("{*") || route.path == "/json",
                    "{} is undocumented",
                    route.path
                );
            }
        }
        document(&mut openapi);
        assert_eq!(
            openapi.paths.paths.len(),
            ROUTES.iter().filter(|route| !route.docs.is_empty()).count()
        );
        // Every route is reached by its own path, and by no route before it.
        let id = InstanceId::new("i");
        for (index, door_route) in ROUTES.iter().enumerate() {
            if door_route.scope == Scope::Fleet {
                continue;
            }
            let sample = door_route
                .path
                .replace("{*rest}", "x/y")
                .replace("{target}", "T")
                .replace("{name}", "n")
                .replace("{recording_id}", "r");
            let found = instance_route(&sample).expect("a route");
            assert!(
                std::ptr::eq(found, &ROUTES[index]),
                "{sample} is taken by {} before {}",
                found.path,
                door_route.path
            );
            assert!(route(&id, &door_route.methods[0], &sample).is_ok());
        }
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
    }
}
