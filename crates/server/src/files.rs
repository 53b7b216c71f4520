//! Owner-only files. The store holds the keys that sign instance tokens and
//! subscriber tokens; snapshots hold cookies; profiles, downloads and
//! recordings are users' data. So every file and directory a Flotilla
//! process creates is its own user's alone (umask 077, set at start), and
//! what an earlier version left readable under the data directory is
//! tightened at start. The node agent then lets its browser user through the
//! few directories that lead to browsers' own (see the agent's sandbox).

use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::Path;

/// Sets the process's umask to 077 and takes group and other permissions
/// off everything under `data_dir` (symbolic links are left alone). Answers
/// how many entries were tightened; one that cannot be (another user's) is
/// logged and skipped.
pub fn owner_only(data_dir: &Path) -> anyhow::Result<usize> {
    // SAFETY: umask only replaces the process's file-creation mask.
    unsafe {
        libc::umask(0o077);
    }
    refuse_shared(data_dir)?;
    let device = std::fs::metadata(data_dir).map(|meta| meta.dev()).ok();
    let tightened = tighten(data_dir, device);
    if tightened > 0 {
        tracing::info!(
            tightened,
            data_dir = %data_dir.display(),
            "made files under the data directory owner-only"
        );
    }
    Ok(tightened)
}

/// A data directory shared with other users (sticky or world-writable, as
/// `/tmp`) is refused: tightening it would take it from them.
fn refuse_shared(data_dir: &Path) -> anyhow::Result<()> {
    let Ok(meta) = std::fs::metadata(data_dir) else {
        return Ok(()); // created, owner-only, by the caller
    };
    let mode = meta.permissions().mode();
    if mode & 0o1000 != 0 || mode & 0o002 != 0 {
        anyhow::bail!(
            "data_dir {} is a folder shared with other users (mode {:04o}): choose a folder of Flotilla's own inside it (e.g. {})",
            data_dir.display(),
            mode & 0o7777,
            data_dir.join("flotilla").display()
        );
    }
    Ok(())
}

/// Tightens `path` and what is under it, on the data directory's own
/// filesystem only (`device`): never into what is mounted inside it.
fn tighten(path: &Path, device: Option<u64>) -> usize {
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return 0;
    };
    if meta.file_type().is_symlink() || device.is_some_and(|device| meta.dev() != device) {
        return 0;
    }
    let mode = meta.permissions().mode();
    let mut tightened = 0;
    if mode & 0o077 != 0 {
        match std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode & 0o7700)) {
            Ok(()) => tightened += 1,
            Err(error) => tracing::warn!(path = %path.display(), %error, "cannot make owner-only"),
        }
    }
    if meta.is_dir()
        && let Ok(entries) = std::fs::read_dir(path)
    {
        for entry in entries.flatten() {
            tightened += tighten(&entry.path(), device);
        }
    }
    tightened
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `FLOTILLA_DATA_DIR=/tmp` once made /tmp owner-only (and every other
    /// user's file in it): a shared folder is refused, untouched.
    #[test]
    fn a_shared_folder_is_refused_as_the_data_directory_and_left_as_it_was() {
        let shared = tempfile::tempdir().unwrap();
        std::fs::set_permissions(shared.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
        let theirs = shared.path().join("someone-elses");
        std::fs::write(&theirs, b"theirs").unwrap();
        std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o644)).unwrap();
        let error = owner_only(shared.path()).unwrap_err().to_string();
        assert!(error.contains("shared with other users"), "{error}");
        let mode = |path: &Path| std::fs::metadata(path).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode(shared.path()), 0o1777);
        assert_eq!(mode(&theirs), 0o644);
    }

    #[test]
    fn what_others_could_read_is_tightened_and_new_files_are_owner_only() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("snapshots/a")).unwrap();
        for (path, mode) in [
            ("flotilla.db", 0o644),
            ("snapshots/a/s.tar.zst", 0o664),
            ("snapshots/a", 0o755),
        ] {
            let path = root.join(path);
            if !path.is_dir() {
                std::fs::write(&path, b"secret").unwrap();
            }
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        }
        let outside = tempfile::NamedTempFile::new().unwrap();
        std::fs::set_permissions(outside.path(), std::fs::Permissions::from_mode(0o644)).unwrap();
        std::os::unix::fs::symlink(outside.path(), root.join("link")).unwrap();
        std::fs::set_permissions(root, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(
            owner_only(root).unwrap(),
            5,
            "root, snapshots, a, and the two files"
        );
        let mode = |p: &str| {
            std::fs::symlink_metadata(root.join(p))
                .unwrap()
                .permissions()
                .mode()
                & 0o7777
        };
        assert_eq!(mode(""), 0o700);
        assert_eq!(mode("flotilla.db"), 0o600);
        assert_eq!(mode("snapshots/a"), 0o700);
        assert_eq!(mode("snapshots/a/s.tar.zst"), 0o600);
        // New files: the umask applies.
        std::fs::write(root.join("new"), b"x").unwrap();
        assert_eq!(mode("new"), 0o600);
        assert_eq!(
            std::fs::metadata(outside.path())
                .unwrap()
                .permissions()
                .mode()
                & 0o777,
            0o644,
            "a link's target is left alone"
        );
    }
}
