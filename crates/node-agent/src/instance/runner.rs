//! The one task that owns an instance ([`InstanceRunner`]): its lifecycle
//! state, its browser process, the watch on that browser's supervisor, the
//! chromedriver a warm browser came with, its access token and profile.
//!
//! Nothing else holds them. Everyone else holds the instance's handle
//! ([`crate::instance::InstanceSlot`]), reads what the runner publishes
//! (two `watch` channels: the [`Lifecycle`] and what it [`Held`]s) and
//! sends it [`Message`]s: an event for the lifecycle table (a launch done,
//! a browser's exit, a limit hit, a park begun), a browser spawned, a
//! supervision begun. Only the runner calls [`transition`]; it sends the
//! reports a change asks for itself (so they leave in the order of the
//! changes) and answers the rest (the release) to the sender.
//!
//! Operations that change the browser (park, revive, delete, forget, the
//! agent's shutdown) are [`Operation`]s: the runner runs one at a time, in
//! the order they came, each to its end even when its caller stops
//! waiting, and keeps answering messages while one runs (an operation's
//! own state changes are messages too). The runner ends after an operation
//! that ends the instance, or once the instance ended on its own and its
//! servers were stopped.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;

use futures_util::FutureExt as _;
use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::sync::{CancellationToken, DropGuard};

use flotilla_api_types::InstanceId;
use flotilla_api_types::profiles::ProfileUse;

use crate::engine::driver::Driver;
use crate::engine::launcher::Launched;
use crate::instance::state::{Effect, Event, Lifecycle, transition};
use crate::instance::token::InstanceToken;

/// How many operations an instance's queue holds before senders wait. The
/// lifecycle table lets at most one park or revive be under way; the rest
/// is deletes and the shutdown.
pub const OPERATIONS_QUEUED: usize = 8;

/// Where the runner sends the reports its transitions ask for
/// ([`Effect::Report`]), in the order of the transitions: the agent's
/// ordered queue to the control plane.
pub type Reporter = Arc<dyn Fn(&InstanceId, Effect) + Send + Sync>;

/// What the runner holds besides its state, as its readers see it.
#[derive(Clone, Default)]
pub struct Held {
    /// The browser once spawned, with its cgroup.
    pub launched: Option<Launched>,
    /// The instance's access token, from the control plane (create, revive).
    pub token: Option<Arc<InstanceToken>>,
    /// The saved profile it started from (create, revive).
    pub profile: Option<ProfileUse>,
}

/// Whether the instance lives on after an operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum After {
    Continue,
    /// It is no longer the agent's: the runner ends.
    Ended,
}

/// An operation on one instance (park, revive, delete, …), made by the
/// agent: a future the runner runs to its end.
pub struct Operation {
    pub name: &'static str,
    pub work: Pin<Box<dyn Future<Output = After> + Send>>,
}

/// What the instance's handle asks its runner.
pub enum Message {
    /// Move it by the lifecycle table; answered with the effects to carry
    /// out, or `None` when the event does not apply in its state.
    Apply {
        event: Event,
        reply: oneshot::Sender<Option<Vec<Effect>>>,
    },
    /// Its browser was spawned; answered once every reader sees it.
    Spawned {
        launched: Launched,
        reply: oneshot::Sender<()>,
    },
    /// A new browser is to be watched: answered with the guard whose drop
    /// says that its watch ended.
    Supervise { reply: oneshot::Sender<DropGuard> },
    /// Answered with the token cancelled once the current browser's watch
    /// ended.
    Supervised {
        reply: oneshot::Sender<CancellationToken>,
    },
    /// Answered with the chromedriver its warm browser came with, if kept.
    TakeDriver {
        reply: oneshot::Sender<Option<Driver>>,
    },
    /// A revive brought a (new) access token and the profile to use.
    Granted {
        token: Option<Arc<InstanceToken>>,
        profile: Option<ProfileUse>,
    },
}

impl std::fmt::Debug for Message {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = match self {
            Message::Apply { event, .. } => return write!(f, "Apply({event:?})"),
            Message::Spawned { .. } => "Spawned",
            Message::Supervise { .. } => "Supervise",
            Message::Supervised { .. } => "Supervised",
            Message::TakeDriver { .. } => "TakeDriver",
            Message::Granted { .. } => "Granted",
        };
        f.write_str(name)
    }
}

