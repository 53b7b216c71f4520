//! REST actions on the node: one job (screenshot, PDF, rendered HTML,
//! scrape) on an instance's browser, which the control plane borrowed for
//! it and deletes afterwards. The job drives the browser over the agent's
//! own DevTools connections; the browser keeps its sandbox and egress
//! policy, so the page's traffic goes where any of the instance's would.
//!
//! Two connections: the page's (lifecycle, the result) and an
//! interceptor's, which alone sees `Fetch.requestPaused`, so a page with many
//! requests never crowds out the lifecycle events the job waits on. The
//! interceptor serves an `html` job's document, fails `block`ed requests and
//! adds `headers`.
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
use crate::engine::cdp::{CdpClient, CdpError, CdpEvent};
use crate::engine::page::{AbortOnDrop, dismiss_dialogs};

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
    /// 409: the node runs no real browser (the sim runtime).
    #[error("this node's runtime has no real browser to run the action in")]
    NoBrowser,
    /// 502: the instance's browser did not start (or ended).
    #[error("the browser for the action did not start: {0}")]
    NotStarted(String),
    /// 502: the browser failed the job.
    #[error("the browser failed the action: {}", crate::engine::page::describe(.0))]
    Browser(CdpError),
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
struct Page {
    client: Arc<CdpClient>,
    session: String,
}

impl Page {
    async fn call(&self, method: &str, params: Value, job: &Job<'_>) -> Result<Value, CdpError> {
        self.client
            .call(method, params, Some(&self.session), job.remaining())
            .await
    }

