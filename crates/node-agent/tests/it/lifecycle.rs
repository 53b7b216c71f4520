//! The agent's lifecycle on its own, without a control plane or a browser:
//! the sim runtime and a fake control plane that records what the agent
//! reports. Create, park, revive and delete in order, each asked twice (a
//! caller that timed out asks again), and the refusals of the states that
//! do not allow them.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use flotilla_api_types::agent::{
    AgentCreateInstance, AgentReviveInstance, Heartbeat, InstanceEventReport, InstanceStateChange,
    NodeRegistration, RegistrationAck, StateChangeAck,
};
use flotilla_api_types::clock::SystemClock;
use flotilla_api_types::ids::{OperationId, SnapshotId};
use flotilla_api_types::instances::{InstanceConfig, InstanceStatus, ReviveMethod};
use flotilla_api_types::nodes::DrainReport;
use flotilla_api_types::{InstanceId, NodeId};
use flotilla_node_agent::snapshot::{SnapshotStore, SnapshotsConfig};
use flotilla_node_agent::{
    Agent, AgentConfig, AgentError, AgentSettings, ControlPlaneLink, LinkError, RuntimeKind,
};
use flotilla_testkit::wait_until;

/// Takes every registration and records every state change.
#[derive(Default)]
struct FakeControlPlane {
    changes: Mutex<Vec<InstanceStateChange>>,
    /// The loops of the last heartbeat.
    loops: Mutex<Vec<flotilla_api_types::health::BackgroundTaskHealth>>,
}

fn ack() -> RegistrationAck {
    RegistrationAck {
        heartbeat_interval_sec: 0.2,
        instance_access: Default::default(),
        protocol_version: flotilla_api_types::agent::PROTOCOL_VERSION.into(),
    }
}

#[async_trait]
impl ControlPlaneLink for FakeControlPlane {
    async fn register(&self, _: NodeRegistration) -> Result<RegistrationAck, LinkError> {
        Ok(ack())
    }

    async fn heartbeat(&self, heartbeat: Heartbeat) -> Result<RegistrationAck, LinkError> {
        *self.loops.lock().unwrap() = heartbeat.loops;
        Ok(ack())
    }

    async fn state_changed(
        &self,
        change: InstanceStateChange,
    ) -> Result<StateChangeAck, LinkError> {
        self.changes.lock().unwrap().push(change);
        Ok(StateChangeAck { applied: true })
    }

    async fn instance_event(&self, _: InstanceEventReport) -> Result<(), LinkError> {
        Ok(())
    }

    async fn drain(&self, _: &NodeId) -> Result<DrainReport, LinkError> {
        Err(LinkError::Refused(
            "this test's control plane drains nothing".into(),
        ))
    }

    async fn drain_report(&self, _: &NodeId) -> Result<Option<DrainReport>, LinkError> {
        Ok(None)
    }
}

impl FakeControlPlane {
    /// Waits for the agent to report `status` for `id` (of `operation`,
    /// when given); the change.
    async fn reported(
        &self,
        id: &InstanceId,
        status: InstanceStatus,
        operation: Option<&OperationId>,
    ) -> InstanceStateChange {
        let what = format!("{id} reported {status}");
        wait_until(Duration::from_secs(30), &what, || async {
            let changes = self.changes.lock().unwrap();
            let found = changes.iter().find(|change| {
                &change.id == id
                    && change.status == status
                    && operation
                        .is_none_or(|operation| change.operation.as_ref() == Some(operation))
            });
            Ok::<_, String>(found.cloned())
        })
        .await
        .unwrap()
    }

    fn count(&self, id: &InstanceId, status: InstanceStatus) -> usize {
        let changes = self.changes.lock().unwrap();
        changes
            .iter()
            .filter(|change| &change.id == id && change.status == status)
            .count()
    }
}

async fn sim_agent(dir: &std::path::Path, link: Arc<FakeControlPlane>) -> Agent {
    sim_agent_with(dir, link, |_| {}).await
}

