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

/// Why an uploaded zip is not a loadable extension (shown to the uploader,
/// after "not a loadable extension: "). The node agent's checker finds
/// them; the control plane refuses the upload with them.
#[derive(Debug, thiserror::Error)]
pub enum ExtensionRefusal {
    #[error("the zip is larger than {max_mib} MiB")]
    ZipTooLarge { max_mib: usize },
    #[error("the zip has more than {max} entries")]
    TooManyEntries { max: usize },
    #[error("the body is not a zip file: {0}")]
    NotZip(#[source] std::io::Error),
    #[error(
        "the zip lists {declared} entries but only {distinct} distinct names: an entry appears twice"
    )]
    DuplicateNames { declared: usize, distinct: usize },
    #[error("the zip's end of central directory cannot be read")]
    NoEndOfDirectory,
    #[error("cannot read entry {index}: {source}")]
    EntryUnreadable {
        index: usize,
        #[source]
        source: std::io::Error,
    },
    #[error("entry {index} has a name that is not UTF-8")]
    NameNotUtf8 { index: usize },
    #[error(
        "entry {name:?} is not a plain relative path (no leading '/', '..', '\\\\' or control characters)"
    )]
    NotPlainPath { name: String },
    #[error("entry {name:?} is a link; extensions hold files only")]
    Link { name: String },
    #[error("entry {name:?} is encrypted")]
    Encrypted { name: String },
    #[error("entry {name:?} appears twice")]
    EntryTwice { name: String },
    /// A zip bomb, or just too much: counted as it decompresses.
    #[error("the extension unpacks to more than {max_kib} KiB")]
    UnpacksTooLarge { max_kib: u64 },
    /// The entry's bytes do not decompress, or their CRC does not match.
    #[error("entry {name:?} is damaged: {source}")]
    Damaged {
        name: String,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "the zip holds no manifest.json at its root or in its one top-level folder: it is not an unpacked extension"
    )]
    NoManifest,
    #[error("cannot read manifest.json: {0}")]
    ManifestUnreadable(#[source] std::io::Error),
    #[error("manifest.json is larger than 1 MiB")]
    ManifestTooLarge,
    #[error("manifest.json is not valid JSON: {0}")]
    ManifestNotJson(#[source] serde_json::Error),
    #[error("manifest.json must hold a JSON object")]
    ManifestNotObject,
    #[error(
        "manifest.json: manifest_version 2 is no longer loaded by Chromium; use manifest_version 3"
    )]
    ManifestV2,
    #[error("manifest.json: manifest_version must be 3")]
    ManifestVersion,
    /// `name` or `version` missing, empty, too long or with control characters.
    #[error("manifest.json: {field} must be a string of 1 to 200 characters")]
    ManifestField { field: &'static str },
    #[error(
        "manifest.json: version {version:?} must be one to four dot-separated integers from 0 to 65535"
    )]
    Version { version: String },
}

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
