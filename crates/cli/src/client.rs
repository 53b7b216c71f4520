//! The client commands (`flotilla instances|nodes|metrics|events …`): calls to
//! the public API at `FLOTILLA_URL` (default `http://127.0.0.1:8080`) with
//! `FLOTILLA_API_KEY` when set; human tables by default, `--json` for scripts.
//!
//! Exit codes: 0 success; 1 the API answered an error (`{detail, code}` is
//! printed); 2 usage error (clap's, or a bad argument); 3 the server could not
//! be reached.

use std::io::Write as _;
use std::time::{Duration, Instant};

use clap::{Args, Subcommand};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use flotilla_api_types::instances::{
    CreateInstanceRequest, Instance, InstanceConfig, InstanceList, InstanceStatus, ReviveMethod,
    ReviveRequest,
};
use flotilla_api_types::metrics::MetricsResponse;
use flotilla_api_types::nodes::{Node, NodeList};
use flotilla_api_types::tokens::{TokenRequest, TokenResponse};
use flotilla_api_types::{MessageResponse, NodeId};

/// What went wrong, and so which exit code.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("{0}")]
    Usage(String),
    #[error("{status}: {detail} ({code})")]
    Api {
        status: u16,
        detail: String,
        code: String,
    },
    #[error("cannot reach {url}: {reason}")]
    Unreachable { url: String, reason: String },
}

impl ClientError {
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::Api { .. } => 1,
            Self::Usage(_) => 2,
            Self::Unreachable { .. } => 3,
        }
    }
}

#[derive(Args)]
pub struct Output {
    /// Print the API's JSON instead of a table.
    #[arg(long, global = true)]
    json: bool,
}

#[derive(Subcommand, Clone)]
pub enum InstancesCommand {
    /// List instances (newest first).
    List {
        #[arg(long)]
        status: Option<String>,
        #[arg(long)]
        node: Option<String>,
        #[arg(long, default_value_t = 100)]
        limit: i64,
        #[arg(long, default_value_t = 0)]
        offset: i64,
        /// created_at_desc, created_at_asc, memory_desc, cpu_desc
        #[arg(long)]
        sort: Option<String>,
    },
    /// Show one instance.
    Get { id: String },
    /// Create an instance.
    Create {
        #[arg(long)]
        image: Option<String>,
        #[arg(long)]
        memory_gb: Option<f64>,
        #[arg(long)]
        cpu_cores: Option<i64>,
        #[arg(long)]
        idle_timeout_minutes: Option<i64>,
        #[arg(long)]
        node: Option<String>,
        /// Wait until it is running, showing its progress.
        #[arg(long)]
        wait: bool,
    },
    /// Delete an instance.
    Delete {
        id: String,
        /// Kill at once instead of closing the browser gracefully.
        #[arg(long)]
        force: bool,
    },
    /// Park an instance (snapshot and stop).
    Dormant { id: String },
    /// Revive a dormant instance.
    Revive {
        id: String,
        /// quick_start (default) or full_restore
        #[arg(long)]
        method: Option<ReviveMethod>,
        /// Wait until it is running, showing its progress.
        #[arg(long)]
        wait: bool,
    },
}

#[derive(Subcommand, Clone)]
pub enum NodesCommand {
    /// List nodes.
    List,
    /// Show one node.
    Get { id: String },
    /// Drain a node: it takes no new instance and its instances move to
    /// other nodes (parked and revived there with their tabs).
    Drain {
        id: String,
        /// Wait until every instance has moved or stayed, then print the
        /// report.
        #[arg(long)]
        wait: bool,
        /// With --wait: give up waiting after this many seconds.
        #[arg(long, default_value_t = 900)]
        timeout_sec: u64,
        /// End the drain when the node's agent restarts (a new process
        /// registers), as an agent draining itself before it stops wants.
        #[arg(long)]
        until_restart: bool,
    },
    /// End a node's drain: it takes new instances again.
    Uncordon { id: String },
}

