//! The lifecycle of one instance on its node: its state as one value
//! ([`Lifecycle`]) and the one pure function that moves it ([`transition`]).
//!
//! Every change of an instance's state on the agent (launched, parked,
//! revived, exited, stopped…) is an [`Event`] given to [`transition`], which
//! answers the next state and the [`Effect`]s the agent must carry out (what
//! to report to the control plane, whether to free the instance), or `None`
//! when the event does not apply in the current state (then nothing changes).
//! Only the instance's runner ([`crate::instance::runner::InstanceRunner`])
//! calls it, for the events its handle sends
//! ([`crate::instance::InstanceSlot::apply`]); it publishes each change on
//! the `watch` that the port servers, the reports and the live view read,
//! so no reader ever sees a half-made change.
//!
//! This is the agent's side of the lifecycle table of `DESIGN.md`; the
//! control plane has its own (`flotilla_control_plane::app::lifecycle`).

use flotilla_api_types::ids::{OperationId, SnapshotId};
use flotilla_api_types::instances::InstanceStatus;

use crate::engine::browser::CdpEndpoint;

/// Where an instance is in its life on this node.
#[derive(Debug, Clone, PartialEq)]
pub enum State {
    /// Its first browser is launching (a create).
    Starting,
    /// Its browser answers CDP at `endpoint` (`None` for a sim browser).
    /// `spent`: the snapshot it was revived from, kept until the control
    /// plane has recorded the revive (a crash before that falls back on it).
    /// `note`: a warning that does not stop it (a memory-limit kill).
    Running {
        endpoint: Option<CdpEndpoint>,
        spent: Option<SnapshotId>,
        note: Option<String>,
    },
    /// Being parked: its state captured, its browser closing, its archive
    /// on its way to the store. Its browser's exit is expected.
    Parking,
    /// Parked: no browser, `snapshot` in the store. `note`: why a revive
    /// left it here.
    Dormant {
        snapshot: SnapshotId,
        note: Option<String>,
    },
    /// Being revived from `snapshot`.
    Reviving { snapshot: SnapshotId },
    /// Being stopped for good (a delete, the agent's shutdown). `parked`:
    /// the snapshot of an instance stopped while dormant (it stays dormant
    /// in the control plane's records).
    Stopping { parked: Option<SnapshotId> },
    /// Over, on its own or by the agent's decision: `failed` or `stopped`,
    /// and why.
    Ended {
        status: InstanceStatus,
        reason: String,
    },
}

/// An instance's state and the operation (create, revive, wake) that
/// brought it there or is carrying it, reported with every change.
#[derive(Debug, Clone, PartialEq)]
pub struct Lifecycle {
    pub state: State,
    pub operation: Option<OperationId>,
}

/// Something that happened to an instance, or that the agent decided.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// Its browser answers CDP: a launch, a revive, or a restart after a
    /// failed park, done.
    Ready { endpoint: Option<CdpEndpoint> },
    /// A launch, revive or restart after a failed park failed.
    LaunchFailed { reason: String },
    /// Its browser exited without being asked to.
    Exited { reason: String },
    /// A limit was hit that the instance survives (a tab killed for memory).
    Warned { reason: String },
    /// A limit was hit that ends it (its files outgrew `disk_gb`).
    Failed { reason: String },
    /// A park begins.
    Park,
    /// A park stored its snapshot.
    Parked { snapshot: SnapshotId },
    /// A revive (by the control plane, or `woken` by a connecting client)
    /// is taken, as `operation`, from snapshot `from` (the control plane's
    /// word; `None`: the one it is parked in).
    Revive {
        operation: Option<OperationId>,
        woken: bool,
        from: Option<SnapshotId>,
    },
    /// The snapshot store could not be read when a revive was taken: it is
    /// refused, and the operation before it stands again.
    ReviveRefused { previous: Option<OperationId> },
    /// The snapshot store could not be read once the revive began: the
    /// instance stays dormant, and says why.
    RevivePostponed { reason: String },
    /// The control plane recorded the revive from `snapshot`.
    ReviveRecorded { snapshot: SnapshotId },
    /// The agent stops it for good (a delete, its shutdown, a crashed test).
    Stop,
    /// It was revived on another node: a dormant one is let go here
    /// (nothing to report; a revive can no longer take it).
    Forget,
    /// The agent shut down and its browser is gone.
    ShutDown,
}

