//! `GET /health`: the state of the API, the store, the messaging link (event
//! publishing to the proxy: down while its deliveries fail) and the
//! scheduler.

use flotilla_api_types::health::{ComponentStatus, Health, HealthComponents, HealthStatus};
use flotilla_api_types::instances::InstanceStatus;
use flotilla_api_types::nodes::NodeStatus;

use std::sync::atomic::Ordering;

use super::ControlPlane;
use super::outbox::PROXY_TARGET;

impl ControlPlane {
    /// The service's health; `trusted` callers also see the background
    /// tasks' last errors.
    pub async fn health(&self, trusted: bool) -> Health {
        let counts = self.store.instance_counts().await;
        let storage = if counts.is_ok() {
            ComponentStatus::Up
        } else {
            ComponentStatus::Down
        };
        let counts = counts.unwrap_or_default();
        let instances_count = counts.iter().map(|(_, n)| n).sum();
        let running_instances = counts
            .iter()
            .filter(|(s, _)| *s == InstanceStatus::Running)
            .map(|(_, n)| n)
            .sum();
        let nodes = self.store.node_list().await.unwrap_or_default();
        let online: Vec<_> = nodes
            .iter()
            .filter(|n| n.status == NodeStatus::Online)
            .collect();
        let scheduler = if online.is_empty() {
            ComponentStatus::Down
        } else {
            ComponentStatus::Up
        };
        let messaging = self.messaging();
        let mut warnings: Vec<String> = online
            .iter()
            .flat_map(|node| {
                node.warnings
                    .iter()
                    .map(move |w| format!("node {}: {w}", node.id))
            })
            .collect();
        let node_loops = self.heard_from_online(&nodes, |heard| &heard.loops);
        warnings.extend(
            node_loops
                .iter()
                .filter(|(_, task)| task.failing)
                .map(|(node, task)| {
                    format!("node {node}: its {} loop failed its last run", task.name)
                }),
        );
        if messaging == ComponentStatus::Down {
            warnings.push("the event proxy does not take events (they wait in the outbox)".into());
        }
        if scheduler == ComponentStatus::Down {
            warnings.push("no node is online: instances cannot be placed".into());
        }
        let background = self.tasks.report(trusted);
        warnings.extend(
            background
                .iter()
                .filter(|task| task.failing)
                .map(|task| format!("background task {} failed its last run", task.name)),
        );
        let status = if storage == ComponentStatus::Down {
            HealthStatus::Unhealthy
        } else if !warnings.is_empty() || messaging == ComponentStatus::Down {
            HealthStatus::Degraded
        } else {
            HealthStatus::Healthy
        };
        Health {
            status,
            instances_count,
            running_instances,
            components: HealthComponents {
                api: ComponentStatus::Up,
                storage,
                messaging,
                scheduler,
            },
            create_queue: self.create_queue_health(),
            warnings,
            background,
        }
    }

    /// Event publishing to the proxy: down while its deliveries fail.
    fn messaging(&self) -> ComponentStatus {
        if self.config.events.proxy_url.is_none() {
            ComponentStatus::Disabled
        } else if self
            .telemetry
            .deliveries(PROXY_TARGET)
            .failing
            .load(Ordering::Relaxed)
        {
            ComponentStatus::Down
        } else {
            ComponentStatus::Up
        }
    }

    /// Creates waiting for room, when any.
    fn create_queue_health(&self) -> Option<flotilla_api_types::health::CreateQueueHealth> {
        match self.create_queue.snapshot() {
            (0, _) => None,
            (waiting, oldest) => Some(flotilla_api_types::health::CreateQueueHealth {
                waiting,
                oldest_wait_sec: (oldest.as_secs_f64() * 10.0).round() / 10.0,
            }),
        }
    }
}
