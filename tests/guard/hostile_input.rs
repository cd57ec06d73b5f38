//! Hostile input: every row is a request the guard must survive with one
//! defined answer, stated in the row and asserted exactly (status, body, what
//! the inner service saw, `stats()`).
//!
//! In-process rows drive [`IdGuard`] directly in front of [`Echo`], which
//! records every body it receives and answers each JSON-RPC request with
//! `{"jsonrpc":"2.0","id":<id it saw>,"result":{}}` (an array for a batch;
//! `202` and no body when it finds no request it can read). A request is
//! held in flight simply by keeping its response unread: the guard's
//! registration lives in the response body, so collisions need no gates and
//! no sleeps. Rows that need real HTTP framing (lying `Content-Length`,
//! stalled chunked bodies) run over a loopback axum server with a raw TCP
//! client, because hyper validates lengths before the guard sees a body.
//! Every wait is bounded.

use std::convert::Infallible;
use std::future::IntoFuture;
use std::time::Duration;

use axum::body::Body as AxumBody;
use axum::Router;
use bytes::Bytes;
use futures::StreamExt as _;
use http::{Request, Response, StatusCode};
use http_body::{Body, Frame};
use http_body_util::{BodyExt, Full, StreamBody};
use mcp_id_guard::guard::GuardResponseBody as ResponseBody;
use mcp_id_guard::{IdGuard, IdGuardLayer, OnDuplicate, Stats};
use serde_json::value::RawValue;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tower::{Layer, ServiceBuilder, ServiceExt};
use tower_http::timeout::TimeoutLayer;

use crate::support::ids::server_side;
use crate::support::inner::{respond, Echo};
use crate::support::wait::{assert_drained, within};

/// Bounds every read of the loopback rows.
const READ: Duration = Duration::from_secs(10);

// ---------------------------------------------------------------------------
// The echo
// ---------------------------------------------------------------------------

type Fields = std::collections::BTreeMap<String, Box<RawValue>>;

// ---------------------------------------------------------------------------
// Requests and answers
// ---------------------------------------------------------------------------

const SESSION: &str = "session-hostile";

fn request_text(id: &str) -> String {
    format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{}}}}"#)
}

fn answer_text(id: &str) -> String {
    format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{{}}}}"#)
}

fn post_in<B>(session: &[u8], body: B) -> Request<B> {
    Request::post("/mcp")
        .header("content-type", "application/json")
        .header(
            "mcp-session-id",
            http::HeaderValue::from_bytes(session).unwrap(),
        )
        .body(body)
        .unwrap()
}

fn post(body: impl Into<Bytes>) -> Request<Full<Bytes>> {
    post_in(SESSION.as_bytes(), Full::new(body.into()))
}

type Held = Response<ResponseBody<Full<Bytes>>>;

/// Calls the guard; the response is returned unread (its ids stay in flight).
async fn call(service: &IdGuard<Echo>, request: Request<Full<Bytes>>) -> Held {
    within(service.clone().oneshot(request))
        .await
        .expect("the echo never fails")
}

/// Reads a response to its end.
async fn read<B>(response: Response<ResponseBody<B>>) -> (StatusCode, Bytes)
where
    B: Body<Data = Bytes>,
    B::Error: std::fmt::Debug,
{
    let (parts, body) = response.into_parts();
    let body = within(body.collect()).await.expect("the body reads");
    (parts.status, body.to_bytes())
}

fn raw_field(json: &[u8], field: &str) -> String {
    let fields: Fields = serde_json::from_slice(json).expect("a JSON object");
    fields[field].get().to_owned()
}

/// The guard's own JSON-RPC error answer: `-32600`/`-32000` and these ids.
fn assert_guard_error(body: &[u8], code: i64, ids: &[&str]) {
    let objects: Vec<Box<RawValue>> = if body.first() == Some(&b'[') {
        serde_json::from_slice(body).expect("an array")
    } else {
        vec![serde_json::from_slice(body).expect("an object")]
    };
    assert_eq!(objects.len(), ids.len());
    for (object, id) in objects.iter().zip(ids) {
        let fields: Fields = serde_json::from_str(object.get()).unwrap();
        assert_eq!(fields["id"].get(), *id);
        assert_eq!(fields["jsonrpc"].get(), "\"2.0\"");
        let error: serde_json::Value = serde_json::from_str(fields["error"].get()).unwrap();
        assert_eq!(error["code"], code);
    }
}

