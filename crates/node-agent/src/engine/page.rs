//! The page layer over the DevTools protocol: what the agent does with a
//! browser's pages, for every caller (MCP's steps, REST actions, the
//! instance's HTTP port, state capture and restore). A browser's tabs
//! ([`Browser`]: list, open, close, bring to the front; [`list_tabs`] over
//! HTTP), one page ([`Page`]: navigate and wait for a lifecycle event in one
//! routine, go back, evaluate, act on its elements, capture, emulate),
//! waiting on a page's events ([`wait_loaded`], [`page_event`]), dismissing
//! dialogs ([`dismiss_dialogs`]), following the console ([`ConsoleLog`]),
//! and a protocol failure in words fit for a client ([`describe`]). The
//! protocol's method names live here (and in the rest of `engine/`), not in
//! its callers.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::sync::broadcast;

use crate::engine::browser::CdpEndpoint;
use crate::engine::cdp::{CdpClient, CdpError, CdpEvent};

/// One open tab.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Tab {
    pub id: String,
    pub url: String,
    pub title: String,
}

/// Why the browser's tabs could not be listed.
#[derive(Debug, thiserror::Error)]
pub enum TabsError {
    #[error("{0}")]
    Browser(#[from] CdpError),
    /// `/json/list` did not answer a list of targets.
    #[error("{0}")]
    Unreadable(#[from] serde_json::Error),
}

/// The browser's page targets (its own `browser_ui` targets are left out).
pub async fn list_tabs(endpoint: &CdpEndpoint) -> Result<Vec<Tab>, TabsError> {
    #[derive(Deserialize)]
    struct Target {
        id: String,
        #[serde(rename = "type")]
        kind: String,
        url: String,
        title: String,
    }
    let body = CdpClient::http_get(endpoint, "/json/list").await?;
    let targets: Vec<Target> = serde_json::from_slice(&body)?;
    Ok(targets
        .into_iter()
        .filter(|t| t.kind == "page")
        .map(|t| Tab {
            id: t.id,
            url: t.url,
            title: t.title,
        })
        .collect())
}

/// The DevTools path of a page target.
pub fn page_path(tab: &Tab) -> String {
    format!("/devtools/page/{}", tab.id)
}

/// Console messages kept per browser.
const CONSOLE_KEPT: usize = 500;

/// A CDP failure in words fit for a client: no addresses or paths.
pub(crate) fn describe(error: &CdpError) -> String {
    match error {
        CdpError::Connect { .. } => "the agent cannot reach the browser".into(),
        other => other.to_string(),
    }
}

/// Waits for lifecycle event `awaited` of the document a `Page.navigate`
/// answer (`navigated`) started on `session`; a page that moves on before it
/// loads (a script, a meta refresh) is followed to where it went.
pub(crate) async fn wait_loaded(
    events: &mut broadcast::Receiver<CdpEvent>,
    session: &str,
    navigated: &Value,
    awaited: &str,
) -> Result<(), CdpError> {
    let Some(first_loader) = navigated["loaderId"].as_str() else {
        // A navigation within the same document: nothing more loads.
        return Ok(());
    };
    let frame = navigated["frameId"].as_str().unwrap_or_default();
    let mut loader = first_loader.to_owned();
    loop {
        let event = match events.recv().await {
            Ok(event) => event,
            Err(broadcast::error::RecvError::Lagged(_)) => continue,
            Err(broadcast::error::RecvError::Closed) => return Err(CdpError::Closed),
        };
        if event.method == "Target.detachedFromTarget" && event.params["sessionId"] == session {
            return Err(CdpError::TargetGone("loading the page (it closed)".into()));
        }
        if event.session_id.as_deref() != Some(session) {
            continue;
        }
        if event.method == "Inspector.targetCrashed" {
            return Err(CdpError::TargetGone("loading the page".into()));
        }
        if event.method != "Page.lifecycleEvent" || event.params["frameId"] != frame {
            continue;
        }
        let name = event.params["name"].as_str().unwrap_or_default();
        if name == "init" {
            if let Some(newer) = event.params["loaderId"].as_str() {
                loader = newer.to_owned();
            }
        } else if name == awaited && event.params["loaderId"] == loader.as_str() {
            return Ok(());
        }
    }
}

/// A task that ends when this is dropped.
pub(crate) struct AbortOnDrop(pub(crate) tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Dismisses every dialog the page behind `session` opens (`alert`,
/// `confirm`, `prompt`, `beforeunload`), which would otherwise hold its
/// load and scripts until the deadline; until the returned guard drops.
pub(crate) fn dismiss_dialogs(client: Arc<CdpClient>, session: String) -> AbortOnDrop {
    let mut events = client.events();
    AbortOnDrop(tokio::spawn(async move {
        loop {
            match events.recv().await {
                Ok(event)
                    if event.method == "Page.javascriptDialogOpening"
                        && event.session_id.as_deref() == Some(session.as_str()) =>
                {
                    let _ = client
                        .send_in(
                            "Page.handleJavaScriptDialog",
                            json!({"accept": false}),
                            Some(&session),
                        )
                        .await;
                }
                Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
                Err(broadcast::error::RecvError::Closed) => return,
            }
        }
    }))
}

/// The message of a script's exception (`exceptionDetails`).
pub(crate) fn exception_text(details: &Value) -> String {
    details["exception"]["description"]
        .as_str()
        .or_else(|| details["text"].as_str())
        .unwrap_or("the script threw")
        .to_owned()
}

/// The console messages and uncaught errors of every page of one browser,
/// from when the log started (the first MCP step on the instance); the
/// newest [`CONSOLE_KEPT`].
#[derive(Default)]
pub struct ConsoleLog {
    messages: Mutex<VecDeque<String>>,
    /// The follower task, while it runs (a tokio mutex: held while a new
    /// one connects, so two steps never start two).
    follower: tokio::sync::Mutex<Option<AbortOnDrop>>,
}

impl ConsoleLog {
    /// Starts following the browser at `endpoint` unless already following
    /// it (a revived instance has a new browser: the old follower ended with
    /// the old one). Every page is attached by the browser's auto-attach.
    pub async fn follow(self: &Arc<Self>, endpoint: &CdpEndpoint) {
        let mut follower = self.follower.lock().await;
        if follower.as_ref().is_some_and(|task| !task.0.is_finished()) {
            return;
        }
        let connected = tokio::time::timeout(
            Duration::from_secs(10),
            CdpClient::open_with_events(endpoint, &endpoint.browser_path, 4 << 20, 1024),
        )
        .await;
        let Ok(Ok(client)) = connected else {
            return;
        };
        let log = Arc::downgrade(self);
        *follower = Some(AbortOnDrop(tokio::spawn(async move {
            let mut events = client.events();
            let attach =
                json!({"autoAttach": true, "waitForDebuggerOnStart": false, "flatten": true});
            if client
                .call(
                    "Target.setAutoAttach",
                    attach,
                    None,
                    Duration::from_secs(10),
                )
                .await
                .is_err()
            {
                return;
            }
            loop {
                let event = match events.recv().await {
                    Ok(event) => event,
                    Err(broadcast::error::RecvError::Lagged(_)) => continue,
                    Err(broadcast::error::RecvError::Closed) => return,
                };
                match event.method.as_str() {
                    "Target.attachedToTarget" => {
                        let session = event.params["sessionId"].as_str().unwrap_or_default();
                        let _ = client
                            .send_in("Runtime.enable", json!({}), Some(session))
                            .await;
                    }
                    "Runtime.consoleAPICalled" | "Runtime.exceptionThrown" => {
                        let Some(log) = log.upgrade() else { return };
                        log.record(&event);
                    }
                    _ => {}
                }
            }
        })));
    }

    fn record(&self, event: &CdpEvent) {
        let line = if event.method == "Runtime.exceptionThrown" {
            format!(
                "[error] uncaught: {}",
                exception_text(&event.params["exceptionDetails"])
            )
        } else {
            let kind = event.params["type"].as_str().unwrap_or("log");
            let parts: Vec<String> = event.params["args"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|arg| match arg.get("value") {
                    Some(Value::String(text)) => text.clone(),
                    Some(other) => other.to_string(),
                    None => arg["description"]
                        .as_str()
                        .unwrap_or("undefined")
                        .to_owned(),
                })
                .collect();
            format!("[{kind}] {}", parts.join(" "))
        };
        let mut line = line;
        if line.len() > 4096 {
            let mut cut = 4096;
            while !line.is_char_boundary(cut) {
                cut -= 1;
            }
            line.truncate(cut);
            line.push('…');
        }
        let mut messages = self.messages.lock().expect("console lock");
        if messages.len() == CONSOLE_KEPT {
            messages.pop_front();
        }
        messages.push_back(line);
    }

    pub(crate) fn render(&self) -> String {
        let messages = self.messages.lock().expect("console lock");
        if messages.is_empty() {
            return "No console messages yet (they are kept from the first browser_ step on this instance).".into();
        }
        let mut text = format!("{} console message(s), oldest first:\n", messages.len());
        for message in messages.iter() {
            let _ = writeln!(text, "{message}");
        }
        text
    }
}

/// Returns once `session`'s page sends an event `wanted` picks (the events
/// were subscribed to before that page started loading), or the connection
/// closes.
pub(crate) async fn page_event(
    mut events: tokio::sync::broadcast::Receiver<crate::engine::cdp::CdpEvent>,
    session: &str,
    wanted: impl Fn(&crate::engine::cdp::CdpEvent) -> bool,
) {
    use tokio::sync::broadcast::error::RecvError;
    loop {
        match events.recv().await {
            Ok(event) if event.session_id.as_deref() == Some(session) && wanted(&event) => {
                return;
            }
            Ok(_) | Err(RecvError::Lagged(_)) => {}
            Err(RecvError::Closed) => return,
        }
    }
}

/// The page's load event fired.
pub(crate) fn load_event(event: &crate::engine::cdp::CdpEvent) -> bool {
    event.method == "Page.loadEventFired"
}

/// The page's own document committed (until then a reloading tab's target
/// shows no URL).
pub(crate) fn main_frame_committed(event: &crate::engine::cdp::CdpEvent) -> bool {
    event.method == "Page.frameNavigated" && event.params["frame"]["parentId"].is_null()
}

/// How long each call of a [`Page`] or [`Browser`] may take: until a
/// deadline (a step's, a job's), or a fixed time per call.
#[derive(Debug, Clone, Copy)]
pub enum Within {
    Deadline(tokio::time::Instant),
    Each(Duration),
}

impl Within {
    /// The time the next call has (at least a millisecond).
    pub fn remaining(&self) -> Duration {
        match self {
            Self::Deadline(deadline) => deadline
                .saturating_duration_since(tokio::time::Instant::now())
                .max(Duration::from_millis(1)),
            Self::Each(each) => *each,
        }
    }
}

/// The lifecycle event a navigation waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoadedAt {
    Load,
    DomContentLoaded,
    NetworkIdle,
}

impl LoadedAt {
    fn event_name(self) -> &'static str {
        match self {
            Self::Load => "load",
            Self::DomContentLoaded => "DOMContentLoaded",
            Self::NetworkIdle => "networkIdle",
        }
    }
}

/// Why a navigation did not reach its page.
#[derive(Debug, thiserror::Error)]
pub enum NavigateError {
    /// The browser could not load it (`net::ERR_…`).
    #[error("{0}")]
    Refused(String),
    #[error(transparent)]
    Browser(#[from] CdpError),
}

/// A browser's page targets, over a connection to the browser.
pub struct Browser<'a> {
    client: &'a CdpClient,
    within: Within,
}

impl<'a> Browser<'a> {
    pub fn new(client: &'a CdpClient, within: Within) -> Self {
        Self { client, within }
    }

    async fn call(&self, method: &str, params: Value) -> Result<Value, CdpError> {
        self.client
            .call(method, params, None, self.within.remaining())
            .await
    }

    /// Its page tabs, most recently used first.
    pub async fn pages(&self) -> Result<Vec<flotilla_api_types::page::TabInfo>, CdpError> {
        let targets = self.call("Target.getTargets", json!({})).await?;
        Ok(targets["targetInfos"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|info| info["type"] == "page")
            .map(tab_info)
            .collect())
    }

    /// Opens a blank tab; its target id.
    pub async fn open_blank(&self) -> Result<String, CdpError> {
        let created = self
            .call("Target.createTarget", json!({"url": "about:blank"}))
            .await?;
        Ok(created["targetId"].as_str().unwrap_or_default().to_owned())
    }

    pub async fn close(&self, id: &str) -> Result<(), CdpError> {
        self.call("Target.closeTarget", json!({"targetId": id}))
            .await
            .map(drop)
    }

    /// Brings tab `id` to the front.
    pub async fn activate(&self, id: &str) -> Result<(), CdpError> {
        self.call("Target.activateTarget", json!({"targetId": id}))
            .await
            .map(drop)
    }

    /// Tab `id`'s URL and title.
    pub async fn info(&self, id: &str) -> Result<flotilla_api_types::page::TabInfo, CdpError> {
        let info = self
            .call("Target.getTargetInfo", json!({"targetId": id}))
            .await?;
        Ok(tab_info(&info["targetInfo"]))
    }
}

fn tab_info(info: &Value) -> flotilla_api_types::page::TabInfo {
    let text = |name: &str| info[name].as_str().unwrap_or_default().to_owned();
    flotilla_api_types::page::TabInfo {
        id: text("targetId"),
        url: text("url"),
        title: text("title"),
    }
}

/// One page the agent drives, over a flat session of a browser connection.
pub struct Page<'a> {
    client: &'a CdpClient,
    session: &'a str,
    within: Within,
}

impl<'a> Page<'a> {
    pub fn new(client: &'a CdpClient, session: &'a str, within: Within) -> Self {
        Self {
            client,
            session,
            within,
        }
    }

