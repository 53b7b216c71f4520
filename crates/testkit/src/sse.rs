//! The event proxy for tests: [`spawn_proxy`], subscriber tokens ([`jwt`])
//! and a real SSE client ([`SseClient`]).

use std::time::Duration;

use crate::init_logging;
use anyhow::{Context as _, bail};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};

/// One item of an event stream as received.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SseEvent {
    pub id: Option<String>,
    pub event: Option<String>,
    pub data: Option<String>,
    pub retry: Option<String>,
    /// A comment line (`: keepalive`), when the item is one.
    pub comment: Option<String>,
}

/// A raw SSE client: exact status, headers and lines, no reconnection.
pub struct SseClient {
    pub status: u16,
    /// Header names lowercased.
    pub headers: Vec<(String, String)>,
    /// The body of a refused request.
    pub body: String,
    reader: BufReader<tokio::net::tcp::OwnedReadHalf>,
    _writer: tokio::net::tcp::OwnedWriteHalf,
}

impl SseClient {
    /// `GET <path>` on `addr` with `Authorization: Bearer <token>`.
    pub async fn with_bearer(addr: &str, path: &str, token: &str) -> anyhow::Result<Self> {
        let bearer = format!("Bearer {token}");
        Self::connect(addr, path, &[("Authorization", &bearer)]).await
    }

    /// `GET <path>` on `addr` with `headers`.
    pub async fn connect(addr: &str, path: &str, headers: &[(&str, &str)]) -> anyhow::Result<Self> {
        use tokio::io::AsyncWriteExt;
        let host = addr.trim_start_matches("http://");
        let stream = tokio::net::TcpStream::connect(host).await?;
        let (read, mut write) = stream.into_split();
        let mut request =
            format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nAccept: text/event-stream\r\n");
        for (name, value) in headers {
            request.push_str(&format!("{name}: {value}\r\n"));
        }
        request.push_str("\r\n");
        write.write_all(request.as_bytes()).await?;
        let mut reader = BufReader::new(read);
        let mut line = String::new();
        tokio::time::timeout(Duration::from_secs(30), reader.read_line(&mut line)).await??;
        let status: u16 = line
            .split_whitespace()
            .nth(1)
            .context("status line")?
            .parse()?;
        let mut headers = Vec::new();
        loop {
            line.clear();
            reader.read_line(&mut line).await?;
            let trimmed = line.trim_end();
            if trimmed.is_empty() {
                break;
            }
            let (name, value) = trimmed.split_once(':').context("header line")?;
            headers.push((name.trim().to_ascii_lowercase(), value.trim().to_owned()));
        }
        let mut client = Self {
            status,
            headers,
            body: String::new(),
            reader,
            _writer: write,
        };
        if status != 200 {
            let length: usize = client
                .header("content-length")
                .and_then(|l| l.parse().ok())
                .unwrap_or(0);
            let mut body = vec![0u8; length];
            tokio::io::AsyncReadExt::read_exact(&mut client.reader, &mut body).await?;
            client.body = String::from_utf8_lossy(&body).into_owned();
        }
        Ok(client)
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The next event or comment; `None` when the stream ended.
    pub async fn next(&mut self, deadline: Duration) -> anyhow::Result<Option<SseEvent>> {
        let mut event = SseEvent::default();
        let mut line = String::new();
        loop {
            line.clear();
            let n = tokio::time::timeout(deadline, self.reader.read_line(&mut line))
                .await
                .context("no event before the deadline")??;
            if n == 0 {
                return Ok(None);
            }
            let text = line.trim_end_matches('\n');
            if text.is_empty() {
                if event != SseEvent::default() {
                    return Ok(Some(event));
                }
                continue;
            }
            if let Some(comment) = text.strip_prefix(':') {
                event.comment = Some(comment.trim().to_owned());
                continue;
            }
            let (field, value) = text.split_once(": ").unwrap_or((text, ""));
            match field {
                "id" => event.id = Some(value.to_owned()),
                "event" => event.event = Some(value.to_owned()),
                "retry" => event.retry = Some(value.to_owned()),
                "data" => {
                    event.data = Some(match event.data.take() {
                        Some(previous) => format!("{previous}\n{value}"),
                        None => value.to_owned(),
                    })
                }
                _ => {}
            }
        }
    }

    /// The next item that is an event (skipping comments), within `deadline`
    /// overall (keepalive comments do not extend it).
    pub async fn next_event(&mut self, deadline: Duration) -> anyhow::Result<SseEvent> {
        let until = tokio::time::Instant::now() + deadline;
        loop {
            let left = until.saturating_duration_since(tokio::time::Instant::now());
            match self.next(left).await? {
                Some(item)
                    if item.comment.is_none() || item.data.is_some() || item.event.is_some() =>
                {
                    return Ok(item);
                }
                Some(_) => continue,
                None => bail!("the stream ended"),
            }
        }
    }
}

/// Unix seconds now.
pub fn chrono_like_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// An unsigned JWT with `claims` (the fake webhook decides validity).
pub fn jwt(claims: Value) -> String {
    use base64::Engine;
    let engine = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    format!(
        "{}.{}.sig",
        engine.encode(br#"{"alg":"HS256","typ":"JWT"}"#),
        engine.encode(claims.to_string())
    )
}

/// The event proxy in this process on 127.0.0.1:0, authentication off unless
/// `adjust` turns it on.
pub async fn spawn_proxy(
    adjust: impl FnOnce(&mut flotilla_event_proxy::config::ProxyConfig),
) -> flotilla_event_proxy::Proxy {
    spawn_proxy_with_clock(
        std::sync::Arc::new(flotilla_api_types::clock::SystemClock),
        adjust,
    )
    .await
}

/// A proxy whose time is `clock` (token cache, breaker, revocations): a
/// test moves a `ManualClock` on instead of sleeping.
pub async fn spawn_proxy_with_clock(
    clock: std::sync::Arc<dyn flotilla_api_types::clock::Clock>,
    adjust: impl FnOnce(&mut flotilla_event_proxy::config::ProxyConfig),
) -> flotilla_event_proxy::Proxy {
    init_logging();
    let mut config = flotilla_event_proxy::config::ProxyConfig::default();
    config.http.bind_address = "127.0.0.1:0".into();
    config.jwt_verifier.require_authentication = false;
    config.publisher.api_keys = vec!["test-publisher".into()];
    adjust(&mut config);
    flotilla_event_proxy::Proxy::start_with_clock(config, clock)
        .await
        .expect("proxy starts")
}
