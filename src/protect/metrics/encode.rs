//! The OpenMetrics text format, written by hand: a few families of
//! counters, gauges and one histogram need no exposition library.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

use super::family::{bound, Family, Histogram, Labels, BUCKETS};
use super::Recorded;
use crate::metric_names::{self as names, MetricName};
use crate::table::Stats;

/// Every family, in a fixed order: what the layer and the server recorded,
/// the guard's `stats`, the open connections.
pub(super) fn all(recorded: &Recorded, stats: Option<&Stats>, out: &mut String) {
    family(out, names::RESPONSES, &recorded.responses);
    family(out, names::UPSTREAM_FAILURES, &recorded.upstream_failures);
    family(out, names::REFUSED, &recorded.refused);
    family(out, names::CONNECTIONS_CLOSED, &recorded.closed);
    single(
        out,
        names::CLIENT_RESETS,
        recorded.client_resets.load(Ordering::Relaxed),
    );
    histogram(out, recorded);
    family(out, names::REQUESTS, &recorded.requests);
    histograms(out, names::OPERATION_DURATION, &recorded.operations);
    for (name, value) in stats.map(Stats::series).into_iter().flatten() {
        single(out, name, value);
    }
    single(
        out,
        names::CLIENT_CONNECTIONS,
        recorded.connections.load(Ordering::Relaxed),
    );
    if recorded.traced.load(Ordering::Relaxed) {
        let exported = recorded.spans_exported.load(Ordering::Relaxed);
        single(out, names::TRACE_SPANS_EXPORTED, exported);
        let dropped = recorded.spans_dropped.load(Ordering::Relaxed);
        single(out, names::TRACE_SPANS_DROPPED, dropped);
    }
    out.push_str("# EOF\n");
}

fn head(out: &mut String, name: MetricName) {
    let _ = writeln!(out, "# HELP {} {}", name.family, name.help);
    let _ = writeln!(out, "# TYPE {} {}", name.family, name.kind.as_str());
}

/// A family with labels; left out while it has no series.
fn family<K: Labels>(out: &mut String, name: MetricName, family: &Family<K, AtomicU64>) {
    if family.is_empty() {
        return;
    }
    head(out, name);
    family.each(|labels, value| {
        out.push_str(name.sample);
        out.push('{');
        labels.write(out);
        let _ = writeln!(out, "}} {}", value.load(Ordering::Relaxed));
    });
}

/// A family of one series without labels.
fn single(out: &mut String, name: MetricName, value: u64) {
    head(out, name);
    let _ = writeln!(out, "{} {value}", name.sample);
}

/// The histogram without labels.
fn histogram(out: &mut String, recorded: &Recorded) {
    let name = names::REQUEST_DURATION;
    head(out, name);
    samples(out, name, "", &recorded.duration);
}

/// A family of histograms with labels; left out while it has no series.
fn histograms<K: Labels>(out: &mut String, name: MetricName, family: &Family<K, Histogram>) {
    if family.is_empty() {
        return;
    }
    head(out, name);
    let mut labels = String::new();
    family.each(|key, histogram| {
        labels.clear();
        key.write(&mut labels);
        samples(out, name, &labels, histogram);
    });
}

