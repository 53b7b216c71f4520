//! The control plane's `GET /health` response.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Overall state: `healthy`; `degraded` when a component is down but the API
/// serves (HTTP 200); `unhealthy` when it cannot serve (HTTP 503).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum HealthStatus {
    Healthy,
    Degraded,
    Unhealthy,
}

/// State of one component: `up`, `down`, or `disabled` (not configured).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ComponentStatus {
    Up,
    Down,
    Disabled,
}

/// The components of the control plane.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct HealthComponents {
    /// The HTTP API.
    pub api: ComponentStatus,
    /// The store (SQLite or PostgreSQL) answers a query.
    pub storage: ComponentStatus,
    /// The event proxy link (`disabled` when no proxy is configured).
    pub messaging: ComponentStatus,
    /// At least one node is online and accepts placements.
    pub scheduler: ComponentStatus,
}

/// Health response.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Health {
    pub status: HealthStatus,
    pub instances_count: i64,
    pub running_instances: i64,
    pub components: HealthComponents,
    /// Creates waiting for room (`POST /v2/instances?wait_sec=`), when any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub create_queue: Option<CreateQueueHealth>,
    /// What makes the service `degraded` (absent when healthy).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    /// The control plane's background work: its timed sweeps and the work
    /// requests left running (absent before any has run).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub background: Vec<BackgroundTaskHealth>,
}

/// One background task in `/health`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct BackgroundTaskHealth {
    /// `node offline sweep`, `idle sweep`, `lifetime sweep`, `drain
    /// takeover`, `metrics sample`; `node drain` (a drain this control
    /// plane runs); `node strays` (stopping instances a node runs and the store
    /// does not have), `door relay` (WebSocket connections through the
    /// front door), `park`, `revive`, `delete` (those requests, which run to
    /// their end whether their client waits or not).
    pub name: String,
    /// Runs that ended (for work, each piece that finished).
    pub runs: u64,
    /// Runs that failed.
    pub failures: u64,
    /// Timed runs left to another control plane of the cluster (which
    /// holds the task's lease).
    pub skipped: u64,
    /// Pieces of work running now.
    pub running: u64,
    /// What the timed runs changed, summed: nodes marked offline (node
    /// offline sweep), instances parked or stopped (idle sweep), instances
    /// ended (lifetime sweep), drains taken over from a control plane that
    /// stopped (drain takeover), MCP sessions ended (mcp session expiry),
    /// instances of a stopped control plane deleted (held instance
    /// takeover), holds renewed (held instance renewal), old events pruned
    /// (metrics sample).
    #[serde(default)]
    pub changed: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_run_at: Option<DateTime<Utc>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_success_at: Option<DateTime<Utc>>,
    /// The last run failed.
    pub failing: bool,
    /// When the last run failed, while no run has succeeded since.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error_at: Option<DateTime<Utc>>,
    /// Its error; shown only to a caller with an API key (or with
    /// authentication off), as it may name internal addresses.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
}

/// The create queue in `/health`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct CreateQueueHealth {
    pub waiting: usize,
    /// How long the oldest waiting create has waited, in seconds.
    pub oldest_wait_sec: f64,
}
