//! Counting what a server answers: [`MetricsLayer`] records responses by
//! status, refusals by kind (the [`Refused`] extension the protection layers
//! put on their answers), upstream failures by kind (the proxy's
//! `UpstreamFailure` extension, feature `proxy`) and the time to response
//! headers; the [`server`](crate::server) module (feature `server`) records
//! its connections into the same [`Metrics`].
//!
//! # Into the application's registry
//! The families are [`prometheus-client`](prometheus_client) metrics, the
//! official Prometheus client for Rust: [`Metrics::register`] puts them
//! into the [`Registry`] the application already serves, and
//! [`Metrics::register_stats`] the guard's own counters and gauges (read
//! from [`IdGuardLayer::stats`](crate::IdGuardLayer::stats) at each scrape).
//! [`Metrics::encode`] is that, into a registry of its own, in the
//! OpenMetrics text format: what the `mcp-id-guard` binary serves on
//! `/metrics`. prometheus-client rather than the `metrics` facade (which
//! [`Stats::record`] also feeds, feature `metrics`) as the primary way: the
//! families keep their labels, types, help and histogram buckets as the
//! guard defines them, an embedder needs no global recorder, and several
//! guards can register into one registry under prefixes
//! ([`Registry::sub_registry_with_prefix`]) or labels.
//!
//! ```
//! use mcp_id_guard::protect::metrics::{Metrics, MetricsLayer};
//! use mcp_id_guard::IdGuardLayer;
//! use prometheus_client::registry::Registry;
//!
//! let metrics = Metrics::new();
//! let guard = IdGuardLayer::new();
//! // The application's registry, served on its own `/metrics`.
//! let mut registry = Registry::default();
//! metrics.register(&mut registry);
//! let stats = guard.clone();
//! Metrics::register_stats(&mut registry, move || stats.stats());
//! let layer = MetricsLayer::new(metrics);
//! # let _ = layer;
//!
//! let mut text = String::new();
//! prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
//! assert!(text.contains("mcp_id_guard_passed_total 0"));
//! ```
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
//! `Mcp-Method` header names (revision 2026-07-28 sends one); else as
//! `initialize` when its answer starts a session (a success carrying
//! `Mcp-Session-Id`, which only an `initialize` answer does), else `other`
//! (a stateless server's `initialize` among them: its answer starts no
//! session, and the guard does not read the body).
//! The histogram times each message to its POST's response headers: for an
//! answer streamed as server-sent events, that is when the stream opened.
//!
//! Put the layer outermost, so that it sees what every other layer answers;
//! with traces, the tracing layers come next (the recommended order is in
//! [`crate::trace`]):
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

/// The `prometheus-client` crate (0.26) this module registers into: name its
/// `Registry` through here and it is always the one the guard's families
/// expect (an application on another version gets "expected `Registry`,
/// found a different `Registry`").
pub use prometheus_client;

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::Response;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::metrics::MetricType as PromType;
use prometheus_client::registry::{Metric, Registry};

use crate::guard::{Exchange, McpMethod};
use crate::metric_names::{self as names, MetricName, MetricType};
use crate::protect::buffer::BodyBudget;
use crate::protect::Refused;
use crate::table::Stats;

mod family;
mod future;
mod layer;

pub use future::MetricsFuture;
pub use layer::{MetricsLayer, MetricsService};

use family::{Named, Operation, Status, ToolNames};

/// A latency histogram: buckets from 0.5 ms, doubling, to about 16 s.
fn latency() -> Histogram {
    Histogram::new(exponential_buckets(0.0005, 2.0, 16))
}

type Histograms<K> = Family<K, Histogram, fn() -> Histogram>;

/// What a server records as it serves, shared by every clone: cheap to
/// clone, one set of counters.
#[derive(Debug, Clone)]
pub struct Metrics {
    recorded: Arc<Recorded>,
}

