//! Every route of the control plane's own API in one table ([`ROUTES`]):
//! its path, the handlers of its methods, its operations in the OpenAPI
//! document and who may call it. The router ([`table_router`]), the
//! document's paths ([`document`]) and the guard's open paths
//! ([`is_open`]) are all read from it. The front door has its table of the
//! same kind (`door::ROUTES`).

use std::sync::Arc;

use axum::routing::{MethodRouter, any, delete, get, post};

use super::{
    actions, extensions, health, instances, internal, live, mcp_docs, nodes, observability,
    playwright, profiles, recordings, tokens, ui, webdriver,
};
use crate::app::ControlPlane;

/// Who may call a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// An API key, when authentication is on.
    Key,
    /// Anyone (what it answers says no more than it should, or the request
    /// carries its own credential: a live link, a subscriber token).
    Open,
    /// Anyone unless `metrics_require_auth`.
    Metrics,
    /// A node agent with the cluster token; not rate-limited.
    Cluster,
}

/// Who serves a route.
pub enum Serve {
    /// Its handlers, by method (the control plane's settings at hand).
    Handlers(fn(&ControlPlane) -> MethodRouter<Arc<ControlPlane>>),
    /// A router of its own merged beside the table: MCP's transport
    /// (`crate::mcp::router`), Swagger UI.
    Beside,
}

/// One route of the control plane's API.
pub struct ApiRoute {
    /// In the router's syntax: `{name}` is one segment, `{*rest}` one or more.
    pub path: &'static str,
    pub access: Access,
    pub serve: Serve,
    /// The prefixes it is served under: WebDriver's routes are served at the
    /// root and under Selenium Grid's `/wd/hub`.
    pub mounts: &'static [&'static str],
    /// Adds its operations to the OpenAPI document.
    pub docs: &'static [fn(&mut utoipa::openapi::OpenApi)],
}

/// The root only.
const ROOT: &[&str] = &[""];

/// Where WebDriver's endpoints are served: at the root and under Selenium
/// Grid's prefix.
pub const WEBDRIVER_MOUNTS: &[&str] = &["", "/wd/hub"];

/// A route at `path` that needs a key, served by `serve`, at the root,
/// undocumented; the fields below change what differs.
const fn key(path: &'static str, serve: Serve) -> ApiRoute {
    ApiRoute {
        path,
        access: Access::Key,
        serve,
        mounts: ROOT,
        docs: &[],
    }
}

/// An open route at `path`, served by `serve`.
const fn open(path: &'static str, serve: Serve) -> ApiRoute {
    ApiRoute {
        access: Access::Open,
        ..key(path, serve)
    }
}

/// A route of the agents' API, served by `serve`.
const fn cluster(path: &'static str, serve: Serve) -> ApiRoute {
    ApiRoute {
        access: Access::Cluster,
        ..key(path, serve)
    }
}

/// Adds the operation that `#[utoipa::path]` generated as `P`, with its
/// tags and the schemas it names (as utoipa's `OpenApi` derive does for the
/// handlers listed in its `paths`).
pub fn doc<P>(openapi: &mut utoipa::openapi::OpenApi)
where
    P: utoipa::Path + for<'t> utoipa::__dev::Tags<'t> + utoipa::__dev::SchemaReferences,
{
    doc_only::<P>(openapi);
    let mut schemas = Vec::new();
    P::schemas(&mut schemas);
    openapi
        .components
        .get_or_insert_with(Default::default)
        .schemas
        .extend(schemas);
}

/// Adds the operation that `#[utoipa::path]` generated as `P`, with its tags
/// only.
pub fn doc_only<P: utoipa::Path + for<'t> utoipa::__dev::Tags<'t>>(
    openapi: &mut utoipa::openapi::OpenApi,
) {
    let mut operation = P::operation();
    operation.tags = Some(P::tags().into_iter().map(str::to_owned).collect());
    openapi
        .paths
        .add_path_operation(P::path(), P::methods(), operation);
}

