//! Parking and reviving instances on the one [`Agent`]: capture the session,
//! archive it to the snapshot store and free the browser (keeping the ports,
//! so that a connecting client wakes the instance), and bring it back from
//! its snapshot; a failed park resumes the browser in place.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot};

use flotilla_api_types::InstanceId;
use flotilla_api_types::agent::{AgentDormantResult, AgentInstancePorts, AgentReviveInstance};
use flotilla_api_types::ids::{OperationId, SnapshotId};
use flotilla_api_types::instances::{InstanceStatus, ReviveMethod};

use crate::config::ImageConfig;
use crate::engine::browser::{BrowserProcess, CdpEndpoint};
use crate::engine::launcher::WarmTaker;
use crate::instance::InstanceSlot;
use crate::instance::state::{Effect, Event, Lifecycle, State};
use crate::snapshot::{self, CapturedState, RestoreOptions};
use crate::system::dirs::InstanceDirs;

use super::operations::Request;
use super::{
    Agent, AgentError, ArchiveError, CDP_GRACE, SlotStart, StartFailure, check_config_for_image,
    open_archive, ports_of, remove_dir, unpack_into,
};

/// How long a park waits for the recording it ended to be written.
const RECORDING_END: Duration = Duration::from_secs(30);

impl Agent {
    /// Parks a running instance: captures its CDP state, closes the browser
    /// (flushing cookies to disk), stores profile and state as one archive, and
    /// frees the browser's memory and profile. Ports and servers stay: a client
    /// that connects wakes it. Only once the archive is stored does the instance
    /// count as dormant; if storing fails, the browser is started again on its
    /// profile and the instance keeps running.
    pub(super) async fn park_now(&self, id: &InstanceId) -> Result<AgentDormantResult, AgentError> {
        let slot = self.slot(id)?;
        let (reply, answer) = oneshot::channel();
        let gone = || AgentError::NotFound(id.clone());
        self.submit(&slot, Request::Park { reply })
            .await
            .map_err(|_| gone())?;
        answer.await.unwrap_or_else(|_| Err(gone()))
    }

    /// What a park of `slot` keeps of its browser at `endpoint` (nothing
    /// without one); a BiDi client holding Firefox's only session is a 409
    /// (see [`FirefoxHeld`] for a WebDriver client's).
    async fn state_to_park(
        &self,
        slot: &Arc<InstanceSlot>,
        endpoint: Option<&CdpEndpoint>,
    ) -> Result<CapturedState, AgentError> {
        let Some(endpoint) = endpoint else {
            return Ok(CapturedState::default());
        };
        self.engine()
            .capture(endpoint)
            .await
            .map_err(|error| match error.downcast_ref() {
                Some(crate::engine::bidi::BidiError::SessionHeld) => {
                    AgentError::BrowserHeld(slot.id.clone())
                }
                _ => AgentError::StateUnreadable(error),
            })
    }

    /// The park of [`Agent::park_now`], in the task of the instance's
    /// operations.
    pub(super) async fn park(
        &self,
        slot: &Arc<InstanceSlot>,
    ) -> Result<AgentDormantResult, AgentError> {
        let id = &slot.id;
        let not_running = |slot: &InstanceSlot| AgentError::NotRunning {
            instance: slot.id.clone(),
            status: slot.status().0,
        };
        if !matches!(slot.state(), State::Running { .. }) {
            return Err(not_running(slot));
        }
        flotilla_api_types::faults::point("agent-park-received").await;
        let started = Instant::now();
        let endpoint = slot.endpoint();
        let firefox = FirefoxHeld::taken(slot, endpoint.as_ref()).await;
        let state = self.state_to_park(slot, endpoint.as_ref()).await?;
        // From here its browser's exit is expected, and clients wait.
        if slot.apply(Event::Park).await.is_none() {
            return Err(not_running(slot));
        }
        if let Some(process) = slot.process() {
            process.stop(endpoint.as_ref(), true, CDP_GRACE).await;
        }
        slot.supervision_finished().await;
        drop(firefox);

        let (snapshot_id, snapshot_bytes) = match self.archive_and_store(slot, &state).await {
            Ok(stored) => stored,
            Err(error) => {
                tracing::error!(instance = %id, %error, "parking failed; starting the browser again");
                self.resume_in_place(slot, &state).await;
                return Err(match error {
                    ArchiveError::Store { .. } => AgentError::SnapshotNotStored(error),
                    _ => AgentError::SnapshotNotMade(error),
                });
            }
        };
        if let Some(name) = slot.persisted_profile() {
            self.save_profile(slot, name, state).await;
        }
        if slot.config.record {
            self.save_recordings(id).await;
        }
        let profile = slot.dirs.profile();
        let _ = tokio::task::spawn_blocking(move || remove_dir(&profile)).await;
        // Also as a state change: a control plane that dies before it reads
        // this answer learns of the park when it comes back.
        let parked = Event::Parked {
            snapshot: snapshot_id.clone(),
        };
        let Some(effects) = slot.apply(parked).await else {
            // Stopped meanwhile (the agent is shutting down).
            return Err(AgentError::ShuttingDown);
        };
        self.carry_out(slot, effects);
        tracing::info!(
            instance = %id,
            snapshot = %snapshot_id,
            bytes = snapshot_bytes,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "instance dormant"
        );
        Ok(AgentDormantResult {
            snapshot_id,
            dormant_since: self.inner.settings.clock.now(),
            snapshot_bytes,
        })
    }

