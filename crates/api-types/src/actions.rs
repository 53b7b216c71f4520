//! REST actions (`POST /v2/actions/{action}`): one page rendered in a
//! borrowed browser, the answer being the result itself (a screenshot, a
//! PDF, the rendered HTML, or scraped elements as JSON). The request body,
//! its checks (each refusal names its field) and the scrape answer.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::instances::UpstreamProxy;

/// What an action makes of the page.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ActionKind {
    Screenshot,
    Pdf,
    Content,
    Scrape,
}

impl ActionKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Screenshot => "screenshot",
            Self::Pdf => "pdf",
            Self::Content => "content",
            Self::Scrape => "scrape",
        }
    }
}

impl fmt::Display for ActionKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// When the page counts as loaded.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum WaitUntil {
    /// The `load` event: the document and its subresources.
    #[default]
    Load,
    /// `DOMContentLoaded`: the document is parsed.
    Domcontentloaded,
    /// No network request for 500 ms after `load` (Chromium's `networkIdle`).
    Networkidle,
}

/// The page's viewport in CSS pixels.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Viewport {
    /// 1 to 8192; default 1280.
    #[schema(minimum = 1, maximum = 8192)]
    pub width: u32,
    /// 1 to 8192; default 720.
    #[schema(minimum = 1, maximum = 8192)]
    pub height: u32,
    /// 0.25 to 4; default 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0.25, maximum = 4.0)]
    pub device_scale_factor: Option<f64>,
}

impl Default for Viewport {
    fn default() -> Self {
        Self {
            width: 1280,
            height: 720,
            device_scale_factor: None,
        }
    }
}

/// A screenshot's image format.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ImageFormat {
    #[default]
    Png,
    Jpeg,
    Webp,
}

impl ImageFormat {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Png => "png",
            Self::Jpeg => "jpeg",
            Self::Webp => "webp",
        }
    }

    pub fn content_type(self) -> &'static str {
        match self {
            Self::Png => "image/png",
            Self::Jpeg => "image/jpeg",
            Self::Webp => "image/webp",
        }
    }
}

/// A PDF's paper size.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub enum PageSize {
    #[default]
    Letter,
    Legal,
    Tabloid,
    A3,
    A4,
    A5,
}

impl PageSize {
    /// Width and height in inches (portrait).
    pub fn inches(self) -> (f64, f64) {
        match self {
            Self::Letter => (8.5, 11.0),
            Self::Legal => (8.5, 14.0),
            Self::Tabloid => (11.0, 17.0),
            Self::A3 => (11.69, 16.54),
            Self::A4 => (8.27, 11.69),
            Self::A5 => (5.83, 8.27),
        }
    }
}

/// A PDF's margins in millimetres (each 0 to 100; default 10).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MarginsMm {
    #[serde(default = "default_margin")]
    pub top: f64,
    #[serde(default = "default_margin")]
    pub right: f64,
    #[serde(default = "default_margin")]
    pub bottom: f64,
    #[serde(default = "default_margin")]
    pub left: f64,
}

fn default_margin() -> f64 {
    10.0
}

impl Default for MarginsMm {
    fn default() -> Self {
        Self {
            top: 10.0,
            right: 10.0,
            bottom: 10.0,
            left: 10.0,
        }
    }
}

/// A cookie set before the page loads. Without `url` or `domain` it belongs
/// to the action's `url`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ActionCookie {
    pub name: String,
    pub value: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    #[serde(default)]
    pub secure: bool,
    #[serde(default)]
    pub http_only: bool,
}

/// One selector of a scrape.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ScrapeElement {
    /// A CSS selector.
    #[schema(min_length = 1, max_length = 4096)]
    pub selector: String,
}

