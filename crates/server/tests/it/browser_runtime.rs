//! The browser runtime with real Chromium: sandbox isolation, cgroup limits
//! (memory, CPU, disk), the instance HTTP API, the live view and the warm pool.

use std::time::Duration;

use serde_json::Value;

use flotilla_testkit::{
    BROWSER_DEADLINE, Page, StatusCode, TestServe, browser_main_pid, browser_processes,
    cpu_weight_of, get_json, get_text, serve_page, spawn_serve, spawn_serve_with,
    spawn_serve_with_page, wait_browser_processes_gone, wait_until,
};

use crate::operations::sample_value;

async fn running_instance(serve: &TestServe, body: &str) -> Value {
    let (_, created, _) = serve.api.create_running(body).await;
    created
}

fn debug_url(created: &Value) -> &str {
    created["urls"]["debug"].as_str().unwrap()
}

/// The agent started without a warning about `feature` (bubblewrap, a
/// writable cgroup hierarchy: scripts/install-deps sets both up).
fn assert_agent_has(serve: &TestServe, feature: &str) {
    let warnings = serve.serve().agent.warnings();
    assert!(
        warnings.iter().all(|w| !w.contains(feature)),
        "this test needs {feature} (scripts/install-deps sets it up): {warnings:?}"
    );
}

#[tokio::test]
async fn browser_instances_cannot_see_each_others_processes_files_or_cookies() {
    let (pages, serve) = spawn_serve_with_page("<title>cookie jar</title>", |_| {}).await;
    assert_agent_has(&serve, "bubblewrap");
    let a = running_instance(&serve, "{}").await;
    let b = running_instance(&serve, "{}").await;
    let a_dir = serve.instances_dir().join(a["id"].as_str().unwrap());
    let b_dir = serve.instances_dir().join(b["id"].as_str().unwrap());

    let page_a = Page::open(debug_url(&a), "file:///proc/").await.unwrap();
    let listing = page_a.eval("document.body.innerText").await.unwrap();
    let pids_seen_by_a = listing
        .as_str()
        .unwrap()
        .lines()
        .filter(|line| {
            line.split_whitespace()
                .next()
                .is_some_and(|w| w.trim_end_matches('/').parse::<u32>().is_ok())
        })
        .count();
    let host_browser_processes = browser_processes(&a_dir).len() + browser_processes(&b_dir).len();
    assert!(
        pids_seen_by_a > 0,
        "the listing shows A's own processes: {listing}"
    );
    assert!(
        pids_seen_by_a < host_browser_processes,
        "A sees {pids_seen_by_a} processes, the host runs {host_browser_processes} for A and B"
    );

    // Its own profile, where its sandbox shows it.
    page_a.navigate("file:///instance/profile/").await.unwrap();
    let own = page_a.eval("document.body.innerText").await.unwrap();
    assert!(
        own.as_str().unwrap().contains("Default"),
        "A sees its own profile: {own}"
    );
    for hidden in [
        b_dir.join("profile"),
        serve.data_dir.canonicalize().unwrap().join("flotilla.db"),
    ] {
        page_a
            .navigate(&format!("file://{}", hidden.display()))
            .await
            .unwrap();
        let href = page_a.eval("location.href").await.unwrap();
        let text = page_a.eval("document.body.innerText").await.unwrap();
        assert!(
            href.as_str().unwrap().starts_with("chrome-error://")
                || text.as_str().unwrap().contains("ERR_FILE_NOT_FOUND"),
            "A must not see {}: {href} {text}",
            hidden.display()
        );
    }

    page_a.navigate(&format!("{}/", pages.base)).await.unwrap();
    page_a
        .eval("document.cookie = 'secret=from-a; max-age=3600'")
        .await
        .unwrap();
    let page_b = Page::open(debug_url(&b), &format!("{}/", pages.base))
        .await
        .unwrap();
    let a_cookies = page_a
        .call("Network.getAllCookies", serde_json::json!({}))
        .await
        .unwrap();
    let b_cookies = page_b
        .call("Network.getAllCookies", serde_json::json!({}))
        .await
        .unwrap();
    let names = |cookies: &Value| -> Vec<String> {
        cookies["cookies"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap().to_owned())
            .collect()
    };
    assert!(names(&a_cookies).contains(&"secret".to_owned()));
    assert!(
        !names(&b_cookies).contains(&"secret".to_owned()),
        "B sees no cookie of A"
    );
    serve.shutdown().await;
}

