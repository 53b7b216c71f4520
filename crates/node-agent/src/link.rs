//! How an agent talks to its control plane. In `flotilla serve` the link is a
//! direct call into the in-process control plane; a separate `flotilla agent`
//! uses the HTTP link of the agent API.

use async_trait::async_trait;
use std::time::Duration;

use flotilla_api_types::agent::{
    Heartbeat, InstanceEventReport, InstanceStateChange, NodeRegistration, RegistrationAck,
    StateChangeAck,
};

#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    /// The control plane does not know this node (it lost its registration):
    /// the agent registers again.
    #[error("the control plane does not know this node")]
    UnknownNode,
    #[error("control plane unreachable: {0}")]
    Unreachable(String),
    /// The control plane will not take this agent as it is (another live
    /// agent holds its node id); the text says what to change.
    #[error("{0}")]
    Refused(String),
}

#[async_trait]
pub trait ControlPlaneLink: Send + Sync + 'static {
    async fn register(&self, registration: NodeRegistration) -> Result<RegistrationAck, LinkError>;
    /// Answered with the current settings (the same as at registration).
    async fn heartbeat(&self, heartbeat: Heartbeat) -> Result<RegistrationAck, LinkError>;
    /// Whether the control plane recorded the change (see [`StateChangeAck`]).
    async fn state_changed(&self, change: InstanceStateChange)
    -> Result<StateChangeAck, LinkError>;
    async fn instance_event(&self, event: InstanceEventReport) -> Result<(), LinkError>;
}

/// The link of a separate `flotilla agent`: the control plane's internal API
/// over HTTP, with the cluster token.
pub struct HttpLink {
    base: String,
    token: String,
    client: reqwest::Client,
}

impl HttpLink {
    pub fn new(control_plane_url: &str, token: &str) -> Self {
        Self {
            base: control_plane_url.trim_end_matches('/').to_owned(),
            token: token.to_owned(),
            client: reqwest::Client::builder()
                .connect_timeout(Duration::from_secs(5))
                .timeout(Duration::from_secs(30))
                .no_proxy()
                .build()
                .expect("the HTTP client builds"),
        }
    }

    async fn post<T: serde::Serialize>(
        &self,
        path: &str,
        body: &T,
    ) -> Result<reqwest::Response, LinkError> {
        let response = self
            .client
            .post(format!("{}/internal/v1{path}", self.base))
            .bearer_auth(&self.token)
            .json(body)
            .send()
            .await
            .map_err(|e| LinkError::Unreachable(format!("{}: {e}", self.base)))?;
        match response.status() {
            status if status.is_success() => Ok(response),
            reqwest::StatusCode::NOT_FOUND => Err(LinkError::UnknownNode),
            reqwest::StatusCode::CONFLICT => {
                let body: flotilla_api_types::ErrorResponse =
                    response.json().await.map_err(|e| {
                        LinkError::Unreachable(format!("{}: unreadable refusal: {e}", self.base))
                    })?;
                Err(LinkError::Refused(body.detail))
            }
            status => {
                let body = response.text().await.unwrap_or_default();
                Err(LinkError::Unreachable(format!(
                    "{} answered {status}: {}",
                    self.base,
                    body.trim()
                )))
            }
        }
    }
}

#[async_trait]
impl ControlPlaneLink for HttpLink {
    async fn register(&self, registration: NodeRegistration) -> Result<RegistrationAck, LinkError> {
        self.post("/nodes/register", &registration)
            .await?
            .json()
            .await
            .map_err(|e| LinkError::Unreachable(format!("unreadable registration answer: {e}")))
    }

    async fn heartbeat(&self, heartbeat: Heartbeat) -> Result<RegistrationAck, LinkError> {
        self.post("/nodes/heartbeat", &heartbeat)
            .await?
            .json()
            .await
            .map_err(|e| LinkError::Unreachable(format!("unreadable heartbeat answer: {e}")))
    }

    async fn state_changed(
        &self,
        change: InstanceStateChange,
    ) -> Result<StateChangeAck, LinkError> {
        let response = self.post("/instances/state", &change).await?;
        // A control plane of the version before answers 204: it records
        // whatever it is told.
        if response.status() == reqwest::StatusCode::NO_CONTENT {
            return Ok(StateChangeAck { applied: true });
        }
        response
            .json()
            .await
            .map_err(|e| LinkError::Unreachable(format!("unreadable state change answer: {e}")))
    }

    async fn instance_event(&self, event: InstanceEventReport) -> Result<(), LinkError> {
        self.post("/instances/events", &event).await.map(drop)
    }
}
