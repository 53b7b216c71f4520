//! Steps on an instance's page for the control plane's MCP server: navigate,
//! read the page as an accessibility snapshot, act on its elements by the
//! snapshot's references, wait, evaluate, capture, and manage tabs.
//!
//! A reference is `e<n>`, a number new to the instance that the node
//! keeps beside the Chromium id of the DOM node it names (the same across
//! DevTools connections for as long as the node is in its document) and
//! the document it was read from ([`References`]): one read from a document
//! the tab has left names nothing. Each step opens its own connection to
//! the browser (over its network namespace, like the agent's other
//! DevTools work), within the step's `timeout_ms`. Which step does what,
//! and the words of its answer, are [`crate::protocols::page_steps`]'s:
//! this module gives Chromium's moves, as
//! [`crate::protocols::firefox_page_ops`] gives Firefox's.
//!
//! Console messages are read from a [`ConsoleLog`] that follows every page
//! of the browser from the first step on.
//!
//! Also what the REST actions (`crate::protocols::actions`) share with the steps: the
//! wait for a navigation's load ([`wait_loaded`]), dismissing dialogs, and a
//! CDP failure in words fit for a client.

use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::time::Instant;

use flotilla_api_types::page::{AgentPageRequest, PageAnswer, PageOp, TabInfo};

use crate::engine::bidi::BidiError;
use crate::engine::browser::CdpEndpoint;
use crate::engine::cdp::{CdpClient, CdpError};
use crate::engine::page::{
    AbortOnDrop, Browser, ConsoleLog, LoadedAt, NavigateError, Page, Within, describe,
    dismiss_dialogs, exception_text,
};
use crate::protocols::page_steps::{PageDriver, Point, drag_moves, run_step};

/// Largest message a step reads (a screenshot, a snapshot).
const MAX_MESSAGE: usize = 48 << 20;
/// Longest snapshot or evaluation result given back, in bytes.
pub(crate) const MAX_TEXT: usize = 256 * 1024;
/// Longest `wait_for` time.
const MAX_WAIT: Duration = Duration::from_secs(60);

/// Why a step failed; the message says what the agent can do about it.
#[derive(Debug, thiserror::Error)]
pub enum PageError {
    /// 400.
    #[error("{0}")]
    BadInput(String),
    /// 400: a reference to an element no longer in the page.
    #[error(
        "element {0} is not in the page any more (the page changed): take a new snapshot and use its references"
    )]
    StaleElement(String),
    /// 404.
    #[error("no tab {0}: list the tabs with browser_tabs")]
    NoTab(String),
    /// 502.
    #[error("the page at {url} could not be loaded: {reason}")]
    Navigation { url: String, reason: String },
    /// 504.
    #[error("{0} did not finish within the step's time")]
    Timeout(&'static str),
    /// 409: the node runs no real browser (the sim runtime).
    #[error("this node's runtime has no real browser")]
    NoBrowser,
    /// 502.
    #[error("the browser is not ready: {0}")]
    NotStarted(String),
    /// 502.
    #[error("the browser failed the step: {}", describe(.0))]
    Browser(CdpError),
    /// 400: a step a Firefox instance does not take.
    #[error("{step} is not available on Firefox: {why} (use a Chromium image for it)")]
    NotInFirefox {
        step: &'static str,
        why: &'static str,
    },
    /// 502; 409 while a client holds the browser's only WebDriver session.
    #[error("Firefox failed the step: {0}")]
    Firefox(BidiError),
}

impl From<BidiError> for PageError {
    fn from(error: BidiError) -> Self {
        match error {
            BidiError::Timeout(_) => Self::Timeout("the step"),
            other => Self::Firefox(other),
        }
    }
}

impl From<CdpError> for PageError {
    fn from(error: CdpError) -> Self {
        match error {
            CdpError::Timeout { .. } => Self::Timeout("the step"),
            other => Self::Browser(other),
        }
    }
}

/// What a step may touch of its instance besides the browser: its console
/// log, and its folders (uploads go in, downloads are listed).
pub struct StepContext<'a> {
    pub console: &'a ConsoleLog,
    pub dirs: &'a crate::system::dirs::InstanceDirs,
    pub isolation: &'a crate::confine::sandbox::Isolation,
    /// What the instance's snapshots handed out.
    pub references: &'a References,
}

/// What an instance remembers of the references its snapshots handed out:
/// a reference's number is new to the instance, so that one never names an
/// element of another document than the one it was read from. (Chromium's
/// own node ids would not do: a navigation that changes renderer process
/// numbers the new document's nodes from the start again, and the same page
/// then has the same ids.)
#[derive(Debug, Default)]
pub struct References {
    /// Chromium: the references of the document each tab's snapshots read.
    chromium: Mutex<std::collections::HashMap<String, DocumentReferences>>,
    /// The highest number handed out (Firefox's pages count on from it
    /// too, see [`crate::protocols::firefox_page_ops`]).
    pub handed_out: std::sync::atomic::AtomicU64,
}

/// The references handed out for one document of a tab (its loader id).
#[derive(Debug, Default)]
struct DocumentReferences {
    document: String,
    by_node: std::collections::HashMap<i64, i64>,
    by_reference: std::collections::HashMap<i64, i64>,
}

