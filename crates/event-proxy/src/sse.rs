//! `GET /events/{topic}`: checks (per-IP limit, connection cap, token), then the
//! event stream: replay after `Last-Event-ID` (from this proxy's history, or
//! with peers from the topic's owner), live events, `: keepalive`
//! comments, and an orderly end (token expiry, revocation,
//! `connection_timeout_sec`, overflow under `block`, shutdown) with a last
//! event or `retry` hint.

use std::collections::HashSet;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::ProxyState;
use crate::auth::{Action, Grant, presented_token};
use crate::http::{Request, Response};
use crate::refusal::Refusal;
use crate::topics::{
    EventId, Frame, Resume, Subscriber, Topic, parse_last_event_id, validate_topic,
};

/// Holds one slot of `max_connections` and the active-connection gauge.
struct StreamSlot {
    state: Arc<ProxyState>,
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        self.state.streams.fetch_sub(1, Ordering::SeqCst);
        self.state.metrics.connections_active.dec();
    }
}

fn take_slot(state: &Arc<ProxyState>) -> Option<StreamSlot> {
    let max = state.max_streams;
    state
        .streams
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
            (n < max).then_some(n + 1)
        })
        .ok()?;
    state.metrics.connections_active.inc();
    Some(StreamSlot {
        state: state.clone(),
    })
}

async fn refuse(
    mut stream: TcpStream,
    state: &ProxyState,
    response: Response,
    origin: Option<&str>,
) {
    let _ = stream
        .write_all(&state.cors(response, origin).encode(false))
        .await;
    let _ = stream.shutdown().await;
}

/// A subscription that passed every check, with what it was admitted with.
struct Admission {
    slot: StreamSlot,
    topic: Arc<Topic>,
    resume: Option<Resume>,
    grant: Grant,
}

/// Checks a subscription in the spec's order: rate limit, topic,
/// `Last-Event-ID`, room for one more stream, credential.
async fn admit(
    state: &Arc<ProxyState>,
    request: &Request,
    peer: IpAddr,
) -> Result<Admission, Refusal> {
    state.check_rate(request, peer)?;
    let topic_name = request.path.trim_start_matches("/events/");
    validate_topic(topic_name).map_err(|e| Refusal::BadRequest(e.to_string()))?;
    let resume = match request
        .header("last-event-id")
        .or_else(|| request.query("last_event_id"))
    {
        Some(text) if !text.is_empty() => {
            Some(parse_last_event_id(text).map_err(|e| Refusal::BadRequest(e.to_string()))?)
        }
        _ => None,
    };
    let slot = take_slot(state).ok_or(Refusal::TooManyConnections)?;
    let topic = state.topics.get_or_create(topic_name);
    let presented = presented_token(request.header("authorization"), request.query("token"));
    let decision = state
        .auth
        .authorize(presented, &topic.name, &topic.uuid_hex, Action::Read)
        .await;
    let grant = Refusal::from_decision(decision)?;
    Ok(Admission {
        slot,
        topic,
        resume,
        grant,
    })
}

/// `GET /events/{topic}`: admit, then stream until the client, the token,
/// a revocation, the lifetime or the proxy ends it.
pub async fn subscribe(stream: TcpStream, request: Request, peer: IpAddr, state: Arc<ProxyState>) {
    let origin = request.header("origin");
    match admit(&state, &request, peer).await {
        Ok(admission) => serve_stream(stream, &state, admission, origin).await,
        Err(refusal) => refuse(stream, &state, refusal.into(), origin).await,
    }
}

