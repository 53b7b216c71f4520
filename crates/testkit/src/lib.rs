//! The test harness. Everything starts for real on `127.0.0.1:0`:
//! - [`spawn_serve`] / [`spawn_serve_with`]: `flotilla serve` in-process (control
//!   plane, local agent with real Chromium or the sim runtime) on a temp data dir;
//! - [`ServeProcess`]: the real `flotilla` binary as a child process;
//! - [`serve_page`]: a local web server for pages the browsers load;
//! - [`run_node`]: the Playwright / Puppeteer clients in `tests/js`;
//! - [`wait_until`]: polling a condition with a generous deadline (never a fixed sleep).
//!
//! Cleanup happens on drop too, so a failing test leaves no browser behind.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};

use flotilla_node_agent::RuntimeKind;
use flotilla_server::{FlotillaConfig, Serve};

pub use reqwest::StatusCode;

/// Deadline for a browser to start on a loaded 2-core machine.
pub const BROWSER_DEADLINE: Duration = Duration::from_secs(60);

/// Sends test logs to the test's output (shown for failing tests).
pub fn init_logging() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
                tracing_subscriber::EnvFilter::new("info,tower_http=warn,sqlx=warn")
            }),
        )
        .with_test_writer()
        .try_init();
}

/// The workspace root (for `tests/js`).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("crates/testkit is two levels deep")
        .to_path_buf()
}

