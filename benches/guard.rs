//! The guard's cost, measured in-process with criterion. Method and results
//! are in `BENCHMARKS.md`.
//!
//! ```text
//! cargo bench --bench guard                     # everything (~10 min)
//! cargo bench --bench guard -- overhead/        # 1. layer overhead
//! cargo bench --bench guard -- naive_vs_splice/ # 2. naive Value round trip
//! cargo bench --bench guard -- sse/             # 3. SSE rewrite throughput
//! cargo bench --bench guard -- sessions/        # 4. session scaling
//! cargo bench --bench guard -- batches/         # 5. batch tracking cost
//! python3 benches/summarize.py                  # the tables of BENCHMARKS.md
//! ```
//!
//! Every JSON body is padded to its exact size with the same kind of content:
//! an `items` array of small objects (numbers, booleans, short strings, a
//! string with escapes), as a `tools/call` argument or a structured result
//! would carry, plus a `fill` string that makes up the last bytes.

use std::convert::Infallible;
use std::future::Future;
use std::hint::black_box;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes};
use criterion::{criterion_group, BenchmarkId, Criterion, Throughput};
use http::header::{ACCEPT, CONTENT_LENGTH, CONTENT_TYPE};
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Response, Uri};
use http_body::Body;
use http_body_util::{BodyExt, Full};
use mcp_id_guard::guard::GuardResponseBody;
use mcp_id_guard::{internals, IdGuard, IdGuardLayer, OnDuplicate};
use serde_json::Value;
use tower::{Layer, Service, ServiceExt};

#[path = "guard/rmcp.rs"]
mod rmcp_server;

const KIB: usize = 1024;
const MIB: usize = 1024 * 1024;

/// Request body sizes of the in-process benchmarks.
const SIZES: [usize; 4] = [256, KIB, 64 * KIB, MIB];

static MCP_SESSION_ID: HeaderName = HeaderName::from_static("mcp-session-id");

/// A server-side id as a guard would mint it, carrying the client id `1`.
const SERVER_ID: &str = r#""mcp-id-guard:0123456789abcdef:0:1""#;

fn label(size: usize) -> String {
    match size {
        size if size >= MIB && size % MIB == 0 => format!("{}MiB", size / MIB),
        size if size >= KIB && size % KIB == 0 => format!("{}KiB", size / KIB),
        size => format!("{size}B"),
    }
}

// ---------------------------------------------------------------------------
// Bodies
// ---------------------------------------------------------------------------

/// The members `"fill":"…","items":[…]` (without braces), exactly `len` bytes.
fn padding(len: usize) -> String {
    // `"fill":"` + `",` and `"items":` around the fill and the array.
    const FRAME: usize = 10 + 8;
    let mut items = String::from("[");
    for n in 0.. {
        let item = format!(
            r#"{{"n":{n},"name":"item-{n}","ok":true,"score":{}.25,"tags":["alpha","beta"],"text":"line {n}: \"quoted\" words\nand a newline"}}"#,
            n * 7
        );
        let separator = usize::from(n > 0);
        if FRAME + items.len() + separator + item.len() + 1 > len {
            break;
        }
        if n > 0 {
            items.push(',');
        }
        items.push_str(&item);
    }
    items.push(']');
    let fill = len
        .checked_sub(FRAME + items.len())
        .expect("padding too short");
    format!(r#""fill":"{}","items":{items}"#, "x".repeat(fill))
}

/// A `tools/call` request with the id JSON text `id`, exactly `size` bytes,
/// its arguments token-dense (see [`padding`]).
fn request_json(id: &str, size: usize) -> Bytes {
    request_json_with(id, size, padding)
}

/// The same request with one long string as its arguments: the body the
/// scanner skips at memchr speed.
fn request_json_string(id: &str, size: usize) -> Bytes {
    request_json_with(id, size, |len| {
        // `"fill":"` and `"` around the string.
        format!(r#""fill":"{}""#, "x".repeat(len - 9))
    })
}

fn request_json_with(id: &str, size: usize, pad: impl Fn(usize) -> String) -> Bytes {
    let frame = |pad: &str| {
        format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"echo","arguments":{{{pad}}}}}}}"#
        )
    };
    let body = frame(&pad(size - frame("").len()));
    assert_eq!(body.len(), size);
    Bytes::from(body)
}

/// A `tools/call` result with the id JSON text `id`, exactly `size` bytes.
fn response_json(id: &str, size: usize) -> String {
    let frame = |pad: &str| {
        format!(
            r#"{{"jsonrpc":"2.0","id":{id},"result":{{"content":[{{"type":"text","text":"ok"}}],"structuredContent":{{{pad}}}}}}}"#
        )
    };
    let body = frame(&padding(size - frame("").len()));
    assert_eq!(body.len(), size);
    body
}

