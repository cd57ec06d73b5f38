//! The one JSON-RPC envelope peeker, shared by the request path (find requests and
//! their ids) and the response path (find responses whose ids need restoring).
//!
//! It borrows: ids are located as byte ranges of the input, so callers can
//! splice replacement bytes at exact offsets ([`crate::edit`]) without
//! re-serializing a message.
//! It reads in two steps (see [`peek`]): the envelope's top-level keys from
//! either end of a single object, which settles almost every message without
//! touching its payload, and otherwise a whole serde_json parse with borrowed
//! `&RawValue`s.
//!
//! # What it reads
//! Only a message's envelope: its top-level keys, from the front up to the
//! first object or array value (`params`, `result`) and, when that does not
//! settle the message, from the back. So it finds `id` without reading the
//! payload, at any body size, whether a library writes `id` first (rmcp, the
//! Python SDK's responses) or last (the TypeScript SDK). The payload is not
//! validated. Bodies the envelope does not settle (an escaped key, a
//! notification with a payload, `notifications/cancelled`, a client's
//! response, a batch) are parsed whole. A duplicated envelope key (`id`,
//! `method`, `params`, `result`, `error`) seen either way makes a body
//! unreadable. From the inner server, an `id` with a `result` or `error` read
//! before any `method` is a response.

use std::ops::Range;

use serde::de::IgnoredAny;
use serde::Deserialize;
use serde_json::value::RawValue;

/// What one JSON-RPC message in a body is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// An object with a string `method` and a non-null `id`.
    Request,
    /// An object with a string `method` and no (or a null) `id`.
    Notification,
    /// An object with `result` or `error` and no `method`.
    Response,
    /// Anything else (not a JSON-RPC message we act on).
    Other,
}

/// One message of a body: its kind and where its top-level `id` token sits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Message {
    pub(crate) kind: Kind,
    /// Byte range of the `id` value's JSON text inside the peeked input,
    /// `None` when the message has no id or `id` is `null`.
    pub(crate) id: Option<Range<usize>>,
    /// For a `notifications/cancelled`, the byte range of `params.requestId`
    /// (absent or `null`: `None`).
    pub(crate) cancels: Option<Range<usize>>,
}

/// The shape of a peeked body.
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
    /// was peeked from) and its JSON text.
    pub(crate) fn request_ids<'a>(
        &self,
        input: &'a [u8],
    ) -> impl Iterator<Item = (Range<usize>, &'a str)> + use<'_, 'a> {
        self.messages()
            .iter()
            .filter(|message| message.kind == Kind::Request)
            .filter_map(move |message| {
                let range = message.id.clone()?;
                // The peeker only hands out ranges of valid JSON tokens,
                // which are UTF-8.
                let text = std::str::from_utf8(&input[range.clone()]).ok()?;
                Some((range, text))
            })
    }

    /// The `params.requestId` of each `notifications/cancelled`, in order:
    /// where it sits in `input` and its JSON text.
    pub(crate) fn cancelled_ids<'a>(
        &self,
        input: &'a [u8],
    ) -> impl Iterator<Item = (Range<usize>, &'a str)> + use<'_, 'a> {
        self.messages().iter().filter_map(move |message| {
            let range = message.cancels.clone()?;
            let text = std::str::from_utf8(&input[range.clone()]).ok()?;
            Some((range, text))
        })
    }
}

/// The fields of a JSON-RPC envelope we look at; everything else (notably
/// `params` and `result`) is skipped without allocating.
#[derive(Deserialize)]
struct RawEnvelope<'a> {
    #[serde(borrow, default)]
    id: Option<&'a RawValue>,
    #[serde(borrow, default)]
    method: Option<&'a RawValue>,
    #[serde(borrow, default)]
    params: Option<&'a RawValue>,
    #[serde(default)]
    result: Option<IgnoredAny>,
    #[serde(default)]
    error: Option<IgnoredAny>,
}

/// The part of `notifications/cancelled` params we look at.
#[derive(Deserialize)]
struct CancelParams<'a> {
    #[serde(borrow, default, rename = "requestId")]
    request_id: Option<&'a RawValue>,
}

