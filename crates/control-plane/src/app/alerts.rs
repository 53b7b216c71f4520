//! Alerts from the `[monitoring]` thresholds, evaluated with every metrics
//! sample, for each node and for the cluster:
//!
//! - `cpu`, `memory`, `disk` (percent; CPU and memory smoothed over about a
//!   minute): `warning` at `<metric>_warning_threshold`, `critical` at
//!   `<metric>_critical_threshold`;
//! - `offline`: `critical` while a node is offline; for the cluster, while
//!   nodes are registered and none is online;
//! - `capacity` (percent of instance slots used): `info` when a node is full
//!   (it takes no more instances), `warning` when every online node is.
//!
//! A condition that changes level clears its alert and raises one at the new
//! level; one that ends clears it. Each raise and clear is an event
//! (`alert.raised`, `alert.cleared`) for webhooks and the event proxy.

use std::collections::BTreeMap;

use flotilla_api_types::alerts::{Alert, AlertLevel, AlertList, ListAlertsQuery};
use flotilla_api_types::nodes::NodeStatus;

use crate::app::ControlPlane;
use crate::error::{Error, Result};
use crate::store::{AlertRecord, NewAlert};

/// What a condition calls for now.
struct Reading {
    level: Option<AlertLevel>,
    value: f64,
    threshold: f64,
    message: String,
}

fn level_of(value: f64, warning: f64, critical: f64) -> (Option<AlertLevel>, f64) {
    if value >= critical {
        (Some(AlertLevel::Critical), critical)
    } else if value >= warning {
        (Some(AlertLevel::Warning), warning)
    } else {
        (None, warning)
    }
}

impl ControlPlane {
    /// Raises and clears alerts to match the current readings.
    pub async fn alerts_evaluate(&self) -> Result<()> {
        let now = self.now();
        let readings = self.alert_readings().await?;
        let mut active: BTreeMap<(String, String), AlertRecord> = self
            .store
            .alerts_active()
            .await?
            .into_iter()
            .map(|a| ((a.scope.clone(), a.metric.clone()), a))
            .collect();
        for ((scope, metric), reading) in readings {
            let current = active.remove(&(scope.clone(), metric.clone()));
            if current.as_ref().map(|a| a.level) == reading.level {
                continue;
            }
            if let Some(alert) = &current {
                self.store.alert_clear(alert, reading.value, now).await?;
                tracing::info!(scope, metric, level = alert.level.as_str(), "alert cleared");
            }
            if let Some(level) = reading.level {
                tracing::warn!(
                    scope,
                    metric,
                    level = level.as_str(),
                    reading.message,
                    "alert raised"
                );
                self.store
                    .alert_raise(
                        NewAlert {
                            scope,
                            metric,
                            level,
                            value: reading.value,
                            threshold: reading.threshold,
                            message: reading.message,
                        },
                        now,
                    )
                    .await?;
            }
        }
        // Alerts about nodes that no longer exist.
        for alert in active.into_values() {
            self.store.alert_clear(&alert, 0.0, now).await?;
        }
        Ok(())
    }

