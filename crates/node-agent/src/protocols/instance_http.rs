//! The instance's own small HTTP API on its `http_port`:
//! - `GET /screenshot` — PNG of a tab (`?tab=<id>`, default the first tab);
//! - `GET /tabs` — JSON array of the open tabs (`id`, `url`, `title`);
//! - `GET /` — a page that shows the live view of the `stream_port`;
//! - `GET /downloads` — the instance's downloads (`{"downloads": […]}`),
//!   `GET /downloads/{name}` one of them, `DELETE /downloads/{name}` removes it
//!   (see [`crate::system::downloads`]); these read the disk and never wake a parked
//!   instance;
//! - `GET /recordings` — its recordings (`{"recordings": […]}`), `GET
//!   /recordings/{id}` one of them (MP4; see [`crate::protocols::recording`]);
//! - `/webdriver/session[/{id}/…]` — its WebDriver server (see
//!   [`crate::protocols::webdriver`]);
//! - `/playwright` — its Playwright server, for `chromium.connect()` (see
//!   [`crate::protocols::playwright`]).
//!
//! It talks to the browser directly on its internal DevTools port.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use serde::Deserialize;
use tokio::net::TcpListener;

use crate::engine::browser::CdpEndpoint;
use crate::engine::capture::{CaptureError, Captures, NodeCaptures, Screenshot};
use crate::engine::page::{list_tabs, page_path};
use crate::instance::InstanceSlot;
use crate::protocols::access::{NodeAccess, with_token};

#[derive(Clone)]
struct ApiState {
    slot: Arc<InstanceSlot>,
    ready_timeout: Duration,
    access: Arc<NodeAccess>,
    /// The instance's recordings (see [`crate::protocols::recording`]).
    recordings: std::path::PathBuf,
    /// Screenshots, bounded in size and number (see [`crate::engine::capture`]).
    captures: Arc<Captures>,
}

/// Serves the instance's HTTP API until its servers stop; with
/// authentication on, every request needs a credential ([`crate::protocols::access`]).
pub async fn serve_api(
    listener: TcpListener,
    slot: Arc<InstanceSlot>,
    ready_timeout: Duration,
    (access, listeners): (Arc<NodeAccess>, flotilla_net::Listeners),
    (recordings, captures): (std::path::PathBuf, Arc<NodeCaptures>),
    (isolation, playwright_dir, playwright_exits): (
        crate::confine::sandbox::Isolation,
        std::path::PathBuf,
        crate::protocols::playwright::ExitReport,
    ),
) {
    let webdriver = crate::protocols::webdriver::routes::router(
        crate::protocols::webdriver::routes::WebDriverState {
            slot: slot.clone(),
            webdriver: slot.webdriver.clone(),
            isolation: isolation.clone(),
            ready_timeout,
        },
    );
    let playwright = crate::protocols::playwright::routes::router(
        crate::protocols::playwright::routes::PlaywrightState {
            slot: slot.clone(),
            servers: Arc::new(crate::protocols::playwright::Servers::new(playwright_exits)),
            isolation,
            ready_timeout,
            dir: playwright_dir,
        },
    );
    let router = Router::new()
        .route("/", get(index))
        .route("/tabs", get(tabs))
        .route("/screenshot", get(screenshot))
        .route("/downloads", get(downloads_list))
        .route(
            "/downloads/{name}",
            get(download_get).delete(download_delete),
        )
        .route("/recordings", get(recordings_list))
        .route("/recordings/{id}", get(recording_get))
        .with_state(ApiState {
            slot: slot.clone(),
            ready_timeout,
            access: access.clone(),
            recordings,
            captures: Arc::new(Captures::new(captures)),
        })
        .merge(webdriver)
        .merge(playwright);
    crate::protocols::access::serve_instance_port(listener, router, (access, listeners), slot)
        .await;
}

