//! REST actions (`POST /v2/actions/{action}`): a screenshot, a PDF, the
//! rendered HTML or scraped elements of one page, in a borrowed browser.
//! Also the MCP server's page steps on an instance's node
//! ([`ControlPlane::instance_page`]), the other job on a page.
//!
//! The browser is an instance like any other (the same placement, create
//! queue, warm pool, isolation and egress policy), created for the job and
//! deleted once it ends, however it ends: an answer, an error, a page that
//! hangs past `timeout_ms`, or a client that goes away mid-job.
//!
//! Each action runs in a task of its own, which the request only waits on:
//! a client that leaves cancels the job, but never a create halfway (a
//! create runs to its end, and what it made is deleted). The instance's
//! `config.max_duration_minutes` also bounds it, so a control plane that dies
//! mid-job leaves nothing behind for longer than that either. At most
//! `actions.max_pending` actions are held at once (waiting for room or
//! running); more are refused at once with 503.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use tokio_util::sync::CancellationToken;

use flotilla_api_types::InstanceId;
use flotilla_api_types::actions::{ActionKind, ActionRequest, AgentAction};
use flotilla_api_types::instances::{CreateInstanceRequest, InstanceConfig};
use flotilla_api_types::profiles::ProfileUse;

use super::held_instances::HeldFor;
use super::{ControlPlane, Scope};
use crate::error::{Error, Result};
use crate::nodes::ActionResult;

/// Minutes an action's instance may live beyond its `timeout_ms` (the
/// browser's launch) before the lifetime sweep deletes it.
const LIFETIME_MARGIN_MINUTES: f64 = 2.0;

/// Actions held by this control plane now (waiting for room or running).
#[derive(Default)]
pub struct ActionsInProgress(Arc<AtomicUsize>);

/// One held action; dropping it frees its place.
struct Held(Arc<AtomicUsize>);

impl Drop for Held {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl ActionsInProgress {
    /// A place, if fewer than `max` are held.
    fn hold(&self, max: usize) -> Option<Held> {
        self.0
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                (held < max).then_some(held + 1)
            })
            .ok()
            .map(|_| Held(self.0.clone()))
    }
}

/// Why an action ended without a result, for its `outcome` label.
enum Ended {
    Failed(Error),
    /// Its client went away.
    Abandoned,
}

impl ControlPlane {
    /// Runs action `kind` on a borrowed instance; the result's type and bytes.
    pub async fn action_run(
        self: &Arc<Self>,
        kind: ActionKind,
        request: ActionRequest,
        scope: Scope,
    ) -> Result<ActionResult> {
        let started = Instant::now();
        let settings = &self.config.actions;
        let checked = request
            .validate(kind, &settings.limits())
            .map_err(|invalid| Error::InvalidRequest(invalid.to_string()));
        if let Err(error) = checked {
            self.telemetry
                .observe_action(kind.as_str(), "invalid_request", started.elapsed());
            return Err(error);
        }
        let Some(held) = self.actions_in_progress.hold(settings.max_pending) else {
            self.telemetry
                .observe_action(kind.as_str(), "no_capacity", started.elapsed());
            return Err(Error::InsufficientCapacity(format!(
                "{} actions are in progress, the most this control plane holds (actions.max_pending): retry shortly",
                settings.max_pending
            )));
        };
        // The client leaving drops this future, and with it the guard that
        // cancels the job.
        let client_gone = CancellationToken::new();
        let _cancel_when_dropped = client_gone.clone().drop_guard();
        let (answer, answered) = tokio::sync::oneshot::channel();
        let control_plane = self.clone();
        tokio::spawn(async move {
            let _held = held;
            let mut instance = None;
            let ended = control_plane
                .action_steps((kind, request, &scope), &mut instance, &client_gone)
                .await;
            let outcome = match &ended {
                Ok(_) => "ok",
                Err(Ended::Abandoned) => "abandoned",
                Err(Ended::Failed(error)) => outcome_of(error),
            };
            control_plane
                .telemetry
                .observe_action(kind.as_str(), outcome, started.elapsed());
            let _ = answer.send(ended.map_err(|ended| match ended {
                Ended::Failed(error) => error,
                Ended::Abandoned => Error::internal("the action's client went away"),
            }));
            if let Some(id) = instance {
                control_plane.action_instance_delete(&id).await;
            }
        });
        answered
            .await
            .unwrap_or_else(|_| Err(Error::internal("the action's task ended without an answer")))
    }

