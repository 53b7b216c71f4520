//! The front door's entries in the OpenAPI document, one per documented
//! route of [`super::door::ROUTES`] (which names them): each function only
//! carries its `#[utoipa::path]`; every request goes through the door's one
//! handler.

/// The DevTools protocol of the fleet's Chromium (what chrome-remote-interface
/// fetches from the root of a door URL's host). Open: it describes the
/// protocol, nothing of an instance.
#[utoipa::path(get, path = "/json/protocol", tag = "front door", security(()),
    responses((status = 200, description = "Chromium's protocol description", content_type = "application/json"),
        (status = 502, description = "The browser asked did not answer", body = flotilla_api_types::ErrorResponse),
        (status = 503, description = "No browser is running to ask", body = flotilla_api_types::ErrorResponse)))]
pub fn json_protocol() {}

/// The fleet's Chromium version (`Browser`, `Protocol-Version`,
/// `User-Agent`, …; no `webSocketDebuggerUrl`: an instance's is at
/// `/v2/instances/{id}/json/version`). Open, like `/json/protocol`.
#[utoipa::path(get, path = "/json/version", tag = "front door", security(()),
    responses((status = 200, description = "Chromium's version object", content_type = "application/json"),
        (status = 502, description = "The browser asked did not answer", body = flotilla_api_types::ErrorResponse),
        (status = 503, description = "No browser is running to ask", body = flotilla_api_types::ErrorResponse)))]
pub fn json_version_of_the_fleet() {}

/// The browser's CDP WebSocket (Playwright `connectOverCDP`, Puppeteer
/// `browserWSEndpoint`): `urls.debug` when `public_url` is set.
#[utoipa::path(get, path = "/v2/instances/{instance_id}/cdp", tag = "front door",
    params(("instance_id" = String, Path), ("token" = Option<String>, Query, description = "The instance's access token (or send an API key or the token as Authorization: Bearer)")),
    responses(
        (status = 101, description = "WebSocket to the browser target"),
        (status = 400, description = "The instance runs Firefox, which speaks WebDriver BiDi (`urls.bidi`), not CDP", content_type = "text/plain"),
        (status = 401, description = "No valid API key or instance token", body = flotilla_api_types::ErrorResponse),
        (status = 426, description = "Not a WebSocket upgrade", body = flotilla_api_types::ErrorResponse),
        (status = 404, body = flotilla_api_types::ErrorResponse),
        (status = 409, description = "The instance is stopped or failed", body = flotilla_api_types::ErrorResponse),
        (status = 502, description = "The instance's node did not answer", body = flotilla_api_types::ErrorResponse),
    ))]
pub fn cdp() {}

/// The browser's own WebDriver BiDi WebSocket (a Firefox instance's
/// `urls.bidi`): Puppeteer `connect({browserWSEndpoint, protocol:
/// 'webDriverBiDi'})`, or any BiDi client, which starts with
/// `session.new`. Downloads are pinned to the instance's folder and
/// extension installs refused, as on a WebDriver session's BiDi socket.
#[utoipa::path(get, path = "/v2/instances/{instance_id}/bidi", tag = "front door",
    params(("instance_id" = String, Path), ("token" = Option<String>, Query, description = "The instance's access token (or send an API key or the token as Authorization: Bearer)")),
    responses(
        (status = 101, description = "WebSocket to the browser's BiDi server"),
        (status = 400, description = "The instance runs Chromium, whose socket speaks CDP (`urls.debug`); WebDriver BiDi for Chromium is a WebDriver session's `webSocketUrl`", content_type = "text/plain"),
        (status = 401, description = "No valid API key or instance token", body = flotilla_api_types::ErrorResponse),
        (status = 426, description = "Not a WebSocket upgrade", body = flotilla_api_types::ErrorResponse),
        (status = 404, body = flotilla_api_types::ErrorResponse),
        (status = 409, description = "The instance is stopped or failed", body = flotilla_api_types::ErrorResponse),
        (status = 502, description = "The instance's node did not answer", body = flotilla_api_types::ErrorResponse),
    ))]
pub fn bidi() {}

