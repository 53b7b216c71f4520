//! The archive of a parked browser: its profile directory (without caches
//! and lock files), its downloads and its captured state in one tar + zstd
//! file ([`archive`]), and back ([`extract`]).

use std::io::Read;
use std::path::Path;

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

/// Unpacks an archive: the profile into `profile` (which must not exist yet),
/// the downloads into `downloads` (replacing what is there), and returns the
/// captured state.
pub fn extract(archive: &[u8], profile: &Path, downloads: &Path) -> anyhow::Result<CapturedState> {
    let tar = zstd::decode_all(archive)?;
    let parent = profile
        .parent()
        .ok_or_else(|| anyhow::anyhow!("profile path has no parent"))?;
    let staging = parent.join("restore-staging");
    let _ = std::fs::remove_dir_all(&staging);
    std::fs::create_dir_all(&staging)?;
    let mut state = CapturedState::default();
    let mut entries = tar::Archive::new(tar.as_slice());
    for entry in entries.entries()? {
        let mut entry = entry?;
        let path = entry.path()?.into_owned();
        if path == Path::new("state.json") {
            let mut text = String::new();
            entry.read_to_string(&mut text)?;
            state = serde_json::from_str(&text)?;
        } else if path.starts_with("profile") || path.starts_with("downloads") {
            // `unpack_in` refuses paths that would leave the staging directory.
            entry.unpack_in(&staging)?;
        }
    }
    std::fs::rename(staging.join("profile"), profile)?;
    if staging.join("downloads").is_dir() {
        let _ = std::fs::remove_dir_all(downloads);
        std::fs::rename(staging.join("downloads"), downloads)?;
    }
    let _ = std::fs::remove_dir_all(&staging);
    Ok(state)
}
