//! The agent's own WebDriver BiDi client of a Firefox instance: one session
//! at a time, commands one after another (what a park's capture, a
//! revive's restore and a graceful stop need). Firefox holds one BiDi
//! session at a time: while a client's session is open, [`BidiSession::open`]
//! fails with [`BidiError::SessionHeld`].
//!
//! Who gets the browser's only session is settled by its [`SessionTurns`]
//! (one per browser, on its endpoint): clients and the agent's own work
//! claim it, and the live view holds a session of its own only while
//! nobody claims one ([`BidiSession::open_for_view`]), letting go of it
//! between two frames when someone does. A WebDriver session started over
//! HTTP (geckodriver's) takes more than one BiDi connection: the live view
//! attaches to it ([`BidiSession::attach`]) rather than ending it.

use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;

use crate::engine::bidi_tap::BidiTap;
use crate::engine::browser::CdpEndpoint;

/// How long one command may take.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(30);

/// How long the connection and its handshake may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The largest message read (a tree of many tabs, many cookies).
const MAX_MESSAGE: usize = 64 << 20;

/// The largest message the live view reads (a frame; its tabs): a
/// connection attached to a client's session also carries the events the
/// client subscribed to.
const VIEW_MAX_MESSAGE: usize = 16 << 20;

/// How long the agent's own work waits for a `bidi` door client to leave
/// (one that just disconnected: its relay is ending its session, within
/// 7 s) before it counts the session as held.
const CLIENT_LEAVING: Duration = Duration::from_secs(10);

/// How long a `bidi` door client's connection has to answer the node's
/// first command before the node's read goes elsewhere.
const RIDE_PROBE: Duration = Duration::from_secs(1);

/// How long the agent's own work waits for its turn at the session (the
/// live view lets go within a frame; another piece of the agent's own work
/// within its deadline) before it counts the session as held.
const TURN_WAIT: Duration = Duration::from_secs(60);

#[derive(Debug, thiserror::Error)]
pub enum BidiError {
    #[error("cannot reach the browser's WebDriver BiDi socket: {0}")]
    Connect(String),
    #[error(
        "a WebDriver BiDi client holds the browser's only session (Firefox allows one); disconnect it first"
    )]
    SessionHeld,
    #[error("BiDi {method} failed: {error}: {message}")]
    Command {
        method: String,
        error: String,
        message: String,
    },
    #[error("BiDi {0} timed out")]
    Timeout(String),
    #[error("the browser closed its WebDriver BiDi socket")]
    Closed,
}

impl BidiError {
    /// Whether the browser stopped answering (the next command would wait
    /// as long), rather than refusing one command.
    pub fn is_unanswered(&self) -> bool {
        matches!(self, Self::Timeout(_) | Self::Closed | Self::Connect(_))
    }
}

/// Who may hold a Firefox's only WebDriver session (see the module): a
/// count of claims (clients connected, the agent's own work waiting or
/// running) and the turn the agent's own sessions and the live view's take
/// one after another.
#[derive(Debug, Default)]
pub struct SessionTurns {
    claims: std::sync::atomic::AtomicUsize,
    turn: std::sync::Arc<tokio::sync::Mutex<()>>,
    /// Woken when a claim comes and when the last one goes: the live view
    /// lets go of its session at once, or looks again.
    changed: tokio::sync::Notify,
    /// The connections of the `bidi` door's clients, which the node's reads
    /// ride on ([`BidiSession::ride_a_client`]).
    pub taps: crate::engine::bidi_tap::Taps,
    /// How many `bidi` door clients are connected ([`ClientHold`]).
    clients: std::sync::atomic::AtomicUsize,
    /// Woken when the last of them has left.
    clients_left: tokio::sync::Notify,
    /// The turn the connected `bidi` door clients hold together (a second
    /// connection is not kept waiting for the first to leave: Firefox
    /// itself refuses its `session.new` while the first holds a session).
    client_turn: tokio::sync::Mutex<std::sync::Weak<tokio::sync::OwnedMutexGuard<()>>>,
}

/// A `bidi` door client's hold on the browser's session for as long as it
/// is connected: the turn and a claim, so that neither the live view nor
/// the agent's own work starts a session in its way (a client's
/// `session.new` would be refused); they ride on the client's instead.
#[derive(Debug)]
pub struct ClientHold {
    _counted: ClientCounted,
    _claim: SessionClaim,
    _turn: std::sync::Arc<tokio::sync::OwnedMutexGuard<()>>,
}

