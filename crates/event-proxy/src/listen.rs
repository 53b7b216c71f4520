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
        match TcpListener::bind(addr).await {
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
