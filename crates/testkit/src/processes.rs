//! The processes a test started, found through `/proc`: by command line, as
//! a tree, and the browsers under an instance directory.

use std::path::Path;

/// Pids of processes whose command line mentions `needle` (e.g. an instance directory).
pub fn processes_mentioning(needle: &str) -> Vec<u32> {
    let mut pids = Vec::new();
    for pid in flotilla_node_agent::system::monitor::pids() {
        if pid == std::process::id() {
            continue;
        }
        if let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) {
            let cmdline = String::from_utf8_lossy(&cmdline);
            // Zombies have an empty command line and are not running.
            if cmdline.contains(needle) {
                pids.push(pid);
            }
        }
    }
    pids
}

/// `roots` and all their living descendants.
pub fn process_tree(roots: &[u32]) -> Vec<u32> {
    flotilla_node_agent::system::monitor::ProcTable::scan().live_descendants(roots)
}

/// Waits (10 s at most) until no process of the browser(s) under `dir` is
/// left (see [`browser_processes`]).
pub async fn wait_browser_processes_gone(dir: &Path) {
    crate::wait_until(
        std::time::Duration::from_secs(10),
        &format!("the browser processes of {} to be gone", dir.display()),
        || async {
            let left = browser_processes(dir);
            if left.is_empty() {
                Ok(Some(()))
            } else {
                Err(format!("{left:?}"))
            }
        },
    )
    .await
    .unwrap();
}

/// Every process of the browser(s) under `dir` (an instance directory, or the
/// agent's instances root): those whose command line mentions it (the
/// bubblewrap confining a browser names its directories; the browser itself
/// sees them at `/instance/…`), their descendants, and anything left in an
/// instance cgroup named after `dir`.
pub fn browser_processes(dir: &Path) -> Vec<u32> {
    let needle = dir.display().to_string();
    let mut roots = processes_mentioning(&needle);
    let table = flotilla_node_agent::system::monitor::ProcTable::scan();
    if let Some(name) = dir.file_name().and_then(|n| n.to_str()) {
        let component = format!("/{name}");
        for pid in table.live_pids() {
            let in_cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
                .map(|groups| groups.lines().any(|line| line.ends_with(&component)))
                .unwrap_or(false);
            if in_cgroup && !roots.contains(&pid) && pid != std::process::id() {
                roots.push(pid);
            }
        }
    }
    table.live_descendants(&roots)
}

/// The directories of the agent's pooled (warm) browsers under its
/// `instances` root (`pool-…`), sorted. A taken pooled browser keeps its
/// directory when a plain create takes it, and loses it (renamed to the
/// instance's) when it takes saved state (a revive, a profile).
pub fn pooled_browser_dirs(instances: &Path) -> Vec<std::path::PathBuf> {
    let mut dirs: Vec<std::path::PathBuf> = std::fs::read_dir(instances)
        .map(|entries| entries.flatten().map(|entry| entry.path()).collect())
        .unwrap_or_default();
    dirs.retain(|path| {
        path.file_name()
            .is_some_and(|name| name.to_string_lossy().starts_with("pool-"))
    });
    dirs.sort();
    dirs
}

/// The browser's main process under `dir`: Chromium without `--type=`, or
/// Firefox's (`firefox-esr` without `-contentproc`).
pub fn browser_main_pid(dir: &Path) -> Option<u32> {
    browser_processes(dir).into_iter().find(|pid| {
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline);
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        let chromium = cmdline.contains("--user-data-dir=") && !cmdline.contains("--type=");
        let firefox = comm.trim() == "firefox-esr" && !cmdline.contains("-contentproc");
        chromium || firefox
    })
}

/// The CPU weight of process `pid`'s cgroup, as `(weight, normal)`:
/// `cpu.weight` of cgroup v2 (normal 100) or `cpu.shares` of v1 (normal
/// 1024); `None` when it runs in no cgroup with a CPU controller.
pub fn cpu_weight_of(pid: u32) -> Option<(u64, u64)> {
    let groups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    for line in groups.lines() {
        let mut fields = line.splitn(3, ':');
        let (_, controllers, path) = (fields.next()?, fields.next()?, fields.next()?);
        let read = |file: String| -> Option<u64> {
            std::fs::read_to_string(file).ok()?.trim().parse().ok()
        };
        if controllers.is_empty() {
            for root in ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"] {
                if let Some(weight) = read(format!("{root}{path}/cpu.weight")) {
                    return Some((weight, 100));
                }
            }
        } else if controllers.split(',').any(|c| c == "cpu") {
            let mount = format!("/sys/fs/cgroup/{controllers}");
            for root in [
                mount.as_str(),
                "/sys/fs/cgroup/cpu",
                "/sys/fs/cgroup/cpu,cpuacct",
            ] {
                if let Some(shares) = read(format!("{root}{path}/cpu.shares")) {
                    return Some((shares, 1024));
                }
            }
        }
    }
    None
}

/// A free loopback port (for a server whose address must be known before it
/// starts: a proxy's configuration, a control plane's public URL).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free loopback port")
        .port()
}
