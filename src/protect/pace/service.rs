use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response, Version};
use http_body::Body;
use tower_service::Service;

use super::body::{Pace, PacedBody, Trip};
use super::future::PaceFuture;

/// Wraps each request body in a [`PacedBody`] and answers `408` when it
/// breaks its pace before the inner service answered. Made by
/// [`BodyPaceLayer`](super::BodyPaceLayer); see the [module docs](super).
#[derive(Debug, Clone, Copy)]
pub struct BodyPace<S> {
    inner: S,
    pace: Pace,
}

impl<S> BodyPace<S> {
    pub(super) fn new(inner: S, pace: Pace) -> Self {
        Self { inner, pace }
    }

    inner_accessors!();
}

impl<S, B, ResBody> Service<Request<B>> for BodyPace<S>
where
    S: Service<Request<PacedBody<B>>, Response = Response<ResBody>>,
    B: Body,
{
    type Response = Response<crate::protect::body::ProtectedBody<ResBody>>;
    type Error = S::Error;
    type Future = PaceFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let (parts, body) = request.into_parts();
        // A body that is already complete (a GET, a `Full` one) has nothing
        // to wait for: no shared state, no timer.
        let complete = body.is_end_stream() || body.size_hint().exact() == Some(0);
        let trip = (self.pace.is_on() && !complete).then(|| Arc::new(Trip::default()));
        // HTTP/2 has no `Connection` header: its refused stream ends alone.
        let close = parts.version < Version::HTTP_2;
        let body = PacedBody::new(body, self.pace, trip.clone());
        let future = self.inner.call(Request::from_parts(parts, body));
        PaceFuture::new(future, trip, self.pace, close)
    }
}
