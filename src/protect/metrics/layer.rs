//! [`MetricsLayer`] and the service it wraps around another.

use std::task::{Context, Poll};
use std::time::Instant;

use http::{Request, Response};
use tower_layer::Layer;
use tower_service::Service;

use super::future::MetricsFuture;
use super::Metrics;
use crate::guard::exchange::{WantsExchange, WantsToolNames};

/// Records every response of the service it wraps into a [`Metrics`]; see
/// the [module docs](super).
#[derive(Debug, Clone)]
pub struct MetricsLayer {
    metrics: Metrics,
    tool_names: usize,
}

impl MetricsLayer {
    /// Records into `metrics` (a clone shares its counters).
    pub fn new(metrics: Metrics) -> Self {
        Self {
            metrics,
            tool_names: 0,
        }
    }

    /// Labels each `tools/call` with its tool's name (`gen_ai_tool_name`),
    /// for the first `max` distinct names recorded into the [`Metrics`];
    /// later names, and a name MCP does not allow, are `other`. Off (0) by
    /// default: tool names are the client's to choose, and every name is a
    /// series per decision. The guard inside reads each `tools/call`'s
    /// `params.name` only while this is on.
    pub fn tool_names(mut self, max: usize) -> Self {
        self.tool_names = max;
        self
    }
}

impl<S> Layer<S> for MetricsLayer {
    type Service = MetricsService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        MetricsService {
            inner,
            metrics: self.metrics.clone(),
            tool_names: self.tool_names,
        }
    }
}

/// The service [`MetricsLayer`] builds.
#[derive(Debug, Clone)]
pub struct MetricsService<S> {
    inner: S,
    metrics: Metrics,
    tool_names: usize,
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

    fn call(&mut self, mut request: Request<B>) -> Self::Future {
        // From the request's arrival: time it spent in the layers inside
        // (a queued duplicate's wait) counts.
        let started = Instant::now();
        // The guard inside leaves its account of the POST only when asked.
        request.extensions_mut().insert(WantsExchange);
        if self.tool_names > 0 {
            request.extensions_mut().insert(WantsToolNames);
        }
        MetricsFuture::new(
            self.inner.call(request),
            self.metrics.clone(),
            started,
            self.tool_names,
        )
    }
}
