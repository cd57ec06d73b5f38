//! The one JSON-RPC envelope reader, shared by the request path (find requests
//! and their ids) and the response path (find responses whose ids need
//! restoring).
//!
//! It borrows: ids are located as byte ranges of the input, so callers can
//! splice replacement bytes at exact offsets ([`crate::wire::edit`]) without
//! re-serializing a message. Underneath is one incremental structural
//! [`scan::Scanner`]: the request path runs it over a whole body, the
//! response path ([`crate::wire::restore`]) over a stream, chunk by chunk.
//!
//! # Reading like the servers
//! A client's body is read the way the most lenient server the guard fronts
//! would read it, and where servers disagree the guard refuses the body
//! ([`Unreadable`]) rather than guess:
//! - every top-level key of every message is read (string and nested values
//!   skipped with memchr, never parsed), keys decoded (`"\u0069d"` is `id`),
//!   and a key seen twice in a message refuses the body: Python and
//!   JavaScript keep the last, serde refuses, so no reading is safe;
//! - ids are compared by value ([`crate::wire::id`]), and an id servers read
//!   differently refuses the body;
//! - a body that starts like JSON but cannot be followed refuses the body:
//!   some server's parser may still accept it;
//! - UTF-16 and UTF-32 bodies are refused (RFC 8259 §8.1: JSON exchanged
//!   between systems is UTF-8; the Python SDK decodes them); the caller drops
//!   a UTF-8 byte order mark first ([`utf8_bom`]).
//!
//! The payload (`params`, `result`) is not validated: a request whose
//! `params` are broken is still tracked, and the server answers it with its
//! own error. A body whose first byte (after whitespace) is not `{` or `[` is
//! no JSON-RPC message to any server and passes untracked.

use std::borrow::Cow;
use std::collections::HashSet;
use std::ops::Range;

use crate::wire::scan::{is_whitespace, plain_string, Found, Scanner, Sink};

/// What one JSON-RPC message in a body is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// An object with a string `method` and a non-null `id`.
    Request,
    /// An object with a string `method` and no (or a null) `id`.
    Notification,
    /// An object with a non-null `result` or `error` and no `method`.
    Response,
    /// Anything else (not a JSON-RPC message we act on).
    Other,
}

/// One message of a body: its kind and where its top-level `id` token sits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Message {
    pub(crate) kind: Kind,
    /// Byte range of the `id` value's JSON text inside the read input,
    /// `None` when the message has no id or `id` is `null`.
    pub(crate) id: Option<Range<usize>>,
    /// For a `notifications/cancelled`, the byte range of `params.requestId`
    /// (absent or `null`: `None`).
    pub(crate) cancels: Option<Range<usize>>,
    /// Byte range of the `method` string token (quotes included) of a
    /// request or notification, `None` for other messages. Read it with
    /// [`McpMethod::from_token`](crate::wire::method::McpMethod::from_token).
    pub(crate) method: Option<Range<usize>>,
    /// Byte range of a request's `params` when it is an object (for
    /// [`tool_name`]), `None` for other messages.
    pub(crate) params: Option<Range<usize>>,
}

/// The shape of a read body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Peeked {
    /// A single JSON-RPC message (an object).
    Single(Message),
    /// A batch (JSON array); one entry per element, in order.
    Batch(Vec<Message>),
}

impl Peeked {
    /// The messages, in order, whatever the shape.
    pub(crate) fn messages(&self) -> &[Message] {
        match self {
            Peeked::Single(message) => std::slice::from_ref(message),
            Peeked::Batch(messages) => messages,
        }
    }

    /// The requests' ids, in order: where each sits in `input` (the body this
    /// was read from) and its JSON text.
    pub(crate) fn request_ids<'a>(
        &self,
        input: &'a [u8],
    ) -> impl Iterator<Item = (Range<usize>, &'a str)> + use<'_, 'a> {
        self.messages()
            .iter()
            .filter(|message| message.kind == Kind::Request)
            .filter_map(move |message| token(input, message.id.clone()?))
    }

    /// The `params.requestId` of each `notifications/cancelled`, in order:
    /// the message's index, where the id sits in `input` and its JSON text.
    pub(crate) fn cancelled_ids<'a>(
        &self,
        input: &'a [u8],
    ) -> impl Iterator<Item = (usize, Range<usize>, &'a str)> + use<'_, 'a> {
        self.messages()
            .iter()
            .enumerate()
            .filter_map(move |(index, message)| {
                let (range, text) = token(input, message.cancels.clone()?)?;
                Some((index, range, text))
            })
    }
}

