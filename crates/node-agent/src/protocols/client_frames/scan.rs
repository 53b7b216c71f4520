//! An incremental, strict reader of one JSON text (RFC 8259), fed the
//! bytes of a client's message as they arrive, that builds nothing: it
//! keeps one bit per open container and the few bytes of the text the pins
//! need, the top-level `method`. So checking a message costs the same small
//! memory whatever its size, shape or nesting, and the relay can pass a
//! message on while it is still arriving once its method says the pins have
//! nothing to do with it ([`super`]).
//!
//! Strict means: what this scanner takes, every JSON parser reads the same
//! way (no comments, `\x` escapes, trailing commas, control characters or
//! invalid UTF-8; one value and only whitespace after it), so the browser,
//! chromedriver or the Playwright server cannot read a method other than the
//! one found here. A second top-level `method` is refused for the same
//! reason. Lone surrogates in `\u` escapes are JSON (JavaScript's
//! `JSON.stringify` writes them) and pass.

/// How deep containers may nest. Chromium's DevTools parser stops at 300 and
/// chromedriver's at 200, so this refuses nothing they would take.
pub const MAX_DEPTH: usize = 1024;

/// The longest top-level key or method kept (decoded, in bytes); a longer
/// one cannot name anything the pins look for.
const MAX_CAPTURE: usize = 256;

/// What the message's top-level `method` is, so far.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Method {
    /// Not seen yet (or the message has none).
    Unknown,
    /// A string, decoded.
    Named(String),
    /// A value that is not a string, or a string too long to be a method
    /// any pin looks for.
    Other,
}

