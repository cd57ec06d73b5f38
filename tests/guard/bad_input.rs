//! Odd, malformed and hostile input: each case has one defined outcome, which
//! is asserted exactly, and none of them panics.
//!
//! The inner service is [`Echo`]: it records every request it receives (the
//! call count is bumped synchronously in `call`, so "not called" is provable),
//! answers each JSON-RPC request with `{"jsonrpc":"2.0","id":<id it saw>,
//! "result":{}}` (an array for a batch), and holds requests whose method is
//! `hold` until the test releases them, which creates in-flight collisions
//! without sleeping.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use bytes::Bytes;
use futures::channel::mpsc as futures_mpsc;
use http::{HeaderMap, Method, Request, StatusCode};
use http_body::Frame;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use mcp_id_guard::{IdGuard, IdGuardLayer, OnDuplicate, Stats};
use serde_json::json;
use serde_json::value::RawValue;
use tower::{Layer, ServiceExt};

use crate::support::ids::{id_text, server_side};
use crate::support::inner::{echo, fields, Echo, Probe};
use crate::support::wait::{assert_drained, within};

/// The client's request body: complete or streamed, and able to fail.
type ClientBody = UnsyncBoxBody<Bytes, BodyError>;

/// A request body's failure. A concrete type rather than `BoxError`: with a
/// trait object in the body type, `tokio::spawn` cannot prove the guard's
/// future `Send` (rustc's "implementation of `Service` is not general
/// enough" on the elided object lifetime).
#[derive(Debug)]
struct BodyError(&'static str);

impl std::fmt::Display for BodyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

impl std::error::Error for BodyError {}

const SESSION: &str = "session-bad-input";
const FORGED: &str = r#""mcp-id-guard:0123456789abcdef:1:7""#;

struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
}

impl Answer {
    fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).expect("the answer is JSON")
    }
}

async fn send(service: &IdGuard<Echo>, request: Request<ClientBody>) -> Answer {
    within(answer_of(service.clone(), request)).await
}

/// Calls a clone of the guard and reads the whole answer. Boxed with an
/// explicit `Send` so `tokio::spawn` need not prove it through the
/// higher-ranked lifetimes of the boxed error type.
fn answer_of(
    service: IdGuard<Echo>,
    request: Request<ClientBody>,
) -> Pin<Box<dyn Future<Output = Answer> + Send>> {
    Box::pin(async move {
        let response = service.oneshot(request).await.expect("echo never fails");
        let (parts, body) = response.into_parts();
        let body = body.collect().await.expect("echo bodies never fail");
        Answer {
            status: parts.status,
            headers: parts.headers,
            body: body.to_bytes(),
        }
    })
}

/// Sends a request in its own task, for requests the echo holds.
fn spawn_send(
    service: &IdGuard<Echo>,
    request: Request<ClientBody>,
) -> tokio::task::JoinHandle<Answer> {
    tokio::spawn(answer_of(service.clone(), request))
}

fn full(body: impl Into<Bytes>) -> ClientBody {
    Full::new(body.into())
        .map_err(|never| match never {})
        .boxed_unsync()
}

type Chunks = futures_mpsc::UnboundedSender<Result<Frame<Bytes>, BodyError>>;

fn streamed() -> (Chunks, ClientBody) {
    let (sender, receiver) = futures_mpsc::unbounded();
    (sender, StreamBody::new(receiver).boxed_unsync())
}

fn post_with(content_type: &str, body: ClientBody) -> Request<ClientBody> {
    Request::post("/mcp")
        .header("content-type", content_type)
        .header("accept", "application/json, text/event-stream")
        .header("mcp-session-id", SESSION)
        .body(body)
        .unwrap()
}

fn post(json: impl Into<Bytes>) -> Request<ClientBody> {
    post_with("application/json", full(json))
}

fn request_text(id: &str, method: &str) -> String {
    format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"{method}","params":{{}}}}"#)
}

fn answer_text(id: &str) -> String {
    format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{{}}}}"#)
}

fn guard(policy: OnDuplicate) -> (IdGuardLayer, IdGuard<Echo>, Probe) {
    let layer = IdGuardLayer::new().on_duplicate(policy);
    let (inner, probe) = echo();
    (layer.clone(), layer.layer(inner), probe)
}

fn assert_untouched(layer: &IdGuardLayer) {
    assert_eq!(layer.stats(), Stats::default(), "nothing was tracked");
}

