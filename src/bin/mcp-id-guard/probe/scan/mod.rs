//! Reading a JSON-RPC answer as it streams in, keeping only what the probe
//! judges: the id, whether it is a result or an error (and the error's code
//! and message), whether the result has `tools` or `content`, and, for
//! `initialize`, the protocol revision and the server's name and version.
//! Each kept value is cut at [`KEPT_BYTES`]; everything else is skipped as
//! it passes, so an answer of 8 MiB costs the probe a few hundred bytes,
//! however it is split into chunks.
//!
//! Written by hand: serde_json parses from a slice (the whole answer held)
//! or from a blocking reader, and holds every string it reads whole; the
//! incremental JSON readers on crates.io either hold the values they report
//! or are not maintained. What is needed here is small: the structure
//! (brackets, commas, colons, strings and their escapes) is checked; the
//! scalars and string contents outside the kept fields are skipped
//! unchecked (a string up to its next quote or backslash in one `memchr`),
//! and a kept value is read by serde_json once whole.

use serde_json::Value;

use super::judge::Shape;

/// The longest kept value (an id, an error message, a server name), in
/// bytes of JSON text; longer ones are kept cut, and marked so.
pub(super) const KEPT_BYTES: usize = 512;
/// Nesting deeper than this is refused, as serde_json does.
const MAX_DEPTH: usize = 128;
/// Keys longer than this are none of the ones the probe reads.
const KEY_BYTES: usize = 16;

/// What the probe keeps of one JSON-RPC response.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Answer {
    /// Its id; a long or unreadable one as a string that says so.
    pub(super) id: Value,
    pub(super) shape: Shape,
    /// An error's `message`, cut at [`KEPT_BYTES`].
    pub(super) error_message: Option<String>,
    /// `result.protocolVersion` (an `initialize` answer).
    pub(super) protocol_version: Option<String>,
    /// `result.serverInfo`, as `{"name", "version"}`.
    pub(super) server: Option<Value>,
}

/// A key the probe reads; the rest are [`Key::Other`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Key {
    Id,
    Result,
    Error,
    Code,
    Message,
    Tools,
    Content,
    ProtocolVersion,
    ServerInfo,
    Name,
    Version,
    Other,
}

impl Key {
    fn of(text: &[u8]) -> Self {
        match text {
            b"id" => Key::Id,
            b"result" => Key::Result,
            b"error" => Key::Error,
            b"code" => Key::Code,
            b"message" => Key::Message,
            b"tools" => Key::Tools,
            b"content" => Key::Content,
            b"protocolVersion" => Key::ProtocolVersion,
            b"serverInfo" => Key::ServerInfo,
            b"name" => Key::Name,
            b"version" => Key::Version,
            _ => Key::Other,
        }
    }
}

/// The values the probe keeps, by where they are in a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Field {
    Id,
    Code,
    ErrorMessage,
    ProtocolVersion,
    ServerName,
    ServerVersion,
}

/// A kept value as read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
enum Kept {
    #[default]
    Absent,
    /// Its JSON text.
    Text(Vec<u8>),
    /// The first [`KEPT_BYTES`] of a longer one.
    Cut(Vec<u8>),
    /// An object or an array.
    Container,
}

impl Kept {
    fn value(&self) -> Option<Value> {
        match self {
            Kept::Absent => None,
            Kept::Text(text) => Some(
                serde_json::from_slice(text)
                    .unwrap_or_else(|_| Value::String("(not valid JSON)".to_owned())),
            ),
            Kept::Cut(start) => Some(Value::String(format!(
                "{}... (longer than {KEPT_BYTES} bytes)",
                String::from_utf8_lossy(start)
            ))),
            Kept::Container => Some(Value::String("(an object or array)".to_owned())),
        }
    }

    fn text(&self) -> Option<String> {
        self.value().map(|value| match value {
            Value::String(text) => text,
            other => other.to_string(),
        })
    }
}

/// What one message (the object, or one element of a batch) has shown so
/// far.
#[derive(Debug, Default)]
struct Draft {
    has_id: bool,
    has_result: bool,
    has_error: bool,
    has_tools: bool,
    has_content: bool,
    has_server: bool,
    id: Kept,
    code: Kept,
    error_message: Kept,
    protocol_version: Kept,
    server_name: Kept,
    server_version: Kept,
}

