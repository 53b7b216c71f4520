//! Persistent profiles: create, list, get and delete them, and take one for a
//! new instance. Their saved state lives in the snapshot store; the node that
//! runs an instance unpacks it before the first launch and, with `persist`,
//! writes it back on a graceful delete or a park (see the agent). At most one
//! instance holds a profile for writing back at a time: two writers would
//! overwrite each other's state.

use flotilla_api_types::profiles::{
    CreateProfileRequest, Profile, ProfileList, ProfileUse, check_profile_name,
};
use flotilla_api_types::{InstanceId, MessageResponse};

use super::ControlPlane;
use crate::error::{Error, Result};

fn not_found(name: &str) -> Error {
    Error::NotFound(format!("profile {name} not found"))
}

impl ControlPlane {
    pub async fn profile_create(&self, request: CreateProfileRequest) -> Result<Profile> {
        check_profile_name(&request.name)?;
        self.store
            .profile_create(&request.name, self.now())
            .await?
            .ok_or_else(|| Error::InvalidState(format!("profile {} exists already", request.name)))
    }

    pub async fn profile_list(&self) -> Result<ProfileList> {
        Ok(ProfileList {
            profiles: self
                .store
                .profile_list()
                .await?
                .into_iter()
                .map(|record| record.profile)
                .collect(),
        })
    }

    pub async fn profile_get(&self, name: &str) -> Result<Profile> {
        self.store
            .profile_get(name)
            .await?
            .map(|record| record.profile)
            .ok_or_else(|| not_found(name))
    }

    /// Deletes a profile and its saved state; refused while an instance
    /// holds it for writing back.
    pub async fn profile_delete(&self, name: &str) -> Result<MessageResponse> {
        match self.store.profile_delete(name).await? {
            Ok(true) => {}
            Ok(false) => return Err(not_found(name)),
            Err(holder) => {
                return Err(Error::InvalidState(format!(
                    "profile {name} is in use by instance {holder} (persist); delete that instance first"
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
            message: format!("profile {name} deleted"),
        })
    }

    /// Checks the `profile` of a create: a valid name of an existing profile.
    pub(crate) async fn profile_check(&self, profile: &ProfileUse) -> Result<()> {
        check_profile_name(&profile.name)
            .map_err(|invalid| Error::InvalidRequest(format!("profile.name: {invalid}")))?;
        if self.store.profile_get(&profile.name).await?.is_none() {
            return Err(Error::InvalidRequest(format!(
                "profile.name: no profile named {}; create it with POST /v2/profiles",
                profile.name
            )));
        }
        Ok(())
    }

    /// With `persist`, makes `instance` the profile's one writer (409 when
    /// another instance is); the hold ends when the instance's record goes.
    pub(crate) async fn profile_take(
        &self,
        profile: &ProfileUse,
        instance: &InstanceId,
    ) -> Result<()> {
        if !profile.persist {
            return Ok(());
        }
        match self.store.profile_hold(&profile.name, instance).await? {
            Ok(()) => Ok(()),
            Err(Some(holder)) => Err(Error::InvalidState(format!(
                "profile {} is in use by instance {holder} with persist; start with \"persist\": false to read it, or delete that instance first",
                profile.name
            ))),
            Err(None) => Err(Error::InvalidRequest(format!(
                "profile.name: no profile named {}; create it with POST /v2/profiles",
                profile.name
            ))),
        }
    }
}
