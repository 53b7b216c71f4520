//! Dormancy benchmarks of issue 4 against a release `flotilla serve`.
//!
//! Usage: dormancy_bench [--binary target/release/flotilla] [--count 20]
//!                       [--baseline path/to/an/older/flotilla] [--warm-pool 1]
//!
//! One instance holds cookies, localStorage and three tabs at local pages.
//! - quick_start rounds: open the three tabs, `POST …/dormant` (timed), then
//!   `POST …/revive` and `GET /json/version` through `urls.debug` (timed until
//!   CDP answers; the gateway answers as soon as the browser is up).
//! - full_restore rounds: `POST …/dormant`, then `POST …/revive`
//!   `{"method":"full_restore"}`, timed until the instance is `running` and its
//!   three tabs are back at their URLs.
//!
//! - wake-on-connect rounds: open the three tabs, park, then connect a CDP
//!   client to `urls.debug` (timed until its WebSocket handshake is
//!   answered) and read its tabs (`Target.getTargets`, timed until the three
//!   are listed, for at most 2 s: a quick_start wake brings none back).
//!
//! With `--warm-pool N` (default 1) the agent keeps N warm browsers, and
//! each timed revive or wake waits 2 s first, so that the pool has refilled
//! after the previous one (a build that revives into warm browsers takes
//! one; the serve's log says `reviving into a warm browser` each time).
//!
//! - profile rounds: a create on a persistent profile that holds cookies and
//!   localStorage (saved once by an instance that stored them), timed from
//!   the request until the instance runs; each is deleted without writing
//!   back. With a warm pool, the build's warm-pool counters from `/metrics`.
//!
//! Also: archive size, and memory (PSS of the browser) freed by parking.
//! With `--baseline OLDER_BINARY`, every measure runs on that build first,
//! then on this one, in the same run.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use serde_json::{Value, json};

use flotilla_bench::{
    ServeProcess, get_json, mem_available_mib, number_flag, percentile, raw_chromium_start,
    summary_row, text_flag,
};
use flotilla_node_agent::engine::cdp::CdpClient;

struct Args {
    binary: PathBuf,
    baseline: Option<PathBuf>,
    count: usize,
    warm_pool: usize,
}

fn parse_args() -> anyhow::Result<Args> {
    let baseline = text_flag("--baseline", "")?;
    Ok(Args {
        binary: text_flag("--binary", "target/release/flotilla")?.into(),
        baseline: (!baseline.is_empty()).then(|| baseline.into()),
        count: number_flag("--count", 20)?,
        warm_pool: number_flag("--warm-pool", 1)?,
    })
}

struct Bench {
    http: reqwest::Client,
    /// Whether the agent keeps warm browsers (see [`Bench::let_pool_refill`]).
    warm_pool: bool,
    base: String,
    id: String,
    debug_url: String,
    debug_port: u64,
}

impl Bench {
    /// Gives the warm pool the time to refill after the last revive took a
    /// browser (its refill waits 500 ms, then a launch).
    async fn let_pool_refill(&self) {
        if self.warm_pool {
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
    }

    async fn status(&self) -> anyhow::Result<Value> {
        get_json(
            &self.http,
            format!("{}/v2/instances/{}", self.base, self.id),
        )
        .await
    }

    async fn wait_running(&self) -> anyhow::Result<Value> {
        let poll = Duration::from_millis(5);
        flotilla_bench::wait_running(&self.http, &self.base, &self.id, poll).await
    }

    async fn post(&self, path: &str, body: &str) -> anyhow::Result<Value> {
        let response = self
            .http
            .post(format!("{}/v2/instances/{}/{path}", self.base, self.id))
            .body(body.to_owned())
            .send()
            .await?;
        let status = response.status();
        let value: Value = response.json().await?;
        if !status.is_success() {
            bail!("{path}: {status} {value}");
        }
        Ok(value)
    }

    async fn page_urls(&self) -> anyhow::Result<Vec<String>> {
        let list: Value = get_json(
            &self.http,
            format!("http://127.0.0.1:{}/json/list", self.debug_port),
        )
        .await?;
        let mut urls: Vec<String> = list
            .as_array()
            .into_iter()
            .flatten()
            .filter(|t| t["type"] == "page")
            .filter_map(|t| t["url"].as_str().map(str::to_owned))
            .collect();
        urls.sort();
        Ok(urls)
    }

    async fn open_tabs(&self, urls: &[String]) -> anyhow::Result<()> {
        let browser = CdpClient::connect(&self.debug_url).await?;
        for url in urls {
            browser
                .call(
                    "Target.createTarget",
                    json!({"url": url}),
                    None,
                    Duration::from_secs(30),
                )
                .await?;
        }
        Ok(())
    }
}

/// Serves three local pages that store cookies and localStorage; their URLs.
async fn serve_pages() -> anyhow::Result<Vec<String>> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let site = format!("http://{}", listener.local_addr()?);
    tokio::spawn(async move {
        let page = |title: &'static str| {
            format!(
                "<title>{title}</title><script>document.cookie='visited_{title}=1; max-age=86400'; \
                 document.cookie='session_{title}=1'; localStorage.setItem('{title}', 'x'.repeat(1000));</script>"
            )
        };
        let router = axum::Router::new()
            .route(
                "/one",
                axum::routing::get(move || async move { axum::response::Html(page("one")) }),
            )
            .route(
                "/two",
                axum::routing::get(move || async move { axum::response::Html(page("two")) }),
            )
            .route(
                "/three",
                axum::routing::get(move || async move { axum::response::Html(page("three")) }),
            );
        let _ = axum::serve(listener, router).await;
    });
    Ok(["/one", "/two", "/three"]
        .iter()
        .map(|p| format!("{site}{p}"))
        .collect())
}

