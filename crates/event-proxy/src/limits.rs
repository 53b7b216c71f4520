//! Per-client limits: the per-IP token bucket (`rate_limit_per_ip` requests per
//! `rate_limit_window_sec`, refilled continuously) and the client address
//! (`X-Forwarded-For` is believed only from a trusted proxy).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::Instant;

use flotilla_api_types::token_bucket::TokenBucket;

use crate::config::IpRange;

pub struct IpRateLimiter {
    capacity: f64,
    per_second: f64,
    /// One bucket per address. A std mutex: one lookup per request.
    buckets: Mutex<HashMap<IpAddr, TokenBucket>>,
}

impl IpRateLimiter {
    pub fn new(per_window: u32, window_sec: u64) -> Self {
        let capacity = f64::from(per_window);
        Self {
            capacity,
            per_second: capacity / window_sec.max(1) as f64,
            buckets: Mutex::default(),
        }
    }

    /// Takes one token for `ip`; `false` when its bucket is empty.
    pub fn allow(&self, ip: IpAddr) -> bool {
        self.allow_at(ip, Instant::now())
    }

    fn allow_at(&self, ip: IpAddr, now: Instant) -> bool {
        let mut buckets = self.buckets.lock().expect("limiter lock");
        let bucket = buckets
            .entry(ip)
            .or_insert_with(|| TokenBucket::full(self.capacity, now));
        bucket.refill(now, self.capacity, self.per_second);
        bucket.try_take()
    }

    /// Forgets addresses whose bucket has refilled (they are back to default).
    pub fn sweep(&self) {
        let now = Instant::now();
        self.buckets
            .lock()
            .expect("limiter lock")
            .retain(|_, bucket| !bucket.is_full_at(now, self.capacity, self.per_second));
    }
}

/// The client's address: the peer's, or — when the peer is a trusted proxy —
/// the last address in `X-Forwarded-For` that is not a trusted proxy.
pub fn client_ip(peer: IpAddr, forwarded_for: Option<&str>, trusted: &[IpRange]) -> IpAddr {
    let is_trusted = |ip: IpAddr| trusted.iter().any(|range| range.contains(ip));
    if !is_trusted(peer) {
        return peer;
    }
    let Some(chain) = forwarded_for else {
        return peer;
    };
    let mut client = peer;
    for hop in chain.rsplit(',') {
        match hop.trim().parse::<IpAddr>() {
            Ok(ip) => {
                client = ip;
                if !is_trusted(ip) {
                    break;
                }
            }
            Err(_) => break,
        }
    }
    client
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn bucket_empties_and_refills() {
        let limiter = IpRateLimiter::new(3, 60);
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        let start = Instant::now();
        for _ in 0..3 {
            assert!(limiter.allow_at(ip, start));
        }
        assert!(!limiter.allow_at(ip, start));
        assert!(
            limiter.allow_at("10.0.0.2".parse().unwrap(), start),
            "per address"
        );
        // 3 per 60 s: one token every 20 s.
        assert!(!limiter.allow_at(ip, start + Duration::from_secs(19)));
        assert!(limiter.allow_at(ip, start + Duration::from_secs(21)));
    }

    #[test]
    fn forwarded_for_only_from_trusted_proxies() {
        let trusted = [
            IpRange::parse("127.0.0.1").unwrap(),
            IpRange::parse("10.0.0.0/8").unwrap(),
        ];
        let peer: IpAddr = "127.0.0.1".parse().unwrap();
        let stranger: IpAddr = "192.0.2.9".parse().unwrap();
        assert_eq!(
            client_ip(stranger, Some("1.2.3.4"), &trusted),
            stranger,
            "untrusted peer: header ignored"
        );
        assert_eq!(
            client_ip(peer, Some("1.2.3.4"), &trusted),
            "1.2.3.4".parse::<IpAddr>().unwrap()
        );
        assert_eq!(
            client_ip(peer, Some("6.6.6.6, 1.2.3.4, 10.0.0.5"), &trusted),
            "1.2.3.4".parse::<IpAddr>().unwrap(),
            "the spoofable left part is ignored"
        );
        assert_eq!(client_ip(peer, None, &trusted), peer);
    }
}
