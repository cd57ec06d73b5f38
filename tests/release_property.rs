//! Property test: however exchanges interleave and end, the guard's table
//! tracks exactly the live exchanges and never lets two of them share a
//! server-visible id in one session.
//!
//! Each case runs a random sequence of operations over three sessions and the
//! ids `1`, `2` and `"1"` (which collides with `1`): a request arrives, the
//! inner service answers, the response body is read to its end, the body is
//! dropped early, the response future is dropped before the answer, or the
//! inner service fails. The guard is driven directly, polled by hand with a
//! no-op waker: the inner service's futures complete through oneshot channels
//! the test keeps per exchange, and its response bodies are channels too, so
//! every step is deterministic. The test keeps a model of which exchanges are
//! live and checks after every step:
//! - `in_flight_requests` is the number of live exchanges, `tracked_sessions`
//!   the number of sessions with one;
//! - no two live exchanges of a session share a server-visible id (by the
//!   crate's equivalence: integer `n` equals string `"n"`);
//! - the policy decided as the model predicts (forward as is, remap, reject),
//!   and the counters agree;
//! - every answer read to its end carries the client's exact id text;
//! - after ending everything, the table is empty.

use std::collections::HashSet;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use futures::channel::{mpsc, oneshot};
use futures::FutureExt;
use http::{Request, Response, StatusCode};
use http_body::{Body, Frame};
use http_body_util::{BodyExt, Full, StreamBody};
use mcp_id_guard::{IdGuard, IdGuardLayer, OnDuplicate, RequestBody, ResponseBody, Stats};
use proptest::prelude::*;
use serde_json::value::RawValue;
use tower::{Layer, Service};

const SESSIONS: [&str; 3] = ["session-a", "session-b", "session-c"];
/// `1` and `"1"` are one id to the guard.
const IDS: [&str; 3] = ["1", "2", r#""1""#];

type InnerBody = StreamBody<mpsc::UnboundedReceiver<Result<Frame<Bytes>, Infallible>>>;
type InnerResult = Result<Response<InnerBody>, Failure>;

/// The inner service's error.
#[derive(Debug)]
struct Failure;

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("inner service failed")
    }
}

impl std::error::Error for Failure {}

/// One call the inner service received: the id it saw, and how to answer.
struct Call {
    server_id: String,
    responder: oneshot::Sender<InnerResult>,
}

/// An inner service whose every call waits for the test.
#[derive(Clone, Default)]
struct Controlled {
    calls: Arc<Mutex<Vec<Call>>>,
}

impl Service<Request<RequestBody<Full<Bytes>>>> for Controlled {
    type Response = Response<InnerBody>;
    type Error = Failure;
    type Future = Pin<Box<dyn Future<Output = InnerResult> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Failure>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<RequestBody<Full<Bytes>>>) -> Self::Future {
        // The guard hands on a body it already read: it is ready at once.
        let body = request
            .into_body()
            .collect()
            .now_or_never()
            .expect("a buffered body is ready")
            .unwrap_or_else(|never| match never {})
            .to_bytes();
        let (responder, answer) = oneshot::channel();
        self.calls.lock().unwrap().push(Call {
            server_id: raw_id(&body),
            responder,
        });
        Box::pin(answer.map(|answer| answer.unwrap_or(Err(Failure))))
    }
}

fn raw_id(json: &[u8]) -> String {
    #[derive(serde::Deserialize)]
    struct Message<'a> {
        #[serde(borrow)]
        id: &'a RawValue,
    }
    serde_json::from_slice::<Message<'_>>(json)
        .expect("a JSON-RPC message")
        .id
        .get()
        .to_owned()
}

/// The collision key of an id's JSON text: a string's decoded text, an
/// integer's decimal text (the ids used here have no other forms).
fn key(raw: &str) -> String {
    serde_json::from_str::<String>(raw).unwrap_or_else(|_| raw.to_owned())
}

fn is_server_side(raw: &str) -> bool {
    key(raw).starts_with("mcp-id-guard:") && raw.starts_with('"')
}

fn request_text(id: &str) -> String {
    format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{}}}}"#)
}

fn answer_text(id: &str) -> String {
    format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{{}}}}"#)
}

