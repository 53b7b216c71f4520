//! The proxy's configuration sections, with the spec's key names and defaults
//! (`spec/event-proxy.md`, DESIGN.md "Configuration files"). Defaults the spec
//! does not give are chosen here and listed in `docs/configuration.md`.

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

/// Every section the proxy reads.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct ProxyConfig {
    pub http: HttpConfig,
    pub jwt_verifier: JwtVerifierConfig,
    pub rate_limit: RateLimitConfig,
    pub publisher: PublisherConfig,
    pub history: HistoryConfig,
    pub peers: PeersConfig,
}

/// What a subscriber's queue does when it is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BackpressurePolicy {
    /// Remove the oldest queued message to make room.
    #[default]
    DropOldest,
    /// Reject the new message.
    DropNewest,
    /// The publisher waits for room (at most `block_timeout_ms`); then the
    /// subscriber is cut off with a final `overflow` event.
    Block,
}

/// `[http]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct HttpConfig {
    /// `<host>:<port>` to listen on.
    pub bind_address: String,
    /// Origins allowed by CORS; `["*"]` allows any.
    pub cors_allowed_origins: Vec<String>,
    /// Open event streams at most; more get 503 "Too many connections". Below
    /// this machine's limit of 20,000 open files per process (the proxy also
    /// needs descriptors for publishers, peers and the webhook).
    pub max_connections: usize,
    /// A stream ends after this many seconds (with a `retry` hint; the client
    /// resumes with Last-Event-ID). 0: no limit.
    pub connection_timeout_sec: u64,
    /// Seconds between `: keepalive` comments.
    pub keepalive_interval_sec: u64,
    /// Worker threads; 0: one per core.
    pub thread_pool_size: usize,
    /// Messages queued per subscriber.
    pub max_message_queue_size: usize,
    pub backpressure_policy: BackpressurePolicy,
    /// With `block`: how long a publisher waits for room before cutting the
    /// subscriber off.
    pub block_timeout_ms: u64,
    /// Suggested reconnection delay sent in `retry` when a stream ends.
    pub retry_ms: u64,
}

impl Default for HttpConfig {
    fn default() -> Self {
        Self {
            bind_address: "127.0.0.1:8081".into(),
            cors_allowed_origins: vec!["*".into()],
            max_connections: 15_000,
            connection_timeout_sec: 3600,
            keepalive_interval_sec: 15,
            thread_pool_size: 0,
            max_message_queue_size: 1024,
            backpressure_policy: BackpressurePolicy::DropOldest,
            block_timeout_ms: 1000,
            retry_ms: 1000,
        }
    }
}

/// `[jwt_verifier]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct JwtVerifierConfig {
    /// The operator's verification webhook; empty turns verification off.
    pub webhook_url: String,
    /// Milliseconds one webhook call may take.
    pub timeout_ms: u64,
    /// Retries of a failed call (waits of 100, 200, 300 ms, …).
    pub retry_attempts: u32,
    /// Seconds a successful verification is cached (at most until the token expires).
    pub cache_ttl_sec: u64,
    /// Cached verifications at most; least recently used go first.
    pub cache_max_size: usize,
    /// Consecutive webhook failures that open the circuit breaker.
    pub circuit_breaker_threshold: u32,
    /// Seconds the breaker stays open before one trial call.
    pub circuit_breaker_timeout_sec: u64,
    /// Webhook calls per second at most.
    pub rate_limit_per_sec: u32,
    /// Whether a subscription must carry a token.
    pub require_authentication: bool,
}

impl Default for JwtVerifierConfig {
    fn default() -> Self {
        Self {
            webhook_url: String::new(),
            timeout_ms: 2000,
            retry_attempts: 3,
            cache_ttl_sec: 300,
            cache_max_size: 10_000,
            circuit_breaker_threshold: 5,
            circuit_breaker_timeout_sec: 30,
            rate_limit_per_sec: 100,
            require_authentication: true,
        }
    }
}

/// `[rate_limit]` (the proxy's keys; the control plane reads its own keys of the
/// same section).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RateLimitConfig {
    /// Requests per client IP per window (token bucket).
    pub rate_limit_per_ip: u32,
    pub rate_limit_window_sec: u64,
    /// Peers whose `X-Forwarded-For` is believed (addresses or CIDR ranges).
    pub trusted_proxies: Vec<String>,
}

impl Default for RateLimitConfig {
    fn default() -> Self {
        Self {
            rate_limit_per_ip: 100,
            rate_limit_window_sec: 60,
            trusted_proxies: Vec::new(),
        }
    }
}

/// `[publisher]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct PublisherConfig {
    /// Keys that may publish to any topic (`Authorization: Bearer <key>`).
    pub api_keys: Vec<String>,
    /// Largest publish request body, in bytes; larger is 413.
    pub max_body_bytes: usize,
}

impl Default for PublisherConfig {
    fn default() -> Self {
        Self {
            api_keys: Vec::new(),
            max_body_bytes: 1 << 20,
        }
    }
}

/// `[history]`: what a topic keeps for `Last-Event-ID` replay.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct HistoryConfig {
    pub size_per_topic: usize,
    pub ttl_sec: u64,
}