/// The method whose `params.requestId` names a request to cancel.
const CANCELLED: &str = "\"notifications/cancelled\"";

/// Peeks at a body written by `writer`. Returns `None` when it is not JSON
/// the guard can read as JSON-RPC: not an object or array, not valid JSON (as
/// far as it was read), or an object with duplicate envelope keys.
///
/// A single object is read by its top-level keys only, from the front until
/// the first object or array value (`params`, `result`) and, when that does
/// not decide the message, from the back: whatever order a JSON-RPC library
/// writes `id` in (rmcp writes it first, the TypeScript SDK last), a request
/// or response is found without reading its payload, at any size. The rest of
/// the body is not validated: that is the server's job, and it answers an
/// invalid body with its own parse error. Bodies this cannot decide (an
/// escaped key, a notification with a payload, `notifications/cancelled`, a
/// client's response, batches) are parsed whole with serde_json. Deep nesting
/// inside skipped values is fine: neither path recurses into them.
pub(crate) fn peek(input: &[u8], writer: Writer) -> Option<Peeked> {
    let open = input.iter().position(|byte| !byte.is_ascii_whitespace())?;
    if input[open] == b'{' {
        if let Some(message) = peek_object(input, open, writer) {
            return Some(Peeked::Single(message));
        }
    }
    parse_whole(input, open)
}

/// The full parse: validates the whole body with serde_json.
fn parse_whole(input: &[u8], open: usize) -> Option<Peeked> {
    match input[open] {
        b'{' => {
            let envelope: RawEnvelope<'_> = serde_json::from_slice(input).ok()?;
            Some(Peeked::Single(classify(input, &envelope)))
        }
        b'[' => {
            let elements: Vec<&RawValue> = serde_json::from_slice(input).ok()?;
            let messages = elements
                .into_iter()
                .map(|element| classify_raw(input, element))
                .collect();
            Some(Peeked::Batch(messages))
        }
        _ => None,
    }
}

fn classify_raw(input: &[u8], element: &RawValue) -> Message {
    // serde's derived struct visitor also accepts a JSON array (fields by
    // position); only objects are JSON-RPC messages.
    let parsed = element
        .get()
        .starts_with('{')
        .then(|| serde_json::from_str::<RawEnvelope<'_>>(element.get()).ok())
        .flatten();
    match parsed {
        Some(envelope) => classify(input, &envelope),
        None => Message {
            kind: Kind::Other,
            id: None,
            cancels: None,
        },
    }
}

fn classify(input: &[u8], envelope: &RawEnvelope<'_>) -> Message {
    // `Option<&RawValue>` deserializes JSON `null` as `None`, so a present id
    // here is never null.
    let id = envelope.id.map(|raw| offset_in(input, raw.get()));
    let kind = match envelope.method {
        Some(method) if method.get().starts_with('"') => {
            if id.is_some() {
                Kind::Request
            } else {
                Kind::Notification
            }
        }
        Some(_) => Kind::Other,
        None if envelope.result.is_some() || envelope.error.is_some() => Kind::Response,
        None => Kind::Other,
    };
    // Methods are plain ASCII in practice; an escaped spelling is not a
    // cancellation we act on (it still reaches the server unchanged).
    let cancels = match (kind, envelope.method, envelope.params) {
        (Kind::Notification, Some(method), Some(params)) if method.get() == CANCELLED => {
            serde_json::from_str::<CancelParams<'_>>(params.get())
                .ok()
                .and_then(|params| params.request_id)
                .map(|request_id| offset_in(input, request_id.get()))
        }
        _ => None,
    };
    Message { kind, id, cancels }
}

/// Where `part` (a borrowed sub-slice of `whole`) starts and ends inside `whole`.
fn offset_in(whole: &[u8], part: &str) -> Range<usize> {
    let start = part.as_ptr() as usize - whole.as_ptr() as usize;
    debug_assert!(start + part.len() <= whole.len());
    start..start + part.len()
}

/// Who wrote a body, which decides how much of it the peeker must read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Writer {
    /// A client: a message counts as a request only if the envelope says so
    /// (an `id` and a string `method`); concluding that a key is *absent*
    /// needs every top-level key to have been read.
    Client,
    /// The inner server, which the guard fronts and trusts to write
    /// well-formed messages: an `id` with a `result` or `error` is a
    /// response without reading the rest.
    Server,
}

