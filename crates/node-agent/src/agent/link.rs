//! How an agent talks to its control plane. In `flotilla serve` the link is a
//! direct call into the in-process control plane; a separate `flotilla agent`
//! uses the HTTP link of the agent API.

use async_trait::async_trait;
use std::time::Duration;

use flotilla_api_types::NodeId;
use flotilla_api_types::agent::{
    Heartbeat, InstanceEventReport, InstanceStateChange, NodeDrainRequest, NodeRegistration,
    RegistrationAck, StateChangeAck,
};
use flotilla_api_types::nodes::DrainReport;
use flotilla_api_types::{ErrorCode, ErrorResponse};

#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    /// The control plane does not know this node (it lost its registration):
    /// the agent registers again.
    #[error("the control plane does not know this node")]
    UnknownNode,
    /// The call did not get through (refused, timed out, cut).
    #[error("control plane unreachable: {0}")]
    Unreachable(String),
    /// The control plane answered with an error (its code and detail).
    #[error("the control plane answered {}: {detail}", code.as_str())]
    Rejected { code: ErrorCode, detail: String },
    /// The control plane answered, but not with what the call expects.
    #[error("unreadable answer to {call}: {reason}")]
    Unreadable { call: &'static str, reason: String },
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
    /// Drains node `node` until its agent registers again (the agent's
    /// `drain_on_shutdown`): the drain's report as it starts, or as it is
    /// when one was already under way.
    async fn drain(&self, node: &NodeId) -> Result<DrainReport, LinkError>;
    /// Node `node`'s drain as it is now; `None` when this control plane
    /// does not run it (another one of the cluster may).
    async fn drain_report(&self, node: &NodeId) -> Result<Option<DrainReport>, LinkError>;
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
        path: &'static str,
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
                let body: ErrorResponse =
                    response.json().await.map_err(|e| LinkError::Unreadable {
                        call: path,
                        reason: format!("a refusal without its detail: {e}"),
                    })?;
                Err(LinkError::Refused(body.detail))
            }
            status => {
                let body = response.bytes().await.unwrap_or_default();
                Err(match serde_json::from_slice::<ErrorResponse>(&body) {
                    Ok(error) => LinkError::Rejected {
                        code: error.code,
                        detail: error.detail,
                    },
                    Err(_) => LinkError::Rejected {
                        code: ErrorCode::of_status(status.as_u16()),
                        detail: format!(
                            "{status}: {}",
                            String::from_utf8_lossy(&body[..body.len().min(512)]).trim()
                        ),
                    },
                })
            }
        }
    }

    /// Posts and reads the answer as `T`.
    async fn call<T: serde::de::DeserializeOwned, B: serde::Serialize>(
        &self,
        path: &'static str,
        body: &B,
    ) -> Result<T, LinkError> {
        let answer = self.post(path, body).await?;
        answer.json().await.map_err(unreadable(path))
    }
}

/// The error of an answer that is not the JSON the call expects.
fn unreadable(call: &'static str) -> impl FnOnce(reqwest::Error) -> LinkError {
    move |error| LinkError::Unreadable {
        call,
        reason: error.to_string(),
    }
}

#[async_trait]
impl ControlPlaneLink for HttpLink {
    async fn register(&self, registration: NodeRegistration) -> Result<RegistrationAck, LinkError> {
        self.call("/nodes/register", &registration).await
    }

    async fn heartbeat(&self, heartbeat: Heartbeat) -> Result<RegistrationAck, LinkError> {
        self.call("/nodes/heartbeat", &heartbeat).await
    }

    async fn state_changed(
        &self,
        change: InstanceStateChange,
    ) -> Result<StateChangeAck, LinkError> {
        let call = "/instances/state";
        let response = self.post(call, &change).await?;
        // A control plane of the version before answers 204: it records
        // whatever it is told.
        if response.status() == reqwest::StatusCode::NO_CONTENT {
            return Ok(StateChangeAck { applied: true });
        }
        response.json().await.map_err(unreadable(call))
    }

    async fn instance_event(&self, event: InstanceEventReport) -> Result<(), LinkError> {
        self.post("/instances/events", &event).await.map(drop)
    }

    async fn drain(&self, node: &NodeId) -> Result<DrainReport, LinkError> {
        let request = NodeDrainRequest {
            node_id: node.clone(),
        };
        self.call("/nodes/drain", &request).await
    }

    async fn drain_report(&self, node: &NodeId) -> Result<Option<DrainReport>, LinkError> {
        let request = NodeDrainRequest {
            node_id: node.clone(),
        };
        self.call("/nodes/drain/report", &request).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::StatusCode;
    use axum::response::{IntoResponse, Response};

    /// A control plane that answers its first call with `answer`.
    async fn control_plane(answer: Response) -> HttpLink {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let answer = std::sync::Arc::new(std::sync::Mutex::new(Some(answer)));
        let router = axum::Router::new().fallback(move || {
            let answer = answer.lock().unwrap().take();
            async move { answer.unwrap_or_else(|| StatusCode::GONE.into_response()) }
        });
        tokio::spawn(async move { axum::serve(listener, router).await });
        HttpLink::new(&format!("http://{address}"), "token")
    }

    fn json(status: StatusCode, body: &str) -> Response {
        let content = [("content-type", "application/json")];
        (status, content, body.to_owned()).into_response()
    }

    async fn state_change(link: &HttpLink) -> Result<StateChangeAck, LinkError> {
        link.call("/instances/state", &()).await
    }

    #[tokio::test]
    async fn each_failure_of_the_http_link_keeps_its_cause() {
        let store_down = json(
            StatusCode::INTERNAL_SERVER_ERROR,
            r#"{"detail":"the store is down","code":"internal"}"#,
        );
        let error = state_change(&control_plane(store_down).await).await;
        assert!(
            matches!(&error, Err(LinkError::Rejected { code: ErrorCode::Internal, detail }) if detail == "the store is down"),
            "{error:?}"
        );

        // A proxy's page in front of the control plane: its status says it.
        let page = (StatusCode::BAD_GATEWAY, "<html>bad gateway</html>").into_response();
        let error = state_change(&control_plane(page).await).await;
        assert!(
            matches!(&error, Err(LinkError::Rejected { code: ErrorCode::BadGateway, detail }) if detail.contains("<html>bad gateway")),
            "{error:?}"
        );

        let refusal = json(
            StatusCode::CONFLICT,
            r#"{"detail":"another agent holds node-a","code":"invalid_state"}"#,
        );
        let error = state_change(&control_plane(refusal).await).await;
        assert!(
            matches!(&error, Err(LinkError::Refused(reason)) if reason == "another agent holds node-a"),
            "{error:?}"
        );

        let forgotten = StatusCode::NOT_FOUND.into_response();
        let error = state_change(&control_plane(forgotten).await).await;
        assert!(matches!(error, Err(LinkError::UnknownNode)), "{error:?}");

        // A success whose body is not what the call reads.
        let cut = json(StatusCode::OK, r#"{"applied": "#);
        let error = state_change(&control_plane(cut).await).await;
        assert!(
            matches!(
                error,
                Err(LinkError::Unreadable {
                    call: "/instances/state",
                    ..
                })
            ),
            "{error:?}"
        );

        // Nobody listens (the discard port, closed on loopback; the
        // browsers' unwanted services are pointed at it too).
        let link = HttpLink::new("http://127.0.0.1:9", "token");
        let error = state_change(&link).await;
        assert!(matches!(error, Err(LinkError::Unreachable(_))), "{error:?}");
    }
}
