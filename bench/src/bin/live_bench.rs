//! Input latency through the live view (issue 19), against a release
//! `flotilla serve` with real Chromium.
//!
//!   live_bench [--count 60] [--binary target/release/flotilla]
//!
//! One instance shows a page whose whole body turns black on a mouse press
//! and white on the next. A viewer on the stream's WebSocket takes control;
//! each round presses the mouse in the middle of the frame and times from
//! sending the press to the first frame whose centre pixel shows the new
//! colour (frames decoded as they arrive). Rounds alternate between the
//! press sent as a live-view message (`{"type": "mouse", …}`, dispatched by
//! the agent) and the baseline: the same press sent straight to the page
//! with CDP `Input.dispatchMouseEvent` by this program, seen on the same
//! socket. The difference is what the live view's input path adds.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;

use flotilla_bench::{ServeProcess, number_flag, summary_row, text_flag, wait_running};

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
    let count = number_flag("--count", 60)?;
    let binary: PathBuf = text_flag("--binary", "target/release/flotilla")?.into();
    let dir = tempfile::tempdir()?;
    let serve = ServeProcess::start(&binary, &dir.path().join("data"), None).await?;
    let http = reqwest::Client::builder().no_proxy().build()?;
    let created: Value = http
        .post(format!("{}/v2/instances", serve.url))
        .json(&json!({}))
        .send()
        .await?
        .json()
        .await?;
    let id = created["id"].as_str().context("no id")?.to_owned();
    let detail = wait_running(&http, &serve.url, &id, Duration::from_millis(50)).await?;
    let debug = detail["urls"]["debug"].as_str().context("no debug url")?;
    let stream = detail["urls"]["stream"].as_str().context("no stream url")?;

    // The page in a tab of its own, and a CDP session on it for the baseline.
    let browser = flotilla_node_agent::cdp::CdpClient::connect(debug).await?;
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

    let (mut socket, _) =
        tokio_tungstenite::connect_async(format!("{}ws", stream.replacen("http", "ws", 1))).await?;
    eprintln!("instance {id} running; waiting for its tab in the live view");
    until_text(&mut socket, |m| {
        m["tabs"]
            .as_array()
            .is_some_and(|tabs| tabs.iter().any(|t| t["id"] == target_id.as_str()))
    })
    .await?;
    let send = |message: Value| Message::Text(message.to_string().into());
    socket
        .send(send(json!({"type": "tab", "id": target_id})))
        .await?;
    socket
        .send(send(json!({"type": "control", "take": true})))
        .await?;
    let state = until_text(&mut socket, |m| {
        m["control"] == "yours" && m["tab"] == target_id.as_str() && !m["viewport"].is_null()
    })
    .await?;
    let (width, height) = (
        state["viewport"]["width"].as_f64().context("width")?,
        state["viewport"]["height"].as_f64().context("height")?,
    );
    eprintln!("in control of the page ({width}x{height})");
    until_frame(&mut socket, false).await?;
    eprintln!("measuring");

    let mut dark = false;
    let (mut live, mut direct) = (Vec::new(), Vec::new());
    for round in 0..count * 2 {
        let via_live_view = round % 2 == 0;
        let started = Instant::now();
        for event in ["down", "up"] {
            if via_live_view {
                let press = json!({"type": "mouse", "event": event, "x": 0.5, "y": 0.5,
                    "button": "left", "buttons": u8::from(event == "down"), "click_count": 1});
                socket.send(send(press)).await?;
            } else {
                let kind = if event == "down" {
                    "mousePressed"
                } else {
                    "mouseReleased"
                };
                let press = json!({"type": kind, "x": width / 2.0, "y": height / 2.0,
                    "button": "left", "buttons": u8::from(event == "down"), "clickCount": 1});
                browser
                    .call("Input.dispatchMouseEvent", press, Some(&session), timeout)
                    .await?;
            }
        }
        dark = !dark;
        until_frame(&mut socket, dark).await?;
        let ms = started.elapsed().as_secs_f64() * 1000.0;
        if via_live_view {
            live.push(ms)
        } else {
            direct.push(ms)
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!("{}", summary_row("live view input -> frame", &live));
    println!("{}", summary_row("baseline: CDP input -> frame", &direct));
    serve.stop().await;
    Ok(())
}