/// The runner's ends of the instance's channels, and what it starts with.
pub struct InstanceRunner {
    pub(super) id: InstanceId,
    pub(super) lifecycle: watch::Sender<Lifecycle>,
    pub(super) held: watch::Sender<Held>,
    /// Cancelled once the task watching the current browser has finished
    /// (a new token per browser: create, each revive).
    pub(super) supervised: CancellationToken,
    /// The chromedriver a warm browser came with, until a WebDriver session
    /// takes it (or it is dropped, and ends, when none does at once).
    pub(super) prestarted_driver: Option<Driver>,
    pub(super) messages: mpsc::UnboundedReceiver<Message>,
    pub(super) operations: mpsc::Receiver<Operation>,
    /// The instance's port servers: once they are stopped (it ended and was
    /// released) the runner ends.
    pub(super) servers: CancellationToken,
    pub(super) reporter: Reporter,
}

impl InstanceRunner {
    /// Runs until the instance is no longer the agent's.
    pub async fn run(mut self) {
        let mut current: Option<Operation> = None;
        loop {
            tokio::select! {
                biased;
                Some(message) = self.messages.recv() => self.answer(message),
                after = async {
                    let work = &mut current.as_mut().expect("guarded").work;
                    AssertUnwindSafe(work).catch_unwind().await
                }, if current.is_some() => {
                    let name = current.take().map(|operation| operation.name);
                    match after {
                        Ok(After::Continue) => {}
                        Ok(After::Ended) => return,
                        // Its callers hear nothing (their answers are
                        // dropped); the instance's next operations still run.
                        Err(_) => tracing::error!(instance = %self.id, operation = ?name, "an operation panicked"),
                    }
                }
                operation = self.operations.recv(), if current.is_none() => match operation {
                    Some(operation) => {
                        tracing::debug!(instance = %self.id, operation = operation.name, "operation");
                        current = Some(operation);
                    }
                    None => return,
                },
                // It ended on its own and was released: whoever still sends
                // finds it gone.
                () = self.servers.cancelled(), if current.is_none() => return,
            }
        }
    }

    fn answer(&mut self, message: Message) {
        match message {
            Message::Apply { event, reply } => {
                let _ = reply.send(self.apply(event));
            }
            Message::Spawned { launched, reply } => {
                self.held.send_modify(|held| held.launched = Some(launched));
                let _ = reply.send(());
            }
            Message::Supervise { reply } => {
                self.supervised = CancellationToken::new();
                let _ = reply.send(self.supervised.clone().drop_guard());
            }
            Message::Supervised { reply } => {
                let _ = reply.send(self.supervised.clone());
            }
            Message::TakeDriver { reply } => {
                let _ = reply.send(self.prestarted_driver.take());
            }
            Message::Granted { token, profile } => self.held.send_modify(|held| {
                if token.is_some() {
                    held.token = token;
                }
                held.profile = profile;
            }),
        }
    }

