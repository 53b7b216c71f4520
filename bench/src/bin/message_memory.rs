//! What one large client message costs the serving process (issue 43): a
//! release `flotilla serve` (control plane and node agent in one process,
//! outside every instance's cgroup) is sampled every 2 ms while a client
//! sends, and the peak of its resident memory above where it stood before
//! is the message's cost. `/health` is asked throughout (answers counted).
//!
//! Messages, each on its own connection:
//! - **CDP with escapes**: an 8 MB `Runtime.evaluate` whose params carry an
//!   array of small numbers and a `\u0041` (the old relay parsed any CDP
//!   message with a `\u` into a tree);
//! - **BiDi**: an 8 MB `session.status` with the same array, on a
//!   WebDriver session's BiDi socket (the old relay parsed every BiDi message);
//! - **Playwright**: an 8 MB message with the same array and a `\u`
//!   escape on the instance's `/playwright` socket;
//! - the **largest** message each door takes (100 MiB, the limit of CDP,
//!   BiDi and Playwright alike);
//! - **uploads**: Playwright's `setInputFiles` of a 49 MB buffer (the most
//!   its client sends as a buffer: one 65 MB message, as its client writes
//!   it), and Grid's `se/file` with a 63 MiB body (a stored zip of 47 MB,
//!   base64);
//! - **MCP**: `browser_evaluate` of `Array(4e6).fill(0)`.
//!
//! Usage: message_memory [--binary target/release/flotilla]
//!                       [--baseline OLDER_BINARY] [--size-mb 8]
//!
//! With `--baseline`, every message goes to that build first, then to
//! `--binary`, in one run.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

use flotilla_bench::{ServeProcess, create_running, number_flag, rss_kib, text_flag};

const KEY: &str = "message-memory-bench-key";

/// An array of zeros, `size` bytes of JSON text.
fn zeros(size: usize) -> String {
    let mut text = String::with_capacity(size + 2);
    text.push_str("[0");
    while text.len() + 3 < size {
        text.push_str(",0");
    }
    text.push(']');
    text
}

/// The peak growth of `pid`'s resident memory while `work` runs, in MiB,
/// and how many `/health` answers came (of how many asked).
async fn growth_while<F: std::future::Future<Output = anyhow::Result<()>>>(
    pid: u32,
    health: &str,
    work: F,
) -> anyhow::Result<(f64, u64, u64)> {
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = rss_kib(pid);
    let peak = Arc::new(AtomicU64::new(before));
    let done = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (peak, done) = (peak.clone(), done.clone());
        tokio::spawn(async move {
            while !done.load(Ordering::Relaxed) {
                peak.fetch_max(rss_kib(pid), Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        })
    };
    let prober = {
        let (done, health) = (done.clone(), health.to_owned());
        tokio::spawn(async move {
            let http = reqwest::Client::builder()
                .timeout(Duration::from_secs(5))
                .build()
                .expect("client");
            let (mut asked, mut answered) = (0u64, 0u64);
            while !done.load(Ordering::Relaxed) {
                asked += 1;
                if http
                    .get(&health)
                    .send()
                    .await
                    .is_ok_and(|r| r.status().is_success())
                {
                    answered += 1;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            (asked, answered)
        })
    };
    let outcome = work.await;
    // The relay may still be reading what was written.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    done.store(true, Ordering::Relaxed);
    sampler.await?;
    let (asked, answered) = prober.await?;
    if let Err(error) = outcome {
        eprintln!("  (the client saw: {error:#})");
    }
    let grown = peak.load(Ordering::Relaxed).saturating_sub(before);
    Ok((grown as f64 / 1024.0, answered, asked))
}

/// Sends `text` as one message on the WebSocket `url` (with the API key and
/// `headers`), then reads for a moment and closes.
async fn send_one(url: &str, headers: &[(&str, &str)], text: String) -> anyhow::Result<()> {
    let mut request = url.into_client_request()?;
    request
        .headers_mut()
        .insert("authorization", format!("Bearer {KEY}").parse()?);
    for (name, value) in headers {
        let name = hyper::header::HeaderName::from_bytes(name.as_bytes())?;
        request
            .headers_mut()
            .insert(name, value.parse().context("header")?);
    }
    let config = tokio_tungstenite::tungstenite::protocol::WebSocketConfig::default()
        .max_message_size(Some(512 << 20))
        .max_frame_size(Some(512 << 20));
    let (mut socket, _) =
        tokio_tungstenite::connect_async_with_config(request, Some(config), true).await?;
    socket.send(Message::text(text)).await?;
    let _ = tokio::time::timeout(Duration::from_secs(10), socket.next()).await;
    let _ = socket.close(None).await;
    Ok(())
}

/// A WebDriver session with BiDi on: its id and its BiDi socket's URL.
async fn bidi_session(http: &reqwest::Client, base: &str) -> anyhow::Result<(String, String)> {
    let created: Value = http
        .post(format!("{base}/session"))
        .json(&json!({"capabilities": {"alwaysMatch": {"webSocketUrl": true}}}))
        .send()
        .await?
        .json()
        .await?;
    let id = created["value"]["sessionId"]
        .as_str()
        .with_context(|| format!("no session: {created}"))?
        .to_owned();
    let socket = created["value"]["capabilities"]["webSocketUrl"]
        .as_str()
        .context("no webSocketUrl")?
        .to_owned();
    Ok((id, socket))
}

/// A Grid upload body: a stored zip holding `size` bytes, base64, in JSON.
fn se_file_body(size: usize) -> anyhow::Result<Vec<u8>> {
    use base64::Engine as _;
    let mut zipped = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let options =
        zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    zipped.start_file("big.bin", options)?;
    zipped.write_all(&vec![0u8; size])?;
    let bytes = zipped.finish()?.into_inner();
    let encoded = base64::engine::general_purpose::STANDARD.encode(bytes);
    Ok(format!(r#"{{"file":"{encoded}"}}"#).into_bytes())
}

/// One MCP tool call over Streamable HTTP (raw JSON-RPC): its result.
async fn mcp_evaluate(http: &reqwest::Client, base: &str, expression: &str) -> anyhow::Result<()> {
    let post = |body: Value, session: Option<String>| {
        let mut request = http
            .post(format!("{base}/mcp"))
            .header("accept", "application/json, text/event-stream")
            .json(&body);
        if let Some(session) = session {
            request = request.header("mcp-session-id", session);
        }
        request.send()
    };
    let opened = post(
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "bench", "version": "1"}}}),
        None,
    )
    .await?;
    let session = opened.headers()["mcp-session-id"].to_str()?.to_owned();
    opened.text().await?;
    post(
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        Some(session.clone()),
    )
    .await?
    .text()
    .await?;
    for (id, name, arguments) in [
        (2, "browser_create", json!({"url": "about:blank"})),
        (3, "browser_evaluate", json!({"expression": expression})),
    ] {
        let answer = post(
            json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
                "params": {"name": name, "arguments": arguments}}),
            Some(session.clone()),
        )
        .await?
        .text()
        .await?;
        eprintln!("  {name}: {} bytes answered", answer.len());
    }
    http.delete(format!("{base}/mcp"))
        .header("mcp-session-id", session)
        .send()
        .await?;
    Ok(())
}

