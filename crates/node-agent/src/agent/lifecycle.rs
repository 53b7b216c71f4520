//! Creating and deleting instances on the one [`Agent`]: reserve the slot and
//! its ports, start the port servers, launch the browser (or take a warm
//! one), unpack extensions and profiles, watch the browser until it exits,
//! and stop it.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;
use tokio_util::sync::DropGuard;

use flotilla_api_types::InstanceId;
use flotilla_api_types::agent::{
    AgentCreateInstance, AgentInstancePorts, InstanceEventKind, InstanceStateChange,
};
use flotilla_api_types::extensions::is_extension_id;
use flotilla_api_types::instances::KeptRecording;

use crate::config::ImageConfig;
use crate::engine::browser::{BrowserProcess, BrowserSetup, CdpEndpoint, LaunchError};
use crate::engine::launcher::{WarmBrowser, WarmTaker};
use crate::system::cgroups::Limits;
use crate::system::dirs::InstanceDirs;

/// How long an instance made from a warm browser keeps the chromedriver the
/// browser came with, for a WebDriver session to take (its session attaches
/// as soon as the create is answered).
const PRESTARTED_DRIVER_KEPT: Duration = Duration::from_secs(30);
use crate::engine::extension;
use crate::instance::InstanceSlot;
use crate::instance::state::{Effect, Event, Lifecycle, State};
use crate::protocols::gateway::{self, GatewayContext};
use crate::protocols::instance_http;
use crate::protocols::live_view::{self, LiveView, LiveViewSettings};
use crate::snapshot::{self, CapturedState, OpenedArchive};

use super::operations::Request;
use super::{
    Agent, AgentError, CDP_GRACE, SlotStart, StartFailure, check_config_for_image,
    check_profile_engine, open_archive, ports_of, remove_dir, unpack_into, upstream_of,
};

/// How long a delete waits for the recorder to finish its last recording
/// (ffmpeg is given 30 s to write its end).
const RECORDER_GRACE: Duration = Duration::from_secs(40);

impl Agent {
    pub(super) async fn create_now(
        &self,
        request: AgentCreateInstance,
    ) -> Result<AgentInstancePorts, AgentError> {
        let inner = &self.inner;
        if inner.shutdown.is_cancelled() {
            return Err(AgentError::ShuttingDown);
        }
        let image = self.image(&request.image)?;
        check_config_for_image(&request.image, &image, &request.config)?;
        check_profile_engine(&request, &image)?;
        let limits = inner.launcher.limits_for(&request.config);
        let upstream = upstream_of(&request.config)?;
        let (slot, listeners, warm, guard) = {
            let mut slots = inner.slots.lock().expect("slots lock");
            if let Some(existing) = slots.get(&request.id) {
                return Ok(ports_of(existing));
            }
            self.check_room(&slots)?;
            let ports = inner
                .ports
                .reserve(self.binds_ports())
                .ok_or_else(|| self.ports_exhausted())?;
            // A pooled browser already runs on an empty profile, without
            // extensions or preferences.
            let mut warm = if request.profile.is_none()
                && request.config.extensions.is_empty()
                && request.config.prefs.is_none()
            {
                inner.launcher.take_warm(&request.image, limits, upstream)
            } else {
                None
            };
            // A create with a profile is counted once its profile is read
            // (it may take a warm browser then, see `supervise`).
            if request.profile.is_none() {
                inner
                    .launcher
                    .count_take(&request.image, WarmTaker::Create, warm.is_some());
            }
            let dirs = match &warm {
                Some(warm) => warm.dirs.clone(),
                None => InstanceDirs::new(inner.instances_root.join(request.id.as_str())),
            };
            let operation = request.operation.clone();
            let from = match &mut warm {
                Some(warm) => SlotStart {
                    lifecycle: Lifecycle::running(Some(warm.endpoint.clone()), operation),
                    launched: Some(warm.launched.clone()),
                    prestarted_driver: warm.webdriver.take(),
                },
                None => SlotStart::at(Lifecycle::starting(operation)),
            };
            // Watched from the moment it is the agent's: a delete that comes
            // before its launch starts waits for the launch to see it.
            let (slot, guard) = self.new_slot(&request, &ports, dirs, from);
            slots.insert(request.id.clone(), slot.clone());
            (slot, ports.listeners, warm, guard)
        };
        flotilla_api_types::faults::point("agent-create-received").await;
        if let Some([debug, stream, http]) = listeners {
            self.start_servers(&slot, debug, stream, http);
        }
        match warm {
            Some(warm) => self.hand_over_warm(&slot, warm, guard),
            None => {
                self.inner
                    .tasks
                    .spawn(self.clone().supervise(slot.clone(), image, limits, guard));
            }
        }
        Ok(ports_of(&slot))
    }

