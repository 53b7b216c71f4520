//! Chromium preferences an instance starts with (`config.prefs`, and
//! WebDriver's `goog:chromeOptions.prefs`): their one shape and their rules,
//! shared by the control plane (which refuses what breaks them) and the node
//! agent (which writes them into the profile before the browser starts).
//!
//! Keys are dotted paths (`intl.accept_languages`) or nested objects, as
//! chromedriver takes them; [`expand`] turns both into Chromium's nested
//! form. Refused: what would take a download or the browser's network out
//! of Flotilla's hands (the download folders, proxy settings), extension
//! settings (extensions are `config.extensions`), DevTools settings (the
//! protocol is how the agent runs the browser) and what opens programs
//! outside the browser (protocol handlers, downloads opened by type).
//! Preferences are not the confinement (the browser can write its own
//! profile; the sandbox, its network namespace and the CDP pins are): these
//! refusals keep a create from turning off what Flotilla relies on.

use serde_json::{Map, Value};

/// Largest accepted preferences, as compact JSON.
pub const MAX_BYTES: usize = 64 * 1024;
/// Deepest nesting after expansion.
pub const MAX_DEPTH: usize = 16;

/// Preference paths refused, with what is refused at and below each.
const REFUSED: &[(&str, &str)] = &[
    (
        "download.default_directory",
        "downloads land in the instance's downloads folder (GET /v2/instances/{id}/downloads)",
    ),
    (
        "savefile.default_directory",
        "files land in the instance's downloads folder (GET /v2/instances/{id}/downloads)",
    ),
    (
        "proxy",
        "the browser's network is Flotilla's; an upstream proxy is config.proxy",
    ),
    (
        "extensions",
        "extensions are config.extensions, uploaded with POST /v2/extensions",
    ),
    (
        "devtools",
        "the DevTools protocol is how Flotilla runs the browser (live view, snapshots, WebDriver)",
    ),
    (
        "protocol_handler",
        "pages must not open programs outside the browser",
    ),
    (
        "download.extensions_to_open",
        "downloads are never opened by programs outside the browser",
    ),
    (
        "download.open_pdf_in_system_reader",
        "downloads are never opened by programs outside the browser",
    ),
];

/// The download folders: what a WebDriver session's preferences may name
/// and Flotilla leaves out (Selenium suites set them; Grid overrides them).
pub const DOWNLOAD_FOLDERS: [&str; 2] =
    ["download.default_directory", "savefile.default_directory"];

/// Why preferences are refused; each message names the key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PrefsError {
    #[error("config.prefs is larger than {MAX_BYTES} bytes")]
    TooLarge,
    #[error("config.prefs nests deeper than {MAX_DEPTH} levels")]
    TooDeep,
    #[error("config.prefs key {key:?} is not a dotted name (empty part)")]
    BadKey { key: String },
    #[error("config.prefs sets {key:?} both as a value and as an object")]
    Conflict { key: String },
    #[error("config.prefs.{key} is refused: {why}")]
    Refused { key: String, why: &'static str },
    /// Firefox's preferences ([`crate::firefox_prefs`]) hold one of these.
    #[error(
        "config.prefs.{key} must be a boolean, a 32-bit integer or a string (a Firefox preference)"
    )]
    NotAFirefoxValue { key: String },
}

/// `prefs` in Chromium's nested form, checked: dotted keys become nested
/// objects, merged with nested ones; too large, too deep, ambiguous or
/// refused preferences are an error.
pub fn expand(prefs: &Map<String, Value>) -> Result<Map<String, Value>, PrefsError> {
    let size = serde_json::to_vec(prefs)
        .map(|v| v.len())
        .unwrap_or(usize::MAX);
    if size > MAX_BYTES {
        return Err(PrefsError::TooLarge);
    }
    let mut nested = Map::new();
    insert_all(&mut nested, prefs, "", 1)?;
    check_refused(&nested)?;
    Ok(nested)
}

