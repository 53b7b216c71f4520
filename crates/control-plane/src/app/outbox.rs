//! Delivery of lifecycle events from the outbox ([`crate::store`]'s `events`)
//! to their targets: every `[[webhooks]]` receiver, signed per Standard
//! Webhooks, and the event proxy (topics `instances` and `instances.<id>`).
//!
//! One task per target. Each round takes the due deliveries that are first in
//! line for their subject, so one instance's events go out in order; calls for
//! different instances run concurrently (`webhook_delivery.concurrency`). A
//! failed call is retried after 1, 2, 4 … s (at most `max_backoff_sec`, with
//! jitter) until it succeeds or `give_up_after_hours` pass. At-least-once: a
//! receiver deduplicates by `webhook-id` (the event id, the same on retries).
//! With several control planes on one store, the holder of a target's lease
//! delivers its events; another takes over within `LEASE` if it stops.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use futures_util::StreamExt as _;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use flotilla_api_types::events::EventName;

use crate::app::ControlPlane;
use crate::config::ControlPlaneConfig;
use crate::store::{Delivery, EventRoute};

/// The outbox target name of the event proxy.
pub const PROXY_TARGET: &str = "proxy";

/// Deliveries taken per round and target.
const ROUND: i64 = 256;

/// How long a control plane holds a target's deliveries (renewed at half).
const LEASE: Duration = Duration::from_secs(10);

/// Where one target's events go.
#[derive(Clone)]
enum Sink {
    Webhook {
        url: String,
        key: Arc<Vec<u8>>,
    },
    Proxy {
        batch_url: String,
        key: Option<String>,
    },
}

/// A configured target: its outbox name, the events it wants, its sink.
struct Target {
    name: String,
    events: Option<HashSet<EventName>>,
    sink: Sink,
}

fn targets(config: &ControlPlaneConfig) -> Vec<Target> {
    let mut targets: Vec<Target> = config
        .webhooks
        .iter()
        .map(|webhook| Target {
            name: format!("webhook:{}", webhook.url),
            events: (!webhook.events.is_empty()).then(|| webhook.events.iter().copied().collect()),
            sink: Sink::Webhook {
                url: webhook.url.clone(),
                key: Arc::new(secret_key(&webhook.secret)),
            },
        })
        .collect();
    if let Some(proxy_url) = &config.events.proxy_url {
        targets.push(Target {
            name: PROXY_TARGET.into(),
            events: None,
            sink: Sink::Proxy {
                batch_url: format!("{}/publish", proxy_url.trim_end_matches('/')),
                key: config.events.publish_key.clone(),
            },
        });
    }
    targets
}

/// The outbox routes of `config` (set on the store before anything changes).
pub fn routes(config: &ControlPlaneConfig) -> Vec<EventRoute> {
    targets(config)
        .into_iter()
        .map(|target| EventRoute {
            target: target.name,
            events: target.events,
        })
        .collect()
}

/// Standard Webhooks: a `whsec_` secret is base64; anything else is used as bytes.
pub fn secret_key(secret: &str) -> Vec<u8> {
    secret
        .strip_prefix("whsec_")
        .and_then(|encoded| BASE64.decode(encoded).ok())
        .unwrap_or_else(|| secret.as_bytes().to_vec())
}

/// `v1,<base64 HMAC-SHA256 of "<id>.<timestamp>.<body>">`.
pub fn sign(key: &[u8], id: &str, timestamp: i64, body: &str) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes any key length");
    mac.update(id.as_bytes());
    mac.update(b".");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body.as_bytes());
    format!("v1,{}", BASE64.encode(mac.finalize().into_bytes()))
}

/// Starts one delivery task per target; drops the deliveries of targets that
/// are no longer configured.
pub async fn spawn(
    control_plane: Arc<ControlPlane>,
    shutdown: CancellationToken,
) -> Vec<JoinHandle<()>> {
    let targets = targets(control_plane.config());
    let names: Vec<String> = targets.iter().map(|t| t.name.clone()).collect();
    match control_plane.store.deliveries_keep_only(&names).await {
        Ok(0) => {}
        Ok(dropped) => tracing::warn!(
            dropped,
            "dropped undelivered events of webhooks that are no longer configured"
        ),
        Err(error) => tracing::warn!(%error, "cannot tidy the outbox"),
    }
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs_f64(
            control_plane.config().webhook_delivery.timeout_sec,
        ))
        .user_agent(concat!("flotilla/", env!("CARGO_PKG_VERSION")))
        .build()
        .expect("the HTTP client builds");
    targets
        .into_iter()
        .map(|target| {
            let worker = Worker {
                control_plane: control_plane.clone(),
                client: client.clone(),
                target,
            };
            tokio::spawn(worker.run(shutdown.clone()))
        })
        .collect()
}

