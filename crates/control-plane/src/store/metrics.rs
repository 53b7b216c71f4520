//! Resource samples, per node and for the cluster (node id `""`), kept for the
//! history of `GET /v2/metrics`.

use chrono::{DateTime, Utc};
use sqlx::Row;

use super::{Store, from_millis, to_millis};

/// One sample of one node (or of the cluster, `node_id == ""`).
#[derive(Debug, Clone, PartialEq)]
pub struct MetricSample {
    pub node_id: String,
    pub at: DateTime<Utc>,
    pub cpu_percent: f64,
    pub memory_percent: f64,
    pub disk_percent: f64,
    pub instances: i64,
}

impl Store {
    /// Stores samples; a second sample for the same node and millisecond replaces nothing.
    pub async fn metric_samples_insert(&self, samples: &[MetricSample]) -> Result<(), sqlx::Error> {
        let mut tx = self.write_tx().await?;
        for sample in samples {
            sqlx::query(
                "INSERT INTO metric_samples (node_id, at, cpu_percent, memory_percent, disk_percent, instances) \
                 VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (node_id, at) DO NOTHING",
            )
            .bind(sample.node_id.as_str())
            .bind(to_millis(sample.at))
            .bind(sample.cpu_percent)
            .bind(sample.memory_percent)
            .bind(sample.disk_percent)
            .bind(sample.instances)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await
    }

    /// Samples of `node_id` taken at or after `since`, oldest first.
    pub async fn metric_samples_since(
        &self,
        node_id: &str,
        since: DateTime<Utc>,
    ) -> Result<Vec<MetricSample>, sqlx::Error> {
        sqlx::query(
            "SELECT node_id, at, cpu_percent, memory_percent, disk_percent, instances FROM metric_samples \
             WHERE node_id = $1 AND at >= $2 ORDER BY at",
        )
        .bind(node_id)
        .bind(to_millis(since))
        .fetch_all(&self.pool)
        .await?
        .iter()
        .map(|row| {
            Ok(MetricSample {
                node_id: row.try_get("node_id")?,
                at: from_millis(row.try_get("at")?),
                cpu_percent: row.try_get("cpu_percent")?,
                memory_percent: row.try_get("memory_percent")?,
                disk_percent: row.try_get("disk_percent")?,
                instances: row.try_get("instances")?,
            })
        })
        .collect()
    }

    /// Deletes samples older than `before`.
    pub async fn metric_samples_prune(&self, before: DateTime<Utc>) -> Result<u64, sqlx::Error> {
        Ok(sqlx::query("DELETE FROM metric_samples WHERE at < $1")
            .bind(to_millis(before))
            .execute(&self.writer)
            .await?
            .rows_affected())
    }
}