    /// Evaluates `expression` in the page, awaiting a promise; its value.
    async fn evaluate(&self, expression: &str, job: &Job<'_>) -> Result<Value, ActionError> {
        let answer = self
            .call(
                "Runtime.evaluate",
                json!({"expression": expression, "returnByValue": true, "awaitPromise": true}),
                job,
            )
            .await?;
        if let Some(details) = answer.get("exceptionDetails") {
            return Err(ActionError::Browser(CdpError::Protocol {
                method: "Runtime.evaluate".into(),
                message: crate::engine::page::exception_text(details),
            }));
        }
        Ok(answer["result"]["value"].clone())
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
        let page = Page {
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
    async fn prepare(&self, page: &Page) -> Result<(), ActionError> {
        page.call("Page.enable", json!({}), self).await?;
        page.call(
            "Page.setLifecycleEventsEnabled",
            json!({"enabled": true}),
            self,
        )
        .await?;
        let viewport = self.request.viewport();
        page.call(
            "Emulation.setDeviceMetricsOverride",
            json!({
                "width": viewport.width,
                "height": viewport.height,
                "deviceScaleFactor": viewport.device_scale_factor.unwrap_or(1.0),
                "mobile": false,
            }),
            self,
        )
        .await?;
        if let Some(user_agent) = &self.request.user_agent {
            page.call(
                "Emulation.setUserAgentOverride",
                json!({"userAgent": user_agent}),
                self,
            )
            .await?;
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
            page.call("Network.setCookies", json!({"cookies": cookies}), self)
                .await
                .map_err(|error| match error {
                    CdpError::Protocol { message, .. } => ActionError::BadCookies(message),
                    other => ActionError::Browser(other),
                })?;
        }
        Ok(())
    }

    /// Navigates to the job's page and waits for its `wait_until` event.
    async fn load(&self, page: &Page) -> Result<(), ActionError> {
        let url = self.request.url.as_deref().unwrap_or(HTML_URL);
        let awaited = match self.request.wait_until.unwrap_or_default() {
            WaitUntil::Load => "load",
            WaitUntil::Domcontentloaded => "DOMContentLoaded",
            WaitUntil::Networkidle => "networkIdle",
        };
        let mut events = page.client.events();
        let navigated = page
            .call("Page.navigate", json!({"url": url}), self)
            .await?;
        if let Some(reason) = navigated["errorText"].as_str().filter(|t| !t.is_empty()) {
            return Err(ActionError::Navigation {
                url: url.to_owned(),
                reason: reason.to_owned(),
            });
        }
        crate::engine::page::wait_loaded(&mut events, &page.session, &navigated, awaited).await?;
        Ok(())
    }

    /// Every selector of the request, parsed by the page itself: a refusal
    /// names its field.
    async fn check_selectors(&self, page: &Page, kind: ActionKind) -> Result<(), ActionError> {
        let mut fields: Vec<(String, &str)> = Vec::new();
        if let Some(selector) = &self.request.wait_for_selector {
            fields.push(("wait_for_selector".into(), selector));
        }
        if kind == ActionKind::Screenshot
            && let Some(selector) = &self.request.selector
        {
            fields.push(("selector".into(), selector));
        }
        if kind == ActionKind::Scrape {
            for (index, element) in self.request.elements.iter().enumerate() {
                fields.push((format!("elements[{index}].selector"), &element.selector));
            }
        }
        if fields.is_empty() {
            return Ok(());
        }
        let selectors: Vec<&str> = fields.iter().map(|(_, selector)| *selector).collect();
        let script = format!(
            "({}).map((s) => {{ try {{ document.createDocumentFragment().querySelector(s); return null; }} catch (e) {{ return String(e.message); }} }})",
            json!(selectors)
        );
        let refusals = page.evaluate(&script, self).await?;
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

    async fn screenshot(&self, page: &Page) -> Result<ActionOutput, ActionError> {
        let format = self.request.format.unwrap_or_default();
        let mut params = json!({"format": format.as_str()});
        if let Some(quality) = self.request.quality {
            params["quality"] = json!(quality);
        }
        let scale = self.request.viewport().device_scale_factor.unwrap_or(1.0);
        let area = if let Some(selector) = &self.request.selector {
            let script = format!(
                "(() => {{ const e = document.querySelector({}); if (!e) return null; const r = e.getBoundingClientRect(); return [r.left + scrollX, r.top + scrollY, r.width, r.height]; }})()",
                json!(selector)
            );
            let rect = page.evaluate(&script, self).await?;
            let side = |i: usize| rect[i].as_f64().unwrap_or(0.0);
            if rect.is_null() || side(2) < 1.0 || side(3) < 1.0 {
                return Err(ActionError::NoElement {
                    selector: selector.clone(),
                });
            }
            Some((side(0), side(1), side(2), side(3)))
        } else if self.request.full_page == Some(true) {
            let metrics = page.call("Page.getLayoutMetrics", json!({}), self).await?;
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
                let metrics = page.call("Page.getLayoutMetrics", json!({}), self).await?;
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
        let shot = page.call("Page.captureScreenshot", params, self).await?;
        Ok(ActionOutput {
            content_type: format.content_type(),
            body: self.decoded(&shot["data"])?,
        })
    }

    async fn pdf(&self, page: &Page) -> Result<ActionOutput, ActionError> {
        let (mut width, mut height) = self.request.page_size.unwrap_or_default().inches();
        let landscape = self.request.landscape.unwrap_or(false);
        if landscape {
            std::mem::swap(&mut width, &mut height);
        }
        let margins = self.request.margins_mm.unwrap_or_default();
        let inch = |mm: f64| mm / 25.4;
        let printed = page
            .call(
                "Page.printToPDF",
                json!({
                    "paperWidth": width,
                    "paperHeight": height,
                    "marginTop": inch(margins.top),
                    "marginRight": inch(margins.right),
                    "marginBottom": inch(margins.bottom),
                    "marginLeft": inch(margins.left),
                    "printBackground": self.request.print_background.unwrap_or(false),
                    "preferCSSPageSize": false,
                }),
                self,
            )
            .await?;
        Ok(ActionOutput {
            content_type: "application/pdf",
            body: self.decoded(&printed["data"])?,
        })
    }

    async fn content(&self, page: &Page) -> Result<ActionOutput, ActionError> {
        let html = page
            .evaluate(
                "(document.doctype ? new XMLSerializer().serializeToString(document.doctype) + '\\n' : '') + (document.documentElement ? document.documentElement.outerHTML : '')",
                self,
            )
            .await?;
        let body = html.as_str().unwrap_or_default().as_bytes().to_vec();
        self.bounded(ActionOutput {
            content_type: "text/html; charset=utf-8",
            body,
        })
    }

    async fn scrape(&self, page: &Page) -> Result<ActionOutput, ActionError> {
        let selectors: Vec<&str> = self
            .request
            .elements
            .iter()
            .map(|element| element.selector.as_str())
            .collect();
        let script = format!(
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
        );
        let elements = page.evaluate(&script, self).await?;
        let answer: ScrapeResponse = serde_json::from_value(json!({"elements": elements}))
            .map_err(|e| {
                ActionError::Browser(CdpError::Protocol {
                    method: "Runtime.evaluate".into(),
                    message: format!("unexpected scrape result: {e}"),
                })
            })?;
        self.bounded(ActionOutput {
            content_type: "application/json",
            body: serde_json::to_vec(&answer).expect("a scrape result serialises"),
        })
    }

    fn decoded(&self, data: &Value) -> Result<Vec<u8>, ActionError> {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(data.as_str().unwrap_or_default())
            .map_err(|e| {
                ActionError::Browser(CdpError::Protocol {
                    method: "result".into(),
                    message: format!("not base64: {e}"),
                })
            })?;
        self.bounded(ActionOutput {
            content_type: "",
            body: bytes,
        })
        .map(|output| output.body)
    }

    fn bounded(&self, output: ActionOutput) -> Result<ActionOutput, ActionError> {
        if output.body.len() as u64 > self.bounds.max_output_bytes {
            return Err(ActionError::TooLarge(self.bounds.max_output_bytes));
        }
        Ok(output)
    }

    /// Starts the interceptor when the job serves html, blocks requests or
    /// adds headers; it stops when the returned guard drops.
    async fn intercept(
        &self,
        endpoint: &CdpEndpoint,
        target: &str,
    ) -> Result<Option<AbortOnDrop>, ActionError> {
        let rules = Interception::of(self.request);
        if rules.patterns.is_empty() {
            return Ok(None);
        }
        // It reads only paused requests (each with its headers); the html
        // document goes the other way, in a command.
        let client =
            CdpClient::open_with_events(endpoint, &endpoint.browser_path, 4 << 20, 1024).await?;
        let session = client.attach(target, self.remaining()).await?;
        let events = client.events();
        client
            .call(
                "Fetch.enable",
                json!({"patterns": rules.patterns}),
                Some(&session),
                self.remaining(),
            )
            .await?;
        let task = tokio::spawn(rules.serve(client, session, events));
        Ok(Some(AbortOnDrop(task)))
    }
}

/// The page target a job uses: the browser's first page (a warm browser
/// has one open), or a new one.
async fn page_target(client: &CdpClient, job: &Job<'_>) -> Result<String, ActionError> {
    let targets = client
        .call("Target.getTargets", json!({}), None, job.remaining())
        .await?;
    let existing = targets["targetInfos"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|info| info["type"] == "page")
        .and_then(|info| info["targetId"].as_str())
        .map(str::to_owned);
    if let Some(target) = existing {
        return Ok(target);
    }
    let created = client
        .call(
            "Target.createTarget",
            json!({"url": "about:blank"}),
            None,
            job.remaining(),
        )
        .await?;
    Ok(created["targetId"].as_str().unwrap_or_default().to_owned())
}

/// A promise that settles when an element matches `selector`.
fn wait_for_selector_script(selector: &str) -> String {
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

/// What the interceptor does with each paused request.
struct Interception {
    /// `Fetch.enable`'s patterns: only what the rules act on is paused.
    patterns: Vec<Value>,
    html: Option<String>,
    block_types: Vec<String>,
    block_urls: Vec<String>,
    headers: Vec<(String, String)>,
}

impl Interception {
    fn of(request: &ActionRequest) -> Self {
        let (block_types, block_urls): (Vec<String>, Vec<String>) =
            request.block.iter().cloned().partition(|entry| {
                flotilla_api_types::actions::RESOURCE_TYPES.contains(&entry.as_str())
            });
        let headers: Vec<(String, String)> = request
            .headers
            .iter()
            .map(|(name, value)| (name.clone(), value.clone()))
            .collect();
        let mut patterns = Vec::new();
        if !headers.is_empty() {
            patterns.push(json!({"urlPattern": "*", "requestStage": "Request"}));
        } else {
            for url in &block_urls {
                patterns.push(json!({"urlPattern": url, "requestStage": "Request"}));
            }
            for kind in &block_types {
                patterns.push(json!({
                    "urlPattern": "*",
                    "resourceType": chromium_resource_type(kind),
                    "requestStage": "Request",
                }));
            }
            if request.html.is_some() {
                patterns
                    .push(json!({"urlPattern": format!("{HTML_URL}*"), "requestStage": "Request"}));
            }
        }
        Self {
            patterns,
            html: request.html.clone(),
            block_types,
            block_urls,
            headers,
        }
    }

    /// Answers every paused request until the connection closes or the
    /// task is aborted.
    async fn serve(
        self,
        client: CdpClient,
        session: String,
        mut events: tokio::sync::broadcast::Receiver<CdpEvent>,
    ) {
        loop {
            let event = match events.recv().await {
                Ok(event) => event,
                Err(tokio::sync::broadcast::error::RecvError::Lagged(missed)) => {
                    tracing::warn!(missed, "the action's interceptor missed paused requests");
                    continue;
                }
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
            };
            if event.method != "Fetch.requestPaused" {
                continue;
            }
            // Sent without waiting for the answer: one slow answer holds up
            // no other request.
            let (method, params) = self.decide(&event.params);
            if client
                .send_in(method, params, Some(&session))
                .await
                .is_err()
            {
                return;
            }
        }
    }

    /// The command that releases one paused request.
    fn decide(&self, paused: &Value) -> (&'static str, Value) {
        let id = paused["requestId"].clone();
        let url = paused["request"]["url"].as_str().unwrap_or_default();
        let kind = paused["resourceType"]
            .as_str()
            .unwrap_or_default()
            .to_ascii_lowercase();
        if let Some(html) = &self.html
            && url.starts_with(HTML_URL)
        {
            if url == HTML_URL && kind == "document" {
                return (
                    "Fetch.fulfillRequest",
                    json!({
                        "requestId": id,
                        "responseCode": 200,
                        "responseHeaders": [{"name": "Content-Type", "value": "text/html; charset=utf-8"}],
                        "body": base64::engine::general_purpose::STANDARD.encode(html),
                    }),
                );
            }
            // Nothing else exists at the document's made-up origin.
            return failed(id);
        }
        let blocked = self.block_types.contains(&kind)
            || self
                .block_urls
                .iter()
                .any(|pattern| glob_matches(pattern, url));
        if blocked {
            return failed(id);
        }
        let mut params = json!({"requestId": id});
        if !self.headers.is_empty() {
            let mut headers: Vec<Value> = paused["request"]["headers"]
                .as_object()
                .into_iter()
                .flatten()
                .filter(|(name, _)| {
                    !self
                        .headers
                        .iter()
                        .any(|(extra, _)| extra.eq_ignore_ascii_case(name))
                })
                .map(|(name, value)| json!({"name": name, "value": value}))
                .collect();
            headers.extend(
                self.headers
                    .iter()
                    .map(|(name, value)| json!({"name": name, "value": value})),
            );
            params["headers"] = Value::Array(headers);
        }
        ("Fetch.continueRequest", params)
    }
}

fn failed(id: Value) -> (&'static str, Value) {
    (
        "Fetch.failRequest",
        json!({"requestId": id, "errorReason": "BlockedByClient"}),
    )
}

/// Chromium's name of a resource type given in lower case.
fn chromium_resource_type(kind: &str) -> &'static str {
    match kind {
        "document" => "Document",
        "stylesheet" => "Stylesheet",
        "image" => "Image",
        "media" => "Media",
        "font" => "Font",
        "script" => "Script",
        "texttrack" => "TextTrack",
        "xhr" => "XHR",
        "fetch" => "Fetch",
        "eventsource" => "EventSource",
        "websocket" => "WebSocket",
        "manifest" => "Manifest",
        _ => "Other",
    }
}

/// Whether `text` matches `pattern`, where `*` matches any run of
/// characters and `?` any one (Chromium's URL patterns).
fn glob_matches(pattern: &str, text: &str) -> bool {
    let pattern: Vec<char> = pattern.chars().collect();
    let text: Vec<char> = text.chars().collect();
    let (mut p, mut t) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        if p < pattern.len() && (pattern[p] == '?' || pattern[p] == text[t]) {
            p += 1;
            t += 1;
        } else if p < pattern.len() && pattern[p] == '*' {
            star = Some((p, t));
            p += 1;
        } else if let Some((star_p, star_t)) = star {
            p = star_p + 1;
            t = star_t + 1;
            star = Some((star_p, star_t + 1));
        } else {
            return false;
        }
    }
    pattern[p..].iter().all(|c| *c == '*')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_patterns_match_like_chromiums() {
        assert!(glob_matches(
            "*://ads.example.com/*",
            "https://ads.example.com/a.js"
        ));
        assert!(!glob_matches(
            "*://ads.example.com/*",
            "https://example.com/ads.example.com"
        ));
        assert!(glob_matches("*.png", "http://a.test/x.png"));
        assert!(!glob_matches("*.png", "http://a.test/x.png?y"));
        assert!(glob_matches("http://a.test/?", "http://a.test/b"));
        assert!(glob_matches("*", ""));
    }

    #[test]
    fn only_what_the_rules_act_on_is_paused() {
        let parse =
            |body: serde_json::Value| -> ActionRequest { serde_json::from_value(body).unwrap() };
        let nothing = Interception::of(&parse(json!({"url": "http://a.test/"})));
        assert!(nothing.patterns.is_empty(), "no interceptor without rules");
        let rules = Interception::of(&parse(json!({
            "html": "<p>",
            "block": ["image", "*://ads.test/*"],
        })));
        assert_eq!(
            rules.patterns,
            vec![
                json!({"urlPattern": "*://ads.test/*", "requestStage": "Request"}),
                json!({"urlPattern": "*", "resourceType": "Image", "requestStage": "Request"}),
                json!({"urlPattern": format!("{HTML_URL}*"), "requestStage": "Request"}),
            ]
        );
        // Extra headers go on every request: everything is paused.
        let headers = Interception::of(&parse(
            json!({"url": "http://a.test/", "headers": {"x-a": "1"}}),
        ));
        assert_eq!(
            headers.patterns,
            vec![json!({"urlPattern": "*", "requestStage": "Request"})]
        );
    }

    #[test]
    fn paused_requests_are_served_blocked_or_given_headers() {
        let request: ActionRequest = serde_json::from_value(json!({
            "html": "<p>hi</p>",
            "block": ["image", "*://ads.test/*"],
            "headers": {"X-Extra": "1"},
        }))
        .unwrap();
        let rules = Interception::of(&request);
        let paused = |url: &str, kind: &str| json!({"requestId": "r", "resourceType": kind, "request": {"url": url, "headers": {"x-extra": "0", "Accept": "*/*"}}});
        let (method, params) = rules.decide(&paused(HTML_URL, "Document"));
        assert_eq!(method, "Fetch.fulfillRequest");
        let body = base64::engine::general_purpose::STANDARD
            .decode(params["body"].as_str().unwrap())
            .unwrap();
        assert_eq!(body, b"<p>hi</p>");
        assert_eq!(
            rules
                .decide(&paused(&format!("{HTML_URL}x.css"), "Stylesheet"))
                .0,
            "Fetch.failRequest"
        );
        assert_eq!(
            rules.decide(&paused("http://a.test/i.png", "Image")).0,
            "Fetch.failRequest"
        );
        assert_eq!(
            rules.decide(&paused("https://ads.test/a.js", "Script")).0,
            "Fetch.failRequest"
        );
        let (method, params) = rules.decide(&paused("http://a.test/a.js", "Script"));
        assert_eq!(method, "Fetch.continueRequest");
        let headers = params["headers"].as_array().unwrap();
        assert_eq!(
            headers.len(),
            2,
            "the extra header replaces the page's: {headers:?}"
        );
        assert!(headers.contains(&json!({"name": "X-Extra", "value": "1"})));
    }
}
