//! Whose each MCP session is: the API key that opened it (and its tenant),
//! and only that key may use it (another key naming its `Mcp-Session-Id`
//! gets the same 404 as a session that never was). Each key holds at most
//! `mcp.max_sessions_per_key` sessions, its share of `mcp.max_sessions`;
//! a tenant's sessions count toward its `max_sessions`.
//!
//! rmcp's session manager knows sessions, not keys; this table sits beside
//! it (`ControlPlane::mcp_sessions`, used by the `/mcp` middleware): an
//! entry is made when an `initialize` answer names a new session, and
//! dropped when the session is ended or no longer in the manager (an idle
//! session it ended).

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use flotilla_api_types::InstanceId;

/// Session id → the principal that opened it and its tenant. A std mutex:
/// a few map operations, never held across an await.
#[derive(Default)]
pub struct SessionOwners {
    owners: Mutex<HashMap<String, Owner>>,
}

struct Owner {
    principal: String,
    tenant: Option<String>,
}

/// Why a request about a session is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SessionRefusal {
    #[error("no such MCP session: initialize a new one")]
    NotYours,
    #[error(
        "this API key holds {0} MCP sessions, its share (mcp.max_sessions_per_key): end one, or retry later"
    )]
    KeyFull(usize),
}

impl SessionOwners {
    /// Whether `principal` may open another session; `live` says which
    /// sessions the manager still holds (the others are forgotten here).
    pub fn may_open(
        &self,
        principal: &str,
        per_key: usize,
        live: impl Fn(&str) -> bool,
    ) -> Result<(), SessionRefusal> {
        let mut owners = self.owners.lock().expect("mcp owners lock");
        owners.retain(|id, _| live(id));
        let held = owners
            .values()
            .filter(|owner| owner.principal == principal)
            .count();
        if held >= per_key {
            return Err(SessionRefusal::KeyFull(held));
        }
        Ok(())
    }

    /// Records that `principal` (of `tenant`) opened session `id`.
    pub fn opened(&self, id: &str, principal: &str, tenant: Option<&str>) {
        self.owners.lock().expect("mcp owners lock").insert(
            id.to_owned(),
            Owner {
                principal: principal.to_owned(),
                tenant: tenant.map(str::to_owned),
            },
        );
    }

    /// Whether `principal` may use session `id`: it opened it.
    pub fn check(&self, id: &str, principal: &str) -> Result<(), SessionRefusal> {
        match self.owners.lock().expect("mcp owners lock").get(id) {
            Some(owner) if owner.principal == principal => Ok(()),
            _ => Err(SessionRefusal::NotYours),
        }
    }

    /// The sessions `tenant`'s keys hold.
    pub fn of_tenant(&self, tenant: &str) -> usize {
        self.owners
            .lock()
            .expect("mcp owners lock")
            .values()
            .filter(|owner| owner.tenant.as_deref() == Some(tenant))
            .count()
    }

    /// Forgets session `id` (it ended).
    pub fn ended(&self, id: &str) {
        self.owners.lock().expect("mcp owners lock").remove(id);
    }
}

/// The instances each live MCP session holds (those it created, and its
/// current one), so that an instance's view counts the sessions driving it
/// (`drivers.mcp`). Keyed by a number each session draws ([`Self::key`]);
/// a std mutex, never held across an await.
#[derive(Default)]
pub struct SessionHolds {
    next_key: AtomicU64,
    held: Mutex<HashMap<u64, Vec<InstanceId>>>,
}

impl SessionHolds {
    /// A key for a new session.
    pub fn key(&self) -> u64 {
        self.next_key.fetch_add(1, Ordering::Relaxed)
    }

    /// Session `key` now holds `instances` (and no other).
    pub fn hold(&self, key: u64, instances: Vec<InstanceId>) {
        let mut held = self.held.lock().expect("mcp holds lock");
        if instances.is_empty() {
            held.remove(&key);
        } else {
            held.insert(key, instances);
        }
    }

    /// Session `key` ended.
    pub fn release(&self, key: u64) {
        self.held.lock().expect("mcp holds lock").remove(&key);
    }

    /// How many sessions hold `instance`.
    pub fn holding(&self, instance: &InstanceId) -> u32 {
        let held = self.held.lock().expect("mcp holds lock");
        let sessions = held.values().filter(|ids| ids.contains(instance)).count();
        u32::try_from(sessions).unwrap_or(u32::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_is_its_openers_and_each_key_has_a_share() {
        let owners = SessionOwners::default();
        owners.may_open("key:a", 2, |_| true).unwrap();
        owners.opened("s1", "key:a", Some("acme"));
        owners.opened("s2", "key:a", Some("acme"));
        assert_eq!(owners.of_tenant("acme"), 2);
        assert_eq!(owners.of_tenant("globex"), 0);
        assert_eq!(owners.check("s1", "key:a"), Ok(()));
        assert_eq!(owners.check("s1", "key:b"), Err(SessionRefusal::NotYours));
        assert_eq!(
            owners.check("never", "key:a"),
            Err(SessionRefusal::NotYours)
        );
        assert_eq!(
            owners.may_open("key:a", 2, |_| true),
            Err(SessionRefusal::KeyFull(2))
        );
        owners.may_open("key:b", 2, |_| true).unwrap();
        // A session the manager no longer holds frees its key's share.
        owners.may_open("key:a", 2, |id| id != "s2").unwrap();
        assert_eq!(owners.check("s2", "key:a"), Err(SessionRefusal::NotYours));
        owners.ended("s1");
        assert_eq!(owners.check("s1", "key:a"), Err(SessionRefusal::NotYours));
    }

    #[test]
    fn an_instance_counts_the_sessions_that_hold_it() {
        let holds = SessionHolds::default();
        let (a, b) = (InstanceId::new("a"), InstanceId::new("b"));
        let (first, second) = (holds.key(), holds.key());
        assert_ne!(first, second);
        holds.hold(first, vec![a.clone(), b.clone()]);
        holds.hold(second, vec![a.clone()]);
        assert_eq!((holds.holding(&a), holds.holding(&b)), (2, 1));
        holds.hold(first, vec![b.clone()]);
        assert_eq!((holds.holding(&a), holds.holding(&b)), (1, 1));
        holds.release(second);
        holds.hold(first, Vec::new());
        assert_eq!((holds.holding(&a), holds.holding(&b)), (0, 0));
    }
}
