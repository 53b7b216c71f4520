//! `POST /v2/tokens`, the event proxy's verification webhook, and
//! `GET /v2/whoami` (what the request's key is).

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::{Extension, Json};

use flotilla_api_types::ErrorResponse;
use flotilla_api_types::tokens::{
    KeyScope, TokenRequest, TokenResponse, VerifyRequest, VerifyResponse, WhoAmI,
};

use super::extract::{ApiJson, OptionalApiJson};
use crate::app::keys::Principal;
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

/// What the request's key is: an admin's (the whole fleet) or a tenant's
/// (its own objects), so that a client (the dashboard) shows what it may use.
#[utoipa::path(get, path = "/v2/whoami", tag = "events",
    responses((status = 200, body = WhoAmI)))]
pub async fn whoami(
    Extension(principal): Extension<Principal>,
    Extension(scope): Extension<Scope>,
) -> Json<WhoAmI> {
    Json(WhoAmI {
        principal: principal.0,
        scope: match scope {
            Scope::Admin => KeyScope::Admin,
            Scope::Tenant(_) => KeyScope::Tenant,
        },
        tenant: scope.tenant().map(str::to_owned),
    })
}
