//! `POST /admin/revoke`: withdraw access at once. The body names a user
//! (`{"user_id": "…"}`, as the webhook reported it) or a token
//! (`{"token_sha256": "<64 hex>"}`, the SHA-256 of the token as presented). The
//! proxy evicts every cached verification of that user or token, and ends every
//! open stream that was admitted with it (a last `event: revoked`). Publisher
//! keys (`[publisher] api_keys`) authorise the call. The operator's webhook
//! must refuse the token from then on; the proxy does not keep a deny list.
//!
//! With peers, a revocation ([`PeerRevocation`]: an id and the time it was
//! taken) travels two ways: sent at once to every live peer (signed; the
//! answer says which were reached, `peers_reached`, `peers_failed`), and
//! gossiped by every proxy that applied it for [`GOSSIP_RETENTION`], so a peer
//! that was unreachable then applies it when it hears from the cluster again.
//! Each proxy applies a revocation once. Applied late, it takes back only what
//! was verified before it was taken (allowing [`CLOCK_SKEW_ALLOWANCE`] between
//! clocks): a token the webhook vouched for again since then stays valid.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::ProxyState;
use crate::auth::Grant;
use crate::http::{Request, Response};
use crate::refusal::Refusal;

/// Open streams by subscriber id, with who they were admitted for.
#[derive(Default)]
pub struct OpenStreams {
    streams: Mutex<HashMap<u64, OpenStream>>,
}

struct OpenStream {
    user_id: Option<String>,
    token_sha256: Option<[u8; 32]>,
    verified_at: DateTime<Utc>,
    revoked: CancellationToken,
}

/// Unregisters its stream when dropped.
pub struct StreamRegistration {
    streams: Arc<ProxyState>,
    id: u64,
    pub revoked: CancellationToken,
}

impl Drop for StreamRegistration {
    fn drop(&mut self) {
        self.streams
            .open_streams
            .streams
            .lock()
            .expect("streams lock")
            .remove(&self.id);
    }
}

/// Registers stream `id`, admitted with `grant`.
pub fn register(state: &Arc<ProxyState>, id: u64, grant: &Grant) -> StreamRegistration {
    let revoked = CancellationToken::new();
    state
        .open_streams
        .streams
        .lock()
        .expect("streams lock")
        .insert(
            id,
            OpenStream {
                user_id: grant.user_id.clone(),
                token_sha256: grant.token_sha256,
                verified_at: grant.verified_at,
                revoked: revoked.clone(),
            },
        );
    StreamRegistration {
        streams: state.clone(),
        id,
        revoked,
    }
}

/// How long a revocation is gossiped after it was taken.
pub const GOSSIP_RETENTION: Duration = Duration::from_secs(3600);

/// How far apart the proxies' clocks may be for a late revocation to still
/// catch what was verified just before it.
pub const CLOCK_SKEW_ALLOWANCE: TimeDelta = TimeDelta::seconds(5);

/// The body of `POST /admin/revoke`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Revocation {
    user_id: Option<String>,
    token_sha256: Option<String>,
}

/// A revocation as proxies pass it on: directly (`POST /peer/v1/revoke`) and
/// as a gossip value.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeerRevocation {
    /// Unique; a proxy applies each id once.
    pub id: String,
    /// When it was taken (ms since the epoch, on the proxy that took it).
    pub at_ms: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_sha256: Option<String>,
}

impl PeerRevocation {
    fn new(target: &Target, at: DateTime<Utc>) -> Self {
        let (user_id, token_sha256) = match target {
            Target::User(user) => (Some(user.clone()), None),
            Target::Token(hash) => (None, Some(hex::encode(hash))),
        };
        Self {
            id: uuid::Uuid::new_v4().simple().to_string(),
            at_ms: at.timestamp_millis(),
            user_id,
            token_sha256,
        }
    }

    fn target(&self) -> Result<Target, InvalidRevocation> {
        target_of(self.user_id.clone(), self.token_sha256.clone())
    }

    pub fn taken_at(&self) -> DateTime<Utc> {
        DateTime::from_timestamp_millis(self.at_ms).unwrap_or(DateTime::UNIX_EPOCH)
    }
}

/// What a revocation matches.
enum Target {
    User(String),
    Token([u8; 32]),
}

