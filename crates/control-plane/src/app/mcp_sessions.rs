//! MCP sessions across control planes: each session is a row in the store
//! (`mcp_sessions`), so whichever replica a request reaches serves it and
//! any replica ends it.
//!
//! - Whose it is: the API key that opened it (and its tenant); only that key
//!   may use it (another key naming its `Mcp-Session-Id` gets the same 404
//!   as a session that never was).
//! - Its limits, fleet-wide: `mcp.max_sessions` live sessions, each key at
//!   most `mcp.max_sessions_per_key`, a tenant's toward its `max_sessions`.
//! - What it holds: its current instance and tab, the instances it created
//!   (the tools read and write them here on every call: a replica's copy in
//!   memory would go stale when the client's next request reached another).
//! - Its end: a `DELETE` on any replica, or no request for
//!   `mcp.session_idle_timeout_sec` (the "mcp session expiry" sweep, one
//!   replica at a time); whoever claims the end in the store carries out
//!   `mcp.on_session_end`, and an end left unfinished (its replica stopped)
//!   is claimed again after [`END_TAKEOVER`].
//!
//! rmcp keeps each session's protocol state in the memory of the replica
//! serving it; [`StoredSessions`] is its external session store, so another
//! replica replays the client's `initialize` and goes on.

use std::collections::HashSet;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use rmcp::transport::streamable_http_server::session::{
    SessionState, SessionStore, SessionStoreError,
};

use flotilla_api_types::InstanceId;

use crate::app::keys::Principal;
use crate::app::{ControlPlane, Scope};
use crate::config::SessionEnd;
use crate::error::{Error, Result};
use crate::store::{McpSessionRecord, McpSessionsOf};

/// How long an end may go unfinished before another replica takes it over.
pub const END_TAKEOVER: chrono::Duration = chrono::Duration::seconds(60);

/// The refusal of a request naming a session that is not (or no longer) its
/// key's, or never was.
fn no_such_session() -> Error {
    Error::NotFound("no such MCP session: initialize a new one".into())
}

impl ControlPlane {
    /// Sessions used since then are live.
    fn mcp_live_since(&self) -> DateTime<Utc> {
        let idle = self.config.mcp.session_idle_timeout_sec;
        self.now() - chrono::Duration::seconds(i64::try_from(idle).unwrap_or(i64::MAX / 1000))
    }

    /// Lets `principal` use session `id` (it opened it, and it lives), and
    /// marks it used now.
    pub async fn mcp_session_use(&self, id: &str, principal: &Principal) -> Result<()> {
        let used = self
            .store
            .mcp_session_use(id, &principal.0, (self.mcp_live_since(), self.now()))
            .await?;
        if used { Ok(()) } else { Err(no_such_session()) }
    }

    /// Whether `principal` (seeing `scope`) may open one more session: the
    /// fleet holds fewer than `mcp.max_sessions`, the key fewer than
    /// `mcp.max_sessions_per_key`, its tenant fewer than its quota. Checked
    /// as a session opens (two opening at once may both pass).
    pub async fn mcp_session_may_open(&self, principal: &Principal, scope: &Scope) -> Result<()> {
        let settings = &self.config.mcp;
        let live_since = self.mcp_live_since();
        let open = self
            .store
            .mcp_sessions_count(McpSessionsOf::All, live_since)
            .await?;
        if open >= settings.max_sessions as u64 {
            return Err(Error::InsufficientCapacity(format!(
                "{} MCP sessions are open, the most the fleet holds (mcp.max_sessions): end one, or retry later",
                settings.max_sessions
            )));
        }
        if principal.is_key() {
            let held = self
                .store
                .mcp_sessions_count(McpSessionsOf::Principal(&principal.0), live_since)
                .await?;
            if held >= settings.max_sessions_per_key as u64 {
                return Err(Error::InsufficientCapacity(format!(
                    "this API key holds {held} MCP sessions, its share (mcp.max_sessions_per_key): end one, or retry later"
                )));
            }
        }
        self.tenant_may_open_session(scope).await
    }

    /// Records that `principal` (of `tenant`) opened session `id`.
    pub async fn mcp_session_opened(
        &self,
        id: &str,
        principal: &Principal,
        tenant: Option<&str>,
    ) -> Result<()> {
        self.store
            .mcp_session_opened(id, (&principal.0, tenant), self.now())
            .await?;
        Ok(())
    }

    /// The live sessions of `tenant`.
    pub async fn mcp_sessions_of_tenant(&self, tenant: &str) -> Result<u64> {
        Ok(self
            .store
            .mcp_sessions_count(McpSessionsOf::Tenant(tenant), self.mcp_live_since())
            .await?)
    }

    /// Live session `id` as stored (404 once it ended).
    pub async fn mcp_session_state(&self, id: &str) -> Result<McpSessionRecord> {
        self.store
            .mcp_session_get(id, self.mcp_live_since())
            .await?
            .ok_or_else(no_such_session)
    }

    /// Which of `ids` are live sessions (the others a replica forgets).
    pub async fn mcp_sessions_live_among(&self, ids: &[String]) -> Result<HashSet<String>> {
        Ok(self
            .store
            .mcp_sessions_live_among(ids, self.mcp_live_since())
            .await?)
    }

    /// Session `id` is used now (a long tool call keeps it alive).
    pub async fn mcp_session_touch(&self, id: &str) -> Result<()> {
        Ok(self.store.mcp_session_touch(id, self.now()).await?)
    }

