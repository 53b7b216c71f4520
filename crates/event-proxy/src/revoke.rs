//! `POST /admin/revoke`: withdraw access at once. The body names a user
//! (`{"user_id": "…"}`, as the webhook reported it) or a token
//! (`{"token_sha256": "<64 hex>"}`, the SHA-256 of the token as presented). The
//! proxy evicts every cached verification of that user or token, and ends every
//! open stream that was admitted with it (a last `event: revoked`). Publisher
//! keys (`[publisher] api_keys`) authorise the call. With peers, the proxy
//! sends the revocation to every live peer (signed) and says which it reached
//! (`peers_reached`, `peers_failed`). The operator's webhook
//! must refuse the token from then on; the proxy does not keep a deny list.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use serde::Deserialize;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::ProxyState;
use crate::auth::Grant;
use crate::http::{Request, Response};

/// Open streams by subscriber id, with who they were admitted for.
#[derive(Default)]
pub struct OpenStreams {
    streams: Mutex<HashMap<u64, OpenStream>>,
}

struct OpenStream {
    user_id: Option<String>,
    token_sha256: Option<[u8; 32]>,
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
                revoked: revoked.clone(),
            },
        );
    StreamRegistration {
        streams: state.clone(),
        id,
        revoked,
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Revocation {
    user_id: Option<String>,
    token_sha256: Option<String>,
}

/// What a revocation matches.
enum Target {
    User(String),
    Token([u8; 32]),
}

impl Target {
    fn to_json(&self) -> serde_json::Value {
        match self {
            Self::User(user) => json!({ "user_id": user }),
            Self::Token(hash) => json!({ "token_sha256": hex::encode(hash) }),
        }
    }

    fn matches(&self, user_id: Option<&str>, token: Option<&[u8; 32]>) -> bool {
        match self {
            Self::User(user) => user_id == Some(user.as_str()),
            Self::Token(hash) => token == Some(hash),
        }
    }
}

fn parse(body: &[u8]) -> Result<Target, String> {
    let revocation: Revocation =
        serde_json::from_slice(body).map_err(|e| format!("Invalid body: {e}"))?;
    match (revocation.user_id, revocation.token_sha256) {
        (Some(user), None) if !user.is_empty() => Ok(Target::User(user)),
        (None, Some(hash)) => {
            let bytes = hex::decode(&hash)
                .ok()
                .and_then(|b| <[u8; 32]>::try_from(b).ok())
                .ok_or("Invalid body: token_sha256 must be 64 hex characters")?;
            Ok(Target::Token(bytes))
        }
        _ => Err("Invalid body: give exactly one of user_id and token_sha256".into()),
    }
}

/// `POST /admin/revoke`: this proxy, then every live peer.
pub async fn revoke(state: &Arc<ProxyState>, request: &Request) -> Response {
    if !state.is_publisher_key(request) {
        return Response::text(401, "Authentication required");
    }
    let target = match parse(&request.body) {
        Ok(target) => target,
        Err(reason) => return Response::text(400, &reason),
    };
    let (evicted, closed) = revoke_here(state, &target);
    let mut body = json!({ "evicted": evicted, "closed": closed });
    if let Some(cluster) = &state.peers {
        let (reached, failed) = cluster.broadcast_revoke(&target.to_json()).await;
        body["peers_reached"] = json!(reached);
        body["peers_failed"] = json!(failed);
    }
    Response::json(200, &body)
}

/// A revocation sent by a peer (signature already checked).
pub fn apply(state: &Arc<ProxyState>, body: &[u8]) -> Response {
    match parse(body) {
        Ok(target) => {
            let (evicted, closed) = revoke_here(state, &target);
            Response::json(200, &json!({ "evicted": evicted, "closed": closed }))
        }
        Err(reason) => Response::text(400, &reason),
    }
}

/// Evicts matching cached grants and ends matching streams on this proxy.
fn revoke_here(state: &ProxyState, target: &Target) -> (usize, usize) {
    let evicted = state.auth.cache.evict_where(|_, grant| {
        target.matches(grant.user_id.as_deref(), grant.token_sha256.as_ref())
    });
    let mut closed = 0;
    for stream in state
        .open_streams
        .streams
        .lock()
        .expect("streams lock")
        .values()
    {
        if target.matches(stream.user_id.as_deref(), stream.token_sha256.as_ref()) {
            stream.revoked.cancel();
            closed += 1;
        }
    }
    tracing::info!(evicted, closed, "access revoked");
    (evicted, closed)
}