#[tokio::test]
async fn browser_memory_limit_kills_the_hog_and_the_rest_lives_on() {
    let (pages, serve) = spawn_serve_with_page("<title>hog</title>", |_| {}).await;
    assert_agent_has(&serve, "cgroup");
    let hog = running_instance(&serve, r#"{"config": {"memory_gb": 0.5}}"#).await;
    let bystander = running_instance(&serve, "{}").await;
    let hog_id = hog["id"].as_str().unwrap();

    let page = Page::open(debug_url(&hog), &format!("{}/", pages.base))
        .await
        .unwrap();
    // Allocate and touch 16 MiB at a time, far past 0.5 GB; don't await the end.
    page.eval(
        "window.hog = []; setTimeout(async () => { for (let i = 0; i < 400; i++) { \
         hog.push(new Uint8Array(16 << 20).fill(7)); await new Promise(r => setTimeout(r, 5)); } }, 0); true",
    )
    .await
    .unwrap();
    let detail = wait_until(
        BROWSER_DEADLINE,
        "the memory limit to be reported",
        || async {
            let (_, detail) = serve.api.get(&format!("/v2/instances/{hog_id}")).await;
            let reason = detail["status_reason"].as_str().unwrap_or_default();
            if reason.contains("memory limit") {
                Ok(Some(detail))
            } else {
                Err(detail.to_string())
            }
        },
    )
    .await
    .unwrap();
    assert!(
        ["running", "stopped"].contains(&detail["status"].as_str().unwrap()),
        "{detail}"
    );
    assert!(
        detail["status_reason"]
            .as_str()
            .unwrap()
            .contains("memory_gb = 0.5"),
        "{detail}"
    );

    // The agent and the other instance are fine.
    let (status, health) = serve.api.get("/health").await;
    assert_eq!(status, StatusCode::OK, "{health}");
    let other = Page::open(debug_url(&bystander), &format!("{}/", pages.base))
        .await
        .unwrap();
    assert_eq!(other.eval("document.title").await.unwrap(), "hog");
    let (_, other_detail) = serve
        .api
        .get(&format!(
            "/v2/instances/{}",
            bystander["id"].as_str().unwrap()
        ))
        .await;
    assert_eq!(other_detail["status"], "running");
    serve.shutdown().await;
}

#[tokio::test]
async fn browser_cpu_quota_caps_a_busy_page() {
    let (pages, serve) = spawn_serve_with_page("<title>busy</title>", |config| {
        config.agent.cpu_quota_per_core = 0.5;
    })
    .await;
    assert_agent_has(&serve, "cgroup");
    let busy = running_instance(&serve, r#"{"config": {"cpu_cores": 1}}"#).await;
    let id = busy["id"].as_str().unwrap();
    let page = Page::open(debug_url(&busy), &format!("{}/", pages.base))
        .await
        .unwrap();
    page.eval("setTimeout(() => { const end = Date.now() + 120000; while (Date.now() < end) {} }, 0); true")
        .await
        .unwrap();
    // Heartbeats every 0.5 s: collect 8 distinct samples once the loop runs.
    let mut samples = Vec::new();
    let mut last_seen = String::new();
    let deadline = tokio::time::Instant::now() + BROWSER_DEADLINE;
    while samples.len() < 8 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no CPU samples of the busy page: {samples:?}"
        );
        let (_, detail) = serve.api.get(&format!("/v2/instances/{id}")).await;
        let sample = detail["resources"]["cpu_percent"].as_f64().unwrap_or(0.0);
        let stamp = detail["resources"].to_string();
        if sample > 5.0 && stamp != last_seen {
            samples.push(sample);
            last_seen = stamp;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mean = samples.iter().sum::<f64>() / samples.len() as f64;
    assert!(
        mean <= 65.0,
        "a half-core quota caps the busy page near 50 % of a core: {samples:?}"
    );
    assert!(mean >= 20.0, "the busy page did run: {samples:?}");
    serve.shutdown().await;
}

#[tokio::test]
async fn browser_profile_over_disk_limit_fails_the_instance() {
    let serve = spawn_serve().await;
    // A fresh Chromium profile is a few megabytes: over a 1 MB limit at once.
    let created = serve.api.create(r#"{"config": {"disk_gb": 0.001}}"#).await;
    let id = created["id"].as_str().unwrap();
    let detail = serve
        .api
        .wait_for_status(id, "failed", BROWSER_DEADLINE)
        .await;
    assert!(
        detail["status_reason"]
            .as_str()
            .unwrap()
            .contains("disk limit"),
        "{detail}"
    );
    let dir = serve.instances_dir().join(id);
    wait_browser_processes_gone(&dir).await;
    serve.shutdown().await;
}

#[tokio::test]
async fn browser_instance_api_serves_tabs_screenshot_and_page() {
    let pages = serve_page(&[(
        "/shot",
        "<title>Shot</title><body style='background:#0a0'>green</body>",
    )])
    .await;
    let serve = spawn_serve_with(|config| pages.allow_in(config)).await;
    let created = running_instance(&serve, "{}").await;
    let http_port = created["http_port"].as_u64().unwrap();
    let stream_port = created["stream_port"].as_u64().unwrap();
    let _page = Page::open(debug_url(&created), &format!("{}/shot", pages.base))
        .await
        .unwrap();
    let http = reqwest::Client::new();
    let base = format!("http://127.0.0.1:{http_port}");

    let tabs: Value = get_json(&format!("{base}/tabs")).await;
    let tab = tabs
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["title"] == "Shot")
        .unwrap_or_else(|| panic!("the opened tab is listed: {tabs}"));
    assert!(tab["id"].is_string() && tab["url"].as_str().unwrap().ends_with("/shot"));
    assert!(
        tabs.as_array()
            .unwrap()
            .iter()
            .all(|t| !t["url"].as_str().unwrap().starts_with("chrome://")),
        "only pages: {tabs}"
    );

    let response = http
        .get(format!(
            "{base}/screenshot?tab={}",
            tab["id"].as_str().unwrap()
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["content-type"], "image/png");
    let png = response.bytes().await.unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "a PNG file");
    let width = u32::from_be_bytes(png[16..20].try_into().unwrap());
    let height = u32::from_be_bytes(png[20..24].try_into().unwrap());
    assert_eq!((width, height), (1280, 720), "the default viewport");

    let missing = http
        .get(format!("{base}/screenshot?tab=nope"))
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status(), StatusCode::NOT_FOUND);
    let bad = http
        .get(format!("{base}/screenshot?format=jpeg"))
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), StatusCode::BAD_REQUEST);

    let index = get_text(&format!("{base}/")).await;
    assert!(
        index.contains(&format!(":{stream_port}/")),
        "the page embeds the live view: {index}"
    );
    serve.shutdown().await;
}

