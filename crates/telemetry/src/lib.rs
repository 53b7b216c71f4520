//! Flotilla's tracing: this crate owns the process's tracing subscriber
//! (logs to stderr, filtered by `RUST_LOG`) and, when `[telemetry]
//! otlp_endpoint` is set, OpenTelemetry spans exported over OTLP/HTTP.
//!
//! - [`http_span`]: one span per request of an HTTP API (the control
//!   plane's, the agent's), named `METHOD /route/{template}` — never the raw
//!   path or query, which may hold secrets (`/live/{token}`, `?token=`).
//!   It continues the W3C trace context (`traceparent`) the request carries.
//! - [`operation`] and [`traced`]: one span per instance operation (create,
//!   park, revive, delete, a drain's move) with the instance, the node and
//!   the outcome as attributes.
//! - [`trace_headers`]: the current span's context for an outgoing request,
//!   so a create is one trace across the control plane and the agent.
//!
//! Every span has the target [`TARGET`]. The log output never shows them,
//! and without an endpoint no layer wants them: a span then costs one
//! disabled-callsite check, and [`http_span`] passes requests straight on.

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::extract::{MatchedPath, Request};
use axum::middleware::Next;
use axum::response::Response;
use opentelemetry::KeyValue;
use opentelemetry::propagation::TextMapPropagator as _;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{WithExportConfig as _, WithHttpConfig as _};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{ParentBasedSampler, Sampler, SdkTracerProvider, ShouldSample};
use serde::{Deserialize, Serialize};
use tracing::Instrument as _;
use tracing::field::Empty;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;
use tracing_subscriber::Layer as _;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

/// The target of every span this crate makes (and only of those).
pub const TARGET: &str = "flotilla_otel";

/// Whether spans are exported (set once, by [`init`]).
static ENABLED: AtomicBool = AtomicBool::new(false);

/// `[telemetry]`.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TelemetryConfig {
    /// The collector's OTLP/HTTP base URL (`http://collector:4318`; spans
    /// go to `<url>/v1/traces`), or its full traces URL ending in
    /// `/v1/traces`. None: no spans are made or sent.
    pub otlp_endpoint: Option<String>,
    /// Headers sent with every export (a collector's API key). Secret:
    /// never logged.
    pub otlp_headers: BTreeMap<String, String>,
    /// `service.name` of the spans; each process adds its role as
    /// `flotilla.role` (`serve`, `control`, `agent`, `proxy`).
    pub service_name: String,
    /// The share of traces kept, 0..=1, by trace id: also of traces a
    /// caller began, whatever its `traceparent` says.
    pub sample_ratio: f64,
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        Self {
            otlp_endpoint: None,
            otlp_headers: BTreeMap::new(),
            service_name: "flotilla".into(),
            sample_ratio: 1.0,
        }
    }
}

impl fmt::Debug for TelemetryConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let headers: BTreeMap<&str, &str> = self
            .otlp_headers
            .keys()
            .map(|name| (name.as_str(), "<redacted>"))
            .collect();
        f.debug_struct("TelemetryConfig")
            .field("otlp_endpoint", &self.otlp_endpoint)
            .field("otlp_headers", &headers)
            .field("service_name", &self.service_name)
            .field("sample_ratio", &self.sample_ratio)
            .finish()
    }
}

/// A `[telemetry]` setting that cannot be used; the message names its key.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum InvalidTelemetry {
    #[error("telemetry.otlp_endpoint {endpoint:?} is not a URL: {reason}")]
    NotAUrl { endpoint: String, reason: String },
    #[error("telemetry.otlp_endpoint {0:?} must be an http:// or https:// URL with a host")]
    NotHttp(String),
    #[error(
        "telemetry.otlp_headers: {0:?} is not a valid header name, or its value not a valid header value"
    )]
    Header(String),
    #[error("telemetry.service_name must not be empty")]
    NoServiceName,
    #[error("telemetry.sample_ratio must be between 0 and 1, got {0}")]
    SampleRatio(f64),
}

