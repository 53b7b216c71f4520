//! Nodes: registration and reconciliation, heartbeats, the offline sweep, and
//! the public node views.

use std::collections::{HashMap, HashSet};

use chrono::{DateTime, Utc};

use flotilla_api_types::agent::{Heartbeat, InstanceReport, NodeRegistration, RegistrationAck};
use flotilla_api_types::ids::SnapshotId;
use flotilla_api_types::instances::InstanceStatus;
use flotilla_api_types::nodes::{Node, NodeList, NodeStatus};
use flotilla_api_types::{InstanceId, NodeId};

use std::sync::Arc;

use super::ControlPlane;
use super::lifecycle::{self, Event};
use super::views;
use crate::error::{Error, Result};
use crate::nodes::HttpNode;
use crate::scheduler::NodeUsage;
use crate::store::{Expected, InstanceRecord};

/// The most refused agents `/v2/nodes` lists.
const MAX_REFUSED_AGENTS: usize = 100;

/// What a node's last heartbeat to this process told besides its
/// resources: its warm pools and what its agent's loops did.
#[derive(Debug, Clone, Default)]
pub struct Heard {
    pub warm_pools: Vec<flotilla_api_types::agent::WarmPoolReport>,
    pub loops: Vec<flotilla_api_types::health::BackgroundTaskHealth>,
}

impl ControlPlane {
    /// What the online nodes among `nodes` last told of `part`, by node.
    pub(crate) fn heard_from_online<T: Clone>(
        &self,
        nodes: &[crate::store::NodeRecord],
        part: impl Fn(&Heard) -> &[T],
    ) -> Vec<(String, T)> {
        let heard = self.heard.lock().expect("heard lock");
        nodes
            .iter()
            .filter(|n| n.status == NodeStatus::Online)
            .filter_map(|n| Some((n, heard.get(&n.id)?)))
            .flat_map(|(n, heard)| {
                part(heard)
                    .iter()
                    .map(|item| (n.id.as_str().to_owned(), item.clone()))
                    .collect::<Vec<_>>()
            })
            .collect()
    }
}

impl ControlPlane {
    pub async fn node_list(&self) -> Result<NodeList> {
        let occupancy: HashMap<_, _> = self.store.node_occupancy().await?.into_iter().collect();
        let nodes = self.store.node_list().await?;
        let refused = self
            .refused_agents
            .lock()
            .expect("refused agents lock")
            .values()
            .cloned()
            .collect();
        Ok(NodeList {
            nodes: nodes
                .iter()
                .map(|n| views::node_view(n, occupancy.get(&n.id).copied().unwrap_or(0), false))
                .collect(),
            refused,
        })
    }

    pub async fn node_get(&self, id: &NodeId) -> Result<Node> {
        let node = self
            .store
            .node_get(id)
            .await?
            .ok_or_else(|| Error::NotFound(format!("node {id} not found")))?;
        let occupancy: HashMap<_, _> = self.store.node_occupancy().await?.into_iter().collect();
        let mut view = views::node_view(&node, occupancy.get(id).copied().unwrap_or(0), true);
        view.drain = self.node_drain_report(id).await?;
        Ok(view)
    }

    /// A node agent (re)registers: record it online, then reconcile what it runs
    /// with what the store says — instances the store has as active but the node
    /// does not run were lost (`stopped`, or `failed` if they were starting);
    /// instances the node runs but the store no longer has are stopped on it.
    pub async fn node_register(&self, registration: NodeRegistration) -> Result<RegistrationAck> {
        self.refuse_another_protocol(&registration)?;
        self.refuse_a_second_agent(&registration).await?;
        let now = self.now();
        // The same agent process registering again, with a control plane of
        // the cluster that had not reconciled it yet (its heartbeat reached
        // another replica), rather than a node that restarted.
        let same_process = self
            .store
            .node_get(&registration.node_id)
            .await?
            .is_some_and(|node| {
                node.generation == registration.generation && node.status != NodeStatus::Offline
            });
        self.store.node_upsert(&registration, now).await?;
        self.attach_remote(&registration);
        self.reconcile_node(&registration, same_process, now)
            .await?;
        self.store
            .instance_record_usage(&registration.node_id, &registration.instances)
            .await?;
        tracing::info!(node = %registration.node_id, address = registration.address, "node registered");
        self.public_hosts.remember(
            &registration.node_id,
            &registration.public_host,
            &registration.address,
        );
        let mut reconciled = self.reconciled.lock().expect("reconciled lock");
        // Earlier generations of this node are gone for good.
        reconciled.retain(|(node, _)| *node != registration.node_id);
        reconciled.insert((
            registration.node_id.clone(),
            registration.generation.clone(),
        ));
        drop(reconciled);
        self.create_queue.capacity_changed();
        Ok(self.agent_ack())
    }

