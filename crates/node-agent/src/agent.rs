//! The node agent: owns the instances on one machine.
//!
//! [`Agent`] is a cheap-to-clone handle over shared state. It creates instances
//! (reserve ports, start the port servers, launch the browser — or take one from
//! the warm pool), parks them (snapshot, then free the browser, keeping the
//! ports so that a connecting client wakes them), revives them, deletes them,
//! reports to the control plane through a [`ControlPlaneLink`] (registration,
//! periodic heartbeats, state changes in order), and on shutdown stops every
//! browser gracefully.

use std::collections::{BTreeMap, HashMap};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use flotilla_api_types::agent::{
    AgentCreateInstance, AgentDormantResult, AgentIdentity, AgentInstancePorts,
    AgentReviveInstance, Heartbeat, InstanceEventKind, InstanceEventReport, InstanceReport,
    InstanceStateChange, NodeRegistration,
};
use flotilla_api_types::clock::Clock;
use flotilla_api_types::credentials::Secret;
use flotilla_api_types::extensions::is_extension_id;
use flotilla_api_types::ids::SnapshotId;
use flotilla_api_types::instances::{InstanceConfig, InstanceStatus, ReviveMethod};
use flotilla_api_types::{InstanceId, NodeId};

use crate::access::NodeAccess;
use crate::browser::{BrowserProcess, CdpEndpoint, InstanceDirs, LaunchError};
use crate::cgroups::Limits;
use crate::config::{AgentConfig, ImageConfig, RuntimeKind};
use crate::egress::Upstream;
use crate::extension;
use crate::gateway::{self, GatewayContext};
use crate::instance::{BrowserPhase, InstanceSlot};
use crate::launcher::Launcher;
use crate::link::{ControlPlaneLink, LinkError};
use crate::live_view::{self, LiveView, LiveViewSettings};
use crate::monitor::{self, MachineMeter, ProcTable};
use crate::ports::{InstancePorts, PortAllocator};
use crate::snapshot::{self, CapturedState, SnapshotStore};
use crate::{instance_http, sweep};
use flotilla_api_types::agent::RegistrationAck;

/// Errors of agent operations; the agent API maps them to HTTP.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("unknown image {image:?}; this node offers: {offered}")]
    UnknownImage { image: String, offered: String },
    #[error("node {node} is full: it holds its maximum of {max} instances (agent.max_instances)")]
    Full { node: NodeId, max: i64 },
    #[error("port range {range} is exhausted on node {node}; raise agent.port_range or add a node")]
    PortsExhausted { range: String, node: NodeId },
    #[error("instance {0} is not on this node")]
    NotFound(InstanceId),
    #[error("{0}")]
    InvalidConfig(String),
    #[error("{0}")]
    InvalidState(String),
    #[error("{0}")]
    Snapshot(String),
    /// The snapshot store failed (unreachable, timed out): nothing changed,
    /// retry when it is back.
    #[error("{0}")]
    SnapshotStore(String),
    #[error("the agent is shutting down")]
    ShuttingDown,
}

/// Everything the agent needs to start.
#[derive(Clone)]
pub struct AgentSettings {
    pub config: AgentConfig,
    /// The agent's directory; instance profiles live under `instances/`.
    pub data_dir: PathBuf,
    /// Address of the agent API, `<scheme>://<host>:<port>`.
    pub address: String,
    /// Host clients use to reach instance ports.
    pub public_host: String,
    /// Address instance ports listen on.
    pub bind_address: Ipv4Addr,
    /// Where dormant instances' snapshots go.
    pub snapshots: SnapshotStore,
    /// The clock of activity times (the control plane's, so idle decisions agree).
    pub clock: Arc<dyn Clock>,
}

#[derive(Clone)]
pub struct Agent {
    inner: Arc<AgentInner>,
}

struct AgentInner {
    node_id: NodeId,
    /// Random per process start (see `NodeRegistration::generation`).
    generation: String,
    settings: AgentSettings,
    catalog: BTreeMap<String, ImageConfig>,
    instances_root: PathBuf,
    ports: PortAllocator,
    /// Instances on this node. A std mutex: lookups and inserts only.
    slots: Mutex<HashMap<InstanceId, Arc<InstanceSlot>>>,
    link: Arc<dyn ControlPlaneLink>,
    /// State changes, sent to the control plane in order by one task.
    changes: mpsc::UnboundedSender<Outgoing>,
    /// Dormant instances a client connected to.
    wake: mpsc::UnboundedSender<InstanceId>,
    machine: Mutex<MachineMeter>,
    launcher: Arc<Launcher>,
    /// Who may use instance ports: the control plane's policy, applied at
    /// every registration and heartbeat answer.
    access: Arc<NodeAccess>,
    /// Every task the agent starts (the warm pool, reporting, supervision of
    /// each browser, each instance's servers, revives): shutdown closes it
    /// and waits until they have all ended.
    tasks: TaskTracker,
    shutdown: CancellationToken,
}

/// An item of the ordered queue to the control plane.
enum Outgoing {
    Change(InstanceStateChange),
    Event(InstanceEventReport),
    /// Answered once everything queued before it was handled: `true` when
    /// all of it was delivered (`false` once a change was given up on at
    /// shutdown).
    Flush(oneshot::Sender<bool>),
    /// A flush after which the sender ends (shutdown).
    Close(oneshot::Sender<bool>),
}

const CDP_GRACE: Duration = Duration::from_secs(5);

