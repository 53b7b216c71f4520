//! The instance lifecycle (DESIGN.md, Lifecycle) as one table: which event
//! moves an instance from which status to which. Every handler, background
//! sweep and reconciliation asks [`transition`] (or [`sources`], for the
//! store's compare-and-set); no list of allowed source states is written
//! anywhere else. The table is data, tested row by row.

use flotilla_api_types::instances::InstanceStatus::{self, *};

/// What happens to an instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// A create's browser answers CDP (or a create whose answer was lost runs).
    Started,
    /// A launch or a revive failed, or timed out.
    LaunchFailed,
    /// No CDP or live-view activity for `idle_timeout_minutes`.
    IdleTimeout,
    /// Activity on an idle instance.
    Active,
    /// Its node parked it (`POST …/dormant`, `auto_snapshot`, or a park whose
    /// answer a restarted control plane learns from the node).
    Parked,
    /// `POST …/revive`: from `dormant`, or from `failed` or `stopped` when a
    /// snapshot was kept (the caller checks that it was).
    Revive,
    /// A client connected to a parked instance and its node woke it.
    Woken,
    /// The revived browser answers CDP.
    Revived,
    /// A revive that did not start (its node refused or never got it, or
    /// cannot read the snapshot store): back to the state it left.
    ReviveUndone(InstanceStatus),
    /// A revive finished on its node after the control plane had undone it
    /// (it learnt of it too late): the node's running browser, revived from
    /// the record's own snapshot, is the instance.
    RevivedLate,
    /// The browser exited on its own (`stopped`) or its node stopped it on a
    /// limit or a failed start (`failed`).
    Ended(InstanceStatus),
    /// Its node was declared offline.
    NodeLost,
    /// Its node restarted and no longer runs it.
    Lost,
    /// Given up for lost (failed or stopped), yet its node still runs it.
    Adopted,
}

/// One row: `event` moves an instance in one of `from` to `to`.
struct Row {
    event: Event,
    from: &'static [InstanceStatus],
    to: InstanceStatus,
}

const ACTIVE: &[InstanceStatus] = &InstanceStatus::ACTIVE;

/// The lifecycle. Deleting is possible from any status and removes the
/// record; it is not a move between statuses, so it has no row.
const TABLE: &[Row] = &[
    Row {
        event: Event::Started,
        from: &[Creating],
        to: Running,
    },
    Row {
        event: Event::LaunchFailed,
        from: &[Creating, Reviving],
        to: Failed,
    },
    Row {
        event: Event::IdleTimeout,
        from: &[Running],
        to: Idle,
    },
    Row {
        event: Event::Active,
        from: &[Idle],
        to: Running,
    },
    Row {
        event: Event::Parked,
        from: &[Running, Idle],
        to: Dormant,
    },
    Row {
        event: Event::Revive,
        from: &[Dormant, Failed, Stopped],
        to: Reviving,
    },
    Row {
        event: Event::Woken,
        from: &[Dormant],
        to: Reviving,
    },
    Row {
        event: Event::Revived,
        from: &[Reviving],
        to: Running,
    },
    Row {
        event: Event::ReviveUndone(Dormant),
        from: &[Reviving],
        to: Dormant,
    },
    Row {
        event: Event::ReviveUndone(Failed),
        from: &[Reviving],
        to: Failed,
    },
    Row {
        event: Event::ReviveUndone(Stopped),
        from: &[Reviving],
        to: Stopped,
    },
    Row {
        event: Event::RevivedLate,
        from: &[Dormant],
        to: Running,
    },
    Row {
        event: Event::Ended(Stopped),
        from: ACTIVE,
        to: Stopped,
    },
    Row {
        event: Event::Ended(Failed),
        from: ACTIVE,
        to: Failed,
    },
    Row {
        event: Event::NodeLost,
        from: ACTIVE,
        to: Failed,
    },
    Row {
        event: Event::Lost,
        from: &[Creating, Reviving],
        to: Failed,
    },
    Row {
        event: Event::Lost,
        from: &[Running, Idle],
        to: Stopped,
    },
    Row {
        event: Event::Adopted,
        from: &[Failed, Stopped],
        to: Running,
    },
];

/// Where `event` takes an instance that is `from`; `None` when the table
/// has no such move (the caller answers 409, or ignores a stale report).
pub fn transition(from: InstanceStatus, event: Event) -> Option<InstanceStatus> {
    TABLE
        .iter()
        .find(|row| row.event == event && row.from.contains(&from))
        .map(|row| row.to)
}

/// Every status `event` may move an instance from (for the store's
/// compare-and-set).
pub fn sources(event: Event) -> Vec<InstanceStatus> {
    let mut from = Vec::new();
    for row in TABLE.iter().filter(|row| row.event == event) {
        for status in row.from {
            if !from.contains(status) {
                from.push(*status);
            }
        }
    }
    from
}

