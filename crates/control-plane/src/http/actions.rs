//! `/v2/actions/…` handlers: one page rendered in a borrowed browser, the
//! answer being the result itself. Extract, call the domain, convert.

use std::sync::Arc;

use axum::Extension;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};

use flotilla_api_types::ErrorResponse;
use flotilla_api_types::actions::{ActionKind, ActionRequest, ScrapeResponse};

use super::extract::ApiJson;
use crate::app::{ControlPlane, Scope};
use crate::error::Error;

async fn run(
    (control_plane, scope): (Arc<ControlPlane>, Scope),
    kind: ActionKind,
    request: ActionRequest,
) -> Result<Response, Error> {
    let result = control_plane.action_run(kind, request, scope).await?;
    Ok(([(header::CONTENT_TYPE, result.content_type)], result.body).into_response())
}

/// A screenshot of a page (`url`) or of a document (`html`): the viewport,
/// the whole page (`full_page`) or one element (`selector`), as PNG, JPEG or
/// WebP. The page loads in a browser borrowed for the job, under the
/// instance isolation and egress policy; it is deleted afterwards.
#[utoipa::path(post, path = "/v2/actions/screenshot", tag = "actions",
    request_body = ActionRequest,
    responses(
        (status = 200, description = "The image (`image/png`, `image/jpeg` or `image/webp` per `format`); a page over `agent.screenshot_max_pixels` is captured scaled down to fit", content_type = "image/png"),
        (status = 400, description = "A field is missing, out of range or of another action; a URL that is not http(s); a selector that does not parse or matches nothing; an unknown profile", body = ErrorResponse),
        (status = 409, description = "The node that took the job runs no real browser (the sim runtime)", body = ErrorResponse),
        (status = 413, description = "The body or the image is over its limit", body = ErrorResponse),
        (status = 502, description = "The page could not be loaded (the reason is Chromium's, e.g. net::ERR_NAME_NOT_RESOLVED), or the browser did not start", body = ErrorResponse),
        (status = 503, description = "No room within actions.queue_wait_sec, or actions.max_pending actions held", body = ErrorResponse),
        (status = 504, description = "The page did not finish within timeout_ms; the detail names what it waited for", body = ErrorResponse),
    ))]
pub async fn screenshot(
    State(control_plane): State<Arc<ControlPlane>>,
    Extension(scope): Extension<Scope>,
    ApiJson(request): ApiJson<ActionRequest>,
) -> Result<Response, Error> {
    run((control_plane, scope), ActionKind::Screenshot, request).await
}

/// A PDF of a page or document (`page_size`, `landscape`, `margins_mm`,
/// `print_background`).
#[utoipa::path(post, path = "/v2/actions/pdf", tag = "actions",
    request_body = ActionRequest,
    responses(
        (status = 200, description = "The PDF", content_type = "application/pdf"),
        (status = 400, body = ErrorResponse),
        (status = 409, description = "The node that took the job runs no real browser (the sim runtime)", body = ErrorResponse),
        (status = 413, body = ErrorResponse),
        (status = 502, body = ErrorResponse),
        (status = 503, body = ErrorResponse),
        (status = 504, body = ErrorResponse),
    ))]
pub async fn pdf(
    State(control_plane): State<Arc<ControlPlane>>,
    Extension(scope): Extension<Scope>,
    ApiJson(request): ApiJson<ActionRequest>,
) -> Result<Response, Error> {
    run((control_plane, scope), ActionKind::Pdf, request).await
}

/// The rendered HTML of a page (after its scripts ran), with its doctype.
#[utoipa::path(post, path = "/v2/actions/content", tag = "actions",
    request_body = ActionRequest,
    responses(
        (status = 200, description = "The document", content_type = "text/html"),
        (status = 400, body = ErrorResponse),
        (status = 409, description = "The node that took the job runs no real browser (the sim runtime)", body = ErrorResponse),
        (status = 413, body = ErrorResponse),
        (status = 502, body = ErrorResponse),
        (status = 503, body = ErrorResponse),
        (status = 504, body = ErrorResponse),
    ))]
pub async fn content(
    State(control_plane): State<Arc<ControlPlane>>,
    Extension(scope): Extension<Scope>,
    ApiJson(request): ApiJson<ActionRequest>,
) -> Result<Response, Error> {
    run((control_plane, scope), ActionKind::Content, request).await
}

/// Every element matching each of `elements`' selectors: its text, HTML,
/// attributes and box.
#[utoipa::path(post, path = "/v2/actions/scrape", tag = "actions",
    request_body = ActionRequest,
    responses(
        (status = 200, body = ScrapeResponse),
        (status = 400, body = ErrorResponse),
        (status = 409, description = "The node that took the job runs no real browser (the sim runtime)", body = ErrorResponse),
        (status = 413, body = ErrorResponse),
        (status = 502, body = ErrorResponse),
        (status = 503, body = ErrorResponse),
        (status = 504, body = ErrorResponse),
    ))]
pub async fn scrape(
    State(control_plane): State<Arc<ControlPlane>>,
    Extension(scope): Extension<Scope>,
    ApiJson(request): ApiJson<ActionRequest>,
) -> Result<Response, Error> {
    run((control_plane, scope), ActionKind::Scrape, request).await
}
