//! REST actions in a Firefox instance (`"image": "firefox"`), over WebDriver
//! BiDi in a session of the agent's own (the action's instance has no other
//! client). The same job as [`crate::protocols::actions`] runs in Chromium,
//! step for step where BiDi has the step: the viewport
//! (`browsingContext.setViewport`), the user agent
//! (`emulation.setUserAgentOverride`), cookies (`storage.setCookie`), the load
//! (`browsingContext.navigate`, `wait: complete` or `interactive`), the
//! selectors and scripts (`script.evaluate`, the same scripts as Chromium's
//! job), screenshots (`browsingContext.captureScreenshot`), PDFs
//! (`browsingContext.print`), `block` (every request of the tab held by
//! `network.addIntercept` and failed or let through, [`Blocker`]). What it
//! has not is refused before the browser is touched, naming the option
//! ([`refuse_what_firefox_lacks`]).

use std::time::Duration;

use serde_json::{Value, json};
use tokio::time::Instant;

use flotilla_api_types::actions::{
    ActionKind, ActionRequest, AgentAction, HTML_URL, RESOURCE_TYPES, WaitUntil,
};

use crate::engine::bidi::{BidiError, BidiSession};
use crate::engine::browser::CdpEndpoint;
use crate::engine::intercept::glob_matches;
use crate::protocols::actions::{
    ActionBounds, ActionError, ActionOutput, CONTENT_SCRIPT, Undecodable, bounded, decoded,
    element_box_script, first_bad_selector, scrape_script, scraped, selector_check_script,
    selector_fields, wait_for_selector_script,
};

/// Options of a request Firefox's job does not take, with why.
fn refuse_what_firefox_lacks(request: &ActionRequest) -> Result<(), ActionError> {
    let refused =
        |option: &'static str, why: &'static str| Err(ActionError::NotInFirefox { option, why });
    if request.block.iter().any(|entry| entry == "websocket") {
        return refused(
            "block",
            "Firefox's WebDriver BiDi shows a WebSocket's handshake as a plain http(s) request: block its URL with a pattern (*://host/socket*)",
        );
    }
    Ok(())
}

/// Runs `action` on the Firefox at `endpoint`, within its `timeout_ms`.
pub async fn run(
    endpoint: &CdpEndpoint,
    action: &AgentAction,
    bounds: ActionBounds,
) -> Result<ActionOutput, ActionError> {
    refuse_what_firefox_lacks(&action.request)?;
    let timeout_ms = action.request.timeout_ms();
    let deadline = Instant::now() + Duration::from_millis(timeout_ms);
    let stage = std::sync::Mutex::new("connecting to the browser");
    let job = Job {
        request: &action.request,
        stage: &stage,
        bounds,
    };
    let outcome = tokio::time::timeout_at(deadline, job.run(endpoint, action.kind)).await;
    match outcome {
        Err(_) | Ok(Err(ActionError::Firefox(BidiError::Timeout(_)))) => {
            Err(ActionError::Timeout {
                stage: *stage.lock().expect("stage lock"),
                timeout_ms,
            })
        }
        Ok(other) => other,
    }
}

/// One job in progress.
struct Job<'a> {
    request: &'a ActionRequest,
    /// What the job waits for now (named if the deadline passes).
    stage: &'a std::sync::Mutex<&'static str>,
    bounds: ActionBounds,
}

/// The job's session and the tab it drives.
struct Tab {
    session: BidiSession,
    context: Value,
    /// Once the job holds the tab's requests: what answers them.
    holds: Option<Holds>,
    /// While a `networkidle` job follows the tab's requests: those not
    /// finished.
    in_flight: Option<InFlight>,
}

impl Tab {
    /// Sends `method` and waits for its answer, answering the requests the
    /// job holds meanwhile.
    async fn call(&mut self, method: &str, params: Value) -> Result<Value, BidiError> {
        if self.holds.is_none() && self.in_flight.is_none() {
            return self.session.call(method, params).await;
        }
        let (holds, in_flight) = (&self.holds, &mut self.in_flight);
        let mut handle = |event: &Value| events_of_the_job(holds, in_flight, event);
        self.session.call_serving(method, params, &mut handle).await
    }

