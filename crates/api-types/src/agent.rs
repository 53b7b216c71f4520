//! The internal API between the control plane and node agents.
//!
//! Control plane → agent: create and delete instances ([`AgentCreateInstance`],
//! answered with [`AgentInstancePorts`]). Agent → control plane: registration,
//! heartbeats carrying node and per-instance reports, and immediate state changes.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::credentials::Secret;
use crate::ids::{InstanceId, NodeId, OperationId, SnapshotId};
use crate::instances::{InstanceConfig, InstanceResources, InstanceStatus, ReviveMethod};
use crate::nodes::{Capabilities, ResourceUsage};
use crate::profiles::ProfileUse;

/// Ask an agent to start an instance.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentCreateInstance {
    pub id: InstanceId,
    pub image: String,
    pub config: InstanceConfig,
    /// The instance's access token: with authentication on, the instance's
    /// ports admit it (or an API key). Agents learn it only from here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access_token: Option<Secret>,
    /// The saved profile to start from (and to write back to with `persist`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<ProfileUse>,
    /// The engine that saved `profile` (none before its first save): the
    /// node refuses an image of another engine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile_engine: Option<String>,
    /// This create, as the node reports its outcome.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation: Option<OperationId>,
}

/// The ports an agent reserved for an instance, and its state right after the
/// create call (`running` when a warm browser was taken).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentInstancePorts {
    pub debug_port: u16,
    pub stream_port: u16,
    pub http_port: u16,
    pub status: InstanceStatus,
}

/// Ask an agent to park an instance: its answer once the snapshot is stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentDormantResult {
    pub snapshot_id: SnapshotId,
    pub dormant_since: DateTime<Utc>,
    /// Size of the archive in bytes.
    pub snapshot_bytes: u64,
}

/// Ask an agent to revive a dormant instance. The agent answers at once and
/// reports `running` (or `failed`) through its state changes. It may not hold the
/// instance any more (it restarted): image, config and the ports the instance
/// had let it take the instance back, on the same ports when they are free.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentReviveInstance {
    pub id: InstanceId,
    pub method: ReviveMethod,
    pub snapshot_id: SnapshotId,
    pub image: String,
    pub config: InstanceConfig,
    /// debug, stream, http.
    pub ports: Option<[u16; 3]>,
    /// The instance's access token (as in [`AgentCreateInstance`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access_token: Option<Secret>,
    /// The instance's profile (its state comes from the snapshot; with
    /// `persist` the next park or delete writes it back).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<ProfileUse>,
    /// This revive, as the node reports its outcome. A node asked twice for
    /// the same operation (a caller that timed out and asked again) answers
    /// as the first time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation: Option<OperationId>,
}

/// What the control plane tells an agent when it registers, and again in the
/// answer to every heartbeat (so that a changed key list reaches every node).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RegistrationAck {
    pub heartbeat_interval_sec: f64,
    #[serde(default)]
    pub instance_access: InstanceAccessPolicy,
    /// The control plane's [`PROTOCOL_VERSION`] (absent: [`PROTOCOL_VERSION_BEFORE`]).
    #[serde(default)]
    pub protocol_version: String,
}

/// The version of the protocol between node agents and control planes this
/// build speaks, `major.minor`. Sides one minor apart work together (a field
/// one side does not know is ignored, one it does not send is defaulted); a
/// different major is refused at registration, by both sides.
/// 1.1: the version exchange; 1.2: an agent drains its own node
/// (`/internal/v1/nodes/drain`) and drops instances revived elsewhere
/// (`/agent/v1/instances/{id}/forget`); 1.3: `EgressRefused` instance
/// events (an agent sends them only to a control plane of 1.3 or later).
pub const PROTOCOL_VERSION: &str = "1.3";
/// What a side that sends no version speaks: builds from before the field.
pub const PROTOCOL_VERSION_BEFORE: &str = "1.0";

/// The version a registration or an answer named (`""`: before the field).
pub fn protocol_version_or_before(version: &str) -> &str {
    if version.is_empty() {
        PROTOCOL_VERSION_BEFORE
    } else {
        version
    }
}

/// Why two sides cannot work together; the message says what to do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolMismatch {
    #[error("protocol version {theirs:?} is not major.minor (this side speaks {ours})")]
    Unreadable { ours: String, theirs: String },
    #[error(
        "protocol {theirs} cannot work with protocol {ours} (a major version apart): upgrade the older side first; agents and control planes one minor version apart work together"
    )]
    MajorApart { ours: String, theirs: String },
}

/// Whether a side speaking `ours` may work with one speaking `theirs`: the
/// same major version.
pub fn protocols_meet(ours: &str, theirs: &str) -> Result<(), ProtocolMismatch> {
    let major = |version: &str| -> Option<u32> {
        let (major, minor) = version.split_once('.')?;
        minor.parse::<u32>().ok()?;
        major.parse().ok()
    };
    let theirs = protocol_version_or_before(theirs);
    let (ours_text, theirs_text) = (ours.to_owned(), theirs.to_owned());
    match (major(ours), major(theirs)) {
        (Some(a), Some(b)) if a == b => Ok(()),
        (_, None) => Err(ProtocolMismatch::Unreadable {
            ours: ours_text,
            theirs: theirs_text,
        }),
        _ => Err(ProtocolMismatch::MajorApart {
            ours: ours_text,
            theirs: theirs_text,
        }),
    }
}

