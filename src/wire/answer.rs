//! The HTTP responses the guard gives itself, each with a JSON-RPC error body.

use bytes::Bytes;
use http::header::{HeaderValue, CONTENT_TYPE};
use http::{Response, StatusCode};
use http_body_util::Full;

use crate::wire::envelope::Unreadable;

/// JSON-RPC "Invalid Request".
pub(crate) const INVALID_REQUEST: i32 = -32600;
/// JSON-RPC implementation-defined server error.
pub(crate) const SERVER_ERROR: i32 = -32000;
/// JSON-RPC "Parse error".
pub(crate) const PARSE_ERROR: i32 = -32700;

pub(crate) const DUPLICATE_MESSAGE: &str =
    "Invalid Request: a request with this id is already in flight in this session";
pub(crate) const BATCH_SIBLING_MESSAGE: &str =
    "Invalid Request: not processed, another request in this batch has an id already in flight in this session";
pub(crate) const QUEUE_TIMEOUT_MESSAGE: &str =
    "Timed out waiting for an earlier request with this id in this session to finish";
pub(crate) const OVER_CAPACITY_MESSAGE: &str = "Too many requests in flight in this session";
/// A request body failed while the guard (or the proxy) read it.
pub(crate) const UNREADABLE_MESSAGE: &str = "Invalid Request: the request body could not be read";

