//! Benchmarks of the session features of issue 18, against a release
//! `flotilla serve` with real Chromium (but `queue`, on the sim runtime).
//!
//!   session_bench proxy [--count 30]
//!     Three instances: one without `config.proxy`, one through a local
//!     tinyproxy with Basic auth, one through a minimal CONNECT proxy of this
//!     program (Basic auth, TCP_NODELAY), both started here; each navigation
//!     loads a page with eight 16 KB scripts from a local site, timed from
//!     `Page.navigate` to `Page.loadEventFired`. Rounds alternate between the
//!     instances.
//!
//!   session_bench profile [--count 15] [--mib 5]
//!     Fills a persistent profile with `--mib` MiB of random IndexedDB data
//!     (incompressible) and writes it back; then creates alternate between
//!     `{"profile": {"name": …}}` and `{}`, timed from `POST /v2/instances` to
//!     `running` (polled every 5 ms), each deleted afterwards. Warm pool off,
//!     so that both launch a browser.
//!
//!   session_bench queue [--clients 50] [--rounds 4]
//!     A one-slot node (sim runtime) holds an instance; `--clients` creates
//!     wait with `?wait_sec=300`. Each step deletes the running instance and
//!     times from sending the delete to the next waiting create's 201 (the
//!     delete's own answer is the baseline); the instance that create made is
//!     the next one deleted. Counts answers out of FIFO order.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use serde_json::{Value, json};

use flotilla_bench::{
    ServeProcess, Tab, free_port, get_json, number_flag, percentile, summary_row, text_flag,
    wait_running,
};

/// How often a create is polled for `running` (the profile figures depend on it).
const POLL: Duration = Duration::from_millis(5);
const PROXY_USER: &str = "bench";
const PROXY_PASSWORD: &str = "bench-password";

fn binary() -> anyhow::Result<PathBuf> {
    Ok(text_flag("--binary", "target/release/flotilla")?.into())
}

fn client() -> anyhow::Result<reqwest::Client> {
    Ok(reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(400))
        .build()?)
}

/// A serve on `config` (TOML) in a fresh data directory.
async fn serve(config: &str) -> anyhow::Result<(ServeProcess, tempfile::TempDir)> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("bench.toml");
    std::fs::write(&path, config)?;
    let serve = ServeProcess::start(&binary()?, &dir.path().join("data"), Some(&path)).await?;
    Ok((serve, dir))
}

/// A local site: `/` loads eight 16 KB scripts; `/fill` is a blank page.
async fn site() -> anyhow::Result<String> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    let scripts: String = (0..8)
        .map(|n| format!("<script src=\"/s/{n}.js\"></script>"))
        .collect();
    let page = format!("<title>bench</title><body>{scripts}</body>");
    let script = format!("var x = '{}';", "a".repeat(16 * 1024));
    let router = axum::Router::new()
        .route(
            "/",
            axum::routing::get(move || async move { axum::response::Html(page) }),
        )
        .route(
            "/fill",
            axum::routing::get(|| async { axum::response::Html("<title>fill</title>") }),
        )
        .route(
            "/s/{name}",
            axum::routing::get(move || {
                let script = script.clone();
                async move {
                    (
                        [
                            ("content-type", "text/javascript"),
                            ("cache-control", "no-store"),
                        ],
                        script,
                    )
                }
            }),
        );
    tokio::spawn(async move { axum::serve(listener, router).await });
    Ok(base)
}

async fn create(http: &reqwest::Client, base: &str, body: &Value) -> anyhow::Result<Value> {
    let response = http
        .post(format!("{base}/v2/instances"))
        .json(body)
        .send()
        .await?;
    let status = response.status();
    let value: Value = response.json().await?;
    if !status.is_success() {
        bail!("create answered {status}: {value}");
    }
    Ok(value)
}

async fn delete(http: &reqwest::Client, base: &str, id: &str) -> anyhow::Result<()> {
    http.delete(format!("{base}/v2/instances/{id}"))
        .send()
        .await?
        .error_for_status()?;
    Ok(())
}

