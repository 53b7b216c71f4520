//! Control-plane configuration: the top-level keys and sections of the TOML file
//! that the control plane owns (DESIGN.md, "Configuration files"). Loaded by the
//! CLI; every key is documented in `docs/configuration.md`.

use serde::{Deserialize, Serialize};

use flotilla_api_types::events::EventName;

/// Settings of the control plane (top-level keys and their sections; unknown
/// keys are caught by the loader, since this struct is flattened into the file).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
#[derive(Default)]
pub struct ControlPlaneConfig {
    /// Require `Authorization: Bearer <API_KEY>` on the API (spec: Authentication).
    pub auth_enabled: bool,
    /// Accepted API keys, as `sha256:<hex>` (a raw key is accepted with a
    /// warning): admin keys, which see and act on the whole fleet.
    pub api_keys: Vec<String>,
    /// `[[tenants]]`: keys that see and act only on what their tenant made.
    pub tenants: Vec<TenantConfig>,
    /// Ask for the API key on `GET /metrics` too (it is open by default).
    pub metrics_require_auth: bool,
    /// Shared secret between control planes and agents for the agent API.
    pub cluster_token: Option<String>,
    /// The front door as clients reach it (`https://flotilla.example.com`): when
    /// set, `urls.debug` and `urls.stream` go through the control plane's port
    /// (by path, or by subdomain with `gateway.base_domain`) instead of the
    /// node's instance ports.
    pub public_url: Option<String>,
    /// Addresses or networks (`10.0.0.0/8`) of reverse proxies whose
    /// `X-Forwarded-Proto` / `X-Forwarded-Host` the front door believes.
    pub trusted_proxies: Vec<String>,
    /// `[gateway]`: the front door's subdomain routing.
    pub gateway: GatewayConfig,
    /// `[rate_limit]`: the file's section is shared with the event proxy, so the
    /// loader fills this in (see `flotilla_server::config`).
    #[serde(skip)]
    pub rate_limit: ApiRateLimitConfig,
    /// `[[webhooks]]`: receivers of lifecycle events.
    pub webhooks: Vec<WebhookConfig>,
    pub webhook_delivery: WebhookDeliveryConfig,
    /// `[monitoring]`: alert thresholds (spec names), percent.
    pub monitoring: MonitoringConfig,
    /// `[metrics]`: sampling for `GET /v2/metrics`.
    pub metrics: MetricsConfig,
    /// `[events]`: publishing lifecycle events on the event proxy.
    pub events: EventsConfig,
    pub nodes: NodesConfig,
    pub store: StoreConfig,
    pub scheduler: SchedulerConfig,
    /// `[webdriver]`: WebDriver sessions (Selenium, WebdriverIO).
    pub webdriver: WebDriverConfig,
    /// `[actions]`: REST actions (`POST /v2/actions/…`).
    pub actions: ActionsConfig,
    /// `[mcp]`: the MCP server at `/mcp`.
    pub mcp: McpConfig,
}

/// One `[[tenants]]` entry: a team sharing the fleet. Its keys see, drive
/// and end only what they made (instances and the sessions of every
/// protocol on them, profiles, extensions, recordings, live links, events);
/// anything else answers 404, as if it did not exist.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantConfig {
    /// Lower-case letters, digits and `-`, 1 to 63 characters.
    pub name: String,
    /// Its keys, as `sha256:<hex>` (`flotilla keys create --tenant NAME`).
    #[serde(default)]
    pub api_keys: Vec<String>,
    /// Instances it holds at once (every state but failed and stopped);
    /// 0: no limit.
    #[serde(default)]
    pub max_instances: u32,
    /// WebDriver and MCP sessions it holds at once; 0: no limit.
    #[serde(default)]
    pub max_sessions: u32,
}

/// Whether `name` can name a tenant.
pub fn is_tenant_name(name: &str) -> bool {
    (1..=63).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
}