/// One JSON-RPC error object; `id` is the request's id JSON text, written as
/// the client sent it (or `null`).
pub(crate) fn error_object(out: &mut Vec<u8>, id: &str, code: i32, message: &str) {
    out.extend_from_slice(br#"{"jsonrpc":"2.0","id":"#);
    out.extend_from_slice(id.as_bytes());
    out.extend_from_slice(br#","error":{"code":"#);
    out.extend_from_slice(code.to_string().as_bytes());
    out.extend_from_slice(br#","message":"#);
    // Messages are ours, but serializing them keeps the body valid JSON if one
    // ever gains a quote.
    out.extend_from_slice(
        serde_json::to_string(message)
            .unwrap_or_default()
            .as_bytes(),
    );
    out.extend_from_slice(b"}}");
}

/// An error response whose body is one JSON-RPC error object.
pub(crate) fn single(
    status: StatusCode,
    id: &str,
    code: i32,
    message: &str,
) -> Response<Full<Bytes>> {
    let mut body = Vec::with_capacity(96 + id.len() + message.len());
    error_object(&mut body, id, code, message);
    json_response(status, body)
}

/// An error response whose body is a JSON array of error objects, one per
/// `(id, message)` entry, in order.
pub(crate) fn batch<'a>(
    status: StatusCode,
    code: i32,
    entries: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> Response<Full<Bytes>> {
    let mut body = vec![b'['];
    for (index, (id, message)) in entries.into_iter().enumerate() {
        if index > 0 {
            body.push(b',');
        }
        error_object(&mut body, id, code, message);
    }
    body.push(b']');
    json_response(status, body)
}

fn json_response(status: StatusCode, body: Vec<u8>) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// `413` for a tracked POST over the body limit.
pub(crate) fn body_too_large(limit: usize) -> Response<Full<Bytes>> {
    single(
        StatusCode::PAYLOAD_TOO_LARGE,
        "null",
        INVALID_REQUEST,
        &format!("Invalid Request: request body exceeds the limit of {limit} bytes"),
    )
}

/// `503` for a request that arrived on a connection the server is closing
/// (pipelined after its last request): `why` says which budget ran out. The
/// client may send it again on a new connection.
#[cfg(feature = "server")]
pub(crate) fn connection_closing(why: &str) -> Response<Full<Bytes>> {
    single(
        StatusCode::SERVICE_UNAVAILABLE,
        "null",
        SERVER_ERROR,
        &format!("Service Unavailable: {why}; send it again on a new connection"),
    )
}

/// `503` for a request that waited too long under `OnDuplicate::Queue`.
pub(crate) fn queue_timeout(id: &str) -> Response<Full<Bytes>> {
    single(
        StatusCode::SERVICE_UNAVAILABLE,
        id,
        SERVER_ERROR,
        QUEUE_TIMEOUT_MESSAGE,
    )
}

/// `400` for a tracked POST whose body failed while being read.
pub(crate) fn body_unreadable() -> Response<Full<Bytes>> {
    single(
        StatusCode::BAD_REQUEST,
        "null",
        INVALID_REQUEST,
        UNREADABLE_MESSAGE,
    )
}

/// The guard's answer to a body it will not forward because servers could
/// read it differently from the guard (see [`Unreadable`]).
pub(crate) fn unreadable(why: Unreadable) -> Response<Full<Bytes>> {
    let (status, code, message) = match why {
        Unreadable::Malformed => (
            StatusCode::BAD_REQUEST,
            PARSE_ERROR,
            "Parse error: the request body is not JSON",
        ),
        Unreadable::NotUtf8 => (
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            PARSE_ERROR,
            "Parse error: the request body must be UTF-8 JSON (RFC 8259)",
        ),
        Unreadable::Compressed => (
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            INVALID_REQUEST,
            "Invalid Request: compressed request bodies (Content-Encoding) are not accepted",
        ),
        Unreadable::DuplicateKey => (
            StatusCode::BAD_REQUEST,
            INVALID_REQUEST,
            "Invalid Request: a key appears twice in one message",
        ),
        Unreadable::Id => (
            StatusCode::BAD_REQUEST,
            INVALID_REQUEST,
            "Invalid Request: a request id must be a string or an integer between -(2^53-1) and 2^53-1",
        ),
    };
    single(status, "null", code, message)
}

/// `400` for a request that names more than one session.
pub(crate) fn several_sessions() -> Response<Full<Bytes>> {
    single(
        StatusCode::BAD_REQUEST,
        "null",
        INVALID_REQUEST,
        "Invalid Request: more than one Mcp-Session-Id header",
    )
}

/// `400` for a request in a session whose `Connection` header names a
/// header the guard, the metrics or the trace layer decides on: a proxy on
/// the way would drop it, and the server read another request.
pub(crate) fn hides_decided_on() -> Response<Full<Bytes>> {
    single(
        StatusCode::BAD_REQUEST,
        "null",
        INVALID_REQUEST,
        "Invalid Request: the Connection header names an MCP, content or routing header \
         (a proxy would drop it before the server reads the request)",
    )
}

/// `400` for a request whose `Mcp-Session-Id` is not visible ASCII: parsers
/// on the way would read it differently.
pub(crate) fn odd_session() -> Response<Full<Bytes>> {
    single(
        StatusCode::BAD_REQUEST,
        "null",
        INVALID_REQUEST,
        "Invalid Request: an Mcp-Session-Id may hold visible ASCII only (0x21 to 0x7E)",
    )
}

pub(crate) const OVER_BUDGET_MESSAGE: &str =
    "The guard's table is full: too many requests in flight or recently abandoned; try again later";

/// `503` for requests that do not fit in the table's byte budget: one error
/// per request, each with its id (an array for a batch).
pub(crate) fn over_budget(ids: &[&str], is_batch: bool) -> Response<Full<Bytes>> {
    let status = StatusCode::SERVICE_UNAVAILABLE;
    if is_batch {
        batch(
            status,
            SERVER_ERROR,
            ids.iter().map(|id| (*id, OVER_BUDGET_MESSAGE)),
        )
    } else {
        single(
            status,
            ids.first().copied().unwrap_or("null"),
            SERVER_ERROR,
            OVER_BUDGET_MESSAGE,
        )
    }
}

/// `400` for a request in a session whose id is longer than the guard
/// accepts: one error per request, each with its id (an array for a batch),
/// or one with `id: null` when the guard knows no id.
pub(crate) fn session_id_too_long(
    ids: &[&str],
    is_batch: bool,
    limit: usize,
) -> Response<Full<Bytes>> {
    let status = StatusCode::BAD_REQUEST;
    let message =
        format!("Invalid Request: the Mcp-Session-Id header is longer than {limit} bytes");
    if is_batch && !ids.is_empty() {
        batch(
            status,
            INVALID_REQUEST,
            ids.iter().map(|id| (*id, message.as_str())),
        )
    } else {
        single(
            status,
            ids.first().copied().unwrap_or("null"),
            INVALID_REQUEST,
            &message,
        )
    }
}

/// An error response whose JSON-RPC error has `id: null`: the answer to a
/// request refused before its body was read (so its id is unknown).
pub(crate) fn unread(status: StatusCode, code: i32, message: &str) -> Response<Full<Bytes>> {
    single(status, "null", code, message)
}

/// `400` for a request whose head a face could not hand to the guard as
/// HTTP (a header name or value the `http` crate refuses, which some ASGI
/// servers pass): the guard cannot read it as the server will.
pub(crate) fn header_not_http() -> Response<Full<Bytes>> {
    unread(
        StatusCode::BAD_REQUEST,
        INVALID_REQUEST,
        "Bad Request: a request header HTTP does not allow",
    )
}

/// `503` for a body that does not fit what the request-body budget has
/// left (`protect::buffer::BodyBudget`): every face answers it alike.
pub(crate) fn body_budget_spent() -> Response<Full<Bytes>> {
    unread(
        StatusCode::SERVICE_UNAVAILABLE,
        SERVER_ERROR,
        "Service Unavailable: request bodies hold all the memory they may; try again",
    )
}

/// `421` for a request whose `Host` names no authority the server is
/// reached by (DNS-rebinding protection).
pub(crate) fn host_refused() -> Response<Full<Bytes>> {
    unread(
        StatusCode::MISDIRECTED_REQUEST,
        INVALID_REQUEST,
        "Invalid Request: Host not allowed (DNS-rebinding protection)",
    )
}

/// `403` for a request from a foreign web page's `Origin`.
pub(crate) fn origin_refused() -> Response<Full<Bytes>> {
    unread(
        StatusCode::FORBIDDEN,
        INVALID_REQUEST,
        "Invalid Request: Origin not allowed (DNS-rebinding protection)",
    )
}

/// `431` for a request head over `limit` bytes.
pub(crate) fn head_too_large(limit: usize) -> Response<Full<Bytes>> {
    unread(
        StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
        INVALID_REQUEST,
        &format!("Invalid Request: request headers exceed the limit of {limit} bytes"),
    )
}

/// `408` for a request body that paused longer than `limit`.
pub(crate) fn body_idle(limit: std::time::Duration) -> Response<Full<Bytes>> {
    unread(
        StatusCode::REQUEST_TIMEOUT,
        INVALID_REQUEST,
        &format!("Request Timeout: the client sent no request body data for {limit:?}"),
    )
}

/// `408` for a request body that arrived slower than `min_rate` bytes per
/// second.
pub(crate) fn body_slow(min_rate: u64) -> Response<Full<Bytes>> {
    unread(
        StatusCode::REQUEST_TIMEOUT,
        INVALID_REQUEST,
        &format!(
            "Request Timeout: the request body arrived slower than the minimum of {min_rate} bytes per second"
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    fn body_json(response: Response<Full<Bytes>>) -> serde_json::Value {
        let Ok(collected) = block_on_ready(response.into_body().collect());
        let bytes = collected.to_bytes();
        serde_json::from_slice(&bytes).expect("valid JSON")
    }

    fn block_on_ready<F: std::future::Future>(future: F) -> F::Output {
        // Full bodies are ready at once; a no-op waker suffices.
        let mut future = std::pin::pin!(future);
        let mut context = std::task::Context::from_waker(std::task::Waker::noop());
        match future.as_mut().poll(&mut context) {
            std::task::Poll::Ready(output) => output,
            std::task::Poll::Pending => unreachable!("full bodies are always ready"),
        }
    }

    #[test]
    fn single_error_carries_the_exact_id_text() {
        let response = single(
            StatusCode::BAD_REQUEST,
            r#""\u0031""#,
            INVALID_REQUEST,
            DUPLICATE_MESSAGE,
        );
        assert_eq!(response.status(), StatusCode::BAD_REQUEST);
        assert_eq!(response.headers()[CONTENT_TYPE], "application/json");
        let value = body_json(response);
        assert_eq!(value["id"], "1");
        assert_eq!(value["error"]["code"], INVALID_REQUEST);
    }

    #[test]
    fn batch_error_is_an_array() {
        let response = batch(
            StatusCode::CONFLICT,
            INVALID_REQUEST,
            [("1", "a"), ("2", "b")],
        );
        let value = body_json(response);
        assert_eq!(value[1]["id"], 2);
        assert_eq!(value[1]["error"]["message"], "b");
    }
}
