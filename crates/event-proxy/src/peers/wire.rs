//! What peers send each other over HTTP, and how it is signed.
//!
//! Every peer request carries `X-Flotilla-Peer` (the sender's node id),
//! `X-Flotilla-Peer-Time` (Unix seconds) and `X-Flotilla-Peer-Signature`:
//! hex HMAC-SHA256, under a key derived from `peers.secret`, of
//! `<node id>\n<time>\n<path>\n<body>`. A request more than
//! [`MAX_CLOCK_SKEW_SEC`] old or ahead, or with a wrong signature, is refused
//! with 401 before its body is parsed.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

use crate::topics::{Frame, MissedEvents, Publish};

pub const PEER_HEADER: &str = "x-flotilla-peer";
pub const TIME_HEADER: &str = "x-flotilla-peer-time";
pub const SIGNATURE_HEADER: &str = "x-flotilla-peer-signature";

/// How far a peer request's time may be from ours.
pub const MAX_CLOCK_SKEW_SEC: i64 = 300;

type HmacSha256 = Hmac<Sha256>;

/// A key for one use, derived from the cluster secret (gossip packets, HTTP
/// requests and the cluster id never share a key).
pub fn derive_key(secret: &str, purpose: &str) -> [u8; 32] {
    let mut mac = HmacSha256::new_from_slice(secret.as_bytes()).expect("any key length");
    mac.update(b"flotilla peers: ");
    mac.update(purpose.as_bytes());
    mac.finalize().into_bytes().into()
}

/// HMAC-SHA256 of `parts`, concatenated.
pub fn tag(key: &[u8; 32], parts: &[&[u8]]) -> [u8; 32] {
    let mut mac = HmacSha256::new_from_slice(key).expect("any key length");
    for part in parts {
        mac.update(part);
    }
    mac.finalize().into_bytes().into()
}

/// Whether `expected` is the HMAC-SHA256 of `parts` (constant time).
pub fn verify(key: &[u8; 32], parts: &[&[u8]], expected: &[u8]) -> bool {
    let mut mac = HmacSha256::new_from_slice(key).expect("any key length");
    for part in parts {
        mac.update(part);
    }
    mac.verify_slice(expected).is_ok()
}

/// What a peer request's signature covers.
fn signed_parts<'a>(
    node_id: &'a str,
    time: &'a str,
    path: &'a str,
    body: &'a [u8],
) -> [&'a [u8]; 7] {
    [
        node_id.as_bytes(),
        b"\n",
        time.as_bytes(),
        b"\n",
        path.as_bytes(),
        b"\n",
        body,
    ]
}

/// The three signature headers for a request from `node_id` to `path`.
pub fn sign_request(
    key: &[u8; 32],
    node_id: &str,
    path: &str,
    body: &[u8],
) -> [(&'static str, String); 3] {
    let time = chrono::Utc::now().timestamp().to_string();
    let signature = tag(key, &signed_parts(node_id, &time, path, body));
    [
        (PEER_HEADER, node_id.to_owned()),
        (TIME_HEADER, time),
        (SIGNATURE_HEADER, hex::encode(signature)),
    ]
}

/// Checks a peer request's signature; returns the sender's node id.
pub fn check_request<'a>(
    key: &[u8; 32],
    header: impl Fn(&str) -> Option<&'a str>,
    path: &str,
    body: &[u8],
) -> Option<&'a str> {
    let node_id = header(PEER_HEADER)?;
    let time = header(TIME_HEADER)?;
    let signature = hex::decode(header(SIGNATURE_HEADER)?).ok()?;
    let sent: i64 = time.parse().ok()?;
    if (chrono::Utc::now().timestamp() - sent).abs() > MAX_CLOCK_SKEW_SEC {
        return None;
    }
    verify(key, &signed_parts(node_id, time, path, body), &signature).then_some(node_id)
}

/// An event numbered by its topic's owner, as it travels to peers.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WireFrame {
    pub topic: String,
    pub term: u64,
    pub seq: u64,
    /// The event's `text/event-stream` block, as subscribers get it.
    pub text: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub publisher_id: Option<String>,
}

impl WireFrame {
    pub fn new(topic: &str, frame: &Frame) -> Self {
        Self {
            topic: topic.to_owned(),
            term: frame.term,
            seq: frame.seq,
            text: String::from_utf8_lossy(&frame.bytes).into_owned(),
            publisher_id: frame.publisher_id.clone(),
        }
    }

    pub fn into_frame(self) -> Arc<Frame> {
        Arc::new(Frame {
            term: self.term,
            seq: self.seq,
            bytes: Bytes::from(self.text),
            published_at: Instant::now(),
            publisher_id: self.publisher_id,
        })
    }
}

/// An event published on a proxy that does not own its topic, on its way to
/// the owner, which numbers it.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WirePublish {
    pub topic: String,
    pub publish: Publish,
}

/// `POST /peer/v1/batch`: up to `message_batch_size` items.
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Batch {
    #[serde(default)]
    pub frames: Vec<WireFrame>,
    #[serde(default)]
    pub publishes: Vec<WirePublish>,
}

/// The answer to a batch: the id of each publish, in order.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct BatchReply {
    pub ids: Vec<String>,
}

/// `POST /peer/v1/watch`: the sender has subscribers on `topic`; the owner
/// forwards its events from now on and answers with what came after
/// `last_event_id`.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Watch {
    pub topic: String,
    #[serde(default)]
    pub last_event_id: Option<String>,
}

#[derive(Debug, Default, Serialize, Deserialize)]
pub struct WatchReply {
    pub frames: Vec<WireFrame>,
    #[serde(default)]
    pub missed: Option<MissedEvents>,
    pub placed: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signed_request_checks_and_a_tampered_one_does_not() {
        let key = derive_key("a shared secret of the cluster", "http");
        let other = derive_key("another secret entirely", "http");
        let headers = sign_request(&key, "node-a", "/peer/v1/batch", b"{}");
        let lookup = |name: &str| {
            headers
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.as_str())
        };
        assert_eq!(
            check_request(&key, lookup, "/peer/v1/batch", b"{}"),
            Some("node-a")
        );
        assert_eq!(check_request(&key, lookup, "/peer/v1/batch", b"{ }"), None);
        assert_eq!(check_request(&key, lookup, "/peer/v1/watch", b"{}"), None);
        assert_eq!(check_request(&other, lookup, "/peer/v1/batch", b"{}"), None);
        assert_ne!(derive_key("s", "http"), derive_key("s", "gossip"));
    }
}