/// `[mcp]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct McpConfig {
    /// What becomes of the instances an MCP session created when it ends.
    pub on_session_end: SessionEnd,
    /// How long `browser_create` waits in the create queue for room.
    pub queue_wait_sec: u64,
    /// The longest one page step may take (a navigation, a wait, …).
    pub step_timeout_ms: u64,
    /// A session with no request for this long ends (and its instances
    /// with it, per `on_session_end`).
    pub session_idle_timeout_sec: u64,
    /// Sessions the fleet holds at once (counted in the store); a new one
    /// past it is 503.
    pub max_sessions: usize,
    /// Sessions one API key holds at once (its share of `max_sessions`); a
    /// new one past it is 503. Applies with authentication on.
    pub max_sessions_per_key: usize,
}

impl Default for McpConfig {
    fn default() -> Self {
        Self {
            on_session_end: SessionEnd::Delete,
            queue_wait_sec: 60,
            step_timeout_ms: 60_000,
            session_idle_timeout_sec: 3600,
            max_sessions: 1000,
            max_sessions_per_key: 100,
        }
    }
}

/// `mcp.on_session_end`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SessionEnd {
    Delete,
    Park,
    Keep,
}

/// `[actions]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ActionsConfig {
    /// How long an action waits in the create queue for room before it is
    /// refused with 503.
    pub queue_wait_sec: u64,
    /// The largest `html` an action renders, in bytes.
    pub max_html_bytes: usize,
    /// The largest `timeout_ms` an action may ask for.
    pub max_timeout_ms: u64,
    /// Actions this control plane holds at once (waiting for room or
    /// running); more are refused with 503 at once.
    pub max_pending: usize,
}

impl Default for ActionsConfig {
    fn default() -> Self {
        Self {
            queue_wait_sec: 60,
            max_html_bytes: 5 << 20,
            max_timeout_ms: 120_000,
            max_pending: 256,
        }
    }
}

impl ActionsConfig {
    pub fn limits(&self) -> flotilla_api_types::actions::ActionLimits {
        flotilla_api_types::actions::ActionLimits {
            max_html_bytes: self.max_html_bytes,
            max_timeout_ms: self.max_timeout_ms,
        }
    }
}

/// `[webdriver]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct WebDriverConfig {
    /// How long a new session waits in the create queue for room before it
    /// is refused `session not created` (Selenium Grid's default).
    pub session_request_timeout_sec: u64,
}

impl Default for WebDriverConfig {
    fn default() -> Self {
        Self {
            session_request_timeout_sec: 300,
        }
    }
}

/// `[gateway]`: subdomain routing of the front door.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct GatewayConfig {
    /// With `browsers.example.com`, a request whose `Host` is
    /// `<instance subdomain>.browsers.example.com` reaches that instance.
    pub base_domain: Option<String>,
}

/// `[nodes]`: heartbeats and node health.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct NodesConfig {
    /// Seconds between an agent's heartbeats (told to agents when they register).
    pub heartbeat_interval_sec: f64,
    /// A node whose last heartbeat is older than this is offline (spec: 60 s).
    pub heartbeat_timeout_sec: f64,
    /// A node is unhealthy (no new placements) when more than this share of the
    /// instances created on it recently failed (spec: 10 %).
    pub max_failed_ratio: f64,
    /// "Recently": within this many minutes.
    pub failed_ratio_window_min: f64,
    /// The ratio is judged from this many recent instances on.
    pub failed_ratio_min_instances: i64,
}

impl Default for NodesConfig {
    fn default() -> Self {
        Self {
            heartbeat_interval_sec: 5.0,
            heartbeat_timeout_sec: 60.0,
            max_failed_ratio: 0.1,
            failed_ratio_window_min: 15.0,
            failed_ratio_min_instances: 5,
        }
    }
}

/// `[store]`: where instance and node records live.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct StoreConfig {
    /// `sqlite://<path>` or `postgres://…`; default `sqlite://<data_dir>/flotilla.db`.
    pub database_url: Option<String>,
    /// Connections in the pool.
    pub max_connections: u32,
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            database_url: None,
            max_connections: 8,
        }
    }
}

