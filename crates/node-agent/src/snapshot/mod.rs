//! Dormancy snapshots: what a parked browser leaves behind, and where.
//!
//! - `engine::state::capture` reads the browser's state over CDP while it still runs: every
//!   cookie (session cookies too, which Chromium does not keep on disk), the open
//!   tabs (URL, history, sessionStorage, scroll position), and the localStorage
//!   of the tabs' origins.
//! - [`archive`] packs the profile directory (without caches and lock files) and
//!   that state into one tar + zstd file; [`OpenedArchive`] reads one back and
//!   says what of its site data only the profile's files hold.
//! - `engine::state::restore` puts the state back into a started browser: cookies and
//!   localStorage always, tabs (rebuilt with their history) for
//!   `full_restore`.
//! - [`SnapshotStore`] keeps archives in a directory (`file://`) or an
//!   S3-compatible bucket (`s3://`), through `object_store`. A put is atomic: an
//!   archive is either complete or absent.

use serde::{Deserialize, Serialize};
use serde_json::Value;

mod archive;
mod store;

pub use archive::{OpenedArchive, archive};
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
    /// The tab's history up to its current page (which is last), for a page
    /// of a web site; empty otherwise, and in archives from before history
    /// was kept.
    #[serde(default)]
    pub history: Vec<HistoryEntry>,
    /// The current page's `sessionStorage`.
    #[serde(default)]
    pub session_storage: Vec<(String, String)>,
    /// The current page's scroll position, `[x, y]` in CSS pixels.
    #[serde(default)]
    pub scroll: [f64; 2],
}

impl CapturedTab {
    /// Whether reopening the tab at its URL would lose something: earlier
    /// pages in its history, its `sessionStorage` or its scroll position.
    pub fn needs_rebuilding(&self) -> bool {
        self.history.len() > 1 || !self.session_storage.is_empty() || self.scroll != [0.0, 0.0]
    }
}

/// A page of a tab's history.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct HistoryEntry {
    pub url: String,
    pub title: String,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct OriginStorage {
    pub origin: String,
    pub items: Vec<(String, String)>,
}

/// What `engine::state::restore` puts back besides cookies and localStorage, and how.
#[derive(Debug, Clone, Copy)]
pub struct RestoreOptions {
    /// Every captured tab at its URL, in its order (a full restore).
    pub reopen_tabs: bool,
    /// The browser runs on a profile that may hold service workers: the
    /// scratch page that writes localStorage bypasses them (else one could
    /// answer its navigation with the site's own page). Costs a
    /// `Network.enable` on a fresh tab, about 50 ms.
    pub service_workers: bool,
}

