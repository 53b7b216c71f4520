//! Placement: which node gets a new instance.
//!
//! A node is eligible when it is online with a fresh heartbeat, offers the image,
//! has a free slot, is big enough for the requested memory and cores, is healthy
//! (at most 10 % of the instances created on it in the last
//! `nodes.failed_ratio_window_min` minutes failed, judged from
//! `nodes.failed_ratio_min_instances` instances on) and is not over the
//! utilisation limit (CPU and memory smoothed over about a minute). With `node_preference` only that node is
//! considered. Otherwise K random eligible nodes are compared and the one with
//! the most free capacity wins (best-of-K: near-best placement without every
//! control plane piling onto the same node). The caller tries the ranked nodes
//! in order, because the free slot is only taken atomically by the store.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use rand::seq::SliceRandom;

use flotilla_api_types::NodeId;
use flotilla_api_types::instances::InstanceConfig;
use flotilla_api_types::nodes::NodeStatus;

use crate::config::ControlPlaneConfig;
use crate::error::Error;
use crate::store::NodeRecord;

/// What a node holds, for placement.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct NodeUsage {
    /// Instances holding a slot.
    pub occupied: i64,
    /// Instances created on the node within the failure window, and how many
    /// of those failed.
    pub recent: i64,
    pub recent_failed: i64,
}

pub struct PlacementRequest<'a> {
    pub image: &'a str,
    pub config: &'a InstanceConfig,
    pub preference: Option<&'a NodeId>,
}

/// Why a node cannot take the instance, or `None` if it can.
fn ineligibility(
    node: &NodeRecord,
    usage: NodeUsage,
    request: &PlacementRequest<'_>,
    now: DateTime<Utc>,
    config: &ControlPlaneConfig,
) -> Option<String> {
    let occupied = usage.occupied;
    let heartbeat_age = (now - node.last_heartbeat).num_milliseconds() as f64 / 1000.0;
    let limit = config.scheduler.max_utilisation_percent;
    if node.status == NodeStatus::Offline || heartbeat_age > config.nodes.heartbeat_timeout_sec {
        Some("offline".into())
    } else if node.draining {
        Some(format!(
            "draining (POST /v2/nodes/{}/uncordon ends it)",
            node.id
        ))
    } else if !node.images.iter().any(|i| i == request.image) {
        Some(format!("does not offer image {:?}", request.image))
    } else if occupied >= node.max_instances {
        Some(format!(
            "full ({occupied}/{} instances)",
            node.max_instances
        ))
    } else if request.config.memory_gb > node.capabilities.memory_gb {
        Some(format!(
            "has {} GB of memory, less than the requested memory_gb {}",
            node.capabilities.memory_gb, request.config.memory_gb
        ))
    } else if request.config.cpu_cores > node.capabilities.cpu_cores {
        Some(format!(
            "has {} CPU cores, fewer than the requested cpu_cores {}",
            node.capabilities.cpu_cores, request.config.cpu_cores
        ))
    } else if usage.recent >= config.nodes.failed_ratio_min_instances
        && usage.recent_failed as f64 > usage.recent as f64 * config.nodes.max_failed_ratio
    {
        Some(format!(
            "unhealthy ({} of its {} instances created in the last {} minutes failed; limit {:.0} %)",
            usage.recent_failed,
            usage.recent,
            config.nodes.failed_ratio_window_min,
            config.nodes.max_failed_ratio * 100.0
        ))
    } else if node.load.cpu_percent > limit || node.load.memory_percent > limit {
        Some(format!(
            "overloaded (CPU {:.0} %, memory {:.0} % over the last minute; limit {limit:.0} %)",
            node.load.cpu_percent, node.load.memory_percent
        ))
    } else {
        None
    }
}

/// Free capacity in [0, 2]: free slot share plus free memory share.
fn free_capacity(node: &NodeRecord, occupied: i64) -> f64 {
    let slots = (node.max_instances - occupied) as f64 / node.max_instances.max(1) as f64;
    let memory = 1.0 - node.load.memory_percent / 100.0;
    slots + memory
}

