//! Property tests: however exchanges interleave and end, the guard's table
//! tracks exactly the live exchanges and never lets two requests share a
//! server-visible id in one session while the inner service may still answer
//! either.
//!
//! Each case runs a random sequence of operations over three sessions and the
//! ids `1`, `2` and `"1"` (which collides with `1`): a request arrives, the
//! inner service answers (JSON, SSE or an opaque body), the response body is
//! read to its end, the body is dropped early, the response future is dropped
//! before the answer (or while queued), the inner service fails, or a `GET`
//! stream replays answers to earlier exchanges of a session. The guard
//! is driven directly and polled by hand with a no-op waker (inside a tokio
//! runtime context, for `Queue`'s timer): the inner service's futures complete
//! through oneshot channels the test keeps per exchange, and its response
//! bodies are channels too, so every step is deterministic.
//!
//! A model of the live exchanges and of the *shadowed* ids predicts every
//! decision. An exchange the inner service knows by the client's own id
//! leaves that id shadowed in its session when it ends any way but by its
//! body being read to the end (body dropped early, future dropped, inner
//! error), or when it was cancelled (however it ends): the inner service may
//! still answer it. A cancelled exchange shadows its id from the cancellation
//! on, while still open. Shadows last for `abandoned_id_ttl`, which never
//! runs out within a case. After every step the test checks:
//! - `in_flight_requests` is the number of live exchanges (queued ones
//!   included), `in_flight_sessions` the number of sessions with one (shadows
//!   alone do not count), `abandoned_ids` the number of ended exchanges that
//!   still shadow their id;
//! - no two live forwarded exchanges of a session, cancelled ones included,
//!   share a server-visible id, and none has an id its session shadows (by the
//!   crate's equivalence: integer `n` equals string `"n"`);
//! - the policy decided as predicted (forward as is, remap, reject, queue),
//!   and every counter agrees. A new request is a duplicate under `Remap`
//!   when its session has a live, uncancelled exchange with an equivalent id
//!   that the inner service knows by the client's own id; under `Reject` and
//!   `Queue` when it has any live, uncancelled forwarded exchange with such
//!   an id, as is or with a server-side id (one remapped past a shadow still
//!   holds the client's id), or, under `Queue`, one already waits for it.
//!   Under `Queue` a waiting request is let through first come first served
//!   exactly when its session has no live, uncancelled forwarded exchange
//!   with its id, so waiters behind a shadowed id go one at a time. A request
//!   whose id is shadowed reaches the inner service with a server-side id
//!   under every policy (a shadow alone never gets it rejected or queued; a
//!   queued one granted while the id is shadowed goes with a server-side id
//!   too);
//! - every JSON or SSE answer read to its end carries the client's exact id
//!   text;
//! - a `GET` in a session reaches the inner service as sent but without
//!   `Accept-Encoding`, and its event stream, replaying answers to some of the
//!   session's exchanges (live or ended, under the ids the inner service saw)
//!   between a priming event, a comment and a notification, in any chunks and
//!   with LF, CRLF or CR line ends, comes back byte for byte except that each
//!   answer carries its exchange's client id text; every complete event goes
//!   out at once, `restored_total` grows by one per answer that carried a
//!   server-side id as it goes out, and the `GET`, read to its end or dropped
//!   half read, changes nothing else (the checks above hold while its body is
//!   open);
//! - after ending everything, nothing is in flight and no session is tracked.
//!
//! A second family adds `notifications/cancelled`: the model predicts which
//! request is cancelled (of those not cancelled yet: the live one the inner
//! service knows by the client's own id; else the oldest live remapped one;
//! else an ended one known by the client's own id) and the exact `requestId`
//! the inner service receives (that request's server-visible id text).

use std::collections::{HashMap, HashSet};
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use futures::channel::{mpsc, oneshot};
use futures::FutureExt;
use http::{HeaderMap, Method, Request, Response, StatusCode};
use http_body::{Body, Frame};
use http_body_util::{BodyExt, Full, StreamBody};
use mcp_id_guard::guard::{GuardRequestBody as RequestBody, GuardResponseBody as ResponseBody};
use mcp_id_guard::{IdGuard, IdGuardLayer, OnDuplicate, Stats};
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

/// One call the inner service received: the request it saw, and how to
/// answer.
struct Call {
    method: Method,
    headers: HeaderMap,
    body: Bytes,
    responder: oneshot::Sender<InnerResult>,
}

/// An inner service whose every call waits for the test.
#[derive(Clone, Default)]
struct Controlled {
    calls: Arc<Mutex<Vec<Call>>>,
}

impl Controlled {
    fn take_call(&self) -> Option<Call> {
        let mut calls = self.calls.lock().unwrap();
        assert!(calls.len() <= 1, "one call at a time");
        calls.pop()
    }
}

impl Service<Request<RequestBody<Full<Bytes>>>> for Controlled {
    type Response = Response<InnerBody>;
    type Error = Failure;
    type Future = Pin<Box<dyn Future<Output = InnerResult> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Failure>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<RequestBody<Full<Bytes>>>) -> Self::Future {
        // The guard hands on a body it already read (a GET's is empty): it is
        // ready at once.
        let (parts, body) = request.into_parts();
        let body = body
            .collect()
            .now_or_never()
            .expect("a buffered body is ready")
            .unwrap_or_else(|never| match never {})
            .to_bytes();
        let (responder, answer) = oneshot::channel();
        self.calls.lock().unwrap().push(Call {
            method: parts.method,
            headers: parts.headers,
            body,
            responder,
        });
        Box::pin(answer.map(|answer| answer.unwrap_or(Err(Failure))))
    }
}

/// The JSON text of `field` in a JSON object, or in its `params` object.
fn raw_field(json: &[u8], field: &str) -> String {
    let object: std::collections::BTreeMap<String, Box<RawValue>> =
        serde_json::from_slice(json).expect("a JSON object");
    match object.get(field) {
        Some(value) => value.get().to_owned(),
        None => raw_field(object["params"].get().as_bytes(), field),
    }
}

/// The collision key of an id's JSON text: a string's decoded text, an
/// integer's decimal text (the ids used here have no other forms).
fn key(raw: &str) -> String {
    serde_json::from_str::<String>(raw).unwrap_or_else(|_| raw.to_owned())
}

fn is_server_side(raw: &str) -> bool {
    mcp_id_guard::inner::ServerSideId::parse(raw).is_some()
}

fn request_text(id: &str) -> String {
    format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{}}}}"#)
}

fn cancel_text(id: &str) -> String {
    format!(
        r#"{{"jsonrpc":"2.0","method":"notifications/cancelled","params":{{"requestId":{id}}}}}"#
    )
}

fn answer_text(id: &str) -> String {
    format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{{}}}}"#)
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

#[derive(Debug, Clone)]
enum Op {
    /// A request with `IDS[id]` arrives in `SESSIONS[session]`.
    Arrive { session: usize, id: usize },
    /// The inner service answers the n-th forwarded exchange still waiting
    /// for it, in the given format.
    Answer(usize, Format),
    /// The n-th answered exchange's body is read to its end.
    ReadToEnd(usize),
    /// The n-th answered exchange's body is dropped after a partial read.
    DropBody(usize),
    /// The n-th exchange without an answer (forwarded or queued) has its
    /// response future dropped.
    DropFuture(usize),
    /// The inner service fails the n-th forwarded exchange still waiting.
    InnerError(usize),
    /// The client cancels `IDS[id]` in `SESSIONS[session]`.
    Cancel { session: usize, id: usize },
    /// A `GET` in a session, whose stream replays answers to some of the
    /// session's earlier exchanges.
    Replay(GetReplay),
}