/// One histogram's samples; `labels` are its pairs without braces (or
/// nothing).
fn samples(out: &mut String, name: MetricName, labels: &str, histogram: &Histogram) {
    let (sum, count, buckets) = histogram.read();
    let sample = name.sample;
    let (open, close) = if labels.is_empty() {
        ("", "")
    } else {
        ("{", "}")
    };
    let _ = writeln!(out, "{sample}_sum{open}{labels}{close} {sum}");
    let _ = writeln!(out, "{sample}_count{open}{labels}{close} {count}");
    let comma = if labels.is_empty() { "" } else { "," };
    for (bucket, cumulative) in buckets.iter().enumerate().take(BUCKETS) {
        let _ = writeln!(
            out,
            "{sample}_bucket{{{labels}{comma}le=\"{}\"}} {cumulative}",
            bound(bucket)
        );
    }
    let _ = writeln!(out, "{sample}_bucket{{{labels}{comma}le=\"+Inf\"}} {count}");
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::Metrics;
    use crate::protect::Refused;

    /// The exposition as Prometheus scrapes it: help, type, samples with
    /// their labels, cumulative buckets, and the EOF marker.
    #[test]
    fn text_format() {
        let metrics = Metrics::new();
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
             # TYPE mcp_id_guard_responses counter\n\
             mcp_id_guard_responses_total{status=\"200\"} 1\n\
             mcp_id_guard_responses_total{status=\"421\"} 1\n",
            "mcp_id_guard_refused_total{kind=\"host\"} 1\n",
            "mcp_id_guard_client_resets_total 1\n",
            "# TYPE mcp_id_guard_request_duration_seconds histogram\n\
             mcp_id_guard_request_duration_seconds_sum 0.0031\n\
             mcp_id_guard_request_duration_seconds_count 2\n\
             mcp_id_guard_request_duration_seconds_bucket{le=\"0.0005\"} 1\n\
             mcp_id_guard_request_duration_seconds_bucket{le=\"0.001\"} 1\n\
             mcp_id_guard_request_duration_seconds_bucket{le=\"0.002\"} 1\n\
             mcp_id_guard_request_duration_seconds_bucket{le=\"0.004\"} 2\n",
            "mcp_id_guard_request_duration_seconds_bucket{le=\"16.384\"} 2\n\
             mcp_id_guard_request_duration_seconds_bucket{le=\"+Inf\"} 2\n",
            "# TYPE mcp_id_guard_client_connections gauge\nmcp_id_guard_client_connections 1\n# EOF\n",
        ] {
            assert!(text.contains(expected), "{expected} missing from\n{text}");
        }
        // Families without a series yet are left out; the guard's only with
        // its stats.
        assert!(!text.contains("connections_closed"), "{text}");
        assert!(!text.contains("mcp_id_guard_passed"), "{text}");
        drop(open);
        let mut text = String::new();
        metrics.encode(Some(&crate::table::Stats::default()), &mut text);
        assert!(text.contains("mcp_id_guard_passed_total 0\n"), "{text}");
        assert!(text.contains("mcp_id_guard_table_bytes 0\n"), "{text}");
        assert!(
            text.contains("mcp_id_guard_client_connections 0\n"),
            "{text}"
        );
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
            "# TYPE mcp_id_guard_requests counter\n\
             mcp_id_guard_requests_total{mcp_method_name=\"ping\",decision=\"passed\"} 1\n\
             mcp_id_guard_requests_total{mcp_method_name=\"tools/call\",decision=\"remapped\"} 2\n",
            "# TYPE mcp_server_operation_duration_seconds histogram\n\
             mcp_server_operation_duration_seconds_sum{mcp_method_name=\"ping\",decision=\"passed\"} 0.003\n\
             mcp_server_operation_duration_seconds_count{mcp_method_name=\"ping\",decision=\"passed\"} 1\n\
             mcp_server_operation_duration_seconds_bucket{mcp_method_name=\"ping\",decision=\"passed\",le=\"0.0005\"} 0\n",
            "mcp_server_operation_duration_seconds_bucket{mcp_method_name=\"tools/call\",decision=\"remapped\",le=\"0.004\"} 2\n\
             mcp_server_operation_duration_seconds_bucket{mcp_method_name=\"tools/call\",decision=\"remapped\",le=\"0.008\"} 2\n",
            "mcp_server_operation_duration_seconds_bucket{mcp_method_name=\"tools/call\",decision=\"remapped\",le=\"+Inf\"} 2\n",
            // The unlabelled histogram counts both responses.
            "mcp_id_guard_request_duration_seconds_count 2\n",
        ] {
            assert!(text.contains(expected), "{expected} missing from\n{text}");
        }
        // Without the guard's account, neither family is written.
        let bare = Metrics::new();
        bare.answered(&http::Response::new(()), Duration::from_millis(1), 0);
        let mut text = String::new();
        bare.encode(None, &mut text);
        assert!(!text.contains("mcp_id_guard_requests"), "{text}");
        assert!(!text.contains("mcp_server_operation"), "{text}");
    }
}