/// A `bidi` door client counted among the connected ones, from before it
/// waits for the turn (the agent's own work does not start a session
/// meanwhile) until it leaves.
#[derive(Debug)]
struct ClientCounted(std::sync::Arc<SessionTurns>);

impl Drop for ClientCounted {
    fn drop(&mut self) {
        let before = self
            .0
            .clients
            .fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
        if before == 1 {
            self.0.clients_left.notify_waiters();
        }
    }
}

/// A claim on the browser's session: while any is held the live view holds
/// none of its own.
#[derive(Debug)]
pub struct SessionClaim(std::sync::Arc<SessionTurns>);

impl Drop for SessionClaim {
    fn drop(&mut self) {
        let before = self
            .0
            .claims
            .fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
        if before == 1 {
            self.0.changed.notify_waiters();
        }
    }
}

impl SessionTurns {
    /// Claims the session for a client about to start one: returns once the
    /// live view has let go of any session of its own.
    pub async fn claim(self: &std::sync::Arc<Self>) -> SessionClaim {
        let claim = self.claim_now();
        // A `bidi` door client holds the turn for as long as it is
        // connected ([`ClientHold`]): nothing of the view's is left then.
        // One wait for the turn, keeping its place in the queue.
        let turn = self.turn.lock();
        tokio::pin!(turn);
        while self.clients.load(std::sync::atomic::Ordering::SeqCst) == 0 {
            tokio::select! {
                _ = &mut turn => break,
                _ = tokio::time::sleep(Duration::from_millis(100)) => {}
            }
        }
        claim
    }

    /// Holds the session for a client of the `bidi` door about to start
    /// one ([`ClientHold`]): returns once the agent's own work and the live
    /// view have let go of theirs.
    pub async fn hold_for_client(self: &std::sync::Arc<Self>) -> ClientHold {
        self.clients
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let counted = ClientCounted(self.clone());
        let claim = self.claim_now();
        let mut shared = self.client_turn.lock().await;
        let turn = match shared.upgrade() {
            Some(turn) => turn,
            None => {
                let turn = std::sync::Arc::new(self.turn.clone().lock_owned().await);
                *shared = std::sync::Arc::downgrade(&turn);
                turn
            }
        };
        drop(shared);
        ClientHold {
            _counted: counted,
            _claim: claim,
            _turn: turn,
        }
    }

    fn claim_now(self: &std::sync::Arc<Self>) -> SessionClaim {
        self.claims
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.changed.notify_waiters();
        SessionClaim(self.clone())
    }

    /// Returns once no `bidi` door client is connected.
    async fn no_clients(&self) {
        loop {
            let left = self.clients_left.notified();
            tokio::pin!(left);
            left.as_mut().enable();
            if self.clients.load(std::sync::atomic::Ordering::SeqCst) == 0 {
                return;
            }
            left.await;
        }
    }

    /// Whether anyone claims the session (the live view lets go of its own).
    pub fn claimed(&self) -> bool {
        self.claims.load(std::sync::atomic::Ordering::SeqCst) > 0
    }

    /// Waits until a claim comes or the last one goes.
    pub async fn changed(&self) {
        self.changed.notified().await;
    }
}

/// What a session holds of its browser's turns while it is open.
enum Turn {
    /// The agent's own work: its claim, and the turn (held, not read).
    Own {
        _claim: SessionClaim,
        _turn: tokio::sync::OwnedMutexGuard<()>,
    },
    /// The live view's session of its own: the turn, given up when claimed.
    View {
        _turn: tokio::sync::OwnedMutexGuard<()>,
    },
    /// A connection to someone else's session (nothing to end).
    Attached,
}

/// What answers events while a command runs
/// ([`BidiSession::call_serving`]): a command to send for an event, if any.
pub type EventHandler<'a> = dyn FnMut(&Value) -> Option<(&'static str, Value)> + Send + 'a;

