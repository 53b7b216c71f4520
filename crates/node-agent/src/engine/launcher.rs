//! How the agent starts browsers: their confinement ([`Isolation`]: user,
//! bubblewrap, network namespace and egress policy), the cgroup with the
//! instance's limits, the launch flags, and the warm pool.
//!
//! The warm pools keep browsers of each image they serve
//! (`agent.warm_pool_size` of `agent.warm_pool_image`, and `agent.warm_pools`)
//! started and answering CDP, each in a fresh profile directory of its own. A
//! create for such an image takes one (its cgroup limits are then set to the
//! instance's config, its upstream proxy chained in its egress proxy) and is
//! `running` at once; a background task refills the pools. A pooled browser
//! is never handed out twice.

use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use flotilla_api_types::instances::InstanceConfig;

use crate::config::{AgentConfig, ImageConfig};
use crate::confine::egress::{EgressPolicy, Upstream};
use crate::confine::sandbox::{Isolation, IsolationError, Layer, Unconfined};
use crate::engine::Engines;
use crate::engine::browser::{BrowserProcess, BrowserSetup, CdpEndpoint, LaunchError, LaunchPlan};
use crate::engine::cdp::CdpClient;
use crate::engine::cdp::CdpError;
use crate::engine::page::TabsError;
use crate::system::cgroups::{Cgroups, InstanceCgroup, Limits};
use crate::system::dirs::InstanceDirs;

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
    /// A chromedriver started beside it, so that a WebDriver session does
    /// not wait for one (`None` where chromedriver is not installed).
    pub webdriver: Option<crate::engine::driver::Driver>,
}

/// Why the browser window could not be fitted to the viewport (logged; the
/// browser runs with the window it has).
#[derive(Debug, thiserror::Error)]
enum CalibrationError {
    #[error("{0}")]
    Tabs(#[from] TabsError),
    #[error("no tab to measure")]
    NoTab,
    #[error("{0}")]
    Browser(#[from] CdpError),
    #[error("no session")]
    NoSession,
    #[error("no measurement")]
    NoMeasurement,
}

/// The warm browsers of one image, and how creates for it fared.
struct WarmPool {
    image: String,
    size: usize,
    /// Ready pooled browsers. A std mutex: push and pop only.
    ready: Mutex<VecDeque<WarmBrowser>>,
    /// Pooled browsers being started right now.
    starting: AtomicUsize,
    /// Creates for this image that took a pooled browser, and creates that
    /// launched their own (the pool was empty, or the create needs what a
    /// pooled browser was not started with: extensions, preferences, a
    /// profile's files).
    hits: AtomicU64,
    misses: AtomicU64,
    /// Revives of this image that took a pooled browser, and revives that
    /// launched on their snapshot's files.
    revive_hits: AtomicU64,
    revive_misses: AtomicU64,
}

/// What took (or could not take) a pooled browser, for the pool's counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WarmTaker {
    Create,
    Revive,
}

impl WarmPool {
    fn new(image: String, size: usize) -> Self {
        Self {
            image,
            size,
            ready: Mutex::default(),
            starting: AtomicUsize::new(0),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            revive_hits: AtomicU64::new(0),
            revive_misses: AtomicU64::new(0),
        }
    }

    fn ready(&self) -> usize {
        self.ready.lock().expect("pool lock").len()
    }

    /// Its browsers, all at once (shutdown).
    fn drain(&self) -> Vec<WarmBrowser> {
        self.ready.lock().expect("pool lock").drain(..).collect()
    }
}

/// A small stable hash (FNV-1a, 32 bits) for names derived from paths.
fn fnv1a(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5u32, |hash, byte| {
        (hash ^ u32::from(*byte)).wrapping_mul(0x0100_0193)
    })
}

pub struct Launcher {
    config: AgentConfig,
    /// What starts its browsers, one per engine kind.
    engines: Engines,
    instances_root: PathBuf,
    isolation: Isolation,
    /// The egress rules, when browsers get network namespaces of their own.
    egress: Option<Arc<EgressPolicy>>,
    cgroups: Option<Cgroups>,
    /// One per image with a warm pool (none on the sim runtime).
    pools: Vec<WarmPool>,
    /// Wakes the refill task.
    pool_wanted: Notify,
    /// When an instance last took a pooled browser (the refill waits
    /// `warm_pool_refill_delay_ms` after it).
    last_take: Mutex<Option<std::time::Instant>>,
    /// Per executable: how much larger than the viewport the window must be
    /// (new-headless Chromium lays out an invisible 87 px toolbar; the headless
    /// shell none). Measured on the first browser of each executable.
    window_extra: Mutex<HashMap<PathBuf, (u32, u32)>>,
    /// The warm pools' refills, run by run (shown with the agent's loops).
    pub runs: flotilla_api_types::runs::RunLedger,
}

