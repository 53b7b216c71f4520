//! A token bucket: `capacity` tokens of burst, refilled continuously at
//! `per_second`. The arithmetic every rate limit shares (the control plane's
//! per-key limit, the event proxy's per-IP limit and its webhook-call
//! budget); each keeps its own table of buckets and its own policy.

use std::time::{Duration, Instant};

/// One bucket's state; `capacity` and `per_second` belong to its owner.
#[derive(Debug, Clone, Copy)]
pub struct TokenBucket {
    tokens: f64,
    updated: Instant,
}

impl TokenBucket {
    /// A bucket with all `capacity` tokens at `now`.
    pub fn full(capacity: f64, now: Instant) -> Self {
        Self {
            tokens: capacity,
            updated: now,
        }
    }

    /// Adds what `per_second` refilled since the last call, up to `capacity`.
    pub fn refill(&mut self, now: Instant, capacity: f64, per_second: f64) {
        let elapsed = now.saturating_duration_since(self.updated).as_secs_f64();
        self.tokens = (self.tokens + elapsed * per_second).min(capacity);
        self.updated = now;
    }

    /// Takes one token; `false` when fewer than one is left.
    pub fn try_take(&mut self) -> bool {
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// Tokens left (as of the last refill).
    pub fn tokens(&self) -> f64 {
        self.tokens
    }

    /// How long until one token is there, at `per_second`.
    pub fn time_to_next(&self, per_second: f64) -> Duration {
        Duration::from_secs_f64(((1.0 - self.tokens).max(0.0) / per_second).max(0.0))
    }

    /// Whether it is full again at `now`: a bucket like a new one, which a
    /// table may forget.
    pub fn is_full_at(&self, now: Instant, capacity: f64, per_second: f64) -> bool {
        let elapsed = now.saturating_duration_since(self.updated).as_secs_f64();
        self.tokens + elapsed * per_second >= capacity
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_bursts_refills_and_caps() {
        let start = Instant::now();
        let mut bucket = TokenBucket::full(2.0, start);
        assert!(bucket.try_take() && bucket.try_take());
        assert!(!bucket.try_take(), "the burst is spent");
        assert_eq!(bucket.time_to_next(4.0), Duration::from_millis(250));
        bucket.refill(start + Duration::from_millis(250), 2.0, 4.0);
        assert!(bucket.try_take(), "a quarter second refills one at 4/s");
        assert!(!bucket.is_full_at(start + Duration::from_millis(300), 2.0, 4.0));
        assert!(bucket.is_full_at(start + Duration::from_secs(1), 2.0, 4.0));
        bucket.refill(start + Duration::from_secs(60), 2.0, 4.0);
        assert_eq!(bucket.tokens(), 2.0, "never above capacity");
    }
}
