//! The browser engine: everything that is Chromium's. How it is launched and
//! with which flags ([`browser`]), the preferences its profile starts with
//! ([`prefs`]), the DevTools client the agent drives it with ([`cdp`]), warm
//! browsers and launches ([`launcher`]), screenshots ([`capture`]),
//! extensions ([`extension`]), and the state a park reads from it and a
//! revive puts back ([`state`]); the page layer every caller drives pages
//! through ([`page`]), the live view's frames and input ([`screencast`],
//! [`input`]), REST actions' request interception ([`intercept`]), and
//! the engine's WebDriver server ([`driver`]: chromedriver, or geckodriver
//! for Firefox).
//!
//! The engine is a seam ([`Engine`]): what the agent asks of the engine
//! that runs an instance's browser goes through that one trait, so that no
//! `if chromium` is spread through the agent. A node has one engine per
//! kind an image may name ([`Engines`], made once at start by
//! [`for_runtime`]): [`Chromium`], [`Firefox`] ([`firefox`]: `firefox-esr`
//! with a profile and enterprise policies of its own, its WebDriver BiDi
//! endpoint read from the browser's own announcement; the agent's BiDi
//! sessions in [`bidi`], its rides on a `bidi` door client's session in
//! [`bidi_tap`]), and [`Sim`] for
//! every kind on the sim runtime (no browser, for the control plane's logic
//! tests). The endpoint a started browser answers on says which protocol it
//! speaks ([`browser::CdpEndpoint::speaks_cdp`]): the page layer, the live
//! view and the doors refuse a CDP step on a Firefox instance with a clear
//! error. Not yet through the trait for Firefox: the page layer ([`page`])
//! and live view ([`screencast`]).

use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use crate::config::{EngineKind, RuntimeKind};
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
    /// Readies a started warm-pool browser for its first client, off the
    /// client's path (nothing by default).
    fn warm_up<'a>(&'a self, _endpoint: &'a CdpEndpoint) -> EngineFuture<'a, ()> {
        Box::pin(async {})
    }
}

/// The engines of a node, one per [`EngineKind`] an image may name (the
/// sim runtime's one engine stands for every kind).
#[derive(Clone)]
pub struct Engines {
    chromium: Arc<dyn Engine>,
    firefox: Arc<dyn Engine>,
}

impl Engines {
    /// The engine that runs `kind`'s browsers.
    pub fn of(&self, kind: EngineKind) -> &Arc<dyn Engine> {
        match kind {
            EngineKind::Chromium => &self.chromium,
            EngineKind::Firefox => &self.firefox,
        }
    }

    /// Whether its browsers are processes on this machine (not the sim's).
    pub fn runs_processes(&self) -> bool {
        self.chromium.runs_processes()
    }

    /// Reads what a park keeps from the browser behind `endpoint`.
    pub async fn capture(&self, endpoint: &CdpEndpoint) -> anyhow::Result<CapturedState> {
        self.of(endpoint.engine).capture(endpoint).await
    }

    /// Puts a captured state back into the browser behind `endpoint`.
    pub async fn restore(
        &self,
        endpoint: &CdpEndpoint,
        state: &CapturedState,
        options: RestoreOptions,
    ) -> anyhow::Result<()> {
        self.of(endpoint.engine)
            .restore(endpoint, state, options)
            .await
    }
}

/// The engines of `runtime`; the sim's browsers are ready after `sim_start`.
pub fn for_runtime(runtime: RuntimeKind, sim_start: Duration) -> Engines {
    match runtime {
        RuntimeKind::Chromium => Engines {
            chromium: Arc::new(Chromium),
            firefox: Arc::new(Firefox),
        },
        RuntimeKind::Sim => {
            let sim: Arc<dyn Engine> = Arc::new(Sim { start: sim_start });
            Engines {
                chromium: sim.clone(),
                firefox: sim,
            }
        }
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

/// Firefox: launched with a profile and policies of its own, driven over
/// WebDriver BiDi ([`firefox`]).
pub struct Firefox;

impl Engine for Firefox {
    fn name(&self) -> &'static str {
        "firefox"
    }

    fn runs_processes(&self) -> bool {
        true
    }

    fn version(&self, executable: &Path) -> Option<String> {
        Chromium.version(executable)
    }

    fn spawn<'a>(
        &'a self,
        plan: &'a LaunchPlan<'a>,
    ) -> EngineFuture<'a, Result<BrowserProcess, LaunchError>> {
        Box::pin(BrowserProcess::spawn_firefox(plan))
    }

    fn capture<'a>(
        &'a self,
        endpoint: &'a CdpEndpoint,
    ) -> EngineFuture<'a, anyhow::Result<CapturedState>> {
        Box::pin(firefox::capture(endpoint))
    }

    fn restore<'a>(
        &'a self,
        endpoint: &'a CdpEndpoint,
        state: &'a CapturedState,
        options: RestoreOptions,
    ) -> EngineFuture<'a, anyhow::Result<()>> {
        Box::pin(firefox::restore(endpoint, state, options))
    }

    fn warm_up<'a>(&'a self, endpoint: &'a CdpEndpoint) -> EngineFuture<'a, ()> {
        Box::pin(firefox::warm_up(endpoint))
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

/// The first word of `text` that reads as a version (`156.0.8078.108`;
/// Firefox's `153.8.0esr` is `153.8.0`).
fn version_in(text: &str) -> Option<String> {
    text.split_whitespace()
        .map(|word| word.trim_end_matches(|c: char| c.is_ascii_alphabetic()))
        .find(|word| {
            word.split('.').count() >= 2 && word.split('.').all(|part| part.parse::<u32>().is_ok())
        })
        .map(str::to_owned)
}

pub mod bidi;
pub mod bidi_tap;
pub mod browser;
pub mod capture;
pub mod cdp;
pub mod driver;
pub mod extension;
pub mod firefox;
pub mod firefox_view;
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
        assert_eq!(
            version_in("Mozilla Firefox 153.8.0esr").as_deref(),
            Some("153.8.0")
        );
        assert_eq!(version_in("no version here"), None);
    }

    #[test]
    fn each_runtime_has_its_engine() {
        let real = for_runtime(RuntimeKind::Chromium, Duration::ZERO);
        let chromium = real.of(EngineKind::Chromium);
        assert_eq!(
            (chromium.name(), chromium.runs_processes()),
            ("chromium", true)
        );
        assert_eq!(real.of(EngineKind::Firefox).name(), "firefox");
        let sim = for_runtime(RuntimeKind::Sim, Duration::ZERO);
        for kind in [EngineKind::Chromium, EngineKind::Firefox] {
            let engine = sim.of(kind);
            assert_eq!((engine.name(), engine.runs_processes()), ("sim", false));
            assert_eq!(engine.version(Path::new("/bin/true")), None);
        }
    }
}
