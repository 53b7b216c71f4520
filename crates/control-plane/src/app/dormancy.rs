//! Dormancy: park (`dormant`), revive, the idle lifecycle, and the revive-time
//! estimates behind `estimated_completion`.
//!
//! Which states allow what is the lifecycle table's ([`super::lifecycle`]):
//! a park from `running` or `idle`; a revive from `dormant`, or from `failed`
//! or `stopped` when the instance still has a snapshot (a revive or a park
//! that failed late keeps it), so a user can try again; anything else is
//! 409. A `running` instance without activity for `idle_timeout_minutes`
//! becomes `idle`; activity makes it `running` again; an `idle` instance with
//! `auto_snapshot` is parked through the same path as the endpoint. Every
//! revive is an operation with its own id, which its node reports back.

use flotilla_api_types::faults;
use std::collections::HashMap;
use std::sync::Mutex;

use chrono::Duration;

use flotilla_api_types::agent::{AgentInstancePorts, AgentReviveInstance};
use flotilla_api_types::ids::{OperationId, SnapshotId};
use flotilla_api_types::instances::{Instance, InstanceStatus, ReviveMethod};
use flotilla_api_types::nodes::NodeStatus;
use flotilla_api_types::{InstanceId, NodeId};

use super::ControlPlane;
use super::instances::not_found;
use super::lifecycle::{self, Event};
use crate::error::{Error, Result};
use crate::nodes::NodeCallError;
use crate::scheduler::{self, PlacementRequest};
use crate::store::{Expected, InstanceRecord};

/// Moving averages of measured revive durations, per method. A std mutex:
/// read and updated in a few instructions.
pub struct ReviveEstimates {
    millis: Mutex<HashMap<ReviveMethod, f64>>,
}

/// Weight of the newest measurement.
const ESTIMATE_WEIGHT: f64 = 0.3;

impl Default for ReviveEstimates {
    fn default() -> Self {
        // Until a revive has been measured: the targets of each method.
        Self {
            millis: Mutex::new(HashMap::from([
                (ReviveMethod::QuickStart, 400.0),
                (ReviveMethod::FullRestore, 1500.0),
            ])),
        }
    }
}

impl ReviveEstimates {
    pub fn estimate(&self, method: ReviveMethod) -> Duration {
        let millis = self.millis.lock().expect("estimates lock")[&method];
        Duration::milliseconds(millis.round() as i64)
    }

    pub fn record(&self, method: ReviveMethod, took: Duration) {
        let sample = took.num_milliseconds().max(0) as f64;
        let mut millis = self.millis.lock().expect("estimates lock");
        let current = millis.entry(method).or_insert(sample);
        *current += ESTIMATE_WEIGHT * (sample - *current);
    }
}

impl ControlPlane {
    /// Parks a running or idle instance; answers once its snapshot is stored.
    pub async fn instance_dormant(&self, id: &InstanceId) -> Result<Instance> {
        let span = flotilla_telemetry::operation("instance.park", Some(id.as_str()));
        flotilla_telemetry::traced(span, self.park_now(id)).await
    }

    async fn park_now(&self, id: &InstanceId) -> Result<Instance> {
        let record = self
            .store
            .instance_get(id)
            .await?
            .ok_or_else(|| not_found(id))?;
        flotilla_telemetry::record("node.id", record.node_id.as_str());
        if lifecycle::transition(record.status, Event::Parked).is_none() {
            return Err(Error::InvalidState(format!(
                "instance {id} is {}; only {} instances can be made dormant",
                record.status,
                lifecycle::sources_text(Event::Parked)
            )));
        }
        let connection = self.connection(&record.node_id).await?.ok_or_else(|| {
            Error::InsufficientCapacity(format!("node {} is not reachable", record.node_id))
        })?;
        let started = std::time::Instant::now();
        let parked = connection.instance_dormant(id).await.map_err(Error::from)?;
        faults::point("control-park-answered").await;
        self.telemetry.dormant_duration.0.observe(started.elapsed());
        let record = match self
            .store
            .instance_set_dormant(
                id,
                &lifecycle::sources(Event::Parked),
                &parked.snapshot_id,
                parked.dormant_since,
            )
            .await?
        {
            Some(record) => record,
            // The node's state change recorded this very park first.
            None => self
                .store
                .instance_get(id)
                .await?
                .filter(|record| record.snapshot_id.as_ref() == Some(&parked.snapshot_id))
                .ok_or_else(|| {
                    Error::InvalidState(format!(
                        "instance {id} changed state while it was being parked"
                    ))
                })?,
        };
        tracing::info!(instance = %id, snapshot = %parked.snapshot_id, bytes = parked.snapshot_bytes, "instance dormant");
        let mut view = Instance::bare(record.id.clone(), record.status);
        view.snapshot_id = record.snapshot_id;
        view.dormant_since = record.dormant_since;
        Ok(view)
    }

