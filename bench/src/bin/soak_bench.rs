//! Soak of the event proxy (issue 17): does its memory come back?
//!
//!   soak_bench cycles [--cycles 100000] [--topics 100] [--concurrency 32]
//!     Starts `flotilla proxy` (release build), warms it up with 2,000
//!     subscribe/unsubscribe cycles, samples its RSS, runs `--cycles` more
//!     (each opens a stream on one of `--topics` topics, reads the response
//!     head, and closes it; every 100th cycle publishes an event first), waits
//!     for the proxy to notice the closed streams, and samples its RSS again.
//!
//!   soak_bench hold [--streams 10000] [--topics 100] [--minutes 10] [--prefill 1000]
//!     Fills each topic's history (`--prefill` events, the default
//!     `[history] size_per_topic`, so that the history no longer grows),
//!     opens `--streams` streams spread over `--topics` topics, publishes one
//!     event per topic per second (a message per second on every stream), and
//!     samples the proxy's RSS every 30 s; checks that every stream keeps
//!     receiving.
//!
//! The proxy runs with authentication off and a publisher key; the load runs
//! in this process (raise `ulimit -n` for 10,000 streams).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use tokio::io::AsyncReadExt as _;

use flotilla_bench::{
    get_json, number_flag, open_sse_stream, raise_open_files, rss_kib, start_event_proxy,
};

const KEY: &str = "soak-key";

