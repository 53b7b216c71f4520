//! The control plane's own measurements, rendered with the store's gauges at
//! `GET /metrics` (Prometheus text format): `service_instances_total{status}`
//! and `service_node_cpu_percent{node}` (spec), HTTP request latency per route,
//! create/dormant/revive durations, webhook deliveries and failures, and the
//! outbox depth.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::time::Duration;

use flotilla_api_types::agent::WarmPoolReport;
use flotilla_api_types::prometheus::{Counter, Histogram, OPERATION_BOUNDS, escape_label, header};

/// Latency of one route (method and matched path) and status class.
type RouteKey = (String, String, &'static str);

pub struct Telemetry {
    http: Mutex<BTreeMap<RouteKey, std::sync::Arc<Histogram>>>,
    pub create_duration: OperationHistogram,
    pub dormant_duration: OperationHistogram,
    pub revive_duration: OperationHistogram,
    /// Per target: deliveries that reached it.
    deliveries: Mutex<BTreeMap<String, std::sync::Arc<DeliveryCounters>>>,
    /// Time to sign one webhook body.
    pub signing: Histogram,
    /// How long creates with `wait_sec` spent in the queue.
    pub create_queue_wait: Histogram,
    /// REST actions: per action and outcome, how many ended so.
    actions: Mutex<BTreeMap<(&'static str, &'static str), u64>>,
    /// REST actions: per action, request to answer (queue wait included).
    action_duration: Mutex<BTreeMap<&'static str, std::sync::Arc<Histogram>>>,
}

impl Default for Telemetry {
    fn default() -> Self {
        Self {
            http: Mutex::default(),
            create_duration: OperationHistogram::default(),
            dormant_duration: OperationHistogram::default(),
            revive_duration: OperationHistogram::default(),
            deliveries: Mutex::default(),
            signing: Histogram::default(),
            create_queue_wait: Histogram::with_bounds(OPERATION_BOUNDS),
            actions: Mutex::default(),
            action_duration: Mutex::default(),
        }
    }
}

/// Launch-to-running durations.
pub struct OperationHistogram(pub Histogram);

impl Default for OperationHistogram {
    fn default() -> Self {
        Self(Histogram::with_bounds(OPERATION_BOUNDS))
    }
}

#[derive(Default)]
pub struct DeliveryCounters {
    pub delivered: Counter,
    pub failed_attempts: Counter,
    pub dropped: Counter,
    /// Whether the latest attempt failed (health reports the link down).
    pub failing: std::sync::atomic::AtomicBool,
}

/// Values read from the store at scrape time.
pub struct Gauges {
    pub instances_by_status: Vec<(String, i64)>,
    pub node_cpu: Vec<(String, f64)>,
    /// Per node, its warm pools (one per image) as last reported.
    pub warm_pools: Vec<(String, WarmPoolReport)>,
    pub outbox_depth: i64,
    /// Creates waiting in the queue now.
    pub create_queue_length: usize,
    /// The background tasks' records.
    pub background: Vec<flotilla_api_types::health::BackgroundTaskHealth>,
    /// The online nodes' agents' loops, by node.
    pub node_loops: Vec<(String, flotilla_api_types::health::BackgroundTaskHealth)>,
}

/// 2xx, 4xx, 5xx …
fn status_class(status: u16) -> &'static str {
    match status {
        100..=199 => "1xx",
        200..=299 => "2xx",
        300..=399 => "3xx",
        400..=499 => "4xx",
        _ => "5xx",
    }
}

impl Telemetry {
    pub fn observe_request(&self, method: &str, route: &str, status: u16, took: Duration) {
        let key = (method.to_owned(), route.to_owned(), status_class(status));
        let histogram = self
            .http
            .lock()
            .expect("telemetry lock")
            .entry(key)
            .or_default()
            .clone();
        histogram.observe(took);
    }

    /// One REST action that ended with `outcome` after `took`.
    pub fn observe_action(&self, action: &'static str, outcome: &'static str, took: Duration) {
        *self
            .actions
            .lock()
            .expect("telemetry lock")
            .entry((action, outcome))
            .or_default() += 1;
        let histogram = self
            .action_duration
            .lock()
            .expect("telemetry lock")
            .entry(action)
            .or_insert_with(|| std::sync::Arc::new(Histogram::with_bounds(OPERATION_BOUNDS)))
            .clone();
        histogram.observe(took);
    }

    /// The delivery counters of `target` (a webhook URL or `proxy`).
    pub fn deliveries(&self, target: &str) -> std::sync::Arc<DeliveryCounters> {
        self.deliveries
            .lock()
            .expect("telemetry lock")
            .entry(target.to_owned())
            .or_default()
            .clone()
    }