/// A `GET` in `SESSIONS[session]` (`Accept: text/event-stream`,
/// `Accept-Encoding: gzip`), answered with a `text/event-stream` that replays
/// the answers to some of the session's exchanges the inner service was
/// called for, live or ended, under the ids it saw for them, mixed with a
/// priming event, a comment and a notification.
#[derive(Debug, Clone, Copy)]
struct GetReplay {
    session: usize,
    /// Which of the session's last eight exchanges are replayed: bit `i` is
    /// the `i`-th most recent.
    pick: u8,
    /// A resumed stream (`Last-Event-ID`) rather than the standalone one.
    resume: bool,
    /// Which stream it resumes: the `from`-th (modulo one more than their
    /// number) of the session's abandoned streams, or, past them, one that
    /// belongs to no abandoned request (`0`).
    from: u8,
    /// Sent with a legacy `MCP-Protocol-Version`.
    versioned: bool,
    /// The line terminator: `EOLS[eol]`.
    eol: usize,
    /// Each answer's data split over two `data:` lines.
    multi_line: bool,
    /// Where the stream is cut into three chunks, in thousandths of its
    /// length (1000: at its end).
    cuts: (u16, u16),
    /// The client drops the body after the first chunk.
    drop_half: bool,
}

const EOLS: [&str; 3] = ["\n", "\r\n", "\r"];

fn format() -> impl Strategy<Value = Format> {
    prop_oneof![Just(Format::Json), Just(Format::Sse), Just(Format::Opaque)]
}

fn op(with_cancellations: bool) -> impl Strategy<Value = Op> {
    let cancel_weight = if with_cancellations { 2 } else { 0 };
    prop_oneof![
        4 => (0..SESSIONS.len(), 0..IDS.len()).prop_map(|(session, id)| Op::Arrive { session, id }),
        2 => (0..8usize, format()).prop_map(|(n, format)| Op::Answer(n, format)),
        2 => (0..8usize).prop_map(Op::ReadToEnd),
        1 => (0..8usize).prop_map(Op::DropBody),
        1 => (0..8usize).prop_map(Op::DropFuture),
        1 => (0..8usize).prop_map(Op::InnerError),
        cancel_weight => (0..SESSIONS.len(), 0..IDS.len()).prop_map(|(session, id)| Op::Cancel { session, id }),
        2 => replay().prop_map(Op::Replay),
    ]
}

fn replay() -> impl Strategy<Value = GetReplay> {
    (
        0..SESSIONS.len(),
        any::<u8>(),
        any::<bool>(),
        any::<bool>(),
        0..EOLS.len(),
        any::<bool>(),
        (0..=1000u16, 0..=1000u16),
        prop::bool::weighted(0.25),
        any::<u8>(),
    )
        .prop_map(
            |(session, pick, resume, versioned, eol, multi_line, cuts, drop_half, from)| {
                GetReplay {
                    session,
                    pick,
                    resume,
                    from,
                    versioned,
                    eol,
                    multi_line,
                    cuts,
                    drop_half,
                }
            },
        )
}

type GuardFuture = Pin<Box<mcp_id_guard::guard::GuardFuture<Controlled, Full<Bytes>>>>;

enum Stage {
    /// Registered under `Queue`, waiting for its id; the inner service has
    /// not been called.
    Queued { future: GuardFuture },
    /// Forwarded, waiting for the inner service.
    Waiting {
        future: GuardFuture,
        responder: oneshot::Sender<InnerResult>,
    },
    /// Forwarded and answered; the response body (holding the registration)
    /// is not finished.
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
    /// The id the inner service saw; `None` while queued.
    server_id: Option<String>,
    /// Arrival order.
    arrival: u64,
    /// When it was forwarded: the order of the guard's per-id entries.
    forwarded: u64,
    /// A cancellation named it.
    cancelled: bool,
    stage: Stage,
}

/// An ended exchange the inner service knew by the client's own id and may
/// still answer: its id stays shadowed in its session (for the whole case).
#[derive(Debug)]
struct Shadow {
    session: usize,
    /// The id the inner service knows it by: the client's own id text.
    server_id: String,
    /// A cancellation named it (before or after it ended).
    cancelled: bool,
    /// The last event id its client saw on its own stream (an SSE stream
    /// dropped after its priming event): a `GET` resuming from it is the one
    /// stream whose answer frees the shadow.
    stream: Option<String>,
}

/// An exchange the inner service was called for (live or ended): a GET
/// stream may replay its answer, under the id the inner service saw.
#[derive(Debug, Clone)]
struct Record {
    session: usize,
    client_id: &'static str,
    /// The id the inner service saw: the client's id text, or a server-side
    /// id.
    server_id: String,
}

/// How an exchange ended, for the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ending {
    /// Its response passed: a JSON or SSE body carrying it read to the end.
    Completed,
    /// Body dropped early, response future dropped, inner service error, or
    /// a body read to the end that showed no response (opaque).
    Abandoned,
}

impl Exchange {
    fn is_queued(&self) -> bool {
        matches!(self.stage, Stage::Queued { .. })
    }

    fn is_waiting(&self) -> bool {
        matches!(self.stage, Stage::Waiting { .. })
    }

    fn is_answered(&self) -> bool {
        matches!(self.stage, Stage::Answered { .. })
    }

    /// Forwarded, and the inner service knows it by the client's own id.
    fn is_as_is(&self) -> bool {
        self.server_id
            .as_deref()
            .is_some_and(|seen| !is_server_side(seen))
    }

    fn is_remapped(&self) -> bool {
        self.server_id.as_deref().is_some_and(is_server_side)
    }

    fn has_key(&self, session: usize, raw: &str) -> bool {
        self.session == session && key(self.client_id) == key(raw)
    }

    /// The model of an exchange's end: one the inner service knows by the
    /// client's own id keeps shadowing it unless it completed uncancelled.
    fn shadow_after(&self, ending: Ending) -> Option<Shadow> {
        (self.is_as_is() && ending == Ending::Abandoned).then(|| Shadow {
            session: self.session,
            server_id: self.server_id.clone().expect("forwarded"),
            cancelled: self.cancelled,
            stream: None,
        })
    }
}

#[derive(Debug, Default, PartialEq, Eq)]
struct Counters {
    passed: u64,
    remapped: u64,
    rejected: u64,
    queued: u64,
    cancelled: u64,
    restored: u64,
}

struct Harness {
    policy: OnDuplicate,
    layer: IdGuardLayer,
    service: IdGuard<Controlled>,
    inner: Controlled,
    live: Vec<Exchange>,
    /// Ended exchanges whose ids are still shadowed.
    shadows: Vec<Shadow>,
    /// Every exchange the inner service was called for, live or ended, in
    /// the order it was called: what a GET stream may replay answers to.
    history: Vec<Record>,
    /// Per session, where its resumed streams went on from, as the table
    /// keeps it: the last few event ids that passed on a resumed `GET`, each
    /// with the stream it continues.
    links: HashMap<usize, Links>,
    clock: u64,
    expected: Counters,
}

/// The model of a session's resumption links: fixed in number, the oldest
/// replaced first, an id seen again relinked in place.
#[derive(Debug, Default)]
struct Links {
    links: [Option<(String, String)>; 4],
    next: usize,
}

impl Links {
    fn origin(&self, at: &str) -> String {
        self.links
            .iter()
            .flatten()
            .find(|(later, _)| later == at)
            .map_or_else(|| at.to_owned(), |(_, origin)| origin.clone())
    }

    fn link(&mut self, at: &str, origin: &str) {
        if at == origin {
            return;
        }
        if let Some(link) = self
            .links
            .iter_mut()
            .flatten()
            .find(|(later, _)| later == at)
        {
            link.1 = origin.to_owned();
            return;
        }
        self.links[self.next] = Some((at.to_owned(), origin.to_owned()));
        self.next = (self.next + 1) % self.links.len();
    }
}

fn context() -> Context<'static> {
    Context::from_waker(Waker::noop())
}

impl Harness {
    fn new(policy: OnDuplicate) -> Self {
        // Neither the queue timer nor a shadow runs out within a case.
        let layer = IdGuardLayer::new()
            .on_duplicate(policy)
            .max_queue_wait(Duration::from_secs(3600))
            .abandoned_id_ttl(Duration::from_secs(3600));
        let inner = Controlled::default();
        Self {
            policy,
            service: layer.layer(inner.clone()),
            layer,
            inner,
            live: Vec::new(),
            shadows: Vec::new(),
            history: Vec::new(),
            links: HashMap::new(),
            clock: 0,
            expected: Counters::default(),
        }
    }

    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    /// The index in `live` of the n-th (modulo) exchange `select` accepts.
    fn pick(&self, n: usize, select: impl Fn(&Exchange) -> bool) -> Option<usize> {
        let matching: Vec<usize> = (0..self.live.len())
            .filter(|&i| select(&self.live[i]))
            .collect();
        (!matching.is_empty()).then(|| matching[n % matching.len()])
    }

