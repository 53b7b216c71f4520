//! The client → browser direction of a CDP, WebDriver BiDi or Playwright
//! WebSocket, read frame by frame, so that the gateway (CDP), the WebDriver
//! relay (BiDi, to chromedriver) and the Playwright relay (to its server,
//! [`crate::protocols::playwright`]) can pin commands that would reach outside the
//! instance ([`pins`]): downloads always land in the instance's own
//! directory, extensions cannot be loaded or removed, and the same holds for
//! commands nested in `Target.sendMessageToTarget` and for raw CDP carried
//! by the other protocols. The browser → client direction is never touched
//! (the gateway copies bytes).
//!
//! Checking a message costs a fixed, small amount of memory whatever the
//! message, because this runs in the node agent, outside every instance's
//! cgroup:
//! - every data message is read by a strict JSON [`scan`]ner as it arrives,
//!   which keeps no tree, only the top-level `method`;
//! - a one-frame message whose method no pin concerns is sent on while it
//!   arrives, in pieces of [`CHUNK`] bytes, in a frame of the same length;
//!   its last byte is kept back until the scanner has read the whole
//!   message, so a message that turns out not to be JSON (or names its
//!   method twice) never reaches the browser whole: the connection closes;
//! - a message a pin may rewrite ([`pins::needs_whole`]), one sent in
//!   fragments, or one whose method comes late is held whole, in memory
//!   taken from the node's [`MessageBudget`] (a client waits for its turn,
//!   up to [`BUDGET_WAIT`]), read by [`pins::pin`] without building a tree,
//!   and sent as one frame;
//! - a message is at most its protocol's [`Protocol::max_message`].
//!
//! Frames go to the browser masked with [`BROWSER_KEY`] (never a zero key:
//! Firefox reads one as an unmasked frame, which a server must refuse).
//! Control frames pass through as they are, in order.

mod pins;
mod scan;

use std::io;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::io::{
    AsyncBufRead, AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt,
};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

pub use pins::{PinError, pin_carried_cdp_body};

use crate::engine::bidi_tap::TapFrames;
use scan::Method;
pub use scan::{ScanError, Scanner};

/// The key of the frames sent to the browser.
const BROWSER_KEY: [u8; 4] = [0x5a, 0xa5, 0x3c, 0xc3];

/// `data` masked with [`BROWSER_KEY`], `offset` bytes into its frame's
/// payload.
fn masked(data: &[u8], offset: u64) -> Vec<u8> {
    let mut out = data.to_vec();
    unmask(&mut out, Some(BROWSER_KEY), offset);
    out
}

/// How much of a message is read, checked and sent on at a time.
pub const CHUNK: usize = 16 << 10;

/// How much of one message a connection may hold without taking from the
/// node's budget (most commands are smaller: they never wait for it).
const FREE_HELD: usize = 16 << 10;

/// How long a message waits for the node's budget before its connection is
/// closed.
pub const BUDGET_WAIT: Duration = Duration::from_secs(30);

/// The node's default budget for messages held whole
/// (`agent.messages_in_flight_mb`).
pub const DEFAULT_BUDGET: usize = crate::config::DEFAULT_MESSAGES_IN_FLIGHT;

pub(crate) const OPCODE_TEXT: u8 = 0x1;
const OPCODE_CONTINUATION: u8 = 0x0;
pub(crate) const OPCODE_CLOSE: u8 = 0x8;

/// The protocol a relayed socket speaks, and so which commands are pinned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// The DevTools protocol, to the browser.
    Cdp,
    /// WebDriver BiDi, to chromedriver (which speaks CDP to the browser).
    Bidi,
    /// Playwright's protocol, to a Playwright server beside the browser
    /// ([`crate::protocols::playwright`]): raw CDP a client sends through a
    /// `CDPSession` gets the CDP pins.
    Playwright,
}

impl Protocol {
    /// The largest message a client of this protocol may send, what the
    /// server behind it takes: Chromium's DevTools server reads at most
    /// 100 MiB, and so do Playwright's server (`ws`'s `maxPayload`) and
    /// chromedriver's BiDi socket. The largest messages real clients send
    /// are uploads: Playwright sends at most 50 MB of files as buffers
    /// (67 MB in base64; larger ones go as a stream of small writes),
    /// Selenium uploads through HTTP (`se/file`), Puppeteer names paths.
    pub fn max_message(self) -> usize {
        crate::config::MAX_CLIENT_MESSAGE
    }
}

/// What a relay pins: its protocol, the instance's downloads directory as
/// the browser sees it, and the budget its held messages take from.
#[derive(Debug, Clone)]
pub struct Pins {
    pub protocol: Protocol,
    pub downloads_dir: String,
    pub budget: MessageBudget,
    /// A message the browser gets when the client leaves (closes, goes
    /// away, or breaks the framing), before the client's Close:
    /// [`Pins::ending_bidi_sessions`].
    pub farewell: Option<&'static str>,
}

