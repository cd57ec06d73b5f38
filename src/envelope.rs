//! The one JSON-RPC envelope peeker, shared by the request path (find requests and
//! their ids) and the response path (find responses whose ids need restoring).
//!
//! It borrows: ids are located as `&RawValue` slices of the input, so callers can
//! splice replacement bytes at exact offsets without re-serializing a message.

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

/// Peeks at a body. Returns `None` when it is not valid JSON, not valid UTF-8,
/// or not an object or array, and for an object with duplicate keys among the
/// ones it reads (serde refuses those). Deep nesting inside skipped values
/// (`params`, `result`) is fine: serde_json skips them without recursing.
pub(crate) fn peek(input: &[u8]) -> Option<Peeked> {
    let first = input.iter().find(|byte| !byte.is_ascii_whitespace())?;
    if *first == b'[' {
        let elements: Vec<&RawValue> = serde_json::from_slice(input).ok()?;
        let messages = elements
            .into_iter()
            .map(|element| classify_raw(input, element))
            .collect();
        Some(Peeked::Batch(messages))
    } else if *first == b'{' {
        let envelope: RawEnvelope<'_> = serde_json::from_slice(input).ok()?;
        Some(Peeked::Single(classify(input, &envelope)))
    } else {
        None
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

/// Copies `input` with each `(range, replacement)` spliced in. Ranges must be
/// sorted and disjoint (they are: they come from distinct messages in order).
pub(crate) fn splice(input: &[u8], edits: &[(Range<usize>, Vec<u8>)]) -> Vec<u8> {
    let added: usize = edits.iter().map(|(_, new)| new.len()).sum();
    let mut out = Vec::with_capacity(input.len() + added);
    let mut cursor = 0;
    for (range, replacement) in edits {
        out.extend_from_slice(&input[cursor..range.start]);
        out.extend_from_slice(replacement);
        cursor = range.end;
    }
    out.extend_from_slice(&input[cursor..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn single(input: &str) -> Message {
        match peek(input.as_bytes()) {
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
        assert_eq!(peek(b""), None);
        assert_eq!(peek(b"{"), None);
        assert_eq!(peek(b"12"), None);
        assert_eq!(peek(br#"" {}""#), None);
        assert_eq!(peek(br#"{"id":1,"id":2,"method":"x"}"#), None);
    }

    #[test]
    fn batch_offsets_point_into_the_whole_body() {
        let body = r#"[{"id":1,"method":"a"}, [2,"m"], {"method":"n"}, {"id":"z","result":1}]"#;
        let Some(Peeked::Batch(messages)) = peek(body.as_bytes()) else {
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

    #[test]
    fn splice_replaces_ranges() {
        let out = splice(b"abcdef", &[(1..2, b"XY".to_vec()), (4..6, Vec::new())]);
        assert_eq!(out, b"aXYcd");
    }
}
