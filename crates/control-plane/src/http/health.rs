//! `GET /health`.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::{Extension, Json};

use flotilla_api_types::health::{Health, HealthStatus};

use crate::app::keys::Principal;
use crate::app::{ControlPlane, Scope};

/// Service health: 200 when healthy or degraded, 503 when unhealthy. The
/// background tasks' last errors show to a caller with an admin API key (or
/// to anyone with authentication off).
#[utoipa::path(get, path = "/health", tag = "health", security(()),
    responses((status = 200, body = Health), (status = 503, body = Health)))]
pub async fn health(
    State(control_plane): State<Arc<ControlPlane>>,
    Extension(principal): Extension<Principal>,
    Extension(scope): Extension<Scope>,
) -> (StatusCode, Json<Health>) {
    let trusted = principal.reads_the_fleet(control_plane.config().auth_enabled, &scope);
    let health = control_plane.health(trusted).await;
    let status = match health.status {
        HealthStatus::Unhealthy => StatusCode::SERVICE_UNAVAILABLE,
        HealthStatus::Healthy | HealthStatus::Degraded => StatusCode::OK,
    };
    (status, Json(health))
}
