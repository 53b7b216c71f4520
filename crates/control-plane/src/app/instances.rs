//! Instances: create (place, reserve, ask the node), list, get, delete, and the
//! state changes nodes report.

use flotilla_api_types::agent::{
    AgentCreateInstance, AgentInstancePorts, InstanceEventKind, InstanceEventReport,
    InstanceStateChange,
};
use flotilla_api_types::credentials::Secret;
use flotilla_api_types::events::EventName;
use flotilla_api_types::faults;
use flotilla_api_types::ids::OperationId;
use flotilla_api_types::instances::{
    CreateInstanceRequest, DEFAULT_IMAGE, Instance, InstanceConfig, InstanceDrivers, InstanceList,
    InstanceStatus, ListInstancesQuery, ReviveMethod,
};
use flotilla_api_types::profiles::ProfileUse;
use flotilla_api_types::{InstanceId, MessageResponse};

use super::lifecycle::{self, Event};
use super::views;
use super::{ControlPlane, Scope};
use crate::error::{Error, Result};
use crate::nodes::NodeCallError;
use crate::scheduler::{self, PlacementRequest};
use crate::store::{Expected, InstanceFilter, InstanceRecord, NewInstance, NodeRecord, Placed};

/// Largest accepted values, to catch typos (GB, not MB) with a clear message.
const MAX_MEMORY_GB: f64 = 1024.0;
const MAX_CPU_CORES: i64 = 256;
const MAX_DISK_GB: f64 = 10_240.0;
const MAX_IDLE_TIMEOUT_MINUTES: i64 = 525_600;
const MAX_DURATION_MINUTES: f64 = 525_600.0;

pub(crate) fn validate_config(config: &InstanceConfig, image: &str) -> Result<()> {
    let bad = |field: &str, rule: &str, value: &dyn std::fmt::Display| {
        Err(Error::InvalidRequest(format!(
            "config.{field} must be {rule} (got {value})"
        )))
    };
    if !(config.memory_gb > 0.0 && config.memory_gb <= MAX_MEMORY_GB) {
        return bad(
            "memory_gb",
            &format!("greater than 0 and at most {MAX_MEMORY_GB}"),
            &config.memory_gb,
        );
    }
    if !(1..=MAX_CPU_CORES).contains(&config.cpu_cores) {
        return bad(
            "cpu_cores",
            &format!("an integer from 1 to {MAX_CPU_CORES}"),
            &config.cpu_cores,
        );
    }
    if !(config.disk_gb > 0.0 && config.disk_gb <= MAX_DISK_GB) {
        return bad(
            "disk_gb",
            &format!("greater than 0 and at most {MAX_DISK_GB}"),
            &config.disk_gb,
        );
    }
    if let Some(proxy) = &config.proxy {
        proxy.validate()?;
    }
    match &config.prefs {
        // Firefox's preferences are flat, with rules of their own (a node
        // checks them again for any image that runs Firefox).
        Some(prefs) if image == super::webdriver_firefox::FIREFOX_IMAGE => {
            flotilla_api_types::firefox_prefs::flatten(prefs)?;
        }
        Some(prefs) => {
            flotilla_api_types::prefs::expand(prefs)?;
        }
        None => {}
    }
    if let Some(minutes) = config.max_duration_minutes
        && !(minutes > 0.0 && minutes <= MAX_DURATION_MINUTES)
    {
        return bad(
            "max_duration_minutes",
            &format!(
                "a number of minutes greater than 0 and at most {MAX_DURATION_MINUTES} (fractions allowed)"
            ),
            &minutes,
        );
    }
    if !(0..=MAX_IDLE_TIMEOUT_MINUTES).contains(&config.idle_timeout_minutes) {
        return bad(
            "idle_timeout_minutes",
            &format!("an integer from 0 (never idle) to {MAX_IDLE_TIMEOUT_MINUTES}"),
            &config.idle_timeout_minutes,
        );
    }
    Ok(())
}

