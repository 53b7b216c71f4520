//! Dormancy with real Chromium: park, revive with each method, state kept
//! (persistent and session cookies, localStorage, IndexedDB, tabs), 409 and
//! 400 paths, the idle lifecycle on an injected clock, wake on connect, and a
//! park whose snapshot cannot be stored.

use std::sync::Arc;

use serde_json::Value;

use flotilla_api_types::clock::ManualClock;
use flotilla_testkit::{
    BROWSER_DEADLINE, Page, PageServer, StatusCode, TestServe, assert_error, browser_main_pid,
    browser_processes, get_json, indexed_db_get, indexed_db_put, pooled_browser_dirs, run_node,
    serve_page, sorted_keys, spawn_serve_with, spawn_serve_with_clock, wait_until,
};

/// A site with a page that stores state of every kind, and three tab pages.
async fn site() -> PageServer {
    serve_page(&[
        ("/state", "<title>state</title><body>state</body>"),
        ("/a", "<title>A</title>"),
        ("/b", "<title>B</title>"),
    ])
    .await
}

/// Cookies (a persistent and a session one), localStorage and IndexedDB.
fn store_state() -> String {
    format!(
        "(async () => {{
    document.cookie = 'persistent=kept; max-age=86400; path=/';
    document.cookie = 'session=also-kept; path=/';
    localStorage.setItem('local', 'stored');
    await {};
    return true;
}})()",
        indexed_db_put("flotilla", "key", "indexed")
    )
}

/// What [`store_state`] stored, as `{cookie, local, indexed}`.
fn read_state() -> String {
    format!(
        "(async () => {{
    const indexed = await {};
    return {{ cookie: document.cookie, local: localStorage.getItem('local'), indexed }};
}})()",
        indexed_db_get("flotilla", "key")
    )
}

/// Opens the site's `/state` page in the instance behind `debug_url`.
async fn state_page(debug_url: &str, pages: &PageServer) -> Page {
    Page::open(debug_url, &format!("{}/state", pages.base))
        .await
        .unwrap()
}

/// Opens `/state` in the instance behind `debug_url` and checks that its
/// cookies and storage came back.
async fn assert_state_restored(debug_url: &str, pages: &PageServer) {
    let state = state_page(debug_url, pages).await;
    assert_state_back(&state.eval(&read_state()).await.unwrap());
}

fn assert_state_back(state: &Value) {
    assert_cookies_and_local_storage_back(state);
    assert_eq!(state["indexed"], "indexed", "IndexedDB: {state}");
}

/// [`read_state`]'s answer holds the cookies and localStorage of
/// [`store_state`] (IndexedDB aside).
fn assert_cookies_and_local_storage_back(state: &Value) {
    let cookie = state["cookie"].as_str().unwrap_or_default();
    assert!(
        cookie.contains("persistent=kept"),
        "persistent cookie: {state}"
    );
    assert!(
        cookie.contains("session=also-kept"),
        "session cookie: {state}"
    );
    assert_eq!(state["local"], "stored", "localStorage: {state}");
}

async fn page_urls(debug_port: u64) -> Vec<String> {
    let list: Value = get_json(&format!("http://127.0.0.1:{debug_port}/json/list")).await;
    list.as_array()
        .unwrap()
        .iter()
        .filter(|t| t["type"] == "page")
        .map(|t| t["url"].as_str().unwrap().to_owned())
        .collect()
}

/// The test site, `serve` allowed to browse it, and a running instance
/// with state (see [`running_with_state`]): its id and `urls.debug`.
async fn serve_with_state() -> (PageServer, TestServe, String, String) {
    let pages = site().await;
    let serve = spawn_serve_with(|config| pages.allow_in(config)).await;
    let (id, debug_url) = running_with_state(&serve, &pages).await;
    (pages, serve, id, debug_url)
}

