//! Memory bound: what the guard's bookkeeping costs per in-flight request,
//! that it is all given back when exchanges end (idle sessions hold nothing),
//! and that given-up exchanges are counted and bounded.
//!
//! A counting global allocator tracks the bytes each thread has requested and
//! not yet freed (`Layout::size`, allocator overhead excluded). Everything a
//! measurement covers runs on the test's own thread: the guard is driven
//! directly as a `tower::Service` over a trivial inner service whose futures
//! and bodies are ready at once, so no runtime or other thread is involved and
//! tests running in parallel do not disturb each other's counts.
//!
//! The cost of the guard is the live bytes while holding N exchanges through
//! `IdGuard` minus the live bytes while holding the same N exchanges straight
//! from the inner service: what remains is the guard's table entries, its
//! per-exchange registration and its wrapper around the response.

use std::convert::Infallible;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use http_body_util::Full;
use mcp_id_guard::guard::{GuardRequestBody as RequestBody, GuardResponseBody as ResponseBody};
use mcp_id_guard::{IdGuardLayer, Stats};
use tower::{Layer, Service};

use crate::{answer_event, call, live, peak, reset_peak};

// ---------------------------------------------------------------------------
// Driving the guard
// ---------------------------------------------------------------------------

type InnerRequest = Request<RequestBody<Full<Bytes>>>;

/// A trivial MCP server: answers every request at once with a one-event
/// `text/event-stream`, whose body stays open until it is read.
fn inner(
) -> impl Service<InnerRequest, Response = Response<Full<Bytes>>, Error = Infallible, Future: Send> + Clone
{
    tower::service_fn(|request: InnerRequest| {
        let event = answer_event(request);
        async {
            let response = Response::builder()
                .header("content-type", "text/event-stream")
                .body(Full::new(event))
                .expect("valid response");
            Ok::<_, Infallible>(response)
        }
    })
}

/// A tracked `tools/call` POST in `session` with the raw JSON id `id`.
fn request(session: &str, id: &str) -> Request<Full<Bytes>> {
    let body = format!(
        r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"echo","arguments":{{"sentinel":"x"}}}}}}"#
    );
    Request::post("/mcp")
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2025-06-18")
        .header("mcp-session-id", session)
        .body(Full::new(Bytes::from(body)))
        .expect("valid request")
}

/// Reads a response body to its end: the exchange ends normally.
fn finish<B: Body + Unpin>(mut response: Response<B>) {
    let mut cx = Context::from_waker(Waker::noop());
    loop {
        match std::pin::Pin::new(response.body_mut()).poll_frame(&mut cx) {
            Poll::Ready(Some(Ok(_))) => {}
            Poll::Ready(None) => return,
            Poll::Ready(Some(Err(_))) => panic!("the body should not fail"),
            Poll::Pending => panic!("the body should be ready at once"),
        }
    }
}

/// The ids a workload sends in each session.
#[derive(Debug, Clone, Copy)]
enum Ids {
    /// `0`, `1`, ... : no collisions (the usual, well-behaved case).
    Distinct,
    /// Every request `1`: one passes, the others are remapped.
    AllOne,
}

impl Ids {
    fn id(self, index: usize) -> String {
        match self {
            Ids::Distinct => index.to_string(),
            Ids::AllOne => "1".to_owned(),
        }
    }
}

/// A workload: `per_session` requests in each of `sessions` sessions named
/// `<prefix>-<n>`.
#[derive(Debug, Clone, Copy)]
struct Workload {
    prefix: &'static str,
    sessions: usize,
    per_session: usize,
    ids: Ids,
}

impl Workload {
    fn len(&self) -> usize {
        self.sessions * self.per_session
    }

    /// Every request of the workload, built lazily (session-major order, so
    /// a session's requests are in flight together).
    fn requests(self) -> impl Iterator<Item = Request<Full<Bytes>>> {
        (0..self.sessions).flat_map(move |session| {
            let name = format!("{}-{session:05}", self.prefix);
            (0..self.per_session).map(move |index| request(&name, &self.ids.id(index)))
        })
    }

    /// Sends every request through `service` and holds the responses.
    fn hold<S, B>(self, service: &mut S) -> Vec<Response<B>>
    where
        S: Service<Request<Full<Bytes>>, Response = Response<B>, Error = Infallible>,
    {
        let mut held = Vec::with_capacity(self.len());
        for request in self.requests() {
            held.push(call(service, request));
        }
        held
    }

