//! The state a browser does not keep on disk, over CDP: read while it still
//! runs ([`capture`]: every cookie, the tabs, the localStorage of their
//! origins) and put back into a started browser ([`restore`]).

use std::time::Duration;

use serde_json::{Value, json};

use super::{CDP_TIMEOUT, CapturedState, CapturedTab, OriginStorage, RestoreOptions};
use crate::browser::CdpEndpoint;
use crate::cdp::CdpClient;

/// Reads cookies, tabs and localStorage from a running browser.
pub async fn capture(endpoint: &CdpEndpoint) -> anyhow::Result<CapturedState> {
    let browser = CdpClient::browser(endpoint).await?;
    let cookies = browser
        .call("Storage.getCookies", json!({}), None, CDP_TIMEOUT)
        .await?;
    let cookies = cookies["cookies"].as_array().cloned().unwrap_or_default();
    let targets = browser
        .call("Target.getTargets", json!({}), None, CDP_TIMEOUT)
        .await?;
    let pages: Vec<(String, CapturedTab)> = targets["targetInfos"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|t| t["type"] == "page")
        .map(|t| {
            (
                t["targetId"].as_str().unwrap_or_default().to_owned(),
                CapturedTab {
                    url: t["url"].as_str().unwrap_or_default().to_owned(),
                    title: t["title"].as_str().unwrap_or_default().to_owned(),
                },
            )
        })
        .collect();
    let pages = in_use_order(endpoint, pages).await;
    let mut local_storage: Vec<OriginStorage> = Vec::new();
    for (target_id, tab) in &pages {
        if !(tab.url.starts_with("http://") || tab.url.starts_with("https://")) {
            continue;
        }
        let Some(session) = attach(&browser, &json!(target_id)).await else {
            continue;
        };
        let read = evaluate(
            &browser,
            &session,
            "JSON.stringify([location.origin, Object.entries(localStorage)])",
        )
        .await;
        detach(&browser, session).await;
        let Some(text) = read else {
            continue;
        };
        if let Ok((origin, items)) = serde_json::from_str::<(String, Vec<(String, String)>)>(&text)
            && !local_storage.iter().any(|o| o.origin == origin)
        {
            local_storage.push(OriginStorage { origin, items });
        }
    }
    Ok(CapturedState {
        cookies,
        tabs: pages.into_iter().map(|(_, tab)| tab).collect(),
        local_storage,
    })
}

/// `pages` (by target id) in the order a client sees them: the browser's
/// `/json/list`, most recently used first (`Target.getTargets` keeps no
/// order a client knows). As they are when that list cannot be read.
async fn in_use_order(
    endpoint: &CdpEndpoint,
    mut pages: Vec<(String, CapturedTab)>,
) -> Vec<(String, CapturedTab)> {
    let listed = match CdpClient::http_get(endpoint, "/json/list").await {
        Ok(body) => serde_json::from_slice::<Vec<Value>>(&body).unwrap_or_default(),
        Err(error) => {
            tracing::debug!(%error, "cannot read the order of the tabs");
            return pages;
        }
    };
    let rank = |id: &str| {
        listed
            .iter()
            .position(|target| target["id"] == id)
            .unwrap_or(usize::MAX)
    };
    pages.sort_by_key(|(id, _)| rank(id));
    pages
}