impl Default for HistoryConfig {
    fn default() -> Self {
        Self {
            size_per_topic: 1000,
            ttl_sec: 3600,
        }
    }
}

/// `[peers]`: several proxies as one service (see [`crate::peers`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct PeersConfig {
    /// Join peers even with an empty `peer_addresses` (a first node that others
    /// name). A non-empty `peer_addresses` turns peering on by itself.
    pub enabled: bool,
    /// UDP `<host>:<port>` for gossip; port 0 picks a free one.
    pub listen_address: String,
    /// The gossip address peers reach this proxy at; empty: the bound address.
    pub advertise_address: String,
    /// Gossip addresses of other proxies (`<host>:<port>`) to join through.
    pub peer_addresses: Vec<String>,
    /// Shared by every proxy of the cluster: signs gossip and peer requests.
    pub secret: String,
    /// This proxy's name in the cluster; empty: its gossip address.
    pub node_id: String,
    /// The URL peers send events to (this proxy's HTTP address); empty:
    /// `http://` + the bound `http.bind_address`.
    pub public_url: String,
    /// Seconds between gossip rounds.
    pub gossip_interval_sec: f64,
    /// A peer whose heartbeat has not advanced for this long is dead.
    pub peer_timeout_sec: f64,
    /// Events per peer request at most.
    pub message_batch_size: usize,
}

impl Default for PeersConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            listen_address: "127.0.0.1:7946".into(),
            advertise_address: String::new(),
            peer_addresses: Vec::new(),
            secret: String::new(),
            node_id: String::new(),
            public_url: String::new(),
            gossip_interval_sec: 1.0,
            peer_timeout_sec: 5.0,
            message_batch_size: 256,
        }
    }
}

impl PeersConfig {
    /// Whether this proxy joins peers.
    pub fn active(&self) -> bool {
        self.enabled || !self.peer_addresses.is_empty()
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        if !self.active() {
            return Ok(());
        }
        if self.secret.len() < 16 {
            return Err(ConfigError::PeersSecretShort);
        }
        address(
            "peers.listen_address",
            "127.0.0.1:7946",
            &self.listen_address,
        )?;
        if !self.advertise_address.is_empty() {
            address(
                "peers.advertise_address",
                "10.0.0.5:7946",
                &self.advertise_address,
            )?;
        }
        if !self.public_url.is_empty() {
            http_url("peers.public_url", &self.public_url)?;
        }
        for address in &self.peer_addresses {
            if address
                .rsplit_once(':')
                .and_then(|(_, port)| port.parse::<u16>().ok())
                .is_none()
            {
                return Err(ConfigError::PeerAddress {
                    address: address.clone(),
                });
            }
        }
        if !(self.gossip_interval_sec >= 0.01 && self.gossip_interval_sec <= 3600.0) {
            return Err(ConfigError::GossipInterval);
        }
        if !(self.peer_timeout_sec >= 3.0 * self.gossip_interval_sec
            && self.peer_timeout_sec <= 86_400.0)
        {
            return Err(ConfigError::PeerTimeout);
        }
        if self.message_batch_size == 0 || self.message_batch_size > 10_000 {
            return Err(ConfigError::MessageBatchSize);
        }
        Ok(())
    }
}

/// A configuration value the proxy refuses; each message names the key and
/// what it must be.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error(
        "jwt_verifier.webhook_url is empty but jwt_verifier.require_authentication is true: \
         set webhook_url to your verification webhook, or set require_authentication = false \
         to run the proxy without authentication"
    )]
    AuthWithoutWebhook,
    /// A socket address (`http.bind_address`, `peers.listen_address`, …).
    #[error("{key} must look like {example} (got {got:?})")]
    Address {
        key: &'static str,
        example: &'static str,
        got: String,
    },
    #[error("{key} {url:?} is not a URL: {source}")]
    Url {
        key: &'static str,
        url: String,
        #[source]
        source: url::ParseError,
    },
    #[error("{key} must be an http:// or https:// URL")]
    UrlScheme { key: &'static str },
    /// A count or duration that must be at least 1.
    #[error("{key} must be at least 1")]
    Zero { key: &'static str },
    #[error(transparent)]
    TrustedProxy(#[from] IpRangeError),
    #[error(
        "peers.secret must be at least 16 characters when peers are on (every proxy of the cluster shares it)"
    )]
    PeersSecretShort,
    #[error("peers.peer_addresses: {address:?} must look like <host>:<port>")]
    PeerAddress { address: String },
    #[error("peers.gossip_interval_sec must be between 0.01 and 3600")]
    GossipInterval,
    #[error(
        "peers.peer_timeout_sec must be at least 3 × peers.gossip_interval_sec (and at most 86400)"
    )]
    PeerTimeout,
    #[error("peers.message_batch_size must be between 1 and 10000")]
    MessageBatchSize,
}

/// `text` as the socket address of `key`.
fn address(
    key: &'static str,
    example: &'static str,
    text: &str,
) -> Result<SocketAddr, ConfigError> {
    text.parse().map_err(|_| ConfigError::Address {
        key,
        example,
        got: text.to_owned(),
    })
}

