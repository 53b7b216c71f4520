//! The event proxy over real HTTP: stream format and headers, replay,
//! keepalive, every error row of the spec, authentication through a real local
//! webhook (cache, TTL, LRU, single flight, retries, circuit breaker, token
//! expiry, permissions), backpressure, CORS, limits, publishing.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use flotilla_api_types::clock::{Clock, ManualClock, SystemClock};
use flotilla_event_proxy::Proxy;
use flotilla_event_proxy::config::BackpressurePolicy;
use flotilla_testkit::{
    SseClient, WebhookFake, chrono_like_now, get_json, get_text, jwt, spawn_proxy,
    spawn_proxy_with_clock, wait_until,
};

const WAIT: Duration = Duration::from_secs(20);

/// The publisher key every test proxy accepts (publishers with a key are not
/// subject to the per-IP limit).
const PUBLISHER_KEY: &str = "test-publisher";

async fn publish(proxy: &Proxy, topic: &str, body: Value) -> Value {
    let response = reqwest::Client::new()
        .post(format!("{}/publish/{topic}", proxy.url()))
        .bearer_auth(PUBLISHER_KEY)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200, "publish to {topic}");
    response.json().await.unwrap()
}

async fn metrics(proxy: &Proxy) -> String {
    get_text(&format!("{}/metrics", proxy.url())).await
}

fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no metric {name}"))
}

fn assert_refused(client: &SseClient, status: u16, body: &str) {
    assert_eq!(client.status, status, "{}", client.body);
    assert_eq!(client.body, body);
    assert!(
        client
            .header("content-type")
            .unwrap()
            .starts_with("text/plain"),
        "{:?}",
        client.headers
    );
}