    /// Saves the instance's finished recordings to the snapshot store, once
    /// the recording the park ended is written; a failure is logged (the
    /// recordings stay on this node, and the park goes on).
    async fn save_recordings(&self, id: &InstanceId) {
        let dir = self.recordings_dir(id);
        if !crate::protocols::recording::wait_finished(&dir, RECORDING_END).await {
            tracing::warn!(instance = %id, "the last recording is still being written; it stays on this node");
        }
        let store = &self.inner.settings.snapshots;
        match crate::protocols::recording::save(store, id, &dir).await {
            Ok(count) => tracing::debug!(instance = %id, count, "recordings saved"),
            Err(error) => {
                tracing::warn!(instance = %id, store = store.location, %error, "cannot save the recordings to the snapshot store; they stay on this node")
            }
        }
    }

    /// Brings back the recordings an instance revived here made on another
    /// node (saved at its park), unless it is deleted meanwhile.
    async fn restore_recordings(self, slot: Arc<InstanceSlot>) {
        let dir = self.recordings_dir(&slot.id);
        let store = &self.inner.settings.snapshots;
        tokio::select! {
            restored = crate::protocols::recording::restore(store, &slot.id, &dir) => match restored {
                Ok(0) => {}
                Ok(count) => tracing::info!(instance = %slot.id, count, "recordings brought back from the snapshot store"),
                Err(error) => tracing::warn!(instance = %slot.id, store = store.location, %error, "cannot bring back the recordings from the snapshot store"),
            },
            () = slot.servers.cancelled() => {}
        }
    }

    /// Archives a closed browser's profile, downloads and captured state, and
    /// puts the archive in the snapshot store under a new snapshot id; answers
    /// the id and the archive's size.
    async fn archive_and_store(
        &self,
        slot: &InstanceSlot,
        state: &CapturedState,
    ) -> Result<(SnapshotId, u64), ArchiveError> {
        let profile = slot.dirs.profile();
        let downloads = slot.dirs.downloads();
        std::fs::create_dir_all(&profile).map_err(ArchiveError::ProfileDirectory)?;
        let packed_state = state.clone();
        let archive = tokio::task::spawn_blocking(move || {
            snapshot::archive(&profile, Some(&downloads), &packed_state)
        })
        .await
        .map_err(ArchiveError::Panicked)?
        .map_err(ArchiveError::Archive)?;
        let snapshot_id = SnapshotId::generate();
        let size = archive.len() as u64;
        let snapshots = &self.inner.settings.snapshots;
        snapshots
            .put(&slot.id, &snapshot_id, archive)
            .await
            .map_err(|source| ArchiveError::Store {
                location: snapshots.location.clone(),
                source,
            })?;
        Ok((snapshot_id, size))
    }

    /// After a failed park: the browser is closed but its profile is still here;
    /// start it again and put the session cookies and the tabs back.
    pub(super) async fn resume_in_place(&self, slot: &Arc<InstanceSlot>, state: &CapturedState) {
        let outcome = async {
            let image = self.image(&slot.image)?;
            let limits = self.inner.launcher.limits_for(&slot.config);
            let guard = slot.begin_supervision().await;
            let (process, endpoint) = self.launch_ready(slot, &image, limits).await?;
            if let Some(endpoint) = &endpoint {
                // Its tabs come back too (and any storage the close lost).
                let options = RestoreOptions {
                    reopen_tabs: true,
                    service_workers: true,
                };
                self.engine()
                    .restore(endpoint, state, options)
                    .await
                    .map_err(StartFailure::TabsRestore)?;
            }
            Ok::<_, StartFailure>((process, endpoint, guard))
        }
        .await;
        match outcome {
            Ok((process, endpoint, guard)) => {
                slot.apply(Event::Ready { endpoint }).await;
                let agent = self.clone();
                let watched = slot.clone();
                self.inner.tasks.spawn(async move {
                    let _guard = guard;
                    agent.watch_exit(&watched, &process).await;
                });
            }
            Err(reason) => {
                let failed = Event::LaunchFailed {
                    reason: format!("restart after a failed park: {reason}"),
                };
                if let Some(effects) = slot.apply(failed).await {
                    self.carry_out(slot, effects);
                }
            }
        }
    }

