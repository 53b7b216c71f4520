//! The gateway on an instance's `debug_port`: CDP for a Chromium instance,
//! WebDriver BiDi (at `/session`, Firefox's own socket) for a Firefox one;
//! a client of the other protocol is refused with a 400 that says which to
//! use ([`speaks_what_is_asked`]).
//!
//! Chromium's DevTools server listens on 127.0.0.1 at a port of its choosing; the
//! gateway is the instance's stable public endpoint in front of it:
//! - HTTP (`/json/version`, `/json/list`, `/json/new`, …) is forwarded with
//!   `Host: 127.0.0.1:<internal port>` (Chromium answers only to a localhost or IP
//!   host) and the internal address in the answer is rewritten to the one the
//!   client used, so `webSocketDebuggerUrl` points back at the gateway.
//! - WebSocket upgrades are forwarded as bytes after the handshake, so frames of
//!   any size pass untouched. Any `/devtools/browser/…` path reaches the current
//!   browser target, which keeps `urls.debug` valid across browser restarts.
//! - Every request and every chunk of WebSocket traffic counts as activity.
//! - A request that arrives while the browser starts waits for it.
//! - With authentication on, every request needs an API key or the instance's
//!   token ([`crate::protocols::access`]); a refused one is answered 401 before anything
//!   reaches Chromium (or counts as activity, or wakes a parked instance). The
//!   credential is not passed on, and the URLs the gateway hands out carry the
//!   instance's token.
//! - Commands from the client pass through [`crate::protocols::client_frames`], which keeps
//!   downloads in the instance's own directory; WebSocket compression is not
//!   negotiated with Chromium, so that every command can be read.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use flotilla_net::Body;
use flotilla_net::upgrade;
use http_body_util::{BodyExt, Full, Limited};
use hyper::header::{CONTENT_LENGTH, HOST, HeaderValue};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::config::EngineKind;
use crate::engine::bidi_tap::{BidiTap, ClosedOnDrop, TapFrames, forward_to_client};
use crate::engine::browser::CdpEndpoint;
use crate::instance::InstanceSlot;
use crate::instance::token::InstanceToken;
use crate::protocols::access::{Admission, NodeAccess, query_without_token, with_token};
use crate::protocols::client_frames::{Pins, Protocol};

/// Upper bound for a forwarded HTTP body (`/json/protocol` is ~1 MB).
const MAX_HTTP_BODY: usize = 32 << 20;

pub struct GatewayContext {
    pub slot: Arc<InstanceSlot>,
    /// Host used in rewritten URLs when the client sent no `Host` header.
    pub public_host: String,
    /// How long a request waits for a starting browser.
    pub ready_timeout: Duration,
    /// Who may connect.
    pub access: Arc<NodeAccess>,
    /// The process's connection budget and slow-client limits.
    pub listeners: flotilla_net::Listeners,
    /// The instance's downloads directory as its browser sees it.
    pub downloads_dir: String,
}

/// Serves the gateway on `listener` until `cancel` fires or the instance's
/// servers stop; open connections are closed then too.
pub async fn serve(listener: TcpListener, context: Arc<GatewayContext>, cancel: CancellationToken) {
    let stop = CancellationToken::new();
    let servers = context.slot.servers.clone();
    let stopper = stop.clone();
    let stop_on = async move {
        tokio::select! {
            _ = cancel.cancelled() => {}
            _ = servers.cancelled() => {}
        }
        stopper.cancel();
    };
    let listeners = context.listeners.clone();
    let per_connection = {
        let stop = stop.clone();
        move |_peer| {
            let context = context.clone();
            let stop = stop.clone();
            move |request| handle(request, context.clone(), stop.clone())
        }
    };
    tokio::join!(stop_on, listeners.serve(listener, per_connection, stop));
}

