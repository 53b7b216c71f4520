//! API keys as tenants: what a request's key may see and do
//! ([`Scope`]), and each tenant's quotas (`[[tenants]]`).
//!
//! An `admin` key (`api_keys`) sees the whole fleet, as every key did
//! before tenants. A `tenant` key sees and acts only on what its tenant
//! made: instances (and through them their sessions of every protocol,
//! downloads, recordings, live links and events), profiles, extensions,
//! kept recordings. Another tenant's object, and anything fleet-wide
//! (nodes, drains, metrics, alerts), answers 404 as if it did not exist,
//! never 403. With authentication off every request is `Admin`.
//!
//! The tenant is written on what it makes (an instance's, a profile's and
//! an extension's `tenant`; `NULL` for an admin's) and checked against the
//! record read: [`Scope::sees`].

use std::sync::Arc;

use crate::error::{Error, Result};

/// What a request may see: the whole fleet, or one tenant's objects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    Admin,
    Tenant(Arc<str>),
}

impl Scope {
    /// The tenant written on what this scope makes (`None` for an admin).
    pub fn tenant(&self) -> Option<&str> {
        match self {
            Scope::Admin => None,
            Scope::Tenant(name) => Some(name),
        }
    }

    /// Whether an object of `owner` (its `tenant`) is visible.
    pub fn sees(&self, owner: Option<&str>) -> bool {
        match self {
            Scope::Admin => true,
            Scope::Tenant(name) => owner == Some(name.as_ref()),
        }
    }

    /// `Ok` for an admin; for a tenant the 404 of a route that is not there
    /// (fleet-wide routes: nodes, drains, metrics, alerts).
    pub fn admin_only(&self, what: &str) -> Result<()> {
        match self {
            Scope::Admin => Ok(()),
            Scope::Tenant(_) => Err(Error::NotFound(format!("no such resource: {what}"))),
        }
    }
}

/// A tenant's quotas (0: no limit).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Quota {
    pub max_instances: u32,
    pub max_sessions: u32,
}

impl crate::app::ControlPlane {
    /// Tenant `name`'s quotas (none for a tenant no longer configured).
    pub fn tenant_quota(&self, name: &str) -> Quota {
        self.config
            .tenants
            .iter()
            .find(|tenant| tenant.name == name)
            .map(|tenant| Quota {
                max_instances: tenant.max_instances,
                max_sessions: tenant.max_sessions,
            })
            .unwrap_or_default()
    }

    /// Whether `scope` may open one more session (WebDriver or MCP): its
    /// tenant holds fewer than its `max_sessions`. Checked as a session
    /// opens (two opening at once may both pass).
    pub async fn tenant_may_open_session(&self, scope: &Scope) -> Result<()> {
        let Some(tenant) = scope.tenant() else {
            return Ok(());
        };
        let quota = self.tenant_quota(tenant).max_sessions;
        if quota == 0 {
            return Ok(());
        }
        let held = self.store.webdriver_sessions_of_tenant(tenant).await?
            + self.mcp_sessions_of_tenant(tenant).await?;
        if held >= u64::from(quota) {
            return Err(over_quota(tenant, "sessions", "max_sessions", quota));
        }
        Ok(())
    }

    /// Instance `id`'s record when `scope` sees it; a tenant's view of
    /// another's instance is the 404 of one that never was.
    pub async fn instance_in_scope(
        &self,
        id: &flotilla_api_types::InstanceId,
        scope: &Scope,
    ) -> Result<crate::store::InstanceRecord> {
        self.store
            .instance_get(id)
            .await?
            .filter(|record| scope.sees(record.tenant.as_deref()))
            .ok_or_else(|| super::instances::not_found(id))
    }
}

/// The refusal of a create past a quota.
pub fn over_quota(tenant: &str, what: &str, key: &str, limit: u32) -> Error {
    Error::RateLimited {
        detail: format!(
            "tenant {tenant} holds {limit} {what}, its quota (tenants.{key}): end one, or ask the operator for more"
        ),
        retry_after_sec: 5,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenant_sees_only_its_own_and_an_admin_everything() {
        let acme = Scope::Tenant("acme".into());
        assert!(acme.sees(Some("acme")));
        assert!(!acme.sees(Some("globex")));
        assert!(!acme.sees(None), "an admin's object");
        assert!(Scope::Admin.sees(Some("acme")));
        assert!(Scope::Admin.sees(None));
        assert!(Scope::Admin.admin_only("nodes").is_ok());
        assert!(matches!(acme.admin_only("nodes"), Err(Error::NotFound(_))));
        assert_eq!(acme.tenant(), Some("acme"));
        assert_eq!(Scope::Admin.tenant(), None);
    }
}