#[derive(Debug, Clone)]
enum Op {
    /// A request with `IDS[id]` arrives in `SESSIONS[session]`.
    Arrive { session: usize, id: usize },
    /// The inner service answers the n-th exchange still waiting for it, in
    /// the given format.
    Answer(usize, Format),
    /// The n-th answered exchange's body is read to its end.
    ReadToEnd(usize),
    /// The n-th answered exchange's body is dropped after at most a partial read.
    DropBody(usize),
    /// The n-th waiting exchange's response future is dropped.
    DropFuture(usize),
    /// The inner service fails the n-th waiting exchange.
    InnerError(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..SESSIONS.len(), 0..IDS.len()).prop_map(|(session, id)| Op::Arrive { session, id }),
        2 => (0..8usize, format()).prop_map(|(n, format)| Op::Answer(n, format)),
        2 => (0..8usize).prop_map(Op::ReadToEnd),
        1 => (0..8usize).prop_map(Op::DropBody),
        1 => (0..8usize).prop_map(Op::DropFuture),
        1 => (0..8usize).prop_map(Op::InnerError),
    ]
}

/// How the inner service answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    /// `application/json`: ids restored.
    Json,
    /// `text/event-stream`, one event: ids restored.
    Sse,
    /// No content type: passed through as is, so a remapped id stays the
    /// server-side one (the guard restores only JSON and SSE).
    Opaque,
}

fn format() -> impl Strategy<Value = Format> {
    prop_oneof![Just(Format::Json), Just(Format::Sse), Just(Format::Opaque)]
}

type GuardFuture = Pin<Box<mcp_id_guard::ResponseFuture<Controlled, Full<Bytes>>>>;

enum Stage {
    /// Registered, waiting for the inner service.
    Waiting {
        future: GuardFuture,
        responder: oneshot::Sender<InnerResult>,
    },
    /// Registered, the response body (holding the registration) not finished.
    Answered {
        body: Pin<Box<ResponseBody<InnerBody>>>,
        sender: mpsc::UnboundedSender<Result<Frame<Bytes>, Infallible>>,
        format: Format,
    },
}

/// A live exchange: registered in the guard and not ended.
struct Exchange {
    session: usize,
    client_id: &'static str,
    server_id: String,
    stage: Stage,
}

#[derive(Default)]
struct Expected {
    passed: u64,
    remapped: u64,
    rejected: u64,
}

struct Harness {
    policy: OnDuplicate,
    layer: IdGuardLayer,
    service: IdGuard<Controlled>,
    inner: Controlled,
    live: Vec<Exchange>,
    expected: Expected,
}

fn context() -> Context<'static> {
    Context::from_waker(Waker::noop())
}

impl Harness {
    fn new(policy: OnDuplicate) -> Self {
        let layer = IdGuardLayer::new().on_duplicate(policy);
        let inner = Controlled::default();
        Self {
            policy,
            service: layer.layer(inner.clone()),
            layer,
            inner,
            live: Vec::new(),
            expected: Expected::default(),
        }
    }

    /// The index in `live` of the n-th (modulo) exchange matching `stage`.
    fn pick(&self, n: usize, waiting: bool) -> Option<usize> {
        let matching: Vec<usize> = (0..self.live.len())
            .filter(|&i| matches!(self.live[i].stage, Stage::Waiting { .. }) == waiting)
            .collect();
        (!matching.is_empty()).then(|| matching[n % matching.len()])
    }

    fn apply(&mut self, op: &Op) {
        match *op {
            Op::Arrive { session, id } => self.arrive(session, IDS[id]),
            Op::Answer(n, format) => {
                if let Some(index) = self.pick(n, true) {
                    self.answer(index, format);
                }
            }
            Op::ReadToEnd(n) => {
                if let Some(index) = self.pick(n, false) {
                    self.read_to_end(index);
                }
            }
            Op::DropBody(n) => {
                if let Some(index) = self.pick(n, false) {
                    self.drop_body(index);
                }
            }
            Op::DropFuture(n) => {
                if let Some(index) = self.pick(n, true) {
                    drop(self.live.remove(index));
                }
            }
            Op::InnerError(n) => {
                if let Some(index) = self.pick(n, true) {
                    self.inner_error(index);
                }
            }
        }
        self.check();
    }

