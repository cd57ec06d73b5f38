//! Fuzz target (a): arbitrary requests through [`IdGuard`] in front of a
//! recording echo service, driven by hand with a no-op waker.
//!
//! The fuzz input is a program: a guard configuration, then operations:
//! send a request (method, session id bytes, content type, protocol
//! version, `Content-Length`, body in arbitrary frames, maybe failing; the
//! body either JSON-RPC built from tricky ids or raw bytes), read a held
//! response to its end, drop a held response unread, or drop a queued
//! request. The echo answers each forwarded body at once with a JSON, SSE
//! or opaque response carrying the ids it saw (or fails), so every future
//! is ready when polled, except a duplicate queued under
//! [`OnDuplicate::Queue`] (its timer lives in a current-thread tokio
//! runtime that is entered but never driven: it never fires). Responses are
//! held unread, so their ids stay in flight and later requests collide.
//!
//! Invariants checked:
//! - no panic, and every request is answered by the guard or forwarded at
//!   once; only a lone duplicate under `Queue` waits, only while an earlier
//!   exchange with its id is open, and it goes as soon as none is;
//! - an untracked request reaches the inner service byte-identical (method,
//!   headers, body); a tracked body reaches it identical or changed only at
//!   request ids, each replaced by a fresh `"mcp-id-guard:..."` string that
//!   carries the exact original id text (and at `requestId` of a
//!   cancellation, named as the server knows that request); headers change
//!   only in `Content-Length` (the new length), `Transfer-Encoding` and
//!   `Accept-Encoding`;
//! - the inner service never sees, with the client's own id, a request whose
//!   id (by the documented equivalence) is in flight or shadowed in its
//!   session, or a reserved id, or two equal ids in one batch;
//! - the client's response is the echo's, byte for byte, except that each
//!   top-level response id is the client's exact original id text;
//! - the guard's own answers are exactly the documented ones (413, 400 for a
//!   failed body, 429 at the in-flight cap, `reject_status` for a duplicate
//!   under `Reject`), with the ids of the requests;
//! - `stats()` agrees with a model of the open exchanges after every step,
//!   and drains to nothing in flight and no session once all have ended.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::OnceLock;
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue};
use http::{HeaderMap, Method, Request, Response, StatusCode};
use http_body::{Body, Frame};
use mcp_id_guard::guard::{GuardRequestBody as RequestBody, GuardResponseBody as ResponseBody};
use mcp_id_guard::{IdGuard, IdGuardLayer, OnDuplicate};
use tower::{Layer, Service};

use super::input::{request_id_text as id_text, split_at_cuts, Input};
use super::oracle::{self, Kind};
use super::readings;
use super::KnownBug;

/// Runs the target's checks on one input. Panics on a violation; returns
/// the known bug an input shows, if any, unless it is still open
/// ([`KnownBug::is_open`]): a run goes on past those, so the fuzzer and
/// the regression tests look for other bugs meanwhile.
pub fn check(data: &[u8]) -> Result<(), KnownBug> {
    match check_all(data) {
        Err(bug) if bug.is_open() => Ok(()),
        other => other,
    }
}

/// Like [`check`], but returns open bugs too.
pub fn check_all(data: &[u8]) -> Result<(), KnownBug> {
    let runtime = runtime();
    let _context = runtime.enter();
    let mut input = Input::new(data);
    let mut harness = Harness::new(&mut input);
    if trace() {
        eprintln!("{:?}", harness.settings);
    }
    let mut steps = 0;
    while !input.is_empty() && steps < 32 {
        steps += 1;
        let op = input.below(10);
        if trace() {
            eprintln!(
                "op {op}: {} open, {} queued",
                harness.open.len(),
                harness.pending.len()
            );
        }
        match op {
            0..=5 => harness.send(&mut input)?,
            6 | 7 => {
                if !harness.open.is_empty() {
                    let index = input.below(harness.open.len());
                    harness.finish(index)?;
                }
            }
            8 => {
                if !harness.open.is_empty() {
                    let index = input.below(harness.open.len());
                    harness.drop_open(index);
                }
            }
            _ => {
                if !harness.pending.is_empty() {
                    let index = input.below(harness.pending.len());
                    harness.drop_pending(index);
                }
            }
        }
        harness.poll_pending()?;
        harness.check_stats();
    }
    harness.drain()
}

/// Whether to print each step (`FUZZ_TRACE=1`), to read a crash input.
fn trace() -> bool {
    static TRACE: OnceLock<bool> = OnceLock::new();
    *TRACE.get_or_init(|| std::env::var_os("FUZZ_TRACE").is_some())
}

fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("a current-thread runtime")
    })
}

/// The error of a failing body or inner service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Failure;

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("failure")
    }
}

impl std::error::Error for Failure {}

/// A body that is ready at once: its frames, then maybe an error.
#[derive(Debug, Default)]
pub struct Chunks {
    frames: VecDeque<Frame<Bytes>>,
    fail_at_end: bool,
}

impl Chunks {
    fn new(pieces: Vec<&[u8]>, trailers: Option<HeaderMap>, fail_at_end: bool) -> Self {
        let mut frames: VecDeque<Frame<Bytes>> = pieces
            .into_iter()
            .map(|piece| Frame::data(Bytes::copy_from_slice(piece)))
            .collect();
        if let Some(trailers) = trailers {
            frames.push_back(Frame::trailers(trailers));
        }
        Self {
            frames,
            fail_at_end,
        }
    }
}

impl Body for Chunks {
    type Data = Bytes;
    type Error = Failure;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Failure>>> {
        if let Some(frame) = self.frames.pop_front() {
            return Poll::Ready(Some(Ok(frame)));
        }
        if std::mem::take(&mut self.fail_at_end) {
            return Poll::Ready(Some(Err(Failure)));
        }
        Poll::Ready(None)
    }

    fn is_end_stream(&self) -> bool {
        self.frames.is_empty() && !self.fail_at_end
    }
}

/// Reads a body that must be ready at once: its data and whether it failed.
fn read_now<B: Body<Data = Bytes> + Unpin>(body: &mut B) -> (Vec<u8>, bool) {
    let mut cx = Context::from_waker(Waker::noop());
    let mut data = Vec::new();
    for _ in 0..100_000 {
        match Pin::new(&mut *body).poll_frame(&mut cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Ok(chunk) = frame.into_data() {
                    data.extend_from_slice(&chunk);
                }
            }
            Poll::Ready(Some(Err(_))) => return (data, true),
            Poll::Ready(None) => return (data, false),
            Poll::Pending => panic!("a body whose data is all there returned Pending"),
        }
    }
    panic!("a body never ended");
}

/// Where the echo puts a top-level response id.
#[derive(Debug, Clone)]
enum Piece {
    Text(Vec<u8>),
    /// The id of the n-th request of the body it answers.
    Id(usize),
}

fn render(template: &[Piece], ids: &[String]) -> Vec<u8> {
    let mut out = Vec::new();
    for piece in template {
        match piece {
            Piece::Text(text) => out.extend_from_slice(text),
            Piece::Id(index) => out.extend_from_slice(ids[*index].as_bytes()),
        }
    }
    out
}

/// How the echo answers one request (chosen by the fuzz input, looked up by
/// the request's `x-fuzz-serial` header).
#[derive(Debug, Clone)]
struct Plan {
    format: Format,
    /// Use the content type with parameters and odd case.
    fancy_content_type: bool,
    line_end: &'static str,
    split_data: bool,
    priming: bool,
    extras: bool,
    batch_in_one_event: bool,
    cuts: Vec<u8>,
    body_error: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    Json,
    Sse,
    Opaque,
    Fail,
}

/// The echo's answer: its template, the request ids it saw, and the ids as
/// it wrote them.
#[derive(Debug)]
struct Answer {
    template: Vec<Piece>,
    seen: Vec<String>,
    written: Vec<String>,
}

/// One request the echo received.
#[derive(Debug)]
struct Forwarded {
    method: Method,
    headers: HeaderMap,
    /// The body, `Err` when reading it failed.
    body: Result<Vec<u8>, Failure>,
    /// The echo's answer, if it answered with a body carrying ids.
    answer: Option<Answer>,
    format: Format,
    content_type: Option<&'static str>,
    status: StatusCode,
}

type Log = Rc<RefCell<HashMap<u64, Forwarded>>>;
type Plans = Rc<RefCell<HashMap<u64, Plan>>>;

/// The recording echo.
#[derive(Clone)]
pub struct Echo {
    log: Log,
    plans: Plans,
}

