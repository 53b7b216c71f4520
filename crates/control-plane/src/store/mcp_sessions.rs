//! MCP sessions ([`crate::app::mcp_sessions`]): who opened each, what it
//! holds (its current instance and tab, the instances it created), when it
//! was last used, and whether a control plane is ending it. Any control
//! plane of a cluster serves a session's next request from these rows.
//!
//! A session is live while nobody is ending it and it was used at or after
//! the `live_since` its callers give (now less `mcp.session_idle_timeout_sec`).

use std::collections::{HashMap, HashSet};

use chrono::{DateTime, Utc};
use sqlx::Row;
use sqlx::any::AnyRow;

use flotilla_api_types::InstanceId;

use super::{Store, to_millis};

/// An MCP session as stored.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct McpSessionRecord {
    /// The key that opened it (`None` until recorded).
    pub principal: Option<String>,
    pub tenant: Option<String>,
    pub current_instance: Option<InstanceId>,
    pub current_tab: Option<String>,
}

/// Which live sessions [`Store::mcp_sessions_count`] counts.
#[derive(Debug, Clone, Copy)]
pub enum McpSessionsOf<'a> {
    All,
    Principal(&'a str),
    Tenant(&'a str),
}

const LIVE: &str = "ending_since IS NULL AND last_seen_at >= $1";

fn decode(row: &AnyRow) -> Result<McpSessionRecord, sqlx::Error> {
    Ok(McpSessionRecord {
        principal: row.try_get("principal")?,
        tenant: row.try_get("tenant")?,
        current_instance: row
            .try_get::<Option<String>, _>("current_instance")?
            .map(InstanceId::new),
        current_tab: row.try_get("current_tab")?,
    })
}

impl Store {
    /// Records session `id`'s `initialize` parameters (JSON) as it opens.
    pub async fn mcp_session_initialized(
        &self,
        id: &str,
        initialize_params: &str,
        now: DateTime<Utc>,
    ) -> Result<(), sqlx::Error> {
        sqlx::query(
            "INSERT INTO mcp_sessions (id, initialize_params, last_seen_at) VALUES ($1, $2, $3) \
             ON CONFLICT (id) DO UPDATE SET initialize_params = excluded.initialize_params",
        )
        .bind(id)
        .bind(initialize_params)
        .bind(to_millis(now))
        .execute(&self.writer)
        .await?;
        Ok(())
    }

    /// Records that `principal` (of `tenant`) opened session `id`; a session
    /// already someone's keeps its opener.
    pub async fn mcp_session_opened(
        &self,
        id: &str,
        (principal, tenant): (&str, Option<&str>),
        now: DateTime<Utc>,
    ) -> Result<(), sqlx::Error> {
        sqlx::query(
            "INSERT INTO mcp_sessions (id, principal, tenant, last_seen_at) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (id) DO UPDATE SET principal = excluded.principal, \
             tenant = excluded.tenant WHERE mcp_sessions.principal IS NULL",
        )
        .bind(id)
        .bind(principal)
        .bind(tenant)
        .bind(to_millis(now))
        .execute(&self.writer)
        .await?;
        Ok(())
    }

    /// Live session `id`.
    pub async fn mcp_session_get(
        &self,
        id: &str,
        live_since: DateTime<Utc>,
    ) -> Result<Option<McpSessionRecord>, sqlx::Error> {
        let row = sqlx::query(&format!(
            "SELECT principal, tenant, current_instance, current_tab FROM mcp_sessions \
             WHERE {LIVE} AND id = $2"
        ))
        .bind(to_millis(live_since))
        .bind(id)
        .fetch_optional(&self.pool)
        .await?;
        row.as_ref().map(decode).transpose()
    }

    /// Which of `ids` are live sessions.
    pub async fn mcp_sessions_live_among(
        &self,
        ids: &[String],
        live_since: DateTime<Utc>,
    ) -> Result<HashSet<String>, sqlx::Error> {
        let mut live = HashSet::new();
        for chunk in ids.chunks(500) {
            let sql = format!(
                "SELECT id FROM mcp_sessions WHERE {LIVE} AND id IN ({})",
                super::placeholders(2, chunk.len())
            );
            let mut query = sqlx::query(&sql).bind(to_millis(live_since));
            for id in chunk {
                query = query.bind(id);
            }
            for row in query.fetch_all(&self.pool).await? {
                live.insert(row.try_get("id")?);
            }
        }
        Ok(live)
    }

    /// Live session `id`'s `initialize` parameters (JSON).
    pub async fn mcp_session_initialize_params(
        &self,
        id: &str,
        live_since: DateTime<Utc>,
    ) -> Result<Option<String>, sqlx::Error> {
        let row = sqlx::query(&format!(
            "SELECT initialize_params FROM mcp_sessions WHERE {LIVE} AND id = $2"
        ))
        .bind(to_millis(live_since))
        .bind(id)
        .fetch_optional(&self.pool)
        .await?;
        Ok(row
            .map(|row| row.try_get::<Option<String>, _>("initialize_params"))
            .transpose()?
            .flatten())
    }

    async fn mcp_session_created(&self, id: &str) -> Result<Vec<InstanceId>, sqlx::Error> {
        let rows = sqlx::query(
            "SELECT instance_id FROM mcp_session_instances WHERE session_id = $1 \
             ORDER BY instance_id",
        )
        .bind(id)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| Ok(InstanceId::new(row.try_get::<String, _>("instance_id")?)))
            .collect()
    }

    /// Session `id`, live since `live_since` and `principal`'s, is used at
    /// `now` (one write); `false` when it is not (gone, ending, idle, or
    /// another's).
    pub async fn mcp_session_use(
        &self,
        id: &str,
        principal: &str,
        (live_since, now): (DateTime<Utc>, DateTime<Utc>),
    ) -> Result<bool, sqlx::Error> {
        let used = sqlx::query(&format!(
            "UPDATE mcp_sessions SET last_seen_at = CASE WHEN last_seen_at < $3 THEN $3 \
             ELSE last_seen_at END WHERE {LIVE} AND id = $2 AND principal = $4"
        ))
        .bind(to_millis(live_since))
        .bind(id)
        .bind(to_millis(now))
        .bind(principal)
        .execute(&self.writer)
        .await?;
        Ok(used.rows_affected() == 1)
    }

    /// Session `id` was used at `now`.
    pub async fn mcp_session_touch(&self, id: &str, now: DateTime<Utc>) -> Result<(), sqlx::Error> {
        sqlx::query(
            "UPDATE mcp_sessions SET last_seen_at = $1 \
             WHERE id = $2 AND ending_since IS NULL AND last_seen_at < $1",
        )
        .bind(to_millis(now))
        .bind(id)
        .execute(&self.writer)
        .await?;
        Ok(())
    }

    /// Session `id` now acts on `instance`; its tab is `tab`, or, when
    /// `None`, stays the one it had if the instance is the same.
    pub async fn mcp_session_current(
        &self,
        id: &str,
        instance: &InstanceId,
        tab: Option<&str>,
    ) -> Result<(), sqlx::Error> {
        sqlx::query(
            "UPDATE mcp_sessions SET current_tab = CASE WHEN current_instance = $1 \
             THEN COALESCE($2, current_tab) ELSE $2 END, current_instance = $1 WHERE id = $3",
        )
        .bind(instance.as_str())
        .bind(tab)
        .bind(id)
        .execute(&self.writer)
        .await?;
        Ok(())
    }

    /// Session `id` created `instance`; `false` when nobody will end it
    /// with the session (it is ending, or gone).
    pub async fn mcp_session_created_one(
        &self,
        id: &str,
        instance: &InstanceId,
    ) -> Result<bool, sqlx::Error> {
        let recorded = sqlx::query(
            "INSERT INTO mcp_session_instances (session_id, instance_id) SELECT $1, $2 \
             WHERE EXISTS (SELECT 1 FROM mcp_sessions WHERE id = $1 AND ending_since IS NULL) \
             ON CONFLICT (session_id, instance_id) DO NOTHING",
        )
        .bind(id)
        .bind(instance.as_str())
        .execute(&self.writer)
        .await?;
        if recorded.rows_affected() == 1 {
            return Ok(true);
        }
        // Already recorded, while it lives.
        let live = sqlx::query(
            "SELECT 1 AS one FROM mcp_session_instances i JOIN mcp_sessions s ON s.id = i.session_id \
             WHERE i.session_id = $1 AND i.instance_id = $2 AND s.ending_since IS NULL",
        )
        .bind(id)
        .bind(instance.as_str())
        .fetch_optional(&self.writer)
        .await?;
        Ok(live.is_some())
    }

    /// Session `id` holds `instance` no more (it was closed): neither as
    /// one it created nor as its current one.
    pub async fn mcp_session_let_go(
        &self,
        id: &str,
        instance: &InstanceId,
    ) -> Result<(), sqlx::Error> {
        sqlx::query("DELETE FROM mcp_session_instances WHERE session_id = $1 AND instance_id = $2")
            .bind(id)
            .bind(instance.as_str())
            .execute(&self.writer)
            .await?;
        sqlx::query(
            "UPDATE mcp_sessions SET current_instance = NULL, current_tab = NULL \
             WHERE id = $1 AND current_instance = $2",
        )
        .bind(id)
        .bind(instance.as_str())
        .execute(&self.writer)
        .await?;
        Ok(())
    }

    /// How many live sessions `of` holds.
    pub async fn mcp_sessions_count(
        &self,
        of: McpSessionsOf<'_>,
        live_since: DateTime<Utc>,
    ) -> Result<u64, sqlx::Error> {
        let (filter, value) = match of {
            McpSessionsOf::All => ("", None),
            McpSessionsOf::Principal(principal) => (" AND principal = $2", Some(principal)),
            McpSessionsOf::Tenant(tenant) => (" AND tenant = $2", Some(tenant)),
        };
        let sql = format!("SELECT COUNT(*) AS n FROM mcp_sessions WHERE {LIVE}{filter}");
        let mut query = sqlx::query(&sql).bind(to_millis(live_since));
        if let Some(value) = value {
            query = query.bind(value);
        }
        let n: i64 = query.fetch_one(&self.pool).await?.try_get("n")?;
        Ok(u64::try_from(n).unwrap_or(0))
    }

    /// How many live sessions hold `instance` (created it, or act on it).
    pub async fn mcp_sessions_holding(
        &self,
        instance: &InstanceId,
        live_since: DateTime<Utc>,
    ) -> Result<u32, sqlx::Error> {
        let n: i64 = sqlx::query(&format!(
            "SELECT COUNT(*) AS n FROM mcp_sessions WHERE {LIVE} AND (current_instance = $2 \
             OR id IN (SELECT session_id FROM mcp_session_instances WHERE instance_id = $2))"
        ))
        .bind(to_millis(live_since))
        .bind(instance.as_str())
        .fetch_one(&self.pool)
        .await?
        .try_get("n")?;
        Ok(u32::try_from(n).unwrap_or(u32::MAX))
    }

    /// How many live sessions hold each instance any holds.
    pub async fn mcp_sessions_holding_each(
        &self,
        live_since: DateTime<Utc>,
    ) -> Result<HashMap<InstanceId, u32>, sqlx::Error> {
        let rows = sqlx::query(&format!(
            "SELECT id AS session_id, current_instance AS instance_id FROM mcp_sessions \
             WHERE {LIVE} AND current_instance IS NOT NULL \
             UNION SELECT i.session_id, i.instance_id FROM mcp_session_instances i \
             JOIN mcp_sessions s ON s.id = i.session_id \
             WHERE s.ending_since IS NULL AND s.last_seen_at >= $1"
        ))
        .bind(to_millis(live_since))
        .fetch_all(&self.pool)
        .await?;
        let mut holding = HashMap::new();
        for row in &rows {
            let instance = InstanceId::new(row.try_get::<String, _>("instance_id")?);
            *holding.entry(instance).or_insert(0) += 1;
        }
        Ok(holding)
    }

    /// Takes on the end of session `id` at `now`: `Some(the instances it
    /// created)` when this caller ends it (nobody was, or whoever was began
    /// before `stale_before` and is taken to have stopped), `None` when
    /// another is ending it or it is gone.
    pub async fn mcp_session_end_claim(
        &self,
        id: &str,
        now: DateTime<Utc>,
        stale_before: DateTime<Utc>,
    ) -> Result<Option<Vec<InstanceId>>, sqlx::Error> {
        let claimed = sqlx::query(
            "UPDATE mcp_sessions SET ending_since = $1 \
             WHERE id = $2 AND (ending_since IS NULL OR ending_since < $3)",
        )
        .bind(to_millis(now))
        .bind(id)
        .bind(to_millis(stale_before))
        .execute(&self.writer)
        .await?;
        if claimed.rows_affected() == 0 {
            return Ok(None);
        }
        Ok(Some(self.mcp_session_created(id).await?))
    }

    /// The end of session `id` goes on at `now` (so that nobody takes it
    /// over while it does).
    pub async fn mcp_session_still_ending(
        &self,
        id: &str,
        now: DateTime<Utc>,
    ) -> Result<(), sqlx::Error> {
        sqlx::query(
            "UPDATE mcp_sessions SET ending_since = $1 WHERE id = $2 AND ending_since IS NOT NULL",
        )
        .bind(to_millis(now))
        .bind(id)
        .execute(&self.writer)
        .await?;
        Ok(())
    }

    /// Forgets session `id` (its end was carried out).
    pub async fn mcp_session_forget(&self, id: &str) -> Result<(), sqlx::Error> {
        sqlx::query("DELETE FROM mcp_session_instances WHERE session_id = $1")
            .bind(id)
            .execute(&self.writer)
            .await?;
        sqlx::query("DELETE FROM mcp_sessions WHERE id = $1")
            .bind(id)
            .execute(&self.writer)
            .await?;
        Ok(())
    }

    /// The sessions to end: unused since before `live_since`, or whose end
    /// began before `stale_before` and was never finished.
    pub async fn mcp_sessions_to_end(
        &self,
        live_since: DateTime<Utc>,
        stale_before: DateTime<Utc>,
    ) -> Result<Vec<String>, sqlx::Error> {
        let rows = sqlx::query(
            "SELECT id FROM mcp_sessions WHERE (ending_since IS NULL AND last_seen_at < $1) \
             OR ending_since < $2 ORDER BY id",
        )
        .bind(to_millis(live_since))
        .bind(to_millis(stale_before))
        .fetch_all(&self.writer)
        .await?;
        rows.iter().map(|row| row.try_get("id")).collect()
    }
}
