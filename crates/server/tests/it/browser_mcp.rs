//! The MCP server at `/mcp` with real Chromium, driven by the official
//! clients: the Python SDK (`mcp`) and the TypeScript one
//! (`@modelcontextprotocol/sdk`), each a scripted agent doing a task on a
//! local form by the snapshot's references (with an upload, a download and
//! a handoff that a person hands back); the session's end deleting the
//! instance it created; the API key asked for; the cap on sessions; the
//! hand-back's refusals.

use serde_json::{Value, json};

use flotilla_testkit::{
    Api, BROWSER_DEADLINE, StatusCode, TestServe, run_node, run_python, serve_page,
    spawn_serve_with, wait_until,
};

const KEY: &str = "flt_mcp_test_key";

const FORM: &str = r#"<!doctype html><title>Sign up</title><h1>Sign up</h1>
<label>Name <input id="name"></label>
<label>Colour <select id="colour"><option value="red">Red</option><option value="blue">Blue</option></select></label>
<label>Photo <input type="file" id="photo"></label>
<a href="/report.txt" download="report.txt">Get the report</a>
<button id="send">Send</button>
<p id="out"></p>
<script>
document.getElementById('send').addEventListener('click', () => {
  const name = document.getElementById('name').value;
  const colour = document.getElementById('colour').value;
  alert('Sent!');
  console.log('form sent', name, colour);
  setTimeout(() => { document.getElementById('out').textContent = `Hello, ${name} (${colour})`; }, 300);
});
</script>"#;

const TOOLS: [&str; 23] = [
    "browser_back",
    "browser_click",
    "browser_close",
    "browser_console_messages",
    "browser_create",
    "browser_downloads",
    "browser_drag",
    "browser_evaluate",
    "browser_file_upload",
    "browser_handoff",
    "browser_hover",
    "browser_list",
    "browser_navigate",
    "browser_network_requests",
    "browser_park",
    "browser_press_key",
    "browser_revive",
    "browser_screenshot",
    "browser_select_option",
    "browser_snapshot",
    "browser_tabs",
    "browser_type",
    "browser_wait_for",
];

/// What an agent saw whatever the engine: the tools, the snapshot's heading,
/// the screenshot, the form's answer, and a reference that names nothing.
fn assert_the_task_was_done(seen: &Value, client: &str) {
    assert_the_page_was_driven(seen, client);
    let console = seen["console"].as_str().unwrap();
    assert!(
        console.contains("[log] form sent Ada blue"),
        "{client}: {console}"
    );
}

fn assert_the_page_was_driven(seen: &Value, client: &str) {
    let tools: Vec<&str> = seen["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    for tool in TOOLS {
        assert!(tools.contains(&tool), "{client}: no {tool} in {tools:?}");
    }
    let snapshot = seen["snapshot"].as_str().unwrap();
    assert!(
        snapshot.contains("- heading \"Sign up\" [level=1] [ref=e"),
        "{client}: {snapshot}"
    );
    assert_eq!(seen["image_type"], "image/png", "{client}");
    assert_eq!(seen["png"], "89504e470d0a1a0a", "{client}");
    assert_eq!(seen["evaluated"], "\"Hello, Ada (blue)\"", "{client}");
    assert_eq!(seen["wrong_ref"]["is_error"], true, "{client}");
    let wrong = seen["wrong_ref"]["text"].as_str().unwrap();
    assert!(wrong.contains("take a new snapshot"), "{client}: {wrong}");
}

/// What `mcp_agent.py` saw of tabs, back, and a reference of a page that is
/// gone (refused, though the next page is the same and has references of
/// its own).
fn assert_the_tab_flow(seen: &Value, client: &str) {
    let tabs = &seen["tab_flow"];
    assert_eq!(
        (&tabs["listed"], &tabs["after_close"]),
        (&json!(2), &json!(1)),
        "{client}: {tabs}"
    );
    assert_eq!(tabs["stale_is_error"], true, "{client}: {tabs}");
    let stale = tabs["stale"].as_str().unwrap();
    assert!(stale.contains("take a new snapshot"), "{client}: {stale}");
    let back = tabs["back"].as_str().unwrap();
    assert!(
        back.contains("/form\n") && back.contains("Page title: Sign up"),
        "{client}: {back}"
    );
}

