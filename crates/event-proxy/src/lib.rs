//! The event-streaming proxy of `spec/event-proxy.md`: server-sent events per
//! topic, authenticated through the operator's JWT webhook.
//!
//! - [`http`] — the HTTP/1.1 server; [`sse`] — `GET /events/{topic}`.
//! - [`topics`] — subscribers, history, publishing, backpressure.
//! - [`auth`] — tokens, the webhook, its cache and circuit breaker.
//! - [`limits`] — per-IP rate limit and client addresses.
//! - [`peers`] — several proxies as one service (gossip, topic owners, links).
//! - [`revoke`] — `POST /admin/revoke`.
//! - [`refusal`] — every refusal and its one conversion to status, body and headers.
//! - [`metrics`], [`config`].
//!
//! Endpoints besides the stream: `POST /publish/{topic}`, `POST /publish`
//! (batch), `POST /admin/revoke`, `GET /health`, `GET /metrics`, `OPTIONS` on
//! any path (CORS), and the signed `/peer/v1/*` between peers.

pub mod auth;
pub mod config;
pub mod http;
pub mod limits;
pub mod metrics;
pub mod peers;
pub mod refusal;
pub mod revoke;
pub mod sse;
pub mod topics;

use flotilla_api_types::credentials::{bearer_token, constant_time_eq};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use serde::Deserialize;
use serde_json::json;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use flotilla_api_types::clock::{Clock, SystemClock};

use auth::{Action, Authenticator, presented_token};
use config::{IpRange, ProxyConfig};
use http::{Request, Response};
use limits::IpRateLimiter;
use metrics::Metrics;
use peers::Cluster;
use refusal::Refusal;
use topics::{Publish, Topic, Topics, validate_topic};

/// Everything the handlers share.
pub struct ProxyState {
    pub config: ProxyConfig,
    pub topics: Topics,
    pub auth: Arc<Authenticator>,
    pub limiter: IpRateLimiter,
    pub trusted: Vec<IpRange>,
    pub metrics: Arc<Metrics>,
    pub started: Instant,
    pub shutdown: CancellationToken,
    /// Open event streams (against `max_streams`).
    pub streams: AtomicUsize,
    /// The most event streams that may be open: `[http] max_connections`,
    /// or less where the process's connection budget could not keep room
    /// beside them for publishers, peers and `/health` ([`stream_cap`]).
    pub max_streams: usize,
    /// Every connection being served: shutdown waits for them.
    pub connections: tokio_util::task::TaskTracker,
    /// Who each open stream was admitted for (for `POST /admin/revoke`).
    pub open_streams: revoke::OpenStreams,
    /// The other proxies, when `[peers]` is on.
    pub peers: Option<Arc<Cluster>>,
    /// Wall-clock time (token expiry, revocation times).
    pub clock: Arc<dyn Clock>,
    /// The process's connection budget, shared with its other listeners.
    pub listeners: flotilla_net::Listeners,
}

/// The most event streams a process whose listeners may hold `budget`
/// connections serves: `configured` (`[http] max_connections`), less where
/// that would not leave a sixteenth of the budget (at least 64) to
/// publishers, peers and `/health`, which subscribers must never crowd out.
pub fn stream_cap(configured: usize, budget: usize) -> usize {
    let room = (budget / 16).max(64);
    let cap = configured.min(budget.saturating_sub(room));
    if cap < configured {
        tracing::warn!(
            configured,
            cap,
            budget,
            "http.max_connections is more than the process's connection budget leaves beside publishers and /health: streams are capped lower; raise listeners.max_connections (and the descriptor limit) to allow more"
        );
    }
    cap
}

impl ProxyState {
    /// The `Access-Control-Allow-Origin` value for a request from `origin`.
    pub fn allowed_origin(&self, origin: Option<&str>) -> Option<String> {
        let allowed = &self.config.http.cors_allowed_origins;
        if allowed.iter().any(|o| o == "*") {
            return Some("*".into());
        }
        origin
            .filter(|o| allowed.iter().any(|a| a == o))
            .map(str::to_owned)
    }

    /// Adds the CORS origin header to a response.
    pub fn cors(&self, response: Response, origin: Option<&str>) -> Response {
        match self.allowed_origin(origin) {
            Some(allowed) => {
                let vary = allowed != "*";
                let response = response.with_header("Access-Control-Allow-Origin", allowed);
                if vary {
                    response.with_header("Vary", "Origin")
                } else {
                    response
                }
            }
            None => response,
        }
    }

    /// Whether the request carries one of `publisher.api_keys`.
    pub fn is_publisher_key(&self, request: &Request) -> bool {
        let Some(key) = request.header("authorization").and_then(bearer_token) else {
            return false;
        };
        self.config
            .publisher
            .api_keys
            .iter()
            .any(|k| constant_time_eq(k.as_bytes(), key.as_bytes()))
    }