impl Agent {
    /// Sweeps what a previous run left behind, registers with the control plane
    /// and starts reporting.
    pub async fn start(
        settings: AgentSettings,
        link: Arc<dyn ControlPlaneLink>,
    ) -> anyhow::Result<Agent> {
        settings.config.validate().map_err(anyhow::Error::msg)?;
        let node_id = NodeId::new(settings.config.node_id.clone().unwrap_or_else(hostname));
        if settings.config.runtime == RuntimeKind::Chromium {
            crate::browser::become_subreaper();
        }
        let instances_root = settings.data_dir.join("instances");
        let swept = sweep::sweep(&instances_root);
        if swept.processes > 0 || swept.directories > 0 {
            tracing::warn!(
                processes = swept.processes,
                directories = swept.directories,
                "swept browsers and profiles left by a previous run"
            );
        }
        std::fs::create_dir_all(&instances_root)?;
        let launcher = Arc::new(Launcher::new(
            &settings.config,
            node_id.as_str(),
            instances_root.clone(),
            &settings.data_dir,
        ));
        let (changes_tx, changes_rx) = mpsc::unbounded_channel();
        let (wake_tx, wake_rx) = mpsc::unbounded_channel();
        let inner = Arc::new(AgentInner {
            launcher,
            access: Arc::new(NodeAccess::default()),
            tasks: TaskTracker::new(),
            node_id,
            generation: uuid::Uuid::new_v4().simple().to_string(),
            catalog: settings.config.image_catalog(),
            ports: PortAllocator::new(settings.config.port_range, settings.bind_address),
            machine: Mutex::new(MachineMeter::new(&settings.data_dir)),
            instances_root,
            settings,
            slots: Mutex::default(),
            link,
            changes: changes_tx,
            wake: wake_tx,
            shutdown: CancellationToken::new(),
        });
        let agent = Agent { inner };
        let tasks = &agent.inner.tasks;
        tasks.spawn(
            agent
                .inner
                .launcher
                .clone()
                .keep_pool_filled(agent.inner.shutdown.clone()),
        );
        let ack = agent.register_until_accepted().await?;
        tasks.spawn(agent.clone().send_changes(changes_rx));
        tasks.spawn(agent.clone().report_loop(ack));
        tasks.spawn(agent.clone().wake_loop(wake_rx));
        Ok(agent)
    }

    pub fn node_id(&self) -> &NodeId {
        &self.inner.node_id
    }

    /// Warm-pool browsers ready to be taken now.
    pub fn warm_pool_ready(&self) -> usize {
        self.inner.launcher.pool_ready()
    }

    /// Why this node runs with less isolation than configured.
    pub fn warnings(&self) -> &[String] {
        self.inner.launcher.warnings()
    }

    pub fn address(&self) -> &str {
        &self.inner.settings.address
    }

    /// Who this agent is: node id, process generation, address.
    pub fn identity(&self) -> AgentIdentity {
        AgentIdentity {
            node_id: self.inner.node_id.clone(),
            generation: self.inner.generation.clone(),
            address: self.inner.settings.address.clone(),
        }
    }

    pub fn snapshots(&self) -> &SnapshotStore {
        &self.inner.settings.snapshots
    }

