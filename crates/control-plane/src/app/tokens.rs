//! Subscriber tokens for the event proxy, so that `serve` streams lifecycle
//! events with authentication on. `POST /v2/tokens` issues a short-lived JWT
//! (HS256) whose `permissions` claim lists `<topic>:read` for the topics asked
//! (`instances`, `instances.<id>`, `instances.*`, `nodes`, `alerts`,
//! `tenants.<name>`; a tenant's key only its tenant's topic and its own
//! instances');
//! `POST /v2/tokens/verify` is the verification webhook the proxy calls
//! (`{jwt, topic}` → `{valid, user_id, expires_at}`).
//!
//! The signing key is `events.token_secret`, or a random key created once in
//! the store, so that every control plane of a cluster verifies every token.

use std::sync::Arc;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as BASE64URL;
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

use flotilla_api_types::tokens::{
    TokenRequest, TokenResponse, VerifyRequest, VerifyResponse, topic_uuid_hex,
};

use crate::app::{ControlPlane, Scope};
use crate::config::is_tenant_name;
use crate::error::{Error, Result};

const KEY_SETTING: &str = "subscriber_token_key";
const ISSUER: &str = "flotilla";
const DEFAULT_TTL_SEC: u64 = 3600;
const MAX_TTL_SEC: u64 = 86_400;

#[derive(Serialize, Deserialize)]
struct Claims {
    iss: String,
    sub: String,
    iat: i64,
    exp: i64,
    permissions: Vec<String>,
}

fn check_topic(topic: &str) -> Result<()> {
    match topic {
        "instances" | "instances.*" | "nodes" | "alerts" => Ok(()),
        other if instance_of_topic(other).is_some() => Ok(()),
        other if other.strip_prefix("tenants.").is_some_and(is_tenant_name) => Ok(()),
        other => Err(Error::InvalidRequest(format!(
            "topics: {other:?} is not a topic; use instances, instances.<instance id>, instances.*, nodes, alerts or tenants.<tenant>"
        ))),
    }
}

/// The instance of topic `instances.<id>`.
fn instance_of_topic(topic: &str) -> Option<&str> {
    // Hyphenated only, as instance ids are written (and as the schema says).
    topic
        .strip_prefix("instances.")
        .filter(|id| id.len() == 36 && uuid::Uuid::try_parse(id).is_ok())
}

impl ControlPlane {
    async fn token_key(&self) -> Result<Arc<Vec<u8>>> {
        self.token_key
            .get_or_try_init(|| async {
                if let Some(secret) = &self.config.events.token_secret {
                    return Ok(Arc::new(secret.as_bytes().to_vec()));
                }
                let initial = hex::encode(rand::random::<[u8; 32]>());
                let key = self
                    .store
                    .setting_get_or_init(KEY_SETTING, &initial)
                    .await?;
                Ok::<_, Error>(Arc::new(key.into_bytes()))
            })
            .await
            .cloned()
    }

    /// Whether `scope` may read `topic`: an admin any topic; a tenant its
    /// tenant's topic and those of its own instances (any other is refused
    /// in the same words whether or not it exists).
    async fn check_topic_in_scope(&self, topic: &str, scope: &Scope) -> Result<()> {
        check_topic(topic)?;
        let Some(tenant) = scope.tenant() else {
            return Ok(());
        };
        let own = match instance_of_topic(topic) {
            Some(id) => self
                .instance_in_scope(&flotilla_api_types::InstanceId::new(id), scope)
                .await
                .is_ok(),
            None => topic.strip_prefix("tenants.") == Some(tenant),
        };
        if own {
            return Ok(());
        }
        Err(Error::InvalidRequest(format!(
            "topics: a tenant's key reads tenants.{tenant} and instances.<id> of its own instances, not {topic:?}"
        )))
    }

