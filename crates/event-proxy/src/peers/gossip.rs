//! Gossip (chitchat, pinned at 0.13.0) over UDP with every datagram signed.
//!
//! chitchat's UDP transport trusts whatever arrives, and its message encoding
//! is private to the crate. So chitchat runs its own socket on loopback and
//! talks to one relay socket per remote address; the relays are the only
//! sockets facing the network. Outgoing: chitchat → relay of X → HMAC-SHA256
//! tag appended (a key derived from `peers.secret`) → X. Incoming: a datagram
//! from X whose tag verifies → relay of X → chitchat, which sees it as coming
//! from X. A datagram whose tag does not verify is dropped and counted
//! (`peer_auth_failures`): a process without the secret can neither join nor
//! change anyone's state. The cluster id is derived from the secret too.
//! A message that does not fit one datagram with its tag (chitchat fills
//! datagrams up to the UDP maximum) travels in fragments, put together before
//! the tag is checked.
//!
//! A captured datagram replayed later carries state the cluster has already
//! seen (scuttlebutt versions only go up), so it changes nothing.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use chitchat::ChitchatEnvelope;
use chitchat::transport::{RecvOutcome, SendOutcome, Socket, Transport, UdpSocket};
use tokio_util::sync::CancellationToken;

use super::wire::{tag, verify};
use crate::metrics::Metrics;

/// The largest UDP payload.
const MAX_DATAGRAM: usize = 65_507;
const TAG_LEN: usize = 32;
/// Bytes of a message per fragment.
const FRAGMENT: usize = 60_000;
const WHOLE: u8 = 0;
const PART: u8 = 1;
/// Fragment header: kind, message id (8), index, count.
const PART_HEADER: usize = 11;
/// Unfinished messages kept at most (older ones are dropped).
const MAX_PARTIAL: usize = 64;

/// A transport over one UDP socket bound before chitchat starts (so port 0
/// works and the advertised address is known).
pub struct SignedUdpTransport {
    socket: Mutex<Option<tokio::net::UdpSocket>>,
    key: [u8; 32],
    metrics: Arc<Metrics>,
}

impl SignedUdpTransport {
    pub fn new(socket: tokio::net::UdpSocket, key: [u8; 32], metrics: Arc<Metrics>) -> Self {
        Self {
            socket: Mutex::new(Some(socket)),
            key,
            metrics,
        }
    }
}

#[async_trait]
impl Transport for SignedUdpTransport {
    async fn open(&self, _listen_addr: SocketAddr) -> anyhow::Result<Box<dyn Socket>> {
        let public = self
            .socket
            .lock()
            .expect("socket lock")
            .take()
            .ok_or_else(|| anyhow::anyhow!("the gossip socket is already open"))?;
        let inner = UdpSocket::open("127.0.0.1:0".parse()?).await?;
        let relays = Arc::new(Relays {
            public: Arc::new(public),
            inner: inner.local_addr()?,
            key: self.key,
            by_remote: Mutex::default(),
            by_relay: Mutex::default(),
            stop: CancellationToken::new(),
        });
        tokio::spawn(receive_public(relays.clone(), self.metrics.clone()));
        Ok(Box::new(SignedSocket { inner, relays }))
    }
}

/// The relay sockets, by remote address and by their own address.
struct Relays {
    public: Arc<tokio::net::UdpSocket>,
    /// chitchat's socket.
    inner: SocketAddr,
    key: [u8; 32],
    by_remote: Mutex<HashMap<SocketAddr, Arc<tokio::net::UdpSocket>>>,
    by_relay: Mutex<HashMap<SocketAddr, SocketAddr>>,
    stop: CancellationToken,
}

