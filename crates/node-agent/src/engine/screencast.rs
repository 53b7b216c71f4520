//! The live view's frames, as Chromium gives them: a screencast of one page
//! over a connection to that page (`Page.startScreencast`), each frame
//! acknowledged as it comes, and a still of the page for a viewer that
//! would otherwise wait for the first paint.

use std::time::Duration;

use base64::Engine as _;
use serde_json::{Value, json};

use crate::engine::cdp::{CdpClient, CdpError, CdpEvent};

/// How each call of a screencast may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// The frames a screencast sends: JPEG `quality`, at most `width`×`height`.
#[derive(Debug, Clone, Copy)]
pub struct FrameSettings {
    pub quality: u8,
    pub width: u32,
    pub height: u32,
}

/// What an event of the page's connection is to the screencast.
#[derive(Debug)]
pub enum ScreencastEvent {
    /// A frame (already acknowledged): its JPEG when it decoded, and the
    /// page's metadata for it (its size and scroll).
    Frame {
        jpeg: Option<Vec<u8>>,
        metadata: Value,
    },
    /// The page is gone (`method` says how: detached, crashed).
    PageGone { method: String },
    /// Nothing the screencast needs.
    Other,
}

/// The screencast of the page `client` is connected to.
pub struct Screencast<'a> {
    client: &'a CdpClient,
}

impl<'a> Screencast<'a> {
    pub fn new(client: &'a CdpClient) -> Self {
        Self { client }
    }

    /// Starts sending frames.
    pub async fn start(&self, settings: FrameSettings) -> Result<(), CdpError> {
        let params = json!({
            "format": "jpeg",
            "quality": settings.quality,
            "maxWidth": settings.width,
            "maxHeight": settings.height,
            "everyNthFrame": 1,
        });
        self.client
            .call("Page.startScreencast", params, None, CALL_TIMEOUT)
            .await
            .map(drop)
    }

    /// Stops sending frames (the page may be gone already).
    pub async fn stop(&self) {
        let _ = self
            .client
            .call("Page.stopScreencast", json!({}), None, CALL_TIMEOUT)
            .await;
    }

    /// Reads `event`: a frame is acknowledged (so that the next comes).
    pub async fn read(&self, event: &CdpEvent) -> ScreencastEvent {
        match event.method.as_str() {
            "Page.screencastFrame" => {
                if let Some(session) = event.params.get("sessionId").cloned() {
                    let ack = json!({"sessionId": session});
                    let _ = self.client.send("Page.screencastFrameAck", ack).await;
                }
                let data = event.params["data"].as_str().unwrap_or_default();
                ScreencastEvent::Frame {
                    jpeg: base64::engine::general_purpose::STANDARD.decode(data).ok(),
                    metadata: event.params["metadata"].clone(),
                }
            }
            "Inspector.detached" | "Inspector.targetCrashed" => ScreencastEvent::PageGone {
                method: event.method.clone(),
            },
            _ => ScreencastEvent::Other,
        }
    }

    /// A JPEG still of the page at `quality`, within `timeout`.
    pub async fn still(&self, quality: u8, timeout: Duration) -> Option<Vec<u8>> {
        let shot = self
            .client
            .call(
                "Page.captureScreenshot",
                json!({ "format": "jpeg", "quality": quality }),
                None,
                timeout,
            )
            .await
            .ok()?;
        let data = shot.get("data")?.as_str()?;
        base64::engine::general_purpose::STANDARD.decode(data).ok()
    }
}
