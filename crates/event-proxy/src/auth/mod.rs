//! Authentication and authorisation of subscribers and publishers.
//!
//! A token comes from `Authorization: Bearer <token>` (anything else in that
//! header is refused) or, when the header is absent, from `?token=` (EventSource
//! cannot set headers); it is never logged. The operator's webhook says whether
//! it is valid for the topic (`POST {jwt, topic}` → `{valid, user_id,
//! expires_at}`):
//! - a 200 with `valid: true` is a grant, cached (see [`cache`]);
//! - `valid: false`, or any 4xx, means the token is invalid (401), not a failure;
//! - `reason: "forbidden"` means valid but not for this topic (403);
//! - 5xx, a timeout or a connection error is a failure: retried after 100, 200,
//!   300 ms …, counted by the [`breaker`]; when every try failed, 503.
//!
//! Concurrent misses for one key make one webhook call; calls are limited to
//! `rate_limit_per_sec`. A grant whose token carries a `permissions` claim
//! without `<topic>:read` (or `*:read`, or `<prefix>.*:read` for the topics
//! under `<prefix>.`; `:write` for publishing) is refused with 403.

pub mod breaker;
pub mod cache;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine;
use chrono::{DateTime, TimeZone, Utc};
use futures_util::FutureExt;
use futures_util::future::{BoxFuture, Shared};
use serde::{Deserialize, Serialize};
use sha2::Digest as _;

use flotilla_api_types::clock::Clock;
use flotilla_api_types::token_bucket::TokenBucket;
use flotilla_api_types::tokens::permission_grants;

use crate::config::JwtVerifierConfig;
use crate::metrics::Metrics;
use breaker::Breaker;
use cache::{CacheKey, VerificationCache, cache_key};

/// What a token was granted.
#[derive(Debug, Clone, PartialEq)]
pub struct Grant {
    pub user_id: Option<String>,
    pub expires_at: Option<DateTime<Utc>>,
    /// The token's `permissions` claim, when it has one.
    pub permissions: Option<Vec<String>>,
    /// SHA-256 of the token, to find its grants and streams on revocation.
    pub token_sha256: Option<[u8; 32]>,
    /// When the webhook vouched for the token (a cached grant keeps the time
    /// of the call): a revocation takes back what was granted before it.
    pub verified_at: DateTime<Utc>,
}

