//! Driving a browser through its live view: what a viewer on the stream's
//! WebSocket (`GET /ws` on `stream_port`) may send, who may send it, and how
//! it reaches the page.
//!
//! - **Messages** ([`ViewerMessage`], JSON text frames): take or release
//!   control, mouse (move, down, up, wheel; buttons, click count, modifiers),
//!   keys (down, up, with `key`, `code`, key code and text), text input,
//!   viewport resize, and the tab to show. Coordinates are fractions of the
//!   frame (0 to 1 from its left and top edges), so they land on the same
//!   spot whatever size the viewer shows the frame at.
//! - **Control** is exclusive: one viewer at a time holds it (the first that
//!   asks while nobody does); it is free again when that viewer releases it or
//!   leaves. Any viewer the stream port admitted (an API key, the instance's
//!   own token, or authentication off) may take it, unless it connected with
//!   `?mode=view`, as the front door always does for a `view` live link.
//!   Input from a viewer that does not hold control is refused with an
//!   `error` message; nothing reaches the browser.
//! - **Dispatch**: as the engine takes input (`engine::input`), on the tab
//!   being shown, over the screencast's own connection. Input counts as
//!   activity.
//!
//! The server sends, besides the binary JPEG frames, `state` messages
//! ([`ViewerState`]): whether control is this viewer's, free, taken by
//! someone else, or out of its reach; the open tabs and the one shown; the
//! frame's size in CSS pixels.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::engine::bidi::BidiError;
use crate::engine::cdp::{CdpClient, CdpError};
use crate::engine::firefox_view::FirefoxView;
pub use crate::engine::input::{
    Input, KeyEvent, KeyInput, MouseButton, MouseEvent, MouseInput, Viewport,
};
use crate::engine::page::Tab;

/// Largest text frame a viewer may send (bytes); larger closes the socket.
pub const MAX_MESSAGE_BYTES: usize = 8 * 1024;
/// Most characters one `text` message may insert.
const MAX_TEXT_CHARS: usize = 2000;
/// Viewport sizes a `resize` may ask for, in CSS pixels.
const VIEWPORT_RANGE: std::ops::RangeInclusive<u32> = 100..=4096;
const INPUT_TIMEOUT: Duration = Duration::from_secs(5);

/// What a viewer sends.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum ViewerMessage {
    /// Take (`true`) or release (`false`) control.
    Control {
        take: bool,
    },
    Mouse(MouseInput),
    Key(KeyInput),
    /// Text typed at once (an IME commit, a paste).
    Text {
        text: String,
    },
    /// The viewport the page lays out in, in CSS pixels.
    Resize {
        width: u32,
        height: u32,
    },
    /// Show another tab (an id from `state.tabs`).
    Tab {
        id: String,
    },
}

/// Whether a viewer holds control, from its own point of view.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ControlState {
    /// This viewer holds it: its input reaches the page.
    Yours,
    /// Nobody holds it: this viewer may take it.
    Free,
    /// Another viewer holds it.
    Taken,
    /// This viewer may only watch (a view link, or `?mode=view`).
    ViewOnly,
}

/// What the server tells a viewer (a `state` text message).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ViewerState {
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub control: ControlState,
    pub tabs: Vec<Tab>,
    /// The tab being shown.
    pub tab: Option<String>,
    /// The frame's size in CSS pixels (what fractions are taken of).
    pub viewport: Option<Viewport>,
    /// Why no frames come, when the browser cannot be shown (a Firefox
    /// whose only session a BiDi client holds).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub notice: Option<&'static str>,
}

/// An `error` message: why a viewer's message did nothing.
pub fn error_message(detail: &str) -> String {
    json!({"type": "error", "detail": detail}).to_string()
}

