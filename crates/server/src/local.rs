//! The in-process pairing of `flotilla serve`: the control plane calls the local
//! [`Agent`] directly ([`LocalNode`]) and the agent reports straight into the
//! control plane ([`LocalLink`]). No HTTP, no serialisation. Also the control
//! plane's view of the node side's snapshot store ([`Artifacts`]), used by
//! `serve` and `control`.

use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;

use flotilla_api_types::actions::AgentAction;
use flotilla_api_types::agent::{
    AgentCreateInstance, AgentInstancePorts, Heartbeat, InstanceEventReport, InstanceStateChange,
    NodeRegistration, StateChangeAck,
};
use flotilla_api_types::agent::{
    AgentDormantResult, AgentIdentity, AgentReviveInstance, InstanceReport,
};
use flotilla_api_types::extensions::ExtensionRefusal;
use flotilla_api_types::instances::KeptRecording;
use flotilla_api_types::nodes::DrainReport;
use flotilla_api_types::page::{AgentPageRequest, PageAnswer};
use flotilla_api_types::{InstanceId, NodeId};
use flotilla_control_plane::ControlPlane;
use flotilla_control_plane::artifacts::{ArtifactStore, ExtensionManifest, VideoStream};
use flotilla_control_plane::nodes::{ActionResult, NodeCallError, NodeConnection};
use flotilla_node_agent::snapshot::SnapshotStore;
use flotilla_node_agent::{Agent, AgentError, ControlPlaneLink, LinkError, RegistrationAck};

/// The local agent as a node connection.
pub struct LocalNode(pub Agent);

#[async_trait]
impl NodeConnection for LocalNode {
    async fn instance_create(
        &self,
        request: AgentCreateInstance,
    ) -> Result<AgentInstancePorts, NodeCallError> {
        self.0.instance_create(request).await.map_err(agent_error)
    }

    async fn instance_dormant(&self, id: &InstanceId) -> Result<AgentDormantResult, NodeCallError> {
        self.0.instance_dormant(id).await.map_err(agent_error)
    }

    async fn instance_revive(
        &self,
        request: AgentReviveInstance,
    ) -> Result<AgentInstancePorts, NodeCallError> {
        self.0.instance_revive(request).await.map_err(agent_error)
    }

    async fn instance_forget(&self, id: &InstanceId) -> Result<(), NodeCallError> {
        match self.0.instance_forget(id).await {
            Ok(()) | Err(AgentError::NotFound(_)) => Ok(()),
            Err(error) => Err(agent_error(error)),
        }
    }

    async fn identity(&self) -> Result<AgentIdentity, NodeCallError> {
        Ok(self.0.identity())
    }

    async fn instance_reports(&self) -> Result<Vec<InstanceReport>, NodeCallError> {
        Ok(self.0.instance_reports())
    }

    async fn instance_page(
        &self,
        id: &InstanceId,
        request: &AgentPageRequest,
    ) -> Result<PageAnswer, NodeCallError> {
        self.0.instance_page(id, request).await.map_err(agent_error)
    }

    async fn instance_action(
        &self,
        id: &InstanceId,
        action: &AgentAction,
    ) -> Result<ActionResult, NodeCallError> {
        let output = self
            .0
            .instance_action(id, action)
            .await
            .map_err(agent_error)?;
        Ok(ActionResult {
            content_type: output.content_type.to_owned(),
            body: Bytes::from(output.body),
        })
    }

    async fn instance_delete(&self, id: &InstanceId, force: bool) -> Result<(), NodeCallError> {
        match self.0.instance_delete(id, force).await {
            Ok(()) | Err(AgentError::NotFound(_)) => Ok(()),
            Err(error) => Err(agent_error(error)),
        }
    }
}

fn agent_error(error: AgentError) -> NodeCallError {
    NodeCallError::Rejected {
        code: flotilla_node_agent::agent::api::code_of(&error),
        detail: error.to_string(),
    }
}

/// The control plane as the local agent's link.
pub struct LocalLink(pub Arc<ControlPlane>);

#[async_trait]
impl ControlPlaneLink for LocalLink {
    async fn register(&self, registration: NodeRegistration) -> Result<RegistrationAck, LinkError> {
        self.0
            .node_register(registration)
            .await
            .map_err(|error| match error {
                flotilla_control_plane::Error::InvalidState(reason) => LinkError::Refused(reason),
                other => rejected(other),
            })
    }

    async fn heartbeat(&self, heartbeat: Heartbeat) -> Result<RegistrationAck, LinkError> {
        match self.0.node_heartbeat(heartbeat).await {
            Ok(Some(ack)) => Ok(ack),
            Ok(None) => Err(LinkError::UnknownNode),
            Err(error) => Err(rejected(error)),
        }
    }

    async fn state_changed(
        &self,
        change: InstanceStateChange,
    ) -> Result<StateChangeAck, LinkError> {
        let applied = self
            .0
            .instance_state_changed(change)
            .await
            .map_err(rejected)?;
        Ok(StateChangeAck { applied })
    }

    async fn instance_event(&self, event: InstanceEventReport) -> Result<(), LinkError> {
        self.0
            .instance_event_reported(event)
            .await
            .map_err(rejected)
    }

    async fn drain(&self, node: &NodeId) -> Result<DrainReport, LinkError> {
        self.0.node_drain(node, true).await.map_err(rejected)
    }

    async fn drain_report(&self, node: &NodeId) -> Result<Option<DrainReport>, LinkError> {
        self.0.node_drain_report(node).await.map_err(rejected)
    }
}

/// What the control plane answered, as the HTTP link would see it: its
/// error's code and message (a store fault is `internal`, a refused state
/// `invalid_state`), not "unreachable".
fn rejected(error: flotilla_control_plane::Error) -> LinkError {
    LinkError::Rejected {
        code: error.code(),
        detail: error.to_string(),
    }
}

/// The node agent's snapshot store, as the control plane sees it.
pub struct Artifacts(pub SnapshotStore);

#[async_trait]
impl ArtifactStore for Artifacts {
    fn location(&self) -> String {
        self.0.location.clone()
    }

    async fn snapshots_delete_all(&self, instance: &InstanceId) -> anyhow::Result<usize> {
        self.0.delete_all(instance).await
    }

    async fn profile_delete(&self, name: &str) -> anyhow::Result<()> {
        self.0.profile_delete(name).await
    }

    async fn extension_put(&self, id: &str, zip: Bytes) -> anyhow::Result<()> {
        self.0.extension_put(id, zip).await
    }

    async fn extension_delete(&self, id: &str) -> anyhow::Result<()> {
        self.0.extension_delete(id).await
    }

    fn extension_inspect(&self, zip: &[u8]) -> Result<ExtensionManifest, ExtensionRefusal> {
        let manifest = flotilla_node_agent::engine::extension::inspect(zip)?;
        Ok(ExtensionManifest {
            name: manifest.name,
            version: manifest.version,
        })
    }

    async fn recordings_kept(&self) -> anyhow::Result<Vec<KeptRecording>> {
        self.0.recordings_kept().await
    }

    async fn recording_kept(&self, id: &str) -> anyhow::Result<Option<KeptRecording>> {
        self.0.recording_kept(id).await
    }

    async fn recording_kept_video(&self, id: &str) -> anyhow::Result<Option<VideoStream>> {
        self.0.recording_kept_video(id).await
    }

    async fn recording_kept_delete(&self, id: &str) -> anyhow::Result<bool> {
        self.0.recording_kept_delete(id).await
    }
}