/// Most tabs whose references are kept (a browser past it starts afresh).
const MAX_TABS_REFERENCED: usize = 1024;

/// Most references kept for one document (a page that keeps making new
/// nodes, read again and again): past it, its older references go stale.
const MAX_REFERENCES_PER_DOCUMENT: usize = 4 * MAX_NODES;

impl References {
    /// Numbers the backend nodes of a snapshot of `document` in `tab`: a
    /// node read before in the same document keeps its number.
    fn numbering(&self, tab: &str, document: &str) -> Numbering<'_> {
        let mut tabs = self.chromium.lock().expect("references lock");
        if tabs.len() >= MAX_TABS_REFERENCED && !tabs.contains_key(tab) {
            tabs.clear();
        }
        let read = tabs.entry(tab.to_owned()).or_default();
        if read.document != document {
            *read = DocumentReferences {
                document: document.to_owned(),
                ..DocumentReferences::default()
            };
        }
        Numbering {
            tabs,
            tab: tab.to_owned(),
            handed_out: &self.handed_out,
        }
    }

    /// Forgets the references of a tab that closed.
    fn forget(&self, tab: &str) {
        self.chromium.lock().expect("references lock").remove(tab);
    }

    /// The backend node `reference` names in `tab`, while the tab still
    /// shows `document`, the one it was read from.
    fn node(&self, tab: &str, document: &str, reference: i64) -> Option<i64> {
        let tabs = self.chromium.lock().expect("references lock");
        let read = tabs.get(tab).filter(|read| read.document == document)?;
        read.by_reference.get(&reference).copied()
    }
}

/// A snapshot's numbering of its nodes ([`References::numbering`]).
struct Numbering<'a> {
    tabs: std::sync::MutexGuard<'a, std::collections::HashMap<String, DocumentReferences>>,
    tab: String,
    handed_out: &'a std::sync::atomic::AtomicU64,
}

impl Numbering<'_> {
    fn of(&mut self, node: i64) -> i64 {
        let read = self.tabs.get_mut(&self.tab).expect("numbered tab");
        if let Some(number) = read.by_node.get(&node) {
            return *number;
        }
        if read.by_node.len() >= MAX_REFERENCES_PER_DOCUMENT {
            read.by_node.clear();
            read.by_reference.clear();
        }
        let number = self
            .handed_out
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst) as i64
            + 1;
        read.by_node.insert(node, number);
        read.by_reference.insert(number, node);
        number
    }
}

/// Runs `request` on the browser at `endpoint`.
pub async fn run(
    endpoint: &CdpEndpoint,
    request: &AgentPageRequest,
    context: StepContext<'_>,
) -> Result<PageAnswer, PageError> {
    let deadline = Instant::now() + Duration::from_millis(request.timeout_ms.max(1));
    let step = async {
        let client = CdpClient::open_limited(endpoint, &endpoint.browser_path, MAX_MESSAGE).await?;
        let mut step = Step {
            client: Arc::new(client),
            deadline,
            dialogs: Mutex::default(),
            context: &context,
        };
        run_step(&mut step, request).await
    };
    tokio::time::timeout_at(deadline, step)
        .await
        .unwrap_or(Err(PageError::Timeout("the step")))
}

struct Step<'a> {
    client: Arc<CdpClient>,
    deadline: Instant,
    /// Dismissing the dialogs of the tabs this step attached to.
    dialogs: Mutex<Vec<AbortOnDrop>>,
    context: &'a StepContext<'a>,
}

/// A tab the step acts on: its target and flat session.
struct Tab {
    id: String,
    session: String,
}

