//! Event proxy peers (issue 8) with real processes: three release `flotilla
//! proxy` processes joined by `[peers]`, and one proxy alone as the baseline.
//!
//!   peers_bench [--events 2000] [--seconds 10] [--topics 30]
//!               [--subscribers 3] [--gossip-ms 1000] [--rounds 20]
//!
//! 1. Latency, publish → delivery: sequential publishes whose data is the send
//!    time; subscribers report the arrival. Cases: the lone proxy (baseline);
//!    the cluster with publisher and subscriber on the topic's owner; the
//!    subscriber on another proxy (one hop); publisher and subscriber both on
//!    proxies that do not own the topic (two hops).
//! 2. Throughput: `--topics` topics spread over the owners, `--subscribers`
//!    subscribers per topic on every proxy, batched publishes (100 events per
//!    request) on every proxy for `--seconds`; deliveries per second and
//!    losses. Baseline: the same subscribers and publishes on the lone proxy.
//! 3. Gossip convergence after a subscribe: a first subscriber to a new topic
//!    on one proxy, until both others see its interest (`/health`), `--rounds`
//!    times.
//! 4. Revocation: `POST /admin/revoke` of a user on one proxy until that
//!    user's streams on all three proxies have ended (sent directly), and,
//!    with one proxy frozen (SIGSTOP) until the others take it for dead, from
//!    its thaw (SIGCONT) until its stream has ended (learnt by gossip).
//!    Tokens are verified by a webhook in this process that accepts all.
//! 5. Death detection: SIGKILL of one proxy until both others declare it dead
//!    (`peer_timeout_sec` = 5 gossip intervals).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures_util::StreamExt as _;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use flotilla_bench::{get_json, number_flag as flag, percentile};
use flotilla_event_proxy::peers::owner_among;
use flotilla_testkit::{ServeProcess, WebhookFake};

const KEY: &str = "bench-publisher";
const SECRET: &str = "bench cluster secret, 32 characters";

struct Proxy {
    process: ServeProcess,
    gossip: String,
}

impl Proxy {
    fn url(&self) -> &str {
        &self.process.api.base
    }
}

/// Starts a proxy; subscribers without a token are admitted, tokens are
/// verified with `webhook`.
async fn start_proxy(
    binary: &Path,
    dir: &Path,
    name: &str,
    webhook: &str,
    peers: Option<(&str, &[String], f64)>,
) -> anyhow::Result<Proxy> {
    let mut config = format!(
        "[jwt_verifier]\nrequire_authentication = false\nwebhook_url = {webhook:?}\n\n[publisher]\napi_keys = [{KEY:?}]\n\n\
         [rate_limit]\nrate_limit_per_ip = 1000000\n\n[http]\nmax_message_queue_size = 100000\n"
    );
    let mut gossip = String::new();
    if let Some((address, seeds, interval)) = peers {
        let others: Vec<&String> = seeds.iter().filter(|s| *s != address).collect();
        config.push_str(&format!(
            "\n[peers]\nlisten_address = {address:?}\npeer_addresses = {others:?}\nsecret = {SECRET:?}\n\
             gossip_interval_sec = {interval}\npeer_timeout_sec = {}\n",
            interval * 5.0
        ));
        gossip = address.to_owned();
    }
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, config)?;
    let config = path.display().to_string();
    let process = ServeProcess::start_command(
        binary,
        &["proxy", "--listen", "127.0.0.1:0", "--config", &config],
        &dir.join(name),
        &[("RUST_LOG", "warn")],
        "event proxy listening on ",
    )
    .await?;
    Ok(Proxy { process, gossip })
}

async fn health(http: &reqwest::Client, url: &str) -> anyhow::Result<Value> {
    get_json(http, format!("{url}/health")).await
}

/// Subscribes and sends every event's data (with its arrival) to `out`;
/// resolves once the stream has started.
async fn subscribe(
    http: &reqwest::Client,
    url: &str,
    topic: &str,
    out: mpsc::UnboundedSender<(Instant, String)>,
) -> anyhow::Result<()> {
    let response = http
        .get(format!("{url}/events/{topic}"))
        .header("Accept", "text/event-stream")
        .send()
        .await?;
    anyhow::ensure!(response.status() == 200, "subscribe: {}", response.status());
    let mut body = response.bytes_stream();
    tokio::spawn(async move {
        let mut pending = String::new();
        while let Some(Ok(chunk)) = body.next().await {
            let now = Instant::now();
            pending.push_str(&String::from_utf8_lossy(&chunk));
            while let Some(end) = pending.find("\n\n") {
                let block: String = pending.drain(..end + 2).collect();
                for line in block.lines() {
                    if let Some(data) = line.strip_prefix("data: ")
                        && out.send((now, data.to_owned())).is_err()
                    {
                        return;
                    }
                }
            }
        }
    });
    Ok(())
}

