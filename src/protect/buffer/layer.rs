use std::net::IpAddr;
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
    /// The share of the client address the layer is for, if any.
    client: Option<Arc<Counter>>,
    per_connection: usize,
    max_body_bytes: usize,
}

impl BodyBufferLayer {
    /// Bodies counted against `budget`; 4 MiB per connection, bodies of at
    /// most 4 MiB.
    pub fn new(budget: BodyBudget) -> Self {
        Self {
            budget,
            client: None,
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

    /// This layer for the connections of `client`: their bodies count
    /// together against the address's share too, if the budget has shares
    /// per address ([`BodyBudget::per_client`]); call it where the
    /// connection's service is made, as the `mcp-id-guard` binary does.
    ///
    /// ```
    /// use std::net::SocketAddr;
    ///
    /// use mcp_id_guard::protect::buffer::{BodyBudget, BodyBufferLayer};
    /// use tower_layer::Layer;
    ///
    /// let layer = BodyBufferLayer::new(BodyBudget::new(64 << 20).per_client(16 << 20));
    /// let inner = tower::service_fn(|_: http::Request<http_body_util::Full<bytes::Bytes>>| async {
    ///     Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
    /// });
    /// // Per connection, with the address it was accepted from:
    /// let make_service = |client: SocketAddr| layer.for_client(client.ip()).layer(inner.clone());
    /// let service = make_service("192.0.2.1:40000".parse().unwrap());
    /// # let _ = service;
    /// ```
    pub fn for_client(&self, client: IpAddr) -> Self {
        Self {
            client: self.budget.client_share(client),
            ..self.clone()
        }
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
            (
                self.client.clone(),
                Arc::new(Counter::new(self.per_connection)),
            ),
            self.max_body_bytes,
        )
    }
}
