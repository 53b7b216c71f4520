//! Issue 17, item 3: the event proxy's own HTTP/1.1 code against hyper, on
//! what an SSE proxy spends: memory per idle stream and fan-out.
//!
//!   http_stack_bench [--streams 10000] [--messages 50]
//!
//! Two servers, each in its own process: `flotilla proxy` (release build) and
//! a minimal SSE server on hyper 1 (`http1::Builder` with the smallest
//! `max_buf_size` hyper allows, 8 KiB, and no writev; one tokio broadcast
//! channel; `GET /events/t` streams, `POST /publish/t` sends). The same client
//! opens `--streams` streams on one topic of each, samples the server's RSS
//! before and after (memory per idle stream), then publishes `--messages`
//! events one after the other and times until every stream has every event
//! (deliveries per second).
//!
//!   http_stack_bench hyper-server --port P  (run by the benchmark itself)

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use bytes::Bytes;
use http_body_util::{BodyExt as _, Full, StreamBody};
use hyper::body::Frame;
use tokio::io::AsyncReadExt as _;

use flotilla_bench::{
    free_port, number_flag, open_sse_stream, raise_open_files, rss_kib, start_event_proxy,
    text_flag, wait_listening,
};

const KEY: &str = "stack-key";

type Body = http_body_util::combinators::BoxBody<Bytes, std::convert::Infallible>;

async fn hyper_server(port: u16) -> anyhow::Result<()> {
    let (events, _) = tokio::sync::broadcast::channel::<Bytes>(1024);
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    loop {
        let (stream, _) = listener.accept().await?;
        let events = events.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(
                move |request: hyper::Request<hyper::body::Incoming>| {
                    let events = events.clone();
                    async move {
                        if request.method() == hyper::Method::POST {
                            let body = request.into_body().collect().await?.to_bytes();
                            let data: serde_json::Value =
                                serde_json::from_slice(&body).unwrap_or_default();
                            let frame =
                                format!("data: {}\n\n", data["data"].as_str().unwrap_or(""));
                            let _ = events.send(Bytes::from(frame));
                            let answer: Body = Full::new(Bytes::from_static(b"{}")).boxed();
                            return Ok::<_, hyper::Error>(hyper::Response::new(answer));
                        }
                        let receiver = events.subscribe();
                        let frames =
                            futures_util::stream::unfold(receiver, |mut receiver| async move {
                                loop {
                                    match receiver.recv().await {
                                        Ok(frame) => {
                                            return Some((
                                                Ok::<_, std::convert::Infallible>(Frame::data(
                                                    frame,
                                                )),
                                                receiver,
                                            ));
                                        }
                                        Err(tokio::sync::broadcast::error::RecvError::Lagged(
                                            _,
                                        )) => continue,
                                        Err(_) => return None,
                                    }
                                }
                            });
                        let body: Body = StreamBody::new(frames).boxed();
                        let response = hyper::Response::builder()
                            .header("content-type", "text/event-stream")
                            .header("cache-control", "no-cache")
                            .body(body)
                            .expect("a response");
                        Ok(response)
                    }
                },
            );
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder.max_buf_size(8192).writev(false);
            let _ = builder
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                .await;
        });
    }
}

struct Server {
    name: &'static str,
    child: tokio::process::Child,
    port: u16,
    publish_path: String,
    _dir: tempfile::TempDir,
}

impl Server {
    async fn start(name: &'static str) -> anyhow::Result<Self> {
        let (child, port, dir) = if name == "flotilla" {
            start_event_proxy(KEY).await?
        } else {
            let dir = tempfile::tempdir()?;
            let port = free_port();
            let child = tokio::process::Command::new(std::env::current_exe()?)
                .args(["hyper-server", "--port", &port.to_string()])
                .kill_on_drop(true)
                .spawn()?;
            wait_listening(port, name).await?;
            (child, port, dir)
        };
        Ok(Self {
            name,
            child,
            port,
            publish_path: "/publish/t".into(),
            _dir: dir,
        })
    }

    fn rss_kib(&self) -> u64 {
        rss_kib(self.child.id().unwrap_or(0))
    }
}

async fn measure(name: &'static str, streams: usize, messages: usize) -> anyhow::Result<()> {
    let server = Server::start(name).await?;
    let http = reqwest::Client::builder().no_proxy().build()?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let idle = server.rss_kib();
    let received = Arc::new(AtomicU64::new(0));
    let mut readers = Vec::new();
    for _ in 0..streams {
        let mut stream = open_sse_stream(server.port, "t").await?;
        let received = received.clone();
        readers.push(tokio::spawn(async move {
            let mut buffer = [0u8; 4096];
            while let Ok(read) = stream.read(&mut buffer).await {
                if read == 0 {
                    return;
                }
                let events = buffer[..read].windows(6).filter(|w| w == b"data: ").count();
                received.fetch_add(events as u64, Ordering::Relaxed);
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let held = server.rss_kib();
    let started = Instant::now();
    for message in 0..messages {
        http.post(format!(
            "http://127.0.0.1:{}{}",
            server.port, server.publish_path
        ))
        .bearer_auth(KEY)
        .json(&serde_json::json!({"data": format!("message {message}")}))
        .send()
        .await?
        .error_for_status()?;
    }
    let want = (streams * messages) as u64;
    let deadline = Instant::now() + Duration::from_secs(120);
    while received.load(Ordering::Relaxed) < want {
        if Instant::now() > deadline {
            bail!(
                "{name}: {} of {want} deliveries",
                received.load(Ordering::Relaxed)
            );
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let elapsed = started.elapsed();
    let after = server.rss_kib();
    println!(
        "| {} | {streams} | {:.1} | {:.1} | {:.2} | {:.0} | {:.1} |",
        server.name,
        idle as f64 / 1024.0,
        held as f64 / 1024.0,
        held.saturating_sub(idle) as f64 / streams as f64,
        want as f64 / elapsed.as_secs_f64(),
        after as f64 / 1024.0
    );
    flotilla_bench::abort_all(readers);
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    raise_open_files();
    if std::env::args().nth(1).as_deref() == Some("hyper-server") {
        let port: u16 = text_flag("--port", "0")?.parse().context("--port")?;
        return hyper_server(port).await;
    }
    let streams = number_flag("--streams", 10_000)?;
    let messages = number_flag("--messages", 50)?;
    println!(
        "| server | streams | idle RSS MiB | RSS with the streams MiB | KiB per stream | deliveries/s ({messages} messages) | RSS after MiB |"
    );
    println!("|---|---|---|---|---|---|---|");
    for name in ["flotilla", "hyper"] {
        measure(name, streams, messages).await?;
    }
    Ok(())
}