impl PageDriver for Step<'_> {
    type Tab = Tab;

    fn id_of(tab: &Tab) -> &str {
        &tab.id
    }

    fn remaining(&self) -> Duration {
        self.deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1))
    }

    fn dirs(&self) -> &crate::system::dirs::InstanceDirs {
        self.context.dirs
    }

    fn console(&self) -> Result<String, PageError> {
        Ok(self.context.console.render())
    }

    /// The browser's page tabs, most recently used first.
    async fn tabs(&mut self) -> Result<Vec<TabInfo>, PageError> {
        Ok(self.pages().pages().await?)
    }

    async fn tab_for(&mut self, request: &AgentPageRequest) -> Result<Tab, PageError> {
        let id = match &request.op {
            PageOp::TabSelect { tab } => {
                self.find_tab(tab).await?;
                self.pages().activate(tab).await?;
                tab.clone()
            }
            _ => self.current_id(request.tab.as_deref()).await?,
        };
        self.attach(&id).await
    }

    /// `wanted` if it is still open, else the first tab (a new one when the
    /// browser has none).
    async fn current_id(&mut self, wanted: Option<&str>) -> Result<String, PageError> {
        let tabs = self.tabs().await?;
        if let Some(wanted) = wanted
            && tabs.iter().any(|tab| tab.id == wanted)
        {
            return Ok(wanted.to_owned());
        }
        if let Some(first) = tabs.first() {
            return Ok(first.id.clone());
        }
        Ok(self.pages().open_blank().await?)
    }

    async fn open_tab(&mut self) -> Result<Tab, PageError> {
        let id = self.pages().open_blank().await?;
        self.attach(&id).await
    }

    async fn close_tab(&mut self, id: &str) -> Result<Vec<TabInfo>, PageError> {
        self.find_tab(id).await?;
        self.pages().close(id).await?;
        self.context.references.forget(id);
        self.tabs_without(id).await
    }

    async fn screenshot(&mut self, tab: &Tab) -> Result<Option<String>, PageError> {
        let shot = self.page(tab).screenshot(json!({"format": "png"})).await?;
        Ok(Some(shot.as_str().unwrap_or_default().to_owned()))
    }

    async fn navigate(&mut self, tab: &Tab, url: &str) -> Result<(), PageError> {
        self.page(tab)
            .navigate(url, LoadedAt::Load)
            .await
            .map_err(|error| match error {
                NavigateError::Refused(reason) => PageError::Navigation {
                    url: url.to_owned(),
                    reason,
                },
                NavigateError::Browser(error) => error.into(),
            })
    }

    async fn back(&mut self, tab: &Tab) -> Result<(), PageError> {
        if !self.page(tab).back().await? {
            return Err(PageError::BadInput(
                "the tab has no earlier page to go back to".into(),
            ));
        }
        self.settle(tab).await;
        Ok(())
    }

    async fn settle(&mut self, tab: &Tab) {
        for _ in 0..3 {
            let loaded = self
                .page(tab)
                .evaluate_within(SETTLE_SCRIPT, self.remaining().min(SETTLE_WAIT))
                .await;
            if loaded.is_ok_and(|answer| answer.get("exceptionDetails").is_none()) {
                return;
            }
        }
    }

    async fn describe_page(&mut self, tab: &Tab) -> Result<String, PageError> {
        let info = self.pages().info(&tab.id).await?;
        Ok(format!(
            "- Page URL: {}\n- Page title: {}\n- Tab: {}\n",
            info.url, info.title, tab.id
        ))
    }

    async fn snapshot(&mut self, tab: &Tab) -> Result<String, PageError> {
        let document = self.page(tab).document_id().await?;
        let tree = self.page(tab).accessibility_tree().await?;
        let mut text = self.describe_page(tab).await?;
        text.push_str("- Page snapshot:\n");
        let mut numbering = self.context.references.numbering(&tab.id, &document);
        text.push_str(&render_tree(
            tree["nodes"].as_array().map_or(&[][..], Vec::as_slice),
            &mut |node| numbering.of(node),
        ));
        Ok(bounded_text(text))
    }

    /// The middle of `element`'s first box, scrolled into view.
    async fn center_of(&mut self, tab: &Tab, element: &str) -> Result<Point, PageError> {
        let node = self.reference(tab, element).await?;
        let stale = |error: CdpError| match error {
            CdpError::Protocol { .. } => PageError::StaleElement(element.to_owned()),
            other => PageError::from(other),
        };
        let page = self.page(tab);
        page.scroll_into_view(node).await.map_err(stale)?;
        let quads = page.content_quads(node).await.map_err(stale)?;
        let quad = quads["quads"][0].as_array().cloned().unwrap_or_default();
        if quad.len() < 8 {
            return Err(PageError::BadInput(format!(
                "element {element} is not visible (it has no box on the page)"
            )));
        }
        let number = |i: usize| quad[i].as_f64().unwrap_or(0.0);
        let x = (number(0) + number(2) + number(4) + number(6)) / 4.0;
        let y = (number(1) + number(3) + number(5) + number(7)) / 4.0;
        Ok((x, y))
    }

    async fn click_at(&mut self, tab: &Tab, (x, y): Point, clicks: u32) -> Result<(), PageError> {
        self.mouse(tab, "mouseMoved", x, y, 0).await?;
        for count in 1..=clicks {
            self.mouse(tab, "mousePressed", x, y, count).await?;
            self.mouse(tab, "mouseReleased", x, y, count).await?;
        }
        Ok(())
    }

    async fn move_to(&mut self, tab: &Tab, (x, y): Point) -> Result<(), PageError> {
        self.mouse(tab, "mouseMoved", x, y, 0).await
    }

    async fn drag_between(&mut self, tab: &Tab, from: Point, to: Point) -> Result<(), PageError> {
        self.mouse(tab, "mouseMoved", from.0, from.1, 0).await?;
        self.mouse(tab, "mousePressed", from.0, from.1, 1).await?;
        for (x, y) in drag_moves(from, to) {
            self.mouse(tab, "mouseMoved", x, y, 1).await?;
        }
        self.mouse(tab, "mouseReleased", to.0, to.1, 1).await
    }

    async fn type_into(
        &mut self,
        tab: &Tab,
        element: &str,
        text: &str,
        submit: bool,
    ) -> Result<(), PageError> {
        let object = self.object_of(tab, element).await?;
        let editable = self
            .call_on(tab, &object, FOCUS_FOR_TYPING, json!([]))
            .await?;
        takes_text(element, &editable)?;
        self.page(tab).insert_text(text).await?;
        if submit {
            self.press(tab, "Enter").await?;
        }
        Ok(())
    }

    async fn press(&mut self, tab: &Tab, key: &str) -> Result<(), PageError> {
        let key = if key == "Space" { " " } else { key };
        let (code, key_code, text) = key_definition(key).ok_or_else(|| unknown_key(key))?;
        let mut down = json!({
            "type": if text.is_empty() { "rawKeyDown" } else { "keyDown" },
            "key": key, "code": code, "windowsVirtualKeyCode": key_code,
        });
        if !text.is_empty() {
            down["text"] = json!(text);
        }
        let page = self.page(tab);
        page.key(down).await?;
        page.key(
            json!({"type": "keyUp", "key": key, "code": code, "windowsVirtualKeyCode": key_code}),
        )
        .await?;
        Ok(())
    }

    async fn select(
        &mut self,
        tab: &Tab,
        element: &str,
        values: &[String],
    ) -> Result<(), PageError> {
        let object = self.object_of(tab, element).await?;
        let chosen = self
            .call_on(tab, &object, SELECT_OPTIONS, json!([{"value": values}]))
            .await?;
        selected(element, values, &chosen)
    }

    async fn wait_for_text(
        &mut self,
        tab: &Tab,
        wanted: &str,
        present: bool,
    ) -> Result<(), PageError> {
        self.page(tab)
            .evaluate(&text_wait_script(wanted, present), false, None)
            .await
            .map_err(|error| match error {
                CdpError::Timeout { .. } => PageError::Timeout(waiting_for(present)),
                other => PageError::Browser(other),
            })?;
        Ok(())
    }

    /// `expression`'s value as JSON text, at most [`MAX_TEXT`] long. An
    /// object is written out by the page itself (`JSON.stringify`, cut to
    /// size there), so however large or deep it is, only the cut text
    /// reaches the agent; a primitive comes with the answer.
    async fn evaluate_text(&mut self, tab: &Tab, expression: &str) -> Result<String, PageError> {
        const GROUP: &str = "flotilla-evaluate";
        let answer = self
            .page(tab)
            .evaluate(expression, false, Some(GROUP))
            .await?;
        if let Some(details) = answer.get("exceptionDetails") {
            return Err(PageError::BadInput(format!(
                "the expression threw: {}",
                exception_text(details)
            )));
        }
        let result = &answer["result"];
        let text = match (result.get("objectId"), result.get("value")) {
            (Some(object), _) => {
                let written = self.write_out(tab, object).await;
                let _ = self.page(tab).release_group(GROUP).await;
                written?
            }
            (None, Some(value)) => serde_json::to_string_pretty(value).unwrap_or_default(),
            (None, None) => result["unserializableValue"]
                .as_str()
                .or(result["description"].as_str())
                .unwrap_or("undefined")
                .to_owned(),
        };
        Ok(bounded_text(text))
    }

    /// Sets `files` (placed in the instance's uploads first) on a file input.
    async fn upload(
        &mut self,
        tab: &Tab,
        element: &str,
        files: &[flotilla_api_types::page::UploadFile],
    ) -> Result<(), PageError> {
        let paths = place_uploads(self.context, files)?;
        let node = self.reference(tab, element).await?;
        self.page(tab)
            .set_files(node, &paths)
            .await
            .map_err(|error| match error {
                CdpError::Protocol { message, .. } => PageError::BadInput(format!(
                    "element {element} takes no files: {message} (use a file input's reference)"
                )),
                other => PageError::Browser(other),
            })?;
        Ok(())
    }
}