async fn handle(
    request: Request<Body>,
    context: Arc<GatewayContext>,
    cancel: CancellationToken,
) -> Response<Full<Bytes>> {
    let token = context.slot.access_token();
    let admission =
        match context
            .access
            .admit(token.as_deref(), request.headers(), request.uri().query())
        {
            Ok(admission) => admission,
            Err(refusal) => return refusal.response(),
        };
    // URLs handed to an admitted client carry the token when one is needed.
    let token = token.filter(|_| admission != Admission::Open);
    if let Err(refusal) = speaks_what_is_asked(request.uri().path(), context.slot.engine) {
        return text(StatusCode::BAD_REQUEST, refusal);
    }
    context.slot.touch();
    let endpoint = match context.slot.wait_ready(context.ready_timeout).await {
        Ok(Some(endpoint)) => endpoint,
        Ok(None) => {
            return text(
                StatusCode::SERVICE_UNAVAILABLE,
                "this instance runs on the sim runtime and has no browser",
            );
        }
        Err(reason) => return text(StatusCode::SERVICE_UNAVAILABLE, &reason.to_string()),
    };
    let is_upgrade = request
        .headers()
        .get(hyper::header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
    let result = if is_upgrade {
        proxy_websocket(request, &endpoint, context.clone(), cancel).await
    } else {
        proxy_http(request, &endpoint, &context, token.as_deref()).await
    };
    result.unwrap_or_else(|error| {
        tracing::debug!(instance = %context.slot.id, %error, "gateway request failed");
        text(
            StatusCode::BAD_GATEWAY,
            &format!("the browser did not answer: {error}"),
        )
    })
}

/// What a CDP client is told by a Firefox instance.
const FIREFOX_SPEAKS_BIDI: &str = "this instance runs Firefox, which does not speak CDP: connect over WebDriver BiDi at urls.bidi (/v2/instances/{id}/bidi through the front door; Puppeteer: protocol 'webDriverBiDi')";

/// What a BiDi client is told by a Chromium instance.
const CHROMIUM_SPEAKS_CDP: &str = "this instance runs Chromium, whose own socket speaks CDP: connect at urls.debug (/v2/instances/{id}/cdp through the front door), or open a WebDriver session at /wd/hub with webSocketUrl: true for WebDriver BiDi";

/// Whether a browser of `engine` speaks the protocol `path` asks for
/// (answered before anything reaches it or wakes it): Firefox's BiDi socket
/// is `/session` and it has nothing else; Chromium has no `/session`.
fn speaks_what_is_asked(path: &str, engine: EngineKind) -> Result<(), &'static str> {
    let asks_bidi = path == crate::engine::firefox::BIDI_PATH;
    match (engine, asks_bidi) {
        (EngineKind::Chromium, true) => Err(CHROMIUM_SPEAKS_CDP),
        (EngineKind::Firefox, false) => Err(FIREFOX_SPEAKS_BIDI),
        _ => Ok(()),
    }
}

fn text(status: StatusCode, body: &str) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(format!("{body}\n"))));
    *response.status_mut() = status;
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

/// The authority clients should use for this gateway.
fn external_authority(request: &Request<Body>, context: &GatewayContext) -> String {
    request
        .headers()
        .get(HOST)
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty())
        .map(str::to_owned)
        .unwrap_or_else(|| format!("{}:{}", context.public_host, context.slot.debug_port()))
}

/// The upstream path: any browser-target path means the current browser; the
/// `token` parameter stays here.
fn upstream_path(request: &Request<Body>, endpoint: &CdpEndpoint) -> String {
    let path = request.uri().path();
    if path == "/devtools/browser" || path.starts_with("/devtools/browser/") {
        return endpoint.browser_path.clone();
    }
    match request.uri().query().and_then(query_without_token) {
        Some(query) => format!("{path}?{query}"),
        None => path.to_owned(),
    }
}

/// Headers never passed on to Chromium (or a server beside it): the host
/// (set to what Chromium answers to), the client's credential, WebSocket
/// extensions (frames must stay readable, see [`crate::protocols::client_frames`]),
/// and the agent's own `x-flotilla-…` headers (only the agent sets them).
fn forwarded(name: &hyper::header::HeaderName) -> bool {
    name != HOST
        && name != hyper::header::AUTHORIZATION
        && name != hyper::header::SEC_WEBSOCKET_EXTENSIONS
        && !name.as_str().starts_with("x-flotilla-")
}

/// Points the URLs in a DevTools answer at the gateway (`external`) instead of
/// Chromium's own address, with the instance's token where one is needed.
fn rewrite_urls(
    body: &str,
    internal: &str,
    external: &str,
    token: Option<&InstanceToken>,
) -> String {
    let Some(token) = token else {
        return body.replace(internal, external);
    };
    let Ok(mut value) = serde_json::from_str::<serde_json::Value>(body) else {
        return body.replace(internal, external);
    };
    fn walk(value: &mut serde_json::Value, internal: &str, external: &str, token: &InstanceToken) {
        match value {
            serde_json::Value::Object(map) => {
                for (key, item) in map.iter_mut() {
                    if let serde_json::Value::String(text) = item
                        && text.contains(internal)
                    {
                        let replaced = text.replace(internal, external);
                        *text = match key.as_str() {
                            "webSocketDebuggerUrl" => with_token(&replaced, token),
                            // The front end connects to `ws://<value of ws=>`.
                            "devtoolsFrontendUrl" => {
                                format!("{replaced}%3Ftoken%3D{}", token.secret())
                            }
                            _ => replaced,
                        };
                    } else {
                        walk(item, internal, external, token);
                    }
                }
            }
            serde_json::Value::Array(items) => {
                for item in items {
                    walk(item, internal, external, token);
                }
            }
            _ => {}
        }
    }
    walk(&mut value, internal, external, token);
    value.to_string()
}

