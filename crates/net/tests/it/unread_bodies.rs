//! Bodies a service answers without reading: the connection stays usable
//! when the body comes soon, and otherwise the answer says it closes (a
//! pooled client would otherwise send its next request into a closed
//! connection).

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::{DEADLINE, limits, server, until_closed};

/// Reads one answer with a `Content-Length` body (the refusals here have
/// none or a short one); answers its head, lower-cased.
async fn answer_head(stream: &mut TcpStream) -> String {
    let mut received = Vec::new();
    let mut byte = [0u8; 1];
    tokio::time::timeout(DEADLINE, async {
        while !received.ends_with(b"\r\n\r\n") {
            assert_eq!(stream.read(&mut byte).await.unwrap(), 1, "an answer");
            received.push(byte[0]);
        }
    })
    .await
    .expect("an answer in time");
    let head = String::from_utf8_lossy(&received).to_ascii_lowercase();
    let length: usize = head
        .lines()
        .find_map(|line| line.strip_prefix("content-length: "))
        .map_or(0, |n| n.trim().parse().unwrap());
    let mut body = vec![0u8; length];
    stream.read_exact(&mut body).await.unwrap();
    head
}

#[tokio::test]
async fn a_body_left_unread_is_read_out_and_the_connection_kept() {
    let server = server(limits(100, 100)).await;
    let mut stream = TcpStream::connect(server.addr).await.unwrap();
    let body = vec![b'x'; 5000];
    stream
        .write_all(b"POST /refuse HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n\r\n")
        .await
        .unwrap();
    // The body comes after the head, as from a client that writes them
    // apart: mostly after the service answered. (Not a wait for anything.)
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    stream.write_all(&body).await.unwrap();
    let head = answer_head(&mut stream).await;
    assert!(head.starts_with("http/1.1 404"), "{head}");
    assert!(!head.contains("connection: close"), "{head}");
    // The same connection serves the next request.
    stream
        .write_all(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let next = until_closed(&mut stream).await;
    assert!(next.starts_with("HTTP/1.1 200"), "{next}");
}

#[tokio::test]
async fn a_body_that_does_not_come_closes_the_connection_saying_so() {
    let server = server(limits(100, 100)).await;
    let mut stream = TcpStream::connect(server.addr).await.unwrap();
    stream
        .write_all(b"POST /refuse HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n\r\n")
        .await
        .unwrap();
    // The client waits for the answer before it sends the body.
    let head = answer_head(&mut stream).await;
    assert!(head.starts_with("http/1.1 404"), "{head}");
    assert!(head.contains("connection: close"), "{head}");
    assert_eq!(until_closed(&mut stream).await, "");
}

#[tokio::test]
async fn a_body_too_long_to_read_out_closes_the_connection_saying_so() {
    let server = server(limits(100, 100)).await;
    let stream = TcpStream::connect(server.addr).await.unwrap();
    let (mut read, mut write) = stream.into_split();
    let length = 4 * flotilla_net::serve::READ_OUT_BYTES;
    let sender = tokio::spawn(async move {
        let head = format!("POST /refuse HTTP/1.1\r\nHost: x\r\nContent-Length: {length}\r\n\r\n");
        write.write_all(head.as_bytes()).await?;
        write.write_all(&vec![b'x'; length]).await
    });
    let mut answer = Vec::new();
    tokio::time::timeout(DEADLINE, read.read_to_end(&mut answer))
        .await
        .expect("the server closes the connection")
        .ok();
    let answer = String::from_utf8_lossy(&answer).to_ascii_lowercase();
    assert!(answer.starts_with("http/1.1 404"), "{answer}");
    assert!(answer.contains("connection: close"), "{answer}");
    sender.abort();
}

#[tokio::test]
async fn a_request_awaiting_continue_is_refused_without_it_and_closed() {
    let server = server(limits(100, 100)).await;
    let mut stream = TcpStream::connect(server.addr).await.unwrap();
    stream
        .write_all(
            b"POST /refuse HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\nExpect: 100-continue\r\n\r\n",
        )
        .await
        .unwrap();
    let answer = until_closed(&mut stream).await.to_ascii_lowercase();
    assert!(answer.starts_with("http/1.1 404"), "{answer}");
    assert!(answer.contains("connection: close"), "{answer}");
    assert!(!answer.contains("100 continue"), "{answer}");
}