/// The same browser CDP WebSocket, where Selenium's clients look for it
/// (a WebDriver session's `se:cdp` capability).
#[utoipa::path(get, path = "/v2/instances/{instance_id}/se/cdp", tag = "front door",
    params(("instance_id" = String, Path), ("token" = Option<String>, Query, description = "The instance's access token (or send an API key or the token as Authorization: Bearer)")),
    responses(
        (status = 101, description = "WebSocket to the browser target"),
        (status = 401, description = "No valid API key or instance token", body = flotilla_api_types::ErrorResponse),
        (status = 426, description = "Not a WebSocket upgrade", body = flotilla_api_types::ErrorResponse),
        (status = 404, body = flotilla_api_types::ErrorResponse),
        (status = 409, description = "The instance is stopped or failed", body = flotilla_api_types::ErrorResponse),
        (status = 502, description = "The instance's node did not answer", body = flotilla_api_types::ErrorResponse),
    ))]
pub fn se_cdp() {}

/// DevTools `/json/version`; its `webSocketDebuggerUrl` points back
/// through the door (with the token). A trailing slash is accepted.
#[utoipa::path(get, path = "/v2/instances/{instance_id}/json/version", tag = "front door",
    params(("instance_id" = String, Path), ("token" = Option<String>, Query)),
    responses((status = 200, description = "Chromium's version object", content_type = "application/json"),
        (status = 401, body = flotilla_api_types::ErrorResponse), (status = 404, body = flotilla_api_types::ErrorResponse)))]
pub fn json_version() {}

/// DevTools `/json/list`: the targets, their URLs through the door.
#[utoipa::path(get, path = "/v2/instances/{instance_id}/json/list", tag = "front door",
    params(("instance_id" = String, Path), ("token" = Option<String>, Query)),
    responses((status = 200, description = "Chromium's target list", content_type = "application/json"),
        (status = 401, body = flotilla_api_types::ErrorResponse), (status = 404, body = flotilla_api_types::ErrorResponse)))]
pub fn json_list() {}

/// DevTools `/json/new?<url>` (PUT, as Chromium requires): a new tab.
#[utoipa::path(put, path = "/v2/instances/{instance_id}/json/new", tag = "front door",
    params(("instance_id" = String, Path), ("token" = Option<String>, Query)),
    responses((status = 200, description = "The new target", content_type = "application/json"),
        (status = 401, body = flotilla_api_types::ErrorResponse), (status = 404, body = flotilla_api_types::ErrorResponse)))]
pub fn json_new() {}

/// A page target's CDP WebSocket.
#[utoipa::path(get, path = "/v2/instances/{instance_id}/devtools/page/{target}", tag = "front door",
    params(("instance_id" = String, Path), ("target" = String, Path), ("token" = Option<String>, Query)),
    responses((status = 101, description = "WebSocket to the page target"),
        (status = 401, body = flotilla_api_types::ErrorResponse), (status = 404, body = flotilla_api_types::ErrorResponse),
        (status = 409, description = "The instance is stopped or failed", body = flotilla_api_types::ErrorResponse),
        (status = 426, description = "Not a WebSocket upgrade", body = flotilla_api_types::ErrorResponse),
        (status = 502, body = flotilla_api_types::ErrorResponse)))]
pub fn page() {}

/// The live view as MJPEG (shows in an `<img>`): `urls.stream` when
/// `public_url` is set.
#[utoipa::path(get, path = "/v2/instances/{instance_id}/stream", tag = "front door",
    params(("instance_id" = String, Path), ("token" = Option<String>, Query)),
    responses((status = 200, description = "multipart/x-mixed-replace JPEG frames", content_type = "multipart/x-mixed-replace"),
        (status = 401, body = flotilla_api_types::ErrorResponse), (status = 404, body = flotilla_api_types::ErrorResponse)))]
pub fn stream() {}

