//! WebDriver sessions (W3C WebDriver, as Selenium Grid 4 serves it): a
//! session is an instance. A new session's capabilities are read here
//! (`alwaysMatch` merged with each `firstMatch` as the standard says),
//! checked, and turned into an instance create (`flotilla:options`, `proxy`)
//! and the capabilities its node's chromedriver gets; the commands
//! themselves are chromedriver's (the node serves them, see the node
//! agent's `webdriver` module). Refusals are W3C errors: `invalid argument`
//! naming the capability, `session not created` saying why.

use serde_json::{Map, Value, json};

use flotilla_api_types::instances::{CreateInstanceRequest, InstanceConfig, UpstreamProxy};
use flotilla_api_types::profiles::ProfileUse;

/// A W3C refusal of a new session or a command: the error code, its HTTP
/// status and the message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct WebDriverRefusal {
    pub status: u16,
    pub code: &'static str,
    pub message: String,
}

impl WebDriverRefusal {
    pub fn invalid_argument(message: impl Into<String>) -> Self {
        Self {
            status: 400,
            code: "invalid argument",
            message: message.into(),
        }
    }

    pub fn not_created(message: impl Into<String>) -> Self {
        Self {
            status: 500,
            code: "session not created",
            message: message.into(),
        }
    }

    /// 500 `unknown error`: the store, the node or the instance failed.
    pub fn unknown(message: impl Into<String>) -> Self {
        Self {
            status: 500,
            code: "unknown error",
            message: message.into(),
        }
    }

    /// 404 `unknown command`.
    pub fn unknown_command(message: impl Into<String>) -> Self {
        Self {
            status: 404,
            code: "unknown command",
            message: message.into(),
        }
    }

    pub fn no_session(id: &str) -> Self {
        Self {
            status: 404,
            code: "invalid session id",
            message: format!(
                "no WebDriver session {id} (deleted, or never created): create one with POST /session"
            ),
        }
    }

    /// The W3C body: `{"value": {"error", "message", "stacktrace"}}`.
    pub fn body(&self) -> Value {
        json!({"value": {"error": self.code, "message": self.message, "stacktrace": ""}})
    }
}

/// What a new session asks for.
#[derive(Debug, Clone)]
pub struct NewSession {
    /// The instance to create.
    pub create: CreateInstanceRequest,
    /// The capabilities chromedriver gets (it attaches to the instance's
    /// browser): the standard ones and what of `goog:chromeOptions` applies
    /// to a running browser.
    pub capabilities: Value,
    /// A window size asked with `--window-size=W,H`: set once the session runs.
    pub window_size: Option<(u64, u64)>,
    /// Whether the client asked for Selenium Grid's managed downloads
    /// (`se:downloadsEnabled`): the answer then says they are on.
    pub downloads_enabled: bool,
}

/// `goog:chromeOptions.args` that would break the browser's isolation or
/// the agent's control of it: refused, each named.
const REFUSED_ARGS: &[&str] = &[
    "--no-sandbox",
    "--remote-debugging-port",
    "--remote-debugging-address",
    "--remote-debugging-pipe",
    "--remote-allow-origins",
    "--user-data-dir",
    "--load-extension",
    "--disable-extensions-except",
    "--proxy-server",
    "--proxy-pac-url",
    "--proxy-bypass-list",
    "--disable-web-security",
    "--allow-file-access-from-files",
    "--disable-site-isolation-trials",
    "--single-process",
    "--renderer-cmd-prefix",
    "--utility-cmd-prefix",
    "--gpu-launcher",
    "--enable-logging",
    "--log-file",
];

/// Arguments every Flotilla browser already runs with (headless, no GPU,
/// no /dev/shm): accepted, nothing to do.
const ALREADY_SO: &[&str] = &[
    "--headless",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-extensions",
    "--disable-popup-blocking",
    "--disable-infobars",
    "--start-maximized",
];

/// Keys of `goog:chromeOptions` that name a host path or another browser:
/// refused.
const REFUSED_CHROME_OPTIONS: &[&str] = &[
    "binary",
    "debuggerAddress",
    "extensions",
    "localState",
    "minidumpPath",
    "perfLoggingPrefs",
    "androidPackage",
    "androidActivity",
    "androidDeviceSerial",
    "androidProcess",
    "androidUseRunningApp",
    "androidExecName",
    "detach",
    "windowTypes",
];