/// The envelope keys the peeker acts on. A second occurrence of any of them
/// makes the body ambiguous (serde refuses it; other parsers keep the first
/// or the last), so the fast path hands such a body to the full parse.
#[derive(Debug, Default)]
struct EnvelopeKeys {
    /// `Some(None)`: `"id": null`.
    id: Option<Option<Range<usize>>>,
    /// The method's JSON string token, when it is a plain (unescaped) string.
    method: Option<Range<usize>>,
    result_or_error: bool,
    seen: u8,
}

impl EnvelopeKeys {
    const ID: u8 = 1;
    const METHOD: u8 = 2;
    const PARAMS: u8 = 4;
    const RESULT: u8 = 8;
    const ERROR: u8 = 16;

    /// Records key `name` with its value at `value` (a scalar token, or the
    /// start of an object or array when `container`). `None` when the key was
    /// seen before or its value is not one the fast path can take.
    fn record(
        &mut self,
        input: &[u8],
        name: &[u8],
        value: Range<usize>,
        container: bool,
    ) -> Option<()> {
        let bit = match name {
            b"id" => Self::ID,
            b"method" => Self::METHOD,
            b"params" => Self::PARAMS,
            b"result" => Self::RESULT,
            b"error" => Self::ERROR,
            _ => return Some(()),
        };
        if self.seen & bit != 0 {
            return None;
        }
        self.seen |= bit;
        match bit {
            Self::ID => {
                if container {
                    return None;
                }
                let token = &input[value.clone()];
                if token == b"null" {
                    self.id = Some(None);
                } else {
                    // One well-formed JSON value, so its range is UTF-8 that
                    // later steps can read as an id.
                    if !is_plain_id(token) {
                        serde_json::from_slice::<&RawValue>(token).ok()?;
                    }
                    self.id = Some(Some(value));
                }
            }
            Self::METHOD => {
                let token = &input[value.clone()];
                // A method that is not a plain string (escaped, or another
                // type) is left to the full parse and its exact rules.
                if container || token.len() < 2 || token[0] != b'"' || token.contains(&b'\\') {
                    return None;
                }
                self.method = Some(value);
            }
            Self::PARAMS => {}
            // As in the full parse, a `null` result or error is no answer.
            _ => self.result_or_error |= container || &input[value] != b"null",
        }
        Some(())
    }

    /// The message, if what has been read decides it. `complete`: every
    /// top-level key has been read.
    fn decide(&self, input: &[u8], writer: Writer, complete: bool) -> Option<Message> {
        let id = self.id.clone().flatten();
        let message = |kind, id| Message {
            kind,
            id,
            cancels: None,
        };
        match (&self.method, id) {
            (Some(_), Some(id)) => Some(message(Kind::Request, Some(id))),
            // `notifications/cancelled` needs `params.requestId`: full parse.
            (Some(method), None) if complete && &input[method.clone()] != CANCELLED.as_bytes() => {
                Some(message(Kind::Notification, None))
            }
            (None, Some(id)) if self.result_or_error && (complete || writer == Writer::Server) => {
                Some(message(Kind::Response, Some(id)))
            }
            _ => None,
        }
    }
}

/// Whether `token` is obviously one valid JSON value the way ids usually are:
/// an integer, or a string of printable ASCII without escapes. Anything else
/// is checked by serde_json.
fn is_plain_id(token: &[u8]) -> bool {
    match token {
        [b'"', inside @ .., b'"'] => inside
            .iter()
            .all(|byte| (b' '..=b'~').contains(byte) && *byte != b'"' && *byte != b'\\'),
        _ => {
            let digits = token.strip_prefix(b"-").unwrap_or(token);
            match digits {
                [b'0'] => true,
                [b'1'..=b'9', rest @ ..] => rest.iter().all(u8::is_ascii_digit),
                _ => false,
            }
        }
    }
}

