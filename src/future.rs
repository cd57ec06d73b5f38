use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::{Buf, Bytes};
use http::header::{CONTENT_LENGTH, CONTENT_TYPE};
use http::{HeaderMap, Request, Response};
use http_body::Body;
use http_body_util::Full;
use pin_project::pin_project;
use tower_service::Service;

use crate::body::{Accumulated, RequestBody, ResponseBody};
use crate::layer::Config;
use crate::service::{
    body_too_large, body_unreadable, prepare, queue_timeout, PendingForward, Prepared,
};
use crate::table::{InFlight, Table, Waiter};

/// Response future of [`IdGuard`](crate::IdGuard).
///
/// For a tracked POST it first reads the body (up to the configured limit),
/// registers the request's ids, then calls the inner service; the registration
/// travels on into the [`ResponseBody`].
#[pin_project]
pub struct ResponseFuture<S, B>
where
    S: Service<Request<RequestBody<B>>>,
{
    #[pin]
    state: State<S, B>,
}

// The future is allocated once per request and then stays put (servers box
// it), so the size of the largest state costs nothing worth a second
// allocation on the hot path.
#[allow(clippy::large_enum_variant)]
#[pin_project(project = StateProj)]
enum State<S, B>
where
    S: Service<Request<RequestBody<B>>>,
{
    /// Reading a tracked POST's body with the readied inner service in hand.
    Reading {
        #[pin]
        body: B,
        read: ReadBody<S>,
    },
    /// Waiting for the id under `OnDuplicate::Queue`.
    Queued {
        service: Option<S>,
        pending: Option<PendingForward>,
        in_flight: Option<InFlight>,
        ticket: Arc<Waiter>,
        /// Started at the first poll, inside the server's runtime.
        deadline: Option<Pin<Box<tokio::time::Sleep>>>,
        max_wait: Duration,
    },
    /// Waiting for the inner service's response.
    Calling {
        #[pin]
        future: S::Future,
        in_flight: Option<InFlight>,
        /// Restore client ids in the response, counting them in this table.
        restore: Option<Arc<Table>>,
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
    trailers: Option<HeaderMap>,
    config: Config,
    table: Arc<Table>,
}

impl<S, B> ResponseFuture<S, B>
where
    S: Service<Request<RequestBody<B>>>,
{
    pub(crate) fn called(future: S::Future, restore: Option<Arc<Table>>) -> Self {
        Self {
            state: State::Calling {
                future,
                in_flight: None,
                restore,
            },
        }
    }

    pub(crate) fn answered(response: Response<Full<Bytes>>) -> Self {
        Self {
            state: State::Answered {
                response: Some(response),
            },
        }
    }

    pub(crate) fn reading(
        service: S,
        request: Request<B>,
        config: Config,
        table: Arc<Table>,
    ) -> Self {
        let (parts, body) = request.into_parts();
        Self {
            state: State::Reading {
                body,
                read: ReadBody {
                    service: Some(service),
                    parts: Some(parts),
                    buffer: Accumulated::default(),
                    trailers: None,
                    config,
                    table,
                },
            },
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
            let next = match self.as_mut().project().state.project() {
                StateProj::Reading { mut body, read } => {
                    let limit = read.config.max_body_bytes;
                    let finished = loop {
                        match ready!(body.as_mut().poll_frame(cx)) {
                            Some(Ok(frame)) => match frame.into_data() {
                                Ok(mut data) => {
                                    if read.buffer.len() + data.remaining() > limit {
                                        break Err(body_too_large(limit));
                                    }
                                    read.buffer.push(data.copy_to_bytes(data.remaining()));
                                }
                                Err(frame) => read.trailers = frame.into_trailers().ok(),
                            },
                            Some(Err(_)) => break Err(body_unreadable()),
                            None => break Ok(()),
                        }
                    };
                    match (finished, read.parts.take(), read.service.take()) {
                        (Ok(()), Some(parts), Some(mut service)) => {
                            let bytes = std::mem::take(&mut read.buffer).into_bytes();
                            match prepare(
                                parts,
                                bytes,
                                read.trailers.take(),
                                &read.config,
                                &read.table,
                            ) {
                                Prepared::Forward {
                                    request,
                                    in_flight,
                                    restore,
                                } => State::Calling {
                                    future: service.call(request),
                                    in_flight,
                                    restore: restore.then(|| Arc::clone(&read.table)),
                                },
                                Prepared::Queue {
                                    pending,
                                    in_flight,
                                    ticket,
                                } => State::Queued {
                                    service: Some(service),
                                    pending: Some(pending),
                                    in_flight: Some(in_flight),
                                    ticket,
                                    deadline: None,
                                    max_wait: read.config.max_queue_wait,
                                },
                                Prepared::Answer(response) => State::Answered {
                                    response: Some(response),
                                },
                            }
                        }
                        (Err(response), _, _) => State::Answered {
                            response: Some(response),
                        },
                        // Parts and service are taken only here, right before
                        // leaving this state, so they are always present.
                        _ => unreachable!("ResponseFuture polled after completion"),
                    }
                }
                StateProj::Queued {
                    service,
                    pending,
                    in_flight,
                    ticket,
                    deadline,
                    max_wait,
                } => match ticket.poll_turn(cx) {
                    Poll::Ready(server_id) => {
                        match (service.take(), pending.take(), in_flight.take()) {
                            (Some(mut service), Some(pending), Some(in_flight)) => {
                                let restore =
                                    server_id.is_some().then(|| Arc::clone(in_flight.table()));
                                let future =
                                    service.call(pending.into_request(server_id.as_deref()));
                                in_flight.forwarded();
                                State::Calling {
                                    future,
                                    in_flight: Some(in_flight),
                                    restore,
                                }
                            }
                            _ => unreachable!("ResponseFuture polled after completion"),
                        }
                    }
                    Poll::Pending => {
                        let deadline =
                            deadline.get_or_insert_with(|| Box::pin(tokio::time::sleep(*max_wait)));
                        ready!(deadline.as_mut().poll(cx));
                        // Leaving the queue: dropping the registration takes
                        // the request out of line.
                        in_flight.take();
                        let id = pending.as_ref().map_or("null", PendingForward::queued_id);
                        State::Answered {
                            response: Some(queue_timeout(id)),
                        }
                    }
                },
                StateProj::Calling {
                    future,
                    in_flight,
                    restore,
                } => {
                    let response = match ready!(future.poll(cx)) {
                        Ok(response) => response,
                        Err(error) => {
                            in_flight.take();
                            return Poll::Ready(Err(error));
                        }
                    };
                    return Poll::Ready(Ok(wrap_response(
                        response,
                        in_flight.take(),
                        restore.take(),
                    )));
                }
                StateProj::Answered { response } => {
                    let response = response
                        .take()
                        .expect("ResponseFuture polled after completion");
                    return Poll::Ready(Ok(response.map(ResponseBody::guard)));
                }
            };
            self.as_mut().project().state.set(next);
        }
    }
}

/// Moves the registration into the response body, choosing how the body is
/// rewritten when the request carried a server-side id.
fn wrap_response<B: Body>(
    response: Response<B>,
    in_flight: Option<InFlight>,
    restore: Option<Arc<Table>>,
) -> Response<ResponseBody<B>> {
    let (mut parts, body) = response.into_parts();
    let media_type = parts
        .headers
        .get(CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .map(media_type);
    // Under Reject and Queue an event stream is also watched for the
    // responses, so the ids are free as soon as the client has them, even if
    // the server keeps the stream open a little longer.
    let awaited = in_flight
        .as_ref()
        .map(InFlight::awaited_keys)
        .unwrap_or_default();
    let is = |expected: &str| media_type.is_some_and(|media| media.eq_ignore_ascii_case(expected));
    let body = match restore {
        Some(table) if is("application/json") => {
            parts.headers.remove(CONTENT_LENGTH);
            ResponseBody::restore_json(body, in_flight, table)
        }
        Some(table) if is("text/event-stream") => {
            parts.headers.remove(CONTENT_LENGTH);
            ResponseBody::restore_sse(body, in_flight, table, awaited)
        }
        None if is("text/event-stream") && !awaited.is_empty() => {
            let table = in_flight.as_ref().map(|guard| Arc::clone(guard.table()));
            match table {
                Some(table) => ResponseBody::restore_sse(body, in_flight, table, awaited),
                None => ResponseBody::inner(body, in_flight),
            }
        }
        _ => ResponseBody::inner(body, in_flight),
    };
    Response::from_parts(parts, body)
}

/// The media type of a `Content-Type` value, without parameters.
pub(crate) fn media_type(value: &str) -> &str {
    value.split(';').next().unwrap_or_default().trim()
}
