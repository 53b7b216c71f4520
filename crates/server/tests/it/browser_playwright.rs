//! Playwright's own protocol (`chromium.connect()`) with real Chromium and
//! real clients: playwright-core for Node at two minor versions and
//! Python's Playwright, through the front door. Each gets a Playwright
//! server of its version driving the instance's own browser; what
//! Playwright moves as artifacts (downloads, uploads, traces, video, PDF,
//! storage state, HAR) works from the client's disk; a CDP client shares
//! the browser; a version not installed is refused with the list; no
//! credential, no connection; a parked instance is woken with its tabs by a
//! connecting client; `/v2/playwright` makes an instance for the connection
//! and deletes it after.

use std::io::Read as _;

use serde_json::Value;

use flotilla_testkit::{
    Api, BROWSER_DEADLINE, StatusCode, TestServe, free_port, run_node, run_python, serve_page,
    spawn_serve_with, wait_until,
};

const KEY: &str = "flt_playwright_test_key";
const WEBHOOK_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const PAGE: &str = "<!doctype html><title>Reached over Playwright</title><h1>hello</h1>";

/// `serve` with authentication on, its public URL the door's port (so
/// `urls.playwright` goes through the door), browsers allowed to open `site`.
async fn door_serve(site: &flotilla_testkit::PageServer) -> TestServe {
    door_serve_with(site, |_| {}).await
}

/// [`door_serve`], adjusted by `adjust`.
async fn door_serve_with(
    site: &flotilla_testkit::PageServer,
    adjust: impl FnOnce(&mut flotilla_server::FlotillaConfig),
) -> TestServe {
    let port = free_port();
    let mut serve = spawn_serve_with(|config| {
        config.listen = format!("127.0.0.1:{port}");
        config.control.auth_enabled = true;
        config.control.api_keys = vec![KEY.into()];
        config.control.public_url = Some(format!("http://127.0.0.1:{port}"));
        site.allow_in(config);
        adjust(config);
    })
    .await;
    serve.api = Api::with_key(serve.api.base.clone(), KEY);
    serve
}

fn door_port(serve: &TestServe) -> u16 {
    serve
        .api
        .base
        .rsplit_once(':')
        .and_then(|(_, port)| port.parse().ok())
        .expect("the door's port")
}

/// `urls.playwright` without its `?token=`, and the token.
fn split_token(url: &str) -> (String, String) {
    let (base, token) = url.split_once("?token=").expect("a token in the URL");
    (base.to_owned(), token.to_owned())
}

/// An upgrade to `path` on the door with `extra` header lines: the answer's
/// status line and what came with it.
async fn upgrade(port: u16, path: &str, extra: &str) -> (String, String) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let head = format!(
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n{extra}\r\n"
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    let mut buffer = [0u8; 4096];
    // Until the head and a body have come (the refusals here close, or
    // say their length).
    loop {
        let read = tokio::time::timeout(BROWSER_DEADLINE, stream.read(&mut buffer))
            .await
            .expect("the door answers the upgrade")
            .unwrap();
        answer.extend_from_slice(&buffer[..read]);
        let text = String::from_utf8_lossy(&answer).into_owned();
        if read == 0
            || text
                .split_once("\r\n\r\n")
                .is_some_and(|(_, body)| !body.is_empty())
        {
            let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
            return (
                head.lines().next().unwrap_or_default().to_owned(),
                body.to_owned(),
            );
        }
    }
}

fn zip_names(path: &std::path::Path) -> Vec<String> {
    let mut archive = zip::ZipArchive::new(std::fs::File::open(path).unwrap()).unwrap();
    (0..archive.len())
        .map(|i| archive.by_index(i).unwrap().name().to_owned())
        .collect()
}

