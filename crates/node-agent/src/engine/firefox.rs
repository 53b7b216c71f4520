//! Firefox: Debian's `firefox-esr`, driven over WebDriver BiDi, which the
//! browser itself serves on `--remote-debugging-port` at [`BIDI_PATH`].
//!
//! A launch gets the same confinement as Chromium's (sandbox, browser user,
//! network namespace behind the egress proxy, cgroup). What Chromium takes
//! as flags Firefox takes from its profile and from enterprise policies:
//! - `user.js` in the instance's profile ([`user_prefs`]): the egress proxy,
//!   the downloads folder, and none of the browser's own traffic (updates,
//!   telemetry, studies, remote settings, safe browsing, captive portal
//!   checks, prefetching);
//! - `policies.json` ([`policies`]), bound read-only into the sandbox where
//!   Firefox reads the system's policies (`/etc/firefox/policies`): the same
//!   settings locked, so that neither a page nor a client can change them,
//!   and no extension installs, no updates, no telemetry. Without a sandbox
//!   (`agent.allow_unconfined_browsers`) there is nowhere to place it, and
//!   only `user.js` applies.
//!
//! Readiness is the `WebDriverBiDiServer.json` the remote agent writes into
//! the profile once it listens, then one HTTP answer on that port.
//!
//! A park reads the browser's cookies and tabs over BiDi ([`capture`]),
//! then closes it with BiDi's `browser.close`, the only way it writes its
//! profile (SIGTERM ends it at once); a revive starts it on the profile
//! (localStorage, persistent cookies) and puts the cookies and tabs back
//! ([`restore`]). Not kept, unlike Chromium's: a tab's history,
//! `sessionStorage` and scroll position.

use std::path::{Path, PathBuf};

use base64::Engine as _;
use serde_json::{Value, json};

use crate::config::EngineKind;
use crate::confine::sandbox::BrowserPaths;
use crate::engine::bidi::{BidiError, BidiSession};
use crate::engine::browser::{
    BrowserNetwork, BrowserProcess, CdpEndpoint, LaunchError, LaunchPlan, prepare_instance_dir,
};
use crate::engine::page::Tab;
use crate::snapshot::{CapturedState, CapturedTab, RestoreOptions};
use crate::system::dirs::InstanceDirs;
use crate::system::files::BrowserFolder;

/// The path of Firefox's WebDriver BiDi WebSocket.
pub const BIDI_PATH: &str = "/session";

/// The file Firefox's remote agent writes into the profile once it listens.
const SERVER_FILE: &str = "WebDriverBiDiServer.json";

/// Where Firefox reads the system's enterprise policies; Debian's build
/// reads `/etc/firefox`, the other name is Firefox ESR's own.
const POLICY_PATHS: &[&str] = &[
    "/etc/firefox/policies/policies.json",
    "/etc/firefox-esr/policies/policies.json",
];

/// The policies file of an instance, beside (not inside) the folders its
/// browser sees.
fn policies_file(dirs: &InstanceDirs) -> PathBuf {
    dirs.root.join("firefox-policies.json")
}

/// Where Firefox writes the port Marionette listens on (`marionette.port`
/// is 0), in its profile.
const MARIONETTE_PORT_FILE: &str = "MarionetteActivePort";

/// The port Marionette listens on in the browser of `profile`, once
/// announced (inside the browser's network namespace, where it has one).
pub fn marionette_port(profile: &Path) -> Option<u16> {
    let text = announced(profile, MARIONETTE_PORT_FILE)?;
    text.trim().parse().ok().filter(|port| *port != 0)
}

/// A small file the browser wrote into its profile, read as the browser's
/// files are (by handle, never through a link, a regular file of at most
/// 4 KiB: the browser could plant a link to `/dev/zero` or a pipe).
fn announced(profile: &Path, name: &str) -> Option<String> {
    let bytes = BrowserFolder::open(profile).ok()?.read(name, 4096)?;
    String::from_utf8(bytes).ok()
}

/// The endpoint Firefox announced in `profile`, once it has.
pub fn read_server_file(profile: &Path) -> Option<CdpEndpoint> {
    let text = announced(profile, SERVER_FILE)?;
    let announced: Value = serde_json::from_str(&text).ok()?;
    let port = u16::try_from(announced["ws_port"].as_u64()?).ok()?;
    (port != 0).then(|| CdpEndpoint::bidi_on_host(port))
}

