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
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

use flotilla_bench::{free_port, number_flag, text_flag};

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
        let dir = tempfile::tempdir()?;
        let port = free_port();
        let child = if name == "flotilla" {
            let config = dir.path().join("proxy.toml");
            std::fs::write(
                &config,
                format!(
                    "[http]\nbind_address = \"127.0.0.1:{port}\"\nmax_connections = 19900\n\
                     keepalive_interval_sec = 15\nconnection_timeout_sec = 0\n\
                     [jwt_verifier]\nrequire_authentication = false\n\
                     [publisher]\napi_keys = [\"{KEY}\"]\n[rate_limit]\nrate_limit_per_ip = 100000000\n"
                ),
            )?;
            tokio::process::Command::new(text_flag("--binary", "target/release/flotilla")?)
                .args(["proxy", "--config"])
                .arg(&config)
                .env("RUST_LOG", "warn")
                .kill_on_drop(true)
                .spawn()?
        } else {
            tokio::process::Command::new(std::env::current_exe()?)
                .args(["hyper-server", "--port", &port.to_string()])
                .kill_on_drop(true)
                .spawn()?
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while TcpStream::connect(("127.0.0.1", port)).await.is_err() {
            if Instant::now() > deadline {
                bail!("{name} does not listen");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(Self {
            name,
            child,
            port,
            publish_path: "/publish/t".into(),
            _dir: dir,
        })
    }

    fn rss_kib(&self) -> u64 {
        let pid = self.child.id().unwrap_or(0);
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .unwrap_or_default()
            .lines()
            .find_map(|line| line.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    }
}

async fn open_stream(port: u16) -> anyhow::Result<TcpStream> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).await?;
    stream
        .write_all(
            b"GET /events/t HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\n\r\n",
        )
        .await?;
    let mut head = Vec::with_capacity(512);
    let mut buffer = [0u8; 512];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let read = stream.read(&mut buffer).await?;
        if read == 0 {
            bail!("closed before answering");
        }
        head.extend_from_slice(&buffer[..read]);
    }
    if !head.starts_with(b"HTTP/1.1 200") {
        bail!("{}", String::from_utf8_lossy(&head));
    }
    Ok(stream)
}

async fn measure(name: &'static str, streams: usize, messages: usize) -> anyhow::Result<()> {
    let server = Server::start(name).await?;
    let http = reqwest::Client::builder().no_proxy().build()?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let idle = server.rss_kib();
    let received = Arc::new(AtomicU64::new(0));
    let mut readers = Vec::new();
    for _ in 0..streams {
        let mut stream = open_stream(server.port).await?;
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
    for reader in readers {
        reader.abort();
    }
    Ok(())
}

fn raise_open_files() {
    // SAFETY: getrlimit/setrlimit read and write a local struct only.
    unsafe {
        let mut limit = std::mem::zeroed::<libc::rlimit>();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 {
            limit.rlim_cur = limit.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
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