/// Handlers that need none of the control plane's settings.
macro_rules! handlers {
    ($router:expr) => {
        Serve::Handlers(|_| $router)
    };
}

/// Every route of the control plane's API but the front door's.
pub static ROUTES: &[ApiRoute] = {
    use actions as a;
    use instances as i;
    &[
        ApiRoute {
            docs: &[doc::<health::__path_health>],
            ..open("/health", handlers!(get(health::health)))
        },
        // The instance lifecycle.
        ApiRoute {
            docs: &[
                doc::<i::__path_instance_create>,
                doc::<i::__path_instance_list>,
            ],
            ..key(
                "/v2/instances",
                handlers!(post(i::instance_create).get(i::instance_list)),
            )
        },
        ApiRoute {
            docs: &[
                doc::<i::__path_instance_get>,
                doc::<i::__path_instance_delete>,
            ],
            ..key(
                "/v2/instances/{instance_id}",
                handlers!(get(i::instance_get).delete(i::instance_delete)),
            )
        },
        ApiRoute {
            docs: &[doc::<i::__path_instance_dormant>],
            ..key(
                "/v2/instances/{instance_id}/dormant",
                handlers!(post(i::instance_dormant)),
            )
        },
        ApiRoute {
            docs: &[doc::<i::__path_instance_revive>],
            ..key(
                "/v2/instances/{instance_id}/revive",
                handlers!(post(i::instance_revive)),
            )
        },
        // Live links, and the pages they open (a link is its own credential,
        // checked by its handler).
        ApiRoute {
            docs: &[
                doc::<live::__path_live_link_create>,
                doc::<live::__path_live_links_delete>,
            ],
            ..key(
                "/v2/instances/{instance_id}/live",
                handlers!(post(live::live_link_create).delete(live::live_links_delete)),
            )
        },
        ApiRoute {
            docs: &[doc::<live::__path_live_link_delete>],
            ..key(
                "/v2/instances/{instance_id}/live/{link_id}",
                handlers!(delete(live::live_link_delete)),
            )
        },
        ApiRoute {
            docs: &[doc::<live::__path_live_page>],
            ..open("/live/{token}", handlers!(get(live::live_page)))
        },
        ApiRoute {
            docs: &[doc::<live::__path_live_socket>],
            ..open("/live/{token}/ws", handlers!(get(live::live_socket)))
        },
        ApiRoute {
            docs: &[doc::<live::__path_live_hand_back>],
            ..open("/live/{token}/done", handlers!(post(live::live_hand_back)))
        },
        // WebDriver (W3C, Selenium Grid 4's endpoints); its readiness is
        // open, for Grid's tooling and health checks.
        ApiRoute {
            mounts: WEBDRIVER_MOUNTS,
            docs: &[doc::<webdriver::__path_new_session>],
            ..key("/session", handlers!(post(webdriver::new_session)))
        },
        ApiRoute {
            mounts: WEBDRIVER_MOUNTS,
            docs: &[doc::<webdriver::__path_status>],
            ..open("/status", handlers!(get(webdriver::status)))
        },
        ApiRoute {
            mounts: WEBDRIVER_MOUNTS,
            docs: &[doc::<webdriver::docs::__path_session_delete>],
            ..key("/session/{id}", handlers!(any(webdriver::session)))
        },
        ApiRoute {
            mounts: WEBDRIVER_MOUNTS,
            docs: &[doc::<webdriver::docs::__path_session_command>],
            ..key("/session/{id}/{*rest}", handlers!(any(webdriver::session)))
        },
        // REST actions.
        ApiRoute {
            docs: &[doc::<a::__path_screenshot>],
            ..key(
                "/v2/actions/screenshot",
                Serve::Handlers(|cp| post(a::screenshot).layer(action_body_limit(cp))),
            )
        },
        ApiRoute {
            docs: &[doc::<a::__path_pdf>],
            ..key(
                "/v2/actions/pdf",
                Serve::Handlers(|cp| post(a::pdf).layer(action_body_limit(cp))),
            )
        },
        ApiRoute {
            docs: &[doc::<a::__path_content>],
            ..key(
                "/v2/actions/content",
                Serve::Handlers(|cp| post(a::content).layer(action_body_limit(cp))),
            )
        },
        ApiRoute {
            docs: &[doc::<a::__path_scrape>],
            ..key(
                "/v2/actions/scrape",
                Serve::Handlers(|cp| post(a::scrape).layer(action_body_limit(cp))),
            )
        },
        // MCP for AI agents (Streamable HTTP).
        ApiRoute {
            docs: &[
                doc::<mcp_docs::__path_mcp_post>,
                doc::<mcp_docs::__path_mcp_stream>,
                doc::<mcp_docs::__path_mcp_end>,
            ],
            ..key("/mcp", Serve::Beside)
        },
        // Playwright's own protocol to a new instance.
        ApiRoute {
            docs: &[doc::<playwright::__path_connect>],
            ..key(playwright::PATH, handlers!(get(playwright::connect)))
        },
        // Profiles, extensions, kept recordings.
        ApiRoute {
            docs: &[
                doc::<profiles::__path_profile_create>,
                doc::<profiles::__path_profile_list>,
            ],
            ..key(
                "/v2/profiles",
                handlers!(post(profiles::profile_create).get(profiles::profile_list)),
            )
        },
        ApiRoute {
            docs: &[
                doc::<profiles::__path_profile_get>,
                doc::<profiles::__path_profile_delete>,
            ],
            ..key(
                "/v2/profiles/{name}",
                handlers!(get(profiles::profile_get).delete(profiles::profile_delete)),
            )
        },
        ApiRoute {
            docs: &[
                doc::<extensions::__path_extension_upload>,
                doc::<extensions::__path_extension_list>,
            ],
            ..key(
                "/v2/extensions",
                handlers!(post(extensions::extension_upload).get(extensions::extension_list)),
            )
        },
        ApiRoute {
            docs: &[
                doc::<extensions::__path_extension_get>,
                doc::<extensions::__path_extension_delete>,
            ],
            ..key(
                "/v2/extensions/{id}",
                handlers!(get(extensions::extension_get).delete(extensions::extension_delete)),
            )
        },
        ApiRoute {
            docs: &[doc::<recordings::__path_recordings_kept>],
            ..key(
                "/v2/recordings",
                handlers!(get(recordings::recordings_kept)),
            )
        },
        ApiRoute {
            docs: &[
                doc::<recordings::__path_recording_kept>,
                doc::<recordings::__path_recording_kept_delete>,
            ],
            ..key(
                "/v2/recordings/{recording_id}",
                handlers!(
                    get(recordings::recording_kept).delete(recordings::recording_kept_delete)
                ),
            )
        },
        // Nodes.
        ApiRoute {
            docs: &[doc::<nodes::__path_node_list>],
            ..key("/v2/nodes", handlers!(get(nodes::node_list)))
        },
        ApiRoute {
            docs: &[doc::<nodes::__path_node_get>],
            ..key("/v2/nodes/{node_id}", handlers!(get(nodes::node_get)))
        },
        ApiRoute {
            docs: &[doc::<nodes::__path_node_drain>],
            ..key(
                "/v2/nodes/{node_id}/drain",
                handlers!(post(nodes::node_drain)),
            )
        },
        ApiRoute {
            docs: &[doc::<nodes::__path_node_uncordon>],
            ..key(
                "/v2/nodes/{node_id}/uncordon",
                handlers!(post(nodes::node_uncordon)),
            )
        },
        // Metrics, alerts, subscriber tokens.
        ApiRoute {
            docs: &[doc::<observability::__path_metrics>],
            ..key("/v2/metrics", handlers!(get(observability::metrics)))
        },
        ApiRoute {
            access: Access::Metrics,
            docs: &[doc::<observability::__path_prometheus>],
            ..key("/metrics", handlers!(get(observability::prometheus)))
        },
        ApiRoute {
            docs: &[doc::<observability::__path_alerts>],
            ..key("/v2/alerts", handlers!(get(observability::alerts)))
        },
        ApiRoute {
            docs: &[doc::<tokens::__path_token_create>],
            ..key("/v2/tokens", handlers!(post(tokens::token_create)))
        },
        // The event proxy's verification webhook: the token it carries is
        // the credential.
        ApiRoute {
            docs: &[doc::<tokens::__path_token_verify>],
            ..open("/v2/tokens/verify", handlers!(post(tokens::token_verify)))
        },
        ApiRoute {
            docs: &[doc::<tokens::__path_whoami>],
            ..key("/v2/whoami", handlers!(get(tokens::whoami)))
        },
        // The dashboard's assets (it asks for the key and sends it on every
        // API call) and the API's own documentation.
        open("/", handlers!(get(ui::root))),
        open("/ui", handlers!(get(ui::index))),
        open("/ui/", handlers!(get(ui::index))),
        open("/ui/app.js", handlers!(get(ui::app_js))),
        open("/ui/app.css", handlers!(get(ui::app_css))),
        open("/ui/live.js", handlers!(get(ui::live_js))),
        open("/ui/config.json", handlers!(get(ui::config))),
        open("/docs", Serve::Beside),
        open("/docs/", Serve::Beside),
        open("/docs/{*rest}", Serve::Beside),
        open("/openapi.json", Serve::Beside),
        // The agents' API.
        cluster(
            "/internal/v1/nodes/register",
            handlers!(post(internal::register)),
        ),
        cluster(
            "/internal/v1/nodes/heartbeat",
            handlers!(post(internal::heartbeat)),
        ),
        cluster(
            "/internal/v1/instances/state",
            handlers!(post(internal::state_changed)),
        ),
        cluster(
            "/internal/v1/instances/events",
            handlers!(post(internal::instance_event)),
        ),
        cluster("/internal/v1/nodes/drain", handlers!(post(internal::drain))),
        cluster(
            "/internal/v1/nodes/drain/report",
            handlers!(post(internal::drain_report)),
        ),
    ]
};