/// Body of `POST /v2/actions/{action}`. Exactly one of `url` and `html`.
/// `full_page`, `selector`, `format` and `quality` belong to screenshots;
/// `page_size`, `landscape`, `margins_mm` and `print_background` to PDFs;
/// `elements` to scrapes. Anything else is shared.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ActionRequest {
    /// The page to load: an `http` or `https` URL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// A document to render instead of a URL (at most
    /// `actions.max_html_bytes`); it is served as `https://flotilla.invalid/`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub html: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub viewport: Option<Viewport>,
    /// Default `load`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_until: Option<WaitUntil>,
    /// Then wait until an element matches this CSS selector.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_for_selector: Option<String>,
    /// The whole job, from the browser being ready to the result (1 to
    /// `actions.max_timeout_ms`; default 30000). Waiting for room does not count.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1)]
    pub timeout_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cookies: Vec<ActionCookie>,
    /// Extra request headers sent with every request of the page.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_agent: Option<String>,
    /// An upstream proxy for the page's traffic (as `config.proxy` of a create).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy: Option<UpstreamProxy>,
    /// Start from this saved profile (read-only: nothing is written back).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
    /// The image whose browser runs the job (default: the fleet's default
    /// image). `firefox` runs it in Firefox over WebDriver BiDi, which takes
    /// no `block` of `websocket` (400 naming it); a `profile` must be one
    /// Firefox saved.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Requests to fail: resource types (`image`, `font`, `stylesheet`,
    /// `media`, `script`, …) or URL patterns (`*` matches anything,
    /// e.g. `*://ads.example.com/*`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schema(max_items = 100)]
    pub block: Vec<String>,
    /// Screenshot: the whole scrollable page, not only the viewport.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub full_page: Option<bool>,
    /// Screenshot: only the first element matching this CSS selector.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,
    /// Screenshot: default `png`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<ImageFormat>,
    /// Screenshot: 0 to 100, for `jpeg` and `webp` only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(maximum = 100)]
    pub quality: Option<u8>,
    /// PDF: default `Letter`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub page_size: Option<PageSize>,
    /// PDF.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub landscape: Option<bool>,
    /// PDF.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub margins_mm: Option<MarginsMm>,
    /// PDF: print background colours and images (default false).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub print_background: Option<bool>,
    /// Scrape: 1 to 50 selectors.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schema(max_items = 50)]
    pub elements: Vec<ScrapeElement>,
}

/// The operator's bounds on actions (the control plane's `[actions]`).
#[derive(Debug, Clone, Copy)]
pub struct ActionLimits {
    pub max_html_bytes: usize,
    pub max_timeout_ms: u64,
}

/// Resource types a `block` entry may name (Chromium's, in lower case).
pub const RESOURCE_TYPES: [&str; 13] = [
    "document",
    "stylesheet",
    "image",
    "media",
    "font",
    "script",
    "texttrack",
    "xhr",
    "fetch",
    "eventsource",
    "websocket",
    "manifest",
    "other",
];

/// The HTML document of an `html` action is served at this URL (no request
/// leaves the browser for it).
pub const HTML_URL: &str = "https://flotilla.invalid/";

pub const DEFAULT_TIMEOUT_MS: u64 = 30_000;
pub const MAX_VIEWPORT_SIDE: u32 = 8192;
pub const MAX_SCRAPE_ELEMENTS: usize = 50;
pub const MAX_BLOCK_ENTRIES: usize = 100;
pub const MAX_HEADERS: usize = 100;
pub const MAX_COOKIES: usize = 200;
const MAX_SELECTOR_CHARS: usize = 4096;

/// A refused field of an action request; the message names the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidAction(String);

impl From<String> for InvalidAction {
    fn from(message: String) -> Self {
        Self(message)
    }
}

impl From<&str> for InvalidAction {
    fn from(message: &str) -> Self {
        Self(message.to_owned())
    }
}

impl ActionRequest {
    /// `timeout_ms` or its default.
    pub fn timeout_ms(&self) -> u64 {
        self.timeout_ms.unwrap_or(DEFAULT_TIMEOUT_MS)
    }

    pub fn viewport(&self) -> Viewport {
        self.viewport.unwrap_or_default()
    }

    /// Checks every field for action `kind`; the message names the field.
    pub fn validate(&self, kind: ActionKind, limits: &ActionLimits) -> Result<(), InvalidAction> {
        self.check_source(limits)?;
        self.check_page_options(limits)?;
        self.check_request_options()?;
        self.check_fields_of(kind)
    }

