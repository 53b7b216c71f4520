//! `GET /v2/alerts`: alerts raised from the `monitoring` thresholds.

use std::str::FromStr;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use crate::names::UnknownName;

/// Spec: alert levels info, warning and critical.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum AlertLevel {
    Info,
    Warning,
    Critical,
}

impl AlertLevel {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Info => "info",
            Self::Warning => "warning",
            Self::Critical => "critical",
        }
    }
}

impl FromStr for AlertLevel {
    type Err = UnknownName;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "info" => Ok(Self::Info),
            "warning" => Ok(Self::Warning),
            "critical" => Ok(Self::Critical),
            other => Err(UnknownName::new("alert level", other)),
        }
    }
}

/// Which alerts a list holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum AlertState {
    /// Raised and not cleared (default).
    #[default]
    Active,
    Cleared,
    All,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Alert {
    pub id: String,
    /// `cluster` or `node`.
    pub scope: String,
    /// The node, for node alerts.
    pub node_id: Option<String>,
    /// `cpu`, `memory`, `disk` (percent), `offline`, `capacity` (percent of slots).
    pub metric: String,
    pub level: AlertLevel,
    /// The value that raised the alert.
    pub value: f64,
    /// The threshold it crossed.
    pub threshold: f64,
    pub message: String,
    pub raised_at: DateTime<Utc>,
    pub cleared_at: Option<DateTime<Utc>>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct AlertList {
    pub alerts: Vec<Alert>,
    pub total: i64,
    pub limit: i64,
    pub offset: i64,
}

/// Query of `GET /v2/alerts`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListAlertsQuery {
    /// `active` (default), `cleared` or `all`.
    pub state: Option<AlertState>,
    /// Page size, 1..=1000 (default 100).
    #[param(minimum = 1, maximum = 1000, default = 100)]
    pub limit: Option<i64>,
    /// Alerts to skip, >= 0.
    #[param(minimum = 0, default = 0)]
    pub offset: Option<i64>,
}
