//! How a browser is confined on its node: which user it runs as, what of the
//! host's filesystem it sees, whether Chromium's own sandbox is on, and whether
//! its network is its own namespace. Decided once at agent start
//! ([`Isolation::detect`]), applied to every launch ([`Isolation::command`]).
//!
//! - **User.** A root agent runs browsers as `agent.browser_user` (created by
//!   `scripts/install-deps`; `nobody` when it does not exist), never as root.
//! - **Filesystem** (bubblewrap). The browser's root is an empty, read-only
//!   tmpfs holding only read-only binds of what a browser needs (`/usr`, fonts,
//!   certificates, time zone, the browser's own directory), a generated
//!   `/etc/passwd`, the instance's own profile, home and downloads directories
//!   (at `/instance/…`, so no host path shows), and private `/tmp`, `/dev/shm`,
//!   `/proc` and `/dev`. Homes, `/etc/shadow`,
//!   the data directory, other instances, snapshots and sources do not exist in
//!   it. New user, pid, ipc, uts and cgroup namespaces.
//! - **Chromium's sandbox** needs user namespaces inside ours; a probe at start
//!   says whether the kernel allows them. Where it does not, browsers start with
//!   `--no-sandbox` and the node reports why (health warnings).
//! - **Environment.** Browsers get a fixed environment, never the agent's own
//!   (which may hold the cluster token or object-store keys).

use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use tokio::process::Command;

use crate::system::dirs::InstanceDirs;
use crate::system::process::is_root;

/// The unprivileged account browsers run as when the agent is root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrowserUser {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
}

impl BrowserUser {
    /// Whether this user may pass through a directory with `meta` (by its
    /// mode bits; ACLs are not read).
    fn can_traverse(&self, meta: &std::fs::Metadata) -> bool {
        use std::os::unix::fs::MetadataExt as _;
        let mode = meta.mode();
        (meta.uid() == self.uid && mode & 0o100 != 0)
            || (meta.gid() == self.gid && mode & 0o010 != 0)
            || mode & 0o001 != 0
    }

    /// The account `name`, from the system's user database.
    pub fn lookup(name: &str) -> Option<Self> {
        let c_name = CString::new(name).ok()?;
        // SAFETY: getpwnam returns a pointer to static storage or null; we copy
        // out the two integers at once. The agent resolves users only at start.
        let entry = unsafe { libc::getpwnam(c_name.as_ptr()) };
        if entry.is_null() {
            return None;
        }
        // SAFETY: non-null entry from getpwnam.
        let (uid, gid) = unsafe { ((*entry).pw_uid, (*entry).pw_gid) };
        (uid != 0).then(|| Self {
            name: name.to_owned(),
            uid,
            gid,
        })
    }
}

/// Where a browser sees its own directories: inside the sandbox always at
/// [`SANDBOX_INSTANCE_DIR`] (no host path shows, and profiles do not depend on
/// where a node keeps them), else at their host paths.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrowserPaths {
    pub profile: PathBuf,
    pub home: PathBuf,
    pub downloads: PathBuf,
    /// Read-only: the unpacked extensions.
    pub extensions: PathBuf,
    /// Read-only: files WebDriver clients uploaded.
    pub uploads: PathBuf,
}

/// Where the instance's own directories appear inside the sandbox.
pub const SANDBOX_INSTANCE_DIR: &str = "/instance";

/// Why browsers could not reach their directories under the data directory:
/// the agent does not start. The message names the path and what to change.
#[derive(Debug, thiserror::Error)]
pub enum IsolationError {
    #[error(transparent)]
    Unconfined(#[from] Unconfined),
    #[error("cannot create {}: {source}", .dir.display())]
    Create {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot read {}: {source}", .path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot let the browser user through {}: {source}", .path.display())]
    LetThrough {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A directory above the data directory keeps the browser user out.
    #[error(
        "the browser user {user} cannot pass through {path} (mode {mode:04o}), so browsers could not reach their profiles under {ours}: choose a data_dir outside {path}, or let the user through (`chmod o+x {path}`, or `chgrp {user} {path} && chmod g+x {path}`)",
        path = .path.display(),
        ours = .ours.display()
    )]
    Blocked {
        user: String,
        path: PathBuf,
        mode: u32,
        ours: PathBuf,
    },
}