    /// Whether the inner service knows a live, uncancelled request of the
    /// session by the client id `raw` itself.
    fn forwarded_as_is(&self, session: usize, raw: &str) -> bool {
        self.live.iter().any(|exchange| {
            exchange.has_key(session, raw) && !exchange.cancelled && exchange.is_as_is()
        })
    }

    /// Whether the session has a live, uncancelled forwarded request with
    /// the client id `raw`, whatever id the inner service knows it by (a
    /// queued one is not forwarded yet).
    fn forwarded_live(&self, session: usize, raw: &str) -> bool {
        self.live.iter().any(|exchange| {
            exchange.has_key(session, raw) && !exchange.cancelled && exchange.server_id.is_some()
        })
    }

    /// Whether a live request holds the client id `raw` in the session, so
    /// that a new request with it is a duplicate for the policy. Under
    /// `Remap` only one the inner service knows by that id counts (the
    /// newcomer goes with a server-side id); under `Reject` and `Queue` any
    /// live, uncancelled forwarded one does, as is or remapped (as it would
    /// under `rewrite_all_ids`, which the harness leaves off). Shadows never
    /// count.
    fn holds_id(&self, session: usize, raw: &str) -> bool {
        match self.policy {
            OnDuplicate::Remap => self.forwarded_as_is(session, raw),
            _ => self.forwarded_live(session, raw),
        }
    }

    fn queued_with(&self, session: usize, raw: &str) -> bool {
        self.live
            .iter()
            .any(|exchange| exchange.has_key(session, raw) && exchange.is_queued())
    }

    /// Whether the inner service may still answer a request of the session
    /// it knows by the client id `raw` that the client no longer waits for:
    /// a cancelled one still open, or an ended one that shadows it. A new
    /// request with that id then goes with a server-side id.
    fn shadowed(&self, session: usize, raw: &str) -> bool {
        self.shadows
            .iter()
            .any(|shadow| shadow.session == session && key(&shadow.server_id) == key(raw))
            || self.live.iter().any(|exchange| {
                exchange.has_key(session, raw) && exchange.cancelled && exchange.is_as_is()
            })
    }

    fn apply(&mut self, op: &Op) {
        match *op {
            Op::Arrive { session, id } => self.arrive(session, IDS[id]),
            Op::Answer(n, format) => {
                if let Some(index) = self.pick(n, Exchange::is_waiting) {
                    self.answer(index, format);
                }
            }
            Op::ReadToEnd(n) => {
                if let Some(index) = self.pick(n, Exchange::is_answered) {
                    self.read_to_end(index);
                }
            }
            Op::DropBody(n) => {
                if let Some(index) = self.pick(n, Exchange::is_answered) {
                    self.drop_body(index);
                }
            }
            Op::DropFuture(n) => {
                if let Some(index) = self.pick(n, |exchange| !exchange.is_answered()) {
                    let exchange = self.live.remove(index);
                    self.shadows
                        .extend(exchange.shadow_after(Ending::Abandoned));
                    drop(exchange);
                }
            }
            Op::InnerError(n) => {
                if let Some(index) = self.pick(n, Exchange::is_waiting) {
                    self.inner_error(index);
                }
            }
            Op::Cancel { session, id } => self.cancel(session, IDS[id]),
            Op::Replay(replay) => self.replay(replay),
        }
        self.poll_queued();
        self.forget_links();
        self.check();
    }

    /// Whether the table holds `session`: while it has requests in flight
    /// or abandoned ids.
    fn holds(&self, session: usize) -> bool {
        self.live.iter().any(|exchange| exchange.session == session)
            || self.shadows.iter().any(|shadow| shadow.session == session)
    }

    /// A session leaves the table with its links once it holds nothing.
    fn forget_links(&mut self) {
        let held: HashSet<usize> = self
            .links
            .keys()
            .copied()
            .filter(|s| self.holds(*s))
            .collect();
        self.links.retain(|session, _| held.contains(session));
    }

    fn post(session: usize, body: String) -> Request<Full<Bytes>> {
        Request::post("/mcp")
            .header("content-type", "application/json")
            .header("mcp-session-id", SESSIONS[session])
            .body(Full::new(Bytes::from(body)))
            .unwrap()
    }

    fn arrive(&mut self, session: usize, client_id: &'static str) {
        // The model's prediction. A shadowed id is never a reason to refuse
        // or hold a request, only to give it a server-side id.
        let taken = self.holds_id(session, client_id);
        let queue =
            self.policy == OnDuplicate::Queue && (taken || self.queued_with(session, client_id));
        let reject = self.policy == OnDuplicate::Reject && taken;
        let shadowed = self.shadowed(session, client_id);
        let remap = (self.policy == OnDuplicate::Remap && taken) || (!queue && !reject && shadowed);

        let mut cx = context();
        assert!(self.service.poll_ready(&mut cx).is_ready());
        let mut future = Box::pin(
            self.service
                .call(Self::post(session, request_text(client_id))),
        );
        let polled = future.as_mut().poll(&mut cx);
        let call = self.inner.take_call();
        let arrival = self.tick();
        match (polled, call) {
            (Poll::Ready(Ok(response)), None) => {
                assert!(reject, "only a duplicate under Reject is answered at once");
                assert_eq!(response.status(), StatusCode::BAD_REQUEST);
                let body = read_all(Box::pin(response.into_body()));
                assert_eq!(
                    raw_field(&body, "id"),
                    client_id,
                    "the rejection carries the id"
                );
                self.expected.rejected += 1;
            }
            (Poll::Pending, None) => {
                assert!(queue, "only a duplicate under Queue waits");
                self.expected.queued += 1;
                self.live.push(Exchange {
                    session,
                    client_id,
                    server_id: None,
                    arrival,
                    forwarded: 0,
                    cancelled: false,
                    stage: Stage::Queued { future },
                });
            }
            (
                Poll::Pending,
                Some(Call {
                    body, responder, ..
                }),
            ) => {
                assert!(!reject && !queue, "a duplicate must not be forwarded");
                let server_id = raw_field(&body, "id");
                if remap {
                    assert!(
                        is_server_side(&server_id),
                        "remapped ({}): {server_id}",
                        if shadowed { "shadowed" } else { "duplicate" }
                    );
                    self.expected.remapped += 1;
                } else {
                    assert_eq!(server_id, client_id, "forwarded as is");
                    self.expected.passed += 1;
                }
                let forwarded = self.tick();
                self.history.push(Record {
                    session,
                    client_id,
                    server_id: server_id.clone(),
                });
                self.live.push(Exchange {
                    session,
                    client_id,
                    server_id: Some(server_id),
                    arrival,
                    forwarded,
                    cancelled: false,
                    stage: Stage::Waiting { future, responder },
                });
            }
            (Poll::Ready(result), _) => {
                panic!("unexpected outcome {:?}", result.map(|r| r.status()))
            }
        }
    }