/// What the agent must do after a transition.
#[derive(Debug, Clone, PartialEq)]
pub enum Effect {
    /// Tell the control plane (in order with the other changes). With
    /// `confirm`, the spent snapshot is deleted once the control plane has
    /// recorded this change.
    Report {
        status: InstanceStatus,
        reason: Option<String>,
        snapshot: Option<SnapshotId>,
        operation: Option<OperationId>,
        confirm: Option<SnapshotId>,
    },
    /// It will not run again: free its slot, ports and directory.
    Release,
}

impl Lifecycle {
    /// A new instance, launching, as `operation`.
    pub fn starting(operation: Option<OperationId>) -> Self {
        Self {
            state: State::Starting,
            operation,
        }
    }

    /// An instance made from a warm browser: running at once.
    pub fn running(endpoint: Option<CdpEndpoint>, operation: Option<OperationId>) -> Self {
        Self {
            state: State::Running {
                endpoint,
                spent: None,
                note: None,
            },
            operation,
        }
    }

    /// A parked instance this agent does not hold (it restarted, or the
    /// instance was parked on another node), taken back to be revived.
    pub fn taken_back(snapshot: SnapshotId) -> Self {
        Self {
            state: State::Dormant {
                snapshot,
                note: None,
            },
            operation: None,
        }
    }

    /// The status and reason the control plane is told.
    pub fn status(&self) -> (InstanceStatus, Option<String>) {
        match &self.state {
            State::Starting => (InstanceStatus::Creating, None),
            // A park is not a state of the API: running until it is done.
            State::Running { note, .. } => (InstanceStatus::Running, note.clone()),
            State::Parking => (InstanceStatus::Running, None),
            State::Dormant { note, .. } => (InstanceStatus::Dormant, note.clone()),
            State::Reviving { .. } => (InstanceStatus::Reviving, None),
            // A control plane that restarts meanwhile must not keep it
            // running in its records.
            State::Stopping { .. } => (
                InstanceStatus::Stopped,
                Some("deleted on its node".to_owned()),
            ),
            State::Ended { status, reason } => (*status, Some(reason.clone())),
        }
    }

    /// The snapshot it is parked in, being revived from, or was revived
    /// from until the control plane recorded it.
    pub fn snapshot(&self) -> Option<&SnapshotId> {
        match &self.state {
            State::Dormant { snapshot, .. } | State::Reviving { snapshot } => Some(snapshot),
            State::Running { spent, .. } => spent.as_ref(),
            State::Stopping { parked } => parked.as_ref(),
            _ => None,
        }
    }

    /// The report of a change to the state it is in now.
    fn report(&self) -> Effect {
        let (_, reason) = self.status();
        self.report_with(reason, None)
    }

    /// [`Lifecycle::report`] with another reason, and the snapshot to
    /// delete once the control plane has recorded it.
    fn report_with(&self, reason: Option<String>, confirm: Option<SnapshotId>) -> Effect {
        let snapshot = match &self.state {
            State::Dormant { snapshot, .. } => Some(snapshot.clone()),
            State::Running { spent, .. } => spent.clone(),
            _ => None,
        };
        Effect::Report {
            status: self.status().0,
            reason,
            snapshot,
            operation: self.operation.clone(),
            confirm,
        }
    }

    fn with(&self, state: State) -> Self {
        Self {
            state,
            operation: self.operation.clone(),
        }
    }
}

/// What a transition answers: the next lifecycle and what the agent must do.
type Step = Option<(Lifecycle, Vec<Effect>)>;

/// The state `lifecycle` moves to on `event`, and what the agent must do;
/// `None` when the event does not apply there (nothing changes: a park of
/// an instance that is not running is refused, the exit of a browser being
/// parked or stopped is expected, a launch that ends after a delete is
/// dropped).
pub fn transition(lifecycle: &Lifecycle, event: Event) -> Step {
    match event {
        Event::Ready { .. }
        | Event::LaunchFailed { .. }
        | Event::Exited { .. }
        | Event::Failed { .. }
        | Event::Warned { .. } => on_browser(lifecycle, event),
        Event::Park
        | Event::Parked { .. }
        | Event::Revive { .. }
        | Event::ReviveRefused { .. }
        | Event::RevivePostponed { .. }
        | Event::ReviveRecorded { .. } => on_dormancy(lifecycle, event),
        Event::Stop | Event::Forget | Event::ShutDown => on_stop(lifecycle, event),
    }
}

