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
//! Event ids are `<term>-<seq>`: `seq` counts a topic's events and `term` is
//! the start time (Unix ms) of the proxy that numbered the event — this proxy,
//! or with peers the topic's owner (see [`crate::peers`]). Frames numbered
//! elsewhere arrive through [`Topics::apply`] and keep their ids, so an id means
//! the same event on every proxy. A `Last-Event-ID` is placed in the history by
//! its exact id; one that cannot be placed (its events are gone, or it comes
//! from a run nobody remembers) gets everything still kept and a `missed` event.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;

use crate::config::BackpressurePolicy;
use crate::metrics::Metrics;

pub use flotilla_api_types::tokens::{topic_namespace, topic_uuid_hex};

/// A topic name outside the rule of [`validate_topic`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid topic {name:?}: 1 to 200 characters of letters, digits and . _ : @ ~ -")]
pub struct InvalidTopic {
    pub name: String,
}

/// Topic names: 1 to 200 characters of letters, digits and `._:@~-`.
pub fn validate_topic(name: &str) -> Result<(), InvalidTopic> {
    let valid_char = |c: char| c.is_ascii_alphanumeric() || "._:@~-".contains(c);
    if name.is_empty() || name.len() > 200 || !name.chars().all(valid_char) {
        return Err(InvalidTopic {
            name: name.to_owned(),
        });
    }
    Ok(())
}

/// An event the proxy does not publish: its topic or one of its fields.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidPublish {
    #[error(transparent)]
    Topic(#[from] InvalidTopic),
    #[error("event must be 1 to 100 characters on one line")]
    Event,
    #[error("id must be 1 to 200 characters on one line")]
    Id,
    #[error("data is required")]
    NoData,
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
    pub fn validate(&self) -> Result<(), InvalidPublish> {
        if let Some(event) = &self.event
            && (event.is_empty() || event.len() > 100 || event.contains(['\n', '\r']))
        {
            return Err(InvalidPublish::Event);
        }
        if let Some(id) = &self.id
            && (id.is_empty() || id.len() > 200 || id.contains(['\n', '\r']))
        {
            return Err(InvalidPublish::Id);
        }
        if self.data.is_null() {
            return Err(InvalidPublish::NoData);
        }
        Ok(())
    }

    /// [`validate_topic`] of `topic`, then [`Publish::validate`].
    pub fn validate_on(&self, topic: &str) -> Result<(), InvalidPublish> {
        validate_topic(topic)?;
        self.validate()
    }
}

/// An event in its wire form, shared by every subscriber and the history.
#[derive(Debug)]
pub struct Frame {
    /// Who numbered it: the numbering proxy's start time (Unix ms).
    pub term: u64,
    pub seq: u64,
    pub bytes: Bytes,
    pub published_at: Instant,
    /// The publisher's id, for deduplication.
    pub publisher_id: Option<String>,
}

impl Frame {
    pub fn id(&self) -> EventId {
        EventId {
            term: self.term,
            seq: self.seq,
        }
    }
}

/// An event's id: `<term>-<seq>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EventId {
    pub term: u64,
    pub seq: u64,
}

impl std::fmt::Display for EventId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.term, self.seq)
    }
}

/// Where a reconnecting client left off: its `Last-Event-ID`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resume {
    /// `None` for plain digits: the topic's current term.
    pub term: Option<u64>,
    pub seq: u64,
    pub text: String,
}

/// A `Last-Event-ID` that no proxy sent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid Last-Event-ID {text:?}: expected an id sent by this service")]
pub struct InvalidLastEventId {
    pub text: String,
}

/// Parses a `Last-Event-ID`: `<term>-<seq>` or plain digits.
pub fn parse_last_event_id(text: &str) -> Result<Resume, InvalidLastEventId> {
    let invalid = || InvalidLastEventId {
        text: text.to_owned(),
    };
    let trimmed = text.trim();
    let (term, seq) = match trimmed.split_once('-') {
        Some((term, seq)) => (
            Some(term.parse::<u64>().map_err(|_| invalid())?),
            seq.parse::<u64>().map_err(|_| invalid())?,
        ),
        None => (None, trimmed.parse::<u64>().map_err(|_| invalid())?),
    };
    Ok(Resume {
        term,
        seq,
        text: trimmed.to_owned(),
    })
}

