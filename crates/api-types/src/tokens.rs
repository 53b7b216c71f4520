//! Subscriber tokens for the event proxy: `POST /v2/tokens` issues them, and
//! `POST /v2/tokens/verify` is the verification webhook the proxy calls
//! (`spec/event-proxy.md`: `{jwt, topic}` → `{valid, user_id, expires_at}`).

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Body of `POST /v2/tokens` (all optional).
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TokenRequest {
    /// Topics the token may read: `instances`, `instances.<id>`, or
    /// `instances.*` (every instance), `nodes`, `alerts`, `tenants.<name>`
    /// (a tenant's instances). Default: `instances` and `instances.*`; for a
    /// tenant's key, which may read only `tenants.<its tenant>` and
    /// `instances.<id>` of its own instances, `tenants.<its tenant>`.
    #[schema(value_type = Option<Vec<TopicName>>, min_items = 1, max_items = 100)]
    pub topics: Option<Vec<String>>,
    /// Lifetime in seconds, 1..=86400 (default 3600).
    #[schema(minimum = 1, maximum = 86400)]
    #[serde(default, deserialize_with = "crate::integers::option_u64")]
    pub ttl_sec: Option<u64>,
}

/// A topic a subscriber token may read: `instances`, `instances.*`, `nodes`,
/// `alerts`, `instances.<instance id>` (a hyphenated UUID), or
/// `tenants.<tenant name>` (every event of that tenant's instances).
pub struct TopicName;

/// What [`TopicName`] accepts.
pub const TOPIC_PATTERN: &str = "^(instances|instances\\.\\*|nodes|alerts|instances\\.[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}|tenants\\.[a-z0-9][a-z0-9-]{0,62})$";

impl utoipa::PartialSchema for TopicName {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        utoipa::openapi::ObjectBuilder::new()
            .schema_type(utoipa::openapi::schema::Type::String)
            .pattern(Some(TOPIC_PATTERN))
            .into()
    }
}

impl ToSchema for TopicName {}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TokenResponse {
    /// A JWT (HS256) to present to the event proxy as `Authorization: Bearer`.
    pub token: String,
    /// Unix time (seconds) after which the token is refused.
    pub expires_at: i64,
    /// The topics it may read.
    pub topics: Vec<String>,
    /// The event proxy to subscribe at (`GET {events_url}/events/{topic}`),
    /// when the control plane publishes to one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub events_url: Option<String>,
}

/// What the event proxy sends to its verification webhook.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct VerifyRequest {
    pub jwt: String,
    /// The topic's UUID as 32 hex characters.
    pub topic: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct VerifyResponse {
    pub valid: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<i64>,
    /// `forbidden` when the token is valid but not for this topic.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// The namespace of topic UUIDs: UUIDv5 of "flotilla.topics" in the URL namespace.
pub fn topic_namespace() -> uuid::Uuid {
    uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_URL, b"flotilla.topics")
}

/// A topic's 128-bit id as the verification webhook receives it: 32 hex characters.
pub fn topic_uuid_hex(name: &str) -> String {
    uuid::Uuid::new_v5(&topic_namespace(), name.as_bytes())
        .simple()
        .to_string()
}

/// Whether a `permissions` entry (`<topic>:<action>`, `*:<action>`, or
/// `<prefix>.*:<action>` for every topic under `<prefix>.`) grants `action` on `topic`.
pub fn permission_grants(permission: &str, topic: &str, action: &str) -> bool {
    let Some(pattern) = permission
        .strip_suffix(action)
        .and_then(|p| p.strip_suffix(':'))
    else {
        return false;
    };
    match pattern.strip_suffix('*') {
        Some("") => true,
        Some(prefix) if prefix.ends_with('.') => {
            topic.len() > prefix.len() && topic.starts_with(prefix)
        }
        _ => pattern == topic,
    }
}

/// What a key may see: the whole fleet, or one tenant's objects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum KeyScope {
    Admin,
    Tenant,
}

/// `GET /v2/whoami`: the key a request carried, as the service sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct WhoAmI {
    /// `key:<first 12 hex digits of its SHA-256>`, or `anonymous` with
    /// authentication off.
    pub principal: String,
    pub scope: KeyScope,
    /// The key's tenant (a tenant's key only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permissions_match_exact_any_and_prefix() {
        assert!(permission_grants("news:read", "news", "read"));
        assert!(!permission_grants("news:read", "news", "write"));
        assert!(!permission_grants("news:read", "news.x", "read"));
        assert!(permission_grants("*:read", "anything", "read"));
        assert!(permission_grants(
            "instances.*:read",
            "instances.abc",
            "read"
        ));
        assert!(!permission_grants("instances.*:read", "instances", "read"));
        assert!(!permission_grants("instances.*:read", "instancesX", "read"));
        assert!(!permission_grants("instances*:read", "instancesX", "read"));
    }
}
