//! Model-based test of one session (issue #19): the guard must never forward
//! a request under an id the server may still be running for another
//! request, and never restore a response to an id the client did not send.
//!
//! The guard wraps a *scripted* server: it records every request it receives
//! (with the id as the server sees it) and answers at once with an SSE
//! response whose frames the test pushes through a channel, so each case
//! decides, step by step, what the server does with each request: send a
//! notification or the response on the request's POST stream, end that
//! stream early (a priming event, then the end) and answer later on the
//! session's GET stream, fail the stream mid-response, or never answer.
//! Two actors answer in the server's place: a layer inside the guard (a
//! timeout) that answers a POST `408` while the server goes on running it,
//! and a server replaying an answer it already delivered, on a `GET` that
//! resumes that answer's stream (`Last-Event-ID`). The
//! client POSTs with ids drawn from `1`, `2` and `"1"` (one id for the
//! guard), reads what has arrived or drops the body at any point (a
//! disconnect, or a client giving up after its own timeout while the server
//! goes on: the tower layer has no timeout of its own), cancels ids, and
//! opens (resumed with `Last-Event-ID`, or standalone), reads and drops the
//! GET stream. An eager client reads whatever arrives after every step.
//!
//! The model is what the *server* still holds: the ids (as it sees them) of
//! the requests it received and has not answered, on any stream. A
//! cancellation does not end one (a handler may ignore it), and neither does
//! a stream failing mid-response (the server may still run it). After every
//! step the test checks:
//! 1. every request the server receives has an id whose collision key
//!    (`1` == `"1"`, the guard's key: stricter than any one SDK's) is not
//!    that of a request the server still runs;
//! 2. every response the client reads carries exactly the id the client sent
//!    for that request (never a server-side `mcp-id-guard:` id, never another
//!    request's), on its POST or on the GET stream;
//! 3. nothing hangs: a POST the server was called for returns at once, a
//!    stream the server ended ends for the client within a bounded time, and
//!    a response the server sent on the GET stream reaches the client at
//!    once; after everything is dropped, nothing is in flight.
//!
//! `abandoned_id_ttl` is an hour, so nothing expires within a case. There is
//! no "time passes beyond the ttl" step: abandoned ids expire by tokio's
//! clock, which only a paused runtime could move without waiting for real
//! (this test does not pause it); `tests/sim` covers expiry in simulated
//! time.

use std::convert::Infallible;
use std::future::{ready, Ready};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures::stream::BoxStream;
use futures::FutureExt;
use http::{header, Method, Request, Response, StatusCode};
use http_body::{Body, Frame};
use http_body_util::{BodyExt, Full, StreamBody};
use mcp_id_guard::guard::{GuardRequestBody as RequestBody, GuardResponseBody as ResponseBody};
use mcp_id_guard::{IdGuard, IdGuardLayer, OnDuplicate};
use proptest::prelude::*;
use serde_json::Value;
use tokio::sync::mpsc;
use tower::{Layer, Service};

use crate::support::ids::{is_server_side, raw_id};
use crate::support::inner::fields;
use crate::support::wait::drained;
use crate::support::{sse, ACCEPT, HANG_TIMEOUT, PROTOCOL_VERSION};

const SESSION: &str = "model-session";
/// `1` and `"1"` are one id to the guard.
const IDS: [&str; 3] = ["1", "2", r#""1""#];

/// A stream failure the scripted server injects mid-response.
#[derive(Debug)]
struct Broken;

impl std::fmt::Display for Broken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the server's stream broke")
    }
}

impl std::error::Error for Broken {}

type Chunk = Result<Frame<Bytes>, Broken>;
type InnerBody = StreamBody<BoxStream<'static, Chunk>>;
/// The server's end of one SSE response: dropping it ends the stream.
type Upstream = mpsc::UnboundedSender<Chunk>;

/// A body the test writes through `Upstream`.
fn channel_body() -> (Upstream, InnerBody) {
    let (sender, mut receiver) = mpsc::unbounded_channel();
    let stream = futures::stream::poll_fn(move |cx| receiver.poll_recv(cx));
    (sender, StreamBody::new(Box::pin(stream)))
}