async fn proxy_http(
    request: Request<Body>,
    endpoint: &CdpEndpoint,
    context: &GatewayContext,
    token: Option<&InstanceToken>,
) -> io::Result<Response<Full<Bytes>>> {
    let authority = external_authority(&request, context);
    let path = upstream_path(&request, endpoint);
    let stream = endpoint.connect().await?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(io::Error::other)?;
    tokio::spawn(connection);
    let (parts, body) = request.into_parts();
    let body = Limited::new(body, MAX_HTTP_BODY)
        .collect()
        .await
        .map_err(|e| io::Error::other(e.to_string()))?
        .to_bytes();
    let mut upstream = Request::builder().method(parts.method).uri(path);
    for (name, value) in &parts.headers {
        if forwarded(name) {
            upstream = upstream.header(name, value);
        }
    }
    let upstream = upstream
        .header(HOST, endpoint.authority())
        .body(Full::new(body))
        .map_err(io::Error::other)?;
    let response = sender
        .send_request(upstream)
        .await
        .map_err(io::Error::other)?;
    let (mut parts, body) = response.into_parts();
    let body = Limited::new(body, MAX_HTTP_BODY)
        .collect()
        .await
        .map_err(|e| io::Error::other(e.to_string()))?
        .to_bytes();
    let internal = endpoint.authority();
    let body = match std::str::from_utf8(&body) {
        Ok(text) if text.contains(&internal) => {
            Bytes::from(rewrite_urls(text, &internal, &authority, token))
        }
        _ => body,
    };
    parts
        .headers
        .insert(CONTENT_LENGTH, HeaderValue::from(body.len()));
    Ok(Response::from_parts(parts, Full::new(body)))
}

async fn proxy_websocket(
    request: Request<Body>,
    endpoint: &CdpEndpoint,
    context: Arc<GatewayContext>,
    cancel: CancellationToken,
) -> io::Result<Response<Full<Bytes>>> {
    // A BiDi client is about to start Firefox's only session: the live
    // view lets go of its own first, and takes none while the client is on.
    let claim = match endpoint.speaks_cdp() {
        true => None,
        false => Some(endpoint.session_turns.hold_for_client().await),
    };
    let upstream = endpoint.connect().await?;
    let path = upstream_path(&request, endpoint);
    let (pins, tap) = match endpoint.speaks_cdp() {
        true => (
            Pins::new(Protocol::Cdp, context.downloads_dir.clone()),
            None,
        ),
        false => {
            // The node's reads ride on the client's session (Firefox binds
            // it to this connection): see `engine::bidi_tap`.
            let (tap, frames) = BidiTap::new();
            endpoint.session_turns.taps.add(&tap);
            let pins = Pins::new(Protocol::Bidi, context.downloads_dir.clone());
            (pins.ending_bidi_sessions(), Some((tap, frames)))
        }
    };
    relay_websocket_with(
        request,
        (upstream, &endpoint.authority(), &path, &[]),
        (context.slot.clone(), pins, tap),
        (cancel, claim),
    )
    .await
}

/// How long the gateway waits for each read of the browser's answer to an
/// upgrade.
const BROWSER_ANSWER: Duration = Duration::from_secs(10);

/// Relays the WebSocket upgrade `request` to `upstream` (a connection to
/// `authority`, asking for `path`): the upstream's answer to the handshake
/// goes back to the client and, once switched, frames are relayed both ways
/// (the client's checked against `pins`) until either side closes, `cancel`
/// fires or the instance's servers stop. Traffic counts as activity.
pub(crate) async fn relay_websocket<B>(
    request: Request<B>,
    (upstream, authority, path): (tokio::net::TcpStream, &str, &str),
    (slot, pins): (Arc<InstanceSlot>, Pins),
    cancel: CancellationToken,
) -> io::Result<Response<Full<Bytes>>> {
    relay_websocket_with(
        request,
        (upstream, authority, path, &[]),
        (slot, pins, None),
        (cancel, ()),
    )
    .await
}

/// A `bidi` door client's tap, and the node's frames it carries.
type Tapped = Option<(Arc<BidiTap>, TapFrames)>;

