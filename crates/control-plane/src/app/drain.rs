//! Draining a node (`POST /v2/nodes/{id}/drain`): it takes no new instance
//! (the store's `draining` mark, which placement reads), and each of its
//! running or idle instances moves, one at a time, to another node: parked
//! to the shared snapshot store (`full` state: tabs, cookies, storage) and
//! revived elsewhere with `full_restore`, so that clients reconnect through
//! the same front-door URL. An instance moves only when another node has
//! room for it first; one that cannot stays, with the reason in the report.
//! `instance.moved` tells each move. Instances that were being created or
//! revived when the drain began are waited for and moved in turn. `POST /v2/nodes/{id}/uncordon` ends it (the instance moving then
//! finishes; the others stay); a drain `until_restart` also ends when an
//! agent of another process generation registers for the node (the agent
//! that drained itself before it stopped came back).

use std::sync::Arc;
use std::time::Duration;

use flotilla_api_types::events::EventName;
use flotilla_api_types::instances::{InstanceStatus, ReviveMethod};
use flotilla_api_types::nodes::{DrainReport, MovedInstance, Node, StayedInstance};
use flotilla_api_types::{InstanceId, NodeId};
use tokio_util::sync::CancellationToken;

use super::ControlPlane;
use super::lifecycle::{self, Event};
use crate::error::{Error, Result};
use crate::scheduler::{self, PlacementRequest};
use crate::store::InstanceRecord;

/// How long a moved instance may take to run again on its new node.
const REVIVE_DEADLINE: Duration = Duration::from_secs(120);
/// How many times the drain looks again for instances left on the node
/// (ones that were being created, revived or parked), a second apart.
const SETTLE_ROUNDS: usize = 30;
/// The states a drain moves an instance from: those a park takes it from
/// (the lifecycle table's).
fn movable() -> Vec<InstanceStatus> {
    lifecycle::sources(Event::Parked)
}

/// The states on an instance's way to running: those a create's start and
/// a revive's end take it from (the lifecycle table's).
fn on_their_way() -> Vec<InstanceStatus> {
    let mut states = lifecycle::sources(Event::Started);
    states.extend(lifecycle::sources(Event::Revived));
    states
}