impl Draft {
    fn kept(&mut self, field: Field) -> &mut Kept {
        match field {
            Field::Id => &mut self.id,
            Field::Code => &mut self.code,
            Field::ErrorMessage => &mut self.error_message,
            Field::ProtocolVersion => &mut self.protocol_version,
            Field::ServerName => &mut self.server_name,
            Field::ServerVersion => &mut self.server_version,
        }
    }

    /// The answer, if this message is a JSON-RPC response.
    fn answer(&self) -> Option<Answer> {
        if !self.has_id || !(self.has_result || self.has_error) {
            return None;
        }
        let shape = if self.has_error {
            Shape::Error(
                self.code
                    .value()
                    .and_then(|code| code.as_i64())
                    .unwrap_or_default(),
            )
        } else if self.has_tools {
            Shape::Tools
        } else if self.has_content {
            Shape::Content
        } else {
            Shape::Other
        };
        let server = self.has_server.then(|| {
            serde_json::json!({
                "name": self.server_name.text(),
                "version": self.server_version.text(),
            })
        });
        Some(Answer {
            id: self.id.value().unwrap_or(Value::Null),
            shape,
            error_message: self.error_message.text(),
            protocol_version: self.protocol_version.text(),
            server,
        })
    }
}

/// What the next byte outside a string or scalar may be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    /// A value (the root, after a colon, after a comma in an array).
    Value,
    /// A value or `]` (after `[`).
    ValueOrClose,
    /// A key or `}` (after `{`).
    KeyOrClose,
    /// A key (after a comma in an object).
    Key,
    Colon,
    /// A comma or the container's close.
    CommaOrClose,
    /// Nothing but white space (the root value is complete).
    Nothing,
}

/// An open container; an object knows the key whose value is being read.
#[derive(Debug, Clone, Copy)]
enum Open {
    Object(Key),
    Array,
}

/// Where the scanner is within a token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Token {
    None,
    /// In a string; `key` when it is an object's key.
    String {
        key: bool,
        escaped: bool,
        hex: u8,
    },
    /// In a number or literal.
    Scalar,
}

/// The incremental reader; see the [module docs](self).
#[derive(Debug)]
pub(super) struct Scanner {
    open: Vec<Open>,
    /// How deep the messages sit: 0 for an object, 1 in a batch.
    base: usize,
    expect: Expect,
    token: Token,
    /// The key being read (decoded), up to [`KEY_BYTES`].
    key: Vec<u8>,
    key_long: bool,
    /// A `\u` escape in a key being decoded.
    key_hex: u32,
    /// The kept value being read, and the container depth it started at
    /// (for a container: its depth once open).
    keeping: Option<(Field, usize)>,
    kept: Vec<u8>,
    kept_cut: bool,
    draft: Draft,
    found: Option<Answer>,
    failed: bool,
}

impl Default for Scanner {
    fn default() -> Self {
        Self {
            open: Vec::new(),
            base: 0,
            expect: Expect::Value,
            token: Token::None,
            key: Vec::new(),
            key_long: false,
            key_hex: 0,
            keeping: None,
            kept: Vec::new(),
            kept_cut: false,
            draft: Draft::default(),
            found: None,
            failed: false,
        }
    }
}

impl Scanner {
    /// Reads `bytes`; the first response once a message holding one is
    /// complete (the rest of the input is then not needed).
    pub(super) fn feed(&mut self, bytes: &[u8]) -> Option<Answer> {
        let mut rest = bytes;
        while let Some((&byte, tail)) = rest.split_first() {
            if self.failed || self.found.is_some() {
                break;
            }
            if let Token::String {
                key: false,
                escaped: false,
                hex: 0,
            } = self.token
            {
                // The bulk of an answer is in its strings: skipped (or
                // kept, up to the cap) up to their next quote or escape in
                // one search, not byte by byte.
                let end = memchr::memchr2(b'"', b'\\', rest).unwrap_or(rest.len());
                if end > 0 {
                    let (span, after) = rest.split_at(end);
                    self.keep_all(span);
                    rest = after;
                    continue;
                }
            }
            self.byte(byte);
            rest = tail;
        }
        self.found.clone()
    }

    /// The end of the input: the first response, if a complete message
    /// held one and nothing before it was malformed.
    pub(super) fn finish(&mut self) -> Option<Answer> {
        if self.token == Token::Scalar {
            self.scalar_ended();
        }
        self.found.clone()
    }

