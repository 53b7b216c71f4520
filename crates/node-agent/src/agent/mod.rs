//! The node agent: owns the instances on one machine.
//!
//! [`Agent`] is a cheap-to-clone handle over shared state. It creates instances
//! (reserve ports, start the port servers, launch the browser — or take one from
//! the warm pool), parks them (snapshot, then free the browser, keeping the
//! ports so that a connecting client wakes them), revives them, deletes them,
//! reports to the control plane through a [`ControlPlaneLink`] (registration,
//! periodic heartbeats, state changes in order), and on shutdown stops every
//! browser gracefully.

use anyhow::Context as _;
use std::collections::{BTreeMap, HashMap};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::{CancellationToken, DropGuard};
use tokio_util::task::TaskTracker;

use flotilla_api_types::agent::{
    AgentCreateInstance, AgentDormantResult, AgentIdentity, AgentInstancePorts,
    AgentReviveInstance, InstanceEventReport, InstanceStateChange,
};
use flotilla_api_types::clock::Clock;
use flotilla_api_types::credentials::Secret;
use flotilla_api_types::ids::SnapshotId;
use flotilla_api_types::instances::{InstanceConfig, InstanceStatus, ProxyError};
use flotilla_api_types::profiles::ProfileUse;
use flotilla_api_types::{InstanceId, NodeId};

use crate::agent::link::ControlPlaneLink;
use crate::agent::ports::{InstancePorts, PortAllocator};
use crate::config::{AgentConfig, ImageConfig};
use crate::confine::egress::Upstream;
use crate::engine::browser::LaunchError;
use crate::engine::launcher::Launcher;
use crate::instance::runner::Held;
use crate::instance::state::{Event, Lifecycle};
use crate::instance::token::InstanceToken;
use crate::instance::{InstanceSlot, SlotSetup};
use crate::protocols::access::NodeAccess;
use crate::protocols::client_frames::MessageBudget;
use crate::snapshot::SnapshotStore;
use crate::system::dirs::InstanceDirs;
use crate::system::monitor::MachineMeter;

pub mod api;
mod dormancy;
mod lifecycle;
pub mod link;
pub(crate) mod operations;

use operations::Request;
pub mod ports;
mod readings;
mod reporting;
pub mod sweep;
mod warm;

