//! The doors of an instance and the walls around its browser, tried as an
//! attacker would: instance ports without (or with someone else's) credential,
//! and, from a CDP client that owns a browser, the node's files, its services,
//! private and metadata addresses, and downloads steered outside the instance.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;

use flotilla_testkit::{
    Api, BROWSER_DEADLINE, Page, StatusCode, TestServe, browser_processes, run_node, serve_page,
    spawn_serve_with, upgrade_status, wait_until,
};

const API_KEY: &str = "test-api-key-0123456789";

async fn serve_with_auth(adjust: impl FnOnce(&mut flotilla_server::FlotillaConfig)) -> TestServe {
    let mut serve = spawn_serve_with(|config| {
        config.control.auth_enabled = true;
        config.control.api_keys = vec![format!(
            "sha256:{}",
            hex::encode(flotilla_api_types::credentials::sha256(API_KEY.as_bytes()))
        )];
        adjust(config);
    })
    .await;
    serve.api = Api::with_key(serve.api.base.clone(), API_KEY);
    serve
}

/// Creates an instance and waits until it runs; its get view.
async fn running_instance(serve: &TestServe) -> Value {
    let (_, created, running) = serve.api.create_running("{}").await;
    assert_eq!(
        running["urls"], created["urls"],
        "get shows the create's urls"
    );
    running
}

fn token_of(instance: &Value) -> String {
    let debug = instance["urls"]["debug"].as_str().unwrap();
    debug
        .split_once("?token=")
        .map(|(_, token)| token.to_owned())
        .expect("urls.debug carries the token")
}

fn port(instance: &Value, kind: &str) -> u16 {
    u16::try_from(instance[kind].as_u64().unwrap()).unwrap()
}

/// One plain request on an instance port: status and body.
async fn request(port: u16, path: &str, authorization: Option<&str>) -> (StatusCode, String) {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    let mut request = client.get(format!("http://127.0.0.1:{port}{path}"));
    if let Some(value) = authorization {
        request = request.header("authorization", value);
    }
    let response = request.send().await.expect("the port answers");
    let status = response.status();
    (status, response.text().await.unwrap_or_default())
}

