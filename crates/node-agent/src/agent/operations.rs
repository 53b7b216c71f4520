//! The one task per instance that carries out its operations: park, revive,
//! delete and the agent's shutdown ([`Request`]), one at a time, in the order
//! they came, each to its end even when its caller stops waiting.
//!
//! Callers send a typed request over the instance's bounded channel
//! ([`InstanceSlot::send`]) and wait for the answer. Two things run beside
//! the task and never block it: the launch of a new instance's browser (a
//! delete must be able to stop it at once) and the watch on a browser's
//! exit. Everything, the task included, changes the instance's state only
//! through the lifecycle table ([`crate::instance::state::transition`]).

use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};

use flotilla_api_types::agent::AgentDormantResult;
use flotilla_api_types::ids::SnapshotId;
use flotilla_api_types::instances::ReviveMethod;

use crate::config::ImageConfig;
use crate::instance::InstanceSlot;

use super::{Agent, AgentError};

/// How many requests an instance's channel holds before senders wait. The
/// lifecycle table lets at most one park or revive be under way; the rest
/// is deletes and the shutdown.
pub const REQUESTS_QUEUED: usize = 8;

/// An operation on one instance.
#[derive(Debug)]
pub enum Request {
    /// Park it (it must be running); answered when it is dormant or the
    /// park failed.
    Park {
        reply: oneshot::Sender<Result<AgentDormantResult, AgentError>>,
    },
    /// Revive it from `snapshot`. It was claimed (moved to `reviving`) by
    /// whoever sent this, and answered then.
    Revive {
        method: ReviveMethod,
        snapshot: SnapshotId,
        image: ImageConfig,
    },
    /// Delete it (gracefully unless `force`); answered once its processes
    /// and files are gone. The task ends with it (unless the agent's
    /// shutdown took the instance first: that shutdown's request follows).
    Delete {
        force: bool,
        reply: oneshot::Sender<()>,
    },
    /// The agent shuts down: stop its browser and report it; answered once
    /// done. The task ends with it.
    ShutDown { reply: oneshot::Sender<()> },
    /// It was revived on another node from the shared snapshot store: drop
    /// it if it is still dormant here (its ports close, so no client wakes
    /// it here again). Its snapshot stays in the store; its recordings stay
    /// on this node, or go to the store when it keeps them. The task ends
    /// with it.
    Forget {
        reply: oneshot::Sender<Result<(), AgentError>>,
    },
}

impl Agent {
    /// Starts the task that carries out the operations of `slot`.
    pub(super) fn start_operations(
        &self,
        slot: &Arc<InstanceSlot>,
        requests: mpsc::Receiver<Request>,
    ) {
        self.inner
            .tasks
            .spawn(self.clone().run_operations(slot.clone(), requests));
    }

    async fn run_operations(self, slot: Arc<InstanceSlot>, mut requests: mpsc::Receiver<Request>) {
        loop {
            let request = tokio::select! {
                biased;
                request = requests.recv() => match request {
                    Some(request) => request,
                    None => return,
                },
                // It ended on its own and was released: whoever still sends
                // finds it gone.
                () = slot.servers.cancelled() => return,
            };
            tracing::debug!(instance = %slot.id, ?request, "operation");
            match request {
                Request::Park { reply } => {
                    let _ = reply.send(self.park(&slot).await);
                }
                Request::Revive {
                    method,
                    snapshot,
                    image,
                } => self.revive(&slot, method, snapshot, image).await,
                Request::Delete { force, reply } => {
                    let deleted = self.delete(&slot, force).await;
                    let _ = reply.send(());
                    // One that found it no longer the agent's (the agent's
                    // shutdown took it) leaves the shutdown queued after it.
                    if deleted {
                        return;
                    }
                }
                Request::ShutDown { reply } => {
                    self.shut_down_instance(&slot).await;
                    let _ = reply.send(());
                    return;
                }
                Request::Forget { reply } => {
                    let forgotten = self.forget(&slot).await;
                    let ended = matches!(forgotten, Ok(true));
                    let _ = reply.send(forgotten.map(|_| ()));
                    if ended {
                        return;
                    }
                }
            }
        }
    }
}
