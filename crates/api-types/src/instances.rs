//! Instances: the resource of `spec/instance-service-api.md`, its configuration,
//! the request bodies and queries of the `/v2/instances` operations.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;
use utoipa::{IntoParams, ToSchema};

use crate::ids::{InstanceId, NodeId, SnapshotId};
use crate::names::UnknownName;

/// The image used when a create request names none.
pub const DEFAULT_IMAGE: &str = "ubuntu:22.04";

/// Lifecycle state of an instance (spec: States and transitions; DESIGN.md: Lifecycle).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum InstanceStatus {
    /// Being provisioned: the browser is starting.
    Creating,
    /// Active and accessible: CDP answers.
    Running,
    /// No activity for `idle_timeout_minutes`.
    Idle,
    /// Snapshotted and stopped to save resources.
    Dormant,
    /// Being restored from dormant.
    Reviving,
    /// Creation or an operation failed; `status_reason` says why.
    Failed,
    /// The browser exited (on its own, or its node restarted).
    Stopped,
}

impl InstanceStatus {
    pub const ALL: [InstanceStatus; 7] = [
        Self::Creating,
        Self::Running,
        Self::Idle,
        Self::Dormant,
        Self::Reviving,
        Self::Failed,
        Self::Stopped,
    ];

    /// States in which the instance holds a slot (and ports) on its node.
    pub const OCCUPYING: [InstanceStatus; 5] = [
        Self::Creating,
        Self::Running,
        Self::Idle,
        Self::Dormant,
        Self::Reviving,
    ];

    /// States in which a browser process is (or is about to be) alive.
    pub const ACTIVE: [InstanceStatus; 4] =
        [Self::Creating, Self::Running, Self::Idle, Self::Reviving];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Creating => "creating",
            Self::Running => "running",
            Self::Idle => "idle",
            Self::Dormant => "dormant",
            Self::Reviving => "reviving",
            Self::Failed => "failed",
            Self::Stopped => "stopped",
        }
    }

    pub fn occupies_slot(self) -> bool {
        Self::OCCUPYING.contains(&self)
    }
}

impl fmt::Display for InstanceStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for InstanceStatus {
    type Err = UnknownName;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|status| status.as_str() == s)
            .ok_or_else(|| UnknownName::new("instance status", s))
    }
}

/// InstanceConfig: resources and lifecycle settings of an instance. Every member
/// has the spec's default, so `{}` is a complete configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(default, deny_unknown_fields)]
pub struct InstanceConfig {
    /// Memory limit of the browser's process tree, in GiB (> 0).
    #[schema(default = 2.0)]
    pub memory_gb: f64,
    /// CPU quota of the browser's process tree, in cores (>= 1).
    #[schema(default = 2)]
    #[serde(deserialize_with = "crate::integers::i64")]
    pub cpu_cores: i64,
    /// Limit on the size of the browser profile, in GiB (> 0).
    #[schema(default = 10.0)]
    pub disk_gb: f64,
    /// Minutes without CDP or live-view activity before the instance is `idle`
    /// (0 disables idle detection).
    #[schema(default = 30)]
    #[serde(deserialize_with = "crate::integers::i64")]
    pub idle_timeout_minutes: i64,
    /// Whether an idle instance is made dormant automatically.
    #[schema(default = true)]
    pub auto_snapshot: bool,
    /// An upstream proxy every request of the browser goes through (its
    /// credentials are answered by the node agent, never seen by the browser
    /// or CDP clients, and redacted in responses).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub proxy: Option<UpstreamProxy>,
    /// Lifetime in minutes (> 0, fractions allowed): the instance is deleted
    /// this long after its creation, whatever its activity (events
    /// `instance.expired`, then `instance.deleted`). None: no limit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_duration_minutes: Option<f64>,
    /// Ids of uploaded extensions (`POST /v2/extensions`) the browser loads,
    /// at most 20. Only images that load extensions (`chromium`, not the
    /// headless shell) accept them; such instances never take a warm browser.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extensions: Vec<String>,
    /// Records the live view (the tab it shows) to video while the instance
    /// runs: MP4/H.264, one recording per running period (`GET
    /// /v2/instances/{id}/recordings`). Recordings count toward `disk_gb`
    /// and are deleted with the instance unless `keep_recordings`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub record: bool,
    /// With `record`: when the instance is deleted (or ends), its recordings
    /// move to the snapshot store and are listed under `GET /v2/recordings`
    /// until deleted there.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub keep_recordings: bool,
    /// Chromium preferences written into the profile before the browser
    /// starts (what chromedriver's `goog:chromeOptions.prefs` does): dotted
    /// names (`"intl.accept_languages": "fr-FR"`) or nested objects, at most
    /// 64 KiB. The download folders, `proxy.*`, `extensions.*`,
    /// `devtools.*`, `protocol_handler.*` and what opens downloads outside
    /// the browser are refused. Such instances never take a warm browser.
    /// On a Firefox image, Firefox's preferences (`user.js`; booleans,
    /// 32-bit integers, strings), with its own refusals (docs/api.md,
    /// "Firefox").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub prefs: Option<serde_json::Map<String, serde_json::Value>>,
}