    /// Ends the job's session. Requests it holds are answered until the
    /// browser has ended it (Firefox lets go of those still held then).
    async fn finish(mut self) {
        if self.holds.is_none() {
            return self.session.end().await;
        }
        let ending =
            tokio::time::timeout(Duration::from_secs(10), self.call("session.end", json!({})));
        match ending.await {
            Ok(Ok(_)) => self.session.ended(),
            _ => self.session.end().await,
        }
    }

    /// Waits until, after the load, none of the tab's requests has been in
    /// flight for [`NETWORK_QUIET`] (Chromium's `networkIdle`).
    async fn network_idle(&mut self) -> Result<(), BidiError> {
        // Quiet is counted from the load on (the page's load handlers may
        // start requests of their own).
        if let Some(in_flight) = &mut self.in_flight {
            in_flight.changed = Instant::now();
        }
        loop {
            let Some(in_flight) = &self.in_flight else {
                return Ok(());
            };
            let quiet = in_flight.changed.elapsed();
            let within = match in_flight.requests.is_empty() {
                true if quiet >= NETWORK_QUIET => return Ok(()),
                true => NETWORK_QUIET - quiet,
                false => NETWORK_QUIET,
            };
            let (holds, in_flight) = (&self.holds, &mut self.in_flight);
            let mut handle = |event: &Value| events_of_the_job(holds, in_flight, event);
            self.session.serve_events(within, &mut handle).await?;
        }
    }

    /// `expression`'s value (awaited when a promise), as JSON: a script's
    /// exception is [`BidiError::Command`] with its text.
    async fn evaluate(&mut self, expression: &str) -> Result<Value, ActionError> {
        let target = json!({"context": self.context});
        self.evaluate_in(expression, target).await
    }

    /// [`Tab::evaluate`] in a sandbox realm of the page: its DOM, none of
    /// its scripts' changes (for what bounds the job: a page could make
    /// `scrollHeight` lie).
    async fn measure(&mut self, expression: &str) -> Result<Value, ActionError> {
        let target = crate::engine::firefox::sandboxed(&self.context);
        self.evaluate_in(expression, target).await
    }

    async fn evaluate_in(&mut self, expression: &str, target: Value) -> Result<Value, ActionError> {
        let wrapped = format!("(async () => JSON.stringify(await ({expression})))()");
        let method = "script.evaluate";
        let evaluated = self
            .call(
                method,
                json!({"expression": wrapped, "target": target, "awaitPromise": true}),
            )
            .await?;
        let failed = |message: String| {
            ActionError::Firefox(BidiError::Command {
                method: method.into(),
                error: "javascript error".into(),
                message,
            })
        };
        if evaluated["type"] == "exception" {
            let text = evaluated["exceptionDetails"]["text"].as_str().unwrap_or("");
            return Err(failed(text.to_owned()));
        }
        match evaluated["result"]["value"].as_str() {
            Some(json) => serde_json::from_str(json).map_err(|e| failed(e.to_string())),
            None => Ok(Value::Null),
        }
    }
}

