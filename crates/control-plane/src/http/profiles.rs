//! `/v2/profiles` handlers: extract, call the domain, convert.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Extension, Path, State};
use axum::http::StatusCode;

use flotilla_api_types::profiles::{CreateProfileRequest, Profile, ProfileList};
use flotilla_api_types::{ErrorResponse, MessageResponse};

use super::extract::{ApiJson, NoBody};
use crate::app::{ControlPlane, Scope};
use crate::error::Error;

/// Create an empty persistent profile. Instances start from it with
/// `"profile": {"name": ..., "persist": true}` and write their cookies,
/// localStorage and profile directory back to it when deleted or parked.
#[utoipa::path(post, path = "/v2/profiles", tag = "profiles",
    request_body = CreateProfileRequest,
    responses(
        (status = 201, body = Profile),
        (status = 400, description = "Invalid name or unknown field", body = ErrorResponse),
        (status = 409, description = "A profile of that name exists", body = ErrorResponse),
    ))]
pub async fn profile_create(
    State(control_plane): State<Arc<ControlPlane>>,
    Extension(scope): Extension<Scope>,
    ApiJson(request): ApiJson<CreateProfileRequest>,
) -> Result<(StatusCode, Json<Profile>), Error> {
    let profile = control_plane.profile_create(request, &scope).await?;
    Ok((StatusCode::CREATED, Json(profile)))
}

/// List profiles by name (a tenant's key: its tenant's, by their own names;
/// an admin's: every profile, a tenant's as `<tenant>~<name>`).
#[utoipa::path(get, path = "/v2/profiles", tag = "profiles",
    responses((status = 200, body = ProfileList)))]
pub async fn profile_list(
    State(control_plane): State<Arc<ControlPlane>>,
    Extension(scope): Extension<Scope>,
) -> Result<Json<ProfileList>, Error> {
    Ok(Json(control_plane.profile_list(&scope).await?))
}

/// Get one profile: when it was last saved and the size of its state.
#[utoipa::path(get, path = "/v2/profiles/{name}", tag = "profiles",
    params(("name" = String, Path)),
    responses(
        (status = 200, body = Profile),
        (status = 404, body = ErrorResponse),
    ))]
pub async fn profile_get(
    State(control_plane): State<Arc<ControlPlane>>,
    Extension(scope): Extension<Scope>,
    Path(name): Path<String>,
) -> Result<Json<Profile>, Error> {
    Ok(Json(control_plane.profile_get(&name, &scope).await?))
}

/// Delete a profile and its saved state.
#[utoipa::path(delete, path = "/v2/profiles/{name}", tag = "profiles",
    params(("name" = String, Path)),
    responses(
        (status = 200, body = MessageResponse),
        (status = 404, body = ErrorResponse),
        (status = 409, description = "An instance holds it with persist", body = ErrorResponse),
    ))]
pub async fn profile_delete(
    State(control_plane): State<Arc<ControlPlane>>,
    Extension(scope): Extension<Scope>,
    Path(name): Path<String>,
    NoBody: NoBody,
) -> Result<Json<MessageResponse>, Error> {
    Ok(Json(control_plane.profile_delete(&name, &scope).await?))
}
