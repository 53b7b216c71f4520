//! The front door's domain: which instance a request names (by path or by
//! `Host: <subdomain>.<gateway.base_domain>`), whether its credential opens
//! it, and where its ports are. The forwarding itself is `http::door`.
//!
//! Credentials are those of the instance ports: an API key (checked by the
//! guard) or the instance's own token, compared in constant time with the
//! token derived for the id asked for — before the record is read, so that a
//! wrong token cannot tell which ids exist.

use flotilla_api_types::InstanceId;
use flotilla_api_types::credentials::constant_time_eq;
use flotilla_api_types::instances::InstanceStatus;

use super::ControlPlane;
use super::instances::not_found;
use crate::error::{Error, Result};
use crate::store::InstanceRecord;

/// The instance `host` names under `base_domain`: its first (and only
/// extra) label is the instance's subdomain, the id without dashes.
pub fn subdomain_instance(base_domain: &str, host: &str) -> Option<InstanceId> {
    let host = match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    };
    let cut = host.len().checked_sub(base_domain.len() + 1)?;
    if host.as_bytes().get(cut) != Some(&b'.') || !host[cut + 1..].eq_ignore_ascii_case(base_domain)
    {
        return None;
    }
    let label = &host[..cut];
    if label.len() != 32 || !label.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let uuid = uuid::Uuid::try_parse(label).ok()?;
    Some(InstanceId::new(uuid.hyphenated().to_string()))
}

/// Where a door request goes.
#[derive(Debug, Clone)]
pub struct DoorTarget {
    pub id: InstanceId,
    /// The node's host as the control plane reaches it.
    pub host: String,
    /// debug, stream, http.
    pub ports: [u16; 3],
    /// The credential the instance ports take (authentication on).
    pub token: Option<String>,
}

impl ControlPlane {
    /// Instance `id`'s record, unless it has ended (`failed`, `stopped`):
    /// then a 409 that says it has `lacking`.
    pub(crate) async fn instance_not_ended(
        &self,
        id: &InstanceId,
        lacking: &str,
    ) -> Result<InstanceRecord> {
        let record = self
            .store
            .instance_get(id)
            .await?
            .ok_or_else(|| not_found(id))?;
        refuse_ended(&record, lacking)?;
        Ok(record)
    }

    /// Any running instance, to answer what every browser of the fleet
    /// answers alike (the DevTools protocol's description).
    pub async fn door_any_running(&self) -> Result<DoorTarget> {
        let running = self.store.instances_in(&[InstanceStatus::Running]).await?;
        let Some(record) = running.into_iter().next() else {
            return Err(Error::InsufficientCapacity(
                "no browser is running to describe the DevTools protocol: create an instance first"
                    .into(),
            ));
        };
        self.door_open(&record.id, Some((&super::Scope::Admin, None)), &[])
            .await
    }

    /// The instance a `Host` names under `gateway.base_domain`.
    pub fn door_instance_of_host(&self, host: &str) -> Option<InstanceId> {
        subdomain_instance(self.config.gateway.base_domain.as_deref()?, host)
    }

    /// Opens the door to instance `id` for a request that carried an API key
    /// (`key`: what it sees, another tenant's instance is not found; and who
    /// it is, when a WebDriver session's instance must be its key's) or
    /// presents `tokens`; where its ports are.
    pub async fn door_open(
        &self,
        id: &InstanceId,
        key: Option<(&super::Scope, Option<&str>)>,
        tokens: &[&str],
    ) -> Result<DoorTarget> {
        if self.config.auth_enabled && key.is_none() {
            let expected = self.instance_token(id).await?;
            let admitted = tokens.iter().fold(false, |found, presented| {
                found | constant_time_eq(presented.as_bytes(), expected.as_bytes())
            });
            if !admitted {
                return Err(Error::Unauthorized(if tokens.is_empty() {
                    "this instance needs a credential: send Authorization: Bearer <API key or instance token>, or ?token=<instance token> (urls.debug and urls.stream carry it)".into()
                } else {
                    "invalid credential for this instance: use an API key or this instance's own token".into()
                }));
            }
        }
        let record = match key {
            Some((scope, principal)) => {
                let record = self.instance_in_scope(id, scope).await?;
                // A WebDriver session's browser is its key's alone.
                if self.config.auth_enabled
                    && let (Some(owner), Some(principal)) = (&record.webdriver_owner, principal)
                    && owner != principal
                {
                    return Err(not_found(id));
                }
                record
            }
            None => self
                .store
                .instance_get(id)
                .await?
                .ok_or_else(|| not_found(id))?,
        };
        self.door_target_of(record).await
    }

    /// Where the door reaches instance `record` (read by the caller, who
    /// checked who may reach it): its node's host, its ports, its token.
    pub(crate) async fn door_target_of(&self, record: InstanceRecord) -> Result<DoorTarget> {
        let id = &record.id;
        refuse_ended(&record, "no browser to reach")?;
        let ports = record.ports.ok_or_else(|| {
            Error::InsufficientCapacity(format!(
                "instance {id} has no ports yet; retry in a moment"
            ))
        })?;
        let hosts = self.node_hosts(&record.node_id).await?.ok_or_else(|| {
            Error::InsufficientCapacity(format!(
                "node {} of instance {id} is unknown; retry in a moment",
                record.node_id
            ))
        })?;
        Ok(DoorTarget {
            id: id.clone(),
            host: hosts.agent_host,
            ports,
            token: self.url_token(id).await?,
        })
    }
}

/// The refusal of an instance that has ended (failed or stopped): it has
/// `lacking`.
fn refuse_ended(record: &InstanceRecord, lacking: &str) -> Result<()> {
    if matches!(
        record.status,
        InstanceStatus::Failed | InstanceStatus::Stopped
    ) {
        return Err(Error::InvalidState(format!(
            "instance {} is {}: it has {lacking}",
            record.id, record.status
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subdomains_name_instances_under_the_base_domain_only() {
        let id = "01a20aa0-044c-77c1-be6f-8dd33588a4ba";
        let sub = id.replace('-', "");
        let of =
            |host: &str| subdomain_instance("browsers.example.com", host).map(|i| i.to_string());
        for host in [
            format!("{sub}.browsers.example.com"),
            format!("{sub}.Browsers.Example.com:8443"),
            format!("{}.browsers.example.com", sub.to_uppercase()),
        ] {
            assert_eq!(of(&host).as_deref(), Some(id), "{host}");
        }
        for host in [
            format!("{sub}.browsers.example.com.evil.net"),
            format!("x.{sub}.browsers.example.com"),
            format!("{sub}browsers.example.com"),
            "browsers.example.com".to_owned(),
            ".browsers.example.com".to_owned(),
            format!("{}.browsers.example.com", &sub[..31]),
            format!("{sub}.other.example.com"),
            format!("{id}.browsers.example.com"),
        ] {
            assert_eq!(of(&host), None, "{host}");
        }
    }
}
