//! Node records.

use chrono::{DateTime, Utc};
use sqlx::Row;
use sqlx::any::AnyRow;

use flotilla_api_types::NodeId;
use flotilla_api_types::agent::NodeRegistration;
use flotilla_api_types::events::EventName;
use flotilla_api_types::nodes::{Capabilities, NodeStatus, ResourceUsage};

use super::{Store, from_millis, to_millis};

const COLUMNS: &str = "id, address, public_host, status, max_instances, cpu_cores, memory_gb, disk_gb, images, \
    cpu_percent, memory_percent, disk_percent, last_heartbeat, registered_at, warnings, load_cpu_percent, load_memory_percent, \
    generation, browser_version, protocol_version, draining, snapshot_store";

/// A node as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeRecord {
    pub id: NodeId,
    pub address: String,
    pub public_host: String,
    pub status: NodeStatus,
    pub max_instances: i64,
    pub capabilities: Capabilities,
    pub images: Vec<String>,
    pub resources: ResourceUsage,
    pub last_heartbeat: DateTime<Utc>,
    pub registered_at: DateTime<Utc>,
    /// Why the node runs with less isolation than configured.
    pub warnings: Vec<String>,
    /// Utilisation averaged over about a minute (CPU and memory; disk as sampled).
    pub load: ResourceUsage,
    /// The process generation of the agent that registered it last.
    pub generation: String,
    /// Its Chromium's version, when it runs real browsers.
    pub browser_version: Option<String>,
    /// The protocol version its agent speaks (`""`: from before the field).
    pub protocol_version: String,
    /// Being drained: it takes no new instance (`POST /v2/nodes/{id}/drain`).
    pub draining: bool,
    /// Its agent's snapshot store (see `NodeRegistration::snapshot_store`).
    pub snapshot_store: String,
}

fn decode(row: &AnyRow) -> Result<NodeRecord, sqlx::Error> {
    let status: String = row.try_get("status")?;
    let images: String = row.try_get("images")?;
    let warnings: String = row.try_get("warnings")?;
    Ok(NodeRecord {
        id: NodeId::new(row.try_get::<String, _>("id")?),
        address: row.try_get("address")?,
        public_host: row.try_get("public_host")?,
        status: if status == NodeStatus::Online.as_str() {
            NodeStatus::Online
        } else {
            NodeStatus::Offline
        },
        max_instances: row.try_get("max_instances")?,
        capabilities: Capabilities {
            cpu_cores: row.try_get("cpu_cores")?,
            memory_gb: row.try_get("memory_gb")?,
            disk_gb: row.try_get("disk_gb")?,
        },
        images: serde_json::from_str(&images).map_err(|e| sqlx::Error::Decode(e.into()))?,
        resources: ResourceUsage {
            cpu_percent: row.try_get("cpu_percent")?,
            memory_percent: row.try_get("memory_percent")?,
            disk_percent: row.try_get("disk_percent")?,
        },
        last_heartbeat: from_millis(row.try_get("last_heartbeat")?),
        registered_at: from_millis(row.try_get("registered_at")?),
        warnings: serde_json::from_str(&warnings).map_err(|e| sqlx::Error::Decode(e.into()))?,
        load: ResourceUsage {
            cpu_percent: row.try_get("load_cpu_percent")?,
            memory_percent: row.try_get("load_memory_percent")?,
            disk_percent: row.try_get("disk_percent")?,
        },
        generation: row.try_get("generation")?,
        browser_version: row.try_get("browser_version")?,
        protocol_version: row.try_get("protocol_version")?,
        draining: row.try_get::<i64, _>("draining")? != 0,
        snapshot_store: row.try_get("snapshot_store")?,
    })
}

fn node_event_data(
    node: &NodeId,
    status: NodeStatus,
) -> serde_json::Map<String, serde_json::Value> {
    let mut data = serde_json::Map::new();
    data.insert("node_id".into(), node.as_str().into());
    data.insert("status".into(), status.as_str().into());
    data
}

