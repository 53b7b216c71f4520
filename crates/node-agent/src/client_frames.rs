//! The client → browser direction of a CDP, WebDriver BiDi or Playwright
//! WebSocket, read frame by frame, so that the gateway (CDP), the WebDriver
//! relay (BiDi, to chromedriver) and the Playwright relay (to its server,
//! [`crate::playwright`]) can pin commands that would reach outside the instance
//! (see [`pin_command`] and [`pin_bidi_command`]): downloads always land in
//! the instance's own directory, extensions cannot be loaded or removed, and
//! the same holds for commands nested in `Target.sendMessageToTarget`
//! (flattened sessions carry `method` at the top level and are read like any
//! other) and for raw CDP sent through BiDi (`goog:cdp.sendCommand`).
//!
//! Every data message (text or binary, fragmented or not) is collected whole,
//! up to [`MAX_MESSAGE`], and sent on as one frame masked with a zero key (the
//! same bytes Chromium would unmask). A message is parsed as JSON only when it
//! could name a pinned command: it contains `DownloadBehavior`,
//! `Extensions.`, `webExtension`, or a `\u` escape (which could spell any). Control frames
//! pass through as they are, in order. The browser → client direction is
//! never touched (the gateway copies bytes).

use std::io;

use serde_json::Value;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Largest message a client may send (Chromium's own DevTools limit is lower).
pub const MAX_MESSAGE: usize = 256 << 20;

const OPCODE_CONTINUATION: u8 = 0x0;
const OPCODE_CLOSE: u8 = 0x8;

/// The protocol a relayed socket speaks, and so which commands are pinned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// The DevTools protocol, to the browser.
    Cdp,
    /// WebDriver BiDi, to chromedriver (which speaks CDP to the browser).
    Bidi,
    /// Playwright's protocol, to a Playwright server beside the browser
    /// ([`crate::playwright`]): raw CDP a client sends through a
    /// `CDPSession` gets the CDP pins.
    Playwright,
}

/// What a relay pins: its protocol and the instance's downloads directory
/// as the browser sees it.
#[derive(Debug, Clone)]
pub struct Pins {
    pub protocol: Protocol,
    pub downloads_dir: String,
}

/// Copies frames from `client` to `browser` until `client` ends, rewriting
/// download commands so that files land in the downloads directory and
/// refusing extension commands (see [`Pins`]).
pub async fn relay<R, W>(mut client: R, mut browser: W, pins: &Pins) -> io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    // The message being collected: its opcode and unmasked payload.
    let mut message: Option<(u8, Vec<u8>)> = None;
    loop {
        let Some(frame) = read_frame_head(&mut client).await? else {
            browser.shutdown().await.ok();
            return Ok(());
        };
        if frame.opcode >= OPCODE_CLOSE {
            // Control frames: at most 125 bytes, never fragmented; pass through.
            let mut payload = vec![0u8; frame.length as usize];
            client.read_exact(&mut payload).await?;
            browser.write_all(&frame.raw_head).await?;
            browser.write_all(&payload).await?;
            if frame.opcode == OPCODE_CLOSE {
                browser.flush().await?;
            }
            continue;
        }
        let collected = message.as_ref().map_or(0, |(_, data)| data.len());
        let total = collected as u64 + frame.length;
        if total > MAX_MESSAGE as u64 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("a client message over {MAX_MESSAGE} bytes"),
            ));
        }
        let (opcode, data) = match (message.take(), frame.opcode) {
            (None, OPCODE_CONTINUATION) => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "a continuation frame without a message",
                ));
            }
            (None, opcode) => (opcode, Vec::with_capacity(frame.length as usize)),
            (Some(pending), OPCODE_CONTINUATION) => pending,
            (Some(_), _) => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "a new message inside a fragmented one",
                ));
            }
        };
        let mut data = data;
        let start = data.len();
        // Grows with what arrives, not with what a frame head announces.
        let read = (&mut client)
            .take(frame.length)
            .read_to_end(&mut data)
            .await?;
        if (read as u64) < frame.length {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the client closed inside a frame",
            ));
        }
        if let Some(mask) = frame.mask {
            for (i, byte) in data[start..].iter_mut().enumerate() {
                *byte ^= mask[i % 4];
            }
        }
        if !frame.fin {
            message = Some((opcode, data));
            continue;
        }
        let data = pin_message(data, pins)?;
        browser.write_all(&frame_head(opcode, data.len())).await?;
        browser.write_all(&data).await?;
        browser.flush().await?;
    }
}