impl Relays {
    /// The relay for `remote`, started on first use.
    async fn relay(
        self: &Arc<Self>,
        remote: SocketAddr,
    ) -> std::io::Result<Arc<tokio::net::UdpSocket>> {
        if let Some(relay) = self.by_remote.lock().expect("relays lock").get(&remote) {
            return Ok(relay.clone());
        }
        let socket = Arc::new(tokio::net::UdpSocket::bind("127.0.0.1:0").await?);
        let address = socket.local_addr()?;
        let mut by_remote = self.by_remote.lock().expect("relays lock");
        if let Some(existing) = by_remote.get(&remote) {
            return Ok(existing.clone());
        }
        by_remote.insert(remote, socket.clone());
        self.by_relay
            .lock()
            .expect("relays lock")
            .insert(address, remote);
        tokio::spawn(send_public(self.clone(), socket.clone(), remote));
        Ok(socket)
    }
}

/// chitchat → relay → signed → `remote`.
async fn send_public(relays: Arc<Relays>, relay: Arc<tokio::net::UdpSocket>, remote: SocketAddr) {
    let mut buffer = vec![0u8; MAX_DATAGRAM + 1];
    let mut next_message = rand_u64();
    loop {
        let (len, from) = tokio::select! {
            received = relay.recv_from(&mut buffer) => match received {
                Ok(received) => received,
                Err(_) => continue,
            },
            _ = relays.stop.cancelled() => return,
        };
        if from != relays.inner {
            continue;
        }
        let payload = &buffer[..len];
        let signature = tag(&relays.key, &[payload]);
        if 1 + len + TAG_LEN <= MAX_DATAGRAM {
            let mut datagram = Vec::with_capacity(1 + len + TAG_LEN);
            datagram.push(WHOLE);
            datagram.extend_from_slice(payload);
            datagram.extend_from_slice(&signature);
            send_datagram(&relays.public, remote, &datagram).await;
            continue;
        }
        let mut body = Vec::with_capacity(len + TAG_LEN);
        body.extend_from_slice(payload);
        body.extend_from_slice(&signature);
        let count = body.len().div_ceil(FRAGMENT);
        next_message = next_message.wrapping_add(1);
        for (index, chunk) in body.chunks(FRAGMENT).enumerate() {
            let mut datagram = Vec::with_capacity(PART_HEADER + chunk.len());
            datagram.push(PART);
            datagram.extend_from_slice(&next_message.to_le_bytes());
            datagram.push(index as u8);
            datagram.push(count as u8);
            datagram.extend_from_slice(chunk);
            send_datagram(&relays.public, remote, &datagram).await;
        }
    }
}

async fn send_datagram(socket: &tokio::net::UdpSocket, to: SocketAddr, datagram: &[u8]) {
    if let Err(error) = socket.send_to(datagram, to).await {
        // An unreachable peer is the failure detector's business.
        tracing::debug!(%to, %error, "gossip send failed");
    }
}

/// The network → tag checked → relay of the sender → chitchat.
async fn receive_public(relays: Arc<Relays>, metrics: Arc<Metrics>) {
    let mut buffer = vec![0u8; MAX_DATAGRAM + 1];
    let mut partial: HashMap<(SocketAddr, u64), Partial> = HashMap::new();
    loop {
        let (len, from) = tokio::select! {
            received = relays.public.recv_from(&mut buffer) => match received {
                Ok(received) => received,
                Err(error) if is_transient(&error) => continue,
                Err(error) => {
                    tracing::error!(%error, "gossip socket failed");
                    return;
                }
            },
            _ = relays.stop.cancelled() => return,
        };
        let Some(message) = reassemble(&mut partial, from, &buffer[..len]) else {
            continue;
        };
        if message.len() < TAG_LEN {
            metrics.peer_auth_failures.inc();
            continue;
        }
        let (payload, signature) = message.split_at(message.len() - TAG_LEN);
        if !verify(&relays.key, &[payload], signature) {
            metrics.peer_auth_failures.inc();
            tracing::debug!(%from, "gossip datagram with a bad signature dropped");
            continue;
        }
        match relays.relay(from).await {
            Ok(relay) => send_datagram(&relay, relays.inner, payload).await,
            Err(error) => tracing::warn!(%error, "cannot open a gossip relay socket"),
        }
    }
}

