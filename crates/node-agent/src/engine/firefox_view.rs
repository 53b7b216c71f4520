//! The live view of a Firefox, over WebDriver BiDi: its tabs, a JPEG of the
//! tab shown (`browsingContext.captureScreenshot`, taken as often as the
//! live view asks: Firefox has no screencast), and a viewer's input as
//! `input.performActions` (trusted events, as a user's).
//!
//! Firefox holds one WebDriver session at a time, so the view rides on
//! whichever is there ([`FirefoxView::open`]): a WebDriver client's session
//! (geckodriver's, which takes a second BiDi connection), a `bidi` door
//! client's (bound to its one connection: the view's commands go through
//! its relay, [`crate::engine::bidi_tap`]), or a session of its own while
//! nobody claims one. While the agent's own work holds it (a park), no
//! view ([`BidiError::SessionHeld`]).

use std::time::Duration;

use serde_json::{Value, json};

use crate::engine::bidi::{BidiError, BidiSession};
use crate::engine::browser::CdpEndpoint;
use crate::engine::input::{Input, KeyEvent, MouseButton, MouseEvent, MouseInput, Viewport};
use crate::engine::page::Tab;

/// How long one of the view's commands may take: a page that hangs its
/// realm must not hold the view (nor, through it, the session) for long.
const VIEW_COMMAND_TIMEOUT: Duration = Duration::from_secs(5);
/// The most tabs the view lists (a page can open many).
const MAX_TABS: usize = 100;
/// The longest tab URL the view lists, in characters.
const MAX_URL_CHARS: usize = 2048;

/// The live view's connection to a Firefox.
pub struct FirefoxView {
    session: tokio::sync::Mutex<Option<BidiSession>>,
    /// Its own session (to be ended when someone claims the browser's), not
    /// a connection to a client's.
    own: bool,
}

/// A tab as the view knows it: its BiDi context, and as viewers see it (its
/// id is its position, as `/tabs` names it).
#[derive(Debug, Clone)]
pub struct ViewTab {
    pub context: String,
    pub tab: Tab,
}

impl FirefoxView {
    /// A view on the browser behind `endpoint`: attached to the WebDriver
    /// session whose BiDi socket is `client_socket`, else in a session of
    /// its own, else riding on a `bidi` door client's;
    /// [`BidiError::SessionHeld`] when the agent's own work holds the
    /// browser's only session (or a client connected without one).
    pub async fn open(
        endpoint: &CdpEndpoint,
        client_socket: Option<&str>,
    ) -> Result<Self, BidiError> {
        let (session, own) = match client_socket {
            Some(path) => (BidiSession::attach(endpoint, path).await?, false),
            None => match BidiSession::open_for_view(endpoint).await? {
                Some(session) => (session, true),
                None => match BidiSession::ride_a_client(endpoint).await {
                    Some(riding) => (riding, false),
                    None => return Err(BidiError::SessionHeld),
                },
            },
        };
        Ok(Self {
            session: tokio::sync::Mutex::new(Some(session)),
            own,
        })
    }

    /// Whether this is the view's own session (see [`BidiSession::open_for_view`]).
    pub fn is_own(&self) -> bool {
        self.own
    }

    async fn call(&self, method: &str, params: Value) -> Result<Value, BidiError> {
        let mut session = self.session.lock().await;
        let session = session.as_mut().ok_or(BidiError::Closed)?;
        tokio::time::timeout(VIEW_COMMAND_TIMEOUT, session.call(method, params))
            .await
            .map_err(|_| BidiError::Timeout(method.to_owned()))?
    }

    /// The browser's tabs, in order, ids by position (the first
    /// [`MAX_TABS`], URLs cut to [`MAX_URL_CHARS`]).
    pub async fn tabs(&self) -> Result<Vec<ViewTab>, BidiError> {
        let mut session = self.session.lock().await;
        let session = session.as_mut().ok_or(BidiError::Closed)?;
        let read = crate::engine::firefox::read_tabs(session);
        let tabs = tokio::time::timeout(VIEW_COMMAND_TIMEOUT, read)
            .await
            .map_err(|_| BidiError::Timeout("reading the tabs".into()))??;
        Ok(crate::engine::firefox::by_position(tabs)
            .into_iter()
            .take(MAX_TABS)
            .map(|(context, mut tab)| {
                if let Some((cut, _)) = tab.url.char_indices().nth(MAX_URL_CHARS) {
                    tab.url.truncate(cut);
                }
                ViewTab { context, tab }
            })
            .collect())
    }

    /// A JPEG of `context`'s viewport at `quality` (1 to 100).
    pub async fn frame(&self, context: &str, quality: u8) -> Result<Vec<u8>, BidiError> {
        let method = "browsingContext.captureScreenshot";
        let format =
            json!({"type": "image/jpeg", "quality": f64::from(quality.clamp(1, 100)) / 100.0});
        let params = json!({"context": context, "origin": "viewport", "format": format});
        let shot = self.call(method, params).await?;
        crate::engine::firefox::image_data(&shot, method)
    }

