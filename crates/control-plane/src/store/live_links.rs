//! Live link records: which instance a link opens, in which mode, until when,
//! whether it was revoked, and whether its person handed the browser back.

use chrono::{DateTime, Utc};
use sqlx::Row;
use sqlx::any::AnyRow;

use flotilla_api_types::InstanceId;
use flotilla_api_types::live::LiveMode;

use super::{Store, from_millis, to_millis};

const COLUMNS: &str = "id, instance_id, mode, created_at, expires_at, revoked_at, handed_back_at";

/// A live link as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct LiveLinkRecord {
    pub id: String,
    pub instance_id: InstanceId,
    pub mode: LiveMode,
    pub created_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    pub revoked_at: Option<DateTime<Utc>>,
    /// When its person handed the browser back (control links).
    pub handed_back_at: Option<DateTime<Utc>>,
}

fn decode(row: &AnyRow) -> Result<LiveLinkRecord, sqlx::Error> {
    let mode: String = row.try_get("mode")?;
    Ok(LiveLinkRecord {
        id: row.try_get("id")?,
        instance_id: InstanceId::new(row.try_get::<String, _>("instance_id")?),
        mode: LiveMode::parse(&mode).ok_or_else(|| sqlx::Error::Decode(mode.into()))?,
        created_at: from_millis(row.try_get("created_at")?),
        expires_at: from_millis(row.try_get("expires_at")?),
        revoked_at: row
            .try_get::<Option<i64>, _>("revoked_at")?
            .map(from_millis),
        handed_back_at: row
            .try_get::<Option<i64>, _>("handed_back_at")?
            .map(from_millis),
    })
}

impl Store {
    pub async fn live_link_insert(&self, link: &LiveLinkRecord) -> Result<(), sqlx::Error> {
        sqlx::query(
            "INSERT INTO live_links (id, instance_id, mode, created_at, expires_at) \
             VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(&link.id)
        .bind(link.instance_id.as_str())
        .bind(link.mode.as_str())
        .bind(to_millis(link.created_at))
        .bind(to_millis(link.expires_at))
        .execute(&self.writer)
        .await?;
        Ok(())
    }

    pub async fn live_link_get(&self, id: &str) -> Result<Option<LiveLinkRecord>, sqlx::Error> {
        Self::row_by_id(&self.writer, ("live_links", COLUMNS), id, decode).await
    }

    /// Records that link `id`'s person handed the browser back, and ends the
    /// link; answers whether it was still in force.
    pub async fn live_link_hand_back(
        &self,
        id: &str,
        now: DateTime<Utc>,
    ) -> Result<bool, sqlx::Error> {
        let done = sqlx::query(
            "UPDATE live_links SET handed_back_at = $1, revoked_at = $1 \
             WHERE id = $2 AND revoked_at IS NULL",
        )
        .bind(to_millis(now))
        .bind(id)
        .execute(&self.writer)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Revokes one link of `instance` (`Some(id)`) or all of them; answers
    /// how many were still in force.
    pub async fn live_link_revoke(
        &self,
        instance: &InstanceId,
        id: Option<&str>,
        now: DateTime<Utc>,
    ) -> Result<u64, sqlx::Error> {
        let revoked = match id {
            Some(id) => sqlx::query(
                "UPDATE live_links SET revoked_at = $1 \
                 WHERE instance_id = $2 AND id = $3 AND revoked_at IS NULL",
            )
            .bind(to_millis(now))
            .bind(instance.as_str())
            .bind(id)
            .execute(&self.writer)
            .await?,
            None => sqlx::query(
                "UPDATE live_links SET revoked_at = $1 WHERE instance_id = $2 AND revoked_at IS NULL",
            )
            .bind(to_millis(now))
            .bind(instance.as_str())
            .execute(&self.writer)
            .await?,
        };
        Ok(revoked.rows_affected())
    }
}
