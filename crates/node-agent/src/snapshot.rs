//! Dormancy snapshots: what a parked browser leaves behind, and where.
//!
//! - [`capture`] reads the browser's state over CDP while it still runs: every
//!   cookie (session cookies too, which Chromium does not keep on disk), the open
//!   tabs and their URLs, and the localStorage of the tabs' origins.
//! - [`archive`] packs the profile directory (without caches and lock files) and
//!   that state into one tar + zstd file; [`extract`] unpacks it.
//! - [`restore`] puts the state back into a started browser: cookies and
//!   localStorage always, tabs for `full_restore`.
//! - [`SnapshotStore`] keeps archives in a directory (`file://`) or an
//!   S3-compatible bucket (`s3://`), through `object_store`. A put is atomic: an
//!   archive is either complete or absent.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use object_store::ObjectStore;
use object_store::path::Path as StorePath;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use flotilla_api_types::InstanceId;
use flotilla_api_types::ids::SnapshotId;

use crate::browser::CdpEndpoint;
use crate::cdp::CdpClient;

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
}

/// Default of `[snapshots] timeout_sec`.
pub const DEFAULT_STORE_TIMEOUT_SEC: f64 = 30.0;

/// Archives of dormant instances, by instance and snapshot id, of
/// persistent profiles, by name (`profiles/<name>.tar.zst`), and the zips of
/// uploaded extensions, by id (`extensions/<id>.zip`).
#[derive(Clone)]
pub struct SnapshotStore {
    store: Arc<dyn ObjectStore>,
    prefix: StorePath,
    /// Where it is, for messages.
    pub location: String,
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
        let (store, prefix): (Arc<dyn ObjectStore>, StorePath) = match parsed.scheme() {
            "file" => {
                let dir = PathBuf::from(parsed.path());
                std::fs::create_dir_all(&dir).map_err(|e| {
                    anyhow::anyhow!(
                        "cannot create the snapshot directory {}: {e}",
                        dir.display()
                    )
                })?;
                let local = object_store::local::LocalFileSystem::new_with_prefix(&dir)?;
                (Arc::new(local), StorePath::default())
            }
            "s3" => {
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
                (Arc::new(builder.build()?), prefix)
            }
            other => anyhow::bail!(
                "snapshots.url scheme {other:?} is not supported: use file:// or s3://"
            ),
        };
        Ok(Self {
            store,
            prefix,
            location: url,
        })
    }

    fn path(&self, instance: &InstanceId, snapshot: &SnapshotId) -> StorePath {
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

    fn profile_path(&self, name: &str) -> StorePath {
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

    fn extension_path(&self, id: &str) -> StorePath {
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

/// What the browser held besides its profile files.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct CapturedState {
    /// `Network.Cookie` objects, session cookies included.
    pub cookies: Vec<Value>,
    pub tabs: Vec<CapturedTab>,
    pub local_storage: Vec<OriginStorage>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct CapturedTab {
    pub url: String,
    pub title: String,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct OriginStorage {
    pub origin: String,
    pub items: Vec<(String, String)>,
}

const CDP_TIMEOUT: Duration = Duration::from_secs(10);

/// Whether `error` says the object is absent (rather than the store failing).
pub fn is_not_found(error: &anyhow::Error) -> bool {
    matches!(
        error.downcast_ref::<object_store::Error>(),
        Some(object_store::Error::NotFound { .. })
    )
}

/// Reads cookies, tabs and localStorage from a running browser.
pub async fn capture(endpoint: &CdpEndpoint) -> anyhow::Result<CapturedState> {
    let browser = CdpClient::browser(endpoint).await?;
    let cookies = browser
        .call("Storage.getCookies", json!({}), None, CDP_TIMEOUT)
        .await?;
    let cookies = cookies["cookies"].as_array().cloned().unwrap_or_default();
    let targets = browser
        .call("Target.getTargets", json!({}), None, CDP_TIMEOUT)
        .await?;
    let pages: Vec<(String, CapturedTab)> = targets["targetInfos"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|t| t["type"] == "page")
        .map(|t| {
            (
                t["targetId"].as_str().unwrap_or_default().to_owned(),
                CapturedTab {
                    url: t["url"].as_str().unwrap_or_default().to_owned(),
                    title: t["title"].as_str().unwrap_or_default().to_owned(),
                },
            )
        })
        .collect();
    let mut local_storage: Vec<OriginStorage> = Vec::new();
    for (target_id, tab) in &pages {
        if !(tab.url.starts_with("http://") || tab.url.starts_with("https://")) {
            continue;
        }
        let Some(session) = attach(&browser, &json!(target_id)).await else {
            continue;
        };
        let read = evaluate(
            &browser,
            &session,
            "JSON.stringify([location.origin, Object.entries(localStorage)])",
        )
        .await;
        detach(&browser, session).await;
        let Some(text) = read else {
            continue;
        };
        if let Ok((origin, items)) = serde_json::from_str::<(String, Vec<(String, String)>)>(&text)
            && !local_storage.iter().any(|o| o.origin == origin)
        {
            local_storage.push(OriginStorage { origin, items });
        }
    }
    Ok(CapturedState {
        cookies,
        tabs: pages.into_iter().map(|(_, tab)| tab).collect(),
        local_storage,
    })
}

/// Parts of a profile that are caches or locks: left out of archives.
const SKIPPED: &[&str] = &[
    "Cache",
    "Code Cache",
    "GPUCache",
    "GrShaderCache",
    "ShaderCache",
    "DawnCache",
    "DawnGraphiteCache",
    "DawnWebGPUCache",
    "GraphiteDawnCache",
    "Crashpad",
    "component_crx_cache",
    "extensions_crx_cache",
    "Safe Browsing",
    "SingletonLock",
    "SingletonCookie",
    "SingletonSocket",
    "DevToolsActivePort",
    "BrowserMetrics",
    "optimization_guide_model_store",
];

/// Packs the profile, the downloads (when given and the directory exists)
/// and the captured state into one tar + zstd archive. Symbolic links are
/// stored as links, never followed.
pub fn archive(
    profile: &Path,
    downloads: Option<&Path>,
    state: &CapturedState,
) -> anyhow::Result<Bytes> {
    let mut builder = tar::Builder::new(Vec::new());
    builder.follow_symlinks(false);
    let state_json = serde_json::to_vec(state)?;
    let mut header = tar::Header::new_gnu();
    header.set_size(state_json.len() as u64);
    header.set_mode(0o600);
    header.set_cksum();
    builder.append_data(&mut header, "state.json", state_json.as_slice())?;
    append_dir(&mut builder, profile, Path::new("profile"))?;
    if let Some(downloads) = downloads.filter(|d| d.is_dir()) {
        append_dir(&mut builder, downloads, Path::new("downloads"))?;
    }
    let tar = builder.into_inner()?;
    Ok(Bytes::from(zstd::encode_all(tar.as_slice(), 3)?))
}

fn append_dir(builder: &mut tar::Builder<Vec<u8>>, dir: &Path, name: &Path) -> anyhow::Result<()> {
    builder.append_dir(name, dir)?;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let file_name = entry.file_name();
        if SKIPPED.iter().any(|s| file_name == *s) {
            continue;
        }
        let kind = entry.file_type()?;
        let path = entry.path();
        let archived = name.join(&file_name);
        if kind.is_dir() {
            append_dir(builder, &path, &archived)?;
        } else if kind.is_file() {
            // A file may vanish between listing and reading (the browser is gone,
            // but be safe): skip it rather than fail the snapshot.
            if let Ok(mut file) = std::fs::File::open(&path) {
                builder.append_file(&archived, &mut file)?;
            }
        }
    }
    Ok(())
}

/// Unpacks an archive: the profile into `profile` (which must not exist yet),
/// the downloads into `downloads` (replacing what is there), and returns the
/// captured state.
pub fn extract(archive: &[u8], profile: &Path, downloads: &Path) -> anyhow::Result<CapturedState> {
    let tar = zstd::decode_all(archive)?;
    let parent = profile
        .parent()
        .ok_or_else(|| anyhow::anyhow!("profile path has no parent"))?;
    let staging = parent.join("restore-staging");
    let _ = std::fs::remove_dir_all(&staging);
    std::fs::create_dir_all(&staging)?;
    let mut state = CapturedState::default();
    let mut entries = tar::Archive::new(tar.as_slice());
    for entry in entries.entries()? {
        let mut entry = entry?;
        let path = entry.path()?.into_owned();
        if path == Path::new("state.json") {
            let mut text = String::new();
            entry.read_to_string(&mut text)?;
            state = serde_json::from_str(&text)?;
        } else if path.starts_with("profile") || path.starts_with("downloads") {
            // `unpack_in` refuses paths that would leave the staging directory.
            entry.unpack_in(&staging)?;
        }
    }
    std::fs::rename(staging.join("profile"), profile)?;
    if staging.join("downloads").is_dir() {
        let _ = std::fs::remove_dir_all(downloads);
        std::fs::rename(staging.join("downloads"), downloads)?;
    }
    let _ = std::fs::remove_dir_all(&staging);
    Ok(state)
}

/// Puts the captured state back into a freshly started browser: every cookie
/// (session cookies are not in the profile), the captured `localStorage`
/// (before any tab loads), and for a full restore every tab at its URL (the
/// initial blank tab is closed then).
pub async fn restore(
    endpoint: &CdpEndpoint,
    state: &CapturedState,
    reopen_tabs: bool,
) -> anyhow::Result<()> {
    let browser = CdpClient::browser(endpoint).await?;
    let cookies: Vec<Value> = state.cookies.iter().map(cookie_param).collect();
    if !cookies.is_empty() {
        browser
            .call(
                "Storage.setCookies",
                json!({"cookies": cookies}),
                None,
                CDP_TIMEOUT,
            )
            .await?;
    }
    // The profile normally has it all: a failed write-back is worth a warning,
    // not a failed revive.
    if let Err(error) = refill_local_storage(&browser, &state.local_storage).await {
        tracing::warn!(%error, "cannot write the captured localStorage back");
    }
    if reopen_tabs {
        let urls: Vec<&str> = state
            .tabs
            .iter()
            .map(|t| t.url.as_str())
            .filter(|u| !u.is_empty() && *u != "about:blank")
            .collect();
        if !urls.is_empty() {
            let mut reopened = Vec::with_capacity(urls.len());
            for url in &urls {
                let created = browser
                    .call(
                        "Target.createTarget",
                        json!({"url": url}),
                        None,
                        CDP_TIMEOUT,
                    )
                    .await?;
                reopened.push(created["targetId"].clone());
            }
            // The fresh browser's own first tab, whatever its URL reads yet.
            close_pages(&browser, |id| !reopened.contains(id)).await?;
        }
    }
    Ok(())
}

/// Closes the pages `doomed` selects (by target id) and checks they are gone,
/// for 3 s at most: closing is asynchronous.
async fn close_pages(browser: &CdpClient, doomed: impl Fn(&Value) -> bool) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
    loop {
        let targets = browser
            .call("Target.getTargets", json!({}), None, CDP_TIMEOUT)
            .await?;
        let extra: Vec<Value> = targets["targetInfos"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|t| t["type"] == "page" && doomed(&t["targetId"]))
            .map(|t| t["targetId"].clone())
            .collect();
        if extra.is_empty() || tokio::time::Instant::now() >= deadline {
            return Ok(());
        }
        for target_id in extra {
            close_target(browser, &target_id).await;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn close_target(browser: &CdpClient, target_id: &Value) {
    let _ = browser
        .call(
            "Target.closeTarget",
            json!({"targetId": target_id}),
            None,
            CDP_TIMEOUT,
        )
        .await;
}

/// The document a scratch tab gets for each origin: nothing reaches the site.
const EMPTY_DOCUMENT: &str = "<!doctype html><title></title>";

/// Writes the captured `localStorage` items back, origin by origin, in a
/// scratch tab whose requests never leave the browser: each navigation to an
/// origin is answered with an empty document (CDP `Fetch`), so the site sees
/// no request and no page script runs. Captured values win over the
/// profile's: the capture read them in the live page at park time, while the
/// profile can miss writes still on their way to disk when the browser closed.
/// Keys only the profile has are kept.
async fn refill_local_storage(
    browser: &CdpClient,
    captured: &[OriginStorage],
) -> anyhow::Result<()> {
    let origins: Vec<&OriginStorage> = captured
        .iter()
        .filter(|o| {
            !o.items.is_empty()
                && (o.origin.starts_with("http://") || o.origin.starts_with("https://"))
        })
        .collect();
    if origins.is_empty() {
        return Ok(());
    }
    let created = browser
        .call(
            "Target.createTarget",
            json!({"url": "about:blank", "background": true}),
            None,
            CDP_TIMEOUT,
        )
        .await?;
    let target_id = created["targetId"].clone();
    let filled = async {
        let session = attach(browser, &target_id)
            .await
            .ok_or_else(|| anyhow::anyhow!("cannot attach to the scratch tab"))?;
        let mut events = browser.events();
        for (method, params) in [
            ("Network.enable", json!({})),
            ("Network.setBypassServiceWorker", json!({"bypass": true})),
            ("Fetch.enable", json!({"patterns": [{"urlPattern": "*"}]})),
        ] {
            browser
                .call(method, params, Some(&session), CDP_TIMEOUT)
                .await?;
        }
        for origin in origins {
            let url = format!("{}/", origin.origin);
            let navigate = browser.call(
                "Page.navigate",
                json!({"url": url}),
                Some(&session),
                CDP_TIMEOUT,
            );
            let answer = answer_paused_requests(browser, &mut events, &session);
            let navigated = tokio::select! {
                navigated = navigate => navigated?,
                () = answer => anyhow::bail!("CDP connection closed"),
            };
            if let Some(error) = navigated["errorText"].as_str() {
                tracing::warn!(origin = %origin.origin, error, "cannot open a scratch page to restore localStorage");
                continue;
            }
            let items = serde_json::to_string(&origin.items)?;
            let script = format!(
                "location.origin === {origin} ? ({items}.forEach(([k, v]) => localStorage.setItem(k, v)), 'done') : location.origin",
                origin = serde_json::to_string(&origin.origin)?,
            );
            // The navigation may answer before its document is in place.
            let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
            loop {
                let written = evaluate(browser, &session, &script).await;
                if written.as_deref() == Some("done") {
                    break;
                }
                if tokio::time::Instant::now() >= deadline {
                    tracing::warn!(origin = %origin.origin, ?written, "localStorage not restored");
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        Ok(())
    }
    .await;
    // Gone before the instance is handed over: it must not show in its tabs.
    close_pages(browser, |id| *id == target_id).await?;
    filled
}

/// Answers every request the scratch tab makes with [`EMPTY_DOCUMENT`];
/// returns only when the connection closes.
async fn answer_paused_requests(
    browser: &CdpClient,
    events: &mut tokio::sync::broadcast::Receiver<crate::cdp::CdpEvent>,
    session: &str,
) {
    use base64::Engine;
    use tokio::sync::broadcast::error::RecvError;
    let body = base64::engine::general_purpose::STANDARD.encode(EMPTY_DOCUMENT);
    loop {
        let event = match events.recv().await {
            Ok(event) => event,
            Err(RecvError::Lagged(_)) => continue,
            Err(RecvError::Closed) => return,
        };
        if event.method != "Fetch.requestPaused" || event.session_id.as_deref() != Some(session) {
            continue;
        }
        let _ = browser
            .call(
                "Fetch.fulfillRequest",
                json!({
                    "requestId": event.params["requestId"],
                    "responseCode": 200,
                    "responseHeaders": [{"name": "Content-Type", "value": "text/html"}],
                    "body": body,
                }),
                Some(session),
                CDP_TIMEOUT,
            )
            .await;
    }
}

/// A flat CDP session on a target.
async fn attach(browser: &CdpClient, target_id: &Value) -> Option<String> {
    let attached = browser
        .call(
            "Target.attachToTarget",
            json!({"targetId": target_id, "flatten": true}),
            None,
            CDP_TIMEOUT,
        )
        .await
        .ok()?;
    attached["sessionId"].as_str().map(str::to_owned)
}

async fn detach(browser: &CdpClient, session: String) {
    let _ = browser
        .call(
            "Target.detachFromTarget",
            json!({"sessionId": session}),
            None,
            CDP_TIMEOUT,
        )
        .await;
}

/// Evaluates `expression` in a session's page; its value when it is a string.
async fn evaluate(browser: &CdpClient, session: &str, expression: &str) -> Option<String> {
    let result = browser
        .call(
            "Runtime.evaluate",
            json!({"expression": expression, "returnByValue": true}),
            Some(session),
            CDP_TIMEOUT,
        )
        .await
        .ok()?;
    result["result"]["value"].as_str().map(str::to_owned)
}

/// A `Network.Cookie` as a `Network.CookieParam`.
fn cookie_param(cookie: &Value) -> Value {
    let mut param = serde_json::Map::new();
    for key in [
        "name",
        "value",
        "domain",
        "path",
        "secure",
        "httpOnly",
        "sameSite",
        "priority",
        "sourceScheme",
        "sourcePort",
        "partitionKey",
    ] {
        if let Some(value) = cookie.get(key) {
            param.insert(key.to_owned(), value.clone());
        }
    }
    let session = cookie
        .get("session")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    if !session && let Some(expires) = cookie.get("expires") {
        param.insert("expires".into(), expires.clone());
    }
    Value::Object(param)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn archive_round_trip_skips_caches_and_locks() {
        let dir = tempfile::tempdir().unwrap();
        let profile = dir.path().join("profile");
        std::fs::create_dir_all(profile.join("Default/Local Storage")).unwrap();
        std::fs::create_dir_all(profile.join("Default/Cache")).unwrap();
        std::fs::write(profile.join("Default/Cookies"), b"cookie db").unwrap();
        std::fs::write(profile.join("Default/Local Storage/000003.log"), b"ls").unwrap();
        std::fs::write(profile.join("Default/Cache/data_0"), vec![0u8; 100_000]).unwrap();
        std::os::unix::fs::symlink("vm-123", profile.join("SingletonLock")).unwrap();
        let state = CapturedState {
            cookies: vec![json!({"name": "sid", "value": "1", "session": true})],
            tabs: vec![CapturedTab {
                url: "http://a/".into(),
                title: "A".into(),
            }],
            local_storage: vec![OriginStorage {
                origin: "http://a".into(),
                items: vec![("k".into(), "v".into())],
            }],
        };
        let downloads = dir.path().join("downloads");
        std::fs::create_dir_all(&downloads).unwrap();
        std::fs::write(downloads.join("report.pdf"), b"%PDF").unwrap();
        let packed = archive(&profile, Some(&downloads), &state).unwrap();
        assert!(
            packed.len() < 2000,
            "caches are left out: {} bytes",
            packed.len()
        );

        let target = dir.path().join("restored");
        std::fs::create_dir_all(&target).unwrap();
        let restored =
            extract(&packed, &target.join("profile"), &target.join("downloads")).unwrap();
        assert_eq!(restored, state);
        assert_eq!(
            std::fs::read(target.join("downloads/report.pdf")).unwrap(),
            b"%PDF"
        );
        assert_eq!(
            std::fs::read(target.join("profile/Default/Cookies")).unwrap(),
            b"cookie db"
        );
        assert!(
            target
                .join("profile/Default/Local Storage/000003.log")
                .exists()
        );
        assert!(!target.join("profile/Default/Cache").exists());
        assert!(!target.join("profile/SingletonLock").exists());
    }

    #[test]
    fn session_cookies_lose_their_expiry_when_set_again() {
        let session = cookie_param(
            &json!({"name": "a", "value": "1", "domain": "x", "path": "/", "expires": -1, "session": true, "size": 2}),
        );
        assert!(session.get("expires").is_none());
        assert!(session.get("size").is_none(), "not a CookieParam field");
        let persistent =
            cookie_param(&json!({"name": "b", "value": "2", "expires": 2e9, "session": false}));
        assert_eq!(persistent["expires"], 2e9);
    }

    #[tokio::test]
    async fn directory_store_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let store = SnapshotStore::open(&SnapshotsConfig::default(), dir.path()).unwrap();
        let instance = InstanceId::new("i-1");
        let snapshot = SnapshotId::generate();
        store
            .put(&instance, &snapshot, Bytes::from_static(b"archive"))
            .await
            .unwrap();
        assert!(store.exists(&instance, &snapshot).await);
        assert_eq!(
            store.get(&instance, &snapshot).await.unwrap(),
            Bytes::from_static(b"archive")
        );
        assert_eq!(store.delete_all(&instance).await.unwrap(), 1);
        assert!(!store.exists(&instance, &snapshot).await);
    }
}
