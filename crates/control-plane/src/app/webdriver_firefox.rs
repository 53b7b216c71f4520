//! What a WebDriver session asking for `browserName: "firefox"` may say of
//! its browser: `moz:firefoxOptions`, read as `goog:chromeOptions` is
//! (`args` each checked, `prefs` into the instance's `config.prefs`, the
//! host paths refused). The session runs on the `firefox` image (unless
//! `flotilla:options.image` names another), and the node's geckodriver
//! attaches to its browser.

use serde_json::{Map, Value};

use super::webdriver::{BrowserOptions, WebDriverRefusal, window_size_of};

/// The image a Firefox session runs on unless `flotilla:options.image`
/// names another (the built-in one, where the node has `firefox-esr`).
pub const FIREFOX_IMAGE: &str = "firefox";

/// Arguments that would break the browser's isolation or the agent's
/// control of it: refused, each named.
const REFUSED_ARGS: &[&str] = &[
    "-profile",
    "-p",
    "-profilemanager",
    "-marionette",
    "-remote-debugging-port",
    "-remote-allow-hosts",
    "-remote-allow-origins",
    "-remote-allow-system-access",
    "-start-debugger-server",
    "-jsconsole",
    "-devtools",
    "-safe-mode",
    "-setdefaultbrowser",
    "-wait-for-browser",
];

/// Arguments every Flotilla Firefox already runs with: accepted.
const ALREADY_SO: &[&str] = &["-headless", "-no-remote", "-new-instance"];

/// Keys of `moz:firefoxOptions` that name a host path, the browser's
/// environment or another device: refused.
const REFUSED_OPTIONS: &[&str] = &[
    "binary",
    "profile",
    "env",
    "androidPackage",
    "androidActivity",
    "androidDeviceSerial",
    "androidIntentArguments",
];

/// A pref Selenium sets on every Firefox session (WebDriver BiDi only):
/// Flotilla's Firefox already runs BiDi, and the `remote.` prefs are its.
const SELENIUM_PROTOCOLS_PREF: &str = "remote.active-protocols";

/// `moz:firefoxOptions`: the window size its arguments ask for, the
/// preferences the instance's browser starts with, and the refusals.
pub(super) fn firefox_options(value: Option<&Value>) -> Result<BrowserOptions, WebDriverRefusal> {
    let options = match value {
        None | Some(Value::Null) => return Ok(BrowserOptions::default()),
        Some(Value::Object(options)) => options,
        Some(_) => {
            return Err(WebDriverRefusal::invalid_argument(
                "moz:firefoxOptions must be an object",
            ));
        }
    };
    let mut firefox = BrowserOptions::default();
    for (key, value) in options {
        match key.as_str() {
            "args" => firefox.window_size = firefox_args(value)?,
            "prefs" => firefox.prefs = firefox_prefs(value)?,
            // geckodriver's log is the node's.
            "log" if value.is_object() => {}
            key if REFUSED_OPTIONS.contains(&key) => {
                return Err(WebDriverRefusal::invalid_argument(format!(
                    "moz:firefoxOptions.{key} is refused: the instance's browser is Flotilla's, in its sandbox, with its own profile"
                )));
            }
            other => {
                return Err(WebDriverRefusal::invalid_argument(format!(
                    "moz:firefoxOptions.{other} is not supported by Flotilla (supported: args, prefs, log)"
                )));
            }
        }
    }
    Ok(firefox)
}

/// `moz:firefoxOptions.prefs`, checked as Firefox's `config.prefs` are,
/// without the download settings and the protocol Selenium sets (the
/// session's downloads are the instance's; its BiDi is Flotilla's); none
/// when nothing is left.
fn firefox_prefs(value: &Value) -> Result<Option<Map<String, Value>>, WebDriverRefusal> {
    let Some(prefs) = value.as_object() else {
        return Err(WebDriverRefusal::invalid_argument(
            "moz:firefoxOptions.prefs must be an object",
        ));
    };
    let mut prefs = flotilla_api_types::firefox_prefs::without_download_settings(prefs);
    prefs.remove(SELENIUM_PROTOCOLS_PREF);
    flotilla_api_types::firefox_prefs::flatten(&prefs).map_err(|error| {
        WebDriverRefusal::invalid_argument(format!("moz:firefoxOptions.prefs: {error}"))
    })?;
    Ok((!prefs.is_empty()).then_some(prefs))
}

