//! One browser process tree: launch, readiness, exit watching and stopping.
//!
//! A browser runs in its own process group (its pid is the group id), with its own
//! profile (`--user-data-dir`), `HOME` and log file under the instance directory.
//! Readiness is Chromium's `DevToolsActivePort` file (written once the DevTools
//! server listens) followed by one `GET /json/version`. A reaper task owns the
//! child: it records the exit and then kills what is left of the group, so no
//! helper outlives its browser. The sim runtime has the same shape without a process.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::config::{BASE_CHROMIUM_FLAGS, EngineKind, ImageConfig};
use crate::confine::egress::{EgressPolicy, Route, Upstream};
use crate::confine::netns::NetNamespace;
use crate::confine::sandbox::{BrowserPaths, Isolation};
use crate::engine::cdp::CdpClient;
use crate::system::dirs::InstanceDirs;
use crate::system::process::{kill_group, log_tail};

/// Where a running browser's remote protocol server listens: 127.0.0.1 of
/// the host, or of the browser's own network namespace (which only the agent
/// can reach). Chromium's speaks CDP (its browser target at
/// `/devtools/browser/<uuid>`); Firefox's WebDriver BiDi (at `/session`).
#[derive(Debug, Clone)]
pub struct CdpEndpoint {
    pub port: u16,
    /// Path of the browser target, `/devtools/browser/<uuid>` (Chromium)
    /// or `/session` (Firefox).
    pub browser_path: String,
    /// The browser's network namespace, when it has one.
    pub net: Option<Arc<NetNamespace>>,
    /// The engine behind it: which protocol the socket speaks.
    pub engine: EngineKind,
    /// Who gets a Firefox's only WebDriver session (shared by every copy of
    /// this endpoint: one per browser).
    pub session_turns: Arc<crate::engine::bidi::SessionTurns>,
}

impl PartialEq for CdpEndpoint {
    fn eq(&self, other: &Self) -> bool {
        self.port == other.port
            && self.engine == other.engine
            && self.browser_path == other.browser_path
            && match (&self.net, &other.net) {
                (Some(a), Some(b)) => Arc::ptr_eq(a, b),
                (None, None) => true,
                _ => false,
            }
    }
}

impl Eq for CdpEndpoint {}

impl CdpEndpoint {
    /// An endpoint on the host's loopback (a browser without a namespace).
    pub fn on_host(port: u16, browser_path: String) -> Self {
        Self {
            port,
            browser_path,
            net: None,
            engine: EngineKind::Chromium,
            session_turns: Arc::default(),
        }
    }

    /// Firefox's WebDriver BiDi server on the host's loopback.
    pub fn bidi_on_host(port: u16) -> Self {
        Self {
            engine: EngineKind::Firefox,
            ..Self::on_host(port, crate::engine::firefox::BIDI_PATH.to_owned())
        }
    }

    /// Whether the socket speaks CDP (Chromium's); Firefox's speaks BiDi.
    pub fn speaks_cdp(&self) -> bool {
        self.engine == EngineKind::Chromium
    }

    /// The DevTools server's address, as its own network sees it.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }

    /// `127.0.0.1:<port>`, the `Host` Chromium answers to.
    pub fn authority(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The browser target's WebSocket URL (valid inside the browser's network).
    pub fn browser_ws_url(&self) -> String {
        format!("ws://127.0.0.1:{}{}", self.port, self.browser_path)
    }

    /// A TCP connection to the DevTools server, through its namespace if any.
    pub async fn connect(&self) -> std::io::Result<TcpStream> {
        match &self.net {
            Some(net) => net.connect(self.addr()).await,
            None => {
                let stream = TcpStream::connect(self.addr()).await?;
                stream.set_nodelay(true)?;
                Ok(stream)
            }
        }
    }
}

/// Why a launch did not produce a browser answering CDP.
#[derive(Debug, Clone, thiserror::Error)]
pub enum LaunchError {
    #[error("cannot start {executable}: {reason}")]
    Spawn { executable: String, reason: String },
    #[error("browser exited during start ({exit}){log}")]
    ExitedEarly { exit: String, log: String },
    #[error("browser did not answer CDP within {0:?}")]
    Timeout(Duration),
    #[error("launch cancelled")]
    Cancelled,
}