/// Puts the captured state back into a freshly started browser: every cookie
/// (session cookies are not in the profile), the captured `localStorage`
/// (before any tab loads), and for a full restore every tab at its URL, in
/// its order (the initial blank tab is closed then).
pub async fn restore(
    endpoint: &CdpEndpoint,
    state: &CapturedState,
    options: RestoreOptions,
) -> anyhow::Result<()> {
    let browser = CdpClient::browser(endpoint).await?;
    let cookies: Vec<Value> = state.cookies.iter().map(cookie_param).collect();
    if !cookies.is_empty() {
        browser
            .call(
                "Storage.setCookies",
                json!({"cookies": cookies}),
                None,
                CDP_TIMEOUT,
            )
            .await?;
    }
    // The profile normally has it all: a failed write-back is worth a warning,
    // not a failed revive.
    if let Err(error) =
        refill_local_storage(&browser, &state.local_storage, options.service_workers).await
    {
        tracing::warn!(%error, "cannot write the captured localStorage back");
    }
    if options.reopen_tabs {
        let urls: Vec<&str> = state
            .tabs
            .iter()
            .map(|t| t.url.as_str())
            .filter(|u| !u.is_empty() && *u != "about:blank")
            .collect();
        if !urls.is_empty() {
            // The tab opened last is the most recently used: the captured
            // order (most recently used first) is opened from its end.
            // Sent at once: the browser takes them in order, and the tabs
            // start at the same time instead of one after the other.
            let created = futures_util::future::try_join_all(urls.iter().rev().map(|url| {
                browser.call(
                    "Target.createTarget",
                    json!({"url": url}),
                    None,
                    CDP_TIMEOUT,
                )
            }))
            .await?;
            let reopened: Vec<Value> = created
                .iter()
                .map(|created| created["targetId"].clone())
                .collect();
            // The fresh browser's own first tab, whatever its URL reads yet.
            close_pages(&browser, |id| !reopened.contains(id)).await?;
        }
    }
    Ok(())
}

