//! Independent reading of the crate's documented rules, used as the fuzz
//! oracle: the collision key of an id, the self-describing server-side ids
//! and how to unwrap them, which messages of a body are JSON-RPC requests,
//! responses and cancellations, and where their ids sit. None of it calls
//! into the crate, except [`read`] for bodies that are not valid JSON: the
//! guard reads only a body's envelope, so what it makes of a broken payload
//! is defined by its reader alone (and checked against [`parse`] on every
//! valid body). Which valid bodies the guard must refuse ([`must_refuse`])
//! and how servers read the bytes they receive come from
//! [`readings`](super::readings), the differential half.

use std::borrow::Cow;
use std::fmt;
use std::ops::Range;

use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;

use super::readings;

/// The reserved prefix of server-side ids (crate docs, "Remapped ids").
pub const PREFIX: &str = "mcp-id-guard:";

/// JSON's four whitespace bytes.
pub fn is_json_whitespace(byte: u8) -> bool {
    matches!(byte, b' ' | b'\t' | b'\n' | b'\r')
}

/// The collision key of an id's JSON text by the documented equivalence
/// (crate `id` module docs, restated in [`readings::key`]): a string's
/// decoded text, a number's exact value (an integer as its decimal text).
/// An id with no key (servers read it differently) is keyed by its text:
/// the guard never tracks one, so the key only names it in messages.
pub fn id_key(raw: &str) -> String {
    readings::parse(raw.as_bytes(), readings::LAST_WINS)
        .as_ref()
        .and_then(readings::key)
        .unwrap_or_else(|| raw.to_owned())
}

/// Whether an id is in the reserved namespace (a string whose decoded text
/// starts with the prefix).
pub fn is_reserved(raw: &str) -> bool {
    raw.starts_with('"') && id_key(raw).starts_with(PREFIX)
}

/// If `raw` is a server-side id `"mcp-id-guard:<16 hex>:<digits>:<JSON>"`,
/// written as guards write them (the prefix spelled out literally), the
/// client's original id JSON text carried inside it.
pub fn restore(raw: &str) -> Option<String> {
    let literal = raw
        .strip_prefix('"')
        .is_some_and(|inside| inside.starts_with(PREFIX));
    if !literal {
        return None;
    }
    restore_decoded(raw)
}

/// Like [`restore`], but for any spelling of the string (`"\u006dcp-..."`
/// too): what a crate that decodes before it compares would restore.
pub fn restore_decoded(raw: &str) -> Option<String> {
    if !raw.starts_with('"') {
        return None;
    }
    let decoded: String = serde_json::from_str(raw).ok()?;
    // Guards mint only string and number ids, which hold no raw line break;
    // one that does could not stay inside an SSE data line.
    if decoded.contains(['\r', '\n']) {
        return None;
    }
    let rest = decoded.strip_prefix(PREFIX)?;
    let (tag, rest) = rest.split_once(':')?;
    let (serial, original) = rest.split_once(':')?;
    if tag.len() != 16 || !tag.bytes().all(|byte| byte.is_ascii_hexdigit()) {
        return None;
    }
    if serial.is_empty() || !serial.bytes().all(|byte| byte.is_ascii_digit()) {
        return None;
    }
    let bytes = original.as_bytes();
    let padded = bytes.first().is_none_or(|b| is_json_whitespace(*b))
        || bytes.last().is_none_or(|b| is_json_whitespace(*b));
    if padded || serde_json::from_str::<IgnoredAny>(original).is_err() {
        return None;
    }
    Some(original.to_owned())
}

/// What one JSON-RPC message is (crate docs, "What is tracked").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A string `method` and a non-null `id`.
    Request,
    /// A string `method`, no id (or `null`).
    Notification,
    /// No `method`, a non-null `result` or `error`.
    Response,
    /// Anything else.
    Other,
}