async fn sim_agent_with(
    dir: &std::path::Path,
    link: Arc<FakeControlPlane>,
    adjust: impl FnOnce(&mut AgentConfig),
) -> Agent {
    let mut config = AgentConfig {
        runtime: RuntimeKind::Sim,
        node_id: Some("sim-node".into()),
        max_instances: 4,
        warm_pool_size: 0,
        sim_start_ms: 20,
        ..AgentConfig::default()
    };
    adjust(&mut config);
    let settings = AgentSettings {
        config,
        data_dir: dir.join("agent"),
        address: "http://127.0.0.1:9".into(),
        public_host: "127.0.0.1".into(),
        bind_address: std::net::Ipv4Addr::LOCALHOST,
        snapshots: SnapshotStore::open(&SnapshotsConfig::default(), &dir.join("snapshots"))
            .unwrap(),
        clock: Arc::new(SystemClock),
        listeners: flotilla_net::Listeners::new(
            &flotilla_net::ListenerLimits::default(),
            flotilla_net::Runs::Browsers,
        ),
    };
    Agent::start(settings, link).await.unwrap()
}

/// Asserts that the agent holds nothing of `id` any more: no slot (no
/// report), no directory.
fn assert_gone(agent: &Agent, dir: &std::path::Path, id: &InstanceId, when: &str) {
    assert!(
        agent
            .instance_reports()
            .iter()
            .all(|report| &report.id != id),
        "{when}: the agent still reports {id}"
    );
    assert!(
        !dir.join("agent/instances").join(id.as_str()).exists(),
        "{when}: its directory goes"
    );
}

/// The agent's heartbeats carry what its loops did: its heartbeats, and
/// the state changes it delivered (an instance's start, here).
#[tokio::test]
async fn heartbeats_tell_what_the_agents_loops_did() {
    let dir = tempfile::tempdir().unwrap();
    let control_plane = Arc::new(FakeControlPlane::default());
    let agent = sim_agent(dir.path(), control_plane.clone()).await;
    running(&agent, &control_plane).await;
    wait_until(
        Duration::from_secs(30),
        "a heartbeat telling its loops",
        || async {
            let loops = control_plane.loops.lock().unwrap().clone();
            let named = |name: &str| loops.iter().find(|run| run.name == name).cloned();
            let told = named("heartbeat").is_some_and(|run| run.runs >= 1 && !run.failing)
                && named("state change").is_some_and(|run| run.changed >= 1 && !run.failing);
            Ok::<_, String>(told.then_some(()))
        },
    )
    .await
    .unwrap();
    agent.shutdown().await;
}

/// A new instance, once its agent has reported it running.
async fn running(agent: &Agent, control_plane: &FakeControlPlane) -> InstanceId {
    let id = InstanceId::generate();
    let created = OperationId::generate();
    agent
        .instance_create(create_request(&id, &created))
        .await
        .unwrap();
    control_plane
        .reported(&id, InstanceStatus::Running, Some(&created))
        .await;
    id
}

/// A create of `id` on the default image, as `operation`.
fn create_request(id: &InstanceId, operation: &OperationId) -> AgentCreateInstance {
    AgentCreateInstance {
        id: id.clone(),
        image: "ubuntu:22.04".into(),
        config: InstanceConfig::default(),
        access_token: None,
        profile: None,
        profile_engine: None,
        operation: Some(operation.clone()),
    }
}

/// A `quick_start` revive of `id` from `snapshot`, as `operation`, on any
/// free ports.
fn revive_request(
    id: &InstanceId,
    snapshot: &SnapshotId,
    operation: &OperationId,
) -> AgentReviveInstance {
    AgentReviveInstance {
        id: id.clone(),
        method: ReviveMethod::QuickStart,
        snapshot_id: snapshot.clone(),
        image: "ubuntu:22.04".into(),
        config: InstanceConfig::default(),
        ports: None,
        access_token: None,
        profile: None,
        operation: Some(operation.clone()),
    }
}