impl Service<Request<RequestBody<Chunks>>> for Echo {
    type Response = Response<Chunks>;
    type Error = Failure;
    type Future = std::future::Ready<Result<Response<Chunks>, Failure>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Failure>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<RequestBody<Chunks>>) -> Self::Future {
        let (parts, mut body) = request.into_parts();
        let serial: u64 = parts
            .headers
            .get("x-fuzz-serial")
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.parse().ok())
            .expect("every request carries its serial");
        let plan = self.plans.borrow()[&serial].clone();
        let (data, failed) = read_now(&mut body);
        let mut forwarded = Forwarded {
            method: parts.method,
            headers: parts.headers,
            body: if failed { Err(Failure) } else { Ok(data) },
            answer: None,
            format: plan.format,
            content_type: None,
            status: StatusCode::ACCEPTED,
        };
        let response = answer(&plan, &mut forwarded);
        let previous = self.log.borrow_mut().insert(serial, forwarded);
        assert!(previous.is_none(), "the inner service was called twice");
        std::future::ready(response)
    }
}

/// The echo's answer to a forwarded request, recorded in `forwarded`.
fn answer(plan: &Plan, forwarded: &mut Forwarded) -> Result<Response<Chunks>, Failure> {
    let ids: Vec<String> = match &forwarded.body {
        Ok(body) => match oracle::read(body, oracle::Writer::Client) {
            Some(parsed) => parsed
                .request_ids()
                .into_iter()
                .map(|range| String::from_utf8_lossy(&body[range]).into_owned())
                .collect(),
            None => Vec::new(),
        },
        Err(_) => Vec::new(),
    };
    let is_batch = match &forwarded.body {
        Ok(body) => {
            oracle::read(body, oracle::Writer::Client).is_some_and(|parsed| parsed.is_batch())
        }
        Err(_) => false,
    };
    if plan.format == Format::Fail {
        return Err(Failure);
    }
    if ids.is_empty() {
        return Ok(Response::builder()
            .status(StatusCode::ACCEPTED)
            .body(Chunks::default())
            .expect("a response"));
    }
    // A real server writes ids compactly; a raw line break (JSON whitespace
    // in a non-scalar id) would end an SSE data line, so the echo writes
    // it as a space there.
    let seen = ids;
    let ids: Vec<String> = if matches!(plan.format, Format::Sse) {
        seen.iter()
            .map(|id| id.replace(['\r', '\n'], " "))
            .collect()
    } else {
        seen.clone()
    };
    let text = |text: &str| Piece::Text(text.as_bytes().to_vec());
    let result = |index: usize| -> Vec<Piece> {
        vec![
            text("{\"jsonrpc\":\"2.0\","),
            text("\"id\":"),
            Piece::Id(index),
            text(&format!(",\"result\":{{\"seen\":{}}}}}", ids[index])),
        ]
    };
    let mut template = Vec::new();
    let content_type = match plan.format {
        Format::Json | Format::Opaque => {
            if is_batch {
                template.push(text("["));
            }
            for index in 0..ids.len() {
                if index > 0 {
                    template.push(text(","));
                }
                template.extend(result(index));
            }
            if is_batch {
                template.push(text("]"));
            }
            match (plan.format, plan.fancy_content_type) {
                (Format::Opaque, _) => "application/octet-stream",
                (_, false) => "application/json",
                (_, true) => "Application/JSON; charset=utf-8",
            }
        }
        _ => {
            let end = plan.line_end;
            if plan.priming {
                template.push(text(&format!("id: 0{end}data:{end}{end}")));
            }
            if plan.extras {
                // A server request carrying the same id (not a response),
                // and a response in an event of another type: restored all
                // the same (the rewriter cannot know an event's type before
                // its data passes: a later `event:` line may make it a
                // `message`).
                template.push(text(&format!(
                    ": ping{end}{end}data: {{\"jsonrpc\":\"2.0\",\"id\":{0},\"method\":\"ping\"}}{end}{end}event: other{end}data: {{\"id\":",
                    ids[0]
                )));
                template.push(Piece::Id(0));
                template.push(text(&format!(",\"result\":{{}}}}{end}{end}")));
            }
            let data_break = if plan.split_data {
                format!("{end}data: ")
            } else {
                String::new()
            };
            let event = |template: &mut Vec<Piece>, members: &[usize], array: bool| {
                template.push(text("event: message"));
                template.push(text(end));
                template.push(text("data: "));
                if array {
                    template.push(text("["));
                }
                for (position, index) in members.iter().enumerate() {
                    if position > 0 {
                        template.push(text(","));
                    }
                    template.push(text("{\"jsonrpc\":\"2.0\","));
                    template.push(text(&data_break));
                    template.push(text("\"id\":"));
                    template.push(Piece::Id(*index));
                    template.push(text(&format!(
                        ",{data_break}\"result\":{{\"seen\":{}}}}}",
                        ids[*index]
                    )));
                }
                if array {
                    template.push(text("]"));
                }
                template.push(text(end));
                template.push(text(end));
            };
            let all: Vec<usize> = (0..ids.len()).collect();
            if is_batch && plan.batch_in_one_event {
                event(&mut template, &all, true);
            } else {
                for index in all {
                    event(&mut template, &[index], false);
                }
            }
            if plan.fancy_content_type {
                "Text/Event-Stream; charset=utf-8"
            } else {
                "text/event-stream"
            }
        }
    };
    let bytes = render(&template, &ids);
    let cuts: Vec<usize> = plan
        .cuts
        .iter()
        .map(|cut| usize::from(*cut) * bytes.len() / 256)
        .collect();
    let pieces = split_at_cuts(&bytes, &cuts);
    forwarded.answer = Some(Answer {
        template,
        seen,
        written: ids,
    });
    forwarded.content_type = Some(content_type);
    forwarded.status = StatusCode::OK;
    Ok(Response::builder()
        .header("content-type", content_type)
        .body(Chunks::new(pieces, None, plan.body_error))
        .expect("a response"))
}

/// Guard settings chosen by the fuzz input.
#[derive(Debug, Clone, Copy)]
struct Settings {
    policy: OnDuplicate,
    rewrite_all: bool,
    shadows: bool,
    max_body: usize,
    cap: usize,
    reject_status: StatusCode,
}

/// A request as the client sent it, and what the oracle reads in it.
#[derive(Debug, Clone)]
struct Sent {
    serial: u64,
    method: Method,
    headers: HeaderMap,
    body: Vec<u8>,
    /// The body without a leading UTF-8 byte order mark (one dropped): what
    /// the guard reads, and forwards.
    stripped: Vec<u8>,
    /// More than one `Mcp-Session-Id` header.
    several_sessions: bool,
    /// In a session, with a `Connection` header that names a header the
    /// guard's layers read: a proxy on the way would drop it, so the guard
    /// refuses the request, whatever its method.
    hides: bool,
    /// In a session, an `Mcp-Session-Id` with a byte outside visible ASCII
    /// (HTTP/1.1 parsers strip spaces and tabs at its ends, HTTP/2 keeps
    /// them): refused, whatever the method.
    odd_session: bool,
    frames: Vec<usize>,
    body_error: bool,
    /// The session (the first header's), when the request is in a legacy
    /// session.
    session: Option<Vec<u8>>,
    /// Read by the guard (a POST in a legacy session, whatever its content
    /// type).
    tracked: bool,
    parsed: Option<oracle::Body>,
    /// The request ids' JSON text, in order.
    originals: Vec<String>,
    /// The collision keys of the cancellations' `requestId`s.
    cancels: Vec<String>,
}

impl Sent {
    fn keys(&self) -> Vec<String> {
        self.originals
            .iter()
            .map(|raw| oracle::id_key(raw))
            .collect()
    }

    fn is_batch(&self) -> bool {
        self.parsed.as_ref().is_some_and(oracle::Body::is_batch)
    }
}

/// One registered request of an exchange: its key, and whether the inner
/// service knows it by the client's own id.
#[derive(Debug, Clone)]
struct Entry {
    key: String,
    as_is: bool,
}

/// A forwarded exchange whose response is held unread.
struct Open {
    sent: Sent,
    entries: Vec<Entry>,
    response: Response<ResponseBody<Chunks>>,
    expected: Vec<u8>,
    planned_error: bool,
}

type GuardFuture = <IdGuard<Echo> as Service<Request<Chunks>>>::Future;

/// A request waiting under `Queue`.
struct Pending {
    sent: Sent,
    future: Pin<Box<GuardFuture>>,
}

