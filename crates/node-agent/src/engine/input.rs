//! Input to a page as Chromium takes it: a viewer's mouse, keys, text and
//! viewport size ([`Input`]; coordinates are fractions of the frame, turned
//! into the page's CSS pixels here), dispatched over a connection to the
//! page ([`dispatch`]).

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::engine::cdp::{CdpClient, CdpError};

/// One input to a page.
#[derive(Debug, Clone, Copy)]
pub enum Input<'a> {
    Mouse(&'a MouseInput),
    Key(&'a KeyInput),
    /// Text typed as one input.
    Text(&'a str),
    /// The page shown as on a screen of `width`×`height` CSS pixels.
    Resize {
        width: u32,
        height: u32,
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

#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Viewport {
    pub width: f64,
    pub height: f64,
}

/// Sends `input` to the page `client` is connected to, whose frame is
/// `viewport` CSS pixels, within `timeout`.
pub async fn dispatch(
    client: &CdpClient,
    input: Input<'_>,
    viewport: Viewport,
    timeout: Duration,
) -> Result<(), CdpError> {
    let (method, params) = call_of(input, viewport);
    client.call(method, params, None, timeout).await.map(drop)
}

/// The DevTools call that carries `input` to the page.
fn call_of(input: Input<'_>, viewport: Viewport) -> (&'static str, Value) {
    match input {
        Input::Mouse(mouse) => ("Input.dispatchMouseEvent", mouse_params(mouse, viewport)),
        Input::Key(key) => ("Input.dispatchKeyEvent", key_params(key)),
        Input::Text(text) => ("Input.insertText", json!({ "text": text })),
        Input::Resize { width, height } => (
            "Emulation.setDeviceMetricsOverride",
            json!({"width": width, "height": height, "deviceScaleFactor": 0, "mobile": false}),
        ),
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

#[cfg(test)]
mod tests {
    use super::*;

    const VIEWPORT: Viewport = Viewport {
        width: 1280.0,
        height: 720.0,
    };

    #[test]
    fn mouse_fractions_land_on_css_pixels_whatever_the_viewer_size() {
        let message: MouseInput = serde_json::from_str(
            r#"{"event":"down","x":0.5,"y":0.25,"button":"left","buttons":1,"click_count":1}"#,
        )
        .unwrap();
        let (method, params) = call_of(Input::Mouse(&message), VIEWPORT);
        assert_eq!(method, "Input.dispatchMouseEvent");
        assert_eq!(params["type"], "mousePressed");
        assert_eq!(params["x"], 640.0);
        assert_eq!(params["y"], 180.0);
        assert_eq!(params["button"], "left");
        assert_eq!(params["clickCount"], 1);
        let wheel: MouseInput =
            serde_json::from_str(r#"{"event":"wheel","x":0,"y":1,"delta_y":120}"#).unwrap();
        let (_, params) = call_of(Input::Mouse(&wheel), VIEWPORT);
        assert_eq!(
            (params["type"].as_str(), params["deltaY"].as_f64()),
            (Some("mouseWheel"), Some(120.0))
        );
    }

    #[test]
    fn typing_keys_carry_text_and_shortcuts_do_not() {
        let key = |text: &str| -> KeyInput { serde_json::from_str(text).unwrap() };
        let a = key(r#"{"event":"down","key":"a","code":"KeyA","key_code":65,"text":"a"}"#);
        let (_, params) = call_of(Input::Key(&a), VIEWPORT);
        assert_eq!(params["type"], "keyDown");
        assert_eq!(params["text"], "a");
        let ctrl_a = key(
            r#"{"event":"down","key":"a","code":"KeyA","key_code":65,"text":"a","modifiers":2}"#,
        );
        let (_, params) = call_of(Input::Key(&ctrl_a), VIEWPORT);
        assert_eq!(params["type"], "rawKeyDown");
        assert_eq!(params["modifiers"], 2);
        assert!(params.get("text").is_none());
        let up = key(r#"{"event":"up","key":"Enter","code":"Enter","key_code":13}"#);
        assert_eq!(call_of(Input::Key(&up), VIEWPORT).1["type"], "keyUp");
    }
}
