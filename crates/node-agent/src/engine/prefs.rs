//! Writes an instance's `config.prefs` into its profile's
//! `Default/Preferences` before the browser starts, as chromedriver does for
//! `goog:chromeOptions.prefs`: merged into what the profile already has (a
//! revived or saved profile keeps everything else).
//!
//! The profile is the browser's to write, so what lies in it is hostile: the
//! agent (often root) reads and writes there only through
//! [`BrowserFolder`], which never follows a link.

use std::io;
use std::path::Path;

use serde_json::{Map, Value};

use flotilla_api_types::prefs;

use crate::system::files::BrowserFolder;

/// Largest `Preferences` read back; a larger (or unreadable) one is started
/// over with only the instance's preferences, as Chromium itself does with a
/// file it cannot parse.
const MAX_EXISTING_BYTES: u64 = 16 * 1024 * 1024;

/// Merges `asked` (as the create took it: dotted or nested) into
/// `profile/Default/Preferences`.
pub fn write(profile: &Path, asked: &Map<String, Value>) -> io::Result<()> {
    let nested =
        prefs::expand(asked).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let default = BrowserFolder::open(profile)?.folder("Default")?;
    let mut merged = default
        .read("Preferences", MAX_EXISTING_BYTES)
        .and_then(|text| match serde_json::from_slice(&text) {
            Ok(Value::Object(fields)) => Some(fields),
            _ => None,
        })
        .unwrap_or_default();
    prefs::merge_into(&mut merged, &nested);
    let text = serde_json::to_vec(&Value::Object(merged)).map_err(io::Error::other)?;
    default.replace("Preferences", &text)
}

#[cfg(test)]
mod tests {
    use std::fs;

    use serde_json::json;

    use super::*;

    fn asked(value: Value) -> Map<String, Value> {
        match value {
            Value::Object(map) => map,
            other => panic!("{other}"),
        }
    }

    fn written(profile: &Path) -> Value {
        serde_json::from_slice(&fs::read(profile.join("Default/Preferences")).unwrap()).unwrap()
    }

    #[test]
    fn a_new_profile_gets_the_preferences_nested() {
        let profile = tempfile::tempdir().unwrap();
        write(
            profile.path(),
            &asked(json!({"intl.accept_languages": "fr-FR"})),
        )
        .unwrap();
        assert_eq!(
            written(profile.path()),
            json!({"intl": {"accept_languages": "fr-FR"}})
        );
    }

    #[test]
    fn a_profile_keeps_what_it_had() {
        let profile = tempfile::tempdir().unwrap();
        fs::create_dir(profile.path().join("Default")).unwrap();
        fs::write(
            profile.path().join("Default/Preferences"),
            r#"{"intl":{"selected_languages":"en"},"session":{"restore_on_startup":1}}"#,
        )
        .unwrap();
        write(
            profile.path(),
            &asked(json!({"intl": {"accept_languages": "de"}})),
        )
        .unwrap();
        assert_eq!(
            written(profile.path()),
            json!({"intl": {"selected_languages": "en", "accept_languages": "de"}, "session": {"restore_on_startup": 1}})
        );
        // Unparseable: started over.
        fs::write(profile.path().join("Default/Preferences"), b"{not json").unwrap();
        write(profile.path(), &asked(json!({"a.b": 1}))).unwrap();
        assert_eq!(written(profile.path()), json!({"a": {"b": 1}}));
    }

    #[test]
    fn links_the_browser_planted_are_replaced_never_followed() {
        let outside = tempfile::tempdir().unwrap();
        let secret = outside.path().join("secret");
        fs::write(&secret, r#"{"owner":"root"}"#).unwrap();
        // Preferences a link to a file outside the profile.
        let profile = tempfile::tempdir().unwrap();
        fs::create_dir(profile.path().join("Default")).unwrap();
        std::os::unix::fs::symlink(&secret, profile.path().join("Default/Preferences")).unwrap();
        // And the temporary name too.
        std::os::unix::fs::symlink(
            &secret,
            profile.path().join("Default/.Preferences.flotilla"),
        )
        .unwrap();
        write(profile.path(), &asked(json!({"x": 1}))).unwrap();
        assert_eq!(
            written(profile.path()),
            json!({"x": 1}),
            "the secret was not read"
        );
        assert_eq!(fs::read_to_string(&secret).unwrap(), r#"{"owner":"root"}"#);
        assert!(
            !fs::symlink_metadata(profile.path().join("Default/Preferences"))
                .unwrap()
                .is_symlink()
        );
        // Default a link to a folder outside the profile.
        let profile = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(outside.path(), profile.path().join("Default")).unwrap();
        write(profile.path(), &asked(json!({"x": 2}))).unwrap();
        assert!(
            fs::symlink_metadata(profile.path().join("Default"))
                .unwrap()
                .is_dir()
        );
        assert_eq!(written(profile.path()), json!({"x": 2}));
        assert_eq!(
            fs::read_dir(outside.path()).unwrap().count(),
            1,
            "nothing was written outside"
        );
    }

    #[test]
    fn a_fifo_is_not_waited_on() {
        let profile = tempfile::tempdir().unwrap();
        fs::create_dir(profile.path().join("Default")).unwrap();
        let made = std::process::Command::new("mkfifo")
            .arg(profile.path().join("Default/Preferences"))
            .status()
            .unwrap();
        assert!(made.success());
        write(profile.path(), &asked(json!({"y": true}))).unwrap();
        assert_eq!(written(profile.path()), json!({"y": true}));
    }
}
