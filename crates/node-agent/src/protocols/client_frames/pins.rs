//! The pins themselves: which commands of each protocol would reach outside
//! the instance, and how they are rewritten so that they cannot.
//!
//! - CDP: `Browser.setDownloadBehavior` and `Page.setDownloadBehavior`
//!   download into the instance's directory, whatever `downloadPath` says
//!   (`default` and `allowAndName` become `allow`); `Extensions.loadUnpacked`
//!   and `Extensions.uninstall` are refused (the instance's extensions are its
//!   configuration); `Target.sendMessageToTarget` carries a command as a
//!   string, which gets the same pins (nested up to [`MAX_NESTING`] deep).
//! - WebDriver BiDi: `browser.setDownloadBehavior` allowing downloads saves
//!   them in the instance's directory; `webExtension.install` and
//!   `webExtension.uninstall` are refused, and so are `session.new` with a
//!   `proxy` capability and `browser.createUserContext` with a `proxy`; raw CDP sent through BiDi
//!   (`goog:cdp.sendCommand`, `cdp.sendCommand`) gets the CDP pins.
//! - Playwright: raw CDP sent through a `CDPSession` (`send`) gets the CDP
//!   pins; Playwright's other calls are checked by its server
//!   (`playwright_server.cjs`).
//! - WebDriver classic's raw CDP commands (`goog/cdp/execute`: `{cmd,
//!   params}`) get the CDP pins ([`pin_carried_cdp_body`]).
//!
//! A refused command keeps its `id` and is renamed to a method that says
//! why, so the browser answers the client with an error of its own
//! (`'… is refused by Flotilla: …' wasn't found`).
//!
//! Nothing here builds a tree of a whole message: a message is read as its
//! top-level members, each kept as the raw text it was sent as, and only
//! the members a pin changes are read further (a pinned command's own
//! parameters, bounded by [`MAX_PINNED_PARAMS`]). A message a pin does not
//! change is sent on byte for byte; one it changes is written again from
//! what was read here, so the browser reads exactly what was checked.

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use super::Protocol;

/// How deep `Target.sendMessageToTarget` messages may nest.
pub const MAX_NESTING: usize = 4;

/// The largest parameters a pinned command may carry (a download or
/// extension command is a few hundred bytes): read whole to be rewritten.
pub const MAX_PINNED_PARAMS: usize = 64 << 10;

/// The most members an object read here may have (a command has four or
/// five).
const MAX_MEMBERS: usize = 64;

/// Why a message cannot be checked, so it is not sent on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PinError {
    #[error("the message is not JSON: {0}")]
    NotJson(String),
    #[error("the message names its member {0:?} twice")]
    Duplicate(String),
    #[error("an object of the message has over {MAX_MEMBERS} members")]
    TooManyMembers,
}

/// CDP methods the pins rewrite or refuse.
const CDP_PINNED: &[&str] = &[
    "Browser.setDownloadBehavior",
    "Page.setDownloadBehavior",
    "Extensions.loadUnpacked",
    "Extensions.uninstall",
    "Target.sendMessageToTarget",
];

/// BiDi methods the pins rewrite or refuse.
const BIDI_PINNED: &[&str] = &[
    "session.new",
    "browser.createUserContext",
    "browser.setDownloadBehavior",
    "webExtension.install",
    "webExtension.uninstall",
    "goog:cdp.sendCommand",
    "cdp.sendCommand",
];

const PROXY_IS_CONFIGURATION: &str = "the instance's traffic goes through its node's egress proxy; an upstream proxy is set when it is created (config.proxy)";

/// Whether BiDi parameters set a proxy: `browser.createUserContext`'s
/// `proxy`, or a `proxy` capability of `session.new` (in `alwaysMatch` or
/// any of `firstMatch`). Firefox applies either around its locked proxy
/// preferences.
fn names_a_proxy(params: &Map<String, Value>) -> bool {
    let capabilities = &params.get("capabilities");
    let always = capabilities.and_then(|c| c.get("alwaysMatch"));
    let first = capabilities
        .and_then(|c| c.get("firstMatch"))
        .and_then(Value::as_array);
    params.contains_key("proxy")
        || always.is_some_and(|a| a.get("proxy").is_some())
        || first.is_some_and(|list| list.iter().any(|c| c.get("proxy").is_some()))
}