/// Preferences that keep the browser on the egress proxy and quiet:
/// `(name, value)`, written to `user.js` and locked by [`policies`].
fn user_prefs(paths: &BrowserPaths, proxy_port: Option<u16>) -> Vec<(&'static str, Value)> {
    let mut prefs = download_prefs(paths);
    // Firefox picks Marionette's port and writes it to the profile.
    prefs.push(("marionette.port", json!(0)));
    prefs.extend(quiet_prefs());
    if let Some(port) = proxy_port {
        prefs.extend(proxy_prefs(port));
    }
    prefs
}

/// Downloads land in the instance's folder, never asking.
fn download_prefs(paths: &BrowserPaths) -> Vec<(&'static str, Value)> {
    vec![
        ("browser.download.dir", json!(paths.downloads)),
        ("browser.download.folderList", json!(2)),
        ("browser.download.useDownloadDir", json!(true)),
        (
            "browser.download.always_ask_before_handling_new_types",
            json!(false),
        ),
        ("browser.download.manager.showWhenStarting", json!(false)),
        // Written in the sandbox's /tmp and moved in once complete: a file
        // in the downloads folder is a finished download (Firefox would
        // otherwise leave an empty placeholder under the final name beside
        // a `.part` file while it runs).
        ("browser.download.start_downloads_in_tmp_dir", json!(true)),
    ]
}

