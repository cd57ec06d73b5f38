//! The response future of [`MetricsService`](super::MetricsService).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use http::Response;
use pin_project::pin_project;

use super::Metrics;

/// Records the response when the inner service gives it (its headers: the
/// body may stream for long after).
#[pin_project]
#[derive(Debug)]
pub struct MetricsFuture<F> {
    #[pin]
    inner: F,
    metrics: Metrics,
    started: Instant,
    /// How many tool names may have series of their own.
    tool_names: usize,
}

impl<F> MetricsFuture<F> {
    pub(super) fn new(inner: F, metrics: Metrics, started: Instant, tool_names: usize) -> Self {
        Self {
            inner,
            metrics,
            started,
            tool_names,
        }
    }
}

impl<F, R, E> Future for MetricsFuture<F>
where
    F: Future<Output = Result<Response<R>, E>>,
{
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let output = std::task::ready!(this.inner.poll(cx));
        // A failed service gave no response: whoever turns the error into
        // one (hyper closes the stream) is outside this layer.
        if let Ok(response) = &output {
            this.metrics
                .answered(response, this.started.elapsed(), *this.tool_names);
        }
        Poll::Ready(output)
    }
}