    /// Reconciles what `registration`'s node runs with what the store
    /// says, and stops on it what the store no longer has. With
    /// `same_process` (the agent registered before, with another control
    /// plane of the cluster), a record changed in the last
    /// [`RECHECK_AFTER`] is not judged by this report, which may predate
    /// it (a create or revive another control plane just recorded may be on
    /// its way to the node): it is judged by a heartbeat [`RECHECK_AFTER`]
    /// later, if it has not changed meanwhile
    /// ([`Self::recheck_unreported`]).
    async fn reconcile_node(
        &self,
        registration: &NodeRegistration,
        same_process: bool,
        now: DateTime<Utc>,
    ) -> Result<()> {
        let node = &registration.node_id;
        let reported: HashMap<_, _> = registration
            .instances
            .iter()
            .map(|r| (r.id.clone(), r))
            .collect();
        let known = self
            .store
            .instances_on_node(node, &InstanceStatus::ALL)
            .await?;
        let known_ids: HashSet<_> = known.iter().map(|r| r.id.clone()).collect();
        let mut unsure = Vec::new();
        for record in &known {
            let report = reported.get(&record.id).copied();
            if same_process && now - record.updated_at < RECHECK_AFTER {
                unsure.push((record.id.clone(), record.updated_at));
                continue;
            }
            if let Some(action) = reconcile_action(record, report) {
                self.reconcile_instance(node, record, action, now).await?;
            }
        }
        if !unsure.is_empty() {
            let mut unreported = self.unreported.lock().expect("unreported lock");
            unreported.insert(node.clone(), (now, unsure));
        }
        let strays: Vec<_> = registration
            .instances
            .iter()
            .filter(|r| !known_ids.contains(&r.id))
            .map(|r| r.id.clone())
            .collect();
        self.stop_strays(node, strays).await
    }

    /// Brings one instance record in line with what its node reported: the
    /// move the lifecycle table gives for the event (compare-and-set on the
    /// status, node and operation the record had when it was read: a move
    /// or another revive since then is not undone).
    async fn reconcile_instance(
        &self,
        node: &NodeId,
        record: &InstanceRecord,
        action: Reconcile,
        now: DateTime<Utc>,
    ) -> Result<()> {
        let (id, statuses) = (&record.id, [record.status]);
        let Some(to) = lifecycle::transition(record.status, action.event) else {
            return Ok(());
        };
        let from = Expected::as_read(&statuses, record);
        let reason = action.reason.as_deref();
        let moved = match (action.event, &action.snapshot) {
            (Event::Parked, Some(snapshot)) => {
                self.store
                    .instance_set_dormant(id, from, snapshot, now)
                    .await?
            }
            // It runs from the snapshot it held: spent.
            (Event::Adopted | Event::Revived | Event::RevivedLate, _) => {
                self.store
                    .instance_set_revived(id, from, reason, now)
                    .await?
            }
            _ => {
                self.store
                    .instance_transition(id, from, to, reason, now)
                    .await?
            }
        };
        if moved.is_some() {
            tracing::warn!(instance = %id, %node, event = ?action.event, status = %to, "reconciled with its node");
        }
        Ok(())
    }

    /// Stops, on their node, instances the store no longer has.
    async fn stop_strays(&self, node: &NodeId, strays: Vec<InstanceId>) -> Result<()> {
        if strays.is_empty() {
            return Ok(());
        }
        if let Some(connection) = self.connection(node).await? {
            self.tasks.spawn("node strays", async move {
                for id in strays {
                    tracing::warn!(instance = %id, "stopping an instance the store no longer has");
                    let _ = connection.instance_delete(&id, true).await;
                }
            });
        }
        Ok(())
    }

