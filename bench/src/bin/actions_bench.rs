//! A screenshot as a script gets it (issue 30): `POST /v2/actions/screenshot`
//! of a local page on a release `flotilla serve` against launching Chromium
//! with Puppeteer for each screenshot (launch, newPage, goto, screenshot,
//! close), interleaved round by round in one Node process
//! (`bench/js/action_screenshot.mjs`); then throughput, screenshots per
//! second with `--concurrency` clients each way.
//!
//! Usage: actions_bench [--binary target/release/flotilla] [--rounds 20]
//!                      [--concurrency 8] [--jobs 48] [--warm 2]
//!                      [--chromium /usr/lib/chromium/chromium]
//!
//! Flotilla runs with authentication on and a warm pool of `--warm`; the
//! page is served on 127.0.0.1 and opened in the agent's egress policy.

use std::path::PathBuf;

use anyhow::Context as _;
use serde_json::{Value, json};

use flotilla_bench::{
    ServeProcess, number_flag, percentile, run_node_script, serve_html, text_flag,
};

const KEY: &str = "actions-bench-key";
const PAGE: &str = "<!doctype html><title>bench</title><h1>A page to capture</h1>\
    <p style=\"font:20px serif\">Some text, a box and a gradient.</p>\
    <div style=\"width:600px;height:300px;background:linear-gradient(#08f,#f80)\"></div>";

fn row(label: &str, samples: &[f64]) -> String {
    format!(
        "| {label} | {:.1} | {:.1} | {:.1} |",
        percentile(samples, 0.5),
        percentile(samples, 0.9),
        percentile(samples, 0.99)
    )
}

fn numbers(value: &Value) -> Vec<f64> {
    value
        .as_array()
        .map(|list| list.iter().filter_map(Value::as_f64).collect())
        .unwrap_or_default()
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let binary = PathBuf::from(text_flag("--binary", "target/release/flotilla")?);
    let rounds = number_flag("--rounds", 20)?;
    let concurrency = number_flag("--concurrency", 8)?;
    let jobs = number_flag("--jobs", 48)?;
    let warm = number_flag("--warm", 2)?;
    let chromium = text_flag("--chromium", "/usr/lib/chromium/chromium")?;

    let site = serve_html(PAGE.to_owned()).await?;
    let dir = tempfile::Builder::new()
        .prefix("flotilla-actions-bench-")
        .tempdir()?;
    let config = dir.path().join("flotilla.toml");
    std::fs::write(
        &config,
        format!(
            "auth_enabled = true\napi_keys = [\"{KEY}\"]\n[http]\nbind_address = \"127.0.0.1:0\"\n\
             [agent]\nwarm_pool_size = {warm}\n[agent.egress]\nallow = [\"{}\"]\n",
            site.trim_start_matches("http://")
        ),
    )?;
    let serve = ServeProcess::start(&binary, &dir.path().join("data"), Some(&config))
        .await
        .with_context(|| format!("starting {}", binary.display()))?;

    let options = json!({
        "api": serve.url,
        "key": KEY,
        "url": format!("{site}/"),
        "rounds": rounds,
        "chromium": chromium,
        "concurrency": concurrency,
        "jobs": jobs,
    });
    let results = run_node_script("action_screenshot.mjs", &options).await;
    serve.stop().await;
    let results = results?;
    let action = numbers(&results["action"]);
    let launch = numbers(&results["launch"]);
    println!("one screenshot, request to PNG, {rounds} rounds (ms)\n");
    println!("| | p50 | p90 | p99 |");
    println!("|---|---|---|---|");
    println!("{}", row("POST /v2/actions/screenshot", &action));
    println!(
        "{}",
        row("puppeteer.launch + goto + screenshot + close", &launch)
    );
    println!(
        "\nratio at p50: {:.2}\n",
        percentile(&action, 0.5) / percentile(&launch, 0.5)
    );
    println!("throughput, {jobs} screenshots by {concurrency} clients\n");
    println!("| | seconds | screenshots/s |");
    println!("|---|---|---|");
    for (key, label) in [
        ("throughput_action", "POST /v2/actions/screenshot"),
        ("throughput_launch", "puppeteer.launch per screenshot"),
    ] {
        let run = &results[key];
        println!(
            "| {label} | {:.1} | {:.2} |",
            run["seconds"].as_f64().unwrap_or(0.0),
            run["per_second"].as_f64().unwrap_or(0.0)
        );
    }
    Ok(())
}
