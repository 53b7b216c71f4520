//! A small HTTP/1.1 server for the proxy's few endpoints.
//!
//! Why not hyper: an idle event stream must cost a few kilobytes, and the spec
//! fixes the exact response headers of a stream (`Connection: keep-alive`
//! among them). Here a connection holds its socket and, while a request head
//! is read, a buffer that is dropped once a stream starts.
//!
//! Requests: heads up to 16 KiB (431 beyond), bodies with `Content-Length` or
//! chunked (up to `publisher.max_body_bytes`, 413 beyond), keep-alive between
//! requests. Every error body is `text/plain`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

use crate::ProxyState;

const MAX_HEAD: usize = 16 * 1024;
const HEAD_TIMEOUT: Duration = Duration::from_secs(10);
const IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// A parsed request head, and its body once read.
#[derive(Debug, Clone)]
pub struct Request {
    pub method: String,
    /// Percent-decoded path.
    pub path: String,
    pub query: Vec<(String, String)>,
    /// Header names lowercased.
    pub headers: Vec<(String, String)>,
    pub keep_alive: bool,
    pub body: Vec<u8>,
}

impl Request {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    pub fn query(&self, name: &str) -> Option<&str> {
        self.query
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// A response, written in one go.
pub struct Response {
    pub status: u16,
    pub headers: Vec<(&'static str, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn text(status: u16, body: &str) -> Self {
        Self {
            status,
            headers: vec![("Content-Type", "text/plain; charset=utf-8".into())],
            body: body.as_bytes().to_vec(),
        }
    }

    pub fn json(status: u16, value: &serde_json::Value) -> Self {
        Self {
            status,
            headers: vec![("Content-Type", "application/json".into())],
            body: value.to_string().into_bytes(),
        }
    }

    pub fn with_header(mut self, name: &'static str, value: impl Into<String>) -> Self {
        self.headers.push((name, value.into()));
        self
    }

    pub fn encode(&self, keep_alive: bool) -> Vec<u8> {
        let mut head = format!("HTTP/1.1 {} {}\r\n", self.status, reason(self.status));
        for (name, value) in &self.headers {
            head.push_str(name);
            head.push_str(": ");
            head.push_str(value);
            head.push_str("\r\n");
        }
        head.push_str(&format!("Content-Length: {}\r\n", self.body.len()));
        head.push_str(if keep_alive {
            "Connection: keep-alive\r\n\r\n"
        } else {
            "Connection: close\r\n\r\n"
        });
        let mut bytes = head.into_bytes();
        bytes.extend_from_slice(&self.body);
        bytes
    }
}

pub fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        204 => "No Content",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        411 => "Length Required",
        413 => "Payload Too Large",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "Unknown",
    }
}

/// Accepts connections until `shutdown`.
pub async fn serve(listener: TcpListener, state: Arc<ProxyState>, shutdown: CancellationToken) {
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(pair) => pair,
                Err(error) => {
                    // Out of descriptors, most likely: back off briefly.
                    tracing::warn!(%error, "accept failed");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
            },
            _ = shutdown.cancelled() => return,
        };
        let _ = stream.set_nodelay(true);
        tokio::spawn(connection(stream, peer, state.clone()));
    }
}

/// Why reading a request failed.
enum ReadError {
    Closed,
    Respond(Response),
}

