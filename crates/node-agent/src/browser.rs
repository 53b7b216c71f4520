//! One browser process tree: launch, readiness, exit watching and stopping.
//!
//! A browser runs in its own process group (its pid is the group id), with its own
//! profile (`--user-data-dir`), `HOME` and log file under the instance directory.
//! Readiness is Chromium's `DevToolsActivePort` file (written once the DevTools
//! server listens) followed by one `GET /json/version`. A reaper task owns the
//! child: it records the exit and then kills what is left of the group, so no
//! helper outlives its browser. The sim runtime has the same shape without a process.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::process::Command;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::cdp::CdpClient;
use crate::config::{BASE_CHROMIUM_FLAGS, ImageConfig};

/// Where a running browser's DevTools server listens (always 127.0.0.1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CdpEndpoint {
    pub port: u16,
    /// Path of the browser target, `/devtools/browser/<uuid>`.
    pub browser_path: String,
}

impl CdpEndpoint {
    pub fn browser_ws_url(&self) -> String {
        format!("ws://127.0.0.1:{}{}", self.port, self.browser_path)
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

/// The paths of one instance on the node.
#[derive(Debug, Clone)]
pub struct InstanceDirs {
    pub root: PathBuf,
}

impl InstanceDirs {
    pub fn new(root: PathBuf) -> Self {
        Self { root }
    }

    pub fn profile(&self) -> PathBuf {
        self.root.join("profile")
    }

    pub fn home(&self) -> PathBuf {
        self.root.join("home")
    }

    pub fn log(&self) -> PathBuf {
        self.root.join("browser.log")
    }

    pub fn create(&self) -> std::io::Result<()> {
        std::fs::create_dir_all(self.profile())?;
        std::fs::create_dir_all(self.home())?;
        Ok(())
    }
}

/// How to start one browser.
pub struct LaunchPlan<'a> {
    pub image: &'a ImageConfig,
    pub dirs: &'a InstanceDirs,
    pub extra_args: &'a [String],
    /// Namespaces through bubblewrap, when available.
    pub sandbox: Option<&'a Sandbox>,
    /// The cgroup the browser joins before it runs.
    pub cgroup: Option<&'a std::sync::Arc<crate::cgroups::InstanceCgroup>>,
    /// Host name inside the sandbox's UTS namespace.
    pub hostname: &'a str,
}

/// The bubblewrap sandbox: own pid, ipc and uts namespaces, a private `/tmp`,
/// and a mount namespace in which the agent's data (other instances' profiles,
/// the store) is hidden behind empty tmpfs mounts except the instance's own
/// directory.
#[derive(Debug, Clone)]
pub struct Sandbox {
    pub bwrap: PathBuf,
    pub hidden: Vec<PathBuf>,
}

impl Sandbox {
    /// `bwrap` from `PATH`, if installed.
    pub fn detect(hidden: Vec<PathBuf>) -> Option<Self> {
        let path = std::env::var_os("PATH")?;
        std::env::split_paths(&path)
            .map(|dir| dir.join("bwrap"))
            .find(|candidate| candidate.is_file())
            .map(|bwrap| Self { bwrap, hidden })
    }
}

/// A started browser (real or simulated).
pub struct BrowserProcess {
    pid: Option<u32>,
    dirs: InstanceDirs,
    /// Set once, by the reaper, to a description of how the process ended.
    exit: watch::Receiver<Option<String>>,
    /// For the sim runtime: dropping or sending ends the "process".
    sim_stop: Option<watch::Sender<Option<String>>>,
    sim_start: Duration,
}

impl BrowserProcess {
    /// Starts Chromium as `plan` says: its image, profile, sandbox and cgroup.
    pub fn spawn_chromium(plan: &LaunchPlan<'_>) -> Result<Self, LaunchError> {
        let image = plan.image;
        let dirs = plan.dirs;
        let spawn_error = |reason: String| LaunchError::Spawn {
            executable: image.executable.display().to_string(),
            reason,
        };
        // Checked here so that the reason is the same with and without the sandbox.
        match std::fs::metadata(&image.executable) {
            Ok(meta) if meta.is_file() => {}
            Ok(_) => return Err(spawn_error("not a file".into())),
            Err(error) => return Err(spawn_error(error.to_string())),
        }
        dirs.create()
            .map_err(|e| spawn_error(format!("cannot create instance directory: {e}")))?;
        let log = std::fs::File::create(dirs.log())
            .map_err(|e| spawn_error(format!("cannot create log file: {e}")))?;
        let mut command = match plan.sandbox {
            Some(sandbox) => {
                let mut command = Command::new(&sandbox.bwrap);
                command
                    .args([
                        "--unshare-pid",
                        "--unshare-ipc",
                        "--unshare-uts",
                        "--hostname",
                    ])
                    .arg(plan.hostname)
                    .args([
                        "--dev-bind",
                        "/",
                        "/",
                        "--proc",
                        "/proc",
                        "--tmpfs",
                        "/tmp",
                        "--tmpfs",
                        "/dev/shm",
                    ]);
                for hidden in &sandbox.hidden {
                    command.arg("--tmpfs").arg(hidden);
                }
                command
                    .arg("--bind")
                    .arg(&dirs.root)
                    .arg(&dirs.root)
                    .arg("--")
                    .arg(&image.executable);
                command
            }
            None => Command::new(&image.executable),
        };
        command
            .args(BASE_CHROMIUM_FLAGS)
            .args(&image.args)
            .args(plan.extra_args)
            .arg(format!("--user-data-dir={}", dirs.profile().display()))
            .arg("--remote-debugging-port=0")
            .arg("about:blank")
            .env("HOME", dirs.home())
            .env("XDG_CONFIG_HOME", dirs.home().join(".config"))
            .env("XDG_CACHE_HOME", dirs.home().join(".cache"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .process_group(0)
            .kill_on_drop(false);
        if is_root() {
            // Chromium's own sandbox needs a non-root user; as root the
            // namespaces of the node's sandbox are the isolation.
            command.arg("--no-sandbox");
        }
        if let Some(cgroup) = plan.cgroup {
            let attach = cgroup.attach_hook();
            // SAFETY: the hook makes only async-signal-safe calls (see attach_hook).
            unsafe {
                command.pre_exec(attach);
            }
        }
        let sandboxed = plan.sandbox.is_some();
        let mut child = command.spawn().map_err(|e| spawn_error(e.to_string()))?;
        let pid = child
            .id()
            .ok_or_else(|| spawn_error("process vanished at once".into()))?;
        let (exit_tx, exit_rx) = watch::channel(None);
        let cgroup = plan.cgroup.cloned();
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
            let _ = exit_tx.send(Some(description));
        });
        Ok(Self {
            pid: Some(pid),
            dirs: dirs.clone(),
            exit: exit_rx,
            sim_stop: None,
            sim_start: Duration::ZERO,
        })
    }

