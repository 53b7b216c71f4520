//! The front door: every instance through the control plane's own port, by
//! path and by subdomain, with real Chromium and real clients (Playwright,
//! Puppeteer, chrome-remote-interface, a browser), authentication on.

use std::time::Duration;

use serde_json::Value;

use flotilla_testkit::{
    Api, StatusCode, TestServe, free_port, run_node, run_node_with, spawn_serve_with,
    upgrade_status, wait_until, workspace_root,
};

const API_KEY: &str = "door-api-key-0123456789";
const DOMAIN: &str = "browsers.test";
const PAGE: &str = "data:text/html,<title>through the front door</title>";

/// `serve` with authentication on, listening on a known port, its public URL
/// that port, and `base_domain` when asked.
async fn door_serve(base_domain: Option<&str>) -> (TestServe, u16) {
    let port = free_port();
    let mut serve = spawn_serve_with(|config| {
        config.listen = format!("127.0.0.1:{port}");
        config.control.auth_enabled = true;
        config.control.api_keys = vec![API_KEY.into()];
        config.control.public_url = Some(format!("http://127.0.0.1:{port}"));
        config.control.gateway.base_domain = base_domain.map(str::to_owned);
    })
    .await;
    serve.api = Api::with_key(serve.api.base.clone(), API_KEY);
    (serve, port)
}

async fn running(serve: &TestServe) -> Value {
    let (_, created, instance) = serve.api.create_running("{}").await;
    assert_eq!(instance["urls"], created["urls"]);
    instance
}

fn token(instance: &Value) -> String {
    instance["urls"]["debug"]
        .as_str()
        .unwrap()
        .split_once("?token=")
        .unwrap()
        .1
        .to_owned()
}

async fn get(url: &str, headers: &[(&str, &str)]) -> reqwest::Response {
    let mut request = reqwest::Client::new().get(url);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    request.send().await.expect("the door answers")
}

/// The browser's CDP address a `/json/version` answer gives.
async fn debugger_url(url: &str, headers: &[(&str, &str)]) -> String {
    let version: Value = get(url, headers).await.json().await.unwrap();
    version["webSocketDebuggerUrl"].as_str().unwrap().to_owned()
}

/// The door's addresses an instance's record gives for CDP and the live view.
fn assert_urls(instance: &Value, debug: String, stream: String) {
    assert_eq!(instance["urls"]["debug"], debug);
    assert_eq!(instance["urls"]["stream"], stream);
}

/// Waits until instance `id`'s view shows `drivers`.
async fn wait_for_drivers(serve: &TestServe, id: &str, drivers: Value) {
    wait_until(
        Duration::from_secs(60),
        "the instance's drivers",
        || async {
            let (_, instance) = serve.api.get(&format!("/v2/instances/{id}")).await;
            let (_, list) = serve.api.get("/v2/instances").await;
            let listed = list["instances"]
                .as_array()
                .and_then(|items| items.iter().find(|item| item["id"] == id))
                .map(|item| item["drivers"].clone());
            if instance["drivers"] == drivers && listed.as_ref() == Some(&drivers) {
                Ok(Some(()))
            } else {
                Err(format!("get {} list {listed:?}", instance["drivers"]))
            }
        },
    )
    .await
    .unwrap();
}

#[tokio::test]
async fn browser_an_instance_shows_the_cdp_and_playwright_clients_that_drive_it() {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let (serve, _) = door_serve(None).await;
    let a = running(&serve).await;
    let id = a["id"].as_str().unwrap();
    let none =
        serde_json::json!({"cdp": 0, "playwright": 0, "webdriver": 0, "mcp": 0, "actions": 0});
    wait_for_drivers(&serve, id, none.clone()).await;
    // A CDP client through the door, one on the instance's own port, and a
    // Playwright client (its handshake names its version).
    let door = a["urls"]["debug"].as_str().unwrap();
    let own_port = format!(
        "ws://127.0.0.1:{}/devtools/browser/{id}?token={}",
        a["debug_port"],
        token(&a)
    );
    let (through_door, _) = tokio_tungstenite::connect_async(door).await.unwrap();
    let (on_own_port, _) = tokio_tungstenite::connect_async(&own_port).await.unwrap();
    let mut request = a["urls"]["playwright"]
        .as_str()
        .unwrap()
        .into_client_request()
        .unwrap();
    request.headers_mut().insert(
        "user-agent",
        "Playwright/1.65.1 (x64; debian 12) node/22.23"
            .parse()
            .unwrap(),
    );
    let (playwright, _) = tokio_tungstenite::connect_async(request).await.unwrap();
    let mut driven = none.clone();
    driven["cdp"] = 2.into();
    driven["playwright"] = 1.into();
    wait_for_drivers(&serve, id, driven).await;
    // Each client that leaves is no longer counted.
    drop((through_door, on_own_port, playwright));
    wait_for_drivers(&serve, id, none).await;
    serve.shutdown().await;
}

