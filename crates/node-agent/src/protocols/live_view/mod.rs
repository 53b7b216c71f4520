//! The live view on an instance's `stream_port`.
//!
//! One source of frames per instance feeds every viewer: on Chromium its
//! `Page.startScreencast` (below), on Firefox screenshots over WebDriver
//! BiDi ([`firefox`]). Frames go into a
//! `watch` channel that holds only the newest frame: each viewer takes the newest
//! frame when it is ready for one, so a slow viewer skips frames and never holds
//! up the browser or the other viewers. Frames are acknowledged as they arrive.
//! The screencast starts with the first viewer and stops a few seconds after
//! the last one leaves.
//!
//! Chromium sometimes starts a screencast that never sends a frame, though
//! the page paints (seen about once in twenty starts on a loaded machine,
//! Chromium 156: `Page.captureScreenshot` works, the page animates, no
//! `Page.screencastFrame` comes). A screencast that has sent no frame since
//! it started, while viewers watch, is started again on a fresh connection
//! after [`SILENCE_FIRST`], then after twice as long each time it stays
//! silent (a page that never paints is silent too), up to [`SILENCE_MAX`].
//! Once a screencast has sent a frame it is left alone (a still page sends
//! none), and the next one waits [`SILENCE_FIRST`] again.
//!
//! - `GET /` — MJPEG (`multipart/x-mixed-replace`), shows in an `<img>`;
//! - `GET /ws` — a WebSocket of binary JPEG frames, `state` messages, and
//!   the viewer's input once it holds control (see [`crate::protocols::live_control`]);
//! - `GET /frame.jpg` — the newest frame.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use bytes::Bytes;
use tokio::net::TcpListener;
use tokio::sync::{Mutex, watch};

mod firefox;

use crate::engine::bidi::BidiError;
use crate::engine::browser::CdpEndpoint;
use crate::engine::cdp::{CdpClient, CdpError, CdpEvent};
use crate::engine::firefox_view::FirefoxView;
use crate::engine::screencast::{FrameSettings, Screencast, ScreencastEvent};
use crate::protocols::access::NodeAccess;

/// How long a screencast's CDP calls may take.
const CDP_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a screencast may send nothing, while viewers watch, before it
/// is started again; doubled after each silent start, up to [`SILENCE_MAX`].
const SILENCE_FIRST: Duration = Duration::from_secs(3);
const SILENCE_MAX: Duration = Duration::from_secs(48);

/// When a screencast has been silent too long (see the module's docs).
#[derive(Debug, Clone, Copy)]
struct SilenceWatch {
    limit: Duration,
    session_start: tokio::time::Instant,
    /// The session has sent a frame.
    framed: bool,
}

impl SilenceWatch {
    fn new(now: tokio::time::Instant) -> Self {
        Self {
            limit: SILENCE_FIRST,
            session_start: now,
            framed: false,
        }
    }

    /// A screencast session starts (again): silence counts from now.
    fn session_started(&mut self, now: tokio::time::Instant) {
        self.session_start = now;
        self.framed = false;
    }

    fn frame(&mut self) {
        self.framed = true;
        self.limit = SILENCE_FIRST;
    }

    /// The next session waits the first wait (another tab is shown).
    fn reset(&mut self) {
        self.limit = SILENCE_FIRST;
    }

    /// How long the session has been silent, when it has sent no frame
    /// and that is too long; the next session may then be silent twice as
    /// long.
    fn too_long(&mut self, now: tokio::time::Instant) -> Option<Duration> {
        let silent = now.saturating_duration_since(self.session_start);
        if self.framed || silent < self.limit {
            return None;
        }
        self.limit = (self.limit * 2).min(SILENCE_MAX);
        Some(silent)
    }
}
use crate::engine::page::{Tab, TabsError, list_tabs, page_path};
use crate::instance::InstanceSlot;
use crate::instance::NotReady;
use crate::protocols::live_control::{
    self, ControlError, ControlState, InvalidMessage, ViewerMessage, ViewerState, Viewport,
};

/// An event already received, if any (a closed connection is left to the
/// screencast's `recv`).
fn pending(events: &mut tokio::sync::broadcast::Receiver<CdpEvent>) -> Option<CdpEvent> {
    loop {
        match events.try_recv() {
            Ok(event) => return Some(event),
            Err(tokio::sync::broadcast::error::TryRecvError::Lagged(_)) => continue,
            Err(_) => return None,
        }
    }
}