    /// Refuses an agent whose protocol is a major version apart (409, the
    /// reason naming both versions), and remembers it for `/v2/nodes`.
    fn refuse_another_protocol(&self, registration: &NodeRegistration) -> Result<()> {
        use flotilla_api_types::agent::{
            PROTOCOL_VERSION, protocol_version_or_before, protocols_meet,
        };
        let mut refused = self.refused_agents.lock().expect("refused agents lock");
        let Err(why) = protocols_meet(PROTOCOL_VERSION, &registration.protocol_version) else {
            refused.remove(&registration.node_id);
            return Ok(());
        };
        let reason = format!(
            "agent {} at {}: {why}",
            registration.node_id, registration.address
        );
        tracing::error!(node = %registration.node_id, %reason, "refused an agent's registration");
        // Bounded: the oldest names go first.
        while refused.len() >= MAX_REFUSED_AGENTS {
            let oldest = refused
                .values()
                .min_by_key(|agent| agent.at)
                .map(|agent| agent.node_id.clone());
            match oldest {
                Some(node) => refused.remove(&node),
                None => break,
            };
        }
        refused.insert(
            registration.node_id.clone(),
            flotilla_api_types::nodes::RefusedAgent {
                node_id: registration.node_id.clone(),
                address: registration.address.clone(),
                protocol_version: protocol_version_or_before(&registration.protocol_version)
                    .to_owned(),
                reason: reason.clone(),
                at: self.now(),
            },
        );
        Err(Error::InvalidState(format!(
            "registration refused: {reason}"
        )))
    }

    /// Refuses a registration when another live agent process holds its node
    /// id: the node is online under another generation, and the agent at its
    /// address still answers with that generation. A restart (the old
    /// process silent, or the new one answering at the same address) passes.
    async fn refuse_a_second_agent(&self, registration: &NodeRegistration) -> Result<()> {
        let Some(existing) = self.store.node_get(&registration.node_id).await? else {
            return Ok(());
        };
        if existing.status != NodeStatus::Online || existing.generation == registration.generation {
            return Ok(());
        }
        let Some(connection) = self.connection(&existing.id).await? else {
            return Ok(());
        };
        match connection.identity().await {
            Ok(identity)
                if identity.node_id == existing.id
                    && identity.generation == existing.generation =>
            {
                tracing::error!(
                    node = %existing.id,
                    holder = existing.address,
                    newcomer = registration.address,
                    "refused a second agent with the same node id"
                );
                Err(Error::InvalidState(format!(
                    "node id {:?} is held by another live agent at {} (this agent is at {}); give each agent its own agent.node_id (FLOTILLA_AGENT__NODE_ID)",
                    existing.id.as_str(),
                    existing.address,
                    registration.address
                )))
            }
            _ => Ok(()),
        }
    }

    /// What each node holds, for placement: occupied slots, and the instances
    /// created on it within the failure window with how many failed.
    pub(crate) async fn node_usage(&self) -> Result<HashMap<NodeId, NodeUsage>> {
        let mut usage: HashMap<NodeId, NodeUsage> = HashMap::new();
        for (node, occupied) in self.store.node_occupancy().await? {
            usage.entry(node).or_default().occupied = occupied;
        }
        for &(ref node, recent, failed) in self.recent_failures().await?.iter() {
            let node = node.clone();
            let entry = usage.entry(node).or_default();
            entry.recent = recent;
            entry.recent_failed = failed;
        }
        Ok(usage)
    }

    /// Recent instances and failures per node, read at most once a second: the
    /// query scans the window's instances, and health needs no fresher view.
    /// One caller reads it again while the others go on with the last
    /// reading (a create does not wait on another's scan).
    async fn recent_failures(&self) -> Result<super::RecentFailures> {
        let last = self
            .recent_failures
            .read()
            .expect("recent failures lock")
            .clone();
        let fresh = |at: std::time::Instant| at.elapsed() < std::time::Duration::from_secs(1);
        let _reading = match (&last, self.recent_failures_reading.try_lock()) {
            (Some((at, stats)), _) if fresh(*at) => return Ok(stats.clone()),
            (Some((_, stats)), Err(_)) => return Ok(stats.clone()),
            (_, Ok(reading)) => reading,
            (None, Err(_)) => self.recent_failures_reading.lock().await,
        };
        if let Some((at, stats)) = self
            .recent_failures
            .read()
            .expect("recent failures lock")
            .as_ref()
            && fresh(*at)
        {
            return Ok(stats.clone());
        }
        let window = chrono::Duration::milliseconds(
            (self.config.nodes.failed_ratio_window_min * 60_000.0) as i64,
        );
        let stats = Arc::new(self.store.recent_failures(self.now() - window).await?);
        *self.recent_failures.write().expect("recent failures lock") =
            Some((std::time::Instant::now(), stats.clone()));
        Ok(stats)
    }

