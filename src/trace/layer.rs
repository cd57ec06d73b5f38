//! [`McpTraceLayer`].

use tower_layer::Layer;

use crate::trace::service::McpTrace;

/// Records a `tracing` span per JSON-RPC message of each POST, and
/// continues and propagates W3C `traceparent`; see the
/// [module docs](crate::trace).
#[derive(Debug, Clone, Copy)]
pub struct McpTraceLayer {
    enabled: bool,
}

impl McpTraceLayer {
    /// Traces into whatever `tracing` subscriber the application installed.
    pub fn new() -> Self {
        Self { enabled: true }
    }

    /// Traces nothing and passes every request and response through
    /// untouched (its `traceparent` included): one service type whether or
    /// not traces are wanted.
    pub fn disabled() -> Self {
        Self { enabled: false }
    }
}

impl Default for McpTraceLayer {
    fn default() -> Self {
        Self::new()
    }
}

impl<S> Layer<S> for McpTraceLayer {
    type Service = McpTrace<S>;

    fn layer(&self, inner: S) -> Self::Service {
        McpTrace::new(inner, self.enabled)
    }
}
