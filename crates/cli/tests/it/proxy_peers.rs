//! Three `flotilla proxy` processes on loopback as one service (`[peers]`):
//! delivery across proxies, resuming on another proxy, a proxy killed with
//! SIGKILL and its return, a stranger's gossip and forged peer requests
//! refused, and revocation across the cluster (also reaching, by gossip, a
//! proxy frozen when it was taken).

use std::path::PathBuf;
use std::time::Duration;

use flotilla_event_proxy::peers::{owner_among, wire};
use flotilla_testkit::{
    ServeProcess, SseClient, WebhookFake, chrono_like_now, get_json, get_text, wait_until,
};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(30);
const PUBLISHER_KEY: &str = "peers-test-publisher";
const SECRET: &str = "the cluster secret of this test";

/// One proxy of the cluster: its process, config and gossip address.
struct Peer {
    process: Option<ServeProcess>,
    config: PathBuf,
    dir: PathBuf,
    gossip: String,
}

impl Peer {
    fn url(&self) -> String {
        self.process.as_ref().expect("running").api.base.clone()
    }

    async fn start(&mut self) {
        let config = self.config.display().to_string();
        self.process = Some(
            ServeProcess::start_command(
                &PathBuf::from(env!("CARGO_BIN_EXE_flotilla")),
                &["proxy", "--listen", "127.0.0.1:0", "--config", &config],
                &self.dir,
                &[],
                "event proxy listening on ",
            )
            .await
            .expect("proxy starts"),
        );
    }

    async fn health(&self) -> Value {
        get_json(&format!("{}/health", self.url())).await
    }

    async fn metric(&self, name: &str) -> f64 {
        let text = get_text(&format!("{}/metrics", self.url())).await;
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {name} in metrics"))
    }
}

/// Waits (up to [`WAIT`]) until `check` holds.
async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    wait_until(WAIT, what, || {
        let holds = check();
        async move { Ok::<_, std::convert::Infallible>(holds.await.then_some(())) }
    })
    .await
    .unwrap();
}

