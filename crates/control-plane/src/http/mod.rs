//! The HTTP surface of the control plane: the router, the OpenAPI document and
//! Swagger UI. Handlers are thin: extract, call `app`, convert the error.

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
mod tenancy;
mod tokens;
mod ui;
mod webdriver;

pub use extract::{ApiJson, ApiQuery, NoBody, OptionalApiJson};
pub use guard::{
    ApiKeyError, Guard, KeyDigest, Principal, RateLimiter, check_api_keys, key_digest,
};

use std::sync::Arc;

use axum::Router;
use axum::http::{Method, Uri};
use axum::routing::get;
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
    paths(
        health::health,
        instances::instance_create,
        instances::instance_list,
        instances::instance_get,
        instances::instance_delete,
        instances::instance_dormant,
        instances::instance_revive,
        live::live_link_create,
        live::live_link_delete,
        live::live_links_delete,
        live::live_page,
        live::live_socket,
        live::live_hand_back,
        nodes::node_list,
        nodes::node_get,
        nodes::node_drain,
        nodes::node_uncordon,
        profiles::profile_create,
        profiles::profile_list,
        profiles::profile_get,
        profiles::profile_delete,
        extensions::extension_upload,
        extensions::extension_list,
        extensions::extension_get,
        extensions::extension_delete,
        recordings::recordings_kept,
        recordings::recording_kept,
        recordings::recording_kept_delete,
        observability::metrics,
        observability::prometheus,
        observability::alerts,
        tokens::token_create,
        tokens::token_verify,
        tokens::whoami,
        webdriver::new_session,
        webdriver::status,
        webdriver::docs::session_delete,
        webdriver::docs::session_command,
        actions::screenshot,
        actions::pdf,
        actions::content,
        actions::scrape,
        mcp_docs::mcp_post,
        mcp_docs::mcp_stream,
        mcp_docs::mcp_end,
        playwright::connect,
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
    modifiers(&DoorDocs, &BearerAuth),
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

/// The front door's operations, from its route table (`door::ROUTES`).
struct DoorDocs;

impl Modify for DoorDocs {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        door::document(openapi);
    }
}

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
        .route("/health", get(health::health))
        .merge(instance_routes())
        .merge(door::router())
        .merge(webdriver_routes())
        .merge(resource_routes())
        .merge(action_routes(&control_plane))
        .merge(crate::mcp::router(control_plane.clone()))
        .merge(ui_routes())
        .nest("/internal/v1", internal_routes(&control_plane))
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

type Routes = Router<Arc<ControlPlane>>;

/// The instance lifecycle: create, list, get, delete, park, revive.
fn instance_routes() -> Routes {
    Router::new()
        .route(
            "/v2/instances",
            axum::routing::post(instances::instance_create).get(instances::instance_list),
        )
        .route(
            "/v2/instances/{instance_id}",
            get(instances::instance_get).delete(instances::instance_delete),
        )
        .route(
            "/v2/instances/{instance_id}/dormant",
            axum::routing::post(instances::instance_dormant),
        )
        .route(
            "/v2/instances/{instance_id}/revive",
            axum::routing::post(instances::instance_revive),
        )
        .route(
            "/v2/instances/{instance_id}/live",
            axum::routing::post(live::live_link_create).delete(live::live_links_delete),
        )
        .route(
            "/v2/instances/{instance_id}/live/{link_id}",
            axum::routing::delete(live::live_link_delete),
        )
        .route("/live/{token}", get(live::live_page))
        .route("/live/{token}/ws", get(live::live_socket))
        .route(
            "/live/{token}/done",
            axum::routing::post(live::live_hand_back),
        )
}

