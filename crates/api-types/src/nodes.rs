//! Nodes: machines running a node agent, as the public API shows them.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::ids::NodeId;

/// Reachability of a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum NodeStatus {
    Online,
    Offline,
    /// Online, and being drained: it takes no new instance and its
    /// instances move to other nodes (shown by the API; stored as online).
    Draining,
}

impl NodeStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Online => "online",
            Self::Offline => "offline",
            Self::Draining => "draining",
        }
    }
}

/// ResourceUsage: utilisation of a machine, each in percent of its capacity.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ResourceUsage {
    pub cpu_percent: f64,
    pub memory_percent: f64,
    pub disk_percent: f64,
}

/// What a node has to offer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Capabilities {
    pub cpu_cores: i64,
    pub memory_gb: f64,
    pub disk_gb: f64,
}

/// Node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Node {
    pub id: NodeId,
    pub status: NodeStatus,
    /// The node agent's address, `<scheme>://<host>:<port>`.
    pub address: String,
    /// Instances holding a slot on the node (every state but failed and stopped).
    pub instances_count: i64,
    pub max_instances: i64,
    pub resources: ResourceUsage,
    pub last_heartbeat: DateTime<Utc>,
    /// Node detail only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capabilities: Option<Capabilities>,
    /// Images this node can run (node detail only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub images: Option<Vec<String>>,
    /// Why the node runs with less isolation than configured, e.g. no writable
    /// cgroup hierarchy (node detail only; absent when there is nothing to say).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warnings: Option<Vec<String>>,
    /// The agent↔control plane protocol its agent speaks (`major.minor`;
    /// `1.0` for agents from before versions were exchanged).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol_version: Option<String>,
    /// The node's latest drain, as this control plane ran it (node detail
    /// only; absent when none ran).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain: Option<DrainReport>,
}

/// A drain of a node (`POST /v2/nodes/{id}/drain`): its instances move, one
/// at a time, to other nodes (parked to the shared snapshot store, revived
/// elsewhere with `full_restore`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct DrainReport {
    pub node_id: NodeId,
    pub started_at: DateTime<Utc>,
    /// Every instance has moved or stayed (or the drain was ended).
    pub finished: bool,
    /// Instances now running on another node.
    pub moved: Vec<MovedInstance>,
    /// Instances still to move, in order.
    pub moving: Vec<crate::ids::InstanceId>,
    /// Instances that could not move, and why.
    pub stayed: Vec<StayedInstance>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct MovedInstance {
    pub instance_id: crate::ids::InstanceId,
    pub to_node: NodeId,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct StayedInstance {
    pub instance_id: crate::ids::InstanceId,
    pub reason: String,
}

/// NodeList.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct NodeList {
    pub nodes: Vec<Node>,
    /// Agents whose registration this control plane refused, and why (a
    /// protocol a major version apart); absent when there are none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub refused: Vec<RefusedAgent>,
}

/// An agent whose registration was refused.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct RefusedAgent {
    pub node_id: NodeId,
    /// The agent API's address it gave.
    pub address: String,
    /// The protocol version it speaks.
    pub protocol_version: String,
    pub reason: String,
    /// Its latest attempt.
    pub at: DateTime<Utc>,
}
