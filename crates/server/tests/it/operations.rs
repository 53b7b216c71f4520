//! The operational half of the control plane on the sim runtime: signed
//! webhooks through a durable outbox (a receiver that is down, a restart),
//! lifecycle events to subscribers through the proxy with control-plane
//! tokens, authentication and rate limits on every endpoint, Prometheus
//! exposition parsed by a real parser, metrics history and alerts.

use std::collections::HashMap;
use std::time::Duration;

use flotilla_control_plane::config::WebhookConfig;
use flotilla_node_agent::RuntimeKind;
use flotilla_server::FlotillaConfig;
use flotilla_testkit::{
    Api, EventReceiver, SseClient, StatusCode, get_text, spawn_serve_in, spawn_serve_with,
    wait_until,
};
use serde_json::Value;

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

fn sim(config: &mut FlotillaConfig, max_instances: i64) {
    config.agent.runtime = RuntimeKind::Sim;
    config.agent.max_instances = max_instances;
}

/// Event names per instance, in arrival order, each event once (at-least-once
/// delivery may repeat one; `webhook-id` tells).
fn per_instance(events: &[flotilla_testkit::ReceivedEvent]) -> HashMap<String, Vec<String>> {
    let mut seen = std::collections::HashSet::new();
    let mut sequences: HashMap<String, Vec<String>> = HashMap::new();
    for event in events {
        if !seen.insert(event.id.clone()) {
            continue;
        }
        if let Some(instance) = event.payload["data"]["instance_id"].as_str() {
            sequences
                .entry(instance.to_owned())
                .or_default()
                .push(event.payload["event"].as_str().unwrap().to_owned());
        }
    }
    sequences
}

async fn create_running(api: &Api) -> String {
    let created = api.create("{}").await;
    let id = created["id"].as_str().unwrap().to_owned();
    api.wait_for_status(&id, "running", Duration::from_secs(60))
        .await;
    id
}

#[tokio::test]
async fn webhooks_survive_a_down_receiver_and_a_restart_in_order_per_instance() {
    let receiver = EventReceiver::start(SECRET).await;
    receiver.set_up(false);
    let data = tempfile::tempdir().unwrap();
    let url = receiver.url.clone();
    let configure = move |config: &mut FlotillaConfig| {
        sim(config, 10);
        config.control.webhooks = vec![WebhookConfig {
            url: url.clone(),
            events: Vec::new(),
            secret: SECRET.into(),
        }];
        config.control.webhook_delivery.max_backoff_sec = 1.0;
    };
    let serve = spawn_serve_in(data.path(), configure.clone()).await;
    let api = &serve.api;
    let parked = create_running(api).await;
    let deleted = create_running(api).await;
    let kept = create_running(api).await;
    api.park(&parked).await;
    api.revive(&parked).await;
    api.wait_for_status(&parked, "running", Duration::from_secs(60))
        .await;
    api.delete_instance(&deleted).await;
    wait_until(Duration::from_secs(30), "a refused delivery", || async {
        Ok::<_, String>((receiver.refused() > 0).then_some(()))
    })
    .await
    .unwrap();
    assert!(receiver.events().is_empty());

    // Restart while the receiver is still down; it comes back afterwards.
    serve.shutdown().await;
    let serve = spawn_serve_in(data.path(), configure).await;
    receiver.set_up(true);
    let expected: HashMap<String, Vec<&str>> = [
        (
            parked.clone(),
            vec![
                "instance.created",
                "instance.running",
                "instance.dormant",
                "instance.revived",
                "instance.stopped",
            ],
        ),
        (
            deleted.clone(),
            vec!["instance.created", "instance.running", "instance.deleted"],
        ),
        (
            kept.clone(),
            vec!["instance.created", "instance.running", "instance.stopped"],
        ),
    ]
    .into_iter()
    .collect();
    wait_until(Duration::from_secs(60), "every event delivered", || async {
        let got = per_instance(&receiver.events());
        let done = expected
            .iter()
            .all(|(id, names)| got.get(id).map(Vec::len) == Some(names.len()));
        if done {
            Ok(Some(got))
        } else {
            Err(format!("{got:?}"))
        }
    })
    .await
    .unwrap();
    let got = per_instance(&receiver.events());
    for (id, names) in &expected {
        assert_eq!(&got[id], names, "events of {id} in order");
    }
    assert_eq!(receiver.bad_signatures(), 0);
    for event in receiver.events() {
        let payload = &event.payload;
        assert!(
            payload["timestamp"].as_str().unwrap().ends_with('Z'),
            "{payload}"
        );
        assert!(payload["data"]["status"].is_string(), "{payload}");
    }
    // Nothing is left in the outbox.
    let metrics = serve.api.get("/metrics").await.1;
    let text = metrics.as_str().unwrap();
    wait_until(Duration::from_secs(30), "an empty outbox", || async {
        let (_, metrics) = serve.api.get("/metrics").await;
        let text = metrics.as_str().unwrap_or_default().to_owned();
        Ok::<_, String>(text.contains("service_outbox_depth 0").then_some(()))
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: {text}"));
    serve.shutdown().await;
}

#[tokio::test]
async fn a_webhook_gets_only_the_events_it_asked_for() {
    let receiver = EventReceiver::start("plain-secret").await;
    let url = receiver.url.clone();
    let serve = spawn_serve_with(move |config| {
        sim(config, 10);
        config.control.webhooks = vec![WebhookConfig {
            url,
            events: vec!["instance.deleted".parse().unwrap()],
            secret: "plain-secret".into(),
        }];
    })
    .await;
    let id = create_running(&serve.api).await;
    serve.api.delete(&format!("/v2/instances/{id}")).await;
    wait_until(Duration::from_secs(30), "the delete event", || async {
        Ok::<_, String>((!receiver.events().is_empty()).then_some(()))
    })
    .await
    .unwrap();
    let events = receiver.events();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].payload["event"], "instance.deleted");
    assert_eq!(events[0].payload["data"]["instance_id"], id.as_str());
    assert_eq!(receiver.bad_signatures(), 0);
    serve.shutdown().await;
}

