//! The live view of a Firefox ([`crate::engine::firefox_view`]): Firefox
//! has no screencast, so frames are JPEG screenshots of the tab shown,
//! taken up to [`FRAMES_PER_SECOND`] times a second while viewers watch; a
//! frame the same as the last is not sent again. The tabs and the
//! viewport are read again every [`TABS_EVERY`].
//!
//! The view rides on a WebDriver client's session when there is one, else
//! holds a session of its own, which it ends between two frames when a
//! client or the agent's own work claims the browser's only session. While
//! a BiDi client holds it (the `bidi` door), no frame comes and viewers'
//! `state` says why ([`HELD`]).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;

use super::{Frame, LiveView, PageLink, ScreencastError};
use crate::engine::bidi::BidiError;
use crate::engine::browser::CdpEndpoint;
use crate::engine::firefox_view::FirefoxView;

/// The most frames a second a Firefox's live view takes.
pub const FRAMES_PER_SECOND: u64 = 15;
const FRAME_INTERVAL: Duration = Duration::from_millis(1000 / FRAMES_PER_SECOND);
/// How often the tabs and the viewport are read again.
const TABS_EVERY: Duration = Duration::from_secs(1);
/// How long the view waits before it looks again at a session another holds.
const HELD_WAIT: Duration = Duration::from_secs(1);
/// What viewers are told while a BiDi client holds Firefox's only session.
pub const HELD: &str = "a WebDriver BiDi client holds this Firefox's only session, which the live view cannot share: it shows the browser again once that client leaves (sessions through /wd/hub are shown)";

impl LiveView {
    /// One run of a Firefox's live view (see the module). `Ok` when no
    /// viewer was left for 5 s, when its own session was claimed, or while
    /// a BiDi client holds the browser.
    pub(super) async fn firefox_once(
        &self,
        endpoint: &CdpEndpoint,
        last_viewer_seen: &mut tokio::time::Instant,
    ) -> Result<(), ScreencastError> {
        let socket = self.slot.webdriver.view_socket();
        let view = match FirefoxView::open(endpoint, socket.as_deref()).await {
            Ok(view) => Arc::new(view),
            Err(BidiError::SessionHeld) => {
                self.shared.send_if_modified(|shared| {
                    let changed = shared.notice != Some(HELD);
                    shared.notice = Some(HELD);
                    changed
                });
                tokio::select! {
                    _ = tokio::time::sleep(HELD_WAIT) => {}
                    _ = self.slot.servers.cancelled() => {}
                }
                return Ok(());
            }
            Err(other) => return Err(other.into()),
        };
        let shown = self.firefox_frames(&view, endpoint, last_viewer_seen).await;
        *self.page.lock().expect("page lock") = None;
        view.end().await;
        shown
    }

    async fn firefox_frames(
        &self,
        view: &Arc<FirefoxView>,
        endpoint: &CdpEndpoint,
        last_viewer_seen: &mut tokio::time::Instant,
    ) -> Result<(), ScreencastError> {
        let mut context = self.firefox_show(view).await?;
        let mut tabs_read = tokio::time::Instant::now();
        let mut tick = tokio::time::interval(FRAME_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last: Option<Bytes> = None;
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = self.switch.notified() => {
                    context = self.firefox_show(view).await?;
                    continue;
                }
                _ = self.slot.servers.cancelled() => return Ok(()),
            }
            if view.is_own() && endpoint.session_turns.claimed() {
                return Ok(());
            }
            if self.viewers.load(Ordering::SeqCst) == 0 {
                if last_viewer_seen.elapsed() > Duration::from_secs(5) {
                    return Ok(());
                }
                continue;
            }
            *last_viewer_seen = tokio::time::Instant::now();
            if tabs_read.elapsed() >= TABS_EVERY {
                context = self.firefox_show(view).await?;
                tabs_read = tokio::time::Instant::now();
            }
            let jpeg = Bytes::from(view.frame(&context, self.settings.quality).await?);
            if last.as_ref() != Some(&jpeg) {
                last = Some(jpeg.clone());
                let seq = self.frames_received.fetch_add(1, Ordering::Relaxed) + 1;
                self.frames.send_replace(Some(Frame { seq, jpeg }));
            }
        }
    }

    /// Reads the tabs, shows the one asked for (or the first) with its
    /// viewport, and tells the viewers; its BiDi context.
    async fn firefox_show(&self, view: &Arc<FirefoxView>) -> Result<String, ScreencastError> {
        let tabs = view.tabs().await?;
        let wanted = self.shared.borrow().wanted_tab.clone();
        let chosen = tabs
            .iter()
            .find(|tab| Some(&tab.tab.id) == wanted.as_ref())
            .or(tabs.first())
            .cloned()
            .ok_or(ScreencastError::NoTab)?;
        let viewport = view.viewport(&chosen.context).await?;
        let link = PageLink::Firefox {
            view: view.clone(),
            context: chosen.context.clone(),
        };
        let listed = tabs.into_iter().map(|tab| tab.tab).collect();
        self.show(link, chosen.tab.id, listed);
        if let Some(viewport) = viewport {
            self.frame_size(viewport);
        }
        Ok(chosen.context)
    }
}
