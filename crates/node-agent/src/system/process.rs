//! Processes on the node: signalling a browser's process group, the agent
//! as the reaper of its browsers' orphans, whether it runs as root, and the
//! tail of a process's log for failure reasons.

use std::path::Path;

/// The last meaningful lines of a browser log, for failure reasons.
pub fn log_tail(path: &Path) -> String {
    let Ok(text) = std::fs::read_to_string(path) else {
        return String::new();
    };
    let lines: Vec<&str> = text
        .lines()
        .filter(|line| !line.contains("dbus/") && !line.trim().is_empty())
        .collect();
    let tail = &lines[lines.len().saturating_sub(3)..];
    if tail.is_empty() {
        String::new()
    } else {
        format!(": {}", tail.join(" | "))
    }
}

pub(crate) fn kill_group(pgid: u32, signal: i32) {
    if let Ok(pgid) = i32::try_from(pgid)
        && pgid > 1
    {
        // SAFETY: killpg has no memory-safety preconditions; a stale group
        // only yields ESRCH, which we ignore.
        unsafe {
            libc::killpg(pgid, signal);
        }
    }
}

/// Makes this process the reaper of its orphaned descendants, so that a dead
/// browser's helpers are reaped here at once (instead of lingering as zombies
/// until PID 1 gets to them). Idempotent.
pub fn become_subreaper() {
    // SAFETY: prctl with PR_SET_CHILD_SUBREAPER takes plain integers.
    let result = unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    if result != 0 {
        tracing::warn!(error = %std::io::Error::last_os_error(), "cannot become a child subreaper; browser helpers are reaped by PID 1");
    }
}

pub(crate) fn is_root() -> bool {
    // SAFETY: geteuid cannot fail and touches no memory.
    unsafe { libc::geteuid() == 0 }
}
