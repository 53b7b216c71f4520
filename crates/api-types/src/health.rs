//! The control plane's `GET /health` response.

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
}

/// The create queue in `/health`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct CreateQueueHealth {
    pub waiting: usize,
    /// How long the oldest waiting create has waited, in seconds.
    pub oldest_wait_sec: f64,
}
