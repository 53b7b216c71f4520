//! Leases, so that a background task runs in one control plane of a cluster at
//! a time: the holder renews before expiry; another takes over once it lapses.

use chrono::{DateTime, Utc};

use super::{Store, to_millis};

impl Store {
    /// Takes or renews `name` for `holder` until `now + ttl`; `false` while
    /// another holder's lease is still valid.
    pub async fn lease_acquire(
        &self,
        name: &str,
        holder: &str,
        now: DateTime<Utc>,
        ttl: chrono::Duration,
    ) -> Result<bool, sqlx::Error> {
        let done = sqlx::query(
            "INSERT INTO leases (name, holder, expires_at) VALUES ($1, $2, $3) \
             ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, expires_at = excluded.expires_at \
             WHERE leases.holder = excluded.holder OR leases.expires_at < $4",
        )
        .bind(name)
        .bind(holder)
        .bind(to_millis(now + ttl))
        .bind(to_millis(now))
        .execute(&self.writer)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Gives lease `name` up, if `holder` holds it.
    pub async fn lease_release(&self, name: &str, holder: &str) -> Result<(), sqlx::Error> {
        sqlx::query("DELETE FROM leases WHERE name = $1 AND holder = $2")
            .bind(name)
            .bind(holder)
            .execute(&self.writer)
            .await?;
        Ok(())
    }
}