#[tokio::test]
async fn browser_playwright_clients_of_two_versions_drive_the_instance_with_every_artifact() {
    let site = serve_page(&[("/page", PAGE)]).await;
    let receiver = flotilla_testkit::EventReceiver::start(WEBHOOK_SECRET).await;
    let serve = door_serve_with(&site, |config| {
        config.control.webhooks = vec![flotilla_control_plane::config::WebhookConfig {
            url: receiver.url.clone(),
            events: vec![flotilla_api_types::events::EventName::InstancePlaywrightServerExited],
            secret: WEBHOOK_SECRET.into(),
        }];
    })
    .await;
    let (id, _, instance) = serve.api.create_running("{}").await;
    let url = instance["urls"]["playwright"].as_str().unwrap();
    assert!(
        url.starts_with(&format!(
            "ws://127.0.0.1:{}/v2/instances/{id}/playwright?token=",
            door_port(&serve)
        )),
        "{url}"
    );
    let (base, token) = split_token(url);
    let debug = instance["urls"]["debug"].as_str().unwrap();
    let out = tempfile::tempdir().unwrap();
    let page = format!("{}/page", site.base);

    // The newest client, by path with the API key as a header: everything.
    let headers = format!(r#"{{"Authorization": "Bearer {KEY}"}}"#);
    let full_dir = out.path().join("full");
    let full_dir_arg = full_dir.to_string_lossy().into_owned();
    let seen = run_node(
        "playwright_connect.mjs",
        &[
            "playwright-core",
            &base,
            &headers,
            &page,
            &full_dir_arg,
            "full",
            debug,
        ],
    )
    .await
    .expect("the Playwright client of 1.65 does its work");
    assert_eq!(seen["client"], "1.65.1", "{seen}");
    assert_eq!(seen["title"], "Reached over Playwright", "{seen}");
    assert_eq!(seen["contexts"], 1, "the instance's own context: {seen}");
    assert_eq!(seen["saved"], "bytes of the download", "{seen}");
    assert_eq!(seen["streamed"], "bytes of the download", "{seen}");
    assert_eq!(seen["suggested"], "report.txt", "{seen}");
    assert!(seen["cdp_sees"].as_u64().unwrap() >= 1, "{seen}");
    assert_eq!(seen["routed_title"], "fulfilled by the client", "{seen}");
    assert_eq!(seen["har_title"], "replayed from a HAR", "{seen}");
    assert_eq!(
        seen["uploaded"], "upload.txt: uploaded from the client",
        "{seen}"
    );
    assert!(seen["pdf_bytes"].as_u64().unwrap() > 1000, "{seen}");
    assert_eq!(seen["state_cookies"], serde_json::json!(["c"]), "{seen}");
    // The trace opens: a zip with the trace, the network log and screenshots.
    let names = zip_names(&full_dir.join("trace.zip"));
    for entry in ["trace.trace", "trace.network"] {
        assert!(names.iter().any(|n| n == entry), "{entry} in {names:?}");
    }
    assert!(
        names.iter().any(|n| n.ends_with(".jpeg")),
        "screenshots in {names:?}"
    );
    // The video is a WebM file (EBML magic).
    let mut magic = [0u8; 4];
    std::fs::File::open(full_dir.join("video.webm"))
        .unwrap()
        .read_exact(&mut magic)
        .unwrap();
    assert_eq!(magic, [0x1a, 0x45, 0xdf, 0xa3]);

    // An older minor version, with the instance's token in the URL.
    let older_dir = out.path().join("older").to_string_lossy().into_owned();
    let with_token = format!("{base}?token={token}");
    let seen = run_node(
        "playwright_connect.mjs",
        &[
            "playwright-core-1.64",
            &with_token,
            "{}",
            &page,
            &older_dir,
            "basic",
        ],
    )
    .await
    .expect("the Playwright client of 1.64 does its work");
    assert_eq!(seen["client"], "1.64.1", "{seen}");
    assert_eq!(seen["title"], "Reached over Playwright", "{seen}");
    assert_eq!(seen["saved"], "bytes of the download", "{seen}");

    // The servers run confined: as the browser user, in the browser's
    // network namespace, never the agent's.
    let servers = playwright_servers();
    assert_eq!(servers.len(), 2, "one per version in use: {servers:?}");
    let own_network = std::fs::read_link("/proc/self/ns/net").unwrap();
    for pid in servers {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let uid = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
        if is_root() {
            assert!(!uid.split_whitespace().skip(1).any(|id| id == "0"), "{uid}");
            let network = std::fs::read_link(format!("/proc/{pid}/ns/net")).unwrap();
            assert_ne!(network, own_network, "the server has the host's network");
        }
    }

    // A hostile client: the server has no network of its own, and raw CDP
    // gets the pins.
    let health = format!("{}/health", serve.api.base);
    let seen = run_node("playwright_hostile.mjs", &[&base, &headers, &health])
        .await
        .expect("the hostile client runs");
    if is_root() {
        let api_request = seen["api_request"].as_str().unwrap();
        assert!(api_request.starts_with("error:"), "{seen}");
    }
    for attempt in ["extension", "save_on_server", "trace_name"] {
        assert!(
            seen[attempt]
                .as_str()
                .unwrap()
                .contains("refused by Flotilla"),
            "{attempt}: {seen}"
        );
    }
    assert!(
        !serve
            .data_dir
            .join(format!("agent/instances/{id}/profile/planted.txt"))
            .exists()
    );
    // A server that dies is reported, and the next client gets a new one.
    let newest = playwright_servers()
        .into_iter()
        .find(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            String::from_utf8_lossy(&cmdline).contains("/1.65.1/")
        })
        .expect("the server of 1.65");
    // SAFETY: kill has no memory-safety preconditions; the pid is our
    // agent's child.
    unsafe { libc::kill(newest as i32, libc::SIGKILL) };
    wait_until(
        BROWSER_DEADLINE,
        "instance.playwright_server_exited",
        || async {
            let found = receiver.events().into_iter().any(|e| {
                e.payload["event"] == "instance.playwright_server_exited"
                    && e.payload["data"]["instance_id"] == id.as_str()
                    && e.payload["data"]["version"] == "1.65.1"
            });
            Ok::<_, String>(found.then_some(()))
        },
    )
    .await
    .unwrap();
    let again_dir = out.path().join("again").to_string_lossy().into_owned();
    let seen = run_node(
        "playwright_connect.mjs",
        &[
            "playwright-core",
            &base,
            &headers,
            &page,
            &again_dir,
            "basic",
        ],
    )
    .await
    .expect("a client after the server died");
    assert_eq!(seen["title"], "Reached over Playwright", "{seen}");

    // Downloads land in the instance's downloads, the hostile one too.
    wait_until(BROWSER_DEADLINE, "the hostile download", || async {
        let (status, downloads) = serve
            .api
            .get(&format!("/v2/instances/{id}/downloads"))
            .await;
        assert_eq!(status, StatusCode::OK, "{downloads}");
        let names: Vec<&str> = downloads["downloads"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|d| d["name"].as_str())
            .collect();
        match names.contains(&"hostile.txt") {
            true => Ok(Some(())),
            false => Err(downloads.to_string()),
        }
    })
    .await
    .unwrap();
    serve.api.delete_instance(&id).await;
    // The servers end with the instance.
    wait_until(BROWSER_DEADLINE, "the servers to end", || async {
        let left = playwright_servers();
        if left.is_empty() {
            Ok(Some(()))
        } else {
            Err(format!("{left:?}"))
        }
    })
    .await
    .unwrap();
}