/// Polls `check` every 50 ms until it yields `Some`, or fails after `deadline`
/// with `what` and the last observation.
pub async fn wait_until<T, F, Fut>(
    deadline: Duration,
    what: &str,
    mut check: F,
) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<T>, String>>,
{
    let start = tokio::time::Instant::now();
    let mut last = String::from("nothing observed");
    loop {
        match check().await {
            Ok(Some(value)) => return Ok(value),
            Ok(None) => {}
            Err(observation) => last = observation,
        }
        if start.elapsed() > deadline {
            bail!("timed out after {deadline:?} waiting for {what}; last observation: {last}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A JSON API client for one control plane.
#[derive(Clone)]
pub struct Api {
    pub base: String,
    pub http: reqwest::Client,
}

impl Api {
    pub fn new(base: impl Into<String>) -> Self {
        Self {
            base: base.into(),
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(120))
                .no_proxy()
                .build()
                .expect("http client"),
        }
    }

    /// A client that sends `Authorization: Bearer <key>` with every request.
    pub fn with_key(base: impl Into<String>, key: &str) -> Self {
        let mut headers = reqwest::header::HeaderMap::new();
        headers.insert(
            reqwest::header::AUTHORIZATION,
            format!("Bearer {key}").parse().expect("a header value"),
        );
        Self {
            base: base.into(),
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(120))
                .no_proxy()
                .default_headers(headers)
                .build()
                .expect("http client"),
        }
    }

    /// Any request; returns status and body as JSON (or `Value::String` for non-JSON).
    pub async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&str>,
    ) -> (StatusCode, Value) {
        let mut request = self.http.request(method, format!("{}{path}", self.base));
        if let Some(body) = body {
            request = request
                .header("content-type", "application/json")
                .body(body.to_owned());
        }
        Self::send(request).await
    }

    /// Sends `request`; status and body as JSON (or `Value::String`).
    async fn send(request: reqwest::RequestBuilder) -> (StatusCode, Value) {
        let response = request
            .send()
            .await
            .expect("request reaches the control plane");
        let status = response.status();
        let text = response.text().await.unwrap_or_default();
        let value = serde_json::from_str(&text).unwrap_or(Value::String(text));
        (status, value)
    }

    pub async fn get(&self, path: &str) -> (StatusCode, Value) {
        self.call(reqwest::Method::GET, path, None).await
    }

    /// A POST of raw bytes with `content_type`; status and body as [`Api::call`].
    pub async fn post_bytes(
        &self,
        path: &str,
        content_type: &str,
        body: Vec<u8>,
    ) -> (StatusCode, Value) {
        let request = self
            .http
            .post(format!("{}{path}", self.base))
            .header("content-type", content_type)
            .body(body);
        Self::send(request).await
    }

    pub async fn post(&self, path: &str, body: &str) -> (StatusCode, Value) {
        self.call(reqwest::Method::POST, path, Some(body)).await
    }

    pub async fn delete(&self, path: &str) -> (StatusCode, Value) {
        self.call(reqwest::Method::DELETE, path, None).await
    }

    /// Creates an instance and asserts 201.
    pub async fn create(&self, body: &str) -> Value {
        let (status, value) = self.post("/v2/instances", body).await;
        assert_eq!(status, StatusCode::CREATED, "create failed: {value}");
        value
    }

    /// Waits until the instance has `status` (fails early on failed/stopped).
    pub async fn wait_for_status(&self, id: &str, status: &str, deadline: Duration) -> Value {
        let path = format!("/v2/instances/{id}");
        wait_until(
            deadline,
            &format!("instance {id} to be {status}"),
            || async {
                let (code, value) = self.get(&path).await;
                if code != StatusCode::OK {
                    return Err(format!("GET {path} → {code}: {value}"));
                }
                let now = value["status"].as_str().unwrap_or_default();
                if now == status {
                    return Ok(Some(value));
                }
                if status != now && ["failed", "stopped"].contains(&now) {
                    panic!("instance {id} is {now} instead of {status}: {value}");
                }
                Err(format!("status {now}"))
            },
        )
        .await
        .unwrap()
    }
}

/// `flotilla serve` running in this test process.
pub struct TestServe {
    serve: Option<Serve>,
    pub api: Api,
    pub data_dir: PathBuf,
    _temp: Option<tempfile::TempDir>,
}

/// `serve` with real Chromium and test-friendly timings.
pub async fn spawn_serve() -> TestServe {
    spawn_serve_with(|_| {}).await
}

/// `serve` with the configuration adjusted by `adjust` (after test defaults:
/// port 0, a temp data dir, 0.5 s heartbeats).
pub async fn spawn_serve_with(adjust: impl FnOnce(&mut FlotillaConfig)) -> TestServe {
    spawn_serve_with_clock(
        adjust,
        std::sync::Arc::new(flotilla_api_types::clock::SystemClock),
    )
    .await
}

/// `serve` whose lifecycle decisions (activity, idle, heartbeats) follow `clock`.
pub async fn spawn_serve_with_clock(
    adjust: impl FnOnce(&mut FlotillaConfig),
    clock: std::sync::Arc<dyn flotilla_api_types::clock::Clock>,
) -> TestServe {
    let temp = tempfile::Builder::new()
        .prefix("flotilla-test-")
        .tempdir()
        .expect("temp dir");
    let mut serve = start_serve_in(temp.path(), adjust, clock).await;
    serve._temp = Some(temp);
    serve
}

/// `serve` on `data_dir`, which outlives it: to restart on the same store.
pub async fn spawn_serve_in(
    data_dir: &Path,
    adjust: impl FnOnce(&mut FlotillaConfig),
) -> TestServe {
    start_serve_in(
        data_dir,
        adjust,
        std::sync::Arc::new(flotilla_api_types::clock::SystemClock),
    )
    .await
}

async fn start_serve_in(
    data_dir: &Path,
    adjust: impl FnOnce(&mut FlotillaConfig),
    clock: std::sync::Arc<dyn flotilla_api_types::clock::Clock>,
) -> TestServe {
    init_logging();
    let mut config = FlotillaConfig {
        listen: "127.0.0.1:0".into(),
        data_dir: data_dir.to_path_buf(),
        ..FlotillaConfig::default()
    };
    config.proxy.http.bind_address = "127.0.0.1:0".into();
    config.control.nodes.heartbeat_interval_sec = 0.5;
    config.control.nodes.heartbeat_timeout_sec = 30.0;
    config.agent.node_id = Some("test-node".into());
    // Tests that want a warm pool ask for one; the others start no spare browser.
    config.agent.warm_pool_size = 0;
    // Tests share two cores with other browser tests: the overload guard would
    // refuse placements at random. Scheduler unit tests cover the guard.
    config.control.scheduler.max_utilisation_percent = 100.0;
    adjust(&mut config);
    let serve = Serve::start_with_clock(config, clock)
        .await
        .expect("serve starts");
    let api = Api::new(serve.control_url());
    TestServe {
        serve: Some(serve),
        api,
        data_dir: data_dir.to_path_buf(),
        _temp: None,
    }
}

/// `serve` on the sim runtime (no browsers): for API and scheduling logic.
pub async fn spawn_sim_serve(max_instances: i64) -> TestServe {
    spawn_serve_with(|config| {
        config.agent.runtime = RuntimeKind::Sim;
        config.agent.max_instances = max_instances;
    })
    .await
}

impl TestServe {
    pub fn serve(&self) -> &Serve {
        self.serve.as_ref().expect("serve is running")
    }

    /// The instance directories root of the local agent.
    pub fn instances_dir(&self) -> PathBuf {
        self.data_dir
            .canonicalize()
            .unwrap_or(self.data_dir.clone())
            .join("agent/instances")
    }

    /// Graceful shutdown (browsers closed, records kept).
    pub async fn shutdown(mut self) {
        if let Some(serve) = self.serve.take() {
            serve.shutdown().await;
        }
    }
}

impl Drop for TestServe {
    fn drop(&mut self) {
        if let Some(serve) = self.serve.take() {
            serve.agent.kill_all();
        }
    }
}

/// Pids of processes whose command line mentions `needle` (e.g. an instance directory).
pub fn processes_mentioning(needle: &str) -> Vec<u32> {
    let mut pids = Vec::new();
    for pid in flotilla_node_agent::monitor::pids() {
        if pid == std::process::id() {
            continue;
        }
        if let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) {
            let cmdline = String::from_utf8_lossy(&cmdline);
            // Zombies have an empty command line and are not running.
            if cmdline.contains(needle) {
                pids.push(pid);
            }
        }
    }
    pids
}