/// An open BiDi session on a browser. One of the agent's own (or the live
/// view's) dropped before [`BidiSession::end`] (its step cancelled) is
/// ended in the background: Firefox keeps a session whose socket closed,
/// and with it the browser's only one.
pub struct BidiSession {
    /// `None` once the session has ended (nothing is left to end on drop),
    /// and for a ride on a client's connection.
    socket: Option<WebSocketStream<TcpStream>>,
    /// The `bidi` door client's connection this rides on, if it does
    /// ([`BidiSession::ride_a_client`]).
    tap: Option<std::sync::Arc<BidiTap>>,
    next_id: u64,
    turn: Turn,
    /// Whether `session.new` was sent and not yet answered (a session may
    /// still come of it: its end waits for it first).
    new_pending: bool,
}

impl Drop for BidiSession {
    fn drop(&mut self) {
        if matches!(self.turn, Turn::Attached) {
            return;
        }
        let Some(unended) = self.unended() else {
            return;
        };
        // The turn (and claim) go with it: nobody starts a session before
        // this one has ended. (Without a runtime, or one shutting down, the
        // connection only closes: the browser goes too.)
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(unended.finish());
        }
    }
}

/// What is left to end of a session: its connection and turn, with no
/// `Drop` of its own (so ending one never starts another end).
struct Unended {
    socket: WebSocketStream<TcpStream>,
    next_id: u64,
    turn: Turn,
    new_pending: bool,
}

impl Unended {
    /// Ends the session (after the answer to a `session.new` still
    /// pending), then closes; a few seconds at most for each.
    async fn finish(mut self) {
        if !matches!(self.turn, Turn::Attached) {
            if self.new_pending {
                let started = read_answer(&mut self.socket, 1);
                let _ = tokio::time::timeout(CONNECT_TIMEOUT, started).await;
            }
            let id = self.next_id + 1;
            let command = json!({"id": id, "method": "session.end", "params": {}});
            let ending = async {
                if self
                    .socket
                    .send(Message::text(command.to_string()))
                    .await
                    .is_ok()
                {
                    read_answer(&mut self.socket, id).await;
                }
            };
            let _ = tokio::time::timeout(CONNECT_TIMEOUT, ending).await;
        }
        let _ = tokio::time::timeout(CONNECT_TIMEOUT, self.socket.close(None)).await;
    }
}

/// A message's id and whether it is an event, read without building the
/// rest (events nobody handles are skipped at the cost of a scan).
#[derive(serde::Deserialize)]
struct Peek {
    id: Option<u64>,
    #[serde(rename = "type")]
    kind: Option<String>,
}

/// Reads until the answer to command `id` (events skipped), or the
/// connection's end.
async fn read_answer(socket: &mut WebSocketStream<TcpStream>, id: u64) {
    while let Some(Ok(message)) = socket.next().await {
        if let Message::Text(text) = message
            && serde_json::from_str::<Peek>(&text).is_ok_and(|peek| peek.id == Some(id))
        {
            return;
        }
    }
}

impl BidiSession {
    /// Connects to the browser behind `endpoint` and starts a session,
    /// waiting for the live view to let go of its own.
    pub async fn open(endpoint: &CdpEndpoint) -> Result<Self, BidiError> {
        let turns = &endpoint.session_turns;
        if tokio::time::timeout(CLIENT_LEAVING, turns.no_clients())
            .await
            .is_err()
        {
            return Err(BidiError::SessionHeld);
        }
        let claim = turns.claim_now();
        let turn = tokio::time::timeout(TURN_WAIT, turns.turn.clone().lock_owned())
            .await
            .map_err(|_| BidiError::SessionHeld)?;
        Self::start(
            endpoint,
            Turn::Own {
                _claim: claim,
                _turn: turn,
            },
            MAX_MESSAGE,
        )
        .await
    }

    /// The live view's own session: `None` while anyone claims the browser's
    /// session. It is to be ended as soon as [`SessionTurns::claimed`].
    pub async fn open_for_view(endpoint: &CdpEndpoint) -> Result<Option<Self>, BidiError> {
        let turns = &endpoint.session_turns;
        let Ok(turn) = turns.turn.clone().try_lock_owned() else {
            return Ok(None);
        };
        if turns.claimed() {
            return Ok(None);
        }
        Self::start(endpoint, Turn::View { _turn: turn }, VIEW_MAX_MESSAGE)
            .await
            .map(Some)
    }

    /// A connection to the session at `path` (`/session/{id}`) that someone
    /// else started over HTTP; [`BidiSession::end`] only closes it.
    pub async fn attach(endpoint: &CdpEndpoint, path: &str) -> Result<Self, BidiError> {
        let socket = connect(endpoint, path, VIEW_MAX_MESSAGE).await?;
        Ok(Self {
            socket: Some(socket),
            tap: None,
            next_id: 0,
            turn: Turn::Attached,
            new_pending: false,
        })
    }