    /// Revives a dormant instance from `request.snapshot_id`: answers at once
    /// (`reviving`) and reports `running` or `failed` when done. If this agent no
    /// longer holds the instance (it restarted), it takes it back, on its old
    /// ports when they are free.
    ///
    /// The instance is `reviving` (with the request's operation) from the
    /// moment the request is taken, before anything else is awaited: a control
    /// plane that restarts meanwhile learns that the node has it, and waits
    /// instead of undoing it. The same request again (a caller that timed
    /// out) is answered as the first one was.
    pub(super) async fn revive_now(
        &self,
        request: AgentReviveInstance,
    ) -> Result<AgentInstancePorts, AgentError> {
        if self.inner.shutdown.is_cancelled() {
            return Err(AgentError::ShuttingDown);
        }
        let image = self.image(&request.image)?;
        check_config_for_image(&request.image, &image, &request.config)?;
        let (slot, listeners) = self.slot_to_revive(&request)?;
        if let Some([debug, stream, http]) = listeners {
            self.start_servers(&slot, debug, stream, http);
            if slot.config.record {
                self.inner
                    .tasks
                    .spawn(self.clone().restore_recordings(slot.clone()));
            }
        }
        if asked_again(&slot, &request) {
            return Ok(ports_of(&slot));
        }
        let previous = slot.operation();
        let from = Some(request.snapshot_id.clone());
        let claimed = self
            .claim_revive(&slot, request.operation.clone(), false, from)
            .await;
        if let Err(error) = claimed {
            // The same request, sent twice at once: the other one claimed it.
            return match asked_again(&slot, &request) {
                true => Ok(ports_of(&slot)),
                false => Err(error),
            };
        }
        // A store that cannot be read is refused now, the instance still parked.
        flotilla_api_types::faults::point("agent-revive-received").await;
        if let Err(error) = self
            .inner
            .settings
            .snapshots
            .check(&request.id, &request.snapshot_id)
            .await
        {
            slot.apply(Event::ReviveRefused { previous }).await;
            return Err(AgentError::StoreUnreadable {
                location: self.inner.settings.snapshots.location.clone(),
                source: error,
            });
        }
        let revive = Request::Revive {
            method: request.method,
            snapshot: request.snapshot_id,
            image,
        };
        // A task already gone: the instance was deleted meanwhile.
        let _ = self.submit(&slot, revive).await;
        Ok(ports_of(&slot))
    }

    /// The slot of the instance a revive names, taken back (with its ports
    /// reserved) when this agent does not hold it; and the listeners of
    /// newly reserved ports.
    fn slot_to_revive(
        &self,
        request: &AgentReviveInstance,
    ) -> Result<(Arc<InstanceSlot>, Option<[std::net::TcpListener; 3]>), AgentError> {
        let mut slots = self.inner.slots.lock().expect("slots lock");
        if let Some(slot) = slots.get(&request.id) {
            slot.grant(request.access_token.as_ref(), request.profile.clone());
            return Ok((slot.clone(), None));
        }
        self.check_room(&slots)?;
        let binds = self.binds_ports();
        let ports = request
            .ports
            .and_then(|wanted| self.inner.ports.reserve_exact(wanted, binds))
            .or_else(|| self.inner.ports.reserve(binds))
            .ok_or_else(|| self.ports_exhausted())?;
        let dirs = InstanceDirs::new(self.inner.instances_root.join(request.id.as_str()));
        let taken_back = SlotStart::at(Lifecycle::taken_back(request.snapshot_id.clone()));
        // No browser to watch until its revive begins.
        let (slot, _unwatched) = self.new_slot(request, &ports, dirs, taken_back);
        slots.insert(request.id.clone(), slot.clone());
        Ok((slot, ports.listeners))
    }