struct Harness {
    settings: Settings,
    layer: IdGuardLayer,
    service: IdGuard<Echo>,
    log: Log,
    plans: Plans,
    serial: u64,
    open: Vec<Open>,
    pending: Vec<Pending>,
    /// Ids the inner service may still answer though their exchange ended
    /// (dropped unread, inner failure): (session, key) → count. A lower
    /// bound: cancelled exchanges are left out.
    shadows: HashMap<(Vec<u8>, String), usize>,
    /// Sessions and keys any cancellation has named.
    cancelled: HashSet<(Vec<u8>, String)>,
    /// Every server-side id minted so far, with the session it was minted
    /// for: only there is it restored (an id is bound to its session).
    minted: HashMap<String, Vec<u8>>,
    /// Every id the inner service saw, per session.
    server_ids: HashMap<Vec<u8>, Vec<String>>,
    passed: u64,
    remapped: u64,
    rejected: u64,
    queued: u64,
}

const SESSIONS: &[&[u8]] = &[b"session-a", b"session-b", b"", b"session-a\t", b"\x80\xff"];
const CONTENT_TYPES: &[&str] = &[
    "application/json",
    "Application/JSON; charset=utf-8",
    " application/json ;",
    "application/json-seq",
    "text/plain",
    "application/x-www-form-urlencoded",
    // Lists and look-alikes a loose check takes for JSON (the Python SDK's).
    "application/json, text/plain",
    "text/plain, application/json",
    "application/json-rpc",
    "text/plain; charset=utf-8",
];
const VERSIONS: &[&str] = &[
    "2025-06-18",
    "2025-11-25",
    "2026-07-28",
    "2027-01-01",
    "2026-07-2",
    "2026-07-28x",
    "draft",
];
const METHODS: &[&str] = &["tools/call", "ping", "hold", "notifications/cancelled"];

impl Harness {
    fn new(input: &mut Input<'_>) -> Self {
        let settings = Settings {
            policy: input.pick(&[OnDuplicate::Remap, OnDuplicate::Reject, OnDuplicate::Queue]),
            rewrite_all: input.below(4) == 0,
            shadows: input.below(4) != 0,
            max_body: input.pick(&[4 * 1024 * 1024, 16, 64, 200]),
            cap: input.pick(&[1024, 1, 2, 3]),
            reject_status: input.pick(&[StatusCode::BAD_REQUEST, StatusCode::CONFLICT]),
        };
        let mut layer = IdGuardLayer::new()
            .on_duplicate(settings.policy)
            .rewrite_all_ids(settings.rewrite_all)
            .max_body_bytes(settings.max_body)
            .max_in_flight_per_session(settings.cap)
            .reject_status(settings.reject_status);
        if !settings.shadows {
            layer = layer.abandoned_id_ttl(std::time::Duration::ZERO);
        }
        let log = Log::default();
        let plans = Plans::default();
        let service = layer.layer(Echo {
            log: Rc::clone(&log),
            plans: Rc::clone(&plans),
        });
        Self {
            settings,
            layer,
            service,
            log,
            plans,
            serial: 0,
            open: Vec::new(),
            pending: Vec::new(),
            shadows: HashMap::new(),
            cancelled: HashSet::new(),
            minted: HashMap::new(),
            server_ids: HashMap::new(),
            passed: 0,
            remapped: 0,
            rejected: 0,
            queued: 0,
        }
    }

    /// Builds a request from fuzz choices, sends it, and handles the answer.
    fn send(&mut self, input: &mut Input<'_>) -> Result<(), KnownBug> {
        self.serial += 1;
        let serial = self.serial;
        let (request, sent) = build_request(input, serial);
        let plan = Plan {
            format: input.pick(&[
                Format::Json,
                Format::Json,
                Format::Sse,
                Format::Sse,
                Format::Opaque,
                Format::Fail,
            ]),
            fancy_content_type: input.flag(),
            line_end: input.pick(&["\n", "\r\n", "\r"]),
            split_data: input.flag(),
            priming: input.flag(),
            extras: input.flag(),
            batch_in_one_event: input.flag(),
            cuts: (0..input.below(4)).map(|_| input.byte()).collect(),
            body_error: input.below(8) == 0,
        };
        if trace() {
            eprintln!(
                "send #{serial}: {:?} {:?} {:?} {:?}",
                sent.method,
                sent.headers,
                String::from_utf8_lossy(&sent.body),
                plan
            );
        }
        self.plans.borrow_mut().insert(serial, plan);
        let mut cx = Context::from_waker(Waker::noop());
        assert!(
            self.service.poll_ready(&mut cx).is_ready(),
            "the guard is ready when its inner service is"
        );
        let mut future = Box::pin(self.service.call(request));
        match future.as_mut().poll(&mut cx) {
            Poll::Ready(result) => self.arrived(sent, result, false),
            Poll::Pending => {
                self.check_may_wait(&sent);
                self.queued += 1;
                self.pending.push(Pending { sent, future });
                Ok(())
            }
        }
    }

    /// In flight in a session: requests of open exchanges and queued ones.
    fn in_flight(&self, session: &[u8]) -> usize {
        let open: usize = self
            .open
            .iter()
            .filter(|open| open.sent.session.as_deref() == Some(session))
            .map(|open| open.entries.len())
            .sum();
        let queued = self
            .pending
            .iter()
            .filter(|pending| pending.sent.session.as_deref() == Some(session))
            .count();
        open + queued
    }

    /// Whether the key may be taken for the policy in the session: an open
    /// exchange holds it (an upper bound of the live requests), or a request
    /// waits for it.
    fn may_be_taken(&self, session: &[u8], key: &str) -> bool {
        self.held_open(session, key) || self.waiting(session, key, usize::MAX)
    }

    /// Whether an open exchange of the session has a request with the key,
    /// with the client's id or remapped (under `Reject` and `Queue` a live
    /// remapped request holds the id too).
    fn held_open(&self, session: &[u8], key: &str) -> bool {
        self.open.iter().any(|open| {
            open.sent.session.as_deref() == Some(session)
                && open.entries.iter().any(|entry| entry.key == key)
        })
    }

    /// Whether a request before `before` (in arrival order) waits for the key.
    fn waiting(&self, session: &[u8], key: &str, before: usize) -> bool {
        self.pending.iter().take(before).any(|pending| {
            pending.sent.session.as_deref() == Some(session) && pending.sent.keys()[0] == key
        })
    }

    /// Whether the key is surely taken: an open exchange knows it by the
    /// client's own id and nothing ever cancelled that key in the session.
    fn surely_taken(&self, session: &[u8], key: &str) -> bool {
        !self.cancelled.contains(&(session.to_vec(), key.to_owned()))
            && self.open.iter().any(|open| {
                open.sent.session.as_deref() == Some(session)
                    && open
                        .entries
                        .iter()
                        .any(|entry| entry.key == key && entry.as_is)
            })
    }

    /// Whether the inner service may still answer this id as the client
    /// sent it: an open exchange or a sure shadow holds it.
    fn occupied(&self, session: &[u8], key: &str) -> bool {
        let open = self.open.iter().any(|open| {
            open.sent.session.as_deref() == Some(session)
                && open
                    .entries
                    .iter()
                    .any(|entry| entry.key == key && entry.as_is)
        });
        open || self
            .shadows
            .get(&(session.to_vec(), key.to_owned()))
            .is_some_and(|count| *count > 0)
    }

