//! Playwright versions as its clients and servers name them: a client and a
//! server of different minor versions refuse each other, so the version a
//! client announces decides which server answers it (node agent) and
//! whether a connection is worth making an instance for (control plane).

/// `(major, minor)` and patch of `1.65.1` (pre-release suffixes ignored).
pub fn parse_version(version: &str) -> Option<((u32, u32), u32)> {
    let mut parts = version.split(['.', '-']);
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    let patch = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    Some(((major, minor), patch))
}

/// The client's major and minor version, from its handshake's
/// `User-Agent` (`Playwright/1.65.1 (x64; debian 12) node/20.19`).
pub fn client_version(user_agent: &str) -> Option<(u32, u32)> {
    let start = user_agent.find("Playwright/")? + "Playwright/".len();
    let version = user_agent[start..].split_whitespace().next()?;
    parse_version(version).map(|(minor, _)| minor)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_versions_are_read_from_the_user_agent() {
        let node = "Playwright/1.65.1 (x64; debian 12) node/20.19";
        assert_eq!(client_version(node), Some((1, 65)));
        let python = "Playwright/1.64.0-beta-1 (x64; debian 12) python/3.11";
        assert_eq!(client_version(python), Some((1, 64)));
        assert_eq!(client_version("Mozilla/5.0 Chrome/156"), None);
        assert_eq!(client_version("Playwright/"), None);
        assert_eq!(client_version("Playwright/x.y"), None);
        assert_eq!(client_version("Playwright/1"), None);
        assert_eq!(client_version("Playwright/1.99999999999"), None);
    }

    #[test]
    fn versions_have_a_minor_and_maybe_a_patch() {
        assert_eq!(parse_version("1.65.1"), Some(((1, 65), 1)));
        assert_eq!(parse_version("1.65"), Some(((1, 65), 0)));
        assert_eq!(parse_version("1.66.0-alpha-2026-11-20"), Some(((1, 66), 0)));
        assert_eq!(parse_version("1"), None);
        assert_eq!(parse_version(""), None);
    }
}