impl Grant {
    fn anonymous() -> Self {
        Self {
            user_id: None,
            expires_at: None,
            permissions: None,
            token_sha256: None,
            verified_at: DateTime::UNIX_EPOCH,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Read,
    Write,
}

impl Action {
    fn suffix(self) -> &'static str {
        match self {
            Self::Read => "read",
            Self::Write => "write",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    Allowed(Grant),
    /// 401 "Authentication required".
    Unauthenticated,
    /// 403 "Access denied to topic".
    Forbidden,
    /// 503: the webhook cannot be asked now; retry after this many seconds.
    Unavailable {
        retry_after: u64,
    },
}

/// A token as presented.
#[derive(Debug, Clone, PartialEq)]
pub enum Presented {
    None,
    Token(String),
    /// An `Authorization` header that is not `Bearer <token>`.
    Malformed,
}

/// Reads the token from the `Authorization` header or the `token` query parameter.
pub fn presented_token(authorization: Option<&str>, query_token: Option<&str>) -> Presented {
    match authorization {
        Some(header) => match flotilla_api_types::credentials::bearer_token(header) {
            Some(token) if !token.contains(char::is_whitespace) => {
                Presented::Token(token.to_owned())
            }
            _ => Presented::Malformed,
        },
        None => match query_token {
            Some(token) if !token.is_empty() => Presented::Token(token.to_owned()),
            _ => Presented::None,
        },
    }
}

/// The webhook's verdict on one token for one topic.
#[derive(Debug, Clone, PartialEq)]
enum Verdict {
    Valid(Grant),
    Invalid,
    Forbidden,
}

#[derive(Debug, Clone, PartialEq)]
enum VerifyError {
    Unavailable(u64),
}

type Flight = Shared<BoxFuture<'static, Result<Verdict, VerifyError>>>;

pub struct Authenticator {
    config: JwtVerifierConfig,
    http: reqwest::Client,
    pub cache: VerificationCache,
    pub breaker: Breaker,
    /// Webhook calls in flight, by key (single flight). A std mutex: insert,
    /// clone, remove.
    in_flight: Mutex<HashMap<CacheKey, Flight>>,
    /// Webhook calls: `rate_limit_per_sec` of burst and per second.
    call_budget: Mutex<TokenBucket>,
    metrics: Arc<Metrics>,
    clock: Arc<dyn Clock>,
}

#[derive(Serialize)]
struct WebhookRequest<'a> {
    jwt: &'a str,
    topic: &'a str,
}

#[derive(Deserialize)]
struct WebhookResponse {
    valid: bool,
    #[serde(default)]
    user_id: Option<String>,
    #[serde(default)]
    expires_at: Option<i64>,
    #[serde(default)]
    reason: Option<String>,
}

impl Authenticator {
    pub fn new(
        config: JwtVerifierConfig,
        metrics: Arc<Metrics>,
        clock: Arc<dyn Clock>,
    ) -> Arc<Self> {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_millis(config.timeout_ms))
            .no_proxy()
            .pool_max_idle_per_host(32)
            .build()
            .expect("http client");
        Arc::new(Self {
            cache: VerificationCache::new(
                config.cache_max_size,
                config.cache_ttl_sec,
                clock.clone(),
            ),
            breaker: Breaker::new(
                config.circuit_breaker_threshold,
                config.circuit_breaker_timeout_sec,
                clock.clone(),
            ),
            call_budget: Mutex::new(TokenBucket::full(
                f64::from(config.rate_limit_per_sec),
                Instant::now(),
            )),
            in_flight: Mutex::default(),
            http,
            config,
            metrics,
            clock,
        })
    }

    /// Whether tokens are checked at all.
    pub fn enabled(&self) -> bool {
        !self.config.webhook_url.is_empty()
    }

    /// Decides on `presented` for `action` on the topic `topic_name` (`topic_hex`
    /// is what the webhook receives).
    pub async fn authorize(
        self: &Arc<Self>,
        presented: Presented,
        topic_name: &str,
        topic_hex: &str,
        action: Action,
    ) -> Decision {
        let token = match presented {
            Presented::Malformed => {
                self.metrics.auth_failures.inc();
                return Decision::Unauthenticated;
            }
            Presented::None if self.config.require_authentication => {
                self.metrics.auth_failures.inc();
                return Decision::Unauthenticated;
            }
            Presented::None => return Decision::Allowed(Grant::anonymous()),
            Presented::Token(token) => token,
        };
        if !self.enabled() {
            return Decision::Allowed(Grant::anonymous());
        }
        let key = cache_key(&token, topic_hex);
        let verdict = match self.cache.get(&key) {
            Some(grant) => {
                self.metrics.auth_cache_hits.inc();
                Ok(Verdict::Valid(grant))
            }
            None => self.verify_once(key, token, topic_hex.to_owned()).await,
        };
        match verdict {
            Ok(Verdict::Valid(grant)) => {
                if grant.expires_at.is_some_and(|at| at <= self.clock.now()) {
                    self.metrics.auth_failures.inc();
                    return Decision::Unauthenticated;
                }
                if let Some(permissions) = &grant.permissions
                    && !permissions
                        .iter()
                        .any(|p| permission_grants(p, topic_name, action.suffix()))
                {
                    return Decision::Forbidden;
                }
                Decision::Allowed(grant)
            }
            Ok(Verdict::Invalid) => {
                self.metrics.auth_failures.inc();
                Decision::Unauthenticated
            }
            Ok(Verdict::Forbidden) => Decision::Forbidden,
            Err(VerifyError::Unavailable(retry_after)) => Decision::Unavailable { retry_after },
        }
    }

    /// One webhook call per key at a time; later callers share its answer.
    async fn verify_once(
        self: &Arc<Self>,
        key: CacheKey,
        token: String,
        topic_hex: String,
    ) -> Result<Verdict, VerifyError> {
        let flight = {
            let mut in_flight = self.in_flight.lock().expect("flight lock");
            match in_flight.get(&key) {
                Some(flight) => flight.clone(),
                None => {
                    let this = self.clone();
                    let flight = async move {
                        let verdict = this.call_webhook(&token, &topic_hex).await;
                        if let Ok(Verdict::Valid(grant)) = &verdict {
                            this.cache.insert(key, grant.clone());
                        }
                        this.in_flight.lock().expect("flight lock").remove(&key);
                        verdict
                    }
                    .boxed()
                    .shared();
                    in_flight.insert(key, flight.clone());
                    flight
                }
            }
        };
        flight.await
    }

    /// Asks the webhook, with retries, the breaker and the call budget.
    async fn call_webhook(&self, token: &str, topic_hex: &str) -> Result<Verdict, VerifyError> {
        let attempts = 1 + self.config.retry_attempts;
        for attempt in 0..attempts {
            if attempt > 0 {
                tokio::time::sleep(Duration::from_millis(100 * u64::from(attempt))).await;
            }
            self.breaker.allow().map_err(VerifyError::Unavailable)?;
            if !self.take_call_budget().await {
                self.breaker.release_trial();
                return Err(VerifyError::Unavailable(1));
            }
            self.metrics.webhook_calls.inc();
            let started = Instant::now();
            let outcome = self
                .http
                .post(&self.config.webhook_url)
                .json(&WebhookRequest {
                    jwt: token,
                    topic: topic_hex,
                })
                .send()
                .await;
            self.metrics.webhook_latency.observe(started.elapsed());
            match outcome {
                Ok(response) if response.status().is_success() => {
                    match response.json::<WebhookResponse>().await {
                        Ok(answer) => {
                            self.breaker.record_success();
                            return Ok(self.verdict(answer, token));
                        }
                        Err(error) => {
                            tracing::warn!(%error, "verification webhook answered 200 with an unreadable body");
                            self.breaker.record_failure();
                            self.metrics.webhook_failures.inc();
                        }
                    }
                }
                Ok(response) if response.status().is_client_error() => {
                    // The webhook works; the token does not.
                    self.breaker.record_success();
                    return Ok(Verdict::Invalid);
                }
                Ok(response) => {
                    tracing::warn!(status = %response.status(), "verification webhook failed");
                    self.breaker.record_failure();
                    self.metrics.webhook_failures.inc();
                }
                Err(error) => {
                    tracing::warn!(error = %error.without_url(), "verification webhook unreachable");
                    self.breaker.record_failure();
                    self.metrics.webhook_failures.inc();
                }
            }
        }
        Err(VerifyError::Unavailable(
            self.breaker.allow().err().unwrap_or(1),
        ))
    }

    fn verdict(&self, answer: WebhookResponse, token: &str) -> Verdict {
        if answer.reason.as_deref() == Some("forbidden") {
            return Verdict::Forbidden;
        }
        if !answer.valid {
            return Verdict::Invalid;
        }
        let claims = jwt_claims(token);
        let expires_at = answer
            .expires_at
            .or_else(|| {
                claims
                    .as_ref()
                    .and_then(|c| c.get("exp"))
                    .and_then(|e| e.as_i64())
            })
            .and_then(|secs| Utc.timestamp_opt(secs, 0).single());
        let permissions = claims
            .as_ref()
            .and_then(|c| c.get("permissions"))
            .and_then(|p| {
                p.as_array().map(|items| {
                    items
                        .iter()
                        .filter_map(|i| i.as_str().map(str::to_owned))
                        .collect()
                })
            });
        Verdict::Valid(Grant {
            user_id: answer.user_id,
            expires_at,
            permissions,
            token_sha256: Some(sha2::Sha256::digest(token.as_bytes()).into()),
            verified_at: self.clock.now(),
        })
    }

    /// Waits for a webhook call token, at most `timeout_ms`.
    async fn take_call_budget(&self) -> bool {
        let rate = f64::from(self.config.rate_limit_per_sec);
        let deadline = Instant::now() + Duration::from_millis(self.config.timeout_ms);
        loop {
            let wait = {
                let mut budget = self.call_budget.lock().expect("budget lock");
                budget.refill(Instant::now(), rate, rate);
                if budget.try_take() {
                    return true;
                }
                budget.time_to_next(rate)
            };
            if Instant::now() + wait > deadline {
                return false;
            }
            tokio::time::sleep(wait).await;
        }
    }
}

/// The claims of a JWT (its payload), without checking the signature: the
/// webhook did that.
pub fn jwt_claims(token: &str) -> Option<serde_json::Map<String, serde_json::Value>> {
    let mut parts = token.split('.');
    let (_header, payload, _signature) = (parts.next()?, parts.next()?, parts.next()?);
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .ok()?;
    serde_json::from_slice(&bytes).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_come_from_bearer_headers_or_the_query() {
        assert_eq!(
            presented_token(Some("Bearer abc"), None),
            Presented::Token("abc".into())
        );
        assert_eq!(
            presented_token(Some("Basic abc"), None),
            Presented::Malformed
        );
        assert_eq!(presented_token(Some("Bearer "), None), Presented::Malformed);
        // RFC 7235: the scheme is case-insensitive.
        assert_eq!(
            presented_token(Some("bearer abc"), None),
            Presented::Token("abc".into())
        );
        assert_eq!(
            presented_token(None, Some("q")),
            Presented::Token("q".into())
        );
        assert_eq!(
            presented_token(Some("Bearer h"), Some("q")),
            Presented::Token("h".into()),
            "the header wins"
        );
        assert_eq!(presented_token(None, None), Presented::None);
    }

    #[test]
    fn claims_are_read_from_the_payload() {
        let payload = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .encode(br#"{"sub":"u1","exp":2000000000,"permissions":["news:read"]}"#);
        let claims = jwt_claims(&format!("eyJhbGciOiJIUzI1NiJ9.{payload}.sig")).unwrap();
        assert_eq!(claims["sub"], "u1");
        assert!(jwt_claims("not-a-jwt").is_none());
    }
}