/// Where the forward read of the top-level keys ended.
enum Forward {
    /// At the object's closing brace; the offset just after it.
    Complete(usize),
    /// At the first object or array value (`params`, `result`, ...).
    Stopped,
}

fn is_whitespace(byte: u8) -> bool {
    matches!(byte, b' ' | b'\t' | b'\n' | b'\r')
}

/// The first offset at or after `at` that is not JSON whitespace.
fn skip_whitespace(input: &[u8], mut at: usize) -> usize {
    while input.get(at).copied().is_some_and(is_whitespace) {
        at += 1;
    }
    at
}

/// `end` moved back over JSON whitespace.
fn trim_whitespace_end(input: &[u8], mut end: usize) -> usize {
    while end > 0 && is_whitespace(input[end - 1]) {
        end -= 1;
    }
    end
}

/// The end of the string token whose opening quote is at `start`, and whether
/// it holds escapes.
fn string_end(input: &[u8], start: usize) -> Option<(usize, bool)> {
    let mut at = start + 1;
    let mut escaped = false;
    loop {
        let hit = at + memchr::memchr2(b'"', b'\\', input.get(at..)?)?;
        if input[hit] == b'"' {
            return Some((hit + 1, escaped));
        }
        escaped = true;
        at = hit + 2;
    }
}

/// The end of the number or literal token starting at `start`.
fn scalar_end(input: &[u8], start: usize) -> Option<usize> {
    let mut end = start;
    while input
        .get(end)
        .is_some_and(|byte| !is_whitespace(*byte) && !b",:{}[]\"".contains(byte))
    {
        end += 1;
    }
    (end > start).then_some(end)
}

/// The opening quote of the string token whose closing quote is at `end - 1`.
/// Inside a string a quote is escaped by an odd run of backslashes.
fn string_start(input: &[u8], end: usize) -> Option<usize> {
    let mut before = end - 1;
    loop {
        let quote = memchr::memrchr(b'"', &input[..before])?;
        let backslashes = input[..quote]
            .iter()
            .rev()
            .take_while(|byte| **byte == b'\\')
            .count();
        if backslashes % 2 == 0 {
            return Some(quote);
        }
        before = quote;
    }
}

/// The start of the number or literal token ending at `end`.
fn scalar_start(input: &[u8], end: usize) -> usize {
    let mut start = end;
    while start > 0 && !is_whitespace(input[start - 1]) && !b",:{}[]\"".contains(&input[start - 1])
    {
        start -= 1;
    }
    start
}

/// Reads top-level keys from the object's opening brace at `open`, up to its
/// first object or array value.
fn scan_forward(input: &[u8], open: usize, keys: &mut EnvelopeKeys) -> Option<Forward> {
    let mut at = skip_whitespace(input, open + 1);
    if input.get(at) == Some(&b'}') {
        return Some(Forward::Complete(at + 1));
    }
    loop {
        if input.get(at) != Some(&b'"') {
            return None;
        }
        let (key_end, escaped) = string_end(input, at)?;
        if escaped {
            return None;
        }
        let name = &input[at + 1..key_end - 1];
        at = skip_whitespace(input, key_end);
        if input.get(at) != Some(&b':') {
            return None;
        }
        at = skip_whitespace(input, at + 1);
        let end = match *input.get(at)? {
            b'{' | b'[' => {
                keys.record(input, name, at..at, true)?;
                return Some(Forward::Stopped);
            }
            b'"' => string_end(input, at)?.0,
            _ => scalar_end(input, at)?,
        };
        keys.record(input, name, at..end, false)?;
        at = skip_whitespace(input, end);
        match input.get(at) {
            Some(b',') => at = skip_whitespace(input, at + 1),
            Some(b'}') => return Some(Forward::Complete(at + 1)),
            _ => return None,
        }
    }
}

