//! The archive of a parked browser: its profile directory (without caches
//! and lock files), its downloads and its captured state in one tar + zstd
//! file ([`archive`]), and back ([`OpenedArchive`]: read, looked at, then
//! unpacked whole or only its downloads).

use std::io::Read;
use std::path::{Path, PathBuf};

use super::CapturedState;
use bytes::Bytes;

/// Parts of a profile that are caches or locks: left out of archives.
pub(super) const SKIPPED: &[&str] = &[
    "Cache",
    "Code Cache",
    "GPUCache",
    "GrShaderCache",
    "ShaderCache",
    "DawnCache",
    "DawnGraphiteCache",
    "DawnWebGPUCache",
    "GraphiteDawnCache",
    "Crashpad",
    "component_crx_cache",
    "extensions_crx_cache",
    "Safe Browsing",
    "SingletonLock",
    "SingletonCookie",
    "SingletonSocket",
    "DevToolsActivePort",
    "BrowserMetrics",
    "optimization_guide_model_store",
    // Firefox's.
    "cache2",
    "startupCache",
    "shader-cache",
    "safebrowsing",
    "crashes",
    "minidumps",
    "thumbnails",
    "lock",
    ".parentlock",
    "WebDriverBiDiServer.json",
];

/// Packs the profile, the downloads (when given and the directory exists)
/// and the captured state into one tar + zstd archive. Symbolic links are
/// stored as links, never followed.
pub fn archive(
    profile: &Path,
    downloads: Option<&Path>,
    state: &CapturedState,
) -> anyhow::Result<Bytes> {
    let mut builder = tar::Builder::new(Vec::new());
    builder.follow_symlinks(false);
    let state_json = serde_json::to_vec(state)?;
    let mut header = tar::Header::new_gnu();
    header.set_size(state_json.len() as u64);
    header.set_mode(0o600);
    header.set_cksum();
    builder.append_data(&mut header, "state.json", state_json.as_slice())?;
    append_dir(&mut builder, profile, Path::new("profile"))?;
    if let Some(downloads) = downloads.filter(|d| d.is_dir()) {
        append_dir(&mut builder, downloads, Path::new("downloads"))?;
    }
    let tar = builder.into_inner()?;
    Ok(Bytes::from(zstd::encode_all(tar.as_slice(), 3)?))
}

pub(super) fn append_dir(
    builder: &mut tar::Builder<Vec<u8>>,
    dir: &Path,
    name: &Path,
) -> anyhow::Result<()> {
    builder.append_dir(name, dir)?;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let file_name = entry.file_name();
        if SKIPPED.iter().any(|s| file_name == *s) {
            continue;
        }
        let kind = entry.file_type()?;
        let path = entry.path();
        let archived = name.join(&file_name);
        if kind.is_dir() {
            append_dir(builder, &path, &archived)?;
        } else if kind.is_file() {
            // A file may vanish between listing and reading (the browser is gone,
            // but be safe): skip it rather than fail the snapshot.
            if let Ok(mut file) = std::fs::File::open(&path) {
                builder.append_file(&archived, &mut file)?;
            }
        }
    }
    Ok(())
}

/// An archive read into memory: its captured state, and what of the site
/// data in its profile only the profile's files carry (what a browser
/// started on another profile would lose, see [`OpenedArchive::kept_only_in_files`]).
pub struct OpenedArchive {
    tar: Vec<u8>,
    pub state: CapturedState,
    /// Kinds of site data only the profile's files hold, named for a log
    /// line (`IndexedDB`, `localStorage of http://a.test`, …); empty when the
    /// captured state carries everything a site stored.
    pub kept_only_in_files: Vec<String>,
}

impl OpenedArchive {
    pub fn read(archive: &[u8]) -> anyhow::Result<Self> {
        let tar = zstd::decode_all(archive)?;
        let mut state = CapturedState::default();
        let mut files = Vec::new();
        let mut local_storage_logs = Vec::new();
        // Seeking past the entries not read (most of a profile), not copying them.
        let mut reader = tar::Archive::new(std::io::Cursor::new(tar.as_slice()));
        for entry in reader.entries_with_seek()? {
            let mut entry = entry?;
            let path = entry.path()?.into_owned();
            if path == Path::new("state.json") {
                let mut text = String::new();
                entry.read_to_string(&mut text)?;
                state = serde_json::from_str(&text)?;
            } else if entry.header().entry_type().is_file() && path.starts_with("profile") {
                if is_local_storage_file(&path, "log") {
                    let mut bytes = Vec::new();
                    entry.read_to_end(&mut bytes)?;
                    local_storage_logs.push(bytes);
                }
                files.push(path);
            }
        }
        let kept_only_in_files = kept_only_in_files(&files, &local_storage_logs, &state);
        Ok(Self {
            tar,
            state,
            kept_only_in_files,
        })
    }

    /// Whether the profile holds service workers, which a browser started on
    /// it runs (see [`super::RestoreOptions::service_workers`]).
    pub fn holds_service_workers(&self) -> bool {
        self.kept_only_in_files
            .iter()
            .any(|kept| kept == SERVICE_WORKERS)
    }