#[derive(Debug)]
struct Recorded {
    responses: Family<Status, Counter>,
    upstream_failures: Family<Named, Counter>,
    refused: Family<Named, Counter>,
    closed: Family<Named, Counter>,
    client_resets: Counter,
    duration: Histogram,
    /// JSON-RPC messages by method and the guard's decision (the guard's
    /// [`Exchange`] on a response).
    requests: Family<Operation, Counter>,
    operations: Histograms<Operation>,
    /// The tool names with series of their own.
    tools: ToolNames,
    connections: Gauge,
    /// A [`Server`](crate::server::Server) records its connections here
    /// (`server::Builder::metrics`): until one does, the families only a
    /// server records are left out of a registry.
    served: AtomicBool,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Empty counters.
    pub fn new() -> Self {
        Self {
            recorded: Arc::new(Recorded {
                responses: Family::default(),
                upstream_failures: Family::default(),
                refused: Family::default(),
                closed: Family::default(),
                client_resets: Counter::default(),
                duration: latency(),
                requests: Family::default(),
                operations: Family::new_with_constructor(latency),
                tools: ToolNames::default(),
                connections: Gauge::default(),
                served: AtomicBool::new(false),
            }),
        }
    }

    /// The `Content-Type` of what [`encode`](Self::encode) writes.
    pub const CONTENT_TYPE: &'static str =
        "application/openmetrics-text; version=1.0.0; charset=utf-8";

    /// Registers every family of these metrics into `registry` (they stay
    /// shared with this [`Metrics`] and its clones): what the layer and the
    /// server record, under the names the crate documents.
    ///
    /// The families only a connection-level server records
    /// (`mcp_id_guard_client_connections`,
    /// `mcp_id_guard_connections_closed_total`,
    /// `mcp_id_guard_client_resets_total`) are written only once these
    /// metrics are given to a [`Server`](crate::server::Server) (feature
    /// `server`, `Server::builder().metrics(...)`), whenever that happens:
    /// an application served by `axum::serve` or its own hyper loop, where
    /// nothing records connections, gets no series that would stay 0.
    pub fn register(&self, registry: &mut Registry) {
        let recorded = &*self.recorded;
        register(registry, names::RESPONSES, recorded.responses.clone());
        register(
            registry,
            names::UPSTREAM_FAILURES,
            recorded.upstream_failures.clone(),
        );
        register(registry, names::REFUSED, recorded.refused.clone());
        registry.register_collector(Box::new(ServerFamilies(self.clone())));
        register(registry, names::REQUEST_DURATION, recorded.duration.clone());
        register(registry, names::REQUESTS, recorded.requests.clone());
        register(
            registry,
            names::OPERATION_DURATION,
            recorded.operations.clone(),
        );
    }

    /// Registers the guard's counters and gauges ([`Stats`]: passed,
    /// remapped, in flight, ...) into `registry`, read from `stats` at each
    /// scrape; typically `move || guard.stats()` with a clone of the
    /// [`IdGuardLayer`](crate::IdGuardLayer).
    pub fn register_stats(
        registry: &mut Registry,
        stats: impl Fn() -> Stats + Send + Sync + 'static,
    ) {
        registry.register_collector(Box::new(StatsCollector(Box::new(stats))));
    }