impl Step<'_> {
    /// The browser's tabs, within the step's time.
    fn pages(&self) -> Browser<'_> {
        Browser::new(&self.client, Within::Deadline(self.deadline))
    }

    /// The page in `tab`, within the step's time.
    fn page<'t>(&'t self, tab: &'t Tab) -> Page<'t> {
        Page::new(&self.client, &tab.session, Within::Deadline(self.deadline))
    }

    /// The tabs once `closed` is no longer among them (Chromium answers a
    /// close before the tab is gone), or as they are after a few seconds.
    async fn tabs_without(&mut self, closed: &str) -> Result<Vec<TabInfo>, PageError> {
        let until = Instant::now() + Duration::from_secs(5);
        loop {
            let tabs = self.tabs().await?;
            if Instant::now() >= until.min(self.deadline) || tabs.iter().all(|t| t.id != closed) {
                return Ok(tabs);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn find_tab(&mut self, id: &str) -> Result<TabInfo, PageError> {
        self.tabs()
            .await?
            .into_iter()
            .find(|tab| tab.id == id)
            .ok_or_else(|| PageError::NoTab(id.to_owned()))
    }

    async fn attach(&self, id: &str) -> Result<Tab, PageError> {
        let session = self.client.attach(id, self.remaining()).await?;
        // A dialog the page opened (now or before this step) would hold
        // every script and load: Page.enable reports an open one.
        let dismisser = dismiss_dialogs(self.client.clone(), session.clone());
        self.dialogs.lock().expect("dialogs lock").push(dismisser);
        let tab = Tab {
            id: id.to_owned(),
            session,
        };
        self.page(&tab).enable().await?;
        Ok(tab)
    }

    /// The backend node id `element` names, while the tab still shows the
    /// document it was read from.
    async fn reference(&self, tab: &Tab, element: &str) -> Result<i64, PageError> {
        let reference = node_of(element)?;
        let document = self.page(tab).document_id().await?;
        self.context
            .references
            .node(&tab.id, &document, reference)
            .ok_or_else(|| PageError::StaleElement(element.to_owned()))
    }

    async fn mouse(
        &self,
        tab: &Tab,
        kind: &str,
        x: f64,
        y: f64,
        clicks: u32,
    ) -> Result<(), PageError> {
        let mut params = json!({"type": kind, "x": x, "y": y});
        if kind != "mouseMoved" {
            params["button"] = json!("left");
            params["clickCount"] = json!(clicks);
        } else if clicks > 0 {
            params["buttons"] = json!(1);
        }
        self.page(tab).mouse(params).await?;
        Ok(())
    }

    /// The page's JavaScript object of `element`.
    async fn object_of(&self, tab: &Tab, element: &str) -> Result<String, PageError> {
        let node = self.reference(tab, element).await?;
        let object = self
            .page(tab)
            .object_of(node)
            .await
            .map_err(|error| match error {
                CdpError::Protocol { .. } => PageError::StaleElement(element.to_owned()),
                other => PageError::from(other),
            })?;
        Ok(object.as_str().unwrap_or_default().to_owned())
    }

    async fn call_on(
        &self,
        tab: &Tab,
        object: &str,
        function: &str,
        arguments: Value,
    ) -> Result<Value, PageError> {
        let answer = self
            .page(tab)
            .call_function_on(&json!(object), function, arguments, true)
            .await?;
        if let Some(details) = answer.get("exceptionDetails") {
            return Err(PageError::BadInput(exception_text(details)));
        }
        Ok(answer["result"]["value"].clone())
    }

    /// The object `object` as the page writes it: JSON (indented by two,
    /// as before), or its string form where JSON has none (a function, a
    /// cycle, nesting deeper than the page's stack), cut to [`MAX_TEXT`].
    async fn write_out(&self, tab: &Tab, object: &Value) -> Result<String, PageError> {
        let written = self
            .page(tab)
            .call_function_on(object, WRITE_OUT, json!([{"value": MAX_TEXT + 1}]), false)
            .await?;
        Ok(written["result"]["value"]
            .as_str()
            .unwrap_or("undefined")
            .to_owned())
    }
}

/// Most files one upload step takes.
const MAX_UPLOAD_FILES: usize = 20;

/// Writes `files` into the instance's uploads folder: their paths as the
/// browser sees them.
pub(crate) fn place_uploads(
    context: &StepContext<'_>,
    files: &[flotilla_api_types::page::UploadFile],
) -> Result<Vec<String>, PageError> {
    use base64::Engine as _;
    if files.is_empty() || files.len() > MAX_UPLOAD_FILES {
        return Err(PageError::BadInput(format!(
            "give 1 to {MAX_UPLOAD_FILES} files"
        )));
    }
    files
        .iter()
        .map(|file| {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(file.content_base64.trim())
                .map_err(|e| {
                    PageError::BadInput(format!("{}: content_base64 is not base64: {e}", file.name))
                })?;
            crate::protocols::se_files::place_upload(
                context.dirs,
                context.isolation,
                &file.name,
                &mut bytes.as_slice(),
            )
            .map(|path| path.to_string_lossy().into_owned())
            .map_err(|error| PageError::BadInput(error.message))
        })
        .collect()
}

/// The instance's downloads, for the agent.
pub(crate) fn downloads_text(
    dirs: &crate::system::dirs::InstanceDirs,
) -> Result<String, PageError> {
    let downloads = crate::system::downloads::list(&dirs.downloads())
        .map_err(|e| PageError::BadInput(format!("cannot list the downloads: {e}")))?;
    if downloads.is_empty() {
        return Ok("No downloads yet.".into());
    }
    let mut text =
        String::from("Downloads (fetch one with GET /v2/instances/{id}/downloads/{name}):\n");
    for download in downloads {
        let _ = writeln!(
            text,
            "- {} ({} bytes, {}, {:?})",
            download.name, download.size_bytes, download.mime_type, download.state
        );
    }
    Ok(text)
}

pub(crate) fn answer(text: String, tab: &str) -> PageAnswer {
    PageAnswer {
        text,
        png_base64: None,
        tab: tab.to_owned(),
    }
}

pub(crate) fn list_tabs(tabs: &[TabInfo], current: &str) -> String {
    let mut text = String::from("Tabs:\n");
    for (index, tab) in tabs.iter().enumerate() {
        let mark = if tab.id == current { " (current)" } else { "" };
        let _ = writeln!(
            text,
            "- {index}: [{}] {}{mark}\n  id: {}",
            tab.title, tab.url, tab.id
        );
    }
    text
}

/// Only `http` and `https` pages, and `about:blank`.
pub(crate) fn check_url(url: &str) -> Result<(), PageError> {
    if url == "about:blank" {
        return Ok(());
    }
    let parsed = url::Url::parse(url)
        .map_err(|e| PageError::BadInput(format!("url {url:?} is not a URL: {e}")))?;
    if !matches!(parsed.scheme(), "http" | "https") || parsed.host_str().is_none() {
        return Err(PageError::BadInput(format!(
            "url must be an http or https URL (got a {}: URL)",
            parsed.scheme()
        )));
    }
    Ok(())
}

/// The backend node id of reference `element` (`e123`).
pub(crate) fn node_of(element: &str) -> Result<i64, PageError> {
    element
        .strip_prefix('e')
        .and_then(|id| id.parse::<i64>().ok())
        .filter(|id| *id > 0)
        .ok_or_else(|| {
            PageError::BadInput(format!(
                "element {element:?} is not a reference from a snapshot (they look like e42)"
            ))
        })
}

pub(crate) fn bounded_text(mut text: String) -> String {
    if text.len() > MAX_TEXT {
        let mut cut = MAX_TEXT;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
        text.push_str("\n… (cut: the rest is longer than 256 KiB)\n");
    }
    text
}

/// Waits for what an action started: resolves 100 ms after the document's
/// load (at once when it has loaded).
pub(crate) const SETTLE_SCRIPT: &str = "new Promise((r) => { if (document.readyState === 'complete') setTimeout(r, 100); else addEventListener('load', () => r(), {once: true}); })";

/// Longest one wait of [`SETTLE_SCRIPT`].
pub(crate) const SETTLE_WAIT: Duration = Duration::from_secs(10);

/// Called on an element to type into: focuses it and selects its text (so
/// typing replaces it); whether it takes text.
pub(crate) const FOCUS_FOR_TYPING: &str = "function() { this.focus(); if ('value' in this && typeof this.select === 'function') { this.select(); } return this.isContentEditable || 'value' in this; }";

/// Called on a select with the values or labels to choose: how many
/// options it chose (-1: not a select).
pub(crate) const SELECT_OPTIONS: &str = "function(values) { if (!(this instanceof HTMLSelectElement)) return -1; let n = 0; for (const o of this.options) { o.selected = values.includes(o.value) || values.includes(o.label); if (o.selected) n++; } this.dispatchEvent(new Event('input', {bubbles: true})); this.dispatchEvent(new Event('change', {bubbles: true})); return n; }";

/// Called on an evaluation's object with a length: the object as the page
/// writes it, JSON (indented by two) or its string form where JSON has none
/// (a function, a cycle, nesting deeper than the page's stack), cut there.
pub(crate) const WRITE_OUT: &str = "function (limit) {
    let text;
    try { text = JSON.stringify(this, null, 2); } catch (error) { text = undefined; }
    if (text === undefined) {
        try { text = String(this); } catch (error) { text = Object.prototype.toString.call(this); }
    }
    return text.length > limit ? text.slice(0, limit) : text;
}";

/// The page's requests since it loaded (Resource Timing), a line each.
pub(crate) const NETWORK_REQUESTS_SCRIPT: &str = "performance.getEntriesByType('navigation').concat(performance.getEntriesByType('resource')).map((e) => `${e.responseStatus || '-'} ${e.initiatorType} ${e.name} (${Math.round(e.duration)} ms, ${e.transferSize} bytes)`).join('\\n')";

/// [`NETWORK_REQUESTS_SCRIPT`]'s evaluation (a JSON string) for the agent.
pub(crate) fn requests_text(entries: String) -> String {
    let list: String = serde_json::from_str::<String>(&entries).unwrap_or(entries);
    format!("Requests of the page since it loaded (status, kind, URL):\n{list}")
}

/// A script that resolves once `wanted` is (`present`) or is no longer in
/// the page's text.
pub(crate) fn text_wait_script(wanted: &str, present: bool) -> String {
    format!(
        "((t, present) => new Promise((resolve) => {{
            const done = () => ((document.body ? document.body.innerText : '').includes(t)) === present;
            if (done()) return resolve(true);
            const observer = new MutationObserver(() => {{ if (done()) {{ observer.disconnect(); resolve(true); }} }});
            observer.observe(document, {{ childList: true, subtree: true, characterData: true, attributes: true }});
        }}))({}, {present})",
        json!(wanted)
    )
}

