//! Driving a real Chromium through its live view's WebSocket: a viewer takes
//! control, clicks a button and types into an input (keys, text, Ctrl+A) on a
//! test page, the page sees each event, and resizes the viewport; a
//! view-only viewer's input and a second controller are refused; new tabs
//! appear in the list and the shown tab can be switched. Live links open the
//! view without a key until they expire or are revoked.

use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;

use flotilla_testkit::{
    BROWSER_DEADLINE, Page, StatusCode, TestServe, serve_page, spawn_serve_with, wait_until,
};

const PAGE: &str = r#"<!doctype html><title>controls</title>
<style>body{margin:0}#b{position:absolute;left:100px;top:100px;width:200px;height:80px}
#i{position:absolute;left:100px;top:300px;width:300px;height:40px}</style>
<button id="b" onclick="window.clicks=(window.clicks||0)+1">press</button>
<input id="i">
<script>window.keys=[];addEventListener('keydown',e=>keys.push(e.key+(e.ctrlKey?'+ctrl':'')));</script>"#;

type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// A WebSocket viewer of the live view.
struct Viewer {
    socket: Socket,
    /// The last `state` message.
    state: Value,
    frames: usize,
}

impl Viewer {
    async fn connect(stream_url: &str, query: &str) -> Viewer {
        let url = format!("{}ws{query}", stream_url.replacen("http://", "ws://", 1));
        let (socket, _) = tokio_tungstenite::connect_async(&url).await.unwrap();
        Viewer {
            socket,
            state: Value::Null,
            frames: 0,
        }
    }

    async fn send(&mut self, message: Value) {
        self.socket
            .send(Message::Text(message.to_string().into()))
            .await
            .unwrap();
    }

    /// Reads until a text message satisfies `done` (states are kept).
    async fn until(&mut self, what: &str, done: impl Fn(&Value) -> bool) -> Value {
        let read = async {
            loop {
                match self.socket.next().await {
                    Some(Ok(Message::Binary(_))) => self.frames += 1,
                    Some(Ok(Message::Text(text))) => {
                        let message: Value = serde_json::from_str(&text).unwrap();
                        if message["type"] == "state" {
                            self.state = message.clone();
                        }
                        if done(&message) {
                            return message;
                        }
                    }
                    Some(Ok(_)) => {}
                    other => panic!("the live view closed while waiting for {what}: {other:?}"),
                }
            }
        };
        tokio::time::timeout(BROWSER_DEADLINE, read)
            .await
            .unwrap_or_else(|_| panic!("timed out waiting for {what}; last state {}", self.state))
    }

    /// Waits until the tab at `url` is listed, and shows it.
    async fn show(&mut self, url: &str) {
        let listed = self
            .until("the page's tab", |m| {
                m["type"] == "state"
                    && m["tabs"]
                        .as_array()
                        .is_some_and(|tabs| tabs.iter().any(|t| t["url"] == url))
            })
            .await;
        let tabs = listed["tabs"].as_array().unwrap();
        let tab = tabs.iter().find(|t| t["url"] == url).unwrap()["id"].clone();
        // Already shown: switching to the tab in view changes nothing, so
        // no new state would come.
        if listed["tab"] == tab && !listed["viewport"].is_null() {
            return;
        }
        self.send(json!({"type": "tab", "id": tab})).await;
        self.until("the page shown", |m| {
            m["type"] == "state" && m["tab"] == tab && !m["viewport"].is_null()
        })
        .await;
    }

    /// Reads until a frame comes: its JPEG.
    async fn next_frame(&mut self) -> Vec<u8> {
        let read = async {
            loop {
                match self.socket.next().await {
                    Some(Ok(Message::Binary(jpeg))) => {
                        self.frames += 1;
                        return jpeg.to_vec();
                    }
                    Some(Ok(Message::Text(text))) => {
                        let message: Value = serde_json::from_str(&text).unwrap();
                        if message["type"] == "state" {
                            self.state = message;
                        }
                    }
                    Some(Ok(_)) => {}
                    other => panic!("the live view closed while waiting for a frame: {other:?}"),
                }
            }
        };
        tokio::time::timeout(BROWSER_DEADLINE, read)
            .await
            .unwrap_or_else(|_| panic!("no frame came; last state {}", self.state))
    }