/// `roots` and all their living descendants.
pub fn process_tree(roots: &[u32]) -> Vec<u32> {
    flotilla_node_agent::monitor::ProcTable::scan().live_descendants(roots)
}

/// Every process of the browser(s) under `dir` (an instance directory, or the
/// agent's instances root): those whose command line mentions it (the
/// bubblewrap confining a browser names its directories; the browser itself
/// sees them at `/instance/…`), their descendants, and anything left in an
/// instance cgroup named after `dir`.
pub fn browser_processes(dir: &Path) -> Vec<u32> {
    let needle = dir.display().to_string();
    let mut roots = processes_mentioning(&needle);
    let table = flotilla_node_agent::monitor::ProcTable::scan();
    if let Some(name) = dir.file_name().and_then(|n| n.to_str()) {
        let component = format!("/{name}");
        for pid in table.live_pids() {
            let in_cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
                .map(|groups| groups.lines().any(|line| line.ends_with(&component)))
                .unwrap_or(false);
            if in_cgroup && !roots.contains(&pid) && pid != std::process::id() {
                roots.push(pid);
            }
        }
    }
    table.live_descendants(&roots)
}

/// The browser's main process (Chromium without `--type=`) under `dir`.
pub fn browser_main_pid(dir: &Path) -> Option<u32> {
    browser_processes(dir).into_iter().find(|pid| {
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline);
        cmdline.contains("--user-data-dir=") && !cmdline.contains("--type=")
    })
}

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
async fn serve_router(router: axum::Router) -> (String, tokio::task::JoinHandle<()>) {
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
    let mut router = axum::Router::new();
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

/// Runs `tests/js/<script>` with Node and parses the last line of its output as JSON.
pub async fn run_node(script: &str, args: &[&str]) -> anyhow::Result<Value> {
    run_node_with(script, args, &[]).await
}

/// [`run_node`] with extra environment variables (`NODE_OPTIONS`,
/// `NODE_EXTRA_CA_CERTS`, …).
pub async fn run_node_with(
    script: &str,
    args: &[&str],
    env: &[(&str, &str)],
) -> anyhow::Result<Value> {
    let dir = workspace_root().join("tests/js");
    if !dir.join("node_modules").is_dir() {
        bail!("tests/js/node_modules is missing: run scripts/install-deps --test");
    }
    let mut child = tokio::process::Command::new("node")
        .arg(dir.join(script))
        .args(args)
        .envs(env.iter().copied())
        .current_dir(&dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .context("cannot start node")?;
    let output = tokio::time::timeout(Duration::from_secs(120), async {
        let mut stdout = String::new();
        let mut stderr = String::new();
        let mut out = BufReader::new(child.stdout.take().expect("stdout")).lines();
        let mut err = BufReader::new(child.stderr.take().expect("stderr")).lines();
        loop {
            tokio::select! {
                line = out.next_line() => match line? { Some(l) => { stdout.push_str(&l); stdout.push('\n'); } None => break },
                line = err.next_line() => if let Some(l) = line? { stderr.push_str(&l); stderr.push('\n'); },
            }
        }
        while let Some(l) = err.next_line().await? {
            stderr.push_str(&l);
            stderr.push('\n');
        }
        let status = child.wait().await?;
        anyhow::Ok((status, stdout, stderr))
    })
    .await
    .context("node script timed out after 120 s")??;
    let (status, stdout, stderr) = output;
    if !status.success() {
        bail!("{script} failed ({status}):\n{stderr}\n{stdout}");
    }
    let last = stdout.lines().last().unwrap_or_default();
    serde_json::from_str(last)
        .with_context(|| format!("{script} printed no JSON: {stdout}\n{stderr}"))
}

/// The real `flotilla` binary running `serve`, killed (with its browsers) on drop.
pub struct ServeProcess {
    pub child: Option<tokio::process::Child>,
    pub api: Api,
    pub data_dir: PathBuf,
    pub stderr_log: PathBuf,
    /// Whether dropping this handle sweeps the browsers under its data
    /// directory (off for a handle whose process was killed and started
    /// again: the new process owns them).
    pub sweep_on_drop: bool,
}

impl ServeProcess {
    /// Starts `<binary> serve --listen 127.0.0.1:0 --data-dir <data_dir>` and
    /// waits for its "control plane listening on" line.
    pub async fn start(
        binary: &Path,
        data_dir: &Path,
        extra_env: &[(&str, &str)],
    ) -> anyhow::Result<Self> {
        let data = data_dir.display().to_string();
        Self::start_command(
            binary,
            &["serve", "--listen", "127.0.0.1:0", "--data-dir", &data],
            data_dir,
            extra_env,
            "control plane listening on ",
        )
        .await
    }

    /// Starts `<binary> <args…>` and waits (60 s at most) for the stdout line
    /// starting with `ready_prefix` (`control plane listening on `, `node agent
    /// listening on `); `api` points at the URL that line gives.
    pub async fn start_command(
        binary: &Path,
        args: &[&str],
        data_dir: &Path,
        extra_env: &[(&str, &str)],
        ready_prefix: &str,
    ) -> anyhow::Result<Self> {
        std::fs::create_dir_all(data_dir)?;
        let stderr_log = data_dir.with_extension("stderr.log");
        let stderr = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&stderr_log)?;
        let mut command = tokio::process::Command::new(binary);
        command
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::from(stderr))
            .kill_on_drop(true);
        for (key, value) in extra_env {
            command.env(key, value);
        }
        let mut child = command.spawn().context("cannot start flotilla")?;
        let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        let url = tokio::time::timeout(Duration::from_secs(60), async {
            while let Some(line) = lines.next_line().await? {
                if let Some(url) = line.strip_prefix(ready_prefix) {
                    return anyhow::Ok(url.trim().to_owned());
                }
            }
            bail!(
                "flotilla exited before listening; see {}",
                stderr_log.display()
            )
        })
        .await
        .context("flotilla did not start within 60 s")??;
        // Keep reading stdout so the child never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Ok(Self {
            child: Some(child),
            api: Api::new(url),
            data_dir: data_dir.to_path_buf(),
            stderr_log,
            sweep_on_drop: true,
        })
    }

    /// Sends `signal` without waiting (SIGSTOP, SIGCONT …).
    pub fn signal(&self, signal: i32) {
        // SAFETY: kill has no memory-safety preconditions.
        unsafe {
            libc::kill(self.pid() as i32, signal);
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().and_then(|c| c.id()).expect("running")
    }

    /// Sends `signal` and waits (up to 60 s) for the exit; returns the exit code.
    pub async fn stop_with(&mut self, signal: i32) -> Option<i32> {
        let mut child = self.child.take()?;
        if let Some(pid) = child.id() {
            // SAFETY: kill has no memory-safety preconditions.
            unsafe {
                libc::kill(pid as i32, signal);
            }
        }
        let status = tokio::time::timeout(Duration::from_secs(60), child.wait())
            .await
            .expect("flotilla exits within 60 s of a signal")
            .expect("wait");
        status.code()
    }
}