/// Asserts a JSON-RPC error answer and returns its `id` JSON text.
fn assert_error(answer: &Answer, status: StatusCode, code: i64) -> String {
    assert_eq!(answer.status, status);
    assert_eq!(answer.headers["content-type"], "application/json");
    let value = answer.json();
    assert_error_object(&value, code);
    id_text(&answer.body)
}

fn assert_error_object(value: &serde_json::Value, code: i64) {
    let object = value.as_object().expect("an error object");
    assert_eq!(
        object.keys().map(String::as_str).collect::<Vec<_>>(),
        ["error", "id", "jsonrpc"]
    );
    assert_eq!(value["jsonrpc"], "2.0");
    assert_eq!(value["error"]["code"], code);
    assert!(value["error"]["message"]
        .as_str()
        .is_some_and(|m| !m.is_empty()));
}

/// Bodies that no server reads as JSON-RPC pass through byte-identical and
/// untracked (the server gives its own error). Bodies that start like JSON
/// but that the guard cannot read the way every server would (cut short,
/// trailing garbage, a key twice, UTF-16) get the guard's own answer and
/// never reach the server: some server's parser might read them as a
/// request the guard did not track.
#[tokio::test]
async fn bodies_the_guard_cannot_read_never_reach_the_server() {
    for policy in [OnDuplicate::Remap, OnDuplicate::Reject] {
        let (layer, service, probe) = guard(policy);
        for body in [&b"not json at all"[..], b"17"] {
            let answer = send(&service, post(body)).await;
            assert_eq!(answer.body, &b""[..], "the echo's own answer");
            assert_eq!(probe.seen().last().unwrap().body, body, "byte-identical");
        }
        assert_eq!(probe.calls(), 2);
        for (body, status, code) in [
            (
                &br#"{"jsonrpc":"2.0","id":1,"method":"#[..],
                StatusCode::BAD_REQUEST,
                -32700,
            ),
            (
                br#"{"jsonrpc":"2.0","id":1,"method":"x"} trailing"#,
                StatusCode::BAD_REQUEST,
                -32700,
            ),
            // Python and JavaScript take the last `id`, serde refuses.
            (
                br#"{"jsonrpc":"2.0","id":1,"id":2,"method":"x"}"#,
                StatusCode::BAD_REQUEST,
                -32600,
            ),
            (b"\xff\xfe{}", StatusCode::UNSUPPORTED_MEDIA_TYPE, -32700),
        ] {
            let answer = send(&service, post(body)).await;
            assert_eq!(assert_error(&answer, status, code), "null", "{body:?}");
        }
        assert_eq!(probe.calls(), 2, "none of them reached the server");
        assert_untouched(&layer);
    }
}

/// An empty tracked-candidate body passes through as an empty body, untracked.
#[tokio::test]
async fn empty_body_passes_through() {
    let (layer, service, probe) = guard(OnDuplicate::Reject);
    let answer = send(&service, post("")).await;
    assert_eq!(answer.status, StatusCode::ACCEPTED);
    assert_eq!(probe.seen()[0].body, "");
    assert_untouched(&layer);
}

/// The `Content-Type` header does not decide what is tracked: servers check
/// it loosely (the Python SDK takes `application/json, text/plain`), so a
/// request under another content type is read and tracked like a JSON one,
/// and its duplicate is refused.
#[tokio::test]
async fn other_content_types_are_read_and_tracked() {
    let (layer, service, mut probe) = guard(OnDuplicate::Reject);
    let held = spawn_send(
        &service,
        post_with("text/plain", full(request_text("1", "hold"))),
    );
    assert_eq!(probe.entered().await, "1");
    for content_type in ["application/json, text/plain", "text/plain", ""] {
        let answer = send(
            &service,
            post_with(content_type, full(request_text("1", "tools/call"))),
        )
        .await;
        assert_eq!(
            assert_error(&answer, StatusCode::BAD_REQUEST, -32600),
            "1",
            "{content_type:?}"
        );
    }
    assert_eq!(probe.calls(), 1, "no duplicate reached the server");
    probe.release(1);
    let answer = within(held).await.unwrap();
    assert_eq!(answer.body, answer_text("1").as_bytes());
    assert_eq!(probe.seen()[0].headers["content-type"], "text/plain");
    assert_eq!(layer.stats().rejected_total, 3);
    assert_drained(&layer);
}

