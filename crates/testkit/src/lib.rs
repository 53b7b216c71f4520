//! The test harness. Everything starts for real on `127.0.0.1:0`:
//! - [`spawn_serve`] / [`spawn_serve_with`]: `flotilla serve` in-process (control
//!   plane, local agent with real Chromium or the sim runtime) on a temp data dir;
//! - [`ServeProcess`]: the real `flotilla` binary as a child process;
//! - [`serve_page`]: a local web server for pages the browsers load;
//! - [`run_node`]: the Playwright / Puppeteer clients in `tests/js`;
//! - [`OtlpReceiver`]: an OpenTelemetry collector's OTLP/HTTP traces door;
//! - [`Balancer`]: nginx round-robin in front of several control planes;
//! - [`wait_until`]: polling a condition with a generous deadline (never a fixed sleep).
//!
//! Cleanup happens on drop too, so a failing test leaves no browser behind.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::bail;

pub use reqwest::StatusCode;

mod api;
mod balancer;
mod node_clients;
mod otlp;
mod pages;
mod postgres;
mod processes;
mod s3;
mod serve;
mod sse;
mod webhooks;

pub use api::*;
pub use balancer::*;
pub use node_clients::*;
pub use otlp::*;
pub use pages::*;
pub use postgres::*;
pub use processes::*;
pub use s3::*;
pub use serve::*;
pub use sse::*;
pub use webhooks::*;

/// Deadline for a browser to start on a loaded 2-core machine.
pub const BROWSER_DEADLINE: Duration = Duration::from_secs(60);

/// Sends test logs to the test's output (shown for failing tests).
pub fn init_logging() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(flotilla_telemetry::quiet(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
                tracing_subscriber::EnvFilter::new("info,tower_http=warn,sqlx=warn")
            }),
        ))
        .with_test_writer()
        .try_init();
}

/// The workspace root (for `tests/js`).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("crates/testkit is two levels deep")
        .to_path_buf()
}

/// Polls `check` every 50 ms until it yields `Some`, or fails after `deadline`
/// with `what` and the last observation (`check`'s `Err`: what it saw
/// instead, any printable value).
pub async fn wait_until<T, E, F, Fut>(
    deadline: Duration,
    what: &str,
    mut check: F,
) -> anyhow::Result<T>
where
    E: std::fmt::Display,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<T>, E>>,
{
    let start = tokio::time::Instant::now();
    let mut last = String::from("nothing observed");
    loop {
        match check().await {
            Ok(Some(value)) => return Ok(value),
            Ok(None) => {}
            Err(observation) => last = observation.to_string(),
        }
        if start.elapsed() > deadline {
            bail!("timed out after {deadline:?} waiting for {what}; last observation: {last}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