impl Drop for ServeProcess {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.start_kill();
        }
        if self.sweep_on_drop {
            flotilla_node_agent::sweep::sweep(&self.data_dir.join("agent/instances"));
        }
    }
}

/// A page opened in an instance over CDP (through its gateway), for tests that
/// need to run script or navigate.
pub struct Page {
    client: flotilla_node_agent::cdp::CdpClient,
    session: String,
}

const CDP_TIMEOUT: Duration = Duration::from_secs(60);

impl Page {
    /// Opens a new tab at `url` in the browser behind `debug_url` and waits for it to load.
    pub async fn open(debug_url: &str, url: &str) -> anyhow::Result<Self> {
        let client = flotilla_node_agent::cdp::CdpClient::connect(debug_url).await?;
        let target = client
            .call(
                "Target.createTarget",
                serde_json::json!({"url": "about:blank"}),
                None,
                CDP_TIMEOUT,
            )
            .await?;
        let target_id = target["targetId"].as_str().context("targetId")?.to_owned();
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
            .context("sessionId")?
            .to_owned();
        let page = Self { client, session };
        page.navigate(url).await?;
        Ok(page)
    }

    /// Navigates and waits until `document.readyState` is `complete`.
    pub async fn navigate(&self, url: &str) -> anyhow::Result<()> {
        self.client
            .call(
                "Page.navigate",
                serde_json::json!({"url": url}),
                Some(&self.session),
                CDP_TIMEOUT,
            )
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

/// An S3-compatible server (moto, from PyPI) on a free loopback port, with one
/// bucket; stopped on drop.
pub struct S3Server {
    child: tokio::process::Child,
    pub endpoint: String,
    pub bucket: String,
}

impl S3Server {
    pub async fn start(bucket: &str) -> anyhow::Result<Self> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let endpoint = format!("http://127.0.0.1:{port}");
        let child = Self::spawn_on(&endpoint, bucket).await?;
        Ok(Self {
            child,
            endpoint,
            bucket: bucket.to_owned(),
        })
    }

    /// Kills the server: connections are refused until [`S3Server::restart`].
    pub async fn stop(&mut self) {
        let _ = self.child.kill().await;
    }

    /// Starts a fresh (empty) server on the same port, with the bucket.
    pub async fn restart(&mut self) -> anyhow::Result<()> {
        self.stop().await;
        self.child = Self::spawn_on(&self.endpoint, &self.bucket).await?;
        Ok(())
    }

    /// Freezes the server (SIGSTOP): connections are accepted by the kernel
    /// but never answered, until [`S3Server::resume`]. Its objects stay.
    pub fn pause(&self) {
        self.signal(libc::SIGSTOP);
    }

    pub fn resume(&self) {
        self.signal(libc::SIGCONT);
    }

    fn signal(&self, signal: i32) {
        if let Some(pid) = self.child.id() {
            // SAFETY: kill has no memory-safety preconditions.
            unsafe { libc::kill(pid as i32, signal) };
        }
    }

    async fn spawn_on(endpoint: &str, bucket: &str) -> anyhow::Result<tokio::process::Child> {
        let port = endpoint.rsplit(':').next().unwrap_or_default().to_owned();
        let child = tokio::process::Command::new("moto_server")
            .args(["-H", "127.0.0.1", "-p", &port])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .context("cannot start moto_server: run scripts/install-deps --test (pip install 'moto[server]')")?;
        let http = reqwest::Client::new();
        let bucket_url = format!("{endpoint}/{bucket}");
        wait_until(
            Duration::from_secs(60),
            "moto to accept a bucket",
            || async {
                match http.put(&bucket_url).send().await {
                    Ok(response) if response.status().is_success() => Ok(Some(())),
                    Ok(response) => Err(response.status().to_string()),
                    Err(error) => Err(error.to_string()),
                }
            },
        )
        .await?;
        Ok(child)
    }

    /// Keys of the objects under `prefix`.
    pub async fn keys(&self, prefix: &str) -> Vec<String> {
        let listing = reqwest::get(format!(
            "{}/{}?list-type=2&prefix={prefix}",
            self.endpoint, self.bucket
        ))
        .await
        .expect("moto answers")
        .text()
        .await
        .unwrap_or_default();
        listing
            .split("<Key>")
            .skip(1)
            .filter_map(|part| part.split("</Key>").next())
            .map(str::to_owned)
            .collect()
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        self.resume();
        let _ = self.child.start_kill();
    }
}

/// One item of an event stream as received.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SseEvent {
    pub id: Option<String>,
    pub event: Option<String>,
    pub data: Option<String>,
    pub retry: Option<String>,
    /// A comment line (`: keepalive`), when the item is one.
    pub comment: Option<String>,
}