/// `id: null` makes a message a notification: it passes untracked, even
/// while the inner service holds it.
#[tokio::test]
async fn null_id_is_untracked() {
    let (layer, service, mut probe) = guard(OnDuplicate::Reject);
    let text = request_text("null", "hold");
    let held = spawn_send(&service, post(text.clone()));
    assert_eq!(probe.entered().await, "null");
    assert_untouched(&layer);
    let second = spawn_send(&service, post(text.clone()));
    assert_eq!(probe.entered().await, "null", "not rejected as a duplicate");
    probe.release(2);
    for task in [held, second] {
        let answer = within(task).await.unwrap();
        assert_eq!(answer.status, StatusCode::ACCEPTED);
    }
    assert!(probe.seen().iter().all(|seen| seen.body == text.as_bytes()));
    assert_untouched(&layer);
}

/// Numbers are ids by value, however they are written: a fraction collides
/// with another spelling of it (the client still gets its exact id text
/// back), and an integer beyond what every server reads exactly is refused.
#[tokio::test]
async fn numeric_ids_collide_by_value() {
    let (id, other_spelling) = ("1.5", "15e-1");
    // Remap.
    let (layer, service, mut probe) = guard(OnDuplicate::Remap);
    let held = spawn_send(&service, post(request_text(id, "hold")));
    assert_eq!(probe.entered().await, id);
    let answer = send(&service, post(request_text(other_spelling, "tools/call"))).await;
    let seen = id_text(&probe.seen()[1].body);
    assert_eq!(server_side(&seen).original(), other_spelling);
    assert_eq!(
        answer.body,
        answer_text(other_spelling).as_bytes(),
        "exact id text"
    );
    probe.release(1);
    assert_eq!(within(held).await.unwrap().body, answer_text(id).as_bytes());
    let stats = layer.stats();
    assert_eq!((stats.passed_total, stats.remapped_total), (1, 1));
    assert_drained(&layer);

    // Reject.
    let (layer, service, mut probe) = guard(OnDuplicate::Reject);
    let held = spawn_send(&service, post(request_text(id, "hold")));
    probe.entered().await;
    let answer = send(&service, post(request_text(other_spelling, "tools/call"))).await;
    assert_eq!(
        assert_error(&answer, StatusCode::BAD_REQUEST, -32600),
        other_spelling
    );
    assert_eq!(
        probe.calls(),
        1,
        "the duplicate never reached the inner service"
    );
    probe.release(1);
    within(held).await.unwrap();
    assert_eq!(layer.stats().rejected_total, 1);
    assert_drained(&layer);

    // Beyond 2^53 - 1 JavaScript merges neighbouring integers: refused.
    let (layer, service, probe) = guard(OnDuplicate::Remap);
    for refused in ["123456789012345678901234567890", "9007199254740993", "true"] {
        let answer = send(&service, post(request_text(refused, "tools/call"))).await;
        assert_eq!(
            assert_error(&answer, StatusCode::BAD_REQUEST, -32600),
            "null",
            "{refused}"
        );
    }
    assert_eq!(probe.calls(), 0);
    assert_untouched(&layer);
}

/// A 1 MiB string id is tracked; under `Remap` a duplicate's answer carries
/// it back byte-exact, under `Reject` the 400 body carries the whole id.
#[tokio::test]
async fn one_mebibyte_string_id() {
    let id = format!("\"{}\"", "x".repeat(1 << 20));

    let (layer, service, mut probe) = guard(OnDuplicate::Remap);
    let held = spawn_send(&service, post(request_text(&id, "hold")));
    assert_eq!(probe.entered().await, id);
    let answer = send(&service, post(request_text(&id, "tools/call"))).await;
    let seen = id_text(&probe.seen()[1].body);
    assert_eq!(server_side(&seen).original(), id);
    assert_eq!(answer.body, answer_text(&id).as_bytes());
    probe.release(1);
    assert_eq!(
        within(held).await.unwrap().body,
        answer_text(&id).as_bytes()
    );
    assert_drained(&layer);

    let (layer, service, mut probe) = guard(OnDuplicate::Reject);
    let held = spawn_send(&service, post(request_text(&id, "hold")));
    probe.entered().await;
    let answer = send(&service, post(request_text(&id, "tools/call"))).await;
    assert_eq!(assert_error(&answer, StatusCode::BAD_REQUEST, -32600), id);
    probe.release(1);
    within(held).await.unwrap();
    assert_drained(&layer);
}

