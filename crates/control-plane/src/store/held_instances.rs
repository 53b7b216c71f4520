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

    /// `instances`, held by `holder`, are held until `expires_at`; how many.
    pub async fn held_instances_renew(
        &self,
        holder: &str,
        instances: &[InstanceId],
        expires_at: DateTime<Utc>,
    ) -> Result<u64, sqlx::Error> {
        let mut renewed = 0;
        for chunk in instances.chunks(500) {
            let sql = format!(
                "UPDATE held_instances SET expires_at = $1 WHERE holder = $2 AND instance_id IN ({})",
                super::placeholders(3, chunk.len())
            );
            let mut query = sqlx::query(&sql).bind(to_millis(expires_at)).bind(holder);
            for id in chunk {
                query = query.bind(id.as_str());
            }
            renewed += query.execute(&self.writer).await?.rows_affected();
        }
        Ok(renewed)
    }

    /// `holder`'s hold of `instance` lapses now and is nobody's (its
    /// delete failed: the next takeover sweep, on any control plane, tries
    /// again).
    pub async fn held_instance_lapse(
        &self,
        instance: &InstanceId,
        holder: &str,
    ) -> Result<(), sqlx::Error> {
        sqlx::query(
            "UPDATE held_instances SET expires_at = 0, holder = '' \
             WHERE instance_id = $1 AND holder = $2",
        )
        .bind(instance.as_str())
        .bind(holder)
        .execute(&self.writer)
        .await?;
        Ok(())
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

    /// The held instances whose holder (another than `me`) has not renewed
    /// them by `now`, each with its work.
    pub async fn held_instances_lapsed(
        &self,
        me: &str,
        now: DateTime<Utc>,
    ) -> Result<Vec<(InstanceId, String)>, sqlx::Error> {
        let rows = sqlx::query(
            "SELECT instance_id, work FROM held_instances WHERE expires_at < $1 \
             AND holder <> $2 ORDER BY instance_id",
        )
        .bind(to_millis(now))
        .bind(me)
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
    /// `expires_at`; `false` when it did not lapse (or another took it). A
    /// holder never takes over its own: its work may still run.
    pub async fn held_instance_take_over(
        &self,
        instance: &InstanceId,
        holder: &str,
        (now, expires_at): (DateTime<Utc>, DateTime<Utc>),
    ) -> Result<bool, sqlx::Error> {
        let taken = sqlx::query(
            "UPDATE held_instances SET holder = $1, expires_at = $2 \
             WHERE instance_id = $3 AND expires_at < $4 AND holder <> $1",
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
