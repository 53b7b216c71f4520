//! Extension records: id, name and version from the manifest, the zip's size.
//! The zips themselves live in the snapshot store. `tenant` is the tenant
//! whose key uploaded it (`NULL`: an admin's).

use sqlx::Row;
use sqlx::any::AnyRow;

use flotilla_api_types::InstanceId;
use flotilla_api_types::extensions::Extension;

use super::{Store, from_millis, to_millis};

const COLUMNS: &str = "id, name, version, size_bytes, created_at, tenant";

/// An extension and the tenant that uploaded it.
pub type Owned = (Extension, Option<String>);

fn decode(row: &AnyRow) -> Result<Owned, sqlx::Error> {
    let extension = Extension {
        id: row.try_get("id")?,
        name: row.try_get("name")?,
        version: row.try_get("version")?,
        size_bytes: row.try_get::<i64, _>("size_bytes")?.max(0) as u64,
        created_at: from_millis(row.try_get("created_at")?),
    };
    Ok((extension, row.try_get("tenant")?))
}

/// What `instances.extensions` (a JSON array of ids) holds when it names `id`.
/// Callers pass well-formed ids only (hex digits and `-`: no LIKE wildcard).
fn used_pattern(id: &str) -> String {
    debug_assert!(flotilla_api_types::extensions::is_extension_id(id));
    format!("%\"{id}\"%")
}

impl Store {
    pub async fn extension_insert(
        &self,
        extension: &Extension,
        tenant: Option<&str>,
    ) -> Result<(), sqlx::Error> {
        sqlx::query(
            "INSERT INTO extensions (id, name, version, size_bytes, created_at, tenant) VALUES ($1, $2, $3, $4, $5, $6)",
        )
        .bind(&extension.id)
        .bind(&extension.name)
        .bind(&extension.version)
        .bind(extension.size_bytes as i64)
        .bind(to_millis(extension.created_at))
        .bind(tenant.map(str::to_owned))
        .execute(&self.writer)
        .await?;
        Ok(())
    }

    pub async fn extension_get(&self, id: &str) -> Result<Option<Owned>, sqlx::Error> {
        Self::row_by_id(&self.writer, ("extensions", COLUMNS), id, decode).await
    }

    /// Every extension (only `tenant`'s, given one), oldest first.
    pub async fn extension_list(
        &self,
        tenant: Option<&str>,
    ) -> Result<Vec<Extension>, sqlx::Error> {
        let only = if tenant.is_some() {
            "WHERE tenant = $1 "
        } else {
            ""
        };
        let sql = format!("SELECT {COLUMNS} FROM extensions {only}ORDER BY created_at, id");
        let mut query = sqlx::query(&sql);
        if let Some(tenant) = tenant {
            query = query.bind(tenant);
        }
        query
            .fetch_all(&self.writer)
            .await?
            .iter()
            .map(|row| decode(row).map(|(extension, _)| extension))
            .collect()
    }

    /// Removes extension `id` unless an instance loads it: `Ok(removed)`, or
    /// `Err(instance)` naming one that loads it.
    pub async fn extension_delete(
        &self,
        id: &str,
    ) -> Result<Result<bool, InstanceId>, sqlx::Error> {
        let deleted = sqlx::query(
            "DELETE FROM extensions WHERE id = $1 \
             AND NOT EXISTS (SELECT 1 FROM instances WHERE extensions LIKE $2)",
        )
        .bind(id)
        .bind(used_pattern(id))
        .execute(&self.writer)
        .await?;
        if deleted.rows_affected() == 1 {
            return Ok(Ok(true));
        }
        let user = sqlx::query("SELECT id FROM instances WHERE extensions LIKE $1 LIMIT 1")
            .bind(used_pattern(id))
            .fetch_optional(&self.writer)
            .await?;
        Ok(match user {
            Some(row) => Err(InstanceId::new(row.try_get::<String, _>("id")?)),
            None => Ok(false),
        })
    }

    /// Which of `ids` are not extensions of `tenant` (`None`: an admin's).
    /// An admin's instance loads no tenant's upload, as it starts from no
    /// tenant's profile: a tenant's code does not run in an admin's browser.
    pub async fn extensions_missing(
        &self,
        ids: &[String],
        tenant: Option<&str>,
    ) -> Result<Vec<String>, sqlx::Error> {
        let mut missing = Vec::new();
        for id in ids {
            let visible = match self.extension_get(id).await? {
                Some((_, owner)) => owner.as_deref() == tenant,
                None => false,
            };
            if !visible {
                missing.push(id.clone());
            }
        }
        Ok(missing)
    }
}
