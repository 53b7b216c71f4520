//! The live view on an instance's `stream_port`.
//!
//! One `Page.startScreencast` per instance feeds every viewer. Frames go into a
//! `watch` channel that holds only the newest frame: each viewer takes the newest
//! frame when it is ready for one, so a slow viewer skips frames and never holds
//! up the browser or the other viewers. Frames are acknowledged as they arrive.
//! The screencast starts with the first viewer and stops a few seconds after
//! the last one leaves.
//!
//! - `GET /` — MJPEG (`multipart/x-mixed-replace`), shows in an `<img>`;
//! - `GET /ws` — a WebSocket of binary JPEG frames;
//! - `GET /frame.jpg` — the newest frame.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use crate::instance::BrowserPhase;
use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use base64::Engine;
use bytes::Bytes;
use serde_json::json;
use tokio::net::TcpListener;
use tokio::sync::{Mutex, watch};

use crate::access::NodeAccess;
use crate::cdp::CdpClient;
use crate::instance::InstanceSlot;
use crate::instance_http::{list_tabs, page_path};

/// Screencast settings (from `[agent]`).
#[derive(Debug, Clone, Copy)]
pub struct LiveViewSettings {
    pub width: u32,
    pub height: u32,
    pub quality: u8,
}

/// One JPEG frame and its sequence number (for viewers to notice skips).
#[derive(Debug, Clone)]
pub struct Frame {
    pub seq: u64,
    pub jpeg: Bytes,
}

/// The shared screencast of one instance.
pub struct LiveView {
    slot: Arc<InstanceSlot>,
    settings: LiveViewSettings,
    ready_timeout: Duration,
    frames: watch::Sender<Option<Frame>>,
    viewers: AtomicUsize,
    /// Frames received from the browser since start.
    pub frames_received: AtomicU64,
    /// Held while a screencast task runs; a tokio mutex so the check-and-start is atomic.
    running: Mutex<bool>,
}

impl LiveView {
    pub fn new(
        slot: Arc<InstanceSlot>,
        settings: LiveViewSettings,
        ready_timeout: Duration,
    ) -> Arc<Self> {
        Arc::new(Self {
            slot,
            settings,
            ready_timeout,
            frames: watch::channel(None).0,
            viewers: AtomicUsize::new(0),
            frames_received: AtomicU64::new(0),
            running: Mutex::new(false),
        })
    }

    /// Registers a viewer and makes sure the screencast runs. The guard
    /// unregisters on drop.
    async fn join(self: &Arc<Self>) -> ViewerGuard {
        self.viewers.fetch_add(1, Ordering::SeqCst);
        self.slot.touch();
        let mut running = self.running.lock().await;
        if !*running {
            *running = true;
            tokio::spawn(self.clone().screencast());
        }
        ViewerGuard(self.clone())
    }

