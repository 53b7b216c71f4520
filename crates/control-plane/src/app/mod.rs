//! The control plane's domain: one file per resource. HTTP handlers call these
//! functions and nothing else; agents' reports (in-process or over the agent API)
//! arrive here too.

mod alerts;
mod dormancy;
mod health;
mod instances;
mod metrics;
mod nodes;
pub mod outbox;
mod tokens;
mod views;

use std::sync::Arc;

use chrono::{DateTime, Utc};

use crate::config::ControlPlaneConfig;
use crate::http::Guard;
use crate::nodes::NodeConnections;
use crate::store::Store;
use crate::telemetry::Telemetry;
use flotilla_node_agent::snapshot::SnapshotStore;

pub use flotilla_api_types::clock::{Clock, ManualClock, SystemClock};

/// The control plane: the store, the connections to node agents and the
/// configuration. Shared as `Arc<ControlPlane>` by handlers and background tasks.
pub struct ControlPlane {
    pub(crate) store: Store,
    pub(crate) config: ControlPlaneConfig,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) nodes: NodeConnections,
    pub(crate) revive_estimates: dormancy::ReviveEstimates,
    /// Where snapshots live, to delete them with their instance.
    pub(crate) snapshots: Option<SnapshotStore>,
    pub(crate) telemetry: Telemetry,
    /// Authentication and rate limits of the HTTP API.
    pub(crate) guard: Guard,
    /// The key that signs subscriber tokens (see [`tokens`]), loaded once.
    token_key: tokio::sync::OnceCell<Arc<Vec<u8>>>,
}

impl ControlPlane {
    pub fn new(store: Store, config: ControlPlaneConfig, clock: Arc<dyn Clock>) -> Self {
        let guard = Guard::new(&config);
        store.set_event_routes(outbox::routes(&config));
        Self {
            store,
            config,
            clock,
            nodes: NodeConnections::default(),
            revive_estimates: dormancy::ReviveEstimates::default(),
            snapshots: None,
            telemetry: Telemetry::default(),
            guard,
            token_key: tokio::sync::OnceCell::new(),
        }
    }

    /// The snapshot store, to delete the snapshots of deleted instances.
    pub fn with_snapshots(mut self, snapshots: SnapshotStore) -> Self {
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

    pub fn telemetry(&self) -> &Telemetry {
        &self.telemetry
    }

    pub fn now(&self) -> DateTime<Utc> {
        self.clock.now()
    }
}