impl Target {
    fn matches(&self, user_id: Option<&str>, token: Option<&[u8; 32]>) -> bool {
        match self {
            Self::User(user) => user_id == Some(user.as_str()),
            Self::Token(hash) => token == Some(hash),
        }
    }
}

/// A revocation that does not say what to revoke (a 400, "Invalid body: …").
#[derive(Debug, thiserror::Error)]
pub enum InvalidRevocation {
    #[error("{0}")]
    Body(#[source] serde_json::Error),
    #[error("token_sha256 must be 64 hex characters")]
    TokenHash,
    #[error("give exactly one of user_id and token_sha256")]
    NotOneTarget,
}

fn target_of(
    user_id: Option<String>,
    token_sha256: Option<String>,
) -> Result<Target, InvalidRevocation> {
    match (user_id, token_sha256) {
        (Some(user), None) if !user.is_empty() => Ok(Target::User(user)),
        (None, Some(hash)) => {
            let bytes = hex::decode(&hash)
                .ok()
                .and_then(|b| <[u8; 32]>::try_from(b).ok())
                .ok_or(InvalidRevocation::TokenHash)?;
            Ok(Target::Token(bytes))
        }
        _ => Err(InvalidRevocation::NotOneTarget),
    }
}

/// `POST /admin/revoke`: this proxy, then every peer.
pub async fn revoke(state: &Arc<ProxyState>, request: &Request) -> crate::Answer {
    if !state.is_publisher_key(request) {
        return Err(Refusal::Unauthenticated);
    }
    let target = serde_json::from_slice::<Revocation>(&request.body)
        .map_err(InvalidRevocation::Body)
        .and_then(|r| target_of(r.user_id, r.token_sha256))
        .map_err(|e| Refusal::InvalidBody(e.to_string()))?;
    Ok(Response::json(
        200,
        &revoke_everywhere(state, &target).await,
    ))
}

/// Revokes on this proxy, then on every peer; answers what it reached.
async fn revoke_everywhere(state: &Arc<ProxyState>, target: &Target) -> serde_json::Value {
    let now = state.clock.now();
    let (evicted, closed) = revoke_here(state, target, now);
    let mut body = json!({ "evicted": evicted, "closed": closed });
    if let Some(cluster) = &state.peers {
        let revocation = PeerRevocation::new(target, now);
        cluster.remember_revocation(&revocation).await;
        let (reached, failed) = cluster.broadcast_revoke(&revocation).await;
        body["peers_reached"] = json!(reached);
        body["peers_failed"] = json!(failed);
    }
    body
}

/// A revocation a peer sent (signature already checked): applied in full,
/// unless it already was.
pub async fn apply(state: &Arc<ProxyState>, body: &[u8]) -> crate::Answer {
    let revocation = serde_json::from_slice::<PeerRevocation>(body)
        .map_err(|error| Refusal::InvalidBody(error.to_string()))?;
    let target = revocation
        .target()
        .map_err(|e| Refusal::InvalidBody(e.to_string()))?;
    let (mut evicted, mut closed) = (0, 0);
    if let Some(cluster) = &state.peers
        && cluster.remember_revocation(&revocation).await
    {
        // Everything verified until now: this proxy's clock may lag.
        let before = state.clock.now().max(revocation.taken_at());
        (evicted, closed) = revoke_here(state, &target, before);
    }
    Ok(Response::json(
        200,
        &json!({ "evicted": evicted, "closed": closed }),
    ))
}

/// Revocations read from the gossip state that this proxy has not applied.
pub async fn apply_gossiped(state: &Arc<ProxyState>, revocations: Vec<PeerRevocation>) {
    let Some(cluster) = &state.peers else { return };
    for revocation in revocations {
        let target = match revocation.target() {
            Ok(target) => target,
            Err(reason) => {
                tracing::warn!(id = %revocation.id, %reason, "gossiped revocation ignored");
                continue;
            }
        };
        if cluster.remember_revocation(&revocation).await {
            tracing::info!(id = %revocation.id, "revocation received by gossip");
            revoke_here(state, &target, revocation.taken_at() + CLOCK_SKEW_ALLOWANCE);
        }
    }
}

/// Evicts matching cached grants and ends matching streams on this proxy:
/// those verified before `verified_before`.
fn revoke_here(
    state: &ProxyState,
    target: &Target,
    verified_before: DateTime<Utc>,
) -> (usize, usize) {
    let evicted = state.auth.cache.evict_where(|_, grant| {
        grant.verified_at <= verified_before
            && target.matches(grant.user_id.as_deref(), grant.token_sha256.as_ref())
    });
    let mut closed = 0;
    for stream in state
        .open_streams
        .streams
        .lock()
        .expect("streams lock")
        .values()
    {
        if stream.verified_at <= verified_before
            && target.matches(stream.user_id.as_deref(), stream.token_sha256.as_ref())
        {
            stream.revoked.cancel();
            closed += 1;
        }
    }
    tracing::info!(evicted, closed, "access revoked");
    (evicted, closed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Proxy;
    use crate::auth::cache::cache_key;
    use crate::config::ProxyConfig;
    use flotilla_api_types::clock::{Clock, ManualClock};

    /// A proxy that is a cluster of one, on a manual clock.
    async fn single_node(clock: Arc<ManualClock>) -> Proxy {
        let mut config = ProxyConfig::default();
        config.http.bind_address = "127.0.0.1:0".into();
        config.jwt_verifier.require_authentication = false;
        config.peers.enabled = true;
        config.peers.listen_address = "127.0.0.1:0".into();
        config.peers.secret = "a secret of sixteen bytes or more".into();
        Proxy::start_with_clock(config, clock).await.unwrap()
    }

    fn alice(verified_at: DateTime<Utc>) -> Grant {
        Grant {
            user_id: Some("alice".into()),
            expires_at: None,
            permissions: None,
            token_sha256: None,
            verified_at,
        }
    }

    /// Caches alice's grant under `token` and opens a stream with it.
    fn admit(state: &Arc<ProxyState>, id: u64, token: &str, grant: Grant) -> StreamRegistration {
        state
            .auth
            .cache
            .insert(cache_key(token, "t"), grant.clone());
        register(state, id, &grant)
    }

    fn gossiped(id: &str, at: DateTime<Utc>) -> PeerRevocation {
        PeerRevocation {
            id: id.into(),
            at_ms: at.timestamp_millis(),
            user_id: Some("alice".into()),
            token_sha256: None,
        }
    }

    #[tokio::test]
    async fn a_late_revocation_takes_back_only_what_was_verified_before_it_and_once() {
        let start = Utc::now();
        let clock = Arc::new(ManualClock::new(start));
        let proxy = single_node(clock.clone()).await;
        let state = &proxy.state;
        let before = admit(state, 1, "old", alice(start));
        let within_skew = admit(state, 2, "skewed", alice(start + TimeDelta::seconds(3)));
        let after = admit(state, 3, "new", alice(start + TimeDelta::seconds(10)));
        clock.advance(TimeDelta::seconds(60));

        apply_gossiped(state, vec![gossiped("r1", start)]).await;
        assert!(before.revoked.is_cancelled());
        assert!(
            within_skew.revoked.is_cancelled(),
            "clocks may differ by 5 s"
        );
        assert!(!after.revoked.is_cancelled(), "verified again since");
        assert!(state.auth.cache.get(&cache_key("old", "t")).is_none());
        assert!(state.auth.cache.get(&cache_key("new", "t")).is_some());

        // Gossip brings the same revocation again: nothing happens.
        let again = admit(state, 4, "old", alice(start));
        apply_gossiped(state, vec![gossiped("r1", start)]).await;
        assert!(!again.revoked.is_cancelled(), "applied once");

        // Sent directly by a peer whose clock lags: everything verified until
        // now goes.
        let lagging = PeerRevocation {
            id: "r2".into(),
            ..gossiped("", start - TimeDelta::seconds(100))
        };
        let body = serde_json::to_vec(&lagging).unwrap();
        let answer = apply(state, &body).await.expect("a well-formed revocation");
        assert_eq!(answer.status, 200);
        assert!(again.revoked.is_cancelled() && after.revoked.is_cancelled());
        assert!(state.auth.cache.is_empty());
        // A direct copy of one already applied changes nothing either.
        let last = admit(state, 5, "new", alice(clock.now()));
        apply(state, &body).await.expect("applied again");
        assert!(!last.revoked.is_cancelled());
        proxy.shutdown().await;
    }
}
