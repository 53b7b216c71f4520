//! Cached successful verifications: an exact LRU of `cache_max_size` entries,
//! each living `min(cache_ttl_sec, expires_at − now)`. The key is the SHA-256 of
//! the token together with the topic, so a result for one topic never
//! authorises another.

use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex};

use chrono::{DateTime, Duration, Utc};
use lru::LruCache;
use sha2::{Digest, Sha256};

use flotilla_api_types::clock::Clock;

use super::Grant;

pub type CacheKey = [u8; 32];

pub fn cache_key(token: &str, topic_hex: &str) -> CacheKey {
    let mut hasher = Sha256::new();
    hasher.update(token.as_bytes());
    hasher.update([0u8]);
    hasher.update(topic_hex.as_bytes());
    hasher.finalize().into()
}

pub struct VerificationCache {
    /// A std mutex: every operation is a few map steps.
    entries: Mutex<LruCache<CacheKey, (Grant, DateTime<Utc>)>>,
    ttl: Duration,
    clock: Arc<dyn Clock>,
}

impl VerificationCache {
    pub fn new(max_size: usize, ttl_sec: u64, clock: Arc<dyn Clock>) -> Self {
        Self {
            entries: Mutex::new(LruCache::new(
                NonZeroUsize::new(max_size.max(1)).expect("nonzero"),
            )),
            ttl: Duration::seconds(ttl_sec as i64),
            clock,
        }
    }

    /// The cached grant, if present and alive (a hit makes it most recently used).
    pub fn get(&self, key: &CacheKey) -> Option<Grant> {
        let mut entries = self.entries.lock().expect("cache lock");
        let now = self.clock.now();
        match entries.get(key) {
            Some((grant, expires)) if *expires > now => Some(grant.clone()),
            Some(_) => {
                entries.pop(key);
                None
            }
            None => None,
        }
    }

    /// Caches `grant` for `min(ttl, grant.expires_at − now)`; nothing if that is
    /// not in the future.
    pub fn insert(&self, key: CacheKey, grant: Grant) {
        let now = self.clock.now();
        let mut until = now + self.ttl;
        if let Some(expires_at) = grant.expires_at {
            until = until.min(expires_at);
        }
        if until > now {
            self.entries
                .lock()
                .expect("cache lock")
                .put(key, (grant, until));
        }
    }

    /// Removes every entry `matches` selects; returns how many.
    pub fn evict_where(&self, matches: impl Fn(&CacheKey, &Grant) -> bool) -> usize {
        let mut entries = self.entries.lock().expect("cache lock");
        let doomed: Vec<CacheKey> = entries
            .iter()
            .filter(|(k, (g, _))| matches(k, g))
            .map(|(k, _)| *k)
            .collect();
        for key in &doomed {
            entries.pop(key);
        }
        doomed.len()
    }

    pub fn len(&self) -> usize {
        self.entries.lock().expect("cache lock").len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flotilla_api_types::clock::ManualClock;

    fn grant(user: &str, expires_at: Option<DateTime<Utc>>) -> Grant {
        Grant {
            user_id: Some(user.into()),
            expires_at,
            permissions: None,
            token_sha256: None,
            verified_at: DateTime::UNIX_EPOCH,
        }
    }

    #[test]
    fn keys_bind_token_and_topic() {
        assert_ne!(cache_key("t", "a"), cache_key("t", "b"));
        assert_ne!(cache_key("ta", ""), cache_key("t", "a"));
        assert_eq!(cache_key("t", "a"), cache_key("t", "a"));
    }

    #[test]
    fn ttl_is_the_shorter_of_config_and_token_expiry() {
        let clock = Arc::new(ManualClock::new(Utc::now()));
        let cache = VerificationCache::new(10, 300, clock.clone());
        cache.insert(cache_key("long", "t"), grant("a", None));
        let soon = clock.now() + Duration::seconds(10);
        cache.insert(cache_key("short", "t"), grant("b", Some(soon)));
        cache.insert(
            cache_key("dead", "t"),
            grant("c", Some(clock.now() - Duration::seconds(1))),
        );
        assert!(
            cache.get(&cache_key("dead", "t")).is_none(),
            "an expired token is not cached"
        );
        clock.advance(Duration::seconds(11));
        assert!(
            cache.get(&cache_key("short", "t")).is_none(),
            "gone with the token"
        );
        assert!(cache.get(&cache_key("long", "t")).is_some());
        clock.advance(Duration::seconds(290));
        assert!(
            cache.get(&cache_key("long", "t")).is_none(),
            "gone after cache_ttl_sec"
        );
    }

    #[test]
    fn least_recently_used_goes_first() {
        let clock = Arc::new(ManualClock::new(Utc::now()));
        let cache = VerificationCache::new(2, 300, clock);
        cache.insert(cache_key("a", "t"), grant("a", None));
        cache.insert(cache_key("b", "t"), grant("b", None));
        assert!(
            cache.get(&cache_key("a", "t")).is_some(),
            "a is now the most recent"
        );
        cache.insert(cache_key("c", "t"), grant("c", None));
        assert!(
            cache.get(&cache_key("b", "t")).is_none(),
            "b was least recently used"
        );
        assert!(cache.get(&cache_key("a", "t")).is_some());
        assert!(cache.get(&cache_key("c", "t")).is_some());
    }
}