    fn check_source(&self, limits: &ActionLimits) -> Result<(), InvalidAction> {
        match (&self.url, &self.html) {
            (None, None) => Err("url or html is required".into()),
            (Some(_), Some(_)) => Err("give url or html, not both".into()),
            (Some(url), None) => check_http_url(url, "url"),
            (None, Some(html)) if html.len() > limits.max_html_bytes => Err(format!(
                "html is {} bytes, over the limit of {} (actions.max_html_bytes)",
                html.len(),
                limits.max_html_bytes
            )
            .into()),
            (None, Some(_)) => Ok(()),
        }
    }

    fn check_page_options(&self, limits: &ActionLimits) -> Result<(), InvalidAction> {
        if let Some(viewport) = &self.viewport {
            for (name, side) in [("width", viewport.width), ("height", viewport.height)] {
                if !(1..=MAX_VIEWPORT_SIDE).contains(&side) {
                    return Err(format!(
                        "viewport.{name} must be 1 to {MAX_VIEWPORT_SIDE} pixels (got {side})"
                    )
                    .into());
                }
            }
            if let Some(scale) = viewport.device_scale_factor
                && !(0.25..=4.0).contains(&scale)
            {
                return Err(format!(
                    "viewport.device_scale_factor must be 0.25 to 4 (got {scale})"
                )
                .into());
            }
        }
        if let Some(timeout) = self.timeout_ms
            && !(1..=limits.max_timeout_ms).contains(&timeout)
        {
            return Err(format!(
                "timeout_ms must be 1 to {} (actions.max_timeout_ms; got {timeout})",
                limits.max_timeout_ms
            )
            .into());
        }
        if let Some(selector) = &self.wait_for_selector {
            check_selector(selector, "wait_for_selector")?;
        }
        if let Some(profile) = &self.profile {
            crate::profiles::check_profile_name(profile).map_err(|e| format!("profile: {e}"))?;
        }
        if let Some(proxy) = &self.proxy {
            proxy
                .validate()
                .map_err(|e| e.to_string().replacen("config.proxy", "proxy", 1))?;
        }
        Ok(())
    }

    fn check_request_options(&self) -> Result<(), InvalidAction> {
        /// Headers the browser writes itself: a request carrying one of
        /// them is never sent (the page would wait out its timeout).
        const BROWSER_HEADERS: &[&str] = &[
            "host",
            "connection",
            "content-length",
            "transfer-encoding",
            "keep-alive",
            "upgrade",
            "te",
            "trailer",
            "expect",
        ];
        if self.headers.len() > MAX_HEADERS {
            return Err(format!("headers takes at most {MAX_HEADERS} entries").into());
        }
        for (name, value) in &self.headers {
            let token = !name.is_empty()
                && name.len() <= 256
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
            if !token {
                return Err(format!("headers: {name:?} is not a header name").into());
            }
            let lower = name.to_ascii_lowercase();
            if BROWSER_HEADERS.contains(&lower.as_str()) || lower.starts_with("proxy-") {
                return Err(format!(
                    "headers.{name} cannot be set: the browser sets it itself (as it does Host, Connection, Content-Length, Transfer-Encoding and every Proxy-… header)"
                ).into());
            }
            if value.len() > 8192 || value.chars().any(|c| c.is_control() && c != '\t') {
                return Err(format!(
                    "headers.{name}: the value must be at most 8192 characters without control characters"
                ).into());
            }
        }
        if let Some(agent) = &self.user_agent
            && (agent.is_empty() || agent.len() > 1024 || agent.chars().any(char::is_control))
        {
            return Err(
                "user_agent must be 1 to 1024 characters without control characters".into(),
            );
        }
        if self.cookies.len() > MAX_COOKIES {
            return Err(format!("cookies takes at most {MAX_COOKIES} entries").into());
        }
        for (index, cookie) in self.cookies.iter().enumerate() {
            check_cookie(cookie, self.url.is_some())
                .map_err(|e| format!("cookies[{index}].{e}"))?;
        }
        if self.block.len() > MAX_BLOCK_ENTRIES {
            return Err(format!("block takes at most {MAX_BLOCK_ENTRIES} entries").into());
        }
        for (index, entry) in self.block.iter().enumerate() {
            let is_type = RESOURCE_TYPES.contains(&entry.as_str());
            let is_pattern = !entry.is_empty()
                && entry.len() <= 2048
                && (entry.contains(['*', '/', '.', ':']))
                && !entry.chars().any(|c| c.is_whitespace() || c.is_control());
            if !is_type && !is_pattern {
                return Err(format!(
                    "block[{index}] must be a resource type ({}) or a URL pattern such as *://ads.example.com/* (got {entry:?})",
                    RESOURCE_TYPES.join(", ")
                ).into());
            }
        }
        Ok(())
    }