#[tokio::test]
async fn browser_instance_ports_admit_only_an_api_key_or_their_own_token() {
    let serve = serve_with_auth(|_| {}).await;
    let a = running_instance(&serve).await;
    let b = running_instance(&serve).await;
    let (token_a, token_b) = (token_of(&a), token_of(&b));
    assert!(token_a.len() >= 40, "a long random token: {token_a}");
    assert_ne!(token_a, token_b);

    // Each kind of port, a path that answers once admitted.
    let doors = [
        (port(&a, "debug_port"), "/json/version"),
        (port(&a, "debug_port"), "/json/list"),
        (port(&a, "stream_port"), "/frame.jpg"),
        (port(&a, "http_port"), "/tabs"),
        (port(&a, "http_port"), "/screenshot"),
        (port(&a, "http_port"), "/"),
    ];
    for (port, path) in doors {
        let refused = [
            (None, path.to_owned(), "no credential"),
            (
                Some("Bearer wrong-token".to_owned()),
                path.to_owned(),
                "a wrong token",
            ),
            (
                Some(format!("Bearer {token_b}")),
                path.to_owned(),
                "another instance's token",
            ),
            (
                None,
                format!("{path}?token={token_b}"),
                "another instance's token",
            ),
            (
                Some(format!("Basic {token_a}")),
                path.to_owned(),
                "another scheme",
            ),
        ];
        for (authorization, path, what) in refused {
            let (status, body) = request(port, &path, authorization.as_deref()).await;
            assert_eq!(status, StatusCode::UNAUTHORIZED, "{what} on :{port}{path}");
            let body: Value = serde_json::from_str(&body).expect("a JSON error body");
            assert_eq!(body["code"], "unauthorized");
            assert!(body["detail"].as_str().unwrap().contains("credential"));
        }
        let admitted = [
            (Some(format!("Bearer {API_KEY}")), path.to_owned()),
            (Some(format!("bearer {token_a}")), path.to_owned()),
            (None, format!("{path}?token={token_a}")),
        ];
        for (authorization, path) in admitted {
            let (status, _) = request(port, &path, authorization.as_deref()).await;
            assert_ne!(status, StatusCode::UNAUTHORIZED, ":{port}{path}");
            assert!(
                status != StatusCode::BAD_GATEWAY,
                ":{port}{path} reached nothing"
            );
        }
    }
    // WebSocket upgrades are refused before anything is forwarded.
    let debug_a = port(&a, "debug_port");
    let stream_a = port(&a, "stream_port");
    let id_a = a["id"].as_str().unwrap();
    for (port, path) in [
        (debug_a, format!("/devtools/browser/{id_a}")),
        (debug_a, format!("/devtools/browser/{id_a}?token={token_b}")),
        (stream_a, "/ws".to_owned()),
    ] {
        let status = upgrade_status(port, &path).await;
        assert!(status.contains(" 401 "), "upgrade of {path}: {status}");
    }
    assert!(
        upgrade_status(
            debug_a,
            &format!("/devtools/browser/{id_a}?token={token_a}")
        )
        .await
        .contains(" 101 ")
    );

    // The DevTools discovery answers point back here, with the token.
    let (_, version) = request(debug_a, &format!("/json/version?token={token_a}"), None).await;
    let version: Value = serde_json::from_str(&version).unwrap();
    let ws = version["webSocketDebuggerUrl"].as_str().unwrap();
    assert!(
        ws.starts_with(&format!("ws://127.0.0.1:{debug_a}/devtools/browser/")),
        "{ws}"
    );
    assert!(ws.ends_with(&format!("?token={token_a}")), "{ws}");
    let (_, list) = request(debug_a, "/json/list", Some(&format!("Bearer {API_KEY}"))).await;
    let list: Vec<Value> = serde_json::from_str(&list).unwrap();
    assert!(list.iter().all(|target| {
        target["webSocketDebuggerUrl"]
            .as_str()
            .unwrap()
            .ends_with(&format!("?token={token_a}"))
    }));

    // Clients take urls.debug exactly as returned; Playwright also the http form.
    let debug_url = a["urls"]["debug"].as_str().unwrap();
    let page = "data:text/html,<title>through the door</title>";
    for (script, endpoint) in [
        ("playwright_title.mjs", debug_url.to_owned()),
        ("puppeteer_title.mjs", debug_url.to_owned()),
        (
            "playwright_title.mjs",
            format!("http://127.0.0.1:{debug_a}/?token={token_a}"),
        ),
    ] {
        let result = run_node(script, &[&endpoint, page]).await.unwrap();
        assert_eq!(result["title"], "through the door", "{script} {endpoint}");
    }
    // Without the token the same clients are turned away.
    let bare = debug_url.split('?').next().unwrap();
    assert!(
        run_node("playwright_title.mjs", &[bare, page])
            .await
            .is_err()
    );

    // A deleted instance's token opens nothing, here or elsewhere.
    serve.api.delete_instance(id_a).await;
    let (status, _) = request(
        port(&b, "debug_port"),
        &format!("/json/version?token={token_a}"),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let gone = reqwest::get(format!(
        "http://127.0.0.1:{debug_a}/json/version?token={token_a}"
    ))
    .await;
    assert!(
        gone.map(|r| r.status() == StatusCode::UNAUTHORIZED)
            .unwrap_or(true),
        "the deleted instance's port no longer admits its token"
    );
    serve.shutdown().await;
}

#[tokio::test]
async fn browser_instance_ports_are_open_without_authentication() {
    let serve = spawn_serve_with(|_| {}).await;
    let (_, _, instance) = serve.api.create_running("{}").await;
    let debug_url = instance["urls"]["debug"].as_str().unwrap();
    assert!(!debug_url.contains("token="), "{debug_url}");
    let (status, version) = request(port(&instance, "debug_port"), "/json/version", None).await;
    assert_eq!(status, StatusCode::OK);
    assert!(!version.contains("token="));
    serve.shutdown().await;
}

/// The host's own addresses other than loopback and link-local.
fn host_addresses() -> Vec<IpAddr> {
    flotilla_node_agent::confine::egress::interface_addresses()
        .into_iter()
        .filter(|ip| match ip {
            IpAddr::V4(v4) => !v4.is_loopback() && !v4.is_link_local(),
            IpAddr::V6(v6) => !v6.is_loopback() && (v6.segments()[0] & 0xffc0) != 0xfe80,
        })
        .collect()
}

/// A TCP server that records whether anyone connected.
struct Tripwire {
    addr: SocketAddr,
    hits: Arc<Mutex<usize>>,
    _task: tokio::task::JoinHandle<()>,
}

impl Tripwire {
    async fn on(ip: IpAddr) -> Self {
        let listener = tokio::net::TcpListener::bind((ip, 0)).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let hits = Arc::new(Mutex::new(0));
        let counter = hits.clone();
        let task = tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                *counter.lock().unwrap() += 1;
                let _ = stream
                    .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nreached")
                    .await;
            }
        });
        Self {
            addr,
            hits,
            _task: task,
        }
    }

    fn url(&self) -> String {
        match self.addr {
            SocketAddr::V6(addr) => format!("http://[{}]:{}/", addr.ip(), addr.port()),
            addr => format!("http://{addr}/"),
        }
    }

    fn hits(&self) -> usize {
        *self.hits.lock().unwrap()
    }
}

