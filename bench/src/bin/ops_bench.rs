//! Benchmarks of the control plane's operational half (issue 7).
//!
//!   ops_bench webhooks [--events 20000] [--concurrency 16]
//!     Fills the outbox with `--events` instance.created events (each for its
//!     own instance), then starts the delivery task and times until a local
//!     receiver (axum, answers 204) has them all: events/s. Then 2,000 events
//!     of one instance (each waits for the one before it). Baseline in the same
//!     run: the same number of plain POSTs of the same bodies with the same
//!     concurrency, no store, no signing. Signing: time per signature of a
//!     typical payload.
//!
//!   ops_bench middleware [--requests 200000]
//!     The router in-process (no sockets), `GET /v2/instances/{id}` of one
//!     stored instance: p50/p99 per request with auth and rate limits off, with
//!     auth on, and with auth and rate limits on.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::bail;
use futures_util::StreamExt as _;
use tower::ServiceExt as _;

use flotilla_api_types::clock::SystemClock;
use flotilla_api_types::instances::{InstanceConfig, InstanceStatus};
use flotilla_api_types::{InstanceId, NodeId};
use flotilla_bench::{number_flag as flag, percentile};
use flotilla_control_plane::config::WebhookConfig;
use flotilla_control_plane::store::NewInstance;
use flotilla_control_plane::{ControlPlane, ControlPlaneConfig, Store};