/// Whether `id` has the form of a recording id (a UUID without hyphens), so
/// that it names a file without escaping.
pub fn is_recording_id(id: &str) -> bool {
    id.len() == 32
        && id
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use flotilla_api_types::InstanceId;
    use flotilla_api_types::ids::SnapshotId;
    use serde_json::json;

    use super::*;
    use crate::engine::state::cookie_param;

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
                history: vec![HistoryEntry {
                    url: "http://a/".into(),
                    title: "A".into(),
                }],
                session_storage: vec![("s".into(), "1".into())],
                scroll: [0.0, 40.0],
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
        let opened = OpenedArchive::read(&packed).unwrap();
        opened
            .unpack(&target.join("profile"), &target.join("downloads"))
            .unwrap();
        assert_eq!(opened.state, state);
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

    /// A profile at `dir` with `files` (path, bytes), packed with `state`
    /// and read back.
    fn packed_profile(
        dir: &std::path::Path,
        files: &[(&str, &[u8])],
        state: &CapturedState,
    ) -> OpenedArchive {
        let profile = dir.join("profile");
        let _ = std::fs::remove_dir_all(&profile);
        for (path, bytes) in files {
            let path = profile.join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, bytes).unwrap();
        }
        std::fs::create_dir_all(&profile).unwrap();
        OpenedArchive::read(&archive(&profile, None, state).unwrap()).unwrap()
    }

    #[test]
    fn an_archive_names_the_site_data_only_its_files_hold() {
        let dir = tempfile::tempdir().unwrap();
        let captured = CapturedState {
            local_storage: vec![OriginStorage {
                origin: "http://127.0.0.1:8765".into(),
                items: vec![("k".into(), "v".into())],
            }],
            ..CapturedState::default()
        };
        // What Chromium 156 writes for one localStorage item (the log's bytes).
        let log: &[u8] = b"\x01\x00VERSION\x011\x01\x16_http://127.0.0.1:8765\x00\x01k\x02\x01v\x01\x1aMETA:http://127.0.0.1:8765\x08\x08\x80\x01";
        let ls_log = "Default/Local Storage/leveldb/000003.log";
        let ordinary: &[(&str, &[u8])] = &[
            ("Default/Cookies", b"db"),
            ("Default/WebStorage/QuotaManager", b"db"),
            ("Default/Session Storage/000003.log", b"x"),
            (ls_log, log),
        ];
        assert!(
            packed_profile(dir.path(), ordinary, &captured)
                .kept_only_in_files
                .is_empty(),
            "cookies, the quota database and captured localStorage are carried"
        );
        let uncaptured = packed_profile(dir.path(), ordinary, &CapturedState::default());
        assert_eq!(
            uncaptured.kept_only_in_files,
            ["localStorage of http://127.0.0.1:8765"]
        );
        for (file, named) in [
            (
                "Default/IndexedDB/http_a_0.indexeddb.leveldb/000003.log",
                "IndexedDB",
            ),
            ("Default/Service Worker/Database/CURRENT", "service workers"),
            ("Default/File System/000/t/00/00000000", "file systems"),
            ("Default/WebStorage/1/CacheStorage/index", "storage buckets"),
            (
                "Default/Local Storage/leveldb/000005.ldb",
                "compacted localStorage",
            ),
        ] {
            let opened = packed_profile(dir.path(), &[(file, b"data")], &captured);
            assert_eq!(opened.kept_only_in_files, [named], "{file}");
        }
    }

    /// A tampered store's archive whose `downloads` is a link to another
    /// instance's folder (and whose profile holds a link too).
    fn archive_with_links(victim: &std::path::Path) -> Vec<u8> {
        let mut builder = tar::Builder::new(Vec::new());
        let state = serde_json::to_vec(&CapturedState::default()).unwrap();
        let mut header = tar::Header::new_gnu();
        header.set_size(state.len() as u64);
        header.set_mode(0o600);
        header.set_cksum();
        builder
            .append_data(&mut header, "state.json", state.as_slice())
            .unwrap();
        let mut dir = tar::Header::new_gnu();
        dir.set_entry_type(tar::EntryType::Directory);
        dir.set_mode(0o700);
        dir.set_size(0);
        dir.set_cksum();
        builder
            .append_data(&mut dir.clone(), "profile", std::io::empty())
            .unwrap();
        for name in ["downloads", "profile/Cookies"] {
            let mut link = tar::Header::new_gnu();
            link.set_entry_type(tar::EntryType::Symlink);
            link.set_size(0);
            builder.append_link(&mut link, name, victim).unwrap();
        }
        zstd::encode_all(builder.into_inner().unwrap().as_slice(), 3).unwrap()
    }

    #[test]
    fn links_in_an_archive_are_not_unpacked() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::create_dir_all(&victim).unwrap();
        std::fs::write(victim.join("secret"), b"theirs").unwrap();
        let opened = OpenedArchive::read(&archive_with_links(&victim)).unwrap();
        let instance = dir.path().join("instance");
        std::fs::create_dir_all(instance.join("downloads")).unwrap();
        opened
            .unpack_downloads_into(&instance.join("downloads"))
            .unwrap();
        opened
            .unpack(&instance.join("profile"), &instance.join("downloads"))
            .unwrap();
        assert_eq!(std::fs::read(victim.join("secret")).unwrap(), b"theirs");
        assert_eq!(
            std::fs::read_dir(instance.join("downloads"))
                .unwrap()
                .count(),
            0
        );
        let downloads = std::fs::symlink_metadata(instance.join("downloads")).unwrap();
        assert!(downloads.is_dir(), "a folder, not a link");
        assert!(std::fs::symlink_metadata(instance.join("profile/Cookies")).is_err());
    }

    #[test]
    fn downloads_alone_go_into_the_same_folder() {
        let dir = tempfile::tempdir().unwrap();
        let (profile, downloads) = (dir.path().join("profile"), dir.path().join("downloads"));
        std::fs::create_dir_all(&profile).unwrap();
        std::fs::create_dir_all(&downloads).unwrap();
        std::fs::write(downloads.join("a.pdf"), b"%PDF").unwrap();
        let packed = archive(&profile, Some(&downloads), &CapturedState::default()).unwrap();
        let target = dir.path().join("target");
        std::fs::create_dir_all(target.join("downloads")).unwrap();
        let inode = |path: &std::path::Path| {
            std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(path).unwrap())
        };
        let before = inode(&target.join("downloads"));
        OpenedArchive::read(&packed)
            .unwrap()
            .unpack_downloads_into(&target.join("downloads"))
            .unwrap();
        assert_eq!(inode(&target.join("downloads")), before, "the same folder");
        assert_eq!(
            std::fs::read(target.join("downloads/a.pdf")).unwrap(),
            b"%PDF"
        );
        assert!(!target.join("profile").exists(), "no profile unpacked");
        assert!(!target.join("restore-staging").exists());
    }

    #[test]
    fn an_archive_from_before_tab_history_reads_and_reopens_at_the_url() {
        let old =
            r#"{"cookies": [], "local_storage": [], "tabs": [{"url": "http://a/", "title": "A"}]}"#;
        let state: CapturedState = serde_json::from_str(old).unwrap();
        assert_eq!(state.tabs[0].history, []);
        assert!(!state.tabs[0].needs_rebuilding());
        let scrolled = CapturedTab {
            scroll: [0.0, 1.0],
            ..state.tabs[0].clone()
        };
        assert!(scrolled.needs_rebuilding());
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