/// `[scheduler]`: placement.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SchedulerConfig {
    /// Candidates compared per placement (best-of-K by free capacity).
    pub candidates: usize,
    /// A node above this utilisation (CPU or memory, percent) gets no new placements (spec: 90).
    pub max_utilisation_percent: f64,
    /// Longest `wait_sec` a create may ask for (its wait for room in the queue).
    pub max_wait_sec: u64,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        Self {
            candidates: 2,
            max_utilisation_percent: 90.0,
            max_wait_sec: 300,
        }
    }
}

/// `[rate_limit]` keys of the control plane (off by default; DESIGN.md).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ApiRateLimitConfig {
    pub enabled: bool,
    /// Requests per key (or per client address without auth) per minute; also the burst.
    pub requests_per_minute: u32,
}

impl Default for ApiRateLimitConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            requests_per_minute: 600,
        }
    }
}

/// One `[[webhooks]]` entry (spec: url, events, secret).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhookConfig {
    pub url: String,
    /// Event names to send; empty sends every event.
    #[serde(default)]
    pub events: Vec<EventName>,
    /// Signing secret (Standard Webhooks): `whsec_<base64>` or any other string,
    /// used as raw bytes.
    pub secret: String,
}

/// `[webhook_delivery]`: how the outbox delivers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct WebhookDeliveryConfig {
    /// Seconds a receiver has to answer one call.
    pub timeout_sec: f64,
    /// Retries wait 1, 2, 4 … seconds, at most this long.
    pub max_backoff_sec: f64,
    /// An event still undelivered after this many hours is dropped (and counted).
    pub give_up_after_hours: f64,
    /// Calls in flight per receiver (each to a different instance, so order holds).
    pub concurrency: usize,
}

impl Default for WebhookDeliveryConfig {
    fn default() -> Self {
        Self {
            timeout_sec: 10.0,
            max_backoff_sec: 300.0,
            give_up_after_hours: 72.0,
            concurrency: 16,
        }
    }
}

/// `[monitoring]` (spec names): thresholds in percent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct MonitoringConfig {
    pub cpu_warning_threshold: f64,
    pub cpu_critical_threshold: f64,
    pub memory_warning_threshold: f64,
    pub memory_critical_threshold: f64,
    pub disk_warning_threshold: f64,
    pub disk_critical_threshold: f64,
}

impl Default for MonitoringConfig {
    fn default() -> Self {
        Self {
            cpu_warning_threshold: 70.0,
            cpu_critical_threshold: 90.0,
            memory_warning_threshold: 80.0,
            memory_critical_threshold: 95.0,
            disk_warning_threshold: 80.0,
            disk_critical_threshold: 95.0,
        }
    }
}

/// `[metrics]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct MetricsConfig {
    /// Seconds between resource samples (and alert evaluations).
    pub sample_interval_sec: f64,
    /// Days of samples kept (`GET /v2/metrics?period=7d` needs 7).
    pub retention_days: f64,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        Self {
            sample_interval_sec: 60.0,
            retention_days: 8.0,
        }
    }
}

/// `[events]`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct EventsConfig {
    /// The event proxy to publish lifecycle events to (topics `instances` and
    /// `instances.<id>`); `serve` sets it to its own proxy.
    pub proxy_url: Option<String>,
    /// A publisher key of that proxy (`[publisher] api_keys`).
    pub publish_key: Option<String>,
    /// Key that signs subscriber tokens (`POST /v2/tokens`); by default one is
    /// generated and kept in the store, shared by every control plane on it.
    pub token_secret: Option<String>,
}

