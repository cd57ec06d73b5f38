//! The guard without a runtime, for faces other than the tower one: the
//! Python ASGI middleware (`mcp_id_guard.IdGuard`), and later others.
//!
//! A [`Core`] holds the rules and the session table; a [`Passage`] is one
//! HTTP request's way through them. Both are sans-IO, in the manner of
//! h11 or quinn-proto: a driver hands in heads and bytes, reads the
//! [`Action`] to take, and hands out what the passage gives back. Nothing
//! here awaits, spawns or reads a socket; every call is synchronous and
//! short. The steps are the ones [`IdGuard`](crate::IdGuard) takes (its
//! head decision, admission, queue turn, response reading), the same
//! functions, so no rule is written twice.
//!
//! A queued duplicate's wait is the driver's: [`Passage::poll_turn`] says
//! whether the turn came, [`Core::take_woken`] which waiting passages may
//! have had theirs since (the driver wakes those, in its own runtime), and
//! [`Passage::time_out`] ends a wait past
//! [`max_queue_wait`](crate::IdGuardLayer::max_queue_wait) by the driver's
//! clock.
//!
//! Ending is explicit: [`Passage::close`] releases what the request holds
//! (an id whose answer went out is free; any other stays abandoned), and a
//! driver calls it however the exchange ended. Dropping a passage does the
//! same, as a last resort.
//!
//! ```
//! use bytes::Bytes;
//! use http::{HeaderMap, Method, StatusCode};
//! use mcp_id_guard::core::{Action, Core};
//! use mcp_id_guard::IdGuardLayer;
//!
//! let core = Core::new(&IdGuardLayer::new());
//! let mut headers = HeaderMap::new();
//! headers.insert("mcp-session-id", "s-1".parse().unwrap());
//! headers.insert("content-type", "application/json".parse().unwrap());
//! let call = br#"{"jsonrpc":"2.0","id":1,"method":"tools/call"}"#;
//!
//! // Two calls with `id: 1` in one session: the second goes on remapped.
//! let mut first = core.start(&Method::POST, headers.clone());
//! assert_eq!(first.action(), Action::Read);
//! assert!(first.feed(Bytes::from_static(call)));
//! assert_eq!(first.admit(), Action::Forward);
//! let mut second = core.start(&Method::POST, headers);
//! assert!(second.feed(Bytes::from_static(call)));
//! assert_eq!(second.admit(), Action::Forward);
//! let sent = second.take_request_body().unwrap();
//! assert_ne!(&sent[..], &call[..]);
//!
//! // The server answers the second under the id it saw; the client gets 1.
//! let id = serde_json::from_slice::<serde_json::Value>(&sent).unwrap()["id"].clone();
//! let mut response = HeaderMap::new();
//! response.insert("content-type", "application/json".parse().unwrap());
//! second.respond(StatusCode::OK, &mut response);
//! let answer = format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{{}}}}"#);
//! let out = [
//!     second.body(Bytes::from(answer), true).unwrap(),
//!     second.body(Bytes::new(), false).unwrap(),
//! ]
//! .concat();
//! assert_eq!(out, br#"{"jsonrpc":"2.0","id":1,"result":{}}"#);
//! second.close();
//! first.close(); // never answered: its id stays abandoned
//! assert_eq!(core.stats().in_flight_requests, 0);
//! assert_eq!(core.stats().abandoned_ids, 1);
//! ```

use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};

use bytes::Bytes;
use http::{HeaderMap, Method, Request, Response, StatusCode};
use http_body::Body as _;
use http_body_util::{Empty, Full};

use crate::guard::admit::{admit, Admission};
use crate::guard::body::{read_response, Accumulated, RequestBody, Restoring};
use crate::guard::exchange::Exchange;
use crate::guard::future::{is_initialize, read_chunk, restoring, timed_out, turn};
use crate::guard::reader::Reader;
use crate::guard::service::{head, Head};
use crate::guard::IdGuardLayer;
use crate::guard::PendingForward;
use crate::protect::buffer::{BodyBudget, HeldBody};
use crate::table::config::Config;
use crate::table::{Registration, Stats, Table, Waiter};
use crate::wire::answer::{body_budget_spent, header_not_http};
use crate::wire::protocol::RequestHeaders;