/// Subscribes with `token`; the receiver fires when the stream gets its
/// `event: revoked`.
async fn subscribe_until_revoked(
    http: &reqwest::Client,
    url: &str,
    topic: &str,
    token: &str,
) -> anyhow::Result<tokio::sync::oneshot::Receiver<Instant>> {
    let response = http
        .get(format!("{url}/events/{topic}"))
        .header("Accept", "text/event-stream")
        .bearer_auth(token)
        .send()
        .await?;
    anyhow::ensure!(response.status() == 200, "subscribe: {}", response.status());
    let (tx, rx) = tokio::sync::oneshot::channel();
    let mut body = response.bytes_stream();
    tokio::spawn(async move {
        let mut seen = String::new();
        while let Some(Ok(chunk)) = body.next().await {
            seen.push_str(&String::from_utf8_lossy(&chunk));
            if seen.contains("event: revoked") {
                let _ = tx.send(Instant::now());
                return;
            }
        }
    });
    Ok(rx)
}

/// `POST /admin/revoke` of `user` on `url`; its answer.
async fn revoke(http: &reqwest::Client, url: &str, user: &str) -> anyhow::Result<Value> {
    let response = http
        .post(format!("{url}/admin/revoke"))
        .bearer_auth(KEY)
        .json(&json!({ "user_id": user }))
        .send()
        .await?;
    anyhow::ensure!(response.status() == 200, "revoke: {}", response.status());
    Ok(response.json().await?)
}