/// A raw SSE client: exact status, headers and lines, no reconnection.
pub struct SseClient {
    pub status: u16,
    /// Header names lowercased.
    pub headers: Vec<(String, String)>,
    /// The body of a refused request.
    pub body: String,
    reader: BufReader<tokio::net::tcp::OwnedReadHalf>,
    _writer: tokio::net::tcp::OwnedWriteHalf,
}

impl SseClient {
    /// `GET <path>` on `addr` with `headers`.
    pub async fn connect(addr: &str, path: &str, headers: &[(&str, &str)]) -> anyhow::Result<Self> {
        use tokio::io::AsyncWriteExt;
        let host = addr.trim_start_matches("http://");
        let stream = tokio::net::TcpStream::connect(host).await?;
        let (read, mut write) = stream.into_split();
        let mut request =
            format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nAccept: text/event-stream\r\n");
        for (name, value) in headers {
            request.push_str(&format!("{name}: {value}\r\n"));
        }
        request.push_str("\r\n");
        write.write_all(request.as_bytes()).await?;
        let mut reader = BufReader::new(read);
        let mut line = String::new();
        tokio::time::timeout(Duration::from_secs(30), reader.read_line(&mut line)).await??;
        let status: u16 = line
            .split_whitespace()
            .nth(1)
            .context("status line")?
            .parse()?;
        let mut headers = Vec::new();
        loop {
            line.clear();
            reader.read_line(&mut line).await?;
            let trimmed = line.trim_end();
            if trimmed.is_empty() {
                break;
            }
            let (name, value) = trimmed.split_once(':').context("header line")?;
            headers.push((name.trim().to_ascii_lowercase(), value.trim().to_owned()));
        }
        let mut client = Self {
            status,
            headers,
            body: String::new(),
            reader,
            _writer: write,
        };
        if status != 200 {
            let length: usize = client
                .header("content-length")
                .and_then(|l| l.parse().ok())
                .unwrap_or(0);
            let mut body = vec![0u8; length];
            tokio::io::AsyncReadExt::read_exact(&mut client.reader, &mut body).await?;
            client.body = String::from_utf8_lossy(&body).into_owned();
        }
        Ok(client)
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The next event or comment; `None` when the stream ended.
    pub async fn next(&mut self, deadline: Duration) -> anyhow::Result<Option<SseEvent>> {
        let mut event = SseEvent::default();
        let mut line = String::new();
        loop {
            line.clear();
            let n = tokio::time::timeout(deadline, self.reader.read_line(&mut line))
                .await
                .context("no event before the deadline")??;
            if n == 0 {
                return Ok(None);
            }
            let text = line.trim_end_matches('\n');
            if text.is_empty() {
                if event != SseEvent::default() {
                    return Ok(Some(event));
                }
                continue;
            }
            if let Some(comment) = text.strip_prefix(':') {
                event.comment = Some(comment.trim().to_owned());
                continue;
            }
            let (field, value) = text.split_once(": ").unwrap_or((text, ""));
            match field {
                "id" => event.id = Some(value.to_owned()),
                "event" => event.event = Some(value.to_owned()),
                "retry" => event.retry = Some(value.to_owned()),
                "data" => {
                    event.data = Some(match event.data.take() {
                        Some(previous) => format!("{previous}\n{value}"),
                        None => value.to_owned(),
                    })
                }
                _ => {}
            }
        }
    }

    /// The next item that is an event (skipping comments), within `deadline`
    /// overall (keepalive comments do not extend it).
    pub async fn next_event(&mut self, deadline: Duration) -> anyhow::Result<SseEvent> {
        let until = tokio::time::Instant::now() + deadline;
        loop {
            let left = until.saturating_duration_since(tokio::time::Instant::now());
            match self.next(left).await? {
                Some(item)
                    if item.comment.is_none() || item.data.is_some() || item.event.is_some() =>
                {
                    return Ok(item);
                }
                Some(_) => continue,
                None => bail!("the stream ended"),
            }
        }
    }
}

/// One call the fake webhook received.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct WebhookCall {
    pub jwt: String,
    pub topic: String,
}

