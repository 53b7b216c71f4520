//! The event log and its outbox (DESIGN.md: "durable outbox in the store").
//!
//! A lifecycle change and its event are written in one transaction: the event
//! row, numbered per subject (an instance, a node or an alert), and one
//! delivery row per target that wants it (a webhook URL, the event proxy). The
//! dispatcher ([`crate::app::outbox`]) takes only the oldest undelivered event
//! of each (target, subject), so the events of one instance arrive in order
//! while a slow instance or receiver holds up nobody else, and deletes a row
//! once its target has it. Nothing is lost across restarts: an event exists
//! exactly when the change it announces was committed.

use std::collections::HashSet;
use std::sync::{Arc, RwLock};

use chrono::{DateTime, Utc};
use sqlx::{AnyConnection, Row};
use tokio::sync::watch;

use flotilla_api_types::events::{EventName, EventPayload};
use flotilla_api_types::names::UnknownName;

use super::{Store, from_millis, to_millis};

/// Where events go: a target name and the events it wants (`None`: all).
#[derive(Debug, Clone)]
pub struct EventRoute {
    pub target: String,
    pub events: Option<HashSet<EventName>>,
}

impl EventRoute {
    fn wants(&self, name: EventName) -> bool {
        self.events
            .as_ref()
            .is_none_or(|events| events.contains(&name))
    }
}

/// The routes and the dispatcher's wake-up, shared by every clone of the store.
pub(super) struct Outbox {
    routes: RwLock<Arc<Vec<EventRoute>>>,
    /// Counts commits that appended events; dispatchers watch it.
    signal: watch::Sender<u64>,
}

impl Default for Outbox {
    fn default() -> Self {
        Self {
            routes: RwLock::default(),
            signal: watch::Sender::new(0),
        }
    }
}

/// One undelivered event for one target.
#[derive(Debug, Clone)]
pub struct Delivery {
    pub target: String,
    pub subject: String,
    pub seq: i64,
    pub event_id: String,
    pub name: EventName,
    /// The tenant of the instance it is about, if any.
    pub tenant: Option<String>,
    /// The JSON body, as stored.
    pub payload: String,
    pub attempts: i64,
    pub created_at: DateTime<Utc>,
}

impl Store {
    /// Sets where events go from now on (at start, before any change).
    pub fn set_event_routes(&self, routes: Vec<EventRoute>) {
        *self.outbox.routes.write().expect("routes lock") = Arc::new(routes);
    }

    /// Changes after every commit that appended events.
    pub fn outbox_signal(&self) -> watch::Receiver<u64> {
        self.outbox.signal.subscribe()
    }

    /// Records an event in the caller's transaction, with a delivery row for
    /// each interested target; `tenant` is the tenant of the instance it is
    /// about (`None`: an admin's, a node's or an alert's). The caller calls
    /// [`Store::events_committed`] after its commit.
    pub(crate) async fn append_event(
        &self,
        tx: &mut AnyConnection,
        (name, subject, tenant): (EventName, &str, Option<&str>),
        data: serde_json::Map<String, serde_json::Value>,
        now: DateTime<Utc>,
    ) -> Result<(), sqlx::Error> {
        let seq: i64 =
            sqlx::query("SELECT COALESCE(MAX(seq), 0) + 1 AS next FROM events WHERE subject = $1")
                .bind(subject)
                .fetch_one(&mut *tx)
                .await?
                .try_get("next")?;
        let id = format!("evt_{}", uuid::Uuid::now_v7().simple());
        let payload = serde_json::to_string(&EventPayload::new(name, now, data))
            .expect("an event payload serialises");
        let at = to_millis(now);
        sqlx::query(
            "INSERT INTO events (id, name, subject, seq, payload, created_at, tenant) VALUES ($1, $2, $3, $4, $5, $6, $7)",
        )
        .bind(id.as_str())
        .bind(name.as_str())
        .bind(subject)
        .bind(seq)
        .bind(payload.as_str())
        .bind(at)
        .bind(tenant.map(str::to_owned))
        .execute(&mut *tx)
        .await?;
        let routes = self.outbox.routes.read().expect("routes lock").clone();
        for route in routes.iter().filter(|route| route.wants(name)) {
            sqlx::query(
                "INSERT INTO deliveries (target, subject, seq, event_id, attempts, next_attempt_at, created_at) \
                 VALUES ($1, $2, $3, $4, 0, $5, $5)",
            )
            .bind(route.target.as_str())
            .bind(subject)
            .bind(seq)
            .bind(id.as_str())
            .bind(at)
            .execute(&mut *tx)
            .await?;
        }
        Ok(())
    }

    /// Wakes the dispatcher after a commit that appended events.
    pub(crate) fn events_committed(&self) {
        self.outbox.signal.send_modify(|commits| *commits += 1);
    }