impl TelemetryConfig {
    /// The configuration errors, each naming its key.
    pub fn validate(&self) -> Result<(), InvalidTelemetry> {
        if let Some(endpoint) = &self.otlp_endpoint {
            let url = url::Url::parse(endpoint).map_err(|e| InvalidTelemetry::NotAUrl {
                endpoint: endpoint.clone(),
                reason: e.to_string(),
            })?;
            if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
                return Err(InvalidTelemetry::NotHttp(endpoint.clone()));
            }
        }
        for (name, value) in &self.otlp_headers {
            if http::HeaderName::from_bytes(name.as_bytes()).is_err()
                || http::HeaderValue::from_str(value).is_err()
            {
                return Err(InvalidTelemetry::Header(name.clone()));
            }
        }
        if self.service_name.trim().is_empty() {
            return Err(InvalidTelemetry::NoServiceName);
        }
        if !(0.0..=1.0).contains(&self.sample_ratio) {
            return Err(InvalidTelemetry::SampleRatio(self.sample_ratio));
        }
        Ok(())
    }

    /// Where spans are posted: the endpoint, with `/v1/traces` added to a
    /// base URL.
    pub fn traces_url(&self) -> Option<String> {
        let endpoint = self.otlp_endpoint.as_deref()?;
        Some(if endpoint.trim_end_matches('/').ends_with("/v1/traces") {
            endpoint.to_owned()
        } else {
            format!("{}/v1/traces", endpoint.trim_end_matches('/'))
        })
    }
}

/// The process's telemetry; [`Telemetry::shutdown`] sends the spans still
/// buffered.
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Telemetry {
    /// Exports what is buffered (a few seconds at most) and stops.
    pub fn shutdown(self) {
        if let Some(provider) = self.provider
            && let Err(error) = provider.shutdown()
        {
            eprintln!("flotilla: the last spans were not all exported: {error}");
        }
    }
}

/// The exporter's HTTP client: the workspace's reqwest (rustls, so an
/// `https://` collector works), blocking, on the span processor's own
/// thread; it never follows a proxy from the environment.
#[derive(Debug)]
struct ExportClient(reqwest::blocking::Client);

impl ExportClient {
    fn new() -> anyhow::Result<Self> {
        Ok(Self(
            reqwest::blocking::Client::builder()
                .connect_timeout(Duration::from_secs(5))
                .timeout(Duration::from_secs(10))
                .redirect(reqwest::redirect::Policy::none())
                .no_proxy()
                .build()?,
        ))
    }
}

#[async_trait::async_trait]
impl opentelemetry_http::HttpClient for ExportClient {
    async fn send_bytes(
        &self,
        request: http::Request<bytes::Bytes>,
    ) -> Result<http::Response<bytes::Bytes>, opentelemetry_http::HttpError> {
        let (parts, body) = request.into_parts();
        let answer = self
            .0
            .request(parts.method, parts.uri.to_string())
            .headers(parts.headers)
            .body(body.to_vec())
            .send()?;
        let mut response = http::Response::builder().status(answer.status());
        if let Some(headers) = response.headers_mut() {
            *headers = answer.headers().clone();
        }
        Ok(response.body(answer.bytes()?)?)
    }
}

/// `sample_ratio` of new traces by trace id, and of traces a caller began
/// (whatever its `traceparent` says: a client cannot make every one of its
/// requests exported, nor hide them). A span under a span of this process
/// follows its parent. The decision by trace id is the same in every
/// Flotilla process, so a trace is kept whole or not at all.
fn sampler(ratio: f64) -> ParentBasedSampler {
    let by_trace_id = || Box::new(Sampler::TraceIdRatioBased(ratio)) as Box<dyn ShouldSample>;
    ParentBasedSampler::new(by_trace_id())
        .with_remote_parent_sampled(by_trace_id())
        .with_remote_parent_not_sampled(by_trace_id())
}