#[tokio::test]
async fn streams_have_the_spec_headers_framing_and_keepalive() {
    let proxy = spawn_proxy(|c| c.http.keepalive_interval_sec = 1).await;
    let mut client = SseClient::connect(&proxy.url(), "/events/news", &[])
        .await
        .unwrap();
    assert_eq!(client.status, 200);
    for (name, value) in [
        ("content-type", "text/event-stream"),
        ("cache-control", "no-cache"),
        ("connection", "keep-alive"),
        ("access-control-allow-origin", "*"),
        ("x-accel-buffering", "no"),
    ] {
        assert_eq!(client.header(name), Some(value), "{name}");
    }
    let published = publish(
        &proxy,
        "news",
        json!({"event": "update", "data": "line one\nline two", "retry": 2500}),
    )
    .await;
    let event = client.next_event(WAIT).await.unwrap();
    assert_eq!(event.id.as_deref(), published["id"].as_str());
    assert_eq!(event.event.as_deref(), Some("update"));
    assert_eq!(event.data.as_deref(), Some("line one\nline two"));
    assert_eq!(event.retry.as_deref(), Some("2500"));
    publish(&proxy, "news", json!({"data": {"n": 1}})).await;
    let event = client.next_event(WAIT).await.unwrap();
    assert_eq!(
        event.event, None,
        "no event line means the default type message"
    );
    assert_eq!(event.data.as_deref(), Some(r#"{"n":1}"#));
    let keepalive = client.next(WAIT).await.unwrap().unwrap();
    assert_eq!(keepalive.comment.as_deref(), Some("keepalive"));
    proxy.shutdown().await;
}

#[tokio::test]
async fn last_event_id_replays_and_says_when_events_were_missed() {
    let proxy = spawn_proxy(|c| c.history.size_per_topic = 3).await;
    let mut ids = Vec::new();
    for n in 0..5 {
        ids.push(
            publish(&proxy, "t", json!({"data": n})).await["id"]
                .as_str()
                .unwrap()
                .to_owned(),
        );
    }
    // History keeps the last three (ids[2..5]).
    let mut client = SseClient::connect(&proxy.url(), "/events/t", &[("Last-Event-ID", &ids[2])])
        .await
        .unwrap();
    assert_eq!(
        client.next_event(WAIT).await.unwrap().id.as_ref(),
        Some(&ids[3])
    );
    assert_eq!(
        client.next_event(WAIT).await.unwrap().id.as_ref(),
        Some(&ids[4])
    );
    let mut polyfill = SseClient::connect(
        &proxy.url(),
        &format!("/events/t?last_event_id={}", ids[3]),
        &[],
    )
    .await
    .unwrap();
    assert_eq!(
        polyfill.next_event(WAIT).await.unwrap().id.as_ref(),
        Some(&ids[4])
    );
    let mut late = SseClient::connect(&proxy.url(), "/events/t", &[("Last-Event-ID", &ids[0])])
        .await
        .unwrap();
    let missed = late.next_event(WAIT).await.unwrap();
    assert_eq!(missed.event.as_deref(), Some("missed"));
    let detail: Value = serde_json::from_str(missed.data.as_deref().unwrap()).unwrap();
    assert_eq!(detail["last_event_id"], ids[0]);
    assert_eq!(detail["oldest_available"], ids[2]);
    assert_eq!(
        late.next_event(WAIT).await.unwrap().id.as_ref(),
        Some(&ids[2])
    );
    let bad = SseClient::connect(&proxy.url(), "/events/t", &[("Last-Event-ID", "yesterday")])
        .await
        .unwrap();
    assert_eq!(bad.status, 400);
    let bad_topic = SseClient::connect(&proxy.url(), "/events/a%2Fb", &[])
        .await
        .unwrap();
    assert_eq!(bad_topic.status, 400);
    proxy.shutdown().await;
}

async fn auth_proxy(
    webhook: &WebhookFake,
    adjust: impl FnOnce(&mut flotilla_event_proxy::config::ProxyConfig),
) -> Proxy {
    auth_proxy_with_clock(webhook, Arc::new(SystemClock), adjust).await
}

/// The same, on `clock` (tests move a `ManualClock` on instead of sleeping).
async fn auth_proxy_with_clock(
    webhook: &WebhookFake,
    clock: Arc<dyn Clock>,
    adjust: impl FnOnce(&mut flotilla_event_proxy::config::ProxyConfig),
) -> Proxy {
    let url = webhook.url.clone();
    spawn_proxy_with_clock(clock, move |c| {
        c.jwt_verifier.webhook_url = url;
        c.jwt_verifier.require_authentication = true;
        adjust(c);
    })
    .await
}

#[tokio::test]
async fn authentication_answers_per_the_spec() {
    let webhook = WebhookFake::start(std::sync::Arc::new(|call: &flotilla_testkit::WebhookCall, _| {
        let expires = chrono_like_now() + 3600;
        match call.jwt.as_str() {
            "invalid" => (200, json!({"valid": false, "user_id": null, "expires_at": null}), Duration::ZERO),
            "rejected" => (401, json!({"error": "bad token"}), Duration::ZERO),
            "forbidden" => (200, json!({"valid": true, "user_id": "u", "expires_at": expires, "reason": "forbidden"}), Duration::ZERO),
            _ => (200, json!({"valid": true, "user_id": "u", "expires_at": expires}), Duration::ZERO),
        }
    }))
    .await;
    let proxy = auth_proxy(&webhook, |_| {}).await;
    let url = proxy.url();
    assert_refused(
        &SseClient::connect(&url, "/events/news", &[]).await.unwrap(),
        401,
        "Authentication required",
    );
    assert_refused(
        &SseClient::connect(&url, "/events/news", &[("Authorization", "Basic dXNlcg==")])
            .await
            .unwrap(),
        401,
        "Authentication required",
    );
    for token in ["invalid", "rejected"] {
        let client = SseClient::with_bearer(&url, "/events/news", token)
            .await
            .unwrap();
        assert_refused(&client, 401, "Authentication required");
    }
    let forbidden = SseClient::with_bearer(&url, "/events/news", "forbidden")
        .await
        .unwrap();
    assert_refused(&forbidden, 403, "Access denied to topic");
    let other_topic_only =
        jwt(json!({"sub": "u", "exp": chrono_like_now() + 3600, "permissions": ["sports:read"]}));
    let client = SseClient::with_bearer(&url, "/events/news", &other_topic_only)
        .await
        .unwrap();
    assert_refused(&client, 403, "Access denied to topic");
    for permissions in [json!(["news:read"]), json!(["*:read"])] {
        let token =
            jwt(json!({"sub": "u", "exp": chrono_like_now() + 3600, "permissions": permissions}));
        let client = SseClient::with_bearer(&url, "/events/news", &token)
            .await
            .unwrap();
        assert_eq!(client.status, 200, "{}", client.body);
    }
    let plain = SseClient::with_bearer(&url, "/events/news", "good")
        .await
        .unwrap();
    assert_eq!(plain.status, 200);
    // EventSource cannot set headers: ?token= works where Authorization is absent.
    let query = SseClient::connect(&url, "/events/news?token=good", &[])
        .await
        .unwrap();
    assert_eq!(query.status, 200);

    let calls = webhook.calls.lock().unwrap().clone();
    let expected_topic = flotilla_event_proxy::topics::topic_uuid_hex("news");
    assert!(
        calls.iter().all(|(_, c)| c.topic == expected_topic),
        "the topic goes as 32 hex: {calls:?}"
    );
    assert_eq!(expected_topic.len(), 32);
    let text = metrics(&proxy).await;
    assert!(metric(&text, "auth_failures") >= 4.0);
    assert!(
        metric(&text, "auth_cache_hits") >= 1.0,
        "?token=good was a cache hit"
    );
    proxy.shutdown().await;
}

#[tokio::test]
async fn verifications_are_cached_per_token_and_topic_with_ttl_and_lru() {
    let webhook = WebhookFake::start(WebhookFake::accept_all()).await;
    let clock = Arc::new(ManualClock::new(chrono::Utc::now()));
    let proxy = auth_proxy_with_clock(&webhook, clock.clone(), |c| {
        c.jwt_verifier.cache_ttl_sec = 1;
        c.jwt_verifier.cache_max_size = 2;
    })
    .await;
    let url = proxy.url();
    let open = |token: &str, topic: &str| {
        let (url, token, topic) = (url.clone(), token.to_owned(), topic.to_owned());
        async move {
            let client = SseClient::with_bearer(&url, &format!("/events/{topic}"), &token)
                .await
                .unwrap();
            assert_eq!(client.status, 200, "{}", client.body);
        }
    };
    open("a", "news").await;
    open("a", "news").await;
    assert_eq!(
        webhook.call_count(),
        1,
        "the second subscription was a cache hit"
    );
    open("a", "sports").await;
    assert_eq!(
        webhook.call_count(),
        2,
        "a result for one topic never authorises another"
    );
    // LRU of two: (a,news) (a,sports); touch (a,news); add (b,news) → (a,sports) evicted.
    open("a", "news").await;
    open("b", "news").await;
    assert_eq!(webhook.call_count(), 3);
    open("a", "news").await;
    assert_eq!(webhook.call_count(), 3, "recently used: still cached");
    open("a", "sports").await;
    assert_eq!(webhook.call_count(), 4, "least recently used: evicted");
    // TTL of one second.
    let before = webhook.call_count();
    clock.advance(chrono::Duration::milliseconds(999));
    open("a", "sports").await;
    assert_eq!(webhook.call_count(), before, "still cached");
    clock.advance(chrono::Duration::milliseconds(2));
    open("a", "sports").await;
    assert_eq!(
        webhook.call_count(),
        before + 1,
        "expired after cache_ttl_sec"
    );
    proxy.shutdown().await;
}

#[tokio::test]
async fn concurrent_misses_make_one_webhook_call() {
    let webhook = WebhookFake::start(WebhookFake::granting(3600, Duration::from_millis(300))).await;
    let proxy = auth_proxy(&webhook, |_| {}).await;
    let url = proxy.url();
    let clients = futures_util::future::join_all((0..8).map(|_| {
        let url = url.clone();
        async move {
            SseClient::with_bearer(&url, "/events/news", "same")
                .await
                .unwrap()
        }
    }))
    .await;
    assert!(clients.iter().all(|c| c.status == 200));
    assert_eq!(webhook.call_count(), 1);
    proxy.shutdown().await;
}

#[tokio::test]
async fn failures_are_retried_with_growing_waits() {
    // Fails twice with 500, then answers.
    let webhook = WebhookFake::start(std::sync::Arc::new(
        |_: &flotilla_testkit::WebhookCall, index| {
            if index < 2 {
                (500, json!({"error": "down"}), Duration::ZERO)
            } else {
                (
                    200,
                    json!({"valid": true, "user_id": "u", "expires_at": chrono_like_now() + 3600}),
                    Duration::ZERO,
                )
            }
        },
    ))
    .await;
    let proxy = auth_proxy(&webhook, |c| c.jwt_verifier.retry_attempts = 3).await;
    let client = SseClient::with_bearer(&proxy.url(), "/events/news", "t")
        .await
        .unwrap();
    assert_eq!(client.status, 200, "{}", client.body);
    let calls = webhook.calls.lock().unwrap().clone();
    assert_eq!(calls.len(), 3);
    let first_wait = calls[1].0 - calls[0].0;
    let second_wait = calls[2].0 - calls[1].0;
    assert!(first_wait >= Duration::from_millis(100), "{first_wait:?}");
    assert!(second_wait >= Duration::from_millis(200), "{second_wait:?}");
    proxy.shutdown().await;
}

#[tokio::test]
async fn the_breaker_opens_half_opens_and_closes_and_cached_tokens_keep_working() {
    let webhook = WebhookFake::start(WebhookFake::accept_all()).await;
    let clock = Arc::new(ManualClock::new(chrono::Utc::now()));
    let proxy = auth_proxy_with_clock(&webhook, clock.clone(), |c| {
        c.jwt_verifier.retry_attempts = 0;
        c.jwt_verifier.circuit_breaker_threshold = 2;
        c.jwt_verifier.circuit_breaker_timeout_sec = 1;
    })
    .await;
    let url = proxy.url();
    let subscribe = |token: &'static str| {
        let url = url.clone();
        async move {
            SseClient::with_bearer(&url, "/events/news", token)
                .await
                .unwrap()
        }
    };
    assert_eq!(subscribe("cached").await.status, 200);
    webhook.set(std::sync::Arc::new(
        |_: &flotilla_testkit::WebhookCall, _| (503, json!({}), Duration::ZERO),
    ));
    for token in ["x1", "x2"] {
        assert_eq!(subscribe(token).await.status, 503, "webhook failures");
    }
    let health: Value = get_json(&format!("{url}/health")).await;
    assert_eq!(health["circuit_breaker"]["state"], "open");
    assert_eq!(health["circuit_breaker"]["consecutive_failures"], 2);
    assert!(health["circuit_breaker"]["opened_at"].is_string());
    let calls_when_open = webhook.call_count();
    let refused = subscribe("x3").await;
    assert_eq!(refused.status, 503);
    assert_eq!(refused.body, "Authentication unavailable");
    assert!(refused.header("retry-after").is_some());
    assert_eq!(
        webhook.call_count(),
        calls_when_open,
        "open: the webhook is not called"
    );
    assert_eq!(
        subscribe("cached").await.status,
        200,
        "cached verifications keep working"
    );
    assert_eq!(
        metric(&metrics(&proxy).await, "connections_total"),
        2.0,
        "streams opened count, refused attempts do not"
    );

    // Half-open after the timeout (reported before any request tries it): a
    // failing trial opens it again…
    clock.advance(chrono::Duration::milliseconds(1100));
    let health: Value = get_json(&format!("{url}/health")).await;
    assert_eq!(health["circuit_breaker"]["state"], "half-open");
    assert_eq!(subscribe("x4").await.status, 503);
    assert_eq!(webhook.call_count(), calls_when_open + 1, "one trial call");
    let health: Value = get_json(&format!("{url}/health")).await;
    assert_eq!(health["circuit_breaker"]["state"], "open");
    // …a successful trial closes it.
    webhook.set(WebhookFake::accept_all());
    clock.advance(chrono::Duration::milliseconds(1100));
    assert_eq!(subscribe("x5").await.status, 200);
    let health: Value = get_json(&format!("{url}/health")).await;
    assert_eq!(health["circuit_breaker"]["state"], "closed");
    proxy.shutdown().await;
}

#[tokio::test]
async fn a_stream_closes_when_its_token_expires() {
    let webhook = WebhookFake::start(WebhookFake::granting(2, Duration::ZERO)).await;
    let proxy = auth_proxy(&webhook, |_| {}).await;
    let mut client = SseClient::with_bearer(&proxy.url(), "/events/news", "short")
        .await
        .unwrap();
    assert_eq!(client.status, 200);
    let last = client.next_event(Duration::from_secs(10)).await.unwrap();
    assert_eq!(last.event.as_deref(), Some("expired"));
    assert!(
        client.next(Duration::from_secs(5)).await.unwrap().is_none(),
        "then the stream ends"
    );
    proxy.shutdown().await;
}

/// A subscriber that connects and never reads; publishes until its queue
/// overflows (64 KiB events fill the socket buffers first).
async fn overflow(policy: BackpressurePolicy) -> (Proxy, SseClient, SseClient, usize) {
    let proxy = spawn_proxy(|c| {
        c.http.max_message_queue_size = 4;
        c.http.backpressure_policy = policy;
        c.http.block_timeout_ms = 200;
    })
    .await;
    let stalled = SseClient::connect(&proxy.url(), "/events/flood", &[])
        .await
        .unwrap();
    let mut healthy = SseClient::connect(&proxy.url(), "/events/flood", &[])
        .await
        .unwrap();
    let big = "x".repeat(64 * 1024);
    let total = 200;
    let reader = tokio::spawn(async move {
        let mut received = 0;
        while received < total {
            if healthy.next_event(WAIT).await.is_err() {
                break;
            }
            received += 1;
        }
        (healthy, received)
    });
    for n in 0..total {
        publish(&proxy, "flood", json!({"data": format!("{n}:{big}")})).await;
    }
    let (healthy, received) = reader.await.unwrap();
    (proxy, stalled, healthy, received)
}

#[tokio::test]
async fn drop_oldest_and_drop_newest_never_hold_up_other_subscribers() {
    for policy in [
        BackpressurePolicy::DropOldest,
        BackpressurePolicy::DropNewest,
    ] {
        let (proxy, _stalled, _healthy, received) = overflow(policy).await;
        assert_eq!(
            received, 200,
            "{policy:?}: the reading subscriber got everything"
        );
        assert!(
            metric(&metrics(&proxy).await, "messages_dropped") > 0.0,
            "{policy:?}: drops are counted"
        );
        proxy.shutdown().await;
    }
}

#[tokio::test]
async fn block_cuts_a_stalled_subscriber_off_with_a_final_event() {
    let (proxy, mut stalled, _healthy, received) = overflow(BackpressurePolicy::Block).await;
    assert_eq!(received, 200, "the reading subscriber got everything");
    let text = metrics(&proxy).await;
    assert!(metric(&text, "subscribers_cut_off") >= 1.0);
    // Reading now: what was buffered, then the overflow event, then the end.
    let mut last = None;
    while let Ok(Some(item)) = stalled.next(WAIT).await {
        last = Some(item);
    }
    assert_eq!(last.and_then(|e| e.event).as_deref(), Some("overflow"));
    proxy.shutdown().await;
}

#[tokio::test]
async fn cors_preflight_and_allowed_origins() {
    let proxy = spawn_proxy(|_| {}).await;
    let http = reqwest::Client::new();
    let response = http
        .request(
            reqwest::Method::OPTIONS,
            format!("{}/events/news", proxy.url()),
        )
        .header("Origin", "https://app.example")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 204);
    let headers = response.headers();
    assert_eq!(headers["access-control-allow-origin"], "*");
    assert_eq!(headers["access-control-allow-methods"], "GET, OPTIONS");
    assert_eq!(
        headers["access-control-allow-headers"],
        "Authorization, Content-Type, Last-Event-ID"
    );
    proxy.shutdown().await;

    let proxy =
        spawn_proxy(|c| c.http.cors_allowed_origins = vec!["https://app.example".into()]).await;
    for (origin, allowed) in [
        ("https://app.example", true),
        ("https://evil.example", false),
    ] {
        let response = http
            .request(
                reqwest::Method::OPTIONS,
                format!("{}/anything", proxy.url()),
            )
            .header("Origin", origin)
            .send()
            .await
            .unwrap();
        assert_eq!(
            response
                .headers()
                .get("access-control-allow-origin")
                .map(|v| v.to_str().unwrap()),
            allowed.then_some(origin),
            "{origin}"
        );
        let stream = SseClient::connect(&proxy.url(), "/events/news", &[("Origin", origin)])
            .await
            .unwrap();
        // Streams follow the list too: the origin echoed with `Vary: Origin`,
        // or no `Access-Control-Allow-Origin` at all (never `*`).
        assert_eq!(
            stream.header("access-control-allow-origin"),
            allowed.then_some(origin),
            "stream from {origin}"
        );
        assert_eq!(
            stream.header("vary"),
            allowed.then_some("Origin"),
            "stream from {origin}"
        );
    }
    proxy.shutdown().await;
}

