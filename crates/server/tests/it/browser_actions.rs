//! REST actions (`POST /v2/actions/…`) with real Chromium: each action's
//! result read back (PNG sizes, a PDF's pages with poppler's `pdfinfo`,
//! script-rendered HTML, scraped elements), the page options (cookies,
//! headers, user agent, blocking, waiting), bad input refused naming the
//! field, the wait queue, and no instance left behind however a job ends.

use std::sync::{Arc, Mutex};

use serde_json::{Value, json};

use flotilla_testkit::{
    Api, BROWSER_DEADLINE, StatusCode, TestServe, spawn_serve_with, wait_until,
};

use crate::operations::sample_value;

const KEY: &str = "flt_actions_test_key";

/// Requests a site received: path, and headers (lower-case names).
type Requests = Arc<Mutex<Vec<(String, Vec<(String, String)>)>>>;

/// The test site: pages for each action, and what reached it.
struct Site {
    base: String,
    /// Per request: its path and its headers (name: value, lower case names).
    seen: Requests,
    _task: tokio::task::JoinHandle<()>,
}

const HOME: &str = r#"<!doctype html><html><head><title>Action test</title></head><body>
<h1 id="title">Static title</h1>
<ul><li class="item" data-n="1">One</li><li class="item" data-n="2">Two</li></ul>
<a href="/next" id="link">Next</a>
<div id="box" style="width:200px;height:100px;background:#08f"></div>
<img src="/picture.png" alt="picture">
<script src="/blocked.js"></script>
<script>
  const p = document.createElement('p');
  p.id = 'rendered';
  p.textContent = 'rendered by script ' + navigator.userAgent.includes('FlotillaAction') + ' ' + document.cookie;
  document.body.append(p);
  setTimeout(() => { const late = document.createElement('span'); late.id = 'late'; late.textContent = 'late'; document.body.append(late); }, 400);
</script>
</body></html>"#;

const TALL: &str = r#"<!doctype html><html><body style="margin:0">
<div style="height:3000px;background:linear-gradient(#fff,#000)"></div></body></html>"#;

/// Opens a dialog, then leaves for `/` before it loads (its image never
/// comes).
const MOVES: &str =
    r#"<!doctype html><img src="/hang"><script>alert('one'); location.replace('/')</script>"#;

/// Asks for `/slow` (answered after a second) once it has loaded.
const IDLE: &str = r#"<!doctype html><p id="out">waiting</p><script>
addEventListener('load', () => fetch('/slow').then((r) => r.text()).then((t) => { document.getElementById('out').textContent = t; }));
</script>"#;

const PAGES: &str = r#"<!doctype html><html><body>
<section style="break-after:page">first</section>
<section style="break-after:page">second</section>
<section>third</section></body></html>"#;

impl Site {
    async fn start() -> Self {
        let seen = Requests::default();
        let log = seen.clone();
        let html = |body: &'static str| {
            axum::routing::get(move || async move { axum::response::Html(body) })
        };
        let router = axum::Router::new()
            .route("/", html(HOME))
            .route("/tall", html(TALL))
            .route("/pages", html(PAGES))
            .route("/moves", html(MOVES))
            .route("/idle", html(IDLE))
            .route(
                "/slow",
                axum::routing::get(|| async {
                    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                    "the slow answer"
                }),
            )
            .route(
                "/hang",
                axum::routing::get(std::future::pending::<&'static str>),
            )
            .layer(axum::middleware::from_fn(
                move |request: axum::extract::Request, next: axum::middleware::Next| {
                    let headers = request
                        .headers()
                        .iter()
                        .map(|(name, value)| {
                            (
                                name.as_str().to_owned(),
                                value.to_str().unwrap_or_default().to_owned(),
                            )
                        })
                        .collect();
                    log.lock()
                        .unwrap()
                        .push((request.uri().path().to_owned(), headers));
                    next.run(request)
                },
            ));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, router).await;
        });
        Self {
            base,
            seen,
            _task: task,
        }
    }

    fn paths(&self) -> Vec<String> {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .map(|(path, _)| path.clone())
            .collect()
    }

    fn headers_of(&self, path: &str) -> Vec<(String, String)> {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .rev()
            .find(|(seen, _)| seen == path)
            .map(|(_, headers)| headers.clone())
            .unwrap_or_default()
    }
}

