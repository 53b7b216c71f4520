//! Browser extensions: unpacked Chromium extensions uploaded as zip files,
//! kept in the snapshot store, that instances load with `config.extensions`.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// An uploaded extension; `name` and `version` come from its `manifest.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Extension {
    /// What `config.extensions` names it by.
    pub id: String,
    pub name: String,
    pub version: String,
    /// Size of the uploaded zip.
    pub size_bytes: u64,
    pub created_at: DateTime<Utc>,
}

/// `GET /v2/extensions`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ExtensionList {
    pub extensions: Vec<Extension>,
}

/// Most extensions one instance loads.
pub const MAX_EXTENSIONS_PER_INSTANCE: usize = 20;
/// Largest zip accepted by `POST /v2/extensions` (larger is a 413).
pub const MAX_ZIP_BYTES: usize = 50 * 1024 * 1024;

/// Whether `id` has the form of an extension id (a hyphenated UUID), so that
/// it can name a directory or an object without escaping.
pub fn is_extension_id(id: &str) -> bool {
    id.len() == 36
        && id.bytes().enumerate().all(|(i, b)| match i {
            8 | 13 | 18 | 23 => b == b'-',
            _ => b.is_ascii_digit() || (b'a'..=b'f').contains(&b),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extension_ids_are_lowercase_hyphenated_uuids() {
        assert!(is_extension_id("0192f7a0-5b1c-7d2e-8f3a-0123456789ab"));
        for bad in [
            "",
            "../../etc/passwd",
            "0192F7A0-5B1C-7D2E-8F3A-0123456789AB",
            "0192f7a0-5b1c-7d2e-8f3a-0123456789a",
            "0192f7a0-5b1c-7d2e-8f3a-0123456789ab/",
            "0192f7a0x5b1c-7d2e-8f3a-0123456789ab",
        ] {
            assert!(!is_extension_id(bad), "{bad:?}");
        }
    }
}
