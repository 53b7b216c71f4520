//! Crashes at any moment: `kill -9` lands at a random instant while creates,
//! parks, revives and deletes are in flight, the process starts again on the
//! same data, and the fleet must be whole:
//! - every instance whose create was answered 201 (and not deleted) has a record;
//! - no record is left `creating` or `reviving`;
//! - a `running` or `idle` record has its browser, any other has none, and no
//!   browser runs without a running record;
//! - a `dormant` record's snapshot exists (and so does the snapshot of a
//!   `failed` or `stopped` record that offers one: it is revived next round);
//! - at the end, every lifecycle event in the store reached the webhook
//!   receiver at least once, in the store's order per instance.
//!
//! Three fleets: `serve` on SQLite with a directory snapshot store; `serve` on
//! PostgreSQL with S3 (moto); a cluster (control plane + agent) where first
//! the agent and then the control plane is killed. Rounds per fleet:
//! `FLOTILLA_CRASH_ROUNDS` (default 50); the random schedule's seed is printed
//! and can be replayed with `FLOTILLA_CRASH_SEED`.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use flotilla_testkit::{
    Api, BROWSER_DEADLINE, EventReceiver, PgServer, S3Server, ServeProcess, StatusCode,
    browser_processes, wait_until,
};
use serde_json::Value;

const SECRET: &str = "crash-rounds-secret";
const TOKEN: &str = "crash-rounds-cluster-token";

fn binary() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_flotilla"))
}

fn rounds() -> usize {
    std::env::var("FLOTILLA_CRASH_ROUNDS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(50)
}

/// xorshift64*: a reproducible schedule from a printed seed.
struct Schedule(u64);

impl Schedule {
    fn new(name: &str) -> Self {
        let seed = std::env::var("FLOTILLA_CRASH_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_nanos() as u64
                    | 1
            });
        eprintln!("{name}: FLOTILLA_CRASH_SEED={seed}");
        Self(seed)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n.max(1)
    }
}

/// Where the fleet keeps its snapshots, to check that they exist.
enum Snapshots {
    Dir(PathBuf),
    S3 {
        server: Box<S3Server>,
        prefix: String,
    },
}

impl Snapshots {
    async fn exists(&self, instance: &str, snapshot: &str) -> bool {
        match self {
            Snapshots::Dir(dir) => dir
                .join(instance)
                .join(format!("{snapshot}.tar.zst"))
                .is_file(),
            Snapshots::S3 { server, prefix } => {
                let key = format!("{prefix}/{instance}/{snapshot}.tar.zst");
                server
                    .keys(&format!("{prefix}/{instance}/"))
                    .await
                    .contains(&key)
            }
        }
    }

    fn env(&self) -> Vec<(String, String)> {
        match self {
            Snapshots::Dir(dir) => vec![(
                "FLOTILLA_SNAPSHOTS__URL".into(),
                format!("file://{}", dir.display()),
            )],
            Snapshots::S3 { server, prefix } => vec![
                (
                    "FLOTILLA_SNAPSHOTS__URL".into(),
                    format!("s3://{}/{prefix}", server.bucket),
                ),
                (
                    "FLOTILLA_SNAPSHOTS__ENDPOINT".into(),
                    server.endpoint.clone(),
                ),
                ("FLOTILLA_SNAPSHOTS__ALLOW_HTTP".into(), "true".into()),
                ("FLOTILLA_SNAPSHOTS__REGION".into(), "us-east-1".into()),
                ("FLOTILLA_SNAPSHOTS__ACCESS_KEY_ID".into(), "test".into()),
                (
                    "FLOTILLA_SNAPSHOTS__SECRET_ACCESS_KEY".into(),
                    "test".into(),
                ),
            ],
        }
    }
}

/// Which process the rounds kill.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Victim {
    /// `flotilla serve`: control plane and agent in one process.
    Serve,
    /// The `flotilla agent` of a cluster.
    Agent,
    /// The `flotilla control` of a cluster.
    Control,
}

/// The processes under test, started again on the same data after each kill.
struct Fleet {
    root: PathBuf,
    env: Vec<(String, String)>,
    /// `serve`, or the cluster's control plane (on a fixed port, so that the
    /// agent finds it again after a restart).
    control: Option<ServeProcess>,
    control_port: u16,
    agent: Option<ServeProcess>,
    clustered: bool,
    database_url: String,
}

