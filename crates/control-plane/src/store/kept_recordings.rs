//! Who owns kept recordings: the tenant of the instance they were recorded
//! in, written with that instance's record when it keeps its recordings
//! (the recordings themselves, and their descriptions, live in the
//! snapshot store). An admin's instance leaves no row: its recordings are
//! the admins'.

use sqlx::Row;

use super::Store;

impl Store {
    /// The tenant that owns the kept recordings of instance `instance_id`
    /// (`None`: an admin's).
    pub async fn kept_recordings_owner(
        &self,
        instance_id: &str,
    ) -> Result<Option<String>, sqlx::Error> {
        sqlx::query("SELECT tenant FROM kept_recording_owners WHERE instance_id = $1")
            .bind(instance_id)
            .fetch_optional(&self.writer)
            .await?
            .map(|row| row.try_get("tenant"))
            .transpose()
    }

    /// The instances whose kept recordings `tenant` owns.
    pub async fn kept_recordings_of_tenant(
        &self,
        tenant: &str,
    ) -> Result<Vec<String>, sqlx::Error> {
        sqlx::query("SELECT instance_id FROM kept_recording_owners WHERE tenant = $1")
            .bind(tenant)
            .fetch_all(&self.writer)
            .await?
            .iter()
            .map(|row| row.try_get("instance_id"))
            .collect()
    }
}
