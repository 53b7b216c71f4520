//! `/v2/nodes` handlers.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, State};

use axum::http::StatusCode;

use flotilla_api_types::nodes::{DrainReport, Node, NodeList};
use flotilla_api_types::{ErrorResponse, NodeId};

use crate::app::ControlPlane;
use crate::error::Error;

/// List nodes.
#[utoipa::path(get, path = "/v2/nodes", tag = "nodes", responses((status = 200, body = NodeList), (status = 404, description = "A tenant's key: this route is an admin key's", body = ErrorResponse)))]
pub async fn node_list(
    State(control_plane): State<Arc<ControlPlane>>,
) -> Result<Json<NodeList>, Error> {
    Ok(Json(control_plane.node_list().await?))
}

/// Get one node with its capabilities.
#[utoipa::path(get, path = "/v2/nodes/{node_id}", tag = "nodes",
    params(("node_id" = String, Path)),
    responses((status = 200, body = Node), (status = 404, body = ErrorResponse)))]
pub async fn node_get(
    State(control_plane): State<Arc<ControlPlane>>,
    Path(id): Path<String>,
) -> Result<Json<Node>, Error> {
    Ok(Json(control_plane.node_get(&NodeId::new(id)).await?))
}

/// Drain a node: it takes no new instance, and each of its running or idle
/// instances moves to another node (parked to the shared snapshot store,
/// revived there with its tabs, cookies and storage; its URLs stay), one at
/// a time, in the background. Instances no other node can take stay, with
/// the reason. `GET /v2/nodes/{node_id}` shows the progress (`drain`).
#[utoipa::path(post, path = "/v2/nodes/{node_id}/drain", tag = "nodes",
    params(("node_id" = String, Path), DrainQuery),
    responses(
        (status = 202, body = DrainReport, description = "Draining: the instances that will move"),
        (status = 400, body = ErrorResponse, description = "An invalid query (until_restart not true or false, an unknown parameter)"),
        (status = 404, body = ErrorResponse),
        (status = 409, body = ErrorResponse, description = "The node is offline"),
    ))]
pub async fn node_drain(
    State(control_plane): State<Arc<ControlPlane>>,
    Path(id): Path<String>,
    crate::http::ApiQuery(query): crate::http::ApiQuery<DrainQuery>,
) -> Result<(StatusCode, Json<DrainReport>), Error> {
    let until_restart = query.until_restart.unwrap_or(false);
    let report = control_plane
        .node_drain(&NodeId::new(id), until_restart)
        .await?;
    Ok((StatusCode::ACCEPTED, Json(report)))
}

/// End a node's drain: it takes new instances again (instances still to
/// move stay).
#[utoipa::path(post, path = "/v2/nodes/{node_id}/uncordon", tag = "nodes",
    params(("node_id" = String, Path)),
    responses((status = 200, body = Node), (status = 404, body = ErrorResponse)))]
pub async fn node_uncordon(
    State(control_plane): State<Arc<ControlPlane>>,
    Path(id): Path<String>,
) -> Result<Json<Node>, Error> {
    Ok(Json(control_plane.node_uncordon(&NodeId::new(id)).await?))
}

/// Query of `POST /v2/nodes/{node_id}/drain`.
#[derive(Debug, Clone, Default, serde::Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct DrainQuery {
    /// End the drain when an agent of another process generation registers
    /// for the node (the agent that drained its node before it stopped came
    /// back); default false: until uncordoned.
    pub until_restart: Option<bool>,
}
