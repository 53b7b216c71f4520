//! Control-plane configuration: the top-level keys and sections of the TOML file
//! that the control plane owns (DESIGN.md, "Configuration files"). Loaded by the
//! CLI; every key is documented in `docs/configuration.md`.

use serde::{Deserialize, Serialize};

/// Settings of the control plane (top-level keys and their sections; unknown
/// keys are caught by the loader, since this struct is flattened into the file).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
#[derive(Default)]
pub struct ControlPlaneConfig {
    /// Require `Authorization: Bearer <API_KEY>` on the API (spec: Authentication).
    pub auth_enabled: bool,
    /// Accepted API keys, as `sha256:<hex>` (a raw key is accepted with a warning).
    pub api_keys: Vec<String>,
    /// Shared secret between control planes and agents for the agent API.
    pub cluster_token: Option<String>,
    pub nodes: NodesConfig,
    pub store: StoreConfig,
    pub scheduler: SchedulerConfig,
}

/// `[nodes]`: heartbeats and node health.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct NodesConfig {
    /// Seconds between an agent's heartbeats (told to agents when they register).
    pub heartbeat_interval_sec: f64,
    /// A node whose last heartbeat is older than this is offline (spec: 60 s).
    pub heartbeat_timeout_sec: f64,
}

impl Default for NodesConfig {
    fn default() -> Self {
        Self {
            heartbeat_interval_sec: 5.0,
            heartbeat_timeout_sec: 60.0,
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
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        Self {
            candidates: 2,
            max_utilisation_percent: 90.0,
        }
    }
}

impl ControlPlaneConfig {
    /// Checks values that serde cannot; the message names the key.
    pub fn validate(&self) -> Result<(), String> {
        if self.nodes.heartbeat_interval_sec.is_nan() || self.nodes.heartbeat_interval_sec <= 0.0 {
            return Err("nodes.heartbeat_interval_sec must be > 0".into());
        }
        if self.nodes.heartbeat_timeout_sec.is_nan()
            || self.nodes.heartbeat_timeout_sec <= self.nodes.heartbeat_interval_sec
        {
            return Err(format!(
                "nodes.heartbeat_timeout_sec ({}) must be greater than nodes.heartbeat_interval_sec ({})",
                self.nodes.heartbeat_timeout_sec, self.nodes.heartbeat_interval_sec
            ));
        }
        if self.scheduler.candidates == 0 {
            return Err("scheduler.candidates must be at least 1".into());
        }
        if self.store.max_connections == 0 {
            return Err("store.max_connections must be at least 1".into());
        }
        if self.auth_enabled && self.api_keys.is_empty() {
            return Err("auth_enabled = true needs at least one entry in api_keys (create one with `flotilla keys create`)".into());
        }
        Ok(())
    }
}
