//! Input latency through the live view (issue 19), against a release
//! `flotilla serve` with real Chromium.
//!
//!   live_bench latency [--count 60] [--binary target/release/flotilla]
//!   live_bench record [--seconds 60] [--binary target/release/flotilla]
//!
//! `latency`:
//! One instance shows a page whose whole body turns black on a mouse press
//! and white on the next. A viewer on the stream's WebSocket takes control;
//! each round presses the mouse in the middle of the frame and times from
//! sending the press to the first frame whose centre pixel shows the new
//! colour (frames decoded as they arrive). Rounds alternate between the
//! press sent as a live-view message (`{"type": "mouse", …}`, dispatched by
//! the agent) and the baseline: the same press sent straight to the page
//! with CDP `Input.dispatchMouseEvent` by this program, seen on the same
//! socket. The difference is what the live view's input path adds.
//!
//! `record`: two instances at 1280x720 showing the same animated page (a box
//! moving all the time, so every frame differs), one with `config.record`.
//! For `--seconds` the CPU time of each instance's processes is read from
//! `/proc` (the browser's tree; for the recorded one also its ffmpeg), then
//! the recorded one is parked and its recording's size is reported per
//! minute. The unrecorded instance is the baseline: what the page costs
//! without a recording.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;

use flotilla_bench::{
    ServeProcess, cpu_seconds, get_json, number_flag, summary_row, text_flag, wait_running,
};
use flotilla_node_agent::engine::cdp::CdpClient;

type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

const PAGE: &str = "data:text/html,<title>latency</title><style>html,body{margin:0;height:100vh;background:white}</style>\
<body onmousedown=\"document.body.style.background=document.body.style.background=='black'?'white':'black'\">";

/// Brightness (0-255) of the centre pixel of a JPEG frame.
fn centre_brightness(jpeg: &[u8]) -> anyhow::Result<u8> {
    let mut decoder = jpeg_decoder::Decoder::new(jpeg);
    let pixels = decoder.decode()?;
    let info = decoder.info().context("no image info")?;
    let (width, height) = (usize::from(info.width), usize::from(info.height));
    let channels = pixels.len() / (width * height);
    let at = ((height / 2) * width + width / 2) * channels;
    Ok(pixels[at])
}

/// Reads until a text message satisfies `done`.
async fn until_text(socket: &mut Socket, done: impl Fn(&Value) -> bool) -> anyhow::Result<Value> {
    let read = async {
        while let Some(message) = socket.next().await {
            if let Message::Text(text) = message? {
                let value: Value = serde_json::from_str(&text)?;
                if done(&value) {
                    return Ok(value);
                }
            }
        }
        bail!("the live view closed")
    };
    tokio::time::timeout(Duration::from_secs(60), read).await?
}

/// Waits for the first frame whose centre is dark (`true`) or light.
async fn until_frame(socket: &mut Socket, dark: bool) -> anyhow::Result<()> {
    let read = async {
        while let Some(message) = socket.next().await {
            if let Message::Binary(jpeg) = message? {
                let brightness = centre_brightness(&jpeg)?;
                if std::env::var_os("LIVE_BENCH_DEBUG").is_some() {
                    eprintln!("frame: {} bytes, centre {brightness}", jpeg.len());
                }
                if (brightness < 128) == dark {
                    return Ok(());
                }
            }
        }
        bail!("the live view closed")
    };
    tokio::time::timeout(Duration::from_secs(30), read).await?
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    match std::env::args().nth(1).as_deref() {
        Some("latency") => latency().await,
        Some("record") => record().await,
        _ => bail!("usage: live_bench latency|record [flags]"),
    }
}

/// A text message carrying `message` as JSON.
fn text_message(message: Value) -> Message {
    Message::Text(message.to_string().into())
}

/// Creates an instance (with `body`) and waits until it runs; its id and
/// detail.
async fn running_instance(
    http: &reqwest::Client,
    base: &str,
    body: &Value,
) -> anyhow::Result<(String, Value)> {
    let created: Value = http
        .post(format!("{base}/v2/instances"))
        .json(body)
        .send()
        .await?
        .json()
        .await?;
    let id = created["id"].as_str().context("no id")?.to_owned();
    let detail = wait_running(http, base, &id, Duration::from_millis(50)).await?;
    Ok((id, detail))
}

