//! A load generator for server-sent-event servers: Flotilla's proxy, Nchan and
//! Pushpin, driven identically. Run as several processes (each process may hold
//! at most 20,000 open files here), spreading connections over 127.0.0.x source
//! addresses so that ephemeral ports never run out.
//!
//!   sse_load subscribe --target flotilla|nchan|pushpin --base http://127.0.0.1:8081
//!                      --topic T --connections N [--sources 127.0.0.2,127.0.0.3]
//!                      [--expect M] [--hold SECS] --report FILE [--token TOKEN]
//!                      [--ramp CONNECTIONS_PER_SECOND]
//!     Opens N streams, prints "ready N" once all are open, counts events until
//!     each stream has M (or SECS pass), and writes a JSON report: events,
//!     latency histogram of every delivery, and the latest delivery per message.
//!
//!   sse_load publish --target … --base URL --topic T --count M --rate R
//!                    [--size BYTES] [--key KEY]
//!     Publishes M events at R per second; each carries "<seq> <unix ns>".
//!
//!   sse_load merge FILE… — combines subscriber reports into one summary.
//!
//!   sse_load origin --listen 127.0.0.1:18084 — a GRIP origin for Pushpin: every
//!     `GET /stream/{topic}` is answered `Grip-Hold: stream` on channel `topic`.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, bail};
use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpSocket;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Target {
    Flotilla,
    Nchan,
    Pushpin,
}

struct Options {
    args: HashMap<String, String>,
    positional: Vec<String>,
}

impl Options {
    fn parse(raw: impl Iterator<Item = String>) -> anyhow::Result<Self> {
        let mut args = HashMap::new();
        let mut positional = Vec::new();
        let mut raw = raw.peekable();
        while let Some(arg) = raw.next() {
            if let Some(name) = arg.strip_prefix("--") {
                let value = raw
                    .next()
                    .with_context(|| format!("--{name} needs a value"))?;
                args.insert(name.to_owned(), value);
            } else {
                positional.push(arg);
            }
        }
        Ok(Self { args, positional })
    }

    fn get(&self, name: &str) -> anyhow::Result<&str> {
        self.args
            .get(name)
            .map(String::as_str)
            .with_context(|| format!("--{name} is required"))
    }

    fn number<T: std::str::FromStr>(&self, name: &str, default: T) -> anyhow::Result<T>
    where
        T::Err: std::fmt::Display,
    {
        match self.args.get(name) {
            Some(value) => value.parse().map_err(|e| anyhow::anyhow!("--{name}: {e}")),
            None => Ok(default),
        }
    }

    fn target(&self) -> anyhow::Result<Target> {
        Ok(match self.get("target")? {
            "flotilla" => Target::Flotilla,
            "nchan" => Target::Nchan,
            "pushpin" => Target::Pushpin,
            other => bail!("unknown target {other}"),
        })
    }
}

fn unix_nanos() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}

fn process_cpu_seconds() -> f64 {
    // SAFETY: getrusage writes into the struct we own.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    seconds(usage.ru_utime) + seconds(usage.ru_stime)
}

#[derive(Serialize, Deserialize, Default)]
struct Report {
    connections: usize,
    failed_connections: usize,
    events: u64,
    /// (latency µs, count) of every delivery.
    latency_us: Vec<(u64, u64)>,
    /// Per message seq: (deliveries, latest delivery latency µs).
    per_message: HashMap<u64, (u64, u64)>,
    generator_cpu_seconds: f64,
    wall_seconds: f64,
}

struct Shared {
    histogram: Mutex<Histogram<u64>>,
    per_message: Mutex<HashMap<u64, (u64, u64)>>,
    events: AtomicUsize,
}

fn subscribe_path(target: Target, topic: &str) -> String {
    match target {
        Target::Flotilla => format!("/events/{topic}"),
        Target::Nchan => format!("/sub/{topic}"),
        Target::Pushpin => format!("/stream/{topic}"),
    }
}