/// REST actions' bodies may carry an `html` of `actions.max_html_bytes`,
/// which JSON may escape up to six times.
fn action_body_limit(control_plane: &ControlPlane) -> axum::extract::DefaultBodyLimit {
    let limit = control_plane
        .config
        .actions
        .max_html_bytes
        .saturating_mul(6)
        .saturating_add(1 << 20);
    axum::extract::DefaultBodyLimit::max(limit)
}

/// The table's routes that it serves itself, at each of their mounts; the
/// agents' behind the cluster token.
pub fn table_router(control_plane: &Arc<ControlPlane>) -> axum::Router<Arc<ControlPlane>> {
    let (mut public, mut agents) = (axum::Router::new(), axum::Router::new());
    for route in ROUTES {
        let Serve::Handlers(serve) = route.serve else {
            continue;
        };
        for mount in route.mounts {
            let path = format!("{mount}{}", route.path);
            match route.access {
                Access::Cluster => agents = agents.route(&path, serve(control_plane)),
                _ => public = public.route(&path, serve(control_plane)),
            }
        }
    }
    public.merge(agents.route_layer(axum::middleware::from_fn_with_state(
        control_plane.clone(),
        internal::require_cluster_token,
    )))
}

/// Adds the table's operations to the OpenAPI document.
pub fn document(openapi: &mut utoipa::openapi::OpenApi) {
    for add in ROUTES.iter().flat_map(|route| route.docs) {
        add(openapi);
    }
}