    /// Issues a token for `subject` (the API key's id, or `anonymous`).
    pub async fn token_issue(
        &self,
        request: TokenRequest,
        (subject, scope): (&str, &Scope),
    ) -> Result<TokenResponse> {
        let ttl = request.ttl_sec.unwrap_or(DEFAULT_TTL_SEC);
        if !(1..=MAX_TTL_SEC).contains(&ttl) {
            return Err(Error::InvalidRequest(format!(
                "ttl_sec must be 1..={MAX_TTL_SEC} (got {ttl})"
            )));
        }
        let topics = request.topics.unwrap_or_else(|| match scope.tenant() {
            Some(tenant) => vec![format!("tenants.{tenant}")],
            None => vec!["instances".into(), "instances.*".into()],
        });
        if topics.is_empty() || topics.len() > 100 {
            return Err(Error::InvalidRequest(
                "topics must list 1 to 100 topics".into(),
            ));
        }
        for topic in &topics {
            self.check_topic_in_scope(topic, scope).await?;
        }
        let now = self.now().timestamp();
        let claims = Claims {
            iss: ISSUER.into(),
            sub: subject.into(),
            iat: now,
            exp: now + ttl as i64,
            permissions: topics.iter().map(|t| format!("{t}:read")).collect(),
        };
        let header = BASE64URL.encode(br#"{"alg":"HS256","typ":"JWT"}"#);
        let body = BASE64URL.encode(serde_json::to_vec(&claims).expect("claims serialise"));
        let signing_input = format!("{header}.{body}");
        let key = self.token_key().await?;
        let mut mac = Hmac::<Sha256>::new_from_slice(&key).expect("any key length");
        mac.update(signing_input.as_bytes());
        let signature = BASE64URL.encode(mac.finalize().into_bytes());
        Ok(TokenResponse {
            token: format!("{signing_input}.{signature}"),
            expires_at: claims.exp,
            topics,
            events_url: self.config.events.proxy_url.clone(),
        })
    }

    /// The verification webhook: a token of ours, unexpired, for this topic.
    pub async fn token_verify(&self, request: VerifyRequest) -> Result<VerifyResponse> {
        let invalid = VerifyResponse {
            valid: false,
            user_id: None,
            expires_at: None,
            reason: None,
        };
        let Some(claims) = self.token_claims(&request.jwt).await? else {
            return Ok(invalid);
        };
        if claims.exp <= self.now().timestamp() {
            return Ok(invalid);
        }
        let topics: Vec<&str> = claims
            .permissions
            .iter()
            .filter_map(|p| p.strip_suffix(":read"))
            .collect();
        // A wildcard cannot be checked against a topic's UUID here; the proxy
        // checks the `permissions` claim against the topic's name.
        let allowed = topics.iter().any(|t| t.ends_with('*'))
            || topics
                .iter()
                .any(|t| topic_uuid_hex(t).eq_ignore_ascii_case(&request.topic));
        if !allowed {
            return Ok(VerifyResponse {
                reason: Some("forbidden".into()),
                ..invalid
            });
        }
        Ok(VerifyResponse {
            valid: true,
            user_id: Some(claims.sub),
            expires_at: Some(claims.exp),
            reason: None,
        })
    }

    /// The claims of a well-formed token signed with our key.
    async fn token_claims(&self, token: &str) -> Result<Option<Claims>> {
        let mut parts = token.split('.');
        let (Some(header), Some(body), Some(signature), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Ok(None);
        };
        let Ok(signature) = BASE64URL.decode(signature) else {
            return Ok(None);
        };
        let key = self.token_key().await?;
        let mut mac = Hmac::<Sha256>::new_from_slice(&key).expect("any key length");
        mac.update(header.as_bytes());
        mac.update(b".");
        mac.update(body.as_bytes());
        if mac.verify_slice(&signature).is_err() {
            return Ok(None);
        }
        let claims = BASE64URL
            .decode(body)
            .ok()
            .and_then(|bytes| serde_json::from_slice::<Claims>(&bytes).ok())
            .filter(|claims| claims.iss == ISSUER);
        Ok(claims)
    }
}
