//! The response future of [`McpTrace`](crate::trace::McpTrace).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::Response;
use http_body::Body;
use pin_project::pin_project;

use crate::guard::Exchange;
use crate::trace::body::TracedBody;
use crate::trace::span::OpenSpan;

/// Polls the inner service inside the guard's span (so that what the
/// service records in this task is its child), then moves the open span
/// into the response body, where it ends; a span whose response never came
/// (the service failed, the client went away) ends when this is dropped.
#[pin_project]
#[derive(Debug)]
pub struct TraceFuture<F> {
    #[pin]
    inner: F,
    span: Option<OpenSpan>,
}

impl<F> TraceFuture<F> {
    pub(crate) fn new(inner: F, span: Option<OpenSpan>) -> Self {
        Self { inner, span }
    }
}

impl<F, R, E> Future for TraceFuture<F>
where
    F: Future<Output = Result<Response<R>, E>>,
    R: Body,
{
    type Output = Result<Response<TracedBody<R>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let entered = this.span.as_ref().map(|open| open.span.enter());
        let response = this.inner.poll(cx);
        drop(entered);
        let response = std::task::ready!(response)?;
        let mut span = this.span.take();
        if let Some(span) = &mut span {
            span.responded(
                response.status(),
                response.extensions().get::<Exchange>().cloned(),
            );
        }
        Poll::Ready(Ok(response.map(|body| TracedBody::new(body, span))))
    }
}