/// Why a drain left an instance on its node (the report's `reason`).
#[derive(Debug, thiserror::Error)]
enum Stayed {
    #[error("the drain was ended (uncordon, or its control plane stopped) before it moved")]
    DrainEnded,
    #[error("it was {0} throughout the drain")]
    InTransitThroughout(InstanceStatus),
    #[error("it was deleted before its turn")]
    DeletedBefore,
    #[error("it had moved to node {0} meanwhile")]
    MovedMeanwhile(NodeId),
    #[error("it was {0} at its turn")]
    NotRunning(InstanceStatus),
    #[error("no other node can take it: {0}")]
    NoRoom(String),
    #[error(
        "{0}; its node is stopping, so it was parked: revive it with POST /v2/instances/{1}/revive"
    )]
    ParkedInPlace(Box<Stayed>, InstanceId),
    #[error("{0}; it could not be parked either: {1}")]
    NotParkedEither(Box<Stayed>, Error),
    #[error("it could not be parked: {0}")]
    ParkFailed(Error),
    #[error(
        "it was parked but no other node revived it ({0}); it is dormant: revive it later with POST /v2/instances/{1}/revive"
    )]
    NotRevived(Error, InstanceId),
    #[error("it was parked, then was {0} on node {1} before the drain revived it ({2})")]
    Overtaken(InstanceStatus, NodeId, Error),
    #[error("it was deleted while it moved")]
    DeletedWhileMoving,
    #[error("its revive on node {0} had not finished after {REVIVE_DEADLINE:?}")]
    ReviveUnfinished(NodeId),
    #[error("its revive on node {0} ended {1}: {2}")]
    ReviveEnded(NodeId, InstanceStatus, String),
    #[error("it was revived on this node (a client woke it as it moved)")]
    RevivedHere,
    #[error(transparent)]
    Failed(#[from] Error),
    #[error(transparent)]
    Store(#[from] sqlx::Error),
}

/// A drain this process runs or ran: its report, and what ends it.
pub(crate) struct Drain {
    report: DrainReport,
    ended: CancellationToken,
}

impl ControlPlane {
    /// Starts draining node `id`: marks it, and moves its instances in the
    /// background; the report as it starts.
    pub async fn node_drain(
        self: &Arc<Self>,
        id: &NodeId,
        until_restart: bool,
    ) -> Result<DrainReport> {
        let node = self
            .store
            .node_get(id)
            .await?
            .ok_or_else(|| Error::NotFound(format!("node {id} not found")))?;
        if node.status != flotilla_api_types::nodes::NodeStatus::Online {
            return Err(Error::InvalidState(format!(
                "node {id} is {}: only an online node can be drained",
                node.status.as_str()
            )));
        }
        let running = self.store.instances_on_node(id, &movable()).await?;
        let ended = CancellationToken::new();
        let report = DrainReport {
            node_id: id.clone(),
            started_at: self.now(),
            // Set by the drain's task once it is done, even with nothing to
            // move: instances on their way (creating, reviving) are waited for.
            finished: false,
            moved: Vec::new(),
            moving: running.iter().map(|r| r.id.clone()).collect(),
            stayed: Vec::new(),
        };
        if let Some(report) = self.node_drain_report(id).filter(|report| !report.finished) {
            return Ok(report);
        }
        self.store
            .node_set_draining(id, true, until_restart)
            .await?;
        {
            let mut drains = self.drains.lock().expect("drains lock");
            if let Some(drain) = drains.get(id)
                && !drain.report.finished
            {
                return Ok(drain.report.clone());
            }
            if let Some(previous) = drains.insert(
                id.clone(),
                Drain {
                    report: report.clone(),
                    ended: ended.clone(),
                },
            ) {
                previous.ended.cancel();
            }
        }
        tracing::info!(node = %id, instances = running.len(), "node draining");
        let control_plane = self.clone();
        let queue = running.into_iter().map(|r| r.id).collect();
        let node = id.clone();
        self.tasks().spawn("node drain", async move {
            control_plane
                .run_drain(&node, queue, (until_restart, ended))
                .await;
        });
        Ok(report)
    }

    /// The drain of `node`, from `queue` (its running instances) until every
    /// instance on it was tried, or `ended` (uncordon) or this process
    /// stops: each move in turn, then the instances that were on their way
    /// (creating, reviving) once they run, waiting up to [`SETTLE_ROUNDS`]
    /// seconds for them.
    async fn run_drain(
        &self,
        node: &NodeId,
        mut queue: Vec<InstanceId>,
        (until_restart, ended): (bool, CancellationToken),
    ) {
        let stopping = self.tasks().stopping();
        let mut tried = std::collections::HashSet::new();
        let mut rounds = 0;
        let (movable, on_their_way) = (movable(), on_their_way());
        loop {
            for id in std::mem::take(&mut queue) {
                // A move once begun runs to its end; an end of the drain (or
                // of this process) is heeded between moves.
                let outcome = if ended.is_cancelled() || stopping.is_cancelled() {
                    Err(Stayed::DrainEnded)
                } else {
                    let span = flotilla_telemetry::operation("instance.move", Some(id.as_str()));
                    let moved = self.move_instance(node, &id, until_restart);
                    flotilla_telemetry::traced(span, moved).await
                };
                tried.insert(id.clone());
                self.drain_progress(node, &id, outcome);
            }
            let left = self.instances_left(node, &tried).await;
            let waiting = left.iter().any(|r| on_their_way.contains(&r.status));
            queue = left
                .iter()
                .filter(|r| movable.contains(&r.status))
                .map(|r| r.id.clone())
                .collect();
            self.drain_moving(node, &queue);
            if queue.is_empty() && (!waiting || rounds >= SETTLE_ROUNDS) {
                for record in left.iter().filter(|r| on_their_way.contains(&r.status)) {
                    let stayed = Stayed::InTransitThroughout(record.status);
                    self.drain_progress(node, &record.id, Err(stayed));
                }
                break;
            }
            if queue.is_empty() {
                rounds += 1;
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_secs(1)) => {}
                    () = ended.cancelled() => {}
                    () = stopping.cancelled() => {}
                }
            }
        }
        self.drain_progress_finished(node);
    }

    /// Ends node `id`'s drain: it takes new instances again.
    pub async fn node_uncordon(&self, id: &NodeId) -> Result<Node> {
        if !self.store.node_set_draining(id, false, false).await? {
            return Err(Error::NotFound(format!("node {id} not found")));
        }
        if let Some(drain) = self.drains.lock().expect("drains lock").get(id) {
            drain.ended.cancel();
        }
        self.create_queue.capacity_changed();
        tracing::info!(node = %id, "node uncordoned");
        self.node_get(id).await
    }

    /// The latest drain of node `id` this process ran.
    pub fn node_drain_report(&self, id: &NodeId) -> Option<DrainReport> {
        let drains = self.drains.lock().expect("drains lock");
        drains.get(id).map(|drain| drain.report.clone())
    }

    fn drain_progress(
        &self,
        node: &NodeId,
        id: &InstanceId,
        outcome: std::result::Result<NodeId, Stayed>,
    ) {
        let mut drains = self.drains.lock().expect("drains lock");
        let Some(drain) = drains.get_mut(node) else {
            return;
        };
        drain.report.moving.retain(|moving| moving != id);
        match outcome {
            Ok(to_node) => drain.report.moved.push(MovedInstance {
                instance_id: id.clone(),
                to_node,
            }),
            Err(stayed) => {
                let reason = stayed.to_string();
                tracing::warn!(instance = %id, %node, %reason, "an instance stayed on its draining node");
                drain.report.stayed.push(StayedInstance {
                    instance_id: id.clone(),
                    reason,
                });
            }
        }
    }

    /// The instances on `node` the drain has not tried yet, running or on
    /// their way to it.
    async fn instances_left(
        &self,
        node: &NodeId,
        tried: &std::collections::HashSet<InstanceId>,
    ) -> Vec<InstanceRecord> {
        let states = [movable(), on_their_way()].concat();
        match self.store.instances_on_node(node, &states).await {
            Ok(records) => records
                .into_iter()
                .filter(|r| !tried.contains(&r.id))
                .collect(),
            Err(error) => {
                tracing::warn!(%node, %error, "a drain cannot read its node's instances");
                Vec::new()
            }
        }
    }

    /// The instances still to move.
    fn drain_moving(&self, node: &NodeId, moving: &[InstanceId]) {
        if let Some(drain) = self.drains.lock().expect("drains lock").get_mut(node) {
            for id in moving {
                if !drain.report.moving.contains(id) {
                    drain.report.moving.push(id.clone());
                }
            }
        }
    }

    fn drain_progress_finished(&self, node: &NodeId) {
        if let Some(drain) = self.drains.lock().expect("drains lock").get_mut(node) {
            drain.report.finished = true;
            tracing::info!(%node, moved = drain.report.moved.len(), stayed = drain.report.stayed.len(), "node drained");
        }
    }

    /// Moves instance `id` off its draining node `from`: the node it runs
    /// on now, or why it stayed. When no other node has room and the node
    /// is going away (`park_when_stuck`: a drain until its agent restarts),
    /// the instance is parked where it is instead of left to be stopped.
    async fn move_instance(
        &self,
        from: &NodeId,
        id: &InstanceId,
        park_when_stuck: bool,
    ) -> std::result::Result<NodeId, Stayed> {
        flotilla_telemetry::record("node.id", from.as_str());
        let record = self.its_turn(from, id).await?;
        // Room elsewhere first: nothing is parked that cannot move.
        if let Err(no_room) = self.room_elsewhere(from, &record).await {
            if !park_when_stuck {
                return Err(no_room);
            }
            return Err(match self.instance_dormant(id).await {
                Ok(_) => Stayed::ParkedInPlace(Box::new(no_room), id.clone()),
                Err(error) => Stayed::NotParkedEither(Box::new(no_room), error),
            });
        }
        self.instance_dormant(id)
            .await
            .map_err(Stayed::ParkFailed)?;
        if let Err(error) = self.instance_revive(id, ReviveMethod::FullRestore).await {
            return Err(match self.store.instance_get(id).await.ok().flatten() {
                Some(now) if now.status == InstanceStatus::Dormant => {
                    Stayed::NotRevived(error, id.clone())
                }
                Some(now) => Stayed::Overtaken(now.status, now.node_id, error),
                None => Stayed::DeletedWhileMoving,
            });
        }
        let to = self.revived(id).await?.node_id;
        if &to == from {
            return Err(Stayed::RevivedHere);
        }
        let mut data = serde_json::Map::new();
        data.insert("from_node".into(), from.as_str().into());
        data.insert("to_node".into(), to.as_str().into());
        self.store
            .instance_note(id, EventName::InstanceMoved, data, self.now())
            .await?;
        tracing::info!(instance = %id, %from, %to, "instance moved");
        Ok(to)
    }

    /// Instance `id` as it is at its turn, if it is still there to move: it
    /// may have moved, been parked or deleted meanwhile.
    async fn its_turn(
        &self,
        from: &NodeId,
        id: &InstanceId,
    ) -> std::result::Result<InstanceRecord, Stayed> {
        let record = self
            .store
            .instance_get(id)
            .await?
            .ok_or(Stayed::DeletedBefore)?;
        if &record.node_id != from {
            return Err(Stayed::MovedMeanwhile(record.node_id));
        }
        if !movable().contains(&record.status) {
            return Err(Stayed::NotRunning(record.status));
        }
        Ok(record)
    }

    /// Whether another node that shares `from`'s snapshot store has room
    /// for `record`.
    async fn room_elsewhere(
        &self,
        from: &NodeId,
        record: &InstanceRecord,
    ) -> std::result::Result<(), Stayed> {
        let all = self.store.node_list().await?;
        let (others, unshared) = super::dormancy::nodes_sharing_the_store(all, from);
        let usage = self.node_usage().await?;
        let placement = PlacementRequest {
            image: &record.image,
            config: &record.config,
            preference: None,
        };
        let ranked = if others.is_empty() && !unshared.is_empty() {
            Err(Error::InsufficientCapacity(unshared))
        } else {
            scheduler::rank(&others, &usage, &placement, self.now(), &self.config).map(drop)
        };
        ranked.map_err(|error| match error {
            Error::InsufficientCapacity(detail) | Error::InvalidRequest(detail) => {
                Stayed::NoRoom(detail)
            }
            other => Stayed::Failed(other),
        })
    }

    /// Instance `id` once its revive elsewhere has finished (running or
    /// idle), within [`REVIVE_DEADLINE`].
    async fn revived(&self, id: &InstanceId) -> std::result::Result<InstanceRecord, Stayed> {
        let deadline = tokio::time::Instant::now() + REVIVE_DEADLINE;
        loop {
            let now = self
                .store
                .instance_get(id)
                .await?
                .ok_or(Stayed::DeletedWhileMoving)?;
            match now.status {
                InstanceStatus::Running | InstanceStatus::Idle => return Ok(now),
                InstanceStatus::Reviving if tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                InstanceStatus::Reviving => return Err(Stayed::ReviveUnfinished(now.node_id)),
                other => {
                    let reason = now.status_reason.unwrap_or_default();
                    return Err(Stayed::ReviveEnded(now.node_id, other, reason));
                }
            }
        }
    }
}