#[tokio::test]
async fn an_instance_goes_through_its_life_and_each_request_may_come_twice() {
    let dir = tempfile::tempdir().unwrap();
    let control_plane = Arc::new(FakeControlPlane::default());
    let agent = sim_agent(dir.path(), control_plane.clone()).await;
    let id = InstanceId::generate();

    // Create, twice: the second answers the first's ports and starts nothing.
    let created = OperationId::generate();
    let create = create_request(&id, &created);
    let ports = agent.instance_create(create.clone()).await.unwrap();
    assert_eq!(agent.instance_create(create).await.unwrap(), ports);
    control_plane
        .reported(&id, InstanceStatus::Running, Some(&created))
        .await;
    assert_eq!(control_plane.count(&id, InstanceStatus::Running), 1);

    // Park; a second park finds it dormant and is refused, naming why.
    let parked = agent.instance_dormant(&id).await.unwrap();
    let change = control_plane
        .reported(&id, InstanceStatus::Dormant, None)
        .await;
    assert_eq!(change.snapshot_id.as_ref(), Some(&parked.snapshot_id));
    let again = agent.instance_dormant(&id).await;
    assert!(
        matches!(
            again,
            Err(AgentError::NotRunning {
                status: InstanceStatus::Dormant,
                ..
            })
        ),
        "{again:?}"
    );

    // Revive, twice with the same operation: one revive, one answer.
    let revived = OperationId::generate();
    let revive = |operation: &OperationId, snapshot: &SnapshotId| AgentReviveInstance {
        ports: Some([ports.debug_port, ports.stream_port, ports.http_port]),
        ..revive_request(&id, snapshot, operation)
    };
    let first = agent
        .instance_revive(revive(&revived, &parked.snapshot_id))
        .await
        .unwrap();
    let second = agent
        .instance_revive(revive(&revived, &parked.snapshot_id))
        .await
        .unwrap();
    assert_eq!(
        (first.debug_port, first.stream_port, first.http_port),
        (second.debug_port, second.stream_port, second.http_port)
    );
    let change = control_plane
        .reported(&id, InstanceStatus::Running, Some(&revived))
        .await;
    assert_eq!(change.snapshot_id.as_ref(), Some(&parked.snapshot_id));
    assert_eq!(control_plane.count(&id, InstanceStatus::Running), 2);

    // Another revive of a running instance is refused.
    let refused = agent
        .instance_revive(revive(&OperationId::generate(), &parked.snapshot_id))
        .await;
    assert!(
        matches!(
            refused,
            Err(AgentError::NotDormant {
                status: InstanceStatus::Running,
                ..
            })
        ),
        "{refused:?}"
    );

    // Delete, twice: the second finds nothing.
    agent.instance_delete(&id, false).await.unwrap();
    let again = agent.instance_delete(&id, false).await;
    assert!(matches!(again, Err(AgentError::NotFound(_))), "{again:?}");
    assert_gone(&agent, dir.path(), &id, "deleted");
    agent.shutdown().await;
}

/// Requests that arrive together are carried out one at a time by the
/// instance's task: of two parks at once one parks and the other finds it
/// dormant, and a delete among them ends it whatever its turn, leaving no
/// slot or file behind.
#[tokio::test]
async fn operations_that_arrive_together_are_carried_out_one_at_a_time() {
    let dir = tempfile::tempdir().unwrap();
    let control_plane = Arc::new(FakeControlPlane::default());
    let agent = sim_agent(dir.path(), control_plane.clone()).await;
    for round in 0..10 {
        let id = InstanceId::generate();
        let create = create_request(&id, &OperationId::generate());
        agent.instance_create(create).await.unwrap();
        control_plane
            .reported(&id, InstanceStatus::Running, None)
            .await;

        let (first, second) =
            tokio::join!(agent.instance_dormant(&id), agent.instance_dormant(&id));
        let parked = [&first, &second].iter().filter(|park| park.is_ok()).count();
        assert_eq!(parked, 1, "round {round}: {first:?} {second:?}");
        let refused = if first.is_ok() { &second } else { &first };
        assert!(
            matches!(
                refused,
                Err(AgentError::NotRunning {
                    status: InstanceStatus::Dormant,
                    ..
                })
            ),
            "round {round}: {refused:?}"
        );
        assert_eq!(control_plane.count(&id, InstanceStatus::Dormant), 1);

        // Revive, then a park and a delete at once: the park waits for the
        // revive (or finds it gone), and the delete ends it.
        let snapshot = first
            .as_ref()
            .or(second.as_ref())
            .unwrap()
            .snapshot_id
            .clone();
        let revive = revive_request(&id, &snapshot, &OperationId::generate());
        agent.instance_revive(revive).await.unwrap();
        let (park, delete) = tokio::join!(
            agent.instance_dormant(&id),
            agent.instance_delete(&id, true)
        );
        delete.unwrap();
        assert!(
            matches!(
                park,
                Ok(_)
                    | Err(AgentError::NotFound(_))
                    | Err(AgentError::NotRunning {
                        status: InstanceStatus::Reviving | InstanceStatus::Stopped,
                        ..
                    })
            ),
            "round {round}: {park:?}"
        );
        assert_gone(&agent, dir.path(), &id, &format!("round {round}"));
    }
    agent.shutdown().await;
}