    fn image(&self, name: &str) -> Result<ImageConfig, AgentError> {
        self.inner
            .catalog
            .get(name)
            .cloned()
            .ok_or_else(|| AgentError::UnknownImage {
                image: name.to_owned(),
                offered: self
                    .inner
                    .catalog
                    .keys()
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", "),
            })
    }

    fn slot(&self, id: &InstanceId) -> Result<Arc<InstanceSlot>, AgentError> {
        self.inner
            .slots
            .lock()
            .expect("slots lock")
            .get(id)
            .cloned()
            .ok_or_else(|| AgentError::NotFound(id.clone()))
    }

    fn binds_ports(&self) -> bool {
        self.inner.settings.config.runtime == RuntimeKind::Chromium
    }

    /// Registers a new slot with `ports` (under the slots lock held by the caller).
    fn new_slot(
        &self,
        id: InstanceId,
        image: String,
        config: InstanceConfig,
        ports: &InstancePorts,
        dirs: InstanceDirs,
        access_token: Option<&Secret>,
    ) -> Arc<InstanceSlot> {
        let waker = self
            .inner
            .settings
            .config
            .wake_on_connect
            .then(|| self.inner.wake.clone());
        let slot = Arc::new(InstanceSlot::new(
            id,
            image,
            config,
            [ports.debug, ports.stream, ports.http],
            dirs,
            self.inner.settings.clock.clone(),
            waker,
        ));
        slot.set_access_token(access_token);
        slot
    }

    /// Starts an instance: reserves its ports, starts its servers and launches
    /// the browser in the background. Idempotent for an id already here.
    /// Like every lifecycle call below, it runs to its end even when the
    /// caller stops waiting: a control plane that dies or a client that hangs
    /// up mid-call must not leave a browser half-stopped or a park half-done.
    pub async fn instance_create(
        &self,
        request: AgentCreateInstance,
    ) -> Result<AgentInstancePorts, AgentError> {
        let agent = self.clone();
        flotilla_api_types::tasks::to_completion(async move { agent.create_now(request).await })
            .await
    }

    pub async fn instance_delete(&self, id: &InstanceId, force: bool) -> Result<(), AgentError> {
        let (agent, id) = (self.clone(), id.clone());
        flotilla_api_types::tasks::to_completion(async move { agent.delete_now(&id, force).await })
            .await
    }

    pub async fn instance_dormant(
        &self,
        id: &InstanceId,
    ) -> Result<AgentDormantResult, AgentError> {
        let (agent, id) = (self.clone(), id.clone());
        flotilla_api_types::tasks::to_completion(async move { agent.park_now(&id).await }).await
    }

    pub async fn instance_revive(
        &self,
        request: AgentReviveInstance,
    ) -> Result<AgentInstancePorts, AgentError> {
        let agent = self.clone();
        flotilla_api_types::tasks::to_completion(async move { agent.revive_now(request).await })
            .await
    }

    async fn create_now(
        &self,
        request: AgentCreateInstance,
    ) -> Result<AgentInstancePorts, AgentError> {
        let inner = &self.inner;
        if inner.shutdown.is_cancelled() {
            return Err(AgentError::ShuttingDown);
        }
        let image = self.image(&request.image)?;
        check_extensions(&request.image, &image, &request.config)?;
        let limits = inner.launcher.limits_for(&request.config);
        let upstream = upstream_of(&request.config)?;
        let (slot, listeners, warm) = {
            let mut slots = inner.slots.lock().expect("slots lock");
            if let Some(existing) = slots.get(&request.id) {
                return Ok(ports_of(existing));
            }
            self.check_room(&slots)?;
            let ports = inner
                .ports
                .reserve(self.binds_ports())
                .ok_or_else(|| self.ports_exhausted())?;
            // A pooled browser already runs on an empty profile, without extensions.
            let warm = if request.profile.is_none() && request.config.extensions.is_empty() {
                inner.launcher.take_warm(&request.image, limits, upstream)
            } else {
                None
            };
            let dirs = match &warm {
                Some(warm) => warm.dirs.clone(),
                None => InstanceDirs::new(inner.instances_root.join(request.id.as_str())),
            };
            let slot = self.new_slot(
                request.id.clone(),
                request.image.clone(),
                request.config.clone(),
                &ports,
                dirs,
                request.access_token.as_ref(),
            );
            slot.set_profile(request.profile.clone());
            if let Some(warm) = &warm {
                slot.set_process(warm.launched.clone());
                slot.set_phase(BrowserPhase::Ready(Some(warm.endpoint.clone())));
                slot.set_status(InstanceStatus::Running, None);
            }
            slots.insert(request.id.clone(), slot.clone());
            (slot, ports.listeners, warm)
        };
        if let Some([debug, stream, http]) = listeners {
            self.start_servers(&slot, debug, stream, http);
        }
        match warm {
            Some(warm) => {
                tracing::info!(instance = %slot.id, "took a warm browser");
                let guard = slot.begin_supervision();
                let agent = self.clone();
                let process = warm.launched.process;
                let watched = slot.clone();
                self.inner.tasks.spawn(async move {
                    let _guard = guard;
                    watched.touch();
                    agent.watch_exit(&watched, &process).await;
                });
            }
            None => {
                let guard = slot.begin_supervision();
                self.inner
                    .tasks
                    .spawn(self.clone().supervise(slot.clone(), image, limits, guard));
            }
        }
        Ok(ports_of(&slot))
    }

    fn check_room(&self, slots: &HashMap<InstanceId, Arc<InstanceSlot>>) -> Result<(), AgentError> {
        let max = self.inner.settings.config.max_instances;
        if slots.len() as i64 >= max {
            return Err(AgentError::Full {
                node: self.inner.node_id.clone(),
                max,
            });
        }
        Ok(())
    }

    fn ports_exhausted(&self) -> AgentError {
        AgentError::PortsExhausted {
            range: self.inner.settings.config.port_range.to_string(),
            node: self.inner.node_id.clone(),
        }
    }

    fn start_servers(
        &self,
        slot: &Arc<InstanceSlot>,
        debug: std::net::TcpListener,
        stream: std::net::TcpListener,
        http: std::net::TcpListener,
    ) {
        let to_tokio = tokio::net::TcpListener::from_std;
        // Long enough for a launch, or a wake of a dormant instance.
        let ready_timeout = Duration::from_secs(self.inner.settings.config.launch_timeout_sec + 30);
        match (to_tokio(debug), to_tokio(stream), to_tokio(http)) {
            (Ok(debug), Ok(stream), Ok(http)) => {
                let access = self.inner.access.clone();
                let context = Arc::new(GatewayContext {
                    slot: slot.clone(),
                    public_host: self.inner.settings.public_host.clone(),
                    ready_timeout,
                    access: access.clone(),
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
                self.inner.tasks.spawn(live_view::serve(
                    stream,
                    LiveView::new(slot.clone(), settings, ready_timeout),
                    access.clone(),
                ));
                self.inner.tasks.spawn(instance_http::serve_api(
                    http,
                    slot.clone(),
                    ready_timeout,
                    access,
                ));
            }
            _ => {
                tracing::error!(instance = %slot.id, "cannot register instance listeners with the runtime")
            }
        }
    }

    /// Launches the browser of `slot` and waits until it answers CDP.
    async fn launch_ready(
        &self,
        slot: &Arc<InstanceSlot>,
        image: &ImageConfig,
        limits: Limits,
    ) -> Result<(Arc<BrowserProcess>, Option<CdpEndpoint>), String> {
        self.unpack_extensions(slot).await?;
        let launched = self
            .inner
            .launcher
            .spawn(
                &slot.name(),
                &slot.dirs,
                image,
                limits,
                upstream_of(&slot.config).map_err(|e| e.to_string())?,
                &slot.config.extensions,
            )
            .await
            .map_err(|e| e.to_string())?;
        let process = launched.process.clone();
        slot.set_process(launched);
        if slot.is_stopping() {
            process.stop(None, false, Duration::ZERO).await;
            return Err("stopped while starting".into());
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
                Err(match &error {
                    LaunchError::Timeout(_) => {
                        format!("{error}{}", crate::browser::log_tail(&slot.dirs.log()))
                    }
                    _ => error.to_string(),
                })
            }
        }
    }

    /// Launches a new instance's browser, then watches it until it exits.
    async fn supervise(
        self,
        slot: Arc<InstanceSlot>,
        image: ImageConfig,
        limits: Limits,
        _guard: tokio_util::sync::DropGuard,
    ) {
        let started = Instant::now();
        let launched = async {
            let saved = self.unpack_profile(&slot).await?;
            let (process, endpoint) = self.launch_ready(&slot, &image, limits).await?;
            if let (Some((name, state)), Some(endpoint)) = (&saved, &endpoint) {
                snapshot::restore(endpoint, state, false)
                    .await
                    .map_err(|e| format!("cannot restore profile {name}: {e}"))?;
            }
            Ok::<_, String>((process, endpoint))
        }
        .await;
        match launched {
            Ok((process, endpoint)) => {
                if slot.is_stopping() {
                    return;
                }
                tracing::info!(instance = %slot.id, elapsed_ms = started.elapsed().as_millis() as u64, "browser ready");
                slot.touch();
                slot.set_phase(BrowserPhase::Ready(endpoint));
                slot.set_status(InstanceStatus::Running, None);
                self.send_change(&slot, InstanceStatus::Running, None);
                self.watch_exit(&slot, &process).await;
            }
            Err(reason) => {
                if !slot.is_stopping() {
                    self.instance_ended(&slot, InstanceStatus::Failed, reason);
                }
            }
        }
    }

    /// Unpacks the instance's extensions from the snapshot store into its
    /// directory, once: an unpacked folder is complete (renamed into place)
    /// and extensions never change after their upload.
    async fn unpack_extensions(&self, slot: &Arc<InstanceSlot>) -> Result<(), String> {
        for id in &slot.config.extensions {
            if !is_extension_id(id) {
                return Err(format!("{id:?} is not an extension id"));
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
                .map_err(|e| format!("cannot read extension {id}: {e}"))?
                .ok_or_else(|| format!("extension {id} is not in the snapshot store"))?;
            let partial = slot.dirs.extensions().join(format!(".{id}.partial"));
            tokio::task::spawn_blocking(move || {
                remove_dir(&partial);
                std::fs::create_dir_all(partial.parent().unwrap_or(&partial))
                    .map_err(|e| e.to_string())?;
                let unpacked = extension::unpack(&zip, &partial)
                    .and_then(|()| std::fs::rename(&partial, &folder).map_err(|e| e.to_string()));
                if unpacked.is_err() {
                    remove_dir(&partial);
                }
                unpacked
            })
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| format!("cannot unpack extension {id}: {e}"))?;
        }
        Ok(())
    }

    /// Unpacks the saved state of the instance's profile into its profile
    /// directory, before its first launch; `None` without a profile or before
    /// the profile's first save (the browser starts empty).
    async fn unpack_profile(
        &self,
        slot: &Arc<InstanceSlot>,
    ) -> Result<Option<(String, CapturedState)>, String> {
        let Some(name) = slot.profile_name() else {
            return Ok(None);
        };
        let archive = self
            .inner
            .settings
            .snapshots
            .profile_get(&name)
            .await
            .map_err(|e| format!("cannot read profile {name}: {e}"))?;
        let Some(archive) = archive else {
            return Ok(None);
        };
        let (root, profile, downloads) = (
            slot.dirs.root.clone(),
            slot.dirs.profile(),
            slot.dirs.downloads(),
        );
        let state = tokio::task::spawn_blocking(move || {
            remove_dir(&profile);
            std::fs::create_dir_all(&root)?;
            snapshot::extract(&archive, &profile, &downloads)
        })
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("cannot unpack profile {name}: {e}"))?;
        tracing::info!(instance = %slot.id, profile = name, "profile unpacked");
        Ok(Some((name, state)))
    }

    /// Writes the closed browser's profile directory and `state` back to the
    /// instance's persistent profile, and reports the save. Failures are
    /// logged: the delete or park that asked goes on.
    async fn save_profile(&self, slot: &Arc<InstanceSlot>, name: String, state: CapturedState) {
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
        let _ = self
            .inner
            .changes
            .send(Outgoing::Event(InstanceEventReport {
                node_id: self.inner.node_id.clone(),
                id: slot.id.clone(),
                event: InstanceEventKind::ProfileSaved { name, size_bytes },
                at: self.inner.settings.clock.now(),
            }));
    }

    /// Waits for the browser to exit; an exit the agent did not ask for stops the instance.
    async fn watch_exit(&self, slot: &Arc<InstanceSlot>, process: &BrowserProcess) {
        let exit = process.wait_exit().await;
        if slot.is_stopping() || slot.is_parking() {
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
            crate::browser::log_tail(&slot.dirs.log())
        );
        self.instance_ended(slot, InstanceStatus::Stopped, reason);
    }

    /// The browser of `slot` is gone on its own (failed launch or exit): report,
    /// then free its ports and directory. The control plane keeps the record.
    fn instance_ended(&self, slot: &Arc<InstanceSlot>, status: InstanceStatus, reason: String) {
        tracing::warn!(instance = %slot.id, %status, %reason, "instance ended");
        slot.set_phase(BrowserPhase::Gone(reason.clone()));
        slot.set_status(status, Some(reason.clone()));
        self.send_change(slot, status, Some(reason));
        let removed = self
            .inner
            .slots
            .lock()
            .expect("slots lock")
            .remove(&slot.id);
        if removed.is_some() {
            self.release(slot);
        }
    }

    fn release(&self, slot: &InstanceSlot) {
        slot.servers.cancel();
        self.inner.ports.release(slot.ports);
        let root = slot.dirs.root.clone();
        tokio::task::spawn_blocking(move || remove_dir(&root));
    }

    /// Stops an instance's browser (gracefully unless `force`) and frees
    /// everything it held. Returns once its processes are gone.
    async fn delete_now(&self, id: &InstanceId, force: bool) -> Result<(), AgentError> {
        let slot = self.slot(id)?;
        let _operation = slot.operation.lock().await;
        if self
            .inner
            .slots
            .lock()
            .expect("slots lock")
            .remove(id)
            .is_none()
        {
            return Ok(());
        }
        // A graceful delete writes a running browser's state back to its
        // persistent profile (a dormant one saved it when it was parked).
        let write_back = match (force, slot.persisted_profile(), slot.endpoint()) {
            (false, Some(name), Some(endpoint)) if slot.status().0 == InstanceStatus::Running => {
                match snapshot::capture(&endpoint).await {
                    Ok(state) => Some((name, state)),
                    Err(error) => {
                        tracing::error!(instance = %id, profile = name, %error, "cannot read the browser's state; the profile keeps its previous state");
                        None
                    }
                }
            }
            _ => None,
        };
        self.stop_slot(&slot, force).await;
        if let Some((name, state)) = write_back {
            self.save_profile(&slot, name, state).await;
        }
        slot.servers.cancel();
        self.inner.ports.release(slot.ports);
        let root = slot.dirs.root.clone();
        let _ = tokio::task::spawn_blocking(move || remove_dir(&root)).await;
        Ok(())
    }

    async fn stop_slot(&self, slot: &Arc<InstanceSlot>, force: bool) {
        let endpoint = slot.endpoint();
        slot.mark_stopping();
        slot.set_phase(BrowserPhase::Gone("instance is being stopped".into()));
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

    /// Parks a running instance: captures its CDP state, closes the browser
    /// (flushing cookies to disk), stores profile and state as one archive, and
    /// frees the browser's memory and profile. Ports and servers stay: a client
    /// that connects wakes it. Only once the archive is stored does the instance
    /// count as dormant; if storing fails, the browser is started again on its
    /// profile and the instance keeps running.
    async fn park_now(&self, id: &InstanceId) -> Result<AgentDormantResult, AgentError> {
        let slot = self.slot(id)?;
        let _operation = slot.operation.lock().await;
        let (status, _) = slot.status();
        if status != InstanceStatus::Running {
            return Err(AgentError::InvalidState(format!(
                "instance {id} is {status} on its node; only a running instance can be made dormant"
            )));
        }
        let started = Instant::now();
        let endpoint = slot.endpoint();
        let state = match &endpoint {
            Some(endpoint) => snapshot::capture(endpoint).await.map_err(|e| {
                AgentError::Snapshot(format!("cannot read the browser's state over CDP: {e}"))
            })?,
            None => CapturedState::default(),
        };
        slot.set_parking(true);
        slot.set_phase(BrowserPhase::Starting);
        if let Some(process) = slot.process() {
            process.stop(endpoint.as_ref(), true, CDP_GRACE).await;
        }
        slot.supervision_finished().await;

        let profile = slot.dirs.profile();
        let downloads = slot.dirs.downloads();
        std::fs::create_dir_all(&profile)
            .map_err(|e| AgentError::Snapshot(format!("profile directory: {e}")))?;
        let packed_state = state.clone();
        let packed = tokio::task::spawn_blocking(move || {
            snapshot::archive(&profile, Some(&downloads), &packed_state)
        })
        .await
        .map_err(|e| AgentError::Snapshot(e.to_string()))
        .and_then(|r| {
            r.map_err(|e| AgentError::Snapshot(format!("cannot archive the profile: {e}")))
        });
        let snapshot_id = SnapshotId::generate();
        let stored = match packed {
            Ok(archive) => {
                let size = archive.len() as u64;
                self.inner
                    .settings
                    .snapshots
                    .put(id, &snapshot_id, archive)
                    .await
                    .map(|()| size)
                    .map_err(|e| {
                        AgentError::SnapshotStore(format!(
                            "the snapshot store {} cannot take the snapshot: {e}",
                            self.inner.settings.snapshots.location
                        ))
                    })
            }
            Err(error) => Err(error),
        };
        let snapshot_bytes = match stored {
            Ok(size) => size,
            Err(error) => {
                tracing::error!(instance = %id, %error, "parking failed; starting the browser again");
                self.resume_in_place(&slot, &state).await;
                let detail = format!("{error}; the instance keeps running");
                return Err(match error {
                    AgentError::SnapshotStore(_) => {
                        AgentError::SnapshotStore(format!("{detail}: park it again later"))
                    }
                    _ => AgentError::Snapshot(detail),
                });
            }
        };
        if let Some(name) = slot.persisted_profile() {
            self.save_profile(&slot, name, state).await;
        }
        let profile = slot.dirs.profile();
        let _ = tokio::task::spawn_blocking(move || remove_dir(&profile)).await;
        slot.set_snapshot(Some(snapshot_id.clone()));
        slot.set_status(InstanceStatus::Dormant, None);
        slot.set_phase(BrowserPhase::Dormant);
        slot.set_parking(false);
        // Also as a state change: a control plane that dies before it reads
        // this answer learns of the park when it comes back.
        self.send_change(&slot, InstanceStatus::Dormant, None);
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

    /// After a failed park: the browser is closed but its profile is still here;
    /// start it again and put the session cookies and the tabs back.
    async fn resume_in_place(&self, slot: &Arc<InstanceSlot>, state: &CapturedState) {
        slot.set_parking(false);
        let outcome = async {
            let image = self.image(&slot.image).map_err(|e| e.to_string())?;
            let limits = self.inner.launcher.limits_for(&slot.config);
            let guard = slot.begin_supervision();
            let (process, endpoint) = self.launch_ready(slot, &image, limits).await?;
            if let Some(endpoint) = &endpoint {
                // Its tabs come back too (and any storage the close lost).
                snapshot::restore(endpoint, state, true)
                    .await
                    .map_err(|e| e.to_string())?;
            }
            Ok::<_, String>((process, endpoint, guard))
        }
        .await;
        match outcome {
            Ok((process, endpoint, guard)) => {
                slot.set_phase(BrowserPhase::Ready(endpoint));
                let agent = self.clone();
                let watched = slot.clone();
                self.inner.tasks.spawn(async move {
                    let _guard = guard;
                    agent.watch_exit(&watched, &process).await;
                });
            }
            Err(reason) => self.instance_ended(
                slot,
                InstanceStatus::Failed,
                format!("restart after a failed park: {reason}"),
            ),
        }
    }

    /// Revives a dormant instance from `request.snapshot_id`: answers at once
    /// (`reviving`) and reports `running` or `failed` when done. If this agent no
    /// longer holds the instance (it restarted), it takes it back, on its old
    /// ports when they are free.
    async fn revive_now(
        &self,
        request: AgentReviveInstance,
    ) -> Result<AgentInstancePorts, AgentError> {
        if self.inner.shutdown.is_cancelled() {
            return Err(AgentError::ShuttingDown);
        }
        let image = self.image(&request.image)?;
        check_extensions(&request.image, &image, &request.config)?;
        let (slot, listeners) = {
            let mut slots = self.inner.slots.lock().expect("slots lock");
            match slots.get(&request.id) {
                Some(slot) => {
                    slot.set_access_token(request.access_token.as_ref());
                    slot.set_profile(request.profile.clone());
                    (slot.clone(), None)
                }
                None => {
                    self.check_room(&slots)?;
                    let binds = self.binds_ports();
                    let ports = request
                        .ports
                        .and_then(|wanted| self.inner.ports.reserve_exact(wanted, binds))
                        .or_else(|| self.inner.ports.reserve(binds))
                        .ok_or_else(|| self.ports_exhausted())?;
                    let dirs =
                        InstanceDirs::new(self.inner.instances_root.join(request.id.as_str()));
                    let slot = self.new_slot(
                        request.id.clone(),
                        request.image.clone(),
                        request.config.clone(),
                        &ports,
                        dirs,
                        request.access_token.as_ref(),
                    );
                    slot.set_profile(request.profile.clone());
                    slot.set_status(InstanceStatus::Dormant, None);
                    slot.set_phase(BrowserPhase::Dormant);
                    slot.set_snapshot(Some(request.snapshot_id.clone()));
                    slots.insert(request.id.clone(), slot.clone());
                    (slot, ports.listeners)
                }
            }
        };
        if let Some([debug, stream, http]) = listeners {
            self.start_servers(&slot, debug, stream, http);
        }
        // A store that cannot be read is refused now, the instance still parked.
        if let Err(error) = self
            .inner
            .settings
            .snapshots
            .check(&request.id, &request.snapshot_id)
            .await
        {
            return Err(AgentError::SnapshotStore(format!(
                "the snapshot store {} cannot be read: {error}; the instance stays dormant: revive it again later",
                self.inner.settings.snapshots.location
            )));
        }
        self.begin_revive(&slot, request.method, request.snapshot_id, image)?;
        Ok(ports_of(&slot))
    }

    /// Moves `slot` from dormant to reviving and starts the revive task.
    fn begin_revive(
        &self,
        slot: &Arc<InstanceSlot>,
        method: ReviveMethod,
        snapshot: SnapshotId,
        image: ImageConfig,
    ) -> Result<(), AgentError> {
        {
            let (status, _) = slot.status();
            if status != InstanceStatus::Dormant {
                return Err(AgentError::InvalidState(format!(
                    "instance {} is {status} on its node; only a dormant instance can be revived",
                    slot.id
                )));
            }
            slot.set_status(InstanceStatus::Reviving, None);
        }
        slot.set_phase(BrowserPhase::Starting);
        self.inner
            .tasks
            .spawn(self.clone().revive(slot.clone(), method, snapshot, image));
        Ok(())
    }

    async fn revive(
        self,
        slot: Arc<InstanceSlot>,
        method: ReviveMethod,
        snapshot: SnapshotId,
        image: ImageConfig,
    ) {
        let operation = slot.operation.lock().await;
        if slot.is_stopping() {
            return;
        }
        let guard = slot.begin_supervision();
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
                slot.set_status(InstanceStatus::Dormant, Some(reason.clone()));
                slot.set_phase(BrowserPhase::Dormant);
                self.send_change(&slot, InstanceStatus::Dormant, Some(reason));
                return;
            }
            Err(error) => Err(format!("cannot read snapshot {snapshot}: {error}")),
        };
        let outcome = async {
            let archive = archive?;
            let (root, profile, downloads) = (
                slot.dirs.root.clone(),
                slot.dirs.profile(),
                slot.dirs.downloads(),
            );
            let state = tokio::task::spawn_blocking(move || {
                remove_dir(&profile);
                std::fs::create_dir_all(&root)?;
                snapshot::extract(&archive, &profile, &downloads)
            })
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| format!("cannot unpack snapshot {snapshot}: {e}"))?;
            // What the snapshot brought back was announced when it finished.
            let _ = slot.newly_completed_downloads();
            let limits = self.inner.launcher.limits_for(&slot.config);
            let (process, endpoint) = self.launch_ready(&slot, &image, limits).await?;
            if let Some(endpoint) = &endpoint {
                snapshot::restore(endpoint, &state, method == ReviveMethod::FullRestore)
                    .await
                    .map_err(|e| format!("cannot restore the browser's state: {e}"))?;
            }
            Ok::<_, String>((process, endpoint))
        }
        .await;
        match outcome {
            Ok((process, endpoint)) => {
                if slot.is_stopping() {
                    return;
                }
                tracing::info!(instance = %slot.id, method = method.as_str(), elapsed_ms = started.elapsed().as_millis() as u64, "instance revived");
                slot.set_snapshot(None);
                slot.touch();
                slot.set_phase(BrowserPhase::Ready(endpoint));
                slot.set_status(InstanceStatus::Running, None);
                self.send_change(&slot, InstanceStatus::Running, None);
                // The archive is spent (the instance's next park makes a new
                // one), but only once the control plane has recorded the
                // revive: until then a crash falls back on it.
                let (delivered_tx, delivered) = oneshot::channel();
                let _ = self.inner.changes.send(Outgoing::Flush(delivered_tx));
                let snapshots = self.inner.settings.snapshots.clone();
                let id = slot.id.clone();
                self.inner.tasks.spawn(async move {
                    if delivered.await != Ok(true) {
                        return;
                    }
                    if let Err(error) = snapshots.delete(&id, &snapshot).await {
                        tracing::warn!(instance = %id, %error, "cannot delete a spent snapshot");
                    }
                });
                drop(operation);
                let _guard = guard;
                self.watch_exit(&slot, &process).await;
            }
            Err(reason) => {
                if let Some(process) = slot.process() {
                    process.stop(None, false, Duration::ZERO).await;
                }
                if !slot.is_stopping() {
                    // The snapshot stays in the store: the instance can be revived again.
                    self.instance_ended(
                        &slot,
                        InstanceStatus::Failed,
                        format!("revive failed: {reason}"),
                    );
                }
            }
        }
    }

    /// Revives dormant instances that a client connected to (quick start).
    async fn wake_loop(self, mut wake: mpsc::UnboundedReceiver<InstanceId>) {
        loop {
            let id = tokio::select! {
                id = wake.recv() => match id { Some(id) => id, None => return },
                _ = self.inner.shutdown.cancelled() => return,
            };
            let Ok(slot) = self.slot(&id) else { continue };
            let (Some(snapshot), Ok(image)) = (slot.snapshot(), self.image(&slot.image)) else {
                continue;
            };
            if self
                .begin_revive(&slot, ReviveMethod::QuickStart, snapshot, image)
                .is_ok()
            {
                tracing::info!(instance = %id, "a client connected to a dormant instance: waking it");
                self.send_change(
                    &slot,
                    InstanceStatus::Reviving,
                    Some("woken by a connecting client".into()),
                );
            }
        }
    }

    /// What the agent knows of its instances.
    pub fn instance_reports(&self) -> Vec<InstanceReport> {
        let slots: Vec<_> = self
            .inner
            .slots
            .lock()
            .expect("slots lock")
            .values()
            .cloned()
            .collect();
        slots.iter().map(|slot| slot.report()).collect()
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
        }
    }

    async fn register_until_accepted(&self) -> anyhow::Result<RegistrationAck> {
        let mut wait = Duration::from_millis(200);
        loop {
            let mut registration = self.registration();
            let (resources, load) = self
                .inner
                .machine
                .lock()
                .expect("machine lock")
                .sample_with_load();
            registration.resources = resources;
            registration.load = load;
            match self.inner.link.register(registration).await {
                Ok(ack) => {
                    self.apply(&ack);
                    return Ok(ack);
                }
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
    fn apply(&self, ack: &RegistrationAck) {
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
    async fn report_loop(self, mut ack: RegistrationAck) {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(ack.heartbeat_interval()) => {}
                _ = self.inner.shutdown.cancelled() => return,
            }
            let heartbeat = self.sample();
            match self.inner.link.heartbeat(heartbeat).await {
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
        let slots: Vec<_> = self
            .inner
            .slots
            .lock()
            .expect("slots lock")
            .values()
            .cloned()
            .collect();
        if self.binds_ports() && !slots.is_empty() {
            let table = ProcTable::scan();
            let now = Instant::now();
            for slot in &slots {
                if slot.status().0 == InstanceStatus::Dormant {
                    slot.set_resources(Default::default());
                    continue;
                }
                let root = slot.process().and_then(|p| p.pid());
                let resources = {
                    let mut meter = slot.cpu_meter.lock().expect("meter lock");
                    let (profile, downloads) = (slot.dirs.profile(), slot.dirs.downloads());
                    monitor::instance_resources(
                        &table,
                        &mut meter,
                        root,
                        &[profile.as_path(), downloads.as_path()],
                        now,
                    )
                };
                slot.set_resources(resources);
                self.check_limits(slot, resources.disk_mb);
                self.announce_downloads(slot);
            }
        }
        let (resources, load) = self
            .inner
            .machine
            .lock()
            .expect("machine lock")
            .sample_with_load();
        Heartbeat {
            node_id: self.inner.node_id.clone(),
            generation: self.inner.generation.clone(),
            resources,
            load,
            instances: slots.iter().map(|slot| slot.report()).collect(),
        }
    }

    /// Announces downloads of `slot` that finished since the last sample.
    fn announce_downloads(&self, slot: &InstanceSlot) {
        let finished = slot.newly_completed_downloads();
        for download in finished {
            tracing::info!(instance = %slot.id, name = download.name, size = download.size_bytes, "download completed");
            let _ = self
                .inner
                .changes
                .send(Outgoing::Event(InstanceEventReport {
                    node_id: self.inner.node_id.clone(),
                    id: slot.id.clone(),
                    event: InstanceEventKind::DownloadCompleted {
                        name: download.name,
                        size_bytes: download.size_bytes,
                    },
                    at: self.inner.settings.clock.now(),
                }));
        }
    }

    /// Reports processes killed by the memory limit, and fails an instance whose
    /// profile outgrew `disk_gb`.
    fn check_limits(&self, slot: &Arc<InstanceSlot>, disk_mb: f64) {
        if slot.is_stopping() || slot.status().0 != InstanceStatus::Running {
            return;
        }
        if let Some(new_kills) = slot.new_oom_kills() {
            let reason = format!(
                "the memory limit (memory_gb = {}) was hit: the kernel killed {new_kills} browser process(es); a tab may have crashed",
                slot.config.memory_gb
            );
            tracing::warn!(instance = %slot.id, %reason);
            slot.set_status(InstanceStatus::Running, Some(reason.clone()));
            self.send_change(slot, InstanceStatus::Running, Some(reason));
        }
        let limit_mb = slot.config.disk_gb * 1024.0;
        if disk_mb > limit_mb {
            let reason = format!(
                "the profile grew to {disk_mb:.1} MB, over the disk limit of {limit_mb:.0} MB (disk_gb = {})",
                slot.config.disk_gb
            );
            self.inner
                .tasks
                .spawn(self.clone().fail_instance(slot.clone(), reason));
        }
    }

    /// Stops an instance on the agent's own initiative (e.g. its profile
    /// outgrew `disk_gb`) and reports it `failed` with `reason`.
    async fn fail_instance(self, slot: Arc<InstanceSlot>, reason: String) {
        if !slot.mark_stopping() {
            return;
        }
        if let Some(process) = slot.process() {
            process.stop(None, false, Duration::ZERO).await;
        }
        self.instance_ended(&slot, InstanceStatus::Failed, reason);
    }

    fn send_change(&self, slot: &InstanceSlot, status: InstanceStatus, reason: Option<String>) {
        let change = InstanceStateChange {
            node_id: self.inner.node_id.clone(),
            id: slot.id.clone(),
            status,
            reason,
            at: self.inner.settings.clock.now(),
            snapshot_id: slot
                .snapshot()
                .filter(|_| status == InstanceStatus::Dormant),
        };
        let _ = self.inner.changes.send(Outgoing::Change(change));
    }

    /// Delivers state changes one at a time, in order, retrying until accepted
    /// (or, after shutdown, giving up on one that fails).
    async fn send_changes(self, mut queue: mpsc::UnboundedReceiver<Outgoing>) {
        let mut all_delivered = true;
        while let Some(item) = queue.recv().await {
            match item {
                Outgoing::Flush(done) => {
                    let _ = done.send(all_delivered);
                    continue;
                }
                Outgoing::Close(done) => {
                    let _ = done.send(all_delivered);
                    return;
                }
                Outgoing::Change(_) | Outgoing::Event(_) => {}
            }
            let mut wait = Duration::from_millis(100);
            loop {
                let (sent, instance) = match &item {
                    Outgoing::Change(change) => (
                        self.inner.link.state_changed(change.clone()).await,
                        &change.id,
                    ),
                    Outgoing::Event(event) => (
                        self.inner.link.instance_event(event.clone()).await,
                        &event.id,
                    ),
                    Outgoing::Flush(_) | Outgoing::Close(_) => unreachable!("answered above"),
                };
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

    /// Kills every browser at once and removes its directory, without reporting.
    /// For `Drop` paths (a test that panicked); [`Agent::shutdown`] is the graceful way.
    pub fn kill_all(&self) {
        self.inner.shutdown.cancel();
        self.inner.launcher.kill_pool();
        let slots: Vec<_> = self
            .inner
            .slots
            .lock()
            .expect("slots lock")
            .drain()
            .map(|(_, s)| s)
            .collect();
        for slot in slots {
            slot.mark_stopping();
            slot.servers.cancel();
            if let Some(pid) = slot.process().and_then(|p| p.pid()) {
                crate::browser::kill_group(pid, libc::SIGKILL);
            }
            remove_dir(&slot.dirs.root);
        }
    }

    /// Stops every browser gracefully, reports them `stopped` (waiting up to 10 s
    /// for the reports to be delivered), and stops reporting. Dormant instances
    /// stay dormant: their snapshots are in the store.
    pub async fn shutdown(&self) {
        if self.inner.shutdown.is_cancelled() {
            return;
        }
        // From here on creates are refused and the report loop ends.
        self.inner.shutdown.cancel();
        let slots: Vec<_> = self
            .inner
            .slots
            .lock()
            .expect("slots lock")
            .drain()
            .map(|(_, s)| s)
            .collect();
        let stops = slots.iter().map(|slot| async move {
            let _operation = slot.operation.lock().await;
            let dormant = slot.status().0 == InstanceStatus::Dormant;
            self.stop_slot(slot, false).await;
            if !dormant {
                let reason = "node agent shut down".to_owned();
                slot.set_status(InstanceStatus::Stopped, Some(reason.clone()));
                self.send_change(slot, InstanceStatus::Stopped, Some(reason));
            }
            self.release(slot);
        });
        futures_util::future::join_all(stops).await;
        let (done_tx, done_rx) = oneshot::channel();
        if self.inner.changes.send(Outgoing::Close(done_tx)).is_ok()
            && tokio::time::timeout(Duration::from_secs(10), done_rx)
                .await
                .is_err()
        {
            tracing::warn!("state changes not all delivered within 10 s of shutdown");
        }
        let tasks = &self.inner.tasks;
        tasks.close();
        if tokio::time::timeout(Duration::from_secs(10), tasks.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                running = tasks.len(),
                "agent tasks still running 10 s after shutdown"
            );
        }
        self.inner.launcher.release_cgroups();
    }
}

/// Refuses `config.extensions` on an image without an extension system.
fn check_extensions(
    name: &str,
    image: &ImageConfig,
    config: &InstanceConfig,
) -> Result<(), AgentError> {
    if config.extensions.is_empty() || image.loads_extensions() {
        return Ok(());
    }
    Err(AgentError::InvalidConfig(format!(
        "config.extensions: image {name:?} is a headless shell, which cannot load extensions; use the \"chromium\" image"
    )))
}

/// The instance's upstream proxy as the egress proxy uses it.
fn upstream_of(config: &InstanceConfig) -> Result<Option<Upstream>, AgentError> {
    config
        .proxy
        .as_ref()
        .map(Upstream::from_config)
        .transpose()
        .map_err(AgentError::InvalidConfig)
}

fn ports_of(slot: &InstanceSlot) -> AgentInstancePorts {
    AgentInstancePorts {
        debug_port: slot.ports[0],
        stream_port: slot.ports[1],
        http_port: slot.ports[2],
        status: slot.status().0,
    }
}

fn remove_dir(path: &Path) {
    if let Err(error) = std::fs::remove_dir_all(path)
        && error.kind() != std::io::ErrorKind::NotFound
    {
        tracing::warn!(path = %path.display(), %error, "cannot remove instance directory");
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_owned())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "node-1".into())
}