    /// Creates the action's instance (recorded in `instance` as soon as it
    /// exists) and runs the job on it, unless `client_gone` first.
    async fn action_steps(
        &self,
        (kind, request, scope): (ActionKind, ActionRequest, &Scope),
        instance: &mut Option<InstanceId>,
        client_gone: &CancellationToken,
    ) -> std::result::Result<ActionResult, Ended> {
        let settings = &self.config.actions;
        let lifetime = request.timeout_ms() as f64 / 60_000.0 + LIFETIME_MARGIN_MINUTES;
        let create = CreateInstanceRequest {
            image: request.image.clone(),
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
        // Not cancelled halfway: a create dropped between its record and
        // its answer would leave an instance nobody knows to delete.
        let created = self
            .instance_create_queued(create, settings.queue_wait_sec, scope)
            .await
            .map_err(|error| Ended::Failed(named_for_actions(error)))?;
        *instance = Some(created.id.clone());
        self.instance_hold(&created.id, HeldFor::Action).await;
        if client_gone.is_cancelled() {
            return Err(Ended::Abandoned);
        }
        let node = created
            .node_id
            .ok_or_else(|| Ended::Failed(Error::internal("a created instance has no node")))?;
        let connection = self
            .connection(&node)
            .await
            .map_err(Ended::Failed)?
            .ok_or_else(|| {
                Ended::Failed(Error::InsufficientCapacity(format!(
                    "node {node} went away; retry the action"
                )))
            })?;
        let action = AgentAction { kind, request };
        tokio::select! {
            done = connection.instance_action(&created.id, &action) => {
                done.map_err(|error| Ended::Failed(Error::of_page_job(&node, error)))
            }
            _ = client_gone.cancelled() => Err(Ended::Abandoned),
        }
    }

    /// Carries out an MCP step on an instance's page, on its node.
    pub async fn instance_page(
        &self,
        id: &InstanceId,
        request: &flotilla_api_types::page::AgentPageRequest,
    ) -> Result<flotilla_api_types::page::PageAnswer> {
        let record = self
            .store
            .instance_get(id)
            .await?
            .ok_or_else(|| Error::NotFound(format!("no instance {id}")))?;
        let connection = self.connection(&record.node_id).await?.ok_or_else(|| {
            Error::BadGateway(format!(
                "node {} of instance {id} is not reachable",
                record.node_id
            ))
        })?;
        connection
            .instance_page(id, request)
            .await
            .map_err(|error| Error::of_page_job(&record.node_id, error))
    }

    /// Deletes an action's instance; one that cannot be deleted now is left
    /// to the held instance takeover (and its `max_duration_minutes`).
    async fn action_instance_delete(&self, id: &InstanceId) {
        if let Err(error) = self.held_instance_delete(id).await {
            tracing::warn!(instance = %id, %error, "an action's instance could not be deleted; the held instance takeover tries again");
        }
    }
}

/// A create's refusal in an action's words (`profile`, not `profile.name`;
/// `proxy`, not `config.proxy`).
fn named_for_actions(error: Error) -> Error {
    match error {
        Error::InvalidRequest(detail) => Error::InvalidRequest(
            detail
                .replacen("profile.name:", "profile:", 1)
                .replacen("config.proxy", "proxy", 1),
        ),
        other => other,
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
