//! `flotilla proxy` as a process: startup is refused with a clear message when
//! authentication is required but no webhook is set; it starts otherwise and
//! stops cleanly on SIGTERM. And `flotilla keys create`.

use std::process::Stdio;
use std::time::Duration;

use flotilla_testkit::get_json;
use tokio::io::{AsyncBufReadExt, BufReader};

fn proxy() -> tokio::process::Command {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_flotilla"));
    command
        .args(["proxy", "--listen", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    command
}

#[tokio::test]
async fn startup_is_refused_without_a_webhook_when_authentication_is_required() {
    let output = tokio::time::timeout(Duration::from_secs(60), proxy().output())
        .await
        .unwrap()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("jwt_verifier.webhook_url") && stderr.contains("require_authentication"),
        "{stderr}"
    );
}

#[tokio::test]
async fn starts_open_when_told_and_stops_on_sigterm() {
    let mut child = proxy()
        .env("FLOTILLA_JWT_VERIFIER__REQUIRE_AUTHENTICATION", "false")
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let line = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let url = line
        .strip_prefix("event proxy listening on ")
        .expect("the address line")
        .to_owned();
    let health: serde_json::Value = get_json(&format!("{url}/health")).await;
    assert_eq!(health["status"], "healthy");
    // SAFETY: kill has no memory-safety preconditions.
    unsafe { libc::kill(child.id().unwrap() as i32, libc::SIGTERM) };
    let status = tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success());
}

#[tokio::test]
async fn keys_create_prints_a_key_and_its_configuration_line() {
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .args(["keys", "create"])
        .output()
        .await
        .unwrap();
    assert!(output.status.success());
    let stdout = String::from_utf8(output.stdout).unwrap();
    let key = stdout
        .lines()
        .find_map(|l| l.strip_prefix("API key (give it to the client; it is not stored): "))
        .expect("the key line");
    assert!(key.starts_with("flt_") && key.len() == 68, "{key}");
    use sha2::Digest;
    let hash: String = sha2::Sha256::digest(key.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert!(
        stdout.contains(&format!("api_keys = [\"sha256:{hash}\"]")),
        "{stdout}"
    );
}

/// Subscribers a default `flotilla proxy` holds in the test below: more than
/// the 10,000 connections its listeners allowed before (half of the 20,000
/// descriptors, kept for browsers a proxy never runs), from eleven loopback
/// addresses so that no address passes `max_connections_per_client`'s
/// default of 1,024.
const ADDRESSES: u8 = 11;
const PER_ADDRESS: usize = 950;

/// One subscriber on `proxy` from `source`: its socket, once the stream's
/// head has come.
async fn subscribe_from(
    source: std::net::Ipv4Addr,
    proxy: std::net::SocketAddr,
) -> tokio::net::TcpStream {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind((source, 0).into()).unwrap();
    let mut stream = socket.connect(proxy).await.unwrap();
    stream
        .write_all(
            b"GET /events/crowd HTTP/1.1\r\nHost: proxy\r\nAccept: text/event-stream\r\n\r\n",
        )
        .await
        .unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        assert_eq!(stream.read(&mut byte).await.unwrap(), 1, "closed: {head:?}");
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head);
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    stream
}

#[tokio::test]
async fn a_default_proxy_holds_more_than_ten_thousand_subscribers_and_still_publishes() {
    flotilla_net::descriptors::raise_to_hard_limit();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("proxy.toml");
    // Defaults everywhere but authentication (open) and the per-address
    // subscribe rate (100 a minute would refuse the crowd itself).
    std::fs::write(
        &config,
        "[jwt_verifier]\nrequire_authentication = false\n\n[publisher]\napi_keys = [\"crowd-publisher\"]\n\n\
         [rate_limit]\nrate_limit_per_ip = 100000\n",
    )
    .unwrap();
    let mut child = proxy()
        .args(["--config", config.to_str().unwrap()])
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let line = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let url = line
        .strip_prefix("event proxy listening on ")
        .expect("the address line")
        .to_owned();
    let address: std::net::SocketAddr = url.trim_start_matches("http://").parse().unwrap();

    let mut subscribers = Vec::new();
    for source in 2..2 + ADDRESSES {
        let source = std::net::Ipv4Addr::new(127, 0, 0, source);
        let joins: Vec<_> = (0..PER_ADDRESS)
            .map(|_| tokio::spawn(subscribe_from(source, address)))
            .collect();
        for join in joins {
            subscribers.push(join.await.unwrap());
        }
    }
    assert_eq!(subscribers.len(), usize::from(ADDRESSES) * PER_ADDRESS);
    let health: serde_json::Value = get_json(&format!("{url}/health")).await;
    assert_eq!(health["status"], "healthy", "{health}");

    let published = reqwest::Client::new()
        .post(format!("{url}/publish/crowd"))
        .bearer_auth("crowd-publisher")
        .json(&serde_json::json!({"data": "to-every-one"}))
        .send()
        .await
        .unwrap();
    assert!(published.status().is_success(), "{}", published.status());
    let readers: Vec<_> = subscribers
        .into_iter()
        .map(|mut stream| {
            tokio::spawn(async move {
                use tokio::io::AsyncReadExt;
                let mut seen = Vec::new();
                let mut buffer = [0u8; 512];
                while !String::from_utf8_lossy(&seen).contains("data: to-every-one") {
                    let read = stream.read(&mut buffer).await.unwrap();
                    assert!(read > 0, "the stream closed before the event");
                    seen.extend_from_slice(&buffer[..read]);
                }
            })
        })
        .collect();
    tokio::time::timeout(Duration::from_secs(120), async {
        for reader in readers {
            reader.await.unwrap();
        }
    })
    .await
    .expect("every subscriber gets the event");
    // SAFETY: kill has no memory-safety preconditions.
    unsafe { libc::kill(child.id().unwrap() as i32, libc::SIGTERM) };
    let _ = tokio::time::timeout(Duration::from_secs(30), child.wait()).await;
}