    /// Registers what `budget` holds into `registry`, read at each scrape:
    /// the bytes of request bodies (`mcp_id_guard_held_request_body_bytes`)
    /// and the bodies (`mcp_id_guard_held_request_bodies`), gauges.
    ///
    /// ```
    /// use mcp_id_guard::protect::buffer::BodyBudget;
    /// use mcp_id_guard::protect::metrics::Metrics;
    /// use prometheus_client::registry::Registry;
    ///
    /// let budget = BodyBudget::new(64 * 1024 * 1024);
    /// let mut registry = Registry::default();
    /// Metrics::register_body_budget(&mut registry, budget.clone());
    /// let mut body = budget.hold();
    /// body.grow_to(40)?;
    ///
    /// let mut text = String::new();
    /// prometheus_client::encoding::text::encode(&mut text, &registry)?;
    /// assert!(text.contains("mcp_id_guard_held_request_body_bytes 40\n"));
    /// assert!(text.contains("mcp_id_guard_held_request_bodies 1\n"));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn register_body_budget(registry: &mut Registry, budget: BodyBudget) {
        registry.register_collector(Box::new(BudgetCollector(budget)));
    }

    /// A response left for the client `elapsed` after its request arrived;
    /// `tools`: how many tool names may have series of their own (0: none,
    /// no `gen_ai_tool_name` label).
    pub(crate) fn answered<B>(&self, response: &Response<B>, elapsed: Duration, tools: usize) {
        let recorded = &*self.recorded;
        recorded
            .responses
            .get_or_create(&Status(response.status().as_u16()))
            .inc();
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
                .get_or_create(&Named("kind", failure.as_str()))
                .inc();
        }
        let seconds = elapsed.as_secs_f64();
        recorded.duration.observe(seconds);
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
            recorded.requests.get_or_create(&operation).inc();
            recorded
                .operations
                .get_or_create(&operation)
                .observe(seconds);
        }
    }

    /// A request refused with no response to count (an HTTP/2 stream
    /// refused with a reset).
    pub(crate) fn refused(&self, kind: Refused) {
        self.recorded
            .refused
            .get_or_create(&Named("kind", kind.as_str()))
            .inc();
    }

    /// A [`Server`](crate::server::Server) records its connections into
    /// these metrics: [`register`](Self::register) writes the families only
    /// a server records.
    #[cfg_attr(not(feature = "server"), allow(dead_code))]
    pub(crate) fn record_connections(&self) {
        self.recorded.served.store(true, Ordering::Relaxed);
    }

    /// A client connection the server closed for one of its budgets.
    #[cfg_attr(not(feature = "server"), allow(dead_code))]
    pub(crate) fn closed(&self, reason: &'static str) {
        self.recorded
            .closed
            .get_or_create(&Named("reason", reason))
            .inc();
    }

    /// An HTTP/2 stream the client reset before its response ended.
    #[cfg_attr(not(feature = "server"), allow(dead_code))]
    pub(crate) fn client_reset(&self) {
        self.recorded.client_resets.inc();
    }

    /// A client connection opened; it counts as open until the returned
    /// token is dropped.
    #[cfg_attr(not(feature = "server"), allow(dead_code))]
    pub(crate) fn connection(&self) -> OpenConnection {
        self.recorded.connections.inc();
        OpenConnection(self.clone())
    }

    /// Writes every metric, and `stats`' if given (the guard's counters, read
    /// with [`IdGuardLayer::stats`](crate::IdGuardLayer::stats) at scrape
    /// time), to `out` in the OpenMetrics text format
    /// ([`CONTENT_TYPE`](Self::CONTENT_TYPE)), ending with `# EOF`: a
    /// registry with [`register`](Self::register) and
    /// [`register_stats`](Self::register_stats), encoded by
    /// prometheus-client.
    pub fn encode(&self, stats: Option<&Stats>, out: &mut String) {
        let mut registry = Registry::default();
        self.register(&mut registry);
        if let Some(stats) = stats.copied() {
            Self::register_stats(&mut registry, move || stats);
        }
        // Writing into a `String` cannot fail.
        let _ = prometheus_client::encoding::text::encode(out, &registry);
    }
}

/// Registers `metric` under `name`. The crate's help texts are sentences;
/// prometheus-client adds the full stop itself.
fn register(registry: &mut Registry, name: MetricName, metric: impl Metric) {
    let help = name.help.strip_suffix('.').unwrap_or(name.help);
    registry.register(name.family, help, metric);
}

/// The guard's [`Stats`], read at each scrape.
struct StatsCollector(Box<dyn Fn() -> Stats + Send + Sync>);

impl fmt::Debug for StatsCollector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("StatsCollector")
    }
}

impl Collector for StatsCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> fmt::Result {
        for (name, value) in (self.0)().series() {
            single(&mut encoder, name, value)?;
        }
        Ok(())
    }
}

/// The families only a connection-level server records, written once one
/// records into these metrics.
#[derive(Debug)]
struct ServerFamilies(Metrics);

impl Collector for ServerFamilies {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> fmt::Result {
        let recorded = &*self.0.recorded;
        if !recorded.served.load(Ordering::Relaxed) {
            return Ok(());
        }
        let families: [(MetricName, &dyn EncodeMetric); 3] = [
            (names::CONNECTIONS_CLOSED, &recorded.closed),
            (names::CLIENT_RESETS, &recorded.client_resets),
            (names::CLIENT_CONNECTIONS, &recorded.connections),
        ];
        // As a `Registry` writes what was registered into it: a family
        // without a series has no descriptor either, and the help ends with
        // a full stop (see `register`).
        for (name, metric) in families
            .into_iter()
            .filter(|(_, metric)| !metric.is_empty())
        {
            let help = format!("{}.", name.help.strip_suffix('.').unwrap_or(name.help));
            let family =
                encoder.encode_descriptor(name.family, &help, None, metric.metric_type())?;
            metric.encode(family)?;
        }
        Ok(())
    }
}