/// Debian's tinyproxy with Basic auth on a free loopback port.
struct Tinyproxy {
    child: std::process::Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Tinyproxy {
    async fn start() -> anyhow::Result<Self> {
        let dir = tempfile::tempdir()?;
        let port = free_port();
        let config = dir.path().join("tinyproxy.conf");
        std::fs::write(
            &config,
            format!(
                "Port {port}\nListen 127.0.0.1\nTimeout 60\nUser nobody\nGroup nogroup\n\
                 LogLevel Critical\nMaxClients 100\nAllow 127.0.0.1\n\
                 BasicAuth {PROXY_USER} {PROXY_PASSWORD}\n"
            ),
        )?;
        let child = std::process::Command::new("tinyproxy")
            .args(["-d", "-c"])
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("tinyproxy starts (apt-get install tinyproxy)")?;
        let deadline = Instant::now() + Duration::from_secs(30);
        while tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_err()
        {
            if Instant::now() > deadline {
                bail!("tinyproxy does not listen");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(Self {
            child,
            port,
            _dir: dir,
        })
    }
}

impl Drop for Tinyproxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A minimal CONNECT proxy (Basic auth, TCP_NODELAY on both legs), to tell
/// the cost of chaining through an upstream proxy from the proxy's own.
async fn minimal_connect_proxy() -> anyhow::Result<u16> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    const EXPECTED: &str = "proxy-authorization: basic ymvuy2g6ymvuy2gtcgfzc3dvcmq=";
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    tokio::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") && head.len() < 8192 {
                    if client.read_exact(&mut byte).await.is_err() {
                        return;
                    }
                    head.push(byte[0]);
                }
                let head = String::from_utf8_lossy(&head).to_ascii_lowercase();
                let target = head
                    .strip_prefix("connect ")
                    .and_then(|rest| rest.split_whitespace().next())
                    .map(str::to_owned);
                let (Some(target), true) = (target, head.contains(EXPECTED)) else {
                    let _ = client
                        .write_all(b"HTTP/1.1 407 Proxy Authentication Required\r\n\r\n")
                        .await;
                    return;
                };
                let Ok(mut upstream) = tokio::net::TcpStream::connect(target).await else {
                    return;
                };
                let _ = client.set_nodelay(true);
                let _ = upstream.set_nodelay(true);
                if client
                    .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
                    .await
                    .is_ok()
                {
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
                }
            });
        }
    });
    Ok(port)
}

async fn proxy() -> anyhow::Result<()> {
    let count = number_flag("--count", 30)?;
    let tinyproxy = Tinyproxy::start().await?;
    let minimal = minimal_connect_proxy().await?;
    let site = site().await?;
    let site_authority = site.trim_start_matches("http://");
    let (serve, _dir) = serve(&format!(
        "[agent]\nwarm_pool_size = 0\n[agent.egress]\nallow = [\"{site_authority}\", \"127.0.0.1:{}\", \"127.0.0.1:{minimal}\"]\n",
        tinyproxy.port
    ))
    .await?;
    let http = client()?;
    let through = |port: u16| {
        json!({"config": {"proxy": {
            "server": format!("http://127.0.0.1:{port}"),
            "username": PROXY_USER, "password": PROXY_PASSWORD}}})
    };
    let mut tabs = Vec::new();
    for body in [json!({}), through(tinyproxy.port), through(minimal)] {
        let created = create(&http, &serve.url, &body).await?;
        let id = created["id"].as_str().context("id")?.to_owned();
        wait_running(&http, &serve.url, &id, POLL).await?;
        let tab = Tab::open(created["urls"]["debug"].as_str().context("debug")?).await?;
        tab.load(&format!("{site}/")).await?; // warm-up
        tabs.push(tab);
    }
    let mut samples = [Vec::new(), Vec::new(), Vec::new()];
    for round in 0..count {
        for (which, tab) in tabs.iter().enumerate() {
            samples[which].push(tab.load(&format!("{site}/?round={round}")).await?);
        }
    }
    println!("| path | n | p50 ms | p95 ms | mean ms | min ms | max ms |");
    println!("|---|---|---|---|---|---|---|");
    println!("{}", summary_row("direct (egress proxy only)", &samples[0]));
    println!(
        "{}",
        summary_row("through tinyproxy (config.proxy, Basic auth)", &samples[1])
    );
    println!(
        "{}",
        summary_row(
            "through a minimal CONNECT proxy (TCP_NODELAY, Basic auth)",
            &samples[2]
        )
    );
    println!(
        "p50 ratio proxied / direct: tinyproxy {:.2}, minimal proxy {:.2}",
        percentile(&samples[1], 0.5) / percentile(&samples[0], 0.5),
        percentile(&samples[2], 0.5) / percentile(&samples[0], 0.5)
    );
    drop(tabs);
    serve.stop().await;
    Ok(())
}

