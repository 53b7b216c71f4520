//! WebDriver with the clients users run, unchanged: Selenium 4 for Python
//! and for JavaScript against `/wd/hub` (the API key in the URL, as Selenium
//! carries it) and WebdriverIO 9 (BiDi by default); and the W3C wire itself
//! for what a client library hides: errors and ownership, the pins on raw
//! CDP and BiDi, Grid's file endpoints under hostile input, chromedriver's
//! confinement, and a session parked and revived by its next command.

use reqwest::Method;
use serde_json::{Value, json};

use flotilla_testkit::{
    Api, BROWSER_DEADLINE, PageServer, StatusCode, TestServe, browser_main_pid, browser_processes,
    run_node, run_python, spawn_serve_with_page, wait_until,
};

const KEY: &str = "webdriver-key-0123456789";
const OTHER_KEY: &str = "another-webdriver-key";

const FORM: &str = "<title>form</title><input id=name><select id=color><option value=red>red</option>\
<option value=blue>blue</option></select><button id=go onclick=\"document.getElementById('out').textContent=\
'Hello '+document.getElementById('name').value+' in '+document.getElementById('color').value\">go</button>\
<p id=out></p><iframe name=inner srcdoc='<p>in the frame</p>'></iframe><input type=file id=file>\
<a id=dl href='data:text/plain;base64,aGVsbG8gZnJvbSB0aGUgcGFnZQ==' download=hello.txt>download</a>";

async fn serve() -> (PageServer, TestServe) {
    let (site, mut serve) = spawn_serve_with_page(FORM, |config| {
        config.control.auth_enabled = true;
        config.control.api_keys = vec![KEY.into(), OTHER_KEY.into()];
    })
    .await;
    serve.api = Api::with_key(serve.api.base.clone(), KEY);
    (site, serve)
}

