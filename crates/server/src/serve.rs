//! `flotilla serve`: the control plane, one in-process node agent running real
//! Chromium, on the embedded SQLite store under `data_dir` — zero configuration.
//!
//! Start order: store → control plane → listeners → agent (registers in-process)
//! → HTTP servers and background tasks. Shutdown runs the other way: stop
//! accepting requests, stop background tasks, stop every browser gracefully
//! (recorded as `stopped`), close the store.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;

use anyhow::Context as _;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use flotilla_control_plane::{Clock, ControlPlane, Store, SystemClock};
use flotilla_event_proxy::Proxy;
use flotilla_event_proxy::config::ProxyConfig;
use flotilla_net::Listeners;
use flotilla_node_agent::snapshot::SnapshotStore;
use flotilla_node_agent::{Agent, AgentSettings};

use crate::config::FlotillaConfig;
use crate::local::{Artifacts, LocalLink, LocalNode};

/// A running `serve`.
pub struct Serve {
    pub control_addr: SocketAddr,
    pub agent_addr: SocketAddr,
    pub proxy_addr: SocketAddr,
    proxy: Proxy,
    pub control_plane: Arc<ControlPlane>,
    pub agent: Agent,
    shutdown: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
}

impl Serve {
    pub async fn start(config: FlotillaConfig) -> anyhow::Result<Serve> {
        Self::start_with_clock(config, Arc::new(SystemClock)).await
    }

    pub async fn start_with_clock(
        config: FlotillaConfig,
        clock: Arc<dyn Clock>,
    ) -> anyhow::Result<Serve> {
        config.validate_serving()?;
        crate::files::owner_only(&config.data_dir)?;
        std::fs::create_dir_all(&config.data_dir)
            .with_context(|| format!("cannot create data_dir {}", config.data_dir.display()))?;
        let data_dir = config.data_dir.canonicalize()?;
        let store =
            Store::connect(&config.database_url(), config.control.store.max_connections).await?;
        let snapshots = SnapshotStore::open(&config.snapshots, &data_dir.join("snapshots"))?;
        let listeners = process_listeners(&config, flotilla_net::Runs::Browsers);
        let control_listener = bind(config.listen_addr()?, "listen").await?;
        let control_addr = control_listener.local_addr()?;

        // The proxy first: the control plane publishes to it, and it verifies
        // subscribers' tokens with the control plane.
        let (proxy_config, control_config) = wire_events(&config, control_addr);
        let proxy = Proxy::start_with(proxy_config, clock.clone(), listeners.clone()).await?;
        let proxy_addr = proxy.addr;
        let mut control_config = control_config;
        if control_config.events.proxy_url.is_none() {
            control_config.events.proxy_url =
                Some(format!("http://{}", loopback_if_unspecified(proxy_addr)));
        }
        let control_plane = Arc::new(
            ControlPlane::new(store, control_config, clock.clone())
                .with_snapshots(Arc::new(Artifacts(snapshots.clone()))),
        );

        let agent_listener = bind_agent_listener(&config).await?;
        let agent_addr = agent_listener.local_addr()?;
        let settings = agent_settings(
            &config,
            &data_dir,
            (agent_addr, control_addr.ip()),
            snapshots,
            (clock.clone(), listeners.clone()),
        );
        let agent = Agent::start(settings, Arc::new(LocalLink(control_plane.clone()))).await?;
        control_plane
            .node_connections()
            .attach(agent.node_id().clone(), Arc::new(LocalNode(agent.clone())));

        let shutdown = CancellationToken::new();
        let mut tasks =
            flotilla_control_plane::background::spawn_all(control_plane.clone(), shutdown.clone())
                .await;
        tasks.push(spawn_http(
            control_listener,
            flotilla_control_plane::http::router(control_plane.clone()),
            &listeners,
            shutdown.clone(),
        ));
        let cluster_token = config
            .control
            .cluster_token
            .clone()
            .unwrap_or_else(random_token);
        tasks.push(spawn_http(
            agent_listener,
            flotilla_node_agent::agent::api::router(agent.clone(), &cluster_token),
            &listeners,
            shutdown.clone(),
        ));
        Ok(Serve {
            control_addr,
            agent_addr,
            proxy_addr,
            proxy,
            control_plane,
            agent,
            shutdown,
            tasks,
        })
    }

