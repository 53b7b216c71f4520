//! How the agent starts browsers: the sandbox (bubblewrap), the cgroup with the
//! instance's limits, the launch flags, and the warm pool.
//!
//! The warm pool keeps `agent.warm_pool_size` browsers of `agent.warm_pool_image`
//! started and answering CDP, each in a fresh profile directory of its own. A
//! create for that image takes one (its cgroup limits are then set to the
//! instance's config) and is `running` at once; a background task refills the
//! pool. A pooled browser is never handed out twice.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use flotilla_api_types::instances::InstanceConfig;

use crate::browser::{BrowserProcess, CdpEndpoint, InstanceDirs, LaunchError, LaunchPlan, Sandbox};
use crate::cgroups::{Cgroups, InstanceCgroup, Limits};
use crate::config::{AgentConfig, ImageConfig, RuntimeKind};

/// A started browser and the cgroup it runs in.
#[derive(Clone)]
pub struct Launched {
    pub process: Arc<BrowserProcess>,
    pub cgroup: Option<Arc<InstanceCgroup>>,
}

/// A pooled browser, ready to be taken.
pub struct WarmBrowser {
    pub dirs: InstanceDirs,
    pub launched: Launched,
    pub endpoint: CdpEndpoint,
}

/// A small stable hash (FNV-1a, 32 bits) for names derived from paths.
fn fnv1a(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5u32, |hash, byte| {
        (hash ^ u32::from(*byte)).wrapping_mul(0x0100_0193)
    })
}

pub struct Launcher {
    config: AgentConfig,
    instances_root: PathBuf,
    sandbox: Option<Sandbox>,
    cgroups: Option<Cgroups>,
    /// Why the node runs with less isolation than configured (shown in health).
    warnings: Vec<String>,
    /// Ready pooled browsers. A std mutex: push and pop only.
    pool: Mutex<VecDeque<WarmBrowser>>,
    /// Pooled browsers being started right now.
    pool_starting: AtomicUsize,
    /// Wakes the refill task.
    pool_wanted: Notify,
}

impl Launcher {
    pub fn new(
        config: &AgentConfig,
        node_id: &str,
        instances_root: PathBuf,
        hidden: Vec<PathBuf>,
    ) -> Self {
        let mut warnings = Vec::new();
        let real = config.runtime == RuntimeKind::Chromium;
        let sandbox = if real && config.sandbox {
            let found = Sandbox::detect(hidden);
            if found.is_none() {
                warnings.push("bubblewrap (bwrap) is not installed: browsers run without their own pid, ipc, uts and mount namespaces".to_owned());
            }
            found
        } else {
            None
        };
        let cgroups = if real {
            // Unique per agent: two agents on one machine (tests, or a mistake
            // with node ids) must never sweep each other's browsers.
            let owner = format!(
                "{node_id}-{:08x}",
                fnv1a(instances_root.as_os_str().as_encoded_bytes())
            );
            match Cgroups::detect(&owner) {
                Ok(cgroups) => {
                    let swept = cgroups.sweep();
                    if swept > 0 {
                        tracing::info!(swept, "removed instance cgroups left by a previous run");
                    }
                    tracing::info!(version = ?cgroups.version(), "instance limits through cgroups");
                    Some(cgroups)
                }
                Err(reason) => {
                    let warning = format!(
                        "no writable cgroup hierarchy ({reason}): instances run without memory, CPU and pids limits"
                    );
                    tracing::warn!("{warning}");
                    warnings.push(warning);
                    None
                }
            }
        } else {
            None
        };
        Self {
            config: config.clone(),
            instances_root,
            sandbox,
            cgroups,
            warnings,
            pool: Mutex::default(),
            pool_starting: AtomicUsize::new(0),
            pool_wanted: Notify::new(),
        }
    }

    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    pub fn limits_for(&self, config: &InstanceConfig) -> Limits {
        Limits::new(
            config.memory_gb,
            config.cpu_cores as f64 * self.config.cpu_quota_per_core,
            self.config.pids_max,
        )
    }

    /// Starts a browser for `image` in `dirs`, in cgroup `name` with `limits`.
    pub fn spawn(
        &self,
        name: &str,
        dirs: &InstanceDirs,
        image: &ImageConfig,
        limits: Limits,
    ) -> Result<Launched, LaunchError> {
        if self.config.runtime == RuntimeKind::Sim {
            let start = Duration::from_millis(self.config.sim_start_ms);
            return Ok(Launched {
                process: Arc::new(BrowserProcess::spawn_sim(dirs, start)),
                cgroup: None,
            });
        }
        let cgroup = match &self.cgroups {
            Some(cgroups) => Some(Arc::new(cgroups.create(name, limits).map_err(|e| {
                LaunchError::Spawn {
                    executable: image.executable.display().to_string(),
                    reason: format!("cannot create the instance's cgroup: {e}"),
                }
            })?)),
            None => None,
        };
        let extra_args = vec![format!(
            "--window-size={},{}",
            self.config.viewport_width, self.config.viewport_height
        )];
        let plan = LaunchPlan {
            image,
            dirs,
            extra_args: &extra_args,
            sandbox: self.sandbox.as_ref(),
            cgroup: cgroup.as_ref(),
            hostname: name,
        };
        match BrowserProcess::spawn_chromium(&plan) {
            Ok(process) => Ok(Launched {
                process: Arc::new(process),
                cgroup,
            }),
            Err(error) => {
                if let Some(cgroup) = cgroup {
                    cgroup.remove();
                }
                Err(error)
            }
        }
    }

