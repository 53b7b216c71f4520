//! Credentials as every Flotilla service reads them: the `Bearer` scheme of
//! `Authorization` (RFC 7235: the scheme is case-insensitive), SHA-256 digests of
//! secrets (what is kept of an API key or an instance token), and constant-time
//! comparison, so that no timing tells how much of a guess was right.

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// A secret carried in a wire type (an instance's access token): serialised
/// as the plain string, shown as `<redacted>` by `Debug`, so that logging a
/// request never prints it.
#[derive(Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: String) -> Self {
        Self(value)
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

/// The credential of an `Authorization: Bearer <credential>` header value; the
/// scheme is matched case-insensitively, surrounding spaces are ignored. `None`
/// for another scheme or an empty credential.
pub fn bearer_token(header_value: &str) -> Option<&str> {
    let value = header_value.trim_start();
    let (scheme, rest) = value.split_at_checked(6)?;
    if !scheme.eq_ignore_ascii_case("bearer") || !rest.starts_with([' ', '\t']) {
        return None;
    }
    let credential = rest.trim();
    (!credential.is_empty()).then_some(credential)
}

/// Whether `a` and `b` are equal, in time that depends only on their lengths.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.ct_eq(b).into()
}

/// The SHA-256 digest of a secret.
pub fn sha256(secret: &[u8]) -> [u8; 32] {
    Sha256::digest(secret).into()
}

/// Whether `presented` hashes to one of `digests`. Every digest is compared,
/// so the time does not say which one matched.
pub fn matches_any_digest(presented: &[u8], digests: &[[u8; 32]]) -> bool {
    let digest = sha256(presented);
    digests.iter().fold(false, |found, known| {
        found | constant_time_eq(known, &digest)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_scheme_is_case_insensitive_and_needs_a_credential() {
        assert_eq!(bearer_token("Bearer abc"), Some("abc"));
        assert_eq!(bearer_token("bearer abc"), Some("abc"));
        assert_eq!(bearer_token("BEARER   abc  "), Some("abc"));
        assert_eq!(bearer_token("Bearer\tabc"), Some("abc"));
        assert_eq!(bearer_token("Bearerabc"), None);
        assert_eq!(bearer_token("Bearer "), None);
        assert_eq!(bearer_token("Basic abc"), None);
        assert_eq!(bearer_token("Bear"), None);
        assert_eq!(bearer_token("Beärer x"), None);
    }

    #[test]
    fn secrets_serialise_plainly_and_never_print() {
        let secret = Secret::new("flt_abc".into());
        assert_eq!(serde_json::to_string(&secret).unwrap(), "\"flt_abc\"");
        assert_eq!(format!("{secret:?}"), "<redacted>");
        assert_eq!(secret.expose(), "flt_abc");
    }

    #[test]
    fn comparison_and_digests() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
        assert!(!constant_time_eq(b"secret", b"secret2"));
        let known = [sha256(b"one"), sha256(b"two")];
        assert!(matches_any_digest(b"two", &known));
        assert!(!matches_any_digest(b"three", &known));
        assert!(!matches_any_digest(b"two", &[]));
    }
}