/// What a [`BodyBudget`] holds, read at each scrape.
#[derive(Debug)]
struct BudgetCollector(BodyBudget);

impl Collector for BudgetCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> fmt::Result {
        let gauges = [
            (names::HELD_REQUEST_BODY_BYTES, self.0.used()),
            (names::HELD_REQUEST_BODIES, self.0.bodies()),
        ];
        for (name, value) in gauges {
            single(&mut encoder, name, u64::try_from(value).unwrap_or(u64::MAX))?;
        }
        Ok(())
    }
}

/// A family of one series without labels, its value read now.
fn single(encoder: &mut DescriptorEncoder<'_>, name: MetricName, value: u64) -> fmt::Result {
    match name.kind {
        MetricType::Counter => {
            let metric = ConstCounter::new(value);
            let family =
                encoder.encode_descriptor(name.family, name.help, None, PromType::Counter)?;
            metric.encode(family)
        }
        _ => {
            let metric = ConstGauge::new(i64::try_from(value).unwrap_or(i64::MAX));
            let family =
                encoder.encode_descriptor(name.family, name.help, None, PromType::Gauge)?;
            metric.encode(family)
        }
    }
}

/// One open client connection in the `client_connections` gauge.
#[derive(Debug)]
pub(crate) struct OpenConnection(Metrics);

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.recorded.connections.dec();
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::Metrics;
    use crate::protect::Refused;

    /// The exposition as Prometheus scrapes it: help, type, samples with
    /// their labels, cumulative buckets, and the EOF marker.
    #[test]
    fn text_format() {
        let metrics = Metrics::new();
        // As `server::Builder::metrics` does.
        metrics.record_connections();
        let mut response = http::Response::new(());
        *response.status_mut() = http::StatusCode::MISDIRECTED_REQUEST;
        response.extensions_mut().insert(Refused::Host);
        metrics.answered(&response, Duration::from_millis(3), 0);
        metrics.answered(&http::Response::new(()), Duration::from_micros(100), 0);
        metrics.client_reset();
        let open = metrics.connection();
        let mut text = String::new();
        metrics.encode(None, &mut text);
        for expected in [
            "# HELP mcp_id_guard_responses Responses sent to clients, by HTTP status.\n\
             # TYPE mcp_id_guard_responses counter\n",
            "mcp_id_guard_responses_total{status=\"200\"} 1\n",
            "mcp_id_guard_responses_total{status=\"421\"} 1\n",
            "mcp_id_guard_refused_total{kind=\"host\"} 1\n",
            "mcp_id_guard_client_resets_total 1\n",
            "# TYPE mcp_id_guard_request_duration_seconds histogram\n\
             mcp_id_guard_request_duration_seconds_sum 0.0031",
            "mcp_id_guard_request_duration_seconds_count 2\n\
             mcp_id_guard_request_duration_seconds_bucket{le=\"0.0005\"} 1\n\
             mcp_id_guard_request_duration_seconds_bucket{le=\"0.001\"} 1\n\
             mcp_id_guard_request_duration_seconds_bucket{le=\"0.002\"} 1\n\
             mcp_id_guard_request_duration_seconds_bucket{le=\"0.004\"} 2\n",
            "mcp_id_guard_request_duration_seconds_bucket{le=\"16.384\"} 2\n\
             mcp_id_guard_request_duration_seconds_bucket{le=\"+Inf\"} 2\n",
            "# TYPE mcp_id_guard_client_connections gauge\nmcp_id_guard_client_connections 1\n",
        ] {
            assert!(text.contains(expected), "{expected} missing from\n{text}");
        }
        assert!(text.ends_with("# EOF\n"), "{text}");
        // Families without a series have none; the guard's only with its
        // stats.
        assert!(!text.contains("connections_closed_total"), "{text}");
        assert!(!text.contains("mcp_id_guard_passed"), "{text}");
        drop(open);
        let mut text = String::new();
        metrics.encode(Some(&crate::table::Stats::default()), &mut text);
        assert!(text.contains("mcp_id_guard_passed_total 0\n"), "{text}");
        assert!(
            text.contains("# TYPE mcp_id_guard_table_bytes gauge\nmcp_id_guard_table_bytes 0\n"),
            "{text}"
        );
        assert!(
            text.contains("mcp_id_guard_client_connections 0\n"),
            "{text}"
        );
    }

    /// The families only a server records are left out until one records
    /// into the metrics (an application served by `axum::serve` never has
    /// one), then written whatever was registered before.
    #[test]
    fn server_families_only_with_a_server() {
        use prometheus_client::registry::Registry;

        let metrics = Metrics::new();
        let mut registry = Registry::default();
        metrics.register(&mut registry);
        let scrape = |registry: &Registry| {
            let mut text = String::new();
            prometheus_client::encoding::text::encode(&mut text, registry).unwrap();
            text
        };
        let text = scrape(&registry);
        assert!(
            text.contains("# TYPE mcp_id_guard_request_duration_seconds histogram\n"),
            "{text}"
        );
        for server_only in ["client_connections", "connections_closed", "client_resets"] {
            assert!(!text.contains(server_only), "{server_only} in\n{text}");
        }
        metrics.record_connections();
        let _open = metrics.connection();
        let text = scrape(&registry);
        for expected in [
            "# HELP mcp_id_guard_client_connections Client connections open.\n\
             # TYPE mcp_id_guard_client_connections gauge\n\
             mcp_id_guard_client_connections 1\n",
            "# TYPE mcp_id_guard_client_resets counter\nmcp_id_guard_client_resets_total 0\n",
        ] {
            assert!(text.contains(expected), "{expected} missing from\n{text}");
        }
        // No connection closed for a budget yet: no series, no descriptor.
        assert!(!text.contains("connections_closed"), "{text}");
    }

    /// The guard's account of a POST labels the request counter and the
    /// operation histogram by method and decision, one series per pair; a
    /// response without it (a `GET`, no guard) counts in neither.
    #[test]
    fn requests_by_method_and_decision() {
        use crate::guard::{Exchange, GuardDecision, McpMethod};

        let metrics = Metrics::new();
        let mut batch = Exchange::one(McpMethod::ToolsCall, GuardDecision::Remapped);
        batch.push(McpMethod::Ping, GuardDecision::Passed, None, None);
        batch.push(McpMethod::ToolsCall, GuardDecision::Remapped, None, None);
        let mut response = http::Response::new(());
        response.extensions_mut().insert(batch);
        metrics.answered(&response, Duration::from_millis(3), 0);
        metrics.answered(&http::Response::new(()), Duration::from_millis(1), 0);
        let mut text = String::new();
        metrics.encode(None, &mut text);
        for expected in [
            "# HELP mcp_id_guard_requests JSON-RPC requests",
            "# TYPE mcp_id_guard_requests counter\n",
            "mcp_id_guard_requests_total{mcp_method_name=\"ping\",decision=\"passed\"} 1\n",
            "mcp_id_guard_requests_total{mcp_method_name=\"tools/call\",decision=\"remapped\"} 2\n",
            "# TYPE mcp_server_operation_duration_seconds histogram\n",
            "mcp_server_operation_duration_seconds_sum{mcp_method_name=\"ping\",decision=\"passed\"} 0.003\n\
             mcp_server_operation_duration_seconds_count{mcp_method_name=\"ping\",decision=\"passed\"} 1\n\
             mcp_server_operation_duration_seconds_bucket{le=\"0.0005\",mcp_method_name=\"ping\",decision=\"passed\"} 0\n",
            "mcp_server_operation_duration_seconds_bucket{le=\"0.004\",mcp_method_name=\"tools/call\",decision=\"remapped\"} 2\n\
             mcp_server_operation_duration_seconds_bucket{le=\"0.008\",mcp_method_name=\"tools/call\",decision=\"remapped\"} 2\n",
            "mcp_server_operation_duration_seconds_bucket{le=\"+Inf\",mcp_method_name=\"tools/call\",decision=\"remapped\"} 2\n",
            // The unlabelled histogram counts both responses.
            "mcp_id_guard_request_duration_seconds_count 2\n",
        ] {
            assert!(text.contains(expected), "{expected} missing from\n{text}");
        }
        // Without the guard's account, neither family has a series.
        let bare = Metrics::new();
        bare.answered(&http::Response::new(()), Duration::from_millis(1), 0);
        let mut text = String::new();
        bare.encode(None, &mut text);
        assert!(!text.contains("mcp_id_guard_requests_total"), "{text}");
        assert!(
            !text.contains("mcp_server_operation_duration_seconds_count"),
            "{text}"
        );
    }
}