/// What a text wait that ran out of time waited for.
pub(crate) fn waiting_for(present: bool) -> &'static str {
    if present {
        "waiting for the text to appear"
    } else {
        "waiting for the text to go"
    }
}

/// How long `wait_for`'s `time` waits: at most [`MAX_WAIT`], and 5 s less
/// than is `left` of the step (what is left after the wait tells the
/// page's state).
pub(crate) fn timed_wait(time_ms: u64, left: Duration) -> Duration {
    let room = left.saturating_sub(Duration::from_secs(5));
    Duration::from_millis(time_ms).min(MAX_WAIT).min(room)
}

/// [`FOCUS_FOR_TYPING`]'s answer: whether `element` takes text.
pub(crate) fn takes_text(element: &str, editable: &Value) -> Result<(), PageError> {
    if editable != &Value::Bool(true) {
        return Err(PageError::BadInput(format!(
            "element {element} does not take text (it is not an input, text area or editable element)"
        )));
    }
    Ok(())
}

/// [`SELECT_OPTIONS`]'s answer (`chosen`) as the step's outcome.
pub(crate) fn selected(element: &str, values: &[String], chosen: &Value) -> Result<(), PageError> {
    match chosen.as_i64() {
        Some(-1) => Err(PageError::BadInput(format!(
            "element {element} is not a select (a drop-down list)"
        ))),
        Some(0) => Err(PageError::BadInput(format!(
            "element {element} has no option with a value or label among {values:?}"
        ))),
        _ => Ok(()),
    }
}