/// The payloads of the events named `name` the receiver got, in order.
fn events_named(receiver: &flotilla_testkit::EventReceiver, name: &str) -> Vec<Value> {
    receiver
        .events()
        .into_iter()
        .filter(|event| event.payload["event"] == name)
        .map(|event| event.payload)
        .collect()
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Pids of the Playwright servers of this test's agent (Node, carrying
/// their program, with its `x-flotilla-cdp`, on the command line).
fn playwright_servers() -> Vec<u32> {
    let mine = std::process::id().to_string();
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let cmdline = String::from_utf8_lossy(&cmdline);
            // Node itself, not the bubblewrap around it.
            let is_server = cmdline
                .split('\0')
                .next()
                .is_some_and(|p| p.ends_with("node"))
                && cmdline.contains("x-flotilla-cdp");
            is_server && descends_from(*pid, &mine)
        })
        .collect()
}

/// Whether `pid` is a descendant of process `ancestor`.
fn descends_from(mut pid: u32, ancestor: &str) -> bool {
    for _ in 0..16 {
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            return false;
        };
        let Some(parent) = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
        else {
            return false;
        };
        if parent == ancestor {
            return true;
        }
        match parent.parse() {
            Ok(next) if next > 1 => pid = next,
            _ => return false,
        }
    }
    false
}

