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
//!
//! Framing is never ambiguous: a request that two servers could read two ways
//! is refused with 400 and the connection closed — `Transfer-Encoding` with
//! `Content-Length`, more than one `Content-Length` (equal or not), a length that
//! is not plain digits, a `Transfer-Encoding` other than exactly `chunked`, a
//! chunk size that is not plain hex, line folding, a bare CR or LF or a NUL in
//! the head. A head must arrive within 10 s of its first byte (and of the
//! connection, for the first request): slower is answered 408 and closed.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

use flotilla_net::Slot;

use crate::ProxyState;
use crate::refusal::Refusal;

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
    // The process's budget (shared with `serve`'s other listeners).
    state
        .listeners
        .accept_each(&listener, &shutdown, |stream, peer, slot| {
            state
                .connections
                .spawn(connection(stream, peer, slot, state.clone()));
        })
        .await;
}

/// Why reading a request failed.
enum ReadError {
    Closed,
    Respond(Response),
}

/// One connection until it closes; evicted (while it waits for a request)
/// when the process's budget needs its descriptor.
async fn connection(stream: TcpStream, peer: SocketAddr, slot: Slot, state: Arc<ProxyState>) {
    tokio::select! {
        _ = requests(stream, peer, &slot, state) => {}
        _ = slot.evicted().cancelled() => {}
    }
}

async fn requests(mut stream: TcpStream, peer: SocketAddr, slot: &Slot, state: Arc<ProxyState>) {
    let mut buffer = BytesMut::with_capacity(1024);
    let mut first = true;
    loop {
        // Between requests a kept-alive connection may idle; once a request
        // begins, its head (and body) must come within the head deadline.
        if !first && buffer.is_empty() {
            let started = tokio::select! {
                read = tokio::time::timeout(IDLE_TIMEOUT, read_more(&mut stream, &mut buffer)) => matches!(read, Ok(Ok(n)) if n > 0),
                _ = state.shutdown.cancelled() => false,
            };
            if !started {
                return;
            }
        }
        first = false;
        let request = tokio::select! {
            read = tokio::time::timeout(head_deadline(&state), read_request(&mut stream, &mut buffer, state.config.publisher.max_body_bytes)) => match read {
                Ok(Ok(request)) => request,
                Ok(Err(ReadError::Closed)) => return,
                Ok(Err(ReadError::Respond(response))) => {
                    let _ = stream.write_all(&state.cors(response, None).encode(false)).await;
                    return;
                }
                Err(_) => {
                    let response = Response::from(Refusal::RequestTimeout);
                    let _ = stream.write_all(&state.cors(response, None).encode(false)).await;
                    return;
                }
            },
            _ = state.shutdown.cancelled() => return,
        };
        if request.method == "GET" && request.path.starts_with("/events/") {
            // A stream holds its connection like an upgraded one.
            slot.upgraded();
            drop(buffer);
            crate::sse::subscribe(stream, request, peer.ip(), state).await;
            return;
        }
        let keep_alive = request.keep_alive && !state.shutdown.is_cancelled();
        let origin = request.header("origin").map(str::to_owned);
        slot.request_started();
        let response = crate::route(&state, &request, peer.ip()).await;
        let response = state.cors(response, origin.as_deref());
        let written = stream.write_all(&response.encode(keep_alive)).await;
        slot.request_done();
        if written.is_err() || !keep_alive {
            return;
        }
    }
}

/// How long a request may take to arrive once it began: 10 s, or less when
/// `http.connection_timeout_sec` is shorter.
fn head_deadline(state: &ProxyState) -> Duration {
    match state.config.http.connection_timeout_sec {
        0 => HEAD_TIMEOUT,
        limit => HEAD_TIMEOUT.min(Duration::from_secs(limit)),
    }
}

