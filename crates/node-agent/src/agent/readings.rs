//! What the agent's sampler keeps of each instance between heartbeats
//! ([`Readings`]): its CPU meter, its last resource reading, the downloads
//! already announced and the memory-limit kills already reported. The
//! sampler's own table, not the instance's state: entries of instances no
//! longer on the node go at the next sample.

use std::collections::{HashMap, HashSet};

use std::sync::Mutex;

use flotilla_api_types::InstanceId;
use flotilla_api_types::instances::{Download, InstanceResources};

use crate::instance::InstanceSlot;
use crate::system::monitor::CpuMeter;

/// One instance's readings.
#[derive(Debug, Default)]
pub(super) struct Reading {
    pub cpu: CpuMeter,
    pub resources: InstanceResources,
    downloads_seen: HashSet<String>,
    oom_reported: u64,
}

/// Every instance's readings. A std mutex: held only for a lookup or one
/// instance's update, never across an await.
#[derive(Debug, Default)]
pub(super) struct Readings(Mutex<HashMap<InstanceId, Reading>>);

impl Readings {
    /// Runs `update` on the reading of `slot` (a new one the first time).
    pub fn update<T>(&self, slot: &InstanceSlot, update: impl FnOnce(&mut Reading) -> T) -> T {
        let mut readings = self.0.lock().expect("readings lock");
        update(readings.entry(slot.id.clone()).or_default())
    }

    /// The last resource reading of `slot`.
    pub fn resources(&self, slot: &InstanceSlot) -> InstanceResources {
        let readings = self.0.lock().expect("readings lock");
        readings
            .get(&slot.id)
            .map(|reading| reading.resources)
            .unwrap_or_default()
    }

    /// Forgets the instances for which `present` is false. Called with the
    /// agent's slots locked, so that none is added meanwhile.
    pub fn keep_only(&self, present: impl Fn(&InstanceId) -> bool) {
        let mut readings = self.0.lock().expect("readings lock");
        readings.retain(|id, _| present(id));
    }

    /// Starts the readings of a new instance `id` afresh (an instance taken
    /// back to be revived is a new one here).
    pub fn start(&self, id: &InstanceId) {
        self.0.lock().expect("readings lock").remove(id);
    }

    /// Downloads of `slot` that finished since the last call.
    pub fn newly_completed_downloads(&self, slot: &InstanceSlot) -> Vec<Download> {
        // The folder is read outside the table's lock.
        let mut seen = self.update(slot, |reading| std::mem::take(&mut reading.downloads_seen));
        let finished = crate::system::downloads::newly_completed(&slot.dirs.downloads(), &mut seen);
        self.update(slot, |reading| reading.downloads_seen.extend(seen));
        finished
    }

    /// Memory-limit kills of `slot` not reported yet, if any.
    pub fn new_oom_kills(&self, slot: &InstanceSlot) -> Option<u64> {
        let total = slot.oom_kills_total();
        self.update(slot, |reading| {
            let reported = std::mem::replace(&mut reading.oom_reported, total);
            (total > reported).then(|| total - reported)
        })
    }
}