/// Reads top-level keys back from the object's closing brace (the body's last
/// non-whitespace byte, at `close`), up to the last object or array value.
/// `Some(true)` when it reached the opening brace at `open`: every key read.
fn scan_backward(input: &[u8], open: usize, close: usize, keys: &mut EnvelopeKeys) -> Option<bool> {
    let mut end = trim_whitespace_end(input, close);
    loop {
        let last = *input.get(end.checked_sub(1)?)?;
        let start = match last {
            b'}' | b']' => return Some(false),
            b'"' => string_start(input, end)?,
            _ => scalar_start(input, end),
        };
        if start == end {
            return None;
        }
        let colon = trim_whitespace_end(input, start);
        if colon == 0 || input[colon - 1] != b':' {
            return None;
        }
        let key_end = trim_whitespace_end(input, colon - 1);
        if key_end == 0 || input[key_end - 1] != b'"' {
            return None;
        }
        let key_start = memchr::memrchr(b'"', &input[..key_end - 1])?;
        let name = &input[key_start + 1..key_end - 1];
        // A key with escapes (an escaped quote would end the search early)
        // is left to the full parse.
        if name.contains(&b'\\') || input[..key_start].last() == Some(&b'\\') {
            return None;
        }
        keys.record(input, name, start..end, false)?;
        end = trim_whitespace_end(input, key_start);
        match input.get(end.checked_sub(1)?) {
            Some(b',') => end = trim_whitespace_end(input, end - 1),
            // Only the top-level opening brace ends the read; any other means
            // the body is not the object it looked like.
            Some(b'{') => return (end - 1 == open).then_some(true),
            _ => return None,
        }
    }
}

