//! The agent's record of one instance ([`InstanceSlot`]): its ports, directories,
//! browser process and lifecycle state, activity clock, snapshot and last resource sample.
//!
//! The slot is shared (`Arc`) by the task that launches and watches the browser,
//! the port servers (CDP gateway, live view, instance HTTP API) and the agent's
//! delete, dormant, revive and report paths. Operations that change the browser
//! (park, revive, delete) go to one task per instance ([`InstanceSlot::send`]),
//! so they never interleave; its state changes only through the lifecycle
//! table ([`InstanceSlot::apply`]).

pub mod state;
pub mod token;

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::{CancellationToken, DropGuard};

use flotilla_api_types::InstanceId;
use flotilla_api_types::agent::InstanceReport;
use flotilla_api_types::clock::Clock;
use flotilla_api_types::credentials::Secret;
use flotilla_api_types::ids::{OperationId, SnapshotId};
use flotilla_api_types::instances::{
    InstanceConfig, InstanceResources, InstanceStatus, ReviveMethod,
};
use flotilla_api_types::profiles::ProfileUse;

use crate::agent::operations::{REQUESTS_QUEUED, Request};
use crate::engine::browser::{BrowserProcess, CdpEndpoint};
use crate::engine::launcher::Launched;
use crate::instance::state::{Effect, Event, Lifecycle, State, transition};
use crate::system::cgroups::InstanceCgroup;
use crate::system::dirs::InstanceDirs;
use token::InstanceToken;

/// Why an instance's browser cannot be used now (its ports answer 503).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum NotReady {
    /// It ended (failed, stopped or is being deleted); the reason says why.
    #[error("instance {instance} is not running: {reason}")]
    NotRunning {
        instance: InstanceId,
        reason: String,
    },
    /// Parked, and this caller does not wake it.
    #[error("instance {instance} is dormant; revive it with POST /v2/instances/{instance}/revive")]
    Dormant { instance: InstanceId },
    /// Its slot is gone.
    #[error("instance {instance} is gone")]
    Gone { instance: InstanceId },
    #[error("instance {instance} did not become ready within {timeout:?}")]
    Timeout {
        instance: InstanceId,
        timeout: Duration,
    },
}

/// A client's request to wake a dormant instance: which, and with which
/// revive (a WebDriver command asks for its windows back; a client of the
/// instance's ports gets `agent.wake_on_connect_method`).
#[derive(Debug, Clone)]
pub struct Wake {
    pub id: InstanceId,
    pub method: ReviveMethod,
}

/// Where a slot sends its [`Wake`]s, and the revive a client of its ports
/// wakes it with (`agent.wake_on_connect_method`).
#[derive(Debug, Clone)]
pub struct Waker {
    pub sender: mpsc::UnboundedSender<Wake>,
    pub on_connect: ReviveMethod,
    /// Set while the agent drains its node before stopping: no wake then.
    pub node_leaving: Arc<std::sync::atomic::AtomicBool>,
}

pub struct InstanceSlot {
    pub id: InstanceId,
    pub image: String,
    pub config: InstanceConfig,
    /// debug, stream, http.
    pub ports: [u16; 3],
    pub dirs: InstanceDirs,
    /// Its state, changed only through [`InstanceSlot::apply`] (the table of
    /// [`crate::instance::state::transition`]); the port servers, reports and
    /// live view read it here.
    lifecycle: watch::Sender<Lifecycle>,
    /// The browser once spawned, with its cgroup. A std mutex: only swapped or
    /// cloned, never held across an await.
    process: Mutex<Option<Launched>>,
    /// Memory-limit kills already reported.
    oom_reported: AtomicU64,
    /// Milliseconds since the epoch of the last CDP or viewer activity.
    last_activity_ms: AtomicI64,
    resources: Mutex<InstanceResources>,
    pub cpu_meter: Mutex<crate::system::monitor::CpuMeter>,
    /// Stops the instance's port servers.
    pub servers: CancellationToken,
    /// Cancelled when the task watching the current browser has finished; a new
    /// token per browser (create, each revive). A std mutex: swapped or cloned only.
    supervisor_done: Mutex<CancellationToken>,
    /// Where its operations (park, revive, delete, shutdown) go: the one
    /// task that carries them out, in order (`agent::operations`).
    requests: mpsc::Sender<Request>,
    /// Complete downloads already announced. A std mutex: updated by the
    /// sampler only.
    downloads_seen: Mutex<std::collections::HashSet<String>>,
    /// The instance's access token, from the control plane (create, revive).
    /// A std mutex: the `Arc` is cloned out, never held across an await.
    access_token: Mutex<Option<Arc<InstanceToken>>>,
    /// The saved profile it started from (create, revive). A std mutex:
    /// cloned out, never held across an await.
    profile: Mutex<Option<ProfileUse>>,
    /// Asks the agent to revive this instance (and how) when it is dormant
    /// and a client connects; `None` when waking is off.
    waker: Option<Waker>,
    /// The task recording its live view (`config.record`), to wait for the
    /// last recording to be finished before its files are kept or removed.
    recorder: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// The chromedriver a warm browser came with, until a WebDriver session
    /// takes it (or it is dropped, and ends, when none does at once). A std
    /// mutex: swapped only.
    prestarted_driver: Mutex<Option<crate::engine::chromedriver::Driver>>,
    /// Console messages of its pages, for MCP steps (followed from the first).
    pub console: Arc<crate::engine::page::ConsoleLog>,
    clock: Arc<dyn Clock>,
}

