//! The live view of a Firefox instance (issue 47) beside a Chromium one, in
//! one run of one release `flotilla serve`.
//!
//! Each instance shows a local 1280×720 canvas animated on every
//! `requestAnimationFrame` (every frame differs), opened by a WebDriver
//! session on the instance's own port. A WebSocket viewer takes control and
//! resizes the viewport to 1280×720, so both engines lay the page out
//! alike; then one MJPEG viewer reads frames as fast as it can for
//! `--seconds`, and the CPU of the serve process and of the instance's
//! processes is read from `/proc`. Three rows:
//! - Chromium, its WebDriver session on (the baseline: Chromium's own
//!   screencast, `Page.startScreencast`);
//! - Firefox, its WebDriver session on: the view rides on the session's
//!   BiDi socket (`browsingContext.captureScreenshot` as JPEG);
//! - Firefox after the session ended: the view's own BiDi session.
//!
//! Usage: firefox_live_bench [--binary target/release/flotilla] [--seconds 10]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;

use flotilla_bench::{
    ServeProcess, cpu_seconds, create_running, mjpeg_frames, number_flag, serve_html, text_flag,
};

const PAGE: &str = "<title>anim</title><body style='margin:0'><canvas id=c width=1280 height=720></canvas><script>\
    const x = c.getContext('2d'); let n = 0; (function f(){ n++; x.fillStyle = 'hsl(' + (n * 3 % 360) + ',70%,50%)'; \
    x.fillRect(0, 0, 1280, 720); x.fillStyle = '#fff'; x.font = '120px sans-serif'; x.fillText(n, 80 + n % 600, 360); \
    requestAnimationFrame(f); })();</script></body>";

/// One row: an image, the WebDriver browser name, whether the session
/// stays on while frames are counted.
struct Case {
    label: &'static str,
    image: &'static str,
    browser_name: &'static str,
    session_on: bool,
}

const CASES: [Case; 3] = [
    Case {
        label: "Chromium, WebDriver session on (screencast)",
        image: "chromium",
        browser_name: "chrome",
        session_on: true,
    },
    Case {
        label: "Firefox, WebDriver session on (view on its BiDi socket)",
        image: "firefox",
        browser_name: "firefox",
        session_on: true,
    },
    Case {
        label: "Firefox, no client (view's own BiDi session)",
        image: "firefox",
        browser_name: "firefox",
        session_on: false,
    },
];

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let binary = PathBuf::from(text_flag("--binary", "target/release/flotilla")?);
    let seconds = number_flag("--seconds", 10)? as u64;
    let site = serve_html(PAGE.to_owned()).await?;
    let dir = tempfile::Builder::new()
        .prefix("flotilla-firefox-live-")
        .tempdir()?;
    let authority = site.trim_start_matches("http://");
    let config = format!(
        "[agent]\nwarm_pool_size = 0\nlive_view_quality = 60\n[agent.egress]\nallow = [\"{authority}\"]\n"
    );
    let config_path = dir.path().join("bench.toml");
    std::fs::write(&config_path, config)?;
    let serve = ServeProcess::start(&binary, &dir.path().join("data"), Some(&config_path))
        .await
        .with_context(|| format!("starting {}", binary.display()))?;
    println!("live view, one MJPEG viewer, {seconds} s each, JPEG quality 60\n");
    println!("| | frame | fps | serve CPU % of a core | instance CPU % of a core |");
    println!("|---|---|---|---|---|");
    for case in &CASES {
        let row = measure(&serve, case, &format!("{site}/"), seconds).await?;
        println!("| {} | {row} |", case.label);
    }
    serve.stop().await;
    Ok(())
}