/// How the fake webhook answers a call: status, JSON body, delay.
pub type WebhookBehaviour =
    std::sync::Arc<dyn Fn(&WebhookCall, usize) -> (u16, Value, Duration) + Send + Sync>;

/// A fake of the operator's verification webhook (the far side): a real HTTP
/// server that records every call and answers as `behaviour` says.
pub struct WebhookFake {
    pub url: String,
    pub calls: std::sync::Arc<std::sync::Mutex<Vec<(std::time::Instant, WebhookCall)>>>,
    behaviour: std::sync::Arc<std::sync::Mutex<WebhookBehaviour>>,
    _task: tokio::task::JoinHandle<()>,
}

impl WebhookFake {
    pub async fn start(behaviour: WebhookBehaviour) -> Self {
        let calls: std::sync::Arc<std::sync::Mutex<Vec<(std::time::Instant, WebhookCall)>>> =
            Default::default();
        let behaviour = std::sync::Arc::new(std::sync::Mutex::new(behaviour));
        let (recorded, answers) = (calls.clone(), behaviour.clone());
        let router = axum::Router::new().route(
            "/verify",
            axum::routing::post(move |axum::Json(call): axum::Json<WebhookCall>| {
                let recorded = recorded.clone();
                let answers = answers.clone();
                async move {
                    let index = {
                        let mut calls = recorded.lock().unwrap();
                        calls.push((std::time::Instant::now(), call.clone()));
                        calls.len() - 1
                    };
                    let answer = answers.lock().unwrap().clone();
                    let (status, body, delay) = answer(&call, index);
                    tokio::time::sleep(delay).await;
                    (
                        axum::http::StatusCode::from_u16(status).unwrap(),
                        axum::Json(body),
                    )
                }
            }),
        );
        let (base, task) = serve_router(router).await;
        let url = format!("{base}/verify");
        Self {
            url,
            calls,
            behaviour,
            _task: task,
        }
    }

    /// Every token valid for a day, for user "u-<token>".
    pub fn accept_all() -> WebhookBehaviour {
        std::sync::Arc::new(|call: &WebhookCall, _| {
            let expires = chrono_like_now() + 86_400;
            (
                200,
                serde_json::json!({"valid": true, "user_id": format!("u-{}", call.jwt), "expires_at": expires}),
                Duration::ZERO,
            )
        })
    }

    pub fn set(&self, behaviour: WebhookBehaviour) {
        *self.behaviour.lock().unwrap() = behaviour;
    }

    pub fn call_count(&self) -> usize {
        self.calls.lock().unwrap().len()
    }
}

