//! [`MetricsLayer`] and the service it wraps around another.

use std::task::{Context, Poll};
use std::time::Instant;

use http::{Request, Response};
use tower_layer::Layer;
use tower_service::Service;

use super::future::MetricsFuture;
use super::Metrics;

/// Records every response of the service it wraps into a [`Metrics`]; see
/// the [module docs](super).
#[derive(Debug, Clone)]
pub struct MetricsLayer {
    metrics: Metrics,
}

impl MetricsLayer {
    /// Records into `metrics` (a clone shares its counters).
    pub fn new(metrics: Metrics) -> Self {
        Self { metrics }
    }
}

impl<S> Layer<S> for MetricsLayer {
    type Service = MetricsService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        MetricsService {
            inner,
            metrics: self.metrics.clone(),
        }
    }
}

/// The service [`MetricsLayer`] builds.
#[derive(Debug, Clone)]
pub struct MetricsService<S> {
    inner: S,
    metrics: Metrics,
}

impl<S, B, R> Service<Request<B>> for MetricsService<S>
where
    S: Service<Request<B>, Response = Response<R>>,
{
    type Response = Response<R>;
    type Error = S::Error;
    type Future = MetricsFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        // From the request's arrival: time it spent in the layers inside
        // (a queued duplicate's wait) counts.
        let started = Instant::now();
        MetricsFuture::new(self.inner.call(request), self.metrics.clone(), started)
    }
}
