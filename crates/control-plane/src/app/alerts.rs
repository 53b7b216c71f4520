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
use crate::config::MonitoringConfig;
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

/// One node as the alert readings see it.
#[derive(Debug, Clone)]
struct NodeLoad {
    id: String,
    online: bool,
    cpu_percent: f64,
    memory_percent: f64,
    disk_percent: f64,
    /// Instance slots in use.
    used: i64,
    max_instances: i64,
}

/// The readings by (scope, metric): `node:<id>` or `cluster`.
type Readings = BTreeMap<(String, String), Reading>;

/// A resource metric: its name, what messages call it, its value for a node
/// and its (warning, critical) thresholds.
struct ResourceMetric {
    metric: &'static str,
    name: &'static str,
    value: fn(&NodeLoad) -> f64,
    thresholds: fn(&MonitoringConfig) -> (f64, f64),
}

const RESOURCE_METRICS: [ResourceMetric; 3] = [
    ResourceMetric {
        metric: "cpu",
        name: "CPU",
        value: |n| n.cpu_percent,
        thresholds: |m| (m.cpu_warning_threshold, m.cpu_critical_threshold),
    },
    ResourceMetric {
        metric: "memory",
        name: "memory",
        value: |n| n.memory_percent,
        thresholds: |m| (m.memory_warning_threshold, m.memory_critical_threshold),
    },
    ResourceMetric {
        metric: "disk",
        name: "disk",
        value: |n| n.disk_percent,
        thresholds: |m| (m.disk_warning_threshold, m.disk_critical_threshold),
    },
];

impl ResourceMetric {
    fn reading(&self, what: &str, name: &str, value: f64, m: &MonitoringConfig) -> Reading {
        let (warning, critical) = (self.thresholds)(m);
        let (level, threshold) = level_of(value, warning, critical);
        Reading {
            level,
            value,
            threshold,
            message: format!("{what}: {name} at {value:.1} % (threshold {threshold} %)"),
        }
    }
}

/// A yes/no condition that is critical while it holds.
fn critical_while(holds: bool, message: String) -> Reading {
    Reading {
        level: holds.then_some(AlertLevel::Critical),
        value: f64::from(u8::from(holds)),
        threshold: 1.0,
        message,
    }
}

/// Percent of slots used (100 when there are none).
fn slots_percent(used: i64, slots: i64) -> f64 {
    if slots > 0 {
        used as f64 * 100.0 / slots as f64
    } else {
        100.0
    }
}

/// Every reading of every node and of the cluster, from the nodes alone.
fn alert_readings(nodes: &[NodeLoad], m: &MonitoringConfig) -> Readings {
    let mut readings = Readings::new();
    for node in nodes {
        node_readings(node, m, &mut readings);
    }
    if !nodes.is_empty() {
        cluster_readings(nodes, m, &mut readings);
    }
    readings
}

fn node_readings(node: &NodeLoad, m: &MonitoringConfig, readings: &mut Readings) {
    let scope = format!("node:{}", node.id);
    let what = format!("node {}", node.id);
    let mut add = |metric: &str, reading| {
        readings.insert((scope.clone(), metric.to_owned()), reading);
    };
    add(
        "offline",
        critical_while(!node.online, format!("{what} is offline (no heartbeat)")),
    );
    if !node.online {
        return;
    }
    for resource in &RESOURCE_METRICS {
        add(
            resource.metric,
            resource.reading(&what, resource.name, (resource.value)(node), m),
        );
    }
    let percent = slots_percent(node.used, node.max_instances);
    add(
        "capacity",
        Reading {
            level: (percent >= 100.0).then_some(AlertLevel::Info),
            value: percent,
            threshold: 100.0,
            message: format!(
                "{what} is full ({} of {} instances): new instances go elsewhere",
                node.used, node.max_instances
            ),
        },
    );
}

