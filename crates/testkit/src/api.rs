//! [`Api`]: calls to a control plane's HTTP API with an optional API key.

use std::time::Duration;

use crate::{StatusCode, wait_until};
use serde_json::Value;

/// A JSON API client for one control plane.
#[derive(Clone)]
pub struct Api {
    pub base: String,
    pub http: reqwest::Client,
}

impl Api {
    /// Background task `name` as `GET /health` lists it (`Null` before it
    /// first ran).
    pub async fn background_task(&self, name: &str) -> Value {
        let (_, health) = self.get("/health").await;
        health["background"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|task| task["name"] == name)
            .cloned()
            .unwrap_or_default()
    }

    pub fn new(base: impl Into<String>) -> Self {
        Self {
            base: base.into(),
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(120))
                .no_proxy()
                .build()
                .expect("http client"),
        }
    }

    /// A client that sends `Authorization: Bearer <key>` with every request.
    pub fn with_key(base: impl Into<String>, key: &str) -> Self {
        let mut headers = reqwest::header::HeaderMap::new();
        headers.insert(
            reqwest::header::AUTHORIZATION,
            format!("Bearer {key}").parse().expect("a header value"),
        );
        Self {
            base: base.into(),
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(120))
                .no_proxy()
                .default_headers(headers)
                .build()
                .expect("http client"),
        }
    }

    /// Any request; returns status and body as JSON (or `Value::String` for non-JSON).
    pub async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&str>,
    ) -> (StatusCode, Value) {
        let mut request = self.http.request(method, format!("{}{path}", self.base));
        if let Some(body) = body {
            request = request
                .header("content-type", "application/json")
                .body(body.to_owned());
        }
        Self::send(request).await
    }

    /// Sends `request`; status and body as JSON (or `Value::String`).
    pub(super) async fn send(request: reqwest::RequestBuilder) -> (StatusCode, Value) {
        let response = request
            .send()
            .await
            .expect("request reaches the control plane");
        let status = response.status();
        let text = response.text().await.unwrap_or_default();
        let value = serde_json::from_str(&text).unwrap_or(Value::String(text));
        (status, value)
    }

    pub async fn get(&self, path: &str) -> (StatusCode, Value) {
        self.call(reqwest::Method::GET, path, None).await
    }

    /// A POST of raw bytes with `content_type`; status and body as [`Api::call`].
    pub async fn post_bytes(
        &self,
        path: &str,
        content_type: &str,
        body: Vec<u8>,
    ) -> (StatusCode, Value) {
        let request = self
            .http
            .post(format!("{}{path}", self.base))
            .header("content-type", content_type)
            .body(body);
        Self::send(request).await
    }

    pub async fn post(&self, path: &str, body: &str) -> (StatusCode, Value) {
        self.call(reqwest::Method::POST, path, Some(body)).await
    }

    pub async fn delete(&self, path: &str) -> (StatusCode, Value) {
        self.call(reqwest::Method::DELETE, path, None).await
    }

    /// Creates an instance and asserts 201.
    pub async fn create(&self, body: &str) -> Value {
        let (status, value) = self.post("/v2/instances", body).await;
        assert_eq!(status, StatusCode::CREATED, "create failed: {value}");
        value
    }

    /// Creates an instance with `body` and waits (a real browser's
    /// [`crate::BROWSER_DEADLINE`]) until it runs: its id, the create's
    /// answer (with `urls`) and the instance's detail once running.
    pub async fn create_running(&self, body: &str) -> (String, Value, Value) {
        let created = self.create(body).await;
        let id = created["id"].as_str().expect("an id").to_owned();
        let detail = self
            .wait_for_status(&id, "running", crate::BROWSER_DEADLINE)
            .await;
        (id, created, detail)
    }

    /// Deletes instance `id`, asserting 200; its answer.
    pub async fn delete_instance(&self, id: &str) -> Value {
        let (status, body) = self.delete(&format!("/v2/instances/{id}")).await;
        assert_eq!(status, StatusCode::OK, "delete of {id}: {body}");
        body
    }

    /// Parks instance `id` (`POST …/dormant`), asserting 200; its answer.
    pub async fn park(&self, id: &str) -> Value {
        self.instance_action(id, "dormant").await
    }

    /// Revives instance `id` (`POST …/revive`), asserting 200; its answer.
    pub async fn revive(&self, id: &str) -> Value {
        self.instance_action(id, "revive").await
    }

    async fn instance_action(&self, id: &str, action: &str) -> Value {
        let (status, body) = self.post(&format!("/v2/instances/{id}/{action}"), "").await;
        assert_eq!(status, StatusCode::OK, "{action} of {id}: {body}");
        body
    }

    /// Waits (up to `deadline`) until the control plane's outbox is empty:
    /// every webhook delivery has been made and recorded.
    pub async fn wait_outbox_empty(&self, deadline: Duration) {
        wait_until(deadline, "an empty outbox", || async {
            let (_, text) = self.get("/metrics").await;
            let empty = text
                .as_str()
                .unwrap_or_default()
                .contains("service_outbox_depth 0");
            Ok::<_, String>(empty.then_some(()))
        })
        .await
        .unwrap();
    }

    /// Waits until the instance has `status` (fails early on failed/stopped).
    pub async fn wait_for_status(&self, id: &str, status: &str, deadline: Duration) -> Value {
        let path = format!("/v2/instances/{id}");
        wait_until(
            deadline,
            &format!("instance {id} to be {status}"),
            || async {
                let (code, value) = self.get(&path).await;
                if code != StatusCode::OK {
                    return Err(format!("GET {path} → {code}: {value}"));
                }
                let now = value["status"].as_str().unwrap_or_default();
                if now == status {
                    return Ok(Some(value));
                }
                if status != now && ["failed", "stopped"].contains(&now) {
                    panic!("instance {id} is {now} instead of {status}: {value}");
                }
                Err(format!("status {now}"))
            },
        )
        .await
        .unwrap()
    }
}

/// The keys of JSON object `value`, sorted (to compare a response's fields).
pub fn sorted_keys(value: &Value) -> Vec<&str> {
    let mut keys: Vec<&str> = value
        .as_object()
        .expect("a JSON object")
        .keys()
        .map(String::as_str)
        .collect();
    keys.sort_unstable();
    keys
}

/// `GET url` (no credential), its body as JSON.
pub async fn get_json(url: &str) -> Value {
    let response = reqwest::get(url).await.expect("GET answers");
    response.json().await.expect("a JSON body")
}

/// `GET url` (no credential), its body as text.
pub async fn get_text(url: &str) -> String {
    let response = reqwest::get(url).await.expect("GET answers");
    response.text().await.expect("a text body")
}

/// Checks an answer `(status, body)` is the error `want_status` with `code`,
/// whose detail mentions `mention`, and nothing else.
pub fn assert_error(
    (status, body): (StatusCode, Value),
    want_status: StatusCode,
    code: &str,
    mention: &str,
) {
    assert_eq!(status, want_status, "{body}");
    assert_eq!(body["code"], code, "{body}");
    let detail = body["detail"].as_str().expect("detail is a string");
    assert!(
        detail.contains(mention),
        "detail {detail:?} should mention {mention:?}"
    );
    assert_eq!(
        body.as_object().unwrap().len(),
        2,
        "only detail and code: {body}"
    );
}
