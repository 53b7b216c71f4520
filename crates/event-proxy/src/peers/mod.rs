//! Several proxies as one service (`[peers]`; spec "peer synchronisation").
//!
//! - **Membership and interest travel by gossip** ([`gossip`], chitchat): each
//!   proxy publishes its HTTP URL (key `url`) and one key `t:<topic>` per topic
//!   it has subscribers on. A peer is live while its gossip heartbeat keeps
//!   advancing; one that dies is declared dead within `peer_timeout_sec`.
//! - **Each topic has an owner**: the live proxy (this one included) with the
//!   highest rendezvous hash of (node id, topic). The owner numbers the topic's
//!   events (`<owner start ms>-<seq>`), keeps the authoritative history, and
//!   sends each event to the peers interested in the topic over their
//!   [`link`]s, in batches of `message_batch_size`, in order. A publish on any
//!   other proxy is sent to the owner, which numbers it and answers with its
//!   id; so an id means the same event everywhere, and peers keep copies of the
//!   history of the topics they serve.
//! - **Subscribing on a proxy that does not own the topic** also tells the
//!   owner directly (`POST /peer/v1/watch`) before the stream starts: the owner
//!   registers the watch under the topic's lock, so no event falls between the
//!   subscription and gossip catching up, and answers with the events after the
//!   client's `Last-Event-ID` when this proxy cannot place it itself. When the
//!   owner cannot place it either (owners changed since), the peers that keep
//!   a copy of the topic's history are asked (`POST /peer/v1/history`). A
//!   client can thus resume on any proxy.
//! - When an owner dies, the next proxy in rendezvous order owns its topics
//!   (after `peer_timeout_sec`; publishes to those topics get 503 until then).
//!   It numbers under its own term, continuing the copy of the history it has
//!   if it had subscribers; a `Last-Event-ID` nobody can place gets a `missed`
//!   event. A returning proxy gets its topics back.
//! - **Peer traffic is signed** with keys derived from `peers.secret`: gossip
//!   datagrams ([`gossip`]) and HTTP requests ([`wire`]). Without the secret a
//!   process can neither join nor inject events.
//! - Revocations (`POST /admin/revoke`) are sent to every live peer and
//!   gossiped (key `r:<id>`) by every proxy that applied them, for
//!   [`crate::revoke::GOSSIP_RETENTION`]: a peer unreachable at that moment
//!   applies them once it hears from the cluster again.

pub mod gossip;
pub mod link;
pub mod wire;

mod inbound;
mod membership;
mod ownership;
mod revocations;

pub use inbound::handle;
pub use ownership::owner_among;

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use chitchat::{
    ChitchatConfig, ChitchatHandle, ChitchatId, FailureDetectorConfig, ProtocolVersion,
};
use serde_json::json;

use crate::ProxyState;
use crate::config::PeersConfig;
use crate::metrics::Metrics;
use link::Link;

const URL_KEY: &str = "url";
const TOPIC_PREFIX: &str = "t:";
const REVOCATION_PREFIX: &str = "r:";
pub const WATCH_PATH: &str = "/peer/v1/watch";
pub const REVOKE_PATH: &str = "/peer/v1/revoke";
pub const HISTORY_PATH: &str = "/peer/v1/history";
const PEER_CALL_TIMEOUT: Duration = Duration::from_secs(3);

/// Another proxy as this one sees it (its newest generation).
#[derive(Debug, Clone)]
pub struct Member {
    pub node_id: String,
    pub generation: u64,
    pub gossip_address: SocketAddr,
    pub url: Option<String>,
    pub live: bool,
    pub topics: Arc<HashSet<String>>,
}

/// Membership as of the last look at the gossip state.
#[derive(Debug, Default)]
pub struct View {
    pub members: Vec<Member>,
}

impl View {
    fn live(&self) -> impl Iterator<Item = &Member> {
        self.members.iter().filter(|m| m.live && m.url.is_some())
    }
}