    /// An agent registering over HTTP is reached at its advertised address
    /// (the in-process agent of `serve` keeps its direct connection).
    fn attach_remote(&self, registration: &NodeRegistration) {
        let Some(token) = &self.config.cluster_token else {
            return;
        };
        let current = self.nodes.get(&registration.node_id);
        let keep = current.as_ref().is_some_and(|c| match c.address() {
            None => true,
            Some(address) => address == registration.address.trim_end_matches('/'),
        });
        if !keep {
            self.nodes.attach(
                registration.node_id.clone(),
                Arc::new(HttpNode::new(&registration.address, token)),
            );
        }
    }

    /// Records a heartbeat: the answer for the agent, or `None` to have it
    /// register again (the node is unknown, it was offline, or this control
    /// plane process has not reconciled it yet: it may have restarted while
    /// the node answered calls nobody received).
    pub async fn node_heartbeat(&self, heartbeat: Heartbeat) -> Result<Option<RegistrationAck>> {
        let key = (heartbeat.node_id.clone(), heartbeat.generation.clone());
        if !self
            .reconciled
            .lock()
            .expect("reconciled lock")
            .contains(&key)
        {
            return Ok(None);
        }
        match self
            .store
            .node_heartbeat(
                &heartbeat.node_id,
                &heartbeat.generation,
                &heartbeat.resources,
                &heartbeat.load,
                self.now(),
            )
            .await?
        {
            None | Some(NodeStatus::Offline) => Ok(None),
            Some(NodeStatus::Online | NodeStatus::Draining) => {
                self.store
                    .instance_record_usage(&heartbeat.node_id, &heartbeat.instances)
                    .await?;
                self.recheck_unreported(&heartbeat).await?;
                let heard = Heard {
                    warm_pools: heartbeat.reported_pools(),
                    loops: heartbeat.loops,
                };
                self.heard
                    .lock()
                    .expect("heard lock")
                    .insert(heartbeat.node_id, heard);
                Ok(Some(self.agent_ack()))
            }
        }
    }

    /// The records a registration of the same agent process left to a
    /// later heartbeat, once [`RECHECK_AFTER`] has passed: each that has
    /// not changed since is reconciled with `heartbeat`'s report (one it
    /// does not report is lost: the request that was to start it never
    /// reached the node, its control plane stopped first).
    async fn recheck_unreported(&self, heartbeat: &Heartbeat) -> Result<()> {
        let now = self.now();
        let due = {
            let mut unreported = self.unreported.lock().expect("unreported lock");
            match unreported.get(&heartbeat.node_id) {
                Some((since, _)) if now - *since >= RECHECK_AFTER => {
                    unreported.remove(&heartbeat.node_id).map(|(_, ids)| ids)
                }
                _ => None,
            }
        };
        let reported: HashMap<_, _> = heartbeat.instances.iter().map(|r| (&r.id, r)).collect();
        for (id, seen) in due.iter().flatten() {
            let Some(record) = self.store.instance_get(id).await? else {
                continue;
            };
            if record.node_id != heartbeat.node_id || record.updated_at != *seen {
                continue;
            }
            if let Some(action) = reconcile_action(&record, reported.get(id).copied()) {
                self.reconcile_instance(&heartbeat.node_id, &record, action, now)
                    .await?;
            }
        }
        Ok(())
    }

    /// Marks nodes without a recent heartbeat offline and fails their active
    /// instances. Returns the nodes it took offline.
    pub async fn node_offline_sweep(&self) -> Result<Vec<NodeId>> {
        let now = self.now();
        let timeout = chrono::Duration::milliseconds(
            (self.config.nodes.heartbeat_timeout_sec * 1000.0) as i64,
        );
        let stale = self
            .store
            .node_mark_stale_offline(now - timeout, now)
            .await?;
        for node in &stale {
            let reason = format!(
                "node {node} went offline (no heartbeat for {} s)",
                self.config.nodes.heartbeat_timeout_sec
            );
            let lost = lifecycle::sources(Event::NodeLost);
            for record in self.store.instances_on_node(node, &lost).await? {
                self.store
                    .instance_transition(
                        &record.id,
                        &lost,
                        InstanceStatus::Failed,
                        Some(&reason),
                        now,
                    )
                    .await?;
            }
            tracing::warn!(%node, "node offline");
        }
        Ok(stale)
    }
}

/// When a registration of the same agent process left records of its node
/// to a later heartbeat, and which (each as it was then: its `updated_at`).
pub(crate) type Unreported = (DateTime<Utc>, Vec<(InstanceId, DateTime<Utc>)>);