// ---------------------------------------------------------------------------
// Single requests
// ---------------------------------------------------------------------------

/// What the inner service must have received.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Inner {
    /// Nothing: the guard answered.
    NotCalled,
    /// The request body, byte for byte.
    Identical,
}

/// What the client must read.
#[derive(Debug, Clone)]
enum Want {
    /// No body.
    Empty,
    /// Exactly these bytes.
    Exact(String),
    /// The guard's error with this code and these ids.
    GuardError(i64, Vec<String>),
}

/// One in-process row: a request, and its one defined outcome.
struct Row {
    name: &'static str,
    layer: IdGuardLayer,
    request: Request<Full<Bytes>>,
    status: StatusCode,
    want: Want,
    inner: Inner,
    /// `passed_total` afterwards: whether the guard tracked the request.
    passed: u64,
}

const LIMIT: usize = 256;

fn limited() -> IdGuardLayer {
    IdGuardLayer::new().max_body_bytes(LIMIT)
}

/// `request_text(id)` padded with trailing spaces to exactly `length` bytes.
fn padded(id: &str, length: usize) -> String {
    let text = request_text(id);
    assert!(text.len() <= length);
    format!("{text}{}", " ".repeat(length - text.len()))
}

fn batch_of(ids: impl Iterator<Item = String>) -> String {
    let members: Vec<String> = ids.map(|id| request_text(&id)).collect();
    format!("[{}]", members.join(","))
}