/// A Firefox argument's switch, lower case with one leading dash
/// (`--Width=800` and `-width` are the same switch), and its `=` value.
fn switch_of(arg: &str) -> (String, Option<&str>) {
    let (switch, value) = match arg.split_once('=') {
        Some((switch, value)) => (switch, Some(value)),
        None => (arg, None),
    };
    let bare = switch.trim_start_matches('-');
    (format!("-{}", bare.to_ascii_lowercase()), value)
}

/// `moz:firefoxOptions.args`: each refused one named; the window size
/// read (`--width=W --height=H`, `-width W -height H` or
/// `--window-size=W,H`); what Flotilla's Firefox already does accepted.
fn firefox_args(value: &Value) -> Result<Option<(u64, u64)>, WebDriverRefusal> {
    let not_strings = || {
        WebDriverRefusal::invalid_argument("moz:firefoxOptions.args must be an array of strings")
    };
    let args: Vec<&str> = value
        .as_array()
        .ok_or_else(not_strings)?
        .iter()
        .map(|arg| arg.as_str().ok_or_else(not_strings))
        .collect::<Result<_, _>>()?;
    let (mut refused, mut unsupported) = (Vec::new(), Vec::new());
    let (mut width, mut height, mut window_size) = (None, None, None);
    let mut rest = args.iter();
    while let Some(&arg) = rest.next() {
        let (switch, inline) = switch_of(arg);
        match switch.as_str() {
            "-width" | "-height" => {
                let text = match inline {
                    Some(text) => text,
                    None => rest.next().copied().unwrap_or_default(),
                };
                let pixels = pixels_of(&switch, text)?;
                if switch == "-width" {
                    width = Some(pixels);
                } else {
                    height = Some(pixels);
                }
            }
            "-window-size" => window_size = Some(window_size_of(arg)?),
            switch if REFUSED_ARGS.contains(&switch) => refused.push(arg),
            switch if ALREADY_SO.contains(&switch) => {}
            _ => unsupported.push(arg),
        }
    }
    if !refused.is_empty() {
        return Err(WebDriverRefusal::invalid_argument(format!(
            "moz:firefoxOptions.args {refused:?} would break the browser's isolation or Flotilla's control of it: remove them (the profile, the remote protocols and the sandbox are Flotilla's)"
        )));
    }
    if !unsupported.is_empty() {
        return Err(WebDriverRefusal::invalid_argument(format!(
            "moz:firefoxOptions.args {unsupported:?} are not supported by Flotilla (accepted: --width=W, --height=H, --window-size=W,H and {ALREADY_SO:?}, which Flotilla's Firefox already runs with)"
        )));
    }
    match (width, height) {
        (Some(width), Some(height)) => Ok(Some((width, height))),
        (None, None) => Ok(window_size),
        _ => Err(WebDriverRefusal::invalid_argument(
            "moz:firefoxOptions.args: --width and --height go together",
        )),
    }
}