    /// Moves `slot` from dormant to reviving from snapshot `from` (`None`:
    /// the one it is parked in), as `operation`, in one step of its runner
    /// (whoever asks the node from then on hears `reviving`); answers what
    /// else to do (its report, for a revive a client `woken`, is sent).
    async fn claim_revive(
        &self,
        slot: &Arc<InstanceSlot>,
        operation: Option<OperationId>,
        woken: bool,
        from: Option<SnapshotId>,
    ) -> Result<Vec<Effect>, AgentError> {
        slot.apply(Event::Revive {
            operation,
            woken,
            from,
        })
        .await
        .ok_or_else(|| AgentError::NotDormant {
            instance: slot.id.clone(),
            status: slot.status().0,
        })
    }

    /// Revives a claimed slot from `snapshot`, in the task of its
    /// operations; reports `running`, `failed`, or `dormant` again when the
    /// store cannot be read.
    pub(super) async fn revive(
        &self,
        slot: &Arc<InstanceSlot>,
        method: ReviveMethod,
        snapshot: SnapshotId,
        image: ImageConfig,
    ) {
        if !matches!(slot.state(), State::Reviving { .. }) {
            return;
        }
        let guard = slot.begin_supervision().await;
        let started = Instant::now();
        let archive = match self.inner.settings.snapshots.get(&slot.id, &snapshot).await {
            Ok(archive) => Ok(archive),
            Err(error) if !snapshot::is_not_found(&error) => {
                // The store failed, not the snapshot: stay parked.
                let reason = format!(
                    "revive failed: the snapshot store {} cannot be read: {error}; the instance stays dormant",
                    self.inner.settings.snapshots.location
                );
                tracing::warn!(instance = %slot.id, reason, "revive postponed");
                if let Some(effects) = slot.apply(Event::RevivePostponed { reason }).await {
                    self.carry_out(slot, effects);
                }
                return;
            }
            Err(source) => Err(StartFailure::SnapshotUnreadable {
                snapshot: snapshot.clone(),
                source,
            }),
        };
        let outcome = match archive {
            Ok(archive) => {
                self.restore_from(slot, archive, &snapshot, method, &image)
                    .await
            }
            Err(reason) => Err(reason),
        };
        match outcome {
            Ok((process, endpoint)) => {
                slot.touch();
                // The snapshot stays with the slot (and in the report) until
                // the control plane has recorded the revive; a revive of an
                // instance stopped meanwhile (the agent's kill) is dropped.
                let Some(effects) = slot.apply(Event::Ready { endpoint }).await else {
                    return;
                };
                tracing::info!(instance = %slot.id, method = method.as_str(), elapsed_ms = started.elapsed().as_millis() as u64, "instance revived");
                self.carry_out(slot, effects);
                let (agent, watched) = (self.clone(), slot.clone());
                self.inner.tasks.spawn(async move {
                    let _guard = guard;
                    agent.watch_exit(&watched, &process).await;
                });
            }
            Err(reason) => {
                if let Some(process) = slot.process() {
                    process.stop(None, false, Duration::ZERO).await;
                }
                // The snapshot stays in the store: the instance can be revived again.
                let failed = Event::LaunchFailed {
                    reason: format!("revive failed: {reason}"),
                };
                if let Some(effects) = slot.apply(failed).await {
                    self.carry_out(slot, effects);
                }
            }
        }
    }

    /// Puts a snapshot back: into a warm browser when one can take it (see
    /// [`Agent::start_in_warm_browser`]), otherwise by unpacking it into
    /// the instance's directory and launching the browser on it; then the
    /// session (and the tabs, for a full restore).
    async fn restore_from(
        &self,
        slot: &Arc<InstanceSlot>,
        archive: bytes::Bytes,
        snapshot: &SnapshotId,
        method: ReviveMethod,
        image: &ImageConfig,
    ) -> Result<(Arc<BrowserProcess>, Option<CdpEndpoint>), StartFailure> {
        let unpack_failed = |source| StartFailure::SnapshotUnpack {
            snapshot: snapshot.clone(),
            source,
        };
        let started = Instant::now();
        let opened = open_archive(archive).await.map_err(unpack_failed)?;
        tracing::debug!(instance = %slot.id, read_ms = started.elapsed().as_millis() as u64, "snapshot read");
        let reopen_tabs = method == ReviveMethod::FullRestore;
        let service_workers = opened.holds_service_workers();
        let warm = self
            .start_in_warm_browser(slot, Some(&opened), reopen_tabs)
            .await;
        self.inner
            .launcher
            .count_take(&slot.image, WarmTaker::Revive, warm.is_some());
        if let Some((process, endpoint)) = warm {
            return Ok((process, Some(endpoint)));
        }
        unpack_into(slot, opened.clone())
            .await
            .map_err(unpack_failed)?;
        // What the snapshot brought back was announced when it finished.
        let _ = self.inner.readings.newly_completed_downloads(slot);
        let limits = self.inner.launcher.limits_for(&slot.config);
        let (process, endpoint) = self.launch_ready(slot, image, limits).await?;
        if let Some(endpoint) = &endpoint {
            let options = RestoreOptions {
                reopen_tabs,
                service_workers,
            };
            self.engine()
                .restore(endpoint, &opened.state, options)
                .await
                .map_err(StartFailure::StateRestore)?;
        }
        Ok((process, endpoint))
    }