#[derive(Subcommand, Clone)]
pub enum EventsCommand {
    /// Follow lifecycle events (through the event proxy) until interrupted.
    Watch {
        /// `instances` (default), `instances.<id>`, `nodes` or `alerts`.
        #[arg(long, default_value = "instances")]
        topic: String,
    },
}

#[derive(Args, Clone)]
pub struct MetricsArgs {
    /// 1h, 24h (default) or 7d.
    #[arg(long)]
    period: Option<String>,
    #[arg(long)]
    node: Option<String>,
}

pub struct Client {
    base: String,
    key: Option<String>,
    http: reqwest::Client,
    json: bool,
}

impl Client {
    pub fn from_env(output: &Output) -> Self {
        Self {
            base: std::env::var("FLOTILLA_URL")
                .unwrap_or_else(|_| "http://127.0.0.1:8080".into())
                .trim_end_matches('/')
                .to_owned(),
            key: std::env::var("FLOTILLA_API_KEY")
                .ok()
                .filter(|k| !k.is_empty()),
            http: reqwest::Client::builder()
                .connect_timeout(Duration::from_secs(5))
                .build()
                .expect("the HTTP client builds"),
            json: output.json,
        }
    }

    /// Calls the API and reads a success into `T`; an error answer becomes
    /// [`ClientError::Api`] with the `{detail, code}` it carried.
    async fn call<T: DeserializeOwned>(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&(impl Serialize + Sync)>,
    ) -> Result<T, ClientError> {
        let url = format!("{}{path}", self.base);
        let mut request = self
            .http
            .request(method, &url)
            .timeout(Duration::from_secs(330));
        if let Some(key) = &self.key {
            request = request.bearer_auth(key);
        }
        if let Some(body) = body {
            request = request.json(body);
        }
        let response = request.send().await.map_err(|e| ClientError::Unreachable {
            url: self.base.clone(),
            reason: e.without_url().to_string(),
        })?;
        let status = response.status();
        let bytes = response.bytes().await.unwrap_or_default();
        if !status.is_success() {
            return Err(api_error(status.as_u16(), &bytes));
        }
        serde_json::from_slice(&bytes).map_err(|e| ClientError::Api {
            status: status.as_u16(),
            detail: format!("the answer of {path} is not what this client expects: {e}"),
            code: "unexpected_response".into(),
        })
    }

    async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, ClientError> {
        self.call(reqwest::Method::GET, path, None::<&()>).await
    }

    fn print_json(&self, value: &impl Serialize) {
        println!(
            "{}",
            serde_json::to_string_pretty(value).unwrap_or_default()
        );
    }

    pub async fn instances(&self, command: InstancesCommand) -> Result<(), ClientError> {
        match command {
            InstancesCommand::List {
                status,
                node,
                limit,
                offset,
                sort,
            } => {
                let query = form_query(&[
                    ("limit", Some(limit.to_string())),
                    ("offset", Some(offset.to_string())),
                    ("status", status),
                    ("node_id", node),
                    ("sort", sort),
                ]);
                self.instance_list(&query).await
            }
            InstancesCommand::Get { id } => {
                let path = format!("/v2/instances/{}", path_segment(&id)?);
                let instance: Instance = self.get(&path).await?;
                self.print_instance(&instance);
                Ok(())
            }
            InstancesCommand::Create {
                image,
                memory_gb,
                cpu_cores,
                idle_timeout_minutes,
                node,
                wait,
            } => {
                let defaults = InstanceConfig::default();
                let config =
                    (memory_gb.is_some() || cpu_cores.is_some() || idle_timeout_minutes.is_some())
                        .then(|| InstanceConfig {
                            memory_gb: memory_gb.unwrap_or(defaults.memory_gb),
                            cpu_cores: cpu_cores.unwrap_or(defaults.cpu_cores),
                            idle_timeout_minutes: idle_timeout_minutes
                                .unwrap_or(defaults.idle_timeout_minutes),
                            ..defaults
                        });
                let request = CreateInstanceRequest {
                    image,
                    config,
                    node_preference: node.map(NodeId::new),
                    profile: None,
                };
                self.instance_create(&request, wait).await
            }
            InstancesCommand::Delete { id, force } => {
                let path = format!("/v2/instances/{}?force={force}", path_segment(&id)?);
                let answer: MessageResponse = self
                    .call(reqwest::Method::DELETE, &path, None::<&()>)
                    .await?;
                if self.json {
                    self.print_json(&answer)
                } else {
                    println!("{}", answer.message)
                }
                Ok(())
            }
            InstancesCommand::Dormant { id } => {
                let path = format!("/v2/instances/{}/dormant", path_segment(&id)?);
                let answer: Instance = self.call(reqwest::Method::POST, &path, None::<&()>).await?;
                self.print_instance(&answer);
                Ok(())
            }
            InstancesCommand::Revive { id, method, wait } => {
                self.instance_revive(&id, method, wait).await
            }
        }
    }