/// Errors of agent operations; the agent API maps each to its HTTP status
/// and code (`agent_api::status_of`), the control plane maps the code to
/// its own errors.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// 400.
    #[error(transparent)]
    UnknownImage(#[from] UnknownImage),
    /// 400: a configuration field the image's browser cannot take
    /// (`config.extensions` on a headless shell or Firefox); the message
    /// names the field and why.
    #[error("{field}: image {image:?} {why}")]
    ConfigUnsupported {
        field: &'static str,
        image: String,
        why: &'static str,
    },
    /// 400: `config.proxy` is refused; the message names the field.
    #[error(transparent)]
    ProxyConfig(#[from] ProxyError),
    /// 409: a park needs Firefox's one WebDriver session, which a client
    /// holds.
    #[error(
        "instance {0} cannot be parked while a WebDriver BiDi client holds Firefox's only session: it parks once the client ends its session or disconnects"
    )]
    BrowserHeld(InstanceId),
    /// 400: the profile was saved by another engine's browser.
    #[error(
        "profile {profile:?} was saved by {saved_by}, and image {image:?} runs {runs}: a profile is per engine (create another profile for {runs})"
    )]
    ProfileEngine {
        profile: String,
        saved_by: String,
        image: String,
        runs: &'static str,
    },
    /// 400: `config.prefs` on a Firefox image is not Firefox's preferences
    /// or names one Flotilla keeps; the message names it.
    #[error("{0} (image {1:?} runs Firefox)")]
    FirefoxPrefs(flotilla_api_types::prefs::PrefsError, String),
    /// 503.
    #[error("node {node} is full: it holds its maximum of {max} instances (agent.max_instances)")]
    Full { node: NodeId, max: i64 },
    /// 503.
    #[error("port range {range} is exhausted on node {node}; raise agent.port_range or add a node")]
    PortsExhausted { range: String, node: NodeId },
    /// 404.
    #[error("instance {0} is not on this node")]
    NotFound(InstanceId),
    /// 409: a park of an instance that is not running.
    #[error(
        "instance {instance} is {status} on its node; only a running instance can be made dormant"
    )]
    NotRunning {
        instance: InstanceId,
        status: InstanceStatus,
    },
    /// 409: a revive of an instance that is not dormant.
    #[error("instance {instance} is {status} on its node; only a dormant instance can be revived")]
    NotDormant {
        instance: InstanceId,
        status: InstanceStatus,
    },
    /// 409: a request whose body names another instance than its path.
    #[error("path names {path} but the body names {body}")]
    PathMismatch { path: String, body: InstanceId },
    /// 500: a park could not read the browser's state; nothing changed.
    #[error("cannot read the browser's state: {0}")]
    StateUnreadable(#[source] anyhow::Error),
    /// 500: a park could not archive the profile; the browser was started
    /// again on it.
    #[error("{0}; the instance keeps running")]
    SnapshotNotMade(#[source] ArchiveError),
    /// 502: the snapshot store did not take a park's snapshot; the browser
    /// was started again on its profile.
    #[error("{0}; the instance keeps running: park it again later")]
    SnapshotNotStored(#[source] ArchiveError),
    /// 502: the snapshot store cannot be read (unreachable, timed out): the
    /// revive was refused, nothing changed; retry when it is back.
    #[error(
        "the snapshot store {location} cannot be read: {source}; the instance stays dormant: revive it again later"
    )]
    StoreUnreadable {
        location: String,
        #[source]
        source: anyhow::Error,
    },
    /// 503.
    #[error("the agent is shutting down")]
    ShuttingDown,
    /// A REST action's job failed; its status is the action error's.
    #[error(transparent)]
    Action(#[from] crate::protocols::actions::ActionError),
    /// An MCP step failed; its status is the step error's.
    #[error(transparent)]
    Page(#[from] crate::protocols::page_ops::PageError),
}

/// An image name this node's catalog does not have.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown image {image:?}; this node offers: {offered}")]
pub struct UnknownImage {
    pub image: String,
    /// The catalog's names, comma-separated.
    pub offered: String,
}

/// Why a park could not put the closed browser's profile in the snapshot
/// store.
#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    #[error("profile directory: {0}")]
    ProfileDirectory(#[source] std::io::Error),
    #[error("cannot archive the profile: {0}")]
    Archive(#[source] anyhow::Error),
    /// The archiving task panicked.
    #[error("{0}")]
    Panicked(#[source] tokio::task::JoinError),
    /// The store failed (unreachable, timed out).
    #[error("the snapshot store {location} cannot take the snapshot: {source}")]
    Store {
        location: String,
        #[source]
        source: anyhow::Error,
    },
}

/// Why an instance's browser did not start, or come back after a park or
/// from a snapshot. Its text is the reason of the instance's `failed` state.
#[derive(Debug, thiserror::Error)]
pub enum StartFailure {
    #[error("{id:?} is not an extension id")]
    NotAnExtensionId { id: String },
    #[error("cannot read extension {id}: {source}")]
    ExtensionUnreadable {
        id: String,
        #[source]
        source: anyhow::Error,
    },
    #[error("extension {id} is not in the snapshot store")]
    ExtensionMissing { id: String },
    #[error("cannot unpack extension {id}: {source}")]
    ExtensionUnpack {
        id: String,
        #[source]
        source: crate::engine::extension::UnpackError,
    },
    /// The extensions' folder could not be made, or the unpacked one moved
    /// into place.
    #[error("cannot unpack extension {id}: {source}")]
    ExtensionFolder {
        id: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot read profile {name}: {source}")]
    ProfileUnreadable {
        name: String,
        #[source]
        source: anyhow::Error,
    },
    #[error("cannot unpack profile {name}: {source}")]
    ProfileUnpack {
        name: String,
        #[source]
        source: UnpackArchiveError,
    },
    #[error("cannot restore profile {name}: {source}")]
    ProfileRestore {
        name: String,
        #[source]
        source: anyhow::Error,
    },
    /// The snapshot is not in the store (or cannot be read from it).
    #[error("cannot read snapshot {snapshot}: {source}")]
    SnapshotUnreadable {
        snapshot: SnapshotId,
        #[source]
        source: anyhow::Error,
    },
    #[error("cannot unpack snapshot {snapshot}: {source}")]
    SnapshotUnpack {
        snapshot: SnapshotId,
        #[source]
        source: UnpackArchiveError,
    },
    /// A warm browser's folder could not be made the instance's.
    #[error("cannot make a warm browser the instance's: {0}")]
    WarmBrowserAdopt(#[source] anyhow::Error),
    /// Cookies, storage or tabs could not be put back into a revived browser.
    #[error("cannot restore the browser's state: {0}")]
    StateRestore(#[source] anyhow::Error),
    /// The tabs could not be put back after a failed park.
    #[error("{0}")]
    TabsRestore(#[source] anyhow::Error),
    #[error(transparent)]
    UnknownImage(#[from] UnknownImage),
    #[error(transparent)]
    Proxy(#[from] ProxyError),
    #[error(transparent)]
    Launch(#[from] LaunchError),
    /// The browser did not answer CDP in time; with the end of its log.
    #[error("browser did not answer CDP within {timeout:?}{log}")]
    ReadyTimeout { timeout: Duration, log: String },
    /// The instance was deleted while its browser started.
    #[error("stopped while starting")]
    StoppedWhileStarting,
    /// A task unpacking extensions panicked.
    #[error("{0}")]
    Panicked(#[from] tokio::task::JoinError),
}

/// Why an archive (a snapshot or a saved profile) could not be unpacked into
/// an instance's directory.
#[derive(Debug, thiserror::Error)]
pub enum UnpackArchiveError {
    #[error("{0}")]
    Directory(#[source] std::io::Error),
    #[error("{0}")]
    Extract(#[source] anyhow::Error),
    #[error("{0}")]
    Panicked(#[from] tokio::task::JoinError),
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
    /// The process's connection budget: instance ports take their
    /// connections from it.
    pub listeners: flotilla_net::Listeners,
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
    /// Screenshot limits shared by the node's instances.
    captures: Arc<crate::engine::capture::NodeCaptures>,
    /// The default image's Chromium version, read once at start.
    browser_version: Option<String>,
    /// Instances on this node. A std mutex: lookups and inserts only.
    slots: Mutex<HashMap<InstanceId, Arc<InstanceSlot>>>,
    link: Arc<dyn ControlPlaneLink>,
    /// State changes, sent to the control plane in order by one task.
    changes: mpsc::UnboundedSender<Outgoing>,
    /// Dormant instances a client connected to.
    wake: mpsc::UnboundedSender<crate::instance::Wake>,
    /// Set once the agent drains its node before stopping: a client that
    /// connects to a dormant instance then gets 503 at once instead of
    /// waking it here, where it would be stopped with the agent.
    leaving: Arc<std::sync::atomic::AtomicBool>,
    machine: Mutex<MachineMeter>,
    /// What the sampler keeps of each instance between heartbeats.
    readings: readings::Readings,
    launcher: Arc<Launcher>,
    /// Who may use instance ports: the control plane's policy, applied at
    /// every registration and heartbeat answer.
    access: Arc<NodeAccess>,
    /// Whether the control plane takes `EgressRefused` events (protocol
    /// 1.3): to one before, they are not sent (it would refuse the report).
    takes_refusals: std::sync::atomic::AtomicBool,
    /// Every task the agent starts (the warm pool, reporting, supervision of
    /// each browser, each instance's servers, revives): shutdown closes it
    /// and waits until they have all ended.
    tasks: TaskTracker,
    shutdown: CancellationToken,
    /// Its loops' runs: heartbeats, state changes, wakes (the warm pools'
    /// refills are the launcher's).
    runs: flotilla_api_types::runs::RunLedger,
}

/// An item of the ordered queue to the control plane.
enum Outgoing {
    /// A state change, and who waits to learn whether the control plane
    /// recorded it (`false` also when it could not be delivered).
    Change(InstanceStateChange, Option<oneshot::Sender<bool>>),
    Event(InstanceEventReport),
    /// Answered once everything queued before it was handled: `true` when
    /// all of it was delivered (`false` once a change was given up on at
    /// shutdown); then the sender ends (shutdown).
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
        let sim_start = Duration::from_millis(settings.config.sim_start_ms);
        let engine = crate::engine::for_runtime(settings.config.runtime, sim_start);
        if engine.runs_processes() {
            crate::system::process::become_subreaper();
        }
        MessageBudget::configure_node(settings.config.messages_in_flight_mb << 20);
        let instances_root = instances_swept(&settings.data_dir)?;
        let launcher = Launcher::new(
            &settings.config,
            engine.clone(),
            node_id.as_str(),
            instances_root.clone(),
            &settings.data_dir,
        )
        .map_err(anyhow::Error::msg)?;
        launcher
            .isolation()
            .let_browser_traverse(&instances_root)
            .with_context(|| format!("cannot open {} to browsers", instances_root.display()))?;
        let launcher = Arc::new(launcher);
        let (changes_tx, changes_rx) = mpsc::unbounded_channel();
        let (wake_tx, wake_rx) = mpsc::unbounded_channel();
        let inner = Arc::new(AgentInner {
            runs: Default::default(),
            launcher,
            access: Arc::new(NodeAccess::default()),
            takes_refusals: Default::default(),
            tasks: TaskTracker::new(),
            node_id,
            generation: uuid::Uuid::new_v4().simple().to_string(),
            catalog: settings.config.image_catalog(),
            ports: PortAllocator::new(settings.config.port_range, settings.bind_address),
            machine: Mutex::new(MachineMeter::new(&settings.data_dir)),
            readings: readings::Readings::default(),
            instances_root,
            captures: crate::engine::capture::NodeCaptures::new(&settings.config),
            browser_version: settings
                .config
                .image_catalog()
                .get(flotilla_api_types::instances::DEFAULT_IMAGE)
                .and_then(|image| engine.of(image.engine).version(&image.executable)),
            settings,
            slots: Mutex::default(),
            link,
            changes: changes_tx,
            wake: wake_tx,
            leaving: Arc::default(),
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
        if engine.runs_processes() {
            tasks.spawn(crate::system::reaper::run(agent.inner.shutdown.clone()));
        }
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

    fn image(&self, name: &str) -> Result<ImageConfig, UnknownImage> {
        self.inner
            .catalog
            .get(name)
            .cloned()
            .ok_or_else(|| UnknownImage {
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
        self.engine().runs_processes()
    }

    /// The engines its browsers run.
    fn engine(&self) -> &crate::engine::Engines {
        self.inner.launcher.engines()
    }

    /// A new slot for `order` with `ports`, starting `from` a lifecycle (and
    /// a warm browser), with its runner started (the caller registers it
    /// under the slots lock it holds); and the guard of the watch on its
    /// first browser.
    fn new_slot(
        &self,
        order: &impl SlotOrder,
        ports: &InstancePorts,
        dirs: InstanceDirs,
        from: SlotStart,
    ) -> (Arc<InstanceSlot>, DropGuard) {
        let (id, image, config, access_token, profile) = order.parts();
        self.inner.readings.start(id);
        let waker = self
            .inner
            .settings
            .config
            .wake_on_connect
            .then(|| crate::instance::Waker {
                sender: self.inner.wake.clone(),
                on_connect: self.inner.settings.config.wake_on_connect_method,
                node_leaving: self.inner.leaving.clone(),
            });
        let engine = self
            .inner
            .catalog
            .get(image)
            .map(|image| image.engine)
            .unwrap_or_default();
        let born = InstanceSlot::born(SlotSetup {
            id: id.clone(),
            image: image.to_owned(),
            engine,
            config: config.clone(),
            ports: [ports.debug, ports.stream, ports.http],
            dirs,
            clock: self.inner.settings.clock.clone(),
            waker,
            lifecycle: from.lifecycle,
            held: Held {
                launched: from.launched,
                token: access_token.map(InstanceToken::of),
                profile: profile.cloned(),
            },
            prestarted_driver: from.prestarted_driver,
            recorded: config.record && self.binds_ports(),
            reporter: self.reporter(),
        });
        self.inner.tasks.spawn(born.runner.run());
        (Arc::new(born.slot), born.supervision)
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
        let span = operation("agent.instance.create", &request.id, &self.inner.node_id);
        flotilla_api_types::tasks::to_completion(flotilla_telemetry::traced(span, async move {
            agent.create_now(request).await
        }))
        .await
    }

    pub async fn instance_delete(&self, id: &InstanceId, force: bool) -> Result<(), AgentError> {
        let span = operation("agent.instance.delete", id, &self.inner.node_id);
        let (agent, id) = (self.clone(), id.clone());
        flotilla_api_types::tasks::to_completion(flotilla_telemetry::traced(span, async move {
            agent.delete_now(&id, force).await
        }))
        .await
    }

    /// Runs a REST action's job on an instance's browser (waiting for its
    /// launch first), within the job's `timeout_ms`.
    pub async fn instance_action(
        &self,
        id: &InstanceId,
        action: &flotilla_api_types::actions::AgentAction,
    ) -> Result<crate::protocols::actions::ActionOutput, AgentError> {
        use crate::protocols::actions::{ActionBounds, ActionError};
        let slot = self.slot(id)?;
        let _counted = slot
            .clients
            .attach(crate::instance::clients::ClientKind::Action);
        let config = &self.inner.settings.config;
        let launch_wait = Duration::from_secs(config.launch_timeout_sec);
        let endpoint = slot
            .wait_ready_waking(launch_wait, false)
            .await
            .map_err(|e| ActionError::NotStarted(e.to_string()))?
            .ok_or(ActionError::NoBrowser)?;
        slot.touch();
        let bounds = ActionBounds {
            max_output_bytes: config.action_max_output_bytes,
            max_pixels: config.screenshot_max_pixels,
        };
        if !endpoint.speaks_cdp() {
            return Ok(crate::protocols::firefox_actions::run(&endpoint, action, bounds).await?);
        }
        Ok(crate::protocols::actions::run(&endpoint, action, bounds).await?)
    }

    /// Carries out an MCP step on an instance's page (waking it when it is
    /// dormant and waking is on), within the step's `timeout_ms`.
    pub async fn instance_page(
        &self,
        id: &InstanceId,
        request: &flotilla_api_types::page::AgentPageRequest,
    ) -> Result<flotilla_api_types::page::PageAnswer, AgentError> {
        use crate::protocols::page_ops::PageError;
        let slot = self.slot(id)?;
        let launch_wait = Duration::from_secs(self.inner.settings.config.launch_timeout_sec);
        let endpoint = slot
            .wait_ready(launch_wait)
            .await
            .map_err(|e| PageError::NotStarted(e.to_string()))?
            .ok_or(PageError::NoBrowser)?;
        slot.touch();
        let context = crate::protocols::page_ops::StepContext {
            console: &slot.console,
            dirs: &slot.dirs,
            isolation: self.inner.launcher.isolation(),
            references: &slot.references,
        };
        if !endpoint.speaks_cdp() {
            return Ok(crate::protocols::firefox_page_ops::run(&endpoint, request, context).await?);
        }
        slot.console.follow(&endpoint).await;
        Ok(crate::protocols::page_ops::run(&endpoint, request, context).await?)
    }

    /// Drops dormant instance `id`, revived on another node (see
    /// [`operations::Request::Forget`]).
    pub async fn instance_forget(&self, id: &InstanceId) -> Result<(), AgentError> {
        let slot = self.slot(id)?;
        let agent = self.clone();
        flotilla_api_types::tasks::to_completion(async move {
            let (reply, done) = oneshot::channel();
            if agent
                .submit(&slot, operations::Request::Forget { reply })
                .await
                .is_err()
            {
                return Ok(());
            }
            done.await.unwrap_or(Ok(()))
        })
        .await
    }

    pub async fn instance_dormant(
        &self,
        id: &InstanceId,
    ) -> Result<AgentDormantResult, AgentError> {
        let span = operation("agent.instance.park", id, &self.inner.node_id);
        let (agent, id) = (self.clone(), id.clone());
        flotilla_api_types::tasks::to_completion(flotilla_telemetry::traced(span, async move {
            agent.park_now(&id).await
        }))
        .await
    }

    pub async fn instance_revive(
        &self,
        request: AgentReviveInstance,
    ) -> Result<AgentInstancePorts, AgentError> {
        let agent = self.clone();
        let span = operation("agent.instance.revive", &request.id, &self.inner.node_id);
        flotilla_api_types::tasks::to_completion(flotilla_telemetry::traced(span, async move {
            agent.revive_now(request).await
        }))
        .await
    }

    /// Every slot, as it is now.
    fn all_slots(&self) -> Vec<Arc<InstanceSlot>> {
        let slots = self.inner.slots.lock().expect("slots lock");
        slots.values().cloned().collect()
    }

    /// `drain_on_shutdown`: asks the control plane to drain this node until
    /// its agent registers again, then waits, serving and reporting as
    /// usual, until the drain has finished and nothing runs here any more,
    /// for `drain_timeout_sec` at most. From the start no client wakes a
    /// dormant instance here; one that was woken before is moved by a
    /// further round. A report is taken only from the drain this agent
    /// started (another control plane of the cluster may hold an older
    /// one); without it, the agent goes by what still runs here. What still
    /// runs at the end (no room elsewhere that the drain could not park, the
    /// deadline, a control plane that cannot drain) is parked here rather
    /// than stopped. Call it before [`Agent::shutdown`].
    pub async fn drain_before_shutdown(&self) {
        let config = &self.inner.settings.config;
        if !config.drain_on_shutdown || self.inner.shutdown.is_cancelled() {
            return;
        }
        self.inner
            .leaving
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(config.drain_timeout_sec);
        self.drain_rounds(deadline).await;
        if self.runs_anything() {
            self.park_what_runs().await;
        }
    }

    /// Asks for drains of this node until nothing runs here, the rounds are
    /// spent or `deadline` has passed.
    async fn drain_rounds(&self, deadline: tokio::time::Instant) {
        let node = &self.inner.node_id;
        let mut rounds = 0;
        loop {
            let started = match self.inner.link.drain(node).await {
                Ok(report) => report,
                Err(error) => {
                    tracing::warn!(%node, %error, "the node could not be drained before stopping");
                    return;
                }
            };
            rounds += 1;
            tracing::info!(%node, instances = started.moving.len(), round = rounds, "draining the node before stopping");
            let finished = self.drain_finished(&started, deadline).await;
            if !self.runs_anything() {
                tracing::info!(%node, "node drained; stopping");
                return;
            }
            if tokio::time::Instant::now() >= deadline {
                let timeout_sec = self.inner.settings.config.drain_timeout_sec;
                tracing::warn!(%node, timeout_sec, "the drain did not finish within drain_timeout_sec");
                return;
            }
            match finished {
                // Finished with instances still here: those that stayed
                // (they could not be parked either), or ones woken before
                // the drain began. Another round, after a breath.
                Some(report) if rounds < DRAIN_ROUNDS => {
                    tracing::info!(%node, stayed = report.stayed.len(), "instances still run here after the drain; draining again");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                Some(_) => {
                    tracing::warn!(%node, rounds, "instances still run here after every drain round");
                    return;
                }
                None => return,
            }
        }
    }

    /// Parks, here, what still runs once the drain is over (it could not
    /// move, or there was no drain): parked, an instance keeps its state
    /// and can be revived later; stopped with the agent, it would not. Its
    /// parks are reported to the control plane like any other.
    async fn park_what_runs(&self) {
        let running: Vec<InstanceId> = self
            .all_slots()
            .iter()
            .filter(|slot| {
                matches!(
                    slot.status().0,
                    InstanceStatus::Running | InstanceStatus::Idle
                )
            })
            .map(|slot| slot.id.clone())
            .collect();
        tracing::info!(
            instances = running.len(),
            "parking what still runs before stopping"
        );
        let parks = async {
            for id in &running {
                if let Err(error) = self.instance_dormant(id).await {
                    tracing::warn!(instance = %id, %error, "cannot park it before stopping; it stops with the agent");
                }
            }
        };
        if tokio::time::timeout(PARK_ON_SHUTDOWN_DEADLINE, parks)
            .await
            .is_err()
        {
            tracing::warn!(
                "parking before stopping took too long; what is left stops with the agent"
            );
        }
    }

    /// Waits for the drain `started` to finish (its report, `None` at the
    /// deadline), or, while its control plane's reports cannot be read,
    /// until nothing runs here any more.
    async fn drain_finished(
        &self,
        started: &flotilla_api_types::nodes::DrainReport,
        deadline: tokio::time::Instant,
    ) -> Option<flotilla_api_types::nodes::DrainReport> {
        let node = &self.inner.node_id;
        let mut report = Some(started.clone());
        loop {
            match &report {
                Some(report) if report.finished => return Some(report.clone()),
                None if !self.runs_anything() => return None,
                _ => {}
            }
            if tokio::time::Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
            report = match self.inner.link.drain_report(node).await {
                // Only this drain's report: another control plane may hold
                // an older, finished one.
                Ok(report) => report.filter(|r| r.started_at == started.started_at),
                Err(error) => {
                    tracing::warn!(%node, %error, "cannot read the drain's progress");
                    None
                }
            };
        }
    }

    /// Whether an instance runs, or is on its way to, on this node.
    fn runs_anything(&self) -> bool {
        self.all_slots().iter().any(|slot| {
            matches!(
                slot.status().0,
                InstanceStatus::Running
                    | InstanceStatus::Idle
                    | InstanceStatus::Creating
                    | InstanceStatus::Reviving
            )
        })
    }

    /// Every slot, leaving the agent none (it is stopping).
    fn take_all_slots(&self) -> Vec<Arc<InstanceSlot>> {
        let mut slots = self.inner.slots.lock().expect("slots lock");
        slots.drain().map(|(_, slot)| slot).collect()
    }

    /// Kills every browser at once and removes its directory, without reporting.
    /// For `Drop` paths (a test that panicked); [`Agent::shutdown`] is the graceful way.
    pub fn kill_all(&self) {
        self.inner.shutdown.cancel();
        self.inner.launcher.kill_pool();
        for slot in self.take_all_slots() {
            slot.stop_now();
            slot.servers.cancel();
            if let Some(pid) = slot.process().and_then(|p| p.pid()) {
                crate::system::process::kill_group(pid, libc::SIGKILL);
            }
            remove_dir(&slot.dirs.root);
        }
    }

    /// Stops the browser of `slot` for the agent's shutdown and reports it
    /// `stopped`; a dormant instance stays dormant (nothing to report).
    pub(super) async fn shut_down_instance(&self, slot: &Arc<InstanceSlot>) {
        // A Firefox closes (and writes its profile) only in a session of
        // the agent's own: a WebDriver client's is let go first.
        let endpoint = slot.endpoint();
        let firefox = dormancy::FirefoxHeld::taken(slot, endpoint.as_ref()).await;
        self.stop_slot(slot, false).await;
        drop(firefox);
        let ended = slot.apply(Event::ShutDown).await;
        let dormant = ended.is_none();
        self.carry_out(slot, ended.unwrap_or_default());
        self.release(slot);
        if !dormant {
            // It will not run again: recordings to keep are kept now.
            self.end_recordings(slot, false).await;
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
        let slots = self.take_all_slots();
        let stops = slots.iter().map(|slot| async move {
            let (reply, done) = oneshot::channel();
            // A task already gone had nothing left to stop.
            if self.submit(slot, Request::ShutDown { reply }).await.is_ok() {
                let _ = done.await;
            }
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

/// How many drains an agent stopping with `drain_on_shutdown` asks for at
/// most (a further round moves instances woken before the first began).
const DRAIN_ROUNDS: usize = 3;

/// How long an agent stopping with `drain_on_shutdown` parks what is left.
const PARK_ON_SHUTDOWN_DEADLINE: Duration = Duration::from_secs(60);

/// The span of the agent's part of an instance operation (see
/// `flotilla_telemetry`), a child of the control plane's call.
fn operation(name: &'static str, id: &InstanceId, node: &NodeId) -> tracing::Span {
    let span = flotilla_telemetry::operation(name, Some(id.as_str()));
    span.record("node.id", node.as_str());
    span
}

/// Refuses `config.extensions` on an image without an extension system.
/// Refuses what the image's browser cannot take from `config`.
fn check_config_for_image(
    name: &str,
    image: &ImageConfig,
    config: &InstanceConfig,
) -> Result<(), AgentError> {
    let firefox = image.engine == crate::config::EngineKind::Firefox;
    let unsupported = |field, why| {
        Err(AgentError::ConfigUnsupported {
            field,
            image: name.to_owned(),
            why,
        })
    };
    if !config.extensions.is_empty() && !image.loads_extensions() {
        return unsupported(
            "config.extensions",
            if firefox {
                "runs Firefox, which takes no extensions from Flotilla (its policies block installs); use a Chromium image"
            } else {
                "is a headless shell, which cannot load extensions; use the \"chromium\" image"
            },
        );
    }
    if let Some(prefs) = config.prefs.as_ref().filter(|_| firefox) {
        flotilla_api_types::firefox_prefs::flatten(prefs)
            .map_err(|error| AgentError::FirefoxPrefs(error, name.to_owned()))?;
    }
    Ok(())
}

/// Refuses a profile saved by another engine than the image's: Chromium's
/// and Firefox's profiles share no file.
fn check_profile_engine(
    request: &AgentCreateInstance,
    image: &ImageConfig,
) -> Result<(), AgentError> {
    match (&request.profile, &request.profile_engine) {
        (Some(profile), Some(saved_by)) if saved_by != image.engine.name() => {
            Err(AgentError::ProfileEngine {
                profile: profile.name.clone(),
                saved_by: saved_by.clone(),
                image: request.image.clone(),
                runs: image.engine.name(),
            })
        }
        _ => Ok(()),
    }
}

/// The instance's upstream proxy as the egress proxy uses it.
fn upstream_of(config: &InstanceConfig) -> Result<Option<Upstream>, ProxyError> {
    config.proxy.as_ref().map(Upstream::from_config).transpose()
}

fn ports_of(slot: &InstanceSlot) -> AgentInstancePorts {
    AgentInstancePorts {
        debug_port: slot.ports[0],
        stream_port: slot.ports[1],
        http_port: slot.ports[2],
        status: slot.status().0,
    }
}

/// The version `executable --version` prints (`Chromium 156.0.8078.108 …`).
/// Reads an archive (off the runtime's threads) to look at before unpacking.
async fn open_archive(
    archive: bytes::Bytes,
) -> Result<Arc<crate::snapshot::OpenedArchive>, UnpackArchiveError> {
    tokio::task::spawn_blocking(move || crate::snapshot::OpenedArchive::read(&archive))
        .await?
        .map(Arc::new)
        .map_err(UnpackArchiveError::Extract)
}

/// Unpacks an archive (a snapshot or a saved profile) into the instance's
/// directory, in place of its profile.
async fn unpack_into(
    slot: &InstanceSlot,
    opened: Arc<crate::snapshot::OpenedArchive>,
) -> Result<(), UnpackArchiveError> {
    let (root, profile, downloads) = (
        slot.dirs.root.clone(),
        slot.dirs.profile(),
        slot.dirs.downloads(),
    );
    tokio::task::spawn_blocking(move || {
        remove_dir(&profile);
        std::fs::create_dir_all(&root).map_err(UnpackArchiveError::Directory)?;
        opened
            .unpack(&profile, &downloads)
            .map_err(UnpackArchiveError::Extract)
    })
    .await?
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

/// Where a new slot starts: launching, running a warm browser (with the
/// chromedriver it came with), or dormant (taken back to be revived).
struct SlotStart {
    lifecycle: Lifecycle,
    launched: Option<crate::engine::launcher::Launched>,
    prestarted_driver: Option<crate::engine::driver::Driver>,
}

impl SlotStart {
    fn at(lifecycle: Lifecycle) -> Self {
        Self {
            lifecycle,
            launched: None,
            prestarted_driver: None,
        }
    }
}

/// The folder of the node's instances, emptied of what a previous run of
/// the agent left there (its browsers and profiles).
fn instances_swept(data_dir: &Path) -> std::io::Result<PathBuf> {
    let instances_root = data_dir.join("instances");
    let swept = sweep::sweep(&instances_root);
    if swept.processes > 0 || swept.directories > 0 {
        tracing::warn!(
            processes = swept.processes,
            directories = swept.directories,
            "swept browsers and profiles left by a previous run"
        );
    }
    std::fs::create_dir_all(&instances_root)?;
    Ok(instances_root)
}

/// What a new slot is made of, from a create or a revive order: id, image,
/// config, access token and profile.
trait SlotOrder {
    fn parts(&self) -> SlotParts<'_>;
}

type SlotParts<'a> = (
    &'a InstanceId,
    &'a str,
    &'a InstanceConfig,
    Option<&'a Secret>,
    Option<&'a ProfileUse>,
);

/// Both orders carry the parts under the same names.
macro_rules! slot_order {
    ($($order:ty),*) => {$(
        impl SlotOrder for $order {
            fn parts(&self) -> SlotParts<'_> {
                let (token, profile) = (self.access_token.as_ref(), self.profile.as_ref());
                (&self.id, &self.image, &self.config, token, profile)
            }
        }
    )*};
}

slot_order!(AgentCreateInstance, AgentReviveInstance);
