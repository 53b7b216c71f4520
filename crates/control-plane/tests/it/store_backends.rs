//! The store's suite, run on both backends: embedded SQLite and a real
//! PostgreSQL (a private server per test, `PgServer`). Each case runs twice,
//! `sqlite_<case>` and `postgres_<case>`.

use std::collections::HashSet;
use std::sync::Arc;

use chrono::{Duration, Utc};
use flotilla_api_types::agent::NodeRegistration;
use flotilla_api_types::alerts::{AlertLevel, AlertState};
use flotilla_api_types::events::EventName;
use flotilla_api_types::instances::{InstanceConfig, InstanceSort, InstanceStatus, ReviveMethod};
use flotilla_api_types::nodes::{Capabilities, ResourceUsage};
use flotilla_api_types::{InstanceId, NodeId};
use flotilla_control_plane::Store;
use flotilla_control_plane::store::{
    EventRoute, Expected, InstanceFilter, MetricSample, NewAlert, NewInstance, Placed,
};
use flotilla_testkit::PgServer;

/// A fresh store; the guard keeps its database alive.
#[allow(dead_code)]
enum Backend {
    Sqlite(tempfile::TempDir),
    Postgres(PgServer),
}

async fn open(postgres: bool) -> (Store, Backend) {
    if postgres {
        let server = PgServer::start().await.expect("PostgreSQL starts");
        let url = server.database().await.expect("a database");
        (
            Store::connect(&url, 8).await.expect("store"),
            Backend::Postgres(server),
        )
    } else {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}/store.db", dir.path().display());
        (
            Store::connect(&url, 8).await.expect("store"),
            Backend::Sqlite(dir),
        )
    }
}

fn registration(node: &str, max_instances: i64) -> NodeRegistration {
    NodeRegistration {
        node_id: NodeId::new(node),
        generation: format!("{node}-generation"),
        address: format!("http://{node}.invalid:1"),
        public_host: "127.0.0.1".into(),
        max_instances,
        capabilities: Capabilities {
            cpu_cores: 4,
            memory_gb: 8.0,
            disk_gb: 100.0,
        },
        images: vec!["chromium".into()],
        resources: ResourceUsage::default(),
        load: ResourceUsage::default(),
        instances: Vec::new(),
        warnings: Vec::new(),
        browser_version: None,
        protocol_version: flotilla_api_types::agent::PROTOCOL_VERSION.into(),
        snapshot_store: String::new(),
    }
}

fn new_instance(node: &str) -> NewInstance {
    NewInstance {
        id: InstanceId::generate(),
        node_id: NodeId::new(node),
        image: "chromium".into(),
        config: InstanceConfig::default(),
        created_at: Utc::now(),
        profile: None,
        operation: flotilla_api_types::ids::OperationId::generate(),
        tenant: None,
    }
}

/// Moves a creating instance to running (setup for tests about other things).
async fn mark_running(store: &Store, id: &InstanceId) {
    store
        .instance_transition(
            id,
            &[InstanceStatus::Creating],
            InstanceStatus::Running,
            None,
            Utc::now(),
        )
        .await
        .unwrap()
        .expect("creating → running");
}

