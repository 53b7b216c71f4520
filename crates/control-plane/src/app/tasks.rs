//! The control plane's background work, visible and stoppable: the sweeps
//! that run on a timer (see [`crate::background`]) record each run here, and
//! work started in the background by a request or a report (stopping a
//! node's strays, a WebSocket relay through the front door, a park, revive
//! or delete that runs to its end whether its client waits or not) is
//! spawned here, so that shutdown waits for it. `/health` and `/metrics` show what each
//! did: runs, failures, the last run and, to a caller with a key, the last
//! error.

use std::future::Future;
use std::time::Duration;

use chrono::{DateTime, Utc};
use flotilla_api_types::health::BackgroundTaskHealth;
use flotilla_api_types::runs::RunLedger;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use flotilla_api_types::runs::RunOutcome;

/// The registry and the tracker of spawned work.
#[derive(Default)]
pub struct BackgroundTasks {
    ledger: RunLedger,
    tracker: TaskTracker,
    /// Cancelled at shutdown: work that would run on (a relay) ends.
    stopping: CancellationToken,
}

impl BackgroundTasks {
    /// Records one run of the timed task `name`.
    pub fn record(&self, name: &'static str, at: DateTime<Utc>, outcome: RunOutcome) {
        self.ledger.record(name, at, outcome);
    }

    /// Runs `work` in the background as `name`, counted while it runs and
    /// waited for at shutdown.
    pub fn spawn<F>(self: &std::sync::Arc<Self>, name: &'static str, work: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let finished = self.started(name);
        self.tracker.spawn(async move {
            let _finished = finished;
            work.await;
        });
    }

    /// Runs `operation` as the work `name` and waits for it: a caller that
    /// goes away (an HTTP client that hangs up) does not cut it short, and
    /// shutdown waits for it (see [`flotilla_api_types::tasks::to_completion`],
    /// which this tracks). A panic in it is raised again here. It runs in
    /// the caller's span (its trace, when telemetry is on).
    pub async fn to_completion<T, F>(
        self: &std::sync::Arc<Self>,
        name: &'static str,
        operation: F,
    ) -> T
    where
        T: Send + 'static,
        F: Future<Output = T> + Send + 'static,
    {
        use tracing::Instrument as _;
        let finished = self.started(name);
        let handle = self.tracker.spawn(
            async move {
                let _finished = finished;
                operation.await
            }
            .in_current_span(),
        );
        match handle.await {
            Ok(outcome) => outcome,
            Err(error) => std::panic::resume_unwind(error.into_panic()),
        }
    }

    /// Counts a piece of work `name` as running until the guard drops.
    fn started(self: &std::sync::Arc<Self>, name: &'static str) -> Finished {
        self.ledger.started(name);
        Finished {
            tasks: self.clone(),
            name,
        }
    }

    /// Cancelled when shutdown begins: work that would otherwise run on
    /// (a relayed connection) watches it and ends.
    pub fn stopping(&self) -> CancellationToken {
        self.stopping.clone()
    }

    /// Tells the spawned work to end ([`Self::stopping`]) and waits for it,
    /// up to `deadline`; answers how many pieces were still running.
    pub async fn stop(&self, deadline: Duration) -> usize {
        self.stopping.cancel();
        self.tracker.close();
        if tokio::time::timeout(deadline, self.tracker.wait())
            .await
            .is_err()
        {
            let left = self.tracker.len();
            tracing::warn!(left, "background work still running at shutdown");
            return left;
        }
        0
    }

    /// Each task as `/health` shows it; the error text only when
    /// `with_errors` (it may name internal addresses).
    pub fn report(&self, with_errors: bool) -> Vec<BackgroundTaskHealth> {
        self.ledger.report(with_errors)
    }
}

/// Counts a piece of work as finished when it ends, however it ends (a
/// panic included).
struct Finished {
    tasks: std::sync::Arc<BackgroundTasks>,
    name: &'static str,
}