/// `next`, reported to the control plane.
fn reported(next: Lifecycle) -> Step {
    let report = next.report();
    Some((next, vec![report]))
}

/// Ended with `status`: reported, and its slot released.
fn ended(lifecycle: &Lifecycle, status: InstanceStatus, reason: String) -> Step {
    let next = lifecycle.with(State::Ended { status, reason });
    let report = next.report();
    Some((next, vec![report, Effect::Release]))
}

/// Running at `endpoint`, nothing spent and nothing to note.
fn running(endpoint: Option<CdpEndpoint>) -> State {
    State::Running {
        endpoint,
        spent: None,
        note: None,
    }
}

/// What its browser did: became ready, failed to launch, exited, hit a limit.
fn on_browser(lifecycle: &Lifecycle, event: Event) -> Step {
    use State::*;
    match (&lifecycle.state, event) {
        (Starting, Event::Ready { endpoint }) => reported(lifecycle.with(running(endpoint))),
        (Reviving { snapshot }, Event::Ready { endpoint }) => {
            let next = lifecycle.with(Running {
                endpoint,
                spent: Some(snapshot.clone()),
                note: None,
            });
            let report = next.report_with(None, Some(snapshot.clone()));
            Some((next, vec![report]))
        }
        // Back in place after a failed park: it never stopped running for
        // the control plane, so there is nothing to report.
        (Parking, Event::Ready { endpoint }) => Some((lifecycle.with(running(endpoint)), vec![])),
        (Starting | Reviving { .. } | Parking, Event::LaunchFailed { reason }) => {
            ended(lifecycle, InstanceStatus::Failed, reason)
        }
        (Running { .. }, Event::Exited { reason }) => {
            ended(lifecycle, InstanceStatus::Stopped, reason)
        }
        (Running { .. }, Event::Failed { reason }) => {
            ended(lifecycle, InstanceStatus::Failed, reason)
        }
        (
            Running {
                endpoint, spent, ..
            },
            Event::Warned { reason },
        ) => reported(lifecycle.with(Running {
            endpoint: endpoint.clone(),
            spent: spent.clone(),
            note: Some(reason),
        })),
        _ => None,
    }
}

/// A park, a revive, and what the control plane and the store said of them.
fn on_dormancy(lifecycle: &Lifecycle, event: Event) -> Step {
    use State::*;
    match (&lifecycle.state, event) {
        (Running { .. }, Event::Park) => Some((lifecycle.with(Parking), vec![])),
        (Parking, Event::Parked { snapshot }) => reported(lifecycle.with(Dormant {
            snapshot,
            note: None,
        })),
        (
            Dormant { snapshot, .. },
            Event::Revive {
                operation,
                woken,
                from,
            },
        ) => {
            let next = Lifecycle {
                state: Reviving {
                    snapshot: from.unwrap_or_else(|| snapshot.clone()),
                },
                operation,
            };
            // A revive the control plane asked for is answered; one a
            // client woke is news to it.
            let effects = if woken {
                vec![next.report_with(Some("woken by a connecting client".to_owned()), None)]
            } else {
                vec![]
            };
            Some((next, effects))
        }
        (Reviving { snapshot }, Event::ReviveRefused { previous }) => Some((
            Lifecycle {
                state: Dormant {
                    snapshot: snapshot.clone(),
                    note: None,
                },
                operation: previous,
            },
            vec![],
        )),
        (Reviving { snapshot }, Event::RevivePostponed { reason }) => {
            reported(lifecycle.with(Dormant {
                snapshot: snapshot.clone(),
                note: Some(reason),
            }))
        }
        (
            Running {
                endpoint,
                spent: Some(spent),
                note,
            },
            Event::ReviveRecorded { snapshot },
        ) if *spent == snapshot => Some((
            lifecycle.with(Running {
                endpoint: endpoint.clone(),
                spent: None,
                note: note.clone(),
            }),
            vec![],
        )),
        _ => None,
    }
}

