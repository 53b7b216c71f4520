//! API keys as tenants (`[[tenants]]`): a tenant's key lists, gets and
//! acts on its own instances only; every route of the OpenAPI document
//! that names another tenant's object, or is the fleet's, answers it 404
//! (never 200 or 403); its quota holds; its key is not let in on a node's
//! instance ports (it reaches its instances through the front door, or
//! with their tokens); MCP tools see its instances only; profiles (by
//! their own names), extensions, kept recordings, metrics and event topics
//! are each tenant's own. An admin key sees everything.

use std::time::Duration;

use serde_json::{Value, json};

use flotilla_testkit::{Api, SseClient, StatusCode, spawn_serve_with};

use super::browser_recordings::{ANIMATED, record_animated_page};
use super::browser_sessions::{MARKER_MANIFEST, MARKER_SCRIPT, zip_of};

const ADMIN: &str = "flt_tenants_admin_key";
const ACME: &str = "flt_tenants_acme_key";
const GLOBEX: &str = "flt_tenants_globex_key";

async fn serve() -> flotilla_testkit::TestServe {
    serve_on(flotilla_node_agent::RuntimeKind::Sim).await
}

async fn serve_on(runtime: flotilla_node_agent::RuntimeKind) -> flotilla_testkit::TestServe {
    spawn_serve_with(move |config| {
        config.agent.runtime = runtime;
        with_tenants(config);
    })
    .await
}

