//! Instance records.

use chrono::{DateTime, Utc};
use sqlx::any::AnyRow;
use sqlx::{AnyConnection, Connection, Row};

use flotilla_api_types::agent::{InstanceReport, NodeClients};
use flotilla_api_types::events::EventName;
use flotilla_api_types::ids::{OperationId, SnapshotId};
use flotilla_api_types::instances::ReviveMethod;
use flotilla_api_types::instances::{
    InstanceConfig, InstanceResources, InstanceSort, InstanceStatus,
};
use flotilla_api_types::names::UnknownName;
use flotilla_api_types::{InstanceId, NodeId};

use flotilla_api_types::profiles::ProfileUse;

use super::{Store, from_millis, placeholders, to_millis};

const COLUMNS: &str = "id, node_id, status, status_reason, subdomain, image, memory_gb, cpu_cores, disk_gb, \
    idle_timeout_minutes, auto_snapshot, debug_port, stream_port, http_port, created_at, updated_at, \
    last_activity, cpu_percent, memory_mb, disk_mb, snapshot_id, dormant_since, revive_method, \
    max_duration_minutes, proxy, profile_name, profile_persist, extensions, record, keep_recordings, \
    operation_id, webdriver_owner, prefs, tenant, cdp_clients, playwright_clients, actions_running";

/// An instance as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct InstanceRecord {
    pub id: InstanceId,
    pub node_id: NodeId,
    pub status: InstanceStatus,
    pub status_reason: Option<String>,
    pub subdomain: String,
    pub image: String,
    pub config: InstanceConfig,
    /// debug, stream, http; `None` until the node has reserved them.
    pub ports: Option<[u16; 3]>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub last_activity: DateTime<Utc>,
    pub resources: InstanceResources,
    /// The clients its node serves it, as of the node's last heartbeat.
    pub clients: NodeClients,
    pub snapshot_id: Option<SnapshotId>,
    pub dormant_since: Option<DateTime<Utc>>,
    /// The method of the revive in progress (or the last one).
    pub revive_method: Option<ReviveMethod>,
    /// The profile it started from.
    pub profile: Option<ProfileUse>,
    /// The operation last asked of its node (its create, or its latest
    /// revive): only that operation's outcome is applied.
    pub operation_id: Option<OperationId>,
    /// For a WebDriver session: who created it (`key:<id>`, or
    /// `anonymous` with authentication off).
    pub webdriver_owner: Option<String>,
    /// The tenant whose key made it (`None`: an admin key, or
    /// authentication off).
    pub tenant: Option<String>,
}

/// What is known of an instance when it is placed.
#[derive(Debug, Clone)]
pub struct NewInstance {
    pub id: InstanceId,
    pub node_id: NodeId,
    pub image: String,
    pub config: InstanceConfig,
    pub created_at: DateTime<Utc>,
    pub profile: Option<ProfileUse>,
    /// The create asked of the node.
    pub operation: OperationId,
    /// The tenant whose key makes it, and its `max_instances` (0: none).
    pub tenant: Option<(String, u32)>,
}

/// Filters and page of a list.
#[derive(Debug, Clone, Default)]
pub struct InstanceFilter {
    pub status: Option<InstanceStatus>,
    pub node_id: Option<NodeId>,
    /// Only this tenant's (a tenant key's list).
    pub tenant: Option<String>,
}

/// What became of a placement ([`Store::instance_insert_if_room`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placed {
    Inserted,
    /// The node holds its `max_instances`.
    NodeFull,
    /// The tenant holds its `max_instances`.
    TenantFull,
}

/// What a status move requires of the record, checked under its lock: one
/// of these statuses, and for a node's report, that the record is still on
/// that node and of the operation the report names (if it names one). A
/// report read before the instance moved or began another revive is then
/// not applied after it (a late report of a park undid a drain's revive).
#[derive(Clone, Copy)]
pub struct Expected<'a> {
    statuses: &'a [InstanceStatus],
    reporter: Option<(&'a NodeId, Option<&'a OperationId>)>,
}

impl<'a> Expected<'a> {
    /// One of `statuses`, still on `node`, and of `operation` when both the
    /// report and the record name one.
    pub fn reported(
        statuses: &'a [InstanceStatus],
        node: &'a NodeId,
        operation: Option<&'a OperationId>,
    ) -> Self {
        Self {
            statuses,
            reporter: Some((node, operation)),
        }
    }

    /// One of `statuses`, and still on the node and of the operation it
    /// had when `record` was read.
    pub fn as_read(statuses: &'a [InstanceStatus], record: &'a InstanceRecord) -> Self {
        Self::reported(statuses, &record.node_id, record.operation_id.as_ref())
    }

    fn allows(&self, locked: &Locked) -> bool {
        let reporter_holds = |(node, operation): (&NodeId, Option<&OperationId>)| {
            *node == locked.node
                && match (operation, &locked.operation) {
                    (Some(reported), Some(current)) => reported == current,
                    _ => true,
                }
        };
        self.statuses.contains(&locked.status) && self.reporter.is_none_or(reporter_holds)
    }
}

impl<'a> From<&'a [InstanceStatus]> for Expected<'a> {
    fn from(statuses: &'a [InstanceStatus]) -> Self {
        Self {
            statuses,
            reporter: None,
        }
    }
}

impl<'a, const N: usize> From<&'a [InstanceStatus; N]> for Expected<'a> {
    fn from(statuses: &'a [InstanceStatus; N]) -> Self {
        Self::from(statuses.as_slice())
    }
}