fn cluster_readings(nodes: &[NodeLoad], m: &MonitoringConfig, readings: &mut Readings) {
    let mut add = |metric: &str, reading| {
        readings.insert(("cluster".to_owned(), metric.to_owned()), reading);
    };
    let online: Vec<&NodeLoad> = nodes.iter().filter(|n| n.online).collect();
    add(
        "offline",
        critical_while(
            online.is_empty(),
            "no node is online: instances cannot be placed".into(),
        ),
    );
    if online.is_empty() {
        return;
    }
    for resource in &RESOURCE_METRICS {
        let average = online.iter().map(|n| (resource.value)(n)).sum::<f64>() / online.len() as f64;
        let name = format!("average {}", resource.name);
        add(
            resource.metric,
            resource.reading("cluster", &name, average, m),
        );
    }
    let slots: i64 = online.iter().map(|n| n.max_instances).sum();
    let used: i64 = online.iter().map(|n| n.used).sum();
    let percent = slots_percent(used, slots);
    add(
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
}

impl ControlPlane {
    /// Raises and clears alerts to match the current readings.
    pub async fn alerts_evaluate(&self) -> Result<()> {
        let now = self.now();
        let readings = alert_readings(&self.alert_inputs().await?, &self.config.monitoring);
        let mut active: BTreeMap<(String, String), AlertRecord> = self
            .store
            .alerts_active()
            .await?
            .into_iter()
            .map(|a| ((a.alert.scope.clone(), a.alert.metric.clone()), a))
            .collect();
        for ((scope, metric), reading) in readings {
            let current = active.remove(&(scope.clone(), metric.clone()));
            if current.as_ref().map(|a| a.alert.level) == reading.level {
                continue;
            }
            if let Some(alert) = &current {
                self.store.alert_clear(alert, reading.value, now).await?;
                tracing::info!(
                    scope,
                    metric,
                    level = alert.alert.level.as_str(),
                    "alert cleared"
                );
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

    /// What the readings are computed from, read from the store.
    async fn alert_inputs(&self) -> Result<Vec<NodeLoad>> {
        let occupancy = self.store.node_occupancy().await?;
        let nodes = self.store.node_list().await?;
        Ok(nodes
            .into_iter()
            .map(|node| NodeLoad {
                used: occupancy
                    .iter()
                    .find(|(id, _)| *id == node.id)
                    .map_or(0, |(_, n)| *n),
                online: node.status == NodeStatus::Online,
                cpu_percent: node.load.cpu_percent,
                memory_percent: node.load.memory_percent,
                disk_percent: node.resources.disk_percent,
                max_instances: node.max_instances,
                id: node.id.to_string(),
            })
            .collect())
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
    let alert = record.alert;
    let (scope, node_id) = match alert.scope.strip_prefix("node:") {
        Some(node) => ("node".to_owned(), Some(node.to_owned())),
        None => (alert.scope.clone(), None),
    };
    Alert {
        id: record.id,
        scope,
        node_id,
        metric: alert.metric,
        level: alert.level,
        value: alert.value,
        threshold: alert.threshold,
        message: alert.message,
        raised_at: record.raised_at,
        cleared_at: record.cleared_at,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(id: &str, online: bool, cpu: f64, used: i64, max: i64) -> NodeLoad {
        NodeLoad {
            id: id.into(),
            online,
            cpu_percent: cpu,
            memory_percent: 10.0,
            disk_percent: 10.0,
            used,
            max_instances: max,
        }
    }

    fn level(readings: &Readings, scope: &str, metric: &str) -> Option<AlertLevel> {
        readings[&(scope.to_owned(), metric.to_owned())].level
    }

    #[test]
    fn no_nodes_no_readings() {
        assert!(alert_readings(&[], &MonitoringConfig::default()).is_empty());
    }

    #[test]
    fn resources_rise_to_warning_then_critical_at_their_thresholds() {
        let m = MonitoringConfig::default();
        let readings = alert_readings(
            &[
                node("a", true, 69.9, 0, 4),
                node("b", true, 70.0, 0, 4),
                node("c", true, 90.0, 0, 4),
            ],
            &m,
        );
        assert_eq!(level(&readings, "node:a", "cpu"), None);
        assert_eq!(level(&readings, "node:b", "cpu"), Some(AlertLevel::Warning));
        assert_eq!(
            level(&readings, "node:c", "cpu"),
            Some(AlertLevel::Critical)
        );
        let c = &readings[&("node:c".to_owned(), "cpu".to_owned())];
        assert_eq!(c.threshold, 90.0);
        assert_eq!(c.message, "node c: CPU at 90.0 % (threshold 90 %)");
        // The cluster's CPU is the average of the three: 76.6 %.
        let cluster = &readings[&("cluster".to_owned(), "cpu".to_owned())];
        assert_eq!(cluster.level, Some(AlertLevel::Warning));
        assert!((cluster.value - 76.633).abs() < 0.01, "{}", cluster.value);
        assert_eq!(level(&readings, "node:a", "memory"), None);
        assert_eq!(level(&readings, "cluster", "disk"), None);
    }

    #[test]
    fn an_offline_node_has_only_its_offline_alert_and_leaves_the_averages() {
        let readings = alert_readings(
            &[
                node("up", true, 10.0, 1, 4),
                node("down", false, 99.0, 0, 4),
            ],
            &MonitoringConfig::default(),
        );
        assert_eq!(
            level(&readings, "node:down", "offline"),
            Some(AlertLevel::Critical)
        );
        assert!(!readings.contains_key(&("node:down".to_owned(), "cpu".to_owned())));
        assert_eq!(level(&readings, "node:up", "offline"), None);
        assert_eq!(level(&readings, "cluster", "offline"), None);
        assert_eq!(
            readings[&("cluster".to_owned(), "cpu".to_owned())].value,
            10.0
        );
        assert_eq!(
            readings[&("cluster".to_owned(), "capacity".to_owned())].value,
            25.0
        );
    }

    #[test]
    fn with_every_node_offline_the_cluster_is_critical_and_nothing_else() {
        let readings = alert_readings(&[node("a", false, 0.0, 0, 4)], &MonitoringConfig::default());
        assert_eq!(
            level(&readings, "cluster", "offline"),
            Some(AlertLevel::Critical)
        );
        let cluster: Vec<_> = readings.keys().filter(|(s, _)| s == "cluster").collect();
        assert_eq!(cluster.len(), 1, "{cluster:?}");
    }

    #[test]
    fn a_full_node_is_info_and_a_full_cluster_a_warning() {
        let m = MonitoringConfig::default();
        let readings = alert_readings(
            &[node("a", true, 0.0, 4, 4), node("b", true, 0.0, 1, 4)],
            &m,
        );
        assert_eq!(
            level(&readings, "node:a", "capacity"),
            Some(AlertLevel::Info)
        );
        assert_eq!(level(&readings, "node:b", "capacity"), None);
        assert_eq!(level(&readings, "cluster", "capacity"), None);
        let readings = alert_readings(
            &[node("a", true, 0.0, 4, 4), node("z", true, 0.0, 0, 0)],
            &m,
        );
        // A node without slots counts as full.
        assert_eq!(
            level(&readings, "node:z", "capacity"),
            Some(AlertLevel::Info)
        );
        let cluster = &readings[&("cluster".to_owned(), "capacity".to_owned())];
        assert_eq!(cluster.level, Some(AlertLevel::Warning));
        assert_eq!(
            cluster.message,
            "the cluster is full (4 of 4 instance slots): creates get 503"
        );
    }
}
