//! [`request_span`]: the application's request span, in the client's trace.

use http::Request;
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

use crate::trace::propagation::{self, REQUEST_SPAN, REQUEST_TARGET};
use crate::trace::service::warn_no_layer;

/// The application's span of one HTTP request, continuing the client's
/// trace: for tower-http's `TraceLayer::make_span_with`, outside
/// [`McpTraceLayer`](crate::trace::McpTraceLayer). tower-http's default span
/// knows nothing of `traceparent`, so it starts a trace of its own and the
/// client's trace goes on beside it; this one is the client's span's child,
/// and the guard's span opens as its child in turn. The trace then reads:
/// the client's span, this request span, the guard's span (one per
/// message), the tool's span ([`parent_context`](crate::trace::parent_context)).
///
/// The span is tower-http's default one (`request`, with `method` and
/// `version`), with the target's `path` in place of its `uri`: a query may
/// carry a key (`/mcp?api_key=…`), and this span is at `INFO` (tower-http's
/// is at `DEBUG`, which the usual log filter drops, leaving a gap in the
/// tree), written wherever the application's logs go. Of kind `SERVER`,
/// named by the method.
///
/// ```
/// use mcp_id_guard::trace::{request_span, McpTraceLayer};
/// use mcp_id_guard::IdGuardLayer;
/// use tower::ServiceBuilder;
/// use tower_http::trace::TraceLayer;
///
/// # let mcp = tower::service_fn(|_: http::Request<_>| async {
/// #     Ok::<_, std::convert::Infallible>(http::Response::new(axum::body::Body::empty()))
/// # });
/// let stack = ServiceBuilder::new()
///     .layer(TraceLayer::new_for_http().make_span_with(request_span))
///     .layer(McpTraceLayer::new())
///     .layer(IdGuardLayer::new())
///     .service(mcp); // the MCP service: rmcp's `StreamableHttpService`, say
/// let app: axum::Router = axum::Router::new().route_service("/mcp", stack);
/// # let _ = app;
/// ```
pub fn request_span<B>(request: &Request<B>) -> Span {
    let span = tracing::info_span!(
        target: REQUEST_TARGET,
        REQUEST_SPAN,
        otel.name = %request.method(),
        otel.kind = "server",
        method = %request.method(),
        path = request.uri().path(),
        version = ?request.version(),
    );
    if span.is_disabled() {
        return span;
    }
    if let Some(client) = propagation::extract(request.headers()) {
        if let Err(tracing_opentelemetry::SetParentError::LayerNotFound) = span.set_parent(client) {
            warn_no_layer();
        }
    }
    span
}
