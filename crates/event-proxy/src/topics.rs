//! Topics: their subscribers, their history, and publishing.
//!
//! A publish takes the topic's lock, assigns the next id, renders the event
//! once into its wire form (a [`Frame`] shared by every subscriber), appends it
//! to the history and offers it to each subscriber's bounded queue — all under
//! the lock, so every subscriber sees a topic's events in id order. A
//! subscription registers under the same lock and gets the history after its
//! `Last-Event-ID`, so nothing falls between replay and live delivery.
//!
//! Backpressure per subscriber (`http.backpressure_policy`):
//! - `drop_oldest`: a full queue drops its oldest message for the new one;
//! - `drop_newest`: a full queue rejects the new message;
//! - `block`: the publisher waits up to `http.block_timeout_ms` for room; then
//!   that subscriber is cut off (its stream ends with an `overflow` event).
//!
//! Drops are counted per subscriber and in the metrics.
//!
//! Event ids are `<epoch>-<seq>`: `seq` counts a topic's events from 1 and
//! `epoch` is when this proxy started (Unix ms). A `Last-Event-ID` of another
//! epoch (the proxy restarted since) cannot be placed in the history: the client
//! gets everything still in it and a `missed` event.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;

use crate::config::BackpressurePolicy;
use crate::metrics::Metrics;

pub use flotilla_api_types::tokens::{topic_namespace, topic_uuid_hex};

/// Topic names: 1 to 200 characters of letters, digits and `._:@~-`.
pub fn validate_topic(name: &str) -> Result<(), String> {
    let valid_char = |c: char| c.is_ascii_alphanumeric() || "._:@~-".contains(c);
    if name.is_empty() || name.len() > 200 || !name.chars().all(valid_char) {
        return Err(format!(
            "invalid topic {name:?}: 1 to 200 characters of letters, digits and . _ : @ ~ -"
        ));
    }
    Ok(())
}

/// One event as published.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Publish {
    /// Event type; omitted means `message`.
    #[serde(default)]
    pub event: Option<String>,
    /// Payload: a string is sent as text, anything else as JSON.
    pub data: serde_json::Value,
    /// The publisher's own id for the event: a repeat of an id still in the
    /// topic's history is not published twice (the first event's id is returned).
    #[serde(default)]
    pub id: Option<String>,
    /// Reconnection delay (ms) suggested to subscribers.
    #[serde(default)]
    pub retry: Option<u64>,
}

impl Publish {
    pub fn validate(&self) -> Result<(), String> {
        if let Some(event) = &self.event
            && (event.is_empty() || event.len() > 100 || event.contains(['\n', '\r']))
        {
            return Err("event must be 1 to 100 characters on one line".into());
        }
        if let Some(id) = &self.id
            && (id.is_empty() || id.len() > 200 || id.contains(['\n', '\r']))
        {
            return Err("id must be 1 to 200 characters on one line".into());
        }
        if self.data.is_null() {
            return Err("data is required".into());
        }
        Ok(())
    }
}

/// An event in its wire form, shared by every subscriber and the history.
#[derive(Debug)]
pub struct Frame {
    pub seq: u64,
    pub bytes: Bytes,
    pub published_at: Instant,
    /// The publisher's id, for deduplication.
    pub publisher_id: Option<String>,
}

/// Where a reconnecting client left off.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resume {
    /// An id of this proxy's epoch (or plain digits).
    Seq(u64),
    /// An id of an earlier run of the proxy.
    OtherEpoch(String),
}

/// Parses a `Last-Event-ID` for a proxy of `epoch`.
pub fn parse_last_event_id(text: &str, epoch: u64) -> Result<Resume, String> {
    let invalid = || format!("invalid Last-Event-ID {text:?}: expected an id sent by this service");
    match text.trim().split_once('-') {
        Some((e, s)) => {
            let e: u64 = e.parse().map_err(|_| invalid())?;
            let s: u64 = s.parse().map_err(|_| invalid())?;
            Ok(if e == epoch {
                Resume::Seq(s)
            } else {
                Resume::OtherEpoch(text.trim().to_owned())
            })
        }
        None => text.trim().parse().map(Resume::Seq).map_err(|_| invalid()),
    }
}

