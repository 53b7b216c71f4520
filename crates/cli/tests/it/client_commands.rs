//! The client commands against a real `serve` (sim runtime): tables and
//! `--json`, `--wait` progress, every operation, exit codes (1 API error, 2
//! usage, 3 unreachable), API keys from FLOTILLA_API_KEY, and `events watch`.

use std::process::Stdio;
use std::time::Duration;

use flotilla_node_agent::RuntimeKind;
use flotilla_testkit::{TestServe, get_json, spawn_serve_with, wait_until};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

async fn flotilla(url: &str, key: Option<&str>, args: &[&str]) -> Run {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_flotilla"));
    command
        .args(args)
        .env("FLOTILLA_URL", url)
        .env_remove("FLOTILLA_API_KEY");
    if let Some(key) = key {
        command.env("FLOTILLA_API_KEY", key);
    }
    let output = tokio::time::timeout(Duration::from_secs(120), command.output())
        .await
        .expect("the command ends")
        .expect("it runs");
    Run {
        code: output.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

async fn sim_serve(auth_key: Option<&'static str>) -> TestServe {
    spawn_serve_with(move |config| {
        config.agent.runtime = RuntimeKind::Sim;
        config.agent.max_instances = 10;
        if let Some(key) = auth_key {
            config.control.auth_enabled = true;
            config.control.api_keys = vec![key.into()];
        }
    })
    .await
}

#[tokio::test]
async fn instance_commands_tables_json_wait_and_exit_codes() {
    let serve = sim_serve(None).await;
    let url = serve.api.base.clone();

    let created = flotilla(&url, None, &["instances", "create", "--wait", "--json"]).await;
    assert_eq!(created.code, 0, "{}", created.stderr);
    let instance: Value = serde_json::from_str(&created.stdout).unwrap();
    assert_eq!(instance["status"], "running");
    assert!(
        created.stderr.contains("creating") && created.stderr.contains("running"),
        "progress: {}",
        created.stderr
    );
    let id = instance["id"].as_str().unwrap().to_owned();

    let list = flotilla(&url, None, &["instances", "list"]).await;
    assert_eq!(list.code, 0);
    assert!(list.stdout.starts_with("ID"), "{}", list.stdout);
    assert!(
        list.stdout.contains(&id) && list.stdout.contains("running"),
        "{}",
        list.stdout
    );
    assert!(list.stdout.contains("1 of 1 instances"), "{}", list.stdout);
    let list = flotilla(
        &url,
        None,
        &["instances", "list", "--status", "running", "--json"],
    )
    .await;
    let page: Value = serde_json::from_str(&list.stdout).unwrap();
    assert_eq!(page["total"], 1);

    let get = flotilla(&url, None, &["instances", "get", &id]).await;
    assert_eq!(get.code, 0);
    assert!(
        get.stdout.contains("node_id") && get.stdout.contains(&id),
        "{}",
        get.stdout
    );

    let parked = flotilla(&url, None, &["instances", "dormant", &id]).await;
    assert_eq!(parked.code, 0, "{}", parked.stderr);
    assert!(parked.stdout.contains("dormant"), "{}", parked.stdout);
    let revived = flotilla(
        &url,
        None,
        &[
            "instances",
            "revive",
            &id,
            "--wait",
            "--method",
            "full_restore",
        ],
    )
    .await;
    assert_eq!(revived.code, 0, "{}", revived.stderr);
    assert!(
        revived.stderr.contains("reviving") || revived.stderr.contains("running"),
        "{}",
        revived.stderr
    );

    let deleted = flotilla(&url, None, &["instances", "delete", &id]).await;
    assert_eq!(deleted.code, 0);
    assert!(deleted.stdout.contains("deleted"), "{}", deleted.stdout);

    // API error: exit 1 with the detail and code.
    let missing = flotilla(&url, None, &["instances", "get", &id]).await;
    assert_eq!(missing.code, 1);
    assert!(
        missing.stderr.contains("404") && missing.stderr.contains("not_found"),
        "{}",
        missing.stderr
    );
    let bad = flotilla(&url, None, &["instances", "create", "--memory-gb", "0"]).await;
    assert_eq!(bad.code, 1);
    assert!(bad.stderr.contains("invalid_request"), "{}", bad.stderr);

    // Usage errors: exit 2.
    assert_eq!(flotilla(&url, None, &["instances", "get"]).await.code, 2);
    assert_eq!(
        flotilla(&url, None, &["instances", "get", "a/b"])
            .await
            .code,
        2
    );
    assert_eq!(
        flotilla(&url, None, &["instances", "explode"]).await.code,
        2
    );

    // Unreachable: exit 3.
    let away = flotilla("http://127.0.0.1:1", None, &["instances", "list"]).await;
    assert_eq!(away.code, 3, "{}", away.stderr);
    assert!(away.stderr.contains("cannot reach"), "{}", away.stderr);

    let nodes = flotilla(&url, None, &["nodes", "list"]).await;
    assert_eq!(nodes.code, 0);
    assert!(
        nodes.stdout.contains("test-node") && nodes.stdout.contains("online"),
        "{}",
        nodes.stdout
    );
    let node = flotilla(&url, None, &["nodes", "get", "test-node", "--json"]).await;
    let node: Value = serde_json::from_str(&node.stdout).unwrap();
    assert_eq!(node["id"], "test-node");
    let metrics = flotilla(&url, None, &["metrics", "--period", "1h"]).await;
    assert_eq!(metrics.code, 0);
    assert!(
        metrics.stdout.contains("cluster.total_instances"),
        "{}",
        metrics.stdout
    );
    let bad_period = flotilla(&url, None, &["metrics", "--period", "2h"]).await;
    assert_eq!(bad_period.code, 1);
    serve.shutdown().await;
}

#[tokio::test]
async fn the_api_key_comes_from_the_environment() {
    let serve = sim_serve(Some("flt_cli_key")).await;
    let url = serve.api.base.clone();
    let refused = flotilla(&url, None, &["nodes", "list"]).await;
    assert_eq!(refused.code, 1);
    assert!(
        refused.stderr.contains("401") && refused.stderr.contains("unauthorized"),
        "{}",
        refused.stderr
    );
    let wrong = flotilla(&url, Some("flt_wrong"), &["nodes", "list"]).await;
    assert_eq!(wrong.code, 1);
    let allowed = flotilla(&url, Some("flt_cli_key"), &["nodes", "list"]).await;
    assert_eq!(allowed.code, 0, "{}", allowed.stderr);
    serve.shutdown().await;
}

#[tokio::test]
async fn events_watch_prints_lifecycle_events_as_they_happen() {
    let serve = sim_serve(None).await;
    let url = serve.api.base.clone();
    let mut watch = tokio::process::Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .args(["events", "watch", "--json"])
        .env("FLOTILLA_URL", &url)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(watch.stdout.take().unwrap()).lines();
    // The subscription is open once the proxy counts it.
    let proxy = serve.serve().proxy_url();
    wait_until(
        Duration::from_secs(30),
        "the watch to subscribe",
        || async {
            let health: Value = get_json(&format!("{proxy}/health")).await;
            Ok::<_, String>((health["connections"].as_i64() == Some(1)).then_some(()))
        },
    )
    .await
    .unwrap();
    let created = serve.api.create("{}").await;
    let id = created["id"].as_str().unwrap();
    let mut seen = Vec::new();
    while !seen.contains(&"instance.running".to_owned()) {
        let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
            .await
            .expect("an event within 30 s")
            .unwrap()
            .expect("a line");
        let payload: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(payload["data"]["instance_id"], id, "{payload}");
        seen.push(payload["event"].as_str().unwrap().to_owned());
    }
    assert_eq!(seen, ["instance.created", "instance.running"]);
    let _ = watch.start_kill();
    serve.shutdown().await;
}
