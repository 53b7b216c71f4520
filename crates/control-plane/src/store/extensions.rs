//! Extension records: id, name and version from the manifest, the zip's size.
//! The zips themselves live in the snapshot store.

use sqlx::Row;
use sqlx::any::AnyRow;

use flotilla_api_types::InstanceId;
use flotilla_api_types::extensions::Extension;

use super::{Store, from_millis, to_millis};

const COLUMNS: &str = "id, name, version, size_bytes, created_at";

fn decode(row: &AnyRow) -> Result<Extension, sqlx::Error> {
    Ok(Extension {
        id: row.try_get("id")?,
        name: row.try_get("name")?,
        version: row.try_get("version")?,
        size_bytes: row.try_get::<i64, _>("size_bytes")?.max(0) as u64,
        created_at: from_millis(row.try_get("created_at")?),
    })
}

/// What `instances.extensions` (a JSON array of ids) holds when it names `id`.
/// Callers pass well-formed ids only (hex digits and `-`: no LIKE wildcard).
fn used_pattern(id: &str) -> String {
    debug_assert!(flotilla_api_types::extensions::is_extension_id(id));
    format!("%\"{id}\"%")
}

impl Store {
    pub async fn extension_insert(&self, extension: &Extension) -> Result<(), sqlx::Error> {
        sqlx::query(
            "INSERT INTO extensions (id, name, version, size_bytes, created_at) VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(&extension.id)
        .bind(&extension.name)
        .bind(&extension.version)
        .bind(extension.size_bytes as i64)
        .bind(to_millis(extension.created_at))
        .execute(&self.writer)
        .await?;
        Ok(())
    }

    pub async fn extension_get(&self, id: &str) -> Result<Option<Extension>, sqlx::Error> {
        Self::row_by_id(&self.writer, ("extensions", COLUMNS), id, decode).await
    }

    /// Every extension, oldest first.
    pub async fn extension_list(&self) -> Result<Vec<Extension>, sqlx::Error> {
        sqlx::query(&format!(
            "SELECT {COLUMNS} FROM extensions ORDER BY created_at, id"
        ))
        .fetch_all(&self.writer)
        .await?
        .iter()
        .map(decode)
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

    /// Which of `ids` are not extensions here.
    pub async fn extensions_missing(&self, ids: &[String]) -> Result<Vec<String>, sqlx::Error> {
        let mut missing = Vec::new();
        for id in ids {
            if self.extension_get(id).await?.is_none() {
                missing.push(id.clone());
            }
        }
        Ok(missing)
    }
}