#[tokio::test]
async fn connection_cap_and_per_ip_rate_limit() {
    let proxy = spawn_proxy(|c| c.http.max_connections = 2).await;
    let url = proxy.url();
    let _one = SseClient::connect(&url, "/events/a", &[]).await.unwrap();
    let _two = SseClient::connect(&url, "/events/a", &[]).await.unwrap();
    let third = SseClient::connect(&url, "/events/a", &[]).await.unwrap();
    assert_refused(&third, 503, "Too many connections");
    assert_eq!(third.header("retry-after"), Some("30"));
    drop(_one);
    wait_until(WAIT, "a slot to free up", || async {
        let again = SseClient::connect(&url, "/events/a", &[]).await.unwrap();
        if again.status == 200 {
            Ok(Some(()))
        } else {
            Err(again.status.to_string())
        }
    })
    .await
    .unwrap();
    proxy.shutdown().await;

    let proxy = spawn_proxy(|c| {
        c.rate_limit.rate_limit_per_ip = 5;
        c.rate_limit.rate_limit_window_sec = 45;
        c.rate_limit.trusted_proxies = vec!["127.0.0.1".into()];
    })
    .await;
    let http = reqwest::Client::new();
    let health = |forwarded: Option<&'static str>| {
        let mut request = http.get(format!("{}/health", proxy.url()));
        if let Some(ip) = forwarded {
            request = request.header("X-Forwarded-For", ip);
        }
        request.send()
    };
    for _ in 0..5 {
        assert_eq!(health(None).await.unwrap().status(), 200);
    }
    let limited = health(None).await.unwrap();
    assert_eq!(limited.status(), 429);
    assert_eq!(
        limited.headers()["retry-after"],
        "45",
        "Retry-After follows rate_limit_window_sec"
    );
    assert_eq!(limited.text().await.unwrap(), "Rate limit exceeded");
    let stream = SseClient::connect(&proxy.url(), "/events/a", &[])
        .await
        .unwrap();
    assert_refused(&stream, 429, "Rate limit exceeded");
    // Behind a trusted proxy, each forwarded client has its own bucket.
    assert_eq!(health(Some("198.51.100.7")).await.unwrap().status(), 200);
    proxy.shutdown().await;
}

