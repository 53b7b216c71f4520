//! How the control plane reaches node agents: the [`NodeConnection`] trait, the
//! registry of connections by node id, and [`HttpNode`] for agents elsewhere
//! (their agent API, with the cluster token). The in-process connection of
//! `flotilla serve` lives in `flotilla-server`, which pairs the two crates.

mod http;

pub use http::HttpNode;

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use async_trait::async_trait;

use flotilla_api_types::actions::AgentAction;
use flotilla_api_types::agent::{
    AgentCreateInstance, AgentDormantResult, AgentIdentity, AgentInstancePorts,
    AgentReviveInstance, InstanceReport,
};
use flotilla_api_types::page::{AgentPageRequest, PageAnswer};
use flotilla_api_types::{ErrorCode, InstanceId, NodeId};

/// A REST action's result from its node.
#[derive(Debug)]
pub struct ActionResult {
    pub content_type: String,
    pub body: bytes::Bytes,
}

/// A failed call to a node agent. The one conversion into the control
/// plane's [`Error`](crate::error::Error) is in `error.rs`.
#[derive(Debug, thiserror::Error)]
pub enum NodeCallError {
    /// The agent refused the request with its `{detail, code}`:
    /// `invalid_request` (bad config, unknown image), `not_found` (not on
    /// the node), `invalid_state`, `insufficient_capacity` (full, ports
    /// exhausted, shutting down), `bad_gateway` (the snapshot store failed),
    /// `internal`.
    #[error("{detail}")]
    Rejected { code: ErrorCode, detail: String },
    /// The agent could not be reached or did not answer.
    #[error("node agent unreachable: {0}")]
    Unreachable(String),
}

impl NodeCallError {
    /// Whether another node might take what this one could not (it is
    /// unreachable, full or shutting down).
    pub fn node_unavailable(&self) -> bool {
        matches!(
            self,
            Self::Unreachable(_)
                | Self::Rejected {
                    code: ErrorCode::InsufficientCapacity,
                    ..
                }
        )
    }
}

/// Operations the control plane asks of a node agent.
#[async_trait]
pub trait NodeConnection: Send + Sync {
    async fn instance_create(
        &self,
        request: AgentCreateInstance,
    ) -> Result<AgentInstancePorts, NodeCallError>;
    /// Stops and removes an instance; `Ok` also when the agent does not have it.
    async fn instance_delete(&self, id: &InstanceId, force: bool) -> Result<(), NodeCallError>;
    /// Parks an instance; returns once its snapshot is stored.
    async fn instance_dormant(&self, id: &InstanceId) -> Result<AgentDormantResult, NodeCallError>;
    /// Starts reviving a dormant instance; the outcome comes as a state change.
    async fn instance_revive(
        &self,
        request: AgentReviveInstance,
    ) -> Result<AgentInstancePorts, NodeCallError>;
    /// Drops a dormant instance that was revived on another node (its
    /// snapshot stays in the store); `Ok` also when the agent does not have it.
    async fn instance_forget(&self, id: &InstanceId) -> Result<(), NodeCallError>;
    /// Runs a REST action's job on an instance's browser: the result's
    /// content type and bytes.
    async fn instance_action(
        &self,
        id: &InstanceId,
        action: &AgentAction,
    ) -> Result<ActionResult, NodeCallError>;
    /// Carries out an MCP step on an instance's page.
    async fn instance_page(
        &self,
        id: &InstanceId,
        request: &AgentPageRequest,
    ) -> Result<PageAnswer, NodeCallError>;
    /// Who answers at the agent's address (node id and process generation).
    async fn identity(&self) -> Result<AgentIdentity, NodeCallError>;
    /// What the agent knows of its instances now.
    async fn instance_reports(&self) -> Result<Vec<InstanceReport>, NodeCallError>;
    /// The agent API's address; `None` for the in-process agent.
    fn address(&self) -> Option<&str> {
        None
    }
}

/// Connections by node id. A std `RwLock`: read on every call, written when a
/// node is attached; never held across an await.
#[derive(Default)]
pub struct NodeConnections {
    by_node: RwLock<HashMap<NodeId, Arc<dyn NodeConnection>>>,
}

impl NodeConnections {
    pub fn attach(&self, node: NodeId, connection: Arc<dyn NodeConnection>) {
        self.by_node
            .write()
            .expect("connections lock")
            .insert(node, connection);
    }

    pub fn detach(&self, node: &NodeId) {
        self.by_node.write().expect("connections lock").remove(node);
    }

    pub fn get(&self, node: &NodeId) -> Option<Arc<dyn NodeConnection>> {
        self.by_node
            .read()
            .expect("connections lock")
            .get(node)
            .cloned()
    }
}
