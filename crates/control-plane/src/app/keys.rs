//! API keys: the accepted keys (admin `api_keys`, tenants' `[[tenants]]
//! api_keys`) as SHA-256 digests, who a presented key lets a request act as
//! ([`KeyRing::caller_of_key`], every key compared in constant time), and the
//! rate limiter's token buckets per key. Reading a credential from a request
//! is the HTTP layer's (`http::guard`).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

use sha2::{Digest, Sha256};

use flotilla_api_types::agent::InstanceAccessPolicy;
use flotilla_api_types::credentials::{constant_time_eq, matches_any_digest};
use flotilla_api_types::token_bucket::TokenBucket;

use super::Scope;
use crate::config::{ControlPlaneConfig, key_digest};

/// Who made a request: `key:<first 12 hex of its hash>`, or `anonymous`.
#[derive(Debug, Clone)]
pub struct Principal(pub String);

/// The SHA-256 of the API key a request carried (beside its [`Principal`]),
/// for what a node must tell apart by key: a WebDriver session is its key's
/// on the instance's own port too.
#[derive(Debug, Clone, Copy)]
pub struct KeyDigest(pub [u8; 32]);

impl Principal {
    /// The request carried an accepted API key.
    pub fn is_key(&self) -> bool {
        self.0.starts_with("key:")
    }

    /// Whether the caller of an open route (`/health`, Grid's `/status`)
    /// may read the fleet's inner workings (nodes, their load, background
    /// errors): with authentication off anyone, otherwise an admin key.
    pub fn reads_the_fleet(&self, auth_enabled: bool, scope: &Scope) -> bool {
        !auth_enabled || (self.is_key() && *scope == Scope::Admin)
    }
}

/// Accepted API keys (SHA-256) and the rate limiter.
pub struct KeyRing {
    pub auth_enabled: bool,
    pub metrics_require_auth: bool,
    /// Admin keys (`api_keys`).
    key_hashes: Vec<[u8; 32]>,
    /// Tenant keys (`[[tenants]] api_keys`), with their tenant's scope.
    tenant_keys: Vec<([u8; 32], Scope)>,
    /// `rate_limit`, when enabled.
    pub limiter: Option<RateLimiter>,
}

/// Who a request's key lets it act as.
pub struct Caller {
    pub principal: Principal,
    pub digest: KeyDigest,
    pub scope: Scope,
}

impl KeyRing {
    /// From a validated configuration (an entry that is not a key is skipped).
    pub fn new(config: &ControlPlaneConfig) -> Self {
        Self {
            auth_enabled: config.auth_enabled,
            metrics_require_auth: config.metrics_require_auth,
            key_hashes: config
                .api_keys
                .iter()
                .filter_map(|k| key_digest(k).ok())
                .collect(),
            tenant_keys: config
                .tenants
                .iter()
                .flat_map(|tenant| {
                    let scope = Scope::Tenant(tenant.name.as_str().into());
                    tenant
                        .api_keys
                        .iter()
                        .filter_map(move |k| Some((key_digest(k).ok()?, scope.clone())))
                })
                .collect(),
            limiter: config
                .rate_limit
                .enabled
                .then(|| RateLimiter::new(config.rate_limit.requests_per_minute)),
        }
    }

    /// Who `presented` lets a request act as, when it is an accepted key
    /// (admin or tenant): every key is compared, whichever matches.
    pub fn caller_of_key(&self, presented: &str) -> Option<Caller> {
        let hash: [u8; 32] = Sha256::digest(presented.as_bytes()).into();
        let admin = matches_any_digest(presented.as_bytes(), &self.key_hashes);
        let mut tenant = None;
        for (digest, scope) in &self.tenant_keys {
            if constant_time_eq(digest, &hash) {
                tenant = Some(scope.clone());
            }
        }
        let scope = match (admin, tenant) {
            (true, _) => Scope::Admin,
            (false, Some(scope)) => scope,
            (false, None) => return None,
        };
        Some(Caller {
            principal: Principal(format!("key:{}", &hex::encode(hash)[..12])),
            digest: KeyDigest(hash),
            scope,
        })
    }

    /// What agents need to admit clients on instance ports: the admin keys
    /// (a tenant's key reaches its instances through the front door, or
    /// with their own tokens, which `urls` carry).
    pub fn instance_access_policy(&self) -> InstanceAccessPolicy {
        InstanceAccessPolicy {
            auth_enabled: self.auth_enabled,
            api_key_sha256: self.key_hashes.iter().map(hex::encode).collect(),
        }
    }
}

/// What the limiter says about one request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Quota {
    pub limit: u32,
    pub remaining: u32,
    /// Unix time at which the bucket is full again.
    pub reset_unix: i64,
    /// Seconds until one more request is allowed (refusals only).
    pub retry_after_sec: u64,
}

/// Token buckets per key: `per_minute` requests of burst, refilled at
/// `per_minute / 60` per second.
pub struct RateLimiter {
    per_minute: u32,
    buckets: Mutex<HashMap<String, TokenBucket>>,
}

/// Buckets kept before full ones are swept.
const SWEEP_AT: usize = 10_000;

impl RateLimiter {
    pub fn new(per_minute: u32) -> Self {
        Self {
            per_minute,
            buckets: Mutex::default(),
        }
    }

    /// Takes one request for `key` at Unix time `now_unix`.
    pub fn take(&self, key: &str, now_unix: i64) -> Result<Quota, Quota> {
        let capacity = f64::from(self.per_minute);
        let per_sec = capacity / 60.0;
        let now = Instant::now();
        let mut buckets = self.buckets.lock().expect("rate limiter lock");
        if buckets.len() >= SWEEP_AT {
            buckets.retain(|_, bucket| !bucket.is_full_at(now, capacity, per_sec));
        }
        let bucket = buckets
            .entry(key.to_owned())
            .or_insert_with(|| TokenBucket::full(capacity, now));
        bucket.refill(now, capacity, per_sec);
        let allowed = bucket.try_take();
        let tokens = bucket.tokens();
        let quota = Quota {
            limit: self.per_minute,
            remaining: tokens.floor() as u32,
            reset_unix: now_unix + ((capacity - tokens) / per_sec).ceil() as i64,
            retry_after_sec: if allowed {
                0
            } else {
                bucket.time_to_next(per_sec).as_secs_f64().ceil().max(1.0) as u64
            },
        };
        if allowed { Ok(quota) } else { Err(quota) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_allow_a_burst_then_refuse() {
        let limiter = RateLimiter::new(3);
        for remaining in [2, 1, 0] {
            let quota = limiter.take("a", 1000).unwrap();
            assert_eq!(quota.remaining, remaining);
            assert_eq!(quota.limit, 3);
        }
        let refused = limiter.take("a", 1000).unwrap_err();
        assert_eq!(refused.remaining, 0);
        assert!(refused.retry_after_sec >= 19, "{refused:?}");
        assert!(refused.reset_unix > 1000 + 50, "{refused:?}");
        assert!(limiter.take("b", 1000).is_ok(), "keys are independent");
    }

    #[test]
    fn keys_are_hashed_and_compared_whole() {
        let hash = key_digest("secret").unwrap();
        let configured = format!("sha256:{}", hex::encode(hash));
        assert_eq!(key_digest(&configured).unwrap(), hash);
        assert!(key_digest("sha256:zz").is_err());
        assert!(matches_any_digest(b"secret", &[hash]));
        assert!(!matches_any_digest(b"secreT", &[hash]));
    }
}