    /// A ride on the session of a client of the `bidi` door (the newest
    /// connected one that has a session), through its relay
    /// ([`crate::engine::bidi_tap`]); `None` when no client has one. Only
    /// commands: the client's events stay the client's.
    pub async fn ride_a_client(endpoint: &CdpEndpoint) -> Option<Self> {
        // Every client's connection is asked at once, briefly: one that
        // stalls its relay holds nobody up for long.
        let taps = endpoint.session_turns.taps.live();
        let probes = taps.iter().map(|tap| {
            // A connection without a session refuses every command.
            tap.call(
                "browsingContext.getTree",
                json!({"maxDepth": 0}),
                RIDE_PROBE,
            )
        });
        let answered = futures_util::future::join_all(probes).await;
        let (tap, _) = taps
            .into_iter()
            .zip(answered)
            .find(|(_, answered)| answered.is_ok())?;
        Some(Self {
            socket: None,
            tap: Some(tap),
            next_id: 0,
            turn: Turn::Attached,
            new_pending: false,
        })
    }

    /// For a short read of the node's (the tabs, a screenshot): a connection
    /// to the WebDriver client's session whose BiDi socket is
    /// `client_socket` when there is one (as the live view rides on it), else
    /// a ride on a `bidi` door client's session
    /// ([`BidiSession::ride_a_client`]), else a session of the node's own
    /// ([`BidiSession::open`]), which it also is when the others ended
    /// meanwhile.
    pub async fn ride_or_open(
        endpoint: &CdpEndpoint,
        client_socket: Option<&str>,
    ) -> Result<Self, BidiError> {
        if let Some(path) = client_socket {
            match Self::attach(endpoint, path).await {
                Ok(session) => return Ok(session),
                Err(error) => {
                    tracing::debug!(%error, "the client's session is gone: one of the node's own")
                }
            }
        }
        if let Some(riding) = Self::ride_a_client(endpoint).await {
            return Ok(riding);
        }
        Self::open(endpoint).await
    }

    async fn start(endpoint: &CdpEndpoint, turn: Turn, max: usize) -> Result<Self, BidiError> {
        let socket = connect(endpoint, &endpoint.browser_path, max).await?;
        let mut session = Self {
            socket: Some(socket),
            tap: None,
            next_id: 0,
            turn,
            new_pending: true,
        };
        let started = session
            .call("session.new", json!({"capabilities": {}}))
            .await;
        if !matches!(started, Err(BidiError::Timeout(_))) {
            session.new_pending = false;
        }
        match started {
            Err(BidiError::Command { error, .. }) if error == "session not created" => {
                // No session to end: the connection only closes.
                session.socket = None;
                Err(BidiError::SessionHeld)
            }
            Err(other) => {
                // A session.new that timed out may still make a session:
                // end it, or it would hold the browser's only one.
                session.end().await;
                Err(other)
            }
            Ok(_) => Ok(session),
        }
    }

    /// Sends `method` and waits for its result (events are skipped).
    pub async fn call(&mut self, method: &str, params: Value) -> Result<Value, BidiError> {
        self.call_handling(method, params, None, COMMAND_TIMEOUT)
            .await
    }

    /// [`BidiSession::call`] with `within` for its answer rather than the
    /// usual 30 s (a script that waits for the page).
    pub async fn call_within(
        &mut self,
        method: &str,
        params: Value,
        within: Duration,
    ) -> Result<Value, BidiError> {
        self.call_handling(method, params, None, within).await
    }

    /// [`BidiSession::call`], handing each event that comes meanwhile to
    /// `on_event`, which may answer it with a command of its own (sent at
    /// once; its answer is not awaited).
    pub async fn call_serving(
        &mut self,
        method: &str,
        params: Value,
        on_event: &mut EventHandler<'_>,
    ) -> Result<Value, BidiError> {
        self.call_handling(method, params, Some(on_event), COMMAND_TIMEOUT)
            .await
    }