#[tokio::test]
async fn browser_playwright_refuses_versions_not_installed_and_clients_without_a_credential() {
    let site = serve_page(&[("/page", PAGE)]).await;
    let serve = door_serve(&site).await;
    let (id, _, instance) = serve.api.create_running("{}").await;
    let port = door_port(&serve);
    let (_, token) = split_token(instance["urls"]["playwright"].as_str().unwrap());
    let path = format!("/v2/instances/{id}/playwright");

    // A version not installed: 428, naming those that are.
    let old = format!(
        "User-Agent: Playwright/1.59.1 (x64; debian 12) node/20.19\r\nAuthorization: Bearer {KEY}\r\n"
    );
    let (status, body) = upgrade(port, &path, &old).await;
    assert!(status.contains(" 428 "), "{status}");
    assert!(
        body.contains("Playwright 1.59 is not served") && body.contains("1.64, 1.65"),
        "{body}"
    );
    // Not a Playwright client at all: the same, saying so.
    let (status, body) = upgrade(port, &path, &format!("Authorization: Bearer {KEY}\r\n")).await;
    assert!(status.contains(" 428 "), "{status}");
    assert!(body.contains("not a Playwright client"), "{body}");

    // No credential, a wrong one, another instance's: 401 before anything
    // reaches the node.
    let newest = "User-Agent: Playwright/1.65.1 (x64; debian 12) node/20.19\r\n";
    for extra in [
        newest.to_owned(),
        format!("{newest}Authorization: Bearer not-a-key\r\n"),
    ] {
        let (status, body) = upgrade(port, &path, &extra).await;
        assert!(status.contains(" 401 "), "{extra}: {status}");
        assert!(body.contains("unauthorized"), "{body}");
    }
    let (other, _, _) = serve.api.create_running("{}").await;
    let (status, _) = upgrade(
        port,
        &format!("/v2/instances/{other}/playwright?token={token}"),
        newest,
    )
    .await;
    assert!(
        status.contains(" 401 "),
        "another instance's token: {status}"
    );
    let (status, _) = upgrade(port, "/v2/playwright", newest).await;
    assert!(
        status.contains(" 401 "),
        "/v2/playwright without a key: {status}"
    );
    let (status, body) = upgrade(port, "/v2/playwright?token=not-a-key", newest).await;
    assert!(
        status.contains(" 401 "),
        "/v2/playwright with a wrong key: {status}"
    );
    assert!(
        body.contains("invalid API key (the token parameter)"),
        "a wrong key is not a missing one: {body}"
    );
    // Nothing was started for any of them.
    let servers: Vec<_> = std::fs::read_dir(serve.data_dir.join("agent/instances").join(&id))
        .map(|entries| {
            entries
                .flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with("playwright-"))
                .collect()
        })
        .unwrap_or_default();
    assert!(servers.is_empty(), "{servers:?}");

    // Options that are not a create body: 400, nothing created.
    let (status, body) = upgrade(
        port,
        &format!("/v2/playwright?token={KEY}&colour=blue"),
        newest,
    )
    .await;
    assert!(status.contains(" 400 "), "{status}");
    assert!(body.contains("colour"), "{body}");
    // Not a Playwright client: 428 before an instance is made for it.
    let (status, body) = upgrade(port, &format!("/v2/playwright?token={KEY}"), "").await;
    assert!(status.contains(" 428 "), "{status}");
    assert!(body.contains("not a Playwright client"), "{body}");
    // A plain request to a WebSocket endpoint: 426.
    let (status, _) = serve
        .api
        .get(&format!("/v2/instances/{id}/playwright"))
        .await;
    assert_eq!(status, StatusCode::UPGRADE_REQUIRED);
    let (_, list) = serve.api.get("/v2/instances").await;
    assert_eq!(list["instances"].as_array().unwrap().len(), 2, "{list}");
    serve.api.delete_instance(&id).await;
    serve.api.delete_instance(&other).await;
}