/// 169.254.169.254 on the host's loopback interface for the test's duration,
/// so that a browser that could reach the metadata address would reach a
/// listener there.
struct MetadataAddress;

impl MetadataAddress {
    fn add() -> Self {
        let _ = Self::run("del");
        assert!(
            Self::run("add"),
            "cannot add 169.254.169.254 to lo (this test needs root, like the agent)"
        );
        Self
    }

    fn run(verb: &str) -> bool {
        std::process::Command::new("ip")
            .args(["addr", verb, "169.254.169.254/32", "dev", "lo"])
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false)
    }
}

impl Drop for MetadataAddress {
    fn drop(&mut self) {
        Self::run("del");
    }
}

/// Navigates and says whether the page loaded (CDP reports no `errorText`).
async fn loads(page: &Page, url: &str) -> bool {
    let answer = page.try_navigate(url).await.unwrap();
    answer
        .get("errorText")
        .is_none_or(|e| e.as_str() == Some(""))
}

fn status_field(pid: u32, field: &str) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|line| {
            line.strip_prefix(&format!("{field}:"))
                .map(|v| v.trim().to_owned())
        })
}

#[tokio::test]
async fn browser_a_cdp_client_owns_its_browser_and_nothing_else() {
    let _metadata = MetadataAddress::add();
    let metadata = Tripwire::on("169.254.169.254".parse().unwrap()).await;
    let own_addresses: Vec<Tripwire> = {
        let mut wires = Vec::new();
        for ip in host_addresses() {
            wires.push(Tripwire::on(ip).await);
        }
        wires
    };
    assert!(
        !own_addresses.is_empty(),
        "the host has an address besides loopback"
    );
    let local_site = serve_page(&[("/", "<title>allowed</title>")]).await;
    let serve = serve_with_auth(|config| local_site.allow_in(config)).await;
    // Secrets of the node a browser must not see.
    let secret_file = serve.data_dir.join("node-secret.txt");
    std::fs::write(&secret_file, "node secret").unwrap();
    let a = running_instance(&serve).await;
    let b = running_instance(&serve).await;
    let instances = serve.instances_dir();
    let dir_of = |instance: &Value| instances.join(instance["id"].as_str().unwrap());
    let other_profile = dir_of(&b).join("profile");
    std::fs::write(other_profile.join("other-secret.txt"), "other secret").unwrap();
    let own_profile = dir_of(&a).join("profile");

    let page = Page::open(
        a["urls"]["debug"].as_str().unwrap(),
        "data:text/html,<title>start</title>",
    )
    .await
    .unwrap();
    // Files: the browser's own profile is there (at /instance/profile, no host
    // path shows), the node's files are not.
    let file_url = |path: &Path| format!("file://{}", path.display());
    assert!(
        loads(&page, "file:///instance/profile/").await,
        "its own profile is readable"
    );
    for path in [
        own_profile.clone(),
        PathBuf::from("/etc/shadow"),
        PathBuf::from("/root/"),
        serve.data_dir.clone(),
        secret_file.clone(),
        other_profile.join("other-secret.txt"),
        flotilla_testkit::workspace_root().join("Cargo.toml"),
    ] {
        assert!(
            !loads(&page, &file_url(&path)).await,
            "{} is readable",
            path.display()
        );
    }
    // What the kernel tells of the host (its boot command line) reads as empty.
    let host_cmdline = std::fs::read_to_string("/proc/cmdline").unwrap();
    assert!(!host_cmdline.trim().is_empty());
    let seen = if loads(&page, "file:///proc/cmdline").await {
        page.eval("document.body ? document.body.innerText : ''")
            .await
            .unwrap()
    } else {
        Value::from("")
    };
    assert_eq!(seen, "", "the sandbox shows the host's /proc/cmdline");

    // Network: the allowed local site loads; the node's services, its own
    // addresses and the metadata address are out of reach.
    assert!(
        loads(&page, &format!("{}/", local_site.base)).await,
        "the allowed site loads"
    );
    let control = serve.api.base.trim_start_matches("http://").to_owned();
    let agent = serve.serve().agent_addr.to_string();
    let proxy = serve.serve().proxy_addr.to_string();
    for target in [control, agent, proxy] {
        assert!(
            !loads(&page, &format!("http://{target}/health")).await,
            "{target} answered"
        );
    }
    assert!(!loads(&page, &metadata.url()).await);
    for wire in &own_addresses {
        assert!(!loads(&page, &wire.url()).await, "{} answered", wire.url());
        assert_eq!(wire.hits(), 0, "{} was reached", wire.url());
    }
    assert_eq!(metadata.hits(), 0, "the metadata address was reached");
    // Another instance's debug port on loopback too.
    let other_debug = format!("http://127.0.0.1:{}/json/version", port(&b, "debug_port"));
    assert!(!loads(&page, &other_debug).await);

    // Downloads land in the instance's own directory, wherever they are steered.
    // The last refused load left an error page that may still be building:
    // start from a page that has finished loading.
    page.navigate(&format!("{}/", local_site.base))
        .await
        .unwrap();
    let escape = format!("flotilla-escape-{}", std::process::id());
    let downloads = dir_of(&a).join("downloads");
    for (index, steered) in [format!("/root/{escape}"), format!("/tmp/{escape}")]
        .iter()
        .enumerate()
    {
        let name = format!("loot-{index}.txt");
        page.call_browser(
            "Browser.setDownloadBehavior",
            json!({"behavior": "allow", "downloadPath": steered}),
        )
        .await
        .unwrap();
        page.eval(&format!(
            "(() => {{ const a = document.createElement('a'); a.href = 'data:text/plain,loot'; a.download = '{name}'; document.body.append(a); a.click(); return true; }})()"
        ))
        .await
        .unwrap();
        let landed = downloads.join(&name);
        wait_until(
            BROWSER_DEADLINE,
            "the download to land in the instance's downloads",
            || {
                let landed = landed.clone();
                async move {
                    Ok::<_, std::convert::Infallible>(
                        std::fs::read_to_string(&landed)
                            .ok()
                            .filter(|text| text == "loot")
                            .map(|_| ()),
                    )
                }
            },
        )
        .await
        .unwrap();
        assert!(!Path::new(steered).exists(), "{steered} exists on the host");
    }

    // The browser's processes: not root, and Chromium's own sandbox on.
    let tree = browser_processes(&dir_of(&a));
    assert!(tree.len() > 3, "the browser has helpers: {tree:?}");
    for pid in &tree {
        if let Some(uid) = status_field(*pid, "Uid") {
            assert!(
                !uid.split_whitespace().any(|id| id == "0"),
                "pid {pid} runs as root: {uid}"
            );
        }
    }
    let renderers: Vec<u32> = tree
        .iter()
        .copied()
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|c| String::from_utf8_lossy(&c).contains("--type=renderer"))
                .unwrap_or(false)
        })
        .collect();
    assert!(!renderers.is_empty(), "renderers run");
    for pid in renderers {
        assert_eq!(
            status_field(pid, "Seccomp").as_deref(),
            Some("2"),
            "renderer {pid} is not sandboxed"
        );
    }
    let health = serve.api.get("/health").await.1;
    assert_eq!(
        health["status"], "healthy",
        "no isolation warning: {health}"
    );
    drop(page);
    serve.shutdown().await;
}