    /// Hands each event that comes within `within` to `on_event` (as
    /// [`BidiSession::call_serving`] does while a command runs), then
    /// returns.
    pub async fn serve_events(
        &mut self,
        within: Duration,
        on_event: &mut EventHandler<'_>,
    ) -> Result<(), BidiError> {
        if self.tap.is_some() {
            // A ride on a client's session sees none of its events.
            tokio::time::sleep(within).await;
            return Ok(());
        }
        // No command has this id: only events are read.
        let until = tokio::time::Instant::now() + within;
        self.answer_to(u64::MAX, Some(on_event), until)
            .await
            .map(drop)
    }

    async fn call_handling(
        &mut self,
        method: &str,
        params: Value,
        on_event: Option<&mut EventHandler<'_>>,
        within: Duration,
    ) -> Result<Value, BidiError> {
        if let Some(tap) = &self.tap {
            return tap.call(method, params, within).await;
        }
        let id = self.send(method, params).await?;
        let until = tokio::time::Instant::now() + within;
        let answer = self
            .answer_to(id, on_event, until)
            .await?
            .ok_or_else(|| BidiError::Timeout(method.to_owned()))?;
        result_of(method, &answer)
    }

    /// Sends a command: its id.
    async fn send(&mut self, method: &str, params: Value) -> Result<u64, BidiError> {
        self.next_id += 1;
        let id = self.next_id;
        let command = json!({"id": id, "method": method, "params": params}).to_string();
        self.socket
            .as_mut()
            .ok_or(BidiError::Closed)?
            .send(Message::text(command))
            .await
            .map_err(|_| BidiError::Closed)?;
        Ok(id)
    }

    /// The answer to command `id` (`None` when `until` passes first),
    /// handing events to `on_event` meanwhile. Only the reads are bounded
    /// by `until`: a command sent for an event is always sent whole, so no
    /// held request is left unanswered in the socket's buffer.
    async fn answer_to(
        &mut self,
        id: u64,
        mut on_event: Option<&mut EventHandler<'_>>,
        until: tokio::time::Instant,
    ) -> Result<Option<Value>, BidiError> {
        let socket = self.socket.as_mut().ok_or(BidiError::Closed)?;
        // What an earlier, cancelled send left in the buffer goes first.
        socket.flush().await.map_err(|_| BidiError::Closed)?;
        loop {
            let Ok(message) = tokio::time::timeout_at(until, socket.next()).await else {
                return Ok(None);
            };
            let Some(message) = message else {
                return Err(BidiError::Closed);
            };
            let Ok(Message::Text(text)) = message else {
                continue;
            };
            let Ok(peek) = serde_json::from_str::<Peek>(&text) else {
                continue;
            };
            let event = peek.kind.as_deref() == Some("event") && on_event.is_some();
            if peek.id != Some(id) && !event {
                continue;
            }
            let Ok(message) = serde_json::from_str::<Value>(&text) else {
                continue;
            };
            if !event {
                return Ok(Some(message));
            }
            if let Some((method, params)) = on_event.as_mut().and_then(|handle| handle(&message)) {
                self.next_id += 1;
                let command = json!({"id": self.next_id, "method": method, "params": params});
                socket
                    .send(Message::text(command.to_string()))
                    .await
                    .map_err(|_| BidiError::Closed)?;
            }
        }
    }

    /// Ends the session (the browser goes on), waiting a few seconds at
    /// most for the browser; an attached connection is only closed.
    pub async fn end(mut self) {
        if let Some(unended) = self.unended() {
            unended.finish().await;
        }
    }

    /// What is left to end, taken out of the session (its drop then ends
    /// nothing).
    fn unended(&mut self) -> Option<Unended> {
        Some(Unended {
            socket: self.socket.take()?,
            next_id: self.next_id,
            turn: std::mem::replace(&mut self.turn, Turn::Attached),
            new_pending: self.new_pending,
        })
    }

    /// Marks the session ended by a `session.end` sent by hand (through
    /// [`BidiSession::call_serving`]): only the connection is left to close.
    pub fn ended(mut self) {
        if let Some(mut unended) = self.unended() {
            unended.turn = Turn::Attached;
            tokio::spawn(unended.finish());
        }
    }

    /// Closes the browser: it writes its profile and quits.
    pub async fn close_browser(mut self) -> Result<(), BidiError> {
        self.call("browser.close", json!({})).await?;
        self.socket = None;
        Ok(())
    }
}

