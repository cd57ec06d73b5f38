//! The incremental structural scanner under the envelope reader: it follows
//! one JSON text (a message, or a batch of them) byte by byte, in as many
//! chunks as it arrives in, and reports where each message's top-level keys
//! and values sit. It never parses a value: strings are skipped with memchr
//! over quotes and backslashes (the first few bytes looked at one by one:
//! most strings are short), nested objects and arrays by counting their own
//! brackets outside strings, 64 bytes at a time (`blocks`, `nested`),
//! scalars up to the next delimiter.
//!
//! Counting only `{}` inside an object (or only `[]` inside an array) finds
//! the right end in every well-formed text. A malformed one is either caught
//! at the top level (a byte where a key, colon or comma must be) or misread
//! only inside a value that every JSON parser the guard fronts refuses
//! anyway.

mod blocks;
mod nested;

use std::ops::Range;

use blocks::Nest;

/// What the scanner reports, in input order, with offsets from the start of
/// the text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Found {
    /// A message (the top-level object, or an object element of a top-level
    /// array) opens at this offset.
    MessageStart(usize),
    /// A key of the current message: its string token, quotes included,
    /// whether it holds a backslash escape, and which envelope key its
    /// decoded text names (for a sink that reads names: [`Sink::NAMES`]).
    Key {
        token: Range<usize>,
        escaped: bool,
        name: KeyName,
    },
    /// The value of the last key starts at this offset.
    ValueStart(usize),
    /// The value of the last key ends just before this offset.
    ValueEnd(usize),
    /// The current message closes; the offset is just after its `}`.
    MessageEnd(usize),
    /// An element of a top-level array that is not an object.
    OtherElement,
}

/// The envelope keys the response path acts on, by a key's decoded text
/// (the request path decodes every key itself).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KeyName {
    Id,
    Method,
    Result,
    Error,
    Other,
}

/// The longest raw key that can spell an envelope key: `method` with every
/// character written as a `\u` escape.
const LONGEST_ENVELOPE_KEY: usize = 6 * 6;

/// Enough of a key's raw bytes to name it, escapes included: a key written
/// with escapes is named by its decoded text, as the envelope reader names
/// it (`"r\u0065sult"` is `result`), so that the two read a message's kind
/// alike.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct KeyPrefix {
    bytes: [u8; LONGEST_ENVELOPE_KEY],
    len: usize,
}

impl Default for KeyPrefix {
    fn default() -> Self {
        Self {
            bytes: [0; LONGEST_ENVELOPE_KEY],
            len: 0,
        }
    }
}

impl KeyPrefix {
    fn push(&mut self, part: &[u8]) {
        // A key comes in several parts when a chunk or an escape cuts it;
        // once past the buffer, the rest is only counted.
        let start = self.len.min(self.bytes.len());
        let take = part.len().min(self.bytes.len() - start);
        self.bytes[start..start + take].copy_from_slice(&part[..take]);
        // Past the buffer the key is too long to be an envelope key.
        self.len += part.len();
    }

    fn name(&self, escaped: bool) -> KeyName {
        if self.len > self.bytes.len() {
            return KeyName::Other;
        }
        let raw = &self.bytes[..self.len];
        if !escaped {
            return Self::named(raw);
        }
        // Decoded as the envelope reader decodes keys (serde_json); a key
        // that does not decode names nothing.
        let mut token = [0; LONGEST_ENVELOPE_KEY + 2];
        token[0] = b'"';
        token[1..=raw.len()].copy_from_slice(raw);
        token[raw.len() + 1] = b'"';
        match serde_json::from_slice::<std::borrow::Cow<'_, str>>(&token[..raw.len() + 2]) {
            Ok(text) => Self::named(text.as_bytes()),
            Err(_) => KeyName::Other,
        }
    }

    fn named(text: &[u8]) -> KeyName {
        match text {
            b"id" => KeyName::Id,
            b"method" => KeyName::Method,
            b"result" => KeyName::Result,
            b"error" => KeyName::Error,
            _ => KeyName::Other,
        }
    }
}

/// Where the scanner reports what it finds, event by event.
pub(crate) trait Sink {
    /// Whether the sink reads the `name` of [`Found::Key`]; when it does
    /// not, the scanner spares the work and names every key
    /// [`KeyName::Other`].
    const NAMES: bool = true;

    /// The next event, in input order.
    fn event(&mut self, event: Found);

    /// The top-level value is an array: what follows are its elements.
    fn batch(&mut self) {}

