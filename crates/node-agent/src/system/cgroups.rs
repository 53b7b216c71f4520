//! Resource limits of instances through cgroups, v2 or v1.
//!
//! Each instance gets its own cgroup under `<our cgroup>/flotilla/<node id>/`,
//! with a memory limit (`memory_gb`), a CPU quota (`cpu_cores` ×
//! `agent.cpu_quota_per_core` per 100 ms period) and a pids cap. The browser
//! joins it between fork and exec (see [`InstanceCgroup::attach_hook`]), so no
//! child is ever outside it. cgroup v2 is used when the unified hierarchy has the
//! memory, cpu and pids controllers for us; otherwise the v1 controllers; where
//! neither is writable, instances run without limits and the node reports
//! itself degraded.

use std::ffi::CString;
use std::io;
use std::path::{Path, PathBuf};

/// The limits of one instance.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    pub memory_bytes: u64,
    /// CPU time per 100 ms period, in microseconds.
    pub cpu_quota_us: u64,
    pub pids_max: u64,
    /// Runs only on CPU time nobody else wants (a warm-pool browser while it
    /// starts and waits: its refill after a take must not slow the instance
    /// that took the previous one). Cleared when an instance takes it.
    pub background: bool,
}

pub const CPU_PERIOD_US: u64 = 100_000;
/// `cpu.weight` (v2) and `cpu.shares` (v1): an instance's, and a
/// background browser's (the smallest each accepts).
const CPU_WEIGHT: (u64, u64) = (100, 1);
const CPU_SHARES: (u64, u64) = (1024, 2);

impl Limits {
    pub fn new(memory_gb: f64, cpu_cores: f64, pids_max: u64) -> Self {
        Self {
            memory_bytes: (memory_gb * 1024.0 * 1024.0 * 1024.0) as u64,
            cpu_quota_us: ((cpu_cores * CPU_PERIOD_US as f64) as u64).max(1000),
            pids_max,
            background: false,
        }
    }

    /// Of `(normal, background)`, the CPU weight these limits take.
    fn weight(&self, (normal, background): (u64, u64)) -> String {
        if self.background { background } else { normal }.to_string()
    }

