//! Warm browsers for instances that bring saved state: a revive's snapshot
//! or a persistent profile. Whether a pooled browser may take that state
//! ([`Agent::warm_browser_for`]), making it the instance's
//! ([`Agent::adopt_warm_browser`]) and writing the state in over CDP
//! ([`Agent::start_in_warm_browser`]); where any of it fails, the caller
//! launches on the saved files as before.

use std::sync::Arc;
use std::time::Duration;

use crate::config::EngineKind;
use crate::engine::browser::{BrowserProcess, CdpEndpoint};
use crate::engine::launcher::WarmBrowser;
use crate::instance::InstanceSlot;
use crate::snapshot::{OpenedArchive, RestoreOptions};

use super::{Agent, StartFailure, remove_dir, upstream_of};

impl Agent {
    /// Starts `slot` in a warm browser with the state of `saved` (`None`:
    /// nothing saved yet) written in, when one may take it (see
    /// [`Agent::warm_browser_for`]). `None` when none may, or when that
    /// failed (logged, the browser stopped): the caller launches on the
    /// saved files then, which loses nothing.
    pub(super) async fn start_in_warm_browser(
        &self,
        slot: &Arc<InstanceSlot>,
        saved: Option<&Arc<OpenedArchive>>,
        reopen_tabs: bool,
    ) -> Option<(Arc<BrowserProcess>, CdpEndpoint)> {
        let warm = self.warm_browser_for(slot, saved.map(Arc::as_ref))?;
        let started = async {
            let (process, endpoint) = self.adopt_warm_browser(slot, warm, saved).await?;
            if let Some(saved) = saved {
                // A warm browser's profile is fresh: no service worker to bypass.
                let options = RestoreOptions {
                    reopen_tabs,
                    service_workers: false,
                };
                self.engine()
                    .restore(&endpoint, &saved.state, options)
                    .await
                    .map_err(StartFailure::StateRestore)?;
            }
            Ok::<_, StartFailure>((process, endpoint))
        }
        .await;
        match started {
            Ok(started) => Some(started),
            Err(error) => {
                tracing::warn!(instance = %slot.id, %error, "a warm browser could not take the saved state; launching on its files");
                if let Some(process) = slot.process() {
                    process.stop(None, false, Duration::ZERO).await;
                }
                None
            }
        }
    }

    /// A warm browser of `slot`'s image for it, when the agent may and the
    /// saved state (`None`: nothing saved yet) loses nothing there: its site
    /// data is all in its captured state (cookies, localStorage, tabs),
    /// which CDP writes into a running browser, and the instance needs
    /// nothing a pooled browser was not started with (extensions,
    /// preferences). Never for saved state that the instance writes back to
    /// a persistent profile: a warm browser's fresh history, permissions,
    /// autofill and HSTS would replace the profile's for good. Only where
    /// browsers are confined by bubblewrap: the pooled browser's directory
    /// is renamed to the instance's, which a browser that sees host paths
    /// would not follow.
    pub(super) fn warm_browser_for(
        &self,
        slot: &InstanceSlot,
        saved: Option<&OpenedArchive>,
    ) -> Option<WarmBrowser> {
        let launcher = &self.inner.launcher;
        if !self.inner.settings.config.warm_pool_for_saved_state
            || !launcher.isolation().filesystem_isolated()
            || !slot.config.extensions.is_empty()
            || slot.config.prefs.is_some()
        {
            return None;
        }
        if let Some(saved) = saved {
            // Firefox's site data (localStorage, IndexedDB) is only in its
            // profile's files, which a warm browser does not run on.
            if slot.persisted_profile().is_some() || slot.engine != EngineKind::Chromium {
                return None;
            }
            if !saved.kept_only_in_files.is_empty() {
                tracing::info!(
                    instance = %slot.id,
                    kept = ?saved.kept_only_in_files,
                    "starting on the saved profile's files: a warm browser would lose what only they hold"
                );
                return None;
            }
        }
        let upstream = upstream_of(&slot.config).ok()?;
        launcher.take_warm(&slot.image, launcher.limits_for(&slot.config), upstream)
    }

    /// Makes `warm` the instance's browser: its directory becomes the
    /// instance's (a rename; the browser's sandbox holds its folders by bind
    /// mounts and does not notice) and the downloads of `saved` go into it.
    pub(super) async fn adopt_warm_browser(
        &self,
        slot: &Arc<InstanceSlot>,
        warm: WarmBrowser,
        saved: Option<&Arc<OpenedArchive>>,
    ) -> Result<(Arc<BrowserProcess>, CdpEndpoint), StartFailure> {
        let WarmBrowser {
            dirs: pooled,
            launched,
            endpoint,
            webdriver,
        } = warm;
        // A WebDriver session on this instance starts its own chromedriver.
        drop(webdriver);
        let process = launched.process.clone();
        slot.set_process(launched).await;
        let (root, downloads) = (slot.dirs.root.clone(), slot.dirs.downloads());
        let isolation = self.inner.launcher.isolation().clone();
        let saved = saved.cloned();
        tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
            remove_dir(&root);
            if let Err(error) = std::fs::rename(&pooled.root, &root) {
                remove_dir(&pooled.root);
                return Err(error.into());
            }
            if let Some(saved) = saved {
                saved.unpack_downloads_into(&downloads)?;
                isolation.give_to_browser(&downloads)?;
            }
            Ok(())
        })
        .await?
        .map_err(StartFailure::WarmBrowserAdopt)?;
        // What the snapshot brought back was announced when it finished.
        let _ = self.inner.readings.newly_completed_downloads(slot);
        if slot.is_stopping() {
            return Err(StartFailure::StoppedWhileStarting);
        }
        tracing::info!(instance = %slot.id, "took a warm browser for the instance's saved state");
        Ok((process, endpoint))
    }
}