impl Job<'_> {
    fn at(&self, stage: &'static str) {
        *self.stage.lock().expect("stage lock") = stage;
    }

    async fn run(
        &self,
        endpoint: &CdpEndpoint,
        kind: ActionKind,
    ) -> Result<ActionOutput, ActionError> {
        // A session the deadline drops is ended in the background.
        let mut session = BidiSession::open(endpoint).await?;
        self.at("opening the page");
        let tree = session
            .call("browsingContext.getTree", json!({"maxDepth": 0}))
            .await;
        let context = match tree {
            Ok(tree) => tree["contexts"][0]["context"].clone(),
            Err(error) => {
                session.end().await;
                return Err(error.into());
            }
        };
        let mut tab = Tab {
            session,
            context,
            holds: None,
            in_flight: None,
        };
        let result = self.on(&mut tab, kind).await;
        // The result goes at once; the session ends after (holding the
        // browser's turn till then).
        tokio::spawn(tab.finish());
        result
    }

    async fn on(&self, tab: &mut Tab, kind: ActionKind) -> Result<ActionOutput, ActionError> {
        // Selectors are parsed on the blank page, before anything of the
        // site runs.
        let fields = selector_fields(self.request, kind);
        if !fields.is_empty() {
            let refusals = tab.evaluate(&selector_check_script(&fields)).await?;
            first_bad_selector(fields, &refusals)?;
        }
        self.prepare(tab).await?;
        self.start_holding(tab).await?;
        self.at("loading the page");
        self.load(tab).await?;
        if let Some(selector) = &self.request.wait_for_selector {
            self.at("waiting for wait_for_selector");
            tab.evaluate(&wait_for_selector_script(selector)).await?;
        }
        self.at("making the result");
        match kind {
            ActionKind::Screenshot => self.screenshot(tab).await,
            ActionKind::Pdf => self.pdf(tab).await,
            ActionKind::Content => {
                let html = tab.evaluate(CONTENT_SCRIPT).await?;
                self.bounded(ActionOutput {
                    content_type: "text/html; charset=utf-8",
                    body: html.as_str().unwrap_or_default().as_bytes().to_vec(),
                })
            }
            ActionKind::Scrape => {
                let selectors: Vec<&str> = self
                    .request
                    .elements
                    .iter()
                    .map(|element| element.selector.as_str())
                    .collect();
                let elements = tab.evaluate(&scrape_script(&selectors)).await?;
                self.bounded(scraped(elements)?)
            }
        }
    }

    /// Viewport and cookies, before anything loads.
    async fn prepare(&self, tab: &mut Tab) -> Result<(), ActionError> {
        let viewport = self.request.viewport();
        tab.call(
            "browsingContext.setViewport",
            json!({
                "context": tab.context,
                "viewport": {"width": viewport.width, "height": viewport.height},
                "devicePixelRatio": viewport.device_scale_factor.unwrap_or(1.0),
            }),
        )
        .await?;
        if let Some(agent) = &self.request.user_agent {
            let agent = json!({"userAgent": agent, "contexts": [tab.context]});
            tab.call("emulation.setUserAgentOverride", agent).await?;
        }
        if !self.request.headers.is_empty() {
            let headers: Vec<Value> = self
                .request
                .headers
                .iter()
                .map(|(name, value)| json!({"name": name, "value": {"type": "string", "value": value}}))
                .collect();
            let extra = json!({"contexts": [tab.context], "headers": headers});
            tab.call("network.setExtraHeaders", extra)
                .await
                .map_err(refused_as(ActionError::BadHeaders))?;
        }
        let page_url = self.request.url.as_deref().unwrap_or_default();
        for cookie in &self.request.cookies {
            let url = cookie.url.as_deref().unwrap_or(page_url);
            let domain = match &cookie.domain {
                Some(domain) => domain.clone(),
                None => host_of(url).ok_or_else(|| {
                    ActionError::BadCookies(format!(
                        "cookie {:?} has neither a domain nor a URL with a host",
                        cookie.name
                    ))
                })?,
            };
            let set = json!({"cookie": {
                "name": cookie.name,
                "value": {"type": "string", "value": cookie.value},
                "domain": domain,
                "path": cookie.path.as_deref().unwrap_or("/"),
                "secure": cookie.secure,
                "httpOnly": cookie.http_only,
            }});
            tab.call("storage.setCookie", set)
                .await
                .map_err(refused_as(ActionError::BadCookies))?;
        }
        Ok(())
    }

    /// Holds the job's tab's requests from here on, for the job to answer
    /// ([`Holds`]): those to an `html` job's host, and every one when it
    /// blocks any. Nothing when the job does neither.
    async fn start_holding(&self, tab: &mut Tab) -> Result<(), ActionError> {
        let holds = Holds {
            html: self.request.html.clone(),
            blocker: (!self.request.block.is_empty()).then(|| Blocker::of(&self.request.block)),
        };
        if holds.html.is_some() {
            let intercept = json!({
                "phases": ["beforeRequestSent"],
                "urlPatterns": [{"type": "pattern", "protocol": "https", "hostname": HTML_HOST}],
                "contexts": [tab.context],
            });
            tab.call("network.addIntercept", intercept).await?;
        }
        if holds.blocker.is_some() {
            let intercept = json!({"phases": ["beforeRequestSent"], "contexts": [tab.context]});
            tab.call("network.addIntercept", intercept).await?;
        }
        if holds.html.is_some() || holds.blocker.is_some() {
            let events =
                json!({"events": ["network.beforeRequestSent"], "contexts": [tab.context]});
            tab.call("session.subscribe", events).await?;
            tab.holds = Some(holds);
        }
        Ok(())
    }

    /// Navigates to the job's page (an `html` job's document served at
    /// [`HTML_URL`] by its held request) and waits for its `wait_until`
    /// event.
    async fn load(&self, tab: &mut Tab) -> Result<(), ActionError> {
        let url = self.request.url.as_deref().unwrap_or(HTML_URL);
        let wait = match self.request.wait_until.unwrap_or_default() {
            WaitUntil::Domcontentloaded => "interactive",
            _ => "complete",
        };
        let navigate = json!({"context": tab.context, "url": url, "wait": wait});
        let idle = self.request.wait_until == Some(WaitUntil::Networkidle);
        if idle {
            let events = json!({"events": NETWORK_EVENTS, "contexts": [tab.context]});
            tab.call("session.subscribe", events).await?;
            tab.in_flight = Some(InFlight::default());
        }
        let navigated = tab.call("browsingContext.navigate", navigate).await;
        if idle && navigated.is_ok() {
            self.at("waiting for the network to be idle");
            tab.network_idle().await?;
        }
        match navigated {
            Ok(_) => Ok(()),
            Err(BidiError::Command { message, .. }) => Err(ActionError::Navigation {
                url: url.to_owned(),
                reason: message,
            }),
            Err(other) => Err(other.into()),
        }
    }

    async fn screenshot(&self, tab: &mut Tab) -> Result<ActionOutput, ActionError> {
        let format = self.request.format.unwrap_or_default();
        let mut params = json!({"context": tab.context, "format": {"type": format.content_type()}});
        if let Some(quality) = self.request.quality {
            params["format"]["quality"] = json!(f64::from(quality) / 100.0);
        }
        let scale = self.request.viewport().device_scale_factor.unwrap_or(1.0);
        let area = if let Some(selector) = &self.request.selector {
            let rect = tab.evaluate(&element_box_script(selector)).await?;
            let side = |i: usize| rect[i].as_f64().unwrap_or(0.0);
            if rect.is_null() || side(2) < 1.0 || side(3) < 1.0 {
                return Err(ActionError::NoElement {
                    selector: selector.clone(),
                });
            }
            params["origin"] = json!("document");
            params["clip"] = json!({"type": "box", "x": side(0), "y": side(1), "width": side(2), "height": side(3)});
            side(2) * side(3)
        } else if self.request.full_page == Some(true) {
            params["origin"] = json!("document");
            let size = tab
                .measure(
                    "[document.documentElement.scrollWidth, document.documentElement.scrollHeight]",
                )
                .await?;
            size[0].as_f64().unwrap_or(1.0) * size[1].as_f64().unwrap_or(1.0)
        } else {
            let viewport = self.request.viewport();
            f64::from(viewport.width) * f64::from(viewport.height)
        };
        if area * scale * scale > self.bounds.max_pixels as f64 {
            return Err(ActionError::NotInFirefox {
                option: "full_page",
                why: "Firefox's screenshots are not scaled down to agent.screenshot_max_pixels: take a smaller area or viewport",
            });
        }
        let shot = tab
            .call("browsingContext.captureScreenshot", params)
            .await?;
        Ok(ActionOutput {
            content_type: format.content_type(),
            body: self.decoded(&shot["data"])?,
        })
    }

    async fn pdf(&self, tab: &mut Tab) -> Result<ActionOutput, ActionError> {
        let (width, height) = self.request.page_size.unwrap_or_default().inches();
        let landscape = self.request.landscape.unwrap_or(false);
        let margins = self.request.margins_mm.unwrap_or_default();
        let cm = |inches: f64| inches * 2.54;
        let printed = tab
            .call(
                "browsingContext.print",
                json!({
                    "context": tab.context,
                    "background": self.request.print_background.unwrap_or(false),
                    "orientation": if landscape { "landscape" } else { "portrait" },
                    "page": {"width": cm(width), "height": cm(height)},
                    "margin": {
                        "top": margins.top / 10.0, "bottom": margins.bottom / 10.0,
                        "left": margins.left / 10.0, "right": margins.right / 10.0,
                    },
                    "shrinkToFit": false,
                }),
            )
            .await?;
        Ok(ActionOutput {
            content_type: "application/pdf",
            body: self.decoded(&printed["data"])?,
        })
    }

    fn decoded(&self, data: &Value) -> Result<Vec<u8>, ActionError> {
        decoded(data, self.bounds).map_err(|error| match error {
            Undecodable::NotBase64(message) => ActionError::Firefox(BidiError::Command {
                method: "result".into(),
                error: "unreadable answer".into(),
                message,
            }),
            Undecodable::Action(error) => error,
        })
    }

    fn bounded(&self, output: ActionOutput) -> Result<ActionOutput, ActionError> {
        bounded(output, self.bounds)
    }
}

