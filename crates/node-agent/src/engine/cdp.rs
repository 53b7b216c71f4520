//! A small Chrome DevTools Protocol client over tokio-tungstenite: commands with
//! their responses matched by id, events fanned out on a broadcast channel, and
//! flat sessions (`sessionId`) for page targets.
//!
//! The agent uses it for its own needs (graceful `Browser.close`, screenshots,
//! the live view, dormancy state capture); clients' CDP traffic never passes
//! through it (the gateway proxies bytes).

use futures_util::stream::SplitSink;
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::net::TcpStream;
use tokio::sync::{Mutex, broadcast, oneshot};
use tokio_tungstenite::tungstenite::Error as WsError;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use crate::engine::browser::CdpEndpoint;

/// The largest message a client takes unless told otherwise.
const MAX_MESSAGE: usize = 256 << 20;
/// Events kept for a slow reader unless told otherwise.
const EVENTS_QUEUED: usize = 256;

type WsSink = SplitSink<WebSocketStream<MaybeTlsStream<TcpStream>>, Message>;
/// Callers waiting for a response, with the session they called on.
type Pending =
    Arc<std::sync::Mutex<HashMap<u64, (Option<String>, oneshot::Sender<Result<Value, CdpError>>)>>>;

#[derive(Debug, Clone, thiserror::Error)]
pub enum CdpError {
    #[error("cannot connect to CDP at {url}: {reason}")]
    Connect { url: String, reason: String },
    #[error("CDP connection closed")]
    Closed,
    #[error("the page went away (crashed or detached) during {0}")]
    TargetGone(String),
    #[error("CDP {method} failed: {message}")]
    Protocol { method: String, message: String },
    #[error("CDP {method} timed out after {timeout:?}")]
    Timeout { method: String, timeout: Duration },
    #[error("the browser sent a message larger than this connection takes")]
    MessageTooLarge,
    /// The browser speaks another protocol (Firefox: WebDriver BiDi).
    #[error(
        "this instance runs {engine}, which speaks WebDriver BiDi and not CDP: this step needs CDP and is not available on {engine} instances yet"
    )]
    NotCdp { engine: &'static str },
}

/// [`CdpError::NotCdp`] for an endpoint that does not speak CDP.
fn speaks_cdp(endpoint: &CdpEndpoint) -> Result<(), CdpError> {
    if endpoint.speaks_cdp() {
        return Ok(());
    }
    Err(CdpError::NotCdp {
        engine: endpoint.engine.label(),
    })
}

/// An answer this client cannot read as a tree (it nests deeper than
/// serde_json's 128 levels) still ends its caller's wait, with an error,
/// rather than leaving it to its timeout: its `id` is read without building
/// anything.
fn fail_unreadable_answer(pending: &Pending, text: &str) {
    #[derive(serde::Deserialize)]
    struct IdOnly {
        id: Option<u64>,
    }
    let Ok(IdOnly { id: Some(id) }) = serde_json::from_str::<IdOnly>(text) else {
        return;
    };
    if let Some((_, waiter)) = pending.lock().expect("pending lock").remove(&id) {
        let _ = waiter.send(Err(CdpError::Protocol {
            method: String::new(),
            message: "the browser's answer cannot be read (it nests deeper than 128 levels)".into(),
        }));
    }
}

/// The string `field` of `method`'s answer.
fn answer_field(answer: &Value, method: &str, field: &str) -> Result<String, CdpError> {
    answer[field]
        .as_str()
        .map(str::to_owned)
        .ok_or_else(|| CdpError::Protocol {
            method: method.to_owned(),
            message: format!("the answer has no {field}: {answer}"),
        })
}

/// One CDP event.
#[derive(Debug, Clone)]
pub struct CdpEvent {
    pub method: String,
    pub params: Value,
    pub session_id: Option<String>,
}

/// A connection to a browser's (or page's) DevTools endpoint.
pub struct CdpClient {
    /// Writer half; a tokio mutex because sending awaits the socket.
    sink: Mutex<WsSink>,
    next_id: AtomicU64,
    /// Callers waiting for a response; a std mutex, held only to insert or remove.
    pending: Pending,
    events: broadcast::Sender<CdpEvent>,
    /// The task reading the socket; it holds the socket's other half.
    reader: tokio::task::AbortHandle,
}