fn validate_image(image: &str) -> Result<()> {
    if image.is_empty()
        || image.chars().count() > 200
        || image.chars().any(|c| c.is_control() || c.is_whitespace())
    {
        return Err(Error::InvalidRequest(format!(
            "image must be a non-empty image name without spaces, at most 200 characters (got {image:?})"
        )));
    }
    Ok(())
}

pub(crate) fn not_found(id: &InstanceId) -> Error {
    Error::NotFound(format!("instance {id} not found"))
}

impl ControlPlane {
    /// Places a new instance, has its node reserve ports and start the browser,
    /// and returns it (normally `creating`).
    pub async fn instance_create(
        &self,
        request: CreateInstanceRequest,
        scope: &Scope,
    ) -> Result<Instance> {
        let span = flotilla_telemetry::operation("instance.create", None);
        flotilla_telemetry::traced(span, self.create_now(request, scope)).await
    }

    async fn create_now(&self, request: CreateInstanceRequest, scope: &Scope) -> Result<Instance> {
        let (image, config, profile) = self.create_checked(&request, scope).await?;
        let nodes = self.store.node_list().await?;
        let usage = self.node_usage().await?;
        let placement = PlacementRequest {
            image: &image,
            config: &config,
            preference: request.node_preference.as_ref(),
        };
        let ranked = scheduler::rank(&nodes, &usage, &placement, self.now(), &self.config)?;

        let id = InstanceId::generate();
        flotilla_telemetry::record("instance.id", id.as_str());
        let operation = OperationId::generate();
        if let Some(profile) = &profile {
            self.profile_take(profile, (&id, scope)).await?;
        }
        let placed = self
            .instance_place(
                (&id, &operation),
                &ranked,
                (&image, &config, profile.as_ref()),
                scope,
            )
            .await;
        let node = match placed {
            Ok(node) => node,
            Err(error) => {
                self.store.profile_release(&id).await?;
                return Err(error);
            }
        };
        flotilla_telemetry::record("node.id", node.id.as_str());
        let profile_engine = match &profile {
            Some(profile) => self
                .store
                .profile_get(&profile.name)
                .await?
                .and_then(|record| record.profile.engine),
            None => None,
        };
        let launch = AgentCreateInstance {
            id: id.clone(),
            image: image.clone(),
            config,
            access_token: Some(Secret::new(self.instance_token(&id).await?)),
            profile,
            profile_engine,
            operation: Some(operation),
        };
        let ports = self.launch_on(node, launch).await?;
        self.record_launch(&id, node, &ports).await?;
        let record = self
            .store
            .instance_get(&id)
            .await?
            .ok_or_else(|| not_found(&id))?;
        tracing::info!(instance = %id, node = %node.id, image, "instance created");
        self.public_hosts
            .remember(&node.id, &node.public_host, &node.address);
        let urls = self.instance_urls(&record).await?;
        Ok(views::instance_created(&record, urls))
    }

    /// A create's image, configuration and profile (under its stored name),
    /// once every part of the request checked out (its profile and
    /// extensions exist and are `scope`'s to use).
    async fn create_checked(
        &self,
        request: &CreateInstanceRequest,
        scope: &Scope,
    ) -> Result<(String, InstanceConfig, Option<ProfileUse>)> {
        let image = request
            .image
            .clone()
            .unwrap_or_else(|| DEFAULT_IMAGE.to_owned());
        validate_image(&image)?;
        let config = request.config.clone().unwrap_or_default();
        validate_config(&config, &image)?;
        if let Some(node) = &request.node_preference
            && node.as_str().is_empty()
        {
            return Err(Error::InvalidRequest(
                "node_preference must be a node id, not empty".into(),
            ));
        }
        let profile = match &request.profile {
            Some(profile) => Some(self.profile_check(profile, scope).await?),
            None => None,
        };
        self.extensions_check(&config.extensions, scope).await?;
        Ok((image, config, profile))
    }

