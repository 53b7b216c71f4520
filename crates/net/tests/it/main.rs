//! Integration tests of the listeners: real sockets on 127.0.0.1:0.

mod slow_clients;
mod unread_bodies;

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::http::StatusCode;
use axum::routing::{get, post};
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

use flotilla_net::{ListenerLimits, Listeners};

/// Generous: the machine may be loaded; the bounds tested are much shorter.
pub const DEADLINE: Duration = Duration::from_secs(20);

pub struct Server {
    pub addr: SocketAddr,
    pub listeners: Listeners,
    stop: CancellationToken,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

pub async fn server(limits: ListenerLimits) -> Server {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let big = vec![b'x'; 64 << 20];
    let router = Router::new()
        .route("/health", get(|| async { "ok" }))
        .route("/echo", post(|body: String| async move { body }))
        // Refuses without reading the body, as an auth check does.
        .route("/refuse", post(|| async { StatusCode::NOT_FOUND }))
        .route("/big", get(move || async move { big.clone() }));
    let listeners = Listeners::new(&limits, flotilla_net::Runs::NoBrowsers);
    let stop = CancellationToken::new();
    tokio::spawn({
        let listeners = listeners.clone();
        let stop = stop.clone();
        async move { listeners.serve_router(listener, router, stop).await }
    });
    Server {
        addr,
        listeners,
        stop,
    }
}

pub fn limits(per_client: usize, total: usize) -> ListenerLimits {
    ListenerLimits {
        header_read_timeout_sec: 1.0,
        idle_timeout_sec: 1.0,
        max_connections_per_client: per_client,
        max_connections: total,
    }
}

/// Reads until the server closes; answers what it sent.
pub async fn until_closed(stream: &mut TcpStream) -> String {
    let mut received = Vec::new();
    tokio::time::timeout(DEADLINE, stream.read_to_end(&mut received))
        .await
        .expect("the server closes the connection")
        .ok();
    String::from_utf8_lossy(&received).into_owned()
}