    fn fail(&mut self) {
        self.failed = true;
    }

    fn byte(&mut self, byte: u8) {
        match self.token {
            Token::String { key, escaped, hex } => {
                return self.string_byte(byte, key, escaped, hex)
            }
            Token::Scalar => {
                if byte.is_ascii_alphanumeric() || matches!(byte, b'+' | b'-' | b'.') {
                    self.keep(byte);
                    return;
                }
                self.scalar_ended();
            }
            Token::None => {}
        }
        if matches!(byte, b' ' | b'\t' | b'\n' | b'\r') {
            return;
        }
        match (self.expect, byte) {
            (Expect::Value | Expect::ValueOrClose, _) if byte != b']' => self.value_started(byte),
            (Expect::ValueOrClose | Expect::CommaOrClose, b']')
                if matches!(self.open.last(), Some(Open::Array)) =>
            {
                self.close()
            }
            (Expect::KeyOrClose | Expect::CommaOrClose, b'}')
                if matches!(self.open.last(), Some(Open::Object(_))) =>
            {
                self.close()
            }
            (Expect::KeyOrClose | Expect::Key, b'"') => {
                self.key.clear();
                self.key_long = false;
                self.token = Token::String {
                    key: true,
                    escaped: false,
                    hex: 0,
                };
            }
            (Expect::Colon, b':') => self.expect = Expect::Value,
            (Expect::CommaOrClose, b',') => {
                self.expect = match self.open.last() {
                    Some(Open::Object(_)) => Expect::Key,
                    _ => Expect::Value,
                }
            }
            _ => self.fail(),
        }
    }

    /// How deep the value about to start sits in its message (0: a member
    /// of the message) and the keys that lead to it, when it is within the
    /// three levels the probe reads and no array is on the way.
    fn path(&self) -> Option<(usize, [Key; 3])> {
        let depth = self.open.len().checked_sub(self.base + 1)?;
        if depth >= 3 {
            return None;
        }
        let mut path = [Key::Other; 3];
        for (slot, open) in path.iter_mut().zip(&self.open[self.base..]) {
            match open {
                Open::Object(key) => *slot = *key,
                Open::Array => return None,
            }
        }
        Some((depth, path))
    }

    fn value_started(&mut self, byte: u8) {
        // Presence and kept fields, by the path of this value.
        if let Some((depth, path)) = self.path() {
            let draft = &mut self.draft;
            let field = match (depth, path) {
                (0, [Key::Id, ..]) => {
                    draft.has_id = true;
                    Some(Field::Id)
                }
                (0, [Key::Result, ..]) => {
                    draft.has_result = true;
                    None
                }
                (0, [Key::Error, ..]) => {
                    draft.has_error = true;
                    None
                }
                (1, [Key::Result, Key::Tools, _]) => {
                    draft.has_tools = true;
                    None
                }
                (1, [Key::Result, Key::Content, _]) => {
                    draft.has_content = true;
                    None
                }
                (1, [Key::Result, Key::ServerInfo, _]) => {
                    draft.has_server = true;
                    None
                }
                (1, [Key::Result, Key::ProtocolVersion, _]) => Some(Field::ProtocolVersion),
                (1, [Key::Error, Key::Code, _]) => Some(Field::Code),
                (1, [Key::Error, Key::Message, _]) => Some(Field::ErrorMessage),
                (2, [Key::Result, Key::ServerInfo, Key::Name]) => Some(Field::ServerName),
                (2, [Key::Result, Key::ServerInfo, Key::Version]) => Some(Field::ServerVersion),
                _ => None,
            };
            if let Some(field) = field {
                if matches!(byte, b'{' | b'[') {
                    *self.draft.kept(field) = Kept::Container;
                } else {
                    self.keeping = Some((field, self.open.len()));
                    self.kept.clear();
                    self.kept_cut = false;
                }
            }
        }
        match byte {
            b'{' | b'[' => {
                if self.open.len() >= MAX_DEPTH {
                    return self.fail();
                }
                if self.open.is_empty() && byte == b'[' {
                    // A batch: its elements are the messages.
                    self.base = 1;
                }
                if self.open.len() == self.base && byte == b'{' {
                    self.draft = Draft::default();
                }
                if byte == b'{' {
                    self.open.push(Open::Object(Key::Other));
                    self.expect = Expect::KeyOrClose;
                } else {
                    self.open.push(Open::Array);
                    self.expect = Expect::ValueOrClose;
                }
            }
            b'"' => {
                self.keep(byte);
                self.token = Token::String {
                    key: false,
                    escaped: false,
                    hex: 0,
                };
            }
            b'-' | b'0'..=b'9' | b'a'..=b'z' => {
                self.keep(byte);
                self.token = Token::Scalar;
            }
            _ => self.fail(),
        }
    }

