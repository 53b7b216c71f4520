//! Firefox instances (issue 47) beside Chromium ones, in one run of one
//! release `flotilla serve` (authentication on, `public_url` set so that
//! `urls` are the front door, a warm pool of two Firefox and one Chromium, image `chromium`):
//! - a ready page (create, `puppeteer.connect` over WebDriver BiDi to
//!   `urls.bidi`, `newPage`, `goto` a local page, `title`) against raw
//!   `firefox-esr --headless` launched and driven the same way, and a
//!   Chromium instance over CDP;
//! - park and revive (`full_restore`) of an instance holding a page and a
//!   cookie, per image;
//! - idle memory: the PSS of a Firefox and of a Chromium instance left on
//!   `about:blank`, as the agent reports it in `resources`.
//!
//! Usage: firefox_bench [--binary target/release/flotilla] [--rounds 10]
//!                      [--firefox /usr/lib/firefox-esr/firefox-esr]
//!
//! One Node process drives the clients (`bench/js/firefox_ready_page.mjs`),
//! after a warm-up round that is not counted.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use serde_json::{Value, json};

use flotilla_bench::{
    ServeProcess, client_with_key, create_running, free_port, get_json, keyed_config, number_flag,
    percentile, run_node_script, step_medians, text_flag,
};

const KEY: &str = "firefox-bench-key";

fn rounds_of(list: &Value) -> Vec<&Value> {
    list.as_array()
        .map(|rounds| rounds.iter().collect())
        .unwrap_or_default()
}

fn print_row(label: &str, values: &[f64]) {
    let cells: Vec<String> = values.iter().map(|v| format!("{v:.1}")).collect();
    println!("| {label} | {} |", cells.join(" | "));
}

/// The median PSS (MiB) of an instance of `image` left alone: read from
/// its `resources` every 5 s after 15 s, six times.
async fn idle_memory(serve: &ServeProcess, image: &str) -> anyhow::Result<f64> {
    let http = client_with_key(KEY)?;
    let body = json!({"image": image}).to_string();
    let created = create_running(&http, &serve.url, &body, Duration::from_millis(50)).await?;
    let id = created["id"].as_str().context("id")?.to_owned();
    tokio::time::sleep(Duration::from_secs(15)).await;
    let mut readings = Vec::new();
    for _ in 0..6 {
        let instance = get_json(&http, format!("{}/v2/instances/{id}", serve.url)).await?;
        if let Some(memory) = instance["resources"]["memory_mb"].as_f64() {
            readings.push(memory);
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
    http.delete(format!("{}/v2/instances/{id}", serve.url))
        .send()
        .await?;
    Ok(percentile(&readings, 0.5))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let binary = PathBuf::from(text_flag("--binary", "target/release/flotilla")?);
    let rounds = number_flag("--rounds", 10)?;
    let firefox = text_flag("--firefox", "/usr/lib/firefox-esr/firefox-esr")?;
    let dir = tempfile::Builder::new()
        .prefix("flotilla-firefox-")
        .tempdir()?;
    let (port, page_port) = (free_port(), free_port());
    let rest = format!(
        "[http]\nbind_address = \"127.0.0.1:0\"\n[scheduler]\nmax_utilisation_percent = 100\n[agent]\nwarm_pool_size = 0\nwarm_pools = {{ firefox = 2, chromium = 1 }}\n[agent.egress]\nallow = [\"127.0.0.1:{page_port}\"]\n"
    );
    let config = keyed_config(dir.path(), KEY, port, &rest)?;
    let serve = ServeProcess::start_listening(
        &binary,
        &dir.path().join("data"),
        Some(&config),
        &format!("127.0.0.1:{port}"),
    )
    .await
    .with_context(|| format!("starting {}", binary.display()))?;
    let options = json!({
        "api": serve.url, "key": KEY, "rounds": rounds, "firefox": firefox, "page_port": page_port,
    });
    let results = run_node_script("firefox_ready_page.mjs", &options).await?;
    println!("ready page, medians in ms, {rounds} rounds\n");
    println!("| | answer / launch | connect | newPage | goto | title | total |");
    println!("|---|---|---|---|---|---|---|");
    let door = ["answer", "connect", "newPage", "goto", "title"];
    let launch = ["launch", "connect", "newPage", "goto", "title"];
    for (key, label, steps) in [
        (
            "firefox",
            "Flotilla Firefox, warm pool, BiDi through the door",
            &door,
        ),
        (
            "raw_firefox",
            "raw firefox-esr --headless (root, no sandbox), BiDi",
            &launch,
        ),
        (
            "chromium",
            "Flotilla Chromium, warm pool, CDP through the door",
            &door,
        ),
    ] {
        print_row(label, &step_medians(&rounds_of(&results[key]), steps));
    }
    println!("\npark and revive (full_restore), medians in ms\n");
    println!("| image | park | revive until running |");
    println!("|---|---|---|");
    for image in ["firefox", "chromium"] {
        let samples = rounds_of(&results["park_revive"][image]);
        let row = step_medians(&samples, &["park", "revive"]);
        print_row(image, &row[..2]);
    }
    println!("\nidle instance on about:blank, PSS (median of six readings)\n");
    println!("| image | MiB |");
    println!("|---|---|");
    for image in ["firefox", "chromium"] {
        println!("| {image} | {:.0} |", idle_memory(&serve, image).await?);
    }
    println!(
        "\n{} creates found no warm browser (deleted and retried, not counted)",
        results["cold_creates"]
    );
    serve.stop().await;
    Ok(())
}