/// Why a probe of what the kernel allows failed (the node then runs with
/// less isolation, and its warnings say why).
#[derive(Debug, thiserror::Error)]
enum ProbeError {
    /// The probe's scratch directory could not be made or handed over.
    #[error("{0}")]
    Setup(#[source] std::io::Error),
    #[error("{0}")]
    Spawn(#[source] std::io::Error),
    /// The probe ran and failed; what it wrote to stderr.
    #[error("{stderr}")]
    Failed {
        status: std::process::ExitStatus,
        stderr: String,
    },
}

/// The confinement every browser of this node gets.
#[derive(Debug, Clone)]
pub struct Isolation {
    /// bubblewrap, when installed and enabled (`agent.sandbox`).
    bwrap: Option<PathBuf>,
    /// Set when the agent is root: browsers drop to this account.
    pub user: Option<BrowserUser>,
    /// Whether Chromium's own sandbox can run (else `--no-sandbox`).
    pub chromium_sandbox: bool,
    /// Whether each browser gets its own network namespace behind the egress proxy.
    pub own_network: bool,
    /// The generated `/etc/passwd` and `/etc/group` for the sandbox.
    etc_dir: PathBuf,
    /// Why the node runs with less isolation than it could.
    pub warnings: Vec<String>,
    /// The layers it cannot give browsers, and why (also among `warnings`).
    pub gaps: Vec<Gap>,
}

/// A layer of confinement a node cannot give its browsers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layer {
    /// bubblewrap's sandbox: browsers would see the whole filesystem.
    Filesystem,
    /// A network namespace behind the egress proxy: pages would reach the
    /// node's services and private networks.
    Network,
    /// cgroup limits: instances would run without memory, CPU and pids caps.
    Limits,
    /// Chromium's own sandbox (its renderers in namespaces of their own,
    /// with seccomp-bpf): without it, `--no-sandbox`.
    BrowserSandbox,
}

impl Layer {
    /// How an operator gives browsers this layer.
    pub fn remedy(self) -> &'static str {
        match self {
            Layer::Filesystem => {
                "install bubblewrap (scripts/install-deps does) and keep agent.sandbox on; in a container, the agent needs CAP_SYS_ADMIN and an AppArmor profile that allows mount (it then binds an unmasked view of /proc, without which the kernel refuses bubblewrap a /proc of the browser's own), or an unmasked /proc (Podman: --security-opt unmask=/proc/*)"
            }
            Layer::Network => {
                "run the agent as root (in a container: with CAP_SYS_ADMIN and CAP_NET_ADMIN) and keep agent.egress.enabled on"
            }
            Layer::BrowserSandbox => {
                "let unprivileged users create user namespaces (kernel.unprivileged_userns_clone = 1; on Ubuntu 24.04, kernel.apparmor_restrict_unprivileged_userns = 0 or an AppArmor profile for Chromium); in a container, grant CAP_SYS_CHROOT (the runtime's seccomp profile allows chroot only then)"
            }
            Layer::Limits => {
                "run the agent as root where its cgroup is writable: on a host, as root; in a container, give it a cgroup namespace of its own (Podman: --cgroupns=private; Kubernetes gives one on cgroup v2 nodes), where the agent remounts its hierarchies read-write (CAP_SYS_ADMIN, and an AppArmor profile that allows mount)"
            }
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Layer::Filesystem => "filesystem sandbox",
            Layer::Network => "network namespace",
            Layer::Limits => "resource limits",
            Layer::BrowserSandbox => "Chromium sandbox",
        }
    }
}

/// One missing layer, and why it is missing on this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gap {
    pub layer: Layer,
    pub why: String,
}

/// The node cannot confine browsers and its operator did not allow it to run
/// them unconfined: the agent does not start.
#[derive(Debug, thiserror::Error)]
#[error("{}", unconfined_message(.gaps))]
pub struct Unconfined {
    pub gaps: Vec<Gap>,
}

fn unconfined_message(gaps: &[Gap]) -> String {
    let mut message = String::from(
        "this node cannot confine browsers, so it starts none (to run them unconfined anyway, degraded, set agent.allow_unconfined_browsers = true, or FLOTILLA_AGENT__ALLOW_UNCONFINED_BROWSERS=true):",
    );
    for gap in gaps {
        message.push_str(&format!(
            "\n  - no {}: {}\n    to provide it: {}",
            gap.layer.name(),
            gap.why,
            gap.layer.remedy()
        ));
    }
    message
}

