//! What browser isolation costs (issue 14), before and after in one run.
//!
//! Usage: isolation_bench [--binary target/release/flotilla]
//!                        [--before PATH [--before-isolated]] [--count 20] [--density 10]
//!
//! Variants, each a `flotilla serve` of its own, all running at once and
//! measured round-robin so that the machine's noise hits them alike:
//! - `before`: `--before`, a build of the commit before isolation (Chromium as
//!   root, `--no-sandbox`, bubblewrap over a read-write `/`, host network);
//!   left out when not given; with `--before-isolated`, a build that already
//!   isolates browsers (to compare two builds as installed, e.g. before and
//!   after a refactoring);
//! - `off`: this build with `agent.sandbox = false` and `agent.egress.enabled = false`
//!   (unprivileged user and Chromium's sandbox only);
//! - `on`: this build as installed: unprivileged user, minimal read-only
//!   bubblewrap root, Chromium's sandbox, own network namespace and egress proxy.
//!
//! Measures: cold create → `/json/version` via the debug port; the same with a
//! warm pool of 2 (each create once the pool has refilled); load of a small
//! local page (HTML, a stylesheet and an image; every response `no-store`,
//! `Page.navigate` → `Page.loadEventFired`); and per idle instance the PSS of
//! its process tree (as the API reports it), the serve process's RSS growth
//! and the drop of `MemAvailable`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, bail};
use serde_json::Value;

use flotilla_bench::{
    ServeProcess, Tab, get_json, mean, mem_available_mib, number_flag, percentile, rss_kib,
    summary_row, text_flag, wait_running,
};

struct Variant {
    name: &'static str,
    binary: PathBuf,
    /// Extra `[agent]` lines of its configuration.
    agent: &'static str,
    /// Whether it knows `[agent.egress]` (builds before isolation do not).
    knows_egress: bool,
}

struct Running {
    name: &'static str,
    serve: ServeProcess,
    _dir: tempfile::TempDir,
}

async fn start(
    variant: &Variant,
    ports: &str,
    warm_pool: usize,
    allow: &str,
) -> anyhow::Result<Running> {
    let dir = tempfile::Builder::new()
        .prefix("flotilla-isolation-bench-")
        .tempdir()?;
    let egress = if variant.knows_egress {
        format!("[agent.egress]\nallow = [\"{allow}\"]\n")
    } else {
        String::new()
    };
    let config = format!(
        "[http]\nbind_address = \"127.0.0.1:0\"\n[nodes]\nheartbeat_interval_sec = 1\n[scheduler]\nmax_utilisation_percent = 100\n\
         [agent]\nwarm_pool_size = {warm_pool}\nmax_instances = 40\nport_range = \"{ports}\"\n{}\n{egress}",
        variant.agent
    );
    let path = dir.path().join("flotilla.toml");
    std::fs::write(&path, config)?;
    let serve = ServeProcess::start(&variant.binary, &dir.path().join("data"), Some(&path)).await?;
    Ok(Running {
        name: variant.name,
        serve,
        _dir: dir,
    })
}

fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(120))
        .build()
        .expect("client")
}

async fn delete(base: &str, id: &str, http: &reqwest::Client) -> anyhow::Result<()> {
    http.delete(format!("{base}/v2/instances/{id}?force=true"))
        .send()
        .await?
        .error_for_status()?;
    Ok(())
}

/// A local site: a page, its stylesheet and an image, never cached.
async fn serve_site() -> anyhow::Result<String> {
    use axum::http::header;
    let png: &'static [u8] = &[
        0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a, 0x00, 0x00, 0x00, 0x0d, 0x49, 0x48, 0x44,
        0x52, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x01, 0x08, 0x06, 0x00, 0x00, 0x00, 0x1f,
        0x15, 0xc4, 0x89, 0x00, 0x00, 0x00, 0x0d, 0x49, 0x44, 0x41, 0x54, 0x78, 0x9c, 0x63, 0xf8,
        0xcf, 0xc0, 0xf0, 0x1f, 0x00, 0x05, 0x00, 0x01, 0xff, 0x89, 0x99, 0x3d, 0x1d, 0x00, 0x00,
        0x00, 0x00, 0x49, 0x45, 0x4e, 0x44, 0xae, 0x42, 0x60, 0x82,
    ];
    let page = format!(
        "<!doctype html><html><head><title>bench</title><link rel=stylesheet href=/style.css></head>\
         <body><h1>Small page</h1><p>{}</p><img src=/img.png></body></html>",
        "Lorem ipsum dolor sit amet. ".repeat(40)
    );
    let no_store = [(header::CACHE_CONTROL, "no-store")];
    let router = axum::Router::new()
        .route(
            "/",
            axum::routing::get(move || {
                let page = page.clone();
                async move { (no_store, axum::response::Html(page)) }
            }),
        )
        .route(
            "/style.css",
            axum::routing::get(move || async move {
                (
                    [
                        (header::CACHE_CONTROL, "no-store"),
                        (header::CONTENT_TYPE, "text/css"),
                    ],
                    "body{font:16px sans-serif;background:#eef}h1{color:#336}",
                )
            }),
        )
        .route(
            "/img.png",
            axum::routing::get(move || async move {
                (
                    [
                        (header::CACHE_CONTROL, "no-store"),
                        (header::CONTENT_TYPE, "image/png"),
                    ],
                    png,
                )
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    Ok(addr.to_string())
}

fn print_table(title: &str, results: &[(&str, Vec<f64>)]) {
    println!("\n{title}\n");
    println!("| variant | n | p50 ms | p95 ms | mean ms | min ms | max ms |");
    println!("|---|---|---|---|---|---|---|");
    for (name, samples) in results {
        println!("{}", summary_row(name, samples));
    }
    let p50 = |name: &str| {
        results
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, s)| percentile(s, 0.5))
    };
    if let (Some(on), Some(off)) = (p50("on"), p50("off")) {
        println!("\np50 on / off: {:.3}", on / off);
    }
    if let (Some(on), Some(before)) = (p50("on"), p50("before")) {
        println!("p50 on / before: {:.3}", on / before);
    }
}

