//! `/v2/recordings` handlers (kept recordings): extract, call the domain,
//! convert.

use std::sync::Arc;

use axum::Json;
use axum::body::Body;
use axum::extract::{Extension, Path, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};

use flotilla_api_types::instances::{KeptRecordingList, KeptRecordingQuery};
use flotilla_api_types::{ErrorResponse, MessageResponse};

use super::extract::{ApiQuery, NoBody};
use crate::app::{ControlPlane, Scope};
use crate::error::Error;

/// List the recordings kept after their instance was deleted
/// (`config.keep_recordings`), oldest first.
#[utoipa::path(get, path = "/v2/recordings", tag = "recordings",
    params(KeptRecordingQuery),
    responses(
        (status = 200, body = KeptRecordingList),
        (status = 400, description = "Invalid query", body = ErrorResponse),
        (status = 503, description = "The snapshot store cannot be read", body = ErrorResponse),
    ))]
pub async fn recordings_kept(
    State(control_plane): State<Arc<ControlPlane>>,
    Extension(scope): Extension<Scope>,
    ApiQuery(query): ApiQuery<KeptRecordingQuery>,
) -> Result<Json<KeptRecordingList>, Error> {
    Ok(Json(control_plane.recordings_kept(&query, &scope).await?))
}

/// A kept recording's video (MP4/H.264).
#[utoipa::path(get, path = "/v2/recordings/{recording_id}", tag = "recordings",
    params(("recording_id" = String, Path, description = "An id from the listing")),
    responses(
        (status = 200, description = "The video", content_type = "video/mp4"),
        (status = 404, body = ErrorResponse),
        (status = 503, description = "The snapshot store cannot be read", body = ErrorResponse),
    ))]
pub async fn recording_kept(
    State(control_plane): State<Arc<ControlPlane>>,
    Extension(scope): Extension<Scope>,
    Path(id): Path<String>,
) -> Result<Response, Error> {
    let (recording, video) = control_plane.recording_kept(&id, &scope).await?;
    let headers = [
        (header::CONTENT_TYPE, recording.content_type),
        (header::CONTENT_LENGTH, recording.size_bytes.to_string()),
        (header::CACHE_CONTROL, "no-store".to_owned()),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff".to_owned()),
    ];
    Ok((headers, Body::from_stream(video)).into_response())
}

/// Delete a kept recording.
#[utoipa::path(delete, path = "/v2/recordings/{recording_id}", tag = "recordings",
    params(("recording_id" = String, Path)),
    responses(
        (status = 200, body = MessageResponse),
        (status = 404, body = ErrorResponse),
        (status = 503, description = "The snapshot store cannot be reached", body = ErrorResponse),
    ))]
pub async fn recording_kept_delete(
    State(control_plane): State<Arc<ControlPlane>>,
    Extension(scope): Extension<Scope>,
    Path(id): Path<String>,
    NoBody: NoBody,
) -> Result<Json<MessageResponse>, Error> {
    Ok(Json(
        control_plane.recording_kept_delete(&id, &scope).await?,
    ))
}
