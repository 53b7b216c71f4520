//! Who is in the cluster: the gossip state read into a [`View`] of members
//! (live while their heartbeat advances), with a [`Link`] to each live one,
//! and the revocations other proxies gossip.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use chitchat::ChitchatId;

use super::link::Link;
use super::{Cluster, Member, REVOCATION_PREFIX, TOPIC_PREFIX, URL_KEY, View, secs};
use crate::revoke::PeerRevocation;

/// What the membership task remembers of a peer between looks.
pub(super) struct Tracked {
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
    pub(super) fn new(id: &ChitchatId, node: &chitchat::NodeState) -> Self {
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

impl Cluster {
    /// Reads the gossip state: liveness from heartbeats, URLs, interest.
    /// Returns the gossiped revocations not applied here yet.
    pub(super) async fn refresh(
        &self,
        tracked: &mut HashMap<String, Tracked>,
    ) -> Vec<PeerRevocation> {
        let now = Instant::now();
        // A dead peer's last heartbeat can reach this proxy up to a gossip
        // interval late (relayed by a third), and is seen up to one read
        // interval later: both come off, so that a death is declared within
        // `peer_timeout_sec` of it.
        let timeout = secs(self.config.peer_timeout_sec)
            .saturating_sub(secs(self.config.gossip_interval_sec) + self.refresh_tick());
        let revocations = self.read_gossip(tracked, now).await;
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

    /// Brings `tracked` up to date with the gossip state (the newest
    /// generation of each other node: heartbeat, URL, topics) and answers the
    /// gossiped revocations not applied here yet.
    async fn read_gossip(
        &self,
        tracked: &mut HashMap<String, Tracked>,
        now: Instant,
    ) -> Vec<PeerRevocation> {
        let mut revocations: Vec<PeerRevocation> = Vec::new();
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
        revocations
    }

    /// The link to a live member, (re)opened when it is new or restarted.
    pub(super) fn link_for(&self, member: &Member) -> Option<Arc<Link>> {
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
}
