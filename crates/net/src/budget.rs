//! The process's connection budget: how many connections every client
//! address, and all of them together, may hold open on Flotilla's listeners.
//!
//! One [`Budget`] per process is shared by all its listeners (the control
//! plane, the agent API, every instance's ports, the event proxy), because
//! what runs out is the process's descriptors. A connection takes a [`Slot`]
//! when it is accepted and gives it back when its socket closes.
//!
//! A connection is *waiting* while it has no request in flight: it was just
//! accepted, is sending a request head, or idles between requests. Waiting
//! connections cost the server nothing but a descriptor, and a slow client
//! holds thousands of them; so when an address is at its cap, or the process
//! at its total, a newcomer evicts the waiting connection that has waited
//! longest (of the same address first, else of any). A connection serving a
//! request, or upgraded to a WebSocket, is never evicted: when nothing can
//! be evicted the newcomer is refused (429 for its address, 503 for the
//! process). So a client that sends its request at once (`/health`, the API)
//! is served while an attacker holds every other descriptor half-open.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tokio_util::sync::CancellationToken;

use crate::{ListenerLimits, Runs};

/// The connections of one process. Cheap to share (`Arc`).
pub struct Budget {
    /// Connections one client address may hold.
    per_client: usize,
    /// Connections all clients may hold together.
    total: usize,
    /// Counts and the waiting queue, changed together on every accept and
    /// request: a std mutex, held for a few map operations, never across an
    /// await.
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    open: usize,
    per_client: HashMap<IpAddr, usize>,
    /// Waiting connections, oldest first: when each began to wait (a
    /// sequence number), with its address, how to end it, and whether it is
    /// still writing out a response (such a one is not evicted).
    waiting: BTreeMap<u64, Waiting>,
    next_sequence: u64,
}

struct Waiting {
    client: IpAddr,
    evict: CancellationToken,
    writing: Arc<AtomicBool>,
}

impl Waiting {
    fn evictable(&self) -> bool {
        !self.writing.load(Ordering::Relaxed)
    }
}

/// Why a connection was not taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error(
        "too many connections from your address ({0} open and busy): close some, or raise listeners.max_connections_per_client"
    )]
    ClientFull(usize),
    #[error(
        "this server holds all the connections it may ({0} open and busy): retry shortly, or raise listeners.max_connections"
    )]
    ServerFull(usize),
}

impl Refused {
    /// The whole HTTP answer, written straight to the socket before it closes.
    pub fn http_response(&self) -> Vec<u8> {
        let (status, code) = match self {
            Refused::ClientFull(_) => ("429 Too Many Requests", "rate_limited"),
            Refused::ServerFull(_) => ("503 Service Unavailable", "insufficient_capacity"),
        };
        let body = serde_json::json!({"detail": self.to_string(), "code": code}).to_string();
        format!(
            "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nRetry-After: 1\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .into_bytes()
    }
}

impl Budget {
    /// A budget of `limits`; a total of 0 means what [`Runs::default_total`]
    /// leaves of the process's descriptor limit (the rest stays for
    /// browsers' traffic, the store and files, so that the process keeps
    /// working while clients hold all they may).
    pub fn new(limits: &ListenerLimits, runs: Runs) -> Arc<Self> {
        let total = match limits.max_connections {
            0 => runs.default_total(crate::descriptors::limit()),
            n => n,
        };
        Arc::new(Self {
            per_client: limits.max_connections_per_client.max(1),
            total,
            state: Mutex::new(State::default()),
        })
    }

    /// The total this budget allows.
    pub fn total(&self) -> usize {
        self.total
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        self.state.lock().expect("budget lock").open
    }

