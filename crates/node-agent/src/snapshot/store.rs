//! [`SnapshotStore`]: archives, saved profiles, extension zips and kept recordings in a
//! directory (`file://`) or an S3-compatible bucket (`s3://`), through
//! `object_store`. A put is atomic: an object is either complete or absent.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use object_store::ObjectStore;
use object_store::path::Path as StorePath;
use serde::{Deserialize, Serialize};

use flotilla_api_types::InstanceId;
use flotilla_api_types::ids::SnapshotId;
use flotilla_api_types::instances::KeptRecording;

/// `[snapshots]`: where dormant instances' archives go.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(default)]
pub struct SnapshotsConfig {
    /// `file:///abs/dir` or `s3://bucket/prefix`; default `file://<data_dir>/snapshots`.
    pub url: Option<String>,
    /// S3 endpoint for S3-compatible servers (MinIO, Ceph, moto); default AWS.
    pub endpoint: Option<String>,
    pub region: Option<String>,
    pub access_key_id: Option<String>,
    pub secret_access_key: Option<String>,
    /// Allow `http://` endpoints (local S3-compatible servers).
    pub allow_http: bool,
    /// How long one operation on an S3 store may take, retries included
    /// (default 30): past it, a park or revive fails with the store named.
    pub timeout_sec: Option<f64>,
    /// Names the store for agents on several machines that share one
    /// directory (an NFS mount): agents with the same `store_id` count as
    /// sharing it. Unset: a `file://` store is shared only on one machine,
    /// an S3 store by its bucket, prefix and endpoint.
    pub store_id: Option<String>,
}

/// This machine's name, for a directory store's identity; a name of this
/// process alone when it cannot be read (then the directory is shared with
/// nobody, rather than with every machine that cannot read its name).
fn machine_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|name| name.trim().to_owned())
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| format!("unnamed-{}", uuid::Uuid::new_v4()))
}

/// Default of `[snapshots] timeout_sec`.
pub const DEFAULT_STORE_TIMEOUT_SEC: f64 = 30.0;

/// Archives of dormant instances, by instance and snapshot id (with the
/// recordings saved at a park, `<instance>/recordings/`), of
/// persistent profiles, by name (`profiles/<name>.tar.zst`), the zips of
/// uploaded extensions, by id (`extensions/<id>.zip`), and kept recordings,
/// by id (`recordings/<id>.mp4` and its description `recordings/<id>.json`).
#[derive(Clone)]
pub struct SnapshotStore {
    store: Arc<dyn ObjectStore>,
    prefix: StorePath,
    /// Where it is, for messages.
    pub location: String,
    /// Which store it is, the same for every agent that shares it:
    /// `file://<host><path>` (a directory is shared only on one machine)
    /// or `s3://<bucket>/<prefix>[@<endpoint>]`. Never a credential.
    pub identity: String,
}

impl SnapshotStore {
    /// Opens the store `config` names (`default_dir` when it names none).
    pub fn open(config: &SnapshotsConfig, default_dir: &Path) -> anyhow::Result<Self> {
        let url = match &config.url {
            Some(url) => url.clone(),
            None => format!("file://{}", default_dir.display()),
        };
        let parsed = url::Url::parse(&url)
            .map_err(|e| anyhow::anyhow!("snapshots.url {url:?} is not a URL: {e}"))?;
        let (store, prefix, mut identity) = match parsed.scheme() {
            "file" => open_directory(&parsed)?,
            "s3" => open_s3(config, &parsed, &url)?,
            other => anyhow::bail!(
                "snapshots.url scheme {other:?} is not supported: use file:// or s3://"
            ),
        };
        if let Some(id) = &config.store_id {
            identity = format!("id:{id}");
        }
        Ok(Self {
            store,
            prefix,
            location: url,
            identity,
        })
    }

    pub(super) fn path(&self, instance: &InstanceId, snapshot: &SnapshotId) -> StorePath {
        self.prefix
            .child(instance.as_str())
            .child(format!("{snapshot}.tar.zst"))
    }

    pub async fn put(
        &self,
        instance: &InstanceId,
        snapshot: &SnapshotId,
        archive: Bytes,
    ) -> anyhow::Result<()> {
        self.store
            .put(&self.path(instance, snapshot), archive.into())
            .await?;
        Ok(())
    }

    pub async fn get(&self, instance: &InstanceId, snapshot: &SnapshotId) -> anyhow::Result<Bytes> {
        Ok(self
            .store
            .get(&self.path(instance, snapshot))
            .await?
            .bytes()
            .await?)
    }

