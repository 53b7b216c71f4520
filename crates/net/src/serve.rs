//! Serving HTTP/1.1 on a listener so that a slow or greedy client cannot
//! hold the process: every connection takes a slot of the process's
//! [`Budget`] (or is refused with a JSON error and closed), a request head
//! must arrive within `header_read_timeout_sec` (and the next one on a
//! kept-alive connection within the same time), a request body or a response
//! write that makes no progress for `idle_timeout_sec` ends the connection.
//! WebSocket upgrades are handed to the service as hyper does; the upgraded
//! connection keeps its slot (and the write-stall bound) until it closes.
//!
//! A request body a service answers without reading (a refusal before the
//! body is looked at) is read out before the answer goes, within
//! [`READ_OUT_BYTES`] and [`READ_OUT_TIME`], so the connection stays usable;
//! past those the answer says `Connection: close`. Hyper alone would close
//! such a connection without saying so, and a client that reuses it (every
//! pooled client does) sees its next request fail.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt as _;
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Sleep;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::ListenerLimits;
use crate::budget::{Budget, Slot};

/// How a request body arrives: bounded in how long it may stall.
type StallBoundedBody = tower_http::timeout::TimeoutBody<Incoming>;

/// The most of a request body left unread by its service that is read out
/// to keep the connection.
pub const READ_OUT_BYTES: usize = 1 << 20;

/// How long reading out a body left unread may take.
pub const READ_OUT_TIME: Duration = Duration::from_secs(1);

/// A request's body as services get it: bounded in how long it may stall.
/// Dropped before its end, what is left goes back to the connection
/// (which reads it out, or closes: see the module's docs).
pub struct Body {
    inner: Option<Pin<Box<StallBoundedBody>>>,
    unread: Arc<std::sync::Mutex<Option<Pin<Box<StallBoundedBody>>>>>,
}

impl Body {
    fn new(idle: Duration, incoming: Incoming) -> (Self, Unread) {
        let unread = Unread::default();
        let body = Self {
            inner: Some(Box::pin(StallBoundedBody::new(idle, incoming))),
            unread: unread.0.clone(),
        };
        (body, unread)
    }
}

impl hyper::body::Body for Body {
    type Data = Bytes;
    type Error = <StallBoundedBody as hyper::body::Body>::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Bytes>, Self::Error>>> {
        match self.inner.as_mut() {
            Some(inner) => inner.as_mut().poll_frame(cx),
            None => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner
            .as_ref()
            .is_none_or(|inner| inner.is_end_stream())
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.as_ref().map_or_else(
            || hyper::body::SizeHint::with_exact(0),
            |inner| inner.size_hint(),
        )
    }
}

impl Drop for Body {
    fn drop(&mut self) {
        if let Some(inner) = self.inner.take()
            && !hyper::body::Body::is_end_stream(&inner)
        {
            *self.unread.lock().expect("unread body lock") = Some(inner);
        }
    }
}

/// What a service left of its request's body when it dropped it.
#[derive(Default)]
struct Unread(Arc<std::sync::Mutex<Option<Pin<Box<StallBoundedBody>>>>>);

impl Unread {
    /// `response`, once the body its service left unread is read out, or
    /// saying `Connection: close` when it cannot be (too long, too slow,
    /// or awaiting `100 Continue`, which is not worth asking for now).
    async fn settle<B>(self, awaits_continue: bool, mut response: Response<B>) -> Response<B> {
        let left = self.0.lock().expect("unread body lock").take();
        let Some(mut left) = left else {
            return response;
        };
        if response.status() == StatusCode::SWITCHING_PROTOCOLS {
            return response;
        }
        if !awaits_continue && read_out(&mut left).await {
            return response;
        }
        response.headers_mut().insert(
            hyper::header::CONNECTION,
            hyper::header::HeaderValue::from_static("close"),
        );
        response
    }
}

/// Whether the rest of `body` came, within [`READ_OUT_BYTES`] and
/// [`READ_OUT_TIME`].
async fn read_out(body: &mut Pin<Box<StallBoundedBody>>) -> bool {
    let to_the_end = async {
        let mut read = 0;
        while let Some(frame) = body.frame().await {
            let Ok(frame) = frame else { return false };
            read += frame.data_ref().map_or(0, Bytes::len);
            if read > READ_OUT_BYTES {
                return false;
            }
        }
        true
    };
    tokio::time::timeout(READ_OUT_TIME, to_the_end)
        .await
        .unwrap_or(false)
}

/// How long open requests may finish after shutdown begins.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// The listeners of one process: its connection budget and the limits every
/// connection gets. Cheap to clone.
#[derive(Clone)]
pub struct Listeners {
    budget: Arc<Budget>,
    limits: ListenerLimits,
}

impl Listeners {
    pub fn new(limits: &ListenerLimits, runs: crate::Runs) -> Self {
        Self {
            budget: Budget::new(limits, runs),
            limits: limits.clone(),
        }
    }