/// WebDriver (W3C, Selenium Grid 4's endpoints), at the root and under
/// `/wd/hub`.
fn webdriver_routes() -> Routes {
    let mut router = Router::new();
    for prefix in ["", "/wd/hub"] {
        router = router
            .route(
                &format!("{prefix}/session"),
                axum::routing::post(webdriver::new_session),
            )
            .route(&format!("{prefix}/status"), get(webdriver::status))
            .route(
                &format!("{prefix}/session/{{id}}"),
                axum::routing::any(webdriver::session),
            )
            .route(
                &format!("{prefix}/session/{{id}}/{{*rest}}"),
                axum::routing::any(webdriver::session),
            );
    }
    router
}

/// REST actions. Bodies may carry an `html` of `actions.max_html_bytes`,
/// which JSON may escape up to six times.
fn action_routes(control_plane: &ControlPlane) -> Routes {
    let limit = control_plane
        .config
        .actions
        .max_html_bytes
        .saturating_mul(6)
        .saturating_add(1 << 20);
    Router::new()
        .route(
            "/v2/actions/screenshot",
            axum::routing::post(actions::screenshot),
        )
        .route("/v2/actions/pdf", axum::routing::post(actions::pdf))
        .route("/v2/actions/content", axum::routing::post(actions::content))
        .route("/v2/actions/scrape", axum::routing::post(actions::scrape))
        .layer(axum::extract::DefaultBodyLimit::max(limit))
}

/// Profiles, extensions, nodes, metrics, alerts and subscriber tokens.
fn resource_routes() -> Routes {
    Router::new()
        .route(
            "/v2/profiles",
            axum::routing::post(profiles::profile_create).get(profiles::profile_list),
        )
        .route(
            "/v2/profiles/{name}",
            get(profiles::profile_get).delete(profiles::profile_delete),
        )
        .route(
            "/v2/extensions",
            axum::routing::post(extensions::extension_upload).get(extensions::extension_list),
        )
        .route(
            "/v2/extensions/{id}",
            get(extensions::extension_get).delete(extensions::extension_delete),
        )
        .route("/v2/recordings", get(recordings::recordings_kept))
        .route(
            "/v2/recordings/{recording_id}",
            get(recordings::recording_kept).delete(recordings::recording_kept_delete),
        )
        .route(playwright::PATH, get(playwright::connect))
        .route("/v2/nodes", get(nodes::node_list))
        .route("/v2/nodes/{node_id}", get(nodes::node_get))
        .route(
            "/v2/nodes/{node_id}/drain",
            axum::routing::post(nodes::node_drain),
        )
        .route(
            "/v2/nodes/{node_id}/uncordon",
            axum::routing::post(nodes::node_uncordon),
        )
        .route("/v2/metrics", get(observability::metrics))
        .route("/metrics", get(observability::prometheus))
        .route("/v2/alerts", get(observability::alerts))
        .route("/v2/tokens", axum::routing::post(tokens::token_create))
        .route("/v2/whoami", get(tokens::whoami))
        .route(
            "/v2/tokens/verify",
            axum::routing::post(tokens::token_verify),
        )
}

/// The dashboard.
fn ui_routes() -> Routes {
    Router::new()
        .route("/", get(ui::root))
        .route("/ui", get(ui::index))
        .route("/ui/", get(ui::index))
        .route("/ui/app.js", get(ui::app_js))
        .route("/ui/app.css", get(ui::app_css))
        .route("/ui/live.js", get(ui::live_js))
        .route("/ui/config.json", get(ui::config))
}

/// The agents' API (`/internal/v1`), behind the cluster token.
fn internal_routes(control_plane: &Arc<ControlPlane>) -> Routes {
    Router::new()
        .route("/nodes/register", axum::routing::post(internal::register))
        .route("/nodes/heartbeat", axum::routing::post(internal::heartbeat))
        .route(
            "/instances/state",
            axum::routing::post(internal::state_changed),
        )
        .route(
            "/instances/events",
            axum::routing::post(internal::instance_event),
        )
        .route("/nodes/drain", axum::routing::post(internal::drain))
        .route(
            "/nodes/drain/report",
            axum::routing::post(internal::drain_report),
        )
        .layer(axum::middleware::from_fn_with_state(
            control_plane.clone(),
            internal::require_cluster_token,
        ))
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
