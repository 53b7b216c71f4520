//! REST actions on the node: one job (screenshot, PDF, rendered HTML,
//! scrape) on an instance's browser, which the control plane borrowed for
//! it and deletes afterwards. The job drives the browser over the agent's
//! own DevTools connections; the browser keeps its sandbox and egress
//! policy, so the page's traffic goes where any of the instance's would.
//!
//! Two connections: the page's (lifecycle, the result, through the page
//! layer `engine::page`) and an interceptor's (`engine::intercept`), which
//! serves an `html` job's document, fails `block`ed requests and adds
//! `headers`.
//!
//! Everything runs within the request's `timeout_ms`; a result larger than
//! `agent.action_max_output_bytes` is refused while it arrives.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use serde_json::{Value, json};
use tokio::time::Instant;

use flotilla_api_types::actions::{
    ActionKind, ActionRequest, AgentAction, HTML_URL, ScrapeResponse, WaitUntil,
};

use crate::engine::browser::CdpEndpoint;
use crate::engine::cdp::{CdpClient, CdpError};
use crate::engine::page::{
    AbortOnDrop, Browser, LoadedAt, NavigateError, Page, Within, dismiss_dialogs,
};

/// A job's result: the body of the answer and its type.
#[derive(Debug)]
pub struct ActionOutput {
    pub content_type: &'static str,
    pub body: Vec<u8>,
}

/// The node's bounds on a job's result.
#[derive(Debug, Clone, Copy)]
pub struct ActionBounds {
    /// Largest result (image, PDF, HTML, scrape JSON), in bytes.
    pub max_output_bytes: u64,
    /// Largest screenshot in pixels (`agent.screenshot_max_pixels`): larger
    /// is captured scaled down to fit.
    pub max_pixels: u64,
}

/// Why a job gave no result. Each message says what to change.
#[derive(Debug, thiserror::Error)]
pub enum ActionError {
    /// 400: a selector the browser does not parse.
    #[error("{field} is not a valid CSS selector: {message}")]
    BadSelector { field: String, message: String },
    /// 400: `selector` matched nothing to capture.
    #[error("selector {selector:?} matches no element with a size on the page")]
    NoElement { selector: String },
    /// 502: the page could not be loaded at all.
    #[error("the page at {url} could not be loaded: {reason}")]
    Navigation { url: String, reason: String },
    /// 504.
    #[error("{stage} did not finish within timeout_ms ({timeout_ms} ms)")]
    Timeout {
        stage: &'static str,
        timeout_ms: u64,
    },
    /// 413: the result would be larger than the node sends.
    #[error(
        "the result is larger than agent.action_max_output_bytes ({0} bytes): use a smaller viewport or page"
    )]
    TooLarge(u64),
    /// 400: Chromium refused the request's `cookies`.
    #[error("cookies: the browser refused them: {0}")]
    BadCookies(String),
    #[error("headers: the browser refused them: {0}")]
    BadHeaders(String),
    /// 409: the node runs no real browser (the sim runtime).
    #[error("this node's runtime has no real browser to run the action in")]
    NoBrowser,
    /// 502: the instance's browser did not start (or ended).
    #[error("the browser for the action did not start: {0}")]
    NotStarted(String),
    /// 502: the browser failed the job.
    #[error("the browser failed the action: {}", crate::engine::page::describe(.0))]
    Browser(CdpError),
    /// 400: an option of the request that Firefox's job does not take.
    #[error("{option} is not taken by a Firefox action: {why} (use a Chromium image)")]
    NotInFirefox {
        option: &'static str,
        why: &'static str,
    },
    /// 502: Firefox failed the job (see [`crate::protocols::firefox_actions`]).
    #[error("Firefox failed the action: {0}")]
    Firefox(#[from] crate::engine::bidi::BidiError),
}

impl From<CdpError> for ActionError {
    fn from(error: CdpError) -> Self {
        Self::Browser(error)
    }
}