    /// Appends to the kept value being read, if any.
    fn keep(&mut self, byte: u8) {
        if self.keeping.is_some() {
            if self.kept.len() < KEPT_BYTES {
                self.kept.push(byte);
            } else {
                self.kept_cut = true;
            }
        }
    }

    fn keep_all(&mut self, bytes: &[u8]) {
        if self.keeping.is_some() {
            let room = KEPT_BYTES.saturating_sub(self.kept.len());
            self.kept.extend_from_slice(&bytes[..room.min(bytes.len())]);
            if bytes.len() > room {
                self.kept_cut = true;
            }
        }
    }

    fn string_byte(&mut self, byte: u8, key: bool, escaped: bool, hex: u8) {
        if !key {
            self.keep(byte);
        }
        if byte < 0x20 {
            return self.fail();
        }
        let mut next = Token::String {
            key,
            escaped: false,
            hex: 0,
        };
        if hex > 0 {
            let Some(digit) = (byte as char).to_digit(16) else {
                return self.fail();
            };
            if key {
                self.key_hex = self.key_hex * 16 + digit;
                if hex == 1 {
                    let decoded = char::from_u32(self.key_hex).unwrap_or('\u{fffd}');
                    let mut utf8 = [0; 4];
                    self.key_text(decoded.encode_utf8(&mut utf8).as_bytes());
                }
            }
            next = Token::String {
                key,
                escaped: false,
                hex: hex - 1,
            };
        } else if escaped {
            let decoded = match byte {
                b'"' | b'\\' | b'/' => byte,
                b'b' => 0x08,
                b'f' => 0x0c,
                b'n' => b'\n',
                b'r' => b'\r',
                b't' => b'\t',
                b'u' => {
                    self.key_hex = 0;
                    next = Token::String {
                        key,
                        escaped: false,
                        hex: 4,
                    };
                    0
                }
                _ => return self.fail(),
            };
            if key && byte != b'u' {
                self.key_text(&[decoded]);
            }
        } else if byte == b'\\' {
            next = Token::String {
                key,
                escaped: true,
                hex: 0,
            };
        } else if byte == b'"' {
            self.token = Token::None;
            if key {
                let name = if self.key_long {
                    Key::Other
                } else {
                    Key::of(&self.key)
                };
                if let Some(Open::Object(current)) = self.open.last_mut() {
                    *current = name;
                }
                self.expect = Expect::Colon;
            } else {
                self.value_ended();
            }
            return;
        } else if key {
            self.key_text(&[byte]);
        }
        self.token = next;
    }

    fn key_text(&mut self, bytes: &[u8]) {
        if self.key.len() + bytes.len() > KEY_BYTES {
            self.key_long = true;
        } else {
            self.key.extend_from_slice(bytes);
        }
    }

    fn scalar_ended(&mut self) {
        self.token = Token::None;
        self.value_ended();
    }

    fn close(&mut self) {
        self.open.pop();
        if self.open.len() == self.base {
            // A message is complete (a batch element that is no object
            // leaves a draft with nothing in it).
            if let Some(answer) = self.draft.answer() {
                self.found = Some(answer);
            }
            self.draft = Draft::default();
        }
        self.value_ended();
    }

    /// A value (scalar, string or container) has ended.
    fn value_ended(&mut self) {
        if let Some((field, depth)) = self.keeping {
            if depth == self.open.len() {
                let kept = std::mem::take(&mut self.kept);
                *self.draft.kept(field) = if self.kept_cut {
                    Kept::Cut(kept)
                } else {
                    Kept::Text(kept)
                };
                self.keeping = None;
            }
        }
        self.expect = if self.open.is_empty() {
            Expect::Nothing
        } else {
            Expect::CommaOrClose
        };
    }
}

#[cfg(test)]
mod tests;
