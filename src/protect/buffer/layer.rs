use std::sync::Arc;

use tower_layer::Layer;

use super::budget::{BodyBudget, Counter};
use super::service::BodyBuffer;

/// The size cap and the share of one connection by default: the guard's
/// own body limit, so one body of the largest size fits.
const DEFAULT_MAX_BYTES: usize = 4 * 1024 * 1024;

/// Reads request bodies whole under a memory budget before the inner
/// service sees them: wraps a service in [`BodyBuffer`]. See the
/// [module docs](super).
///
/// Each service the layer makes has a share of its own
/// ([`per_connection`](Self::per_connection)): made once per connection (as
/// the `mcp-id-guard` binary does, calling `ServiceBuilder::service` in the
/// `make_service` it gives `mcp_id_guard::server::Server::serve`), that is a
/// share per connection; made once for all connections (an axum router), it
/// is one more bound on the total.
#[derive(Debug, Clone)]
pub struct BodyBufferLayer {
    budget: BodyBudget,
    per_connection: usize,
    max_body_bytes: usize,
}

impl BodyBufferLayer {
    /// Bodies counted against `budget`; 4 MiB per connection, bodies of at
    /// most 4 MiB.
    pub fn new(budget: BodyBudget) -> Self {
        Self {
            budget,
            per_connection: DEFAULT_MAX_BYTES,
            max_body_bytes: DEFAULT_MAX_BYTES,
        }
    }

    /// The bytes the bodies of one service (one connection) may hold at
    /// once (4 MiB).
    pub fn per_connection(mut self, max_bytes: usize) -> Self {
        self.per_connection = max_bytes;
        self
    }

    /// The budget the bodies count against (to read what it holds, as the
    /// binary's `/metrics` does).
    ///
    /// ```
    /// use mcp_id_guard::protect::buffer::{BodyBudget, BodyBufferLayer};
    ///
    /// let layer = BodyBufferLayer::new(BodyBudget::new(1 << 20));
    /// assert_eq!(layer.budget().used(), 0);
    /// ```
    pub fn budget(&self) -> &BodyBudget {
        &self.budget
    }

    /// The largest body (4 MiB); larger ones get `413`.
    pub fn max_body_bytes(mut self, max_bytes: usize) -> Self {
        self.max_body_bytes = max_bytes;
        self
    }
}

impl<S> Layer<S> for BodyBufferLayer {
    type Service = BodyBuffer<S>;

    fn layer(&self, inner: S) -> Self::Service {
        BodyBuffer::new(
            inner,
            Arc::clone(&self.budget.shared),
            Arc::new(Counter::new(self.per_connection)),
            self.max_body_bytes,
        )
    }
}