    /// The sink needs no more of the text: [`Scanner::feed_until_done`]
    /// stops right after the event that made it so, and never reads the
    /// rest (the response path, once an id is settled).
    fn done(&self) -> bool {
        false
    }
}

impl Sink for Vec<Found> {
    fn event(&mut self, event: Found) {
        self.push(event);
    }
}

/// The text is not JSON the scanner can follow (at this offset).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Malformed(pub(crate) usize);

/// Where the scanner is in the text's structure, between tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    /// Before the top-level value.
    Top,
    /// Just after `[` at the top: an element or `]`.
    BatchFirst,
    /// After a top-level element: `,` or `]`.
    BatchNext,
    /// After a `,` at the top: an element.
    BatchElement,
    /// Just after a message's `{`: a key or `}`.
    KeyFirst,
    /// After a `,` in a message: a key.
    Key,
    /// After a key: `:`.
    Colon,
    /// After a `:`: the value.
    Value,
    /// After a value: `,` or `}`.
    AfterValue,
    /// The top-level value is complete: only whitespace may follow.
    Done,
}

/// What a token being read is to the structure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    /// A message's key.
    Key,
    /// A message's value.
    Value,
    /// A top-level array element that is not an object.
    Element,
    /// The whole text is a scalar or string: no JSON-RPC message.
    Top,
}

/// A token being read, possibly across chunks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Token {
    None,
    String {
        role: Role,
        start: usize,
        /// The previous byte was a backslash.
        escape: bool,
        escaped: bool,
    },
    Scalar {
        role: Role,
    },
    Nested {
        role: Role,
        nest: Nest,
    },
}

/// Follows one JSON text; see the module docs.
#[derive(Debug, Clone)]
pub(crate) struct Scanner {
    step: Step,
    token: Token,
    /// The top-level value is an array.
    batch: bool,
    /// Offset of the next byte to read.
    offset: usize,
    /// The key being read.
    key: KeyPrefix,
    /// Nested values are read by the byte path alone: the reference the
    /// block index is tested against.
    #[cfg(test)]
    bytes_only: bool,
}

impl Default for Scanner {
    fn default() -> Self {
        Self {
            step: Step::Top,
            token: Token::None,
            batch: false,
            offset: 0,
            key: KeyPrefix::default(),
            #[cfg(test)]
            bytes_only: false,
        }
    }
}

/// JSON whitespace (RFC 8259 §2): every parser the guard fronts agrees on it.
pub(crate) fn is_whitespace(byte: u8) -> bool {
    matches!(byte, b' ' | b'\t' | b'\n' | b'\r')
}

/// Bytes looked at one by one before memchr takes over: most keys and
/// scalar strings end within them, and there memchr's setup costs more than
/// the search.
const SHORT: usize = 16;

/// The first position of `a` or `b` in `haystack`, as `memchr2` finds it.
fn find2(a: u8, b: u8, haystack: &[u8]) -> Option<usize> {
    let head = haystack.len().min(SHORT);
    match haystack[..head]
        .iter()
        .position(|&byte| byte == a || byte == b)
    {
        Some(found) => Some(found),
        None => memchr::memchr2(a, b, &haystack[head..]).map(|found| head + found),
    }
}

/// The first position of `a`, `b` or `c` in `haystack`, as `memchr3` finds
/// it.
fn find3(a: u8, b: u8, c: u8, haystack: &[u8]) -> Option<usize> {
    let head = haystack.len().min(SHORT);
    match haystack[..head]
        .iter()
        .position(|&byte| byte == a || byte == b || byte == c)
    {
        Some(found) => Some(found),
        None => memchr::memchr3(a, b, c, &haystack[head..]).map(|found| head + found),
    }
}

/// The bytes between the quotes of a string token `"..."` that holds no
/// quote, backslash or control character inside them.
pub(crate) fn plain_string(token: &[u8]) -> Option<&[u8]> {
    let text = token.strip_prefix(b"\"")?.strip_suffix(b"\"")?;
    let plain = text
        .iter()
        .all(|&byte| byte >= 0x20 && byte != b'"' && byte != b'\\');
    plain.then_some(text)
}

fn is_delimiter(byte: u8) -> bool {
    is_whitespace(byte) || matches!(byte, b',' | b':' | b'{' | b'}' | b'[' | b']' | b'"')
}

impl Scanner {
    /// Whether the top-level value is an array (known once its first byte
    /// was read).
    pub(crate) fn is_batch(&self) -> bool {
        self.batch
    }

