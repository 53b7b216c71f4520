//! Dormancy snapshots: what a parked browser leaves behind, and where.
//!
//! - [`capture`] reads the browser's state over CDP while it still runs: every
//!   cookie (session cookies too, which Chromium does not keep on disk), the open
//!   tabs and their URLs, and the localStorage of the tabs' origins.
//! - [`archive`] packs the profile directory (without caches and lock files) and
//!   that state into one tar + zstd file; [`extract`] unpacks it.
//! - [`restore`] puts the state back into a started browser: cookies and
//!   localStorage always, tabs for `full_restore`.
//! - [`SnapshotStore`] keeps archives in a directory (`file://`) or an
//!   S3-compatible bucket (`s3://`), through `object_store`. A put is atomic: an
//!   archive is either complete or absent.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

mod archive;
mod browser_state;
mod store;

pub use archive::{archive, extract};
pub use browser_state::{capture, restore};
pub use store::{DEFAULT_STORE_TIMEOUT_SEC, SnapshotStore, SnapshotsConfig, is_not_found};

/// What the browser held besides its profile files.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct CapturedState {
    /// `Network.Cookie` objects, session cookies included.
    pub cookies: Vec<Value>,
    /// The open tabs, most recently used first (as DevTools lists them).
    pub tabs: Vec<CapturedTab>,
    pub local_storage: Vec<OriginStorage>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct CapturedTab {
    pub url: String,
    pub title: String,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct OriginStorage {
    pub origin: String,
    pub items: Vec<(String, String)>,
}

const CDP_TIMEOUT: Duration = Duration::from_secs(10);

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use flotilla_api_types::InstanceId;
    use flotilla_api_types::ids::SnapshotId;
    use serde_json::json;

    use super::browser_state::cookie_param;
    use super::*;

    #[test]
    fn archive_round_trip_skips_caches_and_locks() {
        let dir = tempfile::tempdir().unwrap();
        let profile = dir.path().join("profile");
        std::fs::create_dir_all(profile.join("Default/Local Storage")).unwrap();
        std::fs::create_dir_all(profile.join("Default/Cache")).unwrap();
        std::fs::write(profile.join("Default/Cookies"), b"cookie db").unwrap();
        std::fs::write(profile.join("Default/Local Storage/000003.log"), b"ls").unwrap();
        std::fs::write(profile.join("Default/Cache/data_0"), vec![0u8; 100_000]).unwrap();
        std::os::unix::fs::symlink("vm-123", profile.join("SingletonLock")).unwrap();
        let state = CapturedState {
            cookies: vec![json!({"name": "sid", "value": "1", "session": true})],
            tabs: vec![CapturedTab {
                url: "http://a/".into(),
                title: "A".into(),
            }],
            local_storage: vec![OriginStorage {
                origin: "http://a".into(),
                items: vec![("k".into(), "v".into())],
            }],
        };
        let downloads = dir.path().join("downloads");
        std::fs::create_dir_all(&downloads).unwrap();
        std::fs::write(downloads.join("report.pdf"), b"%PDF").unwrap();
        let packed = archive(&profile, Some(&downloads), &state).unwrap();
        assert!(
            packed.len() < 2000,
            "caches are left out: {} bytes",
            packed.len()
        );

        let target = dir.path().join("restored");
        std::fs::create_dir_all(&target).unwrap();
        let restored =
            extract(&packed, &target.join("profile"), &target.join("downloads")).unwrap();
        assert_eq!(restored, state);
        assert_eq!(
            std::fs::read(target.join("downloads/report.pdf")).unwrap(),
            b"%PDF"
        );
        assert_eq!(
            std::fs::read(target.join("profile/Default/Cookies")).unwrap(),
            b"cookie db"
        );
        assert!(
            target
                .join("profile/Default/Local Storage/000003.log")
                .exists()
        );
        assert!(!target.join("profile/Default/Cache").exists());
        assert!(!target.join("profile/SingletonLock").exists());
    }

    #[test]
    fn session_cookies_lose_their_expiry_when_set_again() {
        let session = cookie_param(
            &json!({"name": "a", "value": "1", "domain": "x", "path": "/", "expires": -1, "session": true, "size": 2}),
        );
        assert!(session.get("expires").is_none());
        assert!(session.get("size").is_none(), "not a CookieParam field");
        let persistent =
            cookie_param(&json!({"name": "b", "value": "2", "expires": 2e9, "session": false}));
        assert_eq!(persistent["expires"], 2e9);
    }

    #[tokio::test]
    async fn directory_store_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let store = SnapshotStore::open(&SnapshotsConfig::default(), dir.path()).unwrap();
        let instance = InstanceId::new("i-1");
        let snapshot = SnapshotId::generate();
        store
            .put(&instance, &snapshot, Bytes::from_static(b"archive"))
            .await
            .unwrap();
        assert!(store.exists(&instance, &snapshot).await);
        assert_eq!(
            store.get(&instance, &snapshot).await.unwrap(),
            Bytes::from_static(b"archive")
        );
        assert_eq!(store.delete_all(&instance).await.unwrap(), 1);
        assert!(!store.exists(&instance, &snapshot).await);
    }
}
