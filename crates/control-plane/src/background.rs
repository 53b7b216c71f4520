//! Background reconcile tasks. Each runs on a timer, is idempotent, and logs what
//! it changed; all stop when the shutdown token fires: node offline sweep, idle
//! sweep, lifetime sweep (max_duration_minutes), the takeover of drains whose
//! control plane stopped, the end of idle MCP sessions, the end of instances
//! held by a control plane that stopped, metrics samples with alert
//! evaluation and event-log pruning, and one event delivery task per outbox
//! target. Each runs in one control plane of a cluster at a time, the holder
//! of its lease in the store; besides, each control plane renews the
//! instances its own work holds. Each timed run is recorded in
//! [`crate::app::tasks`] (`/health`, `/metrics`).

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::app::tasks::RunOutcome;
use crate::app::{ControlPlane, held_instances, outbox};

/// How long delivered events stay in the event log.
const EVENT_LOG_DAYS: i64 = 7;

/// Starts every background task of the control plane.
pub async fn spawn_all(
    control_plane: Arc<ControlPlane>,
    shutdown: CancellationToken,
) -> Vec<tokio::task::JoinHandle<()>> {
    let interval = Duration::from_secs_f64(control_plane.config().nodes.heartbeat_interval_sec);
    let sample_interval =
        Duration::from_secs_f64(control_plane.config().metrics.sample_interval_sec);
    let mut tasks = vec![
        spawn_every(
            interval,
            &shutdown,
            &control_plane,
            ("node offline sweep", Runs::OnePerCluster),
            |cp| async move { Ok(cp.node_offline_sweep().await?.len() as u64) },
        ),
        spawn_every(
            interval,
            &shutdown,
            &control_plane,
            ("idle sweep", Runs::OnePerCluster),
            |cp| async move { Ok(cp.instance_idle_sweep().await? as u64) },
        ),
        spawn_every(
            interval,
            &shutdown,
            &control_plane,
            ("lifetime sweep", Runs::OnePerCluster),
            |cp| async move { Ok(cp.instance_lifetime_sweep().await? as u64) },
        ),
        spawn_every(
            interval,
            &shutdown,
            &control_plane,
            ("drain takeover", Runs::OnePerCluster),
            |cp| async move { cp.drains_take_over().await },
        ),
        spawn_every(
            interval,
            &shutdown,
            &control_plane,
            ("mcp session expiry", Runs::OnePerCluster),
            |cp| async move { cp.mcp_sessions_expire().await },
        ),
        spawn_every(
            interval,
            &shutdown,
            &control_plane,
            ("held instance takeover", Runs::OnePerCluster),
            |cp| async move { cp.held_instances_take_over().await },
        ),
        spawn_every(
            held_instances::RENEW_EVERY,
            &shutdown,
            &control_plane,
            ("held instance renewal", Runs::EachControlPlane),
            |cp| async move { cp.held_instances_renew().await },
        ),
        spawn_every(
            sample_interval,
            &shutdown,
            &control_plane,
            ("metrics sample", Runs::OnePerCluster),
            |cp| async move {
                cp.metrics_sample().await?;
                cp.alerts_evaluate().await?;
                let cutoff = cp.now() - chrono::Duration::days(EVENT_LOG_DAYS);
                Ok(cp.store().events_prune(cutoff).await?)
            },
        ),
    ];
    tasks.extend(outbox::spawn(control_plane, shutdown).await);
    tasks
}

/// Where a timed task runs.
#[derive(Clone, Copy)]
enum Runs {
    /// In one control plane of the cluster at a time, the holder of its
    /// lease (held a little longer than a period, renewed every period;
    /// another takes over if it stops).
    OnePerCluster,
    /// In every control plane, on what it alone holds.
    EachControlPlane,
}

/// Runs `task` now and then every `interval` until shutdown, where `runs`
/// says, recording what each run changed (its `Ok`) or why it failed.
fn spawn_every<F, Fut>(
    interval: Duration,
    shutdown: &CancellationToken,
    control_plane: &Arc<ControlPlane>,
    (name, runs): (&'static str, Runs),
    task: F,
) -> tokio::task::JoinHandle<()>
where
    F: Fn(Arc<ControlPlane>) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = crate::error::Result<u64>> + Send + 'static,
{
    let control_plane = control_plane.clone();
    let lease = interval.mul_f64(2.5);
    tokio::spawn(run_every(interval, shutdown.clone(), move || {
        let control_plane = control_plane.clone();
        let run = task(control_plane.clone());
        async move {
            let held = match runs {
                Runs::EachControlPlane => Ok(true),
                Runs::OnePerCluster => control_plane.hold_lease(name, lease).await,
            };
            let outcome = match held {
                Ok(true) => outcome_of(name, run.await),
                Ok(false) => RunOutcome::LeaseHeldElsewhere,
                Err(error) => {
                    tracing::warn!(%error, task = name, "cannot take the task's lease");
                    RunOutcome::Failed(format!("cannot take the task's lease: {error}"))
                }
            };
            control_plane
                .tasks()
                .record(name, control_plane.now(), outcome);
        }
    }))
}

/// What a run of task `name` did, as recorded.
fn outcome_of(name: &str, run: crate::error::Result<u64>) -> RunOutcome {
    match run {
        Ok(changed) => RunOutcome::Done(changed),
        Err(error) => {
            tracing::warn!(%error, task = name, "background task failed");
            RunOutcome::Failed(error.to_string())
        }
    }
}

async fn run_every<F, Fut>(interval: Duration, shutdown: CancellationToken, mut task: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticker.tick() => task().await,
            _ = shutdown.cancelled() => return,
        }
    }
}