/// `serve` with authentication on, whose browsers may open `site`.
async fn serve_for(
    site: &Site,
    adjust: impl FnOnce(&mut flotilla_server::FlotillaConfig),
) -> (TestServe, Api) {
    let authority = site.base.trim_start_matches("http://").to_owned();
    let serve = spawn_serve_with(move |config| {
        config.control.auth_enabled = true;
        config.control.api_keys = vec![KEY.into()];
        config.agent.egress.allow.push(authority);
        adjust(config);
    })
    .await;
    let api = Api::with_key(serve.api.base.clone(), KEY);
    (serve, api)
}

/// A POST of `body` to action `name`: status, content type and bytes.
async fn action(api: &Api, name: &str, body: Value) -> (StatusCode, String, Vec<u8>) {
    let response = api
        .http
        .post(format!("{}/v2/actions/{name}", api.base))
        .json(&body)
        .send()
        .await
        .expect("the control plane answers");
    let status = response.status();
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    (
        status,
        content_type,
        response.bytes().await.unwrap().to_vec(),
    )
}

/// An action that must succeed: its bytes.
async fn ok(api: &Api, name: &str, body: Value, content_type: &str) -> Vec<u8> {
    let (status, got_type, bytes) = action(api, name, body.clone()).await;
    assert_eq!(
        status,
        StatusCode::OK,
        "{name} {body}: {}",
        String::from_utf8_lossy(&bytes)
    );
    assert!(got_type.starts_with(content_type), "{name}: {got_type}");
    bytes
}

/// An action that must be refused with `status`: its `detail`.
async fn refused(api: &Api, name: &str, body: Value, status: StatusCode) -> String {
    let (got, _, bytes) = action(api, name, body.clone()).await;
    let error: Value = serde_json::from_slice(&bytes).unwrap_or_else(|_| {
        panic!(
            "{name} {body}: not JSON: {}",
            String::from_utf8_lossy(&bytes)
        )
    });
    assert_eq!(got, status, "{name} {body}: {error}");
    error["detail"].as_str().unwrap_or_default().to_owned()
}

/// Width and height of a PNG, from its IHDR chunk.
fn png_size(png: &[u8]) -> (u32, u32) {
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "not a PNG");
    let number = |at: usize| u32::from_be_bytes(png[at..at + 4].try_into().unwrap());
    (number(16), number(20))
}

/// Pages of a PDF, as poppler's `pdfinfo` reads it.
fn pdf_pages(pdf: &[u8]) -> u32 {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("out.pdf");
    std::fs::write(&path, pdf).unwrap();
    let output = std::process::Command::new("pdfinfo")
        .arg(&path)
        .output()
        .expect("pdfinfo runs (scripts/install-deps --test installs poppler-utils)");
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "pdfinfo: {text}");
    text.lines()
        .find_map(|line| line.strip_prefix("Pages:"))
        .and_then(|pages| pages.trim().parse().ok())
        .unwrap_or_else(|| panic!("no page count in {text}"))
}

/// Waits until the fleet holds no instance.
async fn assert_no_instance_left(api: &Api) {
    wait_until(
        BROWSER_DEADLINE,
        "every action's instance to be deleted",
        || async {
            let (status, list) = api.get("/v2/instances").await;
            let count = list["instances"].as_array().map_or(usize::MAX, Vec::len);
            if status == StatusCode::OK && count == 0 {
                Ok(Some(()))
            } else {
                Err(format!("{status} {list}"))
            }
        },
    )
    .await
    .unwrap();
}

/// `service_actions_total{action,outcome}` from `/metrics`.
async fn actions_counted(api: &Api, action: &str, outcome: &str) -> u64 {
    let labels = [("action", action), ("outcome", outcome)];
    metric(api, "service_actions_total", &labels).await as u64
}

/// A sample of `/metrics` (0 when it is not there yet); the scrape must
/// parse as Prometheus text.
async fn metric(api: &Api, name: &str, labels: &[(&str, &str)]) -> f64 {
    let scrape = api
        .http
        .get(format!("{}/metrics", api.base))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    sample_value(&scrape, name, labels).unwrap_or(0.0)
}