    /// Deletes a revived instance's spent archive (its next park makes a new
    /// one), but only once the control plane has recorded the revive: until
    /// then a crash falls back on it. A revive the control plane did not take
    /// (it had moved past it) keeps its snapshot.
    pub(super) fn delete_once_recorded(
        &self,
        id: InstanceId,
        snapshot: SnapshotId,
        recorded: oneshot::Receiver<bool>,
    ) {
        let agent = self.clone();
        self.inner.tasks.spawn(async move {
            if recorded.await != Ok(true) {
                tracing::warn!(instance = %id, %snapshot, "the control plane did not record this revive; its snapshot is kept");
                return;
            }
            // Gone meanwhile (deleted): its snapshot is spent all the same.
            if let Ok(slot) = agent.slot(&id) {
                slot.apply(Event::ReviveRecorded {
                    snapshot: snapshot.clone(),
                })
                .await;
            }
            if let Err(error) = agent.inner.settings.snapshots.delete(&id, &snapshot).await {
                tracing::warn!(instance = %id, %error, "cannot delete a spent snapshot");
            }
        });
    }

    /// Revives dormant instances that a client connected to, with the
    /// revive the client asked for (see [`crate::instance::Wake`]).
    pub(super) async fn wake_loop(self, mut wake: mpsc::UnboundedReceiver<crate::instance::Wake>) {
        loop {
            let crate::instance::Wake { id, method } = tokio::select! {
                wake = wake.recv() => match wake { Some(wake) => wake, None => return },
                _ = self.inner.shutdown.cancelled() => return,
            };
            let Ok(slot) = self.slot(&id) else { continue };
            if self.inner.leaving.load(std::sync::atomic::Ordering::SeqCst) {
                tracing::info!(instance = %id, "not woken: the node is being drained before its agent stops");
                continue;
            }
            let (Some(snapshot), Ok(image)) = (slot.snapshot(), self.image(&slot.image)) else {
                continue;
            };
            let operation = Some(OperationId::generate());
            let claimed = self.claim_revive(&slot, operation, true, None).await;
            self.inner
                .runs
                .record_result("wake", &claimed.as_ref().map(|_| 1));
            if let Ok(effects) = claimed {
                tracing::info!(instance = %id, ?method, "a client connected to a dormant instance: waking it");
                self.carry_out(&slot, effects);
                let revive = Request::Revive {
                    method,
                    snapshot,
                    image,
                };
                // Not awaited here: one instance's busy queue must not hold
                // the wakes of the others.
                let agent = self.clone();
                self.inner.tasks.spawn(async move {
                    let _ = agent.submit(&slot, revive).await;
                });
            }
        }
    }
}

/// Whether `request` is a revive `slot` is already under (or done with):
/// the same operation, asked again by a caller that timed out.
fn asked_again(slot: &InstanceSlot, request: &AgentReviveInstance) -> bool {
    request.operation.is_some()
        && slot.operation() == request.operation
        && slot.status().0 != InstanceStatus::Dormant
}

/// What a park (or a graceful delete) holds of a Firefox from before its
/// state is read until its browser stopped: Firefox holds one WebDriver
/// session, which the state read and the graceful stop need. A WebDriver
/// client's session is let go (its commands wait, and go on in the revived
/// browser), and a claim keeps the live view from taking one of its own in
/// between.
pub(super) struct FirefoxHeld<'a> {
    _claim: crate::engine::bidi::SessionClaim,
    _webdriver: crate::protocols::webdriver::LetGo<'a>,
}

impl<'a> FirefoxHeld<'a> {
    pub(super) async fn taken(
        slot: &'a InstanceSlot,
        endpoint: Option<&CdpEndpoint>,
    ) -> Option<Self> {
        let endpoint = endpoint.filter(|endpoint| !endpoint.speaks_cdp())?;
        let claim = endpoint.session_turns.claim().await;
        Some(Self {
            _claim: claim,
            _webdriver: slot.webdriver.let_go_of_browser().await,
        })
    }
}