struct FrameHead {
    fin: bool,
    opcode: u8,
    mask: Option<[u8; 4]>,
    length: u64,
    /// The head as received (for control frames passed through).
    raw_head: Vec<u8>,
}

/// Reads one frame head; `None` at a clean end of stream between frames.
async fn read_frame_head<R: AsyncRead + Unpin>(client: &mut R) -> io::Result<Option<FrameHead>> {
    let mut first = [0u8; 2];
    match client.read_exact(&mut first).await {
        Ok(_) => {}
        Err(error) if error.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(error) => return Err(error),
    }
    let mut raw_head = first.to_vec();
    let fin = first[0] & 0x80 != 0;
    let opcode = first[0] & 0x0f;
    let masked = first[1] & 0x80 != 0;
    let length = match first[1] & 0x7f {
        126 => {
            let mut extended = [0u8; 2];
            client.read_exact(&mut extended).await?;
            raw_head.extend_from_slice(&extended);
            u64::from(u16::from_be_bytes(extended))
        }
        127 => {
            let mut extended = [0u8; 8];
            client.read_exact(&mut extended).await?;
            raw_head.extend_from_slice(&extended);
            u64::from_be_bytes(extended)
        }
        short => u64::from(short),
    };
    if opcode >= OPCODE_CLOSE && (length > 125 || !fin) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "a control frame that is long or fragmented",
        ));
    }
    let mask = if masked {
        let mut key = [0u8; 4];
        client.read_exact(&mut key).await?;
        raw_head.extend_from_slice(&key);
        Some(key)
    } else {
        None
    };
    Ok(Some(FrameHead {
        fin,
        opcode,
        mask,
        length,
        raw_head,
    }))
}

/// The head of one final, masked frame (zero key: the payload is sent as is).
fn frame_head(opcode: u8, length: usize) -> Vec<u8> {
    let mut head = vec![0x80 | opcode];
    match length {
        0..=125 => head.push(0x80 | length as u8),
        126..=0xffff => {
            head.push(0x80 | 126);
            head.extend_from_slice(&(length as u16).to_be_bytes());
        }
        _ => {
            head.push(0x80 | 127);
            head.extend_from_slice(&(length as u64).to_be_bytes());
        }
    }
    head.extend_from_slice(&[0, 0, 0, 0]);
    head
}

/// Bytes that a CDP message must contain (literally, or spelt with a `\u`
/// or `\x` escape) to name a command the relay pins; any other message
/// passes as is.
const MARKERS: &[&[u8]] = &[
    b"DownloadBehavior",
    b"Extensions.",
    b"webExtension",
    b"\\u",
    // Not JSON, but some parsers take it: such a message is refused.
    b"\\x",
];

/// How deep `Target.sendMessageToTarget` messages may nest.
const MAX_NESTING: usize = 4;

/// The message as the browser gets it: pinned commands rewritten (see
/// [`pin_command`]) at the top level and inside every nested
/// `Target.sendMessageToTarget`. A message that could name a pinned command
/// is sent on as parsed here (re-serialised: a duplicate `method` key cannot
/// mean one thing here and another in Chromium); one that cannot be parsed
/// is refused.
fn pin_message(data: Vec<u8>, pins: &Pins) -> io::Result<Vec<u8>> {
    // A BiDi message is always read here: chromedriver's parser takes more
    // than JSON (`\xNN` escapes), so no byte marker can be trusted; BiDi
    // traffic is commands, never bulk.
    if pins.protocol != Protocol::Bidi && !could_name_a_pin(&data) {
        return Ok(data);
    }
    let mut command = serde_json::from_slice::<Value>(&data).map_err(|error| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("a client message that is not JSON: {error}"),
        )
    })?;
    match pins.protocol {
        Protocol::Cdp => pin_command(&mut command, &pins.downloads_dir, 0),
        Protocol::Bidi => pin_bidi_command(&mut command, &pins.downloads_dir),
        Protocol::Playwright => pin_playwright_command(&mut command, &pins.downloads_dir),
    }
    serde_json::to_vec(&command).map_err(io::Error::other)
}

fn could_name_a_pin(data: &[u8]) -> bool {
    MARKERS
        .iter()
        .any(|marker| memchr::memmem::find(data, marker).is_some())
}

