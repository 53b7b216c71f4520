//! Files the agent (often root) writes into folders the browser owns: the
//! profile's preferences, the home's XDG settings. What lies there is the
//! browser's, so hostile: a link it planted, or swapped in while the agent
//! works (another instance's browser runs as the same user), must never
//! make the agent read or write elsewhere. So every step goes by handle:
//! a folder is opened without following links and what is in it is reached
//! relative to that handle (`openat`, `unlinkat`, `renameat`), never by path
//! again.

use std::io::{self, Read, Write};
use std::os::fd::OwnedFd;
use std::path::Path;

use rustix::fs::{AtFlags, CWD, FileType, Mode, OFlags};
use rustix::io::Errno;

/// A folder opened without following links.
pub struct BrowserFolder {
    fd: OwnedFd,
}

impl BrowserFolder {
    /// The folder at `path`, whose parents are the agent's own (only the
    /// last component could be the browser's doing: it must be a folder,
    /// not a link to one).
    pub fn open(path: &Path) -> io::Result<Self> {
        let fd = rustix::fs::openat(CWD, path, folder_flags(), Mode::empty())?;
        Ok(Self { fd })
    }

    /// The folder `name` in this one, made when missing; anything else
    /// under that name (a link, a file, a pipe) is removed first.
    pub fn folder(&self, name: &str) -> io::Result<Self> {
        match rustix::fs::openat(&self.fd, name, folder_flags(), Mode::empty()) {
            Ok(fd) => return Ok(Self { fd }),
            Err(Errno::NOENT) => {}
            Err(Errno::NOTDIR | Errno::LOOP) => {
                rustix::fs::unlinkat(&self.fd, name, AtFlags::empty())?
            }
            Err(error) => return Err(error.into()),
        }
        match rustix::fs::mkdirat(&self.fd, name, Mode::from_raw_mode(0o700)) {
            Ok(()) | Err(Errno::EXIST) => {}
            Err(error) => return Err(error.into()),
        }
        let fd = rustix::fs::openat(&self.fd, name, folder_flags(), Mode::empty())?;
        Ok(Self { fd })
    }

    /// The contents of the regular file `name`, if it is one, has no other
    /// name (a hard link could be to a file the browser may not read) and
    /// is at most `max` bytes.
    pub fn read(&self, name: &str, max: u64) -> Option<Vec<u8>> {
        let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
        let fd = rustix::fs::openat(&self.fd, name, flags, Mode::empty()).ok()?;
        let stat = rustix::fs::fstat(&fd).ok()?;
        if FileType::from_raw_mode(stat.st_mode) != FileType::RegularFile || stat.st_nlink != 1 {
            return None;
        }
        let mut contents = Vec::new();
        std::fs::File::from(fd)
            .take(max + 1)
            .read_to_end(&mut contents)
            .ok()?;
        (contents.len() as u64 <= max).then_some(contents)
    }

    /// Replaces the file `name` with `contents`: written under a temporary
    /// name (made new, so never through a link) and renamed over it, which
    /// replaces a link rather than writing through it.
    pub fn replace(&self, name: &str, contents: &[u8]) -> io::Result<()> {
        let partial = format!(".{name}.flotilla");
        match rustix::fs::unlinkat(&self.fd, partial.as_str(), AtFlags::empty()) {
            Ok(()) | Err(Errno::NOENT) => {}
            Err(error) => return Err(error.into()),
        }
        let flags =
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let fd = rustix::fs::openat(
            &self.fd,
            partial.as_str(),
            flags,
            Mode::from_raw_mode(0o600),
        )?;
        let mut file = std::fs::File::from(fd);
        file.write_all(contents)?;
        file.sync_all()?;
        rustix::fs::renameat(&self.fd, partial.as_str(), &self.fd, name)?;
        Ok(())
    }
}

fn folder_flags() -> OFlags {
    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::os::unix::fs::symlink;

    use super::*;

    #[test]
    fn a_linked_folder_is_replaced_and_nothing_is_written_through_it() {
        let outside = tempfile::tempdir().unwrap();
        let base = tempfile::tempdir().unwrap();
        symlink(outside.path(), base.path().join("Default")).unwrap();
        let folder = BrowserFolder::open(base.path())
            .unwrap()
            .folder("Default")
            .unwrap();
        folder.replace("Preferences", b"{}").unwrap();
        assert!(
            fs::symlink_metadata(base.path().join("Default"))
                .unwrap()
                .is_dir()
        );
        assert_eq!(
            fs::read(base.path().join("Default/Preferences")).unwrap(),
            b"{}"
        );
        assert_eq!(fs::read_dir(outside.path()).unwrap().count(), 0);
    }

    #[test]
    fn a_folder_swapped_for_a_link_after_opening_changes_nothing() {
        let outside = tempfile::tempdir().unwrap();
        let base = tempfile::tempdir().unwrap();
        let folder = BrowserFolder::open(base.path())
            .unwrap()
            .folder("Default")
            .unwrap();
        // The browser renames the real folder away and links the name out.
        fs::rename(base.path().join("Default"), base.path().join("moved")).unwrap();
        symlink(outside.path(), base.path().join("Default")).unwrap();
        folder.replace("Preferences", b"{\"x\":1}").unwrap();
        assert_eq!(fs::read_dir(outside.path()).unwrap().count(), 0);
        assert_eq!(
            fs::read(base.path().join("moved/Preferences")).unwrap(),
            b"{\"x\":1}",
            "written where the handle points"
        );
    }

    #[test]
    fn links_pipes_and_hard_links_are_not_read() {
        let outside = tempfile::tempdir().unwrap();
        let secret = outside.path().join("secret");
        fs::write(&secret, b"root only").unwrap();
        let base = tempfile::tempdir().unwrap();
        symlink(&secret, base.path().join("linked")).unwrap();
        fs::hard_link(&secret, base.path().join("hard")).unwrap();
        let status = std::process::Command::new("mkfifo")
            .arg(base.path().join("pipe"))
            .status()
            .unwrap();
        assert!(status.success());
        fs::write(base.path().join("plain"), b"mine").unwrap();
        let folder = BrowserFolder::open(base.path()).unwrap();
        for name in ["linked", "hard", "pipe", "missing"] {
            assert_eq!(folder.read(name, 1024), None, "{name}");
        }
        assert_eq!(folder.read("plain", 1024).as_deref(), Some(&b"mine"[..]));
        assert_eq!(folder.read("plain", 3), None, "over the limit");
    }

    #[test]
    fn a_planted_temporary_name_or_a_linked_target_is_replaced() {
        let outside = tempfile::tempdir().unwrap();
        let secret = outside.path().join("secret");
        fs::write(&secret, b"root only").unwrap();
        let base = tempfile::tempdir().unwrap();
        symlink(&secret, base.path().join(".Preferences.flotilla")).unwrap();
        symlink(&secret, base.path().join("Preferences")).unwrap();
        let folder = BrowserFolder::open(base.path()).unwrap();
        folder.replace("Preferences", b"new").unwrap();
        assert_eq!(fs::read(&secret).unwrap(), b"root only");
        assert!(
            !fs::symlink_metadata(base.path().join("Preferences"))
                .unwrap()
                .is_symlink()
        );
        assert_eq!(fs::read(base.path().join("Preferences")).unwrap(), b"new");
    }

    #[test]
    fn the_folder_itself_must_not_be_a_link() {
        let outside = tempfile::tempdir().unwrap();
        let base = tempfile::tempdir().unwrap();
        symlink(outside.path(), base.path().join("profile")).unwrap();
        assert!(BrowserFolder::open(&base.path().join("profile")).is_err());
    }
}