/// Unix seconds now.
pub fn chrono_like_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// An unsigned JWT with `claims` (the fake webhook decides validity).
pub fn jwt(claims: Value) -> String {
    use base64::Engine;
    let engine = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    format!(
        "{}.{}.sig",
        engine.encode(br#"{"alg":"HS256","typ":"JWT"}"#),
        engine.encode(claims.to_string())
    )
}

/// The event proxy in this process on 127.0.0.1:0, authentication off unless
/// `adjust` turns it on.
pub async fn spawn_proxy(
    adjust: impl FnOnce(&mut flotilla_event_proxy::config::ProxyConfig),
) -> flotilla_event_proxy::Proxy {
    init_logging();
    let mut config = flotilla_event_proxy::config::ProxyConfig::default();
    config.http.bind_address = "127.0.0.1:0".into();
    config.jwt_verifier.require_authentication = false;
    config.publisher.api_keys = vec!["test-publisher".into()];
    adjust(&mut config);
    flotilla_event_proxy::Proxy::start(config)
        .await
        .expect("proxy starts")
}

/// One webhook call an [`EventReceiver`] accepted.
#[derive(Debug, Clone)]
pub struct ReceivedEvent {
    /// `webhook-id`.
    pub id: String,
    pub payload: Value,
}

/// A receiver of the control plane's webhooks (the far side, an operator's
/// endpoint): a real HTTP server that checks each call's Standard Webhooks
/// signature with its own HMAC-SHA256, records accepted events in arrival
/// order, and can be switched down (it then answers 503 and records nothing).
pub struct EventReceiver {
    pub url: String,
    received: std::sync::Arc<std::sync::Mutex<Vec<ReceivedEvent>>>,
    up: std::sync::Arc<std::sync::atomic::AtomicBool>,
    bad_signatures: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    refused: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    _task: tokio::task::JoinHandle<()>,
}

/// Standard Webhooks: `whsec_<base64>` secrets are decoded, others used as bytes.
fn webhook_key(secret: &str) -> Vec<u8> {
    use base64::Engine;
    secret
        .strip_prefix("whsec_")
        .and_then(|s| base64::engine::general_purpose::STANDARD.decode(s).ok())
        .unwrap_or_else(|| secret.as_bytes().to_vec())
}

fn signature_is_valid(key: &[u8], headers: &axum::http::HeaderMap, body: &[u8]) -> bool {
    use base64::Engine;
    use hmac::Mac;
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let (Some(id), Some(timestamp), Some(signatures)) = (
        header("webhook-id"),
        header("webhook-timestamp"),
        header("webhook-signature"),
    ) else {
        return false;
    };
    let Ok(sent_at) = timestamp.parse::<i64>() else {
        return false;
    };
    if (chrono_like_now() - sent_at).abs() > 300 {
        return false;
    }
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(key).expect("any key");
    mac.update(format!("{id}.{timestamp}.").as_bytes());
    mac.update(body);
    let expected = base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes());
    signatures
        .split(' ')
        .any(|s| s.strip_prefix("v1,") == Some(expected.as_str()))
}

impl EventReceiver {
    pub async fn start(secret: &str) -> Self {
        let key = webhook_key(secret);
        let received: std::sync::Arc<std::sync::Mutex<Vec<ReceivedEvent>>> = Default::default();
        let up = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
        let bad_signatures = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let refused = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (r, u, b, f) = (
            received.clone(),
            up.clone(),
            bad_signatures.clone(),
            refused.clone(),
        );
        let router = axum::Router::new().route(
            "/hook",
            axum::routing::post(
                move |headers: axum::http::HeaderMap, body: axum::body::Bytes| {
                    let (received, up, bad, refused, key) =
                        (r.clone(), u.clone(), b.clone(), f.clone(), key.clone());
                    async move {
                        use std::sync::atomic::Ordering;
                        if !up.load(Ordering::SeqCst) {
                            refused.fetch_add(1, Ordering::SeqCst);
                            return axum::http::StatusCode::SERVICE_UNAVAILABLE;
                        }
                        if !signature_is_valid(&key, &headers, &body) {
                            bad.fetch_add(1, Ordering::SeqCst);
                            return axum::http::StatusCode::UNAUTHORIZED;
                        }
                        let Ok(payload) = serde_json::from_slice::<Value>(&body) else {
                            return axum::http::StatusCode::BAD_REQUEST;
                        };
                        let id = headers["webhook-id"]
                            .to_str()
                            .unwrap_or_default()
                            .to_owned();
                        received.lock().unwrap().push(ReceivedEvent { id, payload });
                        axum::http::StatusCode::NO_CONTENT
                    }
                },
            ),
        );
        let (base, task) = serve_router(router).await;
        let url = format!("{base}/hook");
        Self {
            url,
            received,
            up,
            bad_signatures,
            refused,
            _task: task,
        }
    }

    /// Down: every call gets 503. Up: calls are checked and recorded.
    pub fn set_up(&self, up: bool) {
        self.up.store(up, std::sync::atomic::Ordering::SeqCst);
    }

    /// Accepted events, in arrival order.
    pub fn events(&self) -> Vec<ReceivedEvent> {
        self.received.lock().unwrap().clone()
    }

