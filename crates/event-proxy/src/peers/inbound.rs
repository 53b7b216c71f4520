//! What peers ask of this proxy (`/peer/v1/…`): signed batches of events
//! for the topics it serves, watches of the topics it owns, and history.

use std::sync::Arc;
use std::time::Instant;

use serde_json::json;

use super::wire::{Batch, BatchReply, Watch, WatchReply, WireFrame, WirePublish};
use super::{Cluster, HISTORY_PATH, REVOKE_PATH, WATCH_PATH, link, wire};
use crate::ProxyState;
use crate::http::{Request, Response};
use crate::refusal::Refusal;
use crate::topics::{parse_last_event_id, validate_topic};

pub(super) async fn receive_watch(
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

pub(super) async fn receive_batch(
    state: &Arc<ProxyState>,
    cluster: &Arc<Cluster>,
    batch: Batch,
) -> Response {
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