/// A configuration value the control plane refuses: each message names the
/// key, what it must be, and what it was.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("public_url {url:?} is not a URL: {source}")]
    PublicUrlUnparsable {
        url: String,
        #[source]
        source: url::ParseError,
    },
    #[error("public_url must be http(s)://host[:port] without a path (got {url:?})")]
    PublicUrlShape { url: String },
    #[error("gateway.base_domain must be a DNS name like browsers.example.com (got {domain:?})")]
    BaseDomain { domain: String },
    #[error("trusted_proxies: {entry:?} is not an address or a network like 10.0.0.0/8")]
    TrustedProxy { entry: String },
    /// A count that must be at least 1 (`scheduler.candidates`, …).
    #[error("{key} must be at least 1")]
    Zero { key: &'static str },
    #[error("nodes.heartbeat_interval_sec must be > 0")]
    HeartbeatInterval,
    #[error(
        "nodes.heartbeat_timeout_sec ({timeout}) must be greater than nodes.heartbeat_interval_sec ({interval})"
    )]
    HeartbeatTimeout { timeout: f64, interval: f64 },
    #[error("webhooks[{index}].url {url:?}: {source}")]
    WebhookUrlUnparsable {
        index: usize,
        url: String,
        #[source]
        source: url::ParseError,
    },
    #[error("webhooks[{index}].url must be http:// or https://")]
    WebhookUrlScheme { index: usize },
    #[error("webhooks[{index}].secret must not be empty: receivers verify signatures with it")]
    WebhookSecretEmpty { index: usize },
    #[error(
        "webhook_delivery: timeout_sec > 0, max_backoff_sec >= 1 and give_up_after_hours > 0 are required"
    )]
    WebhookDeliveryTimes,
    #[error(
        "monitoring.{metric}_warning_threshold ({warning}) and monitoring.{metric}_critical_threshold ({critical}) must be percentages with warning <= critical"
    )]
    Thresholds {
        metric: &'static str,
        warning: f64,
        critical: f64,
    },
    #[error("metrics.sample_interval_sec must be >= 1 and metrics.retention_days > 0")]
    MetricsTimes,
    #[error("events.proxy_url {url:?}: {source}")]
    EventsProxyUrl {
        url: String,
        #[source]
        source: url::ParseError,
    },
    #[error("events.token_secret must be at least 16 characters")]
    TokenSecretShort,
    #[error(transparent)]
    ApiKey(#[from] ApiKeyError),
    #[error(
        "auth_enabled = true needs at least one entry in api_keys (create one with `flotilla keys create`)"
    )]
    AuthWithoutKeys,
    #[error(
        "tenants[{index}].name {name:?} must be 1 to 63 lower-case letters, digits and '-', and name one tenant only"
    )]
    TenantName { index: usize, name: String },
    #[error("the API key {digest_start}… is listed twice (api_keys and tenants, or two tenants)")]
    KeyTwice { digest_start: String },
}