async fn serve_stream(
    stream: TcpStream,
    state: &Arc<ProxyState>,
    admission: Admission,
    origin: Option<&str>,
) {
    let Admission {
        slot,
        topic,
        resume,
        grant,
    } = admission;
    // Counted once the stream is open, not for refused attempts.
    state.metrics.connections_total.inc();
    let subscriber = Arc::new(Subscriber::new(
        state.topics.new_subscriber_id(),
        state.config.http.max_message_queue_size,
        state.config.http.backpressure_policy,
    ));
    let registration = crate::revoke::register(state, subscriber.id, &grant);
    let (mut replay, first) = state
        .topics
        .subscribe(&topic, subscriber.clone(), resume.as_ref())
        .await;
    if let Some(cluster) = &state.peers {
        if first {
            cluster.announce(&topic.name).await;
        }
        if let Some(remote) = cluster
            .join(&topic.name, resume.as_ref(), replay.placed)
            .await
        {
            replay = remote;
        }
    }
    let outcome = stream_events(
        stream,
        state,
        &subscriber,
        replay,
        grant.expires_at,
        &registration.revoked,
        origin,
    )
    .await;
    drop(registration);
    state.topics.unsubscribe(&topic, subscriber.id).await;
    drop(slot);
    tracing::debug!(topic = %topic.name, user = ?grant.user_id, ?outcome, "stream ended");
}

/// Why a stream ended.
#[derive(Debug)]
enum End {
    ClientGone,
    TokenExpired,
    Revoked,
    Lifetime,
    Overflow,
    Shutdown,
}

async fn stream_events(
    mut stream: TcpStream,
    state: &Arc<ProxyState>,
    subscriber: &Arc<Subscriber>,
    replay: crate::topics::Replay,
    expires_at: Option<chrono::DateTime<chrono::Utc>>,
    revoked: &tokio_util::sync::CancellationToken,
    origin: Option<&str>,
) -> End {
    let http = &state.config.http;
    let mut out = stream_head(state, origin, &replay);
    // Events of a peer's replay may also arrive live: they are sent once.
    let mut replayed: HashSet<EventId> = if replay.from_peer {
        replay.frames.iter().map(|f| f.id()).collect()
    } else {
        HashSet::new()
    };
    let mut frames: Vec<Arc<Frame>> = replay.frames;
    let (mut reader, mut writer) = stream.split();
    let mut deadlines = Deadlines::new(http, expires_at);
    let mut probe = [0u8; 64];
    loop {
        if !frames.is_empty() || !out.is_empty() {
            if let Err(end) = write_pending(&mut writer, state, &mut out, &mut frames).await {
                return end;
            }
            deadlines.wrote();
        }
        if subscriber.is_cut_off() {
            let dropped = subscriber.dropped.load(Ordering::Relaxed);
            let last = format!("event: overflow\ndata: {{\"dropped\":{dropped}}}\n\n");
            final_write(&mut writer, last.as_bytes()).await;
            return End::Overflow;
        }
        let (last, end) = tokio::select! {
            biased;
            _ = subscriber.ready.notified() => {
                subscriber.drain(&mut frames);
                skip_replayed(&mut frames, &mut replayed);
                continue;
            }
            _ = tokio::time::sleep_until(deadlines.keepalive) => {
                out.extend_from_slice(b": keepalive\n\n");
                continue;
            }
            read = reader.read(&mut probe) => {
                // A client sends nothing after its request: EOF or error is a hang-up.
                if matches!(read, Ok(0) | Err(_)) {
                    return End::ClientGone;
                }
                continue;
            }
            _ = revoked.cancelled() => {
                (b"event: revoked\ndata: access was revoked\n\n".to_vec(), End::Revoked)
            }
            _ = tokio::time::sleep_until(deadlines.token_ends) => {
                (b"event: expired\ndata: the token expired\n\n".to_vec(), End::TokenExpired)
            }
            _ = tokio::time::sleep_until(deadlines.lifetime_ends) => {
                (format!("retry: {}\n\n", http.retry_ms).into_bytes(), End::Lifetime)
            }
            _ = state.shutdown.cancelled() => {
                (format!("retry: {}\n\n", http.retry_ms).into_bytes(), End::Shutdown)
            }
        };
        final_write(&mut writer, &last).await;
        return end;
    }
}