#[tokio::test]
async fn subscribers_with_a_control_plane_token_receive_lifecycle_events() {
    let serve = spawn_serve_with(|config| sim(config, 10)).await;
    let proxy = serve.serve().proxy_addr.to_string();

    let refused = SseClient::connect(&proxy, "/events/instances", &[])
        .await
        .unwrap();
    assert_eq!(refused.status, 401, "serve's proxy asks for a token");

    let (status, narrow) = serve
        .api
        .post(
            "/v2/tokens",
            r#"{"topics": ["instances.0190a5f0-0000-7000-8000-000000000000"], "ttl_sec": 60}"#,
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{narrow}");
    let bearer = format!("Bearer {}", narrow["token"].as_str().unwrap());
    let forbidden = SseClient::connect(&proxy, "/events/instances", &[("authorization", &bearer)])
        .await
        .unwrap();
    assert_eq!(forbidden.status, 403, "{}", forbidden.body);

    for bad in [
        r#"{"topics": ["secrets"]}"#,
        r#"{"ttl_sec": 0}"#,
        r#"{"topics": []}"#,
        r#"{"scope": "all"}"#,
    ] {
        let (status, body) = serve.api.post("/v2/tokens", bad).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {body}");
        assert_eq!(body["code"], "invalid_request");
    }

    let (status, token) = serve.api.post("/v2/tokens", "").await;
    assert_eq!(status, StatusCode::CREATED, "{token}");
    assert!(token["expires_at"].as_i64().unwrap() > flotilla_testkit::chrono_like_now());
    let bearer = format!("Bearer {}", token["token"].as_str().unwrap());
    let mut all = SseClient::connect(&proxy, "/events/instances", &[("authorization", &bearer)])
        .await
        .unwrap();
    assert_eq!(all.status, 200, "{}", all.body);

    let created = serve.api.create("{}").await;
    let id = created["id"].as_str().unwrap();
    let event = all.next_event(Duration::from_secs(30)).await.unwrap();
    assert_eq!(event.event.as_deref(), Some("instance.created"));
    let payload: Value = serde_json::from_str(event.data.as_deref().unwrap()).unwrap();
    assert_eq!(payload["event"], "instance.created");
    assert_eq!(payload["data"]["instance_id"], id);
    assert_eq!(payload["data"]["status"], "creating");
    let next = all.next_event(Duration::from_secs(30)).await.unwrap();
    assert_eq!(next.event.as_deref(), Some("instance.running"));

    // The instance's own topic, from the start of its history.
    let mut one = SseClient::connect(
        &proxy,
        &format!("/events/instances.{id}"),
        &[("authorization", &bearer), ("last-event-id", "0-0")],
    )
    .await
    .unwrap();
    assert_eq!(one.status, 200, "{}", one.body);
    serve.api.delete(&format!("/v2/instances/{id}")).await;
    let mut names = Vec::new();
    while names.last().map(String::as_str) != Some("instance.deleted") {
        let event = one.next_event(Duration::from_secs(30)).await.unwrap();
        names.push(event.event.unwrap_or_default());
    }
    assert!(
        names.ends_with(&["instance.deleted".to_owned()]),
        "{names:?}"
    );
    serve.shutdown().await;
}

#[tokio::test]
async fn auth_and_rate_limit_headers_on_every_endpoint() {
    let keys = ["flt_first_key", "flt_second_key"];
    let serve = spawn_serve_with(move |config| {
        sim(config, 10);
        config.control.auth_enabled = true;
        config.control.api_keys = vec![
            // One hashed as `flotilla keys create` prints it, one raw.
            format!("sha256:{}", sha256_hex(keys[0])),
            keys[1].into(),
        ];
        config.control.rate_limit.enabled = true;
        config.control.rate_limit.requests_per_minute = 60;
    })
    .await;
    let base = serve.api.base.clone();
    let http = reqwest::Client::new();
    let call = |method: reqwest::Method, path: &str, key: Option<&str>| {
        let mut request = http.request(method, format!("{base}{path}"));
        if let Some(key) = key {
            request = request.bearer_auth(key);
        }
        request
    };
    let missing = "0190a5f0-0000-7000-8000-000000000000";
    let protected = [
        (reqwest::Method::GET, "/v2/instances".to_owned()),
        (reqwest::Method::POST, "/v2/instances".to_owned()),
        (reqwest::Method::GET, format!("/v2/instances/{missing}")),
        (reqwest::Method::DELETE, format!("/v2/instances/{missing}")),
        (
            reqwest::Method::POST,
            format!("/v2/instances/{missing}/dormant"),
        ),
        (
            reqwest::Method::POST,
            format!("/v2/instances/{missing}/revive"),
        ),
        (reqwest::Method::GET, "/v2/nodes".to_owned()),
        (reqwest::Method::GET, "/v2/nodes/test-node".to_owned()),
        (reqwest::Method::GET, "/v2/metrics".to_owned()),
        (reqwest::Method::GET, "/v2/alerts".to_owned()),
        (reqwest::Method::POST, "/v2/tokens".to_owned()),
        (reqwest::Method::GET, "/v2/profiles".to_owned()),
        (reqwest::Method::POST, "/v2/profiles".to_owned()),
        (reqwest::Method::GET, "/v2/profiles/shop".to_owned()),
        (reqwest::Method::DELETE, "/v2/profiles/shop".to_owned()),
        (reqwest::Method::GET, "/v2/extensions".to_owned()),
        (reqwest::Method::POST, "/v2/extensions".to_owned()),
        (reqwest::Method::GET, format!("/v2/extensions/{missing}")),
        (reqwest::Method::DELETE, format!("/v2/extensions/{missing}")),
        (reqwest::Method::GET, "/v2/no-such-path".to_owned()),
    ];
    let open = [
        (reqwest::Method::GET, "/health".to_owned()),
        (reqwest::Method::GET, "/metrics".to_owned()),
        (reqwest::Method::GET, "/openapi.json".to_owned()),
    ];
    let assert_rate_headers = |response: &reqwest::Response, what: &str| {
        for header in [
            "x-ratelimit-limit",
            "x-ratelimit-remaining",
            "x-ratelimit-reset",
        ] {
            let value = response
                .headers()
                .get(header)
                .unwrap_or_else(|| panic!("{what}: no {header}"));
            let value: i64 = value.to_str().unwrap().parse().unwrap();
            if header == "x-ratelimit-limit" {
                assert_eq!(value, 60, "{what}");
            }
            if header == "x-ratelimit-reset" {
                assert!(
                    value >= flotilla_testkit::chrono_like_now(),
                    "{what}: reset is Unix time"
                );
            }
        }
    };
    for (method, path) in &protected {
        for (key, label) in [(None, "no key"), (Some("flt_wrong"), "wrong key")] {
            let response = call(method.clone(), path, key).send().await.unwrap();
            let what = format!("{method} {path} with {label}");
            assert_eq!(response.status(), StatusCode::UNAUTHORIZED, "{what}");
            assert_rate_headers(&response, &what);
            assert_eq!(response.headers()["www-authenticate"], "Bearer");
            let body: Value = response.json().await.unwrap();
            assert_eq!(body["code"], "unauthorized", "{what}: {body}");
            assert!(
                body["detail"].as_str().unwrap().contains("API key"),
                "{body}"
            );
        }
        for key in keys {
            let response = call(method.clone(), path, Some(key)).send().await.unwrap();
            let what = format!("{method} {path} with a key");
            assert_ne!(response.status(), StatusCode::UNAUTHORIZED, "{what}");
            assert_ne!(
                response.status(),
                StatusCode::INTERNAL_SERVER_ERROR,
                "{what}"
            );
            assert_rate_headers(&response, &what);
        }
    }
    for (method, path) in &open {
        let response = call(method.clone(), path, None).send().await.unwrap();
        let what = format!("{method} {path} without a key");
        assert_eq!(response.status(), StatusCode::OK, "{what}");
        assert_rate_headers(&response, &what);
    }

    // The second key's bucket: 60 requests less what the sweep used, then 429.
    let mut refused = None;
    for _ in 0..80 {
        let response = call(reqwest::Method::GET, "/v2/nodes", Some(keys[1]))
            .send()
            .await
            .unwrap();
        if response.status() == StatusCode::TOO_MANY_REQUESTS {
            refused = Some(response);
            break;
        }
        assert_eq!(response.status(), StatusCode::OK);
    }
    let refused = refused.expect("the bucket runs out");
    assert_rate_headers(&refused, "429");
    assert_eq!(refused.headers()["x-ratelimit-remaining"], "0");
    let retry: u64 = refused.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=60).contains(&retry), "{retry}");
    let body: Value = refused.json().await.unwrap();
    assert_eq!(body["code"], "rate_limited");
    // The first key has its own bucket.
    let response = call(reqwest::Method::GET, "/v2/nodes", Some(keys[0]))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    serve.shutdown().await;
}

