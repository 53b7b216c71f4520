//! The in-memory read model of instance records, kept for the embedded SQLite
//! store (one process owns the file, so the model is exact).
//!
//! Every instance write refreshes the rows it touched from the database while
//! still holding the single writer connection, so the model changes in commit
//! order. Reads (get, list, per-node and per-status counts) never touch SQLite:
//! measured here, sqlx's SQLite driver spends ~1.5 ms of CPU on a 100-row page
//! (a cross-thread hop and an `AnyRow` conversion per row), the model ~50 µs.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, RwLock};

use flotilla_api_types::instances::{InstanceSort, InstanceStatus};
use flotilla_api_types::{InstanceId, NodeId};

use super::instances::{InstanceFilter, InstanceRecord};

#[derive(Default)]
pub(crate) struct InstanceCache {
    /// A std `RwLock`: held for map operations only, never across an await.
    inner: RwLock<CacheInner>,
}

#[derive(Default)]
struct CacheInner {
    by_id: HashMap<InstanceId, Arc<InstanceRecord>>,
    /// (created_at ms, id): the default list order, walked from either end.
    by_created: BTreeSet<(i64, InstanceId)>,
}

impl InstanceCache {
    pub fn put(&self, record: InstanceRecord) {
        let mut inner = self.inner.write().expect("cache lock");
        let key = (record.created_at.timestamp_millis(), record.id.clone());
        if let Some(old) = inner.by_id.insert(record.id.clone(), Arc::new(record)) {
            let old_key = (old.created_at.timestamp_millis(), old.id.clone());
            if old_key != key {
                inner.by_created.remove(&old_key);
            }
        }
        inner.by_created.insert(key);
    }

    pub fn remove(&self, id: &InstanceId) {
        let mut inner = self.inner.write().expect("cache lock");
        if let Some(old) = inner.by_id.remove(id) {
            inner
                .by_created
                .remove(&(old.created_at.timestamp_millis(), old.id.clone()));
        }
    }

    pub fn get(&self, id: &InstanceId) -> Option<InstanceRecord> {
        self.inner
            .read()
            .expect("cache lock")
            .by_id
            .get(id)
            .map(|r| (**r).clone())
    }

    /// One page in the order of `sort`, and the number matching the filter.
    pub fn list(
        &self,
        filter: &InstanceFilter,
        sort: InstanceSort,
        limit: i64,
        offset: i64,
    ) -> (Vec<InstanceRecord>, i64) {
        let inner = self.inner.read().expect("cache lock");
        let matches = |record: &InstanceRecord| {
            filter.status.is_none_or(|s| record.status == s)
                && filter.node_id.as_ref().is_none_or(|n| &record.node_id == n)
                && filter
                    .tenant
                    .as_ref()
                    .is_none_or(|t| record.tenant.as_ref() == Some(t))
        };
        let offset = usize::try_from(offset).unwrap_or(usize::MAX);
        let limit = usize::try_from(limit).unwrap_or(0);
        match sort {
            InstanceSort::CreatedAtDesc | InstanceSort::CreatedAtAsc => {
                let ordered: Box<dyn Iterator<Item = &(i64, InstanceId)>> =
                    if sort == InstanceSort::CreatedAtDesc {
                        Box::new(inner.by_created.iter().rev())
                    } else {
                        Box::new(inner.by_created.iter())
                    };
                if filter.status.is_none() && filter.node_id.is_none() && filter.tenant.is_none() {
                    // No filter: the total is known, and the page is a walk of
                    // offset + limit keys.
                    let page = ordered
                        .skip(offset)
                        .take(limit)
                        .map(|(_, id)| (*inner.by_id[id]).clone())
                        .collect();
                    return (page, inner.by_id.len() as i64);
                }
                let mut page = Vec::with_capacity(limit.min(1000));
                let mut total = 0i64;
                for (_, id) in ordered {
                    let record = &inner.by_id[id];
                    if !matches(record) {
                        continue;
                    }
                    if total as usize >= offset && page.len() < limit {
                        page.push((**record).clone());
                    }
                    total += 1;
                }
                (page, total)
            }
            InstanceSort::MemoryDesc | InstanceSort::CpuDesc => {
                let mut selected: Vec<&Arc<InstanceRecord>> =
                    inner.by_id.values().filter(|r| matches(r)).collect();
                let metric = |r: &InstanceRecord| match sort {
                    InstanceSort::MemoryDesc => r.resources.memory_mb,
                    _ => r.resources.cpu_percent,
                };
                selected.sort_by(|a, b| {
                    metric(b)
                        .total_cmp(&metric(a))
                        .then_with(|| b.created_at.cmp(&a.created_at))
                        .then_with(|| b.id.cmp(&a.id))
                });
                let total = selected.len() as i64;
                let page = selected
                    .into_iter()
                    .skip(offset)
                    .take(limit)
                    .map(|r| (**r).clone())
                    .collect();
                (page, total)
            }
        }
    }

    pub fn on_node(&self, node: &NodeId, statuses: &[InstanceStatus]) -> Vec<InstanceRecord> {
        let inner = self.inner.read().expect("cache lock");
        inner
            .by_id
            .values()
            .filter(|r| &r.node_id == node && statuses.contains(&r.status))
            .map(|r| (**r).clone())
            .collect()
    }

    pub fn in_statuses(&self, statuses: &[InstanceStatus]) -> Vec<InstanceRecord> {
        let inner = self.inner.read().expect("cache lock");
        inner
            .by_id
            .values()
            .filter(|r| statuses.contains(&r.status))
            .map(|r| (**r).clone())
            .collect()
    }

    pub fn counts(&self) -> Vec<(InstanceStatus, i64)> {
        let inner = self.inner.read().expect("cache lock");
        let mut counts: HashMap<InstanceStatus, i64> = HashMap::new();
        for record in inner.by_id.values() {
            *counts.entry(record.status).or_default() += 1;
        }
        counts.into_iter().collect()
    }

    pub fn occupancy(&self) -> Vec<(NodeId, i64)> {
        let inner = self.inner.read().expect("cache lock");
        let mut counts: HashMap<NodeId, i64> = HashMap::new();
        for record in inner.by_id.values().filter(|r| r.status.occupies_slot()) {
            *counts.entry(record.node_id.clone()).or_default() += 1;
        }
        counts.into_iter().collect()
    }
}
