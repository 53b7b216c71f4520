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
use crate::http::{Request, Response};
use crate::metrics::Metrics;
use crate::refusal::Refusal;
use crate::revoke::{GOSSIP_RETENTION, PeerRevocation};
use crate::topics::{Frame, Replay, Resume, parse_last_event_id, validate_topic};
use link::Link;
use wire::{Batch, BatchReply, Watch, WatchReply, WireFrame, WirePublish};

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
}

type WatchedOwner = Arc<tokio::sync::Mutex<Option<(String, u64)>>>;

/// Rendezvous score of `node_id` for `topic`: FNV-1a, then a 64-bit mix
/// (stable across builds and platforms, unlike std's hasher).
fn score(node_id: &str, topic: &str) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in node_id.bytes().chain([0xff]).chain(topic.bytes()) {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash ^= hash >> 30;
    hash = hash.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    hash ^= hash >> 27;
    hash = hash.wrapping_mul(0x94d0_49bb_1331_11eb);
    hash ^ (hash >> 31)
}

/// The owner of `topic` among `node_ids`: the highest (score, node id).
pub fn owner_among<'a>(topic: &str, node_ids: &[&'a str]) -> Option<&'a str> {
    node_ids
        .iter()
        .copied()
        .max_by_key(|node_id| (score(node_id, topic), *node_id))
}

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
        let generation = chrono::Utc::now().timestamp_millis().max(0) as u64;
        let cluster_id = format!(
            "flotilla-{}",
            &hex::encode(wire::derive_key(&config.secret, "cluster id"))[..16]
        );
        let transport = gossip::SignedUdpTransport::new(
            socket,
            wire::derive_key(&config.secret, "gossip"),
            metrics.clone(),
        );
        let gossip_interval = secs(config.gossip_interval_sec);
        let chitchat_config = ChitchatConfig {
            chitchat_id: ChitchatId::new(node_id.clone(), generation, gossip_address),
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
        };
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
                    _ = interval.tick() => cluster.reconcile_interest(&state).await,
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

    /// Reads the gossip state: liveness from heartbeats, URLs, interest.
    /// Returns the gossiped revocations not applied here yet.
    async fn refresh(&self, tracked: &mut HashMap<String, Tracked>) -> Vec<PeerRevocation> {
        let now = Instant::now();
        let mut revocations: Vec<PeerRevocation> = Vec::new();
        // A dead peer's last heartbeat can reach this proxy up to a gossip
        // interval late (relayed by a third), and is seen up to one read
        // interval later: both come off, so that a death is declared within
        // `peer_timeout_sec` of it.
        let timeout = secs(self.config.peer_timeout_sec)
            .saturating_sub(secs(self.config.gossip_interval_sec) + self.refresh_tick());
        {
            let chitchat = self.chitchat.chitchat();
            let chitchat = chitchat.lock().await;
            // The newest generation of each other node.
            let mut newest: HashMap<&str, (&ChitchatId, &chitchat::NodeState)> = HashMap::new();
            for (id, node) in chitchat.node_states() {
                if *id.node_id == *self.node_id {
                    continue;
                }
                let entry = newest.entry(&id.node_id).or_insert((id, node));
                if id.generation_id > entry.0.generation_id {
                    *entry = (id, node);
                }
            }
            tracked.retain(|node_id, _| newest.contains_key(node_id.as_str()));
            for (node_id, (id, node)) in newest {
                let heartbeat = u64::from(node.heartbeat());
                let entry = tracked
                    .entry(node_id.to_owned())
                    .or_insert_with(|| Tracked::new(id, node));
                if entry.generation != id.generation_id {
                    *entry = Tracked::new(id, node);
                }
                if heartbeat > entry.heartbeat {
                    entry.heartbeat = heartbeat;
                    entry.advanced_at = Some(now);
                }
                if entry.max_version != node.max_version() {
                    entry.max_version = node.max_version();
                    entry.url = node.get(URL_KEY).map(str::to_owned);
                    entry.topics = Arc::new(
                        node.iter_prefix(TOPIC_PREFIX)
                            .map(|(key, _)| key[TOPIC_PREFIX.len()..].to_owned())
                            .collect(),
                    );
                    let applied = self.revocations.lock().expect("revocations lock");
                    for (_, value) in node.iter_prefix(REVOCATION_PREFIX) {
                        if let Ok(revocation) = serde_json::from_str::<PeerRevocation>(&value.value)
                            && !applied.contains_key(&revocation.id)
                            && !revocations.iter().any(|r| r.id == revocation.id)
                        {
                            revocations.push(revocation);
                        }
                    }
                }
            }
        }
        let members: Vec<Member> = tracked
            .iter()
            .map(|(node_id, t)| Member {
                node_id: node_id.clone(),
                generation: t.generation,
                gossip_address: t.gossip_address,
                url: t.url.clone(),
                live: t
                    .advanced_at
                    .is_some_and(|at| now.duration_since(at) < timeout),
                topics: t.topics.clone(),
            })
            .collect();
        let live: HashSet<&str> = members
            .iter()
            .filter(|m| m.live && m.url.is_some())
            .map(|m| m.node_id.as_str())
            .collect();
        self.metrics.peers_connected.set(live.len() as i64);
        {
            let mut links = self.links.lock().expect("links lock");
            links.retain(|node_id, link| {
                let keep = live.contains(node_id.as_str());
                if !keep {
                    tracing::info!(peer = %node_id, "peer is gone");
                    link.close();
                }
                keep
            });
        }
        let view = Arc::new(View { members });
        for member in view.live() {
            self.link_for(member);
        }
        *self.view.write().expect("view lock") = view;
        revocations
    }

    /// Records `revocation` as applied here and gossips it (the cluster keeps
    /// it while any proxy that applied it runs). False when it already was.
    pub async fn remember_revocation(&self, revocation: &PeerRevocation) -> bool {
        let new = self
            .revocations
            .lock()
            .expect("revocations lock")
            .insert(revocation.id.clone(), revocation.taken_at())
            .is_none();
        if new {
            let key = format!("{REVOCATION_PREFIX}{}", revocation.id);
            let value = serde_json::to_string(revocation).unwrap_or_default();
            self.chitchat
                .with_chitchat(|chitchat| chitchat.self_node_state().set(&key, &value))
                .await;
        }
        new
    }

    /// Stops gossiping revocations older than [`GOSSIP_RETENTION`], and
    /// forgets them a while later (when no peer gossips them any more).
    async fn expire_revocations(&self, now: chrono::DateTime<chrono::Utc>) {
        let retention = chrono::TimeDelta::from_std(GOSSIP_RETENTION).unwrap_or_default();
        let expired: Vec<String> = {
            let mut applied = self.revocations.lock().expect("revocations lock");
            applied.retain(|_, taken| now - *taken < retention * 2);
            applied
                .iter()
                .filter(|(_, taken)| now - **taken >= retention)
                .map(|(id, _)| format!("{REVOCATION_PREFIX}{id}"))
                .collect()
        };
        if expired.is_empty() {
            return;
        }
        self.chitchat
            .with_chitchat(|chitchat| {
                let node = chitchat.self_node_state();
                for key in &expired {
                    if node.contains_key(key) {
                        node.delete(key);
                    }
                }
            })
            .await;
    }

    /// The link to a live member, (re)opened when it is new or restarted.
    fn link_for(&self, member: &Member) -> Option<Arc<Link>> {
        let url = member.url.as_ref()?;
        let mut links = self.links.lock().expect("links lock");
        if let Some(link) = links.get(&member.node_id)
            && link.generation == member.generation
            && link.url == *url
        {
            return Some(link.clone());
        }
        tracing::info!(peer = %member.node_id, %url, "peer link open");
        let link = Link::start(
            member.node_id.clone(),
            member.generation,
            url.clone(),
            self.sender.clone(),
        );
        if let Some(old) = links.insert(member.node_id.clone(), link.clone()) {
            old.close();
        }
        Some(link)
    }

    /// The topic's owner: `None` when it is this proxy.
    pub fn owner(&self, topic: &str) -> Option<Arc<Link>> {
        let view = self.view();
        let mut best = (score(&self.node_id, topic), self.node_id.as_str());
        let mut owner: Option<&Member> = None;
        for member in view.live() {
            let candidate = (score(&member.node_id, topic), member.node_id.as_str());
            if candidate > best {
                best = candidate;
                owner = Some(member);
            }
        }
        owner.and_then(|member| self.link_for(member))
    }

    /// Sends an event this proxy numbered to every live peer interested in
    /// its topic. Runs under the topic's lock (keeps the order).
    pub fn forward(&self, topic: &str, frame: &Arc<Frame>) {
        let view = self.view();
        let now = Instant::now();
        let direct = self.direct.lock().expect("direct lock");
        let watchers = direct.get(topic);
        let mut wire: Option<WireFrame> = None;
        for member in view.live() {
            let interested = member.topics.contains(topic)
                || watchers.is_some_and(|w| {
                    w.iter()
                        .any(|(n, until)| *n == member.node_id && *until > now)
                });
            if interested && let Some(link) = self.link_for(member) {
                let frame = wire
                    .get_or_insert_with(|| WireFrame::new(topic, frame))
                    .clone();
                link.send_frame(frame, &self.metrics);
            }
        }
    }

    /// Gossips that this proxy has subscribers on `topic` (at the first one).
    pub async fn announce(&self, topic: &str) {
        let key = format!("{TOPIC_PREFIX}{topic}");
        self.chitchat
            .with_chitchat(|chitchat| chitchat.self_node_state().set(&key, ""))
            .await;
    }

    /// Makes the gossiped interest match the topics with subscribers, and
    /// forgets expired direct watches and revocations.
    async fn reconcile_interest(&self, state: &ProxyState) {
        self.expire_revocations(state.clock.now()).await;
        let wanted: HashSet<String> = state.topics.subscribed().into_iter().collect();
        self.chitchat
            .with_chitchat(|chitchat| {
                let node = chitchat.self_node_state();
                let stale: Vec<String> = node
                    .iter_prefix(TOPIC_PREFIX)
                    .map(|(key, _)| key.to_owned())
                    .filter(|key| !wanted.contains(&key[TOPIC_PREFIX.len()..]))
                    .collect();
                for key in stale {
                    node.delete(&key);
                }
                for topic in &wanted {
                    let key = format!("{TOPIC_PREFIX}{topic}");
                    if !node.contains_key(&key) {
                        node.set(key, "");
                    }
                }
            })
            .await;
        self.watched
            .lock()
            .expect("watched lock")
            .retain(|topic, _| wanted.contains(topic));
        // A topic whose owner changed (died, returned): tell the new owner
        // directly rather than wait for it to read the gossip.
        for topic in &wanted {
            let Some(owner) = self.owner(topic) else {
                continue;
            };
            let owner_key = (owner.node_id.clone(), owner.generation);
            let watched = self
                .watched
                .lock()
                .expect("watched lock")
                .get(topic)
                .cloned();
            let stale = watched.is_none_or(|lock| {
                lock.try_lock()
                    .is_ok_and(|current| current.as_ref() != Some(&owner_key))
            });
            if stale {
                self.watch_owner(&owner, topic, None, false).await;
            }
        }
        let now = Instant::now();
        self.direct
            .lock()
            .expect("direct lock")
            .retain(|_, watchers| {
                watchers.retain(|(_, until)| *until > now);
                !watchers.is_empty()
            });
    }

    /// How long a direct watch counts without gossip confirming it.
    fn direct_watch_ttl(&self) -> Duration {
        (secs(self.config.gossip_interval_sec) * 30).max(Duration::from_secs(60))
    }

    /// Before a stream starts: on a topic this proxy does not own, makes sure
    /// the owner sends its events here. When the client's `Last-Event-ID`
    /// could not be placed here, returns the replay of the owner, or of a peer
    /// keeping a copy of the topic's history (after an owner changed, the
    /// former owner's events may only be there); `None` leaves this proxy's own.
    pub async fn join(&self, topic: &str, resume: Option<&Resume>, placed: bool) -> Option<Replay> {
        let need_history = resume.is_some() && !placed;
        let owner = self.owner(topic);
        let mut fallback = None;
        if let Some(owner) = &owner {
            let from_owner = self.watch_owner(owner, topic, resume, need_history).await;
            match from_owner {
                Some(replay) if replay.placed => return Some(replay),
                other => fallback = other,
            }
        }
        if !need_history {
            return None;
        }
        let view = self.view();
        let owner_id = owner.as_ref().map(|o| o.node_id.as_str());
        let request = Watch {
            topic: topic.to_owned(),
            last_event_id: resume.map(|r| r.text.clone()),
        };
        for member in view
            .live()
            .filter(|m| m.topics.contains(topic) && Some(m.node_id.as_str()) != owner_id)
        {
            let url = member.url.as_deref().unwrap_or_default();
            match self.call::<WatchReply>(url, HISTORY_PATH, &request).await {
                Ok(reply) if reply.placed => return Some(replay_of(reply)),
                Ok(_) => {}
                Err(error) => {
                    tracing::debug!(%topic, peer = %member.node_id, %error, "history request failed")
                }
            }
        }
        fallback
    }

    /// Tells the owner this proxy has subscribers on `topic` (once per owner),
    /// and asks for its replay when `need_history`.
    async fn watch_owner(
        &self,
        owner: &Link,
        topic: &str,
        resume: Option<&Resume>,
        need_history: bool,
    ) -> Option<Replay> {
        let lock = self
            .watched
            .lock()
            .expect("watched lock")
            .entry(topic.to_owned())
            .or_default()
            .clone();
        let mut watched = lock.lock().await;
        let owner_key = (owner.node_id.clone(), owner.generation);
        if watched.as_ref() == Some(&owner_key) && !need_history {
            return None;
        }
        let watch = Watch {
            topic: topic.to_owned(),
            last_event_id: resume.filter(|_| need_history).map(|r| r.text.clone()),
        };
        match self
            .call::<WatchReply>(&owner.url, WATCH_PATH, &watch)
            .await
        {
            Ok(reply) => {
                *watched = Some(owner_key);
                need_history.then(|| replay_of(reply))
            }
            Err(error) => {
                tracing::warn!(%topic, owner = %owner.node_id, %error, "watch failed; serving from this proxy's history");
                None
            }
        }
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

    /// Sends a revocation to every live peer; returns the node ids reached and
    /// those that failed (they get it by gossip later).
    pub async fn broadcast_revoke(&self, body: &PeerRevocation) -> (Vec<String>, Vec<String>) {
        let view = self.view();
        let calls = view.live().map(|member| async move {
            let url = member.url.as_deref().unwrap_or_default();
            let outcome = self.call::<serde_json::Value>(url, REVOKE_PATH, body).await;
            (member.node_id.clone(), outcome)
        });
        let mut reached = Vec::new();
        let mut failed = Vec::new();
        for (node_id, outcome) in futures_util::future::join_all(calls).await {
            match outcome {
                Ok(_) => reached.push(node_id),
                Err(error) => {
                    tracing::warn!(peer = %node_id, %error, "revocation not delivered");
                    failed.push(node_id);
                }
            }
        }
        (reached, failed)
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
        })
    }
}

