//! Cluster benchmarks (issue 6) with real processes: one release
//! `flotilla control` and `--agents` sim-runtime `flotilla agent`s on loopback.
//!
//!   cluster_bench [--agents 100] [--creates 10000] [--concurrency 32] [--postgres]
//!   cluster_bench --replicas 1,2 [--agents 20] [--creates 2000] [--concurrency 32]
//!
//! 1. Placement: `--creates` concurrent `POST /v2/instances` (each placed,
//!    recorded and started on its agent over HTTP): accepted creates per
//!    second and create latency.
//! 2. Listing: `GET /v2/instances?limit=100` pages (random offsets) for 10 s at
//!    concurrency 8 with the store holding every created instance.
//! 3. Reading one: `GET /v2/instances/{id}` of random created instances for
//!    10 s at concurrency 8.
//!
//! `--postgres` runs the control plane on a private PostgreSQL server instead
//! of the embedded SQLite. `--replicas 1,2` runs the three phases once per
//! count given, in this one run: that many control planes on one PostgreSQL
//! (a fresh database each time) behind nginx (round-robin, each request to
//! the next replica), agents registering through it, every request through
//! it, as behind a Kubernetes Service.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::bail;
use futures_util::StreamExt as _;

use flotilla_bench::{cpu_seconds, get_json, number_flag as flag, percentile};
use flotilla_testkit::{Balancer, PgServer, ServeProcess};

const TOKEN: &str = "bench-cluster-token";

/// Starts a control plane in `temp/<name>` (on PostgreSQL at `database` if
/// given).
async fn start_control(
    binary: &Path,
    (temp, name): (&Path, &str),
    database: Option<&String>,
) -> anyhow::Result<ServeProcess> {
    let cp_dir = temp.join(name);
    let cp_data = cp_dir.display().to_string();
    let mut env = vec![
        ("FLOTILLA_CLUSTER_TOKEN", TOKEN.to_owned()),
        ("RUST_LOG", "warn".to_owned()),
        (
            "FLOTILLA_SCHEDULER__MAX_UTILISATION_PERCENT",
            "100".to_owned(),
        ),
    ];
    if let Some(url) = database {
        env.push(("FLOTILLA_DATABASE_URL", url.clone()));
    }
    let env_refs: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    ServeProcess::start_command(
        binary,
        &["control", "--listen", "127.0.0.1:0", "--data-dir", &cp_data],
        &cp_dir,
        &env_refs,
        "control plane listening on ",
    )
    .await
}

/// Starts `agents` sim-runtime agents of the control plane at `base`, with
/// room for `creates` instances among them (`per_agent` each).
async fn start_agents(
    binary: &Path,
    temp: &Path,
    base: &str,
    agents: usize,
    creates: usize,
    per_agent: &str,
) -> anyhow::Result<Vec<ServeProcess>> {
    let mut processes = Vec::new();
    for i in 0..agents {
        let dir = temp.join(format!("a{i}"));
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
            ("FLOTILLA_AGENT__MAX_INSTANCES", per_agent),
            ("FLOTILLA_AGENT__PORT_RANGE", ports.as_str()),
            ("FLOTILLA_AGENT__WARM_POOL_SIZE", "0"),
        ];
        processes.push(
            ServeProcess::start_command(
                binary,
                &["agent", "--control-plane", base, "--data-dir", &data],
                &dir,
                &env,
                "node agent listening on ",
            )
            .await?,
        );
    }
    Ok(processes)
}