/// What an instance's configuration asks of its browser's start (a warm
/// browser: nothing).
#[derive(Debug, Clone, Copy, Default)]
pub struct BrowserSetup<'a> {
    /// Ids of the extensions unpacked under `dirs.extensions()` to load.
    pub extensions: &'a [String],
    /// Preferences written into the profile first (`config.prefs`).
    pub prefs: Option<&'a serde_json::Map<String, serde_json::Value>>,
}

impl<'a> BrowserSetup<'a> {
    pub fn of(config: &'a flotilla_api_types::instances::InstanceConfig) -> Self {
        Self {
            extensions: &config.extensions,
            prefs: config.prefs.as_ref(),
        }
    }
}

/// How to start one browser.
pub struct LaunchPlan<'a> {
    pub image: &'a ImageConfig,
    pub dirs: &'a InstanceDirs,
    /// The window's size (Chromium's window holds the viewport and its
    /// invisible toolbar, measured once per executable).
    pub window: (u32, u32),
    /// User, filesystem and namespaces of the node's browsers.
    pub isolation: &'a Isolation,
    /// The egress rules, when the browser gets a network namespace of its own.
    pub egress: Option<&'a Arc<EgressPolicy>>,
    /// The instance's upstream proxy (`config.proxy`), if any.
    pub upstream: Option<Upstream>,
    /// What the instance's configuration asks of the start.
    pub setup: BrowserSetup<'a>,
    /// The cgroup the browser joins before it runs.
    pub cgroup: Option<&'a std::sync::Arc<crate::system::cgroups::InstanceCgroup>>,
    /// Host name inside the sandbox's UTS namespace.
    pub hostname: &'a str,
}

impl LaunchPlan<'_> {
    pub(super) fn spawn_error(&self, reason: String) -> LaunchError {
        LaunchError::Spawn {
            executable: self.image.executable.display().to_string(),
            reason,
        }
    }
}

/// Checks the executable, creates the instance's directories (handed to the
/// browser's user) and its log file.
pub(super) fn prepare_instance_dir(
    plan: &LaunchPlan<'_>,
    write_profile: &dyn Fn(&InstanceDirs, &BrowserPaths) -> std::io::Result<()>,
) -> Result<(BrowserPaths, std::fs::File), LaunchError> {
    // Checked here so that the reason is the same with and without the sandbox.
    match std::fs::metadata(&plan.image.executable) {
        Ok(meta) if meta.is_file() => {}
        Ok(_) => return Err(plan.spawn_error("not a file".into())),
        Err(error) => return Err(plan.spawn_error(error.to_string())),
    }
    let dirs = plan.dirs;
    let paths = plan.isolation.browser_paths(dirs);
    dirs.create()
        .and_then(|()| dirs.set_default_downloads(&paths.downloads))
        .map_err(|e| plan.spawn_error(format!("cannot create instance directory: {e}")))?;
    write_profile(dirs, &paths)
        .map_err(|e| plan.spawn_error(format!("cannot write the profile's preferences: {e}")))?;
    plan.isolation.hand_over(dirs).map_err(|e| {
        plan.spawn_error(format!(
            "cannot give the instance directory to the browser user: {e}"
        ))
    })?;
    let log = std::fs::File::create(dirs.log())
        .map_err(|e| plan.spawn_error(format!("cannot create log file: {e}")))?;
    Ok((paths, log))
}

