//! The front door against the instance's own ports, in one run (issue 16).
//!
//! Usage: door_bench [--binary target/release/flotilla] [--count 2000]
//!                   [--connections 200] [--seconds 5]
//!
//! One `flotilla serve` (authentication on, a release build) and one instance;
//! every measure alternates between the direct port and the door:
//! - CDP round trip: `Runtime.evaluate("1+1")` on a page session, in blocks of
//!   100 alternating between a client on `ws://…:<debug_port>/devtools/browser/…`
//!   and one on `ws://…/v2/instances/{id}/cdp`;
//! - a ~5 MB screenshot: `GET /screenshot` of a page of random pixels on the
//!   http port and through the door;
//! - live-view frames per second of an animated page, MJPEG, for `--seconds`;
//! - serve's RSS per open, idle CDP connection (the door and the agent's
//!   gateway share the serve process; the difference is the door's).

use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use futures_util::StreamExt;
use serde_json::{Value, json};

use flotilla_bench::{
    ServeProcess, client_with_key, create_running, get_json, number_flag, percentile, text_flag,
};
use flotilla_node_agent::engine::cdp::CdpClient;

const KEY: &str = "door-bench-key";

fn rss_kib(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .unwrap_or(0.0)
}

/// A page session on `url` (a browser-target WebSocket URL).
async fn page_session(url: &str, page: &str) -> anyhow::Result<(CdpClient, String)> {
    let client = CdpClient::connect(url).await?;
    let (_, session) = client.open_tab(page, Duration::from_secs(60)).await?;
    Ok((client, session))
}

async fn round_trip(client: &CdpClient, session: &str) -> anyhow::Result<f64> {
    let started = Instant::now();
    let result = client
        .call(
            "Runtime.evaluate",
            json!({"expression": "1+1", "returnByValue": true}),
            Some(session),
            Duration::from_secs(30),
        )
        .await?;
    if result["result"]["value"] != 2 {
        bail!("1+1 = {result}");
    }
    Ok(started.elapsed().as_secs_f64() * 1000.0)
}

/// Frames of an MJPEG stream in `seconds`.
async fn fps(http: &reqwest::Client, url: &str, seconds: u64) -> anyhow::Result<f64> {
    let response = http.get(url).send().await?.error_for_status()?;
    let mut body = response.bytes_stream();
    let started = Instant::now();
    let mut frames = 0usize;
    let boundary = b"--flotillaframe";
    let mut tail: Vec<u8> = Vec::new();
    while started.elapsed() < Duration::from_secs(seconds) {
        let Ok(Some(chunk)) = tokio::time::timeout(Duration::from_secs(5), body.next()).await
        else {
            break;
        };
        tail.extend_from_slice(&chunk?);
        let mut at = 0;
        while let Some(found) = tail[at..]
            .windows(boundary.len())
            .position(|w| w == boundary)
        {
            frames += 1;
            at += found + boundary.len();
        }
        tail.drain(..at.max(tail.len().saturating_sub(boundary.len())));
    }
    Ok(frames as f64 / started.elapsed().as_secs_f64())
}

async fn screenshot(http: &reqwest::Client, url: &str) -> anyhow::Result<(f64, usize)> {
    let started = Instant::now();
    let bytes = http
        .get(url)
        .send()
        .await?
        .error_for_status()?
        .bytes()
        .await?;
    Ok((started.elapsed().as_secs_f64() * 1000.0, bytes.len()))
}

fn row(name: &str, samples: &[f64]) -> String {
    flotilla_bench::p50_p99_row(name, samples, flotilla_bench::mean(samples))
}

/// The instance under test, reached directly and through the door.
struct Target<'a> {
    http: &'a reqwest::Client,
    created: &'a Value,
    door_base: &'a str,
    token: &'a str,
    direct_client: &'a CdpClient,
    direct_session: &'a str,
    door_client: &'a CdpClient,
    door_session: &'a str,
}

/// CDP round trips: a warm-up, then blocks of 100 alternating between the
/// debug port and the door until `count` each; prints the table.
async fn measure_round_trips(target: &Target<'_>, count: usize) -> anyhow::Result<()> {
    let (direct_client, direct_session) = (target.direct_client, target.direct_session);
    let (door_client, door_session) = (target.door_client, target.door_session);
    for _ in 0..200 {
        round_trip(direct_client, direct_session).await?;
        round_trip(door_client, door_session).await?;
    }
    let (mut via_port, mut via_door) = (Vec::new(), Vec::new());
    while via_port.len() < count {
        for _ in 0..100 {
            via_port.push(round_trip(direct_client, direct_session).await?);
        }
        for _ in 0..100 {
            via_door.push(round_trip(door_client, door_session).await?);
        }
    }
    println!("\nCDP round trip (Runtime.evaluate 1+1), ms\n");
    println!("| path | n | p50 | p99 | mean |");
    println!("|---|---|---|---|---|");
    println!("{}", row("instance debug port", &via_port));
    println!("{}", row("front door", &via_door));
    println!(
        "\np50 added by the door: {:.3} ms",
        percentile(&via_door, 0.5) - percentile(&via_port, 0.5)
    );
    Ok(())
}