/// Runs `action` on the browser at `endpoint`, within its `timeout_ms`.
pub async fn run(
    endpoint: &CdpEndpoint,
    action: &AgentAction,
    bounds: ActionBounds,
) -> Result<ActionOutput, ActionError> {
    let timeout_ms = action.request.timeout_ms();
    let deadline = Instant::now() + Duration::from_millis(timeout_ms);
    let stage = Mutex::new("connecting to the browser");
    let job = Job {
        request: &action.request,
        deadline,
        stage: &stage,
        bounds,
    };
    let outcome = tokio::time::timeout_at(deadline, job.run(endpoint, action.kind)).await;
    let timed_out = || ActionError::Timeout {
        stage: *stage.lock().expect("stage lock"),
        timeout_ms,
    };
    match outcome {
        Err(_) | Ok(Err(ActionError::Browser(CdpError::Timeout { .. }))) => Err(timed_out()),
        Ok(Err(ActionError::Browser(CdpError::MessageTooLarge))) => {
            Err(ActionError::TooLarge(bounds.max_output_bytes))
        }
        Ok(other) => other,
    }
}

/// One job in progress.
struct Job<'a> {
    request: &'a ActionRequest,
    deadline: Instant,
    /// What the job waits for now (named if the deadline passes).
    stage: &'a Mutex<&'static str>,
    bounds: ActionBounds,
}

/// The page a job drives: its connection and flat session.
struct JobPage {
    client: Arc<CdpClient>,
    session: String,
}

