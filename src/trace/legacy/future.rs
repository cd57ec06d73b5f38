//! The response future of [`TraceService`](crate::trace::legacy::TraceService).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::Response;
use http_body::Body;
use pin_project::pin_project;

use crate::guard::Exchange;
use crate::trace::legacy::body::TracedBody;
use crate::trace::legacy::span::OpenSpan;

/// Moves the open span into the response body, where it ends; a span
/// whose response never came (the service failed, the client went away)
/// ends when this is dropped.
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
        let response = std::task::ready!(this.inner.poll(cx))?;
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