/// An error of the instance API: a status and the `{detail, code}` body of
/// the control plane's API (the front door passes it on as it is).
struct ApiError(StatusCode, String);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        use flotilla_api_types::ErrorCode;
        let code = match self.0 {
            StatusCode::BAD_REQUEST => ErrorCode::InvalidRequest,
            StatusCode::NOT_FOUND => ErrorCode::NotFound,
            StatusCode::CONFLICT => ErrorCode::InvalidState,
            StatusCode::SERVICE_UNAVAILABLE => ErrorCode::InsufficientCapacity,
            StatusCode::BAD_GATEWAY => ErrorCode::BadGateway,
            StatusCode::PAYLOAD_TOO_LARGE => ErrorCode::PayloadTooLarge,
            _ => ErrorCode::Internal,
        };
        (
            self.0,
            axum::Json(flotilla_api_types::ErrorResponse {
                detail: self.1,
                code,
            }),
        )
            .into_response()
    }
}

/// The browser's endpoint, whichever protocol it speaks.
async fn endpoint(state: &ApiState) -> Result<CdpEndpoint, ApiError> {
    state.slot.touch();
    match state.slot.wait_ready(state.ready_timeout).await {
        Ok(Some(endpoint)) => Ok(endpoint),
        Ok(None) => Err(ApiError(
            StatusCode::SERVICE_UNAVAILABLE,
            "sim instance: no browser".into(),
        )),
        Err(reason) => Err(ApiError(
            StatusCode::SERVICE_UNAVAILABLE,
            reason.to_string(),
        )),
    }
}

/// A Firefox step's failure: 409 while a client holds the browser's only
/// BiDi session, else 502.
fn firefox_error(what: &str, error: crate::engine::bidi::BidiError) -> ApiError {
    let status = match error {
        crate::engine::bidi::BidiError::SessionHeld => StatusCode::CONFLICT,
        _ => StatusCode::BAD_GATEWAY,
    };
    ApiError(status, format!("cannot {what}: {error}"))
}

async fn tabs(State(state): State<ApiState>) -> Result<Response, ApiError> {
    let endpoint = endpoint(&state).await?;
    let tabs = if endpoint.speaks_cdp() {
        list_tabs(&endpoint)
            .await
            .map_err(|e| ApiError(StatusCode::BAD_GATEWAY, format!("cannot list tabs: {e}")))?
    } else {
        let client_socket = state.slot.webdriver.view_socket();
        crate::engine::firefox::list_tabs(&endpoint, client_socket.as_deref())
            .await
            .map_err(|e| firefox_error("list tabs", e))?
    };
    Ok(axum::Json(tabs).into_response())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ScreenshotQuery {
    tab: Option<String>,
    /// The instance's access token, already checked by the access layer.
    #[serde(rename = "token")]
    _token: Option<String>,
}

async fn screenshot(
    State(state): State<ApiState>,
    query: Result<Query<ScreenshotQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(query) = query.map_err(|e| {
        let hint = "the parameters are tab=<id from /tabs> and token=<access token>";
        ApiError(StatusCode::BAD_REQUEST, format!("{e}; {hint}"))
    })?;
    let shot = capture_png(&state, query.tab.as_deref()).await?;
    let headers = [
        (header::CONTENT_TYPE, "image/png".to_owned()),
        (header::CACHE_CONTROL, "no-store".to_owned()),
        (
            header::HeaderName::from_static("x-screenshot-scale"),
            format!("{:.4}", shot.scale),
        ),
    ];
    Ok((headers, shot.png).into_response())
}

/// A PNG of tab `tab` (default: the first tab).
async fn capture_png(state: &ApiState, tab: Option<&str>) -> Result<Screenshot, ApiError> {
    let bad_gateway = |reason: String| ApiError(StatusCode::BAD_GATEWAY, reason);
    let not_found = |reason: String| ApiError(StatusCode::NOT_FOUND, reason);
    let endpoint = endpoint(state).await?;
    if !endpoint.speaks_cdp() {
        let client_socket = state.slot.webdriver.view_socket();
        return state
            .captures
            .capture_firefox(&endpoint, tab, client_socket.as_deref())
            .await
            .map_err(capture_error)?
            .ok_or_else(|| not_found("no such tab; GET /tabs lists them".into()));
    }
    let tabs = list_tabs(&endpoint)
        .await
        .map_err(|e| bad_gateway(format!("cannot list tabs: {e}")))?;
    let tab = match tab {
        Some(id) => tabs
            .into_iter()
            .find(|tab| tab.id == id)
            .ok_or_else(|| not_found(format!("no tab {id:?}; GET /tabs lists them")))?,
        None => tabs
            .into_iter()
            .next()
            .ok_or_else(|| not_found("the browser has no open tab".into()))?,
    };
    state
        .captures
        .capture(&endpoint, &page_path(&tab))
        .await
        .map_err(capture_error)
}

/// A capture's failure, as the instance API answers it.
fn capture_error(error: CaptureError) -> ApiError {
    match error {
        CaptureError::Firefox(error) => firefox_error("take a screenshot", error),
        CaptureError::Busy(_) => ApiError(StatusCode::SERVICE_UNAVAILABLE, error.to_string()),
        CaptureError::TooLarge(_) => ApiError(StatusCode::PAYLOAD_TOO_LARGE, error.to_string()),
        CaptureError::Browser(_) | CaptureError::BadData(_) => {
            ApiError(StatusCode::BAD_GATEWAY, error.to_string())
        }
    }
}

/// Runs disk work off the async threads.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| ApiError(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))
}