    /// Refuses fields of another action, and checks this action's own.
    fn check_fields_of(&self, kind: ActionKind) -> Result<(), InvalidAction> {
        let present = [
            (
                ActionKind::Screenshot,
                "full_page",
                self.full_page.is_some(),
            ),
            (ActionKind::Screenshot, "selector", self.selector.is_some()),
            (ActionKind::Screenshot, "format", self.format.is_some()),
            (ActionKind::Screenshot, "quality", self.quality.is_some()),
            (ActionKind::Pdf, "page_size", self.page_size.is_some()),
            (ActionKind::Pdf, "landscape", self.landscape.is_some()),
            (ActionKind::Pdf, "margins_mm", self.margins_mm.is_some()),
            (
                ActionKind::Pdf,
                "print_background",
                self.print_background.is_some(),
            ),
            (ActionKind::Scrape, "elements", !self.elements.is_empty()),
        ];
        for (owner, field, given) in present {
            if given && owner != kind {
                return Err(format!("{field} belongs to the {owner} action, not to {kind}").into());
            }
        }
        match kind {
            ActionKind::Screenshot => {
                if let Some(selector) = &self.selector {
                    check_selector(selector, "selector")?;
                }
                if self.selector.is_some() && self.full_page == Some(true) {
                    return Err("give selector or full_page, not both".into());
                }
                if let Some(quality) = self.quality {
                    if self.format.unwrap_or_default() == ImageFormat::Png {
                        return Err("quality applies to format jpeg or webp, not png".into());
                    }
                    if quality > 100 {
                        return Err(format!("quality must be 0 to 100 (got {quality})").into());
                    }
                }
            }
            ActionKind::Pdf => {
                if let Some(margins) = &self.margins_mm {
                    for (side, value) in [
                        ("top", margins.top),
                        ("right", margins.right),
                        ("bottom", margins.bottom),
                        ("left", margins.left),
                    ] {
                        if !(0.0..=100.0).contains(&value) {
                            return Err(format!(
                                "margins_mm.{side} must be 0 to 100 millimetres (got {value})"
                            )
                            .into());
                        }
                    }
                }
            }
            ActionKind::Content => {}
            ActionKind::Scrape => {
                if self.elements.is_empty() || self.elements.len() > MAX_SCRAPE_ELEMENTS {
                    return Err(format!(
                        "elements must list 1 to {MAX_SCRAPE_ELEMENTS} selectors, as [{{\"selector\": \"h1\"}}]"
                    ).into());
                }
                for (index, element) in self.elements.iter().enumerate() {
                    check_selector(&element.selector, &format!("elements[{index}].selector"))?;
                }
            }
        }
        Ok(())
    }
}

/// An `http` or `https` URL with a host; the message names `field`.
fn check_http_url(text: &str, field: &str) -> Result<(), InvalidAction> {
    let parsed = url::Url::parse(text).map_err(|e| format!("{field} is not a URL: {e}"))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(format!(
            "{field} must be an http or https URL (got a {}: URL)",
            parsed.scheme()
        )
        .into());
    }
    if parsed.host_str().is_none_or(str::is_empty) {
        return Err(format!("{field} must name a host").into());
    }
    Ok(())
}