impl<'a> From<&'a Vec<InstanceStatus>> for Expected<'a> {
    fn from(statuses: &'a Vec<InstanceStatus>) -> Self {
        Self::from(statuses.as_slice())
    }
}

/// An instance's row as [`Store::lock_instance`] holds it.
struct Locked {
    status: InstanceStatus,
    node: NodeId,
    operation: Option<OperationId>,
    tenant: Option<String>,
}

/// What a status move sets besides the status, its reason and `updated_at`.
enum AlsoSet<'a> {
    Nothing,
    /// A park: the snapshot, dormant since the move, no usage any more.
    Snapshot(&'a SnapshotId),
    /// A revive begins, by this method, as this operation.
    Revive(ReviveMethod, &'a OperationId),
    /// A revive ended: its snapshot is spent.
    SnapshotSpent,
}

impl AlsoSet<'_> {
    /// The assignments added to the UPDATE (`$5` is [`Self::value`]).
    fn sql(&self) -> &'static str {
        match self {
            AlsoSet::Nothing => "",
            AlsoSet::Snapshot(_) => {
                ", snapshot_id = $5, dormant_since = $4, cpu_percent = 0, memory_mb = 0"
            }
            AlsoSet::Revive(..) => ", revive_method = $5, operation_id = $6",
            AlsoSet::SnapshotSpent => ", snapshot_id = NULL, dormant_since = NULL",
        }
    }

    /// The values of `$5` (and `$6`).
    fn values(&self) -> Vec<String> {
        match self {
            AlsoSet::Snapshot(snapshot) => vec![snapshot.as_str().to_owned()],
            AlsoSet::Revive(method, operation) => {
                vec![method.as_str().to_owned(), operation.as_str().to_owned()]
            }
            AlsoSet::Nothing | AlsoSet::SnapshotSpent => Vec::new(),
        }
    }
}

/// A JSON column, `None` when NULL.
fn json_column<T: serde::de::DeserializeOwned>(
    row: &AnyRow,
    name: &str,
) -> Result<Option<T>, sqlx::Error> {
    row.try_get::<Option<String>, _>(name)?
        .map(|json| serde_json::from_str(&json))
        .transpose()
        .map_err(|e| sqlx::Error::Decode(e.into()))
}

/// An instance row's `config`.
fn decode_config(row: &AnyRow) -> Result<InstanceConfig, sqlx::Error> {
    Ok(InstanceConfig {
        memory_gb: row.try_get("memory_gb")?,
        cpu_cores: row.try_get("cpu_cores")?,
        disk_gb: row.try_get("disk_gb")?,
        idle_timeout_minutes: row.try_get("idle_timeout_minutes")?,
        auto_snapshot: row.try_get::<i64, _>("auto_snapshot")? != 0,
        max_duration_minutes: row.try_get("max_duration_minutes")?,
        proxy: json_column(row, "proxy")?,
        extensions: json_column(row, "extensions")?.unwrap_or_default(),
        record: row.try_get::<i64, _>("record")? != 0,
        keep_recordings: row.try_get::<i64, _>("keep_recordings")? != 0,
        prefs: json_column(row, "prefs")?,
    })
}

fn decode(row: &AnyRow) -> Result<InstanceRecord, sqlx::Error> {
    let status: String = row.try_get("status")?;
    let status = status
        .parse()
        .map_err(|e: UnknownName| sqlx::Error::Decode(e.into()))?;
    let port = |name: &str| -> Result<Option<u16>, sqlx::Error> {
        Ok(row
            .try_get::<Option<i64>, _>(name)?
            .and_then(|p| u16::try_from(p).ok()))
    };
    let ports = match (
        port("debug_port")?,
        port("stream_port")?,
        port("http_port")?,
    ) {
        (Some(d), Some(s), Some(h)) => Some([d, s, h]),
        _ => None,
    };
    Ok(InstanceRecord {
        id: InstanceId::new(row.try_get::<String, _>("id")?),
        node_id: NodeId::new(row.try_get::<String, _>("node_id")?),
        status,
        status_reason: row.try_get("status_reason")?,
        subdomain: row.try_get("subdomain")?,
        image: row.try_get("image")?,
        config: decode_config(row)?,
        ports,
        created_at: from_millis(row.try_get("created_at")?),
        updated_at: from_millis(row.try_get("updated_at")?),
        last_activity: from_millis(row.try_get("last_activity")?),
        resources: InstanceResources {
            cpu_percent: row.try_get("cpu_percent")?,
            memory_mb: row.try_get("memory_mb")?,
            disk_mb: row.try_get("disk_mb")?,
        },
        clients: NodeClients {
            cdp: count(row, "cdp_clients")?,
            playwright: count(row, "playwright_clients")?,
            actions: count(row, "actions_running")?,
        },
        snapshot_id: row
            .try_get::<Option<String>, _>("snapshot_id")?
            .map(SnapshotId::new),
        dormant_since: row
            .try_get::<Option<i64>, _>("dormant_since")?
            .map(from_millis),
        revive_method: row
            .try_get::<Option<String>, _>("revive_method")?
            .and_then(|m| m.parse().ok()),
        profile: row
            .try_get::<Option<String>, _>("profile_name")?
            .map(|name| -> Result<ProfileUse, sqlx::Error> {
                Ok(ProfileUse {
                    name,
                    persist: row.try_get::<i64, _>("profile_persist")? != 0,
                })
            })
            .transpose()?,
        operation_id: row
            .try_get::<Option<String>, _>("operation_id")?
            .map(OperationId::new),
        webdriver_owner: row.try_get("webdriver_owner")?,
        tenant: row.try_get("tenant")?,
    })
}

