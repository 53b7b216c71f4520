//! Profile records: name, times, size of the saved state, and the instance
//! that holds it for writing back (`persist`). `name` is the name it is
//! stored under (a tenant's are `<tenant>~<name>`, see
//! [`crate::app::profiles`]), `tenant` the tenant whose key made it.

use chrono::{DateTime, Utc};
use sqlx::Row;
use sqlx::any::AnyRow;

use flotilla_api_types::InstanceId;
use flotilla_api_types::profiles::Profile;

use super::{Store, from_millis, to_millis};

const COLUMNS: &str = "name, created_at, updated_at, size_bytes, holder, engine";

/// A profile as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct ProfileRecord {
    pub profile: Profile,
    /// The instance that writes it back, if any.
    pub holder: Option<InstanceId>,
}

fn decode(row: &AnyRow) -> Result<ProfileRecord, sqlx::Error> {
    Ok(ProfileRecord {
        profile: Profile {
            name: row.try_get("name")?,
            created_at: from_millis(row.try_get("created_at")?),
            updated_at: from_millis(row.try_get("updated_at")?),
            size_bytes: row.try_get::<i64, _>("size_bytes")?.max(0) as u64,
            engine: row.try_get("engine")?,
        },
        holder: row
            .try_get::<Option<String>, _>("holder")?
            .map(InstanceId::new),
    })
}

impl Store {
    /// Creates profile `name` of `tenant`; `None` when it exists already.
    pub async fn profile_create(
        &self,
        (name, tenant): (&str, Option<&str>),
        now: DateTime<Utc>,
    ) -> Result<Option<Profile>, sqlx::Error> {
        let inserted = sqlx::query(
            "INSERT INTO profiles (name, created_at, updated_at, size_bytes, tenant) VALUES ($1, $2, $2, 0, $3) \
             ON CONFLICT (name) DO NOTHING",
        )
        .bind(name)
        .bind(to_millis(now))
        .bind(tenant.map(str::to_owned))
        .execute(&self.writer)
        .await?;
        if inserted.rows_affected() == 0 {
            return Ok(None);
        }
        Ok(self.profile_get(name).await?.map(|record| record.profile))
    }

    pub async fn profile_get(&self, name: &str) -> Result<Option<ProfileRecord>, sqlx::Error> {
        sqlx::query(&format!("SELECT {COLUMNS} FROM profiles WHERE name = $1"))
            .bind(name)
            .fetch_optional(&self.writer)
            .await?
            .as_ref()
            .map(decode)
            .transpose()
    }

    /// Every profile (only `tenant`'s, given one), by name.
    pub async fn profile_list(
        &self,
        tenant: Option<&str>,
    ) -> Result<Vec<ProfileRecord>, sqlx::Error> {
        let only = if tenant.is_some() {
            "WHERE tenant = $1 "
        } else {
            ""
        };
        let sql = format!("SELECT {COLUMNS} FROM profiles {only}ORDER BY name");
        let mut query = sqlx::query(&sql);
        if let Some(tenant) = tenant {
            query = query.bind(tenant);
        }
        query
            .fetch_all(&self.writer)
            .await?
            .iter()
            .map(decode)
            .collect()
    }

    /// Removes profile `name` unless an instance holds it: `Ok(None)` when
    /// removed or absent (`false`), `Ok(Some(holder))` when held.
    pub async fn profile_delete(
        &self,
        name: &str,
    ) -> Result<Result<bool, InstanceId>, sqlx::Error> {
        let deleted = sqlx::query("DELETE FROM profiles WHERE name = $1 AND holder IS NULL")
            .bind(name)
            .execute(&self.writer)
            .await?;
        if deleted.rows_affected() == 1 {
            return Ok(Ok(true));
        }
        Ok(match self.profile_get(name).await? {
            Some(ProfileRecord {
                holder: Some(holder),
                ..
            }) => Err(holder),
            _ => Ok(false),
        })
    }

    /// Makes `instance` the holder of profile `name` if nobody holds it; the
    /// current holder otherwise.
    pub async fn profile_hold(
        &self,
        name: &str,
        instance: &InstanceId,
    ) -> Result<Result<(), Option<InstanceId>>, sqlx::Error> {
        let held = sqlx::query(
            "UPDATE profiles SET holder = $1 WHERE name = $2 AND (holder IS NULL OR holder = $1)",
        )
        .bind(instance.as_str())
        .bind(name)
        .execute(&self.writer)
        .await?;
        if held.rows_affected() == 1 {
            return Ok(Ok(()));
        }
        Ok(Err(self
            .profile_get(name)
            .await?
            .and_then(|record| record.holder)))
    }

    /// Lets go of every profile `instance` holds.
    pub async fn profile_release(&self, instance: &InstanceId) -> Result<(), sqlx::Error> {
        sqlx::query("UPDATE profiles SET holder = NULL WHERE holder = $1")
            .bind(instance.as_str())
            .execute(&self.writer)
            .await?;
        Ok(())
    }

    /// Records a write-back of profile `name` by a browser of `engine`
    /// (unknown from older agents: the one recorded stays).
    pub async fn profile_saved(
        &self,
        name: &str,
        (size_bytes, engine): (u64, Option<&str>),
        now: DateTime<Utc>,
    ) -> Result<(), sqlx::Error> {
        sqlx::query(
            "UPDATE profiles SET updated_at = $1, size_bytes = $2, engine = COALESCE($4, engine) WHERE name = $3",
        )
            .bind(to_millis(now))
            .bind(size_bytes as i64)
            .bind(name)
            .bind(engine.map(str::to_owned))
            .execute(&self.writer)
            .await?;
        Ok(())
    }
}