/// One case's cells: frame size, fps, serve CPU, instance CPU.
async fn measure(
    serve: &ServeProcess,
    case: &Case,
    page: &str,
    seconds: u64,
) -> anyhow::Result<String> {
    let http = reqwest::Client::builder().no_proxy().build()?;
    let body = json!({"image": case.image}).to_string();
    let created = create_running(&http, &serve.url, &body, Duration::from_millis(50)).await?;
    let id = created["id"].as_str().context("id")?.to_owned();
    let port = created["http_port"].as_u64().context("http_port")?;
    let sessions = format!("http://127.0.0.1:{port}/webdriver/session");
    let capabilities = json!({"capabilities": {"browserName": case.browser_name}});
    let started: Value = http
        .post(&sessions)
        .json(&capabilities)
        .send()
        .await?
        .json()
        .await?;
    let session = format!("{sessions}/{id}");
    if started["value"]["sessionId"].is_null() {
        bail!("no WebDriver session: {started}");
    }
    http.post(format!("{session}/url"))
        .json(&json!({"url": page}))
        .send()
        .await?;
    let stream = format!(
        "http://127.0.0.1:{}/",
        created["stream_port"].as_u64().context("stream_port")?
    );
    let viewer = sized_viewer(&stream).await?;
    if !case.session_on {
        http.delete(&session).send().await?;
    }
    // Let the view settle on its session, then measure.
    let _ = mjpeg_frames(stream.clone(), 2).await?;
    let frame = frame_size(&http, &stream).await?;
    let (pids, serve_pid) = (instance_pids(&id), serve.child.id().context("serve runs")?);
    let (serve_before, instance_before) = (cpu_seconds(&[serve_pid]), cpu_seconds(&pids));
    let clock = Instant::now();
    let frames = mjpeg_frames(stream, seconds).await?;
    let elapsed = clock.elapsed().as_secs_f64();
    let (serve_after, instance_after) = (cpu_seconds(&[serve_pid]), cpu_seconds(&pids));
    drop(viewer);
    http.delete(format!("{}/v2/instances/{id}", serve.url))
        .send()
        .await?;
    Ok(format!(
        "{frame} | {:.1} | {:.1} | {:.1}",
        frames as f64 / elapsed,
        (serve_after - serve_before) / elapsed * 100.0,
        (instance_after - instance_before) / elapsed * 100.0
    ))
}

type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// A WebSocket viewer holding control, once the page lays out at 1280×720.
async fn sized_viewer(stream: &str) -> anyhow::Result<Socket> {
    let url = format!("{}ws", stream.replacen("http://", "ws://", 1));
    let (mut socket, _) = tokio_tungstenite::connect_async(&url).await?;
    for message in [
        json!({"type": "control", "take": true}),
        json!({"type": "resize", "width": 1280, "height": 720}),
    ] {
        socket.send(Message::text(message.to_string())).await?;
    }
    let sized = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(message) = socket.next().await {
            let Message::Text(text) = message? else {
                continue;
            };
            let state: Value = serde_json::from_str(&text)?;
            if state["viewport"] == json!({"width": 1280.0, "height": 720.0}) {
                return Ok(());
            }
        }
        bail!("the live view closed")
    })
    .await;
    sized.context("the viewport resized to 1280x720")??;
    Ok(socket)
}

/// The newest frame's size in pixels (from its JPEG header).
async fn frame_size(http: &reqwest::Client, stream: &str) -> anyhow::Result<String> {
    let jpeg = http
        .get(format!("{stream}frame.jpg"))
        .send()
        .await?
        .bytes()
        .await?;
    let mut decoder = jpeg_decoder::Decoder::new(jpeg.as_ref());
    decoder.read_info()?;
    let info = decoder.info().context("a JPEG")?;
    Ok(format!("{}×{}", info.width, info.height))
}

/// The processes of instance `id` (its sandboxes and all below them).
fn instance_pids(id: &str) -> Vec<u32> {
    let all: Vec<u32> = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse().ok())
        .collect();
    let mentions = |pid: &u32| {
        std::fs::read(format!("/proc/{pid}/cmdline"))
            .is_ok_and(|line| String::from_utf8_lossy(&line).contains(id))
    };
    let mut tree: Vec<u32> = all.iter().copied().filter(mentions).collect();
    loop {
        let children: Vec<u32> = all
            .iter()
            .copied()
            .filter(|pid| !tree.contains(pid) && parent(*pid).is_some_and(|p| tree.contains(&p)))
            .collect();
        if children.is_empty() {
            return tree;
        }
        tree.extend(children);
    }
}

fn parent(pid: u32) -> Option<u32> {
    let stat =
        std::fs::read_to_string(Path::new("/proc").join(pid.to_string()).join("stat")).ok()?;
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}