/// What ends a BiDi session whose client left: Firefox keeps a session
/// until `session.end` (not when its socket closes), and holds one at a
/// time. Its id is one no client counts up to.
pub const BIDI_FAREWELL: &str = r#"{"id":9007199254740991,"method":"session.end","params":{}}"#;

impl Pins {
    /// Pins of `protocol` drawing on the node's budget.
    pub fn new(protocol: Protocol, downloads_dir: String) -> Self {
        Self {
            protocol,
            downloads_dir,
            budget: MessageBudget::node(),
            farewell: None,
        }
    }

    /// These pins, ending the client's BiDi session when it leaves (a
    /// browser's own BiDi socket: Firefox's).
    pub fn ending_bidi_sessions(self) -> Self {
        Self {
            farewell: Some(BIDI_FAREWELL),
            ..self
        }
    }
}

/// The memory a node lets client messages held whole take, over all its
/// relays: a semaphore of bytes (a tokio one: a message waits its turn
/// without holding a thread, in order).
#[derive(Debug, Clone)]
pub struct MessageBudget {
    bytes: Arc<Semaphore>,
    total: usize,
}

static NODE_BUDGET: OnceLock<MessageBudget> = OnceLock::new();

impl MessageBudget {
    pub fn new(total: usize) -> Self {
        let total = total.clamp(1, Semaphore::MAX_PERMITS);
        Self {
            bytes: Arc::new(Semaphore::new(total)),
            total,
        }
    }

    /// The node's budget: [`MessageBudget::configure_node`]'s, or
    /// [`DEFAULT_BUDGET`].
    pub fn node() -> Self {
        NODE_BUDGET
            .get_or_init(|| Self::new(DEFAULT_BUDGET))
            .clone()
    }

    /// Sets the node's budget (`agent.messages_in_flight_mb`) once, at start;
    /// a process that runs several agents shares the first one's.
    pub fn configure_node(total: usize) {
        let budget = NODE_BUDGET.get_or_init(|| Self::new(total));
        if budget.total != total.clamp(1, Semaphore::MAX_PERMITS) {
            tracing::warn!(
                kept = budget.total,
                asked = total,
                "the node's budget for client messages was already set"
            );
        }
    }

    /// Bytes held now.
    pub fn in_use(&self) -> usize {
        self.total - self.bytes.available_permits()
    }

    pub fn total(&self) -> usize {
        self.total
    }

    /// Takes `bytes` more for `permit`, waiting up to [`BUDGET_WAIT`].
    async fn take(
        &self,
        permit: &mut Option<OwnedSemaphorePermit>,
        bytes: usize,
    ) -> Result<(), RelayError> {
        if bytes == 0 {
            return Ok(());
        }
        let spent = || RelayError::Budget(self.total >> 20);
        let count = u32::try_from(bytes).map_err(|_| spent())?;
        if bytes > self.total {
            return Err(spent());
        }
        let taken = tokio::time::timeout(BUDGET_WAIT, self.bytes.clone().acquire_many_owned(count))
            .await
            .map_err(|_| spent())?
            .map_err(|_| spent())?;
        match permit {
            Some(held) => held.merge(taken),
            None => *permit = Some(taken),
        }
        Ok(())
    }
}

/// Why a relay stopped reading a client (its connection is then closed).
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    #[error(transparent)]
    Io(#[from] io::Error),
    #[error("broken WebSocket framing: {0}")]
    Framing(&'static str),
    #[error("a client message over {limit} bytes, the most a {protocol:?} message may be")]
    TooLarge { limit: usize, protocol: Protocol },
    #[error(transparent)]
    Scan(#[from] ScanError),
    #[error(transparent)]
    Pin(#[from] PinError),
    #[error(
        "the node's memory for client messages in flight ({0} MiB, agent.messages_in_flight_mb) stayed spent for {BUDGET_WAIT:?}"
    )]
    Budget(usize),
}

/// Copies messages from `client` to `browser` until `client` ends, with the
/// pins applied (see the module); the pins' farewell goes to the browser
/// when the client leaves, however it leaves.
pub async fn relay<R, W>(client: R, browser: W, pins: &Pins) -> Result<(), RelayError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    relay_with_node(client, browser, pins, None).await
}

/// [`relay`], with the node's own commands (`node`, see
/// [`crate::engine::bidi_tap`]) written between two of the client's
/// messages, ahead of the client's next.
pub async fn relay_with_node<R, W>(
    client: R,
    mut browser: W,
    pins: &Pins,
    node: Option<&mut TapFrames>,
) -> Result<(), RelayError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut farewell = pins.farewell;
    let mut client = tokio::io::BufReader::new(client);
    let relayed = relay_messages(&mut client, &mut browser, (pins, node), &mut farewell).await;
    if let Some(message) = farewell {
        let _ = write_frame(&mut browser, OPCODE_TEXT, message.as_bytes()).await;
    }
    // With a farewell the browser's side stays open: Firefox drops a
    // message whose connection closes right behind it. The caller closes it
    // once the farewell is answered ([`farewell_answered`]).
    if pins.farewell.is_none() {
        browser.shutdown().await.ok();
    }
    relayed
}