/// The guard's rules and session table, driven without a runtime. Cheap to
/// clone: clones share the table.
#[derive(Debug, Clone)]
pub struct Core {
    config: Config,
    table: Arc<Table>,
    woken: Arc<Woken>,
    /// What read request bodies may hold at once, if bounded.
    budget: Option<BodyBudget>,
}

/// The tokens of waiting passages whose turn may have come.
#[derive(Debug, Default)]
struct Woken {
    tokens: Mutex<Vec<u64>>,
    next: std::sync::atomic::AtomicU64,
}

impl Woken {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<u64>> {
        self.tokens
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The waker a waiting passage leaves with the table: it only notes the
/// token, so granting a turn runs no driver code under the table's lock.
struct Note {
    woken: Arc<Woken>,
    token: u64,
}

impl Wake for Note {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.lock().push(self.token);
    }
}

impl Core {
    /// A core with `layer`'s settings, sharing its table (and so its
    /// [`stats`](IdGuardLayer::stats)) with every service it builds.
    pub fn new(layer: &IdGuardLayer) -> Self {
        let (config, table) = layer.parts();
        Self {
            config,
            table,
            woken: Arc::default(),
            budget: None,
        }
    }

    /// Charges every request body the core reads to `budget` (the one a
    /// [`BodyBufferLayer`](crate::protect::buffer::BodyBufferLayer) uses, or
    /// one of its own), as it arrives, and refuses one that does not fit
    /// (`503`): a server in front of which nothing bounds the bodies held at
    /// once (uvicorn bounds none) gets the bound here.
    pub fn with_budget(mut self, budget: BodyBudget) -> Self {
        self.budget = Some(budget);
        self
    }

    /// How long a queued duplicate may wait
    /// ([`max_queue_wait`](IdGuardLayer::max_queue_wait)): the driver times
    /// the wait by its own clock, then calls [`Passage::time_out`].
    pub fn max_queue_wait(&self) -> std::time::Duration {
        self.config.max_queue_wait
    }

    /// A snapshot of the table's counters.
    pub fn stats(&self) -> Stats {
        self.table.stats()
    }

    /// The tokens ([`Passage::token`]) of waiting passages whose turn may
    /// have come since the last call: the driver wakes their waits, which
    /// then call [`Passage::poll_turn`].
    pub fn take_woken(&self) -> Vec<u64> {
        std::mem::take(&mut *self.woken.lock())
    }

    /// A request whose head the driver could not hand over (a header name
    /// or value HTTP does not allow): the guard cannot read it as the
    /// server will, so it answers `400` itself.
    pub fn refuse_head(&self) -> Passage {
        self.passage(Step::Answer(header_not_http()))
    }

    /// A request the guard hands on untouched, and its response (for a head
    /// the driver could not hand over outside any session: nothing in it is
    /// tracked).
    pub fn pass(&self) -> Passage {
        self.passage(Step::Pass)
    }

    fn passage(&self, step: Step) -> Passage {
        Passage {
            core: self.clone(),
            step,
            reader: None,
            registration: None,
            held: None,
        }
    }

    /// [`start`](Self::start) for a request from `client`: its body counts
    /// also against that address's share of the budget
    /// ([`BodyBudget::per_client`]).
    pub fn start_from(&self, method: &Method, headers: HeaderMap, client: IpAddr) -> Passage {
        self.begin(method, headers, Some(client))
    }

    /// A request's way through the guard begins with its head. `headers`
    /// are the request's as the server will receive them.
    pub fn start(&self, method: &Method, headers: HeaderMap) -> Passage {
        self.begin(method, headers, None)
    }