/// The browser's command line: the image's and the plan's flags, its
/// profile, the egress proxy and the extensions to load.
fn chromium_command(
    plan: &LaunchPlan<'_>,
    paths: &BrowserPaths,
    log: std::fs::File,
    proxy_port: Option<u16>,
) -> tokio::process::Command {
    let mut command = plan
        .isolation
        .command(plan.dirs, &plan.image.executable, plan.hostname);
    command
        .args(BASE_CHROMIUM_FLAGS)
        .args(&plan.image.args)
        .arg(format!("--window-size={},{}", plan.window.0, plan.window.1))
        .arg(format!("--user-data-dir={}", paths.profile.display()))
        .arg("--remote-debugging-port=0")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(log))
        .process_group(0)
        .kill_on_drop(false);
    if let Some(port) = proxy_port {
        // Everything, loopback included, goes through the egress proxy.
        command
            .arg(format!("--proxy-server=socks5://127.0.0.1:{port}"))
            .arg("--proxy-bypass-list=<-loopback>");
    }
    if !plan.setup.extensions.is_empty() {
        let folders: Vec<String> = plan
            .setup
            .extensions
            .iter()
            .map(|id| paths.extensions.join(id).to_string_lossy().into_owned())
            .collect();
        let folders = folders.join(",");
        command
            .arg(format!("--load-extension={folders}"))
            .arg(format!("--disable-extensions-except={folders}"));
    }
    if !plan.isolation.chromium_sandbox {
        command.arg("--no-sandbox");
    }
    command.arg("about:blank");
    command
}

/// What the child does between fork and exec: join the cgroup and the
/// network namespace, drop privileges, and die with the agent until then.
pub(super) fn confine_before_exec(
    command: &mut tokio::process::Command,
    plan: &LaunchPlan<'_>,
    net: Option<&NetNamespace>,
) {
    confine(command, (plan.cgroup, net, plan.isolation.user.clone()));
}

/// Starts `program` beside an instance's browser, in its confinement: its
/// sandbox (`name` its host name), cgroup and network namespace, as the
/// browser user (the instance's WebDriver and Playwright servers), and in
/// the browser's process group
/// (`browser_group`, the browser's pid), so that every stop of the browser
/// (park, delete, shutdown, a crash's clean-up) ends it too, as does
/// dropping its handle. One left by an agent killed at once is swept at the
/// next start like the browser.
pub fn spawn_beside(
    isolation: &Isolation,
    dirs: &InstanceDirs,
    (net, cgroup, browser_group): (
        Option<&NetNamespace>,
        Option<&Arc<crate::system::cgroups::InstanceCgroup>>,
        u32,
    ),
    program: &std::path::Path,
    (name, args, log, (stdin, stdout)): (&str, &[String], std::fs::File, (Stdio, Stdio)),
) -> std::io::Result<tokio::process::Child> {
    // Its sandbox ends with the handle: a driver dropped ends its program.
    let mut command = isolation.command_with(dirs, program, name, &["--die-with-parent"]);
    command
        .args(args)
        .stdin(stdin)
        .stdout(stdout)
        .stderr(Stdio::from(log))
        .process_group(i32::try_from(browser_group).map_err(std::io::Error::other)?)
        .kill_on_drop(true);
    confine(&mut command, (cgroup, net, isolation.user.clone()));
    command.spawn()
}