/// The fast path for a single object: reads the top-level keys from the
/// front up to the first object or array value and, when that does not decide
/// the message, from the back. `None` hands the body to the full parse.
fn peek_object(input: &[u8], open: usize, writer: Writer) -> Option<Message> {
    let close = trim_whitespace_end(input, input.len()).checked_sub(1)?;
    if input[close] != b'}' {
        return None;
    }
    let mut keys = EnvelopeKeys::default();
    match scan_forward(input, open, &mut keys)? {
        Forward::Complete(after) => {
            if after != close + 1 {
                return None;
            }
            keys.decide(input, writer, true)
        }
        Forward::Stopped => keys.decide(input, writer, false).or_else(|| {
            let complete = scan_backward(input, open, close, &mut keys)?;
            keys.decide(input, writer, complete)
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn single(input: &str) -> Message {
        match peek(input.as_bytes(), Writer::Client) {
            Some(Peeked::Single(message)) => message,
            other => panic!("expected a single message, got {other:?}"),
        }
    }

    #[test]
    fn finds_request_id_offsets() {
        let body = r#"{"jsonrpc":"2.0","id": "a\"b" ,"method":"x","params":{"id":9}}"#;
        let message = single(body);
        assert_eq!(message.kind, Kind::Request);
        assert_eq!(&body[message.id.unwrap()], r#""a\"b""#);
    }

    #[test]
    fn kinds() {
        assert_eq!(single(r#"{"method":"n"}"#).kind, Kind::Notification);
        assert_eq!(
            single(r#"{"method":"n","id":null}"#).kind,
            Kind::Notification
        );
        assert_eq!(single(r#"{"id":1,"result":{}}"#).kind, Kind::Response);
        assert_eq!(
            single(r#"{"id":1,"error":{"code":1}}"#).kind,
            Kind::Response
        );
        assert_eq!(single(r#"{"id":1,"method":7}"#).kind, Kind::Other);
        assert_eq!(single(r#"{"id":1}"#).kind, Kind::Other);
    }

    #[test]
    fn rejects_non_json_and_duplicate_keys() {
        assert_eq!(peek(b"", Writer::Client), None);
        assert_eq!(peek(b"{", Writer::Client), None);
        assert_eq!(peek(b"12", Writer::Client), None);
        assert_eq!(peek(br#"" {}""#, Writer::Client), None);
        assert_eq!(
            peek(br#"{"id":1,"id":2,"method":"x"}"#, Writer::Client),
            None
        );
    }

    #[test]
    fn batch_offsets_point_into_the_whole_body() {
        let body = r#"[{"id":1,"method":"a"}, [2,"m"], {"method":"n"}, {"id":"z","result":1}]"#;
        let Some(Peeked::Batch(messages)) = peek(body.as_bytes(), Writer::Client) else {
            panic!("batch expected")
        };
        assert_eq!(messages.len(), 4);
        assert_eq!(&body[messages[0].id.clone().unwrap()], "1");
        assert_eq!(messages[1].kind, Kind::Other);
        assert_eq!(messages[2].kind, Kind::Notification);
        assert_eq!(&body[messages[3].id.clone().unwrap()], r#""z""#);
    }

    #[test]
    fn finds_the_cancelled_request_id() {
        let body = r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"reason":"x","requestId":"a"}}"#;
        let message = single(body);
        assert_eq!(message.kind, Kind::Notification);
        assert_eq!(&body[message.cancels.unwrap()], r#""a""#);
        assert_eq!(
            single(r#"{"method":"notifications/cancelled","params":{}}"#).cancels,
            None
        );
        assert_eq!(
            single(r#"{"method":"other","params":{"requestId":1}}"#).cancels,
            None
        );
        assert_eq!(
            single(r#"{"method":"notifications/cancelled","params":{"requestId":null}}"#).cancels,
            None
        );
    }

    /// The fast path's answer, when it gives one.
    fn fast(input: &str, writer: Writer) -> Option<Message> {
        let open = input.find('{').unwrap();
        peek_object(input.as_bytes(), open, writer)
    }

    fn whole(input: &str) -> Option<Peeked> {
        let open = input.find(|c: char| !c.is_ascii_whitespace()).unwrap();
        parse_whole(input.as_bytes(), open)
    }

    #[test]
    fn reads_the_id_from_either_end_without_the_payload() {
        // rmcp's order: id before the payload.
        let body = r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"id":1}}"#;
        let message = fast(body, Writer::Client).expect("decided from the front");
        assert_eq!(
            (message.kind, &body[message.id.unwrap()]),
            (Kind::Request, "7")
        );
        // The TypeScript SDK's order: id after the payload.
        let body = r#"{ "method" : "tools/call", "params": {"id": 1, "x": "}\"id\":2"}, "jsonrpc": "2.0", "id" : "a\"b" }"#;
        let message = fast(body, Writer::Client).expect("decided from the back");
        assert_eq!(
            (message.kind, &body[message.id.unwrap()]),
            (Kind::Request, r#""a\"b""#)
        );
        // Responses, both orders, from the trusted server.
        for body in [
            r#"{"jsonrpc":"2.0","id":"s","result":{"id":1}}"#,
            r#"{"result":{"id":1},"jsonrpc":"2.0","id":"s"}"#,
            r#"{"error":{"code":1},"id":"s"}"#,
        ] {
            let message = fast(body, Writer::Server).expect(body);
            assert_eq!(
                (message.kind, &body[message.id.unwrap()]),
                (Kind::Response, r#""s""#)
            );
        }
    }

    #[test]
    fn leaves_undecided_bodies_to_the_full_parse() {
        for (body, writer) in [
            // A client's response: a `method` might follow the payload.
            (r#"{"id":1,"result":{}}"#, Writer::Client),
            // A notification with a payload: an `id` might follow it.
            (r#"{"method":"n","params":{}}"#, Writer::Client),
            (
                r#"{"method":"notifications/cancelled","params":{"requestId":1}}"#,
                Writer::Client,
            ),
            // Escaped keys and methods, duplicate envelope keys, odd ids.
            (r#"{"i\u0064":1,"method":"x","params":{}}"#, Writer::Client),
            (r#"{"id":1,"method":"\u0078","params":{}}"#, Writer::Client),
            (
                r#"{"id":1,"id":2,"method":"x","params":{}}"#,
                Writer::Client,
            ),
            (
                r#"{"method":"x","params":{},"id":1,"id":2}"#,
                Writer::Client,
            ),
            (
                r#"{"id":1,"params":{},"method":"x","method":"y"}"#,
                Writer::Client,
            ),
            (r#"{"id":[1],"method":"x"}"#, Writer::Client),
            (r#"{"id":01,"method":"x","params":{}}"#, Writer::Client),
            // Not one whole object.
            (
                r#"{"id":1,"method":"x"} {"id":2,"method":"y"}"#,
                Writer::Client,
            ),
            (r#"{"id":1,"method":"x"}}"#, Writer::Client),
            (r#"{"method":"x","params":{"a":1,"id":1}"#, Writer::Client),
        ] {
            assert_eq!(fast(body, writer), None, "{body}");
        }
        // The payload is not validated: a body cut inside it is taken at its
        // envelope, and the server answers it with its own parse error.
        let cut = r#"{"id":1,"method":"x","params":{"a":[}"#;
        assert_eq!(
            fast(cut, Writer::Client).map(|m| m.kind),
            Some(Kind::Request)
        );
        assert_eq!(whole(cut), None);
        // What the full parse makes of the undecided ones.
        assert_eq!(whole(r#"{"id":1,"id":2,"method":"x","params":{}}"#), None);
        assert_eq!(
            single(r#"{"i\u0064":1,"method":"x","params":{}}"#).kind,
            Kind::Request
        );
    }

    /// A JSON-RPC-like object: envelope keys in any order, payloads with
    /// nested look-alike keys, strings with escapes, random whitespace.
    fn object() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        let id = prop_oneof![
            Just("1".to_owned()),
            Just("-0".to_owned()),
            Just("null".to_owned()),
            Just(r#""a\"b\\""#.to_owned()),
            Just(r#""}""#.to_owned()),
            Just("1e3".to_owned()),
        ];
        let payload = prop_oneof![
            Just(r#"{"id":2,"method":"m","x":"\"id\":3}"}"#.to_owned()),
            Just(r#"[{"result":1},"]\\"]"#.to_owned()),
            Just("{}".to_owned()),
            Just("7".to_owned()),
            Just(r#""s""#.to_owned()),
        ];
        let members = (
            proptest::option::of(id),
            proptest::option::of(prop_oneof![
                Just(r#""tools/call""#.to_owned()),
                Just(r#""notifications/cancelled""#.to_owned()),
                Just("7".to_owned()),
            ]),
            proptest::option::of(payload.clone()),
            proptest::option::of(payload.clone()),
            proptest::option::of(payload),
            proptest::option::of(Just(r#""2.0""#.to_owned())),
        );
        let shuffled = members
            .prop_map(|(id, method, params, result, error, jsonrpc)| {
                [
                    ("id", id),
                    ("method", method),
                    ("params", params),
                    ("result", result),
                    ("error", error),
                    ("jsonrpc", jsonrpc),
                ]
                .into_iter()
                .filter_map(|(key, value)| Some((key, value?)))
                .collect::<Vec<_>>()
            })
            .prop_shuffle();
        let gap = prop_oneof![Just(""), Just(" "), Just("\n\t ")];
        (shuffled, gap).prop_map(|(pairs, gap)| {
            let members: Vec<String> = pairs
                .iter()
                .map(|(key, value)| format!("{gap}\"{key}\"{gap}:{gap}{value}"))
                .collect();
            format!("{gap}{{{}{gap}}}{gap}", members.join(","))
        })
    }

    proptest::proptest! {
        /// The shortcut never accepts what serde_json would refuse.
        #[test]
        fn plain_ids_are_valid_json(token in proptest::collection::vec(
            proptest::sample::select(b"\"-0123456789aZ \\\x7f\x1f.e".to_vec()), 0..6,
        )) {
            if is_plain_id(&token) {
                proptest::prop_assert!(serde_json::from_slice::<&RawValue>(&token).is_ok(), "{:?}", token);
            }
        }
    }

    proptest::proptest! {
        /// Whenever the fast path decides a valid object, it says what the
        /// full parse says (for the server's messages: unless a message has
        /// both a `method` and a `result`, which a server does not write).
        #[test]
        fn fast_path_agrees_with_the_full_parse(body in object()) {
            let full = whole(&body).map(|peeked| peeked.messages()[0].clone());
            if let Some(message) = fast(&body, Writer::Client) {
                proptest::prop_assert_eq!(Some(message), full.clone(), "{}", body);
            }
            let both = body.contains("\"method\"")
                && (body.contains("\"result\"") || body.contains("\"error\""));
            if let Some(message) = fast(&body, Writer::Server).filter(|_| !both) {
                proptest::prop_assert_eq!(Some(message), full, "{}", body);
            }
        }
    }
}
