//! Start-up sweep: browsers and profiles that a previous run of this agent left
//! behind (after a crash or `kill -9`) are killed and removed. Only processes
//! with an argument in this agent's instance directory are touched: a
//! browser's `--user-data-dir`, or the binds of the bubblewrap that confines
//! it (whose process group holds the whole browser).

use std::path::Path;

use crate::system::process::kill_group;

#[derive(Debug, Default, Clone, Copy)]
pub struct SweepReport {
    pub processes: usize,
    pub directories: usize,
}

pub fn sweep(instances_root: &Path) -> SweepReport {
    let mut report = SweepReport::default();
    let root = format!("{}/", instances_root.display());
    let flag = format!("--user-data-dir={root}");
    for pid in crate::system::monitor::pids() {
        let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        let matches = cmdline
            .split(|b| *b == 0)
            .any(|arg| arg.starts_with(root.as_bytes()) || arg.starts_with(flag.as_bytes()));
        if matches {
            kill_group(pid, libc::SIGKILL);
            // SAFETY: kill has no memory-safety preconditions.
            unsafe {
                libc::kill(pid as i32, libc::SIGKILL);
            }
            report.processes += 1;
        }
    }
    if let Ok(entries) = std::fs::read_dir(instances_root) {
        for entry in entries.flatten() {
            if std::fs::remove_dir_all(entry.path()).is_ok() {
                report.directories += 1;
            }
        }
    }
    report
}
