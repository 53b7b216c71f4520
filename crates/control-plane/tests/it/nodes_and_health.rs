//! Node registration, reconciliation, the offline sweep and health, on a real
//! SQLite store with an injected clock.

use std::sync::Arc;

use chrono::Utc;

use flotilla_api_types::agent::{
    Heartbeat, InstanceReport, InstanceStateChange, NodeRegistration, WarmPoolReport,
};
use flotilla_api_types::health::HealthStatus;
use flotilla_api_types::instances::{InstanceConfig, InstanceResources, InstanceStatus};
use flotilla_api_types::nodes::{Capabilities, NodeStatus, ResourceUsage};
use flotilla_api_types::{InstanceId, NodeId};
use flotilla_control_plane::app::Scope;
use flotilla_control_plane::store::NewInstance;
use flotilla_control_plane::{ControlPlane, ControlPlaneConfig, ManualClock, Store};

async fn control_plane(dir: &tempfile::TempDir) -> (Arc<ControlPlane>, Arc<ManualClock>) {
    let store = Store::connect(&format!("sqlite://{}/test.db", dir.path().display()), 4)
        .await
        .unwrap();
    let clock = Arc::new(ManualClock::new(Utc::now()));
    (
        Arc::new(ControlPlane::new(
            store,
            ControlPlaneConfig::default(),
            clock.clone(),
        )),
        clock,
    )
}

/// Registers `node`, with no warnings and no instances.
async fn register_plain(control_plane: &ControlPlane, node: &str) {
    control_plane
        .node_register(registration(node, vec![], vec![]))
        .await
        .unwrap();
}

fn registration(
    node: &str,
    warnings: Vec<String>,
    instances: Vec<InstanceReport>,
) -> NodeRegistration {
    NodeRegistration {
        node_id: NodeId::new(node),
        generation: "g1".into(),
        address: "http://127.0.0.1:1".into(),
        public_host: "127.0.0.1".into(),
        max_instances: 5,
        capabilities: Capabilities {
            cpu_cores: 2,
            memory_gb: 8.0,
            disk_gb: 50.0,
        },
        images: vec!["ubuntu:22.04".into()],
        resources: ResourceUsage::default(),
        load: ResourceUsage::default(),
        instances,
        warnings,
        browser_version: None,
        protocol_version: flotilla_api_types::agent::PROTOCOL_VERSION.into(),
        snapshot_store: String::new(),
    }
}

/// A heartbeat of `node` (generation `g1`) that reports nothing: no
/// instances, pools or loops.
fn quiet_heartbeat(node: &str) -> Heartbeat {
    Heartbeat {
        node_id: NodeId::new(node),
        generation: "g1".into(),
        resources: ResourceUsage::default(),
        load: ResourceUsage::default(),
        instances: vec![],
        warm_pool: None,
        warm_pools: vec![],
        loops: vec![],
    }
}

async fn place(control_plane: &ControlPlane, node: &str) -> InstanceId {
    let id = InstanceId::generate();
    let new = NewInstance {
        id: id.clone(),
        node_id: NodeId::new(node),
        image: "ubuntu:22.04".into(),
        config: InstanceConfig::default(),
        created_at: Utc::now(),
        profile: None,
        operation: flotilla_api_types::ids::OperationId::generate(),
        tenant: None,
    };
    assert_eq!(
        control_plane
            .store()
            .instance_insert_if_room(&new, 5)
            .await
            .unwrap(),
        flotilla_control_plane::store::Placed::Inserted
    );
    id
}

#[tokio::test]
async fn a_node_without_limits_makes_the_service_degraded() {
    let dir = tempfile::tempdir().unwrap();
    let (control_plane, _) = control_plane(&dir).await;
    let health = control_plane.health(true).await;
    assert_eq!(health.status, HealthStatus::Degraded, "no node online yet");

    register_plain(&control_plane, "n1").await;
    assert_eq!(
        control_plane.health(true).await.status,
        HealthStatus::Healthy
    );

    let warning = "no writable cgroup hierarchy: instances run without memory, CPU and pids limits"
        .to_owned();
    control_plane
        .node_register(registration("n1", vec![warning.clone()], vec![]))
        .await
        .unwrap();
    let health = control_plane.health(true).await;
    assert_eq!(health.status, HealthStatus::Degraded);
    assert!(
        health
            .warnings
            .iter()
            .any(|w| w.contains("n1") && w.contains("cgroup")),
        "{:?}",
        health.warnings
    );
    let node = control_plane.node_get(&NodeId::new("n1")).await.unwrap();
    assert_eq!(node.warnings, Some(vec![warning]));
}