/// A viewer's message that is not one, or out of its bounds.
#[derive(Debug, thiserror::Error)]
pub enum InvalidMessage {
    #[error("not a viewer message: {0}")]
    NotJson(#[source] serde_json::Error),
    /// A binary frame: viewers send JSON text frames.
    #[error("viewer messages are JSON text frames")]
    NotText,
    #[error("x and y are fractions of the frame, from 0 to 1")]
    Position,
    #[error("delta_x and delta_y are finite pixel counts")]
    WheelDelta,
    #[error("key and code are DOM key names; text is what one key types")]
    Key,
    #[error("text inserts at most {max} characters at once")]
    TextTooLong { max: usize },
    #[error("width and height are CSS pixels from {min} to {max}")]
    Size { min: u32, max: u32 },
    #[error("id is a tab id from state.tabs")]
    TabId,
}

/// Why a viewer's message did nothing: the `detail` of the `error` message
/// it is answered with.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error(transparent)]
    Invalid(#[from] InvalidMessage),
    /// A view link, or `?mode=view`.
    #[error("this viewer may only watch")]
    ViewOnly,
    /// A take while another viewer holds control.
    #[error("someone else has control; wait until they release it")]
    Taken,
    /// Input or a tab switch while another viewer holds control.
    #[error("someone else has control")]
    HeldByAnother,
    #[error("take control first: {{\"type\":\"control\",\"take\":true}}")]
    NotHeld,
    #[error("no tab {id:?}; state.tabs lists them")]
    UnknownTab { id: String },
    #[error("the browser is not showing a page yet")]
    NoPage,
    #[error("the browser did not take the input: {0}")]
    NotTaken(#[source] CdpError),
    #[error("the browser did not take the input: {0}")]
    NotTakenByFirefox(#[source] BidiError),
}

/// Reads a viewer's text frame.
pub fn parse(text: &str) -> Result<ViewerMessage, InvalidMessage> {
    let message: ViewerMessage = serde_json::from_str(text).map_err(InvalidMessage::NotJson)?;
    check(&message)?;
    Ok(message)
}

/// Bounds serde cannot express.
fn check(message: &ViewerMessage) -> Result<(), InvalidMessage> {
    let fraction = |v: f64| v.is_finite() && (0.0..=1.0).contains(&v);
    let delta = |v: f64| v.is_finite() && v.abs() <= 100_000.0;
    let short = |s: &str| s.len() <= 32 && !s.chars().any(char::is_control);
    match message {
        ViewerMessage::Mouse(m) if !fraction(m.x) || !fraction(m.y) => {
            Err(InvalidMessage::Position)
        }
        ViewerMessage::Mouse(m) if !delta(m.delta_x) || !delta(m.delta_y) => {
            Err(InvalidMessage::WheelDelta)
        }
        ViewerMessage::Key(k)
            if !short(&k.key) || !short(&k.code) || k.text.chars().count() > 4 =>
        {
            Err(InvalidMessage::Key)
        }
        ViewerMessage::Text { text } if text.chars().count() > MAX_TEXT_CHARS => {
            Err(InvalidMessage::TextTooLong {
                max: MAX_TEXT_CHARS,
            })
        }
        ViewerMessage::Resize { width, height }
            if !VIEWPORT_RANGE.contains(width) || !VIEWPORT_RANGE.contains(height) =>
        {
            Err(InvalidMessage::Size {
                min: *VIEWPORT_RANGE.start(),
                max: *VIEWPORT_RANGE.end(),
            })
        }
        ViewerMessage::Tab { id } if id.is_empty() || id.len() > 64 => Err(InvalidMessage::TabId),
        _ => Ok(()),
    }
}

/// Sends an input message to the page over its connection (other messages
/// are not input: nothing is sent).
pub async fn dispatch(
    client: &CdpClient,
    message: &ViewerMessage,
    viewport: Viewport,
) -> Result<(), ControlError> {
    let Some(input) = input_of(message) else {
        return Ok(());
    };
    crate::engine::input::dispatch(client, input, viewport, INPUT_TIMEOUT)
        .await
        .map_err(ControlError::NotTaken)
}

/// Sends an input message to tab `context` of a Firefox over the live
/// view's connection (other messages are not input: nothing is sent).
pub async fn dispatch_to_firefox(
    view: &FirefoxView,
    context: &str,
    message: &ViewerMessage,
    viewport: Viewport,
) -> Result<(), ControlError> {
    let Some(input) = input_of(message) else {
        return Ok(());
    };
    tokio::time::timeout(INPUT_TIMEOUT, view.input(context, input, viewport))
        .await
        .map_err(|_| ControlError::NotTakenByFirefox(BidiError::Timeout("input".into())))?
        .map_err(ControlError::NotTakenByFirefox)
}

/// The input a viewer's message carries, if it is input.
fn input_of(message: &ViewerMessage) -> Option<Input<'_>> {
    Some(match message {
        ViewerMessage::Mouse(mouse) => Input::Mouse(mouse),
        ViewerMessage::Key(key) => Input::Key(key),
        ViewerMessage::Text { text } => Input::Text(text),
        ViewerMessage::Resize { width, height } => Input::Resize {
            width: *width,
            height: *height,
        },
        ViewerMessage::Control { .. } | ViewerMessage::Tab { .. } => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostile_messages_are_refused_with_a_reason() {
        for (text, what) in [
            ("not json", "not a viewer message"),
            (r#"{"type":"shell","command":"id"}"#, "not a viewer message"),
            (
                r#"{"type":"mouse","event":"down","x":1.5,"y":0}"#,
                "fractions",
            ),
            (
                r#"{"type":"mouse","event":"down","x":-0.1,"y":0}"#,
                "fractions",
            ),
            (
                r#"{"type":"mouse","event":"wheel","x":0,"y":0,"delta_y":1e300}"#,
                "finite",
            ),
            (
                r#"{"type":"mouse","event":"down","x":0,"y":0,"extra":1}"#,
                "not a viewer message",
            ),
            (
                r#"{"type":"key","event":"down","key":"a\u0000b"}"#,
                "DOM key names",
            ),
            (
                r#"{"type":"key","event":"down","key":"a","text":"hello"}"#,
                "DOM key names",
            ),
            (r#"{"type":"resize","width":50,"height":600}"#, "CSS pixels"),
            (
                r#"{"type":"resize","width":-1,"height":600}"#,
                "not a viewer message",
            ),
            (r#"{"type":"tab","id":""}"#, "tab id"),
        ] {
            let error = parse(text).unwrap_err().to_string();
            assert!(error.contains(what), "{text}: {error}");
        }
        let long = format!(
            r#"{{"type":"text","text":"{}"}}"#,
            "x".repeat(MAX_TEXT_CHARS + 1)
        );
        assert!(parse(&long).unwrap_err().to_string().contains("at most"));
    }
}
