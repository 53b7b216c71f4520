//! Playwright's own protocol (issue 29) on a release `flotilla serve`
//! (authentication on, `public_url` set so both URLs go through the front
//! door, as in production): `chromium.connect(urls.playwright)` against
//! `chromium.connectOverCDP(urls.debug)` on the same instance, in one Node
//! process (`bench/js/playwright_protocol.mjs`), interleaved: connect →
//! `newPage` → `goto` a local page → `title`; a `page.evaluate` round trip
//! on an open connection each way, and the same for the baseline: the same
//! server program beside a Chromium started by hand, reached directly; the
//! memory of the instance's Playwright server with 1 and with 10 clients
//! connected.
//!
//! Usage: playwright_bench [--binary target/release/flotilla] [--rounds 20]
//!                         [--evaluations 500] [--isolation full|no-netns|none]

use std::path::PathBuf;

use anyhow::Context as _;
use serde_json::{Value, json};

use flotilla_bench::{
    ServeProcess, client_with_key, free_port, keyed_config, number_flag, percentile,
    run_node_script, serve_html, text_flag,
};

const KEY: &str = "playwright-bench-key";

fn series(rounds: &Value, field: &str) -> Vec<f64> {
    rounds
        .as_array()
        .map(|rounds| rounds.iter().filter_map(|r| r[field].as_f64()).collect())
        .unwrap_or_default()
}

fn numbers(values: &Value) -> Vec<f64> {
    values
        .as_array()
        .map(|v| v.iter().filter_map(Value::as_f64).collect())
        .unwrap_or_default()
}

fn memory(servers: &Value) -> String {
    servers
        .as_array()
        .map(|servers| {
            servers
                .iter()
                .map(|s| {
                    format!(
                        "RSS {:.0} MiB, PSS {:.0} MiB",
                        s["rss_mib"].as_f64().unwrap_or(0.0),
                        s["pss_mib"].as_f64().unwrap_or(0.0)
                    )
                })
                .collect::<Vec<_>>()
                .join("; ")
        })
        .unwrap_or_default()
}

const RAW_SECRET: &str = "bench-secret";

/// The baseline: Chromium started by hand (the same executable and base
/// flags as Flotilla's) and Flotilla's Playwright server program beside it,
/// unconfined, each reached directly.
struct RawServer {
    browser: tokio::process::Child,
    server: tokio::process::Child,
    /// Kept open: the server ends when it closes.
    _stdin: tokio::process::ChildStdin,
    server_port: u16,
    browser_ws: String,
    _profile: tempfile::TempDir,
}

impl RawServer {
    async fn start() -> anyhow::Result<Self> {
        use tokio::io::AsyncWriteExt as _;
        let profile = tempfile::tempdir()?;
        let port = free_port();
        let browser = tokio::process::Command::new("/usr/lib/chromium/chromium")
            .args(flotilla_node_agent::config::BASE_CHROMIUM_FLAGS)
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg(format!("--remote-debugging-port={port}"))
            .args(["--no-sandbox", "about:blank"])
            .env("HOME", profile.path())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()?;
        let http = reqwest::Client::new();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        let browser_ws = loop {
            if let Ok(response) = http
                .get(format!("http://127.0.0.1:{port}/json/version"))
                .send()
                .await
                && let Ok(version) = response.json::<Value>().await
                && let Some(ws) = version["webSocketDebuggerUrl"].as_str()
            {
                break ws.to_owned();
            }
            anyhow::ensure!(
                std::time::Instant::now() < deadline,
                "Chromium did not answer"
            );
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        };
        let package = flotilla_node_agent::protocols::playwright::installed(std::path::Path::new(
            flotilla_node_agent::config::DEFAULT_PLAYWRIGHT_DIR,
        ))
        .into_iter()
        .find(|install| install.minor == (1, 65))
        .context("playwright-core 1.65 is not installed (scripts/install-deps)")?
        .package;
        let server_port = free_port();
        let dir = profile.path().to_string_lossy().into_owned();
        let mut server = tokio::process::Command::new("node")
            .arg("-e")
            .arg(flotilla_node_agent::protocols::playwright::SERVER_SCRIPT)
            .arg("--")
            .arg(&package)
            .arg(server_port.to_string())
            .args([&dir, &dir, &dir])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()?;
        let mut stdin = server.stdin.take().context("stdin")?;
        stdin
            .write_all(format!("{RAW_SECRET}\n").as_bytes())
            .await?;
        flotilla_bench::wait_listening(server_port, "the baseline's Playwright server").await?;
        Ok(Self {
            browser,
            server,
            _stdin: stdin,
            server_port,
            browser_ws,
            _profile: profile,
        })
    }

    async fn stop(mut self) {
        let _ = self.server.kill().await;
        let _ = self.browser.kill().await;
    }
}

