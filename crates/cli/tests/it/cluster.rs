//! A cluster of processes on loopback: `flotilla control` and `flotilla agent`s
//! talking HTTP with the cluster token. Capacity under concurrent creates,
//! placement with and without preference, a node that stops answering (its
//! instances fail, then are adopted again when it returns; what was deleted
//! meanwhile is stopped on it), kill -9 and restart, real Chromium on three
//! agents, and two control planes on one PostgreSQL.

use std::path::{Path, PathBuf};
use std::time::Duration;

use flotilla_testkit::{
    Api, BROWSER_DEADLINE, EventReceiver, OtlpReceiver, PgServer, ReceivedSpan, S3Server,
    ServeProcess, StatusCode, assert_error, free_port, get_json, run_node, wait_until,
};
use serde_json::Value;

pub(crate) const TOKEN: &str = "cluster-test-token";

fn binary() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_flotilla"))
}

pub(crate) async fn control(dir: &Path, extra: &[(&str, &str)]) -> ServeProcess {
    let data = dir.display().to_string();
    let mut env = vec![
        ("FLOTILLA_CLUSTER_TOKEN", TOKEN),
        ("FLOTILLA_NODES__HEARTBEAT_INTERVAL_SEC", "0.5"),
        ("FLOTILLA_NODES__HEARTBEAT_TIMEOUT_SEC", "3"),
        // Two loaded cores: the overload guard would refuse at random.
        ("FLOTILLA_SCHEDULER__MAX_UTILISATION_PERCENT", "100"),
    ];
    env.extend_from_slice(extra);
    ServeProcess::start_command(
        binary(),
        &["control", "--listen", "127.0.0.1:0", "--data-dir", &data],
        dir,
        &env,
        "control plane listening on ",
    )
    .await
    .expect("control starts")
}

pub(crate) struct AgentSpec<'a> {
    pub node: &'a str,
    pub max_instances: &'a str,
    pub ports: &'a str,
    pub sim: bool,
    /// More environment (e.g. a shared snapshot store).
    pub env: &'a [(&'a str, &'a str)],
}

impl<'a> AgentSpec<'a> {
    /// An agent on the sim runtime with nothing more in its environment.
    pub fn sim(node: &'a str, max_instances: &'a str, ports: &'a str) -> Self {
        AgentSpec {
            node,
            max_instances,
            ports,
            sim: true,
            env: &[],
        }
    }
}

pub(crate) async fn agent(control_url: &str, dir: &Path, spec: &AgentSpec<'_>) -> ServeProcess {
    let data = dir.display().to_string();
    let mut env = vec![
        ("FLOTILLA_CLUSTER_TOKEN", TOKEN),
        ("FLOTILLA_AGENT__NODE_ID", spec.node),
        ("FLOTILLA_AGENT__MAX_INSTANCES", spec.max_instances),
        ("FLOTILLA_AGENT__PORT_RANGE", spec.ports),
        ("FLOTILLA_AGENT__WARM_POOL_SIZE", "0"),
    ];
    if spec.sim {
        env.push(("FLOTILLA_AGENT__RUNTIME", "sim"));
    }
    env.extend_from_slice(spec.env);
    ServeProcess::start_command(
        binary(),
        &["agent", "--control-plane", control_url, "--data-dir", &data],
        dir,
        &env,
        "node agent listening on ",
    )
    .await
    .expect("agent starts")
}

/// A control plane whose agents are to share the snapshot directory
/// `dir/snapshots`; its `file://` URL.
async fn control_sharing_snapshots(dir: &Path) -> (ServeProcess, String) {
    let shared = dir.join("snapshots");
    std::fs::create_dir_all(&shared).unwrap();
    let snapshots_url = format!("file://{}", shared.display());
    let cp = control(
        &dir.join("cp"),
        &[("FLOTILLA_SNAPSHOTS__URL", &snapshots_url)],
    )
    .await;
    (cp, snapshots_url)
}

/// Agents on `nodes` (id, port range) that share the snapshot store at
/// `snapshots_url`, each with its data under `dir`.
async fn agents_sharing(
    control_url: &str,
    dir: &Path,
    nodes: [(&str, &str); 2],
    sim: bool,
    snapshots_url: &str,
) -> Vec<ServeProcess> {
    let mut agents = Vec::new();
    for (node, ports) in nodes {
        let spec = AgentSpec {
            node,
            max_instances: "10",
            ports,
            sim,
            env: &[("FLOTILLA_SNAPSHOTS__URL", snapshots_url)],
        };
        agents.push(agent(control_url, &dir.join(node), &spec).await);
    }
    agents
}

pub(crate) async fn wait_nodes(api: &Api, want: &[(&str, &str)]) {
    wait_until(Duration::from_secs(60), "node statuses", || async {
        let (_, body) = api.get("/v2/nodes").await;
        let nodes = body["nodes"].as_array().cloned().unwrap_or_default();
        let ok = want.iter().all(|(id, status)| {
            nodes
                .iter()
                .any(|n| n["id"] == *id && n["status"] == *status)
        });
        if ok {
            Ok(Some(()))
        } else {
            Err(format!("{body}"))
        }
    })
    .await
    .unwrap();
}

async fn count(api: &Api, query: &str) -> i64 {
    api.get(&format!("/v2/instances?{query}")).await.1["total"]
        .as_i64()
        .unwrap()
}

async fn wait_count(api: &Api, query: &str, want: i64) {
    wait_until(Duration::from_secs(60), query, || async {
        let n = count(api, query).await;
        if n == want {
            Ok(Some(()))
        } else {
            Err(format!("{n}"))
        }
    })
    .await
    .unwrap();
}