    /// Records that session `id` created `instance`, to end with it. When
    /// the session is ending (or gone) meanwhile, the instance is ended
    /// now, per `mcp.on_session_end`, and the call is refused.
    pub async fn mcp_session_created(&self, id: &str, instance: &InstanceId) -> Result<()> {
        let recorded = self.store.mcp_session_created_one(id, instance).await;
        if let Ok(true) = recorded {
            return Ok(());
        }
        self.mcp_session_end_instance(instance).await;
        match recorded {
            Err(error) => Err(error.into()),
            Ok(_) => Err(no_such_session()),
        }
    }

    /// How many live sessions hold `instance` (its view's `drivers.mcp`).
    pub async fn mcp_sessions_holding(&self, instance: &InstanceId) -> Result<u32> {
        Ok(self
            .store
            .mcp_sessions_holding(instance, self.mcp_live_since())
            .await?)
    }

    /// How many live sessions hold each instance any holds (for a list).
    pub async fn mcp_sessions_holding_each(
        &self,
    ) -> Result<std::collections::HashMap<InstanceId, u32>> {
        Ok(self
            .store
            .mcp_sessions_holding_each(self.mcp_live_since())
            .await?)
    }

    /// Ends session `id` if nobody else is: its instances per
    /// `mcp.on_session_end`, then the session is forgotten. `false` when
    /// another replica is ending it (or it is gone).
    pub async fn mcp_session_end(&self, id: &str) -> Result<bool> {
        let Some(created) = self.mcp_session_claim_end(id).await? else {
            return Ok(false);
        };
        self.mcp_session_finish_end(id, created).await?;
        Ok(true)
    }

    /// Takes on the end of session `id`: the instances it created, or
    /// `None` when another replica is ending it (or it is gone). From here
    /// on no request may use it.
    async fn mcp_session_claim_end(&self, id: &str) -> Result<Option<Vec<InstanceId>>> {
        let now = self.now();
        Ok(self
            .store
            .mcp_session_end_claim(id, now, now - END_TAKEOVER)
            .await?)
    }

    /// Carries out the end of session `id`, claimed: `created` per
    /// `mcp.on_session_end`, then the session is forgotten.
    async fn mcp_session_finish_end(&self, id: &str, created: Vec<InstanceId>) -> Result<()> {
        for instance in created {
            self.mcp_session_end_instance(&instance).await;
            // Nobody takes over an end that goes on.
            self.store.mcp_session_still_ending(id, self.now()).await?;
        }
        Ok(self.store.mcp_session_forget(id).await?)
    }

    /// Ends `instance`, of a session that ended, per `mcp.on_session_end`.
    async fn mcp_session_end_instance(&self, instance: &InstanceId) {
        let outcome = match self.config.mcp.on_session_end {
            SessionEnd::Keep => Ok(()),
            SessionEnd::Park => self.instance_dormant(instance).await.map(drop),
            SessionEnd::Delete => self.instance_delete(instance, false).await.map(drop),
        };
        match outcome {
            Ok(()) | Err(Error::NotFound(_)) | Err(Error::InvalidState(_)) => {}
            Err(error) => {
                tracing::warn!(%instance, %error, "cannot end an instance of an ended MCP session");
            }
        }
    }

    /// The "mcp session expiry" sweep: ends every session unused for
    /// `mcp.session_idle_timeout_sec`, and every end left unfinished.
    pub async fn mcp_sessions_expire(&self) -> Result<u64> {
        let stale_before = self.now() - END_TAKEOVER;
        let ids = self
            .store
            .mcp_sessions_to_end(self.mcp_live_since(), stale_before)
            .await?;
        let mut ended = 0;
        for id in ids {
            if self.mcp_session_end(&id).await? {
                ended += 1;
            }
        }
        Ok(ended)
    }
}

/// rmcp's external session store: a session's `initialize` parameters in
/// the store, so that another replica restores the session; its `DELETE`
/// ends the session for every replica.
pub struct StoredSessions(pub Arc<ControlPlane>);

#[async_trait::async_trait]
impl SessionStore for StoredSessions {
    async fn load(&self, id: &str) -> Result<Option<SessionState>, SessionStoreError> {
        let control_plane = &self.0;
        let params = control_plane
            .store
            .mcp_session_initialize_params(id, control_plane.mcp_live_since())
            .await?;
        Ok(params
            .map(|params| serde_json::from_str(&params).map(SessionState::new))
            .transpose()?)
    }

    async fn store(&self, id: &str, state: &SessionState) -> Result<(), SessionStoreError> {
        let control_plane = &self.0;
        let params = serde_json::to_string(&state.initialize_params)?;
        control_plane
            .store
            .mcp_session_initialized(id, &params, control_plane.now())
            .await?;
        Ok(())
    }

    /// The client ended its session: its instances are ended in the
    /// background (the `DELETE` is answered at once; an end this replica
    /// does not finish is taken over, see [`END_TAKEOVER`]).
    async fn delete(&self, id: &str) -> Result<(), SessionStoreError> {
        let control_plane = self.0.clone();
        let Some(created) = control_plane.mcp_session_claim_end(id).await? else {
            return Ok(());
        };
        let (ending, id) = (control_plane.clone(), id.to_owned());
        control_plane.tasks().spawn("mcp session end", async move {
            if let Err(error) = ending.mcp_session_finish_end(&id, created).await {
                tracing::warn!(%error, "cannot end an MCP session");
            }
        });
        Ok(())
    }
}