/// A selector's shape; whether it parses is asked of the browser, whose
/// refusal names the same field.
fn check_selector(selector: &str, field: &str) -> Result<(), InvalidAction> {
    if selector.trim().is_empty()
        || selector.chars().count() > MAX_SELECTOR_CHARS
        || selector.contains('\0')
    {
        return Err(format!(
            "{field} must be a CSS selector of 1 to {MAX_SELECTOR_CHARS} characters"
        )
        .into());
    }
    Ok(())
}

fn check_cookie(cookie: &ActionCookie, has_url: bool) -> Result<(), InvalidAction> {
    let text_ok = |value: &str| !value.chars().any(|c| c.is_control() || c == ';');
    if cookie.name.is_empty() || cookie.name.len() > 4096 || !text_ok(&cookie.name) {
        return Err("name must be 1 to 4096 characters without ';' or control characters".into());
    }
    if cookie.value.len() > 4096 || !text_ok(&cookie.value) {
        return Err(
            "value must be at most 4096 characters without ';' or control characters".into(),
        );
    }
    if let Some(url) = &cookie.url {
        check_http_url(url, "url")?;
    }
    if let Some(domain) = &cookie.domain {
        let host = domain.strip_prefix('.').unwrap_or(domain);
        if host.is_empty()
            || host.len() > 253
            || !host
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-._".contains(c))
        {
            return Err(format!("domain {domain:?} is not a host name").into());
        }
    }
    if let Some(path) = &cookie.path
        && (!path.starts_with('/') || !text_ok(path))
    {
        return Err("path must start with /".into());
    }
    if cookie.url.is_none() && cookie.domain.is_none() && !has_url {
        return Err("url or domain is required when the action renders html".into());
    }
    Ok(())
}

/// What the node runs: the action and its checked request.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AgentAction {
    pub kind: ActionKind,
    pub request: ActionRequest,
}

/// The answer of `POST /v2/actions/scrape`: per selector, in the order
/// asked, every match (at most 1000 per selector).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ScrapeResponse {
    pub elements: Vec<ScrapedSelector>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ScrapedSelector {
    pub selector: String,
    pub matches: Vec<ScrapedMatch>,
}