/// Nodes to try, best first.
pub fn rank(
    nodes: &[NodeRecord],
    usage: &HashMap<NodeId, NodeUsage>,
    request: &PlacementRequest<'_>,
    now: DateTime<Utc>,
    config: &ControlPlaneConfig,
) -> Result<Vec<NodeRecord>, Error> {
    if nodes.is_empty() {
        // Not the request's fault: a node may register any moment.
        return Err(Error::InsufficientCapacity(
            "no node has registered yet; retry once a node agent is up (GET /v2/nodes lists them)"
                .into(),
        ));
    }
    if !nodes
        .iter()
        .any(|n| n.images.iter().any(|i| i == request.image))
    {
        let mut offered: Vec<&str> = nodes
            .iter()
            .flat_map(|n| n.images.iter().map(String::as_str))
            .collect();
        offered.sort_unstable();
        offered.dedup();
        return Err(Error::InvalidRequest(format!(
            "image: unknown image {:?}; available images: {}",
            request.image,
            offered.join(", ")
        )));
    }
    let usage_of = |node: &NodeRecord| usage.get(&node.id).copied().unwrap_or_default();
    let occupied = |node: &NodeRecord| usage_of(node).occupied;
    if let Some(preferred) = request.preference {
        let node = nodes.iter().find(|n| &n.id == preferred).ok_or_else(|| {
            Error::InvalidRequest(format!(
                "node_preference: unknown node \"{preferred}\"; GET /v2/nodes lists the nodes"
            ))
        })?;
        if node.draining {
            // Not room that may come: waiting in the create queue for it
            // would hold up every create behind.
            return Err(Error::InvalidState(format!(
                "preferred node {preferred} is draining: prefer another node, or uncordon it (POST /v2/nodes/{preferred}/uncordon)"
            )));
        }
        return match ineligibility(node, usage_of(node), request, now, config) {
            None => Ok(vec![node.clone()]),
            Some(reason) => Err(Error::InsufficientCapacity(format!(
                "preferred node {preferred} cannot take the instance: it is {reason}"
            ))),
        };
    }
    let mut eligible = Vec::new();
    let mut reasons = Vec::new();
    for node in nodes {
        match ineligibility(node, usage_of(node), request, now, config) {
            None => eligible.push(node.clone()),
            Some(reason) => reasons.push(format!("{} is {reason}", node.id)),
        }
    }
    if eligible.is_empty() {
        return Err(Error::InsufficientCapacity(format!(
            "no node has room for this instance: {}; delete instances, lower the request or add a node",
            reasons.join("; ")
        )));
    }
    eligible.shuffle(&mut rand::rng());
    let k = config.scheduler.candidates.min(eligible.len());
    let (sampled, rest) = eligible.split_at_mut(k);
    sampled.sort_by(|a, b| free_capacity(b, occupied(b)).total_cmp(&free_capacity(a, occupied(a))));
    rest.sort_by(|a, b| free_capacity(b, occupied(b)).total_cmp(&free_capacity(a, occupied(a))));
    Ok(eligible)
}

#[cfg(test)]
mod tests {
    use super::*;
    use flotilla_api_types::nodes::{Capabilities, ResourceUsage};

    fn node(id: &str, max: i64, memory_percent: f64) -> NodeRecord {
        NodeRecord {
            id: NodeId::new(id),
            address: format!("http://{id}:1"),
            public_host: id.into(),
            status: NodeStatus::Online,
            max_instances: max,
            capabilities: Capabilities {
                cpu_cores: 4,
                memory_gb: 16.0,
                disk_gb: 100.0,
            },
            images: vec!["ubuntu:22.04".into()],
            resources: ResourceUsage {
                cpu_percent: 10.0,
                memory_percent,
                disk_percent: 10.0,
            },
            last_heartbeat: Utc::now(),
            registered_at: Utc::now(),
            warnings: vec![],
            generation: String::new(),
            browser_version: None,
            protocol_version: String::new(),
            draining: false,
            snapshot_store: String::new(),
            load: ResourceUsage {
                cpu_percent: 10.0,
                memory_percent,
                disk_percent: 10.0,
            },
        }
    }

