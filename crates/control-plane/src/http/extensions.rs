//! `/v2/extensions` handlers: extract, call the domain, convert.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Extension as Ext, Path, State};
use axum::http::StatusCode;

use flotilla_api_types::extensions::{Extension, ExtensionList};
use flotilla_api_types::{ErrorResponse, MessageResponse};

use super::extract::{NoBody, ZipBody};
use crate::app::{ControlPlane, Scope};
use crate::error::Error;

/// Upload an unpacked Chromium extension as a zip (Manifest V3; its
/// `manifest.json` at the root or in the zip's one top-level folder; at most
/// 50 MiB, 10,000 entries and 256 MiB unpacked). Instances load it with
/// `"config": {"extensions": ["<id>"]}` on the `chromium` image.
#[utoipa::path(post, path = "/v2/extensions", tag = "extensions",
    request_body(content = Vec<u8>, content_type = "application/zip",
        description = "The extension's folder as a zip file"),
    responses(
        (status = 201, body = Extension),
        (status = 400, description = "Not a zip, not application/zip, or not a loadable extension (the reason is in detail)", body = ErrorResponse),
        (status = 413, description = "The zip is larger than 50 MiB", body = ErrorResponse),
        (status = 503, description = "The snapshot store cannot keep it now", body = ErrorResponse),
    ))]
pub async fn extension_upload(
    State(control_plane): State<Arc<ControlPlane>>,
    Ext(scope): Ext<Scope>,
    ZipBody(zip): ZipBody,
) -> Result<(StatusCode, Json<Extension>), Error> {
    let extension = control_plane.extension_upload(zip, &scope).await?;
    Ok((StatusCode::CREATED, Json(extension)))
}

/// List uploaded extensions (a tenant's key: its tenant's), oldest first.
#[utoipa::path(get, path = "/v2/extensions", tag = "extensions",
    responses((status = 200, body = ExtensionList)))]
pub async fn extension_list(
    State(control_plane): State<Arc<ControlPlane>>,
    Ext(scope): Ext<Scope>,
) -> Result<Json<ExtensionList>, Error> {
    Ok(Json(control_plane.extension_list(&scope).await?))
}

/// Get one extension.
#[utoipa::path(get, path = "/v2/extensions/{id}", tag = "extensions",
    params(("id" = String, Path)),
    responses(
        (status = 200, body = Extension),
        (status = 404, body = ErrorResponse),
    ))]
pub async fn extension_get(
    State(control_plane): State<Arc<ControlPlane>>,
    Ext(scope): Ext<Scope>,
    Path(id): Path<String>,
) -> Result<Json<Extension>, Error> {
    Ok(Json(control_plane.extension_get(&id, &scope).await?))
}

/// Delete an extension and its zip.
#[utoipa::path(delete, path = "/v2/extensions/{id}", tag = "extensions",
    params(("id" = String, Path)),
    responses(
        (status = 200, body = MessageResponse),
        (status = 404, body = ErrorResponse),
        (status = 409, description = "An instance loads it", body = ErrorResponse),
    ))]
pub async fn extension_delete(
    State(control_plane): State<Arc<ControlPlane>>,
    Ext(scope): Ext<Scope>,
    Path(id): Path<String>,
    NoBody: NoBody,
) -> Result<Json<MessageResponse>, Error> {
    Ok(Json(control_plane.extension_delete(&id, &scope).await?))
}