const EXTENSIONS_ARE_CONFIGURATION: &str = "the instance's extensions are set when it is created (config.extensions, uploaded with POST /v2/extensions)";

/// Whether a message of `protocol` whose top-level method is `method` must
/// be read whole (the pins may rewrite it); every other message is sent on
/// as it arrives.
pub fn needs_whole(protocol: Protocol, method: &str) -> bool {
    match protocol {
        Protocol::Cdp => CDP_PINNED.contains(&method),
        Protocol::Bidi => BIDI_PINNED.contains(&method),
        Protocol::Playwright => method == "send",
    }
}

/// The message as the browser must get it: `None` when the pins leave it as
/// it is, else the rewritten text.
pub fn pin(
    protocol: Protocol,
    message: &[u8],
    downloads_dir: &str,
) -> Result<Option<Vec<u8>>, PinError> {
    let command = Members::read(message)?;
    let rewritten = match protocol {
        Protocol::Cdp => pin_cdp_command(&command, downloads_dir, 0)?,
        Protocol::Bidi => pin_bidi_command(&command, downloads_dir)?,
        Protocol::Playwright => match command.string("method")?.as_deref() {
            Some("send") => pin_carried(&command, ("method", "params"), downloads_dir)?,
            _ => None,
        },
    };
    Ok(rewritten.map(String::into_bytes))
}

/// A WebDriver classic raw CDP body (`{"cmd", "params"}`, Selenium's
/// `execute_cdp_cmd`) with the CDP pins applied: `None` when they leave it
/// as it is.
pub fn pin_carried_cdp_body(body: &[u8], downloads_dir: &str) -> Result<Option<String>, PinError> {
    let members = Members::read(body)?;
    pin_carried(&members, ("cmd", "params"), downloads_dir)
}

/// What the CDP pins change in one command: its new method name (a
/// refusal) or its new parameters (JSON text).
#[derive(Debug, Default)]
struct Change {
    method: Option<String>,
    params: Option<String>,
}

impl Change {
    fn refusal(method: &str, why: &str) -> Self {
        tracing::debug!(%method, "a client command was refused");
        Self {
            method: Some(format!("{method} is refused by Flotilla: {why}")),
            params: None,
        }
    }

    fn is_none(&self) -> bool {
        self.method.is_none() && self.params.is_none()
    }
}

fn pin_cdp_command(
    command: &Members,
    downloads_dir: &str,
    depth: usize,
) -> Result<Option<String>, PinError> {
    let Some(method) = command.string("method")? else {
        return Ok(None);
    };
    let change = cdp_change(&method, command.get("params"), downloads_dir, depth)?;
    Ok(command.with_change(("method", "params"), change))
}

/// The CDP pins on one command, `method` with `params`.
fn cdp_change(
    method: &str,
    params: Option<&RawValue>,
    downloads_dir: &str,
    depth: usize,
) -> Result<Change, PinError> {
    match method {
        "Browser.setDownloadBehavior" | "Page.setDownloadBehavior" => {
            let Some(mut params) = small_object(method, params)? else {
                return Ok(Change::refusal(method, "its params are too large"));
            };
            pin_downloads(&mut params, downloads_dir);
            Ok(Change {
                method: None,
                params: Some(Value::Object(params).to_string()),
            })
        }
        "Extensions.loadUnpacked" | "Extensions.uninstall" => {
            Ok(Change::refusal(method, EXTENSIONS_ARE_CONFIGURATION))
        }
        "Target.sendMessageToTarget" => pin_nested(method, params, downloads_dir, depth),
        _ => Ok(Change::default()),
    }
}

