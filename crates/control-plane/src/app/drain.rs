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
use crate::store::{DrainRecord, Expected, InstanceRecord, NodeRecord};

/// How long a moved instance may take to run again on its new node.
const REVIVE_DEADLINE: Duration = Duration::from_secs(120);
/// How long a revive a stopped drain had recorded may stay unknown to its
/// node before it is taken for one that never reached it.
const NEVER_ARRIVED: chrono::TimeDelta = chrono::TimeDelta::seconds(10);
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

/// How long a drain's lease lasts: the control plane running the drain
/// renews it every third of that, and another takes the drain over once it
/// lapses (its runner stopped).
const DRAIN_LEASE: Duration = Duration::from_secs(10);

/// [`DRAIN_LEASE`] as the store counts it.
fn drain_lease_ttl() -> chrono::Duration {
    chrono::Duration::from_std(DRAIN_LEASE).expect("a short lease")
}

/// The lease whose holder runs node `node`'s drain.
fn drain_lease(node: &NodeId) -> String {
    format!("drain:{node}")
}

/// A drain this process runs: its report as it stands (the store holds the
/// same, for every control plane), and what ends it.
pub(crate) struct Drain {
    report: DrainReport,
    ended: CancellationToken,
    /// Cancelled once its lease is lost: it writes nothing more.
    lost: CancellationToken,
}

/// Which drain a runner writes to: its node, and when it started.
type DrainKey<'a> = (&'a NodeId, chrono::DateTime<chrono::Utc>);

/// A node's previous drain, as a new one is asked for.
enum Previous {
    /// None, or finished.
    Done,
    /// Under way: a new drain answers its report.
    UnderWay(DrainReport),
    /// Ended (uncordoned, or its agent restarted) and not yet finished: a
    /// new drain takes its place (its runner's further writes are refused).
    Ending(chrono::DateTime<chrono::Utc>),
}

impl Previous {
    /// The report a drain that could not start answers: the one under way.
    fn report(self, node: &NodeId) -> Result<DrainReport> {
        match self {
            Previous::UnderWay(report) => Ok(report),
            _ => Err(Error::InvalidState(format!(
                "node {node} is being drained by another control plane; retry"
            ))),
        }
    }
}

/// Where a drain's runner starts from.
struct Plan {
    /// When the drain started: which drain its writes belong to.
    started_at: chrono::DateTime<chrono::Utc>,
    /// The instances to move, in order.
    queue: Vec<InstanceId>,
    /// The instances already tried (moved, or stayed).
    tried: std::collections::HashSet<InstanceId>,
    /// A drain until the node's agent restarts: what cannot move is parked.
    until_restart: bool,
    /// Taken over from a runner that stopped: the first of `queue` may be
    /// its move in flight.
    resumed: bool,
}

