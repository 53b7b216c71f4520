//! A slow client cannot stop a node: the reproduction of the attack that
//! filled `serve`'s descriptors (two scripts holding half-sent requests, more
//! of them than the process may open), run against every listener of the real binary in turn (the control
//! plane, the event proxy, and an instance's debug, stream and HTTP ports),
//! while `/health` of the control plane and the proxy, the API and the
//! attacked port itself must answer throughout; afterwards nothing is lost.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use flotilla_testkit::{Api, ServeProcess, StatusCode, free_port};
use tokio::io::{AsyncBufReadExt, BufReader};

const KEY: &str = "slow-clients-key";

/// The issue's script, made to survive its own connections being closed.
const ATTACKER: &str = r#"
import socket, sys, time
host, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
held = []
for _ in range(n):
    try:
        held.append(socket.create_connection((host, port), timeout=5))
    except OSError:
        pass
for c in held:
    try:
        c.sendall(b'GET / HTTP/1.1\r\nHost: x\r\n')
    except OSError:
        pass
print('held', len(held), flush=True)
time.sleep(120)
"#;

/// The descriptors of the attacked process, and each attacker's connections.
const DESCRIPTORS: usize = 20_000;
const ATTACK: usize = 9990;

/// Every probe must be answered within this (the attack made them hang).
const PROBE_DEADLINE: Duration = Duration::from_secs(5);

fn binary() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_flotilla"))
}

/// Starts one attacker holding `n` half-sent requests to `port`; returns
/// once it holds them (it is killed when dropped).
async fn attack(port: u16, n: usize) -> tokio::process::Child {
    let mut child = tokio::process::Command::new("python3")
        .args([
            "-c",
            ATTACKER,
            "127.0.0.1",
            &port.to_string(),
            &n.to_string(),
        ])
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("python3 runs");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let line = tokio::time::timeout(Duration::from_secs(120), lines.next_line())
        .await
        .expect("the attacker connects within 120 s")
        .unwrap()
        .expect("the attacker reports");
    assert!(line.starts_with("held"), "{line}");
    child
}

/// A GET on a fresh connection (nothing pooled), answered within the deadline.
async fn probe(url: &str) -> Result<StatusCode, String> {
    let client = reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(0)
        .timeout(PROBE_DEADLINE)
        .build()
        .unwrap();
    let started = Instant::now();
    client
        .get(url)
        .bearer_auth(KEY)
        .send()
        .await
        .map(|response| response.status())
        .map_err(|error| format!("{url}: {error} after {:?}", started.elapsed()))
}

fn port_of(url: &str) -> u16 {
    url::Url::parse(url).unwrap().port().unwrap()
}

#[tokio::test]
async fn browser_half_open_requests_on_any_listener_leave_health_and_the_api_answering() {
    flotilla_testkit::init_logging();
    let temp = tempfile::tempdir().unwrap();
    let data_dir = temp.path().join("data");
    let proxy_port = free_port();
    let proxy_bind = format!("127.0.0.1:{proxy_port}");
    // As in the report: 20,000 descriptors against 2 × 9,990 connections
    // (set here, so that a machine with a higher limit runs the same attack).
    let nofile = format!("--nofile={DESCRIPTORS}:{DESCRIPTORS}");
    let data = data_dir.display().to_string();
    let flotilla = binary().display().to_string();
    let serve = ServeProcess::start_command(
        Path::new("/usr/bin/prlimit"),
        &[
            &nofile,
            &flotilla,
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            &data,
        ],
        &data_dir,
        &[
            ("FLOTILLA_AGENT__WARM_POOL_SIZE", "0"),
            ("FLOTILLA_AUTH_ENABLED", "true"),
            ("FLOTILLA_API_KEYS", &format!("[\"{KEY}\"]")),
            ("FLOTILLA_HTTP__BIND_ADDRESS", &proxy_bind),
        ],
        "control plane listening on ",
    )
    .await
    .unwrap();
    let api = Api::with_key(serve.api.base.clone(), KEY);
    let (id, _, detail) = api.create_running("{}").await;
    let port = |name: &str| detail[name].as_u64().expect("a port") as u16;
    let (debug, stream, http) = (port("debug_port"), port("stream_port"), port("http_port"));
    let targets = [
        (
            "control plane",
            port_of(&api.base),
            format!("{}/health", api.base),
        ),
        (
            "event proxy",
            proxy_port,
            format!("http://{proxy_bind}/health"),
        ),
        (
            "debug port",
            debug,
            format!("http://127.0.0.1:{debug}/json/version"),
        ),
        (
            "stream port",
            stream,
            format!("http://127.0.0.1:{stream}/frame.jpg"),
        ),
        ("http port", http, format!("http://127.0.0.1:{http}/tabs")),
    ];
    for (name, port, own_url) in &targets {
        // Two scripts, as in the report: together more connections than the
        // process has descriptors.
        let attackers = tokio::join!(attack(*port, ATTACK), attack(*port, ATTACK));
        for round in 0..5 {
            for url in [
                format!("{}/health", api.base),
                format!("http://{proxy_bind}/health"),
                format!("{}/v2/instances/{id}", api.base),
                own_url.clone(),
            ] {
                let status = probe(&url).await.unwrap_or_else(|error| {
                    panic!(
                        "with {name} attacked, round {round}: {error}; log in {}",
                        serve.stderr_log.display()
                    )
                });
                assert!(
                    status.is_success(),
                    "with {name} attacked: {url} answered {status}"
                );
            }
        }
        drop(attackers);
    }
    // Nothing lost: the instance still runs and its browser answers.
    let (status, detail) = api.get(&format!("/v2/instances/{id}")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(detail["status"], "running", "{detail}");
    let version = probe(&format!("http://127.0.0.1:{debug}/json/version"))
        .await
        .unwrap();
    assert_eq!(version, StatusCode::OK);
    api.delete_instance(&id).await;
}
