//! `/v2/instances` handlers: extract, call the domain, convert. Delete, park
//! and revive run to their end even when the client hangs up, and shutdown
//! waits for them ([`crate::app::tasks::BackgroundTasks::to_completion`]): a
//! half-done lifecycle step is never left behind.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::{Extension, Json};

use flotilla_api_types::instances::{
    CreateInstanceQuery, CreateInstanceRequest, DeleteInstanceQuery, Instance, InstanceList,
    ListInstancesQuery, ReviveRequest,
};
use flotilla_api_types::{ErrorResponse, InstanceId, MessageResponse};

use super::extract::{ApiJson, ApiQuery, NoBody, OptionalApiJson};
use crate::app::{ControlPlane, Scope};
use crate::error::Error;

/// Create an instance. It starts `creating` and becomes `running` once its
/// browser answers CDP. With authentication on, `urls.debug` and `urls.stream`
/// carry the instance's access token (`?token=`): the instance's own ports
/// admit it, or an API key, and answer 401 `{detail, code}` to anything else.
#[utoipa::path(post, path = "/v2/instances", tag = "instances",
    request_body = CreateInstanceRequest,
    params(CreateInstanceQuery),
    responses(
        (status = 201, description = "Accepted; the browser starts in the background", body = Instance),
        (status = 400, description = "Invalid request (or unknown profile)", body = ErrorResponse),
        (status = 409, description = "The profile is held by another instance with persist", body = ErrorResponse),
        (status = 429, description = "The key's tenant holds its tenants.max_instances (or the key's rate limit is spent)", body = ErrorResponse),
        (status = 503, description = "No node has room (within wait_sec, when given)", body = ErrorResponse),
    ))]
pub async fn instance_create(
    State(control_plane): State<Arc<ControlPlane>>,
    Extension(scope): Extension<Scope>,
    ApiQuery(query): ApiQuery<CreateInstanceQuery>,
    ApiJson(request): ApiJson<CreateInstanceRequest>,
) -> Result<(StatusCode, Json<Instance>), Error> {
    let wait_sec = query.wait_sec.unwrap_or(0);
    let created = control_plane
        .instance_create_waiting(request, wait_sec, &scope)
        .await?;
    Ok((StatusCode::CREATED, Json(created)))
}

/// List instances, filtered and paged.
#[utoipa::path(get, path = "/v2/instances", tag = "instances",
    params(ListInstancesQuery),
    responses(
        (status = 200, body = InstanceList),
        (status = 400, description = "Invalid query", body = ErrorResponse),
    ))]
pub async fn instance_list(
    State(control_plane): State<Arc<ControlPlane>>,
    Extension(scope): Extension<Scope>,
    ApiQuery(query): ApiQuery<ListInstancesQuery>,
) -> Result<Json<InstanceList>, Error> {
    Ok(Json(control_plane.instance_list(query, &scope).await?))
}

/// Get one instance with its configuration, resources, activity and `urls`
/// (with the access token when authentication is on).
#[utoipa::path(get, path = "/v2/instances/{instance_id}", tag = "instances",
    params(("instance_id" = String, Path)),
    responses(
        (status = 200, body = Instance),
        (status = 404, body = ErrorResponse),
    ))]
pub async fn instance_get(
    State(control_plane): State<Arc<ControlPlane>>,
    Extension(principal): Extension<crate::app::keys::Principal>,
    Extension(scope): Extension<Scope>,
    Path(id): Path<String>,
) -> Result<Json<Instance>, Error> {
    let instance = control_plane
        .instance_get(&InstanceId::new(id), (&principal.0, &scope))
        .await?;
    Ok(Json(instance))
}

/// Delete an instance: graceful browser shutdown unless `force=true`.
#[utoipa::path(delete, path = "/v2/instances/{instance_id}", tag = "instances",
    params(("instance_id" = String, Path), DeleteInstanceQuery),
    responses(
        (status = 200, body = MessageResponse),
        (status = 400, description = "Invalid query", body = ErrorResponse),
        (status = 404, body = ErrorResponse),
    ))]
pub async fn instance_delete(
    State(control_plane): State<Arc<ControlPlane>>,
    Path(id): Path<String>,
    ApiQuery(query): ApiQuery<DeleteInstanceQuery>,
) -> Result<Json<MessageResponse>, Error> {
    let id = InstanceId::new(id);
    let tasks = control_plane.tasks().clone();
    let removed = tasks.to_completion("delete", async move {
        control_plane.instance_delete(&id, query.force).await
    });
    Ok(Json(removed.await?))
}

/// Park an instance: snapshot its state and stop its browser. Its ports stay;
/// a client that connects wakes it.
#[utoipa::path(post, path = "/v2/instances/{instance_id}/dormant", tag = "instances",
    params(("instance_id" = String, Path)),
    responses(
        (status = 200, description = "Parked: id, status, snapshot_id, dormant_since", body = Instance),
        (status = 400, description = "A body was sent (this operation takes none)", body = ErrorResponse),
        (status = 404, body = ErrorResponse),
        (status = 409, description = "Not running or idle, or a WebDriver BiDi client holds a Firefox's only session", body = ErrorResponse),
        (status = 503, description = "Its node is unreachable, or the snapshot store cannot take the snapshot (the instance keeps running)", body = ErrorResponse),
    ))]
pub async fn instance_dormant(
    State(control_plane): State<Arc<ControlPlane>>,
    Path(id): Path<String>,
    NoBody: NoBody,
) -> Result<Json<Instance>, Error> {
    let id = InstanceId::new(id);
    let tasks = control_plane.tasks().clone();
    let parked = tasks.to_completion(
        "park",
        async move { control_plane.instance_dormant(&id).await },
    );
    Ok(Json(parked.await?))
}

/// Revive a dormant instance (`quick_start` by default, or `full_restore`).
#[utoipa::path(post, path = "/v2/instances/{instance_id}/revive", tag = "instances",
    params(("instance_id" = String, Path)),
    request_body(content = Option<ReviveRequest>, description = "Optional; default method quick_start"),
    responses(
        (status = 200, description = "Reviving: id, status, estimated_completion", body = Instance),
        (status = 400, description = "Unknown method or field", body = ErrorResponse),
        (status = 404, body = ErrorResponse),
        (status = 409, description = "Not dormant", body = ErrorResponse),
        (status = 429, description = "A failed or stopped instance of a tenant that holds its max_instances", body = ErrorResponse),
        (status = 503, description = "No node can take it, or the snapshot store cannot be read (the instance stays dormant)", body = ErrorResponse),
    ))]
pub async fn instance_revive(
    State(control_plane): State<Arc<ControlPlane>>,
    Path(id): Path<String>,
    OptionalApiJson(request): OptionalApiJson<ReviveRequest>,
) -> Result<Json<Instance>, Error> {
    let id = InstanceId::new(id);
    let tasks = control_plane.tasks().clone();
    let started = tasks.to_completion("revive", async move {
        control_plane.instance_revive(&id, request.method).await
    });
    Ok(Json(started.await?))
}
