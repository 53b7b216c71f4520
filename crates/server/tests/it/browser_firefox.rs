//! Firefox instances (the `firefox` image, Debian's `firefox-esr`) with real
//! Firefox and real clients: Puppeteer over WebDriver BiDi through the front
//! door with authentication on, the other protocols' doors refusing it
//! clearly, the walls of its sandbox tried from a BiDi client, and a mixed
//! fleet of Chromium and Firefox on one node.

use std::path::Path;
use std::time::Duration;

use serde_json::Value;

use flotilla_testkit::{
    Api, BROWSER_DEADLINE, PageServer, StatusCode, TestServe, free_port, run_node, serve_page,
    spawn_serve_with, upgrade_status, wait_until,
};

const API_KEY: &str = "firefox-api-key-0123456789";

/// `serve` with authentication on, its public URL its own port (so that
/// `urls` go through the front door), browsers allowed to open `site`.
async fn door_serve(
    site: &PageServer,
    adjust: impl FnOnce(&mut flotilla_server::FlotillaConfig),
) -> (TestServe, u16) {
    let port = free_port();
    let mut serve = spawn_serve_with(|config| {
        config.listen = format!("127.0.0.1:{port}");
        config.control.auth_enabled = true;
        config.control.api_keys = vec![API_KEY.into()];
        config.control.public_url = Some(format!("http://127.0.0.1:{port}"));
        site.allow_in(config);
        adjust(config);
    })
    .await;
    serve.api = Api::with_key(serve.api.base.clone(), API_KEY);
    (serve, port)
}

/// A running instance of `image`: its get view.
async fn running(serve: &TestServe, image: &str) -> Value {
    let body = format!(r#"{{"image": "{image}"}}"#);
    let (_, created, instance) = serve.api.create_running(&body).await;
    assert_eq!(instance["urls"], created["urls"]);
    instance
}

fn url<'a>(instance: &'a Value, kind: &str) -> &'a str {
    instance["urls"][kind].as_str().expect("a url")
}

/// The status line and body a WebSocket upgrade of `url` (`ws://…`) gets.
async fn refused_upgrade(url: &str) -> (StatusCode, String) {
    use tokio_tungstenite::tungstenite::Error;
    match tokio_tungstenite::connect_async(url).await {
        Ok(_) => panic!("{url} was upgraded"),
        Err(Error::Http(response)) => {
            let body = response
                .body()
                .as_ref()
                .map(|bytes| String::from_utf8_lossy(bytes).into_owned())
                .unwrap_or_default();
            (
                StatusCode::from_u16(response.status().as_u16()).unwrap(),
                body,
            )
        }
        Err(other) => panic!("{url}: {other}"),
    }
}

#[tokio::test]
async fn browser_puppeteer_drives_a_firefox_instance_over_bidi_through_the_door() {
    let site = serve_page(&[
        ("/", "<title>firefox through the door</title><p>hello</p>"),
        ("/report.txt", "quarterly figures"),
    ])
    .await;
    let (serve, port) = door_serve(&site, |_| {}).await;
    let firefox = running(&serve, "firefox").await;
    let id = firefox["id"].as_str().unwrap();
    let bidi = url(&firefox, "bidi");
    assert!(
        bidi.starts_with(&format!(
            "ws://127.0.0.1:{port}/v2/instances/{id}/bidi?token="
        )),
        "{bidi}"
    );

    // The node reads the tabs over and over while Puppeteer works: on
    // Puppeteer's own session, through its connection, unseen by it.
    let reading = tokio::sync::watch::Sender::new(true);
    let reads = tokio::spawn(tabs_read_while(
        serve.api.clone(),
        id.to_owned(),
        reading.subscribe(),
    ));
    let seen = run_node(
        "puppeteer_bidi.mjs",
        &[bidi, &format!("{}/", site.base), "/report.txt"],
    )
    .await
    .unwrap();
    reading.send_replace(false);
    let answered = reads.await.unwrap();
    assert!(
        answered > 0,
        "the tabs were read while Puppeteer held the session"
    );
    assert_eq!(seen["title"], "firefox through the door", "{seen}");
    assert_eq!(seen["sum"], 42);
    assert_eq!(seen["png"], "89504e47", "a PNG screenshot: {seen}");
    assert!(seen["png_bytes"].as_u64().unwrap() > 1000, "{seen}");
    assert_eq!(seen["cookies"], serde_json::json!(["flavour=oat"]));
    assert!(
        seen["user_agent"].as_str().unwrap().contains("Firefox/"),
        "{seen}"
    );
    // The download landed in the instance's downloads, whatever folder the
    // client asked for.
    let listed = wait_until(BROWSER_DEADLINE, "the download to be listed", || async {
        let (status, list) = serve
            .api
            .get(&format!("/v2/instances/{id}/downloads"))
            .await;
        let names: Vec<String> = list["downloads"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|item| item["name"].as_str().map(str::to_owned))
            .collect();
        if status == StatusCode::OK && names.iter().any(|name| name == "report.txt") {
            Ok(Some(names))
        } else {
            Err(format!("{status} {list}"))
        }
    })
    .await
    .unwrap();
    assert_eq!(listed, ["report.txt"]);
    assert!(!Path::new("/tmp/elsewhere/report.txt").exists());

    serve.api.delete_instance(id).await;
    serve.shutdown().await;
}