    pub fn budget(&self) -> &Arc<Budget> {
        &self.budget
    }

    pub fn limits(&self) -> &ListenerLimits {
        &self.limits
    }

    /// Takes a slot for a connection just accepted, or refuses it: the
    /// refusal is written to the socket (it is new, so the write does not
    /// block) and the socket closed. For servers with their own HTTP code.
    pub fn admit(&self, stream: &TcpStream, peer: SocketAddr) -> Option<Slot> {
        match self.budget.admit(peer.ip()) {
            Ok(slot) => Some(slot),
            Err(refused) => {
                tracing::debug!(%peer, %refused, "connection refused");
                let _ = stream.try_write(&refused.http_response());
                None
            }
        }
    }

    /// Serves `router` on `listener` until `shutdown`; handlers can read the
    /// client's address as `ConnectInfo<SocketAddr>`.
    pub async fn serve_router(
        &self,
        listener: TcpListener,
        router: axum::Router,
        shutdown: CancellationToken,
    ) {
        self.serve(
            listener,
            move |peer| {
                let router = router.clone();
                move |mut request: Request<Body>| {
                    request
                        .extensions_mut()
                        .insert(axum::extract::ConnectInfo(peer));
                    let router = router.clone();
                    async move {
                        use tower::ServiceExt as _;
                        match router.oneshot(request).await {
                            Ok(response) => response,
                            Err(never) => match never {},
                        }
                    }
                }
            },
            shutdown,
        )
        .await
    }

    /// Serves on `listener` until `shutdown`, with a service made for each
    /// connection by `per_connection(client address)`. Returns once open
    /// requests have finished (at most a few seconds after `shutdown`).
    pub async fn serve<M, S, F, B>(
        &self,
        listener: TcpListener,
        per_connection: M,
        shutdown: CancellationToken,
    ) where
        M: Fn(SocketAddr) -> S,
        S: Fn(Request<Body>) -> F + Send + Sync + 'static,
        F: Future<Output = Response<B>> + Send + 'static,
        B: hyper::body::Body<Data = Bytes> + Send + 'static,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let connections = TaskTracker::new();
        self.accept_each(&listener, &shutdown, |stream, peer, slot| {
            connections.spawn(connection(
                stream,
                slot,
                per_connection(peer),
                self.limits.clone(),
                shutdown.clone(),
            ));
        })
        .await;
        connections.close();
        connections.wait().await;
    }

    /// Accepts connections on `listener` until `shutdown`, hands each one
    /// the budget admits to `admitted` (with `TCP_NODELAY` set), and
    /// refuses the others ([`Listeners::admit`]). A failed accept (out of
    /// descriptors, most likely) backs off briefly. The one accept loop of
    /// every listener, whoever speaks HTTP on it.
    pub async fn accept_each(
        &self,
        listener: &TcpListener,
        shutdown: &CancellationToken,
        mut admitted: impl FnMut(TcpStream, SocketAddr, Slot),
    ) {
        loop {
            let (stream, peer) = tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok(pair) => pair,
                    Err(error) => {
                        tracing::warn!(%error, "accept failed");
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    }
                },
                _ = shutdown.cancelled() => return,
            };
            let Some(slot) = self.admit(&stream, peer) else {
                continue;
            };
            let _ = stream.set_nodelay(true);
            admitted(stream, peer, slot);
        }
    }
}