/// Creates the instance under test and waits until it runs.
async fn create_instance(
    http: &reqwest::Client,
    base: &str,
    warm_pool: bool,
) -> anyhow::Result<Bench> {
    let created: Value = http
        .post(format!("{base}/v2/instances"))
        .body("{}")
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    let bench = Bench {
        http: http.clone(),
        warm_pool,
        base: base.to_owned(),
        id: created["id"].as_str().context("id")?.to_owned(),
        debug_url: created["urls"]["debug"]
            .as_str()
            .context("urls.debug")?
            .to_owned(),
        debug_port: created["debug_port"].as_u64().context("debug_port")?,
    };
    bench.wait_running().await?;
    Ok(bench)
}

/// The samples of the quick_start rounds.
#[derive(Default)]
struct QuickRounds {
    park_ms: Vec<f64>,
    quick_ms: Vec<f64>,
    sizes: Vec<f64>,
    freed_pss: Vec<f64>,
    freed_available: Vec<f64>,
    raw_ms: Vec<f64>,
}

/// `count` rounds of: open the tabs, park (timed), a raw Chromium start as the
/// baseline, and a quick_start revive until CDP answers (timed).
async fn measure_quick_start(
    bench: &Bench,
    tabs: &[String],
    snapshots: &Path,
    count: usize,
) -> anyhow::Result<QuickRounds> {
    let mut rounds = QuickRounds::default();
    for _ in 0..count {
        bench.open_tabs(tabs).await?;
        // Let a heartbeat sample the browser with its tabs.
        tokio::time::sleep(Duration::from_millis(5500)).await;
        park_and_measure(bench, snapshots, &mut rounds).await?;
        rounds
            .raw_ms
            .push(raw_chromium_start("/usr/lib/chromium/chromium", &[], &bench.http).await?);
        bench.let_pool_refill().await;
        rounds.quick_ms.push(quick_revive_ms(bench).await?);
        bench.wait_running().await?;
    }
    Ok(rounds)
}

/// Parks the instance: records the park time, the memory it freed and the
/// size of its archive.
async fn park_and_measure(
    bench: &Bench,
    snapshots: &Path,
    rounds: &mut QuickRounds,
) -> anyhow::Result<()> {
    let pss = bench.status().await?["resources"]["memory_mb"]
        .as_f64()
        .unwrap_or(0.0);
    let available = mem_available_mib();
    let started = Instant::now();
    let parked = bench.post("dormant", "").await?;
    rounds
        .park_ms
        .push(started.elapsed().as_secs_f64() * 1000.0);
    tokio::time::sleep(Duration::from_millis(300)).await;
    rounds.freed_pss.push(pss);
    rounds.freed_available.push(mem_available_mib() - available);
    let archive = snapshots.join(format!(
        "{}.tar.zst",
        parked["snapshot_id"].as_str().unwrap_or_default()
    ));
    rounds.sizes.push(
        std::fs::metadata(&archive)
            .map(|m| m.len() as f64 / 1024.0)
            .unwrap_or(f64::NAN),
    );
    Ok(())
}

/// Milliseconds from `POST …/revive` (quick_start) until `/json/version`
/// answers through the gateway.
async fn quick_revive_ms(bench: &Bench) -> anyhow::Result<f64> {
    let started = Instant::now();
    bench.post("revive", "").await?;
    let answered = bench
        .http
        .get(format!(
            "http://127.0.0.1:{}/json/version",
            bench.debug_port
        ))
        .send()
        .await?;
    if !answered.status().is_success() {
        bail!("CDP did not answer after revive: {}", answered.status());
    }
    Ok(started.elapsed().as_secs_f64() * 1000.0)
}