/// The host of an `http(s)` URL.
fn host_of(url: &str) -> Option<String> {
    let parsed = url::Url::parse(url).ok()?;
    parsed.host_str().map(str::to_owned)
}

/// A command the browser refused, as `refusal` (a 400 naming what the
/// request gave); a browser that did not answer stays a browser failure.
fn refused_as(refusal: fn(String) -> ActionError) -> impl Fn(BidiError) -> ActionError {
    move |error| match error {
        BidiError::Command { message, .. } => refusal(message),
        other => other.into(),
    }
}

/// What answers the requests a job holds, for as long as it runs (so that
/// none is left held between two commands): an `html` job's document, its
/// `block`.
struct Holds {
    html: Option<String>,
    blocker: Option<Blocker>,
}

impl Holds {
    fn decide(&self, event: &Value) -> Option<(&'static str, Value)> {
        if let Some(html) = &self.html
            && let Some(served) = serve_document(event, html)
        {
            return Some(served);
        }
        self.blocker.as_ref()?.decide(event)
    }
}

/// How long none of a `networkidle` job's requests must be in flight.
const NETWORK_QUIET: Duration = Duration::from_millis(500);

/// The events that tell a request's start and end, and a frame's end
/// (whose requests tell no end then).
const NETWORK_EVENTS: [&str; 4] = [
    "network.beforeRequestSent",
    "network.responseCompleted",
    "network.fetchError",
    "browsingContext.contextDestroyed",
];