fn no_download(name: &str) -> ApiError {
    let reason = format!("no download {name:?}; GET /downloads lists them");
    ApiError(StatusCode::NOT_FOUND, reason)
}

async fn downloads_list(State(state): State<ApiState>) -> Result<Response, ApiError> {
    let dir = state.slot.dirs.downloads();
    let downloads = blocking(move || crate::system::downloads::list(&dir))
        .await?
        .map_err(|e| {
            let reason = format!("cannot list downloads: {e}");
            ApiError(StatusCode::INTERNAL_SERVER_ERROR, reason)
        })?;
    let list = flotilla_api_types::instances::DownloadList { downloads };
    Ok(axum::Json(list).into_response())
}

fn download_name(name: &str) -> Result<String, ApiError> {
    crate::system::downloads::checked_name(name)
        .map(str::to_owned)
        .map_err(|e| ApiError(StatusCode::BAD_REQUEST, e.to_string()))
}

async fn download_get(
    State(state): State<ApiState>,
    axum::extract::Path(name): axum::extract::Path<String>,
) -> Result<Response, ApiError> {
    let name = download_name(&name)?;
    let (dir, shown) = (state.slot.dirs.downloads(), name.clone());
    let (file, length) = blocking(move || crate::system::downloads::open(&dir, &shown))
        .await?
        .map_err(|_| no_download(&name))?;
    Ok(download_response(&name, file, length))
}

/// A download as an attachment, streamed from its file.
fn download_response(name: &str, file: std::fs::File, length: u64) -> Response {
    let body = axum::body::Body::from_stream(tokio_util::io::ReaderStream::new(
        tokio::fs::File::from_std(file),
    ));
    let mime = mime_guess::from_path(name.trim_end_matches(".crdownload"))
        .first_or_octet_stream()
        .essence_str()
        .to_owned();
    let disposition = format!(
        "attachment; filename*=UTF-8''{}",
        url::form_urlencoded::byte_serialize(name.as_bytes()).collect::<String>()
    );
    let headers = [
        (header::CONTENT_TYPE, mime),
        (header::CONTENT_LENGTH, length.to_string()),
        (header::CONTENT_DISPOSITION, disposition),
        (header::CACHE_CONTROL, "no-store".to_owned()),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff".to_owned()),
    ];
    (headers, body).into_response()
}

async fn download_delete(
    State(state): State<ApiState>,
    axum::extract::Path(name): axum::extract::Path<String>,
) -> Result<Response, ApiError> {
    let name = download_name(&name)?;
    remove_download(&state, &name).await?;
    let message = format!("download {name} deleted");
    Ok(axum::Json(flotilla_api_types::MessageResponse { message }).into_response())
}