/// A peer's answer as a replay (its events may also arrive live).
fn replay_of(reply: WatchReply) -> Replay {
    Replay {
        frames: reply
            .frames
            .into_iter()
            .map(WireFrame::into_frame)
            .collect(),
        missed: reply.missed,
        placed: reply.placed,
        from_peer: true,
    }
}

/// What the membership task remembers of a peer between looks.
struct Tracked {
    generation: u64,
    gossip_address: SocketAddr,
    heartbeat: u64,
    /// When its heartbeat last advanced (`None`: not since it was first seen).
    advanced_at: Option<Instant>,
    max_version: u64,
    url: Option<String>,
    topics: Arc<HashSet<String>>,
}

impl Tracked {
    fn new(id: &ChitchatId, node: &chitchat::NodeState) -> Self {
        Self {
            generation: id.generation_id,
            gossip_address: id.gossip_advertise_addr,
            heartbeat: u64::from(node.heartbeat()),
            advanced_at: None,
            // Forces a first read of its keys.
            max_version: u64::MAX,
            url: None,
            topics: Arc::default(),
        }
    }
}

/// `/peer/v1/*`: signed requests from peers.
pub async fn handle(state: &Arc<ProxyState>, request: &Request) -> Response {
    let Some(cluster) = &state.peers else {
        return Refusal::NotFound.into();
    };
    if request.method != "POST" {
        return Refusal::MethodNotAllowed.into();
    }
    let Some(from) = wire::check_request(
        &cluster.http_key,
        |name| request.header(name),
        &request.path,
        &request.body,
    ) else {
        state.metrics.peer_auth_failures.inc();
        return Refusal::PeerUnauthenticated.into();
    };
    let from = from.to_owned();
    match request.path.as_str() {
        link::BATCH_PATH => match serde_json::from_slice::<Batch>(&request.body) {
            Ok(batch) => receive_batch(state, cluster, batch).await,
            Err(error) => Refusal::InvalidBody(error.to_string()).into(),
        },
        WATCH_PATH | HISTORY_PATH => match serde_json::from_slice::<Watch>(&request.body) {
            Ok(watch) => {
                let register = request.path == WATCH_PATH;
                receive_watch(state, cluster, &from, watch, register).await
            }
            Err(error) => Refusal::InvalidBody(error.to_string()).into(),
        },
        REVOKE_PATH => crate::revoke::apply(state, &request.body).await,
        _ => Refusal::NotFound.into(),
    }
}