impl Fleet {
    async fn start(
        root: &Path,
        clustered: bool,
        database_url: String,
        extra_env: Vec<(String, String)>,
    ) -> Self {
        let config = root.join("webhooks.toml");
        let mut fleet = Self {
            root: root.to_path_buf(),
            env: extra_env,
            control: None,
            control_port: stable_port(),
            agent: None,
            clustered,
            database_url,
        };
        fleet.env.extend([
            ("FLOTILLA_CONFIG".into(), config.display().to_string()),
            (
                "FLOTILLA_STORE__DATABASE_URL".into(),
                fleet.database_url.clone(),
            ),
            ("FLOTILLA_AGENT__WARM_POOL_SIZE".into(), "0".into()),
            ("FLOTILLA_AGENT__NODE_ID".into(), "crash-node".into()),
            ("FLOTILLA_CLUSTER_TOKEN".into(), TOKEN.into()),
            (
                "FLOTILLA_NODES__HEARTBEAT_INTERVAL_SEC".into(),
                "0.5".into(),
            ),
            // Creates cut off by a kill fail: that must not make the node unhealthy.
            ("FLOTILLA_NODES__MAX_FAILED_RATIO".into(), "1".into()),
            // A loaded 2-core machine: the overload guard would refuse at random.
            (
                "FLOTILLA_SCHEDULER__MAX_UTILISATION_PERCENT".into(),
                "100".into(),
            ),
        ]);
        fleet.start_control().await;
        if clustered {
            fleet.start_agent().await;
        }
        fleet
    }

    fn api(&self) -> &Api {
        &self.control.as_ref().expect("control plane runs").api
    }

    fn instances_dir(&self) -> PathBuf {
        // Both keep the agent's state under `<data_dir>/agent`.
        let data_dir = if self.clustered { "agent" } else { "serve" };
        self.root.join(data_dir).join("agent/instances")
    }

    async fn start_control(&mut self) {
        let env: Vec<(&str, &str)> = self
            .env
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        // The agent of a cluster finds its control plane at the same address
        // after a restart; `serve` takes any port.
        let listen = if self.clustered {
            format!("127.0.0.1:{}", self.control_port)
        } else {
            "127.0.0.1:0".to_owned()
        };
        let (dir, command) = if self.clustered {
            (self.root.join("control"), "control")
        } else {
            (self.root.join("serve"), "serve")
        };
        let data = dir.display().to_string();
        let mut args = vec![command, "--listen", &listen, "--data-dir", &data];
        if !self.clustered {
            // Two fleets may run at once: their proxies take any port.
            args.extend(["--proxy-listen", "127.0.0.1:0"]);
        }
        let process =
            ServeProcess::start_command(binary(), &args, &dir, &env, "control plane listening on ")
                .await
                .unwrap_or_else(|error| {
                    panic!("the control plane starts: {error}\n{}", log_tail(&dir))
                });
        self.control = Some(process);
    }

    async fn start_agent(&mut self) {
        let env: Vec<(&str, &str)> = self
            .env
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let dir = self.root.join("agent");
        let data = dir.display().to_string();
        let control = format!("http://127.0.0.1:{}", self.control_port);
        let process = ServeProcess::start_command(
            binary(),
            &["agent", "--control-plane", &control, "--data-dir", &data],
            &dir,
            &env,
            "node agent listening on ",
        )
        .await
        .unwrap_or_else(|error| panic!("the agent starts: {error}\n{}", log_tail(&dir)));
        self.agent = Some(process);
    }

    async fn kill(&mut self, victim: Victim) {
        let process = match victim {
            Victim::Agent => self.agent.as_mut(),
            Victim::Serve | Victim::Control => self.control.as_mut(),
        };
        let process = process.expect("running");
        process.stop_with(libc::SIGKILL).await;
        // What it left behind is for the next start to find.
        process.sweep_on_drop = false;
    }

    async fn restart(&mut self, victim: Victim) {
        match victim {
            Victim::Agent => self.start_agent().await,
            Victim::Serve | Victim::Control => self.start_control().await,
        }
    }

    async fn stop_gracefully(&mut self) {
        for process in [self.agent.as_mut(), self.control.as_mut()]
            .into_iter()
            .flatten()
        {
            assert_eq!(process.stop_with(libc::SIGTERM).await, Some(0));
        }
    }
}

impl Drop for Fleet {
    /// Whatever happened, no browser outlives the test.
    fn drop(&mut self) {
        for process in [self.agent.as_mut(), self.control.as_mut()]
            .into_iter()
            .flatten()
        {
            if let Some(mut child) = process.child.take() {
                let _ = child.start_kill();
            }
        }
        flotilla_node_agent::agent::sweep::sweep(&self.instances_dir());
    }
}