    /// The size the guard refuses before reading, or while reading.
    fn too_large(&self, sent: &Sent) -> Option<&'static str> {
        let declared = sent
            .headers
            .get("content-length")
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.parse::<u64>().ok());
        if declared.is_some_and(|length| length > self.settings.max_body as u64) {
            return Some("413");
        }
        let mut total = 0;
        for (index, end) in sent.frames.iter().enumerate() {
            let start = if index == 0 {
                0
            } else {
                sent.frames[index - 1]
            };
            total += end - start;
            if total > self.settings.max_body {
                return Some("413");
            }
        }
        if sent.body_error {
            return Some("400");
        }
        None
    }

    /// A request the guard made wait: only a lone request under `Queue`
    /// whose id may be taken.
    fn check_may_wait(&self, sent: &Sent) {
        assert_eq!(
            self.settings.policy,
            OnDuplicate::Queue,
            "only Queue makes a request wait"
        );
        assert!(sent.tracked && !sent.is_batch() && sent.originals.len() == 1);
        let session = sent.session.as_deref().expect("tracked");
        assert!(
            self.may_be_taken(session, &sent.keys()[0]),
            "a request waits though no exchange holds its id"
        );
    }

    /// Handles the answer to a request: the guard's own, or the echo's.
    fn arrived(
        &mut self,
        sent: Sent,
        result: Result<Response<ResponseBody<Chunks>>, Failure>,
        was_queued: bool,
    ) -> Result<(), KnownBug> {
        let forwarded = self.log.borrow_mut().remove(&sent.serial);
        let Some(forwarded) = forwarded else {
            let mut response = result.expect("the guard's own answers are responses");
            self.check_guard_answer(&sent, &mut response);
            return Ok(());
        };
        let entries = self.check_forwarded(&sent, &forwarded, was_queued)?;
        let response = match result {
            Ok(response) => response,
            Err(Failure) => {
                assert_eq!(forwarded.format, Format::Fail, "only the echo fails");
                self.ended(&sent, &entries, End::InnerFailed);
                return Ok(());
            }
        };
        assert_eq!(response.status(), forwarded.status, "the echo's status");
        let expected = self.expected_answer(&sent, &forwarded)?;
        // Only a body with content fails (a 202 has none).
        let planned_error =
            self.plans.borrow()[&sent.serial].body_error && forwarded.answer.is_some();
        if entries.is_empty() {
            // Nothing registered: read it now.
            let open = Open {
                sent,
                entries,
                response,
                expected,
                planned_error,
            };
            return check_read(open).map(|_| ());
        }
        self.open.push(Open {
            sent,
            entries,
            response,
            expected,
            planned_error,
        });
        Ok(())
    }

    /// The guard answered by itself: it must be one of the documented
    /// answers, for a reason the model agrees with.
    fn check_guard_answer(&mut self, sent: &Sent, response: &mut Response<ResponseBody<Chunks>>) {
        assert!(
            sent.tracked || sent.hides || sent.odd_session,
            "the guard answered a request it does not track: {sent:?}"
        );
        let status = response.status();
        assert_eq!(response.headers()["content-type"], "application/json");
        let (body, failed) = read_now(response.body_mut());
        assert!(!failed);
        let is_array = body.first() == Some(&b'[');
        let messages = guard_messages(&body);
        let errors = guard_errors(&body);
        let ids: Vec<&str> = errors.iter().map(|(id, _)| id.as_str()).collect();
        if sent.hides {
            assert_eq!(status, StatusCode::BAD_REQUEST, "Connection");
            assert_eq!(errors, [("null".to_owned(), -32600)]);
            assert!(messages[0].contains("Connection"), "{messages:?}");
            return;
        }
        if sent.odd_session {
            assert_eq!(status, StatusCode::BAD_REQUEST, "odd session id");
            assert_eq!(errors, [("null".to_owned(), -32600)]);
            assert!(messages[0].contains("visible ASCII"), "{messages:?}");
            return;
        }
        if let Some(reason) = self.too_large(sent) {
            let expected = if reason == "413" {
                StatusCode::PAYLOAD_TOO_LARGE
            } else {
                StatusCode::BAD_REQUEST
            };
            assert_eq!(status, expected, "{sent:?}");
            assert_eq!(errors, [("null".to_owned(), -32600)]);
            return;
        }
        if sent.several_sessions {
            assert_eq!(status, StatusCode::BAD_REQUEST, "several sessions");
            assert_eq!(errors, [("null".to_owned(), -32600)]);
            assert!(messages[0].contains("Mcp-Session-Id"), "{messages:?}");
            return;
        }
        let compressed = sent
            .headers
            .get_all(http::header::CONTENT_ENCODING)
            .iter()
            .any(|value| {
                !value
                    .as_bytes()
                    .trim_ascii()
                    .eq_ignore_ascii_case(b"identity")
            });
        if compressed {
            // A server that inflates request bodies reads what the guard
            // cannot see (formerly `CompressedBodyForwardedUntracked`).
            assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE, "compressed");
            assert_eq!(errors, [("null".to_owned(), -32600)]);
            assert!(messages[0].contains("compressed"), "{messages:?}");
            return;
        }
        if is_wide(&sent.stripped) {
            assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE, "UTF-16/32");
            assert_eq!(errors, [("null".to_owned(), -32700)]);
            return;
        }
        if sent.stripped.starts_with(b"\xEF\xBB\xBF") {
            // A second byte order mark: refused as not JSON (formerly
            // `SecondBomForwardedUntracked`).
            assert_eq!(status, StatusCode::BAD_REQUEST, "a second byte order mark");
            assert_eq!(errors, [("null".to_owned(), -32700)]);
            return;
        }
        if sent.parsed.is_none() {
            // The guard would not read the body: it must be one of its
            // fail-closed answers, for a reason the body has.
            check_unreadable_answer(sent, status, &errors, &messages[0]);
            return;
        }
        let session = sent.session.clone().expect("tracked");
        let keys = sent.keys();
        assert!(
            !keys.is_empty(),
            "the guard answered a body without requests"
        );
        let expected_ids: Vec<&str> = sent.originals.iter().map(String::as_str).collect();
        assert_eq!(is_array, sent.is_batch(), "a batch gets an array");
        assert_eq!(ids, expected_ids, "the guard's answer carries the ids");
        let over = self.in_flight(&session) + keys.len() > self.settings.cap;
        if status == StatusCode::TOO_MANY_REQUESTS {
            assert!(over, "429 below the cap");
            assert!(errors.iter().all(|(_, code)| *code == -32000));
            self.rejected += keys.len() as u64;
            return;
        }
        assert!(!over, "over the cap but not 429 (got {status})");
        assert_eq!(status, self.settings.reject_status, "unexpected status");
        assert!(errors.iter().all(|(_, code)| *code == -32600));
        assert!(
            self.settings.policy == OnDuplicate::Reject
                || (self.settings.policy == OnDuplicate::Queue && sent.is_batch()),
            "a duplicate refused under {:?}",
            self.settings.policy
        );
        let collides = keys
            .iter()
            .enumerate()
            .any(|(index, key)| keys[..index].contains(key) || self.may_be_taken(&session, key));
        assert!(collides, "refused without a collision: {sent:?}");
        self.rejected += keys.len() as u64;
    }

    /// The request reached the inner service: check what it saw, and
    /// register its requests in the model.
    /// A queued request counts in `queued_total` only, whichever id it
    /// goes with.
    fn check_forwarded(
        &mut self,
        sent: &Sent,
        forwarded: &Forwarded,
        was_queued: bool,
    ) -> Result<Vec<Entry>, KnownBug> {
        assert_eq!(forwarded.method, sent.method);
        assert!(
            !sent.hides && !sent.odd_session,
            "a request whose Connection hides a header the guard read, or whose session id a \
             later parser reads otherwise, was forwarded: {sent:?}"
        );
        if !sent.tracked {
            // A GET stream in a legacy session is asked for uncompressed, so
            // it can be restored.
            let mut headers = sent.headers.clone();
            if sent.method == Method::GET && sent.session.is_some() {
                headers.remove("accept-encoding");
            }
            assert_eq!(
                forwarded.headers, headers,
                "untracked: same headers: {sent:?}"
            );
            match &forwarded.body {
                Ok(body) => {
                    assert!(!sent.body_error);
                    assert_eq!(body, &sent.body, "untracked: byte-identical body");
                }
                Err(_) => assert!(sent.body_error),
            }
            return Ok(Vec::new());
        }
        assert!(
            self.too_large(sent).is_none(),
            "a body the guard must refuse was forwarded"
        );
        assert!(
            !sent.several_sessions,
            "a request naming several sessions was forwarded"
        );
        assert!(!is_wide(&sent.stripped), "a UTF-16/32 body was forwarded");
        let session = sent.session.clone().expect("tracked");
        let body = forwarded
            .body
            .as_ref()
            .expect("a tracked body is handed on buffered");
        let keys = sent.keys();
        if !keys.is_empty() {
            assert!(
                self.in_flight(&session) + keys.len() <= self.settings.cap,
                "over the cap but forwarded"
            );
        }
        let alignment = self.align(sent, body, &session)?;
        // Headers: only the length, transfer and content encodings change.
        let changed = ["content-length", "transfer-encoding", "accept-encoding"];
        for name in sent.headers.keys().chain(forwarded.headers.keys()) {
            if !changed.contains(&name.as_str()) {
                let sent_values: Vec<_> = sent.headers.get_all(name).iter().collect();
                let forwarded_values: Vec<_> = forwarded.headers.get_all(name).iter().collect();
                assert_eq!(forwarded_values, sent_values, "header {name}");
            }
        }
        if body != &sent.body {
            assert_eq!(
                forwarded.headers["content-length"],
                body.len().to_string(),
                "Content-Length follows the rewritten body"
            );
            assert!(!forwarded.headers.contains_key("transfer-encoding"));
        } else {
            assert_eq!(
                forwarded.headers.get("content-length"),
                sent.headers.get("content-length")
            );
        }
        if alignment.remapped > 0 {
            assert!(
                !forwarded.headers.contains_key("accept-encoding"),
                "a response to restore is asked for uncompressed"
            );
        }
        // The inner service never sees a client id that may still be
        // answered in the session, a reserved one, or one twice in a batch.
        let mut as_is_keys = HashSet::new();
        let mut entries = Vec::new();
        for (index, key) in keys.iter().enumerate() {
            let as_is = alignment.as_is[index];
            if as_is {
                assert!(
                    !self.settings.rewrite_all,
                    "rewrite_all_ids forwarded a client id"
                );
                if was_queued && oracle::is_reserved(&sent.originals[index]) {
                    return Err(KnownBug::QueuedReservedIdForwardedAsIs);
                }
                assert!(
                    !oracle::is_reserved(&sent.originals[index]),
                    "a reserved client id was forwarded as is"
                );
                assert!(
                    !self.occupied(&session, key),
                    "id {} forwarded as is while the server may still answer it in the session",
                    sent.originals[index]
                );
                assert!(as_is_keys.insert(key.clone()), "two equal ids in one batch");
                self.passed += u64::from(!was_queued);
            } else {
                self.remapped += u64::from(!was_queued);
            }
            if self.settings.policy == OnDuplicate::Reject
                && !sent.is_batch()
                && self.surely_taken(&session, key)
            {
                panic!("a duplicate was forwarded under Reject: {sent:?}");
            }
            entries.push(Entry {
                key: key.clone(),
                as_is,
            });
        }
        check_server_readings(sent, body, &entries, &alignment)?;
        for key in &sent.cancels {
            self.cancelled.insert((session.clone(), key.clone()));
        }
        self.server_ids
            .entry(session)
            .or_default()
            .extend(alignment.server_ids);
        Ok(entries)
    }

    /// Walks the forwarded body against the sent one: identical except at
    /// request ids (a fresh server-side id carrying the original) and at
    /// cancellations' `requestId` (an id the session's server saw).
    fn align(
        &mut self,
        sent: &Sent,
        forwarded: &[u8],
        session: &[u8],
    ) -> Result<Alignment, KnownBug> {
        let mut sites: Vec<(std::ops::Range<usize>, bool)> = Vec::new();
        if let Some(parsed) = &sent.parsed {
            for message in parsed.messages() {
                if message.kind == Kind::Request {
                    sites.extend(message.id.clone().map(|range| (range, true)));
                }
                sites.extend(message.cancels.clone().map(|range| (range, false)));
            }
        }
        sites.sort_by_key(|(range, _)| range.start);
        let mut alignment = Alignment::default();
        let mut renamed = Vec::new();
        let (mut cursor_in, mut cursor_out) = (0, 0);
        for (range, is_request) in sites {
            let between = &sent.stripped[cursor_in..range.start];
            assert_eq!(
                forwarded.get(cursor_out..cursor_out + between.len()),
                Some(between),
                "the body changed outside its ids\n  sent: {:?}\n  forwarded: {:?}",
                String::from_utf8_lossy(&sent.stripped),
                String::from_utf8_lossy(forwarded)
            );
            cursor_out += between.len();
            let original =
                std::str::from_utf8(&sent.stripped[range.clone()]).expect("a JSON token");
            let (token, length) =
                oracle::token_at(&forwarded[cursor_out..]).expect("a JSON value at an id site");
            let token = token.to_owned();
            cursor_out += length;
            cursor_in = range.end;
            if is_request {
                if token == original {
                    alignment.as_is.push(true);
                } else {
                    assert_eq!(
                        oracle::restore(&token).as_deref(),
                        Some(original),
                        "a remapped id carries the original text"
                    );
                    assert!(
                        self.minted
                            .insert(token.clone(), session.to_vec())
                            .is_none(),
                        "a server-side id reused"
                    );
                    alignment.as_is.push(false);
                    alignment.remapped += 1;
                }
                alignment.server_ids.push(token);
            } else if token != original {
                renamed.push((original.to_owned(), token));
            }
        }
        // A cancellation names the request as the server knows it (its
        // batch's own requests included: they are admitted first).
        for (original, token) in renamed {
            let key = oracle::id_key(&original);
            let known = self
                .server_ids
                .get(session)
                .is_some_and(|ids| ids.contains(&token))
                || alignment.server_ids.contains(&token);
            if !known && !self.pending.is_empty() {
                return Err(KnownBug::CancelNamesUnforwardedRequest);
            }
            assert!(
                known,
                "requestId {original} rewritten to {token}, an id the server never saw in {:?}",
                String::from_utf8_lossy(session),
            );
            let target_key = oracle::restore(&token).map_or_else(
                || oracle::id_key(&token),
                |original| oracle::id_key(&original),
            );
            assert_eq!(target_key, key, "the cancellation names another id");
        }
        assert_eq!(
            &forwarded[cursor_out..],
            &sent.stripped[cursor_in..],
            "the body changed after its last id"
        );
        Ok(alignment)
    }

    /// What the client must read: the echo's body, with top-level response
    /// ids restored where the guard restores them.
    fn expected_answer(&self, sent: &Sent, forwarded: &Forwarded) -> Result<Vec<u8>, KnownBug> {
        let Some(Answer {
            template,
            seen,
            written,
        }) = &forwarded.answer
        else {
            return Ok(Vec::new());
        };
        let remapped = seen.iter().any(|id| self.minted.contains_key(id));
        let restores = if sent.tracked {
            remapped
        } else {
            sent.method == Method::GET && sent.session.is_some()
        };
        let restorable = matches!(forwarded.format, Format::Json | Format::Sse);
        // Only an id the guard minted for this very session is restored: one
        // of another session, or one nobody minted, goes on as written.
        let issued_here =
            |id: &String| self.minted.get(id).map(Vec::as_slice) == sent.session.as_deref();
        let restored: Vec<Option<String>> = seen
            .iter()
            .map(|id| oracle::restore(id).filter(|_| restores && restorable && issued_here(id)))
            .collect();
        if sent.tracked && restorable {
            let received: Vec<&String> = restored
                .iter()
                .zip(seen)
                .map(|(restored, seen)| restored.as_ref().unwrap_or(seen))
                .collect();
            let originals: Vec<&String> = sent.originals.iter().collect();
            assert_eq!(received, originals, "the client gets its exact ids back");
        }
        // In an event stream a restored id must fit its `data:` line: an LF
        // continues the data on a new `data:` line, a CR becomes a space.
        let sse = forwarded.format == Format::Sse;
        let ids: Vec<String> = restored
            .iter()
            .zip(written)
            .map(|(restored, written)| match restored {
                Some(original) if sse => original.replace('\r', " ").replace('\n', "\ndata: "),
                Some(original) => original.clone(),
                None => written.clone(),
            })
            .collect();
        // A server-side id with an escaped prefix (`"\u006dcp-id-guard:..."`)
        // is not how guards write ids: restored nowhere (`oracle::restore`).
        Ok(render(template, &ids))
    }

    /// Reads an open exchange's response to its end.
    fn finish(&mut self, index: usize) -> Result<(), KnownBug> {
        let open = self.open.remove(index);
        let sent = open.sent.clone();
        let entries = open.entries.clone();
        let failed = check_read(open)?;
        self.ended(
            &sent,
            &entries,
            if failed { End::BodyFailed } else { End::Read },
        );
        Ok(())
    }

    /// Drops an open exchange's response unread.
    fn drop_open(&mut self, index: usize) {
        let open = self.open.remove(index);
        let (sent, entries) = (open.sent.clone(), open.entries.clone());
        drop(open);
        self.ended(&sent, &entries, End::Dropped);
    }

    /// Drops a queued request: it leaves the queue.
    fn drop_pending(&mut self, index: usize) {
        self.pending.remove(index);
    }

    /// An exchange ended. One dropped unread or failed by the inner service
    /// leaves its client ids shadowed (when shadows are on). One whose
    /// response body failed may or may not have completed first (under
    /// `Reject` and `Queue` the ids go once the responses passed): it is
    /// left out of the lower bound.
    fn ended(&mut self, sent: &Sent, entries: &[Entry], end: End) {
        if matches!(end, End::Read | End::BodyFailed)
            || !self.settings.shadows
            || entries.is_empty()
        {
            return;
        }
        let session = sent
            .session
            .clone()
            .expect("registered requests are tracked");
        for entry in entries.iter().filter(|entry| entry.as_is) {
            *self
                .shadows
                .entry((session.clone(), entry.key.clone()))
                .or_default() += 1;
        }
    }

    /// Polls every queued request; those whose turn came are forwarded.
    /// A request still waiting must have a reason to.
    fn poll_pending(&mut self) -> Result<(), KnownBug> {
        let mut cx = Context::from_waker(Waker::noop());
        let mut index = 0;
        while index < self.pending.len() {
            let Poll::Ready(result) = self.pending[index].future.as_mut().poll(&mut cx) else {
                index += 1;
                continue;
            };
            let pending = self.pending.remove(index);
            // It counted as in flight while queued; now as its exchange.
            self.arrived(pending.sent, result, true)?;
            // Its exchange may have let others through: poll all again.
            index = 0;
        }
        for (index, pending) in self.pending.iter().enumerate() {
            let session = pending.sent.session.as_deref().expect("tracked");
            let key = &pending.sent.keys()[0];
            let blocked = self.held_open(session, key) || self.waiting(session, key, index);
            assert!(
                blocked,
                "a queued request still waits though its id is free"
            );
        }
        Ok(())
    }

    /// `stats()` against the model of open exchanges.
    fn check_stats(&self) {
        let stats = self.layer.stats();
        let sessions: HashSet<&[u8]> = self
            .open
            .iter()
            .filter(|open| !open.entries.is_empty())
            .map(|open| open.sent.session.as_deref().expect("tracked"))
            .chain(
                self.pending
                    .iter()
                    .map(|pending| pending.sent.session.as_deref().expect("tracked")),
            )
            .collect();
        let in_flight: usize = sessions.iter().map(|session| self.in_flight(session)).sum();
        assert_eq!(stats.in_flight_requests, in_flight, "in-flight requests");
        assert_eq!(stats.in_flight_sessions, sessions.len(), "tracked sessions");
        assert_eq!(stats.passed_total, self.passed, "passed_total");
        assert_eq!(stats.remapped_total, self.remapped, "remapped_total");
        assert_eq!(stats.rejected_total, self.rejected, "rejected_total");
        assert_eq!(stats.queued_total, self.queued, "queued_total");
        let shadows: usize = self.shadows.values().sum();
        assert!(
            stats.abandoned_ids >= shadows,
            "abandoned ids {} below the sure ones {shadows}",
            stats.abandoned_ids
        );
    }

    /// Ends everything: reads every open response, lets every queued
    /// request through, and checks that nothing is left.
    fn drain(mut self) -> Result<(), KnownBug> {
        for _ in 0..10_000 {
            self.poll_pending()?;
            if self.open.is_empty() {
                break;
            }
            self.finish(0)?;
        }
        assert!(self.pending.is_empty(), "a queued request never went");
        self.check_stats();
        let stats = self.layer.stats();
        assert_eq!((stats.in_flight_requests, stats.in_flight_sessions), (0, 0));
        Ok(())
    }
}

