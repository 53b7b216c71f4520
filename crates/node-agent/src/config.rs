//! The `[agent]` configuration section: capacity, ports, the image catalog and
//! launch timings. Loaded by the CLI (file, environment, flags); every key is in
//! `docs/configuration.md`.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use flotilla_api_types::instances::{DEFAULT_IMAGE, ReviveMethod};

/// The largest message a client may send on any door (CDP, BiDi,
/// Playwright): Playwright's `setInputFiles` sends up to 50 MB of file
/// (67 MB in base64) as one message.
pub const MAX_CLIENT_MESSAGE: usize = 100 << 20;

/// The node's default budget for client messages held whole
/// (`agent.messages_in_flight_mb`).
pub const DEFAULT_MESSAGES_IN_FLIGHT: usize = 256 << 20;

/// Flags every image gets: headless, no network traffic of the browser's own
/// (what Playwright and Puppeteer turn off, and what was still seen going
/// out), and Puppeteer's default set (measured here: a ready page ~65 ms
/// sooner).
pub const BASE_CHROMIUM_FLAGS: &[&str] = &[
    "--headless",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-background-timer-throttling",
    "--disable-backgrounding-occluded-windows",
    "--disable-renderer-backgrounding",
    "--disable-dev-shm-usage",
    "--disable-ipc-flooding-protection",
    "--disable-hang-monitor",
    "--disable-breakpad",
    "--disable-crash-reporter",
    "--disable-default-apps",
    "--disable-popup-blocking",
    "--disable-prompt-on-repost",
    "--disable-client-side-phishing-detection",
    "--disable-domain-reliability",
    "--disable-field-trial-config",
    "--no-service-autorun",
    "--disable-search-engine-choice-screen",
    "--disable-features=Translate,OptimizationHints,MediaRouter,DialMediaRouteProvider,AcceptCHFrame,CalculateNativeWinOcclusion,InterestFeedContentSuggestions,CertificateTransparencyComponentUpdater,AutofillServerCommunication,PrivacySandboxSettings4,NetworkTimeServiceQuerying,AimEnabled,PreconnectToSearch,WebUIOmniboxPopup,WebUIOmniboxAimPopup",
    // (`WebUIOmniboxPopup` and `WebUIOmniboxAimPopup`, together: no
    // renderer kept for the omnibox popup's WebUI, which a headless browser
    // never shows; 57 MiB PSS less per idle Chromium, `bench/RESULTS.md`.)
    // What the flags above leave going out at every start (seen through an
    // upstream proxy, Chromium 156): an on-demand component (the
    // optimization guide's model manifest) asked of update.googleapis.com,
    // and accounts.google.com. Their servers point at a closed port on the
    // browser's own loopback; pages browse Google's sites as any other.
    "--component-updater=url-source=http://127.0.0.1:9/",
    "--gaia-url=http://127.0.0.1:9/",
    "--enable-features=NetworkServiceInProcess2",
    "--password-store=basic",
    "--use-mock-keychain",
    "--metrics-recording-only",
    "--force-color-profile=srgb",
    "--export-tagged-pdf",
    "--hide-scrollbars",
    "--mute-audio",
    // No "unsupported command-line flag" infobar over the first tab (it would
    // shrink that tab's viewport by 56 px).
    "--test-type",
];

/// Which runtime the agent uses for instances.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RuntimeKind {
    /// Real Chromium processes.
    #[default]
    Chromium,
    /// No browser: instances become running after `sim_start_ms`. For control
    /// plane logic tests and placement benchmarks only.
    Sim,
}

/// An inclusive range of TCP ports, written `"20000-40000"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortRange {
    pub first: u16,
    pub last: u16,
}

impl PortRange {
    pub fn len(&self) -> usize {
        usize::from(self.last - self.first) + 1
    }

    pub fn is_empty(&self) -> bool {
        false
    }
}

impl fmt::Display for PortRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.first, self.last)
    }
}