    /// Up to `limit` deliveries for `target` that are due and first in line
    /// for their subject, in the order they fell due (an index walk: the
    /// cost does not grow with the backlog).
    pub async fn deliveries_due(
        &self,
        target: &str,
        now: DateTime<Utc>,
        limit: i64,
    ) -> Result<Vec<Delivery>, sqlx::Error> {
        let rows = sqlx::query(
            "SELECT d.target, d.subject, d.seq, d.event_id, d.attempts, d.created_at, e.name, e.payload, e.tenant \
             FROM deliveries d JOIN events e ON e.id = d.event_id \
             WHERE d.target = $1 AND d.next_attempt_at <= $2 AND NOT EXISTS ( \
               SELECT 1 FROM deliveries p WHERE p.target = d.target AND p.subject = d.subject AND p.seq < d.seq) \
             ORDER BY d.next_attempt_at, d.subject, d.seq LIMIT $3",
        )
        .bind(target)
        .bind(to_millis(now))
        .bind(limit)
        .fetch_all(&self.writer)
        .await?;
        rows.iter()
            .map(|row| {
                let name: String = row.try_get("name")?;
                Ok(Delivery {
                    target: row.try_get("target")?,
                    subject: row.try_get("subject")?,
                    seq: row.try_get("seq")?,
                    event_id: row.try_get("event_id")?,
                    name: name
                        .parse()
                        .map_err(|e: UnknownName| sqlx::Error::Decode(e.into()))?,
                    tenant: row.try_get("tenant")?,
                    payload: row.try_get("payload")?,
                    attempts: row.try_get("attempts")?,
                    created_at: from_millis(row.try_get("created_at")?),
                })
            })
            .collect()
    }

    /// When the next delivery for `target` falls due, if any is waiting.
    pub async fn delivery_next_due(
        &self,
        target: &str,
    ) -> Result<Option<DateTime<Utc>>, sqlx::Error> {
        // Only heads count: a later event of a subject whose head waits for a
        // retry is not due before that head.
        let next: Option<i64> =
            sqlx::query("SELECT MIN(d.next_attempt_at) AS next FROM deliveries d WHERE d.target = $1 AND NOT EXISTS ( \
               SELECT 1 FROM deliveries p WHERE p.target = d.target AND p.subject = d.subject AND p.seq < d.seq)")
                .bind(target)
                .fetch_one(&self.writer)
                .await?
                .try_get("next")?;
        Ok(next.map(from_millis))
    }

    /// Removes delivered rows.
    pub async fn deliveries_done(&self, delivered: &[&Delivery]) -> Result<(), sqlx::Error> {
        if delivered.is_empty() {
            return Ok(());
        }
        let mut tx = self.write_tx().await?;
        for delivery in delivered {
            sqlx::query("DELETE FROM deliveries WHERE target = $1 AND subject = $2 AND seq = $3")
                .bind(delivery.target.as_str())
                .bind(delivery.subject.as_str())
                .bind(delivery.seq)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await
    }

    /// Records a failed attempt and when to try again.
    pub async fn delivery_retry_at(
        &self,
        delivery: &Delivery,
        next_attempt: DateTime<Utc>,
        error: &str,
    ) -> Result<(), sqlx::Error> {
        sqlx::query(
            "UPDATE deliveries SET attempts = attempts + 1, next_attempt_at = $1, last_error = $2 \
             WHERE target = $3 AND subject = $4 AND seq = $5",
        )
        .bind(to_millis(next_attempt))
        .bind(error)
        .bind(delivery.target.as_str())
        .bind(delivery.subject.as_str())
        .bind(delivery.seq)
        .execute(&self.writer)
        .await?;
        Ok(())
    }

    /// Undelivered rows, all targets.
    pub async fn outbox_depth(&self) -> Result<i64, sqlx::Error> {
        sqlx::query("SELECT COUNT(*) AS n FROM deliveries")
            .fetch_one(&self.pool)
            .await?
            .try_get("n")
    }

    /// Drops the deliveries of targets that are no longer configured.
    pub async fn deliveries_keep_only(&self, targets: &[String]) -> Result<u64, sqlx::Error> {
        let mut dropped = 0;
        let existing: Vec<String> = sqlx::query("SELECT DISTINCT target FROM deliveries")
            .fetch_all(&self.writer)
            .await?
            .iter()
            .map(|row| row.try_get("target"))
            .collect::<Result<_, _>>()?;
        for target in existing.iter().filter(|t| !targets.contains(t)) {
            dropped += sqlx::query("DELETE FROM deliveries WHERE target = $1")
                .bind(target.as_str())
                .execute(&self.writer)
                .await?
                .rows_affected();
        }
        Ok(dropped)
    }

    /// Deletes events older than `before` that no target still waits for.
    pub async fn events_prune(&self, before: DateTime<Utc>) -> Result<u64, sqlx::Error> {
        Ok(sqlx::query(
            "DELETE FROM events WHERE created_at < $1 AND NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.event_id = events.id)",
        )
        .bind(to_millis(before))
        .execute(&self.writer)
        .await?
        .rows_affected())
    }

    /// The events of one subject, in order (payload JSON), for tests and audits.
    pub async fn events_of(&self, subject: &str) -> Result<Vec<String>, sqlx::Error> {
        sqlx::query("SELECT payload FROM events WHERE subject = $1 ORDER BY seq")
            .bind(subject)
            .fetch_all(&self.pool)
            .await?
            .iter()
            .map(|row| row.try_get("payload"))
            .collect()
    }
}