    async fn call(&self, method: &str, params: Value) -> Result<Value, CdpError> {
        self.client
            .call(method, params, Some(self.session), self.within.remaining())
            .await
    }

    /// Turns on the page's events (a dialog already open is reported then).
    pub async fn enable(&self) -> Result<(), CdpError> {
        self.call("Page.enable", json!({})).await.map(drop)
    }

    /// Navigates to `url` and waits for its document's `until` event (a
    /// page that moves on before then is followed to where it went).
    pub async fn navigate(&self, url: &str, until: LoadedAt) -> Result<(), NavigateError> {
        self.call("Page.setLifecycleEventsEnabled", json!({"enabled": true}))
            .await?;
        let mut events = self.client.events();
        let navigated = self.call("Page.navigate", json!({"url": url})).await?;
        if let Some(reason) = navigated["errorText"].as_str().filter(|t| !t.is_empty()) {
            return Err(NavigateError::Refused(reason.to_owned()));
        }
        wait_loaded(&mut events, self.session, &navigated, until.event_name()).await?;
        Ok(())
    }

    /// Goes one page back in the tab's history; `false` when it has no
    /// earlier page.
    pub async fn back(&self) -> Result<bool, CdpError> {
        let history = self.call("Page.getNavigationHistory", json!({})).await?;
        let index = history["currentIndex"].as_i64().unwrap_or(0);
        if index < 1 {
            return Ok(false);
        }
        let entry = &history["entries"][(index - 1) as usize];
        self.call(
            "Page.navigateToHistoryEntry",
            json!({"entryId": entry["id"]}),
        )
        .await?;
        Ok(true)
    }