    /// `context`'s viewport in CSS pixels, read in a sandbox realm (the
    /// page's own getters do not run).
    pub async fn viewport(&self, context: &str) -> Result<Option<Viewport>, BidiError> {
        let target = crate::engine::firefox::sandboxed(&json!(context));
        let expression = "innerWidth + 'x' + innerHeight";
        let params = json!({"target": target, "expression": expression, "awaitPromise": false});
        let result = self.call("script.evaluate", params).await?;
        let size = result["result"]["value"].as_str().unwrap_or_default();
        let parsed = size
            .split_once('x')
            .and_then(|(w, h)| Some((w.parse::<f64>().ok()?, h.parse::<f64>().ok()?)));
        Ok(parsed
            .filter(|(width, height)| *width > 0.0 && *height > 0.0)
            .map(|(width, height)| Viewport { width, height }))
    }

    /// Sends a viewer's `input` to `context`, whose viewport is `viewport`.
    pub async fn input(
        &self,
        context: &str,
        input: Input<'_>,
        viewport: Viewport,
    ) -> Result<(), BidiError> {
        let Some((method, params)) = command_of(context, input, viewport) else {
            return Ok(());
        };
        self.call(method, params).await.map(drop)
    }

    /// Ends the view's own session, or closes its connection to a client's.
    pub async fn end(&self) {
        let session = self.session.lock().await.take();
        if let Some(session) = session {
            session.end().await;
        }
    }
}

/// The BiDi command that carries `input` to `context` (`None`: a key
/// Firefox has no WebDriver value for).
fn command_of(
    context: &str,
    input: Input<'_>,
    viewport: Viewport,
) -> Option<(&'static str, Value)> {
    let perform = |source: Value| json!({"context": context, "actions": [source]});
    match input {
        Input::Mouse(mouse) => Some(("input.performActions", perform(pointer(mouse, viewport)))),
        Input::Key(key) => {
            let value = key_value(&key.key)?;
            let kind = match key.event {
                KeyEvent::Down => "keyDown",
                KeyEvent::Up => "keyUp",
            };
            let actions = json!([{"type": kind, "value": value}]);
            Some(("input.performActions", perform(keys(actions))))
        }
        Input::Text(text) => {
            let actions: Vec<Value> = text
                .chars()
                .flat_map(|c| {
                    let value = c.to_string();
                    [
                        json!({"type": "keyDown", "value": value}),
                        json!({"type": "keyUp", "value": value}),
                    ]
                })
                .collect();
            Some(("input.performActions", perform(keys(json!(actions)))))
        }
        Input::Resize { width, height } => Some((
            "browsingContext.setViewport",
            json!({"context": context, "viewport": {"width": width, "height": height}}),
        )),
    }
}

fn keys(actions: Value) -> Value {
    json!({"type": "key", "id": "flotilla-live-keys", "actions": actions})
}

/// A viewer's mouse input as a BiDi pointer (or wheel) source, at whole CSS
/// pixels inside the viewport.
fn pointer(mouse: &MouseInput, viewport: Viewport) -> Value {
    let inside = |fraction: f64, size: f64| {
        (fraction * size).round().clamp(0.0, (size - 1.0).max(0.0)) as i64
    };
    let (x, y) = (
        inside(mouse.x, viewport.width),
        inside(mouse.y, viewport.height),
    );
    let button = match mouse.button {
        MouseButton::None | MouseButton::Left => 0,
        MouseButton::Middle => 1,
        MouseButton::Right => 2,
        MouseButton::Back => 3,
        MouseButton::Forward => 4,
    };
    let moved = json!({"type": "pointerMove", "x": x, "y": y});
    let actions = match mouse.event {
        MouseEvent::Move => json!([moved]),
        // A press of no button moves the pointer only.
        MouseEvent::Down | MouseEvent::Up if mouse.button == MouseButton::None => json!([moved]),
        MouseEvent::Down => json!([moved, {"type": "pointerDown", "button": button}]),
        MouseEvent::Up => json!([moved, {"type": "pointerUp", "button": button}]),
        MouseEvent::Wheel => {
            let scroll = json!({
                "type": "scroll", "x": x, "y": y,
                "deltaX": mouse.delta_x.round() as i64, "deltaY": mouse.delta_y.round() as i64,
            });
            return json!({"type": "wheel", "id": "flotilla-live-wheel", "actions": [scroll]});
        }
    };
    json!({
        "type": "pointer",
        "id": "flotilla-live-mouse",
        "parameters": {"pointerType": "mouse"},
        "actions": actions,
    })
}

