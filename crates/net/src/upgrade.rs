//! Relaying a WebSocket upgrade to an upstream server, written once for the
//! control plane's front door and the agent's gateway: the head of the
//! client's upgrade request as the upstream gets it ([`request_head`]), the
//! upstream's answer read within a deadline and a size cap ([`handshake`]),
//! and the client's side once switched, with the bytes the upstream sent
//! right after its answer ([`Switched::client`]). What is relayed after the
//! switch (plain bytes at the door, checked CDP frames at the gateway) is
//! each caller's.

use std::io;
use std::time::Duration;

use hyper::StatusCode;
use hyper::upgrade::{OnUpgrade, Upgraded};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The most an upstream's answer head may weigh.
pub const MAX_ANSWER_HEAD: usize = 64 * 1024;

/// The most header lines an upstream's answer head may carry.
const MAX_ANSWER_HEADERS: usize = 64;

/// The head of an upgrade request for `path` on `authority`: the headers
/// `passed` keeps (in their order), then `extra` lines (`"Name: value"`).
/// A header value that is not visible ASCII is left out: no upstream of
/// ours reads one, and it could not be written back as it came.
pub fn request_head(
    path: &str,
    authority: &str,
    headers: &hyper::HeaderMap,
    passed: impl Fn(&hyper::header::HeaderName) -> bool,
    extra: &[String],
) -> String {
    let mut head = format!("GET {path} HTTP/1.1\r\nHost: {authority}\r\n");
    for (name, value) in headers {
        if let (true, Ok(value)) = (passed(name), value.to_str()) {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
    }
    for line in extra {
        head.push_str(line);
        head.push_str("\r\n");
    }
    head.push_str("\r\n");
    head
}

/// The upstream's answer to an upgrade request.
#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    /// Its header lines, as sent.
    pub headers: Vec<(String, Vec<u8>)>,
    /// What came after the head: the first frames once switched, or the
    /// start of the body of a refusal.
    pub early: Vec<u8>,
}

impl Answer {
    /// Whether the upstream switched protocols.
    pub fn switched(&self) -> bool {
        self.status == StatusCode::SWITCHING_PROTOCOLS
    }

    /// A response builder with the answer's status and headers.
    pub fn response(&self) -> hyper::http::response::Builder {
        let mut response = hyper::Response::builder().status(self.status);
        for (name, value) in &self.headers {
            response = response.header(name.as_str(), value.as_slice());
        }
        response
    }
}

/// Sends `head` to `upstream` and reads its answer's head, waiting at most
/// `deadline` for each read.
pub async fn handshake(
    upstream: &mut TcpStream,
    head: &str,
    deadline: Duration,
) -> io::Result<Answer> {
    upstream.write_all(head.as_bytes()).await?;
    let mut buffer = Vec::with_capacity(1024);
    let head_end = loop {
        let mut chunk = [0u8; 2048];
        let n = tokio::time::timeout(deadline, upstream.read(&mut chunk))
            .await
            .map_err(|_| {
                io::Error::new(io::ErrorKind::TimedOut, "the upstream did not answer")
            })??;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the upstream closed the connection",
            ));
        }
        buffer.extend_from_slice(&chunk[..n]);
        if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            break end + 4;
        }
        if buffer.len() > MAX_ANSWER_HEAD {
            return Err(io::Error::other("the upstream's answer head is too large"));
        }
    };
    let mut parsed_headers = [httparse::EMPTY_HEADER; MAX_ANSWER_HEADERS];
    let mut parsed = httparse::Response::new(&mut parsed_headers);
    parsed
        .parse(&buffer[..head_end])
        .map_err(io::Error::other)?;
    let status = StatusCode::from_u16(parsed.code.unwrap_or(502)).map_err(io::Error::other)?;
    let headers = parsed
        .headers
        .iter()
        .map(|header| (header.name.to_owned(), header.value.to_vec()))
        .collect();
    let mut answer = Answer {
        status,
        headers,
        early: buffer[head_end..].to_vec(),
    };
    if !answer.switched() {
        read_refusal_body(upstream, &mut answer, deadline).await?;
    }
    Ok(answer)
}

/// The most of a refusal's body passed on (a refusal is a sentence or an
/// error object).
pub const MAX_REFUSAL_BODY: usize = 64 * 1024;

/// Reads the rest of a refusal's body (as its `Content-Length` says, at
/// most [`MAX_REFUSAL_BODY`]) into `answer.early`, which then holds the
/// whole body it passes on: its framing headers are dropped, so that the
/// response made of it says its own length.
async fn read_refusal_body(
    upstream: &mut TcpStream,
    answer: &mut Answer,
    deadline: Duration,
) -> io::Result<()> {
    let declared = answer
        .headers
        .iter()
        .find(|(name, _)| name.eq_ignore_ascii_case("content-length"))
        .and_then(|(_, value)| {
            std::str::from_utf8(value)
                .ok()?
                .trim()
                .parse::<usize>()
                .ok()
        });
    answer.headers.retain(|(name, _)| {
        !name.eq_ignore_ascii_case("content-length")
            && !name.eq_ignore_ascii_case("transfer-encoding")
    });
    let wanted = declared.unwrap_or(answer.early.len()).min(MAX_REFUSAL_BODY);
    let early = &mut answer.early;
    let reading = async {
        while early.len() < wanted {
            let mut chunk = [0u8; 2048];
            let n = upstream.read(&mut chunk).await?;
            if n == 0 {
                break;
            }
            early.extend_from_slice(&chunk[..n]);
        }
        io::Result::Ok(())
    };
    // One deadline for the whole body: of an upstream that trickles it,
    // what it sent by then is passed on.
    if let Ok(read) = tokio::time::timeout(deadline, reading).await {
        read?;
    }
    answer.early.truncate(wanted);
    Ok(())
}