    /// Asks the chosen node to launch a recorded instance; if it does not,
    /// the record goes (an unreachable node counts as no capacity).
    async fn launch_on(
        &self,
        node: &NodeRecord,
        launch: AgentCreateInstance,
    ) -> Result<AgentInstancePorts> {
        let id = launch.id.clone();
        faults::point("control-create-recorded").await;
        let call = match self.connection(&node.id).await? {
            Some(connection) => connection.instance_create(launch).await,
            None => Err(NodeCallError::Unreachable(format!(
                "no connection to node {}",
                node.id
            ))),
        };
        match call {
            Ok(ports) => Ok(ports),
            Err(error) => {
                self.store.instance_delete(&id, self.now()).await?;
                Err(match error {
                    NodeCallError::Unreachable(detail) => Error::InsufficientCapacity(format!(
                        "node {} did not take the instance: {detail}",
                        node.id
                    )),
                    refused => refused.into(),
                })
            }
        }
    }

    /// Records the ports a node gave an instance (and `running` if a warm
    /// browser made it so at once); an instance deleted meanwhile is let go
    /// on its node too.
    async fn record_launch(
        &self,
        id: &InstanceId,
        node: &NodeRecord,
        ports: &AgentInstancePorts,
    ) -> Result<()> {
        let now = self.now();
        let recorded = self
            .store
            .instance_set_ports(
                id,
                [ports.debug_port, ports.stream_port, ports.http_port],
                now,
            )
            .await?;
        if !recorded {
            if let Some(connection) = self.connection(&node.id).await? {
                let _ = connection.instance_delete(id, true).await;
            }
            return Err(not_found(id));
        }
        if ports.status == InstanceStatus::Running {
            self.store
                .instance_transition(
                    id,
                    &lifecycle::sources(Event::Started),
                    InstanceStatus::Running,
                    None,
                    now,
                )
                .await?;
        }
        Ok(())
    }