/// Reads a new session's body: `{"capabilities": {"alwaysMatch", "firstMatch"}}`.
/// `installed` is the Chromium version the nodes run (for `browserVersion`).
pub fn new_session(body: &Value, installed: &str) -> Result<NewSession, WebDriverRefusal> {
    let capabilities = body
        .get("capabilities")
        .filter(|c| c.is_object())
        .ok_or_else(|| {
            WebDriverRefusal::invalid_argument(
                "the body must be {\"capabilities\": {\"alwaysMatch\": {…}, \"firstMatch\": [{…}]}} (W3C)",
            )
        })?;
    let always = match capabilities.get("alwaysMatch") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(map)) => map.clone(),
        Some(_) => {
            return Err(WebDriverRefusal::invalid_argument(
                "alwaysMatch must be an object",
            ));
        }
    };
    let first = match capabilities.get("firstMatch") {
        None | Some(Value::Null) => vec![Map::new()],
        Some(Value::Array(items)) if !items.is_empty() => items
            .iter()
            .map(|item| match item {
                Value::Object(map) => Ok(map.clone()),
                _ => Err(WebDriverRefusal::invalid_argument(
                    "every firstMatch entry must be an object",
                )),
            })
            .collect::<Result<Vec<_>, _>>()?,
        Some(_) => {
            return Err(WebDriverRefusal::invalid_argument(
                "firstMatch must be a non-empty array of objects",
            ));
        }
    };
    let mut reasons = Vec::new();
    for entry in first {
        let merged = merge(&always, &entry)?;
        match matched(&merged, installed)? {
            Ok(session) => return Ok(session),
            Err(Mismatch(reason)) => reasons.push(reason),
        }
    }
    Err(WebDriverRefusal::not_created(format!(
        "no capabilities this node can match: {}",
        reasons.join("; ")
    )))
}

/// `alwaysMatch` and one `firstMatch` entry together; a key in both is
/// `invalid argument` (W3C: merging capabilities).
fn merge(
    always: &Map<String, Value>,
    entry: &Map<String, Value>,
) -> Result<Map<String, Value>, WebDriverRefusal> {
    let mut merged = always.clone();
    for (key, value) in entry {
        if merged.contains_key(key) {
            return Err(WebDriverRefusal::invalid_argument(format!(
                "capability {key} is in both alwaysMatch and firstMatch"
            )));
        }
        merged.insert(key.clone(), value.clone());
    }
    Ok(merged)
}

/// Why one set of merged capabilities is not this fleet's (another
/// `firstMatch` entry may be).
struct Mismatch(String);

/// Checks the merged capabilities: `Ok(Ok(session))` when this fleet
/// matches them, `Ok(Err(why))` when it does not (another `firstMatch`
/// entry may), and an error for a value of the wrong type.
fn matched(
    caps: &Map<String, Value>,
    installed: &str,
) -> Result<Result<NewSession, Mismatch>, WebDriverRefusal> {
    if let Some(mismatch) = fleet_mismatch(caps, installed)? {
        return Ok(Err(mismatch));
    }
    let (mut forwarded, downloads_enabled) = standard_capabilities(caps)?;
    let firefox = string(caps, "browserName")? == Some("firefox");
    let browser = if firefox {
        // geckodriver checks them against its Firefox.
        for key in ["browserName", "browserVersion"] {
            if let Some(value) = caps.get(key).filter(|v| !v.is_null()) {
                forwarded.insert(key.into(), value.clone());
            }
        }
        super::webdriver_firefox::firefox_options(caps.get("moz:firefoxOptions"))?
    } else {
        chrome_options(caps.get("goog:chromeOptions"))?
    };
    if !browser.kept.is_empty() {
        forwarded.insert("goog:chromeOptions".into(), Value::Object(browser.kept));
    }
    let window_size = browser.window_size;
    let mut create = flotilla_options(caps.get("flotilla:options"))?;
    if firefox && create.image.is_none() {
        create.image = Some(super::webdriver_firefox::FIREFOX_IMAGE.into());
    }
    if let Some(prefs) = browser.prefs {
        create
            .config
            .get_or_insert_with(InstanceConfig::default)
            .prefs = Some(prefs);
    }
    if let Some(proxy) = caps.get("proxy") {
        let config = create.config.get_or_insert_with(InstanceConfig::default);
        config.proxy = proxy_of(proxy)?;
    }
    Ok(Ok(NewSession {
        create,
        capabilities: Value::Object(forwarded),
        window_size,
        downloads_enabled,
    }))
}