/// A port range that is not `<first>-<last>` with `1 <= first <= last`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("port range {text:?} must look like \"20000-40000\" (first <= last, both 1..=65535)")]
pub struct InvalidPortRange {
    pub text: String,
}

impl FromStr for PortRange {
    type Err = InvalidPortRange;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || InvalidPortRange { text: s.to_owned() };
        let (first, last) = s.split_once('-').ok_or_else(bad)?;
        let first: u16 = first.trim().parse().map_err(|_| bad())?;
        let last: u16 = last.trim().parse().map_err(|_| bad())?;
        if first == 0 || first > last {
            return Err(bad());
        }
        Ok(Self { first, last })
    }
}

impl Serialize for PortRange {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for PortRange {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// The browser engine an image runs: how it is launched and which client
/// protocols its doors speak.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EngineKind {
    /// Chromium (and its headless shell): CDP, Playwright, WebDriver
    /// through chromedriver.
    #[default]
    Chromium,
    /// Firefox (Debian's `firefox-esr`): WebDriver BiDi, spoken by the
    /// browser itself.
    Firefox,
}

impl EngineKind {
    pub fn name(self) -> &'static str {
        match self {
            Self::Chromium => "chromium",
            Self::Firefox => "firefox",
        }
    }

    /// Its name in a sentence.
    pub fn label(self) -> &'static str {
        match self {
            Self::Chromium => "Chromium",
            Self::Firefox => "Firefox",
        }
    }
}

/// One entry of the image catalog: which browser binary an image name means.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImageConfig {
    /// Path of the browser executable.
    pub executable: PathBuf,
    /// Flags added after the base flags.
    #[serde(default)]
    pub args: Vec<String>,
    /// The engine the executable is (`chromium` unless said).
    #[serde(default)]
    pub engine: EngineKind,
}

/// Where Debian's `firefox-esr` is; the built-in image `firefox` runs it
/// when it is installed.
pub const FIREFOX_EXECUTABLE: &str = "/usr/lib/firefox-esr/firefox-esr";

impl ImageConfig {
    /// Whether this browser loads extensions: Chromium does, its headless
    /// shell (known by its executable's name) has no extension system.
    pub fn loads_extensions(&self) -> bool {
        if self.engine != EngineKind::Chromium {
            return false;
        }
        let name = self
            .executable
            .file_name()
            .map(|name| name.to_string_lossy().into_owned())
            .unwrap_or_default();
        !name.contains("headless-shell") && !name.contains("headless_shell")
    }
}