/// The end of a process's log (the temp dir goes when the test fails).
fn log_tail(dir: &Path) -> String {
    let log = std::fs::read_to_string(dir.with_extension("stderr.log")).unwrap_or_default();
    let lines: Vec<_> = log.lines().collect();
    let listening = std::process::Command::new("ss")
        .arg("-ltnp")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    let mut holders = String::new();
    for pid in listening
        .split("pid=")
        .skip(1)
        .filter_map(|rest| rest.split(',').next())
        .collect::<BTreeSet<_>>()
    {
        let read =
            |file: &str| std::fs::read_to_string(format!("/proc/{pid}/{file}")).unwrap_or_default();
        holders.push_str(&format!(
            "pid {pid}: state {:?} wchan {:?} cgroup {:?} stack {:?}\n",
            read("status").lines().find(|l| l.starts_with("State")),
            read("wchan"),
            read("cgroup"),
            read("stack"),
        ));
    }
    format!(
        "{}\nlistening now:\n{listening}\n{holders}",
        lines[lines.len().saturating_sub(30)..].join("\n")
    )
}

/// A free port outside the kernel's ephemeral range, so that no outgoing
/// connection takes it while the control plane is down between rounds.
fn stable_port() -> u16 {
    let start = std::process::id() as u16 % 5000;
    (0..5000)
        .map(|i| 12_000 + (start + i) % 5000)
        .find(|port| std::net::TcpListener::bind(("127.0.0.1", *port)).is_ok())
        .expect("a free port in 12000..17000")
}

/// What the rounds learned: ids answered 201, ids a delete was sent for, and
/// how often each operation was cut off by a kill.
#[derive(Default, Clone)]
struct Ledger {
    created: BTreeSet<String>,
    deleted: BTreeSet<String>,
    interrupted: BTreeMap<&'static str, usize>,
}

#[derive(Clone, Copy, Debug)]
enum Op {
    Create,
    Park,
    Revive,
    Delete,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Create => "create",
            Op::Park => "park",
            Op::Revive => "revive",
            Op::Delete => "delete",
        }
    }
}

/// Runs one operation to its end (a create or revive until `running`);
/// `Ok` when it finished.
async fn run_op(
    api: Api,
    op: Op,
    id: Option<String>,
    ledger: Arc<Mutex<Ledger>>,
) -> Result<(), String> {
    let answer = |(status, body): (StatusCode, Value)| {
        if status.is_success() {
            Ok(body)
        } else {
            Err(format!("{status}: {body}"))
        }
    };
    let path = |id: &str| format!("/v2/instances/{id}");
    match op {
        Op::Create => {
            let body = answer(try_call(&api, reqwest::Method::POST, "/v2/instances").await?)?;
            let id = body["id"].as_str().unwrap_or_default().to_owned();
            ledger.lock().unwrap().created.insert(id.clone());
            wait_running(&api, &id).await
        }
        Op::Park => {
            let id = id.expect("an instance to park");
            answer(
                try_call(
                    &api,
                    reqwest::Method::POST,
                    &format!("{}/dormant", path(&id)),
                )
                .await?,
            )
            .map(drop)
        }
        Op::Revive => {
            let id = id.expect("an instance to revive");
            answer(
                try_call(
                    &api,
                    reqwest::Method::POST,
                    &format!("{}/revive", path(&id)),
                )
                .await?,
            )?;
            wait_running(&api, &id).await
        }
        Op::Delete => {
            let id = id.expect("an instance to delete");
            // Sent is enough: a delete cut off on our side may still be done.
            ledger.lock().unwrap().deleted.insert(id.clone());
            answer(try_call(&api, reqwest::Method::DELETE, &path(&id)).await?).map(drop)
        }
    }
}

async fn try_call(
    api: &Api,
    method: reqwest::Method,
    path: &str,
) -> Result<(StatusCode, Value), String> {
    let mut request = api
        .http
        .request(method.clone(), format!("{}{path}", api.base));
    if method == reqwest::Method::POST {
        request = request
            .header("content-type", "application/json")
            .body("{}");
    }
    let response = request.send().await.map_err(|e| e.to_string())?;
    let status = response.status();
    let text = response.text().await.map_err(|e| e.to_string())?;
    Ok((
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    ))
}