/// A token's range and text. Ranges handed out by [`read`] are validated
/// ids, which are UTF-8.
fn token(input: &[u8], range: Range<usize>) -> Option<(Range<usize>, &str)> {
    let text = std::str::from_utf8(&input[range.clone()]).ok()?;
    Some((range, text))
}

/// Why the guard answers a body itself instead of forwarding it: some server
/// could read it as a request the guard would not track as that server sees
/// it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unreadable {
    /// It starts like JSON (`{` or `[`) but is not JSON the guard can follow.
    Malformed,
    /// UTF-16 or UTF-32 rather than UTF-8.
    NotUtf8,
    /// Compressed (`Content-Encoding`): a server that inflates request bodies
    /// (Express's body parser does) reads what the guard cannot see.
    Compressed,
    /// A key appears twice in one message (or in a cancellation's `params`).
    DuplicateKey,
    /// A request (or cancellation) id that servers read differently; see
    /// [`crate::wire::id::key_of`].
    Id,
}

/// How the guard reads a client's body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Reading {
    /// Not a JSON object or array: no server reads it as JSON-RPC.
    NotJsonRpc,
    /// Read: its messages.
    Read(Peeked),
    /// The guard answers it itself.
    Unreadable(Unreadable),
}

/// The messages of a body, when [`read`] reads it.
#[cfg(any(feature = "proxy", feature = "internals"))]
pub(crate) fn peek(input: &[u8]) -> Option<Peeked> {
    match read(input) {
        Reading::Read(peeked) => Some(peeked),
        Reading::NotJsonRpc | Reading::Unreadable(_) => None,
    }
}

/// The length of a UTF-8 byte order mark at the start of `body` (3), or 0.
/// The Python SDK skips one; the guard drops it before reading and
/// forwarding, so every server reads the same bytes.
pub(crate) fn utf8_bom(body: &[u8]) -> usize {
    if body.starts_with(b"\xEF\xBB\xBF") {
        3
    } else {
        0
    }
}

/// The method whose `params.requestId` names a request to cancel.
const CANCELLED: &[u8] = b"notifications/cancelled";

/// Reads a body (see the module docs).
pub(crate) fn read(input: &[u8]) -> Reading {
    // Python's `json.loads` detects UTF-16 and UTF-32 by a byte order mark
    // or by NUL bytes among the first two, as RFC 4627 did; UTF-8 JSON has
    // neither.
    let wide = input.starts_with(b"\xFE\xFF")
        || input.starts_with(b"\xFF\xFE")
        || (input.len() >= 2 && (input[0] == 0 || input[1] == 0));
    if wide {
        return Reading::Unreadable(Unreadable::NotUtf8);
    }
    // A second byte order mark (the caller dropped the first): no parser
    // reads one, but a body that hides JSON behind marks is no accident.
    if utf8_bom(input) > 0 {
        return Reading::Unreadable(Unreadable::Malformed);
    }
    let first = input.iter().copied().find(|byte| !is_whitespace(*byte));
    if !matches!(first, Some(b'{' | b'[')) {
        return Reading::NotJsonRpc;
    }
    match read_messages(input, first == Some(b'[')) {
        Ok(peeked) => Reading::Read(peeked),
        Err(unreadable) => Reading::Unreadable(unreadable),
    }
}

/// At most this many keys of a message are compared pairwise; past them
/// (a client chooses how many keys it sends) a set keeps the cost linear.
const FEW_KEYS: usize = 8;

/// The decoded keys of one message so far, to refuse a key seen twice.
/// Keys are compared as the UTF-8 bytes of their decoded text.
struct Keys<'a> {
    /// The first keys, while each was written plainly (its bytes are its
    /// text).
    few: [&'a [u8]; FEW_KEYS],
    len: usize,
    /// Every key, once one was escaped or there are more than `FEW_KEYS`.
    many: Option<HashSet<Cow<'a, [u8]>>>,
}

