//! [`PgServer`]: a throwaway PostgreSQL cluster on a free port.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use crate::wait_until;
use anyhow::{Context as _, bail};

/// A private PostgreSQL server for one test binary: `initdb` in a temp
/// directory (as the `postgres` user when running as root), listening on a
/// free port of 127.0.0.1 with trust authentication and `fsync = off`.
/// [`PgServer::database`] makes a fresh database per test.
pub struct PgServer {
    pub port: u16,
    child: Option<std::process::Child>,
    _dir: tempfile::TempDir,
}

pub(super) fn postgres_bin(name: &str) -> anyhow::Result<PathBuf> {
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .context("PostgreSQL is not installed (/usr/lib/postgresql); scripts/install-deps --test installs it")?
        .filter_map(|e| e.ok().map(|e| e.path().join("bin").join(name)))
        .filter(|p| p.exists())
        .collect();
    versions.sort();
    versions
        .pop()
        .with_context(|| format!("no PostgreSQL {name} binary"))
}

/// PostgreSQL refuses to run as root: when the tests run as root, the
/// `postgres` user's (uid, gid) to drop to.
fn postgres_user_if_root() -> anyhow::Result<Option<(u32, u32)>> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Ok(None);
    }
    let name = std::ffi::CString::new("postgres").expect("no NUL");
    // SAFETY: getpwnam returns a pointer to static storage or null.
    let entry = unsafe { libc::getpwnam(name.as_ptr()) };
    anyhow::ensure!(!entry.is_null(), "no postgres user (install postgresql)");
    // SAFETY: checked non-null just above.
    Ok(Some(unsafe { ((*entry).pw_uid, (*entry).pw_gid) }))
}

impl PgServer {
    pub async fn start() -> anyhow::Result<Self> {
        let dir = tempfile::Builder::new().prefix("flotilla-pg-").tempdir()?;
        let ids = postgres_user_if_root()?;
        let root = ids.is_some();
        let as_postgres = |program: PathBuf| {
            use std::os::unix::process::CommandExt as _;
            let mut command = std::process::Command::new(program);
            if let Some((uid, gid)) = ids {
                command.uid(uid).gid(gid);
            }
            command.stdin(Stdio::null()).current_dir("/");
            command
        };
        if root {
            let status = std::process::Command::new("chown")
                .args(["postgres:postgres"])
                .arg(dir.path())
                .status()?;
            anyhow::ensure!(status.success(), "cannot chown the PostgreSQL directory");
        }
        let data = dir.path().join("data");
        let output = as_postgres(postgres_bin("initdb")?)
            .args(["-A", "trust", "-U", "postgres", "--no-sync", "-D"])
            .arg(&data)
            .output()?;
        anyhow::ensure!(
            output.status.success(),
            "initdb failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        let port = crate::free_port();
        let log = std::fs::File::create(dir.path().join("postgres.log"))?;
        let child = as_postgres(postgres_bin("postgres")?)
            .arg("-D")
            .arg(&data)
            .args(["-h", "127.0.0.1", "-p", &port.to_string(), "-k"])
            .arg(dir.path())
            .args([
                "-c",
                "fsync=off",
                "-c",
                "synchronous_commit=off",
                "-c",
                "full_page_writes=off",
                "-c",
                "max_connections=300",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .context("cannot start postgres")?;
        let server = Self {
            port,
            child: Some(child),
            _dir: dir,
        };
        server.wait_accepting().await?;
        Ok(server)
    }

    /// Waits until PostgreSQL answers a query: a TCP accept is not enough
    /// (it refuses sessions with "the database system is starting up" for
    /// a moment after it listens).
    async fn wait_accepting(&self) -> anyhow::Result<()> {
        let admin = format!("postgres://postgres@127.0.0.1:{}/postgres", self.port);
        let psql = postgres_bin("psql")?;
        wait_until(
            Duration::from_secs(60),
            "PostgreSQL to answer queries",
            || async {
                let output = tokio::process::Command::new(&psql)
                    .args(["-d", &admin, "-c", "SELECT 1"])
                    .output()
                    .await
                    .map_err(|e| e.to_string())?;
                if output.status.success() {
                    Ok(Some(()))
                } else {
                    Err(String::from_utf8_lossy(&output.stderr).into_owned())
                }
            },
        )
        .await
        .map_err(|e| anyhow::anyhow!(e))
    }

    /// A fresh, empty database; its URL.
    pub async fn database(&self) -> anyhow::Result<String> {
        let name = format!("t_{}", uuid_like());
        let admin = format!("postgres://postgres@127.0.0.1:{}/postgres", self.port);
        let output = tokio::process::Command::new(postgres_bin("psql")?)
            .args(["-d", &admin, "-v", "ON_ERROR_STOP=1", "-c"])
            .arg(format!("CREATE DATABASE {name}"))
            .output()
            .await;
        match output {
            Ok(output) if output.status.success() => {}
            Ok(output) => bail!(
                "CREATE DATABASE failed: {}",
                String::from_utf8_lossy(&output.stderr)
            ),
            Err(error) => bail!("cannot run psql: {error}"),
        }
        Ok(format!(
            "postgres://postgres@127.0.0.1:{}/{name}",
            self.port
        ))
    }
}

pub(super) fn uuid_like() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!(
        "{}_{}_{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0)
    )
}

impl Drop for PgServer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SIGINT: PostgreSQL's fast shutdown.
            unsafe {
                libc::kill(child.id() as i32, libc::SIGINT);
            }
            for _ in 0..100 {
                if let Ok(Some(_)) = child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