impl ControlPlane {
    /// Starts draining node `id`: marks it, and moves its instances in the
    /// background; the report as it starts (or that of the drain already
    /// under way, whichever control plane runs it).
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
        let ending = match self.drain_under_way(&node).await? {
            Previous::UnderWay(report) => return Ok(report),
            Previous::Ending(started_at) => Some(started_at),
            Previous::Done => None,
        };
        let lease = drain_lease_ttl();
        if !self
            .store
            .lease_acquire(&drain_lease(id), &self.holder, self.now(), lease)
            .await?
        {
            // Another control plane began one a moment ago.
            return self.drain_under_way(&node).await?.report(id);
        }
        let running = self.store.instances_on_node(id, &movable()).await?;
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
        let record = DrainRecord {
            report: report.clone(),
            until_restart,
        };
        if !self.store.drain_begin(&record, ending).await? {
            return self.drain_under_way(&node).await?.report(id);
        }
        self.store
            .node_set_draining(id, true, until_restart)
            .await?;
        tracing::info!(node = %id, instances = running.len(), "node draining");
        self.run_drain_here(record, false);
        Ok(report)
    }

    /// What became of `node`'s previous drain.
    async fn drain_under_way(&self, node: &NodeRecord) -> Result<Previous> {
        let Some(drain) = self.store.drain_get(&node.id).await? else {
            return Ok(Previous::Done);
        };
        Ok(if drain.report.finished {
            Previous::Done
        } else if node.draining {
            Previous::UnderWay(drain.report)
        } else {
            Previous::Ending(drain.report.started_at)
        })
    }

    /// Takes over the unfinished drains whose control plane stopped (their
    /// lease lapsed), each from its stored report; how many it took.
    pub async fn drains_take_over(self: &Arc<Self>) -> Result<u64> {
        let lease = drain_lease_ttl();
        let mut taken = 0;
        for drain in self.store.drains_unfinished().await? {
            let node = drain.report.node_id.clone();
            if self.drains.lock().expect("drains lock").contains_key(&node) {
                continue;
            }
            if !self
                .store
                .lease_acquire(&drain_lease(&node), &self.holder, self.now(), lease)
                .await?
            {
                continue;
            }
            tracing::warn!(%node, moving = drain.report.moving.len(), "taking over a drain whose control plane stopped");
            self.run_drain_here(drain, true);
            taken += 1;
        }
        Ok(taken)
    }

    /// Runs `drain` in this process (`resumed`: taken over from another),
    /// renewing its lease throughout; it stops, leaving the drain to another
    /// control plane, when this process stops (the lease given up) or the
    /// lease is lost (then it writes nothing more).
    fn run_drain_here(self: &Arc<Self>, drain: DrainRecord, resumed: bool) {
        let node = drain.report.node_id.clone();
        let started_at = drain.report.started_at;
        let report = &drain.report;
        let plan = Plan {
            started_at,
            queue: report.moving.clone(),
            // What the stopped runner tried is not tried again.
            tried: (report.moved.iter().map(|m| m.instance_id.clone()))
                .chain(report.stayed.iter().map(|s| s.instance_id.clone()))
                .collect(),
            until_restart: drain.until_restart,
            resumed,
        };
        let (ended, lost) = (CancellationToken::new(), CancellationToken::new());
        let runner = Drain {
            report: drain.report,
            ended: ended.clone(),
            lost: lost.clone(),
        };
        if let Some(previous) = self
            .drains
            .lock()
            .expect("drains lock")
            .insert(node.clone(), runner)
        {
            previous.ended.cancel();
        }
        let control_plane = self.clone();
        self.tasks().spawn("node drain", async move {
            tokio::select! {
                () = control_plane.run_drain(&node, plan, (ended, lost.clone())) => {}
                () = control_plane.keep_drain_lease(&node) => lost.cancel(),
                () = lost.cancelled() => {}
            }
            if !lost.is_cancelled() {
                let name = drain_lease(&node);
                let released = control_plane
                    .store
                    .lease_release(&name, &control_plane.holder);
                if let Err(error) = released.await {
                    tracing::warn!(%node, %error, "cannot give a drain's lease up");
                }
            }
            let mut drains = control_plane.drains.lock().expect("drains lock");
            if drains
                .get(&node)
                .is_some_and(|d| d.report.started_at == started_at)
            {
                drains.remove(&node);
            }
        });
    }

    /// Renews node `node`'s drain lease until it cannot: another control
    /// plane holds it, or the store did not answer for the lease's length.
    async fn keep_drain_lease(&self, node: &NodeId) {
        let lease = drain_lease_ttl();
        let mut held_until = tokio::time::Instant::now() + DRAIN_LEASE;
        loop {
            tokio::time::sleep(DRAIN_LEASE / 3).await;
            let name = drain_lease(node);
            let renewal = self
                .store
                .lease_acquire(&name, &self.holder, self.now(), lease);
            match tokio::time::timeout(DRAIN_LEASE / 3, renewal).await {
                Ok(Ok(true)) => held_until = tokio::time::Instant::now() + DRAIN_LEASE,
                Ok(Ok(false)) => {
                    tracing::warn!(%node, "another control plane took this drain over");
                    return;
                }
                outcome => {
                    let error = match outcome {
                        Ok(Err(error)) => error.to_string(),
                        _ => "the store did not answer".to_owned(),
                    };
                    if tokio::time::Instant::now() + DRAIN_LEASE / 3 >= held_until {
                        tracing::warn!(%node, %error, "this drain's lease lapses: another control plane takes it over");
                        return;
                    }
                    tracing::warn!(%node, %error, "cannot renew a drain's lease");
                }
            }
        }
    }

    /// The drain of `node`, from `plan.queue` (its instances to move) until
    /// every instance on it was tried, or it is ended (uncordon, here or on
    /// another control plane; its agent restarting after a drain until
    /// restart): each move in turn, then the instances that were on their
    /// way (creating, reviving) once they run, waiting up to
    /// [`SETTLE_ROUNDS`] seconds for them. With `plan.resumed`, the first of
    /// the queue may be a move the drain's stopped runner had begun. When
    /// this process stops, or `lost` (the lease), it returns at once, the
    /// drain unfinished for another to resume.
    async fn run_drain(
        &self,
        node: &NodeId,
        mut plan: Plan,
        (ended, lost): (CancellationToken, CancellationToken),
    ) {
        let stopping = self.tasks().stopping();
        let mut rounds = 0;
        let (movable, on_their_way) = (movable(), on_their_way());
        loop {
            for id in std::mem::take(&mut plan.queue) {
                if stopping.is_cancelled() || lost.is_cancelled() {
                    return;
                }
                // A move once begun runs to its end; an end of the drain is
                // heeded between moves.
                let outcome = if ended.is_cancelled() || !self.still_draining(node).await {
                    Err(Stayed::DrainEnded)
                } else {
                    let span = flotilla_telemetry::operation("instance.move", Some(id.as_str()));
                    let moved = self.move_or_resume(node, &id, (plan.until_restart, plan.resumed));
                    flotilla_telemetry::traced(span, moved).await
                };
                plan.resumed = false;
                plan.tried.insert(id.clone());
                self.drain_progress((node, plan.started_at), &id, outcome)
                    .await;
            }
            let left = self.instances_left(node, &plan.tried).await;
            let waiting = left.iter().any(|r| on_their_way.contains(&r.status));
            plan.queue = left
                .iter()
                .filter(|r| movable.contains(&r.status))
                .map(|r| r.id.clone())
                .collect();
            self.drain_moving((node, plan.started_at), &plan.queue)
                .await;
            let ending =
                plan.queue.is_empty() && (ended.is_cancelled() || !self.still_draining(node).await);
            if plan.queue.is_empty() && (ending || !waiting || rounds >= SETTLE_ROUNDS) {
                for record in left.iter().filter(|r| on_their_way.contains(&r.status)) {
                    let stayed = if ending {
                        Stayed::DrainEnded
                    } else {
                        Stayed::InTransitThroughout(record.status)
                    };
                    self.drain_progress((node, plan.started_at), &record.id, Err(stayed))
                        .await;
                }
                break;
            }
            if plan.queue.is_empty() {
                rounds += 1;
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_secs(1)) => {}
                    () = ended.cancelled() => {}
                    () = stopping.cancelled() => return,
                    () = lost.cancelled() => return,
                }
            }
        }
        self.drain_progress_finished((node, plan.started_at)).await;
    }

    /// Whether node `node` is still marked draining (an uncordon on any
    /// control plane, or its agent's restart after a drain until restart,
    /// clears the mark).
    async fn still_draining(&self, node: &NodeId) -> bool {
        match self.store.node_get(node).await {
            Ok(record) => record.is_some_and(|record| record.draining),
            Err(error) => {
                tracing::warn!(%node, %error, "a drain cannot read its node");
                true
            }
        }
    }

    /// Ends node `id`'s drain: it takes new instances again (the control
    /// plane running the drain sees it before its next move).
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

    /// The latest drain of node `id`, whichever control plane ran it.
    pub async fn node_drain_report(&self, id: &NodeId) -> Result<Option<DrainReport>> {
        Ok(self.store.drain_get(id).await?.map(|drain| drain.report))
    }

    /// Changes this process's drain of `node` with `change`, then writes its
    /// report to the store, under its lease; a write the lease no longer
    /// covers marks the drain lost (its runner stops).
    async fn drain_update(
        &self,
        (node, started_at): DrainKey<'_>,
        change: impl FnOnce(&mut DrainReport),
    ) {
        let (report, lost) = {
            let mut drains = self.drains.lock().expect("drains lock");
            let Some(drain) = drains.get_mut(node) else {
                return;
            };
            // Another drain of the node took this one's place.
            if drain.lost.is_cancelled() || drain.report.started_at != started_at {
                return;
            }
            change(&mut drain.report);
            (drain.report.clone(), drain.lost.clone())
        };
        let lease = drain_lease(node);
        match self
            .store
            .drain_report(&report, (&lease, &self.holder), self.now())
            .await
        {
            Ok(true) => {}
            Ok(false) => {
                tracing::warn!(%node, "this drain's lease is another control plane's now: it stops here");
                lost.cancel();
            }
            Err(error) => tracing::warn!(%node, %error, "cannot write a drain's report"),
        }
    }

    async fn drain_progress(
        &self,
        key @ (node, _): DrainKey<'_>,
        id: &InstanceId,
        outcome: std::result::Result<NodeId, Stayed>,
    ) {
        if let Err(stayed) = &outcome {
            tracing::warn!(instance = %id, %node, reason = %stayed, "an instance stayed on its draining node");
        }
        self.drain_update(key, |report| {
            report.moving.retain(|moving| moving != id);
            match outcome {
                Ok(to_node) => report.moved.push(MovedInstance {
                    instance_id: id.clone(),
                    to_node,
                }),
                Err(stayed) => report.stayed.push(StayedInstance {
                    instance_id: id.clone(),
                    reason: stayed.to_string(),
                }),
            }
        })
        .await;
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
    async fn drain_moving(&self, key: DrainKey<'_>, moving: &[InstanceId]) {
        self.drain_update(key, |report| {
            for id in moving {
                if !report.moving.contains(id) {
                    report.moving.push(id.clone());
                }
            }
        })
        .await;
    }

    async fn drain_progress_finished(&self, key @ (node, _): DrainKey<'_>) {
        self.drain_update(key, |report| {
            report.finished = true;
            tracing::info!(%node, moved = report.moved.len(), stayed = report.stayed.len(), "node drained");
        })
        .await;
    }

    /// Moves instance `id` off `from`; with `resumed`, it may be the move a
    /// stopped runner had begun: parked and not yet revived (it is revived
    /// elsewhere now), reviving (it is waited for), or done (it runs
    /// elsewhere).
    async fn move_or_resume(
        &self,
        from: &NodeId,
        id: &InstanceId,
        (park_when_stuck, resumed): (bool, bool),
    ) -> std::result::Result<NodeId, Stayed> {
        if resumed && let Some(record) = self.store.instance_get(id).await? {
            match record.status {
                InstanceStatus::Dormant if &record.node_id == from => {
                    self.room_elsewhere(from, &record).await?;
                    return self.revive_elsewhere(from, id).await;
                }
                InstanceStatus::Reviving => return self.resume_revive(from, id).await,
                // The stopped runner's move had finished.
                InstanceStatus::Running | InstanceStatus::Idle if &record.node_id != from => {
                    return Ok(record.node_id);
                }
                _ => {}
            }
        }
        self.move_instance(from, id, park_when_stuck).await
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
        self.revive_elsewhere(from, id).await
    }

    /// Revives instance `id`, parked off its draining node `from`, on
    /// another node: the node it runs on now, or why it stayed.
    async fn revive_elsewhere(
        &self,
        from: &NodeId,
        id: &InstanceId,
    ) -> std::result::Result<NodeId, Stayed> {
        if let Err(error) = self.instance_revive(id, ReviveMethod::FullRestore).await {
            return Err(match self.store.instance_get(id).await.ok().flatten() {
                Some(now) if now.status == InstanceStatus::Dormant => {
                    Stayed::NotRevived(error, id.clone())
                }
                Some(now) => Stayed::Overtaken(now.status, now.node_id, error),
                None => Stayed::DeletedWhileMoving,
            });
        }
        self.moved_once_revived(from, id).await
    }

    /// Instance `id`, revived off `from`, once it runs: the node it runs
    /// on, told as `instance.moved`.
    async fn moved_once_revived(
        &self,
        from: &NodeId,
        id: &InstanceId,
    ) -> std::result::Result<NodeId, Stayed> {
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

    /// A revive the stopped runner had begun: waited for while its node
    /// has it; when its node has not had it for [`NEVER_ARRIVED`] (the
    /// runner stopped between recording the revive and asking), undone
    /// (parked again, its snapshot kept) and made again.
    async fn resume_revive(
        &self,
        from: &NodeId,
        id: &InstanceId,
    ) -> std::result::Result<NodeId, Stayed> {
        let deadline = tokio::time::Instant::now() + REVIVE_DEADLINE;
        loop {
            let record = self
                .store
                .instance_get(id)
                .await?
                .ok_or(Stayed::DeletedWhileMoving)?;
            if record.status != InstanceStatus::Reviving {
                break;
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(Stayed::ReviveUnfinished(record.node_id));
            }
            if self.now() - record.updated_at > NEVER_ARRIVED
                && !self.node_has(&record.node_id, id).await
            {
                let undone = lifecycle::sources(Event::ReviveUndone(InstanceStatus::Dormant));
                let this_revive =
                    Expected::reported(&undone, &record.node_id, record.operation_id.as_ref());
                let reason = "its revive never reached its node: parked again, to be revived anew";
                self.store
                    .instance_transition(
                        id,
                        this_revive,
                        InstanceStatus::Dormant,
                        Some(reason),
                        self.now(),
                    )
                    .await?;
                tracing::warn!(instance = %id, node = %record.node_id, "{reason}");
                return self.revive_elsewhere(from, id).await;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        self.moved_once_revived(from, id).await
    }

    /// Whether `node` reports instance `id` (yes when it cannot be asked:
    /// the revive is then waited for).
    async fn node_has(&self, node: &NodeId, id: &InstanceId) -> bool {
        let Ok(Some(connection)) = self.connection(node).await else {
            return true;
        };
        match connection.instance_reports().await {
            Ok(reports) => reports.iter().any(|report| &report.id == id),
            Err(_) => true,
        }
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