/// Reads what the browser sends after a farewell, passing it on to the
/// client (whatever came before it, and whatever the client can still
/// take), until the farewell's answer has come, the browser closes, or
/// `limit` has passed.
pub async fn farewell_answered<R, W>(browser: &mut R, client: &mut W, limit: Duration)
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    const ANSWER_ID: &[u8] = b"9007199254740991";
    let reading = async {
        let mut seen: Vec<u8> = Vec::new();
        let mut chunk = [0u8; 4096];
        loop {
            let n = match browser.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            let _ = client.write_all(&chunk[..n]).await;
            // The id may straddle two reads: keep the tail of the last.
            let keep = seen.len().saturating_sub(ANSWER_ID.len());
            seen.drain(..keep);
            seen.extend_from_slice(&chunk[..n]);
            if seen
                .windows(ANSWER_ID.len())
                .any(|window| window == ANSWER_ID)
            {
                return;
            }
        }
    };
    let _ = tokio::time::timeout(limit, reading).await;
}

async fn relay_messages<R, W>(
    client: &mut R,
    browser: &mut W,
    (pins, mut node): (&Pins, Option<&mut TapFrames>),
    farewell: &mut Option<&'static str>,
) -> Result<(), RelayError>
where
    R: AsyncBufRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut chunk = Vec::new();
    loop {
        if let Some(frames) = node.as_deref_mut()
            && !send_node_frames(client, browser, frames).await?
        {
            node = None;
        }
        let Some(frame) = read_frame_head(client).await? else {
            return Ok(());
        };
        if frame.opcode == OPCODE_CLOSE
            && let Some(message) = farewell.take()
        {
            write_frame(browser, OPCODE_TEXT, message.as_bytes()).await?;
        }
        if frame.opcode == OPCODE_CLOSE {
            // Nothing may follow a Close: the node's commands stop here.
            node = None;
        }
        if frame.opcode >= OPCODE_CLOSE {
            pass_control(client, browser, &frame).await?;
            continue;
        }
        if frame.opcode == OPCODE_CONTINUATION {
            return Err(RelayError::Framing(
                "a continuation frame without a message",
            ));
        }
        within_limit(frame.length, pins.protocol)?;
        let mut message = Message::new(frame.opcode, pins);
        if frame.fin {
            message
                .relay_one_frame(client, browser, &frame, &mut chunk)
                .await?;
        } else {
            message
                .collect_fragments(client, browser, frame, &mut chunk)
                .await?;
        }
        message.finish(browser).await?;
    }
}

/// Writes the node's frames to the browser until the client has more to
/// send (or has ended); `false` once the node's side is gone.
async fn send_node_frames<R, W>(
    client: &mut R,
    browser: &mut W,
    frames: &mut TapFrames,
) -> Result<bool, RelayError>
where
    R: AsyncBufRead + Unpin,
    W: AsyncWrite + Unpin,
{
    loop {
        tokio::select! {
            biased;
            frame = frames.recv() => match frame {
                Some(frame) => {
                    browser.write_all(&frame).await?;
                    browser.flush().await?;
                }
                None => return Ok(false),
            },
            filled = client.fill_buf() => {
                filled?;
                return Ok(true);
            }
        }
    }
}

fn within_limit(length: u64, protocol: Protocol) -> Result<(), RelayError> {
    let limit = protocol.max_message();
    if length > limit as u64 {
        return Err(RelayError::TooLarge { limit, protocol });
    }
    Ok(())
}

/// How a message goes on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    /// Its method is not known yet: held.
    Undecided,
    /// No pin concerns it: sent on as it arrives.
    Stream,
    /// A pin may rewrite it: held whole.
    Whole,
}

/// One client message on its way.
struct Message<'p> {
    opcode: u8,
    pins: &'p Pins,
    scanner: Scanner,
    route: Route,
    /// What has been read and not sent on yet.
    held: Vec<u8>,
    /// The budget `held` takes beyond [`FREE_HELD`].
    permit: Option<OwnedSemaphorePermit>,
    /// A streamed message's last byte read, sent once the scanner has read
    /// the whole message.
    kept_back: Option<u8>,
    /// How much of a streamed message's payload has gone to the browser
    /// (where its mask goes on).
    sent: u64,
}

impl<'p> Message<'p> {
    fn new(opcode: u8, pins: &'p Pins) -> Self {
        Self {
            opcode,
            pins,
            scanner: Scanner::new(),
            route: Route::Undecided,
            held: Vec::new(),
            permit: None,
            kept_back: None,
            sent: 0,
        }
    }