#[tokio::test]
async fn publishing_validates_bodies_and_checks_publishers() {
    let webhook = WebhookFake::start(WebhookFake::accept_all()).await;
    let proxy = auth_proxy(&webhook, |c| {
        c.publisher.api_keys = vec!["pub-key".into()];
        c.publisher.max_body_bytes = 1024;
    })
    .await;
    let http = reqwest::Client::new();
    let post = |path: &str, token: Option<&str>, body: String| {
        let mut request = http.post(format!("{}{path}", proxy.url())).body(body);
        if let Some(token) = token {
            request = request.header("Authorization", format!("Bearer {token}"));
        }
        request.send()
    };
    let ok = post(
        "/publish/news",
        Some("pub-key"),
        json!({"data": "hi"}).to_string(),
    )
    .await
    .unwrap();
    assert_eq!(ok.status(), 200);
    for (body, why) in [
        ("".to_owned(), "empty"),
        ("{oops".to_owned(), "malformed"),
        (
            json!({"data": "x", "colour": "red"}).to_string(),
            "unknown field",
        ),
        (
            json!({"event": "a\nb", "data": "x"}).to_string(),
            "event on two lines",
        ),
        (json!({"event": "x"}).to_string(), "no data"),
    ] {
        let response = post("/publish/news", Some("pub-key"), body).await.unwrap();
        assert_eq!(response.status(), 400, "{why}");
        assert!(
            response.headers()["content-type"]
                .to_str()
                .unwrap()
                .starts_with("text/plain")
        );
    }
    // Size and credentials: (token, body, expected status).
    let reader =
        jwt(json!({"sub": "u", "exp": chrono_like_now() + 3600, "permissions": ["news:read"]}));
    let writer =
        jwt(json!({"sub": "u", "exp": chrono_like_now() + 3600, "permissions": ["news:write"]}));
    let small = json!({"data": "x"}).to_string();
    for (token, body, expected) in [
        (
            Some("pub-key"),
            json!({"data": "x".repeat(2000)}).to_string(),
            413,
        ),
        (None, small.clone(), 401),
        (Some(reader.as_str()), small.clone(), 403),
        (Some(writer.as_str()), small.clone(), 200),
    ] {
        let response = post("/publish/news", token, body).await.unwrap();
        assert_eq!(response.status(), expected, "token {token:?}");
    }

    let mut news = SseClient::with_bearer(&proxy.url(), "/events/news", "sub")
        .await
        .unwrap();
    let batch = json!({"events": [
        {"topic": "news", "data": "one"},
        {"topic": "news", "event": "second", "data": "two", "id": "client-2"},
        {"topic": "sports", "data": "three"},
    ]});
    let response = post("/publish", Some("pub-key"), batch.to_string())
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let ids: Value = response.json().await.unwrap();
    assert_eq!(ids["ids"].as_array().unwrap().len(), 3);
    assert_eq!(
        news.next_event(WAIT).await.unwrap().data.as_deref(),
        Some("one")
    );
    assert_eq!(
        news.next_event(WAIT).await.unwrap().event.as_deref(),
        Some("second")
    );
    let repeat = json!({"events": [{"topic": "news", "data": "two again", "id": "client-2"}]});
    let again: Value = post("/publish", Some("pub-key"), repeat.to_string())
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        again["ids"][0], ids["ids"][1],
        "a repeated publisher id is published once"
    );
    let bad_batch =
        json!({"events": [{"topic": "news", "data": "ok"}, {"topic": "bad topic!", "data": "x"}]});
    assert_eq!(
        post("/publish", Some("pub-key"), bad_batch.to_string())
            .await
            .unwrap()
            .status(),
        400
    );
    proxy.shutdown().await;
}