/// The requests of a tab not finished yet (each hop of a redirect is one,
/// by its count), with the frame each is for, and when that last changed.
struct InFlight {
    requests: std::collections::HashMap<(String, u64), String>,
    changed: Instant,
}

impl Default for InFlight {
    fn default() -> Self {
        Self {
            requests: Default::default(),
            changed: Instant::now(),
        }
    }
}

impl InFlight {
    fn see(&mut self, event: &Value) {
        let params = &event["params"];
        let method = event["method"].as_str().unwrap_or_default();
        if method == "browsingContext.contextDestroyed" {
            let mut gone = Vec::new();
            collect_contexts(params, &mut gone);
            self.requests.retain(|_, context| !gone.contains(context));
            self.changed = Instant::now();
            return;
        }
        let Some(request) = params["request"]["request"].as_str() else {
            return;
        };
        let hop = params["redirectCount"].as_u64().unwrap_or(0);
        match method {
            "network.beforeRequestSent" => {
                // A redirect's next hop ends the hops before it.
                self.requests
                    .retain(|(id, earlier), _| id != request || *earlier > hop);
                let context = params["context"].as_str().unwrap_or_default().to_owned();
                self.requests.insert((request.to_owned(), hop), context);
            }
            "network.responseCompleted" | "network.fetchError" => {
                self.requests.remove(&(request.to_owned(), hop));
            }
            _ => return,
        }
        self.changed = Instant::now();
    }
}

/// The ids of a destroyed context's info and of its children's (to a
/// depth of 64).
fn collect_contexts(info: &Value, into: &mut Vec<String>) {
    fn walk(info: &Value, into: &mut Vec<String>, depth: usize) {
        if let Some(id) = info["context"].as_str() {
            into.push(id.to_owned());
        }
        if depth < 64 {
            for child in info["children"].as_array().into_iter().flatten() {
                walk(child, into, depth + 1);
            }
        }
    }
    walk(info, into, 0);
}

/// What the job does with an event: follows its requests, and answers
/// those it holds.
fn events_of_the_job(
    holds: &Option<Holds>,
    in_flight: &mut Option<InFlight>,
    event: &Value,
) -> Option<(&'static str, Value)> {
    if let Some(in_flight) = in_flight {
        in_flight.see(event);
    }
    holds.as_ref()?.decide(event)
}