    /// Evaluates `expression` (awaiting a promise); the protocol's answer
    /// (`result`, or `exceptionDetails`). `by_value`: the result as JSON;
    /// `group`: the object group its objects are kept in.
    pub async fn evaluate(
        &self,
        expression: &str,
        by_value: bool,
        group: Option<&str>,
    ) -> Result<Value, CdpError> {
        let mut params = json!({"expression": expression, "awaitPromise": true});
        if by_value {
            params["returnByValue"] = json!(true);
        }
        if let Some(group) = group {
            params["objectGroup"] = json!(group);
        }
        self.call("Runtime.evaluate", params).await
    }

    /// `expression`'s value (by value, a promise awaited); a script that
    /// throws is a protocol error naming what it threw.
    pub async fn evaluate_value(&self, expression: &str) -> Result<Value, CdpError> {
        let answer = self.evaluate(expression, true, None).await?;
        if let Some(details) = answer.get("exceptionDetails") {
            return Err(CdpError::Protocol {
                method: "Runtime.evaluate".into(),
                message: exception_text(details),
            });
        }
        Ok(answer["result"]["value"].clone())
    }

    /// Evaluates `expression` with at most `within` for it.
    pub async fn evaluate_within(
        &self,
        expression: &str,
        within: Duration,
    ) -> Result<Value, CdpError> {
        let params = json!({"expression": expression, "awaitPromise": true});
        self.client
            .call("Runtime.evaluate", params, Some(self.session), within)
            .await
    }