/// The result of an answer to command `method`, or the error it carries.
pub(crate) fn result_of(method: &str, answer: &Value) -> Result<Value, BidiError> {
    if answer["type"] == "success" {
        return Ok(answer["result"].clone());
    }
    Err(BidiError::Command {
        method: method.to_owned(),
        error: answer["error"].as_str().unwrap_or("error").to_owned(),
        message: answer["message"].as_str().unwrap_or_default().to_owned(),
    })
}

/// A WebSocket to `path` on the browser's BiDi server behind `endpoint`.
async fn connect(
    endpoint: &CdpEndpoint,
    path: &str,
    max: usize,
) -> Result<WebSocketStream<TcpStream>, BidiError> {
    let connected = tokio::time::timeout(CONNECT_TIMEOUT, async {
        let stream = endpoint.connect().await.map_err(|e| e.to_string())?;
        let url = format!("ws://{}{}", endpoint.authority(), path);
        let config = WebSocketConfig::default()
            .max_message_size(Some(max))
            .max_frame_size(Some(max));
        tokio_tungstenite::client_async_with_config(url, stream, Some(config))
            .await
            .map_err(|e| e.to_string())
    })
    .await
    .map_err(|_| BidiError::Connect("no answer".into()))?;
    let (socket, _) = connected.map_err(BidiError::Connect)?;
    Ok(socket)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;

    /// A BiDi peer on 127.0.0.1 that answers every command with success
    /// and sends the methods it was asked for down `seen`.
    async fn answering_peer() -> (u16, tokio::sync::mpsc::UnboundedReceiver<String>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (seen, methods) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let seen = seen.clone();
                tokio::spawn(async move {
                    let Ok(mut socket) = tokio_tungstenite::accept_async(stream).await else {
                        return;
                    };
                    while let Some(Ok(Message::Text(text))) = socket.next().await {
                        let command: Value = serde_json::from_str(&text).unwrap();
                        let _ = seen.send(command["method"].as_str().unwrap().to_owned());
                        let answer = json!({"type": "success", "id": command["id"], "result": {}});
                        let _ = socket.send(Message::text(answer.to_string())).await;
                    }
                });
            }
        });
        (port, methods)
    }

    #[tokio::test]
    async fn a_session_dropped_before_its_end_is_ended_and_holds_the_turn_until_then() {
        let (port, mut methods) = answering_peer().await;
        let endpoint = CdpEndpoint::bidi_on_host(port);
        let session = BidiSession::open(&endpoint).await.unwrap();
        assert_eq!(methods.recv().await.unwrap(), "session.new");
        // Its step was cancelled: the session goes without `end`.
        drop(session);
        let ended = tokio::time::timeout(Duration::from_secs(10), methods.recv()).await;
        assert_eq!(ended.unwrap().unwrap(), "session.end");
        // The next session of the agent's own starts once that one ended.
        let next = tokio::time::timeout(Duration::from_secs(10), BidiSession::open(&endpoint))
            .await
            .expect("the turn is given back once the dropped session ended")
            .unwrap();
        assert_eq!(methods.recv().await.unwrap(), "session.new");
        next.end().await;
        assert_eq!(methods.recv().await.unwrap(), "session.end");
        // One that ended is not ended again.
        let quiet = tokio::time::timeout(Duration::from_millis(300), methods.recv()).await;
        assert!(quiet.is_err(), "{quiet:?}");
    }

    #[tokio::test]
    async fn a_claim_waits_for_the_view_to_let_go_and_holds_it_off_until_dropped() {
        let turns = Arc::new(SessionTurns::default());
        assert!(!turns.claimed());
        // The live view holds its own session (the turn).
        let view = turns.turn.clone().try_lock_owned().unwrap();
        let claiming = tokio::spawn({
            let turns = turns.clone();
            async move { turns.claim().await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(
            turns.claimed(),
            "the view sees the claim between two frames"
        );
        assert!(
            !claiming.is_finished(),
            "the client waits for the view to let go"
        );
        drop(view);
        let claim = tokio::time::timeout(Duration::from_secs(5), claiming)
            .await
            .expect("the claim is granted once the view let go")
            .unwrap();
        // While claimed, the view takes no session of its own, though the
        // turn itself is free.
        assert!(turns.turn.clone().try_lock_owned().is_ok());
        assert!(turns.claimed());
        let second = turns.claim().await;
        drop(claim);
        assert!(turns.claimed(), "claims are counted");
        drop(second);
        assert!(!turns.claimed());
    }
}