    /// Watches the warm browser `slot` took; the chromedriver it came with
    /// is kept a while for a WebDriver session's attach, then ended.
    fn hand_over_warm(&self, slot: &Arc<InstanceSlot>, warm: WarmBrowser, guard: DropGuard) {
        tracing::info!(instance = %slot.id, "took a warm browser");
        let unused = slot.clone();
        let shutdown = self.inner.shutdown.clone();
        self.inner.tasks.spawn(async move {
            tokio::select! {
                () = tokio::time::sleep(PRESTARTED_DRIVER_KEPT) => {}
                () = shutdown.cancelled() => {}
                () = unused.servers.cancelled() => {}
            }
            drop(unused.take_prestarted_driver().await);
        });
        let agent = self.clone();
        let process = warm.launched.process;
        let watched = slot.clone();
        self.inner.tasks.spawn(async move {
            let _guard = guard;
            watched.touch();
            agent.watch_exit(&watched, &process).await;
        });
    }

    pub(super) fn check_room(
        &self,
        slots: &HashMap<InstanceId, Arc<InstanceSlot>>,
    ) -> Result<(), AgentError> {
        let max = self.inner.settings.config.max_instances;
        if slots.len() as i64 >= max {
            return Err(AgentError::Full {
                node: self.inner.node_id.clone(),
                max,
            });
        }
        Ok(())
    }

    pub(super) fn ports_exhausted(&self) -> AgentError {
        AgentError::PortsExhausted {
            range: self.inner.settings.config.port_range.to_string(),
            node: self.inner.node_id.clone(),
        }
    }

    pub(super) fn start_servers(
        &self,
        slot: &Arc<InstanceSlot>,
        debug: std::net::TcpListener,
        stream: std::net::TcpListener,
        http: std::net::TcpListener,
    ) {
        let to_tokio = tokio::net::TcpListener::from_std;
        // Long enough for a launch, or a wake of a dormant instance.
        let ready_timeout = Duration::from_secs(self.inner.settings.config.launch_timeout_sec + 30);
        let (Ok(debug), Ok(stream), Ok(http)) = (to_tokio(debug), to_tokio(stream), to_tokio(http))
        else {
            tracing::error!(instance = %slot.id, "cannot register instance listeners with the runtime");
            slot.not_recorded();
            return;
        };
        let access = self.inner.access.clone();
        let listeners = self.inner.settings.listeners.clone();
        let context = Arc::new(GatewayContext {
            slot: slot.clone(),
            public_host: self.inner.settings.public_host.clone(),
            ready_timeout,
            access: access.clone(),
            listeners: listeners.clone(),
            downloads_dir: self
                .inner
                .launcher
                .isolation()
                .browser_paths(&slot.dirs)
                .downloads
                .to_string_lossy()
                .into_owned(),
        });
        self.inner
            .tasks
            .spawn(gateway::serve(debug, context, slot.servers.clone()));
        let config = &self.inner.settings.config;
        let settings = LiveViewSettings {
            width: config.viewport_width,
            height: config.viewport_height,
            quality: config.live_view_quality,
        };
        let live_view = LiveView::new(slot.clone(), settings, ready_timeout);
        let recordings = self.recordings_dir(&slot.id);
        if slot.config.record {
            let recording = crate::protocols::recording::record(
                slot.clone(),
                live_view.clone(),
                recordings.clone(),
                (settings.width, settings.height),
                self.inner.launcher.isolation().clone(),
            );
            let finished = slot.recording();
            self.inner.tasks.spawn(async move {
                recording.await;
                drop(finished);
            });
        }
        self.inner.tasks.spawn(live_view::serve(
            stream,
            live_view,
            (access.clone(), listeners.clone()),
        ));
        self.inner.tasks.spawn(instance_http::serve_api(
            http,
            slot.clone(),
            ready_timeout,
            (access, listeners),
            (recordings, self.inner.captures.clone()),
            (
                self.inner.launcher.isolation().clone(),
                self.inner.settings.config.playwright_dir.clone(),
                self.playwright_exits(slot),
            ),
        ));
    }

