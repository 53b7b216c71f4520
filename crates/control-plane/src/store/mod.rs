//! The store: instance and node records in SQLite (embedded default) or
//! PostgreSQL (shared by several control planes), through sqlx's `Any` driver.
//!
//! The SQL is written once in the dialect both understand (`$N` parameters,
//! `BIGINT`, `DOUBLE PRECISION`, `TEXT`; times as Unix milliseconds, booleans as
//! 0/1). Where they differ — serialising writers — the store hides it: on SQLite
//! every write goes through a one-connection writer pool (one writer, so a
//! transaction's snapshot can never go stale under it and `SQLITE_BUSY` cannot
//! happen; readers use the other pool, WAL keeps them unblocked); on PostgreSQL
//! reads and writes share the pool and writers lock rows with `SELECT … FOR UPDATE`.
//!
//! With SQLite the store also keeps an exact in-memory read model of instance
//! records ([`cache`]); with PostgreSQL, shared by several control planes, every
//! read goes to the database.

mod alerts;
mod cache;
mod drains;
mod events;
mod extensions;
mod held_instances;
mod instances;
mod kept_recordings;
mod leases;
mod live_links;
mod mcp_sessions;
mod metrics;
mod nodes;
mod profiles;
mod settings;

pub use alerts::{AlertRecord, NewAlert};
pub use drains::DrainRecord;
pub use events::{Delivery, EventRoute};
pub use instances::{Expected, InstanceFilter, InstanceRecord, NewInstance, Placed};
pub use live_links::LiveLinkRecord;
pub use mcp_sessions::{McpSessionRecord, McpSessionsOf};
pub use metrics::MetricSample;
pub use nodes::NodeRecord;

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use chrono::{DateTime, TimeZone, Utc};
use sqlx::any::{AnyConnectOptions, AnyPoolOptions};
use sqlx::{AnyPool, Executor};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

/// A cheap-to-clone handle to the store.
#[derive(Clone)]
pub struct Store {
    /// Reads.
    pool: AnyPool,
    /// Writes: a single connection on SQLite, the same pool on PostgreSQL.
    writer: AnyPool,
    backend: Backend,
    /// The read model of instances (SQLite only; see [`cache`]).
    cache: Option<Arc<cache::InstanceCache>>,
    /// Event routes and the dispatcher's wake-up (see [`events`]).
    outbox: Arc<events::Outbox>,
}

impl Store {
    /// Opens (creating if needed) the database at `url` and applies migrations.
    pub async fn connect(url: &str, max_connections: u32) -> anyhow::Result<Self> {
        sqlx::any::install_default_drivers();
        let backend = if url.starts_with("sqlite:") {
            Backend::Sqlite
        } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Backend::Postgres
        } else {
            anyhow::bail!(
                "store.database_url must start with sqlite:// or postgres:// (got {url:?})"
            );
        };
        let url = match backend {
            Backend::Sqlite => prepare_sqlite_url(url)?,
            Backend::Postgres => url.to_owned(),
        };
        let options = AnyConnectOptions::from_str(&url)
            .with_context(|| format!("invalid database URL {url:?}"))?;
        let pool_options = |size: u32| {
            let options = AnyPoolOptions::new()
                .max_connections(size)
                .acquire_timeout(Duration::from_secs(30));
            if backend == Backend::Sqlite {
                options.after_connect(|conn, _| {
                    Box::pin(async move {
                        conn.execute("PRAGMA journal_mode = WAL").await?;
                        conn.execute("PRAGMA synchronous = NORMAL").await?;
                        conn.execute("PRAGMA busy_timeout = 10000").await?;
                        Ok(())
                    })
                })
            } else {
                options
            }
        };
        let open_error = || format!("cannot open the store at {}", redact_url(&url));
        let writer = match backend {
            Backend::Sqlite => pool_options(1)
                .connect_with(options.clone())
                .await
                .with_context(open_error)?,
            Backend::Postgres => pool_options(max_connections)
                .connect_with(options.clone())
                .await
                .with_context(open_error)?,
        };
        // Migrations of a newer version are left alone: during a rolling
        // upgrade (or a rollback) this version works on a store a newer one
        // migrated, since migrations only add.
        let mut migrator = sqlx::migrate!("./migrations");
        migrator.set_ignore_missing(true);
        migrator
            .run(&writer)
            .await
            .context("cannot apply store migrations")?;
        let pool = match backend {
            Backend::Sqlite => pool_options(max_connections)
                .connect_with(options)
                .await
                .with_context(open_error)?,
            Backend::Postgres => writer.clone(),
        };
        let cache = (backend == Backend::Sqlite).then(Arc::default);
        let store = Self {
            pool,
            writer,
            backend,
            cache,
            outbox: Arc::default(),
        };
        store
            .load_cache()
            .await
            .context("cannot load instance records")?;
        Ok(store)
    }

    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// Starts a write transaction (see the module docs).
    pub async fn write_tx(&self) -> Result<sqlx::Transaction<'static, sqlx::Any>, sqlx::Error> {
        self.writer.begin().await
    }

    /// `SELECT … FOR UPDATE` on PostgreSQL; nothing on SQLite (already serialised).
    fn for_update(&self) -> &'static str {
        match self.backend {
            Backend::Sqlite => "",
            Backend::Postgres => " FOR UPDATE",
        }
    }

    /// Whether the store answers.
    pub async fn ping(&self) -> bool {
        sqlx::query("SELECT 1").execute(&self.pool).await.is_ok()
    }

    pub async fn close(&self) {
        self.pool.close().await;
        self.writer.close().await;
    }
}

