//! Who owns a topic (rendezvous hashing over the live members), sending
//! events to the peers interested in a topic, gossiping this proxy's own
//! interest, and joining a topic's owner when a subscriber arrives here.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::link::Link;
use super::wire::{Watch, WatchReply, WireFrame};
use super::{Cluster, HISTORY_PATH, Member, TOPIC_PREFIX, WATCH_PATH, secs};
use crate::ProxyState;
use crate::topics::{Frame, Replay, Resume};

/// A peer's answer as a replay (its events may also arrive live).
pub(super) fn replay_of(reply: WatchReply) -> Replay {
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

/// The owner of `topic` among `node_ids`: the highest (score, node id).
pub fn owner_among<'a>(topic: &str, node_ids: &[&'a str]) -> Option<&'a str> {
    node_ids
        .iter()
        .copied()
        .max_by_key(|node_id| (score(node_id, topic), *node_id))
}

/// Rendezvous score of `node_id` for `topic`: FNV-1a, then a 64-bit mix
/// (stable across builds and platforms, unlike std's hasher).
pub(super) fn score(node_id: &str, topic: &str) -> u64 {
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

impl Cluster {
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
    pub(super) async fn reconcile_interest(&self, state: &ProxyState) -> u64 {
        self.expire_revocations(state.clock.now()).await;
        let wanted: HashSet<String> = state.topics.subscribed().into_iter().collect();
        let mut changed = self
            .chitchat
            .with_chitchat(|chitchat| {
                let node = chitchat.self_node_state();
                let stale: Vec<String> = node
                    .iter_prefix(TOPIC_PREFIX)
                    .map(|(key, _)| key.to_owned())
                    .filter(|key| !wanted.contains(&key[TOPIC_PREFIX.len()..]))
                    .collect();
                let mut changed = stale.len() as u64;
                for key in stale {
                    node.delete(&key);
                }
                for topic in &wanted {
                    let key = format!("{TOPIC_PREFIX}{topic}");
                    if !node.contains_key(&key) {
                        node.set(key, "");
                        changed += 1;
                    }
                }
                changed
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
                changed += 1;
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
        changed
    }

    /// How long a direct watch counts without gossip confirming it.
    pub(super) fn direct_watch_ttl(&self) -> Duration {
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
    pub(super) async fn watch_owner(
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
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

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
