//! API keys as tenants (`[[tenants]]`): a tenant's key lists, gets and
//! acts on its own instances only; every route of the OpenAPI document
//! that names another tenant's object, or is the fleet's, answers it 404
//! (never 200 or 403); its quota holds; its key is not let in on a node's
//! instance ports (it reaches its instances through the front door, or
//! with their tokens); MCP tools see its instances only. An admin key sees
//! everything.

use serde_json::{Value, json};

use flotilla_testkit::{Api, StatusCode, spawn_serve_with};

const ADMIN: &str = "flt_tenants_admin_key";
const ACME: &str = "flt_tenants_acme_key";
const GLOBEX: &str = "flt_tenants_globex_key";

async fn serve() -> flotilla_testkit::TestServe {
    serve_on(flotilla_node_agent::RuntimeKind::Sim).await
}

async fn serve_on(runtime: flotilla_node_agent::RuntimeKind) -> flotilla_testkit::TestServe {
    spawn_serve_with(move |config| {
        config.agent.runtime = runtime;
        config.control.auth_enabled = true;
        config.control.api_keys = vec![ADMIN.into()];
        config.control.tenants = vec![
            flotilla_control_plane::config::TenantConfig {
                name: "acme".into(),
                api_keys: vec![ACME.into()],
                max_instances: 2,
                max_sessions: 0,
            },
            flotilla_control_plane::config::TenantConfig {
                name: "globex".into(),
                api_keys: vec![GLOBEX.into()],
                max_instances: 0,
                max_sessions: 0,
            },
        ];
    })
    .await
}

/// `path` with each remaining `{parameter}` replaced by `x`.
fn leftover_parameters(path: &str) -> String {
    let mut out = String::new();
    let mut rest = path;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let close = rest[open..].find('}').map_or(rest.len(), |c| open + c + 1);
        out.push('x');
        rest = &rest[close..];
    }
    out.push_str(rest);
    out
}

fn ids(list: &Value) -> Vec<String> {
    let mut ids: Vec<String> = list["instances"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["id"].as_str().unwrap().to_owned())
        .collect();
    ids.sort();
    ids
}