struct Worker {
    control_plane: Arc<ControlPlane>,
    client: reqwest::Client,
    target: Target,
}

/// What became of one delivery.
enum Outcome {
    Delivered,
    /// Shared by the deliveries of one failed batch (the proxy's).
    Failed(Arc<DeliveryError>),
}

/// Why a call to a target failed; stored with the delivery as its last
/// error, and it is retried (with backoff) until `give_up_after_hours`.
#[derive(Debug, thiserror::Error)]
enum DeliveryError {
    /// The webhook receiver answered but not 2xx.
    #[error("receiver answered {0}")]
    Receiver(reqwest::StatusCode),
    /// The event proxy refused the batch.
    #[error("event proxy answered {status}: {body}")]
    Proxy {
        status: reqwest::StatusCode,
        body: String,
    },
    /// The target could not be reached (or did not answer in time).
    #[error("{0}")]
    Call(#[source] reqwest::Error),
    /// The outbox holds a payload that is not JSON (it is kept as sent by
    /// the store: this is a bug).
    #[error("stored payload is not JSON: {0}")]
    StoredPayload(#[source] serde_json::Error),
}

impl Worker {
    async fn run(self, shutdown: CancellationToken) {
        let store = self.control_plane.store.clone();
        let mut signal = store.outbox_signal();
        let lease_name = format!("outbox:{}", self.target.name);
        let mut lease_until = Instant::now();
        loop {
            // One control plane of a cluster delivers a target's events.
            if lease_until.saturating_duration_since(Instant::now()) < LEASE / 2 {
                match self.control_plane.hold_lease(&lease_name, LEASE).await {
                    Ok(true) => lease_until = Instant::now() + LEASE,
                    Ok(false) | Err(_) => {
                        tokio::select! {
                            _ = tokio::time::sleep(Duration::from_secs(1)) => continue,
                            _ = shutdown.cancelled() => return,
                        }
                    }
                }
            }
            signal.borrow_and_update();
            let now = self.control_plane.now();
            let due = match store.deliveries_due(&self.target.name, now, ROUND).await {
                Ok(due) => due,
                Err(error) => {
                    tracing::warn!(target = self.target.name, %error, "cannot read the outbox");
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_secs(1)) => continue,
                        _ = shutdown.cancelled() => return,
                    }
                }
            };
            if due.is_empty() {
                let wait = match store.delivery_next_due(&self.target.name).await {
                    Ok(Some(next)) => (next - self.control_plane.now())
                        .to_std()
                        .unwrap_or_default()
                        .clamp(Duration::from_millis(10), Duration::from_secs(5)),
                    _ => Duration::from_secs(5),
                };
                tokio::select! {
                    _ = signal.changed() => {}
                    _ = tokio::time::sleep(wait) => {}
                    _ = shutdown.cancelled() => return,
                }
                continue;
            }
            let outcomes = tokio::select! {
                outcomes = self.deliver(&due) => outcomes,
                _ = shutdown.cancelled() => return,
            };
            if let Err(error) = self.record(&due, outcomes).await {
                tracing::warn!(target = self.target.name, %error, "cannot record deliveries");
            }
        }
    }

    async fn deliver(&self, due: &[Delivery]) -> Vec<Outcome> {
        match &self.target.sink {
            Sink::Webhook { url, key } => {
                let concurrency = self.control_plane.config().webhook_delivery.concurrency;
                let calls: Vec<_> = due
                    .iter()
                    .map(|delivery| self.call_webhook(url, key, delivery))
                    .collect();
                futures_util::stream::iter(calls)
                    .buffered(concurrency)
                    .collect()
                    .await
            }
            Sink::Proxy { batch_url, key } => {
                let outcome = self
                    .publish(batch_url, key.as_deref(), due)
                    .await
                    .map_err(Arc::new);
                due.iter()
                    .map(|_| match &outcome {
                        Ok(()) => Outcome::Delivered,
                        Err(error) => Outcome::Failed(error.clone()),
                    })
                    .collect()
            }
        }
    }

    async fn call_webhook(&self, url: &str, key: &[u8], delivery: &Delivery) -> Outcome {
        let timestamp = self.control_plane.now().timestamp();
        let started = Instant::now();
        let signature = sign(key, &delivery.event_id, timestamp, &delivery.payload);
        self.control_plane
            .telemetry
            .signing
            .observe(started.elapsed());
        let sent = self
            .client
            .post(url)
            .header("content-type", "application/json")
            .header("webhook-id", &delivery.event_id)
            .header("webhook-timestamp", timestamp.to_string())
            .header("webhook-signature", signature)
            .body(delivery.payload.clone())
            .send()
            .await;
        match sent {
            Ok(response) if response.status().is_success() => Outcome::Delivered,
            Ok(response) => Outcome::Failed(Arc::new(DeliveryError::Receiver(response.status()))),
            Err(error) => Outcome::Failed(Arc::new(DeliveryError::Call(error))),
        }
    }