/// None of the browser's own traffic, and no first-run or restore pages.
fn quiet_prefs() -> Vec<(&'static str, Value)> {
    let off = [
        "app.update.auto",
        "app.update.enabled",
        "app.normandy.enabled",
        "app.shield.optoutstudies.enabled",
        "datareporting.healthreport.uploadEnabled",
        "datareporting.policy.dataSubmissionEnabled",
        "toolkit.telemetry.enabled",
        "toolkit.telemetry.unified",
        "browser.ping-centre.telemetry",
        "browser.safebrowsing.malware.enabled",
        "browser.safebrowsing.phishing.enabled",
        "browser.safebrowsing.downloads.enabled",
        "network.captive-portal-service.enabled",
        "network.connectivity-service.enabled",
        "network.prefetch-next",
        "network.predictor.enabled",
        "extensions.update.enabled",
        "extensions.getAddons.cache.enabled",
        "extensions.systemAddon.update.enabled",
        "browser.region.update.enabled",
        "identity.fxaccounts.enabled",
        "browser.newtabpage.enabled",
        "browser.newtabpage.activity-stream.feeds.system.topstories",
        "browser.newtabpage.activity-stream.feeds.snippets",
        "browser.topsites.contile.enabled",
        "browser.search.update",
        "browser.shell.checkDefaultBrowser",
        "browser.aboutwelcome.enabled",
        "browser.tabs.warnOnClose",
        // A revive puts the tabs back itself.
        "browser.sessionstore.resume_from_crash",
        "browser.sessionstore.resume_session_once",
        "security.remote_settings.crlite_filters.enabled",
        "security.remote_settings.intermediates.enabled",
    ];
    let empty = [
        // No helper program or library of the main process.
        "helpers.global_mailcap_file",
        "helpers.private_mailcap_file",
        "helpers.global_mime_types_file",
        "helpers.private_mime_types_file",
        "network.negotiate-auth.trusted-uris",
        "network.negotiate-auth.delegation-uris",
        "network.automatic-ntlm-auth.trusted-uris",
        "toolkit.telemetry.server",
        "browser.safebrowsing.provider.mozilla.updateURL",
        "browser.safebrowsing.provider.google4.updateURL",
        "media.gmp-manager.url",
        "browser.region.network.url",
        "geo.provider.network.url",
    ];
    let mut prefs: Vec<(&'static str, Value)> =
        off.iter().map(|name| (*name, json!(false))).collect();
    prefs.extend(empty.iter().map(|name| (*name, json!(""))));
    prefs.extend([
        (
            "services.settings.server",
            json!("http://127.0.0.1:9/remote-settings"),
        ),
        ("network.dns.disablePrefetch", json!(true)),
        ("network.http.speculative-parallel-limit", json!(0)),
        ("browser.startup.homepage_override.mstone", json!("ignore")),
        ("browser.startup.page", json!(0)),
        ("security.OCSP.enabled", json!(0)),
    ]);
    prefs
}

/// Everything, loopback included, through the egress proxy (names
/// resolved there too; no DNS over HTTPS).
fn proxy_prefs(port: u16) -> Vec<(&'static str, Value)> {
    vec![
        ("network.proxy.type", json!(1)),
        // A client's `proxy` (session.new) would set these: locked empty.
        ("network.proxy.http", json!("")),
        ("network.proxy.ssl", json!("")),
        ("network.proxy.autoconfig_url", json!("")),
        ("network.proxy.socks", json!("127.0.0.1")),
        ("network.proxy.socks_port", json!(port)),
        ("network.proxy.socks_version", json!(5)),
        ("network.proxy.socks_remote_dns", json!(true)),
        ("network.proxy.no_proxies_on", json!("")),
        ("network.proxy.allow_hijacking_localhost", json!(true)),
        ("network.proxy.failover_direct", json!(false)),
        ("network.trr.mode", json!(5)),
    ]
}

/// `user.js`: one `user_pref(name, value);` line per preference.
fn user_js(prefs: &[(&str, Value)]) -> String {
    prefs
        .iter()
        .map(|(name, value)| format!("user_pref({}, {value});\n", json!(name)))
        .collect()
}

/// The preferences Firefox lets the `Preferences` policy lock (its own
/// list; the others stay in `user.js`, and the policies that name them,
/// such as `DisableTelemetry`, cover them).
fn lockable(name: &str) -> bool {
    const PREFIXES: &[&str] = &[
        "app.update.",
        "browser.",
        "datareporting.policy.",
        "extensions.",
        "geo.",
        "media.",
        "network.",
    ];
    PREFIXES.iter().any(|prefix| name.starts_with(prefix)) || name == "security.OCSP.enabled"
}

/// The enterprise policies every Firefox instance runs under: `prefs`
/// locked, no `file:` pages, no extension installs or updates, no
/// telemetry, studies or accounts, downloads in the instance's folder.
fn policies(paths: &BrowserPaths, prefs: &[(&str, Value)]) -> Value {
    let locked: serde_json::Map<String, Value> = prefs
        .iter()
        .filter(|(name, _)| lockable(name))
        .map(|(name, value)| {
            (
                (*name).to_owned(),
                json!({"Value": value, "Status": "locked"}),
            )
        })
        .collect();
    json!({"policies": {
        "DisableAppUpdate": true,
        "DisableTelemetry": true,
        "DisableFirefoxStudies": true,
        // Firefox ignores `services.settings.server` on release builds:
        // only this policy keeps it from its remote settings server (no
        // updated revocation lists then, as Chromium gets no CRLSets).
        "DisableRemoteSettingsAndAcceptSecurityConsequences": true,
        "DisableRemoteImprovements": true,
        "DisableSystemAddonUpdate": true,
        "DisableFirefoxAccounts": true,
        "DisablePocket": true,
        "DisableFeedbackCommands": true,
        "DisableProfileImport": true,
        "DisableSetDesktopBackground": true,
        "DontCheckDefaultBrowser": true,
        "CaptivePortal": false,
        "NetworkPrediction": false,
        "ExtensionUpdate": false,
        "ExtensionSettings": {"*": {"installation_mode": "blocked"}},
        "BlockAboutProfiles": true,
        "WebsiteFilter": {"Block": ["file:///*"]},
        "DownloadDirectory": paths.downloads,
        "DefaultDownloadDirectory": paths.downloads,
        "PromptForDownloadLocation": false,
        "OverrideFirstRunPage": "",
        "OverridePostUpdatePage": "",
        "Preferences": locked,
    }})
}

/// Writes the profile's `user.js` and the instance's policies file, and
/// removes a server file an earlier run (a revived profile) left.
fn write_profile(
    dirs: &InstanceDirs,
    paths: &BrowserPaths,
    (proxy_port, asked): (Option<u16>, Option<&serde_json::Map<String, Value>>),
) -> std::io::Result<()> {
    let prefs = user_prefs(paths, proxy_port);
    // The instance's own `config.prefs` first: Flotilla's, after them, win
    // where both name one (the create was refused for names it keeps).
    let asked = match asked.map(flotilla_api_types::firefox_prefs::flatten) {
        Some(Ok(asked)) => asked,
        Some(Err(error)) => return Err(std::io::Error::other(error)),
        None => Vec::new(),
    };
    let asked: Vec<(&str, Value)> = asked
        .iter()
        .map(|(name, value)| (name.as_str(), value.clone()))
        .collect();
    let profile = dirs.profile();
    match std::fs::remove_file(profile.join(SERVER_FILE)) {
        Err(error) if error.kind() != std::io::ErrorKind::NotFound => return Err(error),
        _ => {}
    }
    // The profile is the browser's (a revived one may hold links it
    // left): written by handle, never through a link.
    let user_js = user_js(&asked) + &user_js(&prefs);
    BrowserFolder::open(&profile)?.replace("user.js", user_js.as_bytes())?;
    // A port an earlier run announced is not this one's.
    match std::fs::remove_file(profile.join(MARIONETTE_PORT_FILE)) {
        Err(error) if error.kind() != std::io::ErrorKind::NotFound => return Err(error),
        _ => {}
    }
    // The instance's root is the agent's alone; the file is bound
    // read-only into the sandbox, where the browser's user reads it.
    let policies = serde_json::to_vec_pretty(&policies(paths, &prefs))?;
    let file = policies_file(dirs);
    // A relaunch in the same folder (a revive on this node) replaces the
    // read-only file of the launch before.
    match std::fs::remove_file(&file) {
        Err(error) if error.kind() != std::io::ErrorKind::NotFound => return Err(error),
        _ => {}
    }
    std::fs::write(&file, policies)?;
    std::fs::set_permissions(&file, std::os::unix::fs::PermissionsExt::from_mode(0o444))
}

/// The browser's command line: headless, its profile, its BiDi server on
/// a port of its choosing, the window of the viewport.
fn firefox_command(
    plan: &LaunchPlan<'_>,
    paths: &BrowserPaths,
    log: std::fs::File,
) -> tokio::process::Command {
    let policies = policies_file(plan.dirs);
    let files: Vec<(PathBuf, &str)> = POLICY_PATHS
        .iter()
        .map(|inside| (policies.clone(), *inside))
        .collect();
    let mut command = plan.isolation.command_with_files(
        plan.dirs,
        &plan.image.executable,
        (plan.hostname, &[]),
        &files,
    );
    command
        .args(["--headless", "--no-remote", "--profile"])
        .arg(&paths.profile)
        .arg("--remote-debugging-port=0")
        // Marionette, for geckodriver (WebDriver classic sessions), on a
        // port of its choosing inside the instance's network namespace.
        .arg("--marionette")
        .args([
            "--window-size",
            &format!("{},{}", plan.window.0, plan.window.1),
        ])
        .args(&plan.image.args)
        .arg("about:blank")
        .env("MOZ_CRASHREPORTER_DISABLE", "1")
        .env("MOZ_DISABLE_AUTO_SAFE_MODE", "1")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::from(log))
        .process_group(0)
        .kill_on_drop(false);
    command
}