/// The width and height in a PNG's header.
fn png_size(png: &[u8]) -> (u64, u64) {
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "a PNG file");
    let side = |at: usize| u64::from(u32::from_be_bytes(png[at..at + 4].try_into().unwrap()));
    (side(16), side(20))
}

/// A page as wide as the viewport, filled with noise (no PNG compresses it).
const NOISE: &str = "<title>noise</title><body style=margin:0><canvas id=c></canvas><script>
const c = document.getElementById('c'); c.width = innerWidth; c.height = innerHeight;
const g = c.getContext('2d'); const d = g.createImageData(c.width, c.height);
crypto.getRandomValues(d.data.subarray(0, 65536));
for (let i = 65536; i < d.data.length; i += 65536) d.data.copyWithin(i, (i * 7919) % 65536, 65536);
for (let i = 3; i < d.data.length; i += 4) d.data[i] = 255;
g.putImageData(d, 0, 0); document.title = 'noisy';</script>";

#[tokio::test]
async fn browser_screenshots_are_bounded_in_pixels_bytes_and_number() {
    let pages = serve_page(&[("/plain", "<title>plain</title>"), ("/noise", NOISE)]).await;
    let serve = spawn_serve_with(|config| {
        pages.allow_in(config);
        config.agent.screenshot_max_bytes = 2 << 20;
    })
    .await;
    let created = running_instance(&serve, "{}").await;
    let base = format!("http://127.0.0.1:{}", created["http_port"]);
    let page = Page::open(debug_url(&created), &format!("{}/plain", pages.base))
        .await
        .unwrap();
    // What the report used: a 6000×6000 viewport at device scale 2, 144
    // million pixels (a 108 MB PNG buffered whole).
    page.call(
        "Emulation.setDeviceMetricsOverride",
        serde_json::json!({"width": 6000, "height": 6000, "deviceScaleFactor": 2, "mobile": false}),
    )
    .await
    .unwrap();
    let tabs: Value = get_json(&format!("{base}/tabs")).await;
    let tab = tabs
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["title"] == "plain")
        .unwrap();
    let shot_url = format!("{base}/screenshot?tab={}", tab["id"].as_str().unwrap());
    let http = reqwest::Client::new();
    let response = http.get(&shot_url).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let scale: f64 = response.headers()["x-screenshot-scale"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let (width, height) = png_size(&response.bytes().await.unwrap());
    assert!(width * height <= 4096 * 4096, "{width}×{height}");
    assert!(
        width > 3000 && scale < 1.0,
        "scaled to fit: {width}×{height} at {scale}"
    );

    // Eight at once: each one answered, the image or a clear 503, never a hang.
    let answers = futures_util::future::join_all((0..8).map(|_| http.get(&shot_url).send())).await;
    for answer in answers {
        let answer = answer.unwrap();
        let status = answer.status();
        let body = answer.bytes().await.unwrap();
        match status {
            StatusCode::OK => assert!(png_size(&body).0 <= 4096),
            StatusCode::SERVICE_UNAVAILABLE => {
                let error: Value = serde_json::from_slice(&body).unwrap();
                assert_eq!(error["code"], "insufficient_capacity", "{error}");
            }
            other => panic!("{other}: {}", String::from_utf8_lossy(&body)),
        }
    }

    // Noise does not compress: over screenshot_max_bytes, refused.
    page.navigate(&format!("{}/noise", pages.base))
        .await
        .unwrap();
    wait_until(BROWSER_DEADLINE, "the noise to be drawn", || async {
        let title = page
            .eval("document.title")
            .await
            .map_err(|e| e.to_string())?;
        Ok::<_, String>((title == "noisy").then_some(()))
    })
    .await
    .unwrap();
    let response = http.get(&shot_url).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE);
    let error: Value = response.json().await.unwrap();
    assert_eq!(error["code"], "payload_too_large", "{error}");
    assert!(
        error["detail"]
            .as_str()
            .unwrap()
            .contains("screenshot_max_bytes"),
        "{error}"
    );
    serve.shutdown().await;
}

