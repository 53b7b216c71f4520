//! Instances a control plane's work holds and must end: a `/v2/playwright`
//! connection's instance (deleted when its client leaves) and a REST
//! action's (deleted when the action ends). Each is held in the store
//! (`held_instances`) by this control plane's name, renewed every
//! [`RENEW_EVERY`] for [`HELD_FOR`] while the process lives; when its
//! holder stops (killed, its machine gone), the hold lapses and the
//! "held instance takeover" sweep, on whichever control plane holds it,
//! deletes the instance. Nothing its work made outlives the work by more
//! than [`HELD_FOR`] and a sweep interval.

use std::time::Duration;

use flotilla_api_types::InstanceId;

use crate::app::ControlPlane;
use crate::error::{Error, Result};

/// How long a hold lasts unless renewed.
pub const HELD_FOR: chrono::Duration = chrono::Duration::seconds(30);

/// How often a control plane renews what it holds.
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

impl ControlPlane {
    /// This control plane's work now holds `id` (until it lets it go). A
    /// hold that cannot be written is logged: the instance then ends only
    /// with its work, or by its idle timeout or lifetime.
    pub(crate) async fn instance_hold(&self, id: &InstanceId, work: HeldFor) {
        let until = self.now() + HELD_FOR;
        let taken = self
            .store
            .held_instance_take(id, (&self.holder, work.as_str()), until)
            .await;
        if let Err(error) = taken {
            tracing::warn!(instance = %id, %error, work = work.as_str(), "cannot record who holds an instance");
        }
    }

    /// This control plane's work holds `id` no more (it ended it, or left
    /// it to its client).
    pub(crate) async fn instance_let_go(&self, id: &InstanceId) {
        if let Err(error) = self.store.held_instance_release(id, &self.holder).await {
            tracing::warn!(instance = %id, %error, "cannot record that an instance is no longer held");
        }
    }

    /// Renews everything this control plane holds (every control plane,
    /// every [`RENEW_EVERY`]).
    pub async fn held_instances_renew(&self) -> Result<u64> {
        let until = self.now() + HELD_FOR;
        Ok(self.store.held_instances_renew(&self.holder, until).await?)
    }

    /// The "held instance takeover" sweep: deletes each instance whose
    /// holder stopped renewing it; how many.
    pub async fn held_instances_take_over(&self) -> Result<u64> {
        let now = self.now();
        let mut ended = 0;
        for (id, work) in self.store.held_instances_lapsed(now).await? {
            let taken = self
                .store
                .held_instance_take_over(&id, &self.holder, (now, now + HELD_FOR))
                .await?;
            if !taken {
                continue;
            }
            match self.instance_delete(&id, true).await {
                Ok(_) | Err(Error::NotFound(_)) => {
                    tracing::info!(instance = %id, %work, "deleted an instance whose control plane stopped");
                    self.instance_let_go(&id).await;
                    ended += 1;
                }
                Err(error) => {
                    tracing::warn!(instance = %id, %work, %error, "cannot delete an instance whose control plane stopped; retried when its hold lapses");
                }
            }
        }
        Ok(ended)
    }
}
