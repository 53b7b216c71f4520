//! A node agent on another machine (or process), reached over its agent API
//! (`flotilla_node_agent::agent::api`) with the cluster token.

use std::time::Duration;

use async_trait::async_trait;
use serde::de::DeserializeOwned;

use flotilla_api_types::agent::{
    AgentCreateInstance, AgentDormantResult, AgentIdentity, AgentInstancePorts,
    AgentReviveInstance, InstanceReport,
};
use flotilla_api_types::{ErrorCode, ErrorResponse, InstanceId};

use super::{ActionResult, NodeCallError, NodeConnection};
use flotilla_api_types::actions::AgentAction;
use flotilla_api_types::page::{AgentPageRequest, PageAnswer};

/// Longest a create or revive call may take (the agent answers once ports are
/// reserved and the launch has begun).
const CALL_TIMEOUT: Duration = Duration::from_secs(60);
/// Parking captures and uploads a snapshot.
const DORMANT_TIMEOUT: Duration = Duration::from_secs(300);
/// Asking who answers at an address (while another agent registers).
const IDENTITY_TIMEOUT: Duration = Duration::from_secs(3);

pub struct HttpNode {
    address: String,
    token: String,
    client: reqwest::Client,
}

impl HttpNode {
    pub fn new(address: &str, token: &str) -> Self {
        Self {
            address: address.trim_end_matches('/').to_owned(),
            token: token.to_owned(),
            client: reqwest::Client::builder()
                .connect_timeout(Duration::from_secs(5))
                .no_proxy()
                .build()
                .expect("the HTTP client builds"),
        }
    }

    /// Sends `request`; a refusal's `{detail, code}` as the error.
    async fn send(
        &self,
        request: reqwest::RequestBuilder,
        timeout: Duration,
    ) -> Result<reqwest::Response, NodeCallError> {
        let response = request
            .bearer_auth(&self.token)
            .headers(flotilla_telemetry::trace_headers())
            .timeout(timeout)
            .send()
            .await
            .map_err(|e| NodeCallError::Unreachable(format!("{}: {e}", self.address)))?;
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        Err(match response.json::<ErrorResponse>().await {
            Ok(error) => NodeCallError::Rejected {
                code: error.code,
                detail: error.detail,
            },
            Err(_) => NodeCallError::Rejected {
                code: ErrorCode::of_status(status.as_u16()),
                detail: format!("the agent answered {status}"),
            },
        })
    }

    async fn call<T: DeserializeOwned>(
        &self,
        request: reqwest::RequestBuilder,
        timeout: Duration,
    ) -> Result<Option<T>, NodeCallError> {
        let response = self.send(request, timeout).await?;
        if response.status() == reqwest::StatusCode::NO_CONTENT {
            return Ok(None);
        }
        response.json().await.map(Some).map_err(|e| {
            NodeCallError::Unreachable(format!("{}: unreadable answer: {e}", self.address))
        })
    }

    /// A call whose work is done when the agent no longer has the instance
    /// (404 is `Ok`).
    async fn call_unless_gone(
        &self,
        request: reqwest::RequestBuilder,
    ) -> Result<(), NodeCallError> {
        match self.call::<serde_json::Value>(request, CALL_TIMEOUT).await {
            Ok(_)
            | Err(NodeCallError::Rejected {
                code: ErrorCode::NotFound,
                ..
            }) => Ok(()),
            Err(error) => Err(error),
        }
    }

    fn url(&self, path: &str) -> String {
        format!("{}/agent/v1/instances{path}", self.address)
    }
}

fn expect_body<T>(answer: Option<T>) -> Result<T, NodeCallError> {
    answer.ok_or_else(|| NodeCallError::Unreachable("the agent answered without a body".into()))
}

#[async_trait]
impl NodeConnection for HttpNode {
    async fn instance_create(
        &self,
        request: AgentCreateInstance,
    ) -> Result<AgentInstancePorts, NodeCallError> {
        let answer = self
            .call(self.client.post(self.url("")).json(&request), CALL_TIMEOUT)
            .await?;
        expect_body(answer)
    }

    async fn instance_delete(&self, id: &InstanceId, force: bool) -> Result<(), NodeCallError> {
        let request = self
            .client
            .delete(self.url(&format!("/{id}?force={force}")));
        self.call_unless_gone(request).await
    }

    async fn instance_dormant(&self, id: &InstanceId) -> Result<AgentDormantResult, NodeCallError> {
        let request = self.client.post(self.url(&format!("/{id}/dormant")));
        expect_body(self.call(request, DORMANT_TIMEOUT).await?)
    }

    async fn instance_forget(&self, id: &InstanceId) -> Result<(), NodeCallError> {
        let request = self.client.post(self.url(&format!("/{id}/forget")));
        self.call_unless_gone(request).await
    }

    async fn instance_revive(
        &self,
        request: AgentReviveInstance,
    ) -> Result<AgentInstancePorts, NodeCallError> {
        let call = self
            .client
            .post(self.url(&format!("/{}/revive", request.id)))
            .json(&request);
        expect_body(self.call(call, CALL_TIMEOUT).await?)
    }

    async fn instance_action(
        &self,
        id: &InstanceId,
        action: &AgentAction,
    ) -> Result<ActionResult, NodeCallError> {
        // The agent waits for the browser's launch, then runs the job within
        // its timeout_ms.
        let timeout = CALL_TIMEOUT + Duration::from_millis(action.request.timeout_ms());
        let request = self
            .client
            .post(self.url(&format!("/{id}/action")))
            .json(action);
        let response = self.send(request, timeout).await?;
        let content_type = response
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|value| value.to_str().ok())
            .unwrap_or("application/octet-stream")
            .to_owned();
        let body = response.bytes().await.map_err(|e| {
            NodeCallError::Unreachable(format!("{}: the result was cut: {e}", self.address))
        })?;
        Ok(ActionResult { content_type, body })
    }

    async fn instance_page(
        &self,
        id: &InstanceId,
        request: &AgentPageRequest,
    ) -> Result<PageAnswer, NodeCallError> {
        let timeout = CALL_TIMEOUT + Duration::from_millis(request.timeout_ms);
        let call = self
            .client
            .post(self.url(&format!("/{id}/page")))
            .json(request);
        expect_body(self.call(call, timeout).await?)
    }

    async fn identity(&self) -> Result<AgentIdentity, NodeCallError> {
        let request = self
            .client
            .get(format!("{}/agent/v1/identity", self.address));
        expect_body(self.call(request, IDENTITY_TIMEOUT).await?)
    }

    async fn instance_reports(&self) -> Result<Vec<InstanceReport>, NodeCallError> {
        let request = self
            .client
            .get(format!("{}/agent/v1/instances", self.address));
        expect_body(self.call(request, IDENTITY_TIMEOUT).await?)
    }

    fn address(&self) -> Option<&str> {
        Some(&self.address)
    }
}