/// Why instances would run without limits.
#[derive(Debug, thiserror::Error)]
#[error("no writable cgroup hierarchy ({0}): instances run without memory, CPU and pids limits")]
struct LimitsGap(#[source] crate::system::cgroups::CgroupError);

/// The node's instance cgroups, stale ones of a previous run swept; else
/// why instances would run without limits.
fn instance_cgroups(node_id: &str, instances_root: &Path) -> Result<Cgroups, LimitsGap> {
    // Unique per agent: two agents on one machine (tests, or a mistake with
    // node ids) must never sweep each other's browsers.
    let owner = format!(
        "{node_id}-{:08x}",
        fnv1a(instances_root.as_os_str().as_encoded_bytes())
    );
    let cgroups = Cgroups::detect(&owner).map_err(LimitsGap)?;
    let swept = cgroups.sweep();
    if swept > 0 {
        tracing::info!(swept, "removed instance cgroups left by a previous run");
    }
    tracing::info!(version = ?cgroups.version(), "instance limits through cgroups");
    Ok(cgroups)
}

impl Launcher {
    pub fn new(
        config: &AgentConfig,
        engines: Engines,
        node_id: &str,
        instances_root: PathBuf,
        state_dir: &std::path::Path,
    ) -> Result<Self, IsolationError> {
        let real = engines.runs_processes();
        let (mut isolation, cgroups) = if real {
            let wanted = crate::confine::sandbox::Wanted {
                browser_user: &config.browser_user,
                sandbox: config.sandbox,
                own_network: config.egress.enabled,
            };
            let mut isolation = Isolation::detect(&wanted, state_dir)?;
            let cgroups = match instance_cgroups(node_id, &instances_root) {
                Ok(cgroups) => Some(cgroups),
                Err(why) => {
                    isolation.lacks(Layer::Limits, why);
                    None
                }
            };
            (isolation, cgroups)
        } else {
            (Isolation::none(), None)
        };
        if !isolation.gaps.is_empty() && !config.allow_unconfined_browsers {
            return Err(IsolationError::Unconfined(Unconfined {
                gaps: std::mem::take(&mut isolation.gaps),
            }));
        }
        for warning in &isolation.warnings {
            tracing::warn!("{warning}");
        }
        let egress = isolation
            .own_network
            .then(|| Arc::new(EgressPolicy::new(&config.egress)));
        Ok(Self {
            config: config.clone(),
            engines,
            instances_root,
            isolation,
            egress,
            cgroups,
            pools: if real {
                config
                    .warm_pool_sizes()
                    .into_iter()
                    .map(|(image, size)| WarmPool::new(image, size))
                    .collect()
            } else {
                Vec::new()
            },
            pool_wanted: Notify::new(),
            last_take: Mutex::new(None),
            window_extra: Mutex::default(),
            runs: Default::default(),
        })
    }

    /// The engines its browsers run.
    pub fn engines(&self) -> &Engines {
        &self.engines
    }

    /// Why the node runs with less isolation than configured (shown in health).
    pub fn warnings(&self) -> &[String] {
        &self.isolation.warnings
    }

    /// The node's browser confinement.
    pub fn isolation(&self) -> &Isolation {
        &self.isolation
    }

    /// The egress rules browsers run under, when enforced.
    pub fn egress(&self) -> Option<&Arc<EgressPolicy>> {
        self.egress.as_ref()
    }

    pub fn limits_for(&self, config: &InstanceConfig) -> Limits {
        Limits::new(
            config.memory_gb,
            config.cpu_cores as f64 * self.config.cpu_quota_per_core,
            self.config.pids_max,
        )
    }

    /// Starts a browser for `image` in `dirs`, in cgroup `name` with `limits`,
    /// its traffic through `upstream` when given, set up as `setup` asks
    /// (extensions unpacked in `dirs`, preferences).
    pub async fn spawn(
        &self,
        name: &str,
        dirs: &InstanceDirs,
        image: &ImageConfig,
        limits: Limits,
        upstream: Option<Upstream>,
        setup: BrowserSetup<'_>,
    ) -> Result<Launched, LaunchError> {
        let cgroup = match &self.cgroups {
            Some(cgroups) => Some(Arc::new(cgroups.create(name, limits).map_err(|e| {
                LaunchError::Spawn {
                    executable: image.executable.display().to_string(),
                    reason: format!("cannot create the instance's cgroup: {e}"),
                }
            })?)),
            None => None,
        };
        let (extra_width, extra_height) = self
            .window_extra
            .lock()
            .expect("window lock")
            .get(&image.executable)
            .copied()
            .unwrap_or((0, 0));
        let plan = LaunchPlan {
            image,
            dirs,
            window: (
                self.config.viewport_width + extra_width,
                self.config.viewport_height + extra_height,
            ),
            isolation: &self.isolation,
            egress: self.egress.as_ref(),
            upstream,
            setup,
            cgroup: cgroup.as_ref(),
            hostname: name,
        };
        match self.engines.of(image.engine).spawn(&plan).await {
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

    /// Makes the first tab's viewport exactly `viewport_width × viewport_height`:
    /// the first browser of an executable is measured and its window resized;
    /// later ones start with the right window size. Best effort: a failure
    /// leaves the browser as it is.
    pub async fn calibrate_viewport(&self, image: &ImageConfig, endpoint: &CdpEndpoint) {
        // Firefox's headless window is the viewport.
        if !endpoint.speaks_cdp()
            || self
                .window_extra
                .lock()
                .expect("window lock")
                .contains_key(&image.executable)
        {
            return;
        }
        match self.measure_and_fix(endpoint).await {
            Ok(extra) => {
                tracing::info!(executable = %image.executable.display(), ?extra, "window size calibrated to the viewport");
                self.window_extra
                    .lock()
                    .expect("window lock")
                    .insert(image.executable.clone(), extra);
            }
            Err(error) => {
                tracing::warn!(%error, "cannot calibrate the browser window to the viewport")
            }
        }
    }

    async fn measure_and_fix(
        &self,
        endpoint: &CdpEndpoint,
    ) -> Result<(u32, u32), CalibrationError> {
        let timeout = Duration::from_secs(10);
        let tab = crate::engine::page::list_tabs(endpoint)
            .await?
            .into_iter()
            .next()
            .ok_or(CalibrationError::NoTab)?;
        let browser = CdpClient::browser(endpoint).await?;
        let attached = browser
            .call(
                "Target.attachToTarget",
                json!({"targetId": tab.id, "flatten": true}),
                None,
                timeout,
            )
            .await?;
        let session = attached["sessionId"]
            .as_str()
            .ok_or(CalibrationError::NoSession)?
            .to_owned();
        let measured = browser
            .call(
                "Runtime.evaluate",
                json!({"expression": "[outerWidth - innerWidth, outerHeight - innerHeight]", "returnByValue": true}),
                Some(&session),
                timeout,
            )
            .await?;
        let values = measured["result"]["value"]
            .as_array()
            .ok_or(CalibrationError::NoMeasurement)?;
        let extra = |i: usize| {
            values
                .get(i)
                .and_then(|v| v.as_u64())
                .unwrap_or(0)
                .min(1000) as u32
        };
        let (extra_width, extra_height) = (extra(0), extra(1));
        if extra_width > 0 || extra_height > 0 {
            let window = browser
                .call(
                    "Browser.getWindowForTarget",
                    json!({"targetId": tab.id}),
                    None,
                    timeout,
                )
                .await?;
            let bounds = json!({
                "width": self.config.viewport_width + extra_width,
                "height": self.config.viewport_height + extra_height,
            });
            browser
                .call(
                    "Browser.setWindowBounds",
                    json!({"windowId": window["windowId"], "bounds": bounds}),
                    None,
                    timeout,
                )
                .await?;
        }
        let _ = browser
            .call(
                "Target.detachFromTarget",
                json!({"sessionId": session}),
                None,
                timeout,
            )
            .await;
        Ok((extra_width, extra_height))
    }

    /// Takes a pooled browser for `image`, set to `limits` and routed through
    /// `upstream`; `None` if the pool has none (or serves another image, or
    /// its browsers cannot take an upstream proxy).
    pub fn take_warm(
        &self,
        image: &str,
        limits: Limits,
        upstream: Option<Upstream>,
    ) -> Option<WarmBrowser> {
        if upstream.is_some() && self.egress.is_none() {
            // Pooled browsers of a node without egress have no proxy to route through.
            return None;
        }
        let pool = self.pools.iter().find(|pool| pool.image == image)?;
        let taken = loop {
            let candidate = pool.ready.lock().expect("pool lock").pop_front()?;
            if candidate.launched.process.exit_status().is_none() {
                break candidate;
            }
        };
        *self.last_take.lock().expect("take lock") = Some(std::time::Instant::now());
        self.pool_wanted.notify_one();
        if let Some(cgroup) = &taken.launched.cgroup
            && let Err(error) = cgroup.apply(limits)
        {
            tracing::warn!(%error, "cannot set the limits of a pooled browser; starting a fresh one instead");
            return None;
        }
        if !taken.launched.process.set_upstream(upstream) {
            return None;
        }
        Some(taken)
    }

    /// Keeps the pools filled until `shutdown`; then stops the pooled
    /// browsers.
    pub async fn keep_pool_filled(self: Arc<Self>, shutdown: CancellationToken) {
        let catalog = self.config.image_catalog();
        let pools: Vec<(usize, ImageConfig)> = self
            .pools
            .iter()
            .enumerate()
            .filter_map(|(index, pool)| match catalog.get(&pool.image) {
                Some(image) => Some((index, image.clone())),
                None => {
                    tracing::warn!(
                        image = pool.image,
                        "a warm pool's image is not in the catalog; no warm pool for it"
                    );
                    None
                }
            })
            .collect();
        if pools.is_empty() {
            return;
        }
        'refill: loop {
            for (index, image) in &pools {
                let pool = &self.pools[*index];
                if pool.ready() + pool.starting.load(Ordering::SeqCst) >= pool.size {
                    continue;
                }
                // The client that just took one gets the CPU for its first page.
                let quiet_at =
                    self.last_take.lock().expect("take lock").map(|at| {
                        at + Duration::from_millis(self.config.warm_pool_refill_delay_ms)
                    });
                if let Some(quiet_at) = quiet_at
                    && quiet_at > std::time::Instant::now()
                {
                    tokio::select! {
                        () = tokio::time::sleep_until(quiet_at.into()) => {}
                        () = shutdown.cancelled() => break 'refill,
                    }
                    continue 'refill;
                }
                pool.starting.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(self.clone().start_pooled(*index, image.clone()));
                continue 'refill;
            }
            tokio::select! {
                _ = self.pool_wanted.notified() => {}
                // Also notice pooled browsers that died on their own.
                _ = tokio::time::sleep(Duration::from_secs(2)) => {
                    for pool in &self.pools {
                        pool.ready.lock().expect("pool lock").retain(|warm| warm.launched.process.exit_status().is_none());
                    }
                }
                _ = shutdown.cancelled() => break,
            }
        }
        for warm in self.pools.iter().flat_map(WarmPool::drain) {
            warm.launched
                .process
                .stop(None, false, Duration::ZERO)
                .await;
            let _ = std::fs::remove_dir_all(&warm.dirs.root);
        }
    }

    async fn start_pooled(self: Arc<Self>, index: usize, image: ImageConfig) {
        let pool = &self.pools[index];
        let name = format!("pool-{}", uuid::Uuid::now_v7());
        let dirs = InstanceDirs::new(self.instances_root.join(&name));
        // On idle CPU only until an instance takes it (`take_warm` applies
        // the instance's limits): a refill never slows a running instance.
        let limits = self.limits_for(&InstanceConfig::default()).in_background();
        let outcome = match self
            .spawn(&name, &dirs, &image, limits, None, BrowserSetup::default())
            .await
        {
            Ok(launched) => match launched
                .process
                .wait_ready(Duration::from_secs(self.config.launch_timeout_sec))
                .await
            {
                Ok(Some(endpoint)) => {
                    self.calibrate_viewport(&image, &endpoint).await;
                    self.engines.of(image.engine).warm_up(&endpoint).await;
                    let webdriver = self.webdriver_beside(&dirs, &launched, &endpoint).await;
                    Ok(WarmBrowser {
                        dirs: dirs.clone(),
                        launched,
                        endpoint,
                        webdriver,
                    })
                }
                Ok(None) => Err("sim browser in the pool".to_owned()),
                Err(error) => {
                    launched.process.stop(None, false, Duration::ZERO).await;
                    Err(error.to_string())
                }
            },
            Err(error) => Err(error.to_string()),
        };
        self.runs
            .record_result("warm pool refill", &outcome.as_ref().map(|_| 1));
        match outcome {
            Ok(warm) => pool.ready.lock().expect("pool lock").push_back(warm),
            Err(error) => {
                tracing::warn!(%error, "a warm-pool browser did not start; retrying in 5 s");
                let _ = std::fs::remove_dir_all(&dirs.root);
                tokio::time::sleep(Duration::from_secs(5)).await;
            }
        }
        pool.starting.fetch_sub(1, Ordering::SeqCst);
        self.pool_wanted.notify_one();
    }

    /// A chromedriver beside a pooled browser, when chromedriver is
    /// installed; a failure only costs the session the start it would save.
    async fn webdriver_beside(
        &self,
        dirs: &InstanceDirs,
        launched: &Launched,
        endpoint: &CdpEndpoint,
    ) -> Option<crate::engine::driver::Driver> {
        if !self.config.warm_pool_chromedriver
            || !endpoint.speaks_cdp()
            || !crate::engine::driver::installed(crate::config::EngineKind::Chromium)
        {
            return None;
        }
        let beside = crate::engine::driver::Beside {
            isolation: self.isolation(),
            dirs,
            cgroup: launched.cgroup.as_ref(),
            group: launched.process.pid()?,
        };
        match crate::engine::driver::start_driver(&beside, endpoint).await {
            Ok(driver) => Some(driver),
            Err(error) => {
                tracing::warn!(%error, "no chromedriver beside a warm-pool browser");
                None
            }
        }
    }

    /// Kills pooled browsers at once (for `Drop` paths).
    pub fn kill_pool(&self) {
        for warm in self.pools.iter().flat_map(WarmPool::drain) {
            if let Some(pid) = warm.launched.process.pid() {
                crate::system::process::kill_group(pid, libc::SIGKILL);
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

    /// Pooled browsers ready now, in every pool.
    pub fn pool_ready(&self) -> usize {
        self.pools.iter().map(WarmPool::ready).sum()
    }

    /// Counts a create (or a revive) for `image` as a hit (it took a pooled
    /// browser) or a miss, when that image has a pool.
    pub fn count_take(&self, image: &str, taker: WarmTaker, hit: bool) {
        let Some(pool) = self.pools.iter().find(|pool| pool.image == image) else {
            return;
        };
        let counter = match (taker, hit) {
            (WarmTaker::Create, true) => &pool.hits,
            (WarmTaker::Create, false) => &pool.misses,
            (WarmTaker::Revive, true) => &pool.revive_hits,
            (WarmTaker::Revive, false) => &pool.revive_misses,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// The pools for the node's report (none on the sim runtime).
    pub fn pool_reports(&self) -> Vec<flotilla_api_types::agent::WarmPoolReport> {
        self.pools
            .iter()
            .map(|pool| flotilla_api_types::agent::WarmPoolReport {
                image: pool.image.clone(),
                ready: pool.ready() as u64,
                hits: pool.hits.load(Ordering::Relaxed),
                misses: pool.misses.load(Ordering::Relaxed),
                revive_hits: pool.revive_hits.load(Ordering::Relaxed),
                revive_misses: pool.revive_misses.load(Ordering::Relaxed),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::RuntimeKind;

    fn launcher(config: &AgentConfig, data: &Path) -> Result<Launcher, IsolationError> {
        let engines = crate::engine::for_runtime(RuntimeKind::Chromium, Duration::ZERO);
        // As the agent is given them: its own folder in the data directory
        // (whose parent, here /tmp, is never changed).
        let state = data.join("agent");
        Launcher::new(
            config,
            engines,
            "unconfined-test",
            state.join("instances"),
            &state,
        )
    }

    /// A node that cannot give browsers one of the three layers (here the
    /// sandbox, turned off) starts none and says which layer and how to
    /// provide it; the setting whose name says so lets it run them, degraded.
    #[test]
    fn a_node_that_cannot_confine_browsers_refuses_them_unless_told_to_run_them_unconfined() {
        let data = tempfile::tempdir().expect("temp dir");
        let mut config = AgentConfig {
            sandbox: false,
            ..AgentConfig::default()
        };
        let refused = launcher(&config, data.path()).err().expect("refused");
        let IsolationError::Unconfined(unconfined) = &refused else {
            panic!("refused for another reason: {refused}");
        };
        assert!(
            unconfined
                .gaps
                .iter()
                .any(|gap| gap.layer == Layer::Filesystem),
            "{refused}"
        );
        let message = refused.to_string();
        for words in [
            "no filesystem sandbox: agent.sandbox is off",
            "to provide it: install bubblewrap",
            "agent.allow_unconfined_browsers = true",
            "FLOTILLA_AGENT__ALLOW_UNCONFINED_BROWSERS=true",
        ] {
            assert!(message.contains(words), "{words:?} missing from: {message}");
        }

        config.allow_unconfined_browsers = true;
        let allowed = launcher(&config, data.path()).expect("allowed unconfined");
        assert!(!allowed.isolation().filesystem_isolated());
        assert!(
            allowed
                .warnings()
                .iter()
                .any(|warning| warning.starts_with("agent.sandbox is off")),
            "{:?}",
            allowed.warnings()
        );
        allowed.release_cgroups();
    }
}