/// Authentication on, an admin key, and tenants acme (at most 2 instances)
/// and globex.
fn with_tenants(config: &mut flotilla_server::FlotillaConfig) {
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

    // Globex and an admin each have a profile "shop" and an extension.
    for api in [&globex, &admin] {
        let (status, body) = api.post("/v2/profiles", r#"{"name": "shop"}"#).await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
    }
    let theirs_extension = upload_extension(&globex).await;
    let admins_extension = upload_extension(&admin).await;

    // Every route of the document, with acme's key against globex's
    // instance (and an admin's), their profile and extension, or a route
    // of the fleet's: 404.
    let (_, document) = serve.api.get("/openapi.json").await;
    // Routes that name no object are the key's own creates and lists, or
    // open to anyone; but the fleet's are an admin key's.
    let admin_only = ["/v2/nodes", "/v2/alerts", "/metrics"];
    let mut walked = 0;
    for (template, item) in document["paths"].as_object().unwrap() {
        let names_an_object = template.contains('{') && !template.starts_with("/live/");
        if !names_an_object && !admin_only.contains(&template.as_str()) {
            continue;
        }
        for method in item.as_object().unwrap().keys() {
            for (other, extension) in [(&theirs, &theirs_extension), (&admins, &admins_extension)] {
                let other = if template.starts_with("/v2/extensions/") {
                    extension
                } else {
                    other
                };
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
    // Grid's open /status tells anyone whether it is ready; the nodes
    // behind it only an admin's key.
    for (api, nodes) in [(&acme, 0), (&serve.api, 0), (&admin, 1)] {
        let (status, grid) = api.get("/wd/hub/status").await;
        assert_eq!(status, StatusCode::OK, "{grid}");
        assert_eq!(grid["value"]["ready"], true, "{grid}");
        assert_eq!(
            grid["value"]["nodes"].as_array().unwrap().len(),
            nodes,
            "{grid}"
        );
    }
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
    serve.shutdown().await;
}

/// A failed instance that kept its snapshot no longer counts toward its
/// tenant's `max_instances`; reviving it past the quota is refused.
#[tokio::test]
async fn a_revive_does_not_take_a_tenant_past_its_quota() {
    let data = tempfile::tempdir().unwrap();
    let configure = |config: &mut flotilla_server::FlotillaConfig| {
        config.agent.runtime = flotilla_node_agent::RuntimeKind::Sim;
        with_tenants(config);
    };
    let serve = flotilla_testkit::spawn_serve_in(data.path(), configure).await;
    let acme = Api::with_key(serve.api.base.clone(), ACME);
    let (parked, _, _) = acme.create_running("{}").await;
    acme.park(&parked).await;
    serve.shutdown().await;
    // Its revive failed on a node: failed, its snapshot kept.
    let database = format!("sqlite://{}/flotilla.db", data.path().display());
    let mut store = <sqlx::SqliteConnection as sqlx::Connection>::connect(&database)
        .await
        .unwrap();
    sqlx::query("UPDATE instances SET status = 'failed' WHERE id = $1")
        .bind(&parked)
        .execute(&mut store)
        .await
        .unwrap();
    drop(store);
    let serve = flotilla_testkit::spawn_serve_in(data.path(), configure).await;
    let acme = Api::with_key(serve.api.base.clone(), ACME);
    let (_, failed) = acme.get(&format!("/v2/instances/{parked}")).await;
    assert_eq!(failed["status"], "failed", "{failed}");
    assert!(failed["snapshot_id"].is_string(), "{failed}");
    acme.create("{}").await;
    acme.create("{}").await;
    let (status, body) = acme
        .post(&format!("/v2/instances/{parked}/revive"), "{}")
        .await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    assert!(
        body["detail"]
            .as_str()
            .unwrap()
            .contains("tenants.max_instances"),
        "{body}"
    );
    serve.shutdown().await;
}

/// An extension of `api`'s key; its id.
async fn upload_extension(api: &Api) -> String {
    let zip = zip_of(&[
        ("manifest.json", MARKER_MANIFEST),
        ("content.js", MARKER_SCRIPT),
    ]);
    let (status, body) = api
        .post_bytes("/v2/extensions", "application/zip", zip)
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    body["id"].as_str().unwrap().to_owned()
}

fn profile_names(list: &Value) -> Vec<&str> {
    list["profiles"]
        .as_array()
        .unwrap()
        .iter()
        .map(|profile| profile["name"].as_str().unwrap())
        .collect()
}

/// Each tenant has its own profile names; an admin sees every profile, a
/// tenant's as `<tenant>~<name>`. A tenant's instance starts from its own
/// profile and loads its own extensions only.
#[tokio::test]
async fn profiles_and_extensions_are_each_tenants_own() {
    let serve = serve().await;
    let admin = Api::with_key(serve.api.base.clone(), ADMIN);
    let acme = Api::with_key(serve.api.base.clone(), ACME);
    let globex = Api::with_key(serve.api.base.clone(), GLOBEX);
    for api in [&acme, &globex, &admin] {
        let (status, body) = api.post("/v2/profiles", r#"{"name": "shop"}"#).await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        assert_eq!(body["name"], "shop", "{body}");
    }
    let (status, body) = acme.post("/v2/profiles", r#"{"name": "shop"}"#).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    let (_, list) = acme.get("/v2/profiles").await;
    assert_eq!(profile_names(&list), ["shop"], "{list}");
    let (_, list) = admin.get("/v2/profiles").await;
    assert_eq!(
        profile_names(&list),
        ["acme~shop", "globex~shop", "shop"],
        "{list}"
    );
    let (status, _) = admin.get("/v2/profiles/globex~shop").await;
    assert_eq!(status, StatusCode::OK);
    for name in ["globex~shop", "globex%7Eshop", "..~shop", "acme~shop"] {
        let (status, body) = acme.get(&format!("/v2/profiles/{name}")).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{name}: {body}");
    }
    let (status, body) = acme
        .post("/v2/profiles", r#"{"name": "globex~shop"}"#)
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");

    // A create names the tenant's own profile and shows it by that name.
    let (id, _, detail) = acme
        .create_running(r#"{"profile": {"name": "shop", "persist": true}}"#)
        .await;
    assert_eq!(detail["profile"]["name"], "shop", "{detail}");
    let (_, seen) = admin.get(&format!("/v2/instances/{id}")).await;
    assert_eq!(
        seen["profile"]["name"], "acme~shop",
        "as /v2/profiles lists it: {seen}"
    );
    // Globex's "shop" is not held by acme's instance.
    let (status, body) = globex
        .post(
            "/v2/instances",
            r#"{"profile": {"name": "shop", "persist": true}}"#,
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let (status, body) = acme.delete("/v2/profiles/shop").await;
    assert_eq!(status, StatusCode::CONFLICT, "held by its instance: {body}");
    acme.delete_instance(&id).await;
    let (status, body) = acme.delete("/v2/profiles/shop").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, _) = admin.get("/v2/profiles/globex~shop").await;
    assert_eq!(status, StatusCode::OK, "globex's is still there");

    // Extensions: a tenant lists and loads its own only.
    let theirs = upload_extension(&globex).await;
    let mine = upload_extension(&acme).await;
    let (_, list) = acme.get("/v2/extensions").await;
    let listed: Vec<&str> = list["extensions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["id"].as_str().unwrap())
        .collect();
    assert_eq!(listed, [mine.as_str()], "{list}");
    let (_, list) = admin.get("/v2/extensions").await;
    assert_eq!(list["extensions"].as_array().unwrap().len(), 2, "{list}");
    let with = |id: &str| format!(r#"{{"config": {{"extensions": ["{id}"]}}}}"#);
    let (status, body) = acme.post("/v2/instances", &with(&theirs)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(
        body["detail"].as_str().unwrap().contains("no extension"),
        "{body}"
    );
    let (status, body) = acme.post("/v2/instances", &with(&mine)).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    // Nor does an admin's instance load a tenant's upload (a tenant's code
    // does not run in an admin's browser).
    let (status, body) = admin.post("/v2/instances", &with(&theirs)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    serve.shutdown().await;
}

/// A tenant's metrics count its own instances; its event token reads its
/// tenant's topic and its own instances', where its instances' events
/// arrive and no other tenant's do.
#[tokio::test]
async fn a_tenants_metrics_and_events_are_its_own() {
    let serve = serve().await;
    let acme = Api::with_key(serve.api.base.clone(), ACME);
    let globex = Api::with_key(serve.api.base.clone(), GLOBEX);
    let admin = Api::with_key(serve.api.base.clone(), ADMIN);
    let theirs = globex.create("{}").await["id"].as_str().unwrap().to_owned();
    admin.create("{}").await;

    let (status, token) = acme.post("/v2/tokens", "").await;
    assert_eq!(status, StatusCode::CREATED, "{token}");
    assert_eq!(token["topics"], json!(["tenants.acme"]), "{token}");
    for refused in [
        "instances".to_owned(),
        "instances.*".to_owned(),
        "nodes".to_owned(),
        "alerts".to_owned(),
        "tenants.globex".to_owned(),
        format!("instances.{theirs}"),
        "instances.0190a5f0-0000-7000-8000-000000000000".to_owned(),
    ] {
        let body = json!({ "topics": [refused] }).to_string();
        let (status, answer) = acme.post("/v2/tokens", &body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{refused}: {answer}");
    }
    let proxy = serve.serve().proxy_addr.to_string();
    let bearer = format!("Bearer {}", token["token"].as_str().unwrap());
    let forbidden = SseClient::connect(
        &proxy,
        "/events/tenants.globex",
        &[("authorization", &bearer)],
    )
    .await
    .unwrap();
    assert_eq!(forbidden.status, 403, "{}", forbidden.body);
    let mut events = SseClient::connect(
        &proxy,
        "/events/tenants.acme",
        &[("authorization", &bearer)],
    )
    .await
    .unwrap();
    assert_eq!(events.status, 200, "{}", events.body);

    globex.create("{}").await;
    let mine = acme.create("{}").await["id"].as_str().unwrap().to_owned();
    let (status, own) = acme
        .post(
            "/v2/tokens",
            &json!({ "topics": [format!("instances.{mine}")] }).to_string(),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{own}");
    for _ in 0..2 {
        let event = events.next_event(Duration::from_secs(30)).await.unwrap();
        let payload: Value = serde_json::from_str(event.data.as_deref().unwrap()).unwrap();
        assert_eq!(payload["data"]["instance_id"], mine.as_str(), "{payload}");
    }
    acme.delete_instance(&mine).await;
    loop {
        let event = events.next_event(Duration::from_secs(30)).await.unwrap();
        let payload: Value = serde_json::from_str(event.data.as_deref().unwrap()).unwrap();
        assert_eq!(payload["data"]["instance_id"], mine.as_str(), "{payload}");
        if event.event.as_deref() == Some("instance.deleted") {
            break;
        }
    }

    acme.create("{}").await;
    let (status, metrics) = acme.get("/v2/metrics").await;
    assert_eq!(status, StatusCode::OK, "{metrics}");
    assert_eq!(metrics["cluster"]["total_instances"], 1, "{metrics}");
    assert_eq!(metrics["cluster"]["nodes_online"], 0, "{metrics}");
    let (_, fleet) = admin.get("/v2/metrics").await;
    assert_eq!(fleet["cluster"]["total_instances"], 4, "{fleet}");
    let (status, _) = acme.get("/v2/metrics?node_id=test-node").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
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

/// A tenant's kept recordings outlive its instance as its own: another
/// tenant neither lists, plays nor deletes them; an admin sees them.
#[tokio::test]
async fn browser_a_tenants_kept_recordings_stay_its_own() {
    let pages = flotilla_testkit::serve_page(&[("/", ANIMATED)]).await;
    let serve = spawn_serve_with(|config| {
        with_tenants(config);
        pages.allow_in(config);
    })
    .await;
    let acme = Api::with_key(serve.api.base.clone(), ACME);
    let globex = Api::with_key(serve.api.base.clone(), GLOBEX);
    let admin = Api::with_key(serve.api.base.clone(), ADMIN);
    let (id, page) = record_animated_page(
        &globex,
        &pages,
        r#"{"record": true, "keep_recordings": true}"#,
        1.0,
    )
    .await;
    drop(page);
    globex.delete_instance(&id).await;
    let kept = flotilla_testkit::wait_until(
        flotilla_testkit::BROWSER_DEADLINE,
        "the recording kept",
        || async {
            let (_, body) = globex.get("/v2/recordings").await;
            match body["recordings"].as_array() {
                Some(listed) if listed.len() == 1 => Ok(Some(listed[0].clone())),
                _ => Err(body.to_string()),
            }
        },
    )
    .await
    .unwrap();
    let recording = kept["id"].as_str().unwrap();
    let (_, listed) = acme.get("/v2/recordings").await;
    assert_eq!(listed["recordings"], json!([]), "{listed}");
    let (_, listed) = acme.get(&format!("/v2/recordings?instance_id={id}")).await;
    assert_eq!(listed["recordings"], json!([]), "{listed}");
    let (status, body) = acme.get(&format!("/v2/recordings/{recording}")).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    let (status, body) = acme.delete(&format!("/v2/recordings/{recording}")).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    let (_, listed) = admin.get("/v2/recordings").await;
    assert_eq!(
        listed["recordings"].as_array().unwrap().len(),
        1,
        "{listed}"
    );
    let (status, body) = globex.delete(&format!("/v2/recordings/{recording}")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    serve.shutdown().await;
}

/// The dashboard with a tenant's key (real Chromium, Playwright): no fleet
/// sections, its own instances only, live by its tenant's event topic.
#[tokio::test]
async fn browser_the_dashboard_shows_a_tenant_its_own() {
    let serve = serve().await;
    let globex = Api::with_key(serve.api.base.clone(), GLOBEX);
    let theirs = globex.create("{}").await["id"].as_str().unwrap().to_owned();
    let result = flotilla_testkit::run_node(
        "dashboard_tenant.mjs",
        &[&serve.api.base, ACME, "acme", &theirs],
    )
    .await
    .unwrap();
    assert_eq!(result["errors"], json!([]), "console errors: {result}");
    assert_eq!(result["instances"], 1, "{result}");
    let acme = Api::with_key(serve.api.base.clone(), ACME);
    let (status, _) = acme
        .get(&format!("/v2/instances/{}", result["id"].as_str().unwrap()))
        .await;
    assert_eq!(status, StatusCode::OK, "made by acme");
    let (_, me) = acme.get("/v2/whoami").await;
    assert_eq!(me["scope"], "tenant", "{me}");
    assert_eq!(me["tenant"], "acme", "{me}");
    let (_, me) = Api::with_key(serve.api.base.clone(), ADMIN)
        .get("/v2/whoami")
        .await;
    assert_eq!(me["scope"], "admin", "{me}");
    assert!(me.get("tenant").is_none(), "{me}");
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