fn sha256_hex(text: &str) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(text.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The value of the sample of `name` with every label of `labels` in the
/// Prometheus text `scrape` (`None`: no such sample, or no valid text).
pub(crate) fn sample_value(scrape: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let scrape = prometheus_parse::Scrape::parse(scrape.lines().map(|l| Ok(l.to_owned()))).ok()?;
    sample(&scrape, name, labels).map(|s| value_of(&s.value))
}

fn value_of(value: &prometheus_parse::Value) -> f64 {
    match value {
        prometheus_parse::Value::Gauge(v)
        | prometheus_parse::Value::Counter(v)
        | prometheus_parse::Value::Untyped(v) => *v,
        _ => f64::NAN,
    }
}

/// The sample of `name` with every label of `labels`, from a scrape.
fn sample<'a>(
    scrape: &'a prometheus_parse::Scrape,
    name: &str,
    labels: &[(&str, &str)],
) -> Option<&'a prometheus_parse::Sample> {
    scrape.samples.iter().find(|s| {
        s.metric == name
            && labels
                .iter()
                .all(|(label, value)| s.labels.get(label) == Some(*value))
    })
}

#[tokio::test]
async fn prometheus_exposition_parses_and_counts_instances() {
    let serve = spawn_serve_with(|config| sim(config, 10)).await;
    let first = create_running(&serve.api).await;
    create_running(&serve.api).await;
    serve
        .api
        .post(&format!("/v2/instances/{first}/dormant"), "")
        .await;
    let response = reqwest::get(format!("{}/metrics", serve.api.base))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        response.headers()["content-type"],
        "text/plain; version=0.0.4; charset=utf-8"
    );
    let text = response.text().await.unwrap();
    let lines = text.lines().map(|l| Ok(l.to_owned()));
    let scrape = prometheus_parse::Scrape::parse(lines).expect("Prometheus text parses");
    let value = |name: &str, label: (&str, &str)| {
        sample(&scrape, name, &[label]).map(|s| value_of(&s.value))
    };
    assert_eq!(
        value("service_instances_total", ("status", "running")),
        Some(1.0)
    );
    assert_eq!(
        value("service_instances_total", ("status", "dormant")),
        Some(1.0)
    );
    assert_eq!(
        value("service_instances_total", ("status", "failed")),
        Some(0.0)
    );
    assert!(
        value("service_node_cpu_percent", ("node", "test-node")).is_some(),
        "{text}"
    );
    let histogram = |name: &str| {
        scrape
            .samples
            .iter()
            .find_map(|s| match (&s.value, s.metric == name) {
                (prometheus_parse::Value::Histogram(buckets), true) => {
                    Some(buckets.last().map_or(0.0, |b| b.count))
                }
                _ => None,
            })
    };
    assert_eq!(
        histogram("service_instance_create_duration_seconds"),
        Some(2.0),
        "{text}"
    );
    assert_eq!(
        histogram("service_instance_dormant_duration_seconds"),
        Some(1.0),
        "{text}"
    );
    let created = scrape.samples.iter().any(|s| {
        s.metric == "service_http_request_duration_seconds"
            && s.labels.get("route") == Some("/v2/instances")
            && s.labels.get("method") == Some("POST")
    });
    assert!(created, "request latency per route: {text}");
    assert!(text.contains("service_outbox_depth"), "{text}");
    wait_until(
        Duration::from_secs(30),
        "proxy deliveries counted",
        || async {
            let text = get_text(&format!("{}/metrics", serve.api.base)).await;
            Ok::<_, String>(
                text.lines()
                    .any(|l| {
                        l.starts_with("service_webhook_deliveries_total{target=\"proxy\"}")
                            && !l.ends_with(" 0")
                    })
                    .then_some(()),
            )
        },
    )
    .await
    .unwrap();
    serve.shutdown().await;
}