/// Reads an MJPEG stream and counts the frames received until `stop`.
async fn count_mjpeg_frames(url: String, stop: tokio_util::sync::CancellationToken) -> usize {
    let mut response = reqwest::get(&url).await.unwrap();
    assert!(
        response.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("multipart/x-mixed-replace")
    );
    let mut frames: usize = 0;
    let mut carry = Vec::new();
    loop {
        let chunk = tokio::select! {
            chunk = response.chunk() => chunk.unwrap(),
            // The stream opens with a boundary; each frame is closed by the next one.
            _ = stop.cancelled() => return frames.saturating_sub(1),
        };
        let Some(chunk) = chunk else {
            return frames.saturating_sub(1);
        };
        carry.extend_from_slice(&chunk);
        while let Some(pos) = carry.windows(15).position(|w| w == b"--flotillaframe") {
            frames += 1;
            carry.drain(..pos + 15);
        }
    }
}

#[tokio::test]
async fn browser_live_view_feeds_every_viewer_and_a_stalled_one_blocks_nobody() {
    let animated = "<title>anim</title><body style='margin:0'><div id=d style='width:100vw;height:100vh'></div>\
        <script>let n = 0; (function f(){ n++; d.style.background = 'hsl(' + (n * 7 % 360) + ',80%,50%)'; \
        d.textContent = n; requestAnimationFrame(f); })();</script></body>";
    let pages = serve_page(&[("/anim", animated)]).await;
    let serve = spawn_serve_with(|config| pages.allow_in(config)).await;
    let created = running_instance(&serve, "{}").await;
    let stream_port = created["stream_port"].as_u64().unwrap();
    let id = created["id"].as_str().unwrap().to_owned();
    // The live view shows the first tab: load the animation there.
    let debug_port = created["debug_port"].as_u64().unwrap();
    let list: Value = get_json(&format!("http://127.0.0.1:{debug_port}/json/list")).await;
    let first = list
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["type"] == "page")
        .unwrap()["webSocketDebuggerUrl"]
        .as_str()
        .unwrap()
        .to_owned();
    let tab = flotilla_node_agent::engine::cdp::CdpClient::connect(&first)
        .await
        .unwrap();
    tab.call(
        "Page.navigate",
        serde_json::json!({"url": format!("{}/anim", pages.base)}),
        None,
        Duration::from_secs(30),
    )
    .await
    .unwrap();

    // A viewer that connects and then never reads.
    let mut stalled = tokio::net::TcpStream::connect(("127.0.0.1", stream_port as u16))
        .await
        .unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut stalled, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();

    let stop = tokio_util::sync::CancellationToken::new();
    let url = format!("http://127.0.0.1:{stream_port}/");
    let first_viewer = tokio::spawn(count_mjpeg_frames(url.clone(), stop.clone()));
    let second_viewer = tokio::spawn(count_mjpeg_frames(url.clone(), stop.clone()));

    // A WebSocket viewer gets binary JPEG frames.
    let (mut socket, _) =
        tokio_tungstenite::connect_async(format!("ws://127.0.0.1:{stream_port}/ws"))
            .await
            .unwrap();
    let mut ws_frames = 0;
    while ws_frames < 10 {
        let message =
            tokio::time::timeout(BROWSER_DEADLINE, futures_util::StreamExt::next(&mut socket))
                .await
                .expect("ws frames keep coming")
                .unwrap()
                .unwrap();
        if let tokio_tungstenite::tungstenite::Message::Binary(jpeg) = message {
            assert_eq!(&jpeg[..2], &[0xFF, 0xD8], "a JPEG");
            ws_frames += 1;
        }
    }
    // Let the MJPEG viewers run for two seconds of animation after the stall.
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.cancel();
    let (first_count, second_count) = (first_viewer.await.unwrap(), second_viewer.await.unwrap());
    assert!(
        first_count >= 10 && second_count >= 10,
        "both viewers got frames: {first_count}, {second_count}"
    );

    let frame = reqwest::get(format!("http://127.0.0.1:{stream_port}/frame.jpg"))
        .await
        .unwrap();
    assert_eq!(frame.headers()["content-type"], "image/jpeg");
    // Viewers count as activity.
    let (_, detail) = serve.api.get(&format!("/v2/instances/{id}")).await;
    assert!(
        detail["activity"]["idle_minutes"].as_f64().unwrap() < 0.5,
        "{detail}"
    );
    drop(stalled);
    serve.shutdown().await;
}