    /// The per-IP rate limit: refused (429) when this client's bucket is empty.
    pub fn check_rate(&self, request: &Request, peer: IpAddr) -> Result<(), Refusal> {
        let client = limits::client_ip(peer, request.header("x-forwarded-for"), &self.trusted);
        if self.limiter.allow(client) {
            return Ok(());
        }
        self.metrics.rate_limited_requests.inc();
        Err(Refusal::RateLimited {
            retry_after_sec: self.config.rate_limit.rate_limit_window_sec.max(1),
        })
    }
}

/// What a handler answers: a response, or the refusal that becomes one.
pub(crate) type Answer = Result<Response, Refusal>;

/// Routes a request other than an event stream.
pub async fn route(state: &Arc<ProxyState>, request: &Request, peer: IpAddr) -> Response {
    // Peers sign every request (checked first thing); many share one address.
    if request.path.starts_with("/peer/") {
        return peers::handle(state, request)
            .await
            .unwrap_or_else(Response::from);
    }
    // Publishers with a key are the operator's own services (the control plane
    // publishes every lifecycle event): the per-IP limit is for everyone else.
    if !state.is_publisher_key(request)
        && let Err(limited) = state.check_rate(request, peer)
    {
        return limited.into();
    }
    let answer = match (request.method.as_str(), request.path.as_str()) {
        ("OPTIONS", _) => Ok(preflight()),
        ("GET", "/health") => Ok(health(state)),
        ("GET", "/metrics") => Ok(metrics(state)),
        ("POST", "/publish") => publish_batch(state, request).await,
        ("POST", "/admin/revoke") => revoke::revoke(state, request).await,
        ("POST", path) if path.starts_with("/publish/") => {
            publish_one(state, request, path.trim_start_matches("/publish/")).await
        }
        (_, "/health" | "/metrics" | "/publish" | "/admin/revoke") => {
            Err(Refusal::MethodNotAllowed)
        }
        (_, path) if path.starts_with("/events/") || path.starts_with("/publish/") => {
            Err(Refusal::MethodNotAllowed)
        }
        _ => Err(Refusal::NotFound),
    };
    answer.unwrap_or_else(Response::from)
}

/// `OPTIONS`: what a browser may send cross-origin.
fn preflight() -> Response {
    Response {
        status: 204,
        headers: vec![
            ("Access-Control-Allow-Methods", "GET, OPTIONS".into()),
            (
                "Access-Control-Allow-Headers",
                "Authorization, Content-Type, Last-Event-ID".into(),
            ),
            ("Access-Control-Max-Age", "600".into()),
        ],
        body: Vec::new(),
    }
}

/// `GET /metrics`: the gauges read now, then every metric.
fn metrics(state: &ProxyState) -> Response {
    let topics = state.topics.active() as i64;
    state.metrics.topics_active.set(topics);
    if let Some(cluster) = &state.peers {
        let lag = cluster.sync_lag().as_millis();
        state.metrics.sync_lag.set(lag.min(i64::MAX as u128) as i64);
    }
    let content_type = "text/plain; version=0.0.4; charset=utf-8";
    Response {
        status: 200,
        headers: vec![("Content-Type", content_type.into())],
        body: state.metrics.render().into_bytes(),
    }
}

fn health(state: &ProxyState) -> Response {
    Response::json(200, &state.health_report())
}

impl ProxyState {
    /// `GET /health`: degraded while the verification webhook's breaker is
    /// open; streams, uptime, the breaker and the peers.
    fn health_report(&self) -> serde_json::Value {
        let breaker = self.auth.breaker.view();
        let status = match breaker.state {
            "open" => "degraded",
            _ => "healthy",
        };
        let mut body = json!({
            "status": status,
            "connections": self.metrics.connections_active.get(),
            "uptime_seconds": self.started.elapsed().as_secs(),
            "circuit_breaker": breaker,
        });
        if let Some(cluster) = &self.peers {
            body["peers"] = cluster.health();
        }
        body
    }
}

/// Who may publish to `topic`: a publisher key from `[publisher]`, or a token
/// with `<topic>:write`. With no keys and no webhook, publishing is open.
async fn authorize_publisher(
    state: &Arc<ProxyState>,
    request: &Request,
    topic: &topics::Topic,
) -> Result<(), Refusal> {
    if state.is_publisher_key(request) {
        return Ok(());
    }
    if !state.auth.enabled() {
        return match state.config.publisher.api_keys.is_empty() {
            true => Ok(()),
            false => Err(Refusal::Unauthenticated),
        };
    }
    let presented = match presented_token(request.header("authorization"), None) {
        // A publisher always needs a credential when auth is on.
        auth::Presented::None => return Err(Refusal::Unauthenticated),
        other => other,
    };
    let decision = state
        .auth
        .authorize(presented, &topic.name, &topic.uuid_hex, Action::Write)
        .await;
    Refusal::from_decision(decision).map(|_| ())
}