#[tokio::test]
async fn metrics_history_and_capacity_alerts() {
    let receiver = EventReceiver::start(SECRET).await;
    let url = receiver.url.clone();
    let serve = spawn_serve_with(move |config| {
        sim(config, 1);
        config.control.metrics.sample_interval_sec = 1.0;
        config.control.webhooks = vec![WebhookConfig {
            url,
            events: vec![
                "alert.raised".parse().unwrap(),
                "alert.cleared".parse().unwrap(),
            ],
            secret: SECRET.into(),
        }];
    })
    .await;
    let api = &serve.api;
    for (query, mention) in [
        ("period=2h", "period"),
        ("period=", "period"),
        ("window=1h", "window"),
    ] {
        let (status, body) = api.get(&format!("/v2/metrics?{query}")).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{query}: {body}");
        assert!(body["detail"].as_str().unwrap().contains(mention), "{body}");
    }
    let (status, body) = api.get("/v2/metrics?node_id=nowhere").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");

    // One slot: an instance fills the node and the cluster.
    let id = create_running(api).await;
    let alerts = wait_until(Duration::from_secs(30), "capacity alerts", || async {
        let (_, body) = api.get("/v2/alerts").await;
        let alerts = body["alerts"].as_array().cloned().unwrap_or_default();
        let capacity = alerts.iter().filter(|a| a["metric"] == "capacity").count();
        Ok::<_, String>((capacity >= 2).then_some(alerts))
    })
    .await
    .unwrap();
    let find = |scope: &str| {
        alerts
            .iter()
            .find(|a| a["scope"] == scope && a["metric"] == "capacity")
            .unwrap_or_else(|| panic!("no {scope} capacity alert in {alerts:?}"))
            .clone()
    };
    let node_alert = find("node");
    assert_eq!(node_alert["level"], "info");
    assert_eq!(node_alert["node_id"], "test-node");
    assert_eq!(find("cluster")["level"], "warning");

    api.delete(&format!("/v2/instances/{id}")).await;
    wait_until(Duration::from_secs(30), "alerts cleared", || async {
        let (_, body) = api.get("/v2/alerts").await;
        Ok::<_, String>((body["total"] == 0).then_some(()))
    })
    .await
    .unwrap();
    let (_, all) = api.get("/v2/alerts?state=cleared").await;
    assert!(all["total"].as_i64().unwrap() >= 2, "{all}");
    let (status, _) = api.get("/v2/alerts?state=sleeping").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    wait_until(Duration::from_secs(30), "alert webhooks", || async {
        let names: Vec<String> = receiver
            .events()
            .iter()
            .map(|e| e.payload["event"].as_str().unwrap().to_owned())
            .collect();
        let raised = names.iter().filter(|n| *n == "alert.raised").count();
        let cleared = names.iter().filter(|n| *n == "alert.cleared").count();
        Ok::<_, String>((raised >= 2 && cleared >= 2).then_some(()))
    })
    .await
    .unwrap();

    for (period, interval) in [("1h", "1m"), ("24h", "5m"), ("7d", "1h")] {
        let (status, body) = api.get(&format!("/v2/metrics?period={period}")).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let series = &body["timeseries"];
        assert_eq!(series["interval"], interval);
        let points = series["timestamps"].as_array().unwrap().len();
        assert!(points >= 1, "samples were taken: {body}");
        for member in ["cpu", "memory", "instances"] {
            assert_eq!(series[member].as_array().unwrap().len(), points, "{body}");
        }
        for member in [
            "total_instances",
            "running_instances",
            "dormant_instances",
            "failed_instances",
            "nodes_online",
            "nodes_offline",
            "avg_cpu_percent",
            "avg_memory_percent",
        ] {
            assert!(body["cluster"][member].is_number(), "{member}: {body}");
        }
        for member in ["avg_cpu_percent", "avg_memory_percent", "avg_disk_percent"] {
            assert!(body["resources"][member].is_number(), "{member}: {body}");
        }
        assert_eq!(body["cluster"]["nodes_online"], 1);
    }
    let (status, body) = api.get("/v2/metrics?node_id=test-node&period=1h").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(
        !body["timeseries"]["timestamps"]
            .as_array()
            .unwrap()
            .is_empty()
    );
    serve.shutdown().await;
}