/// A client id that looks like a server-side id is always rewritten (under
/// both policies, with nothing else in flight), and the client gets exactly
/// its forged id back: restoring unwraps one level.
#[tokio::test]
async fn forged_prefixed_id_is_rewritten_and_restored() {
    for policy in [OnDuplicate::Remap, OnDuplicate::Reject] {
        let (layer, service, probe) = guard(policy);
        for _ in 0..2 {
            let answer = send(&service, post(request_text(FORGED, "tools/call"))).await;
            assert_eq!(answer.status, StatusCode::OK);
            assert_eq!(answer.body, answer_text(FORGED).as_bytes());
        }
        let seen: Vec<String> = probe.seen().iter().map(|s| id_text(&s.body)).collect();
        for raw in &seen {
            assert_ne!(raw, FORGED);
            assert_eq!(server_side(raw).original(), FORGED, "{raw}");
        }
        assert_ne!(seen[0], seen[1], "every rewrite is unique");
        for seen in probe.seen() {
            assert_eq!(
                seen.headers["content-length"],
                seen.body.len().to_string(),
                "Content-Length follows the rewritten body"
            );
        }
        let stats = layer.stats();
        assert_eq!(
            (
                stats.passed_total,
                stats.remapped_total,
                stats.rejected_total
            ),
            (0, 2, 0)
        );
        assert_drained(&layer);
    }
}

fn assert_too_large(answer: &Answer, limit: usize) {
    assert_eq!(answer.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(answer.headers["content-type"], "application/json");
    let value = answer.json();
    assert_error_object(&value, -32600);
    assert_eq!(id_text(&answer.body), "null");
    assert!(value["error"]["message"]
        .as_str()
        .unwrap()
        .contains(&limit.to_string()));
}

/// A body over `max_body_bytes` declared by `Content-Length` gets 413 and a
/// JSON-RPC error with `id: null`, without the inner service being called; a
/// body of exactly the limit passes.
#[tokio::test]
async fn oversize_by_content_length_is_413() {
    let at_limit = request_text("1", "tools/call");
    let limit = at_limit.len();
    let layer = IdGuardLayer::new().max_body_bytes(limit);
    let (inner, probe) = echo();
    let service = layer.layer(inner);

    let mut request = post(format!("{at_limit} "));
    request
        .headers_mut()
        .insert("content-length", (limit + 1).into());
    let answer = send(&service, request).await;
    assert_too_large(&answer, limit);
    assert_eq!(probe.calls(), 0, "the inner service was not called");

    let mut request = post(at_limit.clone());
    request.headers_mut().insert("content-length", limit.into());
    let answer = send(&service, request).await;
    assert_eq!(answer.body, answer_text("1").as_bytes());
    assert_eq!(probe.calls(), 1);
    let stats = layer.stats();
    assert_eq!((stats.passed_total, stats.rejected_total), (1, 0));
    assert_drained(&layer);
}

/// A streamed body without `Content-Length` that grows past the limit gets the
/// same 413 as soon as the limit is crossed (the rest is never awaited) and
/// the inner service is not called.
#[tokio::test]
async fn oversize_by_streaming_is_413() {
    let limit = 1000;
    let layer = IdGuardLayer::new().max_body_bytes(limit);
    let (inner, probe) = echo();
    let service = layer.layer(inner);
    let (chunks, body) = streamed();
    chunks
        .unbounded_send(Ok(Frame::data(Bytes::from(vec![b' '; 600]))))
        .unwrap();
    chunks
        .unbounded_send(Ok(Frame::data(Bytes::from(vec![b' '; 401]))))
        .unwrap();
    // `chunks` stays open: the guard must answer without the end of the body.
    let answer = send(&service, post_with("application/json", body)).await;
    assert_too_large(&answer, limit);
    assert_eq!(probe.calls(), 0, "the inner service was not called");
    assert_untouched(&layer);
    drop(chunks);
}

/// A tracked body that fails while being read gets 400 and a JSON-RPC
/// `-32600` error with `id: null`; the inner service is not called.
#[tokio::test]
async fn failing_body_is_400() {
    let (layer, service, probe) = guard(OnDuplicate::Remap);
    let (chunks, body) = streamed();
    chunks
        .unbounded_send(Ok(Frame::data(Bytes::from_static(b"{\"id\":1,"))))
        .unwrap();
    chunks
        .unbounded_send(Err(BodyError("connection reset")))
        .unwrap();
    let answer = send(&service, post_with("application/json", body)).await;
    assert_eq!(
        assert_error(&answer, StatusCode::BAD_REQUEST, -32600),
        "null"
    );
    assert_eq!(probe.calls(), 0);
    assert_untouched(&layer);
}

/// 10 000 nested arrays do not overflow the stack. In `params` of an
/// otherwise valid request, the request is tracked like any other (the crate
/// docs define a tracked request by its envelope) and reaches the inner
/// service byte-identical; as a whole body it is not a JSON-RPC message and
/// passes untracked.
#[tokio::test]
async fn deeply_nested_body_does_not_overflow() {
    let depth = 10_000;
    let nested = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
    let (layer, service, probe) = guard(OnDuplicate::Reject);

    let in_params =
        format!(r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{nested}}}"#);
    let answer = send(&service, post(in_params.clone())).await;
    assert_eq!(answer.body, answer_text("1").as_bytes());
    assert_eq!(probe.seen()[0].body, in_params.as_bytes());
    assert_eq!(layer.stats().passed_total, 1, "tracked");
    assert_drained(&layer);

    let answer = send(&service, post(nested.clone())).await;
    assert_eq!(answer.body, "[]", "the echo's empty batch answer");
    assert_eq!(probe.seen()[1].body, nested.as_bytes());
    assert_eq!(layer.stats().passed_total, 1, "not tracked");
}