/// The inner service's answer around its id: small, and under the request's
/// own id, as a real server answers (an answer under another id would leave
/// the request unanswered, and its id abandoned, to the guard).
const ANSWER_HEAD: &[u8] = br#"{"jsonrpc":"2.0","id":"#;
const ANSWER_TAIL: &[u8] =
    br#","result":{"content":[{"type":"text","text":"ECHO:bench"}],"isError":false}}"#;

// ---------------------------------------------------------------------------
// The inner service
// ---------------------------------------------------------------------------

/// A trivial server: reads the request body to its end, as a real server
/// does, then answers a small `application/json` JSON-RPC response under
/// the request's id (a server-side id when the guard remapped it).
#[derive(Clone)]
struct Fixed;

impl Fixed {
    fn new() -> Self {
        Self
    }
}

impl<B> Service<Request<B>> for Fixed
where
    B: Body + Unpin,
{
    type Response = Response<Full<Bytes>>;
    type Error = Infallible;
    type Future = Drain<B>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        Drain {
            body: request.into_body(),
            answer: Vec::with_capacity(ANSWER_HEAD.len() + 64 + ANSWER_TAIL.len()),
            read: 0,
        }
    }
}

/// [`Fixed`]'s response future: drains the body, then answers.
struct Drain<B> {
    body: B,
    /// The answer, its id copied from the body's first frame.
    answer: Vec<u8>,
    read: usize,
}

/// The id token a request body starts with (`{"jsonrpc":"2.0","id":…,`):
/// the bench's bodies all start so, and their ids hold no comma.
fn id_in(head: &[u8]) -> &[u8] {
    let rest = head
        .strip_prefix(ANSWER_HEAD)
        .expect("the bench's bodies start with their id");
    let end = rest
        .iter()
        .position(|&byte| byte == b',')
        .expect("a member after the id");
    &rest[..end]
}

impl<B: Body + Unpin> Future for Drain<B> {
    type Output = Result<Response<Full<Bytes>>, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        while let Some(frame) = ready!(Pin::new(&mut this.body).poll_frame(cx)) {
            match frame {
                Ok(frame) => {
                    if let Some(data) = frame.data_ref() {
                        if this.answer.is_empty() {
                            this.answer.extend_from_slice(ANSWER_HEAD);
                            this.answer.extend_from_slice(id_in(data.chunk()));
                            this.answer.extend_from_slice(ANSWER_TAIL);
                        }
                        this.read += data.remaining();
                    }
                }
                Err(_) => break,
            }
        }
        black_box(this.read);
        let answer = Bytes::from(std::mem::take(&mut this.answer));
        let mut response = Response::new(Full::new(answer));
        response
            .headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        Poll::Ready(Ok(response))
    }
}

// ---------------------------------------------------------------------------
// Requests
// ---------------------------------------------------------------------------

/// The headers and body of one request, built fresh for every call.
#[derive(Clone)]
struct Template {
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
}

impl Template {
    /// A POST of `body` as an MCP client sends it, in `session` if given.
    fn new(body: Bytes, session: Option<&str>) -> Self {
        let mut headers = HeaderMap::new();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        headers.insert(
            ACCEPT,
            HeaderValue::from_static("application/json, text/event-stream"),
        );
        headers.insert(CONTENT_LENGTH, HeaderValue::from(body.len()));
        headers.insert(
            HeaderName::from_static("mcp-protocol-version"),
            HeaderValue::from_static("2025-06-18"),
        );
        if let Some(session) = session {
            headers.insert(
                MCP_SESSION_ID.clone(),
                HeaderValue::from_str(session).expect("session id is a header value"),
            );
        }
        Self {
            uri: Uri::from_static("/mcp"),
            headers,
            body,
        }
    }

    /// The same POST with the `Host` header rmcp's DNS-rebinding check wants.
    fn to_rmcp(body: Bytes, session: &str) -> Self {
        let mut template = Self::new(body, Some(session));
        template
            .headers
            .insert(http::header::HOST, HeaderValue::from_static("127.0.0.1"));
        template
    }

    fn build(&self) -> Request<Full<Bytes>> {
        let mut request = Request::new(Full::new(self.body.clone()));
        *request.method_mut() = Method::POST;
        *request.uri_mut() = self.uri.clone();
        *request.headers_mut() = self.headers.clone();
        request
    }
}

/// A session id shaped like rmcp's (a UUID).
fn session_id(n: usize) -> String {
    format!("{:08x}-5c1d-4e2f-8a3b-{:012x}", n, n * 7919)
}

/// Calls `service` with `request` and reads the response body to its end:
/// its length.
async fn exchange<S, B>(service: &mut S, request: Request<Full<Bytes>>) -> usize
where
    S: Service<Request<Full<Bytes>>, Response = Response<B>>,
    S::Error: std::fmt::Debug,
    B: Body,
    B::Error: std::fmt::Debug,
{
    rmcp_server::exchange(service, request).await.1.len()
}

