use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::{Buf, Bytes};
use http::{HeaderMap, Request, Response};
use http_body::Body;
use http_body_util::Full;
use pin_project::pin_project;
use tower_service::Service;

use crate::guard::admit::{admit, Admission, PendingForward};
use crate::guard::body::{Accumulated, RequestBody, ResponseBody, Restoring};
use crate::guard::exchange::{Exchange, GuardDecision};
use crate::table::config::Config;
use crate::table::{Registration, Table, Waiter};
use crate::wire::answer::{body_too_large, body_unreadable, queue_timeout};
use crate::wire::method::McpMethod;
use crate::wire::protocol::{RequestHeaders, MCP_SESSION_ID};

/// Response future of [`IdGuard`](crate::IdGuard).
///
/// For a tracked POST it first reads the body (up to the configured limit),
/// registers the request's ids, then calls the inner service; the registration
/// travels on into the [`ResponseBody`]. The response to a POST carries an
/// [`Exchange`].
#[pin_project]
pub struct ResponseFuture<S, B>
where
    S: Service<Request<RequestBody<B>>>,
{
    #[pin]
    state: State<S, B>,
    /// What became of the POST's messages, for the response's extensions
    /// (empty: none to add).
    exchange: Exchange,
    /// A layer outside asked for the [`Exchange`]
    /// ([`WantsExchange`](crate::exchange::WantsExchange)).
    record: bool,
}

// Tower stacks move a future several times before a server pins it, each
// move a copy of its largest state: the states of a tracked POST that only
// some requests reach (reading, queued, an `initialize` in the restart
// window) are boxed, so an untracked request's future stays small.
#[pin_project(project = StateProj)]
enum State<S, B>
where
    S: Service<Request<RequestBody<B>>>,
{
    /// Reading a tracked POST's body with the readied inner service in hand.
    Reading {
        #[pin]
        body: B,
        read: Box<ReadBody<S>>,
    },
    /// Waiting for the id under `OnDuplicate::Queue`.
    Queued { queued: Box<Queued<S>> },
    /// Waiting for the inner service's response.
    Calling {
        #[pin]
        future: S::Future,
        registration: Option<Registration>,
        /// How to read the response: for the responses the registration
        /// waits for, and to restore client ids.
        restore: Option<Restoring>,
        /// The request is an `initialize`: record the session its answer
        /// starts in this table.
        starts: Option<Box<(Arc<Table>, Config)>>,
    },
    /// A response the guard gives itself.
    Answered {
        response: Option<Response<Full<Bytes>>>,
    },
}

/// What the reading state holds besides the body.
struct ReadBody<S> {
    service: Option<S>,
    parts: Option<http::request::Parts>,
    buffer: Accumulated,
    trailers: Option<Box<HeaderMap>>,
    /// The request's headers as the service read them.
    headers: RequestHeaders,
    config: Config,
    table: Arc<Table>,
    /// A POST without a session read only to see whether it is an
    /// `initialize` (during the restart window).
    watch_start: bool,
}

/// A request waiting for its id under `OnDuplicate::Queue`.
struct Queued<S> {
    service: Option<S>,
    pending: Option<PendingForward>,
    registration: Option<Registration>,
    ticket: Arc<Waiter>,
    /// Started at the first poll, inside the server's runtime.
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
    max_wait: Duration,
    /// The longest id a client could have sent.
    max_id: usize,
    /// The session, whose ids the response restores.
    session: Option<http::HeaderValue>,
}

impl<S, B> ResponseFuture<S, B>
where
    S: Service<Request<RequestBody<B>>>,
{
    /// Calls the inner service; `exchange` goes on the response when
    /// `record` (a layer outside reads the [`Exchange`]).
    pub(crate) fn called(
        future: S::Future,
        restore: Option<Restoring>,
        exchange: Exchange,
        record: bool,
    ) -> Self {
        Self {
            state: State::Calling {
                future,
                registration: None,
                restore,
                starts: None,
            },
            exchange,
            record,
        }
    }

    /// Answers in the server's place; `exchange` as for
    /// [`called`](Self::called).
    pub(crate) fn answered(
        response: Response<Full<Bytes>>,
        exchange: Exchange,
        record: bool,
    ) -> Self {
        Self {
            state: State::Answered {
                response: Some(response),
            },
            exchange,
            record,
        }
    }

    /// Reads a POST's body first. `watch_start`: a POST without a session
    /// that may be an `initialize`, forwarded untouched; the session its
    /// answer starts is recorded.
    pub(crate) fn reading(
        service: S,
        request: Request<B>,
        headers: RequestHeaders,
        config: Config,
        table: Arc<Table>,
        watch_start: bool,
        record: bool,
    ) -> Self {
        let (parts, body) = request.into_parts();
        Self {
            state: State::Reading {
                body,
                read: Box::new(ReadBody {
                    service: Some(service),
                    parts: Some(parts),
                    buffer: Accumulated::default(),
                    trailers: None,
                    headers,
                    config,
                    table,
                    watch_start,
                }),
            },
            exchange: Exchange::default(),
            record,
        }
    }
}