/// Why a message is not one JSON text the pins can trust.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScanError {
    #[error("the message is not JSON ({what} at byte {at})")]
    Syntax { what: &'static str, at: u64 },
    #[error("the message nests deeper than {MAX_DEPTH} levels")]
    TooDeep,
    #[error("the message names its {0} twice")]
    Duplicate(&'static str),
    #[error("the message ends inside its JSON text")]
    Incomplete,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// A value must come (`first_in_array`: or the `]` of an empty array).
    Value {
        first_in_array: bool,
    },
    /// A member's name must come (`first`: or the `}` of an empty object).
    Key {
        first: bool,
    },
    Colon,
    /// A value ended inside a container: `,` or the container's end.
    AfterValue,
    String {
        key: bool,
    },
    Number(Number),
    Literal {
        rest: &'static [u8],
    },
    /// The text is complete: only whitespace may follow.
    Done,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Number {
    Minus,
    Zero,
    Int,
    Dot,
    Frac,
    E,
    ESign,
    Exp,
}

impl Number {
    fn complete(self) -> bool {
        matches!(
            self,
            Number::Zero | Number::Int | Number::Frac | Number::Exp
        )
    }

    /// The state after `byte`, or `None` when the byte ends the number.
    fn next(self, byte: u8) -> Option<Number> {
        use Number::*;
        Some(match (self, byte) {
            (Minus, b'0') => Zero,
            (Minus | Int, b'1'..=b'9') | (Int, b'0') => Int,
            (Zero | Int, b'.') => Dot,
            (Dot | Frac, b'0'..=b'9') => Frac,
            (Zero | Int | Frac, b'e' | b'E') => E,
            (E, b'+' | b'-') => ESign,
            (E | ESign | Exp, b'0'..=b'9') => Exp,
            _ => return None,
        })
    }
}

/// Where a string's bytes stand between two calls.
#[derive(Debug, Clone, Copy, Default)]
struct InString {
    /// After a backslash.
    backslash: bool,
    /// Hex digits of a `\u` escape still to come, and its value so far.
    hex_left: u8,
    hex_value: u16,
    /// Continuation bytes of a UTF-8 sequence still to come, and the range
    /// the next one must fall in.
    utf8_left: u8,
    utf8_low: u8,
    utf8_high: u8,
    /// A high surrogate escape waiting for its low half (captures only).
    high_surrogate: Option<u16>,
}

/// Reads one JSON text fed in pieces ([`Scanner::feed`]); see the module.
#[derive(Debug)]
pub struct Scanner {
    state: State,
    /// One bit per open container, 1 for an object; `depth` of them.
    containers: Vec<u64>,
    depth: usize,
    string: InString,
    /// The string being kept (a top-level name, or the method), decoded;
    /// `None` when this string is not kept.
    capture: Option<Vec<u8>>,
    capture_overflow: bool,
    /// The top-level member whose value comes next is `method`.
    method_next: bool,
    /// The current string is the method's value.
    capturing_method: bool,
    method: Method,
    seen_method: bool,
    /// The top-level member whose string value is handed out as it is read
    /// ([`Scanner::streaming_member`]), whether it was seen, whether its
    /// value is being read now, and its decoded bytes not taken yet.
    sink_member: Option<&'static str>,
    sink_seen: bool,
    sink_was_string: bool,
    sink_next: bool,
    sinking: bool,
    sink: Vec<u8>,
    /// Bytes fed before the current piece (for error positions).
    offset: u64,
}

impl Default for Scanner {
    fn default() -> Self {
        Self::new()
    }
}

impl Scanner {
    pub fn new() -> Self {
        Self {
            state: State::Value {
                first_in_array: false,
            },
            containers: Vec::new(),
            depth: 0,
            string: InString::default(),
            capture: None,
            capture_overflow: false,
            method_next: false,
            capturing_method: false,
            method: Method::Unknown,
            seen_method: false,
            sink_member: None,
            sink_seen: false,
            sink_was_string: false,
            sink_next: false,
            sinking: false,
            sink: Vec::new(),
            offset: 0,
        }
    }

    /// A scanner that hands out the decoded string value of the top-level
    /// member `name` as it is read ([`Scanner::take_streamed`]), without
    /// keeping it: an upload read from its request body as it arrives.
    pub fn streaming_member(name: &'static str) -> Self {
        Self {
            sink_member: Some(name),
            ..Self::new()
        }
    }

    /// The streamed member's decoded bytes read since the last call.
    pub fn take_streamed(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.sink)
    }

    /// Whether the streamed member was seen (as a string or not).
    pub fn streamed_member_seen(&self) -> bool {
        self.sink_seen
    }

    /// Whether the streamed member's value is a string.
    pub fn streamed_member_was_string(&self) -> bool {
        self.sink_was_string
    }

    /// The top-level `method`, as far as the text has been read.
    pub fn method(&self) -> &Method {
        &self.method
    }

    /// Whether the text read so far is one whole JSON text.
    pub fn finish(&self) -> Result<(), ScanError> {
        match self.state {
            State::Done => Ok(()),
            State::Number(number) if self.depth == 0 && number.complete() => Ok(()),
            _ => Err(ScanError::Incomplete),
        }
    }

    /// Reads the next piece of the text.
    pub fn feed(&mut self, bytes: &[u8]) -> Result<(), ScanError> {
        let mut at = 0;
        while at < bytes.len() {
            at = match self.state {
                State::String { key } => self.string_bytes(bytes, at, key)?,
                _ => {
                    self.structural(bytes[at], at)?;
                    at + 1
                }
            };
        }
        self.offset += bytes.len() as u64;
        Ok(())
    }

    fn syntax(&self, what: &'static str, at: usize) -> ScanError {
        ScanError::Syntax {
            what,
            at: self.offset + at as u64,
        }
    }

    /// One byte outside strings.
    fn structural(&mut self, byte: u8, at: usize) -> Result<(), ScanError> {
        if let State::Number(number) = self.state {
            match number.next(byte) {
                Some(next) => {
                    self.state = State::Number(next);
                    return Ok(());
                }
                None if number.complete() => self.value_done(),
                None => return Err(self.syntax("a broken number", at)),
            }
        }
        if let State::Literal { rest } = self.state {
            if rest.first() != Some(&byte) {
                return Err(self.syntax("an unknown word", at));
            }
            self.state = State::Literal { rest: &rest[1..] };
            if rest.len() == 1 {
                self.value_done();
            }
            return Ok(());
        }
        if matches!(byte, b' ' | b'\t' | b'\n' | b'\r') {
            return Ok(());
        }
        match self.state {
            State::Value { first_in_array } => self.value_start(byte, first_in_array, at),
            State::Key { first } => match byte {
                b'"' => {
                    self.begin_string(true);
                    Ok(())
                }
                b'}' if first => self.close(true, at),
                _ => Err(self.syntax("a member without a quoted name", at)),
            },
            State::Colon if byte == b':' => {
                self.state = State::Value {
                    first_in_array: false,
                };
                Ok(())
            }
            State::Colon => Err(self.syntax("a name without ':'", at)),
            State::AfterValue => match byte {
                b',' if self.in_object() => {
                    self.state = State::Key { first: false };
                    Ok(())
                }
                b',' => {
                    self.state = State::Value {
                        first_in_array: false,
                    };
                    Ok(())
                }
                b'}' => self.close(true, at),
                b']' => self.close(false, at),
                _ => Err(self.syntax("a value not followed by ',' or an end", at)),
            },
            State::Done => Err(self.syntax("more after the JSON text", at)),
            State::String { .. } | State::Number(_) | State::Literal { .. } => {
                unreachable!("handled above")
            }
        }
    }

    fn value_start(&mut self, byte: u8, first_in_array: bool, at: usize) -> Result<(), ScanError> {
        let is_method = std::mem::take(&mut self.method_next);
        if is_method && byte != b'"' {
            self.method = Method::Other;
        }
        let is_sink = std::mem::take(&mut self.sink_next);
        if is_sink && byte == b'"' {
            self.sinking = true;
            self.sink_was_string = true;
        }
        match byte {
            b'{' => self.open(true),
            b'[' => self.open(false),
            b']' if first_in_array => self.close(false, at),
            b'"' => {
                self.capturing_method = is_method;
                self.begin_string(false);
                Ok(())
            }
            b'-' => {
                self.state = State::Number(Number::Minus);
                Ok(())
            }
            b'0' => {
                self.state = State::Number(Number::Zero);
                Ok(())
            }
            b'1'..=b'9' => {
                self.state = State::Number(Number::Int);
                Ok(())
            }
            b't' => self.literal(b"rue"),
            b'f' => self.literal(b"alse"),
            b'n' => self.literal(b"ull"),
            _ => Err(self.syntax("an unexpected character", at)),
        }
    }

    fn literal(&mut self, rest: &'static [u8]) -> Result<(), ScanError> {
        self.state = State::Literal { rest };
        Ok(())
    }

    fn in_object(&self) -> bool {
        self.depth > 0 && {
            let level = self.depth - 1;
            self.containers[level / 64] & (1 << (level % 64)) != 0
        }
    }

    fn open(&mut self, object: bool) -> Result<(), ScanError> {
        if self.depth >= MAX_DEPTH {
            return Err(ScanError::TooDeep);
        }
        let level = self.depth;
        if level / 64 == self.containers.len() {
            self.containers.push(0);
        }
        let bit = 1u64 << (level % 64);
        if object {
            self.containers[level / 64] |= bit;
        } else {
            self.containers[level / 64] &= !bit;
        }
        self.depth += 1;
        self.state = if object {
            State::Key { first: true }
        } else {
            State::Value {
                first_in_array: true,
            }
        };
        Ok(())
    }

    fn close(&mut self, object: bool, at: usize) -> Result<(), ScanError> {
        if self.depth == 0 || self.in_object() != object {
            return Err(self.syntax("a container closed by the wrong bracket", at));
        }
        self.depth -= 1;
        self.value_done();
        Ok(())
    }

    fn value_done(&mut self) {
        self.state = if self.depth == 0 {
            State::Done
        } else {
            State::AfterValue
        };
    }

    fn begin_string(&mut self, key: bool) {
        self.state = State::String { key };
        self.string = InString::default();
        let kept = (key && self.depth == 1) || self.capturing_method;
        self.capture = kept.then(Vec::new);
        self.capture_overflow = false;
    }

    /// Reads string bytes from `at`; the index after the last one read.
    fn string_bytes(&mut self, bytes: &[u8], at: usize, key: bool) -> Result<usize, ScanError> {
        let mut at = at;
        // Plain ASCII outside an escape: read in one run.
        if self.capture.is_none() && self.plain_string() {
            let run = bytes[at..]
                .iter()
                .position(|&b| b == b'"' || b == b'\\' || !(0x20..0x80).contains(&b))
                .unwrap_or(bytes.len() - at);
            if self.sinking {
                self.sink.extend_from_slice(&bytes[at..at + run]);
            }
            at += run;
        }
        while at < bytes.len() {
            let byte = bytes[at];
            if self.string_byte(byte, at)? {
                self.string_done(key)?;
                return Ok(at + 1);
            }
            at += 1;
            if self.capture.is_none() && self.plain_string() {
                return Ok(at);
            }
        }
        Ok(at)
    }

    /// Inside a string and outside any escape or UTF-8 sequence.
    fn plain_string(&self) -> bool {
        !self.string.backslash && self.string.hex_left == 0 && self.string.utf8_left == 0
    }

    /// One byte inside a string; `true` at its closing quote.
    fn string_byte(&mut self, byte: u8, at: usize) -> Result<bool, ScanError> {
        let s = &mut self.string;
        if s.utf8_left > 0 {
            if !(s.utf8_low..=s.utf8_high).contains(&byte) {
                return Err(self.syntax("invalid UTF-8", at));
            }
            s.utf8_left -= 1;
            (s.utf8_low, s.utf8_high) = (0x80, 0xbf);
            self.keep(&[byte]);
            return Ok(false);
        }
        if s.hex_left > 0 {
            let Some(digit) = (byte as char).to_digit(16) else {
                return Err(self.syntax("a \\u escape without four hex digits", at));
            };
            s.hex_value = s.hex_value << 4 | digit as u16;
            s.hex_left -= 1;
            if s.hex_left == 0 {
                let unit = s.hex_value;
                self.keep_unit(unit);
            }
            return Ok(false);
        }
        if s.backslash {
            s.backslash = false;
            let decoded = match byte {
                b'"' | b'\\' | b'/' => byte,
                b'b' => 0x08,
                b'f' => 0x0c,
                b'n' => b'\n',
                b'r' => b'\r',
                b't' => b'\t',
                b'u' => {
                    (s.hex_left, s.hex_value) = (4, 0);
                    return Ok(false);
                }
                _ => return Err(self.syntax("an escape JSON does not have", at)),
            };
            self.keep(&[decoded]);
            return Ok(false);
        }
        match byte {
            b'"' => return Ok(true),
            b'\\' => s.backslash = true,
            0..0x20 => return Err(self.syntax("a control character in a string", at)),
            0x20..0x80 => self.keep(&[byte]),
            _ => {
                let (left, low, high) = match byte {
                    0xc2..=0xdf => (1, 0x80, 0xbf),
                    0xe0 => (2, 0xa0, 0xbf),
                    0xed => (2, 0x80, 0x9f),
                    0xe1..=0xef => (2, 0x80, 0xbf),
                    0xf0 => (3, 0x90, 0xbf),
                    0xf1..=0xf3 => (3, 0x80, 0xbf),
                    0xf4 => (3, 0x80, 0x8f),
                    _ => return Err(self.syntax("invalid UTF-8", at)),
                };
                (s.utf8_left, s.utf8_low, s.utf8_high) = (left, low, high);
                self.keep(&[byte]);
            }
        }
        Ok(false)
    }

    /// Adds decoded bytes to the kept string (a waiting high surrogate that
    /// gets no low half becomes U+FFFD).
    fn keep(&mut self, bytes: &[u8]) {
        if self.capture.is_none() && !self.sinking {
            return;
        }
        if self.string.high_surrogate.take().is_some() {
            self.keep_char(char::REPLACEMENT_CHARACTER);
        }
        self.keep_raw(bytes);
    }

    fn keep_raw(&mut self, bytes: &[u8]) {
        if self.sinking {
            self.sink.extend_from_slice(bytes);
            return;
        }
        let Some(capture) = self.capture.as_mut() else {
            return;
        };
        if capture.len() + bytes.len() > MAX_CAPTURE {
            self.capture_overflow = true;
        } else {
            capture.extend_from_slice(bytes);
        }
    }

    fn keep_char(&mut self, c: char) {
        let mut buffer = [0u8; 4];
        self.keep_raw(c.encode_utf8(&mut buffer).as_bytes());
    }

    fn keep_unit(&mut self, unit: u16) {
        if self.capture.is_none() && !self.sinking {
            return;
        }
        let waiting = self.string.high_surrogate.take();
        match (waiting, unit) {
            (Some(high), 0xdc00..=0xdfff) => {
                let code =
                    0x10000 + ((u32::from(high) - 0xd800) << 10) + (u32::from(unit) - 0xdc00);
                self.keep_char(char::from_u32(code).unwrap_or(char::REPLACEMENT_CHARACTER));
            }
            (waiting, _) => {
                if waiting.is_some() {
                    self.keep_char(char::REPLACEMENT_CHARACTER);
                }
                if (0xd800..0xdc00).contains(&unit) {
                    self.string.high_surrogate = Some(unit);
                } else {
                    self.keep_char(
                        char::from_u32(u32::from(unit)).unwrap_or(char::REPLACEMENT_CHARACTER),
                    );
                }
            }
        }
    }

    fn string_done(&mut self, key: bool) -> Result<(), ScanError> {
        if self.string.high_surrogate.take().is_some() {
            self.keep_char(char::REPLACEMENT_CHARACTER);
        }
        let kept = self.capture.take();
        let overflow = self.capture_overflow;
        if key {
            self.state = State::Colon;
            if self.depth == 1 && !overflow && kept.as_deref() == Some(b"method") {
                if self.seen_method {
                    return Err(ScanError::Duplicate("method"));
                }
                self.seen_method = true;
                self.method_next = true;
            }
            if let Some(member) = self.sink_member
                && self.depth == 1
                && !overflow
                && kept.as_deref() == Some(member.as_bytes())
            {
                if self.sink_seen {
                    return Err(ScanError::Duplicate(member));
                }
                self.sink_seen = true;
                self.sink_next = true;
            }
            return Ok(());
        }
        self.sinking = false;
        if std::mem::take(&mut self.capturing_method) {
            self.method = match kept.map(String::from_utf8) {
                Some(Ok(name)) if !overflow => Method::Named(name),
                _ => Method::Other,
            };
        }
        self.value_done();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan_in(text: &[u8], piece: usize) -> Result<Method, ScanError> {
        let mut scanner = Scanner::new();
        for chunk in text.chunks(piece.max(1)) {
            scanner.feed(chunk)?;
        }
        scanner.finish()?;
        Ok(scanner.method().clone())
    }

    /// The same answer whole and a byte at a time, and serde_json agrees on
    /// what is JSON.
    fn scan(text: &[u8]) -> Result<Method, ScanError> {
        let whole = scan_in(text, text.len());
        assert_eq!(whole, scan_in(text, 1), "{}", String::from_utf8_lossy(text));
        assert_eq!(whole, scan_in(text, 7), "{}", String::from_utf8_lossy(text));
        whole
    }

    fn named(name: &str) -> Result<Method, ScanError> {
        Ok(Method::Named(name.into()))
    }

    #[test]
    fn finds_the_top_level_method_however_it_is_spelt() {
        assert_eq!(
            scan(br#"{"id":1,"method":"Page.navigate","params":{"url":"x"}}"#),
            named("Page.navigate")
        );
        assert_eq!(
            scan(br#" { "m\u0065thod" : "Page.setDownload\u0042ehavior" } "#),
            named("Page.setDownloadBehavior")
        );
        assert_eq!(
            scan(br#"{"params":{"method":"inner"},"method":"outer"}"#),
            named("outer")
        );
        assert_eq!(
            scan(br#"{"id":1,"params":[{"method":"x"}]}"#),
            Ok(Method::Unknown)
        );
        assert_eq!(scan(br#"{"method":5}"#), Ok(Method::Other));
        assert_eq!(scan(br#"{"method":{"a":"b"}}"#), Ok(Method::Other));
        assert_eq!(scan(br#"{"method":"\ud83d\ude00 \u00e9"}"#), named("😀 é"));
        assert_eq!(scan(br#"{"method":"\ud800x"}"#), named("\u{fffd}x"));
        let long = format!(r#"{{"method":"{}"}}"#, "a".repeat(300));
        assert_eq!(scan(long.as_bytes()), Ok(Method::Other));
        assert_eq!(scan(br#"[1,2,{"method":"x"}]"#), Ok(Method::Unknown));
        assert_eq!(scan(b"42"), Ok(Method::Unknown));
        assert_eq!(scan("{\"method\":\"é€😀\"}".as_bytes()), named("é€😀"));
    }

    #[test]
    fn a_second_method_is_refused() {
        assert_eq!(
            scan(br#"{"method":"Runtime.evaluate","id":1,"method":"Extensions.loadUnpacked"}"#),
            Err(ScanError::Duplicate("method"))
        );
        assert_eq!(
            scan(br#"{"method":"a","m\u0065thod":"b"}"#),
            Err(ScanError::Duplicate("method"))
        );
        // Nested ones are the params' business.
        assert_eq!(
            scan(br#"{"method":"a","params":{"method":"b","method":"c"}}"#),
            named("a")
        );
    }

    #[test]
    fn only_strict_json_passes() {
        let refused: &[&[u8]] = &[
            b"",
            b"{",
            br#"{"method":"a",}"#,
            br#"{"method":"a\x41"}"#,
            br#"{"method":"a"} {}"#,
            br#"{"method":'a'}"#,
            b"{\"method\":\"a\tb\"}",
            br#"{"a":01}"#,
            br#"{"a":1.}"#,
            br#"{"a":-}"#,
            br#"{"a":1e}"#,
            br#"{"a":tru}"#,
            br#"{"a":True}"#,
            br#"{"a" 1}"#,
            br#"{"a":1]"#,
            br#"[1}"#,
            br#"{/*x*/"a":1}"#,
            br#"{"a":"\u12"}"#,
            b"{\"a\":\"\xc3\"}",
            b"{\"a\":\"\xed\xa0\x80\"}",
            b"{\"a\":\"\xf5\x80\x80\x80\"}",
            b"{\"a\":\"\xe0\x80\xaf\"}",
            b"{\"a\":\"\xff\"}",
            br#"{"a":[1,]}"#,
            br#"{,}"#,
        ];
        for text in refused {
            assert!(scan(text).is_err(), "{}", String::from_utf8_lossy(text));
            assert!(
                serde_json::from_slice::<serde_json::Value>(text).is_err(),
                "serde_json takes {}",
                String::from_utf8_lossy(text)
            );
        }
        let taken: &[&[u8]] = &[
            br#"{}"#,
            br#"[]"#,
            br#"{"a":[],"b":{},"c":[[]],"d":""}"#,
            br#"{"a":-0.5e+10,"b":0,"c":1E3,"d":-12.25,"e":true,"f":false,"g":null}"#,
            br#"{"a":"\"\\\/\b\f\n\r\t\u0000"}"#,
            "{\"a\":\"é€😀\u{10ffff}\"}".as_bytes(),
            b" \r\n\t{ } \n",
            br#""just a string""#,
            b"-1",
        ];
        for text in taken {
            assert!(scan(text).is_ok(), "{}", String::from_utf8_lossy(text));
            serde_json::from_slice::<serde_json::Value>(text).unwrap();
        }
        // A lone surrogate escape is JSON's grammar (JSON.stringify writes it).
        assert_eq!(scan(br#"{"a":"\udc00\ud800"}"#), Ok(Method::Unknown));
    }

    #[test]
    fn depth_costs_a_bit_per_level_up_to_the_limit() {
        let deep = |levels: usize| {
            let mut text = "[".repeat(levels).into_bytes();
            text.extend(std::iter::repeat_n(b']', levels));
            text
        };
        assert_eq!(scan_in(&deep(MAX_DEPTH), 4096), Ok(Method::Unknown));
        assert_eq!(scan_in(&deep(MAX_DEPTH + 1), 4096), Err(ScanError::TooDeep));
        let mut objects = String::new();
        for _ in 0..200 {
            objects.push_str(r#"{"a":[0,"#);
        }
        objects.push('1');
        for _ in 0..200 {
            objects.push_str("]}");
        }
        assert_eq!(scan(objects.as_bytes()), Ok(Method::Unknown));
    }

    #[test]
    fn a_text_cut_short_is_incomplete() {
        for text in [
            &br#"{"method":"a""#[..],
            br#"{"a":"#,
            b"[1",
            br#"{"a":"\"#,
            b"tr",
        ] {
            assert_eq!(scan_in(text, 3), Err(ScanError::Incomplete));
        }
    }

    #[test]
    fn a_streamed_member_is_handed_out_decoded_as_it_is_read() {
        let text = br#"{"other":{"file":"no"},"file":"QUJD\nREVG\u0047\/","x":1}"#;
        for piece in [1, 3, text.len()] {
            let mut scanner = Scanner::streaming_member("file");
            let mut out = Vec::new();
            for chunk in text.chunks(piece) {
                scanner.feed(chunk).unwrap();
                out.extend(scanner.take_streamed());
            }
            scanner.finish().unwrap();
            assert_eq!(out, b"QUJD\nREVGG/", "pieces of {piece}");
            assert!(scanner.streamed_member_seen());
        }
        let mut twice = Scanner::streaming_member("file");
        assert_eq!(
            twice.feed(br#"{"file":"a","file":"b"}"#),
            Err(ScanError::Duplicate("file"))
        );
        let mut absent = Scanner::streaming_member("file");
        absent.feed(br#"{"files":"a"}"#).unwrap();
        assert!(!absent.streamed_member_seen());
        assert!(absent.take_streamed().is_empty());
    }
}