    /// These limits, for a browser that runs only on idle CPU time.
    pub fn in_background(self) -> Self {
        Self {
            background: true,
            ..self
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    V1,
    V2,
}

/// Why no cgroup hierarchy is usable: instances then run without memory,
/// CPU and pids limits, and the node reports itself degraded.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    /// `/proc/self/mountinfo` or `/proc/self/cgroup`.
    #[error("cannot read {what}: {source}")]
    Read {
        what: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("no cgroup2 mount")]
    NoCgroup2Mount,
    #[error("no unified cgroup for this process")]
    NoUnifiedCgroup,
    /// Our cgroup's parent does not delegate a controller to us.
    #[error("controller {controller} is not available at {}", .parent.display())]
    ControllerUnavailable {
        controller: &'static str,
        parent: PathBuf,
    },
    #[error("no {controller} hierarchy mounted")]
    NoV1Hierarchy { controller: &'static str },
    #[error("cannot create {}: {source}", .path.display())]
    Create {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot enable controllers in {}: {source}", .path.display())]
    EnableControllers {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// Neither hierarchy: why not v2, and why not v1.
    #[error("cgroup v2: {v2}; cgroup v1: {v1}")]
    Neither {
        v2: Box<CgroupError>,
        v1: Box<CgroupError>,
    },
}

/// Where this agent creates instance cgroups.
#[derive(Debug, Clone)]
pub struct Cgroups {
    version: Version,
    /// v2: one base; v1: one per controller (memory, cpu, pids), same order.
    bases: Vec<PathBuf>,
}

const V1_CONTROLLERS: [&str; 3] = ["memory", "cpu", "pids"];

impl Cgroups {
    /// Finds a writable hierarchy; `Err` says why none is usable. `owner` names
    /// this agent's subtree and must be unique per agent on the machine (the
    /// agent uses its node id and data directory): the start-up sweep kills
    /// whatever it finds there.
    pub fn detect(owner: &str) -> Result<Self, CgroupError> {
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").map_err(|source| {
            CgroupError::Read {
                what: "mountinfo",
                source,
            }
        })?;
        let own =
            std::fs::read_to_string("/proc/self/cgroup").map_err(|source| CgroupError::Read {
                what: "/proc/self/cgroup",
                source,
            })?;
        let leaf = format!("flotilla/{}", sanitize(owner));
        match Self::detect_in(&mounts, &own, &leaf) {
            Err(_) if in_own_cgroup_namespace() && remount_writable(&mounts) > 0 => {
                tracing::info!(
                    "cgroup hierarchies were read-only in this cgroup namespace (a container's): made them writable"
                );
                let mounts = std::fs::read_to_string("/proc/self/mountinfo").map_err(|source| {
                    CgroupError::Read {
                        what: "mountinfo",
                        source,
                    }
                })?;
                Self::detect_in(&mounts, &own, &leaf)
            }
            found => found,
        }
    }

    /// v2, else v1, in the hierarchies `mounts` lists.
    fn detect_in(mounts: &str, own: &str, leaf: &str) -> Result<Self, CgroupError> {
        let v2_error = match Self::detect_v2(mounts, own, leaf) {
            Ok(found) => return Ok(found),
            Err(error) => error,
        };
        match Self::detect_v1(mounts, own, leaf) {
            Ok(found) => Ok(found),
            Err(v1_error) => Err(CgroupError::Neither {
                v2: Box::new(v2_error),
                v1: Box::new(v1_error),
            }),
        }
    }

    fn detect_v2(mounts: &str, own: &str, leaf: &str) -> Result<Self, CgroupError> {
        let mount = mounts
            .lines()
            .find_map(|line| {
                let (left, right) = line.split_once(" - ")?;
                right
                    .starts_with("cgroup2 ")
                    .then(|| left.split_whitespace().nth(4).map(PathBuf::from))?
            })
            .ok_or(CgroupError::NoCgroup2Mount)?;
        let own_path = own
            .lines()
            .find_map(|line| line.strip_prefix("0::"))
            .ok_or(CgroupError::NoUnifiedCgroup)?;
        let parent = mount.join(own_path.trim_start_matches('/'));
        let available =
            std::fs::read_to_string(parent.join("cgroup.controllers")).unwrap_or_default();
        for controller in ["memory", "cpu", "pids"] {
            if !available.split_whitespace().any(|c| c == controller) {
                return Err(CgroupError::ControllerUnavailable { controller, parent });
            }
        }
        // Controllers must be enabled at every level down to the instance cgroups.
        let base = parent.join(leaf);
        std::fs::create_dir_all(&base).map_err(|source| CgroupError::Create {
            path: base.clone(),
            source,
        })?;
        let enable = |level: &Path| {
            std::fs::write(level.join("cgroup.subtree_control"), "+memory +cpu +pids").map_err(
                |source| CgroupError::EnableControllers {
                    path: level.to_owned(),
                    source,
                },
            )
        };
        if let Err(error) = enable(&parent) {
            // The root of a container's cgroup namespace holds its processes,
            // and a cgroup with processes cannot give controllers to children:
            // the processes move to a leaf of their own first.
            if own_path.trim_start_matches('/').is_empty() && in_own_cgroup_namespace() {
                move_processes_to_leaf(&parent).map_err(|source| CgroupError::Create {
                    path: parent.join(AGENT_LEAF),
                    source,
                })?;
                enable(&parent)?;
            } else {
                return Err(error);
            }
        }
        let mut level = parent.clone();
        for part in Path::new(leaf).components() {
            level = level.join(part);
            if level != base {
                enable(&level)?;
            }
        }
        enable(&base)?;
        Ok(Self {
            version: Version::V2,
            bases: vec![base],
        })
    }

    fn detect_v1(mounts: &str, own: &str, leaf: &str) -> Result<Self, CgroupError> {
        let mut bases = Vec::new();
        for controller in V1_CONTROLLERS {
            let mount = mounts
                .lines()
                .find_map(|line| {
                    let (left, right) = line.split_once(" - ")?;
                    let mut right = right.split_whitespace();
                    if right.next()? != "cgroup" {
                        return None;
                    }
                    let options = right.nth(1)?;
                    options
                        .split(',')
                        .any(|o| o == controller)
                        .then(|| left.split_whitespace().nth(4).map(PathBuf::from))?
                })
                .ok_or(CgroupError::NoV1Hierarchy { controller })?;
            let own_path = own
                .lines()
                .find_map(|line| {
                    let mut parts = line.splitn(3, ':');
                    let _id = parts.next()?;
                    let controllers = parts.next()?;
                    let path = parts.next()?;
                    controllers
                        .split(',')
                        .any(|c| c == controller)
                        .then_some(path)
                })
                .unwrap_or("/");
            let base = mount.join(own_path.trim_start_matches('/')).join(leaf);
            std::fs::create_dir_all(&base).map_err(|source| CgroupError::Create {
                path: base.clone(),
                source,
            })?;
            bases.push(base);
        }
        Ok(Self {
            version: Version::V1,
            bases,
        })
    }

    /// Removes this agent's (empty) subtree at shutdown.
    pub fn remove_base(&self) {
        for base in &self.bases {
            let _ = std::fs::remove_dir(base);
        }
    }

    pub fn version(&self) -> Version {
        self.version
    }

    /// Creates the cgroup of one instance with its limits.
    pub fn create(&self, name: &str, limits: Limits) -> io::Result<InstanceCgroup> {
        let dirs: Vec<PathBuf> = self
            .bases
            .iter()
            .map(|base| base.join(sanitize(name)))
            .collect();
        for dir in &dirs {
            std::fs::create_dir_all(dir)?;
        }
        let cgroup = InstanceCgroup {
            version: self.version,
            dirs,
        };
        cgroup.apply(limits)?;
        Ok(cgroup)
    }

    /// Kills what is left in instance cgroups of a previous run and removes them.
    pub fn sweep(&self) -> usize {
        let mut removed = 0;
        for base in &self.bases {
            let Ok(entries) = std::fs::read_dir(base) else {
                continue;
            };
            for entry in entries.flatten().filter(|e| e.path().is_dir()) {
                let dir = entry.path();
                for pid in read_procs(&dir) {
                    // SAFETY: kill has no memory-safety preconditions.
                    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
                }
                for _ in 0..200 {
                    if std::fs::remove_dir(&dir).is_ok() {
                        removed += 1;
                        break;
                    }
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
            }
        }
        removed
    }
}

/// The leaf a container's processes move to when the agent delegates
/// controllers from its cgroup namespace's root (cgroup v2).
const AGENT_LEAF: &str = "flotilla-agent";

/// The inode of the initial cgroup namespace (the host's).
const INITIAL_CGROUP_NAMESPACE: u64 = 0xEFFF_FFFB;

/// Whether this process is in a cgroup namespace of its own (a container's):
/// its hierarchies then show only its own subtree, which the agent may take.
fn in_own_cgroup_namespace() -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self/ns/cgroup")
        .is_ok_and(|namespace| namespace.ino() != INITIAL_CGROUP_NAMESPACE)
}

/// Remounts read-write the cgroup hierarchies mounted read-only in this
/// mount namespace (a container runtime mounts them so); how many it did.
/// Only called in a cgroup namespace of our own, where they show only our
/// subtree: never the host's.
fn remount_writable(mounts: &str) -> usize {
    let mut remounted = 0;
    for (target, flags) in read_only_own_hierarchies(mounts) {
        let Ok(target) = CString::new(target) else {
            continue;
        };
        if super::remount(&target, flags).is_ok() {
            remounted += 1;
        }
    }
    remounted
}

/// The cgroup mounts of `mounts` (mountinfo) that are read-only and show the
/// namespace's own root, with the flags a read-write remount of each passes.
/// One that shows more (a bind of the host's `/sys/fs/cgroup`, whose root
/// reads `/..`) is left out.
fn read_only_own_hierarchies(mounts: &str) -> Vec<(&str, libc::c_ulong)> {
    let mut found = Vec::new();
    for line in mounts.lines() {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let kind = right.split_whitespace().next().unwrap_or_default();
        let mut fields = left.split_whitespace();
        let (Some(root), Some(target), Some(options)) =
            (fields.nth(3), fields.next(), fields.next())
        else {
            continue;
        };
        let options: Vec<&str> = options.split(',').collect();
        if !matches!(kind, "cgroup" | "cgroup2") || !options.contains(&"ro") || root != "/" {
            continue;
        }
        // The flags a mount keeps must be passed again (a remount that
        // would drop them is refused).
        let mut flags = libc::MS_REMOUNT | libc::MS_BIND;
        for (name, flag) in [
            ("nosuid", libc::MS_NOSUID),
            ("nodev", libc::MS_NODEV),
            ("noexec", libc::MS_NOEXEC),
            ("relatime", libc::MS_RELATIME),
        ] {
            if options.contains(&name) {
                flags |= flag;
            }
        }
        found.push((target, flags));
    }
    found
}

/// Moves every process of `cgroup` into its child [`AGENT_LEAF`].
fn move_processes_to_leaf(cgroup: &Path) -> io::Result<()> {
    let leaf = cgroup.join(AGENT_LEAF);
    std::fs::create_dir_all(&leaf)?;
    for pid in read_procs(cgroup) {
        match std::fs::write(leaf.join("cgroup.procs"), pid.to_string()) {
            // A process that exited meanwhile has nothing to move.
            Err(error) if error.raw_os_error() != Some(libc::ESRCH) => return Err(error),
            _ => {}
        }
    }
    Ok(())
}

fn sanitize(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// One instance's cgroup (one directory per v1 controller, or one v2 directory).
#[derive(Debug)]
pub struct InstanceCgroup {
    version: Version,
    dirs: Vec<PathBuf>,
}

impl InstanceCgroup {
    /// Sets (or changes, for a pooled browser taken by an instance) the limits.
    pub fn apply(&self, limits: Limits) -> io::Result<()> {
        match self.version {
            Version::V2 => {
                let dir = &self.dirs[0];
                std::fs::write(dir.join("memory.max"), limits.memory_bytes.to_string())?;
                // Without swap the limit is hard; keep the kernel from swapping instead of killing.
                let _ = std::fs::write(dir.join("memory.swap.max"), "0");
                std::fs::write(
                    dir.join("cpu.max"),
                    format!("{} {CPU_PERIOD_US}", limits.cpu_quota_us),
                )?;
                std::fs::write(dir.join("pids.max"), limits.pids_max.to_string())?;
                std::fs::write(dir.join("cpu.weight"), limits.weight(CPU_WEIGHT))?;
            }
            Version::V1 => {
                let [memory, cpu, pids] = [&self.dirs[0], &self.dirs[1], &self.dirs[2]];
                std::fs::write(
                    memory.join("memory.limit_in_bytes"),
                    limits.memory_bytes.to_string(),
                )?;
                let _ = std::fs::write(memory.join("memory.swappiness"), "0");
                std::fs::write(cpu.join("cpu.cfs_period_us"), CPU_PERIOD_US.to_string())?;
                std::fs::write(
                    cpu.join("cpu.cfs_quota_us"),
                    limits.cpu_quota_us.to_string(),
                )?;
                std::fs::write(pids.join("pids.max"), limits.pids_max.to_string())?;
                std::fs::write(cpu.join("cpu.shares"), limits.weight(CPU_SHARES))?;
            }
        }
        Ok(())
    }

    /// A function for `pre_exec`: moves the calling (child) process into this
    /// cgroup. It only uses `getpid`, `open`, `write` and `close` on buffers
    /// prepared beforehand, so it is safe between fork and exec.
    pub fn attach_hook(&self) -> impl FnMut() -> io::Result<()> + Send + Sync + 'static {
        let procs: Vec<CString> = self
            .dirs
            .iter()
            .map(|dir| {
                CString::new(
                    dir.join("cgroup.procs")
                        .into_os_string()
                        .into_encoded_bytes(),
                )
                .expect("no NUL in a path")
            })
            .collect();
        move || {
            // SAFETY: getpid has no preconditions.
            let pid = unsafe { libc::getpid() };
            let mut digits = [0u8; 20];
            let text = format_pid(pid as u32, &mut digits);
            for path in &procs {
                // SAFETY: `path` is a valid C string; the buffer outlives the calls.
                unsafe {
                    let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                    if fd < 0 {
                        return Err(io::Error::last_os_error());
                    }
                    let written = libc::write(fd, text.as_ptr().cast(), text.len());
                    libc::close(fd);
                    if written < 0 {
                        return Err(io::Error::last_os_error());
                    }
                }
            }
            Ok(())
        }
    }

    /// Pids of the processes in this cgroup (exited ones are no longer listed).
    pub fn procs(&self) -> Vec<u32> {
        read_procs(&self.dirs[0])
    }

    /// How many processes the kernel killed for exceeding the memory limit.
    pub fn oom_kills(&self) -> u64 {
        let (file, key) = match self.version {
            Version::V2 => (self.dirs[0].join("memory.events"), "oom_kill"),
            Version::V1 => (self.dirs[0].join("memory.oom_control"), "oom_kill"),
        };
        std::fs::read_to_string(file)
            .unwrap_or_default()
            .lines()
            .find_map(|line| line.strip_prefix(key)?.trim().parse().ok())
            .unwrap_or(0)
    }

    /// Removes the directories; only possible once no process is left in them.
    pub fn remove(&self) {
        for dir in &self.dirs {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

fn read_procs(dir: &Path) -> Vec<u32> {
    std::fs::read_to_string(dir.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// Writes `pid` in decimal into `buffer` without allocating.
fn format_pid(mut pid: u32, buffer: &mut [u8; 20]) -> &[u8] {
    let mut start = buffer.len();
    loop {
        start -= 1;
        buffer[start] = b'0' + (pid % 10) as u8;
        pid /= 10;
        if pid == 0 {
            break;
        }
    }
    &buffer[start..]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A container's read-only hierarchies of its own cgroup namespace are
    /// remounted; a read-only bind of the host's tree (root `/..`) and
    /// read-write mounts are not.
    #[test]
    fn only_read_only_mounts_of_the_namespaces_own_root_are_made_writable() {
        let mounts = "\
93 89 0:32 / /sys/fs/cgroup/memory ro,nosuid,nodev,noexec,relatime - cgroup cgroup rw,memory
94 89 0:33 /.. /host/cgroup/cpu ro,nosuid,nodev,noexec,relatime - cgroup cgroup rw,cpu
95 89 0:34 / /sys/fs/cgroup/pids rw,nosuid,nodev,noexec,relatime - cgroup cgroup rw,pids
96 89 0:35 / /sys/fs/cgroup/unified ro,nosuid,nodev,noexec,relatime - cgroup2 cgroup2 rw
97 89 0:36 / /proc ro,nosuid,nodev,noexec,relatime - proc proc rw
";
        let found = read_only_own_hierarchies(mounts);
        let targets: Vec<&str> = found.iter().map(|(target, _)| *target).collect();
        assert_eq!(targets, ["/sys/fs/cgroup/memory", "/sys/fs/cgroup/unified"]);
        let flags = found[0].1;
        assert_eq!(
            flags,
            libc::MS_REMOUNT
                | libc::MS_BIND
                | libc::MS_NOSUID
                | libc::MS_NODEV
                | libc::MS_NOEXEC
                | libc::MS_RELATIME
        );
    }

    #[test]
    fn formats_pids_without_allocating() {
        let mut buffer = [0u8; 20];
        assert_eq!(format_pid(0, &mut buffer), b"0");
        assert_eq!(format_pid(4_294_967_295, &mut buffer), b"4294967295");
        assert_eq!(format_pid(31337, &mut buffer), b"31337");
    }

    #[test]
    fn limits_from_config() {
        let limits = Limits::new(0.5, 1.5, 512);
        assert_eq!(limits.memory_bytes, 512 * 1024 * 1024);
        assert_eq!(limits.cpu_quota_us, 150_000);
    }

    #[test]
    fn detects_a_hierarchy_and_limits_a_process() {
        // On a machine without a writable hierarchy there is nothing to test;
        // `detect` says why, and the agent reports itself degraded.
        let Ok(cgroups) = Cgroups::detect("unit-test") else {
            return;
        };
        let cgroup = cgroups.create("probe", Limits::new(0.25, 1.0, 64)).unwrap();
        let hook = cgroup.attach_hook();
        let mut command = std::process::Command::new("sleep");
        command.arg("0.2");
        // SAFETY: the hook only makes async-signal-safe calls.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut command, hook);
        }
        let mut child = command.spawn().unwrap();
        let procs = std::fs::read_to_string(cgroup.dirs[0].join("cgroup.procs")).unwrap();
        assert!(
            procs.lines().any(|l| l == child.id().to_string()),
            "{procs}"
        );
        child.wait().unwrap();
        cgroup.remove();
        assert!(!cgroup.dirs[0].exists());
    }
}
