//! The page layer over the DevTools protocol: what the agent does with a
//! browser's pages, for every caller (MCP's steps, REST actions, the
//! instance's HTTP port, launches). Listing the tabs ([`list_tabs`]),
//! waiting for a navigation's lifecycle event ([`wait_loaded`]), dismissing
//! dialogs ([`dismiss_dialogs`]), following the console ([`ConsoleLog`]),
//! and a protocol failure in words fit for a client ([`describe`]).

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
