//! `flotilla control`: the control plane without a local node. Agents
//! (`flotilla agent`) register with it over HTTP using the cluster token; its
//! store is SQLite under `data_dir` or a PostgreSQL shared with other control
//! planes (`store.database_url`).

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context as _;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use flotilla_control_plane::{ControlPlane, Store, SystemClock};
use flotilla_node_agent::snapshot::SnapshotStore;

use crate::config::FlotillaConfig;
use crate::serve::{bind, process_listeners, spawn_http};

/// How long shutdown waits for the control plane's background work (a
/// node's strays being stopped) once relays are told to end.
pub(crate) const BACKGROUND_WORK_DEADLINE: std::time::Duration = std::time::Duration::from_secs(10);

/// A running `control`.
pub struct Control {
    pub addr: SocketAddr,
    pub control_plane: Arc<ControlPlane>,
    shutdown: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
}

impl Control {
    pub async fn start(config: FlotillaConfig) -> anyhow::Result<Control> {
        config.validate_serving()?;
        if config.control.cluster_token.is_none() {
            anyhow::bail!(
                "flotilla control needs cluster_token (or FLOTILLA_CLUSTER_TOKEN): agents present it to register"
            );
        }
        crate::files::owner_only(&config.data_dir)?;
        let store =
            Store::connect(&config.database_url(), config.control.store.max_connections).await?;
        let snapshots = SnapshotStore::open(&config.snapshots, &config.data_dir.join("snapshots"))
            .context("cannot open the snapshot store")?;
        let control_plane = Arc::new(
            ControlPlane::new(store, config.control.clone(), Arc::new(SystemClock))
                .with_snapshots(Arc::new(crate::local::Artifacts(snapshots))),
        );
        let listeners = process_listeners(&config, flotilla_net::Runs::NoBrowsers);
        let listener = bind(config.listen_addr()?, "listen").await?;
        let addr = listener.local_addr()?;
        let shutdown = CancellationToken::new();
        let mut tasks =
            flotilla_control_plane::background::spawn_all(control_plane.clone(), shutdown.clone())
                .await;
        tasks.push(spawn_http(
            listener,
            flotilla_control_plane::http::router(control_plane.clone()),
            &listeners,
            shutdown.clone(),
        ));
        Ok(Control {
            addr,
            control_plane,
            shutdown,
            tasks,
        })
    }

    pub async fn shutdown(self) {
        self.shutdown.cancel();
        for task in self.tasks {
            let _ = task.await;
        }
        self.control_plane
            .tasks()
            .stop(BACKGROUND_WORK_DEADLINE)
            .await;
        self.control_plane.store().close().await;
    }
}
