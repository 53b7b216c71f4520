//! Instance access tokens and the URLs that carry them.
//!
//! With `auth_enabled`, an instance's ports (and later the front door) admit an
//! API key or the instance's own token. The token is derived, never stored:
//! `flt_` + base64url(HMAC-SHA256(key, instance id)), with the key created once
//! in the store (setting `instance_token_key`), so every control plane of a
//! cluster derives the same token and a deleted instance's token opens nothing
//! (no live instance has its id). Agents learn each token from the create and
//! revive calls; `urls.debug` and `urls.stream` carry it as `?token=`.
//!
//! Also here: the agents' view of the policy (whether authentication is on,
//! the API keys' digests), sent with every registration and heartbeat answer.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as BASE64URL;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use flotilla_api_types::agent::RegistrationAck;
use flotilla_api_types::instances::InstanceUrls;
use flotilla_api_types::{InstanceId, NodeId};

use super::ControlPlane;
use super::views;
use crate::error::Result;
use crate::store::InstanceRecord;

const KEY_SETTING: &str = "instance_token_key";

/// How long a node's hosts are taken from memory before the store is read again.
const NODE_HOSTS_TTL: Duration = Duration::from_secs(30);

/// Where a node is reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NodeHosts {
    /// Where clients reach its instance ports (`urls` without a front door).
    pub public_host: String,
    /// Where the control plane reaches them: the host of the agent's address.
    pub agent_host: String,
}

impl NodeHosts {
    fn of(public_host: &str, agent_address: &str) -> Self {
        let agent_host = url::Url::parse(agent_address)
            .ok()
            .and_then(|url| {
                url.host_str()
                    .map(|h| h.trim_matches(['[', ']']).to_owned())
            })
            .unwrap_or_else(|| public_host.to_owned());
        Self {
            public_host: public_host.to_owned(),
            agent_host,
        }
    }
}

/// Nodes' hosts, for instance URLs and the front door without a store read
/// per request.
#[derive(Default)]
pub(crate) struct PublicHosts {
    /// A std mutex: looked up and replaced without awaiting.
    known: std::sync::Mutex<HashMap<NodeId, (Instant, NodeHosts)>>,
}

impl PublicHosts {
    pub fn remember(&self, node: &NodeId, public_host: &str, agent_address: &str) {
        self.known.lock().expect("public hosts lock").insert(
            node.clone(),
            (Instant::now(), NodeHosts::of(public_host, agent_address)),
        );
    }

    fn fresh(&self, node: &NodeId) -> Option<NodeHosts> {
        let known = self.known.lock().expect("public hosts lock");
        known
            .get(node)
            .filter(|(at, _)| at.elapsed() < NODE_HOSTS_TTL)
            .map(|(_, hosts)| hosts.clone())
    }
}

impl ControlPlane {
    async fn instance_token_key(&self) -> Result<Arc<Vec<u8>>> {
        self.instance_token_key
            .get_or_try_init(|| async {
                let initial = hex::encode(rand::random::<[u8; 32]>());
                let key = self
                    .store
                    .setting_get_or_init(KEY_SETTING, &initial)
                    .await?;
                Ok::<_, crate::error::Error>(Arc::new(key.into_bytes()))
            })
            .await
            .cloned()
    }

    /// The access token of instance `id`.
    pub(crate) async fn instance_token(&self, id: &InstanceId) -> Result<String> {
        let key = self.instance_token_key().await?;
        let mut mac = Hmac::<Sha256>::new_from_slice(&key).expect("any key length");
        mac.update(b"flotilla instance token v1\0");
        mac.update(id.as_str().as_bytes());
        Ok(format!(
            "flt_{}",
            BASE64URL.encode(mac.finalize().into_bytes())
        ))
    }

    /// The signature of live link `link_id` (see [`super::live_links`]).
    pub(crate) async fn live_link_signature(&self, link_id: &str) -> Result<String> {
        let key = self.instance_token_key().await?;
        let mut mac = Hmac::<Sha256>::new_from_slice(&key).expect("any key length");
        mac.update(b"flotilla live link v1\0");
        mac.update(link_id.as_bytes());
        Ok(BASE64URL.encode(mac.finalize().into_bytes()))
    }

    /// The token to hand out in URLs: only when authentication is on.
    pub(crate) async fn url_token(&self, id: &InstanceId) -> Result<Option<String>> {
        if self.config.auth_enabled {
            Ok(Some(self.instance_token(id).await?))
        } else {
            Ok(None)
        }
    }

    /// The hosts of `node`, from memory or the store.
    pub(crate) async fn node_hosts(&self, node: &NodeId) -> Result<Option<NodeHosts>> {
        if let Some(hosts) = self.public_hosts.fresh(node) {
            return Ok(Some(hosts));
        }
        Ok(self.store.node_get(node).await?.map(|record| {
            self.public_hosts
                .remember(&record.id, &record.public_host, &record.address);
            NodeHosts::of(&record.public_host, &record.address)
        }))
    }

    /// `urls` of an instance (`None` before it has ports): through the front
    /// door when `public_url` is set, else on its node's instance ports.
    pub(crate) async fn instance_urls(
        &self,
        record: &InstanceRecord,
    ) -> Result<Option<InstanceUrls>> {
        let token = self.url_token(&record.id).await?;
        self.instance_urls_with(record, token).await
    }

    /// [`ControlPlane::instance_urls`] without the instance's token (for a
    /// viewer it must not be given to).
    pub(crate) async fn instance_urls_without_token(
        &self,
        record: &InstanceRecord,
    ) -> Result<Option<InstanceUrls>> {
        self.instance_urls_with(record, None).await
    }

    async fn instance_urls_with(
        &self,
        record: &InstanceRecord,
        token: Option<String>,
    ) -> Result<Option<InstanceUrls>> {
        if record.ports.is_none() {
            return Ok(None);
        }
        if let Some(public_url) = &self.config.public_url {
            return Ok(Some(views::door_urls(
                record,
                public_url,
                self.config.gateway.base_domain.as_deref(),
                token.as_deref(),
            )));
        }
        let Some(hosts) = self.node_hosts(&record.node_id).await? else {
            return Ok(None);
        };
        Ok(views::instance_urls(
            record,
            &hosts.public_host,
            token.as_deref(),
        ))
    }

    /// What every agent is told at registration and in heartbeat answers.
    pub(crate) fn agent_ack(&self) -> RegistrationAck {
        RegistrationAck {
            heartbeat_interval_sec: self.config.nodes.heartbeat_interval_sec,
            instance_access: self.keys.instance_access_policy(),
            protocol_version: flotilla_api_types::agent::PROTOCOL_VERSION.to_owned(),
        }
    }
}