/// Host paths bound read-only into the sandbox when they exist: what
/// libraries, fonts, certificates, locale and time zone lookups need.
const READ_ONLY_PATHS: &[&str] = &[
    "/usr",
    "/etc/fonts",
    "/etc/ssl",
    "/etc/ca-certificates",
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/localtime",
    "/etc/alternatives",
    "/etc/chromium",
    "/etc/chromium.d",
    "/var/cache/fontconfig",
];

/// Files of the sandbox's `/proc` that describe the host rather than the
/// browser: bound over with an empty file where the kernel has them. Beside
/// the boot command line and build configuration, what container runtimes
/// mask (timers, scheduler state and keys of the whole machine).
const HIDDEN_PROC_FILES: &[&str] = &[
    "/proc/cmdline",
    "/proc/config.gz",
    "/proc/kcore",
    "/proc/keys",
    "/proc/key-users",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
];

/// Folders of the sandbox's `/proc` about the machine's hardware: an empty
/// tmpfs over each where the kernel has it (as container runtimes do).
const HIDDEN_PROC_DIRS: &[&str] = &["/proc/acpi", "/proc/asound", "/proc/scsi"];

/// Top-level names that are symbolic links into `/usr` on merged-/usr systems.
const USR_LINKS: &[&str] = &["bin", "sbin", "lib", "lib64", "lib32", "libx32"];

/// The confinement a node's configuration asks for (`agent.browser_user`,
/// `agent.sandbox`, `agent.egress.enabled`).
#[derive(Debug, Clone, Copy)]
pub struct Wanted<'a> {
    pub browser_user: &'a str,
    pub sandbox: bool,
    pub own_network: bool,
}

/// Where the agent binds its unmasked view of `/proc` in a container: a
/// root-only folder outside the data directory (which is tightened, walked
/// and backed up) and outside every sandbox.
const PROC_VIEW: &str = "/run/flotilla-agent/proc-view";

/// Binds `/proc` alone (not what is mounted over parts of it) at `view`.
///
/// A container runtime masks parts of the container's `/proc` (mounts over
/// `/proc/kcore`, a read-only `/proc/sys`…), and the kernel then refuses a
/// new user namespace a `/proc` of its own (bubblewrap's, for the browser's
/// pid namespace) unless some `/proc` of the mount namespace is fully
/// visible. This view is one; it is the agent's alone (under a root-only
/// folder, outside the data directory and every sandbox), and the
/// container's `/proc` keeps its masks (the sandbox's `/proc` gets them
/// too: [`HIDDEN_PROC_FILES`], [`HIDDEN_PROC_DIRS`]).
fn unmasked_proc_view(view: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    let already = std::fs::read_to_string("/proc/self/mountinfo")?
        .lines()
        .any(|line| line.split_whitespace().nth(4) == Some(&*view.to_string_lossy()));
    if already {
        return Ok(());
    }
    std::fs::DirBuilder::new()
        .mode(0o700)
        .recursive(true)
        .create(view)?;
    if let Some(parent) = view.parent() {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(parent, std::fs::Permissions::from_mode(0o700))?;
    }
    let source = CString::new("/proc")?;
    let target = CString::new(view.as_os_str().as_encoded_bytes())?;
    // SAFETY: valid C strings; a bind mount takes no type or data.
    let bound = unsafe {
        libc::mount(
            source.as_ptr(),
            target.as_ptr(),
            std::ptr::null(),
            libc::MS_BIND,
            std::ptr::null(),
        )
    };
    if bound != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // No set-uid programs, devices or executables through it (as bubblewrap
    // mounts /proc).
    crate::system::remount(
        &target,
        libc::MS_REMOUNT | libc::MS_BIND | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
    )?;
    tracing::info!(
        view = %view.display(),
        "/proc is masked here (a container): bound an unmasked view of it, so that bubblewrap may mount the browsers' own"
    );
    Ok(())
}

/// Why browsers would share the node's network.
#[derive(Debug, thiserror::Error)]
enum NetworkGap {
    #[error(
        "agent.egress.enabled is off: pages can reach this node's services and private networks"
    )]
    EgressOff,
    #[error(
        "cannot create network namespaces (the agent needs root): pages can reach this node's services and private networks"
    )]
    NoNamespaces,
}