/// One message of a body, with byte ranges into the whole body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// Its kind.
    pub kind: Kind,
    /// The top-level `id` token (absent or `null`: `None`).
    pub id: Option<Range<usize>>,
    /// For `notifications/cancelled`, the `params.requestId` token.
    pub cancels: Option<Range<usize>>,
}

/// A body read as JSON-RPC.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Body {
    /// One object.
    Single(Message),
    /// An array; one entry per element (non-objects are `Kind::Other`).
    Batch(Vec<Message>),
}

impl Body {
    /// The messages in order.
    pub fn messages(&self) -> &[Message] {
        match self {
            Body::Single(message) => std::slice::from_ref(message),
            Body::Batch(messages) => messages,
        }
    }

    /// Whether it is an array.
    pub fn is_batch(&self) -> bool {
        matches!(self, Body::Batch(_))
    }

    /// The id ranges of the requests, in order.
    pub fn request_ids(&self) -> Vec<Range<usize>> {
        self.messages()
            .iter()
            .filter(|message| message.kind == Kind::Request)
            .filter_map(|message| message.id.clone())
            .collect()
    }
}

/// The envelope fields: `id`, `method` and `params` borrowed as raw JSON,
/// `result` and `error` only checked for presence (a `null` one is absent),
/// every other key skipped. A repeated envelope key makes the object
/// unreadable, as it is for serde.
#[derive(Default)]
struct Envelope<'a> {
    id: Option<&'a RawValue>,
    method: Option<&'a RawValue>,
    params: Option<&'a RawValue>,
    result: bool,
    error: bool,
}

struct EnvelopeVisitor;

impl<'de> Visitor<'de> for EnvelopeVisitor {
    type Value = Envelope<'de>;

    fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut envelope = Envelope::default();
        let mut seen = [false; 5];
        while let Some(key) = map.next_key::<Cow<'de, str>>()? {
            let slot = ["id", "method", "params", "result", "error"]
                .iter()
                .position(|name| *name == key);
            let Some(slot) = slot else {
                map.next_value::<IgnoredAny>()?;
                continue;
            };
            if std::mem::replace(&mut seen[slot], true) {
                return Err(de::Error::custom("duplicate envelope key"));
            }
            match slot {
                0 => envelope.id = map.next_value()?,
                1 => envelope.method = map.next_value()?,
                2 => envelope.params = map.next_value()?,
                3 => envelope.result = map.next_value::<Option<IgnoredAny>>()?.is_some(),
                _ => envelope.error = map.next_value::<Option<IgnoredAny>>()?.is_some(),
            }
        }
        Ok(envelope)
    }
}

impl<'de> de::Deserialize<'de> for Envelope<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(EnvelopeVisitor)
    }
}

/// `params.requestId` of a cancellation. Like a serde-derived struct, it
/// reads an object (the `requestId` key) or a one-element array.
struct CancelParams<'a>(Option<&'a RawValue>);

struct CancelVisitor;

impl<'de> Visitor<'de> for CancelVisitor {
    type Value = CancelParams<'de>;

    fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("cancellation params")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut request_id = None;
        let mut seen = false;
        while let Some(key) = map.next_key::<Cow<'de, str>>()? {
            if key != "requestId" {
                map.next_value::<IgnoredAny>()?;
                continue;
            }
            if std::mem::replace(&mut seen, true) {
                return Err(de::Error::custom("duplicate requestId"));
            }
            request_id = map.next_value()?;
        }
        Ok(CancelParams(request_id))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let request_id = seq.next_element::<Option<&'de RawValue>>()?.flatten();
        Ok(CancelParams(request_id))
    }
}

impl<'de> de::Deserialize<'de> for CancelParams<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_struct("CancelParams", &["requestId"], CancelVisitor)
    }
}

/// Who wrote a body: the guard trusts the inner server's messages more.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Writer {
    /// A client (request bodies).
    Client,
    /// The inner server (responses, SSE event data).
    Server,
}

