//! The Prometheus text exposition format (version 0.0.4), written by hand:
//! counters, gauges and fixed-bucket histograms on plain atomics, shared by
//! the control plane's and the event proxy's `GET /metrics`.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

/// The `Content-Type` of the exposition.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

#[derive(Default)]
pub struct Counter(AtomicU64);

impl Counter {
    pub fn inc(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }

    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }

    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

#[derive(Default)]
pub struct Gauge(AtomicI64);

impl Gauge {
    pub fn inc(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }

    pub fn dec(&self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }

    pub fn set(&self, value: i64) {
        self.0.store(value, Ordering::Relaxed);
    }

    pub fn get(&self) -> i64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Bucket bounds (seconds) for request and call latencies: 100 µs to 5 s.
pub const LATENCY_BOUNDS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
];

/// Bucket bounds (seconds) for slow operations (browser launch, park, revive): 10 ms to 2 min.
pub const OPERATION_BOUNDS: &[f64] = &[
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
];

/// A histogram of durations with fixed buckets (seconds).
pub struct Histogram {
    bounds: &'static [f64],
    counts: Vec<AtomicU64>,
    sum_micros: AtomicU64,
    count: AtomicU64,
}

impl Default for Histogram {
    fn default() -> Self {
        Self::with_bounds(LATENCY_BOUNDS)
    }
}

impl Histogram {
    pub fn with_bounds(bounds: &'static [f64]) -> Self {
        Self {
            bounds,
            counts: bounds.iter().map(|_| AtomicU64::new(0)).collect(),
            sum_micros: AtomicU64::new(0),
            count: AtomicU64::new(0),
        }
    }

    pub fn observe(&self, duration: Duration) {
        let seconds = duration.as_secs_f64();
        if let Some(index) = self.bounds.iter().position(|b| seconds <= *b) {
            self.counts[index].fetch_add(1, Ordering::Relaxed);
        }
        self.sum_micros
            .fetch_add(duration.as_micros() as u64, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// The `_bucket`, `_sum` and `_count` series; `labels` is `a="x",b="y"` or empty.
    pub fn render_series(&self, name: &str, labels: &str, out: &mut String) {
        let sep = if labels.is_empty() { "" } else { "," };
        let mut cumulative = 0;
        for (bound, count) in self.bounds.iter().zip(&self.counts) {
            cumulative += count.load(Ordering::Relaxed);
            let _ = writeln!(
                out,
                "{name}_bucket{{{labels}{sep}le=\"{bound}\"}} {cumulative}"
            );
        }
        let total = self.count.load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {total}");
        let braces = |labels: &str| {
            if labels.is_empty() {
                String::new()
            } else {
                format!("{{{labels}}}")
            }
        };
        let _ = writeln!(
            out,
            "{name}_sum{} {}",
            braces(labels),
            self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6
        );
        let _ = writeln!(out, "{name}_count{} {total}", braces(labels));
    }

    /// HELP, TYPE and the unlabelled series.
    pub fn render(&self, name: &str, help: &str, out: &mut String) {
        header(out, name, help, "histogram");
        self.render_series(name, "", out);
    }
}

/// The `# HELP` and `# TYPE` lines of a family.
pub fn header(out: &mut String, name: &str, help: &str, kind: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

/// A label value with `\`, `"` and newlines escaped.
pub fn escape_label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_series_carry_labels() {
        let histogram = Histogram::default();
        histogram.observe(Duration::from_micros(300));
        let mut out = String::new();
        histogram.render_series("x_seconds", "route=\"/a\"", &mut out);
        assert!(
            out.contains("x_seconds_bucket{route=\"/a\",le=\"0.0005\"} 1"),
            "{out}"
        );
        assert!(out.contains("x_seconds_count{route=\"/a\"} 1"), "{out}");
        assert_eq!(escape_label("a\"b\\"), "a\\\"b\\\\");
    }
}