/// Reads one request (head and body) from `stream`.
async fn read_request<R: AsyncRead + Unpin>(
    stream: &mut R,
    buffer: &mut BytesMut,
    max_body: usize,
) -> Result<Request, ReadError> {
    let (request, head_len, body_framing) = loop {
        if !buffer.is_empty() {
            let mut headers = [httparse::EMPTY_HEADER; 64];
            let mut parsed = httparse::Request::new(&mut headers);
            match parsed.parse(buffer) {
                Ok(httparse::Status::Complete(len)) => {
                    check_head_bytes(&buffer[..len])?;
                    let (request, framing) = head(&parsed)?;
                    break (request, len, framing);
                }
                Ok(httparse::Status::Partial) => {}
                Err(httparse::Error::TooManyHeaders) => {
                    return Err(ReadError::Respond(Refusal::TooManyHeaders.into()));
                }
                Err(error) => {
                    return Err(ReadError::Respond(
                        Refusal::BadRequest(format!("Malformed request: {error}")).into(),
                    ));
                }
            }
        }
        if buffer.len() >= MAX_HEAD {
            return Err(ReadError::Respond(Refusal::HeadTooLarge.into()));
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
                return Err(ReadError::Respond(Refusal::BodyTooLarge.into()));
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

/// Refuses a head with a bare CR or LF, a NUL or a folded line, which
/// lenient parsers read differently.
fn check_head_bytes(head: &[u8]) -> Result<(), ReadError> {
    let refuse = |why: &str| Err(ReadError::Respond(Refusal::BadRequest(why.into()).into()));
    for (i, byte) in head.iter().enumerate() {
        match byte {
            0 => return refuse("NUL in the request head"),
            b'\n' if i == 0 || head[i - 1] != b'\r' => {
                return refuse("Lines of the request head must end with CRLF");
            }
            b'\r' if head.get(i + 1) != Some(&b'\n') => {
                return refuse("A bare CR in the request head");
            }
            b'\n' if matches!(head.get(i + 1), Some(b' ' | b'\t')) => {
                return refuse("Folded header lines are not accepted");
            }
            _ => {}
        }
    }
    Ok(())
}

async fn read_chunked<R: AsyncRead + Unpin>(
    stream: &mut R,
    buffer: &mut BytesMut,
    max_body: usize,
) -> Result<Vec<u8>, ReadError> {
    let bad = || ReadError::Respond(Refusal::BadRequest("Malformed chunked body".into()).into());
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
        // The size is plain hex digits (an extension may follow after `;`).
        let digits = line.split(';').next().unwrap_or("");
        if digits.is_empty() || digits.len() > 15 || !digits.bytes().all(|b| b.is_ascii_hexdigit())
        {
            return Err(bad());
        }
        let size = usize::from_str_radix(digits, 16).map_err(|_| bad())?;
        buffer.advance(line_end + 2);
        if body.len().saturating_add(size) > max_body {
            return Err(ReadError::Respond(Refusal::BodyTooLarge.into()));
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
    let path = percent_decode(raw_path).ok_or_else(|| {
        ReadError::Respond(Refusal::BadRequest("Malformed request path".into()).into())
    })?;
    let query = raw_query
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            let decode = |s: &str| percent_decode(&s.replace('+', " "));
            Ok((
                decode(name).ok_or_else(|| {
                    ReadError::Respond(Refusal::BadRequest("Malformed query".into()).into())
                })?,
                decode(value).ok_or_else(|| {
                    ReadError::Respond(Refusal::BadRequest("Malformed query".into()).into())
                })?,
            ))
        })
        .collect::<Result<Vec<_>, ReadError>>()?;
    let mut headers = Vec::with_capacity(parsed.headers.len());
    for header in parsed.headers.iter() {
        let value = std::str::from_utf8(header.value).map_err(|_| {
            ReadError::Respond(Refusal::BadRequest("Header values must be text".into()).into())
        })?;
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
    let framing = body_framing(&headers)?;
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

/// How the body is delimited, refusing every ambiguous combination.
fn body_framing(headers: &[(String, String)]) -> Result<BodyFraming, ReadError> {
    let refuse = |why: &str| Err(ReadError::Respond(Refusal::BadRequest(why.into()).into()));
    let all = |name: &str| -> Vec<&str> {
        headers
            .iter()
            .filter(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
            .collect()
    };
    let lengths = all("content-length");
    let encodings = all("transfer-encoding");
    match (encodings.as_slice(), lengths.as_slice()) {
        ([], []) => Ok(BodyFraming::None),
        ([_, ..], [_, ..]) => refuse("Transfer-Encoding together with Content-Length"),
        ([encoding], []) if encoding.eq_ignore_ascii_case("chunked") => Ok(BodyFraming::Chunked),
        (_, []) => refuse("The only accepted Transfer-Encoding is chunked"),
        ([], [length]) => {
            if length.is_empty() || length.len() > 18 || !length.bytes().all(|b| b.is_ascii_digit())
            {
                return refuse("Malformed Content-Length");
            }
            match length.parse::<usize>() {
                Ok(0) => Ok(BodyFraming::None),
                Ok(length) => Ok(BodyFraming::Length(length)),
                Err(_) => refuse("Malformed Content-Length"),
            }
        }
        ([], _) => refuse("More than one Content-Length"),
    }
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
    use std::collections::VecDeque;
    use std::pin::Pin;
    use std::task::{Context, Poll};

    /// Bytes that arrive in the given pieces, then the end of the stream;
    /// counts what it delivered.
    struct Pieces(VecDeque<Vec<u8>>, usize);

    impl AsyncRead for Pieces {
        fn poll_read(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &mut tokio::io::ReadBuf<'_>,
        ) -> Poll<std::io::Result<()>> {
            if let Some(mut piece) = self.0.pop_front() {
                let n = piece.len().min(buf.remaining());
                buf.put_slice(&piece[..n]);
                self.1 += n;
                if n < piece.len() {
                    self.0.push_front(piece.split_off(n));
                }
            }
            Poll::Ready(Ok(()))
        }
    }

    /// What reading `bytes` (cut at `cuts`) yields: the request as
    /// (method, path, body, bytes it took), or the refusal's status, or the
    /// end of the stream before a whole request.
    #[derive(Debug, PartialEq)]
    enum Reading {
        Request(String, String, Vec<u8>, usize),
        Refused(u16),
        Ended,
    }

    fn read(bytes: &[u8], cuts: &[usize]) -> Reading {
        let mut pieces = VecDeque::new();
        let mut start = 0;
        let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (bytes.len() + 1)).collect();
        cuts.sort_unstable();
        // No empty piece: a read of 0 bytes is the end of the stream.
        for cut in cuts {
            if cut > start {
                pieces.push_back(bytes[start..cut].to_vec());
                start = cut;
            }
        }
        if start < bytes.len() {
            pieces.push_back(bytes[start..].to_vec());
        }
        let mut stream = Pieces(pieces, 0);
        let mut buffer = BytesMut::new();
        let outcome = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(read_request(&mut stream, &mut buffer, 1 << 16));
        match outcome {
            Ok(request) => Reading::Request(
                request.method,
                request.path,
                request.body,
                stream.1 - buffer.len(),
            ),
            Err(ReadError::Respond(response)) => Reading::Refused(response.status),
            Err(ReadError::Closed) => Reading::Ended,
        }
    }

    #[test]
    fn ambiguous_framing_is_refused() {
        let refused = [
            // The classic smuggling shape, both orders.
            "POST /publish/a HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            "POST /publish/a HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n0\r\n\r\n",
            // Two lengths, equal or not, or a list.
            "POST /publish/a HTTP/1.1\r\nContent-Length: 4\r\nContent-Length: 4\r\n\r\nabcd",
            "POST /publish/a HTTP/1.1\r\nContent-Length: 4\r\nContent-Length: 5\r\n\r\nabcde",
            "POST /publish/a HTTP/1.1\r\nContent-Length: 4, 4\r\n\r\nabcd",
            "POST /publish/a HTTP/1.1\r\nContent-Length: +4\r\n\r\nabcd",
            "POST /publish/a HTTP/1.1\r\nContent-Length: 0x4\r\n\r\nabcd",
            // Codings other than a lone chunked.
            "POST /publish/a HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n",
            "POST /publish/a HTTP/1.1\r\nTransfer-Encoding: chunked, identity\r\n\r\n0\r\n\r\n",
            "POST /publish/a HTTP/1.1\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            "POST /publish/a HTTP/1.1\r\nTransfer-Encoding: xchunked\r\n\r\n0\r\n\r\n",
            // Folding, bare LF, bare CR, NUL.
            "GET /health HTTP/1.1\r\nX-A: 1\r\n 2\r\n\r\n",
            "GET /health HTTP/1.1\nHost: x\n\n",
            "GET /health HTTP/1.1\r\nHost: x\rX: y\r\n\r\n",
            "GET /health HTTP/1.1\r\nHost: x\0\r\n\r\n",
            // Bad chunk sizes.
            "POST /publish/a HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n+4\r\nabcd\r\n0\r\n\r\n",
            "POST /publish/a HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n 4\r\nabcd\r\n0\r\n\r\n",
            "POST /publish/a HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nfffffffffffffffff\r\n",
            "POST /publish/a HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nabcdX\r\n0\r\n\r\n",
        ];
        for request in refused {
            match read(request.as_bytes(), &[]) {
                Reading::Refused(status) => {
                    assert!(status == 400 || status == 413, "{request:?}: {status}")
                }
                other => panic!("{request:?} was read as {other:?}"),
            }
        }
        // And what is fine stays fine.
        let chunked = b"POST /publish/a HTTP/1.1\r\nTransfer-Encoding: Chunked\r\n\r\n4;x=y\r\nabcd\r\n0\r\n\r\nGET";
        assert_eq!(
            read(chunked, &[]),
            Reading::Request(
                "POST".into(),
                "/publish/a".into(),
                b"abcd".to_vec(),
                chunked.len() - 3
            )
        );
        let sized = b"POST /publish/a HTTP/1.1\r\nContent-Length: 4\r\n\r\nabcdNEXT";
        assert_eq!(
            read(sized, &[]),
            Reading::Request(
                "POST".into(),
                "/publish/a".into(),
                b"abcd".to_vec(),
                sized.len() - 4
            )
        );
        assert!(matches!(
            read(
                format!("GET / HTTP/1.1\r\nX: {}\r\n\r\n", "a".repeat(MAX_HEAD)).as_bytes(),
                &[]
            ),
            Reading::Refused(431)
        ));
    }

    fn header_line() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        prop_oneof![
            Just("Content-Length: 3".to_owned()),
            Just("Content-Length: 03".to_owned()),
            Just("content-length:3".to_owned()),
            Just("Content-Length: 3, 3".to_owned()),
            Just("Transfer-Encoding: chunked".to_owned()),
            Just("transfer-encoding: CHUNKED".to_owned()),
            Just("Transfer-Encoding: gzip".to_owned()),
            Just("Transfer-Encoding:chunked ".to_owned()),
            "[A-Za-z-]{1,12}: [ -~]{0,12}",
        ]
    }

    proptest::proptest! {
        /// Arbitrary bytes, cut anywhere: no panic, and the same reading
        /// whatever the cuts (a request has one reading).
        #[test]
        fn any_bytes_read_the_same_whatever_the_cuts(
            bytes in proptest::collection::vec(proptest::arbitrary::any::<u8>(), 0..600),
            cuts in proptest::collection::vec(0usize..700, 0..6),
        ) {
            proptest::prop_assert_eq!(read(&bytes, &cuts), read(&bytes, &[]));
        }

        /// Near-valid requests with any mix of framing headers: accepted only
        /// when exactly one framing applies, and then read the same way
        /// whatever the cuts.
        #[test]
        fn framing_is_accepted_only_when_unambiguous(
            lines in proptest::collection::vec(header_line(), 0..5),
            body in "[a-z0-9\\r\\n]{0,20}",
            cuts in proptest::collection::vec(0usize..200, 0..4),
        ) {
            let request = format!("POST /publish/t HTTP/1.1\r\nHost: x\r\n{}\r\n{body}",
                lines.iter().map(|l| format!("{l}\r\n")).collect::<String>());
            let reading = read(request.as_bytes(), &cuts);
            proptest::prop_assert_eq!(&reading, &read(request.as_bytes(), &[]));
            if let Reading::Request(..) = reading {
                let lengths = lines.iter().filter(|l| l.to_ascii_lowercase().starts_with("content-length")).count();
                let encodings = lines.iter().filter(|l| l.to_ascii_lowercase().starts_with("transfer-encoding")).count();
                proptest::prop_assert!(lengths + encodings <= 1, "accepted with {lines:?}");
            }
        }
    }

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