/// A build's table rows.
struct Rows<'a> {
    label: &'a str,
    rows: Vec<String>,
}

impl Rows<'_> {
    fn add(&mut self, what: &str, (grown, answered, asked): (f64, u64, u64)) {
        let line = format!(
            "| {} | {what} | {grown:.1} | {answered}/{asked} |",
            self.label
        );
        println!("{line}");
        self.rows.push(line);
    }
}

/// Where one build's messages go: the serving process, its `/health`, and
/// the sockets of one instance.
struct Doors {
    pid: u32,
    health: String,
    base: String,
    debug: String,
    bidi: String,
    /// The WebDriver session the BiDi socket belongs to.
    session: String,
    playwright: String,
}

/// What Playwright's client says it is.
const PLAYWRIGHT_AGENT: [(&str, &str); 1] = [(
    "user-agent",
    "Playwright/1.65.1 (x64; debian 12) node/20.19",
)];

/// Every message against one build: a row each.
async fn run_build(label: &str, binary: &Path, size: usize) -> anyhow::Result<Vec<String>> {
    let dir = tempfile::tempdir()?;
    let config = dir.path().join("flotilla.toml");
    std::fs::write(
        &config,
        format!("auth_enabled = true\napi_keys = [{KEY:?}]\n[agent]\nwarm_pool_size = 0\n"),
    )?;
    let serve = ServeProcess::start(binary, &dir.path().join("data"), Some(&config)).await?;
    let base = serve.url.clone();
    let http = flotilla_bench::client_with_key(KEY)?;
    let created = create_running(&http, &base, "{}", Duration::from_millis(20)).await?;
    let id = created["id"].as_str().context("id")?.to_owned();
    let (session, bidi) = bidi_session(&http, &base).await?;
    let doors = Doors {
        pid: serve.child.id().context("pid")?,
        health: format!("{base}/health"),
        debug: created["urls"]["debug"]
            .as_str()
            .context("debug")?
            .to_owned(),
        bidi,
        session,
        playwright: format!(
            "{}/v2/instances/{id}/playwright",
            base.replacen("http", "ws", 1)
        ),
        base,
    };
    let mut rows = Rows {
        label,
        rows: Vec::new(),
    };
    small_values(&doors, size, &mut rows).await?;
    largest_messages(&doors, &mut rows).await?;
    uploads_and_mcp(&http, &doors, &mut rows).await?;
    serve.stop().await;
    Ok(rows.rows)
}