/// `params` of a pinned command as an object, when it is one of at most
/// [`MAX_PINNED_PARAMS`] bytes (`Some(empty)` when there are none).
fn small_object(
    method: &str,
    params: Option<&RawValue>,
) -> Result<Option<Map<String, Value>>, PinError> {
    let Some(params) = params else {
        return Ok(Some(Map::new()));
    };
    if params.get().len() > MAX_PINNED_PARAMS {
        tracing::debug!(%method, "a pinned command's params are too large");
        return Ok(None);
    }
    match serde_json::from_str::<Value>(params.get()) {
        Ok(Value::Object(map)) => Ok(Some(map)),
        Ok(_) => Ok(Some(Map::new())),
        Err(error) => Err(PinError::NotJson(error.to_string())),
    }
}

fn pin_downloads(params: &mut Map<String, Value>, downloads_dir: &str) {
    match params.get("behavior").and_then(Value::as_str) {
        Some("deny") => {}
        behavior => {
            if matches!(behavior, Some("default" | "allowAndName")) {
                params.insert("behavior".into(), Value::String("allow".into()));
            }
            params.insert(
                "downloadPath".into(),
                Value::String(downloads_dir.to_owned()),
            );
        }
    }
}

/// The command inside `Target.sendMessageToTarget`'s `message`.
fn pin_nested(
    method: &str,
    params: Option<&RawValue>,
    downloads_dir: &str,
    depth: usize,
) -> Result<Change, PinError> {
    let Some(params) = params
        .map(|raw| Members::read(raw.get().as_bytes()))
        .transpose()?
    else {
        return Ok(Change::default());
    };
    let Some(message) = params.string("message")? else {
        return Ok(Change::default());
    };
    let Ok(inner) = Members::read(message.as_bytes()) else {
        return Ok(Change::refusal(
            method,
            "its message is not a JSON object Flotilla can read",
        ));
    };
    let inner_method = inner.string("method")?;
    if !inner_method
        .as_deref()
        .is_some_and(|name| CDP_PINNED.contains(&name))
    {
        return Ok(Change::default());
    }
    if depth + 1 >= MAX_NESTING {
        return Ok(Change::refusal(method, "messages nest too deep"));
    }
    let Some(rewritten) = pin_cdp_command(&inner, downloads_dir, depth + 1)? else {
        return Ok(Change::default());
    };
    let message = Value::String(rewritten).to_string();
    Ok(Change {
        method: None,
        params: params.render(&[("message", &message)]).into(),
    })
}

fn pin_bidi_command(command: &Members, downloads_dir: &str) -> Result<Option<String>, PinError> {
    let Some(method) = command.string("method")? else {
        return Ok(None);
    };
    match method.as_ref() {
        "browser.setDownloadBehavior" => {
            let Some(params) = command
                .get("params")
                .map(|raw| Members::read(raw.get().as_bytes()))
                .transpose()?
            else {
                return Ok(None);
            };
            let behavior = params.get("downloadBehavior");
            let Some(mut behavior) = small_object(&method, behavior)? else {
                let change = Change::refusal(&method, "its params are too large");
                return Ok(command.with_change(("method", "params"), change));
            };
            if behavior.get("type").and_then(Value::as_str) == Some("denied") {
                return Ok(None);
            }
            behavior.insert("type".into(), Value::String("allowed".into()));
            behavior.insert(
                "destinationFolder".into(),
                Value::String(downloads_dir.to_owned()),
            );
            let behavior = Value::Object(behavior).to_string();
            let params = params.render(&[("downloadBehavior", &behavior)]);
            Ok(Some(command.render(&[("params", &params)])))
        }
        "webExtension.install" | "webExtension.uninstall" => Ok(command.with_change(
            ("method", "params"),
            Change::refusal(&method, EXTENSIONS_ARE_CONFIGURATION),
        )),
        "session.new" | "browser.createUserContext" => {
            let names_a_proxy = match small_object(&method, command.get("params"))? {
                Some(params) => names_a_proxy(&params),
                None => true,
            };
            let change = match names_a_proxy {
                true => Change::refusal(&method, PROXY_IS_CONFIGURATION),
                false => Change::default(),
            };
            Ok(command.with_change(("method", "params"), change))
        }
        "goog:cdp.sendCommand" | "cdp.sendCommand" => {
            pin_carried(command, ("method", "params"), downloads_dir)
        }
        _ => Ok(None),
    }
}