/// The route of the table that serves `path`, if any.
pub fn route_of(path: &str) -> Option<&'static ApiRoute> {
    ROUTES.iter().find(|route| {
        route.mounts.iter().any(|mount| {
            path.strip_prefix(mount)
                .is_some_and(|rest| shaped_like(route.path, rest))
        })
    })
}

/// Whether `path` is served without an API key (the door's open routes
/// included): with `metrics_open`, `/metrics` too.
pub fn is_open(path: &str, metrics_open: bool) -> bool {
    let access = route_of(path).map(|route| route.access);
    super::door::is_open(path)
        || match access {
            Some(Access::Open | Access::Cluster) => true,
            Some(Access::Metrics) => metrics_open,
            Some(Access::Key) | None => false,
        }
}

/// Whether `path` is the agents' (cluster token, no rate limit).
pub fn is_agents(path: &str) -> bool {
    // Every request asks: most are answered by the prefix alone.
    path.starts_with("/internal/")
        && route_of(path).is_some_and(|route| route.access == Access::Cluster)
}

/// Whether `path` is under WebDriver's endpoints (`/session…` at any of its
/// mounts, or anything under `/wd/hub/`): its refusals are in WebDriver's
/// shape.
pub fn is_webdriver(path: &str) -> bool {
    WEBDRIVER_MOUNTS.iter().any(|mount| {
        path.strip_prefix(mount).is_some_and(|rest| {
            rest == "/session"
                || rest.starts_with("/session/")
                || (!mount.is_empty() && rest.starts_with('/'))
        })
    })
}