/// Calls `service` and keeps the response unread: its request stays in
/// flight until the response is dropped.
async fn hold<S, B>(service: &mut S, request: Request<Full<Bytes>>) -> Response<B>
where
    S: Service<Request<Full<Bytes>>, Response = Response<B>>,
    S::Error: std::fmt::Debug,
{
    service
        .ready()
        .await
        .expect("ready")
        .call(request)
        .await
        .expect("response")
}

/// Times `iters` exchanges of `service` over `templates` (round robin).
async fn timed<S, B>(service: &mut S, templates: &[Template], iters: u64) -> Duration
where
    S: Service<Request<Full<Bytes>>, Response = Response<B>>,
    S::Error: std::fmt::Debug,
    B: Body,
    B::Error: std::fmt::Debug,
{
    let mut next = 0;
    let start = Instant::now();
    for _ in 0..iters {
        let request = templates[next].build();
        next = if next + 1 == templates.len() {
            0
        } else {
            next + 1
        };
        black_box(exchange(service, request).await);
    }
    start.elapsed()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

// ---------------------------------------------------------------------------
// 1. Layer overhead
// ---------------------------------------------------------------------------

#[derive(Clone, Copy)]
enum Case {
    /// No session header: the guard looks at the headers only.
    Untracked,
    /// Tracked, the id is not in flight: read, peeked, registered, released.
    PassThrough,
    /// The same with a long-string body instead of a token-dense one.
    PassThroughString,
    /// Tracked, the id is in flight: remapped, and the JSON response restored.
    Remapped,
    /// Tracked, the id is in flight, `OnDuplicate::Reject`: answered by the
    /// guard, the inner service never sees it.
    Rejected,
}

impl Case {
    const ALL: [Case; 5] = [
        Case::Untracked,
        Case::PassThrough,
        Case::PassThroughString,
        Case::Remapped,
        Case::Rejected,
    ];

    fn name(self) -> &'static str {
        match self {
            Case::Untracked => "untracked",
            Case::PassThrough => "pass_through",
            Case::PassThroughString => "pass_through_string",
            Case::Remapped => "remapped",
            Case::Rejected => "rejected",
        }
    }
}

/// One overhead case's request template, and its guard made ready: the
/// check exchange made and, for remapped and rejected, a request with the
/// same id held in flight (`held`) for as long as this lives.
struct Prepared {
    templates: [Template; 1],
    layer: IdGuardLayer,
    guarded: IdGuard<Fixed>,
    held: Option<Response<GuardResponseBody<Full<Bytes>>>>,
}

fn prepare(rt: &tokio::runtime::Runtime, case: Case, size: usize) -> Prepared {
    let session = session_id(0);
    let body = match case {
        Case::PassThroughString => request_json_string("1", size),
        _ => request_json("1", size),
    };
    let session = match case {
        Case::Untracked => None,
        _ => Some(session.as_str()),
    };
    let templates = [Template::new(body, session)];
    let layer = match case {
        Case::Rejected => IdGuardLayer::new().on_duplicate(OnDuplicate::Reject),
        _ => IdGuardLayer::new(),
    };
    let mut guarded = layer.layer(Fixed::new());
    // Remapped and rejected: a request with the same id stays in flight in
    // the session for the whole benchmark.
    let held = match case {
        Case::Remapped | Case::Rejected => {
            let holder = Template::new(request_json("1", 256), session);
            Some(rt.block_on(hold(&mut guarded, holder.build())))
        }
        _ => None,
    };
    rt.block_on(check(case, &layer, &mut guarded, &templates[0]));
    Prepared {
        templates,
        layer,
        guarded,
        held,
    }
}

fn overhead(c: &mut Criterion) {
    let rt = runtime();
    for case in Case::ALL {
        let mut group = c.benchmark_group(format!("overhead/{}", case.name()));
        for size in SIZES {
            let Prepared {
                templates,
                layer,
                guarded,
                held,
            } = prepare(&rt, case, size);

            let bare = Fixed::new();
            group.bench_function(BenchmarkId::new("bare", label(size)), |b| {
                b.to_async(&rt)
                    .iter_custom(|iters| timed_owned(bare.clone(), &templates, iters));
            });
            group.bench_function(BenchmarkId::new("guarded", label(size)), |b| {
                b.to_async(&rt)
                    .iter_custom(|iters| timed_owned(guarded.clone(), &templates, iters));
            });
            // The same two services back to back within every sample, so
            // that drift of a shared machine falls on both alike: the time
            // reported is guarded minus bare for the sample's requests.
            group.bench_function(BenchmarkId::new("added", label(size)), |b| {
                b.to_async(&rt).iter_custom(|iters| {
                    added(
                        bare.clone(),
                        guarded.clone(),
                        [&templates, &templates],
                        iters,
                    )
                });
            });
            assert_eq!(
                layer.stats().in_flight_requests,
                usize::from(held.is_some()),
                "every measured request was released"
            );
            drop(held);
        }
        group.finish();
    }
}

