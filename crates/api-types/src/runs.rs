//! What background loops did, run by run ([`RunLedger`]): the control
//! plane's sweeps and background work, the node agent's loops (heartbeats,
//! state changes, wakes, warm pools) and the event proxy's peer links each
//! record their runs here, and `/health` and `/metrics` show them as
//! [`BackgroundTaskHealth`].

use std::collections::BTreeMap;
use std::sync::Mutex;

use chrono::{DateTime, Utc};

use crate::health::BackgroundTaskHealth;

/// How a run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunOutcome {
    /// It ran and changed this many objects.
    Done(u64),
    Failed(String),
    /// Another control plane of the cluster holds the task's lease.
    LeaseHeldElsewhere,
}

#[derive(Debug, Default, Clone)]
struct TaskStats {
    runs: u64,
    failures: u64,
    skipped: u64,
    changed: u64,
    last_run_at: Option<DateTime<Utc>>,
    last_success_at: Option<DateTime<Utc>>,
    /// The last failure, while no run has succeeded since.
    last_error: Option<(DateTime<Utc>, String)>,
    /// Pieces of work running now.
    running: u64,
}

/// Runs per task, by name.
#[derive(Debug, Default)]
pub struct RunLedger {
    stats: Mutex<BTreeMap<&'static str, TaskStats>>,
}

impl RunLedger {
    /// Records one run of `name`, ended at `at`.
    pub fn record(&self, name: &'static str, at: DateTime<Utc>, outcome: RunOutcome) {
        let mut stats = self.stats.lock().expect("ledger lock");
        let task = stats.entry(name).or_default();
        match outcome {
            RunOutcome::Done(changed) => {
                task.runs += 1;
                task.changed += changed;
                task.last_run_at = Some(at);
                task.last_success_at = Some(at);
                task.last_error = None;
            }
            RunOutcome::Failed(error) => {
                task.runs += 1;
                task.failures += 1;
                task.last_run_at = Some(at);
                task.last_error = Some((at, error));
            }
            // Another control plane runs it now: an error of this one's
            // last run is no longer news.
            RunOutcome::LeaseHeldElsewhere => {
                task.skipped += 1;
                task.last_error = None;
            }
        }
    }

    /// Records the run of `name` that `result` ended, now: done, changing
    /// what `Ok` says, or failed with the error's words.
    pub fn record_result<E: std::fmt::Display>(&self, name: &'static str, result: &Result<u64, E>) {
        let outcome = match result {
            Ok(changed) => RunOutcome::Done(*changed),
            Err(error) => RunOutcome::Failed(error.to_string()),
        };
        self.record(name, Utc::now(), outcome);
    }

    /// Counts a piece of work `name` as running.
    pub fn started(&self, name: &'static str) {
        self.stats
            .lock()
            .expect("ledger lock")
            .entry(name)
            .or_default()
            .running += 1;
    }

    /// Counts a piece of work `name` as finished (one more run).
    pub fn finished(&self, name: &'static str) {
        let mut stats = self.stats.lock().expect("ledger lock");
        let task = stats.entry(name).or_default();
        task.running = task.running.saturating_sub(1);
        task.runs += 1;
    }

    /// Each task as `/health` shows it; the error text only when
    /// `with_errors` (it may name internal addresses).
    pub fn report(&self, with_errors: bool) -> Vec<BackgroundTaskHealth> {
        let stats = self.stats.lock().expect("ledger lock");
        stats
            .iter()
            .map(|(name, task)| BackgroundTaskHealth {
                name: (*name).to_owned(),
                runs: task.runs,
                failures: task.failures,
                skipped: task.skipped,
                running: task.running,
                changed: task.changed,
                last_run_at: task.last_run_at,
                last_success_at: task.last_success_at,
                failing: task.last_error.is_some(),
                last_error_at: task.last_error.as_ref().map(|(at, _)| *at),
                last_error: task
                    .last_error
                    .as_ref()
                    .filter(|_| with_errors)
                    .map(|(_, error)| error.clone()),
            })
            .collect()
    }
}