/// Shows a page of random pixels filling 1600x1000 on the direct session,
/// closes the door's page; the id of the noise tab.
async fn open_noise_tab(target: &Target<'_>) -> anyhow::Result<String> {
    let noise = "data:text/html,<body style='margin:0'><canvas id=c width=1600 height=1000></canvas><script>\
        const c=document.getElementById('c').getContext('2d');const d=c.createImageData(1600,1000);\
        for(let i=0;i<d.data.length;i++)d.data[i]=Math.random()*256;c.putImageData(d,0,0);</script>";
    let timeout = Duration::from_secs(60);
    target
        .direct_client
        .call(
            "Emulation.setDeviceMetricsOverride",
            json!({"width": 1600, "height": 1000, "deviceScaleFactor": 1, "mobile": false}),
            Some(target.direct_session),
            timeout,
        )
        .await?;
    target
        .direct_client
        .navigate(target.direct_session, noise, timeout)
        .await?;
    target
        .door_client
        .call("Page.close", json!({}), Some(target.door_session), timeout)
        .await
        .ok();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (door_base, token) = (target.door_base, target.token);
    let tabs: Value = get_json(target.http, format!("{door_base}/tabs?token={token}")).await?;
    Ok(tabs
        .as_array()
        .and_then(|tabs| {
            tabs.iter()
                .find(|t| t["url"].as_str().is_some_and(|u| u.starts_with("data:")))
        })
        .and_then(|t| t["id"].as_str())
        .context("the noise tab")?
        .to_owned())
}

/// A large screenshot (the noise tab), ten times each way; prints the table.
async fn measure_screenshots(target: &Target<'_>) -> anyhow::Result<()> {
    let tab = open_noise_tab(target).await?;
    let (http, door_base, token) = (target.http, target.door_base, target.token);
    let http_port = target.created["http_port"].as_u64().context("http_port")?;
    let direct_shot = format!("http://127.0.0.1:{http_port}/screenshot?tab={tab}&token={token}");
    let door_shot = format!("{door_base}/screenshot?tab={tab}&token={token}");
    let (mut shots_port, mut shots_door, mut size) = (Vec::new(), Vec::new(), 0);
    for _ in 0..10 {
        let (ms, bytes) = screenshot(http, &direct_shot).await?;
        shots_port.push(ms);
        size = bytes;
        shots_door.push(screenshot(http, &door_shot).await?.0);
    }
    println!(
        "\nScreenshot of {:.1} MB (GET /screenshot), ms\n",
        size as f64 / 1e6
    );
    println!("| path | n | p50 | p99 | mean |");
    println!("|---|---|---|---|---|");
    println!("{}", row("instance http port", &shots_port));
    println!("{}", row("front door", &shots_door));
    Ok(())
}

/// Live view of an animated page, two runs of `seconds` each way; prints the
/// table.
async fn measure_live_view(target: &Target<'_>, seconds: u64) -> anyhow::Result<()> {
    let animated = "data:text/html,<body style='margin:0'><div id=d style='width:100vw;height:100vh'></div><script>\
        let n=0;(function f(){n++;d.style.background='hsl('+(n*7%360)+',80%,50%)';d.textContent=n;requestAnimationFrame(f);})();</script>";
    let timeout = Duration::from_secs(60);
    target
        .direct_client
        .navigate(target.direct_session, animated, timeout)
        .await?;
    let (http, door_base, token) = (target.http, target.door_base, target.token);
    let stream_port = target.created["stream_port"]
        .as_u64()
        .context("stream_port")?;
    let direct_stream = format!("http://127.0.0.1:{stream_port}/?token={token}");
    let door_stream = format!("{door_base}/stream?token={token}");
    println!("\nLive view (MJPEG, animated page), frames per second over {seconds} s\n");
    println!("| path | run 1 | run 2 |");
    println!("|---|---|---|");
    let mut port_fps = Vec::new();
    let mut door_fps = Vec::new();
    for _ in 0..2 {
        port_fps.push(fps(http, &direct_stream, seconds).await?);
        door_fps.push(fps(http, &door_stream, seconds).await?);
    }
    println!(
        "| instance stream port | {:.1} | {:.1} |",
        port_fps[0], port_fps[1]
    );
    println!("| front door | {:.1} | {:.1} |", door_fps[0], door_fps[1]);
    Ok(())
}