    fn request<'a>(
        config: &'a InstanceConfig,
        preference: Option<&'a NodeId>,
    ) -> PlacementRequest<'a> {
        PlacementRequest {
            image: "ubuntu:22.04",
            config,
            preference,
        }
    }

    #[test]
    fn picks_the_freer_node_and_skips_full_ones() {
        let config = ControlPlaneConfig::default();
        let instance = InstanceConfig::default();
        let nodes = vec![node("a", 10, 50.0), node("b", 10, 10.0), node("c", 2, 0.0)];
        let occupancy = HashMap::from([(
            NodeId::new("c"),
            NodeUsage {
                occupied: 2,
                ..NodeUsage::default()
            },
        )]);
        for _ in 0..20 {
            let ranked = rank(
                &nodes,
                &occupancy,
                &request(&instance, None),
                Utc::now(),
                &config,
            )
            .unwrap();
            assert_eq!(ranked.len(), 2, "the full node is not a candidate");
            assert_eq!(ranked[0].id.as_str(), "b");
        }
    }

    #[test]
    fn preference_errors_distinguish_unknown_and_unavailable() {
        let config = ControlPlaneConfig::default();
        let instance = InstanceConfig::default();
        let mut offline = node("off", 10, 0.0);
        offline.status = NodeStatus::Offline;
        let nodes = vec![node("a", 10, 0.0), offline];
        let unknown = NodeId::new("zzz");
        let err = rank(
            &nodes,
            &HashMap::new(),
            &request(&instance, Some(&unknown)),
            Utc::now(),
            &config,
        )
        .unwrap_err();
        assert!(matches!(err, Error::InvalidRequest(_)), "{err}");
        let off = NodeId::new("off");
        let err = rank(
            &nodes,
            &HashMap::new(),
            &request(&instance, Some(&off)),
            Utc::now(),
            &config,
        )
        .unwrap_err();
        assert!(matches!(err, Error::InsufficientCapacity(_)), "{err}");
    }

    #[test]
    fn unknown_image_is_a_bad_request_and_oversize_is_capacity() {
        let config = ControlPlaneConfig::default();
        let nodes = vec![node("a", 10, 0.0)];
        let instance = InstanceConfig::default();
        let bad = PlacementRequest {
            image: "nope",
            config: &instance,
            preference: None,
        };
        assert!(matches!(
            rank(&nodes, &HashMap::new(), &bad, Utc::now(), &config),
            Err(Error::InvalidRequest(_))
        ));
        // Before any node registered, any image is a retryable 503.
        let default = PlacementRequest {
            image: "ubuntu:22.04",
            ..bad
        };
        assert!(matches!(
            rank(&[], &HashMap::new(), &default, Utc::now(), &config),
            Err(Error::InsufficientCapacity(_))
        ));
        let huge = InstanceConfig {
            memory_gb: 64.0,
            ..InstanceConfig::default()
        };
        assert!(matches!(
            rank(
                &nodes,
                &HashMap::new(),
                &request(&huge, None),
                Utc::now(),
                &config
            ),
            Err(Error::InsufficientCapacity(_))
        ));
    }

    #[test]
    fn placement_looks_at_the_smoothed_load_not_a_burst() {
        let config = ControlPlaneConfig::default();
        let instance = InstanceConfig::default();
        let mut bursting = node("a", 10, 0.0);
        bursting.resources.cpu_percent = 100.0;
        assert!(
            rank(
                &[bursting.clone()],
                &HashMap::new(),
                &request(&instance, None),
                Utc::now(),
                &config
            )
            .is_ok()
        );
        bursting.load.cpu_percent = 95.0;
        let err = rank(
            &[bursting],
            &HashMap::new(),
            &request(&instance, None),
            Utc::now(),
            &config,
        )
        .unwrap_err();
        assert!(err.to_string().contains("overloaded"), "{err}");
    }

    #[test]
    fn a_node_whose_recent_instances_fail_gets_no_placements() {
        let config = ControlPlaneConfig::default();
        let instance = InstanceConfig::default();
        let nodes = vec![node("a", 10, 0.0)];
        let usage = |recent, recent_failed| {
            HashMap::from([(
                NodeId::new("a"),
                NodeUsage {
                    occupied: 0,
                    recent,
                    recent_failed,
                },
            )])
        };
        let place = |usage: HashMap<NodeId, NodeUsage>| {
            rank(
                &nodes,
                &usage,
                &request(&instance, None),
                Utc::now(),
                &config,
            )
        };
        assert!(place(usage(10, 1)).is_ok(), "10 % is not above 10 %");
        let err = place(usage(10, 2)).unwrap_err();
        assert!(err.to_string().contains("unhealthy"), "{err}");
        assert!(place(usage(2, 2)).is_ok(), "too few instances to judge");
    }

    #[test]
    fn stale_heartbeat_means_offline() {
        let config = ControlPlaneConfig::default();
        let instance = InstanceConfig::default();
        let mut stale = node("a", 10, 0.0);
        stale.last_heartbeat = Utc::now() - chrono::Duration::seconds(61);
        let err = rank(
            &[stale],
            &HashMap::new(),
            &request(&instance, None),
            Utc::now(),
            &config,
        )
        .unwrap_err();
        assert!(err.to_string().contains("offline"), "{err}");
    }
}
