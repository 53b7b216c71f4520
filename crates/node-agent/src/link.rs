//! How an agent talks to its control plane. In `flotilla serve` the link is a
//! direct call into the in-process control plane; a separate `flotilla agent`
//! uses the HTTP link of the agent API.

use async_trait::async_trait;
use std::time::Duration;

use flotilla_api_types::agent::{Heartbeat, InstanceStateChange, NodeRegistration};

/// What the control plane tells an agent when it registers.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RegistrationAck {
    pub heartbeat_interval_sec: f64,
}

impl RegistrationAck {
    pub fn heartbeat_interval(&self) -> Duration {
        Duration::from_secs_f64(self.heartbeat_interval_sec.max(0.05))
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    /// The control plane does not know this node (it lost its registration):
    /// the agent registers again.
    #[error("the control plane does not know this node")]
    UnknownNode,
    #[error("control plane unreachable: {0}")]
    Unreachable(String),
}

#[async_trait]
pub trait ControlPlaneLink: Send + Sync + 'static {
    async fn register(&self, registration: NodeRegistration) -> Result<RegistrationAck, LinkError>;
    async fn heartbeat(&self, heartbeat: Heartbeat) -> Result<(), LinkError>;
    async fn state_changed(&self, change: InstanceStateChange) -> Result<(), LinkError>;
}
