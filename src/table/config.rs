//! The guard's settings: what [`IdGuardLayer`](crate::IdGuardLayer)'s
//! builder methods set, copied into every service built from it.

use std::time::Duration;

use http::StatusCode;

/// What the guard does with a request whose id is already in flight in its
/// session.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum OnDuplicate {
    /// Forward it with a fresh server-side id and restore the client's id in
    /// the response. Every caller gets its own result. The default.
    #[default]
    Remap,
    /// Answer it at once with [`IdGuardLayer::reject_status`](crate::IdGuardLayer::reject_status) (400 by default)
    /// and a JSON-RPC `-32600` error carrying the offending id; it never
    /// reaches the inner service.
    Reject,
    /// Hold it until the earlier request with that id ends, then forward it
    /// with its own id: first come, first served per session and id. Costs
    /// latency (same-id requests of a session run one after another); a request
    /// that waits longer than [`IdGuardLayer::max_queue_wait`](crate::IdGuardLayer::max_queue_wait) gets `503` and a
    /// JSON-RPC `-32000` error carrying its id. A batch containing a duplicate
    /// is refused as under `Reject`. Waiting uses tokio's timer.
    Queue,
}

/// The guard's settings, copied into every service.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Config {
    pub(crate) on_duplicate: OnDuplicate,
    pub(crate) reject_status: StatusCode,
    pub(crate) max_body_bytes: usize,
    pub(crate) max_in_flight_per_session: usize,
    pub(crate) max_queue_wait: Duration,
    pub(crate) rewrite_all_ids: bool,
    pub(crate) abandoned_id_ttl: Duration,
    pub(crate) max_session_id_bytes: usize,
    pub(crate) max_table_bytes: usize,
    /// How long after the table was created sessions the guard did not see
    /// start have all their requests remapped.
    pub(crate) restart_window: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            on_duplicate: OnDuplicate::Remap,
            reject_status: StatusCode::BAD_REQUEST,
            max_body_bytes: 4 * 1024 * 1024,
            max_in_flight_per_session: 1024,
            max_queue_wait: Duration::from_secs(30),
            rewrite_all_ids: false,
            abandoned_id_ttl: Duration::from_secs(300),
            max_session_id_bytes: 8 * 1024,
            max_table_bytes: 64 * 1024 * 1024,
            // Off by default for now: see `IdGuardLayer::restart_window`.
            restart_window: Duration::ZERO,
        }
    }
}