/// What a confined child does between fork and exec: join the cgroup and
/// the network namespace, drop privileges, and die with the agent until it
/// runs.
fn confine(
    command: &mut tokio::process::Command,
    (cgroup, net, user): (
        Option<&Arc<crate::system::cgroups::InstanceCgroup>>,
        Option<&NetNamespace>,
        Option<crate::confine::sandbox::BrowserUser>,
    ),
) {
    let mut attach = cgroup.map(|cgroup| cgroup.attach_hook());
    let namespace = net.map(|net| net.raw_fd());
    let agent = std::process::id() as libc::pid_t;
    // SAFETY: the hook makes only async-signal-safe calls: prctl and
    // getppid, the cgroup attach (see attach_hook), setns, and the
    // privilege drop (system calls).
    unsafe {
        command.pre_exec(move || {
            // Until exec this child holds copies of all the agent's
            // descriptors, its listening sockets too, and the cgroup
            // attach can wait a while: if the agent dies meanwhile (kill
            // -9), so does the child, instead of holding the ports of
            // the agent's next start and launching a browser nobody knows.
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::getppid() != agent {
                return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
            }
            if let Some(attach) = attach.as_mut() {
                attach()?;
            }
            if let Some(fd) = namespace
                && libc::setns(fd, libc::CLONE_NEWNET) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            if let Some(user) = &user {
                crate::confine::sandbox::drop_privileges(user)?;
            }
            // The browser itself outlives the agent (its next start
            // sweeps it), and the signal would follow the spawning
            // thread, not the process.
            libc::prctl(libc::PR_SET_PDEATHSIG, 0);
            if libc::getppid() != agent {
                return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
}

/// Waits for the browser and its helpers to be gone, then removes its
/// cgroup, stops its egress proxy and says how it ended.
pub(super) fn reap_when_gone(
    mut child: tokio::process::Child,
    pid: u32,
    plan: &LaunchPlan<'_>,
    egress_stop: CancellationToken,
) -> watch::Receiver<Option<String>> {
    let (exit_tx, exit_rx) = watch::channel(None);
    let cgroup = plan.cgroup.cloned();
    let sandboxed = plan.isolation.filesystem_isolated();
    tokio::spawn(async move {
        let description = match child.wait().await {
            Ok(status) => describe_exit(status, sandboxed),
            Err(e) => format!("wait failed: {e}"),
        };
        // Helpers (zygote, renderers, GPU, network and storage services)
        // share the group; crashpad handlers make their own groups but stay in
        // the cgroup. After a clean exit the storage service may still be
        // flushing localStorage to disk: give the helpers a moment to finish
        // on their own, then kill what is left, and report the exit only once
        // every one is gone.
        wait_for_helpers(pid, cgroup.as_deref(), HELPER_GRACE).await;
        kill_and_reap(pid, cgroup.as_deref(), Duration::from_secs(5)).await;
        if let Some(cgroup) = cgroup {
            cgroup.remove();
        }
        egress_stop.cancel();
        let _ = exit_tx.send(Some(description));
    });
    exit_rx
}

/// A browser's network, set up before it starts: its namespace and egress
/// proxy when the node enforces egress or the instance has an upstream proxy.
pub(super) struct BrowserNetwork {
    net: Option<Arc<NetNamespace>>,
    route: Option<Arc<Route>>,
    /// The egress proxy's port (SOCKS5 on the browser's 127.0.0.1).
    pub proxy_port: Option<u16>,
    egress_stop: CancellationToken,
}

impl BrowserNetwork {
    pub(super) async fn start(plan: &LaunchPlan<'_>) -> Result<Self, LaunchError> {
        let egress_stop = CancellationToken::new();
        if plan.egress.is_none() && plan.upstream.is_none() {
            return Ok(Self {
                net: None,
                route: None,
                proxy_port: None,
                egress_stop,
            });
        }
        let route = Arc::new(Route::new(plan.egress.cloned(), plan.upstream.clone()));
        let (net, port) = start_egress(route.clone(), plan.hostname, &egress_stop)
            .await
            .map_err(|e| plan.spawn_error(format!("cannot set up the browser's network: {e}")))?;
        Ok(Self {
            net,
            route: Some(route),
            proxy_port: Some(port),
            egress_stop,
        })
    }

    /// Stops its egress proxy (a launch that failed before its browser ran).
    pub(super) fn abandon(self) {
        self.egress_stop.cancel();
    }
}

/// A started browser (real or simulated).
pub struct BrowserProcess {
    pid: Option<u32>,
    dirs: InstanceDirs,
    /// The browser's network namespace (with the egress proxy in it), if any.
    net: Option<Arc<NetNamespace>>,
    /// Where the egress proxy sends the browser's connections, when it has one.
    route: Option<Arc<Route>>,
    /// Stops the egress proxy; cancelled once the browser is gone.
    egress_stop: CancellationToken,
    /// Set once, by the reaper, to a description of how the process ended.
    exit: watch::Receiver<Option<String>>,
    /// For the sim runtime: dropping or sending ends the "process".
    sim_stop: Option<watch::Sender<Option<String>>>,
    sim_start: Duration,
    /// How it announces readiness and how it is stopped gracefully.
    engine: EngineKind,
}

impl BrowserProcess {
    /// Starts Chromium as `plan` says: its image, profile, confinement, network
    /// and cgroup.
    pub async fn spawn_chromium(plan: &LaunchPlan<'_>) -> Result<Self, LaunchError> {
        let (paths, log) = prepare_instance_dir(plan, &|dirs, _| match plan.setup.prefs {
            Some(prefs) => crate::engine::prefs::write(&dirs.profile(), prefs),
            None => Ok(()),
        })?;
        let network = BrowserNetwork::start(plan).await?;
        let command = chromium_command(plan, &paths, log, network.proxy_port);
        Self::start(plan, command, network, EngineKind::Chromium)
    }

    /// Runs `command` (a browser's, confined as `plan` says, on `network`)
    /// and watches it.
    pub(super) fn start(
        plan: &LaunchPlan<'_>,
        mut command: tokio::process::Command,
        network: BrowserNetwork,
        engine: EngineKind,
    ) -> Result<Self, LaunchError> {
        let BrowserNetwork {
            net,
            route,
            egress_stop,
            ..
        } = network;
        confine_before_exec(&mut command, plan, net.as_deref());
        let child = command.spawn().map_err(|e| {
            egress_stop.cancel();
            plan.spawn_error(e.to_string())
        })?;
        let pid = child
            .id()
            .ok_or_else(|| plan.spawn_error("process vanished at once".into()))?;
        let exit = reap_when_gone(child, pid, plan, egress_stop.clone());
        Ok(Self {
            pid: Some(pid),
            dirs: plan.dirs.clone(),
            net,
            route,
            egress_stop,
            exit,
            sim_stop: None,
            sim_start: Duration::ZERO,
            engine,
        })
    }

    /// A simulated browser: no process, ready after `start`.
    pub fn spawn_sim(dirs: &InstanceDirs, start: Duration) -> Self {
        let (tx, rx) = watch::channel(None);
        Self {
            pid: None,
            dirs: dirs.clone(),
            net: None,
            route: None,
            egress_stop: CancellationToken::new(),
            exit: rx,
            sim_stop: Some(tx),
            sim_start: start,
            engine: EngineKind::Chromium,
        }
    }

    pub fn pid(&self) -> Option<u32> {
        self.pid
    }

    /// Destinations the egress policy refused since the last call, each
    /// once per browser (none without an egress proxy).
    pub fn take_refusals(&self) -> Vec<crate::confine::egress::Refusal> {
        self.route
            .as_ref()
            .map(|route| route.take_refusals())
            .unwrap_or_default()
    }

    /// Points the browser's connections at `upstream` (a warm browser taken
    /// by an instance with `config.proxy`). `false` when the browser has no
    /// egress proxy to route through.
    pub fn set_upstream(&self, upstream: Option<Upstream>) -> bool {
        match &self.route {
            Some(route) => {
                route.set_upstream(upstream);
                true
            }
            None => upstream.is_none(),
        }
    }

    pub fn dirs(&self) -> &InstanceDirs {
        &self.dirs
    }

    /// `Some(description)` once the process has ended.
    pub fn exit_status(&self) -> Option<String> {
        self.exit.borrow().clone()
    }

    /// Waits for the end of the process and describes it.
    pub async fn wait_exit(&self) -> String {
        let mut exit = self.exit.clone();
        loop {
            if let Some(description) = exit.borrow_and_update().clone() {
                return description;
            }
            if exit.changed().await.is_err() {
                return exit.borrow().clone().unwrap_or_else(|| "ended".into());
            }
        }
    }

    /// Waits until the browser answers CDP; `None` endpoint for the sim runtime.
    pub async fn wait_ready(&self, timeout: Duration) -> Result<Option<CdpEndpoint>, LaunchError> {
        if self.pid.is_none() {
            tokio::time::sleep(self.sim_start).await;
            return match self.exit_status() {
                Some(exit) => Err(LaunchError::ExitedEarly {
                    exit,
                    log: String::new(),
                }),
                None => Ok(None),
            };
        }
        let deadline = Instant::now() + timeout;
        let mut exit = self.exit.clone();
        loop {
            if let Some(exit) = self.exit_status() {
                return Err(LaunchError::ExitedEarly {
                    exit,
                    log: log_tail(&self.dirs.log()),
                });
            }
            if let Some(mut endpoint) = self.announced_endpoint() {
                endpoint.net = self.net.clone();
                if probe(&endpoint).await {
                    return Ok(Some(endpoint));
                }
            }
            if Instant::now() >= deadline {
                return Err(LaunchError::Timeout(timeout));
            }
            // Poll the file every 2 ms (a stat), waking early if the process exits.
            let _ = tokio::time::timeout(Duration::from_millis(2), exit.changed()).await;
        }
    }

    /// Where the browser says its server listens, once it has said so:
    /// Chromium's `DevToolsActivePort`, Firefox's `WebDriverBiDiServer.json`
    /// (each in its profile).
    fn announced_endpoint(&self) -> Option<CdpEndpoint> {
        match self.engine {
            EngineKind::Chromium => read_port_file(&self.dirs.profile().join("DevToolsActivePort")),
            EngineKind::Firefox => crate::engine::firefox::read_server_file(&self.dirs.profile()),
        }
    }

    /// Stops the browser. Graceful: CDP `Browser.close` for Chromium (the only
    /// way that flushes cookies to disk), then SIGTERM, then SIGKILL of the
    /// group, each after a wait; BiDi `browser.close` for Firefox, then
    /// SIGKILL. Not graceful: SIGKILL at once. Returns when the process is
    /// gone.
    pub async fn stop(&self, endpoint: Option<&CdpEndpoint>, graceful: bool, grace: Duration) {
        if let Some(stop) = &self.sim_stop {
            let _ = stop.send(Some("stopped".into()));
            return;
        }
        let Some(pid) = self.pid else { return };
        if self.exit_status().is_some() {
            return;
        }
        if graceful && self.engine == EngineKind::Firefox {
            if let Some(endpoint) = endpoint
                && self.close_over_bidi(endpoint, grace).await
            {
                kill_group(pid, libc::SIGKILL);
                return;
            }
            tracing::warn!(pid, "Firefox did not close over BiDi; killing it");
        } else if graceful {
            if let Some(endpoint) = endpoint
                && let Ok(Ok(client)) =
                    tokio::time::timeout(Duration::from_secs(2), CdpClient::browser(endpoint)).await
            {
                let _ = client.send("Browser.close", serde_json::json!({})).await;
                if self.wait_exit_for(grace).await {
                    // What is left of its group: the instance's chromedriver.
                    kill_group(pid, libc::SIGKILL);
                    return;
                }
            }
            kill_group(pid, libc::SIGTERM);
            if self.wait_exit_for(Duration::from_secs(2)).await {
                kill_group(pid, libc::SIGKILL);
                return;
            }
            tracing::warn!(pid, "browser ignored Browser.close and SIGTERM; killing it");
        }
        kill_group(pid, libc::SIGKILL);
        self.wait_exit().await;
    }

    /// BiDi's `browser.close` (the only way Firefox writes its profile and
    /// quits; SIGTERM ends it at once): whether it exited. Firefox's quit
    /// takes seconds on a loaded machine: it is given three times `grace`.
    async fn close_over_bidi(&self, endpoint: &CdpEndpoint, grace: Duration) -> bool {
        let patience = grace * 3;
        let opened =
            tokio::time::timeout(patience, crate::engine::bidi::BidiSession::open(endpoint)).await;
        let session = match opened {
            Ok(Ok(session)) => session,
            Ok(Err(error)) => {
                tracing::warn!(%error, "cannot close Firefox over BiDi");
                return false;
            }
            Err(_) => return false,
        };
        let _ = tokio::time::timeout(patience, session.close_browser()).await;
        self.wait_exit_for(patience).await
    }

    async fn wait_exit_for(&self, limit: Duration) -> bool {
        tokio::time::timeout(limit, self.wait_exit()).await.is_ok()
    }
}

impl Drop for BrowserProcess {
    fn drop(&mut self) {
        self.egress_stop.cancel();
        // Never leave a browser behind, whatever path dropped its handle.
        if let Some(pid) = self.pid
            && self.exit.borrow().is_none()
        {
            kill_group(pid, libc::SIGKILL);
        }
    }
}

fn read_port_file(path: &Path) -> Option<CdpEndpoint> {
    let text = std::fs::read_to_string(path).ok()?;
    let mut lines = text.lines();
    let port = lines.next()?.trim().parse().ok()?;
    let browser_path = lines.next()?.trim().to_owned();
    if !browser_path.starts_with("/devtools/browser/") {
        return None;
    }
    Some(CdpEndpoint::on_host(port, browser_path))
}

/// Starts the browser's egress proxy: in a network namespace of its own when
/// the node enforces egress (the route has a policy), else on the host's
/// loopback (only to carry an upstream proxy's credentials). Returns the
/// namespace, if any, and the proxy's port.
pub(super) async fn start_egress(
    route: Arc<Route>,
    name: &str,
    stop: &CancellationToken,
) -> std::io::Result<(Option<Arc<NetNamespace>>, u16)> {
    let loopback = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
    let (net, listener) = if route.policy.is_some() {
        let net = Arc::new(NetNamespace::create()?);
        let listener = net.listen(loopback).await?;
        (Some(net), listener)
    } else {
        (None, tokio::net::TcpListener::bind(loopback).await?)
    };
    let port = listener.local_addr()?.port();
    tokio::spawn(crate::confine::egress::serve_socks(
        listener,
        route,
        name.to_owned(),
        stop.clone(),
    ));
    Ok((net, port))
}

/// One HTTP request on the browser's server: `GET /json/version` answered
/// 200 (Chromium's DevTools), or any answer to `GET /` (Firefox's remote
/// agent, which serves only its WebSocket).
async fn probe(endpoint: &CdpEndpoint) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (path, answer): (&str, &[u8]) = if endpoint.speaks_cdp() {
        ("/json/version", b"HTTP/1.1 200")
    } else {
        ("/", b"HTTP/1.1 ")
    };
    let attempt = async {
        let mut stream = endpoint.connect().await.ok()?;
        let request = format!(
            "GET {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
            endpoint.authority()
        );
        stream.write_all(request.as_bytes()).await.ok()?;
        let mut head = [0u8; 16];
        let n = stream.read(&mut head).await.ok()?;
        Some(head[..n].starts_with(answer))
    };
    matches!(
        tokio::time::timeout(Duration::from_secs(2), attempt).await,
        Ok(Some(true))
    )
}

fn describe_exit(status: std::process::ExitStatus, sandboxed: bool) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        // bwrap reports a child killed by signal N as exit code 128 + N.
        (Some(code), _) if sandboxed && code > 128 && code < 128 + 65 => {
            let signal = code - 128;
            format!("killed by signal {signal} ({})", signal_name(signal))
        }
        (Some(code), _) => format!("exited with code {code}"),
        (None, Some(signal)) => format!("killed by signal {signal} ({})", signal_name(signal)),
        _ => "ended".into(),
    }
}

fn signal_name(signal: i32) -> &'static str {
    match signal {
        libc::SIGKILL => "SIGKILL",
        libc::SIGTERM => "SIGTERM",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGABRT => "SIGABRT",
        libc::SIGTRAP => "SIGTRAP",
        libc::SIGBUS => "SIGBUS",
        libc::SIGINT => "SIGINT",
        _ => "signal",
    }
}