/// Connects to `server` from `source` and sends the stream request for `path`
/// (with `token` as a bearer token if given).
async fn open_stream(
    server: SocketAddr,
    source: IpAddr,
    path: &str,
    token: Option<&str>,
) -> anyhow::Result<tokio::net::TcpStream> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(source, 0))?;
    let mut stream = socket.connect(server).await?;
    stream.set_nodelay(true)?;
    let mut request =
        format!("GET {path} HTTP/1.1\r\nHost: {server}\r\nAccept: text/event-stream\r\n");
    if let Some(token) = token {
        request.push_str(&format!("Authorization: Bearer {token}\r\n"));
    }
    request.push_str("\r\n");
    stream.write_all(request.as_bytes()).await?;
    Ok(stream)
}

/// Reads the response head (through `chunk` into `buffer`), an error unless it
/// is a 200; leaves what follows it in `buffer`.
async fn read_response_head(
    stream: &mut tokio::net::TcpStream,
    buffer: &mut Vec<u8>,
    chunk: &mut [u8],
) -> anyhow::Result<()> {
    loop {
        let n = stream.read(chunk).await?;
        if n == 0 {
            bail!("closed during the response head");
        }
        buffer.extend_from_slice(&chunk[..n]);
        if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buffer[..end]).into_owned();
            if !head.starts_with("HTTP/1.1 200") {
                bail!("refused: {}", head.lines().next().unwrap_or_default());
            }
            buffer.drain(..end + 4);
            return Ok(());
        }
    }
}

/// Takes the whole lines off `buffer` and adds (seq, latency µs) of each
/// event in them to `latencies`; how many events it found.
fn scan_data_lines(buffer: &mut Vec<u8>, latencies: &mut Vec<(u64, u64)>) -> u64 {
    let mut received = 0;
    // Scan whole lines; a data line is "data: <seq> <unix ns>[ padding]".
    let mut start = 0;
    while let Some(offset) = buffer[start..].iter().position(|b| *b == b'\n') {
        let line = &buffer[start..start + offset];
        start += offset + 1;
        if let Some(data) = line.strip_prefix(b"data: ") {
            let now = unix_nanos();
            let text = String::from_utf8_lossy(data);
            let mut parts = text.split(' ');
            if let (Some(seq), Some(sent)) = (parts.next(), parts.next())
                && let (Ok(seq), Ok(sent)) = (
                    seq.trim_matches('"').parse::<u64>(),
                    sent.trim_matches('"').parse::<u128>(),
                )
            {
                let latency = (now.saturating_sub(sent) / 1000) as u64;
                latencies.push((seq, latency));
                received += 1;
            }
        }
    }
    buffer.drain(..start);
    received
}

/// Records (and clears) `latencies` in the shared histogram and per-message
/// table, and counts `received` events.
fn record_deliveries(shared: &Shared, latencies: &mut Vec<(u64, u64)>, received: u64) {
    let mut histogram = shared.histogram.lock().expect("histogram");
    for (_, latency) in latencies.iter() {
        let _ = histogram.record(*latency.max(&1));
    }
    drop(histogram);
    let mut per_message = shared.per_message.lock().expect("per message");
    for (seq, latency) in latencies.drain(..) {
        let entry = per_message.entry(seq).or_insert((0, 0));
        entry.0 += 1;
        entry.1 = entry.1.max(latency);
    }
    shared
        .events
        .fetch_add(received as usize, Ordering::Relaxed);
}

/// Where one stream connects, from which address, with which credential.
struct StreamSpec {
    server: SocketAddr,
    source: IpAddr,
    path: String,
    token: Option<String>,
}

