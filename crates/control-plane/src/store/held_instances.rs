//! Instances held by a control plane's work ([`crate::app::held_instances`]):
//! which control plane holds each, for what, and until when.

use chrono::{DateTime, Utc};
use sqlx::Row;

use flotilla_api_types::InstanceId;

use super::{Store, to_millis};

impl Store {
    /// `holder` holds `instance` for `work` until `expires_at`.
    pub async fn held_instance_take(
        &self,
        instance: &InstanceId,
        (holder, work): (&str, &str),
        expires_at: DateTime<Utc>,
    ) -> Result<(), sqlx::Error> {
        sqlx::query(
            "INSERT INTO held_instances (instance_id, holder, work, expires_at) \
             VALUES ($1, $2, $3, $4) ON CONFLICT (instance_id) DO UPDATE SET \
             holder = excluded.holder, work = excluded.work, expires_at = excluded.expires_at",
        )
        .bind(instance.as_str())
        .bind(holder)
        .bind(work)
        .bind(to_millis(expires_at))
        .execute(&self.writer)
        .await?;
        Ok(())
    }

    /// Everything `holder` holds is held until `expires_at`; how many.
    pub async fn held_instances_renew(
        &self,
        holder: &str,
        expires_at: DateTime<Utc>,
    ) -> Result<u64, sqlx::Error> {
        let renewed = sqlx::query("UPDATE held_instances SET expires_at = $1 WHERE holder = $2")
            .bind(to_millis(expires_at))
            .bind(holder)
            .execute(&self.writer)
            .await?;
        Ok(renewed.rows_affected())
    }

    /// `holder` no longer holds `instance` (its work ended it, or let it be).
    pub async fn held_instance_release(
        &self,
        instance: &InstanceId,
        holder: &str,
    ) -> Result<(), sqlx::Error> {
        sqlx::query("DELETE FROM held_instances WHERE instance_id = $1 AND holder = $2")
            .bind(instance.as_str())
            .bind(holder)
            .execute(&self.writer)
            .await?;
        Ok(())
    }

    /// The held instances whose holder has not renewed them by `now`, each
    /// with its work.
    pub async fn held_instances_lapsed(
        &self,
        now: DateTime<Utc>,
    ) -> Result<Vec<(InstanceId, String)>, sqlx::Error> {
        let rows = sqlx::query(
            "SELECT instance_id, work FROM held_instances WHERE expires_at < $1 \
             ORDER BY instance_id",
        )
        .bind(to_millis(now))
        .fetch_all(&self.writer)
        .await?;
        rows.iter()
            .map(|row| {
                Ok((
                    InstanceId::new(row.try_get::<String, _>("instance_id")?),
                    row.try_get("work")?,
                ))
            })
            .collect()
    }

    /// Takes over `instance`, lapsed at `now`, for `holder` until
    /// `expires_at`; `false` when it did not lapse (or another took it).
    pub async fn held_instance_take_over(
        &self,
        instance: &InstanceId,
        holder: &str,
        (now, expires_at): (DateTime<Utc>, DateTime<Utc>),
    ) -> Result<bool, sqlx::Error> {
        let taken = sqlx::query(
            "UPDATE held_instances SET holder = $1, expires_at = $2 \
             WHERE instance_id = $3 AND expires_at < $4",
        )
        .bind(holder)
        .bind(to_millis(expires_at))
        .bind(instance.as_str())
        .bind(to_millis(now))
        .execute(&self.writer)
        .await?;
        Ok(taken.rows_affected() == 1)
    }
}