impl Drop for Finished {
    fn drop(&mut self) {
        self.tasks.ledger.finished(self.name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_task_is_failing_from_a_failed_run_until_one_succeeds() {
        let tasks = BackgroundTasks::default();
        let at = |s: i64| DateTime::<Utc>::from_timestamp(s, 0).unwrap();
        tasks.record("idle sweep", at(1), RunOutcome::Done(3));
        tasks.record("idle sweep", at(2), RunOutcome::Failed("store down".into()));
        let [report] = &tasks.report(true)[..] else {
            panic!("one task")
        };
        assert_eq!((report.runs, report.failures, report.skipped), (2, 1, 0));
        assert!(report.failing);
        assert_eq!(report.last_run_at, Some(at(2)));
        assert_eq!(report.last_success_at, Some(at(1)));
        assert_eq!(report.last_error.as_deref(), Some("store down"));
        assert_eq!(
            tasks.report(false)[0].last_error,
            None,
            "no text without a key"
        );
        assert_eq!(tasks.report(false)[0].last_error_at, Some(at(2)));

        tasks.record("idle sweep", at(4), RunOutcome::Done(2));
        let report = &tasks.report(true)[0];
        assert!(!report.failing);
        assert_eq!(report.changed, 5, "what the runs changed, summed");
        assert_eq!(report.last_error, None);

        // Failed here, then another control plane took the task over.
        tasks.record("idle sweep", at(5), RunOutcome::Failed("store down".into()));
        tasks.record("idle sweep", at(6), RunOutcome::LeaseHeldElsewhere);
        let report = &tasks.report(true)[0];
        assert!(!report.failing);
        assert_eq!((report.runs, report.failures, report.skipped), (4, 2, 1));
    }

    #[tokio::test]
    async fn an_operation_runs_to_its_end_when_its_caller_goes_away() {
        let tasks = Arc::new(BackgroundTasks::default());
        let (release, released) = tokio::sync::oneshot::channel::<()>();
        let caller = tokio::spawn({
            let tasks = tasks.clone();
            async move {
                tasks
                    .to_completion("park", async move {
                        let _ = released.await;
                        7
                    })
                    .await
            }
        });
        tokio::task::yield_now().await;
        caller.abort();
        assert_eq!(tasks.report(false)[0].running, 1, "still parking");
        release.send(()).unwrap();
        assert_eq!(tasks.stop(Duration::from_secs(30)).await, 0);
        assert_eq!(tasks.report(false)[0].runs, 1);
        let answer = tasks.to_completion("park", async { 8 }).await;
        assert_eq!(answer, 8);
    }

    #[tokio::test]
    async fn work_that_panics_is_counted_as_finished() {
        let tasks = Arc::new(BackgroundTasks::default());
        tasks.spawn("node strays", async { panic!("a bug in the work") });
        assert_eq!(tasks.stop(Duration::from_secs(30)).await, 0);
        let report = &tasks.report(false)[0];
        assert_eq!((report.running, report.runs), (0, 1));
    }

    #[tokio::test]
    async fn work_that_watches_stopping_ends_at_shutdown() {
        let tasks = Arc::new(BackgroundTasks::default());
        let stopping = tasks.stopping();
        tasks.spawn("door relay", async move { stopping.cancelled().await });
        assert_eq!(tasks.stop(Duration::from_secs(30)).await, 0);
    }

    #[tokio::test]
    async fn spawned_work_is_counted_while_it_runs_and_waited_for() {
        let tasks = Arc::new(BackgroundTasks::default());
        let (release, released) = tokio::sync::oneshot::channel::<()>();
        tasks.spawn("node strays", async move {
            let _ = released.await;
        });
        assert_eq!(tasks.report(false)[0].running, 1);
        assert_eq!(
            tasks.stop(Duration::from_millis(50)).await,
            1,
            "still running"
        );
        release.send(()).unwrap();
        assert_eq!(tasks.stop(Duration::from_secs(30)).await, 0);
        let report = &tasks.report(false)[0];
        assert_eq!((report.running, report.runs), (0, 1));
    }
}
