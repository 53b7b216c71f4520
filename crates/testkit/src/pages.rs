//! Pages for browsers: a local web server ([`serve_page`]) and a CDP page
//! client ([`Page`]) to drive a tab and read it.

use std::sync::Arc;
use std::time::Duration;

use anyhow::bail;
use serde_json::Value;

use crate::wait_until;
use flotilla_server::FlotillaConfig;

/// A local web server serving `pages` (path → HTML) on 127.0.0.1:0.
pub struct PageServer {
    pub base: String,
    /// Paths requested so far, in order.
    requested: Arc<std::sync::Mutex<Vec<String>>>,
    _task: tokio::task::JoinHandle<()>,
}

impl PageServer {
    /// `127.0.0.1:<port>`: what `[agent.egress] allow` needs for browsers to
    /// load these pages (loopback is closed to them by default).
    pub fn authority(&self) -> String {
        self.base.trim_start_matches("http://").to_owned()
    }

    /// Opens these pages to the browsers of `config`'s agent.
    pub fn allow_in(&self, config: &mut FlotillaConfig) {
        config.agent.egress.allow.push(self.authority());
    }

    /// Paths requested so far (any path, served or not), in order.
    pub fn requested(&self) -> Vec<String> {
        self.requested.lock().expect("requested lock").clone()
    }
}

/// Serves `router` on a free loopback port: its base URL and the server task.
pub(super) async fn serve_router(router: axum::Router) -> (String, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind a loopback port");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    (base, task)
}

pub async fn serve_page(pages: &[(&str, &str)]) -> PageServer {
    serve_pages_and_hang(pages, &[]).await
}