impl JobPage {
    /// The page, within the job's time.
    fn on(&self, job: &Job<'_>) -> Page<'_> {
        Page::new(&self.client, &self.session, Within::Deadline(job.deadline))
    }

    /// Evaluates `expression` in the page, awaiting a promise; its value.
    async fn evaluate(&self, expression: &str, job: &Job<'_>) -> Result<Value, ActionError> {
        Ok(self.on(job).evaluate_value(expression).await?)
    }
}

impl Job<'_> {
    fn remaining(&self) -> Duration {
        self.deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1))
    }

    fn at(&self, stage: &'static str) {
        *self.stage.lock().expect("stage lock") = stage;
    }

    async fn run(
        &self,
        endpoint: &CdpEndpoint,
        kind: ActionKind,
    ) -> Result<ActionOutput, ActionError> {
        // A result of max_output_bytes, base64 in a JSON message.
        let max_message = (self.bounds.max_output_bytes as usize / 3 + 1) * 4 + 64 * 1024;
        let client = CdpClient::open_limited(endpoint, &endpoint.browser_path, max_message).await?;
        self.at("opening the page");
        let target = page_target(&client, self).await?;
        let session = client.attach(&target, self.remaining()).await?;
        let page = JobPage {
            client: Arc::new(client),
            session,
        };
        // Selectors are parsed on the blank page, before anything of the
        // site runs (a page's script cannot change the verdict).
        self.check_selectors(&page, kind).await?;
        let _interceptor = self.intercept(endpoint, &target).await?;
        let _dialogs = dismiss_dialogs(page.client.clone(), page.session.clone());
        self.prepare(&page).await?;
        self.at("loading the page");
        self.load(&page).await?;
        if let Some(selector) = &self.request.wait_for_selector {
            self.at("waiting for wait_for_selector");
            page.evaluate(&wait_for_selector_script(selector), self)
                .await?;
        }
        self.at("making the result");
        match kind {
            ActionKind::Screenshot => self.screenshot(&page).await,
            ActionKind::Pdf => self.pdf(&page).await,
            ActionKind::Content => self.content(&page).await,
            ActionKind::Scrape => self.scrape(&page).await,
        }
    }

    /// Viewport, user agent and cookies, before anything loads.
    async fn prepare(&self, page: &JobPage) -> Result<(), ActionError> {
        let on = page.on(self);
        on.enable().await?;
        let viewport = self.request.viewport();
        let scale = viewport.device_scale_factor.unwrap_or(1.0);
        on.emulate_viewport(viewport.width, viewport.height, scale)
            .await?;
        if let Some(user_agent) = &self.request.user_agent {
            on.set_user_agent(user_agent).await?;
        }
        if !self.request.cookies.is_empty() {
            let page_url = self.request.url.as_deref().unwrap_or(HTML_URL);
            let cookies: Vec<Value> = self
                .request
                .cookies
                .iter()
                .map(|cookie| {
                    let mut value = json!({
                        "name": cookie.name,
                        "value": cookie.value,
                        "secure": cookie.secure,
                        "httpOnly": cookie.http_only,
                    });
                    match (&cookie.url, &cookie.domain) {
                        (Some(url), _) => value["url"] = json!(url),
                        (None, Some(domain)) => value["domain"] = json!(domain),
                        (None, None) => value["url"] = json!(page_url),
                    }
                    value["path"] = json!(cookie.path.as_deref().unwrap_or("/"));
                    value
                })
                .collect();
            on.set_cookies(cookies).await.map_err(|error| match error {
                CdpError::Protocol { message, .. } => ActionError::BadCookies(message),
                other => ActionError::Browser(other),
            })?;
        }
        Ok(())
    }

    /// Navigates to the job's page and waits for its `wait_until` event.
    async fn load(&self, page: &JobPage) -> Result<(), ActionError> {
        let url = self.request.url.as_deref().unwrap_or(HTML_URL);
        let until = match self.request.wait_until.unwrap_or_default() {
            WaitUntil::Load => LoadedAt::Load,
            WaitUntil::Domcontentloaded => LoadedAt::DomContentLoaded,
            WaitUntil::Networkidle => LoadedAt::NetworkIdle,
        };
        page.on(self)
            .navigate(url, until)
            .await
            .map_err(|error| match error {
                NavigateError::Refused(reason) => ActionError::Navigation {
                    url: url.to_owned(),
                    reason,
                },
                NavigateError::Browser(error) => error.into(),
            })
    }

    /// Every selector of the request, parsed by the page itself: a refusal
    /// names its field.
    async fn check_selectors(&self, page: &JobPage, kind: ActionKind) -> Result<(), ActionError> {
        let fields = selector_fields(self.request, kind);
        if fields.is_empty() {
            return Ok(());
        }
        let script = selector_check_script(&fields);
        let refusals = page.evaluate(&script, self).await?;
        first_bad_selector(fields, &refusals)
    }

    async fn screenshot(&self, page: &JobPage) -> Result<ActionOutput, ActionError> {
        let format = self.request.format.unwrap_or_default();
        let mut params = json!({"format": format.as_str()});
        if let Some(quality) = self.request.quality {
            params["quality"] = json!(quality);
        }
        let scale = self.request.viewport().device_scale_factor.unwrap_or(1.0);
        let area = if let Some(selector) = &self.request.selector {
            let rect = page.evaluate(&element_box_script(selector), self).await?;
            let side = |i: usize| rect[i].as_f64().unwrap_or(0.0);
            if rect.is_null() || side(2) < 1.0 || side(3) < 1.0 {
                return Err(ActionError::NoElement {
                    selector: selector.clone(),
                });
            }
            Some((side(0), side(1), side(2), side(3)))
        } else if self.request.full_page == Some(true) {
            let metrics = page.on(self).layout_metrics().await?;
            let size = &metrics["cssContentSize"];
            Some((
                0.0,
                0.0,
                size["width"].as_f64().unwrap_or(1.0).max(1.0),
                size["height"].as_f64().unwrap_or(1.0).max(1.0),
            ))
        } else {
            let viewport = self.request.viewport();
            let pixels = f64::from(viewport.width) * f64::from(viewport.height) * scale * scale;
            if pixels > self.bounds.max_pixels as f64 {
                let metrics = page.on(self).layout_metrics().await?;
                let visible = &metrics["cssVisualViewport"];
                let number = |name: &str| visible[name].as_f64().unwrap_or(0.0);
                Some((
                    number("pageX"),
                    number("pageY"),
                    number("clientWidth"),
                    number("clientHeight"),
                ))
            } else {
                None
            }
        };
        if let Some((x, y, width, height)) = area {
            // A clip's scale is in CSS pixels: the device scale, lowered to
            // fit the pixel cap.
            let fitting = crate::engine::capture::fitting_scale(
                width * height * scale * scale,
                self.bounds.max_pixels,
            );
            params["clip"] = json!({
                "x": x, "y": y, "width": width, "height": height, "scale": scale * fitting,
            });
            params["captureBeyondViewport"] = json!(true);
        }
        let shot = page.on(self).screenshot(params).await?;
        Ok(ActionOutput {
            content_type: format.content_type(),
            body: self.decoded(&shot)?,
        })
    }

    async fn pdf(&self, page: &JobPage) -> Result<ActionOutput, ActionError> {
        let (mut width, mut height) = self.request.page_size.unwrap_or_default().inches();
        let landscape = self.request.landscape.unwrap_or(false);
        if landscape {
            std::mem::swap(&mut width, &mut height);
        }
        let margins = self.request.margins_mm.unwrap_or_default();
        let inch = |mm: f64| mm / 25.4;
        let printed = page
            .on(self)
            .print_pdf(json!({
                    "paperWidth": width,
                    "paperHeight": height,
                    "marginTop": inch(margins.top),
                    "marginRight": inch(margins.right),
                    "marginBottom": inch(margins.bottom),
                    "marginLeft": inch(margins.left),
                    "printBackground": self.request.print_background.unwrap_or(false),
                    "preferCSSPageSize": false,
            }))
            .await?;
        Ok(ActionOutput {
            content_type: "application/pdf",
            body: self.decoded(&printed)?,
        })
    }

    async fn content(&self, page: &JobPage) -> Result<ActionOutput, ActionError> {
        let html = page.evaluate(CONTENT_SCRIPT, self).await?;
        let body = html.as_str().unwrap_or_default().as_bytes().to_vec();
        self.bounded(ActionOutput {
            content_type: "text/html; charset=utf-8",
            body,
        })
    }

    async fn scrape(&self, page: &JobPage) -> Result<ActionOutput, ActionError> {
        let selectors: Vec<&str> = self
            .request
            .elements
            .iter()
            .map(|element| element.selector.as_str())
            .collect();
        let elements = page.evaluate(&scrape_script(&selectors), self).await?;
        self.bounded(scraped(elements)?)
    }

    fn decoded(&self, data: &Value) -> Result<Vec<u8>, ActionError> {
        decoded(data, self.bounds).map_err(|error| match error {
            Undecodable::NotBase64(message) => ActionError::Browser(CdpError::Protocol {
                method: "result".into(),
                message,
            }),
            Undecodable::Action(error) => error,
        })
    }

    fn bounded(&self, output: ActionOutput) -> Result<ActionOutput, ActionError> {
        bounded(output, self.bounds)
    }

    /// Starts the interceptor when the job serves html, blocks requests or
    /// adds headers; it stops when the returned guard drops.
    async fn intercept(
        &self,
        endpoint: &CdpEndpoint,
        target: &str,
    ) -> Result<Option<AbortOnDrop>, ActionError> {
        let within = Within::Deadline(self.deadline);
        Ok(crate::engine::intercept::start(endpoint, target, self.request, within).await?)
    }
}