/// The lines of `text` as `text/event-stream` reads them: broken at CRLF, CR
/// and LF. A text ending in a break has a last, empty line.
pub fn data_lines(text: &str) -> impl Iterator<Item = &str> {
    let mut rest = Some(text);
    std::iter::from_fn(move || {
        let current = rest?;
        match current.find(['\r', '\n']) {
            Some(at) => {
                let width = if current[at..].starts_with("\r\n") {
                    2
                } else {
                    1
                };
                rest = Some(&current[at + width..]);
                Some(&current[..at])
            }
            None => {
                rest = None;
                Some(current)
            }
        }
    })
}

/// Renders an event as `text/event-stream` lines.
pub fn render(term: u64, seq: u64, publish: &Publish) -> Bytes {
    let data = match &publish.data {
        serde_json::Value::String(text) => text.clone(),
        other => other.to_string(),
    };
    let mut out = String::with_capacity(data.len() + 64);
    out.push_str("id: ");
    out.push_str(&format!("{term}-{seq}"));
    out.push('\n');
    if let Some(event) = &publish.event {
        out.push_str("event: ");
        out.push_str(event);
        out.push('\n');
    }
    // Every line of the payload is a data line. The format ends lines at CR,
    // LF and CRLF alike: a CR left inside a data line would start a new field
    // in the subscriber's parser (`\rid: 1\revent: x` would forge both).
    for line in data_lines(&data) {
        out.push_str("data: ");
        out.push_str(line);
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
    /// The highest seq numbered or applied here.
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
    /// Subscribers now (read without the lock, e.g. for gossip).
    subscriber_count: AtomicUsize,
}

/// The events a new subscriber gets before live ones.
#[derive(Default)]
pub struct Replay {
    pub frames: Vec<Arc<Frame>>,
    /// The requested id is older than the history: some events are gone.
    pub missed: Option<MissedEvents>,
    /// Whether the requested id was placed in this history (always true
    /// without one): with peers, an unplaced id is asked of the topic's owner.
    pub placed: bool,
    /// Sent by a peer: its events may also arrive live.
    pub from_peer: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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
                    subscriber_count: AtomicUsize::new(0),
                })
            })
            .clone()
    }

    pub fn new_subscriber_id(&self) -> u64 {
        self.next_subscriber.fetch_add(1, Ordering::Relaxed)
    }

    /// Registers `subscriber` on `topic` and returns what it missed since
    /// `resume`, and whether it is the topic's first subscriber here.
    pub async fn subscribe(
        &self,
        topic: &Topic,
        subscriber: Arc<Subscriber>,
        resume: Option<&Resume>,
    ) -> (Replay, bool) {
        let mut state = topic.state.lock().await;
        self.expire(&mut state);
        state.subscribers.push(subscriber);
        let first = topic.subscriber_count.fetch_add(1, Ordering::SeqCst) == 0;
        (self.place(&state, resume), first)
    }

    /// What a peer's subscriber missed since `resume`; `register` runs under the
    /// topic's lock, so whatever it sets up sees every later event.
    pub async fn watch(
        &self,
        topic: &Topic,
        resume: Option<&Resume>,
        register: impl FnOnce(),
    ) -> Replay {
        let mut state = topic.state.lock().await;
        self.expire(&mut state);
        register();
        self.place(&state, resume)
    }

    pub async fn unsubscribe(&self, topic: &Topic, subscriber_id: u64) {
        let mut state = topic.state.lock().await;
        let before = state.subscribers.len();
        state.subscribers.retain(|s| s.id != subscriber_id);
        if state.subscribers.len() < before {
            topic.subscriber_count.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// Places `resume` in the history.
    fn place(&self, state: &TopicState, resume: Option<&Resume>) -> Replay {
        let Some(resume) = resume else {
            return Replay {
                placed: true,
                ..Replay::default()
            };
        };
        let history = &state.history;
        let current_term = history.back().map_or(self.epoch, |f| f.term);
        let term = resume.term.unwrap_or(current_term);
        let after = |index: usize| history.iter().skip(index).cloned().collect::<Vec<_>>();
        let missed = || {
            Some(MissedEvents {
                last_event_id: resume.text.clone(),
                oldest_available: history.front().map(|f| f.id().to_string()),
            })
        };
        // The event itself is kept: everything after it.
        if let Some(index) = history
            .iter()
            .rposition(|f| f.term == term && f.seq == resume.seq)
        {
            return Replay {
                frames: after(index + 1),
                missed: None,
                placed: true,
                from_peer: false,
            };
        }
        // A later event of the same term is kept: nothing is lost when it is
        // the very next one.
        if let Some(index) = history
            .iter()
            .position(|f| f.term == term && f.seq > resume.seq)
        {
            let contiguous = history[index].seq == resume.seq + 1;
            return Replay {
                frames: after(index),
                missed: if contiguous { None } else { missed() },
                placed: contiguous,
                from_peer: false,
            };
        }
        // Only earlier events of that term: the client is past all of them.
        if let Some(index) = history.iter().rposition(|f| f.term == term) {
            return Replay {
                frames: after(index + 1),
                missed: None,
                placed: true,
                from_peer: false,
            };
        }
        // Nothing of that term is kept. Up to date with the current term (its
        // history expired): nothing to send.
        if term == current_term && resume.seq >= state.seq {
            return Replay {
                placed: true,
                ..Replay::default()
            };
        }
        Replay {
            frames: after(0),
            missed: missed(),
            placed: false,
            from_peer: false,
        }
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

    /// Numbers and publishes one event; returns its id. `forward` runs under
    /// the topic's lock with the new frame (peers get a topic's events in order).
    pub async fn publish(
        &self,
        topic: &Topic,
        publish: &Publish,
        forward: impl FnOnce(&Arc<Frame>),
    ) -> EventId {
        let mut state = topic.state.lock().await;
        if let Some(publisher_id) = &publish.id
            && let Some(existing) = state
                .history
                .iter()
                .rev()
                .find(|f| f.publisher_id.as_deref() == Some(publisher_id.as_str()))
        {
            return existing.id();
        }
        state.seq += 1;
        let seq = state.seq;
        let frame = Arc::new(Frame {
            term: self.epoch,
            seq,
            bytes: render(self.epoch, seq, publish),
            published_at: Instant::now(),
            publisher_id: publish.id.clone(),
        });
        forward(&frame);
        self.metrics.messages_published.inc();
        self.deliver(&mut state, frame.clone()).await;
        frame.id()
    }

    /// Delivers a frame numbered by another proxy (the topic's owner); a frame
    /// already here (a repeated batch) is ignored. Returns whether it was new.
    pub async fn apply(&self, topic: &Topic, frame: Arc<Frame>) -> bool {
        let mut state = topic.state.lock().await;
        if state
            .history
            .iter()
            .rev()
            .take_while(|f| f.term == frame.term)
            .any(|f| f.seq >= frame.seq)
        {
            return false;
        }
        state.seq = state.seq.max(frame.seq);
        self.deliver(&mut state, frame).await;
        true
    }

    /// Appends `frame` to the history and offers it to every subscriber.
    async fn deliver(&self, state: &mut TopicState, frame: Arc<Frame>) {
        state.history.push_back(frame.clone());
        self.expire(state);
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
        self.topics
            .read()
            .expect("topics lock")
            .values()
            .filter(|t| t.subscriber_count.load(Ordering::SeqCst) > 0)
            .count()
    }

    /// Names of the topics with at least one subscriber.
    pub fn subscribed(&self) -> Vec<String> {
        self.topics
            .read()
            .expect("topics lock")
            .values()
            .filter(|t| t.subscriber_count.load(Ordering::SeqCst) > 0)
            .map(|t| t.name.clone())
            .collect()
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
    fn data_is_split_at_every_line_break() {
        let lines: Vec<&str> = data_lines("a\rb\nc\r\nd\n\re").collect();
        assert_eq!(lines, ["a", "b", "c", "d", "", "e"]);
        assert_eq!(data_lines("").collect::<Vec<_>>(), [""]);
        assert_eq!(data_lines("x\r\n").collect::<Vec<_>>(), ["x", ""]);
        // The report of the issue: a CR must not start a field.
        let frame = render(
            1,
            2,
            &Publish {
                data: serde_json::Value::String("hello\rid: 999\revent: evil".into()),
                ..Publish::default()
            },
        );
        assert_eq!(
            std::str::from_utf8(&frame).unwrap(),
            "id: 1-2\ndata: hello\ndata: id: 999\ndata: event: evil\n\n"
        );
    }

    /// What an EventSource receives for `frame`, by an SSE parser that is not ours.
    fn parse_independently(frame: Bytes) -> Vec<eventsource_stream::Event> {
        use eventsource_stream::Eventsource;
        use futures_util::StreamExt;
        let stream = futures_util::stream::iter([Ok::<_, std::io::Error>(frame)]);
        tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a runtime")
            .block_on(
                stream
                    .eventsource()
                    .map(|event| event.expect("a well-formed stream"))
                    .collect(),
            )
    }

    proptest::proptest! {
        #[test]
        fn subscribers_parse_exactly_what_was_published(
            data in proptest::prop_oneof![
                proptest::arbitrary::any::<String>(),
                "[a-z \\r\\n:]{0,40}",
                "(\\r|\\n|\\r\\n|data: |id: |event: |retry: 1|x){0,12}",
            ],
            event in proptest::option::of("[a-z.]{1,20}"),
        ) {
            let frame = render(7, 9, &Publish {
                event: event.clone(),
                data: serde_json::Value::String(data.clone()),
                id: None,
                retry: None,
            });
            let parsed = parse_independently(frame);
            proptest::prop_assert_eq!(parsed.len(), 1, "one event per publish");
            let expected = data.replace("\r\n", "\n").replace('\r', "\n");
            proptest::prop_assert_eq!(&parsed[0].data, &expected);
            proptest::prop_assert_eq!(&parsed[0].id, "7-9");
            proptest::prop_assert_eq!(
                parsed[0].event.as_str(),
                event.as_deref().unwrap_or("message")
            );
        }
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
        assert_eq!(
            parse_last_event_id("99-8"),
            Ok(Resume {
                term: Some(99),
                seq: 8,
                text: "99-8".into()
            })
        );
        assert_eq!(parse_last_event_id(" 8").unwrap().term, None);
        assert!(parse_last_event_id("abc").is_err());
        assert!(parse_last_event_id("1-x").is_err());
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
            topics
                .publish(&topic, &publish(&i.to_string()), |_| {})
                .await;
        }
        let epoch = topics.epoch;
        let resume = |text: &str| parse_last_event_id(text).unwrap();
        // History keeps 5: ids 4..=8.
        let sub = Arc::new(Subscriber::new(1, 10, BackpressurePolicy::DropOldest));
        let (replay, first) = topics
            .subscribe(&topic, sub, Some(&resume(&format!("{epoch}-5"))))
            .await;
        assert!(first);
        assert_eq!(
            replay.frames.iter().map(|f| f.seq).collect::<Vec<_>>(),
            [6, 7, 8]
        );
        assert!(replay.missed.is_none() && replay.placed);
        let sub = Arc::new(Subscriber::new(2, 10, BackpressurePolicy::DropOldest));
        let (replay, first) = topics.subscribe(&topic, sub, Some(&resume("1"))).await;
        assert!(!first);
        assert_eq!(replay.frames.len(), 5);
        assert_eq!(
            replay.missed,
            Some(MissedEvents {
                last_event_id: "1".into(),
                oldest_available: Some(format!("{epoch}-4"))
            })
        );
        assert!(!replay.placed);
        // The oldest kept event's predecessor: nothing lost.
        let sub = Arc::new(Subscriber::new(3, 10, BackpressurePolicy::DropOldest));
        let (replay, _) = topics
            .subscribe(&topic, sub, Some(&resume(&format!("{epoch}-3"))))
            .await;
        assert!(replay.missed.is_none() && replay.frames.len() == 5);
        let sub = Arc::new(Subscriber::new(4, 10, BackpressurePolicy::DropOldest));
        let (replay, _) = topics.subscribe(&topic, sub, Some(&resume("1-3"))).await;
        assert_eq!(
            replay.frames.len(),
            5,
            "an id of another run: everything kept"
        );
        assert!(replay.missed.is_some() && !replay.placed);
    }

    #[tokio::test]
    async fn frames_numbered_elsewhere_keep_their_ids_and_are_applied_once() {
        let (topics, _) = topics(8);
        let topic = topics.get_or_create("t");
        let sub = Arc::new(Subscriber::new(1, 10, BackpressurePolicy::DropOldest));
        topics.subscribe(&topic, sub.clone(), None).await;
        let remote = |seq| {
            Arc::new(Frame {
                term: 7,
                seq,
                bytes: render(7, seq, &publish("x")),
                published_at: Instant::now(),
                publisher_id: None,
            })
        };
        assert!(topics.apply(&topic, remote(1)).await);
        assert!(topics.apply(&topic, remote(2)).await);
        assert!(!topics.apply(&topic, remote(2)).await, "a repeat");
        let mut drained = Vec::new();
        sub.drain(&mut drained);
        assert_eq!(
            drained
                .iter()
                .map(|f| f.id().to_string())
                .collect::<Vec<_>>(),
            ["7-1", "7-2"]
        );
        // A resume by such an id is placed here.
        let other = Arc::new(Subscriber::new(2, 10, BackpressurePolicy::DropOldest));
        let (replay, _) = topics
            .subscribe(&topic, other, Some(&parse_last_event_id("7-1").unwrap()))
            .await;
        assert!(replay.placed);
        assert_eq!(replay.frames.len(), 1);
        // This proxy taking over numbering continues after the last seq.
        let id = topics.publish(&topic, &publish("y"), |_| {}).await;
        assert_eq!((id.term, id.seq), (topics.epoch, 3));
    }

    #[tokio::test]
    async fn publisher_ids_deduplicate() {
        let (topics, _) = topics(8);
        let topic = topics.get_or_create("t");
        let first = Publish {
            id: Some("evt-1".into()),
            ..publish("a")
        };
        let a = topics.publish(&topic, &first, |_| {}).await;
        let b = topics.publish(&topic, &first, |_| {}).await;
        assert_eq!(a, b);
        assert_eq!(
            topics.publish(&topic, &publish("c"), |_| {}).await.seq,
            a.seq + 1
        );
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
                topics
                    .publish(&topic, &publish(&i.to_string()), |_| {})
                    .await;
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
        // A timeout no loaded machine reaches, so that a late reader is
        // never too late (the cut-off at the timeout is tested above).
        let topics = Arc::new(Topics::new(
            5,
            Duration::from_secs(3600),
            Duration::from_secs(60),
            Arc::new(Metrics::default()),
        ));
        let topic = topics.get_or_create("t");
        let sub = Arc::new(Subscriber::new(1, 1, BackpressurePolicy::Block));
        topics.subscribe(&topic, sub.clone(), None).await;
        topics.publish(&topic, &publish("1"), |_| {}).await;
        let reader = sub.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(10)).await;
            reader.drain(&mut Vec::new());
        });
        topics.publish(&topic, &publish("2"), |_| {}).await;
        assert!(!sub.is_cut_off(), "room came in time");
        assert_eq!(sub.queued(), 1);
    }
}
