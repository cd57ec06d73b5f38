//! A simulated MCP server (streamable HTTP, stateful sessions) that routes
//! each response by `(session, id)` alone, as python-sdk and the TypeScript
//! SDK do: a second request under an id still running replaces the first
//! one's route, so the first one's result goes to the second one's stream
//! (a cross-wire) and the first one hangs. Any duplicate the guard lets
//! through shows up.
//!
//! It answers a `tools/call` as JSON once the tool has finished, or as SSE
//! on the POST stream (a priming event, a progress notification, then the
//! result), and runs each tool for as long as the call's `ms` argument
//! says. Some SSE streams it closes early for polling (SEP-1699): every
//! event is kept in the session's event store, and a `GET` with
//! `Last-Event-ID` replays the stream from there, then goes on live (or is
//! closed early again). It honours half the `notifications/cancelled` it
//! gets, for whichever request runs under that id. On some SSE streams it
//! sends a request of its own (sampling, ids counting from 1 like the
//! clients'), whose answer must come back to it once and as sent.
//!
//! A batch (a JSON array, 2025-03-26) it runs member by member, each routed
//! by its id like any request, and answers as one JSON array once every
//! member has answered (a member cancelled on the server has no answer; one
//! whose route a duplicate took leaves the batch hanging, as in the SDKs).
//!
//! The calls of the sequential poller (see [`crate::poller`]) it always
//! answers on SSE, sends progress every [`PROGRESS_EVERY`] while the tool
//! runs, and closes early every time, resumed streams too (SEP-1699
//! polling): the answer comes on some later resumption of a resumption.
//!
//! In some seeds (see [`Quirks`]) it labels answers with a `Content-Encoding`
//! that is no coding (`identity`, `identity, identity`, empty), or leads
//! bodies with a byte order mark and writes each event's `data:` first, so
//! that the mark sits before the field that carries an answer.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::TokioIo;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot};

use crate::oracle::Oracle;
use crate::respond::{json_body, json_response, status, unknown_session, Body, Dress, NO_CODINGS};
use crate::world::Quirks;

pub const PORT: u16 = 8000;

/// How often the server sends progress on a poller's stream: each resumed
/// stream carries new event ids, the next resumption goes on from there.
const PROGRESS_EVERY: Duration = Duration::from_millis(300);

/// The header of the server's `404` for a session it does not know (as
/// after a restart), which the clients answer with a new session.
pub const UNKNOWN_SESSION: &str = "x-sim-unknown-session";

/// Where the answer to a running request goes.
enum Route {
    /// The POST waiting to answer as JSON.
    Json(mpsc::UnboundedSender<Bytes>),
    /// A batch's POST, waiting for each member's answer (empty: cancelled).
    Batch(mpsc::UnboundedSender<Bytes>),
    /// An SSE stream of the session's event store.
    Stream(u64),
}

/// A request running under an id, as the session's map holds it.
struct Running {
    route: Route,
    /// Its payload marker, for the record.
    marker: String,
    /// Stops its tool (a dropped sender does not).
    cancel: oneshot::Sender<()>,
}

/// One SSE stream of a session: every event it carried, for replays.
#[derive(Default)]
struct Stream {
    /// Whole events (`id:` and `data:` lines), in order; the stream ends
    /// after its answer.
    events: Vec<Bytes>,
    answered: bool,
    /// Its request was cancelled: no answer will come.
    ended: bool,
    /// The connection reading it now, if any: each event and whether it is
    /// the answer.
    live: Option<mpsc::UnboundedSender<(Bytes, bool)>>,
    /// Every resumption of it is closed early too (the poller's calls).
    always_close: bool,
}

/// One session's requests in progress, keyed as the buggy SDKs key them.
#[derive(Default)]
struct Session {
    /// Events are written `data:` first (the fields' order is free).
    data_first: bool,
    /// The request running under each id: where its answer goes.
    routes: BTreeMap<String, Running>,
    /// Requests running under each id (the oracle wants at most one).
    running: BTreeMap<String, u32>,
    streams: BTreeMap<u64, Stream>,
    next_stream: u64,
    /// The ids of the server's own requests to the client (sampling) not
    /// yet answered: numbers from 1, like the clients' (another id space).
    asked: std::collections::BTreeSet<u64>,
    next_ask: u64,
}