/// Reads instance `id`'s tabs until `reading` turns false: how many reads
/// listed the page Puppeteer opened (every read answers 200 or, before
/// Puppeteer's session starts or after it ends, 409).
async fn tabs_read_while(
    api: Api,
    id: String,
    mut reading: tokio::sync::watch::Receiver<bool>,
) -> usize {
    let mut answered = 0;
    while *reading.borrow_and_update() {
        let (status, tabs) = api.get(&format!("/v2/instances/{id}/tabs")).await;
        assert!(
            status == StatusCode::OK || status == StatusCode::CONFLICT,
            "{status} {tabs}"
        );
        if tabs.to_string().contains("firefox through the door") {
            answered += 1;
        }
        let _ = tokio::time::timeout(Duration::from_millis(100), reading.changed()).await;
    }
    answered
}

/// A raw BiDi client of `bidi` that has started a session (Firefox's only
/// one) and holds it until dropped.
async fn holding_the_session(
    bidi: &str,
) -> tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>> {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;
    let (mut socket, _) = tokio_tungstenite::connect_async(bidi).await.unwrap();
    let new = r#"{"id": 1, "method": "session.new", "params": {"capabilities": {}}}"#;
    socket.send(Message::text(new)).await.unwrap();
    let answered = tokio::time::timeout(BROWSER_DEADLINE, async {
        while let Some(Ok(message)) = socket.next().await {
            if let Message::Text(text) = message {
                let answer: Value = serde_json::from_str(&text).unwrap();
                if answer["id"] == 1 {
                    return answer;
                }
            }
        }
        panic!("the socket closed before session.new was answered");
    })
    .await
    .expect("session.new answered");
    assert_eq!(answered["type"], "success", "{answered}");
    socket
}

