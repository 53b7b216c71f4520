//! The instance's own small HTTP API on its `http_port`:
//! - `GET /screenshot` — PNG of a tab (`?tab=<id>`, default the first tab);
//! - `GET /tabs` — JSON array of the open tabs (`id`, `url`, `title`);
//! - `GET /` — a page that shows the live view of the `stream_port`.
//!
//! It talks to the browser directly on its internal DevTools port.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::Router;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use base64::Engine;
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::net::TcpListener;

use crate::browser::CdpEndpoint;
use crate::cdp::CdpClient;
use crate::instance::InstanceSlot;

#[derive(Clone)]
struct ApiState {
    slot: Arc<InstanceSlot>,
    ready_timeout: Duration,
}

/// One open tab.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Tab {
    pub id: String,
    pub url: String,
    pub title: String,
}

pub async fn serve_api(listener: TcpListener, slot: Arc<InstanceSlot>, ready_timeout: Duration) {
    let cancel = slot.servers.clone();
    let router = Router::new()
        .route("/", get(index))
        .route("/tabs", get(tabs))
        .route("/screenshot", get(screenshot))
        .with_state(ApiState {
            slot,
            ready_timeout,
        });
    let _ = axum::serve(listener, router)
        .with_graceful_shutdown(async move { cancel.cancelled().await })
        .await;
}

/// An error of the instance API: plain text with a status.
struct ApiError(StatusCode, String);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (
            self.0,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            format!("{}\n", self.1),
        )
            .into_response()
    }
}

async fn endpoint(state: &ApiState) -> Result<CdpEndpoint, ApiError> {
    state.slot.touch();
    match state.slot.wait_ready(state.ready_timeout).await {
        Ok(Some(endpoint)) => Ok(endpoint),
        Ok(None) => Err(ApiError(
            StatusCode::SERVICE_UNAVAILABLE,
            "sim instance: no browser".into(),
        )),
        Err(reason) => Err(ApiError(StatusCode::SERVICE_UNAVAILABLE, reason)),
    }
}

fn http_client() -> &'static reqwest::Client {
    static CLIENT: OnceLock<reqwest::Client> = OnceLock::new();
    CLIENT.get_or_init(|| {
        reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .no_proxy()
            .build()
            .expect("http client")
    })
}

/// The browser's page targets (its own `browser_ui` targets are left out).
pub async fn list_tabs(endpoint: &CdpEndpoint) -> Result<Vec<(Tab, String)>, String> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Target {
        id: String,
        #[serde(rename = "type")]
        kind: String,
        url: String,
        title: String,
        web_socket_debugger_url: Option<String>,
    }
    let targets: Vec<Target> = http_client()
        .get(format!("http://127.0.0.1:{}/json/list", endpoint.port))
        .send()
        .await
        .map_err(|e| e.to_string())?
        .json()
        .await
        .map_err(|e| e.to_string())?;
    Ok(targets
        .into_iter()
        .filter(|t| t.kind == "page")
        .map(|t| {
            let ws = t.web_socket_debugger_url.unwrap_or_else(|| {
                format!("ws://127.0.0.1:{}/devtools/page/{}", endpoint.port, t.id)
            });
            (
                Tab {
                    id: t.id,
                    url: t.url,
                    title: t.title,
                },
                ws,
            )
        })
        .collect())
}

async fn tabs(State(state): State<ApiState>) -> Result<Response, ApiError> {
    let endpoint = endpoint(&state).await?;
    let tabs = list_tabs(&endpoint)
        .await
        .map_err(|e| ApiError(StatusCode::BAD_GATEWAY, format!("cannot list tabs: {e}")))?;
    let tabs: Vec<Tab> = tabs.into_iter().map(|(tab, _)| tab).collect();
    Ok(axum::Json(tabs).into_response())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ScreenshotQuery {
    tab: Option<String>,
}

async fn screenshot(
    State(state): State<ApiState>,
    query: Result<Query<ScreenshotQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(query) = query.map_err(|e| {
        ApiError(
            StatusCode::BAD_REQUEST,
            format!("{e}; the only parameter is tab=<id from /tabs>"),
        )
    })?;
    let endpoint = endpoint(&state).await?;
    let tabs = list_tabs(&endpoint)
        .await
        .map_err(|e| ApiError(StatusCode::BAD_GATEWAY, format!("cannot list tabs: {e}")))?;
    let (_, ws) = match &query.tab {
        Some(id) => tabs
            .into_iter()
            .find(|(tab, _)| &tab.id == id)
            .ok_or_else(|| {
                ApiError(
                    StatusCode::NOT_FOUND,
                    format!("no tab {id:?}; GET /tabs lists them"),
                )
            })?,
        None => tabs
            .into_iter()
            .next()
            .ok_or_else(|| ApiError(StatusCode::NOT_FOUND, "the browser has no open tab".into()))?,
    };
    let client = CdpClient::connect(&ws)
        .await
        .map_err(|e| ApiError(StatusCode::BAD_GATEWAY, e.to_string()))?;
    let result = client
        .call(
            "Page.captureScreenshot",
            json!({"format": "png"}),
            None,
            Duration::from_secs(20),
        )
        .await
        .map_err(|e| ApiError(StatusCode::BAD_GATEWAY, e.to_string()))?;
    let data = result
        .get("data")
        .and_then(|v| v.as_str())
        .unwrap_or_default();
    let png = base64::engine::general_purpose::STANDARD
        .decode(data)
        .map_err(|e| {
            ApiError(
                StatusCode::BAD_GATEWAY,
                format!("browser sent a bad screenshot: {e}"),
            )
        })?;
    Ok((
        [
            (header::CONTENT_TYPE, "image/png"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        png,
    )
        .into_response())
}

async fn index(State(state): State<ApiState>, headers: HeaderMap) -> Html<String> {
    let host = headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .and_then(|h| {
            h.rsplit_once(':')
                .map(|(host, _)| host.to_owned())
                .or(Some(h.to_owned()))
        })
        .unwrap_or_else(|| "127.0.0.1".into());
    let stream_port = state.slot.ports[1];
    let id = &state.slot.id;
    Html(format!(
        r#"<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>Instance {id}</title>
<style>body{{margin:0;background:#111;color:#ddd;font:14px system-ui,sans-serif}}header{{padding:8px 12px}}img{{display:block;max-width:100%;margin:0 auto;background:#000}}a{{color:#8cf}}</style>
</head><body><header>Instance <code>{id}</code> · <a href="/tabs">tabs</a> · <a href="/screenshot">screenshot</a></header>
<img src="http://{host}:{stream_port}/" alt="Live view of instance {id}"></body></html>"#
    ))
}