/// The standard capabilities of `caps`, checked, as the node's driver gets
/// them; and whether Grid's managed downloads were asked for.
fn standard_capabilities(
    caps: &Map<String, Value>,
) -> Result<(Map<String, Value>, bool), WebDriverRefusal> {
    let mut forwarded = Map::new();
    let mut downloads_enabled = false;
    for (key, value) in caps {
        match key.as_str() {
            "browserName" | "browserVersion" | "platformName" | "proxy" | "flotilla:options"
            | "goog:chromeOptions" | "moz:firefoxOptions" => {}
            "se:downloadsEnabled" => {
                downloads_enabled = value.as_bool().ok_or_else(|| {
                    WebDriverRefusal::invalid_argument("se:downloadsEnabled must be a boolean")
                })?;
            }
            "acceptInsecureCerts"
            | "strictFileInteractability"
            | "setWindowRect"
            | "webSocketUrl" => {
                if !value.is_boolean() {
                    return Err(WebDriverRefusal::invalid_argument(format!(
                        "{key} must be a boolean"
                    )));
                }
                forwarded.insert(key.clone(), value.clone());
            }
            "pageLoadStrategy" => {
                if !matches!(value.as_str(), Some("none" | "eager" | "normal")) {
                    return Err(WebDriverRefusal::invalid_argument(
                        "pageLoadStrategy must be \"none\", \"eager\" or \"normal\"",
                    ));
                }
                forwarded.insert(key.clone(), value.clone());
            }
            "unhandledPromptBehavior" => {
                check_prompt_behavior(value)?;
                forwarded.insert(key.clone(), value.clone());
            }
            "timeouts" => {
                check_timeouts(value)?;
                forwarded.insert(key.clone(), value.clone());
            }
            // Extensions of other vendors and Selenium's own (se:…): not ours.
            _ if key.contains(':') => {}
            other => {
                return Err(WebDriverRefusal::invalid_argument(format!(
                    "unknown capability {other:?}"
                )));
            }
        }
    }
    Ok((forwarded, downloads_enabled))
}

/// Why this fleet cannot serve the browser, platform or version the
/// capabilities name, if it cannot.
fn fleet_mismatch(
    caps: &Map<String, Value>,
    installed: &str,
) -> Result<Option<Mismatch>, WebDriverRefusal> {
    let name = string(caps, "browserName")?;
    if let Some(name) = name
        && !matches!(name, "chrome" | "chromium" | "firefox" | "")
    {
        return Ok(Some(Mismatch(format!(
            "browserName {name:?} (this fleet runs chrome/chromium and firefox)"
        ))));
    }
    if let Some(platform) = string(caps, "platformName")?
        && !matches!(platform.to_ascii_lowercase().as_str(), "linux" | "any" | "")
    {
        return Ok(Some(Mismatch(format!(
            "platformName {platform:?} (the nodes run linux)"
        ))));
    }
    // Firefox's version is checked by geckodriver, on the node.
    if let Some(version) = string(caps, "browserVersion")?
        && name != Some("firefox")
        && !version_matches(version, installed)
    {
        return Ok(Some(Mismatch(format!(
            "browserVersion {version:?} (the nodes run Chromium {installed})"
        ))));
    }
    Ok(None)
}

/// `unhandledPromptBehavior`: one of the standard's values.
fn check_prompt_behavior(value: &Value) -> Result<(), WebDriverRefusal> {
    let known = [
        "dismiss",
        "accept",
        "dismiss and notify",
        "accept and notify",
        "ignore",
    ];
    if !value.as_str().is_some_and(|v| known.contains(&v)) {
        return Err(WebDriverRefusal::invalid_argument(format!(
            "unhandledPromptBehavior must be one of {known:?}"
        )));
    }
    Ok(())
}

fn string<'a>(
    caps: &'a Map<String, Value>,
    key: &str,
) -> Result<Option<&'a str>, WebDriverRefusal> {
    match caps.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(text)) => Ok(Some(text)),
        Some(_) => Err(WebDriverRefusal::invalid_argument(format!(
            "{key} must be a string"
        ))),
    }
}

/// `browserVersion` against the installed version: equal, a prefix at a
/// dot (`156`, `156.0`), `stable` or `latest`.
fn version_matches(asked: &str, installed: &str) -> bool {
    matches!(asked, "stable" | "latest" | "")
        || asked == installed
        || installed
            .strip_prefix(asked)
            .is_some_and(|rest| rest.starts_with('.'))
}

fn check_timeouts(value: &Value) -> Result<(), WebDriverRefusal> {
    let Some(timeouts) = value.as_object() else {
        return Err(WebDriverRefusal::invalid_argument(
            "timeouts must be an object",
        ));
    };
    for (key, value) in timeouts {
        if !matches!(key.as_str(), "implicit" | "pageLoad" | "script") {
            return Err(WebDriverRefusal::invalid_argument(format!(
                "unknown timeout {key:?} (implicit, pageLoad, script)"
            )));
        }
        let valid = value.is_null() && key == "script"
            || value.as_u64().is_some_and(|ms| ms <= 9_007_199_254_740_991);
        if !valid {
            return Err(WebDriverRefusal::invalid_argument(format!(
                "timeouts.{key} must be an integer of milliseconds"
            )));
        }
    }
    Ok(())
}