/// Why browsers would see the host's filesystem.
#[derive(Debug, thiserror::Error)]
enum SandboxGap {
    #[error("agent.sandbox is off: browsers see the host's whole filesystem")]
    Off,
    #[error(
        "bubblewrap (bwrap) is not installed: browsers see the host's whole filesystem (scripts/install-deps installs it)"
    )]
    NotInstalled,
    #[error(
        "bubblewrap ({}) cannot start a sandbox here ({reason}): browsers see the host's whole filesystem",
        .bwrap.display()
    )]
    CannotStart { bwrap: PathBuf, reason: ProbeError },
}

/// Whether browsers get network namespaces of their own; else why not.
fn own_network(wanted: &Wanted<'_>) -> Result<(), NetworkGap> {
    if !wanted.own_network {
        Err(NetworkGap::EgressOff)
    } else if crate::confine::netns::supported() {
        Ok(())
    } else {
        Err(NetworkGap::NoNamespaces)
    }
}

impl Isolation {
    /// Decides the node's confinement: finds bubblewrap and the browser user,
    /// and probes what the kernel allows. `state_dir` holds the generated
    /// `/etc` files and the probe's scratch directory; the browser user is
    /// let through it and its parent (the process's data directory). Fails
    /// when a directory above those keeps the browser user out.
    pub fn detect(wanted: &Wanted<'_>, state_dir: &Path) -> Result<Self, IsolationError> {
        let mut warnings = Vec::new();
        let user = if is_root() {
            match BrowserUser::lookup(wanted.browser_user) {
                Some(user) => Some(user),
                None => {
                    warnings.push(format!(
                        "the browser user {:?} does not exist (scripts/install-deps creates it): browsers run as nobody",
                        wanted.browser_user
                    ));
                    BrowserUser::lookup("nobody")
                }
            }
        } else {
            None
        };
        let ours = state_dir.parent().unwrap_or(state_dir);
        open_path_to(user.as_ref(), state_dir, ours)?;
        let etc_dir = state_dir.join("sandbox-etc");
        if let Err(error) = write_etc(&etc_dir, user.as_ref()) {
            warnings.push(format!(
                "cannot write the sandbox's /etc files in {}: {error}",
                etc_dir.display()
            ));
        }
        let mut isolation = Self {
            bwrap: None,
            user,
            chromium_sandbox: false,
            own_network: false,
            etc_dir,
            warnings,
            gaps: Vec::new(),
        };
        match own_network(wanted) {
            Ok(()) => isolation.own_network = true,
            Err(why) => isolation.lacks(Layer::Network, why),
        }
        match isolation.sandbox(wanted, state_dir) {
            Ok(bwrap) => isolation.bwrap = Some(bwrap),
            Err(why) => isolation.lacks(Layer::Filesystem, why),
        }
        // Chromium's sandbox puts renderers in user, pid and network namespaces of
        // their own, nested in ours.
        let unshare = PathBuf::from("/usr/bin/unshare");
        match isolation.probe(state_dir, Some(&unshare)) {
            Ok(()) => isolation.chromium_sandbox = true,
            Err(reason) => isolation.lacks(
                Layer::BrowserSandbox,
                format!(
                    "the browser user cannot create a user namespace and chroot in it ({reason}): Chromium would run with --no-sandbox, its renderers confined only by the node's sandbox"
                ),
            ),
        }
        Ok(isolation)
    }

    /// Records a layer this node cannot give its browsers (a warning too).
    pub fn lacks(&mut self, layer: Layer, why: impl std::fmt::Display) {
        let why = why.to_string();
        self.warnings.push(why.clone());
        self.gaps.push(Gap { layer, why });
    }

    /// bubblewrap, found and able to start a sandbox here; else why not.
    fn sandbox(&self, wanted: &Wanted<'_>, state_dir: &Path) -> Result<PathBuf, SandboxGap> {
        if !wanted.sandbox {
            return Err(SandboxGap::Off);
        }
        let Some(bwrap) = find_in_path("bwrap") else {
            return Err(SandboxGap::NotInstalled);
        };
        let probing = Self {
            bwrap: Some(bwrap.clone()),
            ..self.clone()
        };
        let mut probed = probing.probe(state_dir, None);
        if let Err(ProbeError::Failed { stderr, .. }) = &probed
            && stderr.contains("mount proc")
            && is_root()
        {
            match unmasked_proc_view(Path::new(PROC_VIEW)) {
                Ok(()) => probed = probing.probe(state_dir, None),
                Err(error) => tracing::warn!(%error, "cannot bind an unmasked view of /proc"),
            }
        }
        match probed {
            Ok(()) => Ok(bwrap),
            Err(reason) => Err(SandboxGap::CannotStart { bwrap, reason }),
        }
    }

