//! The live view of a Firefox ([`crate::engine::firefox_view`]): Firefox
//! has no screencast, so frames are JPEG screenshots of the tab shown,
//! taken up to [`FRAMES_PER_SECOND`] times a second while viewers watch,
//! and never more than three quarters of the time (a capture that takes
//! long spaces the next one a third as long); a frame the same as the last
//! is not sent again. The
//! tabs and the viewport are read again every [`TABS_EVERY`].
//!
//! The view rides on a WebDriver client's session when there is one (a
//! `bidi` door client's too, through its relay), else holds a session of
//! its own, which it ends as soon as a client or the agent's own work
//! claims the browser's only session (mid-capture if need be). While the
//! agent's own work holds it (a park), no frame comes and viewers' `state`
//! says why ([`HELD`]).

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
/// What viewers are told while someone else holds Firefox's only session.
pub const HELD: &str = "Firefox's only WebDriver session is taken (by the node's own work such as a park, or by a WebDriver BiDi client that has not started its session yet): the view comes back once it is free";
/// What viewers are told when a WebDriver session's BiDi socket does not
/// answer (its driver went away).
const UNANSWERED: &str = "the WebDriver session's BiDi socket did not answer: the view comes back with the session's next command, or once it ended";

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
            Err(error) => {
                let notice = match error {
                    BidiError::SessionHeld => HELD,
                    _ if socket.is_some() => UNANSWERED,
                    other => return Err(other.into()),
                };
                self.shared.send_if_modified(|shared| {
                    let changed = shared.notice != Some(notice);
                    shared.notice = Some(notice);
                    changed
                });
                tokio::select! {
                    _ = tokio::time::sleep(HELD_WAIT) => {}
                    _ = endpoint.session_turns.changed() => {}
                    _ = self.slot.servers.cancelled() => {}
                }
                return Ok(());
            }
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
        let turns = &endpoint.session_turns;
        let mut context = self.firefox_show(view).await?;
        let mut tabs_read = tokio::time::Instant::now();
        let mut next = tokio::time::Instant::now();
        let mut last: Option<Bytes> = None;
        loop {
            let switched = tokio::select! {
                _ = tokio::time::sleep_until(next) => false,
                _ = self.switch.notified() => true,
                _ = turns.changed(), if view.is_own() => false,
                _ = self.slot.servers.cancelled() => return Ok(()),
            };
            if view.is_own() && turns.claimed() {
                return Ok(());
            }
            if switched {
                context = self.firefox_show(view).await?;
                continue;
            }
            let started = tokio::time::Instant::now();
            next = started + FRAME_INTERVAL;
            if self.viewers.load(Ordering::SeqCst) == 0 {
                if last_viewer_seen.elapsed() > Duration::from_secs(5) {
                    return Ok(());
                }
                continue;
            }
            *last_viewer_seen = started;
            if tabs_read.elapsed() >= TABS_EVERY {
                context = self.firefox_show(view).await?;
                tabs_read = tokio::time::Instant::now();
            }
            // A claim that came while the tabs were read.
            if view.is_own() && turns.claimed() {
                return Ok(());
            }
            let capture = view.frame(&context, self.settings.quality);
            let jpeg = tokio::select! {
                jpeg = capture => Bytes::from(jpeg?),
                // Claimed mid-capture: let go now.
                _ = turns.changed(), if view.is_own() => return Ok(()),
            };
            // Captures take at most three quarters of the time.
            next = next.max(tokio::time::Instant::now() + started.elapsed() / 3);
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
        let chosen = self
            .wanted_or_first(&tabs, |tab| &tab.tab.id)
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
