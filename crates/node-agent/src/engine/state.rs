//! The state a browser does not keep on disk, over CDP: read while it still
//! runs ([`capture`]: every cookie, the tabs with their history,
//! sessionStorage and scroll position, the localStorage of their origins)
//! and put back into a started browser ([`restore`]).

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

/// How long one DevTools call of a capture or a restore may take.
const CDP_TIMEOUT: Duration = Duration::from_secs(10);

use crate::engine::browser::CdpEndpoint;
use crate::engine::cdp::CdpClient;
use crate::engine::page::{load_event, main_frame_committed, page_event};
use crate::snapshot::{CapturedState, CapturedTab, HistoryEntry, OriginStorage, RestoreOptions};

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
    let mut pages = in_use_order(endpoint, page_tabs(&targets)).await;
    let mut local_storage: Vec<OriginStorage> = Vec::new();
    for (target_id, tab) in &mut pages {
        if is_web_url(&tab.url) {
            read_tab(&browser, target_id, tab, &mut local_storage).await;
        }
    }
    Ok(CapturedState {
        cookies,
        tabs: pages.into_iter().map(|(_, tab)| tab).collect(),
        local_storage,
    })
}

/// The page targets of a `Target.getTargets` answer, with their URL and title.
fn page_tabs(targets: &Value) -> Vec<(String, CapturedTab)> {
    targets["targetInfos"]
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
                    ..CapturedTab::default()
                },
            )
        })
        .collect()
}

/// Reads one tab's history, sessionStorage and scroll into `tab`, and its
/// origin's localStorage into `local_storage` (once per origin).
async fn read_tab(
    browser: &CdpClient,
    target_id: &str,
    tab: &mut CapturedTab,
    local_storage: &mut Vec<OriginStorage>,
) {
    let Some(session) = attach(browser, &json!(target_id)).await else {
        return;
    };
    let history = browser
        .call(
            "Page.getNavigationHistory",
            json!({}),
            Some(&session),
            CDP_TIMEOUT,
        )
        .await
        .ok();
    let read = evaluate(
        browser,
        &session,
        "JSON.stringify([location.origin, Object.entries(localStorage), \
         Object.entries(sessionStorage), [scrollX, scrollY]])",
    )
    .await;
    detach(browser, session).await;
    // What the page answers is the page's word: taken only for the
    // origin the browser shows it at (a page could name another origin
    // to have its storage replaced), and with a history that ends where
    // the tab is (it may have moved on meanwhile).
    let history = history.as_ref().map(web_history).unwrap_or_default();
    if history.last().is_some_and(|entry| entry.url == tab.url) {
        tab.history = history;
    }
    let Some(text) = read else {
        return;
    };
    type Read = (
        String,
        Vec<(String, String)>,
        Vec<(String, String)>,
        [f64; 2],
    );
    let shown_origin = url::Url::parse(&tab.url)
        .ok()
        .map(|url| url.origin().ascii_serialization());
    match serde_json::from_str::<Read>(&text) {
        Ok((origin, items, session_items, scroll)) if shown_origin.as_ref() == Some(&origin) => {
            tab.session_storage = session_items;
            tab.scroll = scroll;
            if !local_storage.iter().any(|o| o.origin == origin) {
                local_storage.push(OriginStorage { origin, items });
            }
        }
        _ => tracing::warn!(
            url = tab.url,
            "a tab's page did not answer for its own origin; its storage is left to the profile's files"
        ),
    }
}

fn is_web_url(url: &str) -> bool {
    url.starts_with("http://") || url.starts_with("https://")
}