/// [`serve_page`], and paths in `hanging` that never answer (a page step
/// or an action on them waits until its own deadline).
pub async fn serve_pages_and_hang(pages: &[(&str, &str)], hanging: &[&str]) -> PageServer {
    let mut router = axum::Router::new();
    for path in hanging {
        router = router.route(
            path,
            axum::routing::get(std::future::pending::<&'static str>),
        );
    }
    for (path, html) in pages {
        let html = html.to_string();
        router = router.route(
            path,
            axum::routing::get(move || async move { axum::response::Html(html) }),
        );
    }
    let requested = Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = requested.clone();
    let router = router.layer(axum::middleware::from_fn(
        move |request: axum::extract::Request, next: axum::middleware::Next| {
            log.lock()
                .expect("requested lock")
                .push(request.uri().path().to_owned());
            next.run(request)
        },
    ));
    let (base, task) = serve_router(router).await;
    PageServer {
        base,
        requested,
        _task: task,
    }
}

/// A page opened in an instance over CDP (through its gateway), for tests that
/// need to run script or navigate.
pub struct Page {
    client: flotilla_node_agent::engine::cdp::CdpClient,
    session: String,
}

pub(super) const CDP_TIMEOUT: Duration = Duration::from_secs(60);

impl Page {
    /// Opens a new tab at `url` in the browser behind `debug_url` and waits for it to load.
    pub async fn open(debug_url: &str, url: &str) -> anyhow::Result<Self> {
        let client = flotilla_node_agent::engine::cdp::CdpClient::connect(debug_url).await?;
        let (_, session) = client.open_tab("about:blank", CDP_TIMEOUT).await?;
        let page = Self { client, session };
        page.navigate(url).await?;
        Ok(page)
    }

    /// Attaches to the tab `target_id` already open in the browser behind
    /// `debug_url`.
    pub async fn attach(debug_url: &str, target_id: &str) -> anyhow::Result<Self> {
        let client = flotilla_node_agent::engine::cdp::CdpClient::connect(debug_url).await?;
        let attached = client
            .call(
                "Target.attachToTarget",
                serde_json::json!({"targetId": target_id, "flatten": true}),
                None,
                CDP_TIMEOUT,
            )
            .await?;
        let session = attached["sessionId"]
            .as_str()
            .ok_or_else(|| anyhow::anyhow!("no session: {attached}"))?
            .to_owned();
        Ok(Self { client, session })
    }

    /// Navigates and waits until `document.readyState` is `complete`.
    pub async fn navigate(&self, url: &str) -> anyhow::Result<()> {
        self.client
            .navigate(&self.session, url, CDP_TIMEOUT)
            .await?;
        wait_until(CDP_TIMEOUT, &format!("{url} to load"), || async {
            match self.eval("document.readyState + ' ' + location.href").await {
                Ok(Value::String(state))
                    if state.starts_with("complete") && !state.ends_with("about:blank") =>
                {
                    Ok(Some(()))
                }
                Ok(other) => Err(other.to_string()),
                Err(error) => Err(error.to_string()),
            }
        })
        .await
    }

    /// Evaluates `expression` (awaiting promises) and returns its value.
    pub async fn eval(&self, expression: &str) -> anyhow::Result<Value> {
        let result = self
            .client
            .call(
                "Runtime.evaluate",
                serde_json::json!({"expression": expression, "returnByValue": true, "awaitPromise": true}),
                Some(&self.session),
                CDP_TIMEOUT,
            )
            .await?;
        if let Some(exception) = result.get("exceptionDetails") {
            bail!("script threw: {exception}");
        }
        Ok(result["result"]["value"].clone())
    }

    /// Makes this tab the one in front (the most recently used).
    pub async fn bring_to_front(&self) -> anyhow::Result<()> {
        self.client
            .call(
                "Page.bringToFront",
                serde_json::json!({}),
                Some(&self.session),
                CDP_TIMEOUT,
            )
            .await?;
        Ok(())
    }

    /// Sends a browser-level CDP command (no session).
    pub async fn call_browser(&self, method: &str, params: Value) -> anyhow::Result<Value> {
        Ok(self.client.call(method, params, None, CDP_TIMEOUT).await?)
    }

    /// Starts a navigation and returns CDP's answer at once (`errorText` is set
    /// when the page could not be loaded at all).
    pub async fn try_navigate(&self, url: &str) -> anyhow::Result<Value> {
        self.call("Page.navigate", serde_json::json!({"url": url}))
            .await
    }

    /// Sends any CDP command on this page's session.
    pub async fn call(&self, method: &str, params: Value) -> anyhow::Result<Value> {
        Ok(self
            .client
            .call(method, params, Some(&self.session), CDP_TIMEOUT)
            .await?)
    }
}

/// A page expression (a promise) that stores `value` at `key` in the `kv`
/// store of the IndexedDB database `db` and resolves to `true`: state that
/// only a profile's files carry.
pub fn indexed_db_put(db: &str, key: &str, value: &str) -> String {
    format!(
        "new Promise((resolve, reject) => {{
    const open = indexedDB.open('{db}', 1);
    open.onupgradeneeded = () => open.result.createObjectStore('kv');
    open.onsuccess = () => {{
        const tx = open.result.transaction('kv', 'readwrite');
        tx.objectStore('kv').put('{value}', '{key}');
        tx.oncomplete = () => resolve(true);
        tx.onerror = () => reject(tx.error);
    }};
    open.onerror = () => reject(open.error);
}})"
    )
}

/// A page expression (a promise) resolving to what [`indexed_db_put`] stored
/// at `key` of `db`, `null` when it is not there.
pub fn indexed_db_get(db: &str, key: &str) -> String {
    format!(
        "new Promise((resolve) => {{
    const open = indexedDB.open('{db}', 1);
    open.onupgradeneeded = () => open.result.createObjectStore('kv');
    open.onsuccess = () => {{
        const request = open.result.transaction('kv').objectStore('kv').get('{key}');
        request.onsuccess = () => resolve(request.result ?? null);
        request.onerror = () => resolve(null);
    }};
    open.onerror = () => resolve(null);
}})"
    )
}

/// Sends a WebSocket upgrade for `path` to `127.0.0.1:port` (an instance
/// port or the control plane's door): the status line of the answer.
pub async fn upgrade_status(port: u16, path: &str) -> String {
    upgrade_status_with(port, path, "").await
}

/// [`upgrade_status`] with `extra` header lines (each ending in `\r\n`),
/// such as the `Origin` a browser page sends.
pub async fn upgrade_status_with(port: u16, path: &str, extra: &str) -> String {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("the port accepts");
    let head = format!(
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n{extra}\r\n"
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut answer = vec![0u8; 512];
    let n = tokio::time::timeout(CDP_TIMEOUT, stream.read(&mut answer))
        .await
        .expect("the port answers the upgrade")
        .unwrap();
    String::from_utf8_lossy(&answer[..n])
        .lines()
        .next()
        .unwrap_or_default()
        .to_owned()
}