/// Inserts every entry of `from` (keys possibly dotted) below `into`;
/// `prefix` is the path of `into`, for messages.
fn insert_all(
    into: &mut Map<String, Value>,
    from: &Map<String, Value>,
    prefix: &str,
    depth: usize,
) -> Result<(), PrefsError> {
    for (key, value) in from {
        let path = if prefix.is_empty() {
            key.clone()
        } else {
            format!("{prefix}.{key}")
        };
        let parts: Vec<&str> = key.split('.').collect();
        if parts.iter().any(|part| part.is_empty()) {
            return Err(PrefsError::BadKey { key: path });
        }
        if depth + parts.len() - 1 > MAX_DEPTH {
            return Err(PrefsError::TooDeep);
        }
        // Down to the parent of the last part, making objects on the way.
        let mut at = &mut *into;
        for (index, part) in parts[..parts.len() - 1].iter().enumerate() {
            let entry = at
                .entry((*part).to_owned())
                .or_insert_with(|| Value::Object(Map::new()));
            at = match entry {
                Value::Object(object) => object,
                _ => {
                    return Err(PrefsError::Conflict {
                        key: joined(prefix, &parts[..=index]),
                    });
                }
            };
        }
        let last = parts[parts.len() - 1];
        let depth_here = depth + parts.len() - 1;
        match (value, at.get_mut(last)) {
            (Value::Object(children), Some(Value::Object(existing))) => {
                insert_all(existing, children, &path, depth_here + 1)?;
            }
            (Value::Object(children), None) => {
                let mut object = Map::new();
                insert_all(&mut object, children, &path, depth_here + 1)?;
                at.insert(last.to_owned(), Value::Object(object));
            }
            (_, Some(_)) => return Err(PrefsError::Conflict { key: path }),
            (value, None) => {
                if nesting(value) + depth_here > MAX_DEPTH {
                    return Err(PrefsError::TooDeep);
                }
                at.insert(last.to_owned(), value.clone());
            }
        }
    }
    Ok(())
}

fn joined(prefix: &str, parts: &[&str]) -> String {
    let tail = parts.join(".");
    if prefix.is_empty() {
        tail
    } else {
        format!("{prefix}.{tail}")
    }
}

/// Levels of arrays (objects are expanded on their own) inside `value`.
fn nesting(value: &Value) -> usize {
    match value {
        Value::Array(items) => 1 + items.iter().map(nesting).max().unwrap_or(0),
        Value::Object(fields) => 1 + fields.values().map(nesting).max().unwrap_or(0),
        _ => 0,
    }
}

fn check_refused(nested: &Map<String, Value>) -> Result<(), PrefsError> {
    for (path, why) in REFUSED {
        if lookup(nested, path).is_some() {
            return Err(PrefsError::Refused {
                key: (*path).to_owned(),
                why,
            });
        }
    }
    Ok(())
}

fn lookup<'a>(nested: &'a Map<String, Value>, path: &str) -> Option<&'a Value> {
    let mut parts = path.split('.');
    let mut value = nested.get(parts.next()?)?;
    for part in parts {
        value = value.as_object()?.get(part)?;
    }
    Some(value)
}

/// `prefs` without the download folders (dotted or nested), for a WebDriver
/// session: its downloads are the instance's (Grid's managed downloads).
pub fn without_download_folders(prefs: &Map<String, Value>) -> Map<String, Value> {
    let mut kept = prefs.clone();
    for folder in DOWNLOAD_FOLDERS {
        kept.remove(folder);
        let (group, key) = folder.split_once('.').expect("a dotted name");
        if let Some(Value::Object(fields)) = kept.get_mut(group) {
            fields.remove(key);
            if fields.is_empty() {
                kept.remove(group);
            }
        }
    }
    kept
}

