//! The one error of parsing the name of a closed set (an event, an instance
//! status, an alert level, a revive method): the name is none of the set's.
//! The sets' `FromStr` impls live with their types.

use std::fmt;

/// `name` is not a `kind` this version knows. The message names the kind,
/// quotes the name and, where the set is worth listing, lists the names
/// accepted (`unknown event "x"; known events: …`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownName {
    /// What the name was meant to be: `event`, `instance status`, ….
    pub kind: &'static str,
    pub name: String,
    /// The accepted names, comma-separated, when the message lists them.
    pub known: Option<String>,
}

impl UnknownName {
    pub fn new(kind: &'static str, name: &str) -> Self {
        Self {
            kind,
            name: name.to_owned(),
            known: None,
        }
    }

    /// The same error, listing `known` as the accepted names.
    pub fn listing(mut self, known: impl IntoIterator<Item = &'static str>) -> Self {
        self.known = Some(known.into_iter().collect::<Vec<_>>().join(", "));
        self
    }
}

impl fmt::Display for UnknownName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unknown {} {:?}", self.kind, self.name)?;
        if let Some(known) = &self.known {
            write!(f, "; known {}s: {known}", self.kind)?;
        }
        Ok(())
    }
}

impl std::error::Error for UnknownName {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_message_names_the_kind_and_lists_what_is_known() {
        let bare = UnknownName::new("alert level", "loud");
        assert_eq!(bare.to_string(), r#"unknown alert level "loud""#);
        let listed = UnknownName::new("event", "x").listing(["a", "b"]);
        assert_eq!(
            listed.to_string(),
            r#"unknown event "x"; known events: a, b"#
        );
    }
}
