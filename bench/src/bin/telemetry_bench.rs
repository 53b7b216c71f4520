//! What traces cost (issue 31): release `flotilla serve`s on the sim
//! runtime side by side: this build without `[telemetry]` (the default),
//! this build exporting every span to an OTLP/HTTP collector on this
//! machine (`flotilla_testkit::OtlpReceiver`), and with `--before`, the
//! build before traces (the baseline). Interleaved, on each: `GET
//! /v2/instances/{id}` round trips, and create → delete rounds (each a
//! request span and an operation span, the create's with the agent's part).
//!
//! Usage: telemetry_bench [--binary target/release/flotilla] [--before PATH]
//! [--gets 3000] [--rounds 300]

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context as _;

use flotilla_bench::{number_flag, p50_p99_row, text_flag};
use flotilla_testkit::{OtlpReceiver, ServeProcess};

async fn start(binary: &Path, dir: &Path, otlp: Option<&str>) -> anyhow::Result<ServeProcess> {
    let mut env = vec![
        ("RUST_LOG", "warn"),
        ("FLOTILLA_AGENT__RUNTIME", "sim"),
        ("FLOTILLA_AGENT__MAX_INSTANCES", "100"),
        ("FLOTILLA_AGENT__WARM_POOL_SIZE", "0"),
        ("FLOTILLA_SCHEDULER__MAX_UTILISATION_PERCENT", "100"),
        ("FLOTILLA_RATE_LIMIT__ENABLED", "false"),
    ];
    if let Some(url) = otlp {
        env.push(("FLOTILLA_TELEMETRY__OTLP_ENDPOINT", url));
    }
    ServeProcess::start(binary, dir, &env).await
}

/// Milliseconds of one `GET` of `url`.
async fn get_ms(http: &reqwest::Client, url: &str) -> anyhow::Result<f64> {
    let start = Instant::now();
    http.get(url)
        .send()
        .await?
        .error_for_status()?
        .bytes()
        .await?;
    Ok(start.elapsed().as_secs_f64() * 1000.0)
}

/// Creates an instance (sim: no browser); its id.
async fn create(http: &reqwest::Client, base: &str) -> anyhow::Result<String> {
    let created: serde_json::Value = http
        .post(format!("{base}/v2/instances"))
        .body("{}")
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    Ok(created["id"].as_str().context("an id")?.to_owned())
}

/// Milliseconds of a create and its delete.
async fn round_ms(http: &reqwest::Client, base: &str) -> anyhow::Result<f64> {
    let start = Instant::now();
    let id = create(http, base).await?;
    http.delete(format!("{base}/v2/instances/{id}"))
        .send()
        .await?
        .error_for_status()?;
    Ok(start.elapsed().as_secs_f64() * 1000.0)
}

/// The table: per server, its GETs' and its rounds' figures.
fn print_rows(servers: &[(&str, &ServeProcess)], gets: &[Vec<f64>], rounds: &[Vec<f64>]) {
    println!("| telemetry | request | n | p50 ms | p99 ms | mean ms |");
    println!("|---|---|---|---|---|---|");
    let mean = |samples: &[f64]| samples.iter().sum::<f64>() / samples.len() as f64;
    for (side, (name, _)) in servers.iter().enumerate() {
        let (gets, rounds) = (&gets[side], &rounds[side]);
        let get_row = format!("{name} | GET /v2/instances/{{id}}");
        println!("{}", p50_p99_row(&get_row, gets, mean(gets)));
        let round_row = format!("{name} | create + delete (sim)");
        println!("{}", p50_p99_row(&round_row, rounds, mean(rounds)));
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let binary = std::path::PathBuf::from(text_flag("--binary", "target/release/flotilla")?);
    let gets = number_flag("--gets", 3000)?;
    let rounds = number_flag("--rounds", 300)?;
    let temp = tempfile::Builder::new()
        .prefix("flotilla-telemetry-bench-")
        .tempdir()?;
    let collector = OtlpReceiver::start().await;
    let before = text_flag("--before", "")?;
    let mut running = Vec::new();
    if !before.is_empty() {
        let serve = start(Path::new(&before), &temp.path().join("before"), None).await?;
        running.push(("the build before traces", serve));
    }
    running.push((
        "off (default)",
        start(&binary, &temp.path().join("off"), None).await?,
    ));
    running.push((
        "on, every span exported",
        start(&binary, &temp.path().join("on"), Some(&collector.url)).await?,
    ));
    let http = reqwest::Client::new();
    let servers: Vec<(&str, &ServeProcess)> =
        running.iter().map(|(name, serve)| (*name, serve)).collect();

    let mut instance_urls = Vec::new();
    for (_, serve) in &servers {
        let id = create(&http, &serve.api.base).await?;
        instance_urls.push(format!("{}/v2/instances/{id}", serve.api.base));
    }
    // Warm both up (connections, caches) before measuring.
    for url in &instance_urls {
        for _ in 0..200 {
            get_ms(&http, url).await?;
        }
    }
    let mut get_samples = vec![Vec::new(); servers.len()];
    for _ in 0..gets {
        for (side, url) in instance_urls.iter().enumerate() {
            get_samples[side].push(get_ms(&http, url).await?);
        }
    }
    let mut round_samples = vec![Vec::new(); servers.len()];
    for _ in 0..rounds {
        for (side, (_, serve)) in servers.iter().enumerate() {
            round_samples[side].push(round_ms(&http, &serve.api.base).await?);
        }
    }
    // Spans are batched: let the last batch arrive before counting.
    let deadline = Instant::now() + Duration::from_secs(15);
    let expected = gets + 2 * rounds;
    while collector.spans().len() < expected && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    print_rows(&servers, &get_samples, &round_samples);
    println!(
        "spans received by the collector: {} (malformed exports: {})",
        collector.spans().len(),
        collector.malformed()
    );
    for (_, mut serve) in running {
        serve.stop_with(libc::SIGTERM).await;
    }
    Ok(())
}