async fn remove_download(state: &ApiState, name: &str) -> Result<(), ApiError> {
    let (dir, target) = (state.slot.dirs.downloads(), name.to_owned());
    let removed = blocking(move || crate::system::downloads::remove(&dir, &target))
        .await?
        .map_err(|e| {
            let reason = format!("cannot remove {name:?}: {e}");
            ApiError(StatusCode::INTERNAL_SERVER_ERROR, reason)
        })?;
    match removed {
        true => Ok(()),
        false => Err(no_download(name)),
    }
}

async fn recordings_list(State(state): State<ApiState>) -> Result<Response, ApiError> {
    let dir = state.recordings.clone();
    let recordings = blocking(move || crate::protocols::recording::list(&dir))
        .await?
        .map_err(|e| {
            let reason = format!("cannot list recordings: {e}");
            ApiError(StatusCode::INTERNAL_SERVER_ERROR, reason)
        })?;
    let list = flotilla_api_types::instances::RecordingList { recordings };
    Ok(axum::Json(list).into_response())
}

async fn recording_get(
    State(state): State<ApiState>,
    axum::extract::Path(id): axum::extract::Path<String>,
) -> Result<Response, ApiError> {
    let (dir, wanted) = (state.recordings.clone(), id.clone());
    let (file, length) = blocking(move || crate::protocols::recording::open(&dir, &wanted))
        .await?
        .map_err(|_| {
            let reason = format!("no recording {id:?}; GET /recordings lists them");
            ApiError(StatusCode::NOT_FOUND, reason)
        })?;
    Ok(video_response(file, length))
}

/// A recording, streamed from its file.
fn video_response(file: std::fs::File, length: u64) -> Response {
    let body = axum::body::Body::from_stream(tokio_util::io::ReaderStream::new(
        tokio::fs::File::from_std(file),
    ));
    let headers = [
        (header::CONTENT_TYPE, "video/mp4".to_owned()),
        (header::CONTENT_LENGTH, length.to_string()),
        (header::CACHE_CONTROL, "no-store".to_owned()),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff".to_owned()),
    ];
    (headers, body).into_response()
}

async fn index(State(state): State<ApiState>, headers: HeaderMap) -> Html<String> {
    Html(index_page(&state, client_host(&headers)))
}

/// The host the client used, if it is a plain host name or address (it goes
/// into the page's HTML).
fn client_host(headers: &HeaderMap) -> &str {
    headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .map(|h| h.rsplit_once(':').map_or(h, |(host, _)| host))
        .filter(|h| {
            !h.is_empty()
                && h.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '[' | ']' | ':'))
        })
        .unwrap_or("127.0.0.1")
}

/// A page that shows the live view, with links to the tabs and a screenshot.
fn index_page(state: &ApiState, host: &str) -> String {
    let stream_port = state.slot.ports[1];
    let id = &state.slot.id;
    // The page was shown to an admitted client; its links need the token too.
    let token = state
        .slot
        .access_token()
        .filter(|_| state.access.auth_enabled());
    let link = |url: String| match &token {
        Some(token) => with_token(&url, token),
        None => url,
    };
    let live_view = link(format!("http://{host}:{stream_port}/"));
    let tabs = link("/tabs".into());
    let screenshot = link("/screenshot".into());
    format!(
        r#"<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="referrer" content="no-referrer">
<title>Instance {id}</title>
<style>body{{margin:0;background:#111;color:#ddd;font:14px system-ui,sans-serif}}header{{padding:8px 12px}}img{{display:block;max-width:100%;margin:0 auto;background:#000}}a{{color:#8cf}}</style>
</head><body><header>Instance <code>{id}</code> · <a href="{tabs}">tabs</a> · <a href="{screenshot}">screenshot</a></header>
<img src="{live_view}" alt="Live view of instance {id}"></body></html>"#
    )
}
