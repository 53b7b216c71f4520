//! `/v2/nodes` handlers.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, State};

use flotilla_api_types::nodes::{Node, NodeList};
use flotilla_api_types::{ErrorResponse, NodeId};

use crate::app::ControlPlane;
use crate::error::Error;

/// List nodes.
#[utoipa::path(get, path = "/v2/nodes", tag = "nodes", responses((status = 200, body = NodeList)))]
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