/// A key `browser_press_key` does not know.
pub(crate) fn unknown_key(key: &str) -> PageError {
    PageError::BadInput(format!(
        "unknown key {key:?}: use a single character or Enter, Tab, Escape, Backspace, Delete, Space, ArrowUp, ArrowDown, ArrowLeft, ArrowRight, Home, End, PageUp, PageDown"
    ))
}

/// `(code, windows key code, text)` of a key name or single character.
fn key_definition(key: &str) -> Option<(String, i64, String)> {
    let named = match key {
        "Enter" => ("Enter", 13, "\r"),
        "Tab" => ("Tab", 9, ""),
        "Escape" => ("Escape", 27, ""),
        "Backspace" => ("Backspace", 8, ""),
        "Delete" => ("Delete", 46, ""),
        "Space" | " " => ("Space", 32, " "),
        "ArrowLeft" => ("ArrowLeft", 37, ""),
        "ArrowUp" => ("ArrowUp", 38, ""),
        "ArrowRight" => ("ArrowRight", 39, ""),
        "ArrowDown" => ("ArrowDown", 40, ""),
        "Home" => ("Home", 36, ""),
        "End" => ("End", 35, ""),
        "PageUp" => ("PageUp", 33, ""),
        "PageDown" => ("PageDown", 34, ""),
        _ => {
            let mut chars = key.chars();
            let (Some(c), None) = (chars.next(), chars.next()) else {
                return None;
            };
            let upper = c.to_ascii_uppercase();
            let code = if c.is_ascii_alphabetic() {
                format!("Key{upper}")
            } else if c.is_ascii_digit() {
                format!("Digit{c}")
            } else {
                String::new()
            };
            let key_code = if c.is_ascii_alphanumeric() {
                upper as i64
            } else {
                0
            };
            return Some((code, key_code, c.to_string()));
        }
    };
    Some((named.0.to_owned(), named.1, named.2.to_owned()))
}

