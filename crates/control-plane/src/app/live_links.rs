//! Shareable live links (`POST /v2/instances/{id}/live`): a URL
//! `<base>/live/<link id>.<signature>` that opens the instance's live view to
//! whoever has it, without an API key, until `expires_at` or until it is
//! revoked (`DELETE /v2/instances/{id}/live/{link_id}`, or every link of the
//! instance with `DELETE /v2/instances/{id}/live`).
//!
//! A `control` link's person hands the browser back with "Done, hand back"
//! (`POST /live/{token}/done`): recorded on the link, which ends; an agent
//! waiting on the handoff (MCP `browser_handoff`) reads it from the store.
//!
//! The signature (HMAC of the link id with the key instance tokens derive
//! from) makes the URL unguessable; the record says what it opens and until
//! when, and is checked when the page or its socket opens (404 once the
//! link is not valid, expired or revoked) and every
//! [`RECHECK`] while it stays open, so a revoked or expired link's viewers
//! are cut off within that time, on every control plane of the store. A
//! `view` link's socket reaches the node with `?mode=view`, which the node
//! holds it to: its viewers watch and cannot take control.

use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};

use flotilla_api_types::InstanceId;
use flotilla_api_types::MessageResponse;
use flotilla_api_types::credentials::constant_time_eq;
use flotilla_api_types::live::{
    CreateLiveLinkRequest, DEFAULT_LIVE_TTL_SEC, LiveLink, LiveMode, MAX_LIVE_TTL_SEC,
};

use super::{ControlPlane, DoorTarget};
use crate::error::{Error, Result};
use crate::store::LiveLinkRecord;

/// How often an open live view checks that its link still holds.
pub const RECHECK: Duration = Duration::from_secs(2);

fn not_found(id: &InstanceId) -> Error {
    Error::NotFound(format!("instance {id} not found"))
}

impl ControlPlane {
    /// Makes a live link to instance `id`'s live view; `base` is the scheme
    /// and authority the caller reached this control plane at (used unless
    /// `public_url` is set).
    pub async fn live_link_create(
        &self,
        id: &InstanceId,
        request: CreateLiveLinkRequest,
        base: &str,
    ) -> Result<LiveLink> {
        let ttl = request.ttl_sec.unwrap_or(DEFAULT_LIVE_TTL_SEC);
        if !(1..=MAX_LIVE_TTL_SEC).contains(&ttl) {
            return Err(Error::InvalidRequest(format!(
                "ttl_sec must be 1..={MAX_LIVE_TTL_SEC} (got {ttl})"
            )));
        }
        self.instance_not_ended(id, "no live view to share").await?;
        let now = self.now();
        let link = LiveLinkRecord {
            id: uuid::Uuid::now_v7().simple().to_string(),
            instance_id: id.clone(),
            mode: request.mode,
            created_at: now,
            expires_at: now + TimeDelta::seconds(ttl as i64),
            revoked_at: None,
            handed_back_at: None,
        };
        self.store.live_link_insert(&link).await?;
        let signature = self.live_link_signature(&link.id).await?;
        let base = self.config.public_url.as_deref().unwrap_or(base);
        tracing::info!(instance = %id, link = link.id, mode = link.mode.as_str(), ttl, "live link created");
        Ok(LiveLink {
            url: format!(
                "{}/live/{}.{signature}",
                base.trim_end_matches('/'),
                link.id
            ),
            id: link.id,
            mode: link.mode,
            expires_at: link.expires_at,
        })
    }

    /// Revokes one live link of instance `id`, or all of them.
    pub async fn live_link_revoke(
        &self,
        id: &InstanceId,
        link: Option<&str>,
    ) -> Result<MessageResponse> {
        self.store
            .instance_get(id)
            .await?
            .ok_or_else(|| not_found(id))?;
        let revoked = self.store.live_link_revoke(id, link, self.now()).await?;
        match link {
            Some(link) if revoked == 0 => Err(Error::NotFound(format!(
                "live link {link} of instance {id} not found (or revoked already)"
            ))),
            Some(link) => Ok(MessageResponse {
                message: format!("live link {link} revoked"),
            }),
            None => Ok(MessageResponse {
                message: format!("{revoked} live links of instance {id} revoked"),
            }),
        }
    }