impl<'a> Keys<'a> {
    fn new() -> Self {
        Self {
            few: [&[]; FEW_KEYS],
            len: 0,
            many: None,
        }
    }

    fn clear(&mut self) {
        self.len = 0;
        self.many = None;
    }

    /// Adds a key; `false` when the message already had it.
    fn insert(&mut self, key: Cow<'a, [u8]>) -> bool {
        if let (None, Cow::Borrowed(plain)) = (&self.many, &key) {
            if self.len < FEW_KEYS {
                if self.few[..self.len].contains(plain) {
                    return false;
                }
                self.few[self.len] = plain;
                self.len += 1;
                return true;
            }
        }
        let few = &self.few[..self.len];
        let many = self
            .many
            .get_or_insert_with(|| few.iter().copied().map(Cow::Borrowed).collect());
        many.insert(key)
    }
}

/// One message's members, as the scanner reports them: decodes every key,
/// refuses a key seen twice, and finds the values of the wanted keys.
struct Members<'a, const N: usize> {
    input: &'a [u8],
    /// Where a wanted key's value goes in `found`.
    slot: fn(&[u8]) -> Option<usize>,
    found: [Option<Range<usize>>; N],
    keys: Keys<'a>,
    /// The last key's token, and whether it holds an escape.
    key: Option<(Range<usize>, bool)>,
    value_start: usize,
    /// The first member that refused the message.
    refused: Option<Unreadable>,
}

impl<'a, const N: usize> Members<'a, N> {
    fn new(input: &'a [u8], slot: fn(&[u8]) -> Option<usize>) -> Self {
        Self {
            input,
            slot,
            found: std::array::from_fn(|_| None),
            keys: Keys::new(),
            key: None,
            value_start: 0,
            refused: None,
        }
    }

    /// A message opens.
    fn start(&mut self) {
        self.found = std::array::from_fn(|_| None);
        self.keys.clear();
        self.key = None;
        self.refused = None;
    }

    /// A key or value event of the message.
    fn event(&mut self, event: Found) {
        match event {
            Found::Key { token, escaped, .. } => self.key = Some((token, escaped)),
            Found::ValueStart(at) => self.value_start = at,
            Found::ValueEnd(end) => {
                if let Some((key, escaped)) = self.key.take() {
                    if self.refused.is_none() {
                        let value = self.value_start..end;
                        self.refused = self.member(key, escaped, value).err();
                    }
                }
            }
            Found::MessageStart(_) | Found::MessageEnd(_) | Found::OtherElement => {}
        }
    }

    // Out of line: the sink is called for every event, most of which only
    // note an offset.
    #[inline(never)]
    fn member(
        &mut self,
        key: Range<usize>,
        escaped: bool,
        value: Range<usize>,
    ) -> Result<(), Unreadable> {
        let key = key_text(&self.input[key], escaped)?;
        if let Some(slot) = (self.slot)(&key) {
            self.found[slot] = Some(value);
        }
        if !self.keys.insert(key) {
            return Err(Unreadable::DuplicateKey);
        }
        Ok(())
    }

    /// The message closed: the values of the wanted keys, by slot.
    fn end(&mut self) -> Result<[Option<Range<usize>>; N], Unreadable> {
        match self.refused.take() {
            Some(why) => Err(why),
            None => Ok(std::mem::replace(
                &mut self.found,
                std::array::from_fn(|_| None),
            )),
        }
    }
}

/// A key's decoded text, as UTF-8 bytes.
fn key_text(token: &[u8], escaped: bool) -> Result<Cow<'_, [u8]>, Unreadable> {
    if escaped {
        return serde_json::from_slice::<String>(token)
            .map(|text| Cow::Owned(text.into_bytes()))
            .map_err(|_| Unreadable::Malformed);
    }
    let text = &token[1..token.len() - 1];
    if is_utf8(text) {
        Ok(Cow::Borrowed(text))
    } else {
        Err(Unreadable::Malformed)
    }
}