fn single_rows() -> Vec<Row> {
    let with_length = |body: String, length: usize| {
        let mut request = post(body);
        request
            .headers_mut()
            .insert("content-length", length.to_string().parse().unwrap());
        request
    };
    let too_large = Want::GuardError(-32600, vec!["null".into()]);
    vec![
        Row {
            name: "0 B body: not JSON, passes untracked",
            layer: limited(),
            request: post(""),
            status: StatusCode::ACCEPTED,
            want: Want::Empty,
            inner: Inner::Identical,
            passed: 0,
        },
        Row {
            name: "1 byte `{`: starts like JSON but is not: the guard answers -32700",
            layer: limited(),
            request: post("{"),
            status: StatusCode::BAD_REQUEST,
            want: Want::GuardError(-32700, vec!["null".into()]),
            inner: Inner::NotCalled,
            passed: 0,
        },
        Row {
            name: "1 byte 0xff: not UTF-8, passes untracked",
            layer: limited(),
            request: post(&b"\xff"[..]),
            status: StatusCode::ACCEPTED,
            want: Want::Empty,
            inner: Inner::Identical,
            passed: 0,
        },
        Row {
            name: "exactly max_body_bytes (declared): tracked and answered",
            layer: limited(),
            request: with_length(padded("7", LIMIT), LIMIT),
            status: StatusCode::OK,
            want: Want::Exact(answer_text("7")),
            inner: Inner::Identical,
            passed: 1,
        },
        Row {
            name: "exactly max_body_bytes (no Content-Length): tracked and answered",
            layer: limited(),
            request: post(padded("7", LIMIT)),
            status: StatusCode::OK,
            want: Want::Exact(answer_text("7")),
            inner: Inner::Identical,
            passed: 1,
        },
        Row {
            name: "max_body_bytes + 1 (declared): 413 before reading",
            layer: limited(),
            request: with_length(padded("7", LIMIT + 1), LIMIT + 1),
            status: StatusCode::PAYLOAD_TOO_LARGE,
            want: too_large.clone(),
            inner: Inner::NotCalled,
            passed: 0,
        },
        Row {
            name: "max_body_bytes + 1 (no Content-Length): 413 once read past the limit",
            layer: limited(),
            request: post(padded("7", LIMIT + 1)),
            status: StatusCode::PAYLOAD_TOO_LARGE,
            want: too_large.clone(),
            inner: Inner::NotCalled,
            passed: 0,
        },
        Row {
            name: "a Content-Length over the limit on a small body (a lie): 413 on the declaration",
            layer: limited(),
            request: with_length(request_text("7"), LIMIT + 1),
            status: StatusCode::PAYLOAD_TOO_LARGE,
            want: too_large,
            inner: Inner::NotCalled,
            passed: 0,
        },
        Row {
            name: "an unparsable Content-Length (u64 overflow) is ignored: the body decides",
            layer: limited(),
            request: {
                let mut request = post(request_text("7"));
                request.headers_mut().insert(
                    "content-length",
                    "18446744073709551616".parse().unwrap(),
                );
                request
            },
            status: StatusCode::OK,
            want: Want::Exact(answer_text("7")),
            inner: Inner::Identical,
            passed: 1,
        },
        Row {
            name: "invalid UTF-8 inside params: the guard reads only the envelope; tracked, body untouched",
            layer: limited(),
            request: post(
                b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/call\",\"params\":{\"s\":\"\xff\"}}"
                    .to_vec(),
            ),
            // The echo (serde) cannot read it: 202 from the echo.
            status: StatusCode::ACCEPTED,
            want: Want::Empty,
            inner: Inner::Identical,
            passed: 1,
        },
        Row {
            name: "invalid UTF-8 inside the id string: servers read it differently, refused",
            layer: limited(),
            request: post(b"{\"jsonrpc\":\"2.0\",\"id\":\"\xc3\x28\",\"method\":\"x\"}".to_vec()),
            status: StatusCode::BAD_REQUEST,
            want: Want::GuardError(-32600, vec!["null".into()]),
            inner: Inner::NotCalled,
            passed: 0,
        },
        Row {
            name: "invalid UTF-8 inside a member the guard skips: tracked, body untouched",
            layer: limited(),
            request: post(b"{\"jsonrpc\":\"\xff\",\"id\":1,\"method\":\"x\"}".to_vec()),
            // The echo (serde) cannot read it: 202 from the echo.
            status: StatusCode::ACCEPTED,
            want: Want::Empty,
            inner: Inner::Identical,
            passed: 1,
        },
        Row {
            name: "invalid UTF-8 in one member of a batch: the batch is tracked (a lenient server reads it)",
            layer: limited(),
            request: post(
                b"[{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"x\"},\"\xff\"]".to_vec(),
            ),
            status: StatusCode::ACCEPTED,
            want: Want::Empty,
            inner: Inner::Identical,
            passed: 1,
        },
        Row {
            name: "a key escaped past its 8th byte: read, tracked, body untouched",
            layer: limited(),
            request: post(
                r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{},"_meta_long\u0041":1}"#,
            ),
            status: StatusCode::OK,
            want: Want::Exact(answer_text("1")),
            inner: Inner::Identical,
            passed: 1,
        },
        Row {
            name: "a lone surrogate escape as id: Python keeps it, serde refuses it: refused",
            layer: limited(),
            request: post(request_text(r#""\ud800""#)),
            status: StatusCode::BAD_REQUEST,
            want: Want::GuardError(-32600, vec!["null".into()]),
            inner: Inner::NotCalled,
            passed: 0,
        },
        Row {
            name: "an integer beyond 2^53 - 1 as id: JavaScript merges it with a neighbour, refused",
            layer: limited(),
            request: post(request_text("18446744073709551616")),
            status: StatusCode::BAD_REQUEST,
            want: Want::GuardError(-32600, vec!["null".into()]),
            inner: Inner::NotCalled,
            passed: 0,
        },
        Row {
            name: "a 1 MiB integer id: refused",
            layer: IdGuardLayer::new(),
            request: post(request_text(&"9".repeat(1 << 20))),
            status: StatusCode::BAD_REQUEST,
            want: Want::GuardError(-32600, vec!["null".into()]),
            inner: Inner::NotCalled,
            passed: 0,
        },
        Row {
            name: "10 000-element batch at the default cap (1024): 429, one error per request",
            layer: IdGuardLayer::new(),
            request: post(batch_of((0..10_000).map(|i| i.to_string()))),
            status: StatusCode::TOO_MANY_REQUESTS,
            want: Want::GuardError(-32000, (0..10_000).map(|i| i.to_string()).collect()),
            inner: Inner::NotCalled,
            passed: 0,
        },
        Row {
            name: "10 000-element batch of distinct ids under a cap of 10 000: forwarded untouched",
            layer: IdGuardLayer::new().max_in_flight_per_session(10_000),
            request: post(batch_of((0..10_000).map(|i| i.to_string()))),
            status: StatusCode::OK,
            want: Want::Exact(format!(
                "[{}]",
                (0..10_000)
                    .map(|i| answer_text(&i.to_string()))
                    .collect::<Vec<_>>()
                    .join(",")
            )),
            inner: Inner::Identical,
            passed: 10_000,
        },
    ]
}

/// Each single-request row: the stated status and body, what the inner
/// service saw, whether the guard tracked it, and nothing left in flight.
#[tokio::test]
async fn single_request_rows() {
    for row in single_rows() {
        let echo = Echo::default();
        let service = row.layer.layer(echo.clone());
        let sent_body = row.request.body().clone();
        let sent = within(sent_body.collect()).await.unwrap().to_bytes();
        let (status, body) = read(call(&service, row.request).await).await;
        assert_eq!(status, row.status, "{}", row.name);
        match &row.want {
            Want::Empty => assert!(body.is_empty(), "{}: {body:?}", row.name),
            Want::Exact(text) => assert!(body == text.as_bytes(), "{}", row.name),
            Want::GuardError(code, ids) => {
                let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
                assert_guard_error(&body, *code, &ids);
            }
        }
        match row.inner {
            Inner::NotCalled => assert_eq!(echo.calls(), 0, "{}", row.name),
            Inner::Identical => {
                assert_eq!(echo.calls(), 1, "{}", row.name);
                assert!(echo.last_seen() == sent, "{}: byte-identical", row.name);
            }
        }
        let stats = row.layer.stats();
        assert_eq!(stats.passed_total, row.passed, "{}", row.name);
        assert_eq!(stats.remapped_total, 0, "{}", row.name);
        assert_drained(&row.layer);
    }
}

/// A body one byte over the limit that arrives in frames and never ends
/// gets 413 as soon as the limit is crossed; the open rest is never awaited.
#[tokio::test]
async fn streamed_body_over_the_limit_is_refused_without_its_end() {
    let layer = limited();
    let echo = Echo::default();
    let service = layer.layer(echo.clone());
    let frames = futures::stream::iter([
        Ok::<_, Infallible>(Frame::data(Bytes::from(vec![b' '; LIMIT]))),
        Ok(Frame::data(Bytes::from_static(b" "))),
    ])
    .chain(futures::stream::pending());
    let request = post_in(SESSION.as_bytes(), StreamBody::new(frames));
    let response = within(service.oneshot(request)).await.unwrap();
    let (status, body) = read(response).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_guard_error(&body, -32600, &["null"]);
    assert_eq!(echo.calls(), 0);
    assert_eq!(layer.stats(), Stats::default());
}

// ---------------------------------------------------------------------------
// Collisions: which spellings are one id
// ---------------------------------------------------------------------------

/// What happens to a request while another with `held` is in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    /// The same id: under `Remap` it reaches the inner service with a
    /// server-side id and the client gets its exact id text back; under
    /// `Reject` it gets `400` carrying its exact id text.
    Collides,
    /// Another id: forwarded as is under both policies.
    Independent,
}