/// A nullable double to bind, as text for `CAST($n AS DOUBLE PRECISION)`:
/// sqlx 0.8's Any driver binds a null f64 as a PostgreSQL float4, and a
/// connection that prepared a statement with one then refuses a later
/// 8-byte float ("incorrect binary data format in bind parameter").
fn nullable_double(value: Option<f64>) -> Option<String> {
    value.map(|value| value.to_string())
}

/// A count column (never negative, at most `u32::MAX`).
fn count(row: &AnyRow, column: &str) -> Result<u32, sqlx::Error> {
    let value: i64 = row.try_get(column)?;
    Ok(u32::try_from(value.max(0)).unwrap_or(u32::MAX))
}

/// `(status, n)` rows as counts by status (an unknown status left out).
fn status_counts(rows: &[AnyRow]) -> Result<Vec<(InstanceStatus, i64)>, sqlx::Error> {
    let mut counts = Vec::new();
    for row in rows {
        let status: String = row.try_get("status")?;
        if let Ok(status) = status.parse() {
            counts.push((status, row.try_get("n")?));
        }
    }
    Ok(counts)
}

/// Puts decoded instance rows into the read model.
fn cache_rows(cache: &super::cache::InstanceCache, rows: &[AnyRow]) -> Result<(), sqlx::Error> {
    for row in rows {
        cache.put(decode(row)?);
    }
    Ok(())
}

fn status_strings(statuses: &[InstanceStatus]) -> Vec<String> {
    statuses.iter().map(|s| s.as_str().to_owned()).collect()
}

/// `IN ($first, …)` binds for a list of statuses.
fn bind_statuses<'q>(
    mut query: sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments<'q>>,
    statuses: &'q [String],
) -> sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments<'q>> {
    for status in statuses {
        query = query.bind(status.as_str());
    }
    query
}

impl Store {
    /// The rows of `sql`, whose `{in}` becomes the placeholders of `statuses`
    /// (numbered after `node`'s `$1` when there is one).
    async fn fetch_in_statuses(
        &self,
        sql: &str,
        node: Option<&NodeId>,
        statuses: &[InstanceStatus],
    ) -> Result<Vec<AnyRow>, sqlx::Error> {
        let statuses = status_strings(statuses);
        let first = 1 + usize::from(node.is_some());
        let sql = sql.replace("{in}", &placeholders(first, statuses.len()));
        let query = match node {
            Some(node) => sqlx::query(&sql).bind(node.as_str()),
            None => sqlx::query(&sql),
        };
        bind_statuses(query, &statuses).fetch_all(&self.pool).await
    }

    /// A guard for a write of `id`: dropped before [`RefreshUnlessDone::done`]
    /// (its caller cut short, e.g. a client gone mid-request, between the
    /// commit and the read model's refresh), it refreshes `id` on its own.
    fn refresh_unless_done(&self, id: &InstanceId) -> RefreshUnlessDone {
        RefreshUnlessDone {
            store: self.cache.is_some().then(|| self.clone()),
            id: id.clone(),
        }
    }

    /// Re-reads `id` into the read model on the writer connection of its own.
    async fn refresh_alone(&self, id: &InstanceId) -> Result<(), sqlx::Error> {
        let mut conn = self.writer.acquire().await?;
        self.refresh(&mut conn, id).await
    }

    /// Re-reads `id` on the writer connection (so in commit order) into the read model.
    async fn refresh(&self, conn: &mut AnyConnection, id: &InstanceId) -> Result<(), sqlx::Error> {
        let Some(cache) = &self.cache else {
            return Ok(());
        };
        let row = sqlx::query(&format!("SELECT {COLUMNS} FROM instances WHERE id = $1"))
            .bind(id.as_str())
            .fetch_optional(&mut *conn)
            .await?;
        match row.as_ref().map(decode).transpose()? {
            Some(record) => cache.put(record),
            None => cache.remove(id),
        }
        Ok(())
    }

    /// Locks `node`'s row until the end of `tx` (so placements on it serialise
    /// across control planes) and says whether it has fewer than
    /// `max_instances` instances holding a slot.
    async fn node_has_room(
        &self,
        tx: &mut AnyConnection,
        node: &NodeId,
        max_instances: i64,
    ) -> Result<bool, sqlx::Error> {
        let lock = format!("SELECT id FROM nodes WHERE id = $1{}", self.for_update());
        sqlx::query(&lock)
            .bind(node.as_str())
            .fetch_optional(&mut *tx)
            .await?;
        let occupying = status_strings(&InstanceStatus::OCCUPYING);
        let count_sql = format!(
            "SELECT COUNT(*) AS n FROM instances WHERE node_id = $1 AND status IN ({})",
            placeholders(2, occupying.len())
        );
        let used: i64 = bind_statuses(sqlx::query(&count_sql).bind(node.as_str()), &occupying)
            .fetch_one(&mut *tx)
            .await?
            .try_get("n")?;
        Ok(used < max_instances)
    }