    async fn alert_readings(&self) -> Result<BTreeMap<(String, String), Reading>> {
        let m = &self.config.monitoring;
        let nodes = self.store.node_list().await?;
        let occupancy = self.store.node_occupancy().await?;
        let mut readings = BTreeMap::new();
        let mut add = |scope: &str, metric: &str, reading: Reading| {
            readings.insert((scope.to_owned(), metric.to_owned()), reading);
        };
        let resource = |what: &str, name: &str, value: f64, warning: f64, critical: f64| {
            let (level, threshold) = level_of(value, warning, critical);
            Reading {
                level,
                value,
                threshold,
                message: format!("{what}: {name} at {value:.1} % (threshold {threshold} %)"),
            }
        };
        let online: Vec<_> = nodes
            .iter()
            .filter(|n| n.status == NodeStatus::Online)
            .collect();
        for node in &nodes {
            let scope = format!("node:{}", node.id);
            let what = format!("node {}", node.id);
            let is_offline = node.status == NodeStatus::Offline;
            add(
                &scope,
                "offline",
                Reading {
                    level: is_offline.then_some(AlertLevel::Critical),
                    value: f64::from(u8::from(is_offline)),
                    threshold: 1.0,
                    message: format!("{what} is offline (no heartbeat)"),
                },
            );
            if is_offline {
                continue;
            }
            add(
                &scope,
                "cpu",
                resource(
                    &what,
                    "CPU",
                    node.load.cpu_percent,
                    m.cpu_warning_threshold,
                    m.cpu_critical_threshold,
                ),
            );
            add(
                &scope,
                "memory",
                resource(
                    &what,
                    "memory",
                    node.load.memory_percent,
                    m.memory_warning_threshold,
                    m.memory_critical_threshold,
                ),
            );
            add(
                &scope,
                "disk",
                resource(
                    &what,
                    "disk",
                    node.resources.disk_percent,
                    m.disk_warning_threshold,
                    m.disk_critical_threshold,
                ),
            );
            let used = occupancy
                .iter()
                .find(|(id, _)| *id == node.id)
                .map_or(0, |(_, n)| *n);
            let percent = if node.max_instances > 0 {
                used as f64 * 100.0 / node.max_instances as f64
            } else {
                100.0
            };
            add(
                &scope,
                "capacity",
                Reading {
                    level: (percent >= 100.0).then_some(AlertLevel::Info),
                    value: percent,
                    threshold: 100.0,
                    message: format!(
                        "{what} is full ({used} of {} instances): new instances go elsewhere",
                        node.max_instances
                    ),
                },
            );
        }
        if nodes.is_empty() {
            return Ok(readings);
        }
        let none_online = online.is_empty();
        add(
            "cluster",
            "offline",
            Reading {
                level: none_online.then_some(AlertLevel::Critical),
                value: f64::from(u8::from(none_online)),
                threshold: 1.0,
                message: "no node is online: instances cannot be placed".into(),
            },
        );
        if none_online {
            return Ok(readings);
        }
        let avg = |f: &dyn Fn(&crate::store::NodeRecord) -> f64| {
            online.iter().map(|n| f(n)).sum::<f64>() / online.len() as f64
        };
        add(
            "cluster",
            "cpu",
            resource(
                "cluster",
                "average CPU",
                avg(&|n| n.load.cpu_percent),
                m.cpu_warning_threshold,
                m.cpu_critical_threshold,
            ),
        );
        add(
            "cluster",
            "memory",
            resource(
                "cluster",
                "average memory",
                avg(&|n| n.load.memory_percent),
                m.memory_warning_threshold,
                m.memory_critical_threshold,
            ),
        );
        add(
            "cluster",
            "disk",
            resource(
                "cluster",
                "average disk",
                avg(&|n| n.resources.disk_percent),
                m.disk_warning_threshold,
                m.disk_critical_threshold,
            ),
        );
        let slots: i64 = online.iter().map(|n| n.max_instances).sum();
        let used: i64 = occupancy
            .iter()
            .filter(|(id, _)| online.iter().any(|n| n.id == *id))
            .map(|(_, n)| n)
            .sum();
        let percent = if slots > 0 {
            used as f64 * 100.0 / slots as f64
        } else {
            100.0
        };
        add(
            "cluster",
            "capacity",
            Reading {
                level: (percent >= 100.0).then_some(AlertLevel::Warning),
                value: percent,
                threshold: 100.0,
                message: format!(
                    "the cluster is full ({used} of {slots} instance slots): creates get 503"
                ),
            },
        );
        Ok(readings)
    }

    /// `GET /v2/alerts`.
    pub async fn alerts_list(&self, query: ListAlertsQuery) -> Result<AlertList> {
        let limit = query.limit.unwrap_or(100);
        let offset = query.offset.unwrap_or(0);
        if !(1..=1000).contains(&limit) {
            return Err(Error::InvalidRequest(format!(
                "limit must be 1..=1000 (got {limit})"
            )));
        }
        if offset < 0 {
            return Err(Error::InvalidRequest(format!(
                "offset must be >= 0 (got {offset})"
            )));
        }
        let (records, total) = self
            .store
            .alerts_list(query.state.unwrap_or_default(), limit, offset)
            .await?;
        Ok(AlertList {
            alerts: records.into_iter().map(alert_view).collect(),
            total,
            limit,
            offset,
        })
    }
}

fn alert_view(record: AlertRecord) -> Alert {
    let (scope, node_id) = match record.scope.strip_prefix("node:") {
        Some(node) => ("node".to_owned(), Some(node.to_owned())),
        None => (record.scope.clone(), None),
    };
    Alert {
        id: record.id,
        scope,
        node_id,
        metric: record.metric,
        level: record.level,
        value: record.value,
        threshold: record.threshold,
        message: record.message,
        raised_at: record.raised_at,
        cleared_at: record.cleared_at,
    }
}