/// Merges `prefs` (nested) into `existing` (a profile's `Preferences`):
/// objects merge, anything else is replaced.
pub fn merge_into(existing: &mut Map<String, Value>, prefs: &Map<String, Value>) {
    for (key, value) in prefs {
        match (existing.get_mut(key), value) {
            (Some(Value::Object(inner)), Value::Object(children)) => merge_into(inner, children),
            _ => {
                existing.insert(key.clone(), value.clone());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn map(value: Value) -> Map<String, Value> {
        match value {
            Value::Object(map) => map,
            other => panic!("not an object: {other}"),
        }
    }

    #[test]
    fn dotted_and_nested_keys_make_one_nested_object() {
        let prefs = map(json!({
            "intl.accept_languages": "fr-FR,fr",
            "profile": {"default_content_setting_values.notifications": 2},
            "profile.password_manager_enabled": false,
        }));
        assert_eq!(
            Value::Object(expand(&prefs).unwrap()),
            json!({
                "intl": {"accept_languages": "fr-FR,fr"},
                "profile": {
                    "default_content_setting_values": {"notifications": 2},
                    "password_manager_enabled": false,
                },
            })
        );
    }

    #[test]
    fn a_key_set_as_a_value_and_as_an_object_is_ambiguous() {
        for prefs in [
            json!({"a": 1, "a.b": 2}),
            json!({"a.b": 2, "a": 1}),
            json!({"a.b": 1, "a": {"b": {"c": 2}}}),
        ] {
            let error = expand(&map(prefs.clone())).unwrap_err();
            assert!(
                matches!(error, PrefsError::Conflict { .. }),
                "{prefs}: {error}"
            );
        }
    }

    #[test]
    fn empty_parts_are_refused() {
        for key in ["", ".a", "a.", "a..b"] {
            let error = expand(&map(json!({ key: 1 }))).unwrap_err();
            assert!(
                matches!(error, PrefsError::BadKey { .. }),
                "{key:?}: {error}"
            );
        }
    }

    #[test]
    fn the_download_folders_proxy_and_extensions_are_refused_however_written() {
        for (prefs, key) in [
            (
                json!({"download.default_directory": "/etc"}),
                "download.default_directory",
            ),
            (
                json!({"download": {"default_directory": "/etc"}}),
                "download.default_directory",
            ),
            (
                json!({"savefile": {"default_directory": "/"}}),
                "savefile.default_directory",
            ),
            (json!({"proxy.mode": "direct"}), "proxy"),
            (json!({"extensions": {"settings": {}}}), "extensions"),
            (json!({"devtools.availability": 2}), "devtools"),
            (
                json!({"protocol_handler": {"allowed_origin_protocol_pairs": {}}}),
                "protocol_handler",
            ),
            (
                json!({"download.extensions_to_open": "pdf"}),
                "download.extensions_to_open",
            ),
            (
                json!({"download": {"open_pdf_in_system_reader": true}}),
                "download.open_pdf_in_system_reader",
            ),
        ] {
            let error = expand(&map(prefs.clone())).unwrap_err();
            assert_eq!(
                error,
                PrefsError::Refused {
                    key: key.into(),
                    why: REFUSED.iter().find(|(k, _)| *k == key).unwrap().1
                },
                "{prefs}"
            );
            assert!(error.to_string().contains(key), "{error}");
        }
        // Neighbours are not.
        assert!(expand(&map(json!({"download.prompt_for_download": false}))).is_ok());
    }

    #[test]
    fn oversize_and_deep_preferences_are_refused() {
        let big = "x".repeat(MAX_BYTES);
        assert_eq!(expand(&map(json!({"a": big}))), Err(PrefsError::TooLarge));
        let deep_key = vec!["k"; MAX_DEPTH + 1].join(".");
        assert_eq!(
            expand(&map(json!({ deep_key: 1 }))),
            Err(PrefsError::TooDeep)
        );
        let mut deep = json!(1);
        for _ in 0..MAX_DEPTH + 1 {
            deep = json!({ "k": deep });
        }
        assert_eq!(expand(&map(deep)), Err(PrefsError::TooDeep));
        let mut array = json!(1);
        for _ in 0..MAX_DEPTH + 1 {
            array = json!([array]);
        }
        assert_eq!(
            expand(&map(json!({ "a": array }))),
            Err(PrefsError::TooDeep)
        );
        let fits = vec!["k"; MAX_DEPTH].join(".");
        assert!(expand(&map(json!({ fits: 1 }))).is_ok());
    }

    #[test]
    fn a_webdriver_session_leaves_the_download_folders_out() {
        let prefs = map(json!({
            "download.default_directory": "/home/me/Downloads",
            "savefile": {"default_directory": "/tmp"},
            "download": {"prompt_for_download": false},
            "intl.accept_languages": "de",
        }));
        let kept = without_download_folders(&prefs);
        assert_eq!(
            Value::Object(kept.clone()),
            json!({"download": {"prompt_for_download": false}, "intl.accept_languages": "de"})
        );
        assert!(expand(&kept).is_ok());
    }

    #[test]
    fn merging_keeps_what_the_profile_had() {
        let mut existing = map(json!({"intl": {"selected_languages": "en"}, "browser": {"x": 1}}));
        merge_into(
            &mut existing,
            &map(json!({"intl": {"accept_languages": "fr"}, "browser": 2})),
        );
        assert_eq!(
            Value::Object(existing),
            json!({"intl": {"selected_languages": "en", "accept_languages": "fr"}, "browser": 2})
        );
    }
}