    /// Live bytes while the workload's exchanges are held straight from the
    /// inner service (requests built and consumed the same way as through
    /// the guard).
    fn bare_bytes(self) -> isize {
        let mut service = tower::service_fn(|request: Request<Full<Bytes>>| {
            let mut inner = inner();
            inner.call(request.map(RequestBody::new))
        });
        let baseline = live();
        let held = self.hold(&mut service);
        let bytes = live() - baseline;
        held.into_iter().for_each(finish);
        bytes
    }
}

#[track_caller]
fn assert_idle(stats: &Stats, what: &str) {
    assert_eq!(
        (stats.in_flight_requests, stats.in_flight_sessions),
        (0, 0),
        "{what}: nothing may stay in flight: {stats:?}"
    );
}

/// Bytes the guard spends per in-flight request for `workload`, checked
/// against `stats` while held; returns (bytes per request, the guard's live
/// bytes while held, residual bytes after every exchange ended normally).
fn guarded_cost(layer: &IdGuardLayer, workload: Workload) -> (f64, isize, isize) {
    let bare = workload.bare_bytes();
    let mut service = layer.layer(inner());
    let baseline = live();
    let held = workload.hold(&mut service);
    let held_bytes = live() - baseline;
    let stats = layer.stats();
    assert_eq!(
        (stats.in_flight_requests, stats.in_flight_sessions),
        (workload.len(), workload.sessions),
        "every held exchange is in flight: {stats:?}"
    );
    let guard_bytes = held_bytes - bare;
    let per_request = guard_bytes as f64 / workload.len() as f64;
    held.into_iter().for_each(finish);
    let residual = live() - baseline;
    let stats = layer.stats();
    assert_idle(&stats, "after every exchange ended normally");
    assert_eq!(
        stats.abandoned_ids, 0,
        "exchanges that ended normally shadow nothing: {stats:?}"
    );
    (per_request, guard_bytes, residual)
}

/// How much larger a held guarded response is than the inner one: the
/// guard's response body wrapper, registration included, inline.
fn inline_bytes() -> usize {
    std::mem::size_of::<Response<ResponseBody<Full<Bytes>>>>()
        - std::mem::size_of::<Response<Full<Bytes>>>()
}

/// Generous upper bound on the guard's bytes per in-flight request.
const MAX_BYTES_PER_REQUEST: f64 = 2048.0;

// ---------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------

/// 100 000 in-flight requests across 10 000 sessions (ids `0`..`9` in each)
/// cost the guard less than 2 KiB each on top of what the same exchanges cost
/// without it. Once every exchange has ended normally nothing is in flight,
/// no session is tracked, no id is shadowed, and the live bytes are back to
/// the baseline except for the capacity the session maps keep; a second round
/// on 10 000 *other* sessions leaves no more behind, so idle sessions hold
/// nothing.
#[test]
fn in_flight_requests_cost_bounded_bytes_and_idle_sessions_nothing() {
    let layer = IdGuardLayer::new();
    let round = |prefix| Workload {
        prefix,
        sessions: 10_000,
        per_session: 10,
        ids: Ids::Distinct,
    };
    let baseline = live();
    let (per_request, guard_bytes, residual) = guarded_cost(&layer, round("first"));
    let after_first = live() - baseline;
    let (per_request_again, _, _) = guarded_cost(&layer, round("second"));
    let after_second = live() - baseline;
    eprintln!(
        "memory: 100000 in flight over 10000 sessions (distinct ids): guard {guard_bytes} B \
         = {per_request:.0} B per in-flight request ({} B of it inline in the held \
         response, the rest on the heap; second round {per_request_again:.0} B); residual \
         after release {residual} B, after a second round on other sessions {after_second} B \
         (first {after_first} B)",
        inline_bytes()
    );
    assert!(
        per_request < MAX_BYTES_PER_REQUEST,
        "{per_request:.0} B per in-flight request"
    );
    assert!(
        per_request_again < MAX_BYTES_PER_REQUEST,
        "{per_request_again:.0} B per in-flight request"
    );
    // What stays is the capacity of the guard's session maps (hash maps do
    // not shrink), not per-session state: a few percent of the peak, and it
    // does not grow with more sessions coming and going.
    assert!(
        residual < guard_bytes / 20,
        "residual {residual} B after release of {guard_bytes} B"
    );
    // Other sessions hash to the shards in other numbers, so a shard's map
    // may grow once in the second round (one growth was 14 464 B, seen in
    // CI): allow a few, far less than any state kept per session would
    // leave behind (8 B for each of the 10 000 sessions is 80 000 B).
    assert!(
        after_second <= after_first + 64 * 1024,
        "a second round on other sessions must not leave more behind: \
         {after_first} B then {after_second} B"
    );
}

