//! Firefox preferences an instance of a Firefox image starts with
//! (`config.prefs` on such an image, and WebDriver's
//! `moz:firefoxOptions.prefs`): their one shape and their rules, shared by
//! the control plane (which checks a WebDriver session's) and the node
//! agent (which checks `config.prefs` against the image's engine and writes
//! them into the profile's `user.js`).
//!
//! Firefox preferences are flat: a dotted name and a boolean, a 32-bit
//! integer or a string (no control characters). Nested objects are read as
//! dotted names too (as `config.prefs` takes Chromium's). Firefox has
//! thousands of preferences, some of which start programs or load
//! libraries in the browser's main process (`helpers.*` mailcap commands,
//! `network.negotiate-auth.gsslib`), so only names under [`ALLOWED`] are
//! taken: what a page sees and how it is shown (languages, fonts, layout,
//! privacy, DOM features, permissions, the user agent, cookies, caches).
//! Names under it that would take a download or the browser's network out
//! of Flotilla's hands are refused with why ([`REFUSED`]), and so are the
//! well-known ones outside it (proxy, DNS over HTTPS, extensions, the
//! remote protocols, autoconfig, the browser's sandbox), for a clear
//! message. As for Chromium, preferences are not the confinement (the
//! sandbox, its network namespace and the enterprise policies are), and
//! Flotilla's own preferences, written after these, win where both name
//! one.

use serde_json::{Map, Value};

use crate::prefs::{MAX_BYTES, MAX_DEPTH, PrefsError};

/// Name prefixes taken (any other name is refused).
pub const ALLOWED: &[&str] = &[
    "intl.",
    "font.",
    "layout.",
    "ui.",
    "accessibility.",
    "privacy.",
    "dom.",
    "javascript.",
    "permissions.",
    "pdfjs.",
    "image.",
    "webgl.",
    "geo.",
    "full-screen-api.",
    "general.useragent.",
    "general.smoothScroll",
    "network.cookie.",
    "network.http.",
    "media.autoplay.",
    "media.navigator.",
    "browser.cache.",
    "browser.display.",
    "browser.tabs.",
    "browser.link.",
    "browser.zoom.",
    "browser.helperApps.neverAsk.",
    "toolkit.zoomManager.",
];

/// Name prefixes refused, with why (checked first: a clear reason for the
/// names suites set most).
const REFUSED: &[(&str, &str)] = &[
    (
        "browser.download.",
        "downloads land in the instance's downloads folder (GET /v2/instances/{id}/downloads)",
    ),
    (
        "network.proxy.",
        "the browser's network is Flotilla's; an upstream proxy is config.proxy",
    ),
    (
        "network.trr.",
        "names are resolved by Flotilla's egress proxy, never over DNS over HTTPS",
    ),
    (
        "network.protocol-handler.",
        "pages must not open programs outside the browser",
    ),
    (
        "extensions.",
        "the browser takes no extensions from Flotilla",
    ),
    (
        "xpinstall.",
        "the browser takes no extensions from Flotilla",
    ),
    (
        "remote.",
        "WebDriver BiDi is how Flotilla runs the browser (live view, snapshots, WebDriver)",
    ),
    (
        "marionette.",
        "Marionette is how WebDriver sessions reach the browser",
    ),
    ("devtools.", "the browser's remote protocols are Flotilla's"),
    (
        "general.config.",
        "autoconfig scripts run with the browser's privileges",
    ),
    (
        "security.sandbox.",
        "the browser's own sandbox stays as Firefox ships it",
    ),
    (
        "security.fileuri.",
        "file: pages are refused by Flotilla's policies",
    ),
    (
        "capability.policy.",
        "pages get no privileges beyond the web's",
    ),
    (
        "app.update.",
        "the browser makes no traffic of its own (updates come with the node's packages)",
    ),
    (
        "toolkit.telemetry.",
        "the browser makes no traffic of its own",
    ),
    ("datareporting.", "the browser makes no traffic of its own"),
    ("services.", "the browser makes no traffic of its own"),
    (
        "helpers.",
        "helper programs run outside the browser's sandbox",
    ),
    (
        "network.negotiate-auth.",
        "it loads libraries into the browser",
    ),
    (
        "print.",
        "printing to files is Flotilla's (PDFs are REST actions)",
    ),
    ("dom.ipc.", "the browser's processes are its sandbox's"),
    (
        "dom.security.",
        "the browser's own security checks stay as Firefox ships them",
    ),
];

