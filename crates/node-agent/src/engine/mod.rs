//! The browser engine: everything that is Chromium's. How it is launched and
//! with which flags ([`browser`]), the preferences its profile starts with
//! ([`prefs`]), the DevTools client the agent drives it with ([`cdp`]), warm
//! browsers and launches ([`launcher`]), screenshots ([`capture`]),
//! extensions ([`extension`]), and the state a park reads from it and a
//! revive puts back ([`state`]); the page layer every caller drives pages
//! through ([`page`]), the live view's frames and input ([`screencast`],
//! [`input`]), REST actions' request interception ([`intercept`]), and
//! chromedriver, its WebDriver server ([`chromedriver`]).
//!
//! The engine is a seam ([`Engine`]): what the agent asks of the engine
//! that runs its instances' browsers goes through that one trait, chosen
//! once at start ([`for_runtime`]), so that no `if chromium` is spread
//! through the agent. It has two implementations today: [`Chromium`] and
//! [`Sim`] (no browser, for the control plane's logic tests). Firefox
//! (issue 47) is the third: it launches `firefox` with a profile of its own
//! (`user.js` preferences where Chromium has `Preferences`), answers
//! WebDriver BiDi where Chromium answers CDP (its endpoint read from the
//! browser's own announcement rather than `DevToolsActivePort`), captures
//! and restores a page's state with BiDi's `storage` and `script` modules,
//! and takes the live view's frames with `browsingContext.captureScreenshot`.
//! What joins the trait with it, where the two engines differ: the page
//! layer ([`page`]), the live view's frames ([`screencast`]), the client
//! protocols its doors relay and their pins (CDP and Playwright for
//! Chromium; BiDi and WebDriver classic through geckodriver for Firefox),
//! and its WebDriver server ([`chromedriver`]).

use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use crate::config::RuntimeKind;
use crate::snapshot::{CapturedState, RestoreOptions};
use browser::{BrowserProcess, CdpEndpoint, LaunchError, LaunchPlan};

/// A future an [`Engine`] answers.
pub type EngineFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What the agent asks of the engine that runs its instances' browsers.
pub trait Engine: Send + Sync {
    /// Its name, for logs.
    fn name(&self) -> &'static str;
    /// Whether its browsers are processes on this machine: confined
    /// (sandbox, network namespace, cgroup), reaped, kept warm, and served
    /// on the instance's ports.
    fn runs_processes(&self) -> bool;
    /// The version of the browser `executable` runs (read once at start).
    fn version(&self, executable: &Path) -> Option<String>;
    /// Starts a browser as `plan` says (its cgroup made by the launcher).
    fn spawn<'a>(
        &'a self,
        plan: &'a LaunchPlan<'a>,
    ) -> EngineFuture<'a, Result<BrowserProcess, LaunchError>>;
    /// Reads what a park keeps from a running browser: cookies, storage,
    /// tabs.
    fn capture<'a>(
        &'a self,
        endpoint: &'a CdpEndpoint,
    ) -> EngineFuture<'a, anyhow::Result<CapturedState>>;
    /// Puts a captured state back into a started browser.
    fn restore<'a>(
        &'a self,
        endpoint: &'a CdpEndpoint,
        state: &'a CapturedState,
        options: RestoreOptions,
    ) -> EngineFuture<'a, anyhow::Result<()>>;
}

/// The engine of `runtime`; the sim's browsers are ready after `sim_start`.
pub fn for_runtime(runtime: RuntimeKind, sim_start: Duration) -> Arc<dyn Engine> {
    match runtime {
        RuntimeKind::Chromium => Arc::new(Chromium),
        RuntimeKind::Sim => Arc::new(Sim { start: sim_start }),
    }
}

/// Chromium: launched with its flags, driven over CDP.
pub struct Chromium;

impl Engine for Chromium {
    fn name(&self) -> &'static str {
        "chromium"
    }

    fn runs_processes(&self) -> bool {
        true
    }

    fn version(&self, executable: &Path) -> Option<String> {
        let output = std::process::Command::new(executable)
            .arg("--version")
            .stdin(std::process::Stdio::null())
            .output()
            .ok()?;
        version_in(&String::from_utf8_lossy(&output.stdout))
    }

    fn spawn<'a>(
        &'a self,
        plan: &'a LaunchPlan<'a>,
    ) -> EngineFuture<'a, Result<BrowserProcess, LaunchError>> {
        Box::pin(BrowserProcess::spawn_chromium(plan))
    }

    fn capture<'a>(
        &'a self,
        endpoint: &'a CdpEndpoint,
    ) -> EngineFuture<'a, anyhow::Result<CapturedState>> {
        Box::pin(state::capture(endpoint))
    }

    fn restore<'a>(
        &'a self,
        endpoint: &'a CdpEndpoint,
        state: &'a CapturedState,
        options: RestoreOptions,
    ) -> EngineFuture<'a, anyhow::Result<()>> {
        Box::pin(state::restore(endpoint, state, options))
    }
}

/// No browser: an instance's "browser" is ready after `start` and has no
/// endpoint, so nothing is captured or restored. For the control plane's
/// logic tests and placement benchmarks only.
pub struct Sim {
    pub start: Duration,
}

impl Engine for Sim {
    fn name(&self) -> &'static str {
        "sim"
    }

    fn runs_processes(&self) -> bool {
        false
    }

    fn version(&self, _executable: &Path) -> Option<String> {
        None
    }

    fn spawn<'a>(
        &'a self,
        plan: &'a LaunchPlan<'a>,
    ) -> EngineFuture<'a, Result<BrowserProcess, LaunchError>> {
        let process = BrowserProcess::spawn_sim(plan.dirs, self.start);
        Box::pin(async move { Ok(process) })
    }

    fn capture<'a>(
        &'a self,
        _endpoint: &'a CdpEndpoint,
    ) -> EngineFuture<'a, anyhow::Result<CapturedState>> {
        Box::pin(async { Ok(CapturedState::default()) })
    }

    fn restore<'a>(
        &'a self,
        _endpoint: &'a CdpEndpoint,
        _state: &'a CapturedState,
        _options: RestoreOptions,
    ) -> EngineFuture<'a, anyhow::Result<()>> {
        Box::pin(async { Ok(()) })
    }
}

/// The first word of `text` that reads as a version (`156.0.8078.108`).
fn version_in(text: &str) -> Option<String> {
    text.split_whitespace()
        .find(|word| {
            word.split('.').count() >= 2 && word.split('.').all(|part| part.parse::<u32>().is_ok())
        })
        .map(str::to_owned)
}

pub mod browser;
pub mod capture;
pub mod cdp;
pub mod chromedriver;
pub mod extension;
pub mod input;
pub mod intercept;
pub mod launcher;
pub mod page;
pub mod prefs;
pub mod screencast;
pub mod state;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_version_is_the_first_dotted_number() {
        assert_eq!(
            version_in("Chromium 156.0.8078.108 built on Debian").as_deref(),
            Some("156.0.8078.108")
        );
        assert_eq!(version_in("no version here"), None);
    }

    #[test]
    fn each_runtime_has_its_engine() {
        let chromium = for_runtime(RuntimeKind::Chromium, Duration::ZERO);
        assert_eq!(
            (chromium.name(), chromium.runs_processes()),
            ("chromium", true)
        );
        let sim = for_runtime(RuntimeKind::Sim, Duration::ZERO);
        assert_eq!((sim.name(), sim.runs_processes()), ("sim", false));
        assert_eq!(sim.version(Path::new("/bin/true")), None);
    }
}