/// How an exchange ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    Read,
    BodyFailed,
    Dropped,
    InnerFailed,
}

/// Per request of a body: forwarded with the client's id or not.
#[derive(Debug, Default)]
struct Alignment {
    as_is: Vec<bool>,
    remapped: usize,
    server_ids: Vec<String>,
}

/// Reads a response to its end and compares it with the expected bytes.
/// Returns whether the body failed.
fn check_read(mut open: Open) -> Result<bool, KnownBug> {
    let (data, failed) = read_now(open.response.body_mut());
    assert_eq!(
        failed, open.planned_error,
        "the body fails only when the echo's does"
    );
    if !failed {
        assert_eq!(
            String::from_utf8_lossy(&data),
            String::from_utf8_lossy(&open.expected),
            "the client's response is the echo's with its own ids"
        );
    }
    Ok(failed)
}

/// The fail-closed rule, checked on what the server receives: every request
/// any server's reading ([`readings::DIALECTS`]) finds in the forwarded body
/// carries a server-side id minted for this very request, or an id whose
/// documented key the guard registered as forwarded with the client's own
/// id; and every cancellation a reading finds is one the guard read too,
/// naming an id of the same key. A body the guard forwarded untracked has no
/// request in any reading.
fn check_server_readings(
    sent: &Sent,
    forwarded: &[u8],
    entries: &[Entry],
    alignment: &Alignment,
) -> Result<(), KnownBug> {
    let minted: HashSet<String> = alignment
        .server_ids
        .iter()
        .zip(&alignment.as_is)
        .filter(|(_, as_is)| !**as_is)
        .filter_map(|(token, _)| serde_json::from_str::<String>(token).ok())
        .collect();
    let as_is: HashSet<&str> = entries
        .iter()
        .filter(|entry| entry.as_is)
        .map(|entry| entry.key.as_str())
        .collect();
    let guard = mcp_id_guard::internals::read_body(forwarded, false);
    // A server that inflates request bodies reads the decompressed JSON.
    let inflated = sent
        .headers
        .get("content-encoding")
        .and_then(|coding| readings::inflate(coding.as_bytes(), forwarded))
        .and_then(|body| readings::read(&body, readings::JAVASCRIPT));
    if let Some(reading) = &inflated {
        if entries.is_empty() && reading.request_ids().next().is_some() {
            return Err(KnownBug::CompressedBodyForwardedUntracked);
        }
    }
    for dialect in readings::DIALECTS {
        let Some(reading) = readings::read(forwarded, dialect) else {
            continue;
        };
        for id in reading.request_ids() {
            if id.text().is_some_and(|text| minted.contains(&text)) {
                continue;
            }
            let key = readings::key(id);
            let tracked = key.as_deref().is_some_and(|key| as_is.contains(key));
            if !tracked && entries.is_empty() && forwarded.starts_with(BOM) {
                return Err(KnownBug::SecondBomForwardedUntracked);
            }
            assert!(
                key.as_deref().is_some_and(|key| as_is.contains(key)),
                "{} reads a request with id {id:?} (key {key:?}) the guard did not track\n  sent:      {:?}\n  forwarded: {:?}\n  tracked as is: {as_is:?}",
                dialect.name,
                String::from_utf8_lossy(&sent.body),
                String::from_utf8_lossy(forwarded),
            );
        }
        for (index, seen) in reading.messages.iter().enumerate() {
            let Some(cancelled) = &seen.cancels else {
                continue;
            };
            let read = guard
                .as_ref()
                .and_then(|(_, messages)| messages.get(index))
                .and_then(|message| message.cancels.clone());
            if guard.is_none() && forwarded.starts_with(BOM) {
                return Err(KnownBug::SecondBomForwardedUntracked);
            }
            let read_key = read.and_then(|range| {
                readings::parse(&forwarded[range], readings::LAST_WINS)
                    .as_ref()
                    .and_then(readings::key)
            });
            assert_eq!(
                read_key,
                readings::key(cancelled),
                "{} reads a cancellation of {cancelled:?} the guard did not read alike\n  forwarded: {:?}",
                dialect.name,
                String::from_utf8_lossy(forwarded),
            );
        }
    }
    Ok(())
}

