//! The node's own commands on the session of a client of the `bidi` door.
//! Firefox binds a session started over its `/session` socket to that one
//! connection and holds one session at a time, so while such a client is
//! connected the node's reads (the live view's frames, `/tabs`,
//! `/screenshot`) go over the client's connection, through the relay
//! ([`crate::protocols::gateway`]): the relay writes the node's commands
//! between two of the client's messages, and takes their answers out of the
//! browser's stream before it reaches the client ([`forward_to_client`]).
//!
//! A node command's id is drawn at random from [`NODE_IDS`] (2^52 and up,
//! which no client counts to; Puppeteer counts from 1); only an answer to
//! an id the node awaits is taken out, so a client's own answers, whatever
//! their ids, stay its own, and a client cannot make the node hold an
//! answer it did not ask for. An answer is at most
//! [`MAX_ANSWER`] bytes; the node's commands wait their turn behind at most
//! [`QUEUED`] others.

use std::collections::HashMap;
use std::io;
use std::ops::RangeInclusive;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};

use crate::engine::bidi::{BidiError, result_of};
use crate::protocols::client_frames::{
    FrameHead, OPCODE_CLOSE, OPCODE_TEXT, masked_frame, read_frame_head,
};

/// The ids of the node's commands (below the relay's farewell, 2^53 − 1).
pub const NODE_IDS: RangeInclusive<u64> = (1 << 52)..=(1 << 53) - 2;

/// The largest answer the node takes (a PNG screenshot of a large page).
pub const MAX_ANSWER: usize = 64 << 20;

/// How many of the node's commands may wait for the relay.
const QUEUED: usize = 16;

/// How many payload bytes of a message are read to tell whose answer it is:
/// Firefox writes an answer as `{"type":"success","id":N,…` or
/// `{"type":"error","id":N,…`.
const PEEK: usize = 48;

/// The node's way onto one client connection's session (see the module).
pub struct BidiTap {
    /// Whole masked frames for the browser, written by the relay between
    /// two client messages.
    outgoing: mpsc::Sender<Vec<u8>>,
    /// The node's commands awaiting their answers, by id.
    pending: Mutex<HashMap<u64, oneshot::Sender<Vec<u8>>>>,
    /// Set once the relay has ended ([`BidiTap::close`]).
    closed: std::sync::atomic::AtomicBool,
}

/// The relay's end of a tap: the node's frames to write.
pub type TapFrames = mpsc::Receiver<Vec<u8>>;

impl BidiTap {
    /// A tap and the frames the relay is to write for it.
    pub fn new() -> (Arc<Self>, TapFrames) {
        let (outgoing, frames) = mpsc::channel(QUEUED);
        let tap = Self {
            outgoing,
            pending: Mutex::default(),
            closed: std::sync::atomic::AtomicBool::new(false),
        };
        (Arc::new(tap), frames)
    }

    /// Sends `method` on the client's session: its result, within `within`.
    pub async fn call(
        &self,
        method: &str,
        params: Value,
        within: Duration,
    ) -> Result<Value, BidiError> {
        let id = rand::random_range(NODE_IDS);
        let (answered, answer) = oneshot::channel();
        {
            let mut pending = self.pending_lock();
            if self.closed.load(std::sync::atomic::Ordering::SeqCst) {
                return Err(BidiError::Closed);
            }
            pending.insert(id, answered);
        }
        let forget = ForgetOnDrop { tap: self, id };
        let command = json!({"id": id, "method": method, "params": params}).to_string();
        let sent_and_answered = async {
            self.outgoing
                .send(masked_frame(OPCODE_TEXT, command.as_bytes()))
                .await
                .map_err(|_| BidiError::Closed)?;
            answer.await.map_err(|_| BidiError::Closed)
        };
        let message = tokio::time::timeout(within, sent_and_answered)
            .await
            .map_err(|_| BidiError::Timeout(method.to_owned()))??;
        drop(forget);
        read_answer(method, &message)
    }

    fn pending_lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, oneshot::Sender<Vec<u8>>>> {
        self.pending.lock().expect("tap lock")
    }

    /// Whether the node awaits the answer to command `id`.
    fn awaits(&self, id: u64) -> bool {
        self.pending_lock().contains_key(&id)
    }

    /// Ends the tap with its relay: the commands awaiting answers fail at
    /// once (their senders go), and later ones are refused.
    pub fn close(&self) {
        self.closed.store(true, std::sync::atomic::Ordering::SeqCst);
        self.pending_lock().clear();
    }

    /// Hands the answer to command `id` to its caller (an answer nobody
    /// waits for any more goes nowhere).
    fn answered(&self, id: u64, message: Vec<u8>) {
        if let Some(waiting) = self.pending_lock().remove(&id) {
            let _ = waiting.send(message);
        }
    }
}