/// A W3C call with `key` (none: no credential): status and JSON.
async fn w3c(
    serve: &TestServe,
    key: Option<&str>,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> (StatusCode, Value) {
    let mut request = reqwest::Client::new().request(method, format!("{}{path}", serve.api.base));
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.unwrap();
    let status = response.status();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// The processes of instance `id` of `serve` (pid, name): the testkit's
/// [`browser_processes`] (its sandboxes and all below them), named.
fn processes_of(serve: &TestServe, id: &str) -> Vec<(u32, String)> {
    browser_processes(&serve.instances_dir().join(id))
        .into_iter()
        .map(|pid| {
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            (pid, comm.trim().to_owned())
        })
        .collect()
}

/// One fact of process `pid`: a namespace link, its cgroups, or its uid.
fn process_fact(pid: u32, fact: &str) -> String {
    match fact {
        "status_uid" => std::fs::read_to_string(format!("/proc/{pid}/status"))
            .unwrap_or_default()
            .lines()
            .find(|l| l.starts_with("Uid:"))
            .unwrap_or_default()
            .to_owned(),
        "ns/net" => std::fs::read_link(format!("/proc/{pid}/ns/net"))
            .map(|l| l.display().to_string())
            .unwrap_or_default(),
        other => std::fs::read_to_string(format!("/proc/{pid}/{other}")).unwrap_or_default(),
    }
}

fn w3c_error(answer: &(StatusCode, Value)) -> &str {
    answer.1["value"]["error"].as_str().unwrap_or("")
}

#[tokio::test]
async fn browser_selenium_for_python_drives_an_instance_through_wd_hub() {
    let (site, serve) = serve().await;
    let port = serve.api.base.rsplit(':').next().unwrap().to_owned();
    let remote = format!("http://flotilla:{KEY}@127.0.0.1:{port}/wd/hub");
    // Two sessions at once: classic WebDriver, and one with BiDi.
    let classic = [remote.as_str(), site.base.as_str(), "classic"];
    let bidi = [remote.as_str(), site.base.as_str(), "bidi"];
    let (first, second) = tokio::join!(
        run_python("selenium_suite.py", &classic),
        run_python("selenium_suite.py", &bidi),
    );
    for (seen, bidi) in [(first.unwrap(), false), (second.unwrap(), true)] {
        assert_suite(&seen, bidi);
        if !bidi {
            assert_eq!(seen["alert"], "attention", "{seen}");
            // goog:chromeOptions.prefs: the browser started with them (and
            // the download above still reached the instance's downloads).
            assert_eq!(seen["languages"], json!(["fr-FR", "fr"]), "{seen}");
        } else {
            assert_ne!(seen["languages"], json!(["fr-FR", "fr"]), "{seen}");
        }
        assert_eq!(seen["async_script"], "later", "{seen}");
        assert_eq!(seen["other_title"], "form", "{seen}");
        assert_eq!(seen["initial_size"]["width"], 1024, "{seen}");
        assert_eq!(seen["cdp"], 3, "{seen}");
        assert_eq!(seen["after_delete"], json!([]), "{seen}");
        let caps = &seen["capabilities"];
        assert_eq!(caps["browserName"], "chrome", "{caps}");
        assert!(
            caps["se:cdp"].as_str().unwrap().contains("/se/cdp?token="),
            "{caps}"
        );
        assert!(
            caps["goog:chromeOptions"].get("debuggerAddress").is_none(),
            "{caps}"
        );
        assert_eq!(caps["se:downloadsEnabled"], true, "{caps}");
        if bidi {
            assert!(
                caps["webSocketUrl"]
                    .as_str()
                    .unwrap()
                    .contains("/webdriver/bidi?token="),
                "{caps}"
            );
        } else {
            assert!(caps.get("webSocketUrl").is_none(), "{caps}");
        }
        // The session was an instance; quitting deleted it.
        let id = seen["session"].as_str().unwrap();
        let (status, _) = serve.api.get(&format!("/v2/instances/{id}")).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "quit deletes the instance");
    }
    serve.shutdown().await;
}

/// What every suite must have seen, whatever its client.
/// `bidi`: the session asked for WebDriver BiDi and listened to console
/// events over it.
fn assert_suite(seen: &Value, bidi: bool) {
    assert_eq!(seen["title"], "form", "{seen}");
    assert_eq!(seen["greeting"], "Hello Ada in blue", "{seen}");
    assert_eq!(seen["script"], 42, "{seen}");
    assert_eq!(seen["frame"], "in the frame", "{seen}");
    assert_eq!(seen["windows"], 2, "{seen}");
    assert_eq!(seen["cookie"], "oatmeal", "{seen}");
    assert_eq!(seen["screenshot"], true, "{seen}");
    assert_eq!(seen["size"]["width"], 800, "{seen}");
    assert_eq!(seen["size"]["height"], 600, "{seen}");
    assert_eq!(
        seen["uploaded"], "upload me.txt: from the client's disk",
        "{seen}"
    );
    assert_eq!(seen["downloadable"], json!(["hello.txt"]), "{seen}");
    assert_eq!(seen["downloaded"], "hello from the page", "{seen}");
    if bidi {
        assert_eq!(seen["bidi_console"], json!(["over bidi"]), "{seen}");
    }
}

#[tokio::test]
async fn browser_selenium_for_javascript_and_webdriverio_drive_instances() {
    let (site, serve) = serve().await;
    let port = serve.api.base.rsplit(':').next().unwrap().to_owned();
    let remote = format!("http://flotilla:{KEY}@127.0.0.1:{port}/wd/hub");
    let selenium_args = [remote.as_str(), site.base.as_str()];
    let wdio_args = [serve.api.base.as_str(), "/", KEY, site.base.as_str()];
    let (selenium, wdio) = tokio::join!(
        run_node("selenium_suite.mjs", &selenium_args),
        run_node("wdio_suite.mjs", &wdio_args),
    );
    let (selenium, wdio) = (selenium.unwrap(), wdio.unwrap());
    assert_suite(&selenium, true);
    assert_eq!(selenium["cdp"], 3, "{selenium}");
    assert_eq!(selenium["se_cdp"], 5, "{selenium}");
    assert_suite(&wdio, true);
    assert!(wdio["bidi_loads"].as_u64().unwrap() >= 1, "{wdio}");
    for seen in [&selenium, &wdio] {
        let id = seen["session"].as_str().unwrap();
        let (status, _) = serve.api.get(&format!("/v2/instances/{id}")).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "quit deletes the instance");
    }
    serve.shutdown().await;
}

#[tokio::test]
async fn browser_selenium_for_python_and_webdriverio_drive_firefox_through_wd_hub() {
    let (site, serve) = serve().await;
    let (status, grid) = serve.api.get("/status").await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        grid["value"]["nodes"][0]["stereotypes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["browserName"] == "firefox"),
        "{grid}"
    );
    let port = serve.api.base.rsplit(':').next().unwrap().to_owned();
    let remote = format!("http://flotilla:{KEY}@127.0.0.1:{port}/wd/hub");
    let selenium_args = [remote.as_str(), site.base.as_str(), "firefox"];
    let wdio_args = [
        serve.api.base.as_str(),
        "/",
        KEY,
        site.base.as_str(),
        "firefox",
    ];
    let (selenium, wdio) = tokio::join!(
        run_python("selenium_suite.py", &selenium_args),
        run_node("wdio_suite.mjs", &wdio_args),
    );
    let (selenium, wdio) = (selenium.unwrap(), wdio.unwrap());
    // moz:firefoxOptions.prefs: the browser started with them.
    assert_eq!(selenium["languages"], json!(["fr-FR", "fr"]), "{selenium}");
    assert_eq!(selenium["initial_size"]["width"], 1024, "{selenium}");
    assert_eq!(selenium["after_delete"], json!([]), "{selenium}");
    assert!(wdio["bidi_loads"].as_u64().unwrap() >= 1, "{wdio}");
    for seen in [&selenium, &wdio] {
        assert_suite(seen, true);
        let caps = &seen["capabilities"];
        assert_eq!(caps["browserName"], "firefox", "{caps}");
        assert!(
            caps.get("se:cdp").is_none(),
            "Firefox speaks no CDP: {caps}"
        );
        assert!(caps.get("moz:profile").is_none(), "{caps}");
        assert!(
            caps["webSocketUrl"]
                .as_str()
                .unwrap()
                .contains("/webdriver/bidi?token="),
            "{caps}"
        );
        let id = seen["session"].as_str().unwrap();
        let (status, _) = serve.api.get(&format!("/v2/instances/{id}")).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "quit deletes the instance");
    }
    serve.shutdown().await;
}