/// The guard in front of the real rmcp server (`rmcp_server`), for the cases
/// whose inner service matters: what a tracked request adds to the service
/// it guards when that service is an MCP server. Bare and guarded each have
/// a session of their own (the guarded one opened through the guard); the
/// remapped case holds a request with the same id in flight in the guarded
/// session, its answer unread, as `prepare` does.
fn overhead_rmcp(c: &mut Criterion) {
    let rt = runtime();
    for case in [Case::PassThrough, Case::Remapped] {
        let mut group = c.benchmark_group(format!("overhead_rmcp/{}", case.name()));
        for size in [256, KIB] {
            let layer = IdGuardLayer::new();
            let mut bare = rmcp_server::service();
            let mut guarded = layer.layer(rmcp_server::service());
            let (bare_session, guarded_session) = rt.block_on(async {
                (
                    rmcp_server::open(&mut bare).await,
                    rmcp_server::open(&mut guarded).await,
                )
            });
            let held = matches!(case, Case::Remapped).then(|| {
                let holder = rmcp_server::post(request_json("1", 256), Some(&guarded_session));
                rt.block_on(hold(&mut guarded, holder))
            });
            let bare_templates = [Template::to_rmcp(request_json("1", size), &bare_session)];
            let guarded_templates = [Template::to_rmcp(request_json("1", size), &guarded_session)];
            let confirm = |bare: &mut rmcp_server::Rmcp,
                           guarded: &mut IdGuard<rmcp_server::Rmcp>| {
                rt.block_on(async {
                    rmcp_loop(bare, &bare_templates[0].body, &bare_session, 1).await;
                    rmcp_loop(guarded, &guarded_templates[0].body, &guarded_session, 1).await;
                });
            };
            // rmcp answers the call on both sides before and after: what was
            // timed was its answer, not a refusal.
            confirm(&mut bare, &mut guarded);
            let before = layer.stats();
            group.bench_function(BenchmarkId::new("bare", label(size)), |b| {
                b.to_async(&rt)
                    .iter_custom(|iters| timed_owned(bare.clone(), &bare_templates, iters));
            });
            group.bench_function(BenchmarkId::new("guarded", label(size)), |b| {
                b.to_async(&rt)
                    .iter_custom(|iters| timed_owned(guarded.clone(), &guarded_templates, iters));
            });
            group.bench_function(BenchmarkId::new("added", label(size)), |b| {
                b.to_async(&rt).iter_custom(|iters| {
                    added(
                        bare.clone(),
                        guarded.clone(),
                        [&bare_templates, &guarded_templates],
                        iters,
                    )
                });
            });
            let after = layer.stats();
            confirm(&mut bare, &mut guarded);
            let (passed, remapped) = (
                after.passed_total - before.passed_total,
                after.remapped_total - before.remapped_total,
            );
            // A criterion filter may leave every timed function of the
            // group out: then nothing was measured, and nothing to check.
            match case {
                _ if passed + remapped == 0 => {}
                Case::Remapped => assert!(passed == 0 && remapped > 0, "{after:?}"),
                _ => assert!(passed > 0 && remapped == 0, "{after:?}"),
            }
            assert_eq!(
                after.in_flight_requests,
                usize::from(held.is_some()),
                "every measured request was released"
            );
            drop(held);
        }
        group.finish();
    }
}

/// Times `iters` requests through `bare`, then through `guarded`, and
/// returns the difference. Criterion refuses a zero time, so a sample where
/// noise made the guarded run faster counts as 1 ns (it can happen only when
/// the difference is within noise, as for untracked requests in small samples).
async fn added<S, G, B, H>(
    mut bare: S,
    mut guarded: G,
    [bare_templates, guarded_templates]: [&[Template]; 2],
    iters: u64,
) -> Duration
where
    S: Service<Request<Full<Bytes>>, Response = Response<B>>,
    S::Error: std::fmt::Debug,
    B: Body,
    B::Error: std::fmt::Debug,
    G: Service<Request<Full<Bytes>>, Response = Response<H>>,
    G::Error: std::fmt::Debug,
    H: Body,
    H::Error: std::fmt::Debug,
{
    let bare = timed(&mut bare, bare_templates, iters).await;
    let guarded = timed(&mut guarded, guarded_templates, iters).await;
    guarded.saturating_sub(bare).max(Duration::from_nanos(1))
}

/// Makes one exchange and checks that the guard did what `case` says.
async fn check<S, B>(case: Case, layer: &IdGuardLayer, guarded: &mut S, template: &Template)
where
    S: Service<Request<Full<Bytes>>, Response = Response<B>>,
    S::Error: std::fmt::Debug,
    B: Body,
    B::Error: std::fmt::Debug,
{
    let before = layer.stats();
    let response = hold(guarded, template.build()).await;
    let status = response.status();
    let body = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    let after = layer.stats();
    let passed = after.passed_total - before.passed_total;
    let remapped = after.remapped_total - before.remapped_total;
    let restored = after.restored_total - before.restored_total;
    let rejected = after.rejected_total - before.rejected_total;
    let id: Value = serde_json::from_slice::<Value>(&body).expect("JSON response")["id"].clone();
    let outcome = (status.as_u16(), passed, remapped, restored, rejected);
    match case {
        Case::Untracked => assert_eq!(outcome, (200, 0, 0, 0, 0)),
        Case::PassThrough | Case::PassThroughString => assert_eq!(outcome, (200, 1, 0, 0, 0)),
        Case::Remapped => assert_eq!((outcome, id), ((200, 0, 1, 1, 0), Value::from(1))),
        Case::Rejected => assert_eq!((outcome, id), ((400, 0, 0, 0, 1), Value::from(1))),
    }
}