    /// No confinement at all (the sim runtime).
    pub fn none() -> Self {
        Self {
            bwrap: None,
            user: None,
            chromium_sandbox: true,
            own_network: false,
            etc_dir: PathBuf::new(),
            warnings: Vec::new(),
            gaps: Vec::new(),
        }
    }

    pub fn filesystem_isolated(&self) -> bool {
        self.bwrap.is_some()
    }

    /// The instance's directories as its browser sees them.
    pub fn browser_paths(&self, dirs: &InstanceDirs) -> BrowserPaths {
        if self.bwrap.is_some() {
            let inside = Path::new(SANDBOX_INSTANCE_DIR);
            BrowserPaths {
                profile: inside.join("profile"),
                home: inside.join("home"),
                downloads: inside.join("downloads"),
                extensions: inside.join("extensions"),
                uploads: inside.join("uploads"),
            }
        } else {
            BrowserPaths {
                profile: dirs.profile(),
                home: dirs.home(),
                downloads: dirs.downloads(),
                extensions: dirs.extensions(),
                uploads: dirs.uploads(),
            }
        }
    }

    /// Runs a tiny confined command to learn what works: bubblewrap itself
    /// (`nested` = None), or `unshare` of the namespaces Chromium's sandbox needs.
    fn probe(&self, state_dir: &Path, nested: Option<&Path>) -> Result<(), ProbeError> {
        let dirs = InstanceDirs::new(state_dir.join("sandbox-probe"));
        let _ = std::fs::remove_dir_all(&dirs.root);
        dirs.create().map_err(ProbeError::Setup)?;
        self.hand_over(&dirs).map_err(ProbeError::Setup)?;
        let (program, args): (PathBuf, Vec<String>) = match nested {
            Some(unshare) => (
                unshare.to_path_buf(),
                // Chromium's sandbox also chroots inside its user namespace
                // (a container's seccomp profile refuses that without
                // CAP_SYS_CHROOT, and the browser then aborts at start).
                [
                    "--user",
                    "--map-root-user",
                    "--pid",
                    "--net",
                    "--fork",
                    "/usr/sbin/chroot",
                    "/",
                    "/bin/true",
                ]
                .map(str::to_owned)
                .to_vec(),
            ),
            None => (PathBuf::from("/bin/true"), Vec::new()),
        };
        let mut command = self.command(&dirs, &program, "probe");
        command
            .args(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        let mut command = command.into_std();
        command.stderr(Stdio::piped());
        if let Some(user) = self.user.clone() {
            // SAFETY: drop_privileges makes only async-signal-safe calls.
            unsafe {
                std::os::unix::process::CommandExt::pre_exec(&mut command, move || {
                    drop_privileges(&user)
                });
            }
        }
        let outcome = command.output();
        let _ = std::fs::remove_dir_all(&dirs.root);
        match outcome {
            Ok(output) if output.status.success() => Ok(()),
            Ok(output) => Err(ProbeError::Failed {
                status: output.status,
                stderr: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
            }),
            Err(error) => Err(ProbeError::Spawn(error)),
        }
    }

    /// Gives the instance's writable directories to the browser user (the
    /// agent may have unpacked a snapshot into them as root). Symbolic links
    /// are changed themselves, never followed.
    pub fn hand_over(&self, dirs: &InstanceDirs) -> std::io::Result<()> {
        let Some(user) = &self.user else {
            return Ok(());
        };
        self.let_browser_traverse(&dirs.root)?;
        for dir in dirs.writable() {
            chown_tree(&dir, user.uid, user.gid)?;
        }
        // Uploads: the agent's folder (the browser passes through it to each
        // upload, handed over with `give_to_browser`).
        if dirs.uploads().is_dir() {
            let_through(user, &dirs.uploads())?;
        }
        // Read-only to the browser inside the sandbox; the browser's alone
        // outside it, like everything it may read.
        chown_tree(&dirs.extensions(), user.uid, user.gid)
    }

    /// Hands `path` (a file or folder the agent wrote for the browser to
    /// read) to the browser user; nothing to do when browsers run as the
    /// agent's own user.
    pub fn give_to_browser(&self, path: &Path) -> std::io::Result<()> {
        match &self.user {
            Some(user) => chown_tree(path, user.uid, user.gid),
            None => Ok(()),
        }
    }

    /// Lets the browser user pass through `dir` (the agent's) to its own
    /// directories, and nothing more (see [`let_through`]).
    pub fn let_browser_traverse(&self, dir: &Path) -> std::io::Result<()> {
        match &self.user {
            Some(user) => let_through(user, dir),
            None => Ok(()),
        }
    }

    /// The command that starts `program` confined for the instance in `dirs`;
    /// the caller adds the program's arguments (with paths as
    /// [`Isolation::browser_paths`] says), stdio and pre-exec steps.
    pub fn command(&self, dirs: &InstanceDirs, program: &Path, hostname: &str) -> Command {
        self.command_with(dirs, program, hostname, &[])
    }

    /// [`Isolation::command`] with `extra` options for bubblewrap
    /// (`--die-with-parent` for a program that must end with its handle).
    pub fn command_with(
        &self,
        dirs: &InstanceDirs,
        program: &Path,
        hostname: &str,
        extra: &[&str],
    ) -> Command {
        self.command_with_files(dirs, program, (hostname, extra), &[])
    }

    /// [`Isolation::command_with`], with `files` (host file, path inside)
    /// bound read-only into the sandbox: what the agent writes for the
    /// browser to read and never change (Firefox's enterprise policies).
    /// Without a sandbox the files are not placed.
    pub fn command_with_files(
        &self,
        dirs: &InstanceDirs,
        program: &Path,
        (hostname, extra): (&str, &[&str]),
        files: &[(PathBuf, &str)],
    ) -> Command {
        let paths = self.browser_paths(dirs);
        let mut command = match &self.bwrap {
            Some(bwrap) => {
                let mut command = Command::new(bwrap);
                command.args(extra);
                command.args(self.bwrap_args(dirs, program, hostname, files));
                command.arg("--").arg(program);
                command
            }
            None => Command::new(program),
        };
        command
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("HOME", &paths.home)
            .env("XDG_CONFIG_HOME", paths.home.join(".config"))
            .env("XDG_CACHE_HOME", paths.home.join(".cache"))
            .env("TMPDIR", "/tmp")
            .env("LANG", "C.UTF-8")
            // bubblewrap starts in the host's view of the directory, then moves.
            .current_dir(dirs.home());
        command
    }

    /// The command that runs a helper program on input the browser made
    /// (ffmpeg encoding its frames): as the browser user when the agent is
    /// root, and with bubblewrap in a sandbox with no network, nothing
    /// writable but a private `/tmp`, none of the node's files beyond the
    /// system's read-only ones, and a fixed environment. It works on stdin
    /// and stdout only.
    pub fn tool_command(&self, program: &Path) -> Command {
        let mut command = match &self.bwrap {
            Some(bwrap) => {
                let mut args: Vec<String> = [
                    "--unshare-all",
                    "--die-with-parent",
                    "--new-session",
                    "--hostname",
                    "tool",
                ]
                .iter()
                .map(|arg| (*arg).to_owned())
                .collect();
                system_binds(&mut args);
                args.extend(
                    ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
                        .iter()
                        .map(|arg| (*arg).to_owned()),
                );
                args.extend(["--remount-ro".to_owned(), "/".to_owned()]);
                let mut command = Command::new(bwrap);
                command.args(args).arg("--").arg(program);
                command
            }
            None => Command::new(program),
        };
        command
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("LANG", "C.UTF-8")
            .current_dir("/");
        if let Some(user) = self.user.clone() {
            // SAFETY: drop_privileges makes only async-signal-safe calls.
            unsafe {
                command.pre_exec(move || drop_privileges(&user));
            }
        }
        command
    }

    fn bwrap_args(
        &self,
        dirs: &InstanceDirs,
        program: &Path,
        hostname: &str,
        files: &[(PathBuf, &str)],
    ) -> Vec<String> {
        let mut args: Vec<String> = Vec::new();
        args.extend(
            [
                "--unshare-user",
                "--unshare-pid",
                "--unshare-ipc",
                "--unshare-uts",
                "--unshare-cgroup-try",
                "--hostname",
                hostname,
            ]
            .iter()
            .map(|arg| (*arg).to_owned()),
        );
        system_binds(&mut args);
        let mut push = |items: &[&str]| args.extend(items.iter().map(|s| (*s).to_owned()));
        // A browser installed outside /usr brings its own directory.
        if let Some(dir) = program.parent()
            && !dir.starts_with("/usr")
            && dir != Path::new("/")
        {
            let dir = dir.to_string_lossy().into_owned();
            push(&["--ro-bind", &dir, &dir]);
        }
        for name in ["passwd", "group"] {
            let generated = self.etc_dir.join(name);
            if generated.is_file() {
                let generated = generated.to_string_lossy().into_owned();
                push(&["--ro-bind", &generated, &format!("/etc/{name}")]);
            }
        }
        push(&[
            "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--tmpfs", "/dev/shm",
        ]);
        // What the kernel tells about the host (its boot command line, its
        // build configuration) reads as empty.
        let empty = self.etc_dir.join("empty").to_string_lossy().into_owned();
        for host_fact in HIDDEN_PROC_FILES
            .iter()
            .filter(|path| Path::new(path).exists())
        {
            push(&["--ro-bind-try", &empty, host_fact]);
        }
        for host_facts in HIDDEN_PROC_DIRS
            .iter()
            .filter(|path| Path::new(path).is_dir())
        {
            push(&["--tmpfs", host_facts]);
        }
        let inside = self.browser_paths(dirs);
        for (host, inside) in
            dirs.writable()
                .iter()
                .zip([&inside.profile, &inside.home, &inside.downloads])
        {
            let host = host.to_string_lossy().into_owned();
            let inside = inside.to_string_lossy().into_owned();
            push(&["--bind", &host, &inside]);
        }
        let extensions = dirs.extensions().to_string_lossy().into_owned();
        let inside_extensions = inside.extensions.to_string_lossy().into_owned();
        push(&["--ro-bind-try", &extensions, &inside_extensions]);
        let uploads = dirs.uploads().to_string_lossy().into_owned();
        let inside_uploads = inside.uploads.to_string_lossy().into_owned();
        push(&["--ro-bind-try", &uploads, &inside_uploads]);
        for (host, inside) in files {
            push(&["--ro-bind", &host.to_string_lossy(), inside]);
        }
        push(&["--remount-ro", "/"]);
        let home = inside.home.to_string_lossy().into_owned();
        push(&["--chdir", &home]);
        args
    }
}

/// Adds the read-only binds of what programs need from the host (libraries,
/// fonts, certificates, locale, time zone) and the merged-/usr links.
fn system_binds(args: &mut Vec<String>) {
    let mut push = |items: &[&str]| args.extend(items.iter().map(|s| (*s).to_owned()));
    for path in READ_ONLY_PATHS {
        push(&["--ro-bind-try", path, path]);
    }
    for name in USR_LINKS {
        let host = Path::new("/").join(name);
        match std::fs::read_link(&host) {
            Ok(target) => {
                let target = target.to_string_lossy().into_owned();
                let link = host.to_string_lossy().into_owned();
                push(&["--symlink", &target, &link]);
            }
            Err(_) if host.is_dir() => {
                let path = host.to_string_lossy().into_owned();
                push(&["--ro-bind", &path, &path]);
            }
            Err(_) => {}
        }
    }
}

/// Lets `user` pass through `dir`, and nothing more: group the user's, mode
/// 0710 (no listing, no reading).
fn let_through(user: &BrowserUser, dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    std::os::unix::fs::chown(dir, None, Some(user.gid))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o710))
}