#[tokio::test]
async fn browser_clients_reach_instances_through_the_door_by_path() {
    let (serve, port) = door_serve(None).await;
    let a = running(&serve).await;
    let b = running(&serve).await;
    let id = a["id"].as_str().unwrap();
    let (token_a, token_b) = (token(&a), token(&b));
    let door = format!("http://127.0.0.1:{port}/v2/instances/{id}");
    assert_urls(
        &a,
        format!("ws://127.0.0.1:{port}/v2/instances/{id}/cdp?token={token_a}"),
        format!("{door}/stream?token={token_a}"),
    );
    // The spec's ports stay.
    assert!(a["debug_port"].as_u64().is_some() && a["stream_port"].as_u64().is_some());

    // Refused without a credential, with a wrong or another instance's token.
    for (path, headers) in [
        (format!("{door}/json/version"), vec![]),
        (format!("{door}/json/version?token={token_b}"), vec![]),
        (
            format!("{door}/tabs"),
            vec![("authorization", "Bearer nope")],
        ),
        (format!("{door}/stream/frame.jpg"), vec![]),
    ] {
        let response = get(&path, &headers).await;
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED, "{path}");
        let body: Value = response.json().await.unwrap();
        assert_eq!(body["code"], "unauthorized");
    }
    assert!(
        upgrade_status(port, &format!("/v2/instances/{id}/cdp"))
            .await
            .contains(" 401 ")
    );
    assert!(
        upgrade_status(port, &format!("/v2/instances/{id}/cdp?token={token_a}"))
            .await
            .contains(" 101 ")
    );

    // Discovery answers point back through the door, with the token.
    let ws = debugger_url(&format!("{door}/json/version?token={token_a}"), &[]).await;
    assert!(
        ws.starts_with(&format!(
            "ws://127.0.0.1:{port}/v2/instances/{id}/devtools/browser/"
        )),
        "{ws}"
    );
    assert!(ws.ends_with(&format!("?token={token_a}")), "{ws}");
    // Forwarding headers count only from trusted proxies (none here).
    let spoofed_ws = debugger_url(
        &format!("{door}/json/version?token={token_a}"),
        &[
            ("x-forwarded-host", "evil.example"),
            ("x-forwarded-proto", "https"),
        ],
    )
    .await;
    assert!(
        spoofed_ws.starts_with(&format!("ws://127.0.0.1:{port}/")),
        "{spoofed_ws}"
    );
    let with_slash = get(
        &format!("{door}/json/version/"),
        &[("authorization", &format!("Bearer {API_KEY}"))],
    )
    .await;
    assert_eq!(with_slash.status(), StatusCode::OK);

    // Playwright (ws and http forms), Puppeteer, chrome-remote-interface.
    let debug = a["urls"]["debug"].as_str().unwrap();
    let http_form = format!("{door}?token={token_a}");
    for (script, endpoint) in [
        ("playwright_title.mjs", debug),
        ("puppeteer_title.mjs", debug),
        ("playwright_title.mjs", &http_form),
    ] {
        let result = run_node(script, &[endpoint, PAGE]).await.unwrap();
        assert_eq!(
            result["title"], "through the front door",
            "{script} {endpoint}"
        );
    }
    let prefix = format!("/v2/instances/{id}");
    let result = run_node(
        "cri_title.mjs",
        &["127.0.0.1", &port.to_string(), &prefix, &token_a, PAGE],
    )
    .await
    .unwrap();
    assert_eq!(result["title"], "through the front door");
    // Given urls.debug alone, chrome-remote-interface fetches the protocol
    // from the door's root: it is there, open, for the fleet's Chromium.
    let result = run_node("cri_ws.mjs", &[a["urls"]["debug"].as_str().unwrap()])
        .await
        .unwrap();
    assert!(
        result["product"].as_str().unwrap().contains("Chrome/"),
        "{result}"
    );
    let version: Value = get(&format!("http://127.0.0.1:{port}/json/version"), &[])
        .await
        .json()
        .await
        .unwrap();
    assert!(
        version["Browser"].as_str().unwrap().contains("Chrom"),
        "{version}"
    );
    assert!(version.get("webSocketDebuggerUrl").is_none(), "{version}");

    // Live view, screenshot, tabs.
    let stream = get(a["urls"]["stream"].as_str().unwrap(), &[]).await;
    assert_eq!(stream.status(), StatusCode::OK);
    assert!(
        stream.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("multipart/x-mixed-replace"),
    );
    drop(stream);
    let shot = get(&format!("{door}/screenshot?token={token_a}"), &[]).await;
    assert_eq!(shot.status(), StatusCode::OK);
    assert!(shot.bytes().await.unwrap().starts_with(b"\x89PNG"));
    let tabs: Value = get(&format!("{door}/tabs?token={token_a}"), &[])
        .await
        .json()
        .await
        .unwrap();
    assert!(tabs.as_array().is_some_and(|t| !t.is_empty()), "{tabs}");

    // Traffic through the door is activity.
    let before = serve.api.get(&format!("/v2/instances/{id}")).await.1["activity"]["last_activity"]
        .as_str()
        .unwrap()
        .to_owned();
    get(&format!("{door}/json/list?token={token_a}"), &[]).await;
    wait_until(
        Duration::from_secs(30),
        "the door's traffic to count",
        || async {
            let (_, detail) = serve.api.get(&format!("/v2/instances/{id}")).await;
            let now = detail["activity"]["last_activity"]
                .as_str()
                .unwrap_or("")
                .to_owned();
            if now > before { Ok(Some(())) } else { Err(now) }
        },
    )
    .await
    .unwrap();

    // An unknown instance is 404 with a key, 401 with a token (no oracle).
    let unknown = "/v2/instances/01a20000-0000-7000-8000-000000000000";
    let response = get(
        &format!("http://127.0.0.1:{port}{unknown}/json/version"),
        &[("authorization", &format!("Bearer {API_KEY}"))],
    )
    .await;
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
    let response = get(
        &format!("http://127.0.0.1:{port}{unknown}/json/version?token={token_a}"),
        &[],
    )
    .await;
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    serve.shutdown().await;
}