/// The live view as a WebSocket of binary JPEG frames.
#[utoipa::path(get, path = "/v2/instances/{instance_id}/stream/ws", tag = "front door",
    params(("instance_id" = String, Path), ("token" = Option<String>, Query)),
    responses((status = 101, description = "WebSocket of binary JPEG frames"),
        (status = 401, body = flotilla_api_types::ErrorResponse), (status = 404, body = flotilla_api_types::ErrorResponse),
        (status = 409, description = "The instance is stopped or failed", body = flotilla_api_types::ErrorResponse),
        (status = 426, description = "Not a WebSocket upgrade", body = flotilla_api_types::ErrorResponse),
        (status = 502, body = flotilla_api_types::ErrorResponse)))]
pub fn stream_ws() {}

/// The WebDriver BiDi socket of the instance's WebDriver session (made
/// with `webSocketUrl: true`; the session's `webSocketUrl` capability
/// points here), relayed to its chromedriver.
#[utoipa::path(get, path = "/v2/instances/{instance_id}/webdriver/bidi", tag = "front door",
    params(("instance_id" = String, Path), ("token" = Option<String>, Query)),
    responses((status = 101, description = "WebSocket of WebDriver BiDi messages"),
        (status = 401, body = flotilla_api_types::ErrorResponse), (status = 404, body = flotilla_api_types::ErrorResponse),
        (status = 409, description = "The instance is stopped or failed", body = flotilla_api_types::ErrorResponse),
        (status = 426, description = "Not a WebSocket upgrade", body = flotilla_api_types::ErrorResponse),
        (status = 502, body = flotilla_api_types::ErrorResponse)))]
pub fn webdriver_bidi() {}

/// Playwright's own protocol (`chromium.connect(url, {headers})`): a
/// Playwright server of the client's minor version (read from its
/// `User-Agent`), beside the instance's browser, drives that browser.
#[utoipa::path(get, path = "/v2/instances/{instance_id}/playwright", tag = "front door",
    params(("instance_id" = String, Path), ("token" = Option<String>, Query)),
    responses((status = 101, description = "WebSocket of Playwright's protocol"),
        (status = 401, body = flotilla_api_types::ErrorResponse), (status = 404, body = flotilla_api_types::ErrorResponse),
        (status = 409, description = "The instance is stopped or failed", body = flotilla_api_types::ErrorResponse),
        (status = 426, description = "Not a WebSocket upgrade", body = flotilla_api_types::ErrorResponse),
        (status = 428, description = "The client's Playwright version is not installed on the instance's node; the text names those that are", content_type = "text/plain"),
        (status = 502, body = flotilla_api_types::ErrorResponse)))]
pub fn playwright() {}

/// The live view's newest frame.
#[utoipa::path(get, path = "/v2/instances/{instance_id}/stream/frame.jpg", tag = "front door",
    params(("instance_id" = String, Path), ("token" = Option<String>, Query)),
    responses((status = 200, content_type = "image/jpeg"), (status = 401, body = flotilla_api_types::ErrorResponse),
        (status = 404, description = "No such instance, or no frame yet", body = flotilla_api_types::ErrorResponse),
        (status = 409, description = "The instance is stopped or failed", body = flotilla_api_types::ErrorResponse),
        (status = 502, body = flotilla_api_types::ErrorResponse)))]
pub fn frame() {}

/// A PNG of a tab (`?tab=<id>`, default the first).
#[utoipa::path(get, path = "/v2/instances/{instance_id}/screenshot", tag = "front door",
    params(("instance_id" = String, Path), ("tab" = Option<String>, Query), ("token" = Option<String>, Query)),
    responses((status = 200, content_type = "image/png", description = "The PNG; `X-Screenshot-Scale` says how much a page over `agent.screenshot_max_pixels` was scaled down (1 when not)"),
        (status = 400, description = "An unknown query parameter", body = flotilla_api_types::ErrorResponse),
        (status = 401, body = flotilla_api_types::ErrorResponse),
        (status = 404, description = "No such instance or tab", body = flotilla_api_types::ErrorResponse),
        (status = 409, description = "The instance is stopped or failed, or a client holds a Firefox's only WebDriver BiDi session", body = flotilla_api_types::ErrorResponse),
        (status = 413, description = "The PNG would exceed agent.screenshot_max_bytes", body = flotilla_api_types::ErrorResponse),
        (status = 502, body = flotilla_api_types::ErrorResponse),
        (status = 503, description = "Too many captures at once on the node", body = flotilla_api_types::ErrorResponse)))]