/// A session at `max_in_flight_per_session` gets 429 and a JSON-RPC `-32000`
/// error carrying the request's id (an array of them for a batch); other
/// sessions are unaffected and the session accepts again once a request ends.
#[tokio::test]
async fn session_at_capacity_is_429() {
    let layer = IdGuardLayer::new().max_in_flight_per_session(1);
    let (inner, mut probe) = echo();
    let service = layer.layer(inner);
    let held = spawn_send(&service, post(request_text("1", "hold")));
    probe.entered().await;

    let answer = send(&service, post(request_text("\"two\"", "tools/call"))).await;
    assert_eq!(
        assert_error(&answer, StatusCode::TOO_MANY_REQUESTS, -32000),
        "\"two\""
    );
    let batch = format!(
        "[{},{}]",
        request_text("2", "tools/call"),
        request_text("3", "tools/call")
    );
    let answer = send(&service, post(batch)).await;
    assert_eq!(answer.status, StatusCode::TOO_MANY_REQUESTS);
    let value = answer.json();
    let errors = value.as_array().expect("an array for a batch");
    assert_eq!(errors.len(), 2);
    for (error, id) in errors.iter().zip([2, 3]) {
        assert_error_object(error, -32000);
        assert_eq!(error["id"], id);
    }
    assert_eq!(probe.calls(), 1);

    let mut other = post(request_text("2", "tools/call"));
    other
        .headers_mut()
        .insert("mcp-session-id", "another-session".parse().unwrap());
    assert_eq!(
        send(&service, other).await.body,
        answer_text("2").as_bytes()
    );

    probe.release(1);
    within(held).await.unwrap();
    let answer = send(&service, post(request_text("\"two\"", "tools/call"))).await;
    assert_eq!(answer.body, answer_text("\"two\"").as_bytes());
    assert_eq!(layer.stats().rejected_total, 3);
    assert_drained(&layer);
}

/// GET and DELETE pass untouched even with a session, a JSON content type and
/// a JSON-RPC body: same method, headers and body, nothing tracked.
#[tokio::test]
async fn get_and_delete_are_untouched() {
    let (layer, service, probe) = guard(OnDuplicate::Reject);
    let text = request_text("1", "tools/call");
    for method in [Method::GET, Method::DELETE] {
        let mut request = post(text.clone());
        *request.method_mut() = method.clone();
        let headers = request.headers().clone();
        send(&service, request).await;
        let seen = probe.seen().pop().unwrap();
        assert_eq!(seen.method, method);
        assert_eq!(seen.headers, headers);
        assert_eq!(seen.body, text.as_bytes());
    }
    assert_untouched(&layer);
}