/// [`relay_websocket`], adding the header lines `extra` to the handshake,
/// with the node's commands of `tap` carried on the connection; `held` is
/// dropped when the relay ends (at once when the upstream did not switch
/// protocols).
pub(crate) async fn relay_websocket_with<B, H: Send + 'static>(
    mut request: Request<B>,
    (mut upstream, authority, path, extra): (tokio::net::TcpStream, &str, &str, &[String]),
    (slot, pins, tap): (Arc<InstanceSlot>, Pins, Tapped),
    (cancel, held): (CancellationToken, H),
) -> io::Result<Response<Full<Bytes>>> {
    let head = upgrade::request_head(path, authority, request.headers(), forwarded, extra);
    let mut answer = upgrade::handshake(&mut upstream, &head, BROWSER_ANSWER).await?;
    let response = answer.response();
    if !answer.switched() {
        return response
            .body(Full::new(Bytes::from(answer.early)))
            .map_err(io::Error::other);
    }
    let switched = upgrade::Switched::of(&mut request, &mut answer);
    tokio::spawn(async move {
        if let Some(client) = switched.client().await {
            relay_upgraded(client, upstream, (slot, pins, tap), cancel).await
        }
        drop(held);
    });
    response
        .body(Full::new(Bytes::new()))
        .map_err(io::Error::other)
}

/// Relays an upgraded CDP connection both ways (client frames checked on
/// their way to the browser, the node's commands of `tap` written between
/// them and their answers taken out of the browser's) until either side
/// closes or the instance's servers stop; the connection counts as activity.
async fn relay_upgraded(
    client: TokioIo<hyper::upgrade::Upgraded>,
    upstream: tokio::net::TcpStream,
    (slot, pins, tap): (Arc<InstanceSlot>, Pins, Tapped),
    cancel: CancellationToken,
) {
    let _counted = crate::instance::clients::ClientKind::of_protocol(pins.protocol)
        .map(|kind| slot.clients.attach(kind));
    let client = ActivityIo {
        inner: client,
        slot: slot.clone(),
    };
    let (client_read, mut client_write) = tokio::io::split(client);
    let (upstream_read, mut upstream_write) = upstream.into_split();
    // Buffered once for the whole relay: what was read ahead when the
    // client left is still there for the farewell's answer.
    let mut upstream_read = tokio::io::BufReader::new(upstream_read);
    let says_farewell = pins.farewell.is_some();
    let (tap, mut frames) = tap.unzip();
    let _closed_with_the_relay = tap.clone().map(ClosedOnDrop);
    {
        let to_browser = crate::protocols::client_frames::relay_with_node(
            client_read,
            &mut upstream_write,
            &pins,
            frames.as_mut(),
        );
        let to_client = async {
            let _ = match &tap {
                Some(tap) => forward_to_client(&mut upstream_read, &mut client_write, tap).await,
                None => tokio::io::copy(&mut upstream_read, &mut client_write)
                    .await
                    .map(drop),
            };
            if !says_farewell {
                let _ = client_write.shutdown().await;
            }
        };
        tokio::pin!(to_browser, to_client);
        tokio::select! {
            _ = &mut to_client => {
                // A client that went away: its side ends too, and the
                // relay says the farewell.
                if says_farewell {
                    let _ = tokio::time::timeout(Duration::from_secs(2), &mut to_browser).await;
                }
            }
            outcome = &mut to_browser => {
                log_relay_end(&slot, outcome);
                // Let the browser's last frames (its close answer) through.
                if !says_farewell {
                    let _ = tokio::time::timeout(Duration::from_secs(2), &mut to_client).await;
                }
            }
            _ = cancel.cancelled() => return,
            _ = slot.servers.cancelled() => return,
        }
    }
    // The node's commands on this connection fail at once from here.
    drop(frames);
    if let Some(tap) = &tap {
        tap.close();
    }
    if says_farewell {
        crate::protocols::client_frames::farewell_answered(
            &mut upstream_read,
            &mut client_write,
            Duration::from_secs(5),
        )
        .await;
        let _ = client_write.shutdown().await;
    }
}

/// Logs how a client's side of a relay ended.
fn log_relay_end(
    slot: &InstanceSlot,
    outcome: Result<(), crate::protocols::client_frames::RelayError>,
) {
    match outcome {
        Err(crate::protocols::client_frames::RelayError::Io(error)) => {
            tracing::debug!(instance = %slot.id, %error, "client connection closed");
        }
        Err(error) => {
            tracing::info!(instance = %slot.id, %error, "a client's message was refused: its connection is closed");
        }
        Ok(()) => {}
    }
}

/// A byte stream that records activity on the instance whenever data moves.
struct ActivityIo<T> {
    inner: T,
    slot: Arc<InstanceSlot>,
}

impl<T: AsyncRead + Unpin> AsyncRead for ActivityIo<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let result = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(result, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.slot.touch();
        }
        result
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for ActivityIo<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let result = Pin::new(&mut self.inner).poll_write(cx, buf);
        if matches!(result, Poll::Ready(Ok(n)) if n > 0) {
            self.slot.touch();
        }
        result
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