    pub fn render(&self, gauges: &Gauges) -> String {
        let mut out = String::with_capacity(8192);
        render_gauges(gauges, &mut out);
        self.render_durations(&mut out);
        self.render_deliveries(&mut out);
        self.render_actions(&mut out);
        out
    }

    /// REST actions: outcomes (counter) and durations (histogram), per action.
    fn render_actions(&self, out: &mut String) {
        header(
            out,
            "service_actions_total",
            "REST actions that ended, per action and outcome.",
            "counter",
        );
        for ((action, outcome), count) in self.actions.lock().expect("telemetry lock").iter() {
            let _ = writeln!(
                out,
                "service_actions_total{{action=\"{action}\",outcome=\"{outcome}\"}} {count}"
            );
        }
        header(
            out,
            "service_action_duration_seconds",
            "REST actions, from request to answer (waiting for room included), per action.",
            "histogram",
        );
        for (action, histogram) in self.action_duration.lock().expect("telemetry lock").iter() {
            histogram.render_series(
                "service_action_duration_seconds",
                &format!("action=\"{action}\""),
                out,
            );
        }
    }

    /// Request latencies and lifecycle durations (histograms).
    fn render_durations(&self, out: &mut String) {
        header(
            out,
            "service_http_request_duration_seconds",
            "HTTP request latency by method, route and status class.",
            "histogram",
        );
        for ((method, route, class), histogram) in self.http.lock().expect("telemetry lock").iter()
        {
            let labels = format!(
                "method=\"{}\",route=\"{}\",status=\"{class}\"",
                escape_label(method),
                escape_label(route)
            );
            histogram.render_series("service_http_request_duration_seconds", &labels, out);
        }
        self.create_duration.0.render(
            "service_instance_create_duration_seconds",
            "From create request to running.",
            out,
        );
        self.dormant_duration.0.render(
            "service_instance_dormant_duration_seconds",
            "Duration of parks (snapshot and stop).",
            out,
        );
        self.revive_duration.0.render(
            "service_instance_revive_duration_seconds",
            "From revive request to running.",
            out,
        );
        self.create_queue_wait.render(
            "service_create_queue_wait_seconds",
            "Time creates with wait_sec spent in the queue (until placed, refused or gone).",
            out,
        );
        self.signing.render(
            "service_webhook_signing_duration_seconds",
            "Time to sign one webhook body.",
            out,
        );
    }

    /// Webhook and proxy deliveries, per target (counters).
    fn render_deliveries(&self, out: &mut String) {
        let deliveries = self.deliveries.lock().expect("telemetry lock");
        for (name, help, value) in [
            (
                "service_webhook_deliveries_total",
                "Events delivered, per target.",
                (|c: &DeliveryCounters| c.delivered.get()) as fn(&DeliveryCounters) -> u64,
            ),
            (
                "service_webhook_failures_total",
                "Failed delivery attempts (each is retried), per target.",
                |c| c.failed_attempts.get(),
            ),
            (
                "service_webhook_dropped_total",
                "Events given up after webhook_delivery.give_up_after_hours, per target.",
                |c| c.dropped.get(),
            ),
        ] {
            header(out, name, help, "counter");
            for (target, counters) in deliveries.iter() {
                let _ = writeln!(
                    out,
                    "{name}{{target=\"{}\"}} {}",
                    escape_label(target),
                    value(counters)
                );
            }
        }
    }
}

/// Instances per status, nodes' CPU, the outbox and the create queue.
fn render_gauges(gauges: &Gauges, out: &mut String) {
    header(
        out,
        "service_instances_total",
        "Instances per status.",
        "gauge",
    );
    for (status, count) in &gauges.instances_by_status {
        let _ = writeln!(
            out,
            "service_instances_total{{status=\"{}\"}} {count}",
            escape_label(status)
        );
    }
    header(
        out,
        "service_node_cpu_percent",
        "CPU use of each node, percent.",
        "gauge",
    );
    for (node, cpu) in &gauges.node_cpu {
        let _ = writeln!(
            out,
            "service_node_cpu_percent{{node=\"{}\"}} {cpu}",
            escape_label(node)
        );
    }
    header(
        out,
        "service_warm_pool_ready",
        "Warm browsers ready on each node, by the image its pool serves.",
        "gauge",
    );
    for (node, pool) in &gauges.warm_pools {
        let _ = writeln!(
            out,
            "service_warm_pool_ready{{node=\"{}\",image=\"{}\"}} {}",
            escape_label(node),
            escape_label(&pool.image),
            pool.ready
        );
    }
    render_warm_takes(gauges, out);
    header(
        out,
        "service_outbox_depth",
        "Event deliveries waiting in the outbox (all targets).",
        "gauge",
    );
    let _ = writeln!(out, "service_outbox_depth {}", gauges.outbox_depth);
    header(
        out,
        "service_create_queue_length",
        "Creates waiting for room (POST /v2/instances?wait_sec=).",
        "gauge",
    );
    let _ = writeln!(
        out,
        "service_create_queue_length {}",
        gauges.create_queue_length
    );
    render_background(&gauges.background, out);
    render_node_loops(&gauges.node_loops, out);
}

