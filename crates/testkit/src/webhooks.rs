//! The far side of webhooks: a verification webhook ([`WebhookFake`]) and a
//! receiver of lifecycle events that checks their signatures
//! ([`EventReceiver`]).

use std::time::Duration;

use crate::{chrono_like_now, serve_router};
use serde_json::Value;

/// One call the fake webhook received.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct WebhookCall {
    pub jwt: String,
    pub topic: String,
}

/// How the fake webhook answers a call: status, JSON body, delay.
pub type WebhookBehaviour =
    std::sync::Arc<dyn Fn(&WebhookCall, usize) -> (u16, Value, Duration) + Send + Sync>;

/// A fake of the operator's verification webhook (the far side): a real HTTP
/// server that records every call and answers as `behaviour` says.
pub struct WebhookFake {
    pub url: String,
    pub calls: std::sync::Arc<std::sync::Mutex<Vec<(std::time::Instant, WebhookCall)>>>,
    behaviour: std::sync::Arc<std::sync::Mutex<WebhookBehaviour>>,
    _task: tokio::task::JoinHandle<()>,
}

impl WebhookFake {
    pub async fn start(behaviour: WebhookBehaviour) -> Self {
        let calls: std::sync::Arc<std::sync::Mutex<Vec<(std::time::Instant, WebhookCall)>>> =
            Default::default();
        let behaviour = std::sync::Arc::new(std::sync::Mutex::new(behaviour));
        let (recorded, answers) = (calls.clone(), behaviour.clone());
        let router = axum::Router::new().route(
            "/verify",
            axum::routing::post(move |axum::Json(call): axum::Json<WebhookCall>| {
                let recorded = recorded.clone();
                let answers = answers.clone();
                async move {
                    let index = {
                        let mut calls = recorded.lock().unwrap();
                        calls.push((std::time::Instant::now(), call.clone()));
                        calls.len() - 1
                    };
                    let answer = answers.lock().unwrap().clone();
                    let (status, body, delay) = answer(&call, index);
                    tokio::time::sleep(delay).await;
                    (
                        axum::http::StatusCode::from_u16(status).unwrap(),
                        axum::Json(body),
                    )
                }
            }),
        );
        let (base, task) = serve_router(router).await;
        let url = format!("{base}/verify");
        Self {
            url,
            calls,
            behaviour,
            _task: task,
        }
    }

    /// Every token valid for a day, for user "u-<token>".
    pub fn accept_all() -> WebhookBehaviour {
        std::sync::Arc::new(|call: &WebhookCall, _| {
            let expires = chrono_like_now() + 86_400;
            (
                200,
                serde_json::json!({"valid": true, "user_id": format!("u-{}", call.jwt), "expires_at": expires}),
                Duration::ZERO,
            )
        })
    }

    /// Grants every token to user `u` for `ttl_sec` from now, answering
    /// after `delay`.
    pub fn granting(ttl_sec: i64, delay: Duration) -> WebhookBehaviour {
        std::sync::Arc::new(move |_: &WebhookCall, _| {
            let expires = chrono_like_now() + ttl_sec;
            let answer = serde_json::json!({"valid": true, "user_id": "u", "expires_at": expires});
            (200, answer, delay)
        })
    }

    pub fn set(&self, behaviour: WebhookBehaviour) {
        *self.behaviour.lock().unwrap() = behaviour;
    }

    pub fn call_count(&self) -> usize {
        self.calls.lock().unwrap().len()
    }
}

/// One webhook call an [`EventReceiver`] accepted.
#[derive(Debug, Clone)]
pub struct ReceivedEvent {
    /// `webhook-id`.
    pub id: String,
    pub payload: Value,
}

