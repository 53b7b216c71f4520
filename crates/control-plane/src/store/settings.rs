//! Values shared by every control plane of a cluster, created once.

use sqlx::Row;

use super::Store;

impl Store {
    /// The value of `name`; the first caller cluster-wide stores `initial`.
    pub async fn setting_get_or_init(
        &self,
        name: &str,
        initial: &str,
    ) -> Result<String, sqlx::Error> {
        sqlx::query(
            "INSERT INTO settings (name, value) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING",
        )
        .bind(name)
        .bind(initial)
        .execute(&self.writer)
        .await?;
        sqlx::query("SELECT value FROM settings WHERE name = $1")
            .bind(name)
            .fetch_one(&self.writer)
            .await?
            .try_get("value")
    }
}
