//! `GET /health`.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;

use flotilla_api_types::health::{Health, HealthStatus};

use crate::app::ControlPlane;

/// Service health: 200 when healthy or degraded, 503 when unhealthy.
#[utoipa::path(get, path = "/health", tag = "health", security(()),
    responses((status = 200, body = Health), (status = 503, body = Health)))]
pub async fn health(State(control_plane): State<Arc<ControlPlane>>) -> (StatusCode, Json<Health>) {
    let health = control_plane.health().await;
    let status = match health.status {
        HealthStatus::Unhealthy => StatusCode::SERVICE_UNAVAILABLE,
        HealthStatus::Healthy | HealthStatus::Degraded => StatusCode::OK,
    };
    (status, Json(health))
}