    /// Calls `function` with `this` the page's object `object`; the
    /// protocol's answer, its result by value, a promise awaited when
    /// `awaited`.
    pub async fn call_function_on(
        &self,
        object: &Value,
        function: &str,
        arguments: Value,
        awaited: bool,
    ) -> Result<Value, CdpError> {
        let mut params = json!({
            "objectId": object,
            "functionDeclaration": function,
            "arguments": arguments,
            "returnByValue": true,
        });
        if awaited {
            params["awaitPromise"] = json!(true);
        }
        self.call("Runtime.callFunctionOn", params).await
    }

    /// Lets the page free the objects of `group`.
    pub async fn release_group(&self, group: &str) -> Result<(), CdpError> {
        self.call("Runtime.releaseObjectGroup", json!({"objectGroup": group}))
            .await
            .map(drop)
    }

    /// The page's whole accessibility tree (`nodes`).
    /// The id of the document the page shows now (its main frame's loader
    /// id: a new one with each document, the same across changes within one).
    pub async fn document_id(&self) -> Result<String, CdpError> {
        let tree = self.call("Page.getFrameTree", json!({})).await?;
        Ok(tree["frameTree"]["frame"]["loaderId"]
            .as_str()
            .unwrap_or_default()
            .to_owned())
    }

    pub async fn accessibility_tree(&self) -> Result<Value, CdpError> {
        self.call("Accessibility.getFullAXTree", json!({})).await
    }

