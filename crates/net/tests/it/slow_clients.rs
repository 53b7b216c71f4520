//! Slow and greedy clients against a served router: heads that never end,
//! bodies that stall, clients that read nothing, and more connections than
//! the budget allows, while a client that sends its request at once is served.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::{DEADLINE, limits, server, until_closed};

async fn health(addr: SocketAddr) -> String {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    until_closed(&mut stream).await
}

#[tokio::test]
async fn a_head_that_never_ends_is_closed_after_the_header_timeout() {
    let server = server(limits(100, 100)).await;
    let mut slow = TcpStream::connect(server.addr).await.unwrap();
    slow.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    let started = Instant::now();
    until_closed(&mut slow).await;
    assert!(started.elapsed() < Duration::from_secs(10));
    // A kept-alive connection idling between requests goes the same way.
    let mut idle = TcpStream::connect(server.addr).await.unwrap();
    idle.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let answer = until_closed(&mut idle).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    tokio::time::timeout(DEADLINE, async {
        while server.listeners.budget().open() > 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("every slot given back");
}

#[tokio::test]
async fn a_body_that_stalls_loses_its_connection() {
    let server = server(limits(100, 100)).await;
    let mut stream = TcpStream::connect(server.addr).await.unwrap();
    stream
        .write_all(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nonly ten b")
        .await
        .unwrap();
    let answer = until_closed(&mut stream).await;
    assert!(!answer.contains("only ten b"), "never echoed: {answer}");
}

#[tokio::test]
async fn a_client_that_reads_nothing_is_cut_off() {
    let server = server(limits(100, 100)).await;
    let mut stream = TcpStream::connect(server.addr).await.unwrap();
    stream
        .write_all(b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    // Read nothing: the 64 MiB answer fills the socket buffers and stalls.
    tokio::time::timeout(DEADLINE, async {
        while server.listeners.budget().open() > 0 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the stalled connection is closed");
    drop(stream);
}

#[tokio::test]
async fn half_open_connections_cannot_keep_a_client_that_asks_at_once_out() {
    // The reproduction of a slow-client attack, scaled to the budget: many
    // more half-sent requests from one address than it may hold.
    let server = server(limits(64, 128)).await;
    let mut attackers = Vec::new();
    for _ in 0..1000 {
        if let Ok(mut stream) = TcpStream::connect(server.addr).await {
            let _ = stream.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n").await;
            attackers.push(stream);
        }
    }
    assert!(server.listeners.budget().open() <= 64);
    for _ in 0..20 {
        let answer = health(server.addr).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    }
    drop(attackers);
}

#[tokio::test]
async fn a_full_budget_of_busy_connections_refuses_with_a_clear_error() {
    let server = server(limits(2, 100)).await;
    // Two requests in flight whose bodies never finish within the test.
    let mut busy = Vec::new();
    for _ in 0..2 {
        let mut stream = TcpStream::connect(server.addr).await.unwrap();
        stream
            .write_all(b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut first = [0u8; 12];
        stream.read_exact(&mut first).await.unwrap();
        busy.push(stream);
    }
    let answer = health(server.addr).await;
    assert!(answer.starts_with("HTTP/1.1 429"), "{answer}");
    assert!(answer.contains("\"code\":\"rate_limited\""), "{answer}");
    assert!(
        answer.contains("listeners.max_connections_per_client"),
        "{answer}"
    );
}
