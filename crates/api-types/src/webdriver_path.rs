//! The path of a WebDriver command after its session (`/session/{id}…`),
//! as the client sent it, percent-encoded: checked once, the same way on
//! the front door and on the node, so that what is compared with the
//! commands Flotilla pins or refuses is exactly what chromedriver is sent.
//!
//! chromedriver matches a path's segments as written (no decoding, case
//! matters), so the path goes on as sent ([`CommandPath::raw`]) and is
//! compared decoded and in lower case ([`CommandPath::is`]), which catches
//! every spelling chromedriver could take for a pinned command. A path
//! that could be read as another command by any party on the way is
//! refused: an empty segment (`//`, a trailing `/`), `.` or `..`, a
//! percent-encoded separator, `#`, `?` or `%` (`%2F`, `%5C`, `%23`, `%3F`,
//! `%25`, which a second decoding on the way would turn into one), a `%`
//! not followed by two hex digits, or a segment that decodes to bytes that
//! are not UTF-8 or hold a control character.

/// A checked command path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandPath {
    raw: String,
    decoded_lower: String,
}

/// Why a command path is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CommandPathError {
    #[error("the command path {0:?} has an empty segment ('//' or a trailing '/')")]
    EmptySegment(String),
    #[error("the command path {0:?} has a '.' or '..' segment")]
    DotSegment(String),
    #[error(
        "the command path {0:?} percent-encodes a separator, '#', '?' or '%', or has a '%' without two hex digits"
    )]
    Encoded(String),
    #[error("the command path {0:?} decodes to something that is not plain text")]
    NotText(String),
}

/// Encodings that a second decoding would turn into a separator, a
/// fragment, a query or another escape.
const REFUSED_ESCAPES: &[&str] = &["2f", "5c", "23", "3f", "25"];

impl CommandPath {
    /// Checks `raw`: empty (the session itself) or `/segment/…` as sent.
    pub fn parse(raw: &str) -> Result<Self, CommandPathError> {
        let mut decoded_lower = String::with_capacity(raw.len());
        if raw.is_empty() {
            return Ok(Self {
                raw: String::new(),
                decoded_lower,
            });
        }
        let Some(segments) = raw.strip_prefix('/') else {
            return Err(CommandPathError::EmptySegment(raw.to_owned()));
        };
        for segment in segments.split('/') {
            let decoded = decode_segment(segment, raw)?;
            decoded_lower.push('/');
            decoded_lower.push_str(&decoded.to_lowercase());
        }
        Ok(Self {
            raw: raw.to_owned(),
            decoded_lower,
        })
    }

    /// The path as sent (to send on).
    pub fn raw(&self) -> &str {
        &self.raw
    }

    /// Whether this is the command `path` (`/goog/cdp/execute`) in any
    /// spelling.
    pub fn is(&self, path: &str) -> bool {
        self.decoded_lower == path.to_lowercase()
    }

    /// Whether this is the session itself (no command).
    pub fn is_session(&self) -> bool {
        self.raw.is_empty()
    }
}

fn decode_segment(segment: &str, raw: &str) -> Result<String, CommandPathError> {
    let refuse_encoded = || CommandPathError::Encoded(raw.to_owned());
    if segment.is_empty() {
        return Err(CommandPathError::EmptySegment(raw.to_owned()));
    }
    let mut bytes = Vec::with_capacity(segment.len());
    let mut rest = segment.as_bytes();
    while let Some((&byte, after)) = rest.split_first() {
        if byte != b'%' {
            if matches!(byte, b'#' | b'?' | b'\\') {
                return Err(refuse_encoded());
            }
            bytes.push(byte);
            rest = after;
            continue;
        }
        let hex = after.get(..2).ok_or_else(refuse_encoded)?;
        let hex = std::str::from_utf8(hex).map_err(|_| refuse_encoded())?;
        if REFUSED_ESCAPES.contains(&hex.to_ascii_lowercase().as_str()) {
            return Err(refuse_encoded());
        }
        bytes.push(u8::from_str_radix(hex, 16).map_err(|_| refuse_encoded())?);
        rest = &after[2..];
    }
    let decoded =
        String::from_utf8(bytes).map_err(|_| CommandPathError::NotText(raw.to_owned()))?;
    if decoded.chars().any(char::is_control) {
        return Err(CommandPathError::NotText(raw.to_owned()));
    }
    if decoded == "." || decoded == ".." {
        return Err(CommandPathError::DotSegment(raw.to_owned()));
    }
    Ok(decoded)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_spelling_of_a_command_is_that_command() {
        for raw in [
            "/goog/cdp/execute",
            "/GOOG/CDP/EXECUTE",
            "/goog/cdp/Execute",
            "/%67oog/cdp/execut%65",
            "/goog/cdp/execut%45",
        ] {
            let path = CommandPath::parse(raw).unwrap();
            assert!(path.is("/goog/cdp/execute"), "{raw}");
            assert_eq!(path.raw(), raw);
        }
        let url = CommandPath::parse("/url").unwrap();
        assert!(!url.is("/goog/cdp/execute"));
        assert!(CommandPath::parse("").unwrap().is_session());
        // Cookie names may hold encoded spaces and the like.
        assert!(CommandPath::parse("/cookie/my%20cookie").is_ok());
    }

    #[test]
    fn paths_another_reader_could_take_for_another_command_are_refused() {
        for raw in [
            "/goog/cdp/execute%23",
            "/goog/cdp/execute%2523",
            "/goog/cdp/execute%3F",
            "/goog/cdp/execute%3f",
            "/goog%2Fcdp%2Fexecute",
            "/goog%2fcdp/execute",
            "/goog%5Ccdp/execute",
            "/goog/cdp/execute/",
            "//goog/cdp/execute",
            "/goog//cdp/execute",
            "/goog/./cdp/execute",
            "/goog/x/../cdp/execute",
            "/goog/%2e%2e/execute",
            "/goog/cdp/execute%",
            "/goog/cdp/execute%4",
            "/goog/cdp/execute%zz",
            "/goog/cdp/execute%00",
            "/goog/cdp/execute%ff",
            "/goog/cdp/execute#",
            "/goog/cdp/execute?x",
            "goog/cdp/execute",
        ] {
            assert!(CommandPath::parse(raw).is_err(), "{raw}");
        }
    }
}
