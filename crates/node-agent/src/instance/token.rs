//! An instance's access token as the agent holds it: in memory, with its
//! digest, compared in constant time, never shown in `Debug`.

use flotilla_api_types::credentials::{constant_time_eq, sha256};

/// An instance's access token as the agent holds it: in memory, with its digest.
pub struct InstanceToken {
    secret: String,
    digest: [u8; 32],
}

impl InstanceToken {
    pub fn new(secret: String) -> Self {
        let digest = sha256(secret.as_bytes());
        Self { secret, digest }
    }

    /// The token a control plane's secret names.
    pub fn of(secret: &flotilla_api_types::credentials::Secret) -> std::sync::Arc<Self> {
        std::sync::Arc::new(Self::new(secret.expose().to_owned()))
    }

    /// The token itself, to put into URLs handed to an admitted client.
    pub fn secret(&self) -> &str {
        &self.secret
    }

    pub(crate) fn matches(&self, presented: &str) -> bool {
        constant_time_eq(&sha256(presented.as_bytes()), &self.digest)
    }
}

impl std::fmt::Debug for InstanceToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("InstanceToken(<redacted>)")
    }
}