/// A client's upgrade that the upstream accepted: the client's side comes
/// once the switching answer has reached it.
pub struct Switched {
    upgrade: OnUpgrade,
    early: Vec<u8>,
}

impl Switched {
    /// Takes the client's pending upgrade of `request`, to be completed once
    /// `answer` (switched) has been sent back.
    pub fn of<B>(request: &mut hyper::Request<B>, answer: &mut Answer) -> Self {
        Self {
            upgrade: hyper::upgrade::on(request),
            early: std::mem::take(&mut answer.early),
        }
    }

    /// The client's side of the connection, with the upstream's early bytes
    /// already written to it; `None` when the client went away first.
    pub async fn client(self) -> Option<TokioIo<Upgraded>> {
        let upgraded = match self.upgrade.await {
            Ok(upgraded) => upgraded,
            Err(error) => {
                tracing::debug!(%error, "client upgrade failed");
                return None;
            }
        };
        let mut client = TokioIo::new(upgraded);
        if !self.early.is_empty() && client.write_all(&self.early).await.is_err() {
            return None;
        }
        Some(client)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_head_keeps_only_what_is_passed_and_what_it_can_write() {
        let mut headers = hyper::HeaderMap::new();
        headers.insert("sec-websocket-key", "abc".parse().unwrap());
        headers.insert("cookie", "secret".parse().unwrap());
        let head = request_head(
            "/devtools/browser/x",
            "127.0.0.1:9",
            &headers,
            |name| name.as_str().starts_with("sec-websocket"),
            &["Authorization: Bearer t".to_owned()],
        );
        assert_eq!(
            head,
            "GET /devtools/browser/x HTTP/1.1\r\nHost: 127.0.0.1:9\r\nsec-websocket-key: abc\r\nAuthorization: Bearer t\r\n\r\n"
        );
        headers.insert(
            "sec-websocket-protocol",
            hyper::header::HeaderValue::from_bytes(b"caf\xc3\xa9").unwrap(),
        );
        let head = request_head("/", "h", &headers, |_| true, &[]);
        assert!(!head.contains("caf"), "{head:?}");
    }

    async fn answering(answer: Vec<u8>) -> (TcpStream, tokio::task::JoinHandle<Vec<u8>>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut request = vec![0u8; 1024];
            let n = socket.read(&mut request).await.unwrap();
            socket.write_all(&answer).await.unwrap();
            // Hold the connection until the client is done.
            let _ = socket.read(&mut [0u8; 1]).await;
            request.truncate(n);
            request
        });
        (TcpStream::connect(address).await.unwrap(), server)
    }

    #[tokio::test]
    async fn an_answer_is_split_into_status_headers_and_early_bytes() {
        let (mut upstream, server) = answering(
            b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n\x81\x02hi".to_vec(),
        )
        .await;
        let answer = handshake(
            &mut upstream,
            "GET / HTTP/1.1\r\n\r\n",
            Duration::from_secs(30),
        )
        .await
        .unwrap();
        assert!(answer.switched());
        assert_eq!(
            answer.headers,
            vec![("Upgrade".to_owned(), b"websocket".to_vec())]
        );
        assert_eq!(answer.early, b"\x81\x02hi");
        drop(upstream);
        assert_eq!(server.await.unwrap(), b"GET / HTTP/1.1\r\n\r\n");
    }

    /// A refusal whose body comes in a later write than its head is passed
    /// on whole, and one longer than its bound cut there: the response made
    /// of it never promises more than it holds.
    #[tokio::test]
    async fn a_refusal_is_read_whole_and_bounded() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            for body in [
                b"use the other door\n".to_vec(),
                vec![b'x'; MAX_REFUSAL_BODY * 2],
            ] {
                let (mut socket, _) = listener.accept().await.unwrap();
                let _ = socket.read(&mut [0u8; 1024]).await.unwrap();
                let head = format!(
                    "HTTP/1.1 400 Bad Request\r\ncontent-length: {}\r\ncontent-type: text/plain\r\n\r\n",
                    body.len()
                );
                socket.write_all(head.as_bytes()).await.unwrap();
                socket.flush().await.unwrap();
                tokio::time::sleep(Duration::from_millis(50)).await;
                let _ = socket.write_all(&body).await;
                let _ = socket.read(&mut [0u8; 1]).await;
            }
        });
        for expected in [b"use the other door\n".len(), MAX_REFUSAL_BODY] {
            let mut upstream = TcpStream::connect(address).await.unwrap();
            let answer = handshake(
                &mut upstream,
                "GET / HTTP/1.1\r\n\r\n",
                Duration::from_secs(30),
            )
            .await
            .unwrap();
            assert_eq!(answer.status, StatusCode::BAD_REQUEST);
            assert_eq!(answer.early.len(), expected);
            assert!(
                answer
                    .headers
                    .iter()
                    .all(|(name, _)| !name.eq_ignore_ascii_case("content-length")),
                "{:?}",
                answer.headers
            );
        }
        server.await.unwrap();
    }

    #[tokio::test]
    async fn an_endless_or_garbled_answer_is_refused() {
        let (mut upstream, _server) = answering(vec![b'a'; MAX_ANSWER_HEAD + 4096]).await;
        let error = handshake(&mut upstream, "GET /\r\n\r\n", Duration::from_secs(30))
            .await
            .unwrap_err();
        assert!(error.to_string().contains("too large"), "{error}");

        let (mut upstream, _server) = answering(b"SMTP ready\r\n\r\n".to_vec()).await;
        assert!(
            handshake(&mut upstream, "GET /\r\n\r\n", Duration::from_secs(30))
                .await
                .is_err()
        );
    }
}