/// The page target a job uses: the browser's first page (a warm browser
/// has one open), or a new one.
async fn page_target(client: &CdpClient, job: &Job<'_>) -> Result<String, ActionError> {
    let browser = Browser::new(client, Within::Deadline(job.deadline));
    if let Some(first) = browser.pages().await?.into_iter().next() {
        return Ok(first.id);
    }
    Ok(browser.open_blank().await?)
}

/// Why a result's `data` is not a result.
pub(crate) enum Undecodable {
    /// Not base64 (the browser's fault: each engine says it its way).
    NotBase64(String),
    Action(ActionError),
}

/// A result's base64 `data`, decoded, within `bounds`.
pub(crate) fn decoded(data: &Value, bounds: ActionBounds) -> Result<Vec<u8>, Undecodable> {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(data.as_str().unwrap_or_default())
        .map_err(|e| Undecodable::NotBase64(format!("not base64: {e}")))?;
    let output = ActionOutput {
        content_type: "",
        body: bytes,
    };
    bounded(output, bounds)
        .map(|output| output.body)
        .map_err(Undecodable::Action)
}

/// `output` if it is at most `agent.action_max_output_bytes`.
pub(crate) fn bounded(
    output: ActionOutput,
    bounds: ActionBounds,
) -> Result<ActionOutput, ActionError> {
    if output.body.len() as u64 > bounds.max_output_bytes {
        return Err(ActionError::TooLarge(bounds.max_output_bytes));
    }
    Ok(output)
}