/// A free UDP port on loopback (bound and released).
fn free_udp_port() -> u16 {
    std::net::UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

struct Cluster {
    peers: Vec<Peer>,
    _dir: tempfile::TempDir,
}

/// `auth`: the webhook every proxy verifies tokens with (None: open). Gossip
/// every 0.2 s; a peer timeout of 5 s, so that a loaded machine never takes a
/// live proxy for dead.
async fn cluster(count: usize, secret: &str, auth: Option<&WebhookFake>) -> Cluster {
    let dir = tempfile::tempdir().unwrap();
    let gossip: Vec<String> = (0..count)
        .map(|_| format!("127.0.0.1:{}", free_udp_port()))
        .collect();
    let mut peers = Vec::new();
    for (index, address) in gossip.iter().enumerate() {
        let others: Vec<&String> = gossip.iter().filter(|a| *a != address).collect();
        let verifier = match auth {
            Some(webhook) => format!("webhook_url = {:?}", webhook.url),
            None => "require_authentication = false".into(),
        };
        let config = format!(
            "[jwt_verifier]\n{verifier}\n\n[publisher]\napi_keys = [{PUBLISHER_KEY:?}]\n\n\
             [rate_limit]\nrate_limit_per_ip = 100000\n\n\
             [peers]\nlisten_address = {address:?}\npeer_addresses = {others:?}\nsecret = {secret:?}\n\
             gossip_interval_sec = 0.2\npeer_timeout_sec = 5\n"
        );
        let path = dir.path().join(format!("proxy-{index}.toml"));
        std::fs::write(&path, config).unwrap();
        let mut peer = Peer {
            process: None,
            config: path,
            dir: dir.path().join(format!("proxy-{index}")),
            gossip: address.clone(),
        };
        peer.start().await;
        peers.push(peer);
    }
    Cluster { peers, _dir: dir }
}

impl Cluster {
    /// Waits until every running proxy sees `live` live peers.
    async fn converged(&self, live: u64) {
        for peer in self.peers.iter().filter(|p| p.process.is_some()) {
            eventually("peers to see each other", || async {
                peer.health().await["peers"]["connected"].as_u64() == Some(live)
            })
            .await;
        }
    }

    /// The index of the proxy that owns `topic` among those running.
    fn owner(&self, topic: &str) -> usize {
        let running: Vec<&str> = self
            .peers
            .iter()
            .filter(|p| p.process.is_some())
            .map(|p| p.gossip.as_str())
            .collect();
        let owner = owner_among(topic, &running).unwrap();
        self.peers.iter().position(|p| p.gossip == owner).unwrap()
    }

    /// A topic owned by proxy `index` (names `<prefix>-<n>`).
    fn topic_owned_by(&self, index: usize, prefix: &str) -> String {
        (0..)
            .map(|n| format!("{prefix}-{n}"))
            .find(|t| self.owner(t) == index)
            .unwrap()
    }
}

async fn publish(url: &str, topic: &str, data: &str) -> reqwest::Response {
    reqwest::Client::new()
        .post(format!("{url}/publish/{topic}"))
        .bearer_auth(PUBLISHER_KEY)
        .json(&json!({ "data": data }))
        .send()
        .await
        .unwrap()
}

async fn publish_ok(url: &str, topic: &str, data: &str) -> String {
    let response = publish(url, topic, data).await;
    assert_eq!(response.status(), 200, "publish {data} on {url}");
    let body: Value = response.json().await.unwrap();
    body["id"].as_str().unwrap().to_owned()
}

async fn subscribe(url: &str, topic: &str, headers: &[(&str, &str)]) -> SseClient {
    let client = SseClient::connect(url, &format!("/events/{topic}"), headers)
        .await
        .unwrap();
    assert_eq!(client.status, 200, "{}", client.body);
    client
}

/// The next `n` events' (id, data).
/// `POST /admin/revoke` of `user` on `url`; the answer.
async fn revoke_user(url: &str, user: &str) -> Value {
    let response = reqwest::Client::new()
        .post(format!("{url}/admin/revoke"))
        .bearer_auth(PUBLISHER_KEY)
        .json(&json!({ "user_id": user }))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    response.json().await.unwrap()
}

async fn take(client: &mut SseClient, n: usize) -> Vec<(String, String)> {
    let mut out = Vec::new();
    while out.len() < n {
        let event = client.next_event(WAIT).await.unwrap();
        assert_eq!(event.event, None, "unexpected {:?}", event.event);
        out.push((event.id.unwrap(), event.data.unwrap()));
    }
    out
}

#[tokio::test]
async fn events_cross_proxies_and_clients_resume_on_any_proxy() {
    let cluster = cluster(3, SECRET, None).await;
    cluster.converged(2).await;
    let urls: Vec<String> = cluster.peers.iter().map(Peer::url).collect();
    // A topic owned by proxy 2: subscribers on 0, publishers on 1 (two hops).
    let topic = cluster.topic_owned_by(2, "orders");
    let mut on_a = subscribe(&urls[0], &topic, &[]).await;
    // Each proxy's peer loops (membership, gossiped interest) report their
    // runs in /health.
    eventually("proxy 0's peer loops to report their runs", || async {
        let loops = cluster.peers[0].health().await["peers"]["loops"].clone();
        let named = |name: &str| {
            loops
                .as_array()
                .into_iter()
                .flatten()
                .find(|run| run["name"] == name)
                .cloned()
        };
        ["peer membership", "peer interest"]
            .into_iter()
            .all(|name| {
                named(name)
                    .is_some_and(|run| run["runs"].as_u64() > Some(0) && run["failing"] == false)
            })
    })
    .await;
    let mut ids = Vec::new();
    for i in 0..5 {
        ids.push(publish_ok(&urls[1], &topic, &format!("b{i}")).await);
    }
    let got = take(&mut on_a, 5).await;
    assert_eq!(
        got.iter().map(|(_, d)| d.as_str()).collect::<Vec<_>>(),
        ["b0", "b1", "b2", "b3", "b4"]
    );
    assert_eq!(
        got.iter().map(|(id, _)| id.clone()).collect::<Vec<_>>(),
        ids,
        "subscribers see the ids publishers got"
    );
    // Every proxy publishes; a second subscriber on proxy 2 (the owner).
    let mut on_c = subscribe(&urls[2], &topic, &[]).await;
    for (index, url) in urls.iter().enumerate() {
        publish_ok(url, &topic, &format!("from-{index}")).await;
    }
    for client in [&mut on_a, &mut on_c] {
        let data: Vec<String> = take(client, 3).await.into_iter().map(|(_, d)| d).collect();
        assert_eq!(data, ["from-0", "from-1", "from-2"]);
    }

    // The client on proxy 0 leaves after b4 … from-2; three more are published.
    let last_id = ids[4].clone();
    drop(on_a);
    let mut missed_ids = Vec::new();
    for i in 0..3 {
        missed_ids.push(publish_ok(&urls[0], &topic, &format!("m{i}")).await);
    }
    let _ = take(&mut on_c, 3).await;
    // Resuming from b4 on any proxy (one with a copy of the history, one
    // without subscribers, the owner) gives the same six events, no gap.
    let mut expected = vec!["from-0", "from-1", "from-2", "m0", "m1", "m2"];
    for url in &urls {
        let mut resumed = subscribe(url, &topic, &[("Last-Event-ID", &last_id)]).await;
        let replay = take(&mut resumed, expected.len()).await;
        assert_eq!(
            replay.iter().map(|(_, d)| d.as_str()).collect::<Vec<_>>(),
            expected,
            "resume on {url}"
        );
        assert_eq!(
            replay[3..6]
                .iter()
                .map(|(id, _)| id.clone())
                .collect::<Vec<_>>(),
            missed_ids
        );
        expected.push("after");
        // And live events follow, once each.
        let live = publish_ok(&urls[1], &topic, "after").await;
        let next = take(&mut resumed, 1).await;
        assert_eq!(next[0], (live, "after".to_owned()));
        let _ = take(&mut on_c, 1).await;
    }
    // An id nobody can place gets a `missed` event and what is kept.
    let mut lost = subscribe(&urls[1], &topic, &[("Last-Event-ID", "1-1")]).await;
    let first = lost.next_event(WAIT).await.unwrap();
    assert_eq!(first.event.as_deref(), Some("missed"));

    // Peer metrics reflect the traffic.
    for peer in &cluster.peers {
        assert_eq!(peer.metric("peers_connected").await, 2.0);
        assert!(peer.metric("sync_lag").await >= 0.0);
    }
    assert!(cluster.peers[2].metric("peer_messages_sent").await > 0.0);
    assert!(cluster.peers[0].metric("peer_frames_received").await > 0.0);
    // Subscribers remain on proxies 1 and 2 only.
    assert_eq!(cluster.peers[0].metric("topics_active").await, 0.0);
    assert_eq!(cluster.peers[2].metric("topics_active").await, 1.0);
}

#[tokio::test]
async fn a_killed_proxy_is_detected_and_rejoins_cleanly() {
    let mut cluster = cluster(3, SECRET, None).await;
    cluster.converged(2).await;
    let topic = cluster.topic_owned_by(2, "fleet");
    let url_a = cluster.peers[0].url();
    let url_b = cluster.peers[1].url();
    let mut on_a = subscribe(&url_a, &topic, &[]).await;
    let mut on_b = subscribe(&url_b, &topic, &[]).await;
    publish_ok(&url_a, &topic, "before").await;
    for client in [&mut on_a, &mut on_b] {
        assert_eq!(take(client, 1).await[0].1, "before");
    }

    // SIGKILL the owner: the others notice, take its topics over, keep serving.
    cluster.peers[2]
        .process
        .as_mut()
        .unwrap()
        .stop_with(libc::SIGKILL)
        .await;
    cluster.peers[2].process = None;
    let killed_at = std::time::Instant::now();
    cluster.converged(1).await;
    eprintln!("death noticed by both after {:?}", killed_at.elapsed());
    for peer in &cluster.peers[..2] {
        let members = peer.health().await["peers"]["members"].clone();
        let dead = members
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["gossip_address"] == cluster.peers[2].gossip.as_str())
            .unwrap();
        assert_eq!(dead["status"], "dead");
    }
    // Publishes go through again once the new owner is known (a 503 says
    // "retry" in between).
    eventually("publishing to the dead owner's topic", || async {
        publish(&url_b, &topic, "probe").await.status() == 200
    })
    .await;
    let (probe_id, _) = take(&mut on_a, 1).await.remove(0);
    let _ = take(&mut on_b, 1).await;
    publish_ok(&url_b, &topic, "while-down").await;
    for client in [&mut on_a, &mut on_b] {
        assert_eq!(take(client, 1).await[0].1, "while-down");
    }

    // It returns (same gossip address, new HTTP port): the cluster is whole
    // again, it owns its topics again and delivery runs through it.
    cluster.peers[2].start().await;
    cluster.converged(2).await;
    let url_c = cluster.peers[2].url();
    let mut on_c = subscribe(&url_c, &topic, &[]).await;
    publish_ok(&url_a, &topic, "after-return").await;
    for client in [&mut on_a, &mut on_b, &mut on_c] {
        assert_eq!(take(client, 1).await[0].1, "after-return");
    }
    // A client that left after "probe" (numbered by the interim owner) resumes
    // on the returned owner, which never saw those events: the peers keeping
    // a copy of the history answer.
    let mut resumed = subscribe(&url_c, &topic, &[("Last-Event-ID", &probe_id)]).await;
    let replay: Vec<String> = take(&mut resumed, 2)
        .await
        .into_iter()
        .map(|(_, d)| d)
        .collect();
    assert_eq!(replay, ["while-down", "after-return"]);
    publish_ok(&url_b, &topic, "live").await;
    assert_eq!(take(&mut resumed, 1).await[0].1, "live");
    let owned = cluster.topic_owned_by(2, "returned");
    let mut on_a_owned = subscribe(&url_a, &owned, &[]).await;
    let id = publish_ok(&url_b, &owned, "through-c").await;
    assert_eq!(
        take(&mut on_a_owned, 1).await[0],
        (id, "through-c".to_owned())
    );
}