    async fn control_is(&mut self, control: &str) {
        self.until(&format!("control {control}"), |m| {
            m["type"] == "state" && m["control"] == control
        })
        .await;
    }

    async fn error(&mut self) -> String {
        let message = self.until("an error", |m| m["type"] == "error").await;
        message["detail"].as_str().unwrap().to_owned()
    }

    /// A left click at the centre of `rect` (CSS pixels), as fractions of the frame.
    async fn click(&mut self, rect: &Value) {
        let viewport = &self.state["viewport"];
        let x = (rect["x"].as_f64().unwrap() + rect["width"].as_f64().unwrap() / 2.0)
            / viewport["width"].as_f64().unwrap();
        let y = (rect["y"].as_f64().unwrap() + rect["height"].as_f64().unwrap() / 2.0)
            / viewport["height"].as_f64().unwrap();
        self.send(json!({"type": "mouse", "event": "move", "x": x, "y": y}))
            .await;
        for event in ["down", "up"] {
            let buttons = if event == "down" { 1 } else { 0 };
            self.send(json!({"type": "mouse", "event": event, "x": x, "y": y,
                "button": "left", "buttons": buttons, "click_count": 1}))
                .await;
        }
    }

    async fn key(&mut self, key: &str, code: &str, key_code: u16, modifiers: u8) {
        let text = if key.chars().count() == 1 { key } else { "" };
        for event in ["down", "up"] {
            self.send(
                json!({"type": "key", "event": event, "key": key, "code": code,
                "key_code": key_code, "text": text, "modifiers": modifiers}),
            )
            .await;
        }
    }
}