/// How recent a record's change must be for a registration of the same
/// agent process to leave it to a heartbeat that much later.
const RECHECK_AFTER: chrono::TimeDelta = chrono::TimeDelta::seconds(5);

/// What a registration changes in one instance record: the lifecycle event
/// its node's report stands for, with the reason and snapshot it brings.
#[derive(Debug, PartialEq)]
struct Reconcile {
    event: Event,
    reason: Option<String>,
    snapshot: Option<SnapshotId>,
}

impl Reconcile {
    fn of(event: Event, reason: impl Into<Option<String>>) -> Self {
        Self {
            event,
            reason: reason.into(),
            snapshot: None,
        }
    }
}

/// The event a node's report of an instance stands for, given its record;
/// `None` when they agree, or when the node carries on the operation the
/// record waits for (it reports `reviving`: it got the revive).
fn reconcile_action(record: &InstanceRecord, report: Option<&InstanceReport>) -> Option<Reconcile> {
    use InstanceStatus::*;
    let Some(report) = report else {
        // Active in the store, unknown to the node: it restarted without it.
        return InstanceStatus::ACTIVE.contains(&record.status).then(|| {
            let reason = format!(
                "node {} restarted and no longer runs this browser",
                record.node_id
            );
            Reconcile::of(Event::Lost, reason)
        });
    };
    let event = match (record.status, report.status) {
        (Failed | Stopped, Running | Idle) => Event::Adopted,
        (status, Stopped | Failed) if InstanceStatus::ACTIVE.contains(&status) => {
            return Some(Reconcile::of(
                Event::Ended(report.status),
                report.reason.clone(),
            ));
        }
        // Parked while the control plane was down (the park's answer was lost).
        (Running | Idle, Dormant) => {
            return report.snapshot_id.clone().map(|snapshot| Reconcile {
                snapshot: Some(snapshot),
                ..Reconcile::of(Event::Parked, None)
            });
        }
        // A create or a revive whose answer was lost: it runs.
        (Creating, Running) => Event::Started,
        (Reviving, Running) => Event::Revived,
        // A revive undone too early that its node finished after all.
        (Dormant, Running)
            if report.snapshot_id.is_some() && report.snapshot_id == record.snapshot_id =>
        {
            Event::RevivedLate
        }
        // A revive that never reached the node (the control plane died
        // between recording it and asking): parked again, its snapshot kept.
        // A node that got it reports `reviving` and is waited for.
        (Reviving, Dormant) => {
            let reason =
                "the revive did not reach its node (the control plane restarted); revive it again";
            return Some(Reconcile::of(
                Event::ReviveUndone(Dormant),
                reason.to_owned(),
            ));
        }
        _ => return None,
    };
    Some(Reconcile::of(event, None))
}

#[cfg(test)]
mod tests {
    use super::*;
    use InstanceStatus::*;
    use flotilla_api_types::ids::OperationId;

    const OPERATION: &str = "0193d6a4-0000-7000-8000-00000000000a";

    fn record(status: InstanceStatus, snapshot: Option<&str>) -> InstanceRecord {
        InstanceRecord {
            id: InstanceId::new("0193d6a4-0000-7000-8000-000000000001"),
            node_id: NodeId::new("n1"),
            status,
            status_reason: None,
            subdomain: String::new(),
            image: "ubuntu:22.04".into(),
            config: Default::default(),
            ports: None,
            created_at: Utc::now(),
            updated_at: Utc::now(),
            last_activity: Utc::now(),
            resources: Default::default(),
            clients: Default::default(),
            snapshot_id: snapshot.map(SnapshotId::new),
            dormant_since: None,
            revive_method: None,
            profile: None,
            operation_id: Some(OperationId::new(OPERATION)),
            webdriver_owner: None,
            tenant: None,
        }
    }

    fn report(status: InstanceStatus, snapshot: Option<&str>) -> InstanceReport {
        InstanceReport {
            id: InstanceId::new("0193d6a4-0000-7000-8000-000000000001"),
            status,
            reason: Some("gone".into()),
            resources: Default::default(),
            last_activity: Utc::now(),
            snapshot_id: snapshot.map(SnapshotId::new),
            operation: Some(OperationId::new(OPERATION)),
            clients: Default::default(),
        }
    }

    fn event(
        status: InstanceStatus,
        snapshot: Option<&str>,
        reported: Option<InstanceReport>,
    ) -> Option<Event> {
        reconcile_action(&record(status, snapshot), reported.as_ref()).map(|r| r.event)
    }