impl Store {
    /// Creates or refreshes a node from its registration; it is `online` now.
    pub async fn node_upsert(
        &self,
        registration: &NodeRegistration,
        now: DateTime<Utc>,
    ) -> Result<(), sqlx::Error> {
        let images =
            serde_json::to_string(&registration.images).expect("a list of strings serialises");
        let warnings =
            serde_json::to_string(&registration.warnings).expect("a list of strings serialises");
        let mut tx = self.write_tx().await?;
        let previous: Option<String> = sqlx::query(&format!(
            "SELECT status FROM nodes WHERE id = $1{}",
            self.for_update()
        ))
        .bind(registration.node_id.as_str())
        .fetch_optional(&mut *tx)
        .await?
        .map(|row| row.try_get("status"))
        .transpose()?;
        if previous.as_deref() != Some(NodeStatus::Online.as_str()) {
            self.append_event(
                &mut tx,
                (EventName::NodeOnline, registration.node_id.as_str(), None),
                node_event_data(&registration.node_id, NodeStatus::Online),
                now,
            )
            .await?;
        }
        sqlx::query(&format!(
            "INSERT INTO nodes ({COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $13, $14, $15, $16, $17, $18, $19, 0, $20) \
             ON CONFLICT (id) DO UPDATE SET address = excluded.address, public_host = excluded.public_host, \
             status = excluded.status, max_instances = excluded.max_instances, cpu_cores = excluded.cpu_cores, \
             memory_gb = excluded.memory_gb, disk_gb = excluded.disk_gb, images = excluded.images, \
             cpu_percent = excluded.cpu_percent, memory_percent = excluded.memory_percent, \
             disk_percent = excluded.disk_percent, last_heartbeat = excluded.last_heartbeat, \
             warnings = excluded.warnings, load_cpu_percent = excluded.load_cpu_percent, \
             load_memory_percent = excluded.load_memory_percent, generation = excluded.generation, \
             browser_version = excluded.browser_version, protocol_version = excluded.protocol_version, \
             snapshot_store = excluded.snapshot_store, \
             draining = CASE WHEN nodes.drain_ends_with_generation NOT IN ('', excluded.generation) \
                 THEN 0 ELSE nodes.draining END, \
             drain_ends_with_generation = CASE WHEN nodes.drain_ends_with_generation NOT IN ('', excluded.generation) \
                 THEN '' ELSE nodes.drain_ends_with_generation END"
        ))
        .bind(registration.node_id.as_str())
        .bind(registration.address.as_str())
        .bind(registration.public_host.as_str())
        .bind(NodeStatus::Online.as_str())
        .bind(registration.max_instances)
        .bind(registration.capabilities.cpu_cores)
        .bind(registration.capabilities.memory_gb)
        .bind(registration.capabilities.disk_gb)
        .bind(images.as_str())
        .bind(registration.resources.cpu_percent)
        .bind(registration.resources.memory_percent)
        .bind(registration.resources.disk_percent)
        .bind(to_millis(now))
        .bind(warnings.as_str())
        .bind(registration.load.cpu_percent)
        .bind(registration.load.memory_percent)
        .bind(registration.generation.as_str())
        .bind(registration.browser_version.clone())
        .bind(registration.protocol_version.as_str())
        .bind(registration.snapshot_store.as_str())
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        self.events_committed();
        Ok(())
    }

    /// Marks node `id` draining (it takes no new instance) or not; `false`
    /// when there is no such node. A registration leaves the mark as it is,
    /// unless `until_restart`: then the first agent of another generation
    /// than the one registered now (a restarted agent) clears it.
    pub async fn node_set_draining(
        &self,
        id: &NodeId,
        draining: bool,
        until_restart: bool,
    ) -> sqlx::Result<bool> {
        let done = sqlx::query(
            "UPDATE nodes SET draining = $1, \
             drain_ends_with_generation = CASE WHEN $2 = 1 THEN generation ELSE '' END WHERE id = $3",
        )
        .bind(i64::from(draining))
        .bind(i64::from(draining && until_restart))
        .bind(id.as_str())
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected() > 0)
    }

    /// Records a heartbeat of the agent of `generation`. Returns the node's
    /// previous status, or `None` when the node is unknown or registered by
    /// another agent process (the sender must register first).
    pub async fn node_heartbeat(
        &self,
        node: &NodeId,
        generation: &str,
        resources: &ResourceUsage,
        load: &ResourceUsage,
        now: DateTime<Utc>,
    ) -> Result<Option<NodeStatus>, sqlx::Error> {
        let Some(previous) = self.node_get(node).await? else {
            return Ok(None);
        };
        if previous.generation != generation {
            return Ok(None);
        }
        if previous.status == NodeStatus::Offline {
            // It comes back through registration, which reconciles its instances.
            return Ok(Some(previous.status));
        }
        sqlx::query(
            "UPDATE nodes SET status = $1, cpu_percent = $2, memory_percent = $3, disk_percent = $4, last_heartbeat = $5, \
             load_cpu_percent = $7, load_memory_percent = $8 WHERE id = $6",
        )
        .bind(NodeStatus::Online.as_str())
        .bind(resources.cpu_percent)
        .bind(resources.memory_percent)
        .bind(resources.disk_percent)
        .bind(to_millis(now))
        .bind(node.as_str())
        .bind(load.cpu_percent)
        .bind(load.memory_percent)
        .execute(&self.writer)
        .await?;
        Ok(Some(previous.status))
    }

    pub async fn node_get(&self, node: &NodeId) -> Result<Option<NodeRecord>, sqlx::Error> {
        Self::row_by_id(&self.pool, ("nodes", COLUMNS), node.as_str(), decode).await
    }

    pub async fn node_list(&self) -> Result<Vec<NodeRecord>, sqlx::Error> {
        sqlx::query(&format!("SELECT {COLUMNS} FROM nodes ORDER BY id"))
            .fetch_all(&self.pool)
            .await?
            .iter()
            .map(decode)
            .collect()
    }

    /// Marks `offline` every online node whose last heartbeat is older than
    /// `cutoff`, and returns them.
    pub async fn node_mark_stale_offline(
        &self,
        cutoff: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<Vec<NodeId>, sqlx::Error> {
        let mut tx = self.write_tx().await?;
        let stale: Vec<NodeId> = sqlx::query(&format!(
            "SELECT id FROM nodes WHERE status = $1 AND last_heartbeat < $2{}",
            self.for_update()
        ))
        .bind(NodeStatus::Online.as_str())
        .bind(to_millis(cutoff))
        .fetch_all(&mut *tx)
        .await?
        .iter()
        .map(|row| row.try_get::<String, _>("id").map(NodeId::new))
        .collect::<Result<_, _>>()?;
        for node in &stale {
            sqlx::query("UPDATE nodes SET status = $1 WHERE id = $2")
                .bind(NodeStatus::Offline.as_str())
                .bind(node.as_str())
                .execute(&mut *tx)
                .await?;
            self.append_event(
                &mut tx,
                (EventName::NodeOffline, node.as_str(), None),
                node_event_data(node, NodeStatus::Offline),
                now,
            )
            .await?;
        }
        tx.commit().await?;
        self.events_committed();
        Ok(stale)
    }
}