/// Waits until every proxy in `urls` sees `live` live peers.
async fn converged(http: &reqwest::Client, urls: &[&str], live: u64) -> anyhow::Result<()> {
    for url in urls {
        while health(http, url).await?["peers"]["connected"] != live {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    Ok(())
}

async fn publish(http: &reqwest::Client, url: &str, topic: &str, data: &str) -> anyhow::Result<()> {
    let response = http
        .post(format!("{url}/publish/{topic}"))
        .bearer_auth(KEY)
        .json(&json!({ "data": data }))
        .send()
        .await?;
    anyhow::ensure!(response.status() == 200, "publish: {}", response.status());
    Ok(())
}

/// Publishes `events` one after another from `publisher`; returns the
/// publish → delivery latencies (ms) seen on `subscriber`.
async fn latency(
    http: &reqwest::Client,
    publisher: &str,
    subscriber: &str,
    topic: &str,
    events: usize,
) -> anyhow::Result<Vec<f64>> {
    let (tx, mut rx) = mpsc::unbounded_channel();
    subscribe(http, subscriber, topic, tx).await?;
    // Let the owner learn of the subscriber (it watched it directly already).
    publish(http, publisher, topic, "warm-up").await?;
    rx.recv().await;
    let origin = Instant::now();
    let mut samples = Vec::with_capacity(events);
    for _ in 0..events {
        let sent = origin.elapsed().as_nanos().to_string();
        publish(http, publisher, topic, &sent).await?;
        let (arrived, data) = tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await?
            .ok_or_else(|| anyhow::anyhow!("stream ended"))?;
        let sent: u128 = data.parse()?;
        samples.push((arrived.duration_since(origin).as_nanos() - sent) as f64 / 1e6);
    }
    Ok(samples)
}

fn row(name: &str, samples: &[f64]) -> String {
    flotilla_bench::p50_p99_row(name, samples, percentile(samples, 1.0))
}

/// Deliveries per second with `subscribers` per topic on each of `targets`,
/// and batched publishing on each of them for `seconds`.
async fn throughput(
    http: &reqwest::Client,
    targets: &[&str],
    topics: &[String],
    subscribers: usize,
    seconds: u64,
) -> anyhow::Result<(f64, f64, u64)> {
    let delivered = Arc::new(AtomicU64::new(0));
    let mut receivers = Vec::new();
    for url in targets {
        for topic in topics {
            for _ in 0..subscribers {
                let (tx, mut rx) = mpsc::unbounded_channel::<(Instant, String)>();
                subscribe(http, url, topic, tx).await?;
                let delivered = delivered.clone();
                receivers.push(tokio::spawn(async move {
                    while rx.recv().await.is_some() {
                        delivered.fetch_add(1, Ordering::Relaxed);
                    }
                }));
            }
        }
    }
    // Gossip and direct watches settle.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let published = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let deadline = start + Duration::from_secs(seconds);
    let mut publishers = Vec::new();
    for (index, url) in targets.iter().enumerate() {
        for lane in 0..2 {
            let http = http.clone();
            let url = url.to_string();
            let topics = topics.to_vec();
            let published = published.clone();
            publishers.push(tokio::spawn(async move {
                let mut n = index * 7 + lane;
                while Instant::now() < deadline {
                    let events: Vec<Value> = (0..100)
                        .map(|i| {
                            n += 1;
                            json!({"topic": topics[n % topics.len()], "data": format!("e{i}")})
                        })
                        .collect();
                    let response = http
                        .post(format!("{url}/publish"))
                        .bearer_auth(KEY)
                        .json(&json!({ "events": events }))
                        .send()
                        .await;
                    if matches!(&response, Ok(r) if r.status() == 200) {
                        published.fetch_add(100, Ordering::Relaxed);
                    }
                }
            }));
        }
    }
    for publisher in publishers {
        publisher.await?;
    }
    let publish_elapsed = start.elapsed().as_secs_f64();
    let expected = published.load(Ordering::Relaxed) * (subscribers * targets.len()) as u64;
    // Drain: until nothing more arrives for a second.
    let mut last = u64::MAX;
    while delivered.load(Ordering::Relaxed) != last && delivered.load(Ordering::Relaxed) < expected
    {
        last = delivered.load(Ordering::Relaxed);
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let total = delivered.load(Ordering::Relaxed);
    let elapsed = start.elapsed().as_secs_f64();
    for receiver in receivers {
        receiver.abort();
    }
    Ok((
        published.load(Ordering::Relaxed) as f64 / publish_elapsed,
        total as f64 / elapsed,
        expected.saturating_sub(total),
    ))
}

/// The command-line arguments.
struct Args {
    events: usize,
    seconds: u64,
    topic_count: usize,
    subscribers: usize,
    gossip_ms: usize,
    rounds: usize,
}

impl Args {
    /// Reads the flags of the command line (see the module docs).
    fn parse() -> anyhow::Result<Self> {
        Ok(Self {
            events: flag("--events", 2000)?,
            seconds: flag("--seconds", 10)? as u64,
            topic_count: flag("--topics", 30)?,
            subscribers: flag("--subscribers", 3)?,
            gossip_ms: flag("--gossip-ms", 1000)?,
            rounds: flag("--rounds", 20)?,
        })
    }
}

/// Starts the three proxies joined by `[peers]`, each on its own UDP gossip
/// address.
async fn start_cluster(
    binary: &Path,
    dir: &Path,
    webhook: &str,
    interval: f64,
) -> anyhow::Result<Vec<Proxy>> {
    let seeds: Vec<String> = (0..3)
        .map(|_| {
            let socket = std::net::UdpSocket::bind("127.0.0.1:0").expect("udp");
            format!("127.0.0.1:{}", socket.local_addr().expect("addr").port())
        })
        .collect();
    let mut proxies = Vec::new();
    for (i, address) in seeds.iter().enumerate() {
        proxies.push(
            start_proxy(
                binary,
                dir,
                &format!("p{i}"),
                webhook,
                Some((address, &seeds, interval)),
            )
            .await?,
        );
    }
    Ok(proxies)
}

/// The first topic `{prefix}-{n}` that the proxy at `index` of `nodes` owns.
fn owned_by(nodes: &[&str], index: usize, prefix: &str) -> String {
    (0..)
        .map(|n| format!("{prefix}-{n}"))
        .find(|t| owner_among(t, nodes) == Some(nodes[index]))
        .expect("some topic")
}

/// Phase 1: publish → delivery latency, on the lone proxy and over 0, 1 and
/// 2 hops of the cluster.
async fn measure_latency(
    http: &reqwest::Client,
    proxies: &[Proxy],
    alone: &Proxy,
    events: usize,
) -> anyhow::Result<()> {
    let nodes: Vec<&str> = proxies.iter().map(|p| p.gossip.as_str()).collect();
    println!("\n| publish → delivery | events | p50 ms | p99 ms | max ms |\n|---|---|---|---|---|");
    let t = "lat-alone".to_owned();
    println!(
        "{}",
        row(
            "one proxy alone (baseline)",
            &latency(http, alone.url(), alone.url(), &t, events).await?
        )
    );
    let t = owned_by(&nodes, 0, "lat-owner");
    println!(
        "{}",
        row(
            "cluster, all on the owner",
            &latency(http, proxies[0].url(), proxies[0].url(), &t, events).await?
        )
    );
    let t = owned_by(&nodes, 0, "lat-one-hop");
    println!(
        "{}",
        row(
            "owner → subscriber's proxy (1 hop)",
            &latency(http, proxies[0].url(), proxies[1].url(), &t, events).await?
        )
    );
    let t = owned_by(&nodes, 2, "lat-two-hops");
    println!(
        "{}",
        row(
            "publisher's proxy → owner → subscriber's proxy (2 hops)",
            &latency(http, proxies[1].url(), proxies[0].url(), &t, events).await?
        )
    );
    Ok(())
}

/// Phase 2: throughput of the three proxies, then of the lone proxy with as
/// many subscribers.
async fn measure_throughput(
    http: &reqwest::Client,
    urls: &[&str],
    alone: &Proxy,
    args: &Args,
) -> anyhow::Result<()> {
    let (topic_count, subscribers, seconds) = (args.topic_count, args.subscribers, args.seconds);
    let topics: Vec<String> = (0..topic_count).map(|i| format!("tp-{i}")).collect();
    let (published, delivered, lost) =
        throughput(http, urls, &topics, subscribers, seconds).await?;
    println!(
        "\nthroughput, three proxies: {} subscribers; published {published:.0}/s, delivered {delivered:.0}/s, lost {lost}",
        topics.len() * subscribers * 3
    );
    let alone_topics: Vec<String> = (0..topic_count).map(|i| format!("ta-{i}")).collect();
    let (published, delivered, lost) = throughput(
        http,
        &[alone.url()],
        &alone_topics,
        subscribers * 3,
        seconds,
    )
    .await?;
    println!(
        "throughput, one proxy alone: {} subscribers; published {published:.0}/s, delivered {delivered:.0}/s, lost {lost}",
        alone_topics.len() * subscribers * 3
    );
    Ok(())
}

/// How many topics the proxy at gossip address `watcher_node` has, as `health`
/// (another proxy's `/health`) reports it.
fn topics_seen_of(health: &Value, watcher_node: &str) -> u64 {
    health["peers"]["members"]
        .as_array()
        .and_then(|m| m.iter().find(|m| m["gossip_address"] == watcher_node))
        .and_then(|m| m["topics"].as_u64())
        .unwrap_or(0)
}

/// Phase 3: `rounds` times, a subscribe on the first proxy at a random point
/// of the gossip cycle until both others see it.
async fn measure_convergence(
    http: &reqwest::Client,
    proxies: &[Proxy],
    rounds: usize,
    gossip_ms: usize,
) -> anyhow::Result<()> {
    let mut convergence = Vec::new();
    let watcher_node = proxies[0].gossip.clone();
    let count_on = |health: &Value| topics_seen_of(health, watcher_node.as_str());
    for round in 0..rounds {
        let before = [
            count_on(&health(http, proxies[1].url()).await?),
            count_on(&health(http, proxies[2].url()).await?),
        ];
        // At a random point of the gossip cycle.
        let pause = rand::random_range(0..gossip_ms as u64);
        tokio::time::sleep(Duration::from_millis(pause)).await;
        let (tx, _rx) = mpsc::unbounded_channel();
        let topic = format!("converge-{round}");
        subscribe(http, proxies[0].url(), &topic, tx).await?;
        let subscribed = Instant::now();
        for (i, other) in [1, 2].into_iter().enumerate() {
            while count_on(&health(http, proxies[other].url()).await?) <= before[i] {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }
        convergence.push(subscribed.elapsed().as_secs_f64() * 1000.0);
        std::mem::forget(_rx);
    }
    println!(
        "\n{}",
        row(
            "gossip: subscribe on one proxy → both others see it",
            &convergence
        )
    );
    Ok(())
}

/// Phase 4a: `rounds` revocations on the first proxy, sent directly to the
/// live peers, until the user's streams on all three have ended.
async fn measure_direct_revocation(
    http: &reqwest::Client,
    urls: &[&str],
    rounds: usize,
) -> anyhow::Result<()> {
    let mut direct = Vec::new();
    for round in 0..rounds {
        let token = format!("direct-{round}");
        let mut ended = Vec::new();
        for url in urls {
            ended.push(subscribe_until_revoked(http, url, "revocation", &token).await?);
        }
        let sent = Instant::now();
        let answer = revoke(http, urls[0], &format!("u-{token}")).await?;
        anyhow::ensure!(
            answer["peers_reached"].as_array().map(Vec::len) == Some(2),
            "{answer}"
        );
        let mut last = sent;
        for end in ended {
            last = last.max(end.await?);
        }
        direct.push(last.duration_since(sent).as_secs_f64() * 1000.0);
    }
    println!(
        "\n{}",
        row(
            "revoke on one proxy → the user's streams on all three ended",
            &direct
        )
    );
    Ok(())
}

/// Phase 4b: revocations learnt by gossip, with the third proxy frozen at
/// revoke time; from its thaw until its stream has ended.
async fn measure_gossiped_revocation(
    http: &reqwest::Client,
    proxies: &[Proxy],
    urls: &[&str],
    rounds: usize,
) -> anyhow::Result<()> {
    let mut gossiped = Vec::new();
    for round in 0..rounds.min(5) {
        let token = format!("gossip-{round}");
        let ended = subscribe_until_revoked(http, urls[2], "revocation", &token).await?;
        proxies[2].process.signal(libc::SIGSTOP);
        converged(http, &urls[..2], 1).await?;
        let answer = revoke(http, urls[0], &format!("u-{token}")).await?;
        anyhow::ensure!(
            answer["peers_reached"].as_array().map(Vec::len) == Some(1),
            "{answer}"
        );
        let thawed = Instant::now();
        proxies[2].process.signal(libc::SIGCONT);
        gossiped.push(ended.await?.duration_since(thawed).as_secs_f64() * 1000.0);
        converged(http, urls, 2).await?;
    }
    println!(
        "{}",
        row(
            "frozen proxy thawed → its stream ended (by gossip)",
            &gossiped
        )
    );
    Ok(())
}

/// Phase 5: SIGKILL of the last proxy until both others declare it dead.
async fn measure_death_detection(
    http: &reqwest::Client,
    proxies: &mut Vec<Proxy>,
    interval: f64,
) -> anyhow::Result<()> {
    let mut victim = proxies.pop().expect("three");
    victim.process.signal(libc::SIGKILL);
    let killed = Instant::now();
    for proxy in proxies.iter() {
        while health(http, proxy.url()).await?["peers"]["connected"] != 1 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    println!(
        "death detected by both others {:.0} ms after SIGKILL (peer_timeout_sec {})",
        killed.elapsed().as_secs_f64() * 1000.0,
        interval * 5.0
    );
    let _ = victim.process.stop_with(libc::SIGKILL).await;
    Ok(())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse()?;
    let binary = PathBuf::from("target/release/flotilla");
    anyhow::ensure!(
        binary.exists(),
        "build first: cargo build --release -p flotilla"
    );
    let temp = tempfile::tempdir()?;
    let webhook = WebhookFake::start(WebhookFake::accept_all()).await;
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(64)
        .build()?;
    let interval = args.gossip_ms as f64 / 1000.0;
    let mut proxies = start_cluster(&binary, temp.path(), &webhook.url, interval).await?;
    let alone = start_proxy(&binary, temp.path(), "alone", &webhook.url, None).await?;
    let urls: Vec<&str> = proxies.iter().map(Proxy::url).collect();
    converged(&http, &urls, 2).await?;
    println!(
        "machine: {} vCPU; gossip_interval_sec {interval}, peer_timeout_sec {}",
        std::thread::available_parallelism()?,
        interval * 5.0
    );
    measure_latency(&http, &proxies, &alone, args.events).await?;
    measure_throughput(&http, &urls, &alone, &args).await?;
    measure_convergence(&http, &proxies, args.rounds, args.gossip_ms).await?;
    measure_direct_revocation(&http, &urls, args.rounds).await?;
    measure_gossiped_revocation(&http, &proxies, &urls, args.rounds).await?;
    measure_death_detection(&http, &mut proxies, interval).await?;
    Ok(())
}
