//! Screenshots (`GET /screenshot` on an instance's HTTP port) at a bounded
//! cost to the node: a page larger than `agent.screenshot_max_pixels` (a huge
//! viewport, a high device scale) is captured scaled down to fit; a PNG over
//! `agent.screenshot_max_bytes` is refused while it arrives (the DevTools
//! connection of a capture may carry no more), never held whole; the node
//! captures at most `agent.max_concurrent_captures` at once and each
//! instance one at a time, so a token holder cannot grow the agent's memory
//! by asking for many at once.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use serde_json::{Value, json};
use tokio::sync::{Semaphore, SemaphorePermit};

use crate::config::AgentConfig;
use crate::engine::browser::CdpEndpoint;
use crate::engine::cdp::{CdpClient, CdpError};

/// How long a capture waits for its turn.
const QUEUE_WAIT: Duration = Duration::from_secs(10);
/// How long the browser may take to capture.
const CAPTURE_TIMEOUT: Duration = Duration::from_secs(20);

/// The node's capture limits, shared by its instances.
pub struct NodeCaptures {
    max_pixels: u64,
    max_bytes: u64,
    /// Captures in progress on the node; a tokio semaphore, awaited with a
    /// deadline.
    running: Semaphore,
}

impl NodeCaptures {
    pub fn new(config: &AgentConfig) -> Arc<Self> {
        Arc::new(Self {
            max_pixels: config.screenshot_max_pixels,
            max_bytes: config.screenshot_max_bytes,
            running: Semaphore::new(config.max_concurrent_captures),
        })
    }
}

/// One instance's captures: the node's limits and its own turn.
pub struct Captures {
    node: Arc<NodeCaptures>,
    /// One capture at a time per instance.
    turn: Semaphore,
}