#[tokio::test]
async fn a_tenants_key_sees_and_acts_on_its_own_instances_only() {
    let serve = serve().await;
    let admin = Api::with_key(serve.api.base.clone(), ADMIN);
    let acme = Api::with_key(serve.api.base.clone(), ACME);
    let globex = Api::with_key(serve.api.base.clone(), GLOBEX);
    let mine = acme.create("{}").await["id"].as_str().unwrap().to_owned();
    let theirs = globex.create("{}").await["id"].as_str().unwrap().to_owned();
    let admins = admin.create("{}").await["id"].as_str().unwrap().to_owned();

    let (_, list) = acme.get("/v2/instances").await;
    assert_eq!(ids(&list), vec![mine.clone()], "{list}");
    assert_eq!(list["total"], 1);
    let (_, list) = globex.get("/v2/instances?limit=1000").await;
    assert_eq!(ids(&list), vec![theirs.clone()], "{list}");
    let (_, list) = admin.get("/v2/instances").await;
    let mut every = vec![mine.clone(), theirs.clone(), admins.clone()];
    every.sort();
    assert_eq!(ids(&list), every, "an admin sees the fleet");
    let (status, _) = acme.get(&format!("/v2/instances/{mine}")).await;
    assert_eq!(status, StatusCode::OK);

    // Every route of the document, with acme's key against globex's
    // instance (and an admin's), or a route of the fleet's: 404.
    let (_, document) = serve.api.get("/openapi.json").await;
    // Routes that name no object are the key's own creates and lists, or
    // open to anyone; but the fleet's (and what is not yet per tenant) are
    // an admin key's.
    let admin_only = [
        "/v2/nodes",
        "/v2/metrics",
        "/v2/alerts",
        "/metrics",
        "/v2/profiles",
        "/v2/extensions",
        "/v2/recordings",
        "/v2/tokens",
    ];
    let mut walked = 0;
    for (template, item) in document["paths"].as_object().unwrap() {
        let names_an_object = template.contains('{') && !template.starts_with("/live/");
        if !names_an_object && !admin_only.contains(&template.as_str()) {
            continue;
        }
        for method in item.as_object().unwrap().keys() {
            for other in [&theirs, &admins] {
                let path = template
                    .replace("{instance_id}", other)
                    .replace("{id}", other)
                    .replace("{node_id}", "test-node")
                    .replace("{link_id}", "0193d6a4-0000-7000-8000-000000000001")
                    .replace("{name}", "shop")
                    .replace("{extension_id}", "0193d6a4-0000-7000-8000-000000000002")
                    .replace("{recording_id}", "0193d6a4-0000-7000-8000-000000000003")
                    .replace("{profile_name}", "shop");
                // Any other parameter (a page's target, a file's name).
                let path = leftover_parameters(&path);
                let method: reqwest::Method = method.to_uppercase().parse().unwrap();
                let (status, body) = acme.call(method.clone(), &path, Some("{}")).await;
                assert_eq!(status, StatusCode::NOT_FOUND, "{method} {path}: {body}");
                walked += 1;
            }
        }
    }
    assert!(
        walked > 40,
        "the walk covered the document ({walked} calls)"
    );
    // Nothing of globex's moved.
    let (status, detail) = admin.get(&format!("/v2/instances/{theirs}")).await;
    assert_eq!(status, StatusCode::OK);
    assert_ne!(detail["status"], "removed");

    // The quota: two instances at once.
    acme.create("{}").await;
    let (status, refused) = acme.post("/v2/instances", "{}").await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{refused}");
    assert!(
        refused["detail"]
            .as_str()
            .unwrap()
            .contains("tenants.max_instances"),
        "{refused}"
    );
    // Profiles and extensions are not the tenant's to name yet.
    let (status, refused) = globex
        .post("/v2/instances", r#"{"profile": {"name": "shop"}}"#)
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{refused}");

    serve.shutdown().await;
}

/// On a node's own instance ports a tenant's key is not a credential (nodes
/// learn admin keys only); the instance's token, which its `urls` carry,
/// is, and so is an admin key.
#[tokio::test]
async fn browser_a_tenants_key_reaches_its_instance_through_the_door_or_its_token() {
    let serve = serve_on(flotilla_node_agent::RuntimeKind::Chromium).await;
    let acme = Api::with_key(serve.api.base.clone(), ACME);
    let (mine, created, detail) = acme.create_running("{}").await;
    let port = detail["http_port"].as_u64().unwrap();
    let tabs = format!("http://127.0.0.1:{port}/tabs");
    let http = reqwest::Client::new();
    let by_key = http.get(&tabs).bearer_auth(ACME).send().await.unwrap();
    assert_eq!(by_key.status(), StatusCode::UNAUTHORIZED);
    let by_admin = http.get(&tabs).bearer_auth(ADMIN).send().await.unwrap();
    assert_eq!(by_admin.status(), StatusCode::OK);
    let debug = created["urls"]["debug"].as_str().unwrap();
    let token = debug.split("token=").nth(1).expect("urls carry the token");
    let by_token = http
        .get(format!("{tabs}?token={token}"))
        .send()
        .await
        .unwrap();
    assert_eq!(by_token.status(), StatusCode::OK);
    // Through the front door, the tenant's key reaches its own instance.
    let (status, _) = acme
        .get(&format!("/v2/instances/{mine}/json/version"))
        .await;
    assert_eq!(status, StatusCode::OK);
    serve.shutdown().await;
}

/// MCP tools act on the session key's tenant's instances only.
#[tokio::test]
async fn mcp_tools_see_only_the_tenants_instances() {
    let serve = serve().await;
    let globex = Api::with_key(serve.api.base.clone(), GLOBEX);
    let (theirs, _, _) = globex.create_running("{}").await;
    let http = reqwest::Client::new();
    let url = format!("{}/mcp", serve.api.base);
    let post = |body: Value, session: Option<&str>| {
        let mut request = http
            .post(&url)
            .bearer_auth(ACME)
            .header("accept", "application/json, text/event-stream")
            .json(&body);
        if let Some(session) = session {
            request = request.header("mcp-session-id", session);
        }
        request.send()
    };
    let opened = post(
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "t", "version": "1"}}}),
        None,
    )
    .await
    .unwrap();
    let session = opened.headers()["mcp-session-id"]
        .to_str()
        .unwrap()
        .to_owned();
    opened.text().await.unwrap();
    post(
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        Some(&session),
    )
    .await
    .unwrap()
    .text()
    .await
    .unwrap();
    for (id, tool, arguments) in [
        (2, "browser_park", json!({"instance_id": theirs})),
        (3, "browser_close", json!({"instance_id": theirs})),
        (4, "browser_list", json!({})),
    ] {
        let answer = post(
            json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
                "params": {"name": tool, "arguments": arguments}}),
            Some(&session),
        )
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
        if tool == "browser_list" {
            assert!(!answer.contains(&theirs), "{tool}: {answer}");
        } else {
            assert!(answer.contains("not found"), "{tool}: {answer}");
            assert!(answer.contains("\"isError\":true"), "{tool}: {answer}");
        }
    }
    let (_, detail) = globex.get(&format!("/v2/instances/{theirs}")).await;
    assert_eq!(detail["status"], "running", "{detail}");
    serve.shutdown().await;
}
