//! [`TracedBody`]: the response body that ends the span.

use std::pin::Pin;
use std::task::{Context, Poll};

use http_body::{Body, Frame, SizeHint};
use pin_project::pin_project;

use crate::trace::span::OpenSpan;

/// The inner response body, unchanged; the POST's span ends when it ends
/// (the answer went out), fails or is dropped before its end (the answer
/// did not: status `ERROR`). For an answer streamed as server-sent events
/// the span covers the stream.
#[pin_project]
#[derive(Debug, Default)]
pub struct TracedBody<B> {
    #[pin]
    inner: B,
    span: Option<OpenSpan>,
}

impl<B: Body> TracedBody<B> {
    pub(crate) fn new(inner: B, span: Option<OpenSpan>) -> Self {
        let mut body = Self { inner, span };
        // An empty body (a `202` to a notification) is done at once.
        if body.inner.is_end_stream() {
            body.end(true);
        }
        body
    }
}

impl<B> TracedBody<B> {
    /// Ends the span now (it is exported as it drops).
    fn end(&mut self, complete: bool) {
        end(&mut self.span, complete);
    }
}

fn end(span: &mut Option<OpenSpan>, complete: bool) {
    if let Some(mut span) = span.take() {
        if complete {
            span.completed();
        }
    }
}

impl<B: Body> Body for TracedBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let mut this = self.project();
        // Inside the span: what the guard logs as the answer passes (ids
        // restored, released) belongs to this exchange.
        let entered = this.span.as_ref().map(|open| open.span.enter());
        let frame = this.inner.as_mut().poll_frame(cx);
        drop(entered);
        let frame = std::task::ready!(frame);
        match &frame {
            None => end(this.span, true),
            Some(Err(_)) => end(this.span, false),
            Some(Ok(_)) if this.inner.is_end_stream() => end(this.span, true),
            Some(Ok(_)) => {}
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