/// A node agent's loops, as its heartbeat reports them: `/health` warns of
/// one whose last run failed, `/metrics` counts their runs; an offline
/// node's are shown no more.
#[tokio::test]
async fn a_node_agents_failing_loop_shows_in_health_and_metrics() {
    use flotilla_api_types::runs::{RunLedger, RunOutcome};
    let dir = tempfile::tempdir().unwrap();
    let (control_plane, _) = control_plane(&dir).await;
    register_plain(&control_plane, "n1").await;
    let ledger = RunLedger::default();
    ledger.record("heartbeat", Utc::now(), RunOutcome::Done(0));
    ledger.record("state change", Utc::now(), RunOutcome::Done(1));
    ledger.record(
        "state change",
        Utc::now(),
        RunOutcome::Failed("control plane unreachable".into()),
    );
    let heartbeat = Heartbeat {
        loops: ledger.report(true),
        ..quiet_heartbeat("n1")
    };
    control_plane
        .node_heartbeat(heartbeat.clone())
        .await
        .unwrap()
        .expect("an online node's heartbeat is taken");
    let health = control_plane.health(true).await;
    assert_eq!(health.status, HealthStatus::Degraded);
    assert!(
        health
            .warnings
            .contains(&"node n1: its state change loop failed its last run".to_owned()),
        "{:?}",
        health.warnings
    );
    let gauges = control_plane.prometheus_gauges().await.unwrap();
    let text = control_plane.telemetry().render(&gauges);
    for line in [
        "service_node_loop_runs_total{node=\"n1\",loop=\"state change\",outcome=\"ok\"} 1",
        "service_node_loop_runs_total{node=\"n1\",loop=\"state change\",outcome=\"failed\"} 1",
        "service_node_loop_failing{node=\"n1\",loop=\"state change\"} 1",
        "service_node_loop_failing{node=\"n1\",loop=\"heartbeat\"} 0",
    ] {
        assert!(text.contains(line), "{line} in\n{text}");
    }
    // Once it succeeds again the warning goes.
    ledger.record("state change", Utc::now(), RunOutcome::Done(1));
    let heartbeat = Heartbeat {
        loops: ledger.report(true),
        ..heartbeat
    };
    control_plane.node_heartbeat(heartbeat).await.unwrap();
    assert_eq!(
        control_plane.health(true).await.status,
        HealthStatus::Healthy
    );
}

