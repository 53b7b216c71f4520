//! What an idle instance costs (issue 32): CPU and memory (PSS of its
//! process tree, as the agent reports them in `resources`) of an instance
//! left on `about:blank`, per image.
//!
//! Usage: idle_bench [--binary target/release/flotilla] [--seconds 40]
//!                   [--baseline path/to/an/older/flotilla] [--flag-trials]
//!
//! For each build (the baseline first): a release `serve` with no warm pool;
//! per image, one instance created and left alone for 10 s, then its
//! `resources` read every 5 s (the agent samples at each heartbeat) for
//! `--seconds`. Prints the mean CPU (percent of one core) and the median
//! PSS per image.
//!
//! `--flag-trials` measures `--binary` only, with images made for the
//! trial: Chromium and its headless shell each with no extra flag and with
//! each of [`TRIALS`] (added after the base flags, as an image's `args`).

use std::path::Path;
use std::time::Duration;

use anyhow::Context as _;
use serde_json::Value;

use flotilla_bench::{ServeProcess, create_running, get_json, number_flag, percentile, text_flag};

const IMAGES: [&str; 2] = ["ubuntu:22.04", "chromium-headless-shell"];

/// Flags that may lower an idle browser's memory without weakening its
/// isolation (site-per-process and the sandboxes stay): a name, and the
/// flags. `--disable-features` is given whole (Chromium reads only the last
/// one), the base list plus the trial's feature.
const TRIALS: [(&str, &[&str]); 4] = [
    ("no spare renderer", &["SpareRendererForSitePerProcess"]),
    ("no back-forward cache", &["BackForwardCache"]),
    ("GPU in the browser process", &[]),
    ("one renderer at most (a soft limit)", &[]),
];

/// The `args` of a trial image: the base `--disable-features` list with
/// the trial's features, or the trial's own switch.
fn trial_args(name: &str, features: &[&str]) -> Vec<String> {
    if !features.is_empty() {
        let base = flotilla_node_agent::config::BASE_CHROMIUM_FLAGS
            .iter()
            .find_map(|flag| flag.strip_prefix("--disable-features="))
            .unwrap_or_default();
        return vec![format!("--disable-features={base},{}", features.join(","))];
    }
    match name {
        "GPU in the browser process" => vec!["--in-process-gpu".to_owned()],
        _ => vec!["--renderer-process-limit=1".to_owned()],
    }
}

/// Each trial on both executables, in one `serve` with an image per trial.
async fn flag_trials(binary: &Path, seconds: u64) -> anyhow::Result<()> {
    let executables = [
        ("Chromium", "/usr/lib/chromium/chromium"),
        ("headless shell", "/usr/bin/chromium-headless-shell"),
    ];
    let mut config = String::from("[agent]\nwarm_pool_size = 0\n");
    let mut images = Vec::new();
    for (index, (label, executable)) in executables.iter().enumerate() {
        let mut trials = vec![("no extra flag".to_owned(), Vec::new())];
        trials.extend(
            TRIALS
                .iter()
                .map(|(name, features)| ((*name).to_owned(), trial_args(name, features))),
        );
        for (number, (name, args)) in trials.into_iter().enumerate() {
            let image = format!("trial-{index}-{number}");
            let args: Vec<String> = args.iter().map(|arg| format!("{arg:?}")).collect();
            config.push_str(&format!(
                "[agent.images.\"{image}\"]\nexecutable = {executable:?}\nargs = [{}]\n",
                args.join(", ")
            ));
            images.push((image, format!("{label}: {name}")));
        }
    }
    let dir = tempfile::tempdir()?;
    let config_file = dir.path().join("bench.toml");
    std::fs::write(&config_file, config)?;
    let serve = ServeProcess::start(binary, &dir.path().join("data"), Some(&config_file)).await?;
    let http = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(60))
        .build()?;
    println!("| trial | idle CPU, % of a core (mean) | PSS MiB (median) |");
    println!("|---|---|---|");
    for (image, label) in images {
        let (cpu, pss) = idle_instance(&http, &serve.url, &image, seconds).await?;
        println!("| {label} | {cpu:.2} | {pss:.1} |");
    }
    serve.stop().await;
    Ok(())
}

/// Mean CPU percent and median PSS MiB of one idle instance of `image`.
async fn idle_instance(
    http: &reqwest::Client,
    base: &str,
    image: &str,
    seconds: u64,
) -> anyhow::Result<(f64, f64)> {
    let created = create_running(
        http,
        base,
        &format!(r#"{{"image": "{image}"}}"#),
        Duration::from_millis(50),
    )
    .await?;
    let id = created["id"].as_str().context("id")?.to_owned();
    tokio::time::sleep(Duration::from_secs(10)).await;
    let (mut cpu, mut pss) = (Vec::new(), Vec::new());
    for _ in 0..seconds / 5 {
        tokio::time::sleep(Duration::from_secs(5)).await;
        let detail: Value = get_json(http, format!("{base}/v2/instances/{id}")).await?;
        cpu.push(
            detail["resources"]["cpu_percent"]
                .as_f64()
                .unwrap_or(f64::NAN),
        );
        pss.push(
            detail["resources"]["memory_mb"]
                .as_f64()
                .unwrap_or(f64::NAN),
        );
    }
    http.delete(format!("{base}/v2/instances/{id}"))
        .send()
        .await?
        .error_for_status()?;
    let mean_cpu = cpu.iter().sum::<f64>() / cpu.len().max(1) as f64;
    Ok((mean_cpu, percentile(&pss, 0.5)))
}

async fn run_build(name: &str, binary: &Path, seconds: u64) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let config = dir.path().join("bench.toml");
    std::fs::write(&config, "[agent]\nwarm_pool_size = 0\n")?;
    let serve = ServeProcess::start(binary, &dir.path().join("data"), Some(&config)).await?;
    let http = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(60))
        .build()?;
    for image in IMAGES {
        let (cpu, pss) = idle_instance(&http, &serve.url, image, seconds).await?;
        println!("| {name} | {image} | {cpu:.2} | {pss:.1} |");
    }
    serve.stop().await;
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let binary = text_flag("--binary", "target/release/flotilla")?;
    let baseline = text_flag("--baseline", "")?;
    let seconds = number_flag("--seconds", 40)? as u64;
    if std::env::args().any(|arg| arg == "--flag-trials") {
        return flag_trials(Path::new(&binary), seconds).await;
    }
    println!("| build | image | idle CPU, % of a core (mean) | PSS MiB (median) |");
    println!("|---|---|---|---|");
    if !baseline.is_empty() {
        run_build("baseline", Path::new(&baseline), seconds).await?;
    }
    run_build("this build", Path::new(&binary), seconds).await
}