/// How the guard reads a body (crate docs, "What the guard reads"): a valid
/// JSON body as [`parse`] reads it; a body that is not valid JSON may be
/// taken at its envelope (the top-level keys around the payload), as the
/// crate's reader finds it. Panics when the crate reads a valid body
/// differently from [`parse`], except for a server's message with both a
/// `method` and a `result` or `error`, which no server writes and which the
/// crate may take as a response.
pub fn read(input: &[u8], writer: Writer) -> Option<Body> {
    let from_crate = mcp_id_guard::internals::read_body(input, writer == Writer::Server).map(
        |(batch, messages)| {
            let messages: Vec<Message> = messages
                .into_iter()
                .map(|message| Message {
                    kind: match message.kind {
                        "request" => Kind::Request,
                        "notification" => Kind::Notification,
                        "response" => Kind::Response,
                        _ => Kind::Other,
                    },
                    id: message.id,
                    cancels: message.cancels,
                })
                .collect();
            if batch {
                Body::Batch(messages)
            } else {
                Body::Single(messages.into_iter().next().expect("one message"))
            }
        },
    );
    if writer == Writer::Client {
        if let Some(why) = must_refuse(input) {
            assert_eq!(
                from_crate,
                None,
                "the guard reads a body servers read differently ({why})\n  body: {:?}",
                String::from_utf8_lossy(input)
            );
            return None;
        }
    }
    // Not valid JSON (serde skips the UTF-8 check in strings it ignores):
    // the guard's reader alone decides what it makes of it.
    if readings::parse(input, SYNTAX).is_none() {
        return from_crate;
    }
    let Some(parsed) = parse(input) else {
        return from_crate;
    };
    // A top-level key or a `method` holding a lone surrogate escape does not
    // decode to a Rust string: the guard reads no message in such a body
    // (the request path refuses it as malformed; see `request_path`).
    if from_crate.is_none() && undecodable_envelope(input) {
        return None;
    }
    if from_crate.as_ref() != Some(&parsed) {
        let text = String::from_utf8_lossy(input);
        let both = text.contains("\"method\"")
            && (text.contains("\"result\"") || text.contains("\"error\""));
        let ambiguous = writer == Writer::Server && must_refuse(input).is_some();
        assert!(
            writer == Writer::Server && (both || ambiguous),
            "the guard reads a valid body differently\n  body:   {text:?}\n  guard:  {from_crate:?}\n  oracle: {parsed:?}"
        );
        return from_crate;
    }
    Some(parsed)
}

/// Syntax only: RFC 8259 JSON in UTF-8, lone surrogate escapes allowed (the
/// grammar has them), repeated keys kept.
pub const SYNTAX: readings::Dialect = readings::Dialect {
    name: "syntax",
    duplicates: readings::Duplicates::Last,
    lone_surrogates: true,
    max_depth: usize::MAX,
    ..readings::STRICT
};

/// Why the guard must refuse a valid JSON body (and not forward it) under
/// the fail-closed rule, the first of [`refusal_reasons`].
pub fn must_refuse(input: &[u8]) -> Option<&'static str> {
    refusal_reasons(input).first().copied()
}

