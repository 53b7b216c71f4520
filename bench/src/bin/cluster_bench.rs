//! Cluster benchmarks (issue 6) with real processes: one release
//! `flotilla control` and `--agents` sim-runtime `flotilla agent`s on loopback.
//!
//!   cluster_bench [--agents 100] [--creates 10000] [--concurrency 32] [--postgres]
//!
//! 1. Placement: `--creates` concurrent `POST /v2/instances` (each placed,
//!    recorded and started on its agent over HTTP): accepted creates per
//!    second and create latency.
//! 2. Listing: `GET /v2/instances?limit=100` pages (random offsets) for 10 s at
//!    concurrency 8 with the store holding every created instance.
//!
//! `--postgres` runs the control plane on a private PostgreSQL server instead
//! of the embedded SQLite.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::bail;
use futures_util::StreamExt as _;

use flotilla_bench::{number_flag as flag, percentile};
use flotilla_testkit::{PgServer, ServeProcess};

const TOKEN: &str = "bench-cluster-token";

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let agents = flag("--agents", 100)?;
    let creates = flag("--creates", 10_000)?;
    let concurrency = flag("--concurrency", 32)?;
    let postgres = std::env::args().any(|a| a == "--postgres");
    let binary = Path::new("target/release/flotilla");
    anyhow::ensure!(
        binary.exists(),
        "build first: cargo build --release -p flotilla"
    );
    let temp = tempfile::tempdir()?;
    let pg = if postgres {
        Some(PgServer::start().await?)
    } else {
        None
    };
    let database = match &pg {
        Some(pg) => Some(pg.database().await?),
        None => None,
    };
    let cp_dir = temp.path().join("cp");
    let cp_data = cp_dir.display().to_string();
    let mut env = vec![
        ("FLOTILLA_CLUSTER_TOKEN", TOKEN.to_owned()),
        ("RUST_LOG", "warn".to_owned()),
        (
            "FLOTILLA_SCHEDULER__MAX_UTILISATION_PERCENT",
            "100".to_owned(),
        ),
    ];
    if let Some(url) = &database {
        env.push(("FLOTILLA_DATABASE_URL", url.clone()));
    }
    let env_refs: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let control = ServeProcess::start_command(
        binary,
        &["control", "--listen", "127.0.0.1:0", "--data-dir", &cp_data],
        &cp_dir,
        &env_refs,
        "control plane listening on ",
    )
    .await?;
    let base = control.api.base.clone();
    let per_agent = creates.div_ceil(agents).to_string();
    let started = Instant::now();
    let mut processes = Vec::new();
    for i in 0..agents {
        let dir = temp.path().join(format!("a{i}"));
        let data = dir.display().to_string();
        let node = format!("node-{i:03}");
        // Three ports per instance (sim agents reserve them without binding).
        let span = 3 * creates.div_ceil(agents) + 10;
        let first = 10_000 + i * span;
        let ports = format!("{first}-{}", first + span - 1);
        let env = [
            ("FLOTILLA_CLUSTER_TOKEN", TOKEN),
            ("RUST_LOG", "warn"),
            ("FLOTILLA_AGENT__RUNTIME", "sim"),
            ("FLOTILLA_AGENT__NODE_ID", node.as_str()),
            ("FLOTILLA_AGENT__MAX_INSTANCES", per_agent.as_str()),
            ("FLOTILLA_AGENT__PORT_RANGE", ports.as_str()),
            ("FLOTILLA_AGENT__WARM_POOL_SIZE", "0"),
        ];
        processes.push(
            ServeProcess::start_command(
                binary,
                &["agent", "--control-plane", &base, "--data-dir", &data],
                &dir,
                &env,
                "node agent listening on ",
            )
            .await?,
        );
    }
    let http = reqwest::Client::builder().no_proxy().build()?;
    loop {
        let nodes: serde_json::Value = http
            .get(format!("{base}/v2/nodes"))
            .send()
            .await?
            .json()
            .await?;
        let online = nodes["nodes"]
            .as_array()
            .map_or(0, |n| n.iter().filter(|n| n["status"] == "online").count());
        if online == agents {
            break;
        }
        if started.elapsed() > Duration::from_secs(300) {
            bail!("only {online} of {agents} agents online");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    println!(
        "{agents} agents online in {:.1} s; store: {}",
        started.elapsed().as_secs_f64(),
        if postgres { "PostgreSQL" } else { "SQLite" }
    );

    // Placement.
    let latencies = Arc::new(std::sync::Mutex::new(Vec::with_capacity(creates)));
    let started = Instant::now();
    let accepted: usize = futures_util::stream::iter(0..creates)
        .map(|_| {
            let (http, base, latencies) = (http.clone(), base.clone(), latencies.clone());
            async move {
                let one = Instant::now();
                let response = http
                    .post(format!("{base}/v2/instances"))
                    .body("{}")
                    .send()
                    .await;
                latencies
                    .lock()
                    .unwrap()
                    .push(one.elapsed().as_secs_f64() * 1000.0);
                usize::from(matches!(response, Ok(r) if r.status() == 201))
            }
        })
        .buffer_unordered(concurrency)
        .fold(0, |sum, ok| async move { sum + ok })
        .await;
    let took = started.elapsed().as_secs_f64();
    let latencies = latencies.lock().unwrap().clone();
    println!(
        "| placement | {agents} agents | {creates} creates at concurrency {concurrency} | {accepted} accepted | {:.0} accepted/s | p50 {:.1} ms | p99 {:.1} ms |",
        accepted as f64 / took,
        percentile(&latencies, 0.5),
        percentile(&latencies, 0.99)
    );

    // Listing.
    let pages = (accepted / 100).max(1);
    let deadline = Instant::now() + Duration::from_secs(10);
    let samples = Arc::new(std::sync::Mutex::new(Vec::new()));
    futures_util::stream::iter(0..8)
        .for_each_concurrent(8, |_| {
            let (http, base, samples) = (http.clone(), base.clone(), samples.clone());
            async move {
                while Instant::now() < deadline {
                    let offset = rand::random_range(0..pages) * 100;
                    let one = Instant::now();
                    let ok = http
                        .get(format!("{base}/v2/instances?limit=100&offset={offset}"))
                        .send()
                        .await
                        .map(|r| r.status() == 200)
                        .unwrap_or(false);
                    if ok {
                        samples
                            .lock()
                            .unwrap()
                            .push(one.elapsed().as_secs_f64() * 1000.0);
                    }
                }
            }
        })
        .await;
    let samples = samples.lock().unwrap().clone();
    println!(
        "| list page of 100 | {accepted} instances | {} | {:.0} pages/s | p50 {:.2} ms | p99 {:.2} ms |",
        if postgres { "PostgreSQL" } else { "SQLite" },
        samples.len() as f64 / 10.0,
        percentile(&samples, 0.5),
        percentile(&samples, 0.99)
    );

    for agent in processes {
        agent.signal(libc::SIGKILL);
    }
    drop(control);
    Ok(())
}
