//! The one list of metric names the crate publishes, with their help text and
//! type: read by [`Stats::record`](crate::Stats) (feature `metrics`), by the
//! metrics layer ([`protect::metrics`](crate::protect::metrics)), which
//! registers them into a prometheus-client registry, so that a name is written once.
//!
//! Below every module that records or encodes metrics: it depends on nothing.

/// How a metric's value behaves, as the exposition format names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MetricType {
    /// Only goes up; its sample is `<family>_total`.
    Counter,
    /// Goes up and down; its sample is the family's name.
    Gauge,
    /// Buckets, a sum and a count (`_bucket`, `_sum`, `_count`).
    Histogram,
}

/// One metric family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct MetricName {
    /// The family's name (`# HELP` and `# TYPE` lines).
    pub(crate) family: &'static str,
    /// The name its samples carry: `<family>_total` for a counter, the
    /// family's name for a gauge, the prefix of `_bucket` and the rest for a
    /// histogram.
    pub(crate) sample: &'static str,
    pub(crate) help: &'static str,
    pub(crate) kind: MetricType,
}

/// A counter family: its samples end in `_total`.
macro_rules! counter {
    ($family:literal, $help:literal) => {
        MetricName {
            family: $family,
            sample: concat!($family, "_total"),
            help: $help,
            kind: MetricType::Counter,
        }
    };
}

/// A gauge or a histogram family: its samples carry the family's name (a
/// histogram's with `_bucket`, `_sum` and `_count` after it).
macro_rules! named {
    ($kind:ident, $family:literal, $help:literal) => {
        MetricName {
            family: $family,
            sample: $family,
            help: $help,
            kind: MetricType::$kind,
        }
    };
}

macro_rules! gauge {
    ($family:literal, $help:literal) => {
        named!(Gauge, $family, $help)
    };
}

// What the guard counts (`Stats`).

pub(crate) const PASSED: MetricName = counter!(
    "mcp_id_guard_passed",
    "Requests forwarded with the client's own id"
);
pub(crate) const REMAPPED: MetricName = counter!(
    "mcp_id_guard_remapped",
    "Requests forwarded with a server-side id"
);
pub(crate) const REJECTED: MetricName = counter!(
    "mcp_id_guard_rejected",
    "Requests the guard answered itself (duplicate under reject, over the per-session cap or the table budget, session id too long)"
);
pub(crate) const QUEUED: MetricName = counter!(
    "mcp_id_guard_queued",
    "Requests that waited for their id under the queue policy"
);
pub(crate) const CANCELLED: MetricName = counter!(
    "mcp_id_guard_cancelled",
    "notifications/cancelled that named a request of the session"
);
pub(crate) const RESTORED: MetricName = counter!(
    "mcp_id_guard_restored",
    "Client ids put back into responses"
);
pub(crate) const RESTORE_REFUSED: MetricName = counter!(
    "mcp_id_guard_restore_refused",
    "Ids in responses written like server-side ids this guard did not issue for the response's session (another session's, or forged), passed on unrestored"
);
pub(crate) const ABANDONED_EVICTED: MetricName = counter!(
    "mcp_id_guard_abandoned_evicted",
    "Abandoned ids forgotten early to stay within the table's byte budget or count cap"
);
pub(crate) const RESTART_REMAPPED: MetricName = counter!(
    "mcp_id_guard_restart_remapped",
    "Requests remapped because their session started before this process (restart window)"
);
pub(crate) const IN_FLIGHT_REQUESTS: MetricName = gauge!(
    "mcp_id_guard_in_flight_requests",
    "Tracked requests whose exchange has not ended"
);
pub(crate) const TRACKED_SESSIONS: MetricName = gauge!(
    "mcp_id_guard_tracked_sessions",
    "Sessions with a request in flight"
);
pub(crate) const ABANDONED_IDS: MetricName = gauge!(
    "mcp_id_guard_abandoned_ids",
    "Ids of given-up exchanges still shadowed"
);
pub(crate) const TABLE_BYTES: MetricName = gauge!(
    "mcp_id_guard_table_bytes",
    "Bytes the session table holds (bounded by --max-table-bytes)"
);

// What the metrics layer and the server module count.

pub(crate) const RESPONSES: MetricName = counter!(
    "mcp_id_guard_responses",
    "Responses sent to clients, by HTTP status."
);
pub(crate) const UPSTREAM_FAILURES: MetricName = counter!(
    "mcp_id_guard_upstream_failures",
    "Requests the upstream did not answer, by kind (the proxy answered 502, 503 or 504)."
);
pub(crate) const REFUSED: MetricName = counter!(
    "mcp_id_guard_refused",
    "Requests refused before the guard, by kind (host, origin, header_size, connection_closing: arrived on a connection closing for its request cap or resets)."
);
pub(crate) const CONNECTIONS_CLOSED: MetricName = counter!(
    "mcp_id_guard_connections_closed",
    "Client connections the proxy closed itself, by reason (request_cap: --max-requests-per-connection; client_resets: --max-client-resets; idle_at_capacity: idle, closed for a new connection waiting at the connection cap)."
);
pub(crate) const CLIENT_RESETS: MetricName = counter!(
    "mcp_id_guard_client_resets",
    "HTTP/2 streams the client reset before their response ended."
);
pub(crate) const REQUEST_DURATION: MetricName = named!(
    Histogram,
    "mcp_id_guard_request_duration_seconds",
    "Time from a request's head to its response headers."
);
pub(crate) const REQUESTS: MetricName = counter!(
    "mcp_id_guard_requests",
    "JSON-RPC requests and notifications in POSTs (each member of a batch), by MCP method (mcp_method_name: the MCP methods by name, everything else other), the guard's decision (passed, remapped, rejected, queued, refused, cancelled) and, when enabled, the tool of a tools/call (gen_ai_tool_name)."
);
/// OpenTelemetry's `mcp.server.operation.duration` (seconds), as Prometheus
/// names it; its attribute `mcp.method.name` becomes `mcp_method_name`.
pub(crate) const OPERATION_DURATION: MetricName = named!(
    Histogram,
    "mcp_server_operation_duration_seconds",
    "Time from a POST's head to its response headers, per JSON-RPC request or notification in it, by MCP method and the guard's decision (OpenTelemetry mcp.server.operation.duration; an event stream's headers may come before its result)."
);
pub(crate) const CLIENT_CONNECTIONS: MetricName =
    gauge!("mcp_id_guard_client_connections", "Client connections open");

// What the body buffer holds (`protect::buffer::BodyBudget`).

pub(crate) const HELD_REQUEST_BODY_BYTES: MetricName = gauge!(
    "mcp_id_guard_held_request_body_bytes",
    "Bytes of request bodies held, counted as they arrive (bounded by --max-body-memory-bytes)"
);
pub(crate) const HELD_REQUEST_BODIES: MetricName = gauge!(
    "mcp_id_guard_held_request_bodies",
    "Request bodies being read, or read and waiting for the upstream's response head"
);