/// Closes a tap when dropped (its relay ended, however it ended).
pub struct ClosedOnDrop(pub Arc<BidiTap>);

impl Drop for ClosedOnDrop {
    fn drop(&mut self) {
        self.0.close();
    }
}

/// Forgets a command whose caller stopped waiting.
struct ForgetOnDrop<'a> {
    tap: &'a BidiTap,
    id: u64,
}

impl Drop for ForgetOnDrop<'_> {
    fn drop(&mut self) {
        self.tap.pending_lock().remove(&self.id);
    }
}

/// An answer's result, or the error it carries.
fn read_answer(method: &str, message: &[u8]) -> Result<Value, BidiError> {
    let answer: Value = serde_json::from_slice(message).map_err(|error| BidiError::Command {
        method: method.to_owned(),
        error: "unreadable answer".into(),
        message: error.to_string(),
    })?;
    result_of(method, &answer)
}

/// The taps of one browser's clients, newest last (see [`crate::engine::bidi::SessionTurns`]).
#[derive(Debug, Default)]
pub struct Taps(Mutex<Vec<Weak<BidiTap>>>);

impl Taps {
    /// Adds a client's tap (dropped with its relay).
    pub fn add(&self, tap: &Arc<BidiTap>) {
        let mut taps = self.0.lock().expect("taps lock");
        taps.retain(|held| held.strong_count() > 0);
        taps.push(Arc::downgrade(tap));
    }

    /// The taps of the clients connected now, newest first.
    pub fn live(&self) -> Vec<Arc<BidiTap>> {
        let taps = self.0.lock().expect("taps lock");
        taps.iter().rev().filter_map(Weak::upgrade).collect()
    }
}

