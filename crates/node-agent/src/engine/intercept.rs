//! Chromium's request interception for REST actions (`Fetch`): an
//! interceptor on a connection of its own, which alone sees
//! `Fetch.requestPaused`, so a page with many requests never crowds out the
//! lifecycle events the job waits on. It serves an `html` job's document,
//! fails `block`ed requests and adds `headers`.

use base64::Engine as _;
use serde_json::{Value, json};

use flotilla_api_types::actions::{ActionRequest, HTML_URL};

use crate::engine::browser::CdpEndpoint;
use crate::engine::cdp::{CdpClient, CdpError, CdpEvent};
use crate::engine::page::{AbortOnDrop, Within};

/// Starts the interceptor of `request` on page target `target` when the job
/// serves html, blocks requests or adds headers; it stops when the returned
/// guard drops.
pub(crate) async fn start(
    endpoint: &CdpEndpoint,
    target: &str,
    request: &ActionRequest,
    within: Within,
) -> Result<Option<AbortOnDrop>, CdpError> {
    let rules = Interception::of(request);
    if rules.patterns.is_empty() {
        return Ok(None);
    }
    // It reads only paused requests (each with its headers); the html
    // document goes the other way, in a command.
    let client =
        CdpClient::open_with_events(endpoint, &endpoint.browser_path, 4 << 20, 1024).await?;
    let session = client.attach(target, within.remaining()).await?;
    let events = client.events();
    client
        .call(
            "Fetch.enable",
            json!({"patterns": rules.patterns}),
            Some(&session),
            within.remaining(),
        )
        .await?;
    let task = tokio::spawn(rules.serve(client, session, events));
    Ok(Some(AbortOnDrop(task)))
}

/// What the interceptor does with each paused request.
pub(crate) struct Interception {
    /// `Fetch.enable`'s patterns: only what the rules act on is paused.
    patterns: Vec<Value>,
    html: Option<String>,
    block_types: Vec<String>,
    block_urls: Vec<String>,
    headers: Vec<(String, String)>,
}

impl Interception {
    pub(crate) fn of(request: &ActionRequest) -> Self {
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
pub(crate) fn glob_matches(pattern: &str, text: &str) -> bool {
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
