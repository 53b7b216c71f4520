//! Real Chromium behind the /v2 API: create → running → drive through
//! `urls.debug` (raw CDP, Playwright, Puppeteer) → delete → nothing left.

use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;

use flotilla_testkit::{
    BROWSER_DEADLINE, EventReceiver, SseClient, StatusCode, browser_main_pid, browser_processes,
    get_json, run_node, serve_page, spawn_serve, spawn_serve_with, wait_browser_processes_gone,
    wait_until,
};

/// Sends one CDP command over a fresh WebSocket and returns its result.
async fn cdp_call(ws_url: &str, method: &str, params: Value) -> Value {
    let (mut socket, _) = tokio_tungstenite::connect_async(ws_url)
        .await
        .expect("CDP connects through the gateway");
    socket
        .send(Message::Text(
            json!({"id": 1, "method": method, "params": params})
                .to_string()
                .into(),
        ))
        .await
        .unwrap();
    loop {
        let message = tokio::time::timeout(Duration::from_secs(30), socket.next())
            .await
            .expect("CDP answers")
            .expect("socket open")
            .unwrap();
        if let Message::Text(text) = message {
            let value: Value = serde_json::from_str(&text).unwrap();
            if value["id"] == 1 {
                return value["result"].clone();
            }
        }
    }
}

