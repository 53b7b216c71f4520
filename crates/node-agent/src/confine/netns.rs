//! Network namespaces for browsers: each browser runs in a namespace of its own
//! whose only interface is loopback, so that nothing it opens reaches the
//! node's network except through the agent's egress proxy ([`crate::confine::egress`]).
//!
//! A namespace is made by a short-lived thread that `unshare`s its network
//! namespace and brings loopback up; an open file of the namespace keeps it
//! alive after that thread ends, and the browser joins it before it executes
//! (`setns` in the child, see [`crate::engine::browser`]). The agent itself never
//! leaves the host's namespace: a socket belongs to the namespace it was
//! *created* in, so one worker thread ([`in_namespace_socket`]) switches into a
//! browser's namespace just long enough to create a socket there, and the agent
//! then binds, listens or connects with it from its runtime like any other.
//! This is how the agent reaches the DevTools port Chromium opens on the
//! namespace's own 127.0.0.1 (which nothing on the host can reach) and how the
//! egress proxy listens inside it.
//!
//! Creating namespaces needs `CAP_SYS_ADMIN` (the agent runs as root); without
//! it browsers share the host's network and the node reports that egress is
//! not enforced.

use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::{Arc, Mutex, OnceLock, mpsc};

/// An isolated network namespace (loopback only), kept alive by its file.
#[derive(Debug)]
pub struct NetNamespace {
    fd: Arc<OwnedFd>,
}

impl NetNamespace {
    /// A new namespace whose loopback is up.
    pub fn create() -> io::Result<Self> {
        let fd = std::thread::Builder::new()
            .name("netns-create".into())
            .spawn(|| -> io::Result<OwnedFd> {
                // SAFETY: unshare affects only this thread, which ends right after.
                check(unsafe { libc::unshare(libc::CLONE_NEWNET) })?;
                loopback_up()?;
                open_own_namespace()
            })
            .map_err(io::Error::other)?
            .join()
            .map_err(|_| io::Error::other("the namespace thread panicked"))??;
        Ok(Self { fd: Arc::new(fd) })
    }

    /// The namespace's file, for a child to join with `setns` before it executes.
    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// A TCP listener on `addr` inside the namespace.
    pub async fn listen(&self, addr: SocketAddr) -> io::Result<tokio::net::TcpListener> {
        let socket = self.tcp_socket(addr).await?;
        socket.set_reuseaddr(true)?;
        socket.bind(addr)?;
        socket.listen(1024)
    }

    /// A TCP connection to `addr` as seen from inside the namespace.
    pub async fn connect(&self, addr: SocketAddr) -> io::Result<tokio::net::TcpStream> {
        let socket = self.tcp_socket(addr).await?;
        let stream = socket.connect(addr).await?;
        stream.set_nodelay(true)?;
        Ok(stream)
    }

    async fn tcp_socket(&self, addr: SocketAddr) -> io::Result<tokio::net::TcpSocket> {
        let domain = if addr.is_ipv4() {
            libc::AF_INET
        } else {
            libc::AF_INET6
        };
        let fd = in_namespace_socket(self.fd.clone(), domain).await?;
        Ok(tokio::net::TcpSocket::from_std_stream(
            std::net::TcpStream::from(fd),
        ))
    }
}