/// What Flotilla makes of `goog:chromeOptions` (or of Firefox's
/// `moz:firefoxOptions`).
#[derive(Default)]
pub(super) struct BrowserOptions {
    /// What is kept for chromedriver (nothing for geckodriver).
    pub(super) kept: Map<String, Value>,
    /// The window size the arguments ask for.
    pub(super) window_size: Option<(u64, u64)>,
    /// `prefs`, for the instance's `config.prefs` (the browser starts with
    /// them), without the download folders.
    pub(super) prefs: Option<Map<String, Value>>,
}

/// `goog:chromeOptions`: what chromedriver may apply to a running browser
/// (`mobileEmulation`), the window size of `--window-size`, the preferences
/// the instance's browser starts with, and the refusals (what names a host
/// path or another browser).
fn chrome_options(value: Option<&Value>) -> Result<BrowserOptions, WebDriverRefusal> {
    let options = match value {
        None | Some(Value::Null) => return Ok(BrowserOptions::default()),
        Some(Value::Object(options)) => options,
        Some(_) => {
            return Err(WebDriverRefusal::invalid_argument(
                "goog:chromeOptions must be an object",
            ));
        }
    };
    let mut chrome = BrowserOptions::default();
    for (key, value) in options {
        match key.as_str() {
            "args" => chrome.window_size = chrome_args(value)?,
            "prefs" => chrome.prefs = chrome_prefs(value)?,
            "mobileEmulation" => {
                if !value.is_object() {
                    return Err(WebDriverRefusal::invalid_argument(
                        "goog:chromeOptions.mobileEmulation must be an object",
                    ));
                }
                chrome.kept.insert(key.clone(), value.clone());
            }
            // The browser's own switches are Flotilla's; nothing to leave out.
            "excludeSwitches" => {
                if !value
                    .as_array()
                    .is_some_and(|a| a.iter().all(Value::is_string))
                {
                    return Err(WebDriverRefusal::invalid_argument(
                        "goog:chromeOptions.excludeSwitches must be an array of strings",
                    ));
                }
            }
            "w3c" if value.as_bool() == Some(true) => {}
            // Selenium sends an empty list whatever the test asked.
            "extensions" if value.as_array().is_some_and(|a| a.is_empty()) => {}
            key if REFUSED_CHROME_OPTIONS.contains(&key) => {
                return Err(WebDriverRefusal::invalid_argument(format!(
                    "goog:chromeOptions.{key} is refused: the instance's browser is Flotilla's, in its sandbox (extensions: flotilla:options.extensions with ids from POST /v2/extensions)"
                )));
            }
            other => {
                return Err(WebDriverRefusal::invalid_argument(format!(
                    "goog:chromeOptions.{other} is not supported by Flotilla (supported: args, prefs, mobileEmulation, excludeSwitches)"
                )));
            }
        }
    }
    Ok(chrome)
}

/// `goog:chromeOptions.prefs`, checked as `config.prefs` is, without the
/// download folders Selenium suites set (the session's downloads are the
/// instance's, as with Grid's managed downloads); none when nothing is left.
fn chrome_prefs(value: &Value) -> Result<Option<Map<String, Value>>, WebDriverRefusal> {
    let Some(prefs) = value.as_object() else {
        return Err(WebDriverRefusal::invalid_argument(
            "goog:chromeOptions.prefs must be an object",
        ));
    };
    let prefs = flotilla_api_types::prefs::without_download_folders(prefs);
    flotilla_api_types::prefs::expand(&prefs).map_err(|error| {
        WebDriverRefusal::invalid_argument(format!("goog:chromeOptions.prefs: {error}"))
    })?;
    Ok((!prefs.is_empty()).then_some(prefs))
}

/// `goog:chromeOptions.args`: each refused one named; `--window-size`
/// read; what Flotilla's browsers already do accepted.
fn chrome_args(value: &Value) -> Result<Option<(u64, u64)>, WebDriverRefusal> {
    let Some(args) = value.as_array() else {
        return Err(WebDriverRefusal::invalid_argument(
            "goog:chromeOptions.args must be an array of strings",
        ));
    };
    let mut refused = Vec::new();
    let mut unsupported = Vec::new();
    let mut window_size = None;
    for arg in args {
        let Some(arg) = arg.as_str() else {
            return Err(WebDriverRefusal::invalid_argument(
                "goog:chromeOptions.args must be an array of strings",
            ));
        };
        let switch = arg.split('=').next().unwrap_or(arg);
        let switch = if switch.starts_with("--") {
            switch.to_owned()
        } else {
            format!("--{switch}")
        };
        if REFUSED_ARGS.contains(&switch.as_str()) {
            refused.push(arg.to_owned());
        } else if switch == "--window-size" {
            window_size = Some(window_size_of(arg)?);
        } else if !ALREADY_SO.contains(&switch.as_str()) {
            unsupported.push(arg.to_owned());
        }
    }
    if !refused.is_empty() {
        return Err(WebDriverRefusal::invalid_argument(format!(
            "goog:chromeOptions.args {refused:?} would break the browser's isolation or Flotilla's control of it: remove them (the sandbox, the DevTools port, the profile and the proxy are Flotilla's; an upstream proxy is the proxy capability)"
        )));
    }
    if !unsupported.is_empty() {
        return Err(WebDriverRefusal::invalid_argument(format!(
            "goog:chromeOptions.args {unsupported:?} are not supported by Flotilla (accepted: --window-size=W,H and {ALREADY_SO:?}, which Flotilla's browsers already run with)"
        )));
    }
    Ok(window_size)
}