/// Creates a persistent instance of profile `bench`, fills the profile with
/// `mib` MiB of random (incompressible) IndexedDB records and deletes the
/// instance gracefully, which writes it back; what the page stored.
async fn fill_profile(
    http: &reqwest::Client,
    base: &str,
    site: &str,
    mib: usize,
) -> anyhow::Result<Value> {
    let created = create(
        http,
        base,
        &json!({"profile": {"name": "bench", "persist": true}}),
    )
    .await?;
    let id = created["id"].as_str().context("id")?.to_owned();
    wait_running(http, base, &id, POLL).await?;
    let tab = Tab::open(created["urls"]["debug"].as_str().context("debug")?).await?;
    tab.load(&format!("{site}/fill")).await?;
    let stored = tab
        .eval(&format!(
            "new Promise((resolve, reject) => {{
               const open = indexedDB.open('bench', 1);
               open.onupgradeneeded = () => open.result.createObjectStore('blobs');
               open.onerror = () => reject(open.error);
               open.onsuccess = () => {{
                 const tx = open.result.transaction('blobs', 'readwrite');
                 for (let i = 0; i < {mib} * 16; i++) {{
                   const chunk = new Uint8Array(65536);
                   crypto.getRandomValues(chunk);
                   tx.objectStore('blobs').put(chunk, i);
                 }}
                 tx.oncomplete = () => resolve({mib} * 16 * 65536);
                 tx.onerror = () => reject(tx.error);
               }};
             }})"
        ))
        .await?;
    drop(tab);
    delete(http, base, &id).await?;
    Ok(stored)
}