fn is_transient(error: &std::io::Error) -> bool {
    matches!(
        error.kind(),
        std::io::ErrorKind::ConnectionRefused
            | std::io::ErrorKind::ConnectionReset
            | std::io::ErrorKind::OutOfMemory
    )
}

fn rand_u64() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos() as u64;
    nanos ^ (u64::from(std::process::id()) << 32)
}

struct Partial {
    parts: Vec<Option<Vec<u8>>>,
    started: Instant,
}

/// A whole signed message from one datagram, or `None` (a fragment of one not
/// complete yet, or garbage).
fn reassemble(
    partial: &mut HashMap<(SocketAddr, u64), Partial>,
    from: SocketAddr,
    datagram: &[u8],
) -> Option<Vec<u8>> {
    match *datagram.first()? {
        WHOLE => Some(datagram[1..].to_vec()),
        PART if datagram.len() > PART_HEADER => {
            let id = u64::from_le_bytes(datagram[1..9].try_into().ok()?);
            let (index, count) = (datagram[9] as usize, datagram[10] as usize);
            if count == 0 || index >= count {
                return None;
            }
            if partial.len() >= MAX_PARTIAL {
                let cutoff = Instant::now() - Duration::from_secs(5);
                partial.retain(|_, p| p.started > cutoff);
                if partial.len() >= MAX_PARTIAL {
                    partial.clear();
                }
            }
            let entry = partial.entry((from, id)).or_insert_with(|| Partial {
                parts: vec![None; count],
                started: Instant::now(),
            });
            if entry.parts.len() != count {
                return None;
            }
            entry.parts[index] = Some(datagram[PART_HEADER..].to_vec());
            if entry.parts.iter().any(Option::is_none) {
                return None;
            }
            let done = partial.remove(&(from, id))?;
            Some(done.parts.into_iter().flatten().flatten().collect())
        }
        _ => None,
    }
}

/// What chitchat holds: its own socket, addressed through the relays.
struct SignedSocket {
    inner: UdpSocket,
    relays: Arc<Relays>,
}

impl Drop for SignedSocket {
    fn drop(&mut self) {
        self.relays.stop.cancel();
    }
}

#[async_trait]
impl Socket for SignedSocket {
    fn local_addr(&self) -> anyhow::Result<SocketAddr> {
        Ok(self.relays.public.local_addr()?)
    }

    async fn send(
        &mut self,
        to: SocketAddr,
        envelope: ChitchatEnvelope,
    ) -> anyhow::Result<SendOutcome> {
        let relay = self.relays.relay(to).await?;
        self.inner.send(relay.local_addr()?, envelope).await
    }

    async fn recv(&mut self) -> anyhow::Result<RecvOutcome> {
        loop {
            let outcome = self.inner.recv().await?;
            let remote = self
                .relays
                .by_relay
                .lock()
                .expect("relays lock")
                .get(&outcome.from_addr)
                .copied();
            if let Some(from_addr) = remote {
                return Ok(RecvOutcome {
                    from_addr,
                    ..outcome
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fragments_are_put_together_whatever_their_order() {
        let from: SocketAddr = "127.0.0.1:9".parse().unwrap();
        let mut partial = HashMap::new();
        let fragment = |index: u8, bytes: &[u8]| {
            let mut d = vec![PART];
            d.extend_from_slice(&7u64.to_le_bytes());
            d.extend_from_slice(&[index, 2]);
            d.extend_from_slice(bytes);
            d
        };
        assert_eq!(reassemble(&mut partial, from, &fragment(1, b"world")), None);
        assert_eq!(
            reassemble(&mut partial, from, &fragment(0, b"hello ")),
            Some(b"hello world".to_vec())
        );
        assert!(partial.is_empty());
        assert_eq!(
            reassemble(&mut partial, from, &[WHOLE, 1, 2]),
            Some(vec![1, 2])
        );
        assert_eq!(reassemble(&mut partial, from, &[9, 1, 2]), None);
    }
}
