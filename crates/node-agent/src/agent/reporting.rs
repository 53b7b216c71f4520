//! What the [`Agent`] tells the control plane: registration (and what the
//! answer sets), heartbeats with each instance's readings, limits enforced
//! on those readings, and state changes and events delivered one at a time,
//! in order.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot};

use flotilla_api_types::agent::{
    Heartbeat, InstanceEventKind, InstanceEventReport, InstanceReport, InstanceStateChange,
    NodeRegistration,
};
use flotilla_api_types::ids::SnapshotId;
use flotilla_api_types::instances::InstanceStatus;

use crate::agent::link::LinkError;
use crate::instance::InstanceSlot;
use crate::instance::state::{Event, State};
use crate::system::monitor::{self, ProcTable};
use flotilla_api_types::agent::RegistrationAck;

use super::{Agent, Outgoing};

impl Agent {
    /// What the agent knows of its instances.
    pub fn instance_reports(&self) -> Vec<InstanceReport> {
        let slots = self.all_slots();
        slots.iter().map(|slot| self.report_of(slot)).collect()
    }

    /// What the control plane is told of `slot`, with its last reading.
    fn report_of(&self, slot: &InstanceSlot) -> InstanceReport {
        slot.report(self.inner.readings.resources(slot))
    }

    pub fn registration(&self) -> NodeRegistration {
        let machine = self.inner.machine.lock().expect("machine lock");
        NodeRegistration {
            node_id: self.inner.node_id.clone(),
            generation: self.inner.generation.clone(),
            address: self.inner.settings.address.clone(),
            public_host: self.inner.settings.public_host.clone(),
            max_instances: self.inner.settings.config.max_instances,
            capabilities: machine.capabilities(),
            images: self.inner.catalog.keys().cloned().collect(),
            resources: flotilla_api_types::nodes::ResourceUsage::default(),
            load: flotilla_api_types::nodes::ResourceUsage::default(),
            instances: self.instance_reports(),
            warnings: self.inner.launcher.warnings().to_vec(),
            browser_version: self.inner.browser_version.clone(),
            protocol_version: flotilla_api_types::agent::PROTOCOL_VERSION.to_owned(),
            snapshot_store: self.inner.settings.snapshots.identity.clone(),
        }
    }

    /// The node's resources and load now.
    fn sample_machine(
        &self,
    ) -> (
        flotilla_api_types::nodes::ResourceUsage,
        flotilla_api_types::nodes::ResourceUsage,
    ) {
        self.inner
            .machine
            .lock()
            .expect("machine lock")
            .sample_with_load()
    }

