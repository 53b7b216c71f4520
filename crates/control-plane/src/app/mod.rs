//! The control plane's domain: one file per resource. HTTP handlers call these
//! functions and nothing else; agents' reports (in-process or over the agent API)
//! arrive here too.

mod actions;
mod alerts;
mod door;
mod dormancy;
mod drain;
mod extensions;
mod health;
pub mod held_instances;
mod instance_access;
mod instances;
pub mod keys;
pub mod lifecycle;
pub mod live_links;
pub mod mcp_sessions;
mod metrics;
mod nodes;
pub mod outbox;
pub mod playwright;
mod profiles;
mod queue;
mod recordings;
pub mod tasks;
pub mod tenants;
mod tokens;
mod views;
pub mod webdriver;
pub mod webdriver_firefox;
pub mod webdriver_sessions;

use std::sync::Arc;

use chrono::{DateTime, Utc};

use crate::artifacts::ArtifactStore;
use crate::config::ControlPlaneConfig;
use crate::nodes::{HttpNode, NodeConnection, NodeConnections};
use crate::store::Store;
use crate::telemetry::Telemetry;
use flotilla_api_types::NodeId;

pub use door::DoorTarget;
pub use flotilla_api_types::clock::{Clock, ManualClock, SystemClock};
pub use tenants::Scope;

/// Per node: instances created within the failure window, and how many failed.
pub(crate) type RecentFailures = Arc<Vec<(NodeId, i64, i64)>>;

/// The control plane: the store, the connections to node agents and the
/// configuration. Shared as `Arc<ControlPlane>` by handlers and background tasks.
pub struct ControlPlane {
    pub(crate) store: Store,
    pub(crate) config: ControlPlaneConfig,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) nodes: NodeConnections,
    pub(crate) revive_estimates: dormancy::ReviveEstimates,
    /// Where snapshots live, to delete them with their instance.
    pub(crate) snapshots: Option<Arc<dyn ArtifactStore>>,
    pub(crate) telemetry: Telemetry,
    /// Authentication and rate limits of the HTTP API.
    pub(crate) keys: keys::KeyRing,
    /// The key that signs subscriber tokens (see [`tokens`]), loaded once.
    token_key: tokio::sync::OnceCell<Arc<Vec<u8>>>,
    /// The key instance tokens derive from (see [`instance_access`]), loaded once.
    instance_token_key: tokio::sync::OnceCell<Arc<Vec<u8>>>,
    /// Nodes' public hosts for instance URLs.
    pub(crate) public_hosts: instance_access::PublicHosts,
    /// Creates waiting for room (`?wait_sec=`).
    pub(crate) create_queue: queue::CreateQueue,
    /// REST actions held now (`actions.max_pending`).
    pub(crate) actions_in_progress: actions::ActionsInProgress,
    /// This control plane's name as a lease holder (random per start).
    holder: String,
    /// The instances this process's running work holds (`held_instances`).
    held: held_instances::Held,
    /// The nodes (and agent generations) this process reconciled at their
    /// registration; a heartbeat from any other is asked to register again.
    reconciled: std::sync::Mutex<std::collections::HashSet<(NodeId, String)>>,
    /// Per node: records a registration of the same agent process left to a
    /// later heartbeat (`app::nodes`, `recheck_unreported`).
    unreported: std::sync::Mutex<std::collections::HashMap<NodeId, nodes::Unreported>>,
    /// The drains this process runs now, by node (`app::drain`; their
    /// reports are in the store).
    drains: std::sync::Mutex<std::collections::HashMap<NodeId, drain::Drain>>,
    /// Agents whose registration this process refused (`/v2/nodes` shows
    /// them until they register).
    refused_agents: std::sync::Mutex<
        std::collections::BTreeMap<NodeId, flotilla_api_types::nodes::RefusedAgent>,
    >,
    /// Per node: what its last heartbeat to this process told besides
    /// its resources (for `/health` and `/metrics`).
    heard: std::sync::Mutex<std::collections::BTreeMap<NodeId, nodes::Heard>>,
    /// Per node: recent instances and failures, and when they were read.
    recent_failures: std::sync::RwLock<Option<(std::time::Instant, RecentFailures)>>,
    /// Held by the one caller reading them again.
    recent_failures_reading: tokio::sync::Mutex<()>,
    /// Background work: the sweeps' records, and work spawned by requests.
    tasks: Arc<tasks::BackgroundTasks>,
}

impl ControlPlane {
    pub fn new(store: Store, config: ControlPlaneConfig, clock: Arc<dyn Clock>) -> Self {
        let keys = keys::KeyRing::new(&config);
        store.set_event_routes(outbox::routes(&config));
        Self {
            store,
            config,
            clock,
            nodes: NodeConnections::default(),
            revive_estimates: dormancy::ReviveEstimates::default(),
            snapshots: None,
            telemetry: Telemetry::default(),
            keys,
            token_key: tokio::sync::OnceCell::new(),
            instance_token_key: tokio::sync::OnceCell::new(),
            public_hosts: instance_access::PublicHosts::default(),
            reconciled: Default::default(),
            refused_agents: Default::default(),
            drains: Default::default(),
            unreported: Default::default(),
            heard: Default::default(),
            create_queue: queue::CreateQueue::default(),
            actions_in_progress: actions::ActionsInProgress::default(),
            holder: uuid::Uuid::new_v4().simple().to_string(),
            held: Default::default(),
            recent_failures: std::sync::RwLock::new(None),
            recent_failures_reading: tokio::sync::Mutex::new(()),
            tasks: Arc::default(),
        }
    }

    /// The background work's records, and where work is spawned.
    pub fn tasks(&self) -> &Arc<tasks::BackgroundTasks> {
        &self.tasks
    }

    /// The snapshot store, to delete the snapshots of deleted instances.
    pub fn with_snapshots(mut self, snapshots: Arc<dyn ArtifactStore>) -> Self {
        self.snapshots = Some(snapshots);
        self
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    pub fn config(&self) -> &ControlPlaneConfig {
        &self.config
    }

    pub fn node_connections(&self) -> &NodeConnections {
        &self.nodes
    }

    /// The connection to `node`: attached (the local agent, or an agent that
    /// registered here), or made from the node's stored address when a cluster
    /// token is configured (an agent that registered with another control plane).
    pub(crate) async fn connection(
        &self,
        node: &NodeId,
    ) -> crate::error::Result<Option<Arc<dyn NodeConnection>>> {
        if let Some(connection) = self.nodes.get(node) {
            return Ok(Some(connection));
        }
        let Some(token) = &self.config.cluster_token else {
            return Ok(None);
        };
        let Some(record) = self.store.node_get(node).await? else {
            return Ok(None);
        };
        let connection: Arc<dyn NodeConnection> = Arc::new(HttpNode::new(&record.address, token));
        self.nodes.attach(node.clone(), connection.clone());
        Ok(Some(connection))
    }

    /// Whether this control plane may run the cluster-wide task `name` now
    /// (it holds, or just took, its lease for `ttl`).
    pub async fn hold_lease(
        &self,
        name: &str,
        ttl: std::time::Duration,
    ) -> crate::error::Result<bool> {
        let ttl = chrono::Duration::from_std(ttl).unwrap_or(chrono::Duration::seconds(60));
        Ok(self
            .store
            .lease_acquire(name, &self.holder, self.now(), ttl)
            .await?)
    }

    pub fn telemetry(&self) -> &Telemetry {
        &self.telemetry
    }

    pub fn now(&self) -> DateTime<Utc> {
        self.clock.now()
    }
}