/// Installs the process's subscriber: logs filtered by `log_filter` (this
/// crate's spans never among them) and, with `config.otlp_endpoint`, the
/// OTLP exporter of spans whose resource says `role`.
pub fn init(
    config: &TelemetryConfig,
    role: &str,
    log_filter: tracing_subscriber::EnvFilter,
) -> anyhow::Result<Telemetry> {
    config.validate()?;
    let logs = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_filter(quiet(log_filter));
    let Some(traces_url) = config.traces_url() else {
        tracing_subscriber::registry().with(logs).try_init()?;
        return Ok(Telemetry { provider: None });
    };
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_http_client(ExportClient::new()?)
        .with_endpoint(traces_url)
        .with_timeout(Duration::from_secs(10))
        .with_headers(config.otlp_headers.clone().into_iter().collect())
        .build()?;
    let resource = Resource::builder()
        .with_service_name(config.service_name.clone())
        .with_attribute(KeyValue::new("flotilla.role", role.to_owned()))
        .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
        .build();
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_sampler(sampler(config.sample_ratio))
        .with_resource(resource)
        .build();
    let spans = tracing_opentelemetry::layer()
        .with_tracer(provider.tracer("flotilla"))
        .with_location(false)
        .with_threads(false)
        .with_tracked_inactivity(false)
        .with_filter(
            tracing_subscriber::filter::Targets::new().with_target(TARGET, tracing::Level::TRACE),
        );
    tracing_subscriber::registry()
        .with(logs)
        .with(spans)
        .try_init()?;
    ENABLED.store(true, Ordering::Release);
    Ok(Telemetry {
        provider: Some(provider),
    })
}

/// `filter` with this crate's spans left out of the logs.
pub fn quiet(filter: tracing_subscriber::EnvFilter) -> tracing_subscriber::EnvFilter {
    filter.add_directive(format!("{TARGET}=off").parse().expect("a valid directive"))
}

/// Whether spans are exported.
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Acquire)
}

/// Axum middleware: the request's span (see the module docs).
pub async fn http_span(request: Request, next: Next) -> Response {
    if !enabled() {
        return next.run(request).await;
    }
    // A method HTTP does not define is `_OTHER`: a client cannot mint span
    // names.
    let method = match *request.method() {
        http::Method::GET
        | http::Method::HEAD
        | http::Method::POST
        | http::Method::PUT
        | http::Method::DELETE
        | http::Method::PATCH
        | http::Method::OPTIONS
        | http::Method::CONNECT
        | http::Method::TRACE => request.method().as_str().to_owned(),
        _ => "_OTHER".to_owned(),
    };
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map(|path| path.as_str().to_owned());
    let name = match &route {
        Some(route) => format!("{method} {route}"),
        None => method.clone(),
    };
    let span = tracing::info_span!(
        target: TARGET,
        "request",
        otel.name = %name,
        otel.kind = "server",
        http.request.method = %method,
        http.route = route.as_deref().unwrap_or(""),
        http.response.status_code = Empty,
        otel.status_code = Empty,
    );
    continue_trace(&span, request.headers());
    let response = next.run(request).instrument(span.clone()).await;
    let status = response.status();
    span.record("http.response.status_code", status.as_u16());
    if status.is_server_error() {
        span.record("otel.status_code", "ERROR");
    }
    response
}

/// Makes `span` a child of the trace context `headers` carry, if any.
fn continue_trace(span: &tracing::Span, headers: &http::HeaderMap) {
    let context =
        TraceContextPropagator::new().extract(&opentelemetry_http::HeaderExtractor(headers));
    if opentelemetry::trace::TraceContextExt::span(&context)
        .span_context()
        .is_valid()
    {
        let _ = span.set_parent(context);
    }
}

/// The current span's trace context as request headers (`traceparent`),
/// for a call to another Flotilla process; empty when spans are off.
pub fn trace_headers() -> http::HeaderMap {
    let mut headers = http::HeaderMap::new();
    if enabled() {
        let context = tracing::Span::current().context();
        TraceContextPropagator::new().inject_context(
            &context,
            &mut opentelemetry_http::HeaderInjector(&mut headers),
        );
    }
    headers
}

/// The span of an instance operation named `name` (`instance.create`, …)
/// on `instance` when it is known: record `instance.id` and `node.id` on it
/// ([`record`]) as they become known; [`traced`] records the outcome.
pub fn operation(name: &'static str, instance: Option<&str>) -> tracing::Span {
    tracing::info_span!(
        target: TARGET,
        "operation",
        otel.name = name,
        instance.id = instance,
        node.id = Empty,
        outcome = Empty,
        otel.status_code = Empty,
        error.message = Empty,
    )
}