/// The CDP pins on a CDP command carried in another protocol's message:
/// in `holder`'s `params` (BiDi, Playwright; `fields` names the CDP
/// command's method and params there), or in `holder` itself (WebDriver
/// classic's `{cmd, params}`, whose fields are not `method`).
fn pin_carried(
    holder: &Members,
    fields: (&str, &str),
    downloads_dir: &str,
) -> Result<Option<String>, PinError> {
    if fields.0 != "method" {
        let Some(method) = holder.string(fields.0)? else {
            return Ok(None);
        };
        let change = cdp_change(&method, holder.get(fields.1), downloads_dir, 0)?;
        return Ok(holder.with_change(fields, change));
    }
    let Some(params) = holder
        .get("params")
        .map(|raw| Members::read(raw.get().as_bytes()))
        .transpose()?
    else {
        return Ok(None);
    };
    let Some(method) = params.string(fields.0)? else {
        return Ok(None);
    };
    let change = cdp_change(&method, params.get(fields.1), downloads_dir, 0)?;
    let Some(params) = params.with_change(fields, change) else {
        return Ok(None);
    };
    Ok(Some(holder.render(&[("params", &params)])))
}

/// A JSON object read as its members: names decoded, values kept as the
/// raw text they were sent as. A name twice is refused (parsers differ on
/// which one counts).
struct Members<'a> {
    fields: Vec<(Cow<'a, str>, &'a RawValue)>,
}

impl<'a> Members<'a> {
    fn read(text: &'a [u8]) -> Result<Self, PinError> {
        let read = serde_json::from_slice::<MembersOrNot>(text)
            .map_err(|error| PinError::NotJson(error.to_string()))?;
        let MembersOrNot::Object { fields, too_many } = read else {
            return Ok(Self { fields: Vec::new() });
        };
        if too_many {
            return Err(PinError::TooManyMembers);
        }
        for (i, (name, _)) in fields.iter().enumerate() {
            if fields[..i].iter().any(|(seen, _)| seen == name) {
                return Err(PinError::Duplicate(name.to_string()));
            }
        }
        Ok(Self { fields })
    }

    fn get(&self, name: &str) -> Option<&'a RawValue> {
        self.fields
            .iter()
            .find(|(field, _)| field == name)
            .map(|(_, value)| *value)
    }

    /// Member `name` when it is a string, decoded.
    fn string(&self, name: &str) -> Result<Option<Cow<'a, str>>, PinError> {
        let Some(raw) = self.get(name) else {
            return Ok(None);
        };
        if !raw.get().starts_with('"') {
            return Ok(None);
        }
        serde_json::from_str::<Borrowed<'a>>(raw.get())
            .map(|text| Some(text.0))
            .map_err(|error| PinError::NotJson(error.to_string()))
    }

    /// The object written again, with each `(name, JSON text)` of `changes`
    /// in place of that member's value.
    fn render(&self, changes: &[(&str, &str)]) -> String {
        let mut out = String::from("{");
        for (i, (name, value)) in self.fields.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push_str(&Value::String(name.to_string()).to_string());
            out.push(':');
            let changed = changes.iter().find(|(changed, _)| changed == name);
            out.push_str(changed.map_or(value.get(), |(_, text)| text));
        }
        out.push('}');
        out
    }

    /// The object with `change` applied to its `(method, params)` fields;
    /// `None` when the change is none.
    fn with_change(
        &self,
        (method_field, params_field): (&str, &str),
        change: Change,
    ) -> Option<String> {
        if change.is_none() {
            return None;
        }
        let method = change.method.map(|name| Value::String(name).to_string());
        let mut changes = Vec::new();
        if let Some(method) = &method {
            changes.push((method_field, method.as_str()));
        }
        if let Some(params) = &change.params {
            changes.push((params_field, params.as_str()));
        }
        Some(self.render(&changes))
    }
}

/// A string value, borrowed from the message when it has no escapes.
struct Borrowed<'a>(Cow<'a, str>);