/// The node's command an answer is to, read from the start of its payload.
fn node_answer_id(start: &[u8]) -> Option<u64> {
    let rest = start
        .strip_prefix(br#"{"type":"success","id":"#)
        .or_else(|| start.strip_prefix(br#"{"type":"error","id":"#))?;
    let digits = rest.iter().take_while(|byte| byte.is_ascii_digit()).count();
    if digits == 0 || digits == rest.len() {
        return None;
    }
    let id: u64 = std::str::from_utf8(&rest[..digits]).ok()?.parse().ok()?;
    NODE_IDS.contains(&id).then_some(id)
}

/// Copies the browser's frames to the client, taking out the answers to
/// the node's commands (see the module) for `tap`. Ends when either side
/// does. `browser` is best buffered: frames are read head first.
pub async fn forward_to_client<R, W>(browser: &mut R, client: W, tap: &BidiTap) -> io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut client = tokio::io::BufWriter::new(client);
    // The node's answer being read (`None` once it is over its bound, its
    // bytes read past), when it comes in fragments.
    let mut taking: Option<(u64, Option<Vec<u8>>)> = None;
    let mut chunk = vec![0u8; 64 << 10];
    loop {
        let frame = match read_frame_head(browser).await {
            Ok(Some(frame)) => frame,
            Ok(None) => return Ok(()),
            Err(error) => return Err(io::Error::other(error.to_string())),
        };
        let mut start = vec![0u8; (frame.length as usize).min(PEEK)];
        browser.read_exact(&mut start).await?;
        let begins = frame.opcode == OPCODE_TEXT && frame.mask.is_none() && taking.is_none();
        // Only an answer the node awaits is taken: any other goes to the
        // client (a client cannot make the node hold what it did not ask).
        let awaited = begins.then(|| node_answer_id(&start)).flatten();
        if let Some(id) = awaited.filter(|id| tap.awaits(*id)) {
            taking = Some((id, Some(Vec::new())));
        }
        if frame.opcode < OPCODE_CLOSE
            && let Some((id, held)) = taking.as_mut()
        {
            take_rest(browser, &frame, start, held, &mut chunk).await?;
            if frame.fin {
                // One over its bound is answered as unreadable.
                tap.answered(*id, held.take().unwrap_or_default());
                taking = None;
            }
            continue;
        }
        client.write_all(&frame.raw_head).await?;
        client.write_all(&start).await?;
        let rest = frame.length - start.len() as u64;
        copy_exact(browser, &mut client, rest, &mut chunk).await?;
        client.flush().await?;
    }
}

/// Reads the rest of `frame`'s payload onto `held` (after `start`), or past
/// it once the answer is over [`MAX_ANSWER`] (`held` is then `None`). What
/// is held grows as bytes come, never to a length a frame only claims.
async fn take_rest<R: AsyncRead + Unpin>(
    browser: &mut R,
    frame: &FrameHead,
    start: Vec<u8>,
    held: &mut Option<Vec<u8>>,
    chunk: &mut [u8],
) -> io::Result<()> {
    let mut rest = frame.length - start.len() as u64;
    let within = |bytes: &Vec<u8>| {
        (bytes.len() as u64)
            .checked_add(frame.length)
            .is_some_and(|total| total <= MAX_ANSWER as u64)
    };
    let Some(bytes) = held.as_mut().filter(|bytes| within(bytes)) else {
        *held = None;
        return copy_exact(browser, &mut tokio::io::sink(), rest, chunk).await;
    };
    bytes.extend_from_slice(&start);
    while rest > 0 {
        let piece = (rest as usize).min(chunk.len());
        browser.read_exact(&mut chunk[..piece]).await?;
        bytes.extend_from_slice(&chunk[..piece]);
        rest -= piece as u64;
    }
    Ok(())
}

/// Copies `length` bytes from `from` to `to`.
async fn copy_exact<R, W>(
    from: &mut R,
    to: &mut W,
    mut length: u64,
    chunk: &mut [u8],
) -> io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    while length > 0 {
        let piece = (length as usize).min(chunk.len());
        from.read_exact(&mut chunk[..piece]).await?;
        to.write_all(&chunk[..piece]).await?;
        length -= piece as u64;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A browser's (unmasked) text frame.
    fn server_frame(payload: &str) -> Vec<u8> {
        let mut frame = vec![0x81];
        match payload.len() {
            n @ 0..=125 => frame.push(n as u8),
            n => {
                frame.push(126);
                frame.extend_from_slice(&(n as u16).to_be_bytes());
            }
        }
        frame.extend_from_slice(payload.as_bytes());
        frame
    }

    /// The id of the node's command in a masked frame the relay would write.
    fn command_id(frame: &[u8]) -> u64 {
        let (head, length) = match frame[1] & 0x7f {
            126 => (4, u16::from_be_bytes([frame[2], frame[3]]) as usize),
            short => (2, short as usize),
        };
        let key = &frame[head..head + 4];
        let payload: Vec<u8> = frame[head + 4..head + 4 + length]
            .iter()
            .enumerate()
            .map(|(i, byte)| byte ^ key[i % 4])
            .collect();
        let command: Value = serde_json::from_slice(&payload).unwrap();
        command["id"].as_u64().unwrap()
    }

    #[tokio::test]
    async fn only_answers_the_node_awaits_leave_the_clients_stream() {
        let (tap, mut frames) = BidiTap::new();
        let calling = {
            let tap = tap.clone();
            tokio::spawn(async move {
                let params = json!({"maxDepth": 0});
                tap.call("browsingContext.getTree", params, Duration::from_secs(30))
                    .await
            })
        };
        let id = command_id(&frames.recv().await.unwrap());
        let stranger = if id == *NODE_IDS.start() {
            id + 1
        } else {
            id - 1
        };
        let event = r#"{"type":"event","method":"log.entryAdded","params":{}}"#;
        let not_awaited = format!(r#"{{"type":"success","id":{stranger},"result":{{}}}}"#);
        let awaited = format!(r#"{{"type":"success","id":{id},"result":{{"contexts":[]}}}}"#);
        let mut browser = Vec::new();
        for payload in [event, &not_awaited, &awaited] {
            browser.extend(server_frame(payload));
        }
        let mut client = Vec::new();
        forward_to_client(&mut &browser[..], &mut client, &tap)
            .await
            .unwrap();
        let mut expected = server_frame(event);
        expected.extend(server_frame(&not_awaited));
        assert_eq!(
            client, expected,
            "the client gets all but the node's answer"
        );
        let result = calling.await.unwrap().unwrap();
        assert_eq!(result, json!({"contexts": []}));
        // Once its relay ends, the tap refuses at once.
        tap.close();
        let refused = tap.call("session.status", json!({}), Duration::from_secs(30));
        assert!(matches!(refused.await, Err(BidiError::Closed)));
    }

    #[test]
    fn only_answers_to_the_nodes_ids_are_the_nodes() {
        let node = 1u64 << 52;
        let success = format!(r#"{{"type":"success","id":{node},"result":{{}}}}"#);
        assert_eq!(node_answer_id(success.as_bytes()), Some(node));
        let error = format!(r#"{{"type":"error","id":{node},"error":"x"}}"#);
        assert_eq!(node_answer_id(error.as_bytes()), Some(node));
        for other in [
            r#"{"type":"success","id":7,"result":{}}"#.to_owned(),
            r#"{"type":"event","method":"log.entryAdded","params":{}}"#.to_owned(),
            r#"{"type":"error","id":null,"error":"invalid argument"}"#.to_owned(),
            format!(r#"{{"type":"success","id":{}}}"#, u64::MAX),
            // Cut before the id ends: not read as one.
            format!(r#"{{"type":"success","id":{node}"#),
            format!(r#"{{"id":{node},"type":"success"}}"#),
        ] {
            assert_eq!(node_answer_id(other.as_bytes()), None, "{other}");
        }
    }
}