/// One connection, until it ends, is evicted or the server shuts down.
async fn connection<S, F, B>(
    stream: TcpStream,
    slot: Slot,
    service: S,
    limits: ListenerLimits,
    shutdown: CancellationToken,
) where
    S: Fn(Request<Body>) -> F + Send + Sync + 'static,
    F: Future<Output = Response<B>> + Send + 'static,
    B: hyper::body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let idle = limits.idle_timeout();
    let io = StallBoundedIo::new(stream, slot.clone(), idle);
    let service = Arc::new(service);
    let request_slot = slot.clone();
    let hyper_service = hyper::service::service_fn(move |request: Request<Incoming>| {
        let in_flight = InFlight::begin(request_slot.clone());
        let awaits_continue = request
            .headers()
            .get(hyper::header::EXPECT)
            .is_some_and(|expect| expect.as_bytes().eq_ignore_ascii_case(b"100-continue"));
        let (parts, incoming) = request.into_parts();
        let (body, unread) = Body::new(idle, incoming);
        let response = service(Request::from_parts(parts, body));
        async move {
            let response = unread.settle(awaits_continue, response.await).await;
            if response.status() == StatusCode::SWITCHING_PROTOCOLS {
                in_flight.0.upgraded();
            }
            // The request stays in flight until its body is sent (or dropped).
            Ok::<_, std::convert::Infallible>(response.map(move |body| {
                body.map_frame(move |frame| {
                    let _ = &in_flight;
                    frame
                })
            }))
        }
    });
    let connection = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout())
        .serve_connection(TokioIo::new(io), hyper_service)
        .with_upgrades();
    tokio::pin!(connection);
    tokio::select! {
        _ = connection.as_mut() => {}
        _ = slot.evicted().cancelled() => {}
        _ = shutdown.cancelled() => {
            connection.as_mut().graceful_shutdown();
            let _ = tokio::time::timeout(SHUTDOWN_GRACE, connection).await;
        }
    }
}

/// A request in flight on a connection; its end makes the connection wait.
struct InFlight(Slot);

impl InFlight {
    fn begin(slot: Slot) -> Self {
        slot.request_started();
        Self(slot)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.request_done();
    }
}

/// A client socket whose writes may not stall longer than `idle` (a client
/// that stops reading cannot pin a response's buffers), holding the
/// connection's slot until it closes (also once upgraded).
struct StallBoundedIo {
    inner: TcpStream,
    idle: Duration,
    /// Running while a write waits for the client to read.
    stalled: Option<Pin<Box<Sleep>>>,
    /// Told when bytes are left to write (from a short or pending write
    /// until the next flush), so that such a connection is not evicted.
    slot: Slot,
}

impl StallBoundedIo {
    fn new(inner: TcpStream, slot: Slot, idle: Duration) -> Self {
        Self {
            inner,
            idle,
            stalled: None,
            slot,
        }
    }

    /// What a write answered, minding stalls and what is left to write.
    fn wrote(
        &mut self,
        cx: &mut Context<'_>,
        result: Poll<io::Result<usize>>,
        offered: usize,
    ) -> Poll<io::Result<usize>> {
        match result {
            Poll::Pending => {
                self.slot.set_writing(true);
                self.poll_stall(cx)
            }
            Poll::Ready(Ok(n)) => {
                self.stalled = None;
                if n < offered {
                    self.slot.set_writing(true);
                }
                Poll::Ready(Ok(n))
            }
            ready => ready,
        }
    }

    /// After a write returned pending: an error once it has been so for `idle`.
    fn poll_stall(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        let idle = self.idle;
        let stalled = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(idle)));
        match stalled.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the client read nothing for the idle timeout",
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl AsyncRead for StallBoundedIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for StallBoundedIo {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let result = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.wrote(cx, result, buf.len())
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let result = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        let offered = bufs.iter().map(|buf| buf.len()).sum();
        self.wrote(cx, result, offered)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let result = Pin::new(&mut self.inner).poll_flush(cx);
        if matches!(result, Poll::Ready(Ok(()))) {
            // hyper flushes once its buffers are written out.
            self.slot.set_writing(false);
        }
        result
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