/// One stream: opens it, counts it in `connected` once it has started, then
/// records its deliveries in `shared` until the server closes it.
async fn subscriber(
    spec: &StreamSpec,
    shared: Arc<Shared>,
    connected: Arc<AtomicUsize>,
) -> anyhow::Result<()> {
    let token = spec.token.as_deref();
    let mut stream = open_stream(spec.server, spec.source, &spec.path, token).await?;
    let mut buffer = Vec::with_capacity(4096);
    let mut chunk = vec![0u8; 16 * 1024];
    // Response head.
    read_response_head(&mut stream, &mut buffer, &mut chunk).await?;
    connected.fetch_add(1, Ordering::SeqCst);
    let mut received = 0u64;
    let mut latencies = Vec::with_capacity(64);
    loop {
        received += scan_data_lines(&mut buffer, &mut latencies);
        if !latencies.is_empty() {
            record_deliveries(&shared, &mut latencies, received);
            received = 0;
        }
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Ok(());
        }
        buffer.extend_from_slice(&chunk[..n]);
    }
}

/// The options of `sse_load subscribe`.
struct SubscribeOptions {
    target: Target,
    server: SocketAddr,
    topic: String,
    connections: usize,
    expect: u64,
    hold: u64,
    ramp: f64,
    report_path: String,
    token: Option<String>,
    sources: Vec<IpAddr>,
}

impl SubscribeOptions {
    /// Reads them from `options`, resolving `--base`.
    async fn parse(options: &Options) -> anyhow::Result<Self> {
        let target = options.target()?;
        let base = options
            .get("base")?
            .trim_start_matches("http://")
            .to_owned();
        let server: SocketAddr = tokio::net::lookup_host(&base)
            .await?
            .next()
            .context("server address")?;
        Ok(Self {
            target,
            server,
            topic: options.get("topic")?.to_owned(),
            connections: options.number("connections", 1000)?,
            expect: options.number("expect", 0)?,
            hold: options.number("hold", 60)?,
            ramp: options.number("ramp", 10_000.0)?,
            report_path: options.get("report")?.to_owned(),
            token: options.args.get("token").cloned(),
            sources: options
                .args
                .get("sources")
                .map(|s| s.split(',').map(|ip| ip.parse()).collect::<Result<_, _>>())
                .transpose()?
                .unwrap_or_else(|| vec!["127.0.0.1".parse().expect("ip")]),
        })
    }
}

/// Runs [`subscriber`] until it ends, retrying refused bursts (502) like a
/// client would; counts a stream that fails for good in `failed`.
async fn subscriber_with_retries(
    spec: StreamSpec,
    shared: Arc<Shared>,
    connected: Arc<AtomicUsize>,
    failed: Arc<AtomicUsize>,
) {
    // A server may refuse a burst (Pushpin answers 502): retry like a client would.
    let mut attempt = 0;
    loop {
        match subscriber(&spec, shared.clone(), connected.clone()).await {
            Err(error) if error.to_string().contains("502") && attempt < 30 => {
                attempt += 1;
                tokio::time::sleep(Duration::from_millis(200 * attempt.min(5))).await;
            }
            Err(error) => {
                if failed.fetch_add(1, Ordering::SeqCst) < 3 {
                    eprintln!("subscriber: {error:#}");
                }
                return;
            }
            Ok(()) => return,
        }
    }
}

/// Spawns the `connections` subscribers, over the source addresses in turn,
/// pausing after every 100 to keep to the ramp.
async fn spawn_subscribers(
    config: &SubscribeOptions,
    shared: &Arc<Shared>,
    connected: &Arc<AtomicUsize>,
    failed: &Arc<AtomicUsize>,
) {
    let path = subscribe_path(config.target, &config.topic);
    for i in 0..config.connections {
        let (shared, connected, failed) = (shared.clone(), connected.clone(), failed.clone());
        let spec = StreamSpec {
            server: config.server,
            source: config.sources[i % config.sources.len()],
            path: path.clone(),
            token: config.token.clone(),
        };
        tokio::spawn(subscriber_with_retries(spec, shared, connected, failed));
        // Ramp: some servers refuse bursts of new connections.
        if i % 100 == 99 {
            tokio::time::sleep(Duration::from_secs_f64(100.0 / config.ramp)).await;
        }
    }
}