/// Renders an event as `text/event-stream` lines.
pub fn render(epoch: u64, seq: u64, publish: &Publish) -> Bytes {
    let data = match &publish.data {
        serde_json::Value::String(text) => text.clone(),
        other => other.to_string(),
    };
    let mut out = String::with_capacity(data.len() + 64);
    out.push_str("id: ");
    out.push_str(&format!("{epoch}-{seq}"));
    out.push('\n');
    if let Some(event) = &publish.event {
        out.push_str("event: ");
        out.push_str(event);
        out.push('\n');
    }
    // Every line of the payload is a data line; \r\n and \r count as breaks.
    for line in data.split('\n') {
        out.push_str("data: ");
        out.push_str(line.strip_suffix('\r').unwrap_or(line));
        out.push('\n');
    }
    if let Some(retry) = publish.retry {
        out.push_str("retry: ");
        out.push_str(&retry.to_string());
        out.push('\n');
    }
    out.push('\n');
    Bytes::from(out)
}

/// What offering a frame to a subscriber's queue did.
#[derive(Debug, PartialEq, Eq)]
pub enum Offer {
    Queued,
    /// Queued, and the oldest message was dropped for it.
    DroppedOldest,
    /// Not queued.
    DroppedNewest,
    /// Full: with `block`, the publisher must wait for room.
    Full,
}

/// One open stream's queue.
pub struct Subscriber {
    pub id: u64,
    /// Frames waiting to be written. A std mutex: push and drain only.
    queue: std::sync::Mutex<VecDeque<Arc<Frame>>>,
    capacity: usize,
    policy: BackpressurePolicy,
    /// Wakes the stream's writer.
    pub ready: Notify,
    /// Wakes a publisher blocked on a full queue.
    space: Notify,
    /// Set when a blocked publisher gave up: the stream ends with `overflow`.
    cut_off: AtomicBool,
    pub dropped: AtomicU64,
}

impl Subscriber {
    pub fn new(id: u64, capacity: usize, policy: BackpressurePolicy) -> Self {
        Self {
            id,
            queue: std::sync::Mutex::new(VecDeque::with_capacity(capacity.min(16))),
            capacity,
            policy,
            ready: Notify::new(),
            space: Notify::new(),
            cut_off: AtomicBool::new(false),
            dropped: AtomicU64::new(0),
        }
    }

    fn offer(&self, frame: &Arc<Frame>) -> Offer {
        let mut queue = self.queue.lock().expect("queue lock");
        let outcome = if queue.len() < self.capacity {
            queue.push_back(frame.clone());
            Offer::Queued
        } else {
            match self.policy {
                BackpressurePolicy::DropOldest => {
                    queue.pop_front();
                    queue.push_back(frame.clone());
                    Offer::DroppedOldest
                }
                BackpressurePolicy::DropNewest => Offer::DroppedNewest,
                BackpressurePolicy::Block => Offer::Full,
            }
        };
        drop(queue);
        if outcome != Offer::DroppedNewest && outcome != Offer::Full {
            self.ready.notify_one();
        }
        outcome
    }

    /// Takes every queued frame (for one write).
    pub fn drain(&self, into: &mut Vec<Arc<Frame>>) {
        let mut queue = self.queue.lock().expect("queue lock");
        into.extend(queue.drain(..));
        drop(queue);
        self.space.notify_waiters();
    }

    pub fn is_cut_off(&self) -> bool {
        self.cut_off.load(Ordering::SeqCst)
    }

    /// Queued frames now.
    pub fn queued(&self) -> usize {
        self.queue.lock().expect("queue lock").len()
    }
}

struct TopicState {
    seq: u64,
    history: VecDeque<Arc<Frame>>,
    subscribers: Vec<Arc<Subscriber>>,
}

/// A topic: a tokio mutex, because a `block` publish waits for room while
/// holding it (which is what keeps events in order).
pub struct Topic {
    pub name: String,
    pub uuid_hex: String,
    state: tokio::sync::Mutex<TopicState>,
}