/// The answer's head (CORS as `http.cors_allowed_origins` says), and the
/// `missed` event when a resume could not be served in full.
fn stream_head(
    state: &ProxyState,
    origin: Option<&str>,
    replay: &crate::topics::Replay,
) -> Vec<u8> {
    // `http.cors_allowed_origins` holds for streams as for every answer: an
    // allowed origin is echoed (the answer then varies with `Origin`), any
    // other gets no `Access-Control-Allow-Origin`; `*` only when configured.
    let cors = match state.allowed_origin(origin) {
        Some(allowed) if allowed == "*" => "Access-Control-Allow-Origin: *\r\n".to_owned(),
        Some(allowed) => format!("Access-Control-Allow-Origin: {allowed}\r\nVary: Origin\r\n"),
        None => String::new(),
    };
    let mut out: Vec<u8> = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\nConnection: keep-alive\r\n\
         {cors}X-Accel-Buffering: no\r\n\r\n"
    )
    .into_bytes();
    if let Some(missed) = &replay.missed {
        out.extend_from_slice(b"event: missed\ndata: ");
        out.extend_from_slice(serde_json::to_string(missed).unwrap_or_default().as_bytes());
        out.extend_from_slice(b"\n\n");
    }
    out
}

/// When a stream next sends a keepalive, and when its token and its
/// lifetime (`connection_timeout_sec`) end it.
struct Deadlines {
    keepalive: tokio::time::Instant,
    every: Duration,
    token_ends: tokio::time::Instant,
    lifetime_ends: tokio::time::Instant,
}

impl Deadlines {
    fn new(
        http: &crate::config::HttpConfig,
        expires_at: Option<chrono::DateTime<chrono::Utc>>,
    ) -> Self {
        let now = tokio::time::Instant::now();
        let never = now + Duration::from_secs(365 * 24 * 3600);
        let every = Duration::from_secs(http.keepalive_interval_sec);
        let token_ends = expires_at.map_or(never, |at| {
            now + (at - chrono::Utc::now()).to_std().unwrap_or(Duration::ZERO)
        });
        let lifetime_ends = if http.connection_timeout_sec > 0 {
            now + Duration::from_secs(http.connection_timeout_sec)
        } else {
            never
        };
        Self {
            keepalive: now + every,
            every,
            token_ends,
            lifetime_ends,
        }
    }

    /// Something was written: the next keepalive is due a full interval later.
    fn wrote(&mut self) {
        self.keepalive = tokio::time::Instant::now() + self.every;
    }
}

/// Writes whatever is pending in one go. A client that does not read blocks
/// this write (that is the backpressure); shutdown still gets through.
async fn write_pending(
    writer: &mut tokio::net::tcp::WriteHalf<'_>,
    state: &ProxyState,
    out: &mut Vec<u8>,
    frames: &mut Vec<Arc<Frame>>,
) -> Result<(), End> {
    let now = std::time::Instant::now();
    for frame in frames.iter() {
        out.extend_from_slice(&frame.bytes);
    }
    tokio::select! {
        written = writer.write_all(out) => if written.is_err() {
            return Err(End::ClientGone);
        },
        _ = state.shutdown.cancelled() => return Err(End::Shutdown),
    }
    state.metrics.bytes_sent.add(out.len() as u64);
    state.metrics.messages_sent.add(frames.len() as u64);
    for frame in frames.iter() {
        state
            .metrics
            .publish_to_write
            .observe(now.duration_since(frame.published_at));
    }
    frames.clear();
    out.clear();
    Ok(())
}

/// Drops live events a peer's replay already sent. Live events arrive in
/// order: once one is past the replay, none after it can repeat.
fn skip_replayed(frames: &mut Vec<Arc<Frame>>, replayed: &mut HashSet<EventId>) {
    if replayed.is_empty() {
        return;
    }
    let mut past = false;
    frames.retain(|f| {
        past = past || !replayed.contains(&f.id());
        past
    });
    if past {
        replayed.clear();
    }
}

/// The last bytes of a stream, then a clean close; a client that does not read
/// gets one second.
async fn final_write(writer: &mut tokio::net::tcp::WriteHalf<'_>, bytes: &[u8]) {
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        writer.write_all(bytes).await?;
        writer.shutdown().await
    })
    .await;
}
