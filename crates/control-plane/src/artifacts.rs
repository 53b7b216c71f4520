//! What the control plane needs of the store where the node side keeps its
//! artifacts (snapshots, saved profiles, extension zips, kept recordings):
//! delete them with what they belong to, keep an uploaded extension, check
//! that an upload is an extension the agent will be able to unpack, and
//! list, serve and delete the recordings agents kept there. The control plane knows
//! the store only through this trait; `flotilla-server` implements it over
//! the node agent's snapshot store, so the check at upload and the unpack
//! before a launch are the same code.

use async_trait::async_trait;
use bytes::Bytes;

use flotilla_api_types::InstanceId;
use flotilla_api_types::extensions::ExtensionRefusal;
use flotilla_api_types::instances::KeptRecording;

/// A video, chunk by chunk.
pub type VideoStream = futures_util::stream::BoxStream<'static, std::io::Result<Bytes>>;

/// What an extension's manifest says of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExtensionManifest {
    pub name: String,
    pub version: String,
}

#[async_trait]
pub trait ArtifactStore: Send + Sync {
    /// Where the store is (a directory or an `s3://` URL), for messages.
    fn location(&self) -> String;
    /// Deletes every snapshot of an instance; answers how many there were.
    async fn snapshots_delete_all(&self, instance: &InstanceId) -> anyhow::Result<usize>;
    async fn profile_delete(&self, name: &str) -> anyhow::Result<()>;
    async fn extension_put(&self, id: &str, zip: Bytes) -> anyhow::Result<()>;
    async fn extension_delete(&self, id: &str) -> anyhow::Result<()>;
    /// Checks that `zip` is a loadable extension (CPU-bound: run it off the
    /// async threads); the error says why not, for the uploader.
    fn extension_inspect(&self, zip: &[u8]) -> Result<ExtensionManifest, ExtensionRefusal>;
    /// The kept recordings, oldest first.
    async fn recordings_kept(&self) -> anyhow::Result<Vec<KeptRecording>>;
    /// One kept recording; `None` when there is none with that id.
    async fn recording_kept(&self, id: &str) -> anyhow::Result<Option<KeptRecording>>;
    /// A kept recording's video; `None` when there is none with that id.
    async fn recording_kept_video(&self, id: &str) -> anyhow::Result<Option<VideoStream>>;
    /// Deletes a kept recording; `false` when there was none with that id.
    async fn recording_kept_delete(&self, id: &str) -> anyhow::Result<bool>;
}