/// A request as the scripted server received it, with the handle that writes
/// its response.
struct Received {
    method: Method,
    body: Bytes,
    upstream: Upstream,
    /// A layer inside the guard answered `408` in the server's place; the
    /// server runs the request all the same.
    timed_out: bool,
}

/// The scripted server: every POST or GET gets a `text/event-stream`
/// response at once, whose frames the test writes; a POST without a request
/// in it (a notification) gets `202`.
#[derive(Clone, Default)]
struct Scripted {
    received: Arc<Mutex<Vec<Received>>>,
    /// The next request is answered `408` by a layer inside the guard.
    time_out_next: Arc<Mutex<bool>>,
}

impl Scripted {
    fn take(&self) -> Vec<Received> {
        std::mem::take(&mut *self.received.lock().unwrap())
    }
}

impl Service<Request<RequestBody<Full<Bytes>>>> for Scripted {
    type Response = Response<InnerBody>;
    type Error = Infallible;
    type Future = Ready<Result<Response<InnerBody>, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<RequestBody<Full<Bytes>>>) -> Self::Future {
        // The guard hands on a body it already read: it is ready at once.
        let (parts, body) = request.into_parts();
        let body = body
            .collect()
            .now_or_never()
            .expect("a buffered body is ready")
            .unwrap_or_else(|never| match never {})
            .to_bytes();
        let (upstream, stream) = channel_body();
        let is_request = fields(&body).is_some_and(|message| message.contains_key("id"));
        let timed_out = is_request && std::mem::take(&mut *self.time_out_next.lock().unwrap());
        let response = if timed_out {
            // What tower-http's `TimeoutLayer` answers: an empty 408.
            let (_, empty) = channel_body();
            Response::builder()
                .status(StatusCode::REQUEST_TIMEOUT)
                .body(empty)
        } else if parts.method == Method::GET || is_request {
            Response::builder()
                .header(header::CONTENT_TYPE, "text/event-stream")
                .body(stream)
        } else {
            // Its writer dropped at once: an empty body.
            let (_, empty) = channel_body();
            Response::builder().status(StatusCode::ACCEPTED).body(empty)
        };
        self.received.lock().unwrap().push(Received {
            method: parts.method,
            body,
            upstream,
            timed_out,
        });
        ready(Ok(response.unwrap()))
    }
}

#[derive(Debug, Clone)]
enum Op {
    /// The client POSTs a request with `IDS[id]`; an eager client reads
    /// whatever arrives on it after every step, as real clients do.
    Post { id: usize, eager: bool },
    /// The client reads the n-th open POST body: everything that has
    /// arrived, or one frame.
    Read { n: usize, all: bool },
    /// The client drops the n-th open POST (body, or future still waiting
    /// under `Queue`): a disconnect, or its own timeout ran out.
    DropPost(usize),
    /// The client sends `notifications/cancelled` naming `IDS[id]`.
    Cancel(usize),
    /// The client opens the session's GET stream (dropping one it had):
    /// resumed with `Last-Event-ID` (the polling of SEP-1699, after a POST
    /// stream the server ended early), or the standalone stream.
    OpenGet { resume: bool, eager: bool },
    /// The client reads everything that has arrived on its GET stream.
    ReadGet,
    /// The client drops its GET stream.
    DropGet,
    /// The server sends a notification on the POST stream of the n-th
    /// request it runs whose POST stream is open.
    Notify(usize),
    /// The server answers the n-th request it runs whose POST stream is
    /// open, on that stream (a result, or a JSON-RPC error), and ends it.
    Answer { n: usize, error: bool },
    /// The server ends the POST stream of the n-th request it runs whose
    /// POST stream is open, after a priming event, without the response.
    EndEarly(usize),
    /// The POST stream of the n-th request the server runs whose POST stream
    /// is open fails mid-stream; the server may still run the request.
    Fail(usize),
    /// The server answers the n-th request it runs whose POST stream has
    /// ended, on the GET stream (the answer is lost if there is none).
    AnswerOnGet { n: usize, error: bool },
    /// A layer inside the guard (a timeout) answers the next POST with a
    /// request `408` in the server's place; the server runs it all the same,
    /// and may answer it later on a GET stream.
    TimeOutNext,
    /// The client resumes the POST stream of the n-th request answered on
    /// its own stream, from the event before its answer (a new GET stream
    /// with that `Last-Event-ID`), and the server replays the answer it
    /// already delivered.
    Replay(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..IDS.len(), any::<bool>()).prop_map(|(id, eager)| Op::Post { id, eager }),
        6 => (0..8usize, any::<bool>()).prop_map(|(n, all)| Op::Read { n, all }),
        1 => (0..8usize).prop_map(Op::DropPost),
        1 => (0..IDS.len()).prop_map(Op::Cancel),
        1 => (prop::bool::weighted(0.75), any::<bool>())
            .prop_map(|(resume, eager)| Op::OpenGet { resume, eager }),
        3 => Just(Op::ReadGet),
        1 => Just(Op::DropGet),
        1 => (0..8usize).prop_map(Op::Notify),
        3 => (0..8usize, prop::bool::weighted(0.25)).prop_map(|(n, error)| Op::Answer { n, error }),
        3 => (0..8usize).prop_map(Op::EndEarly),
        1 => (0..8usize).prop_map(Op::Fail),
        3 => (0..8usize, prop::bool::weighted(0.25))
            .prop_map(|(n, error)| Op::AnswerOnGet { n, error }),
        1 => Just(Op::TimeOutNext),
        2 => (0..8usize).prop_map(Op::Replay),
    ]
}