    /// Reads a one-frame message, sending it on as soon as its method says
    /// it may go (in a frame of the same length).
    async fn relay_one_frame<R, W>(
        &mut self,
        client: &mut R,
        browser: &mut W,
        frame: &FrameHead,
        chunk: &mut Vec<u8>,
    ) -> Result<(), RelayError>
    where
        R: AsyncRead + Unpin,
        W: AsyncWrite + Unpin,
    {
        let mut read = 0u64;
        while read < frame.length {
            read += self.read_piece(client, frame, read, chunk).await?;
            if self.route == Route::Stream {
                self.send_on(browser, chunk).await?;
                continue;
            }
            let whole = (self.route == Route::Whole).then_some(frame.length);
            self.hold(chunk, whole).await?;
            if self.route == Route::Undecided && read < frame.length {
                self.decide();
                if self.route == Route::Stream {
                    browser
                        .write_all(&frame_head(self.opcode, frame.length as usize))
                        .await?;
                    let held = std::mem::take(&mut self.held);
                    self.permit = None;
                    self.send_on(browser, &held).await?;
                }
            }
        }
        Ok(())
    }

    /// Reads a fragmented message whole (control frames between its
    /// fragments pass on at once).
    async fn collect_fragments<R, W>(
        &mut self,
        client: &mut R,
        browser: &mut W,
        first: FrameHead,
        chunk: &mut Vec<u8>,
    ) -> Result<(), RelayError>
    where
        R: AsyncRead + Unpin,
        W: AsyncWrite + Unpin,
    {
        let mut frame = first;
        loop {
            within_limit(self.held.len() as u64 + frame.length, self.pins.protocol)?;
            let mut read = 0u64;
            while read < frame.length {
                read += self.read_piece(client, &frame, read, chunk).await?;
                self.hold(chunk, None).await?;
            }
            if frame.fin {
                return Ok(());
            }
            frame = loop {
                let Some(next) = read_frame_head(client).await? else {
                    return Err(io::Error::from(io::ErrorKind::UnexpectedEof).into());
                };
                if next.opcode >= OPCODE_CLOSE {
                    pass_control(client, browser, &next).await?;
                    continue;
                }
                if next.opcode != OPCODE_CONTINUATION {
                    return Err(RelayError::Framing("a new message inside a fragmented one"));
                }
                break next;
            };
        }
    }

    /// Reads the next piece of `frame`'s payload (`read` bytes of it read
    /// before) into `chunk`, unmasked, and scans it; its length.
    async fn read_piece<R: AsyncRead + Unpin>(
        &mut self,
        client: &mut R,
        frame: &FrameHead,
        read: u64,
        chunk: &mut Vec<u8>,
    ) -> Result<u64, RelayError> {
        let piece = (frame.length - read).min(CHUNK as u64) as usize;
        chunk.resize(piece, 0);
        client.read_exact(chunk).await?;
        unmask(chunk, frame.mask, read);
        self.scanner.feed(chunk)?;
        Ok(piece as u64)
    }

    /// Chooses the route once the method is known.
    fn decide(&mut self) {
        self.route = match self.scanner.method() {
            Method::Unknown => Route::Undecided,
            Method::Named(method) if pins::needs_whole(self.pins.protocol, method) => Route::Whole,
            Method::Named(_) | Method::Other => Route::Stream,
        };
    }

    /// Keeps `bytes` until the message can go, taking from the node's
    /// budget what goes beyond [`FREE_HELD`] (`total`: the message's length,
    /// when known, to take it at once).
    async fn hold(&mut self, bytes: &[u8], total: Option<u64>) -> Result<(), RelayError> {
        let needed = self.held.len() + bytes.len();
        if needed > self.held.capacity() {
            let grown = match total {
                Some(total) => total as usize,
                None => (self.held.capacity() * 2).max(needed),
            }
            .max(needed);
            let charged = |capacity: usize| capacity.saturating_sub(FREE_HELD);
            let more = charged(grown) - charged(self.held.capacity());
            self.pins.budget.take(&mut self.permit, more).await?;
            self.held.reserve_exact(grown - self.held.len());
        }
        self.held.extend_from_slice(bytes);
        Ok(())
    }

    /// Sends a streamed message's bytes, keeping its last byte back.
    async fn send_on<W: AsyncWrite + Unpin>(
        &mut self,
        browser: &mut W,
        bytes: &[u8],
    ) -> Result<(), RelayError> {
        let Some((&last, rest)) = bytes.split_last() else {
            return Ok(());
        };
        if let Some(kept) = self.kept_back.replace(last) {
            self.send_masked(browser, &[kept]).await?;
        }
        self.send_masked(browser, rest).await
    }