/// The events a new subscriber gets before live ones.
pub struct Replay {
    pub frames: Vec<Arc<Frame>>,
    /// The requested id is older than the history: some events are gone.
    pub missed: Option<MissedEvents>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MissedEvents {
    pub last_event_id: String,
    /// The oldest id still available, if any.
    pub oldest_available: Option<String>,
}

pub struct Topics {
    /// A std RwLock over the map: topics are found or created under it, and
    /// never awaited with it held.
    topics: std::sync::RwLock<HashMap<String, Arc<Topic>>>,
    /// Start of this proxy (Unix ms): the first part of every event id.
    pub epoch: u64,
    history_size: usize,
    history_ttl: Duration,
    block_timeout: Duration,
    next_subscriber: AtomicU64,
    metrics: Arc<Metrics>,
}

impl Topics {
    pub fn new(
        history_size: usize,
        history_ttl: Duration,
        block_timeout: Duration,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            epoch: chrono::Utc::now().timestamp_millis().max(0) as u64,
            topics: std::sync::RwLock::default(),
            history_size,
            history_ttl,
            block_timeout,
            next_subscriber: AtomicU64::new(1),
            metrics,
        }
    }

    pub fn get_or_create(&self, name: &str) -> Arc<Topic> {
        if let Some(topic) = self.topics.read().expect("topics lock").get(name) {
            return topic.clone();
        }
        self.topics
            .write()
            .expect("topics lock")
            .entry(name.to_owned())
            .or_insert_with(|| {
                Arc::new(Topic {
                    name: name.to_owned(),
                    uuid_hex: topic_uuid_hex(name),
                    state: tokio::sync::Mutex::new(TopicState {
                        seq: 0,
                        history: VecDeque::new(),
                        subscribers: Vec::new(),
                    }),
                })
            })
            .clone()
    }

    pub fn new_subscriber_id(&self) -> u64 {
        self.next_subscriber.fetch_add(1, Ordering::Relaxed)
    }

    /// Registers `subscriber` on `topic` and returns what it missed since `resume`.
    pub async fn subscribe(
        &self,
        topic: &Topic,
        subscriber: Arc<Subscriber>,
        resume: Option<Resume>,
    ) -> Replay {
        let mut state = topic.state.lock().await;
        self.expire(&mut state);
        state.subscribers.push(subscriber);
        let last = match resume {
            None => {
                return Replay {
                    frames: Vec::new(),
                    missed: None,
                };
            }
            Some(Resume::OtherEpoch(id)) => {
                let oldest = state
                    .history
                    .front()
                    .map(|f| format!("{}-{}", self.epoch, f.seq));
                return Replay {
                    frames: state.history.iter().cloned().collect(),
                    missed: Some(MissedEvents {
                        last_event_id: id,
                        oldest_available: oldest,
                    }),
                };
            }
            Some(Resume::Seq(last)) => last,
        };
        let frames: Vec<Arc<Frame>> = state
            .history
            .iter()
            .filter(|f| f.seq > last)
            .cloned()
            .collect();
        let oldest = state.history.front().map(|f| f.seq);
        // Events after `last` exist (seq moved past it) but the history no
        // longer starts right after it.
        let missed =
            (last < state.seq && oldest.is_none_or(|o| o > last + 1)).then(|| MissedEvents {
                last_event_id: format!("{}-{last}", self.epoch),
                oldest_available: oldest.map(|o| format!("{}-{o}", self.epoch)),
            });
        Replay { frames, missed }
    }

    pub async fn unsubscribe(&self, topic: &Topic, subscriber_id: u64) {
        let mut state = topic.state.lock().await;
        state.subscribers.retain(|s| s.id != subscriber_id);
    }

    fn expire(&self, state: &mut TopicState) {
        while state.history.len() > self.history_size {
            state.history.pop_front();
        }
        while state
            .history
            .front()
            .is_some_and(|f| f.published_at.elapsed() > self.history_ttl)
        {
            state.history.pop_front();
        }
    }