    pub fn bad_signatures(&self) -> usize {
        self.bad_signatures
            .load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Calls answered 503 while down.
    pub fn refused(&self) -> usize {
        self.refused.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// A private PostgreSQL server for one test binary: `initdb` in a temp
/// directory (as the `postgres` user when running as root), listening on a
/// free port of 127.0.0.1 with trust authentication and `fsync = off`.
/// [`PgServer::database`] makes a fresh database per test.
pub struct PgServer {
    pub port: u16,
    child: Option<std::process::Child>,
    _dir: tempfile::TempDir,
}

fn postgres_bin(name: &str) -> anyhow::Result<PathBuf> {
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .context("PostgreSQL is not installed (/usr/lib/postgresql); scripts/install-deps --test installs it")?
        .filter_map(|e| e.ok().map(|e| e.path().join("bin").join(name)))
        .filter(|p| p.exists())
        .collect();
    versions.sort();
    versions
        .pop()
        .with_context(|| format!("no PostgreSQL {name} binary"))
}

impl PgServer {
    pub async fn start() -> anyhow::Result<Self> {
        let dir = tempfile::Builder::new().prefix("flotilla-pg-").tempdir()?;
        // PostgreSQL refuses to run as root: drop to the `postgres` user.
        let root = unsafe { libc::geteuid() } == 0;
        let ids = if root {
            let name = std::ffi::CString::new("postgres").expect("no NUL");
            // SAFETY: getpwnam returns a pointer to static storage or null.
            let entry = unsafe { libc::getpwnam(name.as_ptr()) };
            anyhow::ensure!(!entry.is_null(), "no postgres user (install postgresql)");
            // SAFETY: checked non-null just above.
            Some(unsafe { ((*entry).pw_uid, (*entry).pw_gid) })
        } else {
            None
        };
        let as_postgres = |program: PathBuf| {
            use std::os::unix::process::CommandExt as _;
            let mut command = std::process::Command::new(program);
            if let Some((uid, gid)) = ids {
                command.uid(uid).gid(gid);
            }
            command.stdin(Stdio::null()).current_dir("/");
            command
        };
        if root {
            let status = std::process::Command::new("chown")
                .args(["postgres:postgres"])
                .arg(dir.path())
                .status()?;
            anyhow::ensure!(status.success(), "cannot chown the PostgreSQL directory");
        }
        let data = dir.path().join("data");
        let output = as_postgres(postgres_bin("initdb")?)
            .args(["-A", "trust", "-U", "postgres", "--no-sync", "-D"])
            .arg(&data)
            .output()?;
        anyhow::ensure!(
            output.status.success(),
            "initdb failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        let port = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
            listener.local_addr()?.port()
        };
        let log = std::fs::File::create(dir.path().join("postgres.log"))?;
        let child = as_postgres(postgres_bin("postgres")?)
            .arg("-D")
            .arg(&data)
            .args(["-h", "127.0.0.1", "-p", &port.to_string(), "-k"])
            .arg(dir.path())
            .args([
                "-c",
                "fsync=off",
                "-c",
                "synchronous_commit=off",
                "-c",
                "full_page_writes=off",
                "-c",
                "max_connections=300",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .context("cannot start postgres")?;
        let server = Self {
            port,
            child: Some(child),
            _dir: dir,
        };
        wait_until(
            Duration::from_secs(60),
            "PostgreSQL to accept connections",
            || async {
                match tokio::net::TcpStream::connect(("127.0.0.1", port)).await {
                    Ok(_) => Ok(Some(())),
                    Err(e) => Err(e.to_string()),
                }
            },
        )
        .await
        .map_err(|e| anyhow::anyhow!(e))?;
        Ok(server)
    }

    /// A fresh, empty database; its URL.
    pub async fn database(&self) -> anyhow::Result<String> {
        let name = format!("t_{}", uuid_like());
        let admin = format!("postgres://postgres@127.0.0.1:{}/postgres", self.port);
        let output = tokio::process::Command::new(postgres_bin("psql")?)
            .args(["-d", &admin, "-v", "ON_ERROR_STOP=1", "-c"])
            .arg(format!("CREATE DATABASE {name}"))
            .output()
            .await;
        match output {
            Ok(output) if output.status.success() => {}
            Ok(output) => bail!(
                "CREATE DATABASE failed: {}",
                String::from_utf8_lossy(&output.stderr)
            ),
            Err(error) => bail!("cannot run psql: {error}"),
        }
        Ok(format!(
            "postgres://postgres@127.0.0.1:{}/{name}",
            self.port
        ))
    }
}

fn uuid_like() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!(
        "{}_{}_{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0)
    )
}

impl Drop for PgServer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SIGINT: PostgreSQL's fast shutdown.
            unsafe {
                libc::kill(child.id() as i32, libc::SIGINT);
            }
            for _ in 0..100 {
                if let Ok(Some(_)) = child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