/// A receiver of the control plane's webhooks (the far side, an operator's
/// endpoint): a real HTTP server that checks each call's Standard Webhooks
/// signature with its own HMAC-SHA256, records accepted events in arrival
/// order, and can be switched down (it then answers 503 and records nothing).
pub struct EventReceiver {
    pub url: String,
    received: std::sync::Arc<std::sync::Mutex<Vec<ReceivedEvent>>>,
    up: std::sync::Arc<std::sync::atomic::AtomicBool>,
    bad_signatures: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    refused: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    _task: tokio::task::JoinHandle<()>,
}

/// Standard Webhooks: `whsec_<base64>` secrets are decoded, others used as bytes.
pub(super) fn webhook_key(secret: &str) -> Vec<u8> {
    use base64::Engine;
    secret
        .strip_prefix("whsec_")
        .and_then(|s| base64::engine::general_purpose::STANDARD.decode(s).ok())
        .unwrap_or_else(|| secret.as_bytes().to_vec())
}

pub(super) fn signature_is_valid(key: &[u8], headers: &axum::http::HeaderMap, body: &[u8]) -> bool {
    use base64::Engine;
    use hmac::Mac;
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let (Some(id), Some(timestamp), Some(signatures)) = (
        header("webhook-id"),
        header("webhook-timestamp"),
        header("webhook-signature"),
    ) else {
        return false;
    };
    let Ok(sent_at) = timestamp.parse::<i64>() else {
        return false;
    };
    if (chrono_like_now() - sent_at).abs() > 300 {
        return false;
    }
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(key).expect("any key");
    mac.update(format!("{id}.{timestamp}.").as_bytes());
    mac.update(body);
    let expected = base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes());
    signatures
        .split(' ')
        .any(|s| s.strip_prefix("v1,") == Some(expected.as_str()))
}

impl EventReceiver {
    pub async fn start(secret: &str) -> Self {
        let key = webhook_key(secret);
        let received: std::sync::Arc<std::sync::Mutex<Vec<ReceivedEvent>>> = Default::default();
        let up = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
        let bad_signatures = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let refused = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (r, u, b, f) = (
            received.clone(),
            up.clone(),
            bad_signatures.clone(),
            refused.clone(),
        );
        let router = axum::Router::new().route(
            "/hook",
            axum::routing::post(
                move |headers: axum::http::HeaderMap, body: axum::body::Bytes| {
                    let (received, up, bad, refused, key) =
                        (r.clone(), u.clone(), b.clone(), f.clone(), key.clone());
                    async move {
                        use std::sync::atomic::Ordering;
                        if !up.load(Ordering::SeqCst) {
                            refused.fetch_add(1, Ordering::SeqCst);
                            return axum::http::StatusCode::SERVICE_UNAVAILABLE;
                        }
                        if !signature_is_valid(&key, &headers, &body) {
                            bad.fetch_add(1, Ordering::SeqCst);
                            return axum::http::StatusCode::UNAUTHORIZED;
                        }
                        let Ok(payload) = serde_json::from_slice::<Value>(&body) else {
                            return axum::http::StatusCode::BAD_REQUEST;
                        };
                        let id = headers["webhook-id"]
                            .to_str()
                            .unwrap_or_default()
                            .to_owned();
                        received.lock().unwrap().push(ReceivedEvent { id, payload });
                        axum::http::StatusCode::NO_CONTENT
                    }
                },
            ),
        );
        let (base, task) = serve_router(router).await;
        let url = format!("{base}/hook");
        Self {
            url,
            received,
            up,
            bad_signatures,
            refused,
            _task: task,
        }
    }

    /// Down: every call gets 503. Up: calls are checked and recorded.
    pub fn set_up(&self, up: bool) {
        self.up.store(up, std::sync::atomic::Ordering::SeqCst);
    }

    /// Accepted events, in arrival order.
    pub fn events(&self) -> Vec<ReceivedEvent> {
        self.received.lock().unwrap().clone()
    }

    pub fn bad_signatures(&self) -> usize {
        self.bad_signatures
            .load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Calls answered 503 while down.
    pub fn refused(&self) -> usize {
        self.refused.load(std::sync::atomic::Ordering::SeqCst)
    }
}