/// Runs `measure` `count` times per serve, round-robin; samples per variant.
async fn round_robin<F, Fut>(
    serves: &[Running],
    count: usize,
    pause: Duration,
    mut measure: F,
) -> anyhow::Result<Vec<(&'static str, Vec<f64>)>>
where
    F: FnMut(usize, usize) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<f64>>,
{
    let mut samples: Vec<(&'static str, Vec<f64>)> =
        serves.iter().map(|s| (s.name, Vec::new())).collect();
    for round in 0..count {
        for (index, _) in serves.iter().enumerate() {
            let sample = measure(index, round).await?;
            samples[index].1.push(sample);
            tokio::time::sleep(pause).await;
        }
    }
    Ok(samples)
}

/// The variants to compare: `before` (when `--before` is given), `off` and
/// `on`; an error if one of their binaries is not built.
fn variants_to_compare(
    binary: PathBuf,
    (before, before_isolated): (String, bool),
) -> anyhow::Result<Vec<Variant>> {
    let mut variants = Vec::new();
    if !before.is_empty() {
        variants.push(Variant {
            name: "before",
            binary: before.into(),
            agent: "",
            knows_egress: before_isolated,
        });
    }
    variants.push(Variant {
        name: "off",
        binary: binary.clone(),
        agent: "sandbox = false\n[agent.egress]\nenabled = false",
        knows_egress: false,
    });
    variants.push(Variant {
        name: "on",
        binary,
        agent: "",
        knows_egress: true,
    });
    for variant in &variants {
        if !Path::new(&variant.binary).is_file() {
            bail!("{} is not built", variant.binary.display());
        }
    }
    Ok(variants)
}

/// Starts a serve per variant, each on its own port range, with a warm pool
/// of `warm_pool`.
async fn start_all(
    variants: &[Variant],
    port_ranges: [&str; 3],
    warm_pool: usize,
    site: &str,
) -> anyhow::Result<Vec<Running>> {
    let mut serves = Vec::new();
    for (variant, ports) in variants.iter().zip(port_ranges) {
        serves.push(start(variant, ports, warm_pool, site).await?);
    }
    Ok(serves)
}

/// Cold creates → CDP answering, after one throwaway create each; prints the
/// table.
async fn measure_cold_creates(
    serves: &[Running],
    http: &reqwest::Client,
    count: usize,
) -> anyhow::Result<()> {
    // One throwaway create each, so that caches are warm for everyone.
    for serve in serves {
        flotilla_bench::create_to_cdp(http, &serve.serve.url, "{}").await?;
    }
    let cold = round_robin(serves, count, Duration::from_millis(200), |index, _| {
        let base = serves[index].serve.url.clone();
        let http = http.clone();
        async move { flotilla_bench::create_to_cdp(&http, &base, "{}").await }
    })
    .await?;
    print_table(
        &format!("Create → CDP answering, cold (n = {count} per variant)"),
        &cold,
    );
    Ok(())
}

/// One running instance per serve with a tab that has loaded the site once;
/// the tabs and the instances' ids.
async fn open_warmed_tabs(
    serves: &[Running],
    http: &reqwest::Client,
    site: &str,
) -> anyhow::Result<(Vec<Tab>, Vec<String>)> {
    let mut tabs = Vec::new();
    let mut page_ids = Vec::new();
    for serve in serves {
        let created = flotilla_bench::create(http, &serve.serve.url, "{}").await?;
        let id = created["id"].as_str().context("id")?.to_owned();
        wait_running(http, &serve.serve.url, &id, Duration::from_millis(50)).await?;
        let debug = created["urls"]["debug"]
            .as_str()
            .context("debug")?
            .to_owned();
        let tab = Tab::open(&debug).await?;
        tab.load(&format!("http://{site}/?warmup")).await?;
        tabs.push(tab);
        page_ids.push(id);
    }
    Ok((tabs, page_ids))
}

/// Loads of the small local page, round-robin; prints the table and deletes
/// the instances.
async fn measure_page_loads(
    serves: &[Running],
    http: &reqwest::Client,
    site: &str,
    count: usize,
) -> anyhow::Result<()> {
    let (tabs, page_ids) = open_warmed_tabs(serves, http, site).await?;
    let loads = round_robin(
        serves,
        count * 2,
        Duration::from_millis(50),
        |index, round| {
            let tab = &tabs[index];
            let url = format!("http://{site}/?n={round}");
            async move { tab.load(&url).await }
        },
    )
    .await?;
    print_table(
        &format!(
            "Load of a small local page (HTML + CSS + image), n = {} per variant",
            count * 2
        ),
        &loads,
    );
    drop(tabs);
    for (serve, id) in serves.iter().zip(&page_ids) {
        delete(&serve.serve.url, id, http).await?;
    }
    Ok(())
}

/// Memory per idle instance: prints the table, a row per serve.
async fn measure_idle_memory(
    serves: &[Running],
    http: &reqwest::Client,
    density: usize,
) -> anyhow::Result<()> {
    println!("\nIdle instances on about:blank, {density} per variant\n");
    println!(
        "| variant | PSS per instance MiB | serve RSS growth per instance MiB | MemAvailable drop per instance MiB |"
    );
    println!("|---|---|---|---|");
    for serve in serves {
        print_idle_memory_row(serve, http, density).await?;
    }
    Ok(())
}

/// Starts `density` idle instances on `serve`, prints their PSS, serve's RSS
/// growth and the MemAvailable drop per instance, then deletes them.
async fn print_idle_memory_row(
    serve: &Running,
    http: &reqwest::Client,
    density: usize,
) -> anyhow::Result<()> {
    let pid = serve.serve.child.id().context("serve pid")?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (rss_before, available_before) = (rss_kib(pid) as f64 / 1024.0, mem_available_mib());
    let mut ids = Vec::new();
    for _ in 0..density {
        let created = flotilla_bench::create(http, &serve.serve.url, "{}").await?;
        let id = created["id"].as_str().context("id")?.to_owned();
        wait_running(http, &serve.serve.url, &id, Duration::from_millis(50)).await?;
        ids.push(id);
    }
    // Let the browsers settle and two heartbeats sample them.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let mut pss = Vec::new();
    for id in &ids {
        let instance: Value =
            get_json(http, format!("{}/v2/instances/{id}", serve.serve.url)).await?;
        pss.push(instance["resources"]["memory_mb"].as_f64().unwrap_or(0.0));
    }
    let (rss_after, available_after) = (rss_kib(pid) as f64 / 1024.0, mem_available_mib());
    println!(
        "| {} | {:.1} | {:.2} | {:.1} |",
        serve.name,
        mean(&pss),
        (rss_after - rss_before) / density as f64,
        (available_before - available_after) / density as f64
    );
    for id in &ids {
        delete(&serve.serve.url, id, http).await?;
    }
    Ok(())
}

/// Fresh serves with a warm pool of 2: creates → CDP answering; prints the
/// table and stops the serves.
async fn measure_warm_creates(
    variants: &[Variant],
    port_ranges: [&str; 3],
    site: &str,
    http: &reqwest::Client,
    count: usize,
) -> anyhow::Result<()> {
    let warm = start_all(variants, port_ranges, 2, site).await?;
    tokio::time::sleep(Duration::from_secs(10)).await;
    let warm_results = round_robin(&warm, count, Duration::from_millis(1500), |index, _| {
        let base = warm[index].serve.url.clone();
        let http = http.clone();
        async move { flotilla_bench::create_to_cdp(&http, &base, "{}").await }
    })
    .await?;
    print_table(
        &format!("Create → CDP answering, warm pool of 2 (n = {count} per variant)"),
        &warm_results,
    );
    for serve in warm {
        serve.serve.stop().await;
    }
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let binary: PathBuf = text_flag("--binary", "target/release/flotilla")?.into();
    let before = text_flag("--before", "")?;
    let count = number_flag("--count", 20)?;
    let density = number_flag("--density", 10)?;
    let before_isolated = std::env::args().any(|arg| arg == "--before-isolated");
    let variants = variants_to_compare(binary, (before, before_isolated))?;
    let site = serve_site().await?;
    let http = http();
    let port_ranges = ["24000-24299", "24300-24599", "24600-24899"];

    // Cold creates and page loads, then density, on serves without a pool.
    let serves = start_all(&variants, port_ranges, 0, &site).await?;
    measure_cold_creates(&serves, &http, count).await?;
    measure_page_loads(&serves, &http, &site, count).await?;
    measure_idle_memory(&serves, &http, density).await?;
    for serve in serves {
        serve.serve.stop().await;
    }

    measure_warm_creates(&variants, port_ranges, &site, &http, count).await?;
    Ok(())
}