#[tokio::test]
async fn silent_nodes_go_offline_and_their_instances_fail() {
    let dir = tempfile::tempdir().unwrap();
    let (control_plane, clock) = control_plane(&dir).await;
    register_plain(&control_plane, "n1").await;
    let id = place(&control_plane, "n1").await;
    // Its warm pools, as its heartbeat reports them, are in /metrics while
    // it is online: one of an older agent (`warm_pool` alone), then one per
    // image.
    let pool = WarmPoolReport {
        image: "ubuntu:22.04".into(),
        ready: 1,
        hits: 2,
        misses: 1,
        revive_hits: 4,
        revive_misses: 1,
    };
    let shell = WarmPoolReport {
        image: "chromium-headless-shell".into(),
        ready: 2,
        hits: 0,
        misses: 3,
        ..WarmPoolReport::default()
    };
    let heartbeat =
        |warm_pool: Option<WarmPoolReport>, warm_pools: Vec<WarmPoolReport>| Heartbeat {
            warm_pool,
            warm_pools,
            ..quiet_heartbeat("n1")
        };
    control_plane
        .node_heartbeat(heartbeat(Some(pool.clone()), vec![]))
        .await
        .unwrap()
        .expect("an online node's heartbeat is taken");
    let gauges = control_plane.prometheus_gauges().await.unwrap();
    assert_eq!(gauges.warm_pools, vec![("n1".to_owned(), pool.clone())]);
    control_plane
        .node_heartbeat(heartbeat(
            Some(pool.clone()),
            vec![pool.clone(), shell.clone()],
        ))
        .await
        .unwrap()
        .expect("an online node's heartbeat is taken");
    let gauges = control_plane.prometheus_gauges().await.unwrap();
    assert_eq!(
        gauges.warm_pools,
        vec![("n1".to_owned(), pool), ("n1".to_owned(), shell)]
    );
    // A report from a node the instance is not on (one it was moved away
    // from) is not taken.
    let report_from = |node: &str| InstanceStateChange {
        node_id: NodeId::new(node),
        id: id.clone(),
        status: InstanceStatus::Running,
        reason: None,
        at: Utc::now(),
        snapshot_id: None,
        operation: None,
    };
    let before = control_plane
        .instance_get(&id, ("anonymous", &Scope::Admin))
        .await
        .unwrap()
        .status;
    assert!(
        !control_plane
            .instance_state_changed(report_from("n2"))
            .await
            .unwrap()
    );
    assert_eq!(
        control_plane
            .instance_get(&id, ("anonymous", &Scope::Admin))
            .await
            .unwrap()
            .status,
        before
    );
    control_plane
        .instance_state_changed(report_from("n1"))
        .await
        .unwrap();

    clock.advance(chrono::Duration::seconds(59));
    assert!(
        control_plane.node_offline_sweep().await.unwrap().is_empty(),
        "59 s is within the timeout"
    );
    clock.advance(chrono::Duration::seconds(2));
    assert_eq!(
        control_plane.node_offline_sweep().await.unwrap(),
        vec![NodeId::new("n1")]
    );
    let node = control_plane.node_get(&NodeId::new("n1")).await.unwrap();
    assert_eq!(node.status, NodeStatus::Offline);
    let gauges = control_plane.prometheus_gauges().await.unwrap();
    assert!(
        gauges.warm_pools.is_empty(),
        "an offline node's pool is gone"
    );
    let instance = control_plane
        .instance_get(&id, ("anonymous", &Scope::Admin))
        .await
        .unwrap();
    assert_eq!(instance.status, InstanceStatus::Failed);
    assert!(instance.status_reason.unwrap().contains("went offline"));

    // A heartbeat from an offline node asks it to register again (to reconcile).
    let heartbeat = quiet_heartbeat("n1");
    assert!(
        control_plane
            .node_heartbeat(heartbeat)
            .await
            .unwrap()
            .is_none()
    );
}

#[tokio::test]
async fn registration_reconciles_lost_and_started_instances() {
    let dir = tempfile::tempdir().unwrap();
    let (control_plane, _) = control_plane(&dir).await;
    register_plain(&control_plane, "n1").await;
    let lost = place(&control_plane, "n1").await;
    let started = place(&control_plane, "n1").await;
    let report = InstanceReport {
        id: started.clone(),
        status: InstanceStatus::Running,
        reason: None,
        resources: InstanceResources {
            cpu_percent: 1.0,
            memory_mb: 150.0,
            disk_mb: 3.0,
        },
        last_activity: Utc::now(),
        snapshot_id: None,
        operation: None,
        clients: flotilla_api_types::agent::NodeClients {
            cdp: 2,
            playwright: 1,
            actions: 0,
        },
    };
    // The node restarted: another agent process (generation).
    let restarted = NodeRegistration {
        generation: "g2".into(),
        ..registration("n1", vec![], vec![report])
    };
    control_plane.node_register(restarted).await.unwrap();
    let lost = control_plane
        .instance_get(&lost, ("anonymous", &Scope::Admin))
        .await
        .unwrap();
    assert_eq!(
        lost.status,
        InstanceStatus::Failed,
        "it was still creating when its node restarted"
    );
    let started = control_plane
        .instance_get(&started, ("anonymous", &Scope::Admin))
        .await
        .unwrap();
    assert_eq!(started.status, InstanceStatus::Running);
    assert_eq!(started.resources.unwrap().memory_mb, 150.0);
    // What its node serves it is what drives it.
    let drivers = started.drivers.unwrap();
    assert_eq!(
        (drivers.cdp, drivers.playwright, drivers.actions),
        (2, 1, 0)
    );
    assert_eq!((drivers.webdriver, drivers.mcp), (0, 0));
}

