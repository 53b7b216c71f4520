//! Background reconcile tasks. Each runs on a timer, is idempotent, and logs what
//! it changed; all stop when the shutdown token fires.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::app::ControlPlane;

/// Starts every background task of the control plane.
pub fn spawn_all(
    control_plane: Arc<ControlPlane>,
    shutdown: CancellationToken,
) -> Vec<tokio::task::JoinHandle<()>> {
    let interval = Duration::from_secs_f64(control_plane.config().nodes.heartbeat_interval_sec);
    let offline = control_plane.clone();
    let idle = control_plane;
    vec![
        tokio::spawn(run_every(interval, shutdown.clone(), move || {
            let control_plane = offline.clone();
            async move {
                if let Err(error) = control_plane.node_offline_sweep().await {
                    tracing::warn!(%error, "node offline sweep failed");
                }
            }
        })),
        tokio::spawn(run_every(interval, shutdown, move || {
            let control_plane = idle.clone();
            async move {
                if let Err(error) = control_plane.instance_idle_sweep().await {
                    tracing::warn!(%error, "idle sweep failed");
                }
            }
        })),
    ]
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