/// `prefs` as `(dotted name, value)` pairs, checked:
/// too large, too deep, an empty name part, a value that is not a
/// boolean, a 32-bit integer or a string, or a refused name is an error.
pub fn flatten(prefs: &Map<String, Value>) -> Result<Vec<(String, Value)>, PrefsError> {
    let size = serde_json::to_vec(prefs)
        .map(|v| v.len())
        .unwrap_or(usize::MAX);
    if size > MAX_BYTES {
        return Err(PrefsError::TooLarge);
    }
    let mut flat = Vec::new();
    flatten_into(&mut flat, prefs, "", 1)?;
    for (name, _) in &flat {
        if let Some((_, why)) = REFUSED.iter().find(|(prefix, _)| name.starts_with(prefix)) {
            return Err(PrefsError::Refused {
                key: name.clone(),
                why,
            });
        }
        if !ALLOWED.iter().any(|prefix| name.starts_with(prefix)) {
            return Err(PrefsError::Refused {
                key: name.clone(),
                why: "it is not among the Firefox preferences Flotilla takes (what pages see and how they are shown: see docs/api.md, \"Firefox\")",
            });
        }
    }
    Ok(flat)
}

fn flatten_into(
    flat: &mut Vec<(String, Value)>,
    from: &Map<String, Value>,
    prefix: &str,
    depth: usize,
) -> Result<(), PrefsError> {
    if depth > MAX_DEPTH {
        return Err(PrefsError::TooDeep);
    }
    for (key, value) in from {
        let name = if prefix.is_empty() {
            key.clone()
        } else {
            format!("{prefix}.{key}")
        };
        if name.split('.').any(str::is_empty) || name.chars().any(char::is_control) {
            return Err(PrefsError::BadKey { key: name });
        }
        match value {
            Value::Object(fields) => flatten_into(flat, fields, &name, depth + 1)?,
            Value::String(text) if text.chars().any(char::is_control) => {
                return Err(PrefsError::NotAFirefoxValue { key: name });
            }
            Value::Bool(_) | Value::String(_) => flat.push((name, value.clone())),
            Value::Number(number) if number.as_i64().is_some_and(|n| i32::try_from(n).is_ok()) => {
                flat.push((name, value.clone()))
            }
            _ => return Err(PrefsError::NotAFirefoxValue { key: name }),
        }
    }
    Ok(())
}