/// Whether `bytes` are UTF-8; most texts the guard reads are ASCII, which
/// is cheaper to tell.
fn is_utf8(bytes: &[u8]) -> bool {
    bytes.is_ascii() || std::str::from_utf8(bytes).is_ok()
}

/// Reads a body's messages as the scanner finds them. The first message the
/// guard refuses decides the answer, unless the scanner refuses the text.
struct Messages<'a> {
    members: Members<'a, 5>,
    batch: bool,
    /// The message of a body that is no batch.
    single: Option<Message>,
    /// A batch's messages.
    messages: Vec<Message>,
    refused: Option<Unreadable>,
}

impl Sink for Messages<'_> {
    // Keys are decoded and compared in full.
    const NAMES: bool = false;

    #[inline(always)]
    fn event(&mut self, event: Found) {
        if self.refused.is_some() {
            return;
        }
        match event {
            Found::MessageStart(_) => self.members.start(),
            Found::MessageEnd(_) => self.message_end(),
            Found::OtherElement => self.push(Message {
                kind: Kind::Other,
                id: None,
                cancels: None,
                method: None,
                params: None,
            }),
            Found::Key { .. } | Found::ValueStart(_) | Found::ValueEnd(_) => {
                self.members.event(event)
            }
        }
    }
}

impl Messages<'_> {
    // Out of line, as `Members::member`: the sink is called for every
    // event, most of which only note an offset.
    #[inline(never)]
    fn message_end(&mut self) {
        match self
            .members
            .end()
            .and_then(|found| classify(self.members.input, found))
        {
            Ok(message) => self.push(message),
            Err(why) => self.refused = Some(why),
        }
    }

    fn push(&mut self, message: Message) {
        if self.batch {
            self.messages.push(message);
        } else {
            self.single = Some(message);
        }
    }
}

/// A JSON string token's decoded text as UTF-8 bytes, when serde_json reads
/// it (`None`: it refuses the token).
fn string_text(token: &[u8]) -> Option<Cow<'_, [u8]>> {
    if token.first() != Some(&b'"') {
        return None;
    }
    // Written without escapes, the text is the bytes between the quotes,
    // which serde_json takes when they hold no control character and are
    // UTF-8. Anything else is left to serde_json.
    if let Some(text) = plain_string(token) {
        return is_utf8(text).then_some(Cow::Borrowed(text));
    }
    serde_json::from_slice::<String>(token)
        .ok()
        .map(|text| Cow::Owned(text.into_bytes()))
}

/// Whether the token is an id servers agree on.
fn check_id(token: &[u8]) -> Result<(), Unreadable> {
    // The most common id, without from_utf8: its key is its text.
    if crate::wire::id::is_plain_integer(token) {
        return Ok(());
    }
    std::str::from_utf8(token)
        .ok()
        .and_then(crate::wire::id::key_of)
        .map(|_| ())
        .ok_or(Unreadable::Id)
}

/// Scans a whole JSON text into `sink`; returns whether it is a batch.
fn scan_whole(input: &[u8], sink: &mut impl Sink) -> Result<bool, Unreadable> {
    let mut scanner = Scanner::default();
    scanner
        .feed_into(input, sink)
        .and_then(|()| scanner.finish(sink))
        .map_err(|_| Unreadable::Malformed)?;
    Ok(scanner.is_batch())
}

/// Reads a JSON text whose first byte is `{` or `[` (`batch`).
fn read_messages(input: &[u8], batch: bool) -> Result<Peeked, Unreadable> {
    let mut body = Messages {
        members: Members::new(input, envelope_slot),
        batch,
        single: None,
        messages: Vec::new(),
        refused: None,
    };
    let scanned_batch = scan_whole(input, &mut body)?;
    debug_assert_eq!(scanned_batch, batch);
    if let Some(why) = body.refused {
        return Err(why);
    }
    if batch {
        return Ok(Peeked::Batch(body.messages));
    }
    body.single.map(Peeked::Single).ok_or(Unreadable::Malformed)
}