async fn connection(mut stream: TcpStream, peer: SocketAddr, state: Arc<ProxyState>) {
    let mut buffer = BytesMut::with_capacity(1024);
    let mut first = true;
    loop {
        let timeout = if first { HEAD_TIMEOUT } else { IDLE_TIMEOUT };
        first = false;
        let request = tokio::select! {
            read = tokio::time::timeout(timeout, read_request(&mut stream, &mut buffer, state.config.publisher.max_body_bytes)) => match read {
                Ok(Ok(request)) => request,
                Ok(Err(ReadError::Closed)) | Err(_) => return,
                Ok(Err(ReadError::Respond(response))) => {
                    let _ = stream.write_all(&state.cors(response, None).encode(false)).await;
                    return;
                }
            },
            _ = state.shutdown.cancelled() => return,
        };
        if request.method == "GET" && request.path.starts_with("/events/") {
            drop(buffer);
            crate::sse::subscribe(stream, request, peer.ip(), state).await;
            return;
        }
        let keep_alive = request.keep_alive && !state.shutdown.is_cancelled();
        let origin = request.header("origin").map(str::to_owned);
        let response = crate::route(&state, &request, peer.ip()).await;
        let response = state.cors(response, origin.as_deref());
        if stream
            .write_all(&response.encode(keep_alive))
            .await
            .is_err()
            || !keep_alive
        {
            return;
        }
    }
}

/// Reads one request (head and body) from `stream`.
async fn read_request(
    stream: &mut TcpStream,
    buffer: &mut BytesMut,
    max_body: usize,
) -> Result<Request, ReadError> {
    let (request, head_len, body_framing) = loop {
        if !buffer.is_empty() {
            let mut headers = [httparse::EMPTY_HEADER; 64];
            let mut parsed = httparse::Request::new(&mut headers);
            match parsed.parse(buffer) {
                Ok(httparse::Status::Complete(len)) => {
                    let (request, framing) = head(&parsed)?;
                    break (request, len, framing);
                }
                Ok(httparse::Status::Partial) => {}
                Err(httparse::Error::TooManyHeaders) => {
                    return Err(ReadError::Respond(Response::text(
                        431,
                        "Too many header fields",
                    )));
                }
                Err(error) => {
                    return Err(ReadError::Respond(Response::text(
                        400,
                        &format!("Malformed request: {error}"),
                    )));
                }
            }
        }
        if buffer.len() >= MAX_HEAD {
            return Err(ReadError::Respond(Response::text(
                431,
                "Request head too large",
            )));
        }
        if read_more(stream, buffer).await? == 0 {
            return Err(ReadError::Closed);
        }
    };
    buffer.advance(head_len);
    let mut request = request;
    // A peer batch carries events of up to `max_body` each, escaped.
    let max_body = if request.path.starts_with("/peer/") {
        max_body.saturating_mul(4).saturating_add(1 << 16)
    } else {
        max_body
    };
    match body_framing {
        BodyFraming::None => {}
        BodyFraming::Length(length) => {
            if length > max_body {
                return Err(ReadError::Respond(Response::text(
                    413,
                    "Request body too large",
                )));
            }
            while buffer.len() < length {
                if read_more(stream, buffer).await? == 0 {
                    return Err(ReadError::Closed);
                }
            }
            request.body = buffer.split_to(length).to_vec();
        }
        BodyFraming::Chunked => request.body = read_chunked(stream, buffer, max_body).await?,
    }
    Ok(request)
}

async fn read_more<R: AsyncRead + Unpin>(
    stream: &mut R,
    buffer: &mut BytesMut,
) -> Result<usize, ReadError> {
    buffer.reserve(4096);
    stream.read_buf(buffer).await.map_err(|_| ReadError::Closed)
}

async fn read_chunked(
    stream: &mut TcpStream,
    buffer: &mut BytesMut,
    max_body: usize,
) -> Result<Vec<u8>, ReadError> {
    let bad = || ReadError::Respond(Response::text(400, "Malformed chunked body"));
    let mut body = Vec::new();
    loop {
        let line_end = loop {
            if let Some(pos) = buffer.windows(2).position(|w| w == b"\r\n") {
                break pos;
            }
            if buffer.len() > 1024 {
                return Err(bad());
            }
            if read_more(stream, buffer).await? == 0 {
                return Err(ReadError::Closed);
            }
        };
        let line = std::str::from_utf8(&buffer[..line_end]).map_err(|_| bad())?;
        let size = usize::from_str_radix(line.split(';').next().unwrap_or("").trim(), 16)
            .map_err(|_| bad())?;
        buffer.advance(line_end + 2);
        if body.len() + size > max_body {
            return Err(ReadError::Respond(Response::text(
                413,
                "Request body too large",
            )));
        }
        while buffer.len() < size + 2 {
            if read_more(stream, buffer).await? == 0 {
                return Err(ReadError::Closed);
            }
        }
        if size == 0 {
            // Trailers are not used: expect the final CRLF.
            if &buffer[..2] != b"\r\n" {
                return Err(bad());
            }
            buffer.advance(2);
            return Ok(body);
        }
        body.extend_from_slice(&buffer[..size]);
        if &buffer[size..size + 2] != b"\r\n" {
            return Err(bad());
        }
        buffer.advance(size + 2);
    }
}