impl BrowserProcess {
    /// Starts Firefox as `plan` says: its image, profile, policies,
    /// confinement, network and cgroup.
    pub async fn spawn_firefox(plan: &LaunchPlan<'_>) -> Result<Self, LaunchError> {
        let network = BrowserNetwork::start(plan).await?;
        let proxy_port = network.proxy_port;
        let prepared = prepare_instance_dir(plan, &|dirs, paths| {
            write_profile(dirs, paths, (proxy_port, plan.setup.prefs))
        });
        let (paths, log) = match prepared {
            Ok(prepared) => prepared,
            Err(error) => {
                network.abandon();
                return Err(error);
            }
        };
        let command = firefox_command(plan, &paths, log);
        Self::start(plan, command, network, EngineKind::Firefox)
    }
}

/// Whether a tab at `url` shows a web page (whose title is read, and which
/// is reopened on a revive).
fn is_web(url: &str) -> bool {
    url.starts_with("http://") || url.starts_with("https://")
}

/// A BiDi cookie as `storage.setCookie` takes it back (its `size` is the
/// browser's to compute).
fn settable(cookie: &Value) -> Value {
    let mut cookie = cookie.clone();
    if let Some(fields) = cookie.as_object_mut() {
        fields.remove("size");
    }
    cookie
}