fn check(result: libc::c_int) -> io::Result<()> {
    if result < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

fn open_own_namespace() -> io::Result<OwnedFd> {
    let file = std::fs::File::open("/proc/thread-self/ns/net")?;
    Ok(OwnedFd::from(file))
}

/// Brings up `lo` in the calling thread's network namespace.
fn loopback_up() -> io::Result<()> {
    // SAFETY: plain socket call; the fd is owned right away.
    let raw = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    check(raw)?;
    // SAFETY: `raw` is a valid descriptor we own.
    let socket = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: ifreq is plain data; all-zero is a valid value.
    let mut request: libc::ifreq = unsafe { std::mem::zeroed() };
    for (slot, byte) in request.ifr_name.iter_mut().zip(b"lo\0") {
        *slot = *byte as libc::c_char;
    }
    // SAFETY: SIOCGIFFLAGS / SIOCSIFFLAGS read and write `request` only.
    unsafe {
        check(libc::ioctl(
            socket.as_raw_fd(),
            libc::SIOCGIFFLAGS,
            &mut request,
        ))?;
        request.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
        check(libc::ioctl(
            socket.as_raw_fd(),
            libc::SIOCSIFFLAGS,
            &request,
        ))?;
    }
    Ok(())
}

/// A request to the worker: a socket of `domain` in `namespace`.
struct SocketJob {
    namespace: Arc<OwnedFd>,
    domain: libc::c_int,
    reply: tokio::sync::oneshot::Sender<io::Result<OwnedFd>>,
}

/// The worker thread's queue. A std mutex around the sender: taken only to send.
static WORKER: OnceLock<Mutex<mpsc::Sender<SocketJob>>> = OnceLock::new();

/// Creates a nonblocking TCP socket of `domain` inside `namespace`, on the one
/// worker thread that enters namespaces (and returns to the host's after each).
async fn in_namespace_socket(namespace: Arc<OwnedFd>, domain: libc::c_int) -> io::Result<OwnedFd> {
    let worker = WORKER.get_or_init(|| {
        let (sender, receiver) = mpsc::channel::<SocketJob>();
        std::thread::Builder::new()
            .name("netns-sockets".into())
            .spawn(move || run_worker(receiver))
            .expect("the namespace socket thread starts");
        Mutex::new(sender)
    });
    let (reply, answer) = tokio::sync::oneshot::channel();
    worker
        .lock()
        .expect("namespace worker lock")
        .send(SocketJob {
            namespace,
            domain,
            reply,
        })
        .map_err(|_| io::Error::other("the namespace socket thread is gone"))?;
    answer
        .await
        .map_err(|_| io::Error::other("the namespace socket thread dropped a request"))?
}

fn run_worker(jobs: mpsc::Receiver<SocketJob>) {
    let host = match open_own_namespace() {
        Ok(host) => host,
        Err(error) => {
            for job in jobs {
                let _ = job.reply.send(Err(io::Error::new(
                    error.kind(),
                    format!("cannot open the host's network namespace: {error}"),
                )));
            }
            return;
        }
    };
    for job in jobs {
        let _ = job.reply.send(socket_in(&job.namespace, job.domain, &host));
    }
}

fn socket_in(namespace: &OwnedFd, domain: libc::c_int, host: &OwnedFd) -> io::Result<OwnedFd> {
    // SAFETY: setns only changes this thread's namespace; we switch back below.
    check(unsafe { libc::setns(namespace.as_raw_fd(), libc::CLONE_NEWNET) })?;
    // SAFETY: plain socket call.
    let raw = unsafe {
        libc::socket(
            domain,
            libc::SOCK_STREAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
            0,
        )
    };
    let created = if raw < 0 {
        Err(io::Error::last_os_error())
    } else {
        // SAFETY: `raw` is a valid descriptor we own.
        Ok(unsafe { OwnedFd::from_raw_fd(raw) })
    };
    // SAFETY: as above. Staying in a browser's namespace would put every later
    // socket there; nothing can be trusted after that, so abort.
    if unsafe { libc::setns(host.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        eprintln!(
            "fatal: cannot return to the host's network namespace: {}",
            io::Error::last_os_error()
        );
        std::process::abort();
    }
    created
}

/// Whether this process may create network namespaces (probed once).
pub fn supported() -> bool {
    static SUPPORTED: OnceLock<bool> = OnceLock::new();
    *SUPPORTED.get_or_init(|| NetNamespace::create().is_ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn a_namespace_has_its_own_loopback() {
        if !supported() {
            eprintln!("skipped: this process cannot create network namespaces");
            return;
        }
        let namespace = NetNamespace::create().unwrap();
        let inside = namespace
            .listen("127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();
        let addr = inside.local_addr().unwrap();
        // The host's loopback does not have it…
        assert!(tokio::net::TcpStream::connect(addr).await.is_err());
        // …the namespace's does.
        let accept = tokio::spawn(async move {
            let (mut stream, _) = inside.accept().await.unwrap();
            stream.write_all(b"inside").await.unwrap();
        });
        let mut stream = namespace.connect(addr).await.unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).await.unwrap();
        assert_eq!(answer, "inside");
        accept.await.unwrap();
        // And a host listener is out of the namespace's reach.
        let host = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        assert!(namespace.connect(host.local_addr().unwrap()).await.is_err());
    }
}
