//! Kept recordings (`config.keep_recordings`): when such an instance is
//! deleted its agent moves its recordings to the snapshot store; here they
//! are listed, served and deleted. The store is their only record (a
//! description beside each video), so they outlive the instance; the
//! store's `kept_recording_owners` says which tenant's they are. A tenant's
//! key sees its own only; another's is the 404 of one that never was.

use std::sync::Arc;

use flotilla_api_types::MessageResponse;
use flotilla_api_types::instances::{KeptRecording, KeptRecordingList, KeptRecordingQuery};

use super::{ControlPlane, Scope};
use crate::artifacts::{ArtifactStore, VideoStream};
use crate::error::{Error, Result};

fn not_found(id: &str) -> Error {
    Error::NotFound(format!(
        "no kept recording {id:?}; GET /v2/recordings lists them"
    ))
}

impl ControlPlane {
    pub async fn recordings_kept(
        &self,
        query: &KeptRecordingQuery,
        scope: &Scope,
    ) -> Result<KeptRecordingList> {
        let Some(store) = &self.snapshots else {
            return Ok(KeptRecordingList {
                recordings: Vec::new(),
            });
        };
        let mut recordings = store.recordings_kept().await.map_err(unavailable(store))?;
        if let Some(instance) = &query.instance_id {
            recordings.retain(|recording| &recording.instance_id == instance);
        }
        if let Some(tenant) = scope.tenant() {
            let own = self.store.kept_recordings_of_tenant(tenant).await?;
            recordings
                .retain(|recording| own.iter().any(|id| id == recording.instance_id.as_str()));
        }
        Ok(KeptRecordingList { recordings })
    }

    /// A kept recording's description and video.
    pub async fn recording_kept(
        &self,
        id: &str,
        scope: &Scope,
    ) -> Result<(KeptRecording, VideoStream)> {
        let recording = self.recording_in_scope(id, scope).await?;
        let store = self.snapshots.as_ref().ok_or_else(|| not_found(id))?;
        let video = store
            .recording_kept_video(id)
            .await
            .map_err(unavailable(store))?
            .ok_or_else(|| not_found(id))?;
        Ok((recording, video))
    }

    pub async fn recording_kept_delete(&self, id: &str, scope: &Scope) -> Result<MessageResponse> {
        self.recording_in_scope(id, scope).await?;
        let store = self.snapshots.as_ref().ok_or_else(|| not_found(id))?;
        if !store
            .recording_kept_delete(id)
            .await
            .map_err(unavailable(store))?
        {
            return Err(not_found(id));
        }
        tracing::info!(recording = id, "kept recording deleted");
        Ok(MessageResponse {
            message: format!("recording {id} deleted"),
        })
    }
}

impl ControlPlane {
    /// Kept recording `id`'s description when `scope` sees it (its
    /// instance's tenant's, or any for an admin).
    async fn recording_in_scope(&self, id: &str, scope: &Scope) -> Result<KeptRecording> {
        let store = self.snapshots.as_ref().ok_or_else(|| not_found(id))?;
        let recording = store
            .recording_kept(id)
            .await
            .map_err(unavailable(store))?
            .ok_or_else(|| not_found(id))?;
        if let Scope::Tenant(_) = scope {
            let owner = self
                .store
                .kept_recordings_owner(recording.instance_id.as_str())
                .await?;
            if !scope.sees(owner.as_deref()) {
                return Err(not_found(id));
            }
        }
        Ok(recording)
    }
}

/// A store failure, as a retryable 503 that names the store.
fn unavailable(store: &Arc<dyn ArtifactStore>) -> impl Fn(anyhow::Error) -> Error + '_ {
    move |error| {
        Error::InsufficientCapacity(format!(
            "the snapshot store ({}) cannot be read: {error}",
            store.location()
        ))
    }
}