impl Default for InstanceConfig {
    fn default() -> Self {
        Self {
            memory_gb: 2.0,
            cpu_cores: 2,
            disk_gb: 10.0,
            idle_timeout_minutes: 30,
            auto_snapshot: true,
            proxy: None,
            max_duration_minutes: None,
            extensions: Vec::new(),
            record: false,
            keep_recordings: false,
            prefs: None,
        }
    }
}

/// `server` with whatever sits between `scheme://` and an `@` (a user and
/// password written into the URL) replaced by `***`.
pub fn without_credentials(server: &str) -> String {
    let start = server.find("://").map_or(0, |i| i + 3);
    let authority_end = server[start..]
        .find(['/', '?', '#'])
        .map_or(server.len(), |i| start + i);
    match server[start..authority_end].rfind('@') {
        Some(at) => format!("{}***{}", &server[..start], &server[start + at..]),
        None => server.to_owned(),
    }
}

/// The parts of `UpstreamProxy::server`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyEndpoint {
    /// `http` or `socks5`.
    pub scheme: String,
    pub host: String,
    pub port: u16,
}

/// Why an upstream proxy (`config.proxy`) is refused: each message names
/// the field and what it must be.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProxyError {
    /// `server` is not `http://host:port` or `socks5://host:port`.
    /// The message never repeats credentials written into the URL.
    #[error(
        "config.proxy.server must be http://host:port or socks5://host:port, without credentials (use username and password), path or query (got {:?})",
        without_credentials(.server)
    )]
    Server { server: String },
    #[error("config.proxy.username must be 1 to 255 characters without control characters")]
    Username,
    #[error("config.proxy.password needs config.proxy.username")]
    PasswordWithoutUsername,
    #[error("config.proxy.password must be 1 to 255 characters without control characters")]
    Password,
    #[error("config.proxy.bypass takes at most {max} entries")]
    TooManyBypassEntries { max: usize },
    #[error(
        "config.proxy.bypass entry {entry:?} must be a host name, *.suffix, an address or a network"
    )]
    BypassEntry { entry: String },
}

impl UpstreamProxy {
    /// Most entries of `bypass`.
    pub const MAX_BYPASS_ENTRIES: usize = 100;