#[tokio::test]
async fn strangers_cannot_join_or_inject_events() {
    let mut cluster = cluster(2, SECRET, None).await;
    cluster.converged(1).await;
    // A proxy with another secret, seeded with the cluster's addresses.
    let stranger_dir = tempfile::tempdir().unwrap();
    let seeds: Vec<String> = cluster.peers.iter().map(|p| p.gossip.clone()).collect();
    let address = format!("127.0.0.1:{}", free_udp_port());
    let config = stranger_dir.path().join("stranger.toml");
    std::fs::write(
        &config,
        format!(
            "[jwt_verifier]\nrequire_authentication = false\n\n[peers]\nlisten_address = {address:?}\n\
             peer_addresses = {seeds:?}\nsecret = \"not the secret of that cluster\"\n\
             gossip_interval_sec = 0.2\npeer_timeout_sec = 5\n"
        ),
    )
    .unwrap();
    let mut stranger = Peer {
        process: None,
        config,
        dir: stranger_dir.path().join("stranger"),
        gossip: address,
    };
    stranger.start().await;
    // Its datagrams arrive and are refused.
    eventually("the stranger's gossip to be refused", || async {
        cluster.peers[0].metric("peer_auth_failures").await > 0.0
    })
    .await;
    for peer in &cluster.peers {
        let health = peer.health().await;
        assert_eq!(health["peers"]["connected"], 1);
        assert_eq!(health["peers"]["members"].as_array().unwrap().len(), 1);
    }
    assert_eq!(stranger.health().await["peers"]["connected"], 0);
    cluster.peers.push(stranger);

    // Forged peer requests: unsigned, signed with another secret, stale.
    let url = cluster.peers[0].url();
    let mut watcher = subscribe(&url, "vault", &[]).await;
    let batch = serde_json::to_vec(&json!({"frames": [{
        "topic": "vault", "term": 1, "seq": 1, "text": "id: 1-1\ndata: forged\n\n"
    }]}))
    .unwrap();
    let http = reqwest::Client::new();
    let post = |headers: Vec<(&'static str, String)>| {
        let mut request = http
            .post(format!("{url}/peer/v1/batch"))
            .body(batch.clone());
        for (name, value) in headers {
            request = request.header(name, value);
        }
        request.send()
    };
    assert_eq!(post(Vec::new()).await.unwrap().status(), 401);
    let wrong = wire::derive_key("not the secret of that cluster", "http");
    let forged = wire::sign_request(&wrong, "intruder", "/peer/v1/batch", &batch);
    assert_eq!(post(forged.to_vec()).await.unwrap().status(), 401);
    let right = wire::derive_key(SECRET, "http");
    let mut stale = wire::sign_request(&right, "intruder", "/peer/v1/batch", &batch).to_vec();
    stale[1].1 = (chrono_like_now() - 3600).to_string();
    assert_eq!(post(stale).await.unwrap().status(), 401);
    // The watcher got nothing forged: the next event is a real one.
    publish_ok(&url, "vault", "real").await;
    assert_eq!(take(&mut watcher, 1).await[0].1, "real");
}