/// The guard refused to read a body (`Unreadable` in the crate): its answer
/// must be the documented one, and the body must give the reason. A body
/// that is valid JSON is judged exactly ([`oracle::must_refuse`]); one that
/// is not may be refused for any of the reasons (what the guard's reader
/// makes of broken JSON is its own), but never passes as a duplicate key or
/// a bad id when valid JSON shows neither.
fn check_unreadable_answer(
    sent: &Sent,
    status: StatusCode,
    errors: &[(String, i64)],
    message: &str,
) {
    let body = &sent.stripped;
    let starts_like_json = matches!(
        body.iter().find(|byte| !oracle::is_json_whitespace(**byte)),
        Some(b'{' | b'[')
    );
    assert!(
        starts_like_json,
        "the guard refused a body no server reads as JSON-RPC: {:?}",
        String::from_utf8_lossy(body)
    );
    let valid = readings::parse(body, oracle::SYNTAX).is_some();
    // A key or method holding a lone surrogate escape is refused as
    // malformed (it does not decode to a Rust string): grammatical, but no
    // server reads it as a key or method that matters.
    let valid_unicode = readings::parse(
        body,
        readings::Dialect {
            lone_surrogates: false,
            ..oracle::SYNTAX
        },
    )
    .is_some();
    let reasons = oracle::refusal_reasons(body);
    assert_eq!(status, StatusCode::BAD_REQUEST, "{message}");
    if message.contains("not JSON") {
        assert_eq!(errors, [("null".to_owned(), -32700)]);
        assert!(
            !valid_unicode,
            "valid JSON refused as malformed: {:?}",
            String::from_utf8_lossy(body)
        );
        return;
    }
    assert_eq!(errors, [("null".to_owned(), -32600)], "{message}");
    let expected = if message.contains("twice") {
        "a key twice"
    } else if message.contains("request id") {
        "id servers read differently"
    } else {
        panic!("an unknown answer: {message}");
    };
    if valid {
        assert!(
            reasons.iter().any(|reason| reason.contains(expected)),
            "refused ({message}) but the body shows {reasons:?}: {:?}",
            String::from_utf8_lossy(body)
        );
    }
}