    /// Where a Playwright server's end is told: news only while the browser
    /// it served runs (a park or a crash ends both).
    fn playwright_exits(
        &self,
        slot: &Arc<InstanceSlot>,
    ) -> crate::protocols::playwright::ExitReport {
        let (agent, slot) = (self.clone(), slot.clone());
        Arc::new(move |group, event| {
            let same_browser = slot.process().and_then(|process| process.pid()) == Some(group);
            if same_browser && matches!(slot.state(), State::Running { .. }) {
                agent.send_event(&slot, event);
            }
        })
    }

    /// Where the recordings of instance `id` go (outside its sandbox).
    pub(super) fn recordings_dir(&self, id: &InstanceId) -> std::path::PathBuf {
        self.inner
            .settings
            .data_dir
            .join("recordings")
            .join(id.as_str())
    }

    /// Launches the browser of `slot` and waits until it answers CDP.
    pub(super) async fn launch_ready(
        &self,
        slot: &Arc<InstanceSlot>,
        image: &ImageConfig,
        limits: Limits,
    ) -> Result<(Arc<BrowserProcess>, Option<CdpEndpoint>), StartFailure> {
        self.unpack_extensions(slot).await?;
        let launched = self
            .inner
            .launcher
            .spawn(
                &slot.name(),
                &slot.dirs,
                image,
                limits,
                upstream_of(&slot.config)?,
                BrowserSetup::of(&slot.config),
            )
            .await?;
        let process = launched.process.clone();
        slot.set_process(launched).await;
        if slot.is_stopping() {
            process.stop(None, false, Duration::ZERO).await;
            return Err(StartFailure::StoppedWhileStarting);
        }
        let timeout = Duration::from_secs(self.inner.settings.config.launch_timeout_sec);
        match process.wait_ready(timeout).await {
            Ok(endpoint) => {
                if let Some(endpoint) = &endpoint {
                    self.inner
                        .launcher
                        .calibrate_viewport(image, endpoint)
                        .await;
                }
                Ok((process, endpoint))
            }
            Err(error) => {
                process.stop(None, false, Duration::ZERO).await;
                Err(match error {
                    LaunchError::Timeout(timeout) => StartFailure::ReadyTimeout {
                        timeout,
                        log: crate::system::process::log_tail(&slot.dirs.log()),
                    },
                    other => StartFailure::Launch(other),
                })
            }
        }
    }