    /// Checks every field; the message names it (`config.proxy.server …`).
    pub fn validate(&self) -> Result<ProxyEndpoint, ProxyError> {
        let endpoint = self.endpoint()?;
        let text_ok = |value: &str| {
            !value.is_empty() && value.len() <= 255 && !value.chars().any(char::is_control)
        };
        if let Some(username) = &self.username
            && !text_ok(username)
        {
            return Err(ProxyError::Username);
        }
        if let Some(password) = &self.password {
            if self.username.is_none() {
                return Err(ProxyError::PasswordWithoutUsername);
            }
            if !text_ok(password.expose()) {
                return Err(ProxyError::Password);
            }
        }
        if self.bypass.len() > Self::MAX_BYPASS_ENTRIES {
            return Err(ProxyError::TooManyBypassEntries {
                max: Self::MAX_BYPASS_ENTRIES,
            });
        }
        for entry in &self.bypass {
            let pattern = entry.strip_prefix("*.").unwrap_or(entry);
            let valid = !pattern.is_empty()
                && entry.len() <= 253
                && pattern
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-.:/[]_".contains(c));
            if !valid {
                return Err(ProxyError::BypassEntry {
                    entry: entry.clone(),
                });
            }
        }
        Ok(endpoint)
    }

    /// `server` as scheme, host and port.
    pub fn endpoint(&self) -> Result<ProxyEndpoint, ProxyError> {
        let bad = || ProxyError::Server {
            server: self.server.clone(),
        };
        let (scheme, rest) = self.server.split_once("://").ok_or_else(bad)?;
        let scheme = scheme.to_ascii_lowercase();
        if !matches!(scheme.as_str(), "http" | "socks5") {
            return Err(bad());
        }
        let authority = rest.strip_suffix('/').unwrap_or(rest);
        if authority.is_empty() || authority.contains(['/', '?', '#', '@']) {
            return Err(bad());
        }
        let (host, port) = authority.rsplit_once(':').ok_or_else(bad)?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let port: u16 = port.parse().map_err(|_| bad())?;
        if host.is_empty()
            || port == 0
            || !host
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-.:_".contains(c))
        {
            return Err(bad());
        }
        Ok(ProxyEndpoint {
            scheme,
            host: host.to_owned(),
            port,
        })
    }

    /// A copy fit to show: the password replaced by `********`.
    pub fn redacted(&self) -> Self {
        Self {
            password: self
                .password
                .as_ref()
                .map(|_| crate::credentials::Secret::new("********".into())),
            ..self.clone()
        }
    }
}

/// `config.proxy`: an upstream proxy for all of an instance's traffic.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpstreamProxy {
    /// `http://host:port` (CONNECT tunnels) or `socks5://host:port`.
    pub server: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    /// Shown as `********` in responses.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    pub password: Option<crate::credentials::Secret>,
    /// Destinations that do not use the proxy: host names, `*.suffix`
    /// patterns, addresses or networks (`10.0.0.0/8`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub bypass: Vec<String>,
}

/// Body of `POST /v2/instances`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateInstanceRequest {
    /// Image from the node's catalog; default `ubuntu:22.04` (the system Chromium).
    #[serde(default)]
    #[schema(
        default = "ubuntu:22.04",
        pattern = r"^[^\s\u0000-\u001f\u007f-\u009f]{1,200}$"
    )]
    pub image: Option<String>,
    #[serde(default)]
    pub config: Option<InstanceConfig>,
    /// Id of the node to place the instance on.
    #[serde(default)]
    #[schema(value_type = Option<String>, min_length = 1)]
    pub node_preference: Option<NodeId>,
    /// Start from a saved profile (`POST /v2/profiles`), and with `persist`
    /// write the state back when the instance is deleted or parked.
    #[serde(default)]
    pub profile: Option<crate::profiles::ProfileUse>,
}

/// Query of `POST /v2/instances`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct CreateInstanceQuery {
    /// Wait up to this many seconds, in FIFO order with other waiting creates,
    /// for room (0..=`scheduler.max_wait_sec`, default 0: answer at once).
    pub wait_sec: Option<u64>,
}

/// Resource use of one instance: CPU as a percentage of one core (like `top`),
/// memory (PSS of its process tree) and profile size in megabytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct InstanceResources {
    pub cpu_percent: f64,
    pub memory_mb: f64,
    pub disk_mb: f64,
}