impl ControlPlaneConfig {
    /// Checks values that serde cannot; the message names the key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.validate_addresses()?;
        self.validate_limits()?;
        self.validate_webhooks()?;
        self.validate_monitoring()?;
        self.validate_events_and_keys()
    }

    /// `public_url`, `gateway.base_domain` and `trusted_proxies`.
    fn validate_addresses(&self) -> Result<(), ConfigError> {
        if let Some(public_url) = &self.public_url {
            let url =
                url::Url::parse(public_url).map_err(|source| ConfigError::PublicUrlUnparsable {
                    url: public_url.clone(),
                    source,
                })?;
            if !matches!(url.scheme(), "http" | "https")
                || url.host_str().is_none()
                || url.path() != "/"
                || url.query().is_some()
            {
                return Err(ConfigError::PublicUrlShape {
                    url: public_url.clone(),
                });
            }
        }
        if let Some(domain) = &self.gateway.base_domain {
            let valid_label = |label: &str| {
                !label.is_empty()
                    && label.len() <= 63
                    && label
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-')
                    && !label.starts_with('-')
                    && !label.ends_with('-')
            };
            if domain.len() > 200 || !domain.split('.').all(valid_label) {
                return Err(ConfigError::BaseDomain {
                    domain: domain.clone(),
                });
            }
        }
        for entry in &self.trusted_proxies {
            flotilla_net::IpNetwork::parse(entry).map_err(|_| ConfigError::TrustedProxy {
                entry: entry.clone(),
            })?;
        }
        Ok(())
    }

    /// Heartbeats, the scheduler, the store and the rate limit.
    fn validate_limits(&self) -> Result<(), ConfigError> {
        if self.nodes.heartbeat_interval_sec.is_nan() || self.nodes.heartbeat_interval_sec <= 0.0 {
            return Err(ConfigError::HeartbeatInterval);
        }
        if self.nodes.heartbeat_timeout_sec.is_nan()
            || self.nodes.heartbeat_timeout_sec <= self.nodes.heartbeat_interval_sec
        {
            return Err(ConfigError::HeartbeatTimeout {
                timeout: self.nodes.heartbeat_timeout_sec,
                interval: self.nodes.heartbeat_interval_sec,
            });
        }
        if self.scheduler.candidates == 0 {
            return Err(ConfigError::Zero {
                key: "scheduler.candidates",
            });
        }
        if self.store.max_connections == 0 {
            return Err(ConfigError::Zero {
                key: "store.max_connections",
            });
        }
        if self.rate_limit.enabled && self.rate_limit.requests_per_minute == 0 {
            return Err(ConfigError::Zero {
                key: "rate_limit.requests_per_minute",
            });
        }
        if self.actions.max_html_bytes == 0 {
            return Err(ConfigError::Zero {
                key: "actions.max_html_bytes",
            });
        }
        if self.mcp.session_idle_timeout_sec == 0
            || self.mcp.max_sessions == 0
            || self.mcp.max_sessions_per_key == 0
        {
            return Err(ConfigError::Zero {
                key: "mcp.session_idle_timeout_sec, mcp.max_sessions and mcp.max_sessions_per_key",
            });
        }
        if self.mcp.step_timeout_ms == 0 {
            return Err(ConfigError::Zero {
                key: "mcp.step_timeout_ms",
            });
        }
        if self.actions.max_pending == 0 {
            return Err(ConfigError::Zero {
                key: "actions.max_pending",
            });
        }
        if self.actions.max_timeout_ms == 0 {
            return Err(ConfigError::Zero {
                key: "actions.max_timeout_ms",
            });
        }
        Ok(())
    }

    /// `[[webhooks]]` and `[webhook_delivery]`.
    fn validate_webhooks(&self) -> Result<(), ConfigError> {
        for (index, webhook) in self.webhooks.iter().enumerate() {
            let url = url::Url::parse(&webhook.url).map_err(|source| {
                ConfigError::WebhookUrlUnparsable {
                    index,
                    url: webhook.url.clone(),
                    source,
                }
            })?;
            if !matches!(url.scheme(), "http" | "https") {
                return Err(ConfigError::WebhookUrlScheme { index });
            }
            if webhook.secret.is_empty() {
                return Err(ConfigError::WebhookSecretEmpty { index });
            }
        }
        let delivery = &self.webhook_delivery;
        if !above(delivery.timeout_sec, 0.0)
            || !at_least(delivery.max_backoff_sec, 1.0)
            || !above(delivery.give_up_after_hours, 0.0)
        {
            return Err(ConfigError::WebhookDeliveryTimes);
        }
        if delivery.concurrency == 0 {
            return Err(ConfigError::Zero {
                key: "webhook_delivery.concurrency",
            });
        }
        Ok(())
    }

    /// `[monitoring]` thresholds and `[metrics]` sampling.
    fn validate_monitoring(&self) -> Result<(), ConfigError> {
        let m = &self.monitoring;
        for (metric, warning, critical) in [
            ("cpu", m.cpu_warning_threshold, m.cpu_critical_threshold),
            (
                "memory",
                m.memory_warning_threshold,
                m.memory_critical_threshold,
            ),
            ("disk", m.disk_warning_threshold, m.disk_critical_threshold),
        ] {
            if !(0.0..=100.0).contains(&warning)
                || !(0.0..=100.0).contains(&critical)
                || warning > critical
            {
                return Err(ConfigError::Thresholds {
                    metric,
                    warning,
                    critical,
                });
            }
        }
        if !at_least(self.metrics.sample_interval_sec, 1.0)
            || !above(self.metrics.retention_days, 0.0)
        {
            return Err(ConfigError::MetricsTimes);
        }
        Ok(())
    }

    /// `[events]`, `api_keys` and `auth_enabled`.
    fn validate_events_and_keys(&self) -> Result<(), ConfigError> {
        if let Some(url) = &self.events.proxy_url {
            url::Url::parse(url).map_err(|source| ConfigError::EventsProxyUrl {
                url: url.clone(),
                source,
            })?;
        }
        if self
            .events
            .token_secret
            .as_deref()
            .is_some_and(|s| s.len() < 16)
        {
            return Err(ConfigError::TokenSecretShort);
        }
        check_api_keys(&self.api_keys)?;
        self.validate_tenants()
    }

    /// What a process serving the API needs beyond [`Self::validate`]: with
    /// `auth_enabled`, a key to accept. Not asked of an agent or a proxy
    /// reading the same file (the manifests give them one ConfigMap and no
    /// API key).
    pub fn validate_serving(&self) -> Result<(), ConfigError> {
        let tenant_keys = self.tenants.iter().any(|t| !t.api_keys.is_empty());
        if self.auth_enabled && self.api_keys.is_empty() && !tenant_keys {
            return Err(ConfigError::AuthWithoutKeys);
        }
        Ok(())
    }

    /// `[[tenants]]`: names well-formed and distinct, keys well-formed, no
    /// key in two places (it would be two scopes at once).
    fn validate_tenants(&self) -> Result<(), ConfigError> {
        let mut names = std::collections::HashSet::new();
        for (index, tenant) in self.tenants.iter().enumerate() {
            if !is_tenant_name(&tenant.name) || !names.insert(tenant.name.as_str()) {
                return Err(ConfigError::TenantName {
                    index,
                    name: tenant.name.clone(),
                });
            }
            check_api_keys(&tenant.api_keys)?;
        }
        let mut seen = std::collections::HashSet::new();
        let every_key = self
            .api_keys
            .iter()
            .chain(self.tenants.iter().flat_map(|t| t.api_keys.iter()));
        for key in every_key {
            let digest = key_digest(key)?;
            if !seen.insert(digest) {
                return Err(ConfigError::KeyTwice {
                    digest_start: hex::encode(&digest[..6]),
                });
            }
        }
        Ok(())
    }
}