    pub fn control_url(&self) -> String {
        format!("http://{}", self.control_addr)
    }

    pub fn proxy_url(&self) -> String {
        format!("http://{}", self.proxy_addr)
    }

    /// Graceful shutdown: no new requests, every browser closed and
    /// recorded (call [`flotilla_node_agent::Agent::drain_before_shutdown`]
    /// first to move them elsewhere).
    pub async fn shutdown(self) {
        self.proxy.shutdown().await;
        self.shutdown.cancel();
        for task in self.tasks {
            let _ = task.await;
        }
        // Relays end; strays are stopped while the agent still runs.
        self.control_plane
            .tasks()
            .stop(crate::control::BACKGROUND_WORK_DEADLINE)
            .await;
        self.agent.shutdown().await;
        // The local pairing references both ways; detaching ends the cycle.
        self.control_plane
            .node_connections()
            .detach(self.agent.node_id());
        self.control_plane.store().close().await;
    }
}

/// Connects the control plane and the proxy of `serve`, unless configured
/// otherwise: the proxy verifies subscriber tokens with the control plane
/// (`POST /v2/tokens/verify`, tokens from `POST /v2/tokens`), and the control
/// plane publishes lifecycle events to the proxy with a publisher key made up
/// for this run.
fn wire_events(
    config: &FlotillaConfig,
    control_addr: SocketAddr,
) -> (ProxyConfig, flotilla_control_plane::ControlPlaneConfig) {
    let mut proxy = config.proxy.clone();
    let mut control = config.control.clone();
    if proxy.jwt_verifier.webhook_url.is_empty() && proxy.jwt_verifier.require_authentication {
        proxy.jwt_verifier.webhook_url = format!(
            "http://{}/v2/tokens/verify",
            loopback_if_unspecified(control_addr)
        );
    }
    if control.events.proxy_url.is_none() {
        let key = control
            .events
            .publish_key
            .clone()
            .unwrap_or_else(random_token);
        if !proxy.publisher.api_keys.contains(&key) {
            proxy.publisher.api_keys.push(key.clone());
        }
        control.events.publish_key = Some(key);
    }
    (proxy, control)
}

/// `0.0.0.0:port` → `127.0.0.1:port`, for calls between the parts of `serve`.
fn loopback_if_unspecified(addr: SocketAddr) -> SocketAddr {
    if addr.ip().is_unspecified() {
        SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), addr.port())
    } else {
        addr
    }
}

pub(crate) async fn bind(addr: SocketAddr, key: &str) -> anyhow::Result<TcpListener> {
    flotilla_net::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr} ({key}); is another process using it?"))
}

/// Serves `router` on `listener` within the process's connection budget
/// until `shutdown`.
pub(crate) fn spawn_http(
    listener: TcpListener,
    router: axum::Router,
    listeners: &Listeners,
    shutdown: CancellationToken,
) -> JoinHandle<()> {
    let listeners = listeners.clone();
    tokio::spawn(async move { listeners.serve_router(listener, router, shutdown).await })
}

/// The listeners of a process starting now: its descriptor limit raised to
/// the hard limit first, so that the budget is sized from what it may use.
pub(crate) fn process_listeners(config: &FlotillaConfig, runs: flotilla_net::Runs) -> Listeners {
    let descriptors = flotilla_net::descriptors::raise_to_hard_limit();
    let listeners = Listeners::new(&config.listeners, runs);
    tracing::debug!(
        descriptors,
        connections = listeners.budget().total(),
        "connection budget"
    );
    listeners
}