/// The page in a tab of its own, and a CDP session on it for the baseline:
/// the browser client, the tab's target id and the session id.
async fn open_page(debug: &str) -> anyhow::Result<(CdpClient, String, String)> {
    let browser = CdpClient::connect(debug).await?;
    let timeout = Duration::from_secs(30);
    let target = browser
        .call("Target.createTarget", json!({"url": PAGE}), None, timeout)
        .await?;
    let target_id = target["targetId"].as_str().context("no target")?.to_owned();
    let attached = browser
        .call(
            "Target.attachToTarget",
            json!({"targetId": target_id, "flatten": true}),
            None,
            timeout,
        )
        .await?;
    let session = attached["sessionId"]
        .as_str()
        .context("no session")?
        .to_owned();
    Ok((browser, target_id, session))
}

/// A viewer on `stream`'s WebSocket that has taken control of tab
/// `target_id` and seen it white; the socket and the viewport's size.
async fn take_control(
    stream: &str,
    id: &str,
    target_id: &str,
) -> anyhow::Result<(Socket, f64, f64)> {
    let (mut socket, _) =
        tokio_tungstenite::connect_async(format!("{}ws", stream.replacen("http", "ws", 1))).await?;
    eprintln!("instance {id} running; waiting for its tab in the live view");
    until_text(&mut socket, |m| {
        m["tabs"]
            .as_array()
            .is_some_and(|tabs| tabs.iter().any(|t| t["id"] == target_id))
    })
    .await?;
    socket
        .send(text_message(json!({"type": "tab", "id": target_id})))
        .await?;
    socket
        .send(text_message(json!({"type": "control", "take": true})))
        .await?;
    let state = until_text(&mut socket, |m| {
        m["control"] == "yours" && m["tab"] == target_id && !m["viewport"].is_null()
    })
    .await?;
    let (width, height) = (
        state["viewport"]["width"].as_f64().context("width")?,
        state["viewport"]["height"].as_f64().context("height")?,
    );
    eprintln!("in control of the page ({width}x{height})");
    until_frame(&mut socket, false).await?;
    Ok((socket, width, height))
}

/// Where the presses go: the live view's socket, or the page's CDP session
/// for the baseline.
struct Presses<'a> {
    socket: &'a mut Socket,
    browser: &'a CdpClient,
    session: &'a str,
    width: f64,
    height: f64,
}

impl Presses<'_> {
    /// Presses and releases the mouse in the middle of the page, as a live-view
    /// message (`via_live_view`) or with CDP.
    async fn click(&mut self, via_live_view: bool) -> anyhow::Result<()> {
        let timeout = Duration::from_secs(30);
        for event in ["down", "up"] {
            if via_live_view {
                let press = json!({"type": "mouse", "event": event, "x": 0.5, "y": 0.5,
                    "button": "left", "buttons": u8::from(event == "down"), "click_count": 1});
                self.socket.send(text_message(press)).await?;
            } else {
                let kind = if event == "down" {
                    "mousePressed"
                } else {
                    "mouseReleased"
                };
                let press = json!({"type": kind, "x": self.width / 2.0, "y": self.height / 2.0,
                    "button": "left", "buttons": u8::from(event == "down"), "clickCount": 1});
                self.browser
                    .call(
                        "Input.dispatchMouseEvent",
                        press,
                        Some(self.session),
                        timeout,
                    )
                    .await?;
            }
        }
        Ok(())
    }
}

