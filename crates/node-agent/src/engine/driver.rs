//! The engine's WebDriver server, made by the browser's authors:
//! chromedriver for Chromium (attached to the browser's DevTools port),
//! geckodriver for Firefox (`--connect-existing`, attached to the browser's
//! Marionette port). Started beside a browser in its confinement
//! ([`start_driver`], a [`Driver`] ends it when dropped), and the HTTP calls
//! the agent makes to it; its errors in W3C's shape ([`WebDriverError`]).
//! The session logic on top is `protocols::webdriver`'s.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use serde_json::{Value, json};

use crate::config::EngineKind;
use crate::confine::sandbox::Isolation;
use crate::engine::browser::CdpEndpoint;
use crate::system::dirs::InstanceDirs;

/// Where chromedriver is installed (Debian's `chromium-driver`).
pub const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

/// Where geckodriver is installed (`scripts/install-deps` builds it from
/// crates.io).
pub const GECKODRIVER: &str = "/usr/local/bin/geckodriver";

/// The driver's port inside the instance's network namespace (each
/// instance has its own, so every instance uses the same).
const PORT_IN_NAMESPACE: u16 = 9515;

/// How long the driver may take to answer its first `/status`.
const START_TIMEOUT: Duration = Duration::from_secs(20);

/// How long a Firefox may take to announce its Marionette port (it does
/// right after it starts; a revived one may still be starting).
const MARIONETTE_TIMEOUT: Duration = Duration::from_secs(20);

/// The largest answer passed on (a screenshot is at most
/// `agent.screenshot_max_bytes` of PNG, in base64).
const MAX_ANSWER: usize = 64 << 20;

/// A W3C WebDriver error: its code, HTTP status and message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct WebDriverError {
    pub status: u16,
    /// The W3C error code (`invalid session id`, `session not created`, …).
    pub code: &'static str,
    pub message: String,
}

impl WebDriverError {
    pub fn new(status: u16, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
        }
    }

    pub fn no_session(id: &str) -> Self {
        Self::new(
            404,
            "invalid session id",
            format!("no WebDriver session {id}: create one with POST /session"),
        )
    }

    pub(crate) fn not_created(message: impl Into<String>) -> Self {
        Self::new(500, "session not created", message)
    }

    /// The W3C body: `{"value": {"error", "message", "stacktrace"}}`.
    pub fn body(&self) -> Value {
        json!({"value": {"error": self.code, "message": self.message, "stacktrace": ""}})
    }
}

/// A kept-alive HTTP connection to a WebDriver server.
pub(crate) struct Kept {
    at: CdpEndpoint,
    sender: hyper::client::conn::http1::SendRequest<Full<Bytes>>,
}

/// A running WebDriver server, for one browser (it lives in that browser's
/// confinement); dropping it ends it.
pub struct Driver {
    _child: tokio::process::Child,
    /// How to reach it: its port, in the browser's namespace.
    pub(crate) at: CdpEndpoint,
    pub(crate) browser: CdpEndpoint,
}

impl Driver {
    /// Its process (its sandbox's, whose end ends it), while it runs.
    pub(crate) fn pid(&self) -> Option<u32> {
        self._child.id()
    }
}

/// Where a WebDriver server starts: beside a browser, in its confinement.
pub struct Beside<'a> {
    pub isolation: &'a Isolation,
    pub dirs: &'a InstanceDirs,
    pub cgroup: Option<&'a Arc<crate::system::cgroups::InstanceCgroup>>,
    /// The browser's pid, its process group.
    pub group: u32,
}

/// The WebDriver server of an engine: its executable, its name (in
/// messages and its log's) and how to install it.
fn server_of(engine: EngineKind) -> (&'static str, &'static str, &'static str) {
    match engine {
        EngineKind::Firefox => (
            GECKODRIVER,
            "geckodriver",
            "geckodriver from crates.io; scripts/install-deps installs it",
        ),
        EngineKind::Chromium => (
            CHROMEDRIVER,
            "chromedriver",
            "Debian's chromium-driver; scripts/install-deps installs it",
        ),
    }
}

/// Whether the WebDriver server of `engine` is installed on this node.
pub fn installed(engine: EngineKind) -> bool {
    std::path::Path::new(server_of(engine).0).is_file()
}

