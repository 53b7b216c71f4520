//! Shared helpers of the benchmark programs: starting a `flotilla serve`
//! process, percentiles, and a small report format.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context as _, bail};
use flotilla_node_agent::config::BASE_CHROMIUM_FLAGS;
use std::time::Instant;
use tokio::io::{AsyncBufReadExt, BufReader};

/// A `flotilla serve` child process.
pub struct ServeProcess {
    pub child: tokio::process::Child,
    pub url: String,
}

impl ServeProcess {
    pub async fn start(
        binary: &Path,
        data_dir: &Path,
        config: Option<&Path>,
    ) -> anyhow::Result<Self> {
        Self::start_listening(binary, data_dir, config, "127.0.0.1:0").await
    }

    /// [`ServeProcess::start`] with the control plane on `listen` (for a
    /// `public_url` known before the start).
    pub async fn start_listening(
        binary: &Path,
        data_dir: &Path,
        config: Option<&Path>,
        listen: &str,
    ) -> anyhow::Result<Self> {
        let mut command = tokio::process::Command::new(binary);
        command
            .args(["serve", "--listen", listen, "--data-dir"])
            .arg(data_dir)
            // FLOTILLA_BENCH_LOG: the serve's log filter (`warn` unless set).
            .env(
                "RUST_LOG",
                std::env::var("FLOTILLA_BENCH_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        if let Some(config) = config {
            command.arg("--config").arg(config);
        }
        let mut child = command
            .spawn()
            .with_context(|| format!("cannot start {}", binary.display()))?;
        let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        let url = tokio::time::timeout(Duration::from_secs(60), async {
            while let Some(line) = lines.next_line().await? {
                if let Some(url) = line.strip_prefix("control plane listening on ") {
                    return anyhow::Ok(url.trim().to_owned());
                }
            }
            bail!("flotilla exited before listening")
        })
        .await??;
        // The rest of the serve's output goes to the bench's stderr.
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                eprintln!("{line}");
            }
        });
        Ok(Self { child, url })
    }

    /// SIGTERM and wait: browsers are closed gracefully.
    pub async fn stop(mut self) {
        if let Some(pid) = self.child.id() {
            // SAFETY: kill has no memory-safety preconditions.
            unsafe { libc::kill(pid as i32, libc::SIGTERM) };
        }
        let _ = tokio::time::timeout(Duration::from_secs(60), self.child.wait()).await;
    }
}