/// The pages of a `Page.getNavigationHistory` answer up to the current one,
/// from the first of the web pages that lead to it without a break (an
/// `about:`, `data:` or `file:` page ends what can be rebuilt); empty when
/// the current page is not a web page.
fn web_history(history: &Value) -> Vec<HistoryEntry> {
    let entries = history["entries"].as_array().cloned().unwrap_or_default();
    let current = history["currentIndex"].as_u64().unwrap_or(0) as usize;
    let Some(upto) = entries.get(..=current) else {
        return Vec::new();
    };
    let mut kept: Vec<HistoryEntry> = upto
        .iter()
        .rev()
        .take_while(|entry| entry["url"].as_str().is_some_and(is_web_url))
        .map(|entry| HistoryEntry {
            url: entry["url"].as_str().unwrap_or_default().to_owned(),
            title: entry["title"].as_str().unwrap_or_default().to_owned(),
        })
        .collect();
    kept.reverse();
    kept
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
/// (session cookies are not in the profile), the captured `localStorage`,
/// and for a full restore every tab at its URL, in its order (the initial
/// blank tab is closed then). The tabs are opened while the localStorage is
/// written, their requests held until it is (see [`refill_local_storage`]).
pub async fn restore(
    endpoint: &CdpEndpoint,
    state: &CapturedState,
    options: RestoreOptions,
) -> anyhow::Result<()> {
    let began = std::time::Instant::now();
    let browser = Arc::new(CdpClient::browser(endpoint).await?);
    // The tab opened last is the most recently used: the captured order
    // (most recently used first) is opened from its end.
    let tabs: Vec<&CapturedTab> = match options.reopen_tabs {
        true => state
            .tabs
            .iter()
            .filter(|t| !t.url.is_empty() && t.url != "about:blank")
            .rev()
            .collect(),
        false => Vec::new(),
    };
    let (holding, tabs_may_open) = tokio::sync::oneshot::channel();
    let refill = refill_local_storage(
        endpoint,
        &state.local_storage,
        options.service_workers,
        holding,
    );
    let open_tabs = async {
        set_cookies(&browser, &state.cookies).await?;
        // Sent or dropped: the tabs' requests wait, or the refill is over.
        let _ = tabs_may_open.await;
        open_tabs(&browser, &tabs).await
    };
    let (refilled, reopened) = tokio::join!(refill, open_tabs);
    // The profile normally has it all: a failed write-back is worth a warning,
    // not a failed revive.
    if let Err(error) = refilled {
        tracing::warn!(%error, "cannot write the captured localStorage back");
    }
    let reopened = reopened?;
    tracing::debug!(
        elapsed_ms = began.elapsed().as_millis() as u64,
        "cookies, localStorage and tabs back"
    );
    if tabs.is_empty() {
        return Ok(());
    }
    let rebuilds = tabs
        .iter()
        .zip(&reopened)
        .filter(|(tab, _)| tab.needs_rebuilding())
        .map(|(tab, target_id)| {
            rebuild_tab(browser.clone(), target_id, tab, options.service_workers)
        });
    futures_util::future::join_all(rebuilds).await;
    // The fresh browser's own first tab, whatever its URL reads yet.
    close_pages(&browser, |id| !reopened.contains(id)).await
}

async fn set_cookies(browser: &CdpClient, cookies: &[Value]) -> anyhow::Result<()> {
    if cookies.is_empty() {
        return Ok(());
    }
    let cookies: Vec<Value> = cookies.iter().map(cookie_param).collect();
    browser
        .call(
            "Storage.setCookies",
            json!({"cookies": cookies}),
            None,
            CDP_TIMEOUT,
        )
        .await?;
    Ok(())
}

/// Opens `tabs` (sent at once: the browser takes them in order, and they
/// start at the same time); a tab with more than its URL to bring back
/// starts blank, to be rebuilt. Answers their target ids.
async fn open_tabs(browser: &CdpClient, tabs: &[&CapturedTab]) -> anyhow::Result<Vec<Value>> {
    let created = futures_util::future::try_join_all(tabs.iter().map(|tab| {
        let url = match tab.needs_rebuilding() {
            true => "about:blank",
            false => tab.url.as_str(),
        };
        browser.call(
            "Target.createTarget",
            json!({"url": url}),
            None,
            CDP_TIMEOUT,
        )
    }))
    .await?;
    Ok(created
        .iter()
        .map(|created| created["targetId"].clone())
        .collect())
}

/// How long a rebuilt tab's page may take to load before its scroll
/// position is set anyway (when it is still on that page).
const SCROLL_AFTER_LOAD_WITHIN: Duration = Duration::from_secs(10);

/// Brings a blank tab to what `tab` was: its history (each earlier page an
/// empty document with its title, which no site sees; going back loads the
/// real page: the document is never stored, and reloads itself if the
/// back-forward cache shows it again), its `sessionStorage`, then
/// its current page loaded for real and scrolled where it was once loaded.
/// A tab whose history cannot be rebuilt is opened at its URL instead.
async fn rebuild_tab(
    browser: Arc<CdpClient>,
    target_id: &Value,
    tab: &CapturedTab,
    service_workers: bool,
) {
    let Some(session) = attach(&browser, target_id).await else {
        tracing::warn!(
            url = tab.url,
            "cannot attach to a reopened tab to rebuild it"
        );
        return;
    };
    let loading = match replay_history(&browser, &session, tab, service_workers).await {
        Ok(loading) => loading,
        Err(error) => {
            tracing::warn!(url = tab.url, %error, "cannot rebuild a tab's history; it opens at its URL");
            let _ = browser
                .call("Fetch.disable", json!({}), Some(&session), CDP_TIMEOUT)
                .await;
            let loading = browser.events();
            let _ = browser.navigate(&session, &tab.url, CDP_TIMEOUT).await;
            loading
        }
    };
    if tab.scroll == [0.0, 0.0] {
        detach(&browser, session).await;
        return;
    }
    // Not waited for: the instance is handed over while its pages load. It
    // ends with the browser's connection at the latest.
    let (url, [x, y]) = (
        serde_json::to_string(&tab.url).unwrap_or_default(),
        tab.scroll,
    );
    tokio::spawn(async move {
        let _ = tokio::time::timeout(
            SCROLL_AFTER_LOAD_WITHIN,
            page_event(loading, &session, load_event),
        )
        .await;
        // Only the page it was on: a client may have moved on meanwhile.
        let scroll = format!("location.href === {url} && window.scrollTo({x}, {y}); 'done'");
        evaluate(&browser, &session, &scroll).await;
        detach(&browser, session).await;
    });
}

/// How long a rebuilt tab's reload may take to commit before the instance
/// is handed over all the same.
const RELOAD_COMMITS_WITHIN: Duration = Duration::from_secs(5);

/// Navigates the tab behind `session` through `tab`'s history with every
/// request answered by the agent (service workers bypassed where the
/// profile may hold some), puts its `sessionStorage` back on its current
/// page, then reloads that page from the site and waits for it to commit;
/// answers the events subscribed to just before that reload.
async fn replay_history(
    browser: &CdpClient,
    session: &str,
    tab: &CapturedTab,
    service_workers: bool,
) -> anyhow::Result<tokio::sync::broadcast::Receiver<crate::engine::cdp::CdpEvent>> {
    let mut events = browser.events();
    let current = HistoryEntry {
        url: tab.url.clone(),
        title: tab.title.clone(),
    };
    let history = match tab.history.as_slice() {
        [] => std::slice::from_ref(&current),
        history => history,
    };
    let mut calls = vec![("Page.enable", json!({}))];
    if service_workers {
        calls.push(("Network.enable", json!({})));
        calls.push(("Network.setBypassServiceWorker", json!({"bypass": true})));
    }
    calls.push(("Fetch.enable", json!({"patterns": [{"urlPattern": "*"}]})));
    for (method, params) in calls {
        browser
            .call(method, params, Some(session), CDP_TIMEOUT)
            .await?;
    }
    for (index, entry) in history.iter().enumerate() {
        open_stand_in(browser, &mut events, session, (entry, history)).await?;
        if index == 0 {
            // The blank page the tab was created on is not part of it.
            browser
                .call(
                    "Page.resetNavigationHistory",
                    json!({}),
                    Some(session),
                    CDP_TIMEOUT,
                )
                .await?;
        }
    }
    if !tab.session_storage.is_empty() {
        let items = serde_json::to_string(&tab.session_storage)?;
        let script = format!("{items}.forEach(([k, v]) => sessionStorage.setItem(k, v)); 'done'");
        if evaluate(browser, session, &script).await.as_deref() != Some("done") {
            anyhow::bail!("sessionStorage not restored");
        }
    }
    browser
        .call("Fetch.disable", json!({}), Some(session), CDP_TIMEOUT)
        .await?;
    if service_workers {
        let params = json!({"bypass": false});
        browser
            .call(
                "Network.setBypassServiceWorker",
                params,
                Some(session),
                CDP_TIMEOUT,
            )
            .await?;
    }
    reload_from_site(browser, session, tab).await
}

/// Opens `entry` of `history` in the tab behind `session`, its every request
/// answered by the agent with a stand-in document bearing its title, and
/// waits until the tab shows it.
async fn open_stand_in(
    browser: &CdpClient,
    events: &mut tokio::sync::broadcast::Receiver<crate::engine::cdp::CdpEvent>,
    session: &str,
    (entry, history): (&HistoryEntry, &[HistoryEntry]),
) -> anyhow::Result<()> {
    let document_for = |url: &str| {
        let title = history
            .iter()
            .find(|entry| entry.url == url)
            .map(|entry| html_escape(&entry.title))
            .unwrap_or_default();
        // Kept by the back-forward cache all the same, it reloads from the
        // site when shown again.
        format!(
            "<!doctype html><title>{title}</title>\
             <script>addEventListener('pageshow', (e) => e.persisted && location.reload())</script>"
        )
    };
    let navigate = browser.navigate(session, &entry.url, CDP_TIMEOUT);
    let answer = answer_paused_requests(browser, events, session, document_for);
    let navigated = tokio::select! {
        navigated = navigate => navigated?,
        () = answer => anyhow::bail!("CDP connection closed"),
    };
    if let Some(error) = navigated["errorText"].as_str() {
        anyhow::bail!("cannot open {}: {error}", entry.url);
    }
    // The navigation may answer before its document is in place.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while evaluate(browser, session, "location.href").await.as_deref() != Some(&entry.url) {
        if tokio::time::Instant::now() >= deadline {
            anyhow::bail!("{} did not open", entry.url);
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(())
}

/// Reloads the tab's current page from the site and waits (a while) for it
/// to commit, so that a client listing the tabs once the instance runs sees
/// its URL; answers the events subscribed to just before the reload.
async fn reload_from_site(
    browser: &CdpClient,
    session: &str,
    tab: &CapturedTab,
) -> anyhow::Result<tokio::sync::broadcast::Receiver<crate::engine::cdp::CdpEvent>> {
    let (loading, committing) = (browser.events(), browser.events());
    browser
        .call("Page.reload", json!({}), Some(session), CDP_TIMEOUT)
        .await?;
    let committed = page_event(committing, session, main_frame_committed);
    if tokio::time::timeout(RELOAD_COMMITS_WITHIN, committed)
        .await
        .is_err()
    {
        tracing::warn!(url = tab.url, "a rebuilt tab's page did not commit in time");
    }
    Ok(loading)
}

/// `text` safe inside an HTML element.
fn html_escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Closes the pages `doomed` selects (by target id) and checks they are gone,
/// for 3 s at most: closing is asynchronous.
pub(crate) async fn close_pages(
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

pub(crate) async fn close_target(browser: &CdpClient, target_id: &Value) {
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
const EMPTY_DOCUMENT: &str = "<!doctype html><title></title>";

/// The most origins whose captured localStorage is written back (each takes a
/// scratch page); the profile's files still hold the others'.
const MAX_ORIGINS_WRITTEN_BACK: usize = 64;

/// How long the whole write-back may take (and hold the browser's other
/// requests).
const WRITE_BACK_WITHIN: Duration = Duration::from_secs(15);

/// `origin` as a page's `location.origin` reads: `http(s)://host[:port]`,
/// nothing more (a tampered snapshot could name anything).
fn is_web_origin(origin: &str) -> bool {
    url::Url::parse(origin).is_ok_and(|url| {
        matches!(url.scheme(), "http" | "https") && url.origin().ascii_serialization() == origin
    })
}

/// Writes the captured `localStorage` items back in scratch tabs whose
/// requests never leave the browser: each tab's document is answered with
/// an empty one (CDP `Fetch`), so the site sees no request and no page
/// script runs. Captured values win over the profile's: the capture read
/// them in the live page at park time, while the profile can miss writes
/// still on their way to disk when the browser closed. Keys only the
/// profile has are kept. On a connection of its own: whatever it leaves
/// enabled ends with it. `holding` is sent once every other request waits
/// for the write-back (the pages opened from then on load after it), or
/// dropped when the write-back is over.
pub(crate) async fn refill_local_storage(
    endpoint: &CdpEndpoint,
    captured: &[OriginStorage],
    service_workers: bool,
    holding: tokio::sync::oneshot::Sender<()>,
) -> anyhow::Result<()> {
    let mut origins: Vec<&OriginStorage> = Vec::new();
    for origin in captured {
        if origin.items.is_empty() || origins.iter().any(|o| o.origin == origin.origin) {
            continue;
        }
        if !is_web_origin(&origin.origin) {
            tracing::warn!(origin = %origin.origin, "not an origin a page can have; its localStorage is not written back");
            continue;
        }
        if origins.len() == MAX_ORIGINS_WRITTEN_BACK {
            tracing::warn!(
                max = MAX_ORIGINS_WRITTEN_BACK,
                "more origins with localStorage than are written back; the profile keeps the others'"
            );
            break;
        }
        origins.push(origin);
    }
    if origins.is_empty() {
        return Ok(());
    }
    let browser = CdpClient::browser(endpoint).await?;
    match service_workers {
        true => {
            let refilled = refill_in_one_tab_bypassing_service_workers(&browser, &origins).await;
            drop(holding);
            refilled
        }
        false => refill_in_a_tab_per_origin(&browser, &origins, holding).await,
    }
}

/// How many scratch tabs (each a renderer) the write-back keeps open at
/// once: a browser with tabs on many sites is not made to start as many
/// renderers at the same time.
const SCRATCH_TABS_AT_ONCE: usize = 4;

/// One scratch tab per origin, opened directly at its origin (a few at
/// once), its document answered by interception on the browser's own
/// session (a page session could only intercept once the tab exists, and
/// would cost a navigation more). Every other request (a reopened tab's, an
/// extension's) waits until all the items are written. Not where the
/// profile may hold service workers: one would answer the tab's navigation
/// before any interception.
async fn refill_in_a_tab_per_origin(
    browser: &CdpClient,
    origins: &[&OriginStorage],
    holding: tokio::sync::oneshot::Sender<()>,
) -> anyhow::Result<()> {
    let mut events = browser.events();
    let intercept = json!({"patterns": [{"urlPattern": "*"}]});
    browser
        .call("Fetch.enable", intercept, None, CDP_TIMEOUT)
        .await?;
    let _ = holding.send(());
    let (scratch, scratch_tabs) = tokio::sync::watch::channel(Vec::new());
    let (release, released) = tokio::sync::watch::channel(false);
    let room = tokio::sync::Semaphore::new(SCRATCH_TABS_AT_ONCE);
    let refills = origins.iter().map(|&origin| {
        let (scratch, room) = (&scratch, &room);
        let url = format!("{}/", origin.origin);
        async move {
            let _room = room.acquire().await?;
            let params = json!({"url": url, "background": true});
            let created = browser
                .call("Target.createTarget", params, None, CDP_TIMEOUT)
                .await?;
            let target_id = match created["targetId"].as_str() {
                Some(id) => Value::from(id),
                None => anyhow::bail!("createTarget answered no target id: {created}"),
            };
            scratch.send_modify(|tabs| tabs.push(target_id.clone()));
            match attach(browser, &target_id).await {
                Some(session) => write_local_storage(browser, &session, origin).await,
                None => {
                    tracing::warn!(origin = %origin.origin, "cannot attach to a scratch tab to restore localStorage")
                }
            }
            // Gone before the instance is handed over: it must not show in its tabs.
            close_pages(browser, |id| *id == target_id).await
        }
    });
    let work = async {
        let refills = futures_util::future::join_all(refills);
        let refilled = tokio::time::timeout(WRITE_BACK_WITHIN, refills).await;
        let _ = release.send(true);
        if refilled.is_err() {
            // Whatever was still open must not show in the instance's tabs.
            let left = scratch.borrow().clone();
            close_pages(browser, |id| left.contains(id)).await?;
        }
        browser
            .call("Fetch.disable", json!({}), None, CDP_TIMEOUT)
            .await?;
        let Ok(refilled) = refilled else {
            anyhow::bail!("the write-back took more than {WRITE_BACK_WITHIN:?}");
        };
        refilled.into_iter().collect::<anyhow::Result<Vec<()>>>()?;
        Ok(())
    };
    let answer = answer_scratch_requests(browser, &mut events, scratch_tabs, released);
    tokio::select! {
        done = work => done,
        () = answer => anyhow::bail!("CDP connection closed"),
    }
}

/// Answers the requests paused on the browser's session: a scratch tab's
/// (its main frame's id is the tab's target id, which may be known only
/// after its request paused) with an empty document, anyone else's by
/// letting it go on once `released`; returns only when the connection
/// closes.
async fn answer_scratch_requests(
    browser: &CdpClient,
    events: &mut tokio::sync::broadcast::Receiver<crate::engine::cdp::CdpEvent>,
    mut scratch_tabs: tokio::sync::watch::Receiver<Vec<Value>>,
    mut released: tokio::sync::watch::Receiver<bool>,
) {
    use tokio::sync::broadcast::error::RecvError;
    // Sent without waiting for the answers: the events keep being read.
    let answer_scratch = |request_id: Value| async move {
        let answer = fulfilled(&request_id, EMPTY_DOCUMENT);
        let _ = browser.send_in("Fetch.fulfillRequest", answer, None).await;
    };
    let go_on = |request_id: Value| async move {
        let params = json!({"requestId": request_id});
        let _ = browser.send_in("Fetch.continueRequest", params, None).await;
    };
    // Paused requests not answered yet: (request id, frame id).
    let mut held: Vec<(Value, Value)> = Vec::new();
    loop {
        // Checked on every turn: the release may come while answering.
        if *released.borrow() && !held.is_empty() {
            let tabs = scratch_tabs.borrow().clone();
            for (request_id, frame) in std::mem::take(&mut held) {
                match tabs.contains(&frame) {
                    true => answer_scratch(request_id).await,
                    false => go_on(request_id).await,
                }
            }
        }
        let event = tokio::select! {
            event = events.recv() => event,
            Ok(()) = scratch_tabs.changed() => {
                let tabs = scratch_tabs.borrow_and_update().clone();
                let (theirs, others) = std::mem::take(&mut held)
                    .into_iter()
                    .partition(|(_, frame)| tabs.contains(frame));
                held = others;
                for (request_id, _) in theirs {
                    answer_scratch(request_id).await;
                }
                continue;
            }
            Ok(()) = released.changed() => continue,
        };
        let event = match event {
            Ok(event) => event,
            Err(RecvError::Lagged(_)) => continue,
            Err(RecvError::Closed) => return,
        };
        if event.method != "Fetch.requestPaused" || event.session_id.is_some() {
            continue;
        }
        let request_id = event.params["requestId"].clone();
        let frame = event.params["frameId"].clone();
        if scratch_tabs.borrow().contains(&frame) {
            answer_scratch(request_id).await;
        } else if *released.borrow() {
            go_on(request_id).await;
        } else {
            held.push((request_id, frame));
        }
    }
}

/// One scratch tab for every origin in turn, with service workers bypassed.
async fn refill_in_one_tab_bypassing_service_workers(
    browser: &CdpClient,
    origins: &[&OriginStorage],
) -> anyhow::Result<()> {
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
        let empty = |_: &str| EMPTY_DOCUMENT.to_owned();
        let calls = [
            ("Network.enable", json!({})),
            ("Network.setBypassServiceWorker", json!({"bypass": true})),
            ("Fetch.enable", json!({"patterns": [{"urlPattern": "*"}]})),
        ];
        for (method, params) in calls {
            browser
                .call(method, params, Some(&session), CDP_TIMEOUT)
                .await?;
        }
        for origin in origins {
            let url = format!("{}/", origin.origin);
            let navigate = browser.navigate(&session, &url, CDP_TIMEOUT);
            let answer = answer_paused_requests(browser, &mut events, &session, empty);
            let navigated = tokio::select! {
                navigated = navigate => navigated?,
                () = answer => anyhow::bail!("CDP connection closed"),
            };
            if let Some(error) = navigated["errorText"].as_str() {
                tracing::warn!(origin = %origin.origin, error, "cannot open a scratch page to restore localStorage");
                continue;
            }
            write_local_storage(browser, &session, origin).await;
        }
        Ok(())
    };
    // Bounded like the other way: origins whose pages never open must not
    // hold the revive for each one's timeouts in turn.
    let filled = tokio::time::timeout(WRITE_BACK_WITHIN, filled).await;
    // Gone before the instance is handed over: it must not show in its tabs.
    close_pages(browser, |id| *id == target_id).await?;
    filled.map_err(|_| anyhow::anyhow!("the write-back took more than {WRITE_BACK_WITHIN:?}"))?
}

/// Sets `origin`'s captured items in the scratch page behind `session`,
/// once that page's document is the origin's (a navigation may answer
/// before it is in place; within 5 s), and returns once the browser's
/// storage holds them: the page's own renderer keeps a copy of the items
/// and sends them on to the browser's storage service by a channel of its
/// own, so a tab closed as soon as the script returned could lose what was
/// still on its way (seen with a 2 MB item on a loaded machine). The
/// storage service tells every other window of the origin in that renderer
/// of each change it applied, in order: a blank frame in the page listens
/// for the last changed item's `storage` event. A failure (the origin's
/// quota, say) is logged.
async fn write_local_storage(browser: &CdpClient, session: &str, origin: &OriginStorage) {
    let (Ok(items), Ok(name)) = (
        serde_json::to_string(&origin.items),
        serde_json::to_string(&origin.origin),
    ) else {
        return;
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let shown = evaluate(browser, session, "location.origin").await;
        if shown.as_deref() == Some(origin.origin.as_str()) {
            break;
        }
        if tokio::time::Instant::now() >= deadline {
            tracing::warn!(origin = %origin.origin, ?shown, "localStorage not restored: its page did not open");
            return;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let script = format!(
        "(() => {{ \
           if (location.origin !== {name}) return location.origin; \
           const changed = {items}.filter(([k, v]) => localStorage.getItem(k) !== v); \
           if (changed.length === 0) return 'done'; \
           const frame = document.createElement('iframe'); \
           document.documentElement.appendChild(frame); \
           const watcher = frame.contentWindow; \
           watcher.localStorage; \
           const [lastKey, lastValue] = changed[changed.length - 1]; \
           const stored = new Promise((resolve) => watcher.addEventListener('storage', \
             (e) => e.key === lastKey && e.newValue === lastValue && resolve('done'))); \
           changed.forEach(([k, v]) => localStorage.setItem(k, v)); \
           const late = new Promise((resolve) => setTimeout(() => resolve('not confirmed'), {confirm_ms})); \
           return Promise.race([stored, late]); \
         }})()",
        confirm_ms = STORED_WITHIN.as_millis(),
    );
    // A few tries while the page's document may still be replaced as it
    // commits; none once the items went out (a retry would find them in
    // the renderer's copy and confirm nothing).
    let mut written = None;
    for _ in 0..3 {
        written = evaluate(browser, session, &script).await;
        match written.as_deref() {
            Some("done") => return,
            Some("not confirmed") => break,
            _ => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    }
    tracing::warn!(origin = %origin.origin, ?written, "localStorage not restored");
}

/// How long the browser's storage may take to confirm an origin's items.
const STORED_WITHIN: Duration = Duration::from_secs(5);

/// Answers every request a scratch page makes with the document
/// `document_for` gives for its URL (never stored: `no-store`); returns only
/// when the connection closes.
pub(crate) async fn answer_paused_requests(
    browser: &CdpClient,
    events: &mut tokio::sync::broadcast::Receiver<crate::engine::cdp::CdpEvent>,
    session: &str,
    document_for: impl Fn(&str) -> String,
) {
    use tokio::sync::broadcast::error::RecvError;
    loop {
        let event = match events.recv().await {
            Ok(event) => event,
            Err(RecvError::Lagged(_)) => continue,
            Err(RecvError::Closed) => return,
        };
        if event.method != "Fetch.requestPaused" || event.session_id.as_deref() != Some(session) {
            continue;
        }
        let url = event.params["request"]["url"].as_str().unwrap_or_default();
        let answer = fulfilled(&event.params["requestId"], &document_for(url));
        let _ = browser
            .call("Fetch.fulfillRequest", answer, Some(session), CDP_TIMEOUT)
            .await;
    }
}

/// `Fetch.fulfillRequest`'s parameters answering `request_id` with the
/// HTML `document`, never stored.
fn fulfilled(request_id: &Value, document: &str) -> Value {
    use base64::Engine;
    json!({
        "requestId": request_id,
        "responseCode": 200,
        "responseHeaders": [
            {"name": "Content-Type", "value": "text/html"},
            {"name": "Cache-Control", "value": "no-store"},
        ],
        "body": base64::engine::general_purpose::STANDARD.encode(document),
    })
}

/// A flat CDP session on a target.
pub(crate) async fn attach(browser: &CdpClient, target_id: &Value) -> Option<String> {
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

pub(crate) async fn detach(browser: &CdpClient, session: String) {
    let _ = browser
        .call(
            "Target.detachFromTarget",
            json!({"sessionId": session}),
            None,
            CDP_TIMEOUT,
        )
        .await;
}

/// Evaluates `expression` in a session's page (a promise is awaited); its
/// value when it is a string.
pub(crate) async fn evaluate(
    browser: &CdpClient,
    session: &str,
    expression: &str,
) -> Option<String> {
    let result = browser
        .call(
            "Runtime.evaluate",
            json!({"expression": expression, "returnByValue": true, "awaitPromise": true}),
            Some(session),
            CDP_TIMEOUT,
        )
        .await
        .ok()?;
    result["result"]["value"].as_str().map(str::to_owned)
}

/// A `Network.Cookie` as a `Network.CookieParam`.
pub(crate) fn cookie_param(cookie: &Value) -> Value {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_what_a_page_can_have_as_its_origin_is_written_back() {
        for origin in [
            "https://shop.test",
            "http://127.0.0.1:8080",
            "http://[::1]:9000",
        ] {
            assert!(is_web_origin(origin), "{origin}");
        }
        for tampered in [
            "https://shop.test/",
            "https://shop.test:443",
            "http://shop.test/path",
            "https://shop.test?x",
            "https://user@shop.test",
            "file:///etc",
            "javascript:alert(1)",
            "data:text/html,x",
            "HTTPS://SHOP.TEST",
            "https://shop.test\n",
            "",
            "null",
        ] {
            assert!(!is_web_origin(tampered), "{tampered}");
        }
    }

    #[test]
    fn a_tabs_history_is_its_web_pages_up_to_the_current_one() {
        let entry = |url: &str| json!({"url": url, "title": url.to_uppercase()});
        let history = json!({
            "currentIndex": 3,
            "entries": [
                entry("http://a/"), entry("about:blank"), entry("https://b/"),
                entry("http://c/"), entry("http://forward/"),
            ],
        });
        let urls: Vec<String> = web_history(&history).into_iter().map(|e| e.url).collect();
        assert_eq!(
            urls,
            ["https://b/", "http://c/"],
            "from after the blank page, without the forward one"
        );
        assert_eq!(web_history(&history)[0].title, "HTTPS://B/");
        let on_data =
            json!({"currentIndex": 1, "entries": [entry("http://a/"), entry("data:text/html,x")]});
        assert!(web_history(&on_data).is_empty());
        assert!(web_history(&json!({"currentIndex": 9, "entries": []})).is_empty());
        assert_eq!(html_escape("<a & b>"), "&lt;a &amp; b&gt;");
    }
}
