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
use std::time::Duration;

use anyhow::Context as _;

use flotilla_bench::{
    ServeProcess, number_flag, percentile, raw_chromium_start, summary_row, text_flag,
};
use flotilla_node_agent::config::AgentConfig;

struct Args {
    binary: PathBuf,
    count: usize,
    image: String,
    warm_pool: usize,
}

fn parse_args() -> anyhow::Result<Args> {
    Ok(Args {
        binary: text_flag("--binary", "target/release/flotilla")?.into(),
        count: number_flag("--count", 20)?,
        image: text_flag("--image", "ubuntu:22.04")?,
        warm_pool: number_flag("--warm-pool", 0)?,
    })
}

/// Flotilla: create, then the first answer of /json/version through the gateway.
async fn flotilla_start(base: &str, image: &str, http: &reqwest::Client) -> anyhow::Result<f64> {
    flotilla_bench::create_to_cdp(http, base, &format!(r#"{{"image": "{image}"}}"#)).await
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
    raw_chromium_start(&executable, &image.args, &http).await?;
    flotilla_start(&serve.url, &args.image, &http).await?;

    let (mut raw, mut flotilla) = (Vec::new(), Vec::new());
    for _ in 0..args.count {
        raw.push(raw_chromium_start(&executable, &image.args, &http).await?);
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