impl<S, B, ResBody> Future for ResponseFuture<S, B>
where
    S: Service<Request<RequestBody<B>>, Response = Response<ResBody>>,
    B: Body,
    ResBody: Body,
{
    type Output = Result<Response<ResponseBody<ResBody>>, S::Error>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        loop {
            let this = self.as_mut().project();
            let next = match this.state.project() {
                StateProj::Reading { body, read } => {
                    ready!(read.poll_read(body, cx, this.exchange, *this.record))
                }
                StateProj::Queued { queued } => ready!(queued.poll_turn(cx)),
                StateProj::Calling {
                    future,
                    registration,
                    restore,
                    starts,
                } => {
                    let response = match ready!(future.poll(cx)) {
                        Ok(response) => response,
                        Err(error) => {
                            registration.take();
                            return Poll::Ready(Err(error));
                        }
                    };
                    if let Some(starts) = starts.take() {
                        let (table, config) = &*starts;
                        note_started(&response, table, config);
                    }
                    if *this.record && opens_session(&response) {
                        this.exchange.opened_session();
                    }
                    let response =
                        ResponseBody::wrap(response, registration.take(), restore.take());
                    return Poll::Ready(Ok(with_exchange(response, this.exchange, *this.record)));
                }
                StateProj::Answered { response } => {
                    let response = response
                        .take()
                        .expect("ResponseFuture polled after completion");
                    let response = response.map(ResponseBody::answer);
                    return Poll::Ready(Ok(with_exchange(response, this.exchange, *this.record)));
                }
            };
            self.as_mut().project().state.set(next);
        }
    }
}

impl<S> ReadBody<S> {
    /// Reads the body to its end (or its limit), then decides.
    fn poll_read<B>(
        &mut self,
        mut body: Pin<&mut B>,
        cx: &mut Context<'_>,
        exchange: &mut Exchange,
        record: bool,
    ) -> Poll<State<S, B>>
    where
        S: Service<Request<RequestBody<B>>>,
        B: Body,
    {
        let limit = self.config.max_body_bytes;
        let finished = loop {
            match ready!(body.as_mut().poll_frame(cx)) {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(mut data) => {
                        let data = data.copy_to_bytes(data.remaining());
                        if let Some(response) = read_chunk(&mut self.buffer, data, limit) {
                            break Err(response);
                        }
                    }
                    Err(frame) => self.trailers = frame.into_trailers().ok().map(Box::new),
                },
                Some(Err(_)) => break Err(body_unreadable()),
                None => break Ok(()),
            }
        };
        Poll::Ready(match finished {
            Ok(()) => self.decide(exchange, record),
            Err(response) => {
                *exchange = Exchange::one(McpMethod::Other, GuardDecision::Refused);
                State::Answered {
                    response: Some(response),
                }
            }
        })
    }

    /// Asks the table about the read body: the state the future goes on in.
    fn decide<B>(&mut self, exchange: &mut Exchange, record: bool) -> State<S, B>
    where
        S: Service<Request<RequestBody<B>>>,
    {
        // Parts and service are taken only here, right before leaving the
        // reading state, so they are always present.
        let (Some(parts), Some(mut service)) = (self.parts.take(), self.service.take()) else {
            unreachable!("ResponseFuture polled after completion")
        };
        let bytes = std::mem::take(&mut self.buffer).into_bytes();
        let starts = self.watch_start && is_initialize(&bytes);
        let admission = admit(
            PendingForward::new(parts, bytes, self.trailers.take()),
            &self.headers,
            &self.config,
            &self.table,
            exchange,
            record,
        );
        match admission {
            Admission::Forward {
                request,
                registration,
                restore,
            } => State::Calling {
                future: service.call(request),
                restore: restoring(
                    restore,
                    registration.as_ref(),
                    &self.headers,
                    &self.config,
                    &self.table,
                ),
                registration,
                starts: starts.then(|| Box::new((Arc::clone(&self.table), self.config))),
            },
            Admission::Queue {
                pending,
                registration,
                ticket,
            } => State::Queued {
                queued: Box::new(Queued {
                    service: Some(service),
                    pending: Some(pending),
                    registration: Some(registration),
                    ticket,
                    deadline: None,
                    max_wait: self.config.max_queue_wait,
                    max_id: self.config.max_body_bytes,
                    session: self.headers.session.clone(),
                }),
            },
            Admission::Answer(response) => State::Answered {
                response: Some(response),
            },
        }
    }
}

/// Takes a chunk of a tracked POST's body, within `limit`: past it, the
/// guard's answer (and the chunk is not kept).
pub(crate) fn read_chunk(
    buffer: &mut Accumulated,
    data: Bytes,
    limit: usize,
) -> Option<Response<Full<Bytes>>> {
    if buffer.len() + data.len() > limit {
        return Some(body_too_large(limit));
    }
    buffer.push(data);
    None
}

