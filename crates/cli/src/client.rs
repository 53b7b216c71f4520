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
use serde_json::{Value, json};

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
        method: Option<String>,
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

    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value, ClientError> {
        let url = format!("{}{path}", self.base);
        let mut request = self
            .http
            .request(method, &url)
            .timeout(Duration::from_secs(330));
        if let Some(key) = &self.key {
            request = request.bearer_auth(key);
        }
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.map_err(|e| ClientError::Unreachable {
            url: self.base.clone(),
            reason: e.without_url().to_string(),
        })?;
        let status = response.status();
        let text = response.text().await.unwrap_or_default();
        let value: Value = serde_json::from_str(&text).unwrap_or(Value::String(text));
        if status.is_success() {
            Ok(value)
        } else {
            Err(ClientError::Api {
                status: status.as_u16(),
                detail: value["detail"].as_str().unwrap_or("(no detail)").to_owned(),
                code: value["code"].as_str().unwrap_or("unknown").to_owned(),
            })
        }
    }

    async fn get(&self, path: &str) -> Result<Value, ClientError> {
        self.call(reqwest::Method::GET, path, None).await
    }

    fn print_json(&self, value: &Value) {
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
                let mut query = form_query(&[
                    ("limit", Some(limit.to_string())),
                    ("offset", Some(offset.to_string())),
                ]);
                query.push_str(&form_query(&[
                    ("status", status),
                    ("node_id", node),
                    ("sort", sort),
                ]));
                let page = self
                    .get(&format!("/v2/instances?{}", query.trim_start_matches('&')))
                    .await?;
                if self.json {
                    self.print_json(&page);
                    return Ok(());
                }
                let rows: Vec<Vec<String>> = page["instances"]
                    .as_array()
                    .map(|items| {
                        items
                            .iter()
                            .map(|i| {
                                vec![
                                    text(&i["id"]),
                                    text(&i["status"]),
                                    text(&i["node_id"]),
                                    format!(
                                        "{:.1}",
                                        i["resources"]["cpu_percent"].as_f64().unwrap_or(0.0)
                                    ),
                                    format!(
                                        "{:.0}",
                                        i["resources"]["memory_mb"].as_f64().unwrap_or(0.0)
                                    ),
                                    text(&i["created_at"]),
                                ]
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                print_table(
                    &["ID", "STATUS", "NODE", "CPU %", "MEMORY MB", "CREATED"],
                    &rows,
                );
                println!("{} of {} instances", rows.len(), page["total"]);
                Ok(())
            }
            InstancesCommand::Get { id } => {
                let instance = self
                    .get(&format!("/v2/instances/{}", path_segment(&id)?))
                    .await?;
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
                let mut config = serde_json::Map::new();
                if let Some(v) = memory_gb {
                    config.insert("memory_gb".into(), json!(v));
                }
                if let Some(v) = cpu_cores {
                    config.insert("cpu_cores".into(), json!(v));
                }
                if let Some(v) = idle_timeout_minutes {
                    config.insert("idle_timeout_minutes".into(), json!(v));
                }
                let mut body = serde_json::Map::new();
                if let Some(image) = image {
                    body.insert("image".into(), json!(image));
                }
                if !config.is_empty() {
                    body.insert("config".into(), Value::Object(config));
                }
                if let Some(node) = node {
                    body.insert("node_preference".into(), json!(node));
                }
                let created = self
                    .call(
                        reqwest::Method::POST,
                        "/v2/instances",
                        Some(Value::Object(body)),
                    )
                    .await?;
                let id = text(&created["id"]);
                if wait {
                    let instance = self.wait_running(&id).await?;
                    self.print_instance(&instance);
                } else {
                    self.print_instance(&created);
                }
                Ok(())
            }
            InstancesCommand::Delete { id, force } => {
                let path = format!("/v2/instances/{}?force={force}", path_segment(&id)?);
                let answer = self.call(reqwest::Method::DELETE, &path, None).await?;
                if self.json {
                    self.print_json(&answer)
                } else {
                    println!("{}", text(&answer["message"]))
                }
                Ok(())
            }
            InstancesCommand::Dormant { id } => {
                let path = format!("/v2/instances/{}/dormant", path_segment(&id)?);
                let answer = self.call(reqwest::Method::POST, &path, None).await?;
                self.print_instance(&answer);
                Ok(())
            }
            InstancesCommand::Revive { id, method, wait } => {
                let path = format!("/v2/instances/{}/revive", path_segment(&id)?);
                let body = method.map(|m| json!({ "method": m }));
                let answer = self.call(reqwest::Method::POST, &path, body).await?;
                if wait {
                    let instance = self.wait_running(&id).await?;
                    self.print_instance(&instance);
                } else {
                    self.print_instance(&answer);
                }
                Ok(())
            }
        }
    }

    /// Polls until the instance runs, printing each status change on stderr.
    async fn wait_running(&self, id: &str) -> Result<Value, ClientError> {
        let started = Instant::now();
        let mut last = String::new();
        loop {
            let instance = self
                .get(&format!("/v2/instances/{}", path_segment(id)?))
                .await?;
            let status = text(&instance["status"]);
            if status != last {
                eprintln!(
                    "[{:>5.1} s] {id}: {status}",
                    started.elapsed().as_secs_f64()
                );
                let _ = std::io::stderr().flush();
                last = status.clone();
            }
            match status.as_str() {
                "running" => return Ok(instance),
                "failed" | "stopped" | "dormant" if started.elapsed() > Duration::from_secs(1) => {
                    return Err(ClientError::Api {
                        status: 409,
                        detail: format!(
                            "instance {id} is {status}: {}",
                            instance["status_reason"]
                                .as_str()
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

    fn print_instance(&self, instance: &Value) {
        if self.json {
            self.print_json(instance);
            return;
        }
        let mut rows = Vec::new();
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
            if !instance[key].is_null() {
                rows.push(vec![key.to_owned(), text(&instance[key])]);
            }
        }
        if let Some(urls) = instance["urls"].as_object() {
            for (name, url) in urls {
                rows.push(vec![format!("urls.{name}"), text(url)]);
            }
        }
        if let Some(resources) = instance["resources"].as_object() {
            for (name, value) in resources {
                rows.push(vec![format!("resources.{name}"), text(value)]);
            }
        }
        print_table(&["FIELD", "VALUE"], &rows);
    }

    pub async fn nodes(&self, command: NodesCommand) -> Result<(), ClientError> {
        match command {
            NodesCommand::List => {
                let list = self.get("/v2/nodes").await?;
                if self.json {
                    self.print_json(&list);
                    return Ok(());
                }
                let rows: Vec<Vec<String>> = list["nodes"]
                    .as_array()
                    .map(|nodes| {
                        nodes
                            .iter()
                            .map(|n| {
                                vec![
                                    text(&n["id"]),
                                    text(&n["status"]),
                                    format!("{}/{}", n["instances_count"], n["max_instances"]),
                                    format!(
                                        "{:.1}",
                                        n["resources"]["cpu_percent"].as_f64().unwrap_or(0.0)
                                    ),
                                    format!(
                                        "{:.1}",
                                        n["resources"]["memory_percent"].as_f64().unwrap_or(0.0)
                                    ),
                                    text(&n["address"]),
                                ]
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                print_table(
                    &["ID", "STATUS", "INSTANCES", "CPU %", "MEMORY %", "ADDRESS"],
                    &rows,
                );
                Ok(())
            }
            NodesCommand::Get { id } => {
                let node = self
                    .get(&format!("/v2/nodes/{}", path_segment(&id)?))
                    .await?;
                if self.json {
                    self.print_json(&node);
                    return Ok(());
                }
                let mut rows = Vec::new();
                flatten("", &node, &mut rows);
                print_table(&["FIELD", "VALUE"], &rows);
                Ok(())
            }
        }
    }

    pub async fn metrics(&self, args: MetricsArgs) -> Result<(), ClientError> {
        let query = form_query(&[("period", args.period), ("node_id", args.node)]);
        let metrics = self
            .get(&format!("/v2/metrics?{}", query.trim_start_matches('&')))
            .await?;
        if self.json {
            self.print_json(&metrics);
            return Ok(());
        }
        let mut rows = Vec::new();
        flatten("cluster", &metrics["cluster"], &mut rows);
        flatten("resources", &metrics["resources"], &mut rows);
        let series = &metrics["timeseries"];
        rows.push(vec![
            "timeseries".into(),
            format!(
                "{} points every {}",
                series["timestamps"].as_array().map_or(0, Vec::len),
                text(&series["interval"])
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
            let token = self
                .call(
                    reqwest::Method::POST,
                    "/v2/tokens",
                    Some(json!({ "topics": [topic], "ttl_sec": 3600 })),
                )
                .await?;
            let events_url = token["events_url"]
                .as_str()
                .map(str::to_owned)
                .ok_or_else(|| {
                    ClientError::Usage(
                        "this control plane publishes to no event proxy (set [events] proxy_url)"
                            .into(),
                    )
                })?;
            let mut request = self
                .http
                .get(format!(
                    "{}/events/{topic}",
                    events_url.trim_end_matches('/')
                ))
                .bearer_auth(text(&token["token"]));
            if let Some(id) = &last_id {
                request = request.header("Last-Event-ID", id);
            }
            let mut response = request.send().await.map_err(|e| ClientError::Unreachable {
                url: events_url.clone(),
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
            let mut buffer = String::new();
            let (mut event, mut data, mut id) =
                (String::new(), Vec::<String>::new(), None::<String>);
            while let Ok(Some(chunk)) = response.chunk().await {
                buffer.push_str(&String::from_utf8_lossy(&chunk));
                while let Some(end) = buffer.find('\n') {
                    let line: String = buffer.drain(..=end).collect();
                    let line = line.trim_end_matches(['\n', '\r']);
                    if line.is_empty() {
                        if !data.is_empty() {
                            self.print_event(&event, &data.join("\n"));
                            if id.is_some() {
                                last_id = id.take();
                            }
                        }
                        (event, data) = (String::new(), Vec::new());
                    } else if let Some(v) = line.strip_prefix("event:") {
                        event = v.trim_start().to_owned();
                    } else if let Some(v) = line.strip_prefix("data:") {
                        data.push(v.strip_prefix(' ').unwrap_or(v).to_owned());
                    } else if let Some(v) = line.strip_prefix("id:") {
                        id = Some(v.trim_start().to_owned());
                    }
                }
            }
            eprintln!("event stream ended; reconnecting");
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
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