type GuardFuture = Pin<Box<mcp_id_guard::guard::GuardFuture<Scripted, Full<Bytes>>>>;
type GuardBody = Pin<Box<ResponseBody<InnerBody>>>;

/// The client's side of one POST.
enum ClientSide {
    /// Not answered by the guard yet (waiting for its id under `Queue`).
    Waiting(GuardFuture),
    /// Answered; the body is being read.
    Open {
        body: GuardBody,
        /// What was read so far.
        text: String,
        /// `application/json` (an answer of the guard's own) rather than SSE.
        json: bool,
    },
    /// Read to its end, failed, or dropped.
    Done,
}

/// One POST of the client.
struct Exchange {
    client_id: &'static str,
    /// The client reads it after every step.
    eager: bool,
    /// The request the server received for it.
    job: Option<usize>,
    client: ClientSide,
}

/// A request the server received.
struct Job {
    /// Its id as the server sees it (JSON text).
    server_id: String,
    exchange: usize,
    /// The server's end of its POST stream, while open.
    post: Option<Upstream>,
    /// The server has not answered it yet (on any stream).
    running: bool,
    /// Answered on its own POST stream: the id of the event before the
    /// answer (where a client resumes to have it replayed), and the answer.
    answered_on_post: Option<(u64, String)>,
}

/// The client's GET stream and the server's end of it.
struct GetStream {
    body: GuardBody,
    upstream: Upstream,
    text: String,
    /// The jobs the server answered on it, in order.
    answered: Vec<usize>,
    /// The client reads it after every step.
    eager: bool,
}

/// The collision key of an id's JSON text, as the guard compares ids: a
/// string's decoded text, an integer's decimal text (`1` == `"1"`).
fn key(raw: &str) -> String {
    serde_json::from_str::<String>(raw).unwrap_or_else(|_| raw.to_owned())
}

fn request_text(id: &str) -> String {
    format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"work"}}}}"#)
}

fn cancel_text(id: &str) -> String {
    format!(
        r#"{{"jsonrpc":"2.0","method":"notifications/cancelled","params":{{"requestId":{id}}}}}"#
    )
}