/// Runs of each node agent's loops by outcome, and whether its last run
/// failed.
fn render_node_loops(
    loops: &[(String, flotilla_api_types::health::BackgroundTaskHealth)],
    out: &mut String,
) {
    header(
        out,
        "service_node_loop_runs_total",
        "Runs of each node agent's loops (heartbeat, state change, wake, warm pool refill) since the agent started: ok or failed.",
        "counter",
    );
    for (node, task) in loops {
        let (node, name) = (escape_label(node), escape_label(&task.name));
        let ok = task.runs - task.failures;
        for (outcome, count) in [("ok", ok), ("failed", task.failures)] {
            let _ = writeln!(
                out,
                "service_node_loop_runs_total{{node=\"{node}\",loop=\"{name}\",outcome=\"{outcome}\"}} {count}"
            );
        }
    }
    header(
        out,
        "service_node_loop_failing",
        "1 while a node agent's loop's last run failed.",
        "gauge",
    );
    for (node, task) in loops {
        let _ = writeln!(
            out,
            "service_node_loop_failing{{node=\"{}\",loop=\"{}\"}} {}",
            escape_label(node),
            escape_label(&task.name),
            u8::from(task.failing)
        );
    }
}

/// Creates and revives that took a warm browser, or not, per node and image.
fn render_warm_takes(gauges: &Gauges, out: &mut String) {
    /// A counter's name, help, and a pool's hits and misses for it.
    type Takes = (&'static str, &'static str, fn(&WarmPoolReport) -> [u64; 2]);
    let takes: [Takes; 2] = [
        (
            "service_warm_pool_creates_total",
            "Creates on each node since its agent started, by the image of its warm pool: hit (took a warm browser) or miss (launched its own).",
            |pool| [pool.hits, pool.misses],
        ),
        (
            "service_warm_pool_revives_total",
            "Revives on each node since its agent started, by the image of its warm pool: hit (took a warm browser) or miss (launched on the snapshot's files).",
            |pool| [pool.revive_hits, pool.revive_misses],
        ),
    ];
    for (name, help, counts) in takes {
        header(out, name, help, "counter");
        for (node, pool) in &gauges.warm_pools {
            for (outcome, count) in ["hit", "miss"].into_iter().zip(counts(pool)) {
                let _ = writeln!(
                    out,
                    "{name}{{node=\"{}\",image=\"{}\",outcome=\"{outcome}\"}} {count}",
                    escape_label(node),
                    escape_label(&pool.image)
                );
            }
        }
    }
}

/// Runs per background task and outcome, work running now, and each
/// task's last run.
fn render_background(tasks: &[flotilla_api_types::health::BackgroundTaskHealth], out: &mut String) {
    header(
        out,
        "service_background_runs_total",
        "Runs of each background task: ok, failed, or skipped (another control plane holds its lease).",
        "counter",
    );
    for task in tasks {
        let name = escape_label(&task.name);
        let ok = task.runs - task.failures;
        for (outcome, count) in [
            ("ok", ok),
            ("failed", task.failures),
            ("skipped", task.skipped),
        ] {
            let _ = writeln!(
                out,
                "service_background_runs_total{{task=\"{name}\",outcome=\"{outcome}\"}} {count}"
            );
        }
    }
    header(
        out,
        "service_background_running",
        "Pieces of background work running now, per task.",
        "gauge",
    );
    for task in tasks {
        let _ = writeln!(
            out,
            "service_background_running{{task=\"{}\"}} {}",
            escape_label(&task.name),
            task.running
        );
    }
    header(
        out,
        "service_background_last_run_timestamp_seconds",
        "When each timed background task last ran (Unix seconds).",
        "gauge",
    );
    for task in tasks {
        if let Some(at) = task.last_run_at {
            let _ = writeln!(
                out,
                "service_background_last_run_timestamp_seconds{{task=\"{}\"}} {}",
                escape_label(&task.name),
                at.timestamp()
            );
        }
    }
}
