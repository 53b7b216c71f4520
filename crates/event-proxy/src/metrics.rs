//! The proxy's metrics, exposed at `GET /metrics` in the Prometheus text format
//! with exactly the names of the spec (`connections_active`,
//! `connections_total`, `messages_sent`, `bytes_sent`, `auth_cache_hits`,
//! `auth_failures`, `peers_connected`, `topics_active`, `sync_lag`) plus
//! `rate_limited_requests`, drop counters and two latency histograms.
//! Plain atomics: every hot path only adds.

use std::fmt::Write as _;

pub use flotilla_api_types::prometheus::{Counter, Gauge, Histogram};

#[derive(Default)]
pub struct Metrics {
    pub connections_active: Gauge,
    pub connections_total: Counter,
    pub messages_sent: Counter,
    pub bytes_sent: Counter,
    pub auth_cache_hits: Counter,
    pub auth_failures: Counter,
    pub peers_connected: Gauge,
    pub topics_active: Gauge,
    /// Milliseconds the oldest event not yet delivered to a peer has waited.
    pub sync_lag: Gauge,
    pub rate_limited_requests: Counter,
    pub messages_published: Counter,
    pub messages_dropped: Counter,
    pub subscribers_cut_off: Counter,
    pub webhook_calls: Counter,
    /// Peer traffic: items sent over links, send failures, frames dropped from
    /// a full link, frames received, signatures that did not verify.
    pub peer_messages_sent: Counter,
    pub peer_send_failures: Counter,
    pub peer_frames_dropped: Counter,
    pub peer_frames_received: Counter,
    pub peer_auth_failures: Counter,
    pub webhook_failures: Counter,
    /// From publish to the write of the event on a subscriber's socket.
    pub publish_to_write: Histogram,
    pub webhook_latency: Histogram,
}

/// A reading for `/metrics`: its name, its help text and how to read it.
type Reading<T> = (&'static str, &'static str, fn(&Metrics) -> T);

/// Readings of `Metrics` fields, each named after its field.
macro_rules! readings {
    ($($field:ident: $help:literal,)*) => {
        [$((stringify!($field), $help, |m: &Metrics| m.$field.get())),*]
    };
}

const COUNTERS: &[Reading<u64>] = &readings![
    connections_total: "Event streams opened since start.",
    messages_sent: "Events written to subscribers.",
    bytes_sent: "Bytes written to subscribers (events and keepalives).",
    auth_cache_hits: "Subscriptions verified from the cache.",
    auth_failures: "Subscriptions refused: missing, malformed or invalid tokens.",
    rate_limited_requests: "Requests refused by the per-IP rate limit.",
    messages_published: "Events published.",
    messages_dropped: "Events a subscriber's full queue dropped.",
    subscribers_cut_off: "Streams ended by the block policy.",
    webhook_calls: "Calls to the verification webhook.",
    webhook_failures: "Webhook calls that failed (5xx, timeout, connection).",
    peer_messages_sent: "Events and publishes delivered to peers.",
    peer_send_failures: "Peer requests that failed (sent again while the peer lives).",
    peer_frames_dropped: "Events dropped because a peer's link was full.",
    peer_frames_received: "Events received from the owners of their topics.",
    peer_auth_failures: "Gossip datagrams and peer requests refused: bad or missing signature.",
];

const GAUGES: &[Reading<i64>] = &readings![
    connections_active: "Open event streams.",
    peers_connected: "Live peer proxies (gossip heartbeat within peers.peer_timeout_sec).",
    topics_active: "Topics with at least one subscriber.",
    sync_lag: "Milliseconds the oldest event not yet delivered to a peer has waited (0: every peer is current).",
];

/// One reading in the text format: its help, its type and its value.
fn write_reading(
    out: &mut String,
    (name, help, kind): (&str, &str, &str),
    value: impl std::fmt::Display,
) {
    let _ = writeln!(
        out,
        "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}"
    );
}

impl Metrics {
    pub fn render(&self) -> String {
        let mut out = String::with_capacity(4096);
        for (name, help, value) in COUNTERS {
            write_reading(&mut out, (name, help, "counter"), value(self));
        }
        for (name, help, value) in GAUGES {
            write_reading(&mut out, (name, help, "gauge"), value(self));
        }
        self.publish_to_write.render(
            "publish_to_write_seconds",
            "From publish to the event's write on a subscriber's socket.",
            &mut out,
        );
        self.webhook_latency.render(
            "webhook_call_seconds",
            "Duration of verification webhook calls.",
            &mut out,
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn renders_every_reading_with_its_type() {
        let metrics = Metrics::default();
        metrics.messages_sent.add(3);
        metrics.publish_to_write.observe(Duration::from_micros(300));
        let text = metrics.render();
        let fields = COUNTERS.iter().map(|(name, ..)| name);
        for name in fields.chain(GAUGES.iter().map(|(name, ..)| name)) {
            assert!(
                text.contains(&format!("# TYPE {name} ")),
                "missing {name}:\n{text}"
            );
        }
        for line in [
            "messages_sent 3",
            "publish_to_write_seconds_bucket{le=\"0.0005\"} 1",
            "publish_to_write_seconds_count 1",
        ] {
            assert!(text.contains(line), "missing {line}:\n{text}");
        }
    }
}
