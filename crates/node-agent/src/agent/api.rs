//! The agent API: what a control plane calls on a node agent over HTTP.
//! Every request carries `Authorization: Bearer <cluster_token>`; others get 401.
//!
//! - `POST   /agent/v1/instances`       — [`AgentCreateInstance`] → 201 [`AgentInstancePorts`]
//! - `DELETE /agent/v1/instances/{id}`  — `?force=true|false` → 204
//! - `POST   /agent/v1/instances/{id}/dormant` — park → 200 [`AgentDormantResult`]
//! - `POST   /agent/v1/instances/{id}/revive`  — [`AgentReviveInstance`] → 202 [`AgentInstancePorts`]
//! - `POST   /agent/v1/instances/{id}/forget`  — drop a dormant instance revived on another node → 204
//! - `POST   /agent/v1/instances/{id}/action`  — [`AgentAction`] → 200, the result itself
//! - `POST   /agent/v1/instances/{id}/page`    — [`AgentPageRequest`] → 200 [`PageAnswer`]
//! - `GET    /agent/v1/instances`       — the agent's [`InstanceReport`]s
//! - `GET    /agent/v1/identity`        — [`AgentIdentity`]: node id, process generation, address
//!
//! Errors are `{detail, code}` like the public API.

use std::sync::Arc;

use axum::Json;
use axum::Router;
use axum::extract::{Path, Query, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use serde::Deserialize;

use flotilla_api_types::actions::AgentAction;
use flotilla_api_types::agent::{
    AgentCreateInstance, AgentDormantResult, AgentIdentity, AgentInstancePorts,
    AgentReviveInstance, InstanceReport,
};
use flotilla_api_types::credentials::{bearer_token, constant_time_eq};
use flotilla_api_types::page::{AgentPageRequest, PageAnswer};
use flotilla_api_types::{ErrorCode, ErrorResponse, InstanceId};

use crate::agent::{Agent, AgentError};
use crate::engine::cdp::CdpError;

#[derive(Clone)]
struct ApiState {
    agent: Agent,
    token: Arc<str>,
}

pub fn router(agent: Agent, cluster_token: &str) -> Router {
    let state = ApiState {
        agent,
        token: Arc::from(cluster_token),
    };
    Router::new()
        .route(
            "/agent/v1/instances",
            get(instance_list).post(instance_create),
        )
        .route("/agent/v1/instances/{id}", delete(instance_delete))
        .route("/agent/v1/instances/{id}/dormant", post(instance_dormant))
        .route("/agent/v1/instances/{id}/revive", post(instance_revive))
        .route("/agent/v1/instances/{id}/forget", post(instance_forget))
        .route(
            "/agent/v1/instances/{id}/page",
            post(instance_page).layer(axum::extract::DefaultBodyLimit::max(ACTION_BODY_LIMIT)),
        )
        .route(
            "/agent/v1/instances/{id}/action",
            post(instance_action).layer(axum::extract::DefaultBodyLimit::max(ACTION_BODY_LIMIT)),
        )
        .route("/agent/v1/identity", get(identity))
        .layer(middleware::from_fn_with_state(state.clone(), require_token))
        // Continues the control plane's trace (`traceparent`).
        .layer(middleware::from_fn(flotilla_telemetry::http_span))
        .with_state(state)
}

/// Who answers here (the control plane tells a restart from a second agent
/// with the same node id by it).
async fn identity(State(state): State<ApiState>) -> Json<AgentIdentity> {
    Json(state.agent.identity())
}

fn error(status: StatusCode, code: ErrorCode, detail: String) -> Response {
    (status, Json(ErrorResponse { detail, code })).into_response()
}

/// The largest action or page-step request the agent reads (the control
/// plane bounds an action's `html` by `actions.max_html_bytes`, which JSON
/// may escape up to six times; an MCP request is at most 4 MiB).
const ACTION_BODY_LIMIT: usize = 256 << 20;

/// The HTTP status an agent error stands for.
pub fn status_of(error: &AgentError) -> StatusCode {
    use crate::protocols::actions::ActionError;
    match error {
        AgentError::Page(page) => {
            use crate::protocols::page_ops::PageError;
            match page {
                PageError::BadInput(_)
                | PageError::StaleElement(_)
                | PageError::NotInFirefox { .. }
                | PageError::Browser(CdpError::NotCdp { .. }) => StatusCode::BAD_REQUEST,
                PageError::Firefox(crate::engine::bidi::BidiError::SessionHeld) => {
                    StatusCode::CONFLICT
                }
                PageError::NoTab(_) => StatusCode::NOT_FOUND,
                PageError::Navigation { .. }
                | PageError::NotStarted(_)
                | PageError::Browser(_)
                | PageError::Firefox(_) => StatusCode::BAD_GATEWAY,
                PageError::Timeout(_) => StatusCode::GATEWAY_TIMEOUT,
                PageError::NoBrowser => StatusCode::CONFLICT,
            }
        }
        AgentError::Action(action) => match action {
            ActionError::BadSelector { .. }
            | ActionError::NoElement { .. }
            | ActionError::BadCookies(_)
            | ActionError::BadHeaders(_)
            | ActionError::NotInFirefox { .. }
            | ActionError::Browser(CdpError::NotCdp { .. }) => StatusCode::BAD_REQUEST,
            ActionError::Navigation { .. }
            | ActionError::NotStarted(_)
            | ActionError::Firefox(_)
            | ActionError::Browser(_) => StatusCode::BAD_GATEWAY,
            ActionError::Timeout { .. } => StatusCode::GATEWAY_TIMEOUT,
            ActionError::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            ActionError::NoBrowser => StatusCode::CONFLICT,
        },
        AgentError::UnknownImage(_)
        | AgentError::ConfigUnsupported { .. }
        | AgentError::ProxyConfig(_)
        | AgentError::FirefoxPrefs(..)
        | AgentError::ProfileEngine { .. } => StatusCode::BAD_REQUEST,
        AgentError::NotFound(_) => StatusCode::NOT_FOUND,
        AgentError::BrowserHeld(_)
        | AgentError::NotRunning { .. }
        | AgentError::NotDormant { .. }
        | AgentError::PathMismatch { .. } => StatusCode::CONFLICT,
        AgentError::StateUnreadable(_) | AgentError::SnapshotNotMade(_) => {
            StatusCode::INTERNAL_SERVER_ERROR
        }
        AgentError::SnapshotNotStored(_) | AgentError::StoreUnreadable { .. } => {
            StatusCode::BAD_GATEWAY
        }
        AgentError::Full { .. } | AgentError::PortsExhausted { .. } | AgentError::ShuttingDown => {
            StatusCode::SERVICE_UNAVAILABLE
        }
    }
}

/// The `code` of an agent error's `{detail, code}`.
pub fn code_of(error: &AgentError) -> ErrorCode {
    match status_of(error) {
        StatusCode::BAD_REQUEST => ErrorCode::InvalidRequest,
        StatusCode::NOT_FOUND => ErrorCode::NotFound,
        StatusCode::CONFLICT => ErrorCode::InvalidState,
        StatusCode::INTERNAL_SERVER_ERROR => ErrorCode::Internal,
        StatusCode::BAD_GATEWAY => ErrorCode::BadGateway,
        StatusCode::GATEWAY_TIMEOUT => ErrorCode::Timeout,
        StatusCode::PAYLOAD_TOO_LARGE => ErrorCode::PayloadTooLarge,
        _ => ErrorCode::InsufficientCapacity,
    }
}

impl IntoResponse for AgentError {
    fn into_response(self) -> Response {
        error(status_of(&self), code_of(&self), self.to_string())
    }
}

async fn require_token(
    State(state): State<ApiState>,
    headers: HeaderMap,
    request: Request,
    next: Next,
) -> Response {
    let presented = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer_token);
    match presented {
        Some(token) if constant_time_eq(token.as_bytes(), state.token.as_bytes()) => {
            next.run(request).await
        }
        _ => error(
            StatusCode::UNAUTHORIZED,
            ErrorCode::Unauthorized,
            "the agent API needs Authorization: Bearer <cluster_token>".into(),
        ),
    }
}