/// Dropping the client closes its connection: the browser ends its session
/// (and whatever the session enabled there, such as `Fetch` interception).
impl Drop for CdpClient {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

impl CdpClient {
    /// The browser target of `endpoint`.
    pub async fn browser(endpoint: &CdpEndpoint) -> Result<Self, CdpError> {
        Self::open(endpoint, &endpoint.browser_path).await
    }

    /// The target at `path` (`/devtools/page/<id>`, …) of `endpoint`, reached
    /// through the browser's network namespace when it has one.
    pub async fn open(endpoint: &CdpEndpoint, path: &str) -> Result<Self, CdpError> {
        Self::open_limited(endpoint, path, MAX_MESSAGE).await
    }

    /// [`CdpClient::open`], taking messages of at most `max_message` bytes: a
    /// larger one fails the calls waiting (with
    /// [`CdpError::MessageTooLarge`]) before it is read whole.
    pub async fn open_limited(
        endpoint: &CdpEndpoint,
        path: &str,
        max_message: usize,
    ) -> Result<Self, CdpError> {
        Self::open_with_events(endpoint, path, max_message, EVENTS_QUEUED).await
    }

    /// [`CdpClient::open_limited`], keeping up to `events_queued` events for
    /// a slow reader (more are dropped, and the reader told it lagged).
    pub async fn open_with_events(
        endpoint: &CdpEndpoint,
        path: &str,
        max_message: usize,
        events_queued: usize,
    ) -> Result<Self, CdpError> {
        speaks_cdp(endpoint)?;
        let url = format!("ws://{}{path}", endpoint.authority());
        let stream = endpoint.connect().await.map_err(|e| CdpError::Connect {
            url: url.clone(),
            reason: e.to_string(),
        })?;
        let config = WebSocketConfig::default()
            .max_message_size(Some(max_message))
            .max_frame_size(Some(max_message));
        let connected = tokio_tungstenite::client_async_with_config(
            &url,
            MaybeTlsStream::Plain(stream),
            Some(config),
        )
        .await;
        Self::started(&url, connected, events_queued)
    }

    /// A DevTools WebSocket URL reachable from here (e.g. an instance's `urls.debug`).
    pub async fn connect(url: &str) -> Result<Self, CdpError> {
        let connected =
            tokio_tungstenite::connect_async_with_config(url, Some(Self::config()), true).await;
        Self::started(url, connected, EVENTS_QUEUED)
    }

    fn config() -> WebSocketConfig {
        WebSocketConfig::default()
            .max_message_size(Some(MAX_MESSAGE))
            .max_frame_size(Some(MAX_MESSAGE))
    }

    /// The client of a WebSocket handshake's outcome.
    fn started<R>(
        url: &str,
        connected: Result<(WebSocketStream<MaybeTlsStream<TcpStream>>, R), WsError>,
        events_queued: usize,
    ) -> Result<Self, CdpError> {
        let (stream, _) = connected.map_err(|e| CdpError::Connect {
            url: url.to_owned(),
            reason: e.to_string(),
        })?;
        Ok(Self::start(stream, events_queued))
    }

