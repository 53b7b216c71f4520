//! The API node agents call on the control plane (`flotilla agent`), with
//! `Authorization: Bearer <cluster_token>`; without a configured cluster token
//! it answers 401 to everyone.
//!
//! - `POST /internal/v1/nodes/register`  — `NodeRegistration` → 200 `RegistrationAck`
//! - `POST /internal/v1/nodes/heartbeat` — `Heartbeat` → 200 `RegistrationAck`
//!   (the current settings), or 404 when the node must register again
//!   (unknown, or declared offline meanwhile)
//! - `POST /internal/v1/instances/state` — `InstanceStateChange` → `StateChangeAck`
//!   (whether it was recorded)
//! - `POST /internal/v1/instances/events` — `InstanceEventReport` → 204
//! - `POST /internal/v1/nodes/drain` — `NodeDrainRequest` → 200 `DrainReport`:
//!   an agent stopping with `drain_on_shutdown` drains its node until it
//!   registers again
//! - `POST /internal/v1/nodes/drain/report` — `NodeDrainRequest` → 200 the
//!   `DrainReport` this control plane runs for the node, or `null`
//!
//! A node's reports (registration, heartbeat, state change, event) are
//! recorded to their end even when the agent goes away mid-request (killed,
//! its connection cut): a write cut short between the store's commit and its
//! read model's refresh would leave the read model stale.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use flotilla_api_types::agent::{
    Heartbeat, InstanceEventReport, InstanceStateChange, NodeDrainRequest, NodeRegistration,
    RegistrationAck, StateChangeAck,
};
use flotilla_api_types::credentials::{bearer_token, constant_time_eq};
use flotilla_api_types::nodes::DrainReport;

use crate::app::ControlPlane;
use crate::error::Error;

/// Admits requests carrying the cluster token.
pub async fn require_cluster_token(
    State(control_plane): State<Arc<ControlPlane>>,
    request: Request,
    next: Next,
) -> Response {
    let presented = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer_token);
    match (&control_plane.config().cluster_token, presented) {
        (Some(token), Some(presented))
            if constant_time_eq(token.as_bytes(), presented.as_bytes()) =>
        {
            next.run(request).await
        }
        (None, _) => Error::Unauthorized(
            "this control plane has no cluster_token: agents cannot register".into(),
        )
        .into_response(),
        _ => Error::Unauthorized(
            "the internal API needs Authorization: Bearer <cluster_token>".into(),
        )
        .into_response(),
    }
}

pub async fn register(
    State(control_plane): State<Arc<ControlPlane>>,
    Json(registration): Json<NodeRegistration>,
) -> Result<Json<RegistrationAck>, Error> {
    let tasks = control_plane.tasks().clone();
    let registered = tasks.to_completion(NODE_REPORT, async move {
        control_plane.node_register(registration).await
    });
    Ok(Json(registered.await?))
}

/// The background work a node's report is recorded as.
const NODE_REPORT: &str = "node report";

pub async fn heartbeat(
    State(control_plane): State<Arc<ControlPlane>>,
    Json(heartbeat): Json<Heartbeat>,
) -> Result<Json<RegistrationAck>, Error> {
    let node = heartbeat.node_id.clone();
    let tasks = control_plane.tasks().clone();
    let taken = tasks.to_completion(NODE_REPORT, async move {
        control_plane.node_heartbeat(heartbeat).await
    });
    match taken.await? {
        Some(ack) => Ok(Json(ack)),
        None => Err(Error::NotFound(format!("node {node} must register again"))),
    }
}

pub async fn instance_event(
    State(control_plane): State<Arc<ControlPlane>>,
    Json(event): Json<InstanceEventReport>,
) -> Result<StatusCode, Error> {
    let tasks = control_plane.tasks().clone();
    tasks
        .to_completion(NODE_REPORT, async move {
            control_plane.instance_event_reported(event).await
        })
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

pub async fn state_changed(
    State(control_plane): State<Arc<ControlPlane>>,
    Json(change): Json<InstanceStateChange>,
) -> Result<Json<StateChangeAck>, Error> {
    let tasks = control_plane.tasks().clone();
    let applied = tasks.to_completion(NODE_REPORT, async move {
        control_plane.instance_state_changed(change).await
    });
    Ok(Json(StateChangeAck {
        applied: applied.await?,
    }))
}

pub async fn drain(
    State(control_plane): State<Arc<ControlPlane>>,
    Json(request): Json<NodeDrainRequest>,
) -> Result<Json<DrainReport>, Error> {
    Ok(Json(
        control_plane.node_drain(&request.node_id, true).await?,
    ))
}

pub async fn drain_report(
    State(control_plane): State<Arc<ControlPlane>>,
    Json(request): Json<NodeDrainRequest>,
) -> Result<Json<Option<DrainReport>>, Error> {
    Ok(Json(
        control_plane.node_drain_report(&request.node_id).await?,
    ))
}