#[tokio::test]
async fn browser_each_instance_has_an_origin_of_its_own_by_subdomain() {
    let (serve, port) = door_serve(Some(DOMAIN)).await;
    let a = running(&serve).await;
    let id = a["id"].as_str().unwrap();
    let sub = a["subdomain"].as_str().unwrap();
    let token_a = token(&a);
    let host = format!("{sub}.{DOMAIN}:{port}");
    assert_urls(
        &a,
        format!("ws://{host}/devtools/browser/{id}?token={token_a}"),
        format!("http://{host}/stream?token={token_a}"),
    );

    // The Host header routes; the answer points back at the same origin.
    let base = format!("http://127.0.0.1:{port}");
    let ws = debugger_url(
        &format!("{base}/json/version?token={token_a}"),
        &[("host", &host)],
    )
    .await;
    assert!(
        ws.starts_with(&format!("ws://{host}/devtools/browser/")),
        "{ws}"
    );
    let refused = get(&format!("{base}/json/version"), &[("host", &host)]).await;
    assert_eq!(refused.status(), StatusCode::UNAUTHORIZED);
    let elsewhere = get(&format!("{base}/"), &[("host", &host)]).await;
    assert_eq!(
        elsewhere.status(),
        StatusCode::NOT_FOUND,
        "nothing but the instance there"
    );

    // Node clients resolve *.browsers.test as a wildcard record would.
    let resolver = workspace_root().join("tests/js/door_resolver.cjs");
    let node_options = format!("--require {}", resolver.display());
    let env = [
        ("NODE_OPTIONS", node_options.as_str()),
        ("FLOTILLA_TEST_DOMAIN", DOMAIN),
    ];
    let debug = a["urls"]["debug"].as_str().unwrap();
    for script in ["playwright_title.mjs", "puppeteer_title.mjs"] {
        let result = run_node_with(script, &[debug, PAGE], &env).await.unwrap();
        assert_eq!(result["title"], "through the front door", "{script}");
    }
    let cri_host = format!("{sub}.{DOMAIN}");
    let result = run_node_with(
        "cri_title.mjs",
        &[&cri_host, &port.to_string(), "-", &token_a, PAGE],
        &env,
    )
    .await
    .unwrap();
    assert_eq!(result["title"], "through the front door");
    // A browser (Chromium's --host-resolver-rules) opens the instance's origin.
    let result = run_node(
        "browser_fetch.mjs",
        &[DOMAIN, &format!("http://{host}/tabs?token={token_a}")],
    )
    .await
    .unwrap();
    assert_eq!(result["status"], 200, "{result}");
    assert!(
        result["text"].as_str().unwrap().contains("\"id\""),
        "{result}"
    );
    serve.shutdown().await;
}