    /// Offset of the next byte to read: how much has been fed.
    pub(crate) fn offset(&self) -> usize {
        self.offset
    }

    /// Reads the next chunk of the text, reporting what it finds to `sink`.
    pub(crate) fn feed_into<S: Sink + ?Sized>(
        &mut self,
        chunk: &[u8],
        sink: &mut S,
    ) -> Result<(), Malformed> {
        self.feed_until_done(chunk, sink).map(|_| ())
    }

    /// Reads `chunk` until its end or until `sink` is [done](Sink::done);
    /// returns how many bytes it read. The sink handles each event as it is
    /// found (no event is queued), so stopping early costs nothing.
    pub(crate) fn feed_until_done<S: Sink + ?Sized>(
        &mut self,
        chunk: &[u8],
        sink: &mut S,
    ) -> Result<usize, Malformed> {
        let base = self.offset;
        let mut at = 0;
        while at < chunk.len() {
            if sink.done() {
                self.offset = base + at;
                return Ok(at);
            }
            at = match self.token {
                Token::None => self.structure(chunk, at, base, sink).inspect_err(|_| {
                    self.offset = base + at;
                })?,
                Token::String { .. } => self.string(chunk, at, base, sink),
                Token::Scalar { role } => {
                    match chunk[at..].iter().position(|byte| is_delimiter(*byte)) {
                        Some(found) => {
                            self.end_token(role, base + at + found, sink);
                            self.after_value(role, chunk, at + found, sink)
                        }
                        None => chunk.len(),
                    }
                }
                Token::Nested { .. } => self.nested(chunk, at, base, sink),
            };
        }
        self.offset = base + chunk.len();
        Ok(chunk.len())
    }

    /// Ends the text: a scalar still being read ends here. An error if the
    /// top-level value is not complete.
    pub(crate) fn finish<S: Sink + ?Sized>(&mut self, events: &mut S) -> Result<(), Malformed> {
        if let Token::Scalar { role } = self.token {
            self.end_token(role, self.offset, events);
        }
        match (self.step, self.token) {
            (Step::Done, Token::None) => Ok(()),
            _ => Err(Malformed(self.offset)),
        }
    }

    /// Reads structure (between tokens) at `chunk[at]`; returns where to go on.
    fn structure<S: Sink + ?Sized>(
        &mut self,
        chunk: &[u8],
        at: usize,
        base: usize,
        events: &mut S,
    ) -> Result<usize, Malformed> {
        let byte = chunk[at];
        if is_whitespace(byte) {
            return Ok(at + 1);
        }
        let here = base + at;
        let malformed = Err(Malformed(here));
        match (self.step, byte) {
            (Step::Top, b'{') => {
                events.event(Found::MessageStart(here));
                self.step = Step::KeyFirst;
            }
            (Step::Top, b'[') => {
                self.batch = true;
                events.batch();
                self.step = Step::BatchFirst;
            }
            (Step::Top, _) => self.start_value(Role::Top, byte, here),
            (Step::BatchFirst, b']') | (Step::BatchNext, b']') => self.step = Step::Done,
            (Step::BatchFirst | Step::BatchElement, b'{') => {
                events.event(Found::MessageStart(here));
                self.step = Step::KeyFirst;
            }
            (Step::BatchFirst | Step::BatchElement, b']' | b',' | b':' | b'}') => return malformed,
            (Step::BatchFirst | Step::BatchElement, _) => {
                self.step = Step::BatchNext;
                self.start_value(Role::Element, byte, here);
            }
            (Step::BatchNext, b',') => self.step = Step::BatchElement,
            (Step::KeyFirst, b'}') | (Step::AfterValue, b'}') => {
                events.event(Found::MessageEnd(here + 1));
                self.step = if self.batch {
                    Step::BatchNext
                } else {
                    Step::Done
                };
            }
            (Step::KeyFirst | Step::Key, b'"') => {
                self.step = Step::Colon;
                self.key = KeyPrefix::default();
                self.token = Token::String {
                    role: Role::Key,
                    start: here,
                    escape: false,
                    escaped: false,
                };
            }
            (Step::Colon, b':') => self.step = Step::Value,
            (Step::Value, b',' | b':' | b'}' | b']') => return malformed,
            (Step::Value, _) => {
                events.event(Found::ValueStart(here));
                self.step = Step::AfterValue;
                self.start_value(Role::Value, byte, here);
            }
            (Step::AfterValue, b',') => self.step = Step::Key,
            _ => return malformed,
        }
        Ok(at + 1)
    }