/// Makes every directory from `/` down to `dir` passable for the browser
/// user: those at or below `ours` (the process's data directory, created if
/// missing) are opened with [`let_through`]; one above it that the user
/// cannot pass is an error naming it and what to change. Nothing to do when
/// browsers run as the agent's own user.
fn open_path_to(user: Option<&BrowserUser>, dir: &Path, ours: &Path) -> Result<(), IsolationError> {
    let Some(user) = user else {
        return Ok(());
    };
    std::fs::create_dir_all(dir).map_err(|source| IsolationError::Create {
        dir: dir.to_owned(),
        source,
    })?;
    let mut path = PathBuf::new();
    for component in dir.components() {
        path.push(component);
        let meta = std::fs::metadata(&path).map_err(|source| IsolationError::Read {
            path: path.clone(),
            source,
        })?;
        // A sticky directory (/tmp) is shared by design: it is never changed.
        let shared = std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o1000 != 0;
        if path.starts_with(ours) && !shared {
            let_through(user, &path).map_err(|source| IsolationError::LetThrough {
                path: path.clone(),
                source,
            })?;
        } else if !user.can_traverse(&meta) {
            return Err(IsolationError::Blocked {
                user: user.name.clone(),
                path,
                mode: std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o7777,
                ours: ours.to_owned(),
            });
        }
    }
    Ok(())
}

