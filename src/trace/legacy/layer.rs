//! [`TraceLayer`].

use std::sync::Arc;

use tower_layer::Layer;

use crate::trace::legacy::export::OtlpExporter;
use crate::trace::legacy::service::TraceService;
use crate::trace::legacy::tracer::Tracer;

/// Traces each JSON-RPC message of a POST into an [`OtlpExporter`]; see the
/// [module docs](crate::trace).
#[derive(Debug, Clone)]
pub struct TraceLayer {
    tracer: Option<Arc<Tracer>>,
}

impl TraceLayer {
    /// Traces into `exporter`.
    pub fn new(exporter: &OtlpExporter) -> Self {
        Self {
            tracer: Some(Arc::clone(&exporter.tracer)),
        }
    }

    /// Traces nothing and passes every request and response through
    /// untouched (its `traceparent` included): one service type whether or
    /// not traces are configured, as the `mcp-id-guard` binary composes it.
    pub fn disabled() -> Self {
        Self { tracer: None }
    }
}

impl<S> Layer<S> for TraceLayer {
    type Service = TraceService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        TraceService::new(inner, self.tracer.clone())
    }
}