    /// A simulated browser: no process, ready after `start`.
    pub fn spawn_sim(dirs: &InstanceDirs, start: Duration) -> Self {
        let (tx, rx) = watch::channel(None);
        Self {
            pid: None,
            dirs: dirs.clone(),
            exit: rx,
            sim_stop: Some(tx),
            sim_start: start,
        }
    }

    pub fn pid(&self) -> Option<u32> {
        self.pid
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
        let port_file = self.dirs.profile().join("DevToolsActivePort");
        let mut exit = self.exit.clone();
        loop {
            if let Some(exit) = self.exit_status() {
                return Err(LaunchError::ExitedEarly {
                    exit,
                    log: log_tail(&self.dirs.log()),
                });
            }
            if let Some(endpoint) = read_port_file(&port_file)
                && probe_version(endpoint.port).await
            {
                return Ok(Some(endpoint));
            }
            if Instant::now() >= deadline {
                return Err(LaunchError::Timeout(timeout));
            }
            // Poll the file every 2 ms (a stat), waking early if the process exits.
            let _ = tokio::time::timeout(Duration::from_millis(2), exit.changed()).await;
        }
    }

    /// Stops the browser. Graceful: CDP `Browser.close` (the only way that flushes
    /// cookies to disk), then SIGTERM, then SIGKILL of the group, each after a
    /// wait. Not graceful: SIGKILL at once. Returns when the process is gone.
    pub async fn stop(&self, endpoint: Option<&CdpEndpoint>, graceful: bool, grace: Duration) {
        if let Some(stop) = &self.sim_stop {
            let _ = stop.send(Some("stopped".into()));
            return;
        }
        let Some(pid) = self.pid else { return };
        if self.exit_status().is_some() {
            return;
        }
        if graceful {
            if let Some(endpoint) = endpoint {
                let url = endpoint.browser_ws_url();
                if let Ok(Ok(client)) =
                    tokio::time::timeout(Duration::from_secs(2), CdpClient::connect(&url)).await
                {
                    let _ = client.send("Browser.close", serde_json::json!({})).await;
                    if self.wait_exit_for(grace).await {
                        return;
                    }
                }
            }
            kill_group(pid, libc::SIGTERM);
            if self.wait_exit_for(Duration::from_secs(2)).await {
                return;
            }
            tracing::warn!(pid, "browser ignored Browser.close and SIGTERM; killing it");
        }
        kill_group(pid, libc::SIGKILL);
        self.wait_exit().await;
    }

