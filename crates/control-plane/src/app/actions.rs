//! REST actions (`POST /v2/actions/{action}`): a screenshot, a PDF, the
//! rendered HTML or scraped elements of one page, in a borrowed browser.
//!
//! The browser is an instance like any other (the same placement, create
//! queue, warm pool, isolation and egress policy), created for the job and
//! deleted once it ends, however it ends: an answer, an error, a page that
//! hangs past `timeout_ms`, or a client that goes away mid-job (the request's
//! future is dropped, and the [`ActionRun`] guard deletes the instance). Its
//! `config.max_duration_minutes` also bounds it, so a control plane that dies
//! mid-job leaves nothing behind for longer than that either.

use std::sync::Arc;
use std::time::Instant;

use flotilla_api_types::actions::{ActionKind, ActionRequest, AgentAction};
use flotilla_api_types::instances::{CreateInstanceRequest, InstanceConfig};
use flotilla_api_types::profiles::ProfileUse;
use flotilla_api_types::{ErrorCode, InstanceId};

use super::ControlPlane;
use crate::error::{Error, Result};
use crate::nodes::{ActionResult, NodeCallError};

/// Minutes an action's instance may live beyond its `timeout_ms` (the
/// browser's launch) before the lifetime sweep deletes it.
const LIFETIME_MARGIN_MINUTES: f64 = 2.0;

impl ControlPlane {
    /// Runs action `kind` on a borrowed instance; the result's type and bytes.
    pub async fn action_run(
        self: &Arc<Self>,
        kind: ActionKind,
        request: ActionRequest,
    ) -> Result<ActionResult> {
        let mut run = ActionRun {
            control_plane: self.clone(),
            kind,
            started: Instant::now(),
            instance: None,
            outcome: None,
        };
        let result = run.carry_out(request).await;
        run.outcome = Some(match &result {
            Ok(_) => "ok",
            Err(error) => outcome_of(error),
        });
        result
    }
}

/// One action in progress. When it drops (the action ended, or its client
/// went away) its instance is deleted and its outcome counted.
struct ActionRun {
    control_plane: Arc<ControlPlane>,
    kind: ActionKind,
    started: Instant,
    /// The borrowed instance, once created.
    instance: Option<InstanceId>,
    /// How it ended; `None` while it runs (dropped then: `abandoned`).
    outcome: Option<&'static str>,
}

impl ActionRun {
    async fn carry_out(&mut self, request: ActionRequest) -> Result<ActionResult> {
        let control_plane = self.control_plane.clone();
        let settings = &control_plane.config.actions;
        request
            .validate(self.kind, &settings.limits())
            .map_err(Error::InvalidRequest)?;
        let lifetime = request.timeout_ms() as f64 / 60_000.0 + LIFETIME_MARGIN_MINUTES;
        let create = CreateInstanceRequest {
            image: None,
            config: Some(InstanceConfig {
                proxy: request.proxy.clone(),
                auto_snapshot: false,
                max_duration_minutes: Some(lifetime),
                ..InstanceConfig::default()
            }),
            node_preference: None,
            profile: request.profile.clone().map(|name| ProfileUse {
                name,
                persist: false,
            }),
        };
        let instance = control_plane
            .instance_create_queued(create, settings.queue_wait_sec)
            .await?;
        self.instance = Some(instance.id.clone());
        let node = instance
            .node_id
            .ok_or_else(|| Error::internal("a created instance has no node"))?;
        let connection = control_plane.connection(&node).await?.ok_or_else(|| {
            Error::InsufficientCapacity(format!("node {node} went away; retry the action"))
        })?;
        let action = AgentAction {
            kind: self.kind,
            request,
        };
        connection
            .instance_action(&instance.id, &action)
            .await
            .map_err(refusal)
    }
}

impl Drop for ActionRun {
    fn drop(&mut self) {
        let outcome = self.outcome.unwrap_or("abandoned");
        self.control_plane.telemetry.observe_action(
            self.kind.as_str(),
            outcome,
            self.started.elapsed(),
        );
        let Some(id) = self.instance.take() else {
            return;
        };
        let control_plane = self.control_plane.clone();
        tokio::spawn(async move {
            match control_plane.instance_delete(&id, true).await {
                Ok(_) | Err(Error::NotFound(_)) => {}
                Err(error) => {
                    tracing::warn!(instance = %id, %error, "an action's instance could not be deleted; its max_duration_minutes will end it");
                }
            }
        });
    }
}

/// What the node's refusal of a job means to the action's client.
fn refusal(error: NodeCallError) -> Error {
    match error {
        NodeCallError::Rejected { code, detail } => match code {
            ErrorCode::InvalidRequest => Error::InvalidRequest(detail),
            ErrorCode::Timeout => Error::Timeout(detail),
            ErrorCode::BadGateway => Error::BadGateway(detail),
            ErrorCode::PayloadTooLarge => Error::PayloadTooLarge(detail),
            ErrorCode::InvalidState => Error::InvalidState(detail),
            other => NodeCallError::Rejected {
                code: other,
                detail,
            }
            .into(),
        },
        NodeCallError::Unreachable(detail) => {
            Error::BadGateway(format!("the instance's node did not answer: {detail}"))
        }
    }
}

/// The `outcome` label of an action that failed with `error`.
fn outcome_of(error: &Error) -> &'static str {
    match error {
        Error::InvalidRequest(_) | Error::NotFound(_) => "invalid_request",
        Error::Timeout(_) => "timeout",
        Error::InsufficientCapacity(_) => "no_capacity",
        Error::BadGateway(_) => "page_failed",
        Error::PayloadTooLarge(_) => "too_large",
        _ => "failed",
    }
}