#[tokio::test]
async fn health_metrics_and_graceful_shutdown() {
    let proxy = spawn_proxy(|_| {}).await;
    let mut client = SseClient::connect(&proxy.url(), "/events/news", &[])
        .await
        .unwrap();
    publish(&proxy, "news", json!({"data": "x"})).await;
    client.next_event(WAIT).await.unwrap();
    let health: Value = get_json(&format!("{}/health", proxy.url())).await;
    assert_eq!(health["status"], "healthy");
    assert_eq!(health["connections"], 1);
    assert!(health["uptime_seconds"].is_number());
    assert_eq!(health["circuit_breaker"]["state"], "closed");
    let text = metrics(&proxy).await;
    for name in [
        "connections_active",
        "connections_total",
        "messages_sent",
        "bytes_sent",
        "auth_cache_hits",
        "auth_failures",
        "peers_connected",
        "topics_active",
        "sync_lag",
        "rate_limited_requests",
    ] {
        metric(&text, name);
    }
    assert_eq!(metric(&text, "messages_sent"), 1.0);
    assert_eq!(metric(&text, "topics_active"), 1.0);
    assert!(text.contains("publish_to_write_seconds_bucket"));
    assert!(text.contains("webhook_call_seconds_bucket"));
    let missing = reqwest::get(format!("{}/nothing", proxy.url()))
        .await
        .unwrap();
    assert_eq!(missing.status(), 404);

    let shutdown = tokio::spawn(proxy.shutdown());
    let last = client.next(WAIT).await.unwrap().unwrap();
    assert!(
        last.retry.is_some(),
        "a retry hint before the stream closes: {last:?}"
    );
    assert!(client.next(WAIT).await.unwrap().is_none());
    shutdown.await.unwrap();
}

