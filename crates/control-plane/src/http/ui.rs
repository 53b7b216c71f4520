//! The dashboard at `/ui`: static assets compiled into the binary (no CDN, works
//! offline). It uses only the public API and the event proxy.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Redirect, Response};

use crate::app::ControlPlane;

const INDEX: &str = include_str!("ui/index.html");
const APP_JS: &str = include_str!("ui/app.js");
const APP_CSS: &str = include_str!("ui/app.css");
/// The live view client (the dashboard's and the live-link page's).
const LIVE_JS: &str = include_str!("ui/live.js");

fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "no-cache"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        body,
    )
        .into_response()
}

pub async fn index() -> Response {
    asset("text/html; charset=utf-8", INDEX)
}

pub async fn app_js() -> Response {
    asset("text/javascript; charset=utf-8", APP_JS)
}

pub async fn live_js() -> Response {
    asset("text/javascript; charset=utf-8", LIVE_JS)
}

pub async fn app_css() -> Response {
    asset("text/css; charset=utf-8", APP_CSS)
}

/// `/` → `/ui`.
pub async fn root() -> Redirect {
    Redirect::temporary("/ui")
}

/// What the dashboard needs before its first API call: whether to ask for a key
/// (so that it never provokes a 401 just to find out).
pub async fn config(State(control_plane): State<Arc<ControlPlane>>) -> Json<serde_json::Value> {
    Json(serde_json::json!({ "auth_enabled": control_plane.config().auth_enabled }))
}