/// `[agent]` section (unknown keys are caught by the configuration loader, which
/// names them with their section).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct AgentConfig {
    /// Agent API listen address (`flotilla agent --listen`; the local agent of `serve`).
    pub listen: String,
    /// The agent API's address as others reach it (`--advertise`); default from `listen`.
    pub advertise: Option<String>,
    /// Control plane URL (`flotilla agent --control-plane`).
    pub control_plane_url: Option<String>,
    /// Address instance ports listen on; default 127.0.0.1 when the public host
    /// is a loopback address, else 0.0.0.0.
    pub bind_address: Option<std::net::Ipv4Addr>,
    /// Node id; default: the machine's hostname.
    pub node_id: Option<String>,
    /// Instances this node holds at most (every state but failed and stopped).
    pub max_instances: i64,
    /// Ports for instances' debug, stream and HTTP listeners (three each).
    pub port_range: PortRange,
    /// Host that clients use to reach instance ports; default: the host of the
    /// agent's advertised address.
    pub public_host: Option<String>,
    /// Browsers of `warm_pool_image` kept started for instant creates (they use
    /// memory, not `max_instances` slots).
    pub warm_pool_size: usize,
    /// The image the warm pool serves.
    pub warm_pool_image: String,
    /// More warm pools: image name → browsers kept started for it (an entry
    /// for `warm_pool_image` replaces `warm_pool_size`).
    pub warm_pools: BTreeMap<String, usize>,
    /// How long after a take the pool waits before it starts the browser
    /// that replaces the one taken, in milliseconds: the client that took it
    /// gets the node's CPU for its first page (a refill starting at once
    /// costs it about 20 % of a ready page; `bench/RESULTS.md`).
    pub warm_pool_refill_delay_ms: u64,
    /// Start a chromedriver beside each warm browser (where Debian's
    /// chromium-driver is installed), so that a WebDriver session taking it
    /// does not wait for one; an instance that is not a WebDriver session
    /// ends it within 30 s.
    pub warm_pool_chromedriver: bool,
    /// Confine each browser with bubblewrap when `bwrap` is installed: a
    /// read-only root holding only what a browser needs, its own profile and
    /// downloads, private `/tmp` and `/dev/shm`, and its own namespaces.
    pub sandbox: bool,
    /// Run browsers even where the node cannot confine them (no bubblewrap
    /// sandbox, no network namespace of their own, no cgroup limits, or no
    /// Chromium sandbox).
    /// Off, such a node refuses to start and says what is missing and how to
    /// provide it; on, it starts, degraded, with the same words as warnings.
    pub allow_unconfined_browsers: bool,
    /// The unprivileged account browsers run as when the agent runs as root
    /// (`scripts/install-deps` creates it; `nobody` if it does not exist).
    pub browser_user: String,
    /// What pages may reach on the network (`[agent.egress]`).
    pub egress: crate::confine::egress::EgressConfig,
    /// A client connecting to a dormant instance's ports wakes it
    /// and is served once the browser is up.
    pub wake_on_connect: bool,
    /// How such a client wakes it: `full_restore` (its tabs come back, the
    /// default) or `quick_start` (cookies and storage only, a little faster).
    pub wake_on_connect_method: ReviveMethod,
    /// A revive, and a create with a persistent profile, take a warm
    /// browser of the instance's image when one is ready and the saved
    /// state's site data is all in its captured state (cookies,
    /// localStorage of the captured origins, tabs): that state is written
    /// in over CDP instead of launching a browser on the unpacked profile.
    /// Saved state with IndexedDB, service workers, file systems, storage
    /// buckets or localStorage the capture did not read launches on its
    /// files. Only where browsers are confined by bubblewrap.
    pub warm_pool_for_saved_state: bool,
    /// CPU quota per requested core: an instance gets `cpu_cores × cpu_quota_per_core`
    /// cores of CPU time (e.g. 0.5 to pack two instances per core).
    pub cpu_quota_per_core: f64,
    /// Processes and threads an instance may have.
    pub pids_max: u64,
    /// Seconds a browser may take to answer CDP before the instance fails.
    pub launch_timeout_sec: u64,
    /// Seconds a graceful stop (CDP `Browser.close`, then SIGTERM) may take before SIGKILL.
    pub stop_timeout_sec: u64,
    /// On SIGTERM (or any graceful stop) a standalone agent first asks its
    /// control plane to drain its node until it comes back: its instances
    /// move to other nodes (or are parked when none has room), then it exits.
    pub drain_on_shutdown: bool,
    /// The longest that drain may take; whatever has not moved by then is
    /// stopped as on any shutdown.
    pub drain_timeout_sec: u64,
    /// Browser window (and live view) size in pixels.
    pub viewport_width: u32,
    pub viewport_height: u32,
    /// JPEG quality of live-view frames, 1..=100.
    pub live_view_quality: u8,
    /// `GET /screenshot`: the most pixels a capture may have (a larger page
    /// is captured scaled down to fit).
    pub screenshot_max_pixels: u64,
    /// `GET /screenshot`: the largest PNG served (larger is refused).
    pub screenshot_max_bytes: u64,
    /// Screenshots the node captures at once (each instance one at a time);
    /// more wait up to 10 s, then get 503.
    pub max_concurrent_captures: usize,
    /// REST actions: the largest result (image, PDF, HTML, scrape JSON) a
    /// job on this node returns; larger is refused with 413.
    pub action_max_output_bytes: u64,
    /// Memory the node lets client messages take while they are held whole
    /// to be checked (those a pin may rewrite, fragmented ones, ones whose
    /// method comes late), over all its instances' CDP, BiDi and Playwright
    /// sockets, in MiB; a message waits up to 30 s for room, then its
    /// connection closes. Other messages stream and take none.
    pub messages_in_flight_mb: usize,
    /// Where versions of playwright-core are installed, one folder each
    /// (`<dir>/<version>/node_modules/playwright-core`): every version
    /// found there is served to `chromium.connect()` clients of its minor
    /// version. Under `/usr` when browsers are sandboxed (the sandbox sees
    /// `/usr` only).
    pub playwright_dir: PathBuf,
    /// The versions `scripts/install-deps` installs into `playwright_dir`
    /// (a node may add more there); the last six minor releases by default.
    pub playwright_versions: Vec<String>,
    pub runtime: RuntimeKind,
    /// Simulated start time of a sim-runtime instance.
    pub sim_start_ms: u64,
    /// Image catalog: image name → browser. Entries here are added to (or
    /// replace) the built-in `ubuntu:22.04`, `chromium`,
    /// `chromium-headless-shell` and, where Firefox is installed, `firefox`.
    pub images: BTreeMap<String, ImageConfig>,
}

