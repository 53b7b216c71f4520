//! Owner-only files. The store holds the keys that sign instance tokens and
//! subscriber tokens; snapshots hold cookies; profiles, downloads and
//! recordings are users' data. So every file and directory a Flotilla
//! process creates is its own user's alone (umask 077, set at start), and
//! what an earlier version left readable under the data directory is
//! tightened at start. The node agent then lets its browser user through the
//! few directories that lead to browsers' own (see the agent's sandbox).

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;

/// Sets the process's umask to 077 and takes group and other permissions
/// off everything under `data_dir` (symbolic links are left alone). Answers
/// how many entries were tightened; one that cannot be (another user's) is
/// logged and skipped.
pub fn owner_only(data_dir: &Path) -> usize {
    // SAFETY: umask only replaces the process's file-creation mask.
    unsafe {
        libc::umask(0o077);
    }
    let tightened = tighten(data_dir);
    if tightened > 0 {
        tracing::info!(
            tightened,
            data_dir = %data_dir.display(),
            "made files under the data directory owner-only"
        );
    }
    tightened
}

fn tighten(path: &Path) -> usize {
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return 0;
    };
    if meta.file_type().is_symlink() {
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
            tightened += tighten(&entry.path());
        }
    }
    tightened
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(owner_only(root), 5, "root, snapshots, a, and the two files");
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