/// The error messages of a guard's answer.
fn guard_messages(body: &[u8]) -> Vec<String> {
    let value: serde_json::Value =
        serde_json::from_slice(body).expect("the guard's answer is JSON");
    let objects = match value {
        serde_json::Value::Array(objects) => objects,
        object => vec![object],
    };
    objects
        .iter()
        .map(|object| {
            object["error"]["message"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        })
        .collect()
}

/// The `id` JSON texts and error codes of a guard's answer (one error
/// object, or an array of them).
fn guard_errors(body: &[u8]) -> Vec<(String, i64)> {
    use serde_json::value::RawValue;
    #[derive(serde::Deserialize)]
    struct Error {
        code: i64,
        message: String,
    }
    let objects: Vec<&RawValue> = if body.first() == Some(&b'[') {
        serde_json::from_slice(body).expect("the guard's answer is a JSON array")
    } else {
        vec![serde_json::from_slice(body).expect("the guard's answer is JSON")]
    };
    objects
        .iter()
        .map(|object| {
            let fields: HashMap<String, &RawValue> =
                serde_json::from_str(object.get()).expect("an error object");
            let mut names: Vec<&str> = fields.keys().map(String::as_str).collect();
            names.sort_unstable();
            assert_eq!(names, ["error", "id", "jsonrpc"]);
            assert_eq!(fields["jsonrpc"].get(), "\"2.0\"");
            let error: Error = serde_json::from_str(fields["error"].get()).expect("an error");
            assert!(!error.message.is_empty());
            (fields["id"].get().to_owned(), error.code)
        })
        .collect()
}

/// Builds one request from fuzz choices.
fn build_request(input: &mut Input<'_>, serial: u64) -> (Request<Chunks>, Sent) {
    let method = match input.below(8) {
        0 => Method::GET,
        1 => Method::DELETE,
        2 => Method::from_bytes(input.bytes(6)).unwrap_or(Method::PUT),
        _ => Method::POST,
    };
    let mut headers = HeaderMap::new();
    let mut header = |name: &'static str, value: &[u8]| {
        if let Ok(value) = HeaderValue::from_bytes(value) {
            headers.insert(HeaderName::from_static(name), value);
        }
    };
    match input.below(8) {
        0 => {}
        1 => header("mcp-session-id", input.bytes(24)),
        2 => header("mcp-session-id", &vec![b's'; 8 * 1024]),
        _ => header("mcp-session-id", input.pick(SESSIONS)),
    }
    match input.below(8) {
        0 => {}
        1 => header("content-type", input.bytes(24)),
        2..=3 => header("content-type", input.pick(CONTENT_TYPES).as_bytes()),
        _ => header("content-type", b"application/json"),
    }
    // A second `Mcp-Session-Id` (same value or another): servers disagree
    // on which counts, the guard refuses the request.
    let second_session = (input.below(16) == 0).then(|| input.pick(SESSIONS));
    match input.below(4) {
        0 => header("mcp-protocol-version", input.pick(VERSIONS).as_bytes()),
        1 => header("mcp-protocol-version", input.bytes(12)),
        _ => {}
    }
    if input.below(4) == 0 {
        header("accept-encoding", b"gzip");
    }
    if input.below(16) == 0 {
        header("connection", input.pick(CONNECTIONS).as_bytes());
    }
    header("x-fuzz-serial", serial.to_string().as_bytes());

    let body = match input.below(4) {
        0 => input.bytes(64).to_vec(),
        _ => {
            let mut body = json_body(input);
            if input.below(6) == 0 && !body.is_empty() {
                let at = input.below(body.len());
                body[at] = input.byte();
            }
            encode(input, body)
        }
    };
    // Compressed, as a client may send it to a server that inflates request
    // bodies (Express's `express.json()` does by default).
    let body = match input.below(16) {
        0 => {
            header("content-encoding", b"gzip");
            readings::gzip_stored(&body)
        }
        1 => {
            header("content-encoding", b"deflate");
            readings::zlib_stored(&body)
        }
        _ => body,
    };
    match input.below(6) {
        0 => header("content-length", body.len().to_string().as_bytes()),
        1 => {
            let lie = input.pick(&[
                "0",
                "1",
                "+5",
                "201",
                "65",
                "17",
                "18446744073709551616",
                "x",
            ]);
            header("content-length", lie.as_bytes());
        }
        _ => {}
    }
    if let Some(value) = second_session.and_then(|second| HeaderValue::from_bytes(second).ok()) {
        headers.append(HeaderName::from_static("mcp-session-id"), value);
    }
    let cuts = input.cuts(body.len(), 3);
    let trailers = input.below(8) == 0;
    let body_error = input.below(10) == 0;
    let frames: Vec<usize> = cuts.iter().copied().chain([body.len()]).collect();
    let pieces = split_at_cuts(&body, &cuts);
    let trailer_map = trailers.then(|| {
        let mut map = HeaderMap::new();
        map.insert("x-trailer", HeaderValue::from_static("1"));
        map
    });
    let mut request = Request::new(Chunks::new(pieces, trailer_map, body_error));
    *request.method_mut() = method.clone();
    *request.uri_mut() = http::Uri::from_static("/mcp");
    *request.headers_mut() = headers.clone();

    // A session POST is tracked whatever revision it claims: the server
    // routes it into the session by id.
    let in_legacy_session = headers.contains_key("mcp-session-id");
    let hides = in_legacy_session
        && headers.get_all("connection").iter().any(|value| {
            value.as_bytes().split(|byte| *byte == b',').any(|token| {
                let token = token.trim_ascii().to_ascii_lowercase();
                DECIDED_ON.iter().any(|name| token == name.as_bytes())
            })
        });
    let odd_session = in_legacy_session
        && headers.get_all("mcp-session-id").iter().any(|value| {
            value
                .as_bytes()
                .iter()
                .any(|byte| !(0x21..=0x7e).contains(byte))
        });
    // Every POST of a session is read, whatever its content type: servers
    // check it loosely.
    let tracked = in_legacy_session && method == Method::POST && !hides && !odd_session;
    let several_sessions = headers.get_all("mcp-session-id").iter().count() > 1;
    let session = in_legacy_session.then(|| headers["mcp-session-id"].as_bytes().to_vec());
    let stripped = body.strip_prefix(BOM).unwrap_or(&body).to_vec();
    let parsed = if tracked && !several_sessions && !is_wide(&stripped) {
        oracle::read(&stripped, oracle::Writer::Client)
    } else {
        None
    };
    let (originals, cancels) = match &parsed {
        Some(parsed) => {
            let originals = parsed
                .request_ids()
                .into_iter()
                .map(|range| String::from_utf8_lossy(&stripped[range]).into_owned())
                .collect();
            let cancels = parsed
                .messages()
                .iter()
                .filter_map(|message| message.cancels.clone())
                .map(|range| oracle::id_key(&String::from_utf8_lossy(&stripped[range])))
                .collect();
            (originals, cancels)
        }
        None => (Vec::new(), Vec::new()),
    };
    let sent = Sent {
        serial,
        method,
        headers,
        body,
        stripped,
        several_sessions,
        hides,
        odd_session,
        frames,
        body_error,
        session,
        tracked,
        parsed,
        originals,
        cancels,
    };
    (request, sent)
}