/// `count` rounds each way, alternating: click, then time until the frame
/// shows the new colour; the samples via the live view and via CDP.
async fn measure_clicks(
    presses: &mut Presses<'_>,
    count: usize,
) -> anyhow::Result<(Vec<f64>, Vec<f64>)> {
    let mut dark = false;
    let (mut live, mut direct) = (Vec::new(), Vec::new());
    for round in 0..count * 2 {
        let via_live_view = round % 2 == 0;
        let started = Instant::now();
        presses.click(via_live_view).await?;
        dark = !dark;
        until_frame(presses.socket, dark).await?;
        let ms = started.elapsed().as_secs_f64() * 1000.0;
        if via_live_view {
            live.push(ms)
        } else {
            direct.push(ms)
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok((live, direct))
}

/// `live_bench latency` (see the module docs).
async fn latency() -> anyhow::Result<()> {
    let count = number_flag("--count", 60)?;
    let binary: PathBuf = text_flag("--binary", "target/release/flotilla")?.into();
    let dir = tempfile::tempdir()?;
    let serve = ServeProcess::start(&binary, &dir.path().join("data"), None).await?;
    let http = reqwest::Client::builder().no_proxy().build()?;
    let (id, detail) = running_instance(&http, &serve.url, &json!({})).await?;
    let debug = detail["urls"]["debug"].as_str().context("no debug url")?;
    let stream = detail["urls"]["stream"].as_str().context("no stream url")?;
    let (browser, target_id, session) = open_page(debug).await?;
    let (mut socket, width, height) = take_control(stream, &id, &target_id).await?;
    eprintln!("measuring");
    let mut presses = Presses {
        socket: &mut socket,
        browser: &browser,
        session: &session,
        width,
        height,
    };
    let (live, direct) = measure_clicks(&mut presses, count).await?;
    println!("{}", summary_row("live view input -> frame", &live));
    println!("{}", summary_row("baseline: CDP input -> frame", &direct));
    serve.stop().await;
    Ok(())
}

const ANIMATED: &str = "data:text/html,<title>moving</title><style>body{margin:0;background:%23123}\
.b{width:300px;height:300px;background:%23fc0;position:absolute;animation:m 2s linear infinite alternate}\
@keyframes m{from{left:0;top:0}to{left:900px;top:400px}}</style><div class=b></div>";

/// Pids whose command line mentions `needle`, and their descendants.
fn processes_of(needle: &str) -> Vec<u32> {
    let roots: Vec<u32> = flotilla_node_agent::system::monitor::pids()
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains(needle))
        })
        .collect();
    flotilla_node_agent::system::monitor::ProcTable::scan().live_descendants(&roots)
}

/// An instance showing the animated page in its only tab.
async fn animated_instance(
    http: &reqwest::Client,
    base: &str,
    record: bool,
) -> anyhow::Result<(String, Value)> {
    let (id, detail) = running_instance(http, base, &json!({"config": {"record": record}})).await?;
    let debug = detail["urls"]["debug"].as_str().context("no debug url")?;
    let browser = CdpClient::connect(debug).await?;
    let timeout = Duration::from_secs(30);
    let targets = browser
        .call("Target.getTargets", json!({}), None, timeout)
        .await?;
    browser
        .call(
            "Target.createTarget",
            json!({"url": ANIMATED}),
            None,
            timeout,
        )
        .await?;
    for target in targets["targetInfos"].as_array().into_iter().flatten() {
        if target["type"] == "page" {
            browser
                .call(
                    "Target.closeTarget",
                    json!({"targetId": target["targetId"]}),
                    None,
                    timeout,
                )
                .await?;
        }
    }
    Ok((id, detail))
}

/// The processes of instance `id` (its browser's; for the `recorded` one
/// also its ffmpeg), sorted.
fn instance_processes(id: &str, recorded: &str) -> Vec<u32> {
    let mut pids = processes_of(id);
    if id == recorded {
        pids.extend(processes_of("image2pipe"));
    }
    pids.sort_unstable();
    pids.dedup();
    pids
}

/// A viewer on `stream`'s WebSocket, counting the frames it gets.
async fn watch_frames(stream: &str) -> anyhow::Result<tokio::task::JoinHandle<u64>> {
    let (mut viewer, _) =
        tokio_tungstenite::connect_async(format!("{}ws", stream.replacen("http", "ws", 1))).await?;
    Ok(tokio::spawn(async move {
        let mut count = 0u64;
        while let Some(Ok(message)) = viewer.next().await {
            if matches!(message, Message::Binary(_)) {
                count += 1;
            }
        }
        count
    }))
}