/// WebDriver's value for the DOM key `key`: a character stands for itself
/// (but those of the private-use range WebDriver names its keys with), named
/// keys have WebDriver's code points.
pub(crate) fn key_value(key: &str) -> Option<String> {
    let mut chars = key.chars();
    if let (Some(c), None) = (chars.next(), chars.next()) {
        let private = ('\u{E000}'..='\u{F8FF}').contains(&c);
        return (!private).then(|| c.to_string());
    }
    let code = match key {
        "Cancel" => '\u{E001}',
        "Help" => '\u{E002}',
        "Backspace" => '\u{E003}',
        "Tab" => '\u{E004}',
        "Clear" => '\u{E005}',
        "Enter" => '\u{E007}',
        "Shift" => '\u{E008}',
        "Control" => '\u{E009}',
        "Alt" => '\u{E00A}',
        "Pause" => '\u{E00B}',
        "Escape" => '\u{E00C}',
        "PageUp" => '\u{E00E}',
        "PageDown" => '\u{E00F}',
        "End" => '\u{E010}',
        "Home" => '\u{E011}',
        "ArrowLeft" => '\u{E012}',
        "ArrowUp" => '\u{E013}',
        "ArrowRight" => '\u{E014}',
        "ArrowDown" => '\u{E015}',
        "Insert" => '\u{E016}',
        "Delete" => '\u{E017}',
        "Meta" => '\u{E03D}',
        function => {
            let number: u32 = function.strip_prefix('F')?.parse().ok()?;
            return (1..=12)
                .contains(&number)
                .then(|| char::from_u32(0xE031 + number - 1))
                .flatten()
                .map(String::from);
        }
    };
    Some(code.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::input::KeyInput;

    const VIEWPORT: Viewport = Viewport {
        width: 1280.0,
        height: 720.0,
    };

    #[test]
    fn a_click_lands_on_whole_css_pixels_inside_the_viewport() {
        let down: MouseInput = serde_json::from_str(
            r#"{"event":"down","x":0.5,"y":1,"button":"right","buttons":2,"click_count":1}"#,
        )
        .unwrap();
        let (method, params) = command_of("ctx", Input::Mouse(&down), VIEWPORT).unwrap();
        assert_eq!(method, "input.performActions");
        assert_eq!(params["context"], "ctx");
        let source = &params["actions"][0];
        assert_eq!(source["type"], "pointer");
        assert_eq!(
            source["actions"][0],
            json!({"type": "pointerMove", "x": 640, "y": 719})
        );
        assert_eq!(
            source["actions"][1],
            json!({"type": "pointerDown", "button": 2})
        );
        let wheel: MouseInput =
            serde_json::from_str(r#"{"event":"wheel","x":0,"y":0,"delta_y":120.4}"#).unwrap();
        let (_, params) = command_of("ctx", Input::Mouse(&wheel), VIEWPORT).unwrap();
        assert_eq!(params["actions"][0]["type"], "wheel");
        assert_eq!(params["actions"][0]["actions"][0]["deltaY"], 120);
    }

    #[test]
    fn keys_are_webdriver_values_and_text_is_typed_key_by_key() {
        let key = |text: &str| -> KeyInput { serde_json::from_str(text).unwrap() };
        let enter = key(r#"{"event":"down","key":"Enter","code":"Enter","key_code":13}"#);
        let (_, params) = command_of("c", Input::Key(&enter), VIEWPORT).unwrap();
        assert_eq!(params["actions"][0]["actions"][0]["value"], "\u{E007}");
        let a_up = key(r#"{"event":"up","key":"a","code":"KeyA"}"#);
        let (_, params) = command_of("c", Input::Key(&a_up), VIEWPORT).unwrap();
        assert_eq!(
            params["actions"][0]["actions"][0],
            json!({"type": "keyUp", "value": "a"})
        );
        assert_eq!(key_value("F12").as_deref(), Some("\u{E03C}"));
        assert_eq!(key_value("F13"), None);
        assert_eq!(key_value("Dead"), None);
        assert_eq!(key_value("\u{E008}"), None, "no private-use key sneaks in");
        let nothing: MouseInput =
            serde_json::from_str(r#"{"event":"down","x":0.1,"y":0.1}"#).unwrap();
        let (_, params) = command_of("c", Input::Mouse(&nothing), VIEWPORT).unwrap();
        assert_eq!(params["actions"][0]["actions"].as_array().unwrap().len(), 1);
        let (_, params) = command_of("c", Input::Text("hé"), VIEWPORT).unwrap();
        let typed = params["actions"][0]["actions"].as_array().unwrap();
        assert_eq!(typed.len(), 4);
        assert_eq!(typed[2], json!({"type": "keyDown", "value": "é"}));
        let (method, params) = command_of(
            "c",
            Input::Resize {
                width: 800,
                height: 600,
            },
            VIEWPORT,
        )
        .unwrap();
        assert_eq!(method, "browsingContext.setViewport");
        assert_eq!(params["viewport"], json!({"width": 800, "height": 600}));
    }
}