fn event_names(payloads: &[String]) -> Vec<String> {
    payloads
        .iter()
        .map(|p| {
            serde_json::from_str::<serde_json::Value>(p).unwrap()["event"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect()
}

macro_rules! on_both_backends {
    ($($case:ident),* $(,)?) => {
        mod sqlite { $( #[tokio::test] async fn $case() { super::$case(false).await } )* }
        mod postgres { $( #[tokio::test] async fn $case() { super::$case(true).await } )* }
    };
}

on_both_backends!(
    capacity_holds_under_concurrent_placements,
    a_tenants_quota_holds_under_concurrent_placements,
    transitions_and_their_events_stay_in_order,
    a_nodes_report_moves_only_the_record_it_speaks_for,
    lists_filter_sort_and_page,
    nodes_go_offline_and_come_back_with_events,
    outbox_hands_out_the_head_of_each_subject,
    alerts_raise_and_clear,
    metric_samples_and_settings,
    leases_pass_only_when_they_lapse,
    the_previous_versions_node_queries_work_on_a_migrated_store,
    an_instance_with_a_lifetime_is_stored_after_one_without,
    an_mcp_session_is_its_openers_and_counted_fleet_wide,
    an_idle_mcp_session_ends_once_and_is_forgotten,
    a_held_instance_lapses_only_when_its_holder_stops_renewing,
);

/// One connection inserts an instance without `max_duration_minutes`, then
/// one with (a REST action's instance after a create): both are stored.
/// Before, PostgreSQL refused the second ("incorrect binary data format in
/// bind parameter 12": the statement was prepared with a float4 null).
async fn an_instance_with_a_lifetime_is_stored_after_one_without(postgres: bool) {
    let (store, guard) = open(postgres).await;
    let url = match &guard {
        Backend::Postgres(server) => server.database().await.expect("a database"),
        Backend::Sqlite(dir) => format!("sqlite://{}/one.db", dir.path().display()),
    };
    drop(store);
    let store = Store::connect(&url, 1)
        .await
        .expect("a store of one connection");
    store
        .node_upsert(&registration("n1", 20), Utc::now())
        .await
        .unwrap();
    let without = new_instance("n1");
    let mut with = new_instance("n1");
    with.config.max_duration_minutes = Some(0.25);
    for new in [&without, &with] {
        let placed = store.instance_insert_if_room(new, 20).await.unwrap();
        assert_eq!(placed, Placed::Inserted);
    }
    let stored = store.instance_get(&with.id).await.unwrap().unwrap();
    assert_eq!(stored.config.max_duration_minutes, Some(0.25));
    let stored = store.instance_get(&without.id).await.unwrap().unwrap();
    assert_eq!(stored.config.max_duration_minutes, None);
}

/// The columns of `nodes` the version before 0019 reads and writes.
const PREVIOUS_NODE_COLUMNS: &str = "id, address, public_host, status, max_instances, cpu_cores, memory_gb, disk_gb, images, \
    cpu_percent, memory_percent, disk_percent, last_heartbeat, registered_at, warnings, load_cpu_percent, load_memory_percent, \
    generation, browser_version";

/// A rolling upgrade: a control plane of the version before keeps working
/// on a store this version migrated (migrations only add: a column it does
/// not know has a default). Its node upsert and select, as it sends them.
async fn the_previous_versions_node_queries_work_on_a_migrated_store(postgres: bool) {
    let (url, _guard) = if postgres {
        let server = PgServer::start().await.expect("PostgreSQL starts");
        let url = server.database().await.expect("a database");
        (url, Backend::Postgres(server))
    } else {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}/store.db", dir.path().display());
        (url, Backend::Sqlite(dir))
    };
    // Migrated by this version.
    drop(Store::connect(&url, 2).await.expect("store"));
    sqlx::any::install_default_drivers();
    let pool = sqlx::AnyPool::connect(&url).await.unwrap();
    let upsert = format!(
        "INSERT INTO nodes ({PREVIOUS_NODE_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $13, $14, $15, $16, $17, $18) \
         ON CONFLICT (id) DO UPDATE SET address = excluded.address, last_heartbeat = excluded.last_heartbeat"
    );
    for _ in 0..2 {
        sqlx::query(&upsert)
            .bind("old-node")
            .bind("http://old.invalid:1")
            .bind("127.0.0.1")
            .bind("online")
            .bind(5_i64)
            .bind(2_i64)
            .bind(4.0_f64)
            .bind(20.0_f64)
            .bind("[\"chromium\"]")
            .bind(0.0_f64)
            .bind(0.0_f64)
            .bind(0.0_f64)
            .bind(Utc::now().timestamp_millis())
            .bind("[]")
            .bind(0.0_f64)
            .bind(0.0_f64)
            .bind("old-generation")
            .bind(None::<String>)
            .execute(&pool)
            .await
            .expect("the previous version's upsert");
    }
    let row = sqlx::query(&format!(
        "SELECT {PREVIOUS_NODE_COLUMNS} FROM nodes WHERE id = $1"
    ))
    .bind("old-node")
    .fetch_one(&pool)
    .await
    .expect("the previous version's select");
    use sqlx::Row as _;
    assert_eq!(
        row.try_get::<String, _>("generation").unwrap(),
        "old-generation"
    );
    pool.close().await;
    // And this version reads what the previous one wrote.
    let store = Store::connect(&url, 2).await.unwrap();
    let node = store
        .node_get(&NodeId::new("old-node"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(node.protocol_version, "");
    drop(store);
    // A newer version's migration in the store (a rollback, or this version
    // restarting during a rolling upgrade) does not stop this one.
    let pool = sqlx::AnyPool::connect(&url).await.unwrap();
    sqlx::query(
        "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) \
         VALUES ($1, $2, $3, $4, $5)",
    )
    .bind(99_999_i64)
    .bind("a newer version's migration")
    .bind(true)
    .bind(vec![0_u8; 48])
    .bind(1_i64)
    .execute(&pool)
    .await
    .unwrap();
    pool.close().await;
    let store = Store::connect(&url, 2)
        .await
        .expect("a store a newer version migrated opens");
    assert!(
        store
            .node_get(&NodeId::new("old-node"))
            .await
            .unwrap()
            .is_some()
    );
}

async fn capacity_holds_under_concurrent_placements(postgres: bool) {
    let (store, _guard) = open(postgres).await;
    store
        .node_upsert(&registration("n1", 20), Utc::now())
        .await
        .unwrap();
    let store = Arc::new(store);
    let attempts: Vec<_> = (0..50)
        .map(|_| {
            let store = store.clone();
            tokio::spawn(async move {
                store
                    .instance_insert_if_room(&new_instance("n1"), 20)
                    .await
                    .unwrap()
                    == Placed::Inserted
            })
        })
        .collect();
    let mut placed = 0;
    for attempt in attempts {
        placed += usize::from(attempt.await.unwrap());
    }
    assert_eq!(placed, 20, "exactly max_instances placements succeed");
    let occupancy = store.node_occupancy().await.unwrap();
    assert_eq!(occupancy, vec![(NodeId::new("n1"), 20)]);
}

/// A tenant's `max_instances` holds across nodes and concurrent creates; it
/// counts only that tenant's instances in an occupying state, and a list
/// filtered by tenant sees them only.
async fn a_tenants_quota_holds_under_concurrent_placements(postgres: bool) {
    let (store, _guard) = open(postgres).await;
    for node in ["n1", "n2"] {
        store
            .node_upsert(&registration(node, 20), Utc::now())
            .await
            .unwrap();
    }
    let store = Arc::new(store);
    let attempts: Vec<_> = (0..30)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move {
                let mut new = new_instance(if i % 2 == 0 { "n1" } else { "n2" });
                new.tenant = Some(("acme".into(), 7));
                store.instance_insert_if_room(&new, 20).await.unwrap()
            })
        })
        .collect();
    let mut placed = 0;
    for attempt in attempts {
        let outcome = attempt.await.unwrap();
        assert_ne!(outcome, Placed::NodeFull);
        placed += usize::from(outcome == Placed::Inserted);
    }
    assert_eq!(placed, 7, "exactly the tenant's max_instances");
    // Another tenant, and an admin's instance, are not counted.
    let mut other = new_instance("n1");
    other.tenant = Some(("globex".into(), 1));
    assert_eq!(
        store.instance_insert_if_room(&other, 20).await.unwrap(),
        Placed::Inserted
    );
    assert_eq!(
        store
            .instance_insert_if_room(&new_instance("n2"), 20)
            .await
            .unwrap(),
        Placed::Inserted
    );
    let filter = InstanceFilter {
        tenant: Some("acme".into()),
        ..InstanceFilter::default()
    };
    let (listed, total) = store
        .instance_list(&filter, InstanceSort::CreatedAtDesc, 100, 0)
        .await
        .unwrap();
    assert_eq!(total, 7);
    assert!(listed.iter().all(|r| r.tenant.as_deref() == Some("acme")));
    // An instance that ended frees its place.
    let ended = &listed[0].id;
    store
        .instance_transition(
            ended,
            &[InstanceStatus::Creating],
            InstanceStatus::Failed,
            Some("gone"),
            Utc::now(),
        )
        .await
        .unwrap()
        .expect("creating → failed");
    let mut one_more = new_instance("n2");
    one_more.tenant = Some(("acme".into(), 7));
    assert_eq!(
        store.instance_insert_if_room(&one_more, 20).await.unwrap(),
        Placed::Inserted
    );
    let mut past_it = new_instance("n1");
    past_it.tenant = Some(("acme".into(), 7));
    assert_eq!(
        store.instance_insert_if_room(&past_it, 20).await.unwrap(),
        Placed::TenantFull
    );
}

async fn transitions_and_their_events_stay_in_order(postgres: bool) {
    let (store, _guard) = open(postgres).await;
    store
        .node_upsert(&registration("n1", 5), Utc::now())
        .await
        .unwrap();
    let new = new_instance("n1");
    let id = new.id.clone();
    assert_eq!(
        store.instance_insert_if_room(&new, 5).await.unwrap(),
        Placed::Inserted
    );
    let now = Utc::now();
    let running = store
        .instance_transition(
            &id,
            &[InstanceStatus::Creating],
            InstanceStatus::Running,
            None,
            now,
        )
        .await
        .unwrap()
        .expect("creating → running");
    assert_eq!(running.status, InstanceStatus::Running);
    assert!(
        store
            .instance_transition(
                &id,
                &[InstanceStatus::Creating],
                InstanceStatus::Running,
                None,
                now
            )
            .await
            .unwrap()
            .is_none(),
        "not from a state it is not in"
    );
    store
        .instance_transition(
            &id,
            &[InstanceStatus::Running],
            InstanceStatus::Idle,
            Some("quiet"),
            now,
        )
        .await
        .unwrap()
        .unwrap();
    let snapshot = flotilla_api_types::ids::SnapshotId::generate();
    let dormant = store
        .instance_set_dormant(
            &id,
            &[InstanceStatus::Running, InstanceStatus::Idle],
            &snapshot,
            now,
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!(dormant.snapshot_id.as_ref(), Some(&snapshot));
    store
        .instance_begin_revive(
            &id,
            &[InstanceStatus::Dormant],
            (
                ReviveMethod::FullRestore,
                &flotilla_api_types::ids::OperationId::generate(),
            ),
            None,
            now,
        )
        .await
        .unwrap()
        .unwrap();
    store
        .instance_transition(
            &id,
            &[InstanceStatus::Reviving],
            InstanceStatus::Running,
            None,
            now,
        )
        .await
        .unwrap()
        .unwrap();
    assert!(store.instance_delete(&id, now).await.unwrap());
    assert!(!store.instance_delete(&id, now).await.unwrap());
    assert!(store.instance_get(&id).await.unwrap().is_none());
    assert_eq!(
        event_names(&store.events_of(id.as_str()).await.unwrap()),
        [
            "instance.created",
            "instance.running",
            "instance.idle",
            "instance.dormant",
            "instance.revived",
            "instance.deleted"
        ]
    );
}

/// The race a drain lost an instance to: the report of a park, read while
/// the instance was dormant on its first node, was applied after the drain
/// had moved it and begun its revive elsewhere, and undid that revive. The
/// store checks the reporting node and operation under the record's lock.
async fn a_nodes_report_moves_only_the_record_it_speaks_for(postgres: bool) {
    use flotilla_api_types::ids::{OperationId, SnapshotId};
    let (store, _guard) = open(postgres).await;
    let now = Utc::now();
    for node in ["n1", "n2"] {
        store
            .node_upsert(&registration(node, 5), now)
            .await
            .unwrap();
    }
    let new = new_instance("n1");
    let (id, created) = (new.id.clone(), new.operation.clone());
    assert_eq!(
        store.instance_insert_if_room(&new, 5).await.unwrap(),
        Placed::Inserted
    );
    mark_running(&store, &id).await;
    let running = [InstanceStatus::Running];
    store
        .instance_set_dormant(&id, &running, &SnapshotId::generate(), now)
        .await
        .unwrap()
        .unwrap();
    // The drain moves it to n2 and begins its revive there.
    let dormant = [InstanceStatus::Dormant];
    assert!(
        store
            .instance_move_if_room(&id, &dormant, &NodeId::new("n2"), 5, now)
            .await
            .unwrap()
    );
    let revive = OperationId::generate();
    let method = (ReviveMethod::FullRestore, &revive);
    store
        .instance_begin_revive(&id, &dormant, method, None, now)
        .await
        .unwrap()
        .unwrap();
    let reviving = [InstanceStatus::Reviving];
    let (n1, n2) = (NodeId::new("n1"), NodeId::new("n2"));
    let undo = |expected| {
        let store = &store;
        let id = &id;
        async move {
            store
                .instance_transition(id, expected, InstanceStatus::Dormant, None, now)
                .await
                .unwrap()
        }
    };
    assert!(
        undo(Expected::reported(&reviving, &n1, Some(&created)))
            .await
            .is_none(),
        "a report of the node it left"
    );
    assert!(
        undo(Expected::reported(&reviving, &n2, Some(&created)))
            .await
            .is_none(),
        "a report of another operation"
    );
    let record = store.instance_get(&id).await.unwrap().unwrap();
    assert_eq!(record.status, InstanceStatus::Reviving);
    // Its new node's report of this revive is taken.
    let revived = store
        .instance_set_revived(
            &id,
            Expected::reported(&reviving, &n2, Some(&revive)),
            None,
            now,
        )
        .await
        .unwrap()
        .expect("the revive's own report");
    assert_eq!(revived.status, InstanceStatus::Running);

    // The reconcile after a restart, and a revive call's rollback, write
    // only on the record as they read it: parked and revived again since,
    // it is of another operation.
    let read = store.instance_get(&id).await.unwrap().unwrap();
    store
        .instance_set_dormant(&id, &running, &SnapshotId::generate(), now)
        .await
        .unwrap()
        .unwrap();
    let again = OperationId::generate();
    let method = (ReviveMethod::QuickStart, &again);
    let current = store
        .instance_begin_revive(&id, &dormant, method, None, now)
        .await
        .unwrap()
        .unwrap();
    assert!(
        undo(Expected::as_read(&reviving, &read)).await.is_none(),
        "a write on the record as it was before its last revive"
    );
    let undone = undo(Expected::as_read(&reviving, &current)).await;
    assert_eq!(
        undone.map(|record| record.status),
        Some(InstanceStatus::Dormant),
        "a write on the record as it is"
    );
}

async fn lists_filter_sort_and_page(postgres: bool) {
    let (store, _guard) = open(postgres).await;
    store
        .node_upsert(&registration("n1", 100), Utc::now())
        .await
        .unwrap();
    store
        .node_upsert(&registration("n2", 100), Utc::now())
        .await
        .unwrap();
    let mut ids = Vec::new();
    for i in 0..30 {
        let mut new = new_instance(if i % 3 == 0 { "n2" } else { "n1" });
        new.created_at = Utc::now() + Duration::milliseconds(i);
        ids.push(new.id.clone());
        store.instance_insert_if_room(&new, 100).await.unwrap();
    }
    for id in &ids[..10] {
        mark_running(&store, id).await;
    }
    let all = InstanceFilter::default();
    let (page, total) = store
        .instance_list(&all, InstanceSort::CreatedAtDesc, 7, 0)
        .await
        .unwrap();
    assert_eq!(total, 30);
    assert_eq!(page.len(), 7);
    assert_eq!(page[0].id, ids[29], "newest first");
    let (page, _) = store
        .instance_list(&all, InstanceSort::CreatedAtAsc, 5, 5)
        .await
        .unwrap();
    assert_eq!(page[0].id, ids[5]);
    let running = InstanceFilter {
        status: Some(InstanceStatus::Running),
        node_id: None,
        tenant: None,
    };
    let (_, total) = store
        .instance_list(&running, InstanceSort::CreatedAtDesc, 100, 0)
        .await
        .unwrap();
    assert_eq!(total, 10);
    let on_n2 = InstanceFilter {
        status: None,
        node_id: Some(NodeId::new("n2")),
        tenant: None,
    };
    let (page, total) = store
        .instance_list(&on_n2, InstanceSort::MemoryDesc, 100, 0)
        .await
        .unwrap();
    assert_eq!(total, 10);
    assert!(page.iter().all(|r| r.node_id.as_str() == "n2"));
    store
        .instance_transition(
            &ids[1],
            &[InstanceStatus::Running],
            InstanceStatus::Failed,
            Some("crash"),
            Utc::now(),
        )
        .await
        .unwrap()
        .unwrap();
    let mut recent = store
        .recent_failures(Utc::now() - Duration::minutes(15))
        .await
        .unwrap();
    recent.sort_by(|a, b| a.0.as_str().cmp(b.0.as_str()));
    assert_eq!(
        recent,
        vec![(NodeId::new("n1"), 20, 1), (NodeId::new("n2"), 10, 0)]
    );
    let counts = store.instance_counts().await.unwrap();
    let count = |s| counts.iter().find(|(c, _)| *c == s).map_or(0, |(_, n)| *n);
    assert_eq!(
        (
            count(InstanceStatus::Running),
            count(InstanceStatus::Creating)
        ),
        (9, 20)
    );
}

async fn nodes_go_offline_and_come_back_with_events(postgres: bool) {
    let (store, _guard) = open(postgres).await;
    let then = Utc::now() - Duration::seconds(120);
    store
        .node_upsert(&registration("n1", 5), then)
        .await
        .unwrap();
    store
        .node_upsert(&registration("n2", 5), Utc::now())
        .await
        .unwrap();
    let stale = store
        .node_mark_stale_offline(Utc::now() - Duration::seconds(60), Utc::now())
        .await
        .unwrap();
    assert_eq!(stale, vec![NodeId::new("n1")]);
    let heartbeat = store
        .node_heartbeat(
            &NodeId::new("n1"),
            "n1-generation",
            &ResourceUsage::default(),
            &ResourceUsage::default(),
            Utc::now(),
        )
        .await
        .unwrap();
    assert_eq!(
        heartbeat,
        Some(flotilla_api_types::nodes::NodeStatus::Offline),
        "an offline node must register again"
    );
    store
        .node_upsert(&registration("n1", 5), Utc::now())
        .await
        .unwrap();
    assert_eq!(
        event_names(&store.events_of("n1").await.unwrap()),
        ["node.online", "node.offline", "node.online"]
    );
    assert_eq!(
        event_names(&store.events_of("n2").await.unwrap()),
        ["node.online"]
    );
}

async fn outbox_hands_out_the_head_of_each_subject(postgres: bool) {
    let (store, _guard) = open(postgres).await;
    store.set_event_routes(vec![
        EventRoute {
            target: "all".into(),
            events: None,
        },
        EventRoute {
            target: "deletes".into(),
            events: Some(HashSet::from([EventName::InstanceDeleted])),
        },
    ]);
    store
        .node_upsert(&registration("n1", 5), Utc::now())
        .await
        .unwrap();
    let (a, b) = (new_instance("n1"), new_instance("n1"));
    for new in [&a, &b] {
        store.instance_insert_if_room(new, 5).await.unwrap();
        mark_running(&store, &new.id).await;
    }
    store.instance_delete(&a.id, Utc::now()).await.unwrap();
    let later = Utc::now() + Duration::seconds(1);
    let due = store.deliveries_due("all", later, 100).await.unwrap();
    let subjects: Vec<_> = due.iter().map(|d| (d.subject.clone(), d.name)).collect();
    assert!(subjects.contains(&(a.id.as_str().to_owned(), EventName::InstanceCreated)));
    assert!(subjects.contains(&(b.id.as_str().to_owned(), EventName::InstanceCreated)));
    assert!(subjects.contains(&("n1".to_owned(), EventName::NodeOnline)));
    assert_eq!(due.len(), 3, "one head per subject: {subjects:?}");
    // A failed head holds back its subject only.
    let head_a = due.iter().find(|d| d.subject == a.id.as_str()).unwrap();
    store
        .delivery_retry_at(head_a, later + Duration::seconds(60), "503")
        .await
        .unwrap();
    let done: Vec<_> = due.iter().filter(|d| d.subject != a.id.as_str()).collect();
    store.deliveries_done(&done).await.unwrap();
    let due = store.deliveries_due("all", later, 100).await.unwrap();
    assert_eq!(due.len(), 1);
    assert_eq!(
        (due[0].subject.as_str(), due[0].name),
        (b.id.as_str(), EventName::InstanceRunning)
    );
    assert_eq!(
        store
            .delivery_next_due("all")
            .await
            .unwrap()
            .map(|t| t.timestamp_millis()),
        Some(due[0].created_at.timestamp_millis()),
        "the earliest head, not a later event waiting behind a retry"
    );
    store.deliveries_done(&[&due[0]]).await.unwrap();
    let next = store.delivery_next_due("all").await.unwrap().unwrap();
    assert!(
        next > later + Duration::seconds(30),
        "only the retrying head is left: {next}"
    );
    let deletes = store.deliveries_due("deletes", later, 100).await.unwrap();
    assert_eq!(deletes.len(), 1);
    assert_eq!(deletes[0].name, EventName::InstanceDeleted);
    assert!(store.outbox_depth().await.unwrap() >= 4);
    assert_eq!(
        store.deliveries_keep_only(&["all".into()]).await.unwrap(),
        1
    );
}

async fn alerts_raise_and_clear(postgres: bool) {
    let (store, _guard) = open(postgres).await;
    let raised = store
        .alert_raise(
            NewAlert {
                scope: "node:n1".into(),
                metric: "cpu".into(),
                level: AlertLevel::Warning,
                value: 75.0,
                threshold: 70.0,
                message: "node n1: CPU at 75 %".into(),
            },
            Utc::now(),
        )
        .await
        .unwrap();
    let active = store.alerts_active().await.unwrap();
    assert_eq!(active, vec![raised.clone()]);
    assert!(store.alert_clear(&raised, 10.0, Utc::now()).await.unwrap());
    assert!(
        !store.alert_clear(&raised, 10.0, Utc::now()).await.unwrap(),
        "once"
    );
    assert!(store.alerts_active().await.unwrap().is_empty());
    let (cleared, total) = store.alerts_list(AlertState::Cleared, 10, 0).await.unwrap();
    assert_eq!(total, 1);
    assert!(cleared[0].cleared_at.is_some());
    assert_eq!(
        event_names(&store.events_of("alert:node:n1:cpu").await.unwrap()),
        ["alert.raised", "alert.cleared"]
    );
}

async fn metric_samples_and_settings(postgres: bool) {
    let (store, _guard) = open(postgres).await;
    let now = Utc::now();
    let sample = |minutes_ago: i64, cpu: f64| MetricSample {
        node_id: String::new(),
        at: now - Duration::minutes(minutes_ago),
        cpu_percent: cpu,
        memory_percent: 1.0,
        disk_percent: 2.0,
        instances: 3,
    };
    store
        .metric_samples_insert(&[sample(120, 10.0), sample(30, 20.0), sample(1, 30.0)])
        .await
        .unwrap();
    let hour = store
        .metric_samples_since("", now - Duration::hours(1))
        .await
        .unwrap();
    assert_eq!(
        hour.iter().map(|s| s.cpu_percent).collect::<Vec<_>>(),
        [20.0, 30.0]
    );
    assert_eq!(
        store
            .metric_samples_prune(now - Duration::minutes(60))
            .await
            .unwrap(),
        1
    );
    let store = Arc::new(store);
    let calls: Vec<_> = (0..10)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move {
                store
                    .setting_get_or_init("key", &format!("v{i}"))
                    .await
                    .unwrap()
            })
        })
        .collect();
    let mut values = HashSet::new();
    for call in calls {
        values.insert(call.await.unwrap());
    }
    assert_eq!(values.len(), 1, "one value wins cluster-wide: {values:?}");
}

/// Two MCP sessions: s1 of `key:one` (tenant acme), which created `mcp-a`
/// and acts on `mcp-b`; s2 of `key:two`, acting on `mcp-a`.
async fn two_mcp_sessions(store: &Store, now: chrono::DateTime<Utc>) -> (InstanceId, InstanceId) {
    let (a, b) = (InstanceId::new("mcp-a"), InstanceId::new("mcp-b"));
    let params = "{\"protocolVersion\":\"2025-11-25\"}";
    store
        .mcp_session_initialized("s1", params, now)
        .await
        .unwrap();
    for (id, opener) in [
        ("s1", ("key:one", Some("acme"))),
        // A second opener does not take it over.
        ("s1", ("key:two", None)),
        ("s2", ("key:two", None)),
    ] {
        store.mcp_session_opened(id, opener, now).await.unwrap();
    }
    assert!(store.mcp_session_created_one("s1", &a).await.unwrap());
    assert!(store.mcp_session_created_one("s1", &a).await.unwrap());
    store
        .mcp_session_current("s1", &b, Some("t1"))
        .await
        .unwrap();
    store.mcp_session_current("s1", &b, None).await.unwrap();
    store.mcp_session_current("s2", &a, None).await.unwrap();
    (a, b)
}

/// An MCP session as every replica sees it: its opener, what it holds, the
/// fleet-wide counts.
async fn an_mcp_session_is_its_openers_and_counted_fleet_wide(postgres: bool) {
    use flotilla_control_plane::store::McpSessionsOf;
    let (store, _guard) = open(postgres).await;
    let now = Utc::now();
    let (a, b) = two_mcp_sessions(&store, now).await;
    let live_since = now - Duration::seconds(60);
    let s1 = store
        .mcp_session_get("s1", live_since)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(s1.principal.as_deref(), Some("key:one"));
    assert_eq!(s1.tenant.as_deref(), Some("acme"));
    assert_eq!(s1.current_instance, Some(b.clone()));
    assert_eq!(
        s1.current_tab.as_deref(),
        Some("t1"),
        "the same instance keeps its tab"
    );
    for (of, n) in [
        (McpSessionsOf::All, 2),
        (McpSessionsOf::Principal("key:one"), 1),
        (McpSessionsOf::Tenant("acme"), 1),
        (McpSessionsOf::Tenant("globex"), 0),
    ] {
        let counted = store.mcp_sessions_count(of, live_since).await.unwrap();
        assert_eq!(counted, n, "{of:?}");
    }
    assert_eq!(store.mcp_sessions_holding(&a, live_since).await.unwrap(), 2);
    assert_eq!(store.mcp_sessions_holding(&b, live_since).await.unwrap(), 1);
    let each = store.mcp_sessions_holding_each(live_since).await.unwrap();
    assert_eq!((each[&a], each[&b]), (2, 1));
    store.mcp_session_let_go("s1", &b).await.unwrap();
    assert_eq!(store.mcp_sessions_holding(&b, live_since).await.unwrap(), 0);
    for (principal, used) in [("key:one", true), ("key:two", false)] {
        let got = store
            .mcp_session_use("s1", principal, (live_since, now))
            .await;
        assert_eq!(got.unwrap(), used, "{principal} uses s1");
    }
    let params = store.mcp_session_initialize_params("s1", live_since).await;
    assert!(params.unwrap().is_some());
}

/// An MCP session unused past its idle timeout is no longer live and is due
/// to end; only one caller claims its end (another again only once that
/// end went stale), and an ending session takes no more instances.
async fn an_idle_mcp_session_ends_once_and_is_forgotten(postgres: bool) {
    let (store, _guard) = open(postgres).await;
    let now = Utc::now();
    let (a, b) = two_mcp_sessions(&store, now).await;
    let later = now + Duration::seconds(120);
    store.mcp_session_touch("s2", later).await.unwrap();
    let live_since = later - Duration::seconds(60);
    let stale_before = later - Duration::seconds(60);
    assert_eq!(store.mcp_session_get("s1", live_since).await.unwrap(), None);
    let idle = store
        .mcp_session_use("s1", "key:one", (live_since, later))
        .await;
    assert!(!idle.unwrap(), "an idle session is not used again");
    let due = store.mcp_sessions_to_end(live_since, stale_before).await;
    assert_eq!(due.unwrap(), vec!["s1".to_owned()]);
    let claimed = store.mcp_session_end_claim("s1", later, stale_before).await;
    assert_eq!(claimed.unwrap(), Some(vec![a.clone()]));
    assert!(
        !store.mcp_session_created_one("s1", &b).await.unwrap(),
        "an ending session takes no more instances"
    );
    let asked = ["s1".into(), "s2".into(), "never".into()];
    let live = store.mcp_sessions_live_among(&asked, live_since).await;
    assert_eq!(live.unwrap(), HashSet::from(["s2".to_owned()]));
    let again = store.mcp_session_end_claim("s1", later, stale_before).await;
    assert_eq!(again.unwrap(), None, "one end at a time");
    let due = store.mcp_sessions_to_end(live_since, stale_before).await;
    assert!(due.unwrap().is_empty());
    // An end left unfinished for a minute is claimed again.
    let much_later = later + Duration::seconds(61);
    let due = store
        .mcp_sessions_to_end(live_since, much_later - Duration::seconds(60))
        .await;
    assert_eq!(due.unwrap(), vec!["s1".to_owned()]);
    store.mcp_session_forget("s1").await.unwrap();
    let gone = store
        .mcp_session_end_claim("s1", much_later, much_later)
        .await;
    assert!(gone.unwrap().is_none());
    let holding = store.mcp_sessions_holding(&a, live_since).await.unwrap();
    assert_eq!(holding, 1, "s2's current");
}

/// An instance held by a control plane's work: renewed by its holder, it
/// does not lapse; once it does, one other control plane takes it over
/// (never its own holder); a hold that lapses at once is anybody's.
async fn a_held_instance_lapses_only_when_its_holder_stops_renewing(postgres: bool) {
    let (store, _guard) = open(postgres).await;
    let now = Utc::now();
    let (kept, left) = (InstanceId::new("held-kept"), InstanceId::new("held-left"));
    for (id, holder) in [(&kept, "a"), (&left, "b")] {
        let until = now + Duration::seconds(30);
        store
            .held_instance_take(id, (holder, "action"), until)
            .await
            .unwrap();
    }
    let later = now + Duration::seconds(40);
    let until = later + Duration::seconds(30);
    let renewed = store
        .held_instances_renew("a", std::slice::from_ref(&kept), until)
        .await;
    assert_eq!(renewed.unwrap(), 1);
    let lapsed = store.held_instances_lapsed("c", later).await.unwrap();
    assert_eq!(lapsed, vec![(left.clone(), "action".to_owned())]);
    let own = store.held_instances_lapsed("b", later).await.unwrap();
    assert!(own.is_empty(), "not its own");
    let window = (later, later + Duration::seconds(30));
    for (id, taker, taken, why) in [
        (&left, "b", false, "not its own"),
        (&left, "c", true, "lapsed"),
        (&left, "d", false, "taken once"),
        (&kept, "d", false, "renewed"),
    ] {
        let got = store
            .held_instance_take_over(id, taker, window)
            .await
            .unwrap();
        assert_eq!(got, taken, "{taker} takes {id}: {why}");
    }
    // c's delete failed: the hold is nobody's, and c itself tries again.
    store.held_instance_lapse(&left, "c").await.unwrap();
    assert_eq!(
        store.held_instances_lapsed("c", later).await.unwrap().len(),
        1
    );
    assert!(
        store
            .held_instance_take_over(&left, "c", window)
            .await
            .unwrap()
    );
    store.held_instance_release(&left, "b").await.unwrap();
    let much_later = later + Duration::seconds(99);
    let lapsed = store.held_instances_lapsed("z", much_later).await.unwrap();
    assert_eq!(lapsed.len(), 2, "only its holder releases it");
    store.held_instance_release(&left, "c").await.unwrap();
    store.held_instance_release(&kept, "a").await.unwrap();
    let lapsed = store.held_instances_lapsed("z", much_later).await.unwrap();
    assert!(lapsed.is_empty());
}

async fn leases_pass_only_when_they_lapse(postgres: bool) {
    let (store, _guard) = open(postgres).await;
    let now = Utc::now();
    let ttl = Duration::seconds(10);
    // (holder, seconds after the first acquisition, granted?, why)
    for (holder, after, granted, why) in [
        ("a", 0, true, "free"),
        ("b", 5, false, "held by a"),
        ("a", 5, true, "renewed by its holder"),
        ("b", 14, false, "the renewal lasts until 15"),
        ("b", 16, true, "lapsed"),
    ] {
        let got = store
            .lease_acquire("sweep", holder, now + Duration::seconds(after), ttl)
            .await
            .unwrap();
        assert_eq!(got, granted, "{holder} at +{after}s: {why}");
    }
    assert!(
        store.lease_acquire("other", "a", now, ttl).await.unwrap(),
        "leases are per task"
    );
}

/// A write cut short (its caller dropped: a client gone mid-request, the
/// crash rounds' kill of an agent) between the commit and the read model's
/// refresh once left SQLite's read model stale for good: a deleted instance
/// still listed as creating. Writes are cut at every point of a spread of
/// moments; the read model then agrees with the database (a second store on
/// the same file, whose read model is loaded from it).
#[tokio::test]
async fn a_write_cut_short_leaves_the_read_model_as_the_database_is() {
    let (store, guard) = open(false).await;
    let Backend::Sqlite(dir) = &guard else {
        unreachable!()
    };
    store
        .node_upsert(&registration("n1", 500), Utc::now())
        .await
        .unwrap();
    let mut ids = Vec::new();
    for cut_after_us in (0..3000).step_by(25) {
        let new = new_instance("n1");
        ids.push(new.id.clone());
        store.instance_insert_if_room(&new, 500).await.unwrap();
        let cut = std::time::Duration::from_micros(cut_after_us);
        let id = new.id.clone();
        if cut_after_us % 2 == 0 {
            let _ = tokio::time::timeout(cut, store.instance_delete(&id, Utc::now())).await;
        } else {
            let moved = store.instance_transition(
                &id,
                &[InstanceStatus::Creating],
                InstanceStatus::Running,
                None,
                Utc::now(),
            );
            let _ = tokio::time::timeout(cut, moved).await;
        }
    }
    let url = format!("sqlite://{}/store.db", dir.path().display());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let truth = Store::connect(&url, 1).await.expect("a second store");
        let mut differ = Vec::new();
        for id in &ids {
            let seen = store.instance_get(id).await.unwrap().map(|r| r.status);
            let stored = truth.instance_get(id).await.unwrap().map(|r| r.status);
            if seen != stored {
                differ.push(format!("{id}: read model {seen:?}, database {stored:?}"));
            }
        }
        if differ.is_empty() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "stale read model:\n{}",
            differ.join("\n")
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}
