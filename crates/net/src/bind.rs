//! Binding a listening socket, shared by every Flotilla process.
//!
//! A process restarted after a crash can find its port held for a moment by
//! a child of its previous run: a browser being spawned holds copies of all
//! of the agent's descriptors between fork and exec (and joining a cgroup v1
//! there can wait for an RCU grace period). That child dies with its parent
//! (`PR_SET_PDEATHSIG`), so `EADDRINUSE` is retried for a few seconds before
//! it counts as another process using the port.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tokio::net::TcpListener;

/// How long a port in use is waited for.
const IN_USE_PATIENCE: Duration = Duration::from_secs(5);

/// Binds `addr`, retrying `EADDRINUSE` for up to five seconds.
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let started = Instant::now();
    let mut logged = false;
    loop {
        match listen(addr) {
            Err(error)
                if error.kind() == std::io::ErrorKind::AddrInUse
                    && started.elapsed() < IN_USE_PATIENCE =>
            {
                if !logged {
                    tracing::warn!(%addr, "address in use; waiting for it to be released");
                    logged = true;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            outcome => return outcome,
        }
    }
}

/// How many connections the kernel may hold for the accept loop: a burst of
/// clients (a flood among them) waits there instead of having its SYNs
/// dropped and retried a second later. The kernel caps it at `somaxconn`.
const BACKLOG: u32 = 4096;

/// Binds and listens like `TcpListener::bind` (with `SO_REUSEADDR`), with a
/// deeper backlog.
fn listen(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = match addr {
        SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
        SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(BACKLOG)
}

/// Gives a listener bound by the standard library (backlog 128) the deeper
/// backlog: `listen` again on a listening socket only changes it.
pub fn deepen_backlog(listener: &std::net::TcpListener) -> std::io::Result<()> {
    use std::os::fd::AsRawFd as _;
    // SAFETY: listen on a descriptor the listener owns.
    if unsafe { libc::listen(listener.as_raw_fd(), BACKLOG as libc::c_int) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_port_released_meanwhile_is_taken() {
        let holder = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = holder.local_addr().unwrap();
        let release = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            drop(holder);
        });
        let listener = bind(addr).await.expect("bound once released");
        assert_eq!(listener.local_addr().unwrap(), addr);
        release.join().unwrap();
    }

    #[tokio::test]
    async fn a_port_kept_in_use_is_an_error_in_the_end() {
        let holder = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let error = bind(holder.local_addr().unwrap()).await.unwrap_err();
        assert_eq!(error.kind(), std::io::ErrorKind::AddrInUse);
    }
}
