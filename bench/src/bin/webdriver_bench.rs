//! WebDriver through Flotilla against a local chromedriver (or, with
//! `--browser firefox`, a local geckodriver launching Firefox ESR against
//! Flotilla's Firefox sessions on geckodriver), in one run:
//!
//! 1. **New session → first command answered.** Flotilla (`POST /session`
//!    on the control plane with a warm pool, then `GET /session/{id}/title`)
//!    against a local `chromedriver` launching its own Chromium (the same
//!    executable and flags). Interleaved, one after the other.
//! 2. **Command round trip**: `GET /session/{id}/title` on one session of
//!    each, N times in turn.
//! 3. **Memory of chromedriver**: PSS of Flotilla's chromedriver processes
//!    (one per session, each in its instance's confinement) with 1 and 4
//!    sessions, against one local chromedriver serving 1 and 4 sessions.
//!
//! Usage: webdriver_bench [--binary target/release/flotilla] [--count 10]
//!                        [--round-trips 2000] [--warm-pool 2]
//!                        [--browser chrome|firefox]

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use serde_json::{Value, json};

use flotilla_bench::{ServeProcess, free_port, number_flag, percentile, summary_row, text_flag};
use flotilla_node_agent::config::{AgentConfig, BASE_CHROMIUM_FLAGS};
use flotilla_node_agent::system::monitor::pss_kib;

const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
const GECKODRIVER: &str = "/usr/local/bin/geckodriver";

struct Args {
    binary: PathBuf,
    count: usize,
    round_trips: usize,
    warm_pool: usize,
    /// `chrome` or `firefox`.
    browser: String,
}

impl Args {
    fn firefox(&self) -> bool {
        self.browser == "firefox"
    }

    /// The driver's name (its processes' `comm`).
    fn driver(&self) -> &'static str {
        if self.firefox() {
            "geckodriver"
        } else {
            "chromedriver"
        }
    }
}

fn parse_args() -> anyhow::Result<Args> {
    Ok(Args {
        binary: text_flag("--binary", "target/release/flotilla")?.into(),
        count: number_flag("--count", 10)?,
        round_trips: number_flag("--round-trips", 2000)?,
        warm_pool: number_flag("--warm-pool", 2)?,
        browser: text_flag("--browser", "chrome")?,
    })
}

/// A WebDriver endpoint: its base URL and the capabilities a new session
/// sends.
struct Endpoint {
    base: String,
    capabilities: Value,
}

impl Endpoint {
    /// New session, then its first command answered: milliseconds, and the
    /// session id.
    async fn new_session(&self, http: &reqwest::Client) -> anyhow::Result<(f64, String)> {
        let started = Instant::now();
        let created: Value = http
            .post(format!("{}/session", self.base))
            .json(&json!({"capabilities": {"alwaysMatch": self.capabilities}}))
            .send()
            .await?
            .json()
            .await?;
        let id = created["value"]["sessionId"]
            .as_str()
            .with_context(|| format!("no session: {created}"))?
            .to_owned();
        self.title(http, &id).await?;
        Ok((started.elapsed().as_secs_f64() * 1000.0, id))
    }

    async fn title(&self, http: &reqwest::Client, id: &str) -> anyhow::Result<()> {
        let response = http
            .get(format!("{}/session/{id}/title", self.base))
            .send()
            .await?;
        if !response.status().is_success() {
            bail!("title: {}", response.text().await?);
        }
        response.bytes().await?;
        Ok(())
    }

    async fn delete(&self, http: &reqwest::Client, id: &str) -> anyhow::Result<()> {
        http.delete(format!("{}/session/{id}", self.base))
            .send()
            .await?
            .error_for_status()?;
        Ok(())
    }
}

