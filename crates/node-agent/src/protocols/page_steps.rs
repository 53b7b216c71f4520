//! MCP's page steps, once for every engine: which step does what, in which
//! order, and the words of its answer. An engine gives the moves
//! ([`PageDriver`]): Chromium's over CDP ([`crate::protocols::page_ops`]),
//! Firefox's over WebDriver BiDi ([`crate::protocols::firefox_page_ops`]).

use std::time::Duration;

use flotilla_api_types::page::{AgentPageRequest, PageAnswer, PageOp, TabInfo, UploadFile};

use crate::protocols::page_ops::{
    NETWORK_REQUESTS_SCRIPT, PageError, answer, check_url, downloads_text, list_tabs,
    requests_text, timed_wait,
};
use crate::system::dirs::InstanceDirs;

/// A point in the viewport, in CSS pixels.
pub(crate) type Point = (f64, f64);

/// What an engine does for a page step, within the step's time.
pub(crate) trait PageDriver {
    /// A tab as the engine acts on it.
    type Tab;

    /// The id a tab has for the agent.
    fn id_of(tab: &Self::Tab) -> &str;
    /// What is left of the step's time.
    fn remaining(&self) -> Duration;
    /// The instance's folders (its downloads are listed).
    fn dirs(&self) -> &InstanceDirs;
    /// The console messages kept, in words.
    fn console(&self) -> Result<String, PageError>;

    /// The browser's tabs, in the engine's order.
    async fn tabs(&mut self) -> Result<Vec<TabInfo>, PageError>;
    /// The tab a step on a tab acts on: the one `browser_tab_select` names
    /// (brought to the front), else the request's while it is open, else
    /// the first (a new one when there is none).
    async fn tab_for(&mut self, request: &AgentPageRequest) -> Result<Self::Tab, PageError>;
    /// The id of the tab a step on the browser answers for: `wanted` while
    /// it is open, else the first.
    async fn current_id(&mut self, wanted: Option<&str>) -> Result<String, PageError>;
    /// A new blank tab.
    async fn open_tab(&mut self) -> Result<Self::Tab, PageError>;
    /// Closes tab `id`: the tabs left.
    async fn close_tab(&mut self, id: &str) -> Result<Vec<TabInfo>, PageError>;

    /// A PNG of the tab's viewport, base64.
    async fn screenshot(&mut self, tab: &Self::Tab) -> Result<Option<String>, PageError>;
    /// Loads `url` (checked already) in the tab.
    async fn navigate(&mut self, tab: &Self::Tab, url: &str) -> Result<(), PageError>;
    /// Goes back a page, and waits for it.
    async fn back(&mut self, tab: &Self::Tab) -> Result<(), PageError>;
    /// Waits (briefly, never failing) for what an action started: a
    /// navigation to commit and its document to load.
    async fn settle(&mut self, tab: &Self::Tab);
    /// URL and title of the tab.
    async fn describe_page(&mut self, tab: &Self::Tab) -> Result<String, PageError>;
    /// The page as an accessibility tree, one line per node that matters,
    /// each actionable one with its reference.
    async fn snapshot(&mut self, tab: &Self::Tab) -> Result<String, PageError>;
    /// Waits until `wanted` is on the page (`present`) or gone from it.
    async fn wait_for_text(
        &mut self,
        tab: &Self::Tab,
        wanted: &str,
        present: bool,
    ) -> Result<(), PageError>;
    /// `expression`'s value as JSON text, cut to size.
    async fn evaluate_text(
        &mut self,
        tab: &Self::Tab,
        expression: &str,
    ) -> Result<String, PageError>;
    /// Sets `files` (placed in the instance's uploads first) on the file
    /// input `element` names.
    async fn upload(
        &mut self,
        tab: &Self::Tab,
        element: &str,
        files: &[UploadFile],
    ) -> Result<(), PageError>;

    /// The middle of `element`'s first box, scrolled into view.
    async fn center_of(&mut self, tab: &Self::Tab, element: &str) -> Result<Point, PageError>;
    /// The mouse moved to `at`, then `clicks` clicks there.
    async fn click_at(&mut self, tab: &Self::Tab, at: Point, clicks: u32) -> Result<(), PageError>;
    /// The mouse moved to `at`.
    async fn move_to(&mut self, tab: &Self::Tab, at: Point) -> Result<(), PageError>;
    /// The mouse pressed at `from`, moved to `to` in five moves, released.
    async fn drag_between(
        &mut self,
        tab: &Self::Tab,
        from: Point,
        to: Point,
    ) -> Result<(), PageError>;
    /// Focuses `element`, selects its text and types `text` over it (then
    /// Enter when `submit`).
    async fn type_into(
        &mut self,
        tab: &Self::Tab,
        element: &str,
        text: &str,
        submit: bool,
    ) -> Result<(), PageError>;
    /// Presses and releases `key` (a key's name, as Playwright names it).
    async fn press(&mut self, tab: &Self::Tab, key: &str) -> Result<(), PageError>;
    /// Selects `values` in the `<select>` `element` names.
    async fn select(
        &mut self,
        tab: &Self::Tab,
        element: &str,
        values: &[String],
    ) -> Result<(), PageError>;
}

/// The points of a drag from `from` to `to` in five moves (`to` last).
pub(crate) fn drag_moves(from: Point, to: Point) -> impl Iterator<Item = Point> {
    (1..=5).map(move |step| {
        let f = f64::from(step) / 5.0;
        (from.0 + (to.0 - from.0) * f, from.1 + (to.1 - from.1) * f)
    })
}