/// `prefs` without Firefox's download settings (dotted or nested), for a
/// WebDriver session: Selenium suites set them; the session's downloads are
/// the instance's (Grid's managed downloads).
pub fn without_download_settings(prefs: &Map<String, Value>) -> Map<String, Value> {
    let mut kept = Map::new();
    for (key, value) in prefs {
        let name = key.as_str();
        if name.starts_with("browser.download.") {
            continue;
        }
        let value = match (name, value) {
            ("browser", Value::Object(fields)) => {
                let mut fields = fields.clone();
                fields.remove("download");
                fields.retain(|key, _| !key.starts_with("download."));
                if fields.is_empty() {
                    continue;
                }
                Value::Object(fields)
            }
            _ => value.clone(),
        };
        kept.insert(key.clone(), value);
    }
    kept
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn map(value: Value) -> Map<String, Value> {
        value.as_object().unwrap().clone()
    }

    #[test]
    fn dotted_and_nested_names_become_flat_pairs() {
        let mut flat = flatten(&map(json!({
            "intl.accept_languages": "de-DE",
            "dom": {"webnotifications": {"enabled": false}},
            "browser.tabs.warnOnClose": true,
            "layout.css.devPixelsPerPx": "1.5",
            "ui.caretBlinkTime": -1,
        })))
        .unwrap();
        flat.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(
            flat,
            vec![
                ("browser.tabs.warnOnClose".into(), json!(true)),
                ("dom.webnotifications.enabled".into(), json!(false)),
                ("intl.accept_languages".into(), json!("de-DE")),
                ("layout.css.devPixelsPerPx".into(), json!("1.5")),
                ("ui.caretBlinkTime".into(), json!(-1)),
            ]
        );
    }

    #[test]
    fn what_would_take_the_browser_out_of_flotillas_hands_is_refused_by_name() {
        for name in [
            "network.proxy.type",
            "network.trr.mode",
            "browser.download.dir",
            "general.config.filename",
            "marionette.port",
            "remote.active-protocols",
            "extensions.autoDisableScopes",
            "security.sandbox.content.level",
            "network.protocol-handler.external.mailto",
            // Helper programs and libraries of the main process.
            "helpers.private_mailcap_file",
            "network.negotiate-auth.gsslib",
            "print.print_to_filename",
            "dom.ipc.processCount",
            // Outside what Flotilla takes at all.
            "security.allow_unsafe_parent_loads",
            "network.process.enabled",
            "media.rdd-process.enabled",
            "browser.startup.homepage",
        ] {
            let error = flatten(&map(json!({name: 1}))).unwrap_err();
            assert!(
                matches!(&error, PrefsError::Refused { key, .. } if key == name),
                "{name}: {error}"
            );
            assert!(error.to_string().contains(name), "{error}");
        }
        // Nested spelling is the same name.
        let nested = flatten(&map(json!({"network": {"proxy": {"type": 0}}}))).unwrap_err();
        assert!(matches!(nested, PrefsError::Refused { key, .. } if key == "network.proxy.type"));
    }

    #[test]
    fn hostile_shapes_are_refused() {
        for (prefs, expected) in [
            (json!({"a..b": 1}), "not a dotted name"),
            (json!({"": 1}), "not a dotted name"),
            (json!({"a\nb": 1}), "not a dotted name"),
            (json!({"a.b": [1]}), "boolean, a 32-bit integer or a string"),
            (
                json!({"intl.x": "a\tb"}),
                "boolean, a 32-bit integer or a string",
            ),
            (
                json!({"intl.x": "a\u{0}b"}),
                "boolean, a 32-bit integer or a string",
            ),
            (
                json!({"a.b": null}),
                "boolean, a 32-bit integer or a string",
            ),
            (json!({"a.b": 1.5}), "boolean, a 32-bit integer or a string"),
            (
                json!({"a.b": 4_294_967_296_i64}),
                "boolean, a 32-bit integer or a string",
            ),
        ] {
            let error = flatten(&map(prefs.clone())).unwrap_err().to_string();
            assert!(error.contains(expected), "{prefs}: {error}");
        }
        let mut deep = json!(1);
        for _ in 0..=MAX_DEPTH {
            deep = json!({ "x": deep });
        }
        assert_eq!(flatten(&map(deep)).unwrap_err(), PrefsError::TooDeep);
        let huge = json!({"a.b": "x".repeat(MAX_BYTES)});
        assert_eq!(flatten(&map(huge)).unwrap_err(), PrefsError::TooLarge);
    }

    #[test]
    fn a_sessions_download_settings_are_left_out() {
        let kept = without_download_settings(&map(json!({
            "browser.download.dir": "/home/me/Downloads",
            "browser.download.folderList": 2,
            "browser": {"download": {"useDownloadDir": true}, "tabs.warnOnClose": false},
            "browser.helperApps.neverAsk.saveToDisk": "application/pdf",
        })));
        assert_eq!(
            Value::Object(kept),
            json!({
                "browser": {"tabs.warnOnClose": false},
                "browser.helperApps.neverAsk.saveToDisk": "application/pdf",
            })
        );
    }
}