/// Every reason a valid JSON body has to be refused: a key twice in a
/// message or in a cancellation's `params` (servers keep the first, the
/// last, or refuse), or a request or cancellation id servers read
/// differently (no documented key). Empty when the body is not valid JSON
/// (the guard's reader alone decides what it makes of that) or has none.
pub fn refusal_reasons(input: &[u8]) -> Vec<&'static str> {
    let mut reasons = Vec::new();
    let Some(value) = readings::parse(input, SYNTAX) else {
        return reasons;
    };
    let elements = elements(&value);
    let params_key: Vec<u16> = "params".encode_utf16().collect();
    for element in elements {
        let readings::Value::Object(members) = element else {
            continue;
        };
        if readings::has_repeated_key(members) {
            reasons.push("a key twice in a message");
            continue;
        }
        // No repeated key: every reading sees this message alike.
        let Some(seen) = readings::message(members, readings::LAST_WINS) else {
            continue;
        };
        if seen
            .id
            .as_ref()
            .is_some_and(|id| readings::key(id).is_none())
        {
            reasons.push("an id servers read differently");
        }
        let is_cancellation = seen.kind == readings::Kind::Notification
            && seen.method.as_deref() == Some("notifications/cancelled");
        let params = members.iter().find(|(key, _)| *key == params_key);
        if let (true, Some((_, readings::Value::Object(params)))) = (is_cancellation, params) {
            if readings::has_repeated_key(params) {
                reasons.push("a key twice in a cancellation's params");
            }
        }
        if seen
            .cancels
            .as_ref()
            .is_some_and(|id| readings::key(id).is_none())
        {
            reasons.push("a cancelled id servers read differently");
        }
    }
    reasons
}

/// The top-level value's elements, as messages are looked for in them: a
/// batch's, the one object, or none.
fn elements(value: &readings::Value) -> &[readings::Value] {
    match value {
        readings::Value::Array(elements) => elements.as_slice(),
        object @ readings::Value::Object(_) => std::slice::from_ref(object),
        _ => &[],
    }
}

/// Whether a message of the body has a key, or a `method` string, that
/// holds a lone surrogate escape (grammatical JSON that does not decode to
/// Unicode text).
fn undecodable_envelope(input: &[u8]) -> bool {
    let Some(value) = readings::parse(input, SYNTAX) else {
        return false;
    };
    let method: Vec<u16> = "method".encode_utf16().collect();
    elements(&value).iter().any(|element| {
        let readings::Value::Object(members) = element else {
            return false;
        };
        members.iter().any(|(key, value)| {
            String::from_utf16(key).is_err()
                || (*key == method
                    && matches!(value, readings::Value::String(units) if String::from_utf16(units).is_err()))
        })
    })
}

/// Reads a body as JSON-RPC; `None` when it is not one JSON object or array.
pub fn parse(input: &[u8]) -> Option<Body> {
    let first = input.iter().find(|byte| !byte.is_ascii_whitespace())?;
    match first {
        b'{' => {
            let envelope: Envelope<'_> = serde_json::from_slice(input).ok()?;
            Some(Body::Single(classify(input, &envelope)))
        }
        b'[' => {
            let elements: Vec<&RawValue> = serde_json::from_slice(input).ok()?;
            let other = Message {
                kind: Kind::Other,
                id: None,
                cancels: None,
            };
            let messages = elements
                .into_iter()
                .map(|element| {
                    if !element.get().starts_with('{') {
                        return other.clone();
                    }
                    match serde_json::from_str::<Envelope<'_>>(element.get()) {
                        Ok(envelope) => classify(input, &envelope),
                        Err(_) => other.clone(),
                    }
                })
                .collect();
            Some(Body::Batch(messages))
        }
        _ => None,
    }
}

fn classify(input: &[u8], envelope: &Envelope<'_>) -> Message {
    let id = envelope.id.map(|raw| range_in(input, raw.get()));
    let kind = match envelope.method {
        Some(method) if method.get().starts_with('"') => match id {
            Some(_) => Kind::Request,
            None => Kind::Notification,
        },
        Some(_) => Kind::Other,
        None if envelope.result || envelope.error => Kind::Response,
        None => Kind::Other,
    };
    let cancels = match (kind, envelope.method, envelope.params) {
        // Positional params (`[id]`) are not read as a cancellation: the
        // guard reads only a `params` object (noted for the lead: a serde
        // struct would take `[id]` positionally).
        (Kind::Notification, Some(method), Some(params))
            if params.get().starts_with('{')
                && serde_json::from_str::<String>(method.get()).ok().as_deref()
                    == Some("notifications/cancelled") =>
        {
            serde_json::from_str::<CancelParams<'_>>(params.get())
                .ok()
                .and_then(|params| params.0)
                .map(|raw| range_in(input, raw.get()))
        }
        _ => None,
    };
    Message { kind, id, cancels }
}