/// The server's answer to job `job` known by `server_id`, marked with the
/// job so the client can tell whose answer it read.
fn answer_text(server_id: &str, job: usize, error: bool) -> String {
    if error {
        format!(
            r#"{{"jsonrpc":"2.0","id":{server_id},"error":{{"code":-32000,"message":"failed","data":{{"job":{job}}}}}}}"#
        )
    } else {
        format!(r#"{{"jsonrpc":"2.0","id":{server_id},"result":{{"job":{job}}}}}"#)
    }
}

/// The job marked in a response the scripted server wrote.
fn job_of(response: &str) -> Option<usize> {
    let value: Value = serde_json::from_str(response).ok()?;
    let job = value
        .pointer("/result/job")
        .or_else(|| value.pointer("/error/data/job"))?;
    usize::try_from(job.as_u64()?).ok()
}

fn event(id: u64, data: &str) -> Chunk {
    Ok(Frame::data(Bytes::from(format!(
        "id: {id}\ndata: {data}\n\n"
    ))))
}

fn post(body: String) -> Request<Full<Bytes>> {
    Request::post("/mcp")
        .header("mcp-session-id", SESSION)
        .header("mcp-protocol-version", PROTOCOL_VERSION)
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::ACCEPT, ACCEPT)
        .body(Full::new(Bytes::from(body)))
        .unwrap()
}

/// Polls `body` once for a frame.
async fn poll_frame(body: &mut GuardBody) -> Poll<Option<Chunk>> {
    std::future::poll_fn(|cx| Poll::Ready(body.as_mut().poll_frame(cx))).await
}

/// What came of reading a body.
enum Read {
    /// Nothing more has arrived.
    Pending,
    /// The body ended (or failed).
    Ended,
}

/// Reads what has arrived on `body` into `text` (one frame unless `all`).
/// Where nothing more can arrive (`closed`: the server ended the stream), a
/// body that neither yields nor ends within [`HANG_TIMEOUT`] has hung.
async fn read_available(
    body: &mut GuardBody,
    text: &mut String,
    all: bool,
    closed: bool,
    what: &str,
) -> Read {
    loop {
        let polled = match poll_frame(body).await {
            Poll::Pending if closed => Poll::Ready(
                tokio::time::timeout(HANG_TIMEOUT, body.frame())
                    .await
                    .unwrap_or_else(|_| {
                        panic!("{what}: the server ended the stream, the client's body hung")
                    }),
            ),
            polled => polled,
        };
        match polled {
            Poll::Pending => return Read::Pending,
            Poll::Ready(None | Some(Err(_))) => return Read::Ended,
            Poll::Ready(Some(Ok(frame))) => {
                if let Ok(data) = frame.into_data() {
                    text.push_str(std::str::from_utf8(&data).expect("UTF-8"));
                }
                if !all {
                    return Read::Pending;
                }
            }
        }
    }
}

struct Harness {
    layer: IdGuardLayer,
    guard: IdGuard<Scripted>,
    server: Scripted,
    exchanges: Vec<Exchange>,
    jobs: Vec<Job>,
    get: Option<GetStream>,
    event_id: u64,
}

impl Harness {
    fn new(policy: OnDuplicate, rewrite_all_ids: bool) -> Self {
        // Nothing expires within a case: neither an abandoned id nor a wait
        // in the queue.
        let layer = IdGuardLayer::new()
            .on_duplicate(policy)
            .rewrite_all_ids(rewrite_all_ids)
            .abandoned_id_ttl(Duration::from_secs(3600))
            .max_queue_wait(Duration::from_secs(3600));
        let server = Scripted::default();
        Self {
            guard: layer.layer(server.clone()),
            layer,
            server,
            exchanges: Vec::new(),
            jobs: Vec::new(),
            get: None,
            event_id: 0,
        }
    }

    fn next_event_id(&mut self) -> u64 {
        self.event_id += 1;
        self.event_id
    }

    /// The n-th (modulo) index of `items` that `select` accepts.
    fn pick<T>(items: &[T], n: usize, select: impl Fn(&T) -> bool) -> Option<usize> {
        let matching: Vec<usize> = (0..items.len()).filter(|&i| select(&items[i])).collect();
        (!matching.is_empty()).then(|| matching[n % matching.len()])
    }