    /// Launches a new instance's browser, then watches it until it exits.
    pub(super) async fn supervise(
        self,
        slot: Arc<InstanceSlot>,
        image: ImageConfig,
        limits: Limits,
        _guard: tokio_util::sync::DropGuard,
    ) {
        let started = Instant::now();
        let launched = async {
            let saved = self.read_profile(&slot).await?;
            if slot.profile_name().is_some() {
                let opened = saved.as_ref().map(|(_, opened)| opened);
                let warm = self.start_in_warm_browser(&slot, opened, false).await;
                self.inner
                    .launcher
                    .count_take(&slot.image, WarmTaker::Create, warm.is_some());
                if let Some((process, endpoint)) = warm {
                    return Ok((process, Some(endpoint)));
                }
            }
            if let Some((name, opened)) = &saved {
                unpack_into(&slot, opened.clone()).await.map_err(|source| {
                    StartFailure::ProfileUnpack {
                        name: name.clone(),
                        source,
                    }
                })?;
            }
            let (process, endpoint) = self.launch_ready(&slot, &image, limits).await?;
            if let (Some((name, opened)), Some(endpoint)) = (&saved, &endpoint) {
                let service_workers = opened.holds_service_workers();
                self.restore_profile(name, endpoint, opened, service_workers)
                    .await?;
            }
            Ok::<_, StartFailure>((process, endpoint))
        }
        .await;
        match launched {
            Ok((process, endpoint)) => {
                slot.touch();
                // A launch that a delete overtook is dropped: the delete
                // stops its browser.
                let Some(effects) = slot.apply(Event::Ready { endpoint }).await else {
                    return;
                };
                tracing::info!(instance = %slot.id, elapsed_ms = started.elapsed().as_millis() as u64, "browser ready");
                self.carry_out(&slot, effects);
                self.watch_exit(&slot, &process).await;
            }
            Err(reason) => {
                let failed = Event::LaunchFailed {
                    reason: reason.to_string(),
                };
                if let Some(effects) = slot.apply(failed).await {
                    self.carry_out(&slot, effects);
                }
            }
        }
    }

    /// Unpacks the instance's extensions from the snapshot store into its
    /// directory, once: an unpacked folder is complete (renamed into place)
    /// and extensions never change after their upload.
    pub(super) async fn unpack_extensions(
        &self,
        slot: &Arc<InstanceSlot>,
    ) -> Result<(), StartFailure> {
        for id in &slot.config.extensions {
            if !is_extension_id(id) {
                return Err(StartFailure::NotAnExtensionId { id: id.clone() });
            }
            let folder = slot.dirs.extensions().join(id);
            if folder.is_dir() {
                continue;
            }
            let zip = self
                .inner
                .settings
                .snapshots
                .extension_get(id)
                .await
                .map_err(|source| StartFailure::ExtensionUnreadable {
                    id: id.clone(),
                    source,
                })?
                .ok_or_else(|| StartFailure::ExtensionMissing { id: id.clone() })?;
            let partial = slot.dirs.extensions().join(format!(".{id}.partial"));
            let id = id.clone();
            tokio::task::spawn_blocking(move || {
                remove_dir(&partial);
                let folder_error = |source| StartFailure::ExtensionFolder {
                    id: id.clone(),
                    source,
                };
                std::fs::create_dir_all(partial.parent().unwrap_or(&partial))
                    .map_err(folder_error)?;
                let unpacked = extension::unpack(&zip, &partial)
                    .map_err(|source| StartFailure::ExtensionUnpack {
                        id: id.clone(),
                        source,
                    })
                    .and_then(|()| std::fs::rename(&partial, &folder).map_err(folder_error));
                if unpacked.is_err() {
                    remove_dir(&partial);
                }
                unpacked
            })
            .await??;
        }
        Ok(())
    }

    /// Reads the saved state of the instance's profile, before its first
    /// launch; `None` without a profile or before the profile's first save
    /// (the browser starts empty).
    pub(super) async fn read_profile(
        &self,
        slot: &Arc<InstanceSlot>,
    ) -> Result<Option<(String, Arc<OpenedArchive>)>, StartFailure> {
        let Some(name) = slot.profile_name() else {
            return Ok(None);
        };
        let archive = self
            .inner
            .settings
            .snapshots
            .profile_get(&name)
            .await
            .map_err(|source| StartFailure::ProfileUnreadable {
                name: name.clone(),
                source,
            })?;
        let Some(archive) = archive else {
            return Ok(None);
        };
        let opened = open_archive(archive)
            .await
            .map_err(|source| StartFailure::ProfileUnpack {
                name: name.clone(),
                source,
            })?;
        tracing::info!(instance = %slot.id, profile = name, "profile read");
        Ok(Some((name, opened)))
    }