pub(super) fn window_size_of(arg: &str) -> Result<(u64, u64), WebDriverRefusal> {
    let size = arg.split_once('=').map(|(_, size)| size).unwrap_or("");
    let parsed = size
        .split_once([',', 'x'])
        .and_then(|(w, h)| Some((w.trim().parse::<u64>().ok()?, h.trim().parse::<u64>().ok()?)))
        .filter(|&(w, h)| (100..=8192).contains(&w) && (100..=8192).contains(&h));
    parsed.ok_or_else(|| {
        WebDriverRefusal::invalid_argument(format!(
            "{arg:?}: --window-size takes WIDTH,HEIGHT in pixels, each from 100 to 8192"
        ))
    })
}

/// `flotilla:options`: everything an instance create takes, flat.
fn flotilla_options(value: Option<&Value>) -> Result<CreateInstanceRequest, WebDriverRefusal> {
    let mut create = CreateInstanceRequest::default();
    let options = match value {
        None | Some(Value::Null) => return Ok(create),
        Some(Value::Object(options)) => options,
        Some(_) => {
            return Err(WebDriverRefusal::invalid_argument(
                "flotilla:options must be an object",
            ));
        }
    };
    let invalid = |key: &str, what: &str| {
        WebDriverRefusal::invalid_argument(format!("flotilla:options.{key} must be {what}"))
    };
    let mut config = InstanceConfig::default();
    let mut configured = false;
    for (key, value) in options {
        match key.as_str() {
            "image" => {
                create.image = Some(
                    value
                        .as_str()
                        .ok_or_else(|| invalid(key, "a string"))?
                        .to_owned(),
                )
            }
            "node_preference" => {
                let node = value.as_str().ok_or_else(|| invalid(key, "a node id"))?;
                create.node_preference = Some(node.into());
            }
            "profile" => {
                create.profile = Some(
                    serde_json::from_value::<ProfileUse>(value.clone())
                        .map_err(|e| invalid(key, &format!("{{\"name\", \"persist\"}} ({e})")))?,
                );
            }
            "memory_gb" | "disk_gb" | "max_duration_minutes" => {
                let number = value.as_f64().ok_or_else(|| invalid(key, "a number"))?;
                match key.as_str() {
                    "memory_gb" => config.memory_gb = number,
                    "disk_gb" => config.disk_gb = number,
                    _ => config.max_duration_minutes = Some(number),
                }
                configured = true;
            }
            "cpu_cores" | "idle_timeout_minutes" => {
                let number = value.as_i64().ok_or_else(|| invalid(key, "an integer"))?;
                if key == "cpu_cores" {
                    config.cpu_cores = number;
                } else {
                    config.idle_timeout_minutes = number;
                }
                configured = true;
            }
            "auto_snapshot" | "record" | "keep_recordings" => {
                let flag = value.as_bool().ok_or_else(|| invalid(key, "a boolean"))?;
                match key.as_str() {
                    "auto_snapshot" => config.auto_snapshot = flag,
                    "record" => config.record = flag,
                    _ => config.keep_recordings = flag,
                }
                configured = true;
            }
            "extensions" => {
                config.extensions = serde_json::from_value(value.clone())
                    .map_err(|_| invalid(key, "an array of extension ids"))?;
                configured = true;
            }
            other => {
                return Err(WebDriverRefusal::invalid_argument(format!(
                    "unknown flotilla:options.{other} (image, node_preference, profile, memory_gb, cpu_cores, disk_gb, idle_timeout_minutes, auto_snapshot, max_duration_minutes, extensions, record, keep_recordings)"
                )));
            }
        }
    }
    if configured {
        create.config = Some(config);
    }
    Ok(create)
}