/// A POST carrying a session id is tracked whatever `MCP-Protocol-Version`
/// it claims: a server that speaks both revisions routes it into the session
/// by id. Two `id: 1` claiming 2026-07-28 used to pass untracked, both
/// reaching the server as `1` (the cross-wire); now the second is rejected.
#[tokio::test]
async fn a_session_post_claiming_a_sessionless_revision_is_tracked() {
    let (layer, service, mut probe) = guard(OnDuplicate::Reject);
    let text = request_text("1", "hold");
    let request = || {
        let mut request = post(text.clone());
        request
            .headers_mut()
            .insert("mcp-protocol-version", "2026-07-28".parse().unwrap());
        request
    };
    let first = spawn_send(&service, request());
    assert_eq!(probe.entered().await, "1");
    let second = send(&service, request()).await;
    assert_eq!(assert_error(&second, StatusCode::BAD_REQUEST, -32600), "1");
    assert_eq!(probe.calls(), 1, "the duplicate never reached the server");
    probe.release(1);
    assert_eq!(
        within(first).await.unwrap().body,
        answer_text("1").as_bytes()
    );
    assert_eq!(layer.stats().rejected_total, 1);
    assert_drained(&layer);
}

/// Without a session, a request of revision 2026-07-28 passes untouched:
/// each answer comes back on its own POST there, so ids cannot cross-wire.
#[tokio::test]
async fn sessionless_requests_are_untouched() {
    let (layer, service, mut probe) = guard(OnDuplicate::Reject);
    let text = request_text("1", "hold");
    let request = || {
        let mut request = post(text.clone());
        request.headers_mut().remove("mcp-session-id");
        request
            .headers_mut()
            .insert("mcp-protocol-version", "2026-07-28".parse().unwrap());
        request
    };
    let first = spawn_send(&service, request());
    assert_eq!(probe.entered().await, "1");
    let second = spawn_send(&service, request());
    assert_eq!(probe.entered().await, "1");
    assert_untouched(&layer);
    probe.release(2);
    for task in [first, second] {
        assert_eq!(
            within(task).await.unwrap().body,
            answer_text("1").as_bytes()
        );
    }
    assert!(probe.seen().iter().all(|seen| seen.body == text.as_bytes()));
    assert_untouched(&layer);
}

/// A request in a session whose `Connection` header names a header the
/// guard decides on is refused (400, `-32600`, `id: null`) before anything
/// reaches the server, whatever the method: a proxy on the way drops the
/// named header, so the server would read another request than the guard
/// did (`Connection: keep-alive, MCP-Protocol-Version` made a session POST
/// look sessionless to the guard and legacy to the server behind the proxy,
/// and two `id: 1` cross-wired there). `Connection: keep-alive, close` and
/// names of other headers pass.
#[tokio::test]
async fn a_connection_header_naming_a_decided_on_header_is_refused() {
    let (layer, service, probe) = guard(OnDuplicate::Reject);
    let named = [
        "keep-alive, MCP-Protocol-Version",
        "Mcp-Session-Id",
        "close,mcp-method",
        " Last-Event-ID ",
        "content-type",
        "Content-Length",
        "content-encoding",
        "accept",
        "traceparent",
        "host",
        "origin",
    ];
    for value in named {
        for method in [Method::POST, Method::GET, Method::DELETE] {
            let mut request = post(request_text("1", "tools/call"));
            *request.method_mut() = method.clone();
            request
                .headers_mut()
                .insert("mcp-protocol-version", "2026-07-28".parse().unwrap());
            request
                .headers_mut()
                .insert("connection", value.parse().unwrap());
            let answer = send(&service, request).await;
            assert_eq!(
                assert_error(&answer, StatusCode::BAD_REQUEST, -32600),
                "null",
                "{method} with Connection: {value}"
            );
        }
    }
    assert_eq!(probe.calls(), 0, "nothing reached the server");
    for value in ["keep-alive", "close", "keep-alive, x-custom", "upgrade"] {
        let mut request = post(request_text("1", "tools/call"));
        request
            .headers_mut()
            .insert("connection", value.parse().unwrap());
        let answer = send(&service, request).await;
        assert_eq!(answer.status, StatusCode::OK, "Connection: {value}");
    }
    assert_eq!(probe.calls(), 4);
    assert_drained(&layer);
}