/// What a job's `block` fails: resource types and URL patterns (`*` any
/// run of characters, `?` one), as Chromium's job reads them.
struct Blocker {
    types: Vec<String>,
    urls: Vec<String>,
}

impl Blocker {
    fn of(block: &[String]) -> Self {
        let (types, urls) = block
            .iter()
            .cloned()
            .partition(|entry| RESOURCE_TYPES.contains(&entry.as_str()));
        Self { types, urls }
    }

    /// The command that releases a held request: failed when the job blocks
    /// it, let through otherwise (`None` for any other event).
    fn decide(&self, event: &Value) -> Option<(&'static str, Value)> {
        let params = &event["params"];
        if event["method"] != "network.beforeRequestSent" || params["isBlocked"] != true {
            return None;
        }
        let request = &params["request"];
        let url = request["url"].as_str().unwrap_or_default();
        let blocked = self.types.iter().any(|kind| kind == resource_type(params))
            || self.urls.iter().any(|pattern| glob_matches(pattern, url));
        let release = json!({"request": request["request"]});
        Some(match blocked {
            true => ("network.failRequest", release),
            false => ("network.continueRequest", release),
        })
    }
}

/// A held request's resource type as Chromium names it (lower case), read
/// from its event's `params`: a navigation's request is a document, others
/// by their fetch destination and initiator (Firefox tells a WebSocket's
/// handshake from no other request: see [`refuse_what_firefox_lacks`]).
fn resource_type(params: &Value) -> &'static str {
    if !params["navigation"].is_null() {
        return "document";
    }
    let request = &params["request"];
    let accepts_events = request["headers"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|header| {
            header["name"]
                .as_str()
                .is_some_and(|name| name.eq_ignore_ascii_case("accept"))
                && header["value"]["value"]
                    .as_str()
                    .is_some_and(|value| value.starts_with("text/event-stream"))
        });
    let destination = request["destination"].as_str().unwrap_or_default();
    match (destination, request["initiatorType"].as_str()) {
        ("document" | "iframe" | "frame", _) => "document",
        ("style", _) => "stylesheet",
        ("image", _) => "image",
        ("audio" | "video", _) => "media",
        ("font", _) => "font",
        ("script", _) => "script",
        ("track", _) => "texttrack",
        ("manifest", _) => "manifest",
        (_, Some("xmlhttprequest")) => "xhr",
        (_, Some("fetch")) => "fetch",
        _ if accepts_events => "eventsource",
        _ => "other",
    }
}

/// The host an `html` job's document is served from ([`HTML_URL`]'s).
const HTML_HOST: &str = "flotilla.invalid";