/// Where [`classify`] wants an envelope key's value.
fn envelope_slot(key: &[u8]) -> Option<usize> {
    match key {
        b"id" => Some(0),
        b"method" => Some(1),
        b"params" => Some(2),
        b"result" => Some(3),
        b"error" => Some(4),
        _ => None,
    }
}

fn classify(
    input: &[u8],
    [id, method, params, result, error]: [Option<Range<usize>>; 5],
) -> Result<Message, Unreadable> {
    let id = id.filter(|range| &input[range.clone()] != b"null");
    let method = method.filter(|range| input[range.start] == b'"');
    let method_text = match &method {
        Some(range) => Some(string_text(&input[range.clone()]).ok_or(Unreadable::Malformed)?),
        None => None,
    };
    // A `result` or `error` answers unless it is `null`: decided at the
    // value's first byte, as the restorer decides it (in JSON only `null`
    // starts with `n`), so the two read a malformed `nul…` alike.
    let answers = |range: Option<Range<usize>>| {
        range.is_some_and(|range| input.get(range.start) != Some(&b'n'))
    };
    let kind = match (&method_text, &id) {
        (Some(_), Some(_)) => Kind::Request,
        (Some(_), None) => Kind::Notification,
        (None, _) if answers(result) || answers(error) => Kind::Response,
        (None, _) => Kind::Other,
    };
    if kind == Kind::Request {
        if let Some(id) = &id {
            check_id(&input[id.clone()])?;
        }
    }
    let params = params.filter(|range| input[range.start] == b'{');
    let cancels = match (kind, method_text.as_deref(), &params) {
        (Kind::Notification, Some(CANCELLED), Some(params)) => {
            cancelled_request(input, params.clone())?
        }
        _ => None,
    };
    Ok(Message {
        kind,
        id,
        cancels,
        method,
        params: params.filter(|_| kind == Kind::Request),
    })
}

/// Reads the members of the one object a JSON text holds.
struct Object<'a, const N: usize> {
    members: Members<'a, N>,
    found: Option<Result<[Option<Range<usize>>; N], Unreadable>>,
}

impl<const N: usize> Sink for Object<'_, N> {
    const NAMES: bool = false;

    fn event(&mut self, event: Found) {
        match event {
            Found::MessageStart(_) => self.members.start(),
            Found::MessageEnd(_) => {
                if self.found.is_none() {
                    self.found = Some(self.members.end());
                }
            }
            Found::OtherElement => {}
            Found::Key { .. } | Found::ValueStart(_) | Found::ValueEnd(_) => {
                self.members.event(event)
            }
        }
    }
}

/// The value of the one key `slot` wants in the object at `object` in
/// `input`, in `input` coordinates.
fn member_of(
    input: &[u8],
    object: Range<usize>,
    slot: fn(&[u8]) -> Option<usize>,
) -> Result<Option<Range<usize>>, Unreadable> {
    let inner = &input[object.clone()];
    let mut members = Object {
        members: Members::new(inner, slot),
        found: None,
    };
    scan_whole(inner, &mut members)?;
    let Some(found) = members.found else {
        return Ok(None);
    };
    let [value] = found?;
    Ok(value.map(|value| object.start + value.start..object.start + value.end))
}

/// The `requestId` in a cancellation's `params` object (at `params` in
/// `input`), in `input` coordinates.
fn cancelled_request(
    input: &[u8],
    params: Range<usize>,
) -> Result<Option<Range<usize>>, Unreadable> {
    let request_id = member_of(input, params, |key| (key == b"requestId").then_some(0))?;
    let Some(request_id) = request_id.filter(|range| &input[range.clone()] != b"null") else {
        return Ok(None);
    };
    check_id(&input[request_id.clone()])?;
    Ok(Some(request_id))
}

/// A tool call's name: the decoded text of the string at `params.name` in a
/// request's `params` ([`Message::params`]), when it is one. Read only on
/// demand: it scans the whole `params`, arguments included.
pub(crate) fn tool_name(input: &[u8], params: Range<usize>) -> Option<Cow<'_, [u8]>> {
    let name = member_of(input, params, |key| (key == b"name").then_some(0)).ok()??;
    string_text(&input[name])
}

#[cfg(test)]
mod tests;