#[tokio::test]
async fn revocation_reaches_every_proxy() {
    // accept_all: user "u-<token>".
    let webhook = WebhookFake::start(WebhookFake::accept_all()).await;
    let cluster = cluster(3, SECRET, Some(&webhook)).await;
    cluster.converged(2).await;
    let mut alice = Vec::new();
    for peer in &cluster.peers {
        alice.push(subscribe(&peer.url(), "news", &[("Authorization", "Bearer alice")]).await);
    }
    let mut bob = subscribe(
        &cluster.peers[1].url(),
        "news",
        &[("Authorization", "Bearer bob")],
    )
    .await;
    let answer = revoke_user(&cluster.peers[0].url(), "u-alice").await;
    assert_eq!(answer["closed"], 1, "{answer}");
    assert_eq!(
        answer["peers_reached"].as_array().unwrap().len(),
        2,
        "{answer}"
    );
    assert_eq!(answer["peers_failed"], json!([]));
    for stream in &mut alice {
        let last = stream.next_event(WAIT).await.unwrap();
        assert_eq!(last.event.as_deref(), Some("revoked"));
        assert!(
            stream.next(WAIT).await.unwrap().is_none(),
            "the stream ends"
        );
    }
    // Bob is untouched; alice's next subscription asks the webhook again on
    // every proxy (the cached grant is gone everywhere).
    publish_ok(&cluster.peers[2].url(), "news", "still here").await;
    assert_eq!(take(&mut bob, 1).await[0].1, "still here");
    let calls = webhook.call_count();
    for peer in &cluster.peers {
        let _again = subscribe(&peer.url(), "news", &[("Authorization", "Bearer alice")]).await;
    }
    assert_eq!(webhook.call_count(), calls + 3);
}