/// The answer to a held request to [`HTML_HOST`]: the navigation to
/// [`HTML_URL`] gets the document, as `text/html`; any other (the page's
/// own requests to its host) fails, as in Chromium's job.
fn serve_document(event: &Value, html: &str) -> Option<(&'static str, Value)> {
    let params = &event["params"];
    if event["method"] != "network.beforeRequestSent" || params["isBlocked"] != true {
        return None;
    }
    let url = params["request"]["url"].as_str().unwrap_or_default();
    if host_of(url).as_deref() != Some(HTML_HOST) {
        return None;
    }
    let request = &params["request"]["request"];
    let document = url == HTML_URL && !params["navigation"].is_null();
    if !document {
        return Some(("network.failRequest", json!({"request": request})));
    }
    let response = json!({
        "request": request,
        "statusCode": 200,
        "reasonPhrase": "OK",
        "headers": [{"name": "content-type", "value": {"type": "string", "value": "text/html; charset=utf-8"}}],
        "body": {"type": "string", "value": html},
    });
    Some(("network.provideResponse", response))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_firefox_lacks_is_refused_by_name() {
        let url = Some("https://example.com/".to_owned());
        let request = json!({"url": url, "block": ["image", "websocket"]});
        let request: ActionRequest = serde_json::from_value(request).unwrap();
        let error = refuse_what_firefox_lacks(&request).unwrap_err();
        assert!(
            matches!(
                error,
                ActionError::NotInFirefox {
                    option: "block",
                    ..
                }
            ),
            "{error}"
        );
        assert!(error.to_string().contains("block"), "{error}");
        for taken in [
            json!({"url": url, "wait_until": "networkidle"}),
            json!({"url": url}),
            json!({"html": "<p>x</p>"}),
            json!({"url": url, "headers": {"x-a": "1"}}),
            json!({"url": url, "block": ["image", "*://ads.test/*"]}),
            json!({"url": url, "user_agent": "bot"}),
        ] {
            let request: ActionRequest = serde_json::from_value(taken).unwrap();
            assert!(refuse_what_firefox_lacks(&request).is_ok());
        }
    }

    #[test]
    fn only_the_html_document_is_served_and_only_when_held() {
        let event = |url: &str, blocked: bool, navigation: Value| {
            json!({"type": "event", "method": "network.beforeRequestSent", "params": {
                "isBlocked": blocked, "navigation": navigation,
                "request": {"request": "r1", "url": url}}})
        };
        let navigation = json!("n1");
        let served = serve_document(&event(HTML_URL, true, navigation.clone()), "<p>x</p>");
        let (method, answer) = served.unwrap();
        assert_eq!(method, "network.provideResponse");
        assert_eq!(answer["request"], "r1");
        assert_eq!(
            answer["body"],
            json!({"type": "string", "value": "<p>x</p>"})
        );
        assert!(serve_document(&event(HTML_URL, false, navigation.clone()), "x").is_none());
        // The page's own requests to the host (a fetch of the document's
        // URL, a script beside it) fail.
        for (url, navigation) in [
            (HTML_URL, Value::Null),
            ("https://flotilla.invalid/a.js", Value::Null),
            ("https://flotilla.invalid/other", navigation),
        ] {
            let (method, answer) = serve_document(&event(url, true, navigation), "x").unwrap();
            assert_eq!(
                (method, &answer["request"]),
                ("network.failRequest", &json!("r1"))
            );
        }
    }

    #[test]
    fn a_block_fails_held_requests_by_type_and_pattern_and_lets_the_rest_through() {
        let blocker = Blocker::of(&["image".into(), "xhr".into(), "*://ads.test/*".into()]);
        let held = |url: &str, destination: &str, initiator: Value| {
            json!({"type": "event", "method": "network.beforeRequestSent", "params": {
                "isBlocked": true,
                "request": {"request": "r1", "url": url, "destination": destination,
                    "initiatorType": initiator, "headers": []}}})
        };
        for (event, method) in [
            (
                held("https://a.test/p.png", "image", json!("img")),
                "network.failRequest",
            ),
            (
                held("https://a.test/x", "", json!("xmlhttprequest")),
                "network.failRequest",
            ),
            (
                held("https://ads.test/ad.js", "script", json!("script")),
                "network.failRequest",
            ),
            (
                held("https://a.test/", "document", Value::Null),
                "network.continueRequest",
            ),
            (
                held("https://a.test/f", "", json!("fetch")),
                "network.continueRequest",
            ),
        ] {
            let (answered, release) = blocker.decide(&event).unwrap();
            assert_eq!(
                (answered, &release["request"]),
                (method, &json!("r1")),
                "{event}"
            );
        }
        let mut seen = held("https://a.test/p.png", "image", json!("img"));
        seen["params"]["isBlocked"] = json!(false);
        assert!(
            blocker.decide(&seen).is_none(),
            "a request not held is left alone"
        );
        let stream = json!({"url": "https://a.test/es", "destination": "",
            "headers": [{"name": "Accept", "value": {"type": "string", "value": "text/event-stream"}}]});
        assert_eq!(resource_type(&json!({"request": stream})), "eventsource");
        let of = |request: Value| resource_type(&json!({"request": request}));
        assert_eq!(of(json!({"destination": "video"})), "media");
        assert_eq!(of(json!({"destination": ""})), "other");
        // Firefox gives a top-level load no destination: its navigation
        // tells it.
        let load = json!({"navigation": "n1", "request": {"destination": ""}});
        assert_eq!(resource_type(&load), "document");
    }

    #[test]
    fn a_cookies_domain_is_its_urls_host() {
        assert_eq!(
            host_of("https://a.example.com:8443/x").as_deref(),
            Some("a.example.com")
        );
        assert_eq!(host_of("not a url"), None);
    }
}