async fn eventually(page: &Page, expression: &str, expected: Value) {
    let deadline = tokio::time::Instant::now() + BROWSER_DEADLINE;
    loop {
        let value = page.eval(expression).await.unwrap();
        if value == expected {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{expression} is {value}, expected {expected}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn rect_of(page: &Page, selector: &str) -> Value {
    let json = page
        .eval(&format!(
            "JSON.stringify(document.querySelector('{selector}').getBoundingClientRect())"
        ))
        .await
        .unwrap();
    serde_json::from_str(json.as_str().unwrap()).unwrap()
}

async fn running(serve: &TestServe) -> Value {
    let (_, created, _) = serve.api.create_running("{}").await;
    created
}

#[tokio::test]
async fn browser_a_viewer_with_control_clicks_and_types_and_others_cannot() {
    let pages = serve_page(&[("/", PAGE)]).await;
    let serve = spawn_serve_with(|config| pages.allow_in(config)).await;
    let created = running(&serve).await;
    let stream = created["urls"]["stream"].as_str().unwrap();
    let page_url = format!("{}/", pages.base);
    let page = Page::open(created["urls"]["debug"].as_str().unwrap(), &page_url)
        .await
        .unwrap();

    // The page's tab is listed; show it.
    let mut viewer = Viewer::connect(stream, "").await;
    viewer.show(&page_url).await;
    assert_eq!(viewer.state["control"], "free", "{}", viewer.state);

    // Input before taking control does nothing.
    viewer.click(&rect_of(&page, "#b").await).await;
    assert!(viewer.error().await.contains("take control first"));
    viewer.send(json!({"type": "control", "take": true})).await;
    viewer.control_is("yours").await;

    // A click on the button, whatever size the frame is shown at.
    viewer.click(&rect_of(&page, "#b").await).await;
    eventually(&page, "window.clicks", json!(1)).await;

    // Typing: keys, text, then Ctrl+A and a key replace it all.
    viewer.click(&rect_of(&page, "#i").await).await;
    eventually(&page, "document.activeElement.id", json!("i")).await;
    viewer.key("h", "KeyH", 72, 0).await;
    viewer.key("i", "KeyI", 73, 0).await;
    viewer.send(json!({"type": "text", "text": " there"})).await;
    eventually(
        &page,
        "document.querySelector('#i').value",
        json!("hi there"),
    )
    .await;
    viewer.key("a", "KeyA", 65, 2).await;
    viewer.key("x", "KeyX", 88, 0).await;
    eventually(&page, "document.querySelector('#i').value", json!("x")).await;
    eventually(&page, "keys.join(' ')", json!("h i a+ctrl x")).await;
    assert!(viewer.frames > 0, "frames arrive on the same socket");

    // The viewport follows a resize, and so does the frame.
    viewer
        .send(json!({"type": "resize", "width": 800, "height": 600}))
        .await;
    eventually(&page, "innerWidth + 'x' + innerHeight", json!("800x600")).await;
    viewer
        .until("the frame resized", |m| {
            m["type"] == "state" && m["viewport"]["width"] == 800.0
        })
        .await;
    viewer.click(&rect_of(&page, "#b").await).await;
    eventually(&page, "window.clicks", json!(2)).await;

    // A view-only viewer watches but its input is refused.
    let mut watcher = Viewer::connect(stream, "?mode=view").await;
    watcher.control_is("view_only").await;
    watcher.send(json!({"type": "control", "take": true})).await;
    assert!(watcher.error().await.contains("may only watch"));
    watcher.state = viewer.state.clone();
    watcher.click(&rect_of(&page, "#b").await).await;
    assert!(watcher.error().await.contains("may only watch"));

    // A second viewer that may control sees it taken, and free once it is.
    let mut second = Viewer::connect(stream, "").await;
    second.control_is("taken").await;
    second.send(json!({"type": "control", "take": true})).await;
    assert!(second.error().await.contains("someone else has control"));
    second.state = viewer.state.clone();
    second.click(&rect_of(&page, "#b").await).await;
    assert!(second.error().await.contains("someone else has control"));
    assert_eq!(page.eval("window.clicks").await.unwrap(), json!(2));

    // A popup appears in the list.
    let before = viewer.state["tabs"].as_array().unwrap().len();
    page.eval("window.open('/?popup'), 1").await.unwrap();
    viewer
        .until("the popup listed", |m| {
            m["type"] == "state" && m["tabs"].as_array().is_some_and(|t| t.len() > before)
        })
        .await;

    // Hostile frames get an error, and the socket stays usable.
    viewer
        .send(json!({"type": "mouse", "event": "down", "x": 7, "y": 0}))
        .await;
    assert!(viewer.error().await.contains("fractions"));
    viewer
        .socket
        .send(Message::Text("{\"type\":".into()))
        .await
        .unwrap();
    assert!(viewer.error().await.contains("not a viewer message"));
    viewer
        .socket
        .send(Message::Binary(vec![0u8; 16].into()))
        .await
        .unwrap();
    assert!(viewer.error().await.contains("JSON text frames"));

    // Leaving gives control back.
    viewer.socket.close(None).await.unwrap();
    second.control_is("free").await;
    second.send(json!({"type": "control", "take": true})).await;
    second.control_is("yours").await;

    // An oversized message closes the socket.
    let huge = format!(
        "{{\"type\":\"text\",\"text\":\"{}\"}}",
        "x".repeat(64 * 1024)
    );
    let _ = second.socket.send(Message::Text(huge.into())).await;
    let closed = tokio::time::timeout(BROWSER_DEADLINE, async {
        loop {
            match second.socket.next().await {
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => return,
                Some(Ok(_)) => {}
            }
        }
    })
    .await;
    assert!(closed.is_ok(), "an oversized message ends the viewer");
    serve.shutdown().await;
}

const KEY: &str = "flt_live_links_key";

async fn no_key_get(url: &str) -> (u16, String) {
    let response = reqwest::get(url).await.unwrap();
    let status = response.status().as_u16();
    (status, response.text().await.unwrap())
}

async fn closes(viewer: &mut Viewer) {
    let closed = tokio::time::timeout(BROWSER_DEADLINE, async {
        loop {
            match viewer.socket.next().await {
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => return,
                Some(Ok(_)) => {}
            }
        }
    })
    .await;
    assert!(closed.is_ok(), "the viewer is cut off");
}

#[tokio::test]
async fn browser_live_links_show_the_view_without_a_key_until_they_expire_or_are_revoked() {
    let pages = serve_page(&[("/", PAGE)]).await;
    let serve = spawn_serve_with(|config| {
        pages.allow_in(config);
        config.control.auth_enabled = true;
        config.control.api_keys = vec![KEY.into()];
    })
    .await;
    let api = flotilla_testkit::Api::with_key(serve.api.base.clone(), KEY);
    let (id, created, _) = api.create_running("{}").await;
    let page_url = format!("{}/", pages.base);
    let page = Page::open(created["urls"]["debug"].as_str().unwrap(), &page_url)
        .await
        .unwrap();
    let live = format!("/v2/instances/{id}/live");

    // Links are made with a key only, and their bodies are checked.
    let (status, _) = serve.api.post(&live, "{}").await;
    assert_eq!(status.as_u16(), 401);
    for body in [
        r#"{"ttl_sec": 0}"#,
        r#"{"ttl_sec": 86401}"#,
        r#"{"mode": "admin"}"#,
        r#"{"mode": "view", "scope": "all"}"#,
    ] {
        let (status, answer) = api.post(&live, body).await;
        assert_eq!(status.as_u16(), 400, "{body}: {answer}");
    }

    // A view link: the page and its socket open without a key; input is refused.
    let (status, view) = api.post(&live, r#"{"mode": "view", "ttl_sec": 600}"#).await;
    assert_eq!(status.as_u16(), 201, "{view}");
    let view_url = view["url"].as_str().unwrap().to_owned();
    assert!(
        view_url.starts_with(&format!("{}/live/", serve.api.base)),
        "{view}"
    );
    let (status, html) = no_key_get(&view_url).await;
    assert_eq!(status, 200, "{html}");
    assert!(html.contains(r#"data-mode="view""#), "{html}");
    let response = reqwest::get(&view_url).await.unwrap();
    let policy = response.headers()["content-security-policy"]
        .to_str()
        .unwrap();
    assert!(policy.contains("frame-ancestors *"), "embeddable: {policy}");
    let mut watcher = Viewer::connect(&format!("{view_url}/"), "").await;
    watcher.control_is("view_only").await;
    watcher.send(json!({"type": "control", "take": true})).await;
    assert!(watcher.error().await.contains("may only watch"));
    // Asking the node for control through the link's own query does nothing.
    let mut sly = Viewer::connect(&format!("{view_url}/"), "?mode=control").await;
    sly.control_is("view_only").await;

    // The socket's path takes WebSocket upgrades only.
    assert_eq!(no_key_get(&format!("{view_url}/ws")).await.0, 426);

    // A tampered or made-up link is refused.
    for made_up in [
        "..%2f..%2fv2%2finstances",
        "00000000000000000000000000000000.AAAA",
        "x.y.z",
        "%00",
    ] {
        let url = format!("{}/live/{made_up}", serve.api.base);
        assert_eq!(no_key_get(&url).await.0, 404, "{made_up}");
    }
    let mut forged = view_url.clone();
    let last = forged.pop().unwrap();
    forged.push(if last == 'A' { 'B' } else { 'A' });
    assert_eq!(no_key_get(&forged).await.0, 404);
    assert!(
        tokio_tungstenite::connect_async(format!("{}/ws", forged.replacen("http", "ws", 1)))
            .await
            .is_err()
    );

    // A control link drives the browser.
    let (status, control) = api.post(&live, r#"{"mode": "control"}"#).await;
    assert_eq!(status.as_u16(), 201, "{control}");
    let control_url = control["url"].as_str().unwrap().to_owned();
    let mut driver = Viewer::connect(&format!("{control_url}/"), "").await;
    driver.show(&page_url).await;
    driver.send(json!({"type": "control", "take": true})).await;
    driver.control_is("yours").await;
    watcher.control_is("view_only").await;
    driver.click(&rect_of(&page, "#b").await).await;
    eventually(&page, "window.clicks", json!(1)).await;

    // Revoked: its viewers are cut off, and it opens nothing any more.
    let (status, answer) = api
        .delete(&format!("{live}/{}", control["id"].as_str().unwrap()))
        .await;
    assert_eq!(status.as_u16(), 200, "{answer}");
    closes(&mut driver).await;
    let (status, answer) = no_key_get(&control_url).await;
    assert_eq!(status, 404);
    assert!(answer.contains("revoked"), "{answer}");
    let (status, _) = api
        .delete(&format!("{live}/{}", control["id"].as_str().unwrap()))
        .await;
    assert_eq!(status.as_u16(), 404, "revoked already");

    // Expired: the same.
    let (status, brief) = api.post(&live, r#"{"ttl_sec": 1}"#).await;
    assert_eq!(status.as_u16(), 201, "{brief}");
    let brief_url = brief["url"].as_str().unwrap().to_owned();
    // (On a loaded machine the second may pass before the socket opens.)
    let socket_url = format!("{}/ws", brief_url.replacen("http", "ws", 1));
    if let Ok((socket, _)) = tokio_tungstenite::connect_async(&socket_url).await {
        let mut short = Viewer {
            socket,
            state: Value::Null,
            frames: 0,
        };
        closes(&mut short).await;
    }
    let (status, answer) = no_key_get(&brief_url).await;
    assert_eq!(status, 404);
    assert!(answer.contains("expired"), "{answer}");

    // Every link of the instance at once.
    let (status, answer) = api.delete(&live).await;
    assert_eq!(status.as_u16(), 200, "{answer}");
    closes(&mut watcher).await;
    assert_eq!(no_key_get(&view_url).await.0, 404);
    serve.shutdown().await;
}

/// A WebDriver session on an instance's own port (authentication off): it
/// is ended, and the instance goes on.
struct WebDriverSession {
    base: String,
    id: String,
}

impl WebDriverSession {
    async fn start(instance: &Value, capabilities: Value) -> (WebDriverSession, Value) {
        let port = instance["http_port"].as_u64().unwrap();
        let base = format!("http://127.0.0.1:{port}/webdriver/session");
        let body = json!({"capabilities": capabilities});
        let answer: Value = reqwest::Client::new()
            .post(&base)
            .json(&body)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let id = answer["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no session: {answer}"))
            .to_owned();
        (WebDriverSession { base, id }, answer["value"].clone())
    }

    async fn call(&self, method: reqwest::Method, rest: &str, body: Option<Value>) -> Value {
        let mut request =
            reqwest::Client::new().request(method, format!("{}/{}{rest}", self.base, self.id));
        if let Some(body) = body {
            request = request.json(&body);
        }
        let answer: Value = request.send().await.unwrap().json().await.unwrap();
        answer["value"].clone()
    }

    async fn script(&self, script: &str) -> Value {
        let body = json!({"script": script, "args": []});
        self.call(reqwest::Method::POST, "/execute/sync", Some(body))
            .await
    }

    async fn eventually(&self, script: &str, expected: Value) {
        let deadline = tokio::time::Instant::now() + BROWSER_DEADLINE;
        loop {
            let value = self.script(script).await;
            if value == expected {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{script} is {value}, expected {expected}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn rect_of(&self, selector: &str) -> Value {
        let script = format!(
            "return JSON.stringify(document.querySelector('{selector}').getBoundingClientRect())"
        );
        serde_json::from_str(self.script(&script).await.as_str().unwrap()).unwrap()
    }

    async fn delete(self) {
        reqwest::Client::new()
            .delete(format!("{}/{}", self.base, self.id))
            .send()
            .await
            .unwrap();
    }
}

/// Types `text` into the viewer's page, which then holds `expected`.
async fn typed_into(viewer: &mut Viewer, session: &WebDriverSession, text: &str, expected: &str) {
    viewer.send(json!({"type": "text", "text": text})).await;
    session
        .eventually("return document.getElementById('i').value", json!(expected))
        .await;
}

#[tokio::test]
async fn browser_a_firefox_live_view_shows_it_takes_input_and_yields_to_its_clients() {
    let pages = serve_page(&[("/", PAGE)]).await;
    let serve = spawn_serve_with(|config| pages.allow_in(config)).await;
    let body = r#"{"image": "firefox", "config": {"record": true}}"#;
    let (id, created, _) = serve.api.create_running(body).await;
    let stream = created["urls"]["stream"].as_str().unwrap();
    let page_url = format!("{}/", pages.base);

    // A WebDriver session opens the page; the live view rides on it (the
    // client did not ask for BiDi, and is not told of the socket). On the
    // instance's own port, as the door passes sessions on.
    let always = json!({"browserName": "firefox"});
    let (session, answer) = WebDriverSession::start(&created, always.clone()).await;
    assert!(
        answer["capabilities"].get("webSocketUrl").is_none(),
        "{answer}"
    );
    let open = json!({"url": page_url});
    let navigated = session
        .call(reqwest::Method::POST, "/url", Some(open.clone()))
        .await;
    assert!(navigated.is_null(), "{navigated}");
    let at = session.call(reqwest::Method::GET, "/url", None).await;
    assert_eq!(at, json!(page_url));
    let mut viewer = Viewer::connect(stream, "").await;
    viewer.show(&page_url).await;
    clicks_and_types(&mut viewer, &session).await;

    // Without a client, the view holds a session of its own: input goes
    // on, and a client's session (which claims the browser's only one)
    // finds it let go.
    session.delete().await;
    own_session_takes(&mut viewer, "d").await;
    let (session, _) = WebDriverSession::start(&created, always).await;
    session
        .eventually("return document.getElementById('i').value", json!("abd"))
        .await;
    session.delete().await;

    // A BiDi client gets the session too; the view rides on it, through
    // the client's connection, without the client seeing any of it.
    bidi_client_is_shown_too(&mut viewer, created["urls"]["bidi"].as_str().unwrap()).await;

    // A park while the view holds its own session (once the client's
    // has ended: 409 until then): the park's state read gets it.
    wait_until(BROWSER_DEADLINE, "a park once the client left", || async {
        let (status, body) = serve
            .api
            .post(&format!("/v2/instances/{id}/dormant"), "")
            .await;
        match status {
            StatusCode::OK => Ok(Some(())),
            StatusCode::CONFLICT => Err(format!("{status} {body}")),
            other => panic!("a park answered {other} {body}"),
        }
    })
    .await
    .unwrap();
    serve
        .api
        .wait_for_status(&id, "dormant", BROWSER_DEADLINE)
        .await;
    let (_, recordings) = serve
        .api
        .get(&format!("/v2/instances/{id}/recordings"))
        .await;
    let recorded = recordings["recordings"][0]["duration_sec"]
        .as_f64()
        .unwrap_or(0.0);
    assert!(recorded > 0.0, "Firefox recorded: {recordings}");
    drop(viewer);
    serve.shutdown().await;
}

/// Takes control, clicks the button and types into the input of the page
/// `session` shows; a frame comes.
async fn clicks_and_types(viewer: &mut Viewer, session: &WebDriverSession) {
    viewer.send(json!({"type": "control", "take": true})).await;
    viewer.control_is("yours").await;
    viewer.click(&session.rect_of("#b").await).await;
    session.eventually("return window.clicks", json!(1)).await;
    viewer.click(&session.rect_of("#i").await).await;
    session
        .eventually("return document.activeElement.id", json!("i"))
        .await;
    viewer.key("a", "KeyA", 65, 0).await;
    typed_into(viewer, session, "bc", "abc").await;
    viewer.key("Backspace", "Backspace", 8, 0).await;
    session
        .eventually("return document.getElementById('i').value", json!("ab"))
        .await;
    let jpeg = viewer.next_frame().await;
    assert!(jpeg.starts_with(&[0xff, 0xd8]), "a JPEG frame");
}

/// A BiDi client at `bidi` starts Firefox's only session (the view let go
/// of its own): the view goes on over the client's connection (a change
/// the client makes is a new frame), the client's own commands are
/// answered, and it never sees the view's answers.
async fn bidi_client_is_shown_too(viewer: &mut Viewer, bidi: &str) {
    let (mut client, _) = tokio_tungstenite::connect_async(bidi).await.unwrap();
    let mut call = async |id: u64, method: &str, params: Value| {
        let command = json!({"id": id, "method": method, "params": params});
        client
            .send(Message::Text(command.to_string().into()))
            .await
            .unwrap();
        let answered = tokio::time::timeout(BROWSER_DEADLINE, async {
            loop {
                if let Some(Ok(Message::Text(text))) = client.next().await {
                    let answer: Value = serde_json::from_str(&text).unwrap();
                    let seen = answer["id"].as_u64();
                    assert!(
                        seen.is_none_or(|seen| seen < 1 << 52),
                        "the node's answer reached the client: {answer}"
                    );
                    if seen == Some(id) {
                        return answer;
                    }
                }
            }
        })
        .await
        .expect("answered");
        assert_eq!(answered["type"], "success", "{answered}");
        answered["result"].clone()
    };
    call(1, "session.new", json!({"capabilities": {}})).await;
    let tree = call(2, "browsingContext.getTree", json!({"maxDepth": 0})).await;
    let context = tree["contexts"][0]["context"].clone();
    let paint = "document.body.style.background = 'rgb(0, 0, 255)'";
    let target = json!({"context": context});
    let painted = json!({"expression": paint, "target": target, "awaitPromise": false});
    call(3, "script.evaluate", painted).await;
    let blue = viewer.next_frame().await;
    assert!(blue.starts_with(&[0xff, 0xd8]), "a JPEG frame");
    assert!(viewer.state.get("notice").is_none(), "{}", viewer.state);
    // The client's session goes on, its answers its own.
    for id in 4..8 {
        let read = json!({"expression": "1 + 1", "target": target, "awaitPromise": false});
        let two = call(id, "script.evaluate", read).await;
        assert_eq!(two["result"]["value"], 2, "{two}");
    }
    drop(client);
}

/// Sends `text` as input until the live view takes it (it answers an error
/// while it moves to a session of its own).
async fn own_session_takes(viewer: &mut Viewer, text: &str) {
    // Answers to earlier messages (a key's release that reached the
    // session just ended: an error) are read first.
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        while let Some(Ok(_)) = viewer.socket.next().await {}
    })
    .await;
    let deadline = tokio::time::Instant::now() + BROWSER_DEADLINE;
    loop {
        viewer.send(json!({"type": "text", "text": text})).await;
        let refused = tokio::time::timeout(Duration::from_secs(3), async {
            loop {
                match viewer.socket.next().await {
                    Some(Ok(Message::Text(text))) => {
                        let message: Value = serde_json::from_str(&text).unwrap();
                        if message["type"] == "error" {
                            return message;
                        }
                    }
                    Some(Ok(_)) => {}
                    other => panic!("the live view closed: {other:?}"),
                }
            }
        })
        .await;
        let Ok(refused) = refused else {
            return;
        };
        assert!(
            tokio::time::Instant::now() < deadline,
            "input never taken: {refused}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}