#[tokio::test]
async fn browser_the_doors_of_other_protocols_refuse_a_firefox_instance_by_name_and_its_own_serve_it()
 {
    let site = serve_page(&[("/", "<title>x</title>")]).await;
    let (serve, _) = door_serve(&site, |_| {}).await;
    let firefox = running(&serve, "firefox").await;
    let id = firefox["id"].as_str().unwrap();
    let bidi = url(&firefox, "bidi");
    // Without a credential the door is closed; the CDP and Playwright doors
    // of a Firefox instance say which protocol to use instead.
    let (bare, _) = bidi.split_once("?token=").unwrap();
    assert_eq!(refused_upgrade(bare).await.0, StatusCode::UNAUTHORIZED);
    let (status, why) = refused_upgrade(url(&firefox, "debug")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{why}");
    assert!(why.contains("WebDriver BiDi at urls.bidi"), "{why}");
    let (status, why) = refused_upgrade(url(&firefox, "playwright")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{why}");
    assert!(
        why.contains("Playwright drives only its own patched Firefox"),
        "{why}"
    );
    // Its tabs and screenshots, over BiDi in a session of the node's own.
    let (status, tabs) = serve.api.get(&format!("/v2/instances/{id}/tabs")).await;
    assert_eq!(status, StatusCode::OK, "{tabs}");
    assert_eq!(tabs[0]["url"], "about:blank", "{tabs}");
    // Its position: Firefox names its contexts anew in each session.
    let tab = tabs[0]["id"].as_str().unwrap();
    assert_eq!(tab, "1", "{tabs}");
    for query in [String::new(), format!("?tab={tab}")] {
        let shot = reqwest::Client::new()
            .get(format!(
                "{}/v2/instances/{id}/screenshot{query}",
                serve.api.base
            ))
            .bearer_auth(API_KEY)
            .send()
            .await
            .unwrap();
        let status = shot.status();
        let scale = shot.headers().get("x-screenshot-scale").cloned();
        let png = shot.bytes().await.unwrap();
        assert_eq!(status, StatusCode::OK, "{query}: {png:?}");
        assert_eq!(scale.unwrap(), "1.0000");
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "{query}");
    }
    let (status, body) = serve
        .api
        .get(&format!("/v2/instances/{id}/screenshot?tab=2"))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    for hostile in ["0", "-1", "x", "99999999999999999999999"] {
        let (status, body) = serve
            .api
            .get(&format!("/v2/instances/{id}/screenshot?tab={hostile}"))
            .await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{hostile}: {body}");
    }
    // While a client holds Firefox's only BiDi session, its tabs and
    // screenshots are read on that session, through the client's relay.
    let client = holding_the_session(bidi).await;
    let (status, tabs) = serve.api.get(&format!("/v2/instances/{id}/tabs")).await;
    assert_eq!(status, StatusCode::OK, "{tabs}");
    assert_eq!(tabs[0]["id"], "1", "{tabs}");
    let shot = reqwest::Client::new()
        .get(format!("{}/v2/instances/{id}/screenshot", serve.api.base))
        .bearer_auth(API_KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(shot.status(), StatusCode::OK);
    assert_eq!(&shot.bytes().await.unwrap()[..8], b"\x89PNG\r\n\x1a\n");
    // A park needs a session of the node's own: 409, not an internal
    // error; it runs once the client left.
    let parked = serve
        .api
        .post(&format!("/v2/instances/{id}/dormant"), "")
        .await;
    assert_eq!(parked.0, StatusCode::CONFLICT, "{}", parked.1);
    assert!(
        parked.1["detail"]
            .as_str()
            .unwrap()
            .contains("only session"),
        "{}",
        parked.1
    );
    drop(client);
    wait_until(BROWSER_DEADLINE, "a park once the client left", || async {
        let (status, body) = serve
            .api
            .post(&format!("/v2/instances/{id}/dormant"), "")
            .await;
        if status == StatusCode::OK {
            Ok(Some(()))
        } else {
            Err(format!("{status} {body}"))
        }
    })
    .await
    .unwrap();

    // A Chromium instance beside it answers BiDi clients of its own socket
    // with where to go.
    let chromium = running(&serve, "chromium").await;
    let (status, why) = refused_upgrade(url(&chromium, "bidi")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{why}");
    assert!(why.contains("urls.debug"), "{why}");
    let firefox_port = firefox["debug_port"].as_u64().unwrap() as u16;
    assert!(
        upgrade_status(firefox_port, "/session")
            .await
            .contains("401"),
        "the instance's own port wants a credential too"
    );
    serve.shutdown().await;
}

#[tokio::test]
async fn browser_firefox_settings_are_firefoxs_and_checked_by_name() {
    let languages = "<title>x</title><body><script>document.body.textContent = navigator.languages.join(',')</script>";
    let site = serve_page(&[("/", languages)]).await;
    let (serve, _) = door_serve(&site, |_| {}).await;
    for (config, named) in [
        (
            r#"{"prefs": {"network.proxy.type": 0}}"#,
            "network.proxy.type",
        ),
        (
            r#"{"prefs": {"general": {"config": {"filename": "x.cfg"}}}}"#,
            "general.config.filename",
        ),
        (
            r#"{"prefs": {"browser.download.dir": "/"}}"#,
            "browser.download.dir",
        ),
        (r#"{"prefs": {"ui.list": [1]}}"#, "ui.list"),
        (
            r#"{"prefs": {"helpers.private_mailcap_file": "/instance/downloads/mc"}}"#,
            "helpers.private_mailcap_file",
        ),
        (
            r#"{"prefs": {"browser.startup.homepage": "x"}}"#,
            "browser.startup.homepage",
        ),
    ] {
        let body = format!(r#"{{"image": "firefox", "config": {config}}}"#);
        let (status, answer) = serve.api.post("/v2/instances", &body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{config}: {answer}");
        let detail = answer["detail"].as_str().unwrap();
        assert!(detail.contains(named), "{detail}");
    }
    // Firefox's own preferences: the browser starts with them.
    let body =
        r#"{"image": "firefox", "config": {"prefs": {"intl.accept_languages": "de-DE,de"}}}"#;
    let (_, _, firefox) = serve.api.create_running(body).await;
    let page = format!("{}/", site.base);
    let seen = loads(url(&firefox, "bidi"), std::slice::from_ref(&page)).await;
    assert_eq!(seen[&page]["text"], "de-DE,de", "{seen}");
    serve.shutdown().await;
}

#[tokio::test]
async fn browser_a_profile_is_per_engine() {
    let site = serve_page(&[("/", "<title>x</title>")]).await;
    let (serve, _) = door_serve(&site, |_| {}).await;
    let (status, body) = serve.api.post("/v2/profiles", r#"{"name": "fx"}"#).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    // Before its first save, any engine may start from it.
    let written = r#"{"image": "firefox", "profile": {"name": "fx", "persist": true}}"#;
    let (id, _, _) = serve.api.create_running(written).await;
    serve.api.delete_instance(&id).await;
    let saved = wait_until(BROWSER_DEADLINE, "the profile's save", || async {
        let (_, profile) = serve.api.get("/v2/profiles/fx").await;
        match profile["engine"].as_str() {
            Some(engine) => Ok(Some(engine.to_owned())),
            None => Err(profile.to_string()),
        }
    })
    .await
    .unwrap();
    assert_eq!(saved, "firefox");

    let other = r#"{"image": "chromium", "profile": {"name": "fx"}}"#;
    let (status, refused) = serve.api.post("/v2/instances", other).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{refused}");
    let detail = refused["detail"].as_str().unwrap();
    assert!(
        detail.contains("\"fx\" was saved by firefox") && detail.contains("runs chromium"),
        "{detail}"
    );
    let (_, instances) = serve.api.get("/v2/instances").await;
    assert_eq!(
        instances["instances"],
        serde_json::json!([]),
        "nothing left"
    );
    let same = r#"{"image": "firefox", "profile": {"name": "fx"}}"#;
    let (id, _, _) = serve.api.create_running(same).await;
    serve.api.delete_instance(&id).await;
    serve.shutdown().await;
}

/// Whether each of `urls` loaded in the Firefox instance behind `bidi`.
async fn loads(bidi: &str, urls: &[String]) -> Value {
    let mut args = vec![bidi];
    args.extend(urls.iter().map(String::as_str));
    run_node("bidi_loads.mjs", &args).await.unwrap()
}

#[tokio::test]
async fn browser_a_bidi_client_owns_its_firefox_and_nothing_else() {
    let site = serve_page(&[("/", "<title>allowed</title><p>allowed site</p>")]).await;
    let (serve, port) = door_serve(&site, |_| {}).await;
    let secret_file = serve.data_dir.join("node-secret.txt");
    std::fs::write(&secret_file, "node secret").unwrap();
    let a = running(&serve, "firefox").await;
    let b = running(&serve, "firefox").await;
    let instances = serve.instances_dir();
    let other_profile = instances.join(b["id"].as_str().unwrap()).join("profile");
    std::fs::write(other_profile.join("other-secret.txt"), "other secret").unwrap();

    let allowed = format!("{}/", site.base);
    let mut walls: Vec<String> = [
        "/etc/shadow".to_owned(),
        secret_file.display().to_string(),
        other_profile.join("other-secret.txt").display().to_string(),
        flotilla_testkit::workspace_root()
            .join("Cargo.toml")
            .display()
            .to_string(),
    ]
    .iter()
    .map(|path| format!("file://{path}"))
    .collect();
    let agent = serve.serve().agent_addr.to_string();
    let proxy = serve.serve().proxy_addr.to_string();
    for target in [format!("127.0.0.1:{port}"), agent, proxy] {
        walls.push(format!("http://{target}/health"));
    }
    walls.push(format!("http://127.0.0.1:{}/", b["debug_port"]));
    let mut urls = vec![allowed.clone()];
    urls.extend(walls.iter().cloned());
    let seen = loads(url(&a, "bidi"), &urls).await;
    assert_eq!(seen[&allowed]["loaded"], true, "{seen}");
    assert!(
        seen[&allowed]["text"]
            .as_str()
            .unwrap()
            .contains("allowed site"),
        "{seen}"
    );
    for wall in &walls {
        assert_eq!(seen[wall]["loaded"], false, "{wall} loaded: {seen}");
        let text = seen[wall]["text"].as_str().unwrap();
        assert!(
            !text.contains("secret") && !text.contains("status"),
            "{wall}: {text}"
        );
    }

    // Not root, and in its own network namespace.
    let tree = flotilla_testkit::browser_processes(&instances.join(a["id"].as_str().unwrap()));
    assert!(!tree.is_empty());
    let own_net = std::fs::read_link("/proc/self/ns/net").unwrap();
    for pid in &tree {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        if let Some(uid) = status.lines().find_map(|line| line.strip_prefix("Uid:")) {
            assert!(
                !uid.split_whitespace().any(|id| id == "0"),
                "pid {pid} runs as root"
            );
        }
        if let Ok(net) = std::fs::read_link(format!("/proc/{pid}/ns/net")) {
            assert_ne!(net, own_net, "pid {pid} shares the host's network");
        }
    }
    serve.shutdown().await;
}

#[tokio::test]
async fn browser_a_mixed_fleet_places_each_engine_on_a_node_that_runs_it() {
    let site = serve_page(&[("/", "<title>mixed</title>")]).await;
    let (serve, _) = door_serve(&site, |_| {}).await;
    let (_, node) = serve.api.get("/v2/nodes/test-node").await;
    let images: Vec<&str> = node["images"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        images.contains(&"firefox") && images.contains(&"chromium"),
        "{node}"
    );
    let firefox = running(&serve, "firefox").await;
    let chromium = running(&serve, "chromium").await;
    let page = format!("{}/", site.base);
    let seen = loads(url(&firefox, "bidi"), std::slice::from_ref(&page)).await;
    assert_eq!(seen[&page]["loaded"], true, "{seen}");
    let result = run_node("puppeteer_title.mjs", &[url(&chromium, "debug"), &page])
        .await
        .unwrap();
    assert_eq!(result["title"], "mixed");
    assert!(
        result["version"].as_str().unwrap().contains("Chrom"),
        "{result}"
    );
    // An image no node runs is refused with the images there are.
    let (status, answer) = serve
        .api
        .post("/v2/instances", r#"{"image": "safari"}"#)
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
    assert!(
        answer["detail"].as_str().unwrap().contains("firefox"),
        "{answer}"
    );
    serve.shutdown().await;
}

/// What `bidi_state.mjs get` reads, once the instance shows `tabs` pages.
async fn state_with_tabs(bidi: &str, tabs: usize) -> Value {
    wait_until(BROWSER_DEADLINE, "the revived tabs", || async {
        let seen = run_node("bidi_state.mjs", &[bidi, "get"])
            .await
            .map_err(|e| e.to_string())?;
        let web = seen["tabs"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|url| url.as_str().is_some_and(|url| url.starts_with("http")))
            .count();
        if web == tabs {
            Ok(Some(seen))
        } else {
            Err(seen.to_string())
        }
    })
    .await
    .unwrap()
}

#[tokio::test]
async fn browser_a_parked_firefox_instance_comes_back_with_its_tabs_and_cookies() {
    let site = serve_page(&[
        ("/", "<title>home</title>"),
        ("/a", "<title>a</title>"),
        ("/b", "<title>b</title>"),
    ])
    .await;
    let (serve, _) = door_serve(&site, |_| {}).await;
    let firefox = running(&serve, "firefox").await;
    let id = firefox["id"].as_str().unwrap();
    let bidi = url(&firefox, "bidi");
    let pages: Vec<String> = ["/", "/a", "/b"]
        .iter()
        .map(|path| format!("{}{path}", site.base))
        .collect();
    // A client that crashed with its session open leaves it to the next
    // (Firefox holds one session, ended only by session.end).
    run_node("bidi_state.mjs", &[bidi, "leave"]).await.unwrap();
    let mut args = vec![bidi, "set"];
    args.extend(pages.iter().map(String::as_str));
    run_node("bidi_state.mjs", &args).await.unwrap();
    let before = state_with_tabs(bidi, 3).await;

    let parked = serve.api.park(id).await;
    assert_eq!(parked["status"], "dormant", "{parked}");
    assert!(
        flotilla_testkit::browser_processes(&serve.instances_dir().join(id)).is_empty(),
        "no Firefox runs while it is parked"
    );
    let (status, revived) = serve
        .api
        .post(
            &format!("/v2/instances/{id}/revive"),
            r#"{"method": "full_restore"}"#,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{revived}");
    serve
        .api
        .wait_for_status(id, "running", BROWSER_DEADLINE)
        .await;
    let after = state_with_tabs(bidi, 3).await;
    let mut tabs: Vec<String> = after["tabs"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|url| url.as_str().map(str::to_owned))
        .filter(|url| url.starts_with("http"))
        .collect();
    tabs.sort();
    let mut expected = pages.clone();
    expected.sort();
    assert_eq!(tabs, expected, "{after}");
    assert_eq!(after["cookies"], before["cookies"], "{after}");
    assert_eq!(
        after["cookies"],
        serde_json::json!(["flavour=oat", "visit=session"])
    );
    assert_eq!(after["basket"], "three apples", "{after}");
    serve.shutdown().await;
}

/// Firefox sends nothing of its own (updates, telemetry, remote settings,
/// safe browsing, captive-portal checks…) through an upstream proxy that
/// logs every request: only the page it was asked for.
#[tokio::test]
async fn browser_firefox_sends_nothing_of_its_own_through_a_logging_proxy() {
    use crate::browser_sessions::{PROXY_PASSWORD, Tinyproxy, proxy_body, requested_hosts};
    let proxy = Tinyproxy::start();
    let site = serve_page(&[("/", "<title>via the upstream proxy</title><p>proxied</p>")]).await;
    let proxy_addr = format!("127.0.0.1:{}", proxy.port);
    let (serve, _) = door_serve(&site, |config| {
        config.agent.egress.allow.push(proxy_addr.clone());
    })
    .await;
    proxy.listening().await;
    let launched = std::time::Instant::now();
    let mut body: Value = serde_json::from_str(&proxy_body(proxy.port, PROXY_PASSWORD)).unwrap();
    body["image"] = "firefox".into();
    let (_, created, _) = serve.api.create_running(&body.to_string()).await;
    let page = format!("{}/", site.base);
    let seen = loads(url(&created, "bidi"), std::slice::from_ref(&page)).await;
    assert_eq!(seen[&page]["loaded"], true, "{seen}");
    let port = site.authority().rsplit_once(':').unwrap().1.to_owned();
    assert!(
        proxy.logged().contains(&format!("127.0.0.1:{port}")),
        "the proxy carried the page: {}",
        proxy.logged()
    );
    // An absence, so observed over a window: Firefox's first twenty seconds.
    tokio::time::sleep_until((launched + std::time::Duration::from_secs(20)).into()).await;
    let hosts = requested_hosts(&proxy.logged());
    assert!(
        hosts.iter().all(|host| host == "127.0.0.1"),
        "only the page went through the proxy: {hosts:?}"
    );
    serve.shutdown().await;
}