/// Reads what a park keeps from a running Firefox over WebDriver BiDi: its
/// cookies (session ones too, as BiDi cookies) and its tabs (URL, title).
/// Its localStorage is in its profile, which the graceful stop that follows
/// writes ([`BrowserProcess::stop`]). Fails with
/// [`BidiError::SessionHeld`] while a client's BiDi session is open.
pub async fn capture(endpoint: &CdpEndpoint) -> anyhow::Result<CapturedState> {
    let mut session = BidiSession::open(endpoint).await?;
    let read = tokio::time::timeout(STATE_DEADLINE, read_state(&mut session)).await;
    session.end().await;
    let read = read.map_err(|_| BidiError::Timeout("reading the browser's state".into()))?;
    Ok(read?)
}

/// How long a park's capture or a revive's restore may take in all.
const STATE_DEADLINE: std::time::Duration = std::time::Duration::from_secs(60);

async fn read_state(session: &mut BidiSession) -> Result<CapturedState, BidiError> {
    let cookies = session.call("storage.getCookies", json!({})).await?;
    let tabs = read_tabs(session)
        .await?
        .into_iter()
        .map(|tab| CapturedTab {
            url: tab.url,
            title: tab.title,
            ..CapturedTab::default()
        })
        .collect();
    Ok(CapturedState {
        cookies: cookies["cookies"].as_array().cloned().unwrap_or_default(),
        tabs,
        local_storage: Vec::new(),
    })
}

/// The browser's tabs (its top-level browsing contexts, in order): each
/// context's id, URL and title.
pub(crate) async fn read_tabs(session: &mut BidiSession) -> Result<Vec<Tab>, BidiError> {
    let tree = session
        .call("browsingContext.getTree", json!({"maxDepth": 0}))
        .await?;
    let mut tabs = Vec::new();
    for context in tree["contexts"].as_array().into_iter().flatten() {
        let url = context["url"].as_str().unwrap_or_default().to_owned();
        // Read in a sandbox realm (the page's own getters do not run), and
        // cut short there: a page chooses its title's length.
        let target = sandboxed(&context["context"]);
        let expression = format!("document.title.slice(0, {MAX_TITLE_CHARS})");
        let title = match is_web(&url) {
            true => session
                .call(
                    "script.evaluate",
                    json!({"target": target, "expression": expression, "awaitPromise": false}),
                )
                .await
                .ok()
                .and_then(|result| result["result"]["value"].as_str().map(str::to_owned))
                .unwrap_or_default(),
            false => String::new(),
        };
        let id = context["context"].as_str().unwrap_or_default().to_owned();
        tabs.push(Tab { id, url, title });
    }
    Ok(tabs)
}

/// The longest tab title read, in characters.
const MAX_TITLE_CHARS: usize = 1024;

/// A BiDi script target: `context`'s sandbox realm of Flotilla's, where the
/// page's own script does not reach.
pub(crate) fn sandboxed(context: &Value) -> Value {
    json!({"context": context, "sandbox": "flotilla"})
}

/// Tabs as the node names them to its clients: by position (`1`, `2`, …),
/// as Firefox names its contexts anew in each session; each with its
/// context in this session.
pub(crate) fn by_position(tabs: Vec<Tab>) -> Vec<(String, Tab)> {
    tabs.into_iter()
        .enumerate()
        .map(|(index, tab)| {
            let context = tab.id.clone();
            let id = (index + 1).to_string();
            (context, Tab { id, ..tab })
        })
        .collect()
}

/// The bytes of an image a capture command (`method`) answered, base64 in
/// its `data`.
pub(crate) fn image_data(answer: &Value, method: &str) -> Result<Vec<u8>, BidiError> {
    answer["data"]
        .as_str()
        .and_then(|data| base64::engine::general_purpose::STANDARD.decode(data).ok())
        .ok_or_else(|| BidiError::Command {
            method: method.into(),
            error: "unreadable answer".into(),
            message: "no base64 image in data".into(),
        })
}

/// The browser's tabs as `/tabs` lists them, read on the session of the
/// WebDriver client whose BiDi socket is `client_socket`, else in a session
/// of the agent's own (so [`BidiError::SessionHeld`] while a BiDi client
/// holds the browser's only one: [`BidiSession::ride_or_open`]). Firefox
/// names its contexts anew in each WebDriver session, so a tab's id here is
/// its position (`1`, `2`, …), which `/screenshot?tab=` takes.
pub async fn list_tabs(
    endpoint: &CdpEndpoint,
    client_socket: Option<&str>,
) -> Result<Vec<Tab>, BidiError> {
    let mut session = BidiSession::ride_or_open(endpoint, client_socket).await?;
    let tabs = read_tabs(&mut session).await;
    session.end().await;
    Ok(by_position(tabs?).into_iter().map(|(_, tab)| tab).collect())
}

