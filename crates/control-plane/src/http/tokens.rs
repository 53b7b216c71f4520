//! `POST /v2/tokens` and the event proxy's verification webhook.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::{Extension, Json};

use flotilla_api_types::ErrorResponse;
use flotilla_api_types::tokens::{TokenRequest, TokenResponse, VerifyRequest, VerifyResponse};

use super::extract::{ApiJson, OptionalApiJson};
use super::guard::Principal;
use crate::app::{ControlPlane, Scope};
use crate::error::Error;

/// Issue a short-lived token for subscribing to lifecycle events on the event
/// proxy (`GET /events/instances`, `/events/instances.<id>`, …).
#[utoipa::path(post, path = "/v2/tokens", tag = "events",
    request_body(content = Option<TokenRequest>),
    responses(
        (status = 201, body = TokenResponse),
        (status = 400, body = ErrorResponse),
    ))]
pub async fn token_create(
    State(control_plane): State<Arc<ControlPlane>>,
    Extension(principal): Extension<Principal>,
    Extension(scope): Extension<Scope>,
    OptionalApiJson(request): OptionalApiJson<TokenRequest>,
) -> Result<(StatusCode, Json<TokenResponse>), Error> {
    let token = control_plane
        .token_issue(request, (&principal.0, &scope))
        .await?;
    Ok((StatusCode::CREATED, Json(token)))
}

/// The verification webhook of the event proxy (`jwt_verifier.webhook_url`):
/// open, since the token it carries is the credential.
#[utoipa::path(post, path = "/v2/tokens/verify", tag = "events", security(()),
    request_body = VerifyRequest,
    responses((status = 200, body = VerifyResponse), (status = 400, body = ErrorResponse)))]
pub async fn token_verify(
    State(control_plane): State<Arc<ControlPlane>>,
    ApiJson(request): ApiJson<VerifyRequest>,
) -> Result<Json<VerifyResponse>, Error> {
    Ok(Json(control_plane.token_verify(request).await?))
}
