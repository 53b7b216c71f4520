//! Two control planes behind one load balancer (nginx, round-robin: each
//! request to the next replica), on one PostgreSQL, with two node agents
//! that reach them through the balancer too, as behind a Kubernetes
//! Service: real clients through the balancer's one address.

use std::collections::HashSet;

use std::path::Path;

use flotilla_testkit::{
    Api, BROWSER_DEADLINE, Balancer, PageServer, PgServer, ServeProcess, SseClient, StatusCode,
    free_port, get_text, run_node, run_python, serve_page, serve_pages_and_hang, spawn_proxy,
    wait_until,
};
use serde_json::Value;

use crate::cluster::{AgentSpec, agent, agent_instances, control, wait_nodes};

const FORM: &str = "<!doctype html><title>replicas</title><input id=name>\
<button id=send onclick=\"said.textContent='Hello, '+document.getElementById('name').value\">Send</button>\
<p id=said></p>";

fn port_of(api: &Api) -> u16 {
    api.base.rsplit(':').next().unwrap().parse().unwrap()
}

/// Two control planes on one PostgreSQL behind a balancer, two node agents
/// (on `ports`) registered through it: with real browsers that may open
/// `site`, or, without a site, on the sim runtime with one slot each.
/// `extra` goes to both control planes' environment.
struct TwoReplicas {
    _postgres: PgServer,
    a: ServeProcess,
    b: ServeProcess,
    balancer: Balancer,
    agents: Vec<ServeProcess>,
}

impl TwoReplicas {
    async fn start(
        temp: &Path,
        site: Option<&PageServer>,
        ports: [(&str, &str); 2],
        extra: &[(&str, &str)],
    ) -> Self {
        Self::start_on(free_port(), temp, site, ports, extra).await
    }

    /// [`Self::start`] with the balancer on `balancer_port`.
    async fn start_on(
        balancer_port: u16,
        temp: &Path,
        site: Option<&PageServer>,
        ports: [(&str, &str); 2],
        extra: &[(&str, &str)],
    ) -> Self {
        let postgres = PgServer::start().await.unwrap();
        let database = postgres.database().await.unwrap();
        let public_url = format!("http://127.0.0.1:{balancer_port}");
        let mut env = vec![
            ("FLOTILLA_DATABASE_URL", database.as_str()),
            ("FLOTILLA_PUBLIC_URL", public_url.as_str()),
        ];
        env.extend_from_slice(extra);
        let a = control(&temp.join("a"), &env).await;
        let b = control(&temp.join("b"), &env).await;
        let balancer = Balancer::start(balancer_port, &[port_of(&a.api), port_of(&b.api)]);
        let allow = site.map(|site| format!("[\"{}\"]", site.authority()));
        let egress = allow
            .as_deref()
            .map(|allow| vec![("FLOTILLA_AGENT__EGRESS__ALLOW", allow)])
            .unwrap_or_default();
        let mut agents = Vec::new();
        for (node, ports) in ports {
            let spec = match site {
                Some(_) => AgentSpec {
                    sim: false,
                    env: &egress,
                    ..AgentSpec::sim(node, "4", ports)
                },
                None => AgentSpec::sim(node, "1", ports),
            };
            agents.push(agent(&balancer.url(), &temp.join(node), &spec).await);
        }
        let nodes: Vec<(&str, &str)> = ports.iter().map(|(node, _)| (*node, "online")).collect();
        for replica in [&a.api, &b.api] {
            wait_nodes(replica, &nodes).await;
        }
        Self {
            _postgres: postgres,
            a,
            b,
            balancer,
            agents,
        }
    }

    /// Each replica's own API (not through the balancer).
    fn apis(&self) -> (Api, Api) {
        (
            Api::new(self.a.api.base.clone()),
            Api::new(self.b.api.base.clone()),
        )
    }

    fn replicas(&self) -> [u16; 2] {
        [port_of(&self.a.api), port_of(&self.b.api)]
    }

    /// The replica ports that answered requests whose line names `needle`.
    fn answered(&self, needle: &str) -> HashSet<u16> {
        self.balancer
            .passed()
            .into_iter()
            .filter(|(request, _)| request.contains(needle))
            .map(|(_, port)| port)
            .collect()
    }