/// A WebDriver session of `KEY`, driven over the W3C wire.
struct Session<'a> {
    serve: &'a TestServe,
    id: String,
    /// The new session's answer's `value` (`sessionId`, `capabilities`).
    created: Value,
}

impl<'a> Session<'a> {
    /// A new session with `always` as its `alwaysMatch` capabilities.
    async fn start(serve: &'a TestServe, always: Value) -> Session<'a> {
        let body = json!({ "capabilities": { "alwaysMatch": always } });
        let (status, answer) = w3c(serve, Some(KEY), Method::POST, "/session", Some(body)).await;
        assert_eq!(status, StatusCode::OK, "{answer}");
        let created = answer["value"].clone();
        let id = created["sessionId"].as_str().unwrap().to_owned();
        Session { serve, id, created }
    }

    /// `method` on `/session/{id}{rest}`, with `KEY`.
    async fn call(&self, method: Method, rest: &str, body: Option<Value>) -> (StatusCode, Value) {
        let path = format!("/session/{}{rest}", self.id);
        w3c(self.serve, Some(KEY), method, &path, body).await
    }

    /// The `value` of `GET /session/{id}{rest}`.
    async fn get(&self, rest: &str) -> Value {
        self.call(Method::GET, rest, None).await.1["value"].clone()
    }

    /// Navigates to `site`'s form.
    async fn open(&self, site: &PageServer) {
        let page = json!({"url": format!("{}/", site.base)});
        let navigated = self.call(Method::POST, "/url", Some(page)).await;
        assert_eq!(navigated.0, StatusCode::OK, "{:?}", navigated.1);
    }
}

#[tokio::test]
async fn browser_webdriver_refusals_are_w3c_errors_and_sessions_belong_to_their_key() {
    let (site, serve) = serve().await;
    // No credential: 401 in WebDriver's shape, asking for Basic.
    let refused = w3c(
        &serve,
        None,
        Method::POST,
        "/session",
        Some(json!({"capabilities": {}})),
    )
    .await;
    assert_eq!(refused.0, StatusCode::UNAUTHORIZED);
    assert!(
        refused.1["value"]["message"]
            .as_str()
            .unwrap()
            .contains("API key"),
        "{:?}",
        refused.1
    );
    // Malformed bodies and capabilities.
    for (body, code) in [
        (json!("nope"), "invalid argument"),
        (
            json!({"capabilities": {"alwaysMatch": {"goog:chromeOptions": {"args": ["--no-sandbox"]}}}}),
            "invalid argument",
        ),
        (
            json!({"capabilities": {"alwaysMatch": {"browserName": "safari"}}}),
            "session not created",
        ),
        (
            json!({"capabilities": {"alwaysMatch": {"browserVersion": "1"}}}),
            "session not created",
        ),
        (
            json!({"capabilities": {"alwaysMatch": {"timeouts": {"implicit": "soon"}}}}),
            "invalid argument",
        ),
    ] {
        let answer = w3c(
            &serve,
            Some(KEY),
            Method::POST,
            "/session",
            Some(body.clone()),
        )
        .await;
        assert_eq!(w3c_error(&answer), code, "{body}: {:?}", answer.1);
    }
    let (status, list) = serve.api.get("/v2/instances").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        list["total"], 0,
        "a refused session leaves no instance: {list}"
    );