/// Whether `path` has the shape of `pattern`: literal segments equal,
/// `{name}` one non-empty segment, `{*rest}` whatever follows, not empty.
pub fn shaped_like(pattern: &str, path: &str) -> bool {
    let mut wanted = pattern.split('/');
    let mut given = path.split('/');
    loop {
        match (wanted.next(), given.next()) {
            (None, None) => return true,
            (Some(w), Some(g)) if w.starts_with("{*") => {
                return !g.is_empty() || given.next().is_some();
            }
            (Some(w), Some(g)) if w.starts_with('{') => {
                if g.is_empty() {
                    return false;
                }
            }
            (Some(w), Some(g)) if w == g => {}
            _ => return false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_paths_come_from_the_table() {
        for path in [
            "/health",
            "/v2/tokens/verify",
            "/openapi.json",
            "/status",
            "/wd/hub/status",
            "/",
            "/ui",
            "/ui/",
            "/ui/app.js",
            "/docs",
            "/docs/",
            "/docs/index.html",
            "/live/abc",
            "/live/abc/ws",
            "/live/abc/done",
            "/internal/v1/nodes/register",
            "/json/version",
            "/json/protocol",
        ] {
            assert!(is_open(path, false), "{path} is open");
        }
        for path in [
            "/v2/instances",
            "/v2/instances/i-1",
            "/v2/nodes",
            "/session",
            "/wd/hub/session",
            "/wd/hub/session/x/url",
            "/mcp",
            "/v2/playwright",
            "/v2/whoami",
            "/nowhere",
            "/healthz",
            "/ui/../v2/nodes",
            "/live",
            "/live/",
            // Only the table's own paths are open, never what lies under a
            // prefix of theirs.
            "/internal/v1/bogus",
            "/internal/v1/nodes/register/",
            "/ui/x",
            "/live/abc/other",
            "//health",
            "/HEALTH",
        ] {
            assert!(!is_open(path, true), "{path} needs a key");
        }
        assert!(!is_agents("/internal/v1/bogus"), "not rate-exempt either");
        assert!(is_open("/metrics", true));
        assert!(!is_open("/metrics", false));
        assert!(is_agents("/internal/v1/instances/state"));
        assert!(!is_agents("/v2/instances"));
    }

    #[test]
    fn webdriver_paths_are_known_by_their_mounts() {
        for path in [
            "/session",
            "/session/x/url",
            "/wd/hub/session",
            "/wd/hub/status",
            "/wd/hub/x",
        ] {
            assert!(is_webdriver(path), "{path}");
        }
        for path in ["/status", "/sessions", "/v2/instances", "/wd/hubx/session"] {
            assert!(!is_webdriver(path), "{path}");
        }
    }
}