#[tokio::test]
async fn browser_actions_render_screenshots_pdfs_content_and_scrapes() {
    let site = Site::start().await;
    let (serve, api) = serve_for(&site, |config| config.agent.warm_pool_size = 1).await;
    let home = format!("{}/", site.base);

    // Screenshots: the viewport, a chosen one, the whole page, one element.
    let png = ok(&api, "screenshot", json!({"url": home}), "image/png").await;
    assert_eq!(png_size(&png), (1280, 720));
    let png = ok(
        &api,
        "screenshot",
        json!({"url": home, "viewport": {"width": 640, "height": 480, "device_scale_factor": 2}}),
        "image/png",
    )
    .await;
    assert_eq!(png_size(&png), (1280, 960));
    let png = ok(
        &api,
        "screenshot",
        json!({"url": format!("{}/tall", site.base), "full_page": true}),
        "image/png",
    )
    .await;
    assert_eq!(png_size(&png), (1280, 3000));
    let png = ok(
        &api,
        "screenshot",
        json!({"url": home, "selector": "#box"}),
        "image/png",
    )
    .await;
    assert_eq!(png_size(&png), (200, 100));
    let jpeg = ok(
        &api,
        "screenshot",
        json!({"url": home, "format": "jpeg", "quality": 50}),
        "image/jpeg",
    )
    .await;
    assert_eq!(&jpeg[..3], b"\xff\xd8\xff");
    let webp = ok(
        &api,
        "screenshot",
        json!({"url": home, "format": "webp"}),
        "image/webp",
    )
    .await;
    assert_eq!((&webp[..4], &webp[8..12]), (&b"RIFF"[..], &b"WEBP"[..]));

    // A PDF with its page breaks; A4 landscape is wider than tall.
    let pdf = ok(
        &api,
        "pdf",
        json!({"url": format!("{}/pages", site.base)}),
        "application/pdf",
    )
    .await;
    assert_eq!(pdf_pages(&pdf), 3);
    let pdf = ok(
        &api,
        "pdf",
        json!({"html": "<p>one page</p>", "page_size": "A4", "landscape": true, "margins_mm": {"top": 0}, "print_background": true}),
        "application/pdf",
    )
    .await;
    assert_eq!(pdf_pages(&pdf), 1);

    // The rendered HTML holds what the page's script wrote, with the user
    // agent and the cookie the action set; the extra header reached the site;
    // blocked requests never left the browser.
    let before = site.paths().len();
    let html = ok(
        &api,
        "content",
        json!({
            "url": home,
            "user_agent": "Mozilla/5.0 FlotillaAction",
            "cookies": [{"name": "session", "value": "abc123"}],
            "headers": {"X-Action-Test": "yes"},
            "block": ["image", "*/blocked.js"],
        }),
        "text/html",
    )
    .await;
    let html = String::from_utf8(html).unwrap();
    assert!(html.starts_with("<!DOCTYPE html>"), "{html}");
    assert!(
        html.contains("rendered by script true session=abc123"),
        "{html}"
    );
    let headers = site.headers_of("/");
    assert!(
        headers.contains(&("x-action-test".into(), "yes".into())),
        "{headers:?}"
    );
    assert!(
        headers.contains(&("user-agent".into(), "Mozilla/5.0 FlotillaAction".into())),
        "{headers:?}"
    );
    assert_only_the_page_was_fetched(&site.paths()[before..]);

    // Without blocking, the page's subresources are fetched.
    ok(&api, "content", json!({"url": home}), "text/html").await;
    assert!(
        site.paths().iter().any(|p| p == "/picture.png"),
        "{:?}",
        site.paths()
    );

    // A page that opens a dialog and leaves for another before it loads:
    // the dialog is dismissed, and the page it went to is the one awaited.
    let html = ok(
        &api,
        "content",
        json!({"url": format!("{}/moves", site.base)}),
        "text/html",
    )
    .await;
    assert!(String::from_utf8(html).unwrap().contains("Static title"));

    // A document given as html, rendered by its own script.
    let html = ok(
        &api,
        "content",
        json!({"html": "<title>t</title><script>document.write('<b>from html</b>')</script>"}),
        "text/html",
    )
    .await;
    assert!(
        String::from_utf8(html)
            .unwrap()
            .contains("<b>from html</b>")
    );

    // A scrape, after waiting for an element the page adds later.
    let scraped = ok(
        &api,
        "scrape",
        json!({
            "url": home,
            "wait_until": "networkidle",
            "wait_for_selector": "#late",
            "elements": [{"selector": "li.item"}, {"selector": "#link"}, {"selector": "#late"}, {"selector": "table"}],
        }),
        "application/json",
    )
    .await;
    let scraped: Value = serde_json::from_slice(&scraped).unwrap();
    let elements = scraped["elements"].as_array().unwrap();
    let items = elements[0]["matches"].as_array().unwrap();
    assert_eq!(elements[0]["selector"], "li.item");
    assert_eq!(
        items.iter().map(|m| m["text"].clone()).collect::<Vec<_>>(),
        [json!("One"), json!("Two")]
    );
    assert_eq!(items[1]["attributes"]["data-n"], "2");
    assert!(
        items[0]["box"]["width"].as_f64().unwrap() > 0.0,
        "{items:?}"
    );
    let link = &elements[1]["matches"][0];
    assert_eq!(link["attributes"]["href"], "/next");
    assert_eq!(link["html"], r#"<a href="/next" id="link">Next</a>"#);
    assert_eq!(elements[2]["matches"][0]["text"], "late");
    assert_eq!(elements[3]["matches"], json!([]));

    // Selectors the browser does not parse, and one that matches nothing.
    let cases = [
        (
            "scrape",
            json!({"url": home, "elements": [{"selector": "li"}, {"selector": "li[["}]}),
            "elements[1].selector is not a valid CSS selector",
        ),
        (
            "screenshot",
            json!({"url": home, "wait_for_selector": "#a:nope("}),
            "wait_for_selector is not a valid",
        ),
        (
            "screenshot",
            json!({"url": home, "selector": "#missing"}),
            "selector \"#missing\" matches no element",
        ),
    ];
    for (name, body, expected) in cases {
        let detail = refused(&api, name, body, StatusCode::BAD_REQUEST).await;
        assert!(detail.starts_with(expected), "{detail}");
    }
    // The control plane itself is closed to browsers: the browser's reason,
    // as a 502.
    let detail = refused(
        &api,
        "content",
        json!({"url": format!("{}/health", serve.api.base)}),
        StatusCode::BAD_GATEWAY,
    )
    .await;
    assert!(detail.contains("could not be loaded"), "{detail}");

    assert_no_instance_left(&api).await;
    assert_eq!(actions_counted(&api, "screenshot", "ok").await, 6);
    assert_eq!(actions_counted(&api, "pdf", "ok").await, 2);
    assert_eq!(actions_counted(&api, "scrape", "invalid_request").await, 1);
    assert_eq!(actions_counted(&api, "content", "page_failed").await, 1);
    serve.shutdown().await;
}

/// What reached the site for a job that blocked `image` and
/// `*/blocked.js`: the page, never those.
fn assert_only_the_page_was_fetched(paths: &[String]) {
    assert!(paths.contains(&"/".to_owned()), "{paths:?}");
    assert!(
        !paths
            .iter()
            .any(|p| p == "/picture.png" || p == "/blocked.js"),
        "{paths:?}"
    );
}

/// Firefox's job renders a document given as `html` (its own script runs,
/// at the document's address; the page's own request for that address is
/// not served the document) and sends `headers` with the page's requests.
async fn firefox_serves_html_and_sends_headers(api: &Api, site: &Site) {
    let script = "document.write('<b>from html at ' + location.href + '</b>'); \
        fetch(location.href).then(() => 'served', () => 'failed') \
        .then(o => { const i = document.createElement('i'); i.id = 'fetch'; i.textContent = o; document.body.append(i); })";
    let html = json!({
        "image": "firefox",
        "html": format!("<title>t</title><script>{script}</script>"),
        "wait_for_selector": "#fetch",
    });
    let rendered = String::from_utf8(ok(api, "content", html, "text/html").await).unwrap();
    assert!(
        rendered.contains("<b>from html at https://flotilla.invalid/</b>"),
        "{rendered}"
    );
    assert!(
        rendered.contains(r#"<i id="fetch">failed</i>"#),
        "{rendered}"
    );
    let body = json!({
        "image": "firefox", "url": format!("{}/", site.base),
        "headers": {"X-Action-Test": "firefox"}, "user_agent": "Mozilla/5.0 FlotillaAction",
    });
    let html = String::from_utf8(ok(api, "content", body, "text/html").await).unwrap();
    // The page's script saw the user agent too.
    assert!(html.contains("rendered by script true"), "{html}");
    let headers = site.headers_of("/");
    assert!(
        headers.contains(&("x-action-test".into(), "firefox".into())),
        "{headers:?}"
    );
    assert!(
        headers.contains(&("user-agent".into(), "Mozilla/5.0 FlotillaAction".into())),
        "{headers:?}"
    );
}

#[tokio::test]
async fn browser_actions_run_in_firefox_where_bidi_has_the_step() {
    let site = Site::start().await;
    let (serve, api) = serve_for(&site, |config| {
        config.agent.warm_pools.insert("firefox".into(), 2);
    })
    .await;
    let home = format!("{}/", site.base);
    let firefox = |mut body: Value| {
        body["image"] = json!("firefox");
        body
    };

    let png = ok(
        &api,
        "screenshot",
        firefox(json!({"url": home})),
        "image/png",
    )
    .await;
    assert_eq!(png_size(&png), (1280, 720));
    let viewport = json!({"width": 640, "height": 480, "device_scale_factor": 2});
    let body = firefox(json!({"url": home, "viewport": viewport}));
    assert_eq!(
        png_size(&ok(&api, "screenshot", body, "image/png").await),
        (1280, 960)
    );
    let tall = firefox(json!({"url": format!("{}/tall", site.base), "full_page": true}));
    // Firefox keeps its scrollbar beside a page taller than the viewport.
    let (width, height) = png_size(&ok(&api, "screenshot", tall, "image/png").await);
    assert!(
        (1260..=1280).contains(&width) && height == 3000,
        "{width}x{height}"
    );
    let element = firefox(json!({"url": home, "selector": "#box"}));
    assert_eq!(
        png_size(&ok(&api, "screenshot", element, "image/png").await),
        (200, 100)
    );
    let jpeg = firefox(json!({"url": home, "format": "jpeg", "quality": 50}));
    assert_eq!(
        &ok(&api, "screenshot", jpeg, "image/jpeg").await[..3],
        b"\xff\xd8\xff"
    );

    let pdf = ok(
        &api,
        "pdf",
        firefox(json!({"url": format!("{}/pages", site.base)})),
        "application/pdf",
    )
    .await;
    assert_eq!(pdf_pages(&pdf), 3);

    // The page's own script ran, in Firefox, with the cookie set first.
    let cookie = json!([{"name": "flavour", "value": "oat"}]);
    let body = firefox(json!({"url": home, "cookies": cookie, "wait_for_selector": "#late"}));
    let html = String::from_utf8(ok(&api, "content", body, "text/html").await).unwrap();
    assert!(html.starts_with("<!DOCTYPE html>"), "{html}");
    assert!(
        html.contains("rendered by script false flavour=oat"),
        "{html}"
    );
    assert!(html.contains(r#"<span id="late">late</span>"#), "{html}");
    // A dialog is dismissed, and a page that moves on is read where it went.
    let moves =
        firefox(json!({"url": format!("{}/moves", site.base), "wait_for_selector": "#title"}));
    let moved = String::from_utf8(ok(&api, "content", moves, "text/html").await).unwrap();
    assert!(moved.contains("Static title"), "{moved}");

    let elements = json!([{"selector": "li.item"}, {"selector": "#title"}]);
    let scraped = ok(
        &api,
        "scrape",
        firefox(json!({"url": home, "elements": elements})),
        "application/json",
    )
    .await;
    let scraped: Value = serde_json::from_slice(&scraped).unwrap();
    let items = &scraped["elements"][0]["matches"];
    assert_eq!(items[1]["text"], "Two", "{scraped}");
    assert_eq!(items[1]["attributes"]["data-n"], "2", "{scraped}");
    assert_eq!(scraped["elements"][1]["matches"][0]["text"], "Static title");

    firefox_serves_html_and_sends_headers(&api, &site).await;

    // networkidle waits for the request the page made after its load.
    let idle = firefox(json!({"url": format!("{}/idle", site.base), "wait_until": "networkidle"}));
    let html = String::from_utf8(ok(&api, "content", idle, "text/html").await).unwrap();
    assert!(html.contains("the slow answer"), "{html}");

    // Blocked requests never leave the browser (the jobs before fetched
    // them); the others do, the page's own script too.
    let before = site.paths().len();
    let fetched = site.paths();
    for path in ["/picture.png", "/blocked.js"] {
        assert!(fetched.iter().any(|p| p == path), "{path}: {fetched:?}");
    }
    let blocking = firefox(json!({"url": home, "block": ["image", "*/blocked.js"]}));
    let html = String::from_utf8(ok(&api, "content", blocking, "text/html").await).unwrap();
    assert!(html.contains("rendered by script"), "{html}");
    assert_only_the_page_was_fetched(&site.paths()[before..]);
    let with_html = firefox(
        json!({"html": "<img src=\"https://flotilla.invalid/x.png\"><p>doc</p>", "block": ["image"]}),
    );
    let html = String::from_utf8(ok(&api, "content", with_html, "text/html").await).unwrap();
    assert!(html.contains("<p>doc</p>"), "{html}");

    // What Firefox's job does not take, named; a bad selector, named.
    for (body, named) in [
        (json!({"url": home, "block": ["websocket"]}), "block"),
        (json!({"url": home, "selector": "##"}), "selector"),
    ] {
        let detail = refused(
            &api,
            "screenshot",
            firefox(body.clone()),
            StatusCode::BAD_REQUEST,
        )
        .await;
        assert!(detail.contains(named), "{body}: {detail}");
    }
    let detail = refused(
        &api,
        "content",
        firefox(json!({"url": "http://127.0.0.1:9/"})),
        StatusCode::BAD_GATEWAY,
    )
    .await;
    assert!(detail.contains("could not be loaded"), "{detail}");
    assert_no_instance_left(&api).await;
    serve.shutdown().await;
}

#[tokio::test]
async fn browser_an_action_whose_page_hangs_or_whose_client_leaves_leaves_no_instance() {
    let site = Site::start().await;
    let (serve, api) = serve_for(&site, |config| {
        config.agent.action_max_output_bytes = 200_000
    })
    .await;
    let hang = format!("{}/hang", site.base);

    // The page never answers: 504 naming what the job waited for.
    let detail = refused(
        &api,
        "screenshot",
        json!({"url": hang, "timeout_ms": 1500}),
        StatusCode::GATEWAY_TIMEOUT,
    )
    .await;
    assert!(
        detail.contains("loading the page did not finish within timeout_ms (1500 ms)"),
        "{detail}"
    );
    assert_no_instance_left(&api).await;

    // The client goes away while the page hangs.
    let leaving = {
        let api = api.clone();
        let hang = hang.clone();
        tokio::spawn(async move { action(&api, "pdf", json!({"url": hang})).await })
    };
    wait_until(
        BROWSER_DEADLINE,
        "the action's instance, its page request and its count in the list",
        || async {
            let (_, list) = api.get("/v2/instances").await;
            let instances = list["instances"].as_array().map_or(0, Vec::len);
            let asked = site.paths().iter().filter(|p| *p == "/hang").count();
            // The list says an action drives the instance.
            let drivers = &list["instances"][0]["drivers"];
            if instances == 1 && asked >= 2 && drivers["actions"] == 1 {
                Ok(Some(()))
            } else {
                Err(format!(
                    "{instances} instance(s), /hang asked {asked} time(s), drivers {drivers}"
                ))
            }
        },
    )
    .await
    .unwrap();
    leaving.abort();
    let _ = leaving.await;
    assert_no_instance_left(&api).await;
    wait_until(
        BROWSER_DEADLINE,
        "the abandoned action to be counted",
        || async {
            match actions_counted(&api, "pdf", "abandoned").await {
                1 => Ok(Some(())),
                other => Err(format!("{other}")),
            }
        },
    )
    .await
    .unwrap();
    assert_eq!(actions_counted(&api, "screenshot", "timeout").await, 1);

    // A result over agent.action_max_output_bytes is refused, not sent.
    let detail = refused(
        &api,
        "content",
        json!({"html": format!("<p>{}</p>", "x".repeat(300_000))}),
        StatusCode::PAYLOAD_TOO_LARGE,
    )
    .await;
    assert!(
        detail.contains("agent.action_max_output_bytes (200000 bytes)"),
        "{detail}"
    );
    assert_no_instance_left(&api).await;
    serve.shutdown().await;
}

#[tokio::test]
async fn browser_twenty_concurrent_screenshots_wait_their_turn_on_a_one_node_fleet() {
    let site = Site::start().await;
    let (serve, api) = serve_for(&site, |config| {
        config.agent.max_instances = 2;
        config.control.actions.queue_wait_sec = 600;
    })
    .await;
    let url = format!("{}/", site.base);
    let jobs: Vec<_> = (0..20)
        .map(|round| {
            let (api, url) = (api.clone(), url.clone());
            tokio::spawn(async move {
                let body = json!({"url": url, "viewport": {"width": 400 + round, "height": 300}});
                ok(&api, "screenshot", body, "image/png").await
            })
        })
        .collect();
    for (round, job) in jobs.into_iter().enumerate() {
        let png = job.await.expect("the job ran");
        assert_eq!(png_size(&png), (400 + round as u32, 300));
    }
    assert_no_instance_left(&api).await;
    assert_eq!(actions_counted(&api, "screenshot", "ok").await, 20);
    serve.shutdown().await;
}

/// Refusals that need no browser: each names its field, before any instance
/// is made.
#[tokio::test]
async fn actions_refuse_bad_input_naming_the_field() {
    let serve = spawn_serve_with(|config| {
        config.agent.runtime = flotilla_node_agent::RuntimeKind::Sim;
        config.control.actions.max_html_bytes = 1000;
        config.control.auth_enabled = true;
        config.control.api_keys = vec![KEY.into()];
    })
    .await;
    let api = Api::with_key(serve.api.base.clone(), KEY);
    let long_image = "x".repeat(201);
    let cases = [
        (
            "screenshot",
            json!({"url": "file:///etc/passwd"}),
            "url must be an http or https URL (got a file: URL)",
        ),
        // `image`: a name of the catalog, checked as a create's.
        (
            "screenshot",
            json!({"url": "http://a.test/", "image": ""}),
            "image must be a non-empty image name",
        ),
        (
            "screenshot",
            json!({"url": "http://a.test/", "image": "fire fox\n"}),
            "image must be a non-empty image name",
        ),
        (
            "screenshot",
            json!({"url": "http://a.test/", "image": long_image}),
            "at most 200 characters",
        ),
        (
            "screenshot",
            json!({"url": "http://a.test/", "image": "../../usr/bin/sh"}),
            "../../usr/bin/sh",
        ),
        (
            "screenshot",
            json!({"url": "chrome://settings"}),
            "url must be an http or https URL (got a chrome: URL)",
        ),
        (
            "content",
            json!({"url": "javascript:alert(1)"}),
            "url must be an http or https URL (got a javascript: URL)",
        ),
        (
            "screenshot",
            json!({"url": "http://a.test/", "viewport": {"width": 0, "height": 600}}),
            "viewport.width must be 1 to 8192",
        ),
        (
            "screenshot",
            json!({"url": "http://a.test/", "viewport": {"width": 800, "height": 100000}}),
            "viewport.height must be 1 to 8192",
        ),
        (
            "pdf",
            json!({"url": "http://a.test/", "wait_until": "networkidle2"}),
            "wait_until: unknown variant `networkidle2`",
        ),
        (
            "content",
            json!({"html": "x".repeat(1001)}),
            "html is 1001 bytes, over the limit of 1000 (actions.max_html_bytes)",
        ),
        (
            "scrape",
            json!({"url": "http://a.test/", "elements": []}),
            "elements must list 1 to 50 selectors",
        ),
        (
            "pdf",
            json!({"url": "http://a.test/", "selector": "p"}),
            "selector belongs to the screenshot action, not to pdf",
        ),
        (
            "content",
            json!({"url": "http://a.test/", "timeout_ms": 999999999}),
            "timeout_ms must be 1 to 120000",
        ),
        (
            "content",
            json!({"url": "http://a.test/", "colour": "red"}),
            "unknown field `colour`",
        ),
    ];
    for (name, body, expected) in cases {
        let detail = refused(&api, name, body.clone(), StatusCode::BAD_REQUEST).await;
        assert!(detail.contains(expected), "{name} {body}: {detail}");
    }
    // Bodies that are not JSON objects, or not UTF-8.
    for body in [
        &b"not json"[..],
        b"[1]",
        b"{\"url\": \"http://a.test/\xff\"}",
        b"",
    ] {
        let (status, error) = api
            .post_bytes("/v2/actions/content", "application/json", body.to_vec())
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body:?}: {error}");
        assert_eq!(error["code"], "invalid_request");
    }
    // A body far over any html limit is cut off: 413.
    let huge = format!("{{\"html\": \"{}\"}}", "x".repeat(8 << 20));
    let (status, error) = api
        .post_bytes("/v2/actions/content", "application/json", huge.into_bytes())
        .await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{error}");
    // No key, an unknown action, a wrong method.
    let anonymous = Api::new(serve.api.base.clone());
    let (status, _) = anonymous
        .post("/v2/actions/screenshot", r#"{"url": "http://a.test/"}"#)
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, _) = api
        .post("/v2/actions/video", r#"{"url": "http://a.test/"}"#)
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = api.get("/v2/actions/screenshot").await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    // Nothing was created for any of them.
    let (_, list) = api.get("/v2/instances").await;
    assert_eq!(list["instances"], json!([]), "{list}");
    serve.shutdown().await;
}

/// The control plane holds at most `actions.max_pending` actions: more are
/// refused at once. An action whose client leaves while it waits for room
/// leaves nothing behind once room comes (its create runs to its end, and
/// what it made is deleted).
#[tokio::test]
async fn actions_beyond_max_pending_are_refused_and_a_client_that_leaves_the_queue_leaves_nothing()
{
    let serve = spawn_serve_with(|config| {
        config.agent.runtime = flotilla_node_agent::RuntimeKind::Sim;
        config.agent.max_instances = 1;
        config.control.actions.max_pending = 2;
        config.control.actions.queue_wait_sec = 120;
    })
    .await;
    let api = serve.api.clone();
    let occupant = api.create("{}").await;
    let occupant = occupant["id"].as_str().unwrap().to_owned();
    let body = json!({"url": "http://a.test/"});
    let waiting: Vec<_> = (0..2)
        .map(|_| {
            let (api, body) = (api.clone(), body.clone());
            tokio::spawn(async move { action(&api, "content", body).await })
        })
        .collect();
    wait_until(BROWSER_DEADLINE, "two actions waiting for room", || async {
        let queued = metric(&api, "service_create_queue_length", &[]).await;
        if queued >= 2.0 {
            Ok(Some(()))
        } else {
            Err(format!("{queued} in the create queue"))
        }
    })
    .await
    .unwrap();
    let detail = refused(
        &api,
        "content",
        body.clone(),
        StatusCode::SERVICE_UNAVAILABLE,
    )
    .await;
    assert!(detail.contains("actions.max_pending"), "{detail}");
    // Both clients leave; then room comes.
    for job in &waiting {
        job.abort();
    }
    for job in waiting {
        let _ = job.await;
    }
    api.delete_instance(&occupant).await;
    assert_no_instance_left(&api).await;
    wait_until(
        BROWSER_DEADLINE,
        "both actions counted as abandoned",
        || async {
            match actions_counted(&api, "content", "abandoned").await {
                2 => Ok(Some(())),
                other => Err(format!("{other}")),
            }
        },
    )
    .await
    .unwrap();
    assert_eq!(actions_counted(&api, "content", "no_capacity").await, 1);
    // With room, an action on the sim runtime gets as far as the node: 409.
    let detail = refused(&api, "content", body, StatusCode::CONFLICT).await;
    assert!(detail.contains("no real browser"), "{detail}");
    assert_no_instance_left(&api).await;
    serve.shutdown().await;
}