    /// Takes a slot for a connection from `client`, evicting a waiting
    /// connection when a cap is reached. The slot starts out waiting.
    pub fn admit(self: &Arc<Self>, client: IpAddr) -> Result<Slot, Refused> {
        let mut state = self.state.lock().expect("budget lock");
        let from_client = state.per_client.get(&client).copied().unwrap_or(0);
        if from_client >= self.per_client {
            let victim = state
                .waiting
                .iter()
                .find(|(_, waiting)| waiting.client == client && waiting.evictable())
                .map(|(sequence, _)| *sequence);
            match victim {
                Some(sequence) => state.evict(sequence),
                None => return Err(Refused::ClientFull(from_client)),
            }
        }
        if state.open >= self.total {
            let victim = state
                .waiting
                .iter()
                .find(|(_, waiting)| waiting.evictable())
                .map(|(sequence, _)| *sequence);
            match victim {
                Some(sequence) => state.evict(sequence),
                None => return Err(Refused::ServerFull(state.open)),
            }
        }
        state.open += 1;
        *state.per_client.entry(client).or_default() += 1;
        let evict = CancellationToken::new();
        let writing = Arc::new(AtomicBool::new(false));
        let sequence = state.wait(client, &evict, &writing);
        drop(state);
        Ok(Slot(Arc::new(SlotInner {
            budget: self.clone(),
            client,
            evict,
            writing,
            phase: Mutex::new(Phase::Waiting(sequence)),
        })))
    }
}

impl State {
    /// Ends the waiting connection `sequence` (its slot is given back when
    /// its socket closes).
    fn evict(&mut self, sequence: u64) {
        if let Some(Waiting {
            client: address,
            evict,
            ..
        }) = self.waiting.remove(&sequence)
        {
            evict.cancel();
            // Counted as gone now: the newcomer must not wait for the close.
            self.open -= 1;
            if let Some(count) = self.per_client.get_mut(&address) {
                *count -= 1;
                if *count == 0 {
                    self.per_client.remove(&address);
                }
            }
        }
    }

    fn wait(
        &mut self,
        client: IpAddr,
        evict: &CancellationToken,
        writing: &Arc<AtomicBool>,
    ) -> u64 {
        let sequence = self.next_sequence;
        self.next_sequence += 1;
        let waiting = Waiting {
            client,
            evict: evict.clone(),
            writing: writing.clone(),
        };
        self.waiting.insert(sequence, waiting);
        sequence
    }
}

/// One accepted connection's place in the budget; given back when the last
/// clone is dropped (the socket and the request in flight both hold one).
#[derive(Clone)]
pub struct Slot(Arc<SlotInner>);

struct SlotInner {
    budget: Arc<Budget>,
    client: IpAddr,
    /// Cancelled when the connection is evicted.
    evict: CancellationToken,
    /// Set while response bytes wait to be written (the client has not
    /// read them yet): an answer still going out is not evicted.
    writing: Arc<AtomicBool>,
    /// Where the connection stands; a std mutex, held only to switch it.
    phase: Mutex<Phase>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// No request in flight since the sequence number given.
    Waiting(u64),
    /// This many requests in flight.
    Busy(usize),
    /// Upgraded (a WebSocket): busy until it closes.
    Upgraded,
    /// Evicted: already counted as gone.
    Evicted,
}

impl Slot {
    /// Fires when the connection was evicted and must close now.
    pub fn evicted(&self) -> &CancellationToken {
        &self.0.evict
    }

    /// A request arrived: the connection is busy until [`Slot::request_done`].
    pub fn request_started(&self) {
        let mut phase = self.0.phase.lock().expect("slot lock");
        match *phase {
            Phase::Waiting(sequence) => {
                let mut state = self.0.budget.state.lock().expect("budget lock");
                if state.waiting.remove(&sequence).is_none() {
                    // Evicted a moment ago; the connection is closing.
                    *phase = Phase::Evicted;
                    return;
                }
                *phase = Phase::Busy(1);
            }
            Phase::Busy(n) => *phase = Phase::Busy(n + 1),
            Phase::Upgraded | Phase::Evicted => {}
        }
    }

    /// A response was sent whole (or dropped).
    pub fn request_done(&self) {
        let mut phase = self.0.phase.lock().expect("slot lock");
        match *phase {
            Phase::Busy(1) => {
                let mut state = self.0.budget.state.lock().expect("budget lock");
                *phase = Phase::Waiting(state.wait(self.0.client, &self.0.evict, &self.0.writing));
            }
            Phase::Busy(n) => *phase = Phase::Busy(n - 1),
            Phase::Waiting(_) | Phase::Upgraded | Phase::Evicted => {}
        }
    }

    /// Whether response bytes are still on their way out (see
    /// [`StallBoundedIo`](crate::serve)): set by the socket's writes.
    pub fn set_writing(&self, writing: bool) {
        self.0.writing.store(writing, Ordering::Relaxed);
    }