/// Waits (300 s at most) until every stream has started or failed.
async fn wait_connected(connected: &AtomicUsize, failed: &AtomicUsize, connections: usize) {
    let ramp_deadline = Instant::now() + Duration::from_secs(300);
    while connected.load(Ordering::SeqCst) + failed.load(Ordering::SeqCst) < connections
        && Instant::now() < ramp_deadline
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until `wanted` events have arrived (when `expect` is set), the hold
/// time has passed, or delivery has stalled.
async fn wait_deliveries(shared: &Shared, expect: u64, wanted: usize, hold: u64) {
    let hold_deadline = Instant::now() + Duration::from_secs(hold);
    let mut last_progress = (0, Instant::now());
    loop {
        let events = shared.events.load(Ordering::Relaxed);
        if expect > 0 && events >= wanted {
            break;
        }
        if events != last_progress.0 {
            last_progress = (events, Instant::now());
        }
        // Stop once delivery has stalled for 5 s after it began (lost events).
        let stalled =
            expect > 0 && events > 0 && last_progress.1.elapsed() > Duration::from_secs(5);
        if Instant::now() > hold_deadline || stalled {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The report of this process's subscribers.
fn report(
    shared: &Shared,
    connected: &AtomicUsize,
    failed: &AtomicUsize,
    started: Instant,
) -> Report {
    let histogram = shared.histogram.lock().expect("histogram").clone();
    Report {
        connections: connected.load(Ordering::SeqCst),
        failed_connections: failed.load(Ordering::SeqCst),
        events: shared.events.load(Ordering::Relaxed) as u64,
        latency_us: histogram
            .iter_recorded()
            .map(|v| (v.value_iterated_to(), v.count_at_value()))
            .collect(),
        per_message: shared.per_message.lock().expect("per message").clone(),
        generator_cpu_seconds: process_cpu_seconds(),
        wall_seconds: started.elapsed().as_secs_f64(),
    }
}

/// `sse_load subscribe` (see the module docs).
async fn subscribe(options: &Options) -> anyhow::Result<()> {
    let config = SubscribeOptions::parse(options).await?;
    let shared = Arc::new(Shared {
        histogram: Mutex::new(Histogram::new_with_bounds(1, 60_000_000, 3)?),
        per_message: Mutex::default(),
        events: AtomicUsize::new(0),
    });
    let connected = Arc::new(AtomicUsize::new(0));
    let failed = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    spawn_subscribers(&config, &shared, &connected, &failed).await;
    wait_connected(&connected, &failed, config.connections).await;
    println!("ready {}", connected.load(Ordering::SeqCst));
    let wanted = config.expect as usize * connected.load(Ordering::SeqCst);
    wait_deliveries(&shared, config.expect, wanted, config.hold).await;
    let report = report(&shared, &connected, &failed, started);
    std::fs::write(&config.report_path, serde_json::to_vec(&report)?)?;
    println!("done {}", report.events);
    std::process::exit(0);
}

async fn publish(options: &Options) -> anyhow::Result<()> {
    let target = options.target()?;
    let base = options.get("base")?.trim_end_matches('/').to_owned();
    let topic = options.get("topic")?.to_owned();
    let count: u64 = options.number("count", 100)?;
    let rate: f64 = options.number("rate", 100.0)?;
    let size: usize = options.number("size", 100)?;
    let key = options.args.get("key").cloned();
    let http = reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(8)
        .build()?;
    let interval = Duration::from_secs_f64(1.0 / rate);
    let started = tokio::time::Instant::now();
    let mut slowest = Duration::ZERO;
    for seq in 1..=count {
        tokio::time::sleep_until(started + interval.mul_f64((seq - 1) as f64)).await;
        let mut payload = format!("{seq} {} ", unix_nanos());
        while payload.len() < size {
            payload.push('x');
        }
        let sent = Instant::now();
        let request = match target {
            Target::Flotilla => {
                let mut request = http
                    .post(format!("{base}/publish/{topic}"))
                    .json(&serde_json::json!({"data": payload}));
                if let Some(key) = &key {
                    request = request.bearer_auth(key);
                }
                request
            }
            Target::Nchan => http.post(format!("{base}/pub/{topic}")).body(payload),
            Target::Pushpin => http.post(format!("{base}/publish/")).json(&serde_json::json!({
                "items": [{"channel": topic, "formats": {"http-stream": {"content": format!("data: {payload}\n\n")}}}]
            })),
        };
        let response = request.send().await?;
        if !response.status().is_success() {
            bail!("publish {seq}: {}", response.status());
        }
        slowest = slowest.max(sent.elapsed());
    }
    println!(
        "published {count} in {:.2} s (slowest publish {:.1} ms)",
        started.elapsed().as_secs_f64(),
        slowest.as_secs_f64() * 1000.0
    );
    Ok(())
}

async fn origin(options: &Options) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(options.get("listen")?).await?;
    let router = axum::Router::new().route(
        "/stream/{topic}",
        axum::routing::get(
            |axum::extract::Path(topic): axum::extract::Path<String>| async move {
                (
                    [
                        ("Content-Type", "text/event-stream".to_owned()),
                        ("Grip-Hold", "stream".to_owned()),
                        ("Grip-Channel", topic),
                    ],
                    "",
                )
            },
        ),
    );
    println!("origin listening");
    axum::serve(listener, router).await?;
    Ok(())
}

fn merge(files: &[String]) -> anyhow::Result<()> {
    let mut histogram: Histogram<u64> = Histogram::new_with_bounds(1, 60_000_000, 3)?;
    let mut per_message: HashMap<u64, (u64, u64)> = HashMap::new();
    let (mut connections, mut failed, mut events, mut cpu, mut wall) = (0, 0, 0, 0.0, 0.0f64);
    for file in files {
        let report: Report = serde_json::from_slice(&std::fs::read(file)?)?;
        connections += report.connections;
        failed += report.failed_connections;
        events += report.events;
        cpu += report.generator_cpu_seconds;
        wall = wall.max(report.wall_seconds);
        for (value, count) in report.latency_us {
            histogram.record_n(value, count)?;
        }
        for (seq, (deliveries, latest)) in report.per_message {
            let entry = per_message.entry(seq).or_insert((0, 0));
            entry.0 += deliveries;
            entry.1 = entry.1.max(latest);
        }
    }
    let mut last: Histogram<u64> = Histogram::new_with_bounds(1, 60_000_000, 3)?;
    let complete = per_message
        .values()
        .filter(|(d, _)| *d as usize == connections)
        .count();
    for (_, latest) in per_message.values() {
        last.record(*latest.max(&1))?;
    }
    let ms = |h: &Histogram<u64>, q: f64| h.value_at_quantile(q) as f64 / 1000.0;
    println!(
        "{}",
        serde_json::json!({
            "connections": connections,
            "failed_connections": failed,
            "messages": per_message.len(),
            "messages_delivered_to_all": complete,
            "deliveries": events,
            "expected_deliveries": per_message.len() * connections,
            "delivery_p50_ms": ms(&histogram, 0.5),
            "delivery_p99_ms": ms(&histogram, 0.99),
            "delivery_max_ms": histogram.max() as f64 / 1000.0,
            "last_subscriber_p50_ms": ms(&last, 0.5),
            "last_subscriber_p99_ms": ms(&last, 0.99),
            "generator_cpu_seconds": cpu,
            "generator_wall_seconds": wall,
        })
    );
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let mut raw = std::env::args().skip(1);
    let mode = raw.next().context("mode: subscribe, publish or merge")?;
    let options = Options::parse(raw)?;
    if mode == "merge" {
        return merge(&options.positional);
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(options.number("threads", 1)?)
        .enable_all()
        .build()?;
    runtime.block_on(async {
        match mode.as_str() {
            "subscribe" => subscribe(&options).await,
            "publish" => publish(&options).await,
            "origin" => origin(&options).await,
            other => bail!("unknown mode {other}"),
        }
    })
}
