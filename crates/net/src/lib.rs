//! Every listening socket of Flotilla: binding it ([`bind`]), the process's
//! connection budget ([`budget`]) and serving HTTP on it so that a slow or
//! greedy client cannot hold the process ([`serve`]); relaying a WebSocket
//! upgrade to an upstream ([`upgrade`]); the IP networks settings name
//! ([`network`]). The control plane, the
//! agent API, every instance's ports and the event proxy all listen through
//! here, sharing one [`Listeners`] per process.

pub mod bind;
pub mod budget;
pub mod descriptors;
pub mod network;
pub mod serve;
pub mod upgrade;

use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use bind::bind;
pub use network::{IpNetwork, NetworkError};

/// Whether a process runs browsers, which decides what its listeners may
/// take of its descriptors by default (`[listeners] max_connections = 0`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Runs {
    /// `serve` and `agent`: half the descriptors stay for the browsers'
    /// traffic (their gateways' upstream sockets, pipes, files).
    Browsers,
    /// `control` and `proxy`: all but a reserve for the store, files and
    /// outgoing calls (webhooks, peers, agents) go to listeners.
    NoBrowsers,
}

impl Runs {
    /// The default connection total for a process of `descriptors` files.
    pub fn default_total(self, descriptors: usize) -> usize {
        let total = match self {
            Runs::Browsers => descriptors / 2,
            Runs::NoBrowsers => descriptors - (descriptors / 4).min(RESERVED_DESCRIPTORS),
        };
        total.max(64)
    }
}

/// Descriptors a process that runs no browsers keeps out of its listeners'
/// reach by default.
pub const RESERVED_DESCRIPTORS: usize = 1024;
pub use budget::{Budget, Refused, Slot};
pub use serve::{Body, Listeners};

/// The `[listeners]` section: what one client, and all of them, may hold.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ListenerLimits {
    /// A request head must arrive within this many seconds of the connection
    /// (or of the previous response, on a kept-alive connection).
    pub header_read_timeout_sec: f64,
    /// A request body that sends nothing, or a client that reads nothing of
    /// a response, for this many seconds loses its connection.
    pub idle_timeout_sec: f64,
    /// Connections one client address may hold open at once, over all the
    /// process's listeners.
    pub max_connections_per_client: usize,
    /// Connections all clients may hold open at once; 0 = what [`Runs`]
    /// leaves of the process's descriptor limit.
    pub max_connections: usize,
}

impl Default for ListenerLimits {
    fn default() -> Self {
        Self {
            header_read_timeout_sec: 10.0,
            idle_timeout_sec: 60.0,
            max_connections_per_client: 1024,
            max_connections: 0,
        }
    }
}

impl ListenerLimits {
    pub fn header_read_timeout(&self) -> Duration {
        Duration::from_secs_f64(self.header_read_timeout_sec)
    }

    pub fn idle_timeout(&self) -> Duration {
        Duration::from_secs_f64(self.idle_timeout_sec)
    }

    /// Checks values that serde cannot; the message names the key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        for (key, value) in [
            ("header_read_timeout_sec", self.header_read_timeout_sec),
            ("idle_timeout_sec", self.idle_timeout_sec),
        ] {
            if !(value.is_finite() && (0.1..=86_400.0).contains(&value)) {
                return Err(ConfigError::Timeout { key, value });
            }
        }
        if self.max_connections_per_client == 0 {
            return Err(ConfigError::NoConnectionsPerClient);
        }
        Ok(())
    }
}

/// A `[listeners]` value out of its range.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConfigError {
    #[error("listeners.{key} must be between 0.1 and 86400 seconds (got {value})")]
    Timeout { key: &'static str, value: f64 },
    #[error("listeners.max_connections_per_client must be at least 1")]
    NoConnectionsPerClient,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_without_browsers_keeps_only_a_reserve_of_its_descriptors() {
        assert_eq!(Runs::Browsers.default_total(20_000), 10_000);
        assert_eq!(Runs::NoBrowsers.default_total(20_000), 18_976);
        assert_eq!(Runs::NoBrowsers.default_total(1024), 768);
        assert_eq!(Runs::NoBrowsers.default_total(10), 64);
    }
}