enum BodyFraming {
    None,
    Length(usize),
    Chunked,
}

fn head(parsed: &httparse::Request<'_, '_>) -> Result<(Request, BodyFraming), ReadError> {
    let method = parsed.method.unwrap_or_default().to_owned();
    let target = parsed.path.unwrap_or("/");
    let (raw_path, raw_query) = target.split_once('?').unwrap_or((target, ""));
    let path = percent_decode(raw_path)
        .ok_or_else(|| ReadError::Respond(Response::text(400, "Malformed request path")))?;
    let query = raw_query
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            let decode = |s: &str| percent_decode(&s.replace('+', " "));
            Ok((
                decode(name)
                    .ok_or_else(|| ReadError::Respond(Response::text(400, "Malformed query")))?,
                decode(value)
                    .ok_or_else(|| ReadError::Respond(Response::text(400, "Malformed query")))?,
            ))
        })
        .collect::<Result<Vec<_>, ReadError>>()?;
    let mut headers = Vec::with_capacity(parsed.headers.len());
    for header in parsed.headers.iter() {
        let value = std::str::from_utf8(header.value)
            .map_err(|_| ReadError::Respond(Response::text(400, "Header values must be text")))?;
        headers.push((header.name.to_ascii_lowercase(), value.trim().to_owned()));
    }
    let find = |name: &str| {
        headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    };
    let version_11 = parsed.version == Some(1);
    let connection = find("connection").map(str::to_ascii_lowercase);
    let keep_alive = match connection.as_deref() {
        Some(c) if c.contains("close") => false,
        Some(c) if c.contains("keep-alive") => true,
        _ => version_11,
    };
    let framing =
        if find("transfer-encoding").is_some_and(|t| t.to_ascii_lowercase().contains("chunked")) {
            BodyFraming::Chunked
        } else if let Some(length) = find("content-length") {
            let length = length
                .parse::<usize>()
                .map_err(|_| ReadError::Respond(Response::text(400, "Malformed Content-Length")))?;
            if length == 0 {
                BodyFraming::None
            } else {
                BodyFraming::Length(length)
            }
        } else {
            BodyFraming::None
        };
    Ok((
        Request {
            method,
            path,
            query,
            headers,
            keep_alive,
            body: Vec::new(),
        },
        framing,
    ))
}

/// Decodes `%XX` escapes; `None` for a bad escape or invalid UTF-8.
fn percent_decode(input: &str) -> Option<String> {
    let bytes = input.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_paths_and_queries() {
        assert_eq!(
            percent_decode("/events/a%2Eb").as_deref(),
            Some("/events/a.b")
        );
        assert_eq!(percent_decode("%zz"), None);
        assert_eq!(percent_decode("%E2%82%AC").as_deref(), Some("€"));
    }

    #[test]
    fn responses_carry_length_and_connection() {
        let bytes = Response::text(429, "Rate limit exceeded")
            .with_header("Retry-After", "60")
            .encode(false);
        let text = String::from_utf8(bytes).unwrap();
        assert!(text.starts_with("HTTP/1.1 429 Too Many Requests\r\n"));
        assert!(text.contains("Retry-After: 60\r\n"));
        assert!(text.contains("Content-Length: 19\r\n"));
        assert!(text.ends_with("\r\n\r\nRate limit exceeded"));
    }
}
