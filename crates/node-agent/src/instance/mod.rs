//! An instance on its node: its handle ([`InstanceSlot`]), its runner
//! ([`runner::InstanceRunner`], the one task that owns its state, browser
//! process, supervision, token and profile) and its lifecycle table
//! ([`state`]).
//!
//! The handle is shared (`Arc`) by the task that launches and watches the
//! browser, the port servers (CDP gateway, live view, instance HTTP API) and
//! the agent's delete, park, revive and report paths. It holds what never
//! changes (ports, directories, configuration) and reads the rest from what
//! the runner publishes; every change is a message to the runner
//! ([`InstanceSlot::apply`], [`InstanceSlot::set_process`], …), and
//! operations that change the browser (park, revive, delete) are queued to
//! it ([`InstanceSlot::send`]), so they never interleave.

pub mod clients;
pub mod runner;
pub mod state;
pub mod token;

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};
use tokio::sync::{mpsc, oneshot, watch};
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

use crate::engine::browser::{BrowserProcess, CdpEndpoint};
use crate::engine::launcher::Launched;
use crate::instance::state::{Effect, Event, Lifecycle, State};
use crate::system::cgroups::InstanceCgroup;
use crate::system::dirs::InstanceDirs;
use runner::{Held, InstanceRunner, Message, OPERATIONS_QUEUED, Operation};
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
    /// The engine its image runs (which protocols its doors speak).
    pub engine: crate::config::EngineKind,
    pub config: InstanceConfig,
    /// debug, stream, http.
    pub ports: [u16; 3],
    pub dirs: InstanceDirs,
    /// Its state, as its runner publishes it: the port servers, reports and
    /// live view read it here.
    lifecycle: watch::Receiver<Lifecycle>,
    /// Its browser process, token and profile, as its runner publishes them.
    held: watch::Receiver<Held>,
    /// Where its runner's messages go (state changes, a spawned browser).
    runner: mpsc::UnboundedSender<Message>,
    /// Where its operations (park, revive, delete, shutdown) go: its runner
    /// carries them out one at a time, in order.
    operations: mpsc::Sender<Operation>,
    /// Milliseconds since the epoch of the last CDP or viewer activity.
    last_activity_ms: AtomicI64,
    /// Stops the instance's port servers.
    pub servers: CancellationToken,
    /// Cancelled once its recorder (`config.record`) has finished its last
    /// recording, or at once when nothing records it.
    recorded: CancellationToken,
    /// Asks the agent to revive this instance (and how) when it is dormant
    /// and a client connects; `None` when waking is off.
    waker: Option<Waker>,
    /// Console messages of its pages, for MCP steps (followed from the first).
    pub console: Arc<crate::engine::page::ConsoleLog>,
    /// What its MCP snapshots handed out (references stay with their
    /// document, across its launches).
    pub references: crate::protocols::page_ops::References,
    /// The clients it serves now (connections on its ports, actions).
    pub clients: Arc<clients::ClientCounts>,
    /// Its WebDriver session's front (its driver, the session), served on
    /// its HTTP port; a park of a Firefox lets go of the browser through it.
    pub webdriver: Arc<crate::protocols::webdriver::WebDriver>,
    clock: Arc<dyn Clock>,
}

/// What a new [`InstanceSlot`] is made of.
pub struct SlotSetup {
    pub id: InstanceId,
    pub image: String,
    pub engine: crate::config::EngineKind,
    pub config: InstanceConfig,
    /// debug, stream, http.
    pub ports: [u16; 3],
    pub dirs: InstanceDirs,
    pub clock: Arc<dyn Clock>,
    pub waker: Option<Waker>,
    /// Where it starts: launching, running (a warm browser) or dormant
    /// (taken back to be revived).
    pub lifecycle: Lifecycle,
    /// Its browser, its token and profile from the start.
    pub held: Held,
    /// The chromedriver its warm browser came with.
    pub prestarted_driver: Option<crate::engine::driver::Driver>,
    /// Whether a recorder will record it (its servers run, `config.record`).
    pub recorded: bool,
    /// Where its reports go.
    pub reporter: runner::Reporter,
}

/// A new instance: its handle, its runner (to spawn), and the guard of the
/// watch on its first browser (dropped at once when it has none).
pub struct Born {
    pub slot: InstanceSlot,
    pub runner: InstanceRunner,
    pub supervision: DropGuard,
}

impl InstanceSlot {
    /// A new instance's handle and runner.
    pub fn born(setup: SlotSetup) -> Born {
        let (runner, messages) = mpsc::unbounded_channel();
        let (operations, queued) = mpsc::channel(OPERATIONS_QUEUED);
        let (lifecycle, watched) = watch::channel(setup.lifecycle);
        let (held, held_watched) = watch::channel(setup.held);
        let supervised = CancellationToken::new();
        let servers = CancellationToken::new();
        let recorded = CancellationToken::new();
        if !setup.recorded {
            recorded.cancel();
        }
        let slot = Self {
            id: setup.id.clone(),
            image: setup.image,
            engine: setup.engine,
            config: setup.config,
            ports: setup.ports,
            dirs: setup.dirs,
            lifecycle: watched,
            held: held_watched,
            runner,
            operations,
            last_activity_ms: AtomicI64::new(setup.clock.now().timestamp_millis()),
            servers: servers.clone(),
            recorded,
            waker: setup.waker,
            console: Arc::default(),
            references: Default::default(),
            clients: Arc::default(),
            webdriver: Arc::default(),
            clock: setup.clock,
        };
        let runner = InstanceRunner {
            id: setup.id,
            lifecycle,
            held,
            supervised: supervised.clone(),
            prestarted_driver: setup.prestarted_driver,
            messages,
            operations: queued,
            servers,
            reporter: setup.reporter,
        };
        Born {
            slot,
            runner,
            supervision: supervised.drop_guard(),
        }
    }