/// 100 000 in-flight requests across 10 000 sessions that all use the id `1`
/// (one passes per session, nine are remapped, their responses restored)
/// also cost the guard less than 2 KiB each, and drain completely.
#[test]
fn colliding_in_flight_requests_cost_bounded_bytes() {
    let layer = IdGuardLayer::new();
    let workload = Workload {
        prefix: "colliding",
        sessions: 10_000,
        per_session: 10,
        ids: Ids::AllOne,
    };
    let (per_request, guard_bytes, residual) = guarded_cost(&layer, workload);
    let stats = layer.stats();
    eprintln!(
        "memory: 100000 in flight over 10000 sessions (all id 1, 90% remapped): guard \
         {guard_bytes} B = {per_request:.0} B per in-flight request ({} B of it inline in the \
         held response); residual after release {residual} B; {stats:?}",
        inline_bytes()
    );
    assert_eq!(
        (stats.passed_total, stats.remapped_total),
        (10_000, 90_000),
        "one request per session passes, the rest are remapped"
    );
    assert!(
        per_request < MAX_BYTES_PER_REQUEST,
        "{per_request:.0} B per in-flight request"
    );
    assert!(
        residual < guard_bytes / 20,
        "residual {residual} B after release of {guard_bytes} B"
    );
}

/// Exchanges dropped before their response ended (a client gone) are
/// abandoned: nothing stays in flight or tracked, `abandoned_ids` counts each
/// one, each shadow costs a bounded number of bytes, and a reuse of such an id
/// is remapped. At most 65 536 shadows are kept however many exchanges are
/// abandoned, so their memory is bounded; with a short `abandoned_id_ttl`
/// they expire and the bytes come back.
#[test]
fn abandoned_exchanges_are_counted_and_bounded() {
    const CAP: usize = 65_536;
    let batch = Workload {
        prefix: "abandoned",
        sessions: 1_000,
        per_session: 10,
        ids: Ids::Distinct,
    };

    // A batch of 10 000 abandoned exchanges.
    let layer = IdGuardLayer::new();
    let mut service = layer.layer(inner());
    let baseline = live();
    let held = batch.hold(&mut service);
    let held_bytes = live() - baseline;
    drop(held);
    let shadow_bytes = live() - baseline;
    let stats = layer.stats();
    assert_idle(&stats, "after dropping the held exchanges");
    assert_eq!(
        stats.abandoned_ids,
        batch.len(),
        "each abandoned exchange shadows its id: {stats:?}"
    );
    let per_shadow = shadow_bytes as f64 / batch.len() as f64;

    // A reuse of an abandoned id goes with a server-side id.
    let reuse = call(&mut service, request("abandoned-00000", "0"));
    finish(reuse);
    let stats = layer.stats();
    assert_eq!(
        stats.remapped_total, 1,
        "reusing a shadowed id is remapped: {stats:?}"
    );

    // Abandoning 60 000 more: only up to the cap are kept.
    let more = Workload {
        prefix: "abandoned-more",
        sessions: 6_000,
        ..batch
    };
    drop(more.hold(&mut service));
    let capped_bytes = live() - baseline;
    let stats = layer.stats();
    assert_idle(&stats, "after dropping 60 000 more");
    assert_eq!(
        stats.abandoned_ids, CAP,
        "at most {CAP} abandoned ids are kept: {stats:?}"
    );
    eprintln!(
        "memory: 10000 abandoned exchanges (1000 sessions): held {held_bytes} B, shadows \
         {shadow_bytes} B = {per_shadow:.0} B per abandoned id; 70000 abandoned: {} kept \
         (cap), {capped_bytes} B = {:.0} B per kept id",
        stats.abandoned_ids,
        capped_bytes as f64 / CAP as f64
    );
    assert!(
        per_shadow < MAX_BYTES_PER_REQUEST,
        "{per_shadow:.0} B per abandoned id"
    );
    assert!(
        (capped_bytes as f64) < CAP as f64 * MAX_BYTES_PER_REQUEST,
        "{capped_bytes} B for {CAP} abandoned ids"
    );
    drop(service);
    drop(layer);

    // With a short TTL the shadows expire (on the next use of their shard)
    // and their memory comes back, all but the capacity the shard queues and
    // maps keep (they do not shrink): a second round leaves no more behind.
    // (The TTL is long enough that none expires while the batch is still
    // being dropped, even in a slow debug build.)
    let ttl = Duration::from_secs(1);
    let layer = IdGuardLayer::new().abandoned_id_ttl(ttl);
    let mut service = layer.layer(inner());
    let baseline = live();
    let mut residuals = Vec::new();
    for round in 1..=2 {
        let held = batch.hold(&mut service);
        let first_abandoned = Instant::now();
        drop(held);
        let abandoned_in = first_abandoned.elapsed();
        assert!(abandoned_in < ttl, "abandoning took {abandoned_in:?}");
        assert_eq!(layer.stats().abandoned_ids, batch.len());
        let shadows = live() - baseline;
        // Waiting out the TTL is the behaviour under test, not
        // synchronisation: nothing else runs. Counted from the last id
        // abandoned (the end of the drop), not the first: on a loaded
        // machine the drop took long enough that the ids abandoned last had
        // not expired when the first had (CI, with fuzzing alongside: 1 060
        // of 10 000 left).
        std::thread::sleep(ttl + Duration::from_millis(5));
        // One normal exchange per session touches every shard.
        let touch = Workload {
            per_session: 1,
            ..batch
        };
        touch.hold(&mut service).into_iter().for_each(finish);
        let stats = layer.stats();
        assert_idle(&stats, "after the shadows expired");
        assert_eq!(stats.abandoned_ids, 0, "expired: {stats:?}");
        let residual = live() - baseline;
        eprintln!(
            "memory: round {round}: 10000 abandoned ids with a {ttl:?} TTL (abandoned in \
             {abandoned_in:?}): {shadows} B, after expiry {residual} B"
        );
        assert!(
            residual < shadows / 2,
            "expired shadows give their memory back: {shadows} B then {residual} B"
        );
        residuals.push(residual);
    }
    assert!(
        residuals[1] <= residuals[0] + 4096,
        "expired shadows leave nothing behind: residuals {residuals:?}"
    );
}