    /// Records the instance on the first ranked node that still has room.
    async fn instance_place<'n>(
        &self,
        (id, operation): (&InstanceId, &OperationId),
        ranked: &'n [NodeRecord],
        (image, config, profile): (&str, &InstanceConfig, Option<&ProfileUse>),
        scope: &Scope,
    ) -> Result<&'n NodeRecord> {
        let tenant = scope
            .tenant()
            .map(|name| (name.to_owned(), self.tenant_quota(name).max_instances));
        for node in ranked {
            let new = NewInstance {
                id: id.clone(),
                node_id: node.id.clone(),
                image: image.to_owned(),
                config: config.clone(),
                created_at: self.now(),
                profile: profile.cloned(),
                operation: operation.clone(),
                tenant: tenant.clone(),
            };
            match self
                .store
                .instance_insert_if_room(&new, node.max_instances)
                .await?
            {
                Placed::Inserted => return Ok(node),
                Placed::NodeFull => {}
                Placed::TenantFull => {
                    let (name, quota) = tenant.as_ref().expect("a tenant's placement");
                    return Err(super::tenants::over_quota(
                        name,
                        "instances",
                        "max_instances",
                        *quota,
                    ));
                }
            }
        }
        Err(Error::InsufficientCapacity(
            "every node that fits this instance filled up meanwhile; retry, delete instances or add a node".into(),
        ))
    }

    /// What drives `record`'s instance (its view's `drivers`).
    async fn drivers_of(&self, record: &InstanceRecord) -> Result<InstanceDrivers> {
        let mcp = self.mcp_sessions_holding(&record.id).await?;
        Ok(views::drivers(record, mcp))
    }

    pub async fn instance_list(
        &self,
        query: ListInstancesQuery,
        scope: &Scope,
    ) -> Result<InstanceList> {
        let limit = query.limit.unwrap_or(100);
        if !(1..=1000).contains(&limit) {
            return Err(Error::InvalidRequest(format!(
                "limit must be an integer from 1 to 1000 (got {limit})"
            )));
        }
        let offset = query.offset.unwrap_or(0);
        if offset < 0 {
            return Err(Error::InvalidRequest(format!(
                "offset must be 0 or more (got {offset})"
            )));
        }
        let filter = InstanceFilter {
            status: query.status,
            node_id: query.node_id,
            tenant: scope.tenant().map(str::to_owned),
        };
        let (records, total) = self
            .store
            .instance_list(&filter, query.sort.unwrap_or_default(), limit, offset)
            .await?;
        let mcp = self.mcp_sessions_holding_each().await?;
        let drivers = |record: &InstanceRecord| {
            let sessions = mcp.get(&record.id).copied().unwrap_or(0);
            views::instance_summary(record, views::drivers(record, sessions))
        };
        Ok(InstanceList {
            instances: records.iter().map(drivers).collect(),
            total,
            limit,
            offset,
        })
    }

    /// Instance `id` as `viewer` (the request's principal, of `scope`) sees
    /// it: a WebDriver session's instance shows its `urls` without their
    /// token to any key but the session's (the token would drive the
    /// session); an admin sees a tenant's profile by its stored name
    /// (`<tenant>~<name>`, as `/v2/profiles` lists it), the tenant by its own.
    pub async fn instance_get(
        &self,
        id: &InstanceId,
        (viewer, scope): (&str, &Scope),
    ) -> Result<Instance> {
        let record = self
            .store
            .instance_get(id)
            .await?
            .ok_or_else(|| not_found(id))?;
        let someone_elses_session = self.config.auth_enabled
            && record
                .webdriver_owner
                .as_deref()
                .is_some_and(|owner| owner != viewer);
        let urls = if someone_elses_session {
            self.instance_urls_without_token(&record).await?
        } else {
            self.instance_urls(&record).await?
        };
        let drivers = self.drivers_of(&record).await?;
        let mut view = views::instance_detail(&record, (urls, drivers), self.now());
        if *scope == Scope::Admin {
            view.profile = record.profile.clone();
        }
        Ok(view)
    }

    /// Stops the instance on its node (gracefully unless `force`) and removes it.
    pub async fn instance_delete(&self, id: &InstanceId, force: bool) -> Result<MessageResponse> {
        self.instance_remove(id, force, false).await
    }

    /// Deletes instances whose `config.max_duration_minutes` has passed
    /// (`instance.expired`, then `instance.deleted`), whatever their state.
    pub async fn instance_lifetime_sweep(&self) -> Result<usize> {
        let now = self.now();
        let mut expired = 0;
        for record in self.store.instances_in(&InstanceStatus::ALL).await? {
            let Some(expires_at) = views::expires_at(&record) else {
                continue;
            };
            if now < expires_at {
                continue;
            }
            match self.instance_remove(&record.id, false, true).await {
                Ok(_) => {
                    tracing::info!(instance = %record.id, "instance reached its max_duration_minutes: deleted");
                    expired += 1;
                }
                Err(Error::NotFound(_)) => {}
                Err(error) => return Err(error),
            }
        }
        Ok(expired)
    }

    async fn instance_remove(
        &self,
        id: &InstanceId,
        force: bool,
        expired: bool,
    ) -> Result<MessageResponse> {
        let span = flotilla_telemetry::operation("instance.delete", Some(id.as_str()));
        flotilla_telemetry::traced(span, self.remove_now(id, force, expired)).await
    }

    async fn remove_now(
        &self,
        id: &InstanceId,
        force: bool,
        expired: bool,
    ) -> Result<MessageResponse> {
        let record = self
            .store
            .instance_get(id)
            .await?
            .ok_or_else(|| not_found(id))?;
        flotilla_telemetry::record("node.id", record.node_id.as_str());
        if record.status.occupies_slot() {
            match self.connection(&record.node_id).await? {
                Some(connection) => {
                    if let Err(error) = connection.instance_delete(id, force).await {
                        // The record goes anyway; the node's next registration
                        // reconciles (it stops instances the store no longer has).
                        tracing::warn!(instance = %id, node = %record.node_id, %error, "node did not confirm the delete");
                    }
                }
                None => {
                    tracing::warn!(instance = %id, node = %record.node_id, "no connection to the node; removing the record only")
                }
            }
        }
        faults::point("control-delete-answered").await;
        let removed = if expired {
            self.store.instance_expire(id, self.now()).await?
        } else {
            self.store.instance_delete(id, self.now()).await?
        };
        if !removed {
            return Err(not_found(id));
        }
        self.create_queue.capacity_changed();
        if let Some(snapshots) = &self.snapshots {
            match snapshots.snapshots_delete_all(id).await {
                Ok(0) => {}
                Ok(count) => tracing::info!(instance = %id, count, "snapshots deleted"),
                Err(error) => {
                    tracing::warn!(instance = %id, %error, "cannot delete the instance's snapshots")
                }
            }
        }
        tracing::info!(instance = %id, force, "instance deleted");
        Ok(MessageResponse {
            message: format!(
                "instance {id} deleted{}",
                if force { " (forced)" } else { "" }
            ),
        })
    }

    /// A node reports something an instance did (a download finished): the
    /// event goes to webhooks and the event proxy. Unknown instances are
    /// ignored (deleted meanwhile).
    pub async fn instance_event_reported(&self, report: InstanceEventReport) -> Result<()> {
        // Only the node the instance is on speaks for it (see
        // `instance_state_changed`); a profile save is the node's own.
        let on_its_node = match self.store.instance_get(&report.id).await? {
            Some(record) => record.node_id == report.node_id,
            None => true,
        };
        if !on_its_node && !matches!(report.event, InstanceEventKind::ProfileSaved { .. }) {
            tracing::info!(instance = %report.id, node = %report.node_id, "an event from a node the instance is not on is not taken");
            return Ok(());
        }
        match report.event {
            InstanceEventKind::ProfileSaved {
                name,
                size_bytes,
                engine,
            } => {
                self.store
                    .profile_saved(&name, (size_bytes, engine.as_deref()), report.at)
                    .await?;
            }
            InstanceEventKind::PlaywrightServerExited { version, reason } => {
                let mut data = serde_json::Map::new();
                data.insert("version".into(), version.into());
                data.insert("reason".into(), reason.into());
                self.store
                    .instance_note(
                        &report.id,
                        EventName::InstancePlaywrightServerExited,
                        data,
                        report.at,
                    )
                    .await?;
            }
            InstanceEventKind::EgressRefused {
                destination,
                reason,
            } => {
                let mut data = serde_json::Map::new();
                data.insert("destination".into(), destination.into());
                data.insert("reason".into(), reason.into());
                // What opens it: the node's egress policy, not the client.
                data.insert("setting".into(), "[agent.egress] allow".into());
                self.store
                    .instance_note(
                        &report.id,
                        EventName::InstanceEgressRefused,
                        data,
                        report.at,
                    )
                    .await?;
            }
            InstanceEventKind::DownloadCompleted { name, size_bytes } => {
                let mut data = serde_json::Map::new();
                data.insert("name".into(), name.into());
                data.insert("size_bytes".into(), size_bytes.into());
                self.store
                    .instance_note(
                        &report.id,
                        EventName::InstanceDownloadCompleted,
                        data,
                        report.at,
                    )
                    .await?;
            }
        }
        Ok(())
    }

    /// A node reports an instance running: a create or a revive finished
    /// (or one the control plane had undone or given up for lost), an idle
    /// instance is in use, or a running one carries a note (e.g. the memory
    /// limit was hit). The event is the table's ([`lifecycle`]).
    async fn running_reported(
        &self,
        before: &InstanceRecord,
        change: &InstanceStateChange,
    ) -> Result<Option<InstanceRecord>> {
        let reason = change.reason.as_deref();
        let revived_from_its_snapshot =
            change.snapshot_id.is_some() && change.snapshot_id == before.snapshot_id;
        let event = match before.status {
            InstanceStatus::Reviving => Event::Revived,
            InstanceStatus::Creating => Event::Started,
            InstanceStatus::Idle => Event::Active,
            InstanceStatus::Failed | InstanceStatus::Stopped => Event::Adopted,
            InstanceStatus::Dormant if revived_from_its_snapshot => Event::RevivedLate,
            InstanceStatus::Running => {
                // No move: the note replaces the reason.
                return Ok(self
                    .store
                    .instance_transition(
                        &change.id,
                        reported_by(change, false, &[before.status]),
                        before.status,
                        reason,
                        change.at,
                    )
                    .await?);
            }
            InstanceStatus::Dormant => return Ok(None),
        };
        let from = lifecycle::sources(event);
        let updated = match event {
            // Its snapshot is spent once it runs from it.
            Event::Revived | Event::RevivedLate | Event::Adopted => {
                let reason = match event {
                    Event::Adopted => Some("adopted again: its node still runs it"),
                    Event::RevivedLate => Some("revived after all: its node finished the revive"),
                    _ => reason,
                };
                let from = reported_by(change, false, &from);
                self.store
                    .instance_set_revived(&change.id, from, reason, change.at)
                    .await?
            }
            _ => {
                let (from, running) = (reported_by(change, false, &from), InstanceStatus::Running);
                self.store
                    .instance_transition(&change.id, from, running, reason, change.at)
                    .await?
            }
        };
        if updated.is_some() {
            self.observe_finished(before, event, change.at);
        }
        Ok(updated)
    }

    /// Learns how long a create or a revive took, for the metrics and the
    /// revive estimates.
    fn observe_finished(
        &self,
        before: &InstanceRecord,
        event: Event,
        at: chrono::DateTime<chrono::Utc>,
    ) {
        match event {
            Event::Revived => {
                self.revive_finished(before, at);
                let took = (at - before.updated_at).to_std().unwrap_or_default();
                self.telemetry.revive_duration.0.observe(took);
            }
            Event::Started => {
                let took = (at - before.created_at).to_std().unwrap_or_default();
                self.telemetry.create_duration.0.observe(took);
            }
            _ => {}
        }
    }

    /// A state change for an instance the store does not have on the
    /// reporting node (no record: a delete that did not reach the node; or
    /// a record on another node: a copy woken where it was moved from): if
    /// that node still runs it, it is stopped there.
    async fn stop_if_still_running(&self, change: &InstanceStateChange) -> Result<()> {
        if change.status.occupies_slot()
            && let Some(connection) = self.connection(&change.node_id).await?
        {
            let id = change.id.clone();
            self.tasks.spawn("node strays", async move {
                tracing::warn!(instance = %id, "stopping a copy of an instance the store does not have on its node");
                let _ = connection.instance_delete(&id, true).await;
            });
        }
        Ok(())
    }

    /// Parked, as its node reports it: the park's answer records it too
    /// (whichever comes first; this copy is for a control plane that missed
    /// it), or a revive that could not read its snapshot left it parked.
    async fn dormant_reported(
        &self,
        before: &InstanceRecord,
        change: &InstanceStateChange,
    ) -> Result<Option<InstanceRecord>> {
        let reported = |from| reported_by(change, false, from);
        Ok(match &change.snapshot_id {
            Some(snapshot) if lifecycle::transition(before.status, Event::Parked).is_some() => {
                self.store
                    .instance_set_dormant(
                        &change.id,
                        reported(&lifecycle::sources(Event::Parked)),
                        snapshot,
                        change.at,
                    )
                    .await?
            }
            // A revive that could not read its snapshot (the store is
            // unreachable): the instance stays parked, to be revived again.
            _ => {
                let undone = Event::ReviveUndone(InstanceStatus::Dormant);
                self.store
                    .instance_transition(
                        &change.id,
                        reported(&lifecycle::sources(undone)),
                        InstanceStatus::Dormant,
                        change.reason.as_deref(),
                        change.at,
                    )
                    .await?
            }
        })
    }

    /// A node reports that one of its instances changed state; whether the
    /// record took it. A report of an operation the record has moved past
    /// (another create or revive started since) is not taken: the node then
    /// keeps what the record may still need.
    pub async fn instance_state_changed(&self, change: InstanceStateChange) -> Result<bool> {
        let Some(before) = self.store.instance_get(&change.id).await? else {
            self.stop_if_still_running(&change).await?;
            return Ok(false);
        };
        // The node it left (revived elsewhere, or moved by a drain) speaks
        // for it no more: a client that woke it there in the moment of the
        // move must not make the record follow that copy.
        if before.node_id != change.node_id {
            tracing::info!(instance = %change.id, node = %change.node_id, on = %before.node_id, status = %change.status, "a report from a node the instance is not on is not taken");
            // Nor may that copy go on running there unseen.
            self.stop_if_still_running(&change).await?;
            return Ok(false);
        }
        let woken = change.status == InstanceStatus::Reviving;
        if !woken && of_another_operation(&before, &change) {
            tracing::info!(instance = %change.id, status = %change.status, "a report of an earlier operation is not taken");
            return Ok(false);
        }
        let reason = change.reason.as_deref();
        // Checked again as the record is written: it may have moved or
        // begun another operation since `before` was read.
        let reported = |from| reported_by(&change, woken, from);
        let updated = match change.status {
            // A client connected to a dormant instance and its node woke it.
            InstanceStatus::Reviving => {
                let operation = change
                    .operation
                    .clone()
                    .unwrap_or_else(OperationId::generate);
                self.store
                    .instance_begin_revive(
                        &change.id,
                        reported(&lifecycle::sources(Event::Woken)),
                        (ReviveMethod::QuickStart, &operation),
                        reason,
                        change.at,
                    )
                    .await?
            }
            InstanceStatus::Running => self.running_reported(&before, &change).await?,
            // Parked: the park's answer records it too (whichever comes
            // first); this copy is for a control plane that missed it.
            InstanceStatus::Dormant => self.dormant_reported(&before, &change).await?,
            InstanceStatus::Failed | InstanceStatus::Stopped => {
                let ended = Event::Ended(change.status);
                self.store
                    .instance_transition(
                        &change.id,
                        reported(&lifecycle::sources(ended)),
                        change.status,
                        reason,
                        change.at,
                    )
                    .await?
            }
            InstanceStatus::Creating | InstanceStatus::Idle => None,
        };
        let applied = updated.is_some();
        if let Some(record) = updated {
            tracing::info!(instance = %record.id, status = %record.status, reason = ?record.status_reason, "instance state changed");
            if !record.status.occupies_slot() {
                self.create_queue.capacity_changed();
            }
        }
        Ok(applied)
    }
}

