//! Live links: `POST/DELETE /v2/instances/{instance_id}/live…` (API key or
//! the instance's token) and what a link opens without any key:
//! `GET /live/{token}` (a standalone page, embeddable in an iframe) and
//! `GET /live/{token}/ws` (its WebSocket, relayed to the instance's live
//! view) and `POST /live/{token}/done` (a control link's person hands the
//! browser back). See `app::live_links`.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{Html, IntoResponse, Response};

use flotilla_api_types::live::{CreateLiveLinkRequest, LiveLink};
use flotilla_api_types::{ErrorResponse, InstanceId, MessageResponse};

use super::extract::{NoBody, OptionalApiJson};
use crate::app::ControlPlane;
use crate::app::live_links::live_stream_path;
use crate::error::Error;

/// Share the instance's live view: a URL anyone who has it can open without
/// an API key (and, with `mode: control`, drive the browser from) until
/// `expires_at` or until it is revoked. Treat the URL as a secret.
#[utoipa::path(post, path = "/v2/instances/{instance_id}/live", tag = "instances",
    params(("instance_id" = String, Path)),
    request_body(content = Option<CreateLiveLinkRequest>, description = "Optional; default mode view, ttl_sec 3600"),
    responses(
        (status = 201, body = LiveLink),
        (status = 400, description = "Unknown mode or field, ttl_sec out of range", body = ErrorResponse),
        (status = 404, body = ErrorResponse),
        (status = 409, description = "The instance has ended", body = ErrorResponse),
    ))]
pub async fn live_link_create(
    State(control_plane): State<Arc<ControlPlane>>,
    Path(id): Path<String>,
    headers: HeaderMap,
    OptionalApiJson(request): OptionalApiJson<CreateLiveLinkRequest>,
) -> Result<(StatusCode, Json<LiveLink>), Error> {
    let base = format!("http://{}", request_host(&headers));
    let link = control_plane
        .live_link_create(&InstanceId::new(id), request, &base)
        .await?;
    Ok((StatusCode::CREATED, Json(link)))
}

/// Revoke one live link: its page and open viewers stop within 2 seconds.
#[utoipa::path(delete, path = "/v2/instances/{instance_id}/live/{link_id}", tag = "instances",
    params(("instance_id" = String, Path), ("link_id" = String, Path)),
    responses(
        (status = 200, body = MessageResponse),
        (status = 404, description = "No such instance or live link", body = ErrorResponse),
    ))]
pub async fn live_link_delete(
    State(control_plane): State<Arc<ControlPlane>>,
    Path((id, link)): Path<(String, String)>,
    _: NoBody,
) -> Result<Json<MessageResponse>, Error> {
    let id = InstanceId::new(id);
    Ok(Json(
        control_plane.live_link_revoke(&id, Some(&link)).await?,
    ))
}

/// Revoke every live link of the instance.
#[utoipa::path(delete, path = "/v2/instances/{instance_id}/live", tag = "instances",
    params(("instance_id" = String, Path)),
    responses(
        (status = 200, body = MessageResponse),
        (status = 404, body = ErrorResponse),
    ))]
pub async fn live_links_delete(
    State(control_plane): State<Arc<ControlPlane>>,
    Path(id): Path<String>,
    _: NoBody,
) -> Result<Json<MessageResponse>, Error> {
    let id = InstanceId::new(id);
    Ok(Json(control_plane.live_link_revoke(&id, None).await?))
}

/// A live link's page: the live view, with input when the link's mode is
/// `control`. No API key: the link is the credential.
#[utoipa::path(get, path = "/live/{token}", tag = "instances", security(()),
    params(("token" = String, Path, description = "The last segment of a live link's url")),
    responses(
        (status = 200, description = "The live view page", content_type = "text/html"),
        (status = 404, description = "Not a live link, expired or revoked", body = ErrorResponse),
    ))]
pub async fn live_page(
    State(control_plane): State<Arc<ControlPlane>>,
    Path(token): Path<String>,
) -> Result<Response, Error> {
    let link = control_plane.live_link_check(&token).await?;
    let page = LIVE_PAGE.replace("{{MODE}}", link.mode.as_str());
    let headers = [
        (header::CONTENT_SECURITY_POLICY, LIVE_PAGE_POLICY),
        (header::CACHE_CONTROL, "no-store"),
        (header::REFERRER_POLICY, "no-referrer"),
    ];
    Ok((headers, Html(page)).into_response())
}

/// The person of a `control` link is done ("Done, hand back" on its page):
/// the link ends, and an agent waiting on the handoff goes on.
#[utoipa::path(post, path = "/live/{token}/done", tag = "instances", security(()),
    params(("token" = String, Path)),
    responses(
        (status = 200, body = MessageResponse),
        (status = 404, description = "Not a live link, expired or revoked", body = ErrorResponse),
        (status = 409, description = "A view link: only a control link hands back", body = ErrorResponse),
    ))]
pub async fn live_hand_back(
    State(control_plane): State<Arc<ControlPlane>>,
    Path(token): Path<String>,
    _: NoBody,
) -> Result<Json<MessageResponse>, Error> {
    Ok(Json(control_plane.live_link_hand_back(&token).await?))
}

/// A live link's WebSocket: the instance's live view (see the agent's
/// `live_control` for its messages); `view` links cannot take control.
#[utoipa::path(get, path = "/live/{token}/ws", tag = "instances", security(()),
    params(("token" = String, Path)),
    responses(
        (status = 101, description = "WebSocket of the live view"),
        (status = 426, description = "Not a WebSocket upgrade", body = ErrorResponse),
        (status = 404, description = "Not a live link, expired or revoked", body = ErrorResponse),
    ))]
pub async fn live_socket(
    State(control_plane): State<Arc<ControlPlane>>,
    Path(token): Path<String>,
    request: Request,
) -> Result<Response, Error> {
    let link = control_plane.live_link_check(&token).await?;
    let target = control_plane.live_link_target(&link).await?;
    let path = live_stream_path(link.mode);
    let watcher = control_plane.clone();
    let ends = Box::pin(async move { watcher.live_link_ended(link).await });
    Ok(super::door::forward_live(&control_plane, request, (&target, path), ends).await)
}

/// The `Host` the caller used, when it is a plain host name or address.
fn request_host(headers: &HeaderMap) -> String {
    headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .filter(|h| {
            !h.is_empty()
                && h.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-.:[]".contains(&b))
        })
        .unwrap_or("localhost")
        .to_owned()
}

/// The page may be framed anywhere; it loads nothing but the live view
/// client (`/ui/live.js`), its socket and the frames it turns into blob URLs.
const LIVE_PAGE_POLICY: &str = "default-src 'none'; img-src blob:; connect-src 'self'; \
     script-src 'self' 'unsafe-inline'; style-src 'unsafe-inline'; frame-ancestors *";

const LIVE_PAGE: &str = include_str!("live_page.html");