#[tokio::test]
async fn browser_nested_cdp_commands_cannot_get_around_the_pins_and_home_counts_toward_disk() {
    // A token holder, as in the report: small disk_gb, commands nested in
    // Target.sendMessageToTarget.
    let serve = serve_with_auth(|_| {}).await;
    let (id, created, _) = serve
        .api
        .create_running(r#"{"config": {"disk_gb": 0.2}}"#)
        .await;
    let debug = created["urls"]["debug"].as_str().unwrap();
    let answers = run_node("nested_cdp.mjs", &[debug, "nested.txt"])
        .await
        .unwrap();
    // Extensions cannot be loaded over CDP, nested or not.
    let refusal = answers["extension"]["error"]["message"]
        .as_str()
        .unwrap_or("");
    assert!(
        refusal.contains("Extensions.loadUnpacked is refused by Flotilla"),
        "{answers}"
    );
    // The download steered at /instance/home lands in the downloads directory.
    let dir = serve.instances_dir().join(&id);
    wait_until(BROWSER_DEADLINE, "the nested download to land", || async {
        let landed = dir.join("downloads/nested.txt");
        match std::fs::read_to_string(&landed) {
            Ok(text) if text == "nested" => Ok(Some(())),
            other => Err(format!("{other:?} in {}", landed.display())),
        }
    })
    .await
    .unwrap();
    assert!(
        !dir.join("home/nested.txt").exists(),
        "nothing lands in home"
    );

    // What piles up in home (caches, crash dumps) counts toward disk_gb.
    let pile = std::fs::File::create(dir.join("home/crash-dump.dmp")).unwrap();
    pile.set_len(300 << 20).unwrap();
    let detail = serve
        .api
        .wait_for_status(&id, "failed", BROWSER_DEADLINE)
        .await;
    let reason = detail["status_reason"].as_str().unwrap();
    assert!(
        reason.contains("disk limit") && reason.contains("home"),
        "{detail}"
    );
    serve.shutdown().await;
}

#[tokio::test]
async fn browser_a_page_of_another_site_cannot_open_the_live_view_even_with_authentication_off() {
    // Authentication off: the Origin is all that stops a page its user visits.
    let serve = spawn_serve_with(|_| {}).await;
    let (id, created, _) = serve.api.create_running("{}").await;
    let stream_port = port(&created, "stream_port");
    let door_port: u16 = serve.api.base.rsplit(':').next().unwrap().parse().unwrap();
    let (status, link) = serve
        .api
        .post(
            &format!("/v2/instances/{id}/live"),
            r#"{"mode": "control"}"#,
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{link}");
    let link_path = url::Url::parse(link["url"].as_str().unwrap())
        .unwrap()
        .path()
        .trim_end_matches('/')
        .to_owned();
    let evil = "Origin: http://evil.example\r\n";
    for (port, path) in [
        (stream_port, "/ws".to_owned()),
        (door_port, format!("/v2/instances/{id}/stream/ws")),
        (door_port, format!("/v2/instances/{id}/cdp")),
        (door_port, format!("{link_path}/ws")),
    ] {
        let status = flotilla_testkit::upgrade_status_with(port, &path, evil).await;
        assert!(
            status.contains(" 403 "),
            "{path} from evil.example: {status}"
        );
        // The same page of this server's own origin, and a client that is not
        // a browser (no Origin), are let in.
        let own = format!("Origin: http://127.0.0.1:{port}\r\n");
        let status = flotilla_testkit::upgrade_status_with(port, &path, &own).await;
        assert!(
            status.contains(" 101 "),
            "{path} from its own origin: {status}"
        );
        let status = upgrade_status(port, &path).await;
        assert!(
            status.contains(" 101 "),
            "{path} without an Origin: {status}"
        );
    }
    serve.shutdown().await;
}