/// `value > min` (false for NaN).
fn above(value: f64, min: f64) -> bool {
    value > min
}

/// `value >= min` (false for NaN).
fn at_least(value: f64, min: f64) -> bool {
    value >= min
}

/// An `api_keys` entry that is neither a raw key nor `sha256:<64 hex>`.
#[derive(Debug, thiserror::Error)]
pub enum ApiKeyError {
    #[error("api_keys: {entry:?} is not sha256:<64 hex>: {source}")]
    NotHex {
        entry: String,
        #[source]
        source: hex::FromHexError,
    },
    /// Hex, but not 32 bytes.
    #[error("api_keys: {entry:?} is not sha256:<64 hex>")]
    NotSha256 { entry: String },
}

/// `sha256:<hex>` as configured, or a raw key (hashed here, with a warning).
pub fn key_digest(entry: &str) -> Result<[u8; 32], ApiKeyError> {
    match entry.strip_prefix("sha256:") {
        Some(hex_digest) => {
            let bytes = hex::decode(hex_digest).map_err(|source| ApiKeyError::NotHex {
                entry: entry.to_owned(),
                source,
            })?;
            bytes.try_into().map_err(|_| ApiKeyError::NotSha256 {
                entry: entry.to_owned(),
            })
        }
        None => {
            tracing::warn!(
                "api_keys holds a raw key; store its hash instead (`flotilla keys create` prints the line)"
            );
            Ok(<sha2::Sha256 as sha2::Digest>::digest(entry.as_bytes()).into())
        }
    }
}

/// Checks the `api_keys` entries (for configuration validation).
pub fn check_api_keys(keys: &[String]) -> Result<(), ApiKeyError> {
    keys.iter().try_for_each(|k| key_digest(k).map(drop))
}