// ---------------------------------------------------------------------------
// Streaming restore: memory does not grow with the response
// ---------------------------------------------------------------------------

/// How big the streamed responses are in `cargo test`; the full-size run
/// (1 GiB, as in the issue that asked for it) is
/// `cargo test --release --all-features --test memory -- --ignored huge`.
const STREAMED_MIB: usize = 64;

/// The peak the guard may add while restoring a response of any size.
const MAX_STREAMING_PEAK: isize = 16 << 20;

/// A response body of `total` bytes: `head`, then `fill` bytes of `x` in 64 KiB
/// chunks (one shared buffer: the body itself allocates nothing per chunk),
/// then `tail`.
struct Streamed {
    head: Option<Bytes>,
    chunk: Bytes,
    left: usize,
    tail: Option<Bytes>,
}

impl Streamed {
    fn new(head: String, fill: usize, tail: String) -> Self {
        Self {
            head: Some(Bytes::from(head)),
            chunk: Bytes::from(vec![b'x'; 64 << 10]),
            left: fill,
            tail: Some(Bytes::from(tail)),
        }
    }
}

impl Body for Streamed {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Infallible>>> {
        let next = if let Some(head) = self.head.take() {
            Some(head)
        } else if self.left > 0 {
            let take = self.left.min(self.chunk.len());
            self.left -= take;
            Some(self.chunk.slice(..take))
        } else {
            self.tail.take()
        };
        Poll::Ready(next.map(|data| Ok(http_body::Frame::data(data))))
    }
}

/// One streamed answer shape: the content type, and whether `id` comes first
/// (rmcp, Python) or last (the TypeScript SDK).
#[derive(Debug, Clone, Copy)]
enum Shape {
    Json { id_first: bool },
    Sse { id_first: bool },
}

