use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http::header::{HeaderValue, CONNECTION};
use http::{Request, Response};
use http_body::Body;
use http_body_util::Full;
use pin_project::pin_project;
use tower_service::Service;

use super::budget::{Charge, Over};
use crate::protect::body::ProtectedBody;
use crate::protect::refused::{refusal, Refused};
use crate::wire::answer;

/// The response future of [`BodyBuffer`](super::BodyBuffer): reads the
/// body, then the inner service's response; or the refusal.
#[pin_project]
pub struct BufferFuture<S, B>
where
    S: Service<Request<Full<Bytes>>>,
{
    #[pin]
    state: State<S, B>,
}

#[pin_project(project = StateProj)]
enum State<S, B>
where
    S: Service<Request<Full<Bytes>>>,
{
    Reading {
        #[pin]
        body: B,
        /// Taken when the body is complete.
        parts: Option<http::request::Parts>,
        service: Option<S>,
        /// Its capacity is what the charge holds.
        read: Vec<u8>,
        charge: Option<Charge>,
        /// The most `read` may need: the `Content-Length`, or the cap.
        expected: usize,
        /// The `Content-Length`, if the body has one: reaching it completes
        /// the body.
        exact: Option<usize>,
        max_body_bytes: usize,
        close: bool,
    },
    Called {
        #[pin]
        future: S::Future,
        /// Held until the inner service has answered.
        charge: Option<Charge>,
    },
    Refused {
        /// Taken when the future resolves.
        answer: Option<Response<Full<Bytes>>>,
        kind: Refused,
    },
}

impl<S, B> std::fmt::Debug for BufferFuture<S, B>
where
    S: Service<Request<Full<Bytes>>>,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BufferFuture").finish_non_exhaustive()
    }
}

/// The refusal for a body over `over`.
fn refused_answer(
    over: Over,
    max_body_bytes: usize,
    close: bool,
) -> (Refused, Response<Full<Bytes>>) {
    let (kind, mut response) = match over {
        Over::Size => (
            Refused::BodyTooLarge,
            answer::body_too_large(max_body_bytes),
        ),
        Over::Budget => (Refused::BodyBudget, answer::body_budget_spent()),
    };
    if close {
        // The rest of the body is still on its way: the connection cannot
        // carry another request.
        response
            .headers_mut()
            .insert(CONNECTION, HeaderValue::from_static("close"));
    }
    (kind, response)
}

impl<S, B> BufferFuture<S, B>
where
    S: Service<Request<Full<Bytes>>>,
{
    pub(super) fn called(future: S::Future, charge: Option<Charge>) -> Self {
        Self {
            state: State::Called { future, charge },
        }
    }

    pub(super) fn refused(over: Over, max_body_bytes: usize, close: bool) -> Self {
        let (kind, answer) = refused_answer(over, max_body_bytes, close);
        Self {
            state: State::Refused {
                answer: Some(answer),
                kind,
            },
        }
    }

    /// Reads `body` (of at most `expected` bytes, by its `Content-Length`
    /// or the cap), charged to `charge` as it arrives, then calls `service`
    /// with it.
    pub(super) fn reading(
        (parts, body): (http::request::Parts, B),
        service: S,
        charge: Charge,
        (expected, exact): (usize, Option<usize>),
        max_body_bytes: usize,
        close: bool,
    ) -> Self {
        Self {
            state: State::Reading {
                body,
                parts: Some(parts),
                service: Some(service),
                // Nothing is allocated (or charged) before bytes arrive.
                read: Vec::new(),
                charge: Some(charge),
                expected,
                exact,
                max_body_bytes,
                close,
            },
        }
    }
}

/// Makes room in `read` for `size` bytes, charged first: the capacity
/// doubles (fewer copies) within what the body may need and, while the body
/// is small, within the small size; or grows exactly if the budget has no
/// room for the doubling.
///
/// `complete`: these are the body's last bytes. Then exactly what is needed
/// is charged (no more will come), and a small body moves into the reserve.
fn make_room(
    read: &mut Vec<u8>,
    size: usize,
    expected: usize,
    charge: &mut Charge,
    complete: bool,
) -> Result<(), Over> {
    if size <= read.capacity() {
        // Nothing more to hold; a completed body may still move into the
        // reserve (which frees room elsewhere, so it cannot fail).
        return if complete {
            charge.grow_to(charge.held(), true)
        } else {
            Ok(())
        };
    }
    let mut capacity = read.capacity().saturating_mul(2).min(expected);
    if size <= charge.small_body_bytes() || complete {
        capacity = capacity.min(charge.small_body_bytes());
    }
    if complete {
        capacity = size;
    }
    let capacity = capacity.max(size);
    let capacity = match charge.grow_to(capacity, complete) {
        Ok(()) => capacity,
        Err(_) => charge.grow_to(size, complete).map(|()| size)?,
    };
    read.reserve_exact(capacity - read.len());
    Ok(())
}

impl<S, B, ResBody> Future for BufferFuture<S, B>
where
    S: Service<Request<Full<Bytes>>, Response = Response<ResBody>>,
    B: Body<Data = Bytes>,
{
    type Output = Result<Response<ProtectedBody<ResBody>>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            let next = match this.state.as_mut().project() {
                StateProj::Called { future, charge } => {
                    let result = ready!(future.poll(cx));
                    // The inner service has answered: it no longer needs the
                    // body's bytes.
                    charge.take();
                    return Poll::Ready(result.map(|response| response.map(ProtectedBody::inner)));
                }
                StateProj::Refused { answer, kind } => {
                    let answer = answer.take().expect("polled after completion");
                    return Poll::Ready(Ok(refusal(*kind, answer)));
                }
                StateProj::Reading {
                    mut body,
                    parts,
                    service,
                    read,
                    charge,
                    expected,
                    exact,
                    max_body_bytes,
                    close,
                } => loop {
                    match ready!(body.as_mut().poll_frame(cx)) {
                        Some(Ok(frame)) => {
                            let Ok(data) = frame.into_data() else {
                                // Trailers: MCP has none to pass on.
                                continue;
                            };
                            let size = read.len().saturating_add(data.len());
                            // The last bytes: the body says so, or its
                            // `Content-Length` is reached.
                            let complete = body.is_end_stream() || Some(size) == *exact;
                            let over = if size > *max_body_bytes {
                                Some(Over::Size)
                            } else {
                                charge.as_mut().and_then(|charge| {
                                    make_room(read, size, *expected, charge, complete).err()
                                })
                            };
                            if let Some(over) = over {
                                let (kind, answer) = refused_answer(over, *max_body_bytes, *close);
                                break State::Refused {
                                    answer: Some(answer),
                                    kind,
                                };
                            }
                            read.extend_from_slice(&data);
                        }
                        Some(Err(_)) => {
                            // The client went away, or a pace layer outside
                            // cut the body (and answers for it itself).
                            let mut answer = answer::body_unreadable();
                            if *close {
                                answer
                                    .headers_mut()
                                    .insert(CONNECTION, HeaderValue::from_static("close"));
                            }
                            return Poll::Ready(Ok(answer.map(ProtectedBody::refusal)));
                        }
                        None => {
                            let parts = parts.take().expect("polled after completion");
                            let mut service = service.take().expect("polled after completion");
                            let body = Full::new(Bytes::from(std::mem::take(read)));
                            let future = service.call(Request::from_parts(parts, body));
                            break State::Called {
                                future,
                                charge: charge.take(),
                            };
                        }
                    }
                },
            };
            this.state.set(next);
        }
    }
}
