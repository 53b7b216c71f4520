//! The /v2 API contract on the sim runtime: shapes, defaults, every 400, 404,
//! 405 and 503 path, listing semantics, OpenAPI and health, and schemathesis
//! over the OpenAPI document. (Browser behaviour is covered with real
//! Chromium in `browser_*.rs`.)

use serde_json::{Value, json};

use flotilla_node_agent::config::RuntimeKind;
use flotilla_testkit::{
    Api, StatusCode, assert_error, sorted_keys, spawn_serve_with, spawn_sim_serve, workspace_root,
};

#[tokio::test]
async fn create_answers_exactly_the_create_fields_with_defaults_applied() {
    let serve = spawn_sim_serve(10).await;
    let created = serve.api.create("{}").await;
    let keys = sorted_keys(&created);
    assert_eq!(
        keys,
        [
            "created_at",
            "debug_port",
            "http_port",
            "id",
            "node_id",
            "status",
            "stream_port",
            "subdomain",
            "urls"
        ]
    );
    assert!(["creating", "running"].contains(&created["status"].as_str().unwrap()));
    assert_eq!(created["node_id"], "test-node");
    let id = created["id"].as_str().unwrap();
    let debug_port = created["debug_port"].as_u64().unwrap();
    assert_eq!(
        created["urls"]["debug"],
        format!("ws://127.0.0.1:{debug_port}/devtools/browser/{id}")
    );
    assert_eq!(
        created["urls"]["stream"],
        format!(
            "http://127.0.0.1:{}/",
            created["stream_port"].as_u64().unwrap()
        )
    );
    assert_eq!(created["subdomain"], id.replace('-', ""));

    let detail = serve
        .api
        .wait_for_status(id, "running", flotilla_testkit::BROWSER_DEADLINE)
        .await;
    assert_eq!(detail["image"], "ubuntu:22.04");
    assert_eq!(
        detail["config"],
        serde_json::json!({"memory_gb": 2.0, "cpu_cores": 2, "disk_gb": 10.0, "idle_timeout_minutes": 30, "auto_snapshot": true})
    );
    for key in [
        "http_port",
        "resources",
        "activity",
        "created_at",
        "subdomain",
        "debug_port",
        "stream_port",
    ] {
        assert!(detail.get(key).is_some(), "get lacks {key}: {detail}");
    }
    assert_eq!(
        detail["urls"], created["urls"],
        "get shows the same urls as create (with the token when auth is on)"
    );
    assert!(detail["activity"]["idle_minutes"].as_f64().unwrap() >= 0.0);
    assert!(
        detail["activity"]["last_activity"]
            .as_str()
            .unwrap()
            .ends_with('Z')
    );

    let partial = serve
        .api
        .create(r#"{"config": {"memory_gb": 1.5, "auto_snapshot": false}}"#)
        .await;
    let partial_id = partial["id"].as_str().unwrap();
    let (_, detail) = serve.api.get(&format!("/v2/instances/{partial_id}")).await;
    assert_eq!(detail["config"]["memory_gb"], 1.5);
    assert_eq!(
        detail["config"]["cpu_cores"], 2,
        "unspecified members take the spec's defaults"
    );
    assert_eq!(detail["config"]["auto_snapshot"], false);
    assert!(detail["config"].get("prefs").is_none());

    // Preferences are kept as given and shown back.
    let with_prefs = serve
        .api
        .create(r#"{"config": {"prefs": {"intl.accept_languages": "de", "profile": {"exit_type": "Normal"}}}}"#)
        .await;
    let id = with_prefs["id"].as_str().unwrap();
    let (_, detail) = serve.api.get(&format!("/v2/instances/{id}")).await;
    assert_eq!(
        detail["config"]["prefs"],
        json!({"intl.accept_languages": "de", "profile": {"exit_type": "Normal"}})
    );
}

#[tokio::test]
async fn invalid_create_bodies_are_400_naming_the_field() {
    let serve = spawn_sim_serve(10).await;
    let cases: &[(&str, &str)] = &[
        ("{not json", "request body"),
        ("", "request body is required"),
        ("[]", "request body"),
        (r#"{"image": 5}"#, "image"),
        (r#"{"colour": "red"}"#, "colour"),
        (r#"{"config": {"memory_gb": "2"}}"#, "config.memory_gb"),
        (r#"{"config": {"memory_gb": 0}}"#, "config.memory_gb"),
        (r#"{"config": {"memory_gb": -1}}"#, "config.memory_gb"),
        (r#"{"config": {"cpu_cores": 0}}"#, "config.cpu_cores"),
        (r#"{"config": {"cpu_cores": -3}}"#, "config.cpu_cores"),
        (r#"{"config": {"cpu_cores": 1.5}}"#, "config.cpu_cores"),
        (r#"{"config": {"disk_gb": 0}}"#, "config.disk_gb"),
        (r#"{"config": {"disk_gb": -10}}"#, "config.disk_gb"),
        (
            r#"{"config": {"idle_timeout_minutes": -1}}"#,
            "config.idle_timeout_minutes",
        ),
        (
            r#"{"config": {"auto_snapshot": "yes"}}"#,
            "config.auto_snapshot",
        ),
        (r#"{"config": {"gpu": true}}"#, "gpu"),
        (r#"{"config": {"prefs": ["a"]}}"#, "config.prefs"),
        (
            r#"{"config": {"prefs": {"download.default_directory": "/etc"}}}"#,
            "config.prefs.download.default_directory",
        ),
        (
            r#"{"config": {"prefs": {"proxy": {"mode": "direct"}}}}"#,
            "config.prefs.proxy",
        ),
        (r#"{"config": {"prefs": {"a..b": 1}}}"#, "config.prefs key"),
        (
            r#"{"config": {"prefs": {"a": 1, "a.b": 1}}}"#,
            "config.prefs",
        ),
        (r#"{"image": "windows:11"}"#, "image"),
        (r#"{"image": ""}"#, "image"),
        (r#"{"node_preference": "no-such-node"}"#, "node_preference"),
        (r#"{} {}"#, "trailing"),
    ];
    assert_creates_refused(
        &serve.api,
        cases,
        StatusCode::BAD_REQUEST,
        "invalid_request",
    )
    .await;
    let (_, list) = serve.api.get("/v2/instances").await;
    assert_eq!(list["total"], 0, "no rejected request left a record");
}

/// Each create body of `cases` is refused with `status` and `code`, its
/// detail naming what the case says.
async fn assert_creates_refused(api: &Api, cases: &[(&str, &str)], status: StatusCode, code: &str) {
    for (body, mention) in cases {
        assert_error(api.post("/v2/instances", body).await, status, code, mention);
    }
}

/// The ids of a list page, in its order.
fn listed_ids(page: &Value) -> Vec<&str> {
    let instances = page["instances"].as_array().unwrap();
    instances
        .iter()
        .map(|i| i["id"].as_str().unwrap())
        .collect()
}

/// A list page's `total`, `limit` and `offset`.
fn page_window(page: &Value) -> (Option<i64>, Option<i64>, Option<i64>) {
    let number = |key: &str| page[key].as_i64();
    (number("total"), number("limit"), number("offset"))
}

#[tokio::test]
async fn full_node_gives_503_insufficient_capacity() {
    let serve = spawn_sim_serve(2).await;
    let too_big = [
        (r#"{"config": {"memory_gb": 1000}}"#, "memory"),
        (r#"{"config": {"cpu_cores": 256}}"#, "cpu_cores"),
    ];
    let full = [
        ("{}", "full"),
        (r#"{"node_preference": "test-node"}"#, "test-node"),
    ];
    let refused = StatusCode::SERVICE_UNAVAILABLE;
    assert_creates_refused(&serve.api, &too_big, refused, "insufficient_capacity").await;
    serve.api.create("{}").await;
    serve.api.create("{}").await;
    assert_creates_refused(&serve.api, &full, refused, "insufficient_capacity").await;

    // Deleting frees the slot.
    let (_, list) = serve.api.get("/v2/instances").await;
    let id = list["instances"][0]["id"].as_str().unwrap().to_owned();
    serve.api.delete_instance(&id).await;
    serve.api.create("{}").await;
}

#[tokio::test]
async fn unknown_ids_paths_and_methods() {
    let serve = spawn_sim_serve(2).await;
    let unknown = [
        (reqwest::Method::GET, "/v2/instances/nope", "nope"),
        (reqwest::Method::DELETE, "/v2/instances/nope", "nope"),
        (reqwest::Method::GET, "/v2/nodes/nope", "nope"),
        (reqwest::Method::GET, "/v3/things", "/v3/things"),
    ];
    for (method, path, mention) in unknown {
        assert_error(
            serve.api.call(method, path, None).await,
            StatusCode::NOT_FOUND,
            "not_found",
            mention,
        );
    }
    assert_error(
        serve
            .api
            .call(reqwest::Method::PUT, "/v2/instances", Some("{}"))
            .await,
        StatusCode::METHOD_NOT_ALLOWED,
        "invalid_request",
        "PUT",
    );
    let created = serve.api.create("{}").await;
    let id = created["id"].as_str().unwrap();
    for (query, mention) in [("force=maybe", "force"), ("forse=true", "forse")] {
        assert_error(
            serve
                .api
                .delete(&format!("/v2/instances/{id}?{query}"))
                .await,
            StatusCode::BAD_REQUEST,
            "invalid_request",
            mention,
        );
    }
    let (status, value) = serve
        .api
        .delete(&format!("/v2/instances/{id}?force=true"))
        .await;
    assert_eq!(status, StatusCode::OK, "{value}");
    assert!(value["message"].as_str().unwrap().contains(id));
    let (status, _) = serve.api.get(&format!("/v2/instances/{id}")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn list_filters_sorts_and_pages() {
    let serve = spawn_sim_serve(30).await;
    let mut ids = Vec::new();
    for _ in 0..12 {
        ids.push(
            serve.api.create("{}").await["id"]
                .as_str()
                .unwrap()
                .to_owned(),
        );
    }
    for id in &ids {
        serve
            .api
            .wait_for_status(id, "running", flotilla_testkit::BROWSER_DEADLINE)
            .await;
    }
    let (status, page) = serve.api.get("/v2/instances").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(page_window(&page), (Some(12), Some(100), Some(0)));
    let listed = listed_ids(&page);
    let mut newest_first = ids.clone();
    newest_first.reverse();
    assert_eq!(listed, newest_first, "default sort is created_at_desc");
    let item = &page["instances"][0];
    let keys = sorted_keys(item);
    // The spec's list members, and the two docs/api.md adds to list items
    // (as to get): `image` and what drives the instance (`drivers`).
    assert_eq!(
        keys,
        [
            "created_at",
            "debug_port",
            "drivers",
            "id",
            "image",
            "node_id",
            "resources",
            "status",
            "stream_port",
            "subdomain"
        ]
    );
    assert_eq!(
        sorted_keys(&item["drivers"]),
        ["actions", "cdp", "mcp", "playwright", "webdriver"]
    );
    assert_eq!(
        sorted_keys(&item["resources"]),
        ["cpu_percent", "disk_mb", "memory_mb"]
    );

    let (_, page) = serve
        .api
        .get("/v2/instances?sort=created_at_asc&limit=5&offset=5")
        .await;
    let listed = listed_ids(&page);
    assert_eq!(
        listed,
        ids[5..10].iter().map(String::as_str).collect::<Vec<_>>()
    );
    assert_eq!(page_window(&page), (Some(12), Some(5), Some(5)));

    let (_, page) = serve.api.get("/v2/instances?offset=100").await;
    assert_eq!(page["instances"].as_array().unwrap().len(), 0);
    assert_eq!(page["total"], 12);

    for (query, total) in [
        ("status=running&node_id=test-node&sort=memory_desc", 12),
        ("status=dormant", 0),
        ("node_id=elsewhere&sort=cpu_desc", 0),
    ] {
        let (_, page) = serve.api.get(&format!("/v2/instances?{query}")).await;
        assert_eq!(page["total"], total, "{query}");
    }

    for (query, mention) in [
        ("limit=0", "limit"),
        ("limit=1001", "limit"),
        ("limit=-5", "limit"),
        ("limit=ten", "limit"),
        ("offset=-1", "offset"),
        ("offset=x", "offset"),
        ("status=sleeping", "status"),
        ("sort=name_asc", "sort"),
        ("page=2", "page"),
    ] {
        assert_error(
            serve.api.get(&format!("/v2/instances?{query}")).await,
            StatusCode::BAD_REQUEST,
            "invalid_request",
            mention,
        );
    }
    let (status, page) = serve.api.get("/v2/instances?limit=1000").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(page["limit"], 1000);
}

#[tokio::test]
async fn nodes_and_health() {
    let serve = spawn_sim_serve(7).await;
    serve.api.create("{}").await;
    let (status, nodes) = serve.api.get("/v2/nodes").await;
    assert_eq!(status, StatusCode::OK);
    let node = &nodes["nodes"][0];
    assert_eq!(node["id"], "test-node");
    assert_eq!(node["status"], "online");
    assert_eq!(node["max_instances"], 7);
    assert_eq!(node["instances_count"], 1);
    assert!(
        node["address"]
            .as_str()
            .unwrap()
            .starts_with("http://127.0.0.1:")
    );
    assert!(
        node.get("capabilities").is_none(),
        "capabilities are node detail only"
    );
    for key in ["cpu_percent", "memory_percent", "disk_percent"] {
        assert!(node["resources"][key].is_number(), "{node}");
    }
    assert!(node["last_heartbeat"].is_string());

    let (status, detail) = serve.api.get("/v2/nodes/test-node").await;
    assert_eq!(status, StatusCode::OK);
    assert!(detail["capabilities"]["cpu_cores"].as_i64().unwrap() >= 1);
    assert!(detail["capabilities"]["memory_gb"].as_f64().unwrap() > 0.0);
    assert!(detail["capabilities"]["disk_gb"].as_f64().unwrap() > 0.0);

    let (status, health) = serve.api.get("/health").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(health["status"], "healthy");
    assert_eq!(health["instances_count"], 1);
    for component in ["api", "storage", "messaging", "scheduler"] {
        assert!(health["components"][component].is_string(), "{health}");
    }
    assert_eq!(health["components"]["storage"], "up");
    assert_eq!(health["components"]["scheduler"], "up");
}

#[tokio::test]
async fn openapi_document_and_swagger_ui_are_served_offline() {
    let serve = spawn_sim_serve(1).await;
    let (status, doc) = serve.api.get("/openapi.json").await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        doc["openapi"].as_str().unwrap().starts_with("3.1"),
        "{}",
        doc["openapi"]
    );
    assert_eq!(doc["info"]["version"], "2.0.0");
    for path in [
        "/health",
        "/v2/instances",
        "/v2/instances/{instance_id}",
        "/v2/nodes",
        "/v2/nodes/{node_id}",
        "/v2/profiles",
        "/v2/profiles/{name}",
        "/v2/extensions",
        "/v2/extensions/{id}",
    ] {
        assert!(doc["paths"].get(path).is_some(), "missing {path}");
    }
    // A path parameter is in its path's template (one declared `in: path`
    // that is not there can never be sent: `GET /v2/recordings` had its
    // `instance_id` query so).
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, operation) in item.as_object().unwrap() {
            for parameter in operation["parameters"].as_array().into_iter().flatten() {
                if parameter["in"] == "path" {
                    let name = parameter["name"].as_str().unwrap();
                    assert!(
                        path.contains(&format!("{{{name}}}")),
                        "{method} {path}: path parameter {name} is not in the path"
                    );
                }
            }
        }
    }
    let create = &doc["paths"]["/v2/instances"]["post"]["responses"];
    for code in ["201", "400", "503"] {
        assert!(create.get(code).is_some(), "create lacks {code}");
    }
    assert_eq!(
        doc["components"]["securitySchemes"]["bearer"]["scheme"],
        "bearer"
    );
    let config = &doc["components"]["schemas"]["InstanceConfig"]["properties"];
    assert_eq!(config["memory_gb"]["default"], 2.0);
    assert_eq!(config["idle_timeout_minutes"]["default"], 30);

    let (status, page) = serve.api.get("/docs/").await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        page.as_str().unwrap().contains("swagger"),
        "Swagger UI page"
    );
    let (status, _) = serve.api.get("/docs/swagger-ui-bundle.js").await;
    assert_eq!(status, StatusCode::OK, "Swagger UI assets are embedded");
}

/// schemathesis (PyPI) over `/openapi.json`: its coverage, fuzzing and
/// stateful phases with every check, against `serve` on the sim runtime with
/// authentication on. `tests/schemathesis.toml` says which operations are left
/// out and why; a fixed seed keeps the run reproducible.
#[tokio::test]
async fn the_api_keeps_its_openapi_contract_under_schemathesis() {
    const KEY: &str = "flt_schemathesis_key";
    let serve = spawn_serve_with(|config| {
        config.agent.runtime = RuntimeKind::Sim;
        config.agent.max_instances = 5000;
        config.control.auth_enabled = true;
        config.control.api_keys = vec![KEY.into()];
    })
    .await;
    // schemathesis keeps a cache in its working directory: not in the tree.
    let scratch = tempfile::tempdir().unwrap();
    let output = tokio::process::Command::new("schemathesis")
        .current_dir(scratch.path())
        .arg("--config-file")
        .arg(workspace_root().join("tests/schemathesis.toml"))
        .arg("run")
        .arg(format!("{}/openapi.json", serve.api.base))
        .args(["-H", &format!("Authorization: Bearer {KEY}")])
        .args(["--checks", "all", "--seed", "1", "--max-examples", "50"])
        .args(["--workers", "1", "--no-color"])
        .output()
        .await
        .expect("schemathesis runs (scripts/install-deps --test installs it)");
    let report = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "schemathesis found failures:\n{report}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        report.contains("Stateful"),
        "the stateful phase ran: {report}"
    );
    serve.shutdown().await;
}

/// What schemathesis found, pinned: the schema says what validation accepts.
#[tokio::test]
async fn the_schema_and_the_validation_agree() {
    let serve = spawn_sim_serve(5).await;
    let api = &serve.api;
    let (_, doc) = api.get("/openapi.json").await;
    let create = &doc["paths"]["/v2/instances"]["post"];
    let wait_sec = create["parameters"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "wait_sec")
        .expect("wait_sec is documented");
    assert_eq!(wait_sec["in"], "query", "{wait_sec}");
    assert_eq!(wait_sec["schema"]["maximum"], 300, "{wait_sec}");
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, operation) in item.as_object().unwrap() {
            let responses = &operation["responses"];
            assert!(responses.get("429").is_some(), "{method} {path} lacks 429");
            let open = operation["security"] == serde_json::json!([{}]);
            assert_eq!(
                responses.get("401").is_some(),
                !open,
                "{method} {path}: 401"
            );
        }
    }
    let metrics_security = &doc["paths"]["/metrics"]["get"]["security"];
    assert!(
        metrics_security
            .as_array()
            .unwrap()
            .contains(&serde_json::json!({})),
        "/metrics takes a credential only with metrics_require_auth: {metrics_security}"
    );

    // An integer written with a zero fraction is an integer; a fraction is not.
    let (status, body) = api
        .post("/v2/instances", r#"{"config": {"cpu_cores": 2.0}}"#)
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(body["id"].as_str().map(str::len), Some(36));
    assert_error(
        api.post("/v2/instances", r#"{"config": {"cpu_cores": 2.5}}"#)
            .await,
        StatusCode::BAD_REQUEST,
        "invalid_request",
        "cpu_cores",
    );
    let (status, body) = api.post("/v2/tokens", r#"{"ttl_sec": 137.0}"#).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");

    // An optional body may be JSON null.
    let (status, body) = api.post("/v2/tokens", "null").await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let id = running_instance(api).await;
    assert_error(
        api.post(&format!("/v2/instances/{id}/revive"), "null")
            .await,
        StatusCode::CONFLICT,
        "invalid_state",
        "dormant",
    );

    // Topics name instances by their hyphenated id only, as the schema says.
    let braced = format!(r#"{{"topics": ["instances.{{{id}}}"]}}"#);
    assert_error(
        api.post("/v2/tokens", &braced).await,
        StatusCode::BAD_REQUEST,
        "invalid_request",
        "topics",
    );
    let (status, body) = api
        .post(
            "/v2/tokens",
            &format!(r#"{{"topics": ["instances.{id}"]}}"#),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");

    // DevTools' /json/new takes PUT only (Chromium refuses GET).
    let (status, _) = api.get(&format!("/v2/instances/{id}/json/new")).await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    serve.shutdown().await;
}

/// The id of a new running instance.
async fn running_instance(api: &flotilla_testkit::Api) -> String {
    let (status, body) = api.post("/v2/instances", "{}").await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let id = body["id"].as_str().unwrap().to_owned();
    api.wait_for_status(&id, "running", std::time::Duration::from_secs(30))
        .await;
    id
}

/// The drain's doors, which schemathesis leaves out (a drain takes its only
/// node out of placement): a key is needed, a query that is not theirs is a
/// 400, an unknown or path-like node a 404, and a drain of the sim node
/// finishes with nothing to move until it is uncordoned.
#[tokio::test]
async fn the_drain_asks_for_a_key_and_refuses_bad_input() {
    const KEY: &str = "flt_drain_key";
    let serve = spawn_serve_with(|config| {
        config.agent.runtime = RuntimeKind::Sim;
        config.control.auth_enabled = true;
        config.control.api_keys = vec![KEY.into()];
    })
    .await;
    let anonymous = &serve.api;
    for path in ["/v2/nodes/test-node/drain", "/v2/nodes/test-node/uncordon"] {
        let (status, body) = anonymous.post(path, "").await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{path}: {body}");
    }
    let api = flotilla_testkit::Api::with_key(serve.api.base.clone(), KEY);
    for query in ["until_restart=perhaps", "until_restart=%ff", "colour=blue"] {
        let (status, body) = api
            .post(&format!("/v2/nodes/test-node/drain?{query}"), "")
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{query}: {body}");
    }
    for node in ["no-such-node", "..%2F..%2Fetc", "%00"] {
        let (status, body) = api.post(&format!("/v2/nodes/{node}/drain"), "").await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{node}: {body}");
    }
    let (_, node) = api.get("/v2/nodes/test-node").await;
    assert_eq!(node["status"], "online", "{node}");
    let (status, report) = api.post("/v2/nodes/test-node/drain", "").await;
    assert_eq!(status, StatusCode::ACCEPTED, "{report}");
    assert!(report["moving"].as_array().unwrap().is_empty(), "{report}");
    let node = flotilla_testkit::wait_until(
        std::time::Duration::from_secs(30),
        "a drain with nothing to move to finish",
        || async {
            let (_, node) = api.get("/v2/nodes/test-node").await;
            if node["drain"]["finished"] == true {
                Ok(Some(node))
            } else {
                Err(node.to_string())
            }
        },
    )
    .await
    .unwrap();
    assert_eq!(node["status"], "draining", "{node}");
    let (status, node) = api.post("/v2/nodes/test-node/uncordon", "").await;
    assert_eq!(status, StatusCode::OK, "{node}");
    assert_eq!(node["status"], "online", "{node}");
}