/// Applies the pins to one command (a JSON object with a `method`):
/// - `Browser.setDownloadBehavior` and `Page.setDownloadBehavior` download
///   into the instance's directory, whatever `downloadPath` says (`default`
///   and `allowAndName` become `allow`);
/// - `Extensions.loadUnpacked` and `Extensions.uninstall` are refused: the
///   instance's extensions are its configuration (`config.extensions`);
/// - `Target.sendMessageToTarget` carries a command as a string: the same
///   pins apply to it, and one that cannot be read is refused.
///
/// A refused command keeps its `id` and is renamed to a method that says
/// why, so the browser answers the client with an error of its own
/// (`'… is refused by Flotilla: …' wasn't found`).
pub fn pin_command(command: &mut Value, downloads_dir: &str, depth: usize) {
    let method = command.get("method").and_then(Value::as_str).unwrap_or("");
    match method {
        "Browser.setDownloadBehavior" | "Page.setDownloadBehavior" => {
            if let Some(params) = command.get_mut("params").and_then(Value::as_object_mut) {
                pin_downloads(params, downloads_dir);
            }
        }
        "Extensions.loadUnpacked" | "Extensions.uninstall" => refuse(
            command,
            "the instance's extensions are set when it is created (config.extensions, uploaded with POST /v2/extensions)",
        ),
        "Target.sendMessageToTarget" => pin_nested(command, downloads_dir, depth),
        _ => {}
    }
}