/// The agent stops it: a delete, a revive elsewhere, its own shutdown.
fn on_stop(lifecycle: &Lifecycle, event: Event) -> Step {
    use State::*;
    match (&lifecycle.state, event) {
        (Dormant { snapshot, .. }, Event::Forget) => Some((
            lifecycle.with(Stopping {
                parked: Some(snapshot.clone()),
            }),
            vec![],
        )),
        // Once over, or already stopping, it is not stopped again (an
        // instance that failed stays failed in the reports).
        (Stopping { .. } | Ended { .. }, Event::Stop) => None,
        (state, Event::Stop) => {
            let parked = match state {
                Dormant { snapshot, .. } => Some(snapshot.clone()),
                _ => None,
            };
            Some((lifecycle.with(Stopping { parked }), vec![]))
        }
        // A dormant instance stays dormant in the records: its snapshot is
        // in the store.
        (Stopping { parked: Some(_) }, Event::ShutDown) => None,
        (Stopping { parked: None }, Event::ShutDown) => reported(lifecycle.with(Ended {
            status: InstanceStatus::Stopped,
            reason: "node agent shut down".to_owned(),
        })),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use InstanceStatus as S;

    fn snapshot(n: u8) -> SnapshotId {
        SnapshotId::from(format!("snap_{n}"))
    }

    fn op(n: u8) -> Option<OperationId> {
        Some(OperationId::from(format!("op_{n}")))
    }

    fn running() -> State {
        State::Running {
            endpoint: None,
            spent: None,
            note: None,
        }
    }

    fn dormant(n: u8) -> State {
        State::Dormant {
            snapshot: snapshot(n),
            note: None,
        }
    }

    fn at(state: State) -> Lifecycle {
        Lifecycle {
            state,
            operation: op(1),
        }
    }

    fn report(status: InstanceStatus, reason: Option<&str>) -> Effect {
        Effect::Report {
            status,
            reason: reason.map(str::to_owned),
            snapshot: None,
            operation: op(1),
            confirm: None,
        }
    }

    fn every_state() -> Vec<State> {
        vec![
            State::Starting,
            running(),
            State::Running {
                endpoint: None,
                spent: Some(snapshot(1)),
                note: Some("warned".into()),
            },
            State::Parking,
            dormant(1),
            State::Reviving {
                snapshot: snapshot(1),
            },
            State::Stopping { parked: None },
            State::Stopping {
                parked: Some(snapshot(1)),
            },
            State::Ended {
                status: S::Failed,
                reason: "gone".into(),
            },
        ]
    }

    /// Every row of the agent's table: from, event, to, effects.
    #[test]
    fn every_allowed_move_lands_where_the_table_says() {
        let gone = |status, reason: &str| State::Ended {
            status,
            reason: reason.into(),
        };
        let rows: Vec<(State, Event, State, Vec<Effect>)> = vec![
            // A create.
            (
                State::Starting,
                Event::Ready { endpoint: None },
                running(),
                vec![report(S::Running, None)],
            ),
            (
                State::Starting,
                Event::LaunchFailed {
                    reason: "no".into(),
                },
                gone(S::Failed, "no"),
                vec![report(S::Failed, Some("no")), Effect::Release],
            ),
            // Running.
            (
                running(),
                Event::Exited {
                    reason: "crashed".into(),
                },
                gone(S::Stopped, "crashed"),
                vec![report(S::Stopped, Some("crashed")), Effect::Release],
            ),
            (
                running(),
                Event::Failed {
                    reason: "disk".into(),
                },
                gone(S::Failed, "disk"),
                vec![report(S::Failed, Some("disk")), Effect::Release],
            ),
            (
                running(),
                Event::Warned {
                    reason: "oom".into(),
                },
                State::Running {
                    endpoint: None,
                    spent: None,
                    note: Some("oom".into()),
                },
                vec![report(S::Running, Some("oom"))],
            ),
            // A park, its success and its failure.
            (running(), Event::Park, State::Parking, vec![]),
            (
                State::Parking,
                Event::Parked {
                    snapshot: snapshot(2),
                },
                dormant(2),
                vec![Effect::Report {
                    status: S::Dormant,
                    reason: None,
                    snapshot: Some(snapshot(2)),
                    operation: op(1),
                    confirm: None,
                }],
            ),
            (
                State::Parking,
                Event::Ready { endpoint: None },
                running(),
                vec![],
            ),
            (
                State::Parking,
                Event::LaunchFailed {
                    reason: "restart".into(),
                },
                gone(S::Failed, "restart"),
                vec![report(S::Failed, Some("restart")), Effect::Release],
            ),
            // A revive and its outcomes.
            (
                dormant(1),
                Event::Revive {
                    operation: op(1),
                    woken: false,
                    from: None,
                },
                State::Reviving {
                    snapshot: snapshot(1),
                },
                vec![],
            ),
            // The control plane names the snapshot: that one is revived.
            (
                dormant(1),
                Event::Revive {
                    operation: op(1),
                    woken: false,
                    from: Some(snapshot(5)),
                },
                State::Reviving {
                    snapshot: snapshot(5),
                },
                vec![],
            ),
            (
                dormant(1),
                Event::Revive {
                    operation: op(1),
                    woken: true,
                    from: None,
                },
                State::Reviving {
                    snapshot: snapshot(1),
                },
                vec![report(S::Reviving, Some("woken by a connecting client"))],
            ),
            (
                State::Reviving {
                    snapshot: snapshot(1),
                },
                Event::Ready { endpoint: None },
                State::Running {
                    endpoint: None,
                    spent: Some(snapshot(1)),
                    note: None,
                },
                vec![Effect::Report {
                    status: S::Running,
                    reason: None,
                    snapshot: Some(snapshot(1)),
                    operation: op(1),
                    confirm: Some(snapshot(1)),
                }],
            ),
            (
                State::Reviving {
                    snapshot: snapshot(1),
                },
                Event::LaunchFailed {
                    reason: "bad".into(),
                },
                gone(S::Failed, "bad"),
                vec![report(S::Failed, Some("bad")), Effect::Release],
            ),
            (
                State::Reviving {
                    snapshot: snapshot(1),
                },
                Event::RevivePostponed {
                    reason: "store down".into(),
                },
                State::Dormant {
                    snapshot: snapshot(1),
                    note: Some("store down".into()),
                },
                vec![Effect::Report {
                    status: S::Dormant,
                    reason: Some("store down".into()),
                    snapshot: Some(snapshot(1)),
                    operation: op(1),
                    confirm: None,
                }],
            ),
            (
                State::Running {
                    endpoint: None,
                    spent: Some(snapshot(1)),
                    note: None,
                },
                Event::ReviveRecorded {
                    snapshot: snapshot(1),
                },
                running(),
                vec![],
            ),
            // Stopping, from anywhere but stopping.
            (
                running(),
                Event::Stop,
                State::Stopping { parked: None },
                vec![],
            ),
            (
                State::Starting,
                Event::Stop,
                State::Stopping { parked: None },
                vec![],
            ),
            (
                dormant(3),
                Event::Stop,
                State::Stopping {
                    parked: Some(snapshot(3)),
                },
                vec![],
            ),
            (
                State::Stopping { parked: None },
                Event::ShutDown,
                gone(S::Stopped, "node agent shut down"),
                vec![report(S::Stopped, Some("node agent shut down"))],
            ),
        ];
        for (from, event, to, effects) in rows {
            let row = format!("{from:?} --{event:?}-->");
            let (next, done) = transition(&at(from), event).unwrap_or_else(|| panic!("{row}"));
            assert_eq!(next.state, to, "{row}");
            assert_eq!(done, effects, "{row}");
        }
    }

    /// Only the moves in the table happen: every other pair of state and
    /// event leaves the instance as it is.
    #[test]
    fn every_other_move_changes_nothing() {
        let events = [
            Event::Ready { endpoint: None },
            Event::LaunchFailed { reason: "x".into() },
            Event::Exited { reason: "x".into() },
            Event::Warned { reason: "x".into() },
            Event::Failed { reason: "x".into() },
            Event::Park,
            Event::Parked {
                snapshot: snapshot(9),
            },
            Event::Revive {
                operation: op(2),
                woken: false,
                from: None,
            },
            Event::ReviveRefused { previous: op(3) },
            Event::RevivePostponed { reason: "x".into() },
            Event::ReviveRecorded {
                snapshot: snapshot(1),
            },
            Event::Stop,
            Event::ShutDown,
        ];
        let allowed = |state: &State, event: &Event| -> bool {
            use Event as E;
            use State::*;
            match (state, event) {
                (Starting, E::Ready { .. } | E::LaunchFailed { .. }) => true,
                (Reviving { .. }, E::Ready { .. } | E::LaunchFailed { .. }) => true,
                (Reviving { .. }, E::ReviveRefused { .. } | E::RevivePostponed { .. }) => true,
                (Parking, E::Ready { .. } | E::LaunchFailed { .. } | E::Parked { .. }) => true,
                (Running { .. }, E::Exited { .. } | E::Failed { .. } | E::Warned { .. }) => true,
                (Running { .. }, E::Park) => true,
                (Running { spent, .. }, E::ReviveRecorded { snapshot }) => {
                    spent.as_ref() == Some(snapshot)
                }
                (Dormant { .. }, E::Revive { .. }) => true,
                (Stopping { parked: None }, E::ShutDown) => true,
                (Stopping { .. } | Ended { .. }, _) => false,
                (_, E::Stop) => true,
                _ => false,
            }
        };
        for state in every_state() {
            for event in &events {
                let moved = transition(&at(state.clone()), event.clone()).is_some();
                assert_eq!(moved, allowed(&state, event), "{state:?} --{event:?}-->");
            }
        }
    }

    /// The rows only a crash or a race reaches.
    #[test]
    fn late_and_crossed_events_leave_the_instance_alone() {
        // A launch that finishes after a delete began is dropped (the delete
        // stops the browser), and so is its failure.
        let stopping = at(State::Stopping { parked: None });
        assert!(transition(&stopping, Event::Ready { endpoint: None }).is_none());
        assert!(transition(&stopping, Event::LaunchFailed { reason: "x".into() }).is_none());
        // The exit of a browser being parked or stopped is not a crash.
        for state in [State::Parking, State::Stopping { parked: None }] {
            assert!(transition(&at(state), Event::Exited { reason: "x".into() }).is_none());
        }
        // A disk limit noticed during a park does not stop it halfway.
        assert!(transition(&at(State::Parking), Event::Failed { reason: "x".into() }).is_none());
        // A second revive of an instance already reviving is refused (the
        // agent answers the first one's operation again).
        let reviving = at(State::Reviving {
            snapshot: snapshot(1),
        });
        let again = Event::Revive {
            operation: op(2),
            woken: false,
            from: None,
        };
        assert!(transition(&reviving, again).is_none());
        // An agent that restarted takes a parked instance back, and revives it.
        let (next, _) = transition(
            &Lifecycle::taken_back(snapshot(4)),
            Event::Revive {
                operation: op(5),
                woken: false,
                from: None,
            },
        )
        .expect("taken back, then revived");
        assert_eq!(
            next.state,
            State::Reviving {
                snapshot: snapshot(4)
            }
        );
        assert_eq!(next.operation, op(5));
        // A revive refused at once gives the instance back its operation.
        let (refused, effects) =
            transition(&next, Event::ReviveRefused { previous: op(1) }).expect("refused");
        assert_eq!(refused.state, dormant(4));
        assert_eq!(refused.operation, op(1));
        assert!(effects.is_empty());
        // The record of another revive does not free this one's snapshot.
        let revived = at(State::Running {
            endpoint: None,
            spent: Some(snapshot(1)),
            note: None,
        });
        assert!(
            transition(
                &revived,
                Event::ReviveRecorded {
                    snapshot: snapshot(2)
                }
            )
            .is_none()
        );
        // A dormant instance at shutdown stays dormant in the records.
        let parked = at(State::Stopping {
            parked: Some(snapshot(1)),
        });
        assert!(transition(&parked, Event::ShutDown).is_none());
        assert_eq!(parked.snapshot(), Some(&snapshot(1)));
    }

    #[test]
    fn each_state_reports_the_status_of_the_api() {
        let expected = [
            S::Creating,
            S::Running,
            S::Running,
            S::Running,
            S::Dormant,
            S::Reviving,
            S::Stopped,
            S::Stopped,
            S::Failed,
        ];
        for (state, status) in every_state().into_iter().zip(expected) {
            assert_eq!(at(state.clone()).status().0, status, "{state:?}");
        }
    }
}