/// [`timed`] on a service the future owns (criterion's closure is `FnMut`).
async fn timed_owned<S, B>(mut service: S, templates: &[Template], iters: u64) -> Duration
where
    S: Service<Request<Full<Bytes>>, Response = Response<B>>,
    S::Error: std::fmt::Debug,
    B: Body,
    B::Error: std::fmt::Debug,
{
    timed(&mut service, templates, iters).await
}

// ---------------------------------------------------------------------------
// 2. The naive way: a serde_json::Value round trip
// ---------------------------------------------------------------------------

const TAG: &str = "0123456789abcdef";

/// Remaps a request's id by parsing the whole body into a `Value`.
fn naive_remap(body: &[u8], counter: u64) -> Vec<u8> {
    let mut value: Value = serde_json::from_slice(body).expect("request JSON");
    let original = serde_json::to_string(&value["id"]).expect("id JSON");
    value["id"] = Value::String(format!("mcp-id-guard:{TAG}:{counter}:{original}"));
    serde_json::to_vec(&value).expect("serializes")
}

/// Restores a response's id by parsing the whole body into a `Value`.
fn naive_restore(body: &[u8]) -> Vec<u8> {
    let mut value: Value = serde_json::from_slice(body).expect("response JSON");
    let original = value
        .get("id")
        .and_then(Value::as_str)
        .and_then(|id| id.strip_prefix("mcp-id-guard:"))
        .and_then(|rest| rest.splitn(3, ':').nth(2))
        .and_then(|original| serde_json::from_str::<Value>(original).ok());
    if let Some(original) = original {
        value["id"] = original;
    }
    serde_json::to_vec(&value).expect("serializes")
}

fn naive_vs_splice(c: &mut Criterion) {
    let mut group = c.benchmark_group("naive_vs_splice");
    let minter = internals::Minter::default();
    for size in SIZES {
        let request = request_json("1", size);
        let server_id = String::from_utf8(minter.mint("1")).expect("minted ids are UTF-8");
        let response = response_json(&server_id, size);
        // Both ways give the same id back.
        let restored = internals::restore_response_ids(response.as_bytes()).expect("restored");
        let value: Value = serde_json::from_slice(&restored).expect("JSON");
        assert_eq!(value["id"], 1);
        let naive: Value = serde_json::from_slice(&naive_restore(response.as_bytes())).unwrap();
        assert_eq!(naive, value);

        // One remapped exchange: the request on the way in, its response on
        // the way out.
        group.throughput(Throughput::Bytes(2 * size as u64));
        group.bench_function(BenchmarkId::new("naive", label(size)), |b| {
            let mut counter = 0;
            b.iter(|| {
                counter += 1;
                let forwarded = naive_remap(black_box(&request), counter);
                let answered = naive_restore(black_box(response.as_bytes()));
                (black_box(forwarded), black_box(answered))
            });
        });
        group.bench_function(BenchmarkId::new("splice", label(size)), |b| {
            b.iter(|| {
                let forwarded = internals::remap_request_ids(&minter, black_box(&request));
                let answered = internals::restore_response_ids(black_box(response.as_bytes()));
                (black_box(forwarded), black_box(answered))
            });
        });
    }
    group.finish();
}

// ---------------------------------------------------------------------------
// 3. SSE rewrite throughput
// ---------------------------------------------------------------------------

/// How the server's stream arrives.
const SSE_CHUNK: usize = 8 * KIB;
/// At least this many bytes per stream, so small events come many at a time.
const SSE_STREAM: usize = MIB;

/// A stream of `event: message` events of `event_size` bytes each, cut into
/// `SSE_CHUNK` pieces, with a server-side id in every event or none at all.
fn sse_stream(event_size: usize, restorable: bool) -> (Vec<Bytes>, usize) {
    const FRAME: usize = "event: message\ndata: \n\n".len();
    let id = if restorable {
        SERVER_ID.to_owned()
    } else {
        "1".to_owned()
    };
    let events = SSE_STREAM.div_ceil(event_size);
    let mut stream = Vec::with_capacity(events * event_size);
    for _ in 0..events {
        let data = response_json(&id, event_size - FRAME);
        stream.extend_from_slice(b"event: message\ndata: ");
        stream.extend_from_slice(data.as_bytes());
        stream.extend_from_slice(b"\n\n");
    }
    let stream = Bytes::from(stream);
    let chunks = (0..stream.len())
        .step_by(SSE_CHUNK)
        .map(|start| stream.slice(start..(start + SSE_CHUNK).min(stream.len())))
        .collect();
    (chunks, stream.len())
}