async fn wait_running(api: &Api, id: &str) -> Result<(), String> {
    let deadline = Instant::now() + BROWSER_DEADLINE;
    loop {
        let (_, body) = try_call(api, reqwest::Method::GET, &format!("/v2/instances/{id}")).await?;
        match body["status"].as_str() {
            Some("running") => return Ok(()),
            Some("failed" | "stopped") => return Err(format!("{id} ended: {body}")),
            _ if Instant::now() > deadline => return Err(format!("{id} never ran: {body}")),
            _ => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

/// Every instance record, by id, in full (the list leaves out `snapshot_id`).
async fn records(api: &Api) -> BTreeMap<String, Value> {
    let (status, page) = api.get("/v2/instances?limit=1000").await;
    assert_eq!(status, StatusCode::OK, "{page}");
    let mut records = BTreeMap::new();
    for summary in page["instances"].as_array().expect("a list") {
        let id = summary["id"].as_str().unwrap().to_owned();
        let (status, detail) = api.get(&format!("/v2/instances/{id}")).await;
        if status == StatusCode::OK {
            records.insert(id, detail);
        }
    }
    records
}

fn status_of(record: &Value) -> &str {
    record["status"].as_str().unwrap_or_default()
}

/// What is wrong with the fleet now (empty when it is consistent).
async fn violations(
    fleet: &Fleet,
    snapshots: &Snapshots,
    ledger: &Ledger,
    records: &BTreeMap<String, Value>,
) -> Vec<String> {
    let mut wrong = Vec::new();
    for id in ledger.created.difference(&ledger.deleted) {
        if !records.contains_key(id) {
            wrong.push(format!(
                "{id}: answered 201, never deleted, but has no record"
            ));
        }
    }
    let instances_dir = fleet.instances_dir();
    let mut owned = BTreeSet::new();
    for (id, record) in records {
        let status = status_of(record);
        let browser = browser_processes(&instances_dir.join(id));
        let runs = matches!(status, "running" | "idle");
        match (runs, browser.is_empty()) {
            (true, true) => {
                let mentioning: Vec<_> = flotilla_testkit::processes_mentioning(id)
                    .into_iter()
                    .map(|pid| {
                        let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
                        format!(
                            "{pid}: {}",
                            String::from_utf8_lossy(&cmd[..cmd.len().min(300)]).replace('\0', " ")
                        )
                    })
                    .collect();
                wrong.push(format!("{id} is {status} without a browser under {}: {record}; processes naming it: {mentioning:?}", instances_dir.display()))
            }
            (false, false) => wrong.push(format!(
                "{id} is {status} but its browser runs: {browser:?}"
            )),
            _ => {}
        }
        if runs {
            owned.extend(browser);
        }
        if matches!(status, "creating" | "reviving") {
            wrong.push(format!("{id} is still {status}: {record}"));
        }
        let snapshot = record["snapshot_id"].as_str();
        if status == "dormant" && snapshot.is_none() {
            wrong.push(format!("{id} is dormant without a snapshot: {record}"));
        }
        if let Some(snapshot) = snapshot
            && !runs
            && !snapshots.exists(id, snapshot).await
        {
            wrong.push(format!(
                "{id} is {status} with snapshot {snapshot}, which does not exist"
            ));
        }
    }
    let orphans: Vec<_> = browser_processes(&instances_dir)
        .into_iter()
        .filter(|pid| !owned.contains(pid))
        .collect();
    if !orphans.is_empty() {
        wrong.push(format!(
            "browser processes without a running record: {orphans:?}"
        ));
    }
    wrong
}

/// Waits (generously) until the restarted fleet is consistent; fails naming
/// what is still wrong.
async fn check_consistent(
    fleet: &Fleet,
    snapshots: &Snapshots,
    receiver: &EventReceiver,
    ledger: &Ledger,
    round: usize,
) {
    let api = fleet.api().clone();
    let outcome = wait_until(
        Duration::from_secs(90),
        &format!("a consistent fleet after round {round}"),
        || async {
            let records = records(&api).await;
            let wrong = violations(fleet, snapshots, ledger, &records).await;
            if wrong.is_empty() {
                Ok(Some(()))
            } else {
                Err(wrong.join("\n"))
            }
        },
    )
    .await;
    if let Err(error) = outcome {
        // The temp dir goes with the test: keep the processes' logs.
        let kept = std::env::temp_dir().join(format!("crash-rounds-logs-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&kept);
        for log in ["serve", "control", "agent"] {
            let from = fleet.root.join(format!("{log}.stderr.log"));
            let _ = std::fs::copy(&from, kept.join(format!("{log}.stderr.log")));
        }
        // Each instance the error names, with the events it went through.
        let mut history = String::new();
        for event in receiver.events() {
            let data = &event.payload["data"];
            if let Some(id) = data["instance_id"].as_str()
                && error.to_string().contains(id)
            {
                history.push_str(&format!(
                    "{id} {} {} {} {}\n",
                    event.payload["timestamp"],
                    event.payload["event"],
                    data["status"],
                    data["reason"]
                ));
            }
        }
        panic!(
            "{error}\nlogs kept in {}\nevents:\n{history}",
            kept.display()
        );
    }
}

/// Before a round: the dormant and failed instances that offer a snapshot
/// are revived (their snapshot must work), surplus ended records deleted,
/// and at least two instances run and one is dormant.
async fn prepare(api: &Api, ledger: &Arc<Mutex<Ledger>>) {
    let all = records(api).await;
    let mut revives = Vec::new();
    for (id, record) in &all {
        let status = status_of(record);
        if matches!(status, "failed" | "stopped") && record["snapshot_id"].is_string() {
            revives.push(run_op(
                api.clone(),
                Op::Revive,
                Some(id.clone()),
                ledger.clone(),
            ));
        }
    }
    for outcome in futures_util::future::join_all(revives).await {
        outcome.expect("a failed or stopped instance that offers its snapshot revives");
    }
    let ended: Vec<_> = all
        .iter()
        .filter(|(_, r)| matches!(status_of(r), "failed" | "stopped") && r["snapshot_id"].is_null())
        .map(|(id, _)| id.clone())
        .collect();
    for id in ended.iter().skip(2) {
        run_op(api.clone(), Op::Delete, Some(id.clone()), ledger.clone())
            .await
            .expect("an ended instance is deleted");
    }
    loop {
        let all = records(api).await;
        let count = |s: &str| all.values().filter(|r| status_of(r) == s).count();
        let (running, dormant) = (count("running"), count("dormant"));
        if dormant == 0 && running > 0 {
            let id = all
                .iter()
                .find(|(_, r)| status_of(r) == "running")
                .unwrap()
                .0;
            run_op(api.clone(), Op::Park, Some(id.clone()), ledger.clone())
                .await
                .expect("a running instance parks");
        } else if running < 2 {
            run_op(api.clone(), Op::Create, None, ledger.clone())
                .await
                .expect("an instance is created");
        } else {
            return;
        }
    }
}

/// The operations a round runs at once: a create, a park, a revive and a
/// delete (of a running instance, else of an ended one).
fn plan(all: &BTreeMap<String, Value>) -> Vec<(Op, Option<String>)> {
    let with = |statuses: &[&str]| {
        all.iter()
            .filter(|(_, r)| statuses.contains(&status_of(r)))
            .map(|(id, _)| id.clone())
            .collect::<Vec<_>>()
    };
    let running = with(&["running"]);
    let dormant = with(&["dormant"]);
    let ended = with(&["failed", "stopped"]);
    let mut ops = vec![(Op::Create, None)];
    ops.push((Op::Park, running.first().cloned()));
    ops.push((Op::Revive, dormant.first().cloned()));
    // A running one: its delete stops a browser, long enough to be cut off.
    ops.push((Op::Delete, running.get(1).or(ended.first()).cloned()));
    ops.into_iter()
        .filter(|(op, id)| matches!(op, Op::Create) || id.is_some())
        .collect()
}

async fn crash_rounds(
    fleet: &mut Fleet,
    snapshots: &Snapshots,
    receiver: &EventReceiver,
    victim: Victim,
    rounds: usize,
) -> Ledger {
    let mut schedule = Schedule::new(&format!("{victim:?}"));
    let ledger = Arc::new(Mutex::new(Ledger::default()));
    for round in 0..rounds {
        let api = fleet.api().clone();
        prepare(&api, &ledger).await;
        let ops = plan(&records(&api).await);
        let started: Vec<_> = ops
            .iter()
            .map(|(op, id)| {
                let task = tokio::spawn(run_op(api.clone(), *op, id.clone(), ledger.clone()));
                (*op, task)
            })
            .collect();
        // Half the kills land in the first 300 ms, where most steps are short.
        let window = if schedule.below(2) == 0 { 300 } else { 1500 };
        tokio::time::sleep(Duration::from_millis(schedule.below(window))).await;
        fleet.kill(victim).await;
        for (op, task) in started {
            if !task.is_finished() {
                *ledger
                    .lock()
                    .unwrap()
                    .interrupted
                    .entry(op.name())
                    .or_default() += 1;
            }
            task.abort();
        }
        fleet.restart(victim).await;
        let settled = ledger.lock().unwrap().clone();
        check_consistent(fleet, snapshots, receiver, &settled, round).await;
    }
    Arc::try_unwrap(ledger)
        .map_err(|_| ())
        .expect("no task holds the ledger")
        .into_inner()
        .unwrap()
}

/// Deletes every instance, waits for the outbox to empty, stops the fleet,
/// and compares each instance's events in the store with what the receiver
/// got (first arrival of each `webhook-id`).
async fn check_webhooks(fleet: &mut Fleet, receiver: &EventReceiver, ids: &BTreeSet<String>) {
    let api = fleet.api().clone();
    for id in records(&api).await.keys() {
        api.delete_instance(id).await;
    }
    api.wait_outbox_empty(Duration::from_secs(120)).await;
    fleet.stop_gracefully().await;
    assert_eq!(receiver.bad_signatures(), 0);
    let mut received: HashMap<String, Vec<Value>> = HashMap::new();
    let mut seen = BTreeSet::new();
    for event in receiver.events() {
        if seen.insert(event.id.clone())
            && let Some(instance) = event.payload["data"]["instance_id"].as_str()
        {
            received
                .entry(instance.to_owned())
                .or_default()
                .push(event.payload);
        }
    }
    let store = flotilla_control_plane::Store::connect(&fleet.database_url, 1)
        .await
        .unwrap();
    for id in ids {
        let stored: Vec<Value> = store
            .events_of(id)
            .await
            .unwrap()
            .iter()
            .map(|p| serde_json::from_str(p).unwrap())
            .collect();
        assert!(!stored.is_empty(), "{id} has events in the store");
        let got = received.remove(id).unwrap_or_default();
        assert_eq!(
            got, stored,
            "instance {id}: the receiver's events (left) are the store's, in order (right)"
        );
    }
}

fn write_webhook_config(root: &Path, receiver: &EventReceiver) {
    std::fs::write(
        root.join("webhooks.toml"),
        format!(
            "[[webhooks]]\nurl = \"{}\"\nsecret = \"{SECRET}\"\n",
            receiver.url
        ),
    )
    .unwrap();
}

/// Runs the rounds for each victim in turn, then checks the webhooks.
async fn run(
    fleet: &mut Fleet,
    snapshots: &Snapshots,
    receiver: &EventReceiver,
    victims: &[Victim],
) {
    let mut ids = BTreeSet::new();
    for &victim in victims {
        let ledger = crash_rounds(fleet, snapshots, receiver, victim, rounds()).await;
        eprintln!(
            "{victim:?}: {} rounds, {} instances created, operations cut off by the kill: {:?}",
            rounds(),
            ledger.created.len(),
            ledger.interrupted
        );
        // A schedule that never cut an operation off tested nothing.
        if rounds() >= 20 {
            for op in ["create", "park", "revive", "delete"] {
                let cut = ledger.interrupted.get(op).copied().unwrap_or(0);
                assert!(cut >= 3, "{victim:?}: only {cut} {op}s were cut off");
            }
        }
        ids.extend(ledger.created);
    }
    ids.extend(records(fleet.api()).await.into_keys());
    check_webhooks(fleet, receiver, &ids).await;
}

#[tokio::test]
async fn browser_serve_on_sqlite_survives_kill_9_at_any_moment() {
    let temp = tempfile::tempdir().unwrap();
    let receiver = EventReceiver::start(SECRET).await;
    write_webhook_config(temp.path(), &receiver);
    let snapshots = Snapshots::Dir(temp.path().join("snapshots"));
    let database = format!("sqlite://{}/store.db", temp.path().display());
    let mut fleet = Fleet::start(temp.path(), false, database, snapshots.env()).await;
    run(&mut fleet, &snapshots, &receiver, &[Victim::Serve]).await;
}

#[tokio::test]
async fn browser_serve_on_postgres_and_s3_survives_kill_9_at_any_moment() {
    let temp = tempfile::tempdir().unwrap();
    let postgres = PgServer::start().await.unwrap();
    let database = postgres.database().await.unwrap();
    let receiver = EventReceiver::start(SECRET).await;
    write_webhook_config(temp.path(), &receiver);
    let snapshots = Snapshots::S3 {
        server: Box::new(S3Server::start("crash-rounds").await.unwrap()),
        prefix: "fleet".into(),
    };
    let mut fleet = Fleet::start(temp.path(), false, database, snapshots.env()).await;
    run(&mut fleet, &snapshots, &receiver, &[Victim::Serve]).await;
}

#[tokio::test]
async fn browser_a_cluster_survives_kill_9_of_its_agent_and_of_its_control_plane() {
    let temp = tempfile::tempdir().unwrap();
    let receiver = EventReceiver::start(SECRET).await;
    write_webhook_config(temp.path(), &receiver);
    let snapshots = Snapshots::Dir(temp.path().join("snapshots"));
    let database = format!("sqlite://{}/store.db", temp.path().display());
    let mut fleet = Fleet::start(temp.path(), true, database, snapshots.env()).await;
    run(
        &mut fleet,
        &snapshots,
        &receiver,
        &[Victim::Agent, Victim::Control],
    )
    .await;
}

/// An exact crash: the fault point a process reaches during one operation
/// (`crates/api-types/src/faults.rs`), and what happens there.
#[derive(Clone, Copy, Debug)]
struct Fault {
    op: Op,
    point: &'static str,
    /// The process that reaches the point.
    at: Victim,
    crash: Crash,
}

#[derive(Clone, Copy, Debug)]
enum Crash {
    /// The process holds at the point while the control plane is killed,
    /// and goes on once it has started again and the node has registered
    /// with it.
    ControlKilledMeanwhile,
    /// The process dies at the point, as `kill -9` would leave it.
    DiesThere,
}

const fn fault(op: Op, point: &'static str, at: Victim, crash: Crash) -> Fault {
    Fault {
        op,
        point,
        at,
        crash,
    }
}

/// The node holds each operation while the control plane that sent it is
/// killed and started again. The revive is the crash of the report (a seed
/// of the cluster's rounds): before operations had identities, the node
/// said `dormant`, the control plane undid the revive, the node finished it
/// anyway and deleted the snapshot: a record `dormant` with no snapshot and
/// a browser nobody owned.
const NODE_HOLDS_WHILE_THE_CONTROL_PLANE_DIES: [Fault; 4] = [
    fault(
        Op::Create,
        "agent-create-received",
        Victim::Agent,
        Crash::ControlKilledMeanwhile,
    ),
    fault(
        Op::Park,
        "agent-park-received",
        Victim::Agent,
        Crash::ControlKilledMeanwhile,
    ),
    fault(
        Op::Revive,
        "agent-revive-received",
        Victim::Agent,
        Crash::ControlKilledMeanwhile,
    ),
    fault(
        Op::Delete,
        "agent-delete-received",
        Victim::Agent,
        Crash::ControlKilledMeanwhile,
    ),
];

/// The control plane dies between its record and the node's answer (create,
/// revive), or between the node's answer and its record (park, delete).
const THE_CONTROL_PLANE_DIES_MID_OPERATION: [Fault; 4] = [
    fault(
        Op::Create,
        "control-create-recorded",
        Victim::Control,
        Crash::DiesThere,
    ),
    fault(
        Op::Park,
        "control-park-answered",
        Victim::Control,
        Crash::DiesThere,
    ),
    fault(
        Op::Revive,
        "control-revive-recorded",
        Victim::Control,
        Crash::DiesThere,
    ),
    fault(
        Op::Delete,
        "control-delete-answered",
        Victim::Control,
        Crash::DiesThere,
    ),
];

/// The node's agent dies as each operation reaches it.
const THE_AGENT_DIES_AS_AN_OPERATION_ARRIVES: [Fault; 4] = [
    fault(
        Op::Create,
        "agent-create-received",
        Victim::Agent,
        Crash::DiesThere,
    ),
    fault(
        Op::Park,
        "agent-park-received",
        Victim::Agent,
        Crash::DiesThere,
    ),
    fault(
        Op::Revive,
        "agent-revive-received",
        Victim::Agent,
        Crash::DiesThere,
    ),
    fault(
        Op::Delete,
        "agent-delete-received",
        Victim::Agent,
        Crash::DiesThere,
    ),
];

/// Runs `fault` on a fresh cluster: prepares the instance the operation
/// works on, runs the operation into the fault, starts the dead process
/// again (without the fault), and checks that the fleet is whole and that
/// every instance can still be revived and deleted, the delete retried.
async fn crash_exactly(fault: Fault) {
    eprintln!("crash: {fault:?}");
    let started = Instant::now();
    let temp = tempfile::tempdir().unwrap();
    let receiver = EventReceiver::start(SECRET).await;
    write_webhook_config(temp.path(), &receiver);
    let snapshots = Snapshots::Dir(temp.path().join("snapshots"));
    let database = format!("sqlite://{}/store.db", temp.path().display());
    let release = temp.path().join("release");
    let action = match fault.crash {
        Crash::ControlKilledMeanwhile => format!("until:{}", release.display()),
        Crash::DiesThere => "exit".to_owned(),
    };
    let mut env = snapshots.env();
    env.push((
        "FLOTILLA_FAULTS".into(),
        format!("{}={action}", fault.point),
    ));
    let mut fleet = Fleet::start(temp.path(), true, database, env).await;
    let api = fleet.api().clone();
    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let target = match fault.op {
        Op::Create => None,
        Op::Park | Op::Revive | Op::Delete => {
            let (id, _, _) = api.create_running("{}").await;
            ledger.lock().unwrap().created.insert(id.clone());
            if matches!(fault.op, Op::Revive) {
                api.park(&id).await;
                api.wait_for_status(&id, "dormant", BROWSER_DEADLINE).await;
            }
            Some(id)
        }
    };
    let operation = tokio::spawn(run_op(api.clone(), fault.op, target, ledger.clone()));
    let log = temp.path().join(match fault.at {
        Victim::Agent => "agent.stderr.log",
        Victim::Serve | Victim::Control => "control.stderr.log",
    });
    let reached = format!("fault point {}", fault.point);
    wait_until(BROWSER_DEADLINE, &reached, || async {
        let log = std::fs::read_to_string(&log).unwrap_or_default();
        Ok::<_, String>(log.contains(&reached).then_some(()))
    })
    .await
    .unwrap();
    let victim = match fault.crash {
        Crash::ControlKilledMeanwhile => Victim::Control,
        Crash::DiesThere => fault.at,
    };
    let control_log = temp.path().join("control.stderr.log");
    let registrations = || {
        std::fs::read_to_string(&control_log)
            .unwrap_or_default()
            .matches("node registered")
            .count()
    };
    let registered_before = registrations();
    fleet.kill(victim).await;
    fleet.env.retain(|(name, _)| name != "FLOTILLA_FAULTS");
    fleet.restart(victim).await;
    if matches!(fault.crash, Crash::ControlKilledMeanwhile) {
        // The node registers with the new control plane while it still
        // holds the operation; then it goes on.
        wait_until(BROWSER_DEADLINE, "the node to register again", || async {
            Ok::<_, String>((registrations() > registered_before).then_some(()))
        })
        .await
        .unwrap();
        std::fs::write(&release, b"").unwrap();
    }
    // The caller's answer, whatever it was (an error when the control
    // plane died under it); given up after the deadline.
    let operation = operation.abort_handle();
    let answered = wait_until(BROWSER_DEADLINE, "the operation's caller", || async {
        Ok::<_, String>(operation.is_finished().then_some(()))
    });
    if answered.await.is_err() {
        operation.abort();
    }

    let api = fleet.api().clone();
    let ledger = ledger.lock().unwrap().clone();
    let whole = |ledger: Ledger| {
        let (fleet, snapshots, api) = (&fleet, &snapshots, &api);
        async move {
            let wrong = violations(fleet, snapshots, &ledger, &records(api).await).await;
            if wrong.is_empty() {
                Ok(Some(()))
            } else {
                Err(wrong.join("\n"))
            }
        }
    };
    let checked = format!("a whole fleet after {fault:?}");
    wait_until(BROWSER_DEADLINE, &checked, || whole(ledger.clone()))
        .await
        .unwrap_or_else(|error| panic!("{error}\n{}", log_tail(&temp.path().join("control"))));

    // Nothing is torn: every instance left can still be revived (its
    // snapshot works), and deleted, twice.
    for (id, record) in records(&api).await {
        if record["snapshot_id"].is_string() && status_of(&record) != "running" {
            run_op(api.clone(), Op::Revive, Some(id.clone()), Arc::default())
                .await
                .unwrap_or_else(|error| panic!("{id} revives after {fault:?}: {error}"));
        }
        for attempt in 0..2 {
            let (status, body) = api.delete(&format!("/v2/instances/{id}")).await;
            assert!(
                status == StatusCode::OK || (attempt == 1 && status == StatusCode::NOT_FOUND),
                "delete {attempt} of {id} after {fault:?}: {status} {body}"
            );
        }
    }
    let nothing_left = Ledger::default();
    wait_until(BROWSER_DEADLINE, "no record and no browser", || async {
        let left = records(&api).await;
        let mut wrong = violations(&fleet, &snapshots, &nothing_left, &left).await;
        wrong.extend(snapshot_files(&temp.path().join("snapshots")));
        if left.is_empty() && wrong.is_empty() {
            Ok(Some(()))
        } else {
            Err(format!("{left:?} {wrong:?}"))
        }
    })
    .await
    .unwrap();
    fleet.stop_gracefully().await;
    eprintln!("crash: {fault:?}: whole in {:?}", started.elapsed());
}

/// Snapshot files under `dir` (none once every instance is deleted).
fn snapshot_files(dir: &Path) -> Vec<String> {
    let mut found = Vec::new();
    for instance in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        for file in std::fs::read_dir(instance.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            found.push(format!("snapshot left: {}", file.path().display()));
        }
    }
    found
}

#[cfg(feature = "fault-points")]
#[tokio::test]
async fn browser_a_control_plane_killed_while_its_node_works_loses_nothing() {
    for fault in NODE_HOLDS_WHILE_THE_CONTROL_PLANE_DIES {
        crash_exactly(fault).await;
    }
}

#[cfg(feature = "fault-points")]
#[tokio::test]
async fn browser_a_control_plane_dying_mid_operation_loses_nothing() {
    for fault in THE_CONTROL_PLANE_DIES_MID_OPERATION {
        crash_exactly(fault).await;
    }
}

#[cfg(feature = "fault-points")]
#[tokio::test]
async fn browser_an_agent_dying_as_an_operation_arrives_loses_nothing() {
    for fault in THE_AGENT_DIES_AS_AN_OPERATION_ARRIVES {
        crash_exactly(fault).await;
    }
}