/// `Connection` values: some name a header the guard's layers read.
const CONNECTIONS: &[&str] = &[
    "keep-alive, MCP-Protocol-Version",
    "close",
    "keep-alive",
    "Mcp-Session-Id",
    "x-a, content-length",
    " last-event-id ,close",
    "upgrade, x-mcp-session-id",
];

/// The headers a request's `Connection` must not name (the model's own
/// list, written apart from the guard's).
const DECIDED_ON: &[&str] = &[
    "mcp-session-id",
    "mcp-protocol-version",
    "mcp-method",
    "mcp-name",
    "last-event-id",
    "content-type",
    "content-length",
    "content-encoding",
    "transfer-encoding",
    "accept",
    "accept-encoding",
    "traceparent",
    "tracestate",
    "host",
    "origin",
];

/// A JSON-RPC body (a message or a batch) from fuzz choices.
fn json_body(input: &mut Input<'_>) -> Vec<u8> {
    let batch = input.below(4) == 0;
    let count = if batch { input.below(5) } else { 1 };
    let messages: Vec<String> = (0..count).map(|_| message(input)).collect();
    let text = if batch {
        format!("[{}]", messages.join(input.pick(&[",", " , ", ",\n"])))
    } else {
        messages.concat()
    };
    let pad = input.pick(&["", " ", "\n", "\t\r\n"]);
    format!("{pad}{text}{pad}").into_bytes()
}

/// The UTF-8 byte order mark.
const BOM: &[u8] = b"\xEF\xBB\xBF";

/// UTF-16 or UTF-32 by the guard's documented test: a UTF-16 byte order
/// mark, or a NUL among the first two bytes.
fn is_wide(body: &[u8]) -> bool {
    body.starts_with(b"\xFE\xFF")
        || body.starts_with(b"\xFF\xFE")
        || (body.len() >= 2 && (body[0] == 0 || body[1] == 0))
}

/// The body as bytes a client might send: mostly as it is; else with byte
/// order marks, in UTF-16 or UTF-32, after a byte no reader takes for
/// whitespace, or with a lone surrogate written as raw (CESU) bytes.
fn encode(input: &mut Input<'_>, body: Vec<u8>) -> Vec<u8> {
    let text = String::from_utf8_lossy(&body).into_owned();
    let utf16 = |big: bool| -> Vec<u8> {
        text.encode_utf16()
            .flat_map(|unit| {
                if big {
                    unit.to_be_bytes()
                } else {
                    unit.to_le_bytes()
                }
            })
            .collect()
    };
    let utf32 = |big: bool| -> Vec<u8> {
        text.chars()
            .flat_map(|character| {
                let point = u32::from(character);
                if big {
                    point.to_be_bytes()
                } else {
                    point.to_le_bytes()
                }
            })
            .collect()
    };
    let join = |parts: &[&[u8]]| parts.concat();
    match input.below(24) {
        0 => join(&[BOM, &body]),
        1 => join(&[BOM, BOM, &body]),
        2 => utf16(false),
        3 => utf16(true),
        4 => join(&[b"\xFF\xFE", &utf16(false)]),
        5 => join(&[b"\xFE\xFF", &utf16(true)]),
        6 => utf32(false),
        7 => utf32(true),
        8 => join(&[b"\x00\x00\xFE\xFF", &utf32(true)]),
        9 => join(&[BOM, b"\xFF\xFE", &utf16(false)]),
        10 => join(&[b"\x0C", &body]),
        11 => join(&[BOM, b" \n", &body]),
        12 => join(&[b" ", BOM, &body]),
        23 => join(&[BOM, BOM, BOM, &body]),
        13 => {
            // `\ud800` as the three bytes Python's `surrogatepass` decodes.
            let raw = text.replace("\\ud800", "\u{FFFF}");
            let mut out = Vec::with_capacity(raw.len());
            for piece in raw.split('\u{FFFF}').enumerate() {
                if piece.0 > 0 {
                    out.extend_from_slice(b"\xED\xA0\x80");
                }
                out.extend_from_slice(piece.1.as_bytes());
            }
            out
        }
        _ => body,
    }
}

/// Methods written with escapes (the same strings decoded).
const ESCAPED_METHODS: &[&str] = &[
    "tools\\/call",
    "\\u0074ools/call",
    "notifications\\/cancelled",
    "notifications/\\u0063ancelled",
    "p\\u0069ng",
];

/// Keys that repeat, plain and escaped.
const REPEATED_KEYS: &[&str] = &[
    "id",
    "\\u0069d",
    "method",
    "m\\u0065thod",
    "jsonrpc",
    "params",
    "x",
];

fn message(input: &mut Input<'_>) -> String {
    let id = id_text(input);
    let method = input.pick(METHODS);
    match input.below(24) {
        0 => format!(
            "{{\"jsonrpc\":\"2.0\",\"method\":\"notifications/cancelled\",\"params\":{{\"requestId\":{id},\"reason\":\"x\"}}}}"
        ),
        1 => "{\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\"}".to_owned(),
        2 => format!("{{\"jsonrpc\":\"2.0\",\"id\":{id},\"result\":{{}}}}"),
        3 => format!("{{\"jsonrpc\":\"2.0\",\"id\":{id},\"id\":{id},\"method\":\"{method}\"}}"),
        4 => format!("{{\"jsonrpc\":\"2.0\",\"id\":null,\"method\":\"{method}\"}}"),
        5 => format!("{{\"jsonrpc\":\"2.0\",\"id\":{id},\"method\":7}}"),
        6 => format!("[{id}]"),
        7 => format!(
            "{{ \"params\" : {{\"id\":{id}}} , \"method\" : \"{method}\" , \"id\" : {id} }}"
        ),
        8 => format!(
            "{{\"method\":\"notifications/cancelled\",\"params\":[{id}]}}"
        ),
        9 => format!("{{\"jsonrpc\":\"2.0\",\"\\u0069d\":{id},\"method\":\"{method}\"}}"),
        10 => {
            let escaped = input.pick(ESCAPED_METHODS);
            format!("{{\"jsonrpc\":\"2.0\",\"id\":{id},\"method\":\"{escaped}\"}}")
        }
        11 => format!(
            "{{\"method\":\"notifications\\/cancelled\",\"params\":{{\"\\u0072equestId\":{id}}}}}"
        ),
        12 => {
            // A repeated key after a payload of some size.
            let size = input.pick(&[0, 40, 3_000, 20_000]);
            let key = input.pick(REPEATED_KEYS);
            let other = id_text(input);
            let value = match input.below(3) {
                0 => other,
                1 => format!("\"{}\"", input.pick(METHODS)),
                _ => "null".to_owned(),
            };
            format!(
                "{{\"jsonrpc\":\"2.0\",\"id\":{id},\"method\":\"{method}\",\"params\":{{\"x\":\"{}\"}},\"{key}\":{value}}}",
                "a".repeat(size)
            )
        }
        13 => format!("{{\"id\":{id},\"method\":7,\"method\":\"{method}\"}}"),
        14 => format!("{{\"id\":{id},\"method\":\"{method}\",\"method\":null}}"),
        15 => format!("{{\"x\":1,\"jsonrpc\":\"2.0\",\"id\":{id},\"method\":\"{method}\",\"x\":2}}"),
        16 => format!(
            "{{\"jsonrpc\":\"2.0\",\"id\":{id},\"method\":\"{method}\",\"params\":{{\"x\":NaN,\"y\":-Infinity,\"z\":Infinity}}}}"
        ),
        17 => {
            let other = id_text(input);
            format!(
                "{{\"method\":\"notifications/cancelled\",\"params\":{{\"requestId\":{id},\"requestId\":{other}}}}}"
            )
        }
        18 => {
            // More keys than the guard compares pairwise, one repeated.
            let keys: String = (0..10).map(|n| format!("\"k{n}\":{n},")).collect();
            let key = input.pick(REPEATED_KEYS);
            format!("{{{keys}\"id\":{id},\"method\":\"{method}\",\"{key}\":0}}")
        }
        19 => format!("{{\"id\":null,\"method\":\"{method}\",\"id\":{id}}}"),
        20 => format!("{{\"id\":{id},\"method\":\"{method}\",\"id\":null}}"),
        21 => {
            let other = id_text(input);
            format!(
                "{{\"jsonrpc\":\"2.0\",\"id\":{id},\"method\":\"{method}\",\"params\":{{\"id\":{other},\"id\":1}}}}"
            )
        }
        _ => format!("{{\"jsonrpc\":\"2.0\",\"id\":{id},\"method\":\"{method}\",\"params\":{{}}}}"),
    }
}