    /// Sends the next `bytes` of a streamed message's payload, masked.
    async fn send_masked<W: AsyncWrite + Unpin>(
        &mut self,
        browser: &mut W,
        bytes: &[u8],
    ) -> Result<(), RelayError> {
        browser.write_all(&masked(bytes, self.sent)).await?;
        self.sent += bytes.len() as u64;
        Ok(())
    }

    /// Ends the message once it has been read: it must be one JSON text;
    /// a streamed one gets its last byte, a held one goes as one frame,
    /// pinned.
    async fn finish<W: AsyncWrite + Unpin>(mut self, browser: &mut W) -> Result<(), RelayError> {
        self.scanner.finish()?;
        if self.route == Route::Stream {
            if let Some(last) = self.kept_back.take() {
                self.send_masked(browser, &[last]).await?;
            }
            browser.flush().await?;
            return Ok(());
        }
        self.decide();
        let pinned = match self.route {
            Route::Whole => pins::pin(self.pins.protocol, &self.held, &self.pins.downloads_dir)?,
            _ => None,
        };
        let data = pinned.as_deref().unwrap_or(&self.held);
        write_frame(browser, self.opcode, data).await
    }
}

/// Unmasks `data`, which starts `offset` bytes into its frame's payload.
fn unmask(data: &mut [u8], mask: Option<[u8; 4]>, offset: u64) {
    if let Some(mask) = mask {
        let start = (offset % 4) as usize;
        for (i, byte) in data.iter_mut().enumerate() {
            *byte ^= mask[(start + i) % 4];
        }
    }
}

/// A control frame: at most 125 bytes, passed through as it came.
async fn pass_control<R, W>(client: &mut R, browser: &mut W, frame: &FrameHead) -> io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut payload = vec![0u8; frame.length as usize];
    client.read_exact(&mut payload).await?;
    browser.write_all(&frame.raw_head).await?;
    browser.write_all(&payload).await?;
    if frame.opcode == OPCODE_CLOSE {
        browser.flush().await?;
    }
    Ok(())
}

/// One whole message as one frame.
async fn write_frame<W: AsyncWrite + Unpin>(
    browser: &mut W,
    opcode: u8,
    data: &[u8],
) -> Result<(), RelayError> {
    browser.write_all(&masked_frame(opcode, data)).await?;
    browser.flush().await?;
    Ok(())
}

/// `data` as one whole frame for the browser, masked.
pub(crate) fn masked_frame(opcode: u8, data: &[u8]) -> Vec<u8> {
    let mut frame = frame_head(opcode, data.len());
    frame.extend_from_slice(&masked(data, 0));
    frame
}

pub(crate) struct FrameHead {
    pub(crate) fin: bool,
    pub(crate) opcode: u8,
    pub(crate) mask: Option<[u8; 4]>,
    pub(crate) length: u64,
    /// The head as received (for control frames passed through).
    pub(crate) raw_head: Vec<u8>,
}