    /// Starts reviving a dormant instance; answers `reviving` with the expected
    /// completion time, and the instance becomes `running` when its browser is up.
    pub async fn instance_revive(&self, id: &InstanceId, method: ReviveMethod) -> Result<Instance> {
        let span = flotilla_telemetry::operation("instance.revive", Some(id.as_str()));
        flotilla_telemetry::traced(span, self.revive_now(id, method)).await
    }

    /// A failed or stopped instance no longer counts toward its tenant's
    /// `max_instances`; revived, it would again: refused (429) when the
    /// tenant holds its quota. Checked as the revive begins.
    async fn revive_within_quota(&self, record: &crate::store::InstanceRecord) -> Result<()> {
        let Some(tenant) = record.tenant.as_deref() else {
            return Ok(());
        };
        let quota = self.tenant_quota(tenant).max_instances;
        if quota == 0 || InstanceStatus::OCCUPYING.contains(&record.status) {
            return Ok(());
        }
        if self.store.tenant_has_room_now(tenant, quota).await? {
            return Ok(());
        }
        Err(super::tenants::over_quota(
            tenant,
            "instances",
            "max_instances",
            quota,
        ))
    }

    async fn revive_now(&self, id: &InstanceId, method: ReviveMethod) -> Result<Instance> {
        let record = self
            .store
            .instance_get(id)
            .await?
            .ok_or_else(|| not_found(id))?;
        // Failed or stopped instances too, when they kept a snapshot.
        let revivable = lifecycle::transition(record.status, Event::Revive).is_some();
        let Some(snapshot_id) = record.snapshot_id.clone().filter(|_| revivable) else {
            return Err(Error::InvalidState(format!(
                "instance {id} is {}; only {} instances that hold a snapshot can be revived",
                record.status,
                lifecycle::sources_text(Event::Revive)
            )));
        };
        self.revive_within_quota(&record).await?;
        // Its own node when it can take it; otherwise (offline, unreachable,
        // full) another one: the snapshot comes from the shared store.
        let mut record = record;
        let original = self.store.node_get(&record.node_id).await?;
        if original.is_none_or(|node| node.status != NodeStatus::Online || node.draining) {
            record = self.relocate(&record).await?;
        }
        let (started, ports) = match self.revive_on_node(&record, method, &snapshot_id).await {
            Ok(done) => done,
            Err(RevivalRefused::Unavailable(error)) => {
                tracing::warn!(instance = %id, node = %record.node_id, %error, "its node cannot revive it; trying another");
                record = self.relocate(&record).await?;
                self.revive_on_node(&record, method, &snapshot_id)
                    .await
                    .map_err(RevivalRefused::into_error)?
            }
            Err(other) => return Err(other.into_error()),
        };
        flotilla_telemetry::record("node.id", record.node_id.as_str());
        let ports = [ports.debug_port, ports.stream_port, ports.http_port];
        if record.ports != Some(ports) {
            self.store.instance_set_ports(id, ports, self.now()).await?;
        }
        let mut view = Instance::bare(started.id.clone(), InstanceStatus::Reviving);
        view.estimated_completion =
            Some(started.updated_at + self.revive_estimates.estimate(method));
        Ok(view)
    }

    /// Tells node `node`, where instance `id` was parked, that it was revived
    /// elsewhere: the node drops its dormant slot (its ports close, its room
    /// frees). In the background: a node that is gone or does not answer
    /// loses the slot when its agent restarts.
    async fn forget_on(&self, node: &NodeId, id: &InstanceId) {
        let connection = match self.connection(node).await {
            Ok(Some(connection)) => connection,
            Ok(None) => return,
            Err(error) => {
                tracing::warn!(instance = %id, %node, %error, "cannot reach the node it was parked on to release it");
                return;
            }
        };
        let (id, node) = (id.clone(), node.clone());
        self.tasks().spawn("release a moved instance", async move {
            match connection.instance_forget(&id).await {
                Ok(()) => {}
                // A client woke it there meanwhile: that copy is not the
                // instance any more (its record names the other node).
                Err(NodeCallError::Rejected {
                    code: flotilla_api_types::ErrorCode::InvalidState,
                    ..
                }) => {
                    tracing::warn!(instance = %id, %node, "a client woke it on the node it left; stopping that copy");
                    if let Err(error) = connection.instance_delete(&id, true).await {
                        tracing::warn!(instance = %id, %node, %error, "the copy on the node it left could not be stopped");
                    }
                }
                Err(error) => {
                    tracing::warn!(instance = %id, %node, %error, "the node it was parked on kept its dormant slot");
                }
            }
        });
    }