    /// Writes the closed browser's profile directory and `state` back to the
    /// instance's persistent profile, and reports the save. Failures are
    /// logged: the delete or park that asked goes on.
    pub(super) async fn save_profile(
        &self,
        slot: &Arc<InstanceSlot>,
        name: String,
        state: CapturedState,
    ) {
        let profile = slot.dirs.profile();
        let packed = tokio::task::spawn_blocking(move || {
            std::fs::create_dir_all(&profile)?;
            snapshot::archive(&profile, None, &state)
        })
        .await;
        let archive = match packed {
            Ok(Ok(archive)) => archive,
            Ok(Err(error)) => {
                tracing::error!(instance = %slot.id, profile = name, %error, "cannot archive the profile; it keeps its previous state");
                return;
            }
            Err(error) => {
                tracing::error!(instance = %slot.id, profile = name, %error, "cannot archive the profile; it keeps its previous state");
                return;
            }
        };
        let size_bytes = archive.len() as u64;
        if let Err(error) = self
            .inner
            .settings
            .snapshots
            .profile_put(&name, archive)
            .await
        {
            tracing::error!(instance = %slot.id, profile = name, %error, "cannot store the profile; it keeps its previous state");
            return;
        }
        tracing::info!(instance = %slot.id, profile = name, bytes = size_bytes, "profile saved");
        let engine = Some(slot.engine.name().to_owned());
        self.send_event(
            slot,
            InstanceEventKind::ProfileSaved {
                name,
                size_bytes,
                engine,
            },
        );
    }

    /// Waits for the browser to exit; an exit the agent did not ask for stops the instance.
    pub(super) async fn watch_exit(&self, slot: &Arc<InstanceSlot>, process: &BrowserProcess) {
        let exit = process.wait_exit().await;
        // The exit of a browser being parked or stopped is expected.
        if !matches!(slot.state(), State::Running { .. }) {
            return;
        }
        let oom = slot.oom_kills_total();
        let limit = if oom > 0 {
            format!(
                " after {oom} process(es) were killed for exceeding the memory limit (memory_gb = {})",
                slot.config.memory_gb
            )
        } else {
            String::new()
        };
        let reason = format!(
            "browser {exit}{limit}{}",
            crate::system::process::log_tail(&slot.dirs.log())
        );
        if let Some(effects) = slot.apply(Event::Exited { reason }).await {
            self.carry_out(slot, effects);
        }
    }

    /// Where the runner of an instance sends the reports of its changes:
    /// the queue to the control plane, in order.
    pub(super) fn reporter(&self) -> crate::instance::runner::Reporter {
        let agent = self.clone();
        Arc::new(move |id, effect| agent.report(id, effect))
    }

    fn report(&self, id: &InstanceId, effect: Effect) {
        let Effect::Report {
            status,
            reason,
            snapshot,
            operation,
            confirm,
        } = effect
        else {
            return;
        };
        let change = InstanceStateChange {
            node_id: self.inner.node_id.clone(),
            id: id.clone(),
            status,
            reason,
            at: self.inner.settings.clock.now(),
            snapshot_id: snapshot,
            operation,
        };
        self.send_change(change, confirm);
    }

    /// Carries out what a transition of `slot` asks besides its reports
    /// (its runner sent them): the release of an instance that ended.
    pub(super) fn carry_out(&self, slot: &Arc<InstanceSlot>, effects: Vec<Effect>) {
        for effect in effects {
            if effect == Effect::Release {
                self.release_ended(slot);
            }
        }
    }

    /// `slot` ended (failed launch, exit, a limit): free its ports and
    /// directory. The control plane keeps the record.
    fn release_ended(&self, slot: &Arc<InstanceSlot>) {
        let (status, reason) = slot.status();
        tracing::warn!(instance = %slot.id, %status, reason = reason.unwrap_or_default(), "instance ended");
        let removed = self
            .inner
            .slots
            .lock()
            .expect("slots lock")
            .remove(&slot.id);
        if removed.is_some() {
            self.release(slot);
            if slot.config.keep_recordings {
                // It will not run again: its recordings are kept now.
                let (agent, slot) = (self.clone(), slot.clone());
                self.inner
                    .tasks
                    .spawn(async move { agent.end_recordings(&slot, false).await });
            }
        }
    }