/// What drives an instance now (list and get responses), so that a person
/// can tell instances apart: the DevTools and Playwright connections open on
/// it and the REST actions running on it (as its node counted them at its
/// last heartbeat), whether a WebDriver session holds it, and the MCP
/// sessions that created it or act on it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct InstanceDrivers {
    /// Open DevTools (CDP) connections: Playwright's `connectOverCDP`,
    /// Puppeteer, any CDP client.
    pub cdp: u32,
    /// Open Playwright connections (`chromium.connect()`).
    pub playwright: u32,
    /// 1 while a WebDriver session (Selenium, WebdriverIO) holds the
    /// instance, else 0.
    pub webdriver: u32,
    /// MCP sessions that created the instance or made it their current one.
    pub mcp: u32,
    /// REST actions running on it.
    pub actions: u32,
}

/// Recent activity of an instance (CDP traffic and live-view viewers).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Activity {
    pub last_activity: DateTime<Utc>,
    pub idle_minutes: f64,
}

/// Where to reach an instance. With `auth_enabled` both URLs carry the
/// instance's access token as `?token=`: treat them as secrets.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct InstanceUrls {
    /// CDP endpoint, accepted as is by Playwright's `connectOverCDP` and
    /// Puppeteer's `connect({browserWSEndpoint})`.
    pub debug: String,
    /// Live view (MJPEG; shows in an `<img>`).
    pub stream: String,
    /// Playwright's own protocol, for `chromium.connect()` (a server of
    /// the client's version drives the instance's browser).
    pub playwright: String,
    /// WebDriver BiDi, the browser's own socket: a Firefox instance's
    /// (Puppeteer's `connect({browserWSEndpoint, protocol:
    /// 'webDriverBiDi'})`). A Chromium instance answers it with a 400 that
    /// points at `debug`, as a Firefox instance answers `debug`.
    pub bidi: String,
}

/// Instance. Which members appear depends on the operation (spec: "Response
/// shapes per operation"); the constructors in the control plane build each shape.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Instance {
    pub id: InstanceId,
    pub status: InstanceStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_id: Option<NodeId>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subdomain: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub debug_port: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream_port: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_port: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_at: Option<DateTime<Utc>>,
    /// Image the instance runs (list and get responses).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<InstanceConfig>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<InstanceResources>,
    /// What drives it now (list and get responses).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drivers: Option<InstanceDrivers>,
    /// Create and get responses.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub urls: Option<InstanceUrls>,
    /// The profile the instance started from (get responses).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<crate::profiles::ProfileUse>,
    /// When `config.max_duration_minutes` ends the instance (get responses).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<DateTime<Utc>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub activity: Option<Activity>,
    /// Why the instance is `failed` or `stopped` (get responses).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status_reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot_id: Option<SnapshotId>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dormant_since: Option<DateTime<Utc>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub estimated_completion: Option<DateTime<Utc>>,
}

impl Instance {
    /// An instance with only `id` and `status` set; the operation fills the rest.
    pub fn bare(id: InstanceId, status: InstanceStatus) -> Self {
        Self {
            id,
            status,
            node_id: None,
            subdomain: None,
            debug_port: None,
            stream_port: None,
            http_port: None,
            created_at: None,
            image: None,
            config: None,
            resources: None,
            drivers: None,
            urls: None,
            profile: None,
            expires_at: None,
            activity: None,
            status_reason: None,
            snapshot_id: None,
            dormant_since: None,
            estimated_completion: None,
        }
    }
}

/// InstanceList: one page of instances.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct InstanceList {
    pub instances: Vec<Instance>,
    /// Number of instances matching the filters, over all pages.
    pub total: i64,
    pub limit: i64,
    pub offset: i64,
}

/// Order of `GET /v2/instances`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum InstanceSort {
    #[default]
    CreatedAtDesc,
    CreatedAtAsc,
    MemoryDesc,
    CpuDesc,
}

/// Query of `GET /v2/instances`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListInstancesQuery {
    /// Only instances in this state.
    pub status: Option<InstanceStatus>,
    /// Only instances on this node.
    #[param(value_type = Option<String>)]
    pub node_id: Option<NodeId>,
    /// Page size, 1..=1000 (default 100).
    #[param(minimum = 1, maximum = 1000, default = 100)]
    pub limit: Option<i64>,
    /// Number of instances to skip, >= 0 (default 0).
    #[param(minimum = 0, default = 0)]
    pub offset: Option<i64>,
    /// Order of the page (default `created_at_desc`).
    pub sort: Option<InstanceSort>,
}