/// Reads one frame head; `None` at a clean end of stream between frames.
pub(crate) async fn read_frame_head<R: AsyncRead + Unpin>(
    client: &mut R,
) -> Result<Option<FrameHead>, RelayError> {
    let mut first = [0u8; 2];
    match client.read_exact(&mut first).await {
        Ok(_) => {}
        Err(error) if error.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(error) => return Err(error.into()),
    }
    if first[0] & 0x70 != 0 {
        return Err(RelayError::Framing(
            "reserved bits set (no extension was agreed)",
        ));
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
            let length = u64::from_be_bytes(extended);
            if length >> 63 != 0 {
                return Err(RelayError::Framing("a length with its top bit set"));
            }
            length
        }
        short => u64::from(short),
    };
    if opcode >= OPCODE_CLOSE && (length > 125 || !fin) {
        return Err(RelayError::Framing(
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

/// The head of one final frame masked with [`BROWSER_KEY`].
fn frame_head(opcode: u8, length: usize) -> Vec<u8> {
    let mut head = Vec::with_capacity(14);
    head.push(0x80 | opcode);
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
    head.extend_from_slice(&BROWSER_KEY);
    head
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

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
            // Firefox refuses a frame whose key is zero as unmasked.
            assert!(
                opcode >= OPCODE_CLOSE || key != [0; 4],
                "a data frame with a zero key"
            );
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

    async fn through(input: Vec<u8>) -> Result<Vec<(u8, Vec<u8>)>, RelayError> {
        through_as(Protocol::Cdp, input).await
    }

    fn pins_of(protocol: Protocol, budget: usize) -> Pins {
        Pins {
            protocol,
            downloads_dir: "/data/i1/downloads".into(),
            budget: MessageBudget::new(budget),
            farewell: None,
        }
    }

    async fn through_as(
        protocol: Protocol,
        input: Vec<u8>,
    ) -> Result<Vec<(u8, Vec<u8>)>, RelayError> {
        let mut output = Vec::new();
        relay(&input[..], &mut output, &pins_of(protocol, DEFAULT_BUDGET)).await?;
        Ok(messages(&output))
    }

    async fn bidi(command: Value) -> Value {
        let input = frame(true, 1, command.to_string().as_bytes(), [7, 1, 2, 3]);
        let out = through_as(Protocol::Bidi, input).await.unwrap();
        serde_json::from_slice(&out[0].1).unwrap()
    }

    /// A Firefox BiDi client that leaves ends its session, however it
    /// leaves: Firefox would keep it (its only one) until `session.end`.
    #[tokio::test]
    async fn a_bidi_client_that_leaves_ends_its_session() {
        let pins = pins_of(Protocol::Bidi, DEFAULT_BUDGET).ending_bidi_sessions();
        let command = br#"{"id": 1, "method": "session.new", "params": {"capabilities": {}}}"#;
        let close = frame(true, OPCODE_CLOSE, &[0x03, 0xe8], [1, 2, 3, 4]);
        let broken = vec![0x81, 0x05, b'x'];
        for (how, ending) in [
            ("closes", close),
            ("goes away", Vec::new()),
            ("breaks the framing", broken),
        ] {
            let mut input = frame(true, 1, command, [9, 8, 7, 6]);
            input.extend_from_slice(&ending);
            let mut output = Vec::new();
            let _ = relay(&input[..], &mut output, &pins).await;
            let seen = messages(&output);
            let texts: Vec<&[u8]> = seen
                .iter()
                .filter(|(opcode, _)| *opcode == 1)
                .map(|(_, payload)| payload.as_slice())
                .collect();
            assert_eq!(
                texts,
                [&command[..], BIDI_FAREWELL.as_bytes()],
                "a client that {how}"
            );
            if how == "closes" {
                assert_eq!(
                    seen.last().map(|(opcode, _)| *opcode),
                    Some(OPCODE_CLOSE),
                    "the Close goes after it"
                );
            }
        }
        // Other relays say nothing when a client leaves.
        let mut output = Vec::new();
        let input = frame(true, 1, command, [9, 8, 7, 6]);
        relay(
            &input[..],
            &mut output,
            &pins_of(Protocol::Bidi, DEFAULT_BUDGET),
        )
        .await
        .unwrap();
        assert_eq!(messages(&output).len(), 1);
    }

    #[tokio::test]
    async fn a_bidi_client_cannot_set_a_proxy_of_its_own() {
        for command in [
            serde_json::json!({"id": 1, "method": "session.new", "params": {"capabilities": {"alwaysMatch": {"proxy": {"proxyType": "direct"}}}}}),
            serde_json::json!({"id": 2, "method": "session.new", "params": {"capabilities": {"firstMatch": [{}, {"proxy": {"proxyType": "manual", "httpProxy": "10.0.0.1:3128"}}]}}}),
            serde_json::json!({"id": 3, "method": "browser.createUserContext", "params": {"proxy": {"proxyType": "direct"}}}),
        ] {
            let out = bidi(command.clone()).await;
            assert!(
                out["method"]
                    .as_str()
                    .unwrap()
                    .contains("is refused by Flotilla"),
                "{command} went through as {out}"
            );
        }
        for command in [
            serde_json::json!({"id": 4, "method": "session.new", "params": {"capabilities": {"alwaysMatch": {"acceptInsecureCerts": true}}}}),
            serde_json::json!({"id": 5, "method": "browser.createUserContext", "params": {}}),
        ] {
            assert_eq!(bidi(command.clone()).await, command);
        }
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
            assert!(
                matches!(error, RelayError::Scan(_)),
                "{protocol:?}: {error}"
            );
        }
        // Plain BiDi messages pass as they were sent.
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
        let big = format!(
            r#"{{"id":5,"method":"Runtime.evaluate","params":{{"expression":"'{}'"}}}}"#,
            "x".repeat(70_000)
        )
        .into_bytes();
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
    async fn ambiguous_commands_never_reach_the_browser() {
        // Two `method` keys: parsers differ on which one counts.
        let twice = br#"{"id":1,"method":"Browser.setDownloadBehavior","method":"Runtime.evaluate","params":{"behavior":"allow","downloadPath":"/root"}}"#;
        let error = through(frame(true, 1, twice, [1, 2, 3, 4]))
            .await
            .unwrap_err();
        assert!(
            matches!(error, RelayError::Scan(ScanError::Duplicate("method"))),
            "{error}"
        );
        // Two `params` in a command the pins rewrite: refused as well.
        let twice = br#"{"id":1,"method":"Browser.setDownloadBehavior","params":{"behavior":"deny"},"params":{"behavior":"allow","downloadPath":"/root"}}"#;
        let error = through(frame(true, 1, twice, [1, 2, 3, 4]))
            .await
            .unwrap_err();
        assert!(
            matches!(error, RelayError::Pin(PinError::Duplicate(_))),
            "{error}"
        );
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
        huge.extend_from_slice(&(Protocol::Cdp.max_message() as u64 + 1).to_be_bytes());
        huge.extend_from_slice(&[0; 4]);
        assert!(through(huge).await.is_err());
        // A frame cut short.
        let mut cut = frame(true, 1, b"hello", [0; 4]);
        cut.truncate(cut.len() - 2);
        assert!(through(cut).await.is_err());
        // A length with its top bit set (RFC 6455 forbids it).
        let mut head = vec![0x81, 0x80 | 127];
        head.extend_from_slice(&(1u64 << 63 | 5).to_be_bytes());
        head.extend_from_slice(&[0; 4]);
        let read = read_frame_head(&mut &head[..]).await;
        assert!(matches!(read, Err(RelayError::Framing(_))));
    }

    #[tokio::test]
    async fn the_nodes_commands_go_between_messages_and_never_after_a_close() {
        let pins = pins_of(Protocol::Bidi, DEFAULT_BUDGET);
        let (sender, mut frames) = tokio::sync::mpsc::channel(4);
        let command = br#"{"id":4503599627370496,"method":"session.status","params":{}}"#;
        let node = masked_frame(OPCODE_TEXT, command);
        let message = br#"{"id":1,"method":"session.status","params":{}}"#;
        let (client, mut client_side) = tokio::io::duplex(1 << 16);
        let (browser, mut browser_side) = tokio::io::duplex(1 << 16);
        let relaying = tokio::spawn(async move {
            relay_with_node(client, browser, &pins, Some(&mut frames)).await
        });
        // Between two messages: the node's command goes at once.
        sender.send(node.clone()).await.unwrap();
        client_side
            .write_all(&frame(true, 1, message, [1, 2, 3, 4]))
            .await
            .unwrap();
        client_side
            .write_all(&frame(true, OPCODE_CLOSE, b"", [1, 2, 3, 4]))
            .await
            .unwrap();
        // The node's frame, the message's (a head of 2 and a key of 4) and
        // the close's.
        let expected = node.len() + (6 + message.len()) + 6;
        let mut written = Vec::new();
        while written.len() < expected {
            let mut chunk = [0u8; 4096];
            let n = browser_side.read(&mut chunk).await.unwrap();
            assert!(n > 0, "the relay wrote the client's close");
            written.extend_from_slice(&chunk[..n]);
        }
        // After the client's close, nothing more of the node's.
        sender.send(node).await.unwrap();
        drop(client_side);
        relaying.await.unwrap().unwrap();
        browser_side.read_to_end(&mut written).await.unwrap();
        let written = messages(&written);
        let opcodes: Vec<u8> = written.iter().map(|(opcode, _)| *opcode).collect();
        assert_eq!(
            opcodes,
            [OPCODE_TEXT, OPCODE_TEXT, OPCODE_CLOSE],
            "{written:?}"
        );
        assert_eq!(written[0].1, command);
        assert_eq!(written[1].1, message);
    }

    /// A CDP message of `size` bytes: an unpinned command whose params are
    /// an array of zeros.
    fn array_message(method: &str, size: usize) -> Vec<u8> {
        let mut text = format!(r#"{{"id":1,"method":"{method}","params":{{"pad":[0"#).into_bytes();
        while text.len() + 4 < size {
            text.extend_from_slice(b",0");
        }
        text.extend_from_slice(b"]}}");
        text
    }

    #[tokio::test]
    async fn large_messages_no_pin_concerns_stream_through_a_fixed_budget() {
        // A budget of one byte: only what streams can pass.
        let pins = pins_of(Protocol::Bidi, 1);
        let message = array_message("session.status", 8 << 20);
        let mut output = Vec::new();
        relay(
            &frame(true, 1, &message, [1, 2, 3, 4])[..],
            &mut output,
            &pins,
        )
        .await
        .unwrap();
        assert_eq!(messages(&output), vec![(1, message)]);
        assert_eq!(pins.budget.in_use(), 0);

        // A message the pins must read whole needs the budget.
        let inner = String::from_utf8(array_message("Runtime.evaluate", 1 << 20)).unwrap();
        let nested = serde_json::json!({"id": 2, "method": "Target.sendMessageToTarget",
            "params": {"targetId": "T", "message": inner}})
        .to_string();
        let error = relay(
            &frame(true, 1, nested.as_bytes(), [0; 4])[..],
            &mut Vec::new(),
            &pins_of(Protocol::Cdp, 1),
        )
        .await
        .unwrap_err();
        assert!(matches!(error, RelayError::Budget(_)), "{error}");
        let out = through(frame(true, 1, nested.as_bytes(), [0; 4]))
            .await
            .unwrap();
        assert_eq!(
            out[0].1,
            nested.as_bytes(),
            "an unchanged nested command passes as sent"
        );
    }

    #[tokio::test]
    async fn a_streamed_message_goes_on_before_it_has_all_arrived() {
        let message = array_message("Runtime.evaluate", 1 << 20);
        let framed = frame(true, 1, &message, [5, 6, 7, 8]);
        let (mut client, relay_side) = tokio::io::duplex(64 << 10);
        let (browser_side, mut browser) = tokio::io::duplex(4 << 20);
        let pins = pins_of(Protocol::Cdp, DEFAULT_BUDGET);
        let relayed = tokio::spawn(async move { relay(relay_side, browser_side, &pins).await });
        let half = framed.len() / 2;
        client.write_all(&framed[..half]).await.unwrap();
        let mut got = vec![0u8; 64 << 10];
        let read = browser.read(&mut got).await.unwrap();
        assert!(
            read > 0,
            "the browser gets the message's start while the rest is on its way"
        );
        client.write_all(&framed[half..]).await.unwrap();
        drop(client);
        relayed.await.unwrap().unwrap();
        let mut rest = Vec::new();
        browser.read_to_end(&mut rest).await.unwrap();
        let mut all = got[..read].to_vec();
        all.extend(rest);
        assert_eq!(messages(&all), vec![(1, message)]);
    }

    #[tokio::test]
    async fn a_streamed_message_that_turns_out_broken_never_arrives_whole() {
        let mut message = array_message("Runtime.evaluate", 200_000);
        let end = message.len() - 1;
        message[end] = b']'; // the object never closes
        let mut output = Vec::new();
        let error = relay(
            &frame(true, 1, &message, [1, 1, 1, 1])[..],
            &mut output,
            &pins_of(Protocol::Cdp, DEFAULT_BUDGET),
        )
        .await
        .unwrap_err();
        assert!(matches!(error, RelayError::Scan(_)), "{error}");
        // The head announced the whole length; the end never came.
        assert!(output.len() < 10 + 4 + message.len());

        // A second method after a streamed start: the same.
        let twice = format!(
            r#"{{"method":"Runtime.evaluate","params":{{"x":"{}"}},"method":"Extensions.loadUnpacked"}}"#,
            "y".repeat(100_000)
        );
        let mut output = Vec::new();
        let error = relay(
            &frame(true, 1, twice.as_bytes(), [1, 1, 1, 1])[..],
            &mut output,
            &pins_of(Protocol::Cdp, DEFAULT_BUDGET),
        )
        .await
        .unwrap_err();
        assert!(
            matches!(error, RelayError::Scan(ScanError::Duplicate("method"))),
            "{error}"
        );
        assert!(output.len() < 10 + 4 + twice.len());
    }

    #[tokio::test]
    async fn a_method_that_comes_late_or_in_fragments_is_still_pinned() {
        // The method after a large params: the message is held until it is known.
        let late = format!(
            r#"{{"params":{{"behavior":"allow","downloadPath":"/root","pad":"{}"}},"id":1,"method":"Browser.setDownloadBehavior"}}"#,
            "p".repeat(100)
        );
        let out = through(frame(true, 1, late.as_bytes(), [2, 3, 4, 5]))
            .await
            .unwrap();
        assert_eq!(download_path(&out[0].1), "/data/i1/downloads");
        // Fragmented one byte at a time.
        let mut input = Vec::new();
        let bytes = late.as_bytes();
        for (i, byte) in bytes.iter().enumerate() {
            let opcode = if i == 0 { 1 } else { 0 };
            input.extend(frame(i + 1 == bytes.len(), opcode, &[*byte], [9, 8, 7, 6]));
        }
        let out = through(input).await.unwrap();
        assert_eq!(download_path(&out[0].1), "/data/i1/downloads");
    }

    #[tokio::test]
    async fn messages_are_bounded_per_protocol_and_frames_without_extensions() {
        for protocol in [Protocol::Cdp, Protocol::Bidi, Protocol::Playwright] {
            let mut huge = vec![0x81, 0x80 | 127];
            huge.extend_from_slice(&(protocol.max_message() as u64 + 1).to_be_bytes());
            huge.extend_from_slice(&[0; 4]);
            let error = through_as(protocol, huge).await.unwrap_err();
            assert!(matches!(error, RelayError::TooLarge { .. }), "{error}");
        }
        // Fragments adding up beyond the limit.
        let mut input = frame(false, 1, b"{", [0; 4]);
        let mut head = vec![0x00, 0x80 | 127];
        head.extend_from_slice(&(Protocol::Cdp.max_message() as u64).to_be_bytes());
        head.extend_from_slice(&[0; 4]);
        input.extend(head);
        let error = through(input).await.unwrap_err();
        assert!(matches!(error, RelayError::TooLarge { .. }), "{error}");
        // RSV1 (compression) was never agreed.
        let mut compressed = frame(true, 1, br#"{"method":"x"}"#, [0; 4]);
        compressed[0] |= 0x40;
        let error = through(compressed).await.unwrap_err();
        assert!(matches!(error, RelayError::Framing(_)), "{error}");
    }
}