/// `text` as the http(s) URL of `key`.
fn http_url(key: &'static str, text: &str) -> Result<(), ConfigError> {
    let url = url::Url::parse(text).map_err(|source| ConfigError::Url {
        key,
        url: text.to_owned(),
        source,
    })?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(ConfigError::UrlScheme { key });
    }
    Ok(())
}

/// A `rate_limit.trusted_proxies` entry that is not an address or a range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IpRangeError {
    #[error("rate_limit.trusted_proxies: {entry:?} is not an IP address or CIDR range")]
    NotAnAddress { entry: String },
    #[error("rate_limit.trusted_proxies: bad prefix in {entry:?}")]
    Prefix { entry: String },
}

/// A parsed trusted-proxy entry: an address or a CIDR range.
pub type IpRange = flotilla_net::IpNetwork;

/// Trusted-proxy entry `text`, or why it is not one.
fn trusted_range(text: &str) -> Result<IpRange, IpRangeError> {
    use flotilla_net::NetworkError;
    IpRange::parse(text).map_err(|why| match why {
        NetworkError::NotValid | NetworkError::NoValidAddress => IpRangeError::NotAnAddress {
            entry: text.to_owned(),
        },
        NetworkError::NoValidPrefix | NetworkError::PrefixTooLong => IpRangeError::Prefix {
            entry: text.to_owned(),
        },
    })
}

impl ProxyConfig {
    /// Checks what serde cannot, with messages that name the key. Startup is
    /// refused when authentication is required but no webhook is set.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.bind_address()?;
        let verifier = &self.jwt_verifier;
        if verifier.webhook_url.is_empty() && verifier.require_authentication {
            return Err(ConfigError::AuthWithoutWebhook);
        }
        if !verifier.webhook_url.is_empty() {
            http_url("jwt_verifier.webhook_url", &verifier.webhook_url)?;
        }
        let positive = [
            ("http.max_connections", self.http.max_connections as u64),
            (
                "http.keepalive_interval_sec",
                self.http.keepalive_interval_sec,
            ),
            (
                "http.max_message_queue_size",
                self.http.max_message_queue_size as u64,
            ),
            ("jwt_verifier.timeout_ms", verifier.timeout_ms),
            (
                "jwt_verifier.cache_max_size",
                verifier.cache_max_size as u64,
            ),
            (
                "jwt_verifier.circuit_breaker_threshold",
                u64::from(verifier.circuit_breaker_threshold),
            ),
            (
                "jwt_verifier.rate_limit_per_sec",
                u64::from(verifier.rate_limit_per_sec),
            ),
            (
                "rate_limit.rate_limit_per_ip",
                u64::from(self.rate_limit.rate_limit_per_ip),
            ),
            (
                "rate_limit.rate_limit_window_sec",
                self.rate_limit.rate_limit_window_sec,
            ),
            ("history.size_per_topic", self.history.size_per_topic as u64),
            (
                "publisher.max_body_bytes",
                self.publisher.max_body_bytes as u64,
            ),
        ];
        for (key, value) in positive {
            if value == 0 {
                return Err(ConfigError::Zero { key });
            }
        }
        for entry in &self.rate_limit.trusted_proxies {
            trusted_range(entry)?;
        }
        self.peers.validate()
    }

    pub fn bind_address(&self) -> Result<SocketAddr, ConfigError> {
        address(
            "http.bind_address",
            "127.0.0.1:8081",
            &self.http.bind_address,
        )
    }

    pub fn trusted_proxies(&self) -> Vec<IpRange> {
        self.rate_limit
            .trusted_proxies
            .iter()
            .filter_map(|e| IpRange::parse(e).ok())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn startup_is_refused_without_webhook_when_auth_is_required() {
        let config = ProxyConfig::default();
        assert!(
            config
                .validate()
                .unwrap_err()
                .to_string()
                .contains("require_authentication")
        );
        let mut open = ProxyConfig::default();
        open.jwt_verifier.require_authentication = false;
        open.validate().unwrap();
        let mut webhook = ProxyConfig::default();
        webhook.jwt_verifier.webhook_url = "http://127.0.0.1:9/verify".into();
        webhook.validate().unwrap();
    }

    #[test]
    fn cidr_ranges() {
        let range = IpRange::parse("10.0.0.0/8").unwrap();
        assert!(range.contains("10.1.2.3".parse().unwrap()));
        assert!(!range.contains("11.0.0.1".parse().unwrap()));
        assert!(range.contains("::ffff:10.0.0.9".parse().unwrap()));
        let single = IpRange::parse("127.0.0.1").unwrap();
        assert!(single.contains("127.0.0.1".parse().unwrap()));
        assert!(!single.contains("127.0.0.2".parse().unwrap()));
        assert!(matches!(
            trusted_range("nope"),
            Err(IpRangeError::NotAnAddress { .. })
        ));
        assert!(matches!(
            trusted_range("10.0.0.0/40"),
            Err(IpRangeError::Prefix { .. })
        ));
    }
}
