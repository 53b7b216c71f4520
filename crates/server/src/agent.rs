//! `flotilla agent`: a node agent on its own, registered with a control plane
//! over HTTP (`--control-plane URL`) and serving the agent API that control
//! planes call, both with the cluster token.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context as _;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use flotilla_control_plane::SystemClock;
use flotilla_node_agent::snapshot::SnapshotStore;
use flotilla_node_agent::{Agent, HttpLink};

use crate::config::FlotillaConfig;
use crate::serve::{agent_settings, bind_agent_listener, process_listeners, spawn_http};

/// A running `agent`.
pub struct AgentNode {
    pub addr: SocketAddr,
    pub agent: Agent,
    shutdown: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
}

impl AgentNode {
    pub async fn start(config: FlotillaConfig) -> anyhow::Result<AgentNode> {
        config.validate()?;
        let control_plane_url = config
            .agent
            .control_plane_url
            .clone()
            .context("flotilla agent needs --control-plane URL (agent.control_plane_url)")?;
        url::Url::parse(&control_plane_url).with_context(|| {
            format!("agent.control_plane_url {control_plane_url:?} is not a URL")
        })?;
        let token = config.control.cluster_token.clone().context(
            "flotilla agent needs cluster_token (or FLOTILLA_CLUSTER_TOKEN), the same as its control plane's",
        )?;
        crate::files::owner_only(&config.data_dir)?;
        std::fs::create_dir_all(&config.data_dir)
            .with_context(|| format!("cannot create data_dir {}", config.data_dir.display()))?;
        let data_dir = config.data_dir.canonicalize()?;
        let listeners = process_listeners(&config, flotilla_net::Runs::Browsers);
        let listener = bind_agent_listener(&config).await?;
        let addr = listener.local_addr()?;
        let snapshots = SnapshotStore::open(&config.snapshots, &data_dir.join("snapshots"))?;
        let settings = agent_settings(
            &config,
            &data_dir,
            (addr, addr.ip()),
            snapshots,
            (Arc::new(SystemClock), listeners.clone()),
        );
        let link = Arc::new(HttpLink::new(&control_plane_url, &token));
        let shutdown = CancellationToken::new();
        // Serve the agent API before registering: the control plane may call at once.
        let (agent_tx, agent_rx) = tokio::sync::oneshot::channel::<Agent>();
        let router_shutdown = shutdown.clone();
        let server = tokio::spawn(async move {
            let Ok(agent) = agent_rx.await else { return };
            let router = flotilla_node_agent::agent::api::router(agent, &token);
            let _ = spawn_http(listener, router, &listeners, router_shutdown).await;
        });
        let agent = Agent::start(settings, link).await?;
        let _ = agent_tx.send(agent.clone());
        Ok(AgentNode {
            addr,
            agent,
            shutdown,
            tasks: vec![server],
        })
    }

    /// Stops serving, then stops every browser gracefully (call
    /// [`flotilla_node_agent::Agent::drain_before_shutdown`] first to move
    /// them elsewhere).
    pub async fn shutdown(self) {
        self.shutdown.cancel();
        for task in self.tasks {
            let _ = task.await;
        }
        self.agent.shutdown().await;
    }
}