/// What a new [`InstanceSlot`] is made of.
pub struct SlotSetup {
    pub id: InstanceId,
    pub image: String,
    pub config: InstanceConfig,
    /// debug, stream, http.
    pub ports: [u16; 3],
    pub dirs: InstanceDirs,
    pub clock: Arc<dyn Clock>,
    pub waker: Option<Waker>,
    /// Where it starts: launching, running (a warm browser) or dormant
    /// (taken back to be revived).
    pub lifecycle: Lifecycle,
}

impl InstanceSlot {
    /// A new slot, and the receiving end of its operations, for the task
    /// that carries them out.
    pub fn new(setup: SlotSetup) -> (Self, mpsc::Receiver<Request>) {
        let SlotSetup {
            id,
            image,
            config,
            ports,
            dirs,
            clock,
            waker,
            lifecycle,
        } = setup;
        let (requests, received) = mpsc::channel(REQUESTS_QUEUED);
        let slot = Self {
            id,
            image,
            config,
            ports,
            dirs,
            lifecycle: watch::channel(lifecycle).0,
            process: Mutex::new(None),
            oom_reported: AtomicU64::new(0),
            last_activity_ms: AtomicI64::new(clock.now().timestamp_millis()),
            resources: Mutex::new(InstanceResources::default()),
            cpu_meter: Mutex::default(),
            servers: CancellationToken::new(),
            // No browser watched yet (a slot taken back to be revived has
            // none until its revive begins): nothing to wait for.
            supervisor_done: Mutex::new({
                let none = CancellationToken::new();
                none.cancel();
                none
            }),
            requests,
            access_token: Mutex::new(None),
            profile: Mutex::new(None),
            downloads_seen: Mutex::default(),
            waker,
            recorder: Mutex::new(None),
            prestarted_driver: Mutex::new(None),
            console: Arc::default(),
            clock,
        };
        (slot, received)
    }

    /// Hands `request` to the task that carries out its operations, waiting
    /// while its queue is full; gives it back when that task has ended (the
    /// instance was deleted or ended).
    pub async fn send(&self, request: Request) -> Result<(), Request> {
        self.requests
            .send(request)
            .await
            .map_err(|refused| refused.0)
    }

    /// Remembers the task recording this instance.
    pub fn set_recorder(&self, recorder: tokio::task::JoinHandle<()>) {
        *self.recorder.lock().expect("slot lock") = Some(recorder);
    }

    /// Waits (at most `deadline`) for the recorder to finish its last
    /// recording; call once the servers are cancelled.
    pub async fn recorder_finished(&self, deadline: Duration) {
        let recorder = self.recorder.lock().expect("slot lock").take();
        if let Some(recorder) = recorder
            && tokio::time::timeout(deadline, recorder).await.is_err()
        {
            tracing::warn!(instance = %self.id, "the recorder did not finish in time");
        }
    }

    pub fn debug_port(&self) -> u16 {
        self.ports[0]
    }