/// Opens the tabs, then `count` rounds of park and full_restore revive, timed
/// until the instance runs with its tabs back.
async fn measure_full_restore(
    bench: &Bench,
    tabs: &[String],
    count: usize,
) -> anyhow::Result<Vec<f64>> {
    let mut full_ms = Vec::new();
    bench.open_tabs(tabs).await?;
    for _ in 0..count {
        bench.post("dormant", "").await?;
        bench.let_pool_refill().await;
        let started = Instant::now();
        bench
            .post("revive", r#"{"method": "full_restore"}"#)
            .await?;
        bench.wait_running().await?;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let urls = bench.page_urls().await?;
            if tabs.iter().all(|t| urls.contains(t)) {
                break;
            }
            if Instant::now() > deadline {
                bail!("tabs not back after full_restore: {urls:?}");
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        full_ms.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    Ok(full_ms)
}

/// The samples of the wake-on-connect rounds.
#[derive(Default)]
struct WakeRounds {
    handshake_ms: Vec<f64>,
    tabs_ms: Vec<f64>,
    without_tabs: usize,
}

/// `count` rounds of: open the tabs, park, connect a CDP client to
/// `urls.debug` (timed to its handshake) and wait for the tabs in its
/// `Target.getTargets` (timed; at most 2 s).
async fn measure_wake_on_connect(
    bench: &Bench,
    tabs: &[String],
    count: usize,
) -> anyhow::Result<WakeRounds> {
    let mut rounds = WakeRounds::default();
    for _ in 0..count {
        // The tabs a quick_start wake did not bring back.
        let open = bench.page_urls().await?;
        let missing: Vec<String> = tabs.iter().filter(|t| !open.contains(t)).cloned().collect();
        bench.open_tabs(&missing).await?;
        bench.post("dormant", "").await?;
        bench.let_pool_refill().await;
        let started = Instant::now();
        let client = CdpClient::connect(&bench.debug_url).await?;
        rounds
            .handshake_ms
            .push(started.elapsed().as_secs_f64() * 1000.0);
        let deadline = Instant::now() + Duration::from_secs(2);
        loop {
            let targets = client
                .call(
                    "Target.getTargets",
                    json!({}),
                    None,
                    Duration::from_secs(30),
                )
                .await?;
            let listed: Vec<&str> = targets["targetInfos"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|t| t["url"].as_str())
                .collect();
            if tabs.iter().all(|t| listed.contains(&t.as_str())) {
                rounds
                    .tabs_ms
                    .push(started.elapsed().as_secs_f64() * 1000.0);
                break;
            }
            if Instant::now() > deadline {
                rounds.without_tabs += 1;
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        drop(client);
        bench.wait_running().await?;
    }
    Ok(rounds)
}

/// Saves a profile holding cookies and localStorage (an instance on it opens
/// `page`, then is deleted, which writes it back), then `count` creates on
/// it timed until they run, each deleted without writing back.
async fn measure_profile_creates(
    bench: &Bench,
    page: &str,
    count: usize,
) -> anyhow::Result<Vec<f64>> {
    let http = &bench.http;
    let base = &bench.base;
    http.post(format!("{base}/v2/profiles"))
        .body(r#"{"name": "bench"}"#)
        .send()
        .await?;
    let create = |persist: bool| async move {
        let body = format!(r#"{{"profile": {{"name": "bench", "persist": {persist}}}}}"#);
        let created: Value = http
            .post(format!("{base}/v2/instances"))
            .body(body)
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?;
        let id = created["id"].as_str().context("id")?.to_owned();
        let debug_url = created["urls"]["debug"]
            .as_str()
            .context("urls.debug")?
            .to_owned();
        flotilla_bench::wait_running(http, base, &id, Duration::from_millis(5)).await?;
        anyhow::Ok((id, debug_url))
    };
    let delete = |id: String| async move {
        http.delete(format!("{base}/v2/instances/{id}"))
            .send()
            .await?
            .error_for_status()?;
        anyhow::Ok(())
    };
    let (id, debug_url) = create(true).await?;
    let browser = CdpClient::connect(&debug_url).await?;
    let timeout = Duration::from_secs(30);
    browser
        .call("Target.createTarget", json!({"url": page}), None, timeout)
        .await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    drop(browser);
    delete(id).await?;
    let deadline = Instant::now() + Duration::from_secs(30);
    while get_json(http, format!("{base}/v2/profiles/bench")).await?["size_bytes"]
        .as_u64()
        .unwrap_or(0)
        == 0
    {
        if Instant::now() > deadline {
            bail!("the profile was not saved");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut samples = Vec::new();
    for _ in 0..count {
        bench.let_pool_refill().await;
        let started = Instant::now();
        let (id, _) = create(false).await?;
        samples.push(started.elapsed().as_secs_f64() * 1000.0);
        delete(id).await?;
    }
    Ok(samples)
}

/// Prints the results table and the archive and memory figures.
fn print_results(count: usize, quick: &QuickRounds, full_ms: &[f64], wake: &WakeRounds) {
    println!("{count} rounds each; one instance with cookies, localStorage and three tabs");
    println!("| operation | n | p50 ms | p95 ms | mean ms | min ms | max ms |");
    println!("|---|---|---|---|---|---|---|");
    println!(
        "{}",
        summary_row(
            "POST …/dormant (capture, Browser.close, archive, store)",
            &quick.park_ms
        )
    );
    println!(
        "{}",
        summary_row(
            "baseline: Chromium started by hand → /json/version (fresh profile)",
            &quick.raw_ms
        )
    );
    println!(
        "{}",
        summary_row(
            "POST …/revive quick_start → CDP answers on urls.debug",
            &quick.quick_ms
        )
    );
    println!(
        "{}",
        summary_row(
            "POST …/revive full_restore → running with the 3 tabs back",
            full_ms
        )
    );
    println!(
        "{}",
        summary_row(
            "wake on connect: CDP connect to urls.debug → handshake answered",
            &wake.handshake_ms
        )
    );
    println!(
        "{}",
        summary_row(
            "wake on connect: connect → the client lists its 3 tabs",
            &wake.tabs_ms
        )
    );
    println!(
        "wake on connect: {} of {count} rounds found no tabs within 2 s",
        wake.without_tabs
    );
    println!(
        "archive size KiB: p50 {:.1}, max {:.1}; browser PSS freed per park MiB: p50 {:.1}; MemAvailable gained MiB: p50 {:.1}",
        percentile(&quick.sizes, 0.5),
        quick.sizes.iter().copied().fold(0.0, f64::max),
        percentile(&quick.freed_pss, 0.5),
        percentile(&quick.freed_available, 0.5)
    );
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = parse_args()?;
    let tabs = serve_pages().await?;
    let builds: Vec<(&str, &Path)> = args
        .baseline
        .as_deref()
        .map(|baseline| ("baseline", baseline))
        .into_iter()
        .chain([("this build", args.binary.as_path())])
        .collect();
    for (name, binary) in builds {
        println!("\n### {name} ({})\n", binary.display());
        run_build(binary, &tabs, args.count, args.warm_pool).await?;
    }
    Ok(())
}

/// Every measure against one release `serve` of `binary`.
async fn run_build(
    binary: &Path,
    tabs: &[String],
    count: usize,
    warm_pool: usize,
) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let config = dir.path().join("bench.toml");
    // The pages' site is allowed out of the browsers' network.
    let site = tabs[0]
        .trim_start_matches("http://")
        .split('/')
        .next()
        .unwrap_or_default();
    std::fs::write(
        &config,
        format!("[agent]\nwarm_pool_size = {warm_pool}\n[agent.egress]\nallow = [\"{site}\"]\n"),
    )?;
    let data = dir.path().join("data");
    let serve = ServeProcess::start(binary, &data, Some(&config)).await?;
    let http = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(60))
        .build()?;
    let bench = create_instance(&http, &serve.url, warm_pool > 0).await?;
    let snapshots = data.canonicalize()?.join("snapshots").join(&bench.id);
    let quick = measure_quick_start(&bench, tabs, &snapshots, count).await?;
    // A build whose full restore loses the tabs still reports the rest.
    let full = measure_full_restore(&bench, tabs, count).await;
    let wake = measure_wake_on_connect(&bench, tabs, count).await?;
    let profile_ms = measure_profile_creates(&bench, &tabs[0], count).await?;
    let metrics = reqwest::get(format!("{}/metrics", serve.url))
        .await?
        .text()
        .await?;
    serve.stop().await;
    print_results(count, &quick, full.as_deref().unwrap_or(&[]), &wake);
    println!(
        "{}",
        summary_row(
            "create on a profile with cookies and localStorage → running",
            &profile_ms
        )
    );
    for line in metrics
        .lines()
        .filter(|l| l.starts_with("service_warm_pool_creates_total"))
    {
        println!("{line}");
    }
    if let Err(error) = full {
        println!("full_restore: {error}");
    }
    Ok(())
}