/// A message of `size` bytes of small values on each socket.
async fn small_values(doors: &Doors, size: usize, rows: &mut Rows<'_>) -> anyhow::Result<()> {
    let (pid, health) = (doors.pid, doors.health.as_str());
    let pad = zeros(size);
    let cdp = format!(
        r#"{{"id":1,"method":"Runtime.evaluate","params":{{"expression":"'\u0041'","pad":{pad}}}}}"#
    );
    rows.add(
        &format!("CDP, {} MB of small values with a \\u escape", size >> 20),
        growth_while(pid, health, send_one(&doors.debug, &[], cdp)).await?,
    );
    let status = format!(r#"{{"id":1,"method":"session.status","params":{{"pad":{pad}}}}}"#);
    rows.add(
        &format!("BiDi, {} MB of small values", size >> 20),
        growth_while(pid, health, send_one(&doors.bidi, &[], status)).await?,
    );
    let message = format!(
        r#"{{"id":1,"guid":"","method":"initialize","params":{{"sdkLanguage":"\u006aavascript","pad":{pad}}}}}"#
    );
    rows.add(
        &format!(
            "Playwright, {} MB of small values with a \\u escape",
            size >> 20
        ),
        growth_while(
            pid,
            health,
            send_one(&doors.playwright, &PLAYWRIGHT_AGENT, message),
        )
        .await?,
    );
    Ok(())
}

/// The largest message each protocol takes, and Playwright's largest upload.
async fn largest_messages(doors: &Doors, rows: &mut Rows<'_>) -> anyhow::Result<()> {
    let (pid, health) = (doors.pid, doors.health.as_str());
    let largest = zeros(99 << 20);
    let cdp = format!(
        r#"{{"id":1,"method":"Runtime.evaluate","params":{{"expression":"0","pad":{largest}}}}}"#
    );
    rows.add(
        "CDP, the largest message (99 MiB)",
        growth_while(pid, health, send_one(&doors.debug, &[], cdp)).await?,
    );
    let status = format!(r#"{{"id":2,"method":"session.status","params":{{"pad":{largest}}}}}"#);
    rows.add(
        "BiDi, the largest message (99 MiB)",
        growth_while(pid, health, send_one(&doors.bidi, &[], status)).await?,
    );
    drop(largest);
    // What Playwright's client sends for setInputFiles of its largest buffer
    // (49 MB, base64), as one message.
    let payload = "A".repeat(49_000_000usize.div_ceil(3) * 4);
    let upload = format!(
        r#"{{"id":2,"guid":"frame@1","method":"setInputFiles","params":{{"selector":"input","payloads":[{{"name":"big.bin","mimeType":"application/octet-stream","buffer":"{payload}"}}]}}}}"#
    );
    drop(payload);
    rows.add(
        "Playwright setInputFiles of a 49 MB buffer (65 MB message)",
        growth_while(
            pid,
            health,
            send_one(&doors.playwright, &PLAYWRIGHT_AGENT, upload),
        )
        .await?,
    );
    Ok(())
}

/// A WebDriver upload of a 63 MiB body, and an MCP evaluation of a large array.
async fn uploads_and_mcp(
    http: &reqwest::Client,
    doors: &Doors,
    rows: &mut Rows<'_>,
) -> anyhow::Result<()> {
    let (pid, health, base) = (doors.pid, doors.health.as_str(), doors.base.as_str());
    let body = se_file_body(47 << 20)?;
    let upload_url = format!("{base}/session/{}/se/file", doors.session);
    let upload = async {
        let answer = http.post(&upload_url).body(body).send().await?;
        let status = answer.status();
        let text = answer.text().await?;
        eprintln!("  se/file: {status} {}", &text[..text.len().min(120)]);
        Ok(())
    };
    rows.add(
        "WebDriver se/file, a 63 MiB body (47 MB file)",
        growth_while(pid, health, upload).await?,
    );
    rows.add(
        "MCP browser_evaluate Array(4e6).fill(0)",
        growth_while(pid, health, mcp_evaluate(http, base, "Array(4e6).fill(0)")).await?,
    );
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let binary: PathBuf = text_flag("--binary", "target/release/flotilla")?.into();
    let baseline = text_flag("--baseline", "")?;
    let size = number_flag("--size-mb", 8)? << 20;
    println!("| build | message | serving process's growth (MiB) | /health answered |");
    println!("|---|---|---|---|");
    if !baseline.is_empty() {
        run_build("baseline", Path::new(&baseline), size).await?;
    }
    run_build("this build", &binary, size).await?;
    Ok(())
}