    /// Whether `tenant` holds fewer than `quota` instances in an occupying
    /// state. On PostgreSQL a lock per tenant, held to the end of `tx`,
    /// makes concurrent placements of one tenant count in turn (SQLite
    /// has one writer).
    async fn tenant_has_room(
        &self,
        tx: &mut AnyConnection,
        tenant: &str,
        quota: u32,
    ) -> Result<bool, sqlx::Error> {
        if matches!(self.backend, super::Backend::Postgres) {
            // (The lock's own value is void, which sqlx's Any cannot read.)
            sqlx::query(
                "SELECT COUNT(*) AS n FROM (SELECT pg_advisory_xact_lock(hashtextextended($1, 7))) AS held",
            )
            .bind(format!("tenant:{tenant}"))
            .fetch_one(&mut *tx)
            .await?;
        }
        let occupying = status_strings(&InstanceStatus::OCCUPYING);
        let count_sql = format!(
            "SELECT COUNT(*) AS n FROM instances WHERE tenant = $1 AND status IN ({})",
            placeholders(2, occupying.len())
        );
        let used: i64 = bind_statuses(sqlx::query(&count_sql).bind(tenant), &occupying)
            .fetch_one(&mut *tx)
            .await?
            .try_get("n")?;
        Ok(used < i64::from(quota))
    }

    /// Records that instance `id`'s kept recordings are `tenant`'s, whenever
    /// its node keeps them (deleted, ended, moved) and after its record is
    /// gone.
    async fn kept_recordings_owned_by(
        tx: &mut AnyConnection,
        id: &InstanceId,
        tenant: &str,
    ) -> Result<(), sqlx::Error> {
        sqlx::query(
            "INSERT INTO kept_recording_owners (instance_id, tenant) VALUES ($1, $2) \
             ON CONFLICT (instance_id) DO NOTHING",
        )
        .bind(id.as_str())
        .bind(tenant)
        .execute(&mut *tx)
        .await?;
        Ok(())
    }

    /// Whether `tenant` holds fewer than `quota` instances in an occupying
    /// state now (a revive of an ended instance asks before it begins).
    pub async fn tenant_has_room_now(&self, tenant: &str, quota: u32) -> Result<bool, sqlx::Error> {
        let mut conn = self.writer.acquire().await?;
        let mut tx = conn.begin().await?;
        let room = self.tenant_has_room(&mut tx, tenant, quota).await?;
        tx.commit().await?;
        Ok(room)
    }

    /// The status and node of `id`, locked until the end of `tx`.
    async fn lock_instance(
        &self,
        tx: &mut AnyConnection,
        id: &InstanceId,
    ) -> Result<Option<Locked>, sqlx::Error> {
        let sql = format!(
            "SELECT status, node_id, operation_id, tenant FROM instances WHERE id = $1{}",
            self.for_update()
        );
        let Some(row) = sqlx::query(&sql)
            .bind(id.as_str())
            .fetch_optional(&mut *tx)
            .await?
        else {
            return Ok(None);
        };
        let status: String = row.try_get("status")?;
        let status = status
            .parse()
            .map_err(|e: UnknownName| sqlx::Error::Decode(e.into()))?;
        Ok(Some(Locked {
            status,
            node: NodeId::new(row.try_get::<String, _>("node_id")?),
            operation: row
                .try_get::<Option<String>, _>("operation_id")?
                .map(OperationId::from),
            tenant: row.try_get("tenant")?,
        }))
    }

    /// Appends an instance's lifecycle event to `tx`: `name` of instance
    /// `id` of `tenant`, now on `node` in `status`.
    async fn instance_event(
        &self,
        tx: &mut AnyConnection,
        (name, id, tenant): (EventName, &InstanceId, Option<&str>),
        (node, status, reason): (&NodeId, InstanceStatus, Option<&str>),
        now: DateTime<Utc>,
    ) -> Result<(), sqlx::Error> {
        let mut data = serde_json::Map::new();
        data.insert("instance_id".into(), id.as_str().into());
        data.insert("status".into(), status.as_str().into());
        data.insert("node_id".into(), node.as_str().into());
        if let Some(reason) = reason {
            data.insert("reason".into(), reason.into());
        }
        self.append_event(tx, (name, id.as_str(), tenant), data, now)
            .await
    }

    /// Records event `name` of instance `id` (with its status and node, and
    /// `extra` data) without changing the instance; `false` when it is gone.
    pub async fn instance_note(
        &self,
        id: &InstanceId,
        name: EventName,
        extra: serde_json::Map<String, serde_json::Value>,
        now: DateTime<Utc>,
    ) -> Result<bool, sqlx::Error> {
        let mut conn = self.writer.acquire().await?;
        let mut tx = conn.begin().await?;
        let Some(Locked {
            status,
            node,
            tenant,
            ..
        }) = self.lock_instance(&mut tx, id).await?
        else {
            return Ok(false);
        };
        let mut data = serde_json::Map::new();
        data.insert("instance_id".into(), id.as_str().into());
        data.insert("status".into(), status.as_str().into());
        data.insert("node_id".into(), node.as_str().into());
        data.extend(extra);
        self.append_event(&mut tx, (name, id.as_str(), tenant.as_deref()), data, now)
            .await?;
        tx.commit().await?;
        self.events_committed();
        Ok(true)
    }

    /// Loads every instance into the read model (at start).
    pub(super) async fn load_cache(&self) -> Result<(), sqlx::Error> {
        let Some(cache) = &self.cache else {
            return Ok(());
        };
        let rows = sqlx::query(&format!("SELECT {COLUMNS} FROM instances"))
            .fetch_all(&self.writer)
            .await?;
        cache_rows(cache, &rows)
    }

