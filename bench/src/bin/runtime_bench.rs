//! Runtime benchmarks of issue 3, against a release `flotilla serve`.
//!
//! Usage:
//!   runtime_bench overhead  [--count 20]             agent RSS per instance
//!   runtime_bench live-view [--seconds 10]           fps and CPU per viewer
//!   runtime_bench density   [--count 20] [--image I] memory per idle instance
//!
//! Common: [--binary target/release/flotilla]

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use serde_json::Value;

use flotilla_bench::{
    ServeProcess, cpu_seconds, create_running, get_json, mem_available_mib, mjpeg_frames,
};

struct Args {
    mode: String,
    binary: PathBuf,
    count: usize,
    seconds: u64,
    image: String,
}

fn parse_args() -> anyhow::Result<Args> {
    let mut iter = std::env::args().skip(1);
    let mode = iter
        .next()
        .context("mode: overhead, live-view or density")?;
    let mut args = Args {
        mode,
        binary: PathBuf::from("target/release/flotilla"),
        count: 20,
        seconds: 10,
        image: "ubuntu:22.04".into(),
    };
    while let Some(flag) = iter.next() {
        let value = iter
            .next()
            .with_context(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--binary" => args.binary = value.into(),
            "--count" => args.count = value.parse()?,
            "--seconds" => args.seconds = value.parse()?,
            "--image" => args.image = value,
            other => bail!("unknown flag {other}"),
        }
    }
    Ok(args)
}

/// A `flotilla serve` with a config, and an HTTP client for it.
struct Bench {
    serve: ServeProcess,
    http: reqwest::Client,
    _dir: tempfile::TempDir,
}

impl Bench {
    async fn start(binary: &std::path::Path, config: &str) -> anyhow::Result<Self> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("bench.toml");
        std::fs::write(&path, config)?;
        let serve = ServeProcess::start(binary, &dir.path().join("data"), Some(&path)).await?;
        let http = reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(120))
            .build()?;
        Ok(Self {
            serve,
            http,
            _dir: dir,
        })
    }

    fn pid(&self) -> u32 {
        self.serve.child.id().expect("serve runs")
    }

    async fn create(&self, body: &str) -> anyhow::Result<Value> {
        create_running(&self.http, &self.serve.url, body, Duration::from_millis(50)).await
    }

    async fn instances(&self) -> anyhow::Result<Vec<Value>> {
        let list: Value = get_json(
            &self.http,
            format!("{}/v2/instances?limit=1000", self.serve.url),
        )
        .await?;
        Ok(list["instances"].as_array().cloned().unwrap_or_default())
    }
}

fn status_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// Pids whose command line mentions `needle`.
fn pids_mentioning(needle: &str) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|c| String::from_utf8_lossy(&c).contains(needle))
                .unwrap_or(false)
        })
        .collect()
}

async fn overhead(args: &Args) -> anyhow::Result<()> {
    let bench = Bench::start(
        &args.binary,
        "[agent]\nwarm_pool_size = 0\nmax_instances = 100\n",
    )
    .await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let pid = bench.pid();
    let base_rss = status_kib(pid, "VmRSS:");
    let mut created = Vec::new();
    for _ in 0..args.count {
        created.push(bench.create("{}").await?);
    }
    tokio::time::sleep(Duration::from_secs(12)).await; // two heartbeats of sampling
    let idle_rss = status_kib(pid, "VmRSS:");
    // One CDP client connected through each gateway, and one live-view viewer each.
    let mut sockets = Vec::new();
    for instance in &created {
        let (socket, _) = tokio_tungstenite::connect_async(
            instance["urls"]["debug"].as_str().context("debug url")?,
        )
        .await?;
        sockets.push(socket);
    }
    tokio::time::sleep(Duration::from_secs(6)).await;
    let connected_rss = status_kib(pid, "VmRSS:");
    let n = args.count as f64;
    println!("| state | serve RSS MiB | per instance KiB |");
    println!("|---|---|---|");
    println!("| no instance | {:.1} | — |", base_rss as f64 / 1024.0);
    println!(
        "| {} idle instances | {:.1} | {:.0} |",
        args.count,
        idle_rss as f64 / 1024.0,
        (idle_rss - base_rss) as f64 / n
    );
    println!(
        "| {} instances, one CDP client each through the gateway | {:.1} | {:.0} |",
        args.count,
        connected_rss as f64 / 1024.0,
        (connected_rss - base_rss) as f64 / n
    );
    drop(sockets);
    bench.serve.stop().await;
    Ok(())
}