/// `sqlite://path` → the same with `mode=rwc`, creating the parent directory.
fn prepare_sqlite_url(url: &str) -> anyhow::Result<String> {
    let rest = url
        .trim_start_matches("sqlite://")
        .trim_start_matches("sqlite:");
    let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
    if path.is_empty() || path == ":memory:" {
        anyhow::bail!(
            "store.database_url: an in-memory SQLite store would lose everything at exit; give a file path"
        );
    }
    if let Some(parent) = std::path::Path::new(path).parent()
        && !parent.as_os_str().is_empty()
    {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("cannot create the store directory {}", parent.display()))?;
    }
    let query = if query.contains("mode=") {
        query.to_owned()
    } else if query.is_empty() {
        "mode=rwc".to_owned()
    } else {
        format!("{query}&mode=rwc")
    };
    Ok(format!("sqlite://{path}?{query}"))
}

/// The URL without its password, for messages.
fn redact_url(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme_end), Some(at)) if at > scheme_end => {
            let credentials = &url[scheme_end + 3..at];
            match credentials.split_once(':') {
                Some((user, _)) => format!("{}{user}:***{}", &url[..scheme_end + 3], &url[at..]),
                None => url.to_owned(),
            }
        }
        _ => url.to_owned(),
    }
}

impl Store {
    /// The row of `table` (with `columns`) whose `id` is `id`, decoded, read
    /// through `pool` (the writer where a caller must see its own writes).
    pub(crate) async fn row_by_id<T>(
        pool: &AnyPool,
        (table, columns): (&str, &str),
        id: &str,
        decode: fn(&sqlx::any::AnyRow) -> Result<T, sqlx::Error>,
    ) -> Result<Option<T>, sqlx::Error> {
        sqlx::query(&format!("SELECT {columns} FROM {table} WHERE id = $1"))
            .bind(id)
            .fetch_optional(pool)
            .await?
            .as_ref()
            .map(decode)
            .transpose()
    }
}

pub(crate) fn to_millis(time: DateTime<Utc>) -> i64 {
    time.timestamp_millis()
}

pub(crate) fn from_millis(millis: i64) -> DateTime<Utc> {
    Utc.timestamp_millis_opt(millis)
        .single()
        .unwrap_or_default()
}

/// `$first, $first+1, …` for `count` parameters.
pub(crate) fn placeholders(first: usize, count: usize) -> String {
    (first..first + count)
        .map(|n| format!("${n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redacts_passwords() {
        assert_eq!(
            redact_url("postgres://u:secret@h:5432/db"),
            "postgres://u:***@h:5432/db"
        );
        assert_eq!(redact_url("sqlite://./data/x.db"), "sqlite://./data/x.db");
    }

    #[test]
    fn sqlite_urls_get_create_mode() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}/sub/x.db", dir.path().display());
        let prepared = prepare_sqlite_url(&url).unwrap();
        assert!(prepared.ends_with("/sub/x.db?mode=rwc"), "{prepared}");
        assert!(dir.path().join("sub").is_dir());
        assert!(prepare_sqlite_url("sqlite::memory:").is_err());
    }
}

#[cfg(test)]
mod migration_tests {
    /// Every migration only adds (tables, indexes, columns that have a
    /// default or may be NULL), so that a control plane of the version
    /// before keeps working on a store a newer one migrated, during a
    /// rolling upgrade. A migration that drops, renames, rewrites or
    /// changes what is there fails here.
    #[test]
    fn migrations_only_add() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations");
        let mut files: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .map(|entry| entry.path())
            .collect();
        files.sort();
        assert!(files.len() >= 19, "{files:?}");
        for file in files {
            let text = std::fs::read_to_string(&file).unwrap();
            let code: String = text
                .lines()
                .map(|line| line.split("--").next().unwrap_or(""))
                .collect::<Vec<_>>()
                .join(" ");
            for statement in code.split(';').map(str::trim).filter(|s| !s.is_empty()) {
                let words: Vec<String> = statement
                    .split_whitespace()
                    .map(str::to_ascii_uppercase)
                    .collect();
                let starts = |prefix: &[&str]| {
                    words.len() >= prefix.len() && words.iter().zip(prefix).all(|(w, p)| w == p)
                };
                let adds_a_column = starts(&["ALTER", "TABLE"])
                    && words.len() > 4
                    && words[3] == "ADD"
                    && words[4] == "COLUMN";
                let additive = starts(&["CREATE", "TABLE"])
                    || starts(&["CREATE", "INDEX"])
                    || starts(&["CREATE", "UNIQUE", "INDEX"])
                    || adds_a_column;
                assert!(additive, "{}: not additive: {statement}", file.display());
                if adds_a_column {
                    let joined = words.join(" ");
                    assert!(
                        !joined.contains("NOT NULL") || joined.contains("DEFAULT"),
                        "{}: a NOT NULL column without a default breaks the version before's inserts: {statement}",
                        file.display()
                    );
                }
            }
        }
    }
}