/// Waits until `serve`'s `/metrics` satisfies `counted` (`what` it waits for).
pub(crate) async fn wait_for_metrics(
    serve: &TestServe,
    what: &str,
    counted: impl Fn(&str) -> bool,
) {
    let url = format!("{}/metrics", serve.api.base);
    wait_until(BROWSER_DEADLINE, what, || async {
        let metrics = get_text(&url).await;
        if counted(&metrics) {
            Ok(Some(()))
        } else {
            Err(metrics)
        }
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn browser_warm_pool_creates_are_running_at_once_with_fresh_profiles() {
    let (pages, serve) = spawn_serve_with_page("<title>pool</title>", |config| {
        config.agent.warm_pool_size = 2;
        config.agent.max_instances = 2;
    })
    .await;
    let agent = serve.serve().agent.clone();
    serve.wait_for_warm_pool(2, "the warm pool to fill").await;
    // Pooled browsers run on idle CPU only (their refill after a take must
    // not slow the instance that took one); a taken one is an instance's.
    let weights = || -> Vec<(u64, u64)> {
        std::fs::read_dir(serve.instances_dir())
            .unwrap()
            .flatten()
            .filter(|entry| entry.file_name().to_string_lossy().starts_with("pool-"))
            .filter_map(|entry| browser_main_pid(&entry.path()))
            .filter_map(cpu_weight_of)
            .collect()
    };
    let in_cgroups = !agent.warnings().iter().any(|w| w.contains("cgroup"));
    if in_cgroups {
        let pooled = weights();
        assert_eq!(pooled.len(), 2, "{pooled:?}");
        assert!(
            pooled.iter().all(|(weight, normal)| weight < normal),
            "{pooled:?}"
        );
    }

    let first = serve.api.create("{}").await;
    assert_eq!(
        first["status"], "running",
        "a warm create is running in its response: {first}"
    );
    let page = Page::open(debug_url(&first), &format!("{}/", pages.base))
        .await
        .unwrap();
    page.eval("document.cookie = 'seen=1; max-age=3600'")
        .await
        .unwrap();
    let (_, detail) = serve
        .api
        .get(&format!("/v2/instances/{}", first["id"].as_str().unwrap()))
        .await;
    assert_eq!(detail["config"]["memory_gb"], 2.0);
    if in_cgroups {
        serve.wait_for_warm_pool(2, "the pool to refill").await;
        let mut all = weights();
        all.sort();
        let normal = all
            .iter()
            .filter(|(weight, normal)| weight == normal)
            .count();
        assert_eq!(
            (all.len(), normal),
            (3, 1),
            "the taken browser at an instance's weight, two pooled in the background: {all:?}"
        );
    }

    // Pooled browsers do not take slots: max_instances = 2 still allows a second instance…
    let second = serve.api.create(r#"{"config": {"memory_gb": 1}}"#).await;
    assert_eq!(second["status"], "running", "{second}");
    // …and no third, however many browsers are pooled.
    let (status, _) = serve.api.post("/v2/instances", "{}").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);

    // A new instance never gets a used profile.
    let (status, _) = serve
        .api
        .delete(&format!("/v2/instances/{}", first["id"].as_str().unwrap()))
        .await;
    assert_eq!(status, StatusCode::OK);
    serve.wait_for_warm_pool(2, "the pool to refill").await;
    let third = serve.api.create("{}").await;
    assert_eq!(third["status"], "running");
    let fresh = Page::open(debug_url(&third), &format!("{}/", pages.base))
        .await
        .unwrap();
    assert_eq!(
        fresh.eval("document.cookie").await.unwrap(),
        "",
        "a fresh profile"
    );

    // A create of another shape (preferences) launches its own browser: a
    // miss. /metrics counts both, as the node's heartbeat reports them.
    drop(fresh);
    serve
        .api
        .delete_instance(third["id"].as_str().unwrap())
        .await;
    let shaped = serve
        .api
        .create(r#"{"config": {"prefs": {"intl.accept_languages": "de"}}}"#)
        .await;
    assert_eq!(shaped["status"], "creating", "{shaped}");
    wait_for_metrics(&serve, "/metrics to count 3 hits and 1 miss", |metrics| {
        let pool = |name, outcome: &'static str| {
            let mut labels = vec![("image", "ubuntu:22.04")];
            labels.extend((!outcome.is_empty()).then_some(("outcome", outcome)));
            sample_value(metrics, name, &labels)
        };
        pool("service_warm_pool_creates_total", "hit") == Some(3.0)
            && pool("service_warm_pool_creates_total", "miss") == Some(1.0)
            && pool("service_warm_pool_ready", "").is_some()
    })
    .await;
    serve.shutdown().await;
}

/// Each image with a pool of its own (`agent.warm_pools`) gets a warm
/// browser of that image, and /metrics counts each pool apart.
#[tokio::test]
async fn browser_each_image_has_its_own_warm_pool() {
    let serve = spawn_serve_with(|config| {
        config.agent.warm_pool_size = 1;
        config
            .agent
            .warm_pools
            .insert("chromium-headless-shell".into(), 1);
        config.agent.max_instances = 2;
    })
    .await;
    serve.wait_for_warm_pool(2, "both warm pools to fill").await;

    let shell = serve
        .api
        .create(r#"{"image": "chromium-headless-shell"}"#)
        .await;
    assert_eq!(shell["status"], "running", "a warm create: {shell}");
    let default = serve.api.create("{}").await;
    assert_eq!(default["status"], "running", "a warm create: {default}");

    // A hit of each pool: the headless shell's create took the shell's.
    wait_for_metrics(&serve, "/metrics to count one hit per pool", |metrics| {
        ["chromium-headless-shell", "ubuntu:22.04"]
            .iter()
            .all(|image| {
                let labels = [("image", *image), ("outcome", "hit")];
                sample_value(metrics, "service_warm_pool_creates_total", &labels) == Some(1.0)
            })
    })
    .await;
    serve.shutdown().await;
}