pub struct Cluster {
    pub node_id: String,
    pub url: String,
    pub gossip_address: SocketAddr,
    config: PeersConfig,
    http_key: [u8; 32],
    chitchat: ChitchatHandle,
    view: RwLock<Arc<View>>,
    links: Mutex<HashMap<String, Arc<Link>>>,
    /// Topic → peers that watched it directly, until when.
    direct: Mutex<HashMap<String, Vec<(String, Instant)>>>,
    /// Topic → the owner this proxy told it has subscribers (node id and
    /// generation); a per-topic lock so concurrent first subscribers wait for
    /// one watch.
    watched: Mutex<HashMap<String, WatchedOwner>>,
    /// Revocations applied here, by id, with when they were taken: each is
    /// applied once.
    revocations: Mutex<HashMap<String, chrono::DateTime<chrono::Utc>>>,
    sender: Arc<link::Sender>,
    metrics: Arc<Metrics>,
    /// Its loops' runs (`peer membership`, `peer interest`), for `/health`.
    runs: flotilla_api_types::runs::RunLedger,
}

type WatchedOwner = Arc<tokio::sync::Mutex<Option<(String, u64)>>>;

fn secs(value: f64) -> Duration {
    Duration::from_secs_f64(value)
}

impl Cluster {
    /// Binds the gossip socket and joins `peer_addresses`.
    pub async fn start(
        config: &PeersConfig,
        http_addr: SocketAddr,
        max_body: usize,
        metrics: Arc<Metrics>,
    ) -> anyhow::Result<Arc<Self>> {
        let listen: SocketAddr = config.listen_address.parse().map_err(anyhow::Error::msg)?;
        let socket = tokio::net::UdpSocket::bind(listen)
            .await
            .with_context(|| format!("cannot listen on {listen}/UDP (peers.listen_address)"))?;
        let bound = socket.local_addr()?;
        let (gossip_address, node_id, url) = identity(config, bound, http_addr)?;
        let transport = gossip::SignedUdpTransport::new(
            socket,
            wire::derive_key(&config.secret, "gossip"),
            metrics.clone(),
        );
        let chitchat_config = chitchat_config(config, &node_id, gossip_address, bound);
        let chitchat = chitchat::spawn_chitchat(
            chitchat_config,
            vec![(URL_KEY.to_owned(), url.clone())],
            &transport,
        )
        .await?;
        let http_key = wire::derive_key(&config.secret, "http");
        let client = reqwest::Client::builder()
            .pool_idle_timeout(Duration::from_secs(30))
            .tcp_nodelay(true)
            .build()?;
        let sender = Arc::new(link::Sender {
            client,
            key: http_key,
            self_id: node_id.clone(),
            batch_size: config.message_batch_size,
            max_body,
            metrics: metrics.clone(),
        });
        tracing::info!(%node_id, %gossip_address, %url, "joining peers");
        Ok(Arc::new(Self {
            node_id,
            url,
            gossip_address,
            config: config.clone(),
            http_key,
            chitchat,
            view: RwLock::default(),
            links: Mutex::default(),
            direct: Mutex::default(),
            watched: Mutex::default(),
            revocations: Mutex::default(),
            sender,
            metrics,
            runs: Default::default(),
        }))
    }

    /// Keeps membership, links and this proxy's gossiped interest current
    /// until shutdown.
    pub fn spawn_tasks(state: &Arc<ProxyState>) -> Vec<tokio::task::JoinHandle<()>> {
        let Some(cluster) = state.peers.clone() else {
            return Vec::new();
        };
        let watcher = cluster.clone();
        let watched_state = state.clone();
        let membership = tokio::spawn(async move {
            let tick = watcher.refresh_tick();
            let mut tracked = HashMap::new();
            let mut interval = tokio::time::interval(tick);
            loop {
                tokio::select! {
                    _ = interval.tick() => {
                        let revocations = watcher.refresh(&mut tracked).await;
                        let applied = Ok::<_, std::convert::Infallible>(revocations.len() as u64);
                        watcher.runs.record_result("peer membership", &applied);
                        if !revocations.is_empty() {
                            crate::revoke::apply_gossiped(&watched_state, revocations).await;
                        }
                    }
                    _ = watched_state.shutdown.cancelled() => break,
                }
            }
            let _ = watcher.chitchat.initiate_shutdown();
            for link in watcher.links.lock().expect("links lock").drain() {
                link.1.close();
            }
        });
        let state = state.clone();
        let interest = tokio::spawn(async move {
            let mut interval = tokio::time::interval(secs(cluster.config.gossip_interval_sec));
            loop {
                tokio::select! {
                    _ = interval.tick() => {
                        let changed = cluster.reconcile_interest(&state).await;
                        let changed = Ok::<_, std::convert::Infallible>(changed);
                        cluster.runs.record_result("peer interest", &changed);
                    }
                    _ = state.shutdown.cancelled() => return,
                }
            }
        });
        vec![membership, interest]
    }