#[tokio::test]
async fn the_same_agent_registering_with_another_replica_loses_nothing_on_its_way() {
    let dir = tempfile::tempdir().unwrap();
    let (control_plane, clock) = control_plane(&dir).await;
    register_plain(&control_plane, "n1").await;
    // Placed by another control plane of the cluster after the agent made
    // the report it registers with here (same process, generation g1).
    let on_its_way = place(&control_plane, "n1").await;
    let never_arrived = place(&control_plane, "n1").await;
    control_plane
        .node_register(registration("n1", vec![], vec![]))
        .await
        .unwrap();
    let status = |id: InstanceId| {
        let control_plane = control_plane.clone();
        async move {
            let view = control_plane.instance_get(&id, ("anonymous", &Scope::Admin));
            view.await.unwrap().status
        }
    };
    assert_eq!(status(on_its_way.clone()).await, InstanceStatus::Creating);
    assert_eq!(
        status(never_arrived.clone()).await,
        InstanceStatus::Creating
    );
    // A heartbeat too soon decides nothing; one later that reports the
    // first but not the second: the second never reached the node.
    control_plane
        .node_heartbeat(quiet_heartbeat("n1"))
        .await
        .unwrap();
    assert_eq!(
        status(never_arrived.clone()).await,
        InstanceStatus::Creating
    );
    clock.advance(chrono::Duration::seconds(6));
    let arrived = InstanceReport {
        id: on_its_way.clone(),
        status: InstanceStatus::Creating,
        reason: None,
        resources: InstanceResources::default(),
        last_activity: Utc::now(),
        snapshot_id: None,
        operation: None,
        clients: Default::default(),
    };
    let heartbeat = Heartbeat {
        instances: vec![arrived],
        ..quiet_heartbeat("n1")
    };
    control_plane.node_heartbeat(heartbeat).await.unwrap();
    assert_eq!(status(on_its_way).await, InstanceStatus::Creating);
    assert_eq!(status(never_arrived).await, InstanceStatus::Failed);
}

#[tokio::test]
async fn agents_a_minor_version_apart_register_and_a_major_apart_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (control_plane, _) = control_plane(&dir).await;
    // One minor apart, either way, and an agent from before versions were
    // exchanged (it sends none: 1.0).
    for (node, version) in [("older", "1.0"), ("newer", "1.9"), ("unversioned", "")] {
        let mut agent = registration(node, vec![], vec![]);
        agent.protocol_version = version.into();
        let ack = control_plane.node_register(agent).await.unwrap();
        assert_eq!(
            ack.protocol_version,
            flotilla_api_types::agent::PROTOCOL_VERSION
        );
    }
    let list = control_plane.node_list().await.unwrap();
    let versions: Vec<(String, Option<String>)> = list
        .nodes
        .iter()
        .map(|n| (n.id.to_string(), n.protocol_version.clone()))
        .collect();
    for (node, version) in [("older", "1.0"), ("newer", "1.9"), ("unversioned", "1.0")] {
        assert!(
            versions.contains(&(node.to_owned(), Some(version.to_owned()))),
            "{node} {version}: {versions:?}"
        );
    }
    assert!(list.refused.is_empty());

    // A major apart: refused, saying why, and listed with the reason.
    let mut future = registration("future", vec![], vec![]);
    future.protocol_version = "2.0".into();
    let refused = control_plane
        .node_register(future.clone())
        .await
        .unwrap_err();
    let message = refused.to_string();
    assert!(
        message.contains("protocol 2.0") && message.contains("a major version apart"),
        "{message}"
    );
    let list = control_plane.node_list().await.unwrap();
    assert!(list.nodes.iter().all(|n| n.id.as_str() != "future"));
    assert_eq!(list.refused.len(), 1);
    assert_eq!(list.refused[0].node_id.as_str(), "future");
    assert_eq!(list.refused[0].protocol_version, "2.0");
    assert!(
        list.refused[0]
            .reason
            .contains("upgrade the older side first")
    );
    // Not a version at all: refused too.
    let mut garbled = registration("garbled", vec![], vec![]);
    garbled.protocol_version = "one".into();
    assert!(control_plane.node_register(garbled).await.is_err());

    // Upgraded, it registers and leaves the list.
    future.protocol_version = flotilla_api_types::agent::PROTOCOL_VERSION.into();
    control_plane.node_register(future).await.unwrap();
    let list = control_plane.node_list().await.unwrap();
    assert!(list.refused.iter().all(|a| a.node_id.as_str() != "future"));
    assert!(list.nodes.iter().any(|n| n.id.as_str() == "future"));
}