/// Rewrites a stream as the response body does: pieces go on as frames,
/// uncopied.
fn rewrite(chunks: &[Bytes]) -> usize {
    let mut rewriter = internals::SseRewriter::default();
    let mut pieces = std::collections::VecDeque::new();
    let mut out = 0;
    for chunk in chunks {
        rewriter.push_pieces(chunk.clone(), &mut pieces);
        out += pieces
            .drain(..)
            .map(|piece| black_box(piece).len())
            .sum::<usize>();
    }
    rewriter.finish_pieces(&mut pieces);
    out += pieces
        .drain(..)
        .map(|piece| black_box(piece).len())
        .sum::<usize>();
    out
}

fn sse(c: &mut Criterion) {
    let mut group = c.benchmark_group("sse");
    for event_size in [KIB, 64 * KIB, MIB] {
        let (plain, length) = sse_stream(event_size, false);
        let (restorable, restorable_length) = sse_stream(event_size, true);
        assert_eq!(length, restorable_length);
        assert_eq!(rewrite(&plain), length, "nothing to restore");
        let shrink = SERVER_ID.len() - 1;
        assert_eq!(
            rewrite(&restorable),
            length - length.div_ceil(event_size) * shrink,
            "every event restored"
        );
        group.throughput(Throughput::Bytes(length as u64));
        let events = label(event_size);
        group.bench_function(BenchmarkId::new("memchr_ceiling", &events), |b| {
            b.iter(|| {
                plain
                    .iter()
                    .map(|chunk| memchr::memchr2_iter(b'\r', b'\n', black_box(chunk)).count())
                    .sum::<usize>()
            });
        });
        group.bench_function(BenchmarkId::new("no_id", &events), |b| {
            b.iter(|| rewrite(black_box(&plain)));
        });
        group.bench_function(BenchmarkId::new("restore", &events), |b| {
            b.iter(|| rewrite(black_box(&restorable)));
        });
    }
    group.finish();
}

// ---------------------------------------------------------------------------
// 4. Session scaling
// ---------------------------------------------------------------------------

/// A guard whose table holds `count` sessions, each with a request in
/// flight, and one 1 KiB request template per session.
struct Populated<S> {
    count: usize,
    layer: IdGuardLayer,
    guarded: S,
    templates: Vec<Template>,
}

fn sessions(c: &mut Criterion) {
    let rt = runtime();
    let holder = request_json("0", 256);
    let body = request_json("1", KIB);
    let mut held = Vec::new();
    let mut populated = Vec::new();
    for count in [1, 100, 10_000] {
        let layer = IdGuardLayer::new();
        let mut guarded = layer.layer(Fixed::new());
        let mut templates = Vec::with_capacity(count);
        for n in 0..count {
            let session = session_id(n);
            let holding = Template::new(holder.clone(), Some(&session));
            held.push(rt.block_on(hold(&mut guarded, holding.build())));
            templates.push(Template::new(body.clone(), Some(&session)));
        }
        assert_eq!(layer.stats().in_flight_sessions, count);
        populated.push(Populated {
            count,
            layer,
            guarded,
            templates,
        });
    }

    let mut group = c.benchmark_group("sessions");
    for table in &populated {
        group.bench_function(BenchmarkId::new("pass_through_1KiB", table.count), |b| {
            b.to_async(&rt)
                .iter_custom(|iters| timed_owned(table.guarded.clone(), &table.templates, iters));
        });
    }
    group.finish();

    // Criterion measures each size at a different time; on a shared machine
    // that drift can exceed the effect. Alternating batches compare the
    // sizes under the same conditions.
    let measured = populated
        .iter()
        .all(|table| table.layer.stats().passed_total > table.count as u64);
    if measured {
        paired_sessions(&rt, &mut populated);
    }
    for table in &populated {
        let stats = table.layer.stats();
        assert_eq!(
            (stats.in_flight_requests, stats.remapped_total),
            (table.count, 0)
        );
    }
    drop(held);
    assert!(populated
        .iter()
        .all(|table| table.layer.stats().in_flight_sessions == 0));
}