/// Writes the sandbox's `/etc/passwd` and `/etc/group`: root, nobody, and the
/// browser user, nothing of the host's accounts.
fn write_etc(dir: &Path, user: Option<&BrowserUser>) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let (name, uid, gid) = match user {
        Some(user) => (user.name.clone(), user.uid, user.gid),
        // SAFETY: getuid/getgid cannot fail.
        None => ("browser".to_owned(), unsafe { libc::getuid() }, unsafe {
            libc::getgid()
        }),
    };
    let passwd = format!(
        "root:x:0:0:root:/nonexistent:/usr/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n{name}:x:{uid}:{gid}:browser:/nonexistent:/usr/sbin/nologin\n"
    );
    let group = format!("root:x:0:\nnogroup:x:65534:\n{name}:x:{gid}:\n");
    // Public facts the browser must read (who it is); nothing else is here.
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))?;
    for (name, text) in [
        ("passwd", passwd),
        ("group", group),
        ("empty", String::new()),
    ] {
        let path = dir.join(name);
        std::fs::write(&path, text)?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644))?;
    }
    Ok(())
}

fn find_in_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}

/// `chown -R` without following symbolic links.
fn chown_tree(path: &Path, uid: u32, gid: u32) -> std::io::Result<()> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(error) => return Err(error),
    };
    // A file with another name elsewhere (a hard link) could be one the
    // browser user must not own: left as it is.
    if !meta.is_dir() && std::os::unix::fs::MetadataExt::nlink(&meta) > 1 {
        return Ok(());
    }
    std::os::unix::fs::lchown(path, Some(uid), Some(gid))?;
    if meta.is_dir() {
        for entry in std::fs::read_dir(path)? {
            chown_tree(&entry?.path(), uid, gid)?;
        }
    }
    Ok(())
}

