//! The clients an instance serves now, by kind: open DevTools and Playwright
//! connections on its ports and REST actions running on it. Each is counted
//! while its [`Attached`] guard lives, and the counts ride on the instance's
//! report (what drives it, in the control plane's list).

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use flotilla_api_types::agent::NodeClients;

use crate::protocols::client_frames::Protocol;

/// A kind of client the node counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientKind {
    Cdp,
    Playwright,
    Action,
}

impl ClientKind {
    /// The kind a relay of `protocol` counts as; WebDriver BiDi is none (the
    /// control plane knows a WebDriver session from its own record).
    pub fn of_protocol(protocol: Protocol) -> Option<Self> {
        match protocol {
            Protocol::Cdp => Some(Self::Cdp),
            Protocol::Playwright => Some(Self::Playwright),
            Protocol::Bidi => None,
        }
    }
}

/// The counts of one instance.
#[derive(Debug, Default)]
pub struct ClientCounts {
    cdp: AtomicU32,
    playwright: AtomicU32,
    actions: AtomicU32,
}

impl ClientCounts {
    fn counter(&self, kind: ClientKind) -> &AtomicU32 {
        match kind {
            ClientKind::Cdp => &self.cdp,
            ClientKind::Playwright => &self.playwright,
            ClientKind::Action => &self.actions,
        }
    }

    /// Counts a client of `kind` until the guard is dropped.
    pub fn attach(self: &Arc<Self>, kind: ClientKind) -> Attached {
        self.counter(kind).fetch_add(1, Ordering::Relaxed);
        Attached {
            counts: self.clone(),
            kind,
        }
    }

    /// The counts now.
    pub fn now(&self) -> NodeClients {
        NodeClients {
            cdp: self.cdp.load(Ordering::Relaxed),
            playwright: self.playwright.load(Ordering::Relaxed),
            actions: self.actions.load(Ordering::Relaxed),
        }
    }
}

/// One client counted in its instance's [`ClientCounts`] while it lives.
#[derive(Debug)]
pub struct Attached {
    counts: Arc<ClientCounts>,
    kind: ClientKind,
}

impl Drop for Attached {
    fn drop(&mut self) {
        self.counts
            .counter(self.kind)
            .fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_counts_while_its_guard_lives() {
        let counts = Arc::new(ClientCounts::default());
        let first = counts.attach(ClientKind::Cdp);
        let second = counts.attach(ClientKind::Cdp);
        let action = counts.attach(ClientKind::Action);
        assert_eq!(
            counts.now(),
            NodeClients {
                cdp: 2,
                playwright: 0,
                actions: 1
            }
        );
        drop(first);
        drop(action);
        let playwright = counts.attach(ClientKind::Playwright);
        assert_eq!(
            counts.now(),
            NodeClients {
                cdp: 1,
                playwright: 1,
                actions: 0
            }
        );
        drop((second, playwright));
        assert_eq!(counts.now(), NodeClients::default());
    }

    #[test]
    fn webdriver_bidi_is_not_counted_by_the_node() {
        assert_eq!(ClientKind::of_protocol(Protocol::Bidi), None);
        assert_eq!(
            ClientKind::of_protocol(Protocol::Playwright),
            Some(ClientKind::Playwright)
        );
    }
}