async fn assert_gone(api: &Api, id: &str) {
    wait_until(
        BROWSER_DEADLINE,
        "the session's instance to be deleted",
        || async {
            let (status, body) = api.get(&format!("/v2/instances/{id}")).await;
            match status {
                StatusCode::NOT_FOUND => Ok(Some(())),
                _ => Err(format!("{status} {body}")),
            }
        },
    )
    .await
    .unwrap();
}

/// The form's site, and a fleet behind an API key whose browsers may open
/// it: the site (kept while the test runs), the fleet, its API and the
/// form's URL.
async fn serve_the_form() -> (flotilla_testkit::PageServer, TestServe, Api, String) {
    let site = serve_page(&[("/form", FORM), ("/report.txt", "the report")]).await;
    let serve = spawn_serve_with(|config| {
        config.control.auth_enabled = true;
        config.control.api_keys = vec![KEY.into()];
        site.allow_in(config);
    })
    .await;
    let api = Api::with_key(serve.api.base.clone(), KEY);
    let form = format!("{}/form", site.base);
    (site, serve, api, form)
}

#[tokio::test]
async fn browser_mcp_agents_do_a_task_with_the_official_clients_and_their_session_ends_it() {
    let (_site, serve, api, form) = serve_the_form().await;

    let seen = run_python("mcp_agent.py", &[&serve.api.base, KEY, &form])
        .await
        .expect("the Python agent finishes its task");
    assert_the_task_was_done(&seen, "python");
    assert_the_tab_flow(&seen, "python");
    // While the session lived, the instance's view said it drove it.
    assert_eq!(seen["drivers"]["mcp"], 1, "{}", seen["drivers"]);
    assert_eq!(seen["drivers"]["webdriver"], 0, "{}", seen["drivers"]);
    assert_eq!(seen["file_url"]["is_error"], true);
    let refused = seen["file_url"]["text"].as_str().unwrap();
    assert!(refused.contains("http or https"), "{refused}");
    assert!(
        seen["tabs"].as_str().unwrap().contains("(current)"),
        "{seen}"
    );
    assert_eq!(seen["uploaded"], "\"photo.png:5\"", "{seen}");
    // A value nested deeper than 128 levels is answered, not left to time out.
    assert_eq!(seen["deep"]["is_error"], false, "{}", seen["deep"]);
    assert!(
        seen["deep"]["text"]
            .as_str()
            .unwrap()
            .contains("\"bottom\""),
        "{}",
        seen["deep"]
    );
    // A huge one is cut to a tool answer's size by the page.
    assert_eq!(seen["large"]["is_error"], false, "{}", seen["large"]);
    let length = seen["large"]["length"].as_u64().unwrap();
    assert!(length <= (256 << 10) + 100, "{length}");
    assert!(
        seen["large"]["end"].as_str().unwrap().contains("cut"),
        "{}",
        seen["large"]
    );
    // Files named as paths, bad encodings and empty lists are refused; the
    // browser reaches the control plane no more through MCP than otherwise.
    for (label, expected) in [
        ("traversal", "is not a plain file name"),
        ("folder", "is not a plain file name"),
        ("bad_base64", "content_base64 is not base64"),
        ("none", "give 1 to 20 files"),
    ] {
        let refused = &seen["hostile_uploads"][label];
        assert_eq!(refused["is_error"], true, "{label}: {refused}");
        let text = refused["text"].as_str().unwrap();
        assert!(text.contains(expected), "{label}: {text}");
    }
    assert_eq!(seen["control_plane_url"]["is_error"], true, "{seen}");
    let closed = seen["control_plane_url"]["text"].as_str().unwrap();
    assert!(closed.contains("could not be loaded"), "{closed}");
    let downloads = seen["downloads"].as_str().unwrap();
    assert!(downloads.contains("- report.txt (10 bytes"), "{downloads}");
    let handoff = seen["handoff"].as_str().unwrap();
    assert!(handoff.contains("/live/"), "{handoff}");
    assert_eq!(seen["page_has_button"], true, "{seen}");
    assert_eq!(seen["done_status"], 200, "{seen}");
    assert_eq!(
        seen["again_status"], 404,
        "the link ended with the hand-back"
    );
    let handed = seen["handed_back"].as_str().unwrap();
    assert!(handed.contains("handed browser"), "{handed}");
    assert_gone(&api, seen["instance"].as_str().unwrap()).await;

    let seen = run_node("mcp_agent.mjs", &[&serve.api.base, KEY, &form])
        .await
        .expect("the TypeScript agent finishes its task");
    assert_the_task_was_done(&seen, "typescript");
    // Arguments that miss a field are a tool error too, naming it.
    assert_eq!(seen["missing_ref"]["is_error"], true, "{seen}");
    let missing = seen["missing_ref"]["text"].as_str().unwrap();
    assert!(missing.contains("missing field `ref`"), "{missing}");
    assert_gone(&api, seen["instance"].as_str().unwrap()).await;

    // The door is the API key's, like every other.
    let initialize = json!({
        "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
    });
    for key in [None, Some("flt_wrong_key")] {
        let mut request = reqwest::Client::new()
            .post(format!("{}/mcp", serve.api.base))
            .header("accept", "application/json, text/event-stream")
            .json(&initialize);
        if let Some(key) = key {
            request = request.bearer_auth(key);
        }
        let response = request.send().await.unwrap();
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED, "{key:?}");
    }
    serve.shutdown().await;
}