#[tokio::test]
async fn browser_playwright_wakes_a_parked_instance_with_its_tabs_and_makes_instances_for_connections()
 {
    let site = serve_page(&[("/page", PAGE)]).await;
    let receiver = flotilla_testkit::EventReceiver::start(WEBHOOK_SECRET).await;
    let serve = door_serve_with(&site, |config| {
        config.control.webhooks = vec![flotilla_control_plane::config::WebhookConfig {
            url: receiver.url.clone(),
            events: vec![
                flotilla_api_types::events::EventName::InstancePlaywrightServerExited,
                flotilla_api_types::events::EventName::InstanceCreated,
                flotilla_api_types::events::EventName::InstanceDeleted,
            ],
            secret: WEBHOOK_SECRET.into(),
        }];
    })
    .await;
    let page = format!("{}/page", site.base);
    let out = tempfile::tempdir().unwrap();
    let out_arg = out.path().to_string_lossy().into_owned();

    // A tab opened over Playwright; the client leaves; the instance is
    // parked; a client connecting again wakes it and finds its tab.
    let (id, _, instance) = serve.api.create_running("{}").await;
    let url = instance["urls"]["playwright"].as_str().unwrap().to_owned();
    let seen = run_node("playwright_keep_tab.mjs", &[&url, &page, "open"])
        .await
        .expect("the first client opens a tab");
    assert_eq!(seen["title"], "Reached over Playwright", "{seen}");
    serve.api.park(&id).await;
    serve
        .api
        .wait_for_status(&id, "dormant", BROWSER_DEADLINE)
        .await;
    let seen = run_node("playwright_keep_tab.mjs", &[&url, &page, "find"])
        .await
        .expect("a client connecting to the parked instance");
    assert_eq!(seen["found"], true, "the tab came back: {seen}");
    let (_, detail) = serve.api.get(&format!("/v2/instances/{id}")).await;
    assert_eq!(detail["status"], "running", "{detail}");
    serve.api.delete_instance(&id).await;
    // The park and the delete ended its server with the browser: no server
    // ended on its own (the delete's event comes after the park's).
    wait_until(BROWSER_DEADLINE, "instance.deleted", || async {
        let deleted = receiver.events().into_iter().any(|e| {
            e.payload["event"] == "instance.deleted"
                && e.payload["data"]["instance_id"] == id.as_str()
        });
        Ok::<_, String>(deleted.then_some(()))
    })
    .await
    .unwrap();
    let exits: Vec<_> = receiver
        .events()
        .into_iter()
        .filter(|e| e.payload["event"] == "instance.playwright_server_exited")
        .map(|e| e.payload)
        .collect();
    assert!(exits.is_empty(), "{exits:?}");

    // Python's Playwright, on an instance made for its connection (the key
    // in the URL): deleted when it disconnects.
    let base = serve.api.base.replacen("http://", "ws://", 1);
    let seen = run_python(
        "playwright_connect.py",
        &[
            &format!("{base}/v2/playwright?token={KEY}&image=chromium-headless-shell"),
            &page,
            &out_arg,
        ],
    )
    .await
    .expect("the Python client does its work");
    assert_eq!(seen["title"], "Reached over Playwright", "{seen}");
    assert_eq!(seen["saved"], "from python", "{seen}");
    wait_until(
        BROWSER_DEADLINE,
        "the connection's instance to be deleted",
        || async {
            let (_, list) = serve.api.get("/v2/instances").await;
            match list["instances"].as_array().map(Vec::len) {
                Some(0) => Ok(Some(())),
                _ => Err(list.to_string()),
            }
        },
    )
    .await
    .unwrap();

    // A client that leaves while its instance is made leaves nothing: the
    // instance made for it is deleted.
    let created_before = events_named(&receiver, "instance.created").len();
    {
        use tokio::io::AsyncWriteExt as _;
        let port = door_port(&serve);
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .unwrap();
        let head = format!(
            "GET /v2/playwright?token={KEY} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nUser-Agent: Playwright/1.65.1 (x64; debian 12) node/20.19\r\n\r\n"
        );
        stream.write_all(head.as_bytes()).await.unwrap();
        // Gone before the answer.
    }
    let left_behind = wait_until(
        BROWSER_DEADLINE,
        "the abandoned connection's instance",
        || async {
            let created = events_named(&receiver, "instance.created");
            match created.get(created_before) {
                Some(event) => Ok(Some(
                    event["data"]["instance_id"].as_str().unwrap().to_owned(),
                )),
                None => Err(format!("{} created", created.len())),
            }
        },
    )
    .await
    .unwrap();
    wait_until(
        BROWSER_DEADLINE,
        "the abandoned connection's instance to be deleted",
        || async {
            let deleted = events_named(&receiver, "instance.deleted")
                .iter()
                .any(|event| event["data"]["instance_id"] == left_behind.as_str());
            Ok::<_, String>(deleted.then_some(()))
        },
    )
    .await
    .unwrap();

    // keep=true: the instance stays, with the image asked for.
    let seen = run_node(
        "playwright_keep_tab.mjs",
        &[
            &format!("{base}/v2/playwright?token={KEY}&keep=true&config.max_duration_minutes=10"),
            &page,
            "open",
        ],
    )
    .await
    .expect("a client that keeps its instance");
    assert_eq!(seen["title"], "Reached over Playwright", "{seen}");
    let (_, list) = serve.api.get("/v2/instances").await;
    let kept = list["instances"].as_array().unwrap();
    assert_eq!(kept.len(), 1, "{list}");
    let kept_id = kept[0]["id"].as_str().unwrap().to_owned();
    let (_, detail) = serve.api.get(&format!("/v2/instances/{kept_id}")).await;
    assert_eq!(detail["config"]["max_duration_minutes"], 10.0, "{detail}");
    let _: &Value = &detail;
    serve.api.delete_instance(&kept_id).await;
}

