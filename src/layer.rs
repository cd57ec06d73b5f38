use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;
use tower_layer::Layer;

use crate::config::{Config, OnDuplicate};
use crate::service::IdGuard;
use crate::stats::Stats;
use crate::table::Table;

/// Applies [`IdGuard`] to a service.
///
/// Every service built from one layer, and every clone of it, shares one
/// session table, so [`stats`](Self::stats) sees all of them.
///
/// ```
/// use mcp_id_guard::{IdGuardLayer, OnDuplicate};
///
/// let layer = IdGuardLayer::new()
///     .on_duplicate(OnDuplicate::Reject)
///     .reject_status(http::StatusCode::CONFLICT)
///     .max_body_bytes(4 * 1024 * 1024)
///     .max_in_flight_per_session(1024);
/// assert_eq!(layer.stats().in_flight_requests, 0);
/// ```
#[derive(Debug, Clone)]
pub struct IdGuardLayer {
    config: Config,
    table: Arc<Table>,
}

impl Default for IdGuardLayer {
    fn default() -> Self {
        Self::new()
    }
}

impl IdGuardLayer {
    /// A layer with the defaults: [`OnDuplicate::Remap`], reject status 400,
    /// 4 MiB body limit, 1024 requests in flight per session, 30 s queue
    /// wait, only duplicates rewritten.
    pub fn new() -> Self {
        Self {
            config: Config::default(),
            table: Arc::new(Table::new()),
        }
    }

    /// Sets what happens to a request whose id is already in flight.
    pub fn on_duplicate(mut self, policy: OnDuplicate) -> Self {
        self.config.on_duplicate = policy;
        self
    }

    /// Sets the HTTP status of rejections under [`OnDuplicate::Reject`]
    /// (default `400 Bad Request`, as the Go SDK answers; some servers prefer
    /// `409 Conflict`).
    pub fn reject_status(mut self, status: StatusCode) -> Self {
        self.config.reject_status = status;
        self
    }

    /// Sets the largest tracked POST body the guard reads (default 4 MiB).
    /// A larger one gets `413 Payload Too Large` and never reaches the inner
    /// service.
    pub fn max_body_bytes(mut self, limit: usize) -> Self {
        self.config.max_body_bytes = limit;
        self
    }

    /// Sets how many requests one session may have in flight (default 1024).
    /// Past it, requests get `429 Too Many Requests` and a JSON-RPC `-32000`
    /// error carrying their id.
    pub fn max_in_flight_per_session(mut self, limit: usize) -> Self {
        self.config.max_in_flight_per_session = limit;
        self
    }

    /// Sets how long a request may wait under [`OnDuplicate::Queue`] (default
    /// 30 s) before it gets `503 Service Unavailable`.
    pub fn max_queue_wait(mut self, limit: Duration) -> Self {
        self.config.max_queue_wait = limit;
        self
    }

    /// Gives every tracked request a server-side id, colliding or not
    /// (default `false`). The server then never sees an id twice in a session
    /// (the spec's strict rule), and several guard instances in front of one
    /// server cannot collide without sharing any state: each instance's ids
    /// carry its own random tag. Duplicates are still handled by the policy.
    pub fn rewrite_all_ids(mut self, enabled: bool) -> Self {
        self.config.rewrite_all_ids = enabled;
        self
    }

    /// Sets how long the id of an abandoned exchange is remembered (default
    /// 5 minutes; zero forgets it at once).
    ///
    /// When a client goes away before its exchange ends (it disconnects, or
    /// drops the request), the inner service fails, or the request is
    /// cancelled, the id is free for the client again at once, but the server
    /// may still be working on the request and answer it under that id (a
    /// disconnect is not a cancellation, and handlers may ignore one). For this
    /// long, a new request with that id in the session is therefore given a
    /// server-side id, whatever the policy — never rejected or queued, since the
    /// client did nothing wrong — so the late answer cannot reach it. Pick a
    /// value above your longest tool call. At most 65 536 abandoned ids are
    /// kept per layer; past that, they are released at once (and logged).
    pub fn abandoned_id_ttl(mut self, ttl: Duration) -> Self {
        self.config.abandoned_id_ttl = ttl;
        self
    }

    /// A snapshot of the counters shared by every service built from this
    /// layer.
    pub fn stats(&self) -> Stats {
        self.table.stats()
    }
}

impl<S> Layer<S> for IdGuardLayer {
    type Service = IdGuard<S>;

    fn layer(&self, inner: S) -> Self::Service {
        IdGuard::from_parts(inner, self.config, Arc::clone(&self.table))
    }
}