/// `agent.playwright_dir`'s default.
pub const DEFAULT_PLAYWRIGHT_DIR: &str = "/usr/local/lib/flotilla/playwright";
/// `agent.playwright_versions`' default: the newest patch of the last six
/// minor releases (`scripts/install-deps` installs the same list).
pub const DEFAULT_PLAYWRIGHT_VERSIONS: &[&str] =
    &["1.60.0", "1.61.1", "1.62.1", "1.63.0", "1.64.1", "1.65.1"];

impl Default for AgentConfig {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:0".into(),
            advertise: None,
            control_plane_url: None,
            bind_address: None,
            node_id: None,
            max_instances: 20,
            port_range: PortRange {
                first: 20000,
                last: 40000,
            },
            public_host: None,
            warm_pool_size: 1,
            warm_pool_image: DEFAULT_IMAGE.to_owned(),
            warm_pools: BTreeMap::new(),
            warm_pool_refill_delay_ms: 500,
            warm_pool_chromedriver: true,
            sandbox: true,
            allow_unconfined_browsers: false,
            browser_user: "flotilla-browser".into(),
            egress: crate::confine::egress::EgressConfig::default(),
            wake_on_connect: true,
            wake_on_connect_method: ReviveMethod::FullRestore,
            warm_pool_for_saved_state: true,
            cpu_quota_per_core: 1.0,
            pids_max: 2048,
            launch_timeout_sec: 30,
            stop_timeout_sec: 5,
            drain_on_shutdown: false,
            drain_timeout_sec: 300,
            viewport_width: 1280,
            viewport_height: 720,
            live_view_quality: 60,
            screenshot_max_pixels: 4096 * 4096,
            screenshot_max_bytes: 32 << 20,
            max_concurrent_captures: 4,
            action_max_output_bytes: 64 << 20,
            messages_in_flight_mb: DEFAULT_MESSAGES_IN_FLIGHT >> 20,
            playwright_dir: PathBuf::from(DEFAULT_PLAYWRIGHT_DIR),
            playwright_versions: DEFAULT_PLAYWRIGHT_VERSIONS
                .iter()
                .map(|version| (*version).to_owned())
                .collect(),
            runtime: RuntimeKind::Chromium,
            sim_start_ms: 5,
            images: BTreeMap::new(),
        }
    }
}