impl Session {
    /// One request under `key` fewer.
    fn finished(&mut self, key: &str) {
        if let Some(running) = self.running.get_mut(key) {
            *running -= 1;
            if *running == 0 {
                self.running.remove(key);
            }
        }
    }

    /// Stream `id` will carry nothing more: its reader's body ends.
    fn end(&mut self, id: u64) {
        if let Some(stream) = self.streams.get_mut(&id) {
            stream.ended = true;
            stream.live = None;
        }
    }

    /// Appends an event to stream `id` and passes it to its reader.
    fn push(&mut self, id: u64, data: &str, answer: bool) {
        let Some(stream) = self.streams.get_mut(&id) else {
            return;
        };
        let index = stream.events.len();
        let event = Bytes::from(if self.data_first {
            format!("data: {data}\nid: {id}-{index}\nevent: message\n\n")
        } else {
            format!("id: {id}-{index}\nevent: message\ndata: {data}\n\n")
        });
        stream.events.push(event.clone());
        stream.answered |= answer;
        if let Some(live) = &stream.live {
            if live.send((event, answer)).is_err() {
                stream.live = None;
            }
        }
    }
}

struct State {
    oracle: Oracle,
    rng: StdRng,
    sessions: BTreeMap<String, Session>,
    next_session: u64,
    /// The share of SSE streams closed early for polling (SEP-1699).
    poll_rate: f64,
    /// How many times the server restarted before this run of it.
    incarnation: u32,
    quirks: Quirks,
    /// Chooses how each answer is dressed (an RNG of its own: the seeds
    /// without quirks make the choices they made before).
    dress_rng: StdRng,
}

impl State {
    fn dress(&mut self) -> Dress {
        let coding = (self.quirks.codings && self.dress_rng.random_bool(0.5))
            .then(|| NO_CODINGS[self.dress_rng.random_range(0..NO_CODINGS.len())]);
        let bom = self.quirks.bom && self.dress_rng.random_bool(0.5);
        Dress { coding, bom }
    }
}

/// The server's state: kept across its connections.
#[derive(Clone)]
pub struct Upstream(Arc<Mutex<State>>);

impl Upstream {
    /// A server that knows no session yet: the `incarnation`th start.
    pub fn new(
        seed: u64,
        oracle: Oracle,
        poll_rate: f64,
        incarnation: u32,
        quirks: Quirks,
    ) -> Self {
        Self(Arc::new(Mutex::new(State {
            oracle,
            incarnation,
            quirks,
            dress_rng: StdRng::seed_from_u64(seed ^ 0x0d2e_55ed ^ u64::from(incarnation)),
            rng: StdRng::seed_from_u64(seed ^ 0x5e4e_5e4e ^ u64::from(incarnation)),
            sessions: BTreeMap::new(),
            next_session: 0,
            poll_rate,
        })))
    }

    fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        f(&mut self.0.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Serves HTTP/1.1 on the simulated host until it is stopped.
    pub async fn serve(self) -> turmoil::Result {
        let listener = turmoil::net::TcpListener::bind(("0.0.0.0", PORT)).await?;
        loop {
            let (stream, _) = listener.accept().await?;
            let upstream = self.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |request| {
                    let upstream = upstream.clone();
                    async move { Ok::<_, Infallible>(upstream.handle(request).await) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    }

    async fn handle(&self, request: Request<Incoming>) -> Response<Body> {
        let session = request
            .headers()
            .get("mcp-session-id")
            .and_then(|value| value.to_str().ok())
            .map(str::to_owned);
        if request.method() == http::Method::GET {
            let last_event = request
                .headers()
                .get("last-event-id")
                .and_then(|value| value.to_str().ok())
                .map(str::to_owned);
            return match (session, last_event) {
                (Some(session), Some(last_event)) => self.resume(&session, &last_event),
                _ => status(StatusCode::METHOD_NOT_ALLOWED),
            };
        }
        let Ok(body) = request.into_body().collect().await else {
            return status(StatusCode::BAD_REQUEST);
        };
        let Ok(message) = serde_json::from_slice::<Value>(&body.to_bytes()) else {
            return status(StatusCode::BAD_REQUEST);
        };
        let method = message["method"].as_str().unwrap_or_default();
        if let (Some(session), Value::Array(members)) = (&session, &message) {
            if self.with(|s| s.sessions.contains_key(session)) {
                return self.batch(session, members).await;
            }
        }
        match (session, method) {
            (None, "initialize") => self.initialize(&message),
            (None, _) => status(StatusCode::BAD_REQUEST),
            (Some(session), _) if !self.with(|s| s.sessions.contains_key(&session)) => {
                unknown_session()
            }
            (Some(session), "notifications/cancelled") => self.cancel(&session, &message),
            (Some(session), "") if message.get("result").is_some() => {
                self.answered(&session, &message)
            }
            // `id: null` is no request (JSON-RPC reserves it): a notification.
            (Some(_), _) if message.get("id").is_none_or(Value::is_null) => {
                status(StatusCode::ACCEPTED)
            }
            (Some(session), "tools/call") => match self.tool_call(session, message, None) {
                Ok(response) => response,
                // As the SDKs do, the JSON answer's head goes with its body,
                // once the tool has finished; a request whose route was
                // taken hangs.
                Err((mut answer, dress)) => match answer.recv().await {
                    Some(answer) => json_body(answer, dress),
                    None => std::future::pending().await,
                },
            },
            (Some(_), _) => json_response(&json!({
                "jsonrpc": "2.0", "id": message["id"], "result": {}
            })),
        }
    }

    fn initialize(&self, message: &Value) -> Response<Body> {
        let session = self.with(|state| {
            state.next_session += 1;
            let session = format!("session-{}-{}", state.incarnation, state.next_session);
            let data_first = state.quirks.bom;
            state.sessions.insert(
                session.clone(),
                Session {
                    data_first,
                    ..Session::default()
                },
            );
            session
        });
        let mut response = json_response(&json!({
            "jsonrpc": "2.0",
            "id": message["id"],
            "result": {
                "protocolVersion": "2025-06-18",
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "sim-upstream", "version": "0"}
            }
        }));
        response
            .headers_mut()
            .insert("mcp-session-id", session.parse().expect("a valid header"));
        response
    }

    /// A batch: each request member started (a `tools/call` on its tool, any
    /// other answered at once), then the array of their answers once every
    /// one has come; notifications are taken.
    async fn batch(&self, session: &str, members: &[Value]) -> Response<Body> {
        let (route, mut answers) = mpsc::unbounded_channel();
        let mut requests = 0;
        for member in members {
            if member.get("id").is_none() {
                continue;
            }
            requests += 1;
            if member["method"] == "tools/call" {
                let _ = self.tool_call(session.to_owned(), member.clone(), Some(route.clone()));
            } else {
                let answer = json!({"jsonrpc": "2.0", "id": member["id"], "result": {}});
                let _ = route.send(Bytes::from(answer.to_string()));
            }
        }
        if requests == 0 {
            return status(StatusCode::ACCEPTED);
        }
        let mut array = Vec::new();
        for _ in 0..requests {
            match answers.recv().await {
                Some(answer) if answer.is_empty() => {}
                Some(answer) => array.push(String::from_utf8_lossy(&answer).into_owned()),
                None => std::future::pending().await,
            }
        }
        Response::builder()
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(format!("[{}]", array.join(",")))).boxed_unsync())
            .expect("a valid response")
    }

    /// The SSE response at once, or where the JSON answer will come from
    /// (`batch`: the batch's route, always JSON).
    fn tool_call(
        &self,
        session: String,
        message: Value,
        batch: Option<mpsc::UnboundedSender<Bytes>>,
    ) -> Result<Response<Body>, (mpsc::UnboundedReceiver<Bytes>, Dress)> {
        let id = message["id"].clone();
        let key = key_of(&id);
        let marker = message["params"]["arguments"]["marker"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let ms = message["params"]["arguments"]["ms"].as_u64().unwrap_or(0);
        let (cancel, cancelled) = oneshot::channel();
        let polled = crate::poller::is_polled(&marker);
        let response = self.with(|state| {
            state.oracle.server_started(&marker, &id);
            state.oracle.leak(&session, &id, true);
            let sse = (state.rng.random_bool(0.5) || polled) && batch.is_none();
            let poll = (sse && state.rng.random_bool(state.poll_rate)) || polled;
            let ask = sse && state.rng.random_bool(0.3);
            let dress = state.dress();
            let Some(entry) = state.sessions.get_mut(&session) else {
                return Ok(unknown_session());
            };
            let running = entry.running.entry(key.clone()).or_default();
            *running += 1;
            if *running > 1 {
                state.oracle.violation(format!(
                    "the server runs {running} requests under id {key} of {session} (the latest: {marker})"
                ));
            }
            let running = |route| Running {
                route,
                marker: marker.clone(),
                cancel,
            };
            if let Some(route) = batch {
                entry
                    .routes
                    .insert(key.clone(), running(Route::Batch(route)));
                return Ok(status(StatusCode::ACCEPTED));
            }
            if !sse {
                let (route, answer) = mpsc::unbounded_channel();
                // The bug: the latest request under an id takes its route.
                entry
                    .routes
                    .insert(key.clone(), running(Route::Json(route)));
                return Err((answer, dress));
            }
            entry.next_stream += 1;
            let stream = entry.next_stream;
            entry.streams.insert(
                stream,
                Stream {
                    always_close: polled,
                    ..Stream::default()
                },
            );
            entry
                .routes
                .insert(key.clone(), running(Route::Stream(stream)));
            // The priming event (an id, no data; 2025-11-25), then progress.
            entry.push(stream, "", false);
            let progress = json!({
                "jsonrpc": "2.0",
                "method": "notifications/progress",
                "params": {"progressToken": id, "progress": 0}
            });
            entry.push(stream, &progress.to_string(), false);
            if ask {
                // A request of the server's own, on the POST stream.
                entry.next_ask += 1;
                let asked = entry.next_ask;
                entry.asked.insert(asked);
                let request = json!({
                    "jsonrpc": "2.0", "id": asked, "method": "sampling/createMessage",
                    "params": {"messages": [], "maxTokens": 1, "_meta": {"for": marker}}
                });
                entry.push(stream, &request.to_string(), false);
            }
            state.oracle.note(&format!(
                "server: {marker} on stream {stream} (closing early: {poll})"
            ));
            Ok(sse_stream(entry, stream, 0, poll, dress))
        });
        let upstream = self.clone();
        let progress = (session.clone(), id.clone());
        let result = json!({
            "jsonrpc": "2.0",
            "id": id,
            "result": {"content": [{"type": "text", "text": marker}]}
        })
        .to_string();
        tokio::spawn(async move {
            let tool = async {
                if polled {
                    upstream.progress(&progress.0, &progress.1, ms).await;
                } else {
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                }
            };
            tokio::select! {
                // In order: tokio's branch choice is random (unseeded).
                biased;
                () = tool => {}
                // Cancelled (its route replaced by a duplicate drops the
                // sender instead, and the tool runs on).
                Ok(()) = cancelled => return,
            }
            upstream.with(|state| {
                state.oracle.leak(&session, &id, false);
                let Some(entry) = state.sessions.get_mut(&session) else {
                    return;
                };
                entry.finished(&key);
                // Whoever holds the route under this id now gets it.
                match entry.routes.remove(&key).map(|running| running.route) {
                    Some(Route::Json(route) | Route::Batch(route)) => {
                        let _ = route.send(Bytes::from(result));
                    }
                    Some(Route::Stream(stream)) => entry.push(stream, &result, true),
                    None => {}
                }
            });
        });
        response
    }

    /// Runs a poller's tool for `ms`, with progress on its stream every
    /// [`PROGRESS_EVERY`] (to the stream its id routes to now).
    async fn progress(&self, session: &str, id: &Value, ms: u64) {
        let end = tokio::time::Instant::now() + Duration::from_millis(ms);
        let mut step = 1;
        while tokio::time::Instant::now() + PROGRESS_EVERY < end {
            tokio::time::sleep(PROGRESS_EVERY).await;
            self.with(|state| {
                let Some(entry) = state.sessions.get_mut(session) else {
                    return;
                };
                if let Some(Running {
                    route: Route::Stream(stream),
                    ..
                }) = entry.routes.get(&key_of(id))
                {
                    let stream = *stream;
                    let progress = json!({
                        "jsonrpc": "2.0",
                        "method": "notifications/progress",
                        "params": {"progressToken": id, "progress": step}
                    });
                    entry.push(stream, &progress.to_string(), false);
                }
            });
            step += 1;
        }
        tokio::time::sleep_until(end).await;
    }

    /// A client's response to one of the server's requests: it must answer
    /// one the server sent in this session, once.
    fn answered(&self, session: &str, message: &Value) -> Response<Body> {
        self.with(|state| {
            let Some(entry) = state.sessions.get_mut(session) else {
                return unknown_session();
            };
            let known = message["id"]
                .as_u64()
                .is_some_and(|id| entry.asked.remove(&id));
            if !known {
                state.oracle.violation(format!(
                    "the server got a response to a request it did not send (or twice): {message}"
                ));
            }
            status(StatusCode::ACCEPTED)
        })
    }

    /// `notifications/cancelled`: half the time honoured, for the request
    /// running under `requestId` now (by key, like the rest); it gets no
    /// answer, its SSE stream ends and its JSON answer never comes.
    fn cancel(&self, session: &str, message: &Value) -> Response<Body> {
        let key = key_of(&message["params"]["requestId"]);
        self.with(|state| {
            if !state.rng.random_bool(0.5) {
                return;
            }
            let Some(entry) = state.sessions.get_mut(session) else {
                return;
            };
            let Some(running) = entry.routes.remove(&key) else {
                return;
            };
            entry.finished(&key);
            let _ = running.cancel.send(());
            match running.route {
                Route::Stream(stream) => entry.end(stream),
                // The batch answers without it.
                Route::Batch(route) => {
                    let _ = route.send(Bytes::new());
                }
                Route::Json(_) => {}
            }
            state.oracle.server_cancelled(&running.marker);
        });
        status(StatusCode::ACCEPTED)
    }

    /// `GET` with `Last-Event-ID`: the stream's events after that one, then
    /// the rest as they come (or closed early again, for the next poll).
    fn resume(&self, session: &str, last_event: &str) -> Response<Body> {
        self.with(|state| {
            let mut poll = state.rng.random_bool(state.poll_rate);
            let dress = state.dress();
            state.oracle.note(&format!(
                "server: GET after {last_event} (closing early: {poll})"
            ));
            let Some(entry) = state.sessions.get_mut(session) else {
                return unknown_session();
            };
            let parsed = last_event.split_once('-').and_then(|(stream, index)| {
                Some((stream.parse::<u64>().ok()?, index.parse::<usize>().ok()?))
            });
            match parsed {
                // A cancelled request's stream is forgotten.
                Some((stream, index))
                    if entry
                        .streams
                        .get(&stream)
                        .is_some_and(|stream| !stream.ended) =>
                {
                    poll |= entry.streams[&stream].always_close;
                    sse_stream(entry, stream, index + 1, poll, dress)
                }
                _ => status(StatusCode::NOT_FOUND),
            }
        })
    }
}

/// An SSE response for `stream` from its event `from` on: what is stored,
/// then (unless `poll`, or the answer is among them) what comes next, to
/// the end of the stream; dressed as `dress` says.
fn sse_stream(
    entry: &mut Session,
    stream: u64,
    from: usize,
    poll: bool,
    dress: Dress,
) -> Response<Body> {
    let Some(state) = entry.streams.get_mut(&stream) else {
        return status(StatusCode::NOT_FOUND);
    };
    let stored: Vec<Bytes> = dress
        .lead()
        .into_iter()
        .chain(state.events.get(from..).unwrap_or_default().iter().cloned())
        .collect();
    let live = if state.answered || state.ended || poll {
        None
    } else {
        let (sender, receiver) = mpsc::unbounded_channel();
        // A newer reader takes the stream over.
        state.live = Some(sender);
        Some(receiver)
    };
    let stored = futures::stream::iter(stored.into_iter().map(|event| Ok(Frame::data(event))));
    let live = futures::stream::unfold(live, |live| async move {
        let mut live = live?;
        let (event, answer) = live.recv().await?;
        Some((Ok(Frame::data(event)), (!answer).then_some(live)))
    });
    dress.apply(
        Response::builder()
            .header("content-type", "text/event-stream")
            .body(StreamBody::new(stored.chain(live)).boxed_unsync())
            .expect("a valid response"),
    )
}

/// How the SDKs key a request, all at once: python-sdk's `str(id)`, so `1`
/// and `"1"` are one key; and a number by its value, as JavaScript and rmcp
/// read it, so `1.0`, `1e0` and `1` are one, and `-0` is `0`.
fn key_of(id: &Value) -> String {
    match id {
        Value::String(text) => text.clone(),
        Value::Number(number) => match number.as_f64() {
            Some(value) if value.fract() == 0.0 && value.abs() < 9.0e15 => {
                format!("{}", value as i64)
            }
            _ => number.to_string(),
        },
        other => other.to_string(),
    }
}
