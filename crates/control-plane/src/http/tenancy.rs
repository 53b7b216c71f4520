//! The tenant scope on the REST routes, before any handler runs: a tenant's
//! key asking about another tenant's instance (`/v2/instances/{id}` and
//! everything under it: park, revive, live links, the front door's
//! protocols, downloads, recordings) gets the 404 of an instance that never
//! was, and the routes of [`ADMIN_PATHS`] answer a tenant 404 as routes
//! that are not there. Lists, creates and the objects that are not
//! instances (profiles, extensions, kept recordings, metrics, event tokens)
//! are scoped by their handlers ([`crate::app::tenants`]).

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use flotilla_api_types::InstanceId;

use crate::app::{ControlPlane, Scope};
use crate::error::Error;

/// Paths only an admin key may use: what is fleet-wide (nodes and their
/// drains, alerts, the Prometheus exposition). Profiles, extensions, kept
/// recordings, `/v2/metrics` and event tokens are scoped by their handlers.
const ADMIN_PATHS: &[&str] = &["/v2/nodes", "/v2/alerts", "/metrics"];

/// The middleware (runs after the guard put the request's [`Scope`]).
pub async fn scope_instances(
    State(control_plane): State<Arc<ControlPlane>>,
    request: Request,
    next: Next,
) -> Response {
    let Some(scope @ Scope::Tenant(_)) = request.extensions().get::<Scope>().cloned() else {
        return next.run(request).await;
    };
    let path = request.uri().path();
    if ADMIN_PATHS
        .iter()
        .any(|admin| path == *admin || path.starts_with(&format!("{admin}/")))
    {
        return Error::NotFound(format!("no such resource: {path}")).into_response();
    }
    if let Some(id) = instance_in_path(path)
        && let Err(error) = control_plane.instance_in_scope(&id, &scope).await
    {
        return error.into_response();
    }
    next.run(request).await
}

/// The instance `/v2/instances/{id}[/…]` names.
fn instance_in_path(path: &str) -> Option<InstanceId> {
    let rest = path.strip_prefix("/v2/instances/")?;
    let id = rest.split('/').next().filter(|id| !id.is_empty())?;
    Some(InstanceId::new(id))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_instance_a_path_names() {
        assert_eq!(
            instance_in_path("/v2/instances/i-1/live/x"),
            Some(InstanceId::new("i-1"))
        );
        assert_eq!(
            instance_in_path("/v2/instances/i-1"),
            Some(InstanceId::new("i-1"))
        );
        assert_eq!(instance_in_path("/v2/instances"), None);
        assert_eq!(instance_in_path("/v2/instances/"), None);
        assert_eq!(instance_in_path("/v2/profiles/x"), None);
    }
}
