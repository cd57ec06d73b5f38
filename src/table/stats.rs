//! A snapshot of the guard's counters.

use crate::metric_names::{self as names, MetricName};

/// Counters of one [`IdGuardLayer`](crate::IdGuardLayer) and every service built
/// from it (and their clones), read with [`IdGuardLayer::stats`](crate::IdGuardLayer::stats).
///
/// Counts are of JSON-RPC requests: a batch of three requests counts three.
/// Untracked traffic (no session header, notifications, GET, ...) is not counted.
/// Every tracked request is counted once, when it arrives, in exactly one of
/// `passed_total`, `remapped_total`, `rejected_total` and `queued_total`.
///
/// The gauges (`in_flight_requests`, `in_flight_sessions`, `abandoned_ids`,
/// `table_bytes`) are what the table holds now. Abandoned ids outlive the
/// requests and sessions they came from, so an idle guard can read
/// `in_flight_sessions: 0`, `abandoned_ids: 2`, `table_bytes: 1068`: two
/// ids kept for [`abandoned_id_ttl`](crate::IdGuardLayer::abandoned_id_ttl)
/// and the bytes they hold, freed when they expire (not a leak).
///
/// Each field is published under the metric of the same name with the
/// `mcp_id_guard_` prefix (counters with `_total`), by
/// [`Metrics::register_stats`](crate::protect::metrics::Metrics::register_stats),
/// the binary's `/metrics` and `Stats::record` (feature `metrics`), except
/// one: `in_flight_sessions` is the gauge `mcp_id_guard_tracked_sessions`.
/// Both names stay: the field says what it counts, beside
/// `in_flight_requests`, and the gauge's name is what dashboards and alerts
/// already query.
///
/// | field | metric |
/// |---|---|
/// | `passed_total` | `mcp_id_guard_passed_total` |
/// | `remapped_total` | `mcp_id_guard_remapped_total` |
/// | `rejected_total` | `mcp_id_guard_rejected_total` |
/// | `queued_total` | `mcp_id_guard_queued_total` |
/// | `cancelled_total` | `mcp_id_guard_cancelled_total` |
/// | `restored_total` | `mcp_id_guard_restored_total` |
/// | `restore_refused_total` | `mcp_id_guard_restore_refused_total` |
/// | `abandoned_evicted_total` | `mcp_id_guard_abandoned_evicted_total` |
/// | `restart_remapped_total` | `mcp_id_guard_restart_remapped_total` |
/// | `in_flight_requests` | `mcp_id_guard_in_flight_requests` |
/// | `in_flight_sessions` | `mcp_id_guard_tracked_sessions` |
/// | `abandoned_ids` | `mcp_id_guard_abandoned_ids` |
/// | `table_bytes` | `mcp_id_guard_table_bytes` |
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Requests registered and not yet released (their exchange has not ended).
    pub in_flight_requests: usize,
    /// Sessions with at least one request in flight. A session
    /// leaves this count with its last request; the ids it abandoned stay in
    /// `abandoned_ids` (and `table_bytes`) until they expire. Published as
    /// the gauge `mcp_id_guard_tracked_sessions` (the only field whose
    /// metric has another name; see the table above).
    pub in_flight_sessions: usize,
    /// Ids the server may still answer although their exchange has ended (the
    /// client went away before the response, the inner service failed, or the
    /// request was cancelled), in sessions idle or not: a new request with
    /// such an id goes with a server-side id until it expires; see
    /// [`IdGuardLayer::abandoned_id_ttl`](crate::IdGuardLayer::abandoned_id_ttl).
    pub abandoned_ids: usize,
    /// Requests forwarded at once with the client's own id.
    pub passed_total: u64,
    /// Requests forwarded at once with a server-side id: duplicates under
    /// [`OnDuplicate::Remap`](crate::OnDuplicate::Remap), abandoned ids, client
    /// ids in the reserved namespace, and every request with
    /// [`rewrite_all_ids`](crate::IdGuardLayer::rewrite_all_ids).
    pub remapped_total: u64,
    /// Requests answered by the guard itself without reaching the inner service:
    /// duplicates under [`OnDuplicate::Reject`](crate::OnDuplicate::Reject),
    /// requests over the per-session in-flight cap, requests that do not fit
    /// in [`max_table_bytes`](crate::IdGuardLayer::max_table_bytes), requests
    /// in a session whose id is over
    /// [`max_session_id_bytes`](crate::IdGuardLayer::max_session_id_bytes),
    /// and batches refused under
    /// [`OnDuplicate::Queue`](crate::OnDuplicate::Queue).
    pub rejected_total: u64,
    /// Requests that had to wait for their id under
    /// [`OnDuplicate::Queue`](crate::OnDuplicate::Queue), whatever came of the
    /// wait (forwarded, timed out with `503`, or left by their client).
    pub queued_total: u64,
    /// `notifications/cancelled` that named a request of the session (which
    /// frees the id for the client and leaves it abandoned).
    pub cancelled_total: u64,
    /// Client ids put back into responses (JSON or SSE, POST or GET streams).
    pub restored_total: u64,
    /// Ids in responses written like server-side ids that this guard did not
    /// issue for the response's session (another session's, or forged): passed
    /// on as the server wrote them, never restored.
    pub restore_refused_total: u64,
    /// Bytes the session table holds now (an estimate of heap and inline
    /// size): in-flight and queued requests, abandoned ids, and sessions seen
    /// starting during the restart window, with their keys and session ids.
    /// Bounded by [`IdGuardLayer::max_table_bytes`](crate::IdGuardLayer::max_table_bytes).
    pub table_bytes: usize,
    /// Abandoned ids forgotten before their time to keep the table within
    /// [`IdGuardLayer::max_table_bytes`](crate::IdGuardLayer::max_table_bytes)
    /// or the cap of 65 536 abandoned ids, oldest first.
    pub abandoned_evicted_total: u64,
    /// Requests given a server-side id only because their session started
    /// before this layer existed (or without it seeing the start) and the
    /// [restart window](crate::IdGuardLayer::restart_window) is open. Also
    /// counted in `remapped_total`.
    pub restart_remapped_total: u64,
}