/// The same agent's task on a Firefox instance: the snapshot is computed in
/// the page and its references hold across steps (each its own WebDriver
/// session), the upload, download and hand-back work, and the console is
/// refused by name.
#[tokio::test]
async fn browser_mcp_agents_do_the_task_on_firefox() {
    let (_site, serve, api, form) = serve_the_form().await;

    let seen = run_python("mcp_agent.py", &[&serve.api.base, KEY, &form, "firefox"])
        .await
        .expect("the Python agent finishes its task on Firefox");
    assert_the_page_was_driven(&seen, "firefox");
    assert_the_tab_flow(&seen, "firefox");
    let snapshot = seen["snapshot"].as_str().unwrap();
    for line in [
        "- textbox \"Name\" [ref=e",
        "- combobox \"Colour\" [value=\"Red\"] [ref=e",
        "- button \"Photo\" [ref=e",
        "- link \"Get the report\" [ref=e",
        "- button \"Send\" [ref=e",
    ] {
        assert!(snapshot.contains(line), "{line} in {snapshot}");
    }
    assert_eq!(seen["console_is_error"], true, "{seen}");
    let console = seen["console"].as_str().unwrap();
    assert!(
        console.contains("browser_console_messages is not available on Firefox"),
        "{console}"
    );
    assert_eq!(seen["uploaded"], "\"photo.png:5\"", "{seen}");
    assert_eq!(seen["deep"]["is_error"], false, "{}", seen["deep"]);
    let length = seen["large"]["length"].as_u64().unwrap();
    assert!(length <= (256 << 10) + 100, "{length}");
    assert!(seen["tabs"].as_str().unwrap().contains("id: 1"), "{seen}");
    assert_eq!(seen["file_url"]["is_error"], true, "{seen}");
    assert_eq!(seen["control_plane_url"]["is_error"], true, "{seen}");
    let downloads = seen["downloads"].as_str().unwrap();
    assert!(downloads.contains("- report.txt (10 bytes"), "{downloads}");
    assert!(
        seen["handed_back"]
            .as_str()
            .unwrap()
            .contains("handed browser"),
        "{seen}"
    );
    assert_gone(&api, seen["instance"].as_str().unwrap()).await;
    serve.shutdown().await;
}