/// Roles that only group others: their children are shown in their place.
const PASS_THROUGH: [&str; 6] = [
    "RootWebArea",
    "generic",
    "none",
    "InlineTextBox",
    "LineBreak",
    "LayoutTableCell",
];

/// Most nodes of a snapshot (a larger page is cut).
pub(crate) const MAX_NODES: usize = 20_000;

/// Renders `Accessibility.getFullAXTree`'s nodes as indented lines:
/// `- role "name" [property] [ref=e<n>]` (`n`: the `reference` of the
/// node's backend id), text as `- text: …`.
/// Each node is visited once (a node listed twice, or a cycle, is not
/// followed again), at most [`MAX_NODES`] of them.
pub fn render_tree(nodes: &[Value], reference: &mut dyn FnMut(i64) -> i64) -> String {
    let by_id: std::collections::HashMap<&str, usize> = nodes
        .iter()
        .enumerate()
        .filter_map(|(index, node)| node["nodeId"].as_str().map(|id| (id, index)))
        .collect();
    let Some(root) = nodes.iter().position(|node| node.get("parentId").is_none()) else {
        return String::new();
    };
    let name_of = |index: usize| {
        nodes[index]["name"]["value"]
            .as_str()
            .unwrap_or_default()
            .trim()
    };
    let mut visited = vec![false; nodes.len()];
    let mut out = String::new();
    // (node, depth, the nearest shown ancestor, whose name its text may repeat)
    let mut stack: Vec<(usize, usize, Option<usize>)> = vec![(root, 0, None)];
    let mut rendered = 0;
    while let Some((index, depth, named_parent)) = stack.pop() {
        if visited[index] {
            continue;
        }
        visited[index] = true;
        rendered += 1;
        if out.len() > MAX_TEXT || rendered > MAX_NODES {
            out.push_str("… (cut: the page is larger than a snapshot holds)\n");
            break;
        }
        let node = &nodes[index];
        let role = node["role"]["value"].as_str().unwrap_or_default();
        let name = name_of(index);
        let ignored = node["ignored"].as_bool().unwrap_or(false);
        let shown = !ignored && !PASS_THROUGH.contains(&role);
        let mut child_depth = depth;
        let mut child_parent = named_parent;
        if shown {
            let indent = "  ".repeat(depth.min(40));
            if role == "StaticText" {
                if !name.is_empty() && named_parent.is_none_or(|parent| name_of(parent) != name) {
                    let _ = writeln!(out, "{indent}- text: {}", json!(name));
                }
            } else {
                let _ = writeln!(out, "{indent}{}", node_line(node, role, name, reference));
                child_depth = depth + 1;
                child_parent = Some(index);
            }
        }
        let children = node["childIds"].as_array().map_or(&[][..], Vec::as_slice);
        for child in children.iter().rev() {
            if let Some(&child) = child.as_str().and_then(|id| by_id.get(id))
                && !visited[child]
            {
                stack.push((child, child_depth, child_parent));
            }
        }
    }
    out
}