async fn receive_batch(state: &Arc<ProxyState>, cluster: &Arc<Cluster>, batch: Batch) -> Response {
    for frame in batch.frames {
        if validate_topic(&frame.topic).is_err() {
            return Refusal::InvalidBody("bad topic".into()).into();
        }
        let topic = state.topics.get_or_create(&frame.topic);
        if state.topics.apply(&topic, frame.into_frame()).await {
            state.metrics.peer_frames_received.inc();
        }
    }
    let mut ids = Vec::with_capacity(batch.publishes.len());
    for WirePublish { topic, publish } in batch.publishes {
        if let Err(reason) = validate_topic(&topic).and_then(|()| publish.validate()) {
            return Refusal::InvalidBody(reason).into();
        }
        // Sent here as the owner: numbered here even if membership moved since.
        let topic = state.topics.get_or_create(&topic);
        let id = state
            .topics
            .publish(&topic, &publish, |frame| {
                cluster.forward(&topic.name, frame)
            })
            .await;
        ids.push(id.to_string());
    }
    Response::json(200, &json!(BatchReply { ids }))
}

async fn receive_watch(
    state: &Arc<ProxyState>,
    cluster: &Arc<Cluster>,
    from: &str,
    watch: Watch,
    register: bool,
) -> Response {
    if let Err(reason) = validate_topic(&watch.topic) {
        return Refusal::BadRequest(reason).into();
    }
    let resume = match watch.last_event_id.as_deref().map(parse_last_event_id) {
        Some(Err(reason)) => return Refusal::BadRequest(reason).into(),
        Some(Ok(resume)) => Some(resume),
        None => None,
    };
    let topic = state.topics.get_or_create(&watch.topic);
    let until = Instant::now() + cluster.direct_watch_ttl();
    let replay = state
        .topics
        .watch(&topic, resume.as_ref(), || {
            if !register {
                return;
            }
            let mut direct = cluster.direct.lock().expect("direct lock");
            let watchers = direct.entry(watch.topic.clone()).or_default();
            watchers.retain(|(node, _)| node != from);
            watchers.push((from.to_owned(), until));
        })
        .await;
    Response::json(
        200,
        &json!(WatchReply {
            frames: replay
                .frames
                .iter()
                .map(|f| WireFrame::new(&watch.topic, f))
                .collect(),
            missed: replay.missed,
            placed: replay.placed,
        }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rendezvous_spreads_topics_and_is_stable() {
        let nodes = ["127.0.0.1:7001", "127.0.0.1:7002", "127.0.0.1:7003"];
        let owner = |topic: &str, nodes: &[&'static str]| owner_among(topic, nodes).unwrap();
        let mut counts = HashMap::new();
        for i in 0..3000 {
            *counts
                .entry(owner(&format!("instances.{i}"), &nodes))
                .or_insert(0) += 1;
        }
        for node in nodes {
            assert!((800..1200).contains(&counts[node]), "{counts:?}");
        }
        // Removing one node moves only its topics.
        for i in 0..3000 {
            let topic = format!("instances.{i}");
            let before = owner(&topic, &nodes);
            if before != nodes[2] {
                assert_eq!(owner(&topic, &nodes[..2]), before);
            }
        }
        assert_eq!(score("a", "b"), score("a", "b"));
        assert_ne!(score("a", "b"), score("b", "a"));
    }
}