/// Whether a side of protocol `theirs` (`""`: before the field) is of the
/// same major as `minimum` and at least its minor.
pub fn protocol_at_least(theirs: &str, minimum: &str) -> bool {
    let parse = |version: &str| -> Option<(u32, u32)> {
        let (major, minor) = version.split_once('.')?;
        Some((major.parse().ok()?, minor.parse().ok()?))
    };
    match (parse(protocol_version_or_before(theirs)), parse(minimum)) {
        (Some((major, minor)), Some((want_major, want_minor))) => {
            major == want_major && minor >= want_minor
        }
        _ => false,
    }
}

impl RegistrationAck {
    pub fn heartbeat_interval(&self) -> std::time::Duration {
        std::time::Duration::from_secs_f64(self.heartbeat_interval_sec.max(0.05))
    }
}

/// Who may use instance ports: when `auth_enabled`, a request needs an API key
/// (one of `api_key_sha256`, hex SHA-256 digests) or the instance's own token.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct InstanceAccessPolicy {
    pub auth_enabled: bool,
    #[serde(default)]
    pub api_key_sha256: Vec<String>,
}

/// Something an instance did that is not a change of state (sent in order
/// with the state changes).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InstanceEventReport {
    pub node_id: NodeId,
    pub id: InstanceId,
    pub event: InstanceEventKind,
    pub at: DateTime<Utc>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum InstanceEventKind {
    /// A file finished downloading into the instance's downloads.
    DownloadCompleted { name: String, size_bytes: u64 },
    /// The instance's state was written back to its persistent profile
    /// (graceful delete or park with `profile.persist`).
    ProfileSaved {
        name: String,
        size_bytes: u64,
        /// The engine whose browser saved it (absent from older agents).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        engine: Option<String>,
    },
    /// The instance's Playwright server of `version` ended on its own while
    /// its browser ran (`reason`: its exit and last log lines); the next
    /// connection starts a new one.
    PlaywrightServerExited { version: String, reason: String },
    /// The egress policy refused the browser a destination (`destination`:
    /// what the page asked for, `host:port`; `reason`: why, naming the
    /// address). Once per destination per instance (protocol 1.3).
    EgressRefused { destination: String, reason: String },
}

/// An agent's request about its own node's drain (`drain_on_shutdown`):
/// `POST /internal/v1/nodes/drain` starts it, `POST
/// /internal/v1/nodes/drain/report` reads it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeDrainRequest {
    pub node_id: NodeId,
}

/// Whether nodes whose agents name snapshot stores `a` and `b` share one
/// (an agent from before the field names none: it is given the benefit of
/// the doubt).
pub fn snapshot_stores_shared(a: &str, b: &str) -> bool {
    a.is_empty() || b.is_empty() || a == b
}

/// Who answers at an agent's address (`GET /agent/v1/identity`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentIdentity {
    pub node_id: NodeId,
    pub generation: String,
    pub address: String,
}

/// What an agent knows of one of its instances.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InstanceReport {
    pub id: InstanceId,
    pub status: InstanceStatus,
    pub reason: Option<String>,
    pub resources: InstanceResources,
    pub last_activity: DateTime<Utc>,
    /// A parked instance's snapshot: lets a control plane that missed the
    /// park's answer (it crashed meanwhile) record it when it reconciles.
    #[serde(default)]
    pub snapshot_id: Option<SnapshotId>,
    /// The operation the node is carrying out on the instance (`creating`,
    /// `reviving`), or the one that brought it to this state: a control
    /// plane that restarted waits for an operation still in flight instead
    /// of undoing it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation: Option<OperationId>,
    /// The clients the node serves the instance now (an older agent sends
    /// none: all zero).
    #[serde(default)]
    pub clients: NodeClients,
}

/// The clients a node serves one instance now: open DevTools and Playwright
/// connections on its ports, and REST actions running on it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeClients {
    pub cdp: u32,
    pub playwright: u32,
    pub actions: u32,
}