    /// Scrolls DOM node `node` (a backend node id) into view.
    pub async fn scroll_into_view(&self, node: i64) -> Result<(), CdpError> {
        self.call("DOM.scrollIntoViewIfNeeded", json!({"backendNodeId": node}))
            .await
            .map(drop)
    }

    /// The boxes of DOM node `node` on the page (`quads`).
    pub async fn content_quads(&self, node: i64) -> Result<Value, CdpError> {
        self.call("DOM.getContentQuads", json!({"backendNodeId": node}))
            .await
    }

    /// The page's JavaScript object of DOM node `node` (its `objectId`).
    pub async fn object_of(&self, node: i64) -> Result<Value, CdpError> {
        let resolved = self
            .call("DOM.resolveNode", json!({"backendNodeId": node}))
            .await?;
        Ok(resolved["object"]["objectId"].clone())
    }

    /// Sets `files` (paths as the browser sees them) on file input `node`.
    pub async fn set_files(&self, node: i64, files: &[String]) -> Result<(), CdpError> {
        self.call(
            "DOM.setFileInputFiles",
            json!({"files": files, "backendNodeId": node}),
        )
        .await
        .map(drop)
    }

    /// One mouse event (`Input.dispatchMouseEvent`'s parameters).
    pub async fn mouse(&self, event: Value) -> Result<(), CdpError> {
        self.call("Input.dispatchMouseEvent", event).await.map(drop)
    }

    /// One key event (`Input.dispatchKeyEvent`'s parameters).
    pub async fn key(&self, event: Value) -> Result<(), CdpError> {
        self.call("Input.dispatchKeyEvent", event).await.map(drop)
    }

    /// Types `text` into the focused element, as one input.
    pub async fn insert_text(&self, text: &str) -> Result<(), CdpError> {
        self.call("Input.insertText", json!({"text": text}))
            .await
            .map(drop)
    }

    /// A screenshot (`Page.captureScreenshot`'s parameters): its base64 data.
    pub async fn screenshot(&self, params: Value) -> Result<Value, CdpError> {
        let shot = self.call("Page.captureScreenshot", params).await?;
        Ok(shot["data"].clone())
    }

    /// The page printed (`Page.printToPDF`'s parameters): its base64 data.
    pub async fn print_pdf(&self, params: Value) -> Result<Value, CdpError> {
        let printed = self.call("Page.printToPDF", params).await?;
        Ok(printed["data"].clone())
    }

    /// The page's size and its visible part (`cssContentSize`,
    /// `cssVisualViewport`).
    pub async fn layout_metrics(&self) -> Result<Value, CdpError> {
        self.call("Page.getLayoutMetrics", json!({})).await
    }

    /// Shows the page as on a screen of `width`×`height` CSS pixels at
    /// `scale` device pixels each.
    pub async fn emulate_viewport(
        &self,
        width: u32,
        height: u32,
        scale: f64,
    ) -> Result<(), CdpError> {
        let metrics = json!({
            "width": width, "height": height, "deviceScaleFactor": scale, "mobile": false,
        });
        self.call("Emulation.setDeviceMetricsOverride", metrics)
            .await
            .map(drop)
    }

    pub async fn set_user_agent(&self, user_agent: &str) -> Result<(), CdpError> {
        self.call(
            "Emulation.setUserAgentOverride",
            json!({"userAgent": user_agent}),
        )
        .await
        .map(drop)
    }

    /// Sets `cookies` (`Network.CookieParam`s) in the browser.
    pub async fn set_cookies(&self, cookies: Vec<Value>) -> Result<(), CdpError> {
        self.call("Network.setCookies", json!({"cookies": cookies}))
            .await
            .map(drop)
    }
}