/// Memory per idle CDP connection: a fresh serve for each path, twice each;
/// prints the table.
async fn measure_connection_memory(
    binary: &std::path::Path,
    connections: usize,
) -> anyhow::Result<()> {
    println!(
        "\nserve RSS per open, idle CDP connection ({connections} connections, fresh serve each), KiB\n"
    );
    println!("| path | RSS growth per connection |");
    println!("|---|---|");
    for door_path in [false, true, false, true] {
        print_connection_rss_growth(binary, door_path, connections).await?;
    }
    Ok(())
}

/// On a fresh serve, opens `connections` idle CDP connections through the door
/// (`door_path`) or the debug port and prints serve's RSS growth per one.
async fn print_connection_rss_growth(
    binary: &std::path::Path,
    door_path: bool,
    connections: usize,
) -> anyhow::Result<()> {
    let (serve, created, _dir) = start_with_instance(binary).await?;
    let pid = serve.child.id().context("serve pid")?;
    let direct = created["urls"]["debug"].as_str().context("debug")?;
    let token = direct.split_once("?token=").context("token")?.1;
    let door = format!(
        "{}/v2/instances/{}/cdp?token={token}",
        serve.url.replacen("http://", "ws://", 1),
        created["id"].as_str().context("id")?
    );
    let url = if door_path { door } else { direct.to_owned() };
    // Warm the allocator and the runtime with a few connections first.
    let mut warm = Vec::new();
    for _ in 0..10 {
        warm.push(tokio_tungstenite::connect_async(url.as_str()).await?.0);
    }
    drop(warm);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = rss_kib(pid);
    let mut open = Vec::new();
    for _ in 0..connections {
        open.push(tokio_tungstenite::connect_async(url.as_str()).await?.0);
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = rss_kib(pid);
    let name = if door_path {
        "front door"
    } else {
        "instance debug port"
    };
    println!("| {name} | {:.1} |", (after - before) / connections as f64);
    drop(open);
    serve.stop().await;
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let binary: std::path::PathBuf = text_flag("--binary", "target/release/flotilla")?.into();
    let count = number_flag("--count", 2000)?;
    let connections = number_flag("--connections", 200)?;
    let seconds = number_flag("--seconds", 5)? as u64;
    let http = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(120))
        .build()?;
    let (serve, created, _dir) = start_with_instance(&binary).await?;
    let id = created["id"].as_str().context("id")?.to_owned();
    let direct = created["urls"]["debug"]
        .as_str()
        .context("debug")?
        .to_owned();
    let token = direct.split_once("?token=").context("token")?.1.to_owned();
    let door_base = format!("{}/v2/instances/{id}", serve.url);
    let door = format!(
        "{}/cdp?token={token}",
        door_base.replacen("http://", "ws://", 1)
    );
    let (direct_client, direct_session) = page_session(&direct, "about:blank").await?;
    let (door_client, door_session) = page_session(&door, "about:blank").await?;
    let target = Target {
        http: &http,
        created: &created,
        door_base: &door_base,
        token: &token,
        direct_client: &direct_client,
        direct_session: &direct_session,
        door_client: &door_client,
        door_session: &door_session,
    };
    measure_round_trips(&target, count).await?;
    measure_screenshots(&target).await?;
    measure_live_view(&target, seconds).await?;
    drop(direct_client);
    drop(door_client);

    serve.stop().await;
    measure_connection_memory(&binary, connections).await?;
    Ok(())
}

/// A release serve with authentication on and one running instance (its
/// create answer).
async fn start_with_instance(
    binary: &std::path::Path,
) -> anyhow::Result<(ServeProcess, Value, tempfile::TempDir)> {
    let dir = tempfile::Builder::new()
        .prefix("flotilla-door-bench-")
        .tempdir()?;
    let config = dir.path().join("flotilla.toml");
    std::fs::write(
        &config,
        format!(
            "auth_enabled = true\napi_keys = [\"{KEY}\"]\n[http]\nbind_address = \"127.0.0.1:0\"\n[agent]\nwarm_pool_size = 0\n"
        ),
    )?;
    let serve = ServeProcess::start(binary, &dir.path().join("data"), Some(&config)).await?;
    let keyed = client_with_key(KEY)?;
    let created = create_running(&keyed, &serve.url, "{}", Duration::from_millis(50)).await?;
    Ok((serve, created, dir))
}
