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
use super::views;
use crate::error::{Error, Result};
use crate::nodes::HttpNode;
use crate::scheduler::NodeUsage;
use crate::store::InstanceRecord;

impl ControlPlane {
    pub async fn node_list(&self) -> Result<NodeList> {
        let occupancy: HashMap<_, _> = self.store.node_occupancy().await?.into_iter().collect();
        let nodes = self.store.node_list().await?;
        Ok(NodeList {
            nodes: nodes
                .iter()
                .map(|n| views::node_view(n, occupancy.get(&n.id).copied().unwrap_or(0), false))
                .collect(),
        })
    }

    pub async fn node_get(&self, id: &NodeId) -> Result<Node> {
        let node = self
            .store
            .node_get(id)
            .await?
            .ok_or_else(|| Error::NotFound(format!("node {id} not found")))?;
        let occupancy: HashMap<_, _> = self.store.node_occupancy().await?.into_iter().collect();
        Ok(views::node_view(
            &node,
            occupancy.get(id).copied().unwrap_or(0),
            true,
        ))
    }

    /// A node agent (re)registers: record it online, then reconcile what it runs
    /// with what the store says — instances the store has as active but the node
    /// does not run were lost (`stopped`, or `failed` if they were starting);
    /// instances the node runs but the store no longer has are stopped on it.
    pub async fn node_register(&self, registration: NodeRegistration) -> Result<RegistrationAck> {
        self.refuse_a_second_agent(&registration).await?;
        let now = self.now();
        self.store.node_upsert(&registration, now).await?;
        self.attach_remote(&registration);
        let reported: HashMap<_, _> = registration
            .instances
            .iter()
            .map(|r| (r.id.clone(), r))
            .collect();
        let known = self
            .store
            .instances_on_node(&registration.node_id, &InstanceStatus::ALL)
            .await?;
        let known_ids: HashSet<_> = known.iter().map(|r| r.id.clone()).collect();
        for record in &known {
            if let Some(action) = reconcile_action(record.status, reported.get(&record.id).copied())
            {
                self.reconcile_instance(&registration.node_id, record, action, now)
                    .await?;
            }
        }
        let strays: Vec<_> = registration
            .instances
            .iter()
            .filter(|r| !known_ids.contains(&r.id))
            .map(|r| r.id.clone())
            .collect();
        self.stop_strays(&registration.node_id, strays).await?;
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

    /// Brings one instance record in line with what its node reported.
    async fn reconcile_instance(
        &self,
        node: &NodeId,
        record: &InstanceRecord,
        action: Reconcile,
        now: DateTime<Utc>,
    ) -> Result<()> {
        let (id, from) = (&record.id, [record.status]);
        match action {
            Reconcile::Lost(to) => {
                let reason = format!("node {node} restarted and no longer runs this browser");
                self.store
                    .instance_transition(id, &from, to, Some(&reason), now)
                    .await?;
                tracing::warn!(instance = %id, %node, status = %to, "instance lost with its node");
            }
            Reconcile::Adopt => {
                // A snapshot it held was what it revived from: spent.
                let reason = "adopted again: its node came back and still runs it";
                self.store
                    .instance_set_revived(id, &from, Some(reason), now)
                    .await?;
                tracing::info!(instance = %id, %node, "instance adopted again");
            }
            Reconcile::Ended(to, reason) => {
                self.store
                    .instance_transition(id, &from, to, reason.as_deref(), now)
                    .await?;
            }
            Reconcile::Parked(snapshot) => {
                self.store.instance_set_dormant(id, &snapshot, now).await?;
                tracing::info!(instance = %id, %node, "instance found parked");
            }
            Reconcile::Started => {
                self.store
                    .instance_transition(id, &from, InstanceStatus::Running, None, now)
                    .await?;
            }
            Reconcile::ReviveUndone => {
                let reason = "the revive did not reach its node (the control plane restarted); revive it again";
                self.store
                    .instance_transition(id, &from, InstanceStatus::Dormant, Some(reason), now)
                    .await?;
                tracing::warn!(instance = %id, %node, "revive undone: the node never got it");
            }
        }
        Ok(())
    }

    /// Stops, on their node, instances the store no longer has.
    async fn stop_strays(&self, node: &NodeId, strays: Vec<InstanceId>) -> Result<()> {
        if strays.is_empty() {
            return Ok(());
        }
        if let Some(connection) = self.connection(node).await? {
            tokio::spawn(async move {
                for id in strays {
                    tracing::warn!(instance = %id, "stopping an instance the store no longer has");
                    let _ = connection.instance_delete(&id, true).await;
                }
            });
        }
        Ok(())
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
    async fn recent_failures(&self) -> Result<super::RecentFailures> {
        let mut cached = self.recent_failures.lock().await;
        if let Some((at, stats)) = cached.as_ref()
            && at.elapsed() < std::time::Duration::from_secs(1)
        {
            return Ok(stats.clone());
        }
        let window = chrono::Duration::milliseconds(
            (self.config.nodes.failed_ratio_window_min * 60_000.0) as i64,
        );
        let stats = Arc::new(self.store.recent_failures(self.now() - window).await?);
        *cached = Some((std::time::Instant::now(), stats.clone()));
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
            Some(NodeStatus::Online) => {
                self.store
                    .instance_record_usage(&heartbeat.node_id, &heartbeat.instances)
                    .await?;
                Ok(Some(self.agent_ack()))
            }
        }
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
            for record in self
                .store
                .instances_on_node(node, &InstanceStatus::ACTIVE)
                .await?
            {
                self.store
                    .instance_transition(
                        &record.id,
                        &InstanceStatus::ACTIVE,
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

/// What a registration changes in one instance record, given what its node
/// reports of it.
#[derive(Debug, PartialEq)]
enum Reconcile {
    /// Active in the store, unknown to the node: lost (`failed` if it was
    /// starting, else `stopped`).
    Lost(InstanceStatus),
    /// Given up for lost while the node was unreachable, yet it still runs.
    Adopt,
    /// Ended on the node while the control plane was not listening (deleted,
    /// or exited without a state change that arrived).
    Ended(InstanceStatus, Option<String>),
    /// Parked while the control plane was down (the park's answer was lost).
    Parked(SnapshotId),
    /// A create whose answer was lost: it runs.
    Started,
    /// A revive that never reached the node (the control plane died between
    /// recording it and asking the node): dormant again, its snapshot kept.
    ReviveUndone,
}

fn reconcile_action(status: InstanceStatus, report: Option<&InstanceReport>) -> Option<Reconcile> {
    use InstanceStatus::*;
    let Some(report) = report else {
        if !InstanceStatus::ACTIVE.contains(&status) {
            return None;
        }
        let starting = matches!(status, Creating | Reviving);
        return Some(Reconcile::Lost(if starting { Failed } else { Stopped }));
    };
    match (status, report.status) {
        (Failed | Stopped, Running | Idle) => Some(Reconcile::Adopt),
        (status, Stopped | Failed) if InstanceStatus::ACTIVE.contains(&status) => {
            Some(Reconcile::Ended(report.status, report.reason.clone()))
        }
        (Running | Idle, Dormant) => report.snapshot_id.clone().map(Reconcile::Parked),
        (Creating, Running) => Some(Reconcile::Started),
        (Reviving, Dormant) => Some(Reconcile::ReviveUndone),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use InstanceStatus::*;

    fn report(status: InstanceStatus, snapshot: Option<&str>) -> InstanceReport {
        InstanceReport {
            id: InstanceId::new("0193d6a4-0000-7000-8000-000000000001"),
            status,
            reason: Some("gone".into()),
            resources: Default::default(),
            last_activity: Utc::now(),
            snapshot_id: snapshot.map(SnapshotId::new),
        }
    }

    #[test]
    fn an_active_record_the_node_does_not_report_is_lost() {
        assert_eq!(
            reconcile_action(Creating, None),
            Some(Reconcile::Lost(Failed))
        );
        assert_eq!(
            reconcile_action(Reviving, None),
            Some(Reconcile::Lost(Failed))
        );
        assert_eq!(
            reconcile_action(Running, None),
            Some(Reconcile::Lost(Stopped))
        );
        assert_eq!(reconcile_action(Idle, None), Some(Reconcile::Lost(Stopped)));
        // A dormant instance lives in the snapshot store, not on the node.
        assert_eq!(reconcile_action(Dormant, None), None);
        assert_eq!(reconcile_action(Stopped, None), None);
        assert_eq!(reconcile_action(Failed, None), None);
    }

    #[test]
    fn what_the_node_reports_wins_over_a_stale_record() {
        assert_eq!(
            reconcile_action(Failed, Some(&report(Running, None))),
            Some(Reconcile::Adopt)
        );
        assert_eq!(
            reconcile_action(Running, Some(&report(Stopped, None))),
            Some(Reconcile::Ended(Stopped, Some("gone".into())))
        );
        assert_eq!(
            reconcile_action(Idle, Some(&report(Dormant, Some("s1")))),
            Some(Reconcile::Parked(SnapshotId::new("s1")))
        );
        assert_eq!(
            reconcile_action(Running, Some(&report(Dormant, None))),
            None
        );
        assert_eq!(
            reconcile_action(Creating, Some(&report(Running, None))),
            Some(Reconcile::Started)
        );
        assert_eq!(
            reconcile_action(Reviving, Some(&report(Dormant, Some("s1")))),
            Some(Reconcile::ReviveUndone)
        );
        assert_eq!(
            reconcile_action(Running, Some(&report(Running, None))),
            None
        );
        assert_eq!(
            reconcile_action(Stopped, Some(&report(Stopped, None))),
            None
        );
    }
}
