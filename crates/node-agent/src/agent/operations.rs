//! The agent's operations on one instance: park, revive, delete, forget and
//! the agent's shutdown ([`Request`]), each made an
//! [`crate::instance::runner::Operation`] that the instance's runner carries
//! out, one at a time, in the order they came, each to its end even when its
//! caller stops waiting.
//!
//! Callers queue a typed request ([`Agent::submit`]) and wait for the
//! answer. Two things run beside the runner and never block it: the launch
//! of a new instance's browser (a delete must be able to stop it at once)
//! and the watch on a browser's exit; they tell the runner what happened
//! (a launch done, an exit) by messages.

use std::sync::Arc;

use tokio::sync::oneshot;

use flotilla_api_types::agent::AgentDormantResult;
use flotilla_api_types::ids::SnapshotId;
use flotilla_api_types::instances::ReviveMethod;

use crate::config::ImageConfig;
use crate::instance::InstanceSlot;
use crate::instance::runner::{After, Operation};

use super::{Agent, AgentError};

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
    /// Queues `request` to the runner of `slot`, waiting while its queue is
    /// full; gives it back when the runner has ended (the instance was
    /// deleted or ended).
    pub(super) async fn submit(
        &self,
        slot: &Arc<InstanceSlot>,
        request: Request,
    ) -> Result<(), ()> {
        let name = request.name();
        let (agent, target) = (self.clone(), slot.clone());
        let work = Box::pin(async move { agent.carry_out_request(&target, request).await });
        slot.send(Operation { name, work }).await.map_err(drop)
    }

    /// Carries out `request` in the runner of `slot`.
    async fn carry_out_request(self, slot: &Arc<InstanceSlot>, request: Request) -> After {
        match request {
            Request::Park { reply } => {
                let _ = reply.send(self.park(slot).await);
                After::Continue
            }
            Request::Revive {
                method,
                snapshot,
                image,
            } => {
                self.revive(slot, method, snapshot, image).await;
                After::Continue
            }
            Request::Delete { force, reply } => {
                let deleted = self.delete(slot, force).await;
                let _ = reply.send(());
                // One that found it no longer the agent's (the agent's
                // shutdown took it) leaves the shutdown queued after it.
                if deleted {
                    After::Ended
                } else {
                    After::Continue
                }
            }
            Request::ShutDown { reply } => {
                self.shut_down_instance(slot).await;
                let _ = reply.send(());
                After::Ended
            }
            Request::Forget { reply } => {
                let forgotten = self.forget(slot).await;
                let ended = matches!(forgotten, Ok(true));
                let _ = reply.send(forgotten.map(|_| ()));
                if ended { After::Ended } else { After::Continue }
            }
        }
    }
}

impl Request {
    fn name(&self) -> &'static str {
        match self {
            Request::Park { .. } => "park",
            Request::Revive { .. } => "revive",
            Request::Delete { .. } => "delete",
            Request::ShutDown { .. } => "shutdown",
            Request::Forget { .. } => "forget",
        }
    }
}
