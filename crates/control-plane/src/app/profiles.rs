//! Persistent profiles: create, list, get and delete them, and take one for a
//! new instance. Their saved state lives in the snapshot store; the node that
//! runs an instance unpacks it before the first launch and, with `persist`,
//! writes it back on a graceful delete or a park (see the agent). At most one
//! instance holds a profile for writing back at a time: two writers would
//! overwrite each other's state.
//!
//! Each tenant has its own names: a tenant's profile `work` is stored as
//! `<tenant>~work` (`~` is in no profile's nor tenant's name), so two
//! tenants may both have a `work` and neither learns of the other's. A
//! tenant's key names and sees its profiles by their own names; an admin's
//! key lists every profile by the name it is stored under, and reads or
//! deletes a tenant's as `<tenant>~<name>`.

use flotilla_api_types::profiles::{
    CreateProfileRequest, Profile, ProfileList, ProfileUse, check_profile_name,
};
use flotilla_api_types::{InstanceId, MessageResponse};

use super::{ControlPlane, Scope};
use crate::error::{Error, Result};

fn not_found(name: &str) -> Error {
    Error::NotFound(format!("profile {name} not found"))
}

/// What separates a tenant's name from its profile's in a stored name.
const TENANT_SEPARATOR: char = '~';

/// The name profile `name`, as `scope` calls it, is stored under (unchecked).
fn stored_name(scope: &Scope, name: &str) -> String {
    match scope.tenant() {
        Some(tenant) => format!("{tenant}{TENANT_SEPARATOR}{name}"),
        None => name.to_owned(),
    }
}

/// The name `scope` calls the profile stored as `stored`.
fn shown_name(scope: &Scope, stored: &str) -> String {
    own_name(scope.tenant(), stored).to_owned()
}

/// The name `tenant` (or an admin) calls the profile stored as `stored`.
pub(crate) fn own_name<'s>(tenant: Option<&str>, stored: &'s str) -> &'s str {
    tenant
        .and_then(|tenant| stored.strip_prefix(tenant))
        .and_then(|rest| rest.strip_prefix(TENANT_SEPARATOR))
        .unwrap_or(stored)
}

/// Profile `name` as `scope` names it: checked (a tenant's must be a plain
/// name), stored name.
fn checked_name(scope: &Scope, name: &str) -> Result<String> {
    if scope.tenant().is_some() || !name.contains(TENANT_SEPARATOR) {
        check_profile_name(name).map_err(|_| not_found(name))?;
    }
    Ok(stored_name(scope, name))
}

impl ControlPlane {
    pub async fn profile_create(
        &self,
        request: CreateProfileRequest,
        scope: &Scope,
    ) -> Result<Profile> {
        check_profile_name(&request.name)?;
        let stored = stored_name(scope, &request.name);
        let mut profile = self
            .store
            .profile_create((&stored, scope.tenant()), self.now())
            .await?
            .ok_or_else(|| {
                Error::InvalidState(format!("profile {} exists already", request.name))
            })?;
        profile.name = request.name;
        Ok(profile)
    }

    pub async fn profile_list(&self, scope: &Scope) -> Result<ProfileList> {
        let records = self.store.profile_list(scope.tenant()).await?;
        Ok(ProfileList {
            profiles: records
                .into_iter()
                .map(|record| Profile {
                    name: shown_name(scope, &record.profile.name),
                    ..record.profile
                })
                .collect(),
        })
    }

    pub async fn profile_get(&self, name: &str, scope: &Scope) -> Result<Profile> {
        let stored = checked_name(scope, name)?;
        let record = self.store.profile_get(&stored).await?;
        record
            .map(|record| Profile {
                name: name.to_owned(),
                ..record.profile
            })
            .ok_or_else(|| not_found(name))
    }

    /// Deletes a profile and its saved state; refused while an instance
    /// holds it for writing back.
    pub async fn profile_delete(&self, name: &str, scope: &Scope) -> Result<MessageResponse> {
        let shown = name;
        let name = &checked_name(scope, shown)?;
        match self.store.profile_delete(name).await? {
            Ok(true) => {}
            Ok(false) => return Err(not_found(shown)),
            Err(holder) => {
                return Err(Error::InvalidState(format!(
                    "profile {shown} is in use by instance {holder} (persist); delete that instance first"
                )));
            }
        }
        if let Some(snapshots) = &self.snapshots
            && let Err(error) = snapshots.profile_delete(name).await
        {
            tracing::warn!(profile = name, %error, "cannot delete the profile's saved state");
        }
        tracing::info!(profile = name, "profile deleted");
        Ok(MessageResponse {
            message: format!("profile {shown} deleted"),
        })
    }

    /// Checks the `profile` of a create (a valid name of an existing profile
    /// `scope` sees) and returns it under its stored name, as the instance
    /// records and its node uses it.
    pub(crate) async fn profile_check(
        &self,
        profile: &ProfileUse,
        scope: &Scope,
    ) -> Result<ProfileUse> {
        check_profile_name(&profile.name)
            .map_err(|invalid| Error::InvalidRequest(format!("profile.name: {invalid}")))?;
        let stored = ProfileUse {
            name: stored_name(scope, &profile.name),
            persist: profile.persist,
        };
        if self.store.profile_get(&stored.name).await?.is_none() {
            return Err(Error::InvalidRequest(format!(
                "profile.name: no profile named {}; create it with POST /v2/profiles",
                profile.name
            )));
        }
        Ok(stored)
    }

    /// With `persist`, makes `instance` the profile's one writer (409 when
    /// another instance is); the hold ends when the instance's record goes.
    pub(crate) async fn profile_take(
        &self,
        profile: &ProfileUse,
        (instance, scope): (&InstanceId, &Scope),
    ) -> Result<()> {
        if !profile.persist {
            return Ok(());
        }
        let shown = shown_name(scope, &profile.name);
        match self.store.profile_hold(&profile.name, instance).await? {
            Ok(()) => Ok(()),
            Err(Some(holder)) => Err(Error::InvalidState(format!(
                "profile {shown} is in use by instance {holder} with persist; start with \"persist\": false to read it, or delete that instance first"
            ))),
            Err(None) => Err(Error::InvalidRequest(format!(
                "profile.name: no profile named {shown}; create it with POST /v2/profiles"
            ))),
        }
    }
}