    async fn instance_list(&self, query: &str) -> Result<(), ClientError> {
        let page: InstanceList = self
            .get(&format!("/v2/instances?{}", query.trim_start_matches('&')))
            .await?;
        if self.json {
            self.print_json(&page);
            return Ok(());
        }
        let rows: Vec<Vec<String>> = page
            .instances
            .iter()
            .map(|instance| {
                let resources = instance.resources.unwrap_or_default();
                vec![
                    instance.id.to_string(),
                    instance.status.to_string(),
                    or_dash(instance.node_id.as_ref()),
                    format!("{:.1}", resources.cpu_percent),
                    format!("{:.0}", resources.memory_mb),
                    or_dash(instance.created_at.map(|at| at.to_rfc3339()).as_ref()),
                ]
            })
            .collect();
        print_table(
            &["ID", "STATUS", "NODE", "CPU %", "MEMORY MB", "CREATED"],
            &rows,
        );
        println!("{} of {} instances", rows.len(), page.total);
        Ok(())
    }

    async fn instance_create(
        &self,
        request: &CreateInstanceRequest,
        wait: bool,
    ) -> Result<(), ClientError> {
        let created: Instance = self
            .call(reqwest::Method::POST, "/v2/instances", Some(request))
            .await?;
        if wait {
            let instance = self.wait_running(created.id.as_str()).await?;
            self.print_instance(&instance);
        } else {
            self.print_instance(&created);
        }
        Ok(())
    }

    async fn instance_revive(
        &self,
        id: &str,
        method: Option<ReviveMethod>,
        wait: bool,
    ) -> Result<(), ClientError> {
        let path = format!("/v2/instances/{}/revive", path_segment(id)?);
        let body = method.map(|method| ReviveRequest { method });
        let answer: Instance = self
            .call(reqwest::Method::POST, &path, body.as_ref())
            .await?;
        if wait {
            let instance = self.wait_running(id).await?;
            self.print_instance(&instance);
        } else {
            self.print_instance(&answer);
        }
        Ok(())
    }