impl Stats {
    /// Every field with the metric it is published as, in the order the
    /// exposition lists them: counters, then gauges.
    pub(crate) fn series(&self) -> [(MetricName, u64); 13] {
        [
            (names::PASSED, self.passed_total),
            (names::REMAPPED, self.remapped_total),
            (names::REJECTED, self.rejected_total),
            (names::QUEUED, self.queued_total),
            (names::CANCELLED, self.cancelled_total),
            (names::RESTORED, self.restored_total),
            (names::RESTORE_REFUSED, self.restore_refused_total),
            (names::ABANDONED_EVICTED, self.abandoned_evicted_total),
            (names::RESTART_REMAPPED, self.restart_remapped_total),
            (names::IN_FLIGHT_REQUESTS, wide(self.in_flight_requests)),
            (names::TRACKED_SESSIONS, wide(self.in_flight_sessions)),
            (names::ABANDONED_IDS, wide(self.abandoned_ids)),
            (names::TABLE_BYTES, wide(self.table_bytes)),
        ]
    }
}

fn wide(value: usize) -> u64 {
    u64::try_from(value).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod table_tests {
    use super::Stats;

    /// The field-to-metric table of `Stats`' docs names every published
    /// series, in the exposition's order, and each field's value goes to the
    /// metric the table names: a field set to its row number reads back
    /// from that metric.
    #[test]
    fn the_docs_table_is_the_published_series() {
        let docs = include_str!("stats.rs");
        let rows: Vec<(&str, &str)> = docs
            .lines()
            .filter_map(|line| line.strip_prefix("/// | `"))
            .filter_map(|row| {
                let (field, rest) = row.split_once("` | `")?;
                Some((field, rest.strip_suffix("` |")?))
            })
            .collect();
        let stats = Stats {
            passed_total: 1,
            remapped_total: 2,
            rejected_total: 3,
            queued_total: 4,
            cancelled_total: 5,
            restored_total: 6,
            restore_refused_total: 7,
            abandoned_evicted_total: 8,
            restart_remapped_total: 9,
            in_flight_requests: 10,
            in_flight_sessions: 11,
            abandoned_ids: 12,
            table_bytes: 13,
        };
        let published: Vec<(&str, u64)> = stats
            .series()
            .iter()
            .map(|(name, value)| (name.sample, *value))
            .collect();
        let documented: Vec<(&str, u64)> = rows
            .iter()
            .zip(1..)
            .map(|((_, metric), row)| (*metric, row))
            .collect();
        assert_eq!(published, documented);
        // And the field of each row is the one set to that row's number.
        let debug = format!("{stats:?}");
        for ((field, _), row) in rows.iter().zip(1..) {
            assert!(
                debug.contains(&format!("{field}: {row},"))
                    || debug.contains(&format!("{field}: {row} }}")),
                "{field} in {debug}"
            );
        }
    }
}

#[cfg(feature = "metrics")]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
impl Stats {
    /// Publishes this snapshot through the [`metrics`] facade, to whatever
    /// recorder the application installed (a Prometheus exporter, say):
    /// counters `mcp_id_guard_<name>_total` (set to their absolute value) and
    /// gauges `mcp_id_guard_in_flight_requests`, `_tracked_sessions`,
    /// `_abandoned_ids` and `_table_bytes`. The guard keeps its own counts,
    /// so nothing is recorded on the request path: call this when metrics are
    /// collected (before a scrape, or on a timer).
    ///
    /// ```
    /// let layer = mcp_id_guard::IdGuardLayer::new();
    /// // With no recorder installed this does nothing.
    /// layer.stats().record();
    /// ```
    pub fn record(&self) {
        use crate::metric_names::MetricType;
        for (name, value) in self.series() {
            match name.kind {
                MetricType::Counter => metrics::counter!(name.sample).absolute(value),
                // Gauges and histograms alike: the facade has no other kind
                // for a value read at once (and Stats holds no histogram).
                _ => metrics::gauge!(name.sample).set(value as f64),
            }
        }
    }
}

#[cfg(all(test, feature = "metrics"))]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::{Arc, Mutex};

    use metrics::{
        Counter, CounterFn, Gauge, GaugeFn, Histogram, Key, KeyName, Metadata, Recorder,
        SharedString, Unit,
    };

    use super::Stats;

    /// Keeps the last value of every counter and gauge by name.
    #[derive(Default, Clone)]
    struct Values(Arc<Mutex<BTreeMap<String, f64>>>);

    struct Handle(String, Values);

    impl CounterFn for Handle {
        fn increment(&self, _value: u64) {}
        fn absolute(&self, value: u64) {
            let mut values = self.1 .0.lock().unwrap();
            values.insert(self.0.clone(), value as f64);
        }
    }

    impl GaugeFn for Handle {
        fn increment(&self, _value: f64) {}
        fn decrement(&self, _value: f64) {}
        fn set(&self, value: f64) {
            let mut values = self.1 .0.lock().unwrap();
            values.insert(self.0.clone(), value);
        }
    }

    impl Recorder for Values {
        fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
            Counter::from_arc(Arc::new(Handle(key.name().to_owned(), self.clone())))
        }
        fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
            Gauge::from_arc(Arc::new(Handle(key.name().to_owned(), self.clone())))
        }
        fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
            Histogram::noop()
        }
    }

    #[test]
    fn every_field_is_recorded_under_its_name() {
        let stats = Stats {
            in_flight_requests: 3,
            table_bytes: 4096,
            remapped_total: 7,
            restart_remapped_total: 2,
            ..Stats::default()
        };
        let values = Values::default();
        metrics::with_local_recorder(&values, || stats.record());
        let values = values.0.lock().unwrap();
        assert_eq!(values.len(), 13, "{values:?}");
        assert_eq!(values["mcp_id_guard_in_flight_requests"], 3.0);
        assert_eq!(values["mcp_id_guard_table_bytes"], 4096.0);
        assert_eq!(values["mcp_id_guard_remapped_total"], 7.0);
        assert_eq!(values["mcp_id_guard_restart_remapped_total"], 2.0);
        assert_eq!(values["mcp_id_guard_passed_total"], 0.0);
    }
}
