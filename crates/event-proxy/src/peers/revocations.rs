//! Revocations across the cluster: each applied once here, gossiped for
//! [`GOSSIP_RETENTION`], and sent at once to every live peer.

use super::{Cluster, REVOCATION_PREFIX, REVOKE_PATH};
use crate::revoke::{GOSSIP_RETENTION, PeerRevocation};

impl Cluster {
    /// Records `revocation` as applied here and gossips it (the cluster keeps
    /// it while any proxy that applied it runs). False when it already was.
    pub async fn remember_revocation(&self, revocation: &PeerRevocation) -> bool {
        let new = self
            .revocations
            .lock()
            .expect("revocations lock")
            .insert(revocation.id.clone(), revocation.taken_at())
            .is_none();
        if new {
            let key = format!("{REVOCATION_PREFIX}{}", revocation.id);
            let value = serde_json::to_string(revocation).unwrap_or_default();
            self.chitchat
                .with_chitchat(|chitchat| chitchat.self_node_state().set(&key, &value))
                .await;
        }
        new
    }

    /// Stops gossiping revocations older than [`GOSSIP_RETENTION`], and
    /// forgets them a while later (when no peer gossips them any more).
    pub(super) async fn expire_revocations(&self, now: chrono::DateTime<chrono::Utc>) {
        let retention = chrono::TimeDelta::from_std(GOSSIP_RETENTION).unwrap_or_default();
        let expired: Vec<String> = {
            let mut applied = self.revocations.lock().expect("revocations lock");
            applied.retain(|_, taken| now - *taken < retention * 2);
            applied
                .iter()
                .filter(|(_, taken)| now - **taken >= retention)
                .map(|(id, _)| format!("{REVOCATION_PREFIX}{id}"))
                .collect()
        };
        if expired.is_empty() {
            return;
        }
        self.chitchat
            .with_chitchat(|chitchat| {
                let node = chitchat.self_node_state();
                for key in &expired {
                    if node.contains_key(key) {
                        node.delete(key);
                    }
                }
            })
            .await;
    }

    /// Sends a revocation to every live peer; returns the node ids reached and
    /// those that failed (they get it by gossip later).
    pub async fn broadcast_revoke(&self, body: &PeerRevocation) -> (Vec<String>, Vec<String>) {
        let view = self.view();
        let calls = view.live().map(|member| async move {
            let url = member.url.as_deref().unwrap_or_default();
            let outcome = self.call::<serde_json::Value>(url, REVOKE_PATH, body).await;
            (member.node_id.clone(), outcome)
        });
        let mut reached = Vec::new();
        let mut failed = Vec::new();
        for (node_id, outcome) in futures_util::future::join_all(calls).await {
            match outcome {
                Ok(_) => reached.push(node_id),
                Err(error) => {
                    tracing::warn!(peer = %node_id, %error, "revocation not delivered");
                    failed.push(node_id);
                }
            }
        }
        (reached, failed)
    }
}
