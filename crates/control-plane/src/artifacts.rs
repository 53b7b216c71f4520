//! What the control plane needs of the store where the node side keeps its
//! artifacts (snapshots, saved profiles, extension zips): delete them with
//! what they belong to, keep an uploaded extension, and check that an upload
//! is an extension the agent will be able to unpack. The control plane knows
//! the store only through this trait; `flotilla-server` implements it over
//! the node agent's snapshot store, so the check at upload and the unpack
//! before a launch are the same code.

use async_trait::async_trait;
use bytes::Bytes;

use flotilla_api_types::InstanceId;

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
    fn extension_inspect(&self, zip: &[u8]) -> Result<ExtensionManifest, String>;
}
