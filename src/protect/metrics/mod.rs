//! Counting what a server answers: [`MetricsLayer`] records responses by
//! status, refusals by kind (the [`Refused`] extension the protection layers
//! put on their answers), upstream failures by kind (the proxy's
//! `UpstreamFailure` extension, feature `proxy`) and the time to response
//! headers; the [`server`](crate::server) module (feature `server`) records
//! its connections into the same [`Metrics`]. [`Metrics::encode`] writes it
//! all, with the guard's [`Stats`], in the Prometheus (OpenMetrics) text
//! format, for a `/metrics` endpoint.
//!
//! # By MCP method
//! With [`IdGuardLayer`](crate::IdGuardLayer) inside it, the layer also
//! counts each JSON-RPC request and notification of a POST (each member of a
//! batch) from the guard's [`Exchange`] on the response:
//! `mcp_id_guard_requests_total` and the histogram
//! `mcp_server_operation_duration_seconds` (OpenTelemetry's
//! `mcp.server.operation.duration`), labelled
//! - `mcp_method_name`: the MCP method ([`McpMethod`]: the methods of
//!   revision 2025-11-25 by name, tasks included), everything else `other`;
//! - `decision`: what the guard did ([`GuardDecision`](crate::exchange::GuardDecision)):
//!   `passed`, `remapped`, `rejected` (a duplicate the policy refused),
//!   `queued`, `refused` (answered by the guard for another reason: over
//!   capacity or budget, unreadable, too large, session id too long) or
//!   `cancelled` (a `notifications/cancelled` that named a request in
//!   flight);
//! - `gen_ai_tool_name` on `tools/call` only with
//!   [`MetricsLayer::tool_names`]: the first N distinct names, then `other`.
//!
//! A POST the guard does not read (no session yet, as an `initialize`; or
//! revision 2026-07-28) counts once as `passed`, under the method its
//! `Mcp-Method` header names (revision 2026-07-28 sends one), else `other`.
//! The histogram times each message to its POST's response headers: for an
//! answer streamed as server-sent events, that is when the stream opened.
//!
//! Put the layer outermost, so that it sees what every other layer answers:
//!
//! ```
//! use mcp_id_guard::protect::metrics::{Metrics, MetricsLayer};
//! use mcp_id_guard::IdGuardLayer;
//! use tower_layer::Layer;
//!
//! # async fn doc() {
//! let metrics = Metrics::new();
//! let guard = IdGuardLayer::new();
//! let inner = tower::service_fn(|_: http::Request<String>| async {
//!     Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
//! });
//! let service = MetricsLayer::new(metrics.clone()).layer(guard.layer(inner));
//! # let _ = service;
//!
//! // At scrape time:
//! let mut text = String::new();
//! metrics.encode(Some(&guard.stats()), &mut text);
//! assert!(text.contains("# TYPE mcp_id_guard_passed counter"));
//! assert!(text.ends_with("# EOF\n"));
//! # }
//! ```

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::Response;

use crate::guard::{Exchange, McpMethod};
use crate::protect::Refused;
use crate::table::Stats;

mod encode;
mod family;
mod future;
mod layer;

pub use future::MetricsFuture;
pub use layer::{MetricsLayer, MetricsService};

use family::{Family, Histogram, Named, Operation, Status, ToolNames};

/// What a server records as it serves, shared by every clone: cheap to
/// clone, one set of counters.
#[derive(Debug, Clone, Default)]
pub struct Metrics {
    recorded: Arc<Recorded>,
}

#[derive(Debug, Default)]
struct Recorded {
    responses: Family<Status, AtomicU64>,
    upstream_failures: Family<Named, AtomicU64>,
    refused: Family<Named, AtomicU64>,
    closed: Family<Named, AtomicU64>,
    client_resets: AtomicU64,
    duration: Histogram,
    /// JSON-RPC messages by method and the guard's decision (the guard's
    /// [`Exchange`] on a response).
    requests: Family<Operation, AtomicU64>,
    operations: Family<Operation, Histogram>,
    /// The tool names with series of their own.
    tools: ToolNames,
    connections: AtomicU64,
    /// Spans of the trace exporter (feature `otel`), written only once an
    /// exporter records into these metrics.
    traced: AtomicBool,
    spans_exported: AtomicU64,
    spans_dropped: AtomicU64,
}

