//! Metrics: resource samples taken every `metrics.sample_interval_sec` into the
//! store (per node, and for the cluster), `GET /v2/metrics` built from them,
//! and the gauges of `GET /metrics`.

use chrono::{DateTime, Duration, TimeZone, Utc};

use flotilla_api_types::NodeId;
use flotilla_api_types::instances::InstanceStatus;
use flotilla_api_types::metrics::{
    ClusterMetrics, MetricsPeriod, MetricsQuery, MetricsResponse, ResourceMetrics, Timeseries,
};
use flotilla_api_types::nodes::NodeStatus;

use crate::app::{ControlPlane, Scope};
use crate::error::{Error, Result};
use crate::store::{MetricSample, NodeRecord};
use crate::telemetry::Gauges;

/// The node id of cluster-wide samples.
const CLUSTER: &str = "";

fn average(values: impl Iterator<Item = f64>) -> f64 {
    let (sum, count) = values.fold((0.0, 0usize), |(s, n), v| (s + v, n + 1));
    if count == 0 {
        0.0
    } else {
        round2(sum / count as f64)
    }
}

fn round2(value: f64) -> f64 {
    (value * 100.0).round() / 100.0
}

impl ControlPlane {
    /// Takes one sample of every online node and of the cluster; prunes old ones.
    pub async fn metrics_sample(&self) -> Result<()> {
        let now = self.now();
        let nodes = self.store.node_list().await?;
        let occupancy = self.store.node_occupancy().await?;
        let online: Vec<&NodeRecord> = nodes
            .iter()
            .filter(|n| n.status == NodeStatus::Online)
            .collect();
        let instances_on = |node: &NodeId| {
            occupancy
                .iter()
                .find(|(id, _)| id == node)
                .map_or(0, |(_, n)| *n)
        };
        let mut samples: Vec<MetricSample> = online
            .iter()
            .map(|node| MetricSample {
                node_id: node.id.as_str().to_owned(),
                at: now,
                cpu_percent: node.resources.cpu_percent,
                memory_percent: node.resources.memory_percent,
                disk_percent: node.resources.disk_percent,
                instances: instances_on(&node.id),
            })
            .collect();
        samples.push(MetricSample {
            node_id: CLUSTER.into(),
            at: now,
            cpu_percent: average(online.iter().map(|n| n.resources.cpu_percent)),
            memory_percent: average(online.iter().map(|n| n.resources.memory_percent)),
            disk_percent: average(online.iter().map(|n| n.resources.disk_percent)),
            instances: occupancy.iter().map(|(_, n)| n).sum(),
        });
        self.store.metric_samples_insert(&samples).await?;
        let retention =
            Duration::milliseconds((self.config.metrics.retention_days * 86_400_000.0) as i64);
        self.store.metric_samples_prune(now - retention).await?;
        Ok(())
    }

    /// `GET /v2/metrics`: the fleet's, or for a tenant's key its own
    /// instances' counts (the fleet's figures, nodes and resources, are not
    /// its own: 0, and no series).
    pub async fn metrics(&self, query: MetricsQuery, scope: &Scope) -> Result<MetricsResponse> {
        let period = query.period.unwrap_or_default();
        if let Some(tenant) = scope.tenant() {
            if let Some(id) = &query.node_id {
                return Err(Error::NotFound(format!("node {id} not found")));
            }
            let counts = self.store.instance_counts_of_tenant(tenant).await?;
            return Ok(MetricsResponse {
                cluster: instance_totals(&counts),
                resources: ResourceMetrics {
                    avg_cpu_percent: 0.0,
                    avg_memory_percent: 0.0,
                    avg_disk_percent: 0.0,
                },
                timeseries: timeseries(&[], period),
            });
        }
        let nodes = self.store.node_list().await?;
        let node = match &query.node_id {
            Some(id) => Some(
                nodes
                    .iter()
                    .find(|n| n.id.as_str() == id)
                    .ok_or_else(|| Error::NotFound(format!("node {id} not found")))?,
            ),
            None => None,
        };
        let scoped: Vec<&NodeRecord> = match node {
            Some(node) => vec![node],
            None => nodes.iter().collect(),
        };
        let online: Vec<&&NodeRecord> = scoped
            .iter()
            .filter(|n| n.status == NodeStatus::Online)
            .collect();
        let counts = match node {
            Some(node) => {
                let on_node = self
                    .store
                    .instances_on_node(&node.id, &InstanceStatus::ALL)
                    .await?;
                InstanceStatus::ALL
                    .iter()
                    .map(|s| (*s, on_node.iter().filter(|r| r.status == *s).count() as i64))
                    .collect()
            }
            None => self.store.instance_counts().await?,
        };
        let cluster = ClusterMetrics {
            nodes_online: online.len() as i64,
            nodes_offline: (scoped.len() - online.len()) as i64,
            avg_cpu_percent: average(online.iter().map(|n| n.resources.cpu_percent)),
            avg_memory_percent: average(online.iter().map(|n| n.resources.memory_percent)),
            ..instance_totals(&counts)
        };
        let series_of = node.map_or(CLUSTER, |n| n.id.as_str());
        let now = self.now();
        let samples = self
            .store
            .metric_samples_since(series_of, now - Duration::seconds(period.seconds()))
            .await?;
        Ok(MetricsResponse {
            cluster,
            resources: ResourceMetrics {
                avg_cpu_percent: average(samples.iter().map(|s| s.cpu_percent)),
                avg_memory_percent: average(samples.iter().map(|s| s.memory_percent)),
                avg_disk_percent: average(samples.iter().map(|s| s.disk_percent)),
            },
            timeseries: timeseries(&samples, period),
        })
    }