#[tokio::test]
async fn revocation_evicts_grants_and_ends_matching_streams() {
    // accept_all: user "u-<token>", valid for a day.
    let webhook = WebhookFake::start(WebhookFake::accept_all()).await;
    let proxy = auth_proxy(&webhook, |_| {}).await;
    let url = proxy.url();
    let open = |token: &'static str, topic: &'static str| {
        let url = url.clone();
        async move {
            let bearer = format!("Bearer {token}");
            let client = SseClient::connect(
                &url,
                &format!("/events/{topic}"),
                &[("Authorization", bearer.as_str())],
            )
            .await
            .unwrap();
            assert_eq!(client.status, 200, "{}", client.body);
            client
        }
    };
    let mut alice_news = open("alice", "news").await;
    let mut alice_sport = open("alice", "sport").await;
    let mut bob_news = open("bob", "news").await;
    let calls_before = webhook.call_count();

    let admin = reqwest::Client::new();
    let revoke = |body: Value, key: Option<&'static str>| {
        let mut request = admin.post(format!("{url}/admin/revoke")).json(&body);
        if let Some(key) = key {
            request = request.bearer_auth(key);
        }
        request.send()
    };
    let refused = revoke(json!({"user_id": "u-alice"}), None).await.unwrap();
    assert_eq!(refused.status(), 401);
    for bad in [
        json!({}),
        json!({"user_id": "a", "token_sha256": "00"}),
        json!({"token_sha256": "zz"}),
        json!({"who": "a"}),
    ] {
        let response = revoke(bad.clone(), Some(PUBLISHER_KEY)).await.unwrap();
        assert_eq!(response.status(), 400, "{bad}");
    }

    let answer: Value = revoke(json!({"user_id": "u-alice"}), Some(PUBLISHER_KEY))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(answer, json!({"evicted": 2, "closed": 2}));
    for stream in [&mut alice_news, &mut alice_sport] {
        let last = stream.next_event(WAIT).await.unwrap();
        assert_eq!(last.event.as_deref(), Some("revoked"));
        assert!(
            stream.next(WAIT).await.unwrap().is_none(),
            "the stream ends"
        );
    }
    // Bob's stream lives on.
    publish(&proxy, "news", json!({"data": "still here"})).await;
    let event = bob_news.next_event(WAIT).await.unwrap();
    assert_eq!(event.data.as_deref(), Some("still here"));
    // Alice's next subscription asks the webhook again (the grant is gone).
    let _again = open("alice", "news").await;
    assert_eq!(webhook.call_count(), calls_before + 1);

    // By token: the SHA-256 of the token as presented.
    use sha2::Digest;
    let bob_hash: String = sha2::Sha256::digest(b"bob")
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let answer: Value = revoke(json!({"token_sha256": bob_hash}), Some(PUBLISHER_KEY))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(answer, json!({"evicted": 1, "closed": 1}));
    let last = bob_news.next_event(WAIT).await.unwrap();
    assert_eq!(last.event.as_deref(), Some("revoked"));
    proxy.shutdown().await;
}