impl Metrics {
    /// Empty counters.
    pub fn new() -> Self {
        Self::default()
    }

    /// The `Content-Type` of what [`encode`](Self::encode) writes.
    pub const CONTENT_TYPE: &'static str =
        "application/openmetrics-text; version=1.0.0; charset=utf-8";

    /// A response left for the client `elapsed` after its request arrived;
    /// `tools`: how many tool names may have series of their own (0: none,
    /// no `gen_ai_tool_name` label).
    pub(crate) fn answered<B>(&self, response: &Response<B>, elapsed: Duration, tools: usize) {
        let recorded = &*self.recorded;
        recorded.responses.inc(Status(response.status().as_u16()));
        if let Some(kind) = response.extensions().get::<Refused>() {
            self.refused(*kind);
        }
        #[cfg(feature = "proxy")]
        if let Some(failure) = response
            .extensions()
            .get::<crate::protect::upstream::UpstreamFailure>()
        {
            recorded
                .upstream_failures
                .inc(Named("kind", failure.as_str()));
        }
        recorded.duration.observe(elapsed);
        // Each message of a POST took as long as the POST: a batch is
        // answered at once.
        for handled in response
            .extensions()
            .get::<Exchange>()
            .into_iter()
            .flatten()
        {
            let method = handled.method();
            let tool = (tools > 0 && method == McpMethod::ToolsCall)
                .then(|| recorded.tools.label(handled.tool(), tools));
            let operation = Operation {
                method,
                decision: handled.decision(),
                tool,
            };
            recorded.requests.inc(operation.clone());
            recorded
                .operations
                .with(operation, |histogram| histogram.observe(elapsed));
        }
    }

    /// A request refused with no response to count (an HTTP/2 stream
    /// refused with a reset).
    pub(crate) fn refused(&self, kind: Refused) {
        self.recorded.refused.inc(Named("kind", kind.as_str()));
    }

    /// A client connection the server closed for one of its budgets.
    #[cfg_attr(not(feature = "server"), allow(dead_code))]
    pub(crate) fn closed(&self, reason: &'static str) {
        self.recorded.closed.inc(Named("reason", reason));
    }

    /// An HTTP/2 stream the client reset before its response ended.
    #[cfg_attr(not(feature = "server"), allow(dead_code))]
    pub(crate) fn client_reset(&self) {
        self.recorded.client_resets.fetch_add(1, Ordering::Relaxed);
    }

    /// Spans the trace exporter saw exported and dropped (from now on,
    /// the two counters are written).
    #[cfg_attr(not(feature = "otel"), allow(dead_code))]
    pub(crate) fn spans(&self, exported: u64, dropped: u64) {
        let recorded = &*self.recorded;
        recorded.traced.store(true, Ordering::Relaxed);
        recorded
            .spans_exported
            .fetch_add(exported, Ordering::Relaxed);
        recorded.spans_dropped.fetch_add(dropped, Ordering::Relaxed);
    }

    /// A client connection opened; it counts as open until the returned
    /// token is dropped.
    #[cfg_attr(not(feature = "server"), allow(dead_code))]
    pub(crate) fn connection(&self) -> OpenConnection {
        self.recorded.connections.fetch_add(1, Ordering::Relaxed);
        OpenConnection(self.clone())
    }

    /// Writes every metric, and `stats`' if given (the guard's counters, read
    /// with [`IdGuardLayer::stats`](crate::IdGuardLayer::stats) at scrape
    /// time), to `out` in the OpenMetrics text format
    /// ([`CONTENT_TYPE`](Self::CONTENT_TYPE)), ending with `# EOF`.
    pub fn encode(&self, stats: Option<&Stats>, out: &mut String) {
        encode::all(&self.recorded, stats, out);
    }
}

/// One open client connection in the `client_connections` gauge.
#[derive(Debug)]
pub(crate) struct OpenConnection(Metrics);

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.recorded.connections.fetch_sub(1, Ordering::Relaxed);
    }
}
