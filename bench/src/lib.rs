//! Shared helpers of the benchmark programs: starting a `flotilla serve`
//! process, percentiles, and a small report format.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context as _, bail};
use flotilla_node_agent::config::BASE_CHROMIUM_FLAGS;
use std::time::Instant;
use tokio::io::{AsyncBufReadExt, BufReader};

/// A `flotilla serve` child process.
pub struct ServeProcess {
    pub child: tokio::process::Child,
    pub url: String,
}

impl ServeProcess {
    pub async fn start(
        binary: &Path,
        data_dir: &Path,
        config: Option<&Path>,
    ) -> anyhow::Result<Self> {
        let mut command = tokio::process::Command::new(binary);
        command
            .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(data_dir)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        if let Some(config) = config {
            command.arg("--config").arg(config);
        }
        let mut child = command
            .spawn()
            .with_context(|| format!("cannot start {}", binary.display()))?;
        let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        let url = tokio::time::timeout(Duration::from_secs(60), async {
            while let Some(line) = lines.next_line().await? {
                if let Some(url) = line.strip_prefix("control plane listening on ") {
                    return anyhow::Ok(url.trim().to_owned());
                }
            }
            bail!("flotilla exited before listening")
        })
        .await??;
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Ok(Self { child, url })
    }

    /// SIGTERM and wait: browsers are closed gracefully.
    pub async fn stop(mut self) {
        if let Some(pid) = self.child.id() {
            // SAFETY: kill has no memory-safety preconditions.
            unsafe { libc::kill(pid as i32, libc::SIGTERM) };
        }
        let _ = tokio::time::timeout(Duration::from_secs(60), self.child.wait()).await;
    }
}

impl Drop for ServeProcess {
    /// A benchmark that fails half-way still stops its serve gracefully (a
    /// SIGKILL would leave its browsers running).
    fn drop(&mut self) {
        let Some(pid) = self.child.id() else { return };
        // SAFETY: kill has no memory-safety preconditions.
        unsafe { libc::kill(pid as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// The `q`-quantile (0..=1) of `samples` (nearest rank).
pub fn percentile(samples: &[f64], q: f64) -> f64 {
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

pub fn mean(samples: &[f64]) -> f64 {
    samples.iter().sum::<f64>() / samples.len() as f64
}

/// One line of a results table: name, p50, p95, mean, min, max (milliseconds).
pub fn summary_row(name: &str, samples_ms: &[f64]) -> String {
    let min = samples_ms.iter().copied().fold(f64::INFINITY, f64::min);
    let max = samples_ms.iter().copied().fold(0.0, f64::max);
    format!(
        "| {name} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} |",
        samples_ms.len(),
        percentile(samples_ms, 0.5),
        percentile(samples_ms, 0.95),
        mean(samples_ms),
        min,
        max
    )
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Chromium started by hand: the same executable and base flags as Flotilla, a
/// fixed `--remote-debugging-port`, `GET /json/version` polled every 2 ms.
/// Returns milliseconds from spawn to the first answer; kills it afterwards.
pub async fn raw_chromium_start(
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

/// The text after `name` on the command line (`--image ubuntu:22.04`), or `default`.
pub fn text_flag(name: &str, default: &str) -> anyhow::Result<String> {
    let args: Vec<String> = std::env::args().collect();
    match args.iter().position(|a| a == name) {
        Some(i) => args
            .get(i + 1)
            .cloned()
            .with_context(|| format!("{name} needs a value")),
        None => Ok(default.to_owned()),
    }
}

/// The number after `name` on the command line (`--events 20000`), or `default`.
pub fn number_flag(name: &str, default: usize) -> anyhow::Result<usize> {
    text_flag(name, &default.to_string())?
        .parse()
        .with_context(|| format!("{name} must be a number"))
}

/// `MemAvailable` of this machine, in MiB.
pub fn mem_available_mib() -> f64 {
    std::fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .unwrap_or(0.0)
        / 1024.0
}