pub(crate) fn parse_body<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, Refusal> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(Refusal::BadRequest("A JSON body is required".into()));
    }
    serde_json::from_slice(body).map_err(|e| Refusal::InvalidBody(e.to_string()))
}

/// Why a publish has no id.
fn owner_unavailable(reason: &peers::link::OwnerFailed) -> Refusal {
    tracing::warn!(%reason, "publish: the topic's owner did not answer");
    Refusal::OwnerUnavailable
}

/// An event's id, or the owner's answer still to come.
enum Published {
    Here(String),
    AtOwner(tokio::sync::oneshot::Receiver<peers::link::PublishResult>),
}

impl Published {
    async fn id(self) -> Result<String, Refusal> {
        match self {
            Self::Here(id) => Ok(id),
            Self::AtOwner(answer) => match answer.await {
                Ok(Ok(id)) => Ok(id),
                Ok(Err(reason)) => Err(owner_unavailable(&reason)),
                Err(_) => Err(owner_unavailable(&peers::link::OwnerFailed::LinkClosed)),
            },
        }
    }
}

/// Publishes on this proxy when it owns the topic (or has no peers); else
/// queues the event on the owner's link at once (so a batch's events leave in
/// order) and leaves its answer to await.
async fn publish_event(state: &ProxyState, topic: &Topic, publish: &Publish) -> Published {
    let Some(cluster) = &state.peers else {
        let id = state.topics.publish(topic, publish, |_| {}).await;
        return Published::Here(id.to_string());
    };
    if let Some(owner) = cluster.owner(&topic.name) {
        let event = peers::wire::WirePublish {
            topic: topic.name.clone(),
            publish: publish.clone(),
        };
        return Published::AtOwner(owner.publish(event, &state.metrics));
    }
    let id = state
        .topics
        .publish(topic, publish, |frame| cluster.forward(&topic.name, frame))
        .await;
    Published::Here(id.to_string())
}