    pub(super) async fn register_until_accepted(&self) -> anyhow::Result<RegistrationAck> {
        let mut wait = Duration::from_millis(200);
        loop {
            let mut registration = self.registration();
            let (resources, load) = self.sample_machine();
            registration.resources = resources;
            registration.load = load;
            match self.inner.link.register(registration).await {
                Ok(ack) => match flotilla_api_types::agent::protocols_meet(
                    flotilla_api_types::agent::PROTOCOL_VERSION,
                    &ack.protocol_version,
                ) {
                    Ok(()) => {
                        self.apply(&ack);
                        return Ok(ack);
                    }
                    Err(why) => {
                        tracing::error!(%why, "this agent refuses the control plane; retrying in {wait:?}");
                    }
                },
                Err(LinkError::Refused(reason)) => {
                    tracing::error!(%reason, "the control plane refused this agent's registration; retrying in {wait:?}");
                }
                Err(error) => {
                    tracing::warn!(%error, "registration with the control plane failed; retrying in {wait:?}");
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = self.inner.shutdown.cancelled() => anyhow::bail!("shut down before registration"),
            }
            wait = (wait * 2).min(Duration::from_secs(5));
        }
    }

    /// Applies what the control plane answered: who may use instance ports.
    /// The first answer with authentication off on a node whose instance
    /// ports face the network is logged as a warning.
    pub(super) fn apply(&self, ack: &RegistrationAck) {
        let takes_refusals =
            flotilla_api_types::agent::protocol_at_least(&ack.protocol_version, "1.3");
        self.inner
            .takes_refusals
            .store(takes_refusals, std::sync::atomic::Ordering::Relaxed);
        let was_enabled = self.inner.access.auth_enabled();
        self.inner.access.apply(&ack.instance_access);
        let bind = self.inner.settings.bind_address;
        if was_enabled && !ack.instance_access.auth_enabled && !bind.is_loopback() {
            tracing::warn!(
                bind_address = %bind,
                "authentication is off and instance ports listen on {bind}: anyone who reaches this node can drive its browsers; set auth_enabled = true (or agent.bind_address = \"127.0.0.1\")"
            );
        }
    }

    /// Samples resources and sends a heartbeat every interval.
    pub(super) async fn report_loop(self, mut ack: RegistrationAck) {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(ack.heartbeat_interval()) => {}
                _ = self.inner.shutdown.cancelled() => return,
            }
            let heartbeat = self.sample();
            let reported = heartbeat.instances.len() as u64;
            let sent = self.inner.link.heartbeat(heartbeat).await;
            self.inner
                .runs
                .record_result("heartbeat", &sent.as_ref().map(|_| reported));
            match sent {
                Ok(new_ack) => {
                    self.apply(&new_ack);
                    ack = new_ack;
                }
                Err(LinkError::UnknownNode) => match self.register_until_accepted().await {
                    Ok(new_ack) => ack = new_ack,
                    Err(_) => return,
                },
                Err(error) => tracing::warn!(%error, "heartbeat failed"),
            }
        }
    }

    /// Takes a resource sample of the machine and every instance.
    pub fn sample(&self) -> Heartbeat {
        let slots = self.all_slots();
        let readings = &self.inner.readings;
        {
            let present = self.inner.slots.lock().expect("slots lock");
            readings.keep_only(|id| present.contains_key(id));
        }
        if self.binds_ports() && !slots.is_empty() {
            let table = ProcTable::scan();
            let now = Instant::now();
            for slot in &slots {
                if slot.status().0 == InstanceStatus::Dormant {
                    readings.update(slot, |reading| reading.resources = Default::default());
                    continue;
                }
                let root = slot.process().and_then(|p| p.pid());
                // Everything the instance writes: its profile, its home
                // (caches, crash dumps), downloads, recordings and
                // WebDriver uploads.
                let [profile, home, downloads] = slot.dirs.writable();
                let recordings = self.recordings_dir(&slot.id);
                let uploads = slot.dirs.uploads();
                // Measured outside the table's lock (it walks directories).
                let mut cpu = readings.update(slot, |reading| std::mem::take(&mut reading.cpu));
                let resources = monitor::instance_resources(
                    &table,
                    &mut cpu,
                    root,
                    &[&profile, &home, &downloads, &recordings, &uploads],
                    now,
                );
                readings.update(slot, |reading| {
                    reading.cpu = cpu;
                    reading.resources = resources;
                });
                self.check_limits(slot, resources.disk_mb);
                self.announce_downloads(slot);
                self.announce_refusals(slot);
            }
        }
        let (resources, load) = self.sample_machine();
        let warm_pools = self.inner.launcher.pool_reports();
        Heartbeat {
            node_id: self.inner.node_id.clone(),
            generation: self.inner.generation.clone(),
            resources,
            load,
            instances: slots.iter().map(|slot| self.report_of(slot)).collect(),
            // For a control plane that reads one: `warm_pool_image`'s.
            warm_pool: warm_pools
                .iter()
                .find(|pool| pool.image == self.inner.settings.config.warm_pool_image)
                .or(warm_pools.first())
                .cloned(),
            warm_pools,
            loops: self.loops(),
        }
    }

    /// What the agent's loops did, run by run (with their errors: the
    /// control plane shows them only to a caller with a key).
    pub fn loops(&self) -> Vec<flotilla_api_types::health::BackgroundTaskHealth> {
        let mut loops = self.inner.runs.report(true);
        loops.extend(self.inner.launcher.runs.report(true));
        loops
    }

    /// Announces downloads of `slot` that finished since the last sample.
    pub(super) fn announce_downloads(&self, slot: &InstanceSlot) {
        let finished = self.inner.readings.newly_completed_downloads(slot);
        for download in finished {
            tracing::info!(instance = %slot.id, name = download.name, size = download.size_bytes, "download completed");
            self.send_event(
                slot,
                InstanceEventKind::DownloadCompleted {
                    name: download.name,
                    size_bytes: download.size_bytes,
                },
            );
        }
    }

    /// Announces the destinations the egress policy refused `slot`'s browser
    /// since the last sample (each once), to a control plane that takes them.
    pub(super) fn announce_refusals(&self, slot: &InstanceSlot) {
        let Some(process) = slot.process() else {
            return;
        };
        let refusals = process.take_refusals();
        if !self
            .inner
            .takes_refusals
            .load(std::sync::atomic::Ordering::Relaxed)
        {
            return;
        }
        for refusal in refusals {
            tracing::info!(instance = %slot.id, destination = refusal.destination, reason = refusal.reason, "egress refused; [agent.egress] allow opens it");
            self.send_event(
                slot,
                InstanceEventKind::EgressRefused {
                    destination: refusal.destination,
                    reason: refusal.reason,
                },
            );
        }
    }

    /// Reports processes killed by the memory limit, and fails an instance whose
    /// files outgrew `disk_gb` (in that order, by a task of their own).
    pub(super) fn check_limits(&self, slot: &Arc<InstanceSlot>, disk_mb: f64) {
        if !matches!(slot.state(), State::Running { .. }) {
            return;
        }
        let warned = self.inner.readings.new_oom_kills(slot).map(|new_kills| {
            let reason = format!(
                "the memory limit (memory_gb = {}) was hit: the kernel killed {new_kills} browser process(es); a tab may have crashed",
                slot.config.memory_gb
            );
            tracing::warn!(instance = %slot.id, %reason);
            reason
        });
        let limit_mb = slot.config.disk_gb * 1024.0;
        let failed = (disk_mb > limit_mb).then(|| {
            format!(
                "what the instance wrote (profile, home, downloads and recordings) grew to {disk_mb:.1} MB, over the disk limit of {limit_mb:.0} MB (disk_gb = {})",
                slot.config.disk_gb
            )
        });
        if warned.is_none() && failed.is_none() {
            return;
        }
        let (agent, slot) = (self.clone(), slot.clone());
        self.inner.tasks.spawn(async move {
            if let Some(reason) = warned
                && let Some(effects) = slot.apply(Event::Warned { reason }).await
            {
                agent.carry_out(&slot, effects);
            }
            if let Some(reason) = failed {
                agent.fail_instance(slot, reason).await;
            }
        });
    }

    /// Stops an instance on the agent's own initiative (e.g. its profile
    /// outgrew `disk_gb`) and reports it `failed` with `reason`.
    pub(super) async fn fail_instance(self, slot: Arc<InstanceSlot>, reason: String) {
        let Some(effects) = slot.apply(Event::Failed { reason }).await else {
            return;
        };
        if let Some(process) = slot.process() {
            process.stop(None, false, Duration::ZERO).await;
        }
        self.carry_out(&slot, effects);
    }

    /// Queues an event of `slot` for the control plane (in order with its
    /// state changes).
    pub(super) fn send_event(&self, slot: &InstanceSlot, event: InstanceEventKind) {
        let report = InstanceEventReport {
            node_id: self.inner.node_id.clone(),
            id: slot.id.clone(),
            event,
            at: self.inner.settings.clock.now(),
        };
        let _ = self.inner.changes.send(Outgoing::Event(report));
    }

    /// Queues a state change for the control plane (in order with the
    /// other changes and events). With `confirm`, the spent snapshot of a
    /// revive is deleted once the control plane has recorded the change.
    pub(super) fn send_change(&self, change: InstanceStateChange, confirm: Option<SnapshotId>) {
        match confirm {
            None => {
                let _ = self.inner.changes.send(Outgoing::Change(change, None));
            }
            Some(spent) => {
                let id = change.id.clone();
                let (recorded_tx, recorded) = oneshot::channel();
                let _ = self
                    .inner
                    .changes
                    .send(Outgoing::Change(change, Some(recorded_tx)));
                self.delete_once_recorded(id, spent, recorded);
            }
        }
    }

    /// Delivers state changes one at a time, in order, retrying until accepted
    /// (or, after shutdown, giving up on one that fails).
    pub(super) async fn send_changes(self, mut queue: mpsc::UnboundedReceiver<Outgoing>) {
        let mut all_delivered = true;
        while let Some(item) = queue.recv().await {
            match item {
                Outgoing::Close(done) => {
                    let _ = done.send(all_delivered);
                    return;
                }
                Outgoing::Change(..) | Outgoing::Event(_) => {}
            }
            let mut item = item;
            let mut wait = Duration::from_millis(100);
            loop {
                let (sent, instance) = match &mut item {
                    Outgoing::Change(change, recorded) => {
                        let sent = self.inner.link.state_changed(change.clone()).await;
                        if let (Ok(ack), Some(recorded)) = (&sent, recorded.take()) {
                            let _ = recorded.send(ack.applied);
                        }
                        (sent.map(drop), &change.id)
                    }
                    Outgoing::Event(event) => (
                        self.inner.link.instance_event(event.clone()).await,
                        &event.id,
                    ),
                    Outgoing::Close(_) => unreachable!("answered above"),
                };
                self.inner
                    .runs
                    .record_result("state change", &sent.as_ref().map(|()| 1));
                match sent {
                    Ok(()) => break,
                    Err(error) if self.inner.shutdown.is_cancelled() => {
                        tracing::warn!(%error, %instance, "state change not delivered before shutdown");
                        all_delivered = false;
                        break;
                    }
                    Err(error) => {
                        tracing::warn!(%error, %instance, "state change not delivered; retrying in {wait:?}");
                        tokio::time::sleep(wait).await;
                        wait = (wait * 2).min(Duration::from_secs(5));
                    }
                }
            }
        }
    }
}