    /// Starts reading a value whose first byte is `byte` (at `here`).
    fn start_value(&mut self, role: Role, byte: u8, here: usize) {
        if role == Role::Top {
            self.step = Step::Done;
        }
        self.token = match byte {
            b'"' => Token::String {
                role,
                start: here,
                escape: false,
                escaped: false,
            },
            b'{' | b'[' => Token::Nested {
                role,
                nest: Nest {
                    open: byte,
                    close: if byte == b'{' { b'}' } else { b']' },
                    depth: 1,
                    in_string: false,
                    escape: false,
                },
            },
            _ => Token::Scalar { role },
        };
    }

    /// Reads inside a string token; returns where to go on.
    fn string<S: Sink + ?Sized>(
        &mut self,
        chunk: &[u8],
        at: usize,
        base: usize,
        events: &mut S,
    ) -> usize {
        let Token::String {
            role,
            start,
            ref mut escape,
            ref mut escaped,
        } = self.token
        else {
            unreachable!("called only inside a string");
        };
        if *escape {
            *escape = false;
            if role == Role::Key && S::NAMES {
                self.key.push(&chunk[at..at + 1]);
            }
            return at + 1;
        }
        let found = find2(b'"', b'\\', &chunk[at..]);
        if role == Role::Key && S::NAMES {
            // Raw, up to the closing quote or through a backslash: the
            // name of an escaped key is its decoded text.
            let end = match found {
                Some(found) if chunk[at + found] == b'\\' => at + found + 1,
                Some(found) => at + found,
                None => chunk.len(),
            };
            self.key.push(&chunk[at..end]);
        }
        match found {
            None => chunk.len(),
            Some(found) if chunk[at + found] == b'\\' => {
                *escape = true;
                *escaped = true;
                at + found + 1
            }
            Some(found) => {
                let end = base + at + found + 1;
                let next = at + found + 1;
                if role == Role::Key {
                    events.event(Found::Key {
                        token: start..end,
                        escaped: *escaped,
                        name: if S::NAMES {
                            self.key.name(*escaped)
                        } else {
                            KeyName::Other
                        },
                    });
                    self.token = Token::None;
                    // The colon right after a key (no whitespace: the usual
                    // writing) is read here rather than by another turn of
                    // the loop, as `(Colon, ':')` in `structure` reads it.
                    if chunk.get(next) == Some(&b':') && !events.done() {
                        self.step = Step::Value;
                        return next + 1;
                    }
                    next
                } else {
                    self.end_token(role, end, events);
                    self.after_value(role, chunk, next, events)
                }
            }
        }
    }

    /// Reads inside a nested object or array, to its end or the chunk's;
    /// returns where to go on.
    fn nested<S: Sink + ?Sized>(
        &mut self,
        chunk: &[u8],
        at: usize,
        base: usize,
        events: &mut S,
    ) -> usize {
        let Token::Nested { role, ref mut nest } = self.token else {
            unreachable!("called only inside a nested value");
        };
        #[cfg(test)]
        let closed = if self.bytes_only {
            nest.bytes(chunk, at)
        } else {
            nest.skip(chunk, at)
        };
        #[cfg(not(test))]
        let closed = nest.skip(chunk, at);
        match closed {
            Some(end) => {
                self.end_token(role, base + end, events);
                self.after_value(role, chunk, end, events)
            }
            None => chunk.len(),
        }
    }

    /// A message's value ended just before `chunk[next]`: a comma right
    /// after it (the usual writing) is read here rather than by another turn
    /// of the loop, as `(AfterValue, ',')` in `structure` reads it, unless
    /// the sink needs no more of the text. Returns where to go on.
    fn after_value<S: Sink + ?Sized>(
        &mut self,
        role: Role,
        chunk: &[u8],
        next: usize,
        events: &S,
    ) -> usize {
        if role == Role::Value && chunk.get(next) == Some(&b',') && !events.done() {
            self.step = Step::Key;
            return next + 1;
        }
        next
    }

    /// A value (or element) token ended just before `end`.
    fn end_token<S: Sink + ?Sized>(&mut self, role: Role, end: usize, events: &mut S) {
        self.token = Token::None;
        match role {
            Role::Value => events.event(Found::ValueEnd(end)),
            Role::Element => events.event(Found::OtherElement),
            Role::Key | Role::Top => {}
        }
    }
}

#[cfg(test)]
mod tests;