    /// The connection became a WebSocket (or another protocol): never
    /// evicted, counted until it closes.
    pub fn upgraded(&self) {
        let mut phase = self.0.phase.lock().expect("slot lock");
        if let Phase::Waiting(sequence) = *phase {
            self.0
                .budget
                .state
                .lock()
                .expect("budget lock")
                .waiting
                .remove(&sequence);
        }
        if *phase != Phase::Evicted {
            *phase = Phase::Upgraded;
        }
    }
}

impl Drop for SlotInner {
    fn drop(&mut self) {
        let phase = *self.phase.get_mut().expect("slot lock");
        if phase == Phase::Evicted || self.evict.is_cancelled() {
            return;
        }
        let mut state = self.budget.state.lock().expect("budget lock");
        if let Phase::Waiting(sequence) = phase {
            state.waiting.remove(&sequence);
        }
        state.open -= 1;
        if let Some(count) = state.per_client.get_mut(&self.client) {
            *count -= 1;
            if *count == 0 {
                state.per_client.remove(&self.client);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget(per_client: usize, total: usize) -> Arc<Budget> {
        Budget::new(
            &ListenerLimits {
                max_connections_per_client: per_client,
                max_connections: total,
                ..ListenerLimits::default()
            },
            Runs::NoBrowsers,
        )
    }

    const A: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 1));
    const B: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 2));

    #[test]
    fn a_full_address_evicts_its_own_oldest_waiting_connection() {
        let budget = budget(2, 100);
        let first = budget.admit(A).unwrap();
        let second = budget.admit(A).unwrap();
        let other = budget.admit(B).unwrap();
        let third = budget.admit(A).unwrap();
        assert!(first.evicted().is_cancelled(), "the oldest of A goes");
        assert!(!second.evicted().is_cancelled());
        assert!(!other.evicted().is_cancelled(), "never another address's");
        assert_eq!(budget.open(), 3);
        drop(first);
        assert_eq!(budget.open(), 3, "an evicted slot was already counted out");
        drop((second, third, other));
        assert_eq!(budget.open(), 0);
    }

    #[test]
    fn busy_and_upgraded_connections_are_never_evicted() {
        let budget = budget(2, 100);
        let busy = budget.admit(A).unwrap();
        busy.request_started();
        let socket = budget.admit(A).unwrap();
        socket.upgraded();
        assert_eq!(budget.admit(A).err(), Some(Refused::ClientFull(2)));
        assert_eq!(budget.admit(B).map(|_| ()), Ok(()), "others still get in");
        // Once its response is out, the busy one waits again and may go.
        busy.request_done();
        let newcomer = budget.admit(A).unwrap();
        assert!(busy.evicted().is_cancelled());
        assert!(!socket.evicted().is_cancelled());
        drop((newcomer, socket, busy));
        assert_eq!(budget.open(), 0);
    }

    #[test]
    fn a_full_server_evicts_the_oldest_waiting_connection_of_anyone() {
        let budget = budget(10, 3);
        let a1 = budget.admit(A).unwrap();
        a1.request_started();
        let b1 = budget.admit(B).unwrap();
        let a2 = budget.admit(A).unwrap();
        let c = budget
            .admit(IpAddr::V4(std::net::Ipv4Addr::LOCALHOST))
            .unwrap();
        assert!(
            b1.evicted().is_cancelled(),
            "oldest waiting, of any address"
        );
        assert!(!a1.evicted().is_cancelled() && !a2.evicted().is_cancelled());
        a2.request_started();
        c.upgraded();
        assert_eq!(budget.admit(B).err(), Some(Refused::ServerFull(3)));
        let refusal = String::from_utf8(Refused::ServerFull(3).http_response()).unwrap();
        assert!(refusal.starts_with("HTTP/1.1 503"), "{refusal}");
        assert!(refusal.contains("listeners.max_connections"), "{refusal}");
    }

    #[test]
    fn a_request_that_raced_its_eviction_leaves_the_counts_right() {
        let budget = budget(1, 10);
        let old = budget.admit(A).unwrap();
        let new = budget.admit(A).unwrap();
        old.request_started();
        old.request_done();
        drop(old);
        assert_eq!(budget.open(), 1);
        drop(new);
        assert_eq!(budget.open(), 0);
        assert!(budget.state.lock().unwrap().waiting.is_empty());
        assert!(budget.state.lock().unwrap().per_client.is_empty());
    }
}