    /// The link a live URL's token names, while it holds: signed by this
    /// service, not revoked, not expired.
    pub async fn live_link_check(&self, token: &str) -> Result<LiveLinkRecord> {
        let refused = |why: &str| Error::NotFound(format!("this live link {why}"));
        let (id, signature) = token
            .split_once('.')
            .ok_or_else(|| refused("is not valid"))?;
        let valid_id = id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit());
        let expected = self.live_link_signature(id).await?;
        if !valid_id || !constant_time_eq(signature.as_bytes(), expected.as_bytes()) {
            return Err(refused("is not valid"));
        }
        let link = self
            .store
            .live_link_get(id)
            .await?
            .ok_or_else(|| refused("is not valid"))?;
        self.live_link_holds(&link, self.now())?;
        Ok(link)
    }

    fn live_link_holds(&self, link: &LiveLinkRecord, now: DateTime<Utc>) -> Result<()> {
        if let Some(at) = link.revoked_at {
            return Err(Error::NotFound(format!(
                "this live link was revoked at {at}"
            )));
        }
        if now >= link.expires_at {
            return Err(Error::NotFound(format!(
                "this live link expired at {}",
                link.expires_at
            )));
        }
        Ok(())
    }

    /// The person of a `control` link hands the browser back: the link ends,
    /// and an agent waiting on it ([`ControlPlane::live_link_handed_back`])
    /// goes on.
    pub async fn live_link_hand_back(&self, token: &str) -> Result<MessageResponse> {
        let link = self.live_link_check(token).await?;
        if link.mode != LiveMode::Control {
            return Err(Error::InvalidState(
                "only a control link hands a browser back".into(),
            ));
        }
        if !self.store.live_link_hand_back(&link.id, self.now()).await? {
            // Revoked, or handed back by another press, since the check.
            return Err(Error::NotFound("this live link has ended".into()));
        }
        tracing::info!(instance = %link.instance_id, link = link.id, "live link handed back");
        Ok(MessageResponse {
            message: "handed back: the link has ended".into(),
        })
    }

    /// Waits (checking the store every half second, on whichever control
    /// plane the person used) until link `id` of `instance` is handed back
    /// (`Ok(true)`), ends otherwise, or `wait` passes (`Ok(false)`).
    pub async fn live_link_handed_back(
        &self,
        instance: &InstanceId,
        id: &str,
        wait: Duration,
    ) -> Result<bool> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let link = self
                .store
                .live_link_get(id)
                .await?
                .filter(|link| &link.instance_id == instance)
                .ok_or_else(|| {
                    Error::NotFound(format!("no live link {id} of instance {instance}"))
                })?;
            if link.handed_back_at.is_some() {
                return Ok(true);
            }
            self.live_link_holds(&link, self.now())?;
            if tokio::time::Instant::now() >= deadline {
                return Ok(false);
            }
            tokio::time::sleep_until(
                deadline.min(tokio::time::Instant::now() + Duration::from_millis(500)),
            )
            .await;
        }
    }

    /// Where a live link's socket goes: the instance's stream port.
    pub async fn live_link_target(&self, link: &LiveLinkRecord) -> Result<DoorTarget> {
        self.door_open(&link.instance_id, Some((&super::Scope::Admin, None)), &[])
            .await
    }

    /// Resolves once `link` no longer holds (expired or revoked), checking
    /// the store every [`RECHECK`].
    pub async fn live_link_ended(&self, link: LiveLinkRecord) {
        loop {
            let left = (link.expires_at - self.now()).to_std().unwrap_or_default();
            tokio::time::sleep(left.min(RECHECK)).await;
            let current = match self.store.live_link_get(&link.id).await {
                Ok(Some(current)) => current,
                Ok(None) => return,
                // The store is unreachable: keep the viewer, check again.
                Err(_) => continue,
            };
            if self.live_link_holds(&current, self.now()).is_err() {
                return;
            }
        }
    }
}

/// The stream port's path for a live link's viewer.
pub fn live_stream_path(mode: LiveMode) -> &'static str {
    match mode {
        LiveMode::View => "/ws?mode=view",
        LiveMode::Control => "/ws",
    }
}