struct Collision {
    name: String,
    held: String,
    sent: String,
    outcome: Outcome,
}

fn collision(name: &str, held: &str, sent: &str, outcome: Outcome) -> Collision {
    Collision {
        name: name.to_owned(),
        held: held.to_owned(),
        sent: sent.to_owned(),
        outcome,
    }
}

fn collision_rows() -> Vec<Collision> {
    use Outcome::{Collides, Independent};
    let mut rows = vec![
        collision(
            "every escape at once vs its \\u spellings and a literal emoji",
            r#""\"\\\/\b\f\n\r\t\u0000\ud83d\ude00""#,
            "\"\\u0022\\u005c/\\u0008\\u000C\\u000a\\u000D\\u0009\\u0000\u{1F600}\"",
            Collides,
        ),
        collision(
            "surrogate pair, lower vs upper hex",
            r#""\ud83d\ude00""#,
            r#""\uD83D\uDE00""#,
            Collides,
        ),
        collision("-0 is 0", "0", "-0", Collides),
        collision(
            "1e3 is 1000: numbers collide by value",
            "1e3",
            "1000",
            Collides,
        ),
        collision(
            "1.0 is 1 (rmcp reads it as the integer)",
            "1",
            "1.0",
            Collides,
        ),
        collision("10e-1 is the string \"1\"", "\"1\"", "10e-1", Collides),
        collision("1.5 is not 1", "1", "1.5", Independent),
        collision(
            "2^53 - 1 collides with its string",
            "9007199254740991",
            "\"9007199254740991\"",
            Collides,
        ),
        collision(
            "a string of 1 MiB of escapes vs its decoded spelling",
            &format!("\"{}\"", "\\n".repeat(1 << 19)),
            &format!("\"{}\"", "\\u000a".repeat(1 << 19)),
            Collides,
        ),
    ];
    for (escaped, other) in [
        (r#"\""#, r#"\u0022"#),
        (r#"\\"#, r#"\u005C"#),
        (r#"\/"#, "/"),
        (r#"\b"#, r#"\u0008"#),
        (r#"\f"#, r#"\u000c"#),
        (r#"\n"#, r#"\u000A"#),
        (r#"\r"#, r#"\u000d"#),
        (r#"\t"#, r#"\u0009"#),
        (r#"\u0000"#, r#"\u0000"#),
        (r#"\ud83d\ude00"#, "\u{1F600}"),
    ] {
        rows.push(collision(
            &format!("the escape {escaped} vs {other}"),
            &format!("\"a{escaped}b\""),
            &format!("\"a{other}b\""),
            Collides,
        ));
    }
    rows
}

/// Each collision row under `Remap` and `Reject`: the held request stays
/// in flight (its response unread) while the row's request arrives.
#[tokio::test]
async fn collision_rows_per_policy() {
    for row in collision_rows() {
        for policy in [OnDuplicate::Remap, OnDuplicate::Reject] {
            let layer = IdGuardLayer::new().on_duplicate(policy);
            let echo = Echo::default();
            let service = layer.layer(echo.clone());
            let held = call(&service, post(request_text(&row.held))).await;
            assert_eq!(raw_field(&echo.last_seen(), "id"), row.held, "{}", row.name);
            let (status, body) = read(call(&service, post(request_text(&row.sent))).await).await;
            match (row.outcome, policy) {
                (Outcome::Collides, OnDuplicate::Reject) => {
                    assert_eq!(status, StatusCode::BAD_REQUEST, "{}", row.name);
                    assert_guard_error(&body, -32600, &[row.sent.as_str()]);
                    assert_eq!(echo.calls(), 1, "{}", row.name);
                }
                (Outcome::Collides, _) => {
                    assert_eq!(status, StatusCode::OK, "{}", row.name);
                    let seen = raw_field(&echo.last_seen(), "id");
                    assert_eq!(server_side(&seen).original(), row.sent, "{}", row.name);
                    assert!(
                        body == answer_text(&row.sent).as_bytes(),
                        "{}: the exact id text comes back",
                        row.name
                    );
                    assert_eq!(layer.stats().remapped_total, 1, "{}", row.name);
                }
                (Outcome::Independent, _) => {
                    assert_eq!(status, StatusCode::OK, "{}", row.name);
                    assert_eq!(raw_field(&echo.last_seen(), "id"), row.sent, "{}", row.name);
                    assert!(body == answer_text(&row.sent).as_bytes(), "{}", row.name);
                    assert_eq!(layer.stats().passed_total, 2, "{}", row.name);
                }
            }
            let (status, body) = read(held).await;
            assert_eq!(status, StatusCode::OK);
            assert!(body == answer_text(&row.held).as_bytes(), "{}", row.name);
            assert_drained(&layer);
        }
    }
}

/// Duplicate `"id"` keys: Python and JavaScript keep the last, serde refuses
/// the object, so no reading is safe: the guard answers both such requests
/// itself (400, -32600) and nothing reaches the server or is counted.
#[tokio::test]
async fn duplicate_id_keys_are_refused_even_twice_in_flight() {
    let layer = IdGuardLayer::new().on_duplicate(OnDuplicate::Reject);
    let echo = Echo::default();
    let service = layer.layer(echo.clone());
    let text = r#"{"jsonrpc":"2.0","id":1,"id":1,"method":"tools/call"}"#;
    let first = call(&service, post(text)).await;
    let (status, body) = read(call(&service, post(text)).await).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_guard_error(&body, -32600, &["null"]);
    let (status, _) = read(first).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(echo.calls(), 0);
    assert_eq!(layer.stats(), Stats::default());
}

/// A 10 000-element batch all with id `1` under `Remap` (cap raised): the
/// first goes as is, the other 9 999 with distinct server-side ids, and the
/// client's answer carries `1` ten thousand times; everything drains.
#[tokio::test]
async fn ten_thousand_equal_ids_in_one_batch() {
    let layer = IdGuardLayer::new().max_in_flight_per_session(10_000);
    let echo = Echo::default();
    let service = layer.layer(echo.clone());
    let response = call(&service, post(batch_of((0..10_000).map(|_| "1".into())))).await;
    assert_eq!(layer.stats().in_flight_requests, 10_000);
    let (status, body) = read(response).await;
    assert_eq!(status, StatusCode::OK);
    let expected = format!("[{}]", vec![answer_text("1"); 10_000].join(","));
    assert!(body == expected.as_bytes());
    let seen: Vec<Box<RawValue>> = serde_json::from_slice(&echo.last_seen()).unwrap();
    let ids: std::collections::HashSet<String> = seen
        .iter()
        .map(|member| raw_field(member.get().as_bytes(), "id"))
        .collect();
    assert_eq!(ids.len(), 10_000, "the server sees 10 000 distinct ids");
    assert!(ids.contains("1"));
    let stats = layer.stats();
    assert_eq!(
        (
            stats.passed_total,
            stats.remapped_total,
            stats.restored_total
        ),
        (1, 9_999, 9_999)
    );
    assert_drained(&layer);
}

// ---------------------------------------------------------------------------
// Session headers
// ---------------------------------------------------------------------------

/// A session id of 8 KiB is a session like any other: a duplicate in it is
/// refused. Ids with bytes outside visible ASCII (obs-text, a tab, a space,
/// one at either end) are refused whatever the method (400, `-32600`,
/// `id: null`), before anything reaches the server: the transport allows
/// 0x21 to 0x7E only, and parsers on the way read the others differently
/// (HTTP/2 keeps `abc ` as it is, HTTP/1.1 strips it to `abc`, so the guard
/// tracked another session than the server behind the proxy routed into).
#[tokio::test]
async fn odd_session_headers_are_refused() {
    let long: &[u8] = &[b's'; 8 * 1024];
    let layer = IdGuardLayer::new().on_duplicate(OnDuplicate::Reject);
    let echo = Echo::default();
    let service = layer.layer(echo.clone());
    let held = call(
        &service,
        post_in(long, Full::new(Bytes::from(request_text("1")))),
    )
    .await;
    let request = post_in(long, Full::new(Bytes::from(request_text("1"))));
    let (status, body) = read(call(&service, request).await).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_guard_error(&body, -32600, &["1"]);
    let odd: [&[u8]; 5] = [b"\x80\xff\xfe", b"a\tb", b"a b", b"abc ", b"\tabc"];
    for session in odd {
        for method in [http::Method::POST, http::Method::GET, http::Method::DELETE] {
            let mut request = post_in(session, Full::new(Bytes::from(request_text("1"))));
            *request.method_mut() = method.clone();
            let (status, body) = read(call(&service, request).await).await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{method} {session:?}");
            assert_guard_error(&body, -32600, &["null"]);
        }
    }
    assert_eq!(echo.calls(), 1, "only the first request reached the server");
    read(held).await;
    assert_drained(&layer);
}

/// 100 000 distinct sessions with one request each, all held at once:
/// `in_flight_sessions` reaches 100 000, then reading every answer drains the
/// table to nothing (no session, no shadow). Dropping 100 000 answers
/// unread instead leaves shadows, but at most 65 536 (the per-layer bound),
/// and no session or request in flight.
#[tokio::test]
async fn one_hundred_thousand_sessions() {
    const SESSIONS: usize = 100_000;
    for read_them in [true, false] {
        let layer = IdGuardLayer::new();
        let service = layer.layer(Echo::default());
        let mut held = Vec::with_capacity(SESSIONS);
        for index in 0..SESSIONS {
            let session = format!("session-{index}");
            let request = post_in(
                session.as_bytes(),
                Full::new(Bytes::from(request_text("1"))),
            );
            held.push(call(&service, request).await);
        }
        let stats = layer.stats();
        assert_eq!(
            (stats.in_flight_sessions, stats.in_flight_requests),
            (SESSIONS, SESSIONS)
        );
        assert_eq!(stats.passed_total, SESSIONS as u64);
        if read_them {
            for response in held {
                let (status, _) = read(response).await;
                assert_eq!(status, StatusCode::OK);
            }
            assert_eq!(layer.stats().abandoned_ids, 0);
        } else {
            drop(held);
            assert_eq!(layer.stats().abandoned_ids, 65_536, "bounded");
        }
        assert_drained(&layer);
    }
}

// ---------------------------------------------------------------------------
// Over loopback: lying lengths and stalled bodies
// ---------------------------------------------------------------------------

/// The echo as an axum handler, behind `guard` and a request timeout that
/// also bounds the guard's reading of the body.
async fn serve(guard: IdGuardLayer, timeout: Duration) -> (std::net::SocketAddr, Echo) {
    let echo = Echo::default();
    let recorder = echo.clone();
    let handler = move |request: axum::extract::Request| {
        let recorder = recorder.clone();
        async move {
            recorder.count_call();
            let (parts, body) = request.into_parts();
            match axum::body::to_bytes(body, 8 << 20).await {
                Ok(body) => {
                    recorder.record(parts.method, parts.headers, body.clone());
                    respond(&body).map(AxumBody::new)
                }
                Err(_) => Response::builder()
                    .status(StatusCode::UNPROCESSABLE_ENTITY)
                    .body(AxumBody::from("echo: the body failed"))
                    .unwrap(),
            }
        }
    };
    let app = Router::new()
        .route("/mcp", axum::routing::any(handler))
        .layer(
            ServiceBuilder::new()
                .layer(TimeoutLayer::with_status_code(
                    StatusCode::REQUEST_TIMEOUT,
                    timeout,
                ))
                .map_response(|response: Response<ResponseBody<AxumBody>>| {
                    response.map(AxumBody::new)
                })
                .layer(guard),
        );
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(axum::serve(listener, app).into_future());
    (address, echo)
}

fn head(length_header: &str) -> String {
    format!(
        "POST /mcp HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\nmcp-session-id: {SESSION}\r\n{length_header}\r\n"
    )
}

/// Reads what the server sends until it closes the connection (bounded).
async fn read_until_closed(stream: &mut TcpStream) -> String {
    let mut received = Vec::new();
    tokio::time::timeout(READ, stream.read_to_end(&mut received))
        .await
        .expect("the server closes the connection in time")
        .expect("read");
    String::from_utf8_lossy(&received).into_owned()
}

/// The status codes of the HTTP/1.1 responses in `text`, in order.
fn statuses(text: &str) -> Vec<u16> {
    text.match_indices("HTTP/1.1 ")
        .filter_map(|(at, _)| text.get(at + 9..at + 12)?.parse().ok())
        .collect()
}

/// A POST that can complete, on a fresh connection: the server still serves.
async fn served(address: std::net::SocketAddr, session: &str, id: &str) -> String {
    let body = request_text(id);
    let mut stream = TcpStream::connect(address).await.unwrap();
    let request = format!(
        "POST /mcp HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\ncontent-type: application/json\r\nmcp-session-id: {session}\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    read_until_closed(&mut stream).await
}

/// `Content-Length` shorter than the body: hyper delivers exactly the
/// declared bytes (`{"jsonrpc"`, which starts like JSON but is not, so the
/// guard answers `400` itself), then reads the rest of the body as the next
/// request on the keep-alive connection, answers that garbage with `400`
/// and closes. The guard never sees the extra bytes and tracks nothing.
#[tokio::test]
async fn content_length_shorter_than_the_body() {
    let layer = IdGuardLayer::new();
    let (address, echo) = serve(layer.clone(), Duration::from_secs(10)).await;
    let body = request_text("1");
    let mut stream = TcpStream::connect(address).await.unwrap();
    let request = format!("{}{body}", head("content-length: 10\r\n"));
    stream.write_all(request.as_bytes()).await.unwrap();
    let received = read_until_closed(&mut stream).await;
    assert_eq!(statuses(&received), [400, 400], "{received}");
    assert_eq!(echo.calls(), 0);
    assert_eq!(layer.stats(), Stats::default());
}

/// `Content-Length` longer than the body, then the client half-closes:
/// hyper reports the body as failed (incomplete), so the guard answers its
/// own `400` with a `-32600` error and `id: null`; the echo is never
/// called, nothing is tracked.
#[tokio::test]
async fn content_length_longer_than_the_body_then_eof() {
    let layer = IdGuardLayer::new();
    let (address, echo) = serve(layer.clone(), Duration::from_secs(10)).await;
    let body = request_text("1");
    let mut stream = TcpStream::connect(address).await.unwrap();
    let request = format!(
        "{}{body}",
        head(&format!("content-length: {}\r\n", body.len() + 40))
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    stream.shutdown().await.unwrap();
    let received = read_until_closed(&mut stream).await;
    assert_eq!(statuses(&received), [400], "{received}");
    let json = &received[received.find("\r\n\r\n").unwrap() + 4..];
    assert_guard_error(json.as_bytes(), -32600, &["null"]);
    assert_eq!(echo.calls(), 0);
    assert_eq!(layer.stats(), Stats::default());
}

/// `Content-Length` longer than the body and the client just waits: the
/// guard is still reading, so nothing is registered; other requests in the
/// same and other sessions are served meanwhile; the stalled one ends by the
/// server's request timeout (1 s): `408`, the echo never called.
#[tokio::test]
async fn content_length_longer_than_the_body_then_silence() {
    let layer = IdGuardLayer::new();
    let (address, echo) = serve(layer.clone(), Duration::from_secs(1)).await;
    let body = request_text("1");
    let mut stalled = TcpStream::connect(address).await.unwrap();
    let request = format!(
        "{}{body}",
        head(&format!("content-length: {}\r\n", body.len() + 40))
    );
    stalled.write_all(request.as_bytes()).await.unwrap();
    for session in [SESSION, "another-session"] {
        let received = served(address, session, "1").await;
        assert_eq!(statuses(&received), [200], "{received}");
        assert!(received.ends_with(&answer_text("1")));
    }
    assert_eq!(echo.calls(), 2);
    let mut received = vec![0; 4096];
    let read = tokio::time::timeout(READ, stalled.read(&mut received))
        .await
        .expect("the server's timeout answers in time")
        .unwrap();
    let received = String::from_utf8_lossy(&received[..read]).into_owned();
    assert_eq!(statuses(&received), [408], "{received}");
    assert_eq!(
        echo.calls(),
        2,
        "the stalled request never reached the echo"
    );
    assert_drained(&layer);
}

/// A chunked body that stalls after a first chunk: the server keeps
/// serving other connections (same session, other session); the stalled
/// request holds nothing in the table while its body is read, buffers at
/// most `max_body_bytes`, and ends by the server's timeout (`408`). A
/// second stalled chunked body that has already crossed the limit gets
/// `413` at once, without waiting for its end.
#[tokio::test]
async fn stalled_chunked_bodies() {
    let layer = IdGuardLayer::new().max_body_bytes(1024);
    let (address, echo) = serve(layer.clone(), Duration::from_secs(1)).await;
    let chunked = head("transfer-encoding: chunked\r\n");

    let mut stalled = TcpStream::connect(address).await.unwrap();
    let first = r#"{"jsonrpc":"2.0","id":1,"#;
    let request = format!("{chunked}{:x}\r\n{first}\r\n", first.len());
    stalled.write_all(request.as_bytes()).await.unwrap();

    let mut over = TcpStream::connect(address).await.unwrap();
    let big = " ".repeat(1025);
    let request = format!("{chunked}{:x}\r\n{big}\r\n", big.len());
    over.write_all(request.as_bytes()).await.unwrap();
    let mut received = vec![0; 4096];
    let read = tokio::time::timeout(READ, over.read(&mut received))
        .await
        .expect("413 without the end of the body")
        .unwrap();
    let received = String::from_utf8_lossy(&received[..read]).into_owned();
    assert_eq!(statuses(&received), [413], "{received}");

    for session in [SESSION, "another-session"] {
        let received = served(address, session, "1").await;
        assert_eq!(statuses(&received), [200], "{received}");
    }
    assert_eq!(layer.stats().in_flight_requests, 0);

    let mut received = vec![0; 4096];
    let read = tokio::time::timeout(READ, stalled.read(&mut received))
        .await
        .expect("the server's timeout answers in time")
        .unwrap();
    let received = String::from_utf8_lossy(&received[..read]).into_owned();
    assert_eq!(statuses(&received), [408], "{received}");
    assert_eq!(
        echo.calls(),
        2,
        "only the complete requests reached the echo"
    );
    assert_drained(&layer);
}