/// Resumes a stopped process when dropped (also when the test fails).
struct Stopped(u32);

impl Stopped {
    fn stop(pid: u32) -> Self {
        // SAFETY: kill has no memory-safety preconditions.
        assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGSTOP) }, 0);
        Self(pid)
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        // SAFETY: as above.
        unsafe { libc::kill(self.0 as i32, libc::SIGCONT) };
    }
}

#[tokio::test]
async fn a_revocation_reaches_a_proxy_that_was_unreachable_by_gossip() {
    let webhook = WebhookFake::start(WebhookFake::accept_all()).await;
    let cluster = cluster(3, SECRET, Some(&webhook)).await;
    cluster.converged(2).await;
    let late = &cluster.peers[2];
    let mut alice = subscribe(&late.url(), "news", &[("Authorization", "Bearer alice")]).await;
    let mut bob = subscribe(&late.url(), "news", &[("Authorization", "Bearer bob")]).await;

    // The third proxy is frozen (SIGSTOP): it can neither answer nor gossip,
    // and the others take it for dead, so the revocation is not sent to it.
    let frozen = Stopped::stop(late.process.as_ref().unwrap().pid());
    for peer in &cluster.peers[..2] {
        eventually("the frozen proxy to count as dead", || async {
            peer.health().await["peers"]["connected"].as_u64() == Some(1)
        })
        .await;
    }
    let answer = revoke_user(&cluster.peers[0].url(), "u-alice").await;
    assert_eq!(
        answer["peers_reached"].as_array().unwrap().len(),
        1,
        "only the second proxy was reached: {answer}"
    );
    assert_eq!(answer["peers_failed"], json!([]), "{answer}");
    drop(frozen);

    // Thawed, it reads the revocation from gossip: alice's stream ends there,
    // bob's goes on, and alice's cached grant is gone.
    let last = alice.next_event(WAIT).await.unwrap();
    assert_eq!(last.event.as_deref(), Some("revoked"));
    // Events go to the thawed proxy once the others count it live again
    // (those published while it counted as dead do not reach its streams).
    cluster.converged(2).await;
    publish_ok(&cluster.peers[0].url(), "news", "after").await;
    assert_eq!(take(&mut bob, 1).await[0].1, "after");
    let calls = webhook.call_count();
    let mut again = subscribe(&late.url(), "news", &[("Authorization", "Bearer alice")]).await;
    assert_eq!(webhook.call_count(), calls + 1, "alice is verified again");
    // Applied once, and only to what was verified before it: alice's new
    // stream lives on while the gossip keeps carrying the revocation.
    for round in 0..5 {
        let data = format!("later {round}");
        publish_ok(&cluster.peers[0].url(), "news", &data).await;
        assert_eq!(take(&mut again, 1).await[0].1, data);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