/// How long a browser's helpers may take to exit on their own after it.
const HELPER_GRACE: Duration = Duration::from_secs(2);

/// Waits (reaping) until the browser's helpers are gone, at most `limit`.
async fn wait_for_helpers(
    pgid: u32,
    cgroup: Option<&crate::system::cgroups::InstanceCgroup>,
    limit: Duration,
) {
    let Ok(group) = i32::try_from(pgid) else {
        return;
    };
    let deadline = Instant::now() + limit;
    loop {
        // SAFETY: waitpid with a null status pointer and WNOHANG does not block.
        while unsafe { libc::waitpid(-group, std::ptr::null_mut(), libc::WNOHANG) } > 0 {}
        let cgroup_empty = cgroup.is_none_or(|c| c.procs().is_empty());
        if (cgroup_empty && !group_has_live_member(pgid)) || Instant::now() >= deadline {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Kills the browser's processes — its process group and everything in its
/// cgroup — and reaps those reparented to us, until none is left alive (at most
/// `limit`). Only these pids are waited for, so the runtime's own child
/// handling is untouched.
async fn kill_and_reap(
    pgid: u32,
    cgroup: Option<&crate::system::cgroups::InstanceCgroup>,
    limit: Duration,
) {
    let Ok(group) = i32::try_from(pgid) else {
        return;
    };
    let mut members: Vec<u32> = cgroup.map(|c| c.procs()).unwrap_or_default();
    let deadline = Instant::now() + limit;
    loop {
        kill_group(pgid, libc::SIGKILL);
        for pid in &members {
            // SAFETY: kill has no memory-safety preconditions.
            unsafe { libc::kill(*pid as i32, libc::SIGKILL) };
        }
        // SAFETY: waitpid with a null status pointer and WNOHANG does not block.
        while unsafe { libc::waitpid(-group, std::ptr::null_mut(), libc::WNOHANG) } > 0 {}
        members.retain(|pid| still_running(*pid));
        if let Some(cgroup) = cgroup {
            for pid in cgroup.procs() {
                if !members.contains(&pid) {
                    members.push(pid);
                }
            }
        }
        if (members.is_empty() && !group_has_live_member(pgid)) || Instant::now() >= deadline {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Reaps `pid` if it is our exited child; whether it still runs otherwise.
fn still_running(pid: u32) -> bool {
    let Ok(raw) = i32::try_from(pid) else {
        return false;
    };
    // SAFETY: waitpid with a null status pointer and WNOHANG does not block.
    match unsafe { libc::waitpid(raw, std::ptr::null_mut(), libc::WNOHANG) } {
        0 => true,
        n if n > 0 => false,
        // Not our child: alive unless gone or a zombie (its parent reaps it).
        _ => crate::system::monitor::is_live(pid),
    }
}

/// Whether a process of group `pgid` exists that is not a zombie.
fn group_has_live_member(pgid: u32) -> bool {
    let Ok(group) = i32::try_from(pgid) else {
        return false;
    };
    // SAFETY: signal 0 only checks for existence.
    if unsafe { libc::killpg(group, 0) } != 0 {
        return false;
    }
    crate::system::monitor::group_has_live_member(pgid)
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::os::unix::fs::symlink;

    use super::*;

    #[test]
    fn the_download_folder_setting_is_never_written_through_a_link_in_the_home() {
        let outside = tempfile::tempdir().unwrap();
        let passwd = outside.path().join("passwd");
        fs::write(&passwd, "root:x:0:0").unwrap();
        let root = tempfile::tempdir().unwrap();
        let dirs = InstanceDirs::new(root.path().join("instance"));
        dirs.create().unwrap();
        // The browser left its settings file a link to a host file…
        fs::create_dir(dirs.home().join(".config")).unwrap();
        symlink(&passwd, dirs.home().join(".config/user-dirs.dirs")).unwrap();
        dirs.set_default_downloads(Path::new("/instance/downloads"))
            .unwrap();
        assert_eq!(fs::read_to_string(&passwd).unwrap(), "root:x:0:0");
        assert_eq!(
            fs::read_to_string(dirs.home().join(".config/user-dirs.dirs")).unwrap(),
            "XDG_DOWNLOAD_DIR=\"/instance/downloads\"\n"
        );
        // …or its .config a link to a host folder.
        fs::remove_dir_all(dirs.home().join(".config")).unwrap();
        symlink(outside.path(), dirs.home().join(".config")).unwrap();
        dirs.set_default_downloads(Path::new("/instance/downloads"))
            .unwrap();
        assert_eq!(
            fs::read_dir(outside.path()).unwrap().count(),
            1,
            "only passwd"
        );
        assert!(
            fs::symlink_metadata(dirs.home().join(".config"))
                .unwrap()
                .is_dir()
        );
    }
}