/// Under `Reject`, a batch with a duplicate inside (against an in-flight
/// request, and between two of its own members) is answered with an array of
/// errors, one per request of the batch in order (notifications get none),
/// each carrying its request's id; nothing reaches the inner service.
#[tokio::test]
async fn batch_with_duplicate_under_reject() {
    let (layer, service, mut probe) = guard(OnDuplicate::Reject);
    let held = spawn_send(&service, post(request_text("1", "hold")));
    probe.entered().await;
    let batch = format!(
        r#"[{},{},{{"jsonrpc":"2.0","method":"notifications/progress"}},{},{}]"#,
        request_text("2", "a"),
        request_text("\"1\"", "b"),
        request_text("\"x\"", "c"),
        request_text("2", "d"),
    );
    let answer = send(&service, post(batch)).await;
    assert_eq!(answer.status, StatusCode::BAD_REQUEST);
    let value = answer.json();
    let errors = value.as_array().expect("an array");
    let ids: Vec<&serde_json::Value> = errors.iter().map(|error| &error["id"]).collect();
    assert_eq!(ids, [&json!(2), &json!("1"), &json!("x"), &json!(2)]);
    for error in errors {
        assert_error_object(error, -32600);
    }
    assert_eq!(
        probe.calls(),
        1,
        "only the held request reached the inner service"
    );
    assert_eq!(layer.stats().rejected_total, 4);
    probe.release(1);
    within(held).await.unwrap();
    assert_drained(&layer);
}