impl AgentConfig {
    /// Every warm pool: image → browsers kept started for it (`warm_pools`,
    /// and `warm_pool_size` browsers of `warm_pool_image` unless
    /// `warm_pools` names it); pools of size 0 left out.
    pub fn warm_pool_sizes(&self) -> BTreeMap<String, usize> {
        let mut sizes = self.warm_pools.clone();
        sizes
            .entry(self.warm_pool_image.clone())
            .or_insert(self.warm_pool_size);
        sizes.retain(|_, size| *size > 0);
        sizes
    }

    /// The catalog: built-in images, overridden or extended by `images`.
    pub fn image_catalog(&self) -> BTreeMap<String, ImageConfig> {
        let mut catalog = BTreeMap::new();
        let chromium = ImageConfig {
            executable: PathBuf::from("/usr/lib/chromium/chromium"),
            args: Vec::new(),
            engine: EngineKind::Chromium,
        };
        catalog.insert(DEFAULT_IMAGE.to_owned(), chromium.clone());
        catalog.insert("chromium".to_owned(), chromium);
        catalog.insert(
            "chromium-headless-shell".to_owned(),
            ImageConfig {
                executable: PathBuf::from("/usr/bin/chromium-headless-shell"),
                args: Vec::new(),
                engine: EngineKind::Chromium,
            },
        );
        // A node without Firefox does not offer it (its heartbeat's images
        // leave it out, so placement sends Firefox creates elsewhere).
        if Path::new(FIREFOX_EXECUTABLE).is_file() {
            catalog.insert(
                "firefox".to_owned(),
                ImageConfig {
                    executable: PathBuf::from(FIREFOX_EXECUTABLE),
                    args: Vec::new(),
                    engine: EngineKind::Firefox,
                },
            );
        }
        catalog.extend(self.images.clone());
        catalog
    }

    /// Checks values that serde cannot; the message names the key.
    /// `messages_in_flight_mb` holds the largest message a client may send.
    fn check_messages_in_flight(&self) -> Result<(), ConfigError> {
        let largest = MAX_CLIENT_MESSAGE >> 20;
        if self.messages_in_flight_mb < largest {
            return Err(ConfigError::MessagesInFlight {
                got: self.messages_in_flight_mb,
                largest,
            });
        }
        Ok(())
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        self.check_capacity()?;
        self.check_messages_in_flight()?;
        self.check_warm_pools()?;
        self.egress.validate()?;
        if self.browser_user.is_empty() || self.browser_user == "root" {
            return Err(ConfigError::BrowserUser {
                got: self.browser_user.clone(),
            });
        }
        if self.launch_timeout_sec == 0 {
            return Err(ConfigError::Zero {
                key: "agent.launch_timeout_sec",
            });
        }
        if self.drain_on_shutdown && self.drain_timeout_sec == 0 {
            return Err(ConfigError::Zero {
                key: "agent.drain_timeout_sec",
            });
        }
        self.check_pages()
    }

    /// How many instances, their ports, CPU quota and processes.
    fn check_capacity(&self) -> Result<(), ConfigError> {
        if self.max_instances < 1 {
            return Err(ConfigError::MaxInstances {
                got: self.max_instances,
            });
        }
        let needed = usize::try_from(self.max_instances)
            .unwrap_or(usize::MAX)
            .saturating_mul(3);
        if self.port_range.len() < needed {
            return Err(ConfigError::PortRangeTooSmall {
                range: self.port_range,
                max_instances: self.max_instances,
                needed,
            });
        }
        if self.cpu_quota_per_core.is_nan()
            || self.cpu_quota_per_core <= 0.0
            || self.cpu_quota_per_core > 64.0
        {
            return Err(ConfigError::CpuQuotaPerCore {
                got: self.cpu_quota_per_core,
            });
        }
        if self.pids_max < 64 {
            return Err(ConfigError::PidsMax { got: self.pids_max });
        }
        Ok(())
    }