/// A PNG of tab `tab`'s viewport (its position, as [`list_tabs`] names it;
/// default: the first tab), taken as [`list_tabs`] reads the tabs; `None`
/// when there is no such tab.
pub async fn screenshot(
    endpoint: &CdpEndpoint,
    tab: Option<&str>,
    client_socket: Option<&str>,
) -> Result<Option<Vec<u8>>, BidiError> {
    let mut session = BidiSession::ride_or_open(endpoint, client_socket).await?;
    let shot = screenshot_in(&mut session, tab).await;
    session.end().await;
    shot
}

async fn screenshot_in(
    session: &mut BidiSession,
    tab: Option<&str>,
) -> Result<Option<Vec<u8>>, BidiError> {
    let tabs = read_tabs(session).await?;
    let position = match tab {
        Some(id) => match id.parse::<usize>() {
            Ok(position) if position >= 1 => position - 1,
            _ => return Ok(None),
        },
        None => 0,
    };
    let chosen = tabs.get(position);
    let Some(chosen) = chosen else {
        return Ok(None);
    };
    let method = "browsingContext.captureScreenshot";
    let shot = session
        .call(method, json!({"context": chosen.id, "origin": "viewport"}))
        .await?;
    Ok(Some(image_data(&shot, method)?))
}

/// Puts a captured state back into a started Firefox: its cookies, and
/// (a full restore) its web tabs, in their order, the first in the tab the
/// browser opened with.
pub async fn restore(
    endpoint: &CdpEndpoint,
    state: &CapturedState,
    options: RestoreOptions,
) -> anyhow::Result<()> {
    let mut session = BidiSession::open(endpoint).await?;
    let put_back =
        tokio::time::timeout(STATE_DEADLINE, put_back(&mut session, state, options)).await;
    session.end().await;
    let put_back =
        put_back.map_err(|_| BidiError::Timeout("restoring the browser's state".into()))?;
    Ok(put_back?)
}