/// Binds `agent.listen` (the agent API).
pub(crate) async fn bind_agent_listener(config: &FlotillaConfig) -> anyhow::Result<TcpListener> {
    let listen: SocketAddr = config.agent.listen.parse().with_context(|| {
        format!(
            "agent.listen must be an address like 127.0.0.1:0 (got {:?})",
            config.agent.listen
        )
    })?;
    bind(listen, "agent.listen").await
}

/// The agent API's address as the control plane reaches it (the node's
/// `address`): `agent.advertise`, else the address it listens on, where an
/// unspecified IP (`0.0.0.0`, `::`) becomes the public host.
pub(crate) fn agent_address(
    config: &FlotillaConfig,
    listen: SocketAddr,
    public_host: &str,
) -> String {
    match &config.agent.advertise {
        Some(advertise) => advertise.clone(),
        None if listen.ip().is_unspecified() => format!("http://{public_host}:{}", listen.port()),
        None => format!("http://{listen}"),
    }
}

/// `agent.public_host`, or a default from the address the process listens on.
pub(crate) fn public_host(config: &FlotillaConfig, listen_ip: IpAddr) -> String {
    config
        .agent
        .public_host
        .clone()
        .unwrap_or_else(|| default_public_host(listen_ip))
}

/// The host in instance URLs when `agent.public_host` is not set.
pub fn default_public_host(listen_ip: IpAddr) -> String {
    if listen_ip.is_unspecified() {
        tracing::warn!(
            "listening on all interfaces: instance URLs use 127.0.0.1; set agent.public_host for remote clients"
        );
        "127.0.0.1".into()
    } else {
        listen_ip.to_string()
    }
}

/// The node agent's settings (`serve`'s local agent and `flotilla agent`):
/// its API listens on `listen`; instance URLs default to `host_ip`'s host.
pub(crate) fn agent_settings(
    config: &FlotillaConfig,
    data_dir: &std::path::Path,
    (listen, host_ip): (SocketAddr, IpAddr),
    snapshots: SnapshotStore,
    (clock, listeners): (Arc<dyn Clock>, Listeners),
) -> AgentSettings {
    let public_host = public_host(config, host_ip);
    let address = agent_address(config, listen, &public_host);
    AgentSettings {
        config: config.agent.clone(),
        data_dir: data_dir.join("agent"),
        address,
        bind_address: config
            .agent
            .bind_address
            .unwrap_or_else(|| default_bind_address(&public_host)),
        public_host,
        snapshots,
        clock,
        listeners,
    }
}

/// Instance ports stay on loopback unless clients come from elsewhere.
pub fn default_bind_address(public_host: &str) -> Ipv4Addr {
    match public_host.parse::<IpAddr>() {
        Ok(ip) if ip.is_loopback() => Ipv4Addr::LOCALHOST,
        _ if public_host == "localhost" => Ipv4Addr::LOCALHOST,
        _ => Ipv4Addr::UNSPECIFIED,
    }
}

/// A random token for the local agent API when no cluster token is configured.
pub fn random_token() -> String {
    let bytes: [u8; 32] = rand::random();
    hex::encode(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_agent_advertises_a_reachable_address() {
        let mut config = FlotillaConfig::default();
        let any: SocketAddr = "0.0.0.0:7001".parse().unwrap();
        let local: SocketAddr = "127.0.0.1:7001".parse().unwrap();
        assert_eq!(
            agent_address(&config, any, "node-a.example"),
            "http://node-a.example:7001",
            "never 0.0.0.0"
        );
        assert_eq!(agent_address(&config, local, "x"), "http://127.0.0.1:7001");
        config.agent.advertise = Some("http://10.1.2.3:7001".into());
        assert_eq!(agent_address(&config, any, "x"), "http://10.1.2.3:7001");
    }
}