    /// Publishes one event; returns its id.
    pub async fn publish(&self, topic: &Topic, publish: &Publish) -> u64 {
        let mut state = topic.state.lock().await;
        if let Some(publisher_id) = &publish.id
            && let Some(existing) = state
                .history
                .iter()
                .rev()
                .find(|f| f.publisher_id.as_deref() == Some(publisher_id.as_str()))
        {
            return existing.seq;
        }
        state.seq += 1;
        let seq = state.seq;
        let frame = Arc::new(Frame {
            seq,
            bytes: render(self.epoch, seq, publish),
            published_at: Instant::now(),
            publisher_id: publish.id.clone(),
        });
        state.history.push_back(frame.clone());
        self.expire(&mut state);
        self.metrics.messages_published.inc();
        for subscriber in &state.subscribers {
            if subscriber.is_cut_off() {
                continue;
            }
            match subscriber.offer(&frame) {
                Offer::Queued => {}
                Offer::DroppedOldest | Offer::DroppedNewest => {
                    subscriber.dropped.fetch_add(1, Ordering::Relaxed);
                    self.metrics.messages_dropped.inc();
                }
                Offer::Full => self.wait_for_room(subscriber, &frame).await,
            }
        }
        seq
    }

    /// `block`: waits for room in a full queue; cuts the subscriber off when
    /// none comes in time.
    async fn wait_for_room(&self, subscriber: &Arc<Subscriber>, frame: &Arc<Frame>) {
        let deadline = tokio::time::Instant::now() + self.block_timeout;
        loop {
            let space = subscriber.space.notified();
            if subscriber.offer(frame) == Offer::Queued {
                return;
            }
            if tokio::time::timeout_at(deadline, space).await.is_err() {
                subscriber.cut_off.store(true, Ordering::SeqCst);
                subscriber.dropped.fetch_add(1, Ordering::Relaxed);
                self.metrics.messages_dropped.inc();
                self.metrics.subscribers_cut_off.inc();
                subscriber.ready.notify_one();
                return;
            }
        }
    }

    /// Topics with at least one subscriber.
    pub fn active(&self) -> usize {
        let topics: Vec<Arc<Topic>> = self
            .topics
            .read()
            .expect("topics lock")
            .values()
            .cloned()
            .collect();
        topics
            .iter()
            .filter(|t| {
                t.state
                    .try_lock()
                    .map(|s| !s.subscribers.is_empty())
                    .unwrap_or(true)
            })
            .count()
    }