/// The page's document as HTML, its doctype first.
pub(crate) const CONTENT_SCRIPT: &str = "(document.doctype ? new XMLSerializer().serializeToString(document.doctype) + '\\n' : '') + (document.documentElement ? document.documentElement.outerHTML : '')";

/// The request's selectors of a `kind` job, each with the field it is in.
pub(crate) fn selector_fields(request: &ActionRequest, kind: ActionKind) -> Vec<(String, &str)> {
    let mut fields: Vec<(String, &str)> = Vec::new();
    if let Some(selector) = &request.wait_for_selector {
        fields.push(("wait_for_selector".into(), selector));
    }
    if kind == ActionKind::Screenshot
        && let Some(selector) = &request.selector
    {
        fields.push(("selector".into(), selector));
    }
    if kind == ActionKind::Scrape {
        for (index, element) in request.elements.iter().enumerate() {
            fields.push((format!("elements[{index}].selector"), &element.selector));
        }
    }
    fields
}

/// Parses each selector of `fields` in the page: per selector, `null` or
/// why the page refuses it.
pub(crate) fn selector_check_script(fields: &[(String, &str)]) -> String {
    let selectors: Vec<&str> = fields.iter().map(|(_, selector)| *selector).collect();
    format!(
        "({}).map((s) => {{ try {{ document.createDocumentFragment().querySelector(s); return null; }} catch (e) {{ return String(e.message); }} }})",
        json!(selectors)
    )
}

/// The first refusal of [`selector_check_script`]'s answer, naming its
/// field.
pub(crate) fn first_bad_selector(
    fields: Vec<(String, &str)>,
    refusals: &Value,
) -> Result<(), ActionError> {
    for ((field, _), refusal) in fields
        .into_iter()
        .zip(refusals.as_array().into_iter().flatten())
    {
        if let Some(message) = refusal.as_str() {
            return Err(ActionError::BadSelector {
                field,
                message: message.to_owned(),
            });
        }
    }
    Ok(())
}

/// The box (`[x, y, width, height]` in the document) of the first element
/// matching `selector`, or `null`.
pub(crate) fn element_box_script(selector: &str) -> String {
    format!(
        "(() => {{ const e = document.querySelector({}); if (!e) return null; const r = e.getBoundingClientRect(); return [r.left + scrollX, r.top + scrollY, r.width, r.height]; }})()",
        json!(selector)
    )
}

/// Every match of each of `selectors` (at most 1000 each): text, HTML,
/// attributes and box.
pub(crate) fn scrape_script(selectors: &[&str]) -> String {
    format!(
        r#"({}).map((selector) => ({{
            selector,
            matches: Array.from(document.querySelectorAll(selector)).slice(0, 1000).map((e) => {{
                const r = e.getBoundingClientRect();
                const attributes = {{}};
                for (const a of e.attributes) attributes[a.name] = a.value;
                return {{
                    text: typeof e.innerText === 'string' ? e.innerText : (e.textContent || ''),
                    html: e.outerHTML,
                    attributes,
                    box: {{ x: r.left + scrollX, y: r.top + scrollY, width: r.width, height: r.height }},
                }};
            }}),
        }}))"#,
        json!(selectors)
    )
}

/// A scrape's answer from [`scrape_script`]'s value.
pub(crate) fn scraped(elements: Value) -> Result<ActionOutput, ActionError> {
    let answer: ScrapeResponse =
        serde_json::from_value(json!({"elements": elements})).map_err(|e| {
            ActionError::Browser(CdpError::Protocol {
                method: "the scrape script".into(),
                message: format!("unexpected scrape result: {e}"),
            })
        })?;
    Ok(ActionOutput {
        content_type: "application/json",
        body: serde_json::to_vec(&answer).expect("a scrape result serialises"),
    })
}

/// A promise that settles when an element matches `selector`.
pub(crate) fn wait_for_selector_script(selector: &str) -> String {
    format!(
        "((s) => new Promise((resolve) => {{
            if (document.querySelector(s)) return resolve(true);
            const observer = new MutationObserver(() => {{
                if (document.querySelector(s)) {{ observer.disconnect(); resolve(true); }}
            }});
            observer.observe(document, {{ childList: true, subtree: true, attributes: true }});
        }}))({})",
        json!(selector)
    )
}
