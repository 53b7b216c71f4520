//! `flotilla serve` for tests: in-process ([`TestServe`], [`spawn_serve`] and
//! its variants) or as the real binary in a child process ([`ServeProcess`]).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context as _, bail};
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::{Api, PageServer, init_logging, serve_page};
use flotilla_node_agent::RuntimeKind;
use flotilla_server::{FlotillaConfig, Serve};

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

/// A site serving `html` at `/` on 127.0.0.1 and `serve` (adjusted by
/// `adjust`) whose browsers may open it.
pub async fn spawn_serve_with_page(
    html: &str,
    adjust: impl FnOnce(&mut FlotillaConfig),
) -> (PageServer, TestServe) {
    let site = serve_page(&[("/", html)]).await;
    let serve = spawn_serve_with(|config| {
        adjust(config);
        site.allow_in(config);
    })
    .await;
    (site, serve)
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

pub(super) async fn start_serve_in(
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
    // The sim and real agents report the host's own CPU, memory and disk,
    // which no test controls (CI's disk was at 80 %): resource alerts would
    // come and go at random. The alert unit tests cover the thresholds.
    let monitoring = &mut config.control.monitoring;
    monitoring.cpu_warning_threshold = 100.0;
    monitoring.cpu_critical_threshold = 100.0;
    monitoring.memory_warning_threshold = 100.0;
    monitoring.memory_critical_threshold = 100.0;
    monitoring.disk_warning_threshold = 100.0;
    monitoring.disk_critical_threshold = 100.0;
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

    /// Waits until the local agent's warm pools hold `ready` started
    /// browsers (`what` names the wait in a timeout's message).
    pub async fn wait_for_warm_pool(&self, ready: usize, what: &str) {
        let agent = self.serve().agent.clone();
        crate::wait_until(crate::BROWSER_DEADLINE, what, || async {
            match agent.warm_pool_ready() {
                found if found == ready => Ok(Some(())),
                found => Err(format!("{found} ready")),
            }
        })
        .await
        .unwrap();
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
    /// Starts `<binary> serve --listen 127.0.0.1:0 --proxy-listen 127.0.0.1:0
    /// --data-dir <data_dir>` and waits for its "control plane listening on"
    /// line.
    pub async fn start(
        binary: &Path,
        data_dir: &Path,
        extra_env: &[(&str, &str)],
    ) -> anyhow::Result<Self> {
        let data = data_dir.display().to_string();
        Self::start_command(
            binary,
            &[
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--proxy-listen",
                "127.0.0.1:0",
                "--data-dir",
                &data,
            ],
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
            let log = std::fs::read_to_string(&stderr_log).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(20).collect();
            bail!(
                "flotilla exited before listening; the end of {}:\n{}",
                stderr_log.display(),
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
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
            flotilla_node_agent::agent::sweep::sweep(&self.data_dir.join("agent/instances"));
        }
    }
}