/// Opens a tab on each of the site's `paths`; the tabs stay while the
/// answer lives.
async fn open_tabs(debug_url: &str, pages: &PageServer, paths: &[&str]) -> Vec<Page> {
    let mut tabs = Vec::new();
    for path in paths {
        let url = format!("{}/{path}", pages.base);
        tabs.push(Page::open(debug_url, &url).await.unwrap());
    }
    tabs
}

/// A running instance whose page at `/state` stored cookies and storage;
/// its id and `urls.debug`.
async fn running_with_state(serve: &TestServe, pages: &PageServer) -> (String, String) {
    let (id, created, _) = serve.api.create_running("{}").await;
    let debug_url = created["urls"]["debug"].as_str().unwrap().to_owned();
    let page = state_page(&debug_url, pages).await;
    page.eval(&store_state()).await.unwrap();
    drop(page);
    (id, debug_url)
}

async fn revive(serve: &TestServe, id: &str, body: &str) -> Value {
    let (status, reply) = serve
        .api
        .post(&format!("/v2/instances/{id}/revive"), body)
        .await;
    assert_eq!(status, StatusCode::OK, "{reply}");
    reply
}

#[tokio::test]
async fn browser_park_and_revive_keep_cookies_storage_and_tabs() {
    let pages = site().await;
    let serve = spawn_serve_with(|config| pages.allow_in(config)).await;
    let (id, created, _) = serve.api.create_running("{}").await;
    let debug_url = created["urls"]["debug"].as_str().unwrap().to_owned();
    let debug_port = created["debug_port"].as_u64().unwrap();

    let storing = state_page(&debug_url, &pages).await;
    assert_eq!(storing.eval(&store_state()).await.unwrap(), true);
    let _tabs = open_tabs(&debug_url, &pages, &["a", "b"]).await;
    let instance_dir = serve.instances_dir().join(&id).display().to_string();

    // Park: the exact response shape, the browser gone, the snapshot stored.
    let parked = serve.api.park(&id).await;
    assert_eq!(
        sorted_keys(&parked),
        ["dormant_since", "id", "snapshot_id", "status"]
    );
    assert_eq!(parked["status"], "dormant");
    assert!(
        browser_processes(std::path::Path::new(&instance_dir)).is_empty(),
        "the browser's processes are gone"
    );
    let snapshot_file = serve
        .data_dir
        .canonicalize()
        .unwrap()
        .join("snapshots")
        .join(&id)
        .join(format!(
            "{}.tar.zst",
            parked["snapshot_id"].as_str().unwrap()
        ));
    let size = std::fs::metadata(&snapshot_file)
        .expect("the archive is in the store")
        .len();
    assert!(size > 1000 && size < 5_000_000, "archive of {size} bytes");
    let (_, detail) = serve.api.get(&format!("/v2/instances/{id}")).await;
    assert_eq!(detail["status"], "dormant");
    assert_eq!(
        detail["debug_port"].as_u64().unwrap(),
        debug_port,
        "ports stay reserved"
    );

    // Wrong states and bodies.
    assert_error(
        serve
            .api
            .post(&format!("/v2/instances/{id}/dormant"), "")
            .await,
        StatusCode::CONFLICT,
        "invalid_state",
        "only running or idle instances",
    );
    for (bad, mention) in [
        (r#"{"method": "warp"}"#, "method"),
        (r#"{"methd": "quick_start"}"#, "methd"),
        ("[1]", "expected a JSON object"),
        ("{bad json", "invalid request body"),
    ] {
        let revive = format!("/v2/instances/{id}/revive");
        assert_error(
            serve.api.post(&revive, bad).await,
            StatusCode::BAD_REQUEST,
            "invalid_request",
            mention,
        );
    }
    let (status, body) = serve
        .api
        .post(&format!("/v2/instances/{id}/dormant"), r#"{"now": true}"#)
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");

    // quick_start (no body: the default): state back, one blank tab.
    let reviving = revive(&serve, &id, "").await;
    assert_eq!(
        sorted_keys(&reviving),
        ["estimated_completion", "id", "status"]
    );
    assert_eq!(reviving["status"], "reviving");
    let running = serve
        .api
        .wait_for_status(&id, "running", BROWSER_DEADLINE)
        .await;
    assert_eq!(
        running["debug_port"].as_u64().unwrap(),
        debug_port,
        "same ports after revive"
    );
    let urls = page_urls(debug_port).await;
    assert_eq!(urls, ["about:blank"], "quick_start opens one blank tab");
    let state = state_page(&debug_url, &pages).await;
    assert_state_back(&state.eval(&read_state()).await.unwrap());
    // A running instance is not revived.
    assert_error(
        serve
            .api
            .post(&format!("/v2/instances/{id}/revive"), "")
            .await,
        StatusCode::CONFLICT,
        "invalid_state",
        "dormant",
    );

    // full_restore: every tab back at its URL, in its order (DevTools
    // lists the most recently used first: the first tab opened, brought to
    // the front, is first), and the state too.
    let _tabs = open_tabs(&debug_url, &pages, &["a", "b"]).await;
    state.bring_to_front().await.unwrap();
    drop(state);
    // A blank tab is not reopened.
    let before: Vec<String> = page_urls(debug_port)
        .await
        .into_iter()
        .filter(|url| url != "about:blank")
        .collect();
    let mut expected: Vec<String> = ["/a", "/b", "/state"]
        .iter()
        .map(|p| format!("{}{p}", pages.base))
        .collect();
    let mut sorted = before.clone();
    sorted.sort();
    expected.sort();
    assert_eq!(sorted, expected, "the tabs parked");
    serve.api.park(&id).await;
    revive(&serve, &id, r#"{"method": "full_restore"}"#).await;
    serve
        .api
        .wait_for_status(&id, "running", BROWSER_DEADLINE)
        .await;
    assert_eq!(
        page_urls(debug_port).await,
        before,
        "every tab reopened at its URL and in its order, the blank one closed"
    );
    assert_state_restored(&debug_url, &pages).await;

    // Deleting the instance deletes its snapshots.
    serve.api.park(&id).await;
    serve.api.delete_instance(&id).await;
    let left = std::fs::read_dir(snapshot_file.parent().unwrap())
        .map(|d| d.count())
        .unwrap_or(0);
    assert_eq!(left, 0, "no snapshot left");
    serve.shutdown().await;
}

#[tokio::test]
async fn browser_dormant_and_revive_refuse_other_states() {
    let starter = tempfile::tempdir().unwrap();
    let never_ready = starter.path().join("never-ready");
    std::fs::write(&never_ready, "#!/bin/sh\nexec sleep 600\n").unwrap();
    std::fs::set_permissions(
        &never_ready,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let serve = spawn_serve_with(|config| {
        config.agent.launch_timeout_sec = 120;
        for (name, executable) in [
            ("never-ready", never_ready.clone()),
            ("broken", "/nonexistent".into()),
        ] {
            config.agent.images.insert(
                name.into(),
                flotilla_node_agent::config::ImageConfig {
                    executable,
                    args: vec![],
                    engine: Default::default(),
                },
            );
        }
    })
    .await;
    let creating = serve.api.create(r#"{"image": "never-ready"}"#).await;
    let failed = serve.api.create(r#"{"image": "broken"}"#).await;
    let failed_id = failed["id"].as_str().unwrap();
    serve
        .api
        .wait_for_status(failed_id, "failed", BROWSER_DEADLINE)
        .await;
    for instance in [&creating, &failed] {
        let id = instance["id"].as_str().unwrap();
        for operation in ["dormant", "revive"] {
            let path = format!("/v2/instances/{id}/{operation}");
            assert_error(
                serve.api.post(&path, "").await,
                StatusCode::CONFLICT,
                "invalid_state",
                id,
            );
        }
    }
    for operation in ["dormant", "revive"] {
        assert_error(
            serve
                .api
                .post(&format!("/v2/instances/nope/{operation}"), "")
                .await,
            StatusCode::NOT_FOUND,
            "not_found",
            "nope",
        );
    }
    serve.shutdown().await;
}

#[tokio::test]
async fn browser_idle_instances_park_themselves_and_activity_wakes_idle_ones() {
    let clock = Arc::new(ManualClock::new(chrono::Utc::now()));
    // The clock jumps a minute: heartbeats must not look late on it.
    let pages = site().await;
    let serve = spawn_serve_with_clock(
        |config| {
            config.control.nodes.heartbeat_timeout_sec = 3600.0;
            pages.allow_in(config);
        },
        clock.clone(),
    )
    .await;
    let parks = serve
        .api
        .create(r#"{"config": {"idle_timeout_minutes": 1}}"#)
        .await;
    let stays = serve
        .api
        .create(r#"{"config": {"idle_timeout_minutes": 1, "auto_snapshot": false}}"#)
        .await;
    let (parks_id, stays_id) = (parks["id"].as_str().unwrap(), stays["id"].as_str().unwrap());
    serve
        .api
        .wait_for_status(parks_id, "running", BROWSER_DEADLINE)
        .await;
    serve
        .api
        .wait_for_status(stays_id, "running", BROWSER_DEADLINE)
        .await;

    clock.advance(chrono::Duration::seconds(61));
    let parked = serve
        .api
        .wait_for_status(parks_id, "dormant", BROWSER_DEADLINE)
        .await;
    assert!(
        parked["activity"]["idle_minutes"].as_f64().unwrap() >= 1.0,
        "{parked}"
    );
    serve
        .api
        .wait_for_status(stays_id, "idle", BROWSER_DEADLINE)
        .await;

    // Activity on the idle one (CDP traffic through its gateway), a second later,
    // makes it run again.
    clock.advance(chrono::Duration::seconds(1));
    let page = Page::open(
        stays["urls"]["debug"].as_str().unwrap(),
        &format!("{}/a", pages.base),
    )
    .await
    .unwrap();
    assert_eq!(page.eval("document.title").await.unwrap(), "A");
    serve
        .api
        .wait_for_status(stays_id, "running", BROWSER_DEADLINE)
        .await;
    serve.shutdown().await;
}

#[tokio::test]
async fn browser_a_cdp_client_wakes_a_dormant_instance() {
    let (pages, serve, id, debug_url) = serve_with_state().await;
    let tabs = open_tabs(&debug_url, &pages, &["a", "b"]).await;
    serve.api.park(&id).await;
    drop(tabs);

    // Playwright connects to the dormant instance's unchanged urls.debug.
    let woken = run_node(
        "playwright_eval.mjs",
        &[&debug_url, &format!("{}/state", pages.base), &read_state()],
    )
    .await
    .unwrap();
    assert_eq!(woken["title"], "state");
    assert_state_back(&woken["value"]);
    let (_, detail) = serve.api.get(&format!("/v2/instances/{id}")).await;
    assert_eq!(detail["status"], "running", "{detail}");
    // Woken with agent.wake_on_connect_method, full_restore by default: the
    // client finds its tabs.
    let urls = page_urls(detail["debug_port"].as_u64().unwrap()).await;
    for path in ["/a", "/b"] {
        let url = format!("{}{path}", pages.base);
        assert!(urls.contains(&url), "{url} reopened: {urls:?}");
    }
    serve.shutdown().await;
}

#[tokio::test]
async fn browser_a_park_that_cannot_store_its_snapshot_leaves_the_instance_running() {
    let (pages, serve, id, debug_url) = serve_with_state().await;

    // The snapshot directory becomes a file: every write into it fails.
    let snapshots = serve.data_dir.canonicalize().unwrap().join("snapshots");
    std::fs::remove_dir_all(&snapshots).unwrap();
    std::fs::write(&snapshots, b"not a directory").unwrap();
    let (status, body) = serve
        .api
        .post(&format!("/v2/instances/{id}/dormant"), "")
        .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert!(
        body["detail"]
            .as_str()
            .unwrap()
            .contains("the instance keeps running"),
        "{body}"
    );
    let (_, detail) = serve.api.get(&format!("/v2/instances/{id}")).await;
    assert_eq!(detail["status"], "running", "nothing was parked: {detail}");
    assert!(detail.get("snapshot_id").is_none());
    // The browser was closed for the attempt and started again: its tab is back.
    let debug_port = detail["debug_port"].as_u64().unwrap();
    assert_eq!(
        page_urls(debug_port).await,
        [format!("{}/state", pages.base)]
    );
    assert_state_restored(&debug_url, &pages).await;
    serve.shutdown().await;
}

fn s3_config(
    endpoint: &str,
    timeout_sec: Option<f64>,
) -> flotilla_node_agent::snapshot::SnapshotsConfig {
    flotilla_node_agent::snapshot::SnapshotsConfig {
        url: Some("s3://flotilla-snapshots/fleet-a".into()),
        endpoint: Some(endpoint.to_owned()),
        region: Some("us-east-1".into()),
        access_key_id: Some("test".into()),
        secret_access_key: Some("test".into()),
        allow_http: true,
        timeout_sec,
        store_id: None,
    }
}

#[tokio::test]
async fn browser_an_unreachable_snapshot_store_leaves_instances_where_they_were() {
    let mut s3 = flotilla_testkit::S3Server::start("flotilla-snapshots")
        .await
        .unwrap();
    let pages = site().await;
    let endpoint = s3.endpoint.clone();
    let serve = spawn_serve_with(|config| {
        pages.allow_in(config);
        config.snapshots = s3_config(&endpoint, Some(3.0));
    })
    .await;
    let (id, debug_url) = running_with_state(&serve, &pages).await;
    let status_of = || async {
        let (_, detail) = serve.api.get(&format!("/v2/instances/{id}")).await;
        detail
    };

    // The store is down (connections refused): the park answers 503 naming
    // the store, and the instance runs on with its state.
    s3.stop().await;
    let (status, body) = serve
        .api
        .post(&format!("/v2/instances/{id}/dormant"), "")
        .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    let detail = body["detail"].as_str().unwrap();
    assert!(detail.contains("s3://flotilla-snapshots/fleet-a"), "{body}");
    assert!(detail.contains("the instance keeps running"), "{body}");
    assert_eq!(status_of().await["status"], "running");
    assert_state_restored(&debug_url, &pages).await;

    // Back (empty, as a restarted moto is): the park works.
    s3.restart().await.unwrap();
    let parked = serve.api.park(&id).await;
    assert_eq!(parked["status"], "dormant");

    // The store hangs (frozen): the revive answers 503 within the store
    // timeout, and the instance stays dormant with its snapshot.
    s3.pause();
    let (status, body) = serve
        .api
        .post(&format!("/v2/instances/{id}/revive"), "")
        .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert!(
        body["detail"].as_str().unwrap().contains("stays dormant"),
        "{body}"
    );
    let detail = status_of().await;
    assert_eq!(detail["status"], "dormant", "{detail}");

    // A connecting client wakes it while the store still hangs: the revive
    // gives up after the store timeout and the instance is dormant again.
    let waking = tokio::spawn(tokio_tungstenite::connect_async(debug_url.clone()));
    for (status, what) in [
        ("reviving", "the client to wake it"),
        ("dormant", "the failed wake to leave it dormant"),
    ] {
        wait_until(BROWSER_DEADLINE, what, || async {
            let detail = status_of().await;
            Ok::<_, String>((detail["status"] == status).then_some(()))
        })
        .await
        .unwrap();
    }
    let detail = status_of().await;
    assert!(
        detail["status_reason"]
            .as_str()
            .is_some_and(|reason| reason.contains("stays dormant")),
        "{detail}"
    );
    waking.abort();

    // Thawed: its snapshot is still there, and the revive brings everything back.
    s3.resume();
    assert_eq!(
        s3.keys("fleet-a/").await,
        [format!(
            "fleet-a/{id}/{}.tar.zst",
            parked["snapshot_id"].as_str().unwrap()
        )]
    );
    revive(&serve, &id, "").await;
    serve
        .api
        .wait_for_status(&id, "running", BROWSER_DEADLINE)
        .await;
    assert_state_restored(&debug_url, &pages).await;
    serve.shutdown().await;
}

#[tokio::test]
async fn browser_snapshots_in_an_s3_compatible_bucket() {
    let s3 = flotilla_testkit::S3Server::start("flotilla-snapshots")
        .await
        .unwrap();
    let endpoint = s3.endpoint.clone();
    let pages = site().await;
    let serve = spawn_serve_with(|config| {
        pages.allow_in(config);
        config.snapshots = s3_config(&endpoint, None);
    })
    .await;
    let (id, debug_url) = running_with_state(&serve, &pages).await;

    let parked = serve.api.park(&id).await;
    let key = format!(
        "fleet-a/{id}/{}.tar.zst",
        parked["snapshot_id"].as_str().unwrap()
    );
    assert_eq!(
        s3.keys("fleet-a/").await,
        [key],
        "the archive is in the bucket"
    );
    assert!(
        !serve
            .data_dir
            .canonicalize()
            .unwrap()
            .join("snapshots")
            .join(&id)
            .exists()
    );

    revive(&serve, &id, "").await;
    serve
        .api
        .wait_for_status(&id, "running", BROWSER_DEADLINE)
        .await;
    assert_state_restored(&debug_url, &pages).await;
    wait_until(
        BROWSER_DEADLINE,
        "the spent snapshot to be deleted",
        || async {
            let keys = s3.keys("fleet-a/").await;
            if keys.is_empty() {
                Ok(Some(()))
            } else {
                Err(format!("{keys:?}"))
            }
        },
    )
    .await
    .unwrap();

    serve.api.park(&id).await;
    serve.api.delete_instance(&id).await;
    assert!(
        s3.keys("fleet-a/").await.is_empty(),
        "deleting the instance deleted its snapshot"
    );
    serve.shutdown().await;
}

#[tokio::test]
async fn browser_an_agent_draining_its_node_to_stop_wakes_nothing_there() {
    let serve = spawn_serve_with(|config| config.agent.drain_on_shutdown = true).await;
    let (id, _, detail) = serve.api.create_running("{}").await;
    let debug_port = detail["debug_port"].as_u64().unwrap();
    serve.api.park(&id).await;
    serve
        .api
        .wait_for_status(&id, "dormant", BROWSER_DEADLINE)
        .await;

    // The node's only instance is parked and no other node can take
    // anything: the drain is over at once. From its start a client of the
    // dormant instance is refused at once rather than waking it on a node
    // whose agent is about to stop.
    serve.serve().agent.drain_before_shutdown().await;
    let answer = reqwest::get(format!("http://127.0.0.1:{debug_port}/json/version"))
        .await
        .unwrap();
    assert_eq!(answer.status(), StatusCode::SERVICE_UNAVAILABLE);
    let (_, detail) = serve.api.get(&format!("/v2/instances/{id}")).await;
    assert_eq!(detail["status"], "dormant", "{detail}");
    serve.shutdown().await;
}

/// Cookies and localStorage only: everything a warm browser can be given.
const STORE_COOKIES_AND_LOCAL_STORAGE: &str = "(() => {
    document.cookie = 'persistent=kept; max-age=86400; path=/';
    document.cookie = 'session=also-kept; path=/';
    localStorage.setItem('local', 'stored');
    return true;
})()";

/// The pooled browsers' directories under `instances`, other than `taken`.
fn pool_dirs(instances: &std::path::Path, taken: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut dirs = pooled_browser_dirs(instances);
    dirs.retain(|dir| dir != taken);
    dirs
}

#[tokio::test]
async fn browser_a_revive_takes_a_warm_browser_unless_the_snapshot_holds_what_only_files_carry() {
    let pages = site().await;
    let serve = spawn_serve_with(|config| {
        pages.allow_in(config);
        config.agent.warm_pool_size = 1;
    })
    .await;
    let agent = serve.serve().agent.clone();
    serve.wait_for_warm_pool(1, "the warm pool to fill").await;
    let (id, created, _) = serve.api.create_running("{}").await;
    let debug_url = created["urls"]["debug"].as_str().unwrap().to_owned();
    let debug_port = created["debug_port"].as_u64().unwrap();
    let instances = serve.instances_dir();
    // A warm create: the instance's directory is the pooled browser's.
    let [instance_dir] = pool_dirs(&instances, std::path::Path::new(""))
        .try_into()
        .unwrap();
    let state = state_page(&debug_url, &pages).await;
    assert_eq!(
        state.eval(STORE_COOKIES_AND_LOCAL_STORAGE).await.unwrap(),
        true
    );
    let _tabs = open_tabs(&debug_url, &pages, &["a", "b"]).await;
    state.bring_to_front().await.unwrap();
    drop(state);
    std::fs::write(instance_dir.join("downloads/report.txt"), b"kept").unwrap();
    // A blank tab is not reopened.
    let before: Vec<String> = page_urls(debug_port)
        .await
        .into_iter()
        .filter(|url| url != "about:blank")
        .collect();
    serve.wait_for_warm_pool(1, "the warm pool to refill").await;
    let [pooled] = pool_dirs(&instances, &instance_dir).try_into().unwrap();
    let pooled_pid = browser_main_pid(&pooled).expect("the pooled browser runs");

    // Cookies, localStorage and tabs are all the snapshot holds: the revive
    // takes the pooled browser and writes them into it.
    serve.api.park(&id).await;
    revive(&serve, &id, r#"{"method": "full_restore"}"#).await;
    serve
        .api
        .wait_for_status(&id, "running", BROWSER_DEADLINE)
        .await;
    assert!(
        !pooled.exists(),
        "the pooled browser's folder became the instance's"
    );
    assert_eq!(
        browser_main_pid(&pooled),
        Some(pooled_pid),
        "the pooled browser still runs"
    );
    assert_eq!(
        page_urls(debug_port).await,
        before,
        "every tab reopened at its URL and in its order"
    );
    let state = state_page(&debug_url, &pages).await;
    assert_cookies_and_local_storage_back(&state.eval(&read_state()).await.unwrap());
    assert_eq!(
        std::fs::read(instance_dir.join("downloads/report.txt")).unwrap(),
        b"kept",
        "the snapshot's downloads are in the instance's folder"
    );

    // IndexedDB is only in the profile's files: the next revive launches on
    // them and leaves the pool alone.
    assert_eq!(state.eval(&store_state()).await.unwrap(), true);
    drop(state);
    serve.wait_for_warm_pool(1, "the warm pool to refill").await;
    let [pooled] = pool_dirs(&instances, &instance_dir).try_into().unwrap();
    serve.api.park(&id).await;
    revive(&serve, &id, "").await;
    serve
        .api
        .wait_for_status(&id, "running", BROWSER_DEADLINE)
        .await;
    assert!(pooled.exists(), "the pooled browser was not taken");
    assert_eq!(agent.warm_pool_ready(), 1);
    assert_state_restored(&debug_url, &pages).await;
    crate::browser_runtime::wait_for_metrics(
        &serve,
        "a warm revive and one on the files",
        |metrics| {
            let count = |outcome| {
                let labels = [("image", "ubuntu:22.04"), ("outcome", outcome)];
                crate::operations::sample_value(metrics, "service_warm_pool_revives_total", &labels)
            };
            count("hit") == Some(1.0) && count("miss") == Some(1.0)
        },
    )
    .await;

    serve.api.delete_instance(&id).await;
    assert!(
        browser_main_pid(&instance_dir).is_none() && browser_main_pid(&pooled).is_some(),
        "the instance's browser ends with it, the pool's stays"
    );
    serve.shutdown().await;
    assert!(
        browser_processes(&instances).is_empty(),
        "no browser outlives the agent"
    );
}

#[tokio::test]
async fn browser_full_restore_rebuilds_a_tabs_history_session_storage_and_scroll() {
    let pages = serve_page(&[
        ("/a", "<title>A</title>"),
        ("/b", "<title>B</title>"),
        (
            "/long",
            "<title>long</title><body style='height: 5000px'>long</body>",
        ),
    ])
    .await;
    let serve = spawn_serve_with(|config| pages.allow_in(config)).await;
    let (id, created, _) = serve.api.create_running("{}").await;
    let debug_url = created["urls"]["debug"].as_str().unwrap().to_owned();
    let debug_port = created["debug_port"].as_u64().unwrap();
    let url = |path: &str| format!("{}{path}", pages.base);
    let tab = Page::open(&debug_url, &url("/a")).await.unwrap();
    tab.navigate(&url("/b")).await.unwrap();
    tab.navigate(&url("/long")).await.unwrap();
    let scrolled = tab
        .eval("sessionStorage.setItem('step', 'three'); window.scrollTo(0, 1200); scrollY")
        .await
        .unwrap();
    assert_eq!(scrolled, 1200);
    drop(tab);
    serve.api.park(&id).await;
    let loads = |path: &str| pages.requested().iter().filter(|p| *p == path).count();
    let before = [loads("/a"), loads("/b"), loads("/long")];

    revive(&serve, &id, r#"{"method": "full_restore"}"#).await;
    serve
        .api
        .wait_for_status(&id, "running", BROWSER_DEADLINE)
        .await;
    let list: Value = get_json(&format!("http://127.0.0.1:{debug_port}/json/list")).await;
    let target = list
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["type"] == "page" && t["url"] == url("/long"))
        .unwrap_or_else(|| panic!("the tab is back: {list}"));
    let tab = Page::attach(&debug_url, target["id"].as_str().unwrap())
        .await
        .unwrap();
    // Its page loads from the site, then scrolls where it was.
    wait_until(BROWSER_DEADLINE, "the page scrolled back", || async {
        match tab.eval("scrollY").await {
            Ok(y) if y == 1200 => Ok(Some(())),
            other => Err(format!("{other:?}")),
        }
    })
    .await
    .unwrap();
    assert_eq!(tab.eval("document.title").await.unwrap(), "long");
    assert_eq!(
        tab.eval("sessionStorage.getItem('step')").await.unwrap(),
        "three"
    );
    let history = tab
        .call("Page.getNavigationHistory", serde_json::json!({}))
        .await
        .unwrap();
    let entries: Vec<(&str, &str)> = history["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["url"].as_str().unwrap(), e["title"].as_str().unwrap()))
        .collect();
    let (a, b, long) = (url("/a"), url("/b"), url("/long"));
    assert_eq!(
        entries,
        [
            (a.as_str(), "A"),
            (b.as_str(), "B"),
            (long.as_str(), "long")
        ],
        "{history}"
    );
    assert_eq!(history["currentIndex"], 2, "{history}");
    assert_eq!(
        [loads("/a"), loads("/b"), loads("/long")],
        [before[0], before[1], before[2] + 1],
        "only the current page is loaded from the site: {:?}",
        pages.requested()
    );

    // Going back loads the earlier page from the site.
    tab.eval("history.back(); true").await.unwrap();
    wait_until(BROWSER_DEADLINE, "the page before to load", || async {
        let page = tab
            .eval("document.readyState + ' ' + location.pathname + ' ' + document.title")
            .await;
        match page {
            Ok(page) if page == "complete /b B" && loads("/b") == before[1] + 1 => Ok(Some(())),
            other => Err(format!("{other:?}")),
        }
    })
    .await
    .unwrap();
    serve.shutdown().await;
}
