//! Persistent profiles (what Browserbase calls contexts): a browser state —
//! cookies, localStorage, IndexedDB, the profile directory — saved under a
//! name in the snapshot store, that instances start from and, with
//! `persist`, write back to.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// A saved profile.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Profile {
    pub name: String,
    pub created_at: DateTime<Utc>,
    /// When its state was last written back.
    pub updated_at: DateTime<Utc>,
    /// Size of the saved state (0 before the first write-back).
    pub size_bytes: u64,
    /// The engine whose browser last saved it (`chromium`, `firefox`);
    /// absent before its first save. A profile is per engine: an instance
    /// of another engine's image cannot start from it (400).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine: Option<String>,
}

/// `GET /v2/profiles`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ProfileList {
    pub profiles: Vec<Profile>,
}

/// Body of `POST /v2/profiles`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateProfileRequest {
    /// 1 to 64 characters of letters, digits, `.`, `_` and `-`, not starting with `.`.
    #[schema(schema_with = profile_name_schema)]
    pub name: String,
}

/// `profile` of a create: start from the saved profile `name`; with
/// `persist`, write the state back when the instance is deleted or parked
/// (one such instance per profile at a time).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ProfileUse {
    #[schema(schema_with = profile_name_schema)]
    pub name: String,
    #[serde(default)]
    pub persist: bool,
}

/// A name that cannot name a profile; the message says what is accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "profile name {name:?} must be 1 to 64 characters of letters, digits, '.', '_' and '-', not starting with '.'"
)]
pub struct InvalidProfileName {
    pub name: String,
}

/// Whether `name` can name a profile.
pub fn check_profile_name(name: &str) -> Result<(), InvalidProfileName> {
    let valid = !name.is_empty()
        && name.len() <= 64
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if valid {
        Ok(())
    } else {
        Err(InvalidProfileName {
            name: name.to_owned(),
        })
    }
}

/// The schema of a profile name (see [`check_profile_name`]).
fn profile_name_schema() -> utoipa::openapi::schema::Object {
    utoipa::openapi::schema::ObjectBuilder::new()
        .schema_type(utoipa::openapi::schema::Type::String)
        .pattern(Some(r"^[A-Za-z0-9_-][A-Za-z0-9._-]{0,63}$"))
        .min_length(Some(1))
        .max_length(Some(64))
        .description(Some(
            "1 to 64 characters of letters, digits, `.`, `_` and `-`, not starting with `.`.",
        ))
        .build()
}