/// The instances an agent runs, from its agent API.
pub(crate) async fn agent_instances(agent: &ServeProcess) -> Vec<Value> {
    reqwest::Client::new()
        .get(format!("{}/agent/v1/instances", agent.api.base))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

#[tokio::test]
async fn cluster_capacity_preference_node_loss_and_reconciliation() {
    let temp = tempfile::tempdir().unwrap();
    let cp = control(&temp.path().join("cp"), &[]).await;
    let api = &cp.api;
    let url = api.base.clone();
    let spec = |node, ports| AgentSpec::sim(node, "10", ports);
    let mut n1 = agent(&url, &temp.path().join("n1"), &spec("n1", "21000-21999")).await;
    let n2_dir: PathBuf = temp.path().join("n2");
    let mut n2 = agent(&url, &n2_dir, &spec("n2", "22000-22999")).await;
    wait_nodes(api, &[("n1", "online"), ("n2", "online")]).await;

    // An agent API call without the token is refused.
    let refused = reqwest::get(format!("{}/agent/v1/instances", n1.api.base))
        .await
        .unwrap();
    assert_eq!(refused.status(), StatusCode::UNAUTHORIZED);
    let refused = reqwest::Client::new()
        .post(format!("{url}/internal/v1/nodes/heartbeat"))
        .bearer_auth("wrong")
        .json(&serde_json::json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), StatusCode::UNAUTHORIZED);

    // 50 concurrent creates against 2 nodes of 10: exactly 20 succeed.
    let creates: Vec<_> = (0..50)
        .map(|_| {
            let api = Api::new(url.clone());
            tokio::spawn(async move { api.post("/v2/instances", "{}").await })
        })
        .collect();
    let (mut created, mut refused) = (0, 0);
    for create in creates {
        let (status, body) = create.await.unwrap();
        match status {
            StatusCode::CREATED => created += 1,
            StatusCode::SERVICE_UNAVAILABLE => {
                assert_eq!(body["code"], "insufficient_capacity", "{body}");
                refused += 1;
            }
            other => panic!("unexpected {other}: {body}"),
        }
    }
    assert_eq!((created, refused), (20, 30));
    wait_count(api, "node_id=n1&status=running", 10).await;
    wait_count(api, "node_id=n2&status=running", 10).await;
    let (_, nodes) = api.get("/v2/nodes").await;
    for node in nodes["nodes"].as_array().unwrap() {
        assert_eq!(node["instances_count"], 10, "{node}");
    }

    // Preference: unknown → 400, full → 503, with room → that node.
    let (status, body) = api
        .post("/v2/instances", r#"{"node_preference": "n9"}"#)
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let (status, body) = api
        .post("/v2/instances", r#"{"node_preference": "n1"}"#)
        .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    let (_, on_n2) = api.get("/v2/instances?node_id=n2").await;
    let first_on_n2 = on_n2["instances"][0]["id"].as_str().unwrap().to_owned();
    api.delete_instance(&first_on_n2).await;
    let (status, body) = api
        .post("/v2/instances", r#"{"node_preference": "n2"}"#)
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(body["node_id"], "n2");

    // n1 stops answering: offline, its instances fail, creates go to… nowhere
    // (n2 is full), and a preference for n1 is 503.
    n1.signal(libc::SIGSTOP);
    wait_nodes(api, &[("n1", "offline")]).await;
    wait_count(api, "node_id=n1&status=failed", 10).await;
    assert_error(
        api.post("/v2/instances", r#"{"node_preference": "n1"}"#)
            .await,
        StatusCode::SERVICE_UNAVAILABLE,
        "insufficient_capacity",
        "offline",
    );
    let (_, on_n1) = api.get("/v2/instances?node_id=n1").await;
    let deleted_meanwhile = on_n1["instances"][0]["id"].as_str().unwrap().to_owned();
    api.delete_instance(&deleted_meanwhile).await;

    // It comes back: what it still runs is adopted, what was deleted is stopped.
    n1.signal(libc::SIGCONT);
    wait_nodes(api, &[("n1", "online")]).await;
    wait_count(api, "node_id=n1&status=running", 9).await;
    wait_until(
        Duration::from_secs(30),
        "the deleted instance stopped on n1",
        || async {
            let running = agent_instances(&n1).await;
            let ids: Vec<_> = running
                .iter()
                .map(|r| r["id"].as_str().unwrap().to_owned())
                .collect();
            if ids.len() == 9 && !ids.contains(&deleted_meanwhile) {
                Ok(Some(()))
            } else {
                Err(format!("{ids:?}"))
            }
        },
    )
    .await
    .unwrap();

    // kill -9 of n2: offline and failed; restarted, it is online with nothing left.
    n2.stop_with(libc::SIGKILL).await;
    wait_nodes(api, &[("n2", "offline")]).await;
    wait_count(api, "node_id=n2&status=failed", 10).await;
    let n2 = agent(&url, &n2_dir, &spec("n2", "22000-22999")).await;
    wait_nodes(api, &[("n2", "online")]).await;
    assert!(agent_instances(&n2).await.is_empty());
    assert_eq!(
        count(api, "node_id=n2&status=failed").await,
        10,
        "lost browsers stay failed"
    );
    // All of its recent instances failed: unhealthy, no placements (spec: > 10 %).
    assert_error(
        api.post("/v2/instances", r#"{"node_preference": "n2"}"#)
            .await,
        StatusCode::SERVICE_UNAVAILABLE,
        "insufficient_capacity",
        "unhealthy",
    );
    drop(n2);
    n1.stop_with(libc::SIGTERM).await;
}

#[tokio::test]
async fn a_second_agent_with_the_same_node_id_is_refused_and_a_restart_is_not() {
    let temp = tempfile::tempdir().unwrap();
    let cp = control(&temp.path().join("cp"), &[]).await;
    let api = &cp.api;
    let url = api.base.clone();
    let spec = |ports| AgentSpec::sim("twin", "5", ports);
    let mut first = agent(&url, &temp.path().join("first"), &spec("25000-25099")).await;
    wait_nodes(api, &[("twin", "online")]).await;
    let created = api.create("{}").await;
    let id = created["id"].as_str().unwrap().to_owned();
    api.wait_for_status(&id, "running", Duration::from_secs(30))
        .await;

    // Another process takes the same node id (two containers, one host name).
    // It never gets to "listening": it keeps asking to register.
    let second_port = free_port();
    let second_base = format!("http://127.0.0.1:{second_port}");
    let second_dir = temp.path().join("second");
    std::fs::create_dir_all(&second_dir).unwrap();
    let second_log = temp.path().join("second.stderr.log");
    let mut second = tokio::process::Command::new(binary())
        .args(["agent", "--control-plane", &url, "--data-dir"])
        .arg(&second_dir)
        .args(["--listen", &format!("127.0.0.1:{second_port}")])
        .envs([
            ("FLOTILLA_CLUSTER_TOKEN", TOKEN),
            ("FLOTILLA_AGENT__NODE_ID", "twin"),
            ("FLOTILLA_AGENT__MAX_INSTANCES", "5"),
            ("FLOTILLA_AGENT__PORT_RANGE", "25100-25199"),
            ("FLOTILLA_AGENT__RUNTIME", "sim"),
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&second_log).unwrap())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    wait_until(
        Duration::from_secs(30),
        "the second agent to be refused",
        || async {
            let log = std::fs::read_to_string(&second_log).unwrap_or_default();
            Ok::<_, std::convert::Infallible>(
                log.lines()
                    .find(|line| line.contains("held by another live agent"))
                    .map(str::to_owned),
            )
        },
    )
    .await
    .map(|line: String| {
        for part in ["\"twin\"", &first.api.base, &second_base, "agent.node_id"] {
            assert!(line.contains(part), "the refusal names {part}: {line}");
        }
    })
    .unwrap();
    // Nothing on either node was touched: the node is still the first agent,
    // its instance runs there and is still recorded as running.
    let (_, node) = api.get("/v2/nodes/twin").await;
    assert_eq!(node["address"], first.api.base, "{node}");
    assert!(agent_instances(&first).await.iter().any(|r| r["id"] == id));
    let (_, detail) = api.get(&format!("/v2/instances/{id}")).await;
    assert_eq!(detail["status"], "running", "{detail}");
    // The first agent's heartbeats still count.
    let before = node["last_heartbeat"].as_str().unwrap().to_owned();
    wait_until(Duration::from_secs(30), "a newer heartbeat", || async {
        let (_, node) = api.get("/v2/nodes/twin").await;
        let now = node["last_heartbeat"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        if now > before && node["address"] == first.api.base {
            Ok(Some(()))
        } else {
            Err(now)
        }
    })
    .await
    .unwrap();

    // The first one dies: the second is a restart of the node now.
    first.stop_with(libc::SIGKILL).await;
    wait_until(
        Duration::from_secs(60),
        "the second agent to take over",
        || async {
            let (_, node) = api.get("/v2/nodes/twin").await;
            if node["address"] == second_base && node["status"] == "online" {
                Ok(Some(()))
            } else {
                Err(node.to_string())
            }
        },
    )
    .await
    .unwrap();
    // Its registration reconciles: the first one's instance was lost with it.
    api.wait_for_status(&id, "stopped", Duration::from_secs(30))
        .await;
    let _ = second.kill().await;
}

#[tokio::test]
async fn browser_cluster_places_real_chromium_on_three_agents() {
    let temp = tempfile::tempdir().unwrap();
    // With authentication on: agents learn the key digests and each
    // instance's token from the control plane.
    let mut cp = control(
        &temp.path().join("cp"),
        &[
            ("FLOTILLA_AUTH_ENABLED", "true"),
            ("FLOTILLA_API_KEYS", "[\"cluster-api-key\"]"),
        ],
    )
    .await;
    cp.api = Api::with_key(cp.api.base.clone(), "cluster-api-key");
    let url = cp.api.base.clone();
    let mut agents = Vec::new();
    for (node, ports) in [
        ("b1", "23000-23099"),
        ("b2", "23100-23199"),
        ("b3", "23200-23299"),
    ] {
        let spec = AgentSpec {
            node,
            max_instances: "2",
            ports,
            sim: false,
            env: &[],
        };
        agents.push(agent(&url, &temp.path().join(node), &spec).await);
    }
    wait_nodes(
        &cp.api,
        &[("b1", "online"), ("b2", "online"), ("b3", "online")],
    )
    .await;
    let preferred = cp.api.create(r#"{"node_preference": "b3"}"#).await;
    assert_eq!(preferred["node_id"], "b3");
    let anywhere = cp.api.create("{}").await;
    for instance in [&preferred, &anywhere] {
        let id = instance["id"].as_str().unwrap();
        cp.api
            .wait_for_status(id, "running", BROWSER_DEADLINE)
            .await;
        let port = instance["debug_port"].as_u64().unwrap();
        let version_url = format!("http://127.0.0.1:{port}/json/version");
        let refused = reqwest::get(&version_url).await.unwrap();
        assert_eq!(refused.status(), StatusCode::UNAUTHORIZED);
        let token = instance["urls"]["debug"]
            .as_str()
            .unwrap()
            .split_once("?token=")
            .expect("urls.debug carries the token")
            .1
            .to_owned();
        let with_key: Value = reqwest::Client::new()
            .get(&version_url)
            .bearer_auth("cluster-api-key")
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert!(
            with_key["Browser"].as_str().unwrap().contains("Chrome"),
            "{with_key}"
        );
        let version: Value = get_json(&format!("{version_url}?token={token}")).await;
        assert!(
            version["webSocketDebuggerUrl"]
                .as_str()
                .unwrap()
                .ends_with(&format!("?token={token}")),
            "{version}"
        );
        let node = instance["node_id"].as_str().unwrap();
        let index = ["b1", "b2", "b3"].iter().position(|n| *n == node).unwrap();
        let running = agent_instances(&agents[index]).await;
        assert!(running.iter().any(|r| r["id"] == id), "{node} runs {id}");
    }
    for instance in [&preferred, &anywhere] {
        cp.api
            .delete_instance(instance["id"].as_str().unwrap())
            .await;
    }
    for mut agent in agents {
        assert_eq!(agent.stop_with(libc::SIGTERM).await, Some(0));
    }
}

#[tokio::test]
async fn two_control_planes_share_one_postgres() {
    let postgres = PgServer::start().await.unwrap();
    let database = postgres.database().await.unwrap();
    let temp = tempfile::tempdir().unwrap();
    // Both control planes send webhooks to one receiver: the outbox lease makes
    // each event go out once, not once per control plane.
    let receiver = EventReceiver::start("shared-secret").await;
    let config = temp.path().join("control.toml");
    std::fs::write(
        &config,
        format!(
            "[[webhooks]]\nurl = \"{}\"\nsecret = \"shared-secret\"\nevents = [\"instance.created\"]\n",
            receiver.url
        ),
    )
    .unwrap();
    let config = config.display().to_string();
    let env = [
        ("FLOTILLA_DATABASE_URL", database.as_str()),
        ("FLOTILLA_CONFIG", config.as_str()),
    ];
    let a = control(&temp.path().join("a"), &env).await;
    let b = control(&temp.path().join("b"), &env).await;
    let spec = |node, ports| AgentSpec::sim(node, "10", ports);
    let _n1 = agent(
        &a.api.base,
        &temp.path().join("n1"),
        &spec("p1", "24000-24999"),
    )
    .await;
    let _n2 = agent(
        &b.api.base,
        &temp.path().join("n2"),
        &spec("p2", "25000-25999"),
    )
    .await;
    for api in [&a.api, &b.api] {
        wait_nodes(api, &[("p1", "online"), ("p2", "online")]).await;
    }
    // 50 creates split over both control planes: still exactly 20.
    let creates: Vec<_> = (0..50)
        .map(|i| {
            let api = Api::new(if i % 2 == 0 {
                a.api.base.clone()
            } else {
                b.api.base.clone()
            });
            tokio::spawn(async move { api.post("/v2/instances", "{}").await.0 })
        })
        .collect();
    let mut created = 0;
    for create in creates {
        if create.await.unwrap() == StatusCode::CREATED {
            created += 1;
        }
    }
    assert_eq!(created, 20);
    // Either control plane reaches either node: B deletes an instance A placed on p1.
    wait_count(&b.api, "node_id=p1&status=running", 10).await;
    let (_, on_p1) = b.api.get("/v2/instances?node_id=p1").await;
    let id = on_p1["instances"][0]["id"].as_str().unwrap().to_owned();
    b.api.delete_instance(&id).await;
    wait_count(&a.api, "node_id=p1", 9).await;
    let (status, _) = a.api.get(&format!("/v2/instances/{id}")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    wait_until(
        Duration::from_secs(60),
        "20 instance.created webhooks",
        || async {
            let n = receiver.events().len();
            if n >= 20 {
                Ok(Some(()))
            } else {
                Err(format!("{n}"))
            }
        },
    )
    .await
    .unwrap();
    // Until the shared outbox is empty: every delivery has been made and recorded.
    a.api.wait_outbox_empty(Duration::from_secs(60)).await;
    let events = receiver.events();
    let ids: std::collections::HashSet<_> = events.iter().map(|e| e.id.clone()).collect();
    assert_eq!((events.len(), ids.len()), (20, 20), "each event once");
    assert_eq!(receiver.bad_signatures(), 0);
}

#[tokio::test]
async fn revive_moves_to_another_node_when_its_node_is_gone() {
    let temp = tempfile::tempdir().unwrap();
    let (cp, snapshots_url) = control_sharing_snapshots(temp.path()).await;
    let api = &cp.api;
    let nodes = [("r1", "26000-26099"), ("r2", "26100-26199")];
    let mut agents = agents_sharing(&api.base, temp.path(), nodes, true, &snapshots_url).await;
    wait_nodes(api, &[("r1", "online"), ("r2", "online")]).await;
    let created = api.create(r#"{"node_preference": "r1"}"#).await;
    let id = created["id"].as_str().unwrap().to_owned();
    api.wait_for_status(&id, "running", Duration::from_secs(60))
        .await;
    api.park(&id).await;

    agents[0].stop_with(libc::SIGKILL).await;
    wait_nodes(api, &[("r1", "offline")]).await;
    api.revive(&id).await;
    let revived = api
        .wait_for_status(&id, "running", Duration::from_secs(60))
        .await;
    assert_eq!(revived["node_id"], "r2", "{revived}");
    let running = agent_instances(&agents[1]).await;
    assert!(
        running.iter().any(|r| r["id"] == id.as_str()),
        "{running:?}"
    );
}

#[tokio::test]
async fn browser_clients_use_only_the_control_planes_port_across_the_cluster() {
    let temp = tempfile::tempdir().unwrap();
    let shared = temp.path().join("snapshots");
    std::fs::create_dir_all(&shared).unwrap();
    let snapshots_url = format!("file://{}", shared.display());
    let port = free_port();
    let public_url = format!("http://127.0.0.1:{port}");
    let cp_dir = temp.path().join("cp");
    let cp = ServeProcess::start_command(
        binary(),
        &[
            "control",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--data-dir",
            &cp_dir.display().to_string(),
        ],
        &cp_dir,
        &[
            ("FLOTILLA_CLUSTER_TOKEN", TOKEN),
            ("FLOTILLA_NODES__HEARTBEAT_INTERVAL_SEC", "0.5"),
            ("FLOTILLA_NODES__HEARTBEAT_TIMEOUT_SEC", "3"),
            ("FLOTILLA_SCHEDULER__MAX_UTILISATION_PERCENT", "100"),
            ("FLOTILLA_SNAPSHOTS__URL", &snapshots_url),
            ("FLOTILLA_AUTH_ENABLED", "true"),
            ("FLOTILLA_API_KEYS", "[\"door-cluster-key\"]"),
            ("FLOTILLA_PUBLIC_URL", &public_url),
        ],
        "control plane listening on ",
    )
    .await
    .unwrap();
    let api = Api::with_key(cp.api.base.clone(), "door-cluster-key");
    let nodes = [("d1", "27000-27099"), ("d2", "27100-27199")];
    let mut agents = agents_sharing(&api.base, temp.path(), nodes, false, &snapshots_url).await;
    wait_nodes(&api, &[("d1", "online"), ("d2", "online")]).await;
    let page = "data:text/html,<title>door across nodes</title>";
    let mut on_d1 = None;
    for node in ["d1", "d2"] {
        let (id, created, _) = api
            .create_running(&format!(r#"{{"node_preference": "{node}"}}"#))
            .await;
        let debug = created["urls"]["debug"].as_str().unwrap().to_owned();
        assert!(
            debug.starts_with(&format!(
                "ws://127.0.0.1:{port}/v2/instances/{id}/cdp?token="
            )),
            "{debug}"
        );
        let result = flotilla_testkit::run_node("playwright_title.mjs", &[&debug, page])
            .await
            .unwrap();
        assert_eq!(
            result["title"], "door across nodes",
            "through the door to {node}"
        );
        if node == "d1" {
            on_d1 = Some((id, debug));
        }
    }

    // Parked, its node gone, revived elsewhere: the same URL reaches it.
    let (id, debug) = on_d1.unwrap();
    api.park(&id).await;
    agents[0].stop_with(libc::SIGKILL).await;
    wait_nodes(&api, &[("d1", "offline")]).await;
    api.revive(&id).await;
    let revived = api.wait_for_status(&id, "running", BROWSER_DEADLINE).await;
    assert_eq!(revived["node_id"], "d2", "{revived}");
    assert_eq!(revived["urls"]["debug"], debug.as_str(), "the URL stays");
    let result = flotilla_testkit::run_node("playwright_title.mjs", &[&debug, page])
        .await
        .unwrap();
    assert_eq!(result["title"], "door across nodes");
    for mut agent in agents.into_iter().skip(1) {
        assert_eq!(agent.stop_with(libc::SIGTERM).await, Some(0));
    }
}

/// The tabs of instance `id`, through the door: their URLs.
async fn door_tab_urls(api: &Api, id: &str) -> Vec<String> {
    let (status, tabs) = api.get(&format!("/v2/instances/{id}/tabs")).await;
    assert_eq!(status, StatusCode::OK, "{tabs}");
    tabs.as_array()
        .unwrap()
        .iter()
        .filter_map(|tab| tab["url"].as_str().map(str::to_owned))
        .collect()
}

async fn drain_report(api: &Api, node: &str) -> Value {
    wait_until(Duration::from_secs(240), "the drain to finish", || async {
        let (_, detail) = api.get(&format!("/v2/nodes/{node}")).await;
        match detail["drain"]["finished"].as_bool() {
            Some(true) => Ok(Some(detail["drain"].clone())),
            _ => Err(detail.to_string()),
        }
    })
    .await
    .unwrap()
}

#[tokio::test]
async fn a_drain_goes_on_in_another_control_plane_when_its_own_is_killed() {
    let postgres = PgServer::start().await.unwrap();
    let database = postgres.database().await.unwrap();
    let temp = tempfile::tempdir().unwrap();
    let shared = temp.path().join("snapshots");
    std::fs::create_dir_all(&shared).unwrap();
    let snapshots_url = format!("file://{}", shared.display());
    let env = [
        ("FLOTILLA_DATABASE_URL", database.as_str()),
        ("FLOTILLA_SNAPSHOTS__URL", snapshots_url.as_str()),
    ];
    // A runs the drain and stops dead between recording its first revive
    // and asking the node for it (held at that point, then killed): the
    // hardest moment to take a drain over from.
    let held = temp.path().join("never");
    let fault = format!("control-revive-recorded=until:{}", held.display());
    let mut a_env = env.to_vec();
    a_env.push(("FLOTILLA_FAULTS", fault.as_str()));
    let mut a = control(&temp.path().join("a"), &a_env).await;
    let b = control(&temp.path().join("b"), &env).await;
    // The agents report to B. Each revive takes a second and a half (a sim
    // instance's start).
    let slow = [
        ("FLOTILLA_SNAPSHOTS__URL", snapshots_url.as_str()),
        ("FLOTILLA_AGENT__SIM_START_MS", "1500"),
    ];
    let mut agents = Vec::new();
    for (node, ports) in [("d1", "29000-29099"), ("d2", "29100-29199")] {
        let spec = AgentSpec {
            env: &slow,
            ..AgentSpec::sim(node, "10", ports)
        };
        agents.push(agent(&b.api.base, &temp.path().join(node), &spec).await);
    }
    wait_nodes(&a.api, &[("d1", "online"), ("d2", "online")]).await;
    let mut ids = Vec::new();
    for _ in 0..6 {
        let created = a.api.create(r#"{"node_preference": "d1"}"#).await;
        ids.push(created["id"].as_str().unwrap().to_owned());
    }
    wait_count(&b.api, "node_id=d1&status=running", 6).await;

    let (status, _) = a.api.post("/v2/nodes/d1/drain", "").await;
    assert_eq!(status, StatusCode::ACCEPTED);
    // B shows A's drain; A has recorded its first revive and holds there.
    wait_until(
        Duration::from_secs(60),
        "A's first revive, seen from B",
        || async {
            let (_, node) = b.api.get("/v2/nodes/d1").await;
            let reviving = count(&b.api, "status=reviving").await;
            if node["drain"]["finished"] == false && reviving == 1 {
                Ok(Some(()))
            } else {
                Err(format!("{reviving} reviving, {node}"))
            }
        },
    )
    .await
    .unwrap();
    a.stop_with(libc::SIGKILL).await;

    // B takes the drain over and finishes it: every instance moved, once.
    let report = drain_report(&b.api, "d1").await;
    assert_eq!(report["stayed"], serde_json::json!([]), "{report}");
    let moved: Vec<&str> = report["moved"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["instance_id"].as_str().unwrap())
        .collect();
    let mut sorted = moved.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(sorted.len(), 6, "each instance moved once: {report}");
    for id in &ids {
        let detail = b
            .api
            .wait_for_status(id, "running", Duration::from_secs(60))
            .await;
        assert_eq!(detail["node_id"], "d2", "{detail}");
    }
    // Every record agrees with the nodes: d2 runs the six, d1 none.
    let on_d2: Vec<Value> = agent_instances(&agents[1]).await;
    for id in &ids {
        assert!(on_d2.iter().any(|r| r["id"] == id.as_str()), "{on_d2:?}");
    }
    wait_until(Duration::from_secs(60), "d1 to run nothing", || async {
        let on_d1 = agent_instances(&agents[0]).await;
        if on_d1.is_empty() {
            Ok(Some(()))
        } else {
            Err(format!("{on_d1:?}"))
        }
    })
    .await
    .unwrap();
    let takeover = b.api.background_task("drain takeover").await;
    assert_eq!(takeover["changed"], 1, "{takeover}");
}

#[tokio::test]
async fn browser_a_drained_node_moves_its_instances_with_their_tabs_and_keeps_what_cannot_move() {
    // As in production: the store on PostgreSQL, snapshots in S3 (moto).
    let postgres = PgServer::start().await.unwrap();
    let database = postgres.database().await.unwrap();
    let s3 = S3Server::start("drain").await.unwrap();
    let snapshots = [
        (
            "FLOTILLA_SNAPSHOTS__URL",
            format!("s3://{}/fleet", s3.bucket),
        ),
        ("FLOTILLA_SNAPSHOTS__ENDPOINT", s3.endpoint.clone()),
        ("FLOTILLA_SNAPSHOTS__ALLOW_HTTP", "true".into()),
        ("FLOTILLA_SNAPSHOTS__REGION", "us-east-1".into()),
        ("FLOTILLA_SNAPSHOTS__ACCESS_KEY_ID", "test".into()),
        ("FLOTILLA_SNAPSHOTS__SECRET_ACCESS_KEY", "test".into()),
    ];
    let snapshot_env: Vec<(&str, &str)> = snapshots
        .iter()
        .map(|(key, value)| (*key, value.as_str()))
        .collect();
    let temp = tempfile::tempdir().unwrap();
    let mut control_env = snapshot_env.clone();
    control_env.push(("FLOTILLA_DATABASE_URL", &database));
    let cp = control(&temp.path().join("cp"), &control_env).await;
    let api = &cp.api;
    let mut agents = Vec::new();
    for (node, ports) in [("m1", "28000-28099"), ("m2", "28100-28199")] {
        let spec = AgentSpec {
            node,
            max_instances: "10",
            ports,
            sim: false,
            env: &snapshot_env,
        };
        agents.push(agent(&api.base, &temp.path().join(node), &spec).await);
    }
    wait_nodes(api, &[("m1", "online"), ("m2", "online")]).await;

    // Three instances on m1, each with two tabs of its own.
    let mut instances = Vec::new();
    for n in 0..3 {
        let (id, _, _) = api.create_running(r#"{"node_preference": "m1"}"#).await;
        let mut pages = Vec::new();
        for tab in 0..2 {
            let page = format!("data:text/html,<title>instance {n} tab {tab}</title>");
            let (status, body) = api
                .call(
                    reqwest::Method::PUT,
                    &format!("/v2/instances/{id}/json/new?{page}"),
                    None,
                )
                .await;
            assert_eq!(status, StatusCode::OK, "{body}");
            pages.push(page);
        }
        let urls = door_tab_urls(api, &id).await;
        for page in &pages {
            assert!(urls.contains(page), "{urls:?}");
        }
        instances.push((id, pages));
    }
    // And a Firefox with a cookie of its own.
    let (firefox, _, running) = api
        .create_running(r#"{"node_preference": "m1", "image": "firefox"}"#)
        .await;
    let bidi = running["urls"]["bidi"].as_str().unwrap().to_owned();
    let cookie = ["set", "kept", "across-the-drain", "example.com"];
    let set = run_node("bidi_cookie.mjs", &[&[bidi.as_str()][..], &cookie].concat()).await;
    assert_eq!(set.unwrap()["set"], true);

    // Drain m1: it takes no new instance, and everything moves to m2.
    let (status, report) = api.post("/v2/nodes/m1/drain", "").await;
    assert_eq!(status, StatusCode::ACCEPTED, "{report}");
    assert_eq!(report["moving"].as_array().unwrap().len(), 4, "{report}");
    wait_nodes(api, &[("m1", "draining")]).await;
    let (status, refused) = api
        .post("/v2/instances", r#"{"node_preference": "m1"}"#)
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{refused}");
    assert!(
        refused["detail"].as_str().unwrap().contains("draining"),
        "{refused}"
    );
    let report = drain_report(api, "m1").await;
    assert_eq!(report["moved"].as_array().unwrap().len(), 4, "{report}");
    assert!(report["stayed"].as_array().unwrap().is_empty(), "{report}");
    // The Firefox moved like any other, its cookie with it.
    let (_, detail) = api.get(&format!("/v2/instances/{firefox}")).await;
    assert_eq!(detail["node_id"], "m2", "{detail}");
    assert_eq!(detail["status"], "running", "{detail}");
    let bidi = detail["urls"]["bidi"].as_str().unwrap();
    let seen = run_node("bidi_cookie.mjs", &[bidi, "get"]).await.unwrap();
    assert_eq!(
        seen["cookies"],
        serde_json::json!(["kept=across-the-drain@example.com"]),
        "{seen}"
    );
    api.delete_instance(&firefox).await;
    for (id, pages) in &instances {
        let (_, detail) = api.get(&format!("/v2/instances/{id}")).await;
        assert_eq!(detail["node_id"], "m2", "{detail}");
        assert_eq!(detail["status"], "running", "{detail}");
        // Its tabs came along, and its door URLs still reach it.
        let urls = door_tab_urls(api, id).await;
        for page in pages {
            assert!(urls.contains(page), "{id}: {urls:?}");
        }
        let (status, version) = api.get(&format!("/v2/instances/{id}/json/version")).await;
        assert_eq!(status, StatusCode::OK, "{version}");
    }
    // m1 let go of what moved: no dormant slot is left to hold its room or
    // to be woken there by a client of its old ports.
    wait_until(
        Duration::from_secs(30),
        "m1 to release the moved instances",
        || async {
            let left = agent_instances(&agents[0]).await;
            if left.is_empty() {
                Ok(Some(()))
            } else {
                Err(format!("{left:?}"))
            }
        },
    )
    .await
    .unwrap();

    // Draining m2 too: no node has room for its instances, which stay,
    // running, each with the reason.
    let (status, _) = api.post("/v2/nodes/m2/drain", "").await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let report = drain_report(api, "m2").await;
    let stayed = report["stayed"].as_array().unwrap();
    assert_eq!(stayed.len(), 3, "{report}");
    for entry in stayed {
        assert!(
            entry["reason"]
                .as_str()
                .unwrap()
                .contains("no other node can take it"),
            "{entry}"
        );
    }
    for (id, _) in &instances {
        let (_, detail) = api.get(&format!("/v2/instances/{id}")).await;
        assert_eq!(detail["status"], "running", "{detail}");
        assert_eq!(detail["node_id"], "m2", "{detail}");
    }

    // Uncordoned, m1 takes instances again.
    let (status, node) = api.post("/v2/nodes/m1/uncordon", "").await;
    assert_eq!(status, StatusCode::OK, "{node}");
    assert_eq!(node["status"], "online", "{node}");
    let (status, body) = api.post("/v2/nodes/nowhere/drain", "").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
}

#[tokio::test]
async fn browser_an_agent_stopped_with_drain_on_shutdown_moves_its_instances_with_their_tabs_first()
{
    let temp = tempfile::tempdir().unwrap();
    let (cp, snapshots_url) = control_sharing_snapshots(temp.path()).await;
    let api = &cp.api;
    let leaving_env = [
        ("FLOTILLA_SNAPSHOTS__URL", snapshots_url.as_str()),
        ("FLOTILLA_AGENT__DRAIN_ON_SHUTDOWN", "true"),
        ("FLOTILLA_AGENT__DRAIN_TIMEOUT_SEC", "40"),
    ];
    let leaving = AgentSpec {
        env: &leaving_env,
        sim: false,
        ..AgentSpec::sim("s1", "10", "26200-26299")
    };
    // The other node has room for two of the three.
    let staying_env = [("FLOTILLA_SNAPSHOTS__URL", snapshots_url.as_str())];
    let staying = AgentSpec {
        env: &staying_env,
        sim: false,
        ..AgentSpec::sim("s2", "2", "26300-26399")
    };
    let mut s1 = agent(&api.base, &temp.path().join("s1"), &leaving).await;
    let s2 = agent(&api.base, &temp.path().join("s2"), &staying).await;
    wait_nodes(api, &[("s1", "online"), ("s2", "online")]).await;
    // Three real browsers on s1, each with a tab of its own.
    let mut ids = Vec::new();
    let tab_of = |n: usize| format!("data:text/html,<title>leaving {n}</title>");
    for n in 0..3 {
        let (id, _, _) = api.create_running(r#"{"node_preference": "s1"}"#).await;
        let (status, body) = api
            .call(
                reqwest::Method::PUT,
                &format!("/v2/instances/{id}/json/new?{}", tab_of(n)),
                None,
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        ids.push(id);
    }

    // The doors this adds refuse what is not theirs to take.
    let client = reqwest::Client::new();
    let running_on_s1 = &ids[0];
    let forget = |base: &str, id: &str| format!("{base}/agent/v1/instances/{id}/forget");
    for token in [None, Some("wrong")] {
        let mut request = client.post(forget(&s1.api.base, running_on_s1));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        let status = request.send().await.unwrap().status();
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{token:?}");
    }
    for (id, want) in [
        // Running here: a forget must not drop it.
        (running_on_s1.as_str(), StatusCode::CONFLICT),
        ("nowhere", StatusCode::NOT_FOUND),
        ("..%2F..%2Fetc", StatusCode::NOT_FOUND),
    ] {
        let answer = client
            .post(forget(&s1.api.base, id))
            .bearer_auth(TOKEN)
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), want, "{id}");
    }
    api.wait_for_status(running_on_s1, "running", Duration::from_secs(10))
        .await;
    let internal = |path: &str| format!("{}/internal/v1/nodes/{path}", api.base);
    for path in ["drain", "drain/report"] {
        let refused = client
            .post(internal(path))
            .json(&serde_json::json!({"node_id": "s1"}))
            .send()
            .await
            .unwrap();
        assert_eq!(refused.status(), StatusCode::UNAUTHORIZED, "{path}");
    }
    let unknown = client
        .post(internal("drain"))
        .bearer_auth(TOKEN)
        .json(&serde_json::json!({"node_id": "nowhere"}))
        .send()
        .await
        .unwrap();
    assert_eq!(unknown.status(), StatusCode::NOT_FOUND);
    // A body that is not a drain request is refused before anything drains.
    for (body, want) in [
        (
            r#"{"node_id": "s1", "until": "never"}"#.as_bytes(),
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (
            b"{\"node_id\": \"s\xff1\"}".as_slice(),
            StatusCode::BAD_REQUEST,
        ),
        (b"node_id=s1".as_slice(), StatusCode::BAD_REQUEST),
    ] {
        let refused = client
            .post(internal("drain"))
            .bearer_auth(TOKEN)
            .header("content-type", "application/json")
            .body(body.to_vec())
            .send()
            .await
            .unwrap();
        assert_eq!(refused.status(), want, "{}", String::from_utf8_lossy(body));
    }
    let (_, node) = api.get("/v2/nodes/s1").await;
    assert_eq!(node["status"], "online", "{node}");
    let none: Value = client
        .post(internal("drain/report"))
        .bearer_auth(TOKEN)
        .json(&serde_json::json!({"node_id": "s1"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(none, Value::Null, "no drain of s1 yet");

    // SIGTERM: the agent drains its node, then exits cleanly.
    assert_eq!(s1.stop_with(libc::SIGTERM).await, Some(0));
    let (_, node) = api.get("/v2/nodes/s1").await;
    let report = &node["drain"];
    assert_eq!(report["finished"], true, "{node}");
    assert_eq!(report["moved"].as_array().unwrap().len(), 2, "{node}");
    let stayed = report["stayed"].as_array().unwrap();
    assert_eq!(stayed.len(), 1, "{node}");
    assert!(
        stayed[0]["reason"].as_str().unwrap().contains("was parked"),
        "{node}"
    );
    let mut on_s2 = 0;
    for (n, id) in ids.iter().enumerate() {
        let (_, detail) = api.get(&format!("/v2/instances/{id}")).await;
        match detail["status"].as_str() {
            Some("running") => {
                assert_eq!(detail["node_id"], "s2", "{detail}");
                // Its tab came along, through the same door URL.
                let urls = door_tab_urls(api, id).await;
                assert!(urls.contains(&tab_of(n)), "{id}: {urls:?}");
                on_s2 += 1;
            }
            // The one no node had room for was parked, not stopped.
            Some("dormant") => assert_eq!(detail["node_id"], "s1", "{detail}"),
            _ => panic!("{detail}"),
        }
    }
    assert_eq!(on_s2, 2);
    assert_eq!(agent_instances(&s2).await.len(), 2);
    let parked = &stayed[0]["instance_id"];

    // The agent back (a new process): the drain ends, and what was parked
    // revives on its node.
    let _s1 = agent(&api.base, &temp.path().join("s1"), &leaving).await;
    wait_nodes(api, &[("s1", "online")]).await;
    let parked = parked.as_str().unwrap();
    api.revive(parked).await;
    let revived = api
        .wait_for_status(parked, "running", Duration::from_secs(60))
        .await;
    assert_eq!(revived["node_id"], "s1", "{revived}");
}

/// The spans of `receiver` once `done` holds for them (30 s at most).
async fn spans_when(
    receiver: &OtlpReceiver,
    what: &str,
    done: impl Fn(&[ReceivedSpan]) -> bool,
) -> Vec<ReceivedSpan> {
    wait_until(Duration::from_secs(30), what, || async {
        let spans = receiver.spans();
        if done(&spans) {
            Ok(Some(spans))
        } else {
            let names: Vec<String> = spans
                .iter()
                .map(|s| format!("{}:{}", s.role, s.name))
                .collect();
            Err(format!("{names:?}"))
        }
    })
    .await
    .unwrap()
}

#[tokio::test]
async fn a_create_is_one_trace_across_the_control_plane_and_the_agent() {
    let temp = tempfile::tempdir().unwrap();
    let receiver = OtlpReceiver::start().await;
    let telemetry = [
        ("FLOTILLA_TELEMETRY__OTLP_ENDPOINT", receiver.url.as_str()),
        // Export every 200 ms rather than every 5 s.
        ("OTEL_BSP_SCHEDULE_DELAY", "200"),
    ];
    let cp = control(&temp.path().join("cp"), &telemetry).await;
    let api = &cp.api;
    let spec = AgentSpec {
        env: &telemetry,
        ..AgentSpec::sim("t1", "10", "26400-26499")
    };
    let _agent = agent(&api.base, &temp.path().join("t1"), &spec).await;
    wait_nodes(api, &[("t1", "online")]).await;

    let (id, _, _) = api.create_running("{}").await;
    let create_spans = |spans: &[ReceivedSpan]| {
        let create = spans.iter().find(|s| {
            s.name == "instance.create" && s.attributes.get("instance.id") == Some(&id)
        })?;
        let trace: Vec<ReceivedSpan> = spans
            .iter()
            .filter(|s| s.trace_id == create.trace_id)
            .cloned()
            .collect();
        let names: Vec<&str> = trace.iter().map(|s| s.name.as_str()).collect();
        [
            "POST /v2/instances",
            "POST /agent/v1/instances",
            "agent.instance.create",
        ]
        .iter()
        .all(|name| names.contains(name))
        .then_some(trace)
    };
    let spans = spans_when(
        &receiver,
        "the create's spans from both processes",
        |spans| create_spans(spans).is_some(),
    )
    .await;
    let trace = create_spans(&spans).unwrap();
    let span = |name: &str| trace.iter().find(|s| s.name == name).unwrap().clone();
    let request = span("POST /v2/instances");
    let create = span("instance.create");
    let agent_request = span("POST /agent/v1/instances");
    let agent_create = span("agent.instance.create");
    // One trace: the request, its operation, and the agent's part under it.
    assert_eq!(request.role, "control");
    assert_eq!(
        request.parent_span_id, "",
        "the client sent no trace context"
    );
    assert_eq!(request.attributes["http.response.status_code"], "201");
    assert_eq!(create.role, "control");
    assert_eq!(create.parent_span_id, request.span_id);
    assert_eq!(create.attributes["node.id"], "t1");
    assert_eq!(create.attributes["outcome"], "ok");
    assert_eq!(agent_request.role, "agent");
    let control_span_ids: Vec<&str> = trace
        .iter()
        .filter(|s| s.role == "control")
        .map(|s| s.span_id.as_str())
        .collect();
    assert!(
        control_span_ids.contains(&agent_request.parent_span_id.as_str()),
        "the agent's request continues the control plane's span: {trace:?}"
    );
    assert_eq!(agent_create.parent_span_id, agent_request.span_id);
    assert_eq!(agent_create.attributes["instance.id"], id);
    assert_eq!(agent_create.attributes["node.id"], "t1");
    assert_eq!(request.service_name, "flotilla");

    // A client's trace context is continued; a failed operation says so;
    // span names are routes, never the raw path.
    let client_trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let answer = reqwest::Client::new()
        .post(format!("{}/v2/instances/{id}/revive", api.base))
        .header(
            "traceparent",
            format!("00-{client_trace}-00f067aa0ba902b7-01"),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), StatusCode::CONFLICT, "a running instance");
    api.park(&id).await;
    let spans = spans_when(&receiver, "the revive's and the park's spans", |spans| {
        let named = |name: &str| {
            spans
                .iter()
                .any(|s| s.name == name && s.attributes.get("instance.id") == Some(&id))
        };
        named("instance.revive") && named("instance.park") && named("agent.instance.park")
    })
    .await;
    let revive = spans.iter().find(|s| s.name == "instance.revive").unwrap();
    assert_eq!(revive.trace_id, client_trace, "{spans:#?}");
    assert_eq!(revive.attributes["outcome"], "error");
    assert_eq!(revive.status_code, 2, "{revive:?}");
    assert!(
        revive.attributes["error.message"].contains("running"),
        "{revive:?}"
    );
    let revive_request = spans
        .iter()
        .find(|s| s.span_id == revive.parent_span_id)
        .unwrap();
    assert_eq!(
        revive_request.name,
        "POST /v2/instances/{instance_id}/revive"
    );
    assert_eq!(revive_request.parent_span_id, "00f067aa0ba902b7");
    assert_eq!(
        revive_request.attributes["http.response.status_code"],
        "409"
    );
    for span in &spans {
        assert!(!span.name.contains(&id), "{span:?}");
    }

    // A trace context that is not one (bad hex, all zeros, 8 KiB) is
    // ignored: the request is answered, and its span starts a trace.
    let oversized = "0".repeat(8000);
    let bad_contexts = [
        "00-zzzzf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "00-00000000000000000000000000000000-0000000000000000-01",
        oversized.as_str(),
    ];
    for bad in bad_contexts {
        let answer = reqwest::Client::new()
            .get(format!("{}/v2/instances/{id}", api.base))
            .header("traceparent", bad)
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), StatusCode::OK, "{}", &bad[..20]);
    }
    let spans = spans_when(&receiver, "the gets' spans", |spans| {
        spans
            .iter()
            .filter(|s| s.name == "GET /v2/instances/{instance_id}")
            .count()
            >= bad_contexts.len()
    })
    .await;
    for get in spans
        .iter()
        .filter(|s| s.name == "GET /v2/instances/{instance_id}")
    {
        assert_eq!(get.parent_span_id, "", "{get:?}");
        assert_ne!(get.trace_id, "00000000000000000000000000000000");
    }
    assert_eq!(receiver.malformed(), 0);
}

#[tokio::test]
async fn nothing_moves_to_a_node_that_does_not_share_the_snapshot_store() {
    let temp = tempfile::tempdir().unwrap();
    let cp = control(&temp.path().join("cp"), &[]).await;
    let api = &cp.api;
    // Each agent keeps snapshots in its own data directory.
    let mut u1 = agent(
        &api.base,
        &temp.path().join("u1"),
        &AgentSpec::sim("u1", "10", "26500-26599"),
    )
    .await;
    let _u2 = agent(
        &api.base,
        &temp.path().join("u2"),
        &AgentSpec::sim("u2", "10", "26600-26699"),
    )
    .await;
    wait_nodes(api, &[("u1", "online"), ("u2", "online")]).await;
    let (id, _, _) = api.create_running(r#"{"node_preference": "u1"}"#).await;

    // A drain: u2 has room but not u1's snapshots; the instance stays,
    // running, and the report says why.
    let (status, _) = api.post("/v2/nodes/u1/drain", "").await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let report = drain_report(api, "u1").await;
    let stayed = report["stayed"].as_array().unwrap();
    assert_eq!(stayed.len(), 1, "{report}");
    let reason = stayed[0]["reason"].as_str().unwrap();
    assert!(
        reason.contains("snapshot store") && reason.contains("u2"),
        "{reason}"
    );
    assert!(
        !reason.contains(temp.path().to_str().unwrap()),
        "no path: {reason}"
    );
    let (_, detail) = api.get(&format!("/v2/instances/{id}")).await;
    assert_eq!(detail["status"], "running", "{detail}");
    assert_eq!(detail["node_id"], "u1", "{detail}");

    // Parked, with its node gone: no other node can revive it.
    let (status, _) = api.post("/v2/nodes/u1/uncordon", "").await;
    assert_eq!(status, StatusCode::OK);
    api.park(&id).await;
    u1.stop_with(libc::SIGKILL).await;
    wait_nodes(api, &[("u1", "offline")]).await;
    let (status, refused) = api.post(&format!("/v2/instances/{id}/revive"), "").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{refused}");
    assert!(
        refused["detail"]
            .as_str()
            .unwrap()
            .contains("snapshot store"),
        "{refused}"
    );
    let (_, detail) = api.get(&format!("/v2/instances/{id}")).await;
    assert_eq!(detail["status"], "dormant", "{detail}");
}