#[tokio::test]
async fn browser_create_drive_with_cdp_playwright_puppeteer_then_delete() {
    // A signed webhook receiver too: the same events reach it.
    let receiver = EventReceiver::start("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").await;
    let hook = receiver.url.clone();
    let pages = serve_page(&[(
        "/hello",
        "<html><head><title>Hello Flotilla</title></head><body>hi</body></html>",
    )])
    .await;
    let serve = spawn_serve_with(|config| {
        pages.allow_in(config);
        config.control.webhooks = vec![flotilla_control_plane::config::WebhookConfig {
            url: hook,
            events: Vec::new(),
            secret: "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".into(),
        }];
    })
    .await;
    // Lifecycle events through serve's proxy, with a control-plane token.
    let (_, token) = serve.api.post("/v2/tokens", "").await;
    let bearer = format!("Bearer {}", token["token"].as_str().unwrap());
    let mut events = SseClient::connect(
        &serve.serve().proxy_addr.to_string(),
        "/events/instances",
        &[("authorization", &bearer)],
    )
    .await
    .unwrap();
    assert_eq!(events.status, 200, "{}", events.body);
    let (id, created, _) = serve.api.create_running("{}").await;
    let debug_url = created["urls"]["debug"].as_str().unwrap().to_owned();
    let debug_port = created["debug_port"].as_u64().unwrap();

    // Raw CDP through the gateway.
    let version = cdp_call(&debug_url, "Browser.getVersion", json!({})).await;
    assert!(
        version["product"].as_str().unwrap().contains("Chrome"),
        "{version}"
    );

    // /json/version through the gateway shows the gateway's address.
    let json_version: Value =
        get_json(&format!("http://127.0.0.1:{debug_port}/json/version")).await;
    let advertised = json_version["webSocketDebuggerUrl"].as_str().unwrap();
    assert!(
        advertised.starts_with(&format!("ws://127.0.0.1:{debug_port}/devtools/browser/")),
        "{advertised}"
    );
    let tabs: Value = get_json(&format!("http://127.0.0.1:{debug_port}/json/list")).await;
    for tab in tabs.as_array().unwrap() {
        if let Some(ws) = tab["webSocketDebuggerUrl"].as_str() {
            assert!(
                ws.contains(&format!("127.0.0.1:{debug_port}")),
                "every URL is rewritten: {ws}"
            );
        }
    }

    // Playwright and Puppeteer take urls.debug unchanged.
    let page_url = format!("{}/hello", pages.base);
    let playwright = run_node("playwright_title.mjs", &[&debug_url, &page_url])
        .await
        .unwrap();
    assert_eq!(playwright["title"], "Hello Flotilla");
    let puppeteer = run_node("puppeteer_title.mjs", &[&debug_url, &page_url])
        .await
        .unwrap();
    assert_eq!(puppeteer["title"], "Hello Flotilla");
    // Playwright's http form of the endpoint works too.
    let http_form = format!("http://127.0.0.1:{debug_port}");
    let playwright = run_node("playwright_title.mjs", &[&http_form, &page_url])
        .await
        .unwrap();
    assert_eq!(playwright["title"], "Hello Flotilla");

    // Resources arrive with heartbeats; activity moved with the traffic.
    let instance_dir = serve.instances_dir().join(&id);
    let detail = wait_until(BROWSER_DEADLINE, "resources to be sampled", || async {
        let (_, detail) = serve.api.get(&format!("/v2/instances/{id}")).await;
        let memory = detail["resources"]["memory_mb"].as_f64().unwrap_or(0.0);
        let disk = detail["resources"]["disk_mb"].as_f64().unwrap_or(0.0);
        if memory > 10.0 && disk > 0.0 {
            Ok(Some(detail))
        } else {
            Err(format!("{}", detail["resources"]))
        }
    })
    .await
    .unwrap();
    assert!(
        detail["activity"]["idle_minutes"].as_f64().unwrap() < 1.0,
        "{detail}"
    );
    let (_, list) = serve.api.get("/v2/instances").await;
    assert!(
        list["instances"][0]["resources"]["memory_mb"]
            .as_f64()
            .unwrap()
            > 10.0,
        "{list}"
    );

    // Delete: graceful, and nothing is left behind.
    assert!(
        browser_main_pid(&instance_dir).is_some(),
        "the browser runs under its instance directory"
    );
    let message = serve.api.delete_instance(&id).await;
    assert!(message["message"].is_string());
    wait_browser_processes_gone(&instance_dir).await;
    assert!(!instance_dir.exists(), "profile removed");
    let (status, _) = serve.api.get(&format!("/v2/instances/{id}")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(
        tokio::net::TcpStream::connect(("127.0.0.1", debug_port as u16))
            .await
            .is_err(),
        "debug port closed"
    );
    let mut names = Vec::new();
    while names.last().map(String::as_str) != Some("instance.deleted") {
        let event = events.next_event(BROWSER_DEADLINE).await.unwrap();
        let payload: Value = serde_json::from_str(event.data.as_deref().unwrap()).unwrap();
        assert_eq!(payload["data"]["instance_id"], id.as_str(), "{payload}");
        names.push(event.event.unwrap_or_default());
    }
    assert_eq!(
        names,
        ["instance.created", "instance.running", "instance.deleted"],
        "events of a real browser's life"
    );
    wait_until(
        BROWSER_DEADLINE,
        "the same events at the webhook",
        || async {
            let hooked: Vec<String> = receiver
                .events()
                .iter()
                .filter(|e| e.payload["data"]["instance_id"] == id.as_str())
                .map(|e| e.payload["event"].as_str().unwrap_or_default().to_owned())
                .collect();
            if hooked == names {
                Ok(Some(()))
            } else {
                Err(format!("{hooked:?}"))
            }
        },
    )
    .await
    .unwrap();
    assert_eq!(receiver.bad_signatures(), 0);
    serve.shutdown().await;
}

#[tokio::test]
async fn browser_force_delete_and_headless_shell_image() {
    let serve = spawn_serve().await;
    let (id, created, detail) = serve
        .api
        .create_running(r#"{"image": "chromium-headless-shell", "config": {"memory_gb": 1}}"#)
        .await;
    assert_eq!(detail["image"], "chromium-headless-shell");
    let version = cdp_call(
        created["urls"]["debug"].as_str().unwrap(),
        "Browser.getVersion",
        json!({}),
    )
    .await;
    assert!(version["product"].as_str().unwrap().contains("Chrome"));
    let instance_dir = serve.instances_dir().join(&id);
    assert!(browser_main_pid(&instance_dir).is_some());
    let (status, _) = serve
        .api
        .delete(&format!("/v2/instances/{id}?force=true"))
        .await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        browser_processes(&instance_dir).is_empty(),
        "force delete returns once the processes are gone"
    );
    serve.shutdown().await;
}

#[tokio::test]
async fn browser_launch_failure_and_crash_are_recorded_with_reasons() {
    let serve = spawn_serve_with(|config| {
        config.agent.images.insert(
            "broken".into(),
            flotilla_node_agent::config::ImageConfig {
                executable: "/nonexistent/chromium".into(),
                args: vec![],
                engine: Default::default(),
            },
        );
        config.agent.images.insert(
            "exits".into(),
            flotilla_node_agent::config::ImageConfig {
                executable: "/bin/false".into(),
                args: vec![],
                engine: Default::default(),
            },
        );
    })
    .await;
    for (image, reason) in [("broken", "cannot start"), ("exits", "exited")] {
        let created = serve
            .api
            .create(&format!(r#"{{"image": "{image}"}}"#))
            .await;
        let id = created["id"].as_str().unwrap();
        let failed = serve
            .api
            .wait_for_status(id, "failed", BROWSER_DEADLINE)
            .await;
        assert!(
            failed["status_reason"].as_str().unwrap().contains(reason),
            "{failed}"
        );
    }

    // A browser that dies on its own → stopped, with the exit reason.
    let (id, _, _) = serve.api.create_running("{}").await;
    let main =
        browser_main_pid(&serve.instances_dir().join(&id)).expect("the browser's main process");
    // SAFETY: kill has no memory-safety preconditions.
    unsafe { libc::kill(main as i32, libc::SIGKILL) };
    let stopped = serve
        .api
        .wait_for_status(&id, "stopped", BROWSER_DEADLINE)
        .await;
    assert!(
        stopped["status_reason"]
            .as_str()
            .unwrap()
            .contains("SIGKILL"),
        "{stopped}"
    );
    let instance_dir = serve.instances_dir().join(&id);
    wait_browser_processes_gone(&instance_dir).await;
    // The record stays until deleted; delete works on it.
    serve.api.delete_instance(&id).await;
    serve.shutdown().await;
}