/// Sent by an agent when it starts, and again whenever the control plane
/// does not know it (e.g. after a control-plane restart).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeRegistration {
    pub node_id: NodeId,
    /// Random per agent process: tells a restart of the node (a new
    /// generation while the old one is silent) from a second agent that took
    /// the same node id (both answer).
    #[serde(default)]
    pub generation: String,
    /// The agent API's address, `<scheme>://<host>:<port>`.
    pub address: String,
    /// Host that clients use to reach the instances' ports on this node.
    pub public_host: String,
    pub max_instances: i64,
    pub capabilities: Capabilities,
    pub images: Vec<String>,
    pub resources: ResourceUsage,
    /// Utilisation averaged over about a minute (what placement decisions use).
    #[serde(default)]
    pub load: ResourceUsage,
    pub instances: Vec<InstanceReport>,
    /// Why the node runs with less isolation than configured (no cgroups, no
    /// sandbox); the node is then reported degraded.
    #[serde(default)]
    pub warnings: Vec<String>,
    /// The version of the node's Chromium (`156.0.8078.108`; WebDriver's
    /// `browserVersion`), when it runs real browsers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub browser_version: Option<String>,
    /// The agent's [`PROTOCOL_VERSION`] (absent: [`PROTOCOL_VERSION_BEFORE`]).
    #[serde(default)]
    pub protocol_version: String,
    /// The snapshot store its agent parks instances in:
    /// `file://<host><path>` or `s3://<bucket>/<prefix>[@<endpoint>]`
    /// (`""`: from before the field).
    /// An instance parked on one node revives on another only when both
    /// name the same store.
    #[serde(default)]
    pub snapshot_store: String,
}

/// Periodic report of an agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Heartbeat {
    pub node_id: NodeId,
    /// The sender's generation (see [`NodeRegistration::generation`]).
    #[serde(default)]
    pub generation: String,
    pub resources: ResourceUsage,
    /// Utilisation averaged over about a minute.
    #[serde(default)]
    pub load: ResourceUsage,
    pub instances: Vec<InstanceReport>,
    /// The node's first warm pool, for a control plane that reads only one
    /// (an older agent sends none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warm_pool: Option<WarmPoolReport>,
    /// Every warm pool of the node, one per image (an older agent sends
    /// only `warm_pool`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warm_pools: Vec<WarmPoolReport>,
    /// What the agent's loops did, run by run: `heartbeat`, `state change`,
    /// `wake`, `warm pool refill` (an older agent sends none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub loops: Vec<crate::health::BackgroundTaskHealth>,
}

impl Heartbeat {
    /// The node's warm pools, from an agent of this version or an older one.
    pub fn reported_pools(&self) -> Vec<WarmPoolReport> {
        if self.warm_pools.is_empty() {
            self.warm_pool.iter().cloned().collect()
        } else {
            self.warm_pools.clone()
        }
    }
}

/// A node's warm pool of one image as its agent counts it: browsers ready
/// now, how many creates for that image took one (hits) or launched a
/// browser of their own (misses: the pool was empty, or the create's shape
/// is not the pool's: a profile, extensions, preferences), and the same for
/// revives (a miss: the pool was empty, or the snapshot holds what only its
/// files carry).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WarmPoolReport {
    /// The image the pool serves.
    pub image: String,
    pub ready: u64,
    pub hits: u64,
    pub misses: u64,
    /// Absent from an older agent's report.
    #[serde(default)]
    pub revive_hits: u64,
    #[serde(default)]
    pub revive_misses: u64,
}

/// An instance changed state on its node (sent as it happens).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InstanceStateChange {
    pub node_id: NodeId,
    pub id: InstanceId,
    pub status: InstanceStatus,
    pub reason: Option<String>,
    pub at: DateTime<Utc>,
    /// With `dormant` after a park: its snapshot. The park's own answer
    /// records it too; this copy reaches a control plane that missed it.
    /// With `running` after a revive: the snapshot it revived from.
    #[serde(default)]
    pub snapshot_id: Option<SnapshotId>,
    /// The operation whose outcome this is (a create or a revive), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation: Option<OperationId>,
}

/// The control plane's answer to a state change: whether it recorded it. A
/// change of an operation the record has moved past (the control plane
/// undid it, or started another) is not recorded; then the node keeps what
/// the record may still need (the snapshot a revive came from).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateChangeAck {
    pub applied: bool,
}

#[cfg(test)]
mod protocol_tests {
    use super::*;

    #[test]
    fn sides_of_one_major_version_meet() {
        assert_eq!(protocols_meet("1.1", "1.0"), Ok(()));
        assert_eq!(protocols_meet("1.1", "1.9"), Ok(()));
        assert_eq!(protocols_meet("1.1", ""), Ok(()), "before the field: 1.0");
        let apart = protocols_meet("1.1", "2.0").unwrap_err().to_string();
        assert!(
            apart.contains("protocol 2.0") && apart.contains("1.1"),
            "{apart}"
        );
        assert!(protocols_meet("2.0", "1.1").is_err());
        for garbled in ["1", "x.y", "1.x", "1.1.1", " 1.1"] {
            assert!(protocols_meet("1.1", garbled).is_err(), "{garbled}");
        }
        assert_eq!(protocol_version_or_before(""), PROTOCOL_VERSION_BEFORE);
        // Who takes `EgressRefused` events: 1.3 and later minors of 1.
        assert!(protocol_at_least("1.3", "1.3"));
        assert!(protocol_at_least("1.10", "1.3"));
        assert!(!protocol_at_least("1.2", "1.3"));
        assert!(
            !protocol_at_least("", "1.3"),
            "a build from before the field"
        );
        assert!(!protocol_at_least("2.0", "1.3"), "another major");
        assert!(!protocol_at_least("x", "1.3"));
        assert_eq!(protocol_version_or_before("1.3"), "1.3");
    }
}
