//! Kept recordings (`config.keep_recordings`): when such an instance is
//! deleted its agent moves its recordings to the snapshot store; here they
//! are listed, served and deleted. The store is their only record (a
//! description beside each video), so they outlive the instance and need no
//! table.

use std::sync::Arc;

use flotilla_api_types::MessageResponse;
use flotilla_api_types::instances::{KeptRecording, KeptRecordingList, KeptRecordingQuery};

use super::ControlPlane;
use crate::artifacts::{ArtifactStore, VideoStream};
use crate::error::{Error, Result};

fn not_found(id: &str) -> Error {
    Error::NotFound(format!(
        "no kept recording {id:?}; GET /v2/recordings lists them"
    ))
}

impl ControlPlane {
    pub async fn recordings_kept(&self, query: &KeptRecordingQuery) -> Result<KeptRecordingList> {
        let Some(store) = &self.snapshots else {
            return Ok(KeptRecordingList {
                recordings: Vec::new(),
            });
        };
        let mut recordings = store.recordings_kept().await.map_err(unavailable(store))?;
        if let Some(instance) = &query.instance_id {
            recordings.retain(|recording| &recording.instance_id == instance);
        }
        Ok(KeptRecordingList { recordings })
    }

    /// A kept recording's description and video.
    pub async fn recording_kept(&self, id: &str) -> Result<(KeptRecording, VideoStream)> {
        let store = self.snapshots.as_ref().ok_or_else(|| not_found(id))?;
        let recording = store
            .recording_kept(id)
            .await
            .map_err(unavailable(store))?
            .ok_or_else(|| not_found(id))?;
        let video = store
            .recording_kept_video(id)
            .await
            .map_err(unavailable(store))?
            .ok_or_else(|| not_found(id))?;
        Ok((recording, video))
    }

    pub async fn recording_kept_delete(&self, id: &str) -> Result<MessageResponse> {
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

/// A store failure, as a retryable 503 that names the store.
fn unavailable(store: &Arc<dyn ArtifactStore>) -> impl Fn(anyhow::Error) -> Error + '_ {
    move |error| {
        Error::InsufficientCapacity(format!(
            "the snapshot store ({}) cannot be read: {error}",
            store.location()
        ))
    }
}