/// Runs `request` with `driver`: a step on the browser, else one on a tab.
pub(crate) async fn run_step<D: PageDriver>(
    driver: &mut D,
    request: &AgentPageRequest,
) -> Result<PageAnswer, PageError> {
    if let Some(answer) = browser_step(driver, request).await? {
        return Ok(answer);
    }
    let tab = driver.tab_for(request).await?;
    let id = D::id_of(&tab).to_owned();
    if let PageOp::Screenshot = &request.op {
        let png_base64 = driver.screenshot(&tab).await?;
        return Ok(PageAnswer {
            text: driver.describe_page(&tab).await?,
            png_base64,
            tab: id,
        });
    }
    let text = tab_step(driver, &tab, &request.op).await?;
    Ok(answer(text, &id))
}

/// The steps on the browser rather than one tab (tabs listed, opened and
/// closed, console messages, downloads); `None` for the others.
async fn browser_step<D: PageDriver>(
    driver: &mut D,
    request: &AgentPageRequest,
) -> Result<Option<PageAnswer>, PageError> {
    let answered = match &request.op {
        PageOp::TabList => {
            let tabs = driver.tabs().await?;
            let current = request
                .tab
                .as_deref()
                .filter(|wanted| tabs.iter().any(|tab| tab.id == *wanted))
                .or(tabs.first().map(|tab| tab.id.as_str()))
                .unwrap_or_default()
                .to_owned();
            answer(list_tabs(&tabs, &current), &current)
        }
        PageOp::TabNew { url } => {
            if let Some(url) = url {
                check_url(url)?;
            }
            let tab = driver.open_tab().await?;
            if let Some(url) = url {
                driver.navigate(&tab, url).await?;
            }
            answer(driver.describe_page(&tab).await?, D::id_of(&tab))
        }
        PageOp::TabClose { tab } => {
            let tabs = driver.close_tab(tab).await?;
            let current = tabs.first().map(|t| t.id.clone()).unwrap_or_default();
            let text = format!("Closed tab {tab}.\n{}", list_tabs(&tabs, &current));
            answer(text, &current)
        }
        PageOp::ConsoleMessages => {
            let current = driver.current_id(request.tab.as_deref()).await?;
            answer(driver.console()?, &current)
        }
        PageOp::Downloads => {
            let current = driver.current_id(request.tab.as_deref()).await?;
            answer(downloads_text(driver.dirs())?, &current)
        }
        _ => return Ok(None),
    };
    Ok(Some(answered))
}

/// A step on one tab, answered in words.
async fn tab_step<D: PageDriver>(
    driver: &mut D,
    tab: &D::Tab,
    op: &PageOp,
) -> Result<String, PageError> {
    Ok(match op {
        PageOp::Navigate { url } => {
            check_url(url)?;
            driver.navigate(tab, url).await?;
            driver.describe_page(tab).await?
        }
        PageOp::Back => {
            driver.back(tab).await?;
            driver.describe_page(tab).await?
        }
        PageOp::Snapshot | PageOp::TabSelect { .. } => driver.snapshot(tab).await?,
        PageOp::WaitFor {
            text,
            text_gone,
            time_ms,
        } => {
            if let Some(time_ms) = time_ms {
                tokio::time::sleep(timed_wait(*time_ms, driver.remaining())).await;
            }
            for (wanted, present) in [(text, true), (text_gone, false)] {
                if let Some(wanted) = wanted {
                    driver.wait_for_text(tab, wanted, present).await?;
                }
            }
            format!("Waited.\n{}", driver.describe_page(tab).await?)
        }
        PageOp::Evaluate { expression } => driver.evaluate_text(tab, expression).await?,
        PageOp::NetworkRequests => {
            requests_text(driver.evaluate_text(tab, NETWORK_REQUESTS_SCRIPT).await?)
        }
        PageOp::FileUpload { element, files } => {
            driver.upload(tab, element, files).await?;
            format!("Set {} file(s) on {element}.", files.len())
        }
        input => input_step(driver, tab, input).await?,
    })
}

/// A step that acts on the page as a person would (click, hover, drag,
/// type, press, select).
async fn input_step<D: PageDriver>(
    driver: &mut D,
    tab: &D::Tab,
    op: &PageOp,
) -> Result<String, PageError> {
    Ok(match op {
        PageOp::Click { element, double } => {
            let at = driver.center_of(tab, element).await?;
            driver
                .click_at(tab, at, if *double { 2 } else { 1 })
                .await?;
            driver.settle(tab).await;
            format!("Clicked {element}.\n{}", driver.describe_page(tab).await?)
        }
        PageOp::Hover { element } => {
            let at = driver.center_of(tab, element).await?;
            driver.move_to(tab, at).await?;
            format!("Hovering over {element}.")
        }
        PageOp::Drag { from, to } => {
            let start = driver.center_of(tab, from).await?;
            let end = driver.center_of(tab, to).await?;
            driver.drag_between(tab, start, end).await?;
            driver.settle(tab).await;
            format!("Dragged {from} onto {to}.")
        }
        PageOp::Type {
            element,
            text,
            submit,
        } => {
            driver.type_into(tab, element, text, *submit).await?;
            if *submit {
                driver.settle(tab).await;
            }
            format!(
                "Typed into {element}.\n{}",
                driver.describe_page(tab).await?
            )
        }
        PageOp::PressKey { key } => {
            driver.press(tab, key).await?;
            driver.settle(tab).await;
            format!("Pressed {key}.\n{}", driver.describe_page(tab).await?)
        }
        PageOp::SelectOption { element, values } => {
            driver.select(tab, element, values).await?;
            format!("Selected {values:?} in {element}.")
        }
        other => unreachable!("{other:?} is answered by browser_step or tab_step"),
    })
}
