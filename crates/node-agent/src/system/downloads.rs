//! An instance's downloads directory as clients see it: the listing, one
//! file, its removal, and which files finished since the last look (for the
//! `instance.download_completed` event).
//!
//! Every page's download lands in that directory (see `client_frames` and the
//! browser's default download folder). A name from a request must be a plain
//! file name: no separator, no `..`, no leading dot, no control character.
//! The browser may write there, so nothing here follows a symbolic link: only
//! regular files are listed, served or removed. Chromium writes a download as
//! `<name>.crdownload` and renames it when done; Firefox writes
//! `<name>.part` beside an empty `<name>` until done (that name is in
//! progress until then). A partial file untouched for a minute counts as
//! failed.

use std::collections::HashSet;
use std::fs::File;
use std::io;
use std::path::Path;
use std::time::{Duration, SystemTime};

use chrono::{DateTime, Utc};

use flotilla_api_types::instances::{Download, DownloadState};

const PARTIAL_SUFFIX: &str = ".crdownload";
/// Firefox writes a download's data as `<name>.part` beside an empty
/// `<name>` it puts in place at once, and renames the former over the
/// latter when done.
const FIREFOX_PARTIAL_SUFFIX: &str = ".part";
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
    let mut files = std::collections::HashMap::new();
    for entry in entries.flatten() {
        let Ok(meta) = entry.metadata() else { continue };
        // `DirEntry::metadata` does not follow links: a link is not a file.
        if !meta.is_file() {
            continue;
        }
        let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
            continue;
        };
        if !name.starts_with('.') {
            files.insert(name, meta);
        }
    }
    let state_of = |meta: &std::fs::Metadata| {
        let modified = meta.modified().unwrap_or(now);
        match now.duration_since(modified).unwrap_or_default() > STALLED {
            true => DownloadState::Failed,
            false => DownloadState::InProgress,
        }
    };
    let mut downloads = Vec::new();
    for (name, meta) in &files {
        // Firefox's partial data beside its placeholder: shown as the
        // latter. (A `.part` file on its own is a download of that name.)
        let placeholder = name.strip_suffix(FIREFOX_PARTIAL_SUFFIX);
        if placeholder.is_some_and(|placeholder| files.contains_key(placeholder)) {
            continue;
        }
        let data = files.get(&format!("{name}{FIREFOX_PARTIAL_SUFFIX}"));
        let (state, size_bytes) = if name.ends_with(PARTIAL_SUFFIX) {
            (state_of(meta), meta.len())
        } else if let Some(data) = data {
            (state_of(data), data.len())
        } else {
            (DownloadState::Complete, meta.len())
        };
        let shown = name.strip_suffix(PARTIAL_SUFFIX).unwrap_or(name);
        let modified = meta.modified().unwrap_or(now);
        downloads.push(Download {
            mime_type: mime_guess::from_path(shown)
                .first_or_octet_stream()
                .essence_str()
                .to_owned(),
            created_at: DateTime::<Utc>::from(meta.created().unwrap_or(modified)),
            size_bytes,
            state,
            name: name.clone(),
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
    fn a_firefox_download_is_in_progress_while_its_part_file_is_there() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("hello.txt"), b"").unwrap();
        std::fs::write(dir.path().join("hello.txt.part"), b"hel").unwrap();
        let listed = list(dir.path()).unwrap();
        assert_eq!(listed.len(), 1, "{listed:?}");
        assert_eq!(
            (
                listed[0].name.as_str(),
                listed[0].state,
                listed[0].size_bytes
            ),
            ("hello.txt", DownloadState::InProgress, 3)
        );
        assert!(newly_completed(dir.path(), &mut HashSet::new()).is_empty());
        std::fs::rename(
            dir.path().join("hello.txt.part"),
            dir.path().join("hello.txt"),
        )
        .unwrap();
        let listed = list(dir.path()).unwrap();
        assert_eq!(
            (listed[0].state, listed[0].size_bytes),
            (DownloadState::Complete, 3)
        );
        // A `.part` file without a placeholder is a download of that name
        // (Firefox would write its data as `notes.part.part`).
        std::fs::write(dir.path().join("notes.part"), b"x").unwrap();
        let listed = list(dir.path()).unwrap();
        let named = listed.iter().find(|d| d.name == "notes.part").unwrap();
        assert_eq!(
            (named.state, named.size_bytes),
            (DownloadState::Complete, 1)
        );
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