async fn instance_page(
    State(state): State<ApiState>,
    Path(id): Path<InstanceId>,
    Json(request): Json<AgentPageRequest>,
) -> Result<Json<PageAnswer>, AgentError> {
    Ok(Json(state.agent.instance_page(&id, &request).await?))
}

async fn instance_action(
    State(state): State<ApiState>,
    Path(id): Path<InstanceId>,
    Json(action): Json<AgentAction>,
) -> Result<Response, AgentError> {
    let output = state.agent.instance_action(&id, &action).await?;
    Ok(([(header::CONTENT_TYPE, output.content_type)], output.body).into_response())
}

async fn instance_create(
    State(state): State<ApiState>,
    Json(request): Json<AgentCreateInstance>,
) -> Result<(StatusCode, Json<AgentInstancePorts>), AgentError> {
    Ok((
        StatusCode::CREATED,
        Json(state.agent.instance_create(request).await?),
    ))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DeleteQuery {
    #[serde(default)]
    force: bool,
}

async fn instance_delete(
    State(state): State<ApiState>,
    Path(id): Path<String>,
    Query(query): Query<DeleteQuery>,
) -> Result<StatusCode, AgentError> {
    state
        .agent
        .instance_delete(&InstanceId::new(id), query.force)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn instance_dormant(
    State(state): State<ApiState>,
    Path(id): Path<String>,
) -> Result<Json<AgentDormantResult>, AgentError> {
    Ok(Json(
        state.agent.instance_dormant(&InstanceId::new(id)).await?,
    ))
}

async fn instance_forget(
    State(state): State<ApiState>,
    Path(id): Path<String>,
) -> Result<StatusCode, AgentError> {
    state.agent.instance_forget(&InstanceId::new(id)).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn instance_revive(
    State(state): State<ApiState>,
    Path(id): Path<String>,
    Json(request): Json<AgentReviveInstance>,
) -> Result<(StatusCode, Json<AgentInstancePorts>), AgentError> {
    same_instance(&id, &request.id)?;
    let ports = state.agent.instance_revive(request).await?;
    Ok((StatusCode::ACCEPTED, Json(ports)))
}

/// Refuses a body that names another instance than its path.
fn same_instance(path: &str, body: &InstanceId) -> Result<(), AgentError> {
    if body.as_str() == path {
        return Ok(());
    }
    Err(AgentError::PathMismatch {
        path: path.to_owned(),
        body: body.clone(),
    })
}

async fn instance_list(State(state): State<ApiState>) -> Json<Vec<InstanceReport>> {
    Json(state.agent.instance_reports())
}
