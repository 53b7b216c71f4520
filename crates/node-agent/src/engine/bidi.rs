//! The agent's own WebDriver BiDi client of a Firefox instance: one session
//! at a time, commands one after another (what a park's capture, a
//! revive's restore and a graceful stop need). Firefox holds one BiDi
//! session at a time: while a client's session is open, [`BidiSession::open`]
//! fails with [`BidiError::SessionHeld`].

use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;

use crate::engine::browser::CdpEndpoint;

/// How long one command may take.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(30);

/// How long the connection and its handshake may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The largest message read (a tree of many tabs, many cookies).
const MAX_MESSAGE: usize = 64 << 20;

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

/// An open BiDi session on a browser.
pub struct BidiSession {
    socket: WebSocketStream<TcpStream>,
    next_id: u64,
}

impl BidiSession {
    /// Connects to the browser behind `endpoint` and starts a session.
    pub async fn open(endpoint: &CdpEndpoint) -> Result<Self, BidiError> {
        let connected = tokio::time::timeout(CONNECT_TIMEOUT, async {
            let stream = endpoint.connect().await.map_err(|e| e.to_string())?;
            let url = format!("ws://{}{}", endpoint.authority(), endpoint.browser_path);
            let config = WebSocketConfig::default()
                .max_message_size(Some(MAX_MESSAGE))
                .max_frame_size(Some(MAX_MESSAGE));
            tokio_tungstenite::client_async_with_config(url, stream, Some(config))
                .await
                .map_err(|e| e.to_string())
        })
        .await
        .map_err(|_| BidiError::Connect("no answer".into()))?;
        let (socket, _) = connected.map_err(BidiError::Connect)?;
        let mut session = Self { socket, next_id: 0 };
        match session
            .call("session.new", json!({"capabilities": {}}))
            .await
        {
            Err(BidiError::Command { error, .. }) if error == "session not created" => {
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
        self.next_id += 1;
        let id = self.next_id;
        let command = json!({"id": id, "method": method, "params": params}).to_string();
        self.socket
            .send(Message::text(command))
            .await
            .map_err(|_| BidiError::Closed)?;
        let answer = tokio::time::timeout(COMMAND_TIMEOUT, self.answer_to(id))
            .await
            .map_err(|_| BidiError::Timeout(method.to_owned()))??;
        if answer["type"] == "success" {
            return Ok(answer["result"].clone());
        }
        Err(BidiError::Command {
            method: method.to_owned(),
            error: answer["error"].as_str().unwrap_or("error").to_owned(),
            message: answer["message"].as_str().unwrap_or_default().to_owned(),
        })
    }

    async fn answer_to(&mut self, id: u64) -> Result<Value, BidiError> {
        while let Some(message) = self.socket.next().await {
            let Ok(Message::Text(text)) = message else {
                continue;
            };
            let Ok(answer) = serde_json::from_str::<Value>(&text) else {
                continue;
            };
            if answer["id"] == id {
                return Ok(answer);
            }
        }
        Err(BidiError::Closed)
    }

    /// Ends the session (the browser goes on), waiting a few seconds at
    /// most for the browser.
    pub async fn end(mut self) {
        let ending = async {
            let _ = self.call("session.end", json!({})).await;
            let _ = self.socket.close(None).await;
        };
        let _ = tokio::time::timeout(CONNECT_TIMEOUT, ending).await;
    }

    /// Closes the browser: it writes its profile and quits.
    pub async fn close_browser(mut self) -> Result<(), BidiError> {
        self.call("browser.close", json!({})).await.map(|_| ())
    }
}