/// Runs `work` in `span` and records its outcome there (`ok`, or `error`
/// with the error's message).
pub async fn traced<T, E: fmt::Display>(
    span: tracing::Span,
    work: impl Future<Output = Result<T, E>>,
) -> Result<T, E> {
    if span.is_disabled() {
        return work.await;
    }
    let result = work.instrument(span.clone()).await;
    match &result {
        Ok(_) => {
            span.record("outcome", "ok");
        }
        Err(error) => {
            span.record("outcome", "error");
            span.record("otel.status_code", "ERROR");
            span.record("error.message", tracing::field::display(error));
        }
    }
    result
}

/// Records an attribute (`instance.id`, `node.id`) on the current span.
pub fn record(field: &'static str, value: &str) {
    if enabled() {
        tracing::Span::current().record(field, value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_traces_url_is_the_base_and_v1_traces_or_the_full_url() {
        let with = |endpoint: &str| TelemetryConfig {
            otlp_endpoint: Some(endpoint.into()),
            ..TelemetryConfig::default()
        };
        assert_eq!(
            with("http://collector:4318").traces_url().unwrap(),
            "http://collector:4318/v1/traces"
        );
        assert_eq!(
            with("http://collector:4318/").traces_url().unwrap(),
            "http://collector:4318/v1/traces"
        );
        assert_eq!(
            with("https://c.example/otlp/v1/traces")
                .traces_url()
                .unwrap(),
            "https://c.example/otlp/v1/traces"
        );
        assert_eq!(TelemetryConfig::default().traces_url(), None);
    }

    #[test]
    fn bad_settings_are_named_and_headers_never_shown() {
        for (config, key) in [
            (
                TelemetryConfig {
                    otlp_endpoint: Some("collector:4318".into()),
                    ..TelemetryConfig::default()
                },
                "telemetry.otlp_endpoint",
            ),
            (
                TelemetryConfig {
                    otlp_endpoint: Some("file:///etc/passwd".into()),
                    ..TelemetryConfig::default()
                },
                "telemetry.otlp_endpoint",
            ),
            (
                TelemetryConfig {
                    sample_ratio: 1.5,
                    ..TelemetryConfig::default()
                },
                "telemetry.sample_ratio",
            ),
            (
                TelemetryConfig {
                    otlp_headers: [("bad name".to_owned(), "x".to_owned())].into(),
                    ..TelemetryConfig::default()
                },
                "telemetry.otlp_headers",
            ),
            (
                TelemetryConfig {
                    service_name: " ".into(),
                    ..TelemetryConfig::default()
                },
                "telemetry.service_name",
            ),
        ] {
            let error = config.validate().unwrap_err().to_string();
            assert!(error.contains(key), "{error}");
        }
        let config = TelemetryConfig {
            otlp_headers: [("x-api-key".to_owned(), "s3cret".to_owned())].into(),
            ..TelemetryConfig::default()
        };
        let shown = format!("{config:?}");
        assert!(
            !shown.contains("s3cret") && shown.contains("x-api-key"),
            "{shown}"
        );
    }

    #[test]
    fn a_caller_can_neither_force_nor_hide_sampling() {
        use opentelemetry::Context;
        use opentelemetry::trace::{
            SpanContext, SpanId, SpanKind, TraceContextExt as _, TraceFlags, TraceId, TraceState,
        };
        use opentelemetry_sdk::trace::SamplingDecision;
        let trace_id = TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").unwrap();
        let from_caller = |flags| {
            Context::new().with_remote_span_context(SpanContext::new(
                trace_id,
                SpanId::from_hex("00f067aa0ba902b7").unwrap(),
                flags,
                true,
                TraceState::default(),
            ))
        };
        let decide = |ratio: f64, flags| {
            sampler(ratio)
                .should_sample(
                    Some(&from_caller(flags)),
                    trace_id,
                    "GET /v2/instances",
                    &SpanKind::Server,
                    &[],
                    &[],
                )
                .decision
        };
        assert_eq!(decide(0.0, TraceFlags::SAMPLED), SamplingDecision::Drop);
        assert_eq!(
            decide(1.0, TraceFlags::default()),
            SamplingDecision::RecordAndSample
        );
    }

    #[tokio::test]
    async fn without_an_endpoint_nothing_is_made() {
        assert!(!enabled());
        assert!(trace_headers().is_empty());
        let span = operation("instance.create", None);
        assert!(span.is_disabled());
        let answer: Result<u8, String> = traced(span, async { Ok(7) }).await;
        assert_eq!(answer, Ok(7));
    }
}