impl<'de> serde::Deserialize<'de> for Borrowed<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Text;
        impl<'de> Visitor<'de> for Text {
            type Value = Borrowed<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: de::Error>(self, text: &'de str) -> Result<Self::Value, E> {
                Ok(Borrowed(Cow::Borrowed(text)))
            }
            fn visit_str<E: de::Error>(self, text: &str) -> Result<Self::Value, E> {
                Ok(Borrowed(Cow::Owned(text.to_owned())))
            }
        }
        deserializer.deserialize_str(Text)
    }
}

/// A message that is an object (read as members), or any other JSON value
/// (skipped without building it: no pin applies to it).
enum MembersOrNot<'a> {
    /// Its first [`MAX_MEMBERS`] members; `too_many` when it has more
    /// (the rest are skipped, never kept).
    Object {
        fields: Vec<(Cow<'a, str>, &'a RawValue)>,
        too_many: bool,
    },
    Not,
}

impl<'de> serde::Deserialize<'de> for MembersOrNot<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Object;
        impl<'de> Visitor<'de> for Object {
            type Value = MembersOrNot<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a JSON value")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut fields: Vec<(Cow<'de, str>, &'de RawValue)> = Vec::new();
                let mut too_many = false;
                while let Some(Borrowed(name)) = map.next_key::<Borrowed<'de>>()? {
                    if fields.len() == MAX_MEMBERS {
                        too_many = true;
                        map.next_value::<de::IgnoredAny>()?;
                        continue;
                    }
                    let value = map.next_value::<&'de RawValue>()?;
                    fields.push((name, value));
                }
                Ok(MembersOrNot::Object { fields, too_many })
            }
            fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                while seq.next_element::<de::IgnoredAny>()?.is_some() {}
                Ok(MembersOrNot::Not)
            }
            fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
                Ok(MembersOrNot::Not)
            }
            fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
                Ok(MembersOrNot::Not)
            }
            fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
                Ok(MembersOrNot::Not)
            }
            fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
                Ok(MembersOrNot::Not)
            }
            fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
                Ok(MembersOrNot::Not)
            }
            fn visit_unit<E>(self) -> Result<Self::Value, E> {
                Ok(MembersOrNot::Not)
            }
        }
        deserializer.deserialize_any(Object)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOWNLOADS: &str = "/data/i1/downloads";

    fn pinned(protocol: Protocol, message: Value) -> Value {
        let text = message.to_string();
        match pin(protocol, text.as_bytes(), DOWNLOADS).unwrap() {
            Some(rewritten) => serde_json::from_slice(&rewritten).unwrap(),
            None => message,
        }
    }

    fn refused(value: &Value) -> bool {
        value
            .as_str()
            .is_some_and(|method| method.contains("is refused by Flotilla"))
    }

    #[test]
    fn messages_no_pin_concerns_are_left_as_sent() {
        for (protocol, text) in [
            (
                Protocol::Cdp,
                r#"{"id":1,"method":"Runtime.evaluate","params":{"expression":"'DownloadBehavior'"}}"#,
            ),
            (
                Protocol::Cdp,
                r#"{"id":1,"method":"Browser.setDownloadBehavior","params":{"behavior":"deny"}}"#,
            ),
            (
                Protocol::Bidi,
                r#"{"id":4,"method":"browser.setDownloadBehavior","params":{"downloadBehavior":{"type":"denied"}}}"#,
            ),
            (
                Protocol::Playwright,
                r#"{"id":2,"guid":"page@1","method":"goto","params":{"url":"x"}}"#,
            ),
            (Protocol::Cdp, r#"[1,2]"#),
        ] {
            let out = pin(protocol, text.as_bytes(), DOWNLOADS).unwrap();
            // A deny is re-written only where it was read whole (CDP's
            // download commands always are): the same meaning either way.
            if let Some(out) = out {
                let (a, b): (Value, Value) = (
                    serde_json::from_slice(&out).unwrap(),
                    serde_json::from_str(text).unwrap(),
                );
                assert_eq!(a, b);
            }
        }
    }

    #[test]
    fn raw_cdp_through_webdriver_classic_gets_the_pins() {
        let body = br#"{"cmd":"Browser.setDownloadBehavior","params":{"behavior":"allow","downloadPath":"/tmp/pwn"}}"#;
        let out: Value =
            serde_json::from_str(&pin_carried_cdp_body(body, DOWNLOADS).unwrap().unwrap()).unwrap();
        assert_eq!(out["params"]["downloadPath"], DOWNLOADS);
        assert_eq!(out["cmd"], "Browser.setDownloadBehavior");
        let body = br#"{"cmd":"Extensions.loadUnpacked","params":{"path":"/x"}}"#;
        let out: Value =
            serde_json::from_str(&pin_carried_cdp_body(body, DOWNLOADS).unwrap().unwrap()).unwrap();
        assert!(refused(&out["cmd"]), "{out}");
        assert_eq!(
            pin_carried_cdp_body(br#"{"cmd":"Page.navigate","params":{}}"#, DOWNLOADS),
            Ok(None)
        );
        assert_eq!(
            pin_carried_cdp_body(
                br#"{"cmd":"Page.navigate","cmd":"Extensions.uninstall"}"#,
                DOWNLOADS
            ),
            Err(PinError::Duplicate("cmd".into()))
        );
    }

    #[test]
    fn pinned_params_are_bounded() {
        let pad = "x".repeat(MAX_PINNED_PARAMS);
        let out = pinned(
            Protocol::Cdp,
            serde_json::json!({"id": 1, "method": "Browser.setDownloadBehavior",
                "params": {"behavior": "allow", "downloadPath": "/x", "pad": pad}}),
        );
        assert!(refused(&out["method"]), "{}", out["method"]);
    }

    /// A proxy hidden from a reader that matches text (an escaped name,
    /// past the bound, in a later `firstMatch`) is still refused; params
    /// that are not JSON never reach the browser.
    #[test]
    fn hidden_bidi_proxies_are_refused() {
        let escaped = r#"{"id": 1, "method": "session.new", "params": {"capabilities": {"alwaysMatch": {"pro\u0078y": {"proxyType": "direct"}}}}}"#;
        let out: Value = serde_json::from_slice(
            &pin(Protocol::Bidi, escaped.as_bytes(), DOWNLOADS)
                .unwrap()
                .expect("rewritten"),
        )
        .unwrap();
        assert!(refused(&out["method"]), "{out}");
        let pad = "x".repeat(MAX_PINNED_PARAMS);
        let oversize = pinned(
            Protocol::Bidi,
            serde_json::json!({"id": 2, "method": "browser.createUserContext", "params": {"pad": pad}}),
        );
        assert!(refused(&oversize["method"]), "{}", oversize["method"]);
        let broken = br#"{"id": 3, "method": "session.new", "params": {"capabilities": {"alwaysMatch": {"proxy": }}}}"#;
        assert!(pin(Protocol::Bidi, broken, DOWNLOADS).is_err());
    }

    #[test]
    fn objects_with_endless_members_are_refused() {
        let mut text = String::from(r#"{"method":"Page.setDownloadBehavior""#);
        for i in 0..MAX_MEMBERS {
            text.push_str(&format!(r#","k{i}":0"#));
        }
        text.push('}');
        assert_eq!(
            pin(Protocol::Cdp, text.as_bytes(), DOWNLOADS),
            Err(PinError::TooManyMembers)
        );
    }

    #[test]
    fn playwright_cdp_sessions_get_the_cdp_pins() {
        let out = pinned(
            Protocol::Playwright,
            serde_json::json!({"id": 3, "guid": "cdp-session@1", "method": "send",
                "params": {"method": "Browser.setDownloadBehavior", "params": {"behavior": "allow", "downloadPath": "/"}}}),
        );
        assert_eq!(out["params"]["params"]["downloadPath"], DOWNLOADS);
        assert_eq!(out["guid"], "cdp-session@1");
        let out = pinned(
            Protocol::Playwright,
            serde_json::json!({"id": 4, "guid": "cdp-session@1", "method": "send",
                "params": {"method": "Extensions.loadUnpacked", "params": {"path": "/"}}}),
        );
        assert!(refused(&out["params"]["method"]), "{out}");
    }
}
