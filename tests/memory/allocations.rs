//! Allocations per tracked request (issue 32): each call to the allocator
//! is a few hundred instructions with its free, and a tracked request should
//! cost little more than the service it guards. The counts are pinned, so a
//! change that adds one fails here and says so; one that removes some lowers
//! the pin.

use std::convert::Infallible;
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use http_body_util::Full;
use mcp_id_guard::guard::GuardRequestBody;
use mcp_id_guard::IdGuardLayer;
use tower::{Layer, Service};

use crate::{allocations, call};

/// Allocator calls the guard adds to a tracked request whose id is not in
/// flight (read, admitted, forwarded as is, its JSON answer read, released).
const PASS_THROUGH: u64 = 3;
/// The same when the id is in flight: remapped, and its answer restored.
const REMAPPED: u64 = 13;
/// A request the guard does not track (no session).
const UNTRACKED: u64 = 0;
/// A tracked request whose id is not in flight, answered in an SSE stream
/// as rmcp answers every POST (a priming event, then the answer's event).
const PASS_THROUGH_SSE: u64 = 3;
/// The same when the id is in flight: remapped, and restored in the stream.
const REMAPPED_SSE: u64 = 13;

const HEAD: &[u8] = br#"{"jsonrpc":"2.0","id":"#;

/// How the trivial server answers.
#[derive(Clone, Copy)]
enum Answer {
    /// One `application/json` body.
    Json,
    /// A `text/event-stream` body as rmcp sends it: a priming event, then
    /// the answer's event with its event id.
    Sse,
}

/// A trivial server, the same with and without the guard: reads the body,
/// answers under the id it received (the bodies here all start with their
/// id, which holds no comma).
fn answer<B>(request: Request<B>, kind: Answer) -> Response<Full<Bytes>>
where
    B: Body<Data = Bytes> + Unpin,
{
    let mut body = request.into_body();
    let mut cx = Context::from_waker(Waker::noop());
    // Room for the longest answer, SSE framing included: one allocation
    // whatever the answer's kind.
    let mut answer = Vec::with_capacity(192);
    while let Poll::Ready(Some(Ok(frame))) = std::pin::Pin::new(&mut body).poll_frame(&mut cx) {
        if let (Some(data), true) = (frame.data_ref(), answer.is_empty()) {
            let rest = data
                .strip_prefix(HEAD)
                .expect("a body starting with its id");
            let end = rest
                .iter()
                .position(|&byte| byte == b',')
                .expect("more after the id");
            if let Answer::Sse = kind {
                answer.extend_from_slice(b"data: \nid: 0/0\nretry: 3000\n\ndata: ");
            }
            answer.extend_from_slice(HEAD);
            answer.extend_from_slice(&rest[..end]);
            answer.extend_from_slice(br#","result":{"content":[]}}"#);
            if let Answer::Sse = kind {
                answer.extend_from_slice(b"\nid: 1/0\n\n");
            }
        }
    }
    let mut response = Response::new(Full::new(Bytes::from(answer)));
    let content_type = match kind {
        Answer::Json => "application/json",
        Answer::Sse => "text/event-stream",
    };
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static(content_type),
    );
    response
}

/// A `tools/call` POST of 1 KiB with id 1, in a session or not.
fn request(session: Option<&str>) -> Request<Full<Bytes>> {
    let frame = |fill: &str| {
        format!(
            r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"echo","arguments":{{"items":[1,2.5,true,"x"],"fill":"{fill}"}}}}}}"#
        )
    };
    let body = frame(&"x".repeat(1024 - frame("").len()));
    let mut builder = Request::post("/mcp")
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2025-06-18");
    if let Some(session) = session {
        builder = builder.header("mcp-session-id", session);
    }
    builder
        .body(Full::new(Bytes::from(body)))
        .expect("valid request")
}

/// Reads a response body to its end.
fn finish<B: Body + Unpin>(mut response: Response<B>) {
    let mut cx = Context::from_waker(Waker::noop());
    while let Poll::Ready(Some(frame)) = std::pin::Pin::new(response.body_mut()).poll_frame(&mut cx)
    {
        assert!(frame.is_ok(), "the body should not fail");
    }
}

/// Allocator calls per exchange of `service`, over 64 after 8 to warm up
/// (the session and the table's spare capacity exist by then).
fn per_exchange<S, B>(service: &mut S, session: Option<&str>) -> u64
where
    S: Service<Request<Full<Bytes>>, Response = Response<B>, Error = Infallible>,
    B: Body + Unpin,
{
    for _ in 0..8 {
        let built = request(session);
        finish(call(service, built));
    }
    const EXCHANGES: u64 = 64;
    let mut counted = 0;
    for _ in 0..EXCHANGES {
        // The request is built outside the count: the client's cost.
        let built = request(session);
        let before = allocations();
        finish(call(service, built));
        counted += allocations() - before;
    }
    counted / EXCHANGES
}

/// What the guard adds, per exchange, to the same exchanges bare.
fn added(session: Option<&str>, hold: bool, kind: Answer) -> u64 {
    let bare = per_exchange(
        &mut tower::service_fn(move |request: Request<Full<Bytes>>| {
            std::future::ready(Ok::<_, Infallible>(answer(request, kind)))
        }),
        session,
    );
    let layer = IdGuardLayer::new();
    let mut guarded = layer.layer(tower::service_fn(
        move |request: Request<GuardRequestBody<Full<Bytes>>>| {
            std::future::ready(Ok::<_, Infallible>(answer(request, kind)))
        },
    ));
    // An id 1 held in flight makes every measured request a duplicate.
    let held = hold.then(|| call(&mut guarded, request(session)));
    let guarded = per_exchange(&mut guarded, session);
    let stats = layer.stats();
    assert_eq!(
        stats.in_flight_requests,
        usize::from(hold),
        "measured requests released"
    );
    if hold {
        assert!(
            stats.remapped_total >= 64,
            "measured requests remapped: {stats:?}"
        );
    } else if session.is_some() {
        assert!(
            stats.passed_total >= 64 && stats.remapped_total == 0,
            "passed: {stats:?}"
        );
    }
    drop(held);
    guarded.saturating_sub(bare)
}

const SESSION: &str = "3f1c2a9e-5c1d-4e2f-8a3b-000000001eef";

#[test]
fn a_tracked_request_adds_a_pinned_number_of_allocations() {
    let pass = added(Some(SESSION), false, Answer::Json);
    let remapped = added(Some(SESSION), true, Answer::Json);
    let untracked = added(None, false, Answer::Json);
    let pass_sse = added(Some(SESSION), false, Answer::Sse);
    let remapped_sse = added(Some(SESSION), true, Answer::Sse);
    assert_eq!(
        (pass, remapped, untracked, pass_sse, remapped_sse),
        (
            PASS_THROUGH,
            REMAPPED,
            UNTRACKED,
            PASS_THROUGH_SSE,
            REMAPPED_SSE
        ),
        "allocator calls the guard adds per request (pass-through, remapped, untracked, and the \
         first two answered in SSE): fewer is progress (lower the pins), more needs a reason"
    );
}