/// An inner service that answers each request with a `mib` MiB `shape`
/// response carrying the id it received (read from the request body).
fn streaming_inner(
    shape: Shape,
    mib: usize,
) -> impl Service<InnerRequest, Response = Response<Streamed>, Error = Infallible, Future: Send> + Clone
{
    tower::service_fn(move |request: InnerRequest| async move {
        let body = {
            let mut body = request.into_body();
            let mut bytes = Vec::new();
            while let Poll::Ready(Some(Ok(frame))) =
                std::pin::Pin::new(&mut body).poll_frame(&mut Context::from_waker(Waker::noop()))
            {
                if let Ok(data) = frame.into_data() {
                    bytes.extend_from_slice(&data);
                }
            }
            bytes
        };
        let value: serde_json::Value = serde_json::from_slice(&body).expect("a JSON request");
        let id = value["id"].to_string();
        let fill = mib << 20;
        let (content_type, head, tail) = match shape {
            Shape::Json { id_first: true } => (
                "application/json",
                format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{{"text":""#),
                r#""}}"#.to_owned(),
            ),
            Shape::Json { id_first: false } => (
                "application/json",
                r#"{"jsonrpc":"2.0","result":{"text":""#.to_owned(),
                format!(r#""}},"id":{id}}}"#),
            ),
            Shape::Sse { id_first: true } => (
                "text/event-stream",
                format!(r#"data: {{"jsonrpc":"2.0","id":{id},"result":{{"text":""#),
                "\"}}\n\n".to_owned(),
            ),
            Shape::Sse { id_first: false } => (
                "text/event-stream",
                r#"data: {"jsonrpc":"2.0","result":{"text":""#.to_owned(),
                format!("\"}},\"id\":{id}}}\n\n"),
            ),
        };
        let response = Response::builder()
            .header("content-type", content_type)
            .body(Streamed::new(head, fill, tail))
            .expect("valid response");
        Ok::<_, Infallible>(response)
    })
}

/// Reads a body to its end, keeping only its first 256 and last 256 bytes.
fn drain_ends<B: Body<Data = Bytes> + Unpin>(mut body: B) -> (Vec<u8>, Vec<u8>, usize) {
    let mut cx = Context::from_waker(Waker::noop());
    let (mut first, mut last, mut total) = (Vec::new(), Vec::new(), 0);
    loop {
        match std::pin::Pin::new(&mut body).poll_frame(&mut cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Ok(data) = frame.into_data() {
                    total += data.len();
                    if first.len() < 256 {
                        let take = data.len().min(256 - first.len());
                        first.extend_from_slice(&data[..take]);
                    }
                    last.extend_from_slice(&data[data.len().saturating_sub(256)..]);
                    let excess = last.len().saturating_sub(256);
                    last.drain(..excess);
                }
            }
            Poll::Ready(None) => return (first, last, total),
            Poll::Ready(Some(Err(_))) => panic!("the body should not fail"),
            Poll::Pending => panic!("the body should be ready at once"),
        }
    }
}

/// A remapped request's `mib` MiB answer of every shape is restored (the
/// client's id is back, at the start or the end) while the guard's peak
/// memory stays under [`MAX_STREAMING_PEAK`]: the answer is never held whole.
fn remapped_answers_stream(mib: usize) {
    for shape in [
        Shape::Json { id_first: true },
        Shape::Json { id_first: false },
        Shape::Sse { id_first: true },
        Shape::Sse { id_first: false },
    ] {
        let layer = IdGuardLayer::new();
        let mut service = layer.layer(streaming_inner(shape, mib));
        // The first `id: 1` stays in flight, so the second is remapped.
        let held = call(&mut service, request("stream", "1"));
        let response = call(&mut service, request("stream", "1"));
        assert_eq!(layer.stats().remapped_total, 1, "{shape:?}");
        drop(held);
        reset_peak();
        let baseline = live();
        let (first, last, total) = drain_ends(response.into_body());
        let added = peak() - baseline;
        eprintln!("{shape:?}: {mib} MiB answer, {total} bytes out, peak added {added} bytes");
        let restored_first = String::from_utf8_lossy(&first).contains(r#""id":1,"#);
        let restored_last = String::from_utf8_lossy(&last).contains(r#""id":1}"#);
        assert!(
            restored_first || restored_last,
            "{shape:?}: the client's id is restored: {:?} ... {:?}",
            String::from_utf8_lossy(&first),
            String::from_utf8_lossy(&last)
        );
        assert!(
            total > mib << 20,
            "{shape:?}: the whole answer went through"
        );
        assert!(
            added < MAX_STREAMING_PEAK,
            "{shape:?}: restoring a {mib} MiB answer added {added} bytes at the peak"
        );
        assert_eq!(layer.stats().restored_total, 1, "{shape:?}");
        assert_idle(&layer.stats(), "after the streamed answers");
    }
}

#[test]
fn remapped_answers_stream_in_bounded_memory() {
    remapped_answers_stream(STREAMED_MIB);
}

/// The same at 1 GiB: `cargo test --release --all-features --test memory -- --ignored huge`.
#[test]
#[ignore = "1 GiB per shape; run in release"]
fn huge_remapped_answers_stream_in_bounded_memory() {
    remapped_answers_stream(1024);
}