/// Times alternating batches on every table and prints, for each size, the
/// median time per request and its per-round ratio to the 1-session table.
/// Each batch also runs through the bare service with the same request
/// templates, so the harness's own cost of touching many templates (one
/// header map per session) is measured and set apart from the guard's.
fn paired_sessions<S, B>(rt: &tokio::runtime::Runtime, populated: &mut [Populated<S>])
where
    S: Service<Request<Full<Bytes>>, Response = Response<B>>,
    S::Error: std::fmt::Debug,
    B: Body,
    B::Error: std::fmt::Debug,
{
    const ROUNDS: usize = 21;
    const BATCH: u64 = 20_000;
    // Per size, per round: (guarded, bare) seconds per request.
    let mut times = vec![Vec::with_capacity(ROUNDS); populated.len()];
    let mut bare = Fixed::new();
    for round in 0..ROUNDS {
        let mut order: Vec<usize> = (0..populated.len()).collect();
        if round % 2 == 1 {
            order.reverse();
        }
        for index in order {
            let table = &mut populated[index];
            let guarded = rt.block_on(timed(&mut table.guarded, &table.templates, BATCH));
            let bare = rt.block_on(timed(&mut bare, &table.templates, BATCH));
            times[index].push((
                guarded.as_secs_f64() / BATCH as f64,
                bare.as_secs_f64() / BATCH as f64,
            ));
        }
    }
    let median = |mut values: Vec<f64>| {
        values.sort_by(f64::total_cmp);
        (
            values[values.len() / 2],
            values[0],
            values[values.len() - 1],
        )
    };
    println!(
        "sessions/paired: {ROUNDS} rounds of {BATCH} requests per size and service, sizes in alternating order"
    );
    for (table, series) in populated.iter().zip(&times) {
        let (guarded, _, _) = median(series.iter().map(|(guarded, _)| *guarded).collect());
        let (bare, _, _) = median(series.iter().map(|(_, bare)| *bare).collect());
        let (ratio, low, high) = median(
            series
                .iter()
                .zip(&times[0])
                .map(|(time, one)| time.0 / one.0)
                .collect(),
        );
        let (added_ratio, added_low, added_high) = median(
            series
                .iter()
                .zip(&times[0])
                .map(|(time, one)| (time.0 - time.1) / (one.0 - one.1))
                .collect(),
        );
        println!(
            "sessions/paired/{}: guarded {:.3} µs, bare {:.3} µs per request (medians); \
             guarded vs 1 session {ratio:.3}x ({low:.3}..{high:.3}); \
             guarded − bare vs 1 session {added_ratio:.3}x ({added_low:.3}..{added_high:.3})",
            table.count,
            guarded * 1e6,
            bare * 1e6,
        );
    }
}

// ---------------------------------------------------------------------------
// 5. Batch tracking: admitting and ending one POST of many requests
// ---------------------------------------------------------------------------

/// Admission and release of one batch, straight on the session table, at
/// sizes an operator reaches by raising `max_in_flight_per_session`: the
/// time per request should not grow with the batch (it grew linearly, so a
/// batch cost its size squared). Distinct ids, and one id repeated (every
/// request but the first remapped onto one key of the table).
fn batches(c: &mut Criterion) {
    let mut group = c.benchmark_group("batches");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    for size in [1_000, 16_000, 100_000] {
        for (pattern, one_id) in [("distinct", false), ("one_id", true)] {
            let texts: Vec<String> = (0..size)
                .map(|n| if one_id { 1 } else { n }.to_string())
                .collect();
            let ids: Vec<&str> = texts.iter().map(String::as_str).collect();
            for end in [internals::BatchEnd::Answered, internals::BatchEnd::Dropped] {
                let layer = IdGuardLayer::new()
                    .max_in_flight_per_session(200_000)
                    .max_table_bytes(1 << 30);
                let tracker = internals::BatchTracker::new(&layer);
                group.throughput(Throughput::Elements(size as u64));
                let name = format!("{pattern}_{end:?}").to_lowercase();
                group.bench_function(BenchmarkId::new(name, size), |b| {
                    b.iter(|| {
                        let admitted = tracker.track(b"batch-session", &ids, end);
                        assert_eq!(admitted, size);
                    });
                });
                assert_eq!(layer.stats().in_flight_requests, 0);
            }
        }
    }
    group.finish();
}

// ---------------------------------------------------------------------------
// 6. Instruction counts (callgrind), for the cost model
// ---------------------------------------------------------------------------

/// The least any layer pays that, like the guard, must see a request's whole
/// body before the server does (to decide by its ids, fail closed): the body
/// read to its end into one buffer, the request rebuilt around it, the
/// response passed as it is. Nothing is scanned, tracked or watched. Its
/// future is boxed (one allocation, as the guard's reading state is); only
/// for the cost model (`COUNT=…:floor:…`).
#[derive(Clone)]
struct Floor<S>(S);

impl<S, B> Service<Request<B>> for Floor<S>
where
    S: Service<Request<Full<Bytes>>> + Clone + 'static,
    S::Future: 'static,
    B: Body + 'static,
    B::Error: std::fmt::Debug,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>>>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        // The readied service goes with the request, as tower's contract
        // (and the guard) do.
        let clone = self.0.clone();
        let mut inner = std::mem::replace(&mut self.0, clone);
        Box::pin(async move {
            let (parts, body) = request.into_parts();
            let body = body.collect().await.expect("a readable body").to_bytes();
            inner
                .call(Request::from_parts(parts, Full::new(body)))
                .await
        })
    }
}