struct Proxy {
    child: tokio::process::Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Proxy {
    async fn start() -> anyhow::Result<Self> {
        let (child, port, dir) = start_event_proxy(KEY).await?;
        Ok(Self {
            child,
            port,
            _dir: dir,
        })
    }

    /// VmRSS of the proxy, in KiB.
    fn rss_kib(&self) -> u64 {
        rss_kib(self.child.id().unwrap_or(0))
    }

    /// Open streams as the proxy reports them (`/health` `connections`).
    async fn open_streams(&self, http: &reqwest::Client) -> anyhow::Result<u64> {
        let health: serde_json::Value =
            get_json(http, format!("http://127.0.0.1:{}/health", self.port)).await?;
        health["connections"]
            .as_u64()
            .with_context(|| format!("no connections in {health}"))
    }
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

async fn wait_for_open(proxy: &Proxy, http: &reqwest::Client, want: u64) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let open = proxy.open_streams(http).await?;
        if open == want {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("{open} streams open, expected {want}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn run_cycles(
    proxy: &Proxy,
    http: &reqwest::Client,
    cycles: usize,
    topics: usize,
    concurrency: usize,
) -> anyhow::Result<()> {
    let next = Arc::new(AtomicUsize::new(0));
    let mut workers = Vec::new();
    for _ in 0..concurrency {
        let (next, http, port) = (next.clone(), http.clone(), proxy.port);
        workers.push(tokio::spawn(async move {
            loop {
                let cycle = next.fetch_add(1, Ordering::Relaxed);
                if cycle >= cycles {
                    return anyhow::Ok(());
                }
                let topic = format!("soak-{}", cycle % topics);
                if cycle % 100 == 0 {
                    http.post(format!("http://127.0.0.1:{port}/publish/{topic}"))
                        .bearer_auth(KEY)
                        .json(&serde_json::json!({"data": format!("cycle {cycle}")}))
                        .send()
                        .await?
                        .error_for_status()?;
                }
                drop(open_sse_stream(port, &topic).await?);
            }
        }));
    }
    for worker in workers {
        worker.await??;
    }
    wait_for_open(proxy, http, 0).await
}

async fn cycles() -> anyhow::Result<()> {
    let cycles = number_flag("--cycles", 100_000)?;
    let topics = number_flag("--topics", 100)?;
    let concurrency = number_flag("--concurrency", 32)?;
    let proxy = Proxy::start().await?;
    let http = reqwest::Client::builder().no_proxy().build()?;
    run_cycles(&proxy, &http, 2_000, topics, concurrency).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = proxy.rss_kib();
    let started = Instant::now();
    run_cycles(&proxy, &http, cycles, topics, concurrency).await?;
    let elapsed = started.elapsed();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = proxy.rss_kib();
    println!(
        "{cycles} subscribe/unsubscribe cycles over {topics} topics ({concurrency} at a time, a publish every 100) in {:.1} s ({:.0} cycles/s)",
        elapsed.as_secs_f64(),
        cycles as f64 / elapsed.as_secs_f64()
    );
    println!(
        "proxy RSS: {:.1} MiB after 2,000 warm-up cycles, {:.1} MiB after the run: {:+.1} %",
        mib(before),
        mib(after),
        (after as f64 / before as f64 - 1.0) * 100.0
    );
    Ok(())
}

/// Fills the history of each of `topics` topics with `prefill` events, 32
/// publishers at a time.
async fn prefill_histories(
    proxy: &Proxy,
    http: &reqwest::Client,
    topics: usize,
    prefill: usize,
) -> anyhow::Result<()> {
    let next = Arc::new(AtomicUsize::new(0));
    let mut fillers = Vec::new();
    for _ in 0..32 {
        let (next, http, port) = (next.clone(), http.clone(), proxy.port);
        fillers.push(tokio::spawn(async move {
            loop {
                let n = next.fetch_add(1, Ordering::Relaxed);
                if n >= prefill * topics {
                    return anyhow::Ok(());
                }
                http.post(format!(
                    "http://127.0.0.1:{port}/publish/hold-{}",
                    n % topics
                ))
                .bearer_auth(KEY)
                .json(&serde_json::json!({"data": format!("prefill {n}")}))
                .send()
                .await?
                .error_for_status()?;
            }
        }));
    }
    for filler in fillers {
        filler.await??;
    }
    Ok(())
}

/// Reads `stream` until it ends, counting its events in `received` and, in
/// `starved`, each 20 s it goes without one.
async fn count_events(
    mut stream: tokio::net::TcpStream,
    received: Arc<AtomicU64>,
    starved: Arc<AtomicUsize>,
) {
    let mut buffer = [0u8; 4096];
    let mut last = Instant::now();
    loop {
        match tokio::time::timeout(Duration::from_secs(20), stream.read(&mut buffer)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return,
            Ok(Ok(read)) => {
                let events = buffer[..read].windows(6).filter(|w| w == b"data: ").count();
                received.fetch_add(events as u64, Ordering::Relaxed);
                if events > 0 {
                    last = Instant::now();
                }
            }
            Err(_) => {}
        }
        if last.elapsed() > Duration::from_secs(20) {
            starved.fetch_add(1, Ordering::Relaxed);
            last = Instant::now();
        }
    }
}

/// Opens `streams` streams spread over `topics` topics, each read by a task of
/// its own (see [`count_events`]); the readers.
async fn open_readers(
    proxy: &Proxy,
    streams: usize,
    topics: usize,
    received: &Arc<AtomicU64>,
    starved: &Arc<AtomicUsize>,
) -> anyhow::Result<Vec<tokio::task::JoinHandle<()>>> {
    let mut readers = Vec::new();
    for index in 0..streams {
        let stream = open_sse_stream(proxy.port, &format!("hold-{}", index % topics)).await?;
        let (received, starved) = (received.clone(), starved.clone());
        readers.push(tokio::spawn(count_events(stream, received, starved)));
    }
    Ok(readers)
}

/// A task that publishes one event per topic every second.
fn spawn_publisher(
    http: &reqwest::Client,
    port: u16,
    topics: usize,
) -> tokio::task::JoinHandle<()> {
    let http = http.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        let mut second = 0u64;
        loop {
            tick.tick().await;
            for topic in 0..topics {
                let _ = http
                    .post(format!("http://127.0.0.1:{port}/publish/hold-{topic}"))
                    .bearer_auth(KEY)
                    .json(&serde_json::json!({"data": format!("second {second}")}))
                    .send()
                    .await;
            }
            second += 1;
        }
    })
}

/// Samples the proxy's RSS every 30 s for `minutes`, printing a row each; the
/// samples.
async fn sample_rss(proxy: &Proxy, received: &AtomicU64, minutes: usize) -> Vec<u64> {
    println!("| minute | proxy RSS MiB | events received |");
    println!("|---|---|---|");
    let started = Instant::now();
    let mut samples = Vec::new();
    while started.elapsed() < Duration::from_secs(60 * minutes as u64) {
        tokio::time::sleep(Duration::from_secs(30)).await;
        let rss = proxy.rss_kib();
        samples.push(rss);
        println!(
            "| {:.1} | {:.1} | {} |",
            started.elapsed().as_secs_f64() / 60.0,
            mib(rss),
            received.load(Ordering::Relaxed)
        );
    }
    samples
}

/// The `hold` benchmark (see the module docs).
async fn hold() -> anyhow::Result<()> {
    let streams = number_flag("--streams", 10_000)?;
    let topics = number_flag("--topics", 100)?;
    let minutes = number_flag("--minutes", 10)?;
    let prefill = number_flag("--prefill", 1000)?;
    let proxy = Proxy::start().await?;
    let http = reqwest::Client::builder().no_proxy().build()?;
    prefill_histories(&proxy, &http, topics, prefill).await?;
    let idle = proxy.rss_kib();
    let received = Arc::new(AtomicU64::new(0));
    let starved = Arc::new(AtomicUsize::new(0));
    let readers = open_readers(&proxy, streams, topics, &received, &starved).await?;
    wait_for_open(&proxy, &http, streams as u64).await?;
    let opened = proxy.rss_kib();
    println!(
        "{streams} streams over {topics} topics open; proxy RSS {:.1} MiB with full histories ({prefill} events per topic), {:.1} MiB with the streams ({:.2} KiB per stream)",
        mib(idle),
        mib(opened),
        (opened.saturating_sub(idle)) as f64 / streams as f64
    );
    let publisher = spawn_publisher(&http, proxy.port, topics);
    let samples = sample_rss(&proxy, &received, minutes).await;
    publisher.abort();
    let open = proxy.open_streams(&http).await?;
    let first = samples.first().copied().unwrap_or(opened);
    let peak = samples.iter().copied().max().unwrap_or(opened);
    let last = samples.last().copied().unwrap_or(opened);
    println!(
        "RSS first sample {:.1} MiB, last {:.1} MiB ({:+.1} %), peak {:.1} MiB; streams still open: {open}; readers that went 20 s without an event: {}; events received: {} of {} sent",
        mib(first),
        mib(last),
        (last as f64 / first as f64 - 1.0) * 100.0,
        mib(peak),
        starved.load(Ordering::Relaxed),
        received.load(Ordering::Relaxed),
        streams as u64 * 60 * minutes as u64
    );
    flotilla_bench::abort_all(readers);
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    raise_open_files();
    match std::env::args().nth(1).as_deref() {
        Some("cycles") => cycles().await,
        Some("hold") => hold().await,
        _ => bail!("usage: soak_bench cycles|hold [options]"),
    }
}
