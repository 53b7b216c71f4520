//! The folders of one instance on the node ([`InstanceDirs`]): which the
//! browser may write to, and which stay the agent's.

use std::path::{Path, PathBuf};

/// The paths of one instance on the node. The browser may write only to its
/// profile, home and downloads directories; the instance directory itself
/// (with the log the agent writes) stays the agent's.
#[derive(Debug, Clone)]
pub struct InstanceDirs {
    pub root: PathBuf,
}

impl InstanceDirs {
    pub fn new(root: PathBuf) -> Self {
        Self { root }
    }

    pub fn profile(&self) -> PathBuf {
        self.root.join("profile")
    }

    pub fn home(&self) -> PathBuf {
        self.root.join("home")
    }

    /// Where every download of the instance lands.
    pub fn downloads(&self) -> PathBuf {
        self.root.join("downloads")
    }

    pub fn log(&self) -> PathBuf {
        self.root.join("browser.log")
    }

    /// The unpacked extensions the browser loads, one folder per id; the
    /// agent's, read-only to the browser.
    pub fn extensions(&self) -> PathBuf {
        self.root.join("extensions")
    }

    /// Files WebDriver clients uploaded (`POST /session/{id}/se/file`), one
    /// folder per upload; the agent's, read-only to the browser and its
    /// chromedriver.
    pub fn uploads(&self) -> PathBuf {
        self.root.join("uploads")
    }

    /// The directories the browser may write to.
    pub fn writable(&self) -> [PathBuf; 3] {
        [self.profile(), self.home(), self.downloads()]
    }

    pub fn create(&self) -> std::io::Result<()> {
        for dir in self.writable() {
            std::fs::create_dir_all(dir)?;
        }
        // Before the sandbox starts: it binds what exists then.
        std::fs::create_dir_all(self.uploads())
    }

    /// Makes `downloads` (the downloads directory as the browser sees it) the
    /// browser's default download folder: XDG user dirs, which Chromium reads.
    /// The home is the browser's: written by handle, never through a link it
    /// left there (see [`crate::system::files`]).
    pub fn set_default_downloads(&self, downloads: &Path) -> std::io::Result<()> {
        crate::system::files::BrowserFolder::open(&self.home())?
            .folder(".config")?
            .replace(
                "user-dirs.dirs",
                format!("XDG_DOWNLOAD_DIR=\"{}\"\n", downloads.display()).as_bytes(),
            )
    }
}