/// A move a node's report `change` asks for, from one of `from`: only while
/// the record is on that node, as the operation the report names (any, for
/// a revive a client `woken`, which the node began on its own).
fn reported_by<'a>(
    change: &'a InstanceStateChange,
    woken: bool,
    from: &'a [InstanceStatus],
) -> Expected<'a> {
    let operation = change.operation.as_ref().filter(|_| !woken);
    Expected::reported(from, &change.node_id, operation)
}

/// Whether `change` reports an operation other than the record's latest one
/// (an answer that came too late to matter). Reports without an operation
/// (a browser that exited on its own) always belong.
fn of_another_operation(record: &InstanceRecord, change: &InstanceStateChange) -> bool {
    matches!(
        (&record.operation_id, &change.operation),
        (Some(current), Some(reported)) if current != reported
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_state_change_of_another_operation_is_not_taken() {
        let operation = |id: &str| Some(OperationId::new(id));
        let record = InstanceRecord {
            id: InstanceId::new("0193d6a4-0000-7000-8000-000000000001"),
            node_id: flotilla_api_types::NodeId::new("n1"),
            status: InstanceStatus::Reviving,
            status_reason: None,
            subdomain: String::new(),
            image: DEFAULT_IMAGE.into(),
            config: InstanceConfig::default(),
            ports: None,
            created_at: chrono::Utc::now(),
            updated_at: chrono::Utc::now(),
            last_activity: chrono::Utc::now(),
            resources: Default::default(),
            clients: Default::default(),
            snapshot_id: None,
            dormant_since: None,
            revive_method: None,
            profile: None,
            operation_id: operation("r2"),
            webdriver_owner: None,
            tenant: None,
        };
        let change = |reported: Option<OperationId>| InstanceStateChange {
            node_id: record.node_id.clone(),
            id: record.id.clone(),
            status: InstanceStatus::Running,
            reason: None,
            at: chrono::Utc::now(),
            snapshot_id: None,
            operation: reported,
        };
        assert!(of_another_operation(&record, &change(operation("r1"))));
        assert!(!of_another_operation(&record, &change(operation("r2"))));
        // A browser that exited on its own says no operation: it belongs.
        assert!(!of_another_operation(&record, &change(None)));
    }

    #[test]
    fn config_validation_names_the_field() {
        let cases = [
            (
                InstanceConfig {
                    memory_gb: 0.0,
                    ..Default::default()
                },
                "config.memory_gb",
            ),
            (
                InstanceConfig {
                    memory_gb: -1.0,
                    ..Default::default()
                },
                "config.memory_gb",
            ),
            (
                InstanceConfig {
                    memory_gb: f64::NAN,
                    ..Default::default()
                },
                "config.memory_gb",
            ),
            (
                InstanceConfig {
                    cpu_cores: 0,
                    ..Default::default()
                },
                "config.cpu_cores",
            ),
            (
                InstanceConfig {
                    cpu_cores: -2,
                    ..Default::default()
                },
                "config.cpu_cores",
            ),
            (
                InstanceConfig {
                    disk_gb: 0.0,
                    ..Default::default()
                },
                "config.disk_gb",
            ),
            (
                InstanceConfig {
                    idle_timeout_minutes: -1,
                    ..Default::default()
                },
                "config.idle_timeout_minutes",
            ),
        ];
        for (config, field) in cases {
            let error = validate_config(&config, DEFAULT_IMAGE)
                .unwrap_err()
                .to_string();
            assert!(error.contains(field), "{error}");
        }
        validate_config(&InstanceConfig::default(), DEFAULT_IMAGE).unwrap();
        // Firefox's preferences: a name that is a prefix of another's is
        // theirs to have, and Chromium's refusals are not Firefox's rules.
        let firefox = InstanceConfig {
            prefs: Some(
                serde_json::json!({"privacy.resistFingerprinting": true, "privacy.resistFingerprinting.pbmode": true})
                    .as_object()
                    .unwrap()
                    .clone(),
            ),
            ..InstanceConfig::default()
        };
        validate_config(&firefox, "firefox").unwrap();
        assert!(validate_config(&firefox, DEFAULT_IMAGE).is_err());
        let refused = InstanceConfig {
            prefs: Some(
                serde_json::json!({"helpers.private_mailcap_file": "/x"})
                    .as_object()
                    .unwrap()
                    .clone(),
            ),
            ..InstanceConfig::default()
        };
        let error = validate_config(&refused, "firefox")
            .unwrap_err()
            .to_string();
        assert!(error.contains("helpers.private_mailcap_file"), "{error}");
    }
}
