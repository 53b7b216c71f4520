//! The control plane's domain: one file per resource. HTTP handlers call these
//! functions and nothing else; agents' reports (in-process or over the agent API)
//! arrive here too.

mod health;
mod instances;
mod nodes;
mod views;

use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};

use crate::config::ControlPlaneConfig;
use crate::nodes::NodeConnections;
use crate::store::Store;

/// The source of "now" for lifecycle decisions; tests substitute [`ManualClock`].
pub trait Clock: Send + Sync {
    fn now(&self) -> DateTime<Utc>;
}

/// Wall-clock time.
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now()
    }
}

/// A clock that moves only when told to.
pub struct ManualClock(Mutex<DateTime<Utc>>);

impl ManualClock {
    pub fn new(start: DateTime<Utc>) -> Self {
        Self(Mutex::new(start))
    }

    pub fn advance(&self, by: chrono::Duration) {
        *self.0.lock().expect("clock lock") += by;
    }
}

impl Clock for ManualClock {
    fn now(&self) -> DateTime<Utc> {
        *self.0.lock().expect("clock lock")
    }
}

/// The control plane: the store, the connections to node agents and the
/// configuration. Shared as `Arc<ControlPlane>` by handlers and background tasks.
pub struct ControlPlane {
    pub(crate) store: Store,
    pub(crate) config: ControlPlaneConfig,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) nodes: NodeConnections,
}

impl ControlPlane {
    pub fn new(store: Store, config: ControlPlaneConfig, clock: Arc<dyn Clock>) -> Self {
        Self {
            store,
            config,
            clock,
            nodes: NodeConnections::default(),
        }
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

    pub(crate) fn now(&self) -> DateTime<Utc> {
        self.clock.now()
    }
}
