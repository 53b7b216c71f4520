//! Alerts: raised when a monitored value crosses a threshold, cleared when it
//! falls back; each raise and clear appends its event (`alert.raised`,
//! `alert.cleared`) in the same transaction.

use chrono::{DateTime, Utc};
use sqlx::Row;
use sqlx::any::AnyRow;

use flotilla_api_types::alerts::{AlertLevel, AlertState};
use flotilla_api_types::events::EventName;
use flotilla_api_types::names::UnknownName;

use super::{Store, from_millis, to_millis};

const COLUMNS: &str = "id, scope, metric, level, value, threshold, message, raised_at, cleared_at";

/// An alert as stored: what was raised, and when.
#[derive(Debug, Clone, PartialEq)]
pub struct AlertRecord {
    pub id: String,
    pub alert: NewAlert,
    pub raised_at: DateTime<Utc>,
    pub cleared_at: Option<DateTime<Utc>>,
}

/// An alert about to be raised.
#[derive(Debug, Clone, PartialEq)]
pub struct NewAlert {
    /// `cluster` or `node:<id>`.
    pub scope: String,
    /// `cpu`, `memory`, `disk`, `offline`, `capacity`.
    pub metric: String,
    pub level: AlertLevel,
    pub value: f64,
    pub threshold: f64,
    pub message: String,
}

fn decode(row: &AnyRow) -> Result<AlertRecord, sqlx::Error> {
    let level: String = row.try_get("level")?;
    Ok(AlertRecord {
        id: row.try_get("id")?,
        alert: NewAlert {
            scope: row.try_get("scope")?,
            metric: row.try_get("metric")?,
            level: level
                .parse()
                .map_err(|e: UnknownName| sqlx::Error::Decode(e.into()))?,
            value: row.try_get("value")?,
            threshold: row.try_get("threshold")?,
            message: row.try_get("message")?,
        },
        raised_at: from_millis(row.try_get("raised_at")?),
        cleared_at: row
            .try_get::<Option<i64>, _>("cleared_at")?
            .map(from_millis),
    })
}

fn event_data(record: &AlertRecord) -> serde_json::Map<String, serde_json::Value> {
    let alert = &record.alert;
    let mut data = serde_json::Map::new();
    data.insert("alert_id".into(), record.id.as_str().into());
    data.insert("scope".into(), alert.scope.as_str().into());
    data.insert("metric".into(), alert.metric.as_str().into());
    data.insert("level".into(), alert.level.as_str().into());
    data.insert("value".into(), alert.value.into());
    data.insert("threshold".into(), alert.threshold.into());
    data.insert("message".into(), alert.message.as_str().into());
    if let Some(node) = alert.scope.strip_prefix("node:") {
        data.insert("node_id".into(), node.into());
    }
    data
}

impl Store {
    /// Alerts not cleared yet.
    pub async fn alerts_active(&self) -> Result<Vec<AlertRecord>, sqlx::Error> {
        sqlx::query(&format!(
            "SELECT {COLUMNS} FROM alerts WHERE cleared_at IS NULL ORDER BY raised_at DESC, id DESC"
        ))
        .fetch_all(&self.pool)
        .await?
        .iter()
        .map(decode)
        .collect()
    }

    /// A page of alerts in `state`, newest first, and how many there are.
    pub async fn alerts_list(
        &self,
        state: AlertState,
        limit: i64,
        offset: i64,
    ) -> Result<(Vec<AlertRecord>, i64), sqlx::Error> {
        let condition = match state {
            AlertState::Active => " WHERE cleared_at IS NULL",
            AlertState::Cleared => " WHERE cleared_at IS NOT NULL",
            AlertState::All => "",
        };
        let alerts = sqlx::query(&format!(
            "SELECT {COLUMNS} FROM alerts{condition} ORDER BY raised_at DESC, id DESC LIMIT $1 OFFSET $2"
        ))
        .bind(limit)
        .bind(offset)
        .fetch_all(&self.pool)
        .await?
        .iter()
        .map(decode)
        .collect::<Result<Vec<_>, _>>()?;
        let total = sqlx::query(&format!("SELECT COUNT(*) AS n FROM alerts{condition}"))
            .fetch_one(&self.pool)
            .await?
            .try_get("n")?;
        Ok((alerts, total))
    }

    /// Raises an alert, with its `alert.raised` event.
    pub async fn alert_raise(
        &self,
        new: NewAlert,
        now: DateTime<Utc>,
    ) -> Result<AlertRecord, sqlx::Error> {
        let alert = AlertRecord {
            id: format!("alr_{}", uuid::Uuid::now_v7().simple()),
            alert: new,
            // As stored: milliseconds.
            raised_at: from_millis(to_millis(now)),
            cleared_at: None,
        };
        let mut tx = self.write_tx().await?;
        sqlx::query(&format!(
            "INSERT INTO alerts ({COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, NULL)"
        ))
        .bind(alert.id.as_str())
        .bind(alert.alert.scope.as_str())
        .bind(alert.alert.metric.as_str())
        .bind(alert.alert.level.as_str())
        .bind(alert.alert.value)
        .bind(alert.alert.threshold)
        .bind(alert.alert.message.as_str())
        .bind(to_millis(now))
        .execute(&mut *tx)
        .await?;
        self.commit_alert_event(tx, EventName::AlertRaised, &alert, now)
            .await?;
        Ok(alert)
    }

    /// Clears an active alert, with its `alert.cleared` event. `false` if it
    /// was already cleared.
    pub async fn alert_clear(
        &self,
        alert: &AlertRecord,
        value: f64,
        now: DateTime<Utc>,
    ) -> Result<bool, sqlx::Error> {
        let mut tx = self.write_tx().await?;
        let done =
            sqlx::query("UPDATE alerts SET cleared_at = $1 WHERE id = $2 AND cleared_at IS NULL")
                .bind(to_millis(now))
                .bind(alert.id.as_str())
                .execute(&mut *tx)
                .await?;
        if done.rows_affected() == 0 {
            return Ok(false);
        }
        let mut cleared = alert.clone();
        cleared.alert.value = value;
        cleared.cleared_at = Some(now);
        self.commit_alert_event(tx, EventName::AlertCleared, &cleared, now)
            .await?;
        Ok(true)
    }

    /// Appends the alert's event (subject `alert:<scope>:<metric>`, so raises
    /// and clears of one condition stay in order) and commits.
    async fn commit_alert_event(
        &self,
        mut tx: sqlx::Transaction<'static, sqlx::Any>,
        name: EventName,
        alert: &AlertRecord,
        now: DateTime<Utc>,
    ) -> Result<(), sqlx::Error> {
        let subject = format!("alert:{}:{}", alert.alert.scope, alert.alert.metric);
        self.append_event(&mut tx, (name, &subject, None), event_data(alert), now)
            .await?;
        tx.commit().await?;
        self.events_committed();
        Ok(())
    }
}