    // A session; another key's request about it is an unknown session.
    let session = Session::start(&serve, json!({})).await;
    let page = json!({"url": format!("{}/", site.base)});
    let theirs = w3c(
        &serve,
        Some(OTHER_KEY),
        Method::POST,
        &format!("/session/{}/url", session.id),
        Some(page),
    )
    .await;
    assert_eq!(w3c_error(&theirs), "invalid session id", "{:?}", theirs.1);
    assert_eq!(theirs.0, StatusCode::NOT_FOUND);
    // The same on the instance's own HTTP port, where any key is let in:
    // commands, Grid's files and the BiDi socket are the session's key's.
    let (_, instance) = serve
        .api
        .get(&format!("/v2/instances/{}", session.id))
        .await;
    assert_eq!(instance["drivers"]["webdriver"], 1, "{instance}");
    let port = instance["http_port"].as_u64().unwrap();
    let on_port = format!("http://127.0.0.1:{port}/webdriver/session/{}", session.id);
    let http = reqwest::Client::new();
    for (key, expected) in [(OTHER_KEY, StatusCode::NOT_FOUND), (KEY, StatusCode::OK)] {
        for path in ["/url", "/se/files"] {
            let answer = http
                .get(format!("{on_port}{path}"))
                .bearer_auth(key)
                .send()
                .await
                .unwrap();
            assert_eq!(answer.status(), expected, "{key} {path}");
        }
    }
    let upgrade = http
        .get(format!("{on_port}/se/bidi"))
        .bearer_auth(OTHER_KEY)
        .header("connection", "upgrade")
        .header("upgrade", "websocket")
        .header("sec-websocket-version", "13")
        .header("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ==")
        .send()
        .await
        .unwrap();
    assert_eq!(
        upgrade.status(),
        StatusCode::NOT_FOUND,
        "another key's BiDi socket"
    );
    let deleted = http
        .delete(&on_port)
        .bearer_auth(OTHER_KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(
        deleted.status(),
        StatusCode::NOT_FOUND,
        "another key ends no session"
    );
    let made_up = w3c(
        &serve,
        Some(KEY),
        Method::GET,
        "/session/0193d6a4-0000-7000-8000-000000000001/title",
        None,
    )
    .await;
    assert_eq!(w3c_error(&made_up), "invalid session id");
    // A path that tries to climb out reaches only chromedriver, which knows
    // no such command.
    let traversal = session
        .call(Method::GET, "/..%2f..%2fv2%2finstances", None)
        .await;
    assert_eq!(
        w3c_error(&traversal),
        "unknown command",
        "{:?}",
        traversal.1
    );
    session.open(&site).await;

    // Grid's status, open.
    let status = w3c(&serve, None, Method::GET, "/wd/hub/status", None).await;
    assert_eq!(status.0, StatusCode::OK);
    assert_eq!(status.1["value"]["ready"], true, "{:?}", status.1);
    serve.shutdown().await;
}

/// A CDP command (as chromedriver's `goog/cdp/execute` takes it) that would
/// download into the browser's home.
fn download_into_home() -> Value {
    json!({"cmd": "Browser.setDownloadBehavior",
        "params": {"behavior": "allow", "downloadPath": "/instance/home"}})
}

#[tokio::test]
async fn browser_raw_cdp_through_chromedriver_gets_the_front_doors_pins() {
    let (site, serve) = serve().await;
    let session = Session::start(&serve, json!({})).await;
    session.open(&site).await;
    // chromedriver reaches the browser directly: raw CDP through it gets the
    // front door's pins. Downloads stay in the instance's directory...
    let cdp = "/goog/cdp/execute";
    let pinned = session
        .call(Method::POST, cdp, Some(download_into_home()))
        .await;
    assert_eq!(pinned.0, StatusCode::OK, "{:?}", pinned.1);
    let link = session
        .call(
            Method::POST,
            "/element",
            Some(json!({"using": "css selector", "value": "#dl"})),
        )
        .await;
    let element = link.1["value"]
        .as_object()
        .and_then(|e| e.values().next())
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("{:?}", link.1))
        .to_owned();
    let clicked = session
        .call(
            Method::POST,
            &format!("/element/{element}/click"),
            Some(json!({})),
        )
        .await;
    assert_eq!(clicked.0, StatusCode::OK, "{:?}", clicked.1);
    let deadline = std::time::Instant::now() + BROWSER_DEADLINE;
    loop {
        let (_, list) = serve
            .api
            .get(&format!("/v2/instances/{}/downloads", session.id))
            .await;
        let names: Vec<&str> = list["downloads"]
            .as_array()
            .map(|d| d.iter().filter_map(|d| d["name"].as_str()).collect())
            .unwrap_or_default();
        if names.contains(&"hello.txt") {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the download did not land in the instance's downloads: {list}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    // ... and extensions cannot be loaded.
    let refused = session
        .call(
            Method::POST,
            cdp,
            Some(json!({"cmd": "Extensions.loadUnpacked", "params": {"path": "/instance/home"}})),
        )
        .await;
    assert!(
        refused.1["value"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("refused by Flotilla"),
        "{:?}",
        refused.1
    );
    // chromedriver reads PUT as POST: only WebDriver's methods pass, and
    // its other raw CDP command is refused.
    let put = session
        .call(Method::PUT, cdp, Some(download_into_home()))
        .await;
    assert_eq!(put.0, StatusCode::METHOD_NOT_ALLOWED, "{:?}", put.1);
    assert_eq!(w3c_error(&put), "unknown method");
    let websocket_form = session
        .call(
            Method::POST,
            "/chromium/send_command_from_websocket",
            Some(json!({"method": "Browser.setDownloadBehavior", "id": -1,
                "params": {"behavior": "allow", "downloadPath": "/instance/home"}})),
        )
        .await;
    assert_eq!(
        w3c_error(&websocket_form),
        "unknown command",
        "{:?}",
        websocket_form.1
    );
    serve.shutdown().await;
}

/// Every spelling a client could give a pinned command on the way to
/// chromedriver (an encoded `#`, `?` or `/`, one encoded twice, a trailing
/// or doubled `/`, another case), on the front door and on the instance's
/// own HTTP port: each is either refused as an unknown command or pinned,
/// never carried out as sent.
#[tokio::test]
async fn browser_no_spelling_of_a_pinned_webdriver_command_gets_past_the_pins() {
    let (site, serve) = serve().await;
    let session = Session::start(&serve, json!({})).await;
    session.open(&site).await;
    let (_, instance) = serve
        .api
        .get(&format!("/v2/instances/{}", session.id))
        .await;
    let http_port = instance["http_port"].as_u64().unwrap();
    let doors = [
        format!("{}/session/{}", serve.api.base, session.id),
        format!("{}/wd/hub/session/{}", serve.api.base, session.id),
        format!(
            "http://127.0.0.1:{http_port}/webdriver/session/{}",
            session.id
        ),
    ];
    let load = json!({"cmd": "Extensions.loadUnpacked", "params": {"path": "/instance/home"}});
    let websocket_form = json!({"method": "Extensions.loadUnpacked", "id": -1,
        "params": {"path": "/instance/home"}});
    let client = reqwest::Client::new();
    for door in &doors {
        for (command, body) in [
            ("goog/cdp/execute", &load),
            ("chromium/send_command", &load),
            ("chromium/send_command_and_get_result", &load),
            ("chromium/send_command_from_websocket", &websocket_form),
        ] {
            let (first, rest) = command.split_once('/').unwrap();
            let spellings = [
                format!("/{command}"),
                format!("/{command}%23"),
                format!("/{command}%2523"),
                format!("/{command}%3F"),
                format!("/{command}%3Fx=1"),
                format!("/{command}/"),
                format!("//{command}"),
                format!("/{first}//{rest}"),
                format!("/{first}%2F{rest}"),
                format!("/{first}%2f{rest}"),
                format!("/{first}/%2e/{rest}"),
                format!("/{}", command.to_uppercase()),
                format!("/{command}%00"),
            ];
            for spelling in spellings {
                let url = format!("{door}{spelling}");
                let response = client
                    .post(&url)
                    .bearer_auth(KEY)
                    .json(body)
                    .send()
                    .await
                    .unwrap();
                let status = response.status();
                let answer: Value = response.json().await.unwrap_or(Value::Null);
                let error = answer["value"]["error"].as_str().unwrap_or("");
                let message = answer["value"]["message"].as_str().unwrap_or("");
                assert!(
                    (status == StatusCode::NOT_FOUND && error == "unknown command")
                        || message.contains("refused by Flotilla"),
                    "{url}: {status} {answer}"
                );
            }
        }
    }
    serve.shutdown().await;
}

#[tokio::test]
async fn browser_grid_file_endpoints_take_names_and_single_file_zips_only() {
    let (_site, serve) = serve().await;
    let session = Session::start(&serve, json!({"se:downloadsEnabled": true})).await;
    for name in ["../../etc/passwd", "/etc/passwd", "missing.txt"] {
        let answer = session
            .call(Method::POST, "/se/files", Some(json!({ "name": name })))
            .await;
        assert_eq!(
            w3c_error(&answer),
            "invalid argument",
            "{name}: {:?}",
            answer.1
        );
    }
    let traversal_zip = {
        use std::io::Write as _;
        let mut zipped = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
        zipped
            .start_file("../../escape.txt", zip::write::SimpleFileOptions::default())
            .unwrap();
        zipped.write_all(b"x").unwrap();
        base64::Engine::encode(
            &base64::engine::general_purpose::STANDARD,
            zipped.finish().unwrap().into_inner(),
        )
    };
    for body in [
        json!({ "file": traversal_zip }),
        json!({"file": "%%%"}),
        json!({"file": 7}),
    ] {
        let answer = session
            .call(Method::POST, "/se/file", Some(body.clone()))
            .await;
        assert_eq!(
            w3c_error(&answer),
            "invalid argument",
            "{body}: {:?}",
            answer.1
        );
    }
    let oversized = reqwest::Client::new()
        .post(format!("{}/session/{}/se/file", serve.api.base, session.id))
        .bearer_auth(KEY)
        .body(vec![b' '; 65 << 20])
        .send()
        .await
        .unwrap();
    let status = oversized.status();
    let body: Value = oversized.json().await.unwrap_or(Value::Null);
    assert_eq!(
        body["value"]["error"], "invalid argument",
        "{status}: {body}"
    );
    serve.shutdown().await;
}

#[tokio::test]
async fn browser_the_bidi_socket_is_its_sessions_and_its_commands_are_pinned() {
    let (_site, serve) = serve().await;
    let session = Session::start(&serve, json!({"webSocketUrl": true})).await;
    let socket_url = session.created["capabilities"]["webSocketUrl"]
        .as_str()
        .unwrap_or_else(|| panic!("{}", session.created))
        .to_owned();
    // No credential: refused; another key: no such session; its own URL
    // (the instance token) opens it.
    let without_token = socket_url.split('?').next().unwrap().to_owned();
    let refused = tokio_tungstenite::connect_async(without_token.as_str()).await;
    assert!(
        matches!(&refused, Err(tokio_tungstenite::tungstenite::Error::Http(r)) if r.status() == 401),
        "a BiDi socket without a credential: {refused:?}"
    );
    let mut theirs =
        tokio_tungstenite::tungstenite::client::IntoClientRequest::into_client_request(
            without_token.as_str(),
        )
        .unwrap();
    theirs.headers_mut().insert(
        "authorization",
        format!("Bearer {OTHER_KEY}").parse().unwrap(),
    );
    let refused = tokio_tungstenite::connect_async(theirs).await;
    assert!(
        matches!(&refused, Err(tokio_tungstenite::tungstenite::Error::Http(r)) if r.status() == 404),
        "another key's BiDi socket: {refused:?}"
    );
    let (mut socket, _) = tokio_tungstenite::connect_async(&socket_url).await.unwrap();
    // An extension install is refused on its way to chromedriver.
    use futures_util::{SinkExt as _, StreamExt as _};
    let install = json!({"id": 1, "method": "webExtension.install",
        "params": {"extensionData": {"type": "path", "path": "/instance/home"}}});
    socket
        .send(tokio_tungstenite::tungstenite::Message::text(
            install.to_string(),
        ))
        .await
        .unwrap();
    let answer = loop {
        let message = tokio::time::timeout(BROWSER_DEADLINE, socket.next())
            .await
            .expect("an answer over BiDi")
            .expect("the socket stays open")
            .unwrap();
        let value: Value = serde_json::from_str(message.to_text().unwrap_or("null")).unwrap();
        if value["id"] == 1 {
            break value;
        }
    };
    assert_eq!(answer["type"], "error", "{answer}");
    assert!(
        answer["message"]
            .as_str()
            .unwrap_or("")
            .contains("refused by Flotilla"),
        "{answer}"
    );
    drop(socket);
    let ended = session.call(Method::DELETE, "", None).await;
    assert_eq!(ended.0, StatusCode::OK, "{:?}", ended.1);
    serve.shutdown().await;
}

#[tokio::test]
async fn browser_a_session_is_confined_and_comes_back_from_a_park_as_it_was() {
    confined_and_back_from_a_park(json!({}), "chromedriver").await;
}

#[tokio::test]
async fn browser_a_firefox_session_is_confined_and_comes_back_from_a_park_as_it_was() {
    confined_and_back_from_a_park(json!({"browserName": "firefox"}), "geckodriver").await;
}

/// A session of `always` (its driver named `driver`): the driver confined
/// with the browser, the session back after a park, and gone with its
/// instance.
async fn confined_and_back_from_a_park(always: Value, driver: &str) {
    let (site, serve) = serve().await;
    let session = Session::start(&serve, always).await;
    let id = session.id.clone();
    session.open(&site).await;
    let cookie = session
        .call(
            Method::POST,
            "/cookie",
            Some(json!({"cookie": {"name": "kept", "value": "across-park", "expiry": 4_000_000_000u64}})),
        )
        .await;
    assert_eq!(cookie.0, StatusCode::OK, "{:?}", cookie.1);

    // The driver runs in the browser's confinement: its user, network
    // namespace and cgroup.
    let processes = processes_of(&serve, &id);
    let drivers: Vec<_> = processes.iter().filter(|p| p.1 == driver).collect();
    let browser = browser_main_pid(&serve.instances_dir().join(&id))
        .unwrap_or_else(|| panic!("no browser among {processes:?}"));
    assert_eq!(drivers.len(), 1, "{processes:?}");
    for fact in ["ns/net", "cgroup", "loginuid", "status_uid"] {
        assert_eq!(
            process_fact(drivers[0].0, fact),
            process_fact(browser, fact),
            "{driver}'s {fact} is the browser's"
        );
    }
    let handle_before_park = session.get("/window").await;
    if driver == "geckodriver" {
        refuses_what_reaches_past_the_pages(&session).await;
    }

    // Parked (its idle timeout, or the API): nothing of it runs, and the
    // next command revives it.
    serve.api.park(&id).await;
    serve
        .api
        .wait_for_status(&id, "dormant", BROWSER_DEADLINE)
        .await;
    let left = processes_of(&serve, &id);
    assert!(left.is_empty(), "a parked session leaves {left:?}");
    let title = session.call(Method::GET, "/title", None).await;
    assert_eq!(title.0, StatusCode::OK, "{:?}", title.1);
    // What the client sees: the page (its URL and title) and its cookies
    // back, in a window of a new browser (a new handle).
    assert_eq!(title.1["value"], "form", "{:?}", title.1);
    assert_eq!(session.get("/url").await, format!("{}/", site.base));
    assert_eq!(session.get("/cookie/kept").await["value"], "across-park");
    let handles = session.get("/window/handles").await;
    assert_eq!(handles.as_array().map(Vec::len), Some(1), "{handles}");
    assert_ne!(handles[0], handle_before_park, "a new browser's window");
    serve
        .api
        .wait_for_status(&id, "running", BROWSER_DEADLINE)
        .await;

    // Deleting its instance ends the session, and its processes.
    serve.api.delete_instance(&id).await;
    let left = processes_of(&serve, &id);
    assert!(left.is_empty(), "a deleted session leaves {left:?}");
    let gone = session.call(Method::GET, "/title", None).await;
    assert_eq!(w3c_error(&gone), "invalid session id");
    serve.shutdown().await;
}

#[tokio::test]
async fn browser_a_firefox_session_whose_script_never_ends_is_still_parked() {
    let (site, serve) = serve().await;
    let session = Session::start(&serve, json!({"browserName": "firefox"})).await;
    session.open(&site).await;
    tabs_and_screenshots_ride_on_the_session(&session, &site).await;
    let no_limit = session
        .call(Method::POST, "/timeouts", Some(json!({"script": null})))
        .await;
    assert_eq!(no_limit.0, StatusCode::OK, "{:?}", no_limit.1);
    // A script that tells the site it started, then never finishes: its
    // command holds the session.
    let path = format!("/session/{}/execute/async", session.id);
    let script = json!({"script": "fetch('/started'); return new Promise(() => {})", "args": []});
    let hung = {
        let (base, path) = (serve.api.base.clone(), path.clone());
        tokio::spawn(async move {
            let _ = reqwest::Client::new()
                .post(format!("{base}{path}"))
                .bearer_auth(KEY)
                .json(&script)
                .send()
                .await;
        })
    };
    wait_until(BROWSER_DEADLINE, "the script to start", || async {
        let started = site.requested().iter().any(|p| p == "/started");
        if started {
            Ok(Some(()))
        } else {
            Err("not yet".to_owned())
        }
    })
    .await
    .unwrap();
    // The park ends the driver the command holds, and goes on.
    serve.api.park(&session.id).await;
    serve
        .api
        .wait_for_status(&session.id, "dormant", BROWSER_DEADLINE)
        .await;
    hung.await.unwrap();
    // The session goes on in the revived browser.
    let title = session.call(Method::GET, "/title", None).await;
    assert_eq!(title.0, StatusCode::OK, "{:?}", title.1);
    assert_eq!(title.1["value"], "form");
    serve.shutdown().await;
}

/// A Firefox's `/tabs` and `/screenshot` while a WebDriver session holds
/// the browser's only BiDi session: read on the client's session, not
/// refused.
async fn tabs_and_screenshots_ride_on_the_session(session: &Session<'_>, site: &PageServer) {
    let (serve, id) = (session.serve, &session.id);
    let (status, tabs) = serve.api.get(&format!("/v2/instances/{id}/tabs")).await;
    assert_eq!(status, StatusCode::OK, "{tabs}");
    assert_eq!(tabs[0]["url"], format!("{}/", site.base), "{tabs}");
    let shot = reqwest::Client::new()
        .get(format!(
            "{}/v2/instances/{id}/screenshot?tab=1",
            serve.api.base
        ))
        .bearer_auth(KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(shot.status(), StatusCode::OK);
    let png = shot.bytes().await.unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    // The client's session goes on.
    assert_eq!(session.get("/title").await, "form");
}

/// geckodriver's chrome context (the browser's own privileges) and add-on
/// installs, in each spelling, are refused; the session goes on.
async fn refuses_what_reaches_past_the_pages(session: &Session<'_>) {
    for (rest, body) in [
        ("/moz/context", json!({"context": "chrome"})),
        ("/MOZ/Context", json!({"context": "chrome"})),
        ("/moz/%63ontext", json!({"context": "chrome"})),
        (
            "/moz/addon/install",
            json!({"addon": "UEsDBA==", "temporary": true}),
        ),
        ("/moz/addon/uninstall", json!({"id": "x@y"})),
    ] {
        let refused = session.call(Method::POST, rest, Some(body)).await;
        assert_eq!(refused.0, StatusCode::NOT_FOUND, "{rest}: {:?}", refused.1);
        assert_eq!(w3c_error(&refused), "unknown command", "{rest}");
    }
    let script = json!({"script": "return typeof Services", "args": []});
    let page = session
        .call(Method::POST, "/execute/sync", Some(script))
        .await;
    assert_eq!(
        page.1["value"], "undefined",
        "scripts run in pages: {:?}",
        page.1
    );
}

/// The chromedrivers running under `serve`'s instances (pids).
fn chromedrivers(serve: &TestServe) -> Vec<u32> {
    processes_of(serve, "")
        .into_iter()
        .filter(|(_, name)| name == "chromedriver")
        .map(|(pid, _)| pid)
        .collect()
}

/// Waits until the warm pool's chromedriver runs, then answers its pid.
async fn warm_chromedriver(serve: &TestServe, not: &[u32]) -> u32 {
    let what = format!("a warm browser's chromedriver other than {not:?}");
    flotilla_testkit::wait_until(BROWSER_DEADLINE, &what, || {
        let running = chromedrivers(serve);
        let found = running.iter().copied().find(|pid| !not.contains(pid));
        async move {
            match found {
                Some(pid) => Ok(Some(pid)),
                None => Err(format!("chromedrivers running: {running:?}")),
            }
        }
    })
    .await
    .unwrap()
}

/// Whether instance `id` started a browser of its own (it has its own
/// directory) rather than taking a warm one (which lives in the pooled
/// browser's).
fn has_own_browser(serve: &TestServe, id: &str) -> bool {
    serve.instances_dir().join(id).exists()
}

#[tokio::test]
async fn browser_warm_browsers_come_with_a_chromedriver_that_only_a_session_keeps() {
    let (site, mut serve) = spawn_serve_with_page(FORM, |config| {
        config.control.auth_enabled = true;
        config.control.api_keys = vec![KEY.into()];
        config.agent.warm_pool_size = 1;
    })
    .await;
    serve.api = Api::with_key(serve.api.base.clone(), KEY);
    // An instance that is not a session takes the warm browser; its
    // chromedriver ends with it.
    let first = warm_chromedriver(&serve, &[]).await;
    // (The chromedriver shows before its warm browser joins the pool: a
    // create in between starts a browser of its own, and is made again.)
    let deadline = std::time::Instant::now() + BROWSER_DEADLINE;
    let id = loop {
        let (id, _, _) = serve.api.create_running("{}").await;
        if !has_own_browser(&serve, &id) {
            break id;
        }
        serve.api.delete_instance(&id).await;
        assert!(
            std::time::Instant::now() < deadline,
            "no create took the warm browser"
        );
    };
    let second = warm_chromedriver(&serve, &[first]).await;
    serve.api.delete_instance(&id).await;
    flotilla_testkit::wait_until(
        BROWSER_DEADLINE,
        "the taken browser's chromedriver to end",
        || {
            let alive = chromedrivers(&serve).contains(&first);
            async move { Ok::<_, String>((!alive).then_some(())) }
        },
    )
    .await
    .unwrap();
    // A session takes the next warm browser with its chromedriver: that
    // chromedriver serves it.
    let deadline = std::time::Instant::now() + BROWSER_DEADLINE;
    let session = loop {
        let session = Session::start(&serve, json!({})).await;
        if !has_own_browser(&serve, &session.id) {
            break session;
        }
        let ended = session.call(Method::DELETE, "", None).await;
        assert_eq!(ended.0, StatusCode::OK, "{:?}", ended.1);
        assert!(
            std::time::Instant::now() < deadline,
            "no session took the warm browser"
        );
    };
    session.open(&site).await;
    assert_eq!(session.get("/title").await, "form");
    // Once the pool has refilled: the session's chromedriver (the one its
    // warm browser came with, no second one) and the new warm browser's.
    let refilled = warm_chromedriver(&serve, &[first, second]).await;
    let running = chromedrivers(&serve);
    assert!(
        running.contains(&second) && running.contains(&refilled) && running.len() == 2,
        "the session keeps the chromedriver its warm browser came with: {running:?} (it came with {second})"
    );
    let ended = session.call(Method::DELETE, "", None).await;
    assert_eq!(ended.0, StatusCode::OK, "{:?}", ended.1);
    flotilla_testkit::wait_until(
        BROWSER_DEADLINE,
        "the session's chromedriver to end",
        || {
            let alive = chromedrivers(&serve).contains(&second);
            async move { Ok::<_, String>((!alive).then_some(())) }
        },
    )
    .await
    .unwrap();
    serve.shutdown().await;
}
