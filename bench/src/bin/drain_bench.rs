//! Draining a node (issue 31) with real processes: one release
//! `flotilla control` and two real-Chromium `flotilla agent`s sharing a
//! snapshot directory. For 1, 5 and 10 instances on the first node, each
//! with three tabs, `POST /v2/nodes/{id}/drain`: the time until every
//! instance runs on the other node, and for each instance how long it was
//! not running (parked, then revived elsewhere), read from its status every
//! 25 ms (a probe through the door would wake it where it was).
//!
//! Usage: drain_bench [--binary target/release/flotilla] [--sizes 1,5,10]

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use serde_json::Value;

use flotilla_bench::{get_json, percentile, text_flag};
use flotilla_testkit::ServeProcess;

const TOKEN: &str = "bench-drain-token";

async fn start(binary: &Path, temp: &Path) -> anyhow::Result<(ServeProcess, Vec<ServeProcess>)> {
    let shared = temp.join("snapshots");
    std::fs::create_dir_all(&shared)?;
    let snapshots = format!("file://{}", shared.display());
    let cp_dir = temp.join("cp");
    let control = ServeProcess::start_command(
        binary,
        &[
            "control",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            &cp_dir.display().to_string(),
        ],
        &cp_dir,
        &[
            ("FLOTILLA_CLUSTER_TOKEN", TOKEN),
            ("RUST_LOG", "warn"),
            ("FLOTILLA_SNAPSHOTS__URL", &snapshots),
            ("FLOTILLA_NODES__HEARTBEAT_INTERVAL_SEC", "0.5"),
            ("FLOTILLA_SCHEDULER__MAX_UTILISATION_PERCENT", "100"),
        ],
        "control plane listening on ",
    )
    .await?;
    let mut agents = Vec::new();
    for (node, ports) in [("drain-a", "29000-29199"), ("drain-b", "29200-29399")] {
        let dir = temp.join(node);
        agents.push(
            ServeProcess::start_command(
                binary,
                &[
                    "agent",
                    "--control-plane",
                    &control.api.base,
                    "--data-dir",
                    &dir.display().to_string(),
                ],
                &dir,
                &[
                    ("FLOTILLA_CLUSTER_TOKEN", TOKEN),
                    ("RUST_LOG", "warn"),
                    ("FLOTILLA_AGENT__NODE_ID", node),
                    ("FLOTILLA_AGENT__MAX_INSTANCES", "12"),
                    ("FLOTILLA_AGENT__PORT_RANGE", ports),
                    ("FLOTILLA_AGENT__WARM_POOL_SIZE", "0"),
                    ("FLOTILLA_SNAPSHOTS__URL", &snapshots),
                ],
                "node agent listening on ",
            )
            .await?,
        );
    }
    Ok((control, agents))
}