/// `COUNT=<case>:<size>:<bare|guarded|floor|rmcp-bare|rmcp-guarded>:<requests>`
/// runs that many exchanges of one overhead case and nothing else, for
/// `valgrind --tool=callgrind`: instructions do not drift with the machine's
/// load as times do, so two counts (say 100 and 1100 requests) give the
/// instructions of one request exactly (`benches/cost_model.sh`). The
/// `rmcp-` sides put the real rmcp server where `Fixed` stands
/// (`rmcp_server`), for the pass-through and remapped cases.
fn count(spec: &str) {
    let parts: Vec<&str> = spec.split(':').collect();
    let [case, size, side, requests] = parts[..] else {
        panic!("COUNT=<case>:<size>:<bare|guarded|floor|rmcp-bare|rmcp-guarded>:<requests>, not {spec}");
    };
    let case = Case::ALL
        .into_iter()
        .find(|known| known.name() == case)
        .unwrap_or_else(|| panic!("no case {case}"));
    let size: usize = size.parse().expect("a size in bytes");
    let requests: u64 = requests.parse().expect("a number of requests");
    let rt = runtime();
    if let Some(side) = side.strip_prefix("rmcp-") {
        rt.block_on(count_rmcp(case, size, side, requests));
        return;
    }
    let Prepared {
        templates,
        layer,
        guarded,
        held: _held,
    } = prepare(&rt, case, size);
    let before = layer.stats();
    let elapsed = match side {
        "bare" => rt.block_on(timed_owned(Fixed::new(), &templates, requests)),
        "guarded" => rt.block_on(timed_owned(guarded, &templates, requests)),
        "floor" => rt.block_on(timed_owned(Floor(Fixed::new()), &templates, requests)),
        other => panic!("bare, guarded or floor, not {other}"),
    };
    let after = layer.stats();
    println!(
        "{requests} requests in {elapsed:?}: {} passed, {} remapped, {} restored",
        after.passed_total - before.passed_total,
        after.remapped_total - before.remapped_total,
        after.restored_total - before.restored_total
    );
}

/// [`count`] with the real rmcp server as the inner service: `side` is
/// `bare` or `guarded`.
async fn count_rmcp(case: Case, size: usize, side: &str, requests: u64) {
    let layer = match case {
        Case::PassThrough | Case::Remapped => IdGuardLayer::new(),
        _ => panic!("the rmcp sides take pass_through or remapped"),
    };
    let body = request_json("1", size);
    match side {
        "bare" => {
            let mut service = rmcp_server::service();
            let session = rmcp_server::open(&mut service).await;
            rmcp_loop(&mut service, &body, &session, requests).await;
        }
        "guarded" => {
            let mut service = layer.layer(rmcp_server::service());
            let session = rmcp_server::open(&mut service).await;
            // Remapped: a request with the same id stays in flight, its
            // answer unread, for the whole run.
            let _held = match case {
                Case::Remapped => Some(
                    hold(
                        &mut service,
                        rmcp_server::post(request_json("1", 256), Some(&session)),
                    )
                    .await,
                ),
                _ => None,
            };
            let before = layer.stats();
            rmcp_loop(&mut service, &body, &session, requests).await;
            let after = layer.stats();
            let counts = (
                after.passed_total - before.passed_total,
                after.remapped_total - before.remapped_total,
                after.restored_total - before.restored_total,
            );
            let expected = match case {
                Case::Remapped => (0, requests, requests),
                _ => (requests, 0, 0),
            };
            // Checked, not only printed: cost_model.sh throws the output away.
            assert_eq!(counts, expected, "(passed, remapped, restored)");
        }
        other => panic!("rmcp-bare or rmcp-guarded, not rmcp-{other}"),
    }
}

/// `requests` exchanges of `body` in `session`, each read to its end; the
/// first and the last are checked to be rmcp's answer to the call, under the
/// client's id.
async fn rmcp_loop<S, B>(service: &mut S, body: &Bytes, session: &str, requests: u64)
where
    S: Service<Request<Full<Bytes>>, Response = Response<B>>,
    S::Error: std::fmt::Debug,
    B: Body,
    B::Error: std::fmt::Debug,
{
    for request in 0..requests {
        let (head, answer) =
            rmcp_server::exchange(service, rmcp_server::post(body.clone(), Some(session))).await;
        if request == 0 || request + 1 == requests {
            let text = String::from_utf8_lossy(&answer);
            assert!(
                head.status().is_success()
                    && text.contains(r#""id":1,"#)
                    && text.contains(r#""text":"ok""#),
                "rmcp answered {}: {text}",
                head.status()
            );
        }
        black_box(answer);
    }
}

criterion_group!(
    benches,
    overhead,
    overhead_rmcp,
    naive_vs_splice,
    sse,
    sessions,
    batches
);

fn main() {
    if let Ok(spec) = std::env::var("COUNT") {
        count(&spec);
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
