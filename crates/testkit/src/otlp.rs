//! The far side of traces: an OpenTelemetry collector's OTLP/HTTP door
//! (`POST /v1/traces`, protobuf), keeping every span it receives.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use prost::Message as _;

use crate::serve_router;

/// One span as the collector got it.
#[derive(Debug, Clone)]
pub struct ReceivedSpan {
    pub trace_id: String,
    pub span_id: String,
    /// Empty for a trace's root.
    pub parent_span_id: String,
    pub name: String,
    /// The resource's `flotilla.role` (`control`, `agent`, `serve`).
    pub role: String,
    pub service_name: String,
    pub attributes: BTreeMap<String, String>,
    /// 2 is an error (`STATUS_CODE_ERROR`).
    pub status_code: i32,
}

/// A collector on 127.0.0.1: `url` is its OTLP/HTTP base URL.
pub struct OtlpReceiver {
    pub url: String,
    spans: Arc<Mutex<Vec<ReceivedSpan>>>,
    /// Export requests that were not OTLP protobuf.
    malformed: Arc<Mutex<usize>>,
    _task: tokio::task::JoinHandle<()>,
}

impl OtlpReceiver {
    pub async fn start() -> Self {
        let spans: Arc<Mutex<Vec<ReceivedSpan>>> = Arc::default();
        let malformed: Arc<Mutex<usize>> = Arc::default();
        let (kept, bad) = (spans.clone(), malformed.clone());
        let router = axum::Router::new().route(
            "/v1/traces",
            axum::routing::post(move |body: axum::body::Bytes| {
                let (kept, bad) = (kept.clone(), bad.clone());
                async move {
                    match ExportTraceServiceRequest::decode(body) {
                        Ok(request) => {
                            kept.lock().unwrap().extend(spans_of(request));
                            axum::http::StatusCode::OK
                        }
                        Err(_) => {
                            *bad.lock().unwrap() += 1;
                            axum::http::StatusCode::BAD_REQUEST
                        }
                    }
                }
            }),
        );
        let (url, task) = serve_router(router).await;
        Self {
            url,
            spans,
            malformed,
            _task: task,
        }
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<ReceivedSpan> {
        self.spans.lock().unwrap().clone()
    }

    pub fn malformed(&self) -> usize {
        *self.malformed.lock().unwrap()
    }
}

fn spans_of(request: ExportTraceServiceRequest) -> Vec<ReceivedSpan> {
    let mut spans = Vec::new();
    for resource_spans in request.resource_spans {
        let resource = resource_spans
            .resource
            .map(|resource| attributes(&resource.attributes))
            .unwrap_or_default();
        for scope in resource_spans.scope_spans {
            for span in scope.spans {
                spans.push(ReceivedSpan {
                    trace_id: hex::encode(&span.trace_id),
                    span_id: hex::encode(&span.span_id),
                    parent_span_id: hex::encode(&span.parent_span_id),
                    name: span.name,
                    role: resource.get("flotilla.role").cloned().unwrap_or_default(),
                    service_name: resource.get("service.name").cloned().unwrap_or_default(),
                    attributes: attributes(&span.attributes),
                    status_code: span.status.map(|status| status.code).unwrap_or_default(),
                });
            }
        }
    }
    spans
}

fn attributes(pairs: &[KeyValue]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|pair| {
            (
                pair.key.clone(),
                pair.value.as_ref().map(text).unwrap_or_default(),
            )
        })
        .collect()
}

fn text(value: &AnyValue) -> String {
    match &value.value {
        Some(any_value::Value::StringValue(text)) => text.clone(),
        Some(any_value::Value::IntValue(n)) => n.to_string(),
        Some(any_value::Value::BoolValue(b)) => b.to_string(),
        Some(any_value::Value::DoubleValue(x)) => x.to_string(),
        other => format!("{other:?}"),
    }
}