/// `mcp.max_sessions` bounds the sessions a control plane holds: one past it
/// is refused until another ends.
#[tokio::test]
async fn mcp_sessions_are_bounded() {
    let serve = spawn_serve_with(|config| {
        config.agent.runtime = flotilla_node_agent::RuntimeKind::Sim;
        config.control.mcp.max_sessions = 1;
    })
    .await;
    let http = reqwest::Client::new();
    let url = format!("{}/mcp", serve.api.base);
    let initialize = json!({
        "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
    });
    let open = || {
        http.post(&url)
            .header("accept", "application/json, text/event-stream")
            .json(&initialize)
            .send()
    };
    // Hostile framing first: not JSON, not JSON-RPC, over 4 MiB, no Accept.
    // Each is refused before any session or tool, never a server error.
    for (body, accept) in [
        ("{not json".to_owned(), true),
        ("[]".to_owned(), true),
        (
            r#"{"jsonrpc": "1.0", "id": 1, "method": 7}"#.to_owned(),
            true,
        ),
        (format!(r#"{{"pad": "{}"}}"#, "x".repeat(5 << 20)), true),
        (initialize.to_string(), false),
    ] {
        let mut request = http
            .post(&url)
            .header("content-type", "application/json")
            .body(body.clone());
        if accept {
            request = request.header("accept", "application/json, text/event-stream");
        }
        let status = request.send().await.unwrap().status();
        assert!(
            status.is_client_error(),
            "{status} for {}",
            &body[..body.len().min(60)]
        );
    }
    let first = open().await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    let session = first.headers()["mcp-session-id"]
        .to_str()
        .unwrap()
        .to_owned();
    let refused = open().await.unwrap();
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
    let detail: Value = refused.json().await.unwrap();
    assert!(
        detail["detail"]
            .as_str()
            .unwrap()
            .contains("mcp.max_sessions"),
        "{detail}"
    );
    let ended = http
        .delete(&url)
        .header("mcp-session-id", &session)
        .send()
        .await
        .unwrap();
    assert!(ended.status().is_success(), "{}", ended.status());
    wait_until(BROWSER_DEADLINE, "room for a new session", || async {
        let answer = open().await.map_err(|e| e.to_string())?;
        match answer.status() {
            StatusCode::OK => Ok(Some(())),
            other => Err(other.to_string()),
        }
    })
    .await
    .unwrap();
    serve.shutdown().await;
}

/// The `Mcp-Session-Id` a client sends is looked up in the store: ids that
/// never were, SQL, path-like, huge or not UTF-8 are each refused as a
/// client error, never a server error, and open no session.
#[tokio::test]
async fn hostile_mcp_session_ids_are_refused() {
    let serve = spawn_serve_with(|config| {
        config.agent.runtime = flotilla_node_agent::RuntimeKind::Sim;
    })
    .await;
    let http = reqwest::Client::new();
    let url = format!("{}/mcp", serve.api.base);
    let call = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"});
    let hostile: Vec<reqwest::header::HeaderValue> = [
        b"never-was".to_vec(),
        b"' OR 1=1 --".to_vec(),
        b"../../etc/passwd".to_vec(),
        "s".repeat(16 << 10).into_bytes(),
        vec![0xff, 0xfe, b'a'],
    ]
    .into_iter()
    .map(|bytes| reqwest::header::HeaderValue::from_bytes(&bytes).unwrap())
    .collect();
    for id in hostile {
        for method in [
            reqwest::Method::POST,
            reqwest::Method::GET,
            reqwest::Method::DELETE,
        ] {
            let answer = http
                .request(method.clone(), &url)
                .header("accept", "application/json, text/event-stream")
                .header("mcp-session-id", id.clone())
                .json(&call)
                .send()
                .await
                .unwrap();
            let status = answer.status();
            let shown = String::from_utf8_lossy(&id.as_bytes()[..id.len().min(20)]).into_owned();
            assert!(status.is_client_error(), "{method} {shown}: {status}");
            assert!(
                answer.headers().get("mcp-session-id").is_none(),
                "{method} {shown}"
            );
        }
    }
    serve.shutdown().await;
}

/// `POST /live/{token}/done` takes only a valid control link, once.
#[tokio::test]
async fn only_a_control_link_hands_back_and_only_once() {
    let serve = spawn_serve_with(|config| {
        config.agent.runtime = flotilla_node_agent::RuntimeKind::Sim;
    })
    .await;
    let api = serve.api.clone();
    let instance = api.create("{}").await;
    let id = instance["id"].as_str().unwrap().to_owned();
    let link = |mode: &'static str| {
        let api = api.clone();
        let path = format!("/v2/instances/{id}/live");
        async move {
            let (status, link) = api.post(&path, &format!(r#"{{"mode": "{mode}"}}"#)).await;
            assert_eq!(status, StatusCode::CREATED, "{link}");
            let url = link["url"].as_str().unwrap().to_owned();
            url[url.find("/live/").unwrap()..].to_owned()
        }
    };
    let view = link("view").await;
    let control = link("control").await;
    let done = |path: String| {
        let api = api.clone();
        async move { api.post(&format!("{path}/done"), "").await }
    };
    let (status, body) = done(view).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    let (status, body) = done(format!("{control}x")).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    let (status, body) = done("/live/not-a-token".into()).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    let (status, body) = done(control.clone()).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, body) = done(control.clone()).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    // The link's page is gone with it.
    let (status, _) = api.get(&control).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    serve.shutdown().await;
}

/// A session is its key's: another key naming its `Mcp-Session-Id` gets the
/// answer of a session that never was, for every method, and cannot end
/// it; each key holds at most `mcp.max_sessions_per_key`.
#[tokio::test]
async fn mcp_sessions_belong_to_the_key_that_opened_them() {
    const OTHER_KEY: &str = "flt_mcp_other_key";
    let serve = spawn_serve_with(|config| {
        config.agent.runtime = flotilla_node_agent::RuntimeKind::Sim;
        config.control.auth_enabled = true;
        config.control.api_keys = vec![KEY.into(), OTHER_KEY.into()];
        config.control.mcp.max_sessions_per_key = 1;
    })
    .await;
    let seen = run_python("mcp_two_keys.py", &[&serve.api.base, KEY, OTHER_KEY])
        .await
        .expect("the two clients run");
    assert_eq!(seen["a_tools"], TOOLS.len(), "{seen}");
    assert_eq!(seen["a_tools_after"], TOOLS.len(), "{seen}");
    for method in ["b_get", "b_delete"] {
        assert_eq!(seen[method], 404, "{method}: {seen}");
    }
    assert_eq!(seen["b_post"]["status"], 404, "{seen}");
    assert_eq!(
        seen["b_post"], seen["unknown_post"],
        "another key's session answers as one that never was: {seen}"
    );

    // One session per key here: a second from the same key is refused,
    // one from another key is not.
    let http = reqwest::Client::new();
    let initialize = json!({
        "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
    });
    let open = |key: &'static str| {
        http.post(format!("{}/mcp", serve.api.base))
            .bearer_auth(key)
            .header("accept", "application/json, text/event-stream")
            .json(&initialize)
            .send()
    };
    let first = open(KEY).await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    let second = open(KEY).await.unwrap();
    assert_eq!(second.status(), StatusCode::SERVICE_UNAVAILABLE);
    let detail: Value = second.json().await.unwrap();
    assert!(
        detail["detail"]
            .as_str()
            .unwrap()
            .contains("mcp.max_sessions_per_key"),
        "{detail}"
    );
    // Naming the stateless protocol's version does not get an
    // `initialize` past the share (it would open a session all the same).
    let mut later = initialize.clone();
    later["params"]["protocolVersion"] = json!("2026-07-28");
    let disguised = http
        .post(format!("{}/mcp", serve.api.base))
        .bearer_auth(KEY)
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .json(&later)
        .send()
        .await
        .unwrap();
    assert_eq!(disguised.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(open(OTHER_KEY).await.unwrap().status(), StatusCode::OK);
    serve.shutdown().await;
}