    fn arrive(&mut self, session: usize, client_id: &'static str) {
        // The model: does this id collide with a live exchange of the session
        // that the inner service sees under the client's own id?
        let colliding = self.live.iter().any(|exchange| {
            exchange.session == session
                && !is_server_side(&exchange.server_id)
                && key(&exchange.server_id) == key(client_id)
        });
        let request = Request::post("/mcp")
            .header("content-type", "application/json")
            .header("mcp-session-id", SESSIONS[session])
            .body(Full::new(Bytes::from(request_text(client_id))))
            .unwrap();
        let mut cx = context();
        assert!(self.service.poll_ready(&mut cx).is_ready());
        let mut future = Box::pin(self.service.call(request));
        match future.as_mut().poll(&mut cx) {
            Poll::Ready(Ok(response)) => {
                assert!(
                    colliding && self.policy == OnDuplicate::Reject,
                    "only a duplicate under Reject is answered at once"
                );
                assert_eq!(response.status(), StatusCode::BAD_REQUEST);
                let body = read_all(Box::pin(response.into_body()));
                assert_eq!(raw_id(&body), client_id, "the rejection carries the id");
                self.expected.rejected += 1;
            }
            Poll::Ready(Err(error)) => panic!("unexpected error {error}"),
            Poll::Pending => {
                assert!(
                    !(colliding && self.policy == OnDuplicate::Reject),
                    "a duplicate under Reject must not be forwarded"
                );
                let Call {
                    server_id,
                    responder,
                } = self
                    .inner
                    .calls
                    .lock()
                    .unwrap()
                    .pop()
                    .expect("the inner service was called");
                if colliding {
                    assert!(is_server_side(&server_id), "remapped: {server_id}");
                    self.expected.remapped += 1;
                } else {
                    assert_eq!(server_id, client_id, "forwarded as is");
                    self.expected.passed += 1;
                }
                self.live.push(Exchange {
                    session,
                    client_id,
                    server_id,
                    stage: Stage::Waiting { future, responder },
                });
            }
        }
    }

    fn answer(&mut self, index: usize, format: Format) {
        let exchange = self.live.remove(index);
        let Stage::Waiting {
            mut future,
            responder,
        } = exchange.stage
        else {
            unreachable!("picked a waiting exchange")
        };
        let (sender, receiver) = mpsc::unbounded();
        let mut response = Response::new(StreamBody::new(receiver));
        let content_type = match format {
            Format::Json => Some("application/json"),
            Format::Sse => Some("text/event-stream"),
            Format::Opaque => None,
        };
        if let Some(content_type) = content_type {
            response
                .headers_mut()
                .insert("content-type", content_type.parse().unwrap());
        }
        assert!(responder.send(Ok(response)).is_ok());
        let Poll::Ready(Ok(response)) = future.as_mut().poll(&mut context()) else {
            panic!("the answer is ready")
        };
        self.live.push(Exchange {
            stage: Stage::Answered {
                body: Box::pin(response.into_body()),
                sender,
                format,
            },
            ..exchange
        });
    }

    fn read_to_end(&mut self, index: usize) {
        let exchange = self.live.remove(index);
        let Stage::Answered {
            mut body,
            sender,
            format,
        } = exchange.stage
        else {
            unreachable!("picked an answered exchange")
        };
        let wire = |id: &str| match format {
            Format::Sse => format!("id: 5\ndata: {}\n\n", answer_text(id)),
            Format::Json | Format::Opaque => answer_text(id),
        };
        let answer = wire(&exchange.server_id);
        let (head, tail) = answer.as_bytes().split_at(answer.len() / 2);
        for part in [head, tail] {
            sender
                .unbounded_send(Ok(Frame::data(Bytes::copy_from_slice(part))))
                .unwrap();
        }
        drop(sender);
        let mut read = Vec::new();
        let mut cx = context();
        loop {
            match body.as_mut().poll_frame(&mut cx) {
                Poll::Ready(Some(Ok(frame))) => {
                    read.extend_from_slice(&frame.into_data().expect("no trailers"))
                }
                Poll::Ready(Some(Err(never))) => match never {},
                Poll::Ready(None) => break,
                Poll::Pending => panic!("the whole body was sent"),
            }
        }
        // (`is_end_stream` is only a hint: a `StreamBody` never says so.)
        let expected = match format {
            Format::Json | Format::Sse => wire(exchange.client_id),
            Format::Opaque => answer,
        };
        assert_eq!(
            String::from_utf8(read).unwrap(),
            expected,
            "the client gets its own id back from JSON and SSE answers"
        );
        // Released at the end of the body, before the body is dropped.
        self.check();
        drop(body);
    }

    fn drop_body(&mut self, index: usize) {
        let exchange = self.live.remove(index);
        let Stage::Answered {
            mut body, sender, ..
        } = exchange.stage
        else {
            unreachable!("picked an answered exchange")
        };
        sender
            .unbounded_send(Ok(Frame::data(Bytes::from_static(b"{\"jsonrpc\":"))))
            .unwrap();
        // A partial read: the first part may come through (unrestored body)
        // or be held back (restoring body); either way the body is unfinished.
        let _ = body.as_mut().poll_frame(&mut context());
        assert!(!body.is_end_stream());
        drop(body);
    }

