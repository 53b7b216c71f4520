//! `GET /v2/metrics`, `GET /metrics` and `GET /v2/alerts`.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Extension, State};
use axum::http::header;
use axum::response::IntoResponse;

use flotilla_api_types::ErrorResponse;
use flotilla_api_types::alerts::{AlertList, ListAlertsQuery};
use flotilla_api_types::metrics::{MetricsQuery, MetricsResponse};
use flotilla_api_types::prometheus::CONTENT_TYPE;

use super::extract::ApiQuery;
use crate::app::{ControlPlane, Scope};
use crate::error::Error;

/// Cluster (or one node's) counts and resources now, and their history over
/// the period: 1h in 1-minute points, 24h in 5-minute points, 7d hourly. A
/// tenant's key gets its own instances' counts; the fleet's figures (nodes,
/// resources and their series) are 0 for it, and a `node_id` is 404.
#[utoipa::path(get, path = "/v2/metrics", tag = "metrics",
    params(MetricsQuery),
    responses(
        (status = 200, body = MetricsResponse),
        (status = 400, description = "Invalid period", body = ErrorResponse),
        (status = 404, description = "Unknown node", body = ErrorResponse),
    ))]
pub async fn metrics(
    State(control_plane): State<Arc<ControlPlane>>,
    Extension(scope): Extension<Scope>,
    ApiQuery(query): ApiQuery<MetricsQuery>,
) -> Result<Json<MetricsResponse>, Error> {
    Ok(Json(control_plane.metrics(query, &scope).await?))
}

/// Prometheus text exposition: `service_instances_total{status}`,
/// `service_node_cpu_percent{node}`, request latency, operation durations,
/// webhook deliveries and the outbox depth.
#[utoipa::path(get, path = "/metrics", tag = "metrics",
    // Open unless `metrics_require_auth`: a credential is optional.
    security((), ("bearer" = [])),
    responses((status = 200, description = "Prometheus text format", content_type = "text/plain"), (status = 404, description = "A tenant's key: this route is an admin key's", body = ErrorResponse)))]
pub async fn prometheus(
    State(control_plane): State<Arc<ControlPlane>>,
) -> Result<impl IntoResponse, Error> {
    let gauges = control_plane.prometheus_gauges().await?;
    Ok((
        [(header::CONTENT_TYPE, CONTENT_TYPE)],
        control_plane.telemetry().render(&gauges),
    ))
}

/// Alerts raised from the `monitoring` thresholds (active ones by default).
#[utoipa::path(get, path = "/v2/alerts", tag = "metrics",
    params(ListAlertsQuery),
    responses(
        (status = 200, body = AlertList),
        (status = 400, description = "Invalid query", body = ErrorResponse),
        (status = 404, description = "A tenant's key: this route is an admin key's", body = ErrorResponse),
    ))]
pub async fn alerts(
    State(control_plane): State<Arc<ControlPlane>>,
    ApiQuery(query): ApiQuery<ListAlertsQuery>,
) -> Result<Json<AlertList>, Error> {
    Ok(Json(control_plane.alerts_list(query).await?))
}