/// How often a screencast looks at its viewers, tabs and silence.
const TICK: Duration = Duration::from_millis(500);

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

/// Why a screencast session ended before its time (logged; the screencast
/// starts again while viewers remain).
#[derive(Debug, thiserror::Error)]
enum ScreencastError {
    #[error(transparent)]
    NotReady(#[from] NotReady),
    #[error("sim instance: no browser")]
    NoBrowser,
    #[error("{0}")]
    Tabs(#[from] TabsError),
    #[error("the browser has no open tab")]
    NoTab,
    #[error("{0}")]
    Browser(#[from] CdpError),
    #[error("page connection closed")]
    ConnectionClosed,
    /// The page crashed or was detached (the CDP event's method).
    #[error("page {method}")]
    PageGone { method: String },
    #[error("the tab being shown was closed")]
    TabClosed,
    #[error("no frame for {0:?} while viewers watch")]
    Silent(Duration),
    #[error("{0}")]
    Firefox(#[from] BidiError),
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
    /// The screencast's page connection and frame size while one runs:
    /// viewers' input goes over it. A std lock, never held across an await.
    page: std::sync::Mutex<Option<ShownPage>>,
    /// What viewers' `state` messages are made of; each viewer watches it.
    shared: watch::Sender<Shared>,
    /// Ids of viewers (control is held by an id).
    next_viewer: AtomicU64,
    /// Wakes the screencast to move to `Shared::wanted_tab`.
    switch: tokio::sync::Notify,
}

/// The page the screencast shows.
#[derive(Clone)]
struct ShownPage {
    link: PageLink,
    viewport: Viewport,
}

/// How viewers' input reaches the page shown.
#[derive(Clone)]
enum PageLink {
    /// Chromium: the screencast's connection to the page.
    Cdp(Arc<CdpClient>),
    /// Firefox: the view's BiDi connection, and the tab's context.
    Firefox {
        view: Arc<FirefoxView>,
        context: String,
    },
}

/// Control, tabs and frame size, as every viewer sees them.
#[derive(Debug, Clone, Default, PartialEq)]
struct Shared {
    /// The viewer holding control.
    controller: Option<u64>,
    tabs: Vec<Tab>,
    /// The tab being shown.
    tab: Option<String>,
    /// The tab a viewer asked for.
    wanted_tab: Option<String>,
    viewport: Option<Viewport>,
    /// Why no frames come (see [`ViewerState::notice`]).
    notice: Option<&'static str>,
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
            page: std::sync::Mutex::new(None),
            shared: watch::channel(Shared::default()).0,
            next_viewer: AtomicU64::new(0),
            switch: tokio::sync::Notify::new(),
        })
    }

    /// Registers a viewer and makes sure the screencast runs (waking a
    /// parked instance). The guard unregisters on drop.
    async fn join(self: &Arc<Self>) -> ViewerGuard {
        self.slot.touch();
        self.enter(true).await
    }

    /// A viewer that keeps the screencast going without counting as
    /// activity and without waking a parked instance (the recorder).
    pub async fn join_quietly(self: &Arc<Self>) -> ViewerGuard {
        self.enter(false).await
    }

    async fn enter(self: &Arc<Self>, wake: bool) -> ViewerGuard {
        self.viewers.fetch_add(1, Ordering::SeqCst);
        let mut running = self.running.lock().await;
        if !*running {
            *running = true;
            tokio::spawn(self.clone().screencast(wake));
        }
        ViewerGuard(self.clone())
    }

    /// Runs the screencast while there are viewers; reconnects if the tab goes away.
    async fn screencast(self: Arc<Self>, wake: bool) {
        let mut last_viewer_seen = tokio::time::Instant::now();
        // A viewer connecting to a parked instance wakes it (wake on connect);
        // this loop's own retries never do.
        let mut wake = wake;
        let mut silence = SilenceWatch::new(last_viewer_seen);
        loop {
            let attempt = self
                .screencast_once(&mut last_viewer_seen, wake, &mut silence)
                .await;
            *self.page.lock().expect("page lock") = None;
            wake = false;
            match attempt {
                Ok(()) => silence.reset(),
                Err(ScreencastError::Silent(waited)) => {
                    tracing::debug!(instance = %self.slot.id, ?waited, "screencast silent: starting it again");
                }
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
                if !matches!(
                    self.slot.state(),
                    crate::instance::state::State::Dormant { .. }
                ) {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            last_viewer_seen = tokio::time::Instant::now();
        }
    }

    /// One screencast session on the chosen tab (or the first). `Ok` when it
    /// ended because no viewer was left for 5 s, or to move to another tab;
    /// [`ScreencastError::Silent`] when `silence` finds it silent too long
    /// while viewers watch.
    async fn screencast_once(
        &self,
        last_viewer_seen: &mut tokio::time::Instant,
        wake: bool,
        silence: &mut SilenceWatch,
    ) -> Result<(), ScreencastError> {
        let endpoint = self
            .slot
            .wait_ready_waking(self.ready_timeout, wake)
            .await?
            .ok_or(ScreencastError::NoBrowser)?;
        if !endpoint.speaks_cdp() {
            return self.firefox_once(&endpoint, last_viewer_seen).await;
        }
        let (client, tab) = self.start_screencast(&endpoint).await?;
        let mut events = client.events();
        let started = tokio::time::Instant::now();
        let mut tick = tokio::time::interval_at(started + TICK, TICK);
        let mut ticks = 0u64;
        silence.session_started(started);
        loop {
            tokio::select! {
                event = events.recv() => match event {
                    Ok(event) => {
                        if self.on_page_event(&client, &event).await? {
                            silence.frame();
                        }
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                    Err(_) => return Err(ScreencastError::ConnectionClosed),
                },
                _ = self.switch.notified() => break,
                _ = tick.tick() => {
                    ticks += 1;
                    if ticks.is_multiple_of(4) {
                        self.refresh_tabs(&endpoint, &tab).await?;
                    }
                    // A page that has not painted since the screencast started
                    // (a fresh about:blank) sends no frame: seed one.
                    if ticks == 1 && self.frames.borrow().is_none() {
                        self.seed_frame(&client, CDP_TIMEOUT).await;
                    }
                    if self.viewers.load(Ordering::SeqCst) > 0 {
                        *last_viewer_seen = tokio::time::Instant::now();
                        // Frames that came while the calls above ran count.
                        while let Some(event) = pending(&mut events) {
                            if self.on_page_event(&client, &event).await? {
                                silence.frame();
                            }
                        }
                        if let Some(silent) = silence.too_long(tokio::time::Instant::now()) {
                            Screencast::new(&client).stop().await;
                            return Err(ScreencastError::Silent(silent));
                        }
                    } else if last_viewer_seen.elapsed() > Duration::from_secs(5) {
                        break;
                    }
                }
                _ = self.slot.servers.cancelled() => return Ok(()),
            }
        }
        Screencast::new(&client).stop().await;
        Ok(())
    }

    /// Opens the chosen tab (or the first), starts its screencast and tells
    /// the viewers; the page connection and the tab's id.
    async fn start_screencast(
        &self,
        endpoint: &CdpEndpoint,
    ) -> Result<(Arc<CdpClient>, String), ScreencastError> {
        let tabs = list_tabs(endpoint).await?;
        let tab = self
            .wanted_or_first(&tabs, |tab| &tab.id)
            .cloned()
            .ok_or(ScreencastError::NoTab)?;
        let client = Arc::new(CdpClient::open(endpoint, &page_path(&tab)).await?);
        let frames = FrameSettings {
            quality: self.settings.quality,
            width: self.settings.width,
            height: self.settings.height,
        };
        Screencast::new(&client).start(frames).await?;
        self.show(PageLink::Cdp(client.clone()), tab.id.clone(), tabs);
        Ok((client, tab.id))
    }

    /// The tab a viewer asked for, else the first of `tabs` (`id` reads a
    /// tab's id).
    fn wanted_or_first<'t, T>(&self, tabs: &'t [T], id: impl Fn(&T) -> &String) -> Option<&'t T> {
        let wanted = self.shared.borrow().wanted_tab.clone();
        tabs.iter()
            .find(|tab| Some(id(tab)) == wanted.as_ref())
            .or(tabs.first())
    }

    /// A frame (acknowledged, published to the viewers: `true`), or the
    /// page gone.
    async fn on_page_event(
        &self,
        client: &CdpClient,
        event: &CdpEvent,
    ) -> Result<bool, ScreencastError> {
        match Screencast::new(client).read(event).await {
            ScreencastEvent::Frame { jpeg, metadata } => {
                self.frame_metadata(&metadata);
                if let Some(jpeg) = jpeg {
                    let seq = self.frames_received.fetch_add(1, Ordering::Relaxed) + 1;
                    let jpeg = Bytes::from(jpeg);
                    self.frames.send_replace(Some(Frame { seq, jpeg }));
                }
                Ok(true)
            }
            ScreencastEvent::PageGone { method } => Err(ScreencastError::PageGone { method }),
            ScreencastEvent::Other => Ok(false),
        }
    }
}

impl LiveView {
    /// The newest frame, as it changes.
    pub fn frames(&self) -> watch::Receiver<Option<Frame>> {
        self.frames.subscribe()
    }

    /// Records the page the screencast now shows, and tells the viewers.
    fn show(&self, link: PageLink, tab: String, tabs: Vec<Tab>) {
        let viewport = Viewport {
            width: f64::from(self.settings.width),
            height: f64::from(self.settings.height),
        };
        let viewport = self.shared.borrow().viewport.unwrap_or(viewport);
        *self.page.lock().expect("page lock") = Some(ShownPage { link, viewport });
        self.shared.send_if_modified(|shared| {
            let changed =
                shared.tab.as_ref() != Some(&tab) || shared.tabs != tabs || shared.notice.is_some();
            shared.tab = Some(tab);
            shared.tabs = tabs;
            shared.notice = None;
            changed
        });
    }

    /// The page being shown; while the screencast moves to another tab (or
    /// starts), waits for it a little.
    async fn shown_page(&self) -> Option<ShownPage> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        loop {
            if let Some(page) = self.page.lock().expect("page lock").clone() {
                return Some(page);
            }
            if tokio::time::Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The frame's size in CSS pixels, from a screencast frame's metadata.
    fn frame_metadata(&self, metadata: &serde_json::Value) {
        let (Some(width), Some(height)) = (
            metadata["deviceWidth"].as_f64(),
            metadata["deviceHeight"].as_f64(),
        ) else {
            return;
        };
        self.frame_size(Viewport { width, height });
    }

    /// The frame's size in CSS pixels, as the browser tells it.
    fn frame_size(&self, viewport: Viewport) {
        if let Some(page) = self.page.lock().expect("page lock").as_mut() {
            page.viewport = viewport;
        }
        self.shared.send_if_modified(|shared| {
            let changed = shared.viewport != Some(viewport);
            shared.viewport = Some(viewport);
            changed
        });
    }

    /// Reads the open tabs again (new tabs and popups appear); an error
    /// when the tab being shown is gone, so the screencast moves on.
    async fn refresh_tabs(
        &self,
        endpoint: &CdpEndpoint,
        shown: &str,
    ) -> Result<(), ScreencastError> {
        let tabs = list_tabs(endpoint).await?;
        if !tabs.iter().any(|tab| tab.id == shown) {
            return Err(ScreencastError::TabClosed);
        }
        self.shared.send_if_modified(|shared| {
            let changed = shared.tabs != tabs;
            shared.tabs = tabs;
            changed
        });
        Ok(())
    }

    /// Publishes a screenshot as the current frame (none has come yet).
    async fn seed_frame(&self, client: &CdpClient, timeout: Duration) {
        let jpeg = Screencast::new(client)
            .still(self.settings.quality, timeout)
            .await;
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

/// A viewer's place: the screencast runs while any is held.
pub struct ViewerGuard(Arc<LiveView>);

impl Drop for ViewerGuard {
    fn drop(&mut self) {
        self.0.viewers.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Serves the live view until the instance's servers stop; with
/// authentication on, every request needs a credential ([`crate::protocols::access`]).
pub async fn serve(
    listener: TcpListener,
    live_view: Arc<LiveView>,
    door: (Arc<NodeAccess>, flotilla_net::Listeners),
) {
    let slot = live_view.slot.clone();
    let router = Router::new()
        .route("/", get(mjpeg))
        .route("/ws", get(websocket))
        .route("/frame.jpg", get(latest_frame))
        .with_state(live_view);
    crate::protocols::access::serve_instance_port(listener, router, door, slot).await;
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

/// Every viewer the access layer let in may take control, unless it asked
/// to watch only (`?mode=view`, which the door always adds for `view` live
/// links).
async fn websocket(
    State(live_view): State<Arc<LiveView>>,
    query: axum::extract::RawQuery,
    headers: axum::http::HeaderMap,
    upgrade: WebSocketUpgrade,
) -> Response {
    if let Some(refusal) = foreign_origin(&headers) {
        return refusal;
    }
    let view_only = query.0.as_deref().is_some_and(|query| {
        url::form_urlencoded::parse(query.as_bytes())
            .any(|(name, value)| name == "mode" && value == "view")
    });
    let may_control = !view_only;
    upgrade
        .max_message_size(live_control::MAX_MESSAGE_BYTES)
        .on_upgrade(move |socket| ws_viewer(socket, live_view, may_control))
}

/// The 403 of a WebSocket that a page of another site opened (its `Origin`
/// is not this port's host): such a page could watch, and drive, the
/// browser in the name of whoever visits it (see
/// [`flotilla_api_types::origin`]). Clients that are not browsers send no
/// `Origin`; the front door checks it and does not pass it on.
fn foreign_origin(headers: &axum::http::HeaderMap) -> Option<Response> {
    let origin = headers.get(axum::http::header::ORIGIN)?;
    let origin = origin.to_str().unwrap_or("null");
    let host = headers
        .get(axum::http::header::HOST)
        .and_then(|host| host.to_str().ok())
        .unwrap_or("");
    if flotilla_api_types::origin::same_origin(origin, host) {
        return None;
    }
    let body = serde_json::json!({
        "detail": format!("a live view opened by a page of {origin} is refused: only pages of this server may open it"),
        "code": "forbidden",
    });
    Some((axum::http::StatusCode::FORBIDDEN, axum::Json(body)).into_response())
}

/// One WebSocket viewer: frames as they come, `state` whenever control,
/// tabs or the frame size change, and its messages handled in order.
async fn ws_viewer(mut socket: WebSocket, live_view: Arc<LiveView>, may_control: bool) {
    let _guard = live_view.join().await;
    let viewer = Viewer {
        id: live_view.next_viewer.fetch_add(1, Ordering::Relaxed) + 1,
        may_control,
        live_view: live_view.clone(),
    };
    let mut frames = live_view.frames.subscribe();
    let mut shared = live_view.shared.subscribe();
    shared.mark_changed();
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
        let reply = tokio::select! {
            changed = frames.changed() => if changed.is_err() { return } else { continue },
            changed = shared.changed() => match changed {
                Ok(()) => viewer.state(&shared.borrow_and_update()),
                Err(_) => return,
            },
            incoming = socket.recv() => match incoming {
                Some(Ok(Message::Text(text))) => match viewer.on_message(text.as_str()).await {
                    Ok(()) => continue,
                    Err(detail) => live_control::error_message(&detail.to_string()),
                },
                Some(Ok(Message::Binary(_))) => live_control::error_message(&InvalidMessage::NotText.to_string()),
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => return,
                Some(Ok(_)) => continue,
            },
            _ = live_view.slot.servers.cancelled() => return,
        };
        if socket.send(Message::Text(reply.into())).await.is_err() {
            return;
        }
    }
}

/// A WebSocket viewer: its id, whether it may take control. Gives control
/// back when it leaves.
struct Viewer {
    id: u64,
    may_control: bool,
    live_view: Arc<LiveView>,
}

impl Drop for Viewer {
    fn drop(&mut self) {
        self.release();
    }
}

impl Viewer {
    fn state(&self, shared: &Shared) -> String {
        let control = match shared.controller {
            _ if !self.may_control => ControlState::ViewOnly,
            Some(id) if id == self.id => ControlState::Yours,
            Some(_) => ControlState::Taken,
            None => ControlState::Free,
        };
        let state = ViewerState {
            kind: "state",
            control,
            tabs: shared.tabs.clone(),
            tab: shared.tab.clone(),
            viewport: shared.viewport,
            notice: shared.notice,
        };
        serde_json::to_string(&state).unwrap_or_default()
    }

    /// Handles one message; the error says why it did nothing.
    async fn on_message(&self, text: &str) -> Result<(), ControlError> {
        let message = live_control::parse(text)?;
        match message {
            ViewerMessage::Control { take: true } => self.take(),
            ViewerMessage::Control { take: false } => {
                self.release();
                Ok(())
            }
            ViewerMessage::Tab { id } => self.show_tab(id),
            input => self.input(&input).await,
        }
    }

    fn take(&self) -> Result<(), ControlError> {
        if !self.may_control {
            return Err(ControlError::ViewOnly);
        }
        let mut taken = Ok(());
        self.live_view
            .shared
            .send_if_modified(|shared| match shared.controller {
                None => {
                    shared.controller = Some(self.id);
                    true
                }
                Some(id) if id == self.id => false,
                Some(_) => {
                    taken = Err(ControlError::Taken);
                    false
                }
            });
        taken
    }

    fn release(&self) {
        self.live_view.shared.send_if_modified(|shared| {
            let mine = shared.controller == Some(self.id);
            if mine {
                shared.controller = None;
            }
            mine
        });
    }

    fn holds_control(&self) -> Result<(), ControlError> {
        match self.live_view.shared.borrow().controller {
            Some(id) if id == self.id => Ok(()),
            _ if !self.may_control => Err(ControlError::ViewOnly),
            Some(_) => Err(ControlError::HeldByAnother),
            None => Err(ControlError::NotHeld),
        }
    }

    /// Shows another tab (to every viewer): for the viewer holding control,
    /// or any that may take it while nobody holds it.
    fn show_tab(&self, id: String) -> Result<(), ControlError> {
        let controller = self.live_view.shared.borrow().controller;
        match controller {
            _ if !self.may_control => return Err(ControlError::ViewOnly),
            Some(holder) if holder != self.id => return Err(ControlError::HeldByAnother),
            _ => {}
        }
        let (mut known, mut shown) = (true, false);
        self.live_view.shared.send_if_modified(|shared| {
            known = shared.tabs.iter().any(|tab| tab.id == id);
            shown = shared.tab.as_ref() == Some(&id);
            if known {
                shared.wanted_tab = Some(id.clone());
            }
            false
        });
        if !known {
            return Err(ControlError::UnknownTab { id });
        }
        if !shown {
            self.live_view.switch.notify_one();
        }
        Ok(())
    }

    async fn input(&self, message: &ViewerMessage) -> Result<(), ControlError> {
        self.holds_control()?;
        let page = self.live_view.shown_page().await;
        let page = page.ok_or(ControlError::NoPage)?;
        self.live_view.slot.touch();
        match &page.link {
            PageLink::Cdp(client) => live_control::dispatch(client, message, page.viewport).await,
            PageLink::Firefox { view, context } => {
                live_control::dispatch_to_firefox(view, context, message, page.viewport).await
            }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_silent_screencast_waits_twice_as_long_each_time_until_a_frame() {
        let start = tokio::time::Instant::now();
        let at = |secs: u64| start + Duration::from_secs(secs);
        let mut watch = SilenceWatch::new(start);
        assert_eq!(watch.too_long(at(2)), None);
        assert_eq!(watch.too_long(at(3)), Some(Duration::from_secs(3)));
        // Started again: 6 s this time, then 12, 24, 48, and no more.
        let mut now = 3;
        for limit in [6, 12, 24, 48, 48] {
            watch.session_started(at(now));
            assert_eq!(watch.too_long(at(now + limit - 1)), None, "{limit}");
            now += limit;
            assert_eq!(watch.too_long(at(now)), Some(Duration::from_secs(limit)));
        }
        // A session that sent a frame is never silent (a still page sends
        // nothing more), and the next one waits 3 s again.
        watch.session_started(at(now));
        watch.frame();
        assert_eq!(watch.too_long(at(now + 600)), None);
        watch.session_started(at(now + 600));
        assert_eq!(watch.too_long(at(now + 602)), None);
        assert_eq!(watch.too_long(at(now + 603)), Some(Duration::from_secs(3)));
        // Another tab: the first wait again.
        watch.session_started(at(now + 603));
        assert_eq!(watch.too_long(at(now + 609)), Some(Duration::from_secs(6)));
        watch.reset();
        watch.session_started(at(now + 609));
        assert_eq!(watch.too_long(at(now + 612)), Some(Duration::from_secs(3)));
    }
}
