//! The HTTP surface of the control plane: the router, the OpenAPI document and
//! Swagger UI, both read from the route tables ([`routes::ROUTES`] for the
//! API, `door::ROUTES` for the front door). Handlers are thin: extract, call
//! `app`, convert the error.

mod actions;
pub mod door;
#[allow(dead_code)] // only the OpenAPI entries of its functions are used
mod door_docs;
mod extensions;
mod extract;
mod guard;
mod health;
mod instances;
mod internal;
mod live;
#[allow(dead_code)] // only the OpenAPI entries of its functions are used
mod mcp_docs;
mod nodes;
mod observability;
mod playwright;
mod profiles;
mod recordings;
mod routes;
mod tenancy;
mod tokens;
mod ui;
mod webdriver;

pub use extract::{ApiJson, ApiQuery, NoBody, OptionalApiJson};

use std::sync::Arc;

use axum::Router;
use axum::http::{Method, Uri};
use tower_http::trace::TraceLayer;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};
use utoipa_swagger_ui::SwaggerUi;

use crate::app::ControlPlane;
use crate::error::Error;

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Flotilla instance service",
        version = "2.0.0",
        description = "Browser instances on demand: create, inspect, park (dormant) and revive real Chromium instances."
    ),
    components(schemas(
        flotilla_api_types::instances::InstanceStatus,
        flotilla_api_types::instances::InstanceSort,
        flotilla_api_types::instances::ReviveMethod,
        flotilla_api_types::live::LiveMode,
        flotilla_api_types::ErrorCode,
        flotilla_api_types::metrics::MetricsPeriod,
        flotilla_api_types::alerts::AlertLevel,
        flotilla_api_types::alerts::AlertState,
        // Answers of the door's routes (added by `DoorDocs`).
        flotilla_api_types::instances::DownloadList,
        flotilla_api_types::instances::RecordingList,
    )),
    security(("bearer" = [])),
    tags(
        (name = "instances", description = "Browser instances"),
        (name = "nodes", description = "Machines running node agents"),
        (name = "profiles", description = "Persistent browser profiles: cookies, localStorage and the profile directory, saved by name"),
        (name = "extensions", description = "Chromium extensions uploaded as zip files, loaded by instances that name them in config.extensions"),
        (name = "recordings", description = "Recordings kept after their instance was deleted (config.keep_recordings), in the snapshot store"),
        (name = "health", description = "Service health"),
        (name = "metrics", description = "Cluster metrics, Prometheus exposition and alerts"),
        (name = "events", description = "Subscriber tokens for the event proxy"),
        (name = "webdriver", description = "W3C WebDriver (Selenium, WebdriverIO), also under /wd/hub: a session is an instance; commands are served by its node's chromedriver. Credential: an API key, as Bearer or as Basic credentials in the URL"),
        (name = "actions", description = "One page rendered in a browser borrowed for the job (a screenshot, a PDF, the rendered HTML, scraped elements), answered with the result itself; the browser is deleted afterwards"),
        (name = "playwright", description = "Playwright's own protocol (chromium.connect()) to a new instance for the connection, deleted when it ends; an existing instance's is urls.playwright. Served by a Playwright server of the client's version. Credential: an API key, as Bearer or ?token="),
        (name = "mcp", description = "The Model Context Protocol for AI agents (Streamable HTTP): browser_* tools over the fleet. Credential: an API key"),
        (name = "front door", description = "Every instance through the control plane's port: CDP, DevTools discovery, live view, screenshot, tabs. Credential: an API key, or the instance's token as Bearer or ?token="),
    )
)]
pub struct ApiDoc;

/// Declares the HTTP bearer scheme (spec: a global requirement), and the
/// answers every operation may give: 401 where a credential is required (with
/// authentication on), 429 everywhere (the rate limit).
struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .bearer_format("API key")
                    .build(),
            ),
        );
        let error = |description: &str| {
            utoipa::openapi::ResponseBuilder::new()
                .description(description)
                .content(
                    "application/json",
                    utoipa::openapi::ContentBuilder::new()
                        .schema(Some(utoipa::openapi::Ref::from_schema_name(
                            "ErrorResponse",
                        )))
                        .build(),
                )
                .build()
        };
        for item in openapi.paths.paths.values_mut() {
            let operations = [
                &mut item.get,
                &mut item.put,
                &mut item.post,
                &mut item.delete,
                &mut item.patch,
            ];
            for operation in operations.into_iter().flatten() {
                // Open operations declare `security(())`; the rest inherit the
                // global bearer requirement.
                let none = utoipa::openapi::security::SecurityRequirement::default();
                let open = operation
                    .security
                    .as_ref()
                    .is_some_and(|requirements| requirements.iter().all(|r| *r == none));
                let responses = &mut operation.responses.responses;
                if !open {
                    responses.entry("401".into()).or_insert_with(|| {
                        error("Authentication is on and no accepted credential was presented (WWW-Authenticate: Bearer)").into()
                    });
                }
                responses.entry("429".into()).or_insert_with(|| {
                    error("Rate limited (Retry-After and X-RateLimit-* headers say when to retry)").into()
                });
            }
        }
    }
}