    /// Polls every queued exchange, oldest first: the model says which one
    /// may go now (the first in line for its id, when the session has no
    /// live, uncancelled forwarded request with that id, as is or remapped),
    /// and with which id (its own, or a server-side one while the id is
    /// shadowed). Once one goes, it holds the id: the next in line waits for
    /// it to end, shadow or not.
    fn poll_queued(&mut self) {
        let mut arrivals: Vec<u64> = self
            .live
            .iter()
            .filter(|exchange| exchange.is_queued())
            .map(|exchange| exchange.arrival)
            .collect();
        arrivals.sort_unstable();
        for arrival in arrivals {
            let index = self
                .live
                .iter()
                .position(|exchange| exchange.arrival == arrival)
                .expect("still live");
            let (session, client_id) = (self.live[index].session, self.live[index].client_id);
            let first_in_line = !self.live.iter().any(|other| {
                other.is_queued()
                    && other.session == session
                    && key(other.client_id) == key(client_id)
                    && other.arrival < arrival
            });
            let expect_turn = first_in_line && !self.forwarded_live(session, client_id);
            let Stage::Queued { future } = &mut self.live[index].stage else {
                unreachable!("a queued exchange")
            };
            assert!(future.as_mut().poll(&mut context()).is_pending());
            let Some(Call {
                body, responder, ..
            }) = self.inner.take_call()
            else {
                assert!(
                    !expect_turn,
                    "{client_id} in {} should have had its turn",
                    SESSIONS[session]
                );
                continue;
            };
            assert!(
                expect_turn,
                "{client_id} in {} went out of turn",
                SESSIONS[session]
            );
            // Counted once, in `queued_total`, whichever id it goes with.
            let server_id = raw_field(&body, "id");
            if self.shadowed(session, client_id) {
                assert!(
                    is_server_side(&server_id),
                    "a queued request granted a shadowed id goes with a server-side id: {server_id}"
                );
            } else {
                assert_eq!(
                    server_id, client_id,
                    "a queued request goes with its own id"
                );
            }
            let forwarded = self.tick();
            let mut exchange = self.live.remove(index);
            let Stage::Queued { future } = exchange.stage else {
                unreachable!("a queued exchange")
            };
            exchange.stage = Stage::Waiting { future, responder };
            self.history.push(Record {
                session,
                client_id,
                server_id: server_id.clone(),
            });
            exchange.server_id = Some(server_id);
            exchange.forwarded = forwarded;
            self.live.push(exchange);
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
        let Stage::Answered { format, .. } = &exchange.stage else {
            unreachable!("picked an answered exchange")
        };
        // An opaque body shows the guard no response: the inner service may
        // still be running the request, for all it knows.
        let shadow = exchange.shadow_after(if *format == Format::Opaque {
            Ending::Abandoned
        } else {
            Ending::Completed
        });
        let Stage::Answered {
            mut body,
            sender,
            format,
        } = exchange.stage
        else {
            unreachable!("picked an answered exchange")
        };
        let server_id = exchange.server_id.as_deref().expect("forwarded");
        let wire = |id: &str| match format {
            Format::Sse => format!("id: 5\ndata: {}\n\n", answer_text(id)),
            Format::Json | Format::Opaque => answer_text(id),
        };
        let answer = wire(server_id);
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
        let restores = format != Format::Opaque;
        let expected = if restores {
            wire(exchange.client_id)
        } else {
            answer.clone()
        };
        assert_eq!(
            String::from_utf8(read).unwrap(),
            expected,
            "the client gets its own id back from JSON and SSE answers"
        );
        if restores && is_server_side(server_id) {
            self.expected.restored += 1;
        }
        // Released at the end of the body, before the body is dropped.
        self.shadows.extend(shadow);
        self.poll_queued();
        self.check();
        drop(body);
    }

    fn drop_body(&mut self, index: usize) {
        let exchange = self.live.remove(index);
        let mut shadow = exchange.shadow_after(Ending::Abandoned);
        let Stage::Answered {
            mut body,
            sender,
            format,
        } = exchange.stage
        else {
            unreachable!("picked an answered exchange")
        };
        if format == Format::Sse {
            // A priming event first: its id is where the client would
            // resume the stream from.
            let stream = format!("s{}", exchange.arrival);
            let priming = format!("id: {stream}\ndata:\n\n");
            sender
                .unbounded_send(Ok(Frame::data(Bytes::from(priming.clone()))))
                .unwrap();
            let Poll::Ready(Some(Ok(frame))) = body.as_mut().poll_frame(&mut context()) else {
                panic!("the priming event goes on at once")
            };
            assert_eq!(frame.into_data().unwrap(), priming.as_bytes());
            if let Some(shadow) = &mut shadow {
                shadow.stream = Some(stream);
            }
        }
        sender
            .unbounded_send(Ok(Frame::data(Bytes::from_static(b"{\"jsonrpc\":"))))
            .unwrap();
        // A partial read: the first part may come through (unrestored body)
        // or be held back (restoring body); either way the body is unfinished.
        let _ = body.as_mut().poll_frame(&mut context());
        assert!(!body.is_end_stream());
        drop(body);
        self.shadows.extend(shadow);
    }

    fn inner_error(&mut self, index: usize) {
        let exchange = self.live.remove(index);
        let shadow = exchange.shadow_after(Ending::Abandoned);
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
        self.shadows.extend(shadow);
    }

    /// Sends `notifications/cancelled` naming `raw`. The model: the guard
    /// cancels, of the session's requests with that id (`1` for `"1"` too)
    /// not cancelled yet: the live one the inner service knows by the
    /// client's own id; else the oldest live one it knows by a server-side
    /// id; else an ended one it knows by the client's own id (a live request
    /// comes first: the client still waits for it); else nothing. The
    /// notification reaches the inner service naming the target exactly as
    /// the inner service knows it (unchanged when nothing matches).
    fn cancel(&mut self, session: usize, raw: &'static str) {
        enum Target {
            Live(usize),
            Ended(usize),
        }
        let as_is_live = (0..self.live.len()).find(|&i| {
            let exchange = &self.live[i];
            exchange.has_key(session, raw) && !exchange.cancelled && exchange.is_as_is()
        });
        let as_is_ended = (0..self.shadows.len()).find(|&i| {
            let shadow = &self.shadows[i];
            shadow.session == session && !shadow.cancelled && key(&shadow.server_id) == key(raw)
        });
        let oldest_remapped = (0..self.live.len())
            .filter(|&i| {
                let exchange = &self.live[i];
                exchange.has_key(session, raw) && !exchange.cancelled && exchange.is_remapped()
            })
            .min_by_key(|&i| self.live[i].forwarded);
        let target = as_is_live
            .map(Target::Live)
            .or(oldest_remapped.map(Target::Live))
            .or(as_is_ended.map(Target::Ended));
        let expected_name = match &target {
            Some(Target::Live(i)) => self.live[*i].server_id.clone().expect("forwarded"),
            Some(Target::Ended(i)) => self.shadows[*i].server_id.clone(),
            None => raw.to_owned(),
        };

        let cancelled_before = self.layer.stats().cancelled_total;
        let mut cx = context();
        assert!(self.service.poll_ready(&mut cx).is_ready());
        let mut future = Box::pin(self.service.call(Self::post(session, cancel_text(raw))));
        assert!(future.as_mut().poll(&mut cx).is_pending());
        let Call {
            body, responder, ..
        } = self.inner.take_call().expect("forwarded");
        let named = raw_field(&body, "requestId");
        assert_eq!(
            self.layer.stats().cancelled_total > cancelled_before,
            target.is_some(),
            "a cancellation counts exactly when it names a request of the session"
        );
        assert_eq!(
            named, expected_name,
            "cancelling {raw} in {}: the inner service is told the target's id as it knows it",
            SESSIONS[session]
        );
        match target {
            Some(Target::Live(i)) => self.live[i].cancelled = true,
            Some(Target::Ended(i)) => self.shadows[i].cancelled = true,
            None => {}
        }
        if target.is_some() {
            self.expected.cancelled += 1;
        }
        let (_sender, receiver) = mpsc::unbounded();
        let accepted = Response::builder()
            .status(StatusCode::ACCEPTED)
            .body(StreamBody::new(receiver))
            .unwrap();
        assert!(responder.send(Ok(accepted)).is_ok());
        let Poll::Ready(Ok(response)) = future.as_mut().poll(&mut cx) else {
            panic!("the acknowledgement is ready")
        };
        assert_eq!(response.status(), StatusCode::ACCEPTED);
    }

    /// A `GET` in the session whose stream replays the answers to the picked
    /// exchanges. The model: the guard tracks nothing for it (the table and
    /// every counter but `restored_total` stay as they were, while its body
    /// is open and after), hands it on with only `Accept-Encoding` removed,
    /// and passes the stream on byte for byte except for the id of each
    /// answer the inner service knows by a server-side id, which comes back
    /// as the client's id text. An event goes out as soon as it is complete
    /// (its blank line seen, and the byte after a CR, which may start a
    /// CRLF), and its restored ids count as it goes out.
    fn replay(&mut self, replay: GetReplay) {
        let GetReplay {
            session,
            pick,
            resume,
            from,
            versioned,
            eol,
            multi_line,
            cuts,
            drop_half,
        } = replay;
        let eol = EOLS[eol];
        let recent: Vec<Record> = self
            .history
            .iter()
            .rev()
            .filter(|record| record.session == session)
            .take(8)
            .cloned()
            .collect();
        let mut picked: Vec<Record> = recent
            .into_iter()
            .enumerate()
            .filter(|(bit, _)| pick >> bit & 1 == 1)
            .map(|(_, record)| record)
            .collect();
        picked.reverse();

        // Each event: as the inner service sends it, as the client must read
        // it, and whether it restores an id.
        let plain = |text: String| (text.clone(), text, false);
        let answer = |seq: usize, id: &str| {
            let outcome = if seq % 2 == 0 {
                format!(r#""error":{{"code":-32800,"message":"replayed {seq}"}}"#)
            } else {
                format!(r#""result":{{"replayed":{seq}}}"#)
            };
            let split = if multi_line {
                format!("{eol}data: ")
            } else {
                String::new()
            };
            format!(
                r#"id: {seq}{eol}data: {{"jsonrpc":"2.0",{split}"id":{id},{outcome}}}{eol}{eol}"#
            )
        };
        // The notification names a server-side id too, below the top level:
        // it must pass unchanged.
        let token = picked
            .first()
            .map_or_else(|| "0".to_owned(), |record| record.server_id.clone());
        let notification = plain(format!(
            r#"data: {{"jsonrpc":"2.0","method":"notifications/progress","params":{{"id":{token},"progressToken":{token},"progress":1}}}}{eol}{eol}"#
        ));
        let comment = plain(format!(": keep-alive{eol}{eol}"));
        let mut events = vec![plain(format!("id: 0{eol}retry: 3000{eol}data:{eol}{eol}"))];
        // The answers with the client's own id, by event index: on a resumed
        // stream each frees its session's abandoned id once it passed.
        let mut own_answers: Vec<(usize, String)> = Vec::new();
        for (index, record) in picked.iter().enumerate() {
            if index == picked.len() / 2 {
                events.push(notification.clone());
            }
            let seq = index + 1;
            if !is_server_side(&record.server_id) {
                own_answers.push((events.len(), record.server_id.clone()));
            }
            events.push((
                answer(seq, &record.server_id),
                answer(seq, record.client_id),
                is_server_side(&record.server_id),
            ));
            if index == 0 {
                events.push(comment.clone());
            }
        }
        if picked.is_empty() {
            events.extend([notification, comment]);
        }
        let wire: String = events.iter().map(|event| event.0.as_str()).collect();
        let server_side = events.iter().filter(|event| event.2).count() as u64;

        let mut request = Request::get("/mcp")
            .header("accept", "text/event-stream")
            .header("accept-encoding", "gzip")
            .header("mcp-session-id", SESSIONS[session]);
        if versioned {
            request = request.header("mcp-protocol-version", "2025-11-25");
        }
        // Where to resume from: an abandoned request's own stream, a later
        // event id of a resumption, or (past them) an id of no stream.
        let mut streams: Vec<String> = self
            .shadows
            .iter()
            .filter(|shadow| shadow.session == session)
            .filter_map(|shadow| shadow.stream.clone())
            .collect();
        if let Some(links) = self.links.get(&session) {
            streams.extend(links.links.iter().flatten().map(|(later, _)| later.clone()));
        }
        let resumed = usize::from(from) % (streams.len() + 1);
        let resumed = streams.get(resumed).cloned().unwrap_or_else(|| "0".into());
        // The stream the GET continues: a later event id of an earlier
        // resumption stands for the stream that one continued.
        let origin = self
            .links
            .get(&session)
            .map_or_else(|| resumed.clone(), |links| links.origin(&resumed));
        // Each event's id, if it has one: a client resumes from the last one
        // dispatched.
        let event_ids: Vec<Option<String>> = events
            .iter()
            .map(|event| {
                let rest = event.0.strip_prefix("id: ")?;
                Some(rest[..rest.find(['\r', '\n'])?].to_owned())
            })
            .collect();
        let mut linked: Option<String> = None;
        if resume {
            request = request.header("last-event-id", resumed.as_str());
        }
        let request = request.body(Full::new(Bytes::new())).unwrap();
        let mut handed_on = request.headers().clone();
        handed_on.remove("accept-encoding");
        let restored_before = self.layer.stats().restored_total;
        let mut cx = context();
        assert!(self.service.poll_ready(&mut cx).is_ready());
        let mut future = Box::pin(self.service.call(request));
        assert!(future.as_mut().poll(&mut cx).is_pending());
        let Call {
            method,
            headers,
            body,
            responder,
        } = self.inner.take_call().expect("a GET is handed on at once");
        assert_eq!(method, Method::GET);
        assert!(body.is_empty());
        assert_eq!(
            headers, handed_on,
            "{replay:?}: the inner service sees the GET as sent, without Accept-Encoding"
        );
        self.check();

        let (sender, receiver) = mpsc::unbounded();
        let response = Response::builder()
            .header("content-type", "text/event-stream")
            .header("cache-control", "no-cache")
            .body(StreamBody::new(receiver))
            .unwrap();
        assert!(responder.send(Ok(response)).is_ok());
        let Poll::Ready(Ok(response)) = future.as_mut().poll(&mut cx) else {
            panic!("the stream is ready")
        };
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(response.headers()["content-type"], "text/event-stream");
        assert_eq!(response.headers()["cache-control"], "no-cache");
        let mut body = Box::pin(response.into_body());
        self.check();

        // How many leading events are complete once `fed` bytes arrived.
        let complete_after = |fed: usize, ended: bool| {
            let mut end = 0;
            events
                .iter()
                .take_while(|event| {
                    end += event.0.len();
                    end < fed || (end == fed && (ended || eol != "\r"))
                })
                .count()
        };
        let at = |thousandths: u16| usize::from(thousandths.min(1000)) * wire.len() / 1000;
        let (first, second) = (at(cuts.0), at(cuts.1));
        let mut read = Vec::new();
        let expected_before = self.expected.restored;
        let whole: String = events.iter().map(|event| event.1.as_str()).collect();
        let mut fed = 0;
        for bound in [first.min(second), first.max(second), wire.len()] {
            sender
                .unbounded_send(Ok(Frame::data(Bytes::copy_from_slice(
                    &wire.as_bytes()[fed..bound],
                ))))
                .unwrap();
            fed = bound;
            assert!(!read_ready(&mut body, &mut read), "the stream is open");
            // Bytes go on as they arrive: every complete event is out, and
            // what is out is the start of the restored stream (only an id
            // waiting for its message's kind is held back).
            let complete = complete_after(fed, false);
            let expected: String = events[..complete]
                .iter()
                .map(|event| event.1.as_str())
                .collect();
            let out = String::from_utf8(read.clone()).unwrap();
            assert!(
                out.starts_with(&expected),
                "{replay:?}: after {fed} of {} bytes, the complete events, ids restored\n  out: {out:?}\n  expected: {expected:?}",
                wire.len()
            );
            assert!(
                whole.starts_with(&out),
                "{replay:?}: after {fed} of {} bytes, the start of the restored stream\n  out: {out:?}",
                wire.len()
            );
            // An event still arriving may already have its id restored.
            let restored = self.layer.stats().restored_total - restored_before;
            let at_least = events[..complete].iter().filter(|event| event.2).count() as u64;
            assert!(
                (at_least..=at_least + 1).contains(&restored),
                "{replay:?}: {restored} restored after {complete} complete events"
            );
            self.expected.restored = expected_before + restored;
            if resume {
                // An event ends at its blank line's first byte (a CR of a
                // CRLF too): the client dispatches it then, whatever comes
                // next.
                let mut end = 0;
                let dispatched = events
                    .iter()
                    .take_while(|event| {
                        end += event.0.len();
                        end - usize::from(event.0.ends_with("\r\n")) <= fed
                    })
                    .count();
                // The table links where the client would resume from now to
                // the stream this continues (while the session is held),
                // then frees what was answered.
                let last = event_ids[..dispatched].iter().flatten().last().cloned();
                if last.is_some() && last != linked {
                    linked.clone_from(&last);
                    if self.holds(session) {
                        self.links
                            .entry(session)
                            .or_default()
                            .link(last.as_deref().unwrap(), &origin);
                    }
                }
                self.answered_on_stream(session, &origin, &mut own_answers, dispatched);
                self.forget_links();
            }
            self.check();
            if drop_half {
                // Half read: the table never knew the stream.
                drop(body);
                return;
            }
        }
        drop(sender);
        assert!(read_ready(&mut body, &mut read), "the stream ended");
        let expected: String = events.iter().map(|event| event.1.as_str()).collect();
        assert_eq!(
            String::from_utf8(read).unwrap(),
            expected,
            "{replay:?}: every answer carries its exchange's client id; nothing else changed"
        );
        assert_eq!(complete_after(wire.len(), true), events.len());
        if resume {
            self.answered_on_stream(session, &origin, &mut own_answers, events.len());
            self.forget_links();
            self.check();
        }
        self.expected.restored =
            expected_before + events.iter().filter(|event| event.2).count() as u64;
        assert_eq!(
            self.layer.stats().restored_total - restored_before,
            server_side,
            "{replay:?}: one restored id per replayed answer with a server-side id"
        );
    }

    /// The model of a resumed stream: each answer with the client's own id
    /// among the first `complete` events frees the session's abandoned id of
    /// that key, if there is one (at most one: while an id is abandoned, new
    /// requests with it go remapped), and only if the stream resumed is that
    /// abandoned request's own (`origin`: its `Last-Event-ID`, or the stream
    /// an earlier resumption that reached it continued): an answer replayed
    /// on another request's stream frees nothing.
    fn answered_on_stream(
        &mut self,
        session: usize,
        origin: &str,
        own_answers: &mut Vec<(usize, String)>,
        complete: usize,
    ) {
        own_answers.retain(|(event, server_id)| {
            if *event >= complete {
                return true;
            }
            if let Some(position) = self.shadows.iter().position(|shadow| {
                shadow.session == session
                    && key(&shadow.server_id) == key(server_id)
                    && shadow.stream.as_deref() == Some(origin)
            }) {
                self.shadows.remove(position);
            }
            false
        });
    }

    fn check(&self) {
        let stats = self.layer.stats();
        assert_eq!(stats.in_flight_requests, self.live.len(), "in flight");
        let sessions: HashSet<usize> = self.live.iter().map(|e| e.session).collect();
        assert_eq!(stats.in_flight_sessions, sessions.len(), "tracked sessions");
        assert_eq!(stats.abandoned_ids, self.shadows.len(), "abandoned ids");
        // Every id the inner service may still answer under, per session:
        // live exchanges (cancelled ones too) and shadows. No two may match.
        let mut seen = HashSet::new();
        for shadow in &self.shadows {
            assert!(
                seen.insert((shadow.session, key(&shadow.server_id))),
                "two shadows of {} in {}",
                shadow.server_id,
                SESSIONS[shadow.session]
            );
        }
        for exchange in &self.live {
            if let Some(server_id) = &exchange.server_id {
                assert!(
                    seen.insert((exchange.session, key(server_id))),
                    "{server_id} is live twice, or live and shadowed, in {}",
                    SESSIONS[exchange.session]
                );
            }
        }
        let counters = Counters {
            passed: stats.passed_total,
            remapped: stats.remapped_total,
            rejected: stats.rejected_total,
            queued: stats.queued_total,
            cancelled: stats.cancelled_total,
            restored: stats.restored_total,
        };
        assert_eq!(counters, self.expected, "counters");
    }

    /// Ends every live exchange, alternating between the ways to end one, and
    /// returns the final counters.
    fn finish(mut self) -> Stats {
        let mut turn = 0usize;
        while let Some(index) = self.live.iter().rposition(|exchange| !exchange.is_queued()) {
            match (self.live[index].is_waiting(), turn % 2) {
                (true, 0) => self.answer(index, [Format::Json, Format::Sse][turn % 4 / 2]),
                (true, _) => self.inner_error(index),
                (false, 0) => self.read_to_end(index),
                (false, _) => self.drop_body(index),
            }
            turn += 1;
            self.poll_queued();
            self.check();
        }
        // Whatever is still queued waits behind nothing: the model says it
        // would have had its turn.
        assert!(self.live.is_empty(), "queued requests got their turn");
        let stats = self.layer.stats();
        assert_eq!(
            (stats.in_flight_requests, stats.in_flight_sessions),
            (0, 0),
            "drained"
        );
        stats
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

/// Reads whatever frames are ready; returns whether the body ended.
fn read_ready(body: &mut Pin<Box<ResponseBody<InnerBody>>>, out: &mut Vec<u8>) -> bool {
    let mut cx = context();
    loop {
        match body.as_mut().poll_frame(&mut cx) {
            Poll::Ready(Some(Ok(frame))) => {
                out.extend_from_slice(&frame.into_data().expect("no trailers"))
            }
            Poll::Ready(Some(Err(never))) => match never {},
            Poll::Ready(None) => return true,
            Poll::Pending => return false,
        }
    }
}

fn run(policy: OnDuplicate, ops: &[Op]) {
    // `Queue` arms a tokio timer while a request waits.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let _context = runtime.enter();
    let mut harness = Harness::new(policy);
    for op in ops {
        harness.apply(op);
    }
    harness.finish();
}

const POLICIES: [OnDuplicate; 3] = [OnDuplicate::Remap, OnDuplicate::Reject, OnDuplicate::Queue];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Under `Remap`: every interleaving keeps the table exact, server-visible
    /// ids unique per session (shadowed ones included), and answers restored.
    #[test]
    fn remap_tracks_exactly_the_live_exchanges(ops in prop::collection::vec(op(false), 1..40)) {
        run(OnDuplicate::Remap, &ops);
    }

    /// Under `Reject`: the same, with duplicates (of any live request with
    /// the id, remapped past a shadow or not) answered at once and never
    /// live, and shadowed ids remapped rather than rejected.
    #[test]
    fn reject_tracks_exactly_the_live_exchanges(ops in prop::collection::vec(op(false), 1..40)) {
        run(OnDuplicate::Reject, &ops);
    }

    /// Under `Queue`: the same, with duplicates (of any live request with
    /// the id, remapped past a shadow or not) waiting (counted in flight) and
    /// let through first come first served, one at a time, exactly when no
    /// live request holds their id (with a server-side id while it is
    /// shadowed), and shadowed ids remapped rather than queued.
    #[test]
    fn queue_tracks_exactly_the_live_exchanges(ops in prop::collection::vec(op(false), 1..40)) {
        run(OnDuplicate::Queue, &ops);
    }

    /// With `notifications/cancelled` mixed in, under every policy: the
    /// accounting stays exact, each cancellation reaches the predicted
    /// request (the live one known by the client's own id, else the oldest
    /// live remapped one, else an ended one known by the client's own id)
    /// named exactly as the inner service knows it, a cancelled request
    /// shadows its id from then on, and live exchanges, cancelled ones
    /// included, keep unique server-visible ids.
    #[test]
    fn cancellations_keep_the_accounting_exact(
        policy in prop::sample::select(POLICIES.to_vec()),
        ops in prop::collection::vec(op(true), 1..40),
    ) {
        run(policy, &ops);
    }
}

/// A fixed interleaving that exercises every operation under every policy,
/// so the property tests' harness is known to reach each branch.
#[test]
fn scripted_interleaving() {
    use Op::*;
    for policy in POLICIES {
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
            Cancel { session: 0, id: 1 },
            Arrive { session: 0, id: 1 },
            // The `2` just remapped past the cancelled one holds the id:
            // remapped again under `Remap`, refused or held otherwise.
            Arrive { session: 0, id: 1 },
            Arrive { session: 1, id: 2 },
            Cancel { session: 1, id: 0 },
            Replay(GetReplay {
                session: 0,
                pick: u8::MAX,
                resume: true,
                from: 0,
                versioned: false,
                eol: 1,
                multi_line: true,
                cuts: (40, 200),
                drop_half: false,
            }),
            Replay(GetReplay {
                session: 1,
                pick: u8::MAX,
                resume: false,
                from: 0,
                versioned: true,
                eol: 2,
                multi_line: false,
                cuts: (90, 0),
                drop_half: true,
            }),
        ];
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let _context = runtime.enter();
        let mut harness = Harness::new(policy);
        for op in &ops {
            harness.apply(op);
        }
        let stats = harness.layer.stats();
        match policy {
            OnDuplicate::Remap => assert!(stats.remapped_total >= 3, "{stats:?}"),
            // Two duplicates of `1` known by the client's id, and the third
            // `2` of session-a, whose id the remapped `2` holds.
            OnDuplicate::Reject => assert_eq!(stats.rejected_total, 3, "{stats:?}"),
            _ => {
                assert!(stats.queued_total >= 3, "{stats:?}");
                assert!(
                    harness
                        .live
                        .iter()
                        .any(|exchange| exchange.is_queued() && exchange.has_key(0, IDS[1])),
                    "the third `2` of session-a waits for the remapped one"
                );
            }
        }
        assert!(stats.cancelled_total >= 2, "{stats:?}");
        assert!(stats.restored_total >= 1, "{stats:?}");
        harness.finish();
    }
}

/// A shadowed id forces a server-side id under every policy, where the same
/// id would otherwise be forwarded as is, rejected or queued: after a dropped
/// body, for a cancelled exchange that is still open, after a dropped
/// response future, and for a queued request granted the id while it is
/// shadowed. A shadow alone never gets a request rejected or queued; a live
/// request remapped past it still holds the client's id under `Reject` and
/// `Queue` (not under `Remap`). Cancellations go to the ended exchange the
/// inner service knows by the client's id before any remapped one. Each
/// step's counters are spelled out; the harness checks the rest of the model
/// as in the property tests.
#[test]
fn shadowed_ids_force_a_remap_under_every_policy() {
    /// remapped, rejected and queued totals, cancelled total, abandoned ids.
    type Shadowing = (u64, u64, u64, u64, usize);
    use Op::*;
    for policy in POLICIES {
        // What a duplicate adds: a remapped request, a rejection or a wait.
        let (dup, rejected, queued) = match policy {
            OnDuplicate::Remap => (1, 0, 0),
            OnDuplicate::Reject => (0, 1, 0),
            _ => (0, 0, 1),
        };
        let queue = policy == OnDuplicate::Queue;
        // (op, counters after it, whether the exchange forwarded last went
        // with a server-side id)
        let steps: [(Op, Shadowing, bool); 14] = [
            // 0-2. `1` in session-a as is; its body is dropped: `1` shadowed.
            (Arrive { session: 0, id: 0 }, (0, 0, 0, 0, 0), false),
            (Answer(0, Format::Json), (0, 0, 0, 0, 0), false),
            (DropBody(0), (0, 0, 0, 0, 1), false),
            // 3. `"1"`: remapped, never rejected or queued for the shadow.
            (Arrive { session: 0, id: 2 }, (1, 0, 0, 0, 1), true),
            // 4. `1` again: under `Remap` only a live request known by the
            // client's id is a duplicate, so the shadow remaps it; under
            // `Reject` and `Queue` the live `"1"`, remapped past the shadow,
            // still holds the client's id: a duplicate, refused or held.
            (
                Arrive { session: 0, id: 0 },
                (1 + dup, rejected, queued, 0, 1),
                true,
            ),
            // 5. Cancelling `"1"` reaches the ended `1` (named `1`), which the
            // server may still be working on; it stays shadowed. A waiting
            // `1` still waits: the live `"1"` holds the id.
            (
                Cancel { session: 0, id: 2 },
                (1 + dup, rejected, queued, 1, 1),
                true,
            ),
            // 6. Cancelling `1` again reaches the oldest remapped one, the
            // `"1"`; under `Queue` the waiting `1` goes now, with a
            // server-side id (`1` is still shadowed).
            (
                Cancel { session: 0, id: 0 },
                (1 + dup, rejected, queued, 2, 1),
                true,
            ),
            // 7-9. `2` in session-b as is, cancelled while open (shadowing,
            // not yet counted as abandoned), then `2` again: remapped (the
            // cancelled one holds nothing).
            (
                Arrive { session: 1, id: 1 },
                (1 + dup, rejected, queued, 2, 1),
                false,
            ),
            (
                Cancel { session: 1, id: 1 },
                (1 + dup, rejected, queued, 3, 1),
                false,
            ),
            (
                Arrive { session: 1, id: 1 },
                (2 + dup, rejected, queued, 3, 1),
                true,
            ),
            // 10-11. `1` twice in session-c: a duplicate of a request known
            // by the client's id, handled by the policy.
            (
                Arrive { session: 2, id: 0 },
                (2 + dup, rejected, queued, 3, 1),
                false,
            ),
            (
                Arrive { session: 2, id: 0 },
                (2 + 2 * dup, 2 * rejected, 2 * queued, 3, 1),
                dup == 1,
            ),
            // 12. The first `1` of session-c gives up before its answer (the
            // fifth exchange without an answer; the fourth under `Reject`,
            // which refused step 4): `1` shadowed there, and under `Queue` the
            // waiting `1` goes now, with a server-side id.
            (
                DropFuture(if rejected == 1 { 3 } else { 4 }),
                (2 + 2 * dup, 2 * rejected, 2 * queued, 3, 2),
                queue,
            ),
            // 13. `"1"` in session-c: shadowed, so never as is. Remapped under
            // `Remap` (the live remapped `1` does not count) and `Reject`
            // (nothing live there); under `Queue` it waits for the `1` just
            // granted a server-side id, which holds the id.
            (
                Arrive { session: 2, id: 2 },
                (3 + 2 * dup - queued, 2 * rejected, 3 * queued, 3, 2),
                true,
            ),
        ];
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let _context = runtime.enter();
        let mut harness = Harness::new(policy);
        for (step, (op, expected, last_remapped)) in steps.iter().enumerate() {
            harness.apply(op);
            let stats = harness.layer.stats();
            let counters = (
                stats.remapped_total,
                stats.rejected_total,
                stats.queued_total,
                stats.cancelled_total,
                stats.abandoned_ids,
            );
            assert_eq!(counters, *expected, "{policy:?}, step {step}: {op:?}");
            if *last_remapped {
                let last = harness
                    .live
                    .iter()
                    .filter(|exchange| exchange.server_id.is_some())
                    .max_by_key(|exchange| exchange.forwarded)
                    .expect("forwarded");
                assert!(
                    last.is_remapped(),
                    "{policy:?}, step {step}: {} in {} went as {:?}",
                    last.client_id,
                    SESSIONS[last.session],
                    last.server_id
                );
            }
        }
        let waiting: Vec<&Exchange> = harness
            .live
            .iter()
            .filter(|exchange| exchange.is_queued())
            .collect();
        assert_eq!(
            waiting.len(),
            usize::from(queue),
            "{policy:?}: only the `\"1\"` of step 13 waits"
        );
        assert!(
            waiting
                .iter()
                .all(|exchange| harness.forwarded_live(exchange.session, exchange.client_id)),
            "{policy:?}: nothing waits behind a shadow alone"
        );
        let stats = harness.finish();
        assert_eq!(
            (stats.rejected_total, stats.queued_total),
            (2 * rejected, 3 * queued),
            "{policy:?}: only requests whose id a live request holds are refused or held"
        );
        assert!(
            stats.abandoned_ids >= 3,
            "{policy:?}: `1` in session-a and session-c and the cancelled `2` in session-b stay shadowed: {stats:?}"
        );
    }
}

/// A live request remapped past a shadow holds the client's id: in
/// session-a, `1` gives up before its answer (shadowing `1`), and `"1"` goes
/// with a server-side id. While it is live, `1` and then `"1"` again are
/// remapped under `Remap` (only a request known by the client's id would be
/// a duplicate), answered 400 under `Reject`, and wait under `Queue`. Under
/// `Queue` they go one after another, each when the one before has ended and
/// each with a server-side id, since `1` is still shadowed; and once nothing
/// is live, `1` goes remapped at once under every policy. Each step's
/// counters, waiting requests and live requests with a server-side id are
/// spelled out; the harness checks the rest of the model.
#[test]
fn a_request_remapped_past_a_shadow_holds_its_id() {
    /// passed, remapped, rejected and queued totals, requests waiting, live
    /// forwarded requests with a server-side id.
    type Holding = (u64, u64, u64, u64, usize, usize);
    use Op::*;
    // (op, what follows it under Remap, Reject and Queue)
    let steps: [(Op, [Holding; 3]); 12] = [
        // 0-1. `1` (A) as is; it gives up before its answer: `1` shadowed.
        (
            Arrive { session: 0, id: 0 },
            [(1, 0, 0, 0, 0, 0), (1, 0, 0, 0, 0, 0), (1, 0, 0, 0, 0, 0)],
        ),
        (
            DropFuture(0),
            [(1, 0, 0, 0, 0, 0), (1, 0, 0, 0, 0, 0), (1, 0, 0, 0, 0, 0)],
        ),
        // 2. `"1"` (B): remapped past the shadow under every policy.
        (
            Arrive { session: 0, id: 2 },
            [(1, 1, 0, 0, 0, 1), (1, 1, 0, 0, 0, 1), (1, 1, 0, 0, 0, 1)],
        ),
        // 3. `1` (C) while B is live: remapped, 400, or waits.
        (
            Arrive { session: 0, id: 0 },
            [(1, 2, 0, 0, 0, 2), (1, 1, 1, 0, 0, 1), (1, 1, 0, 1, 1, 1)],
        ),
        // 4. `"1"` (D): the same; under `Queue` it waits behind C.
        (
            Arrive { session: 0, id: 2 },
            [(1, 3, 0, 0, 0, 3), (1, 1, 2, 0, 0, 1), (1, 1, 0, 2, 2, 1)],
        ),
        // 5. B is answered, its body still open: C still waits.
        (
            Answer(0, Format::Json),
            [(1, 3, 0, 0, 0, 3), (1, 1, 2, 0, 0, 1), (1, 1, 0, 2, 2, 1)],
        ),
        // 6. B ends: under `Queue` C goes, with a server-side id; D waits,
        // since C now holds the id.
        (
            ReadToEnd(0),
            [(1, 3, 0, 0, 0, 2), (1, 1, 2, 0, 0, 0), (1, 1, 0, 2, 1, 1)],
        ),
        // 7-8. C (under `Reject`: nothing) is answered and ends: under
        // `Queue` D goes, with a server-side id.
        (
            Answer(0, Format::Sse),
            [(1, 3, 0, 0, 0, 2), (1, 1, 2, 0, 0, 0), (1, 1, 0, 2, 1, 1)],
        ),
        (
            ReadToEnd(0),
            [(1, 3, 0, 0, 0, 1), (1, 1, 2, 0, 0, 0), (1, 1, 0, 2, 0, 1)],
        ),
        // 9-10. D is answered and ends: nothing is live.
        (
            Answer(0, Format::Json),
            [(1, 3, 0, 0, 0, 1), (1, 1, 2, 0, 0, 0), (1, 1, 0, 2, 0, 1)],
        ),
        (
            ReadToEnd(0),
            [(1, 3, 0, 0, 0, 0), (1, 1, 2, 0, 0, 0), (1, 1, 0, 2, 0, 0)],
        ),
        // 11. `1` (E): shadowed with nothing live: remapped at once.
        (
            Arrive { session: 0, id: 0 },
            [(1, 4, 0, 0, 0, 1), (1, 2, 2, 0, 0, 1), (1, 2, 0, 2, 0, 1)],
        ),
    ];
    for (which, policy) in POLICIES.into_iter().enumerate() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let _context = runtime.enter();
        let mut harness = Harness::new(policy);
        for (step, (op, expected)) in steps.iter().enumerate() {
            harness.apply(op);
            let stats = harness.layer.stats();
            let waiting = harness.live.iter().filter(|e| e.is_queued()).count();
            let server_side = harness.live.iter().filter(|e| e.is_remapped()).count();
            let observed = (
                stats.passed_total,
                stats.remapped_total,
                stats.rejected_total,
                stats.queued_total,
                waiting,
                server_side,
            );
            assert_eq!(observed, expected[which], "{policy:?}, step {step}: {op:?}");
            assert_eq!(
                stats.abandoned_ids,
                usize::from(step > 0),
                "{policy:?}, step {step}: A's shadow"
            );
        }
        let stats = harness.finish();
        assert_eq!(stats.abandoned_ids, 1, "{policy:?}: A's shadow lasts");
    }
}

/// GET streams replay answers to earlier exchanges, live or ended: each
/// answer the inner service knows by a server-side id comes back with the
/// client's id (and counts once in `restored_total`), the others and
/// everything else pass as they are, a body dropped half read counts only
/// what went out, and no GET touches the table. Each step's restored total
/// is spelled out; the harness checks the rest of the model.
#[test]
fn replayed_answers_come_back_with_the_client_ids() {
    use Op::*;
    let replay = |session, pick, eol, multi_line, cuts, drop_half| {
        Replay(GetReplay {
            session,
            pick,
            resume: eol == 1,
            from: 0,
            versioned: multi_line,
            eol,
            multi_line,
            cuts,
            drop_half,
        })
    };
    // (op, restored total after it)
    let steps: [(Op, u64); 14] = [
        // 0-3. `1` as is, `1` and `"1"` remapped in session-a; `2` as is in
        // session-b.
        (Arrive { session: 0, id: 0 }, 0),
        (Arrive { session: 0, id: 0 }, 0),
        (Arrive { session: 0, id: 2 }, 0),
        (Arrive { session: 1, id: 1 }, 0),
        // 4. The standalone stream of session-a replays all three while they
        // are live: two server-side ids.
        (replay(0, 0b111, 0, false, (0, 0), false), 2),
        // 5-6. The second `1` (remapped) is answered and read: restored in
        // its own answer.
        (Answer(1, Format::Sse), 2),
        (ReadToEnd(0), 3),
        // 7. A resumed stream replays the ended one and the live `"1"`, with
        // CRLF and split data.
        (replay(0, 0b011, 1, true, (17, 300), false), 5),
        // 8. Only the one known by the client's own id: nothing to restore.
        (replay(0, 0b100, 2, false, (5, 9), false), 5),
        // 9. session-b's stream: `2` as is, nothing restored.
        (replay(1, u8::MAX, 0, false, (1, 2), false), 5),
        // 10. session-c has no exchanges: priming, notification and comment
        // only.
        (replay(2, u8::MAX, 2, true, (3, 3), false), 5),
        // 11. Dropped after the first chunk, which holds none of the
        // answers: nothing restored.
        (replay(0, 0b011, 0, false, (30, 30), true), 5),
        // 12. Dropped after a first chunk holding the whole stream but its
        // final CR (it may start a CRLF): bytes go on as they arrive, so the
        // last answer went out restored all the same.
        (replay(0, 0b011, 2, false, (1000, 1000), true), 7),
        // 13. The same with LF: every answer went out.
        (replay(0, 0b011, 0, false, (1000, 1000), true), 9),
    ];
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let _context = runtime.enter();
    let mut harness = Harness::new(OnDuplicate::Remap);
    for (step, (op, restored)) in steps.iter().enumerate() {
        harness.apply(op);
        let stats = harness.layer.stats();
        assert_eq!(stats.restored_total, *restored, "step {step}: {op:?}");
    }
    let stats = harness.finish();
    assert_eq!(
        (stats.remapped_total, stats.passed_total),
        (2, 2),
        "{stats:?}"
    );
}
