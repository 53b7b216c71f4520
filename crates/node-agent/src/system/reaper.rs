//! Reaps the agent's orphans. The agent is a child subreaper (so that a
//! browser's helpers cannot outlive it unnoticed): processes whose parent
//! died are handed to it. Those of a browser's process group are reaped when
//! the browser stops; others, such as the pid-namespace init of a bubblewrap
//! whose outer process exited first, would stay zombies. This sweep reaps
//! them.
//!
//! What it must not do is reap a child that the agent itself waits for (the
//! runtime's `Child::wait` would then fail). The agent waits for its own
//! children as they exit, so a child that has been a zombie through two
//! sweeps ([`INTERVAL`] apart) is one nobody waits for.

use std::collections::HashSet;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

/// How often zombies are looked for.
pub const INTERVAL: Duration = Duration::from_secs(5);

/// Sweeps until `shutdown`.
pub async fn run(shutdown: CancellationToken) {
    let mut suspects = HashSet::new();
    let mut tick = tokio::time::interval(INTERVAL);
    loop {
        tokio::select! {
            _ = tick.tick() => {
                let reaped = sweep(&mut suspects);
                if reaped > 0 {
                    tracing::debug!(reaped, "reaped orphaned processes");
                }
            }
            _ = shutdown.cancelled() => return,
        }
    }
}

/// One sweep: reaps the zombie children that were zombies at the last sweep
/// too, and remembers the new ones. Answers how many were reaped.
pub fn sweep(suspects: &mut HashSet<u32>) -> usize {
    let zombies: HashSet<u32> = crate::system::monitor::zombie_children(std::process::id())
        .into_iter()
        .collect();
    let mut reaped = 0;
    for pid in zombies.intersection(suspects) {
        let Ok(raw) = i32::try_from(*pid) else {
            continue;
        };
        // SAFETY: waitpid on one pid, without blocking; a zombie child of
        // ours is reaped, anything else answers an error.
        if unsafe { libc::waitpid(raw, std::ptr::null_mut(), libc::WNOHANG) } == raw {
            reaped += 1;
        }
    }
    *suspects = zombies;
    reaped
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_orphan_zombie_is_reaped_on_the_second_sweep() {
        crate::system::process::become_subreaper();
        // A child that forks a grandchild and exits: the grandchild is
        // handed to us, and exits too.
        let status = std::process::Command::new("/bin/sh")
            .args(["-c", "sh -c 'exit 0' & exit 0"])
            .status()
            .unwrap();
        assert!(status.success());
        let me = std::process::id();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while crate::system::monitor::zombie_children(me).is_empty() {
            assert!(
                std::time::Instant::now() < deadline,
                "the orphan was handed to us"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let mut suspects = HashSet::new();
        assert_eq!(sweep(&mut suspects), 0, "a first sighting only suspects");
        assert_eq!(sweep(&mut suspects), 1);
        assert!(crate::system::monitor::zombie_children(me).is_empty());
    }
}