    /// Starts the revive on the record's node; rolls the status back when the
    /// node refuses.
    async fn revive_on_node(
        &self,
        record: &InstanceRecord,
        method: ReviveMethod,
        snapshot_id: &SnapshotId,
    ) -> std::result::Result<(InstanceRecord, AgentInstancePorts), RevivalRefused> {
        let id = &record.id;
        let connection = self
            .connection(&record.node_id)
            .await
            .map_err(RevivalRefused::Other)?
            .ok_or_else(|| {
                RevivalRefused::Unavailable(NodeCallError::Unreachable(format!(
                    "node {} is not reachable",
                    record.node_id
                )))
            })?;
        let operation = OperationId::generate();
        let started = self
            .store
            .instance_begin_revive(id, &[record.status], (method, &operation), None, self.now())
            .await
            .map_err(|e| RevivalRefused::Other(e.into()))?
            .ok_or_else(|| {
                RevivalRefused::Other(Error::InvalidState(format!(
                    "instance {id} changed state; try again"
                )))
            })?;
        let request = AgentReviveInstance {
            id: id.clone(),
            method,
            snapshot_id: snapshot_id.clone(),
            image: record.image.clone(),
            config: record.config.clone(),
            ports: record.ports,
            profile: record.profile.clone(),
            access_token: Some(flotilla_api_types::credentials::Secret::new(
                self.instance_token(id)
                    .await
                    .map_err(RevivalRefused::Other)?,
            )),
            operation: Some(operation.clone()),
        };
        faults::point("control-revive-recorded").await;
        match connection.instance_revive(request).await {
            Ok(ports) => Ok((started, ports)),
            Err(error) => {
                // Nothing started: back to where it was, unless the node
                // reported on this revive meanwhile, or another began.
                let undone = lifecycle::sources(Event::ReviveUndone(record.status));
                let this_revive = Expected::reported(&undone, &record.node_id, Some(&operation));
                self.store
                    .instance_transition(
                        id,
                        this_revive,
                        record.status,
                        record.status_reason.as_deref(),
                        self.now(),
                    )
                    .await
                    .map_err(|e| RevivalRefused::Other(e.into()))?;
                Err(match error {
                    error if error.node_unavailable() => RevivalRefused::Unavailable(error),
                    other => RevivalRefused::Other(other.into()),
                })
            }
        }
    }

    /// Moves a parked instance to another node that can take it (best-of-K
    /// like a create); 503 when none can.
    async fn relocate(&self, record: &InstanceRecord) -> Result<InstanceRecord> {
        let all = self.store.node_list().await?;
        let (nodes, unshared) = nodes_sharing_the_store(all, &record.node_id);
        if nodes.is_empty() && !unshared.is_empty() {
            return Err(Error::InsufficientCapacity(format!(
                "node {} cannot revive instance {} and no other node can: {unshared}",
                record.node_id, record.id
            )));
        }
        let usage = self.node_usage().await?;
        let placement = PlacementRequest {
            image: &record.image,
            config: &record.config,
            preference: None,
        };
        let ranked = scheduler::rank(&nodes, &usage, &placement, self.now(), &self.config)
            .map_err(|error| match error {
                Error::InvalidRequest(detail) | Error::InsufficientCapacity(detail) => {
                    Error::InsufficientCapacity(format!(
                        "node {} cannot revive instance {} and no other node can: {detail}",
                        record.node_id, record.id
                    ))
                }
                other => other,
            })?;
        for node in ranked {
            if self
                .store
                .instance_move_if_room(
                    &record.id,
                    &[record.status],
                    &node.id,
                    node.max_instances,
                    self.now(),
                )
                .await?
            {
                tracing::info!(instance = %record.id, from = %record.node_id, to = %node.id, "instance moves to revive");
                // Its record names the other node from now on, whatever the
                // revive there does: the node it leaves lets it go.
                self.forget_on(&record.node_id, &record.id).await;
                return self
                    .store
                    .instance_get(&record.id)
                    .await?
                    .ok_or_else(|| not_found(&record.id));
            }
        }
        Err(Error::InsufficientCapacity(format!(
            "every node that could revive instance {} filled up meanwhile; retry",
            record.id
        )))
    }

    /// A revive reported done: learn its duration for the next estimates.
    pub(crate) fn revive_finished(
        &self,
        before: &InstanceRecord,
        at: chrono::DateTime<chrono::Utc>,
    ) {
        if before.status == InstanceStatus::Reviving {
            let method = before.revive_method.unwrap_or_default();
            self.revive_estimates.record(method, at - before.updated_at);
        }
    }