    /// The name of the instance's directory (and cgroup, and sandbox host name).
    pub fn name(&self) -> String {
        self.dirs
            .root
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| self.id.to_string())
    }

    /// Records activity now (CDP traffic, a viewer).
    pub fn touch(&self) {
        self.last_activity_ms
            .store(self.clock.now().timestamp_millis(), Ordering::Relaxed);
    }

    pub fn last_activity(&self) -> DateTime<Utc> {
        Utc.timestamp_millis_opt(self.last_activity_ms.load(Ordering::Relaxed))
            .single()
            .unwrap_or_else(Utc::now)
    }

    /// Its state and operation now.
    pub fn lifecycle(&self) -> Lifecycle {
        self.lifecycle.borrow().clone()
    }

    /// Its state now.
    pub fn state(&self) -> State {
        self.lifecycle.borrow().state.clone()
    }

    /// Moves it on `event` by the lifecycle table, at once for every reader;
    /// answers what the agent must do, or `None` when the event does not
    /// apply in its state (nothing changed).
    pub fn apply(&self, event: Event) -> Option<Vec<Effect>> {
        let mut effects = None;
        self.lifecycle
            .send_if_modified(|current| match transition(current, event) {
                Some((next, done)) => {
                    tracing::debug!(instance = %self.id, from = ?current.state, to = ?next.state, "instance state");
                    *current = next;
                    effects = Some(done);
                    true
                }
                None => false,
            });
        effects
    }

    /// Waits until the browser answers CDP (or is gone), at most `timeout`. A
    /// dormant instance is woken first when waking is on.
    pub async fn wait_ready(&self, timeout: Duration) -> Result<Option<CdpEndpoint>, NotReady> {
        self.wait_ready_waking(timeout, true).await
    }

    /// [`InstanceSlot::wait_ready`], waking a dormant instance only if `wake`
    /// (otherwise a dormant instance is an error at once).
    pub async fn wait_ready_waking(
        &self,
        timeout: Duration,
        wake: bool,
    ) -> Result<Option<CdpEndpoint>, NotReady> {
        let method = self
            .waker
            .as_ref()
            .filter(|_| wake)
            .map(|waker| waker.on_connect);
        self.wait_ready_reviving(timeout, method).await
    }

    /// [`InstanceSlot::wait_ready`], waking a dormant instance with a revive
    /// of `method` (`None`: a dormant instance is an error at once).
    pub async fn wait_ready_reviving(
        &self,
        timeout: Duration,
        method: Option<ReviveMethod>,
    ) -> Result<Option<CdpEndpoint>, NotReady> {
        let waker = self
            .waker
            .as_ref()
            .filter(|waker| !waker.node_leaving.load(std::sync::atomic::Ordering::SeqCst))
            .zip(method);
        let mut lifecycle = self.lifecycle.subscribe();
        let mut woken = false;
        let outcome = tokio::time::timeout(timeout, async {
            loop {
                let state = lifecycle.borrow_and_update().state.clone();
                match state {
                    State::Running { endpoint, .. } => return Ok(endpoint),
                    State::Ended { reason, .. } => {
                        return Err(NotReady::NotRunning {
                            instance: self.id.clone(),
                            reason,
                        });
                    }
                    State::Stopping { .. } => {
                        return Err(NotReady::NotRunning {
                            instance: self.id.clone(),
                            reason: "instance is being stopped".to_owned(),
                        });
                    }
                    State::Dormant { .. } => match waker {
                        Some((waker, method)) if !woken => {
                            let _ = waker.sender.send(Wake {
                                id: self.id.clone(),
                                method,
                            });
                            woken = true;
                        }
                        Some(_) => {}
                        None => {
                            return Err(NotReady::Dormant {
                                instance: self.id.clone(),
                            });
                        }
                    },
                    State::Starting | State::Parking | State::Reviving { .. } => {}
                }
                if lifecycle.changed().await.is_err() {
                    return Err(NotReady::Gone {
                        instance: self.id.clone(),
                    });
                }
            }
        })
        .await;
        outcome.unwrap_or_else(|_| {
            Err(NotReady::Timeout {
                instance: self.id.clone(),
                timeout,
            })
        })
    }

    pub fn set_process(&self, launched: Launched) {
        *self.process.lock().expect("slot lock") = Some(launched);
    }

    pub fn process(&self) -> Option<Arc<BrowserProcess>> {
        self.process
            .lock()
            .expect("slot lock")
            .as_ref()
            .map(|l| l.process.clone())
    }

    /// Keeps the chromedriver its warm browser came with.
    pub fn set_prestarted_driver(&self, driver: Option<crate::engine::chromedriver::Driver>) {
        *self.prestarted_driver.lock().expect("slot lock") = driver;
    }

    /// The chromedriver its warm browser came with, if still kept.
    pub fn take_prestarted_driver(&self) -> Option<crate::engine::chromedriver::Driver> {
        self.prestarted_driver.lock().expect("slot lock").take()
    }

    pub fn cgroup(&self) -> Option<Arc<InstanceCgroup>> {
        self.process
            .lock()
            .expect("slot lock")
            .as_ref()
            .and_then(|l| l.cgroup.clone())
    }

    /// Processes killed by the memory limit since the browser started.
    pub fn oom_kills_total(&self) -> u64 {
        self.cgroup().map(|c| c.oom_kills()).unwrap_or(0)
    }

    /// Memory-limit kills not reported yet, if any.
    pub fn new_oom_kills(&self) -> Option<u64> {
        let total = self.oom_kills_total();
        let reported = self.oom_reported.swap(total, Ordering::SeqCst);
        (total > reported).then(|| total - reported)
    }

    /// Where its browser answers CDP, while it runs.
    pub fn endpoint(&self) -> Option<CdpEndpoint> {
        match &self.lifecycle.borrow().state {
            State::Running { endpoint, .. } => endpoint.clone(),
            _ => None,
        }
    }

    /// The status and reason the control plane is told.
    pub fn status(&self) -> (InstanceStatus, Option<String>) {
        self.lifecycle.borrow().status()
    }

    /// A fresh "supervisor finished" token for a new browser; dropping the
    /// returned guard cancels it.
    pub fn begin_supervision(&self) -> DropGuard {
        let token = CancellationToken::new();
        *self.supervisor_done.lock().expect("slot lock") = token.clone();
        token.drop_guard()
    }

    /// Waits until the task watching the current browser has finished.
    pub async fn supervision_finished(&self) {
        let token = self.supervisor_done.lock().expect("slot lock").clone();
        token.cancelled().await;
    }

    /// Whether the agent is stopping it for good (a delete, its shutdown).
    pub fn is_stopping(&self) -> bool {
        matches!(self.lifecycle.borrow().state, State::Stopping { .. })
    }

    /// The snapshot it is parked in, being revived from, or was revived
    /// from until the control plane recorded that.
    pub fn snapshot(&self) -> Option<SnapshotId> {
        self.lifecycle.borrow().snapshot().cloned()
    }

    /// The operation (create, revive, wake) under way, or the one that
    /// brought it to its state.
    pub fn operation(&self) -> Option<OperationId> {
        self.lifecycle.borrow().operation.clone()
    }

    /// Downloads that finished since the last call.
    pub fn newly_completed_downloads(&self) -> Vec<flotilla_api_types::instances::Download> {
        let mut seen = self.downloads_seen.lock().expect("slot lock");
        crate::system::downloads::newly_completed(&self.dirs.downloads(), &mut seen)
    }

    /// The instance's access token, if the control plane sent one.
    pub fn access_token(&self) -> Option<Arc<InstanceToken>> {
        self.access_token.lock().expect("slot lock").clone()
    }

    /// Sets the token (`None` keeps the current one).
    /// The profile to write back on delete and park, when `persist`.
    pub fn persisted_profile(&self) -> Option<String> {
        self.profile
            .lock()
            .expect("slot lock")
            .as_ref()
            .filter(|profile| profile.persist)
            .map(|profile| profile.name.clone())
    }

    /// The profile it started from.
    pub fn profile_name(&self) -> Option<String> {
        self.profile
            .lock()
            .expect("slot lock")
            .as_ref()
            .map(|profile| profile.name.clone())
    }

    pub fn set_profile(&self, profile: Option<ProfileUse>) {
        *self.profile.lock().expect("slot lock") = profile;
    }

    pub fn set_access_token(&self, token: Option<&Secret>) {
        if let Some(token) = token {
            *self.access_token.lock().expect("slot lock") =
                Some(Arc::new(InstanceToken::new(token.expose().to_owned())));
        }
    }

    pub fn set_resources(&self, resources: InstanceResources) {
        *self.resources.lock().expect("slot lock") = resources;
    }

    /// What the control plane is told of this instance.
    pub fn report(&self) -> InstanceReport {
        let lifecycle = self.lifecycle();
        let (status, reason) = lifecycle.status();
        InstanceReport {
            id: self.id.clone(),
            status,
            reason,
            resources: *self.resources.lock().expect("slot lock"),
            last_activity: self.last_activity(),
            snapshot_id: lifecycle.snapshot().cloned(),
            operation: lifecycle.operation,
        }
    }
}
