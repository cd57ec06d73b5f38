//! A snapshot of the guard's counters.

/// Counters of one [`IdGuardLayer`](crate::IdGuardLayer) and every service built
/// from it (and their clones), read with [`IdGuardLayer::stats`](crate::IdGuardLayer::stats).
///
/// Counts are of JSON-RPC requests: a batch of three requests counts three.
/// Untracked traffic (no session header, notifications, GET, ...) is not counted.
/// Every tracked request is counted once, when it arrives, in exactly one of
/// `passed_total`, `remapped_total`, `rejected_total` and `queued_total`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Requests registered and not yet released (their exchange has not ended).
    pub in_flight_requests: usize,
    /// Sessions with at least one request in flight. Idle sessions cost nothing
    /// (beyond the ids they abandoned, until those expire).
    pub tracked_sessions: usize,
    /// Ids the server may still answer although their exchange has ended (the
    /// client went away before the response, the inner service failed, or the
    /// request was cancelled): a new request with such an id goes with a
    /// server-side id until it expires; see
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