    /// Takes the requests the server received since the last look, for
    /// `exchange`, checking that none goes under an id the server still runs
    /// (check 1).
    fn receive(&mut self, exchange: Option<usize>) {
        for received in self.server.take() {
            assert_eq!(received.method, Method::POST, "a GET is taken by open_get");
            let Some(message) = fields(&received.body) else {
                panic!("the server received a body that is not one JSON object")
            };
            let Some(id) = message.get("id") else {
                continue; // a notification (the cancellation)
            };
            let server_id = id.get().to_owned();
            if let Some(running) = self
                .jobs
                .iter()
                .find(|job| job.running && key(&job.server_id) == key(&server_id))
            {
                panic!(
                    "the server received a request with id {server_id} while it still runs \
                     request {} (client id {}) under id {}",
                    running.exchange, self.exchanges[running.exchange].client_id, running.server_id
                );
            }
            let exchange = exchange.expect("a request reaches the server only through a POST");
            assert!(
                self.exchanges[exchange].job.is_none(),
                "one POST reached the server twice"
            );
            self.exchanges[exchange].job = Some(self.jobs.len());
            // A request answered by a layer in the server's place has no
            // stream from the server: it can only answer on a GET.
            let post = (!received.timed_out).then_some(received.upstream);
            self.jobs.push(Job {
                server_id,
                exchange,
                post,
                running: true,
                answered_on_post: None,
            });
        }
    }

    /// Polls the POSTs the guard has not answered yet: a POST the server was
    /// called for must be answered at once.
    async fn poll_waiting(&mut self) {
        for index in 0..self.exchanges.len() {
            let ClientSide::Waiting(future) = &mut self.exchanges[index].client else {
                continue;
            };
            let mut polled = futures::poll!(future.as_mut());
            let called = !self.server.received.lock().unwrap().is_empty();
            if called && polled.is_pending() {
                polled = Poll::Ready(
                    tokio::time::timeout(HANG_TIMEOUT, future.as_mut())
                        .await
                        .expect("the server answered at once, the guard's response hung"),
                );
            }
            self.receive(Some(index));
            let Poll::Ready(response) = polled else {
                continue;
            };
            let response = response.unwrap_or_else(|never| match never {});
            let json = response
                .headers()
                .get(header::CONTENT_TYPE)
                .is_some_and(|value| value.as_bytes().starts_with(b"application/json"));
            self.exchanges[index].client = ClientSide::Open {
                body: Box::pin(response.into_body()),
                text: String::new(),
                json,
            };
        }
    }