    /// Starts the reader task of a connected WebSocket.
    fn start(stream: WebSocketStream<MaybeTlsStream<TcpStream>>, events_queued: usize) -> Self {
        let (sink, mut source) = stream.split();
        let pending: Pending = Arc::default();
        let (events, _) = broadcast::channel(events_queued);
        let reader_pending = pending.clone();
        let reader_events = events.clone();
        let reader = tokio::spawn(async move {
            while let Some(read) = source.next().await {
                let message = match read {
                    Ok(message) => message,
                    Err(WsError::Capacity(_)) => {
                        let waiting: Vec<_> = reader_pending
                            .lock()
                            .expect("pending lock")
                            .drain()
                            .collect();
                        for (_, (_, waiter)) in waiting {
                            let _ = waiter.send(Err(CdpError::MessageTooLarge));
                        }
                        break;
                    }
                    Err(_) => break,
                };
                let text = match message {
                    Message::Text(text) => text,
                    Message::Close(_) => break,
                    _ => continue,
                };
                let Ok(mut value) = serde_json::from_str::<Value>(&text) else {
                    fail_unreadable_answer(&reader_pending, &text);
                    continue;
                };
                if let Some(id) = value.get("id").and_then(Value::as_u64) {
                    let waiter = reader_pending.lock().expect("pending lock").remove(&id);
                    if let Some((_, waiter)) = waiter {
                        let result = match value.get_mut("error") {
                            Some(error) => Err(CdpError::Protocol {
                                method: String::new(),
                                message: error
                                    .get("message")
                                    .and_then(Value::as_str)
                                    .unwrap_or("unknown error")
                                    .to_owned(),
                            }),
                            None => Ok(value
                                .get_mut("result")
                                .map(Value::take)
                                .unwrap_or(Value::Null)),
                        };
                        let _ = waiter.send(result);
                    }
                } else if let Some(method) = value.get("method").and_then(Value::as_str) {
                    let event = CdpEvent {
                        method: method.to_owned(),
                        params: value
                            .get_mut("params")
                            .map(Value::take)
                            .unwrap_or(Value::Null),
                        session_id: value
                            .get("sessionId")
                            .and_then(Value::as_str)
                            .map(str::to_owned),
                    };
                    fail_calls_of_gone_session(&reader_pending, &event);
                    let _ = reader_events.send(event);
                }
            }
            // Fail everyone still waiting: the connection is gone.
            reader_pending.lock().expect("pending lock").clear();
        });
        Self {
            sink: Mutex::new(sink),
            next_id: AtomicU64::new(1),
            pending,
            events,
            reader: reader.abort_handle(),
        }
    }

    /// `GET <path>` on the DevTools HTTP server of `endpoint` (`/json/list`, …).
    pub async fn http_get(endpoint: &CdpEndpoint, path: &str) -> Result<bytes::Bytes, CdpError> {
        use http_body_util::{BodyExt, Empty, Limited};
        speaks_cdp(endpoint)?;
        let failed = |reason: String| CdpError::Connect {
            url: format!("http://{}{path}", endpoint.authority()),
            reason,
        };
        let attempt = async {
            let stream = endpoint
                .connect()
                .await
                .map_err(|e| failed(e.to_string()))?;
            let (mut sender, connection) =
                hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                    .await
                    .map_err(|e| failed(e.to_string()))?;
            tokio::spawn(connection);
            let request = hyper::Request::get(path)
                .header(hyper::header::HOST, endpoint.authority())
                .body(Empty::<bytes::Bytes>::new())
                .map_err(|e| failed(e.to_string()))?;
            let response = sender
                .send_request(request)
                .await
                .map_err(|e| failed(e.to_string()))?;
            if !response.status().is_success() {
                return Err(failed(format!("answered {}", response.status())));
            }
            Limited::new(response.into_body(), 64 << 20)
                .collect()
                .await
                .map(|body| body.to_bytes())
                .map_err(|e| failed(e.to_string()))
        };
        tokio::time::timeout(Duration::from_secs(10), attempt)
            .await
            .map_err(|_| failed("timed out".into()))?
    }

    /// Events from now on.
    pub fn events(&self) -> broadcast::Receiver<CdpEvent> {
        self.events.subscribe()
    }

    /// Opens a new tab at `url` and attaches to it with a flat session:
    /// `(target id, session id)`.
    pub async fn open_tab(
        &self,
        url: &str,
        timeout: Duration,
    ) -> Result<(String, String), CdpError> {
        let method = "Target.createTarget";
        let target = self
            .call(method, json!({"url": url}), None, timeout)
            .await?;
        let target_id = answer_field(&target, method, "targetId")?;
        let session = self.attach(&target_id, timeout).await?;
        Ok((target_id, session))
    }

    /// Attaches to `target` with a flat session: its id.
    pub async fn attach(&self, target: &str, timeout: Duration) -> Result<String, CdpError> {
        let method = "Target.attachToTarget";
        let params = json!({"targetId": target, "flatten": true});
        let attached = self.call(method, params, None, timeout).await?;
        answer_field(&attached, method, "sessionId")
    }