/// A parked instance the agent takes back to revive (it restarted, or the
/// instance was parked elsewhere) whose revive is refused because the
/// snapshot store cannot be read stays dormant, and a delete of it then
/// returns: it had no browser to wait for (it waited forever before).
#[tokio::test]
async fn a_taken_back_instance_whose_revive_was_refused_can_be_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let control_plane = Arc::new(FakeControlPlane::default());
    let agent = sim_agent(dir.path(), control_plane.clone()).await;
    let id = InstanceId::generate();
    // Where its snapshots would be is a file: the store fails to read it
    // (not "not found").
    std::fs::create_dir_all(dir.path().join("snapshots")).unwrap();
    std::fs::write(
        dir.path().join("snapshots").join(id.as_str()),
        b"not a folder",
    )
    .unwrap();
    let revive = revive_request(&id, &SnapshotId::generate(), &OperationId::generate());
    let refused = agent.instance_revive(revive).await;
    assert!(
        matches!(refused, Err(AgentError::StoreUnreadable { .. })),
        "{refused:?}"
    );
    assert!(
        agent
            .instance_reports()
            .iter()
            .any(|report| report.id == id && report.status == InstanceStatus::Dormant),
        "it stays dormant on the node"
    );
    tokio::time::timeout(Duration::from_secs(30), agent.instance_delete(&id, false))
        .await
        .expect("the delete returns")
        .unwrap();
    assert_gone(&agent, dir.path(), &id, "deleted while dormant");
    agent.shutdown().await;
}

#[tokio::test]
async fn only_a_dormant_instance_revived_elsewhere_is_forgotten() {
    let dir = tempfile::tempdir().unwrap();
    let control_plane = Arc::new(FakeControlPlane::default());
    let agent = sim_agent(dir.path(), control_plane.clone()).await;
    let id = running(&agent, &control_plane).await;
    // Running here: it stays.
    let refused = agent.instance_forget(&id).await;
    assert!(
        matches!(refused, Err(AgentError::NotDormant { .. })),
        "{refused:?}"
    );
    assert!(agent.instance_reports().iter().any(|r| r.id == id));

    agent.instance_dormant(&id).await.unwrap();
    agent.instance_forget(&id).await.unwrap();
    assert_gone(&agent, dir.path(), &id, "forgotten");
    // Nothing to report: it lives elsewhere.
    assert_eq!(control_plane.count(&id, InstanceStatus::Stopped), 0);
    assert!(matches!(
        agent.instance_forget(&id).await,
        Err(AgentError::NotFound(_))
    ));
    agent.shutdown().await;
}

#[tokio::test]
async fn an_agent_stopping_parks_what_its_control_plane_could_not_move() {
    let dir = tempfile::tempdir().unwrap();
    // This control plane drains nothing (as one of protocol 1.1 would not).
    let control_plane = Arc::new(FakeControlPlane::default());
    let agent = sim_agent_with(dir.path(), control_plane.clone(), |config| {
        config.drain_on_shutdown = true;
    })
    .await;
    let id = running(&agent, &control_plane).await;

    agent.drain_before_shutdown().await;
    // Parked here, with its snapshot, rather than stopped with the agent.
    let parked = control_plane
        .reported(&id, InstanceStatus::Dormant, None)
        .await;
    assert!(parked.snapshot_id.is_some(), "{parked:?}");
    agent.shutdown().await;
    assert_eq!(control_plane.count(&id, InstanceStatus::Stopped), 0);
}