/// One matching element.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ScrapedMatch {
    /// Its rendered text (`innerText`).
    pub text: String,
    /// Its `outerHTML`.
    pub html: String,
    pub attributes: BTreeMap<String, String>,
    /// Where it is on the page, in CSS pixels from the document's top left.
    pub r#box: ElementBox,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ElementBox {
    pub x: f64,
    pub y: f64,
    pub width: f64,
    pub height: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: ActionLimits = ActionLimits {
        max_html_bytes: 1000,
        max_timeout_ms: 60_000,
    };

    fn refusal(kind: ActionKind, json: serde_json::Value) -> String {
        let request: ActionRequest = serde_json::from_value(json).expect("parses");
        request
            .validate(kind, &LIMITS)
            .expect_err("refused")
            .to_string()
    }

    #[test]
    fn urls_other_than_http_are_refused_naming_the_field() {
        for url in [
            "file:///etc/passwd",
            "chrome://settings",
            "javascript:alert(1)",
            "data:text/html,hi",
            "ftp://example.com/",
            "not a url",
            "http://",
        ] {
            let error = refusal(ActionKind::Screenshot, serde_json::json!({ "url": url }));
            assert!(error.starts_with("url "), "{url}: {error}");
        }
        let ok: ActionRequest =
            serde_json::from_value(serde_json::json!({"url": "https://example.com/a?b"})).unwrap();
        ok.validate(ActionKind::Content, &LIMITS).unwrap();
    }

    #[test]
    fn viewports_timeouts_and_html_are_bounded() {
        for (width, height) in [(0, 720), (100_000, 720), (1280, 0), (1280, 100_000)] {
            let error = refusal(
                ActionKind::Screenshot,
                serde_json::json!({"url": "http://a.test/", "viewport": {"width": width, "height": height}}),
            );
            assert!(error.starts_with("viewport."), "{error}");
        }
        let error = refusal(
            ActionKind::Pdf,
            serde_json::json!({"url": "http://a.test/", "timeout_ms": 0}),
        );
        assert!(error.starts_with("timeout_ms"), "{error}");
        let error = refusal(
            ActionKind::Content,
            serde_json::json!({"html": "x".repeat(1001)}),
        );
        assert!(error.starts_with("html is 1001 bytes"), "{error}");
        let error = refusal(ActionKind::Content, serde_json::json!({}));
        assert!(error.contains("url or html"), "{error}");
        let error = refusal(
            ActionKind::Content,
            serde_json::json!({"url": "http://a.test/", "html": "<p>"}),
        );
        assert!(error.contains("not both"), "{error}");
    }

    #[test]
    fn fields_of_another_action_and_bad_options_are_named() {
        let cases = [
            (
                ActionKind::Pdf,
                serde_json::json!({"url": "http://a.test/", "full_page": true}),
                "full_page belongs to the screenshot action",
            ),
            (
                ActionKind::Screenshot,
                serde_json::json!({"url": "http://a.test/", "elements": [{"selector": "a"}]}),
                "elements belongs to the scrape action",
            ),
            (
                ActionKind::Scrape,
                serde_json::json!({"url": "http://a.test/"}),
                "elements must list",
            ),
            (
                ActionKind::Scrape,
                serde_json::json!({"url": "http://a.test/", "elements": [{"selector": " "}]}),
                "elements[0].selector",
            ),
            (
                ActionKind::Screenshot,
                serde_json::json!({"url": "http://a.test/", "quality": 50}),
                "quality applies to format jpeg or webp",
            ),
            (
                ActionKind::Content,
                serde_json::json!({"url": "http://a.test/", "headers": {"bad name": "x"}}),
                "headers:",
            ),
            (
                ActionKind::Content,
                serde_json::json!({"url": "http://a.test/", "headers": {"x-a": "a\r\nb: c"}}),
                "headers.x-a",
            ),
            (
                ActionKind::Content,
                serde_json::json!({"url": "http://a.test/", "headers": {"Host": "b.test"}}),
                "headers.Host cannot be set",
            ),
            (
                ActionKind::Pdf,
                serde_json::json!({"url": "http://a.test/", "headers": {"proxy-authorization": "Basic x"}}),
                "headers.proxy-authorization cannot be set",
            ),
            (
                ActionKind::Content,
                serde_json::json!({"url": "http://a.test/", "block": ["pictures"]}),
                "block[0]",
            ),
            (
                ActionKind::Content,
                serde_json::json!({"html": "<p>", "cookies": [{"name": "a", "value": "b"}]}),
                "cookies[0].url or domain",
            ),
            (
                ActionKind::Content,
                serde_json::json!({"url": "http://a.test/", "cookies": [{"name": "a", "value": "b;c"}]}),
                "cookies[0].value",
            ),
            (
                ActionKind::Content,
                serde_json::json!({"url": "http://a.test/", "profile": "../x"}),
                "profile:",
            ),
            (
                ActionKind::Content,
                serde_json::json!({"url": "http://a.test/", "proxy": {"server": "ftp://p:1"}}),
                "proxy.server",
            ),
            (
                ActionKind::Content,
                serde_json::json!({"url": "http://a.test/", "user_agent": "a\nb"}),
                "user_agent",
            ),
        ];
        for (kind, body, expected) in cases {
            let error = refusal(kind, body.clone());
            assert!(error.contains(expected), "{body}: {error}");
        }
    }

    #[test]
    fn unknown_wait_until_and_fields_do_not_parse() {
        let error = serde_json::from_value::<ActionRequest>(
            serde_json::json!({"url": "http://a.test/", "wait_until": "networkidle0"}),
        )
        .unwrap_err();
        assert!(error.to_string().contains("unknown variant"), "{error}");
        assert!(serde_json::from_value::<ActionRequest>(serde_json::json!({"urll": "x"})).is_err());
    }
}