    /// Polls until the instance runs, printing each status change on stderr.
    async fn wait_running(&self, id: &str) -> Result<Instance, ClientError> {
        let started = Instant::now();
        let mut last = None;
        loop {
            let instance: Instance = self
                .get(&format!("/v2/instances/{}", path_segment(id)?))
                .await?;
            let status = instance.status;
            if last != Some(status) {
                eprintln!(
                    "[{:>5.1} s] {id}: {status}",
                    started.elapsed().as_secs_f64()
                );
                let _ = std::io::stderr().flush();
                last = Some(status);
            }
            match status {
                InstanceStatus::Running => return Ok(instance),
                InstanceStatus::Failed | InstanceStatus::Stopped | InstanceStatus::Dormant
                    if started.elapsed() > Duration::from_secs(1) =>
                {
                    return Err(ClientError::Api {
                        status: 409,
                        detail: format!(
                            "instance {id} is {status}: {}",
                            instance
                                .status_reason
                                .as_deref()
                                .unwrap_or("no reason given")
                        ),
                        code: "invalid_state".into(),
                    });
                }
                _ => {}
            }
            if started.elapsed() > Duration::from_secs(300) {
                return Err(ClientError::Api {
                    status: 408,
                    detail: format!("instance {id} is still {status} after 300 s"),
                    code: "timeout".into(),
                });
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    fn print_instance(&self, instance: &Instance) {
        if self.json {
            self.print_json(instance);
            return;
        }
        let mut rows = Vec::new();
        let value = serde_json::to_value(instance).unwrap_or_default();
        for key in [
            "id",
            "status",
            "status_reason",
            "node_id",
            "image",
            "created_at",
            "snapshot_id",
            "dormant_since",
            "estimated_completion",
        ] {
            if !value[key].is_null() {
                rows.push(vec![key.to_owned(), text(&value[key])]);
            }
        }
        if let Some(urls) = &instance.urls {
            rows.push(vec!["urls.debug".into(), urls.debug.clone()]);
            rows.push(vec!["urls.stream".into(), urls.stream.clone()]);
        }
        if let Some(resources) = &instance.resources {
            rows.push(vec![
                "resources.cpu_percent".into(),
                resources.cpu_percent.to_string(),
            ]);
            rows.push(vec![
                "resources.memory_mb".into(),
                resources.memory_mb.to_string(),
            ]);
            rows.push(vec![
                "resources.disk_mb".into(),
                resources.disk_mb.to_string(),
            ]);
        }
        print_table(&["FIELD", "VALUE"], &rows);
    }

    pub async fn nodes(&self, command: NodesCommand) -> Result<(), ClientError> {
        match command {
            NodesCommand::List => {
                let list: NodeList = self.get("/v2/nodes").await?;
                if self.json {
                    self.print_json(&list);
                    return Ok(());
                }
                let rows: Vec<Vec<String>> = list
                    .nodes
                    .iter()
                    .map(|node| {
                        vec![
                            node.id.to_string(),
                            node.status.as_str().to_owned(),
                            format!("{}/{}", node.instances_count, node.max_instances),
                            format!("{:.1}", node.resources.cpu_percent),
                            format!("{:.1}", node.resources.memory_percent),
                            node.address.clone(),
                        ]
                    })
                    .collect();
                print_table(
                    &["ID", "STATUS", "INSTANCES", "CPU %", "MEMORY %", "ADDRESS"],
                    &rows,
                );
                Ok(())
            }
            NodesCommand::Get { id } => {
                let node: Node = self
                    .get(&format!("/v2/nodes/{}", path_segment(&id)?))
                    .await?;
                if self.json {
                    self.print_json(&node);
                    return Ok(());
                }
                let mut rows = Vec::new();
                flatten(
                    "",
                    &serde_json::to_value(&node).unwrap_or_default(),
                    &mut rows,
                );
                print_table(&["FIELD", "VALUE"], &rows);
                Ok(())
            }
            NodesCommand::Drain {
                id,
                wait,
                timeout_sec,
                until_restart,
            } => self.drain(&id, wait, timeout_sec, until_restart).await,
            NodesCommand::Uncordon { id } => {
                let node: Node = self
                    .call(
                        reqwest::Method::POST,
                        &format!("/v2/nodes/{}/uncordon", path_segment(&id)?),
                        None::<&()>,
                    )
                    .await?;
                if self.json {
                    self.print_json(&node);
                } else {
                    println!("{} is {}", node.id, node.status.as_str());
                }
                Ok(())
            }
        }
    }

    /// Drains node `id`, waiting (at most `timeout_sec`) for the drain to
    /// finish when `wait`; prints what became of each instance.
    async fn drain(
        &self,
        id: &str,
        wait: bool,
        timeout_sec: u64,
        until_restart: bool,
    ) -> Result<(), ClientError> {
        let segment = path_segment(id)?;
        let mut report: flotilla_api_types::nodes::DrainReport = self
            .call(
                reqwest::Method::POST,
                &format!("/v2/nodes/{segment}/drain?until_restart={until_restart}"),
                None::<&()>,
            )
            .await?;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(timeout_sec);
        while wait && !report.finished && std::time::Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            let node: Node = self.get(&format!("/v2/nodes/{segment}")).await?;
            report = node.drain.unwrap_or(report);
        }
        if self.json {
            self.print_json(&report);
            return Ok(());
        }
        let mut rows: Vec<Vec<String>> = Vec::new();
        for moved in &report.moved {
            rows.push(vec![
                moved.instance_id.to_string(),
                format!("moved to {}", moved.to_node),
            ]);
        }
        for id in &report.moving {
            rows.push(vec![id.to_string(), "moving".to_owned()]);
        }
        for stayed in &report.stayed {
            rows.push(vec![
                stayed.instance_id.to_string(),
                format!("stayed: {}", stayed.reason),
            ]);
        }
        print_table(&["INSTANCE", "OUTCOME"], &rows);
        Ok(())
    }

    pub async fn metrics(&self, args: MetricsArgs) -> Result<(), ClientError> {
        let query = form_query(&[("period", args.period), ("node_id", args.node)]);
        let metrics: MetricsResponse = self
            .get(&format!("/v2/metrics?{}", query.trim_start_matches('&')))
            .await?;
        if self.json {
            self.print_json(&metrics);
            return Ok(());
        }
        let mut rows = Vec::new();
        let value = serde_json::to_value(&metrics).unwrap_or_default();
        flatten("cluster", &value["cluster"], &mut rows);
        flatten("resources", &value["resources"], &mut rows);
        rows.push(vec![
            "timeseries".into(),
            format!(
                "{} points every {}",
                metrics.timeseries.timestamps.len(),
                metrics.timeseries.interval
            ),
        ]);
        print_table(&["METRIC", "VALUE"], &rows);
        Ok(())
    }

    /// Prints events as they arrive: a token from `POST /v2/tokens`, then the
    /// proxy's stream (it says where it is), reconnecting with `Last-Event-ID`.
    pub async fn watch(&self, command: EventsCommand) -> Result<(), ClientError> {
        let EventsCommand::Watch { topic } = command;
        let mut last_id: Option<String> = None;
        loop {
            let request = TokenRequest {
                topics: Some(vec![topic.clone()]),
                ttl_sec: Some(3600),
            };
            let token: TokenResponse = self
                .call(reqwest::Method::POST, "/v2/tokens", Some(&request))
                .await?;
            let events_url = token.events_url.clone().ok_or_else(|| {
                ClientError::Usage(
                    "this control plane publishes to no event proxy (set [events] proxy_url)"
                        .into(),
                )
            })?;
            self.follow_stream(&events_url, &topic, &token.token, &mut last_id)
                .await?;
            eprintln!("event stream ended; reconnecting");
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }

    /// Prints one stream's events until it ends, keeping the last event id.
    async fn follow_stream(
        &self,
        events_url: &str,
        topic: &str,
        token: &str,
        last_id: &mut Option<String>,
    ) -> Result<(), ClientError> {
        let mut request = self
            .http
            .get(format!(
                "{}/events/{topic}",
                events_url.trim_end_matches('/')
            ))
            .bearer_auth(token);
        if let Some(id) = last_id.as_ref() {
            request = request.header("Last-Event-ID", id);
        }
        let mut response = request.send().await.map_err(|e| ClientError::Unreachable {
            url: events_url.to_owned(),
            reason: e.without_url().to_string(),
        })?;
        if !response.status().is_success() {
            let status = response.status().as_u16();
            let detail = response.text().await.unwrap_or_default();
            return Err(ClientError::Api {
                status,
                detail: detail.trim().to_owned(),
                code: "events".into(),
            });
        }
        let mut parser = SseLines::default();
        while let Ok(Some(chunk)) = response.chunk().await {
            for (event, data, id) in parser.feed(&chunk) {
                self.print_event(&event, &data);
                if id.is_some() {
                    *last_id = id;
                }
            }
        }
        Ok(())
    }

    fn print_event(&self, event: &str, data: &str) {
        if self.json {
            println!("{data}");
        } else {
            let payload: Value =
                serde_json::from_str(data).unwrap_or(Value::String(data.to_owned()));
            let subject = payload["data"]["instance_id"]
                .as_str()
                .or(payload["data"]["node_id"].as_str())
                .or(payload["data"]["alert_id"].as_str())
                .unwrap_or("");
            println!(
                "{}  {:<18} {subject}  {}",
                payload["timestamp"].as_str().unwrap_or(""),
                if event.is_empty() { "message" } else { event },
                payload["data"]["status"].as_str().unwrap_or("")
            );
        }
        let _ = std::io::stdout().flush();
    }
}

/// The `{detail, code}` of an error answer, or what can be said without it.
fn api_error(status: u16, body: &[u8]) -> ClientError {
    match serde_json::from_slice::<Value>(body) {
        Ok(value) => ClientError::Api {
            status,
            detail: value["detail"].as_str().unwrap_or("(no detail)").to_owned(),
            code: value["code"].as_str().unwrap_or("unknown").to_owned(),
        },
        Err(_) => ClientError::Api {
            status,
            detail: String::from_utf8_lossy(body).trim().to_owned(),
            code: "unknown".into(),
        },
    }
}

/// Server-sent events read line by line (CR, LF or CRLF end a line).
#[derive(Default)]
struct SseLines {
    buffer: String,
    event: String,
    data: Vec<String>,
    id: Option<String>,
}

impl SseLines {
    /// Takes a chunk and answers the events it completed: (event, data, id).
    fn feed(&mut self, chunk: &[u8]) -> Vec<(String, String, Option<String>)> {
        self.buffer.push_str(&String::from_utf8_lossy(chunk));
        let mut done = Vec::new();
        while let Some(end) = self.buffer.find('\n') {
            let line: String = self.buffer.drain(..=end).collect();
            let line = line.trim_end_matches(['\n', '\r']);
            if line.is_empty() {
                if !self.data.is_empty() {
                    let data = std::mem::take(&mut self.data).join("\n");
                    done.push((std::mem::take(&mut self.event), data, self.id.take()));
                }
                self.event.clear();
            } else if let Some(v) = line.strip_prefix("event:") {
                self.event = v.trim_start().to_owned();
            } else if let Some(v) = line.strip_prefix("data:") {
                self.data.push(v.strip_prefix(' ').unwrap_or(v).to_owned());
            } else if let Some(v) = line.strip_prefix("id:") {
                self.id = Some(v.trim_start().to_owned());
            }
        }
        done
    }
}

fn or_dash(value: Option<&impl std::fmt::Display>) -> String {
    value.map_or_else(|| "-".into(), ToString::to_string)
}

fn text(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        Value::Null => "-".into(),
        other => other.to_string(),
    }
}

/// `&k=v` pairs (URL-encoded) for the present values.
fn form_query(pairs: &[(&str, Option<String>)]) -> String {
    let mut out = String::new();
    for (key, value) in pairs {
        if let Some(value) = value {
            out.push('&');
            out.push_str(key);
            out.push('=');
            out.push_str(
                &url::form_urlencoded::byte_serialize(value.as_bytes()).collect::<String>(),
            );
        }
    }
    out
}

/// An id as a path segment: refused when it would change the path.
fn path_segment(id: &str) -> Result<String, ClientError> {
    if id.is_empty() || id.contains(['/', '?', '#', '%']) || id.chars().any(char::is_whitespace) {
        return Err(ClientError::Usage(format!("{id:?} is not an id")));
    }
    Ok(id.to_owned())
}

fn flatten(prefix: &str, value: &Value, rows: &mut Vec<Vec<String>>) {
    match value {
        Value::Object(map) => {
            for (key, inner) in map {
                let name = if prefix.is_empty() {
                    key.clone()
                } else {
                    format!("{prefix}.{key}")
                };
                flatten(&name, inner, rows);
            }
        }
        other => rows.push(vec![prefix.to_owned(), text(other)]),
    }
}

fn print_table(headers: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let padded: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(cell, width)| format!("{cell:<width$}"))
            .collect();
        println!("{}", padded.join("  ").trim_end());
    };
    line(headers.to_vec());
    for row in rows {
        line(row.iter().map(String::as_str).collect());
    }
}