    /// `Page.navigate` of the page behind `session` to `url`: its answer
    /// (`errorText` is set when the page could not be loaded at all).
    pub async fn navigate(
        &self,
        session: &str,
        url: &str,
        timeout: Duration,
    ) -> Result<Value, CdpError> {
        let params = json!({"url": url});
        self.call("Page.navigate", params, Some(session), timeout)
            .await
    }

    /// Sends a command and waits for its result (at most `timeout`).
    pub async fn call(
        &self,
        method: &str,
        params: Value,
        session_id: Option<&str>,
        timeout: Duration,
    ) -> Result<Value, CdpError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut message = json!({"id": id, "method": method, "params": params});
        if let Some(session_id) = session_id {
            message["sessionId"] = Value::String(session_id.to_owned());
        }
        let (tx, rx) = oneshot::channel();
        self.pending
            .lock()
            .expect("pending lock")
            .insert(id, (session_id.map(str::to_owned), tx));
        let sent = self
            .sink
            .lock()
            .await
            .send(Message::Text(message.to_string().into()))
            .await;
        if sent.is_err() {
            self.pending.lock().expect("pending lock").remove(&id);
            return Err(CdpError::Closed);
        }
        match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(Ok(value))) => Ok(value),
            Ok(Ok(Err(CdpError::Protocol { message, .. }))) => Err(CdpError::Protocol {
                method: method.to_owned(),
                message,
            }),
            Ok(Ok(Err(other))) => Err(other),
            Ok(Err(_)) => Err(CdpError::Closed),
            Err(_) => {
                self.pending.lock().expect("pending lock").remove(&id);
                Err(CdpError::Timeout {
                    method: method.to_owned(),
                    timeout,
                })
            }
        }
    }

    /// Sends a command without waiting for its result (e.g. `Browser.close`,
    /// whose answer may never come because the browser exits).
    pub async fn send(&self, method: &str, params: Value) -> Result<(), CdpError> {
        self.send_in(method, params, None).await
    }

    /// [`CdpClient::send`] on a flat session, or on the browser with `None`.
    pub async fn send_in(
        &self,
        method: &str,
        params: Value,
        session_id: Option<&str>,
    ) -> Result<(), CdpError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut message = json!({"id": id, "method": method, "params": params});
        if let Some(session_id) = session_id {
            message["sessionId"] = Value::String(session_id.to_owned());
        }
        self.sink
            .lock()
            .await
            .send(Message::Text(message.to_string().into()))
            .await
            .map_err(|_| CdpError::Closed)
    }
}

/// Calls on a session whose page crashed or detached would never be answered:
/// fail them now.
fn fail_calls_of_gone_session(pending: &Pending, event: &CdpEvent) {
    let gone = match event.method.as_str() {
        "Target.detachedFromTarget" => event
            .params
            .get("sessionId")
            .and_then(Value::as_str)
            .map(str::to_owned),
        "Inspector.targetCrashed" | "Inspector.detached" => event.session_id.clone(),
        _ => None,
    };
    let Some(gone) = gone else { return };
    let mut pending = pending.lock().expect("pending lock");
    let ids: Vec<u64> = pending
        .iter()
        .filter(|(_, (session, _))| session.as_deref() == Some(gone.as_str()))
        .map(|(id, _)| *id)
        .collect();
    for id in ids {
        if let Some((_, waiter)) = pending.remove(&id) {
            let _ = waiter.send(Err(CdpError::TargetGone(event.method.clone())));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_too_deep_to_read_ends_its_callers_wait() {
        let pending: Pending = Arc::default();
        let (sender, mut receiver) = oneshot::channel();
        pending.lock().unwrap().insert(7, (None, sender));
        let deep = format!(
            r#"{{"result":{{"result":{{"value":{}0{}}}}},"id":7}}"#,
            "[".repeat(500),
            "]".repeat(500)
        );
        assert!(serde_json::from_str::<Value>(&deep).is_err());
        fail_unreadable_answer(&pending, &deep);
        match receiver.try_recv() {
            Ok(Err(CdpError::Protocol { message, .. })) => {
                assert!(message.contains("deeper than 128"), "{message}")
            }
            other => panic!("{other:?}"),
        }
        assert!(pending.lock().unwrap().is_empty());
    }
}