    fn begin(&self, method: &Method, headers: HeaderMap, client: Option<IpAddr>) -> Passage {
        let mut request = Request::new(());
        *request.method_mut() = method.clone();
        *request.headers_mut() = headers;
        let step = match head(&mut request, &self.config, &self.table, false) {
            Head::Untouched { .. } => Step::Pass,
            Head::Answer { response, .. } => Step::Answer(response),
            Head::Stream(restoring) => Step::Forward {
                headers: request.into_parts().0.headers,
                body: None,
                registration: None,
                restoring: Some(restoring),
                starts: false,
            },
            Head::Read {
                headers,
                watch_start,
            } => Step::Read(Box::new(Reading {
                parts: request.into_parts().0,
                headers,
                buffer: Accumulated::default(),
                watch_start,
                held: self.budget.as_ref().map(|budget| match client {
                    Some(client) => budget.hold_for(client),
                    None => budget.hold(),
                }),
            })),
        };
        self.passage(step)
    }
}

/// What the driver does next with a [`Passage`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Action {
    /// Hand the request and its response on untouched: the guard reads
    /// neither.
    Pass,
    /// Read the request's body: [`Passage::feed`] each chunk, then
    /// [`Passage::admit`].
    Read,
    /// Call the server with [`Passage::request_headers`] (and, for a read
    /// POST, [`Passage::take_request_body`] instead of the client's body),
    /// then hand its response head to [`Passage::respond`] and its body to
    /// [`Passage::body`].
    Forward,
    /// Do not call the server: send [`Passage::answer`].
    Answer,
    /// A duplicate waits for its id: see [`Passage::poll_turn`].
    Wait,
    /// The request was handed on; its response goes through
    /// [`Passage::body`].
    Respond,
    /// [`Passage::close`] was called.
    Closed,
}

/// One request's way through a [`Core`]; see the [module docs](self).
#[derive(Debug)]
pub struct Passage {
    core: Core,
    step: Step,
    /// How the response body is read, once its head is known.
    reader: Option<Reader>,
    /// The request's ids, held until their answers pass or the passage
    /// closes.
    registration: Option<Registration>,
    /// The read body's charge to the budget, until the server takes it.
    held: Option<HeldBody>,
}

// One per request, set in place: the variants' sizes do not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
enum Step {
    Pass,
    Read(Box<Reading>),
    Forward {
        headers: HeaderMap,
        body: Option<Bytes>,
        registration: Option<Registration>,
        restoring: Option<Restoring>,
        starts: bool,
    },
    Answer(Response<Full<Bytes>>),
    Wait(Box<Waiting>),
    Respond,
    Closed,
}

#[derive(Debug)]
struct Reading {
    parts: http::request::Parts,
    headers: RequestHeaders,
    buffer: Accumulated,
    watch_start: bool,
    /// The body's bytes, charged to the core's budget as they arrive.
    held: Option<HeldBody>,
}

struct Waiting {
    pending: Option<PendingForward>,
    registration: Registration,
    ticket: Arc<Waiter>,
    waker: Waker,
    token: u64,
    session: Option<http::HeaderValue>,
}

impl std::fmt::Debug for Waiting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Waiting")
            .field("token", &self.token)
            .finish_non_exhaustive()
    }
}

impl Passage {
    /// What the driver does next.
    pub fn action(&self) -> Action {
        match self.step {
            Step::Pass => Action::Pass,
            Step::Read(_) => Action::Read,
            Step::Forward { .. } => Action::Forward,
            Step::Answer(_) => Action::Answer,
            Step::Wait(_) => Action::Wait,
            Step::Respond => Action::Respond,
            Step::Closed => Action::Closed,
        }
    }

    /// Takes a chunk of the request's body (under [`Action::Read`]). `false`:
    /// the body is over the limit; the action is now [`Action::Answer`] and
    /// the rest need not be read.
    pub fn feed(&mut self, chunk: Bytes) -> bool {
        let Step::Read(reading) = &mut self.step else {
            return !matches!(self.step, Step::Answer(_));
        };
        let refusal = read_chunk(&mut reading.buffer, chunk, self.core.config.max_body_bytes)
            .or_else(|| {
                let held = reading.held.as_mut()?;
                held.grow_to(reading.buffer.held())
                    .err()
                    .map(|_| body_budget_spent())
            });
        match refusal {
            None => true,
            Some(response) => {
                self.step = Step::Answer(response);
                false
            }
        }
    }

