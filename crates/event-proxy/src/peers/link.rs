//! One peer's outgoing link: a queue of frames (events this proxy numbered,
//! for the peer's subscribers) and publishes (events whose topic the peer
//! owns), sent in order by one task as `POST /peer/v1/batch` requests of up to
//! `message_batch_size` items over a kept-alive connection.
//!
//! One request is in flight at a time, so a topic's events reach the peer in
//! order. A failed request is sent again (frames; the peer ignores a frame it
//! already has) while the peer is alive; the publishes in it are answered
//! with an error at once (their publisher retries). The link closes when the
//! peer is declared dead or restarts; what it still holds is dropped.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio::sync::{Notify, oneshot};
use tokio_util::sync::CancellationToken;

use super::wire::{Batch, BatchReply, WireFrame, WirePublish, sign_request};
use crate::metrics::Metrics;

/// Items a link holds at most; beyond, its oldest frame is dropped (counted).
const MAX_QUEUED: usize = 100_000;
/// One batch request's time limit.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
pub const BATCH_PATH: &str = "/peer/v1/batch";

/// The id of a publish sent to its topic's owner, or why it has none.
pub type PublishResult = Result<String, OwnerFailed>;

/// Why a publish sent to its topic's owner has no id: the publisher gets a
/// 503 and retries.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OwnerFailed {
    /// The link was closed (the peer is dead or restarted) before it was sent.
    #[error("peer {node} is gone")]
    Gone { node: String },
    /// The batch that carried it failed.
    #[error("peer {node} did not answer")]
    NoAnswer { node: String },
    #[error("the owner returned too few ids")]
    TooFewIds,
    /// The link dropped the publish without an answer.
    #[error("the link closed")]
    LinkClosed,
}

enum Item {
    Frame(WireFrame),
    Publish(WirePublish, oneshot::Sender<PublishResult>),
}

struct Queued {
    item: Item,
    since: Instant,
}

pub struct Link {
    pub node_id: String,
    pub generation: u64,
    pub url: String,
    queue: Mutex<VecDeque<Queued>>,
    /// When the batch in flight was queued (its oldest item), if any.
    in_flight_since: Mutex<Option<Instant>>,
    wake: Notify,
    pub closed: CancellationToken,
}

/// What a link's sender needs from the cluster.
pub struct Sender {
    pub client: reqwest::Client,
    pub key: [u8; 32],
    pub self_id: String,
    pub batch_size: usize,
    /// Largest request body (the peer's limit).
    pub max_body: usize,
    pub metrics: Arc<Metrics>,
}

impl Link {
    pub fn start(node_id: String, generation: u64, url: String, sender: Arc<Sender>) -> Arc<Self> {
        let link = Arc::new(Self {
            node_id,
            generation,
            url,
            queue: Mutex::new(VecDeque::new()),
            in_flight_since: Mutex::new(None),
            wake: Notify::new(),
            closed: CancellationToken::new(),
        });
        tokio::spawn(run(link.clone(), sender));
        link
    }

    fn push(&self, item: Item, metrics: &Metrics) {
        let mut queue = self.queue.lock().expect("link lock");
        if queue.len() >= MAX_QUEUED
            && let Some(index) = queue.iter().position(|q| matches!(q.item, Item::Frame(_)))
        {
            queue.remove(index);
            metrics.peer_frames_dropped.inc();
        }
        queue.push_back(Queued {
            item,
            since: Instant::now(),
        });
        drop(queue);
        self.wake.notify_one();
    }

    /// Queues an event for the peer's subscribers.
    pub fn send_frame(&self, frame: WireFrame, metrics: &Metrics) {
        if !self.closed.is_cancelled() {
            self.push(Item::Frame(frame), metrics);
        }
    }

    /// Sends an event to the peer that owns its topic; resolves to its id.
    pub fn publish(
        &self,
        publish: WirePublish,
        metrics: &Metrics,
    ) -> oneshot::Receiver<PublishResult> {
        let (reply, answer) = oneshot::channel();
        if self.closed.is_cancelled() {
            let _ = reply.send(Err(OwnerFailed::Gone {
                node: self.node_id.clone(),
            }));
        } else {
            self.push(Item::Publish(publish, reply), metrics);
        }
        answer
    }

    /// How long the oldest item not yet delivered has waited.
    pub fn lag(&self) -> Duration {
        let queued = self
            .queue
            .lock()
            .expect("link lock")
            .front()
            .map(|q| q.since);
        let in_flight = *self.in_flight_since.lock().expect("link lock");
        [queued, in_flight]
            .into_iter()
            .flatten()
            .map(|since| since.elapsed())
            .max()
            .unwrap_or_default()
    }