async fn wait_status(
    http: &reqwest::Client,
    base: &str,
    id: &str,
    want: &str,
) -> anyhow::Result<Value> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let instance = get_json(http, format!("{base}/v2/instances/{id}")).await?;
        if instance["status"] == want {
            return Ok(instance);
        }
        if Instant::now() > deadline {
            bail!("instance {id} is not {want}: {instance}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `count` running instances on drain-a, each with three tabs: their ids.
async fn instances_with_tabs(
    http: &reqwest::Client,
    base: &str,
    count: usize,
) -> anyhow::Result<Vec<String>> {
    let mut ids = Vec::new();
    for n in 0..count {
        let created: Value = http
            .post(format!("{base}/v2/instances"))
            .json(&serde_json::json!({
                "node_preference": "drain-a",
                // Ten on one node of this machine's memory.
                "config": {"memory_gb": 1},
            }))
            .send()
            .await?
            .json()
            .await?;
        let id = created["id"]
            .as_str()
            .with_context(|| format!("a create on drain-a: {created}"))?
            .to_owned();
        wait_status(http, base, &id, "running").await?;
        for tab in 0..2 {
            let page = format!("data:text/html,<title>instance {n} tab {tab}</title>");
            let answer = http
                .put(format!("{base}/v2/instances/{id}/json/new?{page}"))
                .send()
                .await?;
            if !answer.status().is_success() {
                bail!("a tab for {id}: {}", answer.status());
            }
        }
        ids.push(id);
    }
    Ok(ids)
}

/// The longest time instance `url` was not running, in ms, probing every
/// 25 ms until `stop`.
async fn longest_down(
    http: reqwest::Client,
    url: String,
    stop: tokio_util::sync::CancellationToken,
) -> f64 {
    let mut down_since: Option<Instant> = None;
    let mut longest = Duration::ZERO;
    while !stop.is_cancelled() {
        let running = match get_json(&http, url.clone()).await {
            Ok(instance) => instance["status"] == "running" || instance["status"] == "idle",
            Err(_) => false,
        };
        match (running, down_since) {
            (false, None) => down_since = Some(Instant::now()),
            (true, Some(since)) => {
                longest = longest.max(since.elapsed());
                down_since = None;
            }
            _ => {}
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    longest.as_secs_f64() * 1000.0
}

/// One round: `count` instances with three tabs on drain-a, drained to
/// drain-b. The seconds until all run there, and each instance's time not
/// running, in ms.
async fn round(
    http: &reqwest::Client,
    base: &str,
    count: usize,
) -> anyhow::Result<(f64, Vec<f64>)> {
    let ids = instances_with_tabs(http, base, count).await?;
    // Each instance's status, every 25 ms, until the drain has finished.
    let stop = tokio_util::sync::CancellationToken::new();
    let probes: Vec<_> = ids
        .iter()
        .map(|id| {
            tokio::spawn(longest_down(
                http.clone(),
                format!("{base}/v2/instances/{id}"),
                stop.clone(),
            ))
        })
        .collect();
    let started = Instant::now();
    let answer = http
        .post(format!("{base}/v2/nodes/drain-a/drain"))
        .send()
        .await?;
    if answer.status() != reqwest::StatusCode::ACCEPTED {
        bail!("drain: {}", answer.status());
    }
    let report = loop {
        let node = get_json(http, format!("{base}/v2/nodes/drain-a")).await?;
        if node["drain"]["finished"] == true {
            break node["drain"].clone();
        }
        if started.elapsed() > Duration::from_secs(600) {
            bail!("the drain did not finish: {node}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let took = started.elapsed().as_secs_f64();
    // Let the probes see the last instance running.
    tokio::time::sleep(Duration::from_millis(100)).await;
    stop.cancel();
    let mut unreachable = Vec::new();
    for probe in probes {
        unreachable.push(probe.await?);
    }
    let moved = report["moved"].as_array().map_or(0, Vec::len);
    if moved != count {
        bail!("{moved} of {count} moved: {report}");
    }
    // Back to where the next round starts: nothing on either node.
    for id in &ids {
        http.delete(format!("{base}/v2/instances/{id}?force=true"))
            .send()
            .await?;
    }
    http.post(format!("{base}/v2/nodes/drain-a/uncordon"))
        .send()
        .await?;
    Ok((took, unreachable))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let binary = std::path::PathBuf::from(text_flag("--binary", "target/release/flotilla")?);
    let sizes: Vec<usize> = text_flag("--sizes", "1,5,10")?
        .split(',')
        .map(|n| n.trim().parse())
        .collect::<Result<_, _>>()
        .context("--sizes: numbers, comma-separated")?;
    let temp = tempfile::Builder::new()
        .prefix("flotilla-drain-bench-")
        .tempdir()?;
    let (control, _agents) = start(&binary, temp.path()).await?;
    let base = control.api.base.clone();
    let http = reqwest::Client::new();
    let started = Instant::now();
    loop {
        let nodes = get_json(&http, format!("{base}/v2/nodes")).await?;
        let online = nodes["nodes"]
            .as_array()
            .map_or(0, |n| n.iter().filter(|n| n["status"] == "online").count());
        if online == 2 {
            break;
        }
        if started.elapsed() > Duration::from_secs(60) {
            bail!("the agents did not come online: {nodes}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!(
        "| instances (3 tabs each) | drain, s | not running per instance, p50 ms | longest ms |"
    );
    println!("|---|---|---|---|");
    for count in sizes {
        let (took, unreachable) = round(&http, &base, count).await?;
        let longest = unreachable.iter().copied().fold(0.0, f64::max);
        println!(
            "| {count} | {took:.2} | {:.0} | {longest:.0} |",
            percentile(&unreachable, 0.5)
        );
    }
    Ok(())
}