#[tokio::test]
async fn an_instance_ends_at_its_max_duration_whatever_its_activity() {
    let receiver = EventReceiver::start(SECRET).await;
    let url = receiver.url.clone();
    let serve = flotilla_testkit::spawn_serve_with(|config| {
        sim(config, 10);
        config.control.webhooks = vec![WebhookConfig {
            url,
            events: Vec::new(),
            secret: SECRET.into(),
        }];
    })
    .await;
    let api = &serve.api;
    // Bad lifetimes are 400 naming the field.
    for bad in ["0", "-1", "525601", "\"ten\"", "1e400"] {
        let (status, body) = api
            .post(
                "/v2/instances",
                &format!(r#"{{"config": {{"max_duration_minutes": {bad}}}}}"#),
            )
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {body}");
        assert!(
            body["detail"]
                .as_str()
                .unwrap()
                .contains("max_duration_minutes"),
            "{bad}: {body}"
        );
    }
    let created = api
        .create(r#"{"config": {"max_duration_minutes": 0.02}}"#)
        .await;
    let id = created["id"].as_str().unwrap().to_owned();
    let kept = create_running(api).await;
    let (_, detail) = api.get(&format!("/v2/instances/{id}")).await;
    let created_at =
        chrono::DateTime::parse_from_rfc3339(detail["created_at"].as_str().unwrap()).unwrap();
    let expires_at =
        chrono::DateTime::parse_from_rfc3339(detail["expires_at"].as_str().unwrap()).unwrap();
    assert_eq!(
        (expires_at - created_at).num_milliseconds(),
        1200,
        "{detail}"
    );
    assert_eq!(detail["config"]["max_duration_minutes"], 0.02);
    let (_, other) = api.get(&format!("/v2/instances/{kept}")).await;
    assert!(
        other.get("expires_at").is_none(),
        "no limit, no expires_at: {other}"
    );

    wait_until(
        Duration::from_secs(60),
        "the instance to expire",
        || async {
            let (status, _) = api.get(&format!("/v2/instances/{id}")).await;
            Ok::<_, String>((status == StatusCode::NOT_FOUND).then_some(()))
        },
    )
    .await
    .unwrap();
    wait_until(Duration::from_secs(60), "its last events", || async {
        let got = per_instance(&receiver.events());
        let names = got.get(&id).cloned().unwrap_or_default();
        if names.ends_with(&["instance.expired".to_owned(), "instance.deleted".to_owned()]) {
            Ok(Some(()))
        } else {
            Err(format!("{names:?}"))
        }
    })
    .await
    .unwrap();
    let (status, _) = api.get(&format!("/v2/instances/{kept}")).await;
    assert_eq!(status, StatusCode::OK, "an instance without a limit stays");
    serve.shutdown().await;
}

/// Waiting creates now, from `/health`.
async fn queue_length(api: &Api) -> u64 {
    let (_, health) = api.get("/health").await;
    health["create_queue"]["waiting"].as_u64().unwrap_or(0)
}

async fn wait_for_queue(api: &Api, want: u64) {
    wait_until(
        Duration::from_secs(30),
        &format!("{want} waiting creates"),
        || async {
            let now = queue_length(api).await;
            Ok::<_, String>((now == want).then_some(()))
        },
    )
    .await
    .unwrap();
}

#[tokio::test]
async fn creates_wait_their_turn_for_room_in_order() {
    let serve = spawn_serve_with(|config| {
        sim(config, 1);
        config.control.scheduler.max_wait_sec = 120;
    })
    .await;
    let api = serve.api.clone();
    let (status, body) = api.post("/v2/instances?wait_sec=121", "{}").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(
        body["detail"].as_str().unwrap().contains("wait_sec"),
        "{body}"
    );
    let (status, _) = api.post("/v2/instances?wait_sec=-1", "{}").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);

    let first = create_running(&api).await;
    // Full: a short wait ends in 503, saying it waited.
    let (status, body) = api.post("/v2/instances?wait_sec=1", "{}").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["code"], "insufficient_capacity");

    let waiter =
        |api: Api| tokio::spawn(async move { api.post("/v2/instances?wait_sec=100", "{}").await });
    let one = waiter(api.clone());
    wait_for_queue(&api, 1).await;
    let two = waiter(api.clone());
    wait_for_queue(&api, 2).await;
    // A client that goes away leaves the queue.
    let gone = waiter(api.clone());
    wait_for_queue(&api, 3).await;
    gone.abort();
    wait_for_queue(&api, 2).await;
    let metrics = get_text(&format!("{}/metrics", api.base)).await;
    assert!(
        metrics.contains("service_create_queue_length 2"),
        "{metrics}"
    );

    // Room frees: the first waiter gets it, the second keeps waiting.
    api.delete_instance(&first).await;
    let (status, placed) = one.await.unwrap();
    assert_eq!(status, StatusCode::CREATED, "{placed}");
    wait_for_queue(&api, 1).await;
    assert!(!two.is_finished());
    let (status, _) = api
        .delete(&format!("/v2/instances/{}", placed["id"].as_str().unwrap()))
        .await;
    assert_eq!(status, StatusCode::OK);
    let (status, body) = two.await.unwrap();
    assert_eq!(status, StatusCode::CREATED, "{body}");
    wait_for_queue(&api, 0).await;
    let metrics = get_text(&format!("{}/metrics", api.base)).await;
    assert!(
        metrics.contains("service_create_queue_wait_seconds_count"),
        "{metrics}"
    );
    serve.shutdown().await;
}