    /// Idle lifecycle, run periodically: running instances without activity for
    /// their `idle_timeout_minutes` become idle; idle ones with new activity run
    /// again; idle ones with `auto_snapshot` are parked. Returns the changes made.
    pub async fn instance_idle_sweep(&self) -> Result<usize> {
        let now = self.now();
        let mut changes = 0;
        let watched = [
            lifecycle::sources(Event::IdleTimeout),
            lifecycle::sources(Event::Active),
        ]
        .concat();
        for record in self.store.instances_in(&watched).await? {
            let timeout = record.config.idle_timeout_minutes;
            match record.status {
                InstanceStatus::Running
                    if timeout > 0 && now - record.last_activity >= Duration::minutes(timeout) =>
                {
                    let reason = format!("no activity for {timeout} minute(s)");
                    if self
                        .store
                        .instance_transition(
                            &record.id,
                            &lifecycle::sources(Event::IdleTimeout),
                            InstanceStatus::Idle,
                            Some(&reason),
                            now,
                        )
                        .await?
                        .is_some()
                    {
                        tracing::info!(instance = %record.id, "instance idle");
                        changes += 1;
                        if record.config.auto_snapshot {
                            changes += self.park_idle(&record.id).await;
                        }
                    }
                }
                InstanceStatus::Idle
                    if record.last_activity > record.updated_at
                        && self
                            .store
                            .instance_transition(
                                &record.id,
                                &lifecycle::sources(Event::Active),
                                InstanceStatus::Running,
                                None,
                                now,
                            )
                            .await?
                            .is_some() =>
                {
                    tracing::info!(instance = %record.id, "idle instance active again");
                    changes += 1;
                }
                InstanceStatus::Idle if record.config.auto_snapshot => {
                    // A park that failed earlier is tried again.
                    changes += self.park_idle(&record.id).await;
                }
                _ => {}
            }
        }
        Ok(changes)
    }

    async fn park_idle(&self, id: &InstanceId) -> usize {
        match self.instance_dormant(id).await {
            Ok(_) => 1,
            Err(error) => {
                tracing::warn!(instance = %id, %error, "cannot park an idle instance; will try again");
                0
            }
        }
    }
}

/// Why a node did not start a revive.
enum RevivalRefused {
    /// The node cannot be reached or has no room: another node may.
    Unavailable(NodeCallError),
    Other(Error),
}

impl RevivalRefused {
    fn into_error(self) -> Error {
        match self {
            Self::Unavailable(error) => error.into(),
            Self::Other(error) => error,
        }
    }
}

/// The nodes other than `from` whose agents use `from`'s snapshot store (a
/// parked instance of `from` can revive only there), and, when some use
/// another store, the reason they cannot take it.
pub(crate) fn nodes_sharing_the_store(
    nodes: Vec<crate::store::NodeRecord>,
    from: &NodeId,
) -> (Vec<crate::store::NodeRecord>, String) {
    let store = nodes
        .iter()
        .find(|node| &node.id == from)
        .map(|node| node.snapshot_store.clone())
        .unwrap_or_default();
    let (sharing, unshared): (Vec<_>, Vec<_>) = nodes
        .into_iter()
        .filter(|node| &node.id != from)
        .partition(|node| {
            flotilla_api_types::agent::snapshot_stores_shared(&store, &node.snapshot_store)
        });
    let reason = if unshared.is_empty() {
        String::new()
    } else {
        let names: Vec<&str> = unshared.iter().map(|node| node.id.as_str()).collect();
        let names = names.join(", ");
        // The store's name (a host and path, a bucket) is the operator's,
        // not the API client's: logged, not answered.
        tracing::info!(node = %from, %store, others = %names, "nodes that use another snapshot store cannot take its instances");
        format!(
            "its node's snapshot store is not the one node {names} uses (a move needs one store for both nodes: S3, one directory on one machine, or [snapshots] store_id)"
        )
    };
    (sharing, reason)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn estimates_follow_measurements() {
        let estimates = ReviveEstimates::default();
        assert_eq!(
            estimates.estimate(ReviveMethod::QuickStart),
            Duration::milliseconds(400)
        );
        for _ in 0..30 {
            estimates.record(ReviveMethod::QuickStart, Duration::milliseconds(250));
        }
        let learned = estimates
            .estimate(ReviveMethod::QuickStart)
            .num_milliseconds();
        assert!((249..=252).contains(&learned), "{learned}");
        assert_eq!(
            estimates.estimate(ReviveMethod::FullRestore),
            Duration::milliseconds(1500)
        );
    }
}
