//! An instance's downloads directory as clients see it: the listing, one
//! file, its removal, and which files finished since the last look (for the
//! `instance.download_completed` event).
//!
//! Every page's download lands in that directory (see `client_frames` and the
//! browser's default download folder). A name from a request must be a plain
//! file name: no separator, no `..`, no leading dot, no control character.
//! The browser may write there, so nothing here follows a symbolic link: only
//! regular files are listed, served or removed. Chromium writes a download as
//! `<name>.crdownload` and renames it when done; a partial file untouched
//! for a minute counts as failed.

use std::collections::HashSet;
use std::fs::File;
use std::io;
use std::path::Path;
use std::time::{Duration, SystemTime};

use chrono::{DateTime, Utc};

use flotilla_api_types::instances::{Download, DownloadState};

const PARTIAL_SUFFIX: &str = ".crdownload";
/// A partial file this long untouched is a failed download.
const STALLED: Duration = Duration::from_secs(60);

/// A name a client may not ask for: not a plain file name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{name:?} is not a download name: a plain file name from GET /downloads, without '/', '..' or a leading dot"
)]
pub struct InvalidName {
    pub name: String,
}

/// `name` if it is a plain file name a client may ask for.
pub fn checked_name(name: &str) -> Result<&str, InvalidName> {
    let plain = !name.is_empty()
        && name.len() <= 255
        && !name.starts_with('.')
        && !name.contains(['/', '\\'])
        && !name.chars().any(char::is_control);
    if plain {
        Ok(name)
    } else {
        Err(InvalidName {
            name: name.to_owned(),
        })
    }
}

/// The downloads, newest first.
pub fn list(dir: &Path) -> io::Result<Vec<Download>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(error) => return Err(error),
    };
    let now = SystemTime::now();
    let mut downloads = Vec::new();
    for entry in entries.flatten() {
        let Ok(meta) = entry.metadata() else { continue };
        // `DirEntry::metadata` does not follow links: a link is not a file.
        if !meta.is_file() {
            continue;
        }
        let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
            continue;
        };
        if name.starts_with('.') {
            continue;
        }
        let modified = meta.modified().unwrap_or(now);
        let state = if name.ends_with(PARTIAL_SUFFIX) {
            if now.duration_since(modified).unwrap_or_default() > STALLED {
                DownloadState::Failed
            } else {
                DownloadState::InProgress
            }
        } else {
            DownloadState::Complete
        };
        let shown = name.strip_suffix(PARTIAL_SUFFIX).unwrap_or(&name);
        downloads.push(Download {
            mime_type: mime_guess::from_path(shown)
                .first_or_octet_stream()
                .essence_str()
                .to_owned(),
            created_at: DateTime::<Utc>::from(meta.created().unwrap_or(modified)),
            size_bytes: meta.len(),
            state,
            name,
        });
    }
    downloads.sort_by(|a, b| b.created_at.cmp(&a.created_at).then(a.name.cmp(&b.name)));
    Ok(downloads)
}

/// Opens download `name` for reading: a regular file, never through a link.
pub fn open(dir: &Path, name: &str) -> io::Result<(File, u64)> {
    use std::os::unix::fs::OpenOptionsExt;
    let path = dir.join(name);
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(&path)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(io::Error::new(io::ErrorKind::NotFound, "not a file"));
    }
    Ok((file, meta.len()))
}

/// Removes download `name`; `false` when there is no such file.
pub fn remove(dir: &Path, name: &str) -> io::Result<bool> {
    let path = dir.join(name);
    match std::fs::symlink_metadata(&path) {
        Ok(meta) if meta.is_file() => {
            std::fs::remove_file(&path)?;
            Ok(true)
        }
        Ok(_) => Ok(false),
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(error) => Err(error),
    }
}

/// Complete downloads not in `seen` (which learns them).
pub fn newly_completed(dir: &Path, seen: &mut HashSet<String>) -> Vec<Download> {
    list(dir)
        .unwrap_or_default()
        .into_iter()
        .filter(|download| download.state == DownloadState::Complete)
        .filter(|download| seen.insert(download.name.clone()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_must_be_plain() {
        for good in [
            "report.pdf",
            "a b (1).csv",
            "Unconfirmed 123.crdownload",
            "ünïcode.txt",
        ] {
            assert!(checked_name(good).is_ok(), "{good}");
        }
        for bad in [
            "",
            "../etc/passwd",
            "..",
            ".hidden",
            "a/b",
            "a\\b",
            "x\0y",
            "x\ny",
            &"a".repeat(256),
        ] {
            assert!(checked_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn listing_serving_and_removing_skip_links() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("done.pdf"), b"%PDF-1").unwrap();
        std::fs::write(dir.path().join("big.zip.crdownload"), b"part").unwrap();
        let secret = dir.path().join("../outside-secret");
        std::fs::write(&secret, b"secret").unwrap();
        std::os::unix::fs::symlink(&secret, dir.path().join("link.txt")).unwrap();
        let listed = list(dir.path()).unwrap();
        let names: Vec<&str> = listed.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names.len(), 2, "{names:?}");
        let done = listed.iter().find(|d| d.name == "done.pdf").unwrap();
        assert_eq!((done.state, done.size_bytes), (DownloadState::Complete, 6));
        assert_eq!(done.mime_type, "application/pdf");
        let partial = listed
            .iter()
            .find(|d| d.name == "big.zip.crdownload")
            .unwrap();
        assert_eq!(partial.state, DownloadState::InProgress);
        assert_eq!(partial.mime_type, "application/zip");
        assert!(open(dir.path(), "done.pdf").is_ok());
        assert!(
            open(dir.path(), "link.txt").is_err(),
            "a link is not served"
        );
        assert!(!remove(dir.path(), "link.txt").unwrap(), "nor removed");
        assert!(secret.exists());
        let mut seen = HashSet::new();
        assert_eq!(newly_completed(dir.path(), &mut seen).len(), 1);
        assert!(
            newly_completed(dir.path(), &mut seen).is_empty(),
            "announced once"
        );
        assert!(remove(dir.path(), "done.pdf").unwrap());
        assert!(!dir.path().join("done.pdf").exists());
        let _ = std::fs::remove_file(secret);
    }
}