    /// Waits until no instance is left: in `replica`'s list, on every node.
    async fn wait_empty(&self, replicas: &[&Api]) {
        wait_until(BROWSER_DEADLINE, "no instance left anywhere", || async {
            let mut left = Vec::new();
            for replica in replicas {
                left.push(replica.get("/v2/instances").await.1["total"].clone());
            }
            for node in &self.agents {
                left.push(agent_instances(node).await.len().into());
            }
            if left.iter().all(|n| n == 0) {
                Ok(Some(()))
            } else {
                Err(format!("{left:?}"))
            }
        })
        .await
        .unwrap();
    }
}

/// A client program the test runs beside it.
enum Client {
    Python(&'static str),
    Node(&'static str),
}

/// Runs `client` with `args` in the background; its JSON when it ends.
fn spawn_client(
    client: Client,
    args: Vec<String>,
) -> tokio::task::JoinHandle<anyhow::Result<Value>> {
    tokio::spawn(async move {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        match client {
            Client::Python(script) => run_python(script, &args).await,
            Client::Node(script) => run_node(script, &args).await,
        }
    })
}

/// POSTs `body` (JSON) to `url` in the background: its status and text.
fn spawn_post(
    url: String,
    body: &str,
) -> tokio::task::JoinHandle<reqwest::Result<(StatusCode, String)>> {
    let body = body.to_owned();
    tokio::spawn(async move {
        let response = reqwest::Client::new()
            .post(url)
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await?;
        let status = response.status();
        Ok((status, response.text().await?))
    })
}

/// The JSON a client writes to `path` once it gets there.
async fn json_file(path: &Path, what: &str) -> Value {
    wait_until(BROWSER_DEADLINE, what, || async {
        match std::fs::read_to_string(path).map(|text| serde_json::from_str(&text)) {
            Ok(Ok(seen)) => Ok(Some(seen)),
            _ => Err("not yet".to_owned()),
        }
    })
    .await
    .unwrap()
}

/// Waits until each of `ids` is gone from `api` (404).
async fn wait_gone(api: &Api, ids: &[&Value]) {
    for id in ids {
        let path = format!("/v2/instances/{}", id.as_str().unwrap());
        wait_until(BROWSER_DEADLINE * 2, "the instance ended", || async {
            match api.get(&path).await {
                (StatusCode::NOT_FOUND, _) => Ok(Some(())),
                (status, body) => Err(format!("{status} {}", body["status"])),
            }
        })
        .await
        .unwrap();
    }
}

#[tokio::test]
async fn browser_clients_drive_the_fleet_through_two_control_planes_behind_one_balancer() {
    let temp = tempfile::tempdir().unwrap();
    let site = serve_page(&[("/form", FORM)]).await;
    let fleet = TwoReplicas::start(
        temp.path(),
        Some(&site),
        [("b1", "29200-29299"), ("b2", "29300-29399")],
        &[],
    )
    .await;
    let (a, b, balancer) = (&fleet.a, &fleet.b, &fleet.balancer);
    let replicas = fleet.replicas();
    let balancer_port = port_of(&Api::new(balancer.url()));
    let api = Api::new(balancer.url());
    let page = format!("{}/form", site.base);

    // Selenium: one session, its commands answered by both replicas.
    let hub = format!("{}/wd/hub", balancer.url());
    let seen = run_python("selenium_replicas.py", &[&hub, &page])
        .await
        .expect("a Selenium session through the balancer");
    assert_eq!(seen["title"], "replicas", "{seen}");
    assert_eq!(seen["said"], "Hello, Ada", "{seen}");
    assert_eq!(seen["cookie"], "yes", "{seen}");
    assert_eq!(seen["script"], 42, "{seen}");
    let session = seen["session"].as_str().unwrap();
    assert_eq!(
        fleet.answered(session),
        HashSet::from(replicas),
        "the session's commands"
    );
    // Its quit ended it for both.
    for replica in [&a.api, &b.api] {
        let (status, _) = replica.get(&format!("/v2/instances/{session}")).await;
        assert_eq!(status, StatusCode::NOT_FOUND);
    }

    // Playwright over CDP and with its own protocol, through the door at
    // the balancer's address.
    let (id, created, _) = api.create_running("{}").await;
    let door = format!("ws://127.0.0.1:{balancer_port}/v2/instances/{id}/");
    let debug = created["urls"]["debug"].as_str().unwrap();
    assert!(debug.starts_with(&door), "{debug}");
    let seen = run_node("playwright_title.mjs", &[debug, &page])
        .await
        .unwrap();
    assert_eq!(seen["title"], "replicas", "{seen}");
    let playwright = created["urls"]["playwright"].as_str().unwrap();
    assert!(playwright.starts_with(&door), "{playwright}");
    let seen = run_node("playwright_keep_tab.mjs", &[playwright, &page, "open"])
        .await
        .unwrap();
    assert_eq!(seen["title"], "replicas", "{seen}");

    // REST actions, whichever replica takes each (one with a lifetime after
    // creates without: the store bug this test found).
    for _ in 0..3 {
        let response = reqwest::Client::new()
            .post(format!("{}/v2/actions/content", balancer.url()))
            .json(&serde_json::json!({"url": page}))
            .send()
            .await
            .unwrap();
        let status = response.status();
        let body = response.text().await.unwrap();
        assert_eq!(status, StatusCode::OK, "{body}");
        assert!(body.contains("<title>replicas</title>"), "{body}");
    }

    // Nothing without an owner: both replicas and both nodes agree.
    api.delete_instance(&id).await;
    fleet.wait_empty(&[&a.api, &b.api]).await;
}

/// An MCP agent's session through the balancer: its requests alternate
/// replicas, one replica is killed halfway through its task, and it goes on
/// through the other (its current instance, its snapshot's references);
/// ending the session deletes its instance. A second agent vanishes without
/// ending its session: the replica left ends it when it goes idle, and its
/// instance with it.
#[tokio::test]
async fn an_mcp_agent_goes_on_through_the_other_replica_when_its_own_is_killed() {
    let temp = tempfile::tempdir().unwrap();
    let site = serve_page(&[("/form", FORM)]).await;
    let mut fleet = TwoReplicas::start(
        temp.path(),
        Some(&site),
        [("m1", "29400-29499"), ("m2", "29500-29599")],
        &[("FLOTILLA_MCP__SESSION_IDLE_TIMEOUT_SEC", "15")],
    )
    .await;
    let (pause, resume) = (temp.path().join("paused"), temp.path().join("resume"));
    let agent = spawn_client(
        Client::Python("mcp_replicas.py"),
        vec![
            fleet.balancer.url(),
            format!("{}/form", site.base),
            pause.display().to_string(),
            resume.display().to_string(),
        ],
    );
    let paused = json_file(&pause, "the agent halfway").await;
    let session = paused["session"].as_str().unwrap().to_owned();
    assert_eq!(
        fleet.answered(&session),
        HashSet::from(fleet.replicas()),
        "the session's requests before the kill: {paused}"
    );
    assert_eq!(paused["drivers_before"]["mcp"], 1, "{paused}");

    fleet.a.stop_with(libc::SIGKILL).await;
    std::fs::write(&resume, "go on").unwrap();
    let seen = agent.await.unwrap().expect("the agent finishes its task");
    assert!(
        seen["title"].as_str().unwrap().contains("replicas"),
        "{seen}"
    );
    assert!(
        seen["list"].as_str().unwrap().contains("(current)"),
        "{seen}"
    );
    assert_eq!(seen["drivers_after"]["mcp"], 1, "{seen}");

    // The session's end (through the replica left) deleted its instance;
    // the vanished agent's went with its idle session.
    let b = Api::new(fleet.b.api.base.clone());
    wait_gone(&b, &[&seen["instance"], &seen["vanished_instance"]]).await;
    fleet.wait_empty(&[&b]).await;
}

/// The work a replica holds ends with it: a REST action whose page hangs
/// and a `/v2/playwright` connection, both on one replica, which is then
/// killed; the other deletes both instances once their holds lapse, and
/// nothing is left without an owner.
#[tokio::test]
async fn what_a_killed_replica_was_doing_is_ended_by_the_other() {
    let temp = tempfile::tempdir().unwrap();
    let site = serve_pages_and_hang(&[("/form", FORM)], &["/hang"]).await;
    let mut fleet = TwoReplicas::start(
        temp.path(),
        Some(&site),
        [("h1", "29600-29699"), ("h2", "29700-29799")],
        &[],
    )
    .await;
    let (a, b) = fleet.apis();

    // An action on replica a, whose page never loads.
    let hang = serde_json::json!({"url": format!("{}/hang", site.base), "timeout_ms": 120_000});
    let action = spawn_post(format!("{}/v2/actions/content", a.base), &hang.to_string());
    // A Playwright client whose instance replica a made for its connection.
    let connected = temp.path().join("connected");
    let playwright = spawn_client(
        Client::Node("playwright_hold.mjs"),
        vec![
            format!("{}/v2/playwright", a.base.replace("http://", "ws://")),
            format!("{}/form", site.base),
            connected.display().to_string(),
        ],
    );
    json_file(&connected, "the client connected").await;
    let held = wait_until(BROWSER_DEADLINE, "two running instances", || async {
        let (_, list) = b.get("/v2/instances?status=running").await;
        match list["total"].as_u64() {
            Some(2) => Ok(Some(list)),
            total => Err(format!("{total:?}")),
        }
    })
    .await
    .unwrap();
    let action_started = wait_until(BROWSER_DEADLINE, "the action waits on its page", || async {
        let asked = site
            .requested()
            .iter()
            .filter(|path| *path == "/hang")
            .count();
        Ok::<_, String>((asked > 0).then_some(()))
    });
    action_started.await.unwrap();

    fleet.a.stop_with(libc::SIGKILL).await;
    let dropped = playwright
        .await
        .unwrap()
        .expect("the client saw its connection drop");
    assert_eq!(dropped["title"], "replicas", "{dropped}");
    assert!(
        action.await.unwrap().is_err(),
        "the action's client lost its replica"
    );

    // Both instances were deleted by replica b, and no node has them.
    let ids: Vec<&Value> = held["instances"]
        .as_array()
        .unwrap()
        .iter()
        .map(|instance| &instance["id"])
        .collect();
    wait_gone(&b, &ids).await;
    fleet.wait_empty(&[&b]).await;
    let takeover = b.background_task("held instance takeover").await;
    assert_eq!(takeover["changed"], 2, "{takeover}");
}

/// Creates waiting for room (`?wait_sec=`) on a replica that is killed:
/// their clients' requests fail and nothing is made for them, while a
/// waiter on the other replica gets the slot freed; no record is left
/// creating, nothing is made twice.
#[tokio::test]
async fn creates_waiting_on_a_killed_replica_make_nothing() {
    let temp = tempfile::tempdir().unwrap();
    let mut fleet = TwoReplicas::start(
        temp.path(),
        None,
        [("q1", "29800-29809"), ("q2", "29810-29819")],
        &[],
    )
    .await;
    let (a, b) = fleet.apis();
    let (first, _, _) = b.create_running("{}").await;
    b.create_running("{}").await;
    let wait = |api: &Api| spawn_post(format!("{}/v2/instances?wait_sec=60", api.base), "{}");
    let on_a: Vec<_> = (0..3).map(|_| wait(&a)).collect();
    let on_b = wait(&b);
    wait_until(BROWSER_DEADLINE, "four creates waiting", || async {
        let mut waiting = Vec::new();
        for api in [&a, &b] {
            let metrics = get_text(&format!("{}/metrics", api.base)).await;
            waiting.push(
                metrics
                    .lines()
                    .find_map(|line| line.strip_prefix("service_create_queue_length "))
                    .map(str::to_owned),
            );
        }
        let expected = [Some("3".to_owned()), Some("1".to_owned())];
        if waiting == expected {
            Ok(Some(()))
        } else {
            Err(format!("{waiting:?}"))
        }
    })
    .await
    .unwrap();

    fleet.a.stop_with(libc::SIGKILL).await;
    for waiter in on_a {
        assert!(
            waiter.await.unwrap().is_err(),
            "a's waiter lost its replica"
        );
    }
    b.delete_instance(&first).await;
    let (status, body) = on_b.await.unwrap().unwrap();
    assert_eq!(status, StatusCode::CREATED, "{body}");
    // Two instances, both running, one on each node: b's waiter's and the
    // one left; nothing for a's waiters.
    let statuses = wait_until(BROWSER_DEADLINE, "both instances running", || async {
        let (_, list) = b.get("/v2/instances").await;
        let statuses: Vec<Value> = list["instances"]
            .as_array()
            .unwrap()
            .iter()
            .map(|instance| instance["status"].clone())
            .collect();
        if statuses.iter().all(|status| status == "running") {
            Ok(Some(statuses))
        } else {
            Err(format!("{statuses:?}"))
        }
    })
    .await
    .unwrap();
    assert_eq!(statuses.len(), 2, "{statuses:?}");
    for node in &fleet.agents {
        assert_eq!(agent_instances(node).await.len(), 1);
    }
}

/// Events and live links through the balancer: a subscriber's token, issued
/// by one replica, is verified by whichever the proxy's check reaches; what
/// either replica does is published once each, in order; a control link
/// made through one replica is handed back through the other, once.
#[tokio::test]
async fn events_and_live_links_work_whichever_replica_answers() {
    const PUBLISHER: &str = "replicas-publisher";
    let temp = tempfile::tempdir().unwrap();
    let balancer_port = free_port();
    let balancer_url = format!("http://127.0.0.1:{balancer_port}");
    let proxy = spawn_proxy(|config| {
        config.jwt_verifier.require_authentication = true;
        config.jwt_verifier.webhook_url = format!("{balancer_url}/v2/tokens/verify");
        config.publisher.api_keys = vec![PUBLISHER.into()];
    })
    .await;
    let proxy_url = proxy.url();
    let fleet = TwoReplicas::start_on(
        balancer_port,
        temp.path(),
        None,
        [("e1", "29820-29829"), ("e2", "29830-29839")],
        &[
            ("FLOTILLA_EVENTS__PROXY_URL", proxy_url.as_str()),
            ("FLOTILLA_EVENTS__PUBLISH_KEY", PUBLISHER),
        ],
    )
    .await;
    let api = Api::new(fleet.balancer.url());

    // Tokens until both replicas issued one (agents' heartbeats share the
    // round-robin); each works on the proxy.
    let mut streams = Vec::new();
    let both = HashSet::from(fleet.replicas());
    while fleet.answered("/v2/tokens ") != both {
        assert!(streams.len() < 30, "the balancer sends requests to both");
        let (status, token) = api.post("/v2/tokens", r#"{"topics": ["instances"]}"#).await;
        assert_eq!(status, StatusCode::CREATED, "{token}");
        let token = token["token"].as_str().unwrap().to_owned();
        let stream = SseClient::with_bearer(&proxy.addr.to_string(), "/events/instances", &token)
            .await
            .unwrap();
        assert_eq!(stream.status, 200, "{}", stream.body);
        streams.push(stream);
    }

    // Two instances made and ended through the balancer.
    let mut ids = Vec::new();
    for _ in 0..2 {
        let (id, _, _) = api.create_running("{}").await;
        ids.push(id);
    }
    for id in &ids {
        api.delete_instance(id).await;
    }
    for stream in &mut streams {
        assert_each_event_once_in_order(stream, &ids).await;
    }

    // A control link made through one replica, handed back through the other.
    let (id, _, _) = api.create_running("{}").await;
    hand_back_through_both(&fleet, &api, &id).await;
    api.delete_instance(&id).await;
    fleet.wait_empty(&[&api]).await;
}

/// Reads `stream` until both of `ids` were deleted: each instance's
/// `created`, `running` and `deleted` came once, `created` first.
async fn assert_each_event_once_in_order(stream: &mut SseClient, ids: &[String]) {
    let mut seen: Vec<(String, String)> = Vec::new();
    let deleted = |seen: &[(String, String)]| {
        seen.iter()
            .filter(|(name, _)| name == "instance.deleted")
            .count()
    };
    while deleted(&seen) < ids.len() {
        let event = stream.next_event(BROWSER_DEADLINE).await.unwrap();
        let data: Value = serde_json::from_str(event.data.as_deref().unwrap()).unwrap();
        let id = data["data"]["instance_id"].as_str().unwrap_or_default();
        seen.push((event.event.unwrap_or_default(), id.to_owned()));
    }
    for id in ids {
        let names: Vec<&str> = seen
            .iter()
            .filter(|(_, of)| of == id)
            .map(|(name, _)| name.as_str())
            .collect();
        assert_eq!(names.first(), Some(&"instance.created"), "{seen:?}");
        assert_eq!(names.last(), Some(&"instance.deleted"), "{seen:?}");
        for name in ["instance.created", "instance.running", "instance.deleted"] {
            let times = names.iter().filter(|seen| **seen == name).count();
            assert_eq!(times, 1, "{name} of {id} once: {seen:?}");
        }
    }
}

/// Makes a control link to `id` through the balancer and hands it back
/// until both replicas answered: the first hand-back is taken, every later
/// one is the 404 of a link handed back.
async fn hand_back_through_both(fleet: &TwoReplicas, api: &Api, id: &str) {
    let (status, link) = api
        .post(
            &format!("/v2/instances/{id}/live"),
            r#"{"mode": "control"}"#,
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{link}");
    let url = link["url"].as_str().unwrap();
    assert!(url.starts_with(&fleet.balancer.url()), "{url}");
    let done = format!("{url}/done");
    let token = url.rsplit('/').next().unwrap();
    let both = HashSet::from(fleet.replicas());
    let mut answers = Vec::new();
    while answers.len() < 2 || fleet.answered(token) != both {
        assert!(answers.len() < 30, "the balancer sends requests to both");
        let response = reqwest::Client::new().post(&done).send().await.unwrap();
        answers.push(response.status());
    }
    assert_eq!(answers[0], StatusCode::OK, "{answers:?}");
    let later = &answers[1..];
    assert!(
        later.iter().all(|status| *status == StatusCode::NOT_FOUND),
        "handed back once: {answers:?}"
    );
}

/// A drain started on one replica: the other shows its report, and an
/// uncordon sent to the other ends it for both (the node takes instances
/// again, placed through either).
#[tokio::test]
async fn a_drain_started_on_one_replica_is_seen_and_ended_on_the_other() {
    let temp = tempfile::tempdir().unwrap();
    let fleet = TwoReplicas::start(
        temp.path(),
        None,
        [("u1", "29840-29849"), ("u2", "29850-29859")],
        &[],
    )
    .await;
    let (a, b) = fleet.apis();
    let (status, report) = a.post("/v2/nodes/u1/drain", "{}").await;
    assert_eq!(status, StatusCode::ACCEPTED, "{report}");
    let started = report["started_at"].clone();
    let (_, node) = b.get("/v2/nodes/u1").await;
    assert_eq!(node["status"], "draining", "{node}");
    assert_eq!(node["drain"]["started_at"], started, "{node}");
    let (status, body) = b.post("/v2/nodes/u1/uncordon", "{}").await;
    assert!(status.is_success(), "{status} {body}");
    for replica in [&a, &b] {
        wait_until(BROWSER_DEADLINE, "the node online again", || async {
            let (_, node) = replica.get("/v2/nodes/u1").await;
            match node["status"].as_str() {
                Some("online") => Ok(Some(())),
                other => Err(format!("{other:?}")),
            }
        })
        .await
        .unwrap();
    }
    // It takes instances again, whichever replica places them.
    for replica in [&a, &b] {
        let (status, created) = replica
            .post("/v2/instances", r#"{"node_preference": "u1"}"#)
            .await;
        assert_eq!(status, StatusCode::CREATED, "{created}");
        replica
            .delete_instance(created["id"].as_str().unwrap())
            .await;
    }
}
