//! Create → CDP answering on `urls.debug`, against Chromium started by hand
//! with the same flags, interleaved in one run.
//!
//! Usage: create_latency [--binary target/release/flotilla] [--count 20]
//!                       [--image ubuntu:22.04] [--warm-pool N]
//!
//! `--warm-pool 0` (the default here) measures cold starts. With N > 0 the node
//! keeps N browsers started; each create is made once the pool has refilled
//! (1.5 s after the previous delete), the steady state of a pool that keeps up
//! with the arrival rate.
//!
//! Flotilla: POST /v2/instances, then GET /json/version on the debug port
//! (the gateway answers as soon as the browser does) → stop the clock; then
//! DELETE ?force=true. Raw: spawn the same executable with the same flags and a
//! fixed --remote-debugging-port, poll GET /json/version every 2 ms → stop the
//! clock; then SIGKILL its process group.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use serde_json::Value;

use flotilla_bench::{ServeProcess, percentile, summary_row};
use flotilla_node_agent::config::{AgentConfig, BASE_CHROMIUM_FLAGS};

struct Args {
    binary: PathBuf,
    count: usize,
    image: String,
    warm_pool: usize,
}

fn parse_args() -> anyhow::Result<Args> {
    let mut args = Args {
        binary: PathBuf::from("target/release/flotilla"),
        count: 20,
        image: "ubuntu:22.04".into(),
        warm_pool: 0,
    };
    let mut iter = std::env::args().skip(1);
    while let Some(flag) = iter.next() {
        let value = iter
            .next()
            .with_context(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--binary" => args.binary = value.into(),
            "--count" => args.count = value.parse()?,
            "--image" => args.image = value,
            "--warm-pool" => args.warm_pool = value.parse()?,
            other => bail!("unknown flag {other}"),
        }
    }
    Ok(args)
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Chromium by hand: same executable and flags, fixed port, poll /json/version.
async fn raw_start(
    executable: &str,
    extra: &[String],
    http: &reqwest::Client,
) -> anyhow::Result<f64> {
    let profile = tempfile::tempdir()?;
    let port = free_port();
    let started = Instant::now();
    let mut command = tokio::process::Command::new(executable);
    command
        .args(BASE_CHROMIUM_FLAGS)
        .args(extra)
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg(format!("--remote-debugging-port={port}"))
        .arg("--window-size=1280,720")
        .arg("--no-sandbox")
        .arg("about:blank")
        .env("HOME", profile.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0);
    let mut child = command.spawn()?;
    let url = format!("http://127.0.0.1:{port}/json/version");
    let elapsed = loop {
        if let Ok(response) = http.get(&url).send().await
            && response.status().is_success()
        {
            break started.elapsed();
        }
        if started.elapsed() > Duration::from_secs(30) {
            bail!("raw chromium did not answer in 30 s");
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    };
    if let Some(pid) = child.id() {
        // SAFETY: killpg has no memory-safety preconditions.
        unsafe { libc::killpg(pid as i32, libc::SIGKILL) };
    }
    let _ = child.wait().await;
    Ok(elapsed.as_secs_f64() * 1000.0)
}

/// Flotilla: create, then the first answer of /json/version through the gateway.
async fn flotilla_start(base: &str, image: &str, http: &reqwest::Client) -> anyhow::Result<f64> {
    let started = Instant::now();
    let created: Value = http
        .post(format!("{base}/v2/instances"))
        .body(format!(r#"{{"image": "{image}"}}"#))
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    let port = created["debug_port"].as_u64().context("debug_port")?;
    let response = http
        .get(format!("http://127.0.0.1:{port}/json/version"))
        .send()
        .await?;
    if !response.status().is_success() {
        bail!("gateway answered {}", response.status());
    }
    let elapsed = started.elapsed().as_secs_f64() * 1000.0;
    let id = created["id"].as_str().context("id")?;
    http.delete(format!("{base}/v2/instances/{id}?force=true"))
        .send()
        .await?
        .error_for_status()?;
    Ok(elapsed)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = parse_args()?;
    let catalog = AgentConfig::default().image_catalog();
    let image = catalog
        .get(&args.image)
        .context("image not in the built-in catalog")?;
    let executable = image.executable.display().to_string();
    let data = tempfile::tempdir()?;
    let config = data.path().join("bench.toml");
    std::fs::write(
        &config,
        format!(
            "[agent]\nwarm_pool_size = {}\nwarm_pool_image = \"{}\"\n",
            args.warm_pool, args.image
        ),
    )?;
    let serve = ServeProcess::start(&args.binary, &data.path().join("data"), Some(&config)).await?;
    let http = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(60))
        .build()?;

    // Warm the page cache and both paths once.
    raw_start(&executable, &image.args, &http).await?;
    flotilla_start(&serve.url, &args.image, &http).await?;

    let (mut raw, mut flotilla) = (Vec::new(), Vec::new());
    for _ in 0..args.count {
        raw.push(raw_start(&executable, &image.args, &http).await?);
        if args.warm_pool > 0 {
            tokio::time::sleep(Duration::from_millis(1500)).await;
        }
        flotilla.push(flotilla_start(&serve.url, &args.image, &http).await?);
    }
    serve.stop().await;

    println!(
        "image {} ({executable}), {} sequential starts each, interleaved, warm pool {}",
        args.image, args.count, args.warm_pool
    );
    println!("| path | n | p50 ms | p95 ms | mean ms | min ms | max ms |");
    println!("|---|---|---|---|---|---|---|");
    println!(
        "{}",
        summary_row("Chromium by hand (poll /json/version every 2 ms)", &raw)
    );
    println!(
        "{}",
        summary_row("Flotilla create → /json/version via urls.debug", &flotilla)
    );
    println!(
        "p50 ratio flotilla/raw = {:.3}; p95 ratio = {:.3}",
        percentile(&flotilla, 0.5) / percentile(&raw, 0.5),
        percentile(&flotilla, 0.95) / percentile(&raw, 0.95)
    );
    Ok(())
}