/// CPU use (% of one core) over `seconds` of the recorded instance (browser
/// and ffmpeg), of the plain one, and of ffmpeg alone.
async fn measure_cpu(recorded: &str, plain: &str, seconds: u64) -> (f64, f64, f64) {
    // An instance's browser processes name it (their directories); the one
    // ffmpeg reading frames (`image2pipe`) is the recorded instance's.
    let ffmpeg = || processes_of("image2pipe");
    let groups = |id: &str| instance_processes(id, recorded);
    eprintln!(
        "processes: recorded {}, ffmpeg {}, plain {}",
        groups(recorded).len(),
        ffmpeg().len(),
        groups(plain).len()
    );
    let (recorded_before, plain_before, ffmpeg_before) = (
        cpu_seconds(&groups(recorded)),
        cpu_seconds(&groups(plain)),
        cpu_seconds(&ffmpeg()),
    );
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    let elapsed = started.elapsed().as_secs_f64();
    let percent = |after: f64, before: f64| (after - before) / elapsed * 100.0;
    let recorded_cpu = percent(cpu_seconds(&groups(recorded)), recorded_before);
    let plain_cpu = percent(cpu_seconds(&groups(plain)), plain_before);
    let ffmpeg_cpu = percent(cpu_seconds(&ffmpeg()), ffmpeg_before);
    (recorded_cpu, plain_cpu, ffmpeg_cpu)
}

/// Parks instance `recorded` and reads its recording: size (bytes) and
/// duration (seconds).
async fn park_and_read_recording(
    http: &reqwest::Client,
    base: &str,
    recorded: &str,
) -> anyhow::Result<(f64, f64)> {
    http.post(format!("{base}/v2/instances/{recorded}/dormant"))
        .send()
        .await?
        .error_for_status()?;
    let list: Value = get_json(http, format!("{base}/v2/instances/{recorded}/recordings")).await?;
    let recording = &list["recordings"][0];
    let size = recording["size_bytes"].as_f64().context("no recording")?;
    let duration = recording["duration_sec"].as_f64().context("no duration")?;
    Ok((size, duration))
}

/// `live_bench record` (see the module docs).
async fn record() -> anyhow::Result<()> {
    let seconds = number_flag("--seconds", 60)? as u64;
    let binary: PathBuf = text_flag("--binary", "target/release/flotilla")?.into();
    let dir = tempfile::tempdir()?;
    let data = dir.path().join("data");
    // Browsers launched for their instance (not taken from the warm pool),
    // so that their processes name the instance.
    let config = dir.path().join("bench.toml");
    std::fs::write(&config, "[agent]\nwarm_pool_size = 0\n")?;
    let serve = ServeProcess::start(&binary, &data, Some(&config)).await?;
    let http = reqwest::Client::builder().no_proxy().build()?;
    let (recorded, _) = animated_instance(&http, &serve.url, true).await?;
    let (plain, plain_detail) = animated_instance(&http, &serve.url, false).await?;
    // The unrecorded instance's screencast runs too, for a viewer here.
    let stream = plain_detail["urls"]["stream"]
        .as_str()
        .context("no stream url")?;
    let frames = watch_frames(stream).await?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let (recorded_cpu, plain_cpu, ffmpeg_cpu) = measure_cpu(&recorded, &plain, seconds).await;
    let (size, duration) = park_and_read_recording(&http, &serve.url, &recorded).await?;
    frames.abort();
    println!("| instance | CPU (% of one core) |");
    println!("|---|---|");
    println!("| recorded (browser + ffmpeg) | {recorded_cpu:.1} |");
    println!("| of which ffmpeg | {ffmpeg_cpu:.1} |");
    println!("| baseline: not recorded, one live viewer | {plain_cpu:.1} |");
    println!(
        "recording: {duration:.1} s, {:.2} MB, {:.2} MB per minute",
        size / 1e6,
        size / 1e6 / duration * 60.0
    );
    serve.stop().await;
    Ok(())
}