    /// Forgets topics without subscribers whose history has expired.
    pub fn sweep(&self) {
        let mut topics = self.topics.write().expect("topics lock");
        topics.retain(|_, topic| match topic.state.try_lock() {
            Ok(mut state) => {
                self.expire(&mut state);
                !state.subscribers.is_empty() || !state.history.is_empty()
            }
            Err(_) => true,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn publish(data: &str) -> Publish {
        Publish {
            data: serde_json::Value::String(data.into()),
            ..Publish::default()
        }
    }

    fn topics(policy_capacity: usize) -> (Topics, usize) {
        (
            Topics::new(
                5,
                Duration::from_secs(3600),
                Duration::from_millis(50),
                Arc::new(Metrics::default()),
            ),
            policy_capacity,
        )
    }

    #[test]
    fn frames_follow_the_spec() {
        let frame = render(
            99,
            7,
            &Publish {
                event: Some("update".into()),
                data: serde_json::Value::String("line one\nline two".into()),
                id: None,
                retry: Some(2500),
            },
        );
        assert_eq!(
            std::str::from_utf8(&frame).unwrap(),
            "id: 99-7\nevent: update\ndata: line one\ndata: line two\nretry: 2500\n\n"
        );
        let json = render(
            99,
            8,
            &Publish {
                data: serde_json::json!({"a": 1}),
                ..Publish::default()
            },
        );
        assert_eq!(
            std::str::from_utf8(&json).unwrap(),
            "id: 99-8\ndata: {\"a\":1}\n\n"
        );
        assert_eq!(parse_last_event_id("99-8", 99), Ok(Resume::Seq(8)));
        assert_eq!(parse_last_event_id("8", 99), Ok(Resume::Seq(8)));
        assert_eq!(
            parse_last_event_id("12-8", 99),
            Ok(Resume::OtherEpoch("12-8".into()))
        );
        assert!(parse_last_event_id("abc", 99).is_err());
    }

    #[test]
    fn topic_uuids_are_stable_32_hex() {
        let hex = topic_uuid_hex("instances");
        assert_eq!(hex.len(), 32);
        assert!(hex.chars().all(|c| c.is_ascii_hexdigit()));
        assert_eq!(hex, topic_uuid_hex("instances"));
        assert_ne!(hex, topic_uuid_hex("instances.1"));
        assert!(validate_topic("instances.0198-abc").is_ok());
        assert!(validate_topic("").is_err());
        assert!(validate_topic("a/b").is_err());
        assert!(validate_topic(&"x".repeat(201)).is_err());
    }

    #[tokio::test]
    async fn replay_and_missed_events() {
        let (topics, _) = topics(8);
        let topic = topics.get_or_create("t");
        for i in 0..8 {
            topics.publish(&topic, &publish(&i.to_string())).await;
        }
        // History keeps 5: ids 4..=8.
        let sub = Arc::new(Subscriber::new(1, 10, BackpressurePolicy::DropOldest));
        let replay = topics.subscribe(&topic, sub, Some(Resume::Seq(5))).await;
        assert_eq!(
            replay.frames.iter().map(|f| f.seq).collect::<Vec<_>>(),
            [6, 7, 8]
        );
        assert!(replay.missed.is_none());
        let sub = Arc::new(Subscriber::new(2, 10, BackpressurePolicy::DropOldest));
        let replay = topics.subscribe(&topic, sub, Some(Resume::Seq(1))).await;
        assert_eq!(replay.frames.len(), 5);
        let epoch = topics.epoch;
        assert_eq!(
            replay.missed,
            Some(MissedEvents {
                last_event_id: format!("{epoch}-1"),
                oldest_available: Some(format!("{epoch}-4"))
            })
        );
        let sub = Arc::new(Subscriber::new(3, 10, BackpressurePolicy::DropOldest));
        let replay = topics
            .subscribe(&topic, sub, Some(Resume::OtherEpoch("1-3".into())))
            .await;
        assert_eq!(
            replay.frames.len(),
            5,
            "an id of another run: everything kept"
        );
        assert!(replay.missed.is_some());
    }

    #[tokio::test]
    async fn publisher_ids_deduplicate() {
        let (topics, _) = topics(8);
        let topic = topics.get_or_create("t");
        let first = Publish {
            id: Some("evt-1".into()),
            ..publish("a")
        };
        let a = topics.publish(&topic, &first).await;
        let b = topics.publish(&topic, &first).await;
        assert_eq!(a, b);
        assert_eq!(topics.publish(&topic, &publish("c")).await, a + 1);
    }

    #[tokio::test]
    async fn each_policy_treats_a_full_queue_as_documented() {
        for (policy, expected_seqs, cut_off) in [
            (BackpressurePolicy::DropOldest, vec![3, 4], false),
            (BackpressurePolicy::DropNewest, vec![1, 2], false),
            (BackpressurePolicy::Block, vec![1, 2], true),
        ] {
            let (topics, _) = topics(2);
            let topic = topics.get_or_create("t");
            let sub = Arc::new(Subscriber::new(1, 2, policy));
            topics.subscribe(&topic, sub.clone(), None).await;
            for i in 0..4 {
                topics.publish(&topic, &publish(&i.to_string())).await;
            }
            let mut drained = Vec::new();
            sub.drain(&mut drained);
            assert_eq!(
                drained.iter().map(|f| f.seq).collect::<Vec<_>>(),
                expected_seqs,
                "{policy:?}"
            );
            assert_eq!(sub.is_cut_off(), cut_off, "{policy:?}");
            assert!(sub.dropped.load(Ordering::Relaxed) >= 1);
        }
    }

    #[tokio::test]
    async fn block_waits_for_a_reader() {
        let (topics, _) = topics(1);
        let topics = Arc::new(topics);
        let topic = topics.get_or_create("t");
        let sub = Arc::new(Subscriber::new(1, 1, BackpressurePolicy::Block));
        topics.subscribe(&topic, sub.clone(), None).await;
        topics.publish(&topic, &publish("1")).await;
        let reader = sub.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(10)).await;
            reader.drain(&mut Vec::new());
        });
        topics.publish(&topic, &publish("2")).await;
        assert!(!sub.is_cut_off(), "room came in time");
        assert_eq!(sub.queued(), 1);
    }
}
