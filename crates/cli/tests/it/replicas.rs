//! Two control planes behind one load balancer (nginx, round-robin: each
//! request to the next replica), on one PostgreSQL, with two node agents
//! that reach them through the balancer too, as behind a Kubernetes
//! Service: real clients through the balancer's one address.

use std::collections::HashSet;

use flotilla_testkit::{
    Api, BROWSER_DEADLINE, Balancer, PgServer, StatusCode, free_port, run_node, run_python,
    serve_page, wait_until,
};

use crate::cluster::{AgentSpec, agent, agent_instances, control, wait_nodes};

const FORM: &str = "<!doctype html><title>replicas</title><input id=name>\
<button id=send onclick=\"said.textContent='Hello, '+document.getElementById('name').value\">Send</button>\
<p id=said></p>";

fn port_of(api: &Api) -> u16 {
    api.base.rsplit(':').next().unwrap().parse().unwrap()
}

#[tokio::test]
async fn browser_clients_drive_the_fleet_through_two_control_planes_behind_one_balancer() {
    let postgres = PgServer::start().await.unwrap();
    let database = postgres.database().await.unwrap();
    let temp = tempfile::tempdir().unwrap();
    let site = serve_page(&[("/form", FORM)]).await;
    let balancer_port = free_port();
    let public_url = format!("http://127.0.0.1:{balancer_port}");
    let env = [
        ("FLOTILLA_DATABASE_URL", database.as_str()),
        ("FLOTILLA_PUBLIC_URL", public_url.as_str()),
    ];
    let a = control(&temp.path().join("a"), &env).await;
    let b = control(&temp.path().join("b"), &env).await;
    let replicas = [port_of(&a.api), port_of(&b.api)];
    let balancer = Balancer::start(balancer_port, &replicas);
    let api = Api::new(balancer.url());
    let allow = format!("[\"{}\"]", site.authority());
    let egress = [("FLOTILLA_AGENT__EGRESS__ALLOW", allow.as_str())];
    let mut agents = Vec::new();
    for (node, ports) in [("b1", "29200-29299"), ("b2", "29300-29399")] {
        let spec = AgentSpec {
            sim: false,
            env: &egress,
            ..AgentSpec::sim(node, "4", ports)
        };
        agents.push(agent(&balancer.url(), &temp.path().join(node), &spec).await);
    }
    for replica in [&a.api, &b.api] {
        wait_nodes(replica, &[("b1", "online"), ("b2", "online")]).await;
    }
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
    let answered: HashSet<u16> = balancer
        .passed()
        .into_iter()
        .filter(|(request, _)| request.contains(session))
        .map(|(_, port)| port)
        .collect();
    assert_eq!(answered, HashSet::from(replicas), "the session's commands");
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
    wait_until(BROWSER_DEADLINE, "no instance left anywhere", || async {
        let mut left = Vec::new();
        for replica in [&a.api, &b.api] {
            left.push(replica.get("/v2/instances").await.1["total"].clone());
        }
        for node in &agents {
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