    fn inner_error(&mut self, index: usize) {
        let exchange = self.live.remove(index);
        let Stage::Waiting {
            mut future,
            responder,
        } = exchange.stage
        else {
            unreachable!("picked a waiting exchange")
        };
        assert!(responder.send(Err(Failure)).is_ok());
        assert!(matches!(
            future.as_mut().poll(&mut context()),
            Poll::Ready(Err(Failure))
        ));
    }

    fn check(&self) {
        let stats = self.layer.stats();
        assert_eq!(stats.in_flight_requests, self.live.len(), "in flight");
        let sessions: HashSet<usize> = self.live.iter().map(|e| e.session).collect();
        assert_eq!(stats.tracked_sessions, sessions.len(), "tracked sessions");
        let mut seen = HashSet::new();
        for exchange in &self.live {
            assert!(
                seen.insert((exchange.session, key(&exchange.server_id))),
                "two live exchanges share {} in {}",
                exchange.server_id,
                SESSIONS[exchange.session]
            );
        }
        assert_eq!(
            (
                stats.passed_total,
                stats.remapped_total,
                stats.rejected_total
            ),
            (
                self.expected.passed,
                self.expected.remapped,
                self.expected.rejected
            ),
            "counters"
        );
    }

    /// Ends every live exchange, alternating between the ways to end one.
    fn finish(mut self) {
        let mut turn = 0usize;
        while !self.live.is_empty() {
            let index = self.live.len() - 1;
            let waiting = matches!(self.live[index].stage, Stage::Waiting { .. });
            match (waiting, turn % 2) {
                (true, 0) => self.answer(index, [Format::Json, Format::Sse][turn % 4 / 2]),
                (true, _) => self.inner_error(index),
                (false, 0) => self.read_to_end(index),
                (false, _) => self.drop_body(index),
            }
            turn += 1;
            self.check();
        }
        let Stats {
            in_flight_requests,
            tracked_sessions,
            ..
        } = self.layer.stats();
        assert_eq!((in_flight_requests, tracked_sessions), (0, 0), "drained");
    }
}

fn read_all(mut body: Pin<Box<ResponseBody<InnerBody>>>) -> Vec<u8> {
    let mut out = Vec::new();
    let mut cx = context();
    while let Poll::Ready(Some(frame)) = body.as_mut().poll_frame(&mut cx) {
        let Ok(frame) = frame;
        out.extend_from_slice(&frame.into_data().expect("no trailers"));
    }
    assert!(body.is_end_stream());
    out
}

fn run(policy: OnDuplicate, ops: &[Op]) {
    let mut harness = Harness::new(policy);
    for op in ops {
        harness.apply(op);
    }
    harness.finish();
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Under `Remap`: every interleaving keeps the table exact, server-visible
    /// ids unique per session, and answers restored.
    #[test]
    fn remap_tracks_exactly_the_live_exchanges(ops in prop::collection::vec(op(), 1..40)) {
        run(OnDuplicate::Remap, &ops);
    }

    /// Under `Reject`: the same, with duplicates answered at once and never
    /// live.
    #[test]
    fn reject_tracks_exactly_the_live_exchanges(ops in prop::collection::vec(op(), 1..40)) {
        run(OnDuplicate::Reject, &ops);
    }
}

/// A fixed interleaving that exercises every operation, so the property
/// tests' harness is known to reach each branch.
#[test]
fn scripted_interleaving() {
    use Op::*;
    for policy in [OnDuplicate::Remap, OnDuplicate::Reject] {
        let ops = [
            Arrive { session: 0, id: 0 },
            Arrive { session: 0, id: 2 },
            Arrive { session: 1, id: 0 },
            Arrive { session: 0, id: 0 },
            Answer(0, Format::Json),
            ReadToEnd(0),
            Arrive { session: 0, id: 0 },
            Answer(0, Format::Sse),
            Answer(0, Format::Opaque),
            ReadToEnd(1),
            ReadToEnd(0),
            Arrive { session: 0, id: 0 },
            Answer(0, Format::Json),
            DropBody(0),
            DropFuture(0),
            Arrive { session: 2, id: 1 },
            InnerError(0),
            Arrive { session: 0, id: 1 },
        ];
        let mut harness = Harness::new(policy);
        for op in &ops {
            harness.apply(op);
        }
        let stats = harness.layer.stats();
        match policy {
            OnDuplicate::Remap => assert!(stats.remapped_total >= 2, "{stats:?}"),
            _ => assert!(stats.rejected_total >= 2, "{stats:?}"),
        }
        harness.finish();
    }
}