/// `a, b or c`: the sources of `event`, for a refusal's message.
pub fn sources_text(event: Event) -> String {
    let names: Vec<&str> = sources(event).into_iter().map(|s| s.as_str()).collect();
    match names.split_last() {
        None => String::new(),
        Some((last, [])) => (*last).to_owned(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every row of DESIGN.md's lifecycle table (and the rows only a crash or
    /// a lost answer reaches), as (from, event, to).
    #[test]
    fn every_row_of_the_lifecycle() {
        let rows = [
            (Creating, Event::Started, Some(Running)),
            (Creating, Event::LaunchFailed, Some(Failed)),
            (Reviving, Event::LaunchFailed, Some(Failed)),
            (Running, Event::IdleTimeout, Some(Idle)),
            (Idle, Event::Active, Some(Running)),
            (Idle, Event::Parked, Some(Dormant)),
            (Running, Event::Parked, Some(Dormant)),
            (Dormant, Event::Revive, Some(Reviving)),
            (Failed, Event::Revive, Some(Reviving)),
            (Stopped, Event::Revive, Some(Reviving)),
            (Dormant, Event::Woken, Some(Reviving)),
            (Reviving, Event::Revived, Some(Running)),
            (Running, Event::Ended(Stopped), Some(Stopped)),
            (Idle, Event::Ended(Stopped), Some(Stopped)),
            (Creating, Event::Ended(Failed), Some(Failed)),
            (Reviving, Event::Ended(Failed), Some(Failed)),
            (Running, Event::NodeLost, Some(Failed)),
            (Creating, Event::NodeLost, Some(Failed)),
            (Reviving, Event::NodeLost, Some(Failed)),
            (Idle, Event::NodeLost, Some(Failed)),
            // Only a crash or a lost answer reaches these.
            (Reviving, Event::ReviveUndone(Dormant), Some(Dormant)),
            (Reviving, Event::ReviveUndone(Failed), Some(Failed)),
            (Reviving, Event::ReviveUndone(Stopped), Some(Stopped)),
            (Dormant, Event::RevivedLate, Some(Running)),
            (Creating, Event::Lost, Some(Failed)),
            (Reviving, Event::Lost, Some(Failed)),
            (Running, Event::Lost, Some(Stopped)),
            (Idle, Event::Lost, Some(Stopped)),
            (Failed, Event::Adopted, Some(Running)),
            (Stopped, Event::Adopted, Some(Running)),
        ];
        for (from, event, to) in rows {
            assert_eq!(transition(from, event), to, "{from} --{event:?}-->");
        }
    }

    /// DESIGN.md: dormant from creating, reviving, dormant, failed or stopped
    /// is 409; revive from anything but dormant (or failed/stopped with a
    /// snapshot) is 409; nothing leaves a dormant instance but a revive, a
    /// wake or a late revive; an ended instance moves only when revived or
    /// adopted.
    #[test]
    fn what_the_table_refuses() {
        for from in [Creating, Reviving, Dormant, Failed, Stopped] {
            assert_eq!(transition(from, Event::Parked), None, "park from {from}");
        }
        for from in [Creating, Running, Idle, Reviving] {
            assert_eq!(transition(from, Event::Revive), None, "revive from {from}");
        }
        for event in [
            Event::Started,
            Event::IdleTimeout,
            Event::Active,
            Event::Parked,
            Event::Revived,
            Event::Ended(Stopped),
            Event::NodeLost,
            Event::Lost,
            Event::Adopted,
        ] {
            assert_eq!(transition(Dormant, event), None, "{event:?} from dormant");
        }
        for from in [Failed, Stopped] {
            for event in [
                Event::Started,
                Event::Ended(Failed),
                Event::NodeLost,
                Event::Lost,
            ] {
                assert_eq!(transition(from, event), None, "{event:?} from {from}");
            }
        }
        assert_eq!(transition(Running, Event::Started), None);
        assert_eq!(transition(Running, Event::ReviveUndone(Dormant)), None);
        assert_eq!(transition(Reviving, Event::ReviveUndone(Running)), None);
    }

    #[test]
    fn sources_come_from_the_table() {
        assert_eq!(sources(Event::Parked), vec![Running, Idle]);
        assert_eq!(
            sources(Event::Lost),
            vec![Creating, Reviving, Running, Idle]
        );
        assert_eq!(
            sources(Event::Ended(Failed)),
            InstanceStatus::ACTIVE.to_vec()
        );
        assert_eq!(sources_text(Event::Parked), "running or idle");
        assert_eq!(sources_text(Event::Revive), "dormant, failed or stopped");
    }
}