/// Sends raw bytes and reads the answer until the proxy closes the connection.
async fn raw_exchange(proxy: &Proxy, bytes: &[u8]) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    stream.write_all(bytes).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), stream.read_to_end(&mut answer))
        .await
        .expect("the proxy closes the connection")
        .unwrap();
    String::from_utf8_lossy(&answer).into_owned()
}

#[tokio::test]
async fn smuggling_shapes_are_refused_and_the_connection_closed() {
    let proxy = spawn_proxy(|_| {}).await;
    // Were the body read by Content-Length, the bytes after it would be a
    // second request (to /health); read as chunked, it is one request.
    let smuggled = "POST /publish/news HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer test-publisher\r\n\
        Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /health HTTP/1.1\r\nHost: x\r\n\r\n";
    let answer = raw_exchange(&proxy, smuggled.as_bytes()).await;
    assert!(answer.starts_with("HTTP/1.1 400 "), "{answer}");
    assert_eq!(
        answer.matches("HTTP/1.1").count(),
        1,
        "one answer, then closed: {answer}"
    );
    for head in [
        "GET /health HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\nxx",
        "GET /health HTTP/1.1\r\nX-A: 1\r\n folded\r\n\r\n",
        "GET /health HTTP/1.1\nHost: x\n\n",
    ] {
        let answer = raw_exchange(&proxy, head.as_bytes()).await;
        assert!(answer.starts_with("HTTP/1.1 400 "), "{head:?}: {answer}");
    }
    proxy.shutdown().await;
}

#[tokio::test]
async fn a_head_that_trickles_in_is_cut_off() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let proxy = spawn_proxy(|c| c.http.connection_timeout_sec = 2).await;
    let stream = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    let (mut reader, mut writer) = stream.into_split();
    // One byte of a never-ending header every 200 ms.
    let trickle = tokio::spawn(async move {
        writer
            .write_all(b"GET /health HTTP/1.1\r\nX-Slow: ")
            .await
            .ok();
        loop {
            if writer.write_all(b"a").await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), reader.read_to_end(&mut answer))
        .await
        .expect("the proxy gives up on the head")
        .ok();
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 408 "), "{answer}");
    trickle.abort();
    proxy.shutdown().await;
}