#[tokio::test]
async fn browser_a_connection_through_the_door_wakes_a_parked_instance() {
    let (serve, _) = door_serve(None).await;
    let a = running(&serve).await;
    let id = a["id"].as_str().unwrap();
    let parked = serve.api.park(id).await;
    assert_eq!(parked["status"], "dormant");
    let debug = a["urls"]["debug"].as_str().unwrap();
    let result = run_node("playwright_title.mjs", &[debug, PAGE])
        .await
        .unwrap();
    assert_eq!(result["title"], "through the front door");
    let (_, detail) = serve.api.get(&format!("/v2/instances/{id}")).await;
    assert_eq!(detail["status"], "running", "{detail}");
    serve.shutdown().await;
}

/// nginx (Debian's) terminating TLS with a self-signed certificate in front
/// of a control plane; stopped on drop.
struct TlsProxy {
    child: std::process::Child,
    port: u16,
    cert: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl TlsProxy {
    fn start(upstream_port: u16) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path();
        let (cert, key) = (path.join("cert.pem"), path.join("key.pem"));
        let made = std::process::Command::new("openssl")
            .args([
                "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
            ])
            .args([
                "-subj",
                "/CN=127.0.0.1",
                "-addext",
                "subjectAltName=IP:127.0.0.1,DNS:localhost",
            ])
            .arg("-keyout")
            .arg(&key)
            .arg("-out")
            .arg(&cert)
            .output()
            .expect("openssl runs");
        assert!(
            made.status.success(),
            "{}",
            String::from_utf8_lossy(&made.stderr)
        );
        let temp = path.join("temp");
        std::fs::create_dir_all(&temp).unwrap();
        let port = free_port();
        let p = path.display();
        let config = format!(
            "worker_processes 1;\npid {p}/nginx.pid;\nerror_log {p}/error.log;\ndaemon off;\n\
             events {{ worker_connections 256; }}\n\
             http {{\n  access_log off;\n  client_body_temp_path {p}/temp/body;\n  proxy_temp_path {p}/temp/proxy;\n\
               fastcgi_temp_path {p}/temp/fastcgi;\n  uwsgi_temp_path {p}/temp/uwsgi;\n  scgi_temp_path {p}/temp/scgi;\n\
               map $http_upgrade $connection_upgrade {{ default upgrade; '' close; }}\n\
               server {{\n    listen 127.0.0.1:{port} ssl;\n    ssl_certificate {p}/cert.pem;\n    ssl_certificate_key {p}/key.pem;\n\
                 location / {{\n      proxy_pass http://127.0.0.1:{upstream_port};\n      proxy_http_version 1.1;\n\
                   proxy_set_header Host $http_host;\n      proxy_set_header X-Forwarded-Host $http_host;\n\
                   proxy_set_header X-Forwarded-Proto https;\n      proxy_set_header Upgrade $http_upgrade;\n\
                   proxy_set_header Connection $connection_upgrade;\n      proxy_buffering off;\n      proxy_read_timeout 3600s;\n    }}\n  }}\n}}\n"
        );
        std::fs::write(path.join("nginx.conf"), config).unwrap();
        let nginx = if std::path::Path::new("/usr/sbin/nginx").exists() {
            "/usr/sbin/nginx"
        } else {
            "nginx"
        };
        let child = std::process::Command::new(nginx)
            .arg("-p")
            .arg(path)
            .arg("-c")
            .arg(path.join("nginx.conf"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("nginx starts (scripts/install-deps --test installs it)");
        Self {
            child,
            port,
            cert,
            _dir: dir,
        }
    }
}

impl Drop for TlsProxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test]
async fn browser_clients_reach_instances_over_tls_through_nginx() {
    let port = free_port();
    let tls = TlsProxy::start(port);
    let public_url = format!("https://127.0.0.1:{}", tls.port);
    let mut serve = spawn_serve_with(|config| {
        config.listen = format!("127.0.0.1:{port}");
        config.control.auth_enabled = true;
        config.control.api_keys = vec![API_KEY.into()];
        config.control.public_url = Some(public_url.clone());
        config.control.trusted_proxies = vec!["127.0.0.1".into()];
    })
    .await;
    serve.api = Api::with_key(serve.api.base.clone(), API_KEY);
    wait_until(Duration::from_secs(30), "nginx to listen", || async {
        Ok::<_, std::convert::Infallible>(
            tokio::net::TcpStream::connect(("127.0.0.1", tls.port))
                .await
                .ok()
                .map(|_| ()),
        )
    })
    .await
    .unwrap();
    let a = running(&serve).await;
    let id = a["id"].as_str().unwrap();
    let token_a = token(&a);
    let debug = a["urls"]["debug"].as_str().unwrap();
    assert_eq!(
        debug,
        format!(
            "wss://127.0.0.1:{}/v2/instances/{id}/cdp?token={token_a}",
            tls.port
        )
    );
    let cert = tls.cert.display().to_string();
    let env = [("NODE_EXTRA_CA_CERTS", cert.as_str())];
    for script in ["playwright_title.mjs", "puppeteer_title.mjs"] {
        let result = run_node_with(script, &[debug, PAGE], &env).await.unwrap();
        assert_eq!(
            result["title"], "through the front door",
            "{script} over wss"
        );
    }
    // Playwright given the https form reads /json/version/ through nginx; the
    // answer's URL is wss:// on nginx's host (X-Forwarded-* from a trusted proxy).
    let http_form = format!("{public_url}/v2/instances/{id}?token={token_a}");
    let result = run_node_with("playwright_title.mjs", &[&http_form, PAGE], &env)
        .await
        .unwrap();
    assert_eq!(result["title"], "through the front door");
    serve.shutdown().await;
}

/// schemathesis over the front door's operations with a real browser behind
/// them (`tests/schemathesis-door.toml`): every answer is one the OpenAPI
/// document describes, whatever the input. A fixed seed keeps it reproducible.
#[tokio::test]
async fn browser_the_front_door_keeps_its_openapi_contract_under_schemathesis() {
    let (serve, _) = door_serve(None).await;
    let instance = running(&serve).await;
    let id = instance["id"].as_str().unwrap();
    let scratch = tempfile::tempdir().unwrap();
    let output = tokio::process::Command::new("schemathesis")
        .current_dir(scratch.path())
        .env("FLOTILLA_DOOR_INSTANCE", id)
        .arg("--config-file")
        .arg(workspace_root().join("tests/schemathesis-door.toml"))
        .arg("run")
        .arg(format!("{}/openapi.json", serve.api.base))
        .args(["-H", &format!("Authorization: Bearer {API_KEY}")])
        .args(["--checks", "all", "--seed", "1", "--max-examples", "30"])
        .args(["--phases", "examples,coverage,fuzzing"])
        .args(["--request-timeout", "30", "--workers", "1", "--no-color"])
        .output()
        .await
        .expect("schemathesis runs (scripts/install-deps --test installs it)");
    let report = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "schemathesis found failures:\n{report}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let count = |label: &str| {
        report
            .lines()
            .find_map(|line| line.trim().strip_prefix(label))
            .and_then(|rest| rest.split('/').next())
            .and_then(|n| n.trim().parse::<usize>().ok())
            .unwrap_or_else(|| panic!("no {label:?} in the report: {report}"))
    };
    assert!(count("Selected:") >= 13, "every door operation: {report}");
    assert_eq!(count("Selected:"), count("Tested:"), "{report}");
    let (status, detail) = serve.api.get(&format!("/v2/instances/{id}")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        detail["status"], "running",
        "the instance survived: {detail}"
    );
    serve.shutdown().await;
}