fn pin_downloads(params: &mut serde_json::Map<String, Value>, downloads_dir: &str) {
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
fn pin_nested(command: &mut Value, downloads_dir: &str, depth: usize) {
    let Some(message) = command
        .get("params")
        .and_then(|params| params.get("message"))
        .and_then(Value::as_str)
    else {
        return;
    };
    if !could_name_a_pin(message.as_bytes()) {
        return;
    }
    if depth >= MAX_NESTING {
        return refuse(command, "messages nest too deep");
    }
    let Ok(mut inner) = serde_json::from_str::<Value>(message) else {
        return refuse(
            command,
            "its message names a command Flotilla must read, and is not JSON",
        );
    };
    pin_command(&mut inner, downloads_dir, depth + 1);
    command["params"]["message"] = Value::String(inner.to_string());
}

/// Applies the pins to one WebDriver BiDi command:
/// - `browser.setDownloadBehavior` allowing downloads saves them in the
///   instance's directory, whatever `destinationFolder` says;
/// - `webExtension.install` and `webExtension.uninstall` are refused (as
///   `Extensions.*` over CDP);
/// - raw CDP sent through BiDi (`goog:cdp.sendCommand`, `cdp.sendCommand`)
///   gets the CDP pins ([`pin_command`]).
///
/// A refused command is renamed, so chromedriver answers `unknown command`
/// with a message that says why.
pub fn pin_bidi_command(command: &mut Value, downloads_dir: &str) {
    let method = command.get("method").and_then(Value::as_str).unwrap_or("");
    match method {
        "browser.setDownloadBehavior" => {
            if let Some(behavior) = command
                .get_mut("params")
                .and_then(|params| params.get_mut("downloadBehavior"))
                .and_then(Value::as_object_mut)
                && behavior.get("type").and_then(Value::as_str) != Some("denied")
            {
                behavior.insert("type".into(), Value::String("allowed".into()));
                behavior.insert(
                    "destinationFolder".into(),
                    Value::String(downloads_dir.to_owned()),
                );
            }
        }
        "webExtension.install" | "webExtension.uninstall" => refuse(
            command,
            "the instance's extensions are set when it is created (config.extensions, uploaded with POST /v2/extensions)",
        ),
        "goog:cdp.sendCommand" | "cdp.sendCommand" => pin_carried_cdp(command, downloads_dir),
        _ => {}
    }
}

/// Applies the pins to one Playwright message: raw CDP sent through a
/// `CDPSession` (`{"method": "send", "params": {"method", "params"}}`)
/// gets the CDP pins ([`pin_command`]). Playwright's other messages are
/// its own API, which the server carries out on the instance's browser.
pub fn pin_playwright_command(command: &mut Value, downloads_dir: &str) {
    if command.get("method").and_then(Value::as_str) == Some("send")
        && command["params"]["method"].is_string()
    {
        pin_carried_cdp(command, downloads_dir);
    }
}

/// The CDP pins on a CDP command carried in `params` (`method` and
/// `params`) of another protocol's message.
fn pin_carried_cdp(command: &mut Value, downloads_dir: &str) {
    let Some(params) = command.get_mut("params").and_then(Value::as_object_mut) else {
        return;
    };
    let mut inner = serde_json::json!({
        "method": params.get("method").cloned().unwrap_or(Value::Null),
        "params": params.get("params").cloned().unwrap_or(Value::Null),
    });
    pin_command(&mut inner, downloads_dir, 0);
    params.insert("method".into(), inner["method"].take());
    if !inner["params"].is_null() {
        params.insert("params".into(), inner["params"].take());
    }
}

/// Renames `command` so that the browser refuses it, saying `why`.
fn refuse(command: &mut Value, why: &str) {
    let method = command
        .get("method")
        .and_then(Value::as_str)
        .unwrap_or("this command")
        .to_owned();
    tracing::debug!(%method, "a client command was refused");
    command["method"] = Value::String(format!("{method} is refused by Flotilla: {why}"));
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A masked client frame.
    fn frame(fin: bool, opcode: u8, payload: &[u8], key: [u8; 4]) -> Vec<u8> {
        let mut out = vec![if fin { 0x80 } else { 0 } | opcode];
        match payload.len() {
            n @ 0..=125 => out.push(0x80 | n as u8),
            n @ 126..=0xffff => {
                out.push(0x80 | 126);
                out.extend_from_slice(&(n as u16).to_be_bytes());
            }
            n => {
                out.push(0x80 | 127);
                out.extend_from_slice(&(n as u64).to_be_bytes());
            }
        }
        out.extend_from_slice(&key);
        out.extend(payload.iter().enumerate().map(|(i, b)| b ^ key[i % 4]));
        out
    }

    /// The messages the browser receives (frames unmasked, fragments joined).
    fn messages(mut bytes: &[u8]) -> Vec<(u8, Vec<u8>)> {
        let mut out = Vec::new();
        while !bytes.is_empty() {
            let opcode = bytes[0] & 0x0f;
            let (length, mut at) = match bytes[1] & 0x7f {
                126 => (u16::from_be_bytes([bytes[2], bytes[3]]) as usize, 4),
                127 => (
                    u64::from_be_bytes(bytes[2..10].try_into().unwrap()) as usize,
                    10,
                ),
                n => (n as usize, 2),
            };
            let key: [u8; 4] = bytes[at..at + 4].try_into().unwrap();
            at += 4;
            let payload = bytes[at..at + length]
                .iter()
                .enumerate()
                .map(|(i, b)| b ^ key[i % 4])
                .collect();
            out.push((opcode, payload));
            bytes = &bytes[at + length..];
        }
        out
    }

    async fn through(input: Vec<u8>) -> io::Result<Vec<(u8, Vec<u8>)>> {
        through_as(Protocol::Cdp, input).await
    }

    async fn through_as(protocol: Protocol, input: Vec<u8>) -> io::Result<Vec<(u8, Vec<u8>)>> {
        let mut output = Vec::new();
        let pins = Pins {
            protocol,
            downloads_dir: "/data/i1/downloads".into(),
        };
        relay(&input[..], &mut output, &pins).await?;
        Ok(messages(&output))
    }

    async fn bidi(command: Value) -> Value {
        let input = frame(true, 1, command.to_string().as_bytes(), [7, 1, 2, 3]);
        let out = through_as(Protocol::Bidi, input).await.unwrap();
        serde_json::from_slice(&out[0].1).unwrap()
    }

    #[tokio::test]
    async fn bidi_downloads_are_pinned_and_extensions_refused() {
        let allowed = bidi(serde_json::json!({"id": 1, "method": "browser.setDownloadBehavior",
            "params": {"downloadBehavior": {"type": "allowed", "destinationFolder": "/instance/home"}}}))
        .await;
        assert_eq!(
            allowed["params"]["downloadBehavior"]["destinationFolder"],
            "/data/i1/downloads"
        );
        let denied = bidi(
            serde_json::json!({"id": 2, "method": "browser.setDownloadBehavior",
            "params": {"downloadBehavior": {"type": "denied"}}}),
        )
        .await;
        assert_eq!(
            denied["params"]["downloadBehavior"],
            serde_json::json!({"type": "denied"})
        );
        let escaped = r#"{"id": 3, "method": "webExtension.\u0069nstall", "params": {"extensionData": {"type": "path", "path": "/tmp/x"}}}"#;
        let input = frame(true, 1, escaped.as_bytes(), [9, 9, 9, 9]);
        let out = through_as(Protocol::Bidi, input).await.unwrap();
        let refused: Value = serde_json::from_slice(&out[0].1).unwrap();
        assert!(
            refused["method"]
                .as_str()
                .unwrap()
                .contains("refused by Flotilla"),
            "{refused}"
        );
        assert_eq!(refused["id"], 3);
    }

    #[tokio::test]
    async fn escapes_that_are_not_json_are_refused() {
        for (protocol, message) in [
            (
                Protocol::Bidi,
                &br#"{"id":1,"method":"browser.setDownloa\x64Behavior","params":{}}"#[..],
            ),
            (
                Protocol::Bidi,
                br#"{"id":2,"method":"webE\x78tension.install","params":{}}"#,
            ),
            (
                Protocol::Cdp,
                br#"{"id":3,"method":"Browser.setDownloa\x64Behavior","params":{}}"#,
            ),
        ] {
            let input = frame(true, 1, message, [3, 1, 4, 1]);
            let error = through_as(protocol, input).await.unwrap_err();
            assert_eq!(error.kind(), io::ErrorKind::InvalidData, "{protocol:?}");
        }
        // Plain BiDi messages are read and pass, re-serialised.
        let out = through_as(
            Protocol::Bidi,
            frame(
                true,
                1,
                br#"{"id": 4, "method": "session.status", "params": {}}"#,
                [1, 1, 1, 1],
            ),
        )
        .await
        .unwrap();
        let value: Value = serde_json::from_slice(&out[0].1).unwrap();
        assert_eq!(value["method"], "session.status");
    }

    #[tokio::test]
    async fn raw_cdp_through_bidi_gets_the_cdp_pins() {
        let pinned = bidi(
            serde_json::json!({"id": 4, "method": "goog:cdp.sendCommand",
            "params": {"method": "Browser.setDownloadBehavior",
                "params": {"behavior": "allow", "downloadPath": "/instance/home"}}}),
        )
        .await;
        assert_eq!(pinned["params"]["method"], "Browser.setDownloadBehavior");
        assert_eq!(
            pinned["params"]["params"]["downloadPath"],
            "/data/i1/downloads"
        );
        let refused = bidi(serde_json::json!({"id": 5, "method": "cdp.sendCommand",
            "params": {"method": "Extensions.loadUnpacked", "params": {"path": "/instance/home/x"}, "session": "s"}}))
        .await;
        assert!(
            refused["params"]["method"]
                .as_str()
                .unwrap()
                .contains("refused by Flotilla"),
            "{refused}"
        );
        assert_eq!(refused["params"]["session"], "s");
        // In the CDP relay the same BiDi method is nobody's business.
        let input = frame(
            true,
            1,
            br#"{"id":6,"method":"webExtension.install"}"#,
            [1, 2, 3, 4],
        );
        let out = through(input).await.unwrap();
        assert_eq!(out[0].1, br#"{"id":6,"method":"webExtension.install"}"#);
    }

    fn download_path(message: &[u8]) -> Value {
        let value: Value = serde_json::from_slice(message).unwrap();
        value["params"]["downloadPath"].clone()
    }

    #[tokio::test]
    async fn download_paths_are_pinned_to_the_instance() {
        let command = br#"{"id":1,"method":"Browser.setDownloadBehavior","params":{"behavior":"allow","downloadPath":"/root/evil"}}"#;
        let out = through(frame(true, 1, command, [1, 2, 3, 4]))
            .await
            .unwrap();
        assert_eq!(download_path(&out[0].1), "/data/i1/downloads");

        // Spelt with escapes, fragmented, with a ping in between.
        let escaped = br#"{"id":2,"method":"Page.setDownload\u0042ehavior","params":{"behavior":"allowAndName","downloadPath":"/tmp/x"}}"#;
        let mut input = frame(false, 1, &escaped[..20], [9, 8, 7, 6]);
        input.extend(frame(true, 9, b"ping", [1, 1, 1, 1]));
        input.extend(frame(false, 0, &escaped[20..50], [5, 5, 5, 5]));
        input.extend(frame(true, 0, &escaped[50..], [0, 0, 0, 0]));
        let out = through(input).await.unwrap();
        assert_eq!(
            out[0],
            (9, b"ping".to_vec()),
            "control frames pass in order"
        );
        assert_eq!(download_path(&out[1].1), "/data/i1/downloads");

        // `default` would use the browser's default folder: made explicit.
        let default =
            br#"{"id":3,"method":"Browser.setDownloadBehavior","params":{"behavior":"default"}}"#;
        let out = through(frame(true, 1, default, [4, 3, 2, 1]))
            .await
            .unwrap();
        let value: Value = serde_json::from_slice(&out[0].1).unwrap();
        assert_eq!(value["params"]["behavior"], "allow");
        assert_eq!(value["params"]["downloadPath"], "/data/i1/downloads");
    }

    #[tokio::test]
    async fn other_messages_arrive_unchanged() {
        let plain =
            br#"{"id":1,"method":"Runtime.evaluate","params":{"expression":"'DownloadBehavior'"}}"#;
        let big = vec![b'x'; 70_000];
        let deny =
            br#"{"id":2,"method":"Browser.setDownloadBehavior","params":{"behavior":"deny"}}"#;
        let mut input = frame(true, 1, plain, [1, 2, 3, 4]);
        input.extend(frame(true, 2, &big, [7, 7, 7, 7]));
        input.extend(frame(true, 1, deny, [1, 2, 3, 4]));
        input.extend(frame(true, 8, &[3, 232], [1, 2, 3, 4]));
        let out = through(input).await.unwrap();
        let json = |bytes: &[u8]| serde_json::from_slice::<Value>(bytes).unwrap();
        assert_eq!(json(&out[0].1), json(plain));
        assert_eq!(out[1], (2, big));
        assert_eq!(json(&out[2].1), json(deny));
        assert_eq!(out[3], (8, vec![3, 232]));
    }

    #[tokio::test]
    async fn ambiguous_commands_reach_the_browser_as_read_here() {
        // Two `method` keys: Chromium sees only the one this relay acted on.
        let twice = br#"{"id":1,"method":"Browser.setDownloadBehavior","method":"Runtime.evaluate","params":{"behavior":"allow","downloadPath":"/root"}}"#;
        let out = through(frame(true, 1, twice, [1, 2, 3, 4])).await.unwrap();
        let text = String::from_utf8(out[0].1.clone()).unwrap();
        assert_eq!(text.matches("\"method\"").count(), 1, "{text}");
        // Not JSON, yet naming the command: refused.
        let broken =
            br#"{"method":"Browser.setDownloadBehavior","params":{"downloadPath":"/root",}"#;
        assert!(through(frame(true, 1, broken, [1, 2, 3, 4])).await.is_err());
    }

    /// The command inside a `Target.sendMessageToTarget`.
    fn nested(message: &[u8]) -> Value {
        let outer: Value = serde_json::from_slice(message).unwrap();
        assert_eq!(outer["method"], "Target.sendMessageToTarget", "{outer}");
        serde_json::from_str(outer["params"]["message"].as_str().unwrap()).unwrap()
    }

    #[tokio::test]
    async fn nested_commands_are_pinned_like_top_level_ones() {
        let inner = r#"{"id":7,"method":"Browser.setDownloadBehavior","params":{"behavior":"allow","downloadPath":"/instance/home"}}"#;
        let outer = serde_json::json!({
            "id": 1,
            "method": "Target.sendMessageToTarget",
            "params": {"targetId": "T", "message": inner},
        });
        let out = through(frame(true, 1, outer.to_string().as_bytes(), [1, 2, 3, 4]))
            .await
            .unwrap();
        let pinned = nested(&out[0].1);
        assert_eq!(pinned["params"]["downloadPath"], "/data/i1/downloads");
        assert_eq!(pinned["id"], 7);

        // Twice nested, and spelt with an escape inside.
        let deepest =
            r#"{"id":9,"method":"Page.setDownload\u0042ehavior","params":{"behavior":"default"}}"#;
        let middle = serde_json::json!({"id": 8, "method": "Target.sendMessageToTarget",
            "params": {"sessionId": "S", "message": deepest}})
        .to_string();
        let outer = serde_json::json!({"id": 2, "method": "Target.sendMessageToTarget",
            "params": {"sessionId": "S", "message": middle}});
        let out = through(frame(true, 1, outer.to_string().as_bytes(), [5, 6, 7, 8]))
            .await
            .unwrap();
        let pinned = nested(
            serde_json::to_string(&nested(&out[0].1))
                .unwrap()
                .as_bytes(),
        );
        assert_eq!(pinned["params"]["downloadPath"], "/data/i1/downloads");
        assert_eq!(pinned["params"]["behavior"], "allow");

        // A flattened session's command carries its method at the top.
        let flat = br#"{"id":3,"sessionId":"S","method":"Page.setDownloadBehavior","params":{"behavior":"allow","downloadPath":"/"}}"#;
        let out = through(frame(true, 1, flat, [0; 4])).await.unwrap();
        assert_eq!(download_path(&out[0].1), "/data/i1/downloads");
    }

    #[tokio::test]
    async fn extensions_cannot_be_loaded_or_removed_over_cdp() {
        let load = br#"{"id":4,"method":"Extensions.loadUnpacked","params":{"path":"/instance/home/evil"}}"#;
        let out = through(frame(true, 1, load, [1, 2, 3, 4])).await.unwrap();
        let refused: Value = serde_json::from_slice(&out[0].1).unwrap();
        assert_eq!(refused["id"], 4, "the browser answers the same id");
        let method = refused["method"].as_str().unwrap();
        assert!(
            method.starts_with("Extensions.loadUnpacked is refused by Flotilla"),
            "{method}"
        );
        assert!(method.contains("config.extensions"), "{method}");

        let inner = r#"{"id":5,"method":"Extensions.uninstall","params":{"id":"x"}}"#;
        let outer = serde_json::json!({"id": 6, "method": "Target.sendMessageToTarget",
            "params": {"targetId": "T", "message": inner}});
        let out = through(frame(true, 1, outer.to_string().as_bytes(), [0; 4]))
            .await
            .unwrap();
        let refused = nested(&out[0].1);
        assert_eq!(refused["id"], 5);
        assert!(
            refused["method"]
                .as_str()
                .unwrap()
                .contains("is refused by Flotilla"),
            "{refused}"
        );
    }

    #[tokio::test]
    async fn a_nested_message_that_cannot_be_read_is_refused() {
        // Names a pinned command, and is not JSON.
        let broken =
            r#"{"id":1,"method":"Browser.setDownloadBehavior","params":{"downloadPath":"/",}"#;
        let outer = serde_json::json!({"id": 9, "method": "Target.sendMessageToTarget",
            "params": {"targetId": "T", "message": broken}});
        let out = through(frame(true, 1, outer.to_string().as_bytes(), [0; 4]))
            .await
            .unwrap();
        let refused: Value = serde_json::from_slice(&out[0].1).unwrap();
        assert!(
            refused["method"]
                .as_str()
                .unwrap()
                .starts_with("Target.sendMessageToTarget is refused by Flotilla"),
            "{refused}"
        );
        // Nesting without end.
        let mut message =
            r#"{"id":1,"method":"Extensions.loadUnpacked","params":{"path":"/"}}"#.to_owned();
        for id in 0..10 {
            message = serde_json::json!({"id": id, "method": "Target.sendMessageToTarget",
                "params": {"targetId": "T", "message": message}})
            .to_string();
        }
        let out = through(frame(true, 1, message.as_bytes(), [0; 4]))
            .await
            .unwrap();
        let text = String::from_utf8(out[0].1.clone()).unwrap();
        assert!(
            text.contains("is refused by Flotilla: messages nest too deep"),
            "{text}"
        );
    }

    #[tokio::test]
    async fn broken_framing_ends_the_relay() {
        // A continuation with nothing to continue.
        assert!(through(frame(true, 0, b"x", [0; 4])).await.is_err());
        // A new message inside a fragmented one.
        let mut input = frame(false, 1, b"a", [0; 4]);
        input.extend(frame(true, 1, b"b", [0; 4]));
        assert!(through(input).await.is_err());
        // A ping longer than 125 bytes.
        assert!(through(frame(true, 9, &[0; 126], [0; 4])).await.is_err());
        // A message announced bigger than the limit.
        let mut huge = vec![0x81, 0x80 | 127];
        huge.extend_from_slice(&(MAX_MESSAGE as u64 + 1).to_be_bytes());
        huge.extend_from_slice(&[0; 4]);
        assert!(through(huge).await.is_err());
        // A frame cut short.
        let mut cut = frame(true, 1, b"hello", [0; 4]);
        cut.truncate(cut.len() - 2);
        assert!(through(cut).await.is_err());
    }
}
