//! Whether a browser's request comes from the page of the server it asks:
//! WebSocket upgrades that carry an `Origin` (every browser sends one) are
//! accepted only from the same origin, so that a page on another site cannot
//! open a live view (and drive the browser) in the name of a user who can
//! reach it (cross-site WebSocket hijacking; it matters most with
//! authentication off). Clients that are not browsers send no `Origin`.

/// Whether `origin` (`scheme://host[:port]`, the `Origin` header) names the
/// same host and port as `authority` (`host[:port]`, the `Host` the request
/// was sent to, or the public authority the server is reached at). Default
/// ports compare equal to none; hosts compare without case. `null` and
/// anything unparsable are never the same.
pub fn same_origin(origin: &str, authority: &str) -> bool {
    let Some((scheme, rest)) = origin.split_once("://") else {
        return false;
    };
    let default_port = match scheme.to_ascii_lowercase().as_str() {
        "http" | "ws" => "80",
        "https" | "wss" => "443",
        _ => return false,
    };
    if rest.contains(['/', '?', '#', '@']) || rest.is_empty() {
        return false;
    }
    normalize(rest, default_port) == normalize(authority, default_port)
}

fn normalize(authority: &str, default_port: &str) -> String {
    let lower = authority.trim().to_ascii_lowercase();
    match lower.rsplit_once(':') {
        // Not the inside of an IPv6 address: `[::1]:80`'s last colon follows `]`.
        Some((host, port)) if port == default_port && !host.ends_with(':') => host.to_owned(),
        _ => lower,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_same_host_and_port_is_the_same_origin() {
        for (origin, authority) in [
            ("http://127.0.0.1:8080", "127.0.0.1:8080"),
            ("https://door.example.com", "door.example.com"),
            ("https://door.example.com", "Door.Example.com:443"),
            ("http://door.example.com:80", "door.example.com"),
            ("http://[::1]:8080", "[::1]:8080"),
        ] {
            assert!(same_origin(origin, authority), "{origin} {authority}");
        }
        for (origin, authority) in [
            ("http://evil.example", "127.0.0.1:8080"),
            ("http://127.0.0.1:8081", "127.0.0.1:8080"),
            ("https://door.example.com:8443", "door.example.com"),
            ("null", "127.0.0.1:8080"),
            ("file://", "127.0.0.1:8080"),
            ("http://127.0.0.1:8080@evil", "127.0.0.1:8080"),
            ("http://127.0.0.1:8080/", "127.0.0.1:8080"),
            ("chrome-extension://abc", "abc"),
        ] {
            assert!(!same_origin(origin, authority), "{origin} {authority}");
        }
    }
}