/// The W3C `proxy` capability as the instance's upstream proxy: `direct`
/// and `system` are none; `manual` takes `httpProxy`/`sslProxy` (one
/// server for both) or `socksProxy` (version 5), and `noProxy`.
fn proxy_of(value: &Value) -> Result<Option<UpstreamProxy>, WebDriverRefusal> {
    let invalid = |why: &str| WebDriverRefusal::invalid_argument(format!("proxy: {why}"));
    let Some(proxy) = value.as_object() else {
        return Err(invalid("must be an object"));
    };
    match proxy.get("proxyType").and_then(Value::as_str) {
        Some("direct" | "system") => return Ok(None),
        Some("manual") => {}
        Some("pac" | "autodetect") => {
            return Err(invalid(
                "proxyType pac and autodetect are not supported: use manual",
            ));
        }
        _ => return Err(invalid("proxyType must be direct, system or manual")),
    }
    let text = |key: &str| {
        proxy
            .get(key)
            .and_then(Value::as_str)
            .filter(|v| !v.is_empty())
    };
    let server = match (text("httpProxy"), text("sslProxy"), text("socksProxy")) {
        (Some(http), ssl, None) if ssl.is_none_or(|ssl| ssl == http) => format!("http://{http}"),
        (None, Some(ssl), None) => format!("http://{ssl}"),
        (None, None, Some(socks)) => {
            if proxy
                .get("socksVersion")
                .and_then(Value::as_u64)
                .is_some_and(|v| v != 5)
            {
                return Err(invalid("only socksVersion 5 is supported"));
            }
            format!("socks5://{socks}")
        }
        _ => {
            return Err(invalid(
                "manual takes one server: httpProxy (and the same sslProxy), sslProxy, or socksProxy",
            ));
        }
    };
    let bypass = match proxy.get("noProxy") {
        None | Some(Value::Null) => Vec::new(),
        Some(value) => serde_json::from_value(value.clone())
            .map_err(|_| invalid("noProxy must be an array of strings"))?,
    };
    Ok(Some(UpstreamProxy {
        server,
        username: None,
        password: None,
        bypass,
    }))
}

/// What a node's sessions may be (Grid's `/status`): Chrome, and Firefox
/// where the node runs the `firefox` image.
fn stereotypes(node: &crate::store::NodeRecord) -> Vec<Value> {
    let mut stereotypes = vec![
        json!({"browserName": "chrome", "browserVersion": node.browser_version, "platformName": "linux"}),
    ];
    if node
        .images
        .iter()
        .any(|image| image == super::webdriver_firefox::FIREFOX_IMAGE)
    {
        stereotypes.push(json!({"browserName": "firefox", "platformName": "linux"}));
    }
    stereotypes
}

/// The control plane's part of a session: its instance, and who may drive it.
impl super::ControlPlane {
    /// The Chromium version the online nodes run (the first one known).
    pub async fn webdriver_browser_version(&self) -> crate::error::Result<String> {
        let nodes = self.store.node_list().await?;
        Ok(nodes
            .into_iter()
            .filter(|node| node.status == flotilla_api_types::nodes::NodeStatus::Online)
            .find_map(|node| node.browser_version)
            .unwrap_or_else(|| "unknown".into()))
    }

    /// A new session's instance: created (waiting up to
    /// `webdriver.session_request_timeout_sec` in the create queue for
    /// room), owned by `owner`.
    pub async fn webdriver_instance_create(
        &self,
        session: &NewSession,
        (owner, scope): (&str, &super::Scope),
    ) -> Result<flotilla_api_types::instances::Instance, WebDriverRefusal> {
        let wait = self.config.webdriver.session_request_timeout_sec;
        self.tenant_may_open_session(scope)
            .await
            .map_err(|error| WebDriverRefusal::not_created(error.to_string()))?;
        let instance = self
            .instance_create_queued(session.create.clone(), wait, scope)
            .await
            .map_err(|error| match error {
                crate::error::Error::InvalidRequest(detail) => {
                    WebDriverRefusal::invalid_argument(format!("flotilla:options: {detail}"))
                }
                other => WebDriverRefusal::not_created(other.to_string()),
            })?;
        self.store
            .instance_set_webdriver_owner(&instance.id, owner)
            .await
            .map_err(|e| {
                WebDriverRefusal::not_created(format!("cannot record the session: {e}"))
            })?;
        Ok(instance)
    }

    /// Where session `id`'s commands go, if `principal` may drive it: it
    /// is a WebDriver session (an instance that one made), and with
    /// authentication on, it is theirs. Anything else is `invalid session id`.
    pub async fn webdriver_target(
        &self,
        id: &flotilla_api_types::InstanceId,
        principal: &str,
    ) -> Result<super::DoorTarget, WebDriverRefusal> {
        let record = self
            .store
            .instance_get(id)
            .await
            .map_err(|e| WebDriverRefusal::unknown(format!("the store cannot be read: {e}")))?;
        let record = record
            .filter(|r| {
                r.webdriver_owner
                    .as_deref()
                    .is_some_and(|owner| !self.config.auth_enabled || owner == principal)
            })
            .ok_or_else(|| WebDriverRefusal::no_session(id.as_str()))?;
        self.door_target_of(record)
            .await
            .map_err(|error| match error {
                crate::error::Error::NotFound(_) | crate::error::Error::InvalidState(_) => {
                    WebDriverRefusal::no_session(id.as_str())
                }
                other => WebDriverRefusal::unknown(other.to_string()),
            })
    }