    /// The profile into `profile` (which must not exist yet), the downloads
    /// into `downloads` (replacing what is there).
    pub fn unpack(&self, profile: &Path, downloads: &Path) -> anyhow::Result<()> {
        let parent = profile
            .parent()
            .ok_or_else(|| anyhow::anyhow!("profile path has no parent"))?;
        let staging = self.stage(parent, |path| {
            path.starts_with("profile") || path.starts_with("downloads")
        })?;
        std::fs::rename(staging.join("profile"), profile)?;
        if is_real_dir(&staging.join("downloads")) {
            let _ = std::fs::remove_dir_all(downloads);
            std::fs::rename(staging.join("downloads"), downloads)?;
        }
        let _ = std::fs::remove_dir_all(&staging);
        Ok(())
    }

    /// Only the downloads, each moved into `downloads`, which stays the
    /// same directory (a running browser may have it bound in its sandbox).
    pub fn unpack_downloads_into(&self, downloads: &Path) -> anyhow::Result<()> {
        let parent = downloads
            .parent()
            .ok_or_else(|| anyhow::anyhow!("downloads path has no parent"))?;
        let staging = self.stage(parent, |path| path.starts_with("downloads"))?;
        let unpacked = staging.join("downloads");
        if is_real_dir(&unpacked) {
            std::fs::create_dir_all(downloads)?;
            for entry in std::fs::read_dir(&unpacked)? {
                let entry = entry?;
                std::fs::rename(entry.path(), downloads.join(entry.file_name()))?;
            }
        }
        let _ = std::fs::remove_dir_all(&staging);
        Ok(())
    }

    /// Unpacks the entries `wanted` selects into a fresh staging directory
    /// in `parent`; `unpack_in` refuses paths that would leave it. Only
    /// files and folders ([`archive`] writes nothing else): a link in an
    /// archive from a tampered store (`downloads` → another instance's
    /// folder) would have the agent move or hand over what it points to.
    fn stage(&self, parent: &Path, wanted: impl Fn(&Path) -> bool) -> anyhow::Result<PathBuf> {
        let staging = parent.join("restore-staging");
        let _ = std::fs::remove_dir_all(&staging);
        std::fs::create_dir_all(&staging)?;
        let mut reader = tar::Archive::new(std::io::Cursor::new(self.tar.as_slice()));
        for entry in reader.entries_with_seek()? {
            let mut entry = entry?;
            let kind = entry.header().entry_type();
            if (kind.is_file() || kind.is_dir()) && wanted(&entry.path()?) {
                entry.unpack_in(&staging)?;
            }
        }
        Ok(staging)
    }
}

/// Folders of a profile holding site data that no CDP call can write into a
/// running browser, with the name a log line gives them.
const SITE_DATA_ONLY_IN_FILES: &[(&str, &str)] = &[
    ("IndexedDB", "IndexedDB"),
    ("File System", "file systems"),
    ("Service Worker", SERVICE_WORKERS),
    ("blob_storage", "blobs"),
];

/// A directory itself, not a link to one.
fn is_real_dir(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|meta| meta.is_dir())
}

/// How [`OpenedArchive::kept_only_in_files`] names service workers.
const SERVICE_WORKERS: &str = "service workers";

/// A file of the localStorage database with the extension `ext`.
fn is_local_storage_file(path: &Path, ext: &str) -> bool {
    path.parent()
        .is_some_and(|dir| dir.ends_with("Local Storage/leveldb"))
        && path.extension().is_some_and(|found| found == ext)
}

/// What only the profile's files hold (see [`OpenedArchive::kept_only_in_files`]):
/// IndexedDB, file systems, service workers, storage buckets, and
/// localStorage of an origin the capture did not read (named by the `META:`
/// keys of the localStorage database's log; a compacted table cannot be read
/// that way, so it counts as unknown data).
fn kept_only_in_files(
    files: &[PathBuf],
    local_storage_logs: &[Vec<u8>],
    state: &CapturedState,
) -> Vec<String> {
    let mut kept = Vec::new();
    let mut note = |what: String| {
        if !kept.contains(&what) {
            kept.push(what);
        }
    };
    for path in files {
        let folders: Vec<&std::ffi::OsStr> = path.iter().collect();
        for (folder, what) in SITE_DATA_ONLY_IN_FILES {
            if folders.iter().any(|f| f == folder) {
                note((*what).to_owned());
            }
        }
        // Storage buckets: everything there but the quota database.
        if let Some(at) = folders.iter().position(|f| *f == "WebStorage")
            && folders
                .get(at + 1)
                .is_some_and(|f| !f.to_string_lossy().starts_with("QuotaManager"))
        {
            note("storage buckets".to_owned());
        }
        if is_local_storage_file(path, "ldb") {
            note("compacted localStorage".to_owned());
        }
    }
    for log in local_storage_logs {
        for origin in local_storage_origins(log) {
            if !state.local_storage.iter().any(|o| o.origin == origin) {
                note(format!("localStorage of {origin}"));
            }
        }
    }
    kept
}

/// The origins a localStorage database's log names in its `META:` keys.
fn local_storage_origins(log: &[u8]) -> Vec<String> {
    const MARK: &[u8] = b"META:";
    let origin_byte = |b: &u8| b.is_ascii_alphanumeric() || b"-._~:/[]%+".contains(b);
    let mut origins: Vec<String> = Vec::new();
    let mut at = 0;
    while let Some(found) = log[at..].windows(MARK.len()).position(|w| w == MARK) {
        let start = at + found + MARK.len();
        let length = log[start..].iter().take_while(|b| origin_byte(b)).count();
        let origin = String::from_utf8_lossy(&log[start..start + length]).into_owned();
        if !origin.is_empty() && !origins.contains(&origin) {
            origins.push(origin);
        }
        at = start;
    }
    origins
}