    async fn apply(&mut self, op: &Op) {
        match *op {
            Op::Post { id, eager } => {
                std::future::poll_fn(|cx| self.guard.poll_ready(cx))
                    .await
                    .unwrap_or_else(|never| match never {});
                let future = self.guard.call(post(request_text(IDS[id])));
                self.exchanges.push(Exchange {
                    client_id: IDS[id],
                    eager,
                    job: None,
                    client: ClientSide::Waiting(Box::pin(future)),
                });
            }
            Op::Read { n, all } => {
                let open = Self::pick(&self.exchanges, n, |exchange| {
                    matches!(exchange.client, ClientSide::Open { .. })
                });
                if let Some(index) = open {
                    self.read(index, all).await;
                }
            }
            Op::DropPost(n) => {
                let live = Self::pick(&self.exchanges, n, |exchange| {
                    !matches!(exchange.client, ClientSide::Done)
                });
                if let Some(index) = live {
                    self.exchanges[index].client = ClientSide::Done;
                }
            }
            Op::Cancel(id) => self.cancel(IDS[id]).await,
            Op::OpenGet { resume, eager } => {
                let from = resume.then_some(self.event_id);
                self.open_get(from, eager).await;
            }
            Op::ReadGet => self.read_get().await,
            Op::DropGet => self.get = None,
            Op::Notify(n) => {
                if let Some(job) = self.pick_running(n, true) {
                    let notification = r#"{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":"p","progress":1}}"#;
                    let event = event(self.next_event_id(), notification);
                    self.send_post(job, event);
                }
            }
            Op::Answer { n, error } => {
                if let Some(job) = self.pick_running(n, true) {
                    // A priming event first, as rmcp sends: where a client
                    // resuming the stream would have the answer replayed.
                    let primed = self.next_event_id();
                    self.send_post(job, event(primed, ""));
                    let answer = answer_text(&self.jobs[job].server_id, job, error);
                    let event = event(self.next_event_id(), &answer);
                    self.send_post(job, event);
                    self.jobs[job].post = None;
                    self.jobs[job].running = false;
                    self.jobs[job].answered_on_post = Some((primed, answer));
                }
            }
            Op::TimeOutNext => *self.server.time_out_next.lock().unwrap() = true,
            Op::Replay(n) => {
                let answered = Self::pick(&self.jobs, n, |job| job.answered_on_post.is_some());
                if let Some(job) = answered {
                    let (primed, answer) = self.jobs[job].answered_on_post.clone().unwrap();
                    self.open_get(Some(primed), false).await;
                    let event = event(self.next_event_id(), &answer);
                    let get = self.get.as_mut().expect("just opened");
                    if get.upstream.send(event).is_ok() {
                        get.answered.push(job);
                    }
                }
            }
            Op::EndEarly(n) => {
                if let Some(job) = self.pick_running(n, true) {
                    let priming = event(self.next_event_id(), "");
                    self.send_post(job, priming);
                    self.jobs[job].post = None;
                }
            }
            Op::Fail(n) => {
                if let Some(job) = self.pick_running(n, true) {
                    self.send_post(job, Err(Broken));
                    self.jobs[job].post = None;
                }
            }
            Op::AnswerOnGet { n, error } => {
                if let Some(job) = self.pick_running(n, false) {
                    let answer = answer_text(&self.jobs[job].server_id, job, error);
                    let event = event(self.next_event_id(), &answer);
                    if let Some(get) = &mut self.get {
                        if get.upstream.send(event).is_ok() {
                            get.answered.push(job);
                        }
                    }
                    self.jobs[job].running = false;
                }
            }
        }
        self.poll_waiting().await;
        for index in 0..self.exchanges.len() {
            let exchange = &self.exchanges[index];
            if exchange.eager && matches!(exchange.client, ClientSide::Open { .. }) {
                self.read(index, true).await;
            }
        }
        if self.get.as_ref().is_some_and(|get| get.eager) {
            self.read_get().await;
        }
    }

    /// A request the server still runs, whose POST stream is open (or has
    /// ended, when `open` is false).
    fn pick_running(&self, n: usize, open: bool) -> Option<usize> {
        Self::pick(&self.jobs, n, |job| {
            job.running && job.post.is_some() == open
        })
    }

    /// Writes on a job's POST stream; the client may have dropped it.
    fn send_post(&self, job: usize, chunk: Chunk) {
        let upstream = self.jobs[job].post.as_ref().expect("open POST stream");
        let _ = upstream.send(chunk);
    }

    /// Reads what has arrived on a POST; every response in it must be the
    /// answer to that POST, with the client's id (check 2).
    async fn read(&mut self, index: usize, all: bool) {
        let exchange = &mut self.exchanges[index];
        let client_id = exchange.client_id;
        let job = exchange.job;
        // No job: an answer of the guard's own, whole at once.
        let closed = job.is_none_or(|job| self.jobs[job].post.is_none());
        let ClientSide::Open { body, text, json } = &mut exchange.client else {
            unreachable!("picked an open POST")
        };
        let what = format!("POST {index} (client id {client_id})");
        let read = read_available(body, text, all, closed, &what).await;
        let responses = if *json {
            match read {
                Read::Ended => vec![text.clone()],
                Read::Pending => Vec::new(),
            }
        } else {
            sse::responses(text)
        };
        assert!(
            responses.len() <= 1,
            "{what}: more than one response: {responses:?}"
        );
        for response in &responses {
            let id = raw_id(response);
            assert_eq!(
                id.as_deref(),
                Some(client_id),
                "{what}: a response with an id the client did not send: {response}"
            );
            // The guard's own answers (a rejected duplicate) carry no job.
            if let Some(answered) = job_of(response) {
                assert_eq!(
                    Some(answered),
                    job,
                    "{what}: another request's answer: {response}"
                );
            }
        }
        if let Read::Ended = read {
            exchange.client = ClientSide::Done;
        }
    }

