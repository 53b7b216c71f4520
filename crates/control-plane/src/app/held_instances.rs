//! Instances a control plane's work holds and must end: a `/v2/playwright`
//! connection's instance (deleted when its client leaves) and a REST
//! action's (deleted when the action ends). Each is held in the store
//! (`held_instances`) by this control plane's name; while the work runs,
//! its hold is renewed every [`RENEW_EVERY`] for [`HELD_FOR`]. When the
//! holder stops (killed, its machine gone) the hold lapses, and the "held
//! instance takeover" sweep, on whichever control plane runs it, deletes
//! the instance. A delete that fails (the work's own, or a takeover's)
//! makes the hold lapse at once, nobody's: the next sweep tries again.
//! A control plane never takes over its own holds (its work may still run,
//! its renewal only late); the control planes' clocks must agree, as for
//! every lease.

use std::collections::HashSet;
use std::sync::Mutex;
use std::time::Duration;

use flotilla_api_types::InstanceId;

use crate::app::ControlPlane;
use crate::error::{Error, Result};

/// How long a hold lasts unless renewed.
pub const HELD_FOR: chrono::Duration = chrono::Duration::seconds(30);

/// How often a control plane renews what its work holds.
pub const RENEW_EVERY: Duration = Duration::from_secs(10);

/// The work that holds an instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeldFor {
    /// A `/v2/playwright` connection.
    Playwright,
    /// A REST action.
    Action,
}

impl HeldFor {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Playwright => "playwright",
            Self::Action => "action",
        }
    }
}

/// The instances this process's running work holds (what it renews).
#[derive(Default)]
pub struct Held {
    instances: Mutex<HashSet<InstanceId>>,
}

impl Held {
    fn add(&self, id: &InstanceId) {
        self.instances.lock().expect("held lock").insert(id.clone());
    }

    fn remove(&self, id: &InstanceId) {
        self.instances.lock().expect("held lock").remove(id);
    }

    fn all(&self) -> Vec<InstanceId> {
        self.instances
            .lock()
            .expect("held lock")
            .iter()
            .cloned()
            .collect()
    }
}

impl ControlPlane {
    /// This control plane's work now holds `id` (until it lets it go). A
    /// hold that cannot be written is logged: the instance then ends only
    /// with its work, or by its idle timeout or lifetime.
    pub(crate) async fn instance_hold(&self, id: &InstanceId, work: HeldFor) {
        self.held.add(id);
        let until = self.now() + HELD_FOR;
        let taken = self
            .store
            .held_instance_take(id, (&self.holder, work.as_str()), until)
            .await;
        if let Err(error) = taken {
            tracing::warn!(instance = %id, %error, work = work.as_str(), "cannot record who holds an instance");
        }
    }

    /// This control plane's work holds `id` no more: it ended it (`deleted`)
    /// or left it to its client. A hold that cannot be given up is tried
    /// again: a kept instance whose hold stayed would be deleted when it
    /// lapsed.
    pub(crate) async fn instance_let_go(&self, id: &InstanceId) {
        self.held.remove(id);
        for attempt in 1..=3 {
            match self.store.held_instance_release(id, &self.holder).await {
                Ok(()) => return,
                Err(error) => {
                    tracing::warn!(instance = %id, %error, attempt, "cannot record that an instance is no longer held");
                    tokio::time::sleep(Duration::from_millis(200 * attempt)).await;
                }
            }
        }
    }

    /// The work's delete of `id` failed: the hold lapses now, so that the
    /// takeover sweep tries again.
    pub(crate) async fn instance_hold_lapse(&self, id: &InstanceId) {
        self.held.remove(id);
        if let Err(error) = self.store.held_instance_lapse(id, &self.holder).await {
            tracing::warn!(instance = %id, %error, "cannot give up the hold of an instance");
        }
    }

    /// Deletes `id`, whose work ended (or whose holder stopped): the hold
    /// is given up, or, when the delete fails, lapses for another try.
    pub(crate) async fn held_instance_delete(&self, id: &InstanceId) -> Result<()> {
        match self.instance_delete(id, true).await {
            Ok(_) | Err(Error::NotFound(_)) => {
                self.instance_let_go(id).await;
                Ok(())
            }
            Err(error) => {
                self.instance_hold_lapse(id).await;
                Err(error)
            }
        }
    }

    /// Renews what this control plane's running work holds (each control
    /// plane, every [`RENEW_EVERY`]).
    pub async fn held_instances_renew(&self) -> Result<u64> {
        let until = self.now() + HELD_FOR;
        let held = self.held.all();
        Ok(self
            .store
            .held_instances_renew(&self.holder, &held, until)
            .await?)
    }

    /// The "held instance takeover" sweep: deletes each instance whose
    /// holder stopped renewing it; how many.
    pub async fn held_instances_take_over(&self) -> Result<u64> {
        let now = self.now();
        let mut ended = 0;
        for (id, work) in self.store.held_instances_lapsed(&self.holder, now).await? {
            let taken = self
                .store
                .held_instance_take_over(&id, &self.holder, (now, now + HELD_FOR))
                .await?;
            if !taken {
                continue;
            }
            match self.held_instance_delete(&id).await {
                Ok(()) => {
                    tracing::info!(instance = %id, %work, "deleted an instance whose control plane stopped");
                    ended += 1;
                }
                Err(error) => {
                    tracing::warn!(instance = %id, %work, %error, "cannot delete an instance whose control plane stopped; the next sweep tries again");
                }
            }
        }
        Ok(ended)
    }
}
