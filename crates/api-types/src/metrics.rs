//! `GET /v2/metrics` (spec: Metrics response).

use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

/// Spec: 1h, 24h, 7d (default 24h).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub enum MetricsPeriod {
    #[serde(rename = "1h")]
    Hour,
    #[default]
    #[serde(rename = "24h")]
    Day,
    #[serde(rename = "7d")]
    Week,
}

impl MetricsPeriod {
    pub fn seconds(self) -> i64 {
        match self {
            Self::Hour => 3600,
            Self::Day => 86_400,
            Self::Week => 7 * 86_400,
        }
    }

    /// The spacing of the time series (DESIGN.md: 1h → 1 min, 24h → 5 min, 7d → 1 h).
    pub fn step_seconds(self) -> i64 {
        match self {
            Self::Hour => 60,
            Self::Day => 300,
            Self::Week => 3600,
        }
    }

    pub fn interval(self) -> &'static str {
        match self {
            Self::Hour => "1m",
            Self::Day => "5m",
            Self::Week => "1h",
        }
    }
}

/// Query of `GET /v2/metrics`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct MetricsQuery {
    /// Only this node.
    pub node_id: Option<String>,
    /// `1h`, `24h` (default) or `7d`.
    pub period: Option<MetricsPeriod>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ClusterMetrics {
    pub total_instances: i64,
    pub running_instances: i64,
    pub dormant_instances: i64,
    pub failed_instances: i64,
    pub nodes_online: i64,
    pub nodes_offline: i64,
    pub avg_cpu_percent: f64,
    pub avg_memory_percent: f64,
}

/// Averages over the period.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ResourceMetrics {
    pub avg_cpu_percent: f64,
    pub avg_memory_percent: f64,
    pub avg_disk_percent: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Timeseries {
    /// Spacing of the points: `1m`, `5m` or `1h`.
    pub interval: String,
    pub timestamps: Vec<chrono::DateTime<chrono::Utc>>,
    pub cpu: Vec<f64>,
    pub memory: Vec<f64>,
    pub instances: Vec<i64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct MetricsResponse {
    pub cluster: ClusterMetrics,
    pub resources: ResourceMetrics,
    pub timeseries: Timeseries,
}
