//! Browser extensions: upload (a zip checked to be an unpacked Manifest V3
//! extension), list, get and delete them, and check the `config.extensions`
//! of a create. Zips live in the snapshot store, so that every node can
//! fetch them; the node unpacks them before it launches a browser that loads
//! them (see the agent). A tenant's key sees, uses and deletes its
//! tenant's uploads only (another's is the 404 of one that never was); an
//! admin's key sees all of them.

use bytes::Bytes;

use flotilla_api_types::MessageResponse;
use flotilla_api_types::extensions::{
    Extension, ExtensionList, MAX_EXTENSIONS_PER_INSTANCE, is_extension_id,
};

use super::{ControlPlane, Scope};
use crate::error::{Error, Result};

fn not_found(id: &str) -> Error {
    Error::NotFound(format!("extension {id} not found"))
}

/// Uploads checked at once: each may hold a 50 MiB body and decompress up to
/// 256 MiB.
static UPLOADS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(2);

impl ControlPlane {
    /// Keeps an uploaded extension: checks the zip, stores it, records it.
    pub async fn extension_upload(&self, zip: Bytes, scope: &Scope) -> Result<Extension> {
        let _permit = UPLOADS
            .acquire()
            .await
            .map_err(|e| Error::internal(format!("upload permits closed: {e}")))?;
        let snapshots = self.snapshots.clone().ok_or_else(|| {
            Error::InsufficientCapacity(
                "this control plane has no snapshot store to keep extensions in".into(),
            )
        })?;
        let (checker, checked) = (snapshots.clone(), zip.clone());
        let manifest = tokio::task::spawn_blocking(move || checker.extension_inspect(&checked))
            .await
            .map_err(|e| Error::internal(format!("extension check panicked: {e}")))?
            .map_err(|refusal| {
                Error::InvalidRequest(format!("not a loadable extension: {refusal}"))
            })?;
        let extension = Extension {
            id: uuid::Uuid::now_v7().hyphenated().to_string(),
            name: manifest.name,
            version: manifest.version,
            size_bytes: zip.len() as u64,
            created_at: self.now(),
        };
        snapshots
            .extension_put(&extension.id, zip)
            .await
            .map_err(|e| {
                Error::InsufficientCapacity(format!(
                    "cannot store the extension in the snapshot store ({}): {e}",
                    snapshots.location()
                ))
            })?;
        self.store
            .extension_insert(&extension, scope.tenant())
            .await?;
        tracing::info!(
            extension = extension.id,
            name = extension.name,
            version = extension.version,
            "extension uploaded"
        );
        Ok(extension)
    }

    pub async fn extension_list(&self, scope: &Scope) -> Result<ExtensionList> {
        Ok(ExtensionList {
            extensions: self.store.extension_list(scope.tenant()).await?,
        })
    }

    /// Extension `id` when `scope` sees it.
    pub async fn extension_get(&self, id: &str, scope: &Scope) -> Result<Extension> {
        if !is_extension_id(id) {
            return Err(not_found(id));
        }
        self.store
            .extension_get(id)
            .await?
            .filter(|(_, owner)| scope.sees(owner.as_deref()))
            .map(|(extension, _)| extension)
            .ok_or_else(|| not_found(id))
    }

    /// Deletes an extension and its zip; refused while an instance loads it.
    pub async fn extension_delete(&self, id: &str, scope: &Scope) -> Result<MessageResponse> {
        // Only well-formed ids reach the store (its LIKE must see no wildcard).
        self.extension_get(id, scope).await?;
        match self.store.extension_delete(id).await? {
            Ok(true) => {}
            Ok(false) => return Err(not_found(id)),
            Err(instance) => {
                return Err(Error::InvalidState(format!(
                    "extension {id} is loaded by instance {instance}; delete that instance first"
                )));
            }
        }
        if let Some(snapshots) = &self.snapshots
            && let Err(error) = snapshots.extension_delete(id).await
        {
            tracing::warn!(extension = id, %error, "cannot delete the extension's zip");
        }
        tracing::info!(extension = id, "extension deleted");
        Ok(MessageResponse {
            message: format!("extension {id} deleted"),
        })
    }

    /// Checks `config.extensions` of a create: at most 20 distinct ids of
    /// extensions `scope` sees.
    pub(crate) async fn extensions_check(&self, ids: &[String], scope: &Scope) -> Result<()> {
        let bad = |message: String| {
            Err(Error::InvalidRequest(format!(
                "config.extensions: {message}"
            )))
        };
        if ids.len() > MAX_EXTENSIONS_PER_INSTANCE {
            return bad(format!(
                "at most {MAX_EXTENSIONS_PER_INSTANCE} extensions per instance (got {})",
                ids.len()
            ));
        }
        for (index, id) in ids.iter().enumerate() {
            if ids[..index].contains(id) {
                return bad(format!("{id} is named twice"));
            }
            if !is_extension_id(id) {
                return bad(format!(
                    "{id:?} is not an extension id; upload one with POST /v2/extensions"
                ));
            }
        }
        let missing = self.store.extensions_missing(ids, scope.tenant()).await?;
        if !missing.is_empty() {
            return bad(format!(
                "no extension {}; upload one with POST /v2/extensions",
                missing.join(", ")
            ));
        }
        Ok(())
    }
}