    async fn cancel(&mut self, id: &str) {
        std::future::poll_fn(|cx| self.guard.poll_ready(cx))
            .await
            .unwrap_or_else(|never| match never {});
        let response = tokio::time::timeout(HANG_TIMEOUT, self.guard.call(post(cancel_text(id))))
            .await
            .expect("a cancellation is answered at once")
            .unwrap_or_else(|never| match never {});
        assert_eq!(response.status(), StatusCode::ACCEPTED);
        self.receive(None);
    }

    /// Opens the GET stream, resumed from event `from` or standalone.
    async fn open_get(&mut self, from: Option<u64>, eager: bool) {
        self.get = None;
        std::future::poll_fn(|cx| self.guard.poll_ready(cx))
            .await
            .unwrap_or_else(|never| match never {});
        let mut request = Request::get("/mcp")
            .header("mcp-session-id", SESSION)
            .header("mcp-protocol-version", PROTOCOL_VERSION)
            .header(header::ACCEPT, "text/event-stream");
        if let Some(from) = from {
            request = request.header("last-event-id", from.to_string());
        }
        let request = request.body(Full::default()).unwrap();
        let response = tokio::time::timeout(HANG_TIMEOUT, self.guard.call(request))
            .await
            .expect("a GET is answered at once")
            .unwrap_or_else(|never| match never {});
        let mut received = self.server.take();
        assert_eq!(received.len(), 1, "the GET reached the server");
        let received = received.pop().unwrap();
        assert_eq!(received.method, Method::GET);
        self.get = Some(GetStream {
            body: Box::pin(response.into_body()),
            upstream: received.upstream,
            text: String::new(),
            answered: Vec::new(),
            eager,
        });
    }

    /// Reads what has arrived on the GET stream: every answer the server
    /// sent on it has arrived, each with the id its client sent (check 2).
    async fn read_get(&mut self) {
        let Some(get) = &mut self.get else {
            return;
        };
        let read = read_available(&mut get.body, &mut get.text, true, false, "GET").await;
        assert!(
            matches!(read, Read::Pending),
            "the GET stream ended while the server kept it open"
        );
        let responses = sse::responses(&get.text);
        let answered: Vec<Option<usize>> = responses.iter().map(|r| job_of(r)).collect();
        let expected: Vec<Option<usize>> = get.answered.iter().copied().map(Some).collect();
        assert_eq!(
            answered, expected,
            "the answers sent on the GET stream reach the client, in order: {responses:?}"
        );
        for (response, job) in responses.iter().zip(&get.answered) {
            let client_id = self.exchanges[self.jobs[*job].exchange].client_id;
            let id = raw_id(response).expect("an id");
            assert!(
                !is_server_side(&id) && id == client_id,
                "GET: the answer to a request sent with id {client_id} carries id {id}"
            );
        }
    }

    /// Drops everything on both sides; the guard must hold nothing then.
    async fn finish(mut self) {
        self.get = None;
        for exchange in &mut self.exchanges {
            exchange.client = ClientSide::Done;
        }
        for job in &mut self.jobs {
            job.post = None;
        }
        let stats = drained(&self.layer).await.unwrap_or_else(|error| {
            panic!("after every exchange was dropped nothing is in flight: {error}")
        });
        assert_eq!(stats.in_flight_requests, 0);
    }
}

fn run(policy: OnDuplicate, rewrite_all_ids: bool, ops: &[Op]) {
    // `Queue` arms a tokio timer while a request waits; the hang bounds are
    // tokio timeouts.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut harness = Harness::new(policy, rewrite_all_ids);
        for op in ops {
            harness.apply(op).await;
        }
        harness.finish().await;
    });
}