    /// Inserts a `creating` instance on its node if the node has a free slot
    /// (fewer than `max_instances` instances in an occupying state). Atomic
    /// against concurrent placements, in this process and across control planes.
    pub async fn instance_insert_if_room(
        &self,
        new: &NewInstance,
        max_instances: i64,
    ) -> Result<Placed, sqlx::Error> {
        let mut conn = self.writer.acquire().await?;
        let mut tx = conn.begin().await?;
        if !self
            .node_has_room(&mut tx, &new.node_id, max_instances)
            .await?
        {
            return Ok(Placed::NodeFull);
        }
        if let Some((tenant, quota)) = &new.tenant
            && *quota > 0
            && !self.tenant_has_room(&mut tx, tenant, *quota).await?
        {
            return Ok(Placed::TenantFull);
        }
        let now = to_millis(new.created_at);
        sqlx::query(
            "INSERT INTO instances (id, node_id, status, subdomain, image, memory_gb, cpu_cores, disk_gb, \
             idle_timeout_minutes, auto_snapshot, created_at, updated_at, last_activity, max_duration_minutes, proxy, \
             profile_name, profile_persist, extensions, record, keep_recordings, operation_id, prefs, tenant) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $11, $11, CAST($12 AS DOUBLE PRECISION), $13, $14, $15, $16, $17, $18, $19, $20, $21)",
        )
        .bind(new.id.as_str())
        .bind(new.node_id.as_str())
        .bind(InstanceStatus::Creating.as_str())
        .bind(new.id.subdomain())
        .bind(new.image.as_str())
        .bind(new.config.memory_gb)
        .bind(new.config.cpu_cores)
        .bind(new.config.disk_gb)
        .bind(new.config.idle_timeout_minutes)
        .bind(i64::from(new.config.auto_snapshot))
        .bind(now)
        .bind(nullable_double(new.config.max_duration_minutes))
        .bind(
            new.config
                .proxy
                .as_ref()
                .map(|proxy| serde_json::to_string(proxy).expect("a proxy serialises")),
        )
        .bind(new.profile.as_ref().map(|p| p.name.clone()))
        .bind(i64::from(new.profile.as_ref().is_some_and(|p| p.persist)))
        .bind(
            (!new.config.extensions.is_empty())
                .then(|| serde_json::to_string(&new.config.extensions).expect("ids serialise")),
        )
        .bind(i64::from(new.config.record))
        .bind(i64::from(new.config.keep_recordings))
        .bind(new.operation.as_str())
        .bind(
            new.config
                .prefs
                .as_ref()
                .map(|prefs| serde_json::to_string(prefs).expect("JSON serialises")),
        )
        .bind(new.tenant.as_ref().map(|(tenant, _)| tenant.clone()))
        .execute(&mut *tx)
        .await?;
        let tenant = new.tenant.as_ref().map(|(tenant, _)| tenant.as_str());
        if let Some(tenant) = tenant.filter(|_| new.config.keep_recordings) {
            Self::kept_recordings_owned_by(&mut tx, &new.id, tenant).await?;
        }
        self.instance_event(
            &mut tx,
            (EventName::InstanceCreated, &new.id, tenant),
            (&new.node_id, InstanceStatus::Creating, None),
            new.created_at,
        )
        .await?;
        let refreshed = self.refresh_unless_done(&new.id);
        tx.commit().await?;
        self.events_committed();
        self.refresh(&mut conn, &new.id).await?;
        refreshed.done();
        Ok(Placed::Inserted)
    }

    /// Moves a parked instance (in one of `from`) to `node` if that node has a
    /// free slot, forgetting its ports there; atomic like
    /// [`Store::instance_insert_if_room`]. `false` when the node is full or the
    /// instance is no longer in one of `from`.
    pub async fn instance_move_if_room(
        &self,
        id: &InstanceId,
        from: &[InstanceStatus],
        node: &NodeId,
        max_instances: i64,
        now: DateTime<Utc>,
    ) -> Result<bool, sqlx::Error> {
        let mut conn = self.writer.acquire().await?;
        let mut tx = conn.begin().await?;
        if !self.node_has_room(&mut tx, node, max_instances).await? {
            return Ok(false);
        }
        match self.lock_instance(&mut tx, id).await? {
            Some(locked) if from.contains(&locked.status) => {}
            _ => return Ok(false),
        }
        sqlx::query(
            "UPDATE instances SET node_id = $1, debug_port = NULL, stream_port = NULL, http_port = NULL, \
             updated_at = $2 WHERE id = $3",
        )
        .bind(node.as_str())
        .bind(to_millis(now))
        .bind(id.as_str())
        .execute(&mut *tx)
        .await?;
        let refreshed = self.refresh_unless_done(id);
        tx.commit().await?;
        self.refresh(&mut conn, id).await?;
        refreshed.done();
        Ok(true)
    }

    /// Records the ports a node reserved. `false` if the instance is gone.
    pub async fn instance_set_ports(
        &self,
        id: &InstanceId,
        ports: [u16; 3],
        now: DateTime<Utc>,
    ) -> Result<bool, sqlx::Error> {
        let mut conn = self.writer.acquire().await?;
        let refreshed = self.refresh_unless_done(id);
        let done = sqlx::query("UPDATE instances SET debug_port = $1, stream_port = $2, http_port = $3, updated_at = $4 WHERE id = $5")
            .bind(i64::from(ports[0]))
            .bind(i64::from(ports[1]))
            .bind(i64::from(ports[2]))
            .bind(to_millis(now))
            .bind(id.as_str())
            .execute(&mut *conn)
            .await?;
        self.refresh(&mut conn, id).await?;
        refreshed.done();
        Ok(done.rows_affected() == 1)
    }