/// Counts MJPEG frames on `url` for `seconds`.
async fn live_view(args: &Args) -> anyhow::Result<()> {
    let bench = Bench::start(
        &args.binary,
        "[agent]\nwarm_pool_size = 0\nlive_view_quality = 60\n",
    )
    .await?;
    // An animated 1280x720 page, served locally.
    let page = "<title>anim</title><body style='margin:0'><canvas id=c width=1280 height=720></canvas><script>\
        const x = c.getContext('2d'); let n = 0; (function f(){ n++; x.fillStyle = 'hsl(' + (n * 3 % 360) + ',70%,50%)'; \
        x.fillRect(0, 0, 1280, 720); x.fillStyle = '#fff'; x.font = '120px sans-serif'; x.fillText(n, 80 + n % 600, 360); \
        requestAnimationFrame(f); })();</script></body>";
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let page_url = format!("http://{}/", listener.local_addr()?);
    tokio::spawn(async move {
        let router = axum::Router::new().route(
            "/",
            axum::routing::get(move || async move { axum::response::Html(page) }),
        );
        let _ = axum::serve(listener, router).await;
    });
    let created = bench.create("{}").await?;
    let debug_port = created["debug_port"].as_u64().context("debug_port")?;
    let stream = format!(
        "http://127.0.0.1:{}/",
        created["stream_port"].as_u64().context("stream_port")?
    );
    let tabs: Value = reqwest::get(format!("http://127.0.0.1:{debug_port}/json/list"))
        .await?
        .json()
        .await?;
    let first = tabs
        .as_array()
        .and_then(|t| t.iter().find(|t| t["type"] == "page"))
        .and_then(|t| t["webSocketDebuggerUrl"].as_str())
        .context("first tab")?
        .to_owned();
    let tab = flotilla_node_agent::engine::cdp::CdpClient::connect(&first).await?;
    tab.call(
        "Page.navigate",
        serde_json::json!({"url": page_url}),
        None,
        Duration::from_secs(30),
    )
    .await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let id = created["id"].as_str().context("id")?;
    let browser_pids = pids_mentioning(id);
    let serve_pid = bench.pid();

    println!("| viewers | fps per viewer | serve CPU % of a core | browser CPU % of a core |");
    println!("|---|---|---|---|");
    for viewers in [1usize, 2, 3] {
        // Warm up the screencast, then measure.
        let _ = mjpeg_frames(stream.clone(), 2).await?;
        let (serve_before, browser_before) =
            (cpu_seconds(&[serve_pid]), cpu_seconds(&browser_pids));
        let started = Instant::now();
        let counts = futures_util::future::join_all(
            (0..viewers).map(|_| mjpeg_frames(stream.clone(), args.seconds)),
        )
        .await;
        let elapsed = started.elapsed().as_secs_f64();
        let (serve_after, browser_after) = (cpu_seconds(&[serve_pid]), cpu_seconds(&browser_pids));
        let fps: Vec<String> = counts
            .into_iter()
            .map(|c| c.map(|c| format!("{:.1}", c as f64 / elapsed)))
            .collect::<Result<_, _>>()?;
        println!(
            "| {viewers} | {} | {:.1} | {:.1} |",
            fps.join(", "),
            (serve_after - serve_before) / elapsed * 100.0,
            (browser_after - browser_before) / elapsed * 100.0
        );
    }
    bench.serve.stop().await;
    Ok(())
}

async fn density(args: &Args) -> anyhow::Result<()> {
    let config = format!(
        "[agent]\nwarm_pool_size = 0\nmax_instances = {}\n",
        args.count + 5
    );
    let bench = Bench::start(&args.binary, &config).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let available_before = mem_available_mib();
    for _ in 0..args.count {
        bench
            .create(&format!(
                r#"{{"image": "{}", "config": {{"memory_gb": 1}}}}"#,
                args.image
            ))
            .await?;
    }
    tokio::time::sleep(Duration::from_secs(15)).await; // settle, then three heartbeats
    let available_after = mem_available_mib();
    let instances = bench.instances().await?;
    let pss: f64 = instances
        .iter()
        .filter_map(|i| i["resources"]["memory_mb"].as_f64())
        .sum();
    let n = args.count as f64;
    let drop_per_instance = (available_before - available_after) / n;
    println!(
        "| image | instances | PSS per instance MiB | MemAvailable drop per instance MiB | MemAvailable before MiB | fit (MemAvailable before / drop) |"
    );
    println!("|---|---|---|---|---|---|");
    println!(
        "| {} | {} | {:.1} | {:.1} | {:.0} | {:.0} |",
        args.image,
        args.count,
        pss / n,
        drop_per_instance,
        available_before,
        available_before / drop_per_instance
    );
    bench.serve.stop().await;
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = parse_args()?;
    match args.mode.as_str() {
        "overhead" => overhead(&args).await,
        "live-view" => live_view(&args).await,
        "density" => density(&args).await,
        other => bail!("unknown mode {other}: overhead, live-view or density"),
    }
}
