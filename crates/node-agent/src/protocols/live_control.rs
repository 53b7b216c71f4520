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
//! - **Dispatch**: CDP `Input.dispatchMouseEvent`, `Input.dispatchKeyEvent`,
//!   `Input.insertText` and `Emulation.setDeviceMetricsOverride` on the tab
//!   being shown, over the screencast's own connection. Input counts as
//!   activity.
//!
//! The server sends, besides the binary JPEG frames, `state` messages
//! ([`ViewerState`]): whether control is this viewer's, free, taken by
//! someone else, or out of its reach; the open tabs and the one shown; the
//! frame's size in CSS pixels.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::engine::cdp::{CdpClient, CdpError};
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

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MouseEvent {
    Move,
    Down,
    Up,
    Wheel,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MouseButton {
    #[default]
    None,
    Left,
    Middle,
    Right,
    Back,
    Forward,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MouseInput {
    pub event: MouseEvent,
    /// 0 (left edge of the frame) to 1 (right edge).
    pub x: f64,
    /// 0 (top edge of the frame) to 1 (bottom edge).
    pub y: f64,
    #[serde(default)]
    pub button: MouseButton,
    /// Buttons held, as DOM `MouseEvent.buttons`.
    #[serde(default)]
    pub buttons: u8,
    #[serde(default)]
    pub click_count: u8,
    /// Alt 1, Ctrl 2, Meta 4, Shift 8 (CDP's bits).
    #[serde(default)]
    pub modifiers: u8,
    /// Wheel deltas in CSS pixels.
    #[serde(default)]
    pub delta_x: f64,
    #[serde(default)]
    pub delta_y: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KeyEvent {
    Down,
    Up,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyInput {
    pub event: KeyEvent,
    /// DOM `KeyboardEvent.key` ("a", "Enter", "ArrowLeft").
    pub key: String,
    /// DOM `KeyboardEvent.code` ("KeyA", "Enter").
    #[serde(default)]
    pub code: String,
    /// Windows virtual key code (DOM `keyCode`).
    #[serde(default)]
    pub key_code: u16,
    /// What the key types, if anything.
    #[serde(default)]
    pub text: String,
    #[serde(default)]
    pub modifiers: u8,
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
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Viewport {
    pub width: f64,
    pub height: f64,
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

/// The CDP call that carries an input message to the page, if it is one.
pub fn cdp_call(message: &ViewerMessage, viewport: Viewport) -> Option<(&'static str, Value)> {
    match message {
        ViewerMessage::Mouse(mouse) => {
            Some(("Input.dispatchMouseEvent", mouse_params(mouse, viewport)))
        }
        ViewerMessage::Key(key) => Some(("Input.dispatchKeyEvent", key_params(key))),
        ViewerMessage::Text { text } => Some(("Input.insertText", json!({ "text": text }))),
        ViewerMessage::Resize { width, height } => Some((
            "Emulation.setDeviceMetricsOverride",
            json!({"width": width, "height": height, "deviceScaleFactor": 0, "mobile": false}),
        )),
        ViewerMessage::Control { .. } | ViewerMessage::Tab { .. } => None,
    }
}

fn mouse_params(mouse: &MouseInput, viewport: Viewport) -> Value {
    let kind = match mouse.event {
        MouseEvent::Move => "mouseMoved",
        MouseEvent::Down => "mousePressed",
        MouseEvent::Up => "mouseReleased",
        MouseEvent::Wheel => "mouseWheel",
    };
    let button = match mouse.button {
        MouseButton::None => "none",
        MouseButton::Left => "left",
        MouseButton::Middle => "middle",
        MouseButton::Right => "right",
        MouseButton::Back => "back",
        MouseButton::Forward => "forward",
    };
    let mut params = json!({
        "type": kind,
        "x": mouse.x * viewport.width,
        "y": mouse.y * viewport.height,
        "button": button,
        "buttons": mouse.buttons,
        "modifiers": mouse.modifiers & 0x0f,
        "clickCount": mouse.click_count,
    });
    if mouse.event == MouseEvent::Wheel {
        params["deltaX"] = json!(mouse.delta_x);
        params["deltaY"] = json!(mouse.delta_y);
    }
    params
}

fn key_params(key: &KeyInput) -> Value {
    // A key that types (and no Ctrl, Alt or Meta with it) goes down as
    // `keyDown` with its text; shortcuts and keys that type nothing as
    // `rawKeyDown`, so that the page sees the shortcut, not a character.
    let modifiers = key.modifiers & 0x0f;
    let types = !key.text.is_empty() && modifiers & 0b0111 == 0;
    let kind = match key.event {
        KeyEvent::Down if types => "keyDown",
        KeyEvent::Down => "rawKeyDown",
        KeyEvent::Up => "keyUp",
    };
    let mut params = json!({
        "type": kind,
        "key": key.key,
        "code": key.code,
        "windowsVirtualKeyCode": key.key_code,
        "nativeVirtualKeyCode": key.key_code,
        "modifiers": modifiers,
    });
    if types && key.event == KeyEvent::Down {
        params["text"] = json!(key.text);
        params["unmodifiedText"] = json!(key.text);
    }
    params
}

/// Sends an input message's CDP call over the page connection.
pub async fn dispatch(
    client: &CdpClient,
    message: &ViewerMessage,
    viewport: Viewport,
) -> Result<(), ControlError> {
    let Some((method, params)) = cdp_call(message, viewport) else {
        return Ok(());
    };
    client
        .call(method, params, None, INPUT_TIMEOUT)
        .await
        .map(|_| ())
        .map_err(ControlError::NotTaken)
}

#[cfg(test)]
mod tests {
    use super::*;

    const VIEWPORT: Viewport = Viewport {
        width: 1280.0,
        height: 720.0,
    };

    #[test]
    fn mouse_fractions_land_on_css_pixels_whatever_the_viewer_size() {
        let message =
            parse(r#"{"type":"mouse","event":"down","x":0.5,"y":0.25,"button":"left","buttons":1,"click_count":1}"#)
                .unwrap();
        let (method, params) = cdp_call(&message, VIEWPORT).unwrap();
        assert_eq!(method, "Input.dispatchMouseEvent");
        assert_eq!(params["type"], "mousePressed");
        assert_eq!(params["x"], 640.0);
        assert_eq!(params["y"], 180.0);
        assert_eq!(params["button"], "left");
        assert_eq!(params["clickCount"], 1);
        let wheel = parse(r#"{"type":"mouse","event":"wheel","x":0,"y":1,"delta_y":120}"#).unwrap();
        let (_, params) = cdp_call(&wheel, VIEWPORT).unwrap();
        assert_eq!(
            (params["type"].as_str(), params["deltaY"].as_f64()),
            (Some("mouseWheel"), Some(120.0))
        );
    }

    #[test]
    fn typing_keys_carry_text_and_shortcuts_do_not() {
        let a = parse(
            r#"{"type":"key","event":"down","key":"a","code":"KeyA","key_code":65,"text":"a"}"#,
        )
        .unwrap();
        let (_, params) = cdp_call(&a, VIEWPORT).unwrap();
        assert_eq!(params["type"], "keyDown");
        assert_eq!(params["text"], "a");
        let ctrl_a = parse(
            r#"{"type":"key","event":"down","key":"a","code":"KeyA","key_code":65,"text":"a","modifiers":2}"#,
        )
        .unwrap();
        let (_, params) = cdp_call(&ctrl_a, VIEWPORT).unwrap();
        assert_eq!(params["type"], "rawKeyDown");
        assert_eq!(params["modifiers"], 2);
        assert!(params.get("text").is_none());
        let up = parse(r#"{"type":"key","event":"up","key":"Enter","code":"Enter","key_code":13}"#)
            .unwrap();
        assert_eq!(cdp_call(&up, VIEWPORT).unwrap().1["type"], "keyUp");
    }

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