    #[test]
    fn a_nodes_clients_drive_an_instance_only_while_it_serves() {
        use flotilla_api_types::agent::NodeClients;
        let clients = NodeClients {
            cdp: 2,
            playwright: 1,
            actions: 1,
        };
        for status in [Running, Idle, Creating, Reviving, Dormant, Stopped, Failed] {
            let mut stored = record(status, None);
            stored.clients = clients;
            stored.webdriver_owner = Some("key:a".into());
            let drivers = crate::app::views::drivers(&stored, 3);
            let serving = matches!(status, Running | Idle);
            let counted = (drivers.cdp, drivers.playwright, drivers.actions);
            assert_eq!(counted == (2, 1, 1), serving, "{status}: {drivers:?}");
            assert_eq!(counted == (0, 0, 0), !serving, "{status}: {drivers:?}");
            // A WebDriver session holds an instance until it ends.
            let held = !matches!(status, Stopped | Failed);
            assert_eq!(drivers.webdriver, u32::from(held), "{status}");
            assert_eq!(drivers.mcp, 3, "{status}");
        }
    }

    #[test]
    fn an_active_record_the_node_does_not_report_is_lost() {
        for status in [Creating, Reviving, Running, Idle] {
            assert_eq!(event(status, None, None), Some(Event::Lost), "{status}");
        }
        // A dormant instance lives in the snapshot store, not on the node.
        for status in [Dormant, Stopped, Failed] {
            assert_eq!(event(status, Some("s1"), None), None, "{status}");
        }
    }

    #[test]
    fn what_the_node_reports_wins_over_a_stale_record() {
        assert_eq!(
            event(Failed, None, Some(report(Running, None))),
            Some(Event::Adopted)
        );
        assert_eq!(
            event(Running, None, Some(report(Stopped, None))),
            Some(Event::Ended(Stopped))
        );
        let parked = reconcile_action(&record(Idle, None), Some(&report(Dormant, Some("s1"))));
        assert_eq!(parked.as_ref().map(|r| r.event), Some(Event::Parked));
        assert_eq!(parked.and_then(|r| r.snapshot), Some(SnapshotId::new("s1")));
        assert_eq!(event(Running, None, Some(report(Dormant, None))), None);
        assert_eq!(
            event(Creating, None, Some(report(Running, None))),
            Some(Event::Started)
        );
        assert_eq!(
            event(Reviving, Some("s1"), Some(report(Running, Some("s1")))),
            Some(Event::Revived)
        );
        assert_eq!(
            event(Reviving, Some("s1"), Some(report(Dormant, Some("s1")))),
            Some(Event::ReviveUndone(Dormant))
        );
        assert_eq!(event(Running, None, Some(report(Running, None))), None);
        assert_eq!(event(Stopped, None, Some(report(Stopped, None))), None);
    }

    /// The crash the lifecycle's operation ids are for: a control plane
    /// restarted while a revive was on its way. A node that got it says
    /// `reviving` and is waited for; one that finishes it after the record
    /// was undone is taken at its word (it revived from the record's own
    /// snapshot).
    #[test]
    fn a_revive_in_flight_at_a_restart_is_waited_for_and_never_undone_behind_the_node() {
        assert_eq!(
            event(Reviving, Some("s1"), Some(report(Reviving, None))),
            None
        );
        assert_eq!(
            event(Dormant, Some("s1"), Some(report(Running, Some("s1")))),
            Some(Event::RevivedLate)
        );
        assert_eq!(
            event(Dormant, Some("s2"), Some(report(Running, Some("s1")))),
            None
        );
        // A node that never got the revive reports the operation before it,
        // and the dormant instance it still holds: the revive is undone.
        let mut behind = report(Dormant, Some("s1"));
        behind.operation = Some(OperationId::new("0193d6a4-0000-7000-8000-00000000000b"));
        assert_eq!(
            event(Reviving, Some("s1"), Some(behind)),
            Some(Event::ReviveUndone(Dormant))
        );
        // Every event reconciliation produces is a move of the table.
        for (status, reported) in [
            (Reviving, report(Running, Some("s1"))),
            (Dormant, report(Running, Some("s1"))),
            (Reviving, report(Dormant, None)),
        ] {
            let found = event(status, Some("s1"), Some(reported)).unwrap();
            assert!(
                lifecycle::transition(status, found).is_some(),
                "{status} {found:?}"
            );
        }
    }
}