/// `POST /publish/{topic}`.
async fn publish_one(state: &Arc<ProxyState>, request: &Request, topic_name: &str) -> Answer {
    validate_topic(topic_name).map_err(|e| Refusal::BadRequest(e.to_string()))?;
    let publish: Publish = parse_body(&request.body)?;
    publish
        .validate()
        .map_err(|e| Refusal::InvalidBody(e.to_string()))?;
    let topic = state.topics.get_or_create(topic_name);
    authorize_publisher(state, request, &topic).await?;
    let id = publish_event(state, &topic, &publish).await.id().await?;
    Ok(Response::json(200, &json!({ "id": id })))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Batch {
    events: Vec<BatchEvent>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BatchEvent {
    topic: String,
    #[serde(flatten)]
    publish: Publish,
}

/// The most events one batch may carry.
const MAX_BATCH: usize = 1000;

/// `POST /publish`: a batch is published whole or not at all.
async fn publish_batch(state: &Arc<ProxyState>, request: &Request) -> Answer {
    let batch: Batch = parse_body(&request.body)?;
    let topics = check_batch(state, request, &batch).await?;
    // Events of topics owned here are published in turn, the others queued on
    // their owner's link; then the owners' answers are awaited in order.
    let mut pending = Vec::with_capacity(topics.len());
    for (topic, event) in topics.iter().zip(&batch.events) {
        pending.push(publish_event(state, topic, &event.publish).await);
    }
    let mut ids = Vec::with_capacity(pending.len());
    for published in pending {
        ids.push(published.id().await?);
    }
    Ok(Response::json(200, &json!({ "ids": ids })))
}

/// Checks every event of a batch (size, topic, body, the publisher's right
/// to each topic) before any is published; answers their topics.
async fn check_batch(
    state: &Arc<ProxyState>,
    request: &Request,
    batch: &Batch,
) -> Result<Vec<Arc<Topic>>, Refusal> {
    if batch.events.is_empty() || batch.events.len() > MAX_BATCH {
        let reason = format!("events must hold 1 to {MAX_BATCH} events");
        return Err(Refusal::InvalidBody(reason));
    }
    let mut topics = Vec::with_capacity(batch.events.len());
    for (index, event) in batch.events.iter().enumerate() {
        event
            .publish
            .validate_on(&event.topic)
            .map_err(|reason| Refusal::InvalidBody(format!("events[{index}]: {reason}")))?;
        let topic = state.topics.get_or_create(&event.topic);
        authorize_publisher(state, request, &topic).await?;
        topics.push(topic);
    }
    Ok(topics)
}

/// A running proxy.
pub struct Proxy {
    pub addr: SocketAddr,
    pub state: Arc<ProxyState>,
    tasks: Vec<JoinHandle<()>>,
}

impl Proxy {
    /// Binds `http.bind_address` and serves.
    pub async fn start(config: ProxyConfig) -> anyhow::Result<Proxy> {
        Self::start_with_clock(config, Arc::new(SystemClock)).await
    }

    pub async fn start_with_clock(
        config: ProxyConfig,
        clock: Arc<dyn Clock>,
    ) -> anyhow::Result<Proxy> {
        let listeners = flotilla_net::Listeners::new(
            &flotilla_net::ListenerLimits::default(),
            flotilla_net::Runs::NoBrowsers,
        );
        Self::start_with(config, clock, listeners).await
    }

    /// Starts with the connection budget of the process it shares (`serve`).
    pub async fn start_with(
        config: ProxyConfig,
        clock: Arc<dyn Clock>,
        listeners: flotilla_net::Listeners,
    ) -> anyhow::Result<Proxy> {
        config.validate().map_err(anyhow::Error::msg)?;
        let bind = config.bind_address().map_err(anyhow::Error::msg)?;
        let listener = flotilla_net::bind(bind)
            .await
            .with_context(|| format!("cannot listen on {bind} (http.bind_address)"))?;
        let addr = listener.local_addr()?;
        let metrics = Arc::new(Metrics::default());
        let peers = if config.peers.active() {
            Some(
                Cluster::start(
                    &config.peers,
                    addr,
                    config.publisher.max_body_bytes,
                    metrics.clone(),
                )
                .await?,
            )
        } else {
            None
        };
        let max_streams = stream_cap(config.http.max_connections, listeners.budget().total());
        let state = Arc::new(ProxyState {
            max_streams,
            topics: Topics::new(
                config.history.size_per_topic,
                Duration::from_secs(config.history.ttl_sec),
                Duration::from_millis(config.http.block_timeout_ms),
                metrics.clone(),
            ),
            auth: Authenticator::new(config.jwt_verifier.clone(), metrics.clone(), clock.clone()),
            limiter: IpRateLimiter::new(
                config.rate_limit.rate_limit_per_ip,
                config.rate_limit.rate_limit_window_sec,
            ),
            trusted: config.trusted_proxies(),
            metrics,
            started: Instant::now(),
            shutdown: CancellationToken::new(),
            streams: AtomicUsize::new(0),
            connections: tokio_util::task::TaskTracker::new(),
            open_streams: revoke::OpenStreams::default(),
            peers,
            clock,
            config,
            listeners,
        });
        let mut tasks = vec![tokio::spawn(http::serve(
            listener,
            state.clone(),
            state.shutdown.clone(),
        ))];
        tasks.extend(Cluster::spawn_tasks(&state));
        let sweeper = state.clone();
        tasks.push(tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(30));
            loop {
                tokio::select! {
                    _ = tick.tick() => {
                        sweeper.topics.sweep();
                        sweeper.limiter.sweep();
                    }
                    _ = sweeper.shutdown.cancelled() => return,
                }
            }
        }));
        Ok(Proxy { addr, state, tasks })
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Graceful shutdown: every stream gets a `retry` hint and is closed; waits
    /// (up to 10 s) until they are.
    pub async fn shutdown(self) {
        self.state.shutdown.cancel();
        for task in self.tasks {
            let _ = task.await;
        }
        // The listener is gone: no connection starts any more; each one sees
        // the shutdown (a stream sends its `retry` hint) and ends.
        self.state.connections.close();
        if tokio::time::timeout(Duration::from_secs(10), self.state.connections.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                connections = self.state.connections.len(),
                "connections still open 10 s after shutdown"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_leave_publishers_room_in_the_connection_budget() {
        // `flotilla proxy` on 20,000 descriptors: the documented 15,000.
        let budget = flotilla_net::Runs::NoBrowsers.default_total(20_000);
        assert_eq!(stream_cap(15_000, budget), 15_000);
        // `serve` shares half with its control plane and browsers.
        let shared = flotilla_net::Runs::Browsers.default_total(20_000);
        assert_eq!(stream_cap(15_000, shared), 10_000 - 625);
        // Whatever is configured, a sixteenth (at least 64) stays free.
        assert_eq!(stream_cap(50_000, 18_976), 18_976 - 1_186);
        assert_eq!(stream_cap(2, 100), 2);
        assert_eq!(stream_cap(1_000, 100), 36);
    }
}