    /// The gauges of `GET /metrics`, read from the store.
    pub async fn prometheus_gauges(&self) -> Result<Gauges> {
        let counts = self.store.instance_counts().await?;
        let instances_by_status = InstanceStatus::ALL
            .iter()
            .map(|status| {
                let n = counts
                    .iter()
                    .find(|(s, _)| s == status)
                    .map_or(0, |(_, n)| *n);
                (status.as_str().to_owned(), n)
            })
            .collect();
        let nodes = self.store.node_list().await?;
        let node_cpu = nodes
            .iter()
            .map(|n| (n.id.as_str().to_owned(), n.resources.cpu_percent))
            .collect();
        // Only nodes online now: an offline node's pool is gone with it.
        let warm_pools = self.heard_from_online(&nodes, |heard| &heard.warm_pools);
        let node_loops = self.heard_from_online(&nodes, |heard| &heard.loops);
        Ok(Gauges {
            instances_by_status,
            node_cpu,
            warm_pools,
            node_loops,
            outbox_depth: self.store.outbox_depth().await?,
            create_queue_length: self.create_queue.snapshot().0,
            background: self.tasks.report(false),
        })
    }
}

/// Instances by status as [`ClusterMetrics`] (the node figures 0).
fn instance_totals(counts: &[(InstanceStatus, i64)]) -> ClusterMetrics {
    let count = |status: InstanceStatus| {
        counts
            .iter()
            .filter(|(s, _)| *s == status)
            .map(|(_, n)| n)
            .sum::<i64>()
    };
    ClusterMetrics {
        total_instances: counts.iter().map(|(_, n)| n).sum(),
        running_instances: count(InstanceStatus::Running),
        dormant_instances: count(InstanceStatus::Dormant),
        failed_instances: count(InstanceStatus::Failed),
        nodes_online: 0,
        nodes_offline: 0,
        avg_cpu_percent: 0.0,
        avg_memory_percent: 0.0,
    }
}

/// Samples averaged into the period's steps (buckets aligned to the step);
/// steps without samples are left out.
fn timeseries(samples: &[MetricSample], period: MetricsPeriod) -> Timeseries {
    let step_ms = period.step_seconds() * 1000;
    let mut series = Timeseries {
        interval: period.interval().into(),
        timestamps: Vec::new(),
        cpu: Vec::new(),
        memory: Vec::new(),
        instances: Vec::new(),
    };
    let mut index = 0;
    while index < samples.len() {
        let bucket = samples[index].at.timestamp_millis().div_euclid(step_ms);
        let end = samples[index..]
            .iter()
            .position(|s| s.at.timestamp_millis().div_euclid(step_ms) != bucket)
            .map_or(samples.len(), |offset| index + offset);
        let group = &samples[index..end];
        let at: DateTime<Utc> = Utc
            .timestamp_millis_opt(bucket * step_ms)
            .single()
            .unwrap_or_default();
        series.timestamps.push(at);
        series
            .cpu
            .push(average(group.iter().map(|s| s.cpu_percent)));
        series
            .memory
            .push(average(group.iter().map(|s| s.memory_percent)));
        series.instances.push(
            (group.iter().map(|s| s.instances).sum::<i64>() as f64 / group.len() as f64).round()
                as i64,
        );
        index = end;
    }
    series
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(minute: i64, second: i64, cpu: f64) -> MetricSample {
        MetricSample {
            node_id: CLUSTER.into(),
            at: Utc
                .timestamp_opt(1_800_000_000 + minute * 60 + second, 0)
                .unwrap(),
            cpu_percent: cpu,
            memory_percent: cpu / 2.0,
            disk_percent: 1.0,
            instances: 2,
        }
    }

    #[test]
    fn samples_are_averaged_per_step() {
        // 1_800_000_000 is on the hour, so minutes align with every step.
        let samples = [sample(0, 0, 10.0), sample(0, 30, 20.0), sample(7, 0, 40.0)];
        let hour = timeseries(&samples, MetricsPeriod::Hour);
        assert_eq!(hour.interval, "1m");
        assert_eq!(hour.cpu, vec![15.0, 40.0]);
        assert_eq!(hour.memory, vec![7.5, 20.0]);
        assert_eq!(hour.instances, vec![2, 2]);
        let day = timeseries(&samples, MetricsPeriod::Day);
        assert_eq!(day.interval, "5m");
        assert_eq!(day.cpu, vec![15.0, 40.0], "00:00-00:05 and 00:05-00:10");
        let week = timeseries(&samples, MetricsPeriod::Week);
        assert_eq!(week.cpu, vec![23.33]);
        assert_eq!(week.timestamps.len(), 1);
    }
}