/// How a dormant instance comes back.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ReviveMethod {
    /// Profile restored (cookies, localStorage, IndexedDB; session cookies set
    /// again) with one blank tab.
    #[default]
    QuickStart,
    /// Also every tab reopened at its URL.
    FullRestore,
}

impl ReviveMethod {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::QuickStart => "quick_start",
            Self::FullRestore => "full_restore",
        }
    }
}

impl FromStr for ReviveMethod {
    type Err = UnknownName;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "quick_start" => Ok(Self::QuickStart),
            "full_restore" => Ok(Self::FullRestore),
            other => Err(UnknownName::new("revive method", other)),
        }
    }
}

/// Optional body of `POST /v2/instances/{instance_id}/revive`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReviveRequest {
    /// `quick_start` (default) or `full_restore`.
    #[serde(default)]
    pub method: ReviveMethod,
}

/// Query of `DELETE /v2/instances/{instance_id}`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct DeleteInstanceQuery {
    /// Skip the graceful shutdown (CDP `Browser.close`) and kill at once.
    #[serde(default)]
    pub force: bool,
}

/// Where a download is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum DownloadState {
    InProgress,
    Complete,
    /// Left unfinished: a partial file untouched for a minute.
    Failed,
}

/// A file the instance's pages downloaded.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Download {
    pub name: String,
    pub size_bytes: u64,
    pub mime_type: String,
    pub created_at: DateTime<Utc>,
    pub state: DownloadState,
}

/// `GET /v2/instances/{id}/downloads`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct DownloadList {
    pub downloads: Vec<Download>,
}

/// One recording of an instance's live view.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Recording {
    pub id: String,
    /// `video/mp4` (H.264).
    pub content_type: String,
    pub size_bytes: u64,
    /// Seconds of video (so far, while it records).
    pub duration_sec: f64,
    pub created_at: DateTime<Utc>,
    /// Whether it is still being written (its instance is running).
    pub recording: bool,
}

/// `GET /v2/instances/{instance_id}/recordings`, oldest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct RecordingList {
    pub recordings: Vec<Recording>,
}

/// A recording kept after its instance was deleted (`config.keep_recordings`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct KeptRecording {
    pub id: String,
    /// The instance it recorded (deleted since).
    pub instance_id: InstanceId,
    /// `video/mp4` (H.264).
    pub content_type: String,
    pub size_bytes: u64,
    pub duration_sec: f64,
    pub created_at: DateTime<Utc>,
    /// When it moved to the snapshot store.
    pub kept_at: DateTime<Utc>,
}

/// `GET /v2/recordings`, oldest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct KeptRecordingList {
    pub recordings: Vec<KeptRecording>,
}

/// Query of `GET /v2/recordings`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct KeptRecordingQuery {
    /// Only the recordings of this instance.
    pub instance_id: Option<InstanceId>,
}

#[cfg(test)]
mod credential_tests {
    use super::*;

    #[test]
    fn a_proxy_refusal_never_repeats_a_password_in_the_url() {
        assert_eq!(
            without_credentials("http://user:secret@proxy:3128"),
            "http://***@proxy:3128"
        );
        assert_eq!(
            without_credentials("socks5://a@b@proxy:1080/x@y"),
            "socks5://***@proxy:1080/x@y"
        );
        assert_eq!(
            without_credentials("http://proxy:3128"),
            "http://proxy:3128"
        );
        assert_eq!(without_credentials("user:pw@proxy"), "***@proxy");
        let message = ProxyError::Server {
            server: "http://user:secret@proxy:3128".into(),
        }
        .to_string();
        assert!(
            !message.contains("secret") && message.contains("***@proxy"),
            "{message}"
        );
    }
}