/// In a child between fork and exec: become the browser user for good (no
/// supplementary groups, no way back, no gaining privileges by exec).
/// Async-signal-safe: only system calls.
pub fn drop_privileges(user: &BrowserUser) -> std::io::Result<()> {
    // SAFETY: plain system calls on integers; the order (groups, gid, uid)
    // matters because setuid gives up the right to the others.
    unsafe {
        if libc::setgroups(0, std::ptr::null()) != 0
            || libc::setresgid(user.gid, user.gid, user.gid) != 0
            || libc::setresuid(user.uid, user.uid, user.uid) != 0
            || libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
        {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    /// A data directory in a sticky, shared folder (`FLOTILLA_DATA_DIR=/tmp`,
    /// or a test's temp dir whose parent is /tmp) leaves that folder as it
    /// is: it once became 0710 and group flotilla-browser, and nobody else
    /// could use /tmp.
    #[test]
    fn opening_the_way_to_browser_folders_never_changes_a_shared_sticky_folder() {
        let user = BrowserUser::lookup("flotilla-browser")
            .or_else(|| BrowserUser::lookup("nobody"))
            .expect("a browser user");
        let shared = tempfile::tempdir().expect("temp dir");
        std::fs::set_permissions(shared.path(), std::fs::Permissions::from_mode(0o1777))
            .expect("chmod");
        let state = shared.path().join("agent");
        open_path_to(Some(&user), &state, shared.path()).expect("opened");
        let mode =
            |path: &Path| std::fs::metadata(path).expect("stat").permissions().mode() & 0o7777;
        assert_eq!(
            mode(shared.path()),
            0o1777,
            "the shared folder is unchanged"
        );
        assert_eq!(mode(&state), 0o710, "the agent's own folder is let through");
    }
}