/// `- role "name" [properties] [ref=e…]` of one shown node.
fn node_line(
    node: &Value,
    role: &str,
    name: &str,
    reference: &mut dyn FnMut(i64) -> i64,
) -> String {
    let mut line = format!("- {role}");
    if !name.is_empty() {
        let _ = write!(line, " {}", json!(name));
    }
    for property in node["properties"].as_array().into_iter().flatten() {
        let key = property["name"].as_str().unwrap_or_default();
        let value = &property["value"]["value"];
        match key {
            "level" => {
                let _ = write!(line, " [level={value}]");
            }
            "checked" | "pressed" | "expanded" | "selected" | "disabled"
                if value != &json!(false) && value != &json!("false") =>
            {
                let _ = write!(line, " [{key}]");
            }
            _ => {}
        }
    }
    if let Some(value) = node["value"]["value"].as_str().filter(|v| !v.is_empty()) {
        let _ = write!(line, " [value={}]", json!(value));
    }
    if let Some(backend) = node["backendDOMNodeId"].as_i64() {
        let _ = write!(line, " [ref=e{}]", reference(backend));
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tree_renders_roles_names_and_references() {
        let nodes: Vec<Value> = serde_json::from_value(json!([
            {"nodeId": "1", "role": {"value": "RootWebArea"}, "name": {"value": "Form"}, "childIds": ["2", "5"], "backendDOMNodeId": 1},
            {"nodeId": "2", "parentId": "1", "role": {"value": "heading"}, "name": {"value": "Sign in"}, "properties": [{"name": "level", "value": {"value": 1}}], "childIds": ["3"], "backendDOMNodeId": 7},
            {"nodeId": "3", "parentId": "2", "role": {"value": "StaticText"}, "name": {"value": "Sign in"}, "childIds": []},
            {"nodeId": "5", "parentId": "1", "role": {"value": "generic"}, "ignored": false, "childIds": ["6", "7"]},
            {"nodeId": "6", "parentId": "5", "role": {"value": "textbox"}, "name": {"value": "Name"}, "value": {"value": "Ada"}, "childIds": [], "backendDOMNodeId": 9},
            {"nodeId": "7", "parentId": "5", "role": {"value": "button"}, "name": {"value": "Go"}, "properties": [{"name": "disabled", "value": {"value": true}}], "childIds": [], "backendDOMNodeId": 11}
        ]))
        .unwrap();
        assert_eq!(
            render_tree(&nodes, &mut |node| node),
            "- heading \"Sign in\" [level=1] [ref=e7]\n- textbox \"Name\" [value=\"Ada\"] [ref=e9]\n- button \"Go\" [disabled] [ref=e11]\n"
        );
    }

    #[test]
    fn a_reference_names_its_node_only_in_the_document_it_was_read_from() {
        let references = References::default();
        let first = {
            let mut numbering = references.numbering("tab", "doc-1");
            let first = numbering.of(31);
            assert_eq!(
                numbering.of(31),
                first,
                "a node read again keeps its number"
            );
            assert_ne!(numbering.of(32), first);
            first
        };
        assert_eq!(references.node("tab", "doc-1", first), Some(31));
        assert_eq!(references.node("other tab", "doc-1", first), None);
        assert_eq!(references.node("tab", "doc-1", first + 100), None);
        // The tab moved on to a document whose nodes have the same ids (a
        // renderer process of its own numbers them from the start again).
        assert_eq!(references.node("tab", "doc-2", first), None);
        let again = references.numbering("tab", "doc-2").of(31);
        assert_ne!(again, first, "a new document's node gets a new number");
        assert_eq!(references.node("tab", "doc-2", first), None);
        assert_eq!(references.node("tab", "doc-2", again), Some(31));
    }

    #[test]
    fn a_tree_that_lists_a_node_twice_or_loops_is_rendered_once() {
        let nodes: Vec<Value> = serde_json::from_value(json!([
            {"nodeId": "1", "role": {"value": "RootWebArea"}, "childIds": ["2", "2"]},
            {"nodeId": "2", "parentId": "1", "role": {"value": "button"}, "name": {"value": "Loop"}, "childIds": ["1", "2"], "backendDOMNodeId": 3}
        ]))
        .unwrap();
        assert_eq!(
            render_tree(&nodes, &mut |node| node),
            "- button \"Loop\" [ref=e3]\n"
        );
    }

    #[test]
    fn references_keys_and_urls_are_checked() {
        assert_eq!(node_of("e42").unwrap(), 42);
        for bad in ["42", "e", "e-1", "ref=e4", "e0"] {
            assert!(node_of(bad).is_err(), "{bad}");
        }
        assert_eq!(key_definition("Enter").unwrap().1, 13);
        assert_eq!(
            key_definition("a").unwrap(),
            ("KeyA".into(), 65, "a".into())
        );
        assert!(key_definition("Ctrl+A").is_none());
        for bad in [
            "file:///etc/passwd",
            "chrome://settings",
            "javascript:alert(1)",
        ] {
            assert!(check_url(bad).is_err(), "{bad}");
        }
        check_url("https://example.com/").unwrap();
        check_url("about:blank").unwrap();
    }
}