pub fn screenshot() {}

/// The files the instance's pages downloaded (newest first).
#[utoipa::path(get, path = "/v2/instances/{instance_id}/downloads", tag = "instances",
    params(("instance_id" = String, Path), ("token" = Option<String>, Query)),
    responses((status = 200, body = flotilla_api_types::instances::DownloadList),
        (status = 401, body = flotilla_api_types::ErrorResponse), (status = 404, body = flotilla_api_types::ErrorResponse)))]
pub fn downloads() {}

/// One download's bytes (`Content-Disposition: attachment`).
#[utoipa::path(get, path = "/v2/instances/{instance_id}/downloads/{name}", tag = "instances",
    params(("instance_id" = String, Path), ("name" = String, Path, description = "A name from the listing: a plain file name", pattern = r"^[^./\\\x00-\x1f\x7f-\x9f][^/\\\x00-\x1f\x7f-\x9f]*$", min_length = 1, max_length = 63), ("token" = Option<String>, Query)),
    responses((status = 200, description = "The file", content_type = "application/octet-stream"),
        (status = 400, description = "Not a plain file name", body = flotilla_api_types::ErrorResponse),
        (status = 401, body = flotilla_api_types::ErrorResponse), (status = 404, body = flotilla_api_types::ErrorResponse)))]
pub fn download() {}

/// Removes one download.
#[utoipa::path(delete, path = "/v2/instances/{instance_id}/downloads/{name}", tag = "instances",
    params(("instance_id" = String, Path), ("name" = String, Path, description = "A name from the listing: a plain file name", pattern = r"^[^./\\\x00-\x1f\x7f-\x9f][^/\\\x00-\x1f\x7f-\x9f]*$", min_length = 1, max_length = 63), ("token" = Option<String>, Query)),
    responses((status = 200, body = flotilla_api_types::MessageResponse),
        (status = 400, body = flotilla_api_types::ErrorResponse),
        (status = 401, body = flotilla_api_types::ErrorResponse), (status = 404, body = flotilla_api_types::ErrorResponse)))]
pub fn download_delete() {}

/// The recordings of the instance's live view (`config.record`), oldest
/// first; while it runs, the last one is still being written.
#[utoipa::path(get, path = "/v2/instances/{instance_id}/recordings", tag = "instances",
    params(("instance_id" = String, Path), ("token" = Option<String>, Query)),
    responses((status = 200, body = flotilla_api_types::instances::RecordingList),
        (status = 401, body = flotilla_api_types::ErrorResponse), (status = 404, body = flotilla_api_types::ErrorResponse)))]
pub fn recordings() {}

/// One recording's video (MP4/H.264).
#[utoipa::path(get, path = "/v2/instances/{instance_id}/recordings/{recording_id}", tag = "instances",
    params(("instance_id" = String, Path), ("recording_id" = String, Path, description = "An id from the listing"), ("token" = Option<String>, Query)),
    responses((status = 200, description = "The video", content_type = "video/mp4"),
        (status = 401, body = flotilla_api_types::ErrorResponse), (status = 404, body = flotilla_api_types::ErrorResponse)))]
pub fn recording() {}

/// The open tabs: `[{id, url, title}]`.
#[utoipa::path(get, path = "/v2/instances/{instance_id}/tabs", tag = "front door",
    params(("instance_id" = String, Path), ("token" = Option<String>, Query)),
    responses((status = 200, content_type = "application/json", description = "The tabs: `[{id, url, title}]` (a Firefox tab's id is its position, 1 first: Firefox names its contexts anew in each WebDriver session)"),
        (status = 401, body = flotilla_api_types::ErrorResponse),
        (status = 404, body = flotilla_api_types::ErrorResponse),
        (status = 409, description = "The instance is stopped or failed, or a client holds a Firefox's only WebDriver BiDi session", body = flotilla_api_types::ErrorResponse),
        (status = 502, body = flotilla_api_types::ErrorResponse),
        (status = 503, description = "The browser is not ready in time (a launch, or the wake of a parked instance)", body = flotilla_api_types::ErrorResponse)))]
pub fn tabs() {}