    /// Hands `operation` to its runner, waiting while its queue is full;
    /// gives it back when the runner has ended (the instance was deleted or
    /// ended).
    pub async fn send(&self, operation: Operation) -> Result<(), Operation> {
        self.operations
            .send(operation)
            .await
            .map_err(|refused| refused.0)
    }

    /// Asks its runner, and waits for the answer; `None` once the runner
    /// has ended.
    async fn ask<T>(&self, message: impl FnOnce(oneshot::Sender<T>) -> Message) -> Option<T> {
        let (reply, answer) = oneshot::channel();
        self.runner.send(message(reply)).ok()?;
        answer.await.ok()
    }

    /// Moves it on `event` by the lifecycle table (its runner does, at once
    /// for every reader, and sends the reports the change asks for); answers
    /// what else the agent must do (the release), or `None` when the event
    /// does not apply in its state (nothing changed) or the instance is no
    /// longer the agent's.
    pub async fn apply(&self, event: Event) -> Option<Vec<Effect>> {
        self.ask(|reply| Message::Apply { event, reply })
            .await
            .flatten()
    }

    /// Stops it for good without waiting (the agent's `Drop` path).
    pub fn stop_now(&self) {
        let (reply, _) = oneshot::channel();
        let _ = self.runner.send(Message::Apply {
            event: Event::Stop,
            reply,
        });
    }

    /// Its browser was spawned: from the answer on every reader sees it.
    pub async fn set_process(&self, launched: Launched) {
        self.ask(|reply| Message::Spawned { launched, reply }).await;
    }

    /// Begins the watch of a new browser; dropping the returned guard says
    /// that watch ended.
    pub async fn begin_supervision(&self) -> DropGuard {
        match self.ask(|reply| Message::Supervise { reply }).await {
            Some(guard) => guard,
            None => CancellationToken::new().drop_guard(),
        }
    }

    /// Waits until the task watching the current browser has finished.
    pub async fn supervision_finished(&self) {
        if let Some(supervised) = self.ask(|reply| Message::Supervised { reply }).await {
            supervised.cancelled().await;
        }
    }

    /// The chromedriver its warm browser came with, if still kept.
    pub async fn take_prestarted_driver(&self) -> Option<crate::engine::driver::Driver> {
        self.ask(|reply| Message::TakeDriver { reply })
            .await
            .flatten()
    }

    /// A revive brings a new access token (`None` keeps the current one)
    /// and the profile to use.
    pub fn grant(&self, token: Option<&Secret>, profile: Option<ProfileUse>) {
        let _ = self.runner.send(Message::Granted {
            token: token.map(InstanceToken::of),
            profile,
        });
    }

    /// The guard a recorder holds while it records this instance; dropped
    /// when its last recording is written.
    pub fn recording(&self) -> DropGuard {
        self.recorded.clone().drop_guard()
    }

    /// No recorder records it (its servers did not start).
    pub fn not_recorded(&self) {
        self.recorded.cancel();
    }

    /// Waits (at most `deadline`) for the recorder to finish its last
    /// recording; call once the servers are cancelled.
    pub async fn recorder_finished(&self, deadline: Duration) {
        if tokio::time::timeout(deadline, self.recorded.cancelled())
            .await
            .is_err()
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
        let mut lifecycle = self.lifecycle.clone();
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

    pub fn process(&self) -> Option<Arc<BrowserProcess>> {
        self.held
            .borrow()
            .launched
            .as_ref()
            .map(|l| l.process.clone())
    }

    pub fn cgroup(&self) -> Option<Arc<InstanceCgroup>> {
        self.held
            .borrow()
            .launched
            .as_ref()
            .and_then(|l| l.cgroup.clone())
    }

    /// Processes killed by the memory limit since the browser started.
    pub fn oom_kills_total(&self) -> u64 {
        self.cgroup().map(|c| c.oom_kills()).unwrap_or(0)
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

    /// Whether the agent is stopping it for good (a delete, its shutdown)
    /// or has let it go (its servers are stopped: the agent's `Drop` path
    /// stops them before it reads which browser to kill).
    pub fn is_stopping(&self) -> bool {
        matches!(self.lifecycle.borrow().state, State::Stopping { .. })
            || self.servers.is_cancelled()
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

    /// The instance's access token, if the control plane sent one.
    pub fn access_token(&self) -> Option<Arc<InstanceToken>> {
        self.held.borrow().token.clone()
    }

    /// The profile to write back on delete and park, when `persist`.
    pub fn persisted_profile(&self) -> Option<String> {
        self.held
            .borrow()
            .profile
            .as_ref()
            .filter(|profile| profile.persist)
            .map(|profile| profile.name.clone())
    }

    /// The profile it started from.
    pub fn profile_name(&self) -> Option<String> {
        self.held
            .borrow()
            .profile
            .as_ref()
            .map(|profile| profile.name.clone())
    }

    /// What the control plane is told of this instance, with its last
    /// `resources` reading.
    pub fn report(&self, resources: InstanceResources) -> InstanceReport {
        let lifecycle = self.lifecycle();
        let (status, reason) = lifecycle.status();
        InstanceReport {
            id: self.id.clone(),
            status,
            reason,
            resources,
            last_activity: self.last_activity(),
            snapshot_id: lifecycle.snapshot().cloned(),
            operation: lifecycle.operation,
            clients: self.clients.now(),
        }
    }
}