/// A local driver (chromedriver, or geckodriver for Firefox) on a free port.
async fn local_driver(
    http: &reqwest::Client,
    args: &Args,
) -> anyhow::Result<(tokio::process::Child, String)> {
    let port = free_port();
    let (executable, port_arg) = if args.firefox() {
        (GECKODRIVER, format!("--port={port}"))
    } else {
        (CHROMEDRIVER, format!("--port={port}"))
    };
    let child = tokio::process::Command::new(executable)
        .arg(port_arg)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("cannot start {executable} (scripts/install-deps installs it)"))?;
    let base = format!("http://127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(20);
    while http.get(format!("{base}/status")).send().await.is_err() {
        if Instant::now() > deadline {
            bail!("{executable} did not answer");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok((child, base))
}

/// The processes named `driver` whose parent is not `local` (the local
/// one's pid): Flotilla's; or only `local` when given.
fn driver_pids(driver: &str, local: Option<u32>) -> Vec<u32> {
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        if comm.trim() == driver {
            pids.push(pid);
        }
    }
    match local {
        Some(local) => pids.into_iter().filter(|p| *p == local).collect(),
        None => pids,
    }
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// The two endpoints for Firefox: Flotilla's control plane and the local
/// geckodriver launching Firefox ESR headless.
fn firefox_endpoints(serve: &ServeProcess, local_base: String) -> (Endpoint, Endpoint) {
    let local = Endpoint {
        base: local_base,
        capabilities: json!({"browserName": "firefox", "moz:firefoxOptions": {
            "binary": "/usr/lib/firefox-esr/firefox-esr",
            "args": ["-headless", "--width=1280", "--height=720"]}}),
    };
    let flotilla = Endpoint {
        base: serve.url.clone(),
        capabilities: json!({"browserName": "firefox"}),
    };
    (local, flotilla)
}

/// The two endpoints: Flotilla's control plane and the local chromedriver
/// (with the Chromium flags Flotilla's browsers have).
fn endpoints(serve: &ServeProcess, local_base: String) -> anyhow::Result<(Endpoint, Endpoint)> {
    let catalog = AgentConfig::default().image_catalog();
    let image = catalog.get("ubuntu:22.04").context("default image")?;
    let mut chrome_args: Vec<String> = BASE_CHROMIUM_FLAGS
        .iter()
        .map(|f| (*f).to_owned())
        .collect();
    chrome_args.extend(image.args.iter().cloned());
    chrome_args.extend(["--no-sandbox".into(), "--window-size=1280,720".into()]);
    let local = Endpoint {
        base: local_base,
        capabilities: json!({"browserName": "chrome",
            "goog:chromeOptions": {"binary": image.executable, "args": chrome_args}}),
    };
    let flotilla = Endpoint {
        base: serve.url.clone(),
        capabilities: json!({"browserName": "chrome"}),
    };
    Ok((local, flotilla))
}

/// How long the warm pool takes to refill after a session takes a browser
/// (Firefox's pooled browsers also run a first BiDi session).
const REFILL: Duration = Duration::from_millis(1500);
const FIREFOX_REFILL: Duration = Duration::from_millis(5000);

/// 1. New session → first command, interleaved: milliseconds (local,
///    Flotilla).
async fn new_sessions(
    http: &reqwest::Client,
    (local, flotilla): (&Endpoint, &Endpoint),
    (count, refill): (usize, Duration),
) -> anyhow::Result<(Vec<f64>, Vec<f64>)> {
    // Warm both paths (page cache, the pool).
    for endpoint in [local, flotilla] {
        let (_, id) = endpoint.new_session(http).await?;
        endpoint.delete(http, &id).await?;
    }
    tokio::time::sleep(refill * 2).await;
    let (mut local_new, mut flotilla_new) = (Vec::new(), Vec::new());
    for _ in 0..count {
        let (ms, id) = local.new_session(http).await?;
        local_new.push(ms);
        local.delete(http, &id).await?;
        let (ms, id) = flotilla.new_session(http).await?;
        flotilla_new.push(ms);
        flotilla.delete(http, &id).await?;
        // The pool refills before the next create (its steady state).
        tokio::time::sleep(refill).await;
    }
    Ok((local_new, flotilla_new))
}

/// 2. `GET …/title` on one session of each, in turn: milliseconds (local,
///    Flotilla).
async fn round_trips(
    http: &reqwest::Client,
    (local, flotilla): (&Endpoint, &Endpoint),
    (local_id, flotilla_id): (&str, &str),
    count: usize,
) -> anyhow::Result<(Vec<f64>, Vec<f64>)> {
    let (mut local_rt, mut flotilla_rt) = (Vec::new(), Vec::new());
    for _ in 0..count {
        let started = Instant::now();
        local.title(http, local_id).await?;
        local_rt.push(started.elapsed().as_secs_f64() * 1000.0);
        let started = Instant::now();
        flotilla.title(http, flotilla_id).await?;
        flotilla_rt.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    Ok((local_rt, flotilla_rt))
}

/// PSS (KiB) of the local driver, and of each of Flotilla's.
fn driver_memory(driver: &str, local_pid: u32) -> (u64, Vec<u64>) {
    let ours = driver_pids(driver, None)
        .into_iter()
        .filter(|pid| *pid != local_pid)
        .map(pss_kib)
        .collect();
    (pss_kib(local_pid), ours)
}

fn print_new_sessions((local_new, flotilla_new): &(Vec<f64>, Vec<f64>), args: &Args) {
    println!(
        "## WebDriver: new session → first command (ms, {} rounds)\n",
        args.count
    );
    println!("| path | n | p50 | p95 | mean | min | max |\n|---|---|---|---|---|---|---|");
    let local = if args.firefox() {
        "local geckodriver launching Firefox ESR"
    } else {
        "local chromedriver launching Chromium"
    };
    println!("{}", summary_row(local, local_new));
    println!(
        "{}",
        summary_row(
            &format!("Flotilla, warm pool of {}", args.warm_pool),
            flotilla_new
        )
    );
    println!(
        "\nratio of p50s (Flotilla / local): {:.3}\n",
        percentile(flotilla_new, 0.5) / percentile(local_new, 0.5)
    );
}

fn print_round_trips((local_rt, flotilla_rt): &(Vec<f64>, Vec<f64>), args: &Args) {
    let (count, driver) = (args.round_trips, args.driver());
    println!("## `GET /session/{{id}}/title` round trip (ms, {count} each)\n");
    println!("| path | p50 | p90 | p99 |\n|---|---|---|---|");
    let local = format!("local {driver}");
    let ours = format!("Flotilla (control plane → node → {driver})");
    for (name, samples) in [(local.as_str(), local_rt), (ours.as_str(), flotilla_rt)] {
        println!(
            "| {name} | {:.3} | {:.3} | {:.3} |",
            percentile(samples, 0.5),
            percentile(samples, 0.9),
            percentile(samples, 0.99)
        );
    }
    println!(
        "\nadded at p50: {:.3} ms, at p99: {:.3} ms\n",
        percentile(flotilla_rt, 0.5) - percentile(local_rt, 0.5),
        percentile(flotilla_rt, 0.99) - percentile(local_rt, 0.99)
    );
}

fn print_memory(rows: &[(usize, &(u64, Vec<u64>))], driver: &str) {
    println!("## {driver}'s memory (PSS, MiB)\n");
    println!(
        "| sessions | local: one {driver} | Flotilla: each {driver} running (sessions and warm pool) | Flotilla: total |\n|---|---|---|---|"
    );
    for &(sessions, (local_kib, ours)) in rows {
        let total: u64 = ours.iter().sum();
        let each: Vec<String> = ours.iter().map(|k| format!("{:.1}", mib(*k))).collect();
        println!(
            "| {sessions} | {:.1} | {} | {:.1} |",
            mib(*local_kib),
            each.join(", "),
            mib(total)
        );
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = parse_args()?;
    let data = tempfile::tempdir()?;
    let config = data.path().join("bench.toml");
    let pool = if args.firefox() {
        format!("[agent]\nwarm_pools = {{ firefox = {} }}\n", args.warm_pool)
    } else {
        format!(
            "[agent]\nwarm_pool_size = {}\nwarm_pool_image = \"ubuntu:22.04\"\n",
            args.warm_pool
        )
    };
    std::fs::write(&config, pool)?;
    let serve = ServeProcess::start(&args.binary, &data.path().join("data"), Some(&config)).await?;
    let http = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(120))
        .build()?;
    let (local_driver, local_base) = local_driver(&http, &args).await?;
    let local_pid = local_driver.id().context("the local driver's pid")?;
    let (local, flotilla) = if args.firefox() {
        firefox_endpoints(&serve, local_base)
    } else {
        endpoints(&serve, local_base)?
    };
    let both = (&local, &flotilla);
    let refill = if args.firefox() {
        FIREFOX_REFILL
    } else {
        REFILL
    };

    let created = new_sessions(&http, both, (args.count, refill)).await?;
    let (_, local_id) = local.new_session(&http).await?;
    let (_, flotilla_id) = flotilla.new_session(&http).await?;
    let trips = round_trips(&http, both, (&local_id, &flotilla_id), args.round_trips).await?;
    // 3. Memory with one session each, then four.
    let one = driver_memory(args.driver(), local_pid);
    let mut more = vec![(&local, local_id), (&flotilla, flotilla_id)];
    // geckodriver serves one session at a time: Firefox's row is one's.
    let rounds = if args.firefox() { 0 } else { 3 };
    for _ in 0..rounds {
        more.push((&local, local.new_session(&http).await?.1));
        more.push((&flotilla, flotilla.new_session(&http).await?.1));
    }
    let four = driver_memory(args.driver(), local_pid);

    print_new_sessions(&created, &args);
    print_round_trips(&trips, &args);
    print_memory(&[(1, &one), (1 + rounds, &four)], args.driver());
    for (endpoint, id) in more {
        endpoint.delete(&http, &id).await?;
    }
    drop(local_driver);
    serve.stop().await;
    Ok(())
}