    /// Moves the instance on `event` by the lifecycle table, at once for
    /// every reader; the one place its state changes. Its reports go out
    /// now, in order; the rest (the release) is answered to the sender.
    fn apply(&self, event: Event) -> Option<Vec<Effect>> {
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
        let (reports, rest): (Vec<_>, Vec<_>) = effects?
            .into_iter()
            .partition(|effect| matches!(effect, Effect::Report { .. }));
        for report in reports {
            (self.reporter)(&self.id, report);
        }
        Some(rest)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::time::Duration;

    use flotilla_api_types::clock::SystemClock;
    use flotilla_api_types::instances::InstanceStatus;

    use super::*;
    use crate::instance::state::State;
    use crate::instance::{InstanceSlot, SlotSetup};
    use crate::system::dirs::InstanceDirs;

    /// A started runner's handle, and the reports its changes sent.
    fn started() -> (Arc<InstanceSlot>, Arc<Mutex<Vec<InstanceStatus>>>) {
        let reports = Arc::new(Mutex::new(Vec::new()));
        let seen = reports.clone();
        let born = InstanceSlot::born(SlotSetup {
            id: InstanceId::generate(),
            image: "ubuntu:22.04".into(),
            engine: Default::default(),
            config: Default::default(),
            ports: [0; 3],
            dirs: InstanceDirs::new(std::env::temp_dir().join("flotilla-runner-test")),
            clock: Arc::new(SystemClock),
            waker: None,
            lifecycle: Lifecycle::starting(None),
            held: Held::default(),
            prestarted_driver: None,
            recorded: false,
            reporter: Arc::new(move |_, effect| {
                if let Effect::Report { status, .. } = effect {
                    seen.lock().expect("reports").push(status);
                }
            }),
        });
        tokio::spawn(born.runner.run());
        (Arc::new(born.slot), reports)
    }

    fn operation(work: impl Future<Output = After> + Send + 'static) -> Operation {
        Operation {
            name: "test",
            work: Box::pin(work),
        }
    }

    #[tokio::test]
    async fn an_operation_changes_the_state_through_its_runner_while_it_runs() {
        let (slot, reports) = started();
        assert!(slot.apply(Event::Ready { endpoint: None }).await.is_some());
        let (done, finished) = tokio::sync::oneshot::channel();
        let parked = slot.clone();
        let park = operation(async move {
            // The runner answers these while it runs this operation.
            assert!(parked.apply(Event::Park).await.is_some());
            let snapshot = flotilla_api_types::ids::SnapshotId::generate();
            assert!(parked.apply(Event::Parked { snapshot }).await.is_some());
            let _ = done.send(());
            After::Continue
        });
        assert!(slot.send(park).await.is_ok());
        tokio::time::timeout(Duration::from_secs(30), finished)
            .await
            .expect("the operation ended")
            .expect("answered");
        assert!(matches!(slot.state(), State::Dormant { .. }));
        let reported = reports.lock().expect("reports").clone();
        assert_eq!(reported, [InstanceStatus::Running, InstanceStatus::Dormant]);
    }

    #[tokio::test]
    async fn operations_run_one_at_a_time_in_the_order_they_came() {
        let (slot, _) = started();
        let order = Arc::new(Mutex::new(Vec::new()));
        let (last, finished) = tokio::sync::oneshot::channel();
        let mut last = Some(last);
        for n in 0..5 {
            let (order, last) = (order.clone(), if n == 4 { last.take() } else { None });
            let work = operation(async move {
                order.lock().expect("order").push((n, "begins"));
                tokio::task::yield_now().await;
                order.lock().expect("order").push((n, "ends"));
                if let Some(last) = last {
                    let _ = last.send(());
                }
                After::Continue
            });
            assert!(slot.send(work).await.is_ok());
        }
        tokio::time::timeout(Duration::from_secs(30), finished)
            .await
            .expect("all ended")
            .expect("answered");
        let expected: Vec<_> = (0..5).flat_map(|n| [(n, "begins"), (n, "ends")]).collect();
        assert_eq!(*order.lock().expect("order"), expected);
    }

    #[tokio::test]
    async fn a_panicking_operation_leaves_the_runner_serving() {
        let (slot, _) = started();
        assert!(
            slot.send(operation(async { panic!("on purpose") }))
                .await
                .is_ok()
        );
        let (answered, answer) = tokio::sync::oneshot::channel();
        let next = operation(async move {
            let _ = answered.send(());
            After::Continue
        });
        assert!(slot.send(next).await.is_ok());
        tokio::time::timeout(Duration::from_secs(30), answer)
            .await
            .expect("the next operation ran")
            .expect("answered");
        assert!(slot.apply(Event::Ready { endpoint: None }).await.is_some());
    }

    #[tokio::test]
    async fn an_operation_that_ends_the_instance_ends_its_runner() {
        let (slot, _) = started();
        assert!(slot.send(operation(async { After::Ended })).await.is_ok());
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        // Operations queued after it never run: the queue closes.
        loop {
            let queued =
                tokio::time::timeout_at(deadline, slot.send(operation(async { After::Continue })));
            if queued.await.expect("the runner ended").is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // Nothing changes its state any more.
        assert!(slot.apply(Event::Ready { endpoint: None }).await.is_none());
        assert_eq!(slot.state(), State::Starting);
    }
}