    /// The request's body is complete (under [`Action::Read`]): the guard
    /// decides. Returns the action that follows.
    pub fn admit(&mut self) -> Action {
        let reading = match std::mem::replace(&mut self.step, Step::Closed) {
            Step::Read(reading) => reading,
            other => {
                self.step = other;
                return self.action();
            }
        };
        let Reading {
            parts,
            headers,
            buffer,
            watch_start,
            held,
        } = *reading;
        // The whole body is here: a small one may draw on the reserve. It is
        // held until the server takes it.
        self.held = held;
        if let Some(held) = &mut self.held {
            if held.complete(buffer.held()).is_err() {
                self.held = None;
                self.step = Step::Answer(body_budget_spent());
                return self.action();
            }
        }
        let core = &self.core;
        let mut exchange = Exchange::default();
        let bytes = buffer.into_bytes();
        let starts = watch_start && is_initialize(&bytes);
        let admission = admit::<Empty<Bytes>>(
            PendingForward::new(parts, bytes, None),
            &headers,
            &core.config,
            &core.table,
            &mut exchange,
            false,
        );
        self.step = match admission {
            Admission::Forward {
                request,
                registration,
                restore,
            } => {
                let restoring = restoring(
                    restore,
                    registration.as_ref(),
                    &headers,
                    &core.config,
                    &core.table,
                );
                forward(request, registration, restoring, starts)
            }
            Admission::Queue {
                pending,
                registration,
                ticket,
            } => {
                let token = core
                    .woken
                    .next
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let waker = Waker::from(Arc::new(Note {
                    woken: Arc::clone(&core.woken),
                    token,
                }));
                Step::Wait(Box::new(Waiting {
                    pending: Some(pending),
                    registration,
                    ticket,
                    waker,
                    token,
                    session: headers.session,
                }))
            }
            Admission::Answer(response) => Step::Answer(response),
        };
        self.action()
    }

    /// While [`Action::Wait`]: whether the turn came (then
    /// [`Action::Forward`]). Until it does, the driver waits for the token
    /// in [`Core::take_woken`], by its own clock no longer than
    /// `max_queue_wait`.
    pub fn poll_turn(&mut self) -> Action {
        let Step::Wait(waiting) = &mut self.step else {
            return self.action();
        };
        let mut cx = Context::from_waker(&waiting.waker);
        let Poll::Ready(server_id) = waiting.ticket.poll_turn(&mut cx) else {
            return Action::Wait;
        };
        let Step::Wait(waiting) = std::mem::replace(&mut self.step, Step::Closed) else {
            unreachable!("checked above")
        };
        let Waiting {
            pending,
            mut registration,
            session,
            ..
        } = *waiting;
        let pending = pending.expect("a waiting passage holds its request");
        let (request, restoring) = turn::<Empty<Bytes>>(
            pending,
            &mut registration,
            server_id,
            self.core.config.max_body_bytes,
            session,
        );
        self.step = forward(request, Some(registration), Some(restoring), false);
        self.action()
    }

    /// The token [`Core::take_woken`] reports when this waiting passage's
    /// turn may have come (`None` unless [`Action::Wait`]).
    pub fn token(&self) -> Option<u64> {
        match &self.step {
            Step::Wait(waiting) => Some(waiting.token),
            _ => None,
        }
    }

    /// The wait ran past `max_queue_wait` by the driver's clock: the
    /// request leaves the line, and the guard answers `503`.
    pub fn time_out(&mut self) {
        match std::mem::replace(&mut self.step, Step::Closed) {
            Step::Wait(waiting) => {
                let Waiting {
                    pending,
                    registration,
                    ..
                } = *waiting;
                drop(registration);
                self.step = Step::Answer(timed_out(pending.as_ref()));
            }
            other => self.step = other,
        }
    }

    /// The headers to call the server with (under [`Action::Forward`]).
    pub fn request_headers(&self) -> Option<&HeaderMap> {
        match &self.step {
            Step::Forward { headers, .. } => Some(headers),
            _ => None,
        }
    }

    /// The body to call the server with, in place of the client's (under
    /// [`Action::Forward`] after [`Action::Read`]); `None` for a stream,
    /// whose request body goes on as it came.
    pub fn take_request_body(&mut self) -> Option<Bytes> {
        // The server has the body now: its charge goes back.
        self.held = None;
        match &mut self.step {
            Step::Forward { body, .. } => body.take(),
            _ => None,
        }
    }