    /// How often the gossip state is read.
    fn refresh_tick(&self) -> Duration {
        (secs(self.config.gossip_interval_sec) / 4)
            .clamp(Duration::from_millis(10), Duration::from_millis(250))
    }

    pub fn view(&self) -> Arc<View> {
        self.view.read().expect("view lock").clone()
    }

    /// A signed JSON call to a peer.
    async fn call<T: serde::de::DeserializeOwned>(
        &self,
        url: &str,
        path: &str,
        body: &impl serde::Serialize,
    ) -> anyhow::Result<T> {
        self.sender.call(url, path, body, PEER_CALL_TIMEOUT).await
    }

    /// The largest delay, over every link, of an event not yet delivered.
    pub fn sync_lag(&self) -> Duration {
        self.links
            .lock()
            .expect("links lock")
            .values()
            .map(|link| link.lag())
            .max()
            .unwrap_or_default()
    }

    /// For `GET /health`.
    pub fn health(&self) -> serde_json::Value {
        let view = self.view();
        let members: Vec<_> = view
            .members
            .iter()
            .map(|m| {
                json!({
                    "node_id": m.node_id,
                    "url": m.url,
                    "gossip_address": m.gossip_address.to_string(),
                    "status": if m.live { "live" } else { "dead" },
                    "topics": m.topics.len(),
                })
            })
            .collect();
        json!({
            "node_id": self.node_id,
            "gossip_address": self.gossip_address.to_string(),
            "url": self.url,
            "connected": view.live().count(),
            "members": members,
            "loops": self.runs.report(false),
        })
    }
}

/// The address peers gossip with, this proxy's node id and the URL peers
/// call it at: as configured, or derived from the sockets.
fn identity(
    config: &PeersConfig,
    bound: SocketAddr,
    http_addr: SocketAddr,
) -> anyhow::Result<(SocketAddr, String, String)> {
    let gossip_address: SocketAddr = if config.advertise_address.is_empty() {
        bound
    } else {
        config
            .advertise_address
            .parse()
            .map_err(anyhow::Error::msg)?
    };
    let node_id = if config.node_id.is_empty() {
        gossip_address.to_string()
    } else {
        config.node_id.clone()
    };
    let url = if config.public_url.is_empty() {
        let host = if http_addr.ip().is_unspecified() {
            gossip_address.ip()
        } else {
            http_addr.ip()
        };
        format!("http://{}", SocketAddr::new(host, http_addr.port()))
    } else {
        config.public_url.trim_end_matches('/').to_owned()
    };
    Ok((gossip_address, node_id, url))
}

/// Chitchat's settings: the cluster id derived from the secret (proxies
/// with another secret are another cluster), a generation per start, and
/// `peer_timeout_sec` as the failure detector's interval.
fn chitchat_config(
    config: &PeersConfig,
    node_id: &str,
    gossip_address: SocketAddr,
    bound: SocketAddr,
) -> ChitchatConfig {
    let generation = chrono::Utc::now().timestamp_millis().max(0) as u64;
    let cluster_id = format!(
        "flotilla-{}",
        &hex::encode(wire::derive_key(&config.secret, "cluster id"))[..16]
    );
    let gossip_interval = secs(config.gossip_interval_sec);
    ChitchatConfig {
        chitchat_id: ChitchatId::new(node_id.to_owned(), generation, gossip_address),
        cluster_id,
        gossip_interval,
        listen_addr: bound,
        seed_nodes: config.peer_addresses.clone(),
        failure_detector_config: FailureDetectorConfig {
            max_interval: secs(config.peer_timeout_sec),
            initial_interval: gossip_interval,
            dead_node_grace_period: Duration::from_secs(600),
            ..FailureDetectorConfig::default()
        },
        marked_for_deletion_grace_period: Duration::from_secs(600),
        catchup_callback: None,
        extra_liveness_predicate: None,
        protocol_version: ProtocolVersion::V0,
    }
}