    pub(super) fn release(&self, slot: &InstanceSlot) {
        slot.servers.cancel();
        self.inner.ports.release(slot.ports);
        let root = slot.dirs.root.clone();
        tokio::task::spawn_blocking(move || remove_dir(&root));
    }

    /// Deletes an instance: hands the delete to the task that carries out
    /// its operations (after a park or revive under way) and returns once
    /// its processes are gone. A delete of an instance being deleted
    /// returns when that one is done.
    pub(super) async fn delete_now(&self, id: &InstanceId, force: bool) -> Result<(), AgentError> {
        let slot = match self.slot(id) {
            Ok(slot) => slot,
            Err(error) => {
                // Stopped by an earlier run of this agent: only its
                // recordings may be left.
                let recordings = self.recordings_dir(id);
                let _ = tokio::task::spawn_blocking(move || remove_dir(&recordings)).await;
                return Err(error);
            }
        };
        let (reply, done) = oneshot::channel();
        if self
            .submit(&slot, Request::Delete { force, reply })
            .await
            .is_ok()
        {
            let _ = done.await;
        }
        Ok(())
    }

    /// Stops an instance's browser (gracefully unless `force`) and frees
    /// everything it held, unless it is no longer this agent's (ended
    /// meanwhile, or taken by the agent's shutdown): then `false`. Returns
    /// once its processes are gone.
    pub(super) async fn delete(&self, slot: &Arc<InstanceSlot>, force: bool) -> bool {
        let id = &slot.id;
        if self
            .inner
            .slots
            .lock()
            .expect("slots lock")
            .remove(id)
            .is_none()
        {
            return false;
        }
        flotilla_api_types::faults::point("agent-delete-received").await;
        // A graceful delete writes a running browser's state back to its
        // persistent profile (a dormant one saved it when it was parked),
        // and closes the browser so that it writes its profile: a
        // Firefox's only WebDriver session is taken for both.
        let endpoint = slot.endpoint().filter(|_| !force);
        let firefox = super::dormancy::FirefoxHeld::taken(slot, endpoint.as_ref()).await;
        let write_back = match (force, slot.persisted_profile(), endpoint) {
            (false, Some(name), Some(endpoint)) => match self.engine().capture(&endpoint).await {
                Ok(state) => Some((name, state)),
                Err(error) => {
                    tracing::error!(instance = %id, profile = name, %error, "cannot read the browser's state; the profile keeps its previous state");
                    None
                }
            },
            _ => None,
        };
        self.stop_slot(slot, force).await;
        drop(firefox);
        if let Some((name, state)) = write_back {
            self.save_profile(slot, name, state).await;
        }
        slot.servers.cancel();
        self.inner.ports.release(slot.ports);
        let root = slot.dirs.root.clone();
        let _ = tokio::task::spawn_blocking(move || remove_dir(&root)).await;
        self.end_recordings(slot, true).await;
        true
    }

    /// Drops a dormant instance that now lives on another node: `Ok(false)`
    /// when it was no longer this agent's, 409 when it is not dormant here
    /// (a client woke it on this node meanwhile; the control plane then
    /// deletes that copy).
    pub(super) async fn forget(&self, slot: &Arc<InstanceSlot>) -> Result<bool, AgentError> {
        // In one step of its runner: a wake or a revive that comes after
        // finds it gone, one that came before keeps it here.
        if slot.apply(Event::Forget).await.is_none() {
            return Err(AgentError::NotDormant {
                instance: slot.id.clone(),
                status: slot.status().0,
            });
        }
        let removed = self
            .inner
            .slots
            .lock()
            .expect("slots lock")
            .remove(&slot.id)
            .is_some();
        if !removed {
            return Ok(false);
        }
        slot.servers.cancel();
        self.inner.ports.release(slot.ports);
        let root = slot.dirs.root.clone();
        let _ = tokio::task::spawn_blocking(move || remove_dir(&root)).await;
        // Its recordings here could no longer be reached (the control plane
        // asks the node it runs on): kept ones go to the store, the rest go.
        self.end_recordings(slot, true).await;
        tracing::info!(instance = %slot.id, "dormant instance forgotten: it runs on another node now");
        Ok(true)
    }

