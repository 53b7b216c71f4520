//! Drains ([`crate::app::drain`]): each node's latest drain and its report,
//! written by the control plane running it (the holder of its lease) and
//! read by every control plane of the cluster.

use chrono::{DateTime, Utc};
use sqlx::Row;
use sqlx::any::AnyRow;

use flotilla_api_types::NodeId;
use flotilla_api_types::nodes::DrainReport;

use super::{Store, to_millis};

/// A drain as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct DrainRecord {
    pub report: DrainReport,
    /// It lasts until the node's agent restarts (`drain_on_shutdown`).
    pub until_restart: bool,
}

fn decode(row: &AnyRow) -> Result<DrainRecord, sqlx::Error> {
    let report: String = row.try_get("report")?;
    Ok(DrainRecord {
        report: serde_json::from_str(&report).map_err(|error| sqlx::Error::Decode(error.into()))?,
        until_restart: row.try_get::<i64, _>("until_restart")? != 0,
    })
}

fn encode(report: &DrainReport) -> String {
    serde_json::to_string(report).expect("a drain report serialises")
}

impl Store {
    /// Records a new drain of its node, in place of the node's last one if
    /// that one finished or is the one started at `ending` (ended, its
    /// runner stopping: its further writes are refused); `false` when
    /// another is under way (its report stands).
    pub async fn drain_begin(
        &self,
        drain: &DrainRecord,
        ending: Option<DateTime<Utc>>,
    ) -> Result<bool, sqlx::Error> {
        let done = sqlx::query(
            "INSERT INTO drains (node_id, report, until_restart, finished, started_at) \
             VALUES ($1, $2, $3, $4, $5) \
             ON CONFLICT (node_id) DO UPDATE SET report = excluded.report, \
             until_restart = excluded.until_restart, finished = excluded.finished, \
             started_at = excluded.started_at \
             WHERE drains.finished = 1 OR drains.started_at = $6",
        )
        .bind(drain.report.node_id.as_str())
        .bind(encode(&drain.report))
        .bind(i64::from(drain.until_restart))
        .bind(i64::from(drain.report.finished))
        .bind(to_millis(drain.report.started_at))
        .bind(ending.map_or(-1, to_millis))
        .execute(&self.writer)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Writes a drain's report as it stands now, if that drain is still
    /// the node's and `holder` still holds its lease (`lease`) at `now`;
    /// `false` otherwise (another control plane took it over).
    pub async fn drain_report(
        &self,
        report: &DrainReport,
        (lease, holder): (&str, &str),
        now: DateTime<Utc>,
    ) -> Result<bool, sqlx::Error> {
        let done = sqlx::query(
            "UPDATE drains SET report = $1, finished = $2 \
             WHERE node_id = $3 AND started_at = $4 AND EXISTS \
             (SELECT 1 FROM leases WHERE name = $5 AND holder = $6 AND expires_at >= $7)",
        )
        .bind(encode(report))
        .bind(i64::from(report.finished))
        .bind(report.node_id.as_str())
        .bind(to_millis(report.started_at))
        .bind(lease)
        .bind(holder)
        .bind(to_millis(now))
        .execute(&self.writer)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Node `node`'s latest drain.
    pub async fn drain_get(&self, node: &NodeId) -> Result<Option<DrainRecord>, sqlx::Error> {
        sqlx::query("SELECT report, until_restart FROM drains WHERE node_id = $1")
            .bind(node.as_str())
            .fetch_optional(&self.writer)
            .await?
            .as_ref()
            .map(decode)
            .transpose()
    }

    /// The drains that have not finished.
    pub async fn drains_unfinished(&self) -> Result<Vec<DrainRecord>, sqlx::Error> {
        sqlx::query("SELECT report, until_restart FROM drains WHERE finished = 0")
            .fetch_all(&self.writer)
            .await?
            .iter()
            .map(decode)
            .collect()
    }
}
