//! What automation users expect of a browser session, with real Chromium:
//! an upstream proxy per instance (a real tinyproxy with Basic auth),
//! downloads, persistent profiles and extensions.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;

use flotilla_testkit::{
    BROWSER_DEADLINE, Page, StatusCode, browser_main_pid, browser_processes, free_port,
    indexed_db_get, indexed_db_put, pooled_browser_dirs, serve_page, spawn_serve_with,
    spawn_serve_with_page, wait_until,
};

const PROXY_USER: &str = "flotilla";
pub(crate) const PROXY_PASSWORD: &str = "s3cret-upstream-password";

/// Debian's tinyproxy on a free loopback port, wanting Basic credentials and
/// logging every connection; stopped on drop.
pub(crate) struct Tinyproxy {
    child: std::process::Child,
    pub(crate) port: u16,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Tinyproxy {
    pub(crate) fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(
            dir.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o777),
        )
        .unwrap();
        let port = free_port();
        let log = dir.path().join("tinyproxy.log");
        let config = dir.path().join("tinyproxy.conf");
        std::fs::write(
            &config,
            format!(
                "Port {port}\nListen 127.0.0.1\nTimeout 60\nUser nobody\nGroup nogroup\n\
                 LogFile \"{}\"\nLogLevel Info\nMaxClients 50\nAllow 127.0.0.1\n\
                 BasicAuth {PROXY_USER} {PROXY_PASSWORD}\n",
                log.display()
            ),
        )
        .unwrap();
        let binary = if std::path::Path::new("/usr/bin/tinyproxy").exists() {
            "/usr/bin/tinyproxy"
        } else {
            "tinyproxy"
        };
        let child = std::process::Command::new(binary)
            .args(["-d", "-c"])
            .arg(&config)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("tinyproxy starts (scripts/install-deps --test installs it)");
        Self {
            child,
            port,
            log,
            _dir: dir,
        }
    }

    /// Waits until it listens.
    pub(crate) async fn listening(&self) {
        let port = self.port;
        wait_until(
            Duration::from_secs(30),
            "tinyproxy to listen",
            || async move {
                Ok::<_, std::convert::Infallible>(
                    tokio::net::TcpStream::connect(("127.0.0.1", port))
                        .await
                        .ok()
                        .map(|_| ()),
                )
            },
        )
        .await
        .unwrap();
    }

    pub(crate) fn logged(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Tinyproxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(crate) fn proxy_body(port: u16, password: &str) -> String {
    format!(
        r#"{{"config": {{"proxy": {{"server": "http://127.0.0.1:{port}", "username": "{PROXY_USER}", "password": "{password}"}}}}}}"#
    )
}

#[tokio::test]
async fn browser_an_upstream_proxy_carries_every_request_and_keeps_its_credentials() {
    let proxy = Tinyproxy::start();
    // The site is reachable only through the proxy: egress opens the proxy,
    // not the site.
    let site = serve_page(&[("/", "<title>via the upstream proxy</title>")]).await;
    let proxy_addr = format!("127.0.0.1:{}", proxy.port);
    let serve = spawn_serve_with(|config| config.agent.egress.allow.push(proxy_addr.clone())).await;
    proxy.listening().await;

    // Bad proxies are 400 naming the field.
    for (body, field) in [
        (
            r#"{"config": {"proxy": {"server": "ftp://127.0.0.1:21"}}}"#,
            "config.proxy.server",
        ),
        (
            r#"{"config": {"proxy": {"server": "http://user:pw@127.0.0.1:3128"}}}"#,
            "config.proxy.server",
        ),
        (
            r#"{"config": {"proxy": {"server": "http://127.0.0.1"}}}"#,
            "config.proxy.server",
        ),
        (
            r#"{"config": {"proxy": {"server": "http://127.0.0.1:3128", "password": "x"}}}"#,
            "config.proxy.password",
        ),
        (
            r#"{"config": {"proxy": {"server": "http://127.0.0.1:3128", "bypass": ["a b"]}}}"#,
            "config.proxy.bypass",
        ),
        (
            r#"{"config": {"proxy": {"server": "http://127.0.0.1:3128", "extra": 1}}}"#,
            "extra",
        ),
    ] {
        let (status, answer) = serve.api.post("/v2/instances", body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {answer}");
        assert!(
            answer["detail"].as_str().unwrap().contains(field),
            "{body}: {answer}"
        );
        // A password written into the URL is not repeated (the message
        // reaches logs and traces).
        assert!(!answer.to_string().contains("user:pw"), "{answer}");
    }

    let launched = std::time::Instant::now();
    let (id, created, detail) = serve
        .api
        .create_running(&proxy_body(proxy.port, PROXY_PASSWORD))
        .await;
    assert_eq!(
        detail["config"]["proxy"]["password"], "********",
        "{detail}"
    );
    assert_eq!(detail["config"]["proxy"]["username"], PROXY_USER);

    let page = Page::open(
        created["urls"]["debug"].as_str().unwrap(),
        &format!("{}/", site.base),
    )
    .await
    .unwrap();
    assert_eq!(
        page.eval("document.title").await.unwrap(),
        "via the upstream proxy"
    );
    let port = site.authority().rsplit_once(':').unwrap().1.to_owned();
    assert!(
        proxy.logged().contains(&format!("127.0.0.1:{port}")),
        "the proxy carried the request: {}",
        proxy.logged()
    );
    assert!(site.requested().contains(&"/".to_owned()));

    // Without the proxy the site is out of reach (egress does not open it),
    // and with wrong credentials the page does not load.
    for body in ["{}".to_owned(), proxy_body(proxy.port, "wrong-password")] {
        let (_, created, _) = serve.api.create_running(&body).await;
        let refused = Page::open(
            created["urls"]["debug"].as_str().unwrap(),
            "data:text/html,x",
        )
        .await
        .unwrap();
        let answer = refused
            .try_navigate(&format!("{}/", site.base))
            .await
            .unwrap();
        assert!(
            answer["errorText"].as_str().is_some_and(|e| !e.is_empty()),
            "{body}: {answer}"
        );
    }

    // The password is nowhere a client or the browser could read it.
    let (_, list) = serve.api.get("/v2/instances").await;
    assert!(!list.to_string().contains(PROXY_PASSWORD));
    assert!(!detail.to_string().contains(PROXY_PASSWORD));
    let version: Value = page
        .call_browser("Browser.getVersion", serde_json::json!({}))
        .await
        .unwrap();
    assert!(!version.to_string().contains(PROXY_PASSWORD));
    let instance_dir = serve.instances_dir().join(&id);
    for pid in browser_processes(&instance_dir) {
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
        for bytes in [cmdline, environ] {
            assert!(
                !String::from_utf8_lossy(&bytes).contains(PROXY_PASSWORD),
                "pid {pid} holds the password"
            );
        }
    }
    let log = std::fs::read_to_string(instance_dir.join("browser.log")).unwrap_or_default();
    assert!(!log.contains(PROXY_PASSWORD));

    // The browser sends nothing of its own through the proxy: Chromium asks
    // its update, time and account servers within seconds of its start
    // unless told not to. An absence, so observed over a window: the first
    // ten seconds of the browsers above.
    tokio::time::sleep_until((launched + Duration::from_secs(10)).into()).await;
    let hosts = requested_hosts(&proxy.logged());
    assert!(!hosts.is_empty(), "{}", proxy.logged());
    assert!(
        hosts.iter().all(|host| host == "127.0.0.1"),
        "only the site went through the proxy: {hosts:?}"
    );
    serve.shutdown().await;
}

/// The host of every request tinyproxy logged (`Request (file descriptor
/// N): CONNECT host:port HTTP/1.1`, or a full URL).
pub(crate) fn requested_hosts(log: &str) -> Vec<String> {
    log.lines()
        .filter_map(|line| {
            line.split_once("Request (file descriptor")
                .map(|(_, rest)| rest)
        })
        .filter_map(|rest| rest.split_once("): ").map(|(_, request)| request))
        .filter_map(|request| request.split_whitespace().nth(1))
        .map(|target| {
            let target = target.split_once("://").map_or(target, |(_, rest)| rest);
            let authority = target.split('/').next().unwrap_or_default();
            authority
                .rsplit_once(':')
                .map_or(authority, |(host, _)| host)
                .to_owned()
        })
        .collect()
}

#[tokio::test]
async fn browser_downloads_are_listed_served_kept_across_park_and_deleted() {
    let receiver =
        flotilla_testkit::EventReceiver::start("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").await;
    let hook = receiver.url.clone();
    let mut serve = spawn_serve_with(|config| {
        config.control.auth_enabled = true;
        config.control.api_keys = vec!["downloads-key".into()];
        config.control.webhooks = vec![flotilla_control_plane::config::WebhookConfig {
            url: hook,
            events: vec![flotilla_api_types::events::EventName::InstanceDownloadCompleted],
            secret: "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".into(),
        }];
    })
    .await;
    serve.api = flotilla_testkit::Api::with_key(serve.api.base.clone(), "downloads-key");
    let (id, created, _) = serve.api.create_running("{}").await;
    let debug = created["urls"]["debug"].as_str().unwrap();

    // Playwright over CDP: the download event and its name; the file itself
    // stays on the node (download.path() cannot reach it).
    let result = flotilla_testkit::run_node(
        "playwright_download.mjs",
        &[debug, "report.csv", "a,b\n1,2\n"],
    )
    .await
    .unwrap();
    assert_eq!(result["suggested"], "report.csv", "{result}");

    let listing = |api: flotilla_testkit::Api, id: String| async move {
        api.get(&format!("/v2/instances/{id}/downloads")).await
    };
    let report = wait_until(
        BROWSER_DEADLINE,
        "the download to be listed complete",
        || async {
            let (status, body) = listing(serve.api.clone(), id.clone()).await;
            let found = body["downloads"]
                .as_array()
                .and_then(|list| {
                    list.iter()
                        .find(|d| d["name"] == "report.csv" && d["state"] == "complete")
                })
                .cloned();
            if status == StatusCode::OK && found.is_some() {
                Ok(found)
            } else {
                Err(body.to_string())
            }
        },
    )
    .await
    .unwrap();
    assert_eq!(report["size_bytes"], 8);
    assert_eq!(report["mime_type"], "text/csv");
    let file = reqwest::Client::new()
        .get(format!(
            "{}/v2/instances/{id}/downloads/report.csv",
            serve.api.base
        ))
        .bearer_auth("downloads-key")
        .send()
        .await
        .unwrap();
    assert_eq!(file.status(), StatusCode::OK);
    assert!(
        file.headers()["content-disposition"]
            .to_str()
            .unwrap()
            .contains("report.csv")
    );
    assert_eq!(file.text().await.unwrap(), "a,b\n1,2\n");

    // The event reached the webhook.
    wait_until(
        Duration::from_secs(60),
        "instance.download_completed",
        || async {
            let found = receiver.events().into_iter().any(|e| {
                e.payload["event"] == "instance.download_completed"
                    && e.payload["data"]["name"] == "report.csv"
                    && e.payload["data"]["instance_id"] == id.as_str()
            });
            Ok::<_, String>(found.then_some(()))
        },
    )
    .await
    .unwrap();

    // Bad names, unknown names, no credential.
    for (name, status) in [
        ("..%2F..%2Fetc%2Fpasswd", StatusCode::BAD_REQUEST),
        ("..%2Fsecret", StatusCode::BAD_REQUEST),
        (".hidden", StatusCode::BAD_REQUEST),
        ("missing.csv", StatusCode::NOT_FOUND),
    ] {
        let (got, body) = serve
            .api
            .get(&format!("/v2/instances/{id}/downloads/{name}"))
            .await;
        assert_eq!(got, status, "{name}: {body}");
        assert!(body["code"].is_string(), "{name}: {body}");
    }
    let anonymous = reqwest::get(format!("{}/v2/instances/{id}/downloads", serve.api.base))
        .await
        .unwrap();
    assert_eq!(anonymous.status(), StatusCode::UNAUTHORIZED);

    // Parked and revived: the download is still there.
    serve.api.park(&id).await;
    let (_, while_parked) = listing(serve.api.clone(), id.clone()).await;
    assert!(
        while_parked.to_string().contains("report.csv"),
        "{while_parked}"
    );
    serve.api.revive(&id).await;
    serve
        .api
        .wait_for_status(&id, "running", BROWSER_DEADLINE)
        .await;
    let (_, revived) = listing(serve.api.clone(), id.clone()).await;
    assert!(revived.to_string().contains("report.csv"), "{revived}");

    let (status, _) = serve
        .api
        .delete(&format!("/v2/instances/{id}/downloads/report.csv"))
        .await;
    assert_eq!(status, StatusCode::OK);
    let (_, after) = listing(serve.api.clone(), id.clone()).await;
    assert_eq!(after["downloads"], serde_json::json!([]));
    let downloads_dir = serve.instances_dir().join(&id).join("downloads");
    assert!(downloads_dir.is_dir());
    serve.api.delete_instance(&id).await;
    assert!(!downloads_dir.exists(), "downloads go with the instance");
    serve.shutdown().await;
}

/// The profile's saved state, once its `updated_at` moves past `after`.
async fn profile_saved_after(api: &flotilla_testkit::Api, name: &str, after: &str) -> Value {
    wait_until(
        BROWSER_DEADLINE,
        "the profile to be written back",
        || async {
            let (status, profile) = api.get(&format!("/v2/profiles/{name}")).await;
            let time = |text: &str| chrono::DateTime::parse_from_rfc3339(text).ok();
            let saved = status == StatusCode::OK
                && profile["size_bytes"].as_u64().unwrap_or(0) > 0
                && time(profile["updated_at"].as_str().unwrap_or("")) > time(after);
            if saved {
                Ok(Some(profile))
            } else {
                Err(profile.to_string())
            }
        },
    )
    .await
    .unwrap()
}

/// Starts an instance on `profile` and opens `url` in it.
async fn start_on_profile(
    api: &flotilla_testkit::Api,
    profile: &str,
    persist: bool,
    url: &str,
) -> (String, Page) {
    let (id, created, got) = api
        .create_running(&format!(
            r#"{{"profile": {{"name": "{profile}", "persist": {persist}}}}}"#
        ))
        .await;
    assert_eq!(got["profile"]["name"], profile, "{got}");
    assert_eq!(got["profile"]["persist"], persist, "{got}");
    let page = Page::open(created["urls"]["debug"].as_str().unwrap(), url)
        .await
        .unwrap();
    (id, page)
}

const READ_STATE: &str = "JSON.stringify([document.cookie, localStorage.getItem('cart')])";

/// The page shows the login's persistent and session cookies and `cart`.
async fn assert_logged_in_with_cart(page: &Page, cart: &str) {
    let state: Value =
        serde_json::from_str(page.eval(READ_STATE).await.unwrap().as_str().unwrap()).unwrap();
    let cookies = state[0].as_str().unwrap();
    assert!(cookies.contains("login=alice"), "{state}");
    assert!(cookies.contains("visit=1"), "session cookies too: {state}");
    assert_eq!(state[1], cart, "{state}");
}

#[tokio::test]
async fn browser_a_persistent_profile_carries_cookies_and_storage_across_instances() {
    let (site, serve) = spawn_serve_with_page("<title>shop</title>", |_| {}).await;
    let api = &serve.api;
    let url = format!("{}/", site.base);

    // Names are checked; a name is taken once; unknown profiles are 400.
    for name in ["", "../etc", "a/b", ".hidden", "spa ce", &"x".repeat(65)] {
        let (status, body) = api
            .post(
                "/v2/profiles",
                &serde_json::json!({ "name": name }).to_string(),
            )
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{name:?}: {body}");
    }
    let (status, body) = api.post("/v2/profiles", r#"{"name": "shop"}"#).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(body["size_bytes"], 0);
    let created_at = body["updated_at"].as_str().unwrap().to_owned();
    let (status, _) = api.post("/v2/profiles", r#"{"name": "shop"}"#).await;
    assert_eq!(status, StatusCode::CONFLICT);
    let (status, body) = api
        .post("/v2/instances", r#"{"profile": {"name": "nope"}}"#)
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(body["detail"].as_str().unwrap().contains("profile.name"));

    // A: a login leaves a persistent and a session cookie and a cart; parking
    // writes them back.
    let (a, page) = start_on_profile(api, "shop", true, &url).await;
    page.eval(
        "document.cookie = 'login=alice; max-age=86400'; document.cookie = 'visit=1'; \
         localStorage.setItem('cart', 'two apples'); true",
    )
    .await
    .unwrap();
    api.park(&a).await;
    let parked = profile_saved_after(api, "shop", &created_at).await;
    // One writer at a time.
    let (status, body) = api
        .post(
            "/v2/instances",
            r#"{"profile": {"name": "shop", "persist": true}}"#,
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert!(body["detail"].as_str().unwrap().contains(&a), "{body}");
    let (status, _) = api.delete("/v2/profiles/shop").await;
    assert_eq!(status, StatusCode::CONFLICT);
    api.delete_instance(&a).await;

    // B starts where A left off, changes the cart, and a graceful delete
    // writes it back.
    let (b, page) = start_on_profile(api, "shop", true, &url).await;
    assert_logged_in_with_cart(&page, "two apples").await;
    page.eval("localStorage.setItem('cart', 'three pears'); true")
        .await
        .unwrap();
    drop(page);
    api.delete_instance(&b).await;
    profile_saved_after(api, "shop", parked["updated_at"].as_str().unwrap()).await;

    // C reads it without writing back; the profile can go meanwhile.
    let (c, page) = start_on_profile(api, "shop", false, &url).await;
    let state: Value =
        serde_json::from_str(page.eval(READ_STATE).await.unwrap().as_str().unwrap()).unwrap();
    assert!(
        state[0].as_str().unwrap().contains("login=alice"),
        "{state}"
    );
    assert_eq!(state[1], "three pears");
    let (status, body) = api.delete("/v2/profiles/shop").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, _) = api.get("/v2/profiles/shop").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (_, list) = api.get("/v2/profiles").await;
    assert_eq!(list["profiles"], serde_json::json!([]));
    drop(page);
    api.delete_instance(&c).await;
    serve.shutdown().await;
}

/// A zip of `entries` (name, content), as an uploader would make it.
pub(crate) fn zip_of(entries: &[(&str, &str)]) -> Vec<u8> {
    use std::io::Write;
    let mut zip = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let options = zip::write::SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Deflated);
    for (name, content) in entries {
        zip.start_file(*name, options).unwrap();
        zip.write_all(content.as_bytes()).unwrap();
    }
    zip.finish().unwrap().into_inner()
}

pub(crate) const MARKER_MANIFEST: &str = r#"{"manifest_version": 3, "name": "Marker", "version": "1.0",
  "content_scripts": [{"matches": ["<all_urls>"], "js": ["content.js"], "run_at": "document_end"}]}"#;
pub(crate) const MARKER_SCRIPT: &str =
    "document.title = 'changed-by-extension'; document.body.dataset.marker = 'on';";
const READ_MARKER: &str = "document.title + ' ' + document.body.dataset.marker";

/// Opens `url` and waits for the extension's content script to mark the page.
async fn marked_page(debug_url: &str, url: &str) -> Page {
    let page = Page::open(debug_url, url).await.unwrap();
    wait_until(
        BROWSER_DEADLINE,
        "the content script to change the page",
        || async {
            let seen = page.eval(READ_MARKER).await.map_err(|e| e.to_string())?;
            match seen.as_str() {
                Some("changed-by-extension on") => Ok(Some(())),
                _ => Err(seen.to_string()),
            }
        },
    )
    .await
    .unwrap();
    page
}

#[tokio::test]
async fn browser_an_uploaded_extension_changes_pages_and_survives_park_and_revive() {
    let (site, serve) =
        spawn_serve_with_page("<title>original</title><body>page</body>", |_| {}).await;
    let api = &serve.api;
    let url = format!("{}/", site.base);

    // What is not a loadable extension is refused, saying why.
    let marker = zip_of(&[
        ("marker/manifest.json", MARKER_MANIFEST),
        ("marker/content.js", MARKER_SCRIPT),
    ]);
    let (status, body) = api
        .post_bytes("/v2/extensions", "application/json", marker.clone())
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(body["detail"].as_str().unwrap().contains("application/zip"));
    for (zip, reason) in [
        (b"PK\x03\x04 not really".to_vec(), "not a zip"),
        (zip_of(&[("content.js", MARKER_SCRIPT)]), "no manifest.json"),
        (
            zip_of(&[("manifest.json", MARKER_MANIFEST), ("../../evil.js", "1")]),
            "plain relative path",
        ),
        (
            zip_of(&[(
                "manifest.json",
                r#"{"manifest_version": 2, "name": "Old", "version": "1"}"#,
            )]),
            "manifest_version 2",
        ),
    ] {
        let (status, body) = api
            .post_bytes("/v2/extensions", "application/zip", zip)
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{reason}: {body}");
        assert_eq!(body["code"], "invalid_request");
        assert!(
            body["detail"].as_str().unwrap().contains(reason),
            "{reason}: {body}"
        );
    }
    let (status, body) = api
        .post_bytes(
            "/v2/extensions",
            "application/zip",
            vec![0; 50 * 1024 * 1024 + 1],
        )
        .await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{body}");
    assert_eq!(body["code"], "payload_too_large");

    // A good one: id, name and version from its manifest.
    let (status, uploaded) = api
        .post_bytes("/v2/extensions", "application/zip", marker.clone())
        .await;
    assert_eq!(status, StatusCode::CREATED, "{uploaded}");
    assert_eq!(uploaded["name"], "Marker");
    assert_eq!(uploaded["version"], "1.0");
    assert_eq!(uploaded["size_bytes"], marker.len());
    let id = uploaded["id"].as_str().unwrap().to_owned();
    let (_, list) = api.get("/v2/extensions").await;
    assert_eq!(list["extensions"][0]["id"], id.as_str(), "{list}");
    let (status, _) = api.get(&format!("/v2/extensions/{id}")).await;
    assert_eq!(status, StatusCode::OK);

    // config.extensions names uploaded extensions, on an image that loads them.
    for (body, reason) in [
        (
            r#"{"config": {"extensions": ["../../etc"]}}"#.to_owned(),
            "config.extensions",
        ),
        (
            r#"{"config": {"extensions": ["0192f7a0-5b1c-7d2e-8f3a-0123456789ab"]}}"#.to_owned(),
            "no extension",
        ),
        (
            format!(r#"{{"config": {{"extensions": ["{id}", "{id}"]}}}}"#),
            "twice",
        ),
        (
            format!(
                r#"{{"image": "chromium-headless-shell", "config": {{"extensions": ["{id}"]}}}}"#
            ),
            "headless shell",
        ),
    ] {
        let (status, answer) = api.post("/v2/instances", &body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {answer}");
        assert!(
            answer["detail"].as_str().unwrap().contains(reason),
            "{body}: {answer}"
        );
    }
    let (_, instances) = api.get("/v2/instances").await;
    assert_eq!(
        instances["total"], 0,
        "refused creates leave nothing: {instances}"
    );

    // Loaded: its content script changes the page, before and after a park.
    let created = api
        .create(&format!(
            r#"{{"image": "chromium", "config": {{"extensions": ["{id}"]}}}}"#
        ))
        .await;
    let instance = created["id"].as_str().unwrap().to_owned();
    let got = api
        .wait_for_status(&instance, "running", BROWSER_DEADLINE)
        .await;
    assert_eq!(got["config"]["extensions"][0], id.as_str(), "{got}");
    let debug = created["urls"]["debug"].as_str().unwrap().to_owned();
    drop(marked_page(&debug, &url).await);
    api.park(&instance).await;
    let (status, body) = api
        .post(&format!("/v2/instances/{instance}/revive"), "")
        .await;
    assert!(status.is_success(), "{body}");
    api.wait_for_status(&instance, "running", BROWSER_DEADLINE)
        .await;
    drop(marked_page(&debug, &url).await);

    // In use, it stays (and names that are not ids, such as LIKE wildcards
    // or the id in upper case, match nothing); afterwards it goes.
    for name in ["%25", "_", &id.to_uppercase()] {
        let (status, body) = api.delete(&format!("/v2/extensions/{name}")).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{name}: {body}");
    }
    let (status, body) = api.delete(&format!("/v2/extensions/{id}")).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert!(
        body["detail"].as_str().unwrap().contains(&instance),
        "{body}"
    );
    api.delete_instance(&instance).await;
    let (status, body) = api.delete(&format!("/v2/extensions/{id}")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, _) = api.get(&format!("/v2/extensions/{id}")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    serve.shutdown().await;
}

/// The shop's receipt, kept only in the profile's IndexedDB.
fn store_indexed() -> String {
    indexed_db_put("shop", "last", "receipt")
}

fn read_indexed() -> String {
    indexed_db_get("shop", "last")
}

#[tokio::test]
async fn browser_a_profile_takes_a_warm_browser_unless_it_holds_what_only_files_carry() {
    let (site, serve) = spawn_serve_with_page("<title>shop</title>", |config| {
        config.agent.warm_pool_size = 1;
    })
    .await;
    let warnings = serve.serve().agent.warnings();
    assert!(
        warnings.iter().all(|w| !w.contains("bubblewrap")),
        "this test needs bubblewrap (scripts/install-deps sets it up): {warnings:?}"
    );
    let (api, agent) = (&serve.api, serve.serve().agent.clone());
    let instances = serve.instances_dir();
    let url = format!("{}/", site.base);
    // The pooled browser (its directory and main process) once the pool is full.
    let pooled = || async {
        serve.wait_for_warm_pool(1, "the warm pool to fill").await;
        let [dir] = pooled_browser_dirs(&instances).try_into().unwrap();
        let pid = browser_main_pid(&dir).expect("the pooled browser runs");
        (dir, pid)
    };
    let (status, body) = api.post("/v2/profiles", r#"{"name": "shop"}"#).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let mut saved_at = body["updated_at"].as_str().unwrap().to_owned();

    // A: a profile with nothing saved yet loses nothing in a warm browser.
    let (dir, pid) = pooled().await;
    let (a, page) = start_on_profile(api, "shop", true, &url).await;
    assert!(!dir.exists(), "the pooled browser became A's");
    assert_eq!(browser_main_pid(&dir), Some(pid));
    page.eval(
        "document.cookie = 'login=alice; max-age=86400'; document.cookie = 'visit=1'; \
         localStorage.setItem('cart', 'two apples'); true",
    )
    .await
    .unwrap();
    drop(page);
    api.delete_instance(&a).await;
    saved_at = profile_saved_after(api, "shop", &saved_at).await["updated_at"]
        .as_str()
        .unwrap()
        .to_owned();

    // B reads it without writing back, and cookies and localStorage are all
    // the profile holds: a warm browser again, given them over CDP.
    let (dir, pid) = pooled().await;
    let (b, page) = start_on_profile(api, "shop", false, &url).await;
    assert!(!dir.exists(), "the pooled browser became B's");
    assert_eq!(browser_main_pid(&dir), Some(pid));
    assert_logged_in_with_cart(&page, "two apples").await;
    drop(page);
    api.delete_instance(&b).await;

    // C writes back to a profile with saved state: a warm browser's fresh
    // history and permissions would replace the profile's for good, so C
    // launches on the profile's files.
    let (dir, pid) = pooled().await;
    let (c, page) = start_on_profile(api, "shop", true, &url).await;
    assert!(dir.exists(), "the pooled browser was not taken");
    assert_eq!(browser_main_pid(&dir), Some(pid));
    assert_eq!(page.eval(&store_indexed()).await.unwrap(), true);
    drop(page);
    api.delete_instance(&c).await;
    profile_saved_after(api, "shop", &saved_at).await;

    // D reads it only, but IndexedDB is only in the profile's files: D
    // launches on them too, and the pooled browser stays in the pool.
    let (dir, pid) = pooled().await;
    let (d, page) = start_on_profile(api, "shop", false, &url).await;
    assert!(dir.exists(), "the pooled browser was not taken");
    assert_eq!(browser_main_pid(&dir), Some(pid));
    assert_eq!(agent.warm_pool_ready(), 1);
    assert_eq!(page.eval(&read_indexed()).await.unwrap(), "receipt");
    let state: Value =
        serde_json::from_str(page.eval(READ_STATE).await.unwrap().as_str().unwrap()).unwrap();
    assert!(
        state[0].as_str().unwrap().contains("login=alice"),
        "{state}"
    );
    drop(page);
    crate::browser_runtime::wait_for_metrics(&serve, "2 warm hits and 2 misses", |metrics| {
        let count = |outcome| {
            let labels = [("image", "ubuntu:22.04"), ("outcome", outcome)];
            crate::operations::sample_value(metrics, "service_warm_pool_creates_total", &labels)
        };
        count("hit") == Some(2.0) && count("miss") == Some(2.0)
    })
    .await;
    api.delete_instance(&d).await;
    serve.shutdown().await;
    assert!(
        browser_processes(&instances).is_empty(),
        "no browser outlives the agent"
    );
}