/// Waits (120 s at most) until profile `bench` has been written back; its
/// size in bytes.
async fn wait_profile_saved(http: &reqwest::Client, base: &str) -> anyhow::Result<u64> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let profile: Value = get_json(http, format!("{base}/v2/profiles/bench")).await?;
        let size = profile["size_bytes"].as_u64().unwrap_or(0);
        if size > 0 {
            return Ok(size);
        }
        if Instant::now() > deadline {
            bail!("the profile was not written back: {profile}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `count` rounds of a create without and one with the profile, each timed
/// until `running` and deleted afterwards; the samples of both.
async fn measure_profile_creates(
    http: &reqwest::Client,
    base: &str,
    count: usize,
) -> anyhow::Result<[Vec<f64>; 2]> {
    let mut samples = [Vec::new(), Vec::new()];
    let bodies = [json!({}), json!({"profile": {"name": "bench"}})];
    for _ in 0..count {
        for (which, body) in bodies.iter().enumerate() {
            let started = Instant::now();
            let created = create(http, base, body).await?;
            let id = created["id"].as_str().context("id")?.to_owned();
            wait_running(http, base, &id, POLL).await?;
            samples[which].push(started.elapsed().as_secs_f64() * 1000.0);
            delete(http, base, &id).await?;
        }
    }
    Ok(samples)
}

/// `session_bench profile` (see the module docs).
async fn profile() -> anyhow::Result<()> {
    let count = number_flag("--count", 15)?;
    let mib = number_flag("--mib", 5)?;
    let site = site().await?;
    let site_authority = site.trim_start_matches("http://");
    let (serve, _dir) = serve(&format!(
        "[agent]\nwarm_pool_size = 0\n[agent.egress]\nallow = [\"{site_authority}\"]\n"
    ))
    .await?;
    let http = client()?;
    let base = &serve.url;
    http.post(format!("{base}/v2/profiles"))
        .json(&json!({"name": "bench"}))
        .send()
        .await?
        .error_for_status()?;

    // Fill the profile: random (incompressible) IndexedDB records, then a
    // graceful delete writes it back.
    let stored = fill_profile(&http, base, &site, mib).await?;
    let size = wait_profile_saved(&http, base).await?;
    println!(
        "profile: {stored} bytes stored in IndexedDB; saved state {:.2} MiB",
        size as f64 / (1024.0 * 1024.0)
    );

    let samples = measure_profile_creates(&http, base, count).await?;
    println!("| create | n | p50 ms | p95 ms | mean ms | min ms | max ms |");
    println!("|---|---|---|---|---|---|---|");
    println!("{}", summary_row("without a profile", &samples[0]));
    println!(
        "{}",
        summary_row(
            &format!("with the {:.1} MiB profile", size as f64 / 1048576.0),
            &samples[1]
        )
    );
    println!(
        "p50 difference: {:.1} ms",
        percentile(&samples[1], 0.5) - percentile(&samples[0], 0.5)
    );
    serve.stop().await;
    Ok(())
}

/// What a waiting client reports: its index, when its create was answered,
/// and the instance it got.
type Answer = (usize, Instant, Option<String>);

/// A waiting create by client `index`, reported on `done_tx` once answered.
fn spawn_waiting_create(
    http: &reqwest::Client,
    base: &str,
    index: usize,
    done_tx: &tokio::sync::mpsc::UnboundedSender<Answer>,
) {
    let (waiter, url, done_tx) = (
        http.clone(),
        format!("{base}/v2/instances?wait_sec=300"),
        done_tx.clone(),
    );
    tokio::spawn(async move {
        let answer = waiter.post(url).json(&json!({})).send().await;
        let answered = Instant::now();
        let id = match answer {
            Ok(response) if response.status().is_success() => response
                .json::<Value>()
                .await
                .ok()
                .and_then(|v| v["id"].as_str().map(str::to_owned)),
            _ => None,
        };
        let _ = done_tx.send((index, answered, id));
    });
}

/// Waits (30 s at most) until the server counts `index + 1` creates in its
/// queue.
async fn wait_queued(http: &reqwest::Client, base: &str, index: usize) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let health: Value = get_json(http, format!("{base}/health")).await?;
        if health["create_queue"]["waiting"].as_u64() == Some(index as u64 + 1) {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("client {index} is not in the queue: {health}");
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// The samples of the queue benchmark.
#[derive(Default)]
struct QueueSamples {
    waits: Vec<f64>,
    deletes: Vec<f64>,
    out_of_order: usize,
}

/// One round: `clients` creates join the queue in index order, then the
/// `running` instance is deleted `clients` times, each time timing until the
/// next waiting create is answered (its instance is the next deleted).
async fn queue_round(
    http: &reqwest::Client,
    base: &str,
    clients: usize,
    running: &mut String,
    samples: &mut QueueSamples,
) -> anyhow::Result<()> {
    // The clients join the queue one after the other, in index order.
    let (done_tx, mut done_rx) = tokio::sync::mpsc::unbounded_channel();
    for index in 0..clients {
        spawn_waiting_create(http, base, index, &done_tx);
        // Wait until the server counts it in the queue.
        wait_queued(http, base, index).await?;
    }
    for expected in 0..clients {
        let freed = Instant::now();
        delete(http, base, running).await?;
        samples.deletes.push(freed.elapsed().as_secs_f64() * 1000.0);
        let (index, answered, id) = tokio::time::timeout(Duration::from_secs(60), done_rx.recv())
            .await
            .context("no waiting create answered within 60 s of a freed slot")?
            .context("clients gone")?;
        samples
            .waits
            .push(answered.saturating_duration_since(freed).as_secs_f64() * 1000.0);
        if index != expected {
            samples.out_of_order += 1;
        }
        *running = id.with_context(|| format!("client {index} got no instance"))?;
    }
    Ok(())
}

/// `session_bench queue` (see the module docs).
async fn queue() -> anyhow::Result<()> {
    let clients = number_flag("--clients", 50)?;
    let rounds = number_flag("--rounds", 4)?;
    let (serve, _dir) =
        serve("[agent]\nruntime = \"sim\"\nmax_instances = 1\nwarm_pool_size = 0\n").await?;
    let http = client()?;
    let base = serve.url.clone();
    let first = create(&http, &base, &json!({})).await?;
    let mut running = first["id"].as_str().context("id")?.to_owned();
    wait_running(&http, &base, &running, POLL).await?;
    let mut samples = QueueSamples::default();
    for _ in 0..rounds {
        queue_round(&http, &base, clients, &mut running, &mut samples).await?;
    }
    let QueueSamples {
        waits,
        deletes,
        out_of_order,
    } = samples;
    println!("| from `DELETE` sent | n | p50 ms | p95 ms | mean ms | min ms | max ms |");
    println!("|---|---|---|---|---|---|---|");
    println!(
        "{}",
        summary_row(
            &format!("to the next waiting create's 201 ({clients} waiting)"),
            &waits
        )
    );
    println!(
        "{}",
        summary_row("to the `DELETE`'s own answer (baseline)", &deletes)
    );
    println!(
        "p99: {:.2} ms (delete alone {:.2} ms); answered out of FIFO order: {out_of_order}",
        percentile(&waits, 0.99),
        percentile(&deletes, 0.99)
    );
    serve.stop().await;
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    match std::env::args().nth(1).as_deref() {
        Some("proxy") => proxy().await,
        Some("profile") => profile().await,
        Some("queue") => queue().await,
        _ => bail!("usage: session_bench proxy|profile|queue [options]"),
    }
}