/// The range of `part`, a sub-slice of `whole`.
fn range_in(whole: &[u8], part: &str) -> Range<usize> {
    let start = part.as_ptr() as usize - whole.as_ptr() as usize;
    assert!(start + part.len() <= whole.len(), "not a sub-slice");
    start..start + part.len()
}

/// The JSON value token at the start of `bytes` and its length, if one
/// starts there.
pub fn token_at(bytes: &[u8]) -> Option<(&str, usize)> {
    let mut stream = serde_json::Deserializer::from_slice(bytes).into_iter::<&RawValue>();
    let value = stream.next()?.ok()?;
    let end = stream.byte_offset();
    let text = value.get();
    // The token must start right here, with no whitespace before it.
    (bytes.get(..text.len()) == Some(text.as_bytes())).then_some((text, end.min(text.len())))
}

/// Splits a whole SSE stream into complete events (each with its
/// terminating blank line) and the unterminated rest. Lines end with CRLF,
/// LF or CR; at the end of the stream a final CR ends a line.
pub fn sse_events(stream: &[u8]) -> (Vec<&[u8]>, &[u8]) {
    let mut events = Vec::new();
    let mut event_start = 0;
    let mut line_start = 0;
    let mut position = 0;
    while position < stream.len() {
        let byte = stream[position];
        if byte != b'\r' && byte != b'\n' {
            position += 1;
            continue;
        }
        let terminator = if byte == b'\r' && stream.get(position + 1) == Some(&b'\n') {
            2
        } else {
            1
        };
        let next = position + terminator;
        if position == line_start {
            events.push(&stream[event_start..next]);
            event_start = next;
        }
        line_start = next;
        position = next;
    }
    (events, &stream[event_start..])
}

/// The lines of a complete event, without terminators.
pub fn sse_lines(event: &[u8]) -> Vec<&[u8]> {
    let mut lines = Vec::new();
    let mut start = 0;
    let mut position = 0;
    while position < event.len() {
        match event[position] {
            b'\r' => {
                lines.push(&event[start..position]);
                position += if event.get(position + 1) == Some(&b'\n') {
                    2
                } else {
                    1
                };
                start = position;
            }
            b'\n' => {
                lines.push(&event[start..position]);
                position += 1;
                start = position;
            }
            _ => position += 1,
        }
    }
    if start < event.len() {
        lines.push(&event[start..]);
    }
    lines
}

/// One event as a client reads it: its data lines joined by LF (`None`: no
/// data line). Other lines are returned as they are.
pub struct SseEvent<'a> {
    /// The joined data.
    pub data: Option<Vec<u8>>,
    /// Every line that is not a `data` line.
    pub other_lines: Vec<&'a [u8]>,
}

/// Reads a complete event as the SSE spec does.
pub fn sse_event(event: &[u8]) -> SseEvent<'_> {
    let mut parsed = SseEvent {
        data: None,
        other_lines: Vec::new(),
    };
    for line in sse_lines(event) {
        let (field, value) = match line.iter().position(|byte| *byte == b':') {
            Some(0) => {
                parsed.other_lines.push(line);
                continue;
            }
            Some(colon) => {
                let value = &line[colon + 1..];
                (&line[..colon], value.strip_prefix(b" ").unwrap_or(value))
            }
            None => (line, &b""[..]),
        };
        if field == b"data" {
            let data = parsed.data.get_or_insert_with(Vec::new);
            data.extend_from_slice(value);
            data.push(b'\n');
        } else {
            parsed.other_lines.push(line);
        }
    }
    if let Some(data) = &mut parsed.data {
        data.pop();
    }
    parsed
}
