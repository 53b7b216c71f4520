//! Lifecycle events: their names and the payload sent to webhooks and published
//! on the event proxy (`{event, timestamp, data}`; spec: Events).

use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, SecondsFormat, Utc};
use serde::{Deserialize, Serialize};

use crate::instances::InstanceStatus;
use crate::names::UnknownName;

/// Every event the control plane emits: the spec's three and DESIGN.md's others.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum EventName {
    #[serde(rename = "instance.created")]
    InstanceCreated,
    #[serde(rename = "instance.deleted")]
    InstanceDeleted,
    #[serde(rename = "instance.dormant")]
    InstanceDormant,
    #[serde(rename = "instance.running")]
    InstanceRunning,
    #[serde(rename = "instance.idle")]
    InstanceIdle,
    #[serde(rename = "instance.revived")]
    InstanceRevived,
    #[serde(rename = "instance.failed")]
    InstanceFailed,
    #[serde(rename = "instance.stopped")]
    InstanceStopped,
    /// A download finished (`data.name`, `data.size_bytes`).
    #[serde(rename = "instance.download_completed")]
    InstanceDownloadCompleted,
    /// `config.max_duration_minutes` was reached (an `instance.deleted` follows).
    #[serde(rename = "instance.expired")]
    InstanceExpired,
    /// The instance's Playwright server ended on its own (`data.version`,
    /// `data.reason`); the next `chromium.connect()` starts a new one.
    #[serde(rename = "instance.playwright_server_exited")]
    InstancePlaywrightServerExited,
    /// A drain moved the instance to another node (`data.from_node`,
    /// `data.to_node`).
    #[serde(rename = "instance.moved")]
    InstanceMoved,
    /// The node's egress policy refused the browser a destination
    /// (`data.destination`, `data.reason`, `data.setting`): once per
    /// destination per instance.
    #[serde(rename = "instance.egress_refused")]
    InstanceEgressRefused,
    #[serde(rename = "node.offline")]
    NodeOffline,
    #[serde(rename = "node.online")]
    NodeOnline,
    #[serde(rename = "alert.raised")]
    AlertRaised,
    #[serde(rename = "alert.cleared")]
    AlertCleared,
}

impl EventName {
    pub const ALL: [EventName; 17] = [
        Self::InstanceCreated,
        Self::InstanceDeleted,
        Self::InstanceDormant,
        Self::InstanceRunning,
        Self::InstanceIdle,
        Self::InstanceRevived,
        Self::InstanceFailed,
        Self::InstanceStopped,
        Self::InstanceExpired,
        Self::InstanceDownloadCompleted,
        Self::InstancePlaywrightServerExited,
        Self::InstanceMoved,
        Self::InstanceEgressRefused,
        Self::NodeOffline,
        Self::NodeOnline,
        Self::AlertRaised,
        Self::AlertCleared,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::InstanceCreated => "instance.created",
            Self::InstanceDeleted => "instance.deleted",
            Self::InstanceDormant => "instance.dormant",
            Self::InstanceRunning => "instance.running",
            Self::InstanceIdle => "instance.idle",
            Self::InstanceRevived => "instance.revived",
            Self::InstanceFailed => "instance.failed",
            Self::InstanceStopped => "instance.stopped",
            Self::InstanceExpired => "instance.expired",
            Self::InstanceDownloadCompleted => "instance.download_completed",
            Self::InstancePlaywrightServerExited => "instance.playwright_server_exited",
            Self::InstanceMoved => "instance.moved",
            Self::InstanceEgressRefused => "instance.egress_refused",
            Self::NodeOffline => "node.offline",
            Self::NodeOnline => "node.online",
            Self::AlertRaised => "alert.raised",
            Self::AlertCleared => "alert.cleared",
        }
    }

    /// The event an instance's move from `from` to `to` announces, if any.
    /// A revive that rolls back to `dormant` announces nothing (nothing changed
    /// for the subscriber); `reviving` itself is announced by the `revived` or
    /// `failed` that ends it.
    pub fn for_transition(from: InstanceStatus, to: InstanceStatus) -> Option<EventName> {
        use InstanceStatus::*;
        match (from, to) {
            // A note on an unchanged state (e.g. the memory limit was hit).
            (from, to) if from == to => None,
            (Reviving, Running) => Some(Self::InstanceRevived),
            (_, Running) => Some(Self::InstanceRunning),
            (_, Idle) => Some(Self::InstanceIdle),
            (Reviving, Dormant) => None,
            (_, Dormant) => Some(Self::InstanceDormant),
            (_, Failed) => Some(Self::InstanceFailed),
            (_, Stopped) => Some(Self::InstanceStopped),
            (_, Creating) | (_, Reviving) => None,
        }
    }
}

impl fmt::Display for EventName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for EventName {
    type Err = UnknownName;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|name| name.as_str() == s)
            .ok_or_else(|| UnknownName::new("event", s).listing(Self::ALL.map(EventName::as_str)))
    }
}

/// The body of a webhook call and of an event published on the proxy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EventPayload {
    pub event: EventName,
    /// ISO 8601, UTC.
    pub timestamp: String,
    pub data: serde_json::Map<String, serde_json::Value>,
}

impl EventPayload {
    pub fn new(
        event: EventName,
        at: DateTime<Utc>,
        data: serde_json::Map<String, serde_json::Value>,
    ) -> Self {
        Self {
            event,
            timestamp: at.to_rfc3339_opts(SecondsFormat::Millis, true),
            data,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for name in EventName::ALL {
            assert_eq!(name.as_str().parse::<EventName>().unwrap(), name);
            assert_eq!(
                serde_json::to_value(name).unwrap(),
                serde_json::json!(name.as_str())
            );
        }
        assert!("instance.exploded".parse::<EventName>().is_err());
    }

    #[test]
    fn transitions_name_their_event() {
        use InstanceStatus::*;
        assert_eq!(
            EventName::for_transition(Reviving, Running),
            Some(EventName::InstanceRevived)
        );
        assert_eq!(
            EventName::for_transition(Creating, Running),
            Some(EventName::InstanceRunning)
        );
        assert_eq!(EventName::for_transition(Reviving, Dormant), None);
        assert_eq!(
            EventName::for_transition(Running, Dormant),
            Some(EventName::InstanceDormant)
        );
    }
}