/// Waits (300 s from `started` at most) until all `agents` are online.
async fn wait_online(
    http: &reqwest::Client,
    base: &str,
    agents: usize,
    started: Instant,
) -> anyhow::Result<()> {
    loop {
        let nodes: serde_json::Value = get_json(http, format!("{base}/v2/nodes")).await?;
        let online = nodes["nodes"]
            .as_array()
            .map_or(0, |n| n.iter().filter(|n| n["status"] == "online").count());
        if online == agents {
            return Ok(());
        }
        if started.elapsed() > Duration::from_secs(300) {
            bail!("only {online} of {agents} agents online");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Phase 1: `creates` concurrent creates; prints the placement row and
/// returns how many were accepted.
async fn measure_placement(
    http: &reqwest::Client,
    base: &str,
    agents: usize,
    creates: usize,
    concurrency: usize,
) -> usize {
    let latencies = Arc::new(std::sync::Mutex::new(Vec::with_capacity(creates)));
    let started = Instant::now();
    let accepted: usize = futures_util::stream::iter(0..creates)
        .map(|_| {
            let (http, base, latencies) = (http.clone(), base.to_owned(), latencies.clone());
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
    accepted
}

/// Phase 2: random pages of 100 for 10 s at concurrency 8; prints the row.
async fn measure_listing(http: &reqwest::Client, base: &str, accepted: usize, postgres: bool) {
    let pages = (accepted / 100).max(1);
    let deadline = Instant::now() + Duration::from_secs(10);
    let samples = Arc::new(std::sync::Mutex::new(Vec::new()));
    futures_util::stream::iter(0..8)
        .for_each_concurrent(8, |_| {
            let (http, base, samples) = (http.clone(), base.to_owned(), samples.clone());
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
}

/// Phase 3: `GET /v2/instances/{id}` of random instances for 10 s at
/// concurrency 8; prints the row and returns how many were answered.
async fn measure_get(http: &reqwest::Client, base: &str, setup: &str) -> anyhow::Result<usize> {
    let list: serde_json::Value = get_json(http, format!("{base}/v2/instances?limit=1000")).await?;
    let ids: Arc<Vec<String>> = Arc::new(
        list["instances"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|instance| instance["id"].as_str().map(str::to_owned))
            .collect(),
    );
    anyhow::ensure!(!ids.is_empty(), "no instance to read");
    let deadline = Instant::now() + Duration::from_secs(10);
    let samples = Arc::new(std::sync::Mutex::new(Vec::new()));
    futures_util::stream::iter(0..8)
        .for_each_concurrent(8, |_| {
            let (http, base, ids, samples) =
                (http.clone(), base.to_owned(), ids.clone(), samples.clone());
            async move {
                while Instant::now() < deadline {
                    let id = &ids[rand::random_range(0..ids.len())];
                    let one = Instant::now();
                    let ok = http
                        .get(format!("{base}/v2/instances/{id}"))
                        .send()
                        .await
                        .is_ok_and(|r| r.status() == 200);
                    if ok {
                        let took = one.elapsed().as_secs_f64() * 1000.0;
                        samples.lock().unwrap().push(took);
                    }
                }
            }
        })
        .await;
    let samples = samples.lock().unwrap().clone();
    println!(
        "| get one instance | {setup} | {:.0} requests/s | p50 {:.2} ms | p99 {:.2} ms |",
        samples.len() as f64 / 10.0,
        percentile(&samples, 0.5),
        percentile(&samples, 0.99)
    );
    Ok(samples.len())
}

/// One run of the three phases with `replicas` control planes on a fresh
/// database of `pg`, behind nginx.
async fn run_replicas(
    binary: &Path,
    pg: &PgServer,
    replicas: usize,
    (agents, creates, concurrency): (usize, usize, usize),
) -> anyhow::Result<()> {
    let temp = tempfile::tempdir()?;
    let database = pg.database().await?;
    let mut controls = Vec::new();
    for i in 0..replicas {
        let name = format!("cp{i}");
        controls.push(start_control(binary, (temp.path(), &name), Some(&database)).await?);
    }
    let ports: Vec<u16> = controls
        .iter()
        .map(|control| control.api.base.rsplit(':').next().unwrap_or("0").parse())
        .collect::<Result<_, _>>()?;
    let balancer = Balancer::start(flotilla_bench::free_port(), &ports);
    let base = balancer.url();
    flotilla_bench::wait_listening(port_of(&base)?, "nginx").await?;
    let per_agent = creates.div_ceil(agents).to_string();
    let started = Instant::now();
    let processes = start_agents(binary, temp.path(), &base, agents, creates, &per_agent).await?;
    let http = reqwest::Client::builder().no_proxy().build()?;
    wait_online(&http, &base, agents, started).await?;
    println!("{replicas} control plane(s) behind nginx, {agents} agents online");
    // What the control planes spent, all together, on each request.
    let pids: Vec<u32> = controls.iter().map(ServeProcess::pid).collect();
    let before = cpu_seconds(&pids);
    let accepted = measure_placement(&http, &base, agents, creates, concurrency).await;
    let placing = cpu_seconds(&pids) - before;
    measure_listing(&http, &base, accepted, true).await;
    let before = cpu_seconds(&pids);
    let setup = format!("{replicas} replica(s), {accepted} instances");
    let answered = measure_get(&http, &base, &setup).await?;
    let reading = cpu_seconds(&pids) - before;
    println!(
        "| control planes' CPU | {replicas} replica(s) | {:.2} ms per create | {:.3} ms per get |",
        placing * 1000.0 / accepted.max(1) as f64,
        reading * 1000.0 / answered.max(1) as f64
    );
    for agent in processes {
        agent.signal(libc::SIGKILL);
    }
    Ok(())
}

fn port_of(url: &str) -> anyhow::Result<u16> {
    Ok(url.rsplit(':').next().unwrap_or_default().parse()?)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    if let Some(replicas) = replicas_flag()? {
        let binary = Path::new("target/release/flotilla");
        anyhow::ensure!(
            binary.exists(),
            "build first: cargo build --release -p flotilla"
        );
        let sizes = (
            flag("--agents", 20)?,
            flag("--creates", 2000)?,
            flag("--concurrency", 32)?,
        );
        let pg = PgServer::start().await?;
        for count in replicas {
            run_replicas(binary, &pg, count, sizes).await?;
        }
        return Ok(());
    }
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
    let control = start_control(binary, (temp.path(), "cp"), database.as_ref()).await?;
    let base = control.api.base.clone();
    let per_agent = creates.div_ceil(agents).to_string();
    let started = Instant::now();
    let processes = start_agents(binary, temp.path(), &base, agents, creates, &per_agent).await?;
    let http = reqwest::Client::builder().no_proxy().build()?;
    wait_online(&http, &base, agents, started).await?;
    println!(
        "{agents} agents online in {:.1} s; store: {}",
        started.elapsed().as_secs_f64(),
        if postgres { "PostgreSQL" } else { "SQLite" }
    );
    let accepted = measure_placement(&http, &base, agents, creates, concurrency).await;
    measure_listing(&http, &base, accepted, postgres).await;
    let store = if postgres { "PostgreSQL" } else { "SQLite" };
    measure_get(&http, &base, &format!("1 control plane, {store}")).await?;
    for agent in processes {
        agent.signal(libc::SIGKILL);
    }
    drop(control);
    Ok(())
}

/// `--replicas 1,2`: the counts of control planes to run, in order.
fn replicas_flag() -> anyhow::Result<Option<Vec<usize>>> {
    let args: Vec<String> = std::env::args().collect();
    let Some(at) = args.iter().position(|arg| arg == "--replicas") else {
        return Ok(None);
    };
    let list = args
        .get(at + 1)
        .ok_or_else(|| anyhow::anyhow!("--replicas needs a list such as 1,2"))?;
    let counts = list
        .split(',')
        .map(|count| count.trim().parse::<usize>())
        .collect::<Result<Vec<_>, _>>()?;
    anyhow::ensure!(
        counts.iter().all(|&count| count >= 1),
        "--replicas counts are 1 or more"
    );
    Ok(Some(counts))
}
