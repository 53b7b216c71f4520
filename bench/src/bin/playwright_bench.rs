//! Playwright's own protocol (issue 29) on a release `flotilla serve`
//! (authentication on, `public_url` set so both URLs go through the front
//! door, as in production): `chromium.connect(urls.playwright)` against
//! `chromium.connectOverCDP(urls.debug)` on the same instance, in one Node
//! process (`bench/js/playwright_protocol.mjs`), interleaved: connect →
//! `newPage` → `goto` a local page → `title`; a `page.evaluate` round trip
//! on an open connection each way; the memory of the instance's Playwright
//! server with 1 and with 10 clients connected.
//!
//! Usage: playwright_bench [--binary target/release/flotilla] [--rounds 20]
//!                         [--evaluations 500]

use std::path::PathBuf;

use anyhow::Context as _;
use serde_json::{Value, json};

use flotilla_bench::{
    ServeProcess, client_with_key, free_port, number_flag, percentile, run_node_script, serve_html,
    text_flag,
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

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let binary = PathBuf::from(text_flag("--binary", "target/release/flotilla")?);
    let rounds = number_flag("--rounds", 20)?;
    let evaluations = number_flag("--evaluations", 500)?;
    let site = serve_html("<!doctype html><title>bench</title><h1>hello</h1>".into()).await?;
    let dir = tempfile::Builder::new()
        .prefix("flotilla-playwright-bench-")
        .tempdir()?;
    let port = free_port();
    let config = dir.path().join("flotilla.toml");
    std::fs::write(
        &config,
        format!(
            "auth_enabled = true\napi_keys = [\"{KEY}\"]\npublic_url = \"http://127.0.0.1:{port}\"\n\
             [agent]\nwarm_pool_size = 1\n[agent.egress]\nallow = [\"{}\"]\n",
            site.trim_start_matches("http://")
        ),
    )?;
    let serve = ServeProcess::start_listening(
        &binary,
        &dir.path().join("data"),
        Some(&config),
        &format!("127.0.0.1:{port}"),
    )
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
    let options = json!({
        "playwright": created["urls"]["playwright"],
        "debug": created["urls"]["debug"],
        "url": format!("{site}/"),
        "rounds": rounds,
        "evaluations": evaluations,
    });
    let results = run_node_script("playwright_protocol.mjs", &options).await;
    serve.stop().await;
    let results = results?;
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
    for (way, label) in [("connect", "connect()"), ("cdp", "connectOverCDP")] {
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
    Ok(())
}