/// How the response to a forwarded read POST is read (`None`: it passes as
/// it is): for the responses `registration` waits for, and to restore
/// client ids where the request carried server-side ones (`restore`).
pub(crate) fn restoring(
    restore: bool,
    registration: Option<&Registration>,
    headers: &RequestHeaders,
    config: &Config,
    table: &Arc<Table>,
) -> Option<Restoring> {
    (restore || registration.is_some()).then(|| Restoring {
        table: Arc::clone(table),
        max_id: config.max_body_bytes,
        restore,
        session: headers.session.clone(),
        resumes: None,
    })
}

/// A queued request's turn came (`server_id`: with a server-side id): the
/// request to forward, and how to read its response.
pub(crate) fn turn<B>(
    pending: PendingForward,
    registration: &mut Registration,
    server_id: Option<Arc<[u8]>>,
    max_id: usize,
    session: Option<http::HeaderValue>,
) -> (Request<RequestBody<B>>, Restoring) {
    let remapped = server_id.is_some();
    let restoring = Restoring {
        table: Arc::clone(registration.table()),
        max_id,
        restore: remapped,
        session,
        resumes: None,
    };
    let request = pending.into_request(server_id);
    registration.forwarded(remapped);
    (request, restoring)
}

/// A queued request waited past its deadline: the guard's `503`. The
/// caller drops the registration first, which takes it out of line.
pub(crate) fn timed_out(pending: Option<&PendingForward>) -> Response<Full<Bytes>> {
    queue_timeout(pending.map_or("null", PendingForward::queued_id))
}

impl<S> Queued<S> {
    /// Waits for the request's turn (then forwards it) or for the deadline
    /// (then answers `503`).
    fn poll_turn<B>(&mut self, cx: &mut Context<'_>) -> Poll<State<S, B>>
    where
        S: Service<Request<RequestBody<B>>>,
    {
        if let Poll::Ready(server_id) = self.ticket.poll_turn(cx) {
            let (Some(mut service), Some(pending), Some(mut registration)) = (
                self.service.take(),
                self.pending.take(),
                self.registration.take(),
            ) else {
                unreachable!("ResponseFuture polled after completion")
            };
            let (request, restoring) = turn(
                pending,
                &mut registration,
                server_id,
                self.max_id,
                self.session.take(),
            );
            return Poll::Ready(State::Calling {
                future: service.call(request),
                registration: Some(registration),
                restore: Some(restoring),
                starts: None,
            });
        }
        let max_wait = self.max_wait;
        let deadline = self
            .deadline
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(max_wait)));
        ready!(deadline.as_mut().poll(cx));
        // Leaving the queue: dropping the registration takes the request out
        // of line.
        self.registration.take();
        Poll::Ready(State::Answered {
            response: Some(timed_out(self.pending.as_ref())),
        })
    }
}

/// Puts the guard's account of the POST on its response when a layer
/// outside asked for it, unless there is none (not a POST).
fn with_exchange<B>(
    mut response: Response<B>,
    exchange: &mut Exchange,
    record: bool,
) -> Response<B> {
    if record && !exchange.is_empty() {
        response.extensions_mut().insert(std::mem::take(exchange));
    }
    response
}

/// Whether a response starts a session: a success carrying
/// `Mcp-Session-Id` (to a POST without one, only an `initialize` answer).
fn opens_session<B>(response: &Response<B>) -> bool {
    response.status().is_success() && response.headers().contains_key(&MCP_SESSION_ID)
}

/// Records the session an `initialize`'s successful answer starts.
pub(crate) fn note_started<B>(response: &Response<B>, table: &Table, config: &Config) {
    let session = response.headers().get(&MCP_SESSION_ID);
    if let Some(session) = session.filter(|_| response.status().is_success()) {
        table.note_started(session.as_bytes(), config);
    }
}

/// Whether a body is an `initialize` request: an object whose `method` is
/// `"initialize"`. Bodies serde cannot read that way (a batch, duplicate
/// keys) do not count: their session is then treated as unseen, the safe
/// side.
pub(crate) fn is_initialize(body: &[u8]) -> bool {
    #[derive(serde::Deserialize)]
    struct Method<'a> {
        #[serde(borrow, default)]
        method: Option<std::borrow::Cow<'a, str>>,
    }
    serde_json::from_slice::<Method<'_>>(body)
        .is_ok_and(|message| message.method.as_deref() == Some("initialize"))
}

#[cfg(test)]
mod tests {
    use super::is_initialize;

    #[test]
    fn only_an_initialize_object_counts() {
        assert!(is_initialize(
            br#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"x":[1,{"method":"y"}]}}"#
        ));
        assert!(is_initialize(br#"{"method":"initiali\u007ae","id":0}"#));
        assert!(!is_initialize(br#"{"method":"tools/list","id":0}"#));
        assert!(!is_initialize(br#"[{"method":"initialize","id":0}]"#));
        assert!(!is_initialize(
            br#"{"method":"initialize","method":"initialize","id":0}"#
        ));
        assert!(!is_initialize(b"not json"));
    }
}