const POLICIES: [OnDuplicate; 3] = [OnDuplicate::Remap, OnDuplicate::Reject, OnDuplicate::Queue];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Whatever the client and the server do in one session, the server
    /// never receives a request under an id it still runs for another, every
    /// response the client reads carries the id it sent for that request,
    /// nothing hangs, and nothing stays in flight.
    #[test]
    fn the_server_never_sees_an_id_it_still_runs(
        policy in prop::sample::select(POLICIES.to_vec()),
        rewrite_all_ids in prop::bool::weighted(0.2),
        ops in prop::collection::vec(op(), 1..32),
    ) {
        run(policy, rewrite_all_ids, &ops);
    }
}

/// The minimal case the property found on aa55ee9, under every policy: the
/// server ends a POST stream early (it will answer on the GET stream), the
/// client reads that stream to its end, and sends the id again while the
/// server still runs the first request under it.
#[test]
fn an_id_whose_post_stream_ended_early_is_not_sent_again() {
    use Op::*;
    for policy in POLICIES {
        run(
            policy,
            false,
            &[
                Post {
                    id: 0,
                    eager: false,
                },
                EndEarly(0),
                Read { n: 0, all: true },
                Post {
                    id: 0,
                    eager: false,
                },
            ],
        );
    }
}

/// The same with `1` then `"1"` (one id for the guard, two for rmcp, one for
/// the Python SDK), and the server's late answer reaching the client on the
/// GET stream with the id it sent, while a newer request with the id runs.
#[test]
fn a_late_answer_on_the_get_stream_keeps_its_client_id() {
    use Op::*;
    for policy in POLICIES {
        run(
            policy,
            false,
            &[
                OpenGet {
                    resume: true,
                    eager: false,
                },
                Post {
                    id: 0,
                    eager: false,
                },
                EndEarly(0),
                Read { n: 0, all: true },
                Post {
                    id: 2,
                    eager: false,
                },
                AnswerOnGet { n: 0, error: false },
                ReadGet,
                Answer { n: 0, error: false },
                Read { n: 0, all: true },
                Post {
                    id: 0,
                    eager: false,
                },
                Answer { n: 0, error: true },
                Read { n: 0, all: true },
            ],
        );
    }
}

/// A late answer on the resumed GET stream to a request the guard remapped
/// (after its id was abandoned) carries a server-side id: restoring it must
/// not free the client's own id, which the server still runs for the first
/// request.
#[test]
fn a_restored_answer_on_the_get_stream_frees_nothing() {
    use Op::*;
    for policy in POLICIES {
        run(
            policy,
            false,
            &[
                OpenGet {
                    resume: true,
                    eager: false,
                },
                Post {
                    id: 0,
                    eager: false,
                },
                EndEarly(0),
                Read { n: 0, all: true },
                Post {
                    id: 2,
                    eager: false,
                },
                EndEarly(1),
                Read { n: 0, all: true },
                AnswerOnGet { n: 1, error: false },
                ReadGet,
                Post {
                    id: 0,
                    eager: false,
                },
            ],
        );
    }
}

/// A layer inside the guard answers `408` in the server's place (a timeout)
/// while the server runs the request: the client reads the 408 and sends
/// the id again, which must not reach the server as it is.
#[test]
fn a_timeout_inside_the_guard_does_not_free_the_id() {
    use Op::*;
    for policy in POLICIES {
        run(
            policy,
            false,
            &[
                TimeOutNext,
                Post {
                    id: 0,
                    eager: false,
                },
                Read { n: 0, all: true },
                Post {
                    id: 2,
                    eager: false,
                },
                AnswerOnGet { n: 0, error: false },
            ],
        );
    }
}

/// A (`1`) is answered on its own stream; B (`"1"`) is primed and its
/// stream ended early, so the server still runs B. The client resumes A's
/// stream and the server replays A's old answer: that is no answer to B,
/// and the next `1` must not reach the server as it is.
#[test]
fn a_replayed_answer_does_not_free_another_request() {
    use Op::*;
    for policy in POLICIES {
        run(
            policy,
            false,
            &[
                Post { id: 0, eager: true },
                Answer { n: 0, error: false },
                Post { id: 2, eager: true },
                EndEarly(0),
                Replay(0),
                ReadGet,
                Post { id: 0, eager: true },
            ],
        );
    }
}