/// Why a capture was not made.
#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    #[error(
        "{0} screenshots are being captured on this node (or one on this instance): retry shortly"
    )]
    Busy(usize),
    #[error(
        "the screenshot is larger than agent.screenshot_max_bytes ({0} bytes): shrink the page's viewport, or ask the operator to raise it"
    )]
    TooLarge(u64),
    #[error("the browser did not capture: {0}")]
    Browser(#[from] CdpError),
    #[error("the browser sent a bad screenshot: {0}")]
    BadData(String),
    /// Firefox's (over WebDriver BiDi).
    #[error("{0}")]
    Firefox(#[from] crate::engine::bidi::BidiError),
}

/// A PNG and the scale it was captured at (1 unless the page was too large).
pub struct Screenshot {
    pub png: Vec<u8>,
    pub scale: f64,
}

impl Captures {
    pub fn new(node: Arc<NodeCaptures>) -> Self {
        Self {
            node,
            turn: Semaphore::new(1),
        }
    }

    /// Captures the page at `path` (a `/devtools/page/…` path) of `endpoint`.
    pub async fn capture(
        &self,
        endpoint: &CdpEndpoint,
        path: &str,
    ) -> Result<Screenshot, CaptureError> {
        let _turns = self.wait_turn().await?;
        // A base64 PNG of max_bytes, in a JSON message.
        let max_message = (self.node.max_bytes as usize / 3 + 1) * 4 + 4096;
        let client = CdpClient::open_limited(endpoint, path, max_message).await?;
        let (clip, scale) = self.fitting_clip(&client).await?;
        let mut params = json!({"format": "png"});
        if let Some(clip) = clip {
            params["clip"] = clip;
        }
        let result = client
            .call("Page.captureScreenshot", params, None, CAPTURE_TIMEOUT)
            .await
            .map_err(|error| match error {
                CdpError::MessageTooLarge => CaptureError::TooLarge(self.node.max_bytes),
                other => CaptureError::Browser(other),
            })?;
        let data = result["data"].as_str().unwrap_or_default();
        let png = base64::engine::general_purpose::STANDARD
            .decode(data)
            .map_err(|e| CaptureError::BadData(e.to_string()))?;
        if png.len() as u64 > self.node.max_bytes {
            return Err(CaptureError::TooLarge(self.node.max_bytes));
        }
        Ok(Screenshot { png, scale })
    }

    /// A Firefox tab's viewport (its position, see
    /// [`crate::engine::firefox::screenshot`], which takes it on the session
    /// of the WebDriver client at `client_socket` if any; `None` when there
    /// is no such tab), within the node's limits: a turn of the node's and
    /// the instance's, and at most `agent.screenshot_max_bytes`.
    pub async fn capture_firefox(
        &self,
        endpoint: &CdpEndpoint,
        tab: Option<&str>,
        client_socket: Option<&str>,
    ) -> Result<Option<Screenshot>, CaptureError> {
        let _turns = self.wait_turn().await?;
        let shot = tokio::time::timeout(
            CAPTURE_TIMEOUT,
            crate::engine::firefox::screenshot(endpoint, tab, client_socket),
        )
        .await
        .map_err(|_| crate::engine::bidi::BidiError::Timeout("the screenshot".into()))??;
        let Some(png) = shot else {
            return Ok(None);
        };
        if png.len() as u64 > self.node.max_bytes {
            return Err(CaptureError::TooLarge(self.node.max_bytes));
        }
        Ok(Some(Screenshot { png, scale: 1.0 }))
    }

    /// This instance's turn and one of the node's, each waited for at most
    /// [`QUEUE_WAIT`].
    async fn wait_turn(&self) -> Result<(SemaphorePermit<'_>, SemaphorePermit<'_>), CaptureError> {
        let busy = || CaptureError::Busy(self.node.running.available_permits().max(1));
        let own = tokio::time::timeout(QUEUE_WAIT, self.turn.acquire())
            .await
            .map_err(|_| busy())?
            .map_err(|_| busy())?;
        let node = tokio::time::timeout(QUEUE_WAIT, self.node.running.acquire())
            .await
            .map_err(|_| busy())?
            .map_err(|_| busy())?;
        Ok((own, node))
    }

    /// The visible viewport as a clip scaled to fit the pixel cap, when the
    /// page at its device scale would exceed it.
    async fn fitting_clip(&self, client: &CdpClient) -> Result<(Option<Value>, f64), CaptureError> {
        let metrics = client
            .call("Page.getLayoutMetrics", json!({}), None, CAPTURE_TIMEOUT)
            .await?;
        let viewport = &metrics["cssVisualViewport"];
        let number = |value: &Value| value.as_f64().unwrap_or(0.0);
        let (width, height) = (
            number(&viewport["clientWidth"]),
            number(&viewport["clientHeight"]),
        );
        let ratio = client
            .call(
                "Runtime.evaluate",
                json!({"expression": "window.devicePixelRatio", "returnByValue": true}),
                None,
                CAPTURE_TIMEOUT,
            )
            .await?;
        let ratio = ratio["result"]["value"].as_f64().unwrap_or(1.0).max(0.01);
        // Unclipped, the image has the CSS size times the device scale.
        if fitting_scale(width * height * ratio * ratio, self.node.max_pixels) >= 1.0 {
            return Ok((None, 1.0));
        }
        // A clip's scale applies to CSS pixels (the device scale does not).
        let clip_scale = fitting_scale(width * height, self.node.max_pixels).min(ratio);
        let clip = json!({
            "x": number(&viewport["pageX"]),
            "y": number(&viewport["pageY"]),
            "width": width,
            "height": height,
            "scale": clip_scale,
        });
        Ok((Some(clip), clip_scale / ratio))
    }
}

/// The scale (at most 1) that brings `pixels` within `max_pixels`.
pub(crate) fn fitting_scale(pixels: f64, max_pixels: u64) -> f64 {
    if pixels <= max_pixels as f64 || pixels <= 0.0 {
        return 1.0;
    }
    // Scaling both sides by s scales the area by s², rounded down a little
    // so that rounding of the image's sides stays within the cap.
    (max_pixels as f64 / pixels).sqrt() * 0.999
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_over_the_pixel_cap_is_scaled_to_fit() {
        let max = 4096 * 4096;
        assert_eq!(fitting_scale(1280.0 * 720.0, max), 1.0);
        // 6000×6000 CSS pixels at device scale 2: 144 million pixels.
        let pixels = 6000.0 * 6000.0 * 4.0;
        let scale = fitting_scale(pixels, max);
        let side = (12_000.0 * scale).ceil();
        assert!(side * side <= max as f64, "{side}");
        assert!(side > 4000.0, "not much smaller than needed: {side}");
    }
}