/// `serve` of `binary` with `config` on `port`, and a running instance.
async fn serve_with_an_instance(
    binary: &std::path::Path,
    config: &std::path::Path,
    port: u16,
) -> anyhow::Result<(ServeProcess, Value)> {
    let data = config.with_file_name("data");
    let serve =
        ServeProcess::start_listening(binary, &data, Some(config), &format!("127.0.0.1:{port}"))
            .await
            .with_context(|| format!("starting {}", binary.display()))?;
    let http = client_with_key(KEY)?;
    let created: Value = http
        .post(format!("{}/v2/instances", serve.url))
        .json(&json!({}))
        .send()
        .await?
        .json()
        .await?;
    let instance = created["id"].as_str().context("a created instance")?;
    flotilla_bench::wait_running(
        &http,
        &serve.url,
        instance,
        std::time::Duration::from_millis(50),
    )
    .await?;
    Ok((serve, created))
}

/// The tables of the Node script's `results`.
fn print_results(results: &Value, rounds: usize, evaluations: usize) {
    println!(
        "connect → newPage → goto → title, {rounds} rounds each way, interleaved, medians in ms \
         (the first connect(), which starts the server: {:.0} ms)\n",
        results["first_connect_ms"].as_f64().unwrap_or(0.0)
    );
    println!("| | connect | newPage | goto | title | total |");
    println!("|---|---|---|---|---|---|");
    for (way, label) in [
        ("connect", "`chromium.connect(urls.playwright)`"),
        ("cdp", "`chromium.connectOverCDP(urls.debug)`"),
    ] {
        let row: Vec<String> = ["connect", "new_page", "goto", "title", "total"]
            .iter()
            .map(|field| format!("{:.1}", percentile(&series(&results[way], field), 0.5)))
            .collect();
        println!("| {label} | {} |", row.join(" | "));
    }
    println!("\npage.evaluate round trip, {evaluations} calls on one open connection each way\n");
    println!("| | p50 ms | p90 ms | p99 ms |");
    println!("|---|---|---|---|");
    for (way, label) in [
        ("connect", "Flotilla: connect()"),
        ("cdp", "Flotilla: connectOverCDP"),
        ("port_connect", "Flotilla, the instance's port: connect()"),
        ("port_cdp", "Flotilla, the instance's port: connectOverCDP"),
        ("raw_connect", "baseline: connect() to the server by hand"),
        ("raw_cdp", "baseline: connectOverCDP to Chromium by hand"),
    ] {
        let samples = numbers(&results["evaluate"][way]);
        println!(
            "| {label} | {:.3} | {:.3} | {:.3} |",
            percentile(&samples, 0.5),
            percentile(&samples, 0.9),
            percentile(&samples, 0.99)
        );
    }
    println!(
        "\nThe instance's Playwright server: with 1 client {}; with 10 clients {}",
        memory(&results["memory_1"]),
        memory(&results["memory_10"])
    );
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let binary = PathBuf::from(text_flag("--binary", "target/release/flotilla")?);
    let rounds = number_flag("--rounds", 20)?;
    let evaluations = number_flag("--evaluations", 500)?;
    // How the instance is confined: `full` (the default: sandbox and its own
    // network namespace), `no-netns` (the sandbox on the host's network),
    // `none` (neither), to see what each costs.
    let (sandbox, egress) = match text_flag("--isolation", "full")?.as_str() {
        "full" => ("", ""),
        "no-netns" => ("", "enabled = false\n"),
        "none" => ("sandbox = false\n", "enabled = false\n"),
        other => anyhow::bail!("--isolation {other}: full, no-netns or none"),
    };
    let site = serve_html("<!doctype html><title>bench</title><h1>hello</h1>".into()).await?;
    let dir = tempfile::Builder::new()
        .prefix("flotilla-playwright-bench-")
        .tempdir()?;
    let port = free_port();
    let rest = format!(
        "[agent]\nwarm_pool_size = 1\n{sandbox}[agent.egress]\n{egress}allow = [\"{}\"]\n",
        site.trim_start_matches("http://")
    );
    let config = keyed_config(dir.path(), KEY, port, &rest)?;
    let (serve, created) = serve_with_an_instance(&binary, &config, port).await?;
    let instance = created["id"].as_str().context("a created instance")?;
    let raw = RawServer::start().await?;
    let token = created["urls"]["debug"]
        .as_str()
        .and_then(|url| url.split_once("?token="))
        .map(|(_, token)| token.to_owned())
        .context("a token in urls.debug")?;
    let options = json!({
        "playwright": created["urls"]["playwright"],
        "debug": created["urls"]["debug"],
        "url": format!("{site}/"),
        "rounds": rounds,
        "evaluations": evaluations,
        "direct": {
            "playwright": format!("ws://127.0.0.1:{}/playwright?token={token}", created["http_port"]),
            "debug": format!("ws://127.0.0.1:{}/devtools/browser/{instance}?token={token}", created["debug_port"]),
        },
        "raw": {
            "playwright": format!("ws://127.0.0.1:{}/playwright", raw.server_port),
            "headers": {"x-flotilla-secret": RAW_SECRET, "x-flotilla-cdp": raw.browser_ws},
            "debug": raw.browser_ws,
            "server_pid": raw.server.id(),
        },
    });
    let results = run_node_script("playwright_protocol.mjs", &options).await;
    raw.stop().await;
    serve.stop().await;
    let results = results?;
    print_results(&results, rounds, evaluations);
    Ok(())
}