    pub async fn instance_get(
        &self,
        id: &InstanceId,
    ) -> Result<Option<InstanceRecord>, sqlx::Error> {
        if let Some(cache) = &self.cache {
            return Ok(cache.get(id));
        }
        Self::row_by_id(&self.pool, ("instances", COLUMNS), id.as_str(), decode).await
    }

    /// One page of instances and the number matching the filter.
    pub async fn instance_list(
        &self,
        filter: &InstanceFilter,
        sort: InstanceSort,
        limit: i64,
        offset: i64,
    ) -> Result<(Vec<InstanceRecord>, i64), sqlx::Error> {
        if let Some(cache) = &self.cache {
            return Ok(cache.list(filter, sort, limit, offset));
        }
        let mut conditions = Vec::new();
        let mut binds = Vec::new();
        if let Some(status) = filter.status {
            binds.push(status.as_str().to_owned());
            conditions.push(format!("status = ${}", binds.len()));
        }
        if let Some(node) = &filter.node_id {
            binds.push(node.as_str().to_owned());
            conditions.push(format!("node_id = ${}", binds.len()));
        }
        if let Some(tenant) = &filter.tenant {
            binds.push(tenant.clone());
            conditions.push(format!("tenant = ${}", binds.len()));
        }
        let where_clause = if conditions.is_empty() {
            String::new()
        } else {
            format!(" WHERE {}", conditions.join(" AND "))
        };
        let order = match sort {
            InstanceSort::CreatedAtDesc => "created_at DESC, id DESC",
            InstanceSort::CreatedAtAsc => "created_at ASC, id ASC",
            InstanceSort::MemoryDesc => "memory_mb DESC, created_at DESC, id DESC",
            InstanceSort::CpuDesc => "cpu_percent DESC, created_at DESC, id DESC",
        };
        let page_sql = format!(
            "SELECT {COLUMNS} FROM instances{where_clause} ORDER BY {order} LIMIT ${} OFFSET ${}",
            binds.len() + 1,
            binds.len() + 2
        );
        let page = bind_statuses(sqlx::query(&page_sql), &binds);
        let rows = page.bind(limit).bind(offset).fetch_all(&self.pool).await?;
        let records = rows.iter().map(decode).collect::<Result<Vec<_>, _>>()?;
        let total = if offset == 0 && (records.len() as i64) < limit {
            records.len() as i64
        } else {
            let count_sql = format!("SELECT COUNT(*) AS n FROM instances{where_clause}");
            bind_statuses(sqlx::query(&count_sql), &binds)
                .fetch_one(&self.pool)
                .await?
                .try_get("n")?
        };
        Ok((records, total))
    }