/// Files under `dir` whose name starts with `prefix`, anywhere below it.
fn files_named(dir: &std::path::Path, prefix: &str) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(folder) = pending.pop() {
        for entry in std::fs::read_dir(&folder).into_iter().flatten().flatten() {
            let path = entry.path();
            if entry.file_type().is_ok_and(|kind| kind.is_dir()) {
                pending.push(path);
            } else if entry.file_name().to_string_lossy().starts_with(prefix) {
                found.push(path);
            }
        }
    }
    found
}

/// Every call of Playwright's protocol that names a path on the server's
/// side is refused, for the oldest served version (1.60, whose
/// createTempFiles joined names unchecked) and the newest: nothing lands in
/// the downloads, the profile or anywhere else, the server lives on, and a
/// real folder upload with sub-folders still works.
#[tokio::test]
async fn browser_playwright_clients_cannot_name_paths_on_the_servers_side() {
    let site = serve_page(&[("/page", PAGE)]).await;
    let serve = door_serve(&site).await;
    let (id, _, instance) = serve.api.create_running("{}").await;
    let (base, _) = split_token(instance["urls"]["playwright"].as_str().unwrap());
    let headers = format!(r#"{{"Authorization": "Bearer {KEY}"}}"#);
    for version in ["1.60.0", "1.65.1"] {
        let core = format!(
            "{}/{version}/node_modules/playwright-core",
            flotilla_node_agent::config::DEFAULT_PLAYWRIGHT_DIR
        );
        let seen = run_node("playwright_paths.mjs", &[&core, &base, &headers])
            .await
            .unwrap_or_else(|e| panic!("the {version} client runs: {e}"));
        for (attempt, outcome) in seen.as_object().unwrap() {
            if ["folder_upload", "server_alive", "video_dir"].contains(&attempt.as_str()) {
                continue;
            }
            let outcome = outcome.as_str().unwrap();
            assert!(
                outcome.contains("refused by Flotilla"),
                "{version} {attempt}: {outcome}"
            );
        }
        assert_eq!(
            seen["folder_upload"], r#"ok: ["upload-dir/a.txt:1","upload-dir/sub/b.txt:2"]"#,
            "{version}: {seen}"
        );
        assert_eq!(seen["server_alive"], "ok: 2", "{version}: {seen}");
        assert_eq!(seen["video_dir"], "ok: true", "{version}: {seen}");
    }
    let instance_dir = serve.data_dir.join("agent/instances").join(&id);
    assert_eq!(
        files_named(&instance_dir, "evil"),
        Vec::<std::path::PathBuf>::new()
    );
    assert_eq!(
        files_named(&instance_dir, "recorded"),
        Vec::<std::path::PathBuf>::new()
    );
    assert!(!instance_dir.join("profile/videos-evil").exists());
    let (_, downloads) = serve
        .api
        .get(&format!("/v2/instances/{id}/downloads"))
        .await;
    assert_eq!(downloads["downloads"], serde_json::json!([]), "{downloads}");
    serve.shutdown().await;
}