#[test]
fn a_registration_from_another_minor_version_reads_with_fields_unknown_and_missing() {
    // A newer agent's registration: a field this side does not know; an
    // older one's: no protocol_version (nor the other defaulted fields).
    let mut newer = serde_json::to_value(registration("n1", vec![], vec![])).unwrap();
    newer["protocol_version"] = "1.4".into();
    newer["a_field_from_the_future"] = serde_json::json!({"nested": [1, 2]});
    let read: NodeRegistration = serde_json::from_value(newer).unwrap();
    assert_eq!(read.protocol_version, "1.4");
    let mut older = serde_json::to_value(registration("n1", vec![], vec![])).unwrap();
    let fields = older.as_object_mut().unwrap();
    for field in [
        "protocol_version",
        "generation",
        "load",
        "warnings",
        "browser_version",
    ] {
        fields.remove(field);
    }
    let read: NodeRegistration = serde_json::from_value(older).unwrap();
    assert_eq!(read.protocol_version, "");
    // And the answer an older control plane gives.
    let ack: flotilla_api_types::agent::RegistrationAck =
        serde_json::from_str(r#"{"heartbeat_interval_sec": 5, "a_field_from_the_future": true}"#)
            .unwrap();
    assert_eq!(
        flotilla_api_types::agent::protocol_version_or_before(&ack.protocol_version),
        "1.0"
    );
}

#[tokio::test]
async fn a_drain_until_restart_ends_when_another_agent_process_registers() {
    use flotilla_api_types::nodes::NodeStatus;
    let dir = tempfile::tempdir().unwrap();
    let (control_plane, _) = control_plane(&dir).await;
    register_plain(&control_plane, "n1").await;
    let node = NodeId::new("n1");
    let status = |control_plane: Arc<ControlPlane>| async move {
        control_plane
            .node_get(&NodeId::new("n1"))
            .await
            .unwrap()
            .status
    };

    // Until restart: the same process registering again keeps it; the next
    // process (another generation) ends it.
    let report = control_plane.node_drain(&node, true).await.unwrap();
    assert!(report.moving.is_empty());
    assert_eq!(status(control_plane.clone()).await, NodeStatus::Draining);
    register_plain(&control_plane, "n1").await;
    assert_eq!(status(control_plane.clone()).await, NodeStatus::Draining);
    let mut restarted = registration("n1", vec![], vec![]);
    restarted.generation = "g2".into();
    control_plane.node_register(restarted).await.unwrap();
    assert_eq!(status(control_plane.clone()).await, NodeStatus::Online);

    // A plain drain lasts across restarts, until uncordoned.
    control_plane.node_drain(&node, false).await.unwrap();
    let mut again = registration("n1", vec![], vec![]);
    again.generation = "g3".into();
    control_plane.node_register(again).await.unwrap();
    assert_eq!(status(control_plane.clone()).await, NodeStatus::Draining);
    let uncordoned = control_plane.node_uncordon(&node).await.unwrap();
    assert_eq!(uncordoned.status, NodeStatus::Online);
    assert!(
        control_plane
            .node_uncordon(&NodeId::new("nowhere"))
            .await
            .is_err()
    );
}