    /// Each warm pool's size and image, and the refill delay.
    fn check_warm_pools(&self) -> Result<(), ConfigError> {
        for (image, size) in self.warm_pool_sizes() {
            if size > 64 {
                return Err(ConfigError::WarmPoolSize { image, got: size });
            }
            if !self.image_catalog().contains_key(&image) {
                return Err(ConfigError::WarmPoolImage { image });
            }
        }
        if self.warm_pool_refill_delay_ms > 60_000 {
            return Err(ConfigError::WarmPoolRefillDelay {
                got: self.warm_pool_refill_delay_ms,
            });
        }
        Ok(())
    }

    /// What pages are captured and shown at: screenshots, captures, actions'
    /// output, the live view.
    fn check_pages(&self) -> Result<(), ConfigError> {
        if self.screenshot_max_pixels < 640 * 480 || self.screenshot_max_bytes < 1 << 20 {
            return Err(ConfigError::ScreenshotLimits {
                pixels: self.screenshot_max_pixels,
                bytes: self.screenshot_max_bytes,
            });
        }
        if self.max_concurrent_captures == 0 {
            return Err(ConfigError::Zero {
                key: "agent.max_concurrent_captures",
            });
        }
        if self.action_max_output_bytes == 0 {
            return Err(ConfigError::Zero {
                key: "agent.action_max_output_bytes",
            });
        }
        if !(1..=100).contains(&self.live_view_quality) {
            return Err(ConfigError::LiveViewQuality {
                got: self.live_view_quality,
            });
        }
        if self.viewport_width < 16
            || self.viewport_height < 16
            || self.viewport_width > 7680
            || self.viewport_height > 4320
        {
            return Err(ConfigError::Viewport {
                width: self.viewport_width,
                height: self.viewport_height,
            });
        }
        Ok(())
    }
}

/// An `[agent]` value the agent refuses to start with; each message names
/// the key, what it must be and what it was.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConfigError {
    #[error("agent.max_instances must be at least 1 (got {got})")]
    MaxInstances { got: i64 },
    #[error(
        "agent.port_range {range} has {} ports but agent.max_instances = {max_instances} needs {needed} (three per instance); widen the range",
        .range.len()
    )]
    PortRangeTooSmall {
        range: PortRange,
        max_instances: i64,
        needed: usize,
    },
    #[error("agent.cpu_quota_per_core must be > 0 and at most 64 (got {got})")]
    CpuQuotaPerCore { got: f64 },
    #[error("agent.pids_max must be at least 64: Chromium needs dozens of threads (got {got})")]
    PidsMax { got: u64 },
    #[error(
        "agent.messages_in_flight_mb must hold the largest message a client may send, {largest} MiB (got {got})"
    )]
    MessagesInFlight { got: usize, largest: usize },
    #[error(
        "the warm pool of image {image:?} (agent.warm_pool_size or agent.warm_pools) must be at most 64 (got {got})"
    )]
    WarmPoolSize { image: String, got: usize },
    #[error("agent.warm_pool_refill_delay_ms must be at most 60000 (got {got})")]
    WarmPoolRefillDelay { got: u64 },
    #[error(
        "warm pool image {image:?} (agent.warm_pool_image or agent.warm_pools) is not in the image catalog"
    )]
    WarmPoolImage { image: String },
    #[error(transparent)]
    EgressAllow(#[from] crate::confine::egress::InvalidAllowRule),
    #[error("agent.browser_user must name an unprivileged account (got {got:?})")]
    BrowserUser { got: String },
    /// A count or duration that must be at least 1.
    #[error("{key} must be at least 1")]
    Zero { key: &'static str },
    #[error(
        "agent.screenshot_max_pixels must be at least 307200 (640×480) and agent.screenshot_max_bytes at least 1048576 (got {pixels} and {bytes})"
    )]
    ScreenshotLimits { pixels: u64, bytes: u64 },
    #[error("agent.live_view_quality must be 1..=100 (got {got})")]
    LiveViewQuality { got: u8 },
    #[error(
        "agent.viewport_width x agent.viewport_height must be between 16x16 and 7680x4320 (got {width}x{height})"
    )]
    Viewport { width: u32, height: u32 },
}
