use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use http::header::{HeaderValue, CONNECTION};
use http::Response;
use pin_project::pin_project;

use super::body::{Pace, Trip};
use crate::protect::body::ProtectedBody;
use crate::protect::refused::{refusal, Refused};
use crate::wire::answer;

/// The response future of [`BodyPace`](super::BodyPace): the inner
/// service's response, or `408` when the body broke its pace before it.
#[pin_project]
#[derive(Debug)]
pub struct PaceFuture<F> {
    #[pin]
    future: F,
    trip: Option<Arc<Trip>>,
    pace: Pace,
    /// Ask hyper to close the (HTTP/1) connection after a `408`.
    close: bool,
}

impl<F> PaceFuture<F> {
    pub(super) fn new(future: F, trip: Option<Arc<Trip>>, pace: Pace, close: bool) -> Self {
        Self {
            future,
            trip,
            pace,
            close,
        }
    }
}

impl<F, B, E> Future for PaceFuture<F>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    type Output = Result<Response<ProtectedBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        // The inner service answers once the body's error reached it (with
        // its own idea of a failed read: 400, 502, an error); the client is
        // told what really happened instead.
        let result = ready!(this.future.poll(cx));
        let Some(kind) = this.trip.as_ref().and_then(|trip| trip.get()) else {
            return Poll::Ready(result.map(|response| response.map(ProtectedBody::inner)));
        };
        let answer = match (kind, this.pace.idle_timeout) {
            (Refused::BodyIdle, Some(limit)) => answer::body_idle(limit),
            _ => answer::body_slow(this.pace.min_rate),
        };
        let mut response = refusal(kind, answer);
        if *this.close {
            // The rest of the body is still on its way: the connection
            // cannot carry another request.
            response
                .headers_mut()
                .insert(CONNECTION, HeaderValue::from_static("close"));
        }
        Poll::Ready(Ok(response))
    }
}