    /// Takes a pooled browser for `image`, set to `limits`; `None` if the pool
    /// has none (or serves another image).
    pub fn take_warm(&self, image: &str, limits: Limits) -> Option<WarmBrowser> {
        if image != self.config.warm_pool_image || self.config.warm_pool_size == 0 {
            return None;
        }
        let taken = loop {
            let candidate = self.pool.lock().expect("pool lock").pop_front()?;
            if candidate.launched.process.exit_status().is_none() {
                break candidate;
            }
        };
        self.pool_wanted.notify_one();
        if let Some(cgroup) = &taken.launched.cgroup
            && let Err(error) = cgroup.apply(limits)
        {
            tracing::warn!(%error, "cannot set the limits of a pooled browser; starting a fresh one instead");
            return None;
        }
        Some(taken)
    }

    /// Keeps the pool filled until `shutdown`; then stops the pooled browsers.
    pub async fn keep_pool_filled(self: Arc<Self>, shutdown: CancellationToken) {
        if self.config.warm_pool_size == 0 || self.config.runtime == RuntimeKind::Sim {
            return;
        }
        let Some(image) = self
            .config
            .image_catalog()
            .get(&self.config.warm_pool_image)
            .cloned()
        else {
            tracing::warn!(
                image = self.config.warm_pool_image,
                "agent.warm_pool_image is not in the catalog; no warm pool"
            );
            return;
        };
        loop {
            let ready = self.pool.lock().expect("pool lock").len();
            let starting = self.pool_starting.load(Ordering::SeqCst);
            if ready + starting < self.config.warm_pool_size {
                self.pool_starting.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(self.clone().start_pooled(image.clone()));
                continue;
            }
            tokio::select! {
                _ = self.pool_wanted.notified() => {}
                // Also notice pooled browsers that died on their own.
                _ = tokio::time::sleep(Duration::from_secs(2)) => {
                    self.pool.lock().expect("pool lock").retain(|warm| warm.launched.process.exit_status().is_none());
                }
                _ = shutdown.cancelled() => break,
            }
        }
        let drained: Vec<WarmBrowser> = self.pool.lock().expect("pool lock").drain(..).collect();
        for warm in drained {
            warm.launched
                .process
                .stop(None, false, Duration::ZERO)
                .await;
            let _ = std::fs::remove_dir_all(&warm.dirs.root);
        }
    }

    async fn start_pooled(self: Arc<Self>, image: ImageConfig) {
        let name = format!("pool-{}", uuid::Uuid::now_v7());
        let dirs = InstanceDirs::new(self.instances_root.join(&name));
        let limits = self.limits_for(&InstanceConfig::default());
        let outcome = match self.spawn(&name, &dirs, &image, limits) {
            Ok(launched) => match launched
                .process
                .wait_ready(Duration::from_secs(self.config.launch_timeout_sec))
                .await
            {
                Ok(Some(endpoint)) => Ok(WarmBrowser {
                    dirs: dirs.clone(),
                    launched,
                    endpoint,
                }),
                Ok(None) => Err("sim browser in the pool".to_owned()),
                Err(error) => {
                    launched.process.stop(None, false, Duration::ZERO).await;
                    Err(error.to_string())
                }
            },
            Err(error) => Err(error.to_string()),
        };
        match outcome {
            Ok(warm) => self.pool.lock().expect("pool lock").push_back(warm),
            Err(error) => {
                tracing::warn!(%error, "a warm-pool browser did not start; retrying in 5 s");
                let _ = std::fs::remove_dir_all(&dirs.root);
                tokio::time::sleep(Duration::from_secs(5)).await;
            }
        }
        self.pool_starting.fetch_sub(1, Ordering::SeqCst);
        self.pool_wanted.notify_one();
    }

    /// Kills pooled browsers at once (for `Drop` paths).
    pub fn kill_pool(&self) {
        for warm in self.pool.lock().expect("pool lock").drain(..) {
            if let Some(pid) = warm.launched.process.pid() {
                crate::browser::kill_group(pid, libc::SIGKILL);
            }
            let _ = std::fs::remove_dir_all(&warm.dirs.root);
        }
    }

    /// Removes the agent's cgroup subtree (once its instances are gone).
    pub fn release_cgroups(&self) {
        if let Some(cgroups) = &self.cgroups {
            cgroups.remove_base();
        }
    }

    /// Pooled browsers ready now.
    pub fn pool_ready(&self) -> usize {
        self.pool.lock().expect("pool lock").len()
    }
}