    /// The guard's own answer (under [`Action::Answer`]): status, headers
    /// and the whole body.
    pub fn answer(&self) -> Option<(StatusCode, &HeaderMap, Bytes)> {
        let Step::Answer(response) = &self.step else {
            return None;
        };
        Some((
            response.status(),
            response.headers(),
            whole(response.body()),
        ))
    }

    /// The server's response head (under [`Action::Forward`]): `headers`
    /// become the ones to send (restoring drops `Content-Length`). The
    /// action becomes [`Action::Respond`].
    pub fn respond(&mut self, status: StatusCode, headers: &mut HeaderMap) {
        let (registration, restoring, starts) =
            match std::mem::replace(&mut self.step, Step::Respond) {
                Step::Forward {
                    registration,
                    restoring,
                    starts,
                    ..
                } => (registration, restoring, starts),
                // A second head, or one for a request never handed on: nothing
                // of it is the guard's to change.
                other => {
                    self.step = other;
                    return;
                }
            };
        let mut response = Response::new(());
        *response.status_mut() = status;
        *response.headers_mut() = std::mem::take(headers);
        if starts {
            crate::guard::future::note_started(&response, &self.core.table, &self.core.config);
        }
        let (mut parts, ()) = response.into_parts();
        let mut registration = registration;
        if registration.is_some() || restoring.is_some() {
            self.reader = read_response(&mut parts, &mut registration, restoring);
        }
        self.registration = registration;
        *headers = parts.headers;
    }

    /// A chunk of the server's response body (under [`Action::Respond`]);
    /// `more`: more follows. Returns what to send now (empty while an id is
    /// held back). The last call (`more` false) sends what was held.
    ///
    /// A body out of turn — before the response's head, after its last
    /// chunk, or after [`close`](Self::close) — is the server's mistake: an
    /// error, never bytes passed on unread (they could carry a server-side
    /// id the client must not see).
    pub fn body(&mut self, chunk: Bytes, more: bool) -> Result<Bytes, OutOfTurn> {
        if !matches!(self.step, Step::Respond) {
            return Err(OutOfTurn);
        }
        if !more {
            self.step = Step::Closed;
        }
        let Some(reader) = &mut self.reader else {
            if !more {
                // Nothing was read: what the registration holds stays
                // abandoned.
                self.registration.take();
            }
            return Ok(chunk);
        };
        // What goes on is the reader's piece as it is: joined (one copy)
        // only when the last chunk and what was held both go at the end.
        let piece = if chunk.is_empty() {
            None
        } else {
            reader.chunk(chunk, &mut self.registration)
        };
        if more {
            return Ok(piece.unwrap_or_default());
        }
        let last = reader.end(&mut self.registration);
        self.reader = None;
        Ok(match (piece, last) {
            (Some(piece), Some(last)) => [piece, last].concat().into(),
            (piece, last) => piece.or(last).unwrap_or_default(),
        })
    }

    /// Ends the passage, however the exchange ended: an id whose answer
    /// went out is free, any other stays abandoned; a waiting request
    /// leaves the line. Idempotent.
    pub fn close(&mut self) {
        self.held = None;
        self.reader = None;
        self.registration.take();
        self.step = Step::Closed;
    }
}

/// A response body handed to a [`Passage`] out of turn: before its head,
/// after its last chunk, or after the passage closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutOfTurn;

impl std::fmt::Display for OutOfTurn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a response body out of turn: before its head, after its end, or after close")
    }
}

impl std::error::Error for OutOfTurn {}

/// The step after a decision to call the server.
fn forward(
    request: Request<RequestBody<Empty<Bytes>>>,
    registration: Option<Registration>,
    restoring: Option<Restoring>,
    starts: bool,
) -> Step {
    let (parts, body) = request.into_parts();
    Step::Forward {
        headers: parts.headers,
        body: Some(body.into_buffered().unwrap_or_default()),
        registration,
        restoring,
        starts,
    }
}

/// The bytes of a body the guard made itself: in memory, read without a
/// runtime.
fn whole(body: &Full<Bytes>) -> Bytes {
    let mut body = body.clone();
    let mut cx = Context::from_waker(Waker::noop());
    match std::pin::Pin::new(&mut body).poll_frame(&mut cx) {
        Poll::Ready(Some(Ok(frame))) => frame.into_data().unwrap_or_default(),
        _ => Bytes::new(),
    }
}