    /// Moves an instance to `to` if it is in one of `from`, with the event the
    /// move announces; returns the updated record, or `None` when it was not in
    /// such a state (or does not exist).
    pub async fn instance_transition<'a>(
        &self,
        id: &InstanceId,
        from: impl Into<Expected<'a>>,
        to: InstanceStatus,
        reason: Option<&str>,
        now: DateTime<Utc>,
    ) -> Result<Option<InstanceRecord>, sqlx::Error> {
        self.move_status(id, (from.into(), to), reason, AlsoSet::Nothing, now)
            .await
    }

    /// WebDriver sessions of `tenant`'s keys held now (their instances in an
    /// occupying state).
    pub async fn webdriver_sessions_of_tenant(&self, tenant: &str) -> Result<u64, sqlx::Error> {
        let occupying = status_strings(&InstanceStatus::OCCUPYING);
        let sql = format!(
            "SELECT COUNT(*) AS n FROM instances WHERE tenant = $1 AND webdriver_owner IS NOT NULL AND status IN ({})",
            placeholders(2, occupying.len())
        );
        let held: i64 = bind_statuses(sqlx::query(&sql).bind(tenant), &occupying)
            .fetch_one(&self.pool)
            .await?
            .try_get("n")?;
        Ok(held.max(0) as u64)
    }

    /// Marks instance `id` as the WebDriver session of `owner`; `false` when
    /// it is gone.
    pub async fn instance_set_webdriver_owner(
        &self,
        id: &InstanceId,
        owner: &str,
    ) -> Result<bool, sqlx::Error> {
        let mut conn = self.writer.acquire().await?;
        let refreshed = self.refresh_unless_done(id);
        let updated = sqlx::query("UPDATE instances SET webdriver_owner = $2 WHERE id = $1")
            .bind(id.as_str())
            .bind(owner)
            .execute(&mut *conn)
            .await?
            .rows_affected();
        self.refresh(&mut conn, id).await?;
        refreshed.done();
        Ok(updated > 0)
    }

    /// Records a successful park: `dormant` with its snapshot, from one of
    /// `from`.
    pub async fn instance_set_dormant<'a>(
        &self,
        id: &InstanceId,
        from: impl Into<Expected<'a>>,
        snapshot: &SnapshotId,
        since: DateTime<Utc>,
    ) -> Result<Option<InstanceRecord>, sqlx::Error> {
        let to = InstanceStatus::Dormant;
        let also = AlsoSet::Snapshot(snapshot);
        self.move_status(id, (from.into(), to), None, also, since)
            .await
    }

    /// Starts a revive: `reviving` with its method, as `operation`, from one
    /// of `from`.
    pub async fn instance_begin_revive<'a>(
        &self,
        id: &InstanceId,
        from: impl Into<Expected<'a>>,
        (method, operation): (ReviveMethod, &OperationId),
        reason: Option<&str>,
        now: DateTime<Utc>,
    ) -> Result<Option<InstanceRecord>, sqlx::Error> {
        let to = InstanceStatus::Reviving;
        let also = AlsoSet::Revive(method, operation);
        self.move_status(id, (from.into(), to), reason, also, now)
            .await
    }

    /// Records a finished revive: `running` from one of `from` (`reviving`,
    /// or an ended state when the instance is adopted again), its snapshot
    /// spent, in one transaction (the node deletes the archive only after).
    pub async fn instance_set_revived<'a>(
        &self,
        id: &InstanceId,
        from: impl Into<Expected<'a>>,
        reason: Option<&str>,
        now: DateTime<Utc>,
    ) -> Result<Option<InstanceRecord>, sqlx::Error> {
        let to = InstanceStatus::Running;
        let also = AlsoSet::SnapshotSpent;
        self.move_status(id, (from.into(), to), reason, also, now)
            .await
    }

    /// Moves `id` from one of `from` to `to` (with `reason` and what `also`
    /// sets) and appends the event the move announces, in one transaction;
    /// the updated record, or `None` when the instance is not in one of `from`.
    async fn move_status(
        &self,
        id: &InstanceId,
        (from, to): (Expected<'_>, InstanceStatus),
        reason: Option<&str>,
        also: AlsoSet<'_>,
        now: DateTime<Utc>,
    ) -> Result<Option<InstanceRecord>, sqlx::Error> {
        let sql = format!(
            "UPDATE instances SET status = $2, status_reason = $3, updated_at = $4{} WHERE id = $1",
            also.sql()
        );
        let update = sqlx::query(&sql)
            .bind(id.as_str())
            .bind(to.as_str())
            .bind(reason.map(str::to_owned))
            .bind(to_millis(now));
        let update = also
            .values()
            .into_iter()
            .fold(update, |update, value| update.bind(value));
        let mut conn = self.writer.acquire().await?;
        let mut tx = conn.begin().await?;
        let Some(locked) = self.lock_instance(&mut tx, id).await? else {
            return Ok(None);
        };
        if !from.allows(&locked) {
            return Ok(None);
        }
        let Locked {
            status: current,
            node,
            tenant,
            ..
        } = locked;
        update.execute(&mut *tx).await?;
        if let Some(name) = EventName::for_transition(current, to) {
            self.instance_event(
                &mut tx,
                (name, id, tenant.as_deref()),
                (&node, to, reason),
                now,
            )
            .await?;
        }
        let refreshed = self.refresh_unless_done(id);
        tx.commit().await?;
        self.events_committed();
        self.refresh(&mut conn, id).await?;
        refreshed.done();
        drop(conn);
        self.instance_get(id).await
    }

    /// Instances in one of `statuses`, on every node.
    pub async fn instances_in(
        &self,
        statuses: &[InstanceStatus],
    ) -> Result<Vec<InstanceRecord>, sqlx::Error> {
        if let Some(cache) = &self.cache {
            return Ok(cache.in_statuses(statuses));
        }
        let sql = format!("SELECT {COLUMNS} FROM instances WHERE status IN ({{in}})");
        let rows = self.fetch_in_statuses(&sql, None, statuses).await?;
        rows.iter().map(decode).collect()
    }

    /// Removes the record, with an `instance.deleted` event carrying its last
    /// status. `false` if there was none.
    pub async fn instance_delete(
        &self,
        id: &InstanceId,
        now: DateTime<Utc>,
    ) -> Result<bool, sqlx::Error> {
        self.instance_remove(id, now, &[EventName::InstanceDeleted])
            .await
    }

    /// Removes an instance whose lifetime ended: `instance.expired`, then
    /// `instance.deleted`, in the transaction of the removal.
    pub async fn instance_expire(
        &self,
        id: &InstanceId,
        now: DateTime<Utc>,
    ) -> Result<bool, sqlx::Error> {
        self.instance_remove(
            id,
            now,
            &[EventName::InstanceExpired, EventName::InstanceDeleted],
        )
        .await
    }

    async fn instance_remove(
        &self,
        id: &InstanceId,
        now: DateTime<Utc>,
        events: &[EventName],
    ) -> Result<bool, sqlx::Error> {
        let mut conn = self.writer.acquire().await?;
        let mut tx = conn.begin().await?;
        let Some(Locked {
            status,
            node,
            tenant,
            ..
        }) = self.lock_instance(&mut tx, id).await?
        else {
            return Ok(false);
        };
        sqlx::query("DELETE FROM instances WHERE id = $1")
            .bind(id.as_str())
            .execute(&mut *tx)
            .await?;
        // Gone with it: its hold on a profile.
        sqlx::query("UPDATE profiles SET holder = NULL WHERE holder = $1")
            .bind(id.as_str())
            .execute(&mut *tx)
            .await?;
        for event in events {
            self.instance_event(
                &mut tx,
                (*event, id, tenant.as_deref()),
                (&node, status, None),
                now,
            )
            .await?;
        }
        let refreshed = self.refresh_unless_done(id);
        tx.commit().await?;
        self.events_committed();
        if let Some(cache) = &self.cache {
            cache.remove(id);
        }
        refreshed.done();
        Ok(true)
    }

    /// Stores the resource samples and activity a node reported.
    pub async fn instance_record_usage(
        &self,
        node: &NodeId,
        reports: &[InstanceReport],
    ) -> Result<(), sqlx::Error> {
        if reports.is_empty() {
            return Ok(());
        }
        // In one order (by id), so that two reports of one node written at
        // once (its registration with one control plane, its heartbeat with
        // another) never lock rows in opposite orders.
        let mut reports: Vec<&InstanceReport> = reports.iter().collect();
        reports.sort_by(|a, b| a.id.as_str().cmp(b.id.as_str()));
        let mut conn = self.writer.acquire().await?;
        let mut tx = conn.begin().await?;
        for report in reports {
            sqlx::query(
                "UPDATE instances SET cpu_percent = $1, memory_mb = $2, disk_mb = $3, \
                 last_activity = CASE WHEN last_activity > $4 THEN last_activity ELSE $4 END, \
                 cdp_clients = $5, playwright_clients = $6, actions_running = $7 \
                 WHERE id = $8 AND node_id = $9",
            )
            .bind(report.resources.cpu_percent)
            .bind(report.resources.memory_mb)
            .bind(report.resources.disk_mb)
            .bind(to_millis(report.last_activity))
            .bind(i64::from(report.clients.cdp))
            .bind(i64::from(report.clients.playwright))
            .bind(i64::from(report.clients.actions))
            .bind(report.id.as_str())
            .bind(node.as_str())
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        if let Some(cache) = &self.cache {
            let rows = sqlx::query(&format!(
                "SELECT {COLUMNS} FROM instances WHERE node_id = $1"
            ))
            .bind(node.as_str())
            .fetch_all(&mut *conn)
            .await?;
            cache_rows(cache, &rows)?;
        }
        Ok(())
    }

    /// Instances of `node` in one of `statuses`.
    pub async fn instances_on_node(
        &self,
        node: &NodeId,
        statuses: &[InstanceStatus],
    ) -> Result<Vec<InstanceRecord>, sqlx::Error> {
        if let Some(cache) = &self.cache {
            return Ok(cache.on_node(node, statuses));
        }
        let sql =
            format!("SELECT {COLUMNS} FROM instances WHERE node_id = $1 AND status IN ({{in}})");
        let rows = self.fetch_in_statuses(&sql, Some(node), statuses).await?;
        rows.iter().map(decode).collect()
    }

    /// Number of instances per status.
    pub async fn instance_counts(&self) -> Result<Vec<(InstanceStatus, i64)>, sqlx::Error> {
        if let Some(cache) = &self.cache {
            // The store must still answer for health to say "up".
            sqlx::query("SELECT 1").execute(&self.pool).await?;
            return Ok(cache.counts());
        }
        let rows = sqlx::query("SELECT status, COUNT(*) AS n FROM instances GROUP BY status")
            .fetch_all(&self.pool)
            .await?;
        status_counts(&rows)
    }

    /// How many of `tenant`'s instances are in each status.
    pub async fn instance_counts_of_tenant(
        &self,
        tenant: &str,
    ) -> Result<Vec<(InstanceStatus, i64)>, sqlx::Error> {
        let rows = sqlx::query(
            "SELECT status, COUNT(*) AS n FROM instances WHERE tenant = $1 GROUP BY status",
        )
        .bind(tenant)
        .fetch_all(&self.pool)
        .await?;
        status_counts(&rows)
    }

    /// Per node: instances created since `since`, and how many of them failed.
    pub async fn recent_failures(
        &self,
        since: DateTime<Utc>,
    ) -> Result<Vec<(NodeId, i64, i64)>, sqlx::Error> {
        sqlx::query(
            "SELECT node_id, COUNT(*) AS total, SUM(CASE WHEN status = $1 THEN 1 ELSE 0 END) AS failed \
             FROM instances WHERE created_at >= $2 GROUP BY node_id",
        )
        .bind(InstanceStatus::Failed.as_str())
        .bind(to_millis(since))
        .fetch_all(&self.pool)
        .await?
        .iter()
        .map(|row| {
            Ok((
                NodeId::new(row.try_get::<String, _>("node_id")?),
                row.try_get("total")?,
                row.try_get("failed")?,
            ))
        })
        .collect()
    }

    /// Occupying instances per node.
    pub async fn node_occupancy(&self) -> Result<Vec<(NodeId, i64)>, sqlx::Error> {
        if let Some(cache) = &self.cache {
            return Ok(cache.occupancy());
        }
        let sql =
            "SELECT node_id, COUNT(*) AS n FROM instances WHERE status IN ({in}) GROUP BY node_id";
        let occupying = InstanceStatus::OCCUPYING;
        self.fetch_in_statuses(sql, None, &occupying)
            .await?
            .iter()
            .map(|row| {
                Ok((
                    NodeId::new(row.try_get::<String, _>("node_id")?),
                    row.try_get("n")?,
                ))
            })
            .collect()
    }
}

/// See [`Store::refresh_unless_done`].
#[must_use = "call done() once the read model is refreshed"]
struct RefreshUnlessDone {
    /// `None` once done (or without a read model).
    store: Option<Store>,
    id: InstanceId,
}

impl RefreshUnlessDone {
    fn done(mut self) {
        self.store = None;
    }
}

impl Drop for RefreshUnlessDone {
    fn drop(&mut self) {
        let Some(store) = self.store.take() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let id = self.id.clone();
        // On the writer connection, so in commit order with every other write.
        runtime.spawn(async move {
            if let Err(error) = store.refresh_alone(&id).await {
                tracing::warn!(instance = %id, %error, "cannot refresh the read model after a write cut short");
            }
        });
    }
}
