use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;
use tower_layer::Layer;

use crate::guard::service::IdGuard;
use crate::table::config::{Config, OnDuplicate};
use crate::table::Stats;
use crate::table::Table;
use crate::wire::id::IdMinter;

/// Applies [`IdGuard`] to a service.
///
/// Every service built from one layer, and every clone of it, shares one
/// session table, so [`stats`](Self::stats) sees all of them. The secret
/// that binds server-side ids to sessions is given when the layer is made
/// ([`with_secret`](Self::with_secret)); the builder methods set the other
/// settings, in any order, and cannot fail: each takes any value of its
/// type.
///
/// ```
/// use mcp_id_guard::{IdGuardLayer, OnDuplicate};
///
/// let layer = IdGuardLayer::new()
///     .on_duplicate(OnDuplicate::Reject)
///     .reject_status(http::StatusCode::CONFLICT)
///     .max_body_bytes(4 * 1024 * 1024)
///     .max_in_flight_per_session(1024)
///     .max_session_id_bytes(8 * 1024)
///     .max_table_bytes(64 * 1024 * 1024);
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
    /// wait, only duplicates rewritten, abandoned ids kept 5 minutes, session
    /// ids up to 8 KiB, a 64 MiB table, no restart window.
    pub fn new() -> Self {
        Self {
            config: Config::default(),
            table: Arc::new(Table::new().clocked(tokio_now)),
        }
    }

    /// A layer with the defaults and `secret` as the key that binds each
    /// server-side id to its session ([`new`](Self::new) draws a random one
    /// per layer).
    ///
    /// A response's server-side id is restored only if this secret issued
    /// it for the session the response belongs to: an upstream that answers
    /// with another session's id, or one nobody issued, has it passed on
    /// unrestored (counted in [`Stats::restore_refused_total`]) rather than
    /// dressed up as the client's own answer. Give replicas behind one load
    /// balancer the same secret, so that a stream resumed on another replica
    /// is restored too.
    ///
    /// The secret is set when the layer is made, so the builder methods
    /// after it may come in any order, and every clone (taken for
    /// [`stats`](Self::stats), say) shares the layer's one table.
    ///
    /// ```
    /// use std::convert::Infallible;
    /// use bytes::Bytes;
    /// use http_body_util::Full;
    /// use mcp_id_guard::inner::InnerRequest;
    /// use mcp_id_guard::{IdGuardLayer, OnDuplicate};
    /// use tower::{Layer as _, ServiceExt as _};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let secret = *b"shared by every "; // 16 bytes, from a file in practice
    /// let replica_a = IdGuardLayer::with_secret(secret).rewrite_all_ids(true);
    /// let replica_b = IdGuardLayer::with_secret(secret).rewrite_all_ids(true);
    ///
    /// // A clone taken before the other settings watches the same table.
    /// let watcher = replica_a.clone();
    /// let replica_a = replica_a.on_duplicate(OnDuplicate::Reject);
    /// let server = tower::service_fn(|_: InnerRequest<Full<Bytes>>| async {
    ///     Ok::<_, Infallible>(http::Response::new(Full::<Bytes>::default()))
    /// });
    /// let request = http::Request::post("/mcp")
    ///     .header("mcp-session-id", "session-1")
    ///     .body(Full::new(Bytes::from(r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#)))
    ///     .unwrap();
    /// replica_a.layer(server).oneshot(request).await.unwrap();
    /// assert_eq!(watcher.stats().remapped_total, 1);
    /// # let _ = replica_b;
    /// # }
    /// ```
    pub fn with_secret(secret: [u8; 16]) -> Self {
        Self {
            config: Config::default(),
            table: Arc::new(Table::with_minter(IdMinter::with_secret(secret)).clocked(tokio_now)),
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
    /// count from a random point of its own. Duplicates are still handled by
    /// the policy.
    pub fn rewrite_all_ids(mut self, enabled: bool) -> Self {
        self.config.rewrite_all_ids = enabled;
        self
    }

    /// Sets how long the id of an abandoned exchange is remembered (default
    /// 5 minutes; zero forgets it at once).
    ///
    /// For this long, a new request reusing an abandoned id goes to the
    /// server with a server-side id, so a late answer to the abandoned
    /// request cannot reach it (why: [abandoned ids](crate#abandoned-ids)).
    /// Pick a value above your longest tool call. Abandoned ids count against
    /// [`max_table_bytes`](Self::max_table_bytes), and at most 65 536 are kept
    /// per layer: past either bound the oldest are forgotten first (logged at
    /// most once every 10 s, counted in
    /// [`Stats::abandoned_evicted_total`]).
    pub fn abandoned_id_ttl(mut self, ttl: Duration) -> Self {
        self.config.abandoned_id_ttl = ttl;
        self
    }

    /// Sets the longest `Mcp-Session-Id` the guard accepts, in bytes (default
    /// 8 KiB: UUIDs, hex tokens and encrypted gateway session ids of a few
    /// hundred bytes fit many times over; it is also the longest header line
    /// common reverse proxies accept by default). Lower it to what your
    /// server issues: each tracked session, and each request an attacker
    /// abandons in a session of its own, holds up to this much.
    ///
    /// The guard keeps a tracked request's session id while the request is in
    /// flight and while its id is abandoned, so a client must not choose how
    /// large that copy is. A request in a session with a longer id never
    /// reaches the inner service: it gets `400 Bad Request` and a JSON-RPC
    /// `-32600` error carrying its id (an array for a batch; `null` when the
    /// guard does not read the body: `GET`, `DELETE`, other content types).
    pub fn max_session_id_bytes(mut self, limit: usize) -> Self {
        self.config.max_session_id_bytes = limit;
        self
    }

    /// Sets how many bytes the whole session table may hold (default 64 MiB),
    /// shared by every service built from this layer.
    ///
    /// It counts in-flight requests, queued requests, abandoned ids and the
    /// sessions seen starting during the [restart
    /// window](Self::restart_window), each with its collision key, session id
    /// and server-side id, as an estimate of their heap and inline size
    /// (within a small factor of what the allocator hands out; read it in
    /// [`Stats::table_bytes`]). The default holds about 250 000 requests in
    /// flight with UUID session ids.
    ///
    /// When a tracked request does not fit, the oldest abandoned ids are
    /// forgotten first (logged at most once every 10 s; a late answer to one of
    /// them could then reach a new request with its id, so size the budget for
    /// your traffic). If it still does not fit, it never reaches the inner
    /// service: it gets `503 Service Unavailable` and a JSON-RPC `-32000` error
    /// carrying its id (an array for a batch).
    pub fn max_table_bytes(mut self, limit: usize) -> Self {
        self.config.max_table_bytes = limit;
        self
    }

    /// Sets how long after the layer is created the guard distrusts sessions
    /// it did not see start (default: zero, off). Turn it on, for as long as
    /// [`abandoned_id_ttl`](Self::abandoned_id_ttl), wherever the guard can
    /// restart while the server keeps running: the reverse proxy, or a layer
    /// rebuilt in front of a long-lived service. (A guard in the server's own
    /// process restarts with it; the server's requests end too.)
    ///
    /// A guard (or proxy) that restarts has lost its table, while the server
    /// may still be running requests whose clients were cut off by the
    /// restart, under the clients' own ids: a new request reusing such an id
    /// could receive the old one's late answer. So for this long, every
    /// request of a session whose `initialize` answer this layer did not see
    /// goes with a server-side id, as if its id were abandoned (never refused
    /// or queued for it), counted in [`Stats::restart_remapped_total`]. The
    /// guard learns which sessions started from the `Mcp-Session-Id` of the
    /// successful answers to `initialize`: during the window it reads the
    /// body of each JSON `POST` without a session header (413 over
    /// [`max_body_bytes`](Self::max_body_bytes)) to tell whether it is one.
    /// It keeps only a hash of each session id, within
    /// [`max_table_bytes`](Self::max_table_bytes), and frees them when the
    /// window ends. Sessions started through another replica count as unseen.
    ///
    /// ```
    /// use std::time::Duration;
    /// use mcp_id_guard::IdGuardLayer;
    ///
    /// let ttl = Duration::from_secs(300);
    /// let layer = IdGuardLayer::new()
    ///     .abandoned_id_ttl(ttl)
    ///     .restart_window(ttl);
    /// assert_eq!(layer.stats().restart_remapped_total, 0);
    /// ```
    pub fn restart_window(mut self, window: Duration) -> Self {
        self.config.restart_window = window;
        self
    }

    /// A snapshot of the counters shared by every service built from this
    /// layer.
    pub fn stats(&self) -> Stats {
        self.table.stats()
    }

    /// Its settings and table: for [`crate::core`], and the crate's
    /// benchmarks.
    pub(crate) fn parts(&self) -> (Config, Arc<Table>) {
        (self.config, Arc::clone(&self.table))
    }
}

impl<S> Layer<S> for IdGuardLayer {
    type Service = IdGuard<S>;

    fn layer(&self, inner: S) -> Self::Service {
        IdGuard::from_parts(inner, self.config, Arc::clone(&self.table))
    }
}

/// The tower face's clock: tokio's, so that a paused test runtime governs
/// when abandoned ids expire. Outside a runtime it is the system's
/// monotonic clock.
fn tokio_now() -> std::time::Instant {
    tokio::time::Instant::now().into_std()
}