impl Drop for ServeProcess {
    /// A benchmark that fails half-way still stops its serve gracefully (a
    /// SIGKILL would leave its browsers running).
    fn drop(&mut self) {
        let Some(pid) = self.child.id() else { return };
        // SAFETY: kill has no memory-safety preconditions.
        unsafe { libc::kill(pid as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// The `q`-quantile (0..=1) of `samples` (nearest rank).
pub fn percentile(samples: &[f64], q: f64) -> f64 {
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// Medians of `steps` over `samples` (objects of milliseconds), and of
/// their sum last.
pub fn step_medians(samples: &[&serde_json::Value], steps: &[&str]) -> Vec<f64> {
    let mut row: Vec<f64> = steps
        .iter()
        .map(|step| {
            let values: Vec<f64> = samples.iter().filter_map(|s| s[*step].as_f64()).collect();
            percentile(&values, 0.5)
        })
        .collect();
    let totals: Vec<f64> = samples
        .iter()
        .map(|s| steps.iter().filter_map(|step| s[*step].as_f64()).sum())
        .collect();
    row.push(percentile(&totals, 0.5));
    row
}

pub fn mean(samples: &[f64]) -> f64 {
    samples.iter().sum::<f64>() / samples.len() as f64
}

/// One line of a results table: name, p50, p95, mean, min, max (milliseconds).
pub fn summary_row(name: &str, samples_ms: &[f64]) -> String {
    let min = samples_ms.iter().copied().fold(f64::INFINITY, f64::min);
    let max = samples_ms.iter().copied().fold(0.0, f64::max);
    format!(
        "| {name} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} |",
        samples_ms.len(),
        percentile(samples_ms, 0.5),
        percentile(samples_ms, 0.95),
        mean(samples_ms),
        min,
        max
    )
}

/// `| name | n | p50 | p99 | last |` with three decimals; `last` is what the
/// table's last column shows (a mean or a maximum).
pub fn p50_p99_row(name: &str, samples: &[f64], last: f64) -> String {
    format!(
        "| {name} | {} | {:.3} | {:.3} | {last:.3} |",
        samples.len(),
        percentile(samples, 0.5),
        percentile(samples, 0.99),
    )
}

/// Stops the stream readers a bench started.
pub fn abort_all<T>(readers: Vec<tokio::task::JoinHandle<T>>) {
    for reader in readers {
        reader.abort();
    }
}

/// Writes `flotilla.toml` in `dir` for a `serve` with authentication on
/// (`key` its one API key) answering at `http://127.0.0.1:{port}`, then
/// `rest` (its own sections); answers the file's path.
pub fn keyed_config(
    dir: &std::path::Path,
    key: &str,
    port: u16,
    rest: &str,
) -> std::io::Result<std::path::PathBuf> {
    let config = dir.join("flotilla.toml");
    std::fs::write(
        &config,
        format!(
            "auth_enabled = true\napi_keys = [{key:?}]\npublic_url = \"http://127.0.0.1:{port}\"\n{rest}"
        ),
    )?;
    Ok(config)
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Chromium started by hand: the same executable and base flags as Flotilla, a
/// fixed `--remote-debugging-port`, `GET /json/version` polled every 2 ms.
/// Returns milliseconds from spawn to the first answer; kills it afterwards.
pub async fn raw_chromium_start(
    executable: &str,
    extra: &[String],
    http: &reqwest::Client,
) -> anyhow::Result<f64> {
    let profile = tempfile::tempdir()?;
    let port = free_port();
    let started = Instant::now();
    let mut command = tokio::process::Command::new(executable);
    command
        .args(BASE_CHROMIUM_FLAGS)
        .args(extra)
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg(format!("--remote-debugging-port={port}"))
        .arg("--window-size=1280,720")
        .arg("--no-sandbox")
        .arg("about:blank")
        .env("HOME", profile.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0);
    let mut child = command.spawn()?;
    let url = format!("http://127.0.0.1:{port}/json/version");
    let elapsed = loop {
        if let Ok(response) = http.get(&url).send().await
            && response.status().is_success()
        {
            break started.elapsed();
        }
        if started.elapsed() > Duration::from_secs(30) {
            bail!("raw chromium did not answer in 30 s");
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    };
    if let Some(pid) = child.id() {
        // SAFETY: killpg has no memory-safety preconditions.
        unsafe { libc::killpg(pid as i32, libc::SIGKILL) };
    }
    let _ = child.wait().await;
    Ok(elapsed.as_secs_f64() * 1000.0)
}

/// The text after `name` on the command line (`--image ubuntu:22.04`), or `default`.
pub fn text_flag(name: &str, default: &str) -> anyhow::Result<String> {
    let args: Vec<String> = std::env::args().collect();
    match args.iter().position(|a| a == name) {
        Some(i) => args
            .get(i + 1)
            .cloned()
            .with_context(|| format!("{name} needs a value")),
        None => Ok(default.to_owned()),
    }
}

/// The number after `name` on the command line (`--events 20000`), or `default`.
pub fn number_flag(name: &str, default: usize) -> anyhow::Result<usize> {
    text_flag(name, &default.to_string())?
        .parse()
        .with_context(|| format!("{name} must be a number"))
}

/// `MemAvailable` of this machine, in MiB.
/// CPU seconds (user + system) used so far by `pids` (those still running).
pub fn cpu_seconds(pids: &[u32]) -> f64 {
    // SAFETY: sysconf has no memory-safety preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    pids.iter()
        .filter_map(|pid| std::fs::read_to_string(format!("/proc/{pid}/stat")).ok())
        .filter_map(|stat| {
            let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
            Some(fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?)
        })
        .sum::<f64>()
        / ticks
}

pub fn mem_available_mib() -> f64 {
    std::fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .unwrap_or(0.0)
        / 1024.0
}

/// VmRSS of process `pid`, in KiB (0 if it is gone).
pub fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// Raises the open-file limit to its hard maximum (a process holding
/// thousands of streams, and the servers it starts, which inherit it).
pub fn raise_open_files() {
    // SAFETY: getrlimit/setrlimit read and write a local struct only.
    unsafe {
        let mut limit = std::mem::zeroed::<libc::rlimit>();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 {
            limit.rlim_cur = limit.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
}

/// `flotilla proxy` (release build, `--binary` to change) on a free loopback
/// port: authentication off, publisher key `key`, rate limit out of the way,
/// no stream lifetime.
pub async fn start_event_proxy(
    key: &str,
) -> anyhow::Result<(tokio::process::Child, u16, tempfile::TempDir)> {
    let binary = text_flag("--binary", "target/release/flotilla")?;
    let dir = tempfile::tempdir()?;
    let port = free_port();
    let config = dir.path().join("proxy.toml");
    std::fs::write(
        &config,
        format!(
            "[http]\nbind_address = \"127.0.0.1:{port}\"\nmax_connections = 19900\n\
             keepalive_interval_sec = 15\nconnection_timeout_sec = 0\n\
             [jwt_verifier]\nrequire_authentication = false\n\
             [publisher]\napi_keys = [\"{key}\"]\n[rate_limit]\nrate_limit_per_ip = 100000000\n"
        ),
    )?;
    let child = tokio::process::Command::new(&binary)
        .args(["proxy", "--config"])
        .arg(&config)
        .env("RUST_LOG", "warn")
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("cannot start {binary}"))?;
    wait_listening(port, "the event proxy").await?;
    Ok((child, port, dir))
}

/// Waits (30 s at most) until something accepts connections on `port`.
pub async fn wait_listening(port: u16, what: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        if Instant::now() > deadline {
            bail!("{what} does not listen on port {port}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// Opens `GET /events/{topic}` on `port` and reads the response head (200).
pub async fn open_sse_stream(port: u16, topic: &str) -> anyhow::Result<tokio::net::TcpStream> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    stream
        .write_all(
            format!(
                "GET /events/{topic} HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\n\r\n"
            )
            .as_bytes(),
        )
        .await?;
    let mut head = Vec::with_capacity(512);
    let mut buffer = [0u8; 512];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let read = stream.read(&mut buffer).await?;
        if read == 0 {
            bail!("the server closed the stream before answering");
        }
        head.extend_from_slice(&buffer[..read]);
    }
    if !head.starts_with(b"HTTP/1.1 200") {
        bail!("{}", String::from_utf8_lossy(&head));
    }
    Ok(stream)
}

/// Creates an instance with `body`: the create's answer.
pub async fn create(
    http: &reqwest::Client,
    base: &str,
    body: &str,
) -> anyhow::Result<serde_json::Value> {
    Ok(http
        .post(format!("{base}/v2/instances"))
        .body(body.to_owned())
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?)
}

/// Creates an instance with `body` and waits until it runs (see
/// [`wait_running`]); the create's answer.
pub async fn create_running(
    http: &reqwest::Client,
    base: &str,
    body: &str,
    poll: Duration,
) -> anyhow::Result<serde_json::Value> {
    let created = create(http, base, body).await?;
    let id = created["id"].as_str().context("id")?;
    wait_running(http, base, id, poll).await?;
    Ok(created)
}

/// Creates an instance with `body`, times the first answer of its
/// `/json/version` through the gateway, then deletes it: milliseconds from
/// the create to that answer.
pub async fn create_to_cdp(http: &reqwest::Client, base: &str, body: &str) -> anyhow::Result<f64> {
    let started = Instant::now();
    let created = create(http, base, body).await?;
    let port = created["debug_port"].as_u64().context("debug_port")?;
    let response = http
        .get(format!("http://127.0.0.1:{port}/json/version"))
        .send()
        .await?;
    if !response.status().is_success() {
        bail!("gateway answered {}", response.status());
    }
    let elapsed = started.elapsed().as_secs_f64() * 1000.0;
    let id = created["id"].as_str().context("id")?;
    http.delete(format!("{base}/v2/instances/{id}?force=true"))
        .send()
        .await?
        .error_for_status()?;
    Ok(elapsed)
}

/// `GET url` read as JSON (any status: callers look at the body).
pub async fn get_json(http: &reqwest::Client, url: String) -> anyhow::Result<serde_json::Value> {
    Ok(http.get(url).send().await?.json().await?)
}

/// A client that sends `Authorization: Bearer <key>` with every request.
pub fn client_with_key(key: &str) -> anyhow::Result<reqwest::Client> {
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert(
        reqwest::header::AUTHORIZATION,
        format!("Bearer {key}").parse()?,
    );
    Ok(reqwest::Client::builder()
        .no_proxy()
        .default_headers(headers)
        .timeout(Duration::from_secs(120))
        .build()?)
}

/// Waits (120 s at most, polling every `poll`) until instance `id` is
/// `running`; its detail. A `failed` or `stopped` instance is an error.
pub async fn wait_running(
    http: &reqwest::Client,
    base: &str,
    id: &str,
    poll: Duration,
) -> anyhow::Result<serde_json::Value> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let detail: serde_json::Value = http
            .get(format!("{base}/v2/instances/{id}"))
            .send()
            .await?
            .json()
            .await?;
        match detail["status"].as_str() {
            Some("running") => return Ok(detail),
            Some("failed" | "stopped") => bail!("instance failed: {detail}"),
            _ if Instant::now() > deadline => bail!("not running after 120 s: {detail}"),
            _ => tokio::time::sleep(poll).await,
        }
    }
}

/// A page session of one instance, over its `urls.debug`, for timed
/// navigations.
pub struct Tab {
    client: flotilla_node_agent::engine::cdp::CdpClient,
    session: String,
}

const CDP_TIMEOUT: Duration = Duration::from_secs(60);

impl Tab {
    /// A new blank tab, attached, with page events on.
    pub async fn open(debug_url: &str) -> anyhow::Result<Self> {
        use serde_json::json;
        let client = flotilla_node_agent::engine::cdp::CdpClient::connect(debug_url).await?;
        let (_, session) = client.open_tab("about:blank", CDP_TIMEOUT).await?;
        client
            .call("Page.enable", json!({}), Some(&session), CDP_TIMEOUT)
            .await?;
        Ok(Self { client, session })
    }

    /// Milliseconds from `Page.navigate` to `Page.loadEventFired`.
    pub async fn load(&self, url: &str) -> anyhow::Result<f64> {
        let mut events = self.client.events();
        let started = Instant::now();
        let answer = self
            .client
            .navigate(&self.session, url, CDP_TIMEOUT)
            .await?;
        if let Some(error) = answer.get("errorText").and_then(|e| e.as_str())
            && !error.is_empty()
        {
            bail!("{url}: {error}");
        }
        loop {
            let event = tokio::time::timeout(CDP_TIMEOUT, events.recv())
                .await
                .context("no load event within 60 s")??;
            if event.method == "Page.loadEventFired"
                && event.session_id.as_deref() == Some(self.session.as_str())
            {
                return Ok(started.elapsed().as_secs_f64() * 1000.0);
            }
        }
    }

    /// Sends any CDP command on this tab's session; its result.
    pub async fn call(
        &self,
        method: &str,
        params: serde_json::Value,
    ) -> anyhow::Result<serde_json::Value> {
        Ok(self
            .client
            .call(method, params, Some(&self.session), CDP_TIMEOUT)
            .await?)
    }

    /// Evaluates `expression` (awaiting promises); its value.
    pub async fn eval(&self, expression: &str) -> anyhow::Result<serde_json::Value> {
        let result = self
            .client
            .call(
                "Runtime.evaluate",
                serde_json::json!({"expression": expression, "awaitPromise": true, "returnByValue": true}),
                Some(&self.session),
                Duration::from_secs(120),
            )
            .await?;
        if let Some(exception) = result.get("exceptionDetails") {
            bail!("script threw: {exception}");
        }
        Ok(result["result"]["value"].clone())
    }
}

/// Serves `html` at `/` on a loopback port: its base URL.
pub async fn serve_html(html: String) -> anyhow::Result<String> {
    let router = axum::Router::new().route(
        "/",
        axum::routing::get(move || async move { axum::response::Html(html) }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    Ok(base)
}

/// Runs `bench/js/<script>` with Node, `options` as its one argument: the
/// JSON it prints (its progress goes to this process's stderr).
pub async fn run_node_script(
    script: &str,
    options: &serde_json::Value,
) -> anyhow::Result<serde_json::Value> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("js")
        .join(script);
    let output = tokio::process::Command::new("node")
        .arg(&path)
        .arg(options.to_string())
        .stderr(Stdio::inherit())
        .output()
        .await
        .context("node runs (scripts/install-deps --test installs it)")?;
    if !output.status.success() {
        bail!("{script} failed");
    }
    Ok(serde_json::from_slice(&output.stdout)?)
}

/// Frames an MJPEG viewer of `url` (a live view's `/`) reads in `seconds`,
/// as fast as it can.
pub async fn mjpeg_frames(url: String, seconds: u64) -> anyhow::Result<usize> {
    let mut response = reqwest::get(&url).await?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(seconds);
    let mut frames: usize = 0;
    let mut carry = Vec::new();
    while let Ok(chunk) = tokio::time::timeout_at(deadline, response.chunk()).await {
        let Some(chunk) = chunk? else { break };
        carry.extend_from_slice(&chunk);
        while let Some(pos) = carry.windows(15).position(|w| w == b"--flotillaframe") {
            frames += 1;
            carry.drain(..pos + 15);
        }
    }
    // The stream opens with a boundary; each frame is closed by the next one.
    Ok(frames.saturating_sub(1))
}
