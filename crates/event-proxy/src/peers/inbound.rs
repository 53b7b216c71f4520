//! What peers ask of this proxy (`/peer/v1/…`): signed batches of events
//! for the topics it serves, watches of the topics it owns, and history.

use std::sync::Arc;
use std::time::Instant;

use serde_json::json;

use super::wire::{Batch, BatchReply, Watch, WatchReply, WireFrame, WirePublish};
use super::{Cluster, HISTORY_PATH, REVOKE_PATH, WATCH_PATH, link, wire};
use crate::Answer;
use crate::ProxyState;
use crate::http::{Request, Response};
use crate::refusal::Refusal;
use crate::topics::{Resume, parse_last_event_id, validate_topic};

/// `/peer/v1/*`: signed requests from peers.
pub async fn handle(state: &Arc<ProxyState>, request: &Request) -> Answer {
    let (cluster, from) = authenticated_peer(state, request)?;
    match request.path.as_str() {
        link::BATCH_PATH => receive_batch(state, cluster, parse(&request.body)?).await,
        WATCH_PATH | HISTORY_PATH => {
            let register = request.path == WATCH_PATH;
            let watch = parse(&request.body)?;
            receive_watch(state, cluster, from, watch, register).await
        }
        REVOKE_PATH => crate::revoke::apply(state, &request.body).await,
        _ => Err(Refusal::NotFound),
    }
}

fn parse<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, Refusal> {
    serde_json::from_slice(body).map_err(|error| Refusal::InvalidBody(error.to_string()))
}

/// The cluster and the peer a request comes from, once its signature checks
/// out (a proxy without peers has no `/peer/` paths).
fn authenticated_peer<'a>(
    state: &'a Arc<ProxyState>,
    request: &'a Request,
) -> Result<(&'a Arc<Cluster>, &'a str), Refusal> {
    let cluster = state.peers.as_ref().ok_or(Refusal::NotFound)?;
    if request.method != "POST" {
        return Err(Refusal::MethodNotAllowed);
    }
    let header = |name: &str| request.header(name);
    let from = wire::check_request(&cluster.http_key, header, &request.path, &request.body)
        .ok_or_else(|| {
            state.metrics.peer_auth_failures.inc();
            Refusal::PeerUnauthenticated
        })?;
    Ok((cluster, from))
}

/// A peer watches a topic this proxy owns (or asks for its history): the
/// events after its `Last-Event-ID`, and with `register` the topic's events
/// from now on.
async fn receive_watch(
    state: &Arc<ProxyState>,
    cluster: &Arc<Cluster>,
    from: &str,
    watch: Watch,
    register: bool,
) -> Answer {
    validate_topic(&watch.topic).map_err(|e| Refusal::BadRequest(e.to_string()))?;
    let last_event_id = watch.last_event_id.as_deref();
    let resume = last_event_id.map(parse_last_event_id).transpose();
    let resume = resume.map_err(|e| Refusal::BadRequest(e.to_string()))?;
    let from = register.then_some(from);
    let reply = cluster.watch_here(state, &watch.topic, resume, from).await;
    Ok(Response::json(200, &json!(reply)))
}

/// Events of topics this proxy serves, numbered by their owner, and
/// publishes for topics it owns.
async fn receive_batch(state: &Arc<ProxyState>, cluster: &Arc<Cluster>, batch: Batch) -> Answer {
    for frame in batch.frames {
        validate_topic(&frame.topic).map_err(|_| Refusal::InvalidBody("bad topic".into()))?;
        let topic = state.topics.get_or_create(&frame.topic);
        if state.topics.apply(&topic, frame.into_frame()).await {
            state.metrics.peer_frames_received.inc();
        }
    }
    let mut ids = Vec::with_capacity(batch.publishes.len());
    for publish in batch.publishes {
        ids.push(cluster.publish_as_owner(state, publish).await?);
    }
    Ok(Response::json(200, &json!(BatchReply { ids })))
}

impl Cluster {
    /// A publish a peer sent here as the topic's owner: numbered here even if
    /// membership moved since, and forwarded to the topic's other peers.
    async fn publish_as_owner(
        &self,
        state: &ProxyState,
        WirePublish { topic, publish }: WirePublish,
    ) -> Result<String, Refusal> {
        publish
            .validate_on(&topic)
            .map_err(|e| Refusal::InvalidBody(e.to_string()))?;
        let topic = state.topics.get_or_create(&topic);
        let forward = |frame: &_| self.forward(&topic.name, frame);
        let id = state.topics.publish(&topic, &publish, forward).await;
        Ok(id.to_string())
    }

    /// The events of `topic` after `resume`; with `watcher`, that peer
    /// also gets the topic's events from now on (until gossip catches up,
    /// or `direct_watch_ttl` passes).
    async fn watch_here(
        &self,
        state: &ProxyState,
        topic_name: &str,
        resume: Option<Resume>,
        watcher: Option<&str>,
    ) -> WatchReply {
        let topic = state.topics.get_or_create(topic_name);
        let register = || {
            let Some(from) = watcher else { return };
            let until = Instant::now() + self.direct_watch_ttl();
            let mut direct = self.direct.lock().expect("direct lock");
            let watchers = direct.entry(topic_name.to_owned()).or_default();
            watchers.retain(|(node, _)| node != from);
            watchers.push((from.to_owned(), until));
        };
        let replay = state.topics.watch(&topic, resume.as_ref(), register).await;
        WatchReply {
            frames: replay
                .frames
                .iter()
                .map(|f| WireFrame::new(topic_name, f))
                .collect(),
            missed: replay.missed,
            placed: replay.placed,
        }
    }
}