/// The OpenAPI document as this control plane validates: `wait_sec` up to
/// its `scheduler.max_wait_sec`.
pub fn openapi_document(max_wait_sec: u64) -> utoipa::openapi::OpenApi {
    use utoipa::openapi::schema::{KnownFormat, ObjectBuilder, SchemaFormat, Type};
    let mut document = ApiDoc::openapi();
    routes::document(&mut document);
    door::document(&mut document);
    BearerAuth.modify(&mut document);
    let create = document
        .paths
        .paths
        .get_mut("/v2/instances")
        .and_then(|item| item.post.as_mut());
    let parameters = create.and_then(|operation| operation.parameters.as_mut());
    for parameter in parameters.into_iter().flatten() {
        if parameter.name == "wait_sec" {
            parameter.schema = Some(
                ObjectBuilder::new()
                    .schema_type(Type::Integer)
                    .format(Some(SchemaFormat::KnownFormat(KnownFormat::Int64)))
                    .minimum(Some(0))
                    .maximum(Some(max_wait_sec as f64))
                    .into(),
            );
        }
    }
    document
}

/// The control plane's router.
pub fn router(control_plane: Arc<ControlPlane>) -> Router {
    Router::new()
        .merge(routes::table_router(&control_plane))
        .merge(door::router())
        .merge(crate::mcp::router(control_plane.clone()))
        .merge(SwaggerUi::new("/docs").url(
            "/openapi.json",
            openapi_document(control_plane.config.scheduler.max_wait_sec),
        ))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(axum::middleware::from_fn_with_state(
            control_plane.clone(),
            door::by_subdomain,
        ))
        .layer(axum::middleware::from_fn_with_state(
            control_plane.clone(),
            tenancy::scope_instances,
        ))
        .layer(axum::middleware::from_fn_with_state(
            control_plane.clone(),
            guard::guard,
        ))
        // Spans name the path only: queries may carry instance tokens.
        .layer(TraceLayer::new_for_http().make_span_with(
            |request: &axum::http::Request<axum::body::Body>| {
                tracing::debug_span!("request", method = %request.method(), path = %request.uri().path())
            },
        ))
        // OpenTelemetry: one span per request, named by its route (off
        // unless [telemetry] otlp_endpoint is set).
        .layer(axum::middleware::from_fn(flotilla_telemetry::http_span))
        .with_state(control_plane)
}

async fn not_found(uri: Uri) -> Error {
    Error::NotFound(format!("no such path: {}", uri.path()))
}

async fn method_not_allowed(method: Method, uri: Uri) -> (axum::http::StatusCode, Error) {
    (
        axum::http::StatusCode::METHOD_NOT_ALLOWED,
        Error::InvalidRequest(format!("method {method} is not allowed on {}", uri.path())),
    )
}

#[cfg(test)]
mod tests {
    /// The OpenAPI document, as served with the default `max_wait_sec`, is
    /// the one in `docs/openapi.json`: a change to the API shows in review
    /// as a change to that file. `FLOTILLA_WRITE_OPENAPI=1` rewrites it.
    #[test]
    fn the_openapi_document_is_the_one_in_docs() {
        let served = super::openapi_document(300)
            .to_pretty_json()
            .expect("the document serializes")
            + "\n";
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/openapi.json");
        if std::env::var_os("FLOTILLA_WRITE_OPENAPI").is_some() {
            std::fs::write(path, &served).expect("docs/openapi.json is writable");
        }
        let kept = std::fs::read_to_string(path).unwrap_or_default();
        assert!(
            kept == served,
            "the OpenAPI document differs from docs/openapi.json; if the change is meant, rerun with FLOTILLA_WRITE_OPENAPI=1"
        );
    }
}