/// The sweeps show in `/health` and `/metrics`; a sweep that fails (its
/// store table gone) makes the service degraded, naming the task, and its
/// error is shown only to a caller with a key; a good run clears it.
#[tokio::test]
async fn background_tasks_show_their_runs_and_failures_in_health_and_metrics() {
    let key = "flt_health_key";
    let serve = spawn_serve_with(move |config| {
        sim(config, 2);
        config.control.auth_enabled = true;
        config.control.api_keys = vec![format!("sha256:{}", sha256_hex(key))];
    })
    .await;
    let http = reqwest::Client::new();
    let health = |with_key: bool| {
        let mut request = http.get(format!("{}/health", serve.api.base));
        if with_key {
            request = request.bearer_auth(key);
        }
        async move { request.send().await.unwrap().json::<Value>().await.unwrap() }
    };
    let task = |health: &Value, name: &str| {
        health["background"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|task| task["name"] == name)
            .cloned()
    };
    wait_until(Duration::from_secs(30), "the idle sweep to run", || async {
        let health = health(false).await;
        Ok::<_, String>(task(&health, "idle sweep").filter(|t| t["runs"].as_u64() >= Some(1)))
    })
    .await
    .unwrap();
    let healthy = health(false).await;
    assert_eq!(healthy["status"], "healthy", "{healthy}");
    let sweep = task(&healthy, "idle sweep").unwrap();
    assert_eq!(sweep["failing"], false, "{sweep}");
    assert!(sweep["last_run_at"].is_string(), "{sweep}");

    // Take the leases table away from under the running service.
    let database = format!("sqlite://{}/flotilla.db", serve.data_dir.display());
    let mut store = <sqlx::SqliteConnection as sqlx::Connection>::connect(&database)
        .await
        .unwrap();
    sqlx::query("ALTER TABLE leases RENAME TO leases_away")
        .execute(&mut store)
        .await
        .unwrap();
    let failing = wait_until(Duration::from_secs(30), "the sweep to fail", || async {
        let health = health(true).await;
        let failing = task(&health, "idle sweep").is_some_and(|t| t["failing"] == true);
        Ok::<_, String>(failing.then_some(health))
    })
    .await
    .unwrap();
    assert_eq!(failing["status"], "degraded", "{failing}");
    let warnings = failing["warnings"].to_string();
    assert!(
        warnings.contains("background task idle sweep failed"),
        "{warnings}"
    );
    let sweep = task(&failing, "idle sweep").unwrap();
    assert!(
        sweep["last_error"].as_str().unwrap().contains("leases"),
        "{sweep}"
    );
    assert!(sweep["failures"].as_u64() >= Some(1), "{sweep}");
    let anonymous = health(false).await;
    let sweep = task(&anonymous, "idle sweep").unwrap();
    assert!(
        sweep.get("last_error").is_none(),
        "no error text without a key: {sweep}"
    );
    assert!(sweep["last_error_at"].is_string(), "{sweep}");

    let metrics = http
        .get(format!("{}/metrics", serve.api.base))
        .bearer_auth(key)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let scrape =
        prometheus_parse::Scrape::parse(metrics.lines().map(|l| Ok(l.to_owned()))).unwrap();
    let failed = sample(
        &scrape,
        "service_background_runs_total",
        &[("task", "idle sweep"), ("outcome", "failed")],
    );
    assert!(
        matches!(failed.map(|s| &s.value), Some(prometheus_parse::Value::Counter(n)) if *n >= 1.0),
        "{metrics}"
    );

    // The table back: the next run succeeds and the warning goes.
    sqlx::query("ALTER TABLE leases_away RENAME TO leases")
        .execute(&mut store)
        .await
        .unwrap();
    wait_until(Duration::from_secs(30), "the sweep to recover", || async {
        let health = health(true).await;
        let recovered = task(&health, "idle sweep").is_some_and(|t| t["failing"] == false);
        Ok::<_, String>(recovered.then_some(()))
    })
    .await
    .unwrap();
    serve.shutdown().await;
}