/// Closes the pages `doomed` selects (by target id) and checks they are gone,
/// for 3 s at most: closing is asynchronous.
pub(super) async fn close_pages(
    browser: &CdpClient,
    doomed: impl Fn(&Value) -> bool,
) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
    loop {
        let targets = browser
            .call("Target.getTargets", json!({}), None, CDP_TIMEOUT)
            .await?;
        let extra: Vec<Value> = targets["targetInfos"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|t| t["type"] == "page" && doomed(&t["targetId"]))
            .map(|t| t["targetId"].clone())
            .collect();
        if extra.is_empty() || tokio::time::Instant::now() >= deadline {
            return Ok(());
        }
        for target_id in extra {
            close_target(browser, &target_id).await;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

pub(super) async fn close_target(browser: &CdpClient, target_id: &Value) {
    let _ = browser
        .call(
            "Target.closeTarget",
            json!({"targetId": target_id}),
            None,
            CDP_TIMEOUT,
        )
        .await;
}

/// The document a scratch tab gets for each origin: nothing reaches the site.
pub(super) const EMPTY_DOCUMENT: &str = "<!doctype html><title></title>";

/// Writes the captured `localStorage` items back, origin by origin, in a
/// scratch tab whose requests never leave the browser: each navigation to an
/// origin is answered with an empty document (CDP `Fetch`), so the site sees
/// no request and no page script runs. Captured values win over the
/// profile's: the capture read them in the live page at park time, while the
/// profile can miss writes still on their way to disk when the browser closed.
/// Keys only the profile has are kept.
pub(super) async fn refill_local_storage(
    browser: &CdpClient,
    captured: &[OriginStorage],
    service_workers: bool,
) -> anyhow::Result<()> {
    let origins: Vec<&OriginStorage> = captured
        .iter()
        .filter(|o| {
            !o.items.is_empty()
                && (o.origin.starts_with("http://") || o.origin.starts_with("https://"))
        })
        .collect();
    if origins.is_empty() {
        return Ok(());
    }
    let created = browser
        .call(
            "Target.createTarget",
            json!({"url": "about:blank", "background": true}),
            None,
            CDP_TIMEOUT,
        )
        .await?;
    let target_id = created["targetId"].clone();
    let filled = async {
        let session = attach(browser, &target_id)
            .await
            .ok_or_else(|| anyhow::anyhow!("cannot attach to the scratch tab"))?;
        let mut events = browser.events();
        let bypass = [
            ("Network.enable", json!({})),
            ("Network.setBypassServiceWorker", json!({"bypass": true})),
        ];
        let intercept = ("Fetch.enable", json!({"patterns": [{"urlPattern": "*"}]}));
        let calls = match service_workers {
            true => bypass.into_iter().chain([intercept]).collect::<Vec<_>>(),
            false => vec![intercept],
        };
        for (method, params) in calls {
            browser
                .call(method, params, Some(&session), CDP_TIMEOUT)
                .await?;
        }
        for origin in origins {
            let url = format!("{}/", origin.origin);
            let navigate = browser.navigate(&session, &url, CDP_TIMEOUT);
            let answer = answer_paused_requests(browser, &mut events, &session);
            let navigated = tokio::select! {
                navigated = navigate => navigated?,
                () = answer => anyhow::bail!("CDP connection closed"),
            };
            if let Some(error) = navigated["errorText"].as_str() {
                tracing::warn!(origin = %origin.origin, error, "cannot open a scratch page to restore localStorage");
                continue;
            }
            let items = serde_json::to_string(&origin.items)?;
            let script = format!(
                "location.origin === {origin} ? ({items}.forEach(([k, v]) => localStorage.setItem(k, v)), 'done') : location.origin",
                origin = serde_json::to_string(&origin.origin)?,
            );
            // The navigation may answer before its document is in place.
            let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
            loop {
                let written = evaluate(browser, &session, &script).await;
                if written.as_deref() == Some("done") {
                    break;
                }
                if tokio::time::Instant::now() >= deadline {
                    tracing::warn!(origin = %origin.origin, ?written, "localStorage not restored");
                    break;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        Ok(())
    }
    .await;
    // Gone before the instance is handed over: it must not show in its tabs.
    close_pages(browser, |id| *id == target_id).await?;
    filled
}

/// Answers every request the scratch tab makes with [`EMPTY_DOCUMENT`];
/// returns only when the connection closes.
pub(super) async fn answer_paused_requests(
    browser: &CdpClient,
    events: &mut tokio::sync::broadcast::Receiver<crate::cdp::CdpEvent>,
    session: &str,
) {
    use base64::Engine;
    use tokio::sync::broadcast::error::RecvError;
    let body = base64::engine::general_purpose::STANDARD.encode(EMPTY_DOCUMENT);
    loop {
        let event = match events.recv().await {
            Ok(event) => event,
            Err(RecvError::Lagged(_)) => continue,
            Err(RecvError::Closed) => return,
        };
        if event.method != "Fetch.requestPaused" || event.session_id.as_deref() != Some(session) {
            continue;
        }
        let _ = browser
            .call(
                "Fetch.fulfillRequest",
                json!({
                    "requestId": event.params["requestId"],
                    "responseCode": 200,
                    "responseHeaders": [{"name": "Content-Type", "value": "text/html"}],
                    "body": body,
                }),
                Some(session),
                CDP_TIMEOUT,
            )
            .await;
    }
}

/// A flat CDP session on a target.
pub(super) async fn attach(browser: &CdpClient, target_id: &Value) -> Option<String> {
    let attached = browser
        .call(
            "Target.attachToTarget",
            json!({"targetId": target_id, "flatten": true}),
            None,
            CDP_TIMEOUT,
        )
        .await
        .ok()?;
    attached["sessionId"].as_str().map(str::to_owned)
}

pub(super) async fn detach(browser: &CdpClient, session: String) {
    let _ = browser
        .call(
            "Target.detachFromTarget",
            json!({"sessionId": session}),
            None,
            CDP_TIMEOUT,
        )
        .await;
}

/// Evaluates `expression` in a session's page; its value when it is a string.
pub(super) async fn evaluate(
    browser: &CdpClient,
    session: &str,
    expression: &str,
) -> Option<String> {
    let result = browser
        .call(
            "Runtime.evaluate",
            json!({"expression": expression, "returnByValue": true}),
            Some(session),
            CDP_TIMEOUT,
        )
        .await
        .ok()?;
    result["result"]["value"].as_str().map(str::to_owned)
}

/// A `Network.Cookie` as a `Network.CookieParam`.
pub(super) fn cookie_param(cookie: &Value) -> Value {
    let mut param = serde_json::Map::new();
    for key in [
        "name",
        "value",
        "domain",
        "path",
        "secure",
        "httpOnly",
        "sameSite",
        "priority",
        "sourceScheme",
        "sourcePort",
        "partitionKey",
    ] {
        if let Some(value) = cookie.get(key) {
            param.insert(key.to_owned(), value.clone());
        }
    }
    let session = cookie
        .get("session")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    if !session && let Some(expires) = cookie.get("expires") {
        param.insert("expires".into(), expires.clone());
    }
    Value::Object(param)
}
