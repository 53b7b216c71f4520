//! Shareable live links: a URL that shows an instance's live view to anyone
//! who has it, without an API key, until it expires or is revoked; with
//! `control`, its viewer may also take control and drive the browser.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// What a live link's viewer may do.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum LiveMode {
    /// Watch only: input is refused.
    #[default]
    View,
    /// Watch, and take control (mouse, keyboard, tabs) while nobody else holds it.
    Control,
}

impl LiveMode {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::View => "view",
            Self::Control => "control",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "view" => Some(Self::View),
            "control" => Some(Self::Control),
            _ => None,
        }
    }
}

/// Longest lifetime of a live link, in seconds (one day).
pub const MAX_LIVE_TTL_SEC: u64 = 86_400;
/// Lifetime of a live link when the request names none.
pub const DEFAULT_LIVE_TTL_SEC: u64 = 3_600;

/// Body of `POST /v2/instances/{instance_id}/live` (all optional).
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateLiveLinkRequest {
    /// `view` (default) or `control`.
    #[serde(default)]
    pub mode: LiveMode,
    /// Lifetime in seconds, 1..=86400 (default 3600).
    #[schema(minimum = 1, maximum = 86400)]
    #[serde(default, deserialize_with = "crate::integers::option_u64")]
    pub ttl_sec: Option<u64>,
}

/// A live link. Its `url` is a secret: whoever has it sees the browser (and
/// with `control`, may drive it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct LiveLink {
    /// Names the link for `DELETE /v2/instances/{instance_id}/live/{link_id}`.
    pub id: String,
    /// A standalone page (no API key needed, embeddable in an iframe).
    pub url: String,
    pub mode: LiveMode,
    pub expires_at: DateTime<Utc>,
}