    /// Grid 4's `GET /status`: ready when an online node has room. It is
    /// open, so a node's address (`uri`) is shown only with authentication
    /// off.
    pub async fn webdriver_status(&self, nodes_shown: bool) -> crate::error::Result<Value> {
        let nodes = self.store.node_list().await?;
        let occupancy: std::collections::HashMap<_, _> =
            self.store.node_occupancy().await?.into_iter().collect();
        let listed: Vec<Value> = nodes
            .iter()
            .map(|node| {
                let used = occupancy.get(&node.id).copied().unwrap_or(0);
                json!({
                    "id": node.id,
                    "uri": (!self.config.auth_enabled).then_some(&node.address),
                    "availability": if node.status == flotilla_api_types::nodes::NodeStatus::Online { "UP" } else { "DOWN" },
                    "maxSessions": node.max_instances,
                    "sessionCount": used,
                    "stereotypes": stereotypes(node),
                })
            })
            .collect();
        let ready = nodes.iter().any(|node| {
            node.status == flotilla_api_types::nodes::NodeStatus::Online
                && occupancy.get(&node.id).copied().unwrap_or(0) < node.max_instances
        });
        let message = if ready {
            "Flotilla is ready to create sessions"
        } else if nodes.is_empty() {
            "no node has registered yet"
        } else {
            "every node is full or offline: new sessions wait in the create queue"
        };
        let listed = if nodes_shown { listed } else { Vec::new() };
        Ok(json!({"value": {"ready": ready, "message": message, "nodes": listed}}))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const INSTALLED: &str = "156.0.8078.108";

    fn session(body: Value) -> Result<NewSession, WebDriverRefusal> {
        new_session(&body, INSTALLED)
    }

    #[test]
    fn what_selenium_sends_creates_an_instance() {
        // Selenium 4 for Python, ChromeOptions() with a few things set.
        let created = session(json!({"capabilities": {
            "firstMatch": [{}],
            "alwaysMatch": {
                "browserName": "chrome", "pageLoadStrategy": "normal",
                "acceptInsecureCerts": true, "timeouts": {"implicit": 0, "pageLoad": 300000, "script": 30000},
                "goog:chromeOptions": {"extensions": [], "args": ["--headless=new", "--window-size=1024,768"]},
                "flotilla:options": {"record": true, "idle_timeout_minutes": 5},
                "se:recordVideo": false,
            }
        }}));
        assert!(
            created.is_ok(),
            "an empty extensions list is what Selenium always sends"
        );
        let refused = session(json!({"capabilities": {"alwaysMatch": {
            "goog:chromeOptions": {"extensions": ["Q3J4"]}
        }}}))
        .unwrap_err();
        assert!(
            refused.message.contains("goog:chromeOptions.extensions"),
            "{refused}"
        );
        let created = session(json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome", "browserVersion": "156",
            "goog:chromeOptions": {"args": ["--headless=new", "--window-size=1024,768"], "mobileEmulation": {"deviceName": "Pixel 7"}},
            "flotilla:options": {"record": true, "idle_timeout_minutes": 5},
            "proxy": {"proxyType": "manual", "httpProxy": "proxy.example:3128", "noProxy": ["intranet"]},
        }}}))
        .unwrap();
        assert_eq!(created.window_size, Some((1024, 768)));
        let config = created.create.config.unwrap();
        assert!(config.record);
        assert_eq!(config.idle_timeout_minutes, 5);
        assert_eq!(config.proxy.unwrap().server, "http://proxy.example:3128");
        assert_eq!(
            created.capabilities["goog:chromeOptions"],
            json!({"mobileEmulation": {"deviceName": "Pixel 7"}})
        );
        assert!(created.capabilities.get("browserVersion").is_none());
    }

    #[test]
    fn first_match_entries_are_tried_in_order() {
        let created = session(json!({"capabilities": {
            "alwaysMatch": {"acceptInsecureCerts": false},
            "firstMatch": [{"browserName": "safari"}, {"browserName": "chromium"}],
        }}))
        .unwrap();
        assert_eq!(created.capabilities["acceptInsecureCerts"], false);
        assert_eq!(created.create.image, None, "the default image");
        let firefox = session(json!({"capabilities": {
            "firstMatch": [{"browserName": "firefox"}, {"browserName": "chromium"}],
        }}))
        .unwrap();
        assert_eq!(firefox.create.image.as_deref(), Some("firefox"));
        let refused = session(json!({"capabilities": {"firstMatch": [{"browserName": "safari"}, {"browserVersion": "120"}]}}))
            .unwrap_err();
        assert_eq!(refused.code, "session not created");
        assert!(
            refused.message.contains("safari")
                && refused.message.contains("Chromium 156.0.8078.108"),
            "{refused}"
        );
        let clash = session(json!({"capabilities": {"alwaysMatch": {"browserName": "chrome"}, "firstMatch": [{"browserName": "chrome"}]}}))
            .unwrap_err();
        assert_eq!(clash.code, "invalid argument");
    }

    #[test]
    fn what_would_break_isolation_is_refused_naming_each() {
        let refused = session(
            json!({"capabilities": {"alwaysMatch": {"goog:chromeOptions": {"args": [
                "--no-sandbox", "--remote-debugging-port=9222", "user-data-dir=/root", "--lang=de"
            ]}}}}),
        )
        .unwrap_err();
        assert_eq!(refused.code, "invalid argument");
        for named in [
            "--no-sandbox",
            "--remote-debugging-port=9222",
            "user-data-dir=/root",
        ] {
            assert!(refused.message.contains(named), "{named}: {refused}");
        }
        for key in ["binary", "debuggerAddress", "localState"] {
            let refused = session(
                json!({"capabilities": {"alwaysMatch": {"goog:chromeOptions": {key: "x"}}}}),
            )
            .unwrap_err();
            assert!(refused.message.contains(key), "{refused}");
        }
    }

    #[test]
    fn values_of_the_wrong_type_are_invalid_arguments() {
        for caps in [
            json!({"acceptInsecureCerts": "yes"}),
            json!({"pageLoadStrategy": "fast"}),
            json!({"timeouts": {"implicit": -1}}),
            json!({"timeouts": {"everything": 1}}),
            json!({"unhandledPromptBehavior": "panic"}),
            json!({"browserName": 5}),
            json!({"proxy": {"proxyType": "pac", "proxyAutoconfigUrl": "http://x"}}),
            json!({"flotilla:options": {"memory_gb": "2"}}),
            json!({"flotilla:options": {"nope": 1}}),
            json!({"goog:chromeOptions": {"args": ["--window-size=0,0"]}}),
            json!({"somethingElse": true}),
        ] {
            let refused =
                session(json!({"capabilities": {"alwaysMatch": caps.clone()}})).unwrap_err();
            assert_eq!(refused.code, "invalid argument", "{caps}: {refused}");
            assert_eq!(refused.status, 400);
        }
        for body in [
            json!({}),
            json!({"capabilities": 1}),
            json!({"capabilities": {"firstMatch": []}}),
        ] {
            assert_eq!(
                session(body.clone()).unwrap_err().code,
                "invalid argument",
                "{body}"
            );
        }
    }

    #[test]
    fn browser_versions_match_at_a_dot() {
        for asked in ["156", "156.0", "156.0.8078.108", "stable", "latest"] {
            assert!(version_matches(asked, INSTALLED), "{asked}");
        }
        for asked in ["15", "157", "156.1", "156.0.8078.10"] {
            assert!(!version_matches(asked, INSTALLED), "{asked}");
        }
    }

    #[test]
    fn prefs_become_the_instances_prefs_without_the_download_folders() {
        let created = session(json!({"capabilities": {"alwaysMatch": {
            "goog:chromeOptions": {"prefs": {
                "intl.accept_languages": "fr-FR,fr",
                "download.default_directory": "/home/tester/Downloads",
                "download": {"prompt_for_download": false},
            }},
        }}}))
        .unwrap();
        assert_eq!(
            Value::Object(created.create.config.unwrap().prefs.unwrap()),
            json!({"intl.accept_languages": "fr-FR,fr", "download": {"prompt_for_download": false}})
        );
        assert!(
            created.capabilities.get("goog:chromeOptions").is_none(),
            "chromedriver never sees them"
        );
        // Only download folders: nothing left, so no prefs (a warm browser fits).
        let created = session(json!({"capabilities": {"alwaysMatch": {
            "goog:chromeOptions": {"prefs": {"download.default_directory": "/tmp"}},
        }}}))
        .unwrap();
        assert!(created.create.config.is_none());
        for (prefs, named) in [
            (json!({"proxy.mode": "fixed_servers"}), "proxy"),
            (json!({"extensions": {"ui": {}}}), "extensions"),
            (json!({"a": 1, "a.b": 2}), "\"a\""),
            (json!("intl.accept_languages=de"), "must be an object"),
        ] {
            let refused = session(json!({"capabilities": {"alwaysMatch": {
                "goog:chromeOptions": {"prefs": prefs},
            }}}))
            .unwrap_err();
            assert_eq!(refused.code, "invalid argument");
            assert!(
                refused.message.contains("goog:chromeOptions.prefs")
                    && refused.message.contains(named),
                "{refused}"
            );
        }
    }
}