    /// One batch on the proxy: each event on its topics ([`topics_of`]). The
    /// event id is the publisher id, so a retried batch is not published twice.
    async fn publish(
        &self,
        url: &str,
        key: Option<&str>,
        due: &[Delivery],
    ) -> Result<(), DeliveryError> {
        let mut events = Vec::with_capacity(due.len() * 3);
        for delivery in due {
            let payload: serde_json::Value =
                serde_json::from_str(&delivery.payload).map_err(DeliveryError::StoredPayload)?;
            for topic in topics_of(delivery) {
                events.push(serde_json::json!({
                    "topic": topic,
                    "event": delivery.name.as_str(),
                    "data": payload,
                    "id": format!("{}@{topic}", delivery.event_id),
                }));
            }
        }
        let mut request = self
            .client
            .post(url)
            .json(&serde_json::json!({ "events": events }));
        if let Some(key) = key {
            request = request.bearer_auth(key);
        }
        match request.send().await {
            Ok(response) if response.status().is_success() => Ok(()),
            Ok(response) => {
                let status = response.status();
                let body = response.text().await.unwrap_or_default();
                Err(DeliveryError::Proxy {
                    status,
                    body: body.trim().to_owned(),
                })
            }
            Err(error) => Err(DeliveryError::Call(error)),
        }
    }

    async fn record(&self, due: &[Delivery], outcomes: Vec<Outcome>) -> Result<(), sqlx::Error> {
        let store = &self.control_plane.store;
        let counters = self.control_plane.telemetry.deliveries(&self.target.name);
        let delivery_config = &self.control_plane.config().webhook_delivery;
        let now = self.control_plane.now();
        let mut done = Vec::new();
        for (delivery, outcome) in due.iter().zip(outcomes) {
            match outcome {
                Outcome::Delivered => {
                    counters.delivered.inc();
                    counters.failing.store(false, Ordering::Relaxed);
                    done.push(delivery);
                }
                Outcome::Failed(error) => {
                    counters.failed_attempts.inc();
                    counters.failing.store(true, Ordering::Relaxed);
                    let age = (now - delivery.created_at).num_seconds() as f64 / 3600.0;
                    if age >= delivery_config.give_up_after_hours {
                        counters.dropped.inc();
                        tracing::error!(target = self.target.name, event = delivery.event_id, %error,
                            "giving up on an event after webhook_delivery.give_up_after_hours");
                        done.push(delivery);
                        continue;
                    }
                    let wait = backoff(delivery.attempts, delivery_config.max_backoff_sec);
                    tracing::warn!(target = self.target.name, event = delivery.event_id,
                        attempt = delivery.attempts + 1, retry_in_ms = wait.as_millis() as u64, %error,
                        "event delivery failed");
                    let next = now + chrono::Duration::from_std(wait).unwrap_or_default();
                    store
                        .delivery_retry_at(delivery, next, &error.to_string())
                        .await?;
                }
            }
        }
        store.deliveries_done(&done).await
    }
}

/// Topics of an event on the proxy: an instance's on `instances`,
/// `instances.<id>` and, for a tenant's instance, `tenants.<tenant>`.
fn topics_of(delivery: &Delivery) -> Vec<String> {
    match delivery.name {
        EventName::NodeOffline | EventName::NodeOnline => vec!["nodes".into()],
        EventName::AlertRaised | EventName::AlertCleared => vec!["alerts".into()],
        _ => {
            let mut topics = vec![
                "instances".into(),
                format!("instances.{}", delivery.subject),
            ];
            if let Some(tenant) = &delivery.tenant {
                topics.push(format!("tenants.{tenant}"));
            }
            topics
        }
    }
}

/// 1, 2, 4 … s after the 1st, 2nd, 3rd … failure, at most `max_sec`, plus up
/// to 20 % jitter so that many retries do not land at once.
fn backoff(previous_attempts: i64, max_sec: f64) -> Duration {
    let base = 2f64
        .powi(previous_attempts.clamp(0, 30) as i32)
        .min(max_sec);
    Duration::from_secs_f64(base * (1.0 + rand::random::<f64>() * 0.2))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signature_matches_the_standard_webhooks_example() {
        // From the Standard Webhooks specification's reference test vector.
        let key = secret_key("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw");
        let signature = sign(
            &key,
            "msg_p5jXN8AQM9LWM0D4loKWxJek",
            1614265330,
            r#"{"test": 2432232314}"#,
        );
        assert_eq!(signature, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
    }

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        assert!(backoff(0, 300.0) >= Duration::from_secs(1));
        assert!(backoff(0, 300.0) <= Duration::from_millis(1200));
        assert!(backoff(3, 300.0) >= Duration::from_secs(8));
        assert!(backoff(20, 300.0) <= Duration::from_secs(360));
    }
}