/// A receiver that counts calls and answers 204.
async fn receiver() -> anyhow::Result<(String, Arc<AtomicUsize>)> {
    let count = Arc::new(AtomicUsize::new(0));
    let counted = count.clone();
    let router = axum::Router::new().route(
        "/hook",
        axum::routing::post(move |_body: axum::body::Bytes| {
            let counted = counted.clone();
            async move {
                counted.fetch_add(1, Ordering::Relaxed);
                axum::http::StatusCode::NO_CONTENT
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/hook", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, router).await });
    Ok((url, count))
}

async fn wait_for(count: &AtomicUsize, target: usize) -> anyhow::Result<Duration> {
    let started = Instant::now();
    while count.load(Ordering::Relaxed) < target {
        if started.elapsed() > Duration::from_secs(600) {
            bail!(
                "only {} of {target} delivered",
                count.load(Ordering::Relaxed)
            );
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    Ok(started.elapsed())
}

fn new_instance(node: &NodeId) -> NewInstance {
    NewInstance {
        id: InstanceId::generate(),
        node_id: node.clone(),
        image: "chromium".into(),
        config: InstanceConfig::default(),
        created_at: chrono::Utc::now(),
        profile: None,
        operation: flotilla_api_types::ids::OperationId::generate(),
        tenant: None,
    }
}

/// A control plane on `store` that signs and delivers every event to `url`
/// with `concurrency` deliveries at a time.
fn webhook_control_plane(store: &Store, url: &str, concurrency: usize) -> Arc<ControlPlane> {
    let mut config = ControlPlaneConfig {
        webhooks: vec![WebhookConfig {
            url: url.to_owned(),
            events: Vec::new(),
            secret: "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".into(),
        }],
        ..ControlPlaneConfig::default()
    };
    config.webhook_delivery.concurrency = concurrency;
    Arc::new(ControlPlane::new(
        store.clone(),
        config,
        Arc::new(SystemClock),
    ))
}

/// Fills the outbox with `events` instance.created events, each for its own
/// instance; prints how long it took.
async fn fill_outbox(store: &Store, node: &NodeId, events: usize) -> anyhow::Result<()> {
    let fill = Instant::now();
    for _ in 0..events {
        store
            .instance_insert_if_room(&new_instance(node), i64::MAX)
            .await?;
    }
    println!(
        "outbox filled with {events} events in {:.1} s ({:.0} changes/s with their events)",
        fill.elapsed().as_secs_f64(),
        events as f64 / fill.elapsed().as_secs_f64()
    );
    Ok(())
}

/// 2,000 events of one instance, each waiting for the one before it; prints
/// the row.
async fn measure_in_order_delivery(
    store: &Store,
    node: &NodeId,
    count: &AtomicUsize,
) -> anyhow::Result<()> {
    let one = new_instance(node);
    store.instance_insert_if_room(&one, i64::MAX).await?;
    let sequential = 2000;
    let before = count.load(Ordering::Relaxed);
    let started = Instant::now();
    let mut to = InstanceStatus::Running;
    for _ in 1..sequential {
        let from = if to == InstanceStatus::Running {
            InstanceStatus::Creating
        } else {
            InstanceStatus::Running
        };
        let from = [
            from,
            InstanceStatus::Idle,
            InstanceStatus::Running,
            InstanceStatus::Creating,
        ];
        store
            .instance_transition(&one.id, &from, to, None, chrono::Utc::now())
            .await?;
        to = if to == InstanceStatus::Running {
            InstanceStatus::Idle
        } else {
            InstanceStatus::Running
        };
    }
    let took = wait_for(count, before + sequential).await?;
    println!(
        "| signed webhooks, 1 instance (in order), {sequential} events | {:.0} events/s | {:.2} s (changes written meanwhile: {:.2} s) |",
        sequential as f64 / took.as_secs_f64(),
        took.as_secs_f64(),
        started.elapsed().as_secs_f64() - took.as_secs_f64()
    );
    Ok(())
}

/// Baseline: `events` plain POSTs of `body` to `url`, `concurrency` at a time,
/// no store, no signing; prints the row.
async fn measure_plain_posts(
    url: &str,
    body: &str,
    count: &AtomicUsize,
    events: usize,
    concurrency: usize,
) -> anyhow::Result<()> {
    let client = reqwest::Client::new();
    let before = count.load(Ordering::Relaxed);
    let started = Instant::now();
    futures_util::stream::iter(0..events)
        .map(|_| {
            let request = client
                .post(url)
                .header("content-type", "application/json")
                .body(body.to_owned());
            async move { request.send().await.map(|r| r.status()) }
        })
        .buffer_unordered(concurrency)
        .for_each(|_| async {})
        .await;
    let took = started.elapsed();
    anyhow::ensure!(
        count.load(Ordering::Relaxed) - before == events,
        "baseline lost calls"
    );
    println!(
        "| baseline: plain POSTs, no store, no signing, concurrency {concurrency} | {:.0} events/s | {:.2} s |",
        events as f64 / took.as_secs_f64(),
        took.as_secs_f64()
    );
    Ok(())
}

/// Signing cost: time per signature of `body`, averaged over 200,000; prints
/// the line.
fn measure_signing(body: &str) {
    let key =
        flotilla_control_plane::app::outbox::secret_key("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw");
    let rounds = 200_000;
    let started = Instant::now();
    let mut length = 0;
    for i in 0..rounds {
        length += flotilla_control_plane::app::outbox::sign(
            &key,
            "evt_0190a5f0000070008000000000000000",
            1_800_000_000 + i,
            body,
        )
        .len();
    }
    let per = started.elapsed().as_secs_f64() / rounds as f64;
    println!(
        "signing: {:.2} µs per event ({} byte body; {length} signature bytes in all)",
        per * 1e6,
        body.len()
    );
}

/// The webhook benchmarks (see the module docs).
async fn webhooks() -> anyhow::Result<()> {
    let events = flag("--events", 20_000)?;
    let concurrency = flag("--concurrency", 16)?;
    let (url, count) = receiver().await?;
    let dir = tempfile::tempdir()?;
    let store = Store::connect(&format!("sqlite://{}/bench.db", dir.path().display()), 8).await?;
    let control_plane = webhook_control_plane(&store, &url, concurrency);
    let node = NodeId::new("bench-node");
    fill_outbox(&store, &node, events).await?;
    let shutdown = tokio_util::sync::CancellationToken::new();
    let tasks =
        flotilla_control_plane::app::outbox::spawn(control_plane.clone(), shutdown.clone()).await;
    let took = wait_for(&count, events).await?;
    println!(
        "| signed webhooks, {events} instances, concurrency {concurrency} | {:.0} events/s | {:.2} s |",
        events as f64 / took.as_secs_f64(),
        took.as_secs_f64()
    );

    // One instance: each event waits for the previous one.
    measure_in_order_delivery(&store, &node, &count).await?;
    shutdown.cancel();
    for task in tasks {
        let _ = task.await;
    }

    // Baseline: plain POSTs of the same bodies, same concurrency.
    let body = serde_json::json!({"event": "instance.created", "timestamp": "2026-11-22T07:00:00.000Z",
        "data": {"instance_id": InstanceId::generate().as_str(), "status": "creating", "node_id": "bench-node"}})
        .to_string();
    measure_plain_posts(&url, &body, &count, events, concurrency).await?;
    measure_signing(&body);
    Ok(())
}

async fn middleware() -> anyhow::Result<()> {
    let requests = flag("--requests", 200_000)?;
    let dir = tempfile::tempdir()?;
    let store = Store::connect(&format!("sqlite://{}/bench.db", dir.path().display()), 8).await?;
    let node = NodeId::new("bench-node");
    let instance = new_instance(&node);
    store.instance_insert_if_room(&instance, i64::MAX).await?;
    let key = "flt_bench_key";
    let path = format!("/v2/instances/{}", instance.id.as_str());
    println!("| configuration | p50 µs | p99 µs | requests/s (one at a time) |");
    println!("|---|---|---|---|");
    for (label, auth, limit) in [
        ("auth off, rate limit off", false, false),
        ("auth on (1 key)", true, false),
        ("auth on, rate limit on", true, true),
    ] {
        let mut config = ControlPlaneConfig {
            auth_enabled: auth,
            api_keys: vec![key.into()],
            ..ControlPlaneConfig::default()
        };
        config.rate_limit.enabled = limit;
        config.rate_limit.requests_per_minute = u32::MAX;
        let control_plane = Arc::new(ControlPlane::new(
            store.clone(),
            config,
            Arc::new(SystemClock),
        ));
        let router = flotilla_control_plane::http::router(control_plane);
        let mut samples = Vec::with_capacity(requests);
        let request = || {
            axum::http::Request::get(&path)
                .header("authorization", format!("Bearer {key}"))
                .body(axum::body::Body::empty())
                .expect("request")
        };
        for _ in 0..requests / 10 {
            router.clone().oneshot(request()).await?;
        }
        let started = Instant::now();
        for _ in 0..requests {
            let one = Instant::now();
            let response = router.clone().oneshot(request()).await?;
            anyhow::ensure!(response.status() == 200, "status {}", response.status());
            let _ = axum::body::to_bytes(response.into_body(), usize::MAX).await?;
            samples.push(one.elapsed().as_secs_f64() * 1e6);
        }
        let total = started.elapsed().as_secs_f64();
        samples.sort_by(f64::total_cmp);
        println!(
            "| {label} | {:.1} | {:.1} | {:.0} |",
            percentile(&samples, 0.5),
            percentile(&samples, 0.99),
            requests as f64 / total
        );
    }
    Ok(())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    match std::env::args().nth(1).as_deref() {
        Some("webhooks") => webhooks().await,
        Some("middleware") => middleware().await,
        _ => bail!("usage: ops_bench webhooks|middleware [flags]"),
    }
}