    /// Runs the screencast while there are viewers; reconnects if the tab goes away.
    async fn screencast(self: Arc<Self>) {
        let mut last_viewer_seen = tokio::time::Instant::now();
        // A viewer connecting to a parked instance wakes it (wake on connect);
        // this loop's own retries never do.
        let mut wake = true;
        loop {
            let attempt = self.screencast_once(&mut last_viewer_seen, wake).await;
            wake = false;
            match attempt {
                Ok(()) => {}
                Err(error) => {
                    tracing::debug!(instance = %self.slot.id, %error, "screencast interrupted");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
            // While the instance is parked, wait (without waking it: only a
            // new connection does, `agent.wake_on_connect`) until it runs again
            // or the viewers leave. Decide under the lock, so that a viewer
            // joining now either sees `running == false` and starts a
            // screencast, or is served by this one.
            loop {
                let mut running = self.running.lock().await;
                if self.slot.servers.is_cancelled() || self.viewers.load(Ordering::SeqCst) == 0 {
                    *running = false;
                    return;
                }
                drop(running);
                if !matches!(self.slot.phase(), BrowserPhase::Dormant) {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            last_viewer_seen = tokio::time::Instant::now();
        }
    }

    /// One screencast session on the first tab. `Ok` when it ended because no
    /// viewer was left for 5 s.
    async fn screencast_once(
        &self,
        last_viewer_seen: &mut tokio::time::Instant,
        wake: bool,
    ) -> Result<(), String> {
        let endpoint = self
            .slot
            .wait_ready_waking(self.ready_timeout, wake)
            .await?
            .ok_or("sim instance: no browser")?;
        let tab = list_tabs(&endpoint)
            .await?
            .into_iter()
            .next()
            .ok_or("the browser has no open tab")?;
        let client = CdpClient::open(&endpoint, &page_path(&tab))
            .await
            .map_err(|e| e.to_string())?;
        let mut events = client.events();
        let timeout = Duration::from_secs(10);
        client
            .call(
                "Page.startScreencast",
                json!({
                    "format": "jpeg",
                    "quality": self.settings.quality,
                    "maxWidth": self.settings.width,
                    "maxHeight": self.settings.height,
                    "everyNthFrame": 1,
                }),
                None,
                timeout,
            )
            .await
            .map_err(|e| e.to_string())?;
        let mut tick = tokio::time::interval(Duration::from_millis(500));
        let frames_at_start = self.frames_received.load(Ordering::Relaxed);
        let mut seeded = false;
        loop {
            tokio::select! {
                event = events.recv() => {
                    let event = match event {
                        Ok(event) => event,
                        Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                        Err(_) => return Err("page connection closed".into()),
                    };
                    match event.method.as_str() {
                        "Page.screencastFrame" => {
                            if let Some(session) = event.params.get("sessionId").cloned() {
                                let _ = client.send("Page.screencastFrameAck", json!({"sessionId": session})).await;
                            }
                            let data = event.params.get("data").and_then(|d| d.as_str()).unwrap_or_default();
                            if let Ok(jpeg) = base64::engine::general_purpose::STANDARD.decode(data) {
                                let seq = self.frames_received.fetch_add(1, Ordering::Relaxed) + 1;
                                self.frames.send_replace(Some(Frame { seq, jpeg: Bytes::from(jpeg) }));
                            }
                        }
                        "Inspector.detached" | "Inspector.targetCrashed" => return Err(format!("page {}", event.method)),
                        _ => {}
                    }
                }
                _ = tick.tick() => {
                    // A page that has not painted since the screencast started
                    // (a fresh about:blank) sends no frame: seed one.
                    if !seeded && self.frames_received.load(Ordering::Relaxed) == frames_at_start {
                        seeded = true;
                        self.seed_frame(&client, timeout).await;
                    }
                    if self.viewers.load(Ordering::SeqCst) > 0 {
                        *last_viewer_seen = tokio::time::Instant::now();
                    } else if last_viewer_seen.elapsed() > Duration::from_secs(5) {
                        let _ = client.call("Page.stopScreencast", json!({}), None, timeout).await;
                        return Ok(());
                    }
                }
                _ = self.slot.servers.cancelled() => return Ok(()),
            }
        }
    }
}

impl LiveView {
    /// Publishes a screenshot as the current frame.
    async fn seed_frame(&self, client: &CdpClient, timeout: Duration) {
        let shot = client
            .call(
                "Page.captureScreenshot",
                json!({ "format": "jpeg", "quality": self.settings.quality }),
                None,
                timeout,
            )
            .await;
        let jpeg = shot.ok().and_then(|result| {
            let data = result.get("data")?.as_str()?;
            base64::engine::general_purpose::STANDARD.decode(data).ok()
        });
        if let Some(jpeg) = jpeg
            && self.frames.borrow().is_none()
        {
            let seq = self.frames_received.fetch_add(1, Ordering::Relaxed) + 1;
            self.frames.send_replace(Some(Frame {
                seq,
                jpeg: Bytes::from(jpeg),
            }));
        }
    }
}

struct ViewerGuard(Arc<LiveView>);

impl Drop for ViewerGuard {
    fn drop(&mut self) {
        self.0.viewers.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Serves the live view until the instance's servers stop; with
/// authentication on, every request needs a credential ([`crate::access`]).
pub async fn serve(listener: TcpListener, live_view: Arc<LiveView>, access: Arc<NodeAccess>) {
    let cancel = live_view.slot.servers.clone();
    let guard_state = (access, live_view.slot.clone());
    let router = Router::new()
        .route("/", get(mjpeg))
        .route("/ws", get(websocket))
        .route("/frame.jpg", get(latest_frame))
        .with_state(live_view)
        .layer(axum::middleware::from_fn_with_state(
            guard_state,
            crate::access::require_credential,
        ));
    let _ = axum::serve(listener, router)
        .with_graceful_shutdown(async move { cancel.cancelled().await })
        .await;
}

const BOUNDARY: &str = "flotillaframe";

async fn mjpeg(State(live_view): State<Arc<LiveView>>) -> Response {
    let content_type = format!("multipart/x-mixed-replace; boundary={BOUNDARY}");
    Response::builder()
        .header(header::CONTENT_TYPE, content_type)
        .header(header::CACHE_CONTROL, "no-store")
        .body(Body::from_stream(mjpeg_parts(live_view).await))
        .expect("static response")
}

/// The frames as multipart parts, each as soon as it is captured, until the
/// viewer leaves or the instance's servers stop.
async fn mjpeg_parts(
    live_view: Arc<LiveView>,
) -> impl futures_util::Stream<Item = Result<Bytes, std::io::Error>> {
    let guard = live_view.join().await;
    let frames = live_view.frames.subscribe();
    futures_util::stream::unfold(
        (frames, guard, 0u64),
        |(mut frames, guard, last_sent)| async move {
            loop {
                let frame = frames.borrow_and_update().clone();
                if let Some(frame) = frame.filter(|f| f.seq != last_sent) {
                    guard.0.slot.touch();
                    let part = multipart_part(&frame.jpeg, last_sent == 0);
                    return Some((Ok(part), (frames, guard, frame.seq)));
                }
                tokio::select! {
                    changed = frames.changed() => if changed.is_err() { return None },
                    _ = guard.0.slot.servers.cancelled() => return None,
                }
            }
        },
    )
}

/// One JPEG as a part. Each frame is followed at once by the next part's
/// boundary and headers: browsers show a part only when the next one begins,
/// and a still page sends no next frame.
fn multipart_part(jpeg: &[u8], first: bool) -> Bytes {
    let next_part = format!("\r\n--{BOUNDARY}\r\nContent-Type: image/jpeg\r\n\r\n");
    let mut part = Vec::with_capacity(jpeg.len() + 2 * next_part.len());
    if first {
        part.extend_from_slice(&next_part.as_bytes()[2..]);
    }
    part.extend_from_slice(jpeg);
    part.extend_from_slice(next_part.as_bytes());
    Bytes::from(part)
}

async fn websocket(State(live_view): State<Arc<LiveView>>, upgrade: WebSocketUpgrade) -> Response {
    upgrade.on_upgrade(move |socket| ws_viewer(socket, live_view))
}

async fn ws_viewer(mut socket: WebSocket, live_view: Arc<LiveView>) {
    let _guard = live_view.join().await;
    let mut frames = live_view.frames.subscribe();
    let mut last_sent = 0;
    loop {
        let frame = frames.borrow_and_update().clone();
        if let Some(frame) = frame.filter(|f| f.seq != last_sent) {
            last_sent = frame.seq;
            live_view.slot.touch();
            if socket.send(Message::Binary(frame.jpeg)).await.is_err() {
                return;
            }
            continue;
        }
        tokio::select! {
            changed = frames.changed() => if changed.is_err() { return },
            incoming = socket.recv() => match incoming {
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => return,
                _ => {}
            },
            _ = live_view.slot.servers.cancelled() => return,
        }
    }
}

async fn latest_frame(State(live_view): State<Arc<LiveView>>) -> Response {
    let _guard = live_view.join().await;
    let Some(jpeg) = first_frame(&live_view).await else {
        let reason = "no frame from the browser yet\n";
        return (StatusCode::SERVICE_UNAVAILABLE, reason).into_response();
    };
    let headers = [
        (header::CONTENT_TYPE, "image/jpeg"),
        (header::CACHE_CONTROL, "no-store"),
    ];
    (headers, jpeg).into_response()
}

/// The latest frame, waiting up to the ready timeout for a first one.
async fn first_frame(live_view: &LiveView) -> Option<Bytes> {
    let mut frames = live_view.frames.subscribe();
    let wait = tokio::time::timeout(live_view.ready_timeout, async {
        loop {
            if let Some(frame) = frames.borrow_and_update().clone() {
                return Some(frame.jpeg);
            }
            if frames.changed().await.is_err() {
                return None;
            }
        }
    });
    wait.await.ok().flatten()
}