    /// Deletes every archive of `instance`.
    pub async fn delete_all(&self, instance: &InstanceId) -> anyhow::Result<usize> {
        use futures_util::TryStreamExt;
        let prefix = self.prefix.child(instance.as_str());
        let objects: Vec<_> = self.store.list(Some(&prefix)).try_collect().await?;
        for object in &objects {
            self.store.delete(&object.location).await?;
        }
        Ok(objects.len())
    }

    pub async fn delete(&self, instance: &InstanceId, snapshot: &SnapshotId) -> anyhow::Result<()> {
        match self.store.delete(&self.path(instance, snapshot)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(error) => Err(error.into()),
        }
    }

    pub(super) fn profile_path(&self, name: &str) -> StorePath {
        self.prefix
            .child("profiles")
            .child(format!("{name}.tar.zst"))
    }

    /// Stores the saved state of profile `name`.
    pub async fn profile_put(&self, name: &str, archive: Bytes) -> anyhow::Result<()> {
        self.store
            .put(&self.profile_path(name), archive.into())
            .await?;
        Ok(())
    }

    /// The saved state of profile `name`; `None` before its first save.
    pub async fn profile_get(&self, name: &str) -> anyhow::Result<Option<Bytes>> {
        match self.store.get(&self.profile_path(name)).await {
            Ok(object) => Ok(Some(object.bytes().await?)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(error) => Err(error.into()),
        }
    }

    /// The size of profile `name`'s saved state; `None` before its first save.
    pub async fn profile_size(&self, name: &str) -> anyhow::Result<Option<u64>> {
        match self.store.head(&self.profile_path(name)).await {
            Ok(meta) => Ok(Some(meta.size)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(error) => Err(error.into()),
        }
    }

    pub async fn profile_delete(&self, name: &str) -> anyhow::Result<()> {
        match self.store.delete(&self.profile_path(name)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(error) => Err(error.into()),
        }
    }

    pub(super) fn extension_path(&self, id: &str) -> StorePath {
        self.prefix.child("extensions").child(format!("{id}.zip"))
    }

    /// Stores the zip of extension `id`.
    pub async fn extension_put(&self, id: &str, zip: Bytes) -> anyhow::Result<()> {
        self.store.put(&self.extension_path(id), zip.into()).await?;
        Ok(())
    }

    /// The zip of extension `id`; `None` when it is not stored.
    pub async fn extension_get(&self, id: &str) -> anyhow::Result<Option<Bytes>> {
        match self.store.get(&self.extension_path(id)).await {
            Ok(object) => Ok(Some(object.bytes().await?)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(error) => Err(error.into()),
        }
    }

    pub async fn extension_delete(&self, id: &str) -> anyhow::Result<()> {
        match self.store.delete(&self.extension_path(id)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(error) => Err(error.into()),
        }
    }

    fn saved_recording_path(&self, instance: &InstanceId, file_name: &str) -> StorePath {
        self.prefix
            .child(instance.as_str())
            .child("recordings")
            .child(file_name)
    }

    /// Saves a file of an instance's recordings (at a park, so that a revive
    /// on another node finds them); it goes with the instance's snapshots.
    pub async fn recording_save(
        &self,
        instance: &InstanceId,
        file_name: &str,
        file: &Path,
    ) -> anyhow::Result<()> {
        use tokio::io::AsyncWriteExt as _;
        let mut source = tokio::fs::File::open(file).await?;
        let mut upload = object_store::buffered::BufWriter::new(
            self.store.clone(),
            self.saved_recording_path(instance, file_name),
        );
        tokio::io::copy(&mut source, &mut upload).await?;
        upload.shutdown().await?;
        Ok(())
    }

    /// The names of the saved files of an instance's recordings.
    pub async fn recordings_saved(&self, instance: &InstanceId) -> anyhow::Result<Vec<String>> {
        use futures_util::TryStreamExt;
        let prefix = self.prefix.child(instance.as_str()).child("recordings");
        let objects: Vec<_> = self.store.list(Some(&prefix)).try_collect().await?;
        Ok(objects
            .iter()
            .filter_map(|object| object.location.filename().map(str::to_owned))
            .collect())
    }

    /// Writes a saved file of an instance's recordings to `file`.
    pub async fn recording_fetch(
        &self,
        instance: &InstanceId,
        file_name: &str,
        file: &Path,
    ) -> anyhow::Result<()> {
        use futures_util::TryStreamExt;
        use tokio::io::AsyncWriteExt as _;
        let object = self
            .store
            .get(&self.saved_recording_path(instance, file_name))
            .await?;
        let mut chunks = object.into_stream();
        let mut target = tokio::fs::File::create(file).await?;
        while let Some(chunk) = chunks.try_next().await? {
            target.write_all(&chunk).await?;
        }
        target.flush().await?;
        Ok(())
    }

    fn kept_recording_path(&self, id: &str, extension: &str) -> StorePath {
        self.prefix
            .child("recordings")
            .child(format!("{id}.{extension}"))
    }

    /// Keeps a finished recording: the video from the file `video`, then its
    /// description, so that a listed recording is always complete.
    pub async fn recording_keep(
        &self,
        recording: &KeptRecording,
        video: &Path,
    ) -> anyhow::Result<()> {
        use tokio::io::AsyncWriteExt as _;
        anyhow::ensure!(
            crate::snapshot::is_recording_id(&recording.id),
            "{:?} is not a recording id",
            recording.id
        );
        let mut file = tokio::fs::File::open(video).await?;
        let mut upload = object_store::buffered::BufWriter::new(
            self.store.clone(),
            self.kept_recording_path(&recording.id, "mp4"),
        );
        tokio::io::copy(&mut file, &mut upload).await?;
        upload.shutdown().await?;
        let description = serde_json::to_vec(recording)?;
        self.store
            .put(
                &self.kept_recording_path(&recording.id, "json"),
                Bytes::from(description).into(),
            )
            .await?;
        Ok(())
    }

    /// The kept recordings, oldest first (ids are time-ordered).
    pub async fn recordings_kept(&self) -> anyhow::Result<Vec<KeptRecording>> {
        use futures_util::TryStreamExt;
        let prefix = self.prefix.child("recordings");
        let objects: Vec<_> = self.store.list(Some(&prefix)).try_collect().await?;
        let mut recordings = Vec::new();
        for object in objects {
            let Some(id) = object
                .location
                .filename()
                .and_then(|name| name.strip_suffix(".json"))
            else {
                continue;
            };
            if let Some(recording) = self.recording_kept(id).await? {
                recordings.push(recording);
            }
        }
        recordings.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(recordings)
    }

    /// Kept recording `id`'s description; `None` when there is no such
    /// recording (or `id` is not a recording id).
    pub async fn recording_kept(&self, id: &str) -> anyhow::Result<Option<KeptRecording>> {
        if !crate::snapshot::is_recording_id(id) {
            return Ok(None);
        }
        match self.store.get(&self.kept_recording_path(id, "json")).await {
            Ok(object) => Ok(serde_json::from_slice(&object.bytes().await?).ok()),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(error) => Err(error.into()),
        }
    }

    /// Kept recording `id`'s video, as a stream of chunks; `None` when there
    /// is no such recording.
    pub async fn recording_kept_video(
        &self,
        id: &str,
    ) -> anyhow::Result<Option<futures_util::stream::BoxStream<'static, std::io::Result<Bytes>>>>
    {
        use futures_util::TryStreamExt;
        if !crate::snapshot::is_recording_id(id) {
            return Ok(None);
        }
        match self.store.get(&self.kept_recording_path(id, "mp4")).await {
            Ok(object) => Ok(Some(Box::pin(
                object.into_stream().map_err(std::io::Error::other),
            ))),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(error) => Err(error.into()),
        }
    }

    /// Deletes kept recording `id` (its description first, so that it is
    /// never listed without its video); `false` when there was none.
    pub async fn recording_kept_delete(&self, id: &str) -> anyhow::Result<bool> {
        if self.recording_kept(id).await?.is_none() {
            return Ok(false);
        }
        for extension in ["json", "mp4"] {
            match self
                .store
                .delete(&self.kept_recording_path(id, extension))
                .await
            {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(error) => return Err(error.into()),
            }
        }
        Ok(true)
    }

    /// Whether the store answers for this archive: `Ok` when it does
    /// (whether or not the archive is there), the store's error otherwise.
    pub async fn check(&self, instance: &InstanceId, snapshot: &SnapshotId) -> anyhow::Result<()> {
        match self.store.head(&self.path(instance, snapshot)).await {
            Ok(_) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(error) => Err(error.into()),
        }
    }

    /// Whether an archive exists (for tests and checks).
    pub async fn exists(&self, instance: &InstanceId, snapshot: &SnapshotId) -> bool {
        self.store
            .head(&self.path(instance, snapshot))
            .await
            .is_ok()
    }
}

/// Whether `error` says the object is absent (rather than the store failing).
pub fn is_not_found(error: &anyhow::Error) -> bool {
    matches!(
        error.downcast_ref::<object_store::Error>(),
        Some(object_store::Error::NotFound { .. })
    )
}

/// A store, where in it the snapshots go, and its identity.
type Opened = (Arc<dyn ObjectStore>, StorePath, String);

/// A `file://` store: the directory, created.
fn open_directory(parsed: &url::Url) -> anyhow::Result<Opened> {
    let dir = PathBuf::from(parsed.path());
    std::fs::create_dir_all(&dir).map_err(|e| {
        anyhow::anyhow!(
            "cannot create the snapshot directory {}: {e}",
            dir.display()
        )
    })?;
    let local = object_store::local::LocalFileSystem::new_with_prefix(&dir)?;
    let dir = dir.canonicalize().unwrap_or(dir);
    let identity = format!("file://{}{}", machine_name(), dir.display());
    Ok((Arc::new(local), StorePath::default(), identity))
}

/// An `s3://<bucket>/<prefix>` store, with the settings and credentials of
/// `config` (or the environment's).
fn open_s3(config: &SnapshotsConfig, parsed: &url::Url, url: &str) -> anyhow::Result<Opened> {
    let bucket = parsed
        .host_str()
        .ok_or_else(|| anyhow::anyhow!("snapshots.url {url:?} names no bucket"))?;
    let timeout = config.timeout_sec.unwrap_or(DEFAULT_STORE_TIMEOUT_SEC);
    if !(timeout.is_finite() && timeout > 0.0 && timeout <= 3600.0) {
        anyhow::bail!(
            "snapshots.timeout_sec must be greater than 0 and at most 3600 (got {timeout})"
        );
    }
    let timeout = Duration::from_secs_f64(timeout);
    let mut builder = object_store::aws::AmazonS3Builder::from_env()
        .with_bucket_name(bucket)
        .with_client_options(
            object_store::ClientOptions::new()
                .with_allow_http(config.allow_http)
                .with_timeout(timeout)
                .with_connect_timeout(timeout.min(Duration::from_secs(5))),
        )
        .with_retry(object_store::RetryConfig {
            backoff: Default::default(),
            max_retries: 5,
            retry_timeout: timeout,
        });
    if let Some(endpoint) = &config.endpoint {
        builder = builder.with_endpoint(endpoint);
    }
    if let Some(region) = &config.region {
        builder = builder.with_region(region);
    }
    if let Some(key) = &config.access_key_id {
        builder = builder.with_access_key_id(key);
    }
    if let Some(secret) = &config.secret_access_key {
        builder = builder.with_secret_access_key(secret);
    }
    let prefix = StorePath::from(parsed.path().trim_matches('/'));
    // The endpoint as the client will use it (`snapshots.endpoint`, or
    // AWS_ENDPOINT from the environment), in one spelling.
    let endpoint = builder
        .get_config_value(&object_store::aws::AmazonS3ConfigKey::Endpoint)
        .map(|endpoint| match url::Url::parse(&endpoint) {
            Ok(url) => url.as_str().trim_end_matches('/').to_owned(),
            Err(_) => endpoint.trim_end_matches('/').to_owned(),
        });
    let identity = match endpoint {
        Some(endpoint) => format!(
            "s3://{bucket}/{prefix}@{}",
            flotilla_api_types::instances::without_credentials(&endpoint)
        ),
        None => format!("s3://{bucket}/{prefix}"),
    };
    Ok((Arc::new(builder.build()?), prefix, identity))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s3(endpoint: Option<&str>, store_id: Option<&str>) -> SnapshotsConfig {
        SnapshotsConfig {
            url: Some("s3://fleet/a//b/".into()),
            endpoint: endpoint.map(str::to_owned),
            region: Some("us-east-1".into()),
            access_key_id: Some("key".into()),
            secret_access_key: Some("secret".into()),
            allow_http: true,
            store_id: store_id.map(str::to_owned),
            ..SnapshotsConfig::default()
        }
    }

    #[test]
    fn a_store_is_named_alike_by_every_agent_that_shares_it_and_never_with_a_secret() {
        let dir = tempfile::tempdir().unwrap();
        let identity =
            |config: &SnapshotsConfig| SnapshotStore::open(config, dir.path()).unwrap().identity;
        let plain = identity(&s3(Some("http://Minio:9000"), None));
        assert_eq!(plain, identity(&s3(Some("http://minio:9000/"), None)));
        assert_eq!(plain, "s3://fleet/a/b@http://minio:9000");
        assert_ne!(plain, identity(&s3(Some("http://minio:9001"), None)));
        let with_user = identity(&s3(Some("http://user:pw@minio:9000"), None));
        assert!(!with_user.contains("pw"), "{with_user}");
        assert_eq!(identity(&s3(None, Some("nfs-1"))), "id:nfs-1");

        let local = identity(&SnapshotsConfig::default());
        let canonical = dir.path().canonicalize().unwrap();
        assert!(local.starts_with("file://"), "{local}");
        assert!(local.ends_with(&canonical.display().to_string()), "{local}");
        assert!(local.contains(&machine_name()), "{local}");
    }
}