async fn put_back(
    session: &mut BidiSession,
    state: &CapturedState,
    options: RestoreOptions,
) -> Result<(), BidiError> {
    for cookie in &state.cookies {
        // One cookie the browser refuses (expired meanwhile) loses only itself.
        match session
            .call("storage.setCookie", json!({"cookie": settable(cookie)}))
            .await
        {
            Err(error) if error.is_unanswered() => return Err(error),
            Err(error) => tracing::warn!(%error, "a captured cookie was not taken back"),
            Ok(_) => {}
        }
    }
    let tabs: Vec<&CapturedTab> = match options.reopen_tabs {
        true => state.tabs.iter().filter(|tab| is_web(&tab.url)).collect(),
        false => Vec::new(),
    };
    let tree = session
        .call("browsingContext.getTree", json!({"maxDepth": 0}))
        .await?;
    let mut first = tree["contexts"][0]["context"].as_str().map(str::to_owned);
    for tab in tabs {
        let context = match first.take() {
            Some(context) => context,
            None => session
                .call("browsingContext.create", json!({"type": "tab"}))
                .await?["context"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
        };
        let navigate = json!({"context": context, "url": tab.url, "wait": "none"});
        match session.call("browsingContext.navigate", navigate).await {
            Err(error) if error.is_unanswered() => return Err(error),
            Err(error) => tracing::warn!(%error, url = tab.url, "a captured tab was not reopened"),
            Ok(_) => {}
        }
    }
    Ok(())
}

/// Runs through what a client's first BiDi session does (Puppeteer's:
/// `session.new`, its subscriptions, the tree, one evaluation), then ends
/// the session: Firefox loads its BiDi modules on first use, which would
/// otherwise cost the first client about a second (`bench/RESULTS.md`).
pub async fn warm_up(endpoint: &CdpEndpoint) {
    let warmed = async {
        let mut session = BidiSession::open(endpoint).await?;
        let events = json!({"events": ["browsingContext", "network", "log", "script", "input"]});
        let ran = async {
            session.call("session.subscribe", events).await?;
            let tree = session
                .call("browsingContext.getTree", json!({"maxDepth": 0}))
                .await?;
            let target = json!({"context": tree["contexts"][0]["context"]});
            session
                .call(
                    "script.evaluate",
                    json!({"target": target, "expression": "1 + 1", "awaitPromise": false}),
                )
                .await
        }
        .await;
        session.end().await;
        ran.map(|_| ())
    };
    if let Err(error) = warmed.await {
        tracing::debug!(%error, "a warm Firefox was not warmed up");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paths() -> BrowserPaths {
        let inside = Path::new("/instance");
        BrowserPaths {
            profile: inside.join("profile"),
            home: inside.join("home"),
            downloads: inside.join("downloads"),
            extensions: inside.join("extensions"),
            uploads: inside.join("uploads"),
        }
    }

    #[test]
    fn the_proxy_and_downloads_are_locked_by_policy() {
        let prefs = user_prefs(&paths(), Some(4321));
        let policies = policies(&paths(), &prefs);
        let locked = &policies["policies"]["Preferences"];
        assert_eq!(
            locked["network.proxy.socks_port"],
            json!({"Value": 4321, "Status": "locked"})
        );
        assert_eq!(locked["network.proxy.type"]["Value"], json!(1));
        assert_eq!(
            locked["browser.download.dir"]["Value"],
            json!("/instance/downloads")
        );
        assert_eq!(
            policies["policies"]["ExtensionSettings"]["*"]["installation_mode"],
            json!("blocked")
        );
        // What Firefox would refuse to lock is left to user.js.
        assert!(locked.get("toolkit.telemetry.enabled").is_none());
        assert_eq!(locked["security.OCSP.enabled"]["Value"], json!(0));
        let text = user_js(&prefs);
        assert!(text.contains("user_pref(\"network.proxy.socks_port\", 4321);\n"));
        assert!(text.contains("user_pref(\"browser.download.dir\", \"/instance/downloads\");\n"));
    }

    #[test]
    fn without_egress_the_browser_keeps_no_proxy() {
        let prefs = user_prefs(&paths(), None);
        assert!(
            prefs
                .iter()
                .all(|(name, _)| !name.starts_with("network.proxy"))
        );
    }

    #[test]
    fn the_announced_port_is_read_and_a_bad_file_is_not() {
        let profile = tempfile::tempdir().unwrap();
        assert!(read_server_file(profile.path()).is_none());
        std::fs::write(
            profile.path().join(SERVER_FILE),
            r#"{"ws_host": "127.0.0.1", "ws_port": 39851}"#,
        )
        .unwrap();
        let endpoint = read_server_file(profile.path()).unwrap();
        assert_eq!(
            (endpoint.port, endpoint.browser_path.as_str()),
            (39851, BIDI_PATH)
        );
        assert_eq!(endpoint.engine, EngineKind::Firefox);
        for bad in [r#"{"ws_port": 0}"#, r#"{"ws_port": 70000}"#, "not json", ""] {
            std::fs::write(profile.path().join(SERVER_FILE), bad).unwrap();
            assert!(read_server_file(profile.path()).is_none(), "{bad}");
        }
    }

    #[test]
    fn an_announced_port_planted_as_a_link_or_a_pipe_is_not_read() {
        let profile = tempfile::tempdir().unwrap();
        let port_file = profile.path().join(MARIONETTE_PORT_FILE);
        std::fs::write(&port_file, "2828\n").unwrap();
        assert_eq!(marionette_port(profile.path()), Some(2828));
        std::fs::write(&port_file, "0").unwrap();
        assert_eq!(marionette_port(profile.path()), None);
        // A link to an endless file, a pipe nobody writes, a huge file.
        std::fs::remove_file(&port_file).unwrap();
        std::os::unix::fs::symlink("/dev/zero", &port_file).unwrap();
        assert_eq!(marionette_port(profile.path()), None);
        std::fs::remove_file(&port_file).unwrap();
        let fifo = std::ffi::CString::new(port_file.as_os_str().as_encoded_bytes()).unwrap();
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        assert_eq!(marionette_port(profile.path()), None);
        std::fs::remove_file(&port_file).unwrap();
        std::fs::write(&port_file, "9".repeat(1 << 20)).unwrap();
        assert_eq!(marionette_port(profile.path()), None);
    }
}