    pub fn close(&self) {
        self.closed.cancel();
        self.wake.notify_one();
    }

    /// Takes the next batch: up to `batch_size` items and about `max_body` bytes.
    fn take_batch(&self, sender: &Sender) -> Vec<Queued> {
        let mut queue = self.queue.lock().expect("link lock");
        let mut taken = Vec::new();
        let mut bytes = 0;
        while let Some(next) = queue.front() {
            let size = match &next.item {
                Item::Frame(frame) => frame.text.len() + frame.topic.len() + 64,
                Item::Publish(publish, _) => publish.topic.len() + 256,
            };
            if !taken.is_empty()
                && (taken.len() >= sender.batch_size || bytes + size > sender.max_body)
            {
                break;
            }
            bytes += size;
            taken.push(queue.pop_front().expect("front exists"));
        }
        taken
    }
}

async fn run(link: Arc<Link>, sender: Arc<Sender>) {
    let mut retry: Vec<Queued> = Vec::new();
    let mut backoff = Duration::from_millis(50);
    loop {
        if link.closed.is_cancelled() {
            fail_publishes(std::mem::take(&mut retry), &link.node_id);
            let rest: Vec<Queued> = link.queue.lock().expect("link lock").drain(..).collect();
            fail_publishes(rest, &link.node_id);
            return;
        }
        let batch = if retry.is_empty() {
            let batch = link.take_batch(&sender);
            if batch.is_empty() {
                let woken = link.wake.notified();
                if link.queue.lock().expect("link lock").is_empty() {
                    woken.await;
                }
                continue;
            }
            batch
        } else {
            std::mem::take(&mut retry)
        };
        *link.in_flight_since.lock().expect("link lock") = batch.iter().map(|q| q.since).min();
        let mut body = Batch::default();
        for queued in &batch {
            match &queued.item {
                Item::Frame(frame) => body.frames.push(frame.clone()),
                Item::Publish(publish, _) => body.publishes.push(publish.clone()),
            }
        }
        let outcome = sender
            .call::<BatchReply>(&link.url, BATCH_PATH, &body, REQUEST_TIMEOUT)
            .await;
        *link.in_flight_since.lock().expect("link lock") = None;
        match outcome {
            Ok(reply) => {
                backoff = Duration::from_millis(50);
                sender.metrics.peer_messages_sent.add(batch.len() as u64);
                let mut ids = reply.ids.into_iter();
                for queued in batch {
                    if let Item::Publish(_, answer) = queued.item {
                        let _ = answer.send(ids.next().ok_or(OwnerFailed::TooFewIds));
                    }
                }
            }
            Err(error) => {
                sender.metrics.peer_send_failures.inc();
                tracing::debug!(peer = %link.node_id, %error, "peer batch failed; retrying");
                // Publishes fail now (their publisher retries); frames go again.
                let (frames, publishes): (Vec<Queued>, Vec<Queued>) = batch
                    .into_iter()
                    .partition(|q| matches!(q.item, Item::Frame(_)));
                fail_publishes(publishes, &link.node_id);
                retry = frames;
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    _ = link.closed.cancelled() => {}
                }
                backoff = (backoff * 2).min(Duration::from_secs(2));
            }
        }
    }
}

fn fail_publishes(items: Vec<Queued>, node_id: &str) {
    for queued in items {
        if let Item::Publish(_, answer) = queued.item {
            let _ = answer.send(Err(OwnerFailed::NoAnswer {
                node: node_id.to_owned(),
            }));
        }
    }
}

impl Sender {
    /// A signed JSON `POST {base}{path}` to a peer; its JSON answer.
    pub async fn call<T: serde::de::DeserializeOwned>(
        &self,
        base: &str,
        path: &str,
        body: &impl serde::Serialize,
        timeout: Duration,
    ) -> anyhow::Result<T> {
        let body = serde_json::to_vec(body)?;
        let mut request = self
            .client
            .post(format!("{}{path}", base.trim_end_matches('/')))
            .timeout(timeout)
            .header("content-type", "application/json");
        for (name, value) in sign_request(&self.key, &self.self_id, path, &body) {
            request = request.header(name, value);
        }
        let response = request.body(body).send().await?;
        let status = response.status();
        if !status.is_success() {
            anyhow::bail!("{status}: {}", response.text().await.unwrap_or_default());
        }
        Ok(response.json().await?)
    }
}