/// The driver's command line: its port, and for geckodriver the running
/// browser's Marionette (announced in its profile).
async fn driver_args(
    beside: &Beside<'_>,
    engine: EngineKind,
    port: u16,
) -> Result<Vec<String>, WebDriverError> {
    if engine == EngineKind::Chromium {
        return Ok(vec![
            format!("--port={port}"),
            "--log-level=WARNING".to_owned(),
        ]);
    }
    let profile = beside.dirs.profile();
    let deadline = Instant::now() + MARIONETTE_TIMEOUT;
    let marionette = loop {
        if let Some(port) = crate::engine::firefox::marionette_port(&profile) {
            break port;
        }
        if Instant::now() > deadline {
            return Err(WebDriverError::not_created(format!(
                "Firefox did not announce its Marionette port within {MARIONETTE_TIMEOUT:?}"
            )));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    Ok([
        "--connect-existing",
        "--marionette-host",
        "127.0.0.1",
        "--marionette-port",
        &marionette.to_string(),
        "--host",
        "127.0.0.1",
        "--port",
        &port.to_string(),
        "--log",
        "warn",
    ]
    .map(str::to_owned)
    .to_vec())
}

/// Starts the engine's WebDriver server beside `browser` and waits until
/// it answers.
pub async fn start_driver(
    beside: &Beside<'_>,
    browser: &CdpEndpoint,
) -> Result<Driver, WebDriverError> {
    let unavailable = |why: String| WebDriverError::not_created(why);
    let (executable, name, install) = server_of(browser.engine);
    if !std::path::Path::new(executable).is_file() {
        return Err(unavailable(format!(
            "{executable} is not installed on this node ({install})"
        )));
    }
    let port = match &browser.net {
        Some(_) => PORT_IN_NAMESPACE,
        None => free_port().map_err(|e| unavailable(format!("no free port: {e}")))?,
    };
    let log_path = beside.dirs.root.join(format!("{name}.log"));
    let log = std::fs::File::create(&log_path)
        .map_err(|e| unavailable(format!("cannot create {name}'s log: {e}")))?;
    let args = driver_args(beside, browser.engine, port).await?;
    let child = crate::engine::browser::spawn_beside(
        beside.isolation,
        beside.dirs,
        (browser.net.as_deref(), beside.cgroup, beside.group),
        std::path::Path::new(executable),
        (
            "webdriver",
            &args,
            log,
            (std::process::Stdio::null(), std::process::Stdio::null()),
        ),
    )
    .map_err(|e| unavailable(format!("cannot start {name}: {e}")))?;
    let at = CdpEndpoint {
        port,
        browser_path: String::new(),
        net: browser.net.clone(),
        engine: browser.engine,
        session_turns: Default::default(),
    };
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        match call(&at, hyper::Method::GET, "/status", Bytes::new()).await {
            Ok((200, _)) => break,
            _ if Instant::now() > deadline => {
                let log = crate::system::process::log_tail(&log_path);
                return Err(unavailable(format!(
                    "{name} did not answer within {START_TIMEOUT:?}{log}"
                )));
            }
            _ => tokio::time::sleep(Duration::from_millis(2)).await,
        }
    }
    Ok(Driver {
        _child: child,
        at,
        browser: browser.clone(),
    })
}

/// A free port on the host's loopback (for a browser without a namespace).
fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

pub(crate) fn driver_error(why: impl std::fmt::Display) -> WebDriverError {
    WebDriverError::new(500, "unknown error", format!("the WebDriver server: {why}"))
}

/// A new HTTP connection to the WebDriver server at `at`.
pub(crate) async fn connect(
    at: &CdpEndpoint,
) -> Result<hyper::client::conn::http1::SendRequest<Full<Bytes>>, WebDriverError> {
    let stream = at.connect().await.map_err(driver_error)?;
    let (sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .map_err(driver_error)?;
    tokio::spawn(connection);
    Ok(sender)
}

/// One HTTP request to the WebDriver server at `at` on a connection of its own: its
/// status and body.
pub(crate) async fn call(
    at: &CdpEndpoint,
    method: hyper::Method,
    path: &str,
    body: Bytes,
) -> Result<(u16, Bytes), WebDriverError> {
    let mut sender = connect(at).await?;
    send(&mut sender, at, (method, path, body)).await
}

/// One HTTP request to the WebDriver server at `at` over `kept` (opened again when
/// it is for another server or was closed; a request is never sent
/// twice).
pub(crate) async fn call_kept(
    kept: &mut Option<Kept>,
    at: &CdpEndpoint,
    request: (hyper::Method, &str, Bytes),
) -> Result<(u16, Bytes), WebDriverError> {
    let reusable = match kept {
        Some(open) if open.at == *at => open.sender.ready().await.is_ok(),
        _ => false,
    };
    if !reusable {
        *kept = Some(Kept {
            at: at.clone(),
            sender: connect(at).await?,
        });
    }
    let open = kept.as_mut().expect("just opened");
    let answer = send(&mut open.sender, at, request).await;
    if answer.is_err() {
        *kept = None;
    }
    answer
}

pub(crate) async fn send(
    sender: &mut hyper::client::conn::http1::SendRequest<Full<Bytes>>,
    at: &CdpEndpoint,
    (method, path, body): (hyper::Method, &str, Bytes),
) -> Result<(u16, Bytes), WebDriverError> {
    let request = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header(hyper::header::HOST, at.authority())
        .header(
            hyper::header::CONTENT_TYPE,
            "application/json; charset=utf-8",
        )
        .body(Full::new(body))
        .map_err(driver_error)?;
    let response = sender.send_request(request).await.map_err(driver_error)?;
    let status = response.status().as_u16();
    let body = Limited::new(response.into_body(), MAX_ANSWER)
        .collect()
        .await
        .map_err(driver_error)?
        .to_bytes();
    Ok((status, body))
}