    async fn wait_exit_for(&self, limit: Duration) -> bool {
        tokio::time::timeout(limit, self.wait_exit()).await.is_ok()
    }
}

impl Drop for BrowserProcess {
    fn drop(&mut self) {
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
    Some(CdpEndpoint { port, browser_path })
}

/// One `GET /json/version` on the browser's DevTools port.
async fn probe_version(port: u16) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let attempt = async {
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .ok()?;
        let request = format!(
            "GET /json/version HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n"
        );
        stream.write_all(request.as_bytes()).await.ok()?;
        let mut head = [0u8; 16];
        let n = stream.read(&mut head).await.ok()?;
        Some(head[..n].starts_with(b"HTTP/1.1 200"))
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

/// The last meaningful lines of a browser log, for failure reasons.
pub fn log_tail(path: &Path) -> String {
    let Ok(text) = std::fs::read_to_string(path) else {
        return String::new();
    };
    let lines: Vec<&str> = text
        .lines()
        .filter(|line| !line.contains("dbus/") && !line.trim().is_empty())
        .collect();
    let tail = &lines[lines.len().saturating_sub(3)..];
    if tail.is_empty() {
        String::new()
    } else {
        format!(": {}", tail.join(" | "))
    }
}

pub(crate) fn kill_group(pgid: u32, signal: i32) {
    if let Ok(pgid) = i32::try_from(pgid)
        && pgid > 1
    {
        // SAFETY: killpg has no memory-safety preconditions; a stale group
        // only yields ESRCH, which we ignore.
        unsafe {
            libc::killpg(pgid, signal);
        }
    }
}

/// Makes this process the reaper of its orphaned descendants, so that a dead
/// browser's helpers are reaped here at once (instead of lingering as zombies
/// until PID 1 gets to them). Idempotent.
pub fn become_subreaper() {
    // SAFETY: prctl with PR_SET_CHILD_SUBREAPER takes plain integers.
    let result = unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    if result != 0 {
        tracing::warn!(error = %std::io::Error::last_os_error(), "cannot become a child subreaper; browser helpers are reaped by PID 1");
    }
}

/// How long a browser's helpers may take to exit on their own after it.
const HELPER_GRACE: Duration = Duration::from_secs(2);

/// Waits (reaping) until the browser's helpers are gone, at most `limit`.
async fn wait_for_helpers(
    pgid: u32,
    cgroup: Option<&crate::cgroups::InstanceCgroup>,
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
    cgroup: Option<&crate::cgroups::InstanceCgroup>,
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
        _ => std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|stat| {
                stat.rfind(')')
                    .map(|i| stat[i + 2..].starts_with(|c| c != 'Z' && c != 'X'))
            })
            .unwrap_or(false),
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
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return false;
    };
    entries.flatten().any(|entry| {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            return false;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            return false;
        };
        let Some(rest) = stat.rfind(')').map(|i| &stat[i + 2..]) else {
            return false;
        };
        let mut fields = rest.split_whitespace();
        let state = fields.next().unwrap_or("Z");
        let member_group = fields.nth(1).and_then(|g| g.parse::<u32>().ok());
        member_group == Some(pgid) && state != "Z" && state != "X"
    })
}

pub(crate) fn is_root() -> bool {
    // SAFETY: geteuid cannot fail and touches no memory.
    unsafe { libc::geteuid() == 0 }
}