    /// At the end of an instance whose servers are stopped: waits for its
    /// last recording to be written, then moves its recordings to the kept
    /// ones (`config.keep_recordings`) and, when `deleted`, removes what is
    /// left. Recordings that could not be kept stay on this node.
    pub(super) async fn end_recordings(&self, slot: &InstanceSlot, deleted: bool) {
        slot.recorder_finished(RECORDER_GRACE).await;
        let recordings = self.recordings_dir(&slot.id);
        if slot.config.keep_recordings && !self.keep_recordings(&slot.id, &recordings).await {
            return;
        }
        if deleted || slot.config.keep_recordings {
            let _ = tokio::task::spawn_blocking(move || remove_dir(&recordings)).await;
        }
    }

    /// Moves the finished recordings in `dir` to the snapshot store
    /// (`config.keep_recordings`); `false` if any could not be kept (then
    /// the files stay on this node, and the error is logged with where).
    async fn keep_recordings(&self, id: &InstanceId, dir: &std::path::Path) -> bool {
        let listed = {
            let dir = dir.to_owned();
            tokio::task::spawn_blocking(move || crate::protocols::recording::list(&dir)).await
        };
        let recordings = match listed {
            Ok(Ok(recordings)) => recordings,
            other => {
                tracing::error!(instance = %id, dir = %dir.display(), ?other, "cannot list the recordings to keep; they stay on this node");
                return false;
            }
        };
        let store = &self.inner.settings.snapshots;
        let mut all_kept = true;
        for recording in recordings {
            let kept = KeptRecording {
                instance_id: id.clone(),
                kept_at: self.inner.settings.clock.now(),
                id: recording.id,
                content_type: recording.content_type,
                size_bytes: recording.size_bytes,
                duration_sec: recording.duration_sec,
                created_at: recording.created_at,
            };
            let video = dir.join(format!("{}.mp4", kept.id));
            match store.recording_keep(&kept, &video).await {
                Ok(()) => tracing::info!(instance = %id, recording = kept.id, "recording kept"),
                Err(error) => {
                    tracing::error!(instance = %id, recording = kept.id, file = %video.display(), store = store.location, %error, "cannot keep the recording in the snapshot store; it stays on this node");
                    all_kept = false;
                }
            }
        }
        all_kept
    }

    /// Writes a saved profile's cookies and localStorage into the
    /// instance's started browser.
    async fn restore_profile(
        &self,
        name: &str,
        endpoint: &CdpEndpoint,
        saved: &OpenedArchive,
        service_workers: bool,
    ) -> Result<(), StartFailure> {
        let options = snapshot::RestoreOptions {
            reopen_tabs: false,
            service_workers,
        };
        self.engine()
            .restore(endpoint, &saved.state, options)
            .await
            .map_err(|source| StartFailure::ProfileRestore {
                name: name.to_owned(),
                source,
            })
    }

    pub(super) async fn stop_slot(&self, slot: &Arc<InstanceSlot>, force: bool) {
        let endpoint = slot.endpoint();
        slot.apply(Event::Stop).await;
        if let Some(process) = slot.process() {
            process.stop(endpoint.as_ref(), !force, CDP_GRACE).await;
        }
        // The watcher ends once the browser is gone (or as soon as it sees
        // `stopping` if it had not spawned yet); then nothing can be left.
        slot.supervision_finished().await;
        if let Some(process) = slot.process() {
            process.stop(None, false, Duration::ZERO).await;
        }
    }
}