/// Under `Remap`, duplicates inside a batch (with each other and with an
/// in-flight request) reach the inner service as distinct ids, and each
/// answer in the batch response carries its request's exact original id.
#[tokio::test]
async fn batch_with_duplicate_under_remap() {
    let (layer, service, mut probe) = guard(OnDuplicate::Remap);
    let held = spawn_send(&service, post(request_text("7", "hold")));
    probe.entered().await;
    let ids = ["1", r#""1""#, r#""\u0031""#, "7", "2"];
    let batch = format!(
        r#"[{},{{"jsonrpc":"2.0","method":"notifications/progress"}},{},{},{},{}]"#,
        request_text(ids[0], "a"),
        request_text(ids[1], "b"),
        request_text(ids[2], "c"),
        request_text(ids[3], "d"),
        request_text(ids[4], "e"),
    );
    let answer = send(&service, post(batch)).await;
    let seen_batch: Vec<Box<RawValue>> =
        serde_json::from_slice(&probe.seen()[1].body).expect("a batch");
    let seen: Vec<String> = seen_batch
        .iter()
        .filter_map(|element| fields(element.get().as_bytes()))
        .filter_map(|message| message.get("id").map(|id| id.get().to_owned()))
        .collect();
    assert_eq!(seen.len(), 5);
    assert_eq!(seen[0], "1");
    for raw in &seen[1..4] {
        server_side(raw);
    }
    assert_eq!(seen[4], "2");
    let keys: std::collections::HashSet<String> = seen
        .iter()
        .map(|raw| serde_json::from_str::<String>(raw).unwrap_or_else(|_| raw.clone()))
        .collect();
    assert_eq!(keys.len(), 5, "distinct server-side ids");
    let expected = format!("[{}]", ids.map(answer_text).join(","));
    assert_eq!(answer.body, expected.as_bytes());
    let stats = layer.stats();
    assert_eq!((stats.passed_total, stats.remapped_total), (3, 3));
    probe.release(1);
    within(held).await.unwrap();
    assert_drained(&layer);
}

/// `reject_status` sets the status of duplicate rejections; the body is the
/// same JSON-RPC `-32600` error carrying the id.
#[tokio::test]
async fn reject_status_is_configurable() {
    let layer = IdGuardLayer::new()
        .on_duplicate(OnDuplicate::Reject)
        .reject_status(StatusCode::CONFLICT);
    let (inner, mut probe) = echo();
    let service = layer.layer(inner);
    let held = spawn_send(&service, post(request_text("\"a\"", "hold")));
    probe.entered().await;
    let answer = send(&service, post(request_text("\"a\"", "tools/call"))).await;
    assert_eq!(assert_error(&answer, StatusCode::CONFLICT, -32600), "\"a\"");
    probe.release(1);
    within(held).await.unwrap();
    assert_drained(&layer);
}

/// Under `Queue` a duplicate waits without reaching the inner service (it
/// counts in flight), and goes with its own id once the earlier exchange has
/// ended.
#[tokio::test]
async fn queued_duplicate_waits_then_goes_with_its_own_id() {
    let (layer, service, mut probe) = guard(OnDuplicate::Queue);
    let held = spawn_send(&service, post(request_text("1", "hold")));
    probe.entered().await;
    let mut queued = answer_of(service.clone(), post(request_text("1", "tools/call")));
    assert!(futures::poll!(queued.as_mut()).is_pending());
    let stats = layer.stats();
    assert_eq!((stats.queued_total, stats.in_flight_requests), (1, 2));
    assert_eq!(
        probe.calls(),
        1,
        "the duplicate has not reached the inner service"
    );
    probe.release(1);
    assert_eq!(
        within(held).await.unwrap().body,
        answer_text("1").as_bytes()
    );
    let answer = within(queued).await;
    assert_eq!(answer.body, answer_text("1").as_bytes());
    assert_eq!(id_text(&probe.seen()[1].body), "1", "its own id");
    assert_drained(&layer);
}

/// Under `Queue` a request that waits longer than `max_queue_wait` gets 503
/// and a JSON-RPC `-32000` error carrying its id, leaves the queue, and never
/// reaches the inner service. (The wait is the guard's own timer; the held
/// request is simply never released before it fires.)
#[tokio::test]
async fn queue_wait_over_the_limit_is_503() {
    let layer = IdGuardLayer::new()
        .on_duplicate(OnDuplicate::Queue)
        .max_queue_wait(Duration::from_millis(100));
    let (inner, mut probe) = echo();
    let service = layer.layer(inner);
    let held = spawn_send(&service, post(request_text("\"q\"", "hold")));
    probe.entered().await;
    let answer = send(&service, post(request_text("\"q\"", "tools/call"))).await;
    assert_eq!(
        assert_error(&answer, StatusCode::SERVICE_UNAVAILABLE, -32000),
        "\"q\""
    );
    assert_eq!(probe.calls(), 1);
    assert_eq!(layer.stats().in_flight_requests, 1, "it left the queue");
    probe.release(1);
    within(held).await.unwrap();
    assert_drained(&layer);
}

/// Under `Queue` a batch with a duplicate is refused as under `Reject`: an
/// array of `-32600` errors, one per request, with `reject_status`.
#[tokio::test]
async fn queue_refuses_a_batch_with_a_duplicate() {
    let (layer, service, mut probe) = guard(OnDuplicate::Queue);
    let held = spawn_send(&service, post(request_text("1", "hold")));
    probe.entered().await;
    let batch = format!("[{},{}]", request_text("2", "a"), request_text("1", "b"));
    let answer = send(&service, post(batch)).await;
    assert_eq!(answer.status, StatusCode::BAD_REQUEST);
    let value = answer.json();
    let errors = value.as_array().expect("an array");
    assert_eq!(errors.len(), 2);
    for (error, id) in errors.iter().zip([2, 1]) {
        assert_error_object(error, -32600);
        assert_eq!(error["id"], id);
    }
    assert_eq!(probe.calls(), 1);
    assert_eq!(layer.stats().rejected_total, 2);
    probe.release(1);
    within(held).await.unwrap();
    assert_drained(&layer);
}

/// A compressed request body: a server that inflates request bodies
/// (Express's body parser does by default) would read the request inside,
/// which the guard cannot see, so it answers `415` itself; `identity` is no
/// compression.
#[tokio::test]
async fn compressed_request_bodies_are_refused() {
    let (layer, service, probe) = guard(OnDuplicate::Remap);
    for encoding in ["gzip", "deflate", "br, identity"] {
        let mut request = post(request_text("1", "tools/call"));
        request
            .headers_mut()
            .insert("content-encoding", encoding.parse().unwrap());
        let answer = send(&service, request).await;
        assert_eq!(
            assert_error(&answer, StatusCode::UNSUPPORTED_MEDIA_TYPE, -32600),
            "null",
            "{encoding}"
        );
    }
    assert_eq!(probe.calls(), 0);
    let mut request = post(request_text("1", "tools/call"));
    request
        .headers_mut()
        .insert("content-encoding", "identity".parse().unwrap());
    let answer = send(&service, request).await;
    assert_eq!(answer.body, answer_text("1").as_bytes());
    assert_eq!(probe.calls(), 1);
    assert_drained(&layer);
}