fn pixels_of(switch: &str, text: &str) -> Result<u64, WebDriverRefusal> {
    text.trim()
        .parse::<u64>()
        .ok()
        .filter(|pixels| (100..=8192).contains(pixels))
        .ok_or_else(|| {
            WebDriverRefusal::invalid_argument(format!(
                "moz:firefoxOptions.args: {switch} takes pixels from 100 to 8192, not {text:?}"
            ))
        })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use crate::app::webdriver::new_session;

    const INSTALLED: &str = "156.0.8078.108";

    #[test]
    fn what_selenium_sends_for_firefox_creates_a_firefox_instance() {
        // Selenium 4.51 for Python: FirefoxOptions(), enable_bidi, a
        // window size and download settings.
        let created = new_session(
            &json!({"capabilities": {"firstMatch": [{}], "alwaysMatch": {
                "browserName": "firefox", "acceptInsecureCerts": true,
                "moz:debuggerAddress": true, "pageLoadStrategy": "normal",
                "webSocketUrl": true,
                "moz:firefoxOptions": {
                    "args": ["-headless", "--width=1024", "--height=700"],
                    "prefs": {
                        "remote.active-protocols": 1,
                        "browser.download.dir": "/home/me/Downloads",
                        "browser.download.folderList": 2,
                        "intl.accept_languages": "de-DE",
                    },
                    "log": {"level": "trace"},
                },
            }}}),
            INSTALLED,
        )
        .unwrap();
        assert_eq!(created.create.image.as_deref(), Some("firefox"));
        assert_eq!(created.window_size, Some((1024, 700)));
        assert_eq!(created.capabilities["browserName"], "firefox");
        assert_eq!(created.capabilities["webSocketUrl"], true);
        assert!(created.capabilities.get("moz:firefoxOptions").is_none());
        let prefs = created.create.config.unwrap().prefs.unwrap();
        assert_eq!(
            serde_json::Value::Object(prefs),
            json!({"intl.accept_languages": "de-DE"})
        );
    }

    #[test]
    fn a_firefox_version_is_left_to_geckodriver_and_an_image_named_is_kept() {
        let created = new_session(
            &json!({"capabilities": {"alwaysMatch": {
                "browserName": "firefox", "browserVersion": "153",
                "flotilla:options": {"image": "firefox-nightly"},
            }}}),
            INSTALLED,
        )
        .unwrap();
        assert_eq!(created.capabilities["browserVersion"], "153");
        assert_eq!(created.create.image.as_deref(), Some("firefox-nightly"));
    }

    #[test]
    fn firefox_arguments_and_options_are_refused_by_name() {
        for (options, named) in [
            (json!({"args": ["-profile", "/tmp/p"]}), "-profile"),
            (json!({"args": ["--marionette"]}), "--marionette"),
            (
                json!({"args": ["--remote-debugging-port=9222"]}),
                "--remote-debugging-port=9222",
            ),
            (json!({"args": ["-P", "default"]}), "-P"),
            (json!({"args": ["--kiosk"]}), "--kiosk"),
            (json!({"args": ["--width=800"]}), "--width and --height"),
            (json!({"args": ["-width", "5", "-height", "600"]}), "-width"),
            (json!({"args": [1]}), "array of strings"),
            (json!({"binary": "/bin/sh"}), "moz:firefoxOptions.binary"),
            (json!({"profile": "UEsDBA=="}), "moz:firefoxOptions.profile"),
            (
                json!({"env": {"LD_PRELOAD": "/x.so"}}),
                "moz:firefoxOptions.env",
            ),
            (
                json!({"debuggerAddress": "x"}),
                "moz:firefoxOptions.debuggerAddress",
            ),
            (
                json!({"prefs": {"network.proxy.type": 0}}),
                "network.proxy.type",
            ),
            (
                json!({"prefs": {"general.config.filename": "x.cfg"}}),
                "general.config.filename",
            ),
            (json!({"prefs": {"a.b": [1]}}), "a.b"),
            (json!("nope"), "must be an object"),
        ] {
            let refused = new_session(
                &json!({"capabilities": {"alwaysMatch": {
                    "browserName": "firefox", "moz:firefoxOptions": options,
                }}}),
                INSTALLED,
            )
            .err()
            .unwrap_or_else(|| panic!("{options} was taken"));
            assert_eq!(refused.code, "invalid argument", "{options}");
            assert!(
                refused.message.contains(named),
                "{options}: {}",
                refused.message
            );
        }
    }

    #[test]
    fn firefox_window_sizes_in_each_spelling() {
        for args in [
            json!(["-width", "800", "-height", "600"]),
            json!(["--width=800", "--height=600"]),
            json!(["--window-size=800,600"]),
        ] {
            let created = new_session(
                &json!({"capabilities": {"alwaysMatch": {
                    "browserName": "firefox", "moz:firefoxOptions": {"args": args},
                }}}),
                INSTALLED,
            )
            .unwrap();
            assert_eq!(created.window_size, Some((800, 600)), "{args}");
        }
    }
}
