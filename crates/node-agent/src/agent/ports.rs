//! Port allocation for instances. Each instance takes three ports of
//! `agent.port_range`; with a real runtime they are bound at once (so that no
//! other process can take them between reservation and use), with the sim runtime
//! they are only numbers.
//!
//! The allocator remembers the ports it handed out; a port in the range that
//! another process holds is skipped. A cursor walks the range so that a port just
//! freed is not handed out again right away (clients may still hold its address).

use std::collections::HashSet;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::sync::Mutex;

use crate::config::PortRange;

/// Three listeners (or three numbers, for the sim runtime) of one instance.
#[derive(Debug)]
pub struct InstancePorts {
    pub debug: u16,
    pub stream: u16,
    pub http: u16,
    /// Bound listeners in the order debug, stream, http; `None` without binding.
    pub listeners: Option<[TcpListener; 3]>,
}

#[derive(Debug)]
pub struct PortAllocator {
    range: PortRange,
    /// Ports handed out and not yet released, and the walk position. A std mutex:
    /// held for a scan of the range, never across an await.
    state: Mutex<AllocatorState>,
    bind_address: Ipv4Addr,
}

#[derive(Debug)]
struct AllocatorState {
    in_use: HashSet<u16>,
    cursor: u16,
}

impl PortAllocator {
    pub fn new(range: PortRange, bind_address: Ipv4Addr) -> Self {
        Self {
            range,
            state: Mutex::new(AllocatorState {
                in_use: HashSet::new(),
                cursor: range.first,
            }),
            bind_address,
        }
    }

    /// Reserves three ports; binds them when `bind` is true. `None` when the
    /// range has no three free ports left.
    pub fn reserve(&self, bind: bool) -> Option<InstancePorts> {
        let mut state = self.state.lock().expect("port allocator lock poisoned");
        let mut taken: Vec<(u16, Option<TcpListener>)> = Vec::with_capacity(3);
        let total = self.range.len();
        let mut examined = 0;
        while taken.len() < 3 && examined < total {
            let port = state.cursor;
            state.cursor = if port >= self.range.last {
                self.range.first
            } else {
                port + 1
            };
            examined += 1;
            if state.in_use.contains(&port) {
                continue;
            }
            if bind {
                match bind_listener(self.bind_address, port) {
                    Ok(listener) => taken.push((port, Some(listener))),
                    Err(_) => continue,
                }
            } else {
                taken.push((port, None));
            }
        }
        if taken.len() < 3 {
            return None;
        }
        for (port, _) in &taken {
            state.in_use.insert(*port);
        }
        let ports = [taken[0].0, taken[1].0, taken[2].0];
        let listeners = if bind {
            let mut iter = taken.into_iter().map(|(_, l)| l.expect("bound listener"));
            Some([
                iter.next().expect("three"),
                iter.next().expect("three"),
                iter.next().expect("three"),
            ])
        } else {
            None
        };
        Some(InstancePorts {
            debug: ports[0],
            stream: ports[1],
            http: ports[2],
            listeners,
        })
    }

    /// Reserves exactly `ports` (debug, stream, http) if all three are free.
    pub fn reserve_exact(&self, ports: [u16; 3], bind: bool) -> Option<InstancePorts> {
        let mut state = self.state.lock().expect("port allocator lock poisoned");
        let in_range = |p: u16| p >= self.range.first && p <= self.range.last;
        if ports
            .iter()
            .any(|p| state.in_use.contains(p) || !in_range(*p))
        {
            return None;
        }
        let listeners = if bind {
            let mut bound = Vec::with_capacity(3);
            for port in ports {
                bound.push(bind_listener(self.bind_address, port).ok()?);
            }
            let mut iter = bound.into_iter();
            Some([iter.next()?, iter.next()?, iter.next()?])
        } else {
            None
        };
        for port in ports {
            state.in_use.insert(port);
        }
        Some(InstancePorts {
            debug: ports[0],
            stream: ports[1],
            http: ports[2],
            listeners,
        })
    }

    /// Returns ports to the pool.
    pub fn release(&self, ports: [u16; 3]) {
        let mut state = self.state.lock().expect("port allocator lock poisoned");
        for port in ports {
            state.in_use.remove(&port);
        }
    }

    /// Ports free for reservation (approximate: ports held by other processes count as free).
    pub fn available(&self) -> usize {
        let state = self.state.lock().expect("port allocator lock poisoned");
        self.range.len() - state.in_use.len()
    }
}

fn bind_listener(address: Ipv4Addr, port: u16) -> std::io::Result<TcpListener> {
    let listener = TcpListener::bind(SocketAddr::from((address, port)))?;
    listener.set_nonblocking(true)?;
    flotilla_net::bind::deepen_backlog(&listener)?;
    Ok(listener)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserves_distinct_ports_and_skips_busy_ones() {
        let busy = TcpListener::bind("127.0.0.1:0").unwrap();
        let busy_port = busy.local_addr().unwrap().port();
        let range = PortRange {
            first: busy_port,
            last: busy_port.saturating_add(20),
        };
        let allocator = PortAllocator::new(range, Ipv4Addr::LOCALHOST);
        let a = allocator.reserve(true).expect("first reservation");
        let b = allocator.reserve(true).expect("second reservation");
        let all = [a.debug, a.stream, a.http, b.debug, b.stream, b.http];
        assert!(
            !all.contains(&busy_port),
            "a port held elsewhere was handed out"
        );
        let unique: HashSet<_> = all.iter().collect();
        assert_eq!(unique.len(), 6);
    }

    #[test]
    fn exhausted_range_gives_none_and_release_frees() {
        let range = PortRange {
            first: 61000,
            last: 61005,
        };
        let allocator = PortAllocator::new(range, Ipv4Addr::LOCALHOST);
        let a = allocator.reserve(false).unwrap();
        let _b = allocator.reserve(false).unwrap();
        assert!(allocator.reserve(false).is_none());
        allocator.release([a.debug, a.stream, a.http]);
        assert!(allocator.reserve(false).is_some());
    }
}
